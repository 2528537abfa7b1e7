//! Loop steps, driven through the same world as maps and regions (every delivery order, duplicates
//! included): a loop that ends by its guard, by its bound, by a failure inside it, by a cancel
//! (mid-iteration and between iterations), and is undone when a later step fails; what an
//! iteration reads and brings back; and what the task's item keeps (flat, whatever the count).

use serde_json::{json, Value};

use super::decisions::wf;
use super::{call, World, ORDERS};
use crate::ids::TaskId;
use crate::messages::AgentRequest;
use crate::protocol::{Event, ProcessState, StepStatus};
use crate::workflow::{StepDef, WorkflowDef, WorkflowRegistry};

fn step(v: Value) -> StepDef {
    serde_json::from_value(v).unwrap()
}

/// A poll loop: `status` asks for a job's state with this iteration's index; the loop keeps the
/// state and ends once it is `done`.
#[allow(clippy::needless_pass_by_value)]
fn poll(max: u32, extra: Value) -> StepDef {
    let mut v = json!({
        "name": "poll", "kind": "loop", "max_iterations": max,
        "body": [{"name": "status", "agent": "sim", "timeout_ms": 1000, "max_attempts": 2,
                  "parameters": {"i.$": "$.loop.index", "prev.$": "$.loop.previous"},
                  "compensation": {"name": "unstatus", "agent": "sim", "timeout_ms": 1000}}],
        "result_selector": {"state.$": "$.status.state"},
        "until": {"variable": "$.outputs.poll.state", "string_equals": "done"}
    });
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    step(v)
}

/// The job is done from the call whose index is 3 on.
fn done_at_3(r: &AgentRequest) -> Value {
    let i = r.input.get("i").and_then(Value::as_u64).unwrap_or(0);
    json!({"state": if i >= 3 { "done" } else { "running" }})
}

fn never_done(_: &AgentRequest) -> Value {
    json!({"state": "running"})
}

fn order(loop_step: StepDef) -> WorkflowDef {
    wf(vec![call("reserve", Some("release")), loop_step, call("notify", None)])
}

fn iteration(i: u32) -> TaskId {
    TaskId::child(&TaskId::try_from("p").unwrap(), 1, i)
}

/// `def` run on `input` to its end in one of the delivery orders, the world set by `set` first
/// (the service's answers, what it refuses).
fn ran(def: WorkflowDef, input: Value, (seed, twice): (Option<u64>, bool), set: impl FnOnce(&mut World)) -> World {
    let mut w = World::with(def, input);
    set(&mut w);
    w.shuffle = seed;
    w.twice = twice;
    w.run();
    w
}

/// Iterations `newest` down to 0 undone by `unit`, then the steps before the loop (`release`).
fn undone_newest_first(newest: u32, unit: &str) -> Vec<(String, String)> {
    (0..=newest)
        .rev()
        .map(|i| (iteration(i).to_string(), unit.to_owned()))
        .chain([("p".to_owned(), "release".to_owned())])
        .collect()
}

/// The units (task, unit) that ran a compensation, in the order they were asked.
fn undo_order(w: &World) -> Vec<(String, String)> {
    w.requests
        .iter()
        .filter(|(_, s, _)| s.starts_with("un") || s == "release")
        .map(|(t, s, _)| (t.to_string(), s.clone()))
        .fold(Vec::new(), |mut v, x| {
            if !v.contains(&x) {
                v.push(x);
            }
            v
        })
}

