//! Concurrency keys against LocalStack: a burst of 300 tasks on 10 keys with a limit of 1 runs
//! one task at a time per key, each task once; the strategies for a busy key (refuse, replace,
//! cancel) do what they say; the key items in DynamoDB are left empty.

use std::collections::BTreeMap;
use std::time::Duration;

use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_core::store::KeyStore;
use sas_order_service::{spawn_service, FaultRule, OrderService};
use sas_protocol::ids::{CallbackToken, Millis};
use sas_protocol::protocol::{ProcessState, StepStatus, Task};
use sas_protocol::workflow::WorkflowRegistry;
use serde_json::json;

use crate::common::{ran, stack_with, workflow};

const TASKS: usize = 300;
const KEYS: usize = 10;

#[tokio::test]
async fn a_burst_of_300_tasks_on_10_keys_with_a_limit_of_1_runs_one_at_a_time_per_key() {
    let keyed = workflow(json!({
        "name": "keyed", "version": 1,
        "concurrency": {"key": "$.input.account", "limit": 1},
        "steps": [{"name": "charge", "agent": "pay", "timeout_ms": 30_000, "schedule_to_start_ms": 300_000}]
    }));
    let s = stack_with("keys", WorkflowRegistry::new([keyed]).unwrap()).await;
    let svc = OrderService::new();
    // each call takes a moment: two calls of one key at once would overlap at the service
    svc.add_fault(FaultRule { endpoint: Some("/payment/charge".into()), latency_ms: 50, ..FaultRule::default() });
    let base = spawn_service(&svc).await.unwrap();
    let agents = r#"{"agents": {"pay": {"kind": "http", "url": "${BASE}/payment/charge"}}}"#;
    let vars = |k: &str| (k == "BASE").then(|| base.clone());
    let rt = AgentRuntime::from_config_with(agents, &vars, AwsConfigCell::with(s.sdk.clone())).unwrap();
    let ids: Vec<(String, String)> = (0..TASKS).map(|i| (format!("k-{i:03}"), format!("acct-{}", i % KEYS))).collect();
    for (id, account) in &ids {
        let body = json!({"v": 1, "task_id": id, "workflow": "keyed",
                          "input": {"account": account, "customer": "c-1", "amount_cents": 100}});
        s.send(&s.res.submission_queue_url, &body.to_string()).await;
    }
    // started once every submission is queued: a burst
    let runner = s.runner_with(rt);
    let mut by_key: BTreeMap<&str, Vec<(Millis, Millis, &str)>> = BTreeMap::new();
    for (id, account) in &ids {
        let t = s.wait_for(id, Duration::from_mins(15), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:?}", t.reason);
        let (start, end) = ran(&t);
        by_key.entry(account).or_default().push((start, end, id));
    }
    runner.shutdown().await;
    // one at a time per key: each task of a key was claimed after the one before it had ended
    let mut waited = 0;
    for (key, runs) in &mut by_key {
        runs.sort();
        for w in runs.windows(2) {
            let ((_, end, before), (start, _, after)) = (w[0], w[1]);
            assert!(start >= end, "{key}: {after} started at {start} before {before} ended at {end}");
        }
        waited += runs.len() - 1;
    }
    assert_eq!(waited, TASKS - KEYS, "all but the first of each key waited its turn");
    // each task once: one charge per task at the service
    let mut charged: Vec<String> = svc.ledger().into_iter().map(|e| e.order).collect();
    charged.sort();
    charged.dedup();
    assert_eq!((svc.ledger().len(), charged.len()), (TASKS, TASKS), "one charge per task");
    // the key items are left with no holder and no line
    for k in 0..KEYS {
        let state = s.table().load_key(&format!("key:keyed:acct-{k}")).await.unwrap().expect("the key's item");
        assert!(state.holders.is_empty() && state.waiting.is_empty(), "acct-{k}: {state:?}");
        assert_eq!(state.seq, (TASKS / KEYS - 1) as u64, "acct-{k}: every task but the first waited in line");
    }
    s.delete().await;
}

