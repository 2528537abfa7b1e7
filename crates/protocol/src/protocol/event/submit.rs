//! A submission ([`submit`]): not an [`Event`](crate::protocol::Event) on a task but the task's
//! first write, so no pair of the table. It creates the task with its first unit already started
//! (`Processing` with the first step's attempt claimed, unless starting it says otherwise: a task
//! whose every step is skipped ends `Processed` at once, a step that cannot start fails in that
//! same write).

use serde_json::Value;

use crate::ids::TaskId;
use crate::protocol::change::Change;
use crate::protocol::task::new_task;
use crate::protocol::{Ctx, Policy, Transition};
use crate::workflow::WorkflowDef;

/// Create the task for an accepted submission with its first step already claimed, in the one
/// write that records it: `Processing`, `LockedBy` = a fresh attempt token, `CompleteBy` = the
/// attempt's deadline; its effects dispatch the step and arm the deadline timer. A task that
/// waited in the table for a separate claim would cost a second write, a run message and a
/// Scheduler invocation for nothing. If the submitter dies before its sends, the submission comes
/// back and [`resend_start`] sends them again; the Supervisor is the backstop either way.
pub fn submit(
    task_id: TaskId,
    workflow: WorkflowDef,
    input: Value,
    reply_to: Option<String>,
    ctx: &Ctx,
    policy: &Policy,
) -> Transition {
    let task = new_task(task_id, workflow, input, reply_to, ctx);
    let mut c = Change { t: task, fx: Vec::new(), ctx, policy, error_name: None };
    c.enter();
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}
