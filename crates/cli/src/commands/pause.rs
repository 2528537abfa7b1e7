//! `sasctl pause` and `sasctl resume` ([`crate::pause`]).
#![allow(clippy::print_stdout)]

use anyhow::Result;
use sas_core::deps::PAUSE_CACHE_MS;

use super::Global;
use crate::pause::Outcome;
use crate::timeline::utc;

/// Pause a workflow: its tasks' next steps are parked (not dispatched) until it is resumed; steps
/// in flight finish, compensations go on. Without a workflow: list the paused ones.
#[derive(clap::Args, Debug)]
pub struct PauseArgs {
    /// The workflow's name (every version).
    pub workflow: Option<String>,
    /// Why (shown by `sasctl pause` and on each parked task).
    #[arg(long, default_value = "paused by an operator")]
    pub reason: String,
}

/// Resume a paused workflow: its parked tasks continue at their next look (within a minute).
#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The workflow's name.
    pub workflow: String,
}

pub async fn pause(args: &PauseArgs, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let Some(workflow) = &args.workflow else {
        let paused = crate::pause::list(&deps).await?;
        if paused.workflows.is_empty() {
            println!("no workflow is paused");
        }
        for (name, p) in &paused.workflows {
            println!("{name}: paused since {} ({})", utc(p.at), p.reason);
        }
        return Ok(0);
    };
    match crate::pause::pause(&deps, workflow, &args.reason).await? {
        Outcome::Done => {
            println!(
                "workflow {workflow} paused: within {} s every function parks its tasks' next steps (not dispatched, \
                 Pending with the reason); steps in flight finish, compensations go on. sasctl resume {workflow} \
                 continues them",
                PAUSE_CACHE_MS / 1_000
            );
            Ok(0)
        }
        Outcome::Already(p) => {
            let since = p.map(|p| format!(" since {} ({})", utc(p.at), p.reason)).unwrap_or_default();
            println!("workflow {workflow} was paused already{since}: nothing changed");
            Ok(1)
        }
    }
}

pub async fn resume(args: &ResumeArgs, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let workflow = &args.workflow;
    match crate::pause::resume(&deps, workflow).await? {
        Outcome::Done => {
            println!(
                "workflow {workflow} resumed: new steps start again within {} s; each parked task continues at its \
                 next look (within {} s)",
                PAUSE_CACHE_MS / 1_000,
                deps.settings.policy.pause_check_ms / 1_000 + PAUSE_CACHE_MS / 1_000
            );
            Ok(0)
        }
        Outcome::Already(_) => {
            println!("workflow {workflow} was not paused: nothing changed");
            Ok(1)
        }
    }
}
