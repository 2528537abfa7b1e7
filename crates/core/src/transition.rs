//! The one path that writes a transition: let [`protocol::apply`] decide, then commit the new
//! task with a conditional write. A lost write re-decides on the current item the store returned
//! with the conflict (no extra read). Effects are not performed here: see [`crate::effects`].

use tracing::{debug, info};

use crate::deps::{Deps, HandlerError};
use crate::ids::Millis;
use crate::protocol::{self, Effect, Event, ProcessState, Stale, Task};
use crate::store::{is_own_write, StoreError};

/// What happened to one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    Changed {
        state: ProcessState,
        rev: u64,
    },
    Stale(Stale),
    /// The task does not exist (deleted, or never created).
    Missing,
}

/// What [`commit`] did with one event.
#[derive(Debug)]
pub enum Commit {
    /// The transition was written; its effects are still to be performed.
    Written(Box<Committed>),
    /// The event changes nothing for the task as it now is (the item last read or returned by a
    /// lost conditional write).
    Unchanged(Box<Task>),
    /// The task is gone.
    Missing,
}

/// A written transition whose effects are still to be performed.
#[derive(Debug)]
pub struct Committed {
    pub task: Task,
    pub effects: Vec<Effect>,
    pub now: Millis,
}

/// How many lost conditional writes in a row one event may meet before giving up (the message is
/// then delivered again).
pub const MAX_CONFLICTS: u32 = 5;

/// The same for a map element's end: up to `max_concurrency` of them race for the parent's item
/// (each lost write re-decides on the item the store returned, without a read).
pub const MAX_ELEMENT_CONFLICTS: u32 = 64;

/// Decide and write. `mark`: the [`crate::ids::message_mark`] of the queue message that carries
/// the event, recorded on the written task (see `Task::last_message`). On
/// [`Commit::Written`] the caller performs the effects.
pub async fn commit(
    deps: &Deps,
    mut task: Task,
    event: &Event,
    mark: Option<&str>,
) -> Result<(Applied, Commit), HandlerError> {
    let max = if matches!(event, Event::ElementEnded { .. }) { MAX_ELEMENT_CONFLICTS } else { MAX_CONFLICTS };
    for _ in 0..max {
        let ctx = deps.ctx();
        let tr = match protocol::apply(&task, event, &ctx, &deps.settings.policy) {
            Ok(tr) => tr,
            Err(stale) => {
                // Expected (a timer after the end, a duplicate): counted by StaleEvents, logged at debug.
                debug!(task_id = %task.task_id, event = event.name(), state = %task.process_state, reason = %stale, "stale event dropped");
                crate::metrics::count(&crate::metrics::STALE_EVENTS, &[], 1);
                return Ok((Applied::Stale(stale), Commit::Unchanged(Box::new(task))));
            }
        };
        let mut tr = tr;
        if !tr.keeps_mark {
            tr.task.last_message = mark.map(str::to_owned);
        }
        let landed = match deps.store.save(&tr.task, &task).await {
            Ok(()) => false,
            // A write that landed but whose answer was lost (the SDK sent it again) comes back as
            // a lost condition whose current item is the very task written: the transition is
            // ours, and its effects are still to be performed.
            Err(StoreError::Conflict { current: Some(current) }) if is_own_write(&current, &tr.task) => true,
            Err(StoreError::Conflict { current: Some(current) }) => {
                debug!(task_id = %task.task_id, event = event.name(), "conditional write lost; re-deciding on the current item");
                crate::metrics::count(&crate::metrics::WRITE_CONFLICTS, &[task.workflow.name.as_str()], 1);
                task = *current;
                continue;
            }
            Err(StoreError::Conflict { current: None }) => return Ok((Applied::Missing, Commit::Missing)),
            Err(e) => return Err(e.into()),
        };
        let (state, rev) = (tr.task.process_state, tr.task.rev);
        info!(
            task_id = %task.task_id, event = event.name(), from = %task.process_state, to = %state,
            step = tr.task.current_step_name().unwrap_or("-"), failure_count = tr.task.failure_count, rev, landed,
            "transition"
        );
        crate::metrics::record_transition(&task, &tr.task, event);
        let committed = Committed { task: tr.task, effects: tr.effects, now: ctx.now };
        return Ok((Applied::Changed { state, rev }, Commit::Written(Box::new(committed))));
    }
    Err(HandlerError::Contended(max))
}
