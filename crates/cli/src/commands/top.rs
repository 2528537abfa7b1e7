//! `sasctl top`: the tasks in flight by state, the most overdue steps, the ended tasks' counts,
//! the agents' leases ([`crate::top`]); once, or every `--watch` seconds.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use sas_core::deps::Deps;
use sas_protocol::ids::Millis;

use super::Global;
use crate::table::TableReader;

/// The tasks in flight by ProcessState and the oldest overdue steps (CompleteBy in the past),
/// most overdue first; with the ended tasks' counts. Says how many requests it made.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Look again every this many seconds, until Ctrl-C (default: once).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub watch: Option<u64>,
    /// How many overdue tasks to list.
    #[arg(long, default_value_t = 10)]
    pub show: usize,
    /// Count the tasks in flight by state when there are at most this many (each is read,
    /// 100 per BatchGetItem); above it only the overdue ones shown are read.
    #[arg(long, default_value_t = 1_000)]
    pub read_all: usize,
    /// Skip the ended tasks' counts (Select=COUNT queries of ByEnd, one per shard and state).
    #[arg(long)]
    pub no_ended: bool,
    /// The agents file whose agents with a max_in_flight are shown with their leases
    /// (default: SAS_AGENTS_FILE, else the built-in config/agents.json).
    #[arg(long)]
    pub agents: Option<PathBuf>,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let Args { watch, show, read_all, no_ended, agents } = args;
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let reader = TableReader::new(&sdk, &deps.resources);
    let tty = std::io::stdout().is_terminal();
    let limited = limited_agents(agents.as_deref())?;
    loop {
        let text = look(&deps, &reader, *show, *read_all, !*no_ended, &limited).await?;
        let Some(secs) = watch else {
            print!("{text}");
            break;
        };
        if tty {
            print!("\x1b[2J\x1b[H");
        }
        println!("{text}(every {secs} s; Ctrl-C to stop)\n");
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(*secs)) => {}
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(0)
}

/// The agents of the agents file ([`crate::config_files::agents`]) that have a
/// `max_in_flight`, with it.
fn limited_agents(path: Option<&Path>) -> Result<Vec<(String, u32)>> {
    let file = crate::config_files::agents(path)?;
    let agents = sas_core::agent::survey(&file.text, &sas_core::agent::env_vars()?)
        .with_context(|| format!("reading the agents file {}", file.from))?;
    Ok(agents.into_iter().filter_map(|a| a.max_in_flight.map(|m| (a.name, m))).collect())
}

/// One look: the tasks in flight (and, with `ended`, the ended ones' counts), and the leases of
/// the agents with a `max_in_flight`.
async fn look(
    deps: &Deps,
    reader: &TableReader,
    show: usize,
    read_all: usize,
    ended: bool,
    limited: &[(String, u32)],
) -> Result<String> {
    let now = Millis::now();
    let mut snap = crate::top::in_flight(deps.store.as_ref(), now, read_all, show).await?;
    snap.limits = crate::top::agent_limits(deps.limiter.as_ref(), limited, now).await?;
    snap.limit_reads = limited.len() as u64;
    let pauses = crate::pause::list(deps).await?;
    snap.paused = pauses.workflows.into_iter().chain(pauses.keys).map(|(name, p)| (name, p.at, p.reason)).collect();
    snap.limit_reads += 1;
    if ended {
        for state in crate::top::counted_ended_states() {
            snap.ended.push((state, reader.count_by_state(state).await?));
            snap.count_queries += u64::from(deps.resources.shards.max(1));
        }
    }
    Ok(crate::top::render(&snap))
}
