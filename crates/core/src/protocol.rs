//! The Scheduler-Agent-Supervisor protocol as one pure state machine:
//! `(task, event, ctx) -> (task', effects)` or `Stale`. No I/O happens here: the role handlers
//! load the task, call [`apply`], write the new task with a conditional write (the only lock),
//! and only then perform the effects.
//!
//! The story, in the pattern's words:
//! - A submission creates a `Pending` task whose `CompleteBy` is already set, so the Supervisor
//!   starts it even if the start message is lost ([`submit`]).
//! - The Scheduler claims the current step ([`Event::Claim`]): `LockedBy` = a fresh attempt token,
//!   `CompleteBy` = now + the step's timeout, `ProcessState` = `Processing`; it dispatches the step to
//!   its Agent and arms a deadline timer.
//! - The Agent's result ([`Event::AgentSucceeded`], [`Event::AgentFailed`]) is applied only if it
//!   carries the current token; success advances to the next step (claimed in the same write) or
//!   ends `Processed`.
//! - The Supervisor finds steps whose `CompleteBy` has passed ([`Event::DeadlineExpired`]):
//!   `FailureCount` + 1 and a retry after a backoff, or, when the step's attempts are spent, an
//!   operator alert and compensation of the completed steps in reverse order.
//! - Compensation ends `Compensated`; a compensation that fails for good ends `Error` (alert).
//! - [`Event::Cancel`] stops the task: completed steps are compensated, and it ends `Cancelled`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::ids::{AttemptToken, IdempotencyKey, Millis, TaskId};
use crate::messages::{AgentRequest, Alert, AlertKind, Phase, RunReason, StatusMessage, TimerMessage, VERSION};
use crate::workflow::{OnFailure, StepDef, WorkflowDef};

/// The pattern's `ProcessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for the Scheduler to claim the current step (first start or a retry).
    Pending,
    /// A step is with its Agent; `LockedBy` holds the attempt's token.
    Processing,
    /// Every step succeeded.
    Processed,
    /// Completed steps are being undone, in reverse order.
    Compensating,
    /// The task failed and every completed step was undone.
    Compensated,
    /// The task failed and could not be undone: an operator must look.
    Error,
    /// Stopped on request; completed steps were undone.
    Cancelled,
    /// The submission was refused (it never became a task).
    Rejected,
}

impl ProcessState {
    pub const ALL: [ProcessState; 8] = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Compensating,
        ProcessState::Compensated,
        ProcessState::Error,
        ProcessState::Cancelled,
        ProcessState::Rejected,
    ];

    /// Terminal states are never left by the protocol.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ProcessState::Processed
                | ProcessState::Compensated
                | ProcessState::Error
                | ProcessState::Cancelled
                | ProcessState::Rejected
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Pending => "Pending",
            ProcessState::Processing => "Processing",
            ProcessState::Processed => "Processed",
            ProcessState::Compensating => "Compensating",
            ProcessState::Compensated => "Compensated",
            ProcessState::Error => "Error",
            ProcessState::Cancelled => "Cancelled",
            ProcessState::Rejected => "Rejected",
        }
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown ProcessState {0:?}; one of Pending, Processing, Processed, Compensating, Compensated, Error, Cancelled, Rejected")]
pub struct UnknownState(pub String);

impl FromStr for ProcessState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        ProcessState::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// The state of one forward step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Running,
    Succeeded,
    /// Failed for good with a definite answer: no effect to undo.
    Failed,
    /// The last attempt ran out of time: its effect is unknown, so it is compensated.
    TimedOut,
    /// Cancelled while running: its effect is unknown, so it is compensated.
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationStatus {
    Pending,
    Running,
    Done,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompensationRecord {
    pub name: String,
    pub status: CompensationStatus,
    pub attempts: u32,
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub name: String,
    pub status: StepStatus,
    pub attempts: u32,
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<CompensationRecord>,
}

/// Why compensation runs, which decides the state it ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    Failed,
    Cancelled,
}

/// Where the task is: running its steps forward, or undoing them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stage {
    Forward,
    /// `plan` lists the step indexes to undo, in the order they are undone; `pos` is the one now.
    Compensating {
        plan: Vec<usize>,
        pos: usize,
        cause: EndCause,
    },
}

