//! The approval agent against SNS: the token, the task, the input and the ways to answer reach a
//! subscriber of the approval topic; the hand-off reports nothing (the step waits for a person);
//! a topic that does not exist fails the attempt for good. No stack needed: a topic and a queue
//! of the test's own.

use std::time::{Duration, Instant};

use sas_core::agent::{AgentRuntime, ApprovalAgent, CallRetry, CallbackEndpoints};
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use serde_json::json;

fn request(task: &str, attempt: &AttemptToken) -> AgentRequest {
    let input = json!({"customer": "c-9", "amount_cents": 125_000});
    AgentRequest::first_attempt(
        TaskId::try_from(task).unwrap(),
        "approve",
        "approval",
        input,
        Millis::now().plus_ms(30_000),
    )
    .with_attempt(attempt.clone())
    .with_callback(None)
}

fn runtime(topic_arn: &str) -> AgentRuntime {
    let ends = CallbackEndpoints { queue_url: Some("http://q/000000000000/cb".into()), url: None };
    let mut rt = AgentRuntime::new(CallRetry { max_calls: 2, base_ms: 10, max_ms: 50 });
    rt.register("approval", ApprovalAgent::new(topic_arn, ends));
    rt
}

#[tokio::test]
async fn an_approval_request_reaches_the_topic_with_the_token_and_the_commands() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let sdk = sas_core::aws::load_sdk_config().await;
    let (sns, sqs) = (aws_sdk_sns::Client::new(&sdk), aws_sdk_sqs::Client::new(&sdk));
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let topic = sns.create_topic().name(format!("t-approvals-{run}")).send().await.unwrap().topic_arn.unwrap();
    let (queue, arn) = crate::common::create_queue(&sqs, &format!("t-approver-{run}"), false).await;
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .unwrap();

    let attempt = AttemptToken::fresh();
    let req = request(&format!("appr-{run}"), &attempt);
    let token = req.callback.as_ref().unwrap().token.expose();
    assert_eq!(runtime(&topic).run(&req).await, None, "a hand-off SNS took reports nothing: the step waits");

    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let got = sqs.receive_message().queue_url(&queue).wait_time_seconds(2).send().await.unwrap();
        if let Some(m) = got.messages.unwrap_or_default().into_iter().next() {
            break m.body.unwrap();
        }
        assert!(Instant::now() < deadline, "the approval request never reached the subscriber");
    };
    assert!(body.contains(&format!("Task appr-{run} waits for your approval at step approve.")), "{body}");
    assert!(body.contains(&format!("sasctl approve {token} --comment")), "{body}");
    assert!(body.contains(&format!("sasctl reject {token} --reason")), "{body}");
    assert!(body.contains("\"amount_cents\": 125000"), "{body}");
    assert!(body.contains("callback queue http://q/000000000000/cb"), "{body}");

    // a topic that does not exist: the attempt fails for good, with the reason
    let missing = topic.replace(&format!("t-approvals-{run}"), &format!("t-none-{run}"));
    let out = runtime(&missing).run(&request(&format!("appr2-{run}"), &AttemptToken::fresh())).await.unwrap();
    assert!(
        matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("publishing to")),
        "{out:?}"
    );

    let _ = sns.delete_topic().topic_arn(&topic).send().await;
    let _ = sqs.delete_queue().queue_url(&queue).send().await;
}
