//! Asynchronous effects, as a real warehouse works: a request that carries a `callback` object
//! (`{"token", "heartbeat_ms", "queue_url", "url"}`, what the HTTP agent hands over for a callback
//! step) is accepted at once (202) and done in the background: the service heartbeats while it
//! works, then applies the effect (its ledger entry) and confirms on the callback queue with
//! `{"v":1,"token":…,"status":"succeeded","output":{…}}`.
//!
//! One job per idempotency key: a retry of the step (a new attempt, so a new token) finds the job
//! and moves it to the new token; a job already done confirms again, to the new token, without
//! applying anything twice. So the ledger holds one entry per effect whatever the retries.
//!
//! Faults (see [`crate::FaultRule`]): `callback_late_ms` stops the heartbeats and confirms only
//! after that delay (the step's deadline passes first: the answer is late); `callback_never`
//! accepts and never answers (the step's deadline is the only way out).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use sas_protocol::ids::CallbackToken;
use sas_protocol::messages::{CallbackAnswer, CallbackMessage, VERSION};
use serde_json::{json, Value};
use tokio::sync::OnceCell;
use tracing::{info, warn};

/// The callback object of a request.
#[derive(Debug, Clone)]
pub(crate) struct CallbackReq {
    pub token: CallbackToken,
    pub heartbeat_ms: Option<u64>,
    pub queue_url: String,
}

impl CallbackReq {
    /// `None` when the request has no `callback`; `Err` when it has one the service cannot answer.
    pub fn parse(body: &Value) -> Result<Option<Self>, String> {
        let Some(cb) = body.get("callback") else { return Ok(None) };
        let token = cb
            .get("token")
            .and_then(Value::as_str)
            .ok_or("callback.token is missing")?
            .try_into()
            .map_err(|e: sas_protocol::ids::BadCallbackToken| format!("callback.token: {e}"))?;
        let queue_url = cb
            .get("queue_url")
            .and_then(Value::as_str)
            .filter(|q| !q.is_empty())
            .ok_or("callback.queue_url is missing: this service confirms through the callback queue only")?
            .to_owned();
        let heartbeat_ms = cb.get("heartbeat_ms").and_then(Value::as_u64);
        Ok(Some(CallbackReq { token, heartbeat_ms, queue_url }))
    }
}

/// Where the service sends its callback messages (SQS in production, memory in tests).
pub trait CallbackSender: Send + Sync + 'static {
    fn send<'a>(
        &'a self,
        queue_url: &'a str,
        msg: &'a CallbackMessage,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

/// The SQS sender: the client is built on first use from the environment (`AWS_ENDPOINT_URL`
/// points it at LocalStack, as everywhere in the project).
#[derive(Debug, Default)]
pub struct SqsSender {
    client: OnceCell<aws_sdk_sqs::Client>,
}

impl CallbackSender for SqsSender {
    fn send<'a>(
        &'a self,
        queue_url: &'a str,
        msg: &'a CallbackMessage,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            let client = self.client.get_or_init(|| async { aws_sdk_sqs::Client::new(&sdk_config().await) }).await;
            let body = serde_json::to_string(msg).map_err(|e| e.to_string())?;
            client
                .send_message()
                .queue_url(queue_url)
                .message_body(body)
                .send()
                .await
                .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
            Ok(())
        })
    }
}

/// A sender that keeps what it was given (tests).
#[derive(Debug, Default)]
pub struct MemorySender {
    sent: Mutex<Vec<(String, CallbackMessage)>>,
}

impl MemorySender {
    /// Every message sent so far, with its queue URL.
    pub fn sent(&self) -> Vec<(String, CallbackMessage)> {
        self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl CallbackSender for MemorySender {
    fn send<'a>(
        &'a self,
        queue_url: &'a str,
        msg: &'a CallbackMessage,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((queue_url.to_owned(), msg.clone()));
        Box::pin(async { Ok(()) })
    }
}

/// How a job answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Heartbeats, then confirms after the service's confirmation delay.
    OnTime,
    /// No heartbeats; confirms after this many milliseconds.
    Late(u64),
    /// Never answers.
    Never,
}

/// One asynchronous effect (per idempotency key).
#[derive(Debug)]
pub(crate) struct Job {
    /// The newest token handed over (a retry brings a new one).
    pub token: CallbackToken,
    pub queue_url: String,
    pub heartbeat_ms: Option<u64>,
    pub mode: Mode,
    /// The effect's output, once applied.
    pub done: Option<Value>,
}

/// How often a job heartbeats: three times per heartbeat timeout (a lost one is not fatal).
pub(crate) fn heartbeat_every(heartbeat_ms: Option<u64>) -> Option<Duration> {
    heartbeat_ms.map(|ms| Duration::from_millis((ms / 3).max(100)))
}

pub(crate) fn succeeded(token: CallbackToken, output: Value) -> CallbackMessage {
    CallbackMessage { v: VERSION, token, answer: CallbackAnswer::Succeeded { output } }
}

pub(crate) fn heartbeat(token: CallbackToken, progress: &str) -> CallbackMessage {
    CallbackMessage {
        v: VERSION,
        token,
        answer: CallbackAnswer::Heartbeat { details: Some(json!({"progress": progress})) },
    }
}

/// Send with a few retries (a queue that is briefly unreachable); logs, never the token.
pub(crate) async fn send(sender: &dyn CallbackSender, queue_url: &str, msg: &CallbackMessage) -> bool {
    for attempt in 1..=3u32 {
        match sender.send(queue_url, msg).await {
            Ok(()) => {
                info!(task_id = %msg.token.task_id(), unit = msg.token.unit(), status = msg.answer.name(), "callback sent");
                return true;
            }
            Err(err) => {
                warn!(task_id = %msg.token.task_id(), attempt, %err, "callback send failed");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
        }
    }
    false
}

/// The AWS configuration of the callback worker's SQS client: the environment's (endpoint, region,
/// credentials), HTTPS with rustls and ring as every client of the project, and the timeouts of
/// the project's tools (5 s to connect, 60 s an attempt, 120 s in all).
async fn sdk_config() -> aws_config::SdkConfig {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    let http = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .operation_attempt_timeout(std::time::Duration::from_mins(1))
        .operation_timeout(std::time::Duration::from_mins(2))
        .build();
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http).timeout_config(timeouts).load().await
}
