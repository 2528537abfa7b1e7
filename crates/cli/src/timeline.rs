//! A task's timeline, for people: what `sasctl status` prints and `make demo` ends with.
//!
//! Pure: a [`Task`] as the table keeps it and the time `now` in, text out. Every time is relative
//! to the task's creation (`+1.204s`, `+2m05.3s`, `+1h02m03s`). The attempts of each unit of work
//! (a forward step or a compensation) come from the history: an entry that names a unit in a
//! running state starts an attempt, the next entry ends it; an entry in a waiting state starts a
//! wait (a backoff before a retry, a compensation waiting for its forward attempt to settle, a
//! resumed task waiting for its claim). Each span gets its duration, its outcome and a bar on one
//! time axis shared by the whole task.
//!
//! `Compensating` names both a compensation waiting for its claim and one running: the entry says
//! which (`waiting`, written by the protocol; [`is_wait`]; checked against the protocol on random
//! runs).
//!
//! The history on the item is capped (the protocol keeps the last `history_limit` entries); the
//! timeline says how many earlier entries are gone, and numbers the attempts it still sees from the
//! step records' attempt counts.

use std::collections::HashMap;
use std::fmt::Write as _;

use sas_protocol::ids::Millis;
use sas_protocol::protocol::{CompensationStatus, HistoryEntry, ProcessState, StepStatus, Task};

/// Columns of the time axis.
pub const BAR_WIDTH: usize = 40;
/// The widest output or reason shown on one line (bytes).
const CLIP: usize = 100;

/// How much to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// The task's facts (state, FailureCount, LockedBy, CompleteBy, reason...), the timeline,
    /// every history entry the item keeps and the succeeded steps' outputs: `sasctl status`.
    Full,
    /// A one-line title, the timeline and the current wait: the end of `make demo`.
    Compact,
}

/// What to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Columns of each bar.
    pub width: usize,
    /// ANSI colours (only for a terminal).
    pub color: bool,
    pub detail: Detail,
}

impl Options {
    /// Everything: `sasctl status`.
    pub fn full(color: bool) -> Self {
        Options { width: BAR_WIDTH, color, detail: Detail::Full }
    }

    /// The steps and the current wait: the end of `make demo`.
    pub fn compact(color: bool) -> Self {
        Options { width: BAR_WIDTH, color, detail: Detail::Compact }
    }
}

/// `ms` for people: `0.412s`, `2m05.3s`, `1h02m03s`, `3d04h05m`.
pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 60_000 {
        format!("{s}.{:03}s", ms % 1000)
    } else if ms < 3_600_000 {
        format!("{}m{:02}.{}s", s / 60, s % 60, (ms % 1000) / 100)
    } else if ms < 86_400_000 {
        format!("{}h{:02}m{:02}s", s / 3600, (s / 60) % 60, s % 60)
    } else {
        let m = ms / 60_000;
        format!("{}d{:02}h{:02}m", m / 1440, (m / 60) % 24, m % 60)
    }
}

/// `t` relative to `t0`: `+1.204s` (or `-0.010s` before it).
pub fn offset(t0: Millis, t: Millis) -> String {
    if t >= t0 {
        format!("+{}", duration(t0.until(t)))
    } else {
        format!("-{}", duration(t.until(t0)))
    }
}

/// `t` as an RFC 3339 UTC time.
pub fn utc(t: Millis) -> String {
    let ms = i64::try_from(t.0).unwrap_or(i64::MAX);
    aws_smithy_types::DateTime::from_millis(ms)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap_or_else(|_| format!("{t} ms"))
}

/// `reason` with the epoch milliseconds it quotes (`passed CompleteBy 1795302478932`) made relative
/// to `t0`, and cut to `max` bytes.
fn humane(reason: &str, t0: Millis, max: usize) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        // 13 digits: an epoch millisecond between 2001 and 2286; only those near the task.
        let near = digits.len() == 13
            && digits.parse::<u64>().is_ok_and(|v| v + 86_400_000 >= t0.0 && v <= t0.0 + 400 * 86_400_000);
        if near {
            out.push_str(&offset(t0, Millis(digits.parse().unwrap_or_default())));
        } else {
            out.push_str(digits);
        }
        digits.clear();
    };
    for c in reason.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    clipped(&out, max)
}

/// `s` cut to `max` bytes with an ellipsis when it was longer.
fn clipped(s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_owned()
    } else {
        format!("{}…", sas_protocol::ids::clip(s, max.saturating_sub(1)))
    }
}

/// A unit of work: a forward step or the compensation of one (by the step's index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Unit {
    Step(usize),
    Compensation(usize),
}

fn unit_named(task: &Task, name: &str) -> Option<Unit> {
    task.workflow.steps.iter().enumerate().find_map(|(i, d)| {
        if d.name == name {
            Some(Unit::Step(i))
        } else if d.compensation.as_ref().is_some_and(|c| c.name == name) {
            Some(Unit::Compensation(i))
        } else {
            None
        }
    })
}

fn unit_name(task: &Task, unit: Unit) -> String {
    match unit {
        Unit::Step(i) => task.workflow.steps.get(i).map_or_else(|| format!("step {i}"), |d| d.name.clone()),
        Unit::Compensation(i) => {
            let step = task.workflow.steps.get(i);
            let comp = step.and_then(|d| d.compensation.as_ref()).map_or("compensation", |c| c.name.as_str());
            format!("{comp} (undoes {})", step.map_or("?", |d| d.name.as_str()))
        }
    }
}

/// Attempts the task's records count for `unit` (the history may have lost the earliest).
fn recorded_attempts(task: &Task, unit: Unit) -> u32 {
    match unit {
        Unit::Step(i) => task.steps.get(i).map_or(0, |s| s.attempts),
        Unit::Compensation(i) => task.steps.get(i).and_then(|s| s.compensation.as_ref()).map_or(0, |c| c.attempts),
    }
}

