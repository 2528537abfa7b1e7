//! The real functions on LocalStack (Lambda mode). Each test deploys its own stack with the five
//! functions on (`sas_cli::lambda::deploy`: the bootstraps of `target/debug`, or of
//! `SAS_FUNCTIONS_DIR`, zipped to S3) and reaches them only as AWS would: through their queues
//! (LocalStack's SQS event source mappings invoke them), the scheduled rule, Lambda Invoke and the
//! Callback function's URL (signed requests).
//! No local runner. Needs LocalStack with the project's host Lambda executor (`lambda` in
//! SERVICES, as `infra/localstack.sh start` does) and the binaries built
//! (`cargo build -p sas-functions --bins`; `make test-lambda` does both).
//!
//! Stacks are deployed with short budgets (`QueueBudgetMs=45000`: room for a cold event source on a loaded machine, `ResultGraceMs=1000`) so a lost
//! attempt shows within seconds, and with the sweep rule at `rate(1 day)` (LocalStack fires it at
//! 00:00 UTC only) so that nothing but the test moves its tasks; the one test about the rule keeps
//! `rate(1 minute)` and waits for LocalStack's scheduler loop (it fires every ~60 s).

// Deploy and recovery times go to stderr: nextest shows them for a failing or slow test.
#![allow(clippy::print_stderr)]

use sas_core::store::TaskWriter as _;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_protocol::ids::{AttemptToken, CallbackToken, Millis, TaskId};
use sas_protocol::messages::{CallbackResult, RunMessage, SchedulerMessage, StatusMessage, VERSION};
use sas_protocol::protocol::{self, CompensationStatus, Ctx, Effect, Event, Policy, ProcessState, StepStatus, Task};
use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
use serde_json::{json, Value};

use crate::common::Stack;

mod decisions;
mod upgrade;

const SECS: Duration = Duration::from_secs(15);
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../events");

/// The folder with the four bootstraps: `SAS_FUNCTIONS_DIR`, else the workspace's `target/debug`.
fn functions_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SAS_FUNCTIONS_DIR") {
        return d.into();
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    target.join("debug")
}

/// Where a stack's functions append their AWS calls (`AwsCallLog`): the functions are host
/// processes of LocalStack's executor on this machine, so a directory of this workspace's target.
fn calls_dir(stack: &str) -> PathBuf {
    functions_dir().join("aws-calls").join(stack)
}

/// What the functions are deployed with (and the test's own handle on the table agrees with).
fn policy() -> Policy {
    Policy { queue_budget_ms: 45_000, result_grace_ms: 1_000, ..Policy::default() }
}

struct Fns {
    s: Stack,
    /// Deployed function names by logical ID (`SchedulerFunction` -> ...).
    names: BTreeMap<String, String>,
    /// The functions' call logs (checked against their roles before the stack is deleted).
    calls: PathBuf,
    lambda: aws_sdk_lambda::Client,
    logs: aws_sdk_cloudwatchlogs::Client,
}

/// The workspace's configuration (`config/`): what the configuration layer is made of by default.
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config");

/// A fresh stack with its functions on; `params` add to or override the defaults above.
async fn lambda_stack(label: &str, params: &[(&str, &str)]) -> Fns {
    lambda_stack_with(label, Path::new(CONFIG), params).await
}

