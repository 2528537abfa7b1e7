//! Map steps and parallel branches against LocalStack on the local runner: an order reserves each
//! of its lines in a map (each line an element task of its own in DynamoDB, its HTTP call to the
//! order service under its own idempotency key), at most `max_concurrency` at once; a line out of
//! stock stops the map, and every line reserved is released exactly once, nothing charged. Then
//! the charge and a fraud check run at once (two branches: `after`), and ship waits for both; a
//! fraud check that refuses undoes the charge beside it and every line.

use std::collections::BTreeMap;
use std::time::Duration;

use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_order_service::{spawn_service, FaultRule, OrderService};
use sas_protocol::ids::TaskId;
use sas_protocol::protocol::ProcessState;
use sas_protocol::workflow::{MapSpec, OnFailure, StepDef, Tolerance, WorkflowDef, WorkflowRegistry};
use serde_json::{json, Value};

use crate::common::{stack_with, Stack};

const AT_ONCE: u32 = 10;

fn lines_workflow() -> WorkflowDef {
    let call = |name: &str, agent: &str, comp: Option<(&str, &str)>| StepDef {
        compensation: comp.map(|(n, a)| Box::new(StepDef::call(n, a, 10_000))),
        ..StepDef::call(name, agent, 10_000)
    };
    let mut reserve = call("reserve", "reserve", Some(("release", "release")));
    reserve.map = Some(MapSpec {
        items: "/input/items".into(),
        max_concurrency: AT_ONCE,
        tolerated_failures: Tolerance::None,
        timeout_ms: None,
    });
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "lines".into(),
        version: 1,
        description: "reserve each line, then charge and ship".into(),
        on_failure: OnFailure::Compensate,
        steps: vec![reserve, call("charge", "charge", Some(("refund", "refund"))), call("ship", "ship", None)],
    }
}

async fn order_service_and_runner(s: &Stack, svc: &OrderService) -> sas_core::runner::RunnerHandle {
    let base = spawn_service(svc).await.unwrap();
    let agents = r#"{"agents": {
        "reserve": {"kind": "http", "url": "${BASE}/inventory/reserve"},
        "release": {"kind": "http", "url": "${BASE}/inventory/release"},
        "charge": {"kind": "http", "url": "${BASE}/payment/charge"},
        "refund": {"kind": "http", "url": "${BASE}/payment/refund"},
        "ship": {"kind": "http", "url": "${BASE}/shipping/ship"},
        "fraud": {"kind": "http", "url": "${BASE}/fraud/screen"}}}"#;
    let vars = |k: &str| (k == "BASE").then(|| base.clone());
    let rt = AgentRuntime::from_config_with(agents, &vars, AwsConfigCell::with(s.sdk.clone())).unwrap();
    s.runner_with(rt)
}

/// The ledger of one order: (op, line) → how many times.
fn books(svc: &OrderService, order: &str) -> BTreeMap<(String, Option<u64>), u32> {
    let mut b = BTreeMap::new();
    for e in svc.ledger().into_iter().filter(|e| e.order == order) {
        *b.entry((e.op, e.detail.get("line").and_then(Value::as_u64))).or_default() += 1;
    }
    b
}

