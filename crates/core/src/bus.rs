//! Outbound messages: SQS sends between the roles, status messages to callers' reply queues,
//! operator alerts on SNS, and the effects of a transition in the order the protocol requires.

use aws_sdk_sns::types::MessageAttributeValue as SnsAttr;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use serde::Serialize;
use tracing::{info, warn};

use crate::config::Resources;
use crate::ids::Millis;
use crate::messages::{
    AgentRequest, Alert, QueueUrl, RunMessage, RunReason, SchedulerMessage, StatusMessage, TimerMessage,
    SQS_MAX_MESSAGE_BYTES, VERSION,
};
use crate::protocol::{Effect, Task};

/// SQS's longest per-message delay.
pub const MAX_DELAY_SECONDS: u64 = 900;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("message is {bytes} bytes; SQS accepts at most {SQS_MAX_MESSAGE_BYTES}")]
    TooLarge { bytes: usize },
    #[error("SQS {op} to {queue}: {}", aws_sdk_sqs::error::DisplayErrorContext(source.as_ref()))]
    Sqs {
        op: &'static str,
        queue: String,
        #[source]
        source: Box<aws_sdk_sqs::Error>,
    },
    #[error("SNS Publish: {}", aws_sdk_sns::error::DisplayErrorContext(.0.as_ref()))]
    Sns(#[source] Box<aws_sdk_sns::Error>),
    #[error("{failed} of {total} batch entries failed: {first}")]
    Batch { failed: usize, total: usize, first: String },
}

/// Seconds to delay a message due after `ms`, rounded up, within SQS's limit.
pub fn delay_seconds(ms: u64) -> i32 {
    i32::try_from(ms.div_ceil(1000).min(MAX_DELAY_SECONDS)).unwrap_or(0)
}

#[derive(Debug, Clone)]
pub struct Bus {
    sqs: aws_sdk_sqs::Client,
    sns: aws_sdk_sns::Client,
    res: Resources,
}

/// One message for [`Bus::send_batch`].
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub body: String,
    pub delay_seconds: i32,
}

impl Bus {
    pub fn new(sqs: aws_sdk_sqs::Client, sns: aws_sdk_sns::Client, res: Resources) -> Self {
        Bus { sqs, sns, res }
    }

    pub fn sqs(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }

    pub fn resources(&self) -> &Resources {
        &self.res
    }

    fn encode<T: Serialize>(msg: &T) -> Result<String, BusError> {
        let body = serde_json::to_string(msg).expect("message types serialise");
        if body.len() > SQS_MAX_MESSAGE_BYTES {
            return Err(BusError::TooLarge { bytes: body.len() });
        }
        Ok(body)
    }

    pub async fn send_raw(
        &self,
        queue: &str,
        body: String,
        delay_seconds: i32,
        fifo_group: Option<(&str, String)>,
    ) -> Result<(), BusError> {
        let mut req = self.sqs.send_message().queue_url(queue).message_body(body);
        if let Some((group, dedup)) = fifo_group {
            req = req.message_group_id(group).message_deduplication_id(dedup);
        } else if delay_seconds > 0 {
            req = req.delay_seconds(delay_seconds);
        }
        req.send().await.map_err(|e| BusError::Sqs {
            op: "SendMessage",
            queue: queue.to_owned(),
            source: Box::new(e.into()),
        })?;
        Ok(())
    }

    pub async fn send<T: Serialize>(&self, queue: &str, msg: &T, delay_seconds: i32) -> Result<(), BusError> {
        self.send_raw(queue, Self::encode(msg)?, delay_seconds, None).await
    }

