//! The Callback function's URL (`AuthType: AWS_IAM`: Lambda checks the caller's SigV4 signature
//! and its `lambda:InvokeFunctionUrl` grant before the function runs). One request is one answer:
//! `POST /` with a `CallbackMessage` as its JSON body (at most [`MAX_BODY_BYTES`]; Lambda may hand
//! it over base64-encoded). The response is the `CallbackReply` with a status code that says what
//! the caller should do:
//!
//! | status | body | the caller |
//! |---|---|---|
//! | 200 | reply `applied`, `duplicate`, `alive` | is done (a heartbeat's reply says until when) |
//! | 409 | reply `stale`, `late`, `cancelled` | stops this attempt; retrying changes nothing |
//! | 404 | reply `unknown` | stops: no task has this token |
//! | 400 | error `malformed` | fixes the request; retrying changes nothing |
//! | 405, 404 | error `method_not_allowed`, `not_found` | POSTs to `/` |
//! | 413 | error `too_large` | sends a smaller body |
//! | 422 | error `unstorable` | stops: the task cannot be stored with this answer (alerted in the log) |
//! | 503 | error `unavailable` | retries later (the store or a queue failed; nothing was half-done) |
//!
//! Errors have the body `{"v":1,"error":"<kind>","reason":"…"}`.

use aws_lambda_events::event::lambda_function_urls::{LambdaFunctionUrlRequest, LambdaFunctionUrlResponse};
use base64::Engine as _;
use sas_core::deps::{Deps, HandlerError};
use sas_protocol::ids::clip;
use sas_protocol::messages::{CallbackReply, CallbackResult, SQS_MAX_MESSAGE_BYTES, VERSION};
use serde_json::json;
use tracing::{error, info, warn};

/// The largest accepted body: what fits the callback queue too, so both ways take the same answers.
pub const MAX_BODY_BYTES: usize = SQS_MAX_MESSAGE_BYTES;

/// The status code of a reply.
pub fn status_of(result: CallbackResult) -> u16 {
    match result {
        CallbackResult::Applied | CallbackResult::Duplicate | CallbackResult::Alive => 200,
        CallbackResult::Stale | CallbackResult::Late | CallbackResult::Cancelled => 409,
        CallbackResult::Unknown => 404,
    }
}

/// The status code and error kind of a failed answer.
pub fn status_of_error(e: &HandlerError) -> (u16, &'static str) {
    match e {
        HandlerError::Malformed(_) => (400, "malformed"),
        HandlerError::Unstorable(_) => (422, "unstorable"),
        HandlerError::Store(_) | HandlerError::Bus(_) | HandlerError::Contended(_) | HandlerError::WithRun(_) => {
            (503, "unavailable")
        }
    }
}

fn response(status: u16, body: &serde_json::Value) -> LambdaFunctionUrlResponse {
    let mut r = LambdaFunctionUrlResponse::default();
    r.status_code = i64::from(status);
    r.headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r.body = Some(body.to_string());
    r
}

fn refuse(status: u16, kind: &str, reason: &str) -> LambdaFunctionUrlResponse {
    let mut r = response(status, &json!({"v": VERSION, "error": kind, "reason": reason}));
    if status == 405 {
        r.headers.insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
    }
    r
}

/// Why a request is refused before it is answered: status, error kind, reason.
type Refusal = (u16, &'static str, String);

/// The request's body, decoded, within the size limit.
fn body(req: &LambdaFunctionUrlRequest) -> Result<String, Refusal> {
    let raw = req.body.as_deref().unwrap_or_default();
    let bytes = if req.is_base64_encoded {
        // Refuse an oversized body before decoding it (4 base64 characters carry 3 bytes).
        if raw.len() / 4 * 3 > MAX_BODY_BYTES + 3 {
            return Err(too_large(raw.len() / 4 * 3));
        }
        base64::engine::general_purpose::STANDARD
            .decode(raw.trim())
            .map_err(|e| (400, "malformed", format!("the body is not valid base64: {e}")))?
    } else {
        raw.as_bytes().to_vec()
    };
    if bytes.len() > MAX_BODY_BYTES {
        return Err(too_large(bytes.len()));
    }
    if bytes.is_empty() {
        return Err((400, "malformed", "the body is empty: POST a callback message (JSON)".into()));
    }
    String::from_utf8(bytes).map_err(|_| (400, "malformed", "the body is not UTF-8".into()))
}

fn too_large(n: usize) -> Refusal {
    (413, "too_large", format!("the body has {n} bytes; at most {MAX_BODY_BYTES} are accepted"))
}

/// Answer one request to the function URL.
pub async fn handle(deps: &Deps, req: &LambdaFunctionUrlRequest) -> LambdaFunctionUrlResponse {
    let method = req.request_context.http.method.as_deref().unwrap_or_default();
    if !method.eq_ignore_ascii_case("POST") {
        return refuse(
            405,
            "method_not_allowed",
            &format!("{} is not accepted: POST a callback message", clip(method, 16)),
        );
    }
    let path = req.raw_path.as_deref().unwrap_or("/");
    if !(path.is_empty() || path == "/") {
        return refuse(404, "not_found", "POST to the URL's root path /");
    }
    let text = match body(req) {
        Ok(t) => t,
        Err((status, kind, reason)) => {
            warn!(status, %reason, "callback request refused");
            return refuse(status, kind, &reason);
        }
    };
    let answered = match sas_core::callback::parse(&text) {
        Ok(msg) => sas_core::callback::answer(deps, &msg, None).await.map(|reply| (msg, reply)),
        Err(e) => Err(e),
    };
    match answered {
        Ok((msg, reply)) => {
            let status = status_of(reply.result);
            info!(
                status,
                result = ?reply.result,
                answer = msg.answer.name(),
                task_id = %msg.token.task_id(),
                unit = msg.token.unit(),
                state = ?reply.state,
                reason = %reply.reason,
                "callback answered over HTTPS"
            );
            response(status, &reply_json(&reply))
        }
        Err(e) => {
            let (status, kind) = status_of_error(&e);
            if status >= 500 {
                error!(status, error = %e, "callback request failed; the caller should retry");
            } else {
                warn!(status, error = %e, "callback request refused");
            }
            refuse(status, kind, clip(&e.to_string(), 1024))
        }
    }
}

fn reply_json(reply: &CallbackReply) -> serde_json::Value {
    serde_json::to_value(reply).expect("callback replies serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_core::store::StoreError;

    #[test]
    fn every_result_and_error_has_the_status_the_contract_names() {
        use CallbackResult::{Alive, Applied, Cancelled, Duplicate, Late, Stale, Unknown};
        let got: Vec<u16> = [Applied, Duplicate, Alive, Stale, Late, Cancelled, Unknown].map(status_of).to_vec();
        assert_eq!(got, vec![200, 200, 200, 409, 409, 409, 404]);
        let backend = || StoreError::Backend { op: "PutItem", message: "throttled".into(), source: None };
        assert_eq!(status_of_error(&HandlerError::Malformed("x".into())), (400, "malformed"));
        assert_eq!(status_of_error(&HandlerError::Store(backend())), (503, "unavailable"));
        assert_eq!(status_of_error(&HandlerError::Contended(5)), (503, "unavailable"));
        assert_eq!(status_of_error(&HandlerError::Unstorable(backend())), (422, "unstorable"));
    }
}
