//! Glue shared by the four Lambda binaries: build the dependencies once, turn an SQS event into
//! records for [`sas_core::roles::process_batch`], and report partial batch failures.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sas_core::roles::{process_batch, Deps, HandlerError, Record};

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
