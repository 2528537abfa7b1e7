//! The Scheduler-Agent-Supervisor protocol as one pure state machine:
//! `(task, event, ctx) -> (task', effects)` or `Stale`. No I/O happens here: the role handlers
//! load the task, call [`apply`], write the new task with a conditional write (the only lock),
//! and only then perform the effects.
//!
//! The story, in the pattern's words, one function per event:
//! - [`submit`]: a submission creates a `Pending` task whose `CompleteBy` is already set, so the
//!   Supervisor starts it even if the start message is lost.
//! - [`Event::Claim`] (`claim`): the Scheduler claims the current unit of work: `LockedBy` = a
//!   fresh attempt token, `CompleteBy` = now + the unit's timeout; it dispatches the unit to its
//!   Agent and arms a deadline timer.
//! - [`Event::AgentSucceeded`] / [`Event::AgentFailed`] (`agent_succeeded`, `agent_failed`): the
//!   Agent's result applies only if it carries the current token. Success moves to the next unit
//!   (claimed in the same write) or ends the task; a definite "no" gives the unit up; a retryable
//!   failure counts and retries.
//! - [`Event::DeadlineExpired`] (`deadline_expired`): the Supervisor found `CompleteBy` in the
//!   past: `FailureCount` + 1 and a retry after a backoff, or, when the unit's attempts are spent,
//!   an operator alert and compensation of the completed steps in reverse order.
//! - Compensation ends `Compensated`; a compensation that fails for good ends `Error` (alert).
//! - [`Event::Cancel`] (`cancel`): completed steps are compensated and the task ends `Cancelled`.
//! - [`Event::Resubmit`] (`resubmit`): an operator resumes an `Error` task at its failed unit.
//!
//! A **unit of work** is a forward step or the compensation of one (see [`task`]); every rule
//! about attempts, retries and giving up is written once for both.

use serde_json::{json, Map, Value};

use crate::ids::{AttemptToken, IdempotencyKey, Millis, TaskId};
use crate::messages::{AgentRequest, Alert, AlertKind, Phase, RunReason, StatusMessage, TimerMessage, VERSION};
use crate::workflow::{OnFailure, WorkflowDef};

pub mod task;

pub use crate::state::{ProcessState, UnknownState};
use task::{noun, running_state, waiting_state};
pub use task::{CompensationRecord, CompensationStatus, EndCause, HistoryEntry, Stage, StepRecord, StepStatus, Task};

/// Tunables of the protocol that are not per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// How long a `Pending` task may wait for its run message before the Supervisor restarts it.
    pub start_timeout_ms: u64,
    /// History entries kept on the task item (the oldest are dropped).
    pub history_limit: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { start_timeout_ms: 30_000, history_limit: 50 }
    }
}

/// What the shell supplies to a transition: the time and the randomness, so the machine stays pure.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub now: Millis,
    /// Used if the transition claims an attempt.
    pub fresh_token: AttemptToken,
    /// In [0, 1): the random part of a backoff.
    pub jitter: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The Scheduler received a run message issued when the task was at `rev`.
    Claim {
        rev: u64,
    },
    AgentSucceeded {
        attempt: AttemptToken,
        output: Value,
    },
    AgentFailed {
        attempt: AttemptToken,
        error: String,
        retryable: bool,
    },
    /// The Supervisor found `CompleteBy` in the past.
    DeadlineExpired,
    /// Operator: stop the task (also an `Error` task parked in its forward stage).
    Cancel {
        reason: String,
    },
    /// Operator: an `Error` task resumes from its failed step; completed steps are not redone.
    Resubmit {
        reason: String,
    },
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::Claim { .. } => "claim",
            Event::AgentSucceeded { .. } => "agent_succeeded",
            Event::AgentFailed { .. } => "agent_failed",
            Event::DeadlineExpired => "deadline_expired",
            Event::Cancel { .. } => "cancel",
            Event::Resubmit { .. } => "resubmit",
        }
    }
}

