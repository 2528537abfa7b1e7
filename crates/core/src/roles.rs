//! The four roles as plain async functions: parse a message, load the task, let
//! [`protocol::apply`] decide, write conditionally, perform the effects. The Lambda binaries and
//! the local runner call exactly these.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::agents::AgentRuntime;
use crate::bus::Bus;
use crate::config::{ConfigError, Resources, Settings};
use crate::ids::{IdError, Millis, TaskId};
use crate::messages::{
    AgentRequest, Outcome, QueueUrl, QueueUrlError, SchedulerMessage, StatusMessage, Submission, TimerMessage, VERSION,
};
use crate::protocol::{self, Ctx, Event, HistoryEntry, ProcessState, Stale, Task};
use crate::store::{StoreError, TaskStore};
use crate::workflow::{WorkflowError, WorkflowRegistry};

/// Everything a role needs, built once per process.
#[derive(Debug, Clone)]
pub struct Deps {
    pub store: TaskStore,
    pub bus: Bus,
    pub workflows: Arc<WorkflowRegistry>,
    pub settings: Settings,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
}

impl Deps {
    pub fn new(sdk: &aws_config::SdkConfig, res: Resources, workflows: WorkflowRegistry, settings: Settings) -> Self {
        let store = TaskStore::new(
            aws_sdk_dynamodb::Client::new(sdk),
            res.task_table.clone(),
            res.shards,
            settings.retention_days,
        );
        let bus = Bus::new(aws_sdk_sqs::Client::new(sdk), aws_sdk_sns::Client::new(sdk), res);
        Deps { store, bus, workflows: Arc::new(workflows), settings }
    }

    /// The Lambda composition root: resources and settings from the environment.
    pub async fn from_env() -> Result<Self, SetupError> {
        let sdk = crate::aws::load_sdk_config().await;
        Ok(Self::new(&sdk, Resources::from_env()?, WorkflowRegistry::from_env()?, Settings::from_env()?))
    }
}

/// Why a message could not be handled. `retryable` errors make the record fail, so SQS delivers it
/// again (and, after maxReceiveCount, moves it to the DLQ).
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] crate::bus::BusError),
    #[error("the task kept changing under us ({0} conflicting writes)")]
    Contended(u32),
}

/// What happened to one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    Changed {
        state: ProcessState,
        rev: u64,
    },
    Stale(Stale),
    /// The task does not exist (deleted, or never created).
    Missing,
}

const MAX_CONFLICTS: u32 = 5;

/// Apply `event` to `task` and commit it: the single place where transitions are written. A lost
/// conditional write re-decides on the current item that DynamoDB returned with the failure.
pub async fn drive(deps: &Deps, task: Task, event: &Event) -> Result<Applied, HandlerError> {
    let (applied, committed) = commit(deps, task, event).await?;
    if let Some(c) = committed {
        deps.bus.perform(&c.task, c.effects, c.now).await;
    }
    Ok(applied)
}

/// A written transition whose effects are still to be performed.
#[derive(Debug)]
pub struct Committed {
    pub task: Task,
    pub effects: Vec<crate::protocol::Effect>,
    pub now: Millis,
}

/// Decide and write, without performing the effects (the caller does, possibly batched).
async fn commit(deps: &Deps, mut task: Task, event: &Event) -> Result<(Applied, Option<Committed>), HandlerError> {
    for _ in 0..MAX_CONFLICTS {
        let ctx = Ctx::new(Millis::now());
        let tr = match protocol::apply(&task, event, &ctx, &deps.settings.policy) {
            Ok(tr) => tr,
            Err(stale) => {
                info!(task_id = %task.task_id, event = event.name(), state = %task.process_state, reason = %stale, "stale event dropped");
                return Ok((Applied::Stale(stale), None));
            }
        };
        match deps.store.save(&tr.task, &task).await {
            Ok(()) => {
                let (state, rev) = (tr.task.process_state, tr.task.rev);
                info!(
                    task_id = %task.task_id, event = event.name(), from = %task.process_state, to = %state,
                    step = tr.task.current_step_name().unwrap_or("-"), failure_count = tr.task.failure_count, rev,
                    "transition"
                );
                let committed = Committed { task: tr.task, effects: tr.effects, now: ctx.now };
                return Ok((Applied::Changed { state, rev }, Some(committed)));
            }
            Err(StoreError::Conflict { current: Some(current) }) => {
                debug!(task_id = %task.task_id, event = event.name(), "conditional write lost; re-deciding on the current item");
                task = *current;
            }
            Err(StoreError::Conflict { current: None }) => return Ok((Applied::Missing, None)),
            Err(e) => return Err(e.into()),
        }
    }
    Err(HandlerError::Contended(MAX_CONFLICTS))
}

