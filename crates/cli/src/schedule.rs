//! `sasctl schedule`: a workflow started on a cron expression or a rate. Every schedule of the
//! stack is one entry of one item of the task table (`schedule:all`); the Supervisor's sweep (every
//! minute on AWS) sends each instant that is due to the submission queue, as a submission whose task
//! id is the schedule's name and the instant ([`sas_protocol::schedules`], [`sas_core::schedules`]).
//! Here: create, list, pause, resume, delete (each a conditional write of the item), trigger (an
//! instant now) and backfill (the instants of a past range), each saying what it did.

use std::fmt::Write as _;

use serde_json::Value;

use sas_core::deps::Deps;
use sas_core::store::StoreError;
use sas_protocol::ids::Millis;
use sas_protocol::schedules::{self, Every, Overlap, Schedule, Schedules, MAX_BACKFILL, MAX_SCHEDULES};

/// What `create` is given.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub workflow: String,
    pub version: Option<u32>,
    pub input: Value,
    pub every: Every,
    pub time_zone: Option<String>,
    pub overlap: Overlap,
    pub jitter_ms: u64,
}

/// Why a command changed nothing (the operator's mistake, or the state it found).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Every schedule now.
pub async fn list(deps: &Deps) -> Result<Schedules, StoreError> {
    Ok(deps.schedules.load_schedules().await?.unwrap_or_default())
}

/// Create schedule `spec.name`; its first instant. Refused: a name taken, a workflow not
/// deployed (or a version it does not have), a workflow with a concurrency key of its own and an
/// overlap other than `allow_all` (its tasks already wait by that key), a bad expression.
pub async fn create(deps: &Deps, spec: &Spec) -> Result<Result<Millis, Refused>, StoreError> {
    if let Err(why) = schedules::check_name(&spec.name) {
        return Ok(Err(Refused(why)));
    }
    let Some(def) = deps.workflows.resolve(&spec.workflow, spec.version).cloned() else {
        let version = spec.version.map(|v| format!(" version {v}")).unwrap_or_default();
        return Ok(Err(Refused(format!(
            "workflow {}{version} is not deployed (the stack's workflows file does not have it)",
            spec.workflow
        ))));
    };
    if def.concurrency.is_some() && spec.overlap != Overlap::AllowAll {
        return Ok(Err(Refused(format!(
            "workflow {} has a concurrency key of its own (its tasks wait by it): give the schedule --overlap allow_all",
            spec.workflow
        ))));
    }
    let out = sas_core::schedules::edit(deps, |all, now| {
        if all.schedules.contains_key(&spec.name) {
            return Err(format!("schedule {} exists: delete it first, or give another name", spec.name));
        }
        if all.schedules.len() >= MAX_SCHEDULES {
            return Err(format!("a stack keeps at most {MAX_SCHEDULES} schedules"));
        }
        let s = Schedule::new(
            &spec.workflow,
            spec.version,
            spec.input.clone(),
            spec.every.clone(),
            spec.time_zone.clone(),
            spec.overlap,
            spec.jitter_ms,
            now,
        )?;
        let first = s.next;
        all.schedules.insert(spec.name.clone(), s);
        Ok(first)
    })
    .await?;
    Ok(out.map_err(Refused))
}

/// Pause (`Some(reason)`) or resume (`None`) schedule `name`. A resumed schedule goes on from
/// the first instant after now: the instants that passed while it was paused are not sent
/// (`backfill` sends them).
pub async fn set_paused(deps: &Deps, name: &str, reason: Option<&str>) -> Result<Result<Millis, Refused>, StoreError> {
    let out = sas_core::schedules::edit(deps, |all, now| {
        let s = all.schedules.get_mut(name).ok_or_else(|| format!("no schedule is named {name}"))?;
        match (reason, &s.paused) {
            (Some(_), Some(why)) => return Err(format!("schedule {name} is paused already ({why}): nothing changed")),
            (None, None) => return Err(format!("schedule {name} is not paused: nothing changed")),
            (Some(why), None) => s.paused = Some(why.to_owned()),
            (None, Some(_)) => {
                s.paused = None;
                s.next = s.next_after(now)?.ok_or("its expression has no instant after now")?;
            }
        }
        Ok(s.next)
    })
    .await?;
    Ok(out.map_err(Refused))
}

