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

/// The pause after the `lost`-th lost write in a row: random, up to 8 ms after the first and
/// doubling, at most `conflict_backoff_ms`. Writers that lost to each other (a map's element ends
/// handled by concurrent invocations, all on the parent) retried at once and collided again: 12.8
/// lost writes per element with 16 invocations at once, some records giving up after 64.
pub fn conflict_pause_ms(cap_ms: u64, lost: u32, jitter: f64) -> u64 {
    let ceiling = (4u64 << lost.min(16)).min(cap_ms);
    // jitter is in [0, 1): the product is below the ceiling
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let ms = (ceiling as f64 * jitter) as u64;
    ms
}

async fn conflict_pause(deps: &Deps, lost: u32) {
    let cap = deps.settings.conflict_backoff_ms;
    if cap > 0 {
        let ms = conflict_pause_ms(cap, lost, deps.entropy.jitter());
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

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
    for lost in 0..max {
        if lost > 0 {
            conflict_pause(deps, lost).await;
        }
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

#[cfg(test)]
mod tests {
    use super::conflict_pause_ms;

    #[test]
    fn the_pause_after_a_lost_write_is_random_doubles_and_stops_at_the_cap() {
        let almost = 0.999_999;
        let most: Vec<u64> = (1..=6).map(|lost| conflict_pause_ms(50, lost, almost)).collect();
        assert_eq!(most, vec![7, 15, 31, 49, 49, 49], "below 8 ms after the first, doubling, under the cap");
        assert_eq!(conflict_pause_ms(50, 3, 0.0), 0, "the jitter chooses where in it");
        assert_eq!(conflict_pause_ms(50, 2, 0.5), 8);
        assert_eq!(conflict_pause_ms(0, 5, almost), 0, "0 turns the pause off");
        assert_eq!(conflict_pause_ms(1_000, 63, almost), 999, "no overflow after many losses");
    }
}
