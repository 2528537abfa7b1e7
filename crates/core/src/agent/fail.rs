//! The `fail` agent: a step that ends the task as failed, as a `Fail` state of the States Language
//! does. `{"kind": "fail"}`; what it is sent (the step's `parameters` filled) may name the
//! `error` and the `cause`, and its answer is always a permanent failure saying them, so the task
//! undoes what it applied and ends `Compensated` with that reason (or, with `on_failure: error`,
//! parks in `Error`). No remote call and no AWS permission.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use super::kind::{AgentConfigError, AgentKind, BuildContext};
use super::runtime::{Agent, AgentError, Call};

/// `{"kind": "fail"}`: fails the step for good with the `error` and `cause` its parameters send
/// (a `Fail` state); no settings.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailKind {}

impl AgentKind for FailKind {
    const KIND: &'static str = "fail";

    fn build(self, _name: &str, _cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        Ok(Arc::new(FailAgent))
    }
}

/// Fails every request for good with the `error` and `cause` it was sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailAgent;

/// What a `fail` step says: `error: cause`, either alone, or that the step failed.
pub fn message(input: &Value) -> String {
    let text = |k: &str| match input.get(k) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    match (text("error"), text("cause")) {
        (Some(e), Some(c)) => format!("{e}: {c}"),
        (Some(one), None) | (None, Some(one)) => one,
        (None, None) => "failed (a fail step)".to_owned(),
    }
}

impl Agent for FailAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move { Err(AgentError::Permanent { message: message(&call.request.input) }) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_fail_step_says_its_error_and_cause() {
        assert_eq!(message(&json!({"error": "Declined", "cause": "card expired"})), "Declined: card expired");
        assert_eq!(message(&json!({"error": "Declined"})), "Declined");
        assert_eq!(message(&json!({"cause": {"code": 7}})), "{\"code\":7}");
        assert_eq!(message(&json!({"input": {}, "outputs": {}})), "failed (a fail step)");
    }
}
