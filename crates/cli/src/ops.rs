//! Operator actions, shared by the `sasctl` binary and the tests. Each sends the message the
//! Scheduler acts on (it decides, with a conditional write, whether the action still applies).
//!
//! `sasctl` does not send blind: it reads the task first and asks the protocol itself
//! ([`check`], through [`sas_protocol::protocol::apply`]) whether the command would change anything,
//! so that a no-op is refused at once, naming the state and why ([`Refusal`]). Otherwise it sends
//! the command and waits until the task's `Rev` moves ([`wait_applied`]), then tells what the
//! command led to ([`describe_change`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use sas_core::bus::{encode, Outgoing};
use sas_core::deps::Deps;
use sas_protocol::ids::{AttemptToken, TaskId};
use sas_protocol::messages::{CancelMessage, ResubmitMessage, SchedulerMessage, Submission, VERSION};
use sas_protocol::protocol::{self, Ctx, EndCause, Event, Policy, ProcessState, Stage, Stale, Task};
use sas_protocol::workflow::StepKind;

use crate::table::{ReadCost, TableReader};

pub async fn send_submission(sqs: &Client, queue: &str, sub: &Submission) -> anyhow::Result<()> {
    sqs.send_message()
        .queue_url(queue)
        .message_body(serde_json::to_string(sub)?)
        .send()
        .await
        .map_err(aws_sdk_sqs::Error::from)?;
    Ok(())
}

/// An operator's command on one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop the task: its completed steps are compensated and it ends `Cancelled`.
    Cancel,
    /// An `Error` task resumes from its failed step (or its failed compensation).
    Resubmit,
}

impl Command {
    pub fn verb(self) -> &'static str {
        match self {
            Command::Cancel => "cancel",
            Command::Resubmit => "resubmit",
        }
    }

    fn event(self, reason: &str, run: Option<u32>) -> Event {
        match self {
            Command::Cancel => Event::Cancel { reason: reason.to_owned(), run },
            Command::Resubmit => Event::Resubmit { reason: reason.to_owned(), run },
        }
    }

    /// The message for `task_id`; it names the run the operator saw, so it applies once, to
    /// that run (a duplicate delivery, or one that arrives after the task moved to another run,
    /// changes nothing).
    fn message(self, task_id: &TaskId, reason: &str, run: Option<u32>) -> SchedulerMessage {
        let (task_id, reason) = (task_id.clone(), reason.to_owned());
        match self {
            Command::Cancel => SchedulerMessage::Cancel(CancelMessage { v: VERSION, task_id, reason, run }),
            Command::Resubmit => SchedulerMessage::Resubmit(ResubmitMessage { v: VERSION, task_id, reason, run }),
        }
    }

    /// Whether `after` shows this command's hand (rather than the task moving on by itself).
    pub fn applied(self, before: &Task, after: &Task) -> bool {
        match self {
            Command::Cancel => {
                after.process_state == ProcessState::Cancelled
                    || matches!(after.stage, Stage::Compensating { cause: EndCause::Cancelled, .. })
            }
            Command::Resubmit => after.run > before.run,
        }
    }
}

/// A command that would change nothing for the task as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {} {task_id}: {why}", command.verb())]
pub struct Refusal {
    pub command: Command,
    pub task_id: TaskId,
    /// `None`: there is no such task.
    pub state: Option<ProcessState>,
    pub why: String,
}

/// Whether `command` changes anything for `task` (`None`: no such task), decided by the protocol
/// itself; `Ok` carries the task as the command would leave it.
pub fn check(command: Command, task_id: &TaskId, task: Option<&Task>) -> Result<Task, Refusal> {
    let Some(task) = task else {
        return Err(Refusal {
            command,
            task_id: task_id.clone(),
            state: None,
            why: "there is no such task (check the id, or whether it expired: finished tasks are kept RetentionDays)"
                .to_owned(),
        });
    };
    let ctx = Ctx { paused: false, now: task.updated_at, fresh_token: AttemptToken::from("sasctl-check"), jitter: 0.0 };
    match protocol::apply(task, &command.event("check", Some(task.run)), &ctx, &Policy::default()) {
        Ok(t) => Ok(t.task),
        Err(stale) => Err(Refusal {
            command,
            task_id: task.task_id.clone(),
            state: Some(task.process_state),
            why: why(command, task, &stale),
        }),
    }
}

