//! The `lambda` agent: invokes one AWS Lambda function named in configuration (never in a
//! submission) with the agent request ([`super::handover::request`]: task, step, attempt,
//! idempotency key, deadline, input).
//!
//! - A call step invokes synchronously (`RequestResponse`); the function's JSON answer becomes the
//!   step's output (over the size limit: a success whose output says it was truncated).
//! - A callback step invokes asynchronously (`Event`) with the token in the payload: Lambda's 202
//!   is the hand-off, and the function (or what it starts) answers later with the token.
//! - Every invoke is bounded by the attempt's deadline (the runtime drops a call still running
//!   then); the SDK's own retries are off, so the runtime's backoff and call budget apply.
//!
//! Classification (what the runtime should do):
//! - a function error whose `errorType`'s last segment (after `.`, `::` or `$`) starts with
//!   `Permanent` (`PermanentError`, `my_crate::PermanentFailure`, `Permanent`) fails for good;
//!   this is how a function says "retrying cannot help" (declined, invalid input);
//! - any other function error (an exception, a crash, the function's own timeout) is transient:
//!   retried with backoff as an HTTP 5xx is;
//! - throttling (`TooManyRequestsException`, honouring its retry-after), Lambda's 5xx, a function
//!   not ready or being updated, network errors: transient;
//! - a missing function, access denied, an invalid or too large request, KMS errors: permanent
//!   (configuration or IAM is wrong; the message names the function).

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_lambda::error::ProvideErrorMetadata;
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::info;

use super::handover::CallbackEndpoints;
use super::kind::AgentConfigError;
use super::kind::{AgentKind, BuildContext, Grant, LazyClient};
use super::runtime::{Agent, AgentError, Call};

/// The largest payload of a synchronous invoke (Lambda's limit: 6 MB).
pub const MAX_SYNC_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;
/// The largest payload of an asynchronous invoke (Lambda's historical limit, 256 KiB, kept so the
/// same configuration works in every Region and on LocalStack).
pub const MAX_ASYNC_PAYLOAD_BYTES: usize = 256 * 1024;

/// `{"kind": "lambda", "function": "name | ARN", "qualifier": "alias or version"}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaKind {
    /// The function's name, or its ARN (another account's function needs its ARN and its
    /// resource policy granting `lambda:InvokeFunction` to the Agent function's role).
    pub function: String,
    /// An alias or version (default: `$LATEST`, or what the ARN names).
    #[serde(default)]
    pub qualifier: Option<String>,
    /// What a call step's function receives: `request` (the default: the request every kind
    /// sends, with the task, the step, the idempotency key and the deadline beside the `input`) or
    /// `input` (only the request's `input`, the step's `parameters` filled, as a function written
    /// for Step Functions receives its payload). A callback step's function always receives the
    /// request, which carries the token.
    #[serde(default)]
    pub payload: Payload,
}

pub use super::handover::Payload;

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl LambdaKind {
    fn check(&self) -> Result<(), String> {
        let f = self.function.as_str();
        if f.starts_with("arn:") {
            let parts: Vec<&str> = f.split(':').collect();
            if parts.len() < 7 || parts[2] != "lambda" || parts[5] != "function" || !valid_name(parts[6]) {
                return Err(format!(
                    "{f:?} is not a Lambda function ARN (arn:PARTITION:lambda:REGION:ACCOUNT:function:NAME)"
                ));
            }
        } else if !valid_name(f) {
            return Err(format!("{f:?} is not a function name (1-64 letters, digits, - and _) or a function ARN"));
        }
        if let Some(q) = &self.qualifier {
            if q.is_empty() || q.len() > 128 || !q.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_$".contains(&b)) {
                return Err(format!("qualifier {q:?} is not an alias or a version"));
            }
        }
        Ok(())
    }
}

