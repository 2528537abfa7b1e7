//! `sasctl run`: the local runner, every role in this process against the stack, until Ctrl-C.
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use sas_core::agent::AgentRuntime;
use sas_core::runner::{Runner, RunnerOptions};

use super::Global;

/// Run every role in this process against the stack, until Ctrl-C.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds between supervisor sweeps.
    #[arg(long, default_value_t = 5)]
    pub sweep_every: u64,
    /// Milliseconds a batch waits to fill up when fewer than ten messages came (as the
    /// template's BatchingWindowSeconds does for the functions); 0 handles each receive at once.
    #[arg(long, default_value_t = 1000)]
    pub batch_window_ms: u64,
    /// Batches in flight per queue, as a function's concurrent invocations (reserved
    /// concurrency on AWS): more makes a task's messages race as they do on AWS at scale.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    // EMF records on stdout, as the functions write them, when asked (bench-cost counts them).
    if std::env::var("SAS_METRICS").is_ok_and(|v| v.eq_ignore_ascii_case("on")) {
        sas_core::telemetry::init_metrics();
    }
    let (deps, workflows) = super::deps_from(&sdk, &global.outputs(&sdk).await?)?;
    let deps = Arc::new(deps);
    let opts = RunnerOptions {
        sweep_every: Duration::from_secs(args.sweep_every),
        batch_window: Duration::from_millis(args.batch_window_ms),
        concurrency: args.concurrency,
        ..RunnerOptions::default()
    };
    let agents = crate::config_files::agents(None)?;
    let runtime = AgentRuntime::from_config(&agents.text, &sas_core::agent::env_vars()?)
        .with_context(|| format!("the agents file {}", agents.from))?;
    tracing::info!(workflows = %workflows, agents = %agents.from, "the local runner's configuration");
    let handle = Runner::new(deps, Arc::new(runtime), opts).spawn();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping the local runner");
    handle.shutdown().await;
    Ok(0)
}
