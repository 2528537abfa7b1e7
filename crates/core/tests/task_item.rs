//! The stored form of a task does not change by accident: a task with every optional field set
//! (and numbers past `i64::MAX` and `u32::MAX`) and a task with every field at its default
//! serialise to exactly the JSON (the in-memory store's form, `check_size`'s measure,
//! `sasctl status --json`) and the DynamoDB item (`DynamoStore::to_item`) kept in `tests/data/`,
//! and those files, written by an earlier version, read back as the same tasks.
//!
//! The JSON is compared as a value with its keys sorted (`task_*.json`): the attributes, their
//! names, types and values, not the order `serde_json` writes a struct's fields in. The item is
//! compared attribute by attribute, in DynamoDB's JSON form (`task_*.item.json`).
//!
//! The files are kept by item format ([`ITEM_FORMAT`], `tests/data/items/v{N}/`), with the
//! workflow definitions of the shipped configuration as a release stores them (the `Definition`
//! of a `workflow:` item: every step kind, a map, a parallel region, guards, loops, children).
//! Those of every format up to this build's are read by it, without a loss: a task written by the
//! release before is read by this one during a deploy.
//!
//! `SAS_BLESS=1 cargo nextest run -p sas-core --test task_item` rewrites the current format's
//! files: only before that format is released. A change of the stored form is a new item format
//! (the protocol crate's `wire_format` test says so): keep the files of the format before.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::executor::block_on;
use sas_core::store::DynamoStore;
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::protocol::{
    Bits, ClaimWait, CompensationRecord, CompensationStatus, EndCause, HistoryEntry, Iteration, LateResults, Lock,
    MapProgress, ProcessState, Stage, StepRecord, StepStatus, Task, UndeliveredReplies, ITEM_FORMAT,
};
use sas_protocol::workflow::{OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use serde_json::{json, Map, Value};

type Item = HashMap<String, AttributeValue>;

fn store() -> DynamoStore {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .build();
    DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(conf), "t", 4, 30)
}

fn workflow() -> WorkflowDef {
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "golden".into(),
        version: 2,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![StepDef::call("reserve", "sim", 5_000), StepDef::call("charge", "sim", 7_000)],
    }
}

fn token(s: &str) -> AttemptToken {
    AttemptToken::from(s)
}

