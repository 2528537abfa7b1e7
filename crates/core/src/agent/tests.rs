//! Tests of the agent runtime, the simulated agent and the agent configuration.

use std::time::Duration;

use serde_json::{json, Value};

use super::config::{expand, AgentConfigError, BUILT_IN_AGENTS};
use super::runtime::{execution_deadline, AgentRuntime, CallRetry};
use super::sim::SimAgent;
use crate::ids::{AttemptToken, Millis, TaskId};
use crate::messages::{AgentRequest, Outcome};

#[allow(clippy::needless_pass_by_value)]
fn req(sim: Value, attempt_no: u32, deadline_in_ms: u64) -> AgentRequest {
    let task_id = TaskId::try_from("t").unwrap();
    AgentRequest {
        attempt_no,
        ..AgentRequest::first_attempt(
            task_id,
            "charge",
            "sim",
            json!({"sim": {"charge": sim}}),
            Millis::now().plus_ms(deadline_in_ms),
        )
        .with_attempt(AttemptToken::from("a"))
    }
}

fn fast() -> AgentRuntime {
    let mut rt = AgentRuntime::new(CallRetry { max_calls: 4, base_ms: 1, max_ms: 5 });
    rt.register("sim", SimAgent);
    rt
}

#[tokio::test]
async fn success_carries_output() {
    let r = fast().run(&req(json!({}), 1, 5_000)).await.unwrap();
    assert!(matches!(r.outcome, Outcome::Succeeded { ref output } if output["idempotency_key"] == "t:charge"));
}

#[tokio::test]
async fn transient_errors_are_retried_within_the_attempt() {
    let r = fast().run(&req(json!({"fail_calls": 2}), 1, 5_000)).await.unwrap();
    assert!(matches!(r.outcome, Outcome::Succeeded { ref output } if output["calls"] == 3), "{r:?}");
}

#[tokio::test]
async fn too_many_transient_errors_report_a_retryable_failure() {
    let r = fast().run(&req(json!({"fail_calls": 10}), 1, 5_000)).await.unwrap();
    assert!(matches!(r.outcome, Outcome::Failed { retryable: true, .. }), "{r:?}");
}

#[tokio::test]
async fn an_agent_s_own_retry_is_its_alone_and_the_file_s_is_the_others() {
    let file = r#"{"agents": {
        "sim": {"kind": "sim"},
        "once": {"kind": "sim", "retry": {"max_calls": 1, "base_ms": 1, "max_ms": 5}}
    }, "retry": {"max_calls": 4, "base_ms": 1, "max_ms": 5}}"#;
    let rt = AgentRuntime::from_config(file, &|_| None).unwrap();
    let two_failures = |agent: &str| AgentRequest { agent: agent.into(), ..req(json!({"fail_calls": 2}), 1, 5_000) };
    let r = rt.run(&two_failures("sim")).await.unwrap();
    assert!(
        matches!(r.outcome, Outcome::Succeeded { ref output } if output["calls"] == 3),
        "the file's 4 calls: {r:?}"
    );
    let r = rt.run(&two_failures("once")).await.unwrap();
    assert!(matches!(r.outcome, Outcome::Failed { retryable: true, .. }), "its own 1 call: {r:?}");
    for bad in [
        r#"{"max_calls": 0, "base_ms": 1, "max_ms": 5}"#,
        r#"{"max_calls": 1, "base_ms": 9, "max_ms": 5}"#,
        r#"{"calls": 1}"#,
    ] {
        let file = format!(r#"{{"agents": {{"once": {{"kind": "sim", "retry": {bad}}}}}}}"#);
        let err = AgentRuntime::from_config(&file, &|_| None).unwrap_err().to_string();
        assert!(err.contains("agent once: retry"), "{bad}: {err}");
    }
}

#[tokio::test]
async fn a_key_in_use_is_asked_again_until_it_is_free_and_counts_no_failed_call() {
    // max_calls 4: ten answers that the key is in use (another call holds it) are no failures,
    // and two transient failures after them still have their budget
    let r = fast().run(&req(json!({"busy_calls": 10, "fail_calls": 12}), 1, 5_000)).await.unwrap();
    assert!(matches!(r.outcome, Outcome::Succeeded { ref output } if output["calls"] == 13), "{r:?}");
}

