//! Building AWS clients once per process. TLS is rustls with ring (no OpenSSL, no aws-lc).
//! Endpoints come from the environment: `AWS_ENDPOINT_URL` (or per service, e.g.
//! `AWS_ENDPOINT_URL_SQS`) points everything at LocalStack; without it, real AWS.
//!
//! Every call has a deadline ([`SdkTimeouts`]), well inside the shortest function timeout: a slow
//! or hung dependency fails the record that called it (SQS delivers it again) instead of running
//! the invocation into its timeout, which would fail and redeliver the whole batch.

use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader, SdkConfig};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use crate::config::ConfigError;

/// How long one AWS call may take (environment: `SDK_CONNECT_TIMEOUT_MS`,
/// `SDK_ATTEMPT_TIMEOUT_MS`, `SDK_OPERATION_TIMEOUT_MS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdkTimeouts {
    /// Establishing a connection (TCP and TLS).
    pub connect: Duration,
    /// One attempt: the request sent and its whole answer read. The SDK retries an attempt that
    /// runs out (standard retries), within `operation`.
    pub attempt: Duration,
    /// The whole call, retries and their backoff included.
    pub operation: Duration,
}

/// The longest `SDK_OPERATION_TIMEOUT_MS` accepted: half the shortest function timeout (the
/// Submitter's 10 s in `template.yaml`), so one hung call always leaves the handler time to fail
/// its record and answer for the rest of the batch.
pub const MAX_SDK_OPERATION_TIMEOUT_MS: u64 = 5_000;

impl Default for SdkTimeouts {
    /// DynamoDB and SQS answer in tens of milliseconds; these leave room for a slow attempt and
    /// one retry, and stay under [`MAX_SDK_OPERATION_TIMEOUT_MS`].
    fn default() -> Self {
        SdkTimeouts {
            connect: Duration::from_secs(1),
            attempt: Duration::from_secs(2),
            operation: Duration::from_secs(4),
        }
    }
}

impl SdkTimeouts {
    /// From the environment; unset variables keep their defaults.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From the variables `get` returns, checked: every value positive, connect and attempt
    /// within operation, operation within [`MAX_SDK_OPERATION_TIMEOUT_MS`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let d = SdkTimeouts::default();
        let ms = |name: &'static str, default: Duration| -> Result<Duration, ConfigError> {
            let Some(v) = get(name) else { return Ok(default) };
            match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
                _ => Err(ConfigError::Invalid { name, value: v, why: "a positive number of milliseconds".into() }),
            }
        };
        let t = SdkTimeouts {
            connect: ms("SDK_CONNECT_TIMEOUT_MS", d.connect)?,
            attempt: ms("SDK_ATTEMPT_TIMEOUT_MS", d.attempt)?,
            operation: ms("SDK_OPERATION_TIMEOUT_MS", d.operation)?,
        };
        let invalid = |name: &'static str, value: Duration, why: String| ConfigError::Invalid {
            name,
            value: value.as_millis().to_string(),
            why,
        };
        if t.operation > Duration::from_millis(MAX_SDK_OPERATION_TIMEOUT_MS) {
            return Err(invalid(
                "SDK_OPERATION_TIMEOUT_MS",
                t.operation,
                format!("at most {MAX_SDK_OPERATION_TIMEOUT_MS} (half the shortest function timeout)"),
            ));
        }
        for (name, v) in [("SDK_CONNECT_TIMEOUT_MS", t.connect), ("SDK_ATTEMPT_TIMEOUT_MS", t.attempt)] {
            if v > t.operation {
                return Err(invalid(
                    name,
                    v,
                    format!("at most SDK_OPERATION_TIMEOUT_MS ({})", t.operation.as_millis()),
                ));
            }
        }
        Ok(t)
    }

    /// The SDK's form.
    pub fn config(&self) -> TimeoutConfig {
        TimeoutConfig::builder()
            .connect_timeout(self.connect)
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation)
            .build()
    }
}

/// The loader every client of the project is built from: the HTTP client and the timeouts.
pub fn sdk_config_loader(timeouts: &SdkTimeouts) -> ConfigLoader {
    let http = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    aws_config::defaults(BehaviorVersion::latest()).http_client(http).timeout_config(timeouts.config())
}

/// The SDK configuration with these timeouts (the functions: checked [`SdkTimeouts::from_env`]).
pub async fn load_sdk_config_with(timeouts: &SdkTimeouts) -> SdkConfig {
    sdk_config_loader(timeouts).load().await
}

/// The timeouts of tools and tests (`sasctl`, the local runner, the integration tests): they are
/// not bound by a function timeout, and a CloudFormation deploy or a loaded LocalStack answers in
/// seconds (a call cut short there is sent again and may meet its own first copy).
pub const TOOL_TIMEOUTS: SdkTimeouts =
    SdkTimeouts { connect: Duration::from_secs(5), attempt: Duration::from_mins(1), operation: Duration::from_mins(2) };

/// The SDK configuration of tools and tests ([`TOOL_TIMEOUTS`]); the functions use
/// [`load_sdk_config_with`] and [`SdkTimeouts::from_env`].
pub async fn load_sdk_config() -> SdkConfig {
    load_sdk_config_with(&TOOL_TIMEOUTS).await
}

/// The SQS client of the roles: with the AWS call recorder when `SAS_AWS_CALL_LOG` is set
/// ([`crate::aws_calls`]).
pub fn sqs_client(sdk: &SdkConfig) -> aws_sdk_sqs::Client {
    let mut b = aws_sdk_sqs::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_sqs::Client::from_conf(b.build())
}