/// Whether history entry `i` starts a wait (rather than an attempt), as the entry says
/// ([`sas_protocol::protocol::HistoryEntry::waiting`]); a `Pending` entry always waits (entries written
/// before the flag existed lack it).
fn is_wait(task: &Task, i: usize) -> bool {
    let e = &task.history[i];
    e.waiting || e.state == ProcessState::Pending
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tone {
    Good,
    Bad,
    Warn,
    Live,
    Plain,
}

impl Tone {
    fn ansi(self) -> Option<&'static str> {
        match self {
            Tone::Good => Some("32"),
            Tone::Bad => Some("31"),
            Tone::Warn => Some("33"),
            Tone::Live => Some("36"),
            Tone::Plain => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// An attempt, numbered as the unit's records count them.
    Attempt(u32),
    /// A wait step sleeping.
    Sleep,
    Wait,
}

#[derive(Debug, Clone)]
struct Span {
    unit: Unit,
    kind: Kind,
    start: Millis,
    end: Millis,
    /// Still going: it ends now.
    open: bool,
    tone: Tone,
    outcome: String,
    /// Why a failed attempt failed (the reason of the entry that ended it).
    why: Option<String>,
}

/// "refused" (a definite no), "timed out" or "failed", from the reason the protocol wrote.
fn failure_word(reason: Option<&str>) -> &'static str {
    let r = reason.unwrap_or_default();
    if r.contains("failed permanently") {
        "refused"
    } else if r.contains("passed CompleteBy") || r.contains("timed out") || r.contains("no heartbeat") {
        "timed out"
    } else {
        "failed"
    }
}

/// The outcome of a unit's last attempt, from its record.
fn recorded_outcome(task: &Task, unit: Unit, sleep: bool) -> (Tone, String) {
    match unit {
        Unit::Step(i) => match task.steps.get(i) {
            Some(s) => match s.status {
                StepStatus::Succeeded if sleep => (Tone::Good, "woke up".into()),
                StepStatus::Succeeded => (Tone::Good, "succeeded".into()),
                StepStatus::Failed if s.refused => (Tone::Bad, "refused".into()),
                StepStatus::Failed => (Tone::Bad, "failed".into()),
                StepStatus::TimedOut => (Tone::Bad, "timed out".into()),
                StepStatus::Cancelled => (Tone::Warn, "cancelled".into()),
                StepStatus::Skipped => (Tone::Plain, "skipped".into()),
                StepStatus::Pending | StepStatus::Running => (Tone::Plain, "ended".into()),
            },
            None => (Tone::Plain, "ended".into()),
        },
        Unit::Compensation(i) => match task.steps.get(i).and_then(|s| s.compensation.as_ref()).map(|c| c.status) {
            Some(CompensationStatus::Done) => (Tone::Good, "done".into()),
            Some(CompensationStatus::Failed) if c_refused(task, i) => (Tone::Bad, "refused".into()),
            Some(CompensationStatus::Failed) => (Tone::Bad, "failed".into()),
            _ => (Tone::Plain, "ended".into()),
        },
    }
}

fn c_refused(task: &Task, i: usize) -> bool {
    task.steps.get(i).and_then(|s| s.compensation.as_ref()).is_some_and(|c| c.refused)
}

/// The spans of the kept history, in its order.
fn spans(task: &Task, now: Millis) -> Vec<Span> {
    let h = &task.history;
    let t0 = task.created_at;
    let class: Vec<Option<(Unit, bool)>> = (0..h.len())
        .map(|i| {
            let e = &h[i];
            if e.state == ProcessState::Error {
                // left by an operator's resubmit or cancel: the time in Error, on the unit it resumed
                let n = h.get(i + 1)?;
                return Some((unit_named(task, n.step.as_deref()?)?, true));
            }
            if e.state.is_terminal() {
                return None;
            }
            let unit = unit_named(task, e.step.as_deref()?)?;
            Some((unit, is_wait(task, i)))
        })
        .collect();
    // Attempts seen per unit, and the last one's entry: the earliest may be gone from the history.
    let mut seen: HashMap<Unit, u32> = HashMap::new();
    let mut last: HashMap<Unit, usize> = HashMap::new();
    for (i, c) in class.iter().enumerate() {
        if let Some((u, false)) = c {
            *seen.entry(*u).or_default() += 1;
            last.insert(*u, i);
        }
    }
    let mut numbered: HashMap<Unit, u32> =
        seen.iter().map(|(u, n)| (*u, recorded_attempts(task, *u).saturating_sub(*n))).collect();
    let mut out = Vec::new();
    for (i, c) in class.iter().enumerate() {
        let Some((unit, wait)) = *c else { continue };
        let e = &h[i];
        let next = h.get(i + 1);
        let (end, open) = match next {
            Some(n) => (n.at.max(e.at), false),
            None if task.process_state.is_terminal() => (task.updated_at.max(e.at), false),
            None => (now.max(e.at), true),
        };
        let sleep = matches!(unit, Unit::Step(s) if task.workflow.steps.get(s).is_some_and(|d| d.kind.is_timer()));
        let why_of = |n: &HistoryEntry| n.reason.as_deref().map(|r| humane(r, t0, CLIP));
        let span = if wait {
            let reason = e.reason.as_deref().unwrap_or_default();
            let after_error = i > 0 && h[i - 1].state == ProcessState::Error;
            let label = if e.state == ProcessState::Error {
                "in Error"
            } else if reason.contains("; retry ") && !after_error {
                "backoff"
            } else if after_error {
                "resumed"
            } else if e.state == ProcessState::Compensating {
                // until the forward attempt answers or can no longer apply
                "settling"
            } else {
                "waiting for a claim"
            };
            Span { unit, kind: Kind::Wait, start: e.at, end, open, tone: Tone::Plain, outcome: label.into(), why: None }
        } else {
            let n = numbered.entry(unit).or_default();
            *n += 1;
            let kind = if sleep { Kind::Sleep } else { Kind::Attempt(*n) };
            let (tone, outcome, why) = match next {
                None if task.process_state.is_terminal() => (Tone::Plain, "ended".to_owned(), None),
                None => (Tone::Live, if sleep { "sleeping" } else { "running" }.to_owned(), None),
                // its request waited past start_by (a backlog, or an agent at its max_in_flight):
                // claimed again at once, not a failure
                Some(n)
                    if n.step == e.step
                        && class[i + 1].is_some_and(|(_, w)| !w)
                        && n.reason.as_deref().is_some_and(|r| r.contains(" not started: ")) =>
                {
                    (Tone::Warn, "not started, claimed again".to_owned(), why_of(n))
                }
                Some(n) if n.step == e.step && class[i + 1].is_some_and(|(_, w)| w) => {
                    (Tone::Warn, format!("{}, retried", failure_word(n.reason.as_deref())), why_of(n))
                }
                Some(n) if n.state == ProcessState::Error => {
                    let (_, word) = recorded_outcome(task, unit, sleep);
                    // "failed" also names a compensation whose last attempt timed out: the reason says
                    let word = if last.get(&unit) == Some(&i) && word != "ended" && word != "failed" {
                        word
                    } else {
                        failure_word(n.reason.as_deref()).to_owned()
                    };
                    (Tone::Bad, word, why_of(n))
                }
                Some(n) if last.get(&unit) == Some(&i) => {
                    let (tone, mut word) = recorded_outcome(task, unit, sleep);
                    if word == "failed" {
                        failure_word(n.reason.as_deref()).clone_into(&mut word);
                    }
                    let why = matches!(tone, Tone::Bad | Tone::Warn).then(|| why_of(n)).flatten();
                    (tone, word, why)
                }
                Some(_) => (Tone::Plain, "ended".to_owned(), None),
            };
            Span { unit, kind, start: e.at, end, open, tone, outcome, why }
        };
        out.push(span);
    }
    out
}

/// The instant the time axis ends: the last entry for a task that ended (a late result may write
/// it later), `now` for one in flight.
fn axis_end(task: &Task, now: Millis, spans: &[Span]) -> Millis {
    let last = task.history.last().map_or(task.updated_at, |h| h.at);
    let end = if task.process_state.is_terminal() { last } else { now.max(last) };
    spans.iter().map(|s| s.end).fold(end, Millis::max)
}

fn paint(color: bool, code: Option<&str>, s: &str) -> String {
    match code {
        Some(code) if color && !s.trim().is_empty() => format!("\x1b[{code}m{s}\x1b[0m"),
        _ => s.to_owned(),
    }
}

/// The bar of `span` on the axis `t0..t1`, `width` columns.
fn bar(span: &Span, t0: Millis, t1: Millis, width: usize, color: bool) -> String {
    let total = u128::from(t0.until(t1).max(1));
    let col = |t: Millis| {
        let at = u128::from(t0.until(t)).min(total);
        usize::try_from(at * width as u128 / total).unwrap_or(width)
    };
    let mut a = col(span.start).min(width.saturating_sub(1));
    let mut b = col(span.end).max(a + 1).min(width);
    if b <= a {
        a = b.saturating_sub(1);
        b = a + 1;
    }
    let fill = match span.kind {
        Kind::Attempt(_) => '█',
        Kind::Sleep => '▒',
        Kind::Wait => '░',
    };
    let body: String = std::iter::repeat_n(fill, b - a).collect();
    let code = if span.kind == Kind::Wait { Some("2") } else { span.tone.ansi() };
    format!("|{}{}{}|", " ".repeat(a), paint(color, code, &body), " ".repeat(width - b))
}

/// What a unit's record says, in a few words.
fn unit_summary(task: &Task, unit: Unit) -> (Tone, String) {
    let plural = |n: u32, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    match unit {
        Unit::Step(i) => {
            let Some(s) = task.steps.get(i) else { return (Tone::Plain, "no record".into()) };
            // a region's other steps run as its branches: the region's first step says where
            if let Some(r) = task.workflow.regions().into_iter().find(|r| r.contains(&i) && r.start != i) {
                let head = &task.workflow.steps[r.start].name;
                let e = i - r.start;
                // a skipped branch has no task: the region's progress says so before its status does
                let text = match (skipped_branch(task, i), s.status) {
                    (Some(why), _) => format!("skipped, {why} (branch {e} of the region at {head})"),
                    (None, StepStatus::Succeeded) => format!("succeeded (branch {e} of the region at {head})"),
                    _ => format!("a branch of the region at {head}: see there (task {}~{}~{e})", task.task_id, r.start),
                };
                let tone = if s.status == StepStatus::Succeeded { Tone::Good } else { Tone::Plain };
                return (tone, text);
            }
            let (tone, mut text) = match s.status {
                StepStatus::Pending if s.attempts == 0 => (Tone::Plain, "not started".to_owned()),
                StepStatus::Pending => (Tone::Warn, format!("waiting for attempt {}", s.attempts + 1)),
                StepStatus::Running => (Tone::Live, format!("running attempt {}", s.attempts)),
                StepStatus::Succeeded => (Tone::Good, "succeeded".to_owned()),
                StepStatus::Failed if s.refused => (Tone::Bad, "failed (refused)".to_owned()),
                StepStatus::Failed => (Tone::Bad, "failed".to_owned()),
                StepStatus::TimedOut => (Tone::Bad, "timed out".to_owned()),
                StepStatus::Cancelled => (Tone::Warn, "cancelled".to_owned()),
                StepStatus::Skipped => {
                    (Tone::Plain, format!("skipped, {}", s.skipped.as_deref().unwrap_or("its guard was false")))
                }
            };
            if s.status != StepStatus::Succeeded && s.result().is_some() {
                // a failure its on_failure handled
                text.push_str(" (on_failure: continue, the task went on)");
            }
            if s.attempts > 0 && s.status != StepStatus::Running {
                let _ = write!(text, ", {}", plural(s.attempts, "attempt"));
            }
            if s.failures > 0 {
                let _ = write!(text, ", {}", plural(s.failures, "failure"));
            }
            if let Some(m) = map_summary(task, i) {
                let _ = write!(text, "; {m}");
            }
            if let Some(c) = &s.compensation {
                let how = match c.status {
                    CompensationStatus::Done => "undone",
                    CompensationStatus::Failed => "undo failed",
                    CompensationStatus::Pending | CompensationStatus::Running => "being undone",
                };
                let _ = write!(text, "; {how} by {}", c.name);
            } else if s.maybe_applied && task.process_state.is_terminal() && s.status != StepStatus::Succeeded {
                let _ = write!(text, "; may have applied");
            }
            (tone, text)
        }
        Unit::Compensation(i) => {
            let Some(c) = task.steps.get(i).and_then(|s| s.compensation.as_ref()) else {
                return (Tone::Plain, "no record".into());
            };
            let (tone, mut text) = match c.status {
                CompensationStatus::Pending => (Tone::Warn, "waiting".to_owned()),
                CompensationStatus::Running => (Tone::Live, format!("running attempt {}", c.attempts)),
                CompensationStatus::Done => (Tone::Good, "done".to_owned()),
                CompensationStatus::Failed => (Tone::Bad, "failed".to_owned()),
            };
            if c.status != CompensationStatus::Running {
                let _ = write!(text, ", {}", plural(c.attempts, "attempt"));
            }
            if c.failures > 0 {
                let _ = write!(text, ", {}", plural(c.failures, "failure"));
            }
            (tone, text)
        }
    }
}

/// The units in the order people read them: forward steps as the workflow lists them, then the
/// compensations in the order they ran (those the history no longer shows last).
fn units(task: &Task, spans: &[Span]) -> Vec<Unit> {
    let mut out: Vec<Unit> = (0..task.workflow.steps.len()).map(Unit::Step).collect();
    for s in spans {
        if matches!(s.unit, Unit::Compensation(_)) && !out.contains(&s.unit) {
            out.push(s.unit);
        }
    }
    for i in (0..task.steps.len()).rev() {
        if task.steps[i].compensation.is_some() && !out.contains(&Unit::Compensation(i)) {
            out.push(Unit::Compensation(i));
        }
    }
    out
}

/// What the task waits for now, or how it ended.
fn current(task: &Task, now: Millis) -> String {
    let t0 = task.created_at;
    if task.process_state.is_terminal() {
        let end = task.history.last().filter(|h| h.state == task.process_state).map_or(task.updated_at, |h| h.at);
        return format!(
            "ended {} at {} ({} after its creation)",
            task.process_state,
            offset(t0, end),
            duration(t0.until(end))
        );
    }
    let unit = task.current_step_name().unwrap_or("?");
    let map = task.steps.get(task.unit_step()).and_then(|s| s.map.as_ref()).filter(|_| task.lock.locked_by.is_none());
    let what = if let Some(p) =
        map.filter(|_| matches!(task.process_state, ProcessState::Processing | ProcessState::Compensating))
    {
        let running = p.running().count();
        if task.current_def().kind.loop_spec().is_some() {
            format!(
                "{unit} (its iteration {} running, {} ended, at most {}; CompleteBy is the loop's next look)",
                p.started.saturating_sub(1),
                p.ended.count(),
                p.n
            )
        } else {
            let what = if p.branches.is_some() { "parallel branches" } else { "map elements" };
            format!(
                "{unit} (its {what}: {running} running, {} ended of {}; CompleteBy is the {}'s next look)",
                p.ended.count(),
                p.n,
                if p.branches.is_some() { "region" } else { "map" }
            )
        }
    } else if task.lock.locked_by.is_some() && task.current_def().kind.loop_spec().is_some() {
        let next = task.steps[task.unit_step()].map.as_ref().map_or(0, |p| p.started);
        format!("{unit} (between iterations: iteration {next} starts at CompleteBy)")
    } else if task.lock.locked_by.is_some() {
        let n = unit_named(task, unit).map_or(0, |u| recorded_attempts(task, u));
        format!("{unit} (attempt {n} running)")
    } else {
        match task.claim.not_before.filter(|nb| *nb > now) {
            Some(nb) => format!("{unit} (its claim, not before {}: in {})", offset(t0, nb), duration(now.until(nb))),
            None => format!("{unit} (its claim)"),
        }
    };
    let Some(cb) = task.complete_by else {
        return format!("waiting for {what}; no CompleteBy");
    };
    let when = if cb >= now {
        format!("{} from now", duration(now.until(cb)))
    } else {
        format!("overdue by {}", duration(cb.until(now)))
    };
    let mut line = format!("waiting for {what} until CompleteBy {} ({when})", offset(t0, cb));
    if let Some(hard) = task.lock.hard_by {
        let _ = write!(line, "; heartbeats cannot move it past {}", offset(t0, hard));
    }
    line
}

/// The task's facts: what `sasctl status` always showed, with times relative to now.
fn header(task: &Task, now: Millis, out: &mut String) {
    let rel = |m: Option<Millis>| {
        m.map_or_else(
            || "-".to_owned(),
            |m| {
                let when = if m > now {
                    format!("in {}", duration(now.until(m)))
                } else {
                    format!("{} ago", duration(m.until(now)))
                };
                format!("{} ({when}; {})", offset(task.created_at, m), utc(m))
            },
        )
    };
    let _ = writeln!(out, "task          {}", task.task_id);
    let _ = writeln!(out, "workflow      {}@{}", task.workflow.name, task.workflow.version);
    let _ = writeln!(out, "ProcessState  {}", task.process_state);
    let _ = writeln!(out, "FailureCount  {}", task.failure_count);
    let _ = writeln!(out, "LockedBy      {}", task.lock.locked_by.as_ref().map_or("-", |l| l.as_str()));
    let _ = writeln!(out, "CompleteBy    {}", rel(task.complete_by));
    let _ = writeln!(out, "created       {}", utc(task.created_at));
    let _ = writeln!(
        out,
        "reason        {}",
        task.reason.as_deref().map_or("-".into(), |r| humane(r, task.created_at, 300))
    );
    if task.run > 1 {
        let _ = writeln!(out, "run           {} (each cancel or resubmit starts one)", task.run);
    }
    if task.undelivered.count > 0 {
        let _ = writeln!(
            out,
            "reply_to      {} statuses undelivered; last: {}",
            task.undelivered.count,
            task.undelivered.error.as_deref().unwrap_or("-")
        );
    }
    if task.late.count > 0 {
        let _ = writeln!(
            out,
            "late results  {} (an effect happened after its attempt expired); last: {}",
            task.late.count,
            task.late.last.as_deref().map_or("-".into(), |r| humane(r, task.created_at, 300))
        );
    }
}

/// The task's timeline: see the module's documentation.
/// What a map step's elements are doing, in words (none for another step).
pub fn map_summary(task: &Task, i: usize) -> Option<String> {
    let p = task.steps.get(i)?.map.as_ref()?;
    if let Some(r) = task.workflow.region_at(i) {
        return Some(region_summary(task, i, &r, p));
    }
    if task.workflow.steps[i].kind.loop_spec().is_some() {
        return Some(loop_summary(task, i, p));
    }
    let mut text = format!(
        "map of {} elements: {} ended ({} succeeded, {} failed), {} running",
        p.n,
        p.ended.count(),
        p.ok.count(),
        p.failed,
        p.running().count()
    );
    if p.started < p.n {
        let _ = write!(text, ", {} not started", p.n - p.started);
    }
    if let Some(cause) = p.stopping {
        let why = if cause == sas_protocol::protocol::EndCause::Cancelled { "cancelled" } else { "failed" };
        let _ = write!(text, "; stopping ({why}): the running ones are cancelled");
    }
    if p.joining {
        text.push_str("; all ended, their outputs are being read");
    }
    let errored = p.errored.count();
    if errored > 0 {
        let _ = write!(text, "; {errored} could not undo themselves (Error)");
    }
    if !p.undone.is_empty() {
        let _ = write!(text, "; {} undone", p.undone.count());
    }
    let _ = write!(text, "; elements are tasks {}~{i}~0 to ~{}", task.task_id, p.n.saturating_sub(1));
    Some(text)
}

/// What a loop's iterations did, in words: counts, the last three one by one (the earlier ones
/// collapsed into their counts), and which tasks they are.
fn loop_summary(task: &Task, i: usize, p: &sas_protocol::protocol::MapProgress) -> String {
    let state = |e: u32| {
        if p.undone.get(e) {
            "undone"
        } else if p.errored.get(e) {
            "in Error"
        } else if p.ok.get(e) {
            "succeeded"
        } else if p.ended.get(e) {
            "failed"
        } else {
            "running"
        }
    };
    let n = p.started;
    let mut text = format!(
        "loop: {n} iteration{} ({} succeeded, {} failed, {} running; at most {})",
        if n == 1 { "" } else { "s" },
        p.ok.count(),
        p.failed,
        p.running().count(),
        p.n
    );
    let shown = n.saturating_sub(3);
    if shown > 0 {
        let _ = write!(text, "; 0 to {} collapsed", shown - 1);
    }
    for e in shown..n {
        let _ = write!(text, "; {e} {}", state(e));
    }
    if let Some(cause) = p.stopping {
        let why = if cause == sas_protocol::protocol::EndCause::Cancelled { "cancelled" } else { "failed" };
        let _ = write!(text, "; stopping ({why})");
    }
    if !p.undone.is_empty() {
        let _ = write!(text, "; {} undone, the newest first", p.undone.count());
    }
    if n > 0 {
        let _ = write!(text, "; iterations are tasks {}~{i}~0 to ~{}", task.task_id, n - 1);
    }
    text
}

/// Why a skipped step was skipped, when its record does not say.
const SKIPPED: &str = "its guard was false";

/// Why step `i`, a branch of a parallel region, was skipped (its guard was false, or every step it
/// waits for was skipped); `None` when it is not a skipped branch. The region's progress says so
/// as soon as the branch is decided; the step's status says `Skipped` only once the region has
/// succeeded. A skipped branch has no task.
pub fn skipped_branch(task: &Task, i: usize) -> Option<&str> {
    let r = task.workflow.regions().into_iter().find(|r| r.contains(&i))?;
    let e = u32::try_from(i - r.start).ok()?;
    let s = task.steps.get(i)?;
    let decided = task.steps.get(r.start).and_then(|h| h.map.as_ref()).is_some_and(|p| p.skipped.get(e));
    (decided || s.status == StepStatus::Skipped).then(|| s.skipped.as_deref().unwrap_or(SKIPPED))
}

/// A parallel region's branches, by name: where each is, and which task runs it (a skipped
/// branch: why, and no task).
fn region_summary(
    task: &Task,
    head: usize,
    r: &std::ops::Range<usize>,
    p: &sas_protocol::protocol::MapProgress,
) -> String {
    let names: Vec<&str> = task.workflow.steps[r.clone()].iter().map(|s| s.name.as_str()).collect();
    let mut text = format!("parallel branches {}:", names.join(", "));
    for (e, name) in (0u32..).zip(&names) {
        let at = if p.undone.get(e) {
            "undone"
        } else if p.errored.get(e) {
            "could not undo itself (Error)"
        } else if p.skipped.get(e) {
            // skipped branches end without a task
            let why = task.steps.get(head + e as usize).and_then(|s| s.skipped.as_deref()).unwrap_or(SKIPPED);
            let _ = write!(text, " {name} skipped ({why}),");
            continue;
        } else if p.ok.get(e) {
            "succeeded"
        } else if p.ended.get(e) {
            "failed"
        } else if p.began(e) {
            "running"
        } else {
            "waiting for the steps it comes after"
        };
        let _ = write!(text, " {name} {at} (task {}~{head}~{e}),", task.task_id);
    }
    text.pop();
    if let Some(cause) = p.stopping {
        let why = if cause == sas_protocol::protocol::EndCause::Cancelled { "cancelled" } else { "failed" };
        let _ = write!(text, "; stopping ({why}): the running ones are cancelled");
    }
    text
}

pub fn render(task: &Task, now: Millis, opts: &Options) -> String {
    let mut out = String::new();
    let t0 = task.created_at;
    let full = opts.detail == Detail::Full;
    if full {
        header(task, now, &mut out);
        out.push('\n');
    } else {
        let _ = writeln!(
            out,
            "{}  {}@{}  {}  FailureCount {}",
            task.task_id, task.workflow.name, task.workflow.version, task.process_state, task.failure_count
        );
    }
    if let Some((parent, step, element)) = task.task_id.parent_of() {
        if task.upstream.is_some() {
            let _ = writeln!(
                out,
                "branch {element} of the parallel region at step index {step} of task {parent} (sasctl status {parent})"
            );
        } else if task.iteration.is_some() {
            let _ = writeln!(
                out,
                "iteration {element} of the loop step at index {step} of task {parent} (sasctl status {parent})"
            );
        } else {
            let _ = writeln!(
                out,
                "element {element} of the map step at index {step} of task {parent} (sasctl status {parent})"
            );
        }
    }
    let spans = spans(task, now);
    let t1 = axis_end(task, now, &spans);
    let width = opts.width.max(1);
    let _ = writeln!(
        out,
        "timeline: times from the task's creation ({}); bars: {} columns = {} (█ attempt, ░ wait, ▒ wait step)",
        utc(t0),
        width,
        duration(t0.until(t1))
    );
    if task.history.is_empty() {
        let _ = writeln!(out, "  no history entries on the task item");
    }
    let names: Vec<(Unit, String)> = units(task, &spans).into_iter().map(|u| (u, unit_name(task, u))).collect();
    let name_w = names.iter().map(|(_, n)| n.chars().count()).max().unwrap_or(0).max(12);
    for (unit, name) in &names {
        let mine: Vec<&Span> = spans.iter().filter(|s| s.unit == *unit).collect();
        let recorded = recorded_attempts(task, *unit);
        if mine.is_empty() && recorded == 0 && matches!(unit, Unit::Compensation(_)) {
            continue;
        }
        let (tone, summary) = unit_summary(task, *unit);
        let _ = writeln!(out, "  {name:<name_w$}  {}", paint(opts.color, tone.ansi(), &summary));
        let shown = u32::try_from(mine.iter().filter(|s| s.kind != Kind::Wait).count()).unwrap_or(u32::MAX);
        if recorded > shown && !mine.is_empty() {
            let missing = recorded - shown;
            let _ = writeln!(
                out,
                "    ({missing} earlier attempt{} not in the kept history)",
                if missing == 1 { "" } else { "s" }
            );
        }
        for s in mine {
            let kind = match s.kind {
                Kind::Attempt(n) => format!("attempt {n}"),
                Kind::Sleep => "sleep".to_owned(),
                Kind::Wait => "wait".to_owned(),
            };
            let took = s.start.until(s.end);
            let took = if s.open { format!("{}…", duration(took)) } else { duration(took) };
            let outcome = format!("{:<19}", s.outcome);
            let _ = writeln!(
                out,
                "    {kind:<10} {:>10} {:>10}  {} {}",
                offset(t0, s.start),
                took,
                paint(opts.color, if s.kind == Kind::Wait { None } else { s.tone.ansi() }, &outcome),
                bar(s, t0, t1, width, opts.color)
            );
            if let Some(why) = &s.why {
                let _ = writeln!(out, "               {why}");
            }
        }
    }
    let _ = writeln!(out, "  now: {}", current(task, now));
    if task.late.count > 0 {
        let _ = writeln!(
            out,
            "  late results: {} (a success after its attempt expired); last: {}",
            task.late.count,
            task.late.last.as_deref().map_or("-".into(), |r| humane(r, t0, 2 * CLIP))
        );
    }
    if full {
        history(task, &mut out);
        outputs(task, &mut out);
    }
    out
}

/// A task's timeline as data, for a page to draw (`sasctl ui`): the same units, spans and
/// outcomes [`render`] prints, on the axis `t0..t1`.
#[derive(Debug, Clone)]
pub struct Drawn {
    pub t0: Millis,
    pub t1: Millis,
    pub rows: Vec<Row>,
    /// What the task waits for now, in words.
    pub now: String,
}

/// A unit of work (a step, or the compensation of one) and its spans.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    /// `good`, `bad`, `warn`, `live` or `plain`.
    pub tone: &'static str,
    pub summary: String,
    /// Attempts the records count that the kept history no longer shows.
    pub unseen: u32,
    pub spans: Vec<Bar>,
}

