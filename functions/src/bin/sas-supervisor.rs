//! Supervisor: the scheduled rule (sweep the CompleteBy index) and SupervisorQueue (precise
//! deadline timers). One function, two event shapes.
use aws_lambda_events::event::sqs::SqsEvent;
use sas_core::runner::Role;
use sas_functions::{boot, handle_sqs, records, run, service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let deps = boot().await?;
    run(service_fn(|event: LambdaEvent<Value>| {
        let deps = deps.clone();
        async move {
            if event.payload.get("Records").is_some() {
                let sqs: SqsEvent = serde_json::from_value(event.payload)?;
                let records = records(sqs);
                let agents = sas_core::agents::AgentRuntime::default();
                let resp =
                    handle_sqs(&records, |body| sas_core::runner::handle(Role::Supervisor, &deps, &agents, body)).await;
                return Ok::<Value, Error>(serde_json::to_value(resp)?);
            }
            // EventBridge scheduled event ("detail-type": "Scheduled Event") or a manual invoke.
            let r = sas_core::roles::sweep(&deps).await;
            Ok(json!({"expired": r.expired, "recovered": r.recovered, "stale": r.stale, "errors": r.errors}))
        }
    }))
    .await
}
