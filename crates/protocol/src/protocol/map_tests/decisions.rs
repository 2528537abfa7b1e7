//! Guards, skips and handled failures, driven through the same world as the maps and regions
//! (every delivery order, duplicates included).

use serde_json::{json, Value};

use super::{after, call, World, ORDERS};
use crate::condition::Condition;
use crate::ids::TaskId;
use crate::protocol::{ProcessState, StepStatus, Task};
use crate::workflow::{FailureKind, Handled, OnFailure, StepDef, StepFailure, WorkflowDef, WorkflowError};

#[allow(clippy::needless_pass_by_value)]
fn when(step: StepDef, c: Value) -> StepDef {
    StepDef { when: Some(Condition::from_json(&c).unwrap()), ..step }
}

pub(super) fn wf(steps: Vec<StepDef>) -> WorkflowDef {
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "order".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps,
    }
}

fn pid() -> TaskId {
    TaskId::try_from("p").unwrap()
}

fn status(p: &Task, name: &str) -> StepStatus {
    p.steps.iter().find(|s| s.name == name).unwrap().status
}

fn ran(w: &World, name: &str) -> usize {
    w.requests.iter().filter(|(_, s, _)| s == name).count()
}

fn over(amount: u64) -> Value {
    json!({"variable": "$.input.amount", "numeric_greater_than": amount})
}

/// quote -> approve (above 1,000 only) -> charge -> ship: approve is optional in a list.
fn approval() -> WorkflowDef {
    wf(vec![
        call("quote", Some("unquote")),
        when(call("approve", Some("unapprove")), over(1_000)),
        call("charge", Some("refund")),
        call("ship", None),
    ])
}

#[test]
fn a_guard_decides_once_whether_a_step_runs_and_a_skipped_step_is_never_dispatched_nor_undone() {
    for (seed, twice) in ORDERS {
        for amount in [500, 1_500] {
            let mut w = World::with(approval(), json!({"amount": amount}));
            w.shuffle = seed;
            w.twice = twice;
            w.refuse_steps.insert("ship");
            w.run();
            let p = w.parent().clone();
            assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
            assert_eq!(w.undone(&pid()), if amount > 1_000 { 3 } else { 2 }, "{:?}", w.undos);
            if amount > 1_000 {
                assert_eq!(status(&p, "approve"), StepStatus::Succeeded);
                assert_eq!(ran(&w, "approve"), 1);
                assert_eq!(ran(&w, "unapprove"), 1);
            } else {
                assert_eq!(status(&p, "approve"), StepStatus::Skipped);
                let why = p.steps[1].skipped.as_deref().unwrap();
                assert_eq!(why, "when was false: $.input.amount numeric_greater_than 1000");
                assert_eq!(ran(&w, "approve") + ran(&w, "unapprove"), 0, "a skipped step never runs nor is undone");
                // the step after it runs: it left `after` out, so it follows approve in order only
                assert_eq!(ran(&w, "charge"), 1);
                assert!(p.steps[1].attempts == 0 && p.steps[1].output.is_none());
            }
        }
    }
}

#[test]
fn a_skip_costs_no_write_of_its_own() {
    let run = |steps: Vec<StepDef>| {
        let mut w = World::with(wf(steps), json!({"amount": 10}));
        w.run();
        assert_eq!(w.parent().process_state, ProcessState::Processed);
        w.writes[&pid()]
    };
    let with_skip = run(vec![call("a", None), when(call("b", None), over(1_000)), call("c", None)]);
    let without = run(vec![call("a", None), call("c", None)]);
    assert_eq!(with_skip, without, "the skip rides on the write that ends a");
    // the first and the last steps: decided in the submission's write and in the one that ends
    let mut w = World::with(
        wf(vec![when(call("a", None), over(1_000)), call("b", None), when(call("c", None), over(1_000))]),
        json!({"amount": 10}),
    );
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed);
    assert_eq!(
        [status(&p, "a"), status(&p, "b"), status(&p, "c")],
        [StepStatus::Skipped, StepStatus::Succeeded, StepStatus::Skipped]
    );
    assert_eq!(w.requests.len(), 1, "only b ran");
    // a task whose every step is skipped is Processed in the write that creates it
    let w = World::with(wf(vec![when(call("a", None), over(1_000))]), json!({"amount": 10}));
    assert_eq!(w.parent().process_state, ProcessState::Processed);
    assert!(w.requests.is_empty() && w.queue.is_empty());
}