/// The operator's explanation of a refusal: the state, and why the command changes nothing there.
fn why(command: Command, task: &Task, stale: &Stale) -> String {
    use ProcessState as P;
    let s = task.process_state;
    match (command, stale) {
        (Command::Cancel, Stale::Terminal(_)) => {
            let what = match s {
                P::Processed => "every step succeeded, there is nothing left to stop",
                P::Compensated => "it already failed and its completed steps were undone",
                P::Cancelled => "it was cancelled already",
                P::Rejected => "the submission never became a running task",
                _ => "a terminal state",
            };
            format!("it is {s}: {what} (cancel applies to Pending, Processing and Error tasks)")
        }
        (Command::Cancel, Stale::AlreadyCompensating) if s == P::Error => format!(
            "it is Error because its compensation failed ({}); cancel would change nothing: resubmit it to retry \
             the compensation once the cause is fixed",
            task.reason.as_deref().unwrap_or("no reason recorded")
        ),
        (Command::Cancel, Stale::AlreadyCompensating) => format!(
            "it is {s}: its completed steps are already being undone ({}), so cancel would change nothing",
            task.reason.as_deref().unwrap_or("no reason recorded")
        ),
        (Command::Resubmit, Stale::NotResubmittable(_)) => {
            let what = match s {
                P::Pending | P::Processing | P::Compensating => "it is still running",
                P::Processed => "every step succeeded",
                P::Compensated | P::Cancelled => {
                    "it has ended and its completed steps were undone (submit a new task to run it again)"
                }
                P::Rejected => "the submission never became a running task",
                P::Error => "it is parked",
            };
            format!("it is {s}: {what}; only a task parked in Error can be resubmitted")
        }
        (_, other) => format!("it is {s}: {other}"),
    }
}

/// What the task is doing now, for an operator: `compensating charge (refund)`, `running ship`.
fn doing(t: &Task) -> Option<String> {
    if t.process_state.is_terminal() {
        return None;
    }
    let unit = t.current_def().name.as_str();
    let step = t.steps.get(t.unit_step()).map_or(unit, |s| s.name.as_str());
    let kind = &t.current_def().kind;
    let running = t.lock.locked_by.is_some();
    Some(match (t.is_compensating(), t.process_state) {
        (true, _) if !running && t.lock.awaits.is_some() => match t.claim.not_before {
            // a cancelled attempt may still apply until then (or until it answers)
            Some(at) => format!(
                "compensating {step} ({unit}) once its cancelled attempt can no longer apply: at {} at the latest, \
                 sooner if it answers",
                crate::timeline::utc(at)
            ),
            None => format!("compensating {step} ({unit}) once its cancelled attempt answers"),
        },
        (true, _) => format!("compensating {step} ({unit})"),
        (false, ProcessState::Processing) if let StepKind::Workflow(w) = kind => format!(
            "waiting for {step}'s child task {} (workflow {})",
            sas_protocol::ids::TaskId::child(&t.task_id, t.unit_step(), 0),
            w.workflow
        ),
        (false, ProcessState::Processing) if running => match kind {
            StepKind::Call { .. } | StepKind::Workflow(_) => format!("running {step}"),
            StepKind::Callback { .. } => format!("waiting for the answer to {step} (callback step)"),
            StepKind::Wait(_) => format!("waiting in {step} until {}", t.complete_by.map_or(0, |m| m.0)),
            StepKind::Loop(_) => format!(
                "waiting in loop {step} until {}, then its iteration {}",
                t.complete_by.map_or(0, |m| m.0),
                t.steps[t.unit_step()].map.as_ref().map_or(0, |p| p.started)
            ),
        },
        (false, ProcessState::Processing) if let StepKind::Loop(_) = kind => {
            let i = t.steps[t.unit_step()].map.as_ref().map_or(0, |p| p.started.saturating_sub(1));
            format!(
                "running {step}'s iteration {i}, child task {}",
                sas_protocol::ids::TaskId::child(&t.task_id, t.unit_step(), i)
            )
        }
        (false, ProcessState::Processing) => format!("running {step}"),
        (false, _) => format!("next: {step}"),
    })
}