/// One entry of the status history; each is also sent to `reply_to` as a [`StatusMessage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub seq: u64,
    pub state: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub failure_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at: Millis,
}

/// A task as the state store keeps it. Field names are the pattern's, as DynamoDB attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Task {
    pub task_id: TaskId,
    /// The definition pinned at submission.
    pub workflow: WorkflowDef,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    pub process_state: ProcessState,
    pub stage: Stage,
    /// Index of the current forward step.
    pub step_index: usize,
    pub steps: Vec<StepRecord>,
    /// Failures of all steps together; it never decreases.
    pub failure_count: u32,
    /// 1, then +1 for each operator resubmit.
    #[serde(default = "first_run")]
    pub run: u32,
    /// The current attempt's fencing token; absent while no attempt is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_by: Option<AttemptToken>,
    /// The deadline of whatever the task waits for; present exactly while not terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<Millis>,
    /// Bumped by every transition; every write is conditional on the value read.
    pub rev: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
}

fn first_run() -> u32 {
    1
}

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

impl Ctx {
    pub fn new(now: Millis) -> Self {
        Ctx { now, fresh_token: AttemptToken::fresh(), jitter: rand::random::<f64>() }
    }
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
    let steps = workflow
        .steps
        .iter()
        .map(|s| StepRecord {
            name: s.name.clone(),
            status: StepStatus::Pending,
            attempts: 0,
            failures: 0,
            output: None,
            error: None,
            compensation: None,
        })
        .collect();
    let mut task = Task {
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
    let mut effects = Vec::new();
    task.note(ProcessState::Pending, now, policy, &mut effects);
    effects.push(Effect::Run { rev: task.rev, delay_ms: 0, reason: RunReason::Start });
    Transition { task, effects }
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
    let mut fx = Vec::new();
    match event {
        Event::Claim { rev } => {
            if *rev != task.rev {
                return Err(Stale::OldRun { message: *rev, current: task.rev });
            }
            if task.locked_by.is_some() {
                return Err(Stale::AlreadyClaimed);
            }
            let claimable = match task.stage {
                Stage::Forward => task.process_state == ProcessState::Pending,
                Stage::Compensating { .. } => task.process_state == ProcessState::Compensating,
            };
            if !claimable {
                return Err(Stale::NotClaimable(task.process_state));
            }
            t.start_unit(ctx, policy, &mut fx);
        }
        Event::AgentSucceeded { attempt, output } => {
            task.check_attempt(attempt)?;
            match t.stage.clone() {
                Stage::Forward => {
                    let i = t.step_index;
                    let s = &mut t.steps[i];
                    s.status = StepStatus::Succeeded;
                    s.output = Some(output.clone());
                    s.error = None;
                    // The step recovered: earlier failures stay in the history and the step records.
                    t.reason = None;
                    if i + 1 < t.steps.len() {
                        t.step_index = i + 1;
                        t.start_unit(ctx, policy, &mut fx);
                    } else {
                        t.finish(ProcessState::Processed, ctx.now, policy, &mut fx);
                    }
                }
                Stage::Compensating { plan, pos, cause } => {
                    if let Some(c) = t.steps[plan[pos]].compensation.as_mut() {
                        c.status = CompensationStatus::Done;
                        c.error = None;
                    }
                    if pos + 1 < plan.len() {
                        t.stage = Stage::Compensating { plan, pos: pos + 1, cause };
                        t.start_unit(ctx, policy, &mut fx);
                    } else {
                        let end = match cause {
                            EndCause::Failed => ProcessState::Compensated,
                            EndCause::Cancelled => ProcessState::Cancelled,
                        };
                        t.finish(end, ctx.now, policy, &mut fx);
                    }
                }
            }
        }
        Event::AgentFailed { attempt, error, retryable } => {
            task.check_attempt(attempt)?;
            if *retryable {
                t.attempt_failed(error, false, ctx, policy, &mut fx);
            } else {
                t.failure_count += 1;
                let name = t.current_def().name.clone();
                match t.stage.clone() {
                    Stage::Forward => {
                        let s = &mut t.steps[t.step_index];
                        s.status = StepStatus::Failed;
                        s.failures += 1;
                        s.error = Some(error.clone());
                        let reason = format!("step {name} failed permanently: {error}");
                        t.step_failed_for_good(reason, false, ctx, policy, &mut fx);
                    }
                    Stage::Compensating { plan, pos, .. } => {
                        if let Some(c) = t.steps[plan[pos]].compensation.as_mut() {
                            c.status = CompensationStatus::Failed;
                            c.failures += 1;
                            c.error = Some(error.clone());
                        }
                        t.reason = Some(format!("compensation {name} failed permanently: {error}"));
                        t.finish(ProcessState::Error, ctx.now, policy, &mut fx);
                    }
                }
            }
        }
        Event::DeadlineExpired => {
            let complete_by = task.complete_by.unwrap_or(Millis(0));
            if complete_by > ctx.now {
                return Err(Stale::NotExpired { complete_by, now: ctx.now });
            }
            if task.locked_by.is_none() {
                // The run message was lost (or its sender crashed): issue a new one. Not a
                // failure of the step, and not a state change.
                t.complete_by = Some(ctx.now.plus_ms(policy.start_timeout_ms));
                fx.push(Effect::Run { rev: t.rev, delay_ms: 0, reason: RunReason::Restart });
            } else {
                let def = t.current_def();
                let attempt_no = t.unit_attempts();
                let reason = format!(
                    "{} {} attempt {attempt_no} passed CompleteBy {complete_by}",
                    if t.is_compensating() { "compensation" } else { "step" },
                    def.name
                );
                t.attempt_failed(&reason, true, ctx, policy, &mut fx);
            }
        }
        Event::Cancel { reason } => {
            if matches!(task.stage, Stage::Compensating { .. }) {
                return Err(Stale::AlreadyCompensating);
            }
            let running = task.locked_by.is_some();
            if running {
                t.steps[t.step_index].status = StepStatus::Cancelled;
            }
            // A step whose effect is unknown (running now, or parked after timing out) is undone too.
            let uncertain = running || t.steps[t.step_index].status == StepStatus::TimedOut;
            t.begin_compensation(EndCause::Cancelled, format!("cancelled: {reason}"), uncertain, ctx, policy, &mut fx);
        }
        Event::Resubmit { reason } => {
            t.run += 1;
            t.reason = Some(format!("resubmitted (run {}): {reason}", t.run));
            t.locked_by = None;
            t.complete_by = Some(ctx.now.plus_ms(policy.start_timeout_ms));
            let state = match t.stage.clone() {
                Stage::Forward => {
                    let s = &mut t.steps[t.step_index];
                    s.status = StepStatus::Pending;
                    s.failures = 0;
                    ProcessState::Pending
                }
                Stage::Compensating { plan, pos, .. } => {
                    if let Some(c) = t.steps[plan[pos]].compensation.as_mut() {
                        c.status = CompensationStatus::Pending;
                        c.failures = 0;
                    }
                    ProcessState::Compensating
                }
            };
            t.note(state, ctx.now, policy, &mut fx);
            fx.push(Effect::Run { rev: t.rev, delay_ms: 0, reason: RunReason::Retry });
        }
    }
    Ok(Transition { task: t, effects: fx })
}

impl Task {
    pub fn is_compensating(&self) -> bool {
        matches!(self.stage, Stage::Compensating { .. })
    }

