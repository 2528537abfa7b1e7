//! What the system measures, in one catalogue, and the places that emit it.
//!
//! Metrics go through the `metrics` facade. The functions install
//! `metrics_cloudwatch_embedded` as its recorder ([`crate::telemetry::init_metrics`]) and flush
//! once per invocation: one CloudWatch Embedded Metric Format (EMF) record per dimension set used
//! in it, with counters summed and durations as value arrays. Without a recorder (tests, tools)
//! every call here costs nothing.
//!
//! The names follow what Step Functions (`ExecutionsStarted`, `ActivityScheduleTime`,
//! `ActivityRunTime`) and Temporal (schedule-to-start, start-to-close) users know. Dimensions are
//! kept few, because every distinct (name, dimensions) pair is a billed custom metric: `Workflow`
//! for task metrics, `Workflow` and `Step` for step metrics, `Agent` for what the Agent function
//! measures (it serves every workflow), none for the sweep's and the Submitter's rejections. Task ids, attempt
//! numbers and request ids stay in the logs.
//!
//! Transitions are observed in one place: [`observe`] compares the task before and after a written
//! transition ([`crate::transition::commit`]), so every role's transitions are counted the same way
//! and a transition written twice (a lost answer, a redelivery) is counted once, when it landed.

use metrics::Unit;

use crate::protocol::{CompensationStatus, Event, StepStatus, Task};
use crate::state::ProcessState;

/// The namespace when `SAS_METRICS_NAMESPACE` is not set.
pub const DEFAULT_NAMESPACE: &str = "SchedulerAgentSupervisor";

/// Dimension names.
pub const WORKFLOW: &str = "Workflow";
pub const STEP: &str = "Step";
pub const AGENT: &str = "Agent";

/// One metric the code emits: its name, unit, dimensions (always exactly these) and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub unit: &'static str,
    pub dimensions: &'static [&'static str],
    /// Who emits it and when.
    pub emitted_by: &'static str,
    pub meaning: &'static str,
}

const TASK: &[&str] = &[WORKFLOW];
const UNIT: &[&str] = &[WORKFLOW, STEP];
const BY_AGENT: &[&str] = &[AGENT];
const NONE: &[&str] = &[];

macro_rules! catalogue {
    ($($id:ident = $name:literal, $unit:literal, $dims:expr, $by:literal, $meaning:literal;)*) => {
        $(pub const $id: Metric = Metric { name: $name, unit: $unit, dimensions: $dims, emitted_by: $by, meaning: $meaning };)*
        /// Every metric the code emits.
        pub const CATALOGUE: &[Metric] = &[$($id),*];
    };
}

