//! The delivering agent kinds (`sqs`, `sns`, `eventbridge`) against LocalStack: each, built from
//! an agents.json entry, hands a callback step's request (the contract every kind sends, with the
//! token and where to answer) to the user's queue, topic or bus, and what arrives is checked; a
//! FIFO target gets an attempt once however often its call is retried. End to end, a task's
//! callback step is delivered to a queue, the test acts as the worker that reads it and answers
//! through the callback queue, and the task is Processed.

use std::time::{Duration, Instant};

use aws_sdk_sqs::types::MessageSystemAttributeName;
use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use sas_protocol::protocol::{ProcessState, StepStatus};
use sas_protocol::workflow::WorkflowRegistry;
use serde_json::{json, Value};

use crate::common::{create_queue, stack_with};

const CALLBACK_QUEUE: &str = "http://localhost:4566/000000000000/answers";

fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// A callback step's request for agent `agent` (attempt `attempt`).
fn request(task: &str, agent: &str, attempt: &AttemptToken) -> AgentRequest {
    let input = json!({"order": "o-7", "items": 3});
    // well past the hand-off's own deadline (60 s), which the worker must not be told
    let complete_by = Millis::now().plus_ms(600_000);
    AgentRequest::first_attempt(TaskId::try_from(task).unwrap(), "ship", agent, input, complete_by)
        .with_attempt(attempt.clone())
        .with_callback(Some(30_000))
}

/// The agents of `agents` (the `"agents"` object of an agents.json), with `vars`, the callback
/// queue [`CALLBACK_QUEUE`], and the test's SDK configuration.
fn runtime(sdk: &aws_config::SdkConfig, agents: &Value, vars: &[(&str, &str)]) -> AgentRuntime {
    let file = json!({
        "agents": agents,
        "callback": {"queue_url": CALLBACK_QUEUE},
        "retry": {"max_calls": 2, "base_ms": 10, "max_ms": 50},
    });
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    AgentRuntime::from_config_with(
        &file.to_string(),
        &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
        AwsConfigCell::with(sdk.clone()),
    )
    .expect("a valid agents file")
}

/// The body every delivering kind sends is the request contract: the task, the step, the attempt,
/// the idempotency key, the deadline (the attempt's CompleteBy), the input, and the token with
/// where to answer.
fn assert_contract(body: &Value, req: &AgentRequest) {
    assert_eq!(body["task_id"], req.task_id.as_str(), "{body}");
    assert_eq!(body["step"], "ship", "{body}");
    assert_eq!(body["attempt_no"], 1, "{body}");
    assert_eq!(body["idempotency_key"], req.idempotency_key.as_str(), "{body}");
    // the worker has until the attempt's CompleteBy, not the hand-off's own deadline
    assert_eq!(body["deadline"], req.complete_by.0, "{body}");
    assert_eq!(body["input"], req.input, "{body}");
    let token = req.callback.as_ref().unwrap().token.expose();
    assert_eq!(
        body["callback"],
        json!({"token": token, "heartbeat_ms": 30_000, "queue_url": CALLBACK_QUEUE}),
        "{body}"
    );
}

/// Every message that arrives in `queue` within `wait` (deleted as read); returns early once
/// `want` arrived and the queue has been quiet for a second.
async fn receive(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    want: usize,
    wait: Duration,
) -> Vec<aws_sdk_sqs::types::Message> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("ReceiveMessage");
        let msgs = out.messages.unwrap_or_default();
        let empty = msgs.is_empty();
        for m in msgs {
            let handle = m.receipt_handle.clone().unwrap_or_default();
            sqs.delete_message().queue_url(queue).receipt_handle(handle).send().await.expect("DeleteMessage");
            got.push(m);
        }
        if (got.len() >= want && empty) || Instant::now() > deadline {
            return got;
        }
    }
}

fn body_of(m: &aws_sdk_sqs::types::Message) -> Value {
    serde_json::from_str(m.body().unwrap_or_default()).expect("a JSON body")
}

fn attr<'a>(m: &'a aws_sdk_sqs::types::Message, name: &str) -> Option<&'a str> {
    m.message_attributes.as_ref()?.get(name)?.string_value()
}

fn assert_refused(out: Option<sas_protocol::messages::AgentResult>, says: &str) {
    let out = out.expect("a refusal is reported");
    assert!(matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains(says)), "{out:?}");
}

