//! The HTTP agent of sas-core (signing with `aws-sigv4`) against the order service verifying SigV4
//! with its own implementation: what the agent signs is accepted, anything else refused (403,
//! a permanent failure of the step).

use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_order_service::sigv4::Verifier;
use sas_order_service::{spawn_service, OrderService};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use serde_json::json;

fn aws(key_id: &str, secret: &str, session_token: Option<&str>) -> AwsConfigCell {
    let creds = aws_credential_types::Credentials::new(key_id, secret, session_token.map(str::to_owned), None, "test");
    AwsConfigCell::with(
        aws_config::SdkConfig::builder()
            .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(creds))
            .region(aws_config::Region::new("eu-west-1"))
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build(),
    )
}

fn request(agent: &str, order: &str) -> AgentRequest {
    let input = json!({"customer": "c-1", "amount_cents": 1250});
    AgentRequest::first_attempt(TaskId::try_from(order).unwrap(), "charge", agent, input, Millis::now().plus_ms(10_000))
}

const AGENTS: &str = r#"{"agents": {
    "signed":   {"kind": "http", "url": "${BASE}/payment/charge", "sign": {"service": "execute-api"}},
    "lambda":   {"kind": "http", "url": "${BASE}/payment/charge", "sign": {"service": "lambda"}},
    "unsigned": {"kind": "http", "url": "${BASE}/payment/charge"}
}}"#;

fn runtime(base: &str, aws: AwsConfigCell) -> AgentRuntime {
    let base = base.to_owned();
    AgentRuntime::from_config_with(AGENTS, &move |k| (k == "BASE").then(|| base.clone()), aws).unwrap()
}

fn refused(out: &Outcome, why: &str) -> bool {
    matches!(out, Outcome::Failed { retryable: false, error } if error.contains("HTTP 403") && error.contains(why))
}

#[tokio::test]
async fn signed_requests_are_accepted_and_unsigned_or_wrongly_signed_ones_refused_for_good() {
    let svc = OrderService::new();
    svc.verify_sigv4(Some(Verifier::new("AKIDTEST", "s3cr3t/key+1", Some("execute-api".into()))));
    let base = spawn_service(&svc).await.unwrap();

    // the function's credentials, with a session token (signed as x-amz-security-token)
    let rt = runtime(&base, aws("AKIDTEST", "s3cr3t/key+1", Some("session-token")));
    let out = rt.run(&request("signed", "o-1")).await.unwrap();
    assert!(
        matches!(&out.outcome, Outcome::Succeeded { output } if output["amount_cents"] == 1250 && output.get("charge_id").is_some()),
        "{out:?}"
    );
    assert_eq!(svc.ledger().len(), 1);

    let out = rt.run(&request("unsigned", "o-2")).await.unwrap();
    assert!(refused(&out.outcome, "missing Authorization"), "{out:?}");
    let out = rt.run(&request("lambda", "o-3")).await.unwrap();
    assert!(refused(&out.outcome, "signed for service lambda"), "{out:?}");
    let other = runtime(&base, aws("AKIDTEST", "another-secret", None));
    let out = other.run(&request("signed", "o-4")).await.unwrap();
    assert!(refused(&out.outcome, "signature does not match"), "{out:?}");
    assert_eq!(svc.ledger().len(), 1, "nothing refused was applied");
    assert_eq!(svc.auth_refusals().iter().map(|r| r.status).collect::<Vec<_>>(), [403, 403, 403]);
}

#[tokio::test]
async fn an_api_key_is_checked_after_the_signature() {
    let svc = OrderService::new();
    svc.require_header("x-api-key", Some("k1"));
    let base = spawn_service(&svc).await.unwrap();
    let http = reqwest::Client::new();
    let post = |key: Option<&'static str>| {
        let mut r = http
            .post(format!("{base}/payment/charge"))
            .header("idempotency-key", "o-9:charge")
            .json(&json!({"task_id": "o-9", "input": {}}));
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        r.send()
    };
    assert_eq!(post(None).await.unwrap().status(), 401);
    assert_eq!(post(Some("k0")).await.unwrap().status(), 401);
    assert_eq!(post(Some("k1")).await.unwrap().status(), 200);
    let reasons: Vec<String> = svc.auth_refusals().into_iter().map(|r| r.reason).collect();
    assert_eq!(reasons, ["missing or wrong x-api-key header", "missing or wrong x-api-key header"]);
    // health checks pass without it
    assert_eq!(http.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);
}