async fn load_and_drive(deps: &Deps, task_id: &TaskId, event: &Event) -> Result<Applied, HandlerError> {
    if let Some(task) = deps.store.get(task_id).await? {
        drive(deps, task, event).await
    } else {
        warn!(%task_id, event = event.name(), "no such task; message dropped");
        Ok(Applied::Missing)
    }
}

// ---- Submitter ------------------------------------------------------------------------------

/// Why a submission was refused. The reason is sent to the caller and kept with the raw message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejection {
    #[error("the message is not JSON: {0}")]
    NotJson(String),
    #[error("the message must be a JSON object")]
    NotObject,
    #[error("unsupported message version {got}; this deployment accepts v={VERSION}")]
    Version { got: String },
    #[error("the submission does not match the contract: {0}")]
    Shape(String),
    #[error("invalid task_id: {0}")]
    TaskId(#[from] IdError),
    #[error("unknown workflow {name}{}", version.map(|v| format!(" version {v}")).unwrap_or_default())]
    UnknownWorkflow { name: String, version: Option<u32> },
    #[error("input is {bytes} bytes; the limit is {limit}")]
    TooLarge { bytes: usize, limit: usize },
    #[error(transparent)]
    ReplyTo(#[from] QueueUrlError),
}

/// The submitter's verdict on one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created(TaskId),
    Duplicate(TaskId),
    Rejected(Rejection),
}

fn validate(deps: &Deps, raw: &str) -> Result<(Submission, TaskId), Rejection> {
    let v: Value = serde_json::from_str(raw).map_err(|e| Rejection::NotJson(e.to_string()))?;
    let obj = v.as_object().ok_or(Rejection::NotObject)?;
    match obj.get("v") {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(VERSION)) => {}
        other => {
            let got = other.map_or_else(|| "(missing)".to_owned(), Value::to_string);
            return Err(Rejection::Version { got: crate::ids::clip(&got, 64).to_owned() });
        }
    }
    let sub: Submission =
        serde_json::from_value(v).map_err(|e| Rejection::Shape(crate::ids::clip(&e.to_string(), 300).to_owned()))?;
    if let Some(r) = &sub.reply_to {
        QueueUrl::parse(r)?;
    }
    let bytes = serde_json::to_vec(&sub.input).map_or(0, |b| b.len());
    if bytes > deps.settings.max_input_bytes {
        return Err(Rejection::TooLarge { bytes, limit: deps.settings.max_input_bytes });
    }
    if deps.workflows.resolve(&sub.workflow, sub.workflow_version).is_none() {
        let name = crate::ids::clip(&sub.workflow, 64).to_owned();
        return Err(Rejection::UnknownWorkflow { name, version: sub.workflow_version });
    }
    let id = sub.task_id.clone().unwrap_or_else(TaskId::generate);
    Ok((sub, id))
}

/// Best effort for a refused message: whatever `task_id` and `reply_to` it names, if usable.
fn salvage(raw: &str) -> (Option<TaskId>, Option<QueueUrl>) {
    let Ok(v) = serde_json::from_str::<Value>(raw) else { return (None, None) };
    let id = v.get("task_id").and_then(Value::as_str).and_then(|s| TaskId::try_from(s).ok());
    let reply = v.get("reply_to").and_then(Value::as_str).and_then(|s| QueueUrl::parse(s).ok());
    (id, reply)
}

