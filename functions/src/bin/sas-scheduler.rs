//! Scheduler: SchedulerQueue -> claim steps, apply agent results, cancel, resubmit.

#[tokio::main]
async fn main() -> Result<(), sas_functions::Error> {
    sas_functions::serve(sas_core::role::Role::Scheduler).await
}
