//! Variables on LocalStack: what a step's `assign` sets is kept in the task's item (`Vars`), read
//! by a later step's guard and parameters and by the workflow's result; an `assign` past the
//! limit fails its step for good with the reason, and nothing is set.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sas_protocol::protocol::{ProcessState, StepStatus, MAX_VARS_BYTES};
use sas_protocol::workflow::{WorkflowDef, WorkflowRegistry};
use serde_json::json;

use crate::common::stack_with;

/// list sets `key` (its idempotency key, from its output), `listed` and `note` (from the input);
/// tag runs when `listed` is true and is sent `key`; skip runs when it is false.
fn paging() -> WorkflowDef {
    serde_json::from_value(json!({"name": "paging", "version": 1, "steps": [
        {"name": "list", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3,
         "assign": {"key.$": "$.outputs.list.idempotency_key", "listed": true, "note.$": "$.input.note"}},
        {"name": "tag", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3,
         "when": {"variable": "$.vars.listed", "boolean_equals": true},
         "parameters": {"key.$": "$.vars.key"}},
        {"name": "skip", "agent": "sim", "timeout_ms": 20_000, "max_attempts": 3,
         "when": {"variable": "$.vars.listed", "boolean_equals": false}}
    ], "result": {"key.$": "$.vars.key", "tagged.$": "$.outputs.tag.step"}}))
    .expect("the workflow")
}

#[tokio::test]
async fn variables_are_kept_in_the_item_and_read_by_later_steps_and_an_oversized_assign_fails_its_step() {
    let s = stack_with("vars", WorkflowRegistry::new([paging()]).unwrap()).await;
    let runner = s.runner();
    for (id, note) in [("vars-1", "short".to_owned()), ("vars-2", "x".repeat(MAX_VARS_BYTES))] {
        let body = json!({"v": 1, "task_id": id, "workflow": "paging", "input": {"note": note}});
        s.send(&s.res.submission_queue_url, &body.to_string()).await;
    }
    let t = s.wait_for("vars-1", Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:?}", t.reason);
    assert_eq!(t.result(), Some(json!({"key": "vars-1:list", "tagged": "tag"})), "the result reads the variable");
    assert_eq!(t.vars["listed"], true);
    assert_eq!((t.steps[1].status, t.steps[2].status), (StepStatus::Succeeded, StepStatus::Skipped));
    // the item as DynamoDB keeps it: one map attribute
    let item = s.item("vars-1").await;
    let Some(AttributeValue::M(vars)) = item.get("Vars") else { panic!("no Vars map: {item:?}") };
    assert_eq!(vars.get("key"), Some(&AttributeValue::S("vars-1:list".into())));
    assert_eq!(vars.get("note"), Some(&AttributeValue::S("short".into())));
    // past the limit: list fails for good, nothing is set, and nothing after it runs
    let t = s.wait_for("vars-2", Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Compensated, "{:?}", t.reason);
    let reason = t.reason.clone().unwrap_or_default();
    assert!(reason.contains("step list failed permanently: its assign makes the task's variables"), "{reason}");
    assert!(t.vars.is_empty(), "{:?}", t.vars.keys());
    assert_eq!(t.steps[1].status, StepStatus::Pending, "tag never ran");
    runner.shutdown().await;
    s.delete().await;
}
