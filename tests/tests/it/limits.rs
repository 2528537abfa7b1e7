//! Per-agent concurrency limits (`max_in_flight`) against LocalStack: the leases in DynamoDB hold
//! under racing takers and are reclaimed once expired; a burst of tasks on a limited HTTP agent
//! never has more calls open at the service than the limit, and every task still ends
//! `Processed` (work over the limit waits).

use std::time::Duration;

use futures::future::join_all;
use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_core::store::Acquire;
use sas_order_service::{spawn_service, FaultRule, OrderService};
use sas_protocol::ids::Millis;
use sas_protocol::protocol::ProcessState;
use sas_protocol::workflow::{OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use serde_json::json;

use crate::common::{stack, stack_with};

#[tokio::test]
async fn leases_in_dynamodb_never_exceed_the_limit_and_expired_ones_are_reclaimed() {
    let s = stack("limits").await;
    let lim = s.deps.limiter.clone();
    let t = Millis::now();
    // 20 takers race for 5 slots: exactly 5 win
    let takers = (0..20).map(|i| {
        let lim = lim.clone();
        async move { lim.acquire("svc", 5, &format!("h{i}"), t.plus_ms(60_000), t).await.unwrap() }
    });
    let got = join_all(takers).await;
    let taken = got.iter().filter(|a| matches!(a, Acquire::Taken { .. })).count();
    assert_eq!(taken, 5, "{got:?}");
    assert!(got.iter().all(|a| matches!(a, Acquire::Taken { reclaimed: 0 } | Acquire::Full { held: 5 })), "{got:?}");
    let mut held: Vec<String> = lim.leases("svc").await.unwrap().into_iter().map(|(h, _)| h).collect();
    held.sort();
    assert_eq!(held.len(), 5, "{held:?}");

    // one given back: one more may take it; giving back twice (or a lease never held) is harmless
    lim.release("svc", &held[0]).await.unwrap();
    lim.release("svc", &held[0]).await.unwrap();
    lim.release("svc", "never-held").await.unwrap();
    assert_eq!(lim.acquire("svc", 5, "late", t.plus_ms(1_000), t).await.unwrap(), Acquire::Taken { reclaimed: 0 });
    assert_eq!(lim.acquire("svc", 5, "later", t.plus_ms(1_000), t).await.unwrap(), Acquire::Full { held: 5 });

    // at t + 2 s the lease of "late" has ended (its holder died or hung): `sasctl top` shows it
    // expired, and the next taker reclaims it
    let at = t.plus_ms(2_000);
    let seen = sas_cli::top::agent_limits(lim.as_ref(), &[("svc".to_owned(), 5)], at).await.unwrap();
    assert_eq!((seen[0].held, seen[0].expired), (4, 1), "{seen:?}");
    assert_eq!(lim.acquire("svc", 5, "later", t.plus_ms(60_000), at).await.unwrap(), Acquire::Taken { reclaimed: 1 });
    let holders: Vec<String> = lim.leases("svc").await.unwrap().into_iter().map(|(h, _)| h).collect();
    assert!(holders.contains(&"later".to_owned()) && !holders.contains(&"late".to_owned()), "{holders:?}");

    // a release of an agent nobody limited yet creates no item
    lim.release("nobody", "h").await.unwrap();
    assert!(lim.leases("nobody").await.unwrap().is_empty());
    s.delete().await;
}

const LIMIT: u32 = 3;
const TASKS: usize = 24;

#[tokio::test]
async fn a_burst_on_an_agent_with_max_in_flight_never_has_more_calls_open_at_the_service() {
    // one step, on an HTTP agent limited to 3 calls in flight; each call takes 300 ms
    let mut charge = StepDef::call("charge", "pay", 30_000);
    charge.schedule_to_start_ms = Some(120_000);
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "limited".into(),
        version: 1,
        description: "a burst on a limited agent".into(),
        on_failure: OnFailure::Compensate,
        steps: vec![charge],
    };
    let s = stack_with("limited", WorkflowRegistry::new([wf]).unwrap()).await;
    let svc = OrderService::new();
    svc.add_fault(FaultRule { endpoint: Some("/payment/charge".into()), latency_ms: 300, ..FaultRule::default() });
    let base = spawn_service(&svc).await.unwrap();
    let agents = format!(
        r#"{{"agents": {{"pay": {{"kind": "http", "url": "${{BASE}}/payment/charge", "max_in_flight": {LIMIT}}}}}}}"#
    );
    let vars = |k: &str| (k == "BASE").then(|| base.clone());
    let rt = AgentRuntime::from_config_with(&agents, &vars, AwsConfigCell::with(s.sdk.clone())).unwrap();
    assert_eq!(rt.limit("pay"), Some(LIMIT));
    let ids: Vec<String> = (0..TASKS).map(|i| format!("lim-{i}")).collect();
    for id in &ids {
        let body = json!({"v": 1, "task_id": id, "workflow": "limited",
                          "input": {"customer": "c-1", "amount_cents": 100}});
        s.send(&s.res.submission_queue_url, &body.to_string()).await;
    }
    // started once every submission is queued: a burst however slowly the sends went
    let runner = s.runner_with(rt);
    for id in &ids {
        let t = s.wait_for(id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:?}", t.reason);
        assert_eq!(t.failure_count, 0, "{id}: waiting for a slot is not a failure: {:?}", t.history);
    }
    let seen = svc.in_flight("/payment/charge");
    assert!(seen.max <= LIMIT, "{} calls were open at once at the service; the limit is {LIMIT}", seen.max);
    assert_eq!(seen.max, LIMIT, "the burst did reach the limit");
    assert_eq!(seen.total, TASKS as u64, "one call per task");
    assert_eq!(svc.ledger().len(), TASKS);
    assert!(s.deps.limiter.leases("pay").await.unwrap().is_empty(), "every lease was given back");
    runner.shutdown().await;
    s.delete().await;
}