#[tokio::test]
async fn a_busy_key_refuses_replaces_or_cancels_as_its_workflow_says() {
    // reserve (undone by release), a step that holds the key until the test answers it, then done:
    // what runs when is the test's to say, not a nap's (a machine slow enough let a 15-s nap end
    // before the test had looked)
    let def = |name: &str, when_busy: &str| {
        workflow(json!({
            "name": name, "version": 1,
            "concurrency": {"key": "$.input.account", "limit": 1, "when_busy": when_busy},
            "steps": [
                {"name": "reserve", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3,
                 "compensation": {"name": "release", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3}},
                {"name": "hold", "kind": "callback", "agent": "sim", "timeout_ms": 600_000, "max_attempts": 1},
                {"name": "done", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3}
            ]
        }))
    };
    let workflows =
        WorkflowRegistry::new([def("refuse", "refuse"), def("replace", "replace"), def("cancel", "cancel")]).unwrap();
    let stack = stack_with("busy", workflows).await;
    let s = &stack;
    let replies = s.reply_queue("busy", false).await;
    let callbacks = s.res.callback_queue_url.clone().expect("the stack has a callback queue");
    let runner = s.runner();
    let submit = |w: &str, n: u32, input: serde_json::Value| {
        json!({"v": 1, "task_id": format!("{w}-{n}"), "workflow": w, "input": input, "reply_to": replies}).to_string()
    };
    let holding = |t: &Task| {
        t.current_step_name() == Some("hold") && t.steps[1].status == StepStatus::Running && t.lock.locked_by.is_some()
    };
    // the task's hold step, once it runs, is answered: the task goes on to its end
    let let_go = |id: &'static str| {
        let callbacks = callbacks.clone();
        async move {
            let t = s.wait_for(id, Duration::from_mins(2), holding).await;
            let token = CallbackToken::new(&t.task_id, "hold", t.lock.locked_by.as_ref().expect("an attempt"));
            let answer = json!({"v": 1, "token": token.expose(), "status": "succeeded", "output": {}});
            s.send(&callbacks, &answer.to_string()).await;
        }
    };
    let end = |id: &'static str| async move {
        s.wait_for(id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await
    };
    // the first task of each holds its key; then a second arrives
    for w in ["refuse", "replace", "cancel"] {
        s.send(&s.res.submission_queue_url, &submit(w, 1, json!({"account": w}))).await;
    }
    for w in ["refuse", "replace", "cancel"] {
        s.wait_for(&format!("{w}-1"), Duration::from_mins(2), holding).await;
        s.send(&s.res.submission_queue_url, &submit(w, 2, json!({"account": w}))).await;
    }
    // replace-2 waits behind replace-1; cancel-2 cancels cancel-1 when it comes (the latest wins)
    let second = s.wait_for("replace-2", Duration::from_mins(2), |_| true).await;
    assert!(second.waits_for_slot(), "replace-2: {second:?}");
    // what `sasctl key replace replace` says now: the first runs (it holds), the second waits
    let (state, running) = sas_cli::keys::look(&s.deps, "key:replace:replace").await.unwrap().expect("the key's item");
    let told = sas_cli::keys::describe("key:replace:replace", &state, &running, Millis::now());
    assert!(told.starts_with("key:replace:replace: 1 running (limit 1), 1 waiting"), "{told}");
    assert!(told.contains("running  replace-1  Processing at hold") && told.contains("#1  replace-2"), "{told}");
    // and `sasctl top` counts the waiting task under its key
    let top = sas_cli::top::in_flight(s.deps.store.as_ref(), Millis::now(), 1_000, 5).await.unwrap();
    assert!(top.waiting_for_keys.contains(&("key:replace:replace".to_owned(), 1)), "{:?}", top.waiting_for_keys);
    assert!(sas_cli::top::render(&top).contains("waiting for a slot of their concurrency key"), "{top:?}");
    // cancel-1, cancelled in its hold, undoes its reserve and ends before the third comes
    let c1 = end("cancel-1").await;
    for w in ["refuse", "replace", "cancel"] {
        s.send(&s.res.submission_queue_url, &submit(w, 3, json!({"account": w}))).await;
    }
    // a submission whose input names no key is refused at once, with the reason
    s.send(&s.res.submission_queue_url, &submit("refuse", 4, json!({"customer": "c-1"}))).await;

    let never_ran = |t: &Task| !t.history.iter().any(|h| h.state == ProcessState::Processing);
    // refuse: the first runs on; the others are refused and never become tasks
    let_go("refuse-1").await;
    assert_eq!(end("refuse-1").await.process_state, ProcessState::Processed);
    assert!(s.task("refuse-2").await.is_none() && s.task("refuse-3").await.is_none());
    // replace: the waiting one is replaced by the latest (cancelled without having run), which runs
    // once the first has ended
    let r2 = end("replace-2").await;
    let_go("replace-1").await;
    let_go("replace-3").await;
    let (r1, r3) = (end("replace-1").await, end("replace-3").await);
    assert_eq!(
        (r1.process_state, r2.process_state, r3.process_state),
        (ProcessState::Processed, ProcessState::Cancelled, ProcessState::Processed)
    );
    assert!(never_ran(&r2), "{:?}", r2.history);
    assert!(r2.reason.as_deref().is_some_and(|r| r.contains("replaced by task replace-3")), "{:?}", r2.reason);
    assert!(ran(&r3).0 >= ran(&r1).1, "replace-3 ran after replace-1 ended");
    // cancel: each newcomer cancels the tasks of its key, running (its reserve undone) or waiting
    // (cancel-2, whether it had started by then or not); the latest runs
    let_go("cancel-3").await;
    let (c2, c3) = (end("cancel-2").await, end("cancel-3").await);
    assert_eq!(
        (c1.process_state, c2.process_state, c3.process_state),
        (ProcessState::Cancelled, ProcessState::Cancelled, ProcessState::Processed)
    );
    assert!(c1.history.iter().any(|h| h.state == ProcessState::Compensating), "{:?}", c1.history);
    assert!(c1.reason.as_deref().is_some_and(|r| r.contains("replaced by task cancel-2")), "{:?}", c1.reason);
    assert!(c2.reason.as_deref().is_some_and(|r| r.contains("replaced by task cancel-3")), "{:?}", c2.reason);
    let c2_end = c2.history.iter().rev().find(|h| h.state.is_terminal()).map(|h| h.at).unwrap();
    assert!(ran(&c3).0 >= c2_end && ran(&c3).0 >= ran(&c1).1, "cancel-3 ran after the others ended");
    // what the refused submissions' reply queue heard (among every status of the others), read
    // until the three refusals are in, for at most 2 minutes
    let mut rejected: BTreeMap<String, String> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_mins(2);
    while rejected.len() < 3 && std::time::Instant::now() < deadline {
        for m in s.bodies(&replies, 1, Duration::from_secs(5)).await {
            if m["state"] == "Rejected" {
                let (id, reason) =
                    (m["task_id"].as_str().unwrap_or_default(), m["reason"].as_str().unwrap_or_default());
                rejected.insert(id.to_owned(), reason.to_owned());
            }
        }
    }
    for id in ["refuse-2", "refuse-3"] {
        assert!(rejected.get(id).is_some_and(|r| r.contains("when_busy is refuse")), "{id}: {rejected:?}");
    }
    assert!(rejected.get("refuse-4").is_some_and(|r| r.contains("names nothing in the input")), "{rejected:?}");
    runner.shutdown().await;
    // every key item is left empty
    for w in ["refuse", "replace", "cancel"] {
        let state = s.table().load_key(&format!("key:{w}:{w}")).await.unwrap().expect("the key's item");
        assert!(state.holders.is_empty() && state.waiting.is_empty(), "{w}: {state:?}");
    }
    stack.delete().await;
}

