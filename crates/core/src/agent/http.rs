//! The built-in HTTP agent: calls one endpoint taken from configuration (never from a submission,
//! so a caller cannot make an agent call an arbitrary URL), with the step's idempotency key as the
//! `Idempotency-Key` header and each request's timeout bounded by `CompleteBy`.
//!
//! Classification: connection errors, timeouts, 5xx, 408 and 409 (the key is busy) are transient;
//! 429 is transient and its `Retry-After` (seconds) is honoured by the runtime; any other 4xx and a
//! redirect are permanent. A 2xx JSON response becomes the step's output; a 2xx over the size limit
//! is a success whose output only says it was truncated (the effect happened).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::config::AgentConfigError;
use super::handover::CallbackEndpoints;
use super::kind::{AgentKind, BuildContext};
use super::runtime::{Agent, AgentError, Call};
use crate::ids::Millis;

/// The default limit on a response body that becomes step output (it is stored in the task item
/// and carried to later steps, so it must stay far below DynamoDB's 400 KB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// `{"kind": "http", "url": "https://..."}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpKind {
    /// The endpoint every call POSTs to.
    pub url: String,
}

impl AgentKind for HttpKind {
    const KIND: &'static str = "http";

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(AgentConfigError::BadUrl { agent: name.to_owned(), url: self.url });
        }
        Ok(Arc::new(
            HttpAgent::new(cx.http.clone(), self.url, cx.max_response_bytes).with_callback(cx.callback.clone()),
        ))
    }
}

#[derive(Debug, Clone)]
pub struct HttpAgent {
    client: reqwest::Client,
    url: String,
    max_response_bytes: usize,
    callback: CallbackEndpoints,
}

/// One HTTP client (connection pool) for all the agents of a process.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!("sas-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("a client with rustls and no custom certificates builds")
}

impl HttpAgent {
    pub fn new(client: reqwest::Client, url: impl Into<String>, max_response_bytes: usize) -> Self {
        HttpAgent { client, url: url.into(), max_response_bytes, callback: CallbackEndpoints::default() }
    }

    /// Where the remote side of a callback step answers (told with the token).
    #[must_use]
    pub fn with_callback(mut self, callback: CallbackEndpoints) -> Self {
        self.callback = callback;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    crate::ids::clip(text.trim(), 300).to_owned()
}

fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let v = resp.headers().get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn transport_error(e: &reqwest::Error) -> AgentError {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    AgentError::Transient { message: format!("{kind}: {e}"), retry_after: None }
}

impl Agent for HttpAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let req = call.request;
            let left = Millis::now().until(call.deadline);
            if left == 0 {
                return Err(AgentError::Transient { message: "CompleteBy has passed".into(), retry_after: None });
            }
            let body = super::handover::request(req, call.deadline, &self.callback);
            let sent = self
                .client
                .post(&self.url)
                .timeout(Duration::from_millis(left))
                .header("Idempotency-Key", req.idempotency_key.as_str())
                .header("X-Request-Deadline", call.deadline.to_string())
                .header("X-Task-Id", req.task_id.as_str())
                .json(&body)
                .send()
                .await;
            let mut resp = sent.map_err(|e| transport_error(&e))?;
            let status = resp.status();
            if status.is_redirection() {
                return Err(AgentError::Permanent { message: format!("HTTP {status}: redirects are not followed") });
            }
            let hint = retry_after(&resp);
            // A 2xx means the effect happened, whatever its size: an oversized answer is kept out of
            // the task (it would not fit) but the step succeeded, so it is compensated if need be.
            let oversized = |bytes: String| json!({"status": status.as_u16(), "truncated": true, "bytes": bytes, "limit": self.max_response_bytes});
            if let Some(len) = resp.content_length() {
                if usize::try_from(len).unwrap_or(usize::MAX) > self.max_response_bytes && status.is_success() {
                    return Ok(oversized(len.to_string()));
                }
            }
            let mut buf: Vec<u8> = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| transport_error(&e))? {
                buf.extend_from_slice(&chunk);
                if buf.len() > self.max_response_bytes {
                    if status.is_success() {
                        return Ok(oversized(format!("more than {}", self.max_response_bytes)));
                    }
                    break;
                }
            }
            if status.is_success() {
                return Ok(serde_json::from_slice(&buf)
                    .unwrap_or_else(|_| json!({"status": status.as_u16(), "body": excerpt(&buf)})));
            }
            let message = format!("HTTP {}: {}", status.as_u16(), excerpt(&buf));
            if status == StatusCode::TOO_MANY_REQUESTS {
                return Err(AgentError::Transient { message, retry_after: hint });
            }
            // 409: the service is still working on this idempotency key (or saw it conflict):
            // asking again later may succeed.
            if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::CONFLICT {
                return Err(AgentError::Transient { message, retry_after: hint });
            }
            Err(AgentError::Permanent { message })
        })
    }
}
