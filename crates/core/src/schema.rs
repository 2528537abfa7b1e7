//! JSON Schemas of the two configuration files, generated from the types the functions read them
//! with (`sasctl schema workflows|agents`; the repository's `schemas/`, checked by a test to be
//! the generated ones). An editor that knows JSON Schema completes and checks a file that names
//! its schema with a `$schema` key. The functions check more than a schema can say (names,
//! references between steps, limits): `sasctl validate` is the full check.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Value};

use crate::agent::config::{AgentFile, AgentSpec};
use crate::workflow::{StepDefaults, WorkflowFile};

/// The schema of a workflows file (`config/workflows.json`).
pub fn workflows() -> Value {
    let (mut v, defaults) = file_schema::<WorkflowFile, StepDefaults>(
        "sas workflows file",
        "The workflows a stack runs: config/workflows.json.",
    );
    // `defaults` is read before the workflow itself (it fills the steps), so it is no field of
    // the workflow's type: the schema names it here.
    if let Some(props) = v.pointer_mut("/$defs/WorkflowDef/properties").and_then(Value::as_object_mut) {
        let mut d = defaults;
        if let Some(o) = d.as_object_mut() {
            o.insert(
                "description".into(),
                json!("Values the workflow's steps take for the fields they leave out (call and callback steps; compensation steps take `compensation`'s first)."),
            );
        }
        props.insert("defaults".into(), d);
    }
    v
}

/// The schema of an agents file (`config/agents.json`).
pub fn agents() -> Value {
    let (mut v, _) = file_schema::<AgentFile, AgentSpec>(
        "sas agents file",
        "The agents the stack's steps name: config/agents.json.",
    );
    // every kind may say how many of its calls run at once; it is read apart from the kind's fields
    let max = json!({
        "description": "How many calls of this agent may be in flight at once, across all tasks.",
        "type": "integer", "minimum": 1, "maximum": crate::limit::MAX_IN_FLIGHT
    });
    // and how it retries within an attempt, instead of the file's retry
    let retry = json!({
        "description": "How this agent retries within an attempt (instead of the file's retry).",
        "$ref": "#/$defs/CallRetry"
    });
    // and how fast its calls may start
    let rate = json!({
        "description": "How fast this agent's calls may start, across all tasks: exactly one of per_second and per_minute, and at most burst at once (default 1).",
        "type": "object",
        "properties": {
            "per_second": {"type": "integer", "minimum": 1, "maximum": crate::limit::Rate::MAX_PER_SECOND},
            "per_minute": {"type": "integer", "minimum": 1},
            "burst": {"type": "integer", "minimum": 1}
        },
        "additionalProperties": false
    });
    for variant in v.pointer_mut("/$defs/AgentSpec/oneOf").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(props) = variant.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("rate".into(), rate.clone());
            props.insert("max_in_flight".into(), max.clone());
            props.insert("retry".into(), retry.clone());
        }
    }
    v
}

/// The schema of a file of type `F`, titled, with `P` among its definitions; and the schema
/// that names `P` (a reference into them).
fn file_schema<F: JsonSchema, P: JsonSchema>(title: &str, description: &str) -> (Value, Value) {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let part = generator.subschema_for::<P>();
    let mut root = generator.into_root_schema_for::<F>();
    root.insert("title".into(), title.into());
    root.insert("description".into(), description.into());
    (root.to_value(), part.to_value())
}