/// An agent that records when each of its calls starts, and answers at once.
#[derive(Default)]
struct Stamped(std::sync::Mutex<Vec<std::time::Instant>>);

impl sas_core::agent::Agent for Stamped {
    fn call<'a>(
        &'a self,
        _: sas_core::agent::Call<'a>,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, sas_core::agent::AgentError>> {
        self.0.lock().unwrap().push(std::time::Instant::now());
        Box::pin(async { Ok(json!({"ok": true})) })
    }
}

const RATE: u32 = 5;
const PACED_TASKS: usize = 100;

#[tokio::test]
async fn an_agent_with_a_rate_of_5_a_second_never_starts_more_calls_in_a_second_while_100_tasks_call_it() {
    let mut call = StepDef::call("notify", "paced", 10_000);
    call.schedule_to_start_ms = Some(300_000);
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "paced".into(),
        version: 1,
        description: "a burst on a paced agent".into(),
        on_failure: OnFailure::Compensate,
        steps: vec![call],
    };
    let s = stack_with("paced", WorkflowRegistry::new([wf]).unwrap()).await;
    let stamped = std::sync::Arc::new(Stamped::default());
    let mut rt = AgentRuntime::default();
    rt.register_arc("paced", stamped.clone());
    let spec = sas_core::limit::RateSpec { per_second: Some(RATE), per_minute: None, burst: None };
    rt.set_rate("paced", sas_core::limit::Rate::of(&spec).unwrap());
    let ids: Vec<String> = (0..PACED_TASKS).map(|i| format!("paced-{i:03}")).collect();
    let bodies: Vec<String> =
        ids.iter().map(|id| json!({"v": 1, "task_id": id, "workflow": "paced", "input": {}}).to_string()).collect();
    s.send_all(&s.res.submission_queue_url, &bodies).await;
    let begun = std::time::Instant::now();
    let runner = s.runner_with(rt);
    for id in &ids {
        let t = s.wait_for(id, Duration::from_mins(5), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:?}", t.reason);
        assert_eq!(t.failure_count, 0, "{id}: waiting for the rate is not a failure: {:?}", t.history);
    }
    let took = begun.elapsed();
    runner.shutdown().await;
    let mut calls = stamped.0.lock().unwrap().clone();
    calls.sort();
    assert_eq!(calls.len(), PACED_TASKS, "one call per task");
    // no window of one second holds more than RATE starts: the (RATE+1)-th call after any call
    // starts a second or more after it (the calls start at their slots, 206 ms apart, each within
    // PACE_SLACK_MS after its slot)
    let n = RATE as usize;
    let tightest = calls.windows(n + 1).map(|w| w[n] - w[0]).min().unwrap();
    assert!(tightest >= Duration::from_secs(1), "{} calls started within {tightest:?}", n + 1);
    // and the rate held over the whole burst: 100 calls at 5 a second take 20 s at least
    let spread = calls[PACED_TASKS - 1] - calls[0];
    assert!(spread >= Duration::from_millis(19_800), "100 calls over {spread:?}");
    // the figures the book gives (`--no-capture` shows them)
    #[allow(clippy::print_stderr, clippy::cast_precision_loss)]
    {
        eprintln!(
            "paced: {PACED_TASKS} calls over {spread:?} ({:.2} a second), the tightest {} in {tightest:?}; all Processed after {took:?}",
            (PACED_TASKS - 1) as f64 / spread.as_secs_f64(),
            n + 1
        );
    }
    s.delete().await;
}
