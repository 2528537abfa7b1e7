//! The one module that writes tasks. A transition: let [`protocol::apply`] decide, then commit
//! the new task with a conditional write ([`commit`], [`commit_many`]); a new task ([`create`]);
//! what a task's last write owes written first (a resend) and the statuses that can never reach
//! `reply_to` (both in [`crate::effects`], through the same loop). Every conditional write goes
//! through one loop
//! ([`write_loop`]): a lost write re-decides on the current item the store returned with the
//! conflict (no extra read), and a write that landed but whose answer was lost (the SDK sent it
//! again) is recognised as ours. Effects are not performed here: see [`crate::effects`].

use std::sync::Arc;

use tracing::{debug, info};

use super::{Deps, HandlerError};
use crate::ids::Millis;
use crate::protocol::{self, Ctx, Effect, Event, ProcessState, Stale, Task};
use crate::store::{is_own_write, StoreError, TaskWriter};

/// The task store's writes as a role holds them ([`Deps::writer`]): only this module opens it,
/// so every write of a task in the roles goes through [`write_loop`] or [`create`].
#[derive(Debug, Clone)]
pub struct Writer(Arc<dyn TaskWriter>);

impl Writer {
    /// The writes of `store`, for the composition root ([`Deps`]'s constructors).
    pub fn new(store: Arc<dyn TaskWriter>) -> Writer {
        Writer(store)
    }
}

/// What a decision over the item as last read says to do.
pub enum Decision<T> {
    /// Write this task (its `rev` one past the item read) and keep `T` for the caller.
    Write(Box<Task>, T),
    /// Nothing to write: the loop ends with `T`.
    Nothing(T),
}

/// How [`write_loop`] ended.
pub enum Written<T> {
    /// The decided task was written (`echo`: by a write whose answer was lost, found on the retry).
    Landed { task: Box<Task>, value: T, echo: bool },
    /// The decision wrote nothing; the item it was made on.
    Nothing { read: Box<Task>, value: T },
    /// A lost write found an item that `follow` would not decide on again.
    Superseded(Box<Task>),
    /// The task is gone.
    Missing,
}

/// The one conditional-write loop: decide over `read`, write the decision conditioned on `read`,
/// and on a lost condition decide again over the current item the store returned, while
/// `follow(current)` says the decision still applies to it; at most `max` writes.
pub async fn write_loop<T>(
    deps: &Deps,
    mut read: Task,
    max: u32,
    mut decide: impl FnMut(&Task) -> Decision<T>,
    follow: impl Fn(&Task) -> bool,
) -> Result<Written<T>, HandlerError> {
    for _ in 0..max {
        let (next, value) = match decide(&read) {
            Decision::Write(next, value) => (next, value),
            Decision::Nothing(value) => return Ok(Written::Nothing { read: Box::new(read), value }),
        };
        match deps.writer.0.save(&next, &read).await {
            Ok(()) => return Ok(Written::Landed { task: next, value, echo: false }),
            Err(StoreError::Conflict { current: Some(current) }) if is_own_write(&current, &next) => {
                return Ok(Written::Landed { task: next, value, echo: true });
            }
            Err(StoreError::Conflict { current: Some(current) }) if follow(&current) => {
                debug!(task_id = %read.task_id, "conditional write lost; deciding again on the current item");
                crate::metrics::count(&crate::metrics::WRITE_CONFLICTS, &[read.workflow.name.as_str()], 1);
                read = *current;
            }
            Err(StoreError::Conflict { current: Some(current) }) => return Ok(Written::Superseded(current)),
            Err(StoreError::Conflict { current: None }) => return Ok(Written::Missing),
            Err(e) => return Err(e.into()),
        }
    }
    Err(HandlerError::Contended(max))
}

/// What [`create`] found.
pub enum Created {
    /// The task was written (or a write of it whose answer was lost had landed).
    New,
    /// A task of that id exists and is not this one.
    Exists(Box<Task>),
}

/// Create a new task with a conditional write (it must not exist). A create whose answer was
/// lost (the SDK sent it again) finds its own item: that is [`Created::New`]. `TooLarge` and
/// `Refused` come back as they are (the caller decides what an unstorable task means).
pub async fn create(deps: &Deps, task: &Task) -> Result<Created, StoreError> {
    match deps.writer.0.create(task).await {
        Ok(()) => Ok(Created::New),
        Err(StoreError::AlreadyExists) => match deps.store.get(&task.task_id).await? {
            Some(t) if is_own_write(&t, task) => Ok(Created::New),
            Some(t) => Ok(Created::Exists(Box::new(t))),
            // deleted in between (it expired): as good as existing; nothing to create over it
            None => Err(StoreError::AlreadyExists),
        },
        Err(e) => Err(e),
    }
}

/// What happened to one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    Changed {
        state: ProcessState,
        rev: u64,
    },
    Stale(Stale),
    /// The task does not exist (deleted, or never created).
    Missing,
}

