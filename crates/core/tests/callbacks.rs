//! Callback and wait steps through the roles on the in-memory twins: the agent hands the token
//! over, the answer desk ([`callback::answer`]) takes heartbeats and answers, the Supervisor's
//! timer wakes a wait and expires an attempt whose heartbeats stopped. Milliseconds, no LocalStack.

use sas_core::agent::{self, AgentRuntime};
use sas_core::callback;
use sas_core::config::Settings;
use sas_core::submitter::{self, Submitted};
use sas_core::supervisor;
use sas_protocol::ids::{CallbackToken, Millis, TaskId};
use sas_protocol::messages::{AgentRequest, CallbackAnswer, CallbackMessage, CallbackResult};
use sas_protocol::protocol::{Policy, ProcessState, Task};
use sas_protocol::workflow::{Backoff, OnFailure, StepDef, StepKind, WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;
use serde_json::{json, Value};

fn step(name: &str) -> StepDef {
    StepDef {
        max_attempts: 2,
        backoff: Backoff { base_ms: 100, max_ms: 100, multiplier: 1.0 },
        ..StepDef::call(name, "sim", 5_000)
    }
}

/// `a` (call), `ship` (callback: 60 s hard, heartbeats every 10 s), `cool` (wait 30 s), `b`.
fn twins() -> Twins {
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "cb".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![
            step("a"),
            StepDef {
                kind: StepKind::Callback { agent: "sim".into(), heartbeat_ms: Some(10_000) },
                timeout_ms: 60_000,
                ..step("ship")
            },
            StepDef::wait("cool", 30_000),
            step("b"),
        ],
    };
    let settings = Settings {
        policy: Policy {
            pause_check_ms: Policy::default().pause_check_ms,
            key_check_ms: Policy::default().key_check_ms,
            start_timeout_ms: 1_000,
            history_limit: 50,
            queue_budget_ms: 0,
            result_grace_ms: 0,
            settle_ms: 0,
            unchecked_start_ms: 0,
            max_restarts: 8,
        },
        retention_days: 1,
        max_input_bytes: 1_024,
        ..Settings::default()
    };
    // The agent runtime checks its deadlines on the wall clock: the twins' clock starts now.
    Twins::new(WorkflowRegistry::new([wf]).unwrap(), settings, Millis::now())
}

fn task(tw: &Twins, id: &str) -> Task {
    tw.store.tasks().into_iter().find(|t| t.task_id.as_str() == id).expect("task exists")
}

fn take(tw: &Twins, url: &str) -> Vec<String> {
    tw.bus.take(url)
}

/// Run the agent role on every request in the agent queue.
async fn agents(tw: &Twins) -> Vec<AgentRequest> {
    let rt = AgentRuntime::with_builtins();
    let mut seen = Vec::new();
    for raw in take(tw, &tw.deps.resources.agent_queue_url) {
        agent::handle(&tw.deps, &rt, &raw).await.unwrap();
        seen.push(serde_json::from_str(&raw).unwrap());
    }
    seen
}

/// Hand every scheduler-queue message to the Scheduler.
async fn scheduler(tw: &Twins) {
    for raw in take(tw, &tw.deps.resources.scheduler_queue_url) {
        sas_core::scheduler::schedule(&tw.deps, &raw).await.unwrap();
    }
}

/// Fire every due timer.
async fn timers(tw: &Twins) -> usize {
    let due = take(tw, &tw.deps.resources.supervisor_queue_url);
    for raw in &due {
        supervisor::timer(&tw.deps, raw).await.unwrap();
    }
    due.len()
}

fn msg(token: &CallbackToken, answer: CallbackAnswer) -> CallbackMessage {
    CallbackMessage { v: 1, token: token.clone(), answer }
}

/// Submitted, `a` done: the task waits for `ship`'s answer; returns its token.
async fn shipping(tw: &Twins, id: &str) -> CallbackToken {
    let sub = json!({"v": 1, "task_id": id, "workflow": "cb", "input": {}}).to_string();
    assert!(matches!(submitter::submit(&tw.deps, &sub).await.unwrap(), Submitted::Created(_)));
    agents(tw).await;
    scheduler(tw).await;
    let reqs = agents(tw).await;
    assert_eq!(reqs.len(), 1);
    assert!(
        take(tw, &tw.deps.resources.scheduler_queue_url).is_empty(),
        "a hand-off that was accepted reports nothing"
    );
    reqs[0].callback.clone().expect("ship is a callback step").token
}

