//! `sasctl list`: the tasks in one state, most recent first, counted when the listing is cut.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use anyhow::Result;
use sas_protocol::protocol::ProcessState;

use super::Global;
use crate::table::TableReader;

/// List tasks in one ProcessState, most recent first; says how many there are when it stops
/// at --limit (a Select=COUNT query of the index, only then).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = "Processing")]
    pub state: String,
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let state: ProcessState = args.state.parse()?;
    let limit = args.limit as usize;
    let rows = deps.store.list_by_state(state, limit).await?;
    // Only a listing cut at the limit needs a count.
    let total = if rows.len() >= limit {
        let reader = TableReader::new(&sdk, &deps.resources);
        let n = reader.count_by_state(state).await?;
        Some(usize::try_from(n).unwrap_or(usize::MAX).max(rows.len()))
    } else {
        None
    };
    let note = match total {
        Some(total) if total > rows.len() => {
            format!(
                "showing {} of {total} {state} tasks, {}; --limit to see more",
                rows.len(),
                if state.is_terminal() { "most recently ended first" } else { "most overdue first" }
            )
        }
        _ => format!("{} {state} task(s)", rows.len()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        eprintln!("{note}");
        return Ok(0);
    }
    println!("{:<40} {:<13} {:<10} {:<10} {:>5}  reason", "task", "state", "workflow", "step", "fails");
    for r in rows {
        println!(
            "{:<40} {:<13} {:<10} {:<10} {:>5}  {}",
            r.task_id.as_str(),
            r.process_state.as_str(),
            r.workflow_name.as_deref().unwrap_or("-"),
            r.current_step.as_deref().unwrap_or("-"),
            r.failure_count,
            r.reason.as_deref().unwrap_or("")
        );
    }
    println!("{note}");
    Ok(0)
}
