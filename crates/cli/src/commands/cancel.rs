//! `sasctl cancel`: stop a task ([`crate::ops`]), refused at once when it would change nothing.
#![allow(clippy::print_stdout)]

use anyhow::Result;
use sas_protocol::ids::TaskId;

use super::{Global, WaitArgs, POLL};
use crate::ops::Command;

/// Stop a task; its completed steps are compensated. Reports what it led to; refused at once
/// (exit 1) when it would change nothing (no such task, a terminal task other than Error, a task
/// already compensating).
#[derive(clap::Args, Debug)]
pub struct Args {
    pub task_id: String,
    #[arg(long, default_value = "cancelled by operator")]
    pub reason: String,
    #[command(flatten)]
    pub wait: WaitArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let id = TaskId::try_from(args.task_id.as_str())?;
    println!("{}", crate::ops::one_command(&deps, Command::Cancel, &id, &args.reason, args.wait.wait(), POLL).await?);
    Ok(0)
}