#[tokio::test]
async fn the_sqs_kind_delivers_the_request_to_a_standard_and_a_fifo_queue_once_per_attempt() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let sdk = sas_core::aws::load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let run = run_id();
    let (plain, _) = create_queue(&sqs, &format!("t-work-{run}"), false).await;
    let (fifo, _) = create_queue(&sqs, &format!("t-work-{run}"), true).await;
    let rt = runtime(
        &sdk,
        &json!({
            "warehouse": {"kind": "sqs", "queue_url": "${WORK_QUEUE}"},
            "warehouse-fifo": {"kind": "sqs", "queue_url": "${WORK_FIFO}"},
            "nowhere": {"kind": "sqs", "queue_url": "${NO_QUEUE}"},
            "notify": {"kind": "sqs", "queue_url": "${WORK_QUEUE}", "payload": "input"},
        }),
        &[
            ("WORK_QUEUE", &plain),
            ("WORK_FIFO", &fifo),
            ("NO_QUEUE", &plain.replace(&format!("t-work-{run}"), &format!("t-none-{run}"))),
        ],
    );

    // a standard queue: the request arrives as it is, with attributes to route on
    // (handled as part of a traced record: the worker's message carries the task's trace)
    let req = request(&format!("sqs-{run}"), "warehouse", &AttemptToken::fresh());
    let trace = "Root=1-6560e988-bd862e3fe1be46a994272794;Parent=53995c3f42cd8ad8;Sampled=1";
    let handed = sas_core::trace::scope(Some(trace.into()), rt.run(&req)).await;
    assert_eq!(handed, None, "a delivered hand-off reports nothing: the step waits for its answer");
    let got = receive(&sqs, &plain, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_contract(&body_of(&got[0]), &req);
    assert_eq!((attr(&got[0], "task_id"), attr(&got[0], "step")), (Some(req.task_id.as_str()), Some("ship")));
    let header = got[0].attributes.as_ref().and_then(|a| a.get(&MessageSystemAttributeName::AwsTraceHeader));
    assert_eq!(header.map(String::as_str), Some(trace), "the task's trace goes on to the worker");

    // a FIFO queue: a call of the same attempt made again is delivered once, a new attempt again
    let first = request(&format!("sqsf-{run}"), "warehouse-fifo", &AttemptToken::fresh());
    let second = request(&format!("sqsf-{run}"), "warehouse-fifo", &AttemptToken::fresh());
    for r in [&first, &first, &second, &second] {
        assert_eq!(rt.run(r).await, None);
    }
    let got = receive(&sqs, &fifo, 2, Duration::from_secs(10)).await;
    let tokens: Vec<Value> = got.iter().map(|m| body_of(m)["callback"]["token"].clone()).collect();
    let want: Vec<Value> =
        [&first, &second].iter().map(|r| json!(r.callback.as_ref().unwrap().token.expose())).collect();
    assert_eq!(tokens, want, "each attempt once, in order");
    assert_contract(&body_of(&got[0]), &first);
    let group = got[0].attributes.as_ref().and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId));
    assert_eq!(group.map(String::as_str), Some(first.task_id.as_str()), "the task is the message group");

    // a queue that does not exist: the attempt fails for good, naming it
    let missing = request(&format!("sqsn-{run}"), "nowhere", &AttemptToken::fresh());
    assert_refused(rt.run(&missing).await, &format!("sending to {}", plain.replace("t-work", "t-none")));

    // "payload": "input": a call step's input alone is the message, sent and not waited for
    let mut note = request(&format!("sqsi-{run}"), "notify", &AttemptToken::fresh());
    note.callback = None;
    note.input = json!("Your order shipped");
    let out = rt.run(&note).await.expect("a call step reports");
    let Outcome::Succeeded { output } = out.outcome else { panic!("{out:?}") };
    assert_eq!(output["delivered"], true);
    let got = receive(&sqs, &plain, 1, Duration::from_secs(10)).await;
    assert_eq!(got[0].body(), Some("Your order shipped"), "a string as it is");
    assert_eq!(output["message_id"].as_str(), got[0].message_id());
    // on a callback step it is refused: the token would not go with it
    let cb = request(&format!("sqsc-{run}"), "notify", &AttemptToken::fresh());
    assert_refused(rt.run(&cb).await, "without the token");

    for q in [plain, fifo] {
        let _ = sqs.delete_queue().queue_url(q).send().await;
    }
}