/// What the shell must do once the new task is written, in this order: notifications first
/// (`Reply`, `Alert`), then work (`Run`, `Dispatch`, `ArmTimer`), so that a caller never sees a
/// later status before an earlier one caused by the same chain of messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Reply(StatusMessage),
    Alert(Alert),
    /// A run message to the scheduler queue, delivered after `delay_ms`.
    Run {
        rev: u64,
        delay_ms: u64,
        reason: RunReason,
    },
    Dispatch(AgentRequest),
    /// A message to the supervisor queue, due at the attempt's `CompleteBy`.
    ArmTimer(TimerMessage),
}

impl Effect {
    pub fn name(&self) -> &'static str {
        match self {
            Effect::Reply(_) => "reply",
            Effect::Alert(_) => "alert",
            Effect::Run { .. } => "run",
            Effect::Dispatch(_) => "dispatch",
            Effect::ArmTimer(_) => "timer",
        }
    }

    /// Notifications go before work.
    pub fn is_notification(&self) -> bool {
        matches!(self, Effect::Reply(_) | Effect::Alert(_))
    }
}

/// Why an event changes nothing. Stale events are normal under at-least-once delivery: they are
/// logged and dropped, never retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    #[error("task is {0}, a terminal state")]
    Terminal(ProcessState),
    #[error("run message was for rev {message}, the task is at rev {current}")]
    OldRun { message: u64, current: u64 },
    #[error("the current attempt is already claimed")]
    AlreadyClaimed,
    #[error("task is {0}; only a Pending or Compensating task can be claimed")]
    NotClaimable(ProcessState),
    #[error("attempt token is not the current one")]
    NotCurrentAttempt,
    #[error("CompleteBy {complete_by} has not passed (now {now})")]
    NotExpired { complete_by: Millis, now: Millis },
    #[error("task is already being compensated")]
    AlreadyCompensating,
    #[error("task is {0}; only an Error task can be resubmitted")]
    NotResubmittable(ProcessState),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub task: Task,
    pub effects: Vec<Effect>,
}

/// Create the task for an accepted submission: `Pending`, with a `CompleteBy` so that the
/// Supervisor starts it even if the start message is lost.
pub fn submit(
    task_id: TaskId,
    workflow: WorkflowDef,
    input: Value,
    reply_to: Option<String>,
    now: Millis,
    policy: &Policy,
) -> Transition {
    let steps = workflow.steps.iter().map(|s| StepRecord::new(&s.name)).collect();
    let task = Task {
        task_id,
        workflow,
        input,
        reply_to,
        process_state: ProcessState::Pending,
        stage: Stage::Forward,
        step_index: 0,
        steps,
        failure_count: 0,
        run: 1,
        locked_by: None,
        complete_by: Some(now.plus_ms(policy.start_timeout_ms)),
        rev: 1,
        reason: None,
        created_at: now,
        updated_at: now,
        history: Vec::new(),
    };
    let ctx = Ctx { now, fresh_token: AttemptToken::from("unused"), jitter: 0.0 };
    let mut c = Change { t: task, fx: Vec::new(), ctx: &ctx, policy };
    c.note(ProcessState::Pending);
    c.fx.push(Effect::Run { rev: c.t.rev, delay_ms: 0, reason: RunReason::Start });
    Transition { task: c.t, effects: c.fx }
}

/// Apply one event. `Err(Stale)` means the event changes nothing.
pub fn apply(task: &Task, event: &Event, ctx: &Ctx, policy: &Policy) -> Result<Transition, Stale> {
    // Terminal states are never left, but for an operator's hand on an Error task.
    let operator_on_error =
        task.process_state == ProcessState::Error && matches!(event, Event::Cancel { .. } | Event::Resubmit { .. });
    if let Event::Resubmit { .. } = event {
        if task.process_state != ProcessState::Error {
            return Err(Stale::NotResubmittable(task.process_state));
        }
    }
    if task.process_state.is_terminal() && !operator_on_error {
        return Err(Stale::Terminal(task.process_state));
    }
    let mut t = task.clone();
    t.rev += 1;
    t.updated_at = ctx.now;
    let mut c = Change { t, fx: Vec::new(), ctx, policy };
    match event {
        Event::Claim { rev } => claim(task, *rev, &mut c)?,
        Event::AgentSucceeded { attempt, output } => agent_succeeded(task, attempt, output, &mut c)?,
        Event::AgentFailed { attempt, error, retryable } => agent_failed(task, attempt, error, *retryable, &mut c)?,
        Event::DeadlineExpired => deadline_expired(task, &mut c)?,
        Event::Cancel { reason } => cancel(task, reason, &mut c)?,
        Event::Resubmit { reason } => resubmit(reason, &mut c),
    }
    Ok(Transition { task: c.t, effects: c.fx })
}