#[tokio::test]
async fn a_key_still_in_use_at_the_attempt_s_deadline_is_a_timeout() {
    // the holder may still apply the effect: not a failure of the service, an unknown outcome
    let mut r = req(json!({"busy_calls": 1_000_000}), 1, 60_300);
    r.start_by = Some(Millis::now().plus_ms(60_000));
    let started = std::time::Instant::now();
    let out = fast().run(&r).await.expect("said before CompleteBy");
    let took = started.elapsed();
    assert!(
        matches!(out.outcome, Outcome::TimedOut { ref error }
            if error.starts_with("timed out: the idempotency key was still in use") && error.contains("simulated 409")),
        "{out:?}"
    );
    assert!(took >= Duration::from_millis(290) && took < Duration::from_secs(5), "{took:?}");
    // at CompleteBy itself nothing is said: the Supervisor's timer decides
    assert!(fast().run(&req(json!({"busy_calls": 1_000_000}), 1, 200)).await.is_none());
}

/// Answers that the key is in use until the deadline is near; the call then runs until just before
/// the attempt's deadline and ends as a client's own timeout would (a transient error with no time
/// left for another call). It ends 50 ms early so the runtime's own cut at the deadline cannot win
/// the race on a loaded machine (both at the deadline, either may fire first: CI saw both); with
/// both expired, `tokio::time::timeout` polls the call first.
struct BusyThenClientTimeout;

impl super::runtime::Agent for BusyThenClientTimeout {
    fn call<'a>(
        &'a self,
        call: super::runtime::Call<'a>,
    ) -> futures::future::BoxFuture<'a, Result<Value, super::runtime::AgentError>> {
        Box::pin(async move {
            if Millis::now().until(call.deadline) > 100 {
                return Err(super::runtime::AgentError::KeyInUse {
                    message: "HTTP 409: in progress".into(),
                    retry_after: Some(Duration::from_millis(20)),
                });
            }
            tokio::time::sleep(Duration::from_millis(Millis::now().until(call.deadline).saturating_sub(50))).await;
            Err(super::runtime::AgentError::Transient {
                message: "timed out: error sending request".into(),
                // more than the time left: no other call
                retry_after: Some(Duration::from_secs(1)),
            })
        })
    }
}

#[tokio::test]
async fn a_key_in_use_whose_last_ask_ends_in_the_client_s_timeout_at_the_deadline_still_says_so() {
    // the last ask of a 409 loop may end in the HTTP client's own timeout (set to the deadline)
    // before the runtime's cut: the report still names the key in use, not only the timeout
    let mut rt = AgentRuntime::new(CallRetry { max_calls: 2, base_ms: 1, max_ms: 5 });
    rt.register("busy", BusyThenClientTimeout);
    let mut r = req(json!({}), 1, 60_300);
    r.start_by = Some(Millis::now().plus_ms(60_000));
    r.agent = "busy".into();
    let out = rt.run(&r).await.expect("said before CompleteBy");
    let Outcome::TimedOut { error } = out.outcome else { panic!("{out:?}") };
    assert!(error.starts_with("timed out: the idempotency key was still in use"), "{error}");
    assert!(error.contains("HTTP 409: in progress") && error.contains("the next call: timed out"), "{error}");
}

#[tokio::test]
async fn permanent_errors_are_reported_at_once() {
    let r = fast().run(&req(json!({"permanent": "declined"}), 1, 5_000)).await.unwrap();
    assert_eq!(r.outcome, Outcome::Failed { error: "declined".into(), retryable: false });
}

#[tokio::test]
async fn a_hung_call_is_cut_at_complete_by_and_nothing_is_sent() {
    let started = std::time::Instant::now();
    assert!(fast().run(&req(json!({"hang_attempts": 1}), 1, 200)).await.is_none());
    assert!(started.elapsed() < Duration::from_secs(2));
    // the next attempt answers
    assert!(fast().run(&req(json!({"hang_attempts": 1}), 2, 2_000)).await.is_some());
}

#[tokio::test]
async fn a_hung_call_that_ran_out_of_its_time_before_complete_by_is_reported_at_once() {
    // a hung call is reported at the attempt's own deadline, not at CompleteBy: the request may
    // wait in the queue until start_by (a 60 s budget here); started now it has its 200 ms: out
    // of time at +200 ms, it says so then, so the Scheduler retries now and not at CompleteBy
    // (+60.2 s), when the Supervisor would have found it.
    let mut r = req(json!({"hang_attempts": 1}), 1, 60_200);
    r.start_by = Some(Millis::now().plus_ms(60_000));
    let started = std::time::Instant::now();
    let out = fast().run(&r).await.expect("a timed-out attempt is reported before CompleteBy");
    assert!(matches!(out.outcome, Outcome::TimedOut { ref error } if error.starts_with("timed out")), "{out:?}");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(190) && took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn nothing_starts_after_complete_by() {
    let mut r = req(json!({}), 1, 0);
    r.complete_by = Millis(r.complete_by.0 - 1);
    assert!(fast().run(&r).await.is_none());
}

#[tokio::test]
async fn answers_after_complete_by_are_dropped() {
    assert!(fast().run(&req(json!({"delay_ms": 300}), 1, 100)).await.is_none());
}

#[tokio::test]
async fn unknown_agents_fail_permanently() {
    let mut r = req(json!({}), 1, 5_000);
    r.agent = "nope".into();
    let out = fast().run(&r).await.unwrap();
    assert!(matches!(out.outcome, Outcome::Failed { retryable: false, .. }));
}

/// A remote side that accepts every connection and never answers: a hung service, or an AWS
/// endpoint that hangs. Its connections are held open until the test ends.
async fn hanging_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    format!("http://{addr}")
}

