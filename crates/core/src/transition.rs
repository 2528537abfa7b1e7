//! The one path that writes a transition: let [`protocol::apply`] decide, then commit the new
//! task with a conditional write. A lost write re-decides on the current item the store returned
//! with the conflict (no extra read). Effects are not performed here: see [`crate::effects`].

use tracing::{debug, info};

use crate::deps::{Deps, HandlerError};
use crate::ids::Millis;
use crate::protocol::{self, Effect, Event, ProcessState, Stale, Task};
use crate::store::{is_own_write, StoreError};

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
    mut task: Task,
    events: &[(&Event, Option<&str>)],
) -> Result<(Vec<Applied>, Commit), HandlerError> {
    let ends = events.iter().any(|(e, _)| matches!(e, Event::ElementEnded { .. }));
    let max = if ends { MAX_ELEMENT_CONFLICTS } else { MAX_CONFLICTS };
    for _ in 0..max {
        let ctx = deps.ctx();
        let mut next = task.clone();
        let mut effects = Vec::new();
        let mut applied = Vec::with_capacity(events.len());
        // (before, after, event) of each change, logged and counted once the write stands
        let mut changes = Vec::new();
        for (event, mark) in events {
            match protocol::apply(&next, event, &ctx, &deps.settings.policy) {
                Ok(mut tr) => {
                    if !tr.keeps_mark {
                        tr.task.last_message = mark.map(str::to_owned);
                    }
                    applied.push(Applied::Changed { state: tr.task.process_state, rev: tr.task.rev });
                    effects.extend(tr.effects);
                    changes.push((std::mem::replace(&mut next, tr.task), *event));
                }
                Err(stale) => {
                    // Expected (a timer after the end, a duplicate): counted by StaleEvents, logged at debug.
                    debug!(task_id = %task.task_id, event = event.name(), state = %next.process_state, reason = %stale, "stale event dropped");
                    crate::metrics::count(&crate::metrics::STALE_EVENTS, &[], 1);
                    applied.push(Applied::Stale(stale));
                }
            }
        }
        if changes.is_empty() {
            return Ok((applied, Commit::Unchanged(Box::new(task))));
        }
        let landed = match deps.store.save(&next, &task).await {
            Ok(()) => false,
            // A write that landed but whose answer was lost (the SDK sent it again) comes back as
            // a lost condition whose current item is the very task written: the transition is
            // ours, and its effects are still to be performed.
            Err(StoreError::Conflict { current: Some(current) }) if is_own_write(&current, &next) => true,
            Err(StoreError::Conflict { current: Some(current) }) => {
                debug!(task_id = %task.task_id, events = events.len(), "conditional write lost; re-deciding on the current item");
                crate::metrics::count(&crate::metrics::WRITE_CONFLICTS, &[task.workflow.name.as_str()], 1);
                task = *current;
                continue;
            }
            Err(StoreError::Conflict { current: None }) => {
                return Ok((vec![Applied::Missing; events.len()], Commit::Missing));
            }
            Err(e) => return Err(e.into()),
        };
        let afters = changes.iter().skip(1).map(|(before, _)| before).chain(std::iter::once(&next));
        for ((before, event), after) in changes.iter().zip(afters) {
            info!(
                task_id = %before.task_id, event = event.name(), from = %before.process_state, to = %after.process_state,
                step = after.current_step_name().unwrap_or("-"), failure_count = after.failure_count, rev = after.rev, landed,
                "transition"
            );
            crate::metrics::record_transition(before, after, event);
        }
        let committed = Committed { task: next, effects, now: ctx.now };
        return Ok((applied, Commit::Written(Box::new(committed))));
    }
    Err(HandlerError::Contended(max))
}
