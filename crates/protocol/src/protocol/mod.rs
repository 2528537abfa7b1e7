//! The Scheduler-Agent-Supervisor protocol as one pure state machine:
//! `(task, event, ctx) -> (task', effects)` or `Stale`. No I/O happens here: the role handlers
//! load the task, call [`apply`], write the new task with a conditional write (the only lock),
//! and only then perform the effects.
//!
//! The story, in the pattern's words, one function per event:
//! - [`submit`]: a submission creates the task with its first step claimed (one write), so
//!   the Supervisor recovers it like any attempt if its dispatch is lost.
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
//! - A **map step** runs once per element of an array, each element a task of its own; the
//!   parent counts their ends ([`Event::ElementEnded`]), joins their outputs ([`Event::Joined`])
//!   and, compensating, undoes the ones that succeeded ([`Event::Undo`]). See `map`.
//!
//! A **unit of work** is a forward step or the compensation of one (see [`task`]); every rule
//! about attempts, retries and giving up is written once for both.

use serde_json::Value;

use crate::ids::{AttemptToken, CallbackToken, IdempotencyKey, Millis, TaskId};
use crate::messages::{
    AgentRequest, AgentResult, Alert, AlertKind, CallbackAnswer, CallbackRef, CancelMessage, Outcome, Phase, RunReason,
    SchedulerMessage, StatusMessage, TimerMessage, VERSION,
};
use crate::workflow::{FailureKind, OnFailure, StepDef, StepKind, WaitTime, WorkflowDef, MAX_LONG_STEP_MS};

pub mod table;
pub mod task;

pub use crate::state::{ProcessState, UnknownState};
pub use table::TRANSITIONS;
use task::{noun, running_state, waiting_state};
pub use task::{
    Bits, ClaimWait, CompensationRecord, CompensationStatus, EndCause, HistoryEntry, LateResults, Lock, MapProgress,
    Stage, StepRecord, StepStatus, Task, UndeliveredReplies,
};

/// Tunables of the protocol that are not per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// How long a waiting task may wait for its run message before the Supervisor restarts it
    /// (doubled at each restart in a row).
    pub start_timeout_ms: u64,
    /// History entries kept on the task item (the oldest are dropped).
    pub history_limit: usize,
    /// How long an agent request may wait in the agent queue before it starts (schedule-to-start),
    /// unless the step sets its own. Not taken from the step's `timeout_ms` (start-to-close).
    pub queue_budget_ms: u64,
    /// How long past `CompleteBy` the Supervisor waits before it declares an attempt lost, so a
    /// result produced in time but delayed in the scheduler queue still counts.
    pub result_grace_ms: u64,
    /// Margin after a forward attempt's `CompleteBy` before its compensation may start (clock
    /// skew between agents, services and the Scheduler).
    pub settle_ms: u64,
    /// How long after its claim an agent may start a call without reading the task's `LockedBy`
    /// ([`AgentRequest::unchecked_until`]); a request that arrives later is read first. Every
    /// compensation of a call step allows for a call that starts this late (see
    /// `Change::settled_at`). 0: the agent always reads.
    pub unchecked_start_ms: u64,
    /// Restarts in a row (run messages lost or never claimed) before the task ends in `Error`.
    pub max_restarts: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            start_timeout_ms: 30_000,
            history_limit: 50,
            queue_budget_ms: 300_000,
            result_grace_ms: 10_000,
            settle_ms: 2_000,
            unchecked_start_ms: 2_000,
            max_restarts: 8,
        }
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
    /// A context at `now` with a fresh random token and a mid jitter (fixtures, tools).
    pub fn at(now: Millis) -> Self {
        Ctx { now, fresh_token: AttemptToken::fresh(), jitter: 0.5 }
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
    /// The agent's attempt ran out of its execution time before `CompleteBy` (it says so at
    /// once, instead of leaving the Supervisor to find out at `CompleteBy`).
    AgentTimedOut {
        attempt: AttemptToken,
        error: String,
    },
    /// The agent did not start this copy of the attempt: it waited past its `start_by` (in the
    /// queue, or for a slot of its agent). Not a failure: the unit is claimed again.
    AgentNotStarted {
        attempt: AttemptToken,
        error: String,
    },
    /// The Supervisor found `CompleteBy` in the past.
    DeadlineExpired,
    /// Stop the task: an application's or an operator's. `run`: the run the sender saw; a
    /// command for another run changes nothing, and on an `Error` task (in an operator's hands)
    /// only a command that names its run acts, so a late or duplicate command never resumes a
    /// compensation a second time.
    Cancel {
        reason: String,
        run: Option<u32>,
    },
    /// Operator: an `Error` task resumes from its failed step; completed steps are not redone.
    /// Fenced by `run` like a cancel.
    Resubmit {
        reason: String,
        run: Option<u32>,
    },
    /// The remote side of a callback unit answered with the token of `attempt`, issued for the
    /// unit named `unit`.
    Callback {
        attempt: AttemptToken,
        unit: String,
        answer: CallbackAnswer,
    },
    /// Element `element` of the map step at index `step` ended in `state`.
    ElementEnded {
        step: usize,
        element: u32,
        state: ProcessState,
        /// Why it ended so (its own reason), when it did not succeed.
        reason: Option<String>,
        /// A branch that succeeded: its step's output.
        output: Option<Value>,
    },
    /// A map element that ended `Processed` is undone (its parent compensates the map).
    Undo {
        reason: String,
    },
    /// Every element of the map step at `step` ended; `output` is their outputs in order.
    Joined {
        step: usize,
        output: Value,
    },
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::Claim { .. } => "claim",
            Event::AgentSucceeded { .. } => "agent_succeeded",
            Event::AgentFailed { .. } => "agent_failed",
            Event::AgentTimedOut { .. } => "agent_timed_out",
            Event::AgentNotStarted { .. } => "agent_not_started",
            Event::DeadlineExpired => "deadline_expired",
            Event::Cancel { .. } => "cancel",
            Event::Resubmit { .. } => "resubmit",
            Event::Callback { answer: CallbackAnswer::Succeeded { .. }, .. } => "callback_succeeded",
            Event::Callback { answer: CallbackAnswer::Failed { .. }, .. } => "callback_failed",
            Event::Callback { answer: CallbackAnswer::Heartbeat { .. }, .. } => "callback_heartbeat",
            Event::ElementEnded { .. } => "element_ended",
            Event::Undo { .. } => "undo",
            Event::Joined { .. } => "joined",
        }
    }

    /// The run an operator's command was meant for, if it names one.
    fn run(&self) -> Option<u32> {
        match self {
            Event::Cancel { run, .. } | Event::Resubmit { run, .. } => *run,
            _ => None,
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
    /// Create these elements of the map step at `step` (index, item), each a task of its own
    /// claimed at once ([`element_task`]); one that exists already sends again what it owes.
    Spawn {
        step: usize,
        elements: Vec<(u32, Value)>,
        /// The map is stopping: an element that does not exist is created ended (`Cancelled`,
        /// never run: a spawn that was lost can no longer start it), one that exists is
        /// cancelled, with this reason.
        cancel: Option<String>,
    },
    /// A message to the scheduler queue: a map element's end to its parent, a parent's cancel or
    /// undo to an element, a join.
    Send(SchedulerMessage),
}

impl Effect {
    pub fn name(&self) -> &'static str {
        match self {
            Effect::Reply(_) => "reply",
            Effect::Alert(_) => "alert",
            Effect::Run { .. } => "run",
            Effect::Dispatch(_) => "dispatch",
            Effect::ArmTimer(_) => "timer",
            Effect::Spawn { .. } => "spawn",
            Effect::Send(_) => "send",
        }
    }

    /// Notifications go before work.
    pub fn is_notification(&self) -> bool {
        matches!(self, Effect::Reply(_) | Effect::Alert(_))
    }

    /// Must reach its destination at least once: an operator alert, or a terminal status. If its
    /// send fails, the handler fails, so its message comes back and the notice is sent again.
    pub fn is_essential(&self) -> bool {
        match self {
            Effect::Alert(_) | Effect::Send(SchedulerMessage::ElementEnded(_)) => true,
            Effect::Reply(s) => s.state.is_terminal(),
            _ => false,
        }
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
    #[error("the task may not be claimed before {not_before} (now {now})")]
    TooEarly { not_before: Millis, now: Millis },
    #[error("the command was for run {message}, the task is on run {current}")]
    OtherRun { message: u32, current: u32 },
    #[error("the task is in Error, in an operator's hands: a command on it must name its run ({current})")]
    Unfenced { current: u32 },
    #[error("this answer was applied before")]
    Duplicate,
    #[error("the task was cancelled while this attempt ran: stop")]
    CancelRequested,
    #[error(
        "the heartbeat is taken; the deadline stays {complete_by} (it moves once half the heartbeat window is used)"
    )]
    HeartbeatNotDue { complete_by: Millis },
    #[error("this late result was recorded before")]
    LateAgain,
    /// A callback answer whose token no attempt of its unit was given: forged, mistyped, or from
    /// another stack (or older than the unit's last [`task::MAX_ISSUED`] tokens).
    #[error(
        "no attempt of {unit} was given this token (a forged or mistyped token, one of another stack, or one older than the \
         step's last {max} attempts); nothing changed",
        max = task::MAX_ISSUED
    )]
    NeverIssued { unit: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub task: Task,
    pub effects: Vec<Effect>,
    /// A bookkeeping write (a heartbeat's deadline, a late result) that owes no work: it keeps
    /// the task's `LastMessage`, so the message that sent the current work still finds it owed.
    pub keeps_mark: bool,
}

