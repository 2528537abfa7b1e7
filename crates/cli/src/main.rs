//! sasctl: deploy the stack onto LocalStack, run the roles locally, and operate tasks.
//!
//! Errors are printed here, one line with their causes (`error: ...: ...`), and end the process
//! with exit code 1: an operator's refusal is not a crash, so no backtrace even with
//! `RUST_BACKTRACE=1`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use sas_cli::answer::{self, Answer};
use sas_cli::ops::Command;
use sas_cli::table::TableReader;
use sas_cli::timeline;
use sas_core::agent::AgentRuntime;
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_core::ids::{CallbackToken, Millis, TaskId};
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
        /// With --functions: the directory the configuration layer is made of (workflows.json,
        /// agents.json; the functions read them in /opt). Deploying again with another one and the
        /// same binaries changes the workflows without a rebuild.
        #[arg(long, value_name = "DIR", default_value = "config")]
        config: PathBuf,
    },
    /// The least-privilege check of a stack deployed with its functions: every AWS call they made
    /// (the JSON lines their SAS_AWS_CALL_LOG directory holds; deploy with
    /// --param AwsCallLog=DIR) and the platform's calls with their roles, evaluated against the
    /// roles' policies as IAM has them. Fails when a call is not allowed; lists unused grants.
    IamCheck {
        /// The deployed stack (with DeployFunctions=true).
        #[arg(long = "name")]
        name: String,
        /// The directory of call logs (AwsCallLog).
        #[arg(long, value_name = "DIR")]
        calls: PathBuf,
        /// Also fail when a grant was never used.
        #[arg(long)]
        strict: bool,
    },
    /// Check a configuration before deploying it, as the functions will load it: the workflows
    /// parse and respect the limits, every step's agent is defined, every variable an agent needs
    /// is set (from --var and the environment), hand-off agents sit on callback steps, every AWS
    /// call of an agent is granted by the template parameters (--param). Prints what it checked;
    /// exits 1 when anything would fail. Needs no stack.
    Validate {
        /// The workflows file (default: the built-in config/workflows.json).
        #[arg(long, value_name = "FILE")]
        workflows: Option<PathBuf>,
        /// The agents file (default: the built-in config/agents.json).
        #[arg(long, value_name = "FILE")]
        agents: Option<PathBuf>,
        /// A variable the functions will have, KEY=VALUE (the template's, e.g. ORDER_SERVICE_URL).
        #[arg(long = "var")]
        vars: Vec<String>,
        /// A template parameter as you deploy it, NAME=VALUE (e.g.
        /// AgentFunctionArns=arn:aws:lambda:...:function:charge,arn:...): every AWS call an agent
        /// makes must be granted by one (the Agent function's role); without them only the stack's
        /// own resources are. AgentVariables=KEY=VALUE,KEY=VALUE gives the agents' ${VAR}s their
        /// values, as on the stack.
        #[arg(long = "param")]
        params: Vec<String>,
        /// Then print this workflow (NAME or NAME@VERSION; the latest version by default) as a
        /// Mermaid flowchart on stdout (the check's report goes to stderr then).
        #[arg(long, value_name = "WORKFLOW")]
        graph: Option<String>,
    },
    /// Translate Step Functions state machines (Amazon States Language, JSONPath) into a
    /// workflows file and an agents file, then check them as validate does (with --var and
    /// --param as validate takes them). Each FILE becomes a workflow named after it (NAME.asl.json
    /// is NAME); what cannot be translated is refused with every state and field that cannot be
    /// and what to do instead; how the translation differs from the state machine is printed
    /// with it. Exit status: 0 every file translated and the check clean; 2 a file refused (the
    /// others still written); 3 every file translated but the check needs variables (--var) or
    /// template parameters (--param) not passed, each named with the flag to pass; 1 an error (a
    /// file unreadable or not JSON, a file not written, a problem of the check's own).
    ImportAsl {
        /// State machine definitions (JSON).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where the workflows file is written.
        #[arg(long, value_name = "FILE", default_value = "imported-workflows.json")]
        workflows: PathBuf,
        /// Where the agents file is written.
        #[arg(long, value_name = "FILE", default_value = "imported-agents.json")]
        agents: PathBuf,
        /// A variable the functions will have, KEY=VALUE, for the check (a definition's
        /// ${FunctionArn} substitutions stay variables of the agents file).
        #[arg(long = "var")]
        vars: Vec<String>,
        /// A template parameter as you deploy it, NAME=VALUE, for the check, as validate takes it
        /// (AgentFunctionArns=arn:aws:lambda:...:function:quote,...: every AWS call an agent makes
        /// must be granted by one).
        #[arg(long = "param")]
        params: Vec<String>,
    },
    /// Print the JSON Schema of a configuration file (the repository's schemas/ holds both): name
    /// it in the file with "$schema" and an editor completes and checks the file as you type.
    Schema {
        /// Which file: workflows or agents.
        #[arg(value_parser = ["workflows", "agents"])]
        file: String,
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
        /// Milliseconds a batch waits to fill up when fewer than ten messages came (as the
        /// template's BatchingWindowSeconds does for the functions); 0 handles each receive at once.
        #[arg(long, default_value_t = 1000)]
        batch_window_ms: u64,
        /// Batches in flight per queue, as a function's concurrent invocations (reserved
        /// concurrency on AWS): more makes a task's messages race as they do on AWS at scale.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
    },
    /// Run one Supervisor sweep now (every shard of the CompleteBy index, as the scheduled rule
    /// does) and print what it did as JSON.
    Sweep,
    /// Send a submission to the submission queue.
    Submit {
        #[arg(long, default_value = "order")]
        workflow: String,
        #[arg(long)]
        task_id: Option<String>,
        /// The task input, JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        /// The URL of a queue of yours for the task's status messages; it must be on the stack's
        /// allow-list (output ReplyQueueArnPattern; by default queues named <stack>-reply-*).
        #[arg(long)]
        reply_to: Option<String>,
        /// Then wait: until the task ends (`--wait`, or `--wait ended`), printing its timeline as
        /// `status` does, or until the Submitter has created it (`--wait created`). Exit status:
        /// 0 when it ended Processed (or was created), 2 when it ended otherwise (Compensated,
        /// Error, Cancelled), 3 when the time ran out (saying where the task was).
        #[arg(long, value_enum, value_name = "UNTIL", num_args = 0..=1, default_missing_value = "ended")]
        wait: Option<sas_cli::ops::Until>,
        /// With --wait: how long at most.
        #[arg(long, default_value_t = 300, value_name = "SECONDS")]
        wait_secs: u64,
    },
    /// Show one task: its state, FailureCount, LockedBy, CompleteBy; its steps and their attempts
    /// on a time axis from its creation (durations, backoffs, outcomes, a bar per attempt); every
    /// history entry the item keeps; the steps' outputs; what it waits for now.
    Status {
        task_id: String,
        #[arg(long)]
        json: bool,
    },
    /// List tasks in one ProcessState, most recent first; says how many there are when it stops
    /// at --limit (a Select=COUNT query of the index, only then).
    List {
        #[arg(long, default_value = "Processing")]
        state: String,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// The tasks in flight by ProcessState and the oldest overdue steps (CompleteBy in the past),
    /// most overdue first; with the ended tasks' counts. Says how many requests it made.
    Top {
        /// Look again every this many seconds, until Ctrl-C (default: once).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
        watch: Option<u64>,
        /// How many overdue tasks to list.
        #[arg(long, default_value_t = 10)]
        show: usize,
        /// Count the tasks in flight by state when there are at most this many (each is read,
        /// 100 per BatchGetItem); above it only the overdue ones shown are read.
        #[arg(long, default_value_t = 1_000)]
        read_all: usize,
        /// Skip the ended tasks' counts (Select=COUNT queries of ByEnd, one per shard and state).
        #[arg(long)]
        no_ended: bool,
        /// The agents file whose agents with a max_in_flight are shown with their leases
        /// (default: SAS_AGENTS_FILE, else the built-in config/agents.json).
        #[arg(long)]
        agents: Option<PathBuf>,
    },
    /// A console in the browser: the workflows drawn, the tasks listed, one task's path and
    /// timeline, and cancel, resubmit, approve and reject with what they did. Served from this
    /// process with your AWS credentials (nothing is deployed); until Ctrl-C.
    Ui {
        /// Where to listen. Anything but a loopback address serves every host that can reach it,
        /// with your credentials: it is refused unless --allow-remote is given too.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Listen on a non-loopback address anyway (a warning is printed).
        #[arg(long)]
        allow_remote: bool,
        /// Show only: offer and accept no action.
        #[arg(long)]
        read_only: bool,
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
        /// Lambda mode: the directory the configuration layer is made of (workflows.json, agents.json).
        #[arg(long, value_name = "DIR", default_value = "config")]
        config: PathBuf,
        /// The stack of the Lambda mode (created, or updated with this run's order service URL).
        #[arg(long, default_value = "sas-demo-lambda")]
        name: String,
    },
    /// Resume Error tasks from their failed step (completed steps are not redone), and report
    /// what it led to. Refused at once (exit 1) for a task that is not in Error.
    Resubmit {
        /// The task to resubmit.
        task_id: Option<String>,
        /// Resubmit every task in this state instead (only Error is accepted).
        #[arg(long, conflicts_with = "task_id")]
        state: Option<String>,
        #[arg(long, default_value = "resubmitted by operator")]
        reason: String,
        /// With --state: at most this many tasks.
        #[arg(long, default_value_t = 10_000)]
        max: usize,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Stop a task; its completed steps are compensated. Reports what it led to; refused at once
    /// (exit 1) when it would change nothing (no such task, a terminal task other than Error, a task
    /// already compensating).
    Cancel {
        task_id: String,
        #[arg(long, default_value = "cancelled by operator")]
        reason: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Answer a callback step: it succeeded, with this output. Exit 1 when the answer was not
    /// taken (stale, late, unknown token, task cancelled).
    Complete {
        /// The callback token the step's agent handed over (a secret: never printed back).
        token: String,
        /// The step's output, JSON.
        #[arg(long, default_value = "{}")]
        output: String,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// Answer a callback step: it failed (for good, unless --retryable).
    Fail {
        token: String,
        #[arg(long)]
        error: String,
        /// Let the step be retried (within its attempts) instead of failing it for good.
        #[arg(long)]
        retryable: bool,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// Answer a callback step: still working; extends its deadline (never past its hard timeout).
    Heartbeat {
        token: String,
        /// Progress details, JSON.
        #[arg(long)]
        details: Option<String>,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// Approve an approval step: it succeeds with output {"approved": true, "comment": ...}.
    Approve {
        token: String,
        #[arg(long)]
        comment: Option<String>,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// Reject an approval step: it fails for good ("rejected: REASON"), and the task compensates.
    Reject {
        token: String,
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// After a deploy: send one task of a workflow that needs no remote service through the stack
    /// and report its steps and history on a time axis. Exits 1 unless it ends Processed in time.
    /// Against AWS: `sasctl --stack NAME smoke` (reads the stack's outputs).
    Smoke {
        #[arg(long, default_value = "sim-order")]
        workflow: String,
        /// The task's input, JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Benchmark: send a burst of tasks to the stack, poll until every one is terminal, and report
    /// drain time, throughput, latency percentiles, attempts per step and final states.
    Load {
        /// How many tasks.
        #[arg(long, default_value_t = 1_000)]
        tasks: usize,
        #[arg(long, default_value = "sim-order")]
        workflow: String,
        /// Every task's input, JSON (sim-order: faults under "sim", e.g. {"sim": {"charge": {"delay_ms": 200}}}).
        #[arg(long, default_value = "{}")]
        input: String,
        /// Stop polling after this many seconds (from the first send).
        #[arg(long, default_value_t = 900)]
        timeout_secs: u64,
        /// Milliseconds between polling rounds.
        #[arg(long, default_value_t = 1_000)]
        poll_ms: u64,
        /// SendMessageBatch requests in flight.
        #[arg(long, default_value_t = 8)]
        send_concurrency: usize,
        /// Print the figures as JSON on stdout (progress stays on stderr).
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args, Clone, Copy)]
struct ReplyArgs {
    /// Print the reply as JSON (result, stop, state, complete_by, reason) instead of a line.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Clone, Copy)]
struct WaitArgs {
    /// Wait at most this long for the command to show on the task.
    #[arg(long, default_value_t = 30)]
    wait_secs: u64,
    /// Send the command (after the check) and return without waiting.
    #[arg(long)]
    no_wait: bool,
}

impl WaitArgs {
    fn wait(self) -> Option<Duration> {
        (!self.no_wait).then(|| Duration::from_secs(self.wait_secs))
    }
}

/// How often a waiting command reads the task.
const POLL: Duration = Duration::from_millis(300);

async fn resources(cli: &Cli, sdk: &aws_config::SdkConfig) -> Result<Resources> {
    Ok(Resources::from_outputs(&outputs(cli, sdk).await?)?)
}

/// The stack's outputs: `--stack`'s, else the file `--outputs` names.
async fn outputs(cli: &Cli, sdk: &aws_config::SdkConfig) -> Result<HashMap<String, String>> {
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
    Ok(map)
}

/// The stack's resources and the workflows file sasctl reads ([`sas_cli::config_files`]: the
/// environment's, else the checkout's `config/`, else the built-in copy).
async fn deps(cli: &Cli, sdk: &aws_config::SdkConfig) -> Result<Deps> {
    Ok(deps_from(sdk, &outputs(cli, sdk).await?)?.0)
}

/// [`deps`] from outputs already read, with where its workflows came from.
fn deps_from(
    sdk: &aws_config::SdkConfig,
    outputs: &HashMap<String, String>,
) -> Result<(Deps, sas_cli::config_files::Source)> {
    let workflows = sas_cli::config_files::workflows(None)?;
    let registry =
        WorkflowRegistry::from_json(&workflows.text).with_context(|| format!("workflows {}", workflows.from))?;
    tracing::debug!(from = %workflows.from, "workflows read");
    Ok((Deps::aws(sdk, Resources::from_outputs(outputs)?, registry, Settings::from_env()?), workflows.from))
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    // An answer (and validate) prints what it did; the library's log lines would only repeat it.
    let answers = matches!(
        cli.cmd,
        Cmd::Complete { .. }
            | Cmd::Fail { .. }
            | Cmd::Heartbeat { .. }
            | Cmd::Approve { .. }
            | Cmd::Reject { .. }
            | Cmd::Validate { .. }
            | Cmd::ImportAsl { .. }
            | Cmd::Schema { .. }
    );
    sas_core::telemetry::init_with_default(if answers { "error" } else { "info" });
    // boxed: run holds every command's future, too large for the stack of main's own
    if let Err(e) = Box::pin(run(&cli)).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn key_values(what: &str, items: &[String]) -> Result<std::collections::HashMap<String, String>> {
    items
        .iter()
        .map(|v| {
            let (k, val) = v.split_once('=').with_context(|| format!("--{what} {v}: expected KEY=VALUE"))?;
            Ok((k.to_owned(), val.to_owned()))
        })
        .collect()
}

/// `sasctl submit --wait`: wait for the task just submitted, say where it got to, and return the
/// exit status (0 reached as asked and, for an end, `Processed`; 2 another end; 3 out of time).
async fn submit_wait(deps: &Deps, id: &TaskId, until: sas_cli::ops::Until, wait: Duration) -> Result<i32> {
    use sas_cli::ops::{Until, Waited};
    let started = std::time::Instant::now();
    let waited = sas_cli::ops::wait_for_task(deps, id, until, wait, POLL).await?;
    let secs = started.elapsed().as_secs_f64();
    Ok(match waited {
        Waited::Reached(t) if until == Until::Created => {
            println!(
                "{id}: created, {} ({}@{}), after {secs:.1} s",
                t.process_state, t.workflow.name, t.workflow.version
            );
            0
        }
        Waited::Reached(t) => {
            let t = sas_cli::ops::with_whole_history(deps, *t).await?;
            let color = std::io::stdout().is_terminal();
            print!("{}", timeline::render(&t, Millis::now(), &timeline::Options::full(color)));
            println!("{id}: ended {} after {secs:.1} s of waiting", t.process_state);
            if t.process_state == ProcessState::Processed {
                0
            } else {
                2
            }
        }
        Waited::StillRunning(t) => {
            let at = t.current_step_name().map(|s| format!(", at step {s}")).unwrap_or_default();
            println!(
                "{id}: not ended after {secs:.0} s: {} (rev {}){at}; `sasctl status {id}` shows where it waits",
                t.process_state, t.rev
            );
            3
        }
        Waited::NotCreated => {
            println!("{id}: not created after {secs:.0} s; {}", sas_cli::ops::no_task_yet(id));
            3
        }
    })
}

/// `sasctl import-asl`: translate each file, print what was translated, refused and noted, write
/// the two files (even when some were refused, with the others), check them; the exit status (0
/// all translated and clean, 2 a file refused, 3 the check needs --var or --param not passed, 1
/// an error).
fn import_asl(
    files: &[PathBuf],
    workflows: &std::path::Path,
    agents: &std::path::Path,
    vars: &[String],
    params: &[String],
) -> Result<i32> {
    let mut wfs = Vec::new();
    let mut all_agents = serde_json::Map::new();
    let (mut refused, mut unread) = (0, 0);
    for f in files {
        let def = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display())).and_then(|text| {
            serde_json::from_str::<serde_json::Value>(&text).with_context(|| format!("{} is not JSON", f.display()))
        });
        let def = match def {
            Ok(def) => def,
            Err(e) => {
                unread += 1;
                println!("{}: error: {e:#}", f.display());
                continue;
            }
        };
        let name = sas_asl::workflow_name(f);
        match sas_asl::import(&name, &def) {
            Ok(mut i) => {
                let renamed = sas_asl::merge_agents(&mut all_agents, &mut i);
                let steps = i.workflow["steps"].as_array().map_or(0, Vec::len);
                let children = i.children.iter().filter_map(|w| w["name"].as_str()).collect::<Vec<_>>();
                let runs =
                    if children.is_empty() { String::new() } else { format!(", running {}", children.join(", ")) };
                println!(
                    "{}: translated as workflow {name}: {steps} step(s), {} agent(s){runs}",
                    f.display(),
                    i.agents.len()
                );
                for n in i.notes.iter().chain(&renamed) {
                    println!("  differs: {n}");
                }
                wfs.extend(i.workflows());
            }
            Err(rs) => {
                refused += 1;
                println!("{}: refused ({} reason(s)):", f.display(), rs.len());
                for r in rs {
                    println!("  {r}");
                }
            }
        }
    }
    if wfs.is_empty() {
        println!("nothing translated: {refused} file(s) refused, {unread} not read; no file written");
        return Ok(if unread > 0 { 1 } else { 2 });
    }
    let wf = serde_json::json!({"workflows": wfs});
    let agent_count = all_agents.len();
    let ag = sas_asl::agents_file(&all_agents);
    std::fs::write(workflows, serde_json::to_string_pretty(&wf)? + "\n")
        .with_context(|| format!("writing {}", workflows.display()))?;
    std::fs::write(agents, serde_json::to_string_pretty(&ag)? + "\n")
        .with_context(|| format!("writing {}", agents.display()))?;
    println!(
        "wrote {} ({} workflow(s)) and {} ({} agent(s)); checking them:",
        workflows.display(),
        wfs.len(),
        agents.display(),
        agent_count
    );
    let report = validate(Some(workflows), Some(agents), vars, params, None)?;
    let needs = sas_cli::asl::Needs::of(&report.problems);
    if let Ok(needs) = &needs {
        if !needs.is_empty() {
            println!("the check needs what was not passed; pass:");
            for flag in needs.flags() {
                println!("  {flag}");
            }
        }
    }
    let (status, why) = match (&needs, unread, refused) {
        (Err(other), _, _) => (1, format!("{} problem(s) of the translation's own (above)", other.len())),
        (_, 1.., _) => (1, format!("{unread} of {} file(s) not read (above)", files.len())),
        (_, _, 1..) => (2, format!("{refused} of {} file(s) refused (above)", files.len())),
        (Ok(n), _, _) if !n.is_empty() => (
            3,
            format!(
                "translated, but the check needs {} variable(s) and {} template parameter(s) not passed (above)",
                n.vars.len(),
                n.params.len()
            ),
        ),
        _ => (0, String::new()),
    };
    if status != 0 {
        println!("exit status {status}: {why}");
    }
    Ok(status)
}

#[allow(clippy::print_stderr)] // with --graph the report goes to stderr, the diagram to stdout
fn validate(
    workflows: Option<&std::path::Path>,
    agents: Option<&std::path::Path>,
    vars: &[String],
    params: &[String],
    graph: Option<&str>,
) -> Result<sas_cli::validate::Report> {
    let say = |line: String| if graph.is_some() { eprintln!("{line}") } else { println!("{line}") };
    let (wf, ag) = (sas_cli::config_files::workflows(workflows)?, sas_cli::config_files::agents(agents)?);
    let (wf, wf_from, ag, ag_from) = (wf.text, wf.from.to_string(), ag.text, ag.from.to_string());
    let given = key_values("var", vars)?;
    let params = key_values("param", params)?;
    // as the Agent function sees them: its environment, then the template parameter AgentVariables
    let deployed = sas_core::agent::parse_variables(params.get("AgentVariables").map_or("", String::as_str))
        .context("--param AgentVariables")?;
    let lookup = |k: &str| {
        given
            .get(k)
            .cloned()
            .filter(|v| !v.is_empty())
            .or_else(|| std::env::var(k).ok().filter(|v| !v.is_empty()))
            .or_else(|| deployed.get(k).cloned())
            .filter(|v| !v.is_empty())
    };
    let r = sas_cli::validate::check_with_grants(&wf, &ag, &lookup, &|k| params.get(k).cloned());
    say(format!(
        "workflows from {wf_from}: {}",
        if r.workflows.is_empty() { "-".into() } else { r.workflows.join(", ") }
    ));
    say(format!("agents from {ag_from}: {}", if r.agents.is_empty() { "-".into() } else { r.agents.join(", ") }));
    for w in &r.warnings {
        say(format!("warning: {w}"));
    }
    for p in &r.problems {
        say(format!("problem: {p}"));
    }
    if !r.ok() {
        return Ok(r);
    }
    say(format!("valid: {} workflow(s), {} agent(s)", r.workflows.len(), r.agents.len()));
    if let Some(name) = graph {
        let registry = WorkflowRegistry::from_json(&wf)?;
        let (name, version) = match name.split_once('@') {
            Some((n, v)) => {
                (n, Some(v.parse::<u32>().with_context(|| format!("--graph {name}: a version is a number"))?))
            }
            None => (name, None),
        };
        let def = registry
            .resolve(name, version)
            .with_context(|| format!("--graph: no workflow {name} (the file has {})", r.workflows.join(", ")))?;
        print!("{}", sas_cli::diagram::mermaid(def));
    }
    Ok(r)
}

async fn run(cli: &Cli) -> Result<()> {
    // An answer's arguments (the token first) are checked before anything else happens.
    if let Some((token, answer, reply)) = answer_of(&cli.cmd)? {
        let sdk = sas_core::aws::load_sdk_config().await;
        return answer_step(cli, &sdk, &token, &answer, reply).await;
    }
    let sdk = sas_core::aws::load_sdk_config().await;
    match &cli.cmd {
        Cmd::DeployLocal { name, params, functions, config } => {
            let mut kv: Vec<(&str, &str)> = vec![("DeployFunctions", "false")];
            for p in params {
                let (k, v) = p.split_once('=').with_context(|| format!("--param {p}: expected KEY=VALUE"))?;
                kv.push((k, v));
            }
            let out = if let Some(dir) = functions {
                sas_cli::lambda::deploy_and_report(&sdk, name, dir, config, &kv[1..]).await?
            } else {
                sas_cli::stack::deploy(&sdk, name, &sas_cli::stack::local_template(sas_cli::stack::TEMPLATE), &kv)
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
        Cmd::IamCheck { name, calls, strict } => {
            let recorded = sas_core::aws_calls::read_dir(calls)
                .with_context(|| format!("reading the call logs in {}", calls.display()))?;
            let report = sas_cli::iam::check_stack(&sdk, name, &recorded).await?;
            print!("{}", report.render());
            let (denied, unused) = (report.denied_count(), report.unused().len());
            if denied > 0 || (*strict && unused > 0) {
                bail!("least privilege: {denied} request(s) denied, {unused} grant(s) never used");
            }
        }
        Cmd::Schema { file } => {
            let schema = if file == "agents" { sas_core::schema::agents() } else { sas_core::schema::workflows() };
            println!("{}", serde_json::to_string_pretty(&schema)?);
        }
        Cmd::ImportAsl { files, workflows, agents, vars, params } => {
            let status = import_asl(files, workflows, agents, vars, params)?;
            if status != 0 {
                std::process::exit(status);
            }
        }
        Cmd::Validate { workflows, agents, vars, params, graph } => {
            let r = validate(workflows.as_deref(), agents.as_deref(), vars, params, graph.as_deref())?;
            if !r.ok() {
                bail!("{} problem(s): this configuration would fail in the functions", r.problems.len());
            }
        }
        Cmd::DeleteLocal { name } => {
            let cfn = aws_sdk_cloudformation::Client::new(&sdk);
            sas_cli::stack::delete_and_wait(&cfn, name, Duration::from_mins(2)).await?;
            println!("stack {name} deleted");
        }
        Cmd::Run { sweep_every, batch_window_ms, concurrency } => {
            // EMF records on stdout, as the functions write them, when asked (bench-cost counts them).
            if std::env::var("SAS_METRICS").is_ok_and(|v| v.eq_ignore_ascii_case("on")) {
                sas_core::telemetry::init_metrics();
            }
            let (deps, workflows) = deps_from(&sdk, &outputs(cli, &sdk).await?)?;
            let deps = Arc::new(deps);
            let opts = RunnerOptions {
                sweep_every: Duration::from_secs(*sweep_every),
                batch_window: Duration::from_millis(*batch_window_ms),
                concurrency: *concurrency,
                ..RunnerOptions::default()
            };
            let agents = sas_cli::config_files::agents(None)?;
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
        }
        Cmd::Sweep => {
            let deps = deps(cli, &sdk).await?;
            let report = sas_core::supervisor::sweep(&deps).await;
            println!("{}", serde_json::to_string(&report)?);
        }
        Cmd::Submit { workflow, task_id, input, reply_to, wait, wait_secs } => {
            let outputs = outputs(cli, &sdk).await?;
            let res = Resources::from_outputs(&outputs)?;
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
            sas_cli::ops::send_submission(&sas_core::aws::sqs_client(&sdk), &res.submission_queue_url, &sub).await?;
            let task_id = task_id.expect("set above");
            println!("{task_id}");
            if let Some(until) = wait {
                let deps = deps_from(&sdk, &outputs)?.0;
                let code = submit_wait(&deps, &task_id, *until, Duration::from_secs(*wait_secs)).await?;
                if code != 0 {
                    std::process::exit(code);
                }
            }
        }
        Cmd::Status { task_id, json } => {
            let deps = deps(cli, &sdk).await?;
            let id = TaskId::try_from(task_id.as_str())?;
            let Some(t) = deps.store.get(&id).await? else {
                bail!("{}", sas_cli::ops::no_task_yet(&id));
            };
            if *json {
                println!("{}", serde_json::to_string_pretty(&t)?);
                return Ok(());
            }
            let t = sas_cli::ops::with_whole_history(&deps, t).await?;
            let color = std::io::stdout().is_terminal();
            print!("{}", timeline::render(&t, Millis::now(), &timeline::Options::full(color)));
        }
        Cmd::List { state, limit, json } => {
            let deps = deps(cli, &sdk).await?;
            let state: ProcessState = state.parse()?;
            let limit = *limit as usize;
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
            if *json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                eprintln!("{note}");
                return Ok(());
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
        }
        Cmd::Top { watch, show, read_all, no_ended, agents } => {
            let deps = deps(cli, &sdk).await?;
            let reader = TableReader::new(&sdk, &deps.resources);
            let tty = std::io::stdout().is_terminal();
            let limited = limited_agents(agents.as_deref())?;
            loop {
                let text = top(&deps, &reader, *show, *read_all, !*no_ended, &limited).await?;
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
        }
        Cmd::Ui { listen, allow_remote, read_only } => {
            if !listen.ip().is_loopback() && !allow_remote {
                bail!("--listen {listen} is not a loopback address: anyone who reaches it acts with your AWS credentials; add --allow-remote if that is what you want");
            }
            let outputs = outputs(cli, &sdk).await?;
            let (mut deps, files) = deps_from(&sdk, &outputs)?;
            // the workflows the stack runs: its configuration layer's when its functions are on,
            // else the files its local runner reads (the same files as here)
            let shown = match outputs.get("SchedulerFunctionName") {
                Some(function) => {
                    let d = sas_cli::deployed::config(&sdk, function).await?;
                    deps.workflows = Arc::new(
                        WorkflowRegistry::from_json(&d.workflows)
                            .with_context(|| format!("the workflows of layer {}", d.layer))?,
                    );
                    format!("the stack's configuration layer {}", d.layer)
                }
                None => files.to_string(),
            };
            eprintln!("sasctl ui: the workflows page shows the workflows of {shown}");
            let deps = Arc::new(deps);
            let reader = TableReader::new(&sdk, &deps.resources);
            let stack = cli
                .stack
                .as_ref()
                .map_or_else(|| format!("table {}", deps.resources.task_table), |s| format!("stack {s}"));
            let listener =
                tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
            let addr = listener.local_addr()?;
            if !addr.ip().is_loopback() {
                eprintln!(
                    "warning: the console listens on {addr}, beyond this machine, and acts with your AWS credentials"
                );
            }
            let console =
                Arc::new(sas_cli::ui::Console::new(deps, reader, stack, addr, *read_only).with_workflows_from(shown));
            println!(
                "sasctl ui: http://{}/ ({}; Ctrl-C to stop)",
                if addr.ip().is_loopback() { format!("127.0.0.1:{}", addr.port()) } else { addr.to_string() },
                if *read_only { "read-only" } else { "cancel, resubmit, approve and reject ask to confirm" }
            );
            sas_cli::ui::serve(listener, console).await?;
        }
        Cmd::Demo { timeout, functions, config, name } => {
            let timeout = Duration::from_secs(*timeout);
            let ok = match functions {
                Some(dir) => demo::run_lambda(&sdk, name, dir, config, &cli.outputs, timeout).await?,
                None => demo::run(&sdk, deps(cli, &sdk).await?, timeout).await?,
            };
            if !ok {
                std::process::exit(1);
            }
        }
        Cmd::Cancel { task_id, reason, wait } => {
            let deps = deps(cli, &sdk).await?;
            let id = TaskId::try_from(task_id.as_str())?;
            println!("{}", sas_cli::ops::one_command(&deps, Command::Cancel, &id, reason, wait.wait(), POLL).await?);
        }
        Cmd::Resubmit { task_id, state, reason, max, wait } => {
            let deps = deps(cli, &sdk).await?;
            match (task_id, state) {
                (Some(t), None) => {
                    let id = TaskId::try_from(t.as_str())?;
                    println!(
                        "{}",
                        sas_cli::ops::one_command(&deps, Command::Resubmit, &id, reason, wait.wait(), POLL).await?
                    );
                }
                (None, Some(s)) => {
                    let s = s.parse::<ProcessState>()?;
                    if s != ProcessState::Error {
                        bail!("only Error tasks can be resubmitted (--state {s} would change nothing)");
                    }
                    let reader = TableReader::new(&sdk, &deps.resources);
                    let report =
                        sas_cli::ops::resubmit_state_error(&deps, &reader, reason, *max, wait.wait(), POLL).await?;
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
        }
        Cmd::Complete { .. } | Cmd::Fail { .. } | Cmd::Heartbeat { .. } | Cmd::Approve { .. } | Cmd::Reject { .. } => {
            unreachable!("answers are handled before the SDK is loaded")
        }
        Cmd::Smoke { workflow, input, timeout_secs } => {
            let deps = deps(cli, &sdk).await?;
            let report = sas_cli::smoke::run(
                deps.store.as_ref(),
                &sas_core::aws::sqs_client(&sdk),
                &deps.resources.submission_queue_url,
                workflow,
                serde_json::from_str(input).context("--input is not JSON")?,
                Duration::from_secs(*timeout_secs),
                POLL,
            )
            .await?;
            print!("{}", report.render());
            if !report.passed() {
                bail!("smoke check failed: task {} did not end Processed", report.task_id);
            }
        }
        Cmd::Load { tasks, workflow, input, timeout_secs, poll_ms, send_concurrency, json } => {
            let res = resources(cli, &sdk).await?;
            let opts = sas_cli::load::LoadOptions {
                tasks: *tasks,
                workflow: workflow.clone(),
                input: serde_json::from_str(input).context("--input is not JSON")?,
                prefix: format!("load-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]),
                send_concurrency: *send_concurrency,
                timeout: Duration::from_secs(*timeout_secs),
                poll_every: Duration::from_millis(*poll_ms),
            };
            load(&sdk, &res, &opts, *json).await?;
        }
    }
    Ok(())
}

/// The agents of the agents file ([`sas_cli::config_files::agents`]) that have a
/// `max_in_flight`, with it.
fn limited_agents(path: Option<&std::path::Path>) -> Result<Vec<(String, u32)>> {
    let file = sas_cli::config_files::agents(path)?;
    let agents = sas_core::agent::survey(&file.text, &sas_core::agent::env_vars()?)
        .with_context(|| format!("reading the agents file {}", file.from))?;
    Ok(agents.into_iter().filter_map(|a| a.max_in_flight.map(|m| (a.name, m))).collect())
}

/// One look for `sasctl top`: the tasks in flight (and, with `ended`, the ended ones' counts),
/// and the leases of the agents with a `max_in_flight`.
async fn top(
    deps: &Deps,
    reader: &TableReader,
    show: usize,
    read_all: usize,
    ended: bool,
    limited: &[(String, u32)],
) -> Result<String> {
    let now = Millis::now();
    let mut snap = sas_cli::top::in_flight(deps.store.as_ref(), now, read_all, show).await?;
    snap.limits = sas_cli::top::agent_limits(deps.limiter.as_ref(), limited, now).await?;
    snap.limit_reads = limited.len() as u64;
    if ended {
        for state in sas_cli::top::counted_ended_states() {
            snap.ended.push((state, reader.count_by_state(state).await?));
            snap.count_queries += u64::from(deps.resources.shards.max(1));
        }
    }
    Ok(sas_cli::top::render(&snap))
}

/// The answer a `complete|fail|heartbeat|approve|reject` command gives, checked (`None` for the
/// other commands).
fn answer_of(cmd: &Cmd) -> Result<Option<(CallbackToken, Answer, ReplyArgs)>> {
    let (token, answer, reply) = match cmd {
        Cmd::Complete { token, output, reply } => {
            (token, Answer::Complete { output: answer::parse_json("--output", output)? }, reply)
        }
        Cmd::Fail { token, error, retryable, reply } => {
            (token, Answer::Fail { error: answer::non_empty("--error", error)?, retryable: *retryable }, reply)
        }
        Cmd::Heartbeat { token, details, reply } => {
            let details = details.as_deref().map(|d| answer::parse_json("--details", d)).transpose()?;
            (token, Answer::Heartbeat { details }, reply)
        }
        Cmd::Approve { token, comment, reply } => (token, Answer::Approve { comment: comment.clone() }, reply),
        Cmd::Reject { token, reason, reply } => {
            (token, Answer::Reject { reason: answer::non_empty("--reason", reason)? }, reply)
        }
        _ => return Ok(None),
    };
    Ok(Some((answer::parse_token(token)?, answer, *reply)))
}

/// Apply one answer to a callback step, in-process (as the callback queue and the HTTPS endpoint
/// do), and say what it did. Its arguments were checked first ([`answer_of`]); the token is never
/// printed. Exit 1 (an error line) when the answer was not taken.
async fn answer_step(
    cli: &Cli,
    sdk: &aws_config::SdkConfig,
    token: &CallbackToken,
    answer: &Answer,
    reply_args: ReplyArgs,
) -> Result<()> {
    let deps = deps(cli, sdk).await?;
    let (reply, line, took) = answer::apply(&deps, token, answer).await?;
    if reply_args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    }
    if !took {
        bail!("{line}");
    }
    if !reply_args.json {
        println!("{line}");
    }
    Ok(())
}

/// `sasctl load`: the burst, the polling (progress on stderr), the figures.
async fn load(
    sdk: &aws_config::SdkConfig,
    res: &Resources,
    opts: &sas_cli::load::LoadOptions,
    json: bool,
) -> Result<()> {
    let sqs = sas_core::aws::sqs_client(sdk);
    let reader = TableReader::new(sdk, res);
    eprintln!(
        "load: sending {} {} tasks ({}-NNNNN) to {}",
        opts.tasks, opts.workflow, opts.prefix, res.submission_queue_url
    );
    let started = std::time::Instant::now();
    let burst = sas_cli::load::send_burst(&sqs, &res.submission_queue_url, opts).await?;
    eprintln!(
        "load: sent {} in {:.2} s ({} requests, {} entries failed{})",
        burst.sent.len(),
        burst.elapsed.as_secs_f64(),
        burst.requests,
        burst.failed,
        burst.first_failure.as_ref().map(|f| format!(": {f}")).unwrap_or_default()
    );
    let ids: Vec<TaskId> = burst.sent.iter().map(|(id, _)| id.clone()).collect();
    let mut last_print: Option<std::time::Instant> = None;
    let (tasks, reads) = sas_cli::load::poll_until_terminal(&reader, &ids, started, opts, |p| {
        if last_print.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) || p.terminal == p.total {
            eprintln!("load: {p}");
            last_print = Some(std::time::Instant::now());
        }
    })
    .await?;
    let mut report = sas_cli::load::report(&opts.workflow, opts.tasks, &burst, &tasks, started.elapsed(), reads);
    report.run.clone_from(&opts.prefix);
    if json {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The book's page of commands, `docs/reference/sasctl.md`.
    const PAGE: &str = include_str!("../../../docs/reference/sasctl.md");

    /// The page's table rows that name `command`: `` | `command ...` | ... ``.
    fn rows<'a>(page: &'a str, command: &str) -> Vec<&'a str> {
        page.lines()
            .filter(|l| {
                l.strip_prefix("| `")
                    .and_then(|rest| rest.strip_prefix(command))
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('`'))
            })
            .collect()
    }

    /// `--long` in `text`, as a whole option (`--wait` is not in `--wait-secs`).
    fn names_option(text: &str, long: &str) -> bool {
        let needle = format!("--{long}");
        text.match_indices(&needle)
            .any(|(at, _)| !text[at + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
    }

    /// The reference cannot rot: every command of `sasctl` has its row on the page, every long
    /// option of a command is in its row, the global options are on the page, the page's count of
    /// commands is right, and every row that names a command names one that exists.
    #[test]
    fn the_book_s_sasctl_page_names_every_command_and_every_option() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for arg in cli.get_arguments() {
            if let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) {
                if !names_option(PAGE, long) {
                    missing.push(format!("global option --{long}"));
                }
            }
        }
        let commands: Vec<&clap::Command> = cli.get_subcommands().filter(|c| c.get_name() != "help").collect();
        for cmd in &commands {
            let name = cmd.get_name();
            let rows = rows(PAGE, name);
            if rows.is_empty() {
                missing.push(format!("command {name} (a row `| `{name} ...` | ... |`)"));
                continue;
            }
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) else { continue };
                if arg.is_global_set() {
                    continue;
                }
                if !rows.iter().any(|r| names_option(r, long)) {
                    missing.push(format!("option --{long} of {name} (in its row)"));
                }
            }
        }
        assert!(missing.is_empty(), "docs/reference/sasctl.md does not name: {missing:#?}");
        let count = format!("has {} commands", commands.len());
        assert!(PAGE.contains(&count), "docs/reference/sasctl.md should say sasctl {count}");
        // and names no command that is gone: a row that starts with a name (not an option) is a command's
        for line in PAGE.lines() {
            let Some(rest) = line.strip_prefix("| `") else { continue };
            let word: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
            if word.is_empty() || word.starts_with('-') {
                continue;
            }
            assert!(
                commands.iter().any(|c| c.get_name() == word),
                "docs/reference/sasctl.md has a row for `{word}`, which sasctl does not have: {line}"
            );
        }
    }
}
