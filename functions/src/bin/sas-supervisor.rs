//! Supervisor: SupervisorQueue (deadline timers) and the scheduled rule (the sweep).

#[tokio::main]
async fn main() -> Result<(), sas_functions::Error> {
    sas_functions::serve(sas_core::role::Role::Supervisor).await
}