/// The SNS client of the roles (with the recorder when asked, as [`sqs_client`]).
pub fn sns_client(sdk: &SdkConfig) -> aws_sdk_sns::Client {
    let mut b = aws_sdk_sns::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_sns::Client::from_conf(b.build())
}

/// The EventBridge client of the `eventbridge` agent kind (with the recorder when asked, as
/// [`sqs_client`]).
pub fn eventbridge_client(sdk: &SdkConfig) -> aws_sdk_eventbridge::Client {
    let mut b = aws_sdk_eventbridge::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_eventbridge::Client::from_conf(b.build())
}

/// The DynamoDB client of the roles (with the recorder when asked, as [`sqs_client`]).
pub fn dynamodb_client(sdk: &SdkConfig) -> aws_sdk_dynamodb::Client {
    let mut b = aws_sdk_dynamodb::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_dynamodb::Client::from_conf(b.build())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn timeouts_come_from_the_environment_checked() {
        assert_eq!(SdkTimeouts::from_lookup(lookup(&[])), Ok(SdkTimeouts::default()));
        let t = SdkTimeouts::from_lookup(lookup(&[
            ("SDK_CONNECT_TIMEOUT_MS", "300"),
            ("SDK_ATTEMPT_TIMEOUT_MS", " 800 "),
            ("SDK_OPERATION_TIMEOUT_MS", "2500"),
        ]))
        .unwrap();
        assert_eq!(
            (t.connect, t.attempt, t.operation),
            (Duration::from_millis(300), Duration::from_millis(800), Duration::from_millis(2500))
        );
        let c = t.config();
        assert_eq!(
            (c.connect_timeout(), c.operation_attempt_timeout(), c.operation_timeout()),
            (Some(t.connect), Some(t.attempt), Some(t.operation))
        );
        for (bad, name) in [
            (&[("SDK_ATTEMPT_TIMEOUT_MS", "0")][..], "SDK_ATTEMPT_TIMEOUT_MS"),
            (&[("SDK_CONNECT_TIMEOUT_MS", "1s")][..], "SDK_CONNECT_TIMEOUT_MS"),
            (&[("SDK_OPERATION_TIMEOUT_MS", "5001")][..], "SDK_OPERATION_TIMEOUT_MS"),
            (&[("SDK_OPERATION_TIMEOUT_MS", "1000")][..], "SDK_ATTEMPT_TIMEOUT_MS"),
        ] {
            let e = SdkTimeouts::from_lookup(lookup(bad)).unwrap_err();
            assert!(matches!(&e, ConfigError::Invalid { name: n, .. } if *n == name), "{bad:?}: {e}");
        }
    }

    #[test]
    fn every_call_ends_well_inside_the_shortest_function_timeout() {
        // the functions' `Timeout:` values in the template (seconds)
        let template = include_str!("../../../template.yaml");
        let timeouts: Vec<u64> = template
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Timeout:"))
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        assert_eq!(timeouts.len(), 5, "one per function: {timeouts:?}");
        let shortest = Duration::from_secs(*timeouts.iter().min().unwrap());
        assert!(
            Duration::from_millis(MAX_SDK_OPERATION_TIMEOUT_MS) * 2 <= shortest,
            "shortest function timeout {shortest:?}"
        );
        let d = SdkTimeouts::default();
        assert!(d.connect <= d.attempt && d.attempt <= d.operation);
        assert!(d.operation <= Duration::from_millis(MAX_SDK_OPERATION_TIMEOUT_MS));
        // what the template gives the functions is valid, and is the default
        let env = |name: &str| {
            template
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().trim_matches('"').to_owned())
        };
        assert!(env("SDK_OPERATION_TIMEOUT_MS").is_some(), "template.yaml sets the SDK timeouts");
        assert_eq!(SdkTimeouts::from_lookup(env), Ok(d));
    }

    /// A dependency that accepts the connection and never answers: the call fails within the
    /// operation timeout, through the loader production uses.
    #[tokio::test]
    async fn a_hung_dependency_fails_the_call_within_the_operation_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket); // read nothing, answer nothing, keep it open
            }
        });
        let timeouts = SdkTimeouts {
            connect: Duration::from_millis(200),
            attempt: Duration::from_millis(300),
            operation: Duration::from_millis(900),
        };
        let sdk = sdk_config_loader(&timeouts)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("test", "test", None, None, "test"))
            .endpoint_url(format!("http://{addr}"))
            .load()
            .await;
        let ddb = aws_sdk_dynamodb::Client::new(&sdk);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let started = Instant::now();
        let get = ddb.get_item().table_name("t").key("TaskId", aws_sdk_dynamodb::types::AttributeValue::S("x".into()));
        let got = tokio::time::timeout(Duration::from_secs(10), get.send()).await;
        assert!(matches!(got, Ok(Err(_))), "GetItem must fail, not hang: {got:?}");
        let request = sqs.send_message().queue_url(format!("http://{addr}/000000000000/q")).message_body("x");
        let sent = tokio::time::timeout(Duration::from_secs(10), request.send()).await;
        assert!(matches!(sent, Ok(Err(_))), "SendMessage must fail, not hang: {sent:?}");
        let took = started.elapsed();
        assert!(took < Duration::from_millis(2 * 900 + 600), "two calls took {took:?}");
        hold.abort();
    }
}
