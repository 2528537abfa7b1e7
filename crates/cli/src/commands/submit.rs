//! `sasctl submit`: a submission sent to the submission queue, and with `--wait` the wait for the
//! task, its exit status saying where it got to.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};
use sas_core::config::Resources;
use sas_core::deps::Deps;
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{Submission, VERSION};
use sas_protocol::protocol::ProcessState;

use super::{Global, POLL};
use crate::ops::{Until, Waited};
use crate::timeline;

/// Send a submission to the submission queue.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = "order")]
    pub workflow: String,
    #[arg(long)]
    pub task_id: Option<String>,
    /// The task input, JSON.
    #[arg(long, default_value = "{}")]
    pub input: String,
    /// The URL of a queue of yours for the task's status messages; it must be on the stack's
    /// allow-list (output ReplyQueueArnPattern; by default queues named <stack>-reply-*).
    #[arg(long)]
    pub reply_to: Option<String>,
    /// 0 (the default, the lowest) to 9: the task's place in the line of its workflow's
    /// concurrency key, when it waits (each level is worth a minute of waiting).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: Option<u8>,
    /// Then wait: until the task ends (`--wait`, or `--wait ended`), printing its timeline as
    /// `status` does, or until the Submitter has created it (`--wait created`). Exit status:
    /// 0 when it ended Processed (or was created), 2 when it ended otherwise (Compensated,
    /// Error, Cancelled), 3 when the time ran out (saying where the task was).
    #[arg(long, value_enum, value_name = "UNTIL", num_args = 0..=1, default_missing_value = "ended")]
    pub wait: Option<Until>,
    /// With --wait: how long at most.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub wait_secs: u64,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let Args { workflow, task_id, input, reply_to, priority, wait, wait_secs } = args;
    let sdk = super::sdk().await;
    let outputs = global.outputs(&sdk).await?;
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
        priority: *priority,
        schedule: None,
    };
    crate::ops::send_submission(&sas_core::aws::sqs_client(&sdk), &res.submission_queue_url, &sub).await?;
    let task_id = task_id.expect("set above");
    println!("{task_id}");
    let Some(until) = wait else { return Ok(0) };
    let deps = super::deps_from(&sdk, &outputs)?.0;
    submit_wait(&deps, &task_id, *until, Duration::from_secs(*wait_secs)).await
}

/// `sasctl submit --wait`: wait for the task just submitted, say where it got to, and return the
/// exit status (0 reached as asked and, for an end, `Processed`; 2 another end; 3 out of time).
async fn submit_wait(deps: &Deps, id: &TaskId, until: Until, wait: Duration) -> Result<i32> {
    let started = std::time::Instant::now();
    let waited = crate::ops::wait_for_task(deps, id, until, wait, POLL).await?;
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
            let t = crate::ops::with_whole_history(deps, *t).await?;
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
            println!("{id}: not created after {secs:.0} s; {}", crate::ops::no_task_yet(id));
            3
        }
    })
}
