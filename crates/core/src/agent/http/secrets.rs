//! Header values from AWS Secrets Manager or SSM Parameter Store (a SecureString, decrypted).
//!
//! The values are read on the first call that needs them and cached for a bounded age; the agent
//! drops the cache when the endpoint answers 401/403 and tries once more with values read anew
//! (a rotated secret). A value is held as a [`SecretText`] or a sensitive `HeaderValue`, neither of
//! which prints it: it is never logged, and never reaches the task or a step's output (errors name
//! the header and the secret, never the value).
//!
//! Fetch errors are classified by what the caller should do: a secret that does not exist, may not
//! be read or is not usable (no such JSON key, not a valid header value) is a configuration
//! problem and fails the step for good; throttling, 5xx and timeouts are worth another try.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use futures::future::BoxFuture;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;
use tracing::debug;

use crate::agent::kind::AwsConfigCell;
use crate::agent::runtime::AgentError;

/// How long a value read from a secret is used before it is read again (`"secret_max_age_ms"`).
pub const DEFAULT_SECRET_MAX_AGE_MS: u64 = 300_000;

/// One entry of `"headers"` as written: `{"secret": "arn-or-name", "key": "json key", "prefix":
/// "Bearer "}` or `{"parameter": "/name/or/arn", ...}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderSpec {
    /// A Secrets Manager secret (ARN or name); its string is the value.
    #[serde(default)]
    pub secret: Option<String>,
    /// An SSM parameter (name or ARN), read with decryption.
    #[serde(default)]
    pub parameter: Option<String>,
    /// The value is this key of the JSON object the secret (or parameter) holds.
    #[serde(default)]
    pub key: Option<String>,
    /// Put before the value, e.g. `"Bearer "`.
    #[serde(default)]
    pub prefix: Option<String>,
}

/// Where a value is read from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretRef {
    /// A Secrets Manager secret: ARN or name.
    Secret(String),
    /// An SSM parameter: name or ARN.
    Parameter(String),
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretRef::Secret(id) => write!(f, "secret {id}"),
            SecretRef::Parameter(name) => write!(f, "parameter {name}"),
        }
    }
}

/// A header whose value comes from a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretHeader {
    pub name: HeaderName,
    pub source: SecretRef,
    pub key: Option<String>,
    pub prefix: String,
}

impl SecretHeader {
    /// How messages name it: `header X-Api-Key (secret arn:..., key "token")`.
    pub fn describe(&self) -> String {
        match &self.key {
            Some(k) => format!("header {} ({}, key {k:?})", self.name, self.source),
            None => format!("header {} ({})", self.name, self.source),
        }
    }
}

/// A value read from a secret. Its `Debug` never shows it; only [`SecretText::expose`] does.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(String);

impl SecretText {
    pub fn new(value: impl Into<String>) -> Self {
        SecretText(value.into())
    }

    /// The value itself: for building the header, nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretText(<redacted>)")
    }
}

/// Why a value could not be read; the message names the secret, never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The configuration is wrong (no such secret, no access, not usable): retrying cannot help.
    Permanent(String),
    /// Throttling, a 5xx, a timeout, credentials not available now.
    Transient(String),
}

impl From<FetchError> for AgentError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Permanent(message) => AgentError::Permanent { message },
            FetchError::Transient(message) => AgentError::Transient { message, retry_after: None },
        }
    }
}

/// Where values are read from: AWS ([`AwsSecrets`]), or a fake in tests.
pub trait SecretSource: Send + Sync + fmt::Debug {
    fn fetch<'a>(&'a self, what: &'a SecretRef) -> BoxFuture<'a, Result<SecretText, FetchError>>;
}

/// Secrets Manager `GetSecretValue` and SSM `GetParameter` (with decryption), with clients built
/// from the process's AWS configuration on first use.
#[derive(Debug, Default)]
pub struct AwsSecrets {
    aws: AwsConfigCell,
    secretsmanager: OnceCell<aws_sdk_secretsmanager::Client>,
    ssm: OnceCell<aws_sdk_ssm::Client>,
}

impl AwsSecrets {
    pub fn new(aws: AwsConfigCell) -> Self {
        AwsSecrets { aws, secretsmanager: OnceCell::new(), ssm: OnceCell::new() }
    }

    async fn secret(&self, id: &str) -> Result<SecretText, FetchError> {
        let client = self
            .secretsmanager
            .get_or_init(|| async { aws_sdk_secretsmanager::Client::new(self.aws.get().await) })
            .await;
        let what = format!("reading secret {id}");
        let out = client.get_secret_value().secret_id(id).send().await.map_err(|e| classify(&what, &e))?;
        match out.secret_string {
            Some(s) => Ok(SecretText(s)),
            None => Err(FetchError::Permanent(format!(
                "secret {id} holds no string (a binary secret cannot be a header value)"
            ))),
        }
    }

    async fn parameter(&self, name: &str) -> Result<SecretText, FetchError> {
        let client = self.ssm.get_or_init(|| async { aws_sdk_ssm::Client::new(self.aws.get().await) }).await;
        let what = format!("reading parameter {name}");
        let out =
            client.get_parameter().name(name).with_decryption(true).send().await.map_err(|e| classify(&what, &e))?;
        out.parameter
            .and_then(|p| p.value)
            .map(SecretText)
            .ok_or_else(|| FetchError::Permanent(format!("parameter {name} has no value")))
    }
}

