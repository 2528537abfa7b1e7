//! The `lambda` agent against a real function on LocalStack: the tests' own function
//! (`tests/functions/byow-orders/bootstrap`, a custom runtime) gets the request contract and its
//! answer becomes the step's output; its `PermanentError` fails the step for good, its other
//! errors are retried inside the attempt; a function that does not exist is a permanent failure;
//! a callback step is invoked asynchronously and the function answers with the token through the
//! callback queue. No stack needed: a function and a queue of the test's own.

use std::path::Path;
use std::time::{Duration, Instant};

use aws_sdk_lambda::types::{Architecture, Environment, FunctionCode, Runtime, State};
use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use serde_json::{json, Value};

/// Deploy the tests' function under a fresh name; its name.
pub async fn deploy_test_function(sdk: &aws_config::SdkConfig, label: &str) -> String {
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let name = format!("byow-{label}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let script = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("functions/byow-orders/bootstrap"))
        .expect("tests/functions/byow-orders/bootstrap");
    create_function(&lambda, &name, &sas_cli::lambda::zip_bootstrap(&script).expect("zipping"), &[]).await;
    name
}

/// Create a custom-runtime function (`zip`: its bootstrap zipped) with `env`, and wait until it
/// is Active; its ARN.
pub async fn create_function(lambda: &aws_sdk_lambda::Client, name: &str, zip: &[u8], env: &[(&str, &str)]) -> String {
    let mut vars = Environment::builder();
    for (k, v) in env {
        vars = vars.variables(*k, *v);
    }
    let arn = lambda
        .create_function()
        .function_name(name)
        .runtime(Runtime::Providedal2023)
        .handler("bootstrap")
        .role("arn:aws:iam::000000000000:role/tests")
        .architectures(Architecture::from(sas_cli::lambda::host_architecture()))
        .timeout(10)
        .environment(vars.build())
        .code(FunctionCode::builder().zip_file(zip.to_vec().into()).build())
        .send()
        .await
        .expect("CreateFunction")
        .function_arn
        .expect("a function ARN");
    let started = Instant::now();
    loop {
        let f = lambda.get_function().function_name(name).send().await.expect("GetFunction");
        match f.configuration().and_then(|c| c.state().cloned()) {
            Some(State::Active) => break,
            Some(State::Failed) => panic!("function {name} failed: {:?}", f.configuration()),
            _ => {
                assert!(started.elapsed() < Duration::from_mins(1), "function {name} never became Active");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    arn
}

fn request(task: &str, agent: &str, fn_input: Value, callback: bool) -> AgentRequest {
    let input = json!({"order": "o-1", "fn": fn_input});
    let req = AgentRequest::first_attempt(
        TaskId::try_from(task).unwrap(),
        "charge",
        agent,
        input,
        Millis::now().plus_ms(30_000),
    );
    if callback {
        req.with_callback(None)
    } else {
        req
    }
}

#[tokio::test]
async fn a_lambda_agent_invokes_the_function_and_classifies_what_it_answers() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let sdk = sas_core::aws::load_sdk_config().await;
    let function = deploy_test_function(&sdk, "agent").await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs.create_queue().queue_name(format!("{function}-cb")).send().await.unwrap().queue_url.unwrap();
    let config = json!({
        "agents": {
            "charge": {"kind": "lambda", "function": "${FN}"},
            "missing": {"kind": "lambda", "function": format!("{function}-gone")},
            "bare": {"kind": "lambda", "function": "${FN}", "payload": "input"},
        },
        "callback": {"queue_url": "${CB}"},
        "retry": {"max_calls": 4, "base_ms": 50, "max_ms": 200},
    })
    .to_string();
    let vars = |k: &str| match k {
        "FN" => Some(function.clone()),
        "CB" => Some(queue.clone()),
        _ => None,
    };
    let rt = AgentRuntime::from_config_with(&config, &vars, AwsConfigCell::with(sdk.clone())).expect("agents");
    let task = &function[5..];

    // a call step: the function's answer is the output; it saw the idempotency key (the call is
    // part of a traced record: the task's trace header goes with the invoke)
    let trace = "Root=1-6560e988-bd862e3fe1be46a994272795;Parent=53995c3f42cd8ad8;Sampled=1";
    let ok = request(&format!("{task}-ok"), "charge", json!({}), false);
    let out = sas_core::trace::scope(Some(trace.into()), rt.run(&ok)).await.expect("a result");
    let Outcome::Succeeded { output } = out.outcome else { panic!("{out:?}") };
    assert_eq!(output["handled"], "charge");
    assert_eq!(output["order"], "o-1");
    assert_eq!(output["idempotency_key"], format!("{task}-ok:charge"));
    assert_eq!(output["calls"], 1);

    // "payload": "input": the function receives the request's input alone (a step's parameters
    // filled; here, without parameters, the task's input and outputs), as from Step Functions
    let bare = request(&format!("{task}-bare"), "bare", json!({"x": 1}), false);
    let out = rt.run(&bare).await.unwrap();
    let Outcome::Succeeded { output } = out.outcome else { panic!("{out:?}") };
    assert_eq!(output, json!({"received": bare.input}));
    assert_eq!(output["received"]["input"]["fn"], json!({"x": 1}));

    // two function errors of another type: retried inside the attempt, the third call answers
    let out = rt.run(&request(&format!("{task}-busy"), "charge", json!({"fail_calls": 2}), false)).await.unwrap();
    let Outcome::Succeeded { output } = out.outcome else { panic!("{out:?}") };
    assert_eq!(output["calls"], 3, "{output}");

    // PermanentError: failed for good at once, with the function's message
    let out = rt.run(&request(&format!("{task}-no"), "charge", json!({"fail": "permanent"}), false)).await.unwrap();
    match out.outcome {
        Outcome::Failed { error, retryable: false } => {
            assert!(error.contains("PermanentError") && error.contains("declined"), "{error}");
        }
        other => panic!("{other:?}"),
    }

    // a function that does not exist: permanent, naming it
    let out = rt.run(&request(&format!("{task}-gone"), "missing", json!({}), false)).await.unwrap();
    match out.outcome {
        Outcome::Failed { error, retryable: false } => {
            assert!(error.contains("ResourceNotFoundException") && error.contains("-gone"), "{error}");
        }
        other => panic!("{other:?}"),
    }

    // a callback step: invoked asynchronously, nothing reported; the function answers with the token
    let req = request(&format!("{task}-cb"), "charge", json!({}), true);
    let token = req.callback.as_ref().unwrap().token.expose().clone();
    assert_eq!(rt.run(&req).await, None, "a hand-off Lambda accepted reports nothing: the step waits");
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer: Value = loop {
        let got = sqs.receive_message().queue_url(&queue).wait_time_seconds(2).send().await.unwrap();
        if let Some(m) = got.messages.unwrap_or_default().into_iter().next() {
            break serde_json::from_str(m.body().unwrap_or_default()).unwrap();
        }
        assert!(Instant::now() < deadline, "the function never answered through the callback queue");
    };
    assert_eq!(answer["token"], token.as_str());
    assert_eq!(
        (answer["status"].as_str(), answer["output"]["answered_by"].as_str()),
        (Some("succeeded"), Some("callback"))
    );
    assert_eq!(answer["output"]["idempotency_key"], format!("{task}-cb:charge"));
}
