//! Schedules: a workflow started on a cron expression or a rate, with its input. Pure: what is due
//! now, which instants a time range holds, the task id of an instant, the submission it sends.
//!
//! Every schedule of a stack is kept in one item of the task table (`schedule:all`, see
//! `sas_core::schedules`), written by `sasctl schedule` and by the Supervisor's sweep, which fires
//! the instants that are due: it sends one submission per instant to the submission queue, then
//! moves the schedule's `next` on, conditional on the item's version. An instant's task id is the
//! schedule's name and the instant (`nightly-20261129T020000Z`), so an instant sent twice (a sweep
//! that died between its sends and its write, two sweeps at once, a backfill over a time already
//! run) is one task: the submission is an idempotent create.
//!
//! What the task does when the previous one of its schedule still runs is the schedule's
//! [`Overlap`], carried out by the schedule's concurrency key (`key:schedule:<name>`, limit 1):
//! the Submitter reads the policy from the schedule itself, never from the submission.

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::ids::Millis;
use crate::workflow::WhenBusy;

/// The longest schedule name (it begins each of its tasks' ids).
pub const MAX_NAME_BYTES: usize = 64;
/// The largest input a schedule keeps (JSON bytes): every schedule lives in one item.
pub const MAX_INPUT_BYTES: usize = 4_096;
/// How many schedules a stack keeps (one item of at most 400 KB holds them all).
pub const MAX_SCHEDULES: usize = 200;
/// The shortest period of a rate.
pub const MIN_RATE_MS: u64 = 1_000;
/// The most instants one backfill sends.
pub const MAX_BACKFILL: usize = 1_000;
/// Instants missed by more than this (the Supervisor's sweep did not run: a stack stopped, an
/// account throttled) are not run late: they are counted in `missed`.
pub const CATCH_UP_MS: u64 = 3_600_000;
/// The most instants of one schedule one sweep sends (the rest at the next sweep).
pub const MAX_FIRE: usize = 60;
/// The scope of the schedules' concurrency keys: `key:schedule:<name>`.
pub const KEY_SCOPE: &str = "schedule";

/// The concurrency key of schedule `name`'s tasks, and what a newcomer does while it is held
/// (`when_busy`, from the schedule's [`Overlap`]): one task of the schedule at a time.
pub fn key(name: &str, when_busy: crate::workflow::WhenBusy) -> (String, crate::workflow::Concurrency) {
    let key = format!("{}{KEY_SCOPE}:{name}", crate::keys::KEY_PREFIX);
    let c = crate::workflow::Concurrency { key: String::new(), limit: 1, when_busy, scope: Some(KEY_SCOPE.to_owned()) };
    (key, c)
}

/// When a schedule's instants come.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Every {
    /// A cron expression, in the schedule's time zone: 5 fields (minute, hour, day of the month,
    /// month, day of the week) or 6 (seconds first); `*`, lists, ranges, steps, `L`, `W`, `#`,
    /// names of months and days, and `@daily`-style nicknames.
    Cron(String),
    /// A fixed period (at least 1 s), counted from the schedule's creation.
    RateMs(u64),
}

/// What an instant's task does while the task of an earlier instant still runs.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Not run: the instant is refused (`Rejected`, no task) while the previous one runs.
    #[default]
    Skip,
    /// Waits for the running one; a later instant replaces it (at most one waits).
    BufferOne,
    /// Waits in line: each runs after the one before it (in the order the instants reach the
    /// Submitter).
    BufferAll,
    /// Cancels the running one (its steps are undone) and runs.
    CancelPrevious,
    /// Runs at once, beside the others: no concurrency key.
    AllowAll,
}

impl Overlap {
    /// How the schedule's concurrency key carries the policy out; `None`: no key.
    pub fn when_busy(self) -> Option<WhenBusy> {
        match self {
            Overlap::Skip => Some(WhenBusy::Refuse),
            Overlap::BufferOne => Some(WhenBusy::Replace),
            Overlap::BufferAll => Some(WhenBusy::Wait),
            Overlap::CancelPrevious => Some(WhenBusy::Cancel),
            Overlap::AllowAll => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::BufferAll => "buffer_all",
            Overlap::CancelPrevious => "cancel_previous",
            Overlap::AllowAll => "allow_all",
        }
    }
}

impl std::str::FromStr for Overlap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_value(Value::String(s.replace('-', "_")))
            .map_err(|_| format!("overlap {s:?}: one of skip, buffer_one, buffer_all, cancel_previous, allow_all"))
    }
}

