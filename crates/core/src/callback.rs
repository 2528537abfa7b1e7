//! The answer desk of callback steps: one answer (succeeded, failed, heartbeat) with its token,
//! from the callback queue, the HTTPS endpoint or `sasctl`, becomes one protocol event
//! ([`Event::Callback`]) on one task, fenced by the attempt the token names; what it did is told
//! back as a [`CallbackReply`]. The token is a secret: logs name the task and unit, never it.

use tracing::{info, warn};

use crate::deps::{Deps, HandlerError};
use crate::effects::{drive_task, send};
use crate::envelope::MAX_ERROR_BYTES;
use crate::messages::{CallbackAnswer, CallbackMessage, CallbackReply, CallbackResult};
use crate::protocol::{late_notice, Event, Stale};
use crate::screen;
use crate::transition::{Applied, Committed};

/// The most heartbeat details kept on the task (they are written with the heartbeats that move
/// the deadline).
pub const MAX_DETAILS_BYTES: usize = 1024;

/// Parse one callback message (the callback queue's body, the HTTPS request's body).
pub fn parse(raw: &str) -> Result<CallbackMessage, HandlerError> {
    crate::envelope::callback_message(raw).map_err(HandlerError::Malformed)
}

/// What is kept of an answer: an output the task can store (a marker otherwise), a bounded error,
/// details no larger than [`MAX_DETAILS_BYTES`].
fn screened(answer: &CallbackAnswer) -> CallbackAnswer {
    match answer {
        CallbackAnswer::Succeeded { output } => CallbackAnswer::Succeeded { output: screen::output(output) },
        CallbackAnswer::Failed { error, retryable } => {
            CallbackAnswer::Failed { error: crate::ids::clip(error, MAX_ERROR_BYTES).to_owned(), retryable: *retryable }
        }
        CallbackAnswer::Heartbeat { details } => CallbackAnswer::Heartbeat {
            details: details.as_ref().map(|d| {
                let size = sas_protocol::messages::json_len(d);
                if size <= MAX_DETAILS_BYTES {
                    d.clone()
                } else {
                    serde_json::json!({ "truncated": true, "bytes": size })
                }
            }),
        },
    }
}

/// Apply one answer. `message`: the id of the queue message that carried it (`None` for the
/// HTTPS endpoint and direct calls); only logged: the answer's own content marks its write. Errors are the handlers' (retry, or dead-letter a
/// malformed message); every answer that reached a task gets a reply saying what it did.
pub async fn answer(deps: &Deps, msg: &CallbackMessage, message: Option<&str>) -> Result<CallbackReply, HandlerError> {
    let (task_id, unit, attempt) = (msg.token.task_id(), msg.token.unit(), msg.token.attempt());
    tracing::debug!(%task_id, unit, message, "callback answer");
    let Some(task) = deps.store.get(task_id).await? else {
        info!(%task_id, unit, answer = msg.answer.name(), "callback for a task that does not exist");
        return Ok(CallbackReply::new(CallbackResult::Unknown, None, "no task has this token"));
    };
    let event = Event::Callback { attempt: attempt.clone(), unit: unit.to_owned(), answer: screened(&msg.answer) };
    // The write is marked with the answer itself (its attempt and kind), not with the message
    // that carried it: a sender that retries after a 5xx (over HTTPS there is no message id,
    // and a worker's retry is a new queue message) finds its write and has what it owes sent again.
    let mark = format!("callback:{attempt}:{}", msg.answer.name());
    let (applied, after) = drive_task(deps, task, &event, Some(&mark)).await?;
    let now_state = after.as_ref().map(|t| t.process_state);
    let reply = match applied {
        Applied::Missing => CallbackReply::new(CallbackResult::Unknown, None, "no task has this token"),
        Applied::Changed { state, .. } => match &msg.answer {
            CallbackAnswer::Heartbeat { .. } => {
                let mut r = CallbackReply::new(CallbackResult::Alive, Some(state), "heartbeat taken: deadline moved");
                r.complete_by = after.as_ref().and_then(|t| t.complete_by);
                r
            }
            _ if after.as_ref().is_some_and(|t| t.late.attempt.as_ref() == Some(attempt)) => CallbackReply::new(
                CallbackResult::Late,
                Some(state),
                after.as_ref().and_then(|t| t.late.last.clone()).unwrap_or_default(),
            ),
            _ => CallbackReply::new(CallbackResult::Applied, Some(state), format!("{} taken", msg.answer.name())),
        },
        Applied::Stale(why_not) => {
            let (why, state) = (why_not.to_string(), now_state);
            match why_not {
                Stale::HeartbeatNotDue { complete_by } => {
                    let mut r = CallbackReply::new(CallbackResult::Alive, state, why);
                    r.complete_by = Some(complete_by);
                    r
                }
                Stale::Duplicate => CallbackReply::new(CallbackResult::Duplicate, state, why),
                Stale::NeverIssued { .. } => CallbackReply::new(CallbackResult::Unknown, state, why),
                Stale::CancelRequested | Stale::Terminal(_) => {
                    CallbackReply::new(CallbackResult::Cancelled, state, why)
                }
                Stale::LateAgain => {
                    // The same late answer again: its write may have been made by a handler that
                    // died before its alert went out, so the alert is sent again.
                    if let Some(t) = &after {
                        resend_late_notice(deps, t, unit).await?;
                    }
                    CallbackReply::new(CallbackResult::Late, state, why)
                }
                _ => CallbackReply::new(CallbackResult::Stale, state, why),
            }
        }
    };
    match reply.result {
        CallbackResult::Applied | CallbackResult::Alive | CallbackResult::Duplicate => {
            info!(%task_id, unit, answer = msg.answer.name(), result = ?reply.result, "callback answered");
        }
        _ => {
            warn!(%task_id, unit, answer = msg.answer.name(), result = ?reply.result, reason = %reply.reason, "callback answered: not taken");
        }
    }
    Ok(reply)
}

async fn resend_late_notice(deps: &Deps, task: &crate::protocol::Task, unit: &str) -> Result<(), HandlerError> {
    let accounted = task.unit_named(unit).is_some_and(|u| u.accounted());
    let effects = late_notice(task, unit, accounted, deps.now());
    if effects.is_empty() {
        return Ok(());
    }
    let sent = send(deps, &Committed { task: task.clone(), effects, now: deps.now() }).await;
    match sent.essential {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
