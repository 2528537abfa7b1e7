//! The message bus port: SQS-like queues addressed by URL and an SNS-like topic. Two
//! implementations keep the same semantics:
//! - [`AwsBus`]: SQS and SNS through the AWS SDK;
//! - [`MemoryBus`]: an in-memory twin with delayed messages, visibility timeouts and redelivery
//!   (at-least-once), a DLQ after `maxReceiveCount` receives, FIFO deduplication, and failure
//!   injection, for fast tests of the roles and for the simulator.
//!
//! [`BufferedBus`] wraps either and coalesces single sends to a queue into SendMessageBatch
//! requests (one request for up to 10 messages).
//!
//! [`Outbox`] turns the roles' typed messages into sends on the stack's queues; it is the only
//! place that knows which message goes to which queue.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;

use crate::config::Resources;
use crate::ids::{clip, Millis};
use crate::messages::{
    AgentRequest, Alert, QueueUrl, SchedulerMessage, StatusMessage, TimerMessage, SQS_MAX_MESSAGE_BYTES,
};

mod aws;
mod buffered;
mod memory;

pub use aws::AwsBus;
pub use buffered::{BufferedBus, DEFAULT_LINGER, MAX_BATCH_BYTES};
pub use memory::{MemoryBus, QueueConfig};

