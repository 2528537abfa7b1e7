//! The Supervisor: it makes sure no task waits forever. Two paths, one rule
//! ([`Event::DeadlineExpired`]):
//! - [`timer`], the precise path: a message on the supervisor queue, delayed until one attempt's
//!   `CompleteBy`, checks that attempt;
//! - [`sweep`], the backstop (the scheduled rule): query every shard of the sparse, keys-only
//!   `ByCompleteBy` index for `CompleteBy <= now`, page by page, and hand each expired task to the
//!   timer queue. Its cost follows the number of expired tasks, not the table. Two supervisors
//!   racing (or a sweep and a timer) recover each task once: the loser's conditional write fails
//!   and it re-decides.

use tracing::{debug, error, info};

use crate::bus::{encode, BusError, Outgoing, Record};
use crate::deps::{Deps, HandlerError};
use crate::effects::drive;
use crate::ids::{message_mark, Millis};
use crate::messages::{TimerMessage, VERSION};
use crate::metrics;
use crate::protocol::{Event, Stale};
use crate::transition::Applied;

/// Handle one deadline timer from the supervisor queue, as delivered.
pub async fn handle(deps: &Deps, record: &Record) -> Result<Applied, HandlerError> {
    timer_with(deps, &record.body, Some(&record.message_id)).await
}

/// Handle one deadline timer body.
pub async fn timer(deps: &Deps, raw: &str) -> Result<Applied, HandlerError> {
    timer_with(deps, raw, None).await
}

/// A timer decides the deadline it was armed for, once:
/// - an attempt's timer follows only that attempt (its fencing token);
/// - a timer the sweep handed over (no attempt) is for the `CompleteBy` the sweep saw: once the
///   task has another deadline the timer is spent (the sweep finds the task again if it is stuck
///   again), so sweep duplicates never become timers that follow a task for its whole life;
/// - one due later than one SQS delay reaches waits again;
/// - a task that ended owes nothing to a late timer, unless this very timer ended it and comes
///   back (see [`drive`]).
async fn timer_with(deps: &Deps, raw: &str, message: Option<&str>) -> Result<Applied, HandlerError> {
    let t: TimerMessage = crate::envelope::read(raw).map_err(HandlerError::Malformed)?;
    handle_timer(deps, t, message).await
}

/// Handle one deadline timer, read ([`crate::envelope::Envelope::open`]); `message`: the id of
/// the queue message that carries it.
pub async fn handle_timer(deps: &Deps, t: TimerMessage, message: Option<&str>) -> Result<Applied, HandlerError> {
    let Some(task) = deps.store.get(&t.task_id).await? else { return Ok(Applied::Missing) };
    let wrote_last = message.is_some_and(|m| task.last_message.as_deref() == Some(message_mark(m).as_str()));
    if !task.process_state.is_terminal() && !wrote_last {
        match &t.attempt {
            Some(a) if task.lock.locked_by.as_ref() != Some(a) => {
                debug!(task_id = %t.task_id, "timer for an attempt that is no longer current");
                return Ok(Applied::Stale(Stale::NotCurrentAttempt));
            }
            None if task.complete_by != Some(t.complete_by) => {
                debug!(task_id = %t.task_id, "handed-over timer for a deadline the task has left");
                return Ok(Applied::Stale(Stale::NotCurrentAttempt));
            }
            _ => {}
        }
        let now = deps.now();
        let grace = crate::protocol::deadline_grace_ms(&task, &deps.settings.policy);
        if let Some(cb) = task.complete_by.filter(|cb| cb.plus_ms(grace) > now) {
            // Due later than one SQS delay can reach (or a result may still be on its way): wait again.
            deps.outbox().arm_timer(&TimerMessage { complete_by: cb, ..t }, now, grace).await?;
            return Ok(Applied::Stale(Stale::NotExpired { complete_by: cb, now }));
        }
    }
    if task.waits_for_slot() {
        // its deadline is the check of its key: grants lost on the way are made again
        if crate::keys::check(deps, &task).await? == crate::keys::Checked::Unlisted {
            info!(task_id = %task.task_id, "its concurrency key lists it no more (it was replaced): cancelled");
            let reason = "replaced on its concurrency key: its key lists it no more".to_owned();
            return drive(deps, task, &Event::Cancel { reason, run: None }, message).await;
        }
    }
    drive(deps, task, &Event::DeadlineExpired, message).await
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Expired index entries found.
    pub expired: usize,
    /// Of those, handed to the timer queue.
    pub handed: usize,
    pub errors: usize,
    /// Instants of schedules sent to the submission queue ([`crate::schedules::fire_due`]).
    pub scheduled: usize,
    /// The earliest `CompleteBy` among the entries found (for the `OldestOverdueStepAge` gauge;
    /// not part of the function's answer).
    #[serde(skip)]
    pub oldest_complete_by: Option<Millis>,
}

