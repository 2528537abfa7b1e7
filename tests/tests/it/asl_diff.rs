//! `sasctl import-asl` against a second implementation: every definition here runs on
//! LocalStack's own Step Functions and, translated by `sas_cli::asl::import`, on this project
//! (one stack, the local runner), with the same input and the same Lambda functions
//! (`tests/functions/asl-calc/bootstrap`: add, shape, echo, fail, flaky). The two must agree:
//!
//! - an execution that SUCCEEDED is a task that ends `Processed`, and its output (as JSON) is the
//!   task's result (the workflow's `result` filled, what its `Processed` status carries);
//! - an execution that FAILED is a task that ends `Compensated` (or `Error`), and the task's reason
//!   names the execution's error (`CustomError`, `States.NoChoiceMatched`, a Fail state's `Error`);
//! - the same states ran, as many times each: the Task, Wait, Fail and Map states the execution
//!   entered (its history) are the steps of the task that ran (neither pending nor skipped), which
//!   is what shows the way a Choice or a Catch took when the output does not; a state of a loop's
//!   body ran once per iteration on both sides (here each iteration is a task of its own).
//!
//! Compared modulo what the book lists as differences (docs/how-to/import-asl.md, "What
//! differs"): a caught error's `Error` is the failure's kind here (`retryable`, `permanent`,
//! `timed_out`) and its `Cause` our message, not the function's error name and Lambda's error
//! document; see [`caught_errors_aside`], which also checks that the kind and message are the ones
//! the book promises. Its other differences are shown by [`DOCUMENTED`]: retriers and catchers
//! that name errors cannot tell them apart here. A comparison whose variable is missing (false
//! here, a failed execution on AWS) does not show: LocalStack takes it as false too
//! (`choice-missing`).
//!
//! What differs for another reason (the importer or the engine) is kept in [`KNOWN_DIFFERENCES`],
//! each asserting the difference as it is today, so that its fix fails the test and moves the
//! definition to the hand-written ones.
//!
//! Besides the hand-written definitions, [`generate`] makes small random ones from fixed seeds
//! (sequences of Pass, Task, Choice, Parallel, Map, Retry, Catch and Wait states over a known input
//! shape), run the same way.
//!
//! Where LocalStack 4.13 itself departs from Step Functions on AWS, the inputs keep clear of it
//! (each place says why): a Choice without a match fails with `States.Runtime` there
//! (`States.NoChoiceMatched` on AWS and here, compared as one); timestamps with an offset or a
//! fraction of a second are no timestamps there; `StringMatches` is Python's fnmatch there (no
//! `\*` escape); a function invoked with a null payload gets `{}`; a dot path with a non-ASCII
//! name does not parse; a negative number in a template becomes a float (numbers are compared
//! by value). An error of the interpreter's own (a path or a value it cannot use: `States.Runtime`,
//! `States.QueryEvaluationError`, LocalStack's `Exception`) has no name here: a task that fails
//! for it agrees whatever its reason says.
//!
//! `ASL_DIFF_ONLY=name,name` runs only those definitions; `ASL_DIFF_SEED=n` makes the pure test
//! print the definition generated from seed n.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use aws_sdk_sfn::types::ExecutionStatus;
use futures::StreamExt;
use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{ProcessState, StepStatus, Task};
use sas_protocol::workflow::WorkflowRegistry;
use serde_json::{json, Map, Value};

use crate::common::{settings, stack_with_settings, Stack};

/// The functions of `tests/functions/asl-calc/bootstrap` (its `HANDLER`), by the variable a
/// definition names them with (`${AddFunctionArn}`).
const FUNCTIONS: [(&str, &str); 5] = [
    ("AddFunctionArn", "add"),
    ("ShapeFunctionArn", "shape"),
    ("EchoFunctionArn", "echo"),
    ("FailFunctionArn", "fail"),
    ("FlakyFunctionArn", "flaky"),
];

/// In an input, replaced by a fresh key for each run (the flaky function counts its calls by key,
/// so that each run starts at 0); in the outputs, the run's key is put back as this.
const KEY: &str = "${KEY}";

/// Generated definitions: one per seed.
const SEEDS: std::ops::Range<u64> = 1..41;

/// Runs at once (each an execution on Step Functions and a task here).
const AT_ONCE: usize = 16;

/// One state machine and the inputs it is run with.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    what: String,
    def: Value,
    inputs: Vec<Value>,
    /// What this project imports instead of `def`: the same machine written in JSONata, or with
    /// variables (`Assign`). LocalStack evaluates both with a Java JSONata library it fetches from
    /// Maven Central, which these machines cannot reach: Step Functions runs `def`, the twin
    /// written without them.
    ours: Option<Value>,
}

fn case(name: &str, what: &str, def: Value, inputs: &[Value]) -> Case {
    Case { name: name.into(), what: what.into(), def, inputs: inputs.to_vec(), ours: None }
}

