//! The whole stack on in-memory twins: a [`MemoryStore`], a [`MemoryBus`] with the stack's queues
//! (and their DLQs) and a [`ManualClock`]. Tests of the roles, of the Lambda handlers and of the
//! local runner use it; so does the simulator.

use std::sync::Arc;

use sas_core::bus::MemoryBus;
use sas_core::clock::{Clock, ManualClock};
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_core::entropy::SeededEntropy;
use sas_core::store::MemoryStore;
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::protocol::{self, Ctx, Task};
use sas_protocol::workflow::{OnFailure, StepDef, WorkflowDef, WorkflowRegistry};

/// The stack's resources, named as SQS would name them (the queues live in memory).
pub fn resources(shards: u32) -> Resources {
    let q = |name: &str| format!("http://twins.local/000000000000/sas-{name}");
    Resources {
        task_table: "twins-tasks".into(),
        submission_queue_url: q("submission"),
        submission_dlq_url: q("submission-dlq"),
        scheduler_queue_url: q("scheduler"),
        agent_queue_url: q("agent"),
        supervisor_queue_url: q("supervisor"),
        alert_topic_arn: "arn:aws:sns:us-east-1:000000000000:twins-alerts".into(),
        // MemoryBus::for_stack names each queue's DLQ "<queue>-dlq"
        scheduler_dlq_url: Some(format!("{}-dlq", q("scheduler"))),
        agent_dlq_url: Some(format!("{}-dlq", q("agent"))),
        supervisor_dlq_url: Some(format!("{}-dlq", q("supervisor"))),
        callback_queue_url: Some(q("callback")),
        callback_dlq_url: Some(format!("{}-dlq", q("callback"))),
        ends_queue_url: Some(q("ends.fifo")),
        // the template's default: the queues named `<stack>-reply-*` of the stack's account and region
        reply_queue_arn_pattern: Some("arn:aws:sqs:us-east-1:000000000000:sas-reply-*".into()),
        shards,
    }
}

/// Deps wired to in-memory twins, with handles to inspect and steer them.
#[derive(Debug, Clone)]
pub struct Twins {
    pub deps: Deps,
    pub store: MemoryStore,
    pub bus: MemoryBus,
    pub clock: ManualClock,
}

impl Twins {
    /// The twins on a manual clock starting at `now`.
    pub fn new(workflows: WorkflowRegistry, settings: Settings, now: Millis) -> Self {
        let clock = ManualClock::at(now);
        let run_on: Arc<dyn Clock> = Arc::new(clock.clone());
        let res = resources(2);
        let store = MemoryStore::new(res.shards);
        let bus = MemoryBus::for_stack(run_on.clone(), &res);
        let deps = Deps {
            store: Arc::new(store.clone()),
            writer: sas_core::transition::Writer::new(Arc::new(store.clone())),
            limiter: Arc::new(store.clone()),
            keys: Arc::new(store.clone()),
            pacer: Arc::new(store.clone()),
            pauses: Arc::new(store.clone()),
            schedules: Arc::new(store.clone()),
            pause_cache: Arc::default(),
            bus: Arc::new(bus.clone()),
            resources: res,
            workflows: Arc::new(workflows),
            settings,
            clock: run_on,
            entropy: Arc::new(SeededEntropy::new(now.0)),
        };
        Twins { deps, store, bus, clock }
    }

    /// Create a private reply queue the stack may answer on (named `sas-reply-<name>`, on the
    /// allow-list).
    pub fn reply_queue(&self, name: &str) -> String {
        self.queue(&format!("sas-reply-{name}"))
    }

    /// A task in the store whose current step (`step`, of agent `agent`) is held by `attempt`: what
    /// an agent request built by hand needs to find before its agent starts it
    /// ([`sas_core::agent::still_current`]). Returns the task as stored.
    pub async fn hold(&self, task_id: &TaskId, step: &str, agent: &str, attempt: &AttemptToken) -> Task {
        let def = WorkflowDef {
            concurrency: None,
            result: None,
            name: "held".into(),
            version: 1,
            description: String::new(),
            on_failure: OnFailure::Compensate,
            steps: vec![StepDef::call(step, agent, 60_000)],
        };
        let ctx = Ctx { paused: false, now: self.deps.now(), fresh_token: attempt.clone(), jitter: 0.5 };
        let tr = protocol::submit(task_id.clone(), def, serde_json::json!({}), None, &ctx, &self.deps.settings.policy);
        let created = sas_core::transition::create(&self.deps, &tr.task).await.expect("a new task is created");
        assert!(matches!(created, sas_core::transition::Created::New), "task {task_id} exists already");
        tr.task
    }

    /// Create a queue named `name` (off the allow-list unless it starts with `sas-reply-`).
    pub fn queue(&self, name: &str) -> String {
        let url = format!("http://localhost:4566/000000000000/{name}");
        self.bus.create_queue(&url, sas_core::bus::QueueConfig::default());
        url
    }
}