#[test]
fn a_loop_runs_its_body_as_one_task_per_iteration_until_its_guard_holds() {
    for (seed, twice) in ORDERS {
        let w = ran(order(poll(10, json!({}))), json!({"job": 7}), (seed, twice), |w| {
            w.answer = Some(done_at_3);
        });
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        assert_eq!(p.outputs()["poll"], json!({"state": "done"}), "the loop's output is its last iteration's");
        let prog = p.steps[1].map.as_ref().unwrap();
        assert_eq!((prog.started, prog.ended.count(), prog.ok.count()), (4, 4, 4), "{seed:?}");
        // one task per iteration, each called once with its own index and the previous output
        let calls: Vec<&(TaskId, String, Value)> = w.requests.iter().filter(|(_, s, _)| s == "status").collect();
        for i in 0..4 {
            let mine: Vec<_> = calls.iter().filter(|(t, _, _)| *t == iteration(i)).collect();
            assert!(!mine.is_empty(), "{seed:?}: iteration {i} called status");
            let prev = if i == 0 { Value::Null } else { json!({"state": "running"}) };
            assert!(mine.iter().all(|(_, _, input)| *input == json!({"i": i, "prev": prev})), "{seed:?}: {mine:?}");
            let t = &w.tasks[&iteration(i)];
            assert_eq!(t.process_state, ProcessState::Processed);
            assert_eq!(t.workflow.name, "order.poll", "an inline body is named after its workflow and step");
            assert_eq!(t.iteration.as_ref().map(|it| it.index), Some(i));
        }
        assert!(!w.tasks.contains_key(&iteration(4)), "{seed:?}: no fifth iteration");
        assert_eq!(w.applied[&iteration(3)], 1);
        assert!(w.requests.iter().any(|(_, s, _)| s == "notify"), "the step after the loop ran");
        assert!(w.undos.is_empty(), "{seed:?}: nothing undone: {:?}", w.undos);
    }
}

#[test]
fn a_while_loop_decides_before_each_iteration_and_may_run_nothing() {
    let counted = |n: u64| {
        poll(
            10,
            json!({"until": null, "while": {"variable": "$.loop.index", "numeric_less_than": n},
                   "on_bound": "succeed"}),
        )
    };
    for (seed, twice) in ORDERS {
        let w = ran(order(counted(0)), json!({}), (seed, twice), |_| {});
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
        assert_eq!(p.outputs()["poll"], Value::Null, "no iteration ran");
        assert!(w.elements().is_empty());
        let w = ran(order(counted(3)), json!({}), (seed, twice), |w| {
            w.answer = Some(never_done);
        });
        assert_eq!(w.parent().process_state, ProcessState::Processed, "{:?}", w.parent().reason);
        assert_eq!(w.elements().len(), 3, "{seed:?}: indexes 0, 1, 2");
    }
}

#[test]
fn a_loop_that_reaches_its_bound_fails_and_every_iteration_is_undone_newest_first() {
    for (seed, twice) in ORDERS {
        let w = ran(order(poll(4, json!({}))), json!({}), (seed, twice), |w| {
            w.answer = Some(never_done);
        });
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        let why = p.reason.clone().unwrap();
        assert!(why.contains("loop step poll failed permanently: it ran max_iterations (4) with its until"), "{why}");
        assert_eq!(w.elements().len(), 4, "never more iterations than the bound");
        let order = undo_order(&w);
        let expected = undone_newest_first(3, "unstatus");
        assert_eq!(order, expected, "{seed:?}: each iteration undone once, the newest first, then the steps before");
        for i in 0..4 {
            assert_eq!(w.undos[&(iteration(i), "unstatus".to_owned())], 1, "{seed:?}: undone once");
            assert_eq!(w.tasks[&iteration(i)].process_state, ProcessState::Compensated);
        }
        assert_eq!(p.steps[1].map.as_ref().unwrap().undone.count(), 4);
    }
    // the same loop with on_bound: succeed ends there, succeeded
    let mut w = World::with(order(poll(4, json!({"on_bound": "succeed"}))), json!({}));
    w.answer = Some(never_done);
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Processed, "{:?}", w.parent().reason);
    assert_eq!(w.parent().outputs()["poll"], json!({"state": "running"}));
}

/// A paging body of two steps: `tag` (undone by `untag`) then `check`, which the service refuses
/// in iteration 2.
fn tagging() -> StepDef {
    step(json!({
        "name": "pages", "kind": "loop", "max_iterations": 10,
        "body": [
            {"name": "tag", "agent": "sim", "timeout_ms": 1000,
             "compensation": {"name": "untag", "agent": "sim", "timeout_ms": 1000}},
            {"name": "check", "agent": "sim", "timeout_ms": 1000, "parameters": {"i.$": "$.loop.index"}}],
        "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 5}
    }))
}

fn refuse_check_2(r: &AgentRequest) -> Value {
    json!({"i": r.input.get("i").cloned().unwrap_or(Value::Null)})
}

