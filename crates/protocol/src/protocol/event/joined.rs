//! [`Event::Joined`](crate::protocol::Event::Joined): every element of a map ended and their
//! outputs were read (the join message): the map step succeeds with them.
//!
//! Acts in `Processing`, a forward map that is joining: the table's `(Processing, joined)`.
//!
//! Stale: a map that is not joining, not running, not forward or not the current step
//! (`NotCurrentAttempt`), and an ended task (`Terminal`, from `admit`).

use serde_json::Value;

use crate::messages::Phase;
use crate::protocol::change::map::map_running;
use crate::protocol::change::Change;
use crate::protocol::{Stale, Task};

/// All elements ended and their outputs were read: the step succeeds with them.
pub(crate) fn joined(task: &Task, step: usize, output: &Value, c: &mut Change) -> Result<(), Stale> {
    let joining = task.steps.get(step).and_then(|s| s.map.as_ref()).is_some_and(|p| p.joining);
    if !joining || !map_running(task) || task.phase() != Phase::Forward || task.step_index != step {
        return Err(Stale::NotCurrentAttempt);
    }
    if let Some(p) = c.t.steps[step].map.as_mut() {
        p.joining = false;
    }
    c.t.unit_record().succeeded();
    c.t.steps[step].output = Some(output.clone());
    c.t.reason = None;
    c.advance();
    Ok(())
}
