//! `sasctl iam-check`: the least-privilege check of a stack deployed with its functions
//! ([`crate::iam`]).
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::Global;

/// The least-privilege check of a stack deployed with its functions: every AWS call they made
/// (the JSON lines their SAS_AWS_CALL_LOG directory holds; deploy with
/// --param AwsCallLog=DIR) and the platform's calls with their roles, evaluated against the
/// roles' policies as IAM has them. Fails when a call is not allowed; lists unused grants.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The deployed stack (with DeployFunctions=true).
    #[arg(long = "name")]
    pub name: String,
    /// The directory of call logs (AwsCallLog).
    #[arg(long, value_name = "DIR")]
    pub calls: PathBuf,
    /// Also fail when a grant was never used.
    #[arg(long)]
    pub strict: bool,
}

pub async fn run(args: &Args, _global: &Global) -> Result<i32> {
    let Args { name, calls, strict } = args;
    let sdk = super::sdk().await;
    let recorded = sas_core::aws_calls::read_dir(calls)
        .with_context(|| format!("reading the call logs in {}", calls.display()))?;
    let report = crate::iam::check_stack(&sdk, name, &recorded).await?;
    print!("{}", report.render());
    let (denied, unused) = (report.denied_count(), report.unused().len());
    if denied > 0 || (*strict && unused > 0) {
        bail!("least privilege: {denied} request(s) denied, {unused} grant(s) never used");
    }
    Ok(0)
}
