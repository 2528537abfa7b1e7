//! `sasctl smoke`: after a deploy, one task through the stack ([`crate::smoke`]), its report
//! printed.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{Global, POLL};

/// After a deploy: send one task of a workflow that needs no remote service through the stack
/// and report its steps and history on a time axis. Exits 1 unless it ends Processed in time.
/// Against AWS: `sasctl --stack NAME smoke` (reads the stack's outputs).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = "sim-order")]
    pub workflow: String,
    /// The task's input, JSON.
    #[arg(long, default_value = "{}")]
    pub input: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
}

/// The command: one task through the stack, its report printed.
pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let report = crate::smoke::run(
        deps.store.as_ref(),
        &sas_core::aws::sqs_client(&sdk),
        &deps.resources.submission_queue_url,
        &args.workflow,
        serde_json::from_str(&args.input).context("--input is not JSON")?,
        Duration::from_secs(args.timeout_secs),
        POLL,
    )
    .await?;
    print!("{}", report.render());
    if !report.passed() {
        bail!("smoke check failed: task {} did not end Processed", report.task_id);
    }
    Ok(0)
}
