//! The one path that performs a committed transition's effects, in the order the protocol
//! requires: notifications first (`Reply`, `Alert`), then work (`Run`, `Dispatch`, `ArmTimer`).
//! A failed send of work or of an essential notice fails the message (the SDK has already retried
//! it): the message comes back, finds the task as its own write left it (`LastMessage`), and
//! sends what that write owes again ([`protocol::resend`]). The Supervisor stays the backstop.
//! A status the caller's `reply_to` refuses for good (denied, a KMS key, a parameter, a queue that
//! is gone) is never essential: it is logged (`reply_undelivered = true`) and counted on the task.

use futures::future::join_all;
use tracing::{info, warn};

use crate::bus::{delay_seconds, BusError};
use crate::deps::{Deps, HandlerError};
use crate::ids::{message_mark, Millis, TaskId};
use crate::messages::{RunMessage, RunReason, SchedulerMessage, SQS_MAX_MESSAGE_BYTES, VERSION};
use crate::metrics;
use crate::protocol::{self, Effect, Event, Task};
use crate::reply;
use crate::store::StoreError;
use crate::transition::{
    self, commit, write_loop, Applied, Commit, Committed, Created, Decision, Written, MAX_CONFLICTS,
};

/// Commit a transition, then perform its effects. `message`: the id of the queue message that
/// carries the event (`None` for a direct call). When the event changes nothing but the task's
/// last write was this very message's (it is delivered again after its handler died or failed
/// its sends, or an SQS duplicate is handled beside it), what that write owes is sent again:
/// the current unit's work, or the terminal notices. Any other message re-sends nothing, so late
/// timers and stale results cost no duplicate notices.
pub async fn drive(deps: &Deps, task: Task, event: &Event, message: Option<&str>) -> Result<Applied, HandlerError> {
    Ok(drive_task(deps, task, event, message).await?.0)
}

/// [`drive`], which also returns the task as the event left it (the written task, or the one
/// the event found unchanged; `None` when the task is gone).
pub async fn drive_task(
    deps: &Deps,
    task: Task,
    event: &Event,
    message: Option<&str>,
) -> Result<(Applied, Option<Task>), HandlerError> {
    let mark = message.map(message_mark);
    let (applied, commit) = commit(deps, task, event, mark.as_deref()).await?;
    let after = finish(deps, commit, mark.as_slice()).await?;
    Ok((applied, after))
}

/// Perform what a commit wrote, or, when it changed nothing but the task's last write was one of
/// `marks`' messages (delivered again), send again what that write owes. The task as the events
/// left it (`None` when it is gone); a failed send of work or of an essential notice fails.
pub async fn finish(deps: &Deps, commit: Commit, marks: &[String]) -> Result<Option<Task>, HandlerError> {
    let (sent, after) = match commit {
        Commit::Written(c) => {
            let after = c.task.clone();
            (perform(deps, *c).await, Some(after))
        }
        Commit::Unchanged(current) if current.last_message.as_ref().is_some_and(|m| marks.contains(m)) => {
            let after = (*current).clone();
            (resend(deps, *current).await?, Some(after))
        }
        Commit::Unchanged(current) => (Sent::default(), Some(*current)),
        Commit::Missing => (Sent::default(), None),
    };
    match sent.essential.or(sent.work) {
        Some(e) => Err(e.into()),
        None => Ok(after),
    }
}

/// Send again what the task's last write owes (see [`protocol::resend`]), after writing the task
/// first when the resend needs it. A lost conditional write re-decides on the item it found: still
/// this message's write, the resend goes on from there; our own write landed (its answer lost),
/// it stands; another message's write, the task moved on and nothing is owed any more.
pub async fn resend(deps: &Deps, current: Task) -> Result<Sent, HandlerError> {
    let mark = current.last_message.clone();
    let decide = |read: &Task| {
        let now = deps.now();
        let tr = protocol::resend(read, now, &deps.settings.policy);
        match (tr.effects.is_empty(), tr.task.rev != read.rev) {
            (true, _) => Decision::Nothing(None),
            (false, true) => Decision::Write(Box::new(tr.task), Some((tr.effects, now))),
            (false, false) => Decision::Nothing(Some((tr.effects, now))),
        }
    };
    // A lost write decides again while the task is still this message's write; our own write
    // landed (its answer lost), it stands; another message's write: the task moved on, and
    // nothing is owed any more.
    let (task, effects, now) =
        match write_loop(deps, current, MAX_CONFLICTS, decide, |found| found.last_message == mark).await? {
            Written::Landed { task, value: Some((effects, now)), .. } => (*task, effects, now),
            Written::Nothing { read, value: Some((effects, now)) } => (*read, effects, now),
            Written::Landed { value: None, .. }
            | Written::Nothing { value: None, .. }
            | Written::Superseded(_)
            | Written::Missing => return Ok(Sent::default()),
        };
    info!(task_id = %task.task_id, state = %task.process_state, sends = effects.len(), "message handled again: what its write owes is sent again");
    Ok(perform(deps, Committed { task, effects, now }).await)
}