/// The hand-written definitions, within the importer's subset.
#[allow(clippy::vec_init_then_push)]
fn hand_written() -> Vec<Case> {
    let mut c = Vec::new();
    c.push(case(
        "task-arn",
        "a Task on a function's ARN (a substitution): the whole input sent, the whole answer the output",
        json!({"StartAt": "Add", "States": {"Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}}),
        &[json!({"a": 1, "b": 2}), json!({"a": 2.5, "b": -1, "c": "x", "values": [4, 5]}), json!({"a": 0.1, "b": 0.2})],
    ));
    c.push(case(
        "invoke-payload",
        "lambda:invoke with Payload (a template) and Payload.$, ResultSelector over $.Payload, $.StatusCode \
         and $.ExecutedVersion, ResultPath",
        json!({"StartAt": "Total", "States": {
            "Total": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                      "Parameters": {"FunctionName": "${AddFunctionArn}", "Payload": {"values.$": "$.nums"}},
                      "ResultSelector": {"total.$": "$.Payload.sum", "status.$": "$.StatusCode"},
                      "ResultPath": "$.calc", "Next": "Describe"},
            "Describe": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                         "Parameters": {"FunctionName": "${ShapeFunctionArn}", "Payload.$": "$.calc"},
                         "ResultSelector": {"keys.$": "$.Payload.keys", "version.$": "$.ExecutedVersion"},
                         "ResultPath": "$.described", "End": true}}}),
        &[json!({"nums": [1, 2, 3], "tag": "t"}), json!({"nums": []})],
    ));
    c.push(case(
        "invoke-raw",
        "lambda:invoke's whole answer kept (ResultPath, then OutputPath), the function answering an object, \
         a string, a number",
        json!({"StartAt": "Call", "States": {
            "Call": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                     "Parameters": {"FunctionName": "${EchoFunctionArn}", "Payload": {"value.$": "$.v"}},
                     "ResultPath": "$.raw", "OutputPath": "$.raw", "End": true}}}),
        &[json!({"v": {"k": [1, {"z": null}], "t": true}}), json!({"v": "text"}), json!({"v": 7})],
    ));
    c.push(case(
        "pass-chain",
        "Pass with Result and ResultPath, a Task's Parameters reading it, a last Pass with Parameters \
         (paths, constants, an array) and $$.Execution.Input",
        json!({"StartAt": "Defaults", "States": {
            "Defaults": {"Type": "Pass", "Result": {"x": 10, "label": "ten"}, "ResultPath": "$.cfg", "Next": "Add"},
            "Add": {"Type": "Task", "Resource": "${AddFunctionArn}",
                    "Parameters": {"a.$": "$.cfg.x", "b.$": "$.n", "note": "const"}, "ResultPath": "$.out", "Next": "Report"},
            "Report": {"Type": "Pass", "Parameters": {"answer.$": "$.out.sum", "label.$": "$.cfg.label",
                        "orig.$": "$$.Execution.Input", "fixed": [1, "two", {"three": 3}]}, "End": true}}}),
        &[json!({"n": 5}), json!({"n": -10, "other": true})],
    ));
    c.push(case(
        "paths-many",
        "paths that name many values: a slice, a wildcard, a filter (in a Pass's Parameters, an intrinsic \
         function's argument, a ResultSelector over the answer), and a Map over ItemsPath $.rows[1:]; a row \
         without the member a wildcard reads, one match alone (its value, not an array, as Step Functions \
         gives it), and nothing after the header (an empty array, a Map over nothing)",
        json!({"StartAt": "Pick", "States": {
            "Pick": {"Type": "Pass", "Parameters": {"rest.$": "$.rows[1:]", "ids.$": "$.rows[*].id",
                                                    "big.$": "$.rows[?(@.n > 0)].id", "count.$": "States.ArrayLength($.rows[1:])"},
                     "ResultPath": "$.picked", "Next": "Echo"},
            "Echo": {"Type": "Task", "Resource": "${EchoFunctionArn}",
                     "Parameters": {"value": {"rest.$": "$.picked.rest", "ids.$": "$.picked.ids", "big.$": "$.picked.big"}},
                     "ResultSelector": {"ns.$": "$.rest[*].n", "later.$": "$.rest[1:]"},
                     "ResultPath": "$.echoed", "Next": "Each"},
            "Each": {"Type": "Map", "ItemsPath": "$.rows[1:]", "ResultPath": "$.sums", "End": true,
                     "ItemSelector": {"a.$": "$$.Map.Item.Value.n", "b": 1},
                     "ItemProcessor": {"StartAt": "Add", "States": {"Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}}}}}),
        &[
            json!({"rows": [{"id": "h", "n": 0}, {"id": "a", "n": 1}, {"id": "b", "n": 2}, {"id": "c", "n": 3}]}),
            json!({"rows": [{"id": "h", "n": 0}, {"n": 5}, {"id": "x", "n": 2}]}),
            json!({"rows": [{"id": "h", "n": 1}]}),
        ],
    ));
    c.push(case(
        "loop-counter",
        "a counter loop: a Pass sets the count, a Task adds one to it and a Choice leads back while it is \
         below the input's limit (a loop step, its body a workflow run once per iteration)",
        json!({"StartAt": "Init", "States": {
            "Init": {"Type": "Pass", "Result": {"i": 0}, "ResultPath": "$.c", "Next": "Step"},
            "Step": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"a.$": "$.c.i", "b": 1},
                     "ResultSelector": {"i.$": "$.sum"}, "ResultPath": "$.c", "Next": "More?"},
            "More?": {"Type": "Choice", "Choices": [{"Variable": "$.c.i", "NumericLessThanPath": "$.limit", "Next": "Step"}],
                      "Default": "Done"},
            "Done": {"Type": "Pass", "Parameters": {"count.$": "$.c.i", "limit.$": "$.limit"}, "End": true}}}),
        &[json!({"limit": 3}), json!({"limit": 1, "tag": "once"})],
    ));
    c.push(case(
        "loop-poll",
        "a polling loop: wait a second, ask, and go back until the answer says done; a rule that leads out \
         to a Fail state, and the Default back through the Wait",
        json!({"StartAt": "Start", "States": {
            "Start": {"Type": "Pass", "Result": {"polls": 0}, "ResultPath": "$.job", "Next": "Ask"},
            "Ask": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"a.$": "$.job.polls", "b": 1},
                    "ResultSelector": {"polls.$": "$.sum"}, "ResultPath": "$.job", "Next": "Done?"},
            "Done?": {"Type": "Choice", "Choices": [
                {"Variable": "$.job.polls", "NumericGreaterThanEquals": 2, "Next": "Store"},
                {"Variable": "$.give_up", "BooleanEquals": true, "Next": "Gave up"}], "Default": "Pause"},
            "Pause": {"Type": "Wait", "Seconds": 1, "Next": "Ask"},
            "Gave up": {"Type": "Fail", "Error": "GaveUp", "Cause": "asked to give up"},
            "Store": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"polls.$": "$.job.polls"},
                      "ResultPath": "$.stored", "End": true}}}),
        &[json!({"give_up": false}), json!({"give_up": true})],
    ));
    // variables: set by a Task (its answer, before a ResultPath), a Choice's rule and its Default,
    // a Pass (reading the old value of a variable it resets) and a Catch (the error), read by
    // later Parameters, a Choice rule, an intrinsic function and the last state's output
    let variables = json!({"StartAt": "Total", "States": {
        "Total": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"values.$": "$.nums"},
                  "Assign": {"total.$": "$.sum", "label": "first"}, "ResultPath": "$.added", "Next": "Big?"},
        "Big?": {"Type": "Choice", "Assign": {"size": "small"}, "Default": "Note",
                 "Choices": [{"Variable": "$total", "NumericGreaterThanEquals": 10, "Assign": {"size": "big"}, "Next": "Relabel"}]},
        "Relabel": {"Type": "Pass", "Assign": {"label": "second", "was.$": "$label"}, "Next": "Note"},
        "Note": {"Type": "Task", "Resource": "${EchoFunctionArn}",
                 "Parameters": {"value": {"size.$": "$size", "total.$": "$total", "label.$": "$label",
                                          "line.$": "States.Format('{} is {}', $total, $size)"}},
                 "ResultPath": "$.note", "Next": "Fail?"},
        "Fail?": {"Type": "Choice", "Choices": [{"Variable": "$.fail", "BooleanEquals": true, "Next": "Boom"}], "Default": "Done"},
        "Boom": {"Type": "Task", "Resource": "${FailFunctionArn}", "ResultPath": null, "Next": "Done",
                 "Catch": [{"ErrorEquals": ["States.ALL"], "Assign": {"failed": true, "label": "caught"}, "ResultPath": null, "Next": "Done"}]},
        "Done": {"Type": "Pass", "Parameters": {"note.$": "$.note", "total.$": "$total", "label.$": "$label"}, "End": true}}});
    c.push(Case {
        ours: Some(variables),
        ..case(
            "variables",
            "variables (Assign) set by a Task, a Choice's rule and Default, a Pass and a Catch, read by \
             Parameters, a Choice rule, States.Format and the output, imported here; Step Functions runs its \
             twin without variables (the values carried in the data)",
            json!({"StartAt": "Total", "States": {
                "Total": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"values.$": "$.nums"},
                          "ResultPath": "$.added", "Next": "Big?"},
                "Big?": {"Type": "Choice", "Default": "Small",
                         "Choices": [{"Variable": "$.added.sum", "NumericGreaterThanEquals": 10, "Next": "Relabel"}]},
                "Relabel": {"Type": "Pass", "Result": {"label": "second", "size": "big"}, "ResultPath": "$.v", "Next": "Note"},
                "Small": {"Type": "Pass", "Result": {"label": "first", "size": "small"}, "ResultPath": "$.v", "Next": "Note"},
                "Note": {"Type": "Task", "Resource": "${EchoFunctionArn}",
                         "Parameters": {"value": {"size.$": "$.v.size", "total.$": "$.added.sum", "label.$": "$.v.label",
                                                  "line.$": "States.Format('{} is {}', $.added.sum, $.v.size)"}},
                         "ResultPath": "$.note", "Next": "Fail?"},
                "Fail?": {"Type": "Choice", "Choices": [{"Variable": "$.fail", "BooleanEquals": true, "Next": "Boom"}], "Default": "Done"},
                "Boom": {"Type": "Task", "Resource": "${FailFunctionArn}", "ResultPath": null, "Next": "Done",
                         "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": null, "Next": "Caught"}]},
                "Caught": {"Type": "Pass", "Result": "caught", "ResultPath": "$.v.label", "Next": "Done"},
                "Done": {"Type": "Pass", "Parameters": {"note.$": "$.note", "total.$": "$.added.sum", "label.$": "$.v.label"}, "End": true}}}),
            &[json!({"nums": [4, 9]}), json!({"nums": [1, 2]}), json!({"nums": [5, 5], "fail": true})],
        )
    });
    c.push(Case {
        ours: Some(json!({"QueryLanguage": "JSONata", "StartAt": "Total", "States": {
            "Total": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                      "Arguments": {"FunctionName": "${AddFunctionArn}", "Payload": {"values": "{% $states.input.nums %}"}},
                      "Output": "{% $states.result.Payload %}", "Next": "Big?"},
            "Big?": {"Type": "Choice", "Choices": [
                {"Condition": "{% $states.input.sum >= 10 and $exists($states.input.sum) %}", "Next": "Describe"},
                {"Condition": "{% $states.input.sum = 0 %}", "Next": "Empty"}], "Default": "Small"},
            "Describe": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                         "Arguments": {"FunctionName": "${EchoFunctionArn}",
                                       "Payload": {"value": {"label": "{% 'big: ' & $states.input.sum & \" units\" %}", "n": "{% 1 %}"}}},
                         "Output": {"said": "{% $states.result.Payload %}"}, "End": true},
            "Empty": {"Type": "Fail", "Error": "{% 'Empty' %}", "Cause": "nothing to add"},
            "Small": {"Type": "Pass", "Output": {"small": "{% $states.input.sum %}", "kind": "small"}, "End": true}}})),
        ..case(
            "jsonata",
            "a JSONata machine (Arguments, Output over the result, Conditions with and, >=, =, $exists, a string \
             joined with &, a Fail's Error as an expression, a Pass's Output) imported here; Step Functions runs \
             its JSONPath twin",
            json!({"StartAt": "Total", "States": {
                "Total": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                          "Parameters": {"FunctionName": "${AddFunctionArn}", "Payload": {"values.$": "$.nums"}},
                          "OutputPath": "$.Payload", "Next": "Big?"},
                "Big?": {"Type": "Choice", "Choices": [
                    {"And": [{"Variable": "$.sum", "NumericGreaterThanEquals": 10}, {"Variable": "$.sum", "IsPresent": true}],
                     "Next": "Describe"},
                    {"Variable": "$.sum", "NumericEquals": 0, "Next": "Empty"}], "Default": "Small"},
                "Describe": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                             "Parameters": {"FunctionName": "${EchoFunctionArn}",
                                            "Payload": {"value": {"label.$": "States.Format('big: {} units', $.sum)", "n": 1}}},
                             "ResultSelector": {"said.$": "$.Payload"}, "End": true},
                "Empty": {"Type": "Fail", "Error": "Empty", "Cause": "nothing to add"},
                "Small": {"Type": "Pass", "Parameters": {"small.$": "$.sum", "kind": "small"}, "End": true}}}),
            &[json!({"nums": [4, 5, 6]}), json!({"nums": [1, 2]}), json!({"nums": []})],
        )
    });
    c.push(case(
        "loop-pages",
        "a pagination loop whose check comes first (a while): while there is a page after the last one read, \
         fetch it and move on; inputs that fetch three pages, one, and none (the check leads out at once)",
        json!({"StartAt": "More?", "States": {
            "More?": {"Type": "Choice", "Choices": [
                {"And": [{"Variable": "$.pages", "IsPresent": true}, {"Variable": "$.page", "NumericLessThanPath": "$.pages"}],
                 "Next": "Fetch"}], "Default": "Done"},
            "Fetch": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"a.$": "$.page", "b": 1},
                      "ResultSelector": {"n.$": "$.sum"}, "ResultPath": "$.last", "Next": "Advance"},
            "Advance": {"Type": "Pass", "Parameters": {"page.$": "$.last.n", "pages.$": "$.pages", "tag.$": "$.tag"},
                        "Next": "More?"},
            "Done": {"Type": "Pass", "Parameters": {"read.$": "$.page", "of.$": "$.pages", "tag.$": "$.tag"}, "End": true}}}),
        &[
            json!({"page": 0, "pages": 3, "tag": "three"}),
            json!({"page": 2, "pages": 3, "tag": "one"}),
            json!({"page": 4, "pages": 3, "tag": "none"}),
        ],
    ));
    c.push(case(
        "loop-middle",
        "a loop whose check is in its middle: add one, decide, and when below the limit note the count and \
         add again (the states before the check run once before the loop and again in each iteration)",
        json!({"StartAt": "Init", "States": {
            "Init": {"Type": "Pass", "Result": {"i": 0}, "ResultPath": "$.c", "Next": "Step"},
            "Step": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"a.$": "$.c.i", "b": 1},
                     "ResultSelector": {"i.$": "$.sum"}, "ResultPath": "$.c", "Next": "Below?"},
            "Below?": {"Type": "Choice", "Choices": [{"Variable": "$.c.i", "NumericLessThanPath": "$.limit", "Next": "Note"}],
                       "Default": "Done"},
            "Note": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"at.$": "$.c.i"},
                     "ResultPath": "$.noted", "Next": "Step"},
            "Done": {"Type": "Pass", "Parameters": {"count.$": "$.c.i", "noted.$": "$.noted", "limit.$": "$.limit"}, "End": true}}}),
        &[json!({"limit": 3, "noted": null}), json!({"limit": 1, "noted": "never"})],
    ));
    let routes = |names: &[&str]| {
        let mut states = Map::new();
        for n in names {
            states.insert(
                (*n).into(),
                json!({"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"route": n, "n.$": "$.n"},
                       "ResultPath": null, "Next": "Done"}),
            );
        }
        states
    };
    let mut states = routes(&["Big", "RedFlag", "GreenOrMid", "Old", "Other"]);
    states.insert(
        "Route".into(),
        json!({"Type": "Choice", "Choices": [
            {"Variable": "$.n", "NumericGreaterThan": 100, "Next": "Big"},
            {"And": [{"Variable": "$.s", "StringEquals": "red"}, {"Variable": "$.flag", "BooleanEquals": true}], "Next": "RedFlag"},
            {"Or": [{"Variable": "$.s", "StringMatches": "gr*n"}, {"Not": {"Variable": "$.n", "NumericLessThanEquals": 10}}],
             "Next": "GreenOrMid"},
            {"Variable": "$.t", "TimestampLessThan": "2020-01-01T00:00:00Z", "Next": "Old"}
        ], "Default": "Other"}),
    );
    states.insert(
        "Done".into(),
        json!({"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"a.$": "$.n", "b": 1}, "ResultPath": "$.done", "End": true}),
    );
    let input = |n: i64, s: &str, flag: bool, t: &str| json!({"n": n, "s": s, "flag": flag, "t": t});
    c.push(case(
        "choice-ops",
        "Choice: NumericGreaterThan, And of StringEquals and BooleanEquals, Or of StringMatches and Not \
         NumericLessThanEquals, TimestampLessThan, Default; every way joins at one state",
        json!({"StartAt": "Route", "States": states}),
        &[
            input(150, "red", true, "2021-01-01T00:00:00Z"),
            input(1, "red", true, "2021-01-01T00:00:00Z"),
            input(1, "red", false, "2021-01-01T00:00:00Z"),
            input(0, "green", false, "2021-01-01T00:00:00Z"),
            input(50, "blue", false, "2021-01-01T00:00:00Z"),
            input(3, "blue", false, "2019-06-01T00:00:00Z"),
        ],
    ));
    let mut states = routes(&["Equal", "Less", "Named", "Flagged", "Nothing", "Fallback"]);
    states.insert(
        "Route".into(),
        json!({"Type": "Choice", "Choices": [
            {"Variable": "$.n", "NumericEqualsPath": "$.limit", "Next": "Equal"},
            {"Variable": "$.n", "NumericLessThanPath": "$.limit", "Next": "Less"},
            {"And": [{"Variable": "$.name", "IsPresent": true}, {"Variable": "$.name", "IsString": true},
                     {"Variable": "$.name", "StringEqualsPath": "$.expected"}], "Next": "Named"},
            {"And": [{"Variable": "$.flag", "IsBoolean": true}, {"Variable": "$.flag", "BooleanEquals": true}], "Next": "Flagged"},
            {"Or": [{"Variable": "$.nothing", "IsNull": true}, {"Variable": "$.n", "IsNumeric": false}], "Next": "Nothing"}
        ], "Default": "Fallback"}),
    );
    states.insert(
        "Done".into(),
        json!({"Type": "Pass", "Parameters": {"n.$": "$.n", "limit.$": "$.limit"}, "End": true}),
    );
    c.push(case(
        "choice-paths",
        "Choice: NumericEqualsPath, NumericLessThanPath, StringEqualsPath, IsPresent, IsString, IsBoolean, \
         IsNull, IsNumeric; a last Pass with Parameters",
        json!({"StartAt": "Route", "States": states}),
        &[
            json!({"n": 5, "limit": 5, "name": "a", "expected": "a", "flag": true, "nothing": null}),
            json!({"n": 4, "limit": 5, "name": "a", "expected": "a", "flag": true, "nothing": null}),
            json!({"n": 9, "limit": 5, "name": "a", "expected": "a", "flag": true, "nothing": null}),
            json!({"n": 9, "limit": 5, "name": "a", "expected": "b", "flag": true, "nothing": null}),
            json!({"n": 9, "limit": 5, "name": "a", "expected": "b", "flag": false, "nothing": null}),
            json!({"n": 9, "limit": 5, "name": "a", "expected": "b", "flag": false, "nothing": 0}),
        ],
    ));
    c.push(case(
        "choice-join",
        "two Choice rules to one state, the Default to another, both joining at one state with the same data \
         (ResultPath null)",
        json!({"StartAt": "Check", "States": {
            "Check": {"Type": "Choice", "Choices": [
                {"Variable": "$.n", "NumericLessThan": 0, "Next": "NonPositive"},
                {"Variable": "$.n", "NumericEquals": 0, "Next": "NonPositive"}], "Default": "Positive"},
            "NonPositive": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"sign": "<=0"}, "ResultPath": null, "Next": "Join"},
            "Positive": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"sign": ">0"}, "ResultPath": null, "Next": "Join"},
            "Join": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.sum", "End": true}}}),
        &[json!({"n": -3, "m": 1}), json!({"n": 0, "m": 1}), json!({"n": 7, "m": 1})],
    ));
    c.push(case(
        "parallel",
        "Parallel: a Task branch, a Pass then Task branch (ResultSelector), a branch of a Pass alone; its \
         ResultPath, then a Pass reading the branches' outputs",
        json!({"StartAt": "Fork", "States": {
            "Fork": {"Type": "Parallel", "ResultPath": "$.par", "Next": "Use", "Branches": [
                {"StartAt": "AddB", "States": {"AddB": {"Type": "Task", "Resource": "${AddFunctionArn}",
                                                         "Parameters": {"values.$": "$.nums"}, "End": true}}},
                {"StartAt": "Prep", "States": {
                    "Prep": {"Type": "Pass", "Result": {"k": 1}, "ResultPath": "$.prep", "Next": "ShapeB"},
                    "ShapeB": {"Type": "Task", "Resource": "${ShapeFunctionArn}",
                               "Parameters": {"k.$": "$.prep.k", "who.$": "$.who"}, "ResultSelector": {"keys.$": "$.keys"}, "End": true}}},
                {"StartAt": "Const", "States": {"Const": {"Type": "Pass", "Result": {"fixed": true}, "End": true}}}]},
            "Use": {"Type": "Pass", "Parameters": {"total.$": "$.par[0].sum", "keys.$": "$.par[1].keys",
                                                   "fixed.$": "$.par[2].fixed", "who.$": "$.who", "all.$": "$.par"}, "End": true}}}),
        &[json!({"nums": [1, 2, 3], "who": "me"}), json!({"nums": [10], "who": {"deep": [1]}})],
    ));
    c.push(case(
        "parallel-nested",
        "a Parallel inside a Parallel's branch, a Choice inside a branch, the Parallel's ResultSelector and \
         OutputPath",
        json!({"StartAt": "Outer", "States": {
            "Outer": {"Type": "Parallel", "ResultSelector": {"first.$": "$[0]", "inner.$": "$[1][1]"}, "ResultPath": "$.p",
                      "OutputPath": "$.p", "End": true, "Branches": [
                {"StartAt": "Pick", "States": {
                    "Pick": {"Type": "Choice", "Choices": [{"Variable": "$.n", "NumericGreaterThanEquals": 10, "Next": "Large"}],
                             "Default": "Small"},
                    "Large": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"size": "large"}, "ResultPath": null, "Next": "Sum"},
                    "Small": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"size": "small"}, "ResultPath": null, "Next": "Sum"},
                    "Sum": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}},
                {"StartAt": "Inner", "States": {
                    "Inner": {"Type": "Parallel", "End": true, "Branches": [
                        {"StartAt": "InnerA", "States": {"InnerA": {"Type": "Task", "Resource": "${EchoFunctionArn}",
                                                                    "Parameters": {"value.$": "$.n"}, "End": true}}},
                        {"StartAt": "InnerB", "States": {"InnerB": {"Type": "Task", "Resource": "${ShapeFunctionArn}",
                                                                    "InputPath": "$.obj", "End": true}}}]}}}]}}}),
        &[json!({"n": 12, "m": 3, "obj": {"x": 1}}), json!({"n": 2, "m": 3, "obj": {"y": "z"}})],
    ));
    c.push(case(
        "map",
        "inline Map over one Task: ItemsPath, ItemSelector with $$.Map.Item.Value and $$.Map.Item.Index, \
         MaxConcurrency, ResultPath; over three items, one, none",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 2,
                     "ItemSelector": {"a.$": "$$.Map.Item.Value.a", "b.$": "$$.Map.Item.Value.b", "index.$": "$$.Map.Item.Index"},
                     "ItemProcessor": {"StartAt": "AddItem", "States": {"AddItem": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}},
                     "ResultPath": "$.sums", "End": true}}}),
        &[
            json!({"items": [{"a": 1, "b": 2}, {"a": 10, "b": 20}, {"a": -1, "b": 1}], "order": "o-1"}),
            json!({"items": [{"a": 5, "b": 5}], "order": "o-2"}),
            json!({"items": [], "order": "o-3"}),
        ],
    ));
    c.push(case(
        "map-workflow",
        "a Map whose processor is several states (a workflow per element): a Task with ResultPath, a Choice on \
         its answer, a Task or a Pass; its ItemSelector reads beside the item; over two items, one, none",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 2,
                     "ItemSelector": {"a.$": "$$.Map.Item.Value", "b.$": "$.bonus", "i.$": "$$.Map.Item.Index"},
                     "ItemProcessor": {"StartAt": "Sum", "States": {
                         "Sum": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.s", "Next": "Big"},
                         "Big": {"Type": "Choice", "Choices": [{"Variable": "$.s.sum", "NumericGreaterThan": 10, "Next": "Describe"}],
                                 "Default": "Small"},
                         "Describe": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.s",
                                      "ResultSelector": {"keys.$": "$.keys", "sum.$": "$.got.sum"}, "End": true},
                         "Small": {"Type": "Pass", "Parameters": {"small.$": "$.s.sum", "i.$": "$.i"}, "End": true}}},
                     "ResultPath": "$.out", "Next": "Count"},
            "Count": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.out", "ResultPath": "$.counted", "End": true}}}),
        &[
            json!({"items": [1, 20], "bonus": 2}),
            json!({"items": [9], "bonus": 5}),
            json!({"items": [], "bonus": 0}),
        ],
    ));
    c.push(case(
        "map-workflow-fails",
        "a Map of two Tasks per element whose second fails for one element: the execution fails",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 1,
                     "ItemProcessor": {"StartAt": "First", "States": {
                         "First": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.first", "Next": "Try"},
                         "Try": {"Type": "Task", "Resource": "${FlakyFunctionArn}",
                                 "Parameters": {"key.$": "$.key", "fails.$": "$.fails"}, "End": true}}},
                     "ResultPath": "$.tried", "End": true}}}),
        &[json!({"items": [{"key": "${KEY}-a", "fails": 0}, {"key": "${KEY}-b", "fails": 5}]})],
    ));
    c.push(case(
        "map-items",
        "Map (Iterator, the old name) without ItemSelector over scalars, MaxConcurrency 0, ResultSelector over \
         the array of results, then a Task reading it",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.values", "MaxConcurrency": 0,
                     "Iterator": {"StartAt": "EchoItem", "States": {"EchoItem": {"Type": "Task", "Resource": "${EchoFunctionArn}", "End": true}}},
                     "ResultSelector": {"all.$": "$", "first.$": "$[0]"}, "ResultPath": "$.echoed", "Next": "Count"},
            "Count": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"all.$": "$.echoed.all"},
                      "ResultSelector": {"size.$": "$.got.all"}, "ResultPath": "$.counted", "End": true}}}),
        // no null item: LocalStack invokes a function with `{}` for a null payload
        // (lambda_eval_utils.to_payload_type), which this project sends as it is
        &[json!({"values": [3, "x", true, {"o": 1}]}), json!({"values": [[1, 2]]})],
    ));
    c.push(case(
        "retry",
        "Retry: a retrier of Lambda.* errors (MaxAttempts 2) and one of CustomError (IntervalSeconds 1, \
         MaxAttempts 3, BackoffRate 1): the step takes the larger, 4 attempts; two failures recover, four exhaust it",
        json!({"StartAt": "Flaky", "States": {
            "Flaky": {"Type": "Task", "Resource": "${FlakyFunctionArn}", "Parameters": {"key.$": "$.key", "fails.$": "$.fails"},
                      "Retry": [{"ErrorEquals": ["Lambda.ServiceException", "Lambda.TooManyRequestsException"], "MaxAttempts": 2},
                                {"ErrorEquals": ["CustomError"], "IntervalSeconds": 1, "MaxAttempts": 3, "BackoffRate": 1.0}],
                      "ResultPath": "$.flaky", "End": true}}}),
        &[json!({"key": KEY, "fails": 2}), json!({"key": KEY, "fails": 4})],
    ));
    c.push(case(
        "catch",
        "Retry then Catch (States.ALL, ResultPath) to a handler Task; the way without failure leads to a Fail \
         state, so both ways end apart",
        json!({"StartAt": "Flaky", "States": {
            "Flaky": {"Type": "Task", "Resource": "${FlakyFunctionArn}", "Parameters": {"key.$": "$.key", "fails.$": "$.fails"},
                      "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 1}],
                      "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Handle"}],
                      "ResultPath": "$.flaky", "Next": "NotCaught"},
            "NotCaught": {"Type": "Fail", "Error": "NothingFailed", "Cause": "the task succeeded"},
            "Handle": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"handled.$": "$.fails"},
                       "ResultPath": "$.handled", "End": true}}}),
        &[json!({"key": KEY, "fails": 5}), json!({"key": KEY, "fails": 1})],
    ));
    c.push(case(
        "catch-whole",
        "Catch of a named error without ResultPath: the handler's input is the error alone; a PermanentError \
         caught by a later catcher (States.TaskFailed)",
        json!({"StartAt": "Boom", "States": {
            "Boom": {"Type": "Task", "Resource": "${FailFunctionArn}", "Parameters": {"message.$": "$.why", "errorType.$": "$.type"},
                     "Catch": [{"ErrorEquals": ["CustomError"], "Next": "Handle"},
                               {"ErrorEquals": ["States.TaskFailed"], "Next": "Handle"}],
                     "Next": "Never"},
            "Never": {"Type": "Fail", "Error": "Unreachable"},
            "Handle": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "End": true}}}),
        &[json!({"why": "disk full", "type": "CustomError"}), json!({"why": "declined", "type": "PermanentError"})],
    ));
    c.push(case(
        "catch-named",
        "catchers told apart by the error's name: two named errors to two handlers, any other to a third \
         (States.ALL), each handler's input the error ({\"Error\": the name} for a catcher of one name)",
        json!({"StartAt": "Boom", "States": {
            "Boom": {"Type": "Task", "Resource": "${FailFunctionArn}", "Parameters": {"message.$": "$.why", "errorType.$": "$.type"},
                     "Catch": [{"ErrorEquals": ["OutOfStock"], "ResultPath": "$.error", "Next": "Restock"},
                               {"ErrorEquals": ["CardDeclined", "CardExpired"], "ResultPath": "$.error", "Next": "AskCard"},
                               {"ErrorEquals": ["States.ALL"], "ResultPath": null, "Next": "Other"}],
                     "Next": "Never"},
            "Never": {"Type": "Fail", "Error": "Unreachable"},
            "Restock": {"Type": "Pass", "Parameters": {"did": "restock", "error.$": "$.error.Error"}, "End": true},
            "AskCard": {"Type": "Pass", "Parameters": {"did": "ask for a card", "why.$": "$.why"}, "End": true},
            "Other": {"Type": "Pass", "Parameters": {"did": "other", "type.$": "$.type"}, "End": true}}}),
        &[
            json!({"why": "none left", "type": "OutOfStock"}),
            json!({"why": "expired", "type": "CardExpired"}),
            json!({"why": "boom", "type": "CustomError"}),
        ],
    ));
    c.push(case(
        "catch-other",
        "a catcher of another error than the function's is not taken: the execution fails with the \
         function's error (before error names were matched here, it caught every failure)",
        json!({"StartAt": "Boom", "States": {
            "Boom": {"Type": "Task", "Resource": "${FailFunctionArn}",
                     "Catch": [{"ErrorEquals": ["OtherError"], "ResultPath": "$.error", "Next": "Handle"}], "Next": "Never"},
            "Never": {"Type": "Fail", "Error": "Unreachable"},
            "Handle": {"Type": "Pass", "End": true}}}),
        &[json!({"n": 1})],
    ));
    c.push(case(
        "retry-other",
        "a retrier of another error than the function's does not retry it: the failure is caught at once \
         (before error names were matched here, every failure was retried); a retrier of the function's \
         error retries it (its third call answers)",
        json!({"StartAt": "Flaky", "States": {
            "Flaky": {"Type": "Task", "Resource": "${FlakyFunctionArn}", "Parameters": {"key.$": "$.key", "fails": 1},
                      "Retry": [{"ErrorEquals": ["OtherError"], "IntervalSeconds": 1, "MaxAttempts": 2}],
                      "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.caught", "Next": "Again"}],
                      "ResultPath": "$.first", "Next": "Again"},
            "Again": {"Type": "Task", "Resource": "${FlakyFunctionArn}", "Parameters": {"key.$": "$.key", "fails": 2},
                      "Retry": [{"ErrorEquals": ["CustomError"], "IntervalSeconds": 1, "MaxAttempts": 2}], "End": true}}}),
        &[json!({"key": KEY})],
    ));
    c.push(case(
        "catch-join",
        "Catch with ResultPath null and a Task with ResultPath null joining at one state, from the way that \
         failed and the way that did not",
        json!({"StartAt": "Flaky", "States": {
            "Flaky": {"Type": "Task", "Resource": "${FlakyFunctionArn}", "Parameters": {"key.$": "$.key", "fails.$": "$.fails"},
                      "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": null, "Next": "After"}],
                      "ResultPath": null, "Next": "After"},
            "After": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"fails.$": "$.fails"}, "ResultPath": "$.after", "End": true}}}),
        &[json!({"key": KEY, "fails": 0}), json!({"key": KEY, "fails": 3})],
    ));
    c.push(case(
        "fail-state",
        "a Fail state (Error, CausePath) after a Choice over a Task's result, and Succeed with OutputPath",
        json!({"StartAt": "Measure", "States": {
            "Measure": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"a.$": "$.a", "b.$": "$.b"}, "ResultPath": "$.m", "Next": "Check"},
            "Check": {"Type": "Choice", "Choices": [{"Variable": "$.m.sum", "NumericGreaterThan": 100, "Next": "TooBig"}], "Default": "Fine"},
            "TooBig": {"Type": "Fail", "Error": "TooBig", "CausePath": "$.reason"},
            "Fine": {"Type": "Succeed", "OutputPath": "$.m"}}}),
        &[json!({"a": 60, "b": 50, "reason": "over the limit"}), json!({"a": 1, "b": 2, "reason": "-"})],
    ));
    c.push(case(
        "task-fails",
        "a function's error not caught nor retried: the execution fails with its error (CustomError, \
         PermanentError)",
        json!({"StartAt": "Prepare", "States": {
            "Prepare": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.prepared", "Next": "Boom"},
            "Boom": {"Type": "Task", "Resource": "${FailFunctionArn}", "Parameters": {"message.$": "$.why", "errorType.$": "$.type"}, "Next": "After"},
            "After": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "End": true}}}),
        &[json!({"why": "no luck", "type": "CustomError", "a": 1}), json!({"why": "declined", "type": "PermanentError", "a": 1})],
    ));
    c.push(case(
        "no-choice-matched",
        "a Choice without Default: no rule holds (States.NoChoiceMatched), or one does",
        json!({"StartAt": "Sum", "States": {
            "Sum": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.r", "Next": "Big?"},
            "Big?": {"Type": "Choice", "Choices": [{"Variable": "$.r.sum", "NumericGreaterThan": 10, "Next": "Big"}]},
            "Big": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.r", "End": true}}}),
        &[json!({"a": 1, "b": 2}), json!({"a": 11, "b": 2})],
    ));
    c.push(case(
        "io-paths",
        "InputPath, ResultPath null, a nested ResultPath, OutputPath, Succeed with InputPath and OutputPath",
        json!({"StartAt": "Look", "States": {
            "Look": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.order", "ResultPath": null, "Next": "Total"},
            "Total": {"Type": "Task", "Resource": "${AddFunctionArn}", "InputPath": "$.order.amounts",
                      "ResultPath": "$.order.total", "OutputPath": "$.order", "Next": "Done"},
            "Done": {"Type": "Succeed", "InputPath": "$", "OutputPath": "$.total"}}}),
        &[json!({"order": {"id": "o-1", "amounts": {"x": 1, "y": 2}}, "noise": [1]}), json!({"order": {"amounts": {}}})],
    ));
    c.push(case(
        "result-replace",
        "a Task without ResultPath (its result replaces the data) after one with ResultPath $, then a Pass \
         with InputPath",
        json!({"StartAt": "First", "States": {
            "First": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "ResultPath": "$", "Next": "Second"},
            "Second": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"values.$": "$.got.nums"}, "Next": "Third"},
            "Third": {"Type": "Pass", "InputPath": "$.sum", "ResultPath": "$", "End": true}}}),
        &[json!({"a": 1, "nums": [1, 2, 4]})],
    ));
    c.push(case(
        "wait",
        "a Wait of 1 s (InputPath) between a Pass and a Task",
        json!({"StartAt": "Set", "States": {
            "Set": {"Type": "Pass", "Result": 3, "ResultPath": "$.c", "Next": "Pause"},
            "Pause": {"Type": "Wait", "Seconds": 1, "Next": "Add"},
            "Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.sum", "End": true}}}),
        &[json!({"a": 4})],
    ));
    c.push(case(
        "context-input",
        "$$.Execution.Input and a path into it in a Task's Parameters, after a Pass changed the data",
        json!({"StartAt": "Change", "States": {
            "Change": {"Type": "Pass", "Parameters": {"changed.$": "$.list[1]"}, "Next": "Call"},
            "Call": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                     "Parameters": {"FunctionName": "${ShapeFunctionArn}",
                                    "Payload": {"orig.$": "$$.Execution.Input", "first.$": "$$.Execution.Input.list[0]", "now.$": "$.changed"}},
                     "ResultSelector": {"got.$": "$.Payload.got"}, "ResultPath": "$.call", "End": true}}}),
        &[json!({"list": ["a", {"b": 2}]})],
    ));
    c.push(case(
        "choice-missing",
        "a Choice rule over a variable the input does not have: the Default (false here, and on LocalStack; \
         the book says AWS fails the execution)",
        json!({"StartAt": "Route", "States": {
            "Route": {"Type": "Choice", "Choices": [{"Variable": "$.missing", "NumericGreaterThan": 1, "Next": "Yes"}],
                      "Default": "No"},
            "Yes": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"way": "yes"}, "ResultPath": null, "Next": "Done"},
            "No": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"way": "no"}, "ResultPath": null, "Next": "Done"},
            "Done": {"Type": "Pass", "End": true}}}),
        &[json!({"n": 1}), json!({"n": 1, "missing": 2})],
    ));
    c.push(case(
        "timeout",
        "TimeoutSeconds 1 on a function that takes 4 s, caught (States.Timeout, ResultPath) by a handler; an \
         answer in time would go on to a Fail state",
        json!({"StartAt": "Slow", "States": {
            "Slow": {"Type": "Task", "Resource": "${EchoFunctionArn}", "TimeoutSeconds": 1,
                     "Parameters": {"sleep.$": "$.sleep", "value": "done"},
                     "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.timeout", "Next": "Late"}],
                     "ResultPath": "$.slow", "Next": "InTime"},
            "InTime": {"Type": "Fail", "Error": "InTime", "Cause": "the function answered in time"},
            "Late": {"Type": "Pass", "Parameters": {"late": true, "timeout.$": "$.timeout"}, "End": true}}}),
        // no quick input: a cold start may itself pass 1 s on LocalStack
        &[json!({"sleep": 4})],
    ));
    c.push(case(
        "parallel-fails",
        "a Parallel whose branch's function fails: the execution fails with its error",
        json!({"StartAt": "Fork", "States": {
            "Fork": {"Type": "Parallel", "End": true, "Branches": [
                {"StartAt": "Boom", "States": {"Boom": {"Type": "Task", "Resource": "${FailFunctionArn}", "End": true}}},
                {"StartAt": "Fine", "States": {"Fine": {"Type": "Task", "Resource": "${EchoFunctionArn}",
                                                       "Parameters": {"value": 1}, "End": true}}}]}}}),
        &[json!({"n": 1})],
    ));
    c.push(case(
        "deep-result-path",
        "ResultPath into members the input does not have ($.deep.er.x), and into one it has ($.obj.y)",
        json!({"StartAt": "Add", "States": {
            "Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.deep.er.x", "Next": "Shape"},
            "Shape": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.deep", "ResultSelector": {"keys.$": "$.keys"},
                      "ResultPath": "$.obj.y", "End": true}}}),
        &[json!({"a": 1, "obj": {"x": 1}}), json!({"a": 2, "deep": {"kept": true}, "obj": {}})],
    ));
    c.push(case(
        "odd-keys",
        "paths in brackets to keys with a space, a dot and a dash; array indexes; Unicode; numbers past 2^53 and \
         floats passed through",
        json!({"StartAt": "Pick", "States": {
            "Pick": {"Type": "Task", "Resource": "${ShapeFunctionArn}",
                     "Parameters": {"spaced.$": "$['a b']", "dotted.$": "$['x.y']", "dashed.$": "$.data['k-1'][1]",
                                    "word.$": "$['wörd']", "big.$": "$.big", "float.$": "$.f"},
                     "ResultPath": "$.picked", "Next": "Sum"},
            "Sum": {"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": {"values.$": "$.floats"}, "ResultPath": "$.sum", "End": true}}}),
        &[json!({"a b": 1, "x.y": "dot", "data": {"k-1": [0, {"deep": "é"}]}, "wörd": "ünïcode ✓", "big": 9_007_199_254_740_993_u64,
                 "f": 0.1, "floats": [0.1, 0.2, 1e-7, 12345.678]})],
    ));
    c.push(case(
        "fail-paths",
        "a Fail state with ErrorPath and CausePath read from a function's answer",
        json!({"StartAt": "Look", "States": {
            "Look": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "ResultPath": "$.look", "Next": "Stop"},
            "Stop": {"Type": "Fail", "ErrorPath": "$.look.got.code", "CausePath": "$.look.type"}}}),
        &[json!({"code": "Refused"})],
    ));
    c.push(case(
        "wait-until",
        "a Wait until a time read from the input (TimestampPath), in the past",
        json!({"StartAt": "Until", "States": {
            "Until": {"Type": "Wait", "TimestampPath": "$.at", "Next": "Add"},
            "Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.sum", "End": true}}}),
        &[json!({"at": "2020-01-01T00:00:00Z", "a": 1})],
    ));
    c.push(case(
        "choice-type",
        "a numeric comparison over a string: false, the Default",
        json!({"StartAt": "Route", "States": {
            "Route": {"Type": "Choice", "Choices": [{"Variable": "$.s", "NumericGreaterThan": 1, "Next": "Yes"}], "Default": "No"},
            "Yes": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"way": "yes"}, "ResultPath": null, "Next": "Done"},
            "No": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"way": "no"}, "ResultPath": null, "Next": "Done"},
            "Done": {"Type": "Pass", "End": true}}}),
        &[json!({"s": "5"})],
    ));
    c.push(case(
        "items-not-array",
        "a Map whose ItemsPath names a number: the execution fails",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.n",
                     "ItemProcessor": {"StartAt": "E", "States": {"E": {"Type": "Task", "Resource": "${EchoFunctionArn}", "End": true}}},
                     "End": true}}}),
        &[json!({"n": 3})],
    ));
    let stamps = |v: &str| json!({"at": v, "n": 1});
    let mut states = routes(&["Later", "Same", "Earlier"]);
    states.insert(
        "Route".into(),
        json!({"Type": "Choice", "Choices": [
            {"Variable": "$.at", "TimestampGreaterThan": "2020-01-01T00:00:00Z", "Next": "Later"},
            {"Variable": "$.at", "TimestampEquals": "2020-01-01T00:00:00Z", "Next": "Same"}], "Default": "Earlier"}),
    );
    states.insert("Done".into(), json!({"Type": "Pass", "End": true}));
    // In UTC with whole seconds only: LocalStack reads a timestamp with strptime's
    // "%Y-%m-%dT%H:%M:%SZ" (is_operator.py), so an offset (2019-12-31T23:00:00-01:00) or a
    // fraction (2020-01-01T00:00:00.500Z) is no timestamp there and every comparison of it false;
    // the project compares them as the instants RFC 3339 makes them (Same and Later).
    c.push(case(
        "choice-timestamps",
        "TimestampGreaterThan and TimestampEquals: later, the same instant, earlier",
        json!({"StartAt": "Route", "States": states}),
        &[stamps("2020-06-01T12:00:00Z"), stamps("2020-01-01T00:00:00Z"), stamps("2019-12-31T23:59:59Z")],
    ));
    let mut states = routes(&["Star", "Plain"]);
    states.insert(
        "Route".into(),
        json!({"Type": "Choice", "Choices": [
            {"Variable": "$.s", "StringMatches": "a*b*", "Next": "Star"}], "Default": "Plain"}),
    );
    states.insert("Done".into(), json!({"Type": "Pass", "End": true}));
    // Not an escaped star (`a\\*b`, a literal * in the States Language): LocalStack matches with
    // Python's fnmatch, where a backslash escapes nothing, so "a*b" does not match it there; the
    // project follows the States Language.
    c.push(case(
        "string-matches",
        "StringMatches with wildcards, matching and not",
        json!({"StartAt": "Route", "States": states}),
        &[json!({"s": "a*b-c", "n": 1}), json!({"s": "aXXb", "n": 1}), json!({"s": "ba", "n": 1})],
    ));
    c.push(case(
        "invoke-qualifier",
        "lambda:invoke with Qualifier $LATEST and the whole input as Payload (Payload.$: $)",
        json!({"StartAt": "Call", "States": {
            "Call": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                     "Parameters": {"FunctionName": "${AddFunctionArn}", "Qualifier": "$LATEST", "Payload.$": "$"},
                     "ResultSelector": {"sum.$": "$.Payload.sum", "version.$": "$.ExecutedVersion"}, "ResultPath": "$.r", "End": true}}}),
        &[json!({"a": 1, "b": 2})],
    ));
    c.push(case(
        "map-last",
        "a Map as the last state, without ResultPath: the output is the array",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.items",
                     "ItemProcessor": {"StartAt": "AddItem", "States": {"AddItem": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}},
                     "End": true}}}),
        &[json!({"items": [{"a": 1}, {"a": 2, "b": 3}]})],
    ));
    c.push(case(
        "map-fails",
        "a Map whose element fails (no tolerance): the execution fails",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 1,
                     "ItemSelector": {"key.$": "$$.Map.Item.Value.key", "fails.$": "$$.Map.Item.Value.fails"},
                     "ItemProcessor": {"StartAt": "Try", "States": {"Try": {"Type": "Task", "Resource": "${FlakyFunctionArn}", "End": true}}},
                     "ResultPath": "$.tried", "Next": "After"},
            "After": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "End": true}}}),
        &[json!({"items": [{"key": "${KEY}-a", "fails": 0}, {"key": "${KEY}-b", "fails": 5}]})],
    ));
    c.push(case(
        "parallel-map",
        "a Map inside a Parallel's branch beside a Task",
        json!({"StartAt": "Fork", "States": {
            "Fork": {"Type": "Parallel", "ResultPath": "$.both", "End": true, "Branches": [
                {"StartAt": "Each", "States": {"Each": {"Type": "Map", "ItemsPath": "$.nums",
                    "ItemSelector": {"v.$": "$$.Map.Item.Value", "w": 100},
                    "ItemProcessor": {"StartAt": "AddOne", "States": {"AddOne": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}},
                    "End": true}}},
                {"StartAt": "Total", "States": {"Total": {"Type": "Task", "Resource": "${AddFunctionArn}",
                                                         "Parameters": {"values.$": "$.nums"}, "End": true}}}]}}}),
        &[json!({"nums": [1, 2, 3]})],
    ));
    c.push(case(
        "choice-succeed-fail",
        "a Choice first, to a Succeed (no step before it: the input is the output) or a Fail",
        json!({"StartAt": "Check", "States": {
            "Check": {"Type": "Choice", "Choices": [{"Variable": "$.n", "NumericGreaterThan": 0, "Next": "Done"}], "Default": "Stop"},
            "Done": {"Type": "Succeed"},
            "Stop": {"Type": "Fail", "Error": "NotPositive", "Cause": "n <= 0"}}}),
        &[json!({"n": 1}), json!({"n": 0})],
    ));
    c.push(case(
        "parallel-mixed",
        "branches with a ResultPath (the branch's output is its data), a Wait, a caught failure, InputPath with \
         Parameters, $$.Execution.Input and templates nesting arrays of paths",
        json!({"StartAt": "Fork", "States": {
            "Fork": {"Type": "Parallel", "ResultPath": "$.branches", "Next": "Last", "Branches": [
                {"StartAt": "Keep", "States": {
                    "Keep": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultPath": "$.kept", "Next": "Breathe"},
                    "Breathe": {"Type": "Wait", "Seconds": 1, "End": true}}},
                {"StartAt": "Risky", "States": {
                    "Risky": {"Type": "Task", "Resource": "${FailFunctionArn}", "Parameters": {"message": "in a branch"},
                              "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.caught", "Next": "Recover"}], "Next": "NoFailure"},
                    "NoFailure": {"Type": "Fail", "Error": "NoFailure"},
                    "Recover": {"Type": "Pass", "Parameters": {"caught.$": "$.caught", "orig.$": "$$.Execution.Input.a"}, "End": true}}},
                {"StartAt": "Nested", "States": {
                    "Nested": {"Type": "Task", "Resource": "${EchoFunctionArn}", "InputPath": "$.inner",
                               "Parameters": {"value": {"arr": [{"x.$": "$.x"}, "lit", ["$.notapath"]], "y.$": "$.y"}}, "End": true}}}]},
            "Last": {"Type": "Pass", "Parameters": {"kept.$": "$.branches[0].kept.sum", "recovered.$": "$.branches[1]",
                                                    "nested.$": "$.branches[2].arr"}, "End": true}}}),
        &[json!({"a": 2, "b": 3, "inner": {"x": [1], "y": "why"}})],
    ));
    c.push(case(
        "map-selector",
        "a Map whose task has a ResultSelector, its ItemSelector building an object and an array from the item",
        json!({"StartAt": "Each", "States": {
            "Each": {"Type": "Map", "ItemsPath": "$.items",
                     "ItemSelector": {"pair": {"a.$": "$$.Map.Item.Value.a", "i.$": "$$.Map.Item.Index"}, "list.$": "$$.Map.Item.Value.l"},
                     "ItemProcessor": {"StartAt": "Look", "States": {"Look": {"Type": "Task", "Resource": "${ShapeFunctionArn}",
                        "ResultSelector": {"pair.$": "$.got.pair", "keys.$": "$.keys"}, "End": true}}},
                     "ResultPath": "$.looked", "End": true}}}),
        &[json!({"items": [{"a": "x", "l": [1, 2]}, {"a": "y", "l": []}]})],
    ));
    c.push(case(
        "intrinsic-digests",
        "States.Hash (MD5, SHA-1, SHA-256, SHA-384, SHA-512), States.Base64Encode and Base64Decode, and \
         States.Format over the task's id-free data, sent to a function",
        json!({"StartAt": "Digest", "States": {
            "Digest": {"Type": "Task", "Resource": "${EchoFunctionArn}", "ResultPath": "$.out", "End": true,
                       "Parameters": {"value": {
                           "md5.$": "States.Hash($.s, 'MD5')", "sha1.$": "States.Hash($.s, 'SHA-1')",
                           "sha256.$": "States.Hash($.s, 'SHA-256')", "sha384.$": "States.Hash($.s, 'SHA-384')",
                           "sha512.$": "States.Hash($.s, 'SHA-512')", "b64.$": "States.Base64Encode($.s)",
                           "back.$": "States.Base64Decode($.e)",
                           "label.$": "States.Format('{} is {}', $.s, States.Base64Encode($.s))"}}}}}),
        // ASCII only: LocalStack 4.13 encodes States.Base64Encode's string with Python's ascii codec
        // (a non-ASCII character fails the execution); AWS and this project take UTF-8
        &[json!({"s": "abc", "e": "RGF0YSB0byBlbmNvZGU="}), json!({"s": "Data to encode, 42!", "e": "YWJj"})],
    ));
    c.push(case(
        "aws-sdk",
        "aws-sdk tasks (the aws kind here) on LocalStack's DynamoDB and SQS: putItem, updateItem's ALL_NEW \
         answer under a ResultSelector, getItem of an item (a ResultSelector calling States.StringToJson over \
         the answer) and of none, a conditional putItem refused \
         (DynamoDb.ConditionalCheckFailedException, caught), sendMessage's MD5",
        json!({"StartAt": "Put", "States": {
            "Put": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:dynamodb:putItem", "ResultPath": "$.put", "Next": "Add",
                    "Parameters": {"TableName": "${ItemsTable}", "Item": {"id": {"S.$": "$.key"}, "n": {"N.$": "States.Format('{}', $.n)"}}}},
            "Add": {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:updateItem", "Next": "Get",
                    "Parameters": {"TableName": "${ItemsTable}", "Key": {"id": {"S.$": "$.key"}},
                                   "UpdateExpression": "SET n = n + :one", "ExpressionAttributeValues": {":one": {"N": "1"}},
                                   "ReturnValues": "ALL_NEW"},
                    "ResultSelector": {"n.$": "$.Attributes.n.N"}, "ResultPath": "$.added"},
            "Get": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:dynamodb:getItem", "ResultPath": "$.got", "Next": "None",
                    "Parameters": {"TableName": "${ItemsTable}", "Key": {"id": {"S.$": "$.key"}}, "ConsistentRead": true},
                    "ResultSelector": {"n.$": "States.StringToJson($.Item.n.N)", "id.$": "$.Item.id.S"}},
            "None": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:dynamodb:getItem", "ResultPath": "$.none", "Next": "Again",
                     "Parameters": {"TableName": "${ItemsTable}", "Key": {"id": {"S.$": "States.Format('no-{}', $.key)"}}}},
            "Again": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:dynamodb:putItem", "ResultPath": "$.again", "Next": "Send",
                      "Parameters": {"TableName": "${ItemsTable}", "Item": {"id": {"S.$": "$.key"}},
                                     "ConditionExpression": "attribute_not_exists(id)"},
                      "Catch": [{"ErrorEquals": ["DynamoDb.ConditionalCheckFailedException"], "ResultPath": null, "Next": "Exists"}]},
            "Exists": {"Type": "Pass", "Result": true, "ResultPath": "$.existed", "Next": "Send"},
            "Send": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sqs:sendMessage", "End": true,
                     "Parameters": {"QueueUrl": "${DiffQueueUrl}", "MessageBody.$": "States.Format('item {}', $.added.n)"},
                     "ResultSelector": {"md5.$": "$.Md5OfMessageBody"}, "ResultPath": "$.sent"}}}),
        &[json!({"key": KEY, "n": 41}), json!({"key": KEY, "n": -3})],
    ));
    c.push(case(
        "aws-sdk-rest",
        "aws-sdk tasks of a REST-JSON service (Lambda): invoke with a JSON Payload (its answer's Payload \
         the function's text, StatusCode from the HTTP status, ExecutedVersion from a header), and \
         getFunction of a function that does not exist (Lambda.ResourceNotFoundException, caught)",
        json!({"StartAt": "Invoke", "States": {
            "Invoke": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:lambda:invoke", "ResultPath": "$.called", "Next": "Missing",
                       "Parameters": {"FunctionName": "${EchoFunctionArn}", "Payload": {"value.$": "$.x"}},
                       "ResultSelector": {"status.$": "$.StatusCode", "version.$": "$.ExecutedVersion", "payload.$": "$.Payload"}},
            "Missing": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:lambda:getFunction", "ResultPath": "$.found", "End": true,
                        "Parameters": {"FunctionName": "sas-no-such-function"},
                        "Catch": [{"ErrorEquals": ["Lambda.ResourceNotFoundException"], "ResultPath": null, "Next": "Gone"}]},
            "Gone": {"Type": "Pass", "Result": "no such function", "ResultPath": "$.found", "End": true}}}),
        &[json!({"x": {"a": [1, 2]}}), json!({"x": "text"})],
    ));
    c.push(case(
        "aws-sdk-s3",
        "aws-sdk tasks of S3 (REST-XML) on LocalStack's S3: createBucket, putObject of a JSON body with a \
         content type and metadata, getObject (its Body parsed by the ResultSelector's States.StringToJson, \
         read into after), listObjectsV2 under a prefix (its XML), headObject, and getObject of a missing key \
         (S3.NoSuchKeyException, caught)",
        json!({"StartAt": "Bucket", "States": {
            "Bucket": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:createBucket", "ResultPath": null, "Next": "Put",
                       "Parameters": {"Bucket": "sas-asl-diff-objects"}},
            "Put": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:putObject", "ResultPath": "$.put", "Next": "Get",
                    "Parameters": {"Bucket": "sas-asl-diff-objects", "Key.$": "States.Format('{}/{}.json', $.key, $.name)",
                                   "Body.$": "$.doc", "ContentType": "application/json", "Metadata": {"run.$": "$.name"}},
                    "ResultSelector": {"etag.$": "$.ETag"}},
            "Get": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:getObject", "ResultPath": "$.got", "Next": "Use",
                    "Parameters": {"Bucket": "sas-asl-diff-objects", "Key.$": "States.Format('{}/{}.json', $.key, $.name)"},
                    "ResultSelector": {"doc.$": "States.StringToJson($.Body)", "type.$": "$.ContentType",
                                       "length.$": "$.ContentLength", "meta.$": "$.Metadata"}},
            "Use": {"Type": "Pass", "Parameters": {"first.$": "$.got.doc.items[0]", "key.$": "$.key", "name.$": "$.name"},
                    "ResultPath": "$.used", "Next": "List"},
            "List": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:listObjectsV2", "ResultPath": "$.listed", "Next": "Head",
                     "Parameters": {"Bucket": "sas-asl-diff-objects", "Prefix.$": "States.Format('{}/', $.key)"},
                     "ResultSelector": {"count.$": "$.KeyCount", "first.$": "$.Contents[0].Key", "size.$": "$.Contents[0].Size"}},
            "Head": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:headObject", "ResultPath": "$.head", "Next": "Missing",
                     "Parameters": {"Bucket": "sas-asl-diff-objects", "Key.$": "States.Format('{}/{}.json', $.key, $.name)"},
                     "ResultSelector": {"length.$": "$.ContentLength", "type.$": "$.ContentType"}},
            "Missing": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:getObject", "ResultPath": "$.missing", "End": true,
                        "Parameters": {"Bucket": "sas-asl-diff-objects", "Key.$": "States.Format('{}/missing', $.key)"},
                        "Catch": [{"ErrorEquals": ["S3.NoSuchKeyException"], "ResultPath": null, "Next": "Gone"}]},
            "Gone": {"Type": "Pass", "Result": "no such key", "ResultPath": "$.missing", "End": true}}}),
        &[json!({"key": KEY, "name": "a", "doc": {"items": [1, 2], "ok": true}}),
          json!({"key": KEY, "name": "b", "doc": {"items": ["x"]}})],
    ));
    c.push(case(
        "distributed-map-s3",
        "a Distributed Map over a JSON file in S3 (ItemReader; MaxItems 0, no limit), its ItemSelector \
         reading the item, the map's input and the context, each item sent to a function; the file put \
         there first by the machine (createBucket, putObject; a JSON file: LocalStack's Step Functions \
         writes a string Body as JSON text, so a CSV cannot be put this way); an empty file. Here: the \
         s3_items agent, a page's child task, the page's items mapped; the output every item's answer in \
         order, [] when there is none",
        json!({"StartAt": "Bucket", "States": {
            "Bucket": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:createBucket", "ResultPath": null, "Next": "Put",
                       "Parameters": {"Bucket": "sas-asl-diff-rows"}},
            "Put": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:putObject", "ResultPath": null, "Next": "Rows",
                    "Parameters": {"Bucket": "sas-asl-diff-rows", "Key.$": "States.Format('{}/{}.json', $.key, $.name)",
                                   "Body.$": "$.rows"}},
            "Rows": {"Type": "Map", "MaxConcurrency": 4, "ResultPath": "$.rows", "End": true,
                     "ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
                                    "ReaderConfig": {"InputType": "JSON", "MaxItems": 0},
                                    "Parameters": {"Bucket": "sas-asl-diff-rows", "Key.$": "States.Format('{}/{}.json', $.key, $.name)"}},
                     "ItemSelector": {"row.$": "$$.Map.Item.Value", "file.$": "$.name", "fixed": "x"},
                     "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                                       "StartAt": "Shape", "States": {
                                           "Shape": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "End": true}}}}}}),
        &[json!({"key": KEY, "name": "a", "rows": [{"id": 1, "qty": 3}, {"id": 2, "note": "a, b"}, "text", [1, 2]]}),
          json!({"key": KEY, "name": "b", "rows": []})],
    ));
    c.push(case(
        "aws-sdk-query",
        "aws-sdk tasks of the query protocol on LocalStack: SNS createTopic, publish with message attributes \
         (a map, form-encoded as entries) and a JSON message, getTopicAttributes (its map read from XML), \
         STS getCallerIdentity, and getTopicAttributes of a missing topic (SNS.NotFoundException, caught by \
         its name)",
        json!({"StartAt": "Topic", "States": {
            "Topic": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sns:createTopic", "ResultPath": "$.topic", "Next": "Publish",
                      "Parameters": {"Name": "sas-asl-diff-topic", "Tags": [{"Key": "made-by", "Value": "asl-diff"}]}},
            "Publish": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sns:publish", "ResultPath": "$.published", "Next": "Attributes",
                        "Parameters": {"TopicArn.$": "$.topic.TopicArn", "Message.$": "$.doc", "Subject": "asl-diff",
                                       "MessageAttributes": {"kind": {"DataType": "String", "StringValue.$": "$.name"}}},
                        "ResultSelector": {"sent.$": "States.ArrayLength(States.Array($.MessageId))"}},
            "Attributes": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sns:getTopicAttributes", "ResultPath": "$.attributes", "Next": "Who",
                           "Parameters": {"TopicArn.$": "$.topic.TopicArn"},
                           "ResultSelector": {"arn.$": "$.Attributes.TopicArn", "name.$": "$.Attributes.DisplayName"}},
            "Who": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sts:getCallerIdentity", "ResultPath": "$.who", "Next": "Missing",
                    "ResultSelector": {"account.$": "$.Account"}},
            "Missing": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sns:getTopicAttributes", "ResultPath": "$.missing", "End": true,
                        "Parameters": {"TopicArn": "arn:aws:sns:us-east-1:000000000000:sas-asl-diff-no-such-topic"},
                        "Catch": [{"ErrorEquals": ["SNS.NotFoundException"], "ResultPath": "$.error", "Next": "Gone"}]},
            "Gone": {"Type": "Pass", "Parameters": {"error.$": "$.error.Error", "who.$": "$.who", "sent.$": "$.published.sent",
                                                    "topic.$": "$.topic", "attributes.$": "$.attributes"}, "End": true}}}),
        &[json!({"name": "a", "doc": {"items": [1, 2], "ok": true}}), json!({"name": "b & c", "doc": "plain text"})],
    ));
    c.push(case(
        "sync-child",
        "a child execution run to completion on LocalStack's Step Functions (the job loop here: start, then \
         DescribeExecution until it ends): .sync:2's output parsed, .sync's as text, a child that fails \
         (States.TaskFailed, caught)",
        json!({"StartAt": "Run", "States": {
            "Run": {"Type": "Task", "Resource": "arn:aws:states:::states:startExecution.sync:2", "Next": "Text",
                    "Parameters": {"StateMachineArn": "${ChildMachineArn}", "Input": {"n.$": "$.n", "fail.$": "$.fail"}},
                    "ResultSelector": {"out.$": "$.Output", "status.$": "$.Status", "sent.$": "$.Input.n"},
                    "ResultPath": "$.child",
                    "Catch": [{"ErrorEquals": ["States.TaskFailed"], "ResultPath": null, "Next": "Caught"}]},
            "Text": {"Type": "Task", "Resource": "arn:aws:states:::states:startExecution.sync", "End": true,
                     "Parameters": {"StateMachineArn": "${ChildMachineArn}", "Input": {"n.$": "$.n", "fail": false}},
                     "ResultSelector": {"out.$": "$.Output", "status.$": "$.Status"}, "ResultPath": "$.text"},
            "Caught": {"Type": "Pass", "Result": "the child failed", "ResultPath": "$.caught", "End": true}}}),
        &[json!({"n": 2, "fail": false}), json!({"n": 5, "fail": true})],
    ));
    c
}