/// SQS's longest per-message delay.
pub const MAX_DELAY_SECONDS: u64 = 900;
/// SQS's largest batch.
pub const MAX_BATCH: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The message can never be sent: retrying cannot help.
    #[error("message is {bytes} bytes; SQS accepts at most {SQS_MAX_MESSAGE_BYTES}")]
    TooLarge { bytes: usize },
    /// The queue or topic could not be reached or refused the request: worth a retry.
    #[error("{op} to {target}: {message}")]
    Backend {
        op: &'static str,
        target: String,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The queue does not exist (a caller's `reply_to` that was deleted, or never created):
    /// retrying cannot help.
    #[error("queue {queue} does not exist")]
    NoSuchQueue { queue: String },
    /// The queue refused the message for a reason that a retry cannot fix: access denied, a KMS
    /// key the sender may not use (or that is disabled or gone), a parameter SQS rejects (a FIFO
    /// id over 128 characters), a queue URL it will not take.
    #[error("{op} to {target} refused ({code}): {message}")]
    Refused { op: &'static str, target: String, code: String, message: String },
    /// Some entries of a batch were not sent (every chunk was tried).
    #[error("{failed} of {total} batch entries failed: {first}")]
    Batch { failed: usize, total: usize, first: String },
}

impl BusError {
    /// The same error for another caller of one failed request. The underlying error stays with
    /// the original; its text is already in `message`.
    #[must_use]
    pub fn duplicate(&self) -> BusError {
        match self {
            BusError::TooLarge { bytes } => BusError::TooLarge { bytes: *bytes },
            BusError::Backend { op, target, message, .. } => {
                BusError::Backend { op, target: target.clone(), message: message.clone(), source: None }
            }
            BusError::NoSuchQueue { queue } => BusError::NoSuchQueue { queue: queue.clone() },
            BusError::Refused { op, target, code, message } => {
                BusError::Refused { op, target: target.clone(), code: code.clone(), message: message.clone() }
            }
            BusError::Batch { failed, total, first } => {
                BusError::Batch { failed: *failed, total: *total, first: first.clone() }
            }
        }
    }
}

impl BusError {
    /// Sending the same message to the same queue again cannot succeed: the queue is gone or
    /// refuses it for good, or the message is too large.
    pub fn is_permanent(&self) -> bool {
        matches!(self, BusError::TooLarge { .. } | BusError::NoSuchQueue { .. } | BusError::Refused { .. })
    }
}

/// What [`Bus::send_batch`] reports, from the outcome of each entry.
pub(crate) fn batch_outcome(results: Vec<Result<(), BusError>>) -> Result<(), BusError> {
    let total = results.len();
    let mut errors = results.into_iter().filter_map(Result::err);
    let Some(first) = errors.next() else { return Ok(()) };
    Err(BusError::Batch { failed: 1 + errors.count(), total, first: first.to_string() })
}

/// Seconds to delay a message due after `ms`, rounded up, within SQS's limit.
pub fn delay_seconds(ms: u64) -> u32 {
    u32::try_from(ms.div_ceil(1000).min(MAX_DELAY_SECONDS)).unwrap_or(0)
}

/// A FIFO queue's message group and deduplication id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fifo {
    pub group: String,
    pub dedup: String,
}

/// SQS's longest message group and deduplication id.
pub const MAX_FIFO_ID: usize = 128;

/// The FIFO ids of a task's status: group `<task id>`, deduplication id `<task id>-<seq>`. An id
/// that would pass SQS's 128 characters uses `#` and the SHA-256 of the task id (64 hex digits) in
/// place of the task id: still one per task and status, always valid, and never the id of another
/// task (task ids have no `#`).
pub fn reply_fifo(task_id: &str, seq: u64) -> Fifo {
    let mut dedup = format!("{task_id}-{seq}");
    if dedup.len() > MAX_FIFO_ID {
        dedup = format!("{}-{seq}", hashed_id(task_id));
    }
    Fifo { group: task_group(task_id), dedup }
}

/// A task's FIFO message group: its id, or [`hashed_id`] when that is empty or too long.
fn task_group(task_id: &str) -> String {
    if task_id.is_empty() || task_id.len() > MAX_FIFO_ID {
        hashed_id(task_id)
    } else {
        task_id.to_owned()
    }
}

/// `#` and the SHA-256 of a task id in hex: 65 characters, and never a task id.
fn hashed_id(task_id: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("#{}", hex::encode(Sha256::digest(task_id.as_bytes())))
}

/// The FIFO ids of an element's or branch's end for the ends queue: the parent's group (the one
/// [`reply_fifo`] gives its statuses), so that SQS hands one parent's ends to one consumer at a time,
/// and a deduplication id of its own. Never one derived from the end: an element says its end
/// again when its parent's watch looks (the first message may have been dead-lettered, or its
/// handling lost), and SQS would drop that within five minutes of the first.
pub fn end_fifo(parent: &str) -> Fifo {
    Fifo { group: task_group(parent), dedup: uuid::Uuid::new_v4().simple().to_string() }
}

/// The deduplication id of a duplicate-submission status: its own, never a real status's (those
/// end in `-<seq>`), so FIFO queues keep both.
fn duplicate_dedup(task_id: &str, seq: u64) -> String {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let base = reply_fifo(task_id, seq).dedup;
    let id = format!("{base}-dup-{nonce}");
    if id.len() <= MAX_FIFO_ID {
        id
    } else {
        format!("#dup-{nonce}-{seq}")
    }
}

/// One message to send.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outgoing {
    pub body: String,
    pub delay_seconds: u32,
    pub fifo: Option<Fifo>,
    /// String message attributes.
    pub attributes: Vec<(String, String)>,
    /// The X-Ray trace header it carries on (`AWSTraceHeader`): the one of the record whose
    /// handling made it ([`crate::trace`]).
    pub trace_header: Option<String>,
}

impl Outgoing {
    /// A message of the record being handled: it carries that record's trace header.
    pub fn new(body: String) -> Self {
        Outgoing { body, trace_header: crate::trace::current(), ..Outgoing::default() }
    }

    pub fn delayed(body: String, delay_seconds: u32) -> Self {
        Outgoing { delay_seconds, ..Outgoing::new(body) }
    }
}

/// A message as a consumer receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub message_id: String,
    /// What [`Bus::delete`] takes; valid for this receive only.
    pub receipt: String,
    pub body: String,
    /// 1 on the first delivery.
    pub receive_count: u32,
    /// When the message was sent (`SentTimestamp`), if known.
    pub sent_at: Option<Millis>,
    /// Its `AWSTraceHeader`, if any.
    pub trace_header: Option<String>,
}

/// One SQS record, whether from a Lambda event or a ReceiveMessage call.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// SQS's id of the message: the same on every delivery of it.
    pub message_id: String,
    pub body: String,
    /// 1 on the first delivery (`ApproximateReceiveCount`).
    pub receive_count: u32,
    /// When the message was first sent (`SentTimestamp`), if known: the start of its queue wait.
    pub sent_at: Option<Millis>,
    /// Its `AWSTraceHeader` (the X-Ray trace it belongs to), if any.
    pub trace_header: Option<String>,
}

