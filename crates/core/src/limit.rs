//! Per-agent concurrency limits: an agent may declare how many of its calls may be in flight at
//! once across every task and every agent process (`max_in_flight` in `config/agents.json`), so a
//! burst of tasks cannot flood the remote service it wraps.
//!
//! **Leases on slots.** An agent with a limit has one item in the task table
//! (`TaskId` = `limit:{agent}`) holding a map of leases, holder to the instant the lease ends.
//! Before its first call an attempt takes a lease with one conditional write (`size(Leases) <
//! max`); once its calls are done it gives it back with another. The lease ends at the attempt's
//! execution deadline plus [`LEASE_MARGIN_MS`]: the runtime cuts every call at that deadline, so
//! a holder that died or hung cannot keep its slot longer, and its lease is reclaimed by the next
//! taker that finds the agent full (in the same conditional write). Each acquisition has a holder
//! of its own (two copies of one SQS message are two calls, and take two slots).
//!
//! **Waiting.** A request that finds its agent full is not failed and not returned to its queue
//! (that would count towards the queue's `maxReceiveCount` and end in the DLQ): it is sent again
//! to the agent queue with a delay ([`wait_delay`]: full jitter, doubling with each wait, at most
//! [`MAX_WAIT_S`]), counting its waits in the request (`waited`). Waiting is schedule-to-start
//! time: the step's `schedule_to_start_ms` (or the queue budget) bounds it as it bounds time in
//! the queue, and the attempt then has its whole timeout.
//!
//! **Cost.** Two writes per call of a limited agent (1 write unit each while the item is under
//! 1 KB: about 20 leases), plus one failed conditional write per wait. One item takes at most
//! 1,000 write units a second, so a limited agent starts at most ~500 calls a second.

use crate::ids::Millis;

/// `TaskId` prefix of the limit items (`:` never appears in a task id).
pub const LIMIT_KEY_PREFIX: &str = "limit:";

/// How long past the attempt's execution deadline a lease lasts (clock skew between agents).
pub const LEASE_MARGIN_MS: u64 = 2_000;

/// The longest a request waits before it asks for a slot again.
pub const MAX_WAIT_S: u32 = 30;

/// The largest `max_in_flight` an agent may declare (one item holds the leases).
pub const MAX_IN_FLIGHT: u32 = 1_000;

/// The item of `agent`'s leases.
pub fn limit_key(agent: &str) -> String {
    format!("{LIMIT_KEY_PREFIX}{agent}")
}

/// Which leases a taker finding the agent full at `now` may remove: the expired ones, oldest
/// first, at most `max_removed` (one write names them all).
pub fn expired_leases(leases: &[(String, Millis)], now: Millis, max_removed: usize) -> Vec<(String, Millis)> {
    let mut out: Vec<_> = leases.iter().filter(|(_, until)| *until <= now).cloned().collect();
    out.sort_by_key(|(h, until)| (*until, h.clone()));
    out.truncate(max_removed);
    out
}

/// How long a request that found its agent full for the `waited`-th time (1 for the first)
/// waits before it asks again, in seconds: full jitter over 1, 2, 4 ... up to [`MAX_WAIT_S`], at
/// least 1 (SQS delays are whole seconds).
pub fn wait_delay(waited: u32, jitter: f64) -> u32 {
    let cap = 1u32.checked_shl(waited.saturating_sub(1).min(10)).unwrap_or(u32::MAX).min(MAX_WAIT_S);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let s = (f64::from(cap) * jitter.clamp(0.0, 1.0)).ceil() as u32;
    s.clamp(1, MAX_WAIT_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_with_full_jitter_within_bounds() {
        assert_eq!(wait_delay(1, 1.0), 1);
        assert_eq!(wait_delay(3, 1.0), 4);
        assert_eq!(wait_delay(30, 1.0), MAX_WAIT_S);
        assert_eq!(wait_delay(u32::MAX, 1.0), MAX_WAIT_S);
        assert_eq!(wait_delay(6, 0.0), 1, "never 0: SQS delays are whole seconds");
        assert_eq!(wait_delay(5, 0.5), 8);
        assert_eq!(wait_delay(6, 0.5), 15, "capped at 30 s, then jittered");
    }

    #[test]
    fn only_expired_leases_are_reclaimed_oldest_first() {
        let leases = vec![("a".to_owned(), Millis(30)), ("b".to_owned(), Millis(10)), ("c".to_owned(), Millis(20))];
        let got = expired_leases(&leases, Millis(20), 10);
        assert_eq!(got, vec![("b".to_owned(), Millis(10)), ("c".to_owned(), Millis(20))]);
        assert_eq!(expired_leases(&leases, Millis(20), 1).len(), 1);
        assert!(expired_leases(&leases, Millis(5), 10).is_empty());
    }
}
