//! What an agent hands to the remote side of a callback step besides the work: the token, the
//! heartbeat it must keep, and where it answers.

use serde_json::{json, Value};

use crate::ids::Millis;
use crate::messages::{AgentRequest, CallbackRef};

/// What every agent kind sends to the remote side (an HTTP body, a Lambda payload, a queue
/// message, an event's detail): the work and how to apply it once.
/// `{"task_id", "step", "attempt_no", "idempotency_key", "deadline", "input"}`, and for a callback
/// step `"callback": {"token", "heartbeat_ms", "queue_url", "url"}` (then delivery only means the
/// work was accepted). `deadline` (epoch ms) is the attempt's own: nothing may be applied after it;
/// for a callback step it is the attempt's `CompleteBy`, whatever `deadline` is given (the
/// hand-off's own is short, and the remote side has until `CompleteBy` to answer or heartbeat).
/// What an agent that can send either sends: the whole request (the default) or its `input` alone.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// The request every kind sends: task, step, idempotency key, deadline, `input` (and the
    /// callback's token).
    #[default]
    Request,
    /// The request's `input` alone (the step's `parameters` filled), as Step Functions sends a
    /// payload or a message.
    Input,
}

pub fn request(req: &AgentRequest, deadline: Millis, callback: &CallbackEndpoints) -> Value {
    let deadline = if req.callback.is_some() { req.complete_by } else { deadline };
    let mut body = json!({
        "task_id": req.task_id,
        "step": req.step,
        "attempt_no": req.attempt_no,
        "idempotency_key": req.idempotency_key,
        "deadline": deadline,
        "input": req.input,
    });
    if let Some(cb) = &req.callback {
        body["callback"] = callback.handover(cb);
    }
    body
}

/// Where the remote side of a callback step answers, as the agents tell it (the top-level
/// `"callback"` of the configuration, variables expanded; one whose variable is not set is left
/// out: a worker then answers the way it knows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallbackEndpoints {
    /// The callback queue (workers inside AWS send a `CallbackMessage` there).
    pub queue_url: Option<String>,
    /// The HTTPS endpoint (IAM auth; POST a `CallbackMessage`).
    pub url: Option<String>,
}

impl CallbackEndpoints {
    /// What an agent hands over with the work of a callback step:
    /// `{"token": "...", "heartbeat_ms": N, "queue_url": "...", "url": "..."}` (absent parts left out).
    pub fn handover(&self, cb: &CallbackRef) -> Value {
        let mut v = json!({"token": cb.token.expose()});
        if let Some(h) = cb.heartbeat_ms {
            v["heartbeat_ms"] = json!(h);
        }
        if let Some(q) = &self.queue_url {
            v["queue_url"] = json!(q);
        }
        if let Some(u) = &self.url {
            v["url"] = json!(u);
        }
        v
    }
}
