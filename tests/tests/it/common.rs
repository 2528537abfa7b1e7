//! Shared helpers: a fresh stack per test, the local runner, queues to listen on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use sas_core::agent::AgentRuntime;
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_core::runner::{Runner, RunnerHandle, RunnerOptions};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{Policy, ProcessState, Task};
use sas_protocol::workflow::{Backoff, StepDef, WorkflowDef, WorkflowRegistry};
use serde_json::Value;

pub struct Stack {
    pub name: String,
    pub sdk: aws_config::SdkConfig,
    pub outputs: HashMap<String, String>,
    pub res: Resources,
    pub deps: Arc<Deps>,
    pub sqs: aws_sdk_sqs::Client,
}

fn step(name: &str, timeout_ms: u64, comp: Option<&str>) -> StepDef {
    StepDef {
        // the slow workflow is for tests that must never see a deadline: a long queue budget too
        schedule_to_start_ms: (timeout_ms >= 60_000).then_some(60_000),
        max_attempts: 3,
        backoff: Backoff { base_ms: 200, max_ms: 1_000, multiplier: 2.0 },
        compensation: comp.map(|c| Box::new(step(c, timeout_ms, None))),
        ..StepDef::call(name, "sim", timeout_ms)
    }
}

/// A workflow of a test's own, from its JSON.
pub fn workflow(v: Value) -> WorkflowDef {
    serde_json::from_value(v).expect("a valid workflow")
}

/// When the task was first claimed (its first `Processing` entry) and when it ended.
pub fn ran(t: &Task) -> (Millis, Millis) {
    let start = t.history.iter().find(|h| h.state == ProcessState::Processing).map(|h| h.at);
    let end = t.history.iter().rev().find(|h| h.state.is_terminal()).map(|h| h.at);
    (start.expect("claimed"), end.expect("ended"))
}

/// `three`: a (undone by undo_a) -> b (undone by undo_b) -> c, 3 s steps: for the tests about
/// deadlines. `three-slow`: the same with 60 s steps, for every test that must not see a deadline
/// pass on a loaded machine.
pub fn workflows() -> WorkflowRegistry {
    let three = |name: &str, ms: u64| WorkflowDef {
        concurrency: None,
        result: None,
        name: name.into(),
        version: 1,
        description: "test workflow".into(),
        on_failure: sas_protocol::workflow::OnFailure::Compensate,
        steps: vec![step("a", ms, Some("undo_a")), step("b", ms, Some("undo_b")), step("c", ms, None)],
    };
    WorkflowRegistry::new([three("three", 3_000), three("three-slow", 60_000)]).expect("valid test workflows")
}

pub fn settings() -> Settings {
    Settings {
        // Short budgets, so that the deadline tests see a lost attempt within seconds.
        policy: Policy {
            pause_check_ms: Policy::default().pause_check_ms,
            key_check_ms: Policy::default().key_check_ms,
            start_timeout_ms: 3_000,
            history_limit: 50,
            queue_budget_ms: 2_000,
            result_grace_ms: 500,
            settle_ms: 500,
            unchecked_start_ms: 2_000,
            max_restarts: 8,
        },
        retention_days: 1,
        max_input_bytes: 16 * 1024,
        sweep_page_size: 100,
        // the tests call the sweep when a deadline has passed, without waiting for the lag
        sweep_lag_ms: 0,
        ..Settings::default()
    }
}

pub async fn stack(label: &str) -> Stack {
    stack_with(label, workflows()).await
}

/// A fresh stack whose roles know `workflows`.
pub async fn stack_with(label: &str, workflows: WorkflowRegistry) -> Stack {
    stack_with_settings(label, workflows, settings()).await
}