#[tokio::test]
async fn a_hundred_line_order_reserves_every_line_in_a_map_then_charges_and_ships() {
    let s = stack_with("maps", WorkflowRegistry::new([lines_workflow()]).unwrap()).await;
    let svc = OrderService::new();
    // each reservation takes a moment, so that the lines overlap at the service
    svc.add_fault(FaultRule { endpoint: Some("/inventory/reserve".into()), latency_ms: 100, ..FaultRule::default() });
    let runner = order_service_and_runner(&s, &svc).await;
    let items: Vec<Value> = (0..100).map(|i| json!({"sku": format!("sku-{i}"), "qty": 1 + i % 3})).collect();
    let body = json!({"v": 1, "task_id": "big-1", "workflow": "lines", "input": {"customer": "c-1", "items": items}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;

    let t = s.wait_for("big-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:?}", t.reason);
    let out = t.steps[0].output.as_ref().unwrap().as_array().unwrap().clone();
    assert_eq!(out.len(), 100, "one output per line, in line order");
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o["items"][0]["sku"], format!("sku-{i}"), "line {i}: {o}");
    }
    let map = t.steps[0].map.as_ref().unwrap();
    assert_eq!((map.n, map.ok.count(), map.failed), (100, 100, 0));
    // every element is a task of its own, Processed
    let ids: Vec<TaskId> = (0..100).map(|i| TaskId::child(&t.task_id, 0, i)).collect();
    let elements = s.deps.store.get_many(&ids).await.unwrap();
    assert_eq!(elements.len(), 100);
    assert!(elements.iter().all(|e| e.process_state == ProcessState::Processed));
    let seen = svc.in_flight("/inventory/reserve");
    assert!(seen.max <= AT_ONCE, "{} reservations were open at once; max_concurrency is {AT_ONCE}", seen.max);
    assert!(seen.max > 1, "the lines ran side by side");
    let b = books(&svc, "big-1");
    for i in 0..100 {
        assert_eq!(b.get(&("reserve".into(), Some(i))), Some(&1), "line {i} reserved once: {b:?}");
    }
    assert_eq!(b.get(&("charge".into(), None)), Some(&1));
    assert_eq!(b.get(&("ship".into(), None)), Some(&1));
    assert_eq!(b.len(), 102, "nothing else: {b:?}");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test]