/// The child machine the sync-child case runs: it echoes `n`, or fails when asked to.
const CHILD_MACHINE: &str = r#"{"StartAt": "Check", "States": {
    "Check": {"Type": "Choice", "Choices": [{"Variable": "$.fail", "BooleanEquals": true, "Next": "No"}], "Default": "Yes"},
    "Yes": {"Type": "Pass", "Parameters": {"got.$": "$.n", "by": "child"}, "End": true},
    "No": {"Type": "Fail", "Error": "ChildFailed", "Cause": "asked to"}}}"#;

/// The table and queue the aws-sdk case calls (made once, kept: their items are keyed by run),
/// and the child machine the sync-child case runs, by the variable the definition names them with.
async fn aws_sdk_resources(sdk: &aws_config::SdkConfig) -> Vec<(String, String)> {
    let table = "sas-asl-diff-items";
    crate::common::items_table(sdk, table).await;
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let queue = sqs.create_queue().queue_name("sas-asl-diff-queue").send().await.expect("creating the queue");
    let child = aws_sdk_sfn::Client::new(sdk)
        .create_state_machine()
        .name(format!("sas-asl-diff-child-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]))
        .definition(CHILD_MACHINE)
        .role_arn("arn:aws:iam::000000000000:role/asl-diff")
        .send()
        .await
        .expect("creating the child machine")
        .state_machine_arn;
    // the bucket a map over S3 writes its pages to here (the s3_items agents' ${MAP_BUCKET})
    let pages = "sas-asl-diff-pages";
    crate::common::bucket(&crate::common::s3(sdk), pages).await;
    vec![
        ("MAP_BUCKET".to_owned(), pages.to_owned()),
        ("ItemsTable".to_owned(), table.to_owned()),
        ("DiffQueueUrl".to_owned(), queue.queue_url().expect("a queue URL").to_owned()),
        ("ChildMachineArn".to_owned(), child),
    ]
}

/// Definitions where the book says how this project differs (import-asl.md, "What differs": "a
/// caught error's Error is the failure's kind here ...; retriers and catchers that name errors
/// cannot tell them apart"): run both ways, the difference checked as the book words it.
#[allow(clippy::type_complexity)]
const DOCUMENTED: &[(fn() -> Case, fn(&Observed, &Observed) -> Result<(), String>)] = &[(
    || {
        case(
            "parallel-catch-fail",
            "a Parallel whose Catch leads only to a Fail state: both fail, Step Functions with the Fail \
                 state's Error, the task naming the branch's error (import-asl.md: its Catch leads only to Fail)",
            json!({"StartAt": "Both", "States": {
                    "Both": {"Type": "Parallel", "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Rejected"}], "End": true,
                             "Branches": [
                        {"StartAt": "Ok", "States": {"Ok": {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}},
                        {"StartAt": "No", "States": {"No": {"Type": "Task", "Resource": "${FailFunctionArn}", "End": true}}}]},
                    "Rejected": {"Type": "Fail", "Error": "Rejected", "Cause": "a branch failed"}}}),
            &[json!({"a": 1})],
        )
    },
    |sfn, ours| match (&sfn.end, &ours.end) {
        (End::Failed { error: theirs, .. }, End::Failed { error: reason, .. })
            if theirs == "Rejected" && reason.contains("CustomError") && reason.contains("branch No") =>
        {
            Ok(())
        }
        _ => Err(format!("expected both to fail, the task naming the branch's error: {sfn:?} / {ours:?}")),
    },
)];

/// A run where Step Functions failed because a path names nothing (LocalStack says `Exception`
/// or `States.Runtime`, AWS `States.Runtime`), naming the path, and the task went on.
fn failed_on_the_path(sfn: &Observed, ours: &Observed, path: &str) -> Result<Value, String> {
    match (&sfn.end, &ours.end) {
        (End::Failed { error, cause }, End::Succeeded(out))
            if (error == "Exception" || error == "States.Runtime") && cause.contains(&format!("'{path}'")) =>
        {
            Ok(out.clone())
        }
        _ => Err(format!("expected Step Functions to fail on {path} and the task to succeed: {sfn:?} / {ours:?}")),
    }
}

/// A definition that differs for a reason of the importer or the engine.
struct Known {
    case: fn() -> Case,
    /// Why, as far as this test can tell.
    diagnosis: &'static str,
    /// Asserts the difference as it is today.
    check: fn(&Observed, &Observed) -> Result<(), String>,
}

const MISSING: &str = "a path that names nothing is a States.Runtime error in Step Functions (the execution fails); \
        the importer writes the path into a template of this project, where a path that names nothing is null \
        (docs/concepts/decisions.md), so the task goes on with null; import-asl.md's \"What differs\" says so only \
        of a Choice's comparisons";

/// The definitions that differ for a reason of the importer or the engine, each with its
/// diagnosis and a check that asserts the difference as it is today: once fixed, the check fails
/// and the definition must move to [`hand_written`].
const KNOWN_DIFFERENCES: &[Known] = &[
    Known {
        case: || {
            case(
                "missing-parameters",
                "a Task's Parameters with a path that names nothing in its input",
                json!({"StartAt": "Shape", "States": {
                    "Shape": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"x.$": "$.absent", "k": 1}, "End": true}}}),
                &[json!({"n": 1})],
            )
        },
        diagnosis: MISSING,
        check: |sfn, ours| {
            let out = failed_on_the_path(sfn, ours, "$.absent")?;
            (out["got"] == json!({"x": null, "k": 1})).then_some(()).ok_or(format!("the function got {}", out["got"]))
        },
    },
    Known {
        case: || {
            case(
                "missing-selector",
                "a ResultSelector path that names nothing in the function's answer",
                json!({"StartAt": "Add", "States": {
                    "Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "ResultSelector": {"x.$": "$.nope"}, "ResultPath": "$.r", "End": true}}}),
                &[json!({"a": 1})],
            )
        },
        diagnosis: MISSING,
        check: |sfn, ours| {
            let out = failed_on_the_path(sfn, ours, "$.nope")?;
            (out["r"] == json!({"x": null})).then_some(()).ok_or(format!("the result is {}", out["r"]))
        },
    },
    Known {
        case: || {
            case(
                "missing-inputpath",
                "an InputPath that names nothing",
                json!({"StartAt": "Shape", "States": {
                    "Shape": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.nope", "ResultPath": "$.r", "End": true}}}),
                &[json!({"a": 1})],
            )
        },
        diagnosis: MISSING,
        check: |sfn, ours| {
            let out = failed_on_the_path(sfn, ours, "$.nope")?;
            (out["r"]["type"] == "null").then_some(()).ok_or(format!("the function got {}", out["r"]))
        },
    },
    Known {
        case: || {
            case(
                "missing-outputpath",
                "an OutputPath that names nothing, before another Task",
                json!({"StartAt": "Add", "States": {
                    "Add": {"Type": "Task", "Resource": "${AddFunctionArn}", "OutputPath": "$.nope", "Next": "Shape"},
                    "Shape": {"Type": "Task", "Resource": "${ShapeFunctionArn}", "End": true}}}),
                &[json!({"a": 1})],
            )
        },
        diagnosis: MISSING,
        check: |sfn, ours| {
            let out = failed_on_the_path(sfn, ours, "$.nope")?;
            (out["type"] == "null").then_some(()).ok_or(format!("the next function got {out}"))
        },
    },
];

// ---------------------------------------------------------------------------------------------
// The generator

/// A small deterministic generator (splitmix64): the same seed, the same definition.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % (n as u64)).unwrap_or(0)
    }

    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        let span = usize::try_from(hi - lo + 1).unwrap_or(1);
        lo + i64::try_from(self.below(span)).unwrap_or(0)
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const COLOURS: [&str; 3] = ["red", "green", "blue"];

/// A definition in the making: its states, the ways out of the last element (a state and its
/// field, `Next` or a Choice's `Default`), and the paths the data has at that point.
struct Gen {
    rng: Rng,
    states: Map<String, Value>,
    start: Option<String>,
    open: Vec<(String, &'static str)>,
    k: usize,
    numbers: Vec<String>,
    strings: Vec<String>,
    flaky: bool,
}

impl Gen {
    fn num(&mut self) -> String {
        let xs = self.numbers.clone();
        self.rng.pick(&xs).clone()
    }

    fn any(&mut self) -> String {
        let mut xs = self.numbers.clone();
        xs.extend(self.strings.iter().cloned());
        xs.extend(["$.flag", "$.nums", "$.obj", "$"].map(String::from));
        self.rng.pick(&xs).clone()
    }

    /// Add an element's states, its first state taking the ways out of the one before.
    fn add(&mut self, first: &str, states: Vec<(String, Value)>, open: Vec<(String, &'static str)>) {
        for (name, field) in std::mem::take(&mut self.open) {
            if field == "Catch" {
                self.states[&name]["Catch"][0]["Next"] = json!(first);
            } else {
                self.states[&name][field] = json!(first);
            }
        }
        if self.start.is_none() {
            self.start = Some(first.to_owned());
        }
        for (name, s) in states {
            self.states.insert(name, s);
        }
        self.open = open;
    }

    fn add_task(&mut self, k: usize) -> Value {
        let (a, b) = (self.num(), self.num());
        let params = if self.rng.chance(25) {
            json!({"values.$": "$.nums"})
        } else {
            json!({"a.$": a, "b.$": b, "c": self.rng.int(-3, 3)})
        };
        self.numbers.push(format!("$.t{k}.sum"));
        if self.rng.chance(50) {
            json!({"Type": "Task", "Resource": "${AddFunctionArn}", "Parameters": params, "ResultPath": format!("$.t{k}")})
        } else {
            json!({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                   "Parameters": {"FunctionName": "${AddFunctionArn}", "Payload": params},
                   "ResultSelector": {"sum.$": "$.Payload.sum"}, "ResultPath": format!("$.t{k}")})
        }
    }

    fn shape_task(&mut self, k: usize, keep: bool) -> Value {
        let mut s = if self.rng.chance(25) {
            json!({"Type": "Task", "Resource": "${ShapeFunctionArn}", "InputPath": "$.obj"})
        } else {
            let p = self.any();
            json!({"Type": "Task", "Resource": "${ShapeFunctionArn}", "Parameters": {"x.$": p, "tag": format!("g{k}")}})
        };
        if self.rng.chance(40) {
            s["ResultSelector"] = json!({"keys.$": "$.keys"});
        }
        s["ResultPath"] = if keep { json!(format!("$.t{k}")) } else { Value::Null };
        s
    }

    fn condition(&mut self) -> Value {
        let simple = |g: &mut Gen| -> Value {
            match g.rng.below(3) {
                0 => {
                    let op = *g.rng.pick(&[
                        "NumericGreaterThan",
                        "NumericLessThan",
                        "NumericEquals",
                        "NumericGreaterThanEquals",
                    ]);
                    let v = g.num();
                    let mut r = json!({"Variable": v});
                    r[op] = json!(g.rng.int(-5, 25));
                    r
                }
                1 => json!({"Variable": "$.s", "StringEquals": *g.rng.pick(&COLOURS)}),
                _ => json!({"Variable": "$.flag", "BooleanEquals": g.rng.chance(50)}),
            }
        };
        match self.rng.below(4) {
            0 => json!({"And": [simple(self), simple(self)]}),
            1 => json!({"Or": [simple(self), simple(self)]}),
            2 => json!({"Not": simple(self)}),
            _ => simple(self),
        }
    }

    #[allow(clippy::too_many_lines)]
    fn element(&mut self) {
        self.k += 1;
        let k = self.k;
        // the kinds of element, Task and Choice twice as likely; the flaky function once at most
        let mut kind = self.rng.below(12);
        if kind >= 10 && self.flaky {
            kind = 2;
        }
        match kind {
            0 => {
                let name = format!("P{k}");
                let c = self.rng.int(0, 9);
                let w = *self.rng.pick(&COLOURS);
                self.numbers.push(format!("$.p{k}.c"));
                self.strings.push(format!("$.p{k}.w"));
                let state = json!({"Type": "Pass", "Result": {"c": c, "w": w}, "ResultPath": format!("$.p{k}")});
                self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
            }
            1 => {
                let name = format!("P{k}");
                let (v, w) = (self.num(), self.rng.pick(&["$.s", "$.obj.y"]).to_string());
                let lit = self.rng.int(0, 5);
                self.numbers.push(format!("$.p{k}.v"));
                self.strings.push(format!("$.p{k}.w"));
                let state = json!({"Type": "Pass", "Parameters": {"v.$": v, "w.$": w, "lit": lit}, "ResultPath": format!("$.p{k}")});
                self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
            }
            2 | 3 => {
                let name = format!("T{k}");
                let state = self.add_task(k);
                self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
            }
            4 => {
                let name = format!("T{k}");
                let keep = self.rng.chance(60);
                let state = self.shape_task(k, keep);
                self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
            }
            5 | 6 => {
                let name = format!("C{k}");
                let mut rule = self.condition();
                if self.rng.chance(30) {
                    // a way to a Fail state, the Default on to what follows
                    let f = format!("F{k}");
                    rule["Next"] = json!(f);
                    let state = json!({"Type": "Choice", "Choices": [rule]});
                    let fail =
                        json!({"Type": "Fail", "Error": format!("Gen{k}"), "Cause": "the generator's Fail state"});
                    self.add(&name, vec![(name.clone(), state), (f, fail)], vec![(name.clone(), "Default")]);
                } else {
                    let (then, other) = (format!("Then{k}"), format!("Else{k}"));
                    rule["Next"] = json!(then);
                    let state = json!({"Type": "Choice", "Choices": [rule], "Default": other});
                    let mut a = self.shape_task(k, false);
                    a["Parameters"] = json!({"way": "then", "n.$": "$.n"});
                    a.as_object_mut().map(|o| o.remove("InputPath"));
                    let mut b = self.shape_task(k, false);
                    b["Parameters"] = json!({"way": "else", "s.$": "$.s"});
                    b.as_object_mut().map(|o| o.remove("InputPath"));
                    self.add(
                        &name,
                        vec![(name.clone(), state), (then.clone(), a), (other.clone(), b)],
                        vec![(then, "Next"), (other, "Next")],
                    );
                }
            }
            7 => {
                let name = format!("Par{k}");
                let mut branches = Vec::new();
                let mut made = Vec::new();
                for (i, letter) in ["a", "b"].iter().enumerate() {
                    let b = format!("B{k}{letter}");
                    if self.rng.chance(70) {
                        let (x, y) = (self.num(), self.num());
                        branches.push(
                            json!({"StartAt": b, "States": {b.clone(): {"Type": "Task", "Resource": "${AddFunctionArn}",
                            "Parameters": {"a.$": x, "b.$": y}, "End": true}}}),
                        );
                        made.push(format!("$.par{k}[{i}].sum"));
                    } else {
                        let c = self.rng.int(0, 9);
                        branches.push(json!({"StartAt": b, "States": {b.clone(): {"Type": "Pass", "Result": {"c": c}, "End": true}}}));
                        made.push(format!("$.par{k}[{i}].c"));
                    }
                }
                // the branches read the Parallel's input: what it makes is there only after it
                self.numbers.extend(made);
                let state = json!({"Type": "Parallel", "Branches": branches, "ResultPath": format!("$.par{k}")});
                self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
            }
            8 => {
                let name = format!("M{k}");
                let inner = format!("MT{k}");
                let state = json!({"Type": "Map", "ItemsPath": "$.nums", "MaxConcurrency": self.rng.int(0, 3),
                    "ItemSelector": {"v.$": "$$.Map.Item.Value", "i.$": "$$.Map.Item.Index", "c": self.rng.int(0, 3)},
                    "ItemProcessor": {"StartAt": inner, "States": {inner.clone(): {"Type": "Task", "Resource": "${AddFunctionArn}", "End": true}}},
                    "ResultPath": format!("$.m{k}")});
                self.numbers.push(format!("$.m{k}[0].sum"));
                self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
            }
            9 => {
                // a function that always fails, caught: the normal way leads to a Fail state
                let name = format!("T{k}");
                let never = format!("Never{k}");
                let state = json!({"Type": "Task", "Resource": "${FailFunctionArn}", "Parameters": {"message": format!("gen {k}")},
                    "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": format!("$.e{k}"), "Next": "__next__"}],
                    "Next": never});
                let fail = json!({"Type": "Fail", "Error": "Unreachable"});
                self.add(&name, vec![(name.clone(), state), (never, fail)], vec![]);
                self.open = vec![(name.clone(), "Catch")];
                self.strings.push(format!("$.e{k}.Cause"));
            }
            _ => {
                // the flaky function, retried; sometimes not enough (the execution fails), or caught and joined
                self.flaky = true;
                let name = format!("T{k}");
                let fails = self.rng.int(1, 2);
                let attempts = self.rng.int(fails - 1, fails + 1);
                let mut state = json!({"Type": "Task", "Resource": "${FlakyFunctionArn}", "Parameters": {"key.$": "$.key", "fails": fails},
                    "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": attempts, "BackoffRate": 1.0}],
                    "ResultPath": format!("$.f{k}")});
                if self.rng.chance(50) {
                    state["ResultPath"] = Value::Null;
                    state["Catch"] = json!([{"ErrorEquals": ["States.ALL"], "ResultPath": null, "Next": "__next__"}]);
                    self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
                    self.open.push((name.clone(), "Catch"));
                } else {
                    self.numbers.push(format!("$.f{k}.calls"));
                    self.add(&name, vec![(name.clone(), state)], vec![(name.clone(), "Next")]);
                }
            }
        }
    }
}

/// A small random definition within the importer's subset, and two inputs of the known shape
/// (`n`, `m`, `s`, `flag`, `nums`, `obj`, `key`).
fn generate(seed: u64) -> Case {
    let mut g = Gen {
        rng: Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D)),
        states: Map::new(),
        start: None,
        open: Vec::new(),
        k: 0,
        numbers: ["$.n", "$.m", "$.obj.x", "$.nums[0]"].map(String::from).to_vec(),
        strings: ["$.s", "$.obj.y"].map(String::from).to_vec(),
        flaky: false,
    };
    let elements = 2 + g.rng.below(4);
    for _ in 0..elements {
        g.element();
        if g.rng.chance(8) {
            let n = format!("W{}", g.k);
            g.add(&n, vec![(n.clone(), json!({"Type": "Wait", "Seconds": 1}))], vec![(n.clone(), "Next")]);
        }
    }
    let finish = if g.rng.chance(35) {
        let (a, b) = (g.num(), g.any());
        json!({"Type": "Pass", "Parameters": {"first.$": a, "second.$": b, "n.$": "$.n"}, "End": true})
    } else {
        json!({"Type": "Pass", "End": true})
    };
    g.add("Finish", vec![("Finish".into(), finish)], vec![]);
    let def = json!({"Comment": format!("generated from seed {seed}"), "StartAt": g.start, "States": g.states});
    let mut inputs = Vec::new();
    for _ in 0..2 {
        let len = 1 + g.rng.below(3);
        let nums: Vec<i64> = (0..len).map(|_| g.rng.int(0, 9)).collect();
        inputs.push(
            json!({"n": g.rng.int(0, 20), "m": g.rng.int(-5, 5), "s": *g.rng.pick(&COLOURS), "flag": g.rng.chance(50),
                           "nums": nums, "obj": {"x": g.rng.int(0, 9), "y": *g.rng.pick(&COLOURS)}, "key": KEY}),
        );
    }
    case(&format!("gen-{seed}"), "generated", def, &inputs)
}