/// Create the task for an accepted submission with its first step already claimed, in the one
/// write that records it: `Processing`, `LockedBy` = a fresh attempt token, `CompleteBy` = the
/// attempt's deadline; its effects dispatch the step and arm the deadline timer. A task that
/// waited in the table for a separate claim would cost a second write, a run message and a
/// Scheduler invocation for nothing. If the submitter dies before its sends, the submission comes
/// back and [`resend_start`] sends them again; the Supervisor is the backstop either way.
pub fn submit(
    task_id: TaskId,
    workflow: WorkflowDef,
    input: Value,
    reply_to: Option<String>,
    ctx: &Ctx,
    policy: &Policy,
) -> Transition {
    let task = new_task(task_id, workflow, input, reply_to, ctx);
    let mut c = Change { t: task, fx: Vec::new(), ctx, policy };
    c.enter();
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}

/// A task as it is before its first transition.
fn new_task(task_id: TaskId, workflow: WorkflowDef, input: Value, reply_to: Option<String>, ctx: &Ctx) -> Task {
    let steps = workflow.steps.iter().map(|s| StepRecord::new(&s.name)).collect();
    Task {
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
        lock: Lock::default(),
        complete_by: None,
        claim: ClaimWait { rev: 1, not_before: None, restarts: 0 },
        rev: 1,
        reason: None,
        created_at: ctx.now,
        updated_at: ctx.now,
        history: Vec::new(),
        status_seq: 0,
        last_message: None,
        undelivered: UndeliveredReplies::default(),
        late: LateResults::default(),
        upstream: None,
        called: false,
    }
}

/// What the last write of a task owes the world, derived from the task alone: for the message
/// that made that write, delivered again (its handler may have died after the write, or its sends
/// failed) or handled twice at once (an SQS duplicate whose twin may yet fail its sends). A task
/// that ended owes its terminal notices; a running attempt its dispatch (the same request: same
/// attempt, same key, same deadlines) and its deadline timer; a task waiting for a claim its run
/// message (delayed until it may claim). Replies for states before the last are not repeated:
/// only the terminal status is owed at least once. Agent requests are idempotent per key and
/// fenced per attempt, so a second copy of one applies nothing twice.
pub fn owed_sends(task: &Task, now: Millis, policy: &Policy) -> Vec<Effect> {
    if task.process_state.is_terminal() {
        terminal_notices(task)
    } else {
        owed_work(task, now, policy)
    }
}