impl SecretSource for AwsSecrets {
    fn fetch<'a>(&'a self, what: &'a SecretRef) -> BoxFuture<'a, Result<SecretText, FetchError>> {
        Box::pin(async move {
            match what {
                SecretRef::Secret(id) => self.secret(id).await,
                SecretRef::Parameter(name) => self.parameter(name).await,
            }
        })
    }
}

/// Error codes of Secrets Manager and SSM that say the configuration is wrong.
fn is_config_error(code: &str) -> bool {
    matches!(
        code,
        "ResourceNotFoundException"
            | "ParameterNotFound"
            | "ParameterVersionNotFound"
            | "AccessDeniedException"
            | "AccessDenied"
            | "InvalidParameterException"
            | "InvalidRequestException"
            | "ValidationException"
            | "DecryptionFailure"
            | "InvalidKeyId"
    )
}

/// A failed call, by what the caller should do: a configuration error is permanent; anything else
/// (throttling, 5xx, a timeout, a dispatch failure, credentials not available) is transient.
pub(crate) fn classify<E, R>(what: &str, e: &SdkError<E, R>) -> FetchError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug,
{
    if let SdkError::ServiceError(se) = e {
        let err = se.err();
        let code = err.code().unwrap_or("unknown error");
        let message = format!("{what}: {code}: {}", err.message().unwrap_or_default());
        return if is_config_error(code) { FetchError::Permanent(message) } else { FetchError::Transient(message) };
    }
    FetchError::Transient(format!("{what}: {}", DisplayErrorContext(e)))
}

/// Header names with their values (sensitive: their Debug does not show them).
pub type HeaderValues = Vec<(HeaderName, HeaderValue)>;

/// The secret headers of one agent, their source and their cache.
pub struct SecretHeaders {
    headers: Vec<SecretHeader>,
    source: Arc<dyn SecretSource>,
    max_age: Duration,
    /// The values with when they were read. One reader at a time: callers that find it stale wait
    /// for the one that reads.
    cache: Mutex<Option<(HeaderValues, Instant)>>,
}

impl fmt::Debug for SecretHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cached = self.cache.try_lock().map_or("busy", |c| if c.is_some() { "yes" } else { "no" });
        f.debug_struct("SecretHeaders")
            .field("headers", &self.headers.iter().map(SecretHeader::describe).collect::<Vec<_>>())
            .field("source", &self.source)
            .field("max_age", &self.max_age)
            .field("cached", &cached)
            .finish()
    }
}

/// Header values for one request, and whether they were read for it (not taken from the cache).
pub struct Resolved {
    pub values: HeaderValues,
    pub fresh: bool,
}

impl SecretHeaders {
    pub fn new(headers: Vec<SecretHeader>, source: Arc<dyn SecretSource>, max_age: Duration) -> Self {
        SecretHeaders { headers, source, max_age, cache: Mutex::new(None) }
    }

    pub fn headers(&self) -> &[SecretHeader] {
        &self.headers
    }

    /// The values: from the cache while younger than the maximum age, else read anew.
    pub async fn get(&self) -> Result<Resolved, AgentError> {
        let mut cache = self.cache.lock().await;
        if let Some((values, at)) = cache.as_ref() {
            if at.elapsed() < self.max_age {
                return Ok(Resolved { values: values.clone(), fresh: false });
            }
        }
        let values = self.read().await?;
        *cache = Some((values.clone(), Instant::now()));
        Ok(Resolved { values, fresh: true })
    }

    /// Drop the cached values (the endpoint refused them).
    pub async fn forget(&self) {
        *self.cache.lock().await = None;
    }

    /// Every header, naming its secret: for messages.
    pub fn describe(&self) -> String {
        self.headers.iter().map(SecretHeader::describe).collect::<Vec<_>>().join(", ")
    }

    async fn read(&self) -> Result<HeaderValues, AgentError> {
        // each secret read once, however many headers take a key of it
        let mut read: BTreeMap<&SecretRef, SecretText> = BTreeMap::new();
        let mut out = Vec::with_capacity(self.headers.len());
        for h in &self.headers {
            if !read.contains_key(&h.source) {
                debug!(header = %h.name, source = %h.source, "reading a header value");
                let text = self.source.fetch(&h.source).await?;
                read.insert(&h.source, text);
            }
            out.push((h.name.clone(), header_value(h, &read[&h.source])?));
        }
        Ok(out)
    }
}

/// The header's value from its secret's text: the key asked of the JSON object it holds (or the
/// whole text), after the prefix; marked sensitive. Errors name the header and the secret only.
fn header_value(h: &SecretHeader, text: &SecretText) -> Result<HeaderValue, AgentError> {
    let permanent = |why: &str| AgentError::Permanent { message: format!("{}: {why}", h.describe()) };
    let value = match &h.key {
        None => text.expose().to_owned(),
        Some(key) => {
            let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text.expose()) else {
                return Err(permanent("the value is not a JSON object, so it has no key"));
            };
            match map.get(key) {
                Some(Value::String(s)) => s.clone(),
                Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                Some(_) => return Err(permanent("the key does not hold a string")),
                None => return Err(permanent("the JSON object has no such key")),
            }
        }
    };
    let mut v = HeaderValue::from_str(&format!("{}{value}", h.prefix))
        .map_err(|_| permanent("the value is not a valid HTTP header value"))?;
    v.set_sensitive(true);
    Ok(v)
}
