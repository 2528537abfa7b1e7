//! The metrics the code emits, as the functions write them: the EMF recorder installed as in a
//! Lambda function, the whole system run by the simulator under its faults (and the two inputs it
//! never makes: a bad submission, a reply queue that refuses), every record flushed and checked
//! against the EMF specification, and every metric of the catalogue seen with its unit and
//! dimensions. A metric the code stops emitting, or emits with other dimensions, fails here (and
//! the template's dashboard and alarms may only name catalogue metrics: `tests/template.rs`).

// Counts are whole numbers (EMF values are JSON numbers): compared exactly.
#![allow(clippy::float_cmp)]

use std::collections::{BTreeMap, BTreeSet};

use sas_core::agent::AgentRuntime;
use sas_core::config::Settings;
use sas_core::metrics::{self, check_emf, CATALOGUE};
use sas_core::role::{self, Record, Role};
use sas_core::{submitter, supervisor, telemetry};
use sas_protocol::ids::Millis;
use sas_protocol::protocol::Policy;
use sas_protocol::workflow::{OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use sas_testkit::sim::{self, Faults, SimConfig};
use sas_testkit::twins::Twins;
use serde_json::json;

fn flush() -> Vec<String> {
    let mut out = Vec::new();
    telemetry::flush_metrics_to(&mut out);
    String::from_utf8(out).unwrap().lines().map(str::to_owned).collect()
}

fn twins() -> Twins {
    let step = StepDef { max_attempts: 1, ..StepDef::call("only", "sim", 5_000) };
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "one".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![step],
    };
    let settings = Settings {
        policy: Policy { history_limit: 50, ..Policy::default() },
        max_input_bytes: 1_024,
        ..Settings::default()
    };
    Twins::new(WorkflowRegistry::new([wf]).unwrap(), settings, Millis(1_700_000_000_000))
}