#[tokio::test]
async fn a_callback_step_heartbeats_answers_and_a_wait_wakes_by_its_timer() {
    let tw = twins();
    let t0 = tw.deps.now();
    let token = shipping(&tw, "c1").await;
    assert_eq!(task(&tw, "c1").current_step_name(), Some("ship"));
    let beat = || CallbackAnswer::Heartbeat { details: Some(json!({"packed": 3})) };
    // early heartbeats are taken without a write; the one past half the window moves the deadline
    let saves = tw.store.calls("save");
    for s in 1..=4 {
        tw.clock.advance(1_000);
        let r = callback::answer(&tw.deps, &msg(&token, beat()), None).await.unwrap();
        assert_eq!(
            (r.result, r.stop, r.complete_by),
            (CallbackResult::Alive, false, Some(t0.plus_ms(10_000))),
            "beat {s}"
        );
    }
    assert_eq!(tw.store.calls("save"), saves, "no write for heartbeats early in the window");
    tw.clock.advance(2_000);
    let r = callback::answer(&tw.deps, &msg(&token, beat()), None).await.unwrap();
    assert_eq!((r.result, r.complete_by), (CallbackResult::Alive, Some(t0.plus_ms(16_000))));
    assert_eq!(tw.store.calls("save"), saves + 1);
    assert_eq!(task(&tw, "c1").steps[1].progress, Some(json!({"packed": 3})));
    // the old deadline's timer fires: the heartbeat moved it, so the timer waits again
    tw.clock.advance(4_000);
    assert!(timers(&tw).await >= 1, "the deadline timer fired");
    assert_eq!(task(&tw, "c1").process_state, ProcessState::Processing);
    // the warehouse confirms
    let done = CallbackAnswer::Succeeded { output: json!({"tracking": "Z9"}) };
    let r = callback::answer(&tw.deps, &msg(&token, done.clone()), None).await.unwrap();
    assert_eq!((r.result, r.state), (CallbackResult::Applied, Some(ProcessState::Processing)));
    assert_eq!(task(&tw, "c1").current_step_name(), Some("cool"));
    let again = callback::answer(&tw.deps, &msg(&token, done), None).await.unwrap();
    assert_eq!(
        (again.result, again.stop),
        (CallbackResult::Duplicate, false),
        "a sender's retry is answered as success"
    );
    // the wait: no agent, one timer; it wakes at its instant, not before
    assert!(agents(&tw).await.is_empty());
    assert_eq!(task(&tw, "c1").complete_by, Some(t0.plus_ms(40_000)));
    tw.clock.advance(29_999);
    timers(&tw).await;
    assert_eq!(task(&tw, "c1").current_step_name(), Some("cool"));
    tw.clock.advance(1);
    timers(&tw).await;
    assert_eq!(task(&tw, "c1").current_step_name(), Some("b"));
    agents(&tw).await;
    scheduler(&tw).await;
    let t = task(&tw, "c1");
    assert_eq!((t.process_state, t.failure_count, t.late.count), (ProcessState::Processed, 0, 0));
    // an answer for a task that ended is told to stop
    let r = callback::answer(&tw.deps, &msg(&token, beat()), None).await.unwrap();
    assert_eq!((r.result, r.stop), (CallbackResult::Cancelled, true));
}

#[tokio::test]
async fn heartbeats_that_stop_are_noticed_by_the_timer_and_the_old_token_is_then_stale() {
    let tw = twins();
    let token = shipping(&tw, "c2").await;
    tw.clock.advance(10_000);
    assert!(timers(&tw).await >= 1, "the deadline timer fired");
    let t = task(&tw, "c2");
    assert_eq!(t.process_state, ProcessState::Pending, "expired: waiting for its retry");
    assert!(t.reason.as_deref().unwrap().contains("sent no heartbeat"), "{:?}", t.reason);
    let r = callback::answer(&tw.deps, &msg(&token, CallbackAnswer::Heartbeat { details: None }), None).await.unwrap();
    assert_eq!((r.result, r.stop), (CallbackResult::Stale, true));
    // the retry hands a new token over
    tw.clock.advance(100);
    scheduler(&tw).await;
    let reqs = agents(&tw).await;
    let new = reqs[0].callback.clone().unwrap().token;
    assert_ne!(new.attempt(), token.attempt());
    assert_eq!(reqs[0].idempotency_key.as_str(), "c2:ship");
}

#[tokio::test]
async fn an_answer_nobody_can_route_is_unknown_and_a_malformed_one_is_refused() {
    let tw = twins();
    let token = shipping(&tw, "c3").await;
    let other = CallbackToken::new(&TaskId::try_from("nope").unwrap(), "ship", token.attempt());
    let r = callback::answer(&tw.deps, &msg(&other, CallbackAnswer::Succeeded { output: Value::Null }), None)
        .await
        .unwrap();
    assert_eq!((r.result, r.stop), (CallbackResult::Unknown, true));
    for bad in [
        r#"{"v":1,"token":"x","status":"succeeded"}"#.to_owned(),
        json!({"v": 1, "token": token.expose(), "status": "done"}).to_string(),
        json!({"v": 1, "token": token.expose(), "status": "failed"}).to_string(),
        json!({"v": 2, "token": token.expose(), "status": "heartbeat"}).to_string(),
        json!({"v": 1, "token": token.expose(), "status": "heartbeat", "extra": 1}).to_string(),
    ] {
        let e = callback::parse(&bad).unwrap_err();
        assert!(matches!(e, sas_core::deps::HandlerError::Malformed(_)), "{bad}: {e}");
        assert!(!e.to_string().contains(token.attempt().as_str()), "the secret is not echoed: {e}");
    }
    let ok = callback::parse(&json!({"v": 1, "token": token.expose(), "status": "failed", "error": "x"}).to_string())
        .unwrap();
    assert_eq!(ok.answer, CallbackAnswer::Failed { error: "x".into(), retryable: false });
}

#[tokio::test]
async fn an_answer_whose_sends_failed_is_sent_again_when_the_worker_retries() {
    let tw = twins();
    let token = shipping(&tw, "c4").await;
    take(&tw, &tw.deps.resources.supervisor_queue_url);
    let done = msg(&token, CallbackAnswer::Succeeded { output: json!({}) });
    // the write lands (ship done, the wait begins), then its timer cannot be sent: a 5xx
    tw.bus.fail_sends("*", 1);
    assert!(callback::answer(&tw.deps, &done, None).await.is_err());
    assert_eq!(task(&tw, "c4").current_step_name(), Some("cool"));
    tw.bus.clear_send_failures();
    // the worker retries (over HTTPS there is no message id): a duplicate, and the wait's timer
    // it owes is sent this time (the answer itself marks its write)
    let again = callback::answer(&tw.deps, &done, None).await.unwrap();
    assert_eq!(again.result, CallbackResult::Duplicate);
    tw.clock.advance(30_000);
    assert!(timers(&tw).await >= 1, "the wait's timer was sent");
    assert_eq!(task(&tw, "c4").current_step_name(), Some("b"));
}