/// One attempt, wait or sleep of a unit.
#[derive(Debug, Clone)]
pub struct Bar {
    /// `attempt N`, `wait` or `sleep`.
    pub kind: String,
    pub start: Millis,
    pub end: Millis,
    /// Still going: it ends now.
    pub open: bool,
    /// As [`Row::tone`], or `wait`.
    pub tone: &'static str,
    pub outcome: String,
    pub why: Option<String>,
}

fn tone_name(t: Tone) -> &'static str {
    match t {
        Tone::Good => "good",
        Tone::Bad => "bad",
        Tone::Warn => "warn",
        Tone::Live => "live",
        Tone::Plain => "plain",
    }
}

/// [`render`]'s timeline, as data.
pub fn drawn(task: &Task, now: Millis) -> Drawn {
    let spans = spans(task, now);
    let t1 = axis_end(task, now, &spans);
    let mut rows = Vec::new();
    for unit in units(task, &spans) {
        let mine: Vec<&Span> = spans.iter().filter(|s| s.unit == unit).collect();
        let recorded = recorded_attempts(task, unit);
        if mine.is_empty() && recorded == 0 && matches!(unit, Unit::Compensation(_)) {
            continue;
        }
        let (tone, summary) = unit_summary(task, unit);
        let shown = u32::try_from(mine.iter().filter(|s| s.kind != Kind::Wait).count()).unwrap_or(u32::MAX);
        let unseen = if mine.is_empty() { 0 } else { recorded.saturating_sub(shown) };
        let bars = mine
            .into_iter()
            .map(|s| Bar {
                kind: match s.kind {
                    Kind::Attempt(n) => format!("attempt {n}"),
                    Kind::Sleep => "sleep".to_owned(),
                    Kind::Wait => "wait".to_owned(),
                },
                start: s.start,
                end: s.end,
                open: s.open,
                tone: if s.kind == Kind::Wait { "wait" } else { tone_name(s.tone) },
                outcome: s.outcome.clone(),
                why: s.why.clone(),
            })
            .collect();
        rows.push(Row { name: unit_name(task, unit), tone: tone_name(tone), summary, unseen, spans: bars });
    }
    Drawn { t0: task.created_at, t1, rows, now: current(task, now) }
}

