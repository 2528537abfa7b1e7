//! An agent's report of an attempt: [`Event::AgentSucceeded`], [`Event::AgentFailed`],
//! [`Event::AgentTimedOut`], [`Event::AgentNotStarted`]. A report applies only to an attempt that
//! still counts: the one that holds the task (`LockedBy`), an earlier one of the same unit whose
//! success is still taken (`Outstanding`), or the forward attempt a compensation waits for
//! (`Awaits`).
//!
//! - `agent_succeeded` acts in `Processing` and `Compensating` (the current attempt, an
//!   outstanding one, or the awaited one, whose success releases the compensation) and in
//!   `Pending` (an outstanding attempt's success while the retry waits for its claim): the table's
//!   three pairs. The unit succeeds and the task moves on.
//! - `agent_failed` acts in `Processing` and `Compensating`: the current attempt's failure (a
//!   retry, or the unit given up after a definite "no"), or the awaited attempt's definite "no".
//! - `agent_timed_out` acts in `Processing` and `Compensating`: the current attempt failed, its
//!   effect unknown.
//! - `agent_not_started` acts in `Processing`: the unit is claimed again. Its guard is the others'
//!   (the attempt that holds the task), so a compensation's attempt is claimed again in
//!   `Compensating` too; the table lists that pair among the rare ones (`table::RARE`: no seed of
//!   the simulation has reached it).
//!
//! Stale: a report of an attempt that no longer counts (`NotCurrentAttempt`), and an ended task
//! (`Terminal`, from `admit`).
//!
//! [`Event::AgentSucceeded`]: crate::protocol::Event::AgentSucceeded
//! [`Event::AgentFailed`]: crate::protocol::Event::AgentFailed
//! [`Event::AgentTimedOut`]: crate::protocol::Event::AgentTimedOut
//! [`Event::AgentNotStarted`]: crate::protocol::Event::AgentNotStarted

use serde_json::Value;

use crate::ids::AttemptToken;
use crate::messages::Phase;
use crate::protocol::change::Change;
use crate::protocol::task::{self, noun};
use crate::protocol::{Stale, StepStatus, Task};
use crate::workflow::{FailureKind, StepDef};

/// An attempt succeeded: the current one, or an earlier attempt of the same unit that timed out
/// but had answered in time (its effect and the retry's share one idempotency key). A compensation
/// waiting for its forward attempt may start as soon as that attempt has answered.
pub(crate) fn agent_succeeded(
    task: &Task,
    attempt: &AttemptToken,
    output: &Value,
    c: &mut Change,
) -> Result<(), Stale> {
    if c.awaited(attempt) {
        // The cancelled step is known to have applied: it is compensated (it is in the plan
        // already) with its output, which its compensation may need (a charge id to refund).
        let i = c.t.step_index;
        c.t.steps[i].status = StepStatus::Succeeded;
        c.t.steps[i].output = Some(kept(&c.t.workflow.steps[i], output));
        c.release_compensation();
        return Ok(());
    }
    check_attempt(task, attempt)?;
    c.t.unit_record().succeeded();
    if c.t.phase() == Phase::Forward {
        let i = c.t.step_index;
        c.t.steps[i].output = Some(kept(&c.t.workflow.steps[i], output));
        // Only a step that may still be running needs its settling time (a cancel waits for
        // it); a succeeded one is undone without waiting: one attribute less in every write.
        c.t.steps[i].settles_at = None;
        // The step recovered: earlier failures stay in the history and the step records.
        c.t.reason = None;
    }
    c.advance();
    Ok(())
}

/// An agent's answer as the step keeps it: its `result_selector` filled from it, or all of it.
pub(crate) fn kept(def: &StepDef, output: &Value) -> Value {
    match &def.result_selector {
        Some(t) => t.0.fill_from(output),
        None => output.clone(),
    }
}

