//! The simulated agent: no remote service, behaviour set by the task's input.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};

use super::runtime::{Agent, AgentError, Call};

/// A built-in agent for tests and the demo: it performs no effect and behaves as the task's input
/// tells it, under `input.sim.<step name>` (a map element: `input.item.sim.<step name>`, its item's;
/// a step with `parameters`: `sim.<step name>` of what they send):
/// `{"delay_ms": 50, "hang_attempts": 1, "fail_calls": 2, "fail_attempts": 1, "permanent": "declined"}`
/// - `hang_attempts`: attempts 1..=n never answer (as a crashed or hung service);
/// - `busy_calls`: in every attempt, calls 1..=n find the key in use by another call;
/// - `fail_calls`: in every attempt, calls 1..=n fail transiently;
/// - `fail_attempts`: attempts 1..=n fail transiently on every call;
/// - `permanent`: fail permanently with this message.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimAgent;

/// `{"kind": "sim"}`: no settings.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimKind {}

impl super::kind::AgentKind for SimKind {
    const KIND: &'static str = "sim";

    fn build(
        self,
        _name: &str,
        _cx: &super::kind::BuildContext,
    ) -> Result<std::sync::Arc<dyn Agent>, super::kind::AgentConfigError> {
        Ok(std::sync::Arc::new(SimAgent))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimSpec {
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    hang_attempts: u32,
    #[serde(default)]
    busy_calls: u32,
    #[serde(default)]
    fail_calls: u32,
    #[serde(default)]
    fail_attempts: u32,
    #[serde(default)]
    permanent: Option<String>,
}

impl Agent for SimAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let req = call.request;
            // a map element's faults ride on its item; a step with parameters passes them on as
            // its own `sim`
            let spec = req.input.pointer(&format!("/input/sim/{}", req.step));
            let spec = spec.or_else(|| req.input.pointer(&format!("/input/item/sim/{}", req.step)));
            let spec = spec.or_else(|| req.input.pointer(&format!("/sim/{}", req.step)));
            let spec = match spec {
                None => SimSpec::default(),
                Some(v) => SimSpec::deserialize(v).map_err(|e| AgentError::Permanent {
                    message: format!("bad sim spec for step {}: {e}", req.step),
                })?,
            };
            if spec.delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(spec.delay_ms)).await;
            }
            if req.attempt_no <= spec.hang_attempts {
                futures::future::pending::<()>().await;
            }
            if let Some(message) = spec.permanent {
                return Err(AgentError::Permanent { message });
            }
            if call.call_no <= spec.busy_calls {
                return Err(AgentError::KeyInUse {
                    message: format!("simulated 409 key in use (attempt {}, call {})", req.attempt_no, call.call_no),
                    retry_after: None,
                });
            }
            if req.attempt_no <= spec.fail_attempts || call.call_no <= spec.fail_calls {
                return Err(AgentError::Transient {
                    message: format!("simulated transient failure (attempt {}, call {})", req.attempt_no, call.call_no),
                    retry_after: None,
                });
            }
            Ok(json!({
                "agent": "sim",
                "step": req.step,
                "idempotency_key": req.idempotency_key,
                "attempt_no": req.attempt_no,
                "calls": call.call_no,
            }))
        })
    }
}