    /// Up to ten messages to one queue in one request (SendMessageBatch).
    pub async fn send_batch(&self, queue: &str, msgs: Vec<Outgoing>) -> Result<(), BusError> {
        for chunk in msgs.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(m.body.clone())
                        .delay_seconds(m.delay_seconds)
                        .build()
                        .expect("id and body are set")
                })
                .collect();
            let out = self.sqs.send_message_batch().queue_url(queue).set_entries(Some(entries)).send().await.map_err(
                |e| BusError::Sqs { op: "SendMessageBatch", queue: queue.to_owned(), source: Box::new(e.into()) },
            )?;
            if !out.failed.is_empty() {
                return Err(BusError::Batch {
                    failed: out.failed.len(),
                    total: chunk.len(),
                    first: out.failed[0].message.clone().unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    pub fn run_message(task: &Task, rev: u64, reason: RunReason) -> SchedulerMessage {
        SchedulerMessage::Run(RunMessage { v: VERSION, task_id: task.task_id.clone(), rev, reason })
    }

    pub async fn send_run(&self, task: &Task, rev: u64, delay_ms: u64, reason: RunReason) -> Result<(), BusError> {
        let msg = Self::run_message(task, rev, reason);
        self.send(&self.res.scheduler_queue_url, &msg, delay_seconds(delay_ms)).await
    }

    pub async fn dispatch(&self, req: &AgentRequest) -> Result<(), BusError> {
        self.send(&self.res.agent_queue_url, req, 0).await
    }

    /// A timer due at the attempt's CompleteBy (capped at 15 minutes: a timer that fires early is
    /// re-armed by the Supervisor; the scheduled sweep is the backstop).
    pub async fn arm_timer(&self, timer: &TimerMessage, now: Millis) -> Result<(), BusError> {
        let delay = delay_seconds(now.until(timer.complete_by));
        self.send(&self.res.supervisor_queue_url, timer, delay).await
    }

    /// A status message to the caller's queue; FIFO queues get the task as message group and
    /// `seq` as deduplication id, so they receive every task's statuses in order, once.
    pub async fn reply(&self, reply_to: &str, status: &StatusMessage) -> Result<(), BusError> {
        let body = Self::encode(status)?;
        let fifo = QueueUrl::parse(reply_to).is_ok_and(|q| q.is_fifo());
        let group = fifo.then(|| (status.task_id.as_str(), format!("{}-{}", status.task_id, status.seq)));
        self.send_raw(reply_to, body, 0, group).await
    }

    pub async fn alert(&self, alert: &Alert) -> Result<(), BusError> {
        let attr = |v: &str| SnsAttr::builder().data_type("String").string_value(v).build().expect("type is set");
        let kind =
            serde_json::to_value(alert.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        self.sns
            .publish()
            .topic_arn(&self.res.alert_topic_arn)
            .subject(alert.subject())
            .message(serde_json::to_string(alert).expect("alerts serialise"))
            .message_attributes("kind", attr(&kind))
            .message_attributes("task_id", attr(alert.task_id.as_str()))
            .send()
            .await
            .map_err(|e| BusError::Sns(Box::new(e.into())))?;
        Ok(())
    }

    /// Keep a refused submission: its raw body goes to the submission DLQ with the reason as a
    /// message attribute.
    pub async fn reject_to_dlq(&self, raw: &str, reason: &str) -> Result<(), BusError> {
        let attr = |v: &str| {
            MessageAttributeValue::builder().data_type("String").string_value(v).build().expect("type is set")
        };
        let reason = crate::ids::clip(reason, 1024);
        self.sqs
            .send_message()
            .queue_url(&self.res.submission_dlq_url)
            .message_body(if raw.is_empty() { "<empty>" } else { raw })
            .message_attributes("RejectReason", attr(reason))
            .message_attributes("RejectedAt", attr(&Millis::now().to_string()))
            .send()
            .await
            .map_err(|e| BusError::Sqs {
                op: "SendMessage",
                queue: self.res.submission_dlq_url.clone(),
                source: Box::new(e.into()),
            })?;
        Ok(())
    }

    /// Perform the effects of several committed transitions (a supervisor sweep's page): each task's
    /// notifications and other work as [`Bus::perform`] does, and all their run messages to the
    /// scheduler queue in batches of ten (SendMessageBatch), after every notification.
    pub async fn perform_many(&self, done: Vec<crate::roles::Committed>) -> usize {
        let mut failed = 0;
        let mut runs = Vec::new();
        for c in done {
            let (run, rest): (Vec<_>, Vec<_>) = c.effects.into_iter().partition(|e| matches!(e, Effect::Run { .. }));
            failed += self.perform(&c.task, rest, c.now).await;
            for e in run {
                if let Effect::Run { rev, delay_ms, reason } = e {
                    let body = Self::encode(&Self::run_message(&c.task, rev, reason)).expect("run messages are small");
                    runs.push(Outgoing { body, delay_seconds: delay_seconds(delay_ms) });
                }
            }
        }
        let n = runs.len();
        if n > 0 {
            if let Err(e) = self.send_batch(&self.res.scheduler_queue_url, runs).await {
                failed += n;
                warn!(error = %e, messages = n, "run messages not delivered; the next sweep recovers those tasks again");
            }
        }
        failed
    }

    /// Perform a committed transition's effects: notifications first, then work. A failed send is
    /// logged, not retried here: the task is already written with a CompleteBy, so the Supervisor
    /// recovers anything a lost message would have moved. Returns how many sends failed.
    pub async fn perform(&self, task: &Task, effects: Vec<Effect>, now: Millis) -> usize {
        let (notes, work): (Vec<_>, Vec<_>) = effects.into_iter().partition(Effect::is_notification);
        let mut failed = 0;
        // Within a group the sends go to different queues and need no order: send them together.
        for group in [notes, work] {
            let results = futures::future::join_all(group.iter().map(|e| self.perform_one(task, e, now))).await;
            for (e, r) in group.iter().zip(results) {
                match r {
                    Ok(()) => {
                        if let Effect::Alert(a) = e {
                            info!(task_id = %task.task_id, kind = ?a.kind, "operator alert published");
                        }
                    }
                    Err(err) => {
                        failed += 1;
                        warn!(task_id = %task.task_id, effect = e.name(), error = %err, "effect not delivered; the supervisor will recover the task if it stalls");
                    }
                }
            }
        }
        failed
    }

    async fn perform_one(&self, task: &Task, e: &Effect, now: Millis) -> Result<(), BusError> {
        match e {
            Effect::Reply(s) => match &task.reply_to {
                Some(q) => self.reply(q, s).await,
                None => Ok(()),
            },
            Effect::Alert(a) => self.alert(a).await,
            Effect::Run { rev, delay_ms, reason } => self.send_run(task, *rev, *delay_ms, *reason).await,
            Effect::Dispatch(r) => self.dispatch(r).await,
            Effect::ArmTimer(t) => self.arm_timer(t, now).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_and_cap() {
        assert_eq!(delay_seconds(0), 0);
        assert_eq!(delay_seconds(1), 1);
        assert_eq!(delay_seconds(1_000), 1);
        assert_eq!(delay_seconds(1_001), 2);
        assert_eq!(delay_seconds(10_000_000), 900);
    }
}