/// The Scheduler claims the current unit, if the run message is for this revision and nothing
/// holds the lock.
fn claim(task: &Task, rev: u64, c: &mut Change) -> Result<(), Stale> {
    if rev != task.rev {
        return Err(Stale::OldRun { message: rev, current: task.rev });
    }
    if task.locked_by.is_some() {
        return Err(Stale::AlreadyClaimed);
    }
    if task.process_state != waiting_state(task.phase()) {
        return Err(Stale::NotClaimable(task.process_state));
    }
    c.start_unit();
    Ok(())
}

/// The current attempt succeeded: record it and move on.
fn agent_succeeded(task: &Task, attempt: &AttemptToken, output: &Value, c: &mut Change) -> Result<(), Stale> {
    check_attempt(task, attempt)?;
    c.t.unit_record().succeeded();
    if c.t.phase() == Phase::Forward {
        let i = c.t.step_index;
        c.t.steps[i].output = Some(output.clone());
        // The step recovered: earlier failures stay in the history and the step records.
        c.t.reason = None;
    }
    c.advance();
    Ok(())
}

/// The current attempt failed: a retryable failure counts and retries, a definite "no" gives the
/// unit up (nothing to undo for it: the service said no).
fn agent_failed(
    task: &Task,
    attempt: &AttemptToken,
    error: &str,
    retryable: bool,
    c: &mut Change,
) -> Result<(), Stale> {
    check_attempt(task, attempt)?;
    if retryable {
        c.attempt_failed(error, false);
        return Ok(());
    }
    c.t.failure_count += 1;
    c.t.unit_record().refused(error);
    let reason = format!("{} {} failed permanently: {error}", noun(c.t.phase()), c.t.current_def().name);
    c.give_up(reason, false);
    Ok(())
}

/// The Supervisor found `CompleteBy` in the past: a lost run message is re-issued, a running
/// attempt has timed out.
fn deadline_expired(task: &Task, c: &mut Change) -> Result<(), Stale> {
    let complete_by = task.complete_by.unwrap_or(Millis(0));
    if complete_by > c.ctx.now {
        return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
    }
    if task.locked_by.is_none() {
        // The run message was lost (or its sender crashed): issue a new one. Not a failure of the
        // unit, and not a state change.
        c.t.complete_by = Some(c.ctx.now.plus_ms(c.policy.start_timeout_ms));
        c.fx.push(Effect::Run { rev: c.t.rev, delay_ms: 0, reason: RunReason::Restart });
    } else {
        let reason = format!(
            "{} {} attempt {} passed CompleteBy {complete_by}",
            noun(c.t.phase()),
            c.t.current_def().name,
            c.t.unit_attempts()
        );
        c.attempt_failed(&reason, true);
    }
    Ok(())
}

/// Operator: stop the task. Completed steps are compensated, and so is the current step when its
/// effect is unknown (running now, or parked after timing out).
fn cancel(task: &Task, reason: &str, c: &mut Change) -> Result<(), Stale> {
    if task.is_compensating() {
        return Err(Stale::AlreadyCompensating);
    }
    let running = task.locked_by.is_some();
    let i = c.t.step_index;
    if running {
        c.t.steps[i].status = StepStatus::Cancelled;
    }
    let uncertain = running || c.t.steps[i].status == StepStatus::TimedOut;
    c.begin_compensation(EndCause::Cancelled, format!("cancelled: {reason}"), uncertain);
    Ok(())
}