impl AgentKind for LambdaKind {
    const KIND: &'static str = "lambda";

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        self.check().map_err(|message| AgentConfigError::Invalid { agent: name.to_owned(), message })?;
        Ok(Arc::new(LambdaAgent {
            function: self.function,
            qualifier: self.qualifier,
            payload: self.payload,
            max_response_bytes: cx.max_response_bytes,
            callback: cx.callback.clone(),
            client: LazyClient::new(cx.aws.clone(), client),
        }))
    }

    /// `lambda:InvokeFunction` on the function (its ARN with the qualifier when one is set, as IAM
    /// matches it; a bare name when the configuration gives only a name).
    fn grants(&self) -> Vec<Grant> {
        let resource = match &self.qualifier {
            Some(q) => format!("{}:{q}", self.function),
            None => self.function.clone(),
        };
        vec![Grant::new("lambda:InvokeFunction", resource, "AgentFunctionArns")]
    }
}

pub struct LambdaAgent {
    function: String,
    payload: Payload,
    qualifier: Option<String>,
    max_response_bytes: usize,
    callback: CallbackEndpoints,
    client: LazyClient<aws_sdk_lambda::Client>,
}

impl std::fmt::Debug for LambdaAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaAgent")
            .field("function", &self.function)
            .field("qualifier", &self.qualifier)
            .field("payload", &self.payload)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("callback", &self.callback)
            .finish_non_exhaustive()
    }
}

impl LambdaAgent {
    /// With a client of the caller's (tests, tools).
    pub fn with_client(function: impl Into<String>, client: aws_sdk_lambda::Client) -> Self {
        Self::sending(function, Payload::Request, client)
    }

    /// With a client of the caller's, sending `payload`.
    pub fn sending(function: impl Into<String>, payload: Payload, client: aws_sdk_lambda::Client) -> Self {
        LambdaAgent {
            function: function.into(),
            payload,
            qualifier: None,
            max_response_bytes: super::http::DEFAULT_MAX_RESPONSE_BYTES,
            callback: CallbackEndpoints::default(),
            client: LazyClient::given(client, self::client),
        }
    }
}

/// A Lambda client for agents: no SDK retries (the runtime retries with its own budget) and no
/// operation timeout of its own (a synchronous invoke runs up to the function's timeout; the
/// runtime bounds it by the attempt's deadline); calls recorded as every role's when asked.
pub fn client(sdk: &aws_config::SdkConfig) -> aws_sdk_lambda::Client {
    let timeouts = aws_config::timeout::TimeoutConfig::builder().connect_timeout(Duration::from_secs(5)).build();
    let mut b = aws_sdk_lambda::config::Builder::from(sdk)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .timeout_config(timeouts);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_lambda::Client::from_conf(b.build())
}

/// The last segment of an error type says "permanent": `PermanentError`, `x.PermanentFailure`,
/// `my_crate::Permanent`, `Outer$PermanentError`.
pub fn is_permanent_type(error_type: &str) -> bool {
    error_type.rsplit(['.', ':', '$']).next().is_some_and(|last| last.starts_with("Permanent"))
}

/// A function error (the invoke succeeded, the function did not) as the runtime should treat it.
pub fn function_error(function: &str, kind: &str, payload: &[u8]) -> AgentError {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Doc {
        #[serde(default)]
        error_type: String,
        #[serde(default)]
        error_message: String,
    }
    let doc: Doc = serde_json::from_slice(payload).unwrap_or_default();
    let what = if doc.error_type.is_empty() { kind.to_owned() } else { doc.error_type.clone() };
    let detail = if doc.error_message.is_empty() {
        crate::ids::clip(String::from_utf8_lossy(payload).trim(), 300).to_owned()
    } else {
        crate::ids::clip(&doc.error_message, 300).to_owned()
    };
    let message = format!("function {function} failed ({what}): {detail}");
    if is_permanent_type(&doc.error_type) {
        AgentError::Permanent { message }
    } else {
        AgentError::Transient { message, retry_after: None }
    }
}

/// Lambda's own ways of refusing an invoke for good (beyond the codes every service shares,
/// [`super::aws_error::is_refusal_code`]): retrying cannot help until configuration or IAM changes.
fn is_lambda_refusal(code: &str) -> bool {
    matches!(
        code,
        "InvalidRequestContentException"
            | "RequestTooLargeException"
            | "UnsupportedMediaTypeException"
            | "InvalidRuntimeException"
            | "InvalidZipFileException"
            | "InvalidSecurityGroupIDException"
            | "InvalidSubnetIDException"
            | "RecursiveInvocationException"
            | "KMSAccessDeniedException"
            | "KMSDisabledException"
            | "KMSInvalidStateException"
            | "KMSNotFoundException"
    )
}

