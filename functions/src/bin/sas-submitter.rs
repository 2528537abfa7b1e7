//! Submitter: SubmissionQueue -> validate, record the task, hand it to the Scheduler.

#[tokio::main]
async fn main() -> Result<(), sas_functions::Error> {
    sas_functions::serve(sas_core::role::Role::Submitter).await
}