/// One line telling what a change did: `t-1: Processing -> Compensating (cancelled: customer
/// asked); compensating charge (refund)`.
/// Every state it went through on the way is named (from the task's history): `Processing ->
/// Compensating -> Cancelled`.
pub fn describe_change(before: &Task, after: &Task) -> String {
    let mut path = vec![before.process_state];
    for h in after.history.iter().filter(|h| h.seq > before.status_seq) {
        if path.last() != Some(&h.state) {
            path.push(h.state);
        }
    }
    if path.len() == 1 || path.last() != Some(&after.process_state) {
        path.push(after.process_state);
    }
    let path: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
    let mut s = format!("{}: {}", after.task_id, path.join(" -> "));
    if let Some(r) = &after.reason {
        let _ = write!(s, " ({r})");
    }
    if let Some(d) = doing(after) {
        let _ = write!(s, "; {d}");
    }
    s
}

/// How a command ended for one task.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The command changed the task.
    Moved { before: Box<Task>, after: Box<Task> },
    /// Nothing changed in time; the command may still be applied later.
    Unchanged { before: Box<Task> },
    /// The task moved on by itself to a state where the command changes nothing.
    Overtaken { before: Box<Task>, after: Box<Task>, refusal: Refusal },
    /// The task disappeared (deleted, or expired by TTL) while we waited.
    Gone { before: Box<Task> },
}

/// Why waiting for a command did not end with the command applied.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error(
        "{task_id} did not change within {secs} s (still {state} at rev {rev}): the {verb} is queued and may still \
         be applied later; see `sasctl status {task_id}`"
    )]
    Unchanged { task_id: TaskId, state: ProcessState, rev: u64, secs: u64, verb: &'static str },
    #[error("{} moved on by itself before the {} was applied ({}); {refusal}", after.task_id, refusal.command.verb(), describe_change(before, after))]
    Overtaken { before: Box<Task>, after: Box<Task>, refusal: Refusal },
    #[error("{task_id} disappeared while waiting for the {verb} (deleted, or expired)")]
    Gone { task_id: TaskId, verb: &'static str },
}

/// One look at a task we wait on: `None` while the command may still come.
fn judge(command: Command, before: &Task, seen_rev: &mut u64, now: Option<Task>) -> Option<Applied> {
    let Some(now) = now else {
        return Some(Applied::Gone { before: Box::new(before.clone()) });
    };
    if now.rev == *seen_rev {
        return None;
    }
    *seen_rev = now.rev;
    if command.applied(before, &now) {
        return Some(Applied::Moved { before: Box::new(before.clone()), after: Box::new(now) });
    }
    // The task moved by itself; the command is still on its way unless it would now change nothing.
    match check(command, &now.task_id, Some(&now)) {
        Ok(_) => None,
        Err(refusal) => Some(Applied::Overtaken { before: Box::new(before.clone()), after: Box::new(now), refusal }),
    }
}

/// Send `command` for one task, after reading it and checking that it changes anything.
/// Returns the task as read (the refusal is the error otherwise).
pub async fn send_checked(deps: &Deps, command: Command, task_id: &TaskId, reason: &str) -> anyhow::Result<Task> {
    let before = deps.store.get(task_id).await?;
    let before = check(command, task_id, before.as_ref()).map(|_| before.expect("checked: the task exists"))?;
    deps.outbox().to_scheduler(&command.message(task_id, reason, Some(before.run)), 0).await?;
    Ok(before)
}

/// Poll the task (one strongly consistent `GetItem` per `every`) until `command` shows, the task
/// moves where the command changes nothing, or `wait` passes.
pub async fn wait_applied(
    deps: &Deps,
    command: Command,
    before: &Task,
    wait: Duration,
    every: Duration,
) -> anyhow::Result<Task> {
    let deadline = Instant::now() + wait;
    let mut seen = before.rev;
    loop {
        let now = deps.store.get(&before.task_id).await?;
        match judge(command, before, &mut seen, now) {
            Some(Applied::Moved { after, .. }) => return Ok(*after),
            Some(Applied::Overtaken { before, after, refusal }) => {
                return Err(WaitError::Overtaken { before, after, refusal }.into())
            }
            Some(Applied::Gone { before }) => {
                return Err(WaitError::Gone { task_id: before.task_id, verb: command.verb() }.into())
            }
            Some(Applied::Unchanged { .. }) | None => {}
        }
        if Instant::now() >= deadline {
            let last = deps.store.get(&before.task_id).await?.unwrap_or_else(|| before.clone());
            return Err(WaitError::Unchanged {
                task_id: before.task_id.clone(),
                state: last.process_state,
                rev: last.rev,
                secs: wait.as_secs(),
                verb: command.verb(),
            }
            .into());
        }
        tokio::time::sleep(every).await;
    }
}

/// How long `sasctl submit --wait` waits: until the Submitter has created the task, or until the
/// task has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Until {
    /// The task item exists (the Submitter took the submission).
    Created,
    /// The task is in an end state (Processed, Compensated, Error, Cancelled).
    Ended,
}