/// Every entry the item keeps, and how many it no longer does.
fn history(task: &Task, out: &mut String) {
    let t0 = task.created_at;
    let h = &task.history;
    let _ =
        writeln!(out, "\nhistory: {} entr{} kept on the task item", h.len(), if h.len() == 1 { "y" } else { "ies" });
    if let Some(first) = h.first().filter(|f| f.seq > 1) {
        let gone = first.seq - 1;
        let _ = writeln!(
            out,
            "  {gone} earlier entr{} not kept in the task item nor its archive (the item keeps the most recent ones; the archive keeps the others RetentionDays + 30 days)",
            if gone == 1 { "y" } else { "ies" }
        );
    }
    if h.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:>4} {:>10} {:>10}  {:<13} {:<22} {:>5}  reason",
        "seq", "at", "after", "state", "step", "fails"
    );
    let mut prev: Option<Millis> = None;
    for e in h {
        let after = prev.map_or_else(|| "-".to_owned(), |p| format!("+{}", duration(p.until(e.at))));
        let line = format!(
            "  {:>4} {:>10} {:>10}  {:<13} {:<22} {:>5}  {}",
            e.seq,
            offset(t0, e.at),
            after,
            e.state.as_str(),
            e.step.as_deref().unwrap_or("-"),
            e.failure_count,
            e.reason.as_deref().map(|r| humane(r, t0, 1000)).unwrap_or_default()
        );
        let _ = writeln!(out, "{}", line.trim_end());
        prev = Some(e.at);
    }
}

