//! [`Event::Resubmit`](crate::protocol::Event::Resubmit): an operator resumes an `Error` task at
//! its failed unit, forward or compensating; the completed steps are not redone, and a unit whose
//! last attempt was refused gets a new idempotency key.
//!
//! Acts in `Error` only, when the command names the task's run: the table's `(Error, resubmit)`.
//!
//! Stale, all from `admit`: any other state (`NotResubmittable`), a command for another run
//! (`OtherRun`), and one that names no run (`Unfenced`).

use crate::messages::RunReason;
use crate::protocol::change::Change;

/// Operator: an `Error` task resumes at its failed unit, forward or compensating; completed steps
/// are not redone. A unit whose last attempt was refused gets a new idempotency key.
pub(crate) fn resubmit(reason: &str, c: &mut Change) {
    c.t.run += 1;
    c.t.reason = Some(format!("resubmitted (run {}): {reason}", c.t.run));
    c.unlock();
    c.t.unit_record().reset();
    c.wait_for_claim(c.ctx.now, RunReason::Retry);
}
