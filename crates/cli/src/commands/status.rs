//! `sasctl status`: one task, its timeline ([`crate::timeline`]) or its item as JSON.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal;

use anyhow::{bail, Result};
use sas_protocol::ids::{Millis, TaskId};

use super::Global;
use crate::timeline;

/// Show one task: its state, FailureCount, LockedBy, CompleteBy; its steps and their attempts
/// on a time axis from its creation (durations, backoffs, outcomes, a bar per attempt); every
/// history entry the item keeps; the steps' outputs; what it waits for now.
#[derive(clap::Args, Debug)]
pub struct Args {
    pub task_id: String,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let id = TaskId::try_from(args.task_id.as_str())?;
    let Some(t) = deps.store.get(&id).await? else {
        bail!("{}", crate::ops::no_task_yet(&id));
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
        return Ok(0);
    }
    let t = crate::ops::with_whole_history(&deps, t).await?;
    let color = std::io::stdout().is_terminal();
    print!("{}", timeline::render(&t, Millis::now(), &timeline::Options::full(color)));
    Ok(0)
}
