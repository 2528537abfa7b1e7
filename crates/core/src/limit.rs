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

use serde::Deserialize;

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

// ---- pacing: an agent's rate ----------------------------------------------------------------
//
// **Slots in time.** An agent with a `rate` has one item in the task table (`TaskId` =
// `rate:{agent}`) holding `Tat`, the generic cell rate algorithm's theoretical arrival time: the
// instant from which the next call may start without using the burst. A call takes the earliest
// slot at or after now + [`PACE_LEAD_MS`] that the rate allows ([`pace`]) with one conditional
// write (the item's `Tat` unchanged since it was read), then sleeps until its slot and calls. A
// call that wakes after its slot (plus [`PACE_SLACK_MS`]) goes back to the agent queue instead of
// running late, so calls start at their slots. A slot further than [`MAX_PACE_SLEEP_MS`] away is
// not taken: the request goes back to the agent queue, delayed until about then, and asks again.
//
// **What holds.** At most `burst` calls start at once, and at most `calls` in any window of
// `per`, across every task and every agent process (their clocks agree within the slack). Calls
// beyond it are delayed, never failed; the wait counts towards the step's `schedule_to_start_ms`.
//
// **Cost.** One consistent read and one conditional write of the rate item per call (1 read unit,
// 1 write unit), and one more of each per lost race.

/// `TaskId` prefix of the rate items.
pub const RATE_KEY_PREFIX: &str = "rate:";

/// How far ahead of now a call's slot is: the conditional write that takes it lands before it.
pub const PACE_LEAD_MS: u64 = 50;

/// How late after its slot a call may still start (the write's return and the sleep's precision).
pub const PACE_SLACK_MS: u64 = 25;

/// The longest a call sleeps for its slot in the agent; further ones wait in the agent queue.
pub const MAX_PACE_SLEEP_MS: u64 = 2_000;

/// How far ahead of now a call's slot is, given how long the rate item's last writes took
/// (`write_ms`, smoothed): twice that, at least [`PACE_LEAD_MS`], at most half of
/// [`MAX_PACE_SLEEP_MS`]. A slot nearer than its write's return is missed before the call can
/// sleep for it (it goes back to the queue, its slot spent): on a loaded table every call would,
/// and the agent would start nothing however long it waited.
pub fn pace_lead_ms(write_ms: u64) -> u64 {
    write_ms.saturating_mul(2).clamp(PACE_LEAD_MS, MAX_PACE_SLEEP_MS / 2)
}

/// The item of `agent`'s rate.
pub fn rate_key(agent: &str) -> String {
    format!("{RATE_KEY_PREFIX}{agent}")
}

/// An agent's rate (`rate` in the agents file): `per_second` or `per_minute` calls, at most
/// `burst` at once (default 1: evenly spaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    #[serde(default)]
    pub per_second: Option<u32>,
    #[serde(default)]
    pub per_minute: Option<u32>,
    #[serde(default)]
    pub burst: Option<u32>,
}

/// A rate: `calls` per `per_ms`, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub calls: u32,
    pub per_ms: u64,
    pub burst: u32,
}

impl Rate {
    /// The most calls a rate may allow per second (one item takes about 1,000 writes a second,
    /// two per call with a lost race or two).
    pub const MAX_PER_SECOND: u32 = 200;

    /// The rate a spec says, or why it says none.
    pub fn of(spec: &RateSpec) -> Result<Rate, String> {
        let (calls, per_ms) = match (spec.per_second, spec.per_minute) {
            (Some(n), None) => (n, 1_000),
            (None, Some(n)) => (n, 60_000),
            _ => return Err("rate takes exactly one of per_second and per_minute".into()),
        };
        if calls == 0 || u64::from(calls) * 1_000 / per_ms > u64::from(Self::MAX_PER_SECOND) {
            return Err(format!("rate allows 1 call per minute up to {} a second", Self::MAX_PER_SECOND));
        }
        let burst = spec.burst.unwrap_or(1);
        if burst == 0 || burst > calls {
            return Err(format!("rate.burst must be from 1 to its calls per period ({calls})"));
        }
        Ok(Rate { calls, per_ms, burst })
    }

    /// The time between two calls' slots: `per / calls`, and a little more, so that the calls'
    /// starts (each within [`PACE_SLACK_MS`] after its slot, and measured in whole milliseconds)
    /// never put `calls + 1` in one window of `per` (5 a second: 206 ms).
    pub fn interval_ms(&self) -> u64 {
        (self.per_ms + PACE_SLACK_MS + 1).div_ceil(u64::from(self.calls.max(1)))
    }

