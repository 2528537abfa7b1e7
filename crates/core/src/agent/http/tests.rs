//! Tests of the HTTP agent's configuration, secret headers (cache, refresh on 401/403, redaction)
//! and signing, against a small server on loopback and a fake secret source.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Value};

use super::secrets::{FetchError, SecretHeader, SecretHeaders, SecretRef, SecretSource, SecretText};
use super::{HttpAgent, HttpKind, Signer};
use crate::agent::kind::AgentConfigError;
use crate::agent::kind::{AgentKind, AwsConfigCell, BuildContext, Grant};
use crate::agent::runtime::{Agent, AgentError, AgentRuntime, Call, CallRetry};
use crate::ids::{AttemptToken, Millis, TaskId};
use crate::messages::{AgentRequest, Outcome};

fn req() -> AgentRequest {
    let task_id = TaskId::try_from("t-1").unwrap();
    AgentRequest::first_attempt(task_id, "charge", "h", json!({"amount": 5}), Millis::now().plus_ms(10_000))
        .with_attempt(AttemptToken::from("a"))
}

async fn call(agent: &dyn Agent) -> Result<Value, AgentError> {
    let r = req();
    agent.call(Call { request: &r, call_no: 1, deadline: r.complete_by }).await
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

pub(crate) type Answer = dyn Fn(&Seen) -> (u16, String) + Send + Sync;

/// A server on loopback that records every request and answers with `answer(request)`.
pub(crate) async fn server(answer: Arc<Answer>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head_end, len) = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(h) = text.find("\r\n\r\n") {
                        let len = text[..h]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0usize);
                        if buf.len() >= h + 4 + len {
                            break (h, len);
                        }
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let mut lines = head.lines();
                let path = lines.next().unwrap_or_default().split(' ').nth(1).unwrap_or_default().to_owned();
                let headers = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                    .collect();
                let seen = Seen { path, headers, body: buf[head_end + 4..head_end + 4 + len].to_vec() };
                let (status, body) = answer(&seen);
                log.lock().unwrap().push(seen);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}/charge"), seen)
}

/// A secret store in memory that counts its reads; `fail` makes every read fail so. (Its Debug
/// shows no value, as a real source holds none.)
#[derive(Default)]
struct FakeSecrets {
    values: Mutex<HashMap<SecretRef, String>>,
    reads: AtomicUsize,
    fail: Mutex<Option<FetchError>>,
}

impl std::fmt::Debug for FakeSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeSecrets").field("reads", &self.reads).finish_non_exhaustive()
    }
}

