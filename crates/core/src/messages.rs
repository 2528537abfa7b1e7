//! The wire contracts: every message that crosses a queue or a topic. JSON, versioned (`"v": 1`),
//! parsed strictly. The README documents each with an example.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{AttemptToken, IdempotencyKey, Millis, TaskId};
use crate::state::ProcessState;

/// The only message version this build speaks.
pub const VERSION: u32 = 1;
/// SQS's limit on one message body.
pub const SQS_MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// What an application sends to the submission queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    pub v: u32,
    /// The idempotency key of the submission; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<TaskId>,
    pub workflow: String,
    /// Pin a version; the latest deployed version when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<u32>,
    #[serde(default)]
    pub input: Value,
    /// The caller's private queue for status messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// Why a run message was sent; it only informs logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunReason {
    Start,
    Retry,
    Restart,
    /// Compensation may begin: the forward attempt it waited for can no longer apply.
    Compensate,
}

/// Scheduler queue: claim and run the task's current step, if the task is still at `rev`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub rev: u64,
    pub reason: RunReason,
}

/// What an agent reports for one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    Succeeded {
        output: Value,
    },
    /// `retryable: false` is a permanent failure (the remote service said no for good).
    Failed {
        error: String,
        retryable: bool,
    },
    /// The attempt ran out of its execution time (start + `timeout_ms`) before `CompleteBy`:
    /// its effect is unknown, like a retryable failure's, and the step counts as timed out.
    TimedOut {
        error: String,
    },
}

/// Scheduler queue: an agent's result for one attempt, fenced by the attempt token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentResult {
    pub v: u32,
    pub task_id: TaskId,
    pub step: String,
    pub attempt: AttemptToken,
    pub outcome: Outcome,
}

/// Scheduler queue: stop the task; completed steps are compensated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub reason: String,
    /// The run the sender saw: a cancel applies to that run only. Optional for a running task;
    /// required for a task in `Error` (an operator's), so a late or duplicate cancel never resumes
    /// its compensation a second time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<u32>,
}

/// Scheduler queue: an operator resubmits an `Error` task; it resumes from its failed step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResubmitMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub reason: String,
    /// The run the operator saw in `Error`: a resubmit applies once, to that run only (a
    /// duplicate delivery, or one that arrives after the task failed again, changes nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<u32>,
}

/// Everything the scheduler queue carries, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SchedulerMessage {
    Run(RunMessage),
    Result(AgentResult),
    Cancel(CancelMessage),
    Resubmit(ResubmitMessage),
}

impl SchedulerMessage {
    pub fn task_id(&self) -> &TaskId {
        match self {
            SchedulerMessage::Run(m) => &m.task_id,
            SchedulerMessage::Result(m) => &m.task_id,
            SchedulerMessage::Cancel(m) => &m.task_id,
            SchedulerMessage::Resubmit(m) => &m.task_id,
        }
    }

    pub fn version(&self) -> u32 {
        match self {
            SchedulerMessage::Run(m) => m.v,
            SchedulerMessage::Result(m) => m.v,
            SchedulerMessage::Cancel(m) => m.v,
            SchedulerMessage::Resubmit(m) => m.v,
        }
    }
}

/// Forward step or compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Compensate,
}

/// Agent queue: one attempt of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRequest {
    pub v: u32,
    pub task_id: TaskId,
    pub step: String,
    pub phase: Phase,
    pub agent: String,
    /// The fencing token; the result must carry it back.
    pub attempt: AttemptToken,
    /// 1 for the first attempt of this step, 2 for the first retry...
    pub attempt_no: u32,
    /// The attempt may start until this instant (epoch ms); a request still queued after it is
    /// dropped unstarted. Started at `s`, it may run until `s + (complete_by - start_by)`: time
    /// spent waiting in the queue is not taken from the step's execution time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_by: Option<Millis>,
    /// Nothing may be started, applied or sent back after this instant (epoch ms).
    pub complete_by: Millis,
    /// `{task}:{step}`, stable across retries: the remote service applies the effect once.
    pub idempotency_key: IdempotencyKey,
    pub input: Value,
}

/// Supervisor queue (delayed): check this attempt at its CompleteBy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerMessage {
    pub v: u32,
    pub task_id: TaskId,
    /// The attempt to check; absent when the sweep hands over a task whose decision ends it (so
    /// that the terminal transition, and its alert, happen in a handler SQS retries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<AttemptToken>,
    pub complete_by: Millis,
}

/// Sent to the caller's `reply_to` queue on every state change. Standard queues may reorder
/// messages: `seq` increases with every change of one task, so consumers order by it (a FIFO
/// reply queue receives them in order, grouped by task).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub seq: u64,
    pub state: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub failure_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Epoch milliseconds.
    pub at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A step used all its attempts; compensation follows.
    RetriesExhausted,
    /// The task ended in Error: an operator must look.
    TaskError,
}

