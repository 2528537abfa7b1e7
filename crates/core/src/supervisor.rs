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

use crate::deps::{Deps, HandlerError};
use crate::effects::{drive, perform_many};
use crate::ids::Millis;
use crate::messages::TimerMessage;
use crate::protocol::{Event, Stale};
use crate::transition::{commit, Applied};

/// Handle one deadline timer from the supervisor queue.
pub async fn timer(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    let t: TimerMessage = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    let Some(task) = deps.store.get(&t.task_id).await? else { return Ok(Applied::Missing) };
    if task.locked_by.as_ref() != Some(&t.attempt) {
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
    drive(deps, task, &Event::DeadlineExpired).await
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
        // Recover the page's tasks concurrently, then send their run messages in batches.
        report.expired += page.tasks.len();
        let commits = futures::stream::iter(page.tasks)
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