#[tokio::test]
async fn the_sns_kind_publishes_the_request_to_a_standard_and_a_fifo_topic_and_their_subscribers_read_it() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let sdk = sas_core::aws::load_sdk_config().await;
    let (sns, sqs) = (aws_sdk_sns::Client::new(&sdk), aws_sdk_sqs::Client::new(&sdk));
    let run = run_id();
    let topic = sns.create_topic().name(format!("t-work-{run}")).send().await.unwrap().topic_arn.unwrap();
    let (queue, queue_arn) = create_queue(&sqs, &format!("t-worker-{run}"), false).await;
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(&queue_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .expect("Subscribe");
    // a FIFO topic with a FIFO queue subscribed
    let fifo_topic = sns
        .create_topic()
        .name(format!("t-work-{run}.fifo"))
        .attributes("FifoTopic", "true")
        .send()
        .await
        .expect("CreateTopic (FIFO)")
        .topic_arn
        .unwrap();
    let (fifo_queue, fifo_queue_arn) = create_queue(&sqs, &format!("t-worker-{run}"), true).await;
    sns.subscribe()
        .topic_arn(&fifo_topic)
        .protocol("sqs")
        .endpoint(&fifo_queue_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .expect("Subscribe (FIFO)");
    let rt = runtime(
        &sdk,
        &json!({
            "warehouse": {"kind": "sns", "topic_arn": "${WORK_TOPIC}"},
            "warehouse-fifo": {"kind": "sns", "topic_arn": "${WORK_FIFO_TOPIC}"},
            "nowhere": {"kind": "sns", "topic_arn": "${NO_TOPIC}"},
        }),
        &[
            ("WORK_TOPIC", &topic),
            ("WORK_FIFO_TOPIC", &fifo_topic),
            ("NO_TOPIC", &topic.replace(&format!("t-work-{run}"), &format!("t-none-{run}"))),
        ],
    );

    let req = request(&format!("sns-{run}"), "warehouse", &AttemptToken::fresh());
    assert_eq!(rt.run(&req).await, None, "a published hand-off reports nothing");
    let got = receive(&sqs, &queue, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_contract(&body_of(&got[0]), &req);
    assert_eq!((attr(&got[0], "task_id"), attr(&got[0], "step")), (Some(req.task_id.as_str()), Some("ship")));

    // the FIFO topic: a call of the same attempt made again is published once, a new attempt again
    let first = request(&format!("snsf-{run}"), "warehouse-fifo", &AttemptToken::fresh());
    let second = request(&format!("snsf-{run}"), "warehouse-fifo", &AttemptToken::fresh());
    for r in [&first, &first, &second, &second] {
        assert_eq!(rt.run(r).await, None);
    }
    let got = receive(&sqs, &fifo_queue, 2, Duration::from_secs(15)).await;
    let tokens: Vec<Value> = got.iter().map(|m| body_of(m)["callback"]["token"].clone()).collect();
    let want: Vec<Value> =
        [&first, &second].iter().map(|r| json!(r.callback.as_ref().unwrap().token.expose())).collect();
    assert_eq!(tokens, want, "each attempt once, in order");
    assert_contract(&body_of(&got[0]), &first);

    let missing = request(&format!("snsn-{run}"), "nowhere", &AttemptToken::fresh());
    assert_refused(rt.run(&missing).await, "publishing to");

    for t in [topic, fifo_topic] {
        let _ = sns.delete_topic().topic_arn(t).send().await;
    }
    for q in [queue, fifo_queue] {
        let _ = sqs.delete_queue().queue_url(q).send().await;
    }
}

#[tokio::test]
async fn the_eventbridge_kind_puts_the_request_on_a_bus_whose_rule_routes_it_to_a_queue() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let sdk = sas_core::aws::load_sdk_config().await;
    let (events, sqs) = (aws_sdk_eventbridge::Client::new(&sdk), aws_sdk_sqs::Client::new(&sdk));
    let run = run_id();
    let bus = format!("t-bus-{run}");
    events.create_event_bus().name(&bus).send().await.expect("CreateEventBus");
    let (queue, queue_arn) = create_queue(&sqs, &format!("t-routed-{run}"), false).await;
    let rule = format!("t-rule-{run}");
    events
        .put_rule()
        .name(&rule)
        .event_bus_name(&bus)
        .event_pattern(json!({"source": ["shop.orders"], "detail-type": ["warehouse"]}).to_string())
        .send()
        .await
        .expect("PutRule");
    let target = aws_sdk_eventbridge::types::Target::builder().id("q").arn(&queue_arn).build().unwrap();
    events.put_targets().rule(&rule).event_bus_name(&bus).targets(target).send().await.expect("PutTargets");
    let rt = runtime(
        &sdk,
        &json!({
            // the default detail-type is the agent's name
            "warehouse": {"kind": "eventbridge", "bus": "${WORK_BUS}", "source": "shop.orders"},
        }),
        &[("WORK_BUS", &bus)],
    );

    let req = request(&format!("ev-{run}"), "warehouse", &AttemptToken::fresh());
    assert_eq!(rt.run(&req).await, None, "an event put on the bus reports nothing");
    let got = receive(&sqs, &queue, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let event = body_of(&got[0]);
    assert_eq!((&event["source"], &event["detail-type"]), (&json!("shop.orders"), &json!("warehouse")), "{event}");
    assert_contract(&event["detail"], &req);

    // (LocalStack takes events for a bus that does not exist, so refused entries are covered by
    // the unit tests of the kind.)

    let _ = events.remove_targets().rule(&rule).event_bus_name(&bus).ids("q").send().await;
    let _ = events.delete_rule().name(&rule).event_bus_name(&bus).send().await;
    let _ = events.delete_event_bus().name(&bus).send().await;
    let _ = sqs.delete_queue().queue_url(&queue).send().await;
}

/// End to end with the local runner: a task's callback step is delivered to the worker's queue
/// by an `sqs` agent; the test, as the worker, reads the request, answers with its token through
/// the stack's callback queue (the `queue_url` the request names), and the task is Processed with
/// the worker's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callback_step_delivered_to_a_queue_is_answered_by_its_worker_and_the_task_is_processed() {
    let workflows = WorkflowRegistry::from_json(
        &json!({"workflows": [{
            "name": "handed", "version": 1, "description": "one callback step delivered to a queue",
            "steps": [{"name": "ship", "kind": "callback", "agent": "warehouse", "timeout_ms": 600_000, "max_attempts": 1}],
        }]})
        .to_string(),
    )
    .expect("a valid workflow");
    let s = stack_with("deliver", workflows).await;
    let work = s.queue("work", false).await;
    let callback_queue = s.res.callback_queue_url.clone().expect("the stack has a callback queue");
    let file = json!({
        "agents": {"warehouse": {"kind": "sqs", "queue_url": "${WORK_QUEUE}"}},
        "callback": {"queue_url": "${CALLBACK_QUEUE_URL}"},
    })
    .to_string();
    let vars = {
        let (work, cb) = (work.clone(), callback_queue.clone());
        move |k: &str| match k {
            "WORK_QUEUE" => Some(work.clone()),
            "CALLBACK_QUEUE_URL" => Some(cb.clone()),
            _ => None,
        }
    };
    let agents = AgentRuntime::from_config_with(&file, &vars, AwsConfigCell::with(s.sdk.clone())).unwrap();
    let runner = s.runner_with(agents);
    let id = format!("handed-{}", run_id());
    let submission = json!({"v": 1, "task_id": id, "workflow": "handed", "input": {"order": "o-7"}});
    s.send(&s.res.submission_queue_url, &submission.to_string()).await;

    // the worker: its queue holds the request; it answers where the request says
    let got = receive(&s.sqs, &work, 1, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1, "the step's request reached the worker's queue: {got:?}");
    let body = body_of(&got[0]);
    assert_eq!((&body["task_id"], &body["step"]), (&json!(id), &json!("ship")), "{body}");
    assert_eq!(body["idempotency_key"], format!("{id}:ship"), "{body}");
    assert_eq!(body["input"]["input"], json!({"order": "o-7"}), "{body}");
    // the worker has the step's 10 minutes, not the hand-off's 60 s
    assert!(body["deadline"].as_u64().is_some_and(|d| d > Millis::now().plus_ms(300_000).0), "{body}");
    let token = body["callback"]["token"].as_str().expect("the token is handed over").to_owned();
    let answer_to = body["callback"]["queue_url"].as_str().expect("where to answer").to_owned();
    assert_eq!(answer_to, callback_queue);
    let answer = json!({"v": 1, "token": token, "status": "succeeded", "output": {"tracking": "TRK-7"}});
    s.send(&answer_to, &answer.to_string()).await;

    let t = s.wait_terminal(&id).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:#?}", t.history);
    assert_eq!(t.steps[0].status, StepStatus::Succeeded);
    assert_eq!(t.steps[0].output, Some(json!({"tracking": "TRK-7"})));
    runner.shutdown().await;
    s.delete().await;
}

/// Step Functions' `.waitForTaskToken` on an AWS action, imported: `aws-sdk:dynamodb:putItem`
/// writing the task token into an item (as a job queue kept in a table would be), becomes a
/// callback step whose `aws` agent puts this project's token where the definition put
/// `$$.Task.Token`. On LocalStack: the item is written with the token; the test, as the worker that
/// reads the table, answers with it through the callback queue; the task is Processed with the
/// answer as the state's output, read by the state after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_aws_action_that_waits_for_a_token_writes_it_where_the_definition_says_and_the_answer_ends_the_step() {
    let table = "sas-it-token-jobs";
    let def = json!({"StartAt": "Hand", "States": {
        "Hand": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:dynamodb:putItem.waitForTaskToken",
                 "Parameters": {"TableName": table, "Item": {"id": {"S.$": "$.order"}, "token": {"S.$": "$$.Task.Token"}}},
                 "ResultPath": "$.answer", "TimeoutSeconds": 600, "Next": "Done"},
        "Done": {"Type": "Pass", "Parameters": {"order.$": "$.order", "tracking.$": "$.answer.tracking"}, "End": true}}});
    let i = sas_cli::asl::import("handed_aws", &def).expect("the definition translates");
    assert_eq!(i.agents.values().next().expect("one agent")["task_token"], json!(["Item.token.S"]), "{:?}", i.agents);
    let workflows =
        WorkflowRegistry::from_json(&json!({"workflows": i.workflows()}).to_string()).expect("the workflow loads");
    let s = stack_with("deliver-aws", workflows).await;
    crate::common::items_table(&s.sdk, table).await;
    let callback_queue = s.res.callback_queue_url.clone().expect("the stack has a callback queue");
    let agents = AgentRuntime::from_config_with(
        &sas_cli::asl::agents_file(&i.agents).to_string(),
        &|_| None,
        AwsConfigCell::with(s.sdk.clone()),
    )
    .expect("the agents");
    let runner = s.runner_with(agents);
    let order = format!("o-{}", run_id());
    let id = format!("handed-aws-{}", run_id());
    let submission = json!({"v": 1, "task_id": id, "workflow": "handed_aws", "input": {"order": order}});
    s.send(&s.res.submission_queue_url, &submission.to_string()).await;

    // the worker: reads the item the step wrote, and answers with the token in it
    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let started = Instant::now();
    let token = loop {
        let got = ddb
            .get_item()
            .table_name(table)
            .key("id", aws_sdk_dynamodb::types::AttributeValue::S(order.clone()))
            .consistent_read(true)
            .send()
            .await
            .expect("reading the item");
        if let Some(t) = got.item().and_then(|i| i.get("token")).and_then(|v| v.as_s().ok()) {
            break t.clone();
        }
        assert!(started.elapsed() < Duration::from_mins(3), "the step wrote no item with its token");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let t = s.task(&id).await.expect("the task");
    assert_eq!(t.process_state, ProcessState::Processing, "it waits for the answer: {:#?}", t.history);
    assert!(token.contains(&id), "the project's callback token, naming the task: {token}");
    let answer = json!({"v": 1, "token": token, "status": "succeeded", "output": {"tracking": "TRK-9"}});
    s.send(&callback_queue, &answer.to_string()).await;

    let t = s.wait_terminal(&id).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:#?}", t.history);
    assert_eq!(t.result(), Some(json!({"order": order, "tracking": "TRK-9"})));
    runner.shutdown().await;
    s.delete().await;
}