catalogue! {
    TASKS_STARTED = "TasksStarted", "Count", TASK, "Submitter",
        "tasks created (a duplicate submission creates none)";
    TASKS_SUCCEEDED = "TasksSucceeded", "Count", TASK, "any role",
        "tasks that ended Processed";
    TASKS_FAILED = "TasksFailed", "Count", TASK, "any role",
        "tasks that ended in Error (an operator alert was published)";
    TASKS_COMPENSATED = "TasksCompensated", "Count", TASK, "any role",
        "tasks that ended Compensated (a step failed for good; the completed steps were undone)";
    TASKS_CANCELLED = "TasksCancelled", "Count", TASK, "any role",
        "tasks that ended Cancelled";
    TASK_TIME = "TaskTime", "Milliseconds", TASK, "any role",
        "from a task's creation to its end, for tasks that ended";
    SUBMISSIONS_REJECTED = "SubmissionsRejected", "Count", NONE, "Submitter",
        "submissions refused with a reason (sent to the submission DLQ; expected input, not an outage)";
    STEPS_STARTED = "StepsStarted", "Count", UNIT, "Submitter, Scheduler",
        "attempts of a step claimed and sent to an agent (or a wait begun)";
    STEP_RETRIES = "StepRetries", "Count", UNIT, "Scheduler",
        "attempts of a step beyond its first";
    STEPS_SUCCEEDED = "StepsSucceeded", "Count", UNIT, "Scheduler, Callback",
        "steps that succeeded";
    STEPS_FAILED = "StepsFailed", "Count", UNIT, "Scheduler, Callback",
        "attempts that failed with an answer (retried or not)";
    STEPS_TIMED_OUT = "StepsTimedOut", "Count", UNIT, "Scheduler, Supervisor",
        "attempts that ran out of time (the agent said so, or CompleteBy passed)";
    LOOP_ITERATIONS = "LoopIterations", "Count", UNIT, "Scheduler",
        "iterations of a loop step that ended, however each ended (with the loop step's StepsSucceeded: how many iterations its loops take)";
    COMPENSATIONS_STARTED = "CompensationsStarted", "Count", UNIT, "Scheduler",
        "attempts of a compensation claimed";
    COMPENSATIONS_SUCCEEDED = "CompensationsSucceeded", "Count", UNIT, "Scheduler, Callback",
        "compensations done";
    COMPENSATIONS_FAILED = "CompensationsFailed", "Count", UNIT, "Scheduler, Supervisor",
        "compensations that failed for good (the task ends in Error)";
    STEP_SCHEDULE_TIME = "StepScheduleTime", "Milliseconds", BY_AGENT, "Agent",
        "schedule-to-start: how long a request waited in the agent queue (and for a slot of an agent at its max_in_flight)";
    STEP_RUN_TIME = "StepRunTime", "Milliseconds", BY_AGENT, "Agent",
        "start-to-close: how long the agent's call (with its own retries) took, for steps whose agent answers (a callback step's hand-off is not counted)";
    AGENT_AT_LIMIT = "AgentAtLimit", "Count", BY_AGENT, "Agent",
        "requests that found their agent at its max_in_flight and were put back to wait (a delay, not a failure)";
    STARTED_UNREAD = "StartedUnread", "Count", BY_AGENT, "Agent",
        "agent requests started without reading their task's LockedBy: they came within unchecked_until of their claim (the others cost one read unit each)";
    STALE_REQUESTS = "StaleRequests", "Count", BY_AGENT, "Agent",
        "agent requests not started because their task no longer waits for their attempt (a copy that came after a retry, a cancel or the task's end)";
    LATE_RESULTS = "LateResults", "Count", TASK, "Scheduler, Callback",
        "successes that came after their attempt had expired: an effect the task may not account for";
    STALE_EVENTS = "StaleEvents", "Count", NONE, "any role",
        "events that changed nothing (duplicates, results of fenced attempts, late timers)";
    WRITE_CONFLICTS = "WriteConflicts", "Count", TASK, "any role",
        "conditional writes of a task lost to another writer, each re-decided on the item it found (contention: a map's elements ending at once, roles racing); each costs a write unit";
    REPLIES_UNDELIVERED = "RepliesUndelivered", "Count", TASK, "any role",
        "statuses the caller's reply_to refused for good";
    ALERTS_PUBLISHED = "AlertsPublished", "Count", TASK, "any role",
        "operator alerts published (a task in Error, a late result)";
    STEPS_EXPIRED = "StepsExpired", "Count", NONE, "Supervisor (sweep)",
        "tasks the sweep found past CompleteBy and handed to the timer queue";
    OLDEST_OVERDUE_STEP_AGE = "OldestOverdueStepAge", "Seconds", NONE, "Supervisor (sweep)",
        "how long past its CompleteBy the most overdue step the sweep found is (0: none); emitted by every sweep";
}

/// Look a metric up by name.
pub fn by_name(name: &str) -> Option<&'static Metric> {
    CATALOGUE.iter().find(|m| m.name == name)
}

fn unit_of(m: &Metric) -> Unit {
    match m.unit {
        "Milliseconds" => Unit::Milliseconds,
        "Seconds" => Unit::Seconds,
        _ => Unit::Count,
    }
}

/// Tell the recorder each metric's unit (once, at start).
pub fn describe() {
    for m in CATALOGUE {
        metrics::describe_counter!(m.name, unit_of(m), m.meaning);
        metrics::describe_histogram!(m.name, unit_of(m), m.meaning);
    }
}