/// Published to the alert topic for operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alert {
    pub v: u32,
    pub kind: AlertKind,
    pub task_id: TaskId,
    pub workflow: String,
    pub state: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub failure_count: u32,
    pub reason: String,
    pub at: Millis,
}

impl Alert {
    pub fn subject(&self) -> String {
        let what = match self.kind {
            AlertKind::RetriesExhausted => "retries exhausted",
            AlertKind::TaskError => "task in Error",
        };
        // SNS subjects: at most 100 printable ASCII characters.
        let mut s = format!("[sas] {what}: {} ({})", self.task_id, self.workflow);
        s.retain(|c| c.is_ascii() && !c.is_ascii_control());
        s.truncate(100);
        s
    }
}

/// An SQS queue URL, as AWS and LocalStack write them: `.../<12-digit account>/<name>` or
/// LocalStack's path style `.../queue/<region>/<account>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueUrl(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reply_to {url:?} is not an SQS queue URL: {why}")]
pub struct QueueUrlError {
    pub url: String,
    pub why: &'static str,
}

impl QueueUrl {
    pub fn parse(url: &str) -> Result<Self, QueueUrlError> {
        let err = |why| QueueUrlError { url: url.chars().take(300).collect(), why };
        if url.len() > 1024 {
            return Err(err("longer than 1024 characters"));
        }
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| err("it must start with https:// or http://"))?;
        let (host, path) = rest.split_once('/').ok_or_else(|| err("it has no path"))?;
        if host.is_empty() || host.contains('@') || host.chars().any(char::is_whitespace) {
            return Err(err("its host is not valid"));
        }
        let segs: Vec<&str> = path.split('/').collect();
        if segs.len() < 2 {
            return Err(err("its path must end with /<account>/<queue name>"));
        }
        let name = segs[segs.len() - 1];
        let account = segs[segs.len() - 2];
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("the path segment before the queue name must be a 12-digit account id"));
        }
        let base = name.strip_suffix(".fifo").unwrap_or(name);
        if base.is_empty()
            || base.len() > 80
            || !base.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(err("the queue name must be 1-80 letters, digits, - or _ (optionally .fifo)"));
        }
        if url.contains('?') || url.contains('#') {
            return Err(err("it must not carry a query or fragment"));
        }
        Ok(QueueUrl(url.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_fifo(&self) -> bool {
        // SQS requires the suffix in lower case.
        #[allow(clippy::case_sensitive_file_extension_comparisons)]
        let fifo = self.0.ends_with(".fifo");
        fifo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_urls() {
        for ok in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/replies",
            "http://localhost:4566/queue/us-east-1/000000000000/my-replies",
            "http://localhost:4566/000000000000/r.fifo",
        ] {
            assert!(QueueUrl::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "ftp://x/123456789012/q",
            "https://sqs.amazonaws.com/replies",
            "https://sqs.amazonaws.com/12345/q",
            "https://sqs.amazonaws.com/123456789012/bad name",
            "https://sqs.amazonaws.com/123456789012/",
            "https://user@evil/123456789012/q",
            "https://h/123456789012/q?x=1",
        ] {
            assert!(QueueUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scheduler_messages_round_trip_with_type_tag() {
        let m = SchedulerMessage::Result(AgentResult {
            v: 1,
            task_id: TaskId::try_from("t1").unwrap(),
            step: "charge".into(),
            attempt: AttemptToken::from("tok"),
            outcome: Outcome::Failed { error: "declined".into(), retryable: false },
        });
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.contains(r#""type":"result""#), "{s}");
        assert!(s.contains(r#""status":"failed""#), "{s}");
        assert_eq!(serde_json::from_str::<SchedulerMessage>(&s).unwrap(), m);
    }

    #[test]
    fn submission_is_strict() {
        let ok = r#"{"v":1,"task_id":"order-42","workflow":"order","input":{"sku":"a"}}"#;
        assert!(serde_json::from_str::<Submission>(ok).is_ok());
        let extra = r#"{"v":1,"workflow":"order","input":{},"callback":"http://x"}"#;
        assert!(serde_json::from_str::<Submission>(extra).is_err());
    }

    #[test]
    fn alert_subject_is_sns_safe() {
        let a = Alert {
            v: 1,
            kind: AlertKind::TaskError,
            task_id: TaskId::try_from("x".repeat(128)).unwrap(),
            workflow: "order".into(),
            state: ProcessState::Error,
            step: None,
            failure_count: 3,
            reason: "r".into(),
            at: Millis(1),
        };
        assert!(a.subject().len() <= 100);
    }
}
