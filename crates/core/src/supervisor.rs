//! The Supervisor: it makes sure no task waits forever. Two paths, one rule
//! ([`Event::DeadlineExpired`]):
//! - [`timer`], the precise path: a message on the supervisor queue, delayed until one attempt's
//!   `CompleteBy`, checks that attempt;
//! - [`sweep`], the backstop (the scheduled rule): query every shard of the sparse `ByCompleteBy`
//!   index for `CompleteBy <= now`, page by page, and recover each task with a conditional write.
//!   Its cost follows the number of expired tasks, not the table. Two supervisors racing recover
//!   each task once: the loser's write fails its condition and re-decides.

use futures::StreamExt;
use tracing::{debug, error, info};

use crate::bus::Record;
use crate::bus::{encode, Outgoing};
use crate::deps::{Deps, HandlerError};
use crate::effects::{drive, perform_many};
use crate::ids::Millis;
use crate::messages::TimerMessage;
use crate::messages::VERSION;
use crate::protocol::{self, Event, Stale, Task};
use crate::transition::{commit, Applied};

/// Handle one deadline timer from the supervisor queue, as delivered.
pub async fn handle(deps: &Deps, record: &Record) -> Result<Applied, HandlerError> {
    timer_with(deps, &record.body, record.receive_count > 1).await
}

/// Handle one deadline timer body.
pub async fn timer(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    timer_with(deps, raw, false).await
}

async fn timer_with(deps: &Deps, raw: &str, redelivered: bool) -> Result<Applied, HandlerError> {
    let t: TimerMessage = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    let Some(task) = deps.store.get(&t.task_id).await? else { return Ok(Applied::Missing) };
    if task.process_state.is_terminal() {
        return drive(deps, task, &Event::DeadlineExpired, true).await;
    }
    if t.attempt.as_ref().is_some_and(|a| task.locked_by.as_ref() != Some(a)) {
        debug!(task_id = %t.task_id, "timer for an attempt that is no longer current");
        return Ok(Applied::Stale(Stale::NotCurrentAttempt));
    }
    let now = deps.now();
    let grace = deps.settings.policy.result_grace_ms;
    if let Some(cb) = task.complete_by.filter(|cb| cb.plus_ms(grace) > now) {
        // Due later than one SQS delay can reach (or a result may still be on its way): wait again.
        deps.outbox().arm_timer(&TimerMessage { complete_by: cb, ..t }, now, grace).await?;
        return Ok(Applied::Stale(Stale::NotExpired { complete_by: cb, now }));
    }
    drive(deps, task, &Event::DeadlineExpired, redelivered).await
}

/// Whether the deadline decision for `task` would end it (decided on the task as read; the handler
/// that takes it over decides again).
fn ends_task(deps: &Deps, task: &Task) -> bool {
    protocol::apply(task, &Event::DeadlineExpired, &deps.ctx(), &deps.settings.policy)
        .is_ok_and(|tr| tr.task.process_state.is_terminal())
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    pub expired: usize,
    pub recovered: usize,
    pub stale: usize,
    pub errors: usize,
}

/// Sweep every shard of the `CompleteBy` index once, for what expired more than the result grace
/// ago.
pub async fn sweep(deps: &Deps) -> SweepReport {
    let now = Millis(deps.now().0.saturating_sub(deps.settings.policy.result_grace_ms));
    let shards = (0..deps.store.shards()).map(|shard| sweep_shard(deps, shard, now));
    let mut total = SweepReport::default();
    for r in futures::future::join_all(shards).await {
        total.expired += r.expired;
        total.recovered += r.recovered;
        total.stale += r.stale;
        total.errors += r.errors;
    }
    if total.expired > 0 || total.errors > 0 {
        info!(
            expired = total.expired,
            recovered = total.recovered,
            stale = total.stale,
            errors = total.errors,
            "sweep"
        );
    }
    total
}

async fn sweep_shard(deps: &Deps, shard: u32, now: Millis) -> SweepReport {
    let mut report = SweepReport::default();
    let mut start = None;
    loop {
        let page = match deps.store.expired(shard, now, deps.settings.sweep_page_size, start).await {
            Ok(p) => p,
            Err(e) => {
                error!(shard, error = %e, "supervisor query failed");
                report.errors += 1;
                return report;
            }
        };
        for bad in &page.unreadable {
            error!(shard, item = %bad, "unreadable item in the CompleteBy index: skipped; an operator must look");
            report.errors += 1;
        }
        // A decision that ends a task (Error, with its alert) is handed to the timer queue, where a
        // handler that dies after the write is retried by SQS; the sweep itself has no message to
        // come back. The rest is recovered here, concurrently, run messages sent in batches.
        report.expired += page.tasks.len();
        let (ending, page_tasks): (Vec<_>, Vec<_>) = page.tasks.into_iter().partition(|t| ends_task(deps, t));
        if !ending.is_empty() {
            let timers = ending
                .iter()
                .filter_map(|t| {
                    let timer = TimerMessage {
                        v: VERSION,
                        task_id: t.task_id.clone(),
                        attempt: t.locked_by.clone(),
                        complete_by: t.complete_by?,
                    };
                    encode(&timer).ok().map(Outgoing::new)
                })
                .collect();
            match deps.bus.send_batch(&deps.resources.supervisor_queue_url, timers).await {
                Ok(()) => report.recovered += ending.len(),
                Err(e) => {
                    error!(error = %e, tasks = ending.len(), "could not hand ending tasks to the timer queue; the next sweep retries");
                    report.errors += 1;
                }
            }
        }
        let commits = futures::stream::iter(page_tasks)
            .map(|task| commit(deps, task, &Event::DeadlineExpired))
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        let mut done = Vec::new();
        for c in commits {
            match c {
                Ok((Applied::Changed { .. }, Some(c))) => {
                    report.recovered += 1;
                    done.push(c);
                }
                Ok(_) => report.stale += 1,
                Err(e) => {
                    error!(error = %e, "recovery failed; the next sweep retries");
                    report.errors += 1;
                }
            }
        }
        perform_many(deps, done).await;
        match page.next {
            Some(k) => start = Some(k),
            None => return report,
        }
    }
}