/// fraud, then one of review (score above 80) and ship (else), hold after review only, notify
/// after either: the steps after fraud are a parallel region whose branches have guards.
fn routing() -> WorkflowDef {
    let high = json!({"variable": "$.input.score", "numeric_greater_than": 80});
    wf(vec![
        call("fraud", Some("unfraud")),
        when(after(call("review", Some("unreview")), &["fraud"]), high.clone()),
        when(after(call("ship", Some("unship")), &["fraud"]), json!({"not": high})),
        after(call("hold", Some("unhold")), &["review"]),
        after(call("notify", None), &["review", "ship"]),
    ])
}

#[test]
fn one_of_n_branches_runs_a_step_after_only_skipped_steps_is_skipped_and_a_join_runs_after_either() {
    assert_eq!(routing().regions(), vec![1..5], "review, ship, hold and notify run as branches");
    for (seed, twice) in ORDERS {
        for score in [90, 10] {
            let mut w = World::with(routing(), json!({"score": score}));
            w.shuffle = seed;
            w.twice = twice;
            w.run();
            let p = w.parent().clone();
            assert_eq!(p.process_state, ProcessState::Processed, "{seed:?} {score}: {:?}", p.reason);
            let high = score > 80;
            let expect = |run: bool| if run { StepStatus::Succeeded } else { StepStatus::Skipped };
            assert_eq!(status(&p, "review"), expect(high), "{score}");
            assert_eq!(status(&p, "ship"), expect(!high), "{score}");
            assert_eq!(status(&p, "hold"), expect(high), "{score}: hold waits for review alone");
            assert_eq!(status(&p, "notify"), StepStatus::Succeeded, "{score}: one of the steps it waits for ran");
            for s in ["review", "ship", "hold"] {
                let should = usize::from(status(&p, s) == StepStatus::Succeeded);
                assert_eq!(ran(&w, s), should, "{seed:?} {score}: {s} ran {} times", ran(&w, s));
            }
            if !high {
                let hold = p.steps.iter().find(|s| s.name == "hold").unwrap();
                assert_eq!(hold.skipped.as_deref(), Some("every step it waits for was skipped (review)"));
            }
            // the skipped branches were never tasks of their own
            let branches = w.elements().len();
            assert_eq!(branches, if high { 3 } else { 2 }, "{seed:?} {score}");
        }
    }
}

#[test]
fn a_region_whose_branches_are_all_skipped_ends_at_once_and_a_failure_after_it_undoes_only_what_ran() {
    for score in [10, 90] {
        let mut w = World::with(routing(), json!({"score": score}));
        w.refuse_steps.insert("notify");
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{:?}", p.reason);
        let undone: Vec<&str> =
            w.requests.iter().filter(|(_, s, _)| s.starts_with("un")).map(|(_, s, _)| s.as_str()).collect();
        if score > 80 {
            assert!(undone.contains(&"unreview") && undone.contains(&"unhold") && !undone.contains(&"unship"));
        } else {
            assert!(undone.contains(&"unship") && !undone.contains(&"unreview") && !undone.contains(&"unhold"));
        }
        assert!(undone.contains(&"unfraud"), "{undone:?}");
    }
    // every branch of a region skipped: the region ends in the write that decides it
    let never = json!({"variable": "$.input.score", "is_present": false});
    let mut w = World::with(
        wf(vec![
            call("a", None),
            when(after(call("b", None), &["a"]), never.clone()),
            when(after(call("c", None), &["a"]), never),
            after(call("d", None), &["b", "c"]),
        ]),
        json!({"score": 1}),
    );
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    assert_eq!([status(&p, "b"), status(&p, "c"), status(&p, "d")], [StepStatus::Skipped; 3]);
    assert!(w.elements().is_empty());
}

fn gift(on_failure: StepFailure) -> WorkflowDef {
    let failed = json!({"variable": "$.outputs.giftwrap.error", "is_present": true});
    wf(vec![
        call("charge", Some("refund")),
        StepDef { on_failure, ..call("giftwrap", Some("unwrap")) },
        when(call("apologize", None), failed),
        call("ship", Some("unship")),
    ])
}

