//! sasctl: deploy the stack onto LocalStack, run the roles locally, and operate tasks.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use sas_core::agent::AgentRuntime;
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_core::ids::{Millis, TaskId};
use sas_core::messages::{Submission, VERSION};
use sas_core::protocol::ProcessState;
use sas_core::runner::{Runner, RunnerOptions};
use sas_core::workflow::WorkflowRegistry;

mod demo;

#[derive(Parser)]
#[command(name = "sasctl", version, about = "Scheduler-Agent-Supervisor: deploy, run locally, operate tasks")]
struct Cli {
    /// Stack outputs written by `deploy-local` (ignored when --stack is given).
    #[arg(long, global = true, env = "SAS_OUTPUTS", default_value = ".local/outputs.json")]
    outputs: PathBuf,
    /// Read resource names from this CloudFormation stack instead (works against AWS).
    #[arg(long, global = true, env = "SAS_STACK")]
    stack: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Deploy template.yaml with the functions switched off (LocalStack) and write its outputs.
    DeployLocal {
        #[arg(long, default_value = "sas-local")]
        name: String,
        /// Template parameters, KEY=VALUE.
        #[arg(long = "param")]
        params: Vec<String>,
        /// Deploy the functions too, their bootstraps from this folder (e.g. target/debug): zipped,
        /// uploaded to S3, DeployFunctions=true, Architecture = the binaries'.
        #[arg(long, value_name = "DIR")]
        functions: Option<PathBuf>,
    },
    /// Delete a stack deployed with deploy-local, and wait until it is gone.
    DeleteLocal {
        #[arg(long, default_value = "sas-local")]
        name: String,
    },
    /// Run every role in this process against the stack, until Ctrl-C.
    Run {
        /// Seconds between supervisor sweeps.
        #[arg(long, default_value_t = 5)]
        sweep_every: u64,
    },
    /// Send a submission to the submission queue.
    Submit {
        #[arg(long, default_value = "order")]
        workflow: String,
        #[arg(long)]
        task_id: Option<String>,
        /// The task input, JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        #[arg(long)]
        reply_to: Option<String>,
    },
    /// Show one task: state, steps, FailureCount, LockedBy, CompleteBy, history.
    Status {
        task_id: String,
        #[arg(long)]
        json: bool,
    },
    /// List tasks in one ProcessState, most recent first.
    List {
        #[arg(long, default_value = "Processing")]
        state: String,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// The main job: run every role here, submit sample orders, show them move, check the ends.
    Demo {
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 240)]
        timeout: u64,
        /// Lambda mode: deploy stack --name with the functions on, their bootstraps from this
        /// folder, and let LocalStack's event sources and scheduled rule invoke them (no local runner).
        #[arg(long, value_name = "DIR")]
        functions: Option<PathBuf>,
        /// The stack of the Lambda mode (created, or updated with this run's order service URL).
        #[arg(long, default_value = "sas-demo-lambda")]
        name: String,
    },
    /// Resume Error tasks from their failed step (completed steps are not redone).
    Resubmit {
        /// The task to resubmit.
        task_id: Option<String>,
        /// Resubmit every task in this state instead (only Error is accepted).
        #[arg(long, conflicts_with = "task_id")]
        state: Option<String>,
        #[arg(long, default_value = "resubmitted by operator")]
        reason: String,
    },
    /// Stop a task; its completed steps are compensated.
    Cancel {
        task_id: String,
        #[arg(long, default_value = "cancelled by operator")]
        reason: String,
    },
}

async fn resources(cli: &Cli, sdk: &aws_config::SdkConfig) -> Result<Resources> {
    let map: HashMap<String, String> = if let Some(stack) = &cli.stack {
        sas_cli::stack::outputs(&aws_sdk_cloudformation::Client::new(sdk), stack).await?
    } else {
        let text = std::fs::read_to_string(&cli.outputs).with_context(|| {
            format!(
                "cannot read {} (run `make up` or `sasctl deploy-local` first, or pass --stack)",
                cli.outputs.display()
            )
        })?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON object of strings", cli.outputs.display()))?
    };
    Ok(Resources::from_outputs(&map)?)
}

async fn deps(cli: &Cli, sdk: &aws_config::SdkConfig) -> Result<Deps> {
    Ok(Deps::aws(sdk, resources(cli, sdk).await?, WorkflowRegistry::from_env()?, Settings::from_env()?))
}

