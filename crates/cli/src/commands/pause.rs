//! `sasctl pause` and `sasctl resume` ([`crate::pause`]).
#![allow(clippy::print_stdout)]

use anyhow::{bail, Result};
use sas_core::deps::PAUSE_CACHE_MS;

use super::Global;
use crate::pause::Outcome;
use crate::timeline::utc;

/// Pause a workflow (or a concurrency key): its tasks' next steps are parked (not dispatched)
/// until it is resumed; steps in flight finish, compensations go on. Without either: list what is
/// paused.
#[derive(clap::Args, Debug)]
pub struct PauseArgs {
    /// The workflow's name (every version).
    #[arg(conflicts_with = "key")]
    pub workflow: Option<String>,
    /// A concurrency key instead, as SCOPE:VALUE (`sasctl key SCOPE VALUE` shows it): the tasks
    /// that hold it park their next steps.
    #[arg(long)]
    pub key: Option<String>,
    /// Why (shown by `sasctl pause` and on each parked task).
    #[arg(long, default_value = "paused by an operator")]
    pub reason: String,
}

/// Resume a paused workflow (or concurrency key): its parked tasks continue at their next look
/// (within a minute).
#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The workflow's name.
    #[arg(conflicts_with = "key", required_unless_present = "key")]
    pub workflow: Option<String>,
    /// A concurrency key instead, as SCOPE:VALUE.
    #[arg(long)]
    pub key: Option<String>,
}

/// What is paused: a workflow, or a key (its item's id).
fn target(workflow: Option<&String>, key: Option<&String>) -> Option<(String, Option<String>)> {
    match (workflow, key) {
        (Some(w), _) => Some((format!("workflow {w}"), None)),
        (None, Some(k)) => Some((format!("concurrency key {}{k}", sas_protocol::keys::KEY_PREFIX), Some(k.clone()))),
        (None, None) => None,
    }
}

pub async fn pause(args: &PauseArgs, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let Some((what, key)) = target(args.workflow.as_ref(), args.key.as_ref()) else {
        let paused = crate::pause::list(&deps).await?;
        if paused.workflows.is_empty() && paused.keys.is_empty() {
            println!("nothing is paused");
        }
        for (name, p) in &paused.workflows {
            println!("workflow {name}: paused since {} ({})", utc(p.at), p.reason);
        }
        for (name, p) in &paused.keys {
            println!("concurrency key {name}: paused since {} ({})", utc(p.at), p.reason);
        }
        return Ok(0);
    };
    let outcome = match (&key, &args.workflow) {
        (Some(k), _) => {
            let item = format!("{}{k}", sas_protocol::keys::KEY_PREFIX);
            crate::pause::pause_key(&deps, &item, &args.reason).await?
        }
        (None, Some(w)) => crate::pause::pause(&deps, w, &args.reason).await?,
        (None, None) => bail!("give a workflow or --key"),
    };
    let again = match &key {
        Some(k) => format!("sasctl resume --key {k}"),
        None => format!("sasctl resume {}", args.workflow.as_deref().unwrap_or_default()),
    };
    match outcome {
        Outcome::Done => {
            println!(
                "{what} paused: within {} s every function parks its tasks' next steps (not dispatched, Pending with \
                 the reason); steps in flight finish, compensations go on. {again} continues them",
                PAUSE_CACHE_MS / 1_000
            );
            Ok(0)
        }
        Outcome::Already(p) => {
            let since = p.map(|p| format!(" since {} ({})", utc(p.at), p.reason)).unwrap_or_default();
            println!("{what} was paused already{since}: nothing changed");
            Ok(1)
        }
    }
}

pub async fn resume(args: &ResumeArgs, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let Some((what, key)) = target(args.workflow.as_ref(), args.key.as_ref()) else {
        bail!("give a workflow or --key");
    };
    let outcome = match (&key, &args.workflow) {
        (Some(k), _) => crate::pause::resume_key(&deps, &format!("{}{k}", sas_protocol::keys::KEY_PREFIX)).await?,
        (None, Some(w)) => crate::pause::resume(&deps, w).await?,
        (None, None) => bail!("give a workflow or --key"),
    };
    match outcome {
        Outcome::Done => {
            println!(
                "{what} resumed: new steps start again within {} s; each parked task continues at its next look \
                 (within {} s)",
                PAUSE_CACHE_MS / 1_000,
                deps.settings.policy.pause_check_ms / 1_000 + PAUSE_CACHE_MS / 1_000
            );
            Ok(0)
        }
        Outcome::Already(_) => {
            println!("{what} was not paused: nothing changed");
            Ok(1)
        }
    }
}
