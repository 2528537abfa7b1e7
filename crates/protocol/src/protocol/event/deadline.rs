//! [`Event::DeadlineExpired`](crate::protocol::Event::DeadlineExpired): the Supervisor found
//! `CompleteBy` (plus the grace of [`deadline_grace_ms`]) in the past, by a deadline timer or the
//! sweep of the `ByCompleteBy` index.
//!
//! Acts in every state in flight, the table's `Pending`, `Processing` and `Compensating`:
//! - a task waiting for a claim: its run message was lost or is late, and is sent again
//!   (`Change::restart`; after `max_restarts` in a row the task ends in `Error`);
//! - an attempt that holds the task: it ran out of time (a retry, or the unit given up);
//! - a wait step: its time came, and the step succeeds;
//! - a running map, region or workflow step: its watch sends again what it sent, and past the
//!   map's own deadline the map stops.
//!
//! Stale: before `CompleteBy` plus the grace (`NotExpired`), and an ended task (`Terminal`, from
//! `admit`).

use crate::ids::Millis;
use crate::messages::Phase;
use crate::protocol::change::map::{end_stopped, map_running, map_spec, owed, stop, watch_ms, REGION_TIMEOUT_MS};
use crate::protocol::change::Change;
use crate::protocol::task::noun;
use crate::protocol::{EndCause, Policy, Stale, Task};
use crate::workflow::MapSpec;

/// The task sleeps in a wait step: its deadline ends the step, succeeded.
pub fn in_wait(task: &Task) -> bool {
    let def = task.current_def();
    let between_iterations = def.kind.loop_spec().is_some() && task.phase() == Phase::Forward;
    !task.process_state.is_terminal() && task.lock.locked_by.is_some() && (def.kind.is_timer() || between_iterations)
}

/// How long after `CompleteBy` a deadline is decided: a wait wakes at its instant; an attempt's
/// result may still be on its way for the policy's `result_grace_ms`. Timers are armed for
/// `CompleteBy` plus this, and [`Event::DeadlineExpired`](crate::protocol::Event::DeadlineExpired)
/// is stale before it.
pub fn deadline_grace_ms(task: &Task, policy: &Policy) -> u64 {
    if in_wait(task) {
        0
    } else {
        policy.result_grace_ms
    }
}

/// The Supervisor found `CompleteBy` (plus the result grace) in the past: a lost or delayed run
/// message is re-issued (the wait it belongs to does not change, so the first to arrive claims),
/// a running attempt has timed out.
pub(crate) fn deadline_expired(task: &Task, c: &mut Change) -> Result<(), Stale> {
    let complete_by = task.complete_by.unwrap_or(Millis(0));
    if map_running(task) {
        if complete_by.plus_ms(c.policy.result_grace_ms) > c.ctx.now {
            return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
        }
        map_deadline(task, c);
        return Ok(());
    }
    if task.claim.paused && task.lock.locked_by.is_none() {
        if complete_by > c.ctx.now {
            return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
        }
        if c.ctx.paused {
            // still paused: look again later
            c.t.complete_by = Some(c.ctx.now.plus_ms(c.policy.pause_check_ms));
        } else {
            // resumed: the unit waits for its claim, and its run message is sent
            c.t.reason = None;
            c.wait_for_claim(c.ctx.now, crate::messages::RunReason::Retry);
        }
        return Ok(());
    }
    if task.waits_for_slot() {
        // the Supervisor checked the task's key (and sent its run if it holds a slot): the next check
        if complete_by > c.ctx.now {
            return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
        }
        c.t.complete_by = Some(c.ctx.now.plus_ms(c.policy.key_check_ms));
        return Ok(());
    }
    let waiting = in_wait(task);
    if complete_by.plus_ms(deadline_grace_ms(task, c.policy)) > c.ctx.now {
        return Err(Stale::NotExpired { complete_by, now: c.ctx.now });
    }
    if waiting && task.current_def().kind.loop_spec().is_some() {
        // A loop's wait between iterations ends: the next one starts.
        c.unlock();
        c.next_iteration();
    } else if waiting {
        // A wait ends by its deadline: the step is done.
        c.unlock();
        c.t.unit_record().succeeded();
        c.advance();
    } else if task.lock.locked_by.is_none() {
        c.restart();
    } else {
        let def = c.t.current_def();
        let what = match task.lock.hard_by {
            Some(hard) if complete_by < hard => format!(
                "sent no heartbeat within {} ms (CompleteBy {complete_by}, hard deadline {hard})",
                def.kind.heartbeat_ms().unwrap_or_default()
            ),
            _ => format!("passed CompleteBy {complete_by}"),
        };
        let reason = format!("{} {} attempt {} {what}", noun(c.t.phase()), def.name, c.t.unit_attempts());
        if let Some(token) = c.t.lock.locked_by.clone() {
            c.t.lock.outstanding.push(token);
        }
        c.attempt_failed(&reason, true);
    }
    Ok(())
}

/// A running map's `CompleteBy`, its watch: what it sent is sent again (an element whose creation
/// was lost is created, one that ended says so again, the join or the undos go out again). Past
/// the map's own deadline, a map still running stops.
fn map_deadline(task: &Task, c: &mut Change) {
    let i = task.unit_step();
    let def = &task.workflow.steps[i];
    let timeout_ms = map_spec(task, i).map_or(REGION_TIMEOUT_MS, MapSpec::timeout_ms);
    let p = task.steps[i].map.clone().expect("a running map has its progress");
    let watch = c.ctx.now.plus_ms(watch_ms(def, c.policy));
    let forward = task.phase() == Phase::Forward && !p.joining && p.stopping.is_none();
    c.t.complete_by = Some(if forward { watch.min(p.deadline.max(c.ctx.now)) } else { watch });
    if forward && c.ctx.now >= p.deadline {
        c.t.complete_by = Some(watch);
        let mut p = p;
        let why = if def.kind.loop_spec().is_some() {
            format!(
                "loop step {} did not end within {} ms ({} iterations ran)",
                def.name,
                if def.timeout_ms == 0 { crate::workflow::DEFAULT_MAP_TIMEOUT_MS } else { def.timeout_ms },
                p.started
            )
        } else {
            format!(
                "map step {} did not end within {} ms ({} of {} elements ended)",
                task.workflow.steps[i].name,
                timeout_ms,
                p.ended.count(),
                p.n
            )
        };
        stop(&mut p, EndCause::Failed, &why, i, c);
        let idle = p.running().next().is_none();
        c.t.steps[i].map = Some(p);
        if idle {
            end_stopped(c, EndCause::Failed);
        }
        return;
    }
    let again = owed(&c.t);
    c.fx.extend(again);
}