/// The defaults of every test stack, then `params`.
fn stack_params(calls: &Path, params: &[(&str, &str)]) -> Vec<(String, String)> {
    let p = policy();
    let mut all: Vec<(String, String)> = [
        ("SupervisorShards", "2".to_owned()),
        ("QueueBudgetMs", p.queue_budget_ms.to_string()),
        ("ResultGraceMs", p.result_grace_ms.to_string()),
        ("SupervisorSchedule", "rate(1 day)".to_owned()),
        ("AwsCallLog", calls.to_string_lossy().into_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    all.extend(params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    all
}

/// [`lambda_stack`] with the configuration layer made of `config` (workflows.json, agents.json).
async fn lambda_stack_with(label: &str, config: &Path, params: &[(&str, &str)]) -> Fns {
    lambda_stack_from(label, &functions_dir(), config, params).await
}

/// [`lambda_stack_with`] with the bootstraps of `functions` (another build's).
async fn lambda_stack_from(label: &str, functions: &Path, config: &Path, params: &[(&str, &str)]) -> Fns {
    sas_core::telemetry::init();
    assert!(
        std::env::var("AWS_ENDPOINT_URL").is_ok(),
        "set AWS_ENDPOINT_URL (LocalStack with the host Lambda executor: `source infra/env.sh`)"
    );
    let sdk = sas_core::aws::load_sdk_config().await;
    let name = format!("l-{label}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let p = policy();
    let calls = calls_dir(&name);
    let all = stack_params(&calls, params);
    let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let started = Instant::now();
    let d = sas_cli::lambda::deploy(&sdk, &name, functions, config, &all)
        .await
        .unwrap_or_else(|e| panic!("deploying {name} with its functions: {e:#}"));
    eprintln!("[{name}] deployed with its functions in {:.1} s: {:?}", started.elapsed().as_secs_f64(), d.timings);
    let res = Resources::from_outputs(&d.outputs).expect("all outputs present");
    let settings = Settings { policy: p, ..Settings::default() };
    // The functions' definitions: the configuration layer's, or the test's file (`WorkflowsFile`).
    let file = params
        .iter()
        .find(|(k, _)| *k == "WorkflowsFile")
        .map_or_else(|| config.join("workflows.json"), |(_, f)| PathBuf::from(f));
    let workflows = WorkflowRegistry::from_file(&file.to_string_lossy()).expect("the functions' workflows");
    let deps = Arc::new(Deps::aws(&sdk, res.clone(), workflows, settings));
    let names = sas_cli::lambda::function_names(&d.outputs).expect("function names");
    Fns {
        s: Stack { name, sdk: sdk.clone(), outputs: d.outputs, res, deps, sqs: aws_sdk_sqs::Client::new(&sdk) },
        names,
        calls,
        lambda: aws_sdk_lambda::Client::new(&sdk),
        logs: aws_sdk_cloudwatchlogs::Client::new(&sdk),
    }
}

fn fixture(name: &str) -> Value {
    let path = Path::new(FIXTURES).join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

impl Fns {
    fn name(&self, id: &str) -> &str {
        self.names.get(id).unwrap_or_else(|| panic!("no function {id}"))
    }

    /// Lambda Invoke (synchronous): the function error kind, if any, and the payload.
    async fn invoke(&self, id: &str, payload: &Value) -> (Option<String>, Value) {
        let out = self
            .lambda
            .invoke()
            .function_name(self.name(id))
            .payload(aws_sdk_lambda::primitives::Blob::new(payload.to_string()))
            .send()
            .await
            .expect("Invoke");
        let body = out.payload().map(|b| b.as_ref().to_vec()).unwrap_or_default();
        (out.function_error().map(str::to_owned), serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    async fn log(&self, id: &str) -> Vec<String> {
        sas_cli::lambda::log_messages(&self.logs, self.name(id)).await.expect("FilterLogEvents")
    }

    /// The function's log once `pred` holds for it (LocalStack writes an invocation's log after
    /// the invocation); the log as it is after `wait` otherwise.
    async fn log_when(&self, id: &str, wait: Duration, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + wait;
        loop {
            let log = self.log(id).await;
            if pred(&log) || Instant::now() > deadline {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A task created `age_ms` ago whose first attempt failed retryably at once, and whose run
    /// message for the retry was lost (never sent); returns it and that run message.
    async fn lost_task(&self, id: &str, age_ms: u64) -> (Task, String) {
        let wf = self.s.deps.workflows.resolve("sim-order", None).expect("sim-order").clone();
        let policy = &self.s.deps.settings.policy;
        let created = Millis(Millis::now().0 - age_ms);
        let tr = protocol::submit(TaskId::try_from(id).unwrap(), wf, json!({}), None, &Ctx::at(created), policy);
        let failed = Event::AgentFailed {
            attempt: tr.task.lock.locked_by.clone().expect("claimed"),
            error: "503".into(),
            retryable: true,
        };
        let tr = protocol::apply(&tr.task, &failed, &Ctx::at(created.plus_ms(1)), policy).expect("a retry");
        self.s.table().create(&tr.task).await.expect("PutItem");
        let rev = tr
            .effects
            .iter()
            .find_map(|e| match e {
                Effect::Run { rev, .. } => Some(*rev),
                _ => None,
            })
            .expect("a task waiting for its retry has a run message");
        let run = SchedulerMessage::Run(RunMessage {
            v: VERSION,
            task_id: tr.task.task_id.clone(),
            rev,
            reason: sas_protocol::messages::RunReason::Retry,
        });
        (tr.task, serde_json::to_string(&run).unwrap())
    }

    /// The least-privilege check of this stack: every call its functions made so far (and the
    /// platform's with their roles) against their roles' policies as IAM has them.
    async fn least_privilege(&self) -> Result<sas_cli::iam::Report, String> {
        let calls = sas_core::aws_calls::read_dir(&self.calls).map_err(|e| format!("the functions' call logs: {e}"))?;
        if calls.is_empty() {
            return Err(format!("no call recorded in {}: is AwsCallLog passed on?", self.calls.display()));
        }
        sas_cli::iam::check_stack(&self.s.sdk, &self.s.name, &calls).await.map_err(|e| format!("{e:#}"))
    }

    /// Checks that no call was denied, then deletes the stack (also when the check fails).
    async fn delete(self) {
        let report = self.least_privilege().await;
        let _ = std::fs::remove_dir_all(&self.calls);
        self.s.delete().await;
        let report = report.unwrap_or_else(|e| panic!("least-privilege check: {e}"));
        assert_eq!(report.denied_count(), 0, "calls the roles do not allow:\n{}", report.render());
    }
}

/// The built-in workflows plus two with a callback step of the sim agent (which accepts the
/// hand-off and reports nothing: the step waits for its answer):
/// - `sim-callback`: `reserve` (a call step), `ship` (callback, heartbeats due every 30 s, two
///   attempts), `confirm` (a call step);
/// - `sim-callback-lost`: `ship` alone, heartbeats due every 2 s, one attempt: a worker that
///   never heartbeats loses it at once (and its answer comes late).
///
/// Written to a file the functions read (`WorkflowsFile`: they run on this machine); returns its
/// path.
fn callback_workflows_file(stack_label: &str) -> PathBuf {
    let mut all: Value = serde_json::from_str(BUILT_IN_WORKFLOWS).expect("built-in workflows");
    let call = |name: &str| {
        json!({"name": name, "agent": "sim", "timeout_ms": 5000, "max_attempts": 2,
               "backoff": {"base_ms": 200, "max_ms": 500}})
    };
    let list = all["workflows"].as_array_mut().expect("a list");
    list.push(json!({
        "name": "sim-callback",
        "version": 1,
        "description": "Lambda-mode test: a call step, a callback step answered by a worker, a call step",
        "steps": [
            call("reserve"),
            {"name": "ship", "kind": "callback", "agent": "sim", "timeout_ms": 120_000, "heartbeat_ms": 30_000,
             "max_attempts": 2, "backoff": {"base_ms": 200, "max_ms": 500}},
            call("confirm")
        ]
    }));
    // An agent with max_in_flight 1: tasks submitted together take turns (the others wait on the
    // agent queue).
    list.push(json!({
        "name": "sim-serial",
        "version": 1,
        "description": "Lambda-mode test: one step on an agent that takes one call at a time",
        "steps": [
            {"name": "call", "agent": "sim.serial", "timeout_ms": 20_000, "schedule_to_start_ms": 120_000,
             "max_attempts": 2, "backoff": {"base_ms": 200, "max_ms": 500}}
        ]
    }));
    list.push(json!({
        "name": "sim-callback-lost",
        "version": 1,
        "description": "Lambda-mode test: a callback step whose worker never heartbeats",
        "steps": [
            {"name": "ship", "kind": "callback", "agent": "sim", "timeout_ms": 60_000, "heartbeat_ms": 2_000,
             "max_attempts": 1}
        ]
    }));
    // Every kind of waiting step in one workflow: a wait, a person's approval (the approval
    // agent), a step a worker answers through the callback queue, one answered over HTTPS.
    list.push(json!({
        "name": "sim-everything",
        "version": 1,
        "description": "Lambda-mode test: wait, approve, pack (queue worker), ship (HTTPS)",
        "steps": [
            {"name": "cool", "kind": "wait", "wait_ms": 2_000},
            {"name": "approve", "kind": "callback", "agent": "approval", "timeout_ms": 600_000, "max_attempts": 1},
            {"name": "pack", "kind": "callback", "agent": "sim", "timeout_ms": 120_000, "heartbeat_ms": 30_000,
             "max_attempts": 2, "backoff": {"base_ms": 200, "max_ms": 500}},
            {"name": "ship", "kind": "callback", "agent": "sim", "timeout_ms": 120_000,
             "max_attempts": 2, "backoff": {"base_ms": 200, "max_ms": 500}}
        ]
    }));
    // Maps whose elements end outside the Scheduler, each telling its parent on the ends queue:
    // one whose element's only attempt hangs (no compensation: the Supervisor's timer ends the
    // element), and one of callback steps (the answer ends the element in the Callback function).
    list.push(json!({
        "name": "sim-map-hung",
        "version": 1,
        "description": "Lambda-mode test: a map whose elements the Supervisor ends when they hang",
        "steps": [
            {"name": "reserve", "agent": "sim", "timeout_ms": 2_000, "max_attempts": 1,
             "map": {"items": "/input/lines", "max_concurrency": 10}}
        ]
    }));
    list.push(json!({
        "name": "sim-callback-map",
        "version": 1,
        "description": "Lambda-mode test: a map of callback steps, each answered through the callback queue",
        "steps": [
            // ten minutes: the least-privilege test answers it after a chain of other waits
            {"name": "ship", "kind": "callback", "agent": "sim", "timeout_ms": 600_000, "max_attempts": 1,
             "map": {"items": "/input/lines", "max_concurrency": 10}}
        ]
    }));
    // The order workflow with time to spare: a task whose charge fails three times ends through
    // the Scheduler (its alert and retries), not through the Supervisor's timer, however late
    // a loaded machine runs each attempt.
    let mut patient = list.iter().find(|w| w["name"] == "sim-order").expect("sim-order is built in").clone();
    patient["name"] = json!("sim-order-patient");
    patient["description"] = json!("Lambda-mode test: sim-order with 60 s per attempt and short backoff");
    for step in patient["steps"].as_array_mut().expect("steps") {
        step["timeout_ms"] = json!(60_000);
        step["backoff"] = json!({"base_ms": 200, "max_ms": 500});
    }
    list.push(patient);
    // The same for the map: its charge waits behind the hung calls on a loaded machine.
    let mut patient_map = list.iter().find(|w| w["name"] == "sim-map").expect("sim-map is built in").clone();
    patient_map["name"] = json!("sim-map-patient");
    patient_map["description"] = json!("Lambda-mode test: sim-map with 60 s per attempt");
    for step in patient_map["steps"].as_array_mut().expect("steps") {
        step["timeout_ms"] = json!(60_000);
    }
    list.push(patient_map);
    let dir = functions_dir().join("workflows");
    std::fs::create_dir_all(&dir).expect("a folder for the workflows file");
    let path = dir.join(format!("{stack_label}-{}.json", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, serde_json::to_string_pretty(&all).unwrap()).expect("writing the workflows file");
    path
}

impl Fns {
    /// Wait until step `step` of task `id` runs an attempt other than `not`; its callback token.
    async fn callback_token(&self, id: &str, step: usize, not: Option<&AttemptToken>) -> CallbackToken {
        let t = self
            .s
            .wait_for(id, Duration::from_mins(1), |t| {
                t.step_index == step
                    && t.steps[step].status == StepStatus::Running
                    && t.lock.locked_by.is_some()
                    && t.lock.locked_by.as_ref() != not
            })
            .await;
        CallbackToken::new(&t.task_id, &t.workflow.steps[step].name, t.lock.locked_by.as_ref().expect("an attempt"))
    }
}

fn answer(token: &CallbackToken, status: &str, extra: Value) -> Value {
    let mut m = json!({"v": 1, "token": token.expose(), "status": status});
    m.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    m
}

/// Lambda mode: a workflow with a callback step runs to Processed when (a) a separate worker (its
/// own task and SQS client) answers through the callback queue, and (b) the answer comes over
/// HTTPS to the Callback function's URL, signed with SigV4. Heartbeats
/// are answered `alive` with the new deadline, a retried attempt's old token `stale` (409), a
/// repeated answer `duplicate`, and what is not an answer 400/405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_callback_steps_are_answered_through_the_queue_and_the_signed_url() {
    let file = callback_workflows_file("cb");
    let file_param = file.to_string_lossy().into_owned();
    let f = lambda_stack("cb", &[("WorkflowsFile", &file_param)]).await;
    let callback_url = f.s.out("CallbackUrl").to_owned();
    eprintln!("[{}] callback URL {callback_url}", f.s.name);
    let sub = |id: &str| json!({"v": 1, "task_id": id, "workflow": "sim-callback", "input": {}});
    for id in ["cb-queue", "cb-url"] {
        f.s.send(&f.s.res.submission_queue_url, &sub(id).to_string()).await;
    }

    // (a) The worker answers through the callback queue: a heartbeat, then the result.
    let token = f.callback_token("cb-queue", 1, None).await;
    let worker = tokio::spawn({
        let sqs = aws_sdk_sqs::Client::new(&f.s.sdk);
        let queue = f.s.out("CallbackQueueUrl").to_owned();
        let msgs = [
            answer(&token, "heartbeat", json!({"details": {"progress": 0.5}})),
            answer(&token, "succeeded", json!({"output": {"tracking": "TRK-queue"}})),
        ];
        async move {
            for m in msgs {
                sqs.send_message().queue_url(&queue).message_body(m.to_string()).send().await.expect("SendMessage");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });

    // (b) Over HTTPS: the URL is LocalStack's `<id>.lambda-url.<region>.<host>`, reached through
    // the endpoint's address; every request is signed.
    let url = sas_cli::callback_url::CallbackUrlClient::new(&f.s.sdk, &callback_url).expect("a URL client");
    let first = f.callback_token("cb-url", 1, None).await;
    let hb = url.answer(&serde_json::from_value(answer(&first, "heartbeat", json!({}))).unwrap()).await.unwrap();
    let reply = hb.reply().unwrap_or_else(|| panic!("not a reply: {} {}", hb.status, hb.raw));
    assert_eq!(
        (hb.status, reply.result),
        (200, CallbackResult::Alive),
        "a heartbeat of the current attempt is taken (is callback::answer built?): {}",
        hb.raw
    );
    assert!(reply.complete_by.is_some() && !reply.stop, "{}", hb.raw);
    let failed = answer(&first, "failed", json!({"error": "the warehouse is closed", "retryable": true}));
    let r = url.answer(&serde_json::from_value(failed).unwrap()).await.unwrap();
    assert_eq!((r.status, r.reply().map(|r| r.result)), (200, Some(CallbackResult::Applied)), "{}", r.raw);
    // The retry is a new attempt with a new token: the first one is stale now.
    let second = f.callback_token("cb-url", 1, Some(first.attempt())).await;
    assert_ne!(second.expose(), first.expose());
    let r = url.answer(&serde_json::from_value(answer(&first, "heartbeat", json!({}))).unwrap()).await.unwrap();
    let reply = r.reply().unwrap_or_else(|| panic!("not a reply: {} {}", r.status, r.raw));
    assert_eq!((r.status, reply.result, reply.stop), (409, CallbackResult::Stale, true), "{}", r.raw);
    let done = answer(&second, "succeeded", json!({"output": {"tracking": "TRK-url"}}));
    let r = url.answer(&serde_json::from_value(done.clone()).unwrap()).await.unwrap();
    assert_eq!((r.status, r.reply().map(|r| r.result)), (200, Some(CallbackResult::Applied)), "{}", r.raw);
    // The sender retries: the same answer again changes nothing and is not an error.
    let r = url.answer(&serde_json::from_value(done).unwrap()).await.unwrap();
    assert_eq!((r.status, r.reply().map(|r| r.result)), (200, Some(CallbackResult::Duplicate)), "{}", r.raw);
    // Not answers: refused with what to do, nothing changed.
    let r = url.post("{\"v\":1,").await.unwrap();
    assert_eq!((r.status, r.body["error"].as_str()), (400, Some("malformed")), "{}", r.raw);
    let r = url.send("GET", "").await.unwrap();
    assert_eq!((r.status, r.body["error"].as_str()), (405, Some("method_not_allowed")), "{}", r.raw);

    worker.await.expect("the queue worker");
    for (id, tracking) in [("cb-queue", "TRK-queue"), ("cb-url", "TRK-url")] {
        let t = f.s.wait_for(id, Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:#?}", t.history);
        assert_eq!(t.steps[1].output.as_ref().map(|o| &o["tracking"]), Some(&json!(tracking)), "{id}");
    }
    assert_eq!(f.s.task("cb-url").await.unwrap().steps[1].attempts, 2, "the failed answer retried the step once");
    // The queue's answers went through the Callback function (its event source), none was refused.
    let answered = ["\"message\":\"callback answered\"", "cb-queue"];
    let log = f.log_when("CallbackFunction", SECS, |l| lines_with(l, &answered).len() >= 2).await;
    assert_eq!(lines_with(&log, &answered).len(), 2, "{log:#?}");
    assert_eq!(f.s.depth(f.s.out("CallbackDlqUrl")).await, 0);

    // What a worker gets (CallbackWorkerPolicy) allows exactly the two ways in, as IAM has it.
    let policy = worker_policy(&f).await;
    let callback_fn = f
        .lambda
        .get_function_configuration()
        .function_name(f.name("CallbackFunction"))
        .send()
        .await
        .expect("GetFunctionConfiguration");
    let fn_arn = callback_fn.function_arn().expect("an ARN").to_owned();
    let queue_arn = f.s.out("CallbackQueueArn").to_owned();
    let req = sas_cli::iam::Request::code;
    let needed: BTreeMap<sas_cli::iam::Request, usize> = [
        (req("sqs:SendMessage", &queue_arn), 1),
        (req("lambda:InvokeFunctionUrl", &fn_arn), 1),
        (req("lambda:InvokeFunction", &fn_arn), 1),
    ]
    .into();
    let r = sas_cli::iam::check_role("worker", "CallbackWorkerPolicy", &policy, &needed);
    assert_eq!(r.denied().count(), 0, "{:#?}", r.requests);
    assert!(r.unused.is_empty(), "grants a worker does not need: {:#?}", r.unused);
    let agent_arn = fn_arn.replace(f.name("CallbackFunction"), f.name("AgentFunction"));
    for (action, resource) in [
        ("sqs:SendMessage", f.s.out("SchedulerQueueArn")),
        ("sqs:ReceiveMessage", queue_arn.as_str()),
        ("lambda:InvokeFunction", agent_arn.as_str()),
        ("dynamodb:PutItem", f.s.out("TaskTableArn")),
    ] {
        let d = sas_cli::iam::evaluate(&policy, action, resource);
        assert_eq!(d, sas_cli::iam::Decision::ImplicitDeny, "a worker may not {action} on {resource}");
    }
    let _ = std::fs::remove_file(&file);
    f.delete().await;
}

/// The statements of the stack's `CallbackWorkerPolicy`, as IAM stores them.
async fn worker_policy(f: &Fns) -> Vec<sas_cli::iam::Statement> {
    let iam = aws_sdk_iam::Client::new(&f.s.sdk);
    sas_cli::iam::managed_policy(&iam, f.s.out("CallbackWorkerPolicyArn")).await.expect("CallbackWorkerPolicy")
}

/// Lambda mode, every kind of waiting step in one workflow (`sim-everything`): a 2 s wait step (no
/// agent: the Supervisor's timer wakes it), a person's approval (the approval agent publishes the
/// token to ApprovalTopic; the test reads it there, as a person reads the email, and approves it
/// with `sasctl approve`'s code), a step a separate worker answers through the callback queue
/// (a heartbeat, then its result), and one answered over HTTPS (signed): the task ends
/// Processed, with each answer's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_a_wait_an_approval_a_queue_worker_and_an_https_answer_run_one_workflow_to_processed() {
    let file = callback_workflows_file("all");
    let file_param = file.to_string_lossy().into_owned();
    let f = lambda_stack("all", &[("WorkflowsFile", &file_param)]).await;
    let approvals = f.s.topic_listener(f.s.out("ApprovalTopicArn"), "approvals", None).await;
    let sub = json!({"v": 1, "task_id": "all", "workflow": "sim-everything", "input": {"order": "o-1"}});
    f.s.send(&f.s.res.submission_queue_url, &sub.to_string()).await;

    // The approval request, as a person receives it: the token and the command to answer.
    let notes = f.s.drain(&approvals, 1, Duration::from_secs(90)).await;
    let note = notes.first().and_then(|m| m.body()).expect("the approval request was published");
    assert!(note.contains("all") && note.contains("o-1"), "the note names the task and shows its input: {note}");
    let token = note.split_whitespace().skip_while(|w| *w != "approve").nth(1).expect("`sasctl approve TOKEN`");
    let token = CallbackToken::try_from(token).expect("a token this stack issued");
    assert_eq!((token.task_id().as_str(), token.unit()), ("all", "approve"));
    let approve = sas_cli::answer::Answer::Approve { comment: Some("stock checked".into()) };
    let reply = sas_core::callback::answer(&f.s.deps, &approve.message(token), None).await.expect("approve");
    assert_eq!(reply.result, CallbackResult::Applied, "{reply:?}");

    // A separate worker answers `pack` through the callback queue.
    let pack = f.callback_token("all", 2, None).await;
    let worker = tokio::spawn({
        let sqs = aws_sdk_sqs::Client::new(&f.s.sdk);
        let queue = f.s.out("CallbackQueueUrl").to_owned();
        let msgs = [
            answer(&pack, "heartbeat", json!({"details": {"packed": 1, "of": 2}})),
            answer(&pack, "succeeded", json!({"output": {"parcel": "P-7"}})),
        ];
        async move {
            for m in msgs {
                sqs.send_message().queue_url(&queue).message_body(m.to_string()).send().await.expect("SendMessage");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    worker.await.expect("the queue worker");

    // `ship` is answered over HTTPS.
    let url = sas_cli::callback_url::CallbackUrlClient::new(&f.s.sdk, f.s.out("CallbackUrl")).expect("a URL client");
    let ship = f.callback_token("all", 3, None).await;
    let done = answer(&ship, "succeeded", json!({"output": {"tracking": "TRK-all"}}));
    let r = url.answer(&serde_json::from_value(done).unwrap()).await.unwrap();
    assert_eq!((r.status, r.reply().map(|r| r.result)), (200, Some(CallbackResult::Applied)), "{}", r.raw);

    let t = f.s.wait_for("all", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!((t.process_state, t.failure_count), (ProcessState::Processed, 0), "{:#?}", t.history);
    let outputs: Vec<Option<&Value>> = t.steps.iter().map(|s| s.output.as_ref()).collect();
    assert_eq!(outputs[1], Some(&json!({"approved": true, "comment": "stock checked"})));
    assert_eq!(outputs[2], Some(&json!({"parcel": "P-7"})));
    assert_eq!(outputs[3], Some(&json!({"tracking": "TRK-all"})));
    // The wait held the task for its 2 s before the approval was asked for.
    let entered = |step: &str| t.history.iter().find(|h| h.step.as_deref() == Some(step)).map(|h| h.at.0);
    let (cool, approval) = (entered("cool").expect("cool ran"), entered("approve").expect("approve ran"));
    assert!(approval >= cool + 2_000, "the wait lasted {} ms", approval - cool);
    let _ = std::fs::remove_file(&file);
    f.delete().await;
}

/// Old enough for the sweep: the retry's CompleteBy (backoff + 30 s), the 10 s result grace and
/// the sweep's 60 s lag have passed.
const LOST_AGE_MS: u64 = 120_000;

fn lines_with<'a>(log: &'a [String], needles: &[&str]) -> Vec<&'a String> {
    log.iter().filter(|l| needles.iter().all(|n| l.contains(n))).collect()
}

/// A configuration directory of the test's own (what the configuration layer is made of): the
/// workspace's agents and `workflows` as the workflows file.
fn config_dir(label: &str, workflows: &[Value]) -> PathBuf {
    let dir = functions_dir().join("configs").join(format!("{label}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a folder for the configuration");
    std::fs::copy(Path::new(CONFIG).join("agents.json"), dir.join("agents.json")).expect("copying agents.json");
    let file = json!({ "workflows": workflows });
    std::fs::write(dir.join("workflows.json"), serde_json::to_string_pretty(&file).unwrap()).expect("workflows.json");
    dir
}

impl Fns {
    /// Deploy this stack again, same binaries, with the configuration layer made of `config`.
    async fn redeploy(&self, config: &Path) -> sas_cli::lambda::Deployed {
        let all = stack_params(&self.calls, &[]);
        let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let started = Instant::now();
        let d = sas_cli::lambda::deploy(&self.s.sdk, &self.s.name, &functions_dir(), config, &all)
            .await
            .unwrap_or_else(|e| panic!("deploying {} again: {e:#}", self.s.name));
        eprintln!("[{}] deployed again in {:.1} s: {:?}", self.s.name, started.elapsed().as_secs_f64(), d.timings);
        d
    }

    /// Each function's code hash and layers, by logical ID.
    async fn code_and_layers(&self) -> BTreeMap<String, (String, Vec<String>)> {
        let mut out = BTreeMap::new();
        for (id, name) in &self.names {
            let c = self.lambda.get_function_configuration().function_name(name).send().await.expect("GetFunction");
            let layers = c.layers().iter().filter_map(|l| l.arn().map(str::to_owned)).collect();
            out.insert(id.clone(), (c.code_sha256().unwrap_or_default().to_owned(), layers));
        }
        out
    }
}

/// Workflows change without a rebuild. The stack is deployed with a configuration of the test's
/// own (the built-in workflows plus `byow-pin`: a 120 s wait, long enough for the update on a
/// slow machine, then a sim step), a `byow-pin` task is submitted, then the stack is deployed again with the same
/// binaries and another configuration: a new workflow `byow-sim`, and `byow-pin` at version 2
/// only (other steps; version 1 is gone from the file). Only the layer changes (one zip uploaded,
/// every function's code hash the same, a new layer version); a `byow-sim` task runs to
/// Processed, and the `byow-pin` task, still waiting when the update is done, ends Processed with
/// the definition it was submitted with. Then a configuration with an invalid workflows file:
/// the functions refuse to start, and say which file, rather than run with the built-in workflows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_workflows_change_without_a_rebuild_and_running_tasks_keep_theirs() {
    let built_in: Value = serde_json::from_str(BUILT_IN_WORKFLOWS).expect("built-in workflows");
    let built_in = built_in["workflows"].as_array().expect("a list").clone();
    let sim = |name: &str| json!({"name": name, "agent": "sim", "timeout_ms": 5000, "max_attempts": 2});
    let pin_v1 = json!({"name": "byow-pin", "version": 1, "description": "before the update",
                        "steps": [{"name": "hold", "kind": "wait", "wait_ms": 120_000}, sim("after-hold")]});
    let pin_v2 = json!({"name": "byow-pin", "version": 2, "description": "after the update",
                        "steps": [sim("other")]});
    let first = config_dir("first", &[built_in.clone(), vec![pin_v1]].concat());
    let f = lambda_stack_with("cfg", &first, &[]).await;
    let before = f.code_and_layers().await;
    let sub = |id: &str, wf: &str| json!({"v": 1, "task_id": id, "workflow": wf, "input": {}}).to_string();
    f.s.send(&f.s.res.submission_queue_url, &sub("pin-1", "byow-pin")).await;
    f.s.wait_for("pin-1", Duration::from_mins(1), |t| t.step_index == 0 && !t.process_state.is_terminal()).await;

    // Named after the stack: a layer zip no earlier run has uploaded.
    let byow_sim = json!({"name": "byow-sim", "version": 1, "description": format!("deployed to {} without a rebuild", f.s.name),
                          "steps": [sim("reserve"), sim("ship")]});
    let second = config_dir("second", &[built_in, vec![pin_v2, byow_sim]].concat());
    let d = f.redeploy(&second).await;
    let after = f.code_and_layers().await;
    assert_eq!(d.uploaded, 1, "only the layer's zip is new (the code's are in the bucket): {:?}", d.zip_bytes);
    for (id, (code, layers)) in &after {
        let (old_code, old_layers) = &before[id];
        assert_eq!(code, old_code, "{id}: the same code");
        assert_eq!(layers.len(), 1, "{id}: {layers:?}");
        assert_ne!(layers, old_layers, "{id}: a new layer version");
    }
    let pinned = f.s.task("pin-1").await.expect("pin-1");
    assert!(
        pinned.step_index == 0 && !pinned.process_state.is_terminal(),
        "pin-1 is still waiting when the update is done (the update took too long?): {:?}",
        pinned.history
    );

    // What the stack runs, read back as `sasctl ui` shows it: the Scheduler's configuration
    // layer, through the calls the operator's policy grants and no others.
    let deployed =
        sas_cli::deployed::config(&f.s.sdk, &f.names["SchedulerFunction"]).await.expect("the deployed files");
    assert!(deployed.workflows.contains(&format!("deployed to {} without a rebuild", f.s.name)), "{}", deployed.layer);
    assert!(
        deployed.agents.is_some() && deployed.layer.contains(&format!(":layer:{}-config:", f.s.name)),
        "{deployed:?}"
    );
    let scheduler = f.lambda.get_function_configuration().function_name(&f.names["SchedulerFunction"]).send().await;
    let scheduler = scheduler.expect("GetFunctionConfiguration").function_arn().expect("an ARN").to_owned();
    let iam = aws_sdk_iam::Client::new(&f.s.sdk);
    let operator =
        sas_cli::iam::managed_policy(&iam, &f.s.outputs["OperatorPolicyArn"]).await.expect("the OperatorPolicy");
    for (action, resource, allowed) in [
        ("lambda:GetFunctionConfiguration", scheduler.as_str(), true),
        ("lambda:GetLayerVersion", deployed.layer.as_str(), true),
        ("lambda:GetFunctionConfiguration", &scheduler.replace(&f.names["SchedulerFunction"], "another"), false),
        ("lambda:GetLayerVersion", &deployed.layer.replace(&f.s.name, "another"), false),
    ] {
        let d = sas_cli::iam::evaluate(&operator, action, resource);
        assert_eq!(matches!(d, sas_cli::iam::Decision::Allowed(_)), allowed, "{action} on {resource}: {d:?}");
    }

    f.s.send(&f.s.res.submission_queue_url, &sub("new-1", "byow-sim")).await;
    let t = f.s.wait_for("new-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:#?}", t.history);
    let t = f.s.wait_for("pin-1", Duration::from_mins(4), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{:#?}", t.history);
    let steps: Vec<&str> = t.workflow.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((t.workflow.version, steps), (1, vec!["hold", "after-hold"]), "its pinned definition");

    // An invalid workflows file: every start fails, naming the file.
    let broken = config_dir("broken", &[]);
    std::fs::write(broken.join("workflows.json"), r#"{"workflows": [{"name": "half"#).expect("workflows.json");
    f.redeploy(&broken).await;
    let (err, resp) = f.invoke("SchedulerFunction", &fixture("scheduler-sqs-partial-failure.json")).await;
    assert!(err.is_some(), "the function ran with a broken workflows file: {resp}");
    let log = f.log_when("SchedulerFunction", SECS, |l| l.iter().any(|m| m.contains("is not valid"))).await;
    let said: Vec<&String> = log.iter().filter(|m| m.contains("is not valid")).collect();
    assert!(
        said.iter().any(|m| m.contains("opt/workflows.json is not valid") && m.contains("cannot start")),
        "no start error naming the workflows file in {log:#?}"
    );
    for dir in [first, second, broken] {
        let _ = std::fs::remove_dir_all(dir);
    }
    f.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_deployed_functions_are_wired_and_answer_the_fixtures() {
    let f = lambda_stack("wired", &[]).await;
    let checks = sas_cli::lambda::verify(&f.s.sdk, &f.s.outputs).await.expect("verify");
    let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.what.as_str()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(checks.len(), 22, "4 checks per function, the rule and the callback URL: {checks:#?}");

    // The record that can never parse is kept in the scheduler DLQ at once (never retried), so
    // nothing in this batch is returned for another delivery.
    let (err, resp) = f.invoke("SchedulerFunction", &fixture("scheduler-sqs-partial-failure.json")).await;
    assert_eq!(err, None, "{resp}");
    assert_eq!(resp, json!({"batchItemFailures": []}));
    // The scheduled event: a sweep of an empty index.
    let (err, resp) = f.invoke("SupervisorFunction", &fixture("supervisor-scheduled.json")).await;
    assert_eq!(err, None, "{resp}");
    assert_eq!(resp, json!({"expired": 0, "handed": 0, "errors": 0, "scheduled": 0}));
    // The Callback function invoked directly with an answer (what a tool may do): the reply; a
    // body that is not an answer is a function error.
    let token = "0f8e7d6c5b4a39281706f5e4d3c2b1a0:ship:nobody";
    let (err, resp) = f.invoke("CallbackFunction", &json!({"v": 1, "token": token, "status": "heartbeat"})).await;
    assert_eq!(err, None, "{resp}");
    assert_eq!((&resp["result"], &resp["stop"]), (&json!("unknown"), &json!(true)), "{resp}");
    let (err, resp) = f.invoke("CallbackFunction", &json!({"v": 1, "token": token, "status": "shipped"})).await;
    assert_eq!(err.as_deref(), Some("Unhandled"), "{resp}");
    assert!(!resp.to_string().contains("0f8e7d6c"), "the error never echoes the token: {resp}");
    // A trigger the function does not serve is a function error (and so an Errors alarm).
    let (err, resp) = f.invoke("SubmitterFunction", &fixture("supervisor-scheduled.json")).await;
    assert_eq!(err.as_deref(), Some("Unhandled"), "{resp}");
    assert!(resp.to_string().contains("only the supervisor runs on a schedule"), "{resp}");

    // Each invocation is in the function's log group, with the platform's records around it.
    let log = f.log_when("SchedulerFunction", SECS, |l| l.iter().any(|m| m.contains("platform.report"))).await;
    assert_eq!(sas_cli::lambda::invocations(&log), 1, "{log:#?}");
    let kept = lines_with(&log, &["d4e0f9a8-2b3c-4d5e-9fa0-1b2c3d4e5f60", "malformed message moved to its DLQ"]);
    assert_eq!(kept.len(), 1, "{log:#?}");
    assert!(log.iter().any(|l| l.contains("platform.report")), "{log:#?}");
    f.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_a_workflow_runs_through_every_function_and_the_timer_queue() {
    // No queue budget: an attempt's execution deadline is its CompleteBy, so the hung agent has no
    // time left to say it timed out (as a crashed one never does): only the timer can act.
    let f = lambda_stack("flow", &[("QueueBudgetMs", "0")]).await;
    let reply = f.s.reply_queue("replies", true).await;
    // reserve's first attempt never answers: only the deadline timer (a delayed message on the
    // supervisor queue, handled by the Supervisor function) can notice; the rule is a day away.
    let sub = json!({"v": 1, "task_id": "w1", "workflow": "sim-order", "reply_to": reply,
                     "input": {"sim": {"reserve": {"hang_attempts": 1}}}});
    // Sent with a trace header, as an application traced by X-Ray sends it: every status the task
    // sends back carries the same trace, through every function it passed.
    let trace = "Root=1-6560e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let header = aws_sdk_sqs::types::MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(trace)
        .build()
        .unwrap();
    f.s.sqs
        .send_message()
        .queue_url(&f.s.res.submission_queue_url)
        .message_body(sub.to_string())
        .message_system_attributes(aws_sdk_sqs::types::MessageSystemAttributeNameForSends::AwsTraceHeader, header)
        .send()
        .await
        .unwrap();
    f.s.send(&f.s.res.submission_queue_url, "{not json").await;

    let t = f.s.wait_for("w1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    // reserve's hung first attempt timed out and was retried; every step here has a 5 s CompleteBy
    // (no queue budget), which a slow machine's round trip may pass too: a failure and a retry more
    assert_eq!(t.process_state, ProcessState::Processed, "{:#?}", t.history);
    assert!(t.failure_count >= 1, "{:#?}", t.history);
    assert!(t.steps[0].failures >= 1 && t.steps[0].attempts == t.steps[0].failures + 1, "{:?}", t.steps[0]);
    assert!(t.steps.iter().all(|s| s.status == StepStatus::Succeeded));
    assert!(t.history.iter().any(|h| h.reason.as_deref().is_some_and(|r| r.contains("passed CompleteBy"))));
    assert_eq!(t.steps[2].output.as_ref().unwrap()["idempotency_key"], "w1:ship");

    // The caller's reply queue got every state change, in order (a FIFO queue).
    let msgs = f.s.drain(&reply, t.history.len() + 1, Duration::from_secs(10)).await;
    for m in &msgs {
        let got = m.attributes().and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader));
        assert_eq!(got.map(String::as_str), Some(trace), "{:?}", m.body());
    }
    let st: Vec<StatusMessage> = msgs.iter().map(|m| serde_json::from_str(m.body().unwrap()).unwrap()).collect();
    let states: Vec<ProcessState> = st.iter().map(|m| m.state).collect();
    use ProcessState::{Pending, Processed, Processing};
    // each of the task's changes, once: Processing, the timeout (Pending), a Processing for each step
    // claimed (and each retry), Processed
    assert_eq!(states, t.history.iter().map(|h| h.state).collect::<Vec<_>>());
    assert_eq!((states[..2].to_vec(), states.last()), (vec![Processing, Pending], Some(&Processed)), "{states:?}");
    assert_eq!(states.iter().filter(|s| **s == Processing).count(), 3 + t.failure_count as usize, "{states:?}");
    assert!(st.windows(2).all(|w| w[0].seq < w[1].seq));

    // The malformed submission: kept in the submission DLQ with its reason, no task.
    let kept = f.s.drain(&f.s.res.submission_dlq_url, 1, Duration::from_secs(10)).await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].body(), Some("{not json"));
    let reason = kept[0].message_attributes().and_then(|a| a.get("RejectReason")).and_then(|v| v.string_value());
    assert!(reason.is_some_and(|r| r.contains("not JSON")), "{reason:?}");

    // Every function was invoked by LocalStack and logged it in /aws/lambda/<fn>.
    for id in ["SubmitterFunction", "SchedulerFunction", "AgentFunction", "SupervisorFunction"] {
        let log = f.log_when(id, SECS, |l| sas_cli::lambda::invocations(l) > 0).await;
        assert!(sas_cli::lambda::invocations(&log) > 0, "{id}: no invocation in its log group");
    }
    let timer = ["\"task_id\":\"w1\"", "deadline_expired", "\"message\":\"transition\""];
    let sup = f.log_when("SupervisorFunction", SECS, |l| !lines_with(l, &timer).is_empty()).await;
    assert!(!lines_with(&sup, &timer).is_empty(), "the Supervisor function (timer) moved w1 on: {sup:#?}");

    // The metrics, as the functions wrote them to their logs: every EMF record valid, and each
    // function's own measurements there.
    let wants: [(&str, &[&str]); 4] = [
        ("SubmitterFunction", &["TasksStarted", "StepsStarted", "SubmissionsRejected"]),
        ("AgentFunction", &["StepScheduleTime", "StepRunTime"]),
        ("SupervisorFunction", &["StepsTimedOut"]),
        ("SchedulerFunction", &["StepsSucceeded", "StepRetries", "TasksSucceeded", "TaskTime"]),
    ];
    for (id, want) in wants {
        let names = |log: &[String]| -> BTreeSet<String> {
            log.iter()
                .filter(|l| l.contains("\"_aws\""))
                .flat_map(|l| {
                    let rec = sas_core::metrics::check_emf(l).unwrap_or_else(|e| panic!("{id}: {e}: {l}"));
                    assert_eq!(rec.namespace, sas_core::metrics::DEFAULT_NAMESPACE);
                    rec.metrics.into_iter().map(|m| m.0)
                })
                .collect()
        };
        let log = f.log_when(id, SECS, |l| want.iter().all(|w| names(l).contains(*w))).await;
        let got = names(&log);
        assert!(want.iter().all(|w| got.contains(*w)), "{id}: wanted {want:?}, its EMF records hold {got:?}");
    }
    f.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_an_invoked_sweep_recovers_a_lost_run_message() {
    let f = lambda_stack("sweep", &[]).await;
    // Its retry's run message was lost two minutes ago: CompleteBy (30 s start timeout), the
    // result grace and the sweep's lag have passed.
    let (t, _) = f.lost_task("lost-1", LOST_AGE_MS).await;
    assert!(t.complete_by.is_some_and(|c| c < Millis::now()));
    let (err, report) = f.invoke("SupervisorFunction", &fixture("supervisor-scheduled.json")).await;
    assert_eq!(err, None, "{report}");
    assert_eq!(report, json!({"expired": 1, "handed": 1, "errors": 0, "scheduled": 0}));
    let t = f.s.wait_for("lost-1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!((t.process_state, t.failure_count), (ProcessState::Processed, 1), "{:#?}", t.history);
    f.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_the_scheduled_rule_sweeps_a_lost_run_message() {
    let f = lambda_stack("rule", &[("SupervisorSchedule", "rate(1 minute)")]).await;
    let (_, _) = f.lost_task("lost-2", LOST_AGE_MS).await;
    let started = Instant::now();
    // LocalStack's scheduler loop fires rate(1 minute) rules every ~60 s, at a phase of its own;
    // then a hand-over, a restart and three steps, each a Lambda round trip (slow on a slow machine)
    let t = f.s.wait_for("lost-2", Duration::from_secs(200), |t| t.process_state.is_terminal()).await;
    eprintln!(
        "[{}] the rule's sweep recovered lost-2; Processed {:.1} s after it was created",
        f.s.name,
        started.elapsed().as_secs_f64()
    );
    assert_eq!((t.process_state, t.failure_count), (ProcessState::Processed, 1), "{:#?}", t.history);
    let swept = ["\"message\":\"sweep\"", "\"handed\":1"];
    let sup = f.log_when("SupervisorFunction", SECS, |l| !lines_with(l, &swept).is_empty()).await;
    assert!(!lines_with(&sup, &swept).is_empty(), "a scheduled invocation of the Supervisor swept it: {sup:#?}");
    f.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_a_failing_record_alone_is_redelivered_until_its_dlq() {
    // Without the batching window: under it, LocalStack once kept the failing record out of the
    // DLQ for over 90 s (not understood yet; the window is not what this test is about).
    // At DEBUG: a stale event (the good record seen again) is logged at debug.
    let f = lambda_stack("batch", &[("BatchingWindowSeconds", "0"), ("LogLevel", "DEBUG")]).await;
    // Redelivery waits for the visibility timeout (90 s in the template): 2 s on this test's queue.
    f.s.sqs
        .set_queue_attributes()
        .queue_url(&f.s.res.scheduler_queue_url)
        .attributes(QueueAttributeName::VisibilityTimeout, "2")
        .send()
        .await
        .expect("SetQueueAttributes");
    let (_, run) = f.lost_task("b1", 0).await;
    // A record that fails on every delivery: a run message for a task whose item cannot be read.
    aws_sdk_dynamodb::Client::new(&f.s.sdk)
        .put_item()
        .table_name(f.s.out("TaskTableName"))
        .item("TaskId", aws_sdk_dynamodb::types::AttributeValue::S("unreadable".into()))
        .item("ProcessState", aws_sdk_dynamodb::types::AttributeValue::S("Pending".into()))
        .send()
        .await
        .expect("PutItem");
    let bad = r#"{"type":"run","v":1,"task_id":"unreadable","rev":1,"reason":"start"}"#;
    // A record that can never parse: kept in the DLQ at once, with its reason (not redelivered).
    let malformed = r#"{"type":"run","v":1,"task_id":"b1""#;
    let sent =
        f.s.sqs
            .send_message_batch()
            .queue_url(&f.s.res.scheduler_queue_url)
            .entries(SendMessageBatchRequestEntry::builder().id("good").message_body(&run).build().unwrap())
            .entries(SendMessageBatchRequestEntry::builder().id("bad").message_body(bad).build().unwrap())
            .entries(SendMessageBatchRequestEntry::builder().id("malformed").message_body(malformed).build().unwrap())
            .send()
            .await
            .expect("SendMessageBatch");
    let id_of = |which: &str| {
        sent.successful().iter().find(|e| e.id() == which).map(|e| e.message_id().to_owned()).expect("sent")
    };
    let (good_id, bad_id) = (id_of("good"), id_of("bad"));

    let t = f.s.wait_for("b1", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!((t.process_state, t.failure_count), (ProcessState::Processed, 1), "{:#?}", t.history);
    let attempts: Vec<u32> = t.steps.iter().map(|s| s.attempts).collect();
    assert_eq!(attempts, vec![2, 1, 1], "one claim per attempt");
    // The malformed record is in the DLQ at once, with its reason; the unreadable task's record
    // fails five times (maxReceiveCount 5), then SQS moves it there too: five visibility timeouts
    // of 2 s, each redelivery then waiting for the event source's 1 s batching window and poll.
    let dead = f.s.drain(f.s.out("SchedulerDlqUrl"), 2, Duration::from_secs(90)).await;
    let mut bodies: Vec<&str> = dead.iter().filter_map(|m| m.body()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, {
        let mut want = vec![bad, malformed];
        want.sort_unstable();
        want
    });
    let kept = dead.iter().find(|m| m.body() == Some(malformed)).unwrap();
    let reason = kept.message_attributes().and_then(|a| a.get("RejectReason")).and_then(|v| v.string_value());
    assert!(reason.is_some_and(|r| r.starts_with("malformed message")), "{kept:?}");
    assert_eq!(f.s.depth(&f.s.res.scheduler_queue_url).await, 0);

    let log = f.log_when("SchedulerFunction", SECS, |l| lines_with(l, &[&bad_id, "record failed"]).len() >= 5).await;
    let bad_failures = lines_with(&log, &[&bad_id, "record failed"]).len();
    assert_eq!(bad_failures, 5, "the bad record failed once per delivery: {log:#?}");
    // The good record was handled once: one claim, never failed, never seen again (a redelivery
    // would have been dropped as stale).
    assert_eq!(lines_with(&log, &[&good_id, "\"message\":\"transition\"", "\"event\":\"claim\""]).len(), 1, "{log:#?}");
    assert!(lines_with(&log, &[&good_id, "record failed"]).is_empty(), "{log:#?}");
    assert!(lines_with(&log, &[&good_id, "stale event dropped"]).is_empty(), "{log:#?}");
    f.delete().await;
}

/// On deployed functions: `sim-graph`, a map of 100 elements (ten at once) then two parallel
/// branches (charge beside a fraud check) then ship, runs to `Processed` with
/// the map's outputs in element order and both branches' outputs; the same workflow with one
/// element refused for good ends `Compensated`, every element that applied undone exactly once,
/// the others never, and no branch started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_a_graph_with_two_branches_and_a_hundred_element_map_runs_and_one_refused_element_compensates_the_others(
) {
    let file = callback_workflows_file("map");
    let f = lambda_stack("map", &[("WorkflowsFile", &file.to_string_lossy())]).await;
    let lines: Vec<Value> = (0..100).map(|i| json!({"sku": format!("s{i}")})).collect();
    let mut bad: Vec<Value> = (0..40).map(|i| json!({"sku": format!("s{i}")})).collect();
    bad[23] = json!({"sku": "s23", "sim": {"reserve": {"permanent": "out of stock"}}});
    for (id, lines) in [("map-ok", &lines), ("map-bad", &bad)] {
        let body = json!({"v": 1, "task_id": id, "workflow": "sim-graph", "input": {"lines": lines}});
        f.s.send(&f.s.res.submission_queue_url, &body.to_string()).await;
    }
    let ok = f.s.wait_for("map-ok", Duration::from_mins(5), |t| t.process_state.is_terminal()).await;
    assert_eq!(ok.process_state, ProcessState::Processed, "{:?}", ok.reason);
    let out = ok.steps[0].output.as_ref().and_then(Value::as_array).expect("the elements' outputs").clone();
    assert_eq!(out.len(), 100);
    assert!(out.iter().enumerate().all(|(i, o)| o["idempotency_key"] == format!("map-ok~0~{i}:reserve")), "{out:?}");
    // the two branches ran as tasks of their own (the charge and the fraud check), then ship
    let branches =
        f.s.deps.store.get_many(&[TaskId::child(&ok.task_id, 1, 0), TaskId::child(&ok.task_id, 1, 1)]).await.unwrap();
    let names: Vec<&str> = branches.iter().map(|b| b.steps[0].name.as_str()).collect();
    assert_eq!(branches.len(), 2, "{names:?}");
    assert!(branches.iter().all(|b| b.process_state == ProcessState::Processed), "{branches:?}");
    let outputs = ok.outputs();
    for (step, key) in [("charge", "map-ok~1~0:charge"), ("fraud", "map-ok~1~1:fraud"), ("ship", "map-ok:ship")] {
        assert_eq!(outputs[step]["idempotency_key"], key, "{step}: {outputs}");
    }
    let bad = f.s.wait_for("map-bad", Duration::from_mins(5), |t| t.process_state.is_terminal()).await;
    assert_eq!(bad.process_state, ProcessState::Compensated, "{:?}", bad.reason);
    let p = bad.steps[0].map.as_ref().expect("the map's progress");
    let ids: Vec<TaskId> = (0..p.started).map(|e| TaskId::child(&bad.task_id, 0, e)).collect();
    let elements = f.s.deps.store.get_many(&ids).await.unwrap();
    assert_eq!(elements.len(), p.started as usize, "every element started exists");
    let mut undone = 0;
    for e in &elements {
        let step = &e.steps[0];
        let comp = step.compensation.as_ref();
        if step.status == StepStatus::Succeeded || step.maybe_applied {
            // applied: undone exactly once (by the map's undo, or by itself when the stop
            // cancelled it while it ran)
            assert!(
                matches!(e.process_state, ProcessState::Compensated | ProcessState::Cancelled),
                "{}: {:?}",
                e.task_id,
                e.history
            );
            let c = comp.expect("its compensation ran");
            assert_eq!((c.status, c.attempts), (CompensationStatus::Done, 1), "{}: undone once", e.task_id);
            undone += 1;
        } else {
            assert!(comp.is_none(), "{}: nothing applied, nothing undone", e.task_id);
        }
    }
    assert!(undone > 0, "some elements had applied before the stop");
    assert!(bad.steps[1..].iter().all(|s| s.attempts == 0), "no branch started, nothing charged or shipped");
    let branch = f.s.deps.store.get(&TaskId::child(&bad.task_id, 1, 0)).await.unwrap();
    assert!(branch.is_none(), "no branch task was created");
    f.delete().await;
}

/// The least-privilege proof (LocalStack Community does not enforce IAM): a workload that reaches
/// every path on which a function calls AWS, recorded by the functions themselves
/// (`SAS_AWS_CALL_LOG`), then every call, and the platform's calls with each role, evaluated
/// against the roles' policies as IAM holds them for this deployed stack. Reply queues are
/// narrowed to this test's own (`ReplyQueueArnPattern`), so no account-wide grant hides a missing
/// one. Fails on any call not allowed, and on any grant no call used.
/// The submissions the parser cannot read (a non-ASCII id, nested past its 128 levels, cut short),
/// which must still be dead-lettered with their reason in Lambda mode, and every other kind the
/// book says is refused (docs/reference/messages.md, "Rejected"): `(name, body, what the reason says)`.
fn hostile_submissions(run: &str, reply: &str) -> Vec<(&'static str, String, &'static str)> {
    let sub = |id: &str, extra: Value| {
        let mut b = json!({"v": 1, "task_id": format!("{id}-{run}"), "workflow": "order", "reply_to": reply,
                           "input": {"customer": "c-1", "items": [{"sku": "book", "qty": 1}]}});
        for (k, v) in extra.as_object().expect("an object") {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let raw = |id: &str, input: &str| {
        format!(r#"{{"v":1,"task_id":"{id}-{run}","workflow":"order","reply_to":"{reply}","input":{input}}}"#)
    };
    vec![
        ("non-ascii", sub("заказé", json!({})), "task_id contains 'з'"),
        ("deep", raw("deep", &format!("{}{}", "[".repeat(300), "]".repeat(300))), "nests more than 128 levels deep"),
        ("deeper", raw("deeper", &format!("{}{}", "[".repeat(5_000), "]".repeat(5_000))), "nests more than 128 levels"),
        ("cut", format!(r#"{{"v":1,"task_id":"cut-{run}","reply_to":"{reply}","input":"#), "not JSON"),
        ("version", sub("v2", json!({"v": 2})), "unsupported message version 2"),
        ("workflow", sub("uwf", json!({"workflow": "nope"})), "unknown workflow nope"),
        ("big", sub("big", json!({"input": {"x": "a".repeat(70_000)}})), "input is 70"),
        ("empty-key", sub("ek", json!({"input": {"": 1}})), "empty key"),
        ("repeated-key", raw("dk", r#"{"a":1,"a":2}"#), "appears twice"),
        ("number", raw("bn", r#"{"a":1e200}"#), "outside the numbers DynamoDB stores"),
        ("field", sub("uf", json!({"extra": 1})), "unknown field `extra`"),
        (
            "nested",
            sub(
                "n32",
                json!({"input": serde_json::from_str::<Value>(&format!("{}{}", "[".repeat(33), "]".repeat(33))).unwrap()}),
            ),
            "nested deeper",
        ),
        ("long-id", sub(&"L".repeat(300), json!({})), "the limit is 128"),
        ("tilde", sub("t~1~2", json!({})), "task_id contains '~'"),
        (
            "reply-to",
            sub("br", json!({"reply_to": "https://sqs.us-east-1.amazonaws.com/123456789012/x"})),
            "not on this stack's allow-list",
        ),
        ("array", "[1,2,3]".to_owned(), "must be a JSON object"),
    ]
}

/// In Lambda mode with the functions' default queue budget (300 s): the charge of one order hangs
/// on every attempt (the order service never answers); each attempt is reported timed out by the
/// Agent at its 5 s deadline and retried, and the order ends Compensated in well under a minute
/// (not after each attempt's whole queue budget). A second order's charge hangs and it is
/// cancelled meanwhile: it ends Cancelled within seconds (not at the attempt's hard deadline), its
/// reservation released once. Beside them, a batch of hostile submissions: each is in the
/// submission DLQ with its reason within seconds, and those that name a reply queue the stack may
/// use hear `Rejected` there (the deep ones included: LocalStack's SQS event source, as
/// infra/localstack.sh patches it, hands the function the raw body as AWS does; parsing it first,
/// it chokes on a deep body and drops its whole batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_a_hung_charge_is_retried_at_its_timeout_a_cancel_ends_it_promptly_and_hostile_submissions_are_refused_at_once(
) {
    let (base, svc) = sas_order_service::spawn_local().await.unwrap();
    let f = lambda_stack(
        "hangs",
        &[("OrderServiceUrl", &base), ("QueueBudgetMs", "300000"), ("ResultGraceMs", "10000"), ("SettleMs", "2000")],
    )
    .await;
    let run = &f.s.name[f.s.name.len() - 8..];
    let (all, cancelled) = (format!("hang-all-{run}"), format!("hang-cancel-{run}"));
    for order in [&all, &cancelled] {
        let rule = json!({"order": order, "endpoint": "/payment/charge", "hang": true});
        svc.add_fault(serde_json::from_value(rule).expect("a fault rule"));
    }
    let order = |id: &str| {
        json!({"v": 1, "task_id": id, "workflow": "order", "input": {"customer": "c-1", "items": [{"sku": "book", "qty": 1}]}})
            .to_string()
    };
    let reply = f.s.reply_queue("hostile", false).await;
    let hostile = hostile_submissions(run, &reply);
    let submitted = Instant::now();
    for id in [&all, &cancelled] {
        f.s.send(&f.s.res.submission_queue_url, &order(id)).await;
    }
    for chunk in hostile.chunks(10) {
        let entries: Vec<SendMessageBatchRequestEntry> = chunk
            .iter()
            .map(|(name, body, _)| {
                SendMessageBatchRequestEntry::builder().id(*name).message_body(body).build().unwrap()
            })
            .collect();
        let out =
            f.s.sqs
                .send_message_batch()
                .queue_url(&f.s.res.submission_queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
        assert!(out.expect("SendMessageBatch").failed.is_empty());
    }

    // the cancel, once the second order's charge hangs
    f.s.wait_for(&cancelled, Duration::from_mins(1), |t| {
        t.current_step_name() == Some("charge") && t.process_state == ProcessState::Processing
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cancel_at = Instant::now();
    sas_cli::ops::cancel(&f.s.deps, &TaskId::try_from(cancelled.as_str()).unwrap(), "customer cancelled")
        .await
        .unwrap();

    // every hostile submission is refused at once, with its reason
    let dlq = f.s.out("SubmissionDlqUrl").to_owned();
    let kept = f.s.drain(&dlq, hostile.len(), Duration::from_mins(1)).await;
    let refused_in = submitted.elapsed();
    let reasons: Vec<String> = kept
        .iter()
        .map(|m| {
            let attrs = m.message_attributes.clone().unwrap_or_default();
            attrs.get("RejectReason").and_then(|a| a.string_value.clone()).unwrap_or_default()
        })
        .collect();
    for (name, body, want) in &hostile {
        assert!(
            kept.iter().zip(&reasons).any(|(m, r)| m.body.as_deref() == Some(body.as_str()) && r.contains(want)),
            "{name}: not kept raw in the submission DLQ with a reason saying {want:?}; kept: {reasons:#?}"
        );
    }
    assert_eq!(kept.len(), hostile.len(), "{reasons:#?}");
    eprintln!(
        "[{}] {} hostile submissions in the submission DLQ with their reasons {:.1} s after they were sent",
        f.s.name,
        kept.len(),
        refused_in.as_secs_f64()
    );
    // all but the two that name no usable reply queue hear Rejected
    let statuses = f.s.bodies(&reply, hostile.len() - 2, Duration::from_secs(30)).await;
    let rejected: Vec<&Value> = statuses.iter().filter(|s| s["state"] == "Rejected").collect();
    assert_eq!(rejected.len(), hostile.len() - 2, "{statuses:#?}");
    for id in [format!("deep-{run}"), format!("deeper-{run}"), format!("cut-{run}")] {
        assert!(rejected.iter().any(|s| s["task_id"] == id.as_str()), "{id}: no Rejected status");
    }

    // the cancel ends the second order within one timeout and the settling margin, and a little
    let t = f.s.wait_for(&cancelled, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    let cancel_took = cancel_at.elapsed();
    assert_eq!(t.process_state, ProcessState::Cancelled, "{:?}", t.reason);
    eprintln!("[{}] {cancelled}: Cancelled {:.1} s after the cancel", f.s.name, cancel_took.as_secs_f64());
    assert!(cancel_took < Duration::from_secs(40), "Cancelled {cancel_took:?} after the cancel");

    // the first order: every charge attempt said timed out by its agent, at its deadline
    let t = f.s.wait_for(&all, Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    let took = submitted.elapsed();
    assert_eq!(t.process_state, ProcessState::Compensated, "{:?}", t.reason);
    let held = crate::common::assert_timed_out_by_the_agent(&t, "charge", 3, 5_000, 20_000);
    eprintln!(
        "[{}] {all}: Compensated {:.1} s after its submission; charge attempts held {held:?} ms",
        f.s.name,
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(90), "Compensated {took:?} after its submission");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let ops =
        |order: &str| -> Vec<String> { svc.ledger().into_iter().filter(|e| e.order == order).map(|e| e.op).collect() };
    assert_eq!(ops(&all), vec!["reserve", "release"], "the charge never applied; the reservation released once");
    assert_eq!(ops(&cancelled), vec!["reserve", "release"]);
    f.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_least_privilege_every_call_is_granted_and_every_grant_is_used() {
    let file = callback_workflows_file("iam");
    let file_param = file.to_string_lossy().into_owned();
    // the workspace's agents and one that takes one call at a time
    let mut wfs: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("the workflows file");
    // one step of an aws agent (DynamoDB's PutItem), its item named by the task
    wfs["workflows"].as_array_mut().expect("a list").push(json!({
        "name": "aws-put",
        "version": 1,
        "description": "Lambda-mode test: an item written by the aws agent",
        "steps": [{"name": "put", "agent": "aws.put", "timeout_ms": 20_000, "max_attempts": 3,
                   "backoff": {"base_ms": 200, "max_ms": 500},
                   "parameters": {"Item": {"id": {"S.$": "$.task.id"}, "note": {"S.$": "$.input.note"}}}},
                  // S3 over REST-XML, and SNS over the query protocol
                  {"name": "object", "agent": "aws.object", "timeout_ms": 20_000, "max_attempts": 3,
                   "backoff": {"base_ms": 200, "max_ms": 500},
                   "parameters": {"Key.$": "States.Format('notes/{}.json', $.task.id)", "Body": {"note.$": "$.input.note"}}},
                  {"name": "notify", "agent": "aws.notify", "timeout_ms": 20_000, "max_attempts": 3,
                   "backoff": {"base_ms": 200, "max_ms": 500},
                   "parameters": {"Message.$": "$.input.note", "MessageAttributes": {"task": {"DataType": "String", "StringValue.$": "$.task.id"}}}}]
    }));
    // a map over a CSV in S3: the s3_items agent reads it and writes its pages, a child per page
    // reads its page with an aws agent (s3:getObject) and maps its rows
    let timing = json!({"timeout_ms": 20_000, "max_attempts": 3, "backoff": {"base_ms": 200, "max_ms": 500}});
    let with = |step: Value| {
        let mut s = step;
        for (k, v) in timing.as_object().expect("an object") {
            s[k] = v.clone();
        }
        s
    };
    wfs["workflows"].as_array_mut().expect("a list").extend([
        json!({"name": "s3-rows", "version": 1, "description": "Lambda-mode test: a map over a CSV in S3",
               "steps": [with(json!({"name": "read", "agent": "items.read",
                                     "parameters": {"Key": "rows/in.csv", "ReaderConfig": {"InputType": "CSV"}}})),
                         {"name": "rows", "kind": "workflow", "workflow": "s3-rows-page", "version": 1,
                          "map": {"items": "/outputs/read/pages", "max_concurrency": 2},
                          "parameters": {"page.$": "$.input.item", "prefix.$": "$.outputs.read.prefix"}}]}),
        json!({"name": "s3-rows-page", "version": 1, "description": "Lambda-mode test: a page of s3-rows",
               "result": {"*.$": "$.outputs.row"},
               "steps": [with(json!({"name": "page", "agent": "items.page",
                                     "parameters": {"Key.$": "States.Format('{}{}.json', $.input.prefix, $.input.page)"}})),
                         with(json!({"name": "row", "agent": "sim", "map": {"items": "/outputs/page/Body", "max_concurrency": 5}}))]}),
    ]);
    std::fs::write(&file, wfs.to_string()).unwrap();
    let config = config_dir("iam", wfs["workflows"].as_array().expect("a list"));
    let mut agents: Value =
        serde_json::from_str(&std::fs::read_to_string(config.join("agents.json")).unwrap()).expect("agents.json");
    agents["agents"]["sim.serial"] = json!({"kind": "sim", "max_in_flight": 1});
    // an aws agent: DynamoDB's PutItem on a table of the test's own, granted by AgentAwsActions and
    // AgentAwsResources (the call recorded as the SDK's are, and checked against the role)
    let items = format!("l-iam-items-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let items_arn = format!("arn:aws:dynamodb:*:*:table/{items}");
    agents["agents"]["aws.put"] = json!({"kind": "aws", "service": "dynamodb", "action": "putItem",
                                         "parameters": {"TableName": items}, "resources": [items_arn]});
    let sdk = sas_core::aws::load_sdk_config().await;
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    crate::common::items_table(&sdk, &items).await;
    // a bucket and a topic of the test's own, for an S3 (REST-XML) and an SNS (query) aws agent
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build());
    s3.create_bucket().bucket(&items).send().await.expect("the test's bucket");
    let objects_arn = format!("arn:aws:s3:::{items}/*");
    let sns = aws_sdk_sns::Client::new(&sdk);
    let topic = sns.create_topic().name(&items).send().await.expect("the test's topic");
    let topic_arn = topic.topic_arn().expect("its ARN").to_owned();
    agents["agents"]["aws.object"] = json!({"kind": "aws", "service": "s3", "action": "putObject",
                                            "parameters": {"Bucket": items}, "resources": [objects_arn]});
    agents["agents"]["aws.notify"] = json!({"kind": "aws", "service": "sns", "action": "publish",
                                            "parameters": {"TopicArn": topic_arn}, "resources": [topic_arn]});
    // the map's agents: the CSV and the pages in the test's bucket (under rows/ and pages/)
    let rows_arn = format!("arn:aws:s3:::{items}/rows/*");
    let pages_arn = format!("arn:aws:s3:::{items}/pages/*");
    agents["agents"]["items.read"] = json!({"kind": "s3_items", "bucket": items, "work_bucket": items,
                                            "work_prefix": "pages/", "sources": [rows_arn]});
    agents["agents"]["items.page"] = json!({"kind": "aws", "service": "s3", "action": "getObject", "parse_json": ["Body"],
                                            "parameters": {"Bucket": items}, "resources": [pages_arn]});
    let csv = "sku,qty\nA-1,2\nB-2,1\nC-3,7\n";
    s3.put_object()
        .bucket(&items)
        .key("rows/in.csv")
        .body(csv.as_bytes().to_vec().into())
        .send()
        .await
        .expect("the CSV");
    std::fs::write(config.join("agents.json"), agents.to_string()).unwrap();
    // The shipped order-track, as shipped: the order service's agents, then its announce step, an
    // aws agent putting OrderDelivered on the default bus (the template's own grant); a rule of the
    // test's routes that order's event to a queue.
    let (order_service, _svc) = sas_order_service::spawn_local().await.expect("the order service");
    let events = aws_sdk_eventbridge::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let (delivered, delivered_arn) = crate::common::create_queue(&sqs, &format!("{items}-delivered"), false).await;
    let track_id = format!("{items}-track");
    events
        .put_rule()
        .name(&items)
        .event_pattern(
            json!({"source": ["sas.orders"], "detail-type": ["OrderDelivered"], "detail": {"order": [track_id]}})
                .to_string(),
        )
        .send()
        .await
        .expect("PutRule");
    let target = aws_sdk_eventbridge::types::Target::builder().id("q").arn(&delivered_arn).build().unwrap();
    events.put_targets().rule(&items).targets(target).send().await.expect("PutTargets");
    let f = lambda_stack_with(
        "iam",
        &config,
        &[
            ("WorkflowsFile", &file_param),
            // No queue budget: an attempt's execution deadline is its CompleteBy, so a hung agent
            // has no time left to say it timed out, and the Supervisor's timer gives up on it.
            ("QueueBudgetMs", "0"),
            // Below the 1 s result grace: when the Supervisor's timer gives up on a step, the
            // step's compensation may start at once, so the Supervisor dispatches it itself
            // (with the default 2 s it hands it to the Scheduler after the settle wait, unless
            // the timer fires late).
            ("SettleMs", "500"),
            ("MaxInputBytes", "262144"),
            ("ReplyQueueArnPattern", "arn:aws:sqs:*:*:l-iam-*-replies*"),
            ("AgentAwsActions", "dynamodb:PutItem,s3:PutObject,s3:GetObject,sns:Publish"),
            ("AgentAwsResources", &format!("{items_arn},{objects_arn},{topic_arn}")),
            ("OrderServiceUrl", &order_service),
        ],
    )
    .await;
    let notes = f.s.topic_listener(&topic_arn, "notes", None).await;
    let reply = f.s.queue("replies", true).await;
    // the approval request the Agent publishes, as a person would receive it
    let approvals = f.s.topic_listener(f.s.out("ApprovalTopicArn"), "approvals", None).await;
    let sub = |id: &str, input: Value| json!({"v": 1, "task_id": id, "workflow": "sim-order", "reply_to": reply, "input": input});
    // The Supervisor's timer gives up on charge (three hung attempts): its alert, the compensation
    // it starts on the agent queue, its statuses.
    let hung = sub("hung", json!({"sim": {"charge": {"hang_attempts": 3}}}));
    // The Scheduler gives up on charge (three failed attempts): its alert and retries.
    // sim-order-patient: 60 s per attempt, so however late a loaded machine runs each attempt it
    // is the Scheduler that sees the third failure, never the Supervisor's timer.
    let mut flaky = sub("flaky", json!({"sim": {"charge": {"fail_attempts": 3}}}));
    flaky["workflow"] = json!("sim-order-patient");
    // Declined, then the same submission again: the Submitter reads the task it already created.
    let declined = sub("declined", json!({"sim": {"charge": {"permanent": "declined"}}}));
    // An input that fits a submission but not the agent request built from it: the Submitter
    // fails the attempt through the scheduler queue.
    let pad = "x".repeat(262_144 - 100);
    let big = json!({"v": 1, "task_id": "big", "workflow": "sim-order", "input": {"pad": pad}});
    // Refused: kept in the submission DLQ, and the caller told on its reply queue.
    let refused = json!({"v": 1, "task_id": "refused", "workflow": "no-such-workflow", "reply_to": reply});
    // Callback steps answered through the callback queue: a retryable failure (the Callback
    // function sends the retry's run message), then the retry's success (it dispatches the next
    // step and its timer, and tells the caller); a step whose worker never heartbeats, answered
    // after the task ended (late: recorded, and the Callback function alerts).
    let cb_ok = json!({"v": 1, "task_id": "cb-ok", "workflow": "sim-callback", "reply_to": reply, "input": {}});
    let cb_late = json!({"v": 1, "task_id": "cb-late", "workflow": "sim-callback-lost", "input": {}});
    // An approval step: the Agent publishes its token to ApprovalTopic (the rest of the workflow
    // is cancelled once the approval was asked for).
    let cb_approval = json!({"v": 1, "task_id": "cb-approval", "workflow": "sim-everything", "input": {}});
    // Three tasks at once on an agent that takes one call (3 s) at a time: the first lease
    // creates the agent's limit item, the others update it; the requests that find the agent full
    // wait on the agent queue.
    let serial: Vec<Value> = (1..=3)
        .map(|i| {
            json!({"v": 1, "task_id": format!("serial-{i}"), "workflow": "sim-serial",
                        "input": {"sim": {"call": {"delay_ms": 3_000}}}})
        })
        .collect();
    // A map of three lines: the Submitter creates its first elements, the Scheduler the next and
    // reads their outputs back (BatchGetItem) when they have all ended.
    let lines: Vec<Value> = (0..3).map(|i| json!({"sku": format!("s{i}")})).collect();
    // sim-map-patient: 60 s per attempt, so however late a loaded machine runs the charge (behind
    // the hung calls) it never times out.
    let map = json!({"v": 1, "task_id": "map-1", "workflow": "sim-map-patient", "input": {"lines": lines}});
    // Elements that end outside the Scheduler and tell their parent on the ends queue: one the
    // Supervisor's timer ends (its only attempt hangs), one the Callback function ends (answered).
    let map_hung = json!({"v": 1, "task_id": "map-hung", "workflow": "sim-map-hung",
                          "input": {"lines": [{"sku": "h0", "sim": {"reserve": {"hang_attempts": 1}}}]}});
    let cb_map =
        json!({"v": 1, "task_id": "cb-map", "workflow": "sim-callback-map", "input": {"lines": [{"sku": "c0"}]}});
    // a map over the rows of a CSV in S3
    let rows = json!({"v": 1, "task_id": "s3-rows", "workflow": "s3-rows", "input": {}});
    // a step that writes an item with the aws agent
    let put =
        json!({"v": 1, "task_id": "aws-put", "workflow": "aws-put", "input": {"note": "written by the aws agent"}});
    // the shipped order-track: shipped, tracked until delivered, announced
    let track = json!({"v": 1, "task_id": track_id, "workflow": "order-track",
                       "input": {"items": [{"sku": "book", "qty": 1}]}});
    for body in [
        &hung,
        &flaky,
        &declined,
        &declined,
        &big,
        &refused,
        &cb_ok,
        &cb_late,
        &cb_approval,
        &map,
        &map_hung,
        &cb_map,
        &put,
        &rows,
        &track,
    ]
    .into_iter()
    .chain(&serial)
    {
        f.s.send(&f.s.res.submission_queue_url, &body.to_string()).await;
    }
    // A message that can never parse on each function's queue: each moves it to its own DLQ.
    let callback_queue = f.s.out("CallbackQueueUrl").to_owned();
    for q in [
        &f.s.res.submission_queue_url,
        &f.s.res.scheduler_queue_url,
        &f.s.res.agent_queue_url,
        &f.s.res.supervisor_queue_url,
        &callback_queue,
    ] {
        f.s.send(q, "{not json").await;
    }
    // A task whose retry's run message was lost: an invoked sweep finds it (the index query) and
    // hands it to the scheduler.
    let (_, _) = f.lost_task("lost", LOST_AGE_MS).await;
    // A schedule due by then: the invoked sweep sends its instant as a submission (the
    // Supervisor's ScheduledSubmissions grant); it is deleted right after, so no later sweep sends
    // more.
    let spec = sas_cli::schedule::Spec {
        name: "lp-sched".into(),
        workflow: "sim-order".into(),
        version: None,
        input: json!({"customer": "c-1", "items": [{"sku": "book", "qty": 1}]}),
        every: sas_protocol::schedules::Every::RateMs(1_000),
        time_zone: None,
        overlap: sas_protocol::schedules::Overlap::Skip,
        jitter_ms: 0,
    };
    sas_cli::schedule::create(&f.s.deps, &spec).await.expect("the schedules item").expect("the schedule");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (err, report) = f.invoke("SupervisorFunction", &fixture("supervisor-scheduled.json")).await;
    assert_eq!(err, None, "{report}");
    let sched = sas_cli::schedule::delete(&f.s.deps, "lp-sched").await.expect("the schedules item").expect("deleted");
    let scheduled = sas_protocol::schedules::task_id("lp-sched", sched.last.expect("the sweep sent an instant"));

    let first = f.callback_token("cb-ok", 1, None).await;
    let failed = answer(&first, "failed", json!({"error": "the warehouse is closed", "retryable": true}));
    f.s.send(&callback_queue, &failed.to_string()).await;
    let second = f.callback_token("cb-ok", 1, Some(first.attempt())).await;
    f.s.send(&callback_queue, &answer(&second, "succeeded", json!({"output": {"tracking": "TRK-1"}})).to_string())
        .await;
    // Its one attempt expires 2 s after the claim: its token from the step's issued tokens.
    let t = f.s.wait_for("cb-late", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    let attempt = t.steps[0].issued.last().expect("the attempt's token was issued");
    let lost = CallbackToken::new(&t.task_id, "ship", attempt);
    f.s.send(&callback_queue, &answer(&lost, "succeeded", json!({"output": {"tracking": "TRK-late"}})).to_string())
        .await;
    f.s.wait_for("cb-late", Duration::from_mins(1), |t| t.late.count > 0).await;
    let element = f.callback_token("cb-map~0~0", 0, None).await;
    f.s.send(&callback_queue, &answer(&element, "succeeded", json!({"output": {"tracking": "TRK-map"}})).to_string())
        .await;
    // The approval was handed over (published): the step waits for its answer; cancel it. (Not
    // before it was published: a request whose task was cancelled no longer starts, and the
    // approval grant would go unused.)
    let approving = f.callback_token("cb-approval", 1, None).await;
    let asked = f.s.drain(&approvals, 1, Duration::from_mins(2)).await;
    assert!(!asked.is_empty(), "the approval request was published");
    let cancel = SchedulerMessage::Cancel(sas_protocol::messages::CancelMessage {
        v: VERSION,
        task_id: approving.task_id().clone(),
        reason: "approval not needed".into(),
        run: None,
    });
    f.s.send(&f.s.res.scheduler_queue_url, &serde_json::to_string(&cancel).unwrap()).await;
    f.s.send(&callback_queue, &answer(&approving, "failed", json!({"error": "withdrawn"})).to_string()).await;

    for id in ["hung", "flaky", "declined", "big", "lost", "cb-ok", "cb-late", "cb-approval"] {
        let t = f.s.wait_for(id, Duration::from_mins(4), |t| t.process_state.is_terminal()).await;
        eprintln!("[{}] {id}: {:?}, FailureCount {}", f.s.name, t.process_state, t.failure_count);
    }
    for id in ["map-hung~0~0", "map-hung"] {
        let t = f.s.wait_for(id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
        assert_ne!(t.process_state, ProcessState::Processed, "{id}: its element hung: {:?}", t.history);
    }
    // the schedule's instant became a task of its workflow with its input (sim-order's 5 s
    // attempts may be retried on a loaded machine: how it ended is not asserted)
    let t = f.s.wait_for(&scheduled, Duration::from_mins(4), |t| t.process_state.is_terminal()).await;
    assert_eq!((t.workflow.name.as_str(), &t.input), ("sim-order", &spec.input), "{scheduled}");
    for id in ["serial-1", "serial-2", "serial-3", "map-1", "cb-map", "aws-put", "s3-rows"] {
        let t = f.s.wait_for(id, Duration::from_mins(4), |t| t.process_state.is_terminal()).await;
        assert_eq!((t.process_state, t.failure_count), (ProcessState::Processed, 0), "{id}: {:?}", t.history);
    }
    let item = ddb
        .get_item()
        .table_name(&items)
        .key("id", aws_sdk_dynamodb::types::AttributeValue::S("aws-put".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("reading the item back");
    assert_eq!(
        item.item().and_then(|i| i.get("note")).and_then(|n| n.as_s().ok()).map(String::as_str),
        Some("written by the aws agent"),
        "the aws agent wrote the item: {item:?}"
    );
    let object = s3.get_object().bucket(&items).key("notes/aws-put.json").send().await.expect("the object");
    let body = object.body.collect().await.expect("its body").into_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).ok(),
        Some(json!({"note": "written by the aws agent"})),
        "the aws agent put the object (its JSON body as its text)"
    );
    // the listener's subscription delivers the message raw: its body is the note
    let published = f.s.drain(&notes, 1, Duration::from_mins(1)).await;
    assert!(
        published.iter().any(|m| m.body() == Some("written by the aws agent")),
        "the aws agent published the note: {published:?}"
    );
    // every row of the CSV mapped, from the page the s3_items agent wrote
    let t = f.s.task("s3-rows").await.expect("the map's task");
    let pages = t.steps.iter().find(|s| s.name == "rows").and_then(|s| s.output.clone()).unwrap_or_default();
    let rows: Vec<Value> = pages.as_array().cloned().unwrap_or_default();
    let rows: Vec<Value> = rows.iter().flat_map(|page| page.as_array().cloned().unwrap_or_default()).collect();
    assert_eq!(rows.len(), 3, "one output per row: {pages}");
    // the shipped announce step put the order's OrderDelivered event on the default bus: the
    // rule routed it, its detail as the step's parameters made it, its id the task's result
    // (its steps' 5 s deadlines may pass on a loaded machine, while the hung tasks hold the
    // agents: a retry then, so its failure count is not asserted)
    let t = f.s.wait_for(&track_id, Duration::from_mins(4), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Processed, "{track_id}: {:?}", t.history);
    let result = t.result().unwrap_or_default();
    let routed = f.s.drain(&delivered, 1, Duration::from_mins(1)).await;
    let event: Value = routed.first().and_then(|m| serde_json::from_str(m.body()?).ok()).unwrap_or_default();
    assert_eq!(
        (&event["detail"]["order"], &event["detail"]["checks"], &event["detail"]["shipment_id"]),
        (&json!(track_id), &result["checks"], &result["shipment_id"]),
        "the event routed by the rule: {routed:?}; the task's result: {result}"
    );
    assert_eq!(event["id"], result["event_id"], "the event's id is the result's event_id: {result}");
    let held = f.s.deps.limiter.leases("sim.serial").await.unwrap();
    assert!(held.is_empty(), "every lease of sim.serial was given back: {held:?}");
    for (dlq, want) in [
        ("SubmissionDlqUrl", 2),
        ("SchedulerDlqUrl", 1),
        ("AgentDlqUrl", 1),
        ("SupervisorDlqUrl", 1),
        ("CallbackDlqUrl", 1),
    ] {
        let kept = f.s.drain(f.s.out(dlq), want, Duration::from_secs(30)).await;
        assert!(kept.len() >= want, "{dlq}: {} of {want} kept", kept.len());
    }

    let report = f.least_privilege().await.unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", report.render());
    // Grants whose paths this workload cannot reach on LocalStack, each with the code that needs it.
    let not_reached = [
        (
            // submitter.rs `resend`: a submission redelivered after its start failed to send reads
            // the task it created (sends never fail here: LocalStack does not enforce IAM).
            "SubmitterFunction",
            "submitter/TaskTable",
            "dynamodb:GetItem",
        ),
        (
            // effects.rs `spawn_one`: a submission whose map's first elements exist already and
            // have ended (its first delivery created them) makes each say its end again.
            "SubmitterFunction",
            "submitter/Ends",
            "sqs:SendMessage",
        ),
    ];
    // AgentAwsActions x AgentAwsResources is a cross product (the documented over-grant): a pair
    // of one service's action and another's resource can never be used
    let cross = |g: &sas_cli::iam::Grant| {
        g.statement.ends_with("AgentAwsActions") && g.action.split(':').next() != g.resource.split(':').nth(2)
    };
    let unused: Vec<String> = report
        .unused()
        .iter()
        .filter(|(_, g)| !cross(g))
        .filter(|(fun, g)| !not_reached.contains(&(fun.as_str(), g.statement.as_str(), g.action.as_str())))
        .map(|(fun, g)| format!("{fun}: {} {} on {}", g.statement, g.action, g.resource))
        .collect();
    let _ = std::fs::remove_file(&file);
    f.delete().await;
    let _ = ddb.delete_table().table_name(&items).send().await;
    let _ = sns.delete_topic().topic_arn(&topic_arn).send().await;
    let _ = events.remove_targets().rule(&items).ids("q").send().await;
    let _ = events.delete_rule().name(&items).send().await;
    let _ = sqs.delete_queue().queue_url(&delivered).send().await;
    assert!(unused.is_empty(), "grants no call used (drop them, or reach the path that needs them): {unused:#?}");
}

/// The book's "Bring your own workflow" (docs/tutorials/bring-your-own-workflow.md), run as it is written (`examples/byow/walkthrough.sh`):
/// a function of the tests' own, a SigV4-verifying API, an API key in Secrets Manager, validate,
/// deploy with the configuration as a layer (no build), submit, Processed. Needs sasctl and the
/// order service built (`make test-lambda` builds them).
#[test]
fn lambda_the_bring_your_own_workflow_chapter_runs_to_processed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf();
    let out = std::process::Command::new("bash")
        .arg(root.join("examples/byow/walkthrough.sh"))
        .env("BIN", root.join("target/debug"))
        .output()
        .expect("bash examples/byow/walkthrough.sh");
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the walkthrough failed ({}):\n{text}", out.status);
    assert!(text.contains("byow: Processed"), "{text}");
}
