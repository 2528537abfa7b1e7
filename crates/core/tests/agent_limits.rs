//! `max_in_flight` in the agent handler, on the twins: a request that finds its agent full
//! waits on the agent queue (no result, no failure); one that waited past its start_by says
//! so (not started); a held slot is given back after the call.

use serde_json::json;

use sas_core::agent::{self, AgentRuntime};
use sas_core::config::Settings;
use sas_core::store::{Acquire, TaskWriter};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome, SchedulerMessage};
use sas_protocol::workflow::WorkflowRegistry;
use sas_testkit::twins::Twins;

fn twins() -> Twins {
    Twins::new(WorkflowRegistry::new([]).unwrap(), Settings::default(), Millis::now())
}

fn outcomes(tw: &Twins) -> Vec<Outcome> {
    tw.bus
        .take(&tw.deps.resources.scheduler_queue_url)
        .iter()
        .map(|b| match serde_json::from_str(b).unwrap() {
            SchedulerMessage::Result(r) => r.outcome,
            other => panic!("not a result: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_request_for_a_full_agent_waits_on_the_agent_queue_then_runs_and_gives_its_slot_back() {
    let tw = twins();
    let mut rt = AgentRuntime::with_builtins();
    rt.set_limit("sim", 1);
    let now = tw.deps.now();
    let other = tw.deps.limiter.acquire("sim", 1, "other", now.plus_ms(60_000), now).await.unwrap();
    assert_eq!(other, Acquire::Taken { reclaimed: 0 });
    let req =
        AgentRequest::first_attempt(TaskId::try_from("t1").unwrap(), "charge", "sim", json!({}), now.plus_ms(60_000));
    tw.hold(&req.task_id, "charge", "sim", &req.attempt).await;
    let body = serde_json::to_string(&req).unwrap();

    assert!(!agent::handle_sent(&tw.deps, &rt, &body, Some(now)).await.unwrap(), "nothing sent back");
    assert!(outcomes(&tw).is_empty(), "waiting is no failure");
    let waiting = tw.bus.take(&tw.deps.resources.agent_queue_url);
    assert_eq!(waiting.len(), 1, "sent back to the agent queue");
    let again: AgentRequest = serde_json::from_str(&waiting[0]).unwrap();
    assert_eq!((again.waits, again.waiting_since), (1, Some(now)));
    assert_eq!(again.attempt, req.attempt, "the same attempt");

    // the other call ends: the request runs, and gives its slot back
    tw.deps.limiter.release("sim", "other").await.unwrap();
    assert!(agent::handle_sent(&tw.deps, &rt, &waiting[0], None).await.unwrap());
    assert!(matches!(outcomes(&tw).as_slice(), [Outcome::Succeeded { .. }]));
    assert!(tw.deps.limiter.leases("sim").await.unwrap().is_empty());
}

/// An agent that counts its calls and answers at once.
#[derive(Default)]
struct Counting(std::sync::atomic::AtomicU32);

impl sas_core::agent::Agent for Counting {
    fn call<'a>(
        &'a self,
        _: sas_core::agent::Call<'a>,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, sas_core::agent::AgentError>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(json!({"ok": true})) })
    }
}

/// A copy of a request whose task has moved on (retried with a new token, cancelled, ended,
/// gone) starts nothing: no call, no report, its slot given back. The attempt the task waits
/// for runs. This is what bounds when a call of an attempt can still apply, once the task stops
/// waiting for it (the protocol's `settled_at`).
#[tokio::test]
async fn a_copy_of_a_request_whose_task_moved_on_starts_nothing() {
    let tw = twins();
    let counting = std::sync::Arc::new(Counting::default());
    let mut rt = AgentRuntime::default();
    rt.register_arc("counted", counting.clone());
    rt.set_limit("counted", 1);
    let now = tw.deps.now();
    let task_id = TaskId::try_from("moved-on").unwrap();
    let req = |attempt: &str| {
        AgentRequest::first_attempt(task_id.clone(), "charge", "counted", json!({}), now.plus_ms(60_000))
            .with_attempt(sas_protocol::ids::AttemptToken::from(attempt))
    };
    let body = |r: &AgentRequest| serde_json::to_string(r).unwrap();
    // no such task
    assert!(!agent::handle_sent(&tw.deps, &rt, &body(&req("a1")), Some(now)).await.unwrap());
    // the task is held by a later attempt (a retry): the copy of the first is stale
    let task = tw.hold(&task_id, "charge", "counted", &sas_protocol::ids::AttemptToken::from("a2")).await;
    assert!(!agent::handle_sent(&tw.deps, &rt, &body(&req("a1")), Some(now)).await.unwrap());
    // held by no attempt (cancelled, given up, ended)
    let mut unlocked = task.clone();
    unlocked.lock.locked_by = None;
    unlocked.rev += 1;
    tw.store.save(&unlocked, &task).await.unwrap();
    assert!(!agent::handle_sent(&tw.deps, &rt, &body(&req("a2")), Some(now)).await.unwrap());
    // the check cannot be made (the table throttles): the record fails and comes back
    tw.store.fail_next(
        sas_core::store::StoreOp::Get,
        sas_core::store::StoreError::Backend { op: "GetItem", message: "throttled".into(), source: None },
    );
    assert!(agent::handle_sent(&tw.deps, &rt, &body(&req("a2")), Some(now)).await.is_err());
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was called");
    assert!(outcomes(&tw).is_empty(), "nothing was reported");
    assert!(tw.deps.limiter.leases("counted").await.unwrap().is_empty(), "every slot taken was given back");
    // the attempt the task waits for runs
    let mut held = unlocked.clone();
    held.lock.locked_by = Some(sas_protocol::ids::AttemptToken::from("a3"));
    held.rev += 1;
    tw.store.save(&held, &unlocked).await.unwrap();
    assert!(agent::handle_sent(&tw.deps, &rt, &body(&req("a3")), Some(now)).await.unwrap());
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(matches!(outcomes(&tw).as_slice(), [Outcome::Succeeded { .. }]));
}

/// A request that arrives within its `unchecked_until` (its claim plus `UNCHECKED_START_MS`)
/// starts without reading its task: no `GetItem`, even for a copy whose task moved on (the
/// protocol allows for it before a compensation starts). Past that instant it reads first, and
/// the copy starts nothing.
#[tokio::test]
async fn a_fresh_request_starts_unread_and_a_late_copy_reads_first() {
    let tw = twins();
    let counting = std::sync::Arc::new(Counting::default());
    let mut rt = AgentRuntime::default();
    rt.register_arc("counted", counting.clone());
    let now = tw.deps.now();
    let task_id = TaskId::try_from("fresh").unwrap();
    let held_by = sas_protocol::ids::AttemptToken::from("a2");
    tw.hold(&task_id, "charge", "counted", &held_by).await;
    let copy = |unchecked_until: Option<Millis>| {
        let mut r = AgentRequest::first_attempt(task_id.clone(), "charge", "counted", json!({}), now.plus_ms(60_000))
            .with_attempt(sas_protocol::ids::AttemptToken::from("a1"));
        r.unchecked_until = unchecked_until;
        serde_json::to_string(&r).unwrap()
    };
    let calls = || counting.0.load(std::sync::atomic::Ordering::SeqCst);
    // fresh: a read would fail (the table throttles), but none is made, and the call runs
    let throttled =
        || sas_core::store::StoreError::Backend { op: "GetItem", message: "throttled".into(), source: None };
    tw.store.fail_next(sas_core::store::StoreOp::Get, throttled());
    assert!(agent::handle_sent(&tw.deps, &rt, &copy(Some(now.plus_ms(2_000))), Some(now)).await.unwrap());
    assert_eq!(calls(), 1, "started without the read");
    assert!(matches!(outcomes(&tw).as_slice(), [Outcome::Succeeded { .. }]));
    // the same copy at its unchecked_until reads first: the read fails, the record comes back
    assert!(agent::handle_sent(&tw.deps, &rt, &copy(Some(now)), Some(now)).await.is_err());
    // read: the task is held by another attempt, so the copy starts nothing
    assert!(!agent::handle_sent(&tw.deps, &rt, &copy(Some(now)), Some(now)).await.unwrap());
    // and without the field (a copy sent again, or by an older Scheduler) it always reads
    assert!(!agent::handle_sent(&tw.deps, &rt, &copy(None), Some(now)).await.unwrap());
    assert_eq!(calls(), 1, "no other call");
    assert!(outcomes(&tw).is_empty(), "nothing else reported");
}

#[tokio::test]
async fn a_request_that_waited_past_its_start_by_says_it_did_not_start() {
    let tw = twins();
    let rt = AgentRuntime::with_builtins();
    let now = tw.deps.now();
    let mut req =
        AgentRequest::first_attempt(TaskId::try_from("t2").unwrap(), "charge", "sim", json!({}), now.plus_ms(60_000));
    req.start_by = Some(Millis(now.0 - 1_000));
    req.waits = 3;
    let body = serde_json::to_string(&req).unwrap();
    assert!(agent::handle_sent(&tw.deps, &rt, &body, Some(Millis(now.0 - 5_000))).await.unwrap());
    match outcomes(&tw).as_slice() {
        [Outcome::NotStarted { error }] => {
            assert!(error.contains("3 times sent back to wait for a slot of agent sim"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    // past CompleteBy nothing may be sent
    req.complete_by = Millis(now.0 - 1);
    let body = serde_json::to_string(&req).unwrap();
    assert!(!agent::handle_sent(&tw.deps, &rt, &body, None).await.unwrap());
    assert!(outcomes(&tw).is_empty());
}

/// An agent with a `rate`: the first call takes the first slot and runs; the next one's slot is a
/// minute away (1 a minute), too far to sleep for: the request goes back to the agent queue to
/// wait (no result, no failure), delayed until about its slot, and counts its wait.
#[tokio::test]
async fn a_request_whose_slot_of_its_agent_s_rate_is_far_waits_on_the_agent_queue() {
    let tw = twins();
    let counting = std::sync::Arc::new(Counting::default());
    let mut rt = AgentRuntime::default();
    rt.register_arc("paced", counting.clone());
    let spec = sas_core::limit::RateSpec { per_second: None, per_minute: Some(1), burst: None };
    rt.set_rate("paced", sas_core::limit::Rate::of(&spec).unwrap());
    let now = tw.deps.now();
    let mut bodies = Vec::new();
    for i in 0..2 {
        let req = AgentRequest::first_attempt(
            TaskId::try_from(format!("paced-{i}")).unwrap(),
            "notify",
            "paced",
            json!({}),
            now.plus_ms(300_000),
        );
        tw.hold(&req.task_id, "notify", "paced", &req.attempt).await;
        bodies.push(serde_json::to_string(&req).unwrap());
    }
    assert!(agent::handle_sent(&tw.deps, &rt, &bodies[0], Some(now)).await.unwrap(), "the first runs");
    assert!(!agent::handle_sent(&tw.deps, &rt, &bodies[1], Some(now)).await.unwrap(), "the second waits");
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1, "one call");
    assert!(matches!(outcomes(&tw).as_slice(), [Outcome::Succeeded { .. }]), "waiting is no failure");
    let waiting = tw.bus.take(&tw.deps.resources.agent_queue_url);
    assert_eq!(waiting.len(), 1, "sent back to the agent queue");
    let again: AgentRequest = serde_json::from_str(&waiting[0]).unwrap();
    assert_eq!((again.waits, again.waiting_since), (1, Some(now)));
}
