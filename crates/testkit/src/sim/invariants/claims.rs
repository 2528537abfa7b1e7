//! `dispatched`, `late-hung`, `late-lost`, `callback-lost`, `hung-reported`: what became of every
//! attempt the store showed claimed.

use sas_core::role::Role;

use crate::sim::{Fate, Sim, LATE_HUNG_MS, LATE_LOST_MS, SWEEP_BOUND_MS};

impl Sim {
    /// Every claimed attempt was dispatched, and attempts that hung or were lost did not hold
    /// their task past the bounds.
    pub(super) fn check_claims(&self, v: &mut Vec<String>) {
        let grace = self.deps.settings.policy.result_grace_ms;
        let end = self.now();
        let redelivery = Role::Scheduler.default_visibility_seconds() * 1_000;
        for token in &self.dead {
            let (Some(c), Some((heard, window))) = (self.claims.get(token), self.heard.get(token)) else { continue };
            if self.delayed.contains(token) {
                continue;
            }
            // its deadline is at most one heartbeat window after it was last heard of (or the
            // first window after the queue budget, if it never heartbeated)
            let due = heard.plus_ms(*window).max(c.complete_by).plus_ms(grace).max(c.claimed_at.plus_ms(redelivery));
            let released = c.released.unwrap_or(end);
            let bound = if c.by_supervisor { SWEEP_BOUND_MS } else { LATE_LOST_MS };
            if released.0 > due.0 + bound {
                v.push(format!(
                    "callback-lost: {}: the worker of attempt {token} of {} died; the task let it go {} ms after its heartbeat deadline + grace",
                    c.task,
                    c.step,
                    released.0 - due.0
                ));
            }
        }
        for (token, c) in &self.claims {
            // A claim whose sends failed is sent again when its message comes back after the
            // queue's visibility timeout; if its deadline comes first, the Supervisor recovers it
            // (it costs the attempt): not charged.
            let outrun = c.expired && c.complete_by.plus_ms(grace) <= c.claimed_at.plus_ms(redelivery);
            if !self.dispatched.contains(token) && !c.by_operator && !c.by_supervisor && !outrun {
                v.push(format!(
                    "dispatched: {}: attempt {token} of {} was claimed but its request never reached the agent queue",
                    c.task, c.step
                ));
                continue;
            }
            let fates = self.fates.get(token).map(Vec::as_slice).unwrap_or_default();
            if fates.is_empty() || fates.contains(&Fate::Answered) || self.delayed.contains(token) {
                continue;
            }
            let released = c.released.unwrap_or(end);
            let cut = fates.iter().filter_map(|f| if let Fate::Cut { at } = f { Some(*at) } else { None }).min();
            if let Some(at) = cut {
                if released.0 > at.0 + LATE_HUNG_MS {
                    v.push(format!(
                        "late-hung: {}: attempt {token} of {} was cut by its agent at {at}; the task let it go {} ms later",
                        c.task,
                        c.step,
                        released.0 - at.0
                    ));
                }
            } else {
                // its timer is due then, or, when the claim's sends failed, its message comes
                // back after the scheduler queue's visibility timeout and sends them again
                let due = c.complete_by.plus_ms(grace).max(c.claimed_at.plus_ms(redelivery));
                let bound = if c.by_supervisor { SWEEP_BOUND_MS } else { LATE_LOST_MS };
                if released.0 > due.0 + bound {
                    v.push(format!(
                        "late-lost: {}: attempt {token} of {} was lost; the task let it go {} ms after CompleteBy + grace",
                        c.task,
                        c.step,
                        released.0 - due.0
                    ));
                }
            }
        }
    }
}