fn labels(m: &Metric, values: &[&str]) -> Vec<metrics::Label> {
    debug_assert_eq!(m.dimensions.len(), values.len(), "{} takes {:?}", m.name, m.dimensions);
    m.dimensions.iter().zip(values).map(|(k, v)| metrics::Label::new(*k, (*v).to_owned())).collect()
}

/// Count `n` of `m` with the dimension values `values` (in the catalogue's order).
pub fn count(m: &Metric, values: &[&str], n: u64) {
    if n > 0 {
        metrics::counter!(m.name, labels(m, values)).increment(n);
    }
}

/// Record one duration (ms) of `m`.
pub fn duration_ms(m: &Metric, values: &[&str], ms: u64) {
    #[allow(clippy::cast_precision_loss)] // durations far below 2^52 ms
    metrics::histogram!(m.name, labels(m, values)).record(ms as f64);
}

/// Record one value of `m`, a level seen now (recorded as a value, not a gauge: a gauge would be
/// written again by every later flush of the process, long after it was seen).
pub fn level(m: &Metric, values: &[&str], v: f64) {
    metrics::histogram!(m.name, labels(m, values)).record(v);
}

/// One thing a written transition did, as a metric sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// `metric` for the step `step` (`None`: a task metric).
    Count {
        metric: &'static Metric,
        step: Option<String>,
        n: u64,
    },
    TaskTime {
        ms: u64,
    },
}

/// What the transition from `before` to `after` (written for `event`) did. Pure: compares the two
/// tasks unit by unit.
pub fn observe(before: &Task, after: &Task, event: &Event) -> Vec<Observation> {
    let mut out = Vec::new();
    let mut unit = |metric: &'static Metric, step: &str, n: u64| {
        if n > 0 {
            out.push(Observation::Count { metric, step: Some(step.to_owned()), n });
        }
    };
    let timed_out = matches!(event, Event::AgentTimedOut { .. } | Event::DeadlineExpired);
    for (i, (b, a)) in before.steps.iter().zip(&after.steps).enumerate() {
        let name = &a.name;
        if after.workflow.steps.get(i).is_some_and(|d| d.kind.loop_spec().is_some()) {
            let ended = |s: &sas_protocol::protocol::StepRecord| s.map.as_ref().map_or(0, |p| p.ended.count());
            unit(&LOOP_ITERATIONS, name, u64::from(ended(a).saturating_sub(ended(b))));
        }
        let started = u64::from(a.attempts.saturating_sub(b.attempts));
        unit(&STEPS_STARTED, name, started);
        // Retries: the attempts started now whose number is above 1.
        unit(&STEP_RETRIES, name, (u64::from(b.attempts.max(1)) + 1..=u64::from(a.attempts)).count() as u64);
        let failed = u64::from(a.failures.saturating_sub(b.failures));
        unit(if timed_out { &STEPS_TIMED_OUT } else { &STEPS_FAILED }, name, failed);
        let succeeded = b.status != StepStatus::Succeeded && a.status == StepStatus::Succeeded;
        unit(&STEPS_SUCCEEDED, name, u64::from(succeeded));
        if let Some(ac) = &a.compensation {
            // A compensation's metrics carry its own name (`release`, `refund`) as the Step.
            let comp = ac.name.as_str();
            let bc = b.compensation.as_ref();
            let (b_attempts, b_failures, b_status) =
                bc.map_or((0, 0, None), |c| (c.attempts, c.failures, Some(c.status)));
            unit(&COMPENSATIONS_STARTED, comp, u64::from(ac.attempts.saturating_sub(b_attempts)));
            let cfailed = u64::from(ac.failures.saturating_sub(b_failures));
            unit(if timed_out { &STEPS_TIMED_OUT } else { &STEPS_FAILED }, comp, cfailed);
            let ended = |s| b_status != Some(s) && ac.status == s;
            unit(&COMPENSATIONS_SUCCEEDED, comp, u64::from(ended(CompensationStatus::Done)));
            unit(&COMPENSATIONS_FAILED, comp, u64::from(ended(CompensationStatus::Failed)));
        }
    }
    // A map element is its parent's step: its attempts count as steps, its end not as a task's.
    if before.process_state != after.process_state && !after.task_id.is_child() {
        if let Some(m) = end_metric(after.process_state) {
            out.push(Observation::Count { metric: m, step: None, n: 1 });
            out.push(Observation::TaskTime { ms: after.created_at.until(after.updated_at) });
        }
    }
    let late = u64::from(after.late.count.saturating_sub(before.late.count));
    if late > 0 {
        out.push(Observation::Count { metric: &LATE_RESULTS, step: None, n: late });
    }
    out
}

