//! The Scheduler: every message of the scheduler queue becomes one protocol event on one task.
//! Run messages claim the current unit of work (dispatching it to its Agent), agent results move
//! the task on, and operators' cancel and resubmit commands stop or resume it.

use tracing::{info, warn};

use crate::bus::Record;
use crate::deps::{Deps, HandlerError};
use crate::effects::{drive, finish, send};
use crate::envelope::{Body, Envelope};
use crate::ids::{message_mark, TaskId};
use crate::messages::SchedulerMessage;
use std::collections::HashMap;

use serde_json::Value;

use crate::protocol::{self, Event, Task};
use crate::screen;
use crate::transition::{commit_many, Applied, Committed};

pub use crate::envelope::MAX_ERROR_BYTES;

/// Parse a scheduler-queue message into the event it carries.
pub fn event_of(raw: &str) -> Result<(TaskId, Event), HandlerError> {
    let msg: SchedulerMessage = crate::envelope::read(raw).map_err(HandlerError::Malformed)?;
    crate::envelope::scheduled(msg).map(|s| (s.task_id, s.event))
}

/// Handle one message of the scheduler queue, as delivered.
pub async fn handle(deps: &Deps, record: &Record) -> Result<Applied, HandlerError> {
    handle_envelope(deps, Envelope::open(crate::envelope::Role::Scheduler, record)).await
}

/// Handle one scheduler-queue record, read once ([`Envelope::open`]).
pub async fn handle_envelope(deps: &Deps, envelope: Envelope<'_>) -> Result<Applied, HandlerError> {
    match envelope.body {
        Body::Scheduler(s) => {
            handle_scheduled(deps, s.map_err(HandlerError::Malformed)?, Some(&envelope.record.message_id)).await
        }
        _ => Err(HandlerError::Malformed("not a scheduler-queue record".into())),
    }
}

/// Handle the event one scheduler-queue message carries, as its envelope read it; `message`: the
/// record's id (what marks the task's write as this message's).
pub async fn handle_scheduled(
    deps: &Deps,
    s: crate::envelope::Scheduled,
    message: Option<&str>,
) -> Result<Applied, HandlerError> {
    schedule_event(deps, s.task_id, s.event, message).await
}