/// Every optional field of the task, of its steps and of its history set; the numbers of the
/// task's own counters at the edges of what DynamoDB's `N` and JSON must carry exactly.
fn full() -> Task {
    let mut ended = Bits::new(3);
    ended.set(0);
    ended.set(2);
    let mut ok = Bits::new(3);
    ok.set(0);
    let mut errored = Bits::new(3);
    errored.set(2);
    let mut branches = Bits::new(3);
    branches.set(1);
    let reserve = StepRecord {
        name: "reserve".into(),
        status: StepStatus::Succeeded,
        attempts: 2,
        failures: 1,
        output: Some(json!({"reservation": "r-1", "qty": 2, "price": 10.5})),
        error: Some("503 from inventory".into()),
        compensation: Some(CompensationRecord {
            name: "release".into(),
            status: CompensationStatus::Done,
            attempts: 1,
            failures: 1,
            error: Some("a refusal".into()),
            refused: true,
            key_gen: 1,
            done_by: Some(token("comp-done")),
            issued: vec![token("comp-1"), token("comp-2")],
        }),
        maybe_applied: true,
        settles_at: Some(Millis(1_700_000_050_000)),
        refused: true,
        key_gen: 2,
        done_by: Some(token("done-by")),
        progress: Some(json!({"pct": 40})),
        issued: vec![token("issued-1")],
        map: Some(MapProgress {
            n: 3,
            started: 3,
            ended,
            ok,
            failed: 1,
            errored: errored.clone(),
            undone: errored,
            stopping: Some(EndCause::Failed),
            joining: true,
            deadline: Millis(1_700_000_900_000),
            branches: Some(branches.clone()),
            skipped: branches,
        }),
        skipped: Some("when was false: /input/gift".into()),
    };
    let mut charge = StepRecord::new("charge");
    charge.status = StepStatus::Cancelled;
    charge.attempts = 1;
    Task {
        slot: None,
        task_id: TaskId::try_from("order-42").unwrap(),
        workflow: workflow(),
        input: json!({"n": 1.5, "s": "x", "l": [1, null, true], "empty": {}, "big": u64::MAX}),
        reply_to: Some("https://sqs.us-east-1.amazonaws.com/123456789012/orders-replies".into()),
        process_state: ProcessState::Compensating,
        stage: Stage::Compensating {
            plan: vec![1, 0],
            pos: 1,
            cause: EndCause::Cancelled,
            why: "cancelled: by the operator".into(),
        },
        step_index: 1,
        steps: vec![reserve, charge],
        failure_count: 3,
        run: 2,
        lock: Lock {
            locked_by: Some(token("locked-by")),
            hard_by: Some(Millis(i64::MAX as u64 + 1)),
            outstanding: vec![token("outstanding-1"), token("outstanding-2")],
            awaits: Some(token("awaits")),
        },
        complete_by: Some(Millis(1_700_000_123_456)),
        claim: ClaimWait {
            paused: false,
            rev: u64::MAX - 1,
            not_before: Some(Millis(1_700_000_095_000)),
            restarts: u32::MAX,
        },
        rev: 9_007_199_254_740_993, // 2^53 + 1: not an f64
        reason: Some("cancelled: customer".into()),
        created_at: Millis(1_700_000_000_000),
        updated_at: Millis(1_700_000_100_000),
        history: vec![
            HistoryEntry {
                seq: 6,
                state: ProcessState::Compensating,
                step: Some("release".into()),
                failure_count: 3,
                reason: Some("cancelled: customer".into()),
                at: Millis(1_700_000_090_000),
                waiting: true,
            },
            HistoryEntry {
                seq: 7,
                state: ProcessState::Compensating,
                step: Some("release".into()),
                failure_count: 3,
                reason: None,
                at: Millis(1_700_000_100_000),
                waiting: false,
            },
        ],
        status_seq: 7,
        last_message: Some(sas_protocol::ids::message_mark("5fea7756-0ea4-451a-a703-a558b933e274")),
        undelivered: UndeliveredReplies {
            count: u32::MAX - 1,
            error: Some("AWS.SimpleQueueService.NonExistentQueue".into()),
        },
        late: LateResults {
            count: 2,
            last: Some("reserve: a success came late".into()),
            attempt: Some(token("late-attempt")),
        },
        upstream: Some(json!({"before": {"id": 7}})),
        called: true,
        vars: serde_json::Map::from_iter([("next_token".to_owned(), json!("p-2")), ("pages".to_owned(), json!(3))]),
        iteration: Some(Iteration { index: 7, previous: Some(json!({"next_token": "p-2"})), shares_vars: true }),
    }
}

/// Every field that may be absent absent, every other at its default value.
fn defaults() -> Task {
    Task {
        slot: None,
        task_id: TaskId::try_from("order-43").unwrap(),
        workflow: workflow(),
        input: json!({}),
        reply_to: None,
        process_state: ProcessState::Processed,
        stage: Stage::Forward,
        step_index: 0,
        steps: vec![StepRecord::new("reserve"), StepRecord::new("charge")],
        failure_count: 0,
        run: 1,
        lock: Lock::default(),
        complete_by: None,
        claim: ClaimWait::default(),
        rev: 0,
        reason: None,
        created_at: Millis(0),
        updated_at: Millis(0),
        history: Vec::new(),
        status_seq: 0,
        last_message: None,
        undelivered: UndeliveredReplies::default(),
        late: LateResults::default(),
        upstream: None,
        called: false,
        vars: serde_json::Map::new(),
        iteration: None,
    }
}

