//! `sasctl resubmit`: resume `Error` tasks from their failed step ([`crate::ops`]), one by its id
//! or every one in `Error`.
#![allow(clippy::print_stdout)]

use anyhow::{bail, Result};
use sas_protocol::ids::TaskId;
use sas_protocol::protocol::ProcessState;

use super::{Global, WaitArgs, POLL};
use crate::ops::Command;
use crate::table::TableReader;

/// Resume Error tasks from their failed step (completed steps are not redone), and report
/// what it led to. Refused at once (exit 1) for a task that is not in Error.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The task to resubmit.
    pub task_id: Option<String>,
    /// Resubmit every task in this state instead (only Error is accepted).
    #[arg(long, conflicts_with = "task_id")]
    pub state: Option<String>,
    #[arg(long, default_value = "resubmitted by operator")]
    pub reason: String,
    /// With --state: at most this many tasks.
    #[arg(long, default_value_t = 10_000)]
    pub max: usize,
    #[command(flatten)]
    pub wait: WaitArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let Args { task_id, state, reason, max, wait } = args;
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    match (task_id, state) {
        (Some(t), None) => {
            let id = TaskId::try_from(t.as_str())?;
            println!("{}", crate::ops::one_command(&deps, Command::Resubmit, &id, reason, wait.wait(), POLL).await?);
        }
        (None, Some(s)) => {
            let s = s.parse::<ProcessState>()?;
            if s != ProcessState::Error {
                bail!("only Error tasks can be resubmitted (--state {s} would change nothing)");
            }
            let reader = TableReader::new(&sdk, &deps.resources);
            let report = crate::ops::resubmit_state_error(&deps, &reader, reason, *max, wait.wait(), POLL).await?;
            for line in report.lines() {
                println!("  {line}");
            }
            println!("{}", report.summary());
            if let Some(e) = &report.send_error {
                bail!("some resubmit messages were not sent: {e}");
            }
            if !report.all_moved() {
                bail!(
                    "{} of {} resubmitted task(s) did not show the resubmit in time; it may still be applied later",
                    report.requested() - report.moved(),
                    report.requested()
                );
            }
        }
        _ => bail!("name a task, or --state Error"),
    }
    Ok(0)
}
