//! A queue record read once. Every record a role receives is parsed into its role's message
//! here, and only here: the batch's grouping (records of one task in order), the ends a Scheduler
//! batch writes together, the record's log span and the role's handler all take the
//! [`Envelope`] (the body was parsed up to four times on its way through a Scheduler batch).

use serde_json::Value;
use tracing::field::Empty;

use crate::bus::Record;
use crate::deps::HandlerError;
use crate::ids::TaskId;
use crate::messages::{AgentRequest, CallbackMessage, SchedulerMessage, TimerMessage, VERSION};
use crate::protocol::Event;
use crate::role::Role;

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
            Role::Scheduler => Body::Scheduler(
                serde_json::from_str::<SchedulerMessage>(raw)
                    .map_err(|e| e.to_string())
                    .and_then(|m| crate::scheduler::scheduled(m).map_err(|e| e.to_string())),
            ),
            Role::Agent => {
                Body::Agent(serde_json::from_str::<AgentRequest>(raw).map_err(|e| e.to_string()).and_then(|r| {
                    if r.v == VERSION {
                        Ok(r)
                    } else {
                        Err(format!("unsupported version {}", r.v))
                    }
                }))
            }
            Role::Supervisor => Body::Timer(serde_json::from_str(raw).map_err(|e| e.to_string())),
            Role::Callback => Body::Callback(crate::callback::parse(raw).map_err(|e| match e {
                HandlerError::Malformed(why) => why,
                other => other.to_string(),
            })),
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
