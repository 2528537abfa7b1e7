//! `sas-dev load`: the load benchmark on a deployed stack ([`sas_cli::load`]): a burst of tasks,
//! polled until every one has ended, and the figures.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sas_cli::commands::Global;
use sas_cli::load::LoadOptions;
use sas_cli::table::TableReader;
use sas_protocol::ids::TaskId;

/// Benchmark: send a burst of tasks to the stack, poll until every one is terminal, and report
/// drain time, throughput, latency percentiles, attempts per step and final states.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How many tasks.
    #[arg(long, default_value_t = 1_000)]
    pub tasks: usize,
    #[arg(long, default_value = "sim-order")]
    pub workflow: String,
    /// Every task's input, JSON (sim-order: faults under "sim", e.g. {"sim": {"charge": {"delay_ms": 200}}}).
    #[arg(long, default_value = "{}")]
    pub input: String,
    /// Stop polling after this many seconds (from the first send).
    #[arg(long, default_value_t = 900)]
    pub timeout_secs: u64,
    /// Milliseconds between polling rounds.
    #[arg(long, default_value_t = 1_000)]
    pub poll_ms: u64,
    /// SendMessageBatch requests in flight.
    #[arg(long, default_value_t = 8)]
    pub send_concurrency: usize,
    /// Print the figures as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
}

/// The command: the burst, the polling (progress on stderr), the figures.
pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = sas_cli::commands::sdk().await;
    let res = global.resources(&sdk).await?;
    let opts = LoadOptions {
        tasks: args.tasks,
        workflow: args.workflow.clone(),
        input: serde_json::from_str(&args.input).context("--input is not JSON")?,
        prefix: format!("load-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]),
        send_concurrency: args.send_concurrency,
        timeout: Duration::from_secs(args.timeout_secs),
        poll_every: Duration::from_millis(args.poll_ms),
    };
    let sqs = sas_core::aws::sqs_client(&sdk);
    let reader = TableReader::new(&sdk, &res);
    eprintln!(
        "load: sending {} {} tasks ({}-NNNNN) to {}",
        opts.tasks, opts.workflow, opts.prefix, res.submission_queue_url
    );
    let started = Instant::now();
    let burst = sas_cli::load::send_burst(&sqs, &res.submission_queue_url, &opts).await?;
    eprintln!(
        "load: sent {} in {:.2} s ({} requests, {} entries failed{})",
        burst.sent.len(),
        burst.elapsed.as_secs_f64(),
        burst.requests,
        burst.failed,
        burst.first_failure.as_ref().map(|f| format!(": {f}")).unwrap_or_default()
    );
    let ids: Vec<TaskId> = burst.sent.iter().map(|(id, _)| id.clone()).collect();
    let mut last_print: Option<Instant> = None;
    let (tasks, reads) = sas_cli::load::poll_until_terminal(&reader, &ids, started, &opts, |p| {
        if last_print.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) || p.terminal == p.total {
            eprintln!("load: {p}");
            last_print = Some(Instant::now());
        }
    })
    .await?;
    let mut report = sas_cli::load::report(&opts.workflow, opts.tasks, &burst, &tasks, started.elapsed(), reads);
    report.run.clone_from(&opts.prefix);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("\n{report}");
    }
    if !report.drained {
        bail!(
            "{} of {} tasks were not terminal after {} s (--timeout-secs)",
            report.sent - report.terminal,
            report.sent,
            opts.timeout.as_secs()
        );
    }
    if report.send_failed > 0 {
        bail!("{} submissions could not be sent", report.send_failed);
    }
    Ok(0)
}