#[test]
fn a_handled_failure_is_a_path_its_error_is_its_output_and_what_applied_is_still_undone() {
    for (seed, twice) in ORDERS {
        // refused: the task goes on, a guard reads the error, no alert
        let mut w = World::with(gift(StepFailure::Continue(Vec::new())), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        w.refuse_steps.insert("giftwrap");
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        assert_eq!(status(&p, "giftwrap"), StepStatus::Failed);
        assert_eq!(p.outputs()["giftwrap"]["error"]["kind"], "permanent");
        assert!(p.outputs()["giftwrap"]["error"]["message"].as_str().unwrap().contains("out of stock"));
        assert_eq!(status(&p, "apologize"), StepStatus::Succeeded, "its guard read the error");
        assert!(w.alerts.is_empty(), "a handled failure alerts nobody: {:?}", w.alerts);
    }
    // failed retryably (it may have applied): the task goes on, and when it later fails, the
    // step is undone with the ones before it
    let mut w = World::with(gift(StepFailure::Continue(vec![Handled::Kind(FailureKind::Retryable)])), json!({}));
    w.flaky_steps.insert("giftwrap");
    w.refuse_steps.insert("ship");
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Compensated, "{:?}", p.reason);
    assert_eq!(p.outputs()["giftwrap"]["error"]["kind"], "retryable");
    assert_eq!((ran(&w, "unwrap"), ran(&w, "refund"), ran(&w, "unship")), (1, 1, 0), "{:?}", w.requests);
    // an error named as its agent names it: the step continues on that name only
    for (name, continues) in [("Shop.OutOfStock", true), ("Shop.Closed", false)] {
        let handled = vec![Handled::Kind(FailureKind::TimedOut), Handled::Error(name.into())];
        let mut w = World::with(gift(StepFailure::Continue(handled)), json!({}));
        w.refuse_steps.insert("giftwrap");
        w.run();
        let p = w.parent().clone();
        if continues {
            assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
            assert_eq!(p.outputs()["giftwrap"]["error"]["name"], "Shop.OutOfStock");
            assert_eq!(p.outputs()["giftwrap"]["error"]["kind"], "permanent");
        } else {
            assert_eq!(p.process_state, ProcessState::Compensated, "another name: {:?}", p.reason);
        }
    }
    // a kind the step does not handle fails the task as before
    let mut w = World::with(gift(StepFailure::Continue(vec![Handled::Kind(FailureKind::TimedOut)])), json!({}));
    w.refuse_steps.insert("giftwrap");
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Compensated);
    assert_eq!((ran(&w, "apologize"), ran(&w, "refund")), (0, 1));
    assert_eq!(w.alerts.len(), 0, "a refusal raises no alert (only spent retries do)");
}

#[test]
fn guards_that_can_never_resolve_and_misplaced_options_are_refused_when_the_workflow_loads() {
    let refused = |steps: Vec<StepDef>| match wf(steps).validate() {
        Err(WorkflowError::Step { step, problem, .. }) => format!("{step}: {problem}"),
        other => panic!("taken: {other:?}"),
    };
    let reads = |p: &str| json!({"variable": p, "is_present": true});
    let e = refused(vec![call("a", None), when(call("b", None), reads("$.outputs.nope.x"))]);
    assert!(e.contains("b: when reads $.outputs.nope.x, and the workflow has no step \"nope\""), "{e}");
    let e = refused(vec![when(call("a", None), reads("$.outputs.b")), call("b", None)]);
    assert!(e.contains("step b does not come before a"), "{e}");
    let e = refused(vec![
        call("a", None),
        after(call("b", None), &["a"]),
        when(after(call("c", None), &["a"]), reads("$.outputs.b.id")),
    ]);
    assert!(e.contains("step b does not come before c"), "a sibling branch: {e}");
    let mut comp = call("a", Some("undo"));
    comp.compensation.as_mut().unwrap().when = Some(Condition::from_json(&reads("$.input.x")).unwrap());
    assert!(refused(vec![comp]).contains("a compensation takes no when"));
    let mut map = super::map_step(2, crate::workflow::Tolerance::None);
    map.on_failure = StepFailure::Continue(Vec::new());
    assert!(refused(vec![map]).contains("a map step takes no on_failure"));
    // what is taken: the input, an earlier step in a list, a step named in after (or before it)
    wf(vec![
        call("a", None),
        when(call("b", None), reads("$.outputs.a.id")),
        when(after(call("c", None), &["b"]), json!({"and": [reads("$.outputs.a"), reads("$.input.x")]})),
    ])
    .validate()
    .unwrap();
}

