//! The whole history of a task with more status changes than its item keeps: the protocol keeps
//! the last `history_limit` entries in the item, and every entry a write drops is archived by the
//! store, so the item's entries and the archive together are every status, `seq` 1 to the last,
//! each once. On the in-memory store (the DynamoDB store's archive is run by the LocalStack
//! tests and `sasctl status`).

use sas_core::agent::AgentRuntime;
use sas_core::config::Settings;
use sas_core::role::{self, Record, Role};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, AgentResult, Outcome, SchedulerMessage};
use sas_protocol::protocol::Policy;
use sas_protocol::workflow::{OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;
use serde_json::json;

const LIMIT: usize = 10;

fn twins() -> Twins {
    let step = StepDef { max_attempts: 40, ..StepDef::call("a", "sim", 5_000) };
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "stubborn".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![step],
    };
    let settings = Settings { policy: Policy { history_limit: LIMIT, ..Policy::default() }, ..Settings::default() };
    Twins::new(WorkflowRegistry::new([wf]).unwrap(), settings, Millis::now())
}

#[tokio::test]
async fn the_item_and_the_archive_hold_every_status_once() {
    let tw = twins();
    let rt = AgentRuntime::default();
    let res = tw.deps.resources.clone();
    let id = TaskId::try_from("h1").unwrap();
    let sub = json!({"v": 1, "task_id": "h1", "workflow": "stubborn", "input": {}}).to_string();
    role::handle(Role::Submitter, &tw.deps, &rt, &Record::new("s", sub)).await.unwrap();
    // Fail attempts until the task has three times more statuses than its item keeps.
    for n in 0..40 {
        let t = tw.store.tasks().pop().unwrap();
        if t.status_seq > 3 * LIMIT as u64 || t.process_state.is_terminal() {
            break;
        }
        for body in tw.bus.take(&res.agent_queue_url) {
            let req: AgentRequest = serde_json::from_str(&body).unwrap();
            let failed = SchedulerMessage::Result(AgentResult {
                v: 1,
                task_id: req.task_id.clone(),
                step: req.step.clone(),
                attempt: req.attempt.clone(),
                outcome: Outcome::Failed { error: format!("busy {n}"), retryable: true },
            });
            let r = Record::new(format!("f{n}"), serde_json::to_string(&failed).unwrap());
            role::handle(Role::Scheduler, &tw.deps, &rt, &r).await.unwrap();
        }
        // The retry's run message (delayed by the backoff): handled once its time has come.
        tw.clock.set(Millis(tw.deps.now().0 + 60_000));
        for (i, body) in tw.bus.take(&res.scheduler_queue_url).into_iter().enumerate() {
            role::handle(Role::Scheduler, &tw.deps, &rt, &Record::new(format!("r{n}-{i}"), body)).await.unwrap();
        }
    }
    let t = tw.deps.store.get(&id).await.unwrap().unwrap();
    assert!(t.status_seq > 2 * LIMIT as u64, "only {} statuses", t.status_seq);
    assert_eq!(t.history.len(), LIMIT, "the item keeps the last {LIMIT}");
    let first_kept = t.history[0].seq;
    assert!(first_kept > 1);
    let archived = tw.deps.store.archived_history(&id, 1, first_kept).await.unwrap();
    let all: Vec<u64> = archived.iter().chain(&t.history).map(|h| h.seq).collect();
    let want: Vec<u64> = (1..=t.status_seq).collect();
    assert_eq!(all, want, "every status once, in order");
    assert!(archived.iter().any(|h| h.reason.as_deref().is_some_and(|r| r.contains("busy 0"))), "{archived:?}");
}