/// Why an effect was not performed: a send refused or failed, or a map's element that could not
/// be created or made to send what it owes (a store error is a store error, not a bus error).
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("map element {element}: {source}")]
    Element {
        element: String,
        #[source]
        source: Box<HandlerError>,
    },
    /// The slot of a concurrency key could not be given back (see [`crate::keys::release`]).
    #[error("concurrency key {key}: {source}")]
    Key {
        key: String,
        #[source]
        source: Box<HandlerError>,
    },
}

impl EffectError {
    /// A send the destination refuses for good (see [`BusError::is_permanent`]).
    pub fn is_permanent(&self) -> bool {
        match self {
            EffectError::Bus(e) => e.is_permanent(),
            EffectError::Element { .. } | EffectError::Key { .. } => false,
        }
    }
}

/// What the handler does about it: a send as a bus error; an element as what its store (or its
/// resend) said, so a store error is retried or dead-lettered by what it is.
impl From<EffectError> for HandlerError {
    fn from(e: EffectError) -> Self {
        match e {
            EffectError::Bus(e) => HandlerError::Bus(e),
            EffectError::Element { source, .. } | EffectError::Key { source, .. } => *source,
        }
    }
}

/// What performing a transition's effects achieved.
#[derive(Debug, Default)]
pub struct Sent {
    /// Sends that failed (logged; a failed send of work or of an essential notice fails the message).
    pub failed: usize,
    /// The first failed essential notice (an alert or a terminal status), if any.
    pub essential: Option<EffectError>,
    /// The first failed effect of work (a dispatch, a timer, a run message, a map's elements), if any.
    pub work: Option<EffectError>,
    /// Statuses `reply_to` refused for good (never essential, never retried).
    pub undelivered: u32,
    /// Why the last of them failed.
    pub undelivered_error: Option<String>,
}

/// The Scheduler's run message for a task at `rev`.
pub fn run_message(task_id: &TaskId, rev: u64, reason: RunReason) -> SchedulerMessage {
    SchedulerMessage::Run(RunMessage { v: VERSION, task_id: task_id.clone(), rev, reason })
}

/// Perform one transition's effects, and record on the task any status that can never reach
/// its `reply_to`.
pub async fn perform(deps: &Deps, c: Committed) -> Sent {
    let sent = send(deps, &c).await;
    record_undelivered(deps, &c.task, &sent).await;
    sent
}

/// Send one transition's effects (nothing is recorded on the task).
pub async fn send(deps: &Deps, c: &Committed) -> Sent {
    let (notes, work): (Vec<_>, Vec<_>) = c.effects.iter().partition(|e| e.is_notification());
    let mut sent = Sent::default();
    // Within a group the sends go to different queues and need no order: send them together.
    for group in [notes, work] {
        let results = join_all(group.iter().map(|e| perform_one(deps, &c.task, e, c.now))).await;
        for (e, r) in group.iter().zip(results) {
            match r {
                Ok(()) => {
                    if let Effect::Alert(a) = e {
                        info!(task_id = %c.task.task_id, kind = ?a.kind, "operator alert published");
                        metrics::count(&metrics::ALERTS_PUBLISHED, &[&c.task.workflow.name], 1);
                    }
                }
                Err(err) if matches!(e, Effect::Reply(_)) && err.is_permanent() => {
                    sent.failed += 1;
                    sent.undelivered += 1;
                    metrics::count(&metrics::REPLIES_UNDELIVERED, &[&c.task.workflow.name], 1);
                    warn!(
                        task_id = %c.task.task_id, reply_undelivered = true, error = %err,
                        "the caller's reply_to refuses the status for good: not delivered, counted on the task (the task goes on)"
                    );
                    sent.undelivered_error = Some(err.to_string());
                }
                Err(err) => {
                    sent.failed += 1;
                    if e.is_essential() {
                        warn!(task_id = %c.task.task_id, effect = e.name(), error = %err, "alert or final status not delivered; the message will be handled again and the notice re-sent");
                        sent.essential.get_or_insert(err);
                    } else {
                        warn!(task_id = %c.task.task_id, effect = e.name(), error = %err, "effect not delivered; the message will be handled again and what its write owes sent again");
                        if !e.is_notification() {
                            sent.work.get_or_insert(err);
                        }
                    }
                }
            }
        }
    }
    sent
}