// ---------------------------------------------------------------------------------------------
// Running both ways

/// How a run ended.
#[derive(Debug, Clone)]
enum End {
    /// SUCCEEDED with this output; a task `Processed` with this result.
    Succeeded(Value),
    /// FAILED with this error and cause; a task `Compensated` or `Error` (the error is the task's
    /// reason).
    Failed { error: String, cause: String },
    /// Anything else (still running, timed out, aborted, cancelled...).
    Other(String),
}

/// A run seen from outside: how it ended, and the states (steps) that ran, each with how many
/// times (a state in a loop once per iteration).
#[derive(Debug, Clone)]
struct Observed {
    end: End,
    ran: BTreeMap<String, usize>,
    /// Step Functions: the error of each task that failed or timed out on the way, in order (the
    /// function's own, or one of LocalStack's: its call to the function cut or timed out); empty
    /// for this project's runs.
    errors: Vec<String>,
    /// The key the run used (its ledger's name): a run made again has a key of its own.
    key: String,
}

/// The value with the run's key put back as [`KEY`].
fn unkeyed(text: &str, key: &str) -> String {
    text.replace(key, KEY)
}

fn keyed(input: &Value, key: &str) -> Value {
    serde_json::from_str(&input.to_string().replace(KEY, key)).expect("an input with its key")
}

