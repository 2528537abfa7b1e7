//! What the delivering kinds ([`super::sqs`], [`super::sns`], [`super::eventbridge`]) share: they
//! only hand a callback step's work over, as a message (or event) whose body is the request every
//! kind sends ([`super::handover::request`], the token and where to answer included); the remote
//! side answers later with the token. Delivery is the hand-off: once the service took the
//! message, the agent reports nothing and the step waits for the answer (or its timeout).
//!
//! With `"payload": "input"` they send the request's `input` alone (the step's `parameters`
//! filled; a string as it is), for a call step: a notification, sent and not waited for, whose
//! output says it was delivered (a callback step needs the request, which carries the token).

use futures::future::BoxFuture;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tracing::info;

use super::handover::{self, CallbackEndpoints, Payload};
use super::runtime::{Agent, AgentError, Call};
use crate::messages::AgentRequest;

/// Where a delivering kind hands a callback step's request over: a queue, a topic, a bus.
/// [`Delivering`] does what the kinds share (the body, refused for a call step; the size limit;
/// the log line and the agent's output); a destination only counts the body's size as its service
/// does and sends it.
pub trait Destination: std::fmt::Debug + Send + Sync + 'static {
    /// The kind's name in agents.json.
    const KIND: &'static str;
    /// What the body travels as, for the size refusal: "an SQS message".
    const WHAT: &'static str;
    /// The name of the id the service gives what it took (`message_id`, `event_id`).
    const ID: &'static str;
    /// The queue URL, topic ARN or bus, for logs.
    fn name(&self) -> &str;
    /// The body's size as the service counts it (with what [`Destination::send`] adds to it).
    fn size(&self, req: &AgentRequest, body: &str) -> usize;
    /// Hand `body` over: the id the service gave it, or the error classified (retry or not).
    fn send<'a>(&'a self, req: &'a AgentRequest, body: String) -> BoxFuture<'a, Result<String, AgentError>>;
}

/// The agent of a delivering kind: the skeleton around its [`Destination`].
#[derive(Debug)]
pub struct Delivering<D> {
    pub(super) to: D,
    callback: CallbackEndpoints,
    payload: Payload,
}

impl<D: Destination> Delivering<D> {
    pub fn to(to: D, callback: CallbackEndpoints) -> Self {
        Delivering { to, callback, payload: Payload::Request }
    }

    /// Sending `payload` (the request, or its input alone for a call step).
    #[must_use]
    pub fn sending(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
}

impl<D: Destination> Agent for Delivering<D> {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let req = call.request;
            let body = match self.payload {
                Payload::Request => body(&call, D::KIND, &self.callback)?,
                Payload::Input => input_body(&call, D::KIND)?,
            };
            check_size(req, D::WHAT, self.to.size(req, &body))?;
            let id = self.to.send(req, body).await?;
            if req.callback.is_some() {
                info!(task_id = %req.task_id, step = %req.step, kind = D::KIND, id = %id, to = self.to.name(), "callback step handed over");
            } else {
                info!(task_id = %req.task_id, step = %req.step, kind = D::KIND, id = %id, to = self.to.name(), "sent (a call step: nothing waits for an answer)");
            }
            Ok(json!({"delivered": true, D::ID: id}))
        })
    }
}

/// The most an SQS message, an SNS message or an EventBridge event entry may hold (256 KiB).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The longest FIFO deduplication id SQS and SNS take.
pub const MAX_DEDUP_ID_LEN: usize = 128;

