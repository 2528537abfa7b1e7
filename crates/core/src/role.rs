//! The five roles by name, and the dispatch every host uses: the Lambda binaries, the local
//! runner and the tests hand a queue's records to [`handle`] through [`process_batch`].

use futures::future::BoxFuture;
use tracing::{error, info_span, warn, Instrument};

use crate::agent::{self, AgentRuntime};
use crate::bus::Outgoing;
pub use crate::bus::Record;
use crate::config::Resources;
use crate::deps::{Deps, HandlerError};
use crate::ids::clip;
use crate::screen;
use crate::{callback, scheduler, submitter, supervisor};

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

/// Call the handler a role's queue feeds, for one message.
pub fn handle<'a>(
    role: Role,
    deps: &'a Deps,
    agents: &'a AgentRuntime,
    record: &'a Record,
) -> BoxFuture<'a, Result<(), HandlerError>> {
    let body = record.body.as_str();
    let span = record_span(role, record);
    let handling = async move {
        let handled = match role {
            Role::Submitter => submitter::submit_message(deps, record).await.map(drop),
            Role::Scheduler => scheduler::handle(deps, record).await.map(drop),
            Role::Agent => agent::handle_sent(deps, agents, body, record.sent_at).await.map(drop),
            Role::Supervisor => supervisor::handle(deps, record).await.map(drop),
            Role::Callback => answer_record(deps, record).await,
        };
        match (handled, role.dead_letter_queue(&deps.resources)) {
            // A message that can never be handled is kept in its DLQ with the reason at once,
            // instead of failing maxReceiveCount times first.
            (Err(e @ (HandlerError::Malformed(_) | HandlerError::Unstorable(_))), Some(dlq)) => {
                let reason = e.to_string();
                if matches!(e, HandlerError::Malformed(_)) {
                    warn!(role = role.name(), %reason, "malformed message moved to its DLQ");
                } else {
                    warn!(role = role.name(), %reason, "a message whose task cannot be stored moved to its DLQ");
                }
                let msg = Outgoing {
                    body: if body.is_empty() { "<empty>".to_owned() } else { body.to_owned() },
                    attributes: vec![
                        ("RejectReason".into(), screen::attribute_safe(clip(&reason, 1024))),
                        ("RejectedAt".into(), deps.now().to_string()),
                    ],
                    ..Outgoing::default()
                };
                deps.bus.send(dlq, msg).await.map_err(HandlerError::from)
            }
            (other, _) => other,
        }
    };
    Box::pin(crate::trace::scope(record.trace_header.clone(), handling.instrument(span)))
}

/// The fields every log line of a record's handling carries (JSON logs: under `span`): its role,
/// its SQS message id, and the task, step and attempt its body names.
fn record_span(role: Role, record: &Record) -> tracing::Span {
    #[derive(serde::Deserialize)]
    struct Names {
        task_id: Option<String>,
        step: Option<String>,
        attempt_no: Option<u32>,
    }
    let n = serde_json::from_str::<Names>(&record.body).ok();
    let n = n.as_ref();
    tracing::info_span!(
        "record",
        role = role.name(),
        message_id = %record.message_id,
        task_id = n.and_then(|n| n.task_id.as_deref()),
        step = n.and_then(|n| n.step.as_deref()),
        attempt = n.and_then(|n| n.attempt_no),
    )
}

/// One callback queue message: a `CallbackMessage`, applied by [`callback::answer`] (which logs
/// what it did; the sender is not there to hear it). An answer that changed nothing (stale, late,
/// unknown) is still handled: delivering it again would not change that.
async fn answer_record(deps: &Deps, record: &Record) -> Result<(), HandlerError> {
    let msg = callback::parse(&record.body)?;
    callback::answer(deps, &msg, Some(&record.message_id)).await.map(drop)
}

/// Handle a batch the way an SQS-triggered Lambda with `ReportBatchItemFailures` does: every record
/// concurrently, each in its own span; the ids of the records that failed are returned, so only
/// those are delivered again.
pub async fn process_batch<'a, F, Fut, T>(records: &'a [Record], handler: F) -> Vec<String>
where
    F: Fn(&'a Record) -> Fut,
    Fut: std::future::Future<Output = Result<T, HandlerError>>,
{
    let runs = records.iter().map(|r| {
        let span = info_span!("record", message_id = %r.message_id);
        let fut = handler(r);
        async move {
            match fut.await {
                Ok(_) => None,
                Err(e) => {
                    error!(error = %e, "record failed; SQS will deliver it again");
                    Some(r.message_id.clone())
                }
            }
        }
        .instrument(span)
    });
    futures::future::join_all(runs).await.into_iter().flatten().collect()
}