#[test]
fn guards_and_handled_failures_read_back_from_a_workflow_file() {
    let file = json!({"name": "order", "version": 1, "steps": [
        {"name": "quote", "agent": "sim", "timeout_ms": 1000},
        {"name": "approve", "agent": "sim", "timeout_ms": 1000,
         "when": {"variable": "$.outputs.quote.total", "numeric_greater_than": 1000}},
        {"name": "giftwrap", "agent": "sim", "timeout_ms": 1000, "on_failure": {"continue": ["permanent", "timed_out"]}},
        {"name": "ship", "agent": "sim", "timeout_ms": 1000, "on_failure": "continue"},
        {"name": "fetch", "agent": "sim", "timeout_ms": 1000, "on_failure": {"continue": ["S3.NoSuchKeyException", "timed_out"]}}
    ]});
    let def: WorkflowDef = serde_json::from_value(file.clone()).unwrap();
    def.validate().unwrap();
    assert_eq!(
        def.steps[2].on_failure,
        StepFailure::Continue(vec![Handled::Kind(FailureKind::Permanent), Handled::Kind(FailureKind::TimedOut)])
    );
    assert_eq!(
        def.steps[4].on_failure,
        StepFailure::Continue(vec![
            Handled::Error("S3.NoSuchKeyException".into()),
            Handled::Kind(FailureKind::TimedOut)
        ])
    );
    let back = serde_json::to_value(&def).unwrap();
    assert_eq!(back["steps"][1]["when"], file["steps"][1]["when"]);
    assert_eq!(back["steps"][2]["on_failure"], file["steps"][2]["on_failure"]);
    assert_eq!(back["steps"][3]["on_failure"], "continue");
    assert!(back["steps"][0].get("on_failure").is_none() && back["steps"][0].get("when").is_none());
    let bad = json!({"name": "x", "agent": "sim", "timeout_ms": 1000, "on_failure": {"continue": ["late"]}});
    let e = serde_json::from_value::<StepDef>(bad).unwrap_err().to_string();
    assert!(e.contains("on_failure of a step is"), "{e}");
}

#[allow(clippy::unnecessary_wraps, clippy::needless_pass_by_value)]
fn tpl(v: Value) -> Option<crate::template::TaskTemplate> {
    Some(serde_json::from_value(v).unwrap())
}

#[allow(clippy::unnecessary_wraps, clippy::needless_pass_by_value)]
fn sel(v: Value) -> Option<crate::template::AnswerTemplate> {
    Some(serde_json::from_value(v).unwrap())
}

/// quote, then a payment service that wants only `{amount, currency}` and whose refund needs the
/// charge's id; the workflow's result is the order's reference and the charge.
fn shaped() -> WorkflowDef {
    let mut charge = call("charge", Some("refund"));
    charge.parameters = tpl(json!({"amount.$": "$.input.total", "currency": "EUR", "quote.$": "$.outputs.quote.step"}));
    charge.result_selector = sel(json!({"charge_id.$": "$.step", "whole.$": "$"}));
    charge.compensation.as_mut().unwrap().parameters = tpl(json!({"charge_id.$": "$.outputs.charge.charge_id"}));
    let mut def = wf(vec![call("quote", None), charge, call("ship", None)]);
    def.result =
        tpl(json!({"ref.$": "$.input.ref", "charge.$": "$.outputs.charge.charge_id", "gone.$": "$.outputs.x"}));
    def.steps.push(when(call("x", None), json!({"variable": "$.input.never", "is_present": true})));
    def
}