/// Deploy the functions (one bootstrap, `HANDLER` choosing each); their ARNs by variable name.
/// The differential test's functions, each invoked once before the runs: LocalStack starts a
/// function's first environment at its first invocation, and the first runs start together, so
/// both engines would otherwise meet those start-ups at once (a comparison of outputs and end
/// states, not of cold starts on a loaded machine).
async fn deploy_functions(sdk: &aws_config::SdkConfig) -> HashMap<String, String> {
    let arns = deploy(sdk, &FUNCTIONS.map(|(var, handler)| (var, handler, ""))).await;
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let warm = format!("{{\"key\": \"warm-{}\"}}", uuid::Uuid::new_v4().simple());
    futures::future::join_all(arns.iter().map(|(var, arn)| {
        let (lambda, warm) = (lambda.clone(), warm.clone());
        async move {
            // an answer or a function error (the fail function's) is an environment that started
            lambda
                .invoke()
                .function_name(arn)
                .payload(aws_sdk_lambda::primitives::Blob::new(warm))
                .send()
                .await
                .unwrap_or_else(|e| panic!("warming {var}: {}", aws_sdk_lambda::error::DisplayErrorContext(&e)));
        }
    }))
    .await;
    arns
}

/// Deploy `functions` (variable, `HANDLER`, `OP`); their ARNs by variable name.
async fn deploy(
    sdk: &aws_config::SdkConfig,
    functions: &[(&'static str, &'static str, &'static str)],
) -> HashMap<String, String> {
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let script = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("functions/asl-calc/bootstrap"))
        .expect("tests/functions/asl-calc/bootstrap");
    let zip = sas_cli::lambda::zip_bootstrap(&script).expect("zipping");
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let deploy = |var: &'static str, handler: &'static str, op: &'static str| {
        let (lambda, zip) = (lambda.clone(), zip.clone());
        let name = if op.is_empty() { format!("asl-{handler}-{suffix}") } else { format!("asl-{op}-{suffix}") };
        async move {
            let arn =
                crate::lambda_agent::create_function(&lambda, &name, &zip, &[("HANDLER", handler), ("OP", op)]).await;
            (var.to_owned(), arn)
        }
    };
    futures::future::join_all(functions.iter().map(|(var, handler, op)| deploy(var, handler, op)))
        .await
        .into_iter()
        .collect()
}