/// Operator: an `Error` task resumes at its failed unit, forward or compensating; completed steps
/// are not redone.
fn resubmit(reason: &str, c: &mut Change) {
    c.t.run += 1;
    c.t.reason = Some(format!("resubmitted (run {}): {reason}", c.t.run));
    c.t.locked_by = None;
    c.t.complete_by = Some(c.ctx.now.plus_ms(c.policy.start_timeout_ms));
    c.t.unit_record().reset();
    c.note(waiting_state(c.t.phase()));
    c.fx.push(Effect::Run { rev: c.t.rev, delay_ms: 0, reason: RunReason::Retry });
}

fn check_attempt(task: &Task, attempt: &AttemptToken) -> Result<(), Stale> {
    if task.locked_by.as_ref() == Some(attempt) {
        Ok(())
    } else {
        Err(Stale::NotCurrentAttempt)
    }
}

/// A transition being built: the new task, its effects, and what the shell supplied.
struct Change<'a> {
    t: Task,
    fx: Vec<Effect>,
    ctx: &'a Ctx,
    policy: &'a Policy,
}

impl Change<'_> {
    /// Record a state change in the history and, when the caller named a reply queue, tell it.
    fn note(&mut self, state: ProcessState) {
        let t = &mut self.t;
        t.process_state = state;
        let entry = HistoryEntry {
            seq: t.rev,
            state,
            step: if state.is_terminal() { None } else { Some(t.current_def().name.clone()) },
            failure_count: t.failure_count,
            reason: if state == ProcessState::Processed { None } else { t.reason.clone() },
            at: self.ctx.now,
        };
        if t.reply_to.is_some() {
            self.fx.push(Effect::Reply(entry.status(&t.task_id)));
        }
        t.history.push(entry);
        if t.history.len() > self.policy.history_limit {
            let extra = t.history.len() - self.policy.history_limit;
            t.history.drain(..extra);
        }
    }

    /// What the current unit's agent receives: the task input, the outputs of the steps that
    /// succeeded, and (for a compensation) which step it undoes.
    fn input_for_current(&self) -> Value {
        let t = &self.t;
        let mut outputs = Map::new();
        for s in &t.steps {
            if let (StepStatus::Succeeded, Some(o)) = (s.status, &s.output) {
                outputs.insert(s.name.clone(), o.clone());
            }
        }
        let mut v = json!({ "input": t.input, "outputs": outputs });
        if t.is_compensating() {
            v["compensating"] = Value::String(t.steps[t.unit_step()].name.clone());
        }
        v
    }

    /// Claim the current unit: fresh token, deadline, dispatch and timer.
    fn start_unit(&mut self) {
        let def = self.t.current_def().clone();
        let token = self.ctx.fresh_token.clone();
        let complete_by = self.ctx.now.plus_ms(def.timeout_ms);
        self.t.locked_by = Some(token.clone());
        self.t.complete_by = Some(complete_by);
        let attempt_no = self.t.unit_record().begin_attempt();
        let phase = self.t.phase();
        self.note(running_state(phase));
        let input = self.input_for_current();
        let task_id = self.t.task_id.clone();
        self.fx.push(Effect::Dispatch(AgentRequest {
            v: VERSION,
            idempotency_key: IdempotencyKey::for_step(&task_id, &def.name),
            task_id: task_id.clone(),
            step: def.name.clone(),
            phase,
            agent: def.agent.clone(),
            attempt: token.clone(),
            attempt_no,
            complete_by,
            input,
        }));
        self.fx.push(Effect::ArmTimer(TimerMessage { v: VERSION, task_id, attempt: token, complete_by }));
    }

    /// The current unit is done: start the next one, or end the task.
    fn advance(&mut self) {
        match &mut self.t.stage {
            Stage::Forward if self.t.step_index + 1 < self.t.steps.len() => {
                self.t.step_index += 1;
                self.start_unit();
            }
            Stage::Forward => self.finish(ProcessState::Processed),
            Stage::Compensating { plan, pos, .. } if *pos + 1 < plan.len() => {
                *pos += 1;
                self.start_unit();
            }
            Stage::Compensating { cause, .. } => {
                let end = cause.end_state();
                self.finish(end);
            }
        }
    }

    /// One attempt failed without a definite "no" (timeout or a retryable error): retry after a
    /// backoff, or give up once the unit's attempts are spent.
    fn attempt_failed(&mut self, reason: &str, timed_out: bool) {
        let def = self.t.current_def().clone();
        self.t.failure_count += 1;
        self.t.locked_by = None;
        let failures = self.t.unit_record().attempt_failed(reason);
        if failures < def.max_attempts {
            let delay = def.backoff.delay_ms(failures, self.ctx.jitter);
            self.t.complete_by = Some(self.ctx.now.plus_ms(delay).plus_ms(self.policy.start_timeout_ms));
            self.t.unit_record().await_retry();
            self.t.reason = Some(format!("{reason}; retry {}/{} in {delay} ms", failures + 1, def.max_attempts));
            self.note(waiting_state(self.t.phase()));
            self.fx.push(Effect::Run { rev: self.t.rev, delay_ms: delay, reason: RunReason::Retry });
            return;
        }
        let gave_up = format!("{reason}; all {} attempts used", def.max_attempts);
        self.t.unit_record().exhausted(timed_out);
        match self.t.phase() {
            Phase::Forward => {
                if self.t.workflow.on_failure == OnFailure::Compensate {
                    let alert = self.alert(AlertKind::RetriesExhausted, &gave_up);
                    self.fx.push(Effect::Alert(alert));
                }
                self.give_up(gave_up, timed_out);
            }
            Phase::Compensate => self.give_up(format!("compensation failed: {gave_up}"), timed_out),
        }
    }

    /// The current unit failed for good. A forward step is compensated (with itself when its
    /// effect is `uncertain`), or parks the task in `Error` for an operator, as the workflow says;
    /// a compensation that fails for good leaves the task in `Error`.
    fn give_up(&mut self, reason: String, uncertain: bool) {
        match (self.t.phase(), self.t.workflow.on_failure) {
            (Phase::Forward, OnFailure::Compensate) => self.begin_compensation(EndCause::Failed, reason, uncertain),
            (Phase::Forward, OnFailure::Error) | (Phase::Compensate, _) => {
                self.t.reason = Some(reason);
                self.finish(ProcessState::Error);
            }
        }
    }

    /// Undo, in reverse order, every completed step that has a compensation; with
    /// `include_current`, the current step too (its outcome is unknown: timed out or cancelled
    /// mid-flight; compensations must tolerate having nothing to undo).
    fn begin_compensation(&mut self, cause: EndCause, reason: String, include_current: bool) {
        let t = &self.t;
        let i = t.step_index;
        let has_comp = |j: usize| t.workflow.steps[j].compensation.is_some();
        let mut plan = Vec::new();
        if include_current && has_comp(i) {
            plan.push(i);
        }
        plan.extend((0..i).rev().filter(|&j| t.steps[j].status == StepStatus::Succeeded && has_comp(j)));
        self.t.reason = Some(reason);
        self.t.locked_by = None;
        if plan.is_empty() {
            self.finish(cause.end_state());
            return;
        }
        self.t.stage = Stage::Compensating { plan, pos: 0, cause };
        self.start_unit();
    }

    /// End the task in a terminal state; `Error` alerts an operator.
    fn finish(&mut self, end: ProcessState) {
        debug_assert!(end.is_terminal());
        self.t.locked_by = None;
        self.t.complete_by = None;
        self.note(end);
        if end == ProcessState::Error {
            let reason = self.t.reason.clone().unwrap_or_default();
            let alert = self.alert(AlertKind::TaskError, &reason);
            self.fx.push(Effect::Alert(alert));
        }
    }

    fn alert(&self, kind: AlertKind, reason: &str) -> Alert {
        let t = &self.t;
        Alert {
            v: VERSION,
            kind,
            task_id: t.task_id.clone(),
            workflow: format!("{}@{}", t.workflow.name, t.workflow.version),
            state: t.process_state,
            step: Some(t.current_def().name.clone()),
            failure_count: t.failure_count,
            reason: reason.to_owned(),
            at: self.ctx.now,
        }
    }
}

#[cfg(test)]
#[allow(clippy::needless_pass_by_value, clippy::many_single_char_names)]
mod tests;
