//! Agent: AgentQueue -> run one attempt of a step with the agents this function hosts.

#[tokio::main]
async fn main() -> Result<(), sas_functions::Error> {
    sas_functions::serve_agents().await
}