impl Record {
    pub fn new(message_id: impl Into<String>, body: impl Into<String>) -> Self {
        Record { message_id: message_id.into(), body: body.into(), receive_count: 1, sent_at: None, trace_header: None }
    }
}

/// A notification for a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    pub subject: String,
    pub message: String,
    /// String message attributes (subscribers filter on them).
    pub attributes: Vec<(String, String)>,
}

/// Queues and a topic, as the roles and the local runner use them.
pub trait Bus: Send + Sync + std::fmt::Debug {
    fn send<'a>(&'a self, queue: &'a str, msg: Outgoing) -> BoxFuture<'a, Result<(), BusError>>;

    /// Many messages to one queue, in requests of up to [`MAX_BATCH`]. Every chunk is tried even
    /// when one fails; the error counts what was not sent.
    fn send_batch<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Result<(), BusError>>;

    /// Many messages to one queue, in requests of up to [`MAX_BATCH`] (in order: entries to one
    /// FIFO message group keep it), with the outcome of each message, in the order of `msgs`.
    /// A request that fails as a whole fails each of its entries. Every chunk is tried.
    ///
    /// The default sends them one by one with [`Bus::send`].
    fn send_entries<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Vec<Result<(), BusError>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(msgs.len());
            for m in msgs {
                out.push(self.send(queue, m).await);
            }
            out
        })
    }

    fn publish<'a>(&'a self, topic: &'a str, note: Publication) -> BoxFuture<'a, Result<(), BusError>>;

    /// Up to `max` visible messages, hidden for `visibility` afterwards; waits up to `wait` for
    /// the first one.
    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<Vec<Received>, BusError>>;

    /// Delete received messages by their receipts.
    fn delete<'a>(&'a self, queue: &'a str, receipts: Vec<String>) -> BoxFuture<'a, Result<(), BusError>>;
}

/// Serialise a message and check it fits in SQS.
pub fn encode<T: Serialize>(msg: &T) -> Result<String, BusError> {
    // The message types have string keys and no fallible Serialize impls.
    #[allow(clippy::unwrap_in_result)]
    let body = serde_json::to_string(msg).expect("message types serialise");
    if body.len() > SQS_MAX_MESSAGE_BYTES {
        return Err(BusError::TooLarge { bytes: body.len() });
    }
    Ok(body)
}

/// The roles' typed sends onto the stack's queues and topic.
#[derive(Clone, Copy)]
pub struct Outbox<'a> {
    pub bus: &'a dyn Bus,
    pub res: &'a Resources,
}

