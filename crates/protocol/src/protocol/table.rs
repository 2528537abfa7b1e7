//! The protocol's transition table: the (state, event) pairs in which an event changes a task
//! (its write lands). In every other pair [`super::apply`] answers [`super::Stale`] and nothing is
//! written. The simulation checks the table both ways (`crates/testkit/tests/simulation.rs`): a
//! run of its default seeds with every fault reaches every pair listed, and no written
//! transition falls outside the list. A change that lets an event change a task in a new state
//! fails that test until the pair is listed here, with what it means.

use super::ProcessState::{self, Cancelled, Compensated, Compensating, Error, Pending, Processed, Processing};

/// Each pair: the task's state when the event arrives, and the event's name ([`super::Event::name`]).
pub const TRANSITIONS: &[(ProcessState, &str)] = &[
    // the Scheduler claims the unit a task waits for, forward or undoing
    (Pending, "claim"),
    (Compensating, "claim"),
    // an agent's report of the attempt that holds the task; when a retry is pending, a late
    // success of the attempt before it is recorded (late results)
    (Processing, "agent_succeeded"),
    (Compensating, "agent_succeeded"),
    (Pending, "agent_succeeded"),
    (Processing, "agent_failed"),
    (Compensating, "agent_failed"),
    (Processing, "agent_timed_out"),
    (Compensating, "agent_timed_out"),
    // a request that waited past its schedule-to-start budget: claimed again, no failure counted
    // (a compensation's too: no seed of the simulation has met it, see RARE)
    (Processing, "agent_not_started"),
    (Compensating, "agent_not_started"),
    // a deadline timer or the sweep: a lost attempt, a claim that never came, a wait that ended
    (Pending, "deadline_expired"),
    (Processing, "deadline_expired"),
    (Compensating, "deadline_expired"),
    // an operator's cancel (fenced by the run on an Error task), and resubmit of an Error task
    (Pending, "cancel"),
    (Processing, "cancel"),
    (Error, "cancel"),
    (Error, "resubmit"),
    // the answer desk of callback steps; a late answer to a task that moved on is recorded
    (Processing, "callback_succeeded"),
    (Compensating, "callback_succeeded"),
    (Pending, "callback_succeeded"),
    (Processed, "callback_succeeded"),
    (Compensated, "callback_succeeded"),
    (Error, "callback_succeeded"),
    (Cancelled, "callback_succeeded"),
    (Compensating, "callback_failed"),
    (Processing, "callback_failed"),
    (Processing, "callback_heartbeat"),
    // maps, branches and children: an element's end, the join, and a parent's undo of a child
    (Processing, "element_ended"),
    (Compensating, "element_ended"),
    (Processing, "joined"),
    (Processed, "undo"),
    (Error, "undo"),
];

/// Pairs of [`TRANSITIONS`] that the simulation's seeds may not reach: the code takes each, and
/// it is listed so that a seed that reaches it passes, but no run is required to reach it. A late
/// callback answer to a task that ended `Compensated`, in `Error` or `Cancelled` is met by a few
/// of make sim's 2,000 seeds or by none, as the random draws fall (after the agents' unchecked
/// window changed the draws, `(Error, callback_succeeded)` went unmet and `(Cancelled,
/// callback_succeeded)` was met for the first time); a compensation's request that waits past its
/// start-by, and a worker failing the attempt that holds a task (the simulated workers fail only
/// when told to stop), by none yet. The protocol's own tests exercise them.
pub const RARE: &[(ProcessState, &str)] = &[
    (Compensated, "callback_succeeded"),
    (Error, "callback_succeeded"),
    (Cancelled, "callback_succeeded"),
    (Compensating, "agent_not_started"),
    (Processing, "callback_failed"),
];