    /// The definition of the unit of work the task is on: a forward step or a compensation.
    pub fn current_def(&self) -> &StepDef {
        match &self.stage {
            Stage::Forward => &self.workflow.steps[self.step_index],
            Stage::Compensating { plan, pos, .. } => self.workflow.steps[plan[*pos]]
                .compensation
                .as_deref()
                .expect("compensation plans only name steps that have a compensation"),
        }
    }

    /// The name of the current unit (for status messages and the `CurrentStep` attribute).
    pub fn current_step_name(&self) -> Option<&str> {
        if self.process_state.is_terminal() {
            return None;
        }
        Some(self.current_def().name.as_str())
    }

    fn unit_attempts(&self) -> u32 {
        match &self.stage {
            Stage::Forward => self.steps[self.step_index].attempts,
            Stage::Compensating { plan, pos, .. } => {
                self.steps[plan[*pos]].compensation.as_ref().map_or(0, |c| c.attempts)
            }
        }
    }

    fn check_attempt(&self, attempt: &AttemptToken) -> Result<(), Stale> {
        if self.locked_by.as_ref() == Some(attempt) {
            Ok(())
        } else {
            Err(Stale::NotCurrentAttempt)
        }
    }

    /// Record a state change in the history and, when the caller named a reply queue, tell it.
    fn note(&mut self, state: ProcessState, now: Millis, policy: &Policy, fx: &mut Vec<Effect>) {
        self.process_state = state;
        let entry = HistoryEntry {
            seq: self.rev,
            state,
            step: if state.is_terminal() { None } else { Some(self.current_def().name.clone()) },
            failure_count: self.failure_count,
            reason: if state == ProcessState::Processed { None } else { self.reason.clone() },
            at: now,
        };
        if self.reply_to.is_some() {
            fx.push(Effect::Reply(StatusMessage::new(&self.task_id, &entry)));
        }
        self.history.push(entry);
        if self.history.len() > policy.history_limit {
            let extra = self.history.len() - policy.history_limit;
            self.history.drain(..extra);
        }
    }