/// The sends a task's last write owes, for the message that made it (see [`owed_sends`]), and
/// the task to write first when they copy a running forward attempt: the first copy may have gone
/// out, so the attempt may now run twice, and one copy may apply while the other is refused; the
/// step is marked *may have applied* (a refusal then still compensates it). That write is made
/// once (the mark stays); later copies need none.
pub fn resend(task: &Task, now: Millis, policy: &Policy) -> Transition {
    let effects = owed_sends(task, now, policy);
    let mut t = task.clone();
    let i = t.step_index;
    let copies = effects.iter().any(|e| matches!(e, Effect::Dispatch(_)));
    if copies && t.phase() == Phase::Forward && !t.steps[i].maybe_applied {
        t.rev += 1;
        t.updated_at = now.max(t.updated_at);
        t.steps[i].maybe_applied = true;
    }
    Transition { task: t, effects, keeps_mark: false }
}

/// The work a non-terminal task's last write sent (see [`owed_sends`]).
fn owed_work(task: &Task, now: Millis, policy: &Policy) -> Vec<Effect> {
    let Some(complete_by) = task.complete_by else { return Vec::new() };
    if map::map_running(task) {
        return map::owed(task);
    }
    match &task.lock.locked_by {
        Some(token) => {
            let def = task.current_def();
            let timer = Effect::ArmTimer(TimerMessage {
                v: VERSION,
                task_id: task.task_id.clone(),
                attempt: Some(token.clone()),
                complete_by,
            });
            if !def.kind.uses_agent() {
                return vec![timer];
            }
            let budget = def.schedule_to_start_ms.unwrap_or(policy.queue_budget_ms);
            let hard = task.lock.hard_by.unwrap_or(complete_by);
            let start_by = Millis(hard.0.saturating_sub(def.timeout_ms));
            vec![
                // a copy sent again is read before it starts (its claim is not this instant)
                Effect::Dispatch(attempt_request(
                    task,
                    token,
                    task.unit_attempts(),
                    (budget > 0).then_some(start_by),
                    None,
                )),
                timer,
            ]
        }
        None if task.process_state == waiting_state(task.phase()) => {
            let due = task.claim.not_before.unwrap_or(now);
            vec![Effect::Run { rev: task.claim.rev, delay_ms: now.until(due), reason: RunReason::Retry }]
        }
        None => Vec::new(),
    }
}

/// The request for the current unit's attempt `token`, as the task records it.
fn attempt_request(
    task: &Task,
    token: &AttemptToken,
    attempt_no: u32,
    start_by: Option<Millis>,
    unchecked_until: Option<Millis>,
) -> AgentRequest {
    let def = task.current_def();
    AgentRequest {
        v: VERSION,
        idempotency_key: IdempotencyKey::for_unit(&task.task_id, &def.name, task.unit_key_gen()),
        task_id: task.task_id.clone(),
        step: def.name.clone(),
        phase: task.phase(),
        agent: def.agent().expect("only an agent's kind has a request").to_owned(),
        attempt: token.clone(),
        attempt_no,
        start_by,
        complete_by: task.lock.hard_by.or(task.complete_by).expect("a running attempt has a CompleteBy"),
        input: task.unit_request(),
        callback: def.kind.answers_by_token().then(|| CallbackRef {
            token: CallbackToken::new(&task.task_id, &def.name, token),
            heartbeat_ms: def.kind.heartbeat_ms(),
        }),
        waits: 0,
        waiting_since: None,
        unchecked_until,
    }
}

/// Apply one event. `Err(Stale)` means the event changes nothing.
pub fn apply(task: &Task, event: &Event, ctx: &Ctx, policy: &Policy) -> Result<Transition, Stale> {
    if !matches!(event, Event::Callback { .. }) {
        admit(task, event)?;
    }
    let mut t = task.clone();
    t.rev += 1;
    t.updated_at = ctx.now;
    let mut c = Change { t, fx: Vec::new(), ctx, policy };
    match event {
        // a callback answer is fenced by its token alone (a late answer is recorded on an ended task)
        Event::Callback { attempt, unit, answer } => return callback(task, attempt, unit, answer, ctx, policy),
        Event::Claim { rev } => claim(task, *rev, &mut c)?,
        Event::AgentSucceeded { attempt, output } => agent_succeeded(task, attempt, output, &mut c)?,
        Event::AgentFailed { attempt, error, retryable } => agent_failed(task, attempt, error, *retryable, &mut c)?,
        Event::AgentTimedOut { attempt, error } => agent_timed_out(task, attempt, error, &mut c)?,
        Event::AgentNotStarted { attempt, error } => agent_not_started(task, attempt, error, &mut c)?,
        Event::DeadlineExpired => deadline_expired(task, &mut c)?,
        Event::Cancel { reason, .. } => cancel(task, reason, &mut c)?,
        Event::Resubmit { reason, .. } => resubmit(reason, &mut c),
        Event::ElementEnded { step, element, state, reason, output } => {
            map::element_ended(task, *step, *element, *state, reason.as_deref(), output.as_ref(), &mut c)?;
        }
        Event::Undo { reason } => map::undo(task, reason, &mut c)?,
        Event::Joined { step, output } => map::joined(task, *step, output, &mut c)?,
    }
    Ok(Transition { task: c.t, effects: c.fx, keeps_mark: false })
}