#[test]
fn a_step_sends_what_its_parameters_say_keeps_what_its_result_selector_says_and_the_task_ends_with_its_result() {
    let mut w = World::with(shaped(), json!({"total": 12, "ref": "o-1", "noise": "x".repeat(100)}));
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    let charge = w.requests.iter().find(|(_, s, _)| s == "charge").unwrap();
    assert_eq!(charge.2, json!({"amount": 12, "currency": "EUR", "quote": "quote"}), "only what the service wants");
    let ship = w.requests.iter().find(|(_, s, _)| s == "ship").unwrap();
    assert!(ship.2["input"]["noise"].is_string(), "a step without parameters gets the whole input");
    assert_eq!(ship.2["outputs"]["charge"]["charge_id"], "charge", "later steps see the kept output");
    assert_eq!(p.outputs()["charge"], json!({"charge_id": "charge", "whole": {"step": "charge", "item": null}}));
    let result = json!({"ref": "o-1", "charge": "charge", "gone": null});
    assert_eq!(p.result(), Some(result.clone()));
    let last = p.history.last().unwrap();
    let status = p.status_of(last);
    assert_eq!((status.result, status.outputs), (Some(result), None), "the result instead of every output");
    // the compensation reads the output of the step it undoes
    let mut w = World::with(shaped(), json!({"total": 12, "ref": "o-2"}));
    w.refuse_steps.insert("ship");
    w.run();
    let refund = w.requests.iter().find(|(_, s, _)| s == "refund").unwrap();
    assert_eq!(refund.2, json!({"charge_id": "charge"}));
    // the idempotency key does not depend on the template
    let mut plain = shaped();
    plain.steps[1].parameters = None;
    let a = World::with(shaped(), json!({"total": 12})).parent().clone();
    let b = World::with(plain, json!({"total": 12})).parent().clone();
    assert_eq!(
        crate::ids::IdempotencyKey::for_unit(&a.task_id, "charge", a.steps[1].key_gen),
        crate::ids::IdempotencyKey::for_unit(&b.task_id, "charge", b.steps[1].key_gen)
    );
}

#[test]
fn templates_that_read_what_is_never_there_are_refused_when_the_workflow_loads() {
    let refused = |def: WorkflowDef| match def.validate() {
        Err(WorkflowError::Step { step, problem, .. }) => format!("{step}: {problem}"),
        other => panic!("taken: {other:?}"),
    };
    let mut early = shaped();
    early.steps[0].parameters = tpl(json!({"id.$": "$.outputs.charge.charge_id"}));
    assert!(refused(early)
        .contains("quote: parameters reads $.outputs.charge.charge_id, and step charge does not come before quote"));
    let mut result = shaped();
    result.result = tpl(json!({"x.$": "$.outputs.nope"}));
    assert!(refused(result).contains("the workflow's result reads $.outputs.nope, and there is no such step"));
    let mut undo = shaped();
    undo.steps[1].compensation.as_mut().unwrap().parameters = tpl(json!({"x.$": "$.outputs.ship.id"}));
    assert!(refused(undo).contains("its compensation's parameters reads $.outputs.ship.id"));
    let mut map = super::map_step(2, crate::workflow::Tolerance::None);
    map.parameters = tpl(json!({"sku.$": "$.outputs.quote.sku"}));
    assert!(refused(wf(vec![call("quote", None), map])).contains("filled for each element"));
}

#[test]
fn a_map_step_s_parameters_are_filled_for_each_element() {
    let mut map = super::map_step(2, crate::workflow::Tolerance::None);
    map.parameters = tpl(json!({"sku.$": "$.input.item.sku", "n.$": "$.input.index"}));
    map.result_selector = sel(json!({"done.$": "$.step"}));
    let mut w = World::with(super::workflow(map), json!({"lines": [{"sku": "a"}, {"sku": "b"}]}));
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    let mut sent: Vec<Value> =
        w.requests.iter().filter(|(_, s, _)| s == "reserve").map(|(_, _, input)| input.clone()).collect();
    sent.sort_by_key(|v| v["n"].as_u64());
    assert_eq!(sent, vec![json!({"sku": "a", "n": 0}), json!({"sku": "b", "n": 1})]);
    assert_eq!(p.outputs()["reserve"], json!([{"done": "reserve"}, {"done": "reserve"}]));
}

/// A workflow step's kind: it runs `workflow@1`.
fn runs(workflow: &str) -> crate::workflow::StepKind {
    crate::workflow::StepKind::Workflow(crate::workflow::ChildWorkflow {
        workflow: workflow.into(),
        version: 1,
        child: None,
    })
}

/// `ship`: a step that runs `shipping@1` with `parameters`.
#[allow(clippy::needless_pass_by_value)]
fn ship_runs_shipping(parameters: Value) -> StepDef {
    StepDef {
        kind: runs("shipping"),
        timeout_ms: 0,
        max_attempts: 1,
        parameters: tpl(parameters),
        ..StepDef::call("ship", "", 0)
    }
}

