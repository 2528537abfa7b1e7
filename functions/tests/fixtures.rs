//! Every fixture in `events/` through the functions' one handler, on the in-memory twins.

use std::path::PathBuf;

use sas_core::agent::{AgentRuntime, BUILT_IN_AGENTS};
use sas_core::config::Settings;
use sas_core::role::Role;
use sas_functions::{handle_event, parse_event, EventError, Invocation};
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::protocol::{self, Ctx, Policy, ProcessState};
use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
use sas_testkit::twins::Twins;
use serde_json::{json, Value};

/// 2024-01-01T00:05:00Z, after every fixture's `complete_by`.
const FIXTURE_NOW: Millis = Millis(1_704_067_500_000);

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../events").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .expect("fixtures are JSON")
}

fn twins() -> Twins {
    Twins::new(WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap(), Settings::default(), FIXTURE_NOW)
}

fn agents() -> AgentRuntime {
    AgentRuntime::from_config(BUILT_IN_AGENTS, &|_| None).unwrap()
}

async fn invoke(tw: &Twins, role: Role, event: Value) -> Value {
    handle_event(role, &tw.deps, &agents(), event).await.expect("a recognised event").to_json()
}

fn no_failures() -> Value {
    json!({"batchItemFailures": []})
}

#[tokio::test]
async fn a_submission_creates_the_task_and_starts_its_first_step() {
    let tw = twins();
    assert_eq!(invoke(&tw, Role::Submitter, fixture("submitter-sqs.json")).await, no_failures());
    let tasks = tw.store.tasks();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].task_id.as_str(), "fixture-1");
    assert_eq!(tasks[0].process_state, ProcessState::Processing);
    assert!(tw.bus.bodies(&tw.deps.resources.scheduler_queue_url).is_empty(), "no run message");
    let requests = tw.bus.bodies(&tw.deps.resources.agent_queue_url);
    assert_eq!(requests.len(), 1);
    assert!(requests[0].contains(r#""task_id":"fixture-1""#), "{requests:?}");
}

#[tokio::test]
async fn malformed_submissions_are_kept_in_the_dlq_with_their_reason_and_not_retried() {
    for (name, reason) in [
        ("submitter-sqs-malformed.json", "the message is not JSON"),
        ("submitter-sqs-long-reason.json", "unknown workflow"),
    ] {
        let tw = twins();
        assert_eq!(invoke(&tw, Role::Submitter, fixture(name)).await, no_failures(), "{name}");
        assert!(tw.store.tasks().is_empty());
        let dlq = &tw.deps.resources.submission_dlq_url;
        assert_eq!(tw.bus.depth(dlq), 1, "{name}");
        let attrs = &tw.bus.attributes(dlq)[0];
        let kept = attrs.iter().find(|(k, _)| k == "RejectReason").map(|(_, v)| v.clone()).expect("a reason");
        assert!(kept.contains(reason), "{name}: {kept}");
        assert!(kept.len() <= 1024, "{name}: the reason is clipped to 1024 bytes, got {}", kept.len());
    }
}

#[tokio::test]
async fn a_run_message_for_a_missing_task_is_dropped() {
    let tw = twins();
    assert_eq!(invoke(&tw, Role::Scheduler, fixture("scheduler-sqs.json")).await, no_failures());
    assert_eq!(tw.bus.depth(&tw.deps.resources.agent_queue_url), 0);
}

#[tokio::test]
async fn in_a_batch_only_the_record_that_may_succeed_later_is_returned() {
    // record 0 meets a store that is down (worth another delivery); record 1 can never parse:
    // it goes to the scheduler's DLQ at once with its reason, and is not redelivered
    let tw = twins();
    tw.store.fail_next(
        sas_core::store::StoreOp::Get,
        sas_core::store::StoreError::Backend { op: "GetItem", message: "throttled".into(), source: None },
    );
    let ev = fixture("scheduler-sqs-partial-failure.json");
    let retry_id = ev["Records"][0]["messageId"].clone();
    assert_eq!(invoke(&tw, Role::Scheduler, ev).await, json!({"batchItemFailures": [{"itemIdentifier": retry_id}]}));
    let dlq = tw.deps.resources.scheduler_dlq_url.clone().unwrap();
    assert_eq!(tw.bus.depth(&dlq), 1);
    let reason = tw.bus.attributes(&dlq)[0].iter().find(|(k, _)| k == "RejectReason").map(|(_, v)| v.clone());
    assert!(reason.is_some_and(|r| r.starts_with("malformed message")));
}

#[tokio::test]
async fn an_agent_request_past_its_complete_by_starts_nothing_and_sends_nothing() {
    let tw = twins();
    assert_eq!(invoke(&tw, Role::Agent, fixture("agent-sqs.json")).await, no_failures());
    assert_eq!(tw.bus.depth(&tw.deps.resources.scheduler_queue_url), 0);
}

/// A task of the `order` workflow whose first attempt (the fixtures' token) has timed out.
fn timed_out_task(tw: &Twins) {
    let wf = tw.deps.workflows.resolve("order", None).unwrap().clone();
    let policy = Policy::default();
    let ctx = Ctx {
        paused: false,
        now: Millis(1_704_067_380_000),
        fresh_token: AttemptToken::from("0f8e7d6c5b4a39281706f5e4d3c2b1a0"),
        jitter: 0.5,
    };
    let claimed =
        protocol::submit(TaskId::try_from("fixture-missing").unwrap(), wf, json!({}), None, &ctx, &policy).task;
    // the twins' clock goes past its CompleteBy and the result grace
    let due = claimed.complete_by.unwrap().plus_ms(tw.deps.settings.policy.result_grace_ms);
    tw.clock.set(due.plus_ms(1).max(FIXTURE_NOW));
    tw.store.put_unchecked(claimed);
}

#[tokio::test]
async fn the_deadline_timer_recovers_its_attempt_and_ignores_a_missing_task() {
    let tw = twins();
    assert_eq!(invoke(&tw, Role::Supervisor, fixture("supervisor-sqs.json")).await, no_failures());
    timed_out_task(&tw);
    assert_eq!(invoke(&tw, Role::Supervisor, fixture("supervisor-sqs.json")).await, no_failures());
    let t = &tw.store.tasks()[0];
    assert_eq!(
        (t.process_state, t.failure_count),
        (ProcessState::Pending, 1),
        "the timed-out attempt counts and retries"
    );
}

#[tokio::test]
async fn the_scheduled_event_sweeps_the_index() {
    let tw = twins();
    let report = invoke(&tw, Role::Supervisor, fixture("supervisor-scheduled.json")).await;
    assert_eq!(report, json!({"expired": 0, "handed": 0, "errors": 0, "scheduled": 0}));
    timed_out_task(&tw);
    tw.clock.advance(tw.deps.settings.sweep_lag_ms);
    let report = invoke(&tw, Role::Supervisor, fixture("supervisor-scheduled.json")).await;
    assert_eq!(report, json!({"expired": 1, "handed": 1, "errors": 0, "scheduled": 0}));
    // handed to the timer queue, where the Supervisor decides
    let timers = tw.bus.take(&tw.deps.resources.supervisor_queue_url);
    assert_eq!(timers.len(), 1);
    sas_core::supervisor::timer(&tw.deps, &timers[0]).await.unwrap();
    assert_eq!(tw.store.tasks()[0].failure_count, 1);
}

#[tokio::test]
async fn a_sweep_that_meets_an_error_is_a_function_error() {
    // a sweep error fails the invocation: only logged, it would fire no alarm
    let tw = twins();
    tw.store.fail_next(
        sas_core::store::StoreOp::Expired,
        sas_core::store::StoreError::Backend { op: "Query", message: "throttled".into(), source: None },
    );
    let r = handle_event(Role::Supervisor, &tw.deps, &agents(), fixture("supervisor-scheduled.json")).await;
    assert!(matches!(r, Err(EventError::Sweep(ref report)) if report.errors == 1), "{r:?}");
}

#[tokio::test]
async fn unrecognised_events_are_refused() {
    let tw = twins();
    for (role, event) in [
        (Role::Supervisor, json!({})),
        (Role::Supervisor, json!({"source": "aws.s3", "detail-type": "Object Created"})),
        (Role::Scheduler, fixture("supervisor-scheduled.json")),
        (Role::Scheduler, json!({"Records": []})),
        (Role::Agent, json!({"Records": [{"eventSource": "aws:kinesis", "body": "{}"}]})),
    ] {
        let r = handle_event(role, &tw.deps, &agents(), event.clone()).await;
        assert!(matches!(r, Err(EventError::Unrecognised { .. })), "{} accepted {event}", role.name());
    }
    assert!(matches!(
        parse_event(Role::Supervisor, fixture("supervisor-scheduled.json")),
        Ok(Invocation::Scheduled(_))
    ));
}

// ---- The Callback function: the callback queue, its URL and direct invocations. What an answer
// does to a task is `sas_core::callback::answer`'s (its own tests); here: parsing, dead-lettering
// and the status codes.

/// Invoke the Callback function with a URL request; its status, JSON body and headers.
async fn url_call(tw: &Twins, event: Value) -> (i64, Value, Value) {
    let r = invoke(tw, Role::Callback, event).await;
    let body: Value = serde_json::from_str(r["body"].as_str().expect("a body")).expect("a JSON body");
    (r["statusCode"].as_i64().expect("a status"), body, r["headers"].clone())
}

fn url_event(mutate: impl FnOnce(&mut Value)) -> Value {
    let mut ev = fixture("callback-url.json");
    mutate(&mut ev);
    ev
}

#[tokio::test]
async fn callback_queue_answers_are_applied_and_a_malformed_one_is_kept_in_its_dlq_at_once() {
    let tw = twins();
    let ev = fixture("callback-sqs.json");
    assert_eq!(invoke(&tw, Role::Callback, ev.clone()).await, no_failures());
    let dlq = tw.deps.resources.callback_dlq_url.clone().expect("the twins have a callback DLQ");
    assert_eq!(tw.bus.bodies(&dlq), vec![ev["Records"][1]["body"].as_str().unwrap().to_owned()]);
    let reason = tw.bus.attributes(&dlq)[0].iter().find(|(k, _)| k == "RejectReason").map(|(_, v)| v.clone());
    assert!(
        reason.as_deref().is_some_and(|r| r.starts_with("malformed message: unknown variant `shipped`")),
        "{reason:?}"
    );
    assert!(!reason.unwrap().contains("0f8e7d6c5b4a39281706f5e4d3c2b1a0"), "the reason never echoes the token");
}

#[tokio::test]
async fn the_url_answers_with_the_reply_and_the_status_of_its_result() {
    let tw = twins();
    // No task has the fixture's token: `unknown`, 404, stop.
    let (status, body, headers) = url_call(&tw, fixture("callback-url.json")).await;
    assert_eq!((status, &body["result"], &body["stop"]), (404, &json!("unknown"), &json!(true)), "{body}");
    assert_eq!(headers["content-type"], "application/json");
    // The same body base64-encoded (Lambda does so for bodies it does not take for text).
    let b64 = url_event(|ev| {
        let plain = ev["body"].as_str().unwrap().to_owned();
        ev["body"] = json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, plain));
        ev["isBase64Encoded"] = json!(true);
    });
    let (status, body, _) = url_call(&tw, b64).await;
    assert_eq!((status, &body["result"]), (404, &json!("unknown")), "{body}");
}

