//! The Scheduler: every message of the scheduler queue becomes one protocol event on one task.
//! Run messages claim the current unit of work (dispatching it to its Agent), agent results move
//! the task on, and operators' cancel and resubmit commands stop or resume it.

use tracing::{info, warn};

use crate::bus::Record;
use crate::deps::{Deps, HandlerError};
use crate::effects::drive;
use crate::ids::TaskId;
use crate::messages::{Outcome, SchedulerMessage, VERSION};
use crate::protocol::{Event, Stale};
use crate::screen;
use crate::transition::Applied;

/// The longest agent error kept on a task.
pub const MAX_ERROR_BYTES: usize = 1024;

/// Parse a scheduler-queue message into the event it carries (and, for a resubmit, the run it
/// is for).
pub fn event_of(raw: &str) -> Result<(TaskId, Event), HandlerError> {
    event_and_run(raw).map(|(id, e, _)| (id, e))
}

fn event_and_run(raw: &str) -> Result<(TaskId, Event, Option<u32>), HandlerError> {
    let msg: SchedulerMessage = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    if msg.version() != VERSION {
        return Err(HandlerError::Malformed(format!("unsupported version {}", msg.version())));
    }
    let event = match &msg {
        SchedulerMessage::Run(m) => Event::Claim { rev: m.rev },
        SchedulerMessage::Result(r) => match &r.outcome {
            Outcome::Succeeded { output } => {
                Event::AgentSucceeded { attempt: r.attempt.clone(), output: screen::output(output) }
            }
            Outcome::Failed { error, retryable } => Event::AgentFailed {
                attempt: r.attempt.clone(),
                // an agent's error is stored on the task: bounded
                error: crate::ids::clip(error, MAX_ERROR_BYTES).to_owned(),
                retryable: *retryable,
            },
        },
        SchedulerMessage::Cancel(c) => Event::Cancel { reason: c.reason.clone() },
        SchedulerMessage::Resubmit(r) => Event::Resubmit { reason: r.reason.clone() },
    };
    let run = match &msg {
        SchedulerMessage::Resubmit(r) => r.run,
        _ => None,
    };
    Ok((msg.task_id().clone(), event, run))
}

/// Handle one message of the scheduler queue, as delivered (a redelivery re-sends the notices of
/// a task it finds terminal).
pub async fn handle(deps: &Deps, record: &Record) -> Result<Applied, HandlerError> {
    schedule_with(deps, &record.body, record.receive_count > 1).await
}

/// Handle one scheduler-queue message body.
pub async fn schedule(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    schedule_with(deps, raw, false).await
}

async fn schedule_with(deps: &Deps, raw: &str, redelivered: bool) -> Result<Applied, HandlerError> {
    let (task_id, event, run) = event_and_run(raw)?;
    if let Some(task) = deps.store.get(&task_id).await? {
        // A resubmit is fenced by the run the operator saw in Error: a duplicate delivery, or one
        // that arrives after the task failed again, changes nothing (a conflicting write in
        // between re-decides on the new item, which is no longer in Error).
        if let Some(run) = run.filter(|r| *r != task.run) {
            info!(%task_id, message_run = run, task_run = task.run, "resubmit for another run dropped");
            return Ok(Applied::Stale(Stale::OtherRun { message: run, current: task.run }));
        }
        match (drive(deps, task.clone(), &event, redelivered).await, &event) {
            // A success whose output makes the task too large (or that DynamoDB refuses for a
            // reason the screen does not know) would fail every delivery: keep the success, with
            // the marker for an output.
            (Err(HandlerError::Unstorable(e)), Event::AgentSucceeded { attempt, .. }) => {
                warn!(%task_id, error = %e, "the task cannot be stored with this output: the success is kept with a marker instead");
                let event = Event::AgentSucceeded {
                    attempt: attempt.clone(),
                    output: screen::unstorable_output(&e.to_string()),
                };
                drive(deps, task, &event, redelivered).await
            }
            (other, _) => other,
        }
    } else {
        warn!(%task_id, event = event.name(), "no such task; message dropped");
        Ok(Applied::Missing)
    }
}