/// The current attempt failed: a retryable failure counts and retries, a definite "no" gives the
/// unit up (nothing to undo for this attempt: the service said no).
pub(crate) fn agent_failed(
    task: &Task,
    attempt: &AttemptToken,
    error: &str,
    retryable: bool,
    c: &mut Change,
) -> Result<(), Stale> {
    // Only a definite "no" proves the awaited attempt can no longer apply. A retryable failure
    // proves nothing (a gateway's 504 while the backend works on; a 503 to a second copy of the
    // attempt while the first applies): the compensation waits on until the attempt settles.
    if !retryable && c.awaited(attempt) {
        c.release_compensation();
        return Ok(());
    }
    if task.lock.locked_by.as_ref() != Some(attempt) {
        return Err(Stale::NotCurrentAttempt);
    }
    if retryable {
        // Another copy of this attempt (an SQS duplicate, a resent start) may still succeed:
        // its success is taken, as a timed-out attempt's is.
        c.t.lock.outstanding.push(attempt.clone());
        c.attempt_failed(error, false);
        return Ok(());
    }
    c.t.failure_count += 1;
    c.error_name = crate::messages::error_name(error);
    c.t.unit_record().refused(error);
    let reason = format!("{} {} failed permanently: {error}", noun(c.t.phase()), c.t.current_def().name);
    c.give_up(reason, FailureKind::Permanent);
    Ok(())
}

/// The current attempt ran out of its execution time, says its agent: a timeout, found before
/// `CompleteBy`. Its effect is unknown (the call may land until its deadline), so the attempt
/// stays outstanding and never releases a waiting compensation.
pub(crate) fn agent_timed_out(task: &Task, attempt: &AttemptToken, error: &str, c: &mut Change) -> Result<(), Stale> {
    if task.lock.locked_by.as_ref() != Some(attempt) {
        return Err(Stale::NotCurrentAttempt);
    }
    c.t.lock.outstanding.push(attempt.clone());
    let reason = format!("{} {} attempt {} {error}", noun(c.t.phase()), c.t.current_def().name, c.t.unit_attempts());
    c.attempt_failed(&reason, true);
    Ok(())
}

/// The agent did not start the current attempt: its request waited past its `start_by` (in a
/// backlogged agent queue, or for a slot of an agent at its `max_in_flight`). That is no failure
/// (no failure is counted, no backoff): the unit is claimed again at once with a new attempt and
/// a fresh schedule-to-start budget, so overload turns into delay. Each such claim comes at least
/// one budget after the last (the agent says so only once `start_by` has passed).
///
/// "Not started" speaks for the copy that agent held, not for the attempt: another copy (an SQS
/// duplicate) may be running elsewhere. So the attempt stays outstanding (its success is still
/// taken), the step may have applied (it is compensated if it fails for good), and an awaited
/// attempt is not released by it.
pub(crate) fn agent_not_started(task: &Task, attempt: &AttemptToken, error: &str, c: &mut Change) -> Result<(), Stale> {
    if task.lock.locked_by.as_ref() != Some(attempt) {
        return Err(Stale::NotCurrentAttempt);
    }
    c.t.lock.outstanding.push(attempt.clone());
    if c.t.lock.outstanding.len() > task::MAX_ISSUED {
        c.t.lock.outstanding.remove(0);
    }
    if c.t.phase() == Phase::Forward {
        let i = c.t.step_index;
        c.t.steps[i].maybe_applied = true;
    }
    c.t.reason = Some(format!(
        "{} {} attempt {} {error}; claimed again",
        noun(c.t.phase()),
        c.t.current_def().name,
        c.t.unit_attempts()
    ));
    c.unlock();
    c.start_unit();
    Ok(())
}

fn check_attempt(task: &Task, attempt: &AttemptToken) -> Result<(), Stale> {
    if task.lock.locked_by.as_ref() == Some(attempt) || task.lock.outstanding.contains(attempt) {
        Ok(())
    } else {
        Err(Stale::NotCurrentAttempt)
    }
}