#[tokio::test]
async fn the_url_refuses_what_is_not_one_answer_with_a_status_that_says_why() {
    let tw = twins();
    let big = format!(
        r#"{{"v":1,"token":"0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:fixture-cb","status":"heartbeat","details":{{"pad":"{}"}}}}"#,
        "x".repeat(256 * 1024)
    );
    let cases: Vec<(&str, Value, i64, &str)> = vec![
        ("GET", url_event(|ev| ev["requestContext"]["http"]["method"] = json!("GET")), 405, "method_not_allowed"),
        ("another path", url_event(|ev| ev["rawPath"] = json!("/admin")), 404, "not_found"),
        (
            "no body",
            url_event(|ev| ev.as_object_mut().unwrap().remove("body").map(drop).unwrap_or_default()),
            400,
            "malformed",
        ),
        ("not JSON", url_event(|ev| ev["body"] = json!("{\"v\":1,")), 400, "malformed"),
        (
            "not an answer",
            url_event(|ev| {
                ev["body"] =
                    json!(r#"{"v":1,"token":"0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:fixture-cb","status":"shipped"}"#);
            }),
            400,
            "malformed",
        ),
        (
            "a bad token",
            url_event(|ev| ev["body"] = json!(r#"{"v":1,"token":"secret:ship:x","status":"heartbeat"}"#)),
            400,
            "malformed",
        ),
        (
            "another version",
            url_event(|ev| {
                ev["body"] =
                    json!(r#"{"v":2,"token":"0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:fixture-cb","status":"heartbeat"}"#);
            }),
            400,
            "malformed",
        ),
        (
            "bad base64",
            url_event(|ev| {
                ev["body"] = json!("not base64!");
                ev["isBase64Encoded"] = json!(true);
            }),
            400,
            "malformed",
        ),
        ("too large", url_event(|ev| ev["body"] = json!(big.clone())), 413, "too_large"),
        (
            "too large, base64",
            url_event(|ev| {
                ev["body"] = json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &big));
                ev["isBase64Encoded"] = json!(true);
            }),
            413,
            "too_large",
        ),
    ];
    for (what, ev, want_status, want_kind) in cases {
        let (status, body, headers) = url_call(&tw, ev).await;
        assert_eq!((status, body["error"].as_str()), (want_status, Some(want_kind)), "{what}: {body}");
        assert!(body["reason"].as_str().is_some_and(|r| !r.is_empty()), "{what}: {body}");
        assert!(!body.to_string().contains("secret"), "{what}: a refusal never echoes the token: {body}");
        if want_status == 405 {
            assert_eq!(headers["allow"], "POST");
        }
    }
    assert!(tw.store.tasks().is_empty());
}

#[tokio::test]
async fn a_direct_invocation_is_one_answer_and_answered_with_its_reply() {
    let tw = twins();
    let msg = json!({"v": 1, "token": "0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:fixture-cb", "status": "heartbeat"});
    let reply = invoke(&tw, Role::Callback, msg).await;
    assert_eq!((&reply["result"], &reply["stop"]), (&json!("unknown"), &json!(true)), "{reply}");
    let bad = json!({"v": 1, "token": "0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:fixture-cb", "status": "shipped"});
    let r = handle_event(Role::Callback, &tw.deps, &agents(), bad).await;
    assert!(matches!(r, Err(EventError::Answer(sas_core::deps::HandlerError::Malformed(_)))), "{r:?}");
}

#[tokio::test]
async fn only_the_callback_function_takes_answers_and_url_requests() {
    let tw = twins();
    let answer = json!({"v": 1, "token": "0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:fixture-cb", "status": "heartbeat"});
    for role in [Role::Submitter, Role::Scheduler, Role::Agent, Role::Supervisor] {
        for event in [fixture("callback-url.json"), answer.clone()] {
            let r = handle_event(role, &tw.deps, &agents(), event).await;
            assert!(matches!(r, Err(EventError::Unrecognised { .. })), "{} accepted it: {r:?}", role.name());
        }
    }
    let r = handle_event(Role::Callback, &tw.deps, &agents(), fixture("supervisor-scheduled.json")).await;
    assert!(matches!(r, Err(EventError::Unrecognised { .. })), "{r:?}");
    assert!(matches!(parse_event(Role::Callback, fixture("callback-url.json")), Ok(Invocation::Url(_))));
    assert!(matches!(parse_event(Role::Callback, fixture("callback-sqs.json")), Ok(Invocation::Sqs(_))));
}

#[tokio::test]
async fn a_store_that_fails_makes_the_caller_retry_on_both_ways_in() {
    let throttled =
        || sas_core::store::StoreError::Backend { op: "GetItem", message: "throttled".into(), source: None };
    // The queue: the answer's record comes back (and only it: the malformed one is dead-lettered).
    let tw = twins();
    tw.store.fail_next(sas_core::store::StoreOp::Get, throttled());
    let ev = fixture("callback-sqs.json");
    let retry_id = ev["Records"][0]["messageId"].clone();
    assert_eq!(invoke(&tw, Role::Callback, ev).await, json!({"batchItemFailures": [{"itemIdentifier": retry_id}]}));
    // The URL: 503, so the worker sends it again.
    let tw = twins();
    tw.store.fail_next(sas_core::store::StoreOp::Get, throttled());
    let (status, body, _) = url_call(&tw, fixture("callback-url.json")).await;
    assert_eq!((status, body["error"].as_str()), (503, Some("unavailable")), "{body}");
}
