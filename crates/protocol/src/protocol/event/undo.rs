//! [`Event::Undo`](crate::protocol::Event::Undo): a parent that compensates its map, region or
//! workflow step undoes a child task that succeeded.
//!
//! Acts on a child task that ended `Processed` (its steps with a compensation are undone, and it
//! ends `Compensated`) or in `Error` (its failed compensation resumes, or its compensation
//! begins): the table's `(Processed, undo)` and `(Error, undo)`, the two ended states `admit` lets
//! an undo through to.
//!
//! Stale: a task that is not a child, or in any other state (`Terminal`).

use crate::protocol::change::{map, Change};
use crate::protocol::{EndCause, ProcessState, Stage, Stale, Task};

/// Undo a map element that ended `Processed` (its parent's map is compensated): its steps with a
/// compensation are undone, and it ends `Compensated`.
pub(crate) fn undo(task: &Task, reason: &str, c: &mut Change) -> Result<(), Stale> {
    if !task.task_id.is_child() || !matches!(task.process_state, ProcessState::Processed | ProcessState::Error) {
        return Err(Stale::Terminal(task.process_state));
    }
    c.t.run += 1;
    c.t.reason = Some(format!("undone: {reason}"));
    if task.process_state == ProcessState::Error {
        // its compensation failed: resumed, as an operator's cancel resumes it
        if let Stage::Compensating { why, .. } = &mut c.t.stage {
            *why = format!("undone: {reason}");
            c.unlock();
            c.t.unit_record().reset();
            c.wait_for_claim(c.ctx.now, crate::messages::RunReason::Retry);
        } else {
            c.begin_compensation(EndCause::Failed, format!("undone: {reason}"));
        }
        return Ok(());
    }
    // as a task compensates: a step with a compensation, and a map, region, workflow step or
    // loop of its own that applied (its children undo themselves)
    let regions = task.workflow.regions();
    let plan: Vec<usize> = (0..task.steps.len())
        .rev()
        .filter(|&j| map::applied(task, &regions, j) && map::undoable(task, &regions, j))
        .collect();
    if plan.is_empty() {
        c.finish(ProcessState::Compensated);
        return Ok(());
    }
    c.t.stage = Stage::Compensating { plan, pos: 0, cause: EndCause::Failed, why: format!("undone: {reason}") };
    c.start_unit();
    Ok(())
}