/// `order@1`: charge (refund), then `ship`, a step that runs `shipping@1` for the order's address,
/// then notify. `shipping@1`: pack (unpack), label (unlabel), dispatch; its result is the
/// tracking number.
fn with_child(on_failure: StepFailure) -> WorkflowDef {
    let shipping = WorkflowDef {
        concurrency: None,
        name: "shipping".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![call("pack", Some("unpack")), call("label", Some("unlabel")), call("dispatch", None)],
        result: tpl(json!({"tracking.$": "$.outputs.dispatch.step", "to.$": "$.input.address"})),
    };
    let ship = StepDef { on_failure, ..ship_runs_shipping(json!({"address.$": "$.input.address"})) };
    let order = wf(vec![call("charge", Some("refund")), ship, call("notify", None)]);
    let registry = crate::workflow::WorkflowRegistry::new([order, shipping]).unwrap();
    registry.resolve("order", Some(1)).unwrap().clone()
}

fn child() -> TaskId {
    TaskId::child(&pid(), 1, 0)
}

#[test]
fn a_workflow_step_runs_a_child_task_once_and_succeeds_with_its_result() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(with_child(StepFailure::Fail), json!({"address": "Main St 1", "noise": 1}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        let c = &w.tasks[&child()];
        assert_eq!(c.process_state, ProcessState::Processed);
        assert_eq!(c.workflow.name, "shipping");
        assert_eq!(c.input, json!({"address": "Main St 1"}), "the child's input is the step's parameters");
        assert_eq!(p.outputs()["ship"], json!({"tracking": "dispatch", "to": "Main St 1"}), "the child's result");
        for s in ["pack", "label", "dispatch"] {
            assert_eq!(w.applied.get(&child()).copied(), Some(3), "{s}");
        }
        assert_eq!(w.elements().len(), 1, "one child, however often its start was delivered");
        let notify = w.requests.iter().find(|(_, s, _)| s == "notify").unwrap();
        assert_eq!(notify.2["outputs"]["ship"]["tracking"], "dispatch");
    }
}

#[test]
fn a_parent_that_compensates_has_its_child_undo_its_own_steps_once_in_its_own_order() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(with_child(StepFailure::Fail), json!({"address": "a"}));
        w.shuffle = seed;
        w.twice = twice;
        w.refuse_steps.insert("notify");
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        assert_eq!(w.tasks[&child()].process_state, ProcessState::Compensated);
        let undos: Vec<&str> = w
            .requests
            .iter()
            .filter(|(_, s, _)| s.starts_with("un") || s == "refund")
            .map(|(_, s, _)| s.as_str())
            .collect();
        assert_eq!(undos, ["unlabel", "unpack", "refund"], "{seed:?}: the child's in its own order, then the parent's");
        assert_eq!(w.undone(&child()), 2);
    }
}

#[test]
fn a_cancel_mid_child_cancels_the_child_which_undoes_the_two_steps_it_applied_once() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(with_child(StepFailure::Fail), json!({"address": "a"}));
        w.shuffle = seed;
        w.twice = twice;
        w.flaky_steps.insert("dispatch"); // the child hangs in its third step
        while let Some((id, event)) = w.next() {
            w.step(&id, event);
            let mid = w.tasks.get(&child()).is_some_and(|c| c.steps[1].status == StepStatus::Succeeded);
            if mid {
                break;
            }
        }
        w.queue.push_back((pid(), crate::protocol::Event::Cancel { reason: "customer".into(), run: None }));
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Cancelled, "{seed:?}: {:?}", p.reason);
        let c = &w.tasks[&child()];
        assert_eq!(c.process_state, ProcessState::Cancelled, "{:?}", c.reason);
        let count = |s: &str| w.undos.get(&(child(), s.to_owned())).copied().unwrap_or(0);
        assert_eq!((count("unpack"), count("unlabel")), (1, 1), "{seed:?}: each of the child's steps undone once");
        assert_eq!(w.undos.get(&(pid(), "refund".to_owned())), Some(&1));
    }
}

#[test]
fn a_child_that_fails_fails_its_step_unless_the_step_continues() {
    let mut w = World::with(with_child(StepFailure::Fail), json!({"address": "a"}));
    w.refuse_steps.insert("dispatch");
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Compensated, "{:?}", p.reason);
    assert!(
        p.reason.as_deref().unwrap().contains("workflow step ship: its child task p~1~0 ended Compensated"),
        "{:?}",
        p.reason
    );
    assert_eq!(w.undone(&child()), 2, "the child undid its own");
    assert_eq!(ran(&w, "refund"), 1);
    let mut w = World::with(with_child(StepFailure::Continue(Vec::new())), json!({"address": "a"}));
    w.refuse_steps.insert("dispatch");
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    assert_eq!(p.outputs()["ship"]["error"]["kind"], "permanent");
    assert!(w.alerts.is_empty(), "{:?}", w.alerts);
}

