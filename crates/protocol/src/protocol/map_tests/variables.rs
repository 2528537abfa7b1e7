//! Variables: what a step's `assign` sets, read by later steps as `$.vars.<name>`, within a size
//! limit; driven through the same world as the maps and regions (every delivery order,
//! duplicates included).

use serde_json::{json, Value};

use super::decisions::wf;
use super::{after, call, World, ORDERS};
use crate::condition::Condition;
use crate::protocol::{ProcessState, StepStatus, MAX_VARS_BYTES};
use crate::template::TaskTemplate;
use crate::workflow::{StepDef, StepFailure, WorkflowDef};

#[allow(clippy::needless_pass_by_value)]
fn assign(step: StepDef, t: Value) -> StepDef {
    StepDef { assign: Some(serde_json::from_value::<TaskTemplate>(t).unwrap()), ..step }
}

#[allow(clippy::needless_pass_by_value, clippy::unnecessary_wraps)]
fn template(t: Value) -> Option<TaskTemplate> {
    Some(serde_json::from_value(t).unwrap())
}

/// quote sets `quoted` and `n`; charge sets `n` again and `charge` (its own output); ship runs
/// only when `n` is 2 and is sent both; the result reads `charge`.
fn counting() -> WorkflowDef {
    let quote = assign(call("quote", Some("unquote")), json!({"quoted.$": "$.outputs.quote.step", "n": 1}));
    let charge = assign(call("charge", Some("refund")), json!({"n": 2, "charge.$": "$.outputs.charge"}));
    let mut ship = call("ship", None);
    ship.parameters = template(json!({"q.$": "$.vars.quoted", "n.$": "$.vars.n"}));
    ship.when = Some(Condition::from_json(&json!({"variable": "$.vars.n", "numeric_equals": 2})).unwrap());
    let mut def = wf(vec![quote, charge, ship]);
    def.result = template(json!({"charge.$": "$.vars.charge", "n.$": "$.vars.n"}));
    def
}

#[test]
fn a_step_s_assign_sets_variables_that_later_guards_parameters_and_the_result_read() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(counting(), json!({"total": 12}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        let ship: Vec<_> = w.requests.iter().filter(|(_, s, _)| s == "ship").collect();
        assert!(!ship.is_empty(), "{seed:?}: ship's guard read n = 2");
        assert!(ship.iter().all(|r| r.2 == json!({"q": "quote", "n": 2})), "{seed:?}: {ship:?}");
        let charge = p.outputs()["charge"].clone();
        assert_eq!(
            Value::Object(p.vars.clone()),
            json!({"quoted": "quote", "n": 2, "charge": charge}),
            "a name keeps its last value"
        );
        assert_eq!(p.result(), Some(json!({"charge": charge, "n": 2})));
        // kept in the item as `Vars`, and read back
        let item = serde_json::to_value(&p).unwrap();
        assert_eq!(item["Vars"]["n"], 2);
        let back: crate::protocol::Task = serde_json::from_value(item).unwrap();
        assert_eq!(back.vars, p.vars);
    }
    // none set: no attribute
    let mut plain = counting();
    plain.steps.iter_mut().for_each(|s| s.assign = None);
    plain.steps[2].parameters = None;
    plain.steps[2].when = None;
    plain.result = None;
    let mut w = World::with(plain, json!({"total": 12}));
    w.run();
    assert!(serde_json::to_value(w.parent()).unwrap().get("Vars").is_none());
}