/// The definition as Step Functions takes it: every `${Var}` replaced by its function's ARN.
fn substituted(def: &Value, arns: &HashMap<String, String>) -> String {
    let mut text = def.to_string();
    for (var, arn) in arns {
        text = text.replace(&format!("${{{var}}}"), arn);
    }
    text
}

async fn create_machine(
    sfn: &aws_sdk_sfn::Client,
    case: &Case,
    arns: &HashMap<String, String>,
    suffix: &str,
) -> String {
    sfn.create_state_machine()
        .name(format!("asl-diff-{}-{suffix}", case.name))
        .definition(substituted(&case.def, arns))
        .role_arn("arn:aws:iam::000000000000:role/asl-diff")
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "CreateStateMachine {}: {e:?} (LocalStack runs Step Functions when stepfunctions is in its services: \
                 infra/localstack.sh's DEFAULT_SERVICES; restart a LocalStack started without it)",
                case.name
            )
        })
        .state_machine_arn
}

/// One execution on Step Functions: how it ended, and the states it entered. An execution that
/// LocalStack's Step Functions failed for a reason of its own (its call to the Lambda service cut,
/// "Connection was closed before we received a valid response from endpoint URL", error
/// `Exception`: seen once under load, our side having succeeded) is run again, twice at most, with
/// a key of its own: it says nothing of the definition.
async fn on_step_functions(sfn: &aws_sdk_sfn::Client, machine: &str, input: &Value, key: &str) -> Observed {
    let mut observed = execute_on_step_functions(sfn, machine, input, key).await;
    for again in 1..=2 {
        let End::Failed { error, cause } = &observed.end else { break };
        if !(error == "Exception" && cause.contains("Connection was closed before we received a valid response")) {
            break;
        }
        #[allow(clippy::print_stderr)]
        {
            eprintln!("[asl-diff] {machine}: Step Functions' own call failed ({cause}); run {again} more time");
        }
        observed = execute_on_step_functions(sfn, machine, input, &format!("{key}-again{again}")).await;
    }
    observed
}

/// The saga on Step Functions: a run in which a task failed for any reason but its function's own
/// refusal (`CustomError`) is made again, twice at most, with a key (a ledger) of its own. The
/// sample catches every error of a reservation (`States.ALL`) and undoes the trip, so LocalStack's
/// own trouble on a loaded machine (its call to a function cut, `Exception`, or past the state's
/// 20 s, `States.Timeout`) would change the path and the ledger: it says nothing of the definition.
async fn saga_on_step_functions(sfn: &aws_sdk_sfn::Client, machine: &str, input: &Value, key: &str) -> Observed {
    let mut observed = on_step_functions(sfn, machine, input, key).await;
    for again in 1..=2 {
        let theirs: Vec<&String> = observed.errors.iter().filter(|e| *e != "CustomError").collect();
        if theirs.is_empty() {
            break;
        }
        #[allow(clippy::print_stderr)]
        {
            eprintln!("[asl-saga] Step Functions' run {} met {theirs:?}; run {again} more time", observed.key);
        }
        let _ = std::fs::remove_file(format!("/tmp/asl-ledger-{}", observed.key));
        observed = on_step_functions(sfn, machine, input, &format!("{key}-more{again}")).await;
    }
    observed
}

