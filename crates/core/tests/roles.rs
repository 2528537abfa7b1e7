//! Every role on the in-memory twins: the happy path and the error paths (conflict, missing task,
//! stale event, malformed message, a failing store or queue). Milliseconds, no LocalStack.

use std::sync::Arc;
use std::time::Duration;

use sas_core::agent::{self, AgentRuntime};
use sas_core::bus::{Bus, Outgoing};
use sas_core::config::Settings;
use sas_core::deps::HandlerError;
use sas_core::role::{self, Record, Role};
use sas_core::runner::{Runner, RunnerOptions};
use sas_core::store::{StoreError, StoreOp};
use sas_core::submitter::Submitted;
use sas_core::transition::{self, Applied, MAX_CONFLICTS};
use sas_core::{effects, scheduler, submitter, supervisor};
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::messages::{AgentRequest, AgentResult, Outcome, SchedulerMessage, StatusMessage, TimerMessage};
use sas_protocol::protocol::{Policy, ProcessState, Stale, Task};
use sas_protocol::workflow::{Backoff, OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;
use serde_json::{json, Value};

const T0: Millis = Millis(1_700_000_000_000);

fn step(name: &str, comp: Option<&str>) -> StepDef {
    StepDef {
        max_attempts: 3,
        backoff: Backoff { base_ms: 100, max_ms: 1_000, multiplier: 2.0 },
        compensation: comp.map(|c| Box::new(step(c, None))),
        ..StepDef::call(name, "sim", 5_000)
    }
}

fn twins() -> Twins {
    let wf = WorkflowDef {
        concurrency: None,
        result: None,
        name: "two".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![step("a", Some("undo_a")), step("b", None)],
    };
    let settings = Settings {
        policy: Policy {
            pause_check_ms: Policy::default().pause_check_ms,
            key_check_ms: Policy::default().key_check_ms,
            start_timeout_ms: 1_000,
            history_limit: 50,
            queue_budget_ms: 0,
            result_grace_ms: 0,
            settle_ms: 0,
            unchecked_start_ms: 0,
            max_restarts: 8,
        },
        retention_days: 1,
        max_input_bytes: 1_024,
        sweep_page_size: 2,
        sweep_lag_ms: 60_000,
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

fn backend() -> StoreError {
    StoreError::Backend { op: "test", message: "unavailable".into(), source: None }
}

fn queue(tw: &Twins, which: &str) -> Vec<Value> {
    let r = &tw.deps.resources;
    let url = match which {
        "scheduler" => &r.scheduler_queue_url,
        "agent" => &r.agent_queue_url,
        "supervisor" => &r.supervisor_queue_url,
        _ => unreachable!(),
    };
    tw.bus.take(url).into_iter().map(|b| serde_json::from_str(&b).unwrap()).collect()
}

fn task(tw: &Twins, id: &str) -> Task {
    tw.store.tasks().into_iter().find(|t| t.task_id.as_str() == id).expect("task exists")
}

/// Submit (which claims): the task is Processing step `a`; returns the agent request.
async fn started(tw: &Twins, id: &str) -> AgentRequest {
    assert!(matches!(submitter::submit(&tw.deps, &submission(id, None)).await.unwrap(), Submitted::Created(_)));
    serde_json::from_value(queue(tw, "agent").pop().expect("a dispatch")).unwrap()
}

/// A task waiting for the claim of step `a`'s second attempt (the first failed retryably, the
/// backoff has passed); returns its run message.
async fn waiting(tw: &Twins, id: &str) -> String {
    let req = started(tw, id).await;
    queue(tw, "supervisor");
    let failed = result(&req, Outcome::Failed { error: "503".into(), retryable: true });
    scheduler::schedule(&tw.deps, &failed).await.unwrap();
    tw.clock.advance(1_000);
    queue(tw, "scheduler").pop().expect("a run message").to_string()
}

fn result(req: &AgentRequest, outcome: Outcome) -> String {
    serde_json::to_string(&SchedulerMessage::Result(AgentResult {
        v: 1,
        task_id: req.task_id.clone(),
        step: req.step.clone(),
        attempt: req.attempt.clone(),
        outcome,
    }))
    .unwrap()
}

// ---- Submitter ------------------------------------------------------------------------------

#[tokio::test]
async fn submitter_creates_the_task_starts_it_and_tells_the_caller() {
    let tw = twins();
    let reply = tw.reply_queue("replies");
    let got = submitter::submit(&tw.deps, &submission("s1", Some(&reply))).await.unwrap();
    assert_eq!(got, Submitted::Created(TaskId::try_from("s1").unwrap()));
    let t = task(&tw, "s1");
    assert_eq!((t.process_state, t.complete_by, t.rev), (ProcessState::Processing, Some(T0.plus_ms(5_000)), 1));
    assert!(queue(&tw, "scheduler").is_empty(), "the first step is claimed in the creating write");
    let dispatched = queue(&tw, "agent");
    assert_eq!(dispatched.len(), 1);
    assert_eq!(
        (dispatched[0]["step"].as_str(), dispatched[0]["attempt"].as_str()),
        (Some("a"), t.lock.locked_by.as_ref().map(AttemptToken::as_str))
    );
    let timers = queue(&tw, "supervisor");
    assert_eq!(timers.len(), 1);
    assert_eq!(timers[0]["attempt"], dispatched[0]["attempt"]);
    let statuses: Vec<StatusMessage> = tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str(b).unwrap()).collect();
    assert_eq!(statuses.len(), 1);
    assert_eq!((statuses[0].state, statuses[0].seq), (ProcessState::Processing, 1));
}

#[tokio::test]
async fn submitter_creates_nothing_twice() {
    let tw = twins();
    submitter::submit(&tw.deps, &submission("s2", None)).await.unwrap();
    let again = submitter::submit(&tw.deps, &submission("s2", None)).await.unwrap();
    assert_eq!(again, Submitted::Duplicate(TaskId::try_from("s2").unwrap()));
    assert_eq!(tw.store.tasks().len(), 1);
    assert_eq!(queue(&tw, "agent").len(), 1, "one start");
}

#[tokio::test]
async fn a_duplicate_submission_is_told_so_with_the_tasks_state_and_once_done_its_outputs() {
    let tw = twins();
    let first = tw.reply_queue("first");
    let second = tw.reply_queue("second");
    let req = started(&tw, "s9").await;
    let read =
        |q: &str| -> Vec<StatusMessage> { tw.bus.take(q).iter().map(|b| serde_json::from_str(b).unwrap()).collect() };
    // a second submission with the same task id, while the task runs
    let again = submitter::submit(&tw.deps, &submission("s9", Some(&second))).await.unwrap();
    assert_eq!(again, Submitted::Duplicate(TaskId::try_from("s9").unwrap()));
    let told = read(&second);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].duplicate);
    assert_eq!((told[0].state, told[0].seq), (ProcessState::Processing, 1));
    assert!(told[0].reason.as_deref().unwrap().contains("created nothing"), "{:?}", told[0].reason);
    assert_eq!(tw.store.tasks().len(), 1);
    assert!(queue(&tw, "agent").is_empty(), "no second start");
    // run the task to its end
    scheduler::schedule(&tw.deps, &result(&req, Outcome::Succeeded { output: json!({"a": 1}) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().expect("step b")).unwrap();
    scheduler::schedule(&tw.deps, &result(&b, Outcome::Succeeded { output: json!({"b": 2}) })).await.unwrap();
    assert_eq!(task(&tw, "s9").process_state, ProcessState::Processed);
    // a late duplicate learns the result without reading the table
    submitter::submit(&tw.deps, &submission("s9", Some(&first))).await.unwrap();
    let told = read(&first);
    assert_eq!(told.len(), 1);
    assert!(told[0].duplicate);
    assert_eq!(told[0].state, ProcessState::Processed);
    assert_eq!(told[0].outputs, Some(json!({"a": {"a": 1}, "b": {"b": 2}})));
    // a duplicate without a reply queue is only logged
    submitter::submit(&tw.deps, &submission("s9", None)).await.unwrap();
    assert!(read(&first).is_empty() && read(&second).is_empty());
}

#[tokio::test]
async fn a_submission_whose_start_was_not_sent_comes_back_and_sends_it_once_more() {
    let tw = twins();
    let agents = AgentRuntime::default();
    let mut record = Record::new("m-77", submission("s7", None));
    tw.bus.fail_sends(&tw.deps.resources.agent_queue_url, 1);
    let first = role::handle(Role::Submitter, &tw.deps, &agents, &record).await;
    assert!(matches!(first, Err(HandlerError::Bus(_))), "the record fails, so SQS delivers it again: {first:?}");
    assert!(queue(&tw, "agent").is_empty());
    let t = task(&tw, "s7");
    record.receive_count = 2;
    role::handle(Role::Submitter, &tw.deps, &agents, &record).await.unwrap();
    let again = queue(&tw, "agent");
    assert_eq!(again.len(), 1, "the start, sent again");
    assert_eq!(again[0]["attempt"].as_str(), t.lock.locked_by.as_ref().map(AttemptToken::as_str), "the same attempt");
    let after = task(&tw, "s7");
    assert_eq!((after.rev, after.steps[0].maybe_applied), (2, true), "resent once, and the step may apply twice");
    // a third delivery (the resend's own sends may have failed) sends it again, without a write
    record.receive_count = 3;
    role::handle(Role::Submitter, &tw.deps, &agents, &record).await.unwrap();
    assert_eq!(queue(&tw, "agent").len(), 1);
    assert_eq!(task(&tw, "s7").rev, 2);
    // once the task has moved on, a late copy of the submission sends nothing
    let req: AgentRequest = serde_json::from_value(again[0].clone()).unwrap();
    scheduler::schedule(&tw.deps, &result(&req, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    queue(&tw, "agent");
    record.receive_count = 4;
    role::handle(Role::Submitter, &tw.deps, &agents, &record).await.unwrap();
    assert!(queue(&tw, "agent").is_empty());
}

#[tokio::test]
async fn a_redelivered_submission_without_a_task_id_creates_one_task() {
    // the task id comes from the message, not from the delivery: a redelivery must not run
    // every effect twice
    let tw = twins();
    let body = json!({"v": 1, "workflow": "two", "input": {}}).to_string();
    let record = Record::new("5fea7756-0ea4-451a-a703-a558b933e274", body);
    let agents = AgentRuntime::default();
    for _ in 0..2 {
        role::handle(Role::Submitter, &tw.deps, &agents, &record).await.unwrap();
    }
    let tasks = tw.store.tasks();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].task_id.as_str(), "msg-5fea7756-0ea4-451a-a703-a558b933e274");
    let starts = queue(&tw, "agent");
    assert_eq!(starts.len(), 2, "the redelivery cannot know the first start went out: it sends it again");
    assert_eq!(starts[0]["attempt"], starts[1]["attempt"], "the same attempt: one claim, one key");
}

#[tokio::test]
async fn submitter_rejects_bad_input_keeps_it_and_answers_with_the_reason() {
    let tw = twins();
    let reply = tw.reply_queue("replies");
    let big =
        json!({"v": 1, "task_id": "big", "workflow": "two", "input": {"x": "y".repeat(2_000)}, "reply_to": reply});
    for (raw, want) in [
        ("{not json".to_owned(), "not JSON"),
        (json!({"v": 2, "workflow": "two", "reply_to": reply}).to_string(), "version"),
        (json!({"v": 1, "workflow": "nope", "reply_to": reply}).to_string(), "unknown workflow"),
        (json!({"v": 1, "workflow": "two", "extra": 1, "reply_to": reply}).to_string(), "contract"),
        (big.to_string(), "the limit is 1024"),
    ] {
        match submitter::submit(&tw.deps, &raw).await.unwrap() {
            Submitted::Rejected(r) => assert!(r.to_string().contains(want), "{raw}: {r}"),
            other => panic!("{raw} was {other:?}"),
        }
    }
    assert!(tw.store.tasks().is_empty());
    assert_eq!(tw.bus.depth(&tw.deps.resources.submission_dlq_url), 5, "every refused message is kept");
    let rejected: Vec<StatusMessage> = tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str(b).unwrap()).collect();
    assert_eq!(rejected.len(), 4, "the non-JSON message names no reply queue");
    assert!(rejected.iter().all(|s| s.state == ProcessState::Rejected && s.reason.is_some()));
}

/// What the parser cannot read still gets its reason in the submission DLQ and a
/// `Rejected` status on the reply queue it names: an input nested 300 levels deep (beyond the
/// parser's 128), a message cut short, a task id with non-ASCII letters.
#[tokio::test]
async fn a_submission_the_parser_cannot_read_is_still_answered_on_its_reply_queue() {
    let tw = twins();
    let reply = tw.reply_queue("replies");
    let deep = format!(
        r#"{{"v": 1, "task_id": "deep-1", "workflow": "two", "input": {}{}, "reply_to": "{reply}"}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    let cut = format!(r#"{{"v": 1, "task_id": "cut-1", "reply_to": "{reply}", "workflow": "tw"#);
    let foreign = json!({"v": 1, "task_id": "заказé-1", "workflow": "two", "input": {}, "reply_to": reply}).to_string();
    let agents = AgentRuntime::default();
    for (i, raw) in [&deep, &cut, &foreign].into_iter().enumerate() {
        role::handle(Role::Submitter, &tw.deps, &agents, &Record::new(format!("m-{i}"), raw.clone())).await.unwrap();
    }
    assert!(tw.store.tasks().is_empty());
    let reasons: Vec<String> = tw
        .bus
        .attributes(&tw.deps.resources.submission_dlq_url)
        .iter()
        .map(|a| a.iter().find(|(k, _)| k == "RejectReason").map(|(_, v)| v.clone()).unwrap())
        .collect();
    assert!(reasons[0].starts_with("the message nests more than 128 levels deep (at line 1 column"), "{}", reasons[0]);
    assert!(reasons[1].starts_with("the message is not JSON: EOF while parsing"), "{}", reasons[1]);
    assert!(reasons[2].contains("task_id contains 'з'"), "{}", reasons[2]);
    let statuses: Vec<StatusMessage> = tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str(b).unwrap()).collect();
    let ids: Vec<&str> = statuses.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(ids, vec!["deep-1", "cut-1", "msg-m-2"]);
    assert!(statuses
        .iter()
        .zip(&reasons)
        .all(|(s, r)| s.state == ProcessState::Rejected && s.reason.as_ref() == Some(r)));
}

#[test]
fn the_top_level_strings_of_a_message_are_found_without_parsing_the_rest() {
    let raw = format!(
        r#" {{"input": {{"task_id": "inner", "reply_to": "x"}}, "a": [{}{}], "task_id": "t\u00e9-\"1\"", "n": 1, "reply_to": "q", "task_id": "second"}}"#,
        "[".repeat(500),
        "]".repeat(500)
    );
    assert_eq!(
        submitter::top_level_strings(&raw, &["task_id", "reply_to"]),
        vec![("task_id".to_owned(), "té-\"1\"".to_owned()), ("reply_to".to_owned(), "q".to_owned())]
    );
    assert!(submitter::top_level_strings(r#"["task_id", "x"]"#, &["task_id"]).is_empty(), "not an object");
    assert!(submitter::top_level_strings(r#"{"task_id": 7}"#, &["task_id"]).is_empty(), "not a string");
    assert!(submitter::top_level_strings(r#"{"task_id": "unterminated"#, &["task_id"]).is_empty());
}

#[tokio::test]
async fn submitter_refuses_what_dynamodb_or_sqs_would_refuse_and_names_each_submission() {
    // each of these is refused before a write, in the submission DLQ with a reason free of
    // control characters, and answered under its own submission's id, never as task "unknown"
    let tw = twins();
    let reply = tw.reply_queue("replies");
    let own = tw.deps.resources.scheduler_queue_url.clone();
    let mut deep = json!(1);
    for _ in 0..40 {
        deep = json!({ "d": deep });
    }
    let cases = [
        (format!(r#"{{"v": 1, "workflow": "two", "workflow": "two", "reply_to": "{reply}"}}"#), "appears twice"),
        (json!({"v": 1, "workflow": "two", "reply_to": own}).to_string(), "own queues"),
        (json!({"v": 1, "workflow": "two", "input": {"": 1}, "reply_to": reply}).to_string(), "empty key"),
        (json!({"v": 1, "workflow": "two", "input": {"n": 1e300}, "reply_to": reply}).to_string(), "numbers DynamoDB"),
        (json!({"v": 1, "workflow": "two", "input": deep, "reply_to": reply}).to_string(), "nested deeper"),
        (json!({"v": 1, "workflow": "two\u{0}\u{7}", "reply_to": reply}).to_string(), "unknown workflow"),
    ];
    let agents = AgentRuntime::default();
    for (i, (raw, want)) in cases.iter().enumerate() {
        let rec = Record::new(format!("m-{i}"), raw.clone());
        role::handle(Role::Submitter, &tw.deps, &agents, &rec).await.unwrap();
        let attrs = tw.bus.attributes(&tw.deps.resources.submission_dlq_url);
        let reason = attrs[i].iter().find(|(k, _)| k == "RejectReason").map(|(_, v)| v.clone()).unwrap();
        assert!(reason.contains(want), "{raw}: {reason}");
        assert!(!reason.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')), "{reason:?}");
    }
    assert!(tw.store.tasks().is_empty());
    let statuses: Vec<StatusMessage> = tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str(b).unwrap()).collect();
    let ids: Vec<&str> = statuses.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(
        ids,
        vec!["msg-m-0", "msg-m-2", "msg-m-3", "msg-m-4", "msg-m-5"],
        "each answer names its own submission"
    );
}

#[tokio::test]
async fn an_agent_request_too_large_for_sqs_fails_its_step_at_once() {
    let tw = twins();
    let big = json!({"v": 1, "task_id": "big1", "workflow": "two", "input": {"x": "y".repeat(300 * 1024)}}).to_string();
    let mut settings = tw.deps.settings.clone();
    settings.max_input_bytes = 1_000_000;
    let deps = sas_core::deps::Deps { settings, ..tw.deps.clone() };
    submitter::submit(&deps, &big).await.unwrap();
    assert!(queue(&tw, "agent").is_empty(), "nothing dispatched");
    let failed = queue(&tw, "scheduler").pop().expect("a failure for the attempt");
    assert_eq!(failed["outcome"]["retryable"], json!(false));
    scheduler::schedule(&deps, &failed.to_string()).await.unwrap();
    assert_eq!(task(&tw, "big1").process_state, ProcessState::Compensated, "given up at once, not after timeouts");
}

#[tokio::test]
async fn submitter_fails_the_record_when_the_store_is_down() {
    let tw = twins();
    tw.store.fail_next(StoreOp::Create, backend());
    let err = submitter::submit(&tw.deps, &submission("s3", None)).await.unwrap_err();
    assert!(matches!(err, HandlerError::Store(StoreError::Backend { .. })), "{err}");
    // SQS delivers it again; this time it goes through
    assert!(matches!(submitter::submit(&tw.deps, &submission("s3", None)).await.unwrap(), Submitted::Created(_)));
}

// ---- Scheduler ------------------------------------------------------------------------------

#[tokio::test]
async fn scheduler_claims_dispatches_and_arms_a_timer_once() {
    let tw = twins();
    let run = waiting(&tw, "c1").await;
    let first = scheduler::schedule(&tw.deps, &run).await.unwrap();
    assert_eq!(first, Applied::Changed { state: ProcessState::Processing, rev: 3 });
    // the same run message delivered again changes nothing
    let again = scheduler::schedule(&tw.deps, &run).await.unwrap();
    assert_eq!(again, Applied::Stale(Stale::AlreadyClaimed));
    let dispatched = queue(&tw, "agent");
    assert_eq!(dispatched.len(), 1);
    assert_eq!((dispatched[0]["step"].as_str(), dispatched[0]["attempt_no"].as_u64()), (Some("a"), Some(2)));
    let timers = queue(&tw, "supervisor");
    assert_eq!(timers.len(), 1);
    assert_eq!(timers[0]["attempt"], dispatched[0]["attempt"]);
    assert_eq!(task(&tw, "c1").lock.locked_by.as_ref().map(AttemptToken::as_str), dispatched[0]["attempt"].as_str());
}

#[tokio::test]
async fn scheduler_applies_a_result_once_and_drops_stale_ones() {
    let tw = twins();
    let req = started(&tw, "r1").await;
    let ok = result(&req, Outcome::Succeeded { output: json!({"done": 1}) });
    assert!(matches!(scheduler::schedule(&tw.deps, &ok).await.unwrap(), Applied::Changed { .. }));
    assert_eq!(scheduler::schedule(&tw.deps, &ok).await.unwrap(), Applied::Stale(Stale::NotCurrentAttempt));
    let t = task(&tw, "r1");
    assert_eq!(t.step_index, 1, "moved on to b");
    assert_eq!(queue(&tw, "agent").len(), 1, "b dispatched once");
}

#[tokio::test]
async fn scheduler_drops_messages_for_missing_tasks_and_fails_malformed_ones() {
    let tw = twins();
    let run = json!({"type": "run", "v": 1, "task_id": "ghost", "rev": 1, "reason": "start"}).to_string();
    assert_eq!(scheduler::schedule(&tw.deps, &run).await.unwrap(), Applied::Missing);
    for bad in ["", "{}", r#"{"type":"run","v":9,"task_id":"x","rev":1,"reason":"start"}"#] {
        assert!(matches!(scheduler::schedule(&tw.deps, bad).await, Err(HandlerError::Malformed(_))), "{bad:?}");
    }
    // a later format, even with nothing this build does not know, is refused for its format by
    // the handlers' own readers too (a message handled outside a batch)
    let later = r#"{"type":"run","v":2,"task_id":"x","rev":1,"reason":"start"}"#;
    match scheduler::schedule(&tw.deps, later).await {
        Err(HandlerError::Malformed(why)) => assert!(why.contains("written in format 2"), "{why}"),
        other => panic!("{other:?}"),
    }
    match supervisor::timer(&tw.deps, r#"{"v":2,"task_id":"x","complete_by":5}"#).await {
        Err(HandlerError::Malformed(why)) => assert!(why.contains("written in format 2"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_lost_conditional_write_re_decides_on_the_current_item() {
    let tw = twins();
    let run = waiting(&tw, "k1").await;
    let read = task(&tw, "k1");
    scheduler::schedule(&tw.deps, &run).await.unwrap(); // another scheduler claimed first
    queue(&tw, "agent");
    let (saves, gets) = (tw.store.calls("save"), tw.store.calls("get"));
    // this one still holds the old read: its write loses and it re-decides on what is there now
    let claim = sas_protocol::protocol::Event::Claim { rev: read.claim.rev };
    let (applied, commit) = transition::commit(&tw.deps, read, &claim, None).await.unwrap();
    assert_eq!(applied, Applied::Stale(Stale::AlreadyClaimed));
    assert!(matches!(commit, transition::Commit::Unchanged(_)));
    assert_eq!((tw.store.calls("save") - saves, tw.store.calls("get") - gets), (1, 0), "one write, no extra read");
}

#[tokio::test]
async fn endless_conflicts_give_up_and_the_message_comes_back() {
    let tw = twins();
    let run = waiting(&tw, "k2").await;
    let t = task(&tw, "k2");
    for _ in 0..MAX_CONFLICTS {
        tw.store.fail_next(StoreOp::Save, StoreError::Conflict { current: Some(Box::new(t.clone())) });
    }
    assert!(matches!(scheduler::schedule(&tw.deps, &run).await, Err(HandlerError::Contended(n)) if n == MAX_CONFLICTS));
    assert_eq!(task(&tw, "k2").process_state, ProcessState::Pending, "nothing was written");
}

#[tokio::test]
async fn a_failed_send_after_the_write_fails_the_message_and_its_redelivery_sends_the_same_attempt() {
    // a dispatch lost after the write fails the message: logged only, the attempt would wait for
    // its CompleteBy to be counted as a timeout (5 minutes and an attempt lost at the default
    // queue budget)
    let tw = twins();
    let agents = AgentRuntime::default();
    let run = Record::new("m-run", waiting(&tw, "f1").await);
    tw.bus.fail_sends(&tw.deps.resources.agent_queue_url, 1);
    let first = role::handle(Role::Scheduler, &tw.deps, &agents, &run).await;
    assert!(matches!(first, Err(HandlerError::Bus(_))), "the record fails, so SQS delivers it again: {first:?}");
    assert!(queue(&tw, "agent").is_empty(), "the dispatch was lost");
    let claimed = task(&tw, "f1");
    assert_eq!(claimed.process_state, ProcessState::Processing, "the claim stands");
    queue(&tw, "supervisor");
    // the redelivery finds its own write and sends what it owes: the same attempt, once more
    tw.clock.advance(90_000);
    role::handle(Role::Scheduler, &tw.deps, &agents, &Record { receive_count: 2, ..run.clone() }).await.unwrap();
    let again = queue(&tw, "agent");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["attempt"].as_str(), claimed.lock.locked_by.as_ref().map(AttemptToken::as_str));
    assert_eq!(queue(&tw, "supervisor").len(), 1, "and its deadline timer");
    let after = task(&tw, "f1");
    assert_eq!(after.failure_count, claimed.failure_count, "no attempt charged for a dispatch that never left");
    assert!(after.steps[0].maybe_applied, "two copies of one attempt may be out: a refusal of one hides nothing");
    // any other message finds nothing owed
    let other = Record::new("m-other", run.body.clone());
    role::handle(Role::Scheduler, &tw.deps, &agents, &other).await.unwrap();
    assert!(queue(&tw, "agent").is_empty());
}

#[tokio::test]
async fn late_timers_of_an_ended_task_send_no_notices_again() {
    // the terminal reply and the alert are sent once: a timer that fires after the end sends
    // neither again
    let tw = twins();
    let replies = tw.reply_queue("caller-replies");
    let replies = replies.as_str();
    submitter::submit(&tw.deps, &submission("g9", Some(replies))).await.unwrap();
    let a: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&b, Outcome::Succeeded { output: json!(2) })).await.unwrap();
    assert_eq!(task(&tw, "g9").process_state, ProcessState::Processed);
    let statuses = tw.bus.take(replies).len();
    assert!(statuses >= 3, "Processing, Processing, Processed: {statuses}");
    let timers = queue(&tw, "supervisor");
    assert_eq!(timers.len(), 2, "one per attempt");
    tw.clock.advance(10 * 60_000);
    let agents = AgentRuntime::default();
    for (i, t) in timers.iter().enumerate() {
        let rec = Record::new(format!("timer-{i}"), t.to_string());
        assert!(matches!(role::handle(Role::Supervisor, &tw.deps, &agents, &rec).await, Ok(())));
    }
    assert!(tw.bus.take(replies).is_empty(), "no terminal status again for a late timer");
}

#[tokio::test]
async fn a_handed_over_timer_for_a_deadline_the_task_left_is_spent() {
    // a timer the sweep handed over is for one deadline: once the task left it, the timer is
    // spent, not re-armed for the task's later deadlines
    let tw = twins();
    let a = started(&tw, "g10").await;
    let t = task(&tw, "g10");
    let handed = json!({"v": 1, "task_id": "g10", "complete_by": t.complete_by.unwrap()}).to_string();
    tw.clock.advance(1_000);
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    queue(&tw, "supervisor");
    let got = supervisor::timer(&tw.deps, &handed).await.unwrap();
    assert!(matches!(got, Applied::Stale(_)), "{got:?}");
    assert!(queue(&tw, "supervisor").is_empty(), "not re-armed for the task's new deadline");
}

#[tokio::test]
async fn a_run_message_that_comes_early_is_sent_on_for_the_rest_of_its_wait() {
    // an early run message is sent on, not dropped: dropped, a wait longer than SQS's 15-minute
    // delay would fall back to the sweep
    let tw = twins();
    let a = started(&tw, "g12").await;
    let cancel = json!({"type": "cancel", "v": 1, "task_id": "g12", "reason": "r"}).to_string();
    scheduler::schedule(&tw.deps, &cancel).await.unwrap();
    let t = task(&tw, "g12");
    let not_before = t.claim.not_before.expect("the compensation waits for the attempt to settle");
    let run = queue(&tw, "scheduler").pop().expect("the compensation's run message").to_string();
    let got = scheduler::schedule(&tw.deps, &run).await.unwrap();
    assert!(matches!(got, Applied::Stale(Stale::TooEarly { .. })), "{got:?}");
    let url = &tw.deps.resources.scheduler_queue_url;
    let due = tw.bus.next_visible(url).expect("sent on, not dropped");
    assert_eq!(tw.bus.depth(url), 1);
    let whole_seconds = tw.deps.now().until(not_before).div_ceil(1000) * 1000;
    assert_eq!(due, tw.deps.now().plus_ms(whole_seconds), "due when the wait ends");
    drop(a);
}

#[tokio::test]
async fn an_alert_lost_after_the_write_is_sent_again_when_the_message_comes_back() {
    // the alert is sent with the message's effects: a failed send fails the message, and its
    // redelivery sends the alert again
    let tw = twins();
    let a = started(&tw, "e1").await;
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&b, Outcome::Failed { error: "no".into(), retryable: false })).await.unwrap();
    let undo: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    assert_eq!(undo.step, "undo_a");
    // the compensation is refused for good: Error, and the alert's publish fails
    let last = Record {
        receive_count: 1,
        ..Record::new("m-1", result(&undo, Outcome::Failed { error: "stuck".into(), retryable: false }))
    };
    tw.bus.fail_sends(&tw.deps.resources.alert_topic_arn, 1);
    let agents = AgentRuntime::default();
    let first = role::handle(Role::Scheduler, &tw.deps, &agents, &last).await;
    assert!(matches!(first, Err(HandlerError::Bus(_))), "the record fails, so SQS delivers it again: {first:?}");
    assert_eq!(task(&tw, "e1").process_state, ProcessState::Error, "the write stands");
    assert!(tw.bus.published().is_empty());
    // the redelivery finds the task ended and re-sends what it owes
    let again = Record { receive_count: 2, ..last };
    role::handle(Role::Scheduler, &tw.deps, &agents, &again).await.unwrap();
    let alerts = tw.bus.published();
    assert_eq!(alerts.len(), 1);
    assert!(alerts[0].1.attributes.contains(&("kind".to_owned(), "task_error".to_owned())));
}

#[tokio::test]
async fn a_resubmit_applies_once_to_the_run_the_operator_saw() {
    // a resubmit names the run the operator saw: a duplicate delivery must not resubmit twice
    let tw = twins();
    let a = started(&tw, "f13").await;
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&b, Outcome::Failed { error: "no".into(), retryable: false })).await.unwrap();
    let undo: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&undo, Outcome::Failed { error: "stuck".into(), retryable: false }))
        .await
        .unwrap();
    assert_eq!(task(&tw, "f13").process_state, ProcessState::Error);
    let resubmit = json!({"type": "resubmit", "v": 1, "task_id": "f13", "reason": "fixed", "run": 1}).to_string();
    assert!(matches!(scheduler::schedule(&tw.deps, &resubmit).await.unwrap(), Applied::Changed { .. }));
    // the task fails again (run 2) before the duplicate of the operator's message arrives
    let run = queue(&tw, "scheduler").pop().unwrap().to_string();
    scheduler::schedule(&tw.deps, &run).await.unwrap();
    let undo2: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&undo2, Outcome::Failed { error: "stuck".into(), retryable: false }))
        .await
        .unwrap();
    let t = task(&tw, "f13");
    assert_eq!((t.process_state, t.run), (ProcessState::Error, 2));
    assert_eq!(
        scheduler::schedule(&tw.deps, &resubmit).await.unwrap(),
        Applied::Stale(Stale::OtherRun { message: 1, current: 2 }),
        "the duplicate of run 1's resubmit changes nothing"
    );
    assert_eq!(task(&tw, "f13").rev, t.rev);
}

#[tokio::test]
async fn a_reply_queue_that_does_not_exist_is_said_plainly_and_stops_nothing() {
    // a missing reply_to is the caller's fault, not a stalled task: it is said plainly and the
    // task goes on, and a final status to it must not make its message come back forever
    let tw = twins();
    let gone = "http://twins.local/000000000000/sas-reply-deleted";
    submitter::submit(&tw.deps, &submission("nq1", Some(gone))).await.unwrap();
    let a: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    let last = scheduler::schedule(&tw.deps, &result(&b, Outcome::Succeeded { output: json!(2) })).await;
    assert!(matches!(last, Ok(Applied::Changed { state: ProcessState::Processed, .. })), "{last:?}");
}

/// Drive a task submitted with `reply_to` through both steps (a then b succeed); the outcome of
/// the message that ends it.
async fn run_to_the_end(tw: &Twins, id: &str, reply_to: &str) -> Result<Applied, HandlerError> {
    let got = submitter::submit(&tw.deps, &submission(id, Some(reply_to))).await.unwrap();
    assert!(matches!(got, Submitted::Created(_)), "{got:?}");
    let a: AgentRequest = serde_json::from_value(queue(tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(tw, "agent").pop().unwrap()).unwrap();
    let last = Record::new("m-end", result(&b, Outcome::Succeeded { output: json!(2) }));
    role::handle(Role::Scheduler, &tw.deps, &AgentRuntime::default(), &last).await?;
    Ok(Applied::Changed { state: task(tw, id).process_state, rev: task(tw, id).rev })
}

#[tokio::test]
async fn a_reply_queue_that_refuses_for_good_is_counted_on_the_task_and_never_fails_a_record() {
    // AccessDenied, KMS or parameter errors on a terminal status are for good, not transient:
    // retried, the message that ended the task would fail into the scheduler DLQ, again and again
    for code in ["AccessDenied", "KMS.AccessDeniedException", "KMS.DisabledException", "InvalidParameterValue"] {
        let tw = twins();
        let reply = tw.reply_queue("cmk");
        tw.bus.refuse_sends(&reply, code);
        let end = run_to_the_end(&tw, "u1", &reply).await;
        assert!(matches!(end, Ok(Applied::Changed { state: ProcessState::Processed, .. })), "{code}: {end:?}");
        let t = task(&tw, "u1");
        // Processing a (at submission), Processing b, Processed: three statuses, none delivered
        assert_eq!(t.undelivered.count, 3, "{code}");
        assert!(t.undelivered.error.as_deref().is_some_and(|e| e.contains(code)), "{code}: {:?}", t.undelivered.error);
        assert!(tw.bus.bodies(&reply).is_empty());
        let sdlq = tw.deps.resources.scheduler_dlq_url.clone().unwrap();
        assert_eq!(tw.bus.depth(&sdlq), 0, "{code}: nothing dead-lettered");
        assert_eq!(tw.bus.depth(&tw.deps.resources.scheduler_queue_url), 0, "{code}: nothing to retry");
        // the record is a field of the item only when there is something to say
        let item = serde_json::to_value(&t).unwrap();
        assert_eq!(item["UndeliveredReplies"], 3);
    }
    let tw = twins();
    let reply = tw.reply_queue("fine");
    run_to_the_end(&tw, "u2", &reply).await.unwrap();
    let item = serde_json::to_value(task(&tw, "u2")).unwrap();
    assert!(item.get("UndeliveredReplies").is_none() && item.get("ReplyError").is_none(), "{item}");
}

#[tokio::test]
async fn a_terminal_status_that_fails_for_a_while_is_still_sent_again() {
    // throttling or a 5xx on the final status: the record fails, and its redelivery re-sends it
    let tw = twins();
    let reply = tw.reply_queue("flaky");
    submitter::submit(&tw.deps, &submission("u3", Some(&reply))).await.unwrap();
    let a: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    let last = Record::new("m-end", result(&b, Outcome::Succeeded { output: json!(2) }));
    tw.bus.fail_sends(&reply, 1);
    let agents = AgentRuntime::default();
    let first = role::handle(Role::Scheduler, &tw.deps, &agents, &last).await;
    assert!(matches!(first, Err(HandlerError::Bus(_))), "{first:?}");
    role::handle(Role::Scheduler, &tw.deps, &agents, &Record { receive_count: 2, ..last }).await.unwrap();
    let states: Vec<ProcessState> =
        tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str::<StatusMessage>(b).unwrap().state).collect();
    assert_eq!(states.last(), Some(&ProcessState::Processed));
    assert_eq!(task(&tw, "u3").undelivered.count, 0, "a transient failure is not counted as undeliverable");
}

#[tokio::test]
async fn a_fifo_reply_queue_gets_every_status_of_a_task_with_the_longest_id() {
    // a FIFO status's deduplication id stays within SQS's 128 characters whatever the task id's
    // length: `{task_id}-{seq}` would pass it, and SQS would refuse every such status
    let tw = twins();
    let reply = tw.reply_queue("long.fifo");
    let id = "x".repeat(128);
    let end = run_to_the_end(&tw, &id, &reply).await;
    assert!(matches!(end, Ok(Applied::Changed { state: ProcessState::Processed, .. })), "{end:?}");
    let states: Vec<ProcessState> =
        tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str::<StatusMessage>(b).unwrap().state).collect();
    assert_eq!(states, vec![ProcessState::Processing, ProcessState::Processing, ProcessState::Processed]);
    assert_eq!(task(&tw, &id).undelivered.count, 0);
}

#[tokio::test]
async fn a_reply_to_off_the_allow_list_or_of_the_stack_is_refused_and_hears_nothing() {
    // statuses go only to queues on the allow list and never to the stack's own: otherwise any
    // queue of the account, the stack's DLQs included, could be made to receive them
    let tw = twins();
    let foreign = tw.queue("billing");
    let res = tw.deps.resources.clone();
    let dlqs = [
        res.scheduler_dlq_url.clone().unwrap(),
        res.agent_dlq_url.clone().unwrap(),
        res.supervisor_dlq_url.clone().unwrap(),
    ];
    let mut cases = vec![(foreign.clone(), "is not on this stack's allow-list".to_owned())];
    for q in dlqs.iter().chain([&res.submission_dlq_url, &res.agent_queue_url]) {
        cases.push((q.clone(), "own queues".to_owned()));
        // the same queue, spelled another way
        cases.push((
            q.replace("http://twins.local/", "https://SQS.us-east-1.amazonaws.com:443/"),
            "own queues".to_owned(),
        ));
    }
    for (i, (reply_to, why)) in cases.iter().enumerate() {
        let got = submitter::submit(&tw.deps, &submission(&format!("o{i}"), Some(reply_to))).await.unwrap();
        let Submitted::Rejected(r) = got else { panic!("{reply_to}: {got:?}") };
        assert!(r.to_string().contains(why.as_str()), "{reply_to}: {r}");
    }
    assert!(tw.store.tasks().is_empty());
    assert!(tw.bus.bodies(&foreign).is_empty(), "the foreign queue hears nothing");
    for q in &dlqs {
        assert_eq!(tw.bus.depth(q), 0, "{q} hears nothing");
    }
    assert_eq!(tw.bus.depth(&res.agent_queue_url), 0);
    let kept = tw.bus.attributes(&res.submission_dlq_url);
    assert_eq!(kept.len(), cases.len(), "each refused submission is kept, with its reason");
    assert!(
        kept[0].iter().any(|(k, v)| k == "RejectReason"
            && v.contains("arn:aws:sqs:<this region>:000000000000:billing is not on this stack's allow-list")
            && v.contains("arn:aws:sqs:us-east-1:000000000000:sas-reply-*")),
        "{:?}",
        kept[0]
    );
}

#[tokio::test]
async fn recording_undelivered_statuses_re_decides_on_a_task_that_moved_meanwhile() {
    // the record is a conditional write: one that lost to a transition is applied to what won
    let tw = twins();
    let req = started(&tw, "race").await;
    let read = task(&tw, "race");
    scheduler::schedule(&tw.deps, &result(&req, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    let moved = task(&tw, "race");
    assert_eq!((moved.step_index, moved.rev), (1, read.rev + 1));
    let sent = effects::Sent {
        undelivered: 2,
        undelivered_error: Some("SendMessage to q refused (AccessDenied): no".into()),
        ..effects::Sent::default()
    };
    effects::record_undelivered(&tw.deps, &read, &sent).await;
    let t = task(&tw, "race");
    assert_eq!((t.undelivered.count, t.rev, t.step_index), (2, moved.rev + 1, 1), "the transition stands");
    assert_eq!(t.undelivered.error.as_deref(), sent.undelivered_error.as_deref());
    assert_eq!(t.updated_at, moved.updated_at);
    // and the task goes on from there, the count kept
    let b: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&tw.deps, &result(&b, Outcome::Succeeded { output: json!(2) })).await.unwrap();
    let done = task(&tw, "race");
    assert_eq!((done.process_state, done.undelivered.count), (ProcessState::Processed, 2));
}

#[tokio::test]
async fn a_task_whose_reply_to_is_no_longer_allowed_sends_nothing_there() {
    // a task accepted under a wider allow-list (or before there was one) keeps going, silently
    let tw = twins();
    let reply = tw.reply_queue("old");
    submitter::submit(&tw.deps, &submission("n1", Some(&reply))).await.unwrap();
    assert_eq!(tw.bus.take(&reply).len(), 1);
    let mut narrower = tw.deps.clone();
    narrower.resources.reply_queue_arn_pattern = Some("arn:aws:sqs:us-east-1:000000000000:sas-reply-new-*".into());
    let a: AgentRequest = serde_json::from_value(queue(&tw, "agent").pop().unwrap()).unwrap();
    scheduler::schedule(&narrower, &result(&a, Outcome::Succeeded { output: json!(1) })).await.unwrap();
    assert!(tw.bus.bodies(&reply).is_empty());
    let t = task(&tw, "n1");
    assert_eq!(t.undelivered.count, 1);
    assert!(
        t.undelivered.error.as_deref().is_some_and(|e| e.contains("not on this stack's allow-list")),
        "{:?}",
        t.undelivered.error
    );
}

#[tokio::test]
async fn a_message_that_can_never_parse_goes_to_its_dlq_at_once_with_its_reason() {
    // what can never parse is not retried: maxReceiveCount retries would keep it 458 s on the
    // scheduler queue before the DLQ
    let tw = twins();
    let agents = AgentRuntime::default();
    for (role, body) in [
        (Role::Scheduler, "{\"type\":\"run\""),
        (Role::Agent, "[]"),
        (Role::Supervisor, "x"),
        (Role::Callback, "{\"v\":1,\"status\":\"succeeded\"}"),
    ] {
        let rec = Record::new("m-1", body);
        role::handle(role, &tw.deps, &agents, &rec).await.unwrap();
        let dlq = role.dead_letter_queue(&tw.deps.resources).unwrap().to_owned();
        assert_eq!(tw.bus.bodies(&dlq), vec![body.to_owned()], "{}", role.name());
        let reason = &tw.bus.attributes(&dlq)[0];
        assert!(reason.iter().any(|(k, v)| k == "RejectReason" && v.starts_with("malformed message")), "{reason:?}");
    }
}

// ---- Agent ----------------------------------------------------------------------------------

#[tokio::test]
async fn agent_runs_the_attempt_and_reports_to_the_scheduler() {
    let tw = twins();
    let mut req = started(&tw, "a1").await;
    req.complete_by = Millis::now().plus_ms(5_000); // the agent runs on the wall clock
    tw.clock.set(Millis::now());
    let sent = agent::handle(&tw.deps, &AgentRuntime::with_builtins(), &serde_json::to_string(&req).unwrap()).await;
    assert!(sent.unwrap(), "a result was sent");
    let results = queue(&tw, "scheduler");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["type"], "result");
    assert_eq!(results[0]["attempt"], json!(req.attempt));
    assert_eq!(results[0]["outcome"]["status"], "succeeded");
}

#[tokio::test]
async fn agent_sends_nothing_after_complete_by_and_fails_malformed_requests() {
    let tw = twins();
    let req = started(&tw, "a2").await; // CompleteBy is in 2023 on the wall clock
    let sent = agent::handle(&tw.deps, &AgentRuntime::with_builtins(), &serde_json::to_string(&req).unwrap()).await;
    assert!(!sent.unwrap());
    assert!(queue(&tw, "scheduler").is_empty());
    assert!(matches!(
        agent::handle(&tw.deps, &AgentRuntime::with_builtins(), "{").await,
        Err(HandlerError::Malformed(_))
    ));
}

#[tokio::test]
async fn agent_fails_the_record_when_its_result_cannot_be_sent() {
    let tw = twins();
    let mut req = started(&tw, "a3").await;
    req.complete_by = Millis::now().plus_ms(5_000);
    tw.clock.set(Millis::now());
    tw.bus.fail_sends(&tw.deps.resources.scheduler_queue_url, 1);
    let r = agent::handle(&tw.deps, &AgentRuntime::with_builtins(), &serde_json::to_string(&req).unwrap()).await;
    assert!(matches!(r, Err(HandlerError::Bus(_))), "{r:?}");
}

// ---- Supervisor -----------------------------------------------------------------------------

#[tokio::test]
async fn supervisor_timer_recovers_an_expired_attempt_and_re_arms_an_early_one() {
    let tw = twins();
    let req = started(&tw, "t1").await;
    let timer = queue(&tw, "supervisor").pop().unwrap().to_string();
    // early (a timer may fire before CompleteBy): waits again
    let early = supervisor::timer(&tw.deps, &timer).await.unwrap();
    assert!(matches!(early, Applied::Stale(Stale::NotExpired { .. })), "{early:?}");
    assert_eq!(queue(&tw, "supervisor").len(), 1, "re-armed");
    tw.clock.advance(5_000);
    assert!(matches!(
        supervisor::timer(&tw.deps, &timer).await.unwrap(),
        Applied::Changed { state: ProcessState::Pending, .. }
    ));
    let t = task(&tw, "t1");
    assert_eq!((t.failure_count, t.lock.locked_by.clone()), (1, None));
    // the same timer again changes nothing
    assert_eq!(supervisor::timer(&tw.deps, &timer).await.unwrap(), Applied::Stale(Stale::NotCurrentAttempt));
    // a late failure of the timed-out attempt changes nothing; its late success (produced in time:
    // agents answer only before CompleteBy) is taken, and the retry is no longer needed
    let late_no = result(&req, Outcome::Failed { error: "503".into(), retryable: true });
    assert_eq!(scheduler::schedule(&tw.deps, &late_no).await.unwrap(), Applied::Stale(Stale::NotCurrentAttempt));
    let late = result(&req, Outcome::Succeeded { output: json!(1) });
    assert!(matches!(
        scheduler::schedule(&tw.deps, &late).await.unwrap(),
        Applied::Changed { state: ProcessState::Processing, .. }
    ));
    assert_eq!(task(&tw, "t1").step_index, 1);
}

#[tokio::test]
async fn supervisor_timer_error_paths() {
    let tw = twins();
    let ghost = TimerMessage {
        v: 1,
        task_id: TaskId::try_from("ghost").unwrap(),
        attempt: Some(AttemptToken::from("x")),
        complete_by: T0,
    };
    assert_eq!(supervisor::timer(&tw.deps, &serde_json::to_string(&ghost).unwrap()).await.unwrap(), Applied::Missing);
    assert!(matches!(supervisor::timer(&tw.deps, "[]").await, Err(HandlerError::Malformed(_))));
    tw.store.fail_next(StoreOp::Get, backend());
    assert!(matches!(
        supervisor::timer(&tw.deps, &serde_json::to_string(&ghost).unwrap()).await,
        Err(HandlerError::Store(_))
    ));
}

#[tokio::test]
async fn the_sweep_hands_every_expired_task_to_the_timers_and_each_is_recovered_once() {
    let tw = twins();
    for i in 0..6 {
        started(&tw, &format!("w{i}")).await; // every dispatch and timer below is lost
    }
    queue(&tw, "supervisor");
    tw.clock.advance(5_000 + tw.deps.settings.sweep_lag_ms);
    // two supervisors at once: keys only, page by page (2 per page), nothing decided here
    let (a, b) = tokio::join!(supervisor::sweep(&tw.deps), supervisor::sweep(&tw.deps));
    assert_eq!((a.expired, a.handed, a.errors), (6, 6, 0), "{a:?}");
    assert_eq!((b.expired, b.handed, b.errors), (6, 6, 0), "{b:?}");
    assert!(tw.store.tasks().iter().all(|t| t.rev == 1), "the sweep writes nothing");
    let timers = queue(&tw, "supervisor");
    assert_eq!(timers.len(), 12);
    for t in &timers {
        supervisor::timer(&tw.deps, &t.to_string()).await.unwrap();
    }
    let failures: u32 = tw.store.tasks().iter().map(|t| t.failure_count).sum();
    assert_eq!(failures, 6, "each timed-out attempt counted once, whatever the copies");
    assert_eq!(queue(&tw, "scheduler").len(), 6, "one retry each");
    assert_eq!(supervisor::sweep(&tw.deps).await.expired, 0, "recovered tasks carry a new CompleteBy");
}

#[tokio::test]
async fn a_failing_index_query_is_counted_not_fatal() {
    let tw = twins();
    tw.store.fail_next(StoreOp::Expired, backend());
    let r = supervisor::sweep(&tw.deps).await;
    assert_eq!(r.errors, 1);
}

// ---- the local runner, on the twins ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_runner_drives_a_task_to_its_end_through_the_bus_port() {
    let tw = twins();
    tw.clock.set(Millis::now());
    let reply = tw.reply_queue("runner-replies");
    let opts = RunnerOptions {
        sweep_every: Duration::from_hours(1),
        wait: Duration::from_millis(20),
        ..RunnerOptions::default()
    };
    let handle = Runner::new(Arc::new(tw.deps.clone()), Arc::new(AgentRuntime::with_builtins()), opts).spawn();
    let sub = tw.deps.resources.submission_queue_url.clone();
    tw.bus.send(&sub, Outgoing::new(submission("run1", Some(&reply)))).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        tw.clock.set(Millis::now());
        if tw.store.tasks().first().is_some_and(|t| t.process_state.is_terminal()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not finished: {:?}", tw.store.tasks());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await;
    assert_eq!(task(&tw, "run1").process_state, ProcessState::Processed);
    let states: Vec<ProcessState> =
        tw.bus.bodies(&reply).iter().map(|b| serde_json::from_str::<StatusMessage>(b).unwrap().state).collect();
    assert_eq!(states, vec![ProcessState::Processing, ProcessState::Processing, ProcessState::Processed]);
    for q in [
        &tw.deps.resources.submission_queue_url,
        &tw.deps.resources.scheduler_queue_url,
        &tw.deps.resources.agent_queue_url,
    ] {
        assert_eq!(tw.bus.depth(q), 0, "{q}: every handled message deleted");
    }
}