    fn input_for_current(&self) -> Value {
        let mut outputs = Map::new();
        for s in &self.steps {
            if let (StepStatus::Succeeded, Some(o)) = (s.status, &s.output) {
                outputs.insert(s.name.clone(), o.clone());
            }
        }
        let mut v = json!({ "input": self.input, "outputs": outputs });
        if let Stage::Compensating { plan, pos, .. } = &self.stage {
            v["compensating"] = Value::String(self.steps[plan[*pos]].name.clone());
        }
        v
    }

    /// Claim the current unit: fresh token, deadline, dispatch and timer.
    fn start_unit(&mut self, ctx: &Ctx, policy: &Policy, fx: &mut Vec<Effect>) {
        let def = self.current_def().clone();
        let complete_by = ctx.now.plus_ms(def.timeout_ms);
        self.locked_by = Some(ctx.fresh_token.clone());
        self.complete_by = Some(complete_by);
        let (state, phase, attempt_no) = match self.stage.clone() {
            Stage::Forward => {
                let s = &mut self.steps[self.step_index];
                s.status = StepStatus::Running;
                s.attempts += 1;
                (ProcessState::Processing, Phase::Forward, s.attempts)
            }
            Stage::Compensating { plan, pos, .. } => {
                let c = self.steps[plan[pos]].compensation.get_or_insert_with(|| CompensationRecord {
                    name: def.name.clone(),
                    status: CompensationStatus::Pending,
                    attempts: 0,
                    failures: 0,
                    error: None,
                });
                c.status = CompensationStatus::Running;
                c.attempts += 1;
                (ProcessState::Compensating, Phase::Compensate, c.attempts)
            }
        };
        self.note(state, ctx.now, policy, fx);
        fx.push(Effect::Dispatch(AgentRequest {
            v: VERSION,
            task_id: self.task_id.clone(),
            step: def.name.clone(),
            phase,
            agent: def.agent.clone(),
            attempt: ctx.fresh_token.clone(),
            attempt_no,
            complete_by,
            idempotency_key: IdempotencyKey::for_step(&self.task_id, &def.name),
            input: self.input_for_current(),
        }));
        fx.push(Effect::ArmTimer(TimerMessage {
            v: VERSION,
            task_id: self.task_id.clone(),
            attempt: ctx.fresh_token.clone(),
            complete_by,
        }));
    }

