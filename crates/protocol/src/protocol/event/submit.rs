//! A submission ([`submit`]): not an [`Event`](crate::protocol::Event) on a task but the task's
//! first write, so no pair of the table. It creates the task with its first unit already started
//! (`Processing` with the first step's attempt claimed, unless starting it says otherwise: a task
//! whose every step is skipped ends `Processed` at once, a step that cannot start fails in that
//! same write).

use serde_json::Value;

use crate::ids::TaskId;
use crate::protocol::change::Change;
use crate::protocol::task::{new_task, Slot};
use crate::protocol::{Ctx, Policy, ProcessState, Transition};
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
    submit_in_slot(task_id, workflow, input, reply_to, None, ctx, policy)
}

/// [`submit`] for a task that holds a slot of its concurrency key (`key`: the key item's id),
/// which its end gives back.
pub fn submit_in_slot(
    task_id: TaskId,
    workflow: WorkflowDef,
    input: Value,
    reply_to: Option<String>,
    key: Option<String>,
    ctx: &Ctx,
    policy: &Policy,
) -> Transition {
    let mut task = new_task(task_id, workflow, input, reply_to, ctx);
    task.slot = key.map(|key| Slot { key, waiting: false });
    let mut c = Change { t: task, fx: Vec::new(), ctx, policy, error_name: None };
    c.enter();
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}

/// Create the task of a submission whose concurrency key is busy: `Pending`, unclaimed, waiting
/// for a slot of `key` (the key item's id). No effect but its first status: its run message
/// (`WaitRev` 1) is sent by the release that grants it a slot. Its `CompleteBy` is when the
/// Supervisor checks its key ([`Policy::key_check_ms`]), the backstop of a lost grant.
pub fn submit_waiting(
    task_id: TaskId,
    workflow: WorkflowDef,
    input: Value,
    reply_to: Option<String>,
    key: String,
    ctx: &Ctx,
    policy: &Policy,
) -> Transition {
    let mut task = new_task(task_id, workflow, input, reply_to, ctx);
    task.reason = Some(format!("waiting for a slot of its concurrency key {key}"));
    task.slot = Some(Slot { key, waiting: true });
    task.complete_by = Some(ctx.now.plus_ms(policy.key_check_ms));
    let mut c = Change { t: task, fx: Vec::new(), ctx, policy, error_name: None };
    c.note_wait(ProcessState::Pending);
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}
