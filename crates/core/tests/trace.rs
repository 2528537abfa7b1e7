//! One trace per task: a record's trace header (`AWSTraceHeader`) is carried by every message its
//! handling sends, through each role, on the in-memory twins (whose queues keep the header as SQS
//! keeps the system attribute).

use std::time::Duration;

use sas_core::agent::AgentRuntime;
use sas_core::bus::{Bus, Received};
use sas_core::config::Settings;
use sas_core::role::{self, Record, Role};
use sas_protocol::ids::Millis;
use sas_protocol::workflow::{OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;
use serde_json::json;

const H: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";

fn twins() -> Twins {
    let step = |name: &str| StepDef { max_attempts: 1, ..StepDef::call(name, "sim", 5_000) };
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "two".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![step("a"), step("b")],
    };
    Twins::new(WorkflowRegistry::new([wf]).unwrap(), Settings::default(), Millis::now())
}

async fn receive(tw: &Twins, url: &str) -> Vec<Received> {
    tw.bus.receive(url, 10, Duration::ZERO, Duration::from_hours(24)).await.unwrap()
}

fn record(m: &Received) -> Record {
    Record {
        message_id: m.message_id.clone(),
        body: m.body.clone(),
        receive_count: 1,
        sent_at: None,
        trace_header: m.trace_header.clone(),
    }
}

#[tokio::test]
async fn every_message_a_traced_submission_causes_carries_its_trace() {
    let tw = twins();
    let rt = AgentRuntime::with_builtins();
    let queues = tw.deps.resources.clone();
    let reply = tw.reply_queue("r");
    let sub = json!({"v": 1, "task_id": "t1", "workflow": "two", "input": {}, "reply_to": reply}).to_string();
    let first = Record { trace_header: Some(H.into()), ..Record::new("s1", sub) };
    role::handle(Role::Submitter, &tw.deps, &rt, &first).await.unwrap();
    // Submitter -> Agent (a), Agent -> Scheduler, Scheduler -> Agent (b), Agent -> Scheduler.
    let mut hops = 0;
    for _ in 0..2 {
        let reqs = receive(&tw, &queues.agent_queue_url).await;
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].trace_header.as_deref(), Some(H), "the agent request");
        role::handle(Role::Agent, &tw.deps, &rt, &record(&reqs[0])).await.unwrap();
        let results = receive(&tw, &queues.scheduler_queue_url).await;
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].trace_header.as_deref(), Some(H), "the agent's result");
        role::handle(Role::Scheduler, &tw.deps, &rt, &record(&results[0])).await.unwrap();
        hops += 2;
    }
    assert_eq!(hops, 4);
    // The deadline timers are delayed until CompleteBy.
    tw.clock.set(Millis(tw.deps.now().0 + 600_000));
    let timers = receive(&tw, &queues.supervisor_queue_url).await;
    assert!(!timers.is_empty());
    assert!(timers.iter().all(|t| t.trace_header.as_deref() == Some(H)), "the deadline timers");
    let statuses = receive(&tw, &reply).await;
    assert!(statuses.len() >= 3, "{statuses:?}");
    assert!(statuses.iter().all(|s| s.trace_header.as_deref() == Some(H)), "the caller's statuses");

    // A submission without a trace starts none; a forged header is not passed on.
    for (id, header) in [("t2", None), ("t3", Some("Root=1-x\nInjected: y".to_owned()))] {
        let sub = json!({"v": 1, "task_id": id, "workflow": "two", "input": {}}).to_string();
        role::handle(Role::Submitter, &tw.deps, &rt, &Record { trace_header: header, ..Record::new(id, sub) })
            .await
            .unwrap();
        let reqs = receive(&tw, &queues.agent_queue_url).await;
        assert_eq!(reqs[0].trace_header, None, "{id}");
    }
}