/// One schedule, as its item keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Schedule {
    pub workflow: String,
    /// Pins a version of the workflow; the latest deployed when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    #[serde(default)]
    pub input: Value,
    pub every: Every,
    /// The IANA time zone of a cron expression (`Europe/Paris`); UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    #[serde(default)]
    pub overlap: Overlap,
    /// Each instant's submission is sent up to this much later (the same offset each time it is
    /// computed: a hash of the name and the instant), so schedules on the same minute spread out.
    #[serde(default)]
    pub jitter_ms: u64,
    /// Why an operator paused it: no instant is sent while paused, and those that passed are
    /// not sent on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// The next instant to send.
    pub next: Millis,
    pub created: Millis,
    /// Instants sent so far, the last of them, and instants missed (see [`CATCH_UP_MS`]).
    #[serde(default)]
    pub fired: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Millis>,
    #[serde(default)]
    pub missed: u64,
}

/// Every schedule of a stack: one item, `Ver` +1 per write, each write conditional on the version
/// read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Schedules {
    #[serde(default)]
    pub schedules: BTreeMap<String, Schedule>,
    #[serde(default)]
    pub ver: u64,
}

/// A schedule's name: letters, digits, `.`, `_`, `-`, at most [`MAX_NAME_BYTES`].
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "schedule name {name:?}: 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-' (it begins its tasks' ids)"
        ))
    }
}

fn zone(tz: Option<&str>) -> Result<chrono_tz::Tz, String> {
    match tz {
        None => Ok(chrono_tz::UTC),
        Some(name) => name
            .parse::<chrono_tz::Tz>()
            .map_err(|_| format!("time zone {name:?} is not in the IANA database (e.g. UTC, Europe/Paris)")),
    }
}

fn cron(expr: &str) -> Result<croner::Cron, String> {
    croner::Cron::new(expr).with_seconds_optional().parse().map_err(|e| format!("cron expression {expr:?}: {e}"))
}

/// A schedule's instants, its expression parsed once: [`Cadence::next_after`] steps through them.
enum Cadence {
    Rate { period: u64, created: Millis },
    Cron { cron: Box<croner::Cron>, tz: chrono_tz::Tz },
}

impl Cadence {
    fn of(every: &Every, tz: Option<&str>, created: Millis) -> Result<Cadence, String> {
        Ok(match every {
            Every::RateMs(p) => Cadence::Rate { period: (*p).max(1), created },
            Every::Cron(expr) => Cadence::Cron { cron: Box::new(cron(expr)?), tz: zone(tz)? },
        })
    }

    /// The first instant strictly after `after`; `None` when there is none (a cron expression of
    /// a date that never comes again).
    fn next_after(&self, after: Millis) -> Result<Option<Millis>, String> {
        match self {
            Cadence::Rate { period, created } => {
                let k = if after < *created { 0 } else { (after.0 - created.0) / period + 1 };
                Ok(Some(Millis(created.0.saturating_add(k.saturating_mul(*period)))))
            }
            Cadence::Cron { cron, tz } => {
                let ms = i64::try_from(after.0).map_err(|_| "a time past the year 292 million".to_owned())?;
                let Some(at) = tz.timestamp_millis_opt(ms).single() else { return Ok(None) };
                match cron.find_next_occurrence(&at, false) {
                    Ok(next) => Ok(u64::try_from(next.timestamp_millis()).ok().map(Millis)),
                    Err(_) => Ok(None),
                }
            }
        }
    }
}

