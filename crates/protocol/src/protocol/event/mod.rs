//! The events, one file each: what an event does to a task, and in which states. Each file begins
//! with its event's legal states: the (state, event) pairs of [`super::TRANSITIONS`] in which it
//! changes a task (the simulation checks the table both ways: every pair reached, no written
//! transition outside it), and what it refuses ([`super::Stale`]: nothing is written). Every event
//! but a callback answer passes `super::admit` first, which refuses an operator's command for
//! another run (`OtherRun`), a resubmit of a task not in `Error`, a command on an `Error` task that
//! names no run (`Unfenced`), and anything else on an ended task (`Terminal`) but a parent's undo.
//!
//! The events share the machinery of `super::change`.

pub(super) mod agent_result;
pub(super) mod callback;
pub(super) mod cancel;
pub(super) mod claim;
pub(super) mod deadline;
pub(super) mod element_ended;
pub(super) mod joined;
pub(super) mod resubmit;
pub(super) mod submit;
pub(super) mod undo;