#[test]
fn workflows_that_call_each_other_in_a_cycle_or_too_deep_or_an_unknown_one_are_refused() {
    let calls = |name: &str, callee: &str| WorkflowDef {
        concurrency: None,
        name: name.into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        result: None,
        steps: vec![StepDef { kind: runs(callee), timeout_ms: 0, max_attempts: 1, ..StepDef::call("run", "", 0) }],
    };
    let leaf = wf(vec![call("x", None)]);
    let err = |defs: Vec<WorkflowDef>| crate::workflow::WorkflowRegistry::new(defs).unwrap_err().to_string();
    let e = err(vec![calls("a", "b"), calls("b", "a")]);
    assert!(
        e.contains("workflows call each other in a cycle: a@1 -> b@1 -> a@1") || e.contains("b@1 -> a@1 -> b@1"),
        "{e}"
    );
    assert!(err(vec![calls("a", "nope")]).contains("runs workflow nope version 1, which is not defined"));
    let chain = vec![calls("a", "b"), calls("b", "c"), calls("c", "d"), calls("d", "order"), leaf.clone()];
    let e = err(chain);
    assert!(e.contains("at most 4") || e.contains("at most 2"), "{e}");
    // a great-grandchild's id would have three child parts, which no task id takes
    assert!(TaskId::try_from("b~0~0~0~0~0~0").is_err());
    let e = err(vec![calls("b", "c"), calls("c", "d"), calls("d", "order"), leaf.clone()]);
    assert!(e.contains("workflow b: its tasks would nest 3 levels deep") && e.contains("at most 2"), "{e}");
    let ok = vec![calls("c", "d"), calls("d", "order"), leaf];
    crate::workflow::WorkflowRegistry::new(ok).unwrap();
}

/// `order@1` whose `ship` step runs `shipping@1` once per line of the order (a map of a workflow
/// step), each child with `{"address", "sku"}` from its item.
fn with_children() -> WorkflowDef {
    let shipping = WorkflowDef {
        concurrency: None,
        name: "shipping".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![call("pack", Some("unpack")), call("dispatch", None)],
        result: tpl(json!({"sku.$": "$.input.sku", "n.$": "$.input.n"})),
    };
    // the element, and beside it the task's input and a step's output
    let ship = StepDef {
        map: Some(crate::workflow::MapSpec {
            items: "/input/lines".into(),
            max_concurrency: 2,
            tolerated_failures: crate::workflow::Tolerance::None,
            timeout_ms: None,
        }),
        ..ship_runs_shipping(json!({
            "sku.$": "$.input.item.sku", "n.$": "$.input.index", "order.$": "$.input.order", "by.$": "$.outputs.charge.step"
        }))
    };
    let order = wf(vec![call("charge", Some("refund")), ship, call("notify", None)]);
    let registry = crate::workflow::WorkflowRegistry::new([order, shipping]).unwrap();
    registry.resolve("order", Some(1)).unwrap().clone()
}

/// A run of `with_children` over `lines` lines, in one delivery order, with `refused` refused.
fn children_run(lines: Value, (seed, twice): (Option<u64>, bool), refused: Option<&'static str>) -> World {
    let mut w = World::with(with_children(), lines);
    w.shuffle = seed;
    w.twice = twice;
    w.refuse_steps.extend(refused);
    w.run();
    w
}

#[test]
fn a_map_of_a_workflow_step_runs_a_child_task_per_element_and_joins_their_results_in_order() {
    for (seed, twice) in ORDERS {
        let lines = json!({"order": "o-1", "lines": [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]});
        let w = children_run(lines, (seed, twice), None);
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        for (e, sku) in ["a", "b", "c"].into_iter().enumerate() {
            let c = &w.tasks[&TaskId::child(&pid(), 1, u32::try_from(e).unwrap())];
            assert_eq!(c.workflow.name, "shipping");
            assert_eq!(
                c.input,
                json!({"sku": sku, "n": e, "order": "o-1", "by": "charge"}),
                "the child's input is the parameters filled from its item and the task's data"
            );
            assert_eq!(c.process_state, ProcessState::Processed);
            assert_eq!(w.applied.get(&c.task_id).copied(), Some(2), "each child ran both its steps once");
        }
        assert_eq!(w.elements().len(), 3, "{seed:?}: one child per element, however often each start came");
        assert_eq!(
            p.outputs()["ship"],
            json!([{"sku": "a", "n": 0}, {"sku": "b", "n": 1}, {"sku": "c", "n": 2}]),
            "the children's results, in element order"
        );
        let notify = w.requests.iter().find(|(_, s, _)| s == "notify").unwrap();
        assert_eq!(notify.2["outputs"]["ship"][2]["sku"], "c");
    }
}