/// The ends of elements (or branches) of one parent that one batch brings, in the batch's order:
/// applied one after the other and written in one conditional write, then their effects performed
/// (see [`crate::transition::commit_many`]). Each of `records` must carry an `element_ended` for
/// the same task ([`Envelope::ended_parent`]); the outcome is the group's.
pub async fn handle_ends(deps: &Deps, records: &[Envelope<'_>]) -> Result<(), HandlerError> {
    let mut task_id: Option<&TaskId> = None;
    let mut events = Vec::with_capacity(records.len());
    for r in records {
        let (Some(parent), Body::Scheduler(Ok(s))) = (r.ended_parent(), &r.body) else {
            return Err(HandlerError::Malformed(format!("message {} is not an element's end", r.record.message_id)));
        };
        if task_id.is_some_and(|t| t != parent) {
            return Err(HandlerError::Malformed(format!(
                "message {} is not an end for {parent:?}'s group",
                r.record.message_id
            )));
        }
        task_id = Some(parent);
        events.push((&s.event, message_mark(&r.record.message_id)));
    }
    let Some(task_id) = task_id else { return Ok(()) };
    let Some(task) = deps.store.get(task_id).await? else {
        warn!(%task_id, events = events.len(), "no such task; element ends dropped");
        return Ok(());
    };
    let marks: Vec<String> = events.iter().map(|(_, m)| m.clone()).collect();
    let pairs: Vec<(&Event, Option<&str>)> = events.iter().map(|(e, m)| (*e, Some(m.as_str()))).collect();
    let (_, commit) = commit_many(deps, task, &pairs).await?;
    finish(deps, commit, &marks).await.map(drop)
}

/// Handle one scheduler-queue message body.
pub async fn schedule(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    let (task_id, event) = event_of(raw)?;
    schedule_event(deps, task_id, event, None).await
}

async fn schedule_event(
    deps: &Deps,
    task_id: TaskId,
    event: Event,
    message: Option<&str>,
) -> Result<Applied, HandlerError> {
    let Some(task) = deps.store.get(&task_id).await? else {
        warn!(%task_id, event = event.name(), "no such task; message dropped");
        return Ok(Applied::Missing);
    };
    let event = match event {
        Event::Joined { step, .. } if joining(&task, step) => {
            Event::Joined { step, output: join_output(deps, &task, step).await? }
        }
        other => other,
    };
    let applied = match (drive(deps, task.clone(), &event, message).await, &event) {
        // A success whose output makes the task too large (or that DynamoDB refuses for a reason
        // the screen does not know) would fail every delivery: keep the success, with the marker
        // for an output.
        (Err(HandlerError::Unstorable(e)), Event::AgentSucceeded { attempt, .. }) => {
            warn!(%task_id, error = %e, "the task cannot be stored with this output: the success is kept with a marker instead");
            let event =
                Event::AgentSucceeded { attempt: attempt.clone(), output: screen::unstorable_output(&e.to_string()) };
            drive(deps, task.clone(), &event, message).await?
        }
        (other, _) => other?,
    };
    // What an event that changed nothing still owes (the protocol's decision, on the task as the
    // event found it): a run message that came early goes on, an ended element says so again.
    if let Applied::Stale(stale) = &applied {
        let owed = protocol::stale_sends(&task, &event, stale);
        if !owed.is_empty() {
            info!(%task_id, event = event.name(), reason = %stale, sends = owed.len(), "the event changed nothing but owes sends: sent");
            let sent = send(deps, &Committed { task, effects: owed, now: deps.now() }).await;
            if let Some(e) = sent.work.or(sent.essential) {
                return Err(e.into());
            }
        }
    }
    Ok(applied)
}

/// The most bytes of element outputs a map step keeps as its output (later steps receive it in
/// every request); beyond it the output says where the elements' outputs are.
pub const MAX_JOIN_BYTES: usize = 64 * 1024;

fn joining(task: &Task, step: usize) -> bool {
    task.steps.get(step).and_then(|s| s.map.as_ref()).is_some_and(|p| p.joining)
}

/// The outputs of a map step's elements, in element order (`null` for an element that failed
/// within `tolerated_failures`; a child workflow's result for a map of a workflow step). Read with `BatchGetItem`; an element the eventually consistent
/// read misses or finds not yet ended is read again strongly.
async fn join_output(deps: &Deps, task: &Task, step: usize) -> Result<Value, HandlerError> {
    let p = task.steps[step].map.as_ref().expect("a joining map has its progress");
    let ids: Vec<TaskId> = p.ok.ones(p.n).map(|e| TaskId::child(&task.task_id, step, e)).collect();
    let mut found: HashMap<TaskId, Task> =
        deps.store.get_many(&ids).await?.into_iter().map(|t| (t.task_id.clone(), t)).collect();
    for id in &ids {
        if !found.get(id).is_some_and(|t| t.process_state.is_terminal()) {
            if let Some(t) = deps.store.get(id).await? {
                found.insert(id.clone(), t);
            }
        }
    }
    let outputs: Vec<Value> = (0..p.n)
        .map(|e| found.get(&TaskId::child(&task.task_id, step, e)).map_or(Value::Null, Task::element_output))
        .collect();
    let output = Value::Array(outputs);
    let bytes = sas_protocol::messages::json_len(&output);
    if bytes <= MAX_JOIN_BYTES {
        return Ok(output);
    }
    Ok(serde_json::json!({
        "elements": p.n,
        "failed": p.failed,
        "outputs_bytes": bytes,
        "outputs": format!(
            "over {MAX_JOIN_BYTES} bytes, not kept on the task: element i's output is the output of task {}~{step}~i",
            task.task_id
        ),
    }))
}
