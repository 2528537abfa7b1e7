//! [`Event::Callback`]: an answer to a callback unit (a worker, a person, a remote system),
//! fenced by the attempt its token names and not by `admit`: a late answer is recorded even on an
//! ended task.
//!
//! - `callback_succeeded` acts as an agent's success would (the current, an outstanding or the
//!   awaited attempt) in `Processing`, `Compensating` and `Pending`; the success of an attempt that
//!   no longer counts is a **late result**, recorded on the task (`LateResults`; an operator alert
//!   unless the unit succeeded anyway) in any state, ended ones included: the table lists
//!   `Processed`, `Compensated`, `Error` and `Cancelled` (the last three rare, `table::RARE`).
//! - `callback_failed` acts as an agent's failure would. The table's pair is `(Compensating,
//!   callback_failed)`: the worker of the attempt a cancel waits for says it stopped. A failure of
//!   the current attempt in `Processing` is taken the same way; the simulation's workers never send
//!   one, so that pair is among the table's rare ones (`table::RARE`).
//! - `callback_heartbeat` acts in `Processing` (the attempt that holds the task): `CompleteBy`
//!   moves on, once half the heartbeat window is used.
//!
//! Stale: a token no attempt of its unit was given (`NeverIssued`), an answer applied or recorded
//! before (`Duplicate`, `LateAgain`), a heartbeat not yet due (`HeartbeatNotDue`: taken, nothing
//! written), one of the attempt a cancel waits for (`CancelRequested`: the worker stops), of
//! another attempt (`NotCurrentAttempt`) or to an ended task (`Terminal`).

use serde_json::Value;

use crate::ids::{AttemptToken, Millis};
use crate::messages::{Alert, AlertKind, CallbackAnswer, Phase, VERSION};
use crate::protocol::change::awaited;
use crate::protocol::{apply, Ctx, Effect, Event, Policy, Stale, Task, Transition};

/// An answer to a callback unit, fenced by the attempt its token names:
/// - a success or failure of the current attempt (or of an earlier attempt of the same unit
///   that expired but is still outstanding, or of the attempt a cancel's compensation awaits) is
///   taken as an agent's result would be;
/// - the same success again (senders retry) is a [`Stale::Duplicate`];
/// - a success of an attempt that expired and is no longer outstanding is **late**: an effect
///   happened. It is recorded on the task (`LateResults`) and, unless the unit succeeded anyway
///   (by another attempt with the same idempotency key), an operator is alerted to reconcile it;
///   the task does not move (the unit was retried or compensated already).
/// - a heartbeat extends the current attempt's deadline (see [`heartbeat`]).
pub(crate) fn callback(
    task: &Task,
    attempt: &AttemptToken,
    unit: &str,
    answer: &CallbackAnswer,
    ctx: &Ctx,
    policy: &Policy,
) -> Result<Transition, Stale> {
    let live = !task.process_state.is_terminal()
        && (task.lock.locked_by.as_ref() == Some(attempt)
            || task.lock.outstanding.contains(attempt)
            || awaited(task, attempt));
    // Only an attempt this unit handed a token to is heard: a token nobody was given changes
    // nothing, and says so.
    if !live && !task.unit_named(unit).is_some_and(|r| r.issued(attempt)) {
        return Err(Stale::NeverIssued { unit: unit.to_owned() });
    }
    match answer {
        CallbackAnswer::Heartbeat { details } => heartbeat(task, attempt, details.as_ref(), ctx),
        CallbackAnswer::Succeeded { output } => {
            if live {
                let mut tr = apply(
                    task,
                    &Event::AgentSucceeded { attempt: attempt.clone(), output: output.clone() },
                    ctx,
                    policy,
                )?;
                tr.task.set_done_by(unit, attempt);
                return Ok(tr);
            }
            let Some(record) = task.unit_named(unit) else { return Err(Stale::NotCurrentAttempt) };
            if record.done_by() == Some(attempt) {
                return Err(Stale::Duplicate);
            }
            if task.late.attempt.as_ref() == Some(attempt) {
                return Err(Stale::LateAgain);
            }
            let why = if record.accounted() {
                Late::Accounted
            } else if let Some(error) = record.refused_by(attempt) {
                Late::AfterFailure(error.to_owned())
            } else {
                Late::Expired
            };
            Ok(late(task, attempt, unit, &why, ctx))
        }
        CallbackAnswer::Failed { error, retryable } => {
            if !live && task.unit_named(unit).is_some_and(|r| r.done_by() == Some(attempt)) {
                return Err(Stale::Duplicate);
            }
            if !task.process_state.is_terminal() && task.lock.outstanding.contains(attempt) && !awaited(task, attempt) {
                // this attempt already counts as failed (it expired, or said so before)
                return Err(Stale::Duplicate);
            }
            let event = Event::AgentFailed { attempt: attempt.clone(), error: error.clone(), retryable: *retryable };
            apply(task, &event, ctx, policy)
        }
    }
}