#[test]
fn a_failure_inside_an_iteration_undoes_it_then_the_iterations_before_then_the_steps_before() {
    for (seed, twice) in ORDERS {
        let w = ran(order(tagging()), json!({}), (seed, twice), |w| {
            w.answer = Some(refuse_check_2);
            w.refuse.insert(2); // the element index of the task's id: iteration 2's calls are refused
        });
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        let why = p.reason.clone().unwrap();
        assert!(why.contains("loop step pages: its iteration 2 (task p~1~2) ended Compensated"), "{why}");
        assert_eq!(w.elements().len(), 3, "{seed:?}: no iteration after the failed one");
        // iteration 2's tag was refused too (refuse applies to its every forward call): nothing of
        // it applied, so nothing of it is undone
        let order = undo_order(&w);
        assert_eq!(order, undone_newest_first(1, "untag"), "{seed:?}");
        assert_eq!(w.tasks[&iteration(2)].process_state, ProcessState::Compensated);
        assert!(!w.requests.iter().any(|(_, s, _)| s == "notify"));
    }
}

/// Iteration 1's answer is larger than an end may carry back.
fn too_large_at_1(r: &AgentRequest) -> Value {
    let i = r.input.get("i").and_then(Value::as_u64).unwrap_or(0);
    let blob = if i == 1 { "x".repeat(crate::messages::MAX_ENDED_OUTPUT_BYTES) } else { String::new() };
    json!({"state": "running", "blob": blob})
}

#[test]
fn an_iteration_whose_output_is_too_large_to_come_back_fails_the_loop_and_is_undone_with_the_others() {
    for (seed, twice) in ORDERS {
        let w = ran(order(poll(10, json!({}))), json!({}), (seed, twice), |w| {
            w.answer = Some(too_large_at_1);
        });
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        let why = p.reason.clone().unwrap();
        assert!(
            why.contains("step poll: its task p~1~1 ended Processed, but its output is")
                && why.contains(&format!("over the {} an end may carry back", crate::messages::MAX_ENDED_OUTPUT_BYTES)),
            "{why}"
        );
        // iteration 1 succeeded (its effect applied): undone with iteration 0, newest first, and
        // its task then ends Compensated as theirs do
        assert_eq!(w.tasks[&iteration(1)].process_state, ProcessState::Compensated);
        assert_eq!(w.elements().len(), 2, "{seed:?}: no iteration after it");
        assert_eq!(undo_order(&w), undone_newest_first(1, "unstatus"), "{seed:?}");
        assert!(!w.requests.iter().any(|(_, s, _)| s == "notify"));
    }
}

#[test]
fn a_cancel_stops_the_running_iteration_which_undoes_itself_then_the_loop_is_undone_newest_first() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(order(tagging()), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        // run until iteration 2 has tagged, then cancel the task
        while let Some((id, e)) = w.next() {
            w.step(&id, e);
            if w.applied.get(&iteration(2)).is_some_and(|n| *n >= 1) {
                break;
            }
        }
        let pid = TaskId::try_from("p").unwrap();
        w.queue.push_back((pid, Event::Cancel { reason: "customer asked".into(), run: None }));
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Cancelled, "{seed:?}: {:?}", p.reason);
        let started = p.steps[1].map.as_ref().unwrap().started;
        assert_eq!(w.elements().len(), started as usize, "{seed:?}: every iteration started was counted");
        assert!(started <= 5, "{seed:?}: no iteration past the guard's end");
        // every iteration that tagged is untagged once, the newest first
        let tagged: Vec<TaskId> = (0..10).map(iteration).filter(|t| w.applied.contains_key(t)).collect();
        let order = undo_order(&w);
        let untags: Vec<&(String, String)> = order.iter().filter(|(_, s)| s == "untag").collect();
        assert_eq!(untags.len(), tagged.len(), "{seed:?}: {order:?}");
        let ids: Vec<String> = untags.iter().map(|(t, _)| t.clone()).collect();
        let mut newest_first = ids.clone();
        newest_first.sort_by_key(|t| std::cmp::Reverse(TaskId::try_from(t.as_str()).unwrap().parent_of().unwrap().2));
        assert_eq!(ids, newest_first, "{seed:?}");
        assert_eq!(order.last().map(|(t, s)| (t.as_str(), s.as_str())), Some(("p", "release")), "{seed:?}");
        for t in &tagged {
            assert_eq!(w.undos[&(t.clone(), "untag".to_owned())], 1, "{seed:?}: {t} untagged once");
        }
    }
}

