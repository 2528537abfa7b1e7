//! Compensation planning: when a task stops going forward (a unit given up, a cancel), the
//! completed steps that have a compensation are undone in reverse order, the current step too
//! when one of its attempts may have applied; the first compensation waits until no attempt of
//! those steps can still start or apply (or until the awaited attempt answers).

use super::{map, Change};
use crate::ids::Millis;
use crate::messages::RunReason;
use crate::protocol::{EndCause, Stage, StepStatus};

impl Change<'_> {
    /// The awaited attempt gave a definite answer: the compensation may start now.
    pub(crate) fn release_compensation(&mut self) {
        self.t.lock.awaits = None;
        self.wait_for_claim(self.ctx.now, RunReason::Compensate);
    }

    /// Undo, in reverse order, every completed step that has a compensation, and the current step
    /// too when some attempt of it may have applied (compensations must tolerate having nothing to
    /// undo). A compensation never races its forward attempt: while that attempt may still start
    /// or apply (until [`Change::settled_at`] and a settling margin, or until it answers), the
    /// first compensation waits.
    pub(crate) fn begin_compensation(&mut self, cause: EndCause, reason: String) {
        let t = &self.t;
        let i = t.step_index;
        let regions = t.workflow.regions();
        let has_comp = |j: usize| map::undoable(t, &regions, j);
        let mut plan = Vec::new();
        let current = t.steps[i].maybe_applied && has_comp(i);
        if current {
            plan.push(i);
        }
        plan.extend((0..i).rev().filter(|&j| map::applied(t, &regions, j) && has_comp(j)));
        // the current step's attempts, and those of a handled failure before it, may still apply
        let settles = plan
            .iter()
            .filter(|&&j| (j == i && current) || (j < i && t.steps[j].status != StepStatus::Succeeded))
            .filter_map(|&j| self.settled_at(j))
            .max()
            .map(|at| at.plus_ms(self.policy.settle_ms));
        self.t.reason = Some(reason.clone());
        self.unlock();
        self.t.lock.outstanding.clear();
        if plan.is_empty() {
            self.finish(cause.end_state());
            return;
        }
        self.t.stage = Stage::Compensating { plan, pos: 0, cause, why: reason };
        match settles.filter(|at| *at > self.ctx.now) {
            Some(at) => {
                // no claim before then, whichever run message arrives first
                self.wait_for_claim(at, RunReason::Compensate);
                self.t.claim.not_before = Some(at);
            }
            None => self.start_unit(),
        }
    }

    /// When no attempt of forward step `i` can apply any more, once the task stops waiting for
    /// them now: its last attempt's hard deadline (no copy of a request starts after its
    /// `start_by`, none runs past `start_by + timeout_ms`), or, for a call step, one execution
    /// time (plus the unchecked window) from now if that is sooner. An agent starts a call only
    /// while its attempt is the task's current one (it reads `LockedBy` first,
    /// `sas_core::agent::still_current`), except within `unchecked_start_ms` of the claim: a
    /// copy that starts after this decision's write is refused unless it is that fresh, so every
    /// call either started before now + the window or never starts, and one that started is cut
    /// within `timeout_ms`. A callback step's remote side holds its token until the hard deadline,
    /// whatever the agent does: that bound stays. The settling margin is added by the caller.
    fn settled_at(&self, i: usize) -> Option<Millis> {
        let hard = self.t.steps[i].settles_at?;
        let def = &self.t.workflow.steps[i];
        Some(if def.kind.agent_bounds_the_effect() {
            hard.min(self.ctx.now.plus_ms(self.policy.unchecked_start_ms + def.timeout_ms))
        } else {
            hard
        })
    }
}