/// Sweep every shard of the `CompleteBy` index once, for what expired more than the result grace
/// and the sweep's lag (`Settings::sweep_lag_ms`) ago; and send the schedules' instants that are
/// due ([`crate::schedules::fire_due`]).
pub async fn sweep(deps: &Deps) -> SweepReport {
    let lag = deps.settings.policy.result_grace_ms + deps.settings.sweep_lag_ms;
    let now = Millis(deps.now().0.saturating_sub(lag));
    let shards = (0..deps.store.shards()).map(|shard| sweep_shard(deps, shard, now));
    let (results, fired) = futures::join!(futures::future::join_all(shards), crate::schedules::fire_due(deps));
    let mut total = SweepReport { scheduled: fired.sent, errors: fired.errors, ..SweepReport::default() };
    for r in results {
        total.expired += r.expired;
        total.handed += r.handed;
        total.errors += r.errors;
        total.oldest_complete_by = total.oldest_complete_by.into_iter().chain(r.oldest_complete_by).min();
    }
    if total.expired > 0 || total.errors > 0 || total.scheduled > 0 {
        info!(
            expired = total.expired,
            handed = total.handed,
            scheduled = total.scheduled,
            errors = total.errors,
            "sweep"
        );
    }
    // Every sweep records the age (0: nothing overdue), so a sweep that stops running shows as
    // missing data, which the silent-hang alarm treats as breaching.
    let age = total.oldest_complete_by.map_or(0, |c| c.until(deps.now()) / 1000);
    metrics::count(&metrics::STEPS_EXPIRED, &[], total.expired as u64);
    #[allow(clippy::cast_precision_loss)] // seconds far below 2^52
    metrics::level(&metrics::OLDEST_OVERDUE_STEP_AGE, &[], age as f64);
    total
}

/// The sweep reads keys only and decides nothing itself: each expired task becomes a timer
/// message, so it is decided where every deadline is (one rule, one path), and a handler that
/// dies after its write is retried by SQS (the sweep has no message to come back).
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
            error!(shard, item = %bad, "unreadable entry in the CompleteBy index: skipped; an operator must look");
            report.errors += 1;
        }
        report.expired += page.keys.len();
        report.oldest_complete_by =
            report.oldest_complete_by.into_iter().chain(page.keys.iter().map(|k| k.complete_by)).min();
        let timers: Vec<Outgoing> = page
            .keys
            .iter()
            .filter_map(|k| {
                let timer =
                    TimerMessage { v: VERSION, task_id: k.task_id.clone(), attempt: None, complete_by: k.complete_by };
                encode(&timer).ok().map(Outgoing::new)
            })
            .collect();
        if !timers.is_empty() {
            let n = timers.len();
            match deps.bus.send_batch(&deps.resources.supervisor_queue_url, timers).await {
                Ok(()) => report.handed += n,
                Err(e) => {
                    let failed = match &e {
                        BusError::Batch { failed, .. } => *failed,
                        _ => n,
                    };
                    report.handed += n - failed;
                    error!(error = %e, tasks = n, "could not hand expired tasks to the timer queue; the next sweep retries");
                    report.errors += 1;
                }
            }
        }
        match page.next {
            Some(k) => start = Some(k),
            None => return report,
        }
    }
}
