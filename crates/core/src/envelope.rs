//! A queue record read once. Every record a role receives is parsed into its role's message
//! here, and only here: the batch's grouping (records of one task in order), the ends a Scheduler
//! batch writes together, the record's log span and the role's handler all take the
//! [`Envelope`] (the body was parsed up to four times on its way through a Scheduler batch).

use serde_json::Value;
use tracing::field::Empty;

use crate::bus::Record;
use crate::config::Resources;
use crate::deps::HandlerError;
use crate::ids::TaskId;
use crate::messages::{AgentRequest, CallbackMessage, Outcome, SchedulerMessage, TimerMessage, Versioned, VERSION};
use crate::protocol::Event;
use crate::screen;

/// The longest agent error kept on a task.
pub const MAX_ERROR_BYTES: usize = 1024;

/// A record and what its body says, for its role.
#[derive(Debug)]
pub struct Envelope<'a> {
    pub role: Role,
    pub record: &'a Record,
    pub body: Body,
}

/// A record's body, parsed for its role; `Err` says why it cannot be read (the record is
/// malformed: it goes to its DLQ with that reason).
#[derive(Debug)]
pub enum Body {
    /// A submission, as JSON: the Submitter screens and reads it itself (a refusal names what is
    /// wrong and keeps the text).
    Submission(Result<Value, serde_json::Error>),
    /// A scheduler-queue message and the protocol event it carries.
    Scheduler(Result<Scheduled, String>),
    Agent(Result<AgentRequest, String>),
    Timer(Result<TimerMessage, String>),
    Callback(Result<CallbackMessage, String>),
}

/// A scheduler-queue message as an event for one task.
#[derive(Debug)]
pub struct Scheduled {
    pub task_id: TaskId,
    pub event: Event,
    /// The step a result is for (the log span's).
    pub step: Option<String>,
}

impl<'a> Envelope<'a> {
    /// Parse `record` for `role`.
    pub fn open(role: Role, record: &'a Record) -> Self {
        let raw = record.body.as_str();
        let body = match role {
            Role::Submitter => Body::Submission(serde_json::from_str(raw)),
            Role::Scheduler => {
                Body::Scheduler(read::<SchedulerMessage>(raw).and_then(|m| scheduled(m).map_err(|e| e.to_string())))
            }
            Role::Agent => Body::Agent(read::<AgentRequest>(raw)),
            Role::Supervisor => Body::Timer(read::<TimerMessage>(raw)),
            Role::Callback => Body::Callback(callback_message(raw)),
        };
        Envelope { role, record, body }
    }

    /// The task the record is for, as its body names it (a map element's end: its parent).
    pub fn task_id(&self) -> Option<&str> {
        match &self.body {
            Body::Submission(Ok(v)) => v.get("task_id").and_then(Value::as_str),
            Body::Scheduler(Ok(s)) => Some(s.task_id.as_str()),
            Body::Agent(Ok(r)) => Some(r.task_id.as_str()),
            Body::Timer(Ok(t)) => Some(t.task_id.as_str()),
            Body::Callback(_)
            | Body::Submission(Err(_))
            | Body::Scheduler(Err(_))
            | Body::Agent(Err(_))
            | Body::Timer(Err(_)) => None,
        }
    }

    /// The parent whose element (or branch) ended, when the record is such an end.
    pub fn ended_parent(&self) -> Option<&TaskId> {
        match &self.body {
            Body::Scheduler(Ok(Scheduled { task_id, event: Event::ElementEnded { .. }, .. })) => Some(task_id),
            _ => None,
        }
    }

    /// The fields every log line of the record's handling carries (JSON logs: under `span`): its
    /// role, its SQS message id, and the task, step and attempt its body names. A submission's
    /// task is recorded once the Submitter has read it.
    pub fn span(&self) -> tracing::Span {
        let (step, attempt) = match &self.body {
            Body::Agent(Ok(r)) => (Some(r.step.as_str()), Some(r.attempt_no)),
            Body::Scheduler(Ok(s)) => (s.step.as_deref(), None),
            _ => (None, None),
        };
        let span = tracing::info_span!(
            "record",
            role = self.role.name(),
            message_id = %self.record.message_id,
            task_id = Empty,
            step,
            attempt,
        );
        if let Some(task_id) = self.task_id() {
            span.record("task_id", task_id);
        }
        span
    }
}

