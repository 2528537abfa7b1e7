//! [`Event::Claim`](crate::protocol::Event::Claim): the Scheduler's run message for the wait the
//! task is in.
//!
//! Acts in `Pending` (a forward unit waits for its claim) and `Compensating` (a compensation
//! waits): the table's `(Pending, claim)` and `(Compensating, claim)`. The unit is claimed
//! (`Change::start_unit`); a child task's first claim decides its first step's guard first
//! (`Change::enter`: skipped steps are passed, and a task whose every step is skipped ends).
//!
//! Stale: a run message for another wait (`OldRun`: its `rev` is not the task's `WaitRev`), a task
//! an attempt holds or whose map runs (`AlreadyClaimed`), a task that does not wait for a claim
//! (`NotClaimable`), a claim before `NotBefore` (`TooEarly`: `stale_sends` sends the message on
//! for the rest of the wait), and an ended task (`Terminal`, from `admit`).

use crate::messages::Phase;
use crate::protocol::change::map::map_running;
use crate::protocol::change::Change;
use crate::protocol::task::waiting_state;
use crate::protocol::{Stale, StepStatus, Task};

/// The Scheduler claims the current unit, if the run message is for the wait the task is in,
/// nothing holds the lock and the task may start now.
pub(crate) fn claim(task: &Task, rev: u64, c: &mut Change) -> Result<(), Stale> {
    if rev != task.claim.rev {
        return Err(Stale::OldRun { message: rev, current: task.claim.rev });
    }
    if task.lock.locked_by.is_some() || map_running(task) {
        return Err(Stale::AlreadyClaimed);
    }
    if task.process_state != waiting_state(task.phase()) {
        return Err(Stale::NotClaimable(task.process_state));
    }
    if let Some(not_before) = task.claim.not_before.filter(|nb| *nb > c.ctx.now) {
        return Err(Stale::TooEarly { not_before, now: c.ctx.now });
    }
    // a child task (a map's workflow element, a workflow step's child, a loop's iteration) is
    // created waiting for its claim: its first step's guard is decided here, once, as a
    // submitted task's is when it is created
    // a task that waited for a slot of its key was granted one (only a grant sends its run)
    if let Some(slot) = c.t.slot.as_mut().filter(|s| s.waiting) {
        slot.waiting = false;
        c.t.reason = None;
    }
    let first = task.phase() == Phase::Forward
        && task.step_index == 0
        && task.steps.first().is_some_and(|s| s.status == StepStatus::Pending && s.attempts == 0);
    if first {
        c.enter();
    } else {
        c.start_unit();
    }
    Ok(())
}
