//! What the roles make of the store's harder answers, on the in-memory twins: a write that landed
//! but was reported lost (an SDK retry of a conditional write whose first copy had committed),
//! and writes that can never succeed (an output DynamoDB refuses, a task grown too large).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use sas_core::agent::{self, Agent, AgentError, AgentRuntime, Call};
use sas_core::config::Settings;
use sas_core::deps::{Deps, HandlerError};
use sas_core::role::{self, Record, Role};
use sas_core::scheduler;
use sas_core::screen::{self, unstorable_output};
use sas_core::store::{MemoryStore, Page, PageKey, StateStore, StoreError, StoreOp, TaskSummary, TaskWriter};
use sas_core::submitter::{self, Submitted};
use sas_core::transition::Applied;
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, AgentResult, Outcome, SchedulerMessage, StatusMessage};
use sas_protocol::protocol::{Policy, ProcessState, Task};
use sas_protocol::workflow::{Backoff, OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;
use serde_json::{json, Value};

const T0: Millis = Millis(1_700_000_000_000);

fn step(name: &str) -> StepDef {
    StepDef { backoff: Backoff { base_ms: 100, max_ms: 1_000, multiplier: 2.0 }, ..StepDef::call(name, "sim", 5_000) }
}

fn twins() -> Twins {
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "two".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![step("a"), step("b")],
    };
    let settings = Settings {
        policy: Policy { queue_budget_ms: 0, result_grace_ms: 0, settle_ms: 0, ..Policy::default() },
        ..Settings::default()
    };
    Twins::new(WorkflowRegistry::new([wf]).unwrap(), settings, T0)
}

fn submission(id: &str, reply_to: Option<&str>) -> String {
    let mut v = json!({"v": 1, "task_id": id, "workflow": "two", "input": {"n": 1}});
    if let Some(r) = reply_to {
        v["reply_to"] = json!(r);
    }
    v.to_string()
}

fn dispatched(tw: &Twins) -> Vec<AgentRequest> {
    tw.bus.take(&tw.deps.resources.agent_queue_url).iter().map(|b| serde_json::from_str(b).unwrap()).collect()
}

fn succeeded(req: &AgentRequest, output: Value) -> String {
    serde_json::to_string(&SchedulerMessage::Result(AgentResult {
        v: 1,
        task_id: req.task_id.clone(),
        step: req.step.clone(),
        attempt: req.attempt.clone(),
        outcome: Outcome::Succeeded { output },
    }))
    .unwrap()
}

fn task(tw: &Twins, id: &str) -> Task {
    tw.store.tasks().into_iter().find(|t| t.task_id.as_str() == id).expect("task exists")
}

/// A store whose next `n` writes land and are then reported lost, the way DynamoDB answers a
/// conditional write the SDK sent again after its first copy had committed: `AlreadyExists` for a
/// create, a `Conflict` carrying the item just written for a save.
#[derive(Debug)]
struct LandedButLost {
    inner: MemoryStore,
    left: AtomicU32,
}

impl LandedButLost {
    fn deps(tw: &Twins, n: u32) -> Deps {
        let mut deps = tw.deps.clone();
        let store = Arc::new(LandedButLost { inner: tw.store.clone(), left: AtomicU32::new(n) });
        deps.store = store.clone();
        deps.writer = sas_core::transition::Writer::new(store);
        deps
    }

    fn take(&self) -> bool {
        self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

impl TaskWriter for LandedButLost {
    fn create<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.inner.create(task).await?;
            if self.take() {
                return Err(StoreError::AlreadyExists);
            }
            Ok(())
        })
    }

    fn save<'a>(&'a self, task: &'a Task, read: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.inner.save(task, read).await?;
            if self.take() {
                let current = self.inner.get(&task.task_id).await?;
                return Err(StoreError::Conflict { current: current.map(Box::new) });
            }
            Ok(())
        })
    }
}

impl StateStore for LandedButLost {
    fn get<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<Task>, StoreError>> {
        self.inner.get(task_id)
    }