/// Why a message of format `v` is refused: the format it is written in, and the one this build
/// reads (docs/reference/messages.md, "Compatibility").
pub fn format_refused(v: u32) -> String {
    format!("unsupported version {v}: the message is written in format {v}, and this build reads format {VERSION}; it was sent by a function of a later release (finish the deploy, or redrive it once every function is of that release)")
}

/// Parse an internal message strictly, and refuse one of another format than [`VERSION`] for its
/// format. A message this build cannot parse because a later release wrote it (its `v` is above
/// [`VERSION`], with fields this build does not know) is refused for its format too, not for the
/// first unknown field (its `v` read only on that path: nothing on the happy one).
pub fn read<T: serde::de::DeserializeOwned + Versioned>(raw: &str) -> Result<T, String> {
    let msg = serde_json::from_str::<T>(raw).map_err(|e| {
        #[derive(serde::Deserialize)]
        struct Format {
            v: Option<u32>,
        }
        match serde_json::from_str::<Format>(raw) {
            Ok(Format { v: Some(v) }) if v > VERSION => format_refused(v),
            _ => e.to_string(),
        }
    })?;
    match msg.format() {
        VERSION => Ok(msg),
        v => Err(format_refused(v)),
    }
}

/// Parse one callback message (the callback queue's body, the HTTPS request's body).
pub fn callback_message(raw: &str) -> Result<CallbackMessage, String> {
    read(raw)
}

/// The event a scheduler-queue message carries, for the task it names (see [`crate::envelope`]).
pub fn scheduled(msg: SchedulerMessage) -> Result<Scheduled, HandlerError> {
    let task_id = msg.task_id().clone();
    let mut step = None;
    let event = match msg {
        SchedulerMessage::Run(m) => Event::Claim { rev: m.rev },
        SchedulerMessage::Result(r) => {
            step = Some(r.step);
            // an agent's error is stored on the task: bounded
            let error = |e: &str| crate::ids::clip(e, MAX_ERROR_BYTES).to_owned();
            match r.outcome {
                Outcome::Succeeded { output } => {
                    Event::AgentSucceeded { attempt: r.attempt, output: screen::output(&output) }
                }
                Outcome::TimedOut { error: e } => Event::AgentTimedOut { attempt: r.attempt, error: error(&e) },
                Outcome::NotStarted { error: e } => Event::AgentNotStarted { attempt: r.attempt, error: error(&e) },
                Outcome::Failed { error: e, retryable } => {
                    Event::AgentFailed { attempt: r.attempt, error: error(&e), retryable }
                }
            }
        }
        SchedulerMessage::Cancel(c) => Event::Cancel { reason: c.reason, run: c.run },
        SchedulerMessage::Resubmit(r) => Event::Resubmit { reason: r.reason, run: r.run },
        SchedulerMessage::ElementEnded(m) => Event::ElementEnded {
            step: m.step,
            element: m.element,
            state: m.state,
            reason: m.reason.as_deref().map(|r| crate::ids::clip(r, MAX_ERROR_BYTES).to_owned()),
            output: m.output,
            vars: m.vars,
        },
        SchedulerMessage::Undo(m) => Event::Undo { reason: crate::ids::clip(&m.reason, MAX_ERROR_BYTES).to_owned() },
        // The outputs are read once the task is (see `join_output`).
        SchedulerMessage::Join(m) => Event::Joined { step: m.step, output: Value::Null },
    };
    Ok(Scheduled { task_id, event, step })
}

