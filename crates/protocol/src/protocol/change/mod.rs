//! The machinery every event shares. A [`Change`] is a transition being built: the new task, its
//! effects, and what the shell supplied (the time, a fresh token, the jitter, the policy). Its
//! methods are the protocol's steps, each written once for forward steps and compensations alike,
//! and called by the events (`super::event`):
//! - `note.rs`: a state change recorded (the history, the caller's status) and an operator's alert;
//! - `start.rs`: the wait for a claim and its restarts, the claim of a unit (an attempt and its
//!   agent request, a wait step, a map's start) and the skip of steps that are not to run;
//! - `finish.rs`: a unit done (the next one, or the end), an attempt failed (a retry, or giving
//!   up), giving up (compensate, park in `Error`, or go on when the step handles the failure), and
//!   the end of the task;
//! - `compensation.rs`: the plan of what to undo and when it may start, and its release when the
//!   attempt it waits for answers;
//! - `map.rs`: the units that run as tasks of their own (maps, parallel regions, workflow steps);
//!   among them loop steps (`map/loops.rs`), whose iterations are tasks of their own.
//!
//! Here: the struct, the lock's release, and whether a compensation waits for an attempt.

use super::{Ctx, Effect, Policy, Task};
use crate::ids::AttemptToken;

mod compensation;
mod finish;
pub(super) mod map;
mod note;
pub(super) mod start;

/// How a child task ended, as its notice to its parent says.
pub(crate) struct Ended<'a> {
    pub(crate) state: crate::protocol::ProcessState,
    /// Why it ended so, when it did not succeed.
    pub(crate) reason: Option<&'a str>,
    /// A branch's, a workflow step's child's or a loop iteration's output.
    pub(crate) output: Option<&'a serde_json::Value>,
    /// A loop iteration of an inline body: the task's variables as it left them.
    pub(crate) vars: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// A transition being built: the new task, its effects, and what the shell supplied.
pub(crate) struct Change<'a> {
    pub(crate) t: Task,
    pub(crate) fx: Vec<Effect>,
    pub(crate) ctx: &'a Ctx,
    pub(crate) policy: &'a Policy,
    /// The name of the error the current unit failed with, as its agent named it
    /// ([`crate::messages::error_name`]): what a step's `on_failure` may continue on.
    pub(crate) error_name: Option<String>,
}

impl Change<'_> {
    /// Whether a compensation is waiting for this forward attempt to settle.
    pub(crate) fn awaited(&self, attempt: &AttemptToken) -> bool {
        awaited(&self.t, attempt)
    }

    /// No attempt holds the task any more.
    pub(crate) fn unlock(&mut self) {
        self.t.lock.locked_by = None;
        self.t.lock.hard_by = None;
    }
}

/// Whether a compensation is waiting for this forward attempt to settle.
pub(crate) fn awaited(task: &Task, attempt: &AttemptToken) -> bool {
    task.is_compensating() && task.lock.locked_by.is_none() && task.lock.awaits.as_ref() == Some(attempt)
}