/// An attribute value in DynamoDB's JSON form (`{"S": ...}`, `{"N": "..."}`, ...).
fn attr_json(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        AttributeValue::Null(b) => json!({ "NULL": b }),
        AttributeValue::L(l) => json!({ "L": l.iter().map(attr_json).collect::<Vec<_>>() }),
        AttributeValue::M(m) => json!({ "M": item_json(m) }),
        other => panic!("no attribute of a task is stored as {other:?}"),
    }
}

/// An item in DynamoDB's JSON form, its attributes sorted by name.
fn item_json(item: &Item) -> Value {
    Value::Object(item.iter().map(|(k, v)| (k.clone(), attr_json(v))).collect::<Map<_, _>>())
}

fn attr_from_json(v: &Value) -> AttributeValue {
    let (kind, v) = v.as_object().and_then(|o| o.iter().next()).expect("an attribute value");
    match (kind.as_str(), v) {
        ("S", Value::String(s)) => AttributeValue::S(s.clone()),
        ("N", Value::String(n)) => AttributeValue::N(n.clone()),
        ("BOOL", Value::Bool(b)) => AttributeValue::Bool(*b),
        ("NULL", Value::Bool(b)) => AttributeValue::Null(*b),
        ("L", Value::Array(l)) => AttributeValue::L(l.iter().map(attr_from_json).collect()),
        ("M", m) => AttributeValue::M(item_from_json(m)),
        _ => panic!("not an attribute value: {kind}: {v}"),
    }
}

fn item_from_json(v: &Value) -> Item {
    v.as_object().expect("an item").iter().map(|(k, v)| (k.clone(), attr_from_json(v))).collect()
}

fn data(name: &str) -> std::path::PathBuf {
    items(ITEM_FORMAT).join(name)
}

/// Where the items of `format` are kept.
fn items(format: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/items/v{format}"))
}

/// The golden file `name` equals `text`, or is written with it under `SAS_BLESS=1`.
fn golden(name: &str, text: &str) {
    let path = data(name);
    if std::env::var_os("SAS_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(want == text, "{name} changed:\n--- kept\n{want}\n--- now\n{text}");
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap() + "\n"
}

fn check(name: &str, task: &Task) {
    // the JSON: every attribute, its name, type and value
    let value = serde_json::to_value(task).unwrap();
    golden(&format!("{name}.json"), &pretty(&value));
    // as many bytes as ever (what check_size measures)
    assert_eq!(serde_json::to_vec(task).unwrap().len(), serde_json::to_vec(&value).unwrap().len());
    // the DynamoDB item, as the store writes it
    let s = store();
    let item = s.to_item(task).unwrap();
    golden(&format!("{name}.item.json"), &pretty(&item_json(&item)));

    // what an earlier version wrote reads back as the same task
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(data(&format!("{name}.json"))).unwrap()).unwrap();
    assert_eq!(serde_json::from_value::<Task>(kept.clone()).unwrap(), *task, "{name}.json");
    let text = std::fs::read_to_string(data(&format!("{name}.json"))).unwrap();
    assert_eq!(serde_json::from_str::<Task>(&text).unwrap(), *task, "{name}.json, from the text");
    let kept = item_from_json(
        &serde_json::from_str(&std::fs::read_to_string(data(&format!("{name}.item.json"))).unwrap()).unwrap(),
    );
    let s = store().knowing([&task.workflow]);
    assert_eq!(block_on(s.decode(kept.clone())).unwrap(), *task, "{name}.item.json");
    // and, as the in-memory store keeps it, through JSON bytes
    let bytes = serde_json::to_vec(task).unwrap();
    assert_eq!(serde_json::from_slice::<Task>(&bytes).unwrap(), *task);
}

#[test]
fn a_task_with_every_field_set_is_stored_as_before() {
    check("task_full", &full());
}

