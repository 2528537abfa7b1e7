//! The Scheduler-Agent-Supervisor protocol as one pure state machine:
//! `(task, event, ctx) -> (task', effects)` or `Stale`. No I/O happens here: the role handlers
//! load the task, call [`apply`], write the new task with a conditional write (the only lock),
//! and only then perform the effects.
//!
//! The story, in the pattern's words, one file per event (in `event/`, each beginning with the
//! states its event acts in and those it refuses, as [`TRANSITIONS`] declares them):
//! - [`submit`] (`submit.rs`): a submission creates the task with its first step claimed (one
//!   write), so the Supervisor recovers it like any attempt if its dispatch is lost.
//! - [`Event::Claim`] (`claim.rs`): the Scheduler claims the current unit of work: `LockedBy` = a
//!   fresh attempt token, `CompleteBy` = now + the unit's timeout; it dispatches the unit to its
//!   Agent and arms a deadline timer.
//! - [`Event::AgentSucceeded`] / [`Event::AgentFailed`] (`agent_result.rs`, with
//!   [`Event::AgentTimedOut`] and [`Event::AgentNotStarted`]): the Agent's result applies only if
//!   it carries the current token. Success moves to the next unit (claimed in the same write) or
//!   ends the task; a definite "no" gives the unit up; a retryable failure counts and retries.
//! - [`Event::DeadlineExpired`] (`deadline.rs`): the Supervisor found `CompleteBy` in the
//!   past: `FailureCount` + 1 and a retry after a backoff, or, when the unit's attempts are spent,
//!   an operator alert and compensation of the completed steps in reverse order.
//! - Compensation ends `Compensated`; a compensation that fails for good ends `Error` (alert).
//! - [`Event::Cancel`] (`cancel.rs`): completed steps are compensated and the task ends
//!   `Cancelled`.
//! - [`Event::Resubmit`] (`resubmit.rs`): an operator resumes an `Error` task at its failed unit.
//! - [`Event::Callback`] (`callback.rs`): the answer of a callback unit, fenced by its token.
//! - A **map step** runs once per element of an array, each element a task of its own; the
//!   parent counts their ends ([`Event::ElementEnded`], `element_ended.rs`), joins their outputs
//!   ([`Event::Joined`], `joined.rs`) and, compensating, undoes the ones that succeeded
//!   ([`Event::Undo`], `undo.rs`). See `change/map.rs`.
//!
//! Here: the public types (the policy, the context, the events, the effects, why an event is
//! stale, a transition), [`apply`], which admits an event and hands it to its file, and the
//! re-exports. What every event shares is in `change/` (a transition being built: its notes, the
//! claim of a unit, its end, compensation planning, the units that run as tasks of their own);
//! what a write owes the world when its message comes back is in `sends.rs`.
//!
//! A **unit of work** is a forward step or the compensation of one (see [`task`]); every rule
//! about attempts, retries and giving up is written once for both.

use serde_json::Value;

use crate::ids::{AttemptToken, Millis};
use crate::messages::{AgentRequest, Alert, CallbackAnswer, RunReason, SchedulerMessage, StatusMessage, TimerMessage};

mod change;
mod event;
mod sends;
pub mod table;
pub mod task;

pub use crate::state::{ProcessState, UnknownState};
pub use crate::workflow::MAX_VARS_BYTES;
pub use change::map::{element_task, element_tombstone};
use change::{Change, Ended};
pub use event::callback::late_notice;
pub use event::deadline::{deadline_grace_ms, in_wait};
pub use event::submit::{submit, submit_in_slot, submit_waiting};
use event::{
    agent_result::{agent_failed, agent_not_started, agent_succeeded, agent_timed_out},
    callback::callback,
    cancel::cancel,
    claim::claim,
    deadline::deadline_expired,
    element_ended::element_ended,
    joined::joined,
    resubmit::resubmit,
    undo::undo,
};
pub use sends::{
    element_notice, existing_element, owed_sends, resend, stale_sends, terminal_notices, undeliverable_request,
    ExistingElement,
};
pub use table::TRANSITIONS;
pub use task::{
    Bits, ClaimWait, CompensationRecord, CompensationStatus, EndCause, HistoryEntry, Iteration, LateResults, Lock,
    MapProgress, Slot, Stage, StepRecord, StepStatus, Task, UndeliveredReplies, ITEM_FORMAT,
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
    /// How often the Supervisor looks whether the paused workflow of a parked task was resumed.
    pub pause_check_ms: u64,
    /// How often the Supervisor checks the key of a task that waits for a slot (a backstop: a
    /// slot is granted when a task of the key ends, see [`crate::keys`]).
    pub key_check_ms: u64,
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
            key_check_ms: 300_000,
            pause_check_ms: 60_000,
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
    /// The task's workflow is paused by an operator: no forward unit starts (it is parked).
    pub paused: bool,
}

impl Ctx {
    /// A context at `now` with a fresh random token and a mid jitter (fixtures, tools).
    pub fn at(now: Millis) -> Self {
        Ctx { now, fresh_token: AttemptToken::fresh(), jitter: 0.5, paused: false }
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
        /// A loop's iteration of an inline body: the task's variables as it left them.
        vars: Option<serde_json::Map<String, Value>>,
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
    /// The task ended: give its slot of its concurrency key back (the key item's id), which grants
    /// it to the first task in line ([`crate::keys::release`]).
    ReleaseSlot {
        key: String,
    },
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
            Effect::ReleaseSlot { .. } => "release_slot",
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

/// Apply one event. `Err(Stale)` means the event changes nothing.
pub fn apply(task: &Task, event: &Event, ctx: &Ctx, policy: &Policy) -> Result<Transition, Stale> {
    if !matches!(event, Event::Callback { .. }) {
        admit(task, event)?;
    }
    let mut t = task.clone();
    t.rev += 1;
    t.updated_at = ctx.now;
    let mut c = Change { t, fx: Vec::new(), ctx, policy, error_name: None };
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
        Event::ElementEnded { step, element, state, reason, output, vars } => {
            let end = Ended { state: *state, reason: reason.as_deref(), output: output.as_ref(), vars: vars.as_ref() };
            element_ended(task, *step, *element, &end, &mut c)?;
        }
        Event::Undo { reason } => undo(task, reason, &mut c)?,
        Event::Joined { step, output } => joined(task, *step, output, &mut c)?,
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

#[cfg(test)]
#[allow(clippy::needless_pass_by_value, clippy::many_single_char_names)]
mod tests;

#[cfg(test)]
#[allow(clippy::needless_pass_by_value)]
mod callback_tests;

#[cfg(test)]
mod map_tests;