impl FakeSecrets {
    fn set(&self, what: &SecretRef, value: &str) {
        self.values.lock().unwrap().insert(what.clone(), value.to_owned());
    }
    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl SecretSource for FakeSecrets {
    fn fetch<'a>(&'a self, what: &'a SecretRef) -> BoxFuture<'a, Result<SecretText, FetchError>> {
        Box::pin(async move {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if let Some(e) = self.fail.lock().unwrap().clone() {
                return Err(e);
            }
            self.values
                .lock()
                .unwrap()
                .get(what)
                .map(SecretText::new)
                .ok_or_else(|| FetchError::Permanent(format!("{what} not found")))
        })
    }
}

const SECRET: &str = "arn:aws:secretsmanager:us-east-1:000000000000:secret:api-AbCdEf";

fn secret_ref() -> SecretRef {
    SecretRef::Secret(SECRET.into())
}

/// An agent sending `Authorization: Bearer <token of the secret's JSON>`.
fn agent_with(url: &str, source: Arc<FakeSecrets>, max_age: Duration) -> HttpAgent {
    let header = SecretHeader {
        name: "authorization".parse().unwrap(),
        source: secret_ref(),
        key: Some("token".into()),
        prefix: "Bearer ".into(),
    };
    HttpAgent::new(super::client(), url, 64 * 1024).with_secret_headers(SecretHeaders::new(
        vec![header],
        source,
        max_age,
    ))
}

/// A server that wants `Authorization: Bearer <want>` (changed by the test), 401 otherwise.
fn wants(want: &Arc<Mutex<String>>) -> Arc<Answer> {
    let want = want.clone();
    Arc::new(move |s: &Seen| {
        let ok = s.headers.get("authorization") == Some(&format!("Bearer {}", want.lock().unwrap()));
        if ok {
            (200, json!({"charged": true}).to_string())
        } else {
            (401, json!({"error": "bad token"}).to_string())
        }
    })
}

#[tokio::test]
async fn secret_values_are_read_once_and_kept_until_their_maximum_age() {
    let want = Arc::new(Mutex::new("k1".to_owned()));
    let (url, seen) = server(wants(&want)).await;
    let source = Arc::new(FakeSecrets::default());
    source.set(&secret_ref(), r#"{"token": "k1", "other": "x"}"#);
    let agent = agent_with(&url, source.clone(), Duration::from_millis(300));
    assert_eq!(call(&agent).await.unwrap(), json!({"charged": true}));
    assert_eq!(call(&agent).await.unwrap(), json!({"charged": true}));
    assert_eq!(source.reads(), 1, "the second call used the cached value");
    tokio::time::sleep(Duration::from_millis(350)).await;
    call(&agent).await.unwrap();
    assert_eq!(source.reads(), 2, "past its maximum age the value is read again");
    assert_eq!(seen.lock().unwrap().len(), 3);
    assert!(seen.lock().unwrap().iter().all(|s| s.headers["authorization"] == "Bearer k1"));
}

#[tokio::test]
async fn a_401_to_a_cached_value_reads_the_secret_again_and_repeats_the_call_once() {
    let want = Arc::new(Mutex::new("k1".to_owned()));
    let (url, seen) = server(wants(&want)).await;
    let source = Arc::new(FakeSecrets::default());
    source.set(&secret_ref(), r#"{"token": "k1"}"#);
    let agent = agent_with(&url, source.clone(), Duration::from_mins(5));
    call(&agent).await.unwrap();
    // rotated: the store and the server have k2, the agent's cache still k1
    source.set(&secret_ref(), r#"{"token": "k2"}"#);
    *want.lock().unwrap() = "k2".into();
    assert_eq!(call(&agent).await.unwrap(), json!({"charged": true}));
    assert_eq!(source.reads(), 2);
    let auths: Vec<String> = seen.lock().unwrap().iter().map(|s| s.headers["authorization"].clone()).collect();
    assert_eq!(auths, ["Bearer k1", "Bearer k1", "Bearer k2"]);
    // the same idempotency key on the repeated call
    let keys: Vec<String> = seen.lock().unwrap().iter().map(|s| s.headers["idempotency-key"].clone()).collect();
    assert!(keys.iter().all(|k| k == "t-1:charge"), "{keys:?}");
    // and the new value is cached
    call(&agent).await.unwrap();
    assert_eq!(source.reads(), 2);
}

#[tokio::test]
async fn values_still_refused_after_a_refresh_fail_for_good_naming_the_header_and_the_secret_not_the_value() {
    let want = Arc::new(Mutex::new("k1".to_owned()));
    let (url, seen) = server(wants(&want)).await;
    let source = Arc::new(FakeSecrets::default());
    source.set(&secret_ref(), r#"{"token": "k1"}"#);
    let agent = agent_with(&url, source.clone(), Duration::from_mins(5));
    call(&agent).await.unwrap();
    *want.lock().unwrap() = "k3".into(); // the server wants what the store does not have
    let e = call(&agent).await.unwrap_err();
    let AgentError::Permanent { message } = &e else { panic!("expected a permanent error, got {e:?}") };
    assert!(message.contains("HTTP 401") && message.contains("header authorization"), "{message}");
    assert!(message.contains(SECRET) && message.contains("key \"token\""), "{message}");
    assert!(!message.contains("k1"), "{message}");
    assert_eq!(seen.lock().unwrap().len(), 3, "one repeat, not more");
    assert_eq!(source.reads(), 2);
    // values read for this very call and refused: no second read, no repeat
    let fresh = agent_with(&url, source.clone(), Duration::from_mins(5));
    assert!(matches!(call(&fresh).await, Err(AgentError::Permanent { .. })));
    assert_eq!((source.reads(), seen.lock().unwrap().len()), (3, 4));
}

#[tokio::test]
async fn a_403_is_a_refusal_too_and_other_4xx_are_not_retried_with_new_values() {
    let (url, seen) = server(Arc::new(|s: &Seen| {
        if s.headers.get("authorization").is_some_and(|v| v == "Bearer old") {
            (403, "{}".into())
        } else {
            (422, r#"{"error": "declined"}"#.into())
        }
    }))
    .await;
    let source = Arc::new(FakeSecrets::default());
    source.set(&secret_ref(), r#"{"token": "old"}"#);
    let agent = agent_with(&url, source.clone(), Duration::from_mins(5));
    let _ = agent.secrets.as_ref().unwrap().get().await.unwrap(); // cached
    source.set(&secret_ref(), r#"{"token": "new"}"#);
    let e = call(&agent).await.unwrap_err();
    assert!(matches!(&e, AgentError::Permanent { message } if message.contains("HTTP 422")), "{e:?}");
    assert_eq!(seen.lock().unwrap().len(), 2, "403 → refreshed → 422 (not repeated)");
    assert_eq!(source.reads(), 2);
}

#[tokio::test]
async fn fetch_errors_are_classified_and_name_the_secret() {
    let (url, seen) = server(Arc::new(|_: &Seen| (200, "{}".into()))).await;
    let source = Arc::new(FakeSecrets::default());
    *source.fail.lock().unwrap() = Some(FetchError::Transient("reading secret x: ThrottlingException".into()));
    let agent = agent_with(&url, source.clone(), Duration::from_mins(5));
    assert!(matches!(call(&agent).await, Err(AgentError::Transient { .. })));
    *source.fail.lock().unwrap() = None; // not found
    let e = call(&agent).await.unwrap_err();
    assert!(matches!(&e, AgentError::Permanent { message } if message.contains(SECRET)), "{e:?}");
    // a value without the key asked, or one that cannot be a header: configuration errors
    source.set(&secret_ref(), r#"{"nottoken": "s3cr3t"}"#);
    let e = call(&agent).await.unwrap_err();
    assert!(
        matches!(&e, AgentError::Permanent { message } if message.contains("no such key") && !message.contains("s3cr3t")),
        "{e:?}"
    );
    source.set(&secret_ref(), "not json s3cr3t");
    let e = call(&agent).await.unwrap_err();
    assert!(matches!(&e, AgentError::Permanent { message } if !message.contains("s3cr3t")), "{e:?}");
    source.set(&secret_ref(), "{\"token\": \"line\\nbreak s3cr3t\"}");
    let e = call(&agent).await.unwrap_err();
    assert!(
        matches!(&e, AgentError::Permanent { message } if message.contains("not a valid HTTP header value") && !message.contains("s3cr3t")),
        "{e:?}"
    );
    assert!(seen.lock().unwrap().is_empty(), "nothing was sent without its headers");
}

#[tokio::test]
async fn no_debug_output_shows_a_secret_value() {
    let want = Arc::new(Mutex::new("sup3rs3cret".to_owned()));
    let (url, _) = server(wants(&want)).await;
    let source = Arc::new(FakeSecrets::default());
    source.set(&secret_ref(), r#"{"token": "sup3rs3cret"}"#);
    let agent = agent_with(&url, source.clone(), Duration::from_mins(5));
    call(&agent).await.unwrap();
    let values = agent.secrets.as_ref().unwrap().get().await.unwrap();
    assert!(!values.fresh);
    let shown = format!("{agent:?} {:?} {:?}", values.values, SecretText::new("sup3rs3cret"));
    assert!(!shown.contains("sup3rs3cret"), "{shown}");
    assert!(shown.contains("header authorization") && shown.contains(SECRET), "{shown}");
}

fn build(entry: &Value) -> Result<Arc<dyn Agent>, AgentConfigError> {
    let kind: HttpKind = serde_json::from_value(entry.clone()).map_err(|e| AgentConfigError::Json(e.to_string()))?;
    let cx = BuildContext {
        http: super::client(),
        max_response_bytes: 1024,
        callback: crate::agent::CallbackEndpoints::default(),
        aws: AwsConfigCell::default(),
    };
    kind.build("pay", &cx)
}

#[test]
fn sign_and_headers_are_validated_when_the_agent_is_built() {
    let ok = json!({"url": "https://api.example.com/pay", "sign": {"service": "execute-api", "region": "eu-west-1"},
        "headers": {"X-Api-Key": {"parameter": "/pay/key"}, "X-Tenant": {"secret": "tenant", "key": "id", "prefix": "T "}},
        "secret_max_age_ms": 60000});
    build(&ok).unwrap();
    let invalid = |entry: Value, needle: &str| match build(&entry) {
        Err(AgentConfigError::Invalid { agent, message }) => {
            assert_eq!(agent, "pay");
            assert!(message.contains(needle), "{message} lacks {needle}");
        }
        Err(other) => panic!("expected Invalid for {entry}, got {other:?}"),
        Ok(_) => panic!("expected Invalid for {entry}, got an agent"),
    };
    let url = "https://api.example.com/pay";
    invalid(json!({"url": url, "sign": {"service": " "}}), "sign.service is empty");
    invalid(json!({"url": url, "sign": {"service": "lambda", "region": ""}}), "sign.region is empty");
    invalid(json!({"url": url, "headers": {"Bad Name": {"secret": "s"}}}), "not a valid HTTP header name");
    invalid(json!({"url": url, "headers": {"X-A": {"secret": ""}}}), "the secret is empty");
    invalid(json!({"url": url, "headers": {"X-A": {"parameter": " "}}}), "the parameter is empty");
    invalid(json!({"url": url, "headers": {"X-A": {"secret": "s", "parameter": "p"}}}), "not both");
    invalid(json!({"url": url, "headers": {"X-A": {"prefix": "Bearer "}}}), "needs \"secret\" or \"parameter\"");
    invalid(json!({"url": url, "headers": {"X-A": {"secret": "s", "key": ""}}}), "the key is empty");
    invalid(json!({"url": url, "headers": {"X-A": {"secret": "s", "prefix": "a\nb"}}}), "prefix");
    invalid(json!({"url": url, "headers": {"Idempotency-Key": {"secret": "s"}}}), "set by the agent itself");
    invalid(json!({"url": url, "headers": {"X-Amz-Date": {"secret": "s"}}}), "set by the agent itself");
    invalid(json!({"url": url, "headers": {"X-Key": {"secret": "s"}, "x-key": {"parameter": "p"}}}), "given twice");
    invalid(
        json!({"url": url, "sign": {"service": "execute-api"}, "headers": {"Authorization": {"secret": "s"}}}),
        "SigV4 signature",
    );
    // without sign, Authorization may come from a secret
    build(&json!({"url": url, "headers": {"Authorization": {"secret": "s", "prefix": "Bearer "}}})).unwrap();
    // unknown fields are refused by the parser
    assert!(matches!(
        build(&json!({"url": url, "sign": {"service": "lambda", "regoin": "x"}})),
        Err(AgentConfigError::Json(_))
    ));
    assert!(matches!(
        build(&json!({"url": url, "headers": {"X-A": {"secret": "s", "value": "v"}}})),
        Err(AgentConfigError::Json(_))
    ));
}

#[test]
fn the_configuration_file_carries_sign_and_headers_through_variables() {
    let file = r#"{"agents": {"pay": {"kind": "http", "url": "${PAY_URL}", "sign": {"service": "lambda"},
        "headers": {"X-Api-Key": {"secret": "${PAY_SECRET_ARN}", "key": "api_key"}}}}}"#;
    let vars = |k: &str| match k {
        "PAY_URL" => Some("https://abc.lambda-url.us-east-1.on.aws/".to_owned()),
        "PAY_SECRET_ARN" => Some(SECRET.to_owned()),
        _ => None,
    };
    let rt = AgentRuntime::from_config(file, &vars).unwrap();
    assert!(rt.knows("pay"));
    let survey = crate::agent::survey(file, &vars).unwrap();
    assert_eq!(
        survey[0].grants,
        [
            Grant::new("lambda:InvokeFunctionUrl", "https://abc.lambda-url.us-east-1.on.aws", "AgentSignedApiArns"),
            Grant::new("secretsmanager:GetSecretValue", SECRET, "AgentSecretArns"),
        ]
    );
    let bad = r#"{"agents": {"pay": {"kind": "http", "url": "https://x", "headers": {"X-Api-Key": {"secret": ""}}}}}"#;
    assert!(matches!(AgentRuntime::from_config(bad, &|_| None), Err(AgentConfigError::Invalid { .. })));
}

#[test]
fn grants_name_each_secret_parameter_and_signed_url() {
    let kind: HttpKind =
        serde_json::from_value(json!({"url": "https://a.execute-api.us-east-1.amazonaws.com/prod/pay",
        "sign": {"service": "execute-api"},
        "headers": {"X-A": {"secret": "s1"}, "X-B": {"secret": "s1", "key": "b"},
                    "X-C": {"parameter": "arn:aws:ssm:us-east-1:000000000000:parameter/c"}}}))
        .unwrap();
    assert_eq!(
        kind.grants(),
        [
            Grant::new(
                "execute-api:Invoke",
                "https://a.execute-api.us-east-1.amazonaws.com/prod/pay",
                "AgentSignedApiArns"
            ),
            Grant::new("secretsmanager:GetSecretValue", "s1", "AgentSecretArns"),
            Grant::new("ssm:GetParameter", "arn:aws:ssm:us-east-1:000000000000:parameter/c", "AgentParameterArns"),
        ]
    );
    let plain: HttpKind = serde_json::from_value(json!({"url": "https://x", "sign": {"service": "es"}})).unwrap();
    assert!(plain.grants().is_empty());
}

fn static_aws(session_token: Option<&str>) -> AwsConfigCell {
    let creds = aws_credential_types::Credentials::new(
        "AKIDEXAMPLE",
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        session_token.map(str::to_owned),
        None,
        "test",
    );
    AwsConfigCell::with(
        aws_config::SdkConfig::builder()
            .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(creds))
            .region(aws_config::Region::new("us-west-2"))
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build(),
    )
}

#[tokio::test]
async fn a_signed_request_signs_every_header_it_sends_and_the_body() {
    let (url, seen) = server(Arc::new(|_: &Seen| (200, "{}".into()))).await;
    let source = Arc::new(FakeSecrets::default());
    source.set(&SecretRef::Parameter("/k".into()), "v1");
    let header = SecretHeader {
        name: "x-api-key".parse().unwrap(),
        source: SecretRef::Parameter("/k".into()),
        key: None,
        prefix: String::new(),
    };
    let agent = HttpAgent::new(super::client(), &url, 1024)
        .with_signer(Signer::new("execute-api", None, static_aws(Some("TOKEN"))))
        .with_secret_headers(SecretHeaders::new(vec![header], source, Duration::from_secs(1)));
    call(&agent).await.unwrap();
    let s = seen.lock().unwrap()[0].clone();
    let auth = &s.headers["authorization"];
    let today = &s.headers["x-amz-date"][..8];
    assert!(
        auth.starts_with(&format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{today}/us-west-2/execute-api/aws4_request, "
        )),
        "{auth}"
    );
    assert!(
        auth.contains(
            "SignedHeaders=content-type;host;idempotency-key;x-amz-date;x-amz-security-token;x-api-key;x-request-deadline;x-task-id,"
        ),
        "{auth}"
    );
    assert_eq!(s.headers["x-amz-security-token"], "TOKEN");
    assert_eq!(s.headers["x-api-key"], "v1");
    assert_eq!(s.path, "/charge");
    assert_eq!(serde_json::from_slice::<Value>(&s.body).unwrap()["idempotency_key"], "t-1:charge");
    // the region of the configuration wins over the function's
    let agent = HttpAgent::new(super::client(), &url, 1024).with_signer(Signer::new(
        "lambda",
        Some("eu-central-1".into()),
        static_aws(None),
    ));
    call(&agent).await.unwrap();
    let s = seen.lock().unwrap()[1].clone();
    assert!(s.headers["authorization"].contains("/eu-central-1/lambda/aws4_request"), "{:?}", s.headers);
    assert!(!s.headers.contains_key("x-amz-security-token"));
}

#[tokio::test]
async fn without_credentials_signing_is_a_transient_error_and_nothing_is_sent() {
    let (url, seen) = server(Arc::new(|_: &Seen| (200, "{}".into()))).await;
    let aws = AwsConfigCell::with(
        aws_config::SdkConfig::builder()
            .region(aws_config::Region::new("us-east-1"))
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build(),
    );
    let agent = HttpAgent::new(super::client(), &url, 1024).with_signer(Signer::new("execute-api", None, aws));
    let e = call(&agent).await.unwrap_err();
    assert!(matches!(&e, AgentError::Transient { message, .. } if message.contains("credentials")), "{e:?}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_refused_signature_is_a_permanent_failure_of_the_step() {
    let (url, _) = server(Arc::new(|_: &Seen| (403, r#"{"error": "signature: mismatch"}"#.into()))).await;
    let mut rt = AgentRuntime::new(CallRetry { max_calls: 3, base_ms: 1, max_ms: 5 });
    rt.register(
        "h",
        HttpAgent::new(super::client(), &url, 1024).with_signer(Signer::new("execute-api", None, static_aws(None))),
    );
    let out = rt.run(&req()).await.unwrap();
    assert!(
        matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("HTTP 403") && error.contains("SigV4-signed for execute-api")),
        "{out:?}"
    );
}

#[test]
fn secrets_manager_and_ssm_errors_are_classified_by_what_the_caller_should_do() {
    use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueError;
    use aws_sdk_ssm::operation::get_parameter::GetParameterError;
    use aws_smithy_runtime_api::client::result::SdkError;
    use aws_smithy_types::error::ErrorMetadata;

    use super::secrets::classify;

    fn raw(status: u16) -> aws_smithy_runtime_api::http::Response {
        aws_smithy_runtime_api::http::Response::new(
            status.try_into().unwrap(),
            aws_smithy_types::body::SdkBody::empty(),
        )
    }
    let meta = |code: &str| ErrorMetadata::builder().code(code).message("from the service").build();
    let sm = |code: &str, status: u16| {
        classify("reading secret s1", &SdkError::service_error(GetSecretValueError::generic(meta(code)), raw(status)))
    };
    let ssm = |code: &str, status: u16| {
        classify("reading parameter /p", &SdkError::service_error(GetParameterError::generic(meta(code)), raw(status)))
    };
    for code in ["ResourceNotFoundException", "AccessDeniedException", "InvalidParameterException", "DecryptionFailure"]
    {
        assert!(matches!(sm(code, 400), FetchError::Permanent(m) if m.contains("secret s1") && m.contains(code)));
    }
    for code in ["ParameterNotFound", "AccessDeniedException", "InvalidKeyId"] {
        assert!(matches!(ssm(code, 400), FetchError::Permanent(m) if m.contains("parameter /p")));
    }
    for code in ["ThrottlingException", "InternalServiceError", "InternalServerError"] {
        assert!(matches!(sm(code, 500), FetchError::Transient(_)), "{code}");
        assert!(matches!(ssm(code, 500), FetchError::Transient(_)), "{code}");
    }
    let timeout: SdkError<GetSecretValueError, aws_smithy_runtime_api::http::Response> =
        SdkError::timeout_error("attempt timed out");
    assert!(matches!(classify("reading secret s1", &timeout), FetchError::Transient(m) if m.contains("secret s1")));
}

#[tokio::test]
async fn the_task_trace_goes_to_the_service_as_x_amzn_trace_id() {
    let (url, seen) = server(Arc::new(|_: &Seen| (200, "{}".into()))).await;
    let agent = HttpAgent::new(super::client(), &url, 1024);
    let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    crate::trace::scope(Some(h.into()), call(&agent)).await.unwrap();
    call(&agent).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].headers.get("x-amzn-trace-id").map(String::as_str), Some(h));
    assert_eq!(seen[1].headers.get("x-amzn-trace-id"), None, "a call outside a traced record sends none");
}
