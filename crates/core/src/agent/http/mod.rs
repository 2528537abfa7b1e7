//! The built-in HTTP agent: calls one endpoint taken from configuration (never from a submission,
//! so a caller cannot make an agent call an arbitrary URL), with the step's idempotency key as the
//! `Idempotency-Key` header and each request's timeout bounded by `CompleteBy`.
//!
//! Classification: connection errors, timeouts, 5xx and 408 are transient; 429 is transient and
//! its `Retry-After` (seconds) is honoured by the runtime; 409 says the idempotency key is in use
//! by another call (asked again until it is free or the deadline, no failure counted), unless the
//! agent says `"conflict": "permanent"`; any other 4xx and a redirect are permanent. A 2xx JSON response becomes the step's output; a 2xx over the size limit
//! is a success whose output only says it was truncated (the effect happened).
//!
//! Authentication (both optional, together or alone):
//! - [`sign`]: every request SigV4-signed with the function's credentials (`"sign"`);
//! - [`secrets`]: headers whose values come from Secrets Manager or SSM (`"headers"`), cached for
//!   a bounded age (`"secret_max_age_ms"`). A 401/403 answered to cached values drops the cache
//!   and the call is made once more with values read anew; a 401/403 to values just read fails
//!   the step for good, naming the headers and their secrets (never a value).

pub mod secrets;
pub mod sign;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::info;

use super::handover::CallbackEndpoints;
use super::kind::AgentConfigError;
use super::kind::{AgentKind, BuildContext, Grant};
use super::runtime::{Agent, AgentError, Call};
use crate::ids::Millis;
pub use secrets::{
    AwsSecrets, FetchError, HeaderSpec, SecretHeader, SecretHeaders, SecretRef, SecretSource, SecretText,
    DEFAULT_SECRET_MAX_AGE_MS,
};
pub use sign::{SignSpec, Signer};

/// The default limit on a response body that becomes step output (it is stored in the task item
/// and carried to later steps, so it must stay far below DynamoDB's 400 KB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// `{"kind": "http", "url": "https://...", "sign": {...}, "headers": {...}, "secret_max_age_ms": N,
/// "conflict": "key_in_use"}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpKind {
    /// The endpoint every call goes to.
    pub url: String,
    /// SigV4-sign every request for this service (and region).
    #[serde(default)]
    pub sign: Option<SignSpec>,
    /// Headers whose values come from a secret or a parameter.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderSpec>,
    /// How long values read from secrets are used before they are read again
    /// (default [`DEFAULT_SECRET_MAX_AGE_MS`]).
    #[serde(default)]
    pub secret_max_age_ms: Option<u64>,
    /// What the service means by 409 Conflict (default: the idempotency key is in use).
    #[serde(default)]
    pub conflict: Conflict,
    /// The HTTP method (default POST): GET, POST, PUT, PATCH or DELETE. A GET or DELETE sends
    /// no body.
    #[serde(default)]
    pub method: Option<String>,
    /// What the body is: `request` (the default: the request every kind sends) or `input` (the
    /// step's input alone, its `parameters` filled, as a Step Functions HTTP task's RequestBody).
    #[serde(default)]
    pub payload: super::handover::Payload,
}

/// What a 409 Conflict from the service means.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conflict {
    /// Another call holds the request's idempotency key (Stripe's and the IETF `Idempotency-Key`
    /// draft's meaning): asked again until the key is free or the attempt's deadline.
    #[default]
    KeyInUse,
    /// The request conflicts with the resource's state: a "no" for good, as other 4xx.
    Permanent,
}

/// Headers the agent sets itself (or the signer does): a secret may not replace them.
const OWN_HEADERS: [&str; 8] = [
    "host",
    "content-type",
    "content-length",
    "idempotency-key",
    "x-request-deadline",
    "x-task-id",
    "user-agent",
    "x-amzn-trace-id",
];

impl HttpKind {
    fn secret_headers(
        &self,
        invalid: &dyn Fn(String) -> AgentConfigError,
    ) -> Result<Vec<SecretHeader>, AgentConfigError> {
        let mut out = Vec::with_capacity(self.headers.len());
        for (name, spec) in &self.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("headers: {name:?} is not a valid HTTP header name")))?;
            let lower = header.as_str();
            if out.iter().any(|h: &SecretHeader| h.name == header) {
                return Err(invalid(format!("headers: {name} is given twice (names are case-insensitive)")));
            }
            if OWN_HEADERS.contains(&lower) || lower.starts_with("x-amz-") {
                return Err(invalid(format!("headers: {name} is set by the agent itself")));
            }
            if lower == "authorization" && self.sign.is_some() {
                return Err(invalid(format!("headers: {name} carries the SigV4 signature when \"sign\" is set")));
            }
            let source = match (&spec.secret, &spec.parameter) {
                (Some(s), None) if !s.trim().is_empty() => SecretRef::Secret(s.trim().to_owned()),
                (None, Some(p)) if !p.trim().is_empty() => SecretRef::Parameter(p.trim().to_owned()),
                (Some(_), None) => return Err(invalid(format!("headers: {name}: the secret is empty"))),
                (None, Some(_)) => return Err(invalid(format!("headers: {name}: the parameter is empty"))),
                (Some(_), Some(_)) => {
                    return Err(invalid(format!("headers: {name}: give either \"secret\" or \"parameter\", not both")))
                }
                (None, None) => return Err(invalid(format!("headers: {name}: needs \"secret\" or \"parameter\""))),
            };
            if spec.key.as_deref().is_some_and(str::is_empty) {
                return Err(invalid(format!("headers: {name}: the key is empty")));
            }
            let prefix = spec.prefix.clone().unwrap_or_default();
            if HeaderValue::from_str(&prefix).is_err() {
                return Err(invalid(format!("headers: {name}: the prefix is not valid in a header value")));
            }
            out.push(SecretHeader { name: header, source, key: spec.key.clone(), prefix });
        }
        Ok(out)
    }
}