    /// One attempt failed without a definite "no" (timeout or a retryable error): retry after a
    /// backoff, or give up once the unit's attempts are spent.
    fn attempt_failed(&mut self, reason: &str, timed_out: bool, ctx: &Ctx, policy: &Policy, fx: &mut Vec<Effect>) {
        let def = self.current_def().clone();
        self.failure_count += 1;
        self.locked_by = None;
        let failures = match self.stage.clone() {
            Stage::Forward => {
                let s = &mut self.steps[self.step_index];
                s.failures += 1;
                s.error = Some(reason.to_owned());
                s.failures
            }
            Stage::Compensating { plan, pos, .. } => {
                let c = self.steps[plan[pos]].compensation.as_mut().expect("running compensation has a record");
                c.failures += 1;
                c.error = Some(reason.to_owned());
                c.failures
            }
        };
        if failures < def.max_attempts {
            let delay = def.backoff.delay_ms(failures, ctx.jitter);
            self.complete_by = Some(ctx.now.plus_ms(delay).plus_ms(policy.start_timeout_ms));
            let state = match self.stage {
                Stage::Forward => {
                    self.steps[self.step_index].status = StepStatus::Pending;
                    ProcessState::Pending
                }
                Stage::Compensating { ref plan, pos, .. } => {
                    if let Some(c) = self.steps[plan[pos]].compensation.as_mut() {
                        c.status = CompensationStatus::Pending;
                    }
                    ProcessState::Compensating
                }
            };
            self.reason = Some(format!("{reason}; retry {}/{} in {delay} ms", failures + 1, def.max_attempts));
            self.note(state, ctx.now, policy, fx);
            fx.push(Effect::Run { rev: self.rev, delay_ms: delay, reason: RunReason::Retry });
            return;
        }
        let gave_up = format!("{reason}; all {} attempts used", def.max_attempts);
        match self.stage.clone() {
            Stage::Forward => {
                self.steps[self.step_index].status = if timed_out { StepStatus::TimedOut } else { StepStatus::Failed };
                self.reason = Some(gave_up.clone());
                if self.workflow.on_failure == OnFailure::Compensate {
                    fx.push(Effect::Alert(self.alert(AlertKind::RetriesExhausted, &gave_up, ctx.now)));
                }
                self.step_failed_for_good(gave_up, timed_out, ctx, policy, fx);
            }
            Stage::Compensating { plan, pos, .. } => {
                if let Some(c) = self.steps[plan[pos]].compensation.as_mut() {
                    c.status = CompensationStatus::Failed;
                }
                self.reason = Some(format!("compensation failed: {gave_up}"));
                self.finish(ProcessState::Error, ctx.now, policy, fx);
            }
        }
    }

    /// A forward step failed for good: compensate, or park in `Error` for an operator, as the
    /// workflow says.
    fn step_failed_for_good(
        &mut self,
        reason: String,
        uncertain: bool,
        ctx: &Ctx,
        policy: &Policy,
        fx: &mut Vec<Effect>,
    ) {
        match self.workflow.on_failure {
            OnFailure::Compensate => self.begin_compensation(EndCause::Failed, reason, uncertain, ctx, policy, fx),
            OnFailure::Error => {
                self.reason = Some(reason);
                self.finish(ProcessState::Error, ctx.now, policy, fx);
            }
        }
    }

    /// Undo, in reverse order, every completed step that has a compensation; with
    /// `include_current`, the current step too (its outcome is unknown: timed out or cancelled
    /// mid-flight; compensations must tolerate having nothing to undo).
    fn begin_compensation(
        &mut self,
        cause: EndCause,
        reason: String,
        include_current: bool,
        ctx: &Ctx,
        policy: &Policy,
        fx: &mut Vec<Effect>,
    ) {
        let i = self.step_index;
        let has_comp = |j: usize| self.workflow.steps[j].compensation.is_some();
        let mut plan = Vec::new();
        if include_current && has_comp(i) {
            plan.push(i);
        }
        plan.extend((0..i).rev().filter(|&j| self.steps[j].status == StepStatus::Succeeded && has_comp(j)));
        self.reason = Some(reason);
        self.locked_by = None;
        if plan.is_empty() {
            let end = match cause {
                EndCause::Failed => ProcessState::Compensated,
                EndCause::Cancelled => ProcessState::Cancelled,
            };
            self.finish(end, ctx.now, policy, fx);
            return;
        }
        self.stage = Stage::Compensating { plan, pos: 0, cause };
        self.start_unit(ctx, policy, fx);
    }

    fn finish(&mut self, end: ProcessState, now: Millis, policy: &Policy, fx: &mut Vec<Effect>) {
        debug_assert!(end.is_terminal());
        self.locked_by = None;
        self.complete_by = None;
        self.note(end, now, policy, fx);
        if end == ProcessState::Error {
            let reason = self.reason.clone().unwrap_or_default();
            fx.push(Effect::Alert(self.alert(AlertKind::TaskError, &reason, now)));
        }
    }

    fn alert(&self, kind: AlertKind, reason: &str, now: Millis) -> Alert {
        Alert {
            v: VERSION,
            kind,
            task_id: self.task_id.clone(),
            workflow: format!("{}@{}", self.workflow.name, self.workflow.version),
            state: self.process_state,
            step: Some(self.current_def().name.clone()),
            failure_count: self.failure_count,
            reason: reason.to_owned(),
            at: now,
        }
    }
}

#[cfg(test)]
mod tests;
