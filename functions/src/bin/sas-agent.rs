//! Agent: AgentQueue -> run one attempt of a step with the agents this function hosts.
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use sas_core::agents::AgentRuntime;
use sas_functions::{boot, handle_sqs, records, run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let deps = boot().await?;
    let agents = Arc::new(AgentRuntime::from_env()?);
    run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let (deps, agents) = (deps.clone(), agents.clone());
        async move {
            let records = records(event.payload);
            Ok::<SqsBatchResponse, Error>(
                handle_sqs(&records, |body| sas_core::roles::agent(&deps, &agents, body)).await,
            )
        }
    }))
    .await
}