/// The metric of a task ending in `state`.
pub fn end_metric(state: ProcessState) -> Option<&'static Metric> {
    match state {
        ProcessState::Processed => Some(&TASKS_SUCCEEDED),
        ProcessState::Error => Some(&TASKS_FAILED),
        ProcessState::Compensated => Some(&TASKS_COMPENSATED),
        ProcessState::Cancelled => Some(&TASKS_CANCELLED),
        _ => None,
    }
}

/// Emit what a written transition did (see [`observe`]).
pub fn record_transition(before: &Task, after: &Task, event: &Event) {
    let wf = after.workflow.name.as_str();
    for o in observe(before, after, event) {
        match o {
            Observation::Count { metric, step: Some(step), n } => count(metric, &[wf, &step], n),
            Observation::Count { metric, step: None, n } => count(metric, &[wf], n),
            Observation::TaskTime { ms } => duration_ms(&TASK_TIME, &[wf], ms),
        }
    }
}

/// A task was created (by the Submitter, with its first unit claimed): `TasksStarted`, and the
/// attempts it began with.
pub fn record_created(task: &Task) {
    let wf = task.workflow.name.as_str();
    count(&TASKS_STARTED, &[wf], 1);
    for s in &task.steps {
        count(&STEPS_STARTED, &[wf, &s.name], u64::from(s.attempts));
    }
}

/// What one EMF record declares: its namespace and, per metric, its name, unit and dimension sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmfRecord {
    pub namespace: String,
    pub metrics: Vec<(String, Option<String>, Vec<Vec<String>>)>,
}

/// The units CloudWatch accepts (`MetricDatum.Unit`).
const CLOUDWATCH_UNITS: &[&str] = &[
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
];