    fn get_many<'a>(&'a self, ids: &'a [TaskId]) -> BoxFuture<'a, Result<Vec<Task>, StoreError>> {
        self.inner.get_many(ids)
    }

    fn expired(
        &self,
        shard: u32,
        now: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        self.inner.expired(shard, now, limit, start)
    }

    fn list_by_state(&self, state: ProcessState, max: usize) -> BoxFuture<'_, Result<Vec<TaskSummary>, StoreError>> {
        self.inner.list_by_state(state, max)
    }

    fn shards(&self) -> u32 {
        self.inner.shards()
    }
}

#[tokio::test]
async fn a_create_that_landed_but_read_as_a_duplicate_still_starts_its_task() {
    let tw = twins();
    let deps = LandedButLost::deps(&tw, 1);
    let got = submitter::submit(&deps, &submission("g5c", None)).await.unwrap();
    assert_eq!(got, Submitted::Created(TaskId::try_from("g5c").unwrap()), "it is this submission's task");
    let sent = dispatched(&tw);
    assert_eq!(sent.len(), 1, "the start went out");
    assert_eq!(Some(&sent[0].attempt), task(&tw, "g5c").lock.locked_by.as_ref());
    // a real duplicate (another submission of the id) still creates and sends nothing
    let again = submitter::submit(&tw.deps, &submission("g5c", None)).await.unwrap();
    assert_eq!(again, Submitted::Duplicate(TaskId::try_from("g5c").unwrap()));
    assert!(dispatched(&tw).is_empty());
}

#[tokio::test]
async fn a_transition_that_landed_but_read_as_lost_still_performs_its_effects() {
    let tw = twins();
    let reply = tw.reply_queue("replies");
    submitter::submit(&tw.deps, &submission("g5s", Some(&reply))).await.unwrap();
    let a = dispatched(&tw).pop().unwrap();
    let deps = LandedButLost::deps(&tw, 2);

    // step a's success: the write claiming b lands, its answer is lost
    let got = scheduler::schedule(&deps, &succeeded(&a, json!({"id": 1}))).await.unwrap();
    assert!(matches!(got, Applied::Changed { state: ProcessState::Processing, .. }), "{got:?}");
    let b = dispatched(&tw).pop().expect("b is dispatched");
    assert_eq!((b.step.as_str(), Some(&b.attempt)), ("b", task(&tw, "g5s").lock.locked_by.as_ref()));

    // step b's success: the terminal write lands, its answer is lost; the terminal reply goes out
    let got = scheduler::schedule(&deps, &succeeded(&b, json!({"id": 2}))).await.unwrap();
    assert!(matches!(got, Applied::Changed { state: ProcessState::Processed, .. }), "{got:?}");
    let states: Vec<ProcessState> =
        tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str::<StatusMessage>(b).unwrap().state).collect();
    assert_eq!(states.last(), Some(&ProcessState::Processed), "{states:?}");
}

#[tokio::test]
async fn an_output_dynamodb_refuses_is_kept_as_a_success_with_a_marker() {
    for (i, output) in [
        json!({"meta": {"": 1}}),
        json!({"id": 1e200}),
        json!({"blob": "x".repeat(screen::MAX_OUTPUT_BYTES)}),
        (0..40).fold(json!(1), |v, _| json!({ "d": v })),
    ]
    .into_iter()
    .enumerate()
    {
        let tw = twins();
        let id = format!("g8-{i}");
        submitter::submit(&tw.deps, &submission(&id, None)).await.unwrap();
        let a = dispatched(&tw).pop().unwrap();
        let got = scheduler::schedule(&tw.deps, &succeeded(&a, output.clone())).await.unwrap();
        assert!(matches!(got, Applied::Changed { state: ProcessState::Processing, .. }), "{i}: {got:?}");
        let t = task(&tw, &id);
        let kept = t.steps[0].output.clone().unwrap();
        assert_ne!(kept, output, "{i}: the refused output is not stored");
        assert_eq!(kept["unstorable"], json!(true), "{i}: {kept}");
        assert_eq!(t.step_index, 1, "{i}: the step succeeded and the task moved on");
    }
}