/// An invoke that did not reach the function, as the runtime should treat it: refusals (and any
/// other 4xx but 408 and 429) are permanent; throttling, 5xx, a function not ready or being
/// updated, and every error without an answer (connection, timeout) are transient.
pub fn invoke_error(
    function: &str,
    code: Option<&str>,
    status: Option<u16>,
    message: &str,
    retry_after: Option<Duration>,
) -> AgentError {
    // named as Step Functions names Lambda's errors (Lambda.TooManyRequestsException), first
    let message = match code {
        Some(c) => format!("Lambda.{c}: invoking {function}: {message}"),
        None => format!("invoking {function}: {message}"),
    };
    let permanent = match code {
        // a function being created or updated is ready soon
        Some("ResourceConflictException" | "ResourceNotReadyException") => false,
        Some(c) if is_lambda_refusal(c) => true,
        _ => super::aws_error::is_permanent(code, status),
    };
    if permanent {
        AgentError::Permanent { message }
    } else {
        AgentError::Transient { message, retry_after }
    }
}

impl Agent for LambdaAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let req = call.request;
            let asynchronous = req.callback.is_some();
            let sent = if asynchronous || self.payload == Payload::Request {
                super::handover::request(req, call.deadline, &self.callback)
            } else {
                req.input.clone()
            };
            let payload = serde_json::to_vec(&sent)
                .map_err(|e| AgentError::Permanent { message: format!("request not serialisable: {e}") })?;
            let limit = if asynchronous { MAX_ASYNC_PAYLOAD_BYTES } else { MAX_SYNC_PAYLOAD_BYTES };
            if payload.len() > limit {
                return Err(AgentError::Permanent {
                    message: format!(
                        "the request to {} is {} bytes, over Lambda's {} limit of {limit}",
                        self.function,
                        payload.len(),
                        if asynchronous { "asynchronous" } else { "synchronous" }
                    ),
                });
            }
            let kind = if asynchronous { InvocationType::Event } else { InvocationType::RequestResponse };
            let invoke = self
                .client
                .get()
                .await
                .invoke()
                .function_name(&self.function)
                .set_qualifier(self.qualifier.clone())
                .invocation_type(kind)
                .payload(Blob::new(payload));
            // The task's trace goes on to the function (the SDK would send the invocation's).
            let sent = match crate::trace::current() {
                Some(h) => {
                    invoke
                        .customize()
                        .mutate_request(move |r| {
                            r.headers_mut().insert("X-Amzn-Trace-Id", h.clone());
                        })
                        .send()
                        .await
                }
                None => invoke.send().await,
            };
            let out = match sent {
                Ok(out) => out,
                Err(e) => {
                    let status = e.raw_response().map(|r| r.status().as_u16());
                    let code = e.code().map(str::to_owned);
                    let hint = match e.as_service_error() {
                        Some(aws_sdk_lambda::operation::invoke::InvokeError::TooManyRequestsException(t)) => {
                            t.retry_after_seconds().and_then(|s| s.trim().parse::<u64>().ok()).map(Duration::from_secs)
                        }
                        _ => None,
                    };
                    let text = aws_sdk_lambda::error::DisplayErrorContext(&e).to_string();
                    return Err(invoke_error(&self.function, code.as_deref(), status, &text, hint));
                }
            };
            if asynchronous {
                info!(task_id = %req.task_id, step = %req.step, function = %self.function, "callback step handed to the function (asynchronous invoke)");
                return Ok(json!({"invoked": self.function, "asynchronous": true, "status": out.status_code()}));
            }
            let body = out.payload().map(Blob::as_ref).unwrap_or_default();
            if let Some(kind) = out.function_error() {
                return Err(function_error(&self.function, kind, body));
            }
            if body.len() > self.max_response_bytes {
                return Ok(json!({"truncated": true, "bytes": body.len(), "limit": self.max_response_bytes}));
            }
            if body.is_empty() {
                return Ok(Value::Null);
            }
            Ok(serde_json::from_slice(body)
                .unwrap_or_else(|_| json!({"body": crate::ids::clip(String::from_utf8_lossy(body).trim(), 300)})))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(json: &str) -> LambdaKind {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn names_arns_and_qualifiers_are_checked_at_load() {
        for ok in [
            r#"{"function": "charge-card"}"#,
            r#"{"function": "arn:aws:lambda:eu-west-1:123456789012:function:charge_card"}"#,
            r#"{"function": "arn:aws:lambda:eu-west-1:123456789012:function:charge:live"}"#,
            r#"{"function": "charge", "qualifier": "$LATEST"}"#,
            r#"{"function": "charge", "qualifier": "7"}"#,
        ] {
            assert_eq!(kind(ok).check(), Ok(()), "{ok}");
        }
        for bad in [
            r#"{"function": ""}"#,
            r#"{"function": "https://example.com/fn"}"#,
            r#"{"function": "arn:aws:sns:eu-west-1:123456789012:topic"}"#,
            r#"{"function": "charge", "qualifier": "a/b"}"#,
        ] {
            assert!(kind(bad).check().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<LambdaKind>(r#"{"function": "f", "url": "x"}"#).is_err(), "unknown fields");
    }

    #[test]
    fn the_grant_is_invoke_on_the_function_and_its_qualifier() {
        assert_eq!(
            kind(r#"{"function": "arn:aws:lambda:eu-west-1:1:function:f", "qualifier": "live"}"#).grants(),
            vec![Grant::new(
                "lambda:InvokeFunction",
                "arn:aws:lambda:eu-west-1:1:function:f:live",
                "AgentFunctionArns"
            )]
        );
        assert_eq!(kind(r#"{"function": "f"}"#).grants()[0].resource, "f");
    }

    #[test]
    fn a_function_says_permanent_by_its_error_type() {
        for t in ["PermanentError", "orders.PermanentFailure", "my_crate::errors::Permanent", "Outer$PermanentError"] {
            assert!(is_permanent_type(t), "{t}");
        }
        for t in ["", "Error", "KeyError", "NotPermanent", "Sandbox.Timedout", "Runtime.ExitError", "permanent"] {
            assert!(!is_permanent_type(t), "{t}");
        }
        let e = function_error(
            "charge",
            "Unhandled",
            br#"{"errorType": "PermanentError", "errorMessage": "card declined"}"#,
        );
        assert_eq!(
            e,
            AgentError::Permanent { message: "function charge failed (PermanentError): card declined".into() }
        );
        let e = function_error(
            "charge",
            "Unhandled",
            br#"{"errorType": "Sandbox.Timedout", "errorMessage": "Task timed out after 3.00 seconds"}"#,
        );
        assert!(matches!(e, AgentError::Transient { ref message, .. } if message.contains("timed out")), "{e:?}");
        // a payload that is not Lambda's error document still says what happened
        let e = function_error("charge", "Unhandled", b"segfault");
        assert!(
            matches!(e, AgentError::Transient { ref message, .. } if message == "function charge failed (Unhandled): segfault"),
            "{e:?}"
        );
    }

    #[test]
    fn invoke_errors_are_classified_by_what_retrying_can_do() {
        let p = |code, status| matches!(invoke_error("f", code, status, "m", None), AgentError::Permanent { .. });
        assert!(!p(Some("TooManyRequestsException"), Some(429)));
        assert!(!p(Some("ResourceConflictException"), Some(409)), "a function being updated is ready soon");
        assert!(!p(Some("ResourceNotReadyException"), Some(502)));
        assert!(!p(Some("ServiceException"), Some(500)));
        assert!(!p(Some("EC2ThrottledException"), Some(502)));
        assert!(!p(None, None), "no answer: connection or timeout");
        assert!(p(Some("ResourceNotFoundException"), Some(404)));
        assert!(p(Some("AccessDeniedException"), Some(403)));
        assert!(p(Some("RequestTooLargeException"), Some(413)));
        assert!(p(Some("KMSAccessDeniedException"), Some(502)), "a refusal whatever its status");
        assert!(p(Some("SomethingNew"), Some(400)), "an unknown 4xx is permanent");
        assert!(!p(Some("SomethingNew"), Some(503)));
        let hint = Some(Duration::from_secs(3));
        assert!(matches!(
            invoke_error("f", Some("TooManyRequestsException"), Some(429), "slow down", hint),
            AgentError::Transient { retry_after, .. } if retry_after == hint
        ));
    }
}
