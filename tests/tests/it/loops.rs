//! Loops on LocalStack: each iteration is a task of its own in the table, with its own keys; the
//! loop's task item stays the same size however many iterations run; a loop waits between
//! iterations on a timer; and a cancel stops it, every iteration that applied undone once, the
//! newest first, then the steps before it.

use std::time::Duration;

use sas_protocol::ids::TaskId;
use sas_protocol::protocol::{CompensationStatus, ProcessState, StepStatus};
use sas_protocol::workflow::{WorkflowDef, WorkflowRegistry};
use serde_json::json;

use crate::common::{stack_with, Stack};

/// How many iterations the first test runs: 30, or `SAS_LOOP_ITERATIONS` (the book's figure for
/// 1,000 was measured with it).
fn iterations() -> u32 {
    std::env::var("SAS_LOOP_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(30)
}

/// reserve, then `pages` runs `list` (undone by `unlist`) once per iteration until
/// [`iterations`] have run (at most 10 more), then notify. `paced` runs the same body 2 s apart.
fn workflows() -> Vec<WorkflowDef> {
    let n = iterations();
    let looped = |name: &str, wait: Option<u64>| {
        let mut pages = json!({
            "name": "pages", "kind": "loop", "max_iterations": n + 10, "parameters": {"page.$": "$.loop.index"},
            // a long start budget: a request that waits on a slow machine is not claimed again
            // (an attempt more), so each undo is one attempt
            "body": [{"name": "list", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3,
                      "schedule_to_start_ms": 60_000, "parameters": {"page.$": "$.input.page"},
                      "compensation": {"name": "unlist", "agent": "sim", "timeout_ms": 20_000,
                                       "schedule_to_start_ms": 60_000}}],
            "result_selector": {"key.$": "$.list.idempotency_key"},
            "until": {"variable": "$.loop.index", "numeric_greater_than_equals": n}
        });
        if let Some(w) = wait {
            pages["wait_ms"] = json!(w);
        }
        serde_json::from_value::<WorkflowDef>(json!({"name": name, "version": 1, "steps": [
            // every attempt gets 20 s: CI's loaded machine held a 5-s one past its deadline (reserve's
            // one attempt: the task compensated before its loop; release's: it ended in Error);
            // the steps whose attempts are not counted here get three
            {"name": "reserve", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3,
             "compensation": {"name": "release", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3}},
            pages,
            {"name": "notify", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3}
        ]}))
        .expect("the workflow")
    };
    vec![looped("pages", None), looped("paced", Some(2_000))]
}

/// The size in bytes of the task's item as DynamoDB holds it (its attributes' JSON).
async fn item_bytes(s: &Stack, id: &str) -> usize {
    let item = s.item(id).await;
    item.iter().map(|(k, v)| k.len() + format!("{v:?}").len()).sum()
}

#[tokio::test]
async fn a_loop_runs_each_iteration_as_a_task_and_its_item_stays_the_same_size() {
    let s = stack_with("loops", WorkflowRegistry::new(workflows()).unwrap()).await;
    let runner = s.runner();
    let body = json!({"v": 1, "task_id": "loop-1", "workflow": "pages", "input": {}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;
    // the item's size while the loop runs: after its first iterations, and at its end
    let early = s
        .wait_for("loop-1", Duration::from_mins(3), |t| {
            t.steps[1].map.as_ref().is_some_and(|p| p.ok.count() >= 3) || t.process_state.is_terminal()
        })
        .await;
    assert_eq!(early.process_state, ProcessState::Processing, "{:?}", early.reason);
    let early_bytes = item_bytes(&s, "loop-1").await;
    let n = iterations();
    let started = std::time::Instant::now();
    let t = s.wait_for("loop-1", Duration::from_mins(5 + u64::from(n) / 50), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:?}", t.reason);
    let p = t.steps[1].map.as_ref().expect("the loop's progress");
    assert_eq!((p.started, p.ok.count()), (n, n), "until index >= {n}: {n} iterations");
    let last = format!("loop-1~1~{}:list", n - 1);
    assert_eq!(t.outputs()["pages"], json!({ "key": last }), "the last iteration's output");
    let late_bytes = item_bytes(&s, "loop-1").await;
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "[loops] loop of {n} iterations: the task's item {early_bytes} B after 3, {late_bytes} B at the end; {:.1} s after the \
             third",
            started.elapsed().as_secs_f64()
        );
    }
    // what differs: the counters' digits, the statuses and the next steps' records; not the
    // iterations' history, which is in their own items
    assert!(
        late_bytes < early_bytes + 600,
        "the loop's task item: {early_bytes} B after 3 iterations, {late_bytes} B after {n}"
    );
    // each iteration is a task of its own, with its own key
    for i in [0, n / 2, n - 1] {
        let id = TaskId::child(&TaskId::try_from("loop-1").unwrap(), 1, i);
        let it = s.task(id.as_str()).await.expect("the iteration's item");
        assert_eq!(it.process_state, ProcessState::Processed);
        assert_eq!(it.iteration.as_ref().map(|x| x.index), Some(i));
        assert_eq!(it.input, json!({"page": i}), "the loop's parameters read $.loop.index");
        assert_eq!(it.outputs()["list"]["idempotency_key"], format!("{id}:list"));
    }
    assert!(s.task(&format!("loop-1~1~{n}")).await.is_none(), "no iteration past the guard");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test]
async fn a_cancel_stops_a_waiting_loop_and_undoes_every_iteration_newest_first() {
    let s = stack_with("loopcancel", WorkflowRegistry::new(workflows()).unwrap()).await;
    let runner = s.runner();
    let body = json!({"v": 1, "task_id": "paced-1", "workflow": "paced", "input": {}});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;
    let t = s
        .wait_for("paced-1", Duration::from_mins(3), |t| {
            t.steps[1].map.as_ref().is_some_and(|p| p.ok.count() >= 3) || t.process_state.is_terminal()
        })
        .await;
    assert_eq!(t.process_state, ProcessState::Processing, "{:?}", t.reason);
    // the iterations started 2 s apart: the timer between them
    let iteration = |i: u32| TaskId::child(&TaskId::try_from("paced-1").unwrap(), 1, i);
    let first = s.task(iteration(0).as_str()).await.expect("iteration 0").created_at;
    let second = s.task(iteration(1).as_str()).await.expect("iteration 1").created_at;
    assert!(second.0 >= first.0 + 2_000, "iteration 1 was created at {second}, 2 s after iteration 0's {first}");
    let cancel = json!({"type": "cancel", "v": 1, "task_id": "paced-1", "reason": "stop paging"});
    s.send(&s.res.scheduler_queue_url, &cancel.to_string()).await;
    let t = s.wait_for("paced-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Cancelled, "{:?}", t.reason);
    let p = t.steps[1].map.as_ref().expect("the loop's progress").clone();
    assert!(p.started >= 3 && p.started < iterations(), "the cancel stopped the loop: {} iterations", p.started);
    assert_eq!(p.undone.count(), p.ok.count(), "every iteration that applied was undone");
    // each undone once, the newest first: their ends (Compensated) in the reverse of their order
    let mut ends = Vec::new();
    for i in p.ok.ones(p.n) {
        let id = TaskId::child(&TaskId::try_from("paced-1").unwrap(), 1, i);
        let it = s.task(id.as_str()).await.expect("the iteration");
        assert!(
            matches!(it.process_state, ProcessState::Compensated | ProcessState::Cancelled),
            "iteration {i}: {:?}",
            it.process_state
        );
        let undo = it.steps[0].compensation.as_ref();
        if it.process_state == ProcessState::Compensated {
            // done (an attempt a loaded machine held past its deadline is tried again: the same
            // idempotency key, so still undone once)
            assert_eq!(undo.map(|c| c.status), Some(CompensationStatus::Done), "iteration {i}: {undo:?}");
        }
        ends.push((i, it.updated_at));
    }
    let mut by_time = ends.clone();
    by_time.sort_by_key(|(_, at)| *at);
    assert_eq!(
        by_time.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        ends.iter().rev().map(|(i, _)| *i).collect::<Vec<_>>(),
        "undone newest first (iteration, when its undo ended): {ends:?}"
    );
    assert_eq!(t.steps[0].compensation.as_ref().map(|c| c.status), Some(CompensationStatus::Done));
    assert_eq!(t.steps[2].status, StepStatus::Pending, "notify never ran");
    runner.shutdown().await;
    s.delete().await;
}