#[tokio::test]
async fn a_success_that_makes_the_task_too_large_is_kept_with_a_marker() {
    let tw = twins();
    submitter::submit(&tw.deps, &submission("g8-big", None)).await.unwrap();
    let a = dispatched(&tw).pop().unwrap();
    tw.store.fail_next(StoreOp::Save, StoreError::TooLarge { bytes: 400_000 });
    let got = scheduler::schedule(&tw.deps, &succeeded(&a, json!({"id": 1}))).await.unwrap();
    assert!(matches!(got, Applied::Changed { state: ProcessState::Processing, .. }), "{got:?}");
    let t = task(&tw, "g8-big");
    let why = StoreError::TooLarge { bytes: 400_000 }.to_string();
    assert_eq!(t.steps[0].output, Some(unstorable_output(&why)));
    assert_eq!(dispatched(&tw).len(), 1, "b is dispatched");
}

#[tokio::test]
async fn a_write_that_can_never_succeed_goes_to_the_dlq_at_once() {
    let tw = twins();
    submitter::submit(&tw.deps, &submission("g8-dlq", None)).await.unwrap();
    let a = dispatched(&tw).pop().unwrap();
    let failed = serde_json::to_string(&SchedulerMessage::Result(AgentResult {
        v: 1,
        task_id: a.task_id.clone(),
        step: a.step.clone(),
        attempt: a.attempt.clone(),
        outcome: Outcome::Failed { error: "503".into(), retryable: true },
    }))
    .unwrap();
    let refused = || StoreError::Refused { op: "PutItem", message: "ValidationException: bad value".into() };
    tw.store.fail_next(StoreOp::Save, refused());
    let err = scheduler::schedule(&tw.deps, &failed).await.unwrap_err();
    assert!(matches!(err, HandlerError::Unstorable(StoreError::Refused { .. })), "not retried as transient: {err}");

    tw.store.fail_next(StoreOp::Save, refused());
    let record = Record::new("m-g8", failed.clone());
    role::handle(Role::Scheduler, &tw.deps, &AgentRuntime::default(), &record).await.unwrap();
    let dlq = tw.deps.resources.scheduler_dlq_url.clone().unwrap();
    assert_eq!(tw.bus.bodies(&dlq), vec![failed]);
    let reason = &tw.bus.attributes(&dlq)[0];
    assert!(reason.iter().any(|(k, v)| k == "RejectReason" && v.contains("cannot be stored")), "{reason:?}");
}

/// A custom agent whose service answers with what DynamoDB refuses, or more than SQS carries.
struct Answers(Value);

impl Agent for Answers {
    fn call<'a>(&'a self, _: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move { Ok(self.0.clone()) })
    }
}

#[tokio::test]
async fn an_agent_reports_a_success_whose_output_cannot_be_stored_with_a_marker() {
    for (i, output) in [json!({"": 1}), json!({"body": "x".repeat(300 * 1024)})].into_iter().enumerate() {
        let tw = twins();
        let id = format!("g8-agent-{i}");
        submitter::submit(&tw.deps, &submission(&id, None)).await.unwrap();
        let mut req = dispatched(&tw).pop().unwrap();
        req.complete_by = Millis::now().plus_ms(5_000); // the agent runs on the wall clock
        tw.clock.set(Millis::now());
        let mut agents = AgentRuntime::default();
        agents.register(req.agent.clone(), Answers(output));
        let sent = agent::handle(&tw.deps, &agents, &serde_json::to_string(&req).unwrap()).await;
        assert!(matches!(sent, Ok(true)), "{i}: the success is reported, not retried: {sent:?}");
        let results = tw.bus.take(&tw.deps.resources.scheduler_queue_url);
        let result: Value = serde_json::from_str(&results[0]).unwrap();
        assert_eq!(result["outcome"]["status"], "succeeded", "{i}");
        assert_eq!(result["outcome"]["output"]["unstorable"], json!(true), "{i}: {}", result["outcome"]);
    }
}