/// [`on_step_functions`], once.
async fn execute_on_step_functions(sfn: &aws_sdk_sfn::Client, machine: &str, input: &Value, key: &str) -> Observed {
    let execution = sfn
        .start_execution()
        .state_machine_arn(machine)
        .input(keyed(input, key).to_string())
        .send()
        .await
        .expect("StartExecution")
        .execution_arn;
    let deadline = Instant::now() + Duration::from_mins(2);
    let end = loop {
        let d = sfn.describe_execution().execution_arn(&execution).send().await.expect("DescribeExecution");
        match d.status {
            ExecutionStatus::Running if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            ExecutionStatus::Succeeded => {
                let output = unkeyed(d.output.as_deref().unwrap_or("null"), key);
                break End::Succeeded(serde_json::from_str(&output).expect("a JSON output"));
            }
            ExecutionStatus::Failed => {
                break End::Failed {
                    error: unkeyed(d.error.as_deref().unwrap_or_default(), key),
                    cause: unkeyed(d.cause.as_deref().unwrap_or_default(), key),
                };
            }
            other => break End::Other(format!("{other:?}")),
        }
    };
    let mut ran = BTreeMap::new();
    let mut errors = Vec::new();
    let mut token = None;
    loop {
        // asked again after an error (once in a run of both tests here, an error this test did
        // not print), at most 5 times, and the last error is the failure's message
        let mut tries = 0;
        let (entered, failed, next) = loop {
            tries += 1;
            let asked =
                sfn.get_execution_history().execution_arn(&execution).max_results(1000).set_next_token(token.clone());
            match asked.send().await {
                Ok(page) => {
                    let entered =
                        page.events().iter().filter_map(|e| Some(e.state_entered_event_details()?.name().to_owned()));
                    let failed = page.events().iter().filter_map(|e| {
                        let error = e
                            .lambda_function_failed_event_details()
                            .and_then(|d| d.error())
                            .or_else(|| e.lambda_function_timed_out_event_details().and_then(|d| d.error()))
                            .or_else(|| e.lambda_function_start_failed_event_details().and_then(|d| d.error()))
                            .or_else(|| e.lambda_function_schedule_failed_event_details().and_then(|d| d.error()))
                            .or_else(|| e.task_failed_event_details().and_then(|d| d.error()))
                            .or_else(|| e.task_timed_out_event_details().and_then(|d| d.error()))
                            .or_else(|| e.task_start_failed_event_details().and_then(|d| d.error()))
                            .or_else(|| e.task_submit_failed_event_details().and_then(|d| d.error()));
                        error.map(str::to_owned)
                    });
                    break (entered.collect::<Vec<_>>(), failed.collect::<Vec<_>>(), page.next_token);
                }
                Err(e) => {
                    // LocalStack 4.13 may write an event the SDK cannot read (a Lambda scheduled
                    // after its state timed out, its timeoutInSeconds the task's input): the
                    // states entered are read from the answer's JSON
                    let raw = e
                        .raw_response()
                        .and_then(|r| r.body().bytes())
                        .and_then(|b| serde_json::from_slice::<Value>(b).ok());
                    if let Some(Value::Array(events)) = raw.as_ref().map(|v| v["events"].clone()) {
                        let entered = events
                            .iter()
                            .filter_map(|e| e["stateEnteredEventDetails"]["name"].as_str().map(str::to_owned));
                        // the same failures as above: the details of a task that failed, timed out
                        // or could not start (ExecutionFailed's are not a task's)
                        let failed = events.iter().filter_map(|e| {
                            let details = e.as_object()?.iter().find(|(k, v)| {
                                (k.starts_with("lambdaFunction") || k.starts_with("task")) && v["error"].is_string()
                            })?;
                            details.1["error"].as_str().map(str::to_owned)
                        });
                        let next = raw.as_ref().and_then(|v| v["nextToken"].as_str().map(str::to_owned));
                        break (entered.collect(), failed.collect(), next);
                    }
                    assert!(tries < 5, "GetExecutionHistory of {execution}, {tries} tries: {e:?}");
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!("[asl-diff] GetExecutionHistory of {execution}, try {tries}: {e:?}");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        for name in entered {
            *ran.entry(name).or_insert(0) += 1;
        }
        errors.extend(failed);
        token = next;
        if token.is_none() {
            break;
        }
    }
    Observed { end, ran, errors, key: key.to_owned() }
}

/// The same input as a task of the imported workflow: how it ended, and the steps that ran.
async fn on_this_project(s: &Stack, workflow: &str, input: &Value, key: &str, id: &str) -> Observed {
    on_this_project_within(s, workflow, input, key, id, Duration::from_mins(3)).await
}

/// [`on_this_project`], waiting at most `wait` for the task to end.
async fn on_this_project_within(
    s: &Stack,
    workflow: &str,
    input: &Value,
    key: &str,
    id: &str,
    wait: Duration,
) -> Observed {
    let body = json!({"v": 1, "task_id": id, "workflow": workflow, "input": keyed(input, key)});
    s.send(&s.res.submission_queue_url, &body.to_string()).await;
    let deadline = Instant::now() + wait;
    let task: Option<Task> = loop {
        let t = s.task(id).await;
        if t.as_ref().is_some_and(|t| t.process_state.is_terminal()) || Instant::now() > deadline {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let Some(t) = task else {
        return Observed {
            end: End::Other("no task".into()),
            ran: BTreeMap::new(),
            errors: vec![],
            key: key.to_owned(),
        };
    };
    let reason = unkeyed(t.reason.as_deref().unwrap_or_default(), key);
    let end = match t.process_state {
        ProcessState::Processed => {
            let result = t.result().unwrap_or(Value::Null);
            End::Succeeded(serde_json::from_str(&unkeyed(&result.to_string(), key)).expect("JSON"))
        }
        ProcessState::Compensated | ProcessState::Error => End::Failed { error: reason, cause: String::new() },
        other => {
            // not ended in time: say where it stands and how it got there (its history, each
            // entry in seconds after the task was created; CompleteBy of the attempt in flight),
            // so that a failure tells what was waited for
            End::Other(format!("{other:?} ({}): {reason}", timeline(&t)))
        }
    };
    let mut ran = BTreeMap::new();
    steps_that_ran(s, &t, &mut ran).await;
    Observed { end, ran, errors: vec![], key: key.to_owned() }
}

/// Where a task stands and how it got there: its revision, its steps, its history (each entry in
/// seconds after the task was created) and CompleteBy of the attempt in flight, so that a failure
/// tells what was waited for.
fn timeline(t: &Task) -> String {
    let steps: Vec<String> =
        t.steps.iter().map(|st| format!("{} {:?} attempts {}", st.name, st.status, st.attempts)).collect();
    let since = |at: Millis| {
        let ms = at.0.saturating_sub(t.created_at.0);
        format!("{}.{} s", ms / 1000, ms % 1000 / 100)
    };
    let history: Vec<String> = t
        .history
        .iter()
        .map(|h| format!("{} {:?} {}", since(h.at), h.state, h.step.as_deref().unwrap_or("")))
        .collect();
    format!(
        "rev {}; {}; history: {}; CompleteBy {}, updated {}, now {}",
        t.rev,
        steps.join(", "),
        history.join(", "),
        t.complete_by.map_or_else(|| "none".to_owned(), since),
        since(t.updated_at),
        since(Millis::now()),
    )
}

/// The steps of a task that ran (neither pending nor skipped), each with how many times. The steps
/// of a parallel region run as branches, each a task of its own (`{task}~{head}~{k}`, see
/// `sas_protocol::graph`): the region's record (on its first step) says which branches started,
/// and each branch's task which of its steps ran (a step seen both in the task and in its branch
/// ran once). A loop's iterations are tasks of their own too (`{task}~{step}~{i}`, from 0): each
/// iteration's steps count once more.
fn steps_that_ran<'a>(
    s: &'a Stack,
    t: &'a Task,
    out: &'a mut BTreeMap<String, usize>,
) -> futures::future::BoxFuture<'a, ()> {
    Box::pin(async move {
        let mut once = BTreeSet::new();
        ran_once(s, t, &mut once, out).await;
        for name in once {
            *out.entry(name).or_insert(0) += 1;
        }
    })
}

/// [`steps_that_ran`] within one run of a task: the names of the steps of `t` and of its
/// branches, into `once`; its loops' iterations counted into `out`.
fn ran_once<'a>(
    s: &'a Stack,
    t: &'a Task,
    once: &'a mut BTreeSet<String>,
    out: &'a mut BTreeMap<String, usize>,
) -> futures::future::BoxFuture<'a, ()> {
    Box::pin(async move {
        for (i, step) in t.steps.iter().enumerate() {
            let is_loop = t.workflow.steps.get(i).is_some_and(|d| d.kind.loop_spec().is_some());
            match &step.map {
                _ if is_loop && !matches!(step.status, StepStatus::Pending | StepStatus::Skipped) => {
                    once.insert(step.name.clone());
                    for k in 0..=sas_protocol::workflow::MAX_LOOP_ITERATIONS {
                        match s.deps.store.get(&TaskId::child(&t.task_id, i, k)).await.expect("GetItem") {
                            Some(iteration) => steps_that_ran(s, &iteration, out).await,
                            None => break,
                        }
                    }
                }
                Some(region) if region.branches.is_some() => {
                    for k in 0..region.n {
                        if let Some(branch) = s.deps.store.get(&TaskId::child(&t.task_id, i, k)).await.expect("GetItem")
                        {
                            ran_once(s, &branch, once, out).await;
                        }
                    }
                }
                _ if matches!(step.status, StepStatus::Pending | StepStatus::Skipped) => {}
                _ => {
                    once.insert(step.name.clone());
                }
            }
        }
    })
}

/// Every state's name, in every block of the definition.
fn state_names(def: &Value, out: &mut BTreeSet<String>) {
    if let Some(states) = def.get("States").and_then(Value::as_object) {
        for (name, s) in states {
            out.insert(name.clone());
            for b in s.get("Branches").and_then(Value::as_array).into_iter().flatten() {
                state_names(b, out);
            }
            for p in ["ItemProcessor", "Iterator"] {
                if let Some(p) = s.get(p) {
                    state_names(p, out);
                }
            }
        }
    }
}

/// JSON equality, numbers by value (`3` and `3.0` are one number).
#[allow(clippy::float_cmp)] // the same number read twice: exact equality is what is meant
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn is_caught_error(o: &Map<String, Value>) -> bool {
    o.len() == 2 && o.get("Error").is_some_and(Value::is_string) && o.get("Cause").is_some_and(Value::is_string)
}

/// The documented difference of a caught error, checked and set aside: where Step Functions'
/// output has a caught error (`{"Error", "Cause"}`) and ours has one at the same place, ours must
/// say the error's name where the catcher names that one error (`CustomError`), else the failure's
/// kind as the book and the `lambda` agent's classification say (`timed_out` for
/// `States.Timeout`, `permanent` for an error type whose last segment starts with `Permanent`,
/// else `retryable`), and its message must name the function's error type and carry its message
/// (Step Functions' `Cause` is Lambda's error document). Both are then replaced by one
/// placeholder, and the rest compared as it is.
fn caught_errors_aside(sfn: &Value, ours: &Value, at: &str, problems: &mut Vec<String>) -> (Value, Value) {
    match (sfn, ours) {
        (Value::Object(a), Value::Object(b)) if is_caught_error(a) && is_caught_error(b) => {
            let (error, cause) = (a["Error"].as_str().unwrap_or_default(), a["Cause"].as_str().unwrap_or_default());
            let (kind, message) = (b["Error"].as_str().unwrap_or_default(), b["Cause"].as_str().unwrap_or_default());
            let last = error.rsplit(['.', ':', '$']).next().unwrap_or(error);
            let expected = match error {
                "States.Timeout" => "timed_out",
                _ if last.starts_with("Permanent") => "permanent",
                _ => "retryable",
            };
            if kind != expected && kind != error {
                problems.push(format!("{at}: caught {error}, whose kind here is {expected}; ours says {kind}"));
            }
            let said: Value = serde_json::from_str(cause).unwrap_or(Value::Null);
            let said = said["errorMessage"].as_str().unwrap_or(cause);
            if error != "States.Timeout" && (!message.contains(said) || !message.contains(error)) {
                problems.push(format!("{at}: caught {error} ({cause}); our message {message:?} does not say it"));
            }
            let placeholder = json!({"Error": "(caught)", "Cause": "(caught)"});
            (placeholder.clone(), placeholder)
        }
        // a caught error's Cause read alone: a Lambda function's error as Step Functions writes it
        // ({"errorType", "errorMessage"}), the failure's message here (which names both)
        (Value::String(cause), Value::String(message))
            if serde_json::from_str::<Value>(cause)
                .is_ok_and(|c| c["errorType"].is_string() && c["errorMessage"].is_string()) =>
        {
            let c: Value = serde_json::from_str(cause).unwrap_or_default();
            let (error, said) =
                (c["errorType"].as_str().unwrap_or_default(), c["errorMessage"].as_str().unwrap_or_default());
            if !message.contains(error) || !message.contains(said) {
                problems.push(format!("{at}: the Cause {cause}; our message {message:?} does not say it"));
            }
            (json!("(cause)"), json!("(cause)"))
        }
        (Value::Object(theirs), Value::Object(mine)) => {
            let (mut theirs_aside, mut mine_aside) = (theirs.clone(), mine.clone());
            for (key, value) in theirs {
                if let Some(other) = mine.get(key) {
                    let (t, m) = caught_errors_aside(value, other, &format!("{at}.{key}"), problems);
                    theirs_aside.insert(key.clone(), t);
                    mine_aside.insert(key.clone(), m);
                }
            }
            (Value::Object(theirs_aside), Value::Object(mine_aside))
        }
        (Value::Array(theirs), Value::Array(mine)) => {
            let (mut theirs_aside, mut mine_aside) = (theirs.clone(), mine.clone());
            for (i, (value, other)) in theirs.iter().zip(mine).enumerate() {
                let (t, m) = caught_errors_aside(value, other, &format!("{at}[{i}]"), problems);
                theirs_aside[i] = t;
                mine_aside[i] = m;
            }
            (Value::Array(theirs_aside), Value::Array(mine_aside))
        }
        _ => (sfn.clone(), ours.clone()),
    }
}

/// Whether the two runs agree (see the module's documentation); why not.
fn compare(def: &Value, steps: &BTreeSet<String>, sfn: &Observed, ours: &Observed) -> Result<(), String> {
    match (&sfn.end, &ours.end) {
        (End::Succeeded(a), End::Succeeded(b)) => {
            let mut problems = Vec::new();
            let (x, y) = caught_errors_aside(a, b, "$", &mut problems);
            if !problems.is_empty() {
                return Err(problems.join("; "));
            }
            if !same(&x, &y) {
                return Err(format!("the outputs differ: Step Functions {a}, ours {b}"));
            }
        }
        (End::Failed { error, cause }, End::Failed { error: reason, .. }) => {
            // LocalStack 4.13 ends a Choice where no rule holds with States.Runtime ("No branching
            // option reached in state X", its state_choice.py); Step Functions on AWS, and the
            // importer's fail step, with States.NoChoiceMatched.
            let error = if error == "States.Runtime" && cause.contains("No branching option reached") {
                "States.NoChoiceMatched"
            } else {
                error.as_str()
            };
            // an error of the interpreter's own (a path or a value it cannot use) has no name
            // here: the task fails with a message of its own
            let interpreter = matches!(error, "Exception" | "States.Runtime" | "States.QueryEvaluationError");
            if !interpreter && !reason.contains(error) {
                return Err(format!(
                    "Step Functions failed with {error} ({cause}); the task's reason does not name it: {reason}"
                ));
            }
        }
        _ => return Err(format!("Step Functions {:?}, ours {:?}", sfn.end, ours.end)),
    }
    let mut states = BTreeSet::new();
    state_names(def, &mut states);
    let a: BTreeMap<&String, &usize> = sfn.ran.iter().filter(|(s, _)| steps.contains(*s)).collect();
    let b: BTreeMap<&String, &usize> = ours.ran.iter().filter(|(s, _)| states.contains(*s)).collect();
    if a != b {
        return Err(format!("different states ran (times each): Step Functions {a:?}, ours {b:?}"));
    }
    Ok(())
}

/// What a group's comparison asserts.
#[derive(Clone, Copy)]
enum Expect {
    /// The two agree.
    Agree,
    /// A difference the book documents, checked as it says.
    Documented(fn(&Observed, &Observed) -> Result<(), String>),
    /// A known difference, asserted as it is today.
    Known(fn(&Observed, &Observed) -> Result<(), String>, &'static str),
}

/// Every definition compared, with what its comparison asserts.
fn everything() -> Vec<(Case, Expect)> {
    let mut all: Vec<(Case, Expect)> = hand_written().into_iter().map(|c| (c, Expect::Agree)).collect();
    all.extend(SEEDS.map(|seed| (generate(seed), Expect::Agree)));
    all.extend(DOCUMENTED.iter().map(|(c, check)| (c(), Expect::Documented(*check))));
    all.extend(KNOWN_DIFFERENCES.iter().map(|k| ((k.case)(), Expect::Known(k.check, k.diagnosis))));
    for (c, _) in &mut all {
        recover_from_a_hung_call(&mut c.def);
        if let Some(j) = &mut c.ours {
            recover_from_a_hung_call(j);
        }
    }
    all
}

/// The functions that answer every event at once and change nothing: calling one again changes
/// no outcome on either side.
const HARMLESS: [&str; 3] = ["${AddFunctionArn}", "${ShapeFunctionArn}", "${EchoFunctionArn}"];

/// Gives every Task that calls a [`HARMLESS`] function, and says neither `TimeoutSeconds` nor
/// `Retry`, a 20 s timeout and one retry of a timeout, on both sides (the states of Map processors
/// and Parallel branches included). CI has seen an invoke of LocalStack's Lambda that never
/// answered our agent while the same function answered Step Functions (stops 43 and 53: a first
/// wave's `Add`, a Map element's `Add`, each with one attempt, ended by its `CompleteBy` 120 s
/// later under the relaxed budgets); the protocol's recovery from a hung call (the attempt cut or
/// timed out, then retried) is what such a call gets in production, and it now fits in the wait.
/// A function that answers changes nothing here: the timeout is twice the functions' own, and a
/// retry only follows a timeout, as neither function fails.
fn recover_from_a_hung_call(def: &mut Value) {
    let Some(states) = def.get_mut("States").and_then(Value::as_object_mut) else { return };
    for state in states.values_mut() {
        for nested in ["ItemProcessor", "Iterator"] {
            if let Some(p) = state.get_mut(nested) {
                recover_from_a_hung_call(p);
            }
        }
        if let Some(Value::Array(branches)) = state.get_mut("Branches") {
            branches.iter_mut().for_each(recover_from_a_hung_call);
        }
        if state["Type"] != "Task" || state.get("TimeoutSeconds").is_some() || state.get("Retry").is_some() {
            continue;
        }
        let function = match state["Resource"].as_str() {
            Some("arn:aws:states:::lambda:invoke") if state.get("Arguments").is_some() => {
                state["Arguments"]["FunctionName"].as_str()
            }
            Some("arn:aws:states:::lambda:invoke") => state["Parameters"]["FunctionName"].as_str(),
            other => other,
        };
        if function.is_some_and(|f| HARMLESS.contains(&f)) {
            state["TimeoutSeconds"] = json!(20);
            state["Retry"] = json!([{"ErrorEquals": ["States.Timeout"], "IntervalSeconds": 1, "MaxAttempts": 1}]);
        }
    }
}

fn import(c: &Case) -> sas_cli::asl::Imported {
    sas_cli::asl::import(&c.name, c.ours.as_ref().unwrap_or(&c.def)).unwrap_or_else(|refused| {
        panic!(
            "{} is meant to be within the importer's subset, and was refused: {}\n{:#}",
            c.name,
            refused.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            c.def
        )
    })
}

/// The policy of the tests' stacks, with budgets for a loaded machine: a run of many tasks at
/// once must not see a deadline pass that Step Functions would not (a definition's own
/// TimeoutSeconds aside).
fn relaxed() -> sas_core::config::Settings {
    let mut s = settings();
    s.policy.start_timeout_ms = 30_000;
    s.policy.queue_budget_ms = 60_000;
    s.policy.result_grace_ms = 5_000;
    s
}

#[test]
fn every_definition_imports_and_the_generator_covers_its_range() {
    let all = everything();
    let workflows: Vec<Value> = all.iter().flat_map(|(c, _)| import(c).workflows()).collect();
    WorkflowRegistry::from_json(&json!({"workflows": workflows}).to_string()).expect("the imported workflows load");
    assert!(hand_written().len() >= 12);
    // a JSONata machine is translated as its JSONPath twin is (what Step Functions runs)
    for (c, _) in all.iter().filter(|(c, _)| c.ours.as_ref().is_some_and(|o| o["QueryLanguage"] == "JSONata")) {
        let twin = sas_cli::asl::import(&c.name, &c.def).expect("the JSONPath twin translates");
        assert_eq!(import(c).workflows(), twin.workflows(), "{}", c.name);
    }
    assert_eq!(generate(7).def, generate(7).def, "a seed makes one definition");
    assert_ne!(generate(7).def, generate(8).def);
    if let Ok(seed) = std::env::var("ASL_DIFF_SEED") {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("{:#}", generate(seed.parse().expect("a seed")).def);
        }
    }
    // every kind of state the generator makes, made by the seeds
    let text: String = SEEDS.map(|seed| generate(seed).def.to_string()).collect();
    for made in [
        "\"Result\":{\"c\"",
        "\"lit\":",
        "\"Resource\":\"${AddFunctionArn}\"",
        "lambda:invoke",
        "${ShapeFunctionArn}",
        "\"Type\":\"Choice\"",
        "\"Type\":\"Fail\"",
        "\"Type\":\"Parallel\"",
        "\"Type\":\"Map\"",
        "\"Type\":\"Wait\"",
        "${FailFunctionArn}",
        "${FlakyFunctionArn}",
        "\"And\"",
        "\"Or\"",
        "\"Not\"",
    ] {
        assert!(text.contains(made), "no seed makes {made}");
    }
}

#[tokio::test]
async fn step_functions_and_the_imported_workflows_agree() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let started = Instant::now();
    let mut all = everything();
    if let Ok(only) = std::env::var("ASL_DIFF_ONLY") {
        all.retain(|(c, _)| only.split(',').any(|o| o == c.name));
    }
    let mut workflows = Vec::new();
    let mut agents = Map::new();
    let mut steps: Vec<BTreeSet<String>> = Vec::new();
    for (c, _) in &all {
        let mut imported = import(c);
        // One agents file for all: an agent is named after its function, so two imports that call
        // one function differently (a qualifier) name two agents alike; the second is renamed.
        for (name, spec) in std::mem::take(&mut imported.agents) {
            match agents.get(&name) {
                Some(old) if *old != spec => {
                    let renamed = format!("{name}.{}", c.name);
                    let all_steps = std::iter::once(&mut imported.workflow)
                        .chain(imported.children.iter_mut())
                        .flat_map(|w| w["steps"].as_array_mut().into_iter().flatten());
                    for step in all_steps {
                        if step["agent"] == json!(name) {
                            step["agent"] = json!(renamed);
                        }
                    }
                    agents.insert(renamed, spec);
                }
                _ => {
                    agents.insert(name, spec);
                }
            }
        }
        // the workflow's steps, and those of its loops' bodies (each counted once per iteration)
        let names = |w: &Value| -> Vec<String> {
            w["steps"].as_array().into_iter().flatten().filter_map(|s| s["name"].as_str().map(String::from)).collect()
        };
        let bodies: BTreeSet<&str> = imported.workflow["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["kind"] == "loop")
            .filter_map(|s| s["workflow"].as_str())
            .collect();
        let mut compared: BTreeSet<String> = names(&imported.workflow).into_iter().collect();
        for child in imported.children.iter().filter(|w| w["name"].as_str().is_some_and(|n| bodies.contains(n))) {
            compared.extend(names(child));
        }
        steps.push(compared);
        workflows.extend(imported.workflows());
    }
    let registry = WorkflowRegistry::from_json(&json!({"workflows": workflows}).to_string()).expect("workflows");
    let sdk = sas_core::aws::load_sdk_config().await;
    let (s, mut arns, resources) = tokio::join!(
        stack_with_settings("asl-diff", registry, relaxed()),
        deploy_functions(&sdk),
        aws_sdk_resources(&sdk)
    );
    // the functions' ARNs are deleted at the end; the table and the queue are kept
    let functions: Vec<String> = arns.values().cloned().collect();
    arns.extend(resources);
    let agents_file = sas_cli::asl::agents_file(&agents).to_string();
    let vars = |k: &str| arns.get(k).cloned();
    let rt = AgentRuntime::from_config_with(&agents_file, &vars, AwsConfigCell::with(s.sdk.clone())).expect("agents");
    let runner = s.runner_with(rt);
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
    let machines = futures::future::join_all(all.iter().map(|(c, _)| create_machine(&sfn, c, &arns, &suffix))).await;
    let deployed = started.elapsed();

    let runs: Vec<(usize, usize)> =
        all.iter().enumerate().flat_map(|(i, (c, _))| (0..c.inputs.len()).map(move |j| (i, j))).collect();
    let (all, machines, stack, sfn, suffix) = (&all, &machines, &s, &sfn, &suffix);
    let results: Vec<(usize, usize, Observed, Observed)> = futures::stream::iter(runs)
        .map(|(i, j)| async move {
            let (c, input) = (&all[i].0, &all[i].0.inputs[j]);
            let id = format!("{}-{j}-{suffix}", c.name);
            let (k1, k2) = (format!("sfn-{id}"), format!("ours-{id}"));
            let (a, b) = tokio::join!(
                on_step_functions(sfn, &machines[i], input, &k1),
                on_this_project(stack, &c.name, input, &k2, &id)
            );
            (i, j, a, b)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;

    let mut report = BTreeMap::new();
    let mut failures = Vec::new();
    let (mut agreed, mut documented, mut known) = (0, 0, 0);
    for (i, j, a, b) in &results {
        let (c, expect) = &all[*i];
        let verdict = compare(&c.def, &steps[*i], a, b);
        let line = match (expect, &verdict) {
            (Expect::Agree, Ok(())) => {
                agreed += 1;
                "agree".to_owned()
            }
            (Expect::Agree, Err(why)) => {
                failures.push(format!("{} input {j} ({}): {why}\n  the definition: {}", c.name, c.inputs[*j], c.def));
                format!("DIFFER: {why}")
            }
            (Expect::Documented(check), _) => match (check(a, b), &verdict) {
                (Ok(()), Err(_)) => {
                    documented += 1;
                    "differs as documented".to_owned()
                }
                (Ok(()) | Err(_), Ok(())) => {
                    failures.push(format!("{} input {j} agrees: the documented difference is gone", c.name));
                    "AGREES".to_owned()
                }
                (Err(why), Err(_)) => {
                    failures.push(format!("{} input {j}: not the documented difference: {why}", c.name));
                    format!("NOT AS DOCUMENTED: {why}")
                }
            },
            (Expect::Known(check, diagnosis), _) => match (check(a, b), &verdict) {
                (Ok(()), Err(_)) => {
                    known += 1;
                    format!("differs as known: {diagnosis}")
                }
                (Ok(()) | Err(_), Ok(())) => {
                    failures.push(format!(
                        "{} input {j} now agrees: move it from KNOWN_DIFFERENCES to the hand-written ones",
                        c.name
                    ));
                    "NOW AGREES".to_owned()
                }
                (Err(why), Err(_)) => {
                    failures.push(format!("{} input {j} differs otherwise than known: {why}", c.name));
                    format!("DIFFERS OTHERWISE: {why}")
                }
            },
        };
        let summary = |o: &Observed| match &o.end {
            End::Succeeded(v) => format!("SUCCEEDED {v}"),
            End::Failed { error, .. } => format!("FAILED {error}"),
            End::Other(x) => format!("OTHER {x}"),
        };
        let what = if *j == 0 { format!("{}: {}\n", c.name, c.what) } else { String::new() };
        report.insert(
            (*i, *j),
            format!("{what}  {:<18} #{j}  {line}\n      sfn:  {}\n      ours: {}", c.name, summary(a), summary(b)),
        );
    }
    let generated = all.iter().filter(|(c, _)| c.name.starts_with("gen-")).count();
    #[allow(clippy::print_stderr)]
    {
        for line in report.values() {
            eprintln!("{line}");
        }
        eprintln!(
            "[asl-diff] {} definitions ({} generated), {} runs: {agreed} agree, {documented} differ as documented, \
             {known} as known, {} failures; deployed in {:.1} s, all in {:.1} s",
            all.len(),
            generated,
            results.len(),
            failures.len(),
            deployed.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    }
    runner.shutdown().await;
    for m in machines {
        let _ = sfn.delete_state_machine().state_machine_arn(m).send().await;
    }
    let lambda = aws_sdk_lambda::Client::new(&sdk);
    for arn in &functions {
        let _ = lambda.delete_function().function_name(arn).send().await;
    }
    s.delete().await;
    // the flaky function's counts (LocalStack runs the functions on this host)
    for entry in std::fs::read_dir("/tmp").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("asl-calc-") && name.contains(suffix.as_str()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    assert!(failures.is_empty(), "{} of {} runs differ:\n{}", failures.len(), results.len(), failures.join("\n"));
}

/// The saga of the collection (`saga-pattern-sam`), booked with functions that keep a ledger, on
/// Step Functions and translated here: the trip booked, a failure after the payment (every
/// booking undone once, in reverse order, the same ledger on both), and a failure of the second
/// reservation (undone too on both: a function's error may have left its effect).
#[tokio::test]
async fn the_collection_s_saga_undoes_what_it_applied_once_in_reverse_order() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/cli/tests/data/asl-collection/saga-pattern-sam_statemachine_statemachine.asl.json");
    let mut def: Value = serde_json::from_str(&std::fs::read_to_string(file).expect("the saga sample")).expect("JSON");
    // The sample's tasks have no TimeoutSeconds (a call step then gets 60 s here). The functions
    // time out after 10 s: with 20 s, a lost or hung invoke is retried sooner, and the undoing of
    // a failed step, which waits until its attempt can no longer apply, waits 20 s, not 60. Its
    // retriers wait 2 s, ×2 each, for 6 retries: here, where a function's CustomError is retried
    // as Lambda's errors are (Step Functions goes to its catcher at once), a failing step took
    // 104 s of the 3-minute wait alone (with the 20 s before its undoing: 128 s), and CI's loaded
    // machine went past the wait (stop 53). With 1 s, ×1, the retries take seconds on both sides.
    for state in def["States"].as_object_mut().expect("States").values_mut() {
        if state["Type"] == "Task" {
            state["TimeoutSeconds"] = json!(20);
        }
        for retrier in state.get_mut("Retry").and_then(Value::as_array_mut).into_iter().flatten() {
            if retrier.get("IntervalSeconds").is_some() {
                retrier["IntervalSeconds"] = json!(1);
                retrier["BackoffRate"] = json!(1);
            }
        }
    }
    let imported = sas_cli::asl::import("saga", &def).expect("the saga translates");
    let registry = WorkflowRegistry::from_json(&json!({"workflows": imported.workflows()}).to_string()).expect("loads");
    let sdk = sas_core::aws::load_sdk_config().await;
    let ops = [
        ("reserveFlightFunction", "book", "reserveFlight"),
        ("reserveCarRentalFunction", "book", "reserveCarRental"),
        ("processPaymentFunction", "book", "processPayment"),
        ("confirmFlightFunction", "book", "confirmFlight"),
        ("confirmCarRentalFunction", "book", "confirmCarRental"),
        ("refundPaymentFunction", "book", "refundPayment"),
        ("cancelCarRentalFunction", "book", "cancelCarRental"),
        ("cancelFlightFunction", "book", "cancelFlight"),
    ];
    let (s, mut arns) = tokio::join!(stack_with_settings("asl-saga", registry, relaxed()), deploy(&sdk, &ops));
    let sns = aws_sdk_sns::Client::new(&sdk);
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
    let topic = sns
        .create_topic()
        .name(format!("asl-saga-{suffix}"))
        .send()
        .await
        .expect("CreateTopic")
        .topic_arn
        .expect("ARN");
    arns.insert("snsTopicArn".into(), topic.clone());
    let agents_file = sas_cli::asl::agents_file(&imported.agents).to_string();
    let vars = |k: &str| arns.get(k).cloned();
    let rt = AgentRuntime::from_config_with(&agents_file, &vars, AwsConfigCell::with(s.sdk.clone())).expect("agents");
    let runner = s.runner_with(rt);
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    let machine = sfn
        .create_state_machine()
        .name(format!("asl-saga-{suffix}"))
        .definition(substituted(&def, &arns))
        .role_arn("arn:aws:iam::000000000000:role/asl-diff")
        .send()
        .await
        .expect("CreateStateMachine")
        .state_machine_arn;
    let ledger = |key: &str| -> Vec<String> {
        std::fs::read_to_string(format!("/tmp/asl-ledger-{key}"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let booked = ["reserveFlight", "reserveCarRental", "processPayment", "confirmFlight", "confirmCarRental"];
    let undone_after_payment =
        ["reserveFlight", "reserveCarRental", "processPayment", "refundPayment", "cancelCarRental", "cancelFlight"];
    let cases = [
        ("", booked.to_vec(), booked.to_vec()),
        ("confirmFlight", undone_after_payment.to_vec(), undone_after_payment.to_vec()),
        // a function's error may have left its effect (it is retryable here), so the step that
        // failed is undone too, as the state machine's catcher does
        (
            "reserveCarRental",
            vec!["reserveFlight", "cancelCarRental", "cancelFlight"],
            vec!["reserveFlight", "cancelCarRental", "cancelFlight"],
        ),
    ];
    // the three cases run at once (each keeps its own ledgers); a task is waited for 3 minutes,
    // time enough for a lost or hung call to be found out and retried
    let run = |fail: &'static str| {
        let (sfn, machine, s, suffix) = (&sfn, &machine, &s, &suffix);
        async move {
            let (k1, k2) = (format!("saga-sfn-{fail}-{suffix}"), format!("saga-ours-{fail}-{suffix}"));
            let input = json!({"key": KEY, "fail": fail, "trip": "t-1"});
            let id = format!("saga-{fail}-{suffix}");
            let (a, b) = tokio::join!(
                saga_on_step_functions(sfn, machine, &input, &k1),
                on_this_project_within(s, "saga", &input, &k2, &id, Duration::from_mins(3))
            );
            (k2, id, a, b)
        }
    };
    let outcomes = futures::future::join_all(cases.iter().map(|(fail, ..)| run(fail))).await;
    for ((fail, sfn_ledger, our_ledger), (k2, id, a, b)) in cases.into_iter().zip(outcomes) {
        assert_eq!(ledger(&a.key), sfn_ledger, "Step Functions' ledger, failing {fail:?}: {a:?}");
        // A call is made at least once: an invoke that LocalStack left unanswered on a loaded machine
        // (the attempt passed its CompleteBy: `deadline_expired` in the task's history, seen in a
        // full run beside the differential test) is made again, and the ledger function, which is
        // not idempotent, writes the operation twice in a row. A real saga's functions apply once
        // per idempotency key; what is compared is the order of the effects and that none is
        // missing or comes back later (a compensation made twice in a row would go unseen here).
        let mut ours = ledger(&k2);
        ours.dedup();
        assert_eq!(ours, our_ledger, "this project's ledger, failing {fail:?}: {b:?}");
        match (fail, &a.end, &b.end) {
            ("", End::Succeeded(_), End::Succeeded(_)) => {}
            // the state machine ends in its Fail state ("Reservation Failed"); the task's reason
            // names the refusal that made it undo its steps
            (f, End::Failed { .. }, End::Failed { error: ours, .. }) if !f.is_empty() => {
                assert!(ours.contains(&format!("{f} refused")), "the task's reason names the refusal: {ours}");
            }
            _ => panic!("failing {fail:?}: Step Functions {a:?}, this project {b:?}"),
        }
        let task = s.task(&id).await.expect("the task");
        #[allow(clippy::print_stderr)]
        {
            eprintln!("[asl-saga] failing {fail:?}: {}", timeline(&task));
        }
        if !fail.is_empty() {
            assert_eq!(task.process_state, ProcessState::Compensated, "{task:?}");
        }
        for k in [a.key, k2] {
            let _ = std::fs::remove_file(format!("/tmp/asl-ledger-{k}"));
        }
    }
    runner.shutdown().await;
    let _ = sfn.delete_state_machine().state_machine_arn(machine).send().await;
    let _ = sns.delete_topic().topic_arn(topic).send().await;
    let lambda = aws_sdk_lambda::Client::new(&sdk);
    for (var, arn) in &arns {
        if var != "snsTopicArn" {
            let _ = lambda.delete_function().function_name(arn).send().await;
        }
    }
    s.delete().await;
}