#[tokio::test(flavor = "current_thread")]
async fn every_record_is_valid_emf_and_every_catalogue_metric_is_emitted_as_declared() {
    telemetry::init_metrics();
    let _guard = SERIAL.lock().await;
    let mut lines = Vec::new();
    for seed in sim::seeds(1, 60) {
        // Few tasks per run and a flush after each: a function flushes after every invocation, and
        // a record keeps at most 100 values of one duration. Half the runs with many permanent
        // failures, so compensations fail for good too.
        let permanent = if seed % 2 == 0 { 0.4 } else { Faults::all().permanent };
        // Callback answers late often enough that some come after their attempt expired (a late
        // result, `LateResults`).
        let faults = Faults { permanent, cb_late: 0.6, ..Faults::all() };
        let r = sim::run(&SimConfig { burst: 4, trickle: 2, faults, ..SimConfig::for_seed(seed) });
        assert!(r.violations.is_empty(), "{}", sim::describe(&r));
        lines.extend(flush());
    }
    // The Submitter's rejection, and a status the caller's queue refuses for good.
    let tw = twins();
    tw.clock.set(Millis::now());
    let got = submitter::submit(&tw.deps, "{ not json").await.unwrap();
    assert!(matches!(got, submitter::Submitted::Rejected(_)), "{got:?}");
    let reply = tw.reply_queue("refusing");
    tw.bus.refuse_sends(&reply, "AccessDenied");
    let sub = json!({"v": 1, "task_id": "r1", "workflow": "one", "input": {}, "reply_to": reply}).to_string();
    submitter::submit(&tw.deps, &sub).await.unwrap();
    // The Agent role, fed its request as a Lambda record (with its SentTimestamp).
    let url = tw.deps.resources.agent_queue_url.clone();
    let body = tw.bus.take(&url).pop().expect("the step was dispatched");
    let record = Record { sent_at: Some(Millis(tw.deps.now().0 - 250)), ..Record::new("m-agent", body) };
    role::handle(Role::Agent, &tw.deps, &AgentRuntime::with_builtins(), &record).await.unwrap();
    // A step that never answers, found by the sweep.
    let tw = twins();
    let sub = json!({"v": 1, "task_id": "lost", "workflow": "one", "input": {}}).to_string();
    submitter::submit(&tw.deps, &sub).await.unwrap();
    // ... whose agent is at its max_in_flight: the request waits
    let mut limited = AgentRuntime::with_builtins();
    limited.set_limit("sim", 1);
    let now = tw.deps.now();
    tw.deps.limiter.acquire("sim", 1, "busy", now.plus_ms(3_600_000), now).await.unwrap();
    let body = tw.bus.take(&url).pop().expect("the step was dispatched");
    role::handle(Role::Agent, &tw.deps, &limited, &Record::new("m-limited", body)).await.unwrap();
    assert_eq!(tw.bus.depth(&url), 1, "sent back to wait");
    tw.clock.set(Millis(tw.deps.now().0 + 600_000));
    assert_eq!(supervisor::sweep(&tw.deps).await.expired, 1);
    lines.extend(flush());

    assert!(!lines.is_empty(), "no EMF records at all");
    let mut seen: BTreeMap<String, (Option<String>, Vec<Vec<String>>)> = BTreeMap::new();
    for line in &lines {
        let rec = check_emf(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(rec.namespace, metrics::DEFAULT_NAMESPACE);
        for (name, unit, dims) in rec.metrics {
            let m = metrics::by_name(&name).unwrap_or_else(|| panic!("{name} is emitted but not in the catalogue"));
            assert_eq!(unit.as_deref(), Some(m.unit), "{name}'s unit");
            let declared: Vec<String> = m.dimensions.iter().map(|d| (*d).to_owned()).collect();
            assert_eq!(dims, vec![declared], "{name}'s dimensions");
            seen.insert(name, (unit, dims));
        }
    }
    let missing: BTreeSet<&str> = CATALOGUE.iter().map(|m| m.name).filter(|n| !seen.contains_key(*n)).collect();
    assert!(missing.is_empty(), "catalogue metrics never emitted: {missing:?}");
}

/// Sum each metric's values over `lines` (counters: the count; durations: the number of values).
fn totals(lines: &[String]) -> BTreeMap<String, f64> {
    let mut t = BTreeMap::new();
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for (name, _, _) in check_emf(line).unwrap().metrics {
            let n = match &v[&name] {
                serde_json::Value::Array(a) => f64::from(u32::try_from(a.len()).unwrap()),
                x => x.as_f64().unwrap(),
            };
            *t.entry(name).or_insert(0.0) += n;
        }
    }
    t
}