fn ms(m: Option<Millis>) -> String {
    m.map_or_else(
        || "-".to_owned(),
        |m| {
            let now = Millis::now();
            if m > now {
                format!("{m} (in {} ms)", now.until(m))
            } else {
                format!("{m} ({} ms ago)", m.until(now))
            }
        },
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    sas_core::telemetry::init();
    let cli = Cli::parse();
    let sdk = sas_core::aws::load_sdk_config().await;
    match &cli.cmd {
        Cmd::DeployLocal { name, params, functions } => {
            let mut kv: Vec<(&str, &str)> = vec![("DeployFunctions", "false")];
            for p in params {
                let (k, v) = p.split_once('=').with_context(|| format!("--param {p}: expected KEY=VALUE"))?;
                kv.push((k, v));
            }
            let out = if let Some(dir) = functions {
                sas_cli::lambda::deploy_and_report(&sdk, name, dir, &kv[1..]).await?
            } else {
                let cfn = aws_sdk_cloudformation::Client::new(&sdk);
                sas_cli::stack::deploy(&cfn, name, &sas_cli::stack::local_template(sas_cli::stack::TEMPLATE), &kv)
                    .await?
            };
            if let Some(dir) = cli.outputs.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let json = sas_cli::stack::outputs_json(&out);
            std::fs::write(&cli.outputs, json)?;
            println!("stack {name} deployed; outputs in {}", cli.outputs.display());
            println!("submission queue: {}", out.get("SubmissionQueueUrl").map_or("?", String::as_str));
        }
        Cmd::DeleteLocal { name } => {
            let cfn = aws_sdk_cloudformation::Client::new(&sdk);
            sas_cli::stack::delete_and_wait(&cfn, name, Duration::from_mins(2)).await?;
            println!("stack {name} deleted");
        }
        Cmd::Run { sweep_every } => {
            let deps = Arc::new(deps(&cli, &sdk).await?);
            let opts = RunnerOptions { sweep_every: Duration::from_secs(*sweep_every), ..RunnerOptions::default() };
            let handle = Runner::new(deps, Arc::new(AgentRuntime::from_env()?), opts).spawn();
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("stopping the local runner");
            handle.shutdown().await;
        }
        Cmd::Submit { workflow, task_id, input, reply_to } => {
            let res = resources(&cli, &sdk).await?;
            let task_id = match task_id {
                Some(t) => Some(TaskId::try_from(t.as_str())?),
                None => Some(TaskId::generate()),
            };
            let sub = Submission {
                v: VERSION,
                task_id: task_id.clone(),
                workflow: workflow.clone(),
                workflow_version: None,
                input: serde_json::from_str(input).context("--input is not JSON")?,
                reply_to: reply_to.clone(),
            };
            sas_cli::ops::send_submission(&aws_sdk_sqs::Client::new(&sdk), &res.submission_queue_url, &sub).await?;
            println!("{}", task_id.expect("set above"));
        }
        Cmd::Status { task_id, json } => {
            let deps = deps(&cli, &sdk).await?;
            let Some(t) = deps.store.get(&TaskId::try_from(task_id.as_str())?).await? else {
                bail!("no task {task_id}");
            };
            if *json {
                println!("{}", serde_json::to_string_pretty(&t)?);
                return Ok(());
            }
            println!("task          {}", t.task_id);
            println!("workflow      {}@{}", t.workflow.name, t.workflow.version);
            println!("ProcessState  {}", t.process_state);
            println!("FailureCount  {}", t.failure_count);
            println!("LockedBy      {}", t.locked_by.as_ref().map_or("-", |l| l.as_str()));
            println!("CompleteBy    {}", ms(t.complete_by));
            println!("reason        {}", t.reason.as_deref().unwrap_or("-"));
            println!(
                "\n{:<12} {:<10} {:>8} {:>8}  {:<22} error",
                "step", "status", "attempts", "failures", "compensation"
            );
            for s in &t.steps {
                let comp = s
                    .compensation
                    .as_ref()
                    .map_or("-".to_owned(), |c| format!("{} {:?}", c.name, c.status).to_lowercase());
                println!(
                    "{:<12} {:<10} {:>8} {:>8}  {:<22} {}",
                    s.name,
                    format!("{:?}", s.status).to_lowercase(),
                    s.attempts,
                    s.failures,
                    comp,
                    s.error.as_deref().unwrap_or("")
                );
            }
            println!("\n{:>4}  {:<13} {:<10} {:>5}  {:<15} reason", "seq", "state", "step", "fails", "at");
            for h in &t.history {
                println!(
                    "{:>4}  {:<13} {:<10} {:>5}  {:<15} {}",
                    h.seq,
                    h.state.as_str(),
                    h.step.as_deref().unwrap_or("-"),
                    h.failure_count,
                    h.at,
                    h.reason.as_deref().unwrap_or("")
                );
            }
        }
        Cmd::List { state, limit, json } => {
            let deps = deps(&cli, &sdk).await?;
            let state: ProcessState = state.parse()?;
            let rows = deps.store.list_by_state(state, *limit).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!("{:<40} {:<13} {:<10} {:<10} {:>5}  reason", "task", "state", "workflow", "step", "fails");
            for r in rows {
                println!(
                    "{:<40} {:<13} {:<10} {:<10} {:>5}  {}",
                    r.task_id,
                    r.process_state.as_str(),
                    r.workflow_name.as_deref().unwrap_or("-"),
                    r.current_step.as_deref().unwrap_or("-"),
                    r.failure_count,
                    r.reason.as_deref().unwrap_or("")
                );
            }
        }
        Cmd::Demo { timeout, functions, name } => {
            let timeout = Duration::from_secs(*timeout);
            let ok = match functions {
                Some(dir) => demo::run_lambda(&sdk, name, dir, &cli.outputs, timeout).await?,
                None => demo::run(&sdk, deps(&cli, &sdk).await?, timeout).await?,
            };
            if !ok {
                std::process::exit(1);
            }
        }
        Cmd::Cancel { task_id, reason } => {
            let deps = deps(&cli, &sdk).await?;
            sas_cli::ops::cancel(&deps, &TaskId::try_from(task_id.as_str())?, reason).await?;
            println!("cancel requested for {task_id}");
        }
        Cmd::Resubmit { task_id, state, reason } => {
            let deps = deps(&cli, &sdk).await?;
            match (task_id, state) {
                (Some(t), None) => {
                    let id = TaskId::try_from(t.as_str())?;
                    sas_cli::ops::resubmit(&deps, std::slice::from_ref(&id), reason).await?;
                    println!("resubmit requested for {id}");
                }
                (None, Some(s)) => {
                    if s.parse::<ProcessState>()? != ProcessState::Error {
                        bail!("only Error tasks can be resubmitted");
                    }
                    let ids = sas_cli::ops::resubmit_all_in_error(&deps, reason, 10_000).await?;
                    println!("resubmit requested for {} task(s) in Error", ids.len());
                    for id in ids {
                        println!("  {id}");
                    }
                }
                _ => bail!("name a task, or --state Error"),
            }
        }
    }
    Ok(())
}
