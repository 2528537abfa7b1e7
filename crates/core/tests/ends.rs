//! A map's element ends that one batch brings to their parent are applied together and written
//! once (`role::handle_group`), on the in-memory twins: one conditional write on the parent for
//! the batch instead of one per end, the same parent as ends handled one by one, duplicates
//! counted once, and a lost write re-decided for the whole group.

use sas_core::agent::AgentRuntime;
use sas_core::config::Settings;
use sas_core::deps::HandlerError;
use sas_core::role::{self, Record, Role};
use sas_core::store::{StoreError, StoreOp};
use sas_core::{scheduler, submitter};
use sas_protocol::ids::Millis;
use sas_protocol::messages::{AgentRequest, AgentResult, Outcome, SchedulerMessage};
use sas_protocol::protocol::{Policy, ProcessState, Task};
use sas_protocol::workflow::{MapSpec, OnFailure, StepDef, Tolerance, WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;
use serde_json::json;

const T0: Millis = Millis(1_700_000_000_000);
const LINES: u32 = 4;

fn twins() -> Twins {
    twins_running(LINES)
}

/// The twins with the `lines` workflow, `max_concurrency` elements of its map at once.
fn twins_running(max_concurrency: u32) -> Twins {
    let mut reserve = StepDef::call("reserve", "a", 5_000);
    reserve.map = Some(MapSpec {
        items: "/input/items".into(),
        max_concurrency,
        tolerated_failures: Tolerance::None,
        timeout_ms: None,
    });
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "lines".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![reserve],
    };
    let settings = Settings {
        policy: Policy { queue_budget_ms: 0, result_grace_ms: 0, settle_ms: 0, ..Policy::default() },
        ..Settings::default()
    };
    Twins::new(WorkflowRegistry::new([wf]).unwrap(), settings, T0)
}

fn parent(tw: &Twins, id: &str) -> Task {
    tw.store.tasks().into_iter().find(|t| t.task_id.as_str() == id).expect("the parent exists")
}

/// Submit a map over `LINES` lines and run every element to success, keeping the ends the
/// elements send their parent (not handled): the batch the Scheduler would receive.
async fn ends_of_a_map(tw: &Twins, id: &str) -> Vec<String> {
    let items: Vec<_> = (0..LINES).map(|i| json!({"sku": i})).collect();
    let body = json!({"v": 1, "task_id": id, "workflow": "lines", "input": {"items": items}}).to_string();
    submitter::submit(&tw.deps, &body).await.unwrap();
    let r = tw.deps.resources.clone();
    let ends_queue = r.ends_queue_url.clone().expect("the twins have an ends queue");
    let mut ends = Vec::new();
    for _ in 0..20 {
        let (runs, calls) = (tw.bus.take(&r.scheduler_queue_url), tw.bus.take(&r.agent_queue_url));
        let came = tw.bus.take(&ends_queue);
        if runs.is_empty() && calls.is_empty() && came.is_empty() {
            break;
        }
        assert!(came.iter().all(|b| ended(b)), "only ends on the ends queue: {came:?}");
        ends.extend(came);
        for b in runs {
            assert!(!ended(&b), "an end on the scheduler queue: {b}");
            scheduler::schedule(&tw.deps, &b).await.unwrap();
        }
        for b in calls {
            let req: AgentRequest = serde_json::from_str(&b).unwrap();
            let res = SchedulerMessage::Result(AgentResult {
                v: 1,
                task_id: req.task_id.clone(),
                step: req.step.clone(),
                attempt: req.attempt.clone(),
                outcome: Outcome::Succeeded { output: json!({"line": req.task_id.as_str()}) },
            });
            scheduler::schedule(&tw.deps, &serde_json::to_string(&res).unwrap()).await.unwrap();
        }
    }
    assert_eq!(ends.len(), LINES as usize, "every element ended and told its parent");
    ends
}

fn records(bodies: &[String]) -> Vec<Record> {
    let record = |(i, b): (usize, &String)| Record {
        message_id: format!("m-{i}"),
        body: b.clone(),
        receive_count: 1,
        sent_at: None,
        trace_header: None,
    };
    bodies.iter().enumerate().map(record).collect()
}

async fn handle_together(tw: &Twins, records: &[Record]) {
    let agents = AgentRuntime::default();
    let outcomes = role::handle_group(&tw.deps, &agents, role::open_all(Role::Scheduler, records)).await;
    assert_eq!(outcomes.len(), records.len());
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
}

#[tokio::test]
async fn the_ends_of_one_batch_are_one_write_on_their_parent() {
    let tw = twins();
    let ends = ends_of_a_map(&tw, "p1").await;
    let saves = tw.store.calls("save");
    handle_together(&tw, &records(&ends)).await;
    assert_eq!(tw.store.calls("save") - saves, 1, "one write for {LINES} ends");
    let p = parent(&tw, "p1");
    let map = p.steps[0].map.as_ref().unwrap();
    assert_eq!((map.ended.count(), map.ok.count(), map.failed), (LINES, LINES, 0));
    assert!(map.joining, "the last end joins the map");
    assert_eq!(p.last_message.as_deref(), Some(sas_protocol::ids::message_mark(&format!("m-{}", LINES - 1)).as_str()));
    let join: Vec<String> = tw.bus.take(&tw.deps.resources.scheduler_queue_url);
    assert_eq!(join.len(), 1, "the join is sent once: {join:?}");

    // the same ends one by one: the same parent, one write each
    let tw2 = twins();
    let ends = ends_of_a_map(&tw2, "p1").await;
    let saves = tw2.store.calls("save");
    for r in &records(&ends) {
        role::handle(Role::Scheduler, &tw2.deps, &AgentRuntime::default(), r).await.unwrap();
    }
    assert_eq!(tw2.store.calls("save") - saves, u64::from(LINES));
    let q = parent(&tw2, "p1");
    assert_eq!(q.steps[0].map, p.steps[0].map);
    assert_eq!(q.process_state, p.process_state);
}

