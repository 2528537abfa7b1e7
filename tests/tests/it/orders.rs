//! Real agents calling a real (local) HTTP service: the HTTP agent against the order service, and
//! the seed's order workflow end to end on LocalStack with each kind of fault, then the operator's
//! resubmit and cancel.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sas_core::agent::{AgentRuntime, BUILT_IN_AGENTS};
use sas_order_service::{spawn_local, FaultRule, OrderService};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use sas_protocol::protocol::ProcessState;
use sas_protocol::workflow::{OnFailure, WorkflowRegistry, BUILT_IN_WORKFLOWS};
use serde_json::{json, Value};

use crate::common::{assert_timed_out_by_the_agent, stack_with, stack_with_settings, Stack};

fn agents(base: &str) -> AgentRuntime {
    let base = base.to_owned();
    AgentRuntime::from_config(BUILT_IN_AGENTS, &move |k| (k == "ORDER_SERVICE_URL").then(|| base.clone()))
        .expect("built-in agent configuration")
}

fn request(order: &str, agent: &str, step: &str, deadline_ms: u64) -> AgentRequest {
    let input = json!({"customer": "c-1", "items": [{"sku": "book", "qty": 2}]});
    AgentRequest::first_attempt(
        TaskId::try_from(order).unwrap(),
        step,
        agent,
        input,
        Millis::now().plus_ms(deadline_ms),
    )
}

fn rule(order: &str, endpoint: &str) -> FaultRule {
    serde_json::from_value(json!({"order": order, "endpoint": endpoint})).expect("a fault rule")
}

fn ops(svc: &OrderService, order: &str) -> Vec<String> {
    svc.ledger().into_iter().filter(|e| e.order == order).map(|e| e.op).collect()
}

#[tokio::test]
async fn http_agent_retries_transient_errors_then_succeeds_once() {
    let (base, svc) = spawn_local().await.unwrap();
    svc.add_fault(FaultRule { fail_times: 2, ..rule("h-1", "/payment/charge") });
    let out = agents(&base).run(&request("h-1", "payment.charge", "charge", 10_000)).await.expect("a result");
    match out.outcome {
        Outcome::Succeeded { output } => assert_eq!(output["amount_cents"], 2000),
        other => panic!("{other:?}"),
    }
    assert_eq!(ops(&svc, "h-1"), vec!["charge"]);
}

#[tokio::test]
async fn http_agent_replays_are_applied_once() {
    let (base, svc) = spawn_local().await.unwrap();
    let rt = agents(&base);
    let first = rt.run(&request("h-2", "payment.charge", "charge", 10_000)).await.unwrap();
    // A retry of the same step: a new attempt token, the same idempotency key.
    let again = rt.run(&request("h-2", "payment.charge", "charge", 10_000)).await.unwrap();
    assert_ne!(first.attempt, again.attempt);
    assert_eq!(first.outcome, again.outcome, "the replay returns the saved response");
    assert_eq!(ops(&svc, "h-2"), vec!["charge"], "applied once");
}