/// Whether an event other than a callback answer may be applied to the task at all: an
/// operator's command for another run, a resubmit of a task not in `Error`, an unfenced command
/// on an `Error` task, and anything but an operator's fenced command (or a parent's undo) on an
/// ended task are stale.
fn admit(task: &Task, event: &Event) -> Result<(), Stale> {
    if let Some(run) = event.run().filter(|r| *r != task.run) {
        return Err(Stale::OtherRun { message: run, current: task.run });
    }
    if let Event::Resubmit { .. } = event {
        if task.process_state != ProcessState::Error {
            return Err(Stale::NotResubmittable(task.process_state));
        }
    }
    // Terminal states are never left, but for an operator's fenced hand on an Error task.
    let command = matches!(event, Event::Cancel { .. } | Event::Resubmit { .. });
    if task.process_state == ProcessState::Error && command && event.run().is_none() {
        return Err(Stale::Unfenced { current: task.run });
    }
    let undo = matches!(event, Event::Undo { .. })
        && matches!(task.process_state, ProcessState::Processed | ProcessState::Error);
    if task.process_state.is_terminal() && !(task.process_state == ProcessState::Error && command) && !undo {
        return Err(Stale::Terminal(task.process_state));
    }
    Ok(())
}

/// The Scheduler claims the current unit, if the run message is for the wait the task is in,
/// nothing holds the lock and the task may start now.
fn claim(task: &Task, rev: u64, c: &mut Change) -> Result<(), Stale> {
    if rev != task.claim.rev {
        return Err(Stale::OldRun { message: rev, current: task.claim.rev });
    }
    if task.lock.locked_by.is_some() || map::map_running(task) {
        return Err(Stale::AlreadyClaimed);
    }
    if task.process_state != waiting_state(task.phase()) {
        return Err(Stale::NotClaimable(task.process_state));
    }
    if let Some(not_before) = task.claim.not_before.filter(|nb| *nb > c.ctx.now) {
        return Err(Stale::TooEarly { not_before, now: c.ctx.now });
    }
    c.start_unit();
    Ok(())
}

