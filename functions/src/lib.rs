//! The five Lambda functions as one plain function, [`handle_event`]: parse the invocation's
//! event, hand it to the role, and shape the response. The binaries only build the dependencies
//! once ([`serve`]); tests call [`handle_event`] directly with the fixtures in `events/`.
//!
//! Events, by role:
//! - Submitter, Scheduler, Agent: an SQS batch from their queue's event source mapping; the
//!   response names the records that failed (`ReportBatchItemFailures`), so only those return;
//! - Supervisor: an SQS batch from the supervisor queue (deadline timers), or the EventBridge
//!   scheduled rule's event (`"source": "aws.events"`, `"detail-type": "Scheduled Event"`), which
//!   sweeps the `CompleteBy` index and answers with the [`SweepReport`];
//! - Callback: an SQS batch from the callback queue (each body a `CallbackMessage`), a request to
//!   its function URL (`AuthType: AWS_IAM`; see [`url`]), or a direct invocation whose payload is
//!   a `CallbackMessage` (answered with the `CallbackReply`). Every answer is applied by
//!   `sas_core::callback::answer`; this crate only parses and maps statuses.
//!
//! Any other event is refused with an error (a misconfigured trigger shows as a function error).

pub mod url;

use std::sync::Arc;

use aws_lambda_events::event::lambda_function_urls::{LambdaFunctionUrlRequest, LambdaFunctionUrlResponse};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sas_core::agent::AgentRuntime;
use sas_core::deps::{Deps, HandlerError};
use sas_core::role::{handle_group, process_batch, Record, Role};
use sas_core::supervisor::{self, SweepReport};
use sas_protocol::messages::{CallbackMessage, CallbackReply};
use serde::Deserialize;
use serde_json::Value;

pub use lambda_runtime::{run, service_fn, Error, LambdaEvent};

/// The EventBridge event of a scheduled rule (only the fields that identify it).
#[derive(Debug, Clone, Deserialize)]
pub struct ScheduledEvent {
    pub source: String,
    #[serde(rename = "detail-type")]
    pub detail_type: String,
    #[serde(default)]
    pub resources: Vec<String>,
}