/// Where a task stood when a wait for it stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum Waited {
    /// The wait got what it asked for: the task as last read.
    Reached(Box<Task>),
    /// Time ran out with the task in flight (or not yet ended).
    StillRunning(Box<Task>),
    /// Time ran out and there is no task of this id.
    NotCreated,
}

/// Whether `task` (as read, `None` when there is none) is what `until` waits for.
pub fn reached(until: Until, task: Option<&Task>) -> bool {
    match (until, task) {
        (_, None) => false,
        (Until::Created, Some(_)) => true,
        (Until::Ended, Some(t)) => t.process_state.is_terminal(),
    }
}

/// Poll task `id` (one strongly consistent `GetItem` per `every`) until it is what `until` asks
/// for, or `wait` passes.
pub async fn wait_for_task(
    deps: &Deps,
    id: &TaskId,
    until: Until,
    wait: Duration,
    every: Duration,
) -> anyhow::Result<Waited> {
    let deadline = Instant::now() + wait;
    loop {
        let task = deps.store.get(id).await?;
        if reached(until, task.as_ref()) {
            return Ok(Waited::Reached(Box::new(task.expect("reached: the task exists"))));
        }
        if Instant::now() >= deadline {
            return Ok(task.map_or(Waited::NotCreated, |t| Waited::StillRunning(Box::new(t))));
        }
        tokio::time::sleep(every).await;
    }
}

/// What to tell a person who asked for a task that does not exist (yet).
pub fn no_task_yet(id: &TaskId) -> String {
    format!(
        "no task {id}: the table has none (yet). A submission becomes a task when the Submitter takes \
         it from the submission queue, within seconds while the functions run; one that never \
         becomes a task was rejected (it is in the submission dead-letter queue, with its reason) or \
         waits for a Submitter that is not running. `sasctl submit --wait` waits until the task exists"
    )
}

/// `task` with its whole history: the entries the item dropped (it keeps the last
/// `history_limit`) are read back from its archive and put before the ones it keeps
/// (`sasctl status` and `sasctl ui`'s task page show them all).
pub async fn with_whole_history(deps: &Deps, mut task: Task) -> anyhow::Result<Task> {
    if let Some(first) = task.history.first().map(|h| h.seq).filter(|s| *s > 1) {
        let mut older = deps.store.archived_history(&task.task_id, 1, first).await?;
        older.append(&mut task.history);
        task.history = older;
    }
    Ok(task)
}

/// Check, send, and (unless `wait` is `None`) wait for one command on one task, polling every
/// `poll`: the line that says what it led to (`sasctl cancel|resubmit` print it, `sasctl ui`
/// shows it). A refusal, a command overtaken by the task, or one not applied in time is the error.
pub async fn one_command(
    deps: &Deps,
    command: Command,
    id: &TaskId,
    reason: &str,
    wait: Option<Duration>,
    poll: Duration,
) -> anyhow::Result<String> {
    let before = send_checked(deps, command, id, reason).await?;
    let Some(wait) = wait else {
        return Ok(format!(
            "{} sent for {id} ({} at rev {}); not waiting: see `sasctl status {id}`",
            command.verb(),
            before.process_state,
            before.rev
        ));
    };
    let after = wait_applied(deps, command, &before, wait, poll).await?;
    Ok(describe_change(&before, &after))
}

/// Stop a task as an application does: without reading it, so without naming a run. It applies
/// to a task still running; a task in `Error` is an operator's and takes only a command that
/// names its run (see [`send_checked`]).
pub async fn cancel(deps: &Deps, task_id: &TaskId, reason: &str) -> anyhow::Result<()> {
    deps.outbox().to_scheduler(&Command::Cancel.message(task_id, reason, None), 0).await?;
    Ok(())
}