/// The output of each step that succeeded, compact JSON, clipped.
fn outputs(task: &Task, out: &mut String) {
    let with: Vec<_> = task.steps.iter().filter_map(|s| Some((s, s.output.as_ref()?))).collect();
    let _ = writeln!(out, "\noutputs{}", if with.is_empty() { ": none" } else { "" });
    let w = with.iter().map(|(s, _)| s.name.len()).max().unwrap_or(0);
    for (s, v) in with {
        let json = serde_json::to_string(v).unwrap_or_default();
        let note = if s.status == StepStatus::Succeeded { String::new() } else { format!(" ({:?})", s.status) };
        let size = if json.len() > CLIP { format!(" ({} bytes)", json.len()) } else { String::new() };
        let _ = writeln!(out, "  {:<w$}  {}{size}{note}", s.name, clipped(&json, CLIP));
    }
    if !task.vars.is_empty() {
        let size = sas_protocol::messages::json_len(&task.vars);
        let _ = writeln!(
            out,
            "\nvariables ($.vars, set by the steps' assign: {size} of {} bytes)",
            sas_protocol::protocol::MAX_VARS_BYTES
        );
        let w = task.vars.keys().map(String::len).max().unwrap_or(0);
        for (name, v) in &task.vars {
            let json = serde_json::to_string(v).unwrap_or_default();
            let _ = writeln!(out, "  {name:<w$}  {}", clipped(&json, CLIP));
        }
    }
    if let Some(r) = task.result() {
        let json = serde_json::to_string(&r).unwrap_or_default();
        let _ = writeln!(out, "\nresult (the workflow's, in its last status)\n  {}", clipped(&json, CLIP));
    }
}

#[cfg(test)]
mod tests {
    //! Recorded histories: each task is driven through the protocol (the one place history is
    //! written), at chosen instants, as the functions would drive it.
    use super::*;
    use sas_protocol::ids::{AttemptToken, TaskId};
    use sas_protocol::protocol::{self, apply, Ctx, Event, Policy};
    use sas_protocol::workflow::{OnFailure, WorkflowDef, WorkflowRegistry, BUILT_IN_WORKFLOWS};
    use serde_json::json;

    /// 2026-11-21T22:26:40Z: far enough from 0 that the reasons' epoch milliseconds are made relative.
    const T0: u64 = 1_795_300_000_000;

    fn policy() -> Policy {
        // the demo's settings: a 10 s queue budget, a 2 s result grace
        Policy {
            pause_check_ms: Policy::default().pause_check_ms,
            key_check_ms: Policy::default().key_check_ms,
            start_timeout_ms: 30_000,
            history_limit: 50,
            queue_budget_ms: 10_000,
            result_grace_ms: 2_000,
            settle_ms: 2_000,
            unchecked_start_ms: 2_000,
            max_restarts: 8,
        }
    }

    fn workflow(name: &str) -> WorkflowDef {
        WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve(name, None).unwrap().clone()
    }

    /// A task and the protocol's transitions applied to it, `ms` after T0.
    struct Drive(Task);

    impl Drive {
        fn order() -> Self {
            Self::of(workflow("order"))
        }

        fn of(wf: WorkflowDef) -> Self {
            let tr = protocol::submit(
                TaskId::try_from("order-7").unwrap(),
                wf,
                json!({"sku": "book"}),
                None,
                &ctx(0),
                &policy(),
            );
            Drive(tr.task)
        }

        fn go(mut self, ms: u64, e: &Event) -> Self {
            self.0 =
                apply(&self.0, e, &ctx(ms), &policy()).unwrap_or_else(|s| panic!("{} was stale: {s}", e.name())).task;
            self
        }

        fn attempt(&self) -> AttemptToken {
            self.0.lock.locked_by.clone().expect("an attempt is running")
        }

        fn ok(self, ms: u64, output: serde_json::Value) -> Self {
            let attempt = self.attempt();
            self.go(ms, &Event::AgentSucceeded { attempt, output })
        }

        fn fail(self, ms: u64, error: &str, retryable: bool) -> Self {
            let attempt = self.attempt();
            self.go(ms, &Event::AgentFailed { attempt, error: error.into(), retryable })
        }

        fn claim(self, ms: u64) -> Self {
            let rev = self.0.claim.rev;
            self.go(ms, &Event::Claim { rev })
        }

        fn expire(self, ms: u64) -> Self {
            self.go(ms, &Event::DeadlineExpired)
        }

        fn render(&self, now_ms: u64) -> String {
            render(&self.0, Millis(T0 + now_ms), &Options::full(false))
        }
    }

    fn ctx(ms: u64) -> Ctx {
        Ctx { paused: false, now: Millis(T0 + ms), fresh_token: AttemptToken::fresh(), jitter: 0.5 }
    }