/// What a function was invoked with.
#[derive(Debug, Clone)]
pub enum Invocation {
    Sqs(SqsEvent),
    Scheduled(ScheduledEvent),
    /// A request to the Callback function's URL.
    Url(Box<LambdaFunctionUrlRequest>),
    /// The Callback function invoked directly with a `CallbackMessage`.
    Callback(CallbackMessage),
}

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("the {role} function does not handle this event: {why}")]
    Unrecognised { role: &'static str, why: String },
    /// The sweep did what it could, but part of it failed: reported as a function error, so the
    /// Errors alarm fires (the details are in the log).
    #[error("the sweep met {errors} error(s): {0:?}", errors = .0.errors)]
    Sweep(SweepReport),
    /// A direct invocation's answer could not be applied (`Malformed`: do not retry; anything
    /// else: retry).
    #[error(transparent)]
    Answer(#[from] HandlerError),
}

/// Tell the event apart by its identifying fields, strictly.
pub fn parse_event(role: Role, payload: Value) -> Result<Invocation, EventError> {
    let unrecognised = |why: String| EventError::Unrecognised { role: role.name(), why };
    let is_scheduled = payload.get("source").is_some() && payload.get("detail-type").is_some();
    if is_scheduled {
        if role != Role::Supervisor {
            return Err(unrecognised("only the supervisor runs on a schedule".into()));
        }
        let ev: ScheduledEvent = serde_json::from_value(payload).map_err(|e| unrecognised(e.to_string()))?;
        if ev.source != "aws.events" || ev.detail_type != "Scheduled Event" {
            return Err(unrecognised(format!(
                "an event from {} ({}) is not a scheduled event",
                ev.source, ev.detail_type
            )));
        }
        return Ok(Invocation::Scheduled(ev));
    }
    let is_url = payload.get("requestContext").is_some() && payload.get("rawPath").is_some();
    let is_callback = payload.get("token").is_some() && payload.get("status").is_some();
    if is_url || is_callback {
        if role != Role::Callback {
            return Err(unrecognised("only the callback function serves a URL and takes answers".into()));
        }
        if is_url {
            let req: LambdaFunctionUrlRequest =
                serde_json::from_value(payload).map_err(|e| unrecognised(format!("a function URL request: {e}")))?;
            return Ok(Invocation::Url(Box::new(req)));
        }
        return sas_core::callback::parse(&payload.to_string()).map(Invocation::Callback).map_err(EventError::Answer);
    }
    let ev: SqsEvent = serde_json::from_value(payload)
        .map_err(|e| unrecognised(format!("neither an SQS batch nor a scheduled event: {e}")))?;
    if ev.records.is_empty() {
        return Err(unrecognised("an SQS batch with no records".into()));
    }
    if let Some(src) = ev.records.iter().filter_map(|r| r.event_source.as_deref()).find(|s| *s != "aws:sqs") {
        return Err(unrecognised(format!("records from {src}, not aws:sqs")));
    }
    Ok(Invocation::Sqs(ev))
}

pub fn records(event: SqsEvent) -> Vec<Record> {
    event
        .records
        .into_iter()
        .map(|m| Record {
            receive_count: m.attributes.get("ApproximateReceiveCount").and_then(|n| n.parse().ok()).unwrap_or(1),
            trace_header: m.attributes.get("AWSTraceHeader").cloned(),
            sent_at: m.attributes.get("SentTimestamp").and_then(|n| n.parse().ok()).map(sas_protocol::ids::Millis),
            message_id: m.message_id.unwrap_or_default(),
            body: m.body.unwrap_or_default(),
        })
        .collect()
}

/// `ReportBatchItemFailures`: only the failed records are delivered again.
pub fn batch_response(failed: Vec<String>) -> SqsBatchResponse {
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = failed
        .into_iter()
        .map(|id| {
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            f
        })
        .collect();
    resp
}

/// What a function answers.
#[derive(Debug, Clone)]
pub enum Response {
    Batch(SqsBatchResponse),
    Sweep(SweepReport),
    Http(Box<LambdaFunctionUrlResponse>),
    Reply(CallbackReply),
}

impl Response {
    pub fn to_json(&self) -> Value {
        match self {
            Response::Batch(b) => serde_json::to_value(b).expect("batch responses serialise"),
            Response::Sweep(r) => serde_json::to_value(r).expect("sweep reports serialise"),
            Response::Http(h) => serde_json::to_value(h).expect("URL responses serialise"),
            Response::Reply(r) => serde_json::to_value(r).expect("callback replies serialise"),
        }
    }
}

/// The whole of a function's invocation, for any role.
pub async fn handle_event(
    role: Role,
    deps: &Deps,
    agents: &AgentRuntime,
    payload: Value,
) -> Result<Response, EventError> {
    match parse_event(role, payload)? {
        Invocation::Sqs(ev) => {
            let records = records(ev);
            let failed = process_batch(role, &records, |rs| handle_group(deps, agents, rs)).await;
            Ok(Response::Batch(batch_response(failed)))
        }
        Invocation::Scheduled(_) => {
            let report = supervisor::sweep(deps).await;
            if report.errors > 0 {
                return Err(EventError::Sweep(report));
            }
            Ok(Response::Sweep(report))
        }
        Invocation::Url(req) => Ok(Response::Http(Box::new(url::handle(deps, &req).await))),
        Invocation::Callback(msg) => Ok(Response::Reply(sas_core::callback::answer(deps, &msg, None).await?)),
    }
}

/// The agents of the file `SAS_AGENTS_FILE` names (the Agent function: `/opt/agents.json`, the
/// configuration layer's), or the built-in ones; an invalid file's error names it (a malformed
/// `AgentVariables` is no fault of the file, and says so itself).
fn agents_from_env() -> Result<AgentRuntime, Error> {
    AgentRuntime::from_env().map_err(|e| {
        let file = std::env::var("SAS_AGENTS_FILE").ok().filter(|f| !f.is_empty());
        match file {
            Some(path)
                if !matches!(
                    e,
                    sas_core::agent::AgentConfigError::Io { .. } | sas_core::agent::AgentConfigError::Variables(_)
                ) =>
            {
                format!("agent file {path} is not valid: {e}").into()
            }
            _ => e.into(),
        }
    })
}

/// A function's `main`: logs and clients built once per cold start, then every event through
/// [`handle_event`]. Roles other than the Agent host no agents: only `sas-agent` calls
/// [`serve_agents`], so only its binary links the agent kinds and their SDK clients. A
/// configuration it cannot use (a missing or invalid workflows or agents file: the error names it)
/// is logged and ends the process: the start fails, nothing runs with other definitions.
pub async fn serve(role: Role) -> Result<(), Error> {
    serve_with(role, || Ok(AgentRuntime::default())).await
}

/// The Agent function's `main`: [`serve`] with the agents of its configuration
/// (`SAS_AGENTS_FILE`, or the built-in file).
pub async fn serve_agents() -> Result<(), Error> {
    serve_with(Role::Agent, agents_from_env).await
}

async fn serve_with(role: Role, agents: impl FnOnce() -> Result<AgentRuntime, Error>) -> Result<(), Error> {
    sas_core::telemetry::init();
    sas_core::telemetry::init_metrics();
    let started = async {
        let deps = Deps::from_env().await?;
        let agents = agents()?;
        Ok::<_, Error>((Arc::new(deps), Arc::new(agents)))
    };
    let (deps, agents) = match started.await {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(role = ?role, error = %e, "cannot start");
            return Err(e);
        }
    };
    run(service_fn(move |event: LambdaEvent<Value>| {
        let (deps, agents) = (deps.clone(), agents.clone());
        async move {
            let answer = handle_event(role, &deps, &agents, event.payload).await;
            // One EMF record per dimension set this invocation used, before its answer.
            sas_core::telemetry::flush_metrics();
            Ok::<Value, Error>(answer?.to_json())
        }
    }))
    .await
}
