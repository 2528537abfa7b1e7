//! `sasctl sweep`: one Supervisor sweep now, its report as JSON.
#![allow(clippy::print_stdout)]

use anyhow::Result;

use super::Global;

/// Run one Supervisor sweep now (every shard of the CompleteBy index, as the scheduled rule
/// does) and print what it did as JSON.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub async fn run(_args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let report = sas_core::supervisor::sweep(&deps).await;
    println!("{}", serde_json::to_string(&report)?);
    Ok(0)
}