/// Which handler a queue feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Submitter,
    Scheduler,
    Agent,
    Supervisor,
    /// Answers of callback steps: the callback queue (and, as a Lambda function, its HTTPS URL).
    Callback,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Submitter, Role::Scheduler, Role::Agent, Role::Supervisor, Role::Callback];

    pub fn name(self) -> &'static str {
        match self {
            Role::Submitter => "submitter",
            Role::Scheduler => "scheduler",
            Role::Agent => "agent",
            Role::Supervisor => "supervisor",
            Role::Callback => "callback",
        }
    }

    /// The queue that triggers this role; empty for the callback role of a stack without a
    /// callback queue (see [`Role::has_queue`]).
    pub fn queue(self, res: &Resources) -> &str {
        match self {
            Role::Submitter => &res.submission_queue_url,
            Role::Scheduler => &res.scheduler_queue_url,
            Role::Agent => &res.agent_queue_url,
            Role::Supervisor => &res.supervisor_queue_url,
            Role::Callback => res.callback_queue_url.as_deref().unwrap_or_default(),
        }
    }

    /// Every queue that feeds this role: its own, and for the Scheduler the ends queue when the
    /// stack has one.
    pub fn queues(self, res: &Resources) -> Vec<&str> {
        let own = Some(self.queue(res)).filter(|q| !q.is_empty());
        let ends = res.ends_queue_url.as_deref().filter(|_| self == Role::Scheduler);
        own.into_iter().chain(ends).collect()
    }

    /// Whether the stack has this role's queue (every stack has the first four).
    pub fn has_queue(self, res: &Resources) -> bool {
        !self.queue(res).is_empty()
    }

    /// Where a message of this role's queue that can never be handled goes at once (the
    /// submitter keeps refused submissions in its DLQ itself).
    pub fn dead_letter_queue(self, res: &Resources) -> Option<&str> {
        match self {
            Role::Submitter => None,
            Role::Scheduler => res.scheduler_dlq_url.as_deref(),
            Role::Agent => res.agent_dlq_url.as_deref(),
            Role::Supervisor => res.supervisor_dlq_url.as_deref(),
            Role::Callback => res.callback_dlq_url.as_deref(),
        }
    }

    /// The visibility timeouts of the template (6x each function's timeout).
    pub fn default_visibility_seconds(self) -> u64 {
        match self {
            Role::Submitter => 60,
            Role::Scheduler | Role::Callback => 90,
            Role::Agent => 720,
            Role::Supervisor => 360,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: &str) -> Record {
        Record { message_id: "m-1".into(), body: body.into(), receive_count: 1, sent_at: None, trace_header: None }
    }

    #[test]
    fn a_message_of_a_later_format_is_refused_for_its_format_not_misread() {
        // a later release's timer, agent request and callback answer, each with a field this
        // build does not know: refused, and the reason names the format
        let later = [
            (Role::Supervisor, r#"{"v": 2, "task_id": "t-1", "complete_by": 5, "shard": 3}"#),
            (Role::Agent, r#"{"v": 2, "task_id": "t-1", "lane": "fast"}"#),
            (Role::Scheduler, r#"{"type": "run", "v": 2, "task_id": "t-1", "rev": 1, "reason": "start", "lane": 1}"#),
            (Role::Callback, r#"{"v": 2, "token": "x", "status": "heartbeat", "lane": 1}"#),
            // a later format with nothing this build does not know is refused too: never read
            // as if it were this build's
            (Role::Supervisor, r#"{"v": 2, "task_id": "t-1", "complete_by": 5}"#),
            (Role::Scheduler, r#"{"type": "run", "v": 2, "task_id": "t-1", "rev": 1, "reason": "start"}"#),
            (Role::Callback, r#"{"v": 2, "token": "x", "status": "heartbeat"}"#),
        ];
        for (role, body) in later {
            let r = record(body);
            let why = match Envelope::open(role, &r).body {
                Body::Timer(Err(e)) | Body::Agent(Err(e)) | Body::Scheduler(Err(e)) | Body::Callback(Err(e)) => e,
                other => panic!("{role:?} read a later format: {other:?}"),
            };
            assert!(why.contains("written in format 2") && why.contains("reads format 1"), "{role:?}: {why}");
        }
        // this format with a field it does not have: refused for the field
        let r = record(r#"{"v": 1, "task_id": "t-1", "complete_by": 5, "shard": 3}"#);
        match Envelope::open(Role::Supervisor, &r).body {
            Body::Timer(Err(e)) => assert!(e.contains("unknown field `shard`"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
