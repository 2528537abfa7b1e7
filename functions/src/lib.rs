//! Glue shared by the four Lambda binaries: build the dependencies once, turn an SQS event into
//! records for [`sas_core::roles::process_batch`], and report partial batch failures.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sas_core::agents::AgentRuntime;
use sas_core::roles::{process_batch, Deps, HandlerError, Record};
use sas_core::runner::{self, Role};

pub use lambda_runtime::{run, service_fn, Error, LambdaEvent};

/// The composition root of every function: logs, clients, configuration. Once per cold start.
pub async fn boot() -> Result<Arc<Deps>, Error> {
    sas_core::telemetry::init();
    Ok(Arc::new(Deps::from_env().await?))
}

pub fn records(event: SqsEvent) -> Vec<Record> {
    event
        .records
        .into_iter()
        .map(|m| Record { message_id: m.message_id.unwrap_or_default(), body: m.body.unwrap_or_default() })
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

/// Handle an SQS event with `handler`, one future per record.
pub async fn handle_sqs<'a, F, Fut, T>(records: &'a [Record], handler: F) -> SqsBatchResponse
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = Result<T, HandlerError>>,
{
    batch_response(process_batch(records, handler).await)
}

/// The whole of an SQS-triggered function: boot once, then hand every record of every event to
/// the role's handler through [`runner::handle`], the dispatcher the local runner uses too.
pub async fn serve(role: Role) -> Result<(), Error> {
    let deps = boot().await?;
    let agents = Arc::new(if role == Role::Agent { AgentRuntime::from_env()? } else { AgentRuntime::default() });
    run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let (deps, agents) = (deps.clone(), agents.clone());
        async move {
            let records = records(event.payload);
            Ok::<SqsBatchResponse, Error>(handle_sqs(&records, |body| runner::handle(role, &deps, &agents, body)).await)
        }
    }))
    .await
}