#[test]
fn variables_beyond_their_limit_fail_the_step_for_good_and_what_it_applied_is_undone() {
    let big = "x".repeat(MAX_VARS_BYTES);
    let def = || {
        wf(vec![
            call("quote", Some("unquote")),
            assign(call("charge", Some("refund")), json!({"blob.$": "$.input.blob"})),
            call("ship", None),
        ])
    };
    for (seed, twice) in ORDERS {
        let mut w = World::with(def(), json!({"blob": big}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        let reason = p.reason.clone().unwrap_or_default();
        assert!(reason.contains("step charge failed permanently: its assign makes the task's variables"), "{reason}");
        assert!(reason.contains(&format!("they take at most {MAX_VARS_BYTES}")), "{reason}");
        assert!(p.vars.is_empty(), "nothing set: {:?}", p.vars.keys());
        assert_eq!(p.steps[1].status, StepStatus::Failed);
        for (undo, n) in [("refund", 1), ("unquote", 1)] {
            assert_eq!(w.requests.iter().filter(|(_, s, _)| s == undo).count(), n, "{seed:?}: {undo} once");
        }
        assert!(!w.requests.iter().any(|(_, s, _)| s == "ship"), "{seed:?}");
    }
    // a step that continues on failure: its error is its output, and the task goes on
    let mut continues = def();
    continues.steps[1].on_failure =
        StepFailure::Continue(vec![crate::workflow::Handled::Kind(crate::workflow::FailureKind::Permanent)]);
    let mut w = World::with(continues, json!({"blob": big}));
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    assert_eq!(p.outputs()["charge"]["error"]["kind"], "permanent");
    assert!(p.vars.is_empty());
}

#[test]
fn a_branch_reads_its_parent_s_variables_and_a_map_step_sets_its_own_once_joined() {
    for (seed, twice) in ORDERS {
        let quote = assign(call("quote", Some("unquote")), json!({"who": "quote"}));
        let mut fraud = after(call("fraud", None), &["quote"]);
        fraud.parameters = template(json!({"who.$": "$.vars.who"}));
        let ship = after(call("ship", None), &["charge", "fraud"]);
        let mut w = World::with(wf(vec![quote, call("charge", Some("refund")), fraud, ship]), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        let fraud = w.requests.iter().find(|(_, s, _)| s == "fraud").unwrap();
        assert!(fraud.0.is_child(), "fraud ran as a branch");
        assert_eq!(fraud.2, json!({"who": "quote"}), "{seed:?}");
    }
    let map = assign(super::map_step(2, crate::workflow::Tolerance::None), json!({"reserved.$": "$.outputs.reserve"}));
    let mut w = World::with(super::workflow(map), json!({"lines": [{"sku": "a"}, {"sku": "b"}]}));
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    assert_eq!(p.vars["reserved"], p.outputs()["reserve"], "the joined output");
    assert_eq!(p.vars["reserved"].as_array().map(Vec::len), Some(2));
    assert!(w.tasks.values().filter(|t| t.task_id.is_child()).all(|t| t.vars.is_empty()), "elements set nothing");
}

#[test]
fn reads_of_variables_no_step_sets_before_them_and_misplaced_assigns_are_refused_when_the_workflow_loads() {
    let problems = |def: WorkflowDef| -> String {
        let all = def.problems();
        assert!(!all.is_empty(), "taken");
        all.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    };
    let mut unset = counting();
    unset.steps[0].assign = None;
    let e = problems(unset);
    assert!(
        e.contains(
            "ship: parameters reads $.vars.quoted, and no step before it sets quoted (assign): it can never resolve"
        ),
        "{e}"
    );
    // set only by a step after the reader
    let mut late = counting();
    late.steps[0].when = Some(Condition::from_json(&json!({"variable": "$.vars.n", "is_present": true})).unwrap());
    let e = problems(late);
    assert!(e.contains("quote: when reads $.vars.n, and no step before it sets n"), "{e}");
    // the result reads one that no step sets
    let mut result = counting();
    result.result = template(json!({"x.$": "$.vars.nope"}));
    assert!(problems(result).contains("the workflow's result reads $.vars.nope, and no step before it sets nope"));
    // a step's assign may read its own output and what it set before
    let counter = assign(call("count", None), json!({"seen.$": "$.outputs.count.step", "again.$": "$.vars.again"}));
    assert!(wf(vec![counter]).problems().is_empty());
    // $.loop outside a loop
    let mut looped = counting();
    looped.steps[2].parameters = template(json!({"i.$": "$.loop.index"}));
    assert!(problems(looped).contains("ship: parameters reads $.loop.index, and it is not in a loop's body"));
    // on a compensation, on a branch, with a bad name, not named, too big
    let mut comp = counting();
    comp.steps[1].compensation.as_mut().unwrap().assign = template(json!({"x": 1}));
    assert!(problems(comp).contains("a compensation takes no assign"));
    let branch = assign(after(call("fraud", None), &["quote"]), json!({"x": 1}));
    let e = problems(wf(vec![
        call("quote", None),
        call("charge", None),
        branch,
        after(call("ship", None), &["charge", "fraud"]),
    ]));
    assert!(e.contains("fraud: a step that runs beside others takes no assign"), "{e}");
    let e = problems(wf(vec![assign(call("quote", None), json!({"a b": 1}))]));
    assert!(e.contains("assign: variable name"), "{e}");
    let e = problems(wf(vec![assign(call("quote", None), json!({"*.$": "$.outputs.quote"}))]));
    assert!(e.contains("assign names each variable it sets"), "{e}");
    let e = problems(wf(vec![assign(call("quote", None), json!({"x": "y".repeat(MAX_VARS_BYTES)}))]));
    assert!(e.contains("a task's variables take at most 8192"), "{e}");
    // read back from a file as written
    let file = json!({"name": "w", "version": 1, "steps": [
        {"name": "list", "agent": "sim", "timeout_ms": 1000, "assign": {"token.$": "$.outputs.list.next"}},
        {"name": "more", "agent": "sim", "timeout_ms": 1000, "parameters": {"token.$": "$.vars.token"}}
    ]});
    let def: WorkflowDef = serde_json::from_value(file.clone()).unwrap();
    assert!(def.problems().is_empty(), "{:?}", def.problems());
    assert_eq!(serde_json::to_value(&def).unwrap()["steps"][0]["assign"], file["steps"][0]["assign"]);
}