/// Delete schedule `name` (its tasks in flight run on); the schedule as it was.
pub async fn delete(deps: &Deps, name: &str) -> Result<Result<Schedule, Refused>, StoreError> {
    let out = sas_core::schedules::edit(deps, |all, _| {
        all.schedules.remove(name).ok_or_else(|| format!("no schedule is named {name}"))
    })
    .await?;
    Ok(out.map_err(Refused))
}

/// Send one instant of schedule `name` now (`at`: its time, now by default): a task of the
/// workflow with the schedule's input, under its overlap policy; the task id.
pub async fn trigger(deps: &Deps, name: &str, at: Option<Millis>) -> Result<Result<String, Refused>, anyhow::Error> {
    let all = list(deps).await?;
    let Some(s) = all.schedules.get(name) else { return Ok(Err(Refused(format!("no schedule is named {name}")))) };
    let at = at.unwrap_or_else(|| Millis(deps.now().0 / 1000 * 1000));
    sas_core::schedules::send(deps, name, s, &[at], false).await?;
    Ok(Ok(schedules::task_id(name, at)))
}

/// Send every instant of schedule `name` in `[from, to)`: their tasks run one after another
/// (`buffer_all`, in the order they reach the Submitter: the submission queue keeps none), and an
/// instant whose task exists (it ran) is not run again. The instants sent.
pub async fn backfill(
    deps: &Deps,
    name: &str,
    from: Millis,
    to: Millis,
) -> Result<Result<Vec<Millis>, Refused>, anyhow::Error> {
    if from >= to {
        return Ok(Err(Refused("--from must be before --to".into())));
    }
    let all = list(deps).await?;
    let Some(s) = all.schedules.get(name) else { return Ok(Err(Refused(format!("no schedule is named {name}")))) };
    let instants = match s.instants(from, to, MAX_BACKFILL) {
        Ok(i) => i,
        Err(why) => return Ok(Err(Refused(why))),
    };
    sas_core::schedules::send(deps, name, s, &instants, true).await?;
    Ok(Ok(instants))
}

/// `every` as people write it: a cron expression, or a period.
pub fn describe_every(s: &Schedule) -> String {
    match &s.every {
        Every::Cron(c) => format!("cron {c:?} {}", s.time_zone.as_deref().unwrap_or("UTC")),
        Every::RateMs(ms) => format!("every {}", humantime::format_duration(std::time::Duration::from_millis(*ms))),
    }
}

/// One line per schedule: name, workflow, when, overlap, state, next instant, counts.
pub fn render(all: &Schedules) -> String {
    if all.schedules.is_empty() {
        return "no schedule\n".to_owned();
    }
    let mut out = String::new();
    for (name, s) in &all.schedules {
        let version = s.version.map(|v| format!("@{v}")).unwrap_or_default();
        let state = match &s.paused {
            Some(why) => format!("paused ({why})"),
            None => format!("next {}", schedules::rfc3339(s.next)),
        };
        let last = s.last.map(|l| format!(", last {}", schedules::rfc3339(l))).unwrap_or_default();
        let missed = if s.missed > 0 { format!(", {} missed", s.missed) } else { String::new() };
        let jitter = if s.jitter_ms > 0 {
            format!(", jitter {}", humantime::format_duration(std::time::Duration::from_millis(s.jitter_ms)))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{name}: {}{version} {}, overlap {}{jitter}; {state}; {} sent{last}{missed}",
            s.workflow,
            describe_every(s),
            s.overlap.as_str(),
            s.fired,
        );
    }
    out
}

/// A period as people write it (`30s`, `1m`, `1h30m`), in ms.
pub fn parse_period(text: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e} (write 30s, 5m, 1h)"))?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{text:?} is too long"))
}

/// An RFC 3339 time (`2026-11-29T17:00:00Z`, or with an offset), in epoch ms.
pub fn parse_time(text: &str) -> Result<Millis, String> {
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("{text:?}: {e} (write 2026-11-29T17:00:00Z)"))?;
    u64::try_from(t.timestamp_millis()).map(Millis).map_err(|_| format!("{text:?} is before 1970"))
}