impl Outbox<'_> {
    /// A message for the Scheduler (a run message, an agent's result, an operator's command).
    /// The end of a map element or branch goes to the ends queue when the stack has one (see
    /// [`end_fifo`]), never delayed (FIFO queues take no per-message delay).
    pub async fn to_scheduler(&self, msg: &SchedulerMessage, delay_seconds: u32) -> Result<(), BusError> {
        if let (SchedulerMessage::ElementEnded(end), Some(ends)) = (msg, &self.res.ends_queue_url) {
            let fifo = Some(end_fifo(end.task_id.as_str()));
            return self.bus.send(ends, Outgoing { fifo, ..Outgoing::new(encode(msg)?) }).await;
        }
        self.bus.send(&self.res.scheduler_queue_url, Outgoing::delayed(encode(msg)?, delay_seconds)).await
    }

    /// Several messages for the Scheduler, batched.
    pub async fn to_scheduler_batch(&self, msgs: Vec<Outgoing>) -> Result<(), BusError> {
        self.bus.send_batch(&self.res.scheduler_queue_url, msgs).await
    }

    pub async fn dispatch(&self, req: &AgentRequest) -> Result<(), BusError> {
        self.bus.send(&self.res.agent_queue_url, Outgoing::new(encode(req)?)).await
    }

    /// An agent request back onto the agent queue, delivered after `delay_seconds`: its agent was
    /// at its `max_in_flight` (see [`crate::limit`]).
    pub async fn dispatch_later(&self, req: &AgentRequest, delay_seconds: u32) -> Result<(), BusError> {
        self.bus.send(&self.res.agent_queue_url, Outgoing::delayed(encode(req)?, delay_seconds)).await
    }

    /// A timer due `grace_ms` after the attempt's CompleteBy (capped at 15 minutes: a timer that
    /// fires early is re-armed by the Supervisor; the scheduled sweep is the backstop).
    pub async fn arm_timer(&self, timer: &TimerMessage, now: Millis, grace_ms: u64) -> Result<(), BusError> {
        let delay = delay_seconds(now.until(timer.complete_by.plus_ms(grace_ms)));
        self.bus.send(&self.res.supervisor_queue_url, Outgoing::delayed(encode(timer)?, delay)).await
    }

    /// A status message to the caller's queue; FIFO queues get the task as message group and
    /// `seq` as deduplication id (see [`reply_fifo`]), so they receive every task's statuses in
    /// order, once.
    pub async fn reply(&self, reply_to: &str, status: &StatusMessage) -> Result<(), BusError> {
        let mut msg = Outgoing::new(encode(status)?);
        if QueueUrl::parse(reply_to).is_ok_and(|q| q.is_fifo()) {
            let mut fifo = reply_fifo(status.task_id.as_str(), status.seq);
            if status.duplicate {
                // It repeats the task's status `seq`: under that status's deduplication id SQS would
                // drop it (or a later real one) for five minutes.
                fifo.dedup = duplicate_dedup(status.task_id.as_str(), status.seq);
            }
            msg.fifo = Some(fifo);
        }
        self.bus.send(reply_to, msg).await
    }

    pub async fn alert(&self, alert: &Alert) -> Result<(), BusError> {
        let kind =
            serde_json::to_value(alert.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        let note = Publication {
            subject: alert.subject(),
            message: serde_json::to_string(alert).expect("alerts serialise"),
            attributes: vec![("kind".into(), kind), ("task_id".into(), alert.task_id.to_string())],
        };
        self.bus.publish(&self.res.alert_topic_arn, note).await
    }

    /// Keep a refused submission: its raw body goes to the submission DLQ with the reason as a
    /// message attribute.
    pub async fn reject_to_dlq(&self, raw: &str, reason: &str, now: Millis) -> Result<(), BusError> {
        let msg = Outgoing {
            body: if raw.is_empty() { "<empty>".to_owned() } else { raw.to_owned() },
            attributes: vec![
                ("RejectReason".into(), crate::screen::attribute_safe(clip(reason, 1024))),
                ("RejectedAt".into(), now.to_string()),
            ],
            ..Outgoing::default()
        };
        self.bus.send(&self.res.submission_dlq_url, msg).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_fifo_ids_are_always_within_sqs_limits_and_distinct() {
        assert_eq!(reply_fifo("order-42", 3), Fifo { group: "order-42".into(), dedup: "order-42-3".into() });
        let d = duplicate_dedup("order-42", 3);
        assert!(d.starts_with("order-42-3-dup-") && d != duplicate_dedup("order-42", 3), "{d}");
        assert!(duplicate_dedup(&"x".repeat(128), 3).len() <= MAX_FIFO_ID);
        let mut seen = std::collections::HashSet::new();
        for len in [1, 100, 116, 117, 118, 126, 127, 128] {
            for id_char in ['a', 'b'] {
                let id: String = std::iter::repeat_n(id_char, len).collect();
                for seq in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
                    let f = reply_fifo(&id, seq);
                    assert!(f.group.len() <= MAX_FIFO_ID && f.dedup.len() <= MAX_FIFO_ID, "{len} {seq}: {f:?}");
                    assert!(seen.insert(f.dedup.clone()), "one dedup id per task and status: {f:?}");
                }
                assert_eq!(reply_fifo(&id, 0).group, reply_fifo(&id, 1).group, "one group per task");
            }
        }
    }

    #[test]
    fn delays_round_up_and_cap() {
        assert_eq!(delay_seconds(0), 0);
        assert_eq!(delay_seconds(1), 1);
        assert_eq!(delay_seconds(1_000), 1);
        assert_eq!(delay_seconds(1_001), 2);
        assert_eq!(delay_seconds(10_000_000), 900);
    }
}
