//! Finishing: the current unit done (the next unit starts, or the task ends), an attempt that
//! failed without a definite answer (a retry after a backoff, or giving up once the unit's attempts
//! are spent), giving up on a unit (the workflow says: compensate, or park the task in `Error`; a
//! step's `on_failure` may continue instead), and the end of the task in a terminal state.

use serde_json::Value;

use super::{map, Change};
use crate::messages::{AlertKind, Phase, RunReason};
use crate::protocol::{Effect, EndCause, ProcessState, Stage, StepStatus, MAX_VARS_BYTES};
use crate::workflow::{FailureKind, OnFailure};

impl Change<'_> {
    /// The current unit is done: start the next one, or end the task.
    pub(crate) fn advance(&mut self) {
        if self.t.phase() == Phase::Forward && !self.assign() {
            return;
        }
        self.t.lock.outstanding.clear();
        match &mut self.t.stage {
            Stage::Forward if self.t.step_index + 1 < self.t.steps.len() => {
                self.t.step_index += 1;
                self.enter();
            }
            Stage::Forward => self.finish(ProcessState::Processed),
            Stage::Compensating { plan, pos, .. } if *pos + 1 < plan.len() => {
                *pos += 1;
                self.start_unit();
            }
            Stage::Compensating { cause, why, .. } => {
                // the task ends for the reason it was undone, not for its last compensation's note
                let end = cause.end_state();
                if !why.is_empty() {
                    self.t.reason = Some(why.clone());
                }
                self.finish(end);
            }
        }
    }

    /// The current forward step succeeded: its `assign` sets the task's variables, filled over
    /// the task's data (its output kept). False when they would take more than
    /// [`MAX_VARS_BYTES`]: the step then fails for good, as a definite "no" would (it is undone if
    /// it has a compensation: its effect happened), and nothing is set.
    fn assign(&mut self) -> bool {
        let i = self.t.step_index;
        if self.t.steps[i].status != StepStatus::Succeeded {
            return true; // skipped, or a failure its on_failure continues
        }
        let Some(template) = &self.t.workflow.steps[i].assign else { return true };
        let Value::Object(set) = template.0.fill(&self.t) else { return true };
        let mut vars = self.t.vars.clone();
        vars.extend(set);
        let size = crate::messages::json_len(&vars);
        if size <= MAX_VARS_BYTES {
            self.t.vars = vars;
            return true;
        }
        let name = self.t.workflow.steps[i].name.clone();
        let why = format!(
            "its assign makes the task's variables {size} bytes, and they take at most {MAX_VARS_BYTES}: set fewer or \
             smaller values"
        );
        self.t.failure_count += 1;
        self.t.steps[i].maybe_applied = true;
        self.t.unit_record().refused(&why);
        self.give_up(format!("step {name} failed permanently: {why}"), FailureKind::Permanent);
        false
    }

    /// One attempt failed without a definite "no" (timeout or a retryable error): its effect is
    /// uncertain. Retry after a backoff, or give up once the unit's attempts are spent.
    pub(crate) fn attempt_failed(&mut self, reason: &str, timed_out: bool) {
        let def = self.t.current_def().clone();
        self.t.failure_count += 1;
        self.unlock();
        if self.t.phase() == Phase::Forward {
            let i = self.t.step_index;
            self.t.steps[i].maybe_applied = true;
        }
        let failures = self.t.unit_record().attempt_failed(reason);
        let name = if timed_out { None } else { crate::messages::error_name(reason) };
        let kind = if timed_out { FailureKind::TimedOut } else { FailureKind::Retryable };
        // a failure the step's retry_on does not name is not retried
        let retried = def.retry_on.as_ref().is_none_or(|on| on.iter().any(|h| h.matches(kind, name.as_deref())));
        if failures < def.max_attempts && retried {
            let delay = def.backoff.delay_ms(failures, self.ctx.jitter);
            self.t.reason = Some(format!("{reason}; retry {}/{} in {delay} ms", failures + 1, def.max_attempts));
            self.wait_for_claim(self.ctx.now.plus_ms(delay), RunReason::Retry);
            return;
        }
        let gave_up = if retried {
            format!("{reason}; all {} attempts used", def.max_attempts)
        } else {
            format!("{reason}; not retried (the step's retry_on does not name it)")
        };
        self.error_name = name;
        self.t.unit_record().exhausted(timed_out);
        match self.t.phase() {
            Phase::Forward => {
                // A map element's parent speaks for it: one alert when its map stops, not one
                // per element (a map that tolerates failures would alert for each). A failure
                // the step handles is a path of the workflow, not an operator's business.
                if self.t.workflow.on_failure == OnFailure::Compensate
                    && !self.t.task_id.is_child()
                    && !self.handles(kind)
                {
                    let alert = self.alert(AlertKind::RetriesExhausted, &gave_up);
                    self.fx.push(Effect::Alert(alert));
                }
                self.give_up(gave_up, kind);
            }
            Phase::Compensate => self.give_up(format!("compensation failed: {gave_up}"), kind),
        }
    }

    /// Whether the current forward step's `on_failure` handles a failure of `kind` (a map step
    /// or a parallel region never does: their elements and branches handle their own).
    pub(crate) fn handles(&self, kind: FailureKind) -> bool {
        let i = self.t.step_index;
        let w = &self.t.workflow;
        self.t.phase() == Phase::Forward
            && w.steps[i].map.is_none()
            && w.region_at(i).is_none()
            && w.steps[i].on_failure.continues(kind, self.error_name.as_deref())
    }

    /// The current unit failed for good. A forward step is compensated (with itself when some
    /// attempt of it may have applied), or parks the task in `Error` for an operator, as the
    /// workflow says; a compensation that fails for good leaves the task in `Error`.
    pub(crate) fn give_up(&mut self, reason: String, kind: FailureKind) {
        if self.handles(kind) {
            // the step's failure is a path: its error is its output, and the task goes on
            let i = self.t.step_index;
            let mut error = serde_json::json!({"kind": kind.name(), "message": crate::ids::clip(&reason, 300)});
            if let Some(name) = &self.error_name {
                error["name"] = serde_json::json!(name);
            }
            self.t.steps[i].output = Some(serde_json::json!({ "error": error }));
            self.t.reason = Some(format!("{reason}; the step's on_failure continues the task"));
            self.unlock();
            self.advance();
            return;
        }
        match (self.t.phase(), self.t.workflow.on_failure) {
            (Phase::Forward, OnFailure::Compensate) => self.begin_compensation(EndCause::Failed, reason),
            (Phase::Forward, OnFailure::Error) | (Phase::Compensate, _) => {
                self.t.reason = Some(reason);
                self.finish(ProcessState::Error);
            }
        }
    }

    /// End the task in a terminal state; `Error` alerts an operator.
    pub(crate) fn finish(&mut self, end: ProcessState) {
        debug_assert!(end.is_terminal());
        self.unlock();
        self.t.complete_by = None;
        self.t.claim.not_before = None;
        self.t.claim.paused = false;
        self.t.lock.outstanding.clear();
        self.t.lock.awaits = None;
        self.note(end);
        if end == ProcessState::Error {
            let reason = self.t.reason.clone().unwrap_or_default();
            let alert = self.alert(AlertKind::TaskError, &reason);
            self.fx.push(Effect::Alert(alert));
        }
        self.fx.extend(map::ended_notice(&self.t));
        if let Some(slot) = &self.t.slot {
            self.fx.push(Effect::ReleaseSlot { key: slot.key.clone() });
        }
    }
}