/// Check one log line against the CloudWatch Embedded Metric Format specification: a JSON object
/// of at most 1 MB whose `_aws` member holds a numeric `Timestamp` and a non-empty
/// `CloudWatchMetrics` array of directives; each directive has a non-empty `Namespace` (at most
/// 1,024 characters), `Dimensions` (arrays of at most 30 keys, each a top-level string member of
/// 1 to 1,024 characters) and at most 100 `Metrics` (a `Name` of 1 to 1,024 characters, an optional
/// CloudWatch `Unit`, an optional `StorageResolution` of 1 or 60), each a top-level member that
/// is a number or an array of at most 100 numbers.
pub fn check_emf(line: &str) -> Result<EmfRecord, String> {
    use serde_json::Value;
    if line.len() > 1_048_576 {
        return Err(format!("{} bytes: over the 1 MB event limit", line.len()));
    }
    let root: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let root = root.as_object().ok_or("not a JSON object")?;
    let aws = root.get("_aws").and_then(Value::as_object).ok_or("no _aws object")?;
    let ts = aws.get("Timestamp").ok_or("_aws.Timestamp missing")?;
    if ts.as_u64().is_none_or(|t| t == 0) {
        return Err(format!("_aws.Timestamp {ts} is not epoch milliseconds"));
    }
    let directives = aws.get("CloudWatchMetrics").and_then(Value::as_array).ok_or("_aws.CloudWatchMetrics missing")?;
    if directives.is_empty() {
        return Err("_aws.CloudWatchMetrics is empty".into());
    }
    let sized = |v: Option<&Value>, what: &str| -> Result<String, String> {
        match v.and_then(Value::as_str) {
            Some(s) if !s.trim().is_empty() && s.chars().count() <= 1024 => Ok(s.to_owned()),
            _ => Err(format!("{what} must be a string of 1 to 1024 characters, found {v:?}")),
        }
    };
    let mut record = EmfRecord { namespace: String::new(), metrics: Vec::new() };
    for d in directives {
        let d = d.as_object().ok_or("a directive is not an object")?;
        record.namespace = sized(d.get("Namespace"), "Namespace")?;
        let dim_sets = d.get("Dimensions").and_then(Value::as_array).ok_or("Dimensions missing")?;
        let mut sets = Vec::new();
        for set in dim_sets {
            let keys = set.as_array().ok_or("a dimension set is not an array")?;
            if keys.len() > 30 {
                return Err(format!("a dimension set has {} keys (at most 30)", keys.len()));
            }
            let mut names = Vec::new();
            for k in keys {
                let k = k.as_str().ok_or("a dimension key is not a string")?;
                sized(root.get(k), &format!("dimension {k}"))?;
                names.push(k.to_owned());
            }
            sets.push(names);
        }
        let metrics = d.get("Metrics").and_then(Value::as_array).ok_or("Metrics missing")?;
        if metrics.len() > 100 {
            return Err(format!("{} metrics in one directive (at most 100)", metrics.len()));
        }
        for m in metrics {
            let m = m.as_object().ok_or("a metric definition is not an object")?;
            let name = sized(m.get("Name"), "Name")?;
            let unit = match m.get("Unit") {
                None => None,
                Some(u) => match u.as_str() {
                    Some(u) if CLOUDWATCH_UNITS.contains(&u) => Some(u.to_owned()),
                    _ => return Err(format!("{name}: unit {u} is not a CloudWatch unit")),
                },
            };
            if let Some(r) = m.get("StorageResolution") {
                if !matches!(r.as_u64(), Some(1 | 60)) {
                    return Err(format!("{name}: StorageResolution {r} is not 1 or 60"));
                }
            }
            match root.get(&name) {
                Some(Value::Number(_)) => {}
                Some(Value::Array(vs)) if !vs.is_empty() && vs.len() <= 100 && vs.iter().all(Value::is_number) => {}
                other => return Err(format!("{name}: value {other:?} is not a number or 1 to 100 numbers")),
            }
            record.metrics.push((name, unit, sets.clone()));
        }
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_has_unique_names_and_known_units() {
        let mut names: Vec<_> = CATALOGUE.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOGUE.len(), "a name is in the catalogue twice");
        for m in CATALOGUE {
            assert!(CLOUDWATCH_UNITS.contains(&m.unit), "{}: {}", m.name, m.unit);
            assert!(m.dimensions.len() <= 2, "{}: dimensions cost money", m.name);
        }
    }

    #[test]
    fn check_emf_takes_a_valid_record_and_names_what_is_wrong_in_others() {
        let ok = r#"{"_aws":{"Timestamp":1700000000000,"CloudWatchMetrics":[{"Namespace":"N","Dimensions":[["Workflow"]],"Metrics":[{"Name":"TasksStarted","Unit":"Count"},{"Name":"TaskTime","Unit":"Milliseconds"}]}]},"Workflow":"w","TasksStarted":2,"TaskTime":[10.0,12.5]}"#;
        let r = check_emf(ok).unwrap();
        assert_eq!(r.namespace, "N");
        assert_eq!(r.metrics[0].0, "TasksStarted");
        assert_eq!(r.metrics[1].2, vec![vec!["Workflow".to_owned()]]);
        let bad = [
            (ok.replace("\"Workflow\":\"w\",", ""), "dimension Workflow"),
            (ok.replace("\"TasksStarted\":2,", ""), "TasksStarted: value None"),
            (ok.replace("\"Unit\":\"Count\"", "\"Unit\":\"Things\""), "not a CloudWatch unit"),
            (ok.replace("1700000000000", "\"now\""), "not epoch milliseconds"),
            (ok.replace("\"Namespace\":\"N\"", "\"Namespace\":\"\""), "Namespace"),
            (ok.replace("[10.0,12.5]", "[]"), "TaskTime: value"),
            ("[1]".to_owned(), "not a JSON object"),
        ];
        for (line, why) in bad {
            let e = check_emf(&line).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
    }
}