#[test]
fn a_loop_waits_between_iterations_on_a_timer_and_a_cancel_then_stops_it() {
    let waiting = poll(10, json!({"wait_ms": 30_000}));
    let mut w = World::with(order(waiting.clone()), json!({}));
    w.answer = Some(done_at_3);
    w.timers = true;
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    for i in 1..4 {
        let (a, b) = (w.tasks[&iteration(i - 1)].created_at.0, w.tasks[&iteration(i)].created_at.0);
        assert!(b - a >= 30_000, "iteration {i} starts 30 s after the one before ({a} -> {b})");
    }
    // a cancel while the loop waits: no iteration runs any more, and those that ran are undone
    let mut w = World::with(order(waiting), json!({}));
    w.answer = Some(never_done);
    w.timers = true;
    while let Some((id, e)) = w.next() {
        w.step(&id, e);
        if w.parent().lock.locked_by.is_some() && w.parent().steps[1].map.as_ref().is_some_and(|m| m.ok.count() == 2) {
            break;
        }
    }
    assert!(crate::protocol::in_wait(w.parent()), "the loop waits between iterations 1 and 2");
    w.queue.clear(); // the timer has not fired yet
    let pid = TaskId::try_from("p").unwrap();
    w.queue.push_back((pid, Event::Cancel { reason: "stop polling".into(), run: None }));
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Cancelled, "{:?}", p.reason);
    assert_eq!(w.elements().len(), 2, "no iteration after the cancel");
    let order = undo_order(&w);
    assert_eq!(order, undone_newest_first(1, "unstatus"));
}

#[test]
fn an_inline_body_reads_and_sets_the_task_s_variables_and_they_come_back() {
    let counter = step(json!({
        "name": "count", "kind": "loop", "max_iterations": 20,
        "body": [{"name": "add", "agent": "sim", "timeout_ms": 1000,
                  "parameters": {"n.$": "$.vars.n"},
                  "assign": {"n.$": "States.MathAdd($.vars.n, 2)"}}],
        "until": {"variable": "$.vars.n", "numeric_greater_than_equals": 7}
    }));
    let start = step(json!({"name": "start", "agent": "sim", "timeout_ms": 1000, "assign": {"n": 1}}));
    let mut after = call("after", None);
    after.parameters = Some(serde_json::from_value(json!({"n.$": "$.vars.n"})).unwrap());
    for (seed, twice) in ORDERS {
        let w = ran(wf(vec![start.clone(), counter.clone(), after.clone()]), json!({}), (seed, twice), |_| {});
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        assert_eq!(p.vars["n"], 7, "1, then 3, 5, 7: three iterations");
        assert_eq!(w.elements().len(), 3);
        let sent: Vec<Value> = (0..3)
            .map(|i| {
                let id = iteration(i);
                w.requests.iter().find(|(t, _, _)| *t == id).map(|r| r.2.clone()).unwrap()
            })
            .collect();
        assert_eq!(sent, vec![json!({"n": 1}), json!({"n": 3}), json!({"n": 5})], "each iteration reads the last's");
        assert!(w.requests.iter().any(|(_, s, i)| s == "after" && *i == json!({"n": 7})));
    }
}

#[test]
fn the_task_s_item_stays_the_same_size_whatever_the_number_of_iterations() {
    let counted = |n: u32| {
        step(json!({
            "name": "poll", "kind": "loop", "max_iterations": n, "on_bound": "succeed",
            "body": [{"name": "status", "agent": "sim", "timeout_ms": 1000}],
            "result_selector": {"state.$": "$.status.step"},
            "until": {"variable": "$.outputs.poll.state", "string_equals": "never"}
        }))
    };
    let size = |n: u32| {
        let mut w = World::with(order(counted(n)), json!({}));
        w.uncounted = true;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
        assert_eq!(w.elements().len(), n as usize);
        let pid = TaskId::try_from("p").unwrap();
        let writes = w.writes[&pid];
        let bytes = serde_json::to_vec(&p.steps).unwrap().len() + serde_json::to_vec(&p.history).unwrap().len();
        // each iteration: its claim and its one step's end; the parent: one write per iteration
        let per_iteration: Vec<u32> = (0..n).map(|i| w.writes[&iteration(i)]).collect();
        (bytes, writes, per_iteration)
    };
    let (small, small_writes, small_each) = size(10);
    let (big, big_writes, big_each) = size(1000);
    // the counters and the bitmaps' runs ("r1000:0-999") take a few more digits, nothing more
    assert!(big <= small + 24, "the item grows by the digits of its counters only: {small} B at 10, {big} B at 1000");
    assert_eq!(big_writes - small_writes, 990, "one write of the task per iteration");
    assert!(small_each.iter().chain(&big_each).all(|w| *w == 2), "two writes per iteration's task");
}