/// The request's JSON, as the remote side reads it; refused (permanently) when the step is not a
/// callback step: these kinds can only hand work over, and nothing would ever answer.
///
/// Its `deadline` is the attempt's `CompleteBy` (when, without an answer or a heartbeat, the
/// attempt is lost), not the hand-off's own short deadline: a message may wait in its queue, or
/// an event in its target, longer than the hand-off takes, and the worker must not give up on
/// work it still has time for.
pub fn body(call: &Call<'_>, kind: &str, callback: &CallbackEndpoints) -> Result<String, AgentError> {
    let req = call.request;
    if req.callback.is_none() {
        return Err(AgentError::Permanent {
            message: format!(
                "step {} uses agent {} (kind \"{kind}\"), which only hands work over, but it is not a callback \
                 step: the answer comes later with the token, so the step needs kind \"callback\" (with \
                 timeout_ms) in its workflow",
                req.step, req.agent
            ),
        });
    }
    Ok(handover::request(req, req.complete_by, callback).to_string())
}

/// The request's input alone, for a call step (`"payload": "input"`): a string as it is, any
/// other value as JSON. Refused (permanently) on a callback step: nothing would carry the token.
pub fn input_body(call: &Call<'_>, kind: &str) -> Result<String, AgentError> {
    let req = call.request;
    if req.callback.is_some() {
        return Err(AgentError::Permanent {
            message: format!(
                "step {} is a callback step, and agent {} (kind \"{kind}\") sends its input alone (\"payload\": \"input\"), \
                 without the token the answer needs: drop \"payload\" from the agent, or make the step a call step",
                req.step, req.agent
            ),
        });
    }
    Ok(match &req.input {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// The message attributes a subscriber can route and filter on (never the token).
pub fn attributes(req: &AgentRequest) -> [(&'static str, &str); 2] {
    [("task_id", req.task_id.as_str()), ("step", req.step.as_str())]
}

/// The size of a message as SQS and SNS count it: its body and each attribute's name, data type
/// (`String`) and value.
pub fn message_size(body: &str, attributes: &[(&str, &str)]) -> usize {
    body.len() + attributes.iter().map(|(k, v)| k.len() + "String".len() + v.len()).sum::<usize>()
}

/// Refused (permanently: the same request is as large next time) when over [`MAX_MESSAGE_BYTES`].
pub fn check_size(req: &AgentRequest, what: &str, bytes: usize) -> Result<(), AgentError> {
    if bytes > MAX_MESSAGE_BYTES {
        return Err(AgentError::Permanent {
            message: format!(
                "step {} of task {}: the request is {bytes} bytes as {what}, over the limit of {MAX_MESSAGE_BYTES} \
                 bytes (256 KiB); pass a reference to the data in the step's input instead",
                req.step, req.task_id
            ),
        });
    }
    Ok(())
}

/// The FIFO deduplication id of an attempt's request: its idempotency key and attempt token, so a
/// call retried within one attempt is delivered once (inside the five-minute deduplication
/// window) and a new attempt is delivered again. Over 128 characters, or with a character SQS
/// does not take, its SHA-256 in hex.
pub fn dedup_id(req: &AgentRequest) -> String {
    let id = format!("{}:{}", req.idempotency_key.as_str(), req.attempt.as_str());
    if id.len() <= MAX_DEDUP_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic()) {
        return id;
    }
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// The FIFO message group: the task (its requests stay in order, tasks do not hold each other up).
pub fn group_id(req: &AgentRequest) -> &str {
    req.task_id.as_str()
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::{AttemptToken, Millis, TaskId};

    /// A callback step's request (or a call step's, `callback: false`).
    pub fn req(task: &str, attempt: &str, callback: bool) -> AgentRequest {
        let task_id = TaskId::try_from(task).unwrap();
        let attempt = AttemptToken::from(attempt);
        let r = AgentRequest::first_attempt(
            task_id,
            "ship",
            "warehouse",
            json!({"order": "o-1"}),
            Millis::now().plus_ms(5_000),
        )
        .with_attempt(attempt);
        if callback {
            r.with_callback(None)
        } else {
            r
        }
    }

    const A1: &str = "0123456789abcdef0123456789abcdef";
    const A2: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn the_dedup_id_is_stable_within_an_attempt_and_new_for_the_next() {
        let first = req("order-1", A1, true);
        assert_eq!(dedup_id(&first), format!("order-1:ship:{A1}"));
        assert_eq!(dedup_id(&first), dedup_id(&req("order-1", A1, true)), "a retried call of the same attempt");
        assert_ne!(dedup_id(&first), dedup_id(&req("order-1", A2, true)), "a new attempt is delivered again");
        assert_ne!(dedup_id(&first), dedup_id(&req("order-2", A1, true)));
        assert_eq!(group_id(&first), "order-1");
    }

    #[test]
    fn a_long_dedup_id_is_hashed_to_fit() {
        let long = "t".repeat(120);
        let (a, b) = (req(&long, A1, true), req(&long, A2, true));
        let (ia, ib) = (dedup_id(&a), dedup_id(&b));
        assert_eq!(ia.len(), 64, "{ia}");
        assert!(ia.bytes().all(|c| c.is_ascii_hexdigit()), "{ia}");
        assert_eq!(ia, dedup_id(&req(&long, A1, true)));
        assert_ne!(ia, ib);
    }

    #[test]
    fn the_input_alone_goes_for_a_call_step_and_is_refused_for_a_callback_step() {
        let mut r = req("order-1", A1, false);
        let call = Call { request: &r, call_no: 1, deadline: r.complete_by };
        assert_eq!(input_body(&call, "sns").unwrap(), r.input.to_string(), "the input alone, as JSON");
        r.input = json!("Your order shipped");
        let call = Call { request: &r, call_no: 1, deadline: r.complete_by };
        assert_eq!(input_body(&call, "sns").unwrap(), "Your order shipped", "a string as it is");
        let cb = req("order-1", A1, true);
        let call = Call { request: &cb, call_no: 1, deadline: cb.complete_by };
        assert!(
            matches!(input_body(&call, "sns"), Err(AgentError::Permanent { message }) if message.contains("without the token"))
        );
    }

    #[test]
    fn a_call_step_is_refused_for_good() {
        let r = req("order-1", A1, false);
        let call = Call { request: &r, call_no: 1, deadline: r.complete_by };
        let e = body(&call, "sqs", &CallbackEndpoints::default()).unwrap_err();
        assert!(
            matches!(&e, AgentError::Permanent { message } if message.contains("not a callback step") && message.contains("kind \"callback\"") && message.contains("\"sqs\"")),
            "{e:?}"
        );
    }

    #[test]
    fn the_body_is_the_request_contract_with_the_token() {
        let r = req("order-1", A1, true);
        // the hand-off's own deadline (seconds) is not the worker's: it has until CompleteBy
        let call = Call { request: &r, call_no: 1, deadline: Millis(42) };
        let ends = CallbackEndpoints { queue_url: Some("http://q/000000000000/cb".into()), url: None };
        let v: serde_json::Value = serde_json::from_str(&body(&call, "sqs", &ends).unwrap()).unwrap();
        assert_eq!(v, handover::request(&r, r.complete_by, &ends));
        assert_eq!(v["deadline"], r.complete_by.0);
        assert_eq!(v["callback"]["token"], r.callback.as_ref().unwrap().token.expose());
        assert_eq!(v["idempotency_key"], "order-1:ship");
    }

    #[test]
    fn a_message_over_256_kib_is_refused_naming_its_size() {
        let r = req("order-1", A1, true);
        assert!(check_size(&r, "an SQS message", MAX_MESSAGE_BYTES).is_ok());
        let e = check_size(&r, "an SQS message", MAX_MESSAGE_BYTES + 1).unwrap_err();
        assert!(
            matches!(&e, AgentError::Permanent { message } if message.contains("262145 bytes") && message.contains("262144")),
            "{e:?}"
        );
        assert_eq!(message_size("abc", &attributes(&r)), 3 + ("task_id".len() + 6 + 7) + ("step".len() + 6 + 4));
    }
}