/// Submitter: validate, create the task idempotently, hand it to the Scheduler. A refused message
/// is kept in the submission DLQ with its reason and answered with a `Rejected` status when it
/// names a usable reply queue; it is never retried.
pub async fn submit(deps: &Deps, raw: &str) -> Result<Submitted, HandlerError> {
    let (sub, task_id) = match validate(deps, raw) {
        Ok(ok) => ok,
        Err(rejection) => {
            let reason = rejection.to_string();
            let (id, reply) = salvage(raw);
            warn!(task_id = id.as_ref().map(TaskId::as_str), %reason, "submission rejected");
            deps.bus.reject_to_dlq(raw, &reason).await?;
            if let Some(q) = reply {
                let status = StatusMessage::new(
                    &id.unwrap_or_else(|| TaskId::try_from("unknown").expect("valid id")),
                    &HistoryEntry {
                        seq: 0,
                        state: ProcessState::Rejected,
                        step: None,
                        failure_count: 0,
                        reason: Some(reason.clone()),
                        at: Millis::now(),
                    },
                );
                if let Err(e) = deps.bus.reply(q.as_str(), &status).await {
                    warn!(error = %e, "could not send the Rejected status");
                }
            }
            return Ok(Submitted::Rejected(rejection));
        }
    };
    let def = deps.workflows.resolve(&sub.workflow, sub.workflow_version).expect("validated").clone();
    let now = Millis::now();
    let tr = protocol::submit(task_id.clone(), def, sub.input, sub.reply_to, now, &deps.settings.policy);
    match deps.store.create(&tr.task).await {
        Ok(()) => {
            info!(%task_id, workflow = %tr.task.workflow.name, version = tr.task.workflow.version, "task created");
            deps.bus.perform(&tr.task, tr.effects, now).await;
            Ok(Submitted::Created(task_id))
        }
        Err(StoreError::AlreadyExists) => {
            info!(%task_id, "duplicate submission: the task exists, nothing created");
            Ok(Submitted::Duplicate(task_id))
        }
        Err(StoreError::TooLarge { bytes }) => {
            let rejection = Rejection::TooLarge { bytes, limit: crate::store::MAX_ITEM_BYTES };
            deps.bus.reject_to_dlq(raw, &rejection.to_string()).await?;
            Ok(Submitted::Rejected(rejection))
        }
        Err(e) => Err(e.into()),
    }
}

// ---- Scheduler ------------------------------------------------------------------------------

/// Scheduler: run messages (claim the current step), agent results, and the operator's cancel and
/// resubmit.
pub async fn schedule(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    let msg: SchedulerMessage = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    if msg.version() != VERSION {
        return Err(HandlerError::Malformed(format!("unsupported version {}", msg.version())));
    }
    let event = match &msg {
        SchedulerMessage::Run(m) => Event::Claim { rev: m.rev },
        SchedulerMessage::Result(r) => match &r.outcome {
            Outcome::Succeeded { output } => {
                Event::AgentSucceeded { attempt: r.attempt.clone(), output: output.clone() }
            }
            Outcome::Failed { error, retryable } => {
                Event::AgentFailed { attempt: r.attempt.clone(), error: error.clone(), retryable: *retryable }
            }
        },
        SchedulerMessage::Cancel(c) => Event::Cancel { reason: c.reason.clone() },
        SchedulerMessage::Resubmit(r) => Event::Resubmit { reason: r.reason.clone() },
    };
    load_and_drive(deps, msg.task_id(), &event).await
}

// ---- Agent ----------------------------------------------------------------------------------

/// Agent: run one attempt and report its result to the Scheduler, unless CompleteBy has passed.
pub async fn agent(deps: &Deps, runtime: &AgentRuntime, raw: &str) -> Result<bool, HandlerError> {
    let req: AgentRequest = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    if req.v != VERSION {
        return Err(HandlerError::Malformed(format!("unsupported version {}", req.v)));
    }
    let span = info_span!("agent", task_id = %req.task_id, step = %req.step, attempt_no = req.attempt_no);
    async {
        let Some(result) = runtime.run(&req).await else { return Ok(false) };
        if Millis::now() >= req.complete_by {
            info!("CompleteBy passed: result not sent");
            return Ok(false);
        }
        let msg = SchedulerMessage::Result(result);
        deps.bus.send(&deps.bus.resources().scheduler_queue_url, &msg, 0).await?;
        Ok(true)
    }
    .instrument(span)
    .await
}