#[tokio::test(flavor = "current_thread")]
async fn a_task_is_counted_once_however_often_its_messages_come() {
    // What this test alone recorded: the recorder is flushed before it starts.
    telemetry::init_metrics();
    let _guard = SERIAL.lock().await;
    flush();
    let tw = twins();
    tw.clock.set(Millis::now());
    let sub = json!({"v": 1, "task_id": "happy", "workflow": "one", "input": {}}).to_string();
    submitter::submit(&tw.deps, &sub).await.unwrap();
    // The submission delivered again creates nothing.
    submitter::submit(&tw.deps, &sub).await.unwrap();
    let agent_url = tw.deps.resources.agent_queue_url.clone();
    let sched_url = tw.deps.resources.scheduler_queue_url.clone();
    let req = tw.bus.take(&agent_url);
    assert_eq!(req.len(), 1, "the duplicate created and sent nothing");
    let rt = AgentRuntime::with_builtins();
    role::handle(Role::Agent, &tw.deps, &rt, &Record::new("a1", req[0].clone())).await.unwrap();
    let result = tw.bus.take(&sched_url).pop().expect("a result");
    for id in ["r1", "r2"] {
        role::handle(Role::Scheduler, &tw.deps, &rt, &Record::new(id, result.clone())).await.unwrap();
    }
    let t = totals(&flush());
    let want: BTreeMap<String, f64> = [
        ("TasksStarted", 1.0),
        ("StepsStarted", 1.0),
        ("StepRunTime", 1.0),
        ("StepsSucceeded", 1.0),
        ("TasksSucceeded", 1.0),
        ("TaskTime", 1.0),
        ("StaleEvents", 1.0),
        // the request came at once: its agent did not read the task
        ("StartedUnread", 1.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(t, want);
}

/// The two tests share the process's one recorder: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sum the end metrics and the tasks' final states over `seeds` runs with `faults`.
fn counted_and_true(faults: &Faults, seeds: std::ops::Range<u64>) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let mut truth: BTreeMap<String, f64> = BTreeMap::new();
    let mut counted: BTreeMap<String, f64> = BTreeMap::new();
    for seed in seeds {
        let r = sim::run(&SimConfig { burst: 4, trickle: 2, faults: faults.clone(), ..SimConfig::for_seed(seed) });
        assert!(r.violations.is_empty(), "{}", sim::describe(&r));
        *truth.entry("tasks".into()).or_default() += f64::from(u32::try_from(r.tasks).unwrap());
        for (state, n) in &r.end_states {
            *truth.entry(state.clone()).or_default() += f64::from(u32::try_from(*n).unwrap());
        }
        for (k, v) in totals(&flush()) {
            *counted.entry(k).or_default() += v;
        }
    }
    (counted, truth)
}

#[tokio::test(flavor = "current_thread")]
async fn under_the_simulators_faults_each_task_start_and_end_is_counted() {
    // Operators neither cancel nor resubmit on their own here: the simulator's operators cancel
    // what is parked in Error, so every Cancelled task ended Error first (two true ends). Ambiguous
    // writes are left out: a write that landed but answered with an error fails its handler, and
    // the message that comes back finds the write done and counts nothing (as a function that dies
    // before its flush loses its counts).
    telemetry::init_metrics();
    let _guard = SERIAL.lock().await;
    flush();
    let quiet = Faults { cancel: 0.0, resubmit: 0.0, ambiguous_writes: 0.0, ..Faults::all() };
    // 1. Without concurrent duplicates: exactly once.
    let once = Faults { duplicate: 0.0, agent_duplicate: 0.0, late_duplicate: 0.0, cb_duplicate: 0.0, ..quiet.clone() };
    let (counted, truth) = counted_and_true(&once, 100..120);
    let got = |m: &str| counted.get(m).copied().unwrap_or(0.0);
    let end = |s: &str| truth.get(s).copied().unwrap_or(0.0);
    let why = format!("counted {counted:?}, truth {truth:?}");
    assert_eq!(got("TasksStarted"), end("tasks"), "{why}");
    assert_eq!(got("TasksSucceeded"), end("Processed"), "{why}");
    assert_eq!(got("TasksCompensated"), end("Compensated"), "{why}");
    assert_eq!(got("TasksCancelled"), end("Cancelled"), "{why}");
    assert_eq!(got("TasksFailed"), end("Error") + end("Cancelled"), "{why}");
    let ends = ["TasksSucceeded", "TasksCompensated", "TasksCancelled", "TasksFailed"].map(got).iter().sum::<f64>();
    assert_eq!(got("TaskTime"), ends, "one task time per end: {why}");
    assert!(got("StaleEvents") > 0.0, "the faults made late and repeated messages: {why}");

    // 2. With two consumers handling one message at once: at least once. Both may decide the same
    // transition from the same item in the same millisecond; each then takes the other's write
    // for its own (`store::is_own_write`) and counts it (as each performs its effects).
    let (counted, truth) = counted_and_true(&quiet, 200..220);
    let got = |m: &str| counted.get(m).copied().unwrap_or(0.0);
    let end = |s: &str| truth.get(s).copied().unwrap_or(0.0);
    let why = format!("counted {counted:?}, truth {truth:?}");
    assert!(got("TasksStarted") >= end("tasks"), "{why}");
    assert!(got("TasksSucceeded") >= end("Processed"), "{why}");
    assert!(got("TasksCompensated") >= end("Compensated"), "{why}");
}
