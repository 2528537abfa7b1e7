//! [`Event::Cancel`](crate::protocol::Event::Cancel): an application's or an operator's stop,
//! fenced by the run it names.
//!
//! Acts in `Pending` and `Processing`: the completed steps, and the current one when one of its
//! attempts may have applied, are compensated (a running map stops first, and compensates once its
//! elements have ended), and the task ends `Cancelled`. Acts in `Error` when the command names the
//! task's run: a compensation that failed resumes (refused units get fresh keys), and a task parked
//! in `Error` going forward begins its compensation. The table's `(Pending, cancel)`,
//! `(Processing, cancel)` and `(Error, cancel)`.
//!
//! Stale: a task already compensating (`AlreadyCompensating`), and, from `admit`, a command for
//! another run (`OtherRun`), one on an `Error` task that names no run (`Unfenced`), and any other
//! ended task (`Terminal`).

use crate::messages::RunReason;
use crate::protocol::change::map::{end_stopped, map_running, stop};
use crate::protocol::change::Change;
use crate::protocol::{EndCause, ProcessState, Stage, Stale, StepStatus, Task};

/// Operator: stop the task. Completed steps are compensated, and so is the current step when any
/// attempt of it may have applied (running now, timed out, or failed retryably). An `Error` task
/// whose compensation failed resumes compensating, with fresh keys for refused units.
pub(crate) fn cancel(task: &Task, reason: &str, c: &mut Change) -> Result<(), Stale> {
    if let Stage::Compensating { plan, pos, .. } = &task.stage {
        if task.process_state != ProcessState::Error {
            return Err(Stale::AlreadyCompensating);
        }
        c.t.run += 1;
        let why = format!("cancelled (run {}): {reason}", c.t.run);
        c.t.stage = Stage::Compensating { plan: plan.clone(), pos: *pos, cause: EndCause::Cancelled, why: why.clone() };
        c.t.reason = Some(why);
        c.t.unit_record().reset();
        c.wait_for_claim(c.ctx.now, RunReason::Retry);
        return Ok(());
    }
    if map_running(task) {
        map_cancel(task, reason, c);
        return Ok(());
    }
    // A command is a new run: one that names the run before it changes nothing now.
    c.t.run += 1;
    let i = c.t.step_index;
    if let Some(token) = task.lock.locked_by.clone() {
        c.t.steps[i].status = StepStatus::Cancelled;
        // A wait has no effect: nothing to await or undo.
        if task.current_def().kind.uses_agent() {
            c.t.steps[i].maybe_applied = true;
            c.t.lock.awaits = Some(token);
        }
    }
    c.begin_compensation(EndCause::Cancelled, format!("cancelled: {reason}"));
    Ok(())
}

/// A cancel while the map runs forward: it stops, and compensates once its elements have ended.
fn map_cancel(task: &Task, reason: &str, c: &mut Change) {
    let i = task.step_index;
    let mut p = task.steps[i].map.clone().expect("a running map has its progress");
    c.t.run += 1;
    stop(&mut p, EndCause::Cancelled, &format!("cancelled: {reason}"), i, c);
    let idle = p.running().next().is_none();
    c.t.steps[i].map = Some(p);
    if idle {
        end_stopped(c, EndCause::Cancelled);
    }
}