/// An attempt that starts now with `ms` of execution time and a CompleteBy a minute later (its
/// request may wait in the queue until `start_by`): running out of time, it must say so.
fn attempt_with(agent: &str, ms: u64, callback: bool) -> AgentRequest {
    let start_by = Millis::now().plus_ms(60_000);
    let mut r = AgentRequest::first_attempt(
        TaskId::try_from("hung-1").unwrap(),
        "charge",
        agent,
        json!({"order": "o-1"}),
        start_by.plus_ms(ms),
    );
    r.start_by = Some(start_by);
    if callback {
        r.with_callback(None)
    } else {
        r
    }
}

/// AWS configuration pointing at `endpoint`, with the SDK's own operation timeout (`None`: the
/// runtime's cut at the deadline is the only one).
fn aws_at(endpoint: &str, operation_timeout: Option<Duration>) -> super::AwsConfigCell {
    let creds = aws_credential_types::Credentials::new("AKIDEXAMPLE", "secret", None, None, "test");
    let mut timeouts = aws_config::timeout::TimeoutConfig::builder();
    if let Some(t) = operation_timeout {
        timeouts = timeouts.operation_timeout(t).operation_attempt_timeout(t);
    }
    super::AwsConfigCell::with(
        aws_config::SdkConfig::builder()
            .endpoint_url(endpoint)
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(creds))
            .region(aws_config::Region::new("us-east-1"))
            .timeout_config(timeouts.build())
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build(),
    )
}

/// Whatever ends a call at the attempt's execution deadline (the runtime's cut, the client's own
/// timeout set to that deadline, a transient error with no time left), every kind of agent
/// reports `timed out` at the deadline while it is before CompleteBy; nothing is dropped as if
/// CompleteBy had passed. The HTTP client's timeout (the attempt's deadline) may win the race with
/// the runtime's cut: an attempt dropped then would be found by the Supervisor only at
/// CompleteBy + grace, five minutes later.
#[tokio::test]
async fn every_kind_reports_a_hung_remote_side_timed_out_at_the_attempt_s_deadline() {
    const MS: u64 = 600;
    let hung = hanging_endpoint().await;
    let agents = format!(
        r#"{{"agents": {{
            "http": {{"kind": "http", "url": "{hung}/payment/charge"}},
            "lambda": {{"kind": "lambda", "function": "charge"}},
            "lambda.async": {{"kind": "lambda", "function": "charge"}},
            "sqs": {{"kind": "sqs", "queue_url": "{hung}/000000000000/work"}},
            "sns": {{"kind": "sns", "topic_arn": "arn:aws:sns:us-east-1:000000000000:work"}},
            "eventbridge": {{"kind": "eventbridge", "bus": "work"}},
            "approval": {{"kind": "approval", "topic_arn": "arn:aws:sns:us-east-1:000000000000:approvals"}}
        }}, "retry": {{"max_calls": 5, "base_ms": 50, "max_ms": 200}}}}"#
    );
    // (agent, callback step): a call step waits for its answer, a callback step's hand-off too
    let cases = [
        ("http", false),
        ("http", true),
        ("lambda", false),
        ("lambda.async", true),
        ("sqs", true),
        ("sns", true),
        ("eventbridge", true),
        ("approval", true),
    ];
    for sdk_timeout in [None, Some(Duration::from_millis(MS))] {
        let rt = AgentRuntime::from_config_with(&agents, &|_| None, aws_at(&hung, sdk_timeout)).unwrap();
        for (agent, callback) in cases {
            let req = attempt_with(agent, MS, callback);
            let started = std::time::Instant::now();
            let out = rt.run(&req).await;
            let took = started.elapsed();
            let case = format!("{agent} (callback {callback}, SDK timeout {sdk_timeout:?})");
            let out = out.unwrap_or_else(|| panic!("{case}: nothing reported, {took:?} after the start"));
            assert!(
                matches!(&out.outcome, Outcome::TimedOut { error } if error.starts_with("timed out: no answer within the attempt's")),
                "{case}: {out:?}"
            );
            assert!(
                took >= Duration::from_millis(MS - 50) && took < Duration::from_millis(MS + 1_500),
                "{case}: {took:?}"
            );
        }
    }
}