impl Schedule {
    /// A new schedule, checked: its workflow's name (not whether it is deployed: the caller
    /// checks), its expression or rate, time zone, input and jitter. Its first instant is the
    /// first after `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        workflow: &str,
        version: Option<u32>,
        input: Value,
        every: Every,
        time_zone: Option<String>,
        overlap: Overlap,
        jitter_ms: u64,
        now: Millis,
    ) -> Result<Schedule, String> {
        if let Every::RateMs(p) = every {
            if p < MIN_RATE_MS {
                return Err(format!("a rate's period is at least {MIN_RATE_MS} ms, not {p}"));
            }
        }
        if time_zone.is_some() && matches!(every, Every::RateMs(_)) {
            return Err("a time zone applies to a cron expression, not to a rate".into());
        }
        let size = crate::messages::json_len(&input);
        if size > MAX_INPUT_BYTES {
            return Err(format!("the input is {size} bytes; a schedule keeps at most {MAX_INPUT_BYTES}"));
        }
        let mut s = Schedule {
            workflow: workflow.to_owned(),
            version,
            input,
            every,
            time_zone,
            overlap,
            jitter_ms,
            paused: None,
            next: now,
            created: now,
            fired: 0,
            last: None,
            missed: 0,
        };
        if jitter_ms > 0 {
            if let Some(period) = s.shortest_period(now)? {
                if jitter_ms >= period {
                    return Err(format!("a jitter of {jitter_ms} ms is not shorter than the period ({period} ms)"));
                }
            }
        }
        s.next = s.next_after(now)?.ok_or("the expression has no instant after now")?;
        Ok(s)
    }

    /// The first instant strictly after `after`.
    pub fn next_after(&self, after: Millis) -> Result<Option<Millis>, String> {
        self.cadence()?.next_after(after)
    }

    fn cadence(&self) -> Result<Cadence, String> {
        Cadence::of(&self.every, self.time_zone.as_deref(), self.created)
    }

    /// The shortest gap between two of the next few instants after `now` (a rate's period).
    fn shortest_period(&self, now: Millis) -> Result<Option<u64>, String> {
        let mut at = now;
        let mut gaps = Vec::new();
        let mut prev = None;
        for _ in 0..5 {
            let Some(n) = self.next_after(at)? else { break };
            if let Some(p) = prev {
                gaps.push(n.0 - p);
            }
            prev = Some(n.0);
            at = n;
        }
        Ok(gaps.into_iter().min())
    }

    /// The instants in `[from, to)`, at most `max`.
    pub fn instants(&self, from: Millis, to: Millis, max: usize) -> Result<Vec<Millis>, String> {
        let mut out = Vec::new();
        let mut at = self.next_after(Millis(from.0.saturating_sub(1)))?;
        while let Some(a) = at.filter(|a| *a < to) {
            if out.len() == max {
                return Err(format!("the range holds more than {max} instants: backfill a shorter one (or in parts)"));
            }
            out.push(a);
            at = self.next_after(a)?;
        }
        Ok(out)
    }
}

/// How long after its instant the submission of `instant` is sent: the same offset every time
/// (FNV-1a of the name and the instant), in `[0, jitter_ms]`.
pub fn jitter(name: &str, instant: Millis, jitter_ms: u64) -> u64 {
    if jitter_ms == 0 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(instant.0.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % (jitter_ms + 1)
}

/// What a sweep sends of one schedule: the instants due, the instants missed, and the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    pub fire: Vec<Millis>,
    pub missed: u64,
    pub next: Millis,
}

/// The instants of schedule `name` due at `now` (each at its instant plus its jitter); `None`
/// when nothing is due, or it is paused. Instants older than [`CATCH_UP_MS`] are missed, not sent;
/// at most [`MAX_FIRE`] are sent at once (the rest at the next sweep).
pub fn due(name: &str, s: &Schedule, now: Millis) -> Option<Firing> {
    if s.paused.is_some() {
        return None;
    }
    // parsed once for every instant it steps through (up to 100,000 missed ones); an expression
    // this version cannot read sends the instant due and has no next one
    let cadence = s.cadence().ok();
    let next_after = |x: Millis| cadence.as_ref().and_then(|c| c.next_after(x).ok().flatten());
    let mut at = s.next;
    let (mut fire, mut missed) = (Vec::new(), 0u64);
    let horizon = Millis(now.0.saturating_sub(CATCH_UP_MS));
    if at < horizon {
        // a long gap: count what it held (a rate by arithmetic, a cron expression one by one, up
        // to a bound) and go on from the horizon
        let resume = next_after(Millis(horizon.0.saturating_sub(1))).unwrap_or(Millis(u64::MAX));
        missed = match s.every {
            Every::RateMs(p) => (resume.0.saturating_sub(at.0)) / p.max(1),
            Every::Cron(_) => {
                let mut n = 0u64;
                let mut a = Some(at);
                while let Some(x) = a.filter(|x| *x < resume && n < 100_000) {
                    n += 1;
                    a = next_after(x);
                }
                n
            }
        };
        at = resume;
    }
    while at.0.saturating_add(jitter(name, at, s.jitter_ms)) <= now.0 && fire.len() < MAX_FIRE {
        fire.push(at);
        if let Some(n) = next_after(at) {
            at = n;
        } else {
            at = Millis(u64::MAX);
            break;
        }
    }
    (!fire.is_empty() || missed > 0).then_some(Firing { fire, missed, next: at })
}

impl Schedule {
    /// Record a firing: the next instant, the counts.
    pub fn fired(&mut self, f: &Firing) {
        self.next = f.next;
        self.fired += f.fire.len() as u64;
        self.missed += f.missed;
        if let Some(last) = f.fire.last() {
            self.last = Some(*last);
        }
    }
}