/// A heartbeat of the current attempt of a callback unit: `CompleteBy` moves to now + the unit's
/// `heartbeat_ms`, never past its hard deadline. To keep heartbeats cheap the write is made only
/// once half the heartbeat window is used ([`Stale::HeartbeatNotDue`] otherwise: taken, nothing
/// written), so a worker that heartbeats every few seconds costs one write per half window. The
/// details of a heartbeat that writes are kept on the step (`Progress`). A heartbeat of an
/// attempt a cancel is waiting for is answered [`Stale::CancelRequested`]: the worker stops.
fn heartbeat(task: &Task, attempt: &AttemptToken, details: Option<&Value>, ctx: &Ctx) -> Result<Transition, Stale> {
    if task.process_state.is_terminal() {
        return Err(Stale::Terminal(task.process_state));
    }
    if awaited(task, attempt) {
        return Err(Stale::CancelRequested);
    }
    if task.lock.locked_by.as_ref() != Some(attempt) {
        return Err(Stale::NotCurrentAttempt);
    }
    let complete_by = task.complete_by.unwrap_or(ctx.now);
    let Some(window) = task.current_def().kind.heartbeat_ms() else {
        return Err(Stale::HeartbeatNotDue { complete_by });
    };
    let next = ctx.now.plus_ms(window).min(task.lock.hard_by.unwrap_or(complete_by));
    if next <= complete_by || complete_by > ctx.now.plus_ms(window / 2) {
        return Err(Stale::HeartbeatNotDue { complete_by });
    }
    let mut t = task.clone();
    t.rev += 1;
    t.updated_at = ctx.now;
    t.complete_by = Some(next);
    if let (Phase::Forward, Some(d)) = (t.phase(), details) {
        let i = t.step_index;
        t.steps[i].progress = Some(d.clone());
    }
    Ok(Transition { task: t, effects: Vec::new(), keeps_mark: true })
}

/// Why a success of a callback attempt came too late to count.
#[derive(Debug, Clone, PartialEq)]
enum Late {
    /// The unit succeeded by another attempt with the same idempotency key.
    Accounted,
    /// The same attempt had answered that it failed for good (a person rejected, a worker said
    /// no): the unit failed then.
    AfterFailure(String),
    /// The attempt had expired (the unit was retried, compensated or ended).
    Expired,
}

/// Record a late success on the task (a write of its own; the task does not move) and alert an
/// operator when the unit's effect is not otherwise accounted for.
fn late(task: &Task, attempt: &AttemptToken, unit: &str, why: &Late, ctx: &Ctx) -> Transition {
    let mut t = task.clone();
    t.rev += 1;
    t.updated_at = ctx.now.max(t.updated_at);
    t.late.count = t.late.count.saturating_add(1);
    t.late.attempt = Some(attempt.clone());
    let now = ctx.now;
    t.late.last = Some(match why {
        Late::Accounted => format!("{unit}: a success came at {now} for an expired attempt; the unit had succeeded by another attempt with the same idempotency key"),
        Late::AfterFailure(error) => format!("{unit}: a success came at {now} from an attempt that had already answered that it failed ({error}); the step had failed then, and the task did not take the success: reconcile its effect"),
        Late::Expired => format!("{unit}: a success came at {now} for an attempt that had expired; the task did not take it (the unit was retried, compensated or ended): reconcile its effect"),
    });
    let accounted = *why == Late::Accounted;
    let effects = late_notice(&t, unit, accounted, ctx.now);
    Transition { task: t, effects, keeps_mark: true }
}

/// The operator alert a late result owes (none when the unit's effect is accounted for). Sent
/// again when the same late answer comes back, so it reaches the operator at least once.
pub fn late_notice(task: &Task, unit: &str, accounted: bool, now: Millis) -> Vec<Effect> {
    if accounted {
        return Vec::new();
    }
    vec![Effect::Alert(Alert {
        v: VERSION,
        kind: AlertKind::LateResult,
        task_id: task.task_id.clone(),
        workflow: format!("{}@{}", task.workflow.name, task.workflow.version),
        state: task.process_state,
        step: Some(unit.to_owned()),
        failure_count: task.failure_count,
        reason: task.late.last.clone().unwrap_or_default(),
        at: now,
    })]
}