/// A call whose own timeout fires at the attempt's deadline answers a transient error then (what
/// reqwest says when its timeout is the deadline): the attempt ran out of time, said so, with the
/// error; a success or a definite "no" that comes at the deadline is reported as it is.
#[tokio::test]
async fn what_ends_a_call_at_the_deadline_is_reported_by_one_rule() {
    use super::runtime::{report, CallsEnded};
    let (start, deadline, complete_by) = (Millis(1_000), Millis(6_000), Millis(306_000));
    let ended =
        CallsEnded::OutOfTime { calls: 1, last: Some("timed out: error sending request".into()), key_in_use: false };
    assert_eq!(
        report(&ended, deadline, start, deadline, complete_by),
        Some(Outcome::TimedOut {
            error: "timed out: no answer within the attempt's 5000 ms (after 1 calls; last error: timed out: error sending request)".into()
        })
    );
    // transient failures that used the call budget: a retryable failure before the deadline, a
    // timeout at or after it
    let gave_up = CallsEnded::GaveUp { error: "HTTP 503".into(), calls: 5 };
    assert!(matches!(
        report(&gave_up, Millis(5_999), start, deadline, complete_by),
        Some(Outcome::Failed { retryable: true, .. })
    ));
    assert!(
        matches!(report(&gave_up, deadline, start, deadline, complete_by), Some(Outcome::TimedOut { ref error }) if error.contains("HTTP 503"))
    );
    // answers for good are reported whenever they come before CompleteBy
    let ok = CallsEnded::Answered(Outcome::Succeeded { output: json!({"charge_id": "c-1"}) });
    assert!(matches!(report(&ok, Millis(6_001), start, deadline, complete_by), Some(Outcome::Succeeded { .. })));
    // nothing at or after CompleteBy, whatever it was
    for e in [ended, gave_up, ok] {
        assert_eq!(report(&e, complete_by, start, deadline, complete_by), None, "{e:?}");
    }
}

#[test]
fn configuration_expands_variables_and_flags_missing_ones() {
    assert_eq!(expand("${A}/x", &|_| Some("http://h:1/".into())).unwrap(), "http://h:1/x");
    assert_eq!(expand("${MISSING}/x", &|_| None), Err("MISSING".to_owned()));
    let vars = |k: &str| {
        Some(
            match k {
                "APPROVAL_TOPIC_ARN" => "arn:aws:sns:us-east-1:000000000000:a",
                "DEFAULT_EVENT_BUS_ARN" => "arn:aws:events:us-east-1:000000000000:event-bus/default",
                _ => "http://127.0.0.1:9",
            }
            .into(),
        )
    };
    let rt = AgentRuntime::from_config(BUILT_IN_AGENTS, &vars).unwrap();
    for a in [
        "sim",
        "inventory.reserve",
        "inventory.release",
        "payment.charge",
        "payment.refund",
        "shipping.ship",
        "approval",
        "orders.announce",
    ] {
        assert!(rt.knows(a), "{a}");
    }
    let bad = r#"{"agents": {"x": {"kind": "http", "url": "file:///etc/passwd"}}}"#;
    assert!(matches!(AgentRuntime::from_config(bad, &|_| None), Err(AgentConfigError::BadUrl { .. })));
}

#[tokio::test]
async fn an_unconfigured_agent_fails_permanently_with_the_missing_variable() {
    let rt = AgentRuntime::from_config(BUILT_IN_AGENTS, &|_| None).unwrap();
    let mut r = req(json!({}), 1, 5_000);
    r.agent = "payment.charge".into();
    let out = rt.run(&r).await.unwrap();
    assert!(
        matches!(out.outcome, Outcome::Failed { retryable: false, ref error } if error.contains("ORDER_SERVICE_URL")),
        "{out:?}"
    );
}

#[test]
fn call_backoff_is_capped() {
    let c = CallRetry { max_calls: 5, base_ms: 100, max_ms: 1_000 };
    assert_eq!(c.delay(1, 1.0), Duration::from_millis(100));
    assert_eq!(c.delay(3, 1.0), Duration::from_millis(400));
    assert_eq!(c.delay(30, 1.0), Duration::from_secs(1));
}