#[tokio::test]
async fn http_agent_cuts_a_hung_call_at_complete_by_and_sends_nothing() {
    let (base, svc) = spawn_local().await.unwrap();
    svc.add_fault(FaultRule { hang: true, ..rule("h-3", "/shipping/ship") });
    let (rt, req) = (agents(&base), request("h-3", "shipping.ship", "ship", 800));
    let started = Instant::now();
    let out = rt.run(&req).await;
    assert!(out.is_none(), "nothing may be sent back after CompleteBy: {out:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "cut at CompleteBy, not later ({:?})", started.elapsed());
    assert!(ops(&svc, "h-3").is_empty());
}

#[tokio::test]
async fn http_agent_treats_4xx_as_permanent_and_honours_retry_after() {
    let (base, svc) = spawn_local().await.unwrap();
    svc.add_fault(FaultRule { permanent: Some("card declined".into()), ..rule("h-4", "/payment/charge") });
    let out = agents(&base).run(&request("h-4", "payment.charge", "charge", 10_000)).await.unwrap();
    match out.outcome {
        Outcome::Failed { retryable: false, error } => {
            assert!(error.contains("422") && error.contains("card declined"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    svc.add_fault(FaultRule { fail_times: 1, retry_after_s: Some(1), ..rule("h-5", "/inventory/reserve") });
    let started = Instant::now();
    let out = agents(&base).run(&request("h-5", "inventory.reserve", "reserve", 10_000)).await.unwrap();
    assert!(matches!(out.outcome, Outcome::Succeeded { .. }), "{out:?}");
    assert!(started.elapsed() >= Duration::from_secs(1), "waited for Retry-After");
}

/// The built-in order workflow (5 s steps) and a parking variant for the operator tests.
fn order_workflows() -> WorkflowRegistry {
    let builtin = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap();
    let order = builtin.resolve("order", None).unwrap().clone();
    let mut park = order.clone();
    park.name = "order-park".into();
    park.on_failure = OnFailure::Error;
    WorkflowRegistry::new([order, park]).unwrap()
}

async fn order_stack(label: &str) -> (Stack, OrderService, sas_core::runner::RunnerHandle) {
    let s = stack_with(label, order_workflows()).await;
    let (base, svc) = spawn_local().await.unwrap();
    let runner = s.runner_with(agents(&base));
    (s, svc, runner)
}

fn order(id: &str, workflow: &str, faults: Value) -> String {
    json!({"v": 1, "task_id": id, "workflow": workflow,
           "input": {"customer": "c-7", "items": [{"sku": "book", "qty": 1}], "faults": faults}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_workflow_end_to_end_with_each_fault_kind() {
    let (s, svc, runner) = order_stack("orders").await;
    let cases: BTreeMap<&str, (Value, ProcessState, Vec<&str>)> = BTreeMap::from([
        ("o-clean", (json!({}), ProcessState::Processed, vec!["reserve", "charge", "ship"])),
        (
            "o-flaky",
            (json!({"payment/charge": {"fail_times": 3}}), ProcessState::Processed, vec!["reserve", "charge", "ship"]),
        ),
        (
            "o-slow",
            (
                json!({"inventory/reserve": {"latency_ms": 300}}),
                ProcessState::Processed,
                vec!["reserve", "charge", "ship"],
            ),
        ),
        (
            "o-declined",
            (
                json!({"payment/charge": {"permanent": "card declined"}}),
                ProcessState::Compensated,
                vec!["reserve", "release"],
            ),
        ),
        (
            "o-lost",
            (
                json!({"shipping/ship": {"hang": true}}),
                ProcessState::Compensated,
                vec!["reserve", "charge", "refund", "release"],
            ),
        ),
    ]);
    for (id, (faults, _, _)) in &cases {
        s.send(&s.res.submission_queue_url, &order(id, "order", faults.clone())).await;
    }
    // A hang on the first attempt only: lifted once the supervisor has counted the timeout.
    svc.add_fault(FaultRule { hang: true, ..rule("o-hung-once", "/inventory/reserve") });
    s.send(&s.res.submission_queue_url, &order("o-hung-once", "order", json!({}))).await;
    s.wait_for("o-hung-once", Duration::from_secs(30), |t| t.failure_count >= 1).await;
    svc.clear_faults(Some("o-hung-once"));

    for (id, (_, end, effects)) in &cases {
        let t = s.wait_for(id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, *end, "{id}: {:?}", t.reason);
        assert_eq!(ops(&svc, id), *effects, "{id}: every effect applied exactly once, undone in reverse");
    }
    let t = s.wait_terminal("o-hung-once").await;
    // timed out once at least (its retry may reach the service before the hang is lifted, on a
    // slow machine): what matters is that each effect applied once
    assert_eq!(t.process_state, ProcessState::Processed);
    assert!(t.failure_count >= 1, "{t:?}");
    assert_eq!(ops(&svc, "o-hung-once"), vec!["reserve", "charge", "ship"]);
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_task_resubmitted_after_the_fault_is_lifted_completes() {
    let (s, svc, runner) = order_stack("resubmit").await;
    svc.add_fault(FaultRule { fail_times: 1_000, ..rule("r-1", "/payment/charge") });
    s.send(&s.res.submission_queue_url, &order("r-1", "order-park", json!({}))).await;
    let t = s.wait_for("r-1", Duration::from_secs(90), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Error, "{:?}", t.reason);
    assert_eq!(ops(&svc, "r-1"), vec!["reserve"]);
    // reserve's attempts before the resubmit (2 if its first request waited past the start budget)
    let reserved_in = t.steps[0].attempts;
    let listed = s.deps.store.list_by_state(ProcessState::Error, 10).await.unwrap();
    assert_eq!(listed.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), vec!["r-1"]);

    svc.clear_faults(Some("r-1"));
    let ids = sas_cli::ops::resubmit_all_in_error(&s.deps, "payment provider is back", 100).await.unwrap();
    assert_eq!(ids.len(), 1);
    let t = s.wait_for("r-1", Duration::from_mins(1), |t| t.run == 2 && t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed);
    assert_eq!(t.steps[0].attempts, reserved_in, "completed steps are not redone");
    assert_eq!(ops(&svc, "r-1"), vec!["reserve", "charge", "ship"]);
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_stops_an_order_and_undoes_what_it_did() {
    let (s, svc, runner) = order_stack("cancel-order").await;
    // ship hangs: the cancel lands while it is in flight however slow the machine
    svc.add_fault(FaultRule { hang: true, ..rule("x-1", "/shipping/ship") });
    s.send(&s.res.submission_queue_url, &order("x-1", "order", json!({}))).await;
    s.wait_for("x-1", Duration::from_secs(30), |t| t.current_step_name() == Some("ship")).await;
    sas_cli::ops::cancel(&s.deps, &TaskId::try_from("x-1").unwrap(), "customer cancelled").await.unwrap();
    let t = s.wait_terminal("x-1").await;
    assert_eq!(t.process_state, ProcessState::Cancelled);
    // ship was in flight when cancelled: nothing of it is kept; charge and reserve are undone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done = ops(&svc, "x-1");
    assert_eq!(&done[..2], ["reserve", "charge"]);
    assert!(done.contains(&"refund".to_owned()) && done.contains(&"release".to_owned()), "{done:?}");
    assert_eq!(s.task("x-1").await.unwrap().rev, t.rev, "nothing changed after Cancelled");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_during_a_slow_charge_leaves_no_effect_that_is_not_undone() {
    // cancel while the charge is slow: the refund waits for the charge, so the ledger never reads
    // reserve, release, charge (a charge landed after the cancel and never refunded).
    let (s, svc, runner) = order_stack("slow-charge").await;
    svc.add_fault(FaultRule { latency_ms: 4_000, ..rule("sc-1", "/payment/charge") });
    s.send(&s.res.submission_queue_url, &order("sc-1", "order", json!({}))).await;
    s.wait_for("sc-1", Duration::from_secs(30), |t| {
        t.current_step_name() == Some("charge") && t.process_state == ProcessState::Processing
    })
    .await;
    sas_cli::ops::cancel(&s.deps, &TaskId::try_from("sc-1").unwrap(), "customer cancelled").await.unwrap();
    let t = s.wait_terminal("sc-1").await;
    assert_eq!(t.process_state, ProcessState::Cancelled);
    tokio::time::sleep(Duration::from_secs(3)).await; // anything still in flight lands now
    let done = ops(&svc, "sc-1");
    let at = |op: &str| done.iter().position(|o| o == op);
    assert_eq!(at("reserve"), Some(0), "{done:?}");
    assert!(at("release").is_some(), "reserve undone: {done:?}");
    if let Some(charge) = at("charge") {
        let refund = at("refund").unwrap_or_else(|| panic!("the charge was never refunded: {done:?}"));
        assert!(charge < refund, "the refund ran before the charge landed: {done:?}");
    }
    runner.shutdown().await;
    s.delete().await;
}

/// The stack of [`order_stack`] with the functions' default time bounds (a 300 s queue budget, a
/// 10 s result grace, a 2 s settle): what a user runs, where a hung attempt the agent did not
/// report would be found only at its CompleteBy + grace, five minutes after its claim.
async fn order_stack_with_defaults(label: &str) -> (Stack, OrderService, sas_core::runner::RunnerHandle) {
    let settings =
        sas_core::config::Settings { policy: sas_protocol::protocol::Policy::default(), ..crate::common::settings() };
    let s = stack_with_settings(label, order_workflows(), settings).await;
    let (base, svc) = spawn_local().await.unwrap();
    let runner = s.runner_with(agents(&base));
    (s, svc, runner)
}

/// A charge that hangs on every attempt. Each attempt is reported timed out by its agent at its
/// 5 s execution deadline (the HTTP client's own timeout fires there) and retried at once, and
/// the order ends Compensated in about three times the timeout and backoff, plus one timeout and
/// the settling margin before its compensation: about 30 s, not 645 s (each attempt left for the
/// Supervisor to find at CompleteBy + grace, and the compensation held until the last attempt's
/// CompleteBy).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::print_stderr)] // the measured figure is the point (docs/concepts/time-bounds.md)
async fn a_charge_that_always_hangs_is_retried_at_its_timeout_and_compensated_in_seconds() {
    let (s, svc, runner) = order_stack_with_defaults("hang-all").await;
    svc.add_fault(FaultRule { hang: true, ..rule("hang-1", "/payment/charge") });
    let started = Instant::now();
    s.send(&s.res.submission_queue_url, &order("hang-1", "order", json!({}))).await;
    let t = s.wait_for("hang-1", Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    let took = started.elapsed();
    assert_eq!(t.process_state, ProcessState::Compensated, "{:?}", t.reason);
    let held = assert_timed_out_by_the_agent(&t, "charge", 3, 5_000, 15_000);
    eprintln!("hang-1: Compensated {:.1} s after its submission; charge attempts held {held:?} ms", took.as_secs_f64());
    assert!(took < Duration::from_secs(75), "Compensated {took:?} after its submission");
    let done = ops(&svc, "hang-1");
    assert_eq!(done.iter().filter(|o| *o == "release").count(), 1, "{done:?}");
    assert!(!done.contains(&"charge".to_owned()), "{done:?}");
    runner.shutdown().await;
    s.delete().await;
}

/// A cancel while the charge hangs ends Cancelled one execution time and the settling margin
/// after the cancel (the agents' check keeps any later copy of the charge from starting), with the
/// reservation released once, not at the attempt's CompleteBy (309.8 s away).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::print_stderr)] // the measured figure is the point (docs/concepts/time-bounds.md)
async fn a_cancel_during_a_hung_charge_ends_in_seconds_and_releases_the_reservation_once() {
    let (s, svc, runner) = order_stack_with_defaults("hang-cancel").await;
    svc.add_fault(FaultRule { hang: true, ..rule("hc-1", "/payment/charge") });
    s.send(&s.res.submission_queue_url, &order("hc-1", "order", json!({}))).await;
    s.wait_for("hc-1", Duration::from_secs(30), |t| {
        t.current_step_name() == Some("charge") && t.process_state == ProcessState::Processing
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await; // the charge's call has started: it hangs
    let cancelled = Instant::now();
    sas_cli::ops::cancel(&s.deps, &TaskId::try_from("hc-1").unwrap(), "customer cancelled").await.unwrap();
    let t = s.wait_for("hc-1", Duration::from_mins(1), |t| t.process_state.is_terminal()).await;
    let took = cancelled.elapsed();
    assert_eq!(t.process_state, ProcessState::Cancelled, "{:?}", t.reason);
    eprintln!("hc-1: Cancelled {:.1} s after the cancel", took.as_secs_f64());
    assert!(took < Duration::from_secs(25), "Cancelled {took:?} after the cancel");
    tokio::time::sleep(Duration::from_secs(2)).await; // anything still in flight lands now
    let done = ops(&svc, "hc-1");
    assert_eq!(done, vec!["reserve", "release"], "the charge never applied; the reservation released once");
    runner.shutdown().await;
    s.delete().await;
}