async fn a_line_out_of_stock_stops_the_map_and_every_reserved_line_is_released_once() {
    let s = stack_with("maps-oos", WorkflowRegistry::new([lines_workflow()]).unwrap()).await;
    let svc = OrderService::new();
    let runner = order_service_and_runner(&s, &svc).await;
    // Enough lines that the stop shows: the lines already running when line 17 fails, and the
    // ends of those ahead of its notice, still start one each (all of 30 lines started under
    // load in CI; up to 31 of 60 seen on a loaded machine).
    const LINES: u32 = 100;
    let mut items: Vec<Value> = (0..LINES).map(|i| json!({"sku": format!("sku-{i}")})).collect();
    items[17] = json!({"sku": "sku-17", "faults": {"/inventory/reserve": {"permanent": "out of stock: sku-17"}}});
    let body = json!({"v": 1, "task_id": "oos-1", "workflow": "lines", "input": {"customer": "c-1", "items": items}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;

    let t = s.wait_for("oos-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Compensated, "{:?}", t.reason);
    assert!(
        t.history.iter().any(|h| h
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("element 17 ended") && r.contains("out of stock: sku-17"))),
        "{:?}",
        t.history
    );
    let b = books(&svc, "oos-1");
    assert_eq!(b.get(&("reserve".into(), Some(17))), None, "the line out of stock reserved nothing");
    let reserved: Vec<u64> = b.keys().filter(|(op, _)| op == "reserve").filter_map(|(_, l)| *l).collect();
    assert!(!reserved.is_empty(), "some lines were reserved before the stop");
    for line in &reserved {
        assert_eq!(b.get(&("reserve".into(), Some(*line))), Some(&1));
        assert_eq!(b.get(&("release".into(), Some(*line))), Some(&1), "line {line} released once: {b:?}");
    }
    let released = b.keys().filter(|(op, _)| op == "release").count();
    assert_eq!(released, reserved.len(), "nothing released that was not reserved: {b:?}");
    assert!(!b.keys().any(|(op, _)| op == "charge" || op == "ship"), "nothing charged or shipped: {b:?}");
    // lines after the stop never started: no task of theirs, no call at the service
    let map = t.steps[0].map.as_ref().unwrap();
    assert!(map.started < LINES, "{} of {LINES} lines started", map.started);
    let never: Vec<TaskId> = (map.started..LINES).map(|i| TaskId::child(&t.task_id, 0, i)).collect();
    assert_eq!(s.deps.store.get_many(&never).await.unwrap().len(), 0, "no element past the {} started", map.started);
    assert!(reserved.iter().all(|l| *l < u64::from(map.started)), "{reserved:?} reserved, {} started", map.started);
    runner.shutdown().await;
    s.delete().await;
}

/// The lines reserved in a map, then charge and a fraud check at once, then ship after both.
fn graph_workflow() -> WorkflowDef {
    let mut wf = lines_workflow();
    wf.name = "lines-graph".into();
    wf.description = "reserve each line, then charge and check for fraud at once, then ship".into();
    let fraud = StepDef { after: Some(vec!["reserve".into()]), ..StepDef::call("fraud", "fraud", 10_000) };
    wf.steps.insert(2, fraud);
    wf.steps[3].after = Some(vec!["charge".into(), "fraud".into()]);
    wf
}

#[tokio::test]
async fn the_charge_and_a_fraud_check_run_at_once_after_the_map_and_ship_waits_for_both() {
    let s = stack_with("graph", WorkflowRegistry::new([graph_workflow()]).unwrap()).await;
    let svc = OrderService::new();
    // each is open for 5 s (of its 10 s timeout), so that running at once shows at the service
    // even when the two branches start seconds apart on a loaded machine (1 s was not enough for
    // one CI run beside the CPU burners, on 2026-11-28)
    for endpoint in ["/payment/charge", "/fraud/screen"] {
        svc.add_fault(FaultRule { endpoint: Some(endpoint.into()), latency_ms: 5_000, ..FaultRule::default() });
    }
    let runner = order_service_and_runner(&s, &svc).await;
    let items: Vec<Value> = (0..12).map(|i| json!({"sku": format!("sku-{i}")})).collect();
    let body =
        json!({"v": 1, "task_id": "g-1", "workflow": "lines-graph", "input": {"customer": "c-1", "items": items}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;

    let t = s.wait_for("g-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:?}", t.reason);
    assert!(svc.overlapped("/payment/charge", "/fraud/screen"), "the charge and the fraud check were open at once");
    assert!(!svc.overlapped("/inventory/reserve", "/payment/charge"), "the charge waited for every line");
    assert!(!svc.overlapped("/payment/charge", "/shipping/ship"), "ship waited for the charge");
    assert!(!svc.overlapped("/fraud/screen", "/shipping/ship"), "ship waited for the fraud check");
    let out = t.outputs();
    assert_eq!(out["fraud"]["verdict"], "clear", "{out}");
    assert!(out["charge"]["charge_id"].is_string(), "{out}");
    assert_eq!(out["reserve"].as_array().map(Vec::len), Some(12));
    // the branches are tasks of their own, each Processed
    let branches =
        s.deps.store.get_many(&[TaskId::child(&t.task_id, 1, 0), TaskId::child(&t.task_id, 1, 1)]).await.unwrap();
    assert_eq!(branches.len(), 2);
    assert!(branches.iter().all(|b| b.process_state == ProcessState::Processed), "{branches:?}");
    let b = books(&svc, "g-1");
    for op in ["charge", "screen", "ship"] {
        assert_eq!(b.get(&(op.into(), None)), Some(&1), "{op} once: {b:?}");
    }
    assert_eq!(b.len(), 15, "12 lines, charge, screen, ship and nothing else: {b:?}");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test]
async fn a_fraud_check_that_refuses_undoes_the_charge_beside_it_and_every_line() {
    let s = stack_with("graph-fraud", WorkflowRegistry::new([graph_workflow()]).unwrap()).await;
    let svc = OrderService::new();
    // the charge is still open when the fraud check refuses
    svc.add_fault(FaultRule { endpoint: Some("/payment/charge".into()), latency_ms: 1_500, ..FaultRule::default() });
    let runner = order_service_and_runner(&s, &svc).await;
    let items: Vec<Value> = (0..5).map(|i| json!({"sku": format!("sku-{i}")})).collect();
    let faults = json!({"/fraud/screen": {"permanent": "fraud suspected"}});
    let body = json!({"v": 1, "task_id": "g-2", "workflow": "lines-graph",
        "input": {"customer": "c-1", "items": items, "faults": faults}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;

    let t = s.wait_for("g-2", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Compensated, "{:?}", t.reason);
    assert!(
        t.history.iter().any(|h| h
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("branch fraud ended") && r.contains("fraud suspected"))),
        "{:?}",
        t.history
    );
    let b = books(&svc, "g-2");
    for line in 0..5 {
        assert_eq!(b.get(&("reserve".into(), Some(line))), Some(&1), "{b:?}");
        assert_eq!(b.get(&("release".into(), Some(line))), Some(&1), "line {line} released once: {b:?}");
    }
    let charged = b.get(&("charge".into(), None)).copied().unwrap_or(0);
    assert!(charged <= 1, "{b:?}");
    assert_eq!(
        b.get(&("refund".into(), None)).copied().unwrap_or(0),
        charged,
        "refunded exactly as often as charged: {b:?}"
    );
    assert!(!b.keys().any(|(op, _)| op == "ship" || op == "screen"), "nothing shipped, no verdict booked: {b:?}");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test]
async fn a_map_runs_as_a_branch_beside_the_charge_from_the_first_step() {
    // reserve (a map over the lines) and charge both start with the task; ship waits for both
    let mut wf = lines_workflow();
    wf.name = "lines-beside".into();
    wf.steps[0].after = Some(vec![]);
    wf.steps[1].after = Some(vec![]);
    wf.steps[2].after = Some(vec!["reserve".into(), "charge".into()]);
    wf.steps[1].timeout_ms = 30_000;
    let s = stack_with("map-branch", WorkflowRegistry::new([wf]).unwrap()).await;
    let svc = OrderService::new();
    svc.add_fault(FaultRule { endpoint: Some("/inventory/reserve".into()), latency_ms: 200, ..FaultRule::default() });
    // the charge is open for 15 s (of its 30 s timeout): long enough to still run when the map's
    // elements call reserve. On a loaded machine the first reserve came 2.2 s after the charge
    // started (the branch claimed, 8 elements created and claimed); a slower one takes twice that.
    svc.add_fault(FaultRule { endpoint: Some("/payment/charge".into()), latency_ms: 15_000, ..FaultRule::default() });
    let runner = order_service_and_runner(&s, &svc).await;
    let items: Vec<Value> = (0..8).map(|i| json!({"sku": format!("sku-{i}")})).collect();
    let body =
        json!({"v": 1, "task_id": "mb-1", "workflow": "lines-beside", "input": {"customer": "c-1", "items": items}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;

    let t = s.wait_for("mb-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:?}", t.reason);
    assert!(svc.overlapped("/inventory/reserve", "/payment/charge"), "the lines were reserved while the charge ran");
    let out = t.outputs()["reserve"].as_array().cloned().expect("the map's array");
    assert_eq!(out.len(), 8);
    // the map ran in the branch task mb-1~0~0; its elements are that branch's own
    let branch = TaskId::child(&t.task_id, 0, 0);
    let elements =
        s.deps.store.get_many(&(0..8).map(|i| TaskId::child(&branch, 0, i)).collect::<Vec<_>>()).await.unwrap();
    assert_eq!(elements.len(), 8);
    assert!(elements.iter().all(|e| e.process_state == ProcessState::Processed));
    let b = books(&svc, "mb-1");
    for i in 0..8 {
        assert_eq!(b.get(&("reserve".into(), Some(i))), Some(&1), "line {i} reserved once: {b:?}");
    }
    assert_eq!(b.get(&("charge".into(), None)), Some(&1));
    assert_eq!(b.get(&("ship".into(), None)), Some(&1));
    assert_eq!(b.len(), 10, "{b:?}");
    runner.shutdown().await;
    s.delete().await;
}