    /// How far before its theoretical time a call may start (the burst).
    pub fn tolerance_ms(&self) -> u64 {
        self.interval_ms() * u64::from(self.burst.saturating_sub(1))
    }
}

/// What a call of a paced agent gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Its slot: the rate item's `Tat` becomes `tat`; sleep until `slot`, then call.
    Reserve { slot: Millis, tat: Millis },
    /// The next slot is too far to sleep for: wait in the queue until about `slot`.
    Later { slot: Millis },
}

/// The slot a call asking at `now` gets, the rate item holding `tat` (none: never called), its
/// write taking up to `lead_ms` to land ([`PACE_LEAD_MS`] at least: see [`pace_lead_ms`]).
pub fn pace(tat: Option<Millis>, now: Millis, lead_ms: u64, rate: &Rate) -> Pace {
    let tat = tat.unwrap_or(Millis(0));
    let earliest = Millis(tat.0.saturating_sub(rate.tolerance_ms()));
    let slot = now.plus_ms(lead_ms.max(PACE_LEAD_MS)).max(earliest);
    if now.until(slot) > MAX_PACE_SLEEP_MS {
        return Pace::Later { slot };
    }
    Pace::Reserve { slot, tat: tat.max(slot).plus_ms(rate.interval_ms()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_slots_are_an_interval_apart_after_the_burst_and_far_ones_wait_in_the_queue() {
        let rate = Rate::of(&RateSpec { per_second: Some(5), per_minute: None, burst: None }).unwrap();
        assert_eq!((rate.interval_ms(), rate.tolerance_ms()), (206, 0));
        let mut tat = None;
        let mut slots = Vec::new();
        // twenty calls asking at the same instant
        for _ in 0..20 {
            match pace(tat, Millis(10_000), PACE_LEAD_MS, &rate) {
                Pace::Reserve { slot, tat: next } => {
                    slots.push(slot.0);
                    tat = Some(next);
                }
                Pace::Later { slot } => {
                    assert!(slot.0 > 10_000 + MAX_PACE_SLEEP_MS);
                    break;
                }
            }
        }
        assert_eq!(slots.len(), 10, "2 s of slots at 5 a second: {slots:?}");
        assert!(slots.windows(2).all(|w| w[1] - w[0] == 206), "{slots:?}");
        assert!(slots[5] - slots[0] > 1_000 + PACE_SLACK_MS, "six starts never fit in one second");
        assert_eq!(slots[0], 10_000 + PACE_LEAD_MS);
        // a burst of 3: three at once, then one an interval
        let burst = Rate::of(&RateSpec { per_second: Some(5), per_minute: None, burst: Some(3) }).unwrap();
        let mut tat = None;
        let mut slots = Vec::new();
        for _ in 0..5 {
            if let Pace::Reserve { slot, tat: next } = pace(tat, Millis(0), PACE_LEAD_MS, &burst) {
                slots.push(slot.0);
                tat = Some(next);
            }
        }
        assert_eq!(slots, vec![50, 50, 50, 256, 462]);
        // a table whose writes take 300 ms: the slot is 600 ms ahead, so the call still sleeps
        // for it once its write is back (a slot 50 ms ahead would be missed by then, and spent)
        assert_eq!(pace_lead_ms(0), PACE_LEAD_MS);
        assert_eq!(pace_lead_ms(300), 600);
        assert_eq!(pace_lead_ms(u64::MAX), MAX_PACE_SLEEP_MS / 2);
        assert_eq!(
            pace(None, Millis(10_000), pace_lead_ms(300), &rate),
            Pace::Reserve { slot: Millis(10_600), tat: Millis(10_806) }
        );
        // an idle agent's old Tat gives no credit beyond the burst
        assert_eq!(
            pace(Some(Millis(100)), Millis(90_000), PACE_LEAD_MS, &rate),
            Pace::Reserve { slot: Millis(90_050), tat: Millis(90_256) }
        );
    }

    #[test]
    fn a_rate_is_one_of_per_second_or_per_minute_within_bounds() {
        let spec = |s, m, b| RateSpec { per_second: s, per_minute: m, burst: b };
        assert_eq!(Rate::of(&spec(None, Some(30), None)).unwrap().interval_ms(), 2_001);
        assert!(Rate::of(&spec(Some(1), Some(1), None)).is_err());
        assert!(Rate::of(&spec(None, None, None)).is_err());
        assert!(Rate::of(&spec(Some(0), None, None)).is_err());
        assert!(Rate::of(&spec(Some(500), None, None)).is_err());
        assert!(Rate::of(&spec(Some(5), None, Some(6))).is_err());
    }

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