#[test]
fn queue_wait_is_not_taken_from_the_execution_time() {
    let mut r = req(json!({}), 1, 0);
    r.start_by = Some(Millis(10_000));
    r.complete_by = Millis(15_000); // a 5 s step with a 10 s queue budget
                                    // started early or late within the budget, the attempt has its 5 s
    assert_eq!(execution_deadline(&r, Millis(1_000)), Some(Millis(6_000)));
    assert_eq!(execution_deadline(&r, Millis(9_000)), Some(Millis(14_000)));
    assert_eq!(execution_deadline(&r, Millis(10_000)), Some(Millis(15_000)));
    // past its start_by the request is dropped unstarted
    assert_eq!(execution_deadline(&r, Millis(10_001)), None);
    // without a budget, CompleteBy bounds it as before
    r.start_by = None;
    assert_eq!(execution_deadline(&r, Millis(9_000)), Some(Millis(15_000)));
    assert_eq!(execution_deadline(&r, Millis(15_000)), None);
}

#[tokio::test]
async fn a_request_that_waited_past_its_start_by_starts_nothing() {
    let mut r = req(json!({}), 1, 5_000);
    r.start_by = Some(Millis::now().plus_ms(0).0.checked_sub(1).map(Millis).unwrap());
    assert!(fast().run(&r).await.is_none());
}

/// A one-shot HTTP server on loopback that answers every request with `status` and `body`.
async fn serve_once(status: &'static str, body: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = vec![0u8; 64 * 1024];
            let _ = sock.read(&mut buf).await;
            let head = format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        }
    });
    format!("http://{addr}/call")
}

fn http_runtime(url: &str, max: usize) -> AgentRuntime {
    let mut rt = AgentRuntime::new(CallRetry { max_calls: 2, base_ms: 1, max_ms: 5 });
    rt.register("h", super::http::HttpAgent::new(super::http::client(), url, max));
    rt
}

#[tokio::test]
async fn an_oversized_2xx_is_a_success_whose_output_says_it_was_truncated() {
    // the effect happened: a permanent "no" would leave it never compensated
    let url = serve_once("200 OK", format!("{{\"blob\": \"{}\"}}", "x".repeat(4_000))).await;
    let mut r = req(json!({}), 1, 5_000);
    r.agent = "h".into();
    let out = http_runtime(&url, 1_000).run(&r).await.unwrap();
    match out.outcome {
        Outcome::Succeeded { output } => assert_eq!(output["truncated"], json!(true), "{output}"),
        other => panic!("expected a success, got {other:?}"),
    }
}

#[tokio::test]
async fn a_409_says_the_key_is_in_use_and_is_asked_again_until_the_deadline() {
    // max_calls 2 does not bound it: the call holding the key may answer any moment
    let url = serve_once("409 Conflict", "{\"error\": \"in progress\"}".into()).await;
    let mut r = req(json!({}), 1, 60_300);
    r.start_by = Some(Millis::now().plus_ms(60_000));
    r.agent = "h".into();
    let out = http_runtime(&url, 1_000).run(&r).await.unwrap();
    let Outcome::TimedOut { error } = out.outcome else { panic!("{out:?}") };
    assert!(error.contains("still in use") && error.contains("HTTP 409: {\"error\": \"in progress\"}"), "{error}");
    let calls: u32 = error.split(" calls;").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(calls > 2, "{error}");
}