/// The task id of schedule `name`'s instant: `{name}-{YYYYMMDD}T{HHMMSS}Z` in UTC (with
/// `.mmm` when the instant has milliseconds).
pub fn task_id(name: &str, instant: Millis) -> String {
    let at = i64::try_from(instant.0).ok().and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    match at {
        Some(t) if instant.0.is_multiple_of(1000) => format!("{name}-{}", t.format("%Y%m%dT%H%M%SZ")),
        Some(t) => format!("{name}-{}", t.format("%Y%m%dT%H%M%S%.3fZ")),
        None => format!("{name}-{}", instant.0),
    }
}

/// An instant as people read it, UTC (`2026-11-29T02:00:00Z`).
pub fn rfc3339(instant: Millis) -> String {
    i64::try_from(instant.0)
        .ok()
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
        .map_or_else(|| instant.0.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// The submission of schedule `name`'s `instant` (a backfill's when `backfill`): its task id, the
/// workflow and input, and the `schedule` it comes from (the Submitter reads the overlap from the
/// schedule, never from the message).
pub fn submission(name: &str, s: &Schedule, instant: Millis, backfill: bool) -> Value {
    let mut m = json!({
        "v": crate::messages::VERSION,
        "task_id": task_id(name, instant),
        "workflow": s.workflow,
        "input": s.input,
        "schedule": {"name": name, "at": instant.0},
    });
    if let Some(v) = s.version {
        m["workflow_version"] = json!(v);
    }
    if backfill {
        m["schedule"]["backfill"] = json!(true);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;
    // 2026-11-29T18:00:00Z
    const T0: u64 = 1_795_975_200_000;

    fn every_minute(now: u64) -> Schedule {
        Schedule::new("w", None, json!({"a": 1}), Every::Cron("* * * * *".into()), None, Overlap::Skip, 0, Millis(now))
            .unwrap()
    }

    #[test]
    fn a_cron_schedule_starts_on_its_next_instant_and_sends_each_once() {
        let mut s = every_minute(T0 + 5_000);
        assert_eq!(s.next, Millis(T0 + MIN));
        assert_eq!(due("n", &s, Millis(T0 + MIN - 1)), None, "not yet");
        let f = due("n", &s, Millis(T0 + MIN + 300)).expect("due");
        assert_eq!((f.fire.clone(), f.missed, f.next), (vec![Millis(T0 + MIN)], 0, Millis(T0 + 2 * MIN)));
        s.fired(&f);
        assert_eq!(due("n", &s, Millis(T0 + MIN + 900)), None, "each instant once");
        // a sweep 3 minutes late sends the three it missed, in order
        let f = due("n", &s, Millis(T0 + 4 * MIN + 1)).unwrap();
        assert_eq!(f.fire, vec![Millis(T0 + 2 * MIN), Millis(T0 + 3 * MIN), Millis(T0 + 4 * MIN)]);
        s.fired(&f);
        assert_eq!((s.fired, s.last, s.next), (4, Some(Millis(T0 + 4 * MIN)), Millis(T0 + 5 * MIN)));
    }

    #[test]
    fn instants_missed_by_more_than_the_catch_up_window_are_counted_not_sent() {
        let s = every_minute(T0);
        let now = Millis(T0 + 3 * CATCH_UP_MS);
        let f = due("n", &s, now).unwrap();
        assert_eq!(f.fire.len(), MAX_FIRE, "the last hour's instants, 60 at a time");
        assert_eq!(f.fire[0], Millis(now.0 - CATCH_UP_MS), "from the window's start");
        assert_eq!(f.missed, 2 * 60 - 1, "the two hours before it, from the first instant (T0 + 1 min): {f:?}");
        // a rate, counted by arithmetic
        let r = Schedule::new("w", None, json!(null), Every::RateMs(1_000), None, Overlap::AllowAll, 0, Millis(T0))
            .unwrap();
        let f = due("r", &r, Millis(T0 + 30 * 86_400_000)).unwrap();
        assert!(f.missed > 2_500_000 && f.fire.len() == MAX_FIRE, "{} missed", f.missed);
    }

    #[test]
    fn a_paused_schedule_sends_nothing() {
        let mut s = every_minute(T0);
        s.paused = Some("maintenance".into());
        assert_eq!(due("n", &s, Millis(T0 + 10 * MIN)), None);
    }

    #[test]
    fn a_time_zone_places_the_instants_and_daylight_saving_time_is_followed() {
        // 02:30 every day in Paris: 01:30 UTC in winter; 2026-03-29 has no 02:30 (the clocks
        // jump), and 00:30 UTC in summer
        let s = Schedule::new(
            "w",
            None,
            json!({}),
            Every::Cron("30 2 * * *".into()),
            Some("Europe/Paris".into()),
            Overlap::Skip,
            0,
            Millis(1_795_975_200_000),
        )
        .unwrap();
        assert_eq!(rfc3339(s.next), "2026-11-30T01:30:00Z");
        let summer = s.next_after(Millis(1_782_000_000_000)).unwrap().unwrap(); // 2026-06-21
        assert!(rfc3339(summer).ends_with("T00:30:00Z"), "{}", rfc3339(summer));
        assert!(Schedule::new(
            "w",
            None,
            json!({}),
            Every::Cron("* * * * *".into()),
            Some("Mars/Base".into()),
            Overlap::Skip,
            0,
            Millis(T0)
        )
        .unwrap_err()
        .contains("IANA"));
    }

    #[test]
    fn bad_schedules_are_refused_with_the_reason() {
        let new = |every: Every, tz: Option<&str>, jitter: u64, input: Value| {
            Schedule::new("w", None, input, every, tz.map(str::to_owned), Overlap::Skip, jitter, Millis(T0))
        };
        assert!(new(Every::Cron("61 * * * *".into()), None, 0, json!({})).unwrap_err().contains("cron expression"));
        assert!(new(Every::RateMs(500), None, 0, json!({})).unwrap_err().contains("at least 1000 ms"));
        assert!(new(Every::RateMs(60_000), Some("UTC"), 0, json!({})).unwrap_err().contains("not to a rate"));
        assert!(new(Every::RateMs(60_000), None, 60_000, json!({})).unwrap_err().contains("jitter"));
        assert!(new(Every::Cron("*/5 * * * *".into()), None, 299_000, json!({})).is_ok());
        let big = json!({"x": "y".repeat(MAX_INPUT_BYTES)});
        assert!(new(Every::RateMs(60_000), None, 0, big).unwrap_err().contains("at most 4096"));
        assert!(check_name("nightly.report_2").is_ok());
        assert!(check_name("night:ly").unwrap_err().contains("letters"));
        assert!(check_name(&"n".repeat(65)).is_err());
        assert!("sometimes".parse::<Overlap>().unwrap_err().contains("buffer_one"));
        assert_eq!("cancel-previous".parse::<Overlap>(), Ok(Overlap::CancelPrevious));
    }

    #[test]
    fn an_instant_is_one_task_id_and_a_range_lists_its_instants() {
        assert_eq!(task_id("nightly", Millis(T0)), "nightly-20261129T180000Z");
        assert_eq!(task_id("r", Millis(T0 + 1_234)), "r-20261129T180001.234Z");
        assert!(crate::ids::TaskId::try_from(task_id(&"n".repeat(MAX_NAME_BYTES), Millis(T0 + 1))).is_ok());
        let s = every_minute(T0 + 5 * CATCH_UP_MS);
        // an hour: 60 instants, from inclusive, to exclusive
        let hour = s.instants(Millis(T0), Millis(T0 + 60 * MIN), MAX_BACKFILL).unwrap();
        assert_eq!((hour.len(), hour[0], hour[59]), (60, Millis(T0), Millis(T0 + 59 * MIN)));
        assert!(s.instants(Millis(T0), Millis(T0 + 2_000 * MIN), MAX_BACKFILL).unwrap_err().contains("more than 1000"));
        let sub = submission("nightly", &s, Millis(T0), true);
        assert_eq!(sub["task_id"], "nightly-20261129T180000Z");
        assert_eq!(sub["schedule"], json!({"name": "nightly", "at": T0, "backfill": true}));
        assert_eq!(sub["input"], json!({"a": 1}));
    }

    #[test]
    fn jitter_is_stable_and_within_its_bound() {
        for i in 0..200 {
            let at = Millis(T0 + i * MIN);
            let j = jitter("n", at, 30_000);
            assert!(j <= 30_000);
            assert_eq!(j, jitter("n", at, 30_000));
        }
        let mut s = every_minute(T0);
        s.jitter_ms = 30_000;
        let j = jitter("n", s.next, 30_000);
        assert_eq!(due("n", &s, Millis(s.next.0 + j - 1)).map(|f| f.fire), None);
        assert_eq!(due("n", &s, Millis(s.next.0 + j)).map(|f| f.fire), Some(vec![s.next]));
    }
}