#[test]
fn a_named_body_runs_as_its_workflow_and_reads_the_iteration_through_its_parameters() {
    let body = WorkflowDef {
        name: "check-once".into(),
        steps: vec![step(json!({"name": "status", "agent": "sim", "timeout_ms": 1000,
                                 "parameters": {"i.$": "$.input.i"}}))],
        ..wf(vec![])
    };
    let named = step(json!({
        "name": "poll", "kind": "loop", "max_iterations": 10, "workflow": "check-once", "version": 1,
        "parameters": {"i.$": "$.loop.index"},
        "result_selector": {"state.$": "$.status.state"},
        "until": {"variable": "$.outputs.poll.state", "string_equals": "done"}
    }));
    let registry = WorkflowRegistry::new([body, order(named)]).unwrap();
    let def = registry.resolve("order", Some(1)).unwrap().clone();
    let mut w = World::with(def, json!({}));
    w.answer = Some(done_at_3);
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Processed, "{:?}", w.parent().reason);
    assert_eq!(w.elements().len(), 4);
    assert_eq!(w.tasks[&iteration(2)].workflow.name, "check-once");
    assert_eq!(w.tasks[&iteration(2)].input, json!({"i": 2}));
}

#[test]
fn an_iteration_s_calls_are_retried_within_it_and_keys_differ_per_iteration() {
    let mut w = World::with(order(poll(10, json!({}))), json!({}));
    w.answer = Some(done_at_3);
    w.flaky.insert(1); // iteration 1's calls fail with a 503: its 2 attempts are spent
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Compensated, "{:?}", p.reason);
    let one = &w.tasks[&iteration(1)];
    assert_eq!(one.steps[0].attempts, 2, "both attempts in iteration 1's own task");
    assert_eq!(w.requests.iter().filter(|(t, s, _)| *t == iteration(1) && s == "status").count(), 2);
    assert_eq!(p.steps[1].status, StepStatus::Failed);
    // one key per iteration and unit, the same for each retry within it
    let keys = |i: u32| -> std::collections::BTreeSet<String> {
        w.keys.iter().filter(|(t, k)| *t == iteration(i) && k.ends_with(":status")).map(|(_, k)| k.clone()).collect()
    };
    assert_eq!(keys(1).len(), 1, "{:?}", keys(1));
    assert_eq!(keys(0).len(), 1);
    assert_ne!(keys(0), keys(1));
    assert!(keys(1).iter().all(|k| k.starts_with("p~1~1:")), "{:?}", keys(1));
}

/// Why a workflow with this loop step is refused (as its file is read, then as it is loaded).
#[allow(clippy::needless_pass_by_value)]
fn refusal(loop_step: Value) -> String {
    let def = json!({"name": "order", "version": 1, "steps": [
        {"name": "reserve", "agent": "sim", "timeout_ms": 1000}, loop_step]});
    match serde_json::from_value::<WorkflowDef>(def) {
        Err(e) => e.to_string(),
        Ok(d) => WorkflowRegistry::new([d]).err().map(|e| e.to_string()).unwrap_or_default(),
    }
}