#[tokio::test]
async fn an_agent_may_say_its_service_means_by_409_a_conflict_for_good() {
    let url = serve_once("409 Conflict", "{\"error\": \"order already shipped\"}".into()).await;
    let config = |conflict: &str| format!(r#"{{"agents": {{"h": {{"kind": "http", "url": "{url}"{conflict}}}}}}}"#);
    let rt = AgentRuntime::from_config(&config(r#", "conflict": "permanent""#), &|_| None).unwrap();
    let mut r = req(json!({}), 1, 5_000);
    r.agent = "h".into();
    let started = std::time::Instant::now();
    let out = rt.run(&r).await.unwrap();
    assert!(
        matches!(out.outcome, Outcome::Failed { retryable: false, ref error } if error.contains("order already shipped")),
        "{out:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "answered at once");
    let bad = AgentRuntime::from_config(&config(r#", "conflict": "retry""#), &|_| None);
    assert!(bad.is_err(), "an unknown meaning is refused");
    assert!(AgentRuntime::from_config(&config(r#", "conflict": "key_in_use""#), &|_| None).is_ok());
}

fn callback_req(heartbeat_ms: Option<u64>) -> AgentRequest {
    let mut r = req(json!({}), 1, 5_000);
    let attempt = AttemptToken::from("0123456789abcdef0123456789abcdef");
    r.callback = Some(crate::messages::CallbackRef {
        token: crate::ids::CallbackToken::new(&r.task_id, &r.step, &attempt),
        heartbeat_ms,
    });
    r.attempt = attempt;
    r
}

#[test]
fn the_request_hands_over_the_token_and_where_to_answer_for_a_callback_step_only() {
    let ends = super::CallbackEndpoints {
        queue_url: Some("http://localhost:4566/000000000000/cb".into()),
        url: Some("https://x.lambda-url.us-east-1.on.aws".into()),
    };
    let body = |r: &AgentRequest, ends: &super::CallbackEndpoints| super::handover::request(r, Millis(77), ends);
    let plain = body(&req(json!({}), 1, 5_000), &ends);
    assert_eq!(
        plain.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["attempt_no", "deadline", "idempotency_key", "input", "step", "task_id"]
    );
    assert_eq!((plain["deadline"].as_u64(), plain["idempotency_key"].as_str()), (Some(77), Some("t:charge")));
    let r = callback_req(Some(10_000));
    let body = body(&r, &ends);
    assert_eq!(
        body["callback"],
        json!({
            "token": "0123456789abcdef0123456789abcdef:charge:t",
            "heartbeat_ms": 10_000,
            "queue_url": "http://localhost:4566/000000000000/cb",
            "url": "https://x.lambda-url.us-east-1.on.aws",
        })
    );
    assert_eq!(body["task_id"], "t");
    // a callback step's remote side has until CompleteBy, not the hand-off's own deadline
    assert_eq!(body["deadline"], r.complete_by.0);
    // nothing configured: only the token (and no heartbeat asked, none said)
    let body = super::handover::request(&callback_req(None), Millis(77), &super::CallbackEndpoints::default());
    assert_eq!(body["callback"], json!({"token": "0123456789abcdef0123456789abcdef:charge:t"}));
}

#[tokio::test]
async fn the_configured_callback_endpoints_reach_the_http_body_and_unset_ones_are_left_out() {
    // a server that records the body it got
    let (base, server) = record_one().await;
    let config = r#"{"agents": {"h": {"kind": "http", "url": "${BASE}/ship"}},
                     "callback": {"queue_url": "${CALLBACK_QUEUE_URL}", "url": "${CALLBACK_URL}"}}"#;
    let vars = |k: &str| match k {
        "BASE" => Some(base.clone()),
        "CALLBACK_QUEUE_URL" => Some("http://localhost:4566/000000000000/cb".to_owned()),
        _ => None, // CALLBACK_URL unset: left out
    };
    let rt = AgentRuntime::from_config(config, &vars).unwrap();
    let mut r = callback_req(Some(3_000));
    r.agent = "h".into();
    let _ = rt.run(&r).await;
    let body: Value = serde_json::from_slice(&server.await.unwrap().1).unwrap();
    assert_eq!(
        body["callback"],
        json!({"token": r.callback.as_ref().unwrap().token.expose(), "heartbeat_ms": 3_000, "queue_url": "http://localhost:4566/000000000000/cb"})
    );
}

#[test]
fn the_approval_agent_is_configured_from_its_topic() {
    let bad = r#"{"agents": {"a": {"kind": "approval", "topic_arn": "approvals"}}}"#;
    assert!(matches!(AgentRuntime::from_config(bad, &|_| None), Err(AgentConfigError::BadTopic { .. })));
    let unknown = r#"{"agents": {}, "callback": {"queue": "x"}}"#;
    assert!(matches!(AgentRuntime::from_config(unknown, &|_| None), Err(AgentConfigError::Json(_))));
}

#[tokio::test]
async fn an_approval_agent_without_its_topic_fails_permanently_naming_the_variable() {
    let rt = AgentRuntime::from_config(BUILT_IN_AGENTS, &|_| None).unwrap();
    let mut r = callback_req(None);
    r.agent = "approval".into();
    let out = rt.run(&r).await.unwrap();
    assert!(
        matches!(out.outcome, Outcome::Failed { retryable: false, ref error } if error.contains("APPROVAL_TOPIC_ARN")),
        "{out:?}"
    );
}

#[test]
fn every_agent_the_built_in_workflows_use_is_configured() {
    use crate::workflow::KindName::{Call, Callback, Wait};
    let rt = AgentRuntime::from_config(BUILT_IN_AGENTS, &|_| None).unwrap();
    let workflows = crate::workflow::WorkflowRegistry::from_json(crate::workflow::BUILT_IN_WORKFLOWS).unwrap();
    for wf in workflows.all() {
        for agent in wf.agents() {
            assert!(rt.knows(agent), "workflow {} uses agent {agent}, which config/agents.json lacks", wf.name);
        }
    }
    let kinds =
        |name: &str| workflows.resolve(name, None).unwrap().steps.iter().map(|s| s.kind.tag()).collect::<Vec<_>>();
    assert_eq!(kinds("order"), [Call, Call, Call], "order v1 stays as it was");
    assert_eq!(kinds("order-async"), [Call, Call, Wait, Callback]);
    assert_eq!(kinds("order-approval"), [Callback, Call, Call, Call]);
}

fn handed(sim: Value) -> AgentRequest {
    let mut r = req(sim, 1, 60_000);
    let token = crate::ids::CallbackToken::new(&r.task_id, &r.step, &r.attempt);
    r.callback = Some(crate::messages::CallbackRef { token, heartbeat_ms: Some(1_000) });
    r
}

#[tokio::test]
async fn a_callback_hand_off_that_the_remote_side_accepts_reports_nothing() {
    // the remote side's answer comes with the token later; the agent says nothing now
    assert_eq!(fast().run(&handed(json!({}))).await, None);
}

#[tokio::test]
async fn a_callback_hand_off_that_fails_is_reported_like_any_failed_attempt() {
    let out = fast().run(&handed(json!({"permanent": "no such warehouse"}))).await.unwrap();
    assert_eq!(out.outcome, Outcome::Failed { error: "no such warehouse".into(), retryable: false });
    let out = fast().run(&handed(json!({"fail_calls": 9}))).await.unwrap();
    assert!(matches!(out.outcome, Outcome::Failed { retryable: true, .. }), "{out:?}");
}

#[test]
fn max_in_flight_is_read_for_any_kind_and_checked() {
    let ok = r#"{"agents": {"a": {"kind": "sim", "max_in_flight": 5}, "b": {"kind": "sim"}}}"#;
    let rt = AgentRuntime::from_config(ok, &|_| None).unwrap();
    assert_eq!((rt.limit("a"), rt.limit("b")), (Some(5), None));
    let s = super::survey(ok, &|_| None).unwrap();
    assert_eq!(s.iter().map(|a| a.max_in_flight).collect::<Vec<_>>(), vec![Some(5), None]);
    for bad in ["0", "1001", "2.5", "\"3\"", "-1"] {
        let json = format!(r#"{{"agents": {{"a": {{"kind": "sim", "max_in_flight": {bad}}}}}}}"#);
        let e = AgentRuntime::from_config(&json, &|_| None).unwrap_err();
        assert!(e.to_string().contains("agent a: max_in_flight is") && e.to_string().contains("from 1 to 1000"), "{e}");
    }
}

#[test]
fn a_rate_is_read_for_any_kind_and_checked() {
    let ok = r#"{"agents": {"a": {"kind": "sim", "rate": {"per_second": 5, "burst": 2}}, "b": {"kind": "sim"}}}"#;
    let rt = AgentRuntime::from_config(ok, &|_| None).unwrap();
    assert_eq!(rt.rate("a"), Some(crate::limit::Rate { calls: 5, per_ms: 1_000, burst: 2 }));
    assert_eq!(rt.rate("b"), None);
    let s = super::survey(ok, &|_| None).unwrap();
    assert_eq!(s.iter().map(|a| a.rate.map(|r| r.calls)).collect::<Vec<_>>(), vec![Some(5), None]);
    for (bad, why) in [
        (r#"{"per_second": 5, "per_minute": 5}"#, "exactly one of per_second and per_minute"),
        (r#"{"per_second": 0}"#, "1 call per minute up to 200 a second"),
        (r#"{"per_second": 5, "burst": 9}"#, "burst must be from 1 to its calls per period (5)"),
        (r#"{"per_hour": 5}"#, "unknown field"),
    ] {
        let json = format!(r#"{{"agents": {{"a": {{"kind": "sim", "rate": {bad}}}}}}}"#);
        let e = AgentRuntime::from_config(&json, &|_| None).unwrap_err().to_string();
        assert!(e.contains("agent a: rate: ") && e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn agent_variables_give_an_agents_file_its_values_on_a_stack_and_bad_pairs_are_refused() {
    let given =
        super::parse_variables(" PAYMENT_URL=https://pay.example.com/v1 , WORK_QUEUE_URL=https://sqs/q,").unwrap();
    assert_eq!(given.len(), 2);
    assert_eq!(given["PAYMENT_URL"], "https://pay.example.com/v1");
    let file = r#"{"agents": {"pay": {"kind": "http", "url": "${PAYMENT_URL}/charge"}}}"#;
    let survey = super::survey(file, &|k| given.get(k).cloned()).unwrap();
    assert_eq!(survey[0].missing_var, None, "the variable is given");
    let survey = super::survey(file, &|_| None).unwrap();
    assert_eq!(survey[0].missing_var.as_deref(), Some("PAYMENT_URL"), "without it the agent is unconfigured");
    for bad in ["PAYMENT_URL", "payment_url=x", "1X=y", "A=1,A=2"] {
        let e = super::parse_variables(bad).unwrap_err();
        assert!(matches!(e, AgentConfigError::Variables(_)), "{bad}: {e}");
        assert!(e.to_string().starts_with("AgentVariables"), "{e}");
    }
    assert!(super::parse_variables("").unwrap().is_empty());
}

#[test]
fn a_variable_the_function_has_empty_comes_from_agent_variables() {
    // the template gives the Agent function ORDER_SERVICE_URL empty when OrderServiceUrl is not set
    let env = |set: &'static str| move |k: &str| (k == "ORDER_SERVICE_URL").then(|| set.to_owned());
    let vars = super::config::variables(env(""), "ORDER_SERVICE_URL=https://from-parameter,X=1").unwrap();
    assert_eq!(vars("ORDER_SERVICE_URL").as_deref(), Some("https://from-parameter"));
    assert_eq!(vars("X").as_deref(), Some("1"));
    let vars = super::config::variables(env("https://from-env"), "ORDER_SERVICE_URL=https://from-parameter").unwrap();
    assert_eq!(vars("ORDER_SERVICE_URL").as_deref(), Some("https://from-env"), "a set variable of the function wins");
    assert_eq!(vars("Y"), None);
}

/// A server that answers one request `{"ok": true}`: what it got (the head, the body).
async fn record_one() -> (String, tokio::task::JoinHandle<(String, Vec<u8>)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some(head) = text.find("\r\n\r\n") {
                let len: usize = text[..head]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if buf.len() >= head + 4 + len {
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"ok\":true}").await.unwrap();
                    return (text[..head].to_owned(), buf[head + 4..head + 4 + len].to_vec());
                }
            }
            assert!(n > 0, "connection closed early");
        }
    });
    (format!("http://{addr}"), server)
}

#[tokio::test]
async fn an_http_agent_sends_the_input_alone_with_its_method_when_told() {
    for (method, body_sent) in [("put", true), ("GET", false)] {
        let (base, server) = record_one().await;
        let config = format!(
            r#"{{"agents": {{"h": {{"kind": "http", "url": "{base}/items", "method": "{method}", "payload": "input"}}}}}}"#
        );
        let rt = AgentRuntime::from_config(&config, &|_| None).unwrap();
        let mut r = req(json!({}), 1, 5_000);
        r.agent = "h".into();
        r.input = json!({"sku": "a-1"});
        let out = rt.run(&r).await.unwrap();
        assert!(matches!(&out.outcome, Outcome::Succeeded { output } if output == &json!({"ok": true})), "{out:?}");
        let (head, body) = server.await.unwrap();
        assert!(head.starts_with(&format!("{} /items ", method.to_ascii_uppercase())), "{head}");
        assert!(head.to_ascii_lowercase().contains("idempotency-key:"), "the key still goes as a header: {head}");
        if body_sent {
            assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({"sku": "a-1"}), "the input alone");
        } else {
            assert!(body.is_empty(), "a GET sends no body");
        }
    }
    let bad = r#"{"agents": {"h": {"kind": "http", "url": "http://x/", "method": "TRACE"}}}"#;
    assert!(
        matches!(AgentRuntime::from_config(bad, &|_| None), Err(AgentConfigError::Invalid { message, .. }) if message.contains("TRACE"))
    );
}

#[test]
fn a_wait_for_a_slot_that_took_half_the_execution_time_sends_the_call_back_to_wait() {
    let mut r = req(json!({}), 1, 60_000);
    // 10 s of execution time: start_by is 10 s before CompleteBy
    r.start_by = Some(Millis(r.complete_by.0 - 10_000));
    let start = Millis(r.complete_by.0 - 30_000);
    assert!(!super::pacing_took_the_attempt(&r, start, start.plus_ms(4_999)));
    assert!(super::pacing_took_the_attempt(&r, start, start.plus_ms(5_000)));
    // a request without a start_by has its whole life to run
    r.start_by = None;
    assert!(!super::pacing_took_the_attempt(&r, start, start.plus_ms(25_000)));
}