/// Count statuses that could never be delivered on the task, in a conditional write of its own
/// (re-applied on the current item if a transition wins the race). A failure is only logged: the
/// statuses were logged already, and the task goes on either way.
pub async fn record_undelivered(deps: &Deps, task: &Task, sent: &Sent) {
    let Some(error) = sent.undelivered_error.as_deref() else { return };
    let decide = |read: &Task| Decision::Write(Box::new(read.with_undelivered_replies(sent.undelivered, error)), ());
    match write_loop(deps, task.clone(), MAX_CONFLICTS, decide, |_| true).await {
        Ok(Written::Landed { task: next, .. }) => {
            info!(task_id = %task.task_id, undelivered_replies = next.undelivered.count, rev = next.rev, "undelivered statuses recorded on the task");
        }
        Ok(_) => {}
        Err(HandlerError::Contended(_)) => {
            warn!(task_id = %task.task_id, "could not record the undelivered statuses on the task: it kept changing");
        }
        Err(e) => warn!(task_id = %task.task_id, error = %e, "could not record the undelivered statuses on the task"),
    }
}

async fn perform_one(deps: &Deps, task: &Task, e: &Effect, now: Millis) -> Result<(), EffectError> {
    let out = deps.outbox();
    let sent = match e {
        // Checked again at each send: a task accepted under a wider allow-list (or before there
        // was one) never makes the stack write where it may no longer.
        Effect::Reply(s) => match &task.reply_to {
            Some(q) => match reply::check(&deps.resources, q) {
                Ok(q) => out.reply(q.as_str(), s).await,
                Err(refused) => Err(BusError::Refused {
                    op: "SendMessage",
                    target: q.clone(),
                    code: "NotAllowed".into(),
                    message: refused.to_string(),
                }),
            },
            None => Ok(()),
        },
        Effect::Alert(a) => out.alert(a).await,
        Effect::Run { rev, delay_ms, reason } => {
            out.to_scheduler(&run_message(&task.task_id, *rev, *reason), delay_seconds(*delay_ms)).await
        }
        Effect::Dispatch(r) => match out.dispatch(r).await {
            Err(BusError::TooLarge { bytes }) => {
                out.to_scheduler(&protocol::undeliverable_request(r, bytes, SQS_MAX_MESSAGE_BYTES), 0).await
            }
            other => other,
        },
        Effect::ArmTimer(t) => out.arm_timer(t, now, protocol::deadline_grace_ms(task, &deps.settings.policy)).await,
        Effect::Spawn { step, elements, cancel } => return spawn(deps, task, *step, elements, cancel.as_deref()).await,
        Effect::Send(m) => out.to_scheduler(m, 0).await,
        Effect::ReleaseSlot { key } => {
            return crate::keys::release(deps, key, &task.task_id)
                .await
                .map_err(|e| EffectError::Key { key: key.clone(), source: Box::new(e) })
        }
    };
    Ok(sent?)
}

/// What [`start`] did with a new task.
#[allow(clippy::large_enum_variant)] // a return value, once per start, never stored
pub enum Started {
    /// It was created (its first unit claimed in that write) and its effects were sent: the task
    /// as written, and what the sends did (a failed `work` send fails the caller's message, so
    /// the start is sent again).
    New { task: Box<Task>, sent: Sent },
    /// A task of that id exists and is not this one: nothing was written or sent.
    Exists(Box<Task>),
}