/// Resubmit tasks each fenced to the run it was seen in (`Error`), in batches of ten.
pub async fn resubmit_runs(deps: &Deps, tasks: &[(TaskId, u32)], reason: &str) -> anyhow::Result<()> {
    let msgs = tasks
        .iter()
        .map(|(t, run)| encode(&Command::Resubmit.message(t, reason, Some(*run))).map(Outgoing::new))
        .collect::<Result<Vec<_>, _>>()?;
    deps.outbox().to_scheduler_batch(msgs).await?;
    Ok(())
}

/// Resubmit every task in `Error` (as the operators' index lists them, up to `max`), each fenced
/// to the run it is read in; returns their ids. Without waiting (see [`resubmit_state_error`]).
pub async fn resubmit_all_in_error(deps: &Deps, reason: &str, max: usize) -> anyhow::Result<Vec<TaskId>> {
    let ids: Vec<TaskId> =
        deps.store.list_by_state(ProcessState::Error, max).await?.into_iter().map(|r| r.task_id).collect();
    let tasks = deps.store.get_many(&ids).await?;
    let runs: Vec<(TaskId, u32)> =
        tasks.iter().filter(|t| t.process_state == ProcessState::Error).map(|t| (t.task_id.clone(), t.run)).collect();
    resubmit_runs(deps, &runs, reason).await?;
    Ok(runs.into_iter().map(|(id, _)| id).collect())
}

/// What `resubmit --state Error` did.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// Listed by the index but no longer resubmittable when read (or gone).
    pub skipped: Vec<Refusal>,
    /// The tasks a resubmit was sent for, and how each ended.
    pub outcomes: Vec<Applied>,
    /// Set when some resubmit messages could not be sent.
    pub send_error: Option<String>,
    /// What reading the table cost (the index listing not included).
    pub reads: ReadCost,
    /// False with `--no-wait`.
    pub waited: bool,
}

impl BatchReport {
    pub fn requested(&self) -> usize {
        self.outcomes.len()
    }

    pub fn moved(&self) -> usize {
        self.outcomes.iter().filter(|o| matches!(o, Applied::Moved { .. })).count()
    }

    pub fn unchanged(&self) -> usize {
        self.outcomes.iter().filter(|o| matches!(o, Applied::Unchanged { .. })).count()
    }

    /// Moved by something else (another operator), or gone.
    pub fn other(&self) -> usize {
        self.outcomes.iter().filter(|o| matches!(o, Applied::Overtaken { .. } | Applied::Gone { .. })).count()
    }

    /// Whether every resubmit that was sent showed in time.
    pub fn all_moved(&self) -> bool {
        self.send_error.is_none() && (!self.waited || self.moved() == self.requested())
    }

    /// `resubmit --state Error: requested 804, moved 800, unchanged 4`.
    pub fn summary(&self) -> String {
        let mut s = format!("resubmit --state Error: requested {}", self.requested());
        if self.waited {
            let _ = write!(s, ", moved {}, unchanged {}", self.moved(), self.unchanged());
            if self.other() > 0 {
                let _ = write!(s, ", changed otherwise {}", self.other());
            }
        } else {
            s.push_str(" (not waiting)");
        }
        if !self.skipped.is_empty() {
            let _ = write!(s, "; skipped {} no longer in Error", self.skipped.len());
        }
        s
    }

    /// One line per task.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.skipped.iter().map(|r| format!("skipped: {r}")).collect();
        for o in &self.outcomes {
            out.push(match o {
                Applied::Moved { before, after } => describe_change(before, after),
                Applied::Unchanged { before } if self.waited => {
                    format!(
                        "{}: unchanged (still {} at rev {}); the resubmit may still be applied later",
                        before.task_id, before.process_state, before.rev
                    )
                }
                Applied::Unchanged { before } => {
                    format!("{}: resubmit sent ({} at rev {})", before.task_id, before.process_state, before.rev)
                }
                Applied::Overtaken { before, after, refusal } => {
                    format!("{}: changed otherwise ({}); {refusal}", after.task_id, describe_change(before, after))
                }
                Applied::Gone { before } => format!("{}: disappeared while waiting", before.task_id),
            });
        }
        out
    }
}