    /// The lines of `text` that contain `needle`.
    fn lines<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.contains(needle)).collect()
    }

    #[test]
    fn times_read_as_seconds_minutes_hours_and_days() {
        assert_eq!(duration(0), "0.000s");
        assert_eq!(duration(1_204), "1.204s");
        assert_eq!(duration(125_300), "2m05.3s");
        assert_eq!(duration(3_723_000), "1h02m03s");
        assert_eq!(duration(2 * 86_400_000 + 3_600_000 + 60_000), "2d01h01m");
        assert_eq!(offset(Millis(1_000), Millis(2_204)), "+1.204s");
        assert_eq!(offset(Millis(1_000), Millis(990)), "-0.010s");
        assert_eq!(utc(Millis(T0)), "2026-11-21T22:26:40Z");
        assert_eq!(utc(Millis(T0 + 1_204)), "2026-11-21T22:26:41.204Z");
    }

    #[test]
    fn a_happy_task_shows_three_steps_one_attempt_each_with_relative_times_and_outputs() {
        let d = Drive::order()
            .ok(412, json!({"reservation": "r-1"}))
            .ok(1_204, json!({"charge_id": "ch_1"}))
            .ok(2_000, json!({"tracking": "Z123"}));
        let text = d.render(60_000);
        for step in ["reserve", "charge", "ship"] {
            let head = lines(&text, &format!("  {step} "));
            assert!(head.iter().any(|l| l.contains("succeeded, 1 attempt")), "{step}:\n{text}");
        }
        // reserve from +0 for 0.412 s, charge from +0.412 s for 0.792 s, ship from +1.204 s for 0.796 s
        let attempts = lines(&text, "attempt 1");
        assert_eq!(attempts.len(), 3, "{text}");
        assert!(attempts[0].contains("+0.000s") && attempts[0].contains("0.412s"), "{text}");
        assert!(attempts[1].contains("+0.412s") && attempts[1].contains("0.792s"), "{text}");
        assert!(attempts[2].contains("+1.204s") && attempts[2].contains("0.796s"), "{text}");
        assert!(attempts.iter().all(|l| l.contains("succeeded") && l.contains('█')), "{text}");
        assert!(!text.contains("attempt 2") && !text.contains("    wait "), "{text}");
        assert!(text.contains("now: ended Processed at +2.000s"), "{text}");
        // the axis ends with the task: the last bar reaches the last column
        assert!(attempts[2].ends_with("█|"), "{text}");
        assert!(text.contains("history: 4 entries kept") && !text.contains("not kept"), "{text}");
        assert!(lines(&text, "Processed").iter().any(|l| l.contains("+2.000s") && l.contains("+0.796s")), "{text}");
        assert!(text.contains(r#"charge   {"charge_id":"ch_1"}"#), "{text}");
        assert!(!text.contains("variables"), "none set: {text}");
        // the variables its steps set, by name, with what they take of their limit
        let mut t = d.0.clone();
        t.vars = serde_json::Map::from_iter([("next_token".to_owned(), json!("p-2")), ("n".to_owned(), json!(3))]);
        let text = render(&t, t.updated_at, &Options::full(false));
        assert!(text.contains("variables ($.vars, set by the steps' assign: 26 of 8192 bytes)"), "{text}");
        assert!(text.contains("  n           3\n") && text.contains(r#"  next_token  "p-2""#), "{text}");
    }

    #[test]
    fn a_timed_out_attempt_its_backoff_and_the_retry_that_succeeded() {
        // charge's first attempt hangs: CompleteBy = +0.3 s + 10 s queue budget + 5 s timeout,
        // found at +17.3 s (2 s grace); a backoff of 1.5 s (base 1 s, jitter 0.5); attempt 2 works.
        let d =
            Drive::order().ok(300, json!({})).expire(17_300).claim(18_800).ok(19_100, json!({})).ok(19_500, json!({}));
        let text = d.render(60_000);
        let charge: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("  charge ")).take(6).collect();
        assert!(charge[0].contains("succeeded, 2 attempts, 1 failure"), "{text}");
        assert!(
            charge[1].contains("attempt 1") && charge[1].contains("+0.300s") && charge[1].contains("17.000s"),
            "{text}"
        );
        assert!(charge[1].contains("timed out, retried"), "{text}");
        // why, with CompleteBy made relative to the creation
        assert!(charge[2].contains("passed CompleteBy +15.300s"), "{text}");
        assert!(charge[3].contains("wait") && charge[3].contains("+17.300s") && charge[3].contains("1.500s"), "{text}");
        assert!(charge[3].contains("backoff") && charge[3].contains('░'), "{text}");
        assert!(
            charge[4].contains("attempt 2") && charge[4].contains("+18.800s") && charge[4].contains("succeeded"),
            "{text}"
        );
        assert_eq!(lines(&text, "attempt 2").len(), 1, "{text}");
    }

    #[test]
    fn a_declined_card_is_compensated_and_the_compensation_shows_its_retry() {
        // charge refused; release (reserve's compensation) fails once with a 503, then works
        let d = Drive::order()
            .ok(400, json!({"reservation": "r-1"}))
            .fail(900, "card declined", false)
            .fail(1_200, "503 from inventory", true)
            .claim(2_700)
            .ok(3_000, json!({}));
        assert_eq!(d.0.process_state, ProcessState::Compensated);
        let text = d.render(60_000);
        assert!(
            lines(&text, "  reserve ").iter().any(|l| l.contains("succeeded, 1 attempt; undone by release")),
            "{text}"
        );
        assert!(lines(&text, "  charge ").iter().any(|l| l.contains("failed (refused), 1 attempt")), "{text}");
        let charge = lines(&text, "attempt 1").into_iter().find(|l| l.contains("+0.400s")).unwrap();
        assert!(charge.contains("refused"), "{text}");
        let release: Vec<&str> = text.lines().skip_while(|l| !l.contains("release (undoes reserve)")).take(6).collect();
        assert!(release[0].contains("done, 2 attempts, 1 failure"), "{text}");
        assert!(
            release[1].contains("attempt 1")
                && release[1].contains("+0.900s")
                && release[1].contains("failed, retried"),
            "{text}"
        );
        assert!(release[2].contains("503 from inventory"), "{text}");
        assert!(
            release[3].contains("wait") && release[3].contains("+1.200s") && release[3].contains("backoff"),
            "{text}"
        );
        assert!(
            release[4].contains("attempt 2") && release[4].contains("+2.700s") && release[4].contains("done"),
            "{text}"
        );
        assert!(text.contains("now: ended Compensated at +3.000s"), "{text}");
        // only the step that succeeded has an output
        assert!(text.contains(r#"reserve  {"reservation":"r-1"}"#) && !text.contains("charge   {"), "{text}");
    }

    #[test]
    fn a_step_that_never_answers_is_retried_then_compensated_as_the_book_shows() {
        // ship hangs three times (each found 2 s after its CompleteBy), refund fails once
        let d = Drive::order()
            .ok(400, json!({"reservation": "r-1"}))
            .ok(800, json!({"charge_id": "ch_1"}))
            .expire(17_800)
            .claim(19_300)
            .expire(36_300)
            .claim(38_300)
            .expire(55_300)
            .fail(55_900, "503 from payment", true)
            .claim(57_400)
            .ok(57_600, json!({}))
            .ok(57_900, json!({}));
        let text = d.render(90_000);
        // the attempt's row (the task's reason, the cause of its undoing, names it too)
        let attempt3 = lines(&text, "attempt 3").into_iter().find(|l| l.trim_start().starts_with("attempt 3"));
        assert!(attempt3.is_some_and(|l| l.contains("timed out") && !l.contains("retried")), "{text}");
        assert!(
            text.contains("reason        step ship attempt 3 passed CompleteBy +53.300s; all 3 attempts used"),
            "{text}"
        );
        // the book's excerpt (docs/how-to/operating.md, `sasctl status`) is this rendering, line for line
        let page = include_str!("../../../docs/how-to/operating.md");
        let start = page.find("answered (the times are the renderer's test").expect("the book's timeline");
        let block = page[start..].split("```").nth(1).expect("its code block");
        let shown: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty() && l.trim() != "...").collect();
        assert!(shown.len() > 10, "{block}");
        for line in shown {
            assert!(text.lines().any(|l| l == line), "book line not rendered: {line:?}\n{text}");
        }
    }

    #[test]
    fn a_cancelled_running_step_waits_to_settle_before_its_compensation() {
        // cancelled while charge runs: refund waits until charge's attempt cannot apply any more
        // (its CompleteBy +15.4 s, plus the 2 s settling margin), then refund and release run.
        let d = Drive::order()
            .ok(400, json!({}))
            .go(1_000, &Event::Cancel { reason: "customer changed their mind".into(), run: None })
            .claim(17_400)
            .ok(17_600, json!({}))
            .ok(17_900, json!({}));
        assert_eq!(d.0.process_state, ProcessState::Cancelled);
        let text = d.render(60_000);
        let charge = lines(&text, "attempt 1").into_iter().find(|l| l.contains("+0.400s")).unwrap();
        assert!(charge.contains("cancelled"), "{text}");
        let refund: Vec<&str> = text.lines().skip_while(|l| !l.contains("refund (undoes charge)")).take(3).collect();
        assert!(
            refund[1].contains("wait") && refund[1].contains("+1.000s") && refund[1].contains("settling"),
            "{text}"
        );
        assert!(refund[1].contains("16.400s"), "{text}");
        assert!(
            refund[2].contains("attempt 1") && refund[2].contains("+17.400s") && refund[2].contains("done"),
            "{text}"
        );
        assert!(text.contains("now: ended Cancelled at +17.900s"), "{text}");
    }

    #[test]
    fn a_running_task_says_what_it_waits_for_and_whether_it_is_overdue() {
        let d = Drive::order().ok(400, json!({}));
        // charge's CompleteBy: +0.4 s + 10 s + 5 s = +15.4 s
        let early = d.render(5_400);
        assert!(
            early.contains("now: waiting for charge (attempt 1 running) until CompleteBy +15.400s (10.000s from now)"),
            "{early}"
        );
        let running = lines(&early, "attempt 1").into_iter().find(|l| l.contains("+0.400s")).unwrap().to_owned();
        assert!(running.contains("running") && running.contains("5.000s…"), "{early}");
        let late = d.render(20_400);
        assert!(late.contains("until CompleteBy +15.400s (overdue by 5.000s)"), "{late}");
        assert!(late.contains("CompleteBy    +15.400s (5.000s ago;"), "{late}");
    }

    #[test]
    fn a_pending_task_waits_for_its_claim() {
        let d = Drive::order().fail(700, "503 from inventory", true);
        assert_eq!(d.0.process_state, ProcessState::Pending);
        let text = d.render(1_000);
        assert!(
            lines(&text, "  reserve ").iter().any(|l| l.contains("waiting for attempt 2, 1 attempt, 1 failure")),
            "{text}"
        );
        assert!(
            text.contains("now: waiting for reserve (its claim, not before")
                || text.contains("now: waiting for reserve (its claim)"),
            "{text}"
        );
        let wait = lines(&text, "wait ").into_iter().find(|l| l.contains("+0.700s")).unwrap();
        assert!(wait.contains("backoff") && wait.contains("0.300s…"), "{text}");
        assert!(lines(&text, "  charge ").iter().any(|l| l.contains("not started")), "{text}");
    }

    #[test]
    fn a_long_history_says_how_many_entries_the_item_no_longer_keeps() {
        // one step retried 30 times: 1 + 2 x 30 + 1 = 62 entries, of which the item keeps 50
        let mut wf = workflow("order");
        wf.steps.truncate(1);
        wf.steps[0].max_attempts = 40;
        wf.on_failure = OnFailure::Error;
        let mut d = Drive::of(wf);
        let mut at = 0;
        for _ in 0..30 {
            at += 100;
            d = d.fail(at, "503", true);
            at += 100;
            d = d.claim(at);
        }
        let d = d.ok(at + 50, json!({}));
        assert_eq!(d.0.history.len(), 50);
        assert_eq!(d.0.history[0].seq, 13);
        let text = d.render(60_000);
        assert!(text.contains("history: 50 entries kept"), "{text}");
        assert!(text.contains("12 earlier entries not kept in the task item nor its archive"), "{text}");
        // 50 entries: the last is Processed, so 25 attempts and 24 waits show; attempts 1-6 are gone
        assert!(text.contains("(6 earlier attempts not in the kept history)"), "{text}");
        assert!(!text.contains("attempt 6 ") && text.contains("attempt 7 ") && text.contains("attempt 31 "), "{text}");
        assert!(lines(&text, "attempt 31").iter().any(|l| l.contains("succeeded")), "{text}");
        assert!(text.contains("succeeded, 31 attempts, 30 failures"), "{text}");
        // every kept entry is printed, none capped
        let rows = text.lines().skip_while(|l| !l.contains("seq")).skip(1).take_while(|l| !l.is_empty());
        let seqs: Vec<u64> = rows.map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect();
        assert_eq!(seqs, (13..=62).collect::<Vec<u64>>(), "{text}");
    }

    #[test]
    fn an_error_task_and_odd_tasks_render_without_panicking() {
        let mut wf = workflow("order");
        wf.on_failure = OnFailure::Error;
        let d = Drive::of(wf).fail(500, "out of stock", false);
        assert_eq!(d.0.process_state, ProcessState::Error);
        let text = d.render(1_000);
        assert!(lines(&text, "attempt 1").iter().any(|l| l.contains("refused")), "{text}");
        assert!(text.contains("out of stock") && text.contains("now: ended Error at +0.500s"), "{text}");

        // an operator resubmits it: the wait before its claim, then attempt 2
        let run = d.0.run;
        let d = d.go(9_000, &Event::Resubmit { reason: "restocked".into(), run: Some(run) }).claim(9_100);
        let text = d.render(9_600);
        let wait = lines(&text, "    wait ").into_iter().find(|l| l.contains("+9.000s")).unwrap();
        assert!(wait.contains("resumed") && wait.contains("0.100s"), "{text}");
        let parked = lines(&text, "    wait ").into_iter().find(|l| l.contains("+0.500s")).unwrap();
        assert!(parked.contains("in Error") && parked.contains("8.500s"), "{text}");
        assert!(lines(&text, "attempt 2").iter().any(|l| l.contains("+9.100s") && l.contains("running")), "{text}");
        assert!(lines(&text, "attempt 1").iter().any(|l| l.contains("refused") && l.contains("0.500s")), "{text}");

        let mut empty = Drive::order().0;
        empty.history.clear();
        let text = render(&empty, Millis(T0 + 1_000), &Options::full(false));
        assert!(text.contains("no history entries") && text.contains("history: 0 entries"), "{text}");

        let mut rejected = empty.clone();
        rejected.process_state = ProcessState::Rejected;
        rejected.complete_by = None;
        rejected.lock.locked_by = None;
        let text = render(&rejected, Millis(T0), &Options::compact(false));
        assert!(text.contains("Rejected") && text.contains("now: ended Rejected"), "{text}");
    }

    #[test]
    fn a_wait_step_sleeps_and_a_callback_step_runs_until_its_answer() {
        // order-async: after the charge, cool-off sleeps 2 s; ship hands over a callback token
        // (CompleteBy: +2.6 s + its 5 s schedule-to-start + 3 s heartbeat window; hard: + 30 s)
        let d = Drive::of(workflow("order-async")).ok(300, json!({})).ok(600, json!({})).expire(2_600);
        let text = d.render(4_600);
        let sleep = lines(&text, "    sleep ");
        assert_eq!(sleep.len(), 1, "{text}");
        assert!(sleep[0].contains("+0.600s") && sleep[0].contains("2.000s") && sleep[0].contains("woke up"), "{text}");
        assert!(sleep[0].contains('▒'), "{text}");
        assert!(text.contains("now: waiting for ship (attempt 1 running) until CompleteBy +10.600s (6.000s from now); heartbeats cannot move it past +37.600s"), "{text}");
        let attempt = d.attempt();
        let answer = sas_protocol::messages::CallbackAnswer::Succeeded { output: json!({"tracking": "Z1"}) };
        let d = d.go(7_000, &Event::Callback { attempt, unit: "ship".into(), answer });
        let text = d.render(60_000);
        let ship = lines(&text, "attempt 1").into_iter().find(|l| l.contains("+2.600s")).unwrap();
        assert!(ship.contains("4.400s") && ship.contains("succeeded"), "{text}");
        assert!(text.contains(r#"{"tracking":"Z1"}"#), "{text}");
        assert!(!text.contains("late results"), "{text}");
        // a second answer of an attempt that expired long ago: the task records it; the axis
        // still ends with the task, and the timeline says when the late success came
        let late =
            Drive::of(workflow("order-async")).ok(300, json!({})).ok(600, json!({})).expire(2_600).expire(12_600);
        let first = late.0.steps[3].issued[0].clone();
        let ok = sas_protocol::messages::CallbackAnswer::Succeeded { output: json!({}) };
        let late = late
            .claim(14_600)
            .expire(26_600)
            .ok(27_000, json!({}))
            .ok(27_300, json!({}))
            .go(70_000, &Event::Callback { attempt: first, unit: "ship".into(), answer: ok });
        assert_eq!((late.0.process_state, late.0.late.count), (ProcessState::Compensated, 1));
        let text = late.render(80_000);
        assert!(
            text.contains(
                "late results: 1 (a success after its attempt expired); last: ship: a success came at +1m10.0s"
            ),
            "{text}"
        );
        assert!(text.contains("bars: 40 columns = 27.300s"), "{text}");
    }

    /// What ended an attempt, as the timeline words it.
    fn ended_by(e: &Event) -> &'static str {
        match e {
            Event::AgentSucceeded { .. } => "ok",
            Event::AgentFailed { retryable: true, .. } => "failed",
            Event::AgentFailed { retryable: false, .. } => "refused",
            Event::DeadlineExpired => "timed out",
            Event::Cancel { .. } => "cancelled",
            Event::AgentNotStarted { .. } => "not started",
            _ => "?",
        }
    }

    /// A `Compensating` entry may begin a wait or an attempt; the entry says which
    /// (`HistoryEntry::waiting`, [`is_wait`]). Checked against the truth (whether the transition
    /// that wrote the entry left the task locked) on random runs of the order workflow
    /// ([`property_runs`]): successes, retryable and permanent failures, expiries, restarts,
    /// cancels and resubmits. So are the attempts' numbers and outcomes (a compensation that used
    /// up its attempts by timing out shows only past about 5,000 runs).
    #[test]
    fn waits_attempts_and_outcomes_match_what_the_protocol_did_on_random_runs() {
        let mut seed: u64 = 0x5eed;
        let mut rnd = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let runs = property_runs();
        let (mut compensating, mut outcomes) = (0, 0);
        for _ in 0..runs {
            let mut t = Drive::order().0;
            let mut now = 0;
            let mut truth: HashMap<u64, bool> = HashMap::new();
            // the attempt holding the task (its token, its entry's time), and how attempts ended
            let mut running = t.lock.locked_by.clone().map(|a| (a, Millis(T0)));
            let mut ended: HashMap<Millis, &str> = HashMap::new();
            // the submission claims the first attempt
            let mut numbers: HashMap<Millis, u32> = HashMap::from([(Millis(T0), 1)]);
            for _ in 0..40 {
                if t.process_state.is_terminal() && t.process_state != ProcessState::Error {
                    break;
                }
                now += 100 + rnd(3_000);
                let run = Some(t.run);
                let e = match (t.process_state, &t.lock.locked_by, rnd(6)) {
                    (ProcessState::Error, _, k) if k < 3 => Event::Resubmit { reason: "again".into(), run },
                    (ProcessState::Error, _, _) => Event::Cancel { reason: "stop".into(), run },
                    (_, _, 0) => Event::Cancel { reason: "stop".into(), run: None },
                    (_, Some(a), 1) => Event::AgentSucceeded { attempt: a.clone(), output: json!({}) },
                    (_, Some(a), 2) => Event::AgentFailed { attempt: a.clone(), error: "503".into(), retryable: true },
                    (_, Some(a), 3) => Event::AgentFailed { attempt: a.clone(), error: "no".into(), retryable: false },
                    (_, Some(a), 4) if rnd(4) == 0 => Event::AgentNotStarted {
                        attempt: a.clone(),
                        error: "not started: it waited past its start_by".into(),
                    },
                    (_, Some(a), _) if rnd(2) == 0 => Event::AgentSucceeded { attempt: a.clone(), output: json!({}) },
                    (_, None, k) if k < 4 => {
                        now = now.max(t.claim.not_before.map_or(0, |nb| nb.0 - T0));
                        Event::Claim { rev: t.claim.rev }
                    }
                    _ => {
                        now = now.max(t.complete_by.map_or(0, |cb| cb.0 - T0 + 2_000));
                        Event::DeadlineExpired
                    }
                };
                let Ok(tr) = apply(&t, &e, &ctx(now), &policy()) else { continue };
                t = tr.task;
                if let Some((token, start)) = running.take() {
                    if t.lock.locked_by.as_ref() == Some(&token) {
                        running = Some((token, start));
                    } else {
                        ended.insert(start, ended_by(&e));
                    }
                }
                if let (Some(token), None) = (&t.lock.locked_by, &running) {
                    running = Some((token.clone(), t.history.last().unwrap().at));
                }
                if let Some(last) = t.history.last() {
                    truth.entry(last.seq).or_insert(t.lock.locked_by.is_none());
                    if t.lock.locked_by.is_some() {
                        let unit = unit_named(&t, t.current_step_name().unwrap()).unwrap();
                        numbers.entry(last.at).or_insert(recorded_attempts(&t, unit));
                    }
                }
            }
            // and each attempt has the number the records gave it
            for span in spans(&t, Millis(T0 + now)) {
                if let Kind::Attempt(n) = span.kind {
                    assert_eq!(Some(&n), numbers.get(&span.start), "{span:?} of {:#?}", t.history);
                    let o = span.outcome.as_str();
                    let right = match ended.get(&span.start).copied() {
                        None => o == "running" || o == "ended",
                        Some("ok") => o == "succeeded" || o == "done",
                        Some(word) => o.starts_with(word),
                    };
                    assert!(right, "ended by {:?}: {span:?} of {:#?}", ended.get(&span.start), t.history);
                    outcomes += 1;
                }
            }
            for (i, e) in t.history.iter().enumerate() {
                if e.state == ProcessState::Compensating {
                    compensating += 1;
                    let want = truth[&e.seq];
                    assert_eq!(is_wait(&t, i), want, "entry {i} (seq {}) of {:#?}", e.seq, t.history);
                }
            }
        }
        assert!(compensating > runs, "the runs compensate often enough to tell: {compensating} in {runs} runs");
        assert!(outcomes > 3 * runs, "{outcomes} attempts in {runs} runs");
    }

    /// How many random runs the property test makes: `SAS_TIMELINE_RUNS`, 8,000 by default (a
    /// compensation that used up its attempts by timing out shows only past about 5,000), at
    /// least 1,000 and at most 1,000,000. CPU work: 20,000 runs took 20 s alone on a 2-core
    /// machine (a debug build), and over 240 s on a slower one beside the simulation's tests.
    fn property_runs() -> usize {
        std::env::var("SAS_TIMELINE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(8_000).clamp(1_000, 1_000_000)
    }

    #[test]
    fn colour_only_when_asked() {
        let d = Drive::order().ok(400, json!({}));
        assert!(!d.render(1_000).contains('\x1b'));
        let coloured = render(&d.0, Millis(T0 + 1_000), &Options::full(true));
        assert!(coloured.contains("\x1b[32m"), "succeeded in green: {coloured}");
    }

    #[test]
    fn a_parallel_region_says_where_each_branch_is() {
        let mut wf = workflow("order");
        // reserve, then charge beside a fraud check, then ship
        let mut fraud = wf.steps[1].clone();
        fraud.name = "fraud".into();
        fraud.compensation = None;
        fraud.after = Some(vec!["reserve".into()]);
        wf.steps.insert(2, fraud);
        wf.steps[3].after = Some(vec!["charge".into(), "fraud".into()]);
        let tr = protocol::submit(TaskId::try_from("order-7").unwrap(), wf, json!({}), None, &ctx(0), &policy());
        let d = Drive(tr.task).ok(400, json!({}));
        let d = d.go(
            1_000,
            &Event::ElementEnded {
                step: 1,
                element: 1,
                state: ProcessState::Processed,
                reason: None,
                output: Some(json!({"verdict": "clear"})),
                vars: None,
            },
        );
        let text = render(&d.0, Millis(T0 + 2_000), &Options::full(false));
        assert!(
            text.contains(
                "parallel branches charge, fraud: charge running (task order-7~1~0), fraud succeeded (task order-7~1~1)"
            ),
            "{text}"
        );
        assert!(text.contains("(its parallel branches: 1 running, 1 ended of 2;"), "{text}");
        let branch = protocol::element_task(&d.0, 1, 0, json!(null), &ctx(1_000), &policy()).task;
        let text = render(&branch, Millis(T0 + 2_000), &Options::full(false));
        assert!(text.contains("branch 0 of the parallel region at step index 1 of task order-7"), "{text}");
    }

    /// One of three branches, picked by guards: the two skipped ones read as skipped, with why,
    /// and name no task (they have none), while the region runs and after it.
    #[test]
    fn a_one_of_three_region_says_its_skipped_branches_were_skipped_and_names_no_task_for_them() {
        let when = |size: &str| json!({"variable": "$.input.size", "string_equals": size});
        let wf: WorkflowDef = serde_json::from_value(json!({
            "name": "pick", "version": 1,
            "steps": [
                {"name": "route", "agent": "sim", "timeout_ms": 5_000},
                {"name": "big", "agent": "sim", "timeout_ms": 5_000, "after": ["route"], "when": when("big")},
                {"name": "mid", "agent": "sim", "timeout_ms": 5_000, "after": ["route"], "when": when("mid")},
                {"name": "small", "agent": "sim", "timeout_ms": 5_000, "after": ["route"], "when": when("small")},
                {"name": "pack", "agent": "sim", "timeout_ms": 5_000, "after": ["big", "mid", "small"]}
            ]
        }))
        .unwrap();
        let tr =
            protocol::submit(TaskId::try_from("pick-3").unwrap(), wf, json!({"size": "big"}), None, &ctx(0), &policy());
        let d = Drive(tr.task).ok(400, json!({}));
        let running = d.render(1_000);
        let ended = d
            .go(
                1_000,
                &Event::ElementEnded {
                    step: 1,
                    element: 0,
                    state: ProcessState::Processed,
                    reason: None,
                    output: None,
                    vars: None,
                },
            )
            .render(2_000);
        for (when, text, big) in [("while it runs", &running, "running"), ("once it ended", &ended, "succeeded")] {
            let skipped = "skipped (when was false: $.input.size string_equals";
            assert!(
                text.contains(&format!(
                    "parallel branches big, mid, small: big {big} (task pick-3~1~0), mid {skipped}"
                )),
                "{when}: {text}"
            );
            assert!(text.contains(&format!("small {skipped}")), "{when}: {text}");
            assert!(
                !text.contains("pick-3~1~1") && !text.contains("pick-3~1~2"),
                "{when}: a skipped branch has no task: {text}"
            );
            assert!(!text.contains("failed"), "{when}: nothing failed: {text}");
            for (e, size) in [(1, "mid"), (2, "small")] {
                let row = format!(
                    "skipped, when was false: $.input.size string_equals \"{size}\" (branch {e} of the region at big)"
                );
                assert!(text.contains(&row), "{when}: {text}");
            }
        }
    }

    #[test]
    fn a_loop_step_says_how_many_iterations_ran_and_collapses_all_but_the_last_three() {
        let mut wf = workflow("order");
        wf.steps[0] = serde_json::from_value(json!({
            "name": "poll", "kind": "loop", "max_iterations": 50,
            "body": [{"name": "status", "agent": "sim", "timeout_ms": 1000}],
            "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 40}
        }))
        .unwrap();
        let tr = protocol::submit(TaskId::try_from("order-9").unwrap(), wf, json!({}), None, &ctx(0), &policy());
        let mut d = Drive(tr.task);
        for e in 0..5 {
            let end = Event::ElementEnded {
                step: 0,
                element: e,
                state: ProcessState::Processed,
                reason: None,
                output: Some(json!({"status": {}})),
                vars: None,
            };
            d = d.go(1_000 + u64::from(e), &end);
        }
        let text = render(&d.0, Millis(T0 + 2_000), &Options::full(false));
        assert!(
            text.contains(
                "loop: 6 iterations (5 succeeded, 0 failed, 1 running; at most 50); 0 to 2 collapsed; 3 succeeded; \
                 4 succeeded; 5 running; iterations are tasks order-9~0~0 to ~5"
            ),
            "{text}"
        );
        assert!(text.contains("poll (its iteration 5 running, 5 ended, at most 50;"), "{text}");
        let iteration = protocol::element_task(&d.0, 0, 5, json!(null), &ctx(1_000), &policy()).task;
        let text = render(&iteration, Millis(T0 + 2_000), &Options::full(false));
        assert!(text.contains("iteration 5 of the loop step at index 0 of task order-9"), "{text}");
    }

    #[test]
    fn a_map_step_says_where_its_elements_are() {
        let mut wf = workflow("order");
        wf.steps[0].map = Some(sas_protocol::workflow::MapSpec {
            items: "/input/lines".into(),
            max_concurrency: 2,
            tolerated_failures: sas_protocol::workflow::Tolerance::None,
            timeout_ms: None,
        });
        let tr = protocol::submit(
            TaskId::try_from("order-9").unwrap(),
            wf,
            json!({"lines": [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]}),
            None,
            &ctx(0),
            &policy(),
        );
        let d = Drive(tr.task).go(
            1_000,
            &Event::ElementEnded {
                step: 0,
                element: 1,
                state: ProcessState::Processed,
                reason: None,
                output: None,
                vars: None,
            },
        );
        let text = render(&d.0, Millis(T0 + 2_000), &Options::full(false));
        assert!(
            text.contains(
                "map of 3 elements: 1 ended (1 succeeded, 0 failed), 2 running; elements are tasks order-9~0~0 to ~2"
            ),
            "{text}"
        );
        assert!(text.contains("reserve (its map elements: 2 running, 1 ended of 3;"), "{text}");
        let element = protocol::element_task(&d.0, 0, 2, json!({"sku": "c"}), &ctx(1_000), &policy()).task;
        let text = render(&element, Millis(T0 + 2_000), &Options::full(false));
        assert!(
            text.contains("element 2 of the map step at index 0 of task order-9 (sasctl status order-9)"),
            "{text}"
        );
    }
}
