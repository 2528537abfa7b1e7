//! HTTP agents with authentication against LocalStack's Secrets Manager and SSM: an agent built
//! from an agents.json entry with `sign` and `headers` calls the order service (in-process) that
//! verifies SigV4 with its own implementation and wants an API key from a secret and a client key
//! from a SecureString. Signed: accepted; unsigned: 403, failed for good; the secret rotated while
//! the agent holds the old value: 401, read again, accepted.

use aws_credential_types::provider::ProvideCredentials;
use sas_core::agent::{survey, AgentRuntime, AwsConfigCell, Grant};
use sas_order_service::sigv4::Verifier;
use sas_order_service::{spawn_service, OrderService};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use serde_json::json;

fn request(agent: &str, order: &str) -> AgentRequest {
    let input = json!({"customer": "c-1", "amount_cents": 700});
    AgentRequest::first_attempt(TaskId::try_from(order).unwrap(), "charge", agent, input, Millis::now().plus_ms(30_000))
}

const AGENTS: &str = r#"{"agents": {
    "pay": {"kind": "http", "url": "${BASE}/payment/charge", "sign": {"service": "execute-api"},
            "headers": {"X-Auth": {"secret": "${SECRET_ARN}", "key": "token", "prefix": "Token "},
                        "X-Client-Key": {"parameter": "${PARAM}"}}},
    "pay-unsigned": {"kind": "http", "url": "${BASE}/payment/charge",
            "headers": {"X-Auth": {"secret": "${SECRET_ARN}", "key": "token", "prefix": "Token "},
                        "X-Client-Key": {"parameter": "${PARAM}"}}},
    "pay-missing": {"kind": "http", "url": "${BASE}/payment/charge", "sign": {"service": "execute-api"},
            "headers": {"X-Auth": {"secret": "${MISSING}"}}}
}}"#;

#[tokio::test]
async fn http_agents_sign_and_take_headers_from_secrets_and_read_a_rotated_secret_again() {
    sas_core::telemetry::init();
    assert!(
        std::env::var("AWS_ENDPOINT_URL").is_ok() || std::env::var("SAS_TEST_AGAINST_AWS").is_ok(),
        "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)"
    );
    let sdk = sas_core::aws::load_sdk_config().await;
    let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let sm = aws_sdk_secretsmanager::Client::new(&sdk);
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let secret_arn = sm
        .create_secret()
        .name(format!("t-auth-{id}/api"))
        .secret_string(r#"{"token": "tok-1", "note": "rotated by the test"}"#)
        .send()
        .await
        .expect("CreateSecret")
        .arn
        .expect("the secret's ARN");
    let param = format!("/t-auth-{id}/client-key");
    ssm.put_parameter()
        .name(&param)
        .value("ck-1")
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .expect("PutParameter");

    // the service verifies signatures made with the credentials the agent has
    let creds = sdk.credentials_provider().expect("credentials").provide_credentials().await.unwrap();
    let svc = OrderService::new();
    svc.verify_sigv4(Some(Verifier::new(creds.access_key_id(), creds.secret_access_key(), Some("execute-api".into()))));
    svc.require_header("x-auth", Some("Token tok-1"));
    svc.require_header("x-client-key", Some("ck-1"));
    let base = spawn_service(&svc).await.unwrap();

    let missing = format!("t-auth-{id}/no-such-secret");
    let vars = |k: &str| match k {
        "BASE" => Some(base.clone()),
        "SECRET_ARN" => Some(secret_arn.clone()),
        "PARAM" => Some(param.clone()),
        "MISSING" => Some(missing.clone()),
        _ => None,
    };
    let rt = AgentRuntime::from_config_with(AGENTS, &vars, AwsConfigCell::with(sdk.clone())).unwrap();
    let grants = &survey(AGENTS, &vars).unwrap().into_iter().find(|s| s.name == "pay").unwrap().grants;
    assert_eq!(
        grants,
        &[
            Grant::new("execute-api:Invoke", format!("{base}/payment/charge"), "AgentSignedApiArns"),
            Grant::new("secretsmanager:GetSecretValue", secret_arn.clone(), "AgentSecretArns"),
            Grant::new("ssm:GetParameter", param.clone(), "AgentParameterArns"),
        ]
    );

    // signed, with both headers: accepted
    let out = rt.run(&request("pay", "o-1")).await.unwrap();
    assert!(matches!(&out.outcome, Outcome::Succeeded { output } if output["amount_cents"] == 700), "{out:?}");
    assert!(svc.auth_refusals().is_empty(), "{:?}", svc.auth_refusals());

    // not signed: 403, a permanent failure
    let out = rt.run(&request("pay-unsigned", "o-2")).await.unwrap();
    assert!(
        matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("HTTP 403") && error.contains("signature: missing Authorization")),
        "{out:?}"
    );

    // a secret that does not exist: a configuration error naming it, nothing sent
    let refusals = svc.auth_refusals().len();
    let out = rt.run(&request("pay-missing", "o-3")).await.unwrap();
    assert!(
        matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains(&missing) && error.contains("ResourceNotFound")),
        "{out:?}"
    );
    assert_eq!(svc.auth_refusals().len(), refusals);

    // rotated: the store and the service have tok-2, the agent's cache tok-1 → 401 → read → accepted
    sm.put_secret_value()
        .secret_id(&secret_arn)
        .secret_string(r#"{"token": "tok-2"}"#)
        .send()
        .await
        .expect("PutSecretValue");
    svc.require_header("x-auth", Some("Token tok-2"));
    let out = rt.run(&request("pay", "o-4")).await.unwrap();
    assert!(matches!(&out.outcome, Outcome::Succeeded { .. }), "{out:?}");
    let statuses: Vec<(u16, String)> = svc.auth_refusals().into_iter().map(|r| (r.status, r.reason)).collect();
    assert_eq!(
        statuses,
        [
            (403, "signature: missing Authorization header (SigV4 required)".to_owned()),
            (401, "missing or wrong x-auth header".to_owned()),
        ]
    );
    let orders: Vec<String> = svc.ledger().into_iter().map(|e| e.order).collect();
    assert_eq!(orders, ["o-1", "o-4"], "only accepted calls were applied, once each");

    // nothing of the values reached the step's output
    let shown = format!("{out:?}");
    assert!(!shown.contains("tok-") && !shown.contains("ck-1"), "{shown}");

    let _ = sm.delete_secret().secret_id(&secret_arn).force_delete_without_recovery(true).send().await;
    let _ = ssm.delete_parameter().name(&param).send().await;
}