#[test]
fn a_loop_without_a_bound_or_with_a_guard_blind_to_its_iterations_is_refused_with_the_reason() {
    let body = json!([{"name": "status", "agent": "sim", "timeout_ms": 1000}]);
    let until = json!({"variable": "$.outputs.poll.status.state", "string_equals": "done"});
    let with = |extra: Value| {
        let mut v = json!({"name": "poll", "kind": "loop", "body": body, "until": until, "max_iterations": 5});
        for (k, x) in extra.as_object().unwrap() {
            if x.is_null() {
                v.as_object_mut().unwrap().remove(k);
            } else {
                v[k] = x.clone();
            }
        }
        refusal(v)
    };
    assert_eq!(with(json!({})), "", "the loop as given is valid");
    for (extra, expected) in [
        (json!({"max_iterations": null}), "a loop step needs max_iterations, its bound (1 to 10000)"),
        (json!({"max_iterations": 0}), "max_iterations 0 is outside 1..=10000: a loop needs a bound"),
        (json!({"max_iterations": 10_001}), "max_iterations 10001 is outside 1..=10000"),
        (json!({"while": until}), "exactly one of while (decided before each iteration) and until"),
        (json!({"until": null}), "exactly one of while (decided before each iteration) and until"),
        (json!({"body": null}), "runs exactly one of body (its steps) and workflow + version"),
        (json!({"workflow": "x", "version": 1}), "runs exactly one of body (its steps) and workflow + version"),
        (
            json!({"until": {"variable": "$.input.done", "boolean_equals": true}}),
            "until reads nothing an iteration changes ($.loop.index, $.outputs.poll…, or a variable its body sets)",
        ),
        (
            json!({"until": {"variable": "$.outputs.notify.ok", "boolean_equals": true}}),
            "until reads $.outputs.notify.ok, and step notify does not come before the loop",
        ),
        (json!({"wait_ms": 60_000, "max_iterations": 2000}), "waits 119940000 ms in all, and the loop's timeout_ms is"),
        (
            json!({"compensation": {"name": "undo", "agent": "sim", "timeout_ms": 1000}}),
            "a loop step takes no compensation",
        ),
        (json!({"max_attempts": 3}), "a loop step takes no compensation and no retries"),
        (json!({"agent": "sim"}), "a loop step has no agent"),
        (json!({"wait_until": "/input/at"}), "a loop step has no agent, heartbeat_ms, wait_until or wait_for"),
        (
            json!({"body": [{"name": "status", "agent": "sim", "timeout_ms": 0}]}),
            "step poll: its body's step status: timeout_ms 0 is outside",
        ),
        (
            json!({"body": [{"name": "status", "agent": "sim", "timeout_ms": 1000,
                             "parameters": {"x.$": "$.vars.nope"}}]}),
            "its body's step status: parameters reads $.vars.nope, and no step before it sets nope",
        ),
    ] {
        let e = with(extra.clone());
        assert!(e.contains(expected), "{extra}: {e}");
    }
    // $.loop outside a loop's body
    let e =
        refusal(json!({"name": "notify", "agent": "sim", "timeout_ms": 1000, "parameters": {"i.$": "$.loop.index"}}));
    assert!(e.contains("parameters reads $.loop.index, and it is not in a loop's body"), "{e}");
}