// ---- Supervisor -----------------------------------------------------------------------------

/// Supervisor, precise path: a timer message due at one attempt's CompleteBy.
pub async fn timer(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    let t: TimerMessage = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    let Some(task) = deps.store.get(&t.task_id).await? else { return Ok(Applied::Missing) };
    if task.locked_by.as_ref() != Some(&t.attempt) {
        debug!(task_id = %t.task_id, "timer for an attempt that is no longer current");
        return Ok(Applied::Stale(Stale::NotCurrentAttempt));
    }
    let now = Millis::now();
    if let Some(cb) = task.complete_by.filter(|cb| *cb > now) {
        // Due later than one SQS delay can reach: wait again.
        deps.bus.arm_timer(&TimerMessage { complete_by: cb, ..t }, now).await?;
        return Ok(Applied::Stale(Stale::NotExpired { complete_by: cb, now }));
    }
    drive(deps, task, &Event::DeadlineExpired).await
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub expired: usize,
    pub recovered: usize,
    pub stale: usize,
    pub errors: usize,
}

/// Supervisor, backstop: query every shard of the sparse `ByCompleteBy` index for
/// `CompleteBy <= now`, page by page, and recover each task with a conditional write. Two
/// supervisors racing recover each task once: the loser's write fails its condition and re-decides.
pub async fn sweep(deps: &Deps) -> SweepReport {
    let now = Millis::now();
    let shards = (0..deps.store.shards()).map(|shard| sweep_shard(deps, shard, now));
    let mut total = SweepReport::default();
    for r in futures::future::join_all(shards).await {
        total.expired += r.expired;
        total.recovered += r.recovered;
        total.stale += r.stale;
        total.errors += r.errors;
    }
    if total.expired > 0 || total.errors > 0 {
        info!(
            expired = total.expired,
            recovered = total.recovered,
            stale = total.stale,
            errors = total.errors,
            "sweep"
        );
    }
    total
}

async fn sweep_shard(deps: &Deps, shard: u32, now: Millis) -> SweepReport {
    let mut report = SweepReport::default();
    let mut start = None;
    loop {
        let page = match deps.store.expired(shard, now, deps.settings.sweep_page_size, start).await {
            Ok(p) => p,
            Err(e) => {
                error!(shard, error = %e, "supervisor query failed");
                report.errors += 1;
                return report;
            }
        };
        // Recover the page's tasks concurrently, then send their run messages in batches of ten.
        report.expired += page.tasks.len();
        let commits = futures::stream::iter(page.tasks)
            .map(|task| commit(deps, task, &Event::DeadlineExpired))
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        let mut done = Vec::new();
        for c in commits {
            match c {
                Ok((Applied::Changed { .. }, Some(c))) => {
                    report.recovered += 1;
                    done.push(c);
                }
                Ok(_) => report.stale += 1,
                Err(e) => {
                    error!(error = %e, "recovery failed; the next sweep retries");
                    report.errors += 1;
                }
            }
        }
        deps.bus.perform_many(done).await;
        match page.next {
            Some(k) => start = Some(k),
            None => return report,
        }
    }
}

// ---- SQS batches ----------------------------------------------------------------------------

/// One SQS record, whether from a Lambda event or a ReceiveMessage call.
#[derive(Debug, Clone)]
pub struct Record {
    pub message_id: String,
    pub body: String,
}

/// Handle a batch the way an SQS-triggered Lambda with `ReportBatchItemFailures` does: every record
/// concurrently, each in its own span; the ids of the records that failed are returned, so only
/// those are delivered again.
pub async fn process_batch<'a, F, Fut, T>(records: &'a [Record], handler: F) -> Vec<String>
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = Result<T, HandlerError>>,
{
    let runs = records.iter().map(|r| {
        let span = info_span!("record", message_id = %r.message_id);
        let fut = handler(&r.body);
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
