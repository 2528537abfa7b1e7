//! Scheduler: SchedulerQueue -> claim steps, apply agent results, cancel.
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use sas_functions::{boot, handle_sqs, records, run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let deps = boot().await?;
    run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let deps = deps.clone();
        async move {
            let records = records(event.payload);
            Ok::<SqsBatchResponse, Error>(handle_sqs(&records, |body| sas_core::roles::schedule(&deps, body)).await)
        }
    }))
    .await
}