/// Start a new task: one conditional create of `tr.task` ([`transition::create`]), then its
/// effects (the first unit's dispatch and timer, or its run message; its first statuses). The one
/// way a task comes into being: a submission, and each element, branch or child task a parent
/// spawns. `TooLarge`, `Refused` and `AlreadyExists` (it existed and expired) come back as they
/// are, for the caller to decide what they mean.
pub async fn start(deps: &Deps, tr: protocol::Transition, now: Millis) -> Result<Started, StoreError> {
    match transition::create(deps, &tr.task).await? {
        Created::Exists(t) => Ok(Started::Exists(t)),
        Created::New => {
            let committed = Committed { task: tr.task, effects: tr.effects, now };
            let sent = send(deps, &committed).await;
            Ok(Started::New { task: Box::new(committed.task), sent })
        }
    }
}

/// How many map elements one handler creates at once.
const SPAWN_CONCURRENCY: usize = 16;

/// Create map elements, each with one conditional write (claimed at once, like a submission),
/// then send what it owes (its dispatch and timer). An element that exists already (an earlier
/// delivery created it) sends again what its last write owes: its work, or, once it has ended,
/// its end to the parent.
/// A stopping map (`cancel`) creates an element that does not exist ended, never run, and
/// cancels one that exists.
async fn spawn(
    deps: &Deps,
    parent: &Task,
    step: usize,
    elements: &[(u32, serde_json::Value)],
    cancel: Option<&str>,
) -> Result<(), EffectError> {
    let mut first = None;
    for chunk in elements.chunks(SPAWN_CONCURRENCY) {
        let results =
            join_all(chunk.iter().map(|(e, item)| spawn_one(deps, parent, step, *e, item.clone(), cancel))).await;
        for r in results {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

fn spawn_one<'a>(
    deps: &'a Deps,
    parent: &'a Task,
    step: usize,
    element: u32,
    item: serde_json::Value,
    cancel: Option<&'a str>,
) -> futures::future::BoxFuture<'a, Result<(), EffectError>> {
    Box::pin(async move {
        // an element of a paused workflow is created parked (a failed look at the pauses: not
        // parked now; its next unit's transition looks again)
        let key = parent.slot.as_ref().map(|s| s.key.as_str());
        let paused = deps.paused(&parent.workflow.name, key).await.unwrap_or_else(|e| {
            warn!(parent = %parent.task_id, error = %e, "could not read the paused workflows; the element starts");
            false
        });
        let ctx = protocol::Ctx { paused, ..deps.ctx() };
        let policy = &deps.settings.policy;
        let tr = match cancel {
            None => protocol::element_task(parent, step, element, item, &ctx, policy),
            Some(why) => protocol::element_tombstone(parent, step, element, why, &ctx, policy),
        };
        let task_id = tr.task.task_id.clone();
        let failed = |e: HandlerError| EffectError::Element { element: task_id.to_string(), source: Box::new(e) };
        let sent = match start(deps, tr, ctx.now).await {
            Ok(Started::New { task, sent }) => {
                if let Some(i) = &task.iteration {
                    let workflow = &task.workflow.name;
                    info!(%task_id, parent = %parent.task_id, iteration = i.index, workflow, "loop iteration created");
                } else if task.called {
                    let workflow = &task.workflow.name;
                    info!(%task_id, parent = %parent.task_id, workflow, "child workflow task created");
                } else if task.upstream.is_some() {
                    let step = task.steps.first().map_or("", |s| s.name.as_str());
                    info!(%task_id, parent = %parent.task_id, branch = element, step, "parallel branch created");
                } else {
                    info!(%task_id, parent = %parent.task_id, element, "map element created");
                }
                sent
            }
            Ok(Started::Exists(child)) => match protocol::existing_element(&child, cancel) {
                protocol::ExistingElement::Send(effects) => {
                    send(deps, &Committed { task: *child, effects, now: ctx.now }).await
                }
                protocol::ExistingElement::Resend => resend(deps, *child).await.map_err(failed)?,
            },
            // it existed and is gone (expired): nothing to create over it
            Err(StoreError::AlreadyExists) => Sent::default(),
            Err(e) => return Err(failed(e.into())),
        };
        match sent.essential.or(sent.work) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}