#[test]
fn a_task_with_every_field_at_its_default_is_stored_as_before() {
    check("task_defaults", &defaults());
}

/// Attributes with a default may be missing from an item (written before they existed): the task
/// reads back with their defaults.
#[test]
fn an_item_without_the_attributes_that_have_defaults_reads_with_them() {
    let s = store();
    let task = defaults();
    let mut item = s.to_item(&task).unwrap();
    for name in ["Run", "History", "WaitRev", "StatusSeq"] {
        assert!(item.remove(name).is_some(), "{name} is written");
    }
    let s = store().knowing([&task.workflow]);
    assert_eq!(block_on(s.decode(item)).unwrap(), task);
    let mut value = serde_json::to_value(&task).unwrap();
    for name in ["Run", "History", "WaitRev", "StatusSeq"] {
        value.as_object_mut().unwrap().remove(name);
    }
    assert_eq!(serde_json::from_value::<Task>(value).unwrap(), task);
}

/// The workflow definitions of the shipped configuration, as stored (`Definition`): kept for
/// this format, and every definition kept of every format so far reads back as itself (an
/// attribute this build does not know would be refused; one it reads differently would show).
#[test]
fn the_definitions_kept_of_every_format_read_as_themselves() {
    let shipped = WorkflowRegistry::from_json(include_str!("../../../config/workflows.json")).unwrap();
    let mut defs: Vec<&WorkflowDef> = shipped.all().collect();
    defs.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
    let now = serde_json::to_value(&defs).unwrap();
    if std::env::var_os("SAS_BLESS").is_some() {
        golden("definitions.json", &pretty(&now));
    }
    let mut kinds = std::collections::BTreeSet::new();
    for format in 1..=ITEM_FORMAT {
        let path = items(format).join("definitions.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let kept: Vec<Value> = serde_json::from_str(&text).unwrap();
        assert!(!kept.is_empty(), "{}", path.display());
        for def in kept {
            let name = def["name"].clone();
            let read: WorkflowDef = serde_json::from_value(def.clone())
                .unwrap_or_else(|e| panic!("{}: {name}: this build cannot read it: {e}", path.display()));
            assert_eq!(serde_json::to_value(&read).unwrap(), def, "{}: {name} reads as another", path.display());
            // and as DynamoDB holds it
            let attr = serde_dynamo::to_attribute_value::<_, AttributeValue>(&def).unwrap();
            assert_eq!(serde_dynamo::from_attribute_value::<_, WorkflowDef>(attr).unwrap(), read);
            for step in def["steps"].as_array().into_iter().flatten() {
                kinds.insert(step["kind"].as_str().unwrap_or("call").to_owned());
                for (k, _) in step.as_object().into_iter().flatten() {
                    if ["map", "when", "after", "compensation", "until"].contains(&k.as_str()) {
                        kinds.insert(k.clone());
                    }
                }
            }
        }
    }
    // what the kept definitions stand for: every step kind and shape a task may be in
    for k in ["call", "callback", "wait", "workflow", "loop", "map", "when", "after", "compensation"] {
        assert!(kinds.contains(k), "no kept definition has a {k} step: {kinds:?}");
    }
}

/// The task items kept of every format up to this build's read, and say the format they are.
#[test]
fn the_task_items_kept_of_every_format_read() {
    for format in 1..=ITEM_FORMAT {
        for name in ["task_full", "task_defaults"] {
            let path = items(format).join(format!("{name}.item.json"));
            let item = item_from_json(&serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap());
            let said = match item.get("Format") {
                Some(AttributeValue::N(n)) => n.parse().unwrap(),
                None => 1,
                Some(other) => panic!("{}: Format {other:?}", path.display()),
            };
            assert_eq!(said, format, "{}: the item says its format", path.display());
            let s = store().knowing([&workflow()]);
            block_on(s.decode(item)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}