impl AgentKind for HttpKind {
    const KIND: &'static str = "http";

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(AgentConfigError::BadUrl { agent: name.to_owned(), url: self.url });
        }
        let invalid = |message: String| AgentConfigError::Invalid { agent: name.to_owned(), message };
        let headers = self.secret_headers(&invalid)?;
        let method = match self.method.as_deref().map(str::to_ascii_uppercase).as_deref() {
            None | Some("POST") => reqwest::Method::POST,
            Some("GET") => reqwest::Method::GET,
            Some("PUT") => reqwest::Method::PUT,
            Some("PATCH") => reqwest::Method::PATCH,
            Some("DELETE") => reqwest::Method::DELETE,
            Some(other) => return Err(invalid(format!("method {other:?} is not GET, POST, PUT, PATCH or DELETE"))),
        };
        let mut agent = HttpAgent::new(cx.http.clone(), self.url, cx.max_response_bytes)
            .with_callback(cx.callback.clone())
            .with_conflict(self.conflict);
        agent.method = method;
        agent.payload = self.payload;
        if let Some(sign) = self.sign {
            if sign.service.trim().is_empty() {
                return Err(invalid("sign.service is empty".into()));
            }
            if sign.region.as_deref().is_some_and(|r| r.trim().is_empty()) {
                return Err(invalid("sign.region is empty (leave it out for the function's region)".into()));
            }
            agent = agent.with_signer(Signer::new(sign.service.trim(), sign.region, cx.aws.clone()));
        }
        if !headers.is_empty() {
            let max_age = Duration::from_millis(self.secret_max_age_ms.unwrap_or(DEFAULT_SECRET_MAX_AGE_MS));
            let source = Arc::new(AwsSecrets::new(cx.aws.clone()));
            agent = agent.with_secret_headers(SecretHeaders::new(headers, source, max_age));
        }
        Ok(Arc::new(agent))
    }

    /// `secretsmanager:GetSecretValue` on each secret and `ssm:GetParameter` on each parameter, as
    /// written (an ARN, or a name: the template's grant must then cover it). With `sign`:
    /// `execute-api:Invoke` (service `execute-api`) or `lambda:InvokeFunctionUrl` (service
    /// `lambda`) whose resource is the agent's **URL**, not an ARN: the API's or the function's
    /// ARN, which the policy names, cannot be derived from it. Other signing services add no
    /// grant (their action is not known here).
    fn grants(&self) -> Vec<Grant> {
        let mut grants = Vec::new();
        if let Some(sign) = &self.sign {
            let action = match sign.service.trim() {
                "execute-api" => Some("execute-api:Invoke"),
                "lambda" => Some("lambda:InvokeFunctionUrl"),
                _ => None,
            };
            if let Some(action) = action {
                grants.push(Grant::new(action, self.url.clone(), "AgentSignedApiArns"));
            }
        }
        for spec in self.headers.values() {
            if let Some(s) = &spec.secret {
                grants.push(Grant::new("secretsmanager:GetSecretValue", s.trim(), "AgentSecretArns"));
            }
            if let Some(p) = &spec.parameter {
                grants.push(Grant::new("ssm:GetParameter", p.trim(), "AgentParameterArns"));
            }
        }
        grants.sort();
        grants.dedup();
        grants
    }
}

