//! `sasctl schedule` ([`crate::schedule`]).
#![allow(clippy::print_stdout)]

use anyhow::{bail, Context, Result};
use sas_protocol::schedules::{self, Every, Overlap};

use super::Global;
use crate::schedule::{self as sched, Spec};

/// Start a workflow on a cron expression or a rate, with its input: create, list, pause, resume,
/// delete, trigger an instant now, backfill a past range. The Supervisor's sweep (every minute on
/// AWS) sends each instant that is due; an instant's task id is the schedule's name and the
/// instant (`nightly-20261129T020000Z`), so an instant sent twice is one task.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Create a schedule.
    Create(CreateArgs),
    /// List the schedules: when, overlap, the next instant, how many were sent.
    List,
    /// Pause a schedule: no instant is sent until it is resumed.
    Pause {
        name: String,
        #[arg(long, default_value = "paused by an operator")]
        reason: String,
    },
    /// Resume a paused schedule from its next instant (those passed meanwhile are not sent:
    /// backfill them).
    Resume { name: String },
    /// Delete a schedule (its tasks in flight run on).
    Delete { name: String },
    /// Send one instant now (or the instant --at), under the schedule's overlap policy.
    Trigger {
        name: String,
        /// The instant's time (RFC 3339); now when absent.
        #[arg(long)]
        at: Option<String>,
    },
    /// Send every instant of a past range, [--from, --to): their tasks run one after another (in
    /// the order they reach the Submitter); an instant that ran already is not run again.
    Backfill {
        name: String,
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
    },
}

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// The schedule's name: letters, digits, '.', '_', '-' (it begins its tasks' ids).
    pub name: String,
    /// The workflow it starts.
    #[arg(long)]
    pub workflow: String,
    /// Pin a version of the workflow (the latest deployed when absent).
    #[arg(long)]
    pub workflow_version: Option<u32>,
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds
    /// first), e.g. "0 2 * * *" (every day at 02:00).
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    pub cron: Option<String>,
    /// A period instead (at least 1s): 30s, 5m, 1h; counted from the schedule's creation.
    #[arg(long)]
    pub every: Option<String>,
    /// The IANA time zone of the cron expression (Europe/Paris); UTC by default.
    #[arg(long)]
    pub tz: Option<String>,
    /// What an instant does while the previous one's task runs: skip, buffer_one, buffer_all,
    /// cancel_previous, allow_all.
    #[arg(long, default_value = "skip")]
    pub overlap: String,
    /// Send each instant up to this much later (a stable offset per instant): 30s.
    #[arg(long)]
    pub jitter: Option<String>,
    /// The tasks' input (JSON).
    #[arg(long, default_value = "{}")]
    pub input: String,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let refused = |why: &dyn std::fmt::Display| {
        println!("{why}");
        Ok(1)
    };
    match &args.cmd {
        Cmd::Create(a) => {
            let every = match (&a.cron, &a.every) {
                (Some(c), _) => Every::Cron(c.clone()),
                (None, Some(p)) => Every::RateMs(sched::parse_period(p).map_err(anyhow::Error::msg)?),
                (None, None) => bail!("give --cron or --every"),
            };
            let spec = Spec {
                name: a.name.clone(),
                workflow: a.workflow.clone(),
                version: a.workflow_version,
                input: serde_json::from_str(&a.input).context("--input is not JSON")?,
                every,
                time_zone: a.tz.clone(),
                overlap: a.overlap.parse::<Overlap>().map_err(anyhow::Error::msg)?,
                jitter_ms: a
                    .jitter
                    .as_deref()
                    .map(sched::parse_period)
                    .transpose()
                    .map_err(anyhow::Error::msg)?
                    .unwrap_or(0),
            };
            match sched::create(&deps, &spec).await? {
                Ok(first) => {
                    println!(
                        "schedule {} created: workflow {}, overlap {}; its first instant {} (task {}), sent by the \
                         Supervisor's sweep (every minute on AWS)",
                        spec.name,
                        spec.workflow,
                        spec.overlap.as_str(),
                        schedules::rfc3339(first),
                        schedules::task_id(&spec.name, first)
                    );
                    Ok(0)
                }
                Err(why) => refused(&why),
            }
        }
        Cmd::List => {
            print!("{}", sched::render(&sched::list(&deps).await?));
            Ok(0)
        }
        Cmd::Pause { name, reason } => match sched::set_paused(&deps, name, Some(reason)).await? {
            Ok(_) => {
                println!("schedule {name} paused: no instant is sent until sasctl schedule resume {name}");
                Ok(0)
            }
            Err(why) => refused(&why),
        },
        Cmd::Resume { name } => match sched::set_paused(&deps, name, None).await? {
            Ok(next) => {
                println!(
                    "schedule {name} resumed: its next instant is {} (those passed while paused are not sent: \
                     sasctl schedule backfill sends them)",
                    schedules::rfc3339(next)
                );
                Ok(0)
            }
            Err(why) => refused(&why),
        },
        Cmd::Delete { name } => match sched::delete(&deps, name).await? {
            Ok(s) => {
                println!(
                    "schedule {name} deleted ({} of workflow {}, {} instants sent); its tasks in flight run on",
                    sched::describe_every(&s),
                    s.workflow,
                    s.fired
                );
                Ok(0)
            }
            Err(why) => refused(&why),
        },
        Cmd::Trigger { name, at } => {
            let at = at.as_deref().map(sched::parse_time).transpose().map_err(anyhow::Error::msg)?;
            match sched::trigger(&deps, name, at).await? {
                Ok(task) => {
                    println!(
                        "instant sent to the submission queue as task {task} (sasctl status {task}); under the \
                         schedule's overlap policy it may wait, or be refused while another instant runs"
                    );
                    Ok(0)
                }
                Err(why) => refused(&why),
            }
        }
        Cmd::Backfill { name, from, to } => {
            let (from, to) = (sched::parse_time(from), sched::parse_time(to));
            let (from, to) = (from.map_err(anyhow::Error::msg)?, to.map_err(anyhow::Error::msg)?);
            match sched::backfill(&deps, name, from, to).await? {
                Ok(sent) if sent.is_empty() => refused(&"the range holds no instant of the schedule: nothing sent"),
                Ok(sent) => {
                    println!(
                        "{} instants sent, {} to {} (tasks {} to {}): they run one after another, each once; an \
                         instant that ran already is not run again",
                        sent.len(),
                        schedules::rfc3339(sent[0]),
                        schedules::rfc3339(sent[sent.len() - 1]),
                        schedules::task_id(name, sent[0]),
                        schedules::task_id(name, sent[sent.len() - 1])
                    );
                    Ok(0)
                }
                Err(why) => refused(&why),
            }
        }
    }
}