#[tokio::test]
async fn an_end_delivered_twice_in_one_batch_counts_once_and_a_lost_write_re_decides_the_group() {
    let tw = twins();
    let mut ends = ends_of_a_map(&tw, "p2").await;
    ends.insert(1, ends[0].clone());
    let mut rs = records(&ends);
    rs[1].message_id = rs[0].message_id.clone();
    // another writer changed the parent since it was read: the group's write is lost once
    let current = parent(&tw, "p2");
    tw.store.fail_next(StoreOp::Save, StoreError::Conflict { current: Some(Box::new(current)) });
    let saves = tw.store.calls("save");
    handle_together(&tw, &rs).await;
    assert_eq!(tw.store.calls("save") - saves, 2, "the lost write and the one re-decided");
    let p = parent(&tw, "p2");
    let map = p.steps[0].map.as_ref().unwrap();
    assert_eq!((map.ended.count(), map.ok.count()), (LINES, LINES));
    assert_eq!(p.process_state, ProcessState::Processing);
    assert!(map.joining);
}

#[tokio::test]
async fn a_group_whose_write_fails_for_now_fails_every_record_and_its_redelivery_counts_each_once() {
    let tw = twins();
    let ends = ends_of_a_map(&tw, "p3").await;
    let rs = records(&ends);
    tw.store.fail_next(StoreOp::Save, StoreError::Backend { op: "save", message: "throttled".into(), source: None });
    let saves = tw.store.calls("save");
    let agents = AgentRuntime::default();
    let outcomes = role::handle_group(&tw.deps, &agents, role::open_all(Role::Scheduler, &rs)).await;
    // not handled again one by one (a write each, racing the other writers): all delivered again
    assert_eq!(tw.store.calls("save") - saves, 1, "only the failed write");
    assert!(matches!(outcomes[0], Err(HandlerError::Store(_))), "{outcomes:?}");
    assert!(
        outcomes[1..].iter().all(|o| matches!(o, Err(HandlerError::WithRun(why)) if why.contains("throttled"))),
        "{outcomes:?}"
    );
    assert_eq!(parent(&tw, "p3").steps[0].map.as_ref().unwrap().ended.count(), 0, "nothing counted yet");
    // SQS delivers them again
    handle_together(&tw, &rs).await;
    let map = parent(&tw, "p3").steps[0].map.clone().unwrap();
    assert_eq!((map.ended.count(), map.ok.count()), (LINES, LINES));
    assert!(map.joining);
}

/// Whether a scheduler-queue body is the end of an element (or branch).
fn ended(body: &str) -> bool {
    let record = sas_core::role::Record::new("m", body);
    sas_core::envelope::Envelope::open(Role::Scheduler, &record).ended_parent().is_some()
}

/// An element the store fails to create is a store error for the handler (retried, or
/// dead-lettered when it can never be stored), not a bus error: the record fails and comes back.
#[tokio::test]
async fn an_element_the_store_cannot_create_fails_the_record_as_a_store_error() {
    let tw = twins_running(1);
    let items: Vec<_> = (0..2).map(|i| json!({"sku": i})).collect();
    let body = json!({"v": 1, "task_id": "p9", "workflow": "lines", "input": {"items": items}}).to_string();
    submitter::submit(&tw.deps, &body).await.unwrap();
    let r = tw.deps.resources.clone();
    // the first element runs (after the run messages the start sends); its success ends it
    let mut calls = Vec::new();
    for _ in 0..10 {
        for b in tw.bus.take(&r.scheduler_queue_url) {
            scheduler::schedule(&tw.deps, &b).await.unwrap();
        }
        calls = tw.bus.take(&r.agent_queue_url);
        if !calls.is_empty() {
            break;
        }
    }
    assert_eq!(calls.len(), 1, "one element at once: {calls:?}");
    let req: AgentRequest = serde_json::from_str(&calls[0]).unwrap();
    let res = SchedulerMessage::Result(AgentResult {
        v: 1,
        task_id: req.task_id.clone(),
        step: req.step.clone(),
        attempt: req.attempt.clone(),
        outcome: Outcome::Succeeded { output: json!({}) },
    });
    scheduler::schedule(&tw.deps, &serde_json::to_string(&res).unwrap()).await.unwrap();
    let ends = tw.bus.take(&r.ends_queue_url.clone().unwrap());
    assert_eq!(ends.len(), 1, "the element told its parent: {ends:?}");
    // its end makes the parent start the second element, whose create fails
    tw.store
        .fail_next(StoreOp::Create, StoreError::Backend { op: "PutItem", message: "throttled".into(), source: None });
    let err = scheduler::schedule(&tw.deps, &ends[0]).await.expect_err("the element was not created");
    assert!(
        matches!(&err, HandlerError::Store(StoreError::Backend { op: "PutItem", .. })),
        "a store error, as the store said it: {err:?}"
    );
}