#[derive(Debug, Clone)]
pub struct HttpAgent {
    client: reqwest::Client,
    url: String,
    method: reqwest::Method,
    payload: super::handover::Payload,
    max_response_bytes: usize,
    conflict: Conflict,
    callback: CallbackEndpoints,
    signer: Option<Signer>,
    /// Shared by clones: one cache per configured agent.
    secrets: Option<Arc<SecretHeaders>>,
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
        HttpAgent {
            client,
            url: url.into(),
            method: reqwest::Method::POST,
            payload: super::handover::Payload::Request,
            max_response_bytes,
            conflict: Conflict::default(),
            callback: CallbackEndpoints::default(),
            signer: None,
            secrets: None,
        }
    }

    /// What a 409 from the service means.
    #[must_use]
    pub fn with_conflict(mut self, conflict: Conflict) -> Self {
        self.conflict = conflict;
        self
    }

    /// Sign every request.
    #[must_use]
    pub fn with_signer(mut self, signer: Signer) -> Self {
        self.signer = Some(signer);
        self
    }

    /// Send these headers, their values read from secrets.
    #[must_use]
    pub fn with_secret_headers(mut self, headers: SecretHeaders) -> Self {
        self.secrets = Some(Arc::new(headers));
        self
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

pub(crate) fn transport_error(e: &reqwest::Error) -> AgentError {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    AgentError::Transient { message: format!("{kind}: {e}"), retry_after: None }
}

/// The endpoint refuses the caller's credentials.
fn refused(status: StatusCode) -> bool {
    status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

impl HttpAgent {
    /// One request: the body, the agent's headers and `secret` ones, signed when configured.
    async fn send(
        &self,
        call: &Call<'_>,
        body: &[u8],
        secret: &[(HeaderName, HeaderValue)],
    ) -> Result<reqwest::Response, AgentError> {
        let req = call.request;
        let left = Millis::now().until(call.deadline);
        if left == 0 {
            return Err(AgentError::Transient {
                message: format!("the attempt's deadline {} has passed", call.deadline),
                retry_after: None,
            });
        }
        let mut builder = self
            .client
            .request(self.method.clone(), &self.url)
            .timeout(Duration::from_millis(left))
            .header(CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", req.idempotency_key.as_str())
            .header("X-Request-Deadline", call.deadline.to_string())
            .header("X-Task-Id", req.task_id.as_str());
        // The task's trace goes on to the service (crate::trace).
        if let Some(h) = crate::trace::current() {
            builder = builder.header("X-Amzn-Trace-Id", h);
        }
        for (name, value) in secret {
            builder = builder.header(name.clone(), value.clone());
        }
        if !matches!(self.method, reqwest::Method::GET | reqwest::Method::DELETE) {
            builder = builder.body(body.to_vec());
        }
        let mut request = builder.build().map_err(|e| transport_error(&e))?;
        if let Some(signer) = &self.signer {
            signer.sign(&mut request).await?;
        }
        self.client.execute(request).await.map_err(|e| transport_error(&e))
    }

    /// What a 401/403 to values just read says: which headers and secrets were refused.
    async fn refusal(&self, secrets: &SecretHeaders, resp: reqwest::Response) -> AgentError {
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map(|b| excerpt(&b[..b.len().min(4_096)])).unwrap_or_default();
        AgentError::Permanent {
            message: format!(
                "HTTP {status} with values just read from the secrets: {} (check the secrets and what the \
                 endpoint expects): {body}",
                secrets.describe()
            ),
        }
    }

    /// The answer, classified (see the module's documentation).
    async fn answer(&self, mut resp: reqwest::Response) -> Result<Value, AgentError> {
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
        let mut message = format!("HTTP {}: {}", status.as_u16(), excerpt(&buf));
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Err(AgentError::Transient { message, retry_after: hint });
        }
        // 409: the service is still working on this idempotency key under another call: asked
        // again until it is free (the holder's answer is then replayed) or the deadline.
        if status == StatusCode::CONFLICT && self.conflict == Conflict::KeyInUse {
            return Err(AgentError::KeyInUse { message, retry_after: hint });
        }
        if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
            return Err(AgentError::Transient { message, retry_after: hint });
        }
        if let (true, Some(signer)) = (refused(status), &self.signer) {
            let _ = write!(message, " (the request was SigV4-signed for {})", signer.service());
        }
        Err(AgentError::Permanent { message })
    }
}

impl Agent for HttpAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let body = match self.payload {
                super::handover::Payload::Input if call.request.callback.is_none() => call.request.input.clone(),
                _ => super::handover::request(call.request, call.deadline, &self.callback),
            };
            let body = serde_json::to_vec(&body).expect("a JSON value serialises");
            let Some(secrets) = &self.secrets else {
                let resp = self.send(&call, &body, &[]).await?;
                return self.answer(resp).await;
            };
            let values = secrets.get().await?;
            let resp = self.send(&call, &body, &values.values).await?;
            if !refused(resp.status()) {
                return self.answer(resp).await;
            }
            if values.fresh {
                return Err(self.refusal(secrets, resp).await);
            }
            // cached values refused: perhaps rotated since; read them again and try once more
            info!(url = %self.url, status = resp.status().as_u16(), headers = %secrets.describe(), "header values refused: reading them again");
            drop(resp);
            secrets.forget().await;
            let values = secrets.get().await?;
            let resp = self.send(&call, &body, &values.values).await?;
            if refused(resp.status()) {
                return Err(self.refusal(secrets, resp).await);
            }
            self.answer(resp).await
        })
    }
}