#[tokio::test]
async fn a_paused_workflow_parks_its_tasks_steps_and_a_resume_runs_them_to_the_end() {
    let two = workflow(json!({
        "name": "pausable", "version": 1,
        "steps": [{"name": "a", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3},
                  {"name": "b", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3}]
    }));
    let mut settings = crate::common::settings();
    // the parked tasks look at the pause every 2 s (a minute by default)
    settings.policy.pause_check_ms = 2_000;
    let s = crate::common::stack_with_settings("pause", WorkflowRegistry::new([two]).unwrap(), settings).await;
    assert_eq!(sas_cli::pause::pause(&s.deps, "pausable", "maintenance").await.unwrap(), sas_cli::pause::Outcome::Done);
    let runner = s.runner();
    let ids: Vec<String> = (0..3).map(|i| format!("p-{i}")).collect();
    for id in &ids {
        let body = json!({"v": 1, "task_id": id, "workflow": "pausable", "input": {}});
        s.send(&s.res.submission_queue_url, &body.to_string()).await;
    }
    // each is created parked: no step dispatched, Pending with the reason, through several looks
    for id in &ids {
        let t = s.wait_for(id, Duration::from_mins(1), |t| t.claim.paused).await;
        assert_eq!(t.process_state, ProcessState::Pending);
        assert!(t.reason.as_deref().is_some_and(|r| r.contains("pausable is paused")), "{:?}", t.reason);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for id in &ids {
        let t = s.task(id).await.unwrap();
        assert!(t.claim.paused && t.steps.iter().all(|st| st.attempts == 0), "{id}: {:#?}", t.steps);
        assert_eq!((t.failure_count, t.process_state), (0, ProcessState::Pending), "a pause is no failure");
    }
    let top = sas_cli::top::in_flight(s.deps.store.as_ref(), Millis::now(), 1_000, 5).await.unwrap();
    assert_eq!(top.parked, 3, "top counts them parked: {top:?}");
    assert_eq!(sas_cli::pause::resume(&s.deps, "pausable").await.unwrap(), sas_cli::pause::Outcome::Done);
    for id in &ids {
        let t = s.wait_for(id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:?}", t.reason);
    }
    runner.shutdown().await;
    s.delete().await;
}