/// A fresh stack whose roles know `workflows` and run with `settings`.
pub async fn stack_with_settings(label: &str, workflows: WorkflowRegistry, settings: Settings) -> Stack {
    sas_core::telemetry::init();
    assert!(
        std::env::var("AWS_ENDPOINT_URL").is_ok() || std::env::var("SAS_TEST_AGAINST_AWS").is_ok(),
        "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`), or SAS_TEST_AGAINST_AWS=1 for real AWS"
    );
    let sdk = sas_core::aws::load_sdk_config().await;
    let name = format!("t-{label}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]).replace('_', "-");
    let template = sas_cli::stack::local_template(sas_cli::stack::TEMPLATE);
    let outputs =
        sas_cli::stack::deploy(&sdk, &name, &template, &[("DeployFunctions", "false"), ("SupervisorShards", "2")])
            .await
            .unwrap_or_else(|e| panic!("deploying {name}: {e}"));
    let res = Resources::from_outputs(&outputs).expect("all outputs present");
    let deps = Arc::new(Deps::aws(&sdk, res.clone(), workflows, settings));
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    Stack { name, sdk, outputs, res, deps, sqs }
}

impl Stack {
    /// The stack's table as a test writes tasks into it directly (the roles write through
    /// `sas_core::transition` only).
    pub fn table(&self) -> sas_core::store::DynamoStore {
        sas_core::store::DynamoStore::new(
            sas_core::aws::dynamodb_client(&self.sdk),
            self.res.task_table.clone(),
            self.res.shards,
            self.deps.settings.retention_days,
        )
    }

    pub fn runner(&self) -> RunnerHandle {
        self.runner_with(AgentRuntime::with_builtins())
    }

    /// The local runner with these agents, sweeping often so timeouts are noticed quickly.
    pub fn runner_with(&self, agents: AgentRuntime) -> RunnerHandle {
        let opts = RunnerOptions {
            sweep_every: Duration::from_millis(700),
            wait: Duration::from_secs(1),
            ..RunnerOptions::default()
        };
        Runner::new(self.deps.clone(), Arc::new(agents), opts).spawn()
    }

    pub fn out(&self, key: &str) -> &str {
        self.outputs.get(key).unwrap_or_else(|| panic!("no output {key}"))
    }

    pub async fn send(&self, queue: &str, body: &str) {
        self.sqs.send_message().queue_url(queue).message_body(body).send().await.expect("SendMessage");
    }

    /// Send `bodies` to `queue` in batches of ten, the batches at once: a burst that reaches the
    /// queue in a few requests rather than one per message (a hundred sends one after another
    /// took over a minute on a loaded machine).
    pub async fn send_all(&self, queue: &str, bodies: &[String]) {
        let batches = bodies.chunks(10).map(|chunk| {
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, body)| {
                    aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .build()
                        .expect("a batch entry")
                })
                .collect();
            self.sqs.send_message_batch().queue_url(queue).set_entries(Some(entries)).send()
        });
        for sent in futures::future::join_all(batches).await {
            let sent = sent.expect("SendMessageBatch");
            assert!(sent.failed().is_empty(), "messages not sent: {:?}", sent.failed());
        }
    }

    /// A private reply queue for this test, named on the stack's default allow-list
    /// (`<stack>-reply-*`; FIFO keeps statuses in order).
    pub async fn reply_queue(&self, suffix: &str, fifo: bool) -> String {
        self.queue(&format!("reply-{suffix}"), fifo).await
    }

    /// A queue of this test named `<stack>-<suffix>`: off the reply allow-list unless the suffix
    /// starts with `reply-`.
    pub async fn queue(&self, suffix: &str, fifo: bool) -> String {
        let name = format!("{}-{suffix}{}", self.name, if fifo { ".fifo" } else { "" });
        let mut req = self.sqs.create_queue().queue_name(name);
        if fifo {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
        }
        req.send().await.expect("CreateQueue").queue_url.expect("queue url")
    }

    /// Receive (and delete) every message currently in `queue`, waiting up to `wait` for the first
    /// `want` messages.
    pub async fn drain(&self, queue: &str, want: usize, wait: Duration) -> Vec<aws_sdk_sqs::types::Message> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        loop {
            let out = self
                .sqs
                .receive_message()
                .queue_url(queue)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader)
                .send()
                .await
                .expect("ReceiveMessage");
            let msgs = out.messages.unwrap_or_default();
            let empty = msgs.is_empty();
            for m in msgs {
                self.sqs
                    .delete_message()
                    .queue_url(queue)
                    .receipt_handle(m.receipt_handle.clone().unwrap_or_default())
                    .send()
                    .await
                    .expect("DeleteMessage");
                got.push(m);
            }
            if (got.len() >= want && empty) || Instant::now() > deadline {
                return got;
            }
        }
    }

    pub async fn bodies(&self, queue: &str, want: usize, wait: Duration) -> Vec<Value> {
        self.drain(queue, want, wait)
            .await
            .into_iter()
            .map(|m| serde_json::from_str(m.body().unwrap_or_default()).expect("JSON body"))
            .collect()
    }

    pub async fn task(&self, id: &str) -> Option<Task> {
        self.deps.store.get(&TaskId::try_from(id).unwrap()).await.expect("GetItem")
    }

    /// The task's item as DynamoDB holds it (a strongly consistent GetItem).
    pub async fn item(&self, id: &str) -> HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
        sas_core::aws::dynamodb_client(&self.sdk)
            .get_item()
            .table_name(&self.res.task_table)
            .key("TaskId", aws_sdk_dynamodb::types::AttributeValue::S(id.into()))
            .consistent_read(true)
            .send()
            .await
            .expect("GetItem")
            .item
            .expect("the item")
    }

    /// Poll the table until the task satisfies `pred`; panics with the task's state otherwise.
    pub async fn wait_for(&self, id: &str, wait: Duration, pred: impl Fn(&Task) -> bool) -> Task {
        let deadline = Instant::now() + wait;
        loop {
            let t = self.task(id).await;
            if let Some(t) = &t {
                if pred(t) {
                    return t.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "task {id} did not reach the expected state within {wait:?}; it is {:#?}",
                t.map(|t| (t.process_state, t.failure_count, t.history))
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn wait_terminal(&self, id: &str) -> Task {
        self.wait_for(id, Duration::from_mins(1), |t| t.process_state.is_terminal()).await
    }

    pub async fn depth(&self, queue: &str) -> usize {
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(queue)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .expect("GetQueueAttributes");
        let attrs = out.attributes.unwrap_or_default();
        [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ]
        .iter()
        .map(|k| attrs.get(k).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0))
        .sum()
    }

    /// Subscribe a fresh queue to the alert topic's task alerts (raw delivery) and return its URL.
    pub async fn alert_listener(&self) -> String {
        // The topic also carries CloudWatch alarm notifications; listen to task alerts only.
        self.topic_listener(&self.res.alert_topic_arn.clone(), "alerts", Some(r#"{"kind": [{"exists": true}]}"#)).await
    }

    /// Subscribe a fresh queue (named by `suffix`) to `topic` (raw delivery, an optional filter
    /// policy) and return its URL.
    pub async fn topic_listener(&self, topic: &str, suffix: &str, filter: Option<&str>) -> String {
        let (url, arn) = create_queue(&self.sqs, &format!("{}-{suffix}", self.name), false).await;
        let mut sub = aws_sdk_sns::Client::new(&self.sdk)
            .subscribe()
            .topic_arn(topic)
            .protocol("sqs")
            .endpoint(arn)
            .attributes("RawMessageDelivery", "true");
        if let Some(f) = filter {
            sub = sub.attributes("FilterPolicy", f);
        }
        sub.return_subscription_arn(true).send().await.expect("Subscribe");
        url
    }

    pub async fn delete(self) {
        let _ = sas_cli::stack::delete(&aws_sdk_cloudformation::Client::new(&self.sdk), &self.name).await;
    }
}

/// Every one of `attempts` attempts of `step` was reported timed out by its agent at its
/// `timeout_ms` deadline (not found by the Supervisor at CompleteBy + grace), and held its task less
/// than `max_held_ms`; returns how long each held it.
pub fn assert_timed_out_by_the_agent(
    task: &Task,
    step: &str,
    attempts: usize,
    timeout_ms: u64,
    max_held_ms: u64,
) -> Vec<u64> {
    let seen = attempts_of(task, step);
    assert_eq!(seen.len(), attempts, "{:#?}", task.history);
    let said = format!("timed out: no answer within the attempt's {timeout_ms} ms");
    for (claimed, ended, why) in &seen {
        assert!(why.contains(&said), "reported by its agent: {why}");
        assert!(ended.0 - claimed.0 < max_held_ms, "an attempt held its task {} ms: {why}", ended.0 - claimed.0);
    }
    seen.iter().map(|(c, e, _)| e.0 - c.0).collect()
}

/// The attempts of `step` as the task's history shows them: when each was claimed (a
/// `Processing` entry on the step), when its end was written (the next entry), and that entry's
/// reason (why it failed; empty for a success).
pub fn attempts_of(task: &Task, step: &str) -> Vec<(Millis, Millis, String)> {
    let h = &task.history;
    h.iter()
        .enumerate()
        .filter(|(_, e)| e.state == ProcessState::Processing && e.step.as_deref() == Some(step))
        .filter_map(|(i, e)| h.get(i + 1).map(|next| (e.at, next.at, next.reason.clone().unwrap_or_default())))
        .collect()
}

/// A DynamoDB table of a test's own, keyed by `id` (a string), on demand, ready when this returns:
/// made if it does not exist (one kept across runs is taken as it is).
pub async fn items_table(sdk: &aws_config::SdkConfig, table: &str) {
    use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType};
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let id = AttributeDefinition::builder()
        .attribute_name("id")
        .attribute_type(ScalarAttributeType::S)
        .build()
        .expect("an attribute");
    let key = KeySchemaElement::builder().attribute_name("id").key_type(KeyType::Hash).build().expect("a key");
    let made = ddb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(id)
        .key_schema(key)
        .send()
        .await;
    if let Err(e) = made {
        let exists = e
            .as_service_error()
            .is_some_and(aws_sdk_dynamodb::operation::create_table::CreateTableError::is_resource_in_use_exception);
        assert!(exists, "creating {table}: {}", aws_sdk_dynamodb::error::DisplayErrorContext(&e));
    }
    for _ in 0..240 {
        let d = ddb.describe_table().table_name(table).send().await.expect("describing the table");
        if d.table().and_then(|t| t.table_status()) == Some(&aws_sdk_dynamodb::types::TableStatus::Active) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("table {table} is not ACTIVE after 120 s");
}

/// A queue named `name` (`.fifo` added for a FIFO queue): its URL and ARN.
pub async fn create_queue(sqs: &aws_sdk_sqs::Client, name: &str, fifo: bool) -> (String, String) {
    let mut req = sqs.create_queue().queue_name(if fifo { format!("{name}.fifo") } else { name.to_owned() });
    if fifo {
        req = req.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let url = req.send().await.expect("CreateQueue").queue_url.expect("queue url");
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default()
        .remove(&QueueAttributeName::QueueArn)
        .expect("queue arn");
    (url, arn)
}

/// An S3 client for LocalStack (path-style addressing).
pub fn s3(sdk: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(sdk).force_path_style(true).build())
}

/// The bucket `name`, made if it is not there yet.
pub async fn bucket(s3: &aws_sdk_s3::Client, name: &str) {
    if let Err(e) = s3.create_bucket().bucket(name).send().await {
        let owned =
            e.as_service_error().is_some_and(|e| e.is_bucket_already_owned_by_you() || e.is_bucket_already_exists());
        assert!(owned, "creating bucket {name}: {}", aws_sdk_s3::error::DisplayErrorContext(&e));
    }
}