/// `resubmit --state Error`: list the `Error` tasks (up to `max`), read them in batches of 100
/// (strongly consistent `BatchGetItem`: the index may lag), send a resubmit for each one still in
/// `Error` (`SendMessageBatch`, ten per request), then, unless `wait` is `None`, poll the ones
/// sent (`BatchGetItem` again, every `every`) until each shows the resubmit or `wait` passes.
pub async fn resubmit_state_error(
    deps: &Deps,
    reader: &TableReader,
    reason: &str,
    max: usize,
    wait: Option<Duration>,
    every: Duration,
) -> anyhow::Result<BatchReport> {
    let listed: Vec<TaskId> =
        deps.store.list_by_state(ProcessState::Error, max).await?.into_iter().map(|r| r.task_id).collect();
    let mut report = BatchReport { waited: wait.is_some(), ..BatchReport::default() };
    let mut sent: Vec<Task> = Vec::new();
    for chunk in listed.chunks(crate::table::BATCH_GET_MAX) {
        let (found, cost) = reader.get_many(chunk, true).await?;
        report.reads += cost;
        let mut ok = Vec::new();
        for id in chunk {
            match check(Command::Resubmit, id, found.get(id)) {
                Ok(_) => ok.push(found[id].clone()),
                Err(r) => report.skipped.push(r),
            }
        }
        let runs: Vec<(TaskId, u32)> = ok.iter().map(|t| (t.task_id.clone(), t.run)).collect();
        if let Err(e) = resubmit_runs(deps, &runs, reason).await {
            report.send_error.get_or_insert_with(|| format!("{e:#}"));
        }
        sent.extend(ok);
    }
    let Some(wait) = wait else {
        report.outcomes = sent.into_iter().map(|t| Applied::Unchanged { before: Box::new(t) }).collect();
        return Ok(report);
    };
    let deadline = Instant::now() + wait;
    let mut pending: HashMap<TaskId, (Task, u64)> =
        sent.into_iter().map(|t| (t.task_id.clone(), (t.clone(), t.rev))).collect();
    while !pending.is_empty() {
        tokio::time::sleep(every).await;
        let ids: Vec<TaskId> = pending.keys().cloned().collect();
        let (found, cost) = reader.get_many(&ids, true).await?;
        report.reads += cost;
        for id in ids {
            let (before, seen) = pending.get_mut(&id).expect("pending");
            if let Some(end) = judge(Command::Resubmit, before, seen, found.get(&id).cloned()) {
                report.outcomes.push(end);
                pending.remove(&id);
            }
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    report.outcomes.extend(pending.into_values().map(|(t, _)| Applied::Unchanged { before: Box::new(t) }));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_protocol::ids::Millis;
    use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
    use serde_json::json;

    fn ctx(now: u64) -> Ctx {
        Ctx {
            paused: false,
            now: Millis(now),
            fresh_token: AttemptToken::from(format!("tok{now}").as_str()),
            jitter: 0.0,
        }
    }

    fn id() -> TaskId {
        TaskId::try_from("t-1").unwrap()
    }

    fn new_task() -> Task {
        let wf = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve("sim-order", None).unwrap().clone();
        protocol::submit(
            id(),
            wf,
            json!({}),
            None,
            &ctx(2_000),
            &Policy { queue_budget_ms: 0, result_grace_ms: 0, settle_ms: 0, ..Policy::default() },
        )
        .task
    }

    #[test]
    fn an_operator_is_told_what_a_waiting_step_waits_for() {
        let mut t = new_task();
        t.workflow.steps[0].kind =
            sas_protocol::workflow::StepKind::Callback { agent: "sim".into(), heartbeat_ms: None };
        assert_eq!(doing(&t).as_deref(), Some("waiting for the answer to reserve (callback step)"));
        t.workflow.steps[0] = sas_protocol::workflow::StepDef::wait("reserve", 5_000);
        assert_eq!(
            doing(&t).as_deref(),
            Some(format!("waiting in reserve until {}", t.complete_by.unwrap().0).as_str())
        );
        t.lock.locked_by = None;
        t.process_state = ProcessState::Pending;
        assert_eq!(doing(&t).as_deref(), Some("next: reserve"));
    }

    /// Pending: the first attempt of reserve failed retryably, the retry not claimed yet.
    fn pending() -> Task {
        let t = new_task();
        let attempt = t.lock.locked_by.clone().unwrap();
        step(&t, &Event::AgentFailed { attempt, error: "503".into(), retryable: true }, 2_500)
    }

    fn step(t: &Task, e: &Event, now: u64) -> Task {
        protocol::apply(
            t,
            e,
            &ctx(now),
            &Policy { queue_budget_ms: 0, result_grace_ms: 0, settle_ms: 0, ..Policy::default() },
        )
        .expect("applies")
        .task
    }

    fn claim(t: &Task, now: u64) -> Task {
        step(t, &Event::Claim { rev: t.claim.rev }, now)
    }

    fn succeed(t: &Task, now: u64) -> Task {
        step(t, &Event::AgentSucceeded { attempt: t.lock.locked_by.clone().unwrap(), output: json!({}) }, now)
    }

    fn refuse(t: &Task, now: u64) -> Task {
        let attempt = t.lock.locked_by.clone().unwrap();
        step(t, &Event::AgentFailed { attempt, error: "declined".into(), retryable: false }, now)
    }

    /// Processing `charge` (reserve done).
    fn processing() -> Task {
        succeed(&new_task(), 3_000)
    }

    /// Charge refused, release refused too: Error while compensating.
    fn error_compensating() -> Task {
        let t = refuse(&processing(), 4_000); // Compensating: release
        refuse(&t, 5_000)
    }

    fn processed() -> Task {
        succeed(&succeed(&processing(), 4_000), 5_000)
    }

    /// Processing charge, then cancelled: compensating it (refund).
    fn cancelled_compensating() -> Task {
        step(&processing(), &Event::Cancel { reason: "customer asked".into(), run: None }, 4_000)
    }

    #[test]
    fn cancel_is_refused_for_missing_terminal_and_compensating_tasks() {
        let r = check(Command::Cancel, &id(), None).unwrap_err();
        assert_eq!(r.state, None);
        assert!(r.to_string().starts_with("cannot cancel t-1: there is no such task"), "{r}");

        let r = check(Command::Cancel, &id(), Some(&processed())).unwrap_err();
        assert_eq!(r.state, Some(ProcessState::Processed));
        assert!(r.to_string().contains("it is Processed: every step succeeded"), "{r}");

        let r = check(Command::Cancel, &id(), Some(&cancelled_compensating())).unwrap_err();
        assert_eq!(r.state, Some(ProcessState::Compensating));
        assert!(r.why.contains("already being undone (cancelled: customer asked)"), "{r}");

        // an Error left by a failed compensation: cancel resumes the compensation (fresh keys)
        let t = error_compensating();
        assert_eq!(t.process_state, ProcessState::Error);
        assert_eq!(check(Command::Cancel, &id(), Some(&t)).unwrap().process_state, ProcessState::Compensating);
    }

    #[test]
    fn cancel_applies_to_pending_processing_and_forward_error_tasks() {
        // the failed attempt may have reserved: undone before the task ends
        assert_eq!(check(Command::Cancel, &id(), Some(&pending())).unwrap().process_state, ProcessState::Compensating);
        let after = check(Command::Cancel, &id(), Some(&processing())).unwrap();
        assert_eq!(after.process_state, ProcessState::Compensating);
        assert!(Command::Cancel.applied(&processing(), &after));
    }

    #[test]
    fn resubmit_applies_only_to_error_tasks() {
        for t in [new_task(), processing(), processed(), cancelled_compensating()] {
            let r = check(Command::Resubmit, &id(), Some(&t)).unwrap_err();
            assert_eq!(r.state, Some(t.process_state));
            assert!(r.why.ends_with("only a task parked in Error can be resubmitted"), "{r}");
            assert!(r.why.starts_with(&format!("it is {}", t.process_state)), "{r}");
        }
        let t = error_compensating();
        let after = check(Command::Resubmit, &id(), Some(&t)).unwrap();
        assert_eq!(after.process_state, ProcessState::Compensating);
        assert!(Command::Resubmit.applied(&t, &after));
        assert!(!Command::Cancel.applied(&t, &after), "a resubmit is not a cancel");
    }

    #[test]
    fn changes_read_as_one_line() {
        let before = processing();
        let after = cancelled_compensating();
        assert_eq!(
            describe_change(&before, &after),
            "t-1: Processing -> Compensating (cancelled: customer asked); compensating charge (refund) once its \
             cancelled attempt can no longer apply: at 1970-01-01T00:00:08Z at the latest, sooner if it answers"
        );
        assert_eq!(describe_change(&processing(), &processed()), "t-1: Processing -> Processed");
        // States passed on the way come from the history. (The refund waits until the cancelled
        // charge attempt has answered: it can no longer race it.)
        let running = processing();
        let cancelled = step(&running, &Event::Cancel { reason: "customer asked".into(), run: None }, 4_000);
        let answered = Event::AgentSucceeded { attempt: running.lock.locked_by.clone().unwrap(), output: json!({}) };
        let refunding = claim(&step(&cancelled, &answered, 4_500), 4_600);
        let done = succeed(&succeed(&refunding, 5_000), 6_000);
        assert_eq!(
            describe_change(&before, &done),
            "t-1: Processing -> Compensating -> Cancelled (cancelled: customer asked)"
        );
        assert_eq!(
            describe_change(&pending(), &claim(&pending(), 3_000)),
            "t-1: Pending -> Processing (503; retry 2/3 in 500 ms); running reserve"
        );
    }

    #[test]
    fn the_path_names_every_state_after_a_restart_too() {
        // the path follows the history's seq, not rev: rev runs ahead of it after a restart (a
        // new revision, no new state), and compared with rev the states on the way are left out
        let waiting = pending();
        let restarted = step(&waiting, &Event::DeadlineExpired, 1_000_000);
        assert!(restarted.rev > restarted.status_seq, "a restart writes without a status");
        let refused = refuse(&claim(&restarted, 1_000_100), 1_000_200);
        assert_eq!(
            describe_change(&restarted, &refused).split(" (").next().unwrap(),
            "t-1: Pending -> Processing -> Compensating"
        );
    }

    #[test]
    fn a_wait_for_a_submitted_task_stops_where_it_was_asked_to() {
        assert!(!reached(Until::Created, None) && !reached(Until::Ended, None), "no task yet");
        let running = processing();
        assert!(reached(Until::Created, Some(&running)));
        assert!(!reached(Until::Ended, Some(&running)), "in flight is not ended");
        assert!(!reached(Until::Ended, Some(&pending())));
        assert!(reached(Until::Ended, Some(&processed())));
        assert!(reached(Until::Ended, Some(&error_compensating())), "Error is an end");
        let text = no_task_yet(&running.task_id);
        assert!(text.starts_with("no task t-1: ") && text.contains("submit --wait"), "{text}");
    }

    #[test]
    fn waiting_tells_moved_from_overtaken() {
        let before = processing();
        let mut seen = before.rev;
        assert_eq!(judge(Command::Cancel, &before, &mut seen, Some(before.clone())), None, "no change yet");
        // Charge succeeded by itself: the task moved on, but a cancel still applies to it.
        let next = succeed(&before, 4_000);
        assert_eq!(judge(Command::Cancel, &before, &mut seen, Some(next.clone())), None);
        assert_eq!(seen, next.rev);
        // ... then it finished: the cancel will change nothing.
        let done = succeed(&next, 5_000);
        match judge(Command::Cancel, &before, &mut seen, Some(done)) {
            Some(Applied::Overtaken { refusal, .. }) => assert_eq!(refusal.state, Some(ProcessState::Processed)),
            other => panic!("{other:?}"),
        }
        let mut seen = before.rev;
        assert!(matches!(
            judge(Command::Cancel, &before, &mut seen, Some(cancelled_compensating())),
            Some(Applied::Moved { .. })
        ));
        assert!(matches!(judge(Command::Cancel, &before, &mut seen, None), Some(Applied::Gone { .. })));
    }

    #[test]
    fn batch_summary_counts_each_outcome() {
        let e = error_compensating();
        let moved = check(Command::Resubmit, &id(), Some(&e)).unwrap();
        let report = BatchReport {
            skipped: vec![check(Command::Resubmit, &id(), Some(&processed())).unwrap_err()],
            outcomes: vec![
                Applied::Moved { before: Box::new(e.clone()), after: Box::new(moved) },
                Applied::Unchanged { before: Box::new(e.clone()) },
                Applied::Unchanged { before: Box::new(e) },
            ],
            waited: true,
            ..BatchReport::default()
        };
        assert_eq!(
            report.summary(),
            "resubmit --state Error: requested 3, moved 1, unchanged 2; skipped 1 no longer in Error"
        );
        assert!(!report.all_moved());
        assert_eq!(report.lines().len(), 4);
        assert!(
            report.lines()[1].starts_with("t-1: Error -> Compensating (resubmitted (run 2): check)"),
            "{:?}",
            report.lines()
        );
    }
}