#[test]
fn loops_nest_at_most_two_levels_of_tasks_deep() {
    let inner = |body: Value| {
        json!({"name": "inner", "kind": "loop", "max_iterations": 3, "body": body,
                                     "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 2}})
    };
    let outer = |body: Value| {
        json!({"name": "outer", "kind": "loop", "max_iterations": 3, "body": [body],
                                     "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 2}})
    };
    let call = json!({"name": "status", "agent": "sim", "timeout_ms": 1000});
    assert_eq!(refusal(outer(inner(json!([call])))), "", "a loop in a loop: two levels");
    let map = json!({"name": "each", "agent": "sim", "timeout_ms": 1000, "map": {"items": "/input/lines"}});
    let e = refusal(outer(inner(json!([map]))));
    assert!(e.contains("its tasks would nest 3 levels deep") && e.contains("at most 2"), "{e}");
}

#[test]
fn a_loop_step_is_written_back_as_it_was_read() {
    let def = order(poll(10, json!({"wait_ms": 5000, "on_bound": "succeed"})));
    let text = serde_json::to_value(&def).unwrap();
    let step = &text["steps"][1];
    assert_eq!(step["kind"], "loop");
    assert_eq!(step["body"][0]["name"], "status");
    assert_eq!(step["until"]["string_equals"], "done");
    assert_eq!((step["max_iterations"].clone(), step["wait_ms"].clone()), (json!(10), json!(5000)));
    assert_eq!(step["on_bound"], "succeed");
    assert!(step.get("workflow").is_none() && step.get("while").is_none());
    let back: WorkflowDef = serde_json::from_value(text).unwrap();
    assert_eq!(back, def);
}

#[test]
fn an_iteration_whose_body_calls_a_workflow_is_undone_through_its_child() {
    let child = WorkflowDef {
        name: "tagger".into(),
        steps: vec![step(json!({"name": "tag", "agent": "sim", "timeout_ms": 1000,
                                 "compensation": {"name": "untag", "agent": "sim", "timeout_ms": 1000}}))],
        ..wf(vec![])
    };
    let looped = step(json!({
        "name": "pages", "kind": "loop", "max_iterations": 2, "on_bound": "fail",
        "body": [{"name": "run", "kind": "workflow", "workflow": "tagger", "version": 1}],
        "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 5}
    }));
    let registry = WorkflowRegistry::new([child, order(looped)]).unwrap();
    let mut w = World::with(registry.resolve("order", Some(1)).unwrap().clone(), json!({}));
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Compensated, "{:?}", w.parent().reason);
    let order = undo_order(&w);
    let grandchild = |i: u32| TaskId::child(&iteration(i), 0, 0).to_string();
    assert_eq!(
        order,
        vec![
            (grandchild(1), "untag".to_owned()),
            (grandchild(0), "untag".to_owned()),
            ("p".to_owned(), "release".to_owned())
        ],
        "each iteration undoes its workflow step's child, the newest first"
    );
}

#[test]
fn a_failure_after_the_loop_undoes_every_iteration_newest_first_then_the_steps_before() {
    for (seed, twice) in ORDERS {
        let w = ran(order(poll(10, json!({}))), json!({}), (seed, twice), |w| {
            w.answer = Some(done_at_3);
            w.refuse_steps.insert("notify");
        });
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        assert_eq!(p.steps[1].status, StepStatus::Succeeded, "the loop itself succeeded");
        assert_eq!(undo_order(&w), undone_newest_first(3, "unstatus"), "{seed:?}");
        for i in 0..4 {
            assert_eq!(w.undos[&(iteration(i), "unstatus".to_owned())], 1, "{seed:?}: iteration {i} undone once");
        }
    }
}

/// The job of Step Functions' `.sync`, as `sasctl import-asl` writes it: the first iteration
/// starts it, the next ones poll it, each step of the body guarded by what the iteration is for.
#[test]
fn an_iteration_decides_its_first_step_s_guard_so_a_start_runs_once_and_polls_after_it() {
    let inline = step(json!({
        "name": "job", "kind": "loop", "max_iterations": 10,
        "parameters": {"*.choose": [
            {"when": {"variable": "$.loop.index", "numeric_equals": 0}, "value": {"start": {"n": 1}}},
            {"value": {"poll": {"i.$": "$.loop.index"}}}]},
        "body": [{"name": "start", "agent": "sim", "timeout_ms": 1000,
                  "when": {"variable": "$.input.start", "is_present": true}},
                 {"name": "status", "agent": "sim", "timeout_ms": 1000, "parameters": {"i.$": "$.input.poll.i"},
                  "when": {"variable": "$.input.poll", "is_present": true}}],
        "result_selector": {"state.$": "$.status.state"},
        "until": {"variable": "$.outputs.job.state", "string_equals": "done"}
    }));
    for (seed, twice) in ORDERS {
        let w = ran(order(inline.clone()), json!({}), (seed, twice), |w| w.answer = Some(done_at_3));
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        let ran_in = |unit: &str| -> Vec<TaskId> {
            let mut v: Vec<TaskId> =
                w.requests.iter().filter(|(_, s, _)| s == unit).map(|(t, _, _)| t.clone()).collect();
            v.dedup();
            v
        };
        assert_eq!(ran_in("start"), [iteration(0)], "{seed:?}: the start, in the first iteration only");
        assert_eq!(ran_in("status"), (1..=3).map(iteration).collect::<Vec<_>>(), "{seed:?}");
        assert_eq!(w.tasks[&iteration(0)].steps[1].status, StepStatus::Skipped, "{seed:?}");
        assert_eq!(w.tasks[&iteration(2)].steps[0].status, StepStatus::Skipped, "{seed:?}");
    }
}