/// An attempt succeeded: the current one, or an earlier attempt of the same unit that timed out
/// but had answered in time (its effect and the retry's share one idempotency key). A compensation
/// waiting for its forward attempt may start as soon as that attempt has answered.
fn agent_succeeded(task: &Task, attempt: &AttemptToken, output: &Value, c: &mut Change) -> Result<(), Stale> {
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
fn agent_failed(
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
    c.t.unit_record().refused(error);
    let reason = format!("{} {} failed permanently: {error}", noun(c.t.phase()), c.t.current_def().name);
    c.give_up(reason, FailureKind::Permanent);
    Ok(())
}

/// The current attempt ran out of its execution time, says its agent: a timeout, found before
/// `CompleteBy`. Its effect is unknown (the call may land until its deadline), so the attempt
/// stays outstanding and never releases a waiting compensation.
fn agent_timed_out(task: &Task, attempt: &AttemptToken, error: &str, c: &mut Change) -> Result<(), Stale> {
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
fn agent_not_started(task: &Task, attempt: &AttemptToken, error: &str, c: &mut Change) -> Result<(), Stale> {
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

/// The task sleeps in a wait step: its deadline ends the step, succeeded.
pub fn in_wait(task: &Task) -> bool {
    !task.process_state.is_terminal() && task.lock.locked_by.is_some() && task.current_def().kind.is_timer()
}

/// How long after `CompleteBy` a deadline is decided: a wait wakes at its instant; an attempt's
/// result may still be on its way for the policy's `result_grace_ms`. Timers are armed for
/// `CompleteBy` plus this, and [`Event::DeadlineExpired`] is stale before it.
pub fn deadline_grace_ms(task: &Task, policy: &Policy) -> u64 {
    if in_wait(task) {
        0
    } else {
        policy.result_grace_ms
    }
}

/// The Supervisor found `CompleteBy` (plus the result grace) in the past: a lost or delayed run
/// message is re-issued (the wait it belongs to does not change, so the first to arrive claims),
/// a running attempt has timed out.
fn deadline_expired(task: &Task, c: &mut Change) -> Result<(), Stale> {
    let complete_by = task.complete_by.unwrap_or(Millis(0));
    if map::map_running(task) {
        if complete_by.plus_ms(c.policy.result_grace_ms) > c.ctx.now {
            return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
        }
        map::deadline(task, c);
        return Ok(());
    }
    let waiting = in_wait(task);
    if complete_by.plus_ms(deadline_grace_ms(task, c.policy)) > c.ctx.now {
        return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
    }
    if waiting {
        // A wait ends by its deadline: the step is done.
        c.unlock();
        c.t.unit_record().succeeded();
        c.advance();
    } else if task.lock.locked_by.is_none() {
        c.restart();
    } else {
        let def = c.t.current_def();
        let what = match task.lock.hard_by {
            Some(hard) if complete_by < hard => format!(
                "sent no heartbeat within {} ms (CompleteBy {complete_by}, hard deadline {hard})",
                def.kind.heartbeat_ms().unwrap_or_default()
            ),
            _ => format!("passed CompleteBy {complete_by}"),
        };
        let reason = format!("{} {} attempt {} {what}", noun(c.t.phase()), def.name, c.t.unit_attempts());
        if let Some(token) = c.t.lock.locked_by.clone() {
            c.t.lock.outstanding.push(token);
        }
        c.attempt_failed(&reason, true);
    }
    Ok(())
}

/// Operator: stop the task. Completed steps are compensated, and so is the current step when any
/// attempt of it may have applied (running now, timed out, or failed retryably). An `Error` task
/// whose compensation failed resumes compensating, with fresh keys for refused units.
fn cancel(task: &Task, reason: &str, c: &mut Change) -> Result<(), Stale> {
    if let Stage::Compensating { plan, pos, .. } = &task.stage {
        if task.process_state != ProcessState::Error {
            return Err(Stale::AlreadyCompensating);
        }
        c.t.stage = Stage::Compensating { plan: plan.clone(), pos: *pos, cause: EndCause::Cancelled };
        c.t.run += 1;
        c.t.reason = Some(format!("cancelled (run {}): {reason}", c.t.run));
        c.t.unit_record().reset();
        c.wait_for_claim(c.ctx.now, RunReason::Retry);
        return Ok(());
    }
    if map::map_running(task) {
        map::cancel(task, reason, c);
        return Ok(());
    }
    // A command is a new run: one that names the run before it changes nothing now.
    c.t.run += 1;
    let i = c.t.step_index;
    if let Some(token) = task.lock.locked_by.clone() {
        c.t.steps[i].status = StepStatus::Cancelled;
        // A wait has no effect: nothing to await or undo.
        if task.current_def().kind.uses_agent() {
            c.t.steps[i].maybe_applied = true;
            c.t.lock.awaits = Some(token);
        }
    }
    c.begin_compensation(EndCause::Cancelled, format!("cancelled: {reason}"));
    Ok(())
}

/// Operator: an `Error` task resumes at its failed unit, forward or compensating; completed steps
/// are not redone. A unit whose last attempt was refused gets a new idempotency key.
fn resubmit(reason: &str, c: &mut Change) {
    c.t.run += 1;
    c.t.reason = Some(format!("resubmitted (run {}): {reason}", c.t.run));
    c.unlock();
    c.t.unit_record().reset();
    c.wait_for_claim(c.ctx.now, RunReason::Retry);
}

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
fn callback(
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

/// Whether a compensation is waiting for this forward attempt to settle.
fn awaited(task: &Task, attempt: &AttemptToken) -> bool {
    task.is_compensating() && task.lock.locked_by.is_none() && task.lock.awaits.as_ref() == Some(attempt)
}

/// [`MAX_LONG_STEP_MS`] in seconds (366 days), exact as an `f64`.
const MOST_WAIT_S: f64 = 31_622_400.0;

/// When a wait unit wakes: after `wait_ms`, after the seconds its `wait_for` pointer names, or
/// at the instant `wait_until` (an RFC 3339 time, or a pointer naming one or epoch milliseconds)
/// in the unit's input. `Err`: why it cannot wait.
fn wake_time(task: &Task, time: &WaitTime, now: Millis) -> Result<Millis, String> {
    let input = task.unit_input();
    let pointer = match time {
        WaitTime::Ms(ms) => return Ok(now.plus_ms(*ms)),
        WaitTime::SecondsAt(pointer) => {
            let secs = match input.pointer(pointer) {
                None => return Err(format!("wait_for {pointer} names nothing in the task")),
                Some(Value::Number(n)) => n.as_f64().filter(|s| *s >= 0.0),
                Some(_) => None,
            };
            let secs = secs.ok_or_else(|| {
                format!(
                    "wait_for {pointer} is {}, not a number of seconds",
                    crate::ids::clip(&input.pointer(pointer).map_or_else(String::new, Value::to_string), 40)
                )
            })?;
            if secs > MOST_WAIT_S {
                return Err(format!("wait_for {pointer} is more than 366 days"));
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0 <= secs <= 366 days
            let ms = (secs * 1000.0).round() as u64;
            return Ok(now.plus_ms(ms));
        }
        WaitTime::Until(pointer) => pointer.as_str(),
    };
    if !pointer.starts_with('/') {
        // a time written in the workflow
        let at = crate::ids::rfc3339_millis(pointer)
            .ok_or_else(|| format!("wait_until {pointer:?} is not an RFC 3339 time"))?;
        if now.until(Millis(at)) > MAX_LONG_STEP_MS {
            return Err(format!("wait_until {pointer} is more than 366 days ahead"));
        }
        return Ok(Millis(at).max(now));
    }
    let at = match input.pointer(pointer) {
        None => return Err(format!("wait_until {pointer} names nothing in the task")),
        Some(Value::Number(n)) => {
            n.as_u64().map(Millis).ok_or_else(|| format!("wait_until {pointer} is {n}, not epoch milliseconds"))?
        }
        Some(Value::String(t)) => {
            let at = crate::ids::rfc3339_millis(t).ok_or_else(|| {
                format!("wait_until {pointer} is {:?}, not an RFC 3339 time", crate::ids::clip(t, 40))
            })?;
            Millis(at)
        }
        Some(other) => {
            return Err(format!("wait_until {pointer} is {}, not a time", crate::ids::clip(&other.to_string(), 40)))
        }
    };
    if now.until(at) > MAX_LONG_STEP_MS {
        return Err(format!("wait_until {pointer} is more than 366 days ahead"));
    }
    Ok(at)
}

/// Why forward step `i` is skipped, decided once the steps it waits for are done: every step it
/// names in `after` was skipped (`skipped` says which were), or its guard is false. `None`: it runs.
///
/// A step that leaves `after` out follows the step listed before it in order only: it runs
/// whether that step ran or was skipped (a guarded step in a list is optional). A step that names
/// steps in `after` depends on them: it is skipped when every one was skipped, and runs (its guard
/// decides) when at least one ran.
fn skip_reason(task: &Task, i: usize, skipped: &dyn Fn(&str) -> bool) -> Option<String> {
    let def = &task.workflow.steps[i];
    if let Some(after) = def.after.as_ref().filter(|a| !a.is_empty()) {
        if after.iter().all(|n| skipped(n)) {
            return Some(format!("every step it waits for was skipped ({})", after.join(", ")));
        }
    }
    let when = def.when.as_ref()?;
    (!when.holds(task)).then(|| format!("when was false: {}", crate::ids::clip(&when.to_string(), 200)))
}

fn check_attempt(task: &Task, attempt: &AttemptToken) -> Result<(), Stale> {
    if task.lock.locked_by.as_ref() == Some(attempt) || task.lock.outstanding.contains(attempt) {
        Ok(())
    } else {
        Err(Stale::NotCurrentAttempt)
    }
}

/// What a terminal task owes the world, sent again when the message that ended it comes back
/// (its handler may have died after the write): the caller's last status and, for `Error`, the
/// operator's alert. Both are idempotent for their consumers (`seq`, and the alert's task id).
pub fn terminal_notices(task: &Task) -> Vec<Effect> {
    if !task.process_state.is_terminal() {
        return Vec::new();
    }
    let mut fx = Vec::new();
    if task.reply_to.is_some() {
        if let Some(last) = task.history.last().filter(|h| h.state == task.process_state) {
            fx.push(Effect::Reply(task.status_of(last)));
        }
    }
    if task.process_state == ProcessState::Error {
        fx.push(Effect::Alert(Alert {
            v: VERSION,
            kind: AlertKind::TaskError,
            task_id: task.task_id.clone(),
            workflow: format!("{}@{}", task.workflow.name, task.workflow.version),
            state: task.process_state,
            step: Some(task.current_def().name.clone()),
            failure_count: task.failure_count,
            reason: task.reason.clone().unwrap_or_default(),
            at: task.updated_at,
        }));
    }
    fx.extend(map::ended_notice(task));
    fx
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
        self.note_entry(state, false);
    }

    /// [`Self::note`] for an entry that begins a wait for a claim ([`HistoryEntry::waiting`]).
    fn note_wait(&mut self, state: ProcessState) {
        self.note_entry(state, true);
    }

    fn note_entry(&mut self, state: ProcessState, waiting: bool) {
        let t = &mut self.t;
        t.process_state = state;
        t.status_seq += 1;
        let entry = HistoryEntry {
            seq: t.status_seq,
            state,
            step: if state.is_terminal() { None } else { Some(t.current_def().name.clone()) },
            failure_count: t.failure_count,
            reason: if state == ProcessState::Processed { None } else { t.reason.clone() },
            at: self.ctx.now,
            waiting,
        };
        if t.reply_to.is_some() {
            self.fx.push(Effect::Reply(t.status_of(&entry)));
        }
        t.history.push(entry);
        if t.history.len() > self.policy.history_limit {
            let extra = t.history.len() - self.policy.history_limit;
            t.history.drain(..extra);
        }
    }

    /// Wait (unlocked) for a claim of the current unit from `due`: a run message for this wait,
    /// delayed until then, and a `CompleteBy` by which the Supervisor restarts a lost one.
    fn wait_for_claim(&mut self, due: Millis, reason: RunReason) {
        let now = self.ctx.now;
        self.unlock();
        self.t.claim.restarts = 0;
        self.t.claim.rev = self.t.rev;
        self.t.claim.not_before = None;
        self.t.complete_by = Some(due.max(now).plus_ms(self.policy.start_timeout_ms));
        self.t.unit_record().await_retry();
        self.note_wait(waiting_state(self.t.phase()));
        self.fx.push(Effect::Run { rev: self.t.claim.rev, delay_ms: now.until(due), reason });
    }

    /// The run message of the current wait was lost or is stuck behind a lagging queue: send it
    /// again (the first copy to arrive claims), waiting twice as long each time in a row; after
    /// `max_restarts` the task is stuck for a reason no retry fixes, and ends in `Error`.
    fn restart(&mut self) {
        self.t.claim.restarts += 1;
        if self.t.claim.restarts > self.policy.max_restarts {
            self.t.reason = Some(format!(
                "{} {} was not claimed after {} restarts",
                noun(self.t.phase()),
                self.t.current_def().name,
                self.policy.max_restarts
            ));
            self.finish(ProcessState::Error);
            return;
        }
        let wait = self.policy.start_timeout_ms.saturating_mul(1 << (self.t.claim.restarts - 1).min(6));
        self.t.complete_by = Some(self.ctx.now.plus_ms(wait));
        self.fx.push(Effect::Run { rev: self.t.claim.rev, delay_ms: 0, reason: RunReason::Restart });
    }

    /// Whether a compensation is waiting for this forward attempt to settle.
    fn awaited(&self, attempt: &AttemptToken) -> bool {
        awaited(&self.t, attempt)
    }

    /// No attempt holds the task any more.
    fn unlock(&mut self) {
        self.t.lock.locked_by = None;
        self.t.lock.hard_by = None;
    }

    /// The awaited attempt gave a definite answer: the compensation may start now.
    fn release_compensation(&mut self) {
        self.t.lock.awaits = None;
        self.wait_for_claim(self.ctx.now, RunReason::Compensate);
    }

    /// Claim the current unit: fresh token, deadlines, dispatch and timer. The request may wait
    /// in the agent queue until `start_by` (the queue budget); the attempt then has the unit's full
    /// `timeout_ms`, so `CompleteBy = start_by + timeout_ms`.
    ///
    /// A callback unit's attempt is the same, but for its deadlines: `timeout_ms` is its hard
    /// deadline, and with `heartbeat_ms` the first `CompleteBy` is `start_by + heartbeat_ms`
    /// (each heartbeat moves it on, never past the hard one). A wait unit has no agent: see
    /// [`Change::start_wait`].
    fn start_unit(&mut self) {
        let i = self.t.unit_step();
        // a parallel region first: its first step may be a map (which runs in its branch)
        if self.t.workflow.region_at(i).is_some() {
            match self.t.phase() {
                Phase::Forward => self.start_map(None),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        if let Some(spec) = self.t.workflow.steps[i].map.clone() {
            match self.t.phase() {
                Phase::Forward => self.start_map(Some(&spec)),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        if self.t.workflow.steps[i].kind.starts_a_workflow() {
            match self.t.phase() {
                Phase::Forward => self.start_child(),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        let def = self.t.current_def().clone();
        if let StepKind::Wait(time) = &def.kind {
            self.start_wait(&def, time);
            return;
        }
        let token = self.ctx.fresh_token.clone();
        let budget = def.schedule_to_start_ms.unwrap_or(self.policy.queue_budget_ms);
        let start_by = self.ctx.now.plus_ms(budget);
        let hard = start_by.plus_ms(def.timeout_ms);
        // a heartbeat is the token holder's: only a step answered by token has one
        let complete_by = match def.kind.heartbeat_ms() {
            Some(hb) => start_by.plus_ms(hb).min(hard),
            None => hard,
        };
        self.t.lock.locked_by = Some(token.clone());
        self.t.complete_by = Some(complete_by);
        self.t.lock.hard_by = (complete_by < hard).then_some(hard);
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.lock.awaits = None;
        let attempt_no = self.t.unit_record().begin_attempt();
        if def.kind.answers_by_token() {
            self.t.unit_record().issue(&token);
        }
        let phase = self.t.phase();
        if phase == Phase::Forward {
            let i = self.t.step_index;
            self.t.steps[i].settles_at = Some(hard);
        }
        self.note(running_state(phase));
        let unchecked = self.policy.unchecked_start_ms;
        let unchecked_until = (unchecked > 0).then(|| self.ctx.now.plus_ms(unchecked));
        let request = attempt_request(&self.t, &token, attempt_no, (budget > 0).then_some(start_by), unchecked_until);
        self.fx.push(Effect::Dispatch(request));
        let task_id = self.t.task_id.clone();
        self.fx.push(Effect::ArmTimer(TimerMessage { v: VERSION, task_id, attempt: Some(token), complete_by }));
    }

    /// A wait unit: held (so a cancel finds it running) until it wakes; its only effect is the
    /// deadline timer, which ends it. A wake time already past ends it at once; one that cannot
    /// be read fails the step for good, with the reason.
    fn start_wait(&mut self, def: &StepDef, time: &WaitTime) {
        let now = self.ctx.now;
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.lock.awaits = None;
        self.unlock();
        self.t.unit_record().begin_attempt();
        match wake_time(&self.t, time, now) {
            Err(why) => {
                self.t.failure_count += 1;
                self.t.unit_record().refused(&why);
                self.give_up(format!("step {} failed permanently: {why}", def.name), FailureKind::Permanent);
            }
            Ok(at) if at <= now => {
                self.t.unit_record().succeeded();
                self.advance();
            }
            Ok(at) => {
                let token = self.ctx.fresh_token.clone();
                self.t.lock.locked_by = Some(token.clone());
                self.t.complete_by = Some(at);
                self.note(running_state(self.t.phase()));
                let task_id = self.t.task_id.clone();
                self.fx.push(Effect::ArmTimer(TimerMessage {
                    v: VERSION,
                    task_id,
                    attempt: Some(token),
                    complete_by: at,
                }));
            }
        }
    }

    /// The current unit is done: start the next one, or end the task.
    fn advance(&mut self) {
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
            Stage::Compensating { cause, .. } => {
                let end = cause.end_state();
                self.finish(end);
            }
        }
    }

    /// One attempt failed without a definite "no" (timeout or a retryable error): its effect is
    /// uncertain. Retry after a backoff, or give up once the unit's attempts are spent.
    fn attempt_failed(&mut self, reason: &str, timed_out: bool) {
        let def = self.t.current_def().clone();
        self.t.failure_count += 1;
        self.unlock();
        if self.t.phase() == Phase::Forward {
            let i = self.t.step_index;
            self.t.steps[i].maybe_applied = true;
        }
        let failures = self.t.unit_record().attempt_failed(reason);
        if failures < def.max_attempts {
            let delay = def.backoff.delay_ms(failures, self.ctx.jitter);
            self.t.reason = Some(format!("{reason}; retry {}/{} in {delay} ms", failures + 1, def.max_attempts));
            self.wait_for_claim(self.ctx.now.plus_ms(delay), RunReason::Retry);
            return;
        }
        let gave_up = format!("{reason}; all {} attempts used", def.max_attempts);
        self.t.unit_record().exhausted(timed_out);
        let kind = if timed_out { FailureKind::TimedOut } else { FailureKind::Retryable };
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
    pub(super) fn handles(&self, kind: FailureKind) -> bool {
        let i = self.t.step_index;
        let w = &self.t.workflow;
        self.t.phase() == Phase::Forward
            && w.steps[i].map.is_none()
            && w.region_at(i).is_none()
            && w.steps[i].on_failure.continues(kind)
    }

    /// Start the forward step at `step_index`, or skip it (and the ones after it) when it is not
    /// to run: its guard is false, or every step it names in `after` was skipped. A skip is
    /// decided here, in the write that ends the steps it waits for (or creates the task): it
    /// costs no write of its own. A parallel region's branches decide theirs as they become ready.
    fn enter(&mut self) {
        loop {
            let i = self.t.step_index;
            if self.t.workflow.region_at(i).is_some() {
                break;
            }
            let t = &self.t;
            let Some(why) = skip_reason(t, i, &|name: &str| t.skipped(name)) else { break };
            self.t.steps[i].status = StepStatus::Skipped;
            self.t.steps[i].skipped = Some(why);
            if i + 1 == self.t.steps.len() {
                self.finish(ProcessState::Processed);
                return;
            }
            self.t.step_index += 1;
        }
        self.start_unit();
    }

    /// The current unit failed for good. A forward step is compensated (with itself when some
    /// attempt of it may have applied), or parks the task in `Error` for an operator, as the
    /// workflow says; a compensation that fails for good leaves the task in `Error`.
    fn give_up(&mut self, reason: String, kind: FailureKind) {
        if self.handles(kind) {
            // the step's failure is a path: its error is its output, and the task goes on
            let i = self.t.step_index;
            self.t.steps[i].output =
                Some(serde_json::json!({"error": {"kind": kind.name(), "message": crate::ids::clip(&reason, 300)}}));
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

    /// Undo, in reverse order, every completed step that has a compensation, and the current step
    /// too when some attempt of it may have applied (compensations must tolerate having nothing to
    /// undo). A compensation never races its forward attempt: while that attempt may still start
    /// or apply (until [`Change::settled_at`] and a settling margin, or until it answers), the
    /// first compensation waits.
    fn begin_compensation(&mut self, cause: EndCause, reason: String) {
        let t = &self.t;
        let i = t.step_index;
        let regions = t.workflow.regions();
        let has_comp = |j: usize| map::undoable(t, &regions, j);
        let mut plan = Vec::new();
        let current = t.steps[i].maybe_applied && has_comp(i);
        if current {
            plan.push(i);
        }
        plan.extend((0..i).rev().filter(|&j| map::applied(t, &regions, j) && has_comp(j)));
        // the current step's attempts, and those of a handled failure before it, may still apply
        let settles = plan
            .iter()
            .filter(|&&j| (j == i && current) || (j < i && t.steps[j].status != StepStatus::Succeeded))
            .filter_map(|&j| self.settled_at(j))
            .max()
            .map(|at| at.plus_ms(self.policy.settle_ms));
        self.t.reason = Some(reason);
        self.unlock();
        self.t.lock.outstanding.clear();
        if plan.is_empty() {
            self.finish(cause.end_state());
            return;
        }
        self.t.stage = Stage::Compensating { plan, pos: 0, cause };
        match settles.filter(|at| *at > self.ctx.now) {
            Some(at) => {
                // no claim before then, whichever run message arrives first
                self.wait_for_claim(at, RunReason::Compensate);
                self.t.claim.not_before = Some(at);
            }
            None => self.start_unit(),
        }
    }

    /// When no attempt of forward step `i` can apply any more, once the task stops waiting for
    /// them now: its last attempt's hard deadline (no copy of a request starts after its
    /// `start_by`, none runs past `start_by + timeout_ms`), or, for a call step, one execution
    /// time (plus the unchecked window) from now if that is sooner. An agent starts a call only
    /// while its attempt is the task's current one (it reads `LockedBy` first,
    /// `sas_core::agent::still_current`), except within `unchecked_start_ms` of the claim: a
    /// copy that starts after this decision's write is refused unless it is that fresh, so every
    /// call either started before now + the window or never starts, and one that started is cut
    /// within `timeout_ms`. A callback step's remote side holds its token until the hard deadline,
    /// whatever the agent does: that bound stays. The settling margin is added by the caller.
    fn settled_at(&self, i: usize) -> Option<Millis> {
        let hard = self.t.steps[i].settles_at?;
        let def = &self.t.workflow.steps[i];
        Some(if def.kind.agent_bounds_the_effect() {
            hard.min(self.ctx.now.plus_ms(self.policy.unchecked_start_ms + def.timeout_ms))
        } else {
            hard
        })
    }

    /// End the task in a terminal state; `Error` alerts an operator.
    fn finish(&mut self, end: ProcessState) {
        debug_assert!(end.is_terminal());
        self.unlock();
        self.t.complete_by = None;
        self.t.claim.not_before = None;
        self.t.lock.outstanding.clear();
        self.t.lock.awaits = None;
        self.note(end);
        if end == ProcessState::Error {
            let reason = self.t.reason.clone().unwrap_or_default();
            let alert = self.alert(AlertKind::TaskError, &reason);
            self.fx.push(Effect::Alert(alert));
        }
        self.fx.extend(map::ended_notice(&self.t));
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

mod map;
pub use map::{element_task, element_tombstone};

/// The end a map element owes its parent, once it has ended (none for other tasks).
pub fn element_notice(task: &Task) -> Option<Effect> {
    map::ended_notice(task)
}

/// What a spawn owes an element that exists already (an earlier delivery created it): a
/// stopping map cancels it while it runs; one that has ended says so to its parent again (only
/// that: its alert, if any, went out already); one that runs is sent what its last write owes.
pub fn existing_element(child: &Task, cancel: Option<&str>) -> ExistingElement {
    match cancel {
        Some(why) if !child.process_state.is_terminal() => {
            ExistingElement::Send(vec![Effect::Send(SchedulerMessage::Cancel(CancelMessage {
                v: VERSION,
                task_id: child.task_id.clone(),
                reason: why.to_owned(),
                run: None,
            }))])
        }
        _ if child.process_state.is_terminal() => ExistingElement::Send(element_notice(child).into_iter().collect()),
        _ => ExistingElement::Resend,
    }
}

/// See [`existing_element`].
#[derive(Debug, Clone, PartialEq)]
pub enum ExistingElement {
    /// These sends, and nothing written.
    Send(Vec<Effect>),
    /// What its last write owes ([`resend`]).
    Resend,
}

/// What an event that changes nothing still owes, decided on the task as the event found it:
/// a run message that came before its wait may claim (SQS delays at most 15 minutes) is sent on
/// for the rest of the wait; a parent's command (cancel, undo) to a map element that has ended
/// has the element say its end again (its first notice may be the one the parent is missing).
pub fn stale_sends(task: &Task, event: &Event, stale: &Stale) -> Vec<Effect> {
    match (stale, event) {
        (Stale::TooEarly { not_before, now }, Event::Claim { rev }) => {
            vec![Effect::Run { rev: *rev, delay_ms: now.until(*not_before), reason: RunReason::Retry }]
        }
        (_, Event::Cancel { .. } | Event::Undo { .. }) if task.task_id.is_child() => {
            element_notice(task).into_iter().collect()
        }
        _ => Vec::new(),
    }
}

/// The result an agent request that can never be sent stands for (its input and the earlier
/// steps' outputs exceed the queue's limit): the attempt fails for good at once, instead of
/// timing out again and again.
pub fn undeliverable_request(request: &AgentRequest, bytes: usize, limit: usize) -> SchedulerMessage {
    SchedulerMessage::Result(AgentResult {
        v: VERSION,
        task_id: request.task_id.clone(),
        step: request.step.clone(),
        attempt: request.attempt.clone(),
        outcome: Outcome::Failed {
            error: format!("the agent request is {bytes} bytes; SQS accepts at most {limit}"),
            retryable: false,
        },
    })
}

#[cfg(test)]
#[allow(clippy::needless_pass_by_value, clippy::many_single_char_names)]
mod tests;

#[cfg(test)]
#[allow(clippy::needless_pass_by_value)]
mod callback_tests;

#[cfg(test)]
mod map_tests;