#[test]
fn a_task_that_compensates_has_each_child_of_its_map_undo_its_own_steps_once() {
    for (seed, twice) in ORDERS {
        let w = children_run(json!({"lines": [{"sku": "a"}, {"sku": "b"}]}), (seed, twice), Some("notify"));
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        for e in 0..2 {
            let c = TaskId::child(&pid(), 1, e);
            assert_eq!(w.tasks[&c].process_state, ProcessState::Compensated, "{seed:?}: child {e}");
            assert_eq!(w.undone(&c), 1, "{seed:?}: child {e} undid its pack once");
        }
        assert_eq!(ran(&w, "unpack"), 2, "{seed:?}");
        assert_eq!(ran(&w, "refund"), 1, "{seed:?}");
        let refund = w.requests.iter().position(|(_, s, _)| s == "refund").unwrap();
        assert!(
            w.requests.iter().enumerate().filter(|(_, (_, s, _))| s == "unpack").all(|(i, _)| i < refund),
            "{seed:?}: the children undo before the step before them"
        );
    }
}

#[test]
fn a_child_of_a_map_that_fails_stops_the_map_and_the_others_undo_what_they_applied() {
    for (seed, twice) in ORDERS {
        let w = children_run(json!({"lines": [{"sku": "a"}, {"sku": "b"}]}), (seed, twice), Some("dispatch"));
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        assert!(p.reason.as_deref().unwrap_or_default().contains("map step ship"), "{:?}", p.reason);
        for e in 0..2 {
            let c = &w.tasks[&TaskId::child(&pid(), 1, e)];
            // the child that failed undid its pack; the other one was cancelled, and undid what it had applied
            assert!(
                matches!(c.process_state, ProcessState::Compensated | ProcessState::Cancelled),
                "{seed:?}: child {e} ended {}",
                c.process_state
            );
            assert_eq!(
                w.undone(&c.task_id),
                w.applied.get(&c.task_id).copied().unwrap_or(0).min(1),
                "{seed:?}: child {e} undid its pack once if it had packed"
            );
        }
        assert_eq!(ran(&w, "refund"), 1, "{seed:?}");
    }
}

#[test]
fn a_step_retries_only_the_failures_its_retry_on_names() {
    // a 503 (no name, may pass): retried within max_attempts unless retry_on leaves it out
    for (retry_on, attempts) in [
        (None, 2),
        (Some(vec![Handled::Kind(FailureKind::Retryable)]), 2),
        (Some(vec![Handled::Error("Shop.Busy".into()), Handled::Kind(FailureKind::TimedOut)]), 1),
    ] {
        let mut def = gift(StepFailure::Continue(Vec::new()));
        def.steps[1].retry_on = retry_on.clone();
        let mut w = World::with(def, json!({}));
        w.flaky_steps.insert("giftwrap");
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{retry_on:?}: {:?}", p.reason);
        assert_eq!(ran(&w, "giftwrap"), attempts, "{retry_on:?}");
        assert_eq!(p.outputs()["giftwrap"]["error"]["kind"], "retryable");
    }
    // read from a workflow file, and refused when it names neither a kind nor an error
    let step = |on: Value| {
        json!({"name": "x", "version": 1, "steps": [
        {"name": "a", "agent": "sim", "timeout_ms": 1000, "max_attempts": 3, "retry_on": on}]})
    };
    let def: WorkflowDef =
        serde_json::from_value(step(json!(["Lambda.TooManyRequestsException", "timed_out"]))).unwrap();
    assert_eq!(
        def.steps[0].retry_on,
        Some(vec![Handled::Error("Lambda.TooManyRequestsException".into()), Handled::Kind(FailureKind::TimedOut)])
    );
    assert!(serde_json::from_value::<WorkflowDef>(step(json!(["soon"]))).is_err());
}