/// What [`commit`] did with one event.
#[derive(Debug)]
pub enum Commit {
    /// The transition was written; its effects are still to be performed.
    Written(Box<Committed>),
    /// The event changes nothing for the task as it now is (the item last read or returned by a
    /// lost conditional write).
    Unchanged(Box<Task>),
    /// The task is gone.
    Missing,
}

/// A written transition whose effects are still to be performed.
#[derive(Debug)]
pub struct Committed {
    pub task: Task,
    pub effects: Vec<Effect>,
    pub now: Millis,
}

/// How many lost conditional writes in a row one event may meet before giving up (the message is
/// then delivered again).
pub const MAX_CONFLICTS: u32 = 5;

/// The same for a map element's end: up to `max_concurrency` of them race for the parent's item
/// (each lost write re-decides on the item the store returned, without a read).
pub const MAX_ELEMENT_CONFLICTS: u32 = 64;

/// Decide and write. `mark`: the [`crate::ids::message_mark`] of the queue message that carries
/// the event, recorded on the written task (see `Task::last_message`). On
/// [`Commit::Written`] the caller performs the effects.
pub async fn commit(
    deps: &Deps,
    task: Task,
    event: &Event,
    mark: Option<&str>,
) -> Result<(Applied, Commit), HandlerError> {
    let (mut applied, commit) = commit_many(deps, task, &[(event, mark)]).await?;
    Ok((applied.pop().unwrap_or(Applied::Missing), commit))
}

/// [`commit`] for several events of one task, applied in order and written once: the ends of a
/// map's elements that one batch brings to their parent cost one conditional write, not one each
/// (each a race with the other invocations' writers). The written task keeps the mark of the last
/// event that changed it; a delivery of that message again finds it and resends what the write
/// owes (for a running map: every running element, which covers the earlier events' starts).
/// One [`Applied`] per event; all are re-decided on the current item when the write is lost.
pub async fn commit_many(
    deps: &Deps,
    task: Task,
    events: &[(&Event, Option<&str>)],
) -> Result<(Vec<Applied>, Commit), HandlerError> {
    let ends = events.iter().any(|(e, _)| matches!(e, Event::ElementEnded { .. }));
    let max = if ends { MAX_ELEMENT_CONFLICTS } else { MAX_CONFLICTS };
    // an operator's pause of its workflow parks the task's next forward unit
    let paused = deps.paused(&task.workflow.name, task.slot.as_ref().map(|s| s.key.as_str())).await?;
    let decide = |read: &Task| {
        // each decision (again after a lost write) is made now, with a fresh token
        let ctx = Ctx { paused, ..deps.ctx() };
        let mut next = read.clone();
        let mut d = Decided {
            applied: Vec::with_capacity(events.len()),
            effects: Vec::new(),
            changes: Vec::new(),
            now: ctx.now,
        };
        for (event, mark) in events {
            match protocol::apply(&next, event, &ctx, &deps.settings.policy) {
                Ok(mut tr) => {
                    if !tr.keeps_mark {
                        tr.task.last_message = mark.map(str::to_owned);
                    }
                    d.applied.push(Applied::Changed { state: tr.task.process_state, rev: tr.task.rev });
                    d.effects.extend(tr.effects);
                    d.changes.push((std::mem::replace(&mut next, tr.task), *event));
                }
                Err(stale) => {
                    // Expected (a timer after the end, a duplicate): counted by StaleEvents, logged at debug.
                    debug!(task_id = %read.task_id, event = event.name(), state = %next.process_state, reason = %stale, "stale event dropped");
                    crate::metrics::count(&crate::metrics::STALE_EVENTS, &[], 1);
                    d.applied.push(Applied::Stale(stale));
                }
            }
        }
        if d.changes.is_empty() {
            Decision::Nothing(d)
        } else {
            Decision::Write(Box::new(next), d)
        }
    };
    match write_loop(deps, task, max, decide, |_| true).await? {
        Written::Landed { task: next, value: d, echo } => {
            let afters = d.changes.iter().skip(1).map(|(before, _)| before).chain(std::iter::once(&*next));
            for ((before, event), after) in d.changes.iter().zip(afters) {
                info!(
                    task_id = %before.task_id, event = event.name(), from = %before.process_state, to = %after.process_state,
                    step = after.current_step_name().unwrap_or("-"), failure_count = after.failure_count, rev = after.rev,
                    landed = echo, "transition"
                );
                crate::metrics::record_transition(before, after, event);
            }
            Ok((d.applied, Commit::Written(Box::new(Committed { task: *next, effects: d.effects, now: d.now }))))
        }
        Written::Nothing { read, value: d } => Ok((d.applied, Commit::Unchanged(read))),
        Written::Missing => Ok((vec![Applied::Missing; events.len()], Commit::Missing)),
        Written::Superseded(_) => unreachable!("a commit follows every conflict"),
    }
}

/// One decision of [`commit_many`] over the item as read.
struct Decided<'e> {
    applied: Vec<Applied>,
    effects: Vec<Effect>,
    /// (before, event) of each change, logged and counted once the write stands
    changes: Vec<(Task, &'e Event)>,
    now: Millis,
}
