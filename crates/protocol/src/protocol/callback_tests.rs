//! Callback and wait units: every path an answer to a waiting step can take (stale, duplicate,
//! late, lost, heartbeat timeout, hard timeout, cancel while waiting, cancel during a heartbeat).

use super::*;
use crate::ids::TaskId;
use crate::messages::AlertKind;
use crate::workflow::{Backoff, OnFailure, StepDef, StepKind, WaitTime, WorkflowDef};
use serde_json::json;

fn call(name: &str, comp: Option<&str>) -> StepDef {
    StepDef {
        backoff: Backoff { base_ms: 100, max_ms: 1_000, multiplier: 2.0 },
        compensation: comp.map(|c| Box::new(call(c, None))),
        ..StepDef::call(name, "sim", 1_000)
    }
}

/// `ship`: a callback step, hard timeout 10 s, heartbeats every 1 s.
fn ship(max_attempts: u32, comp: Option<&str>) -> StepDef {
    StepDef {
        kind: StepKind::Callback { agent: "sim".into(), heartbeat_ms: Some(1_000) },
        timeout_ms: 10_000,
        max_attempts,
        ..call("ship", comp)
    }
}

fn wait(name: &str, ms: Option<u64>, until: Option<&str>) -> StepDef {
    let time = match (ms, until) {
        (Some(ms), None) => WaitTime::Ms(ms),
        (None, Some(at)) => WaitTime::Until(at.to_owned()),
        _ => panic!("a wait step waits for a time or until an instant"),
    };
    StepDef { kind: StepKind::Wait(time), ..StepDef::wait(name, 0) }
}

fn flow(steps: Vec<StepDef>) -> WorkflowDef {
    let w = WorkflowDef {
        concurrency: None,
        result: None,
        name: "w".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps,
    };
    w.validate().expect("a valid workflow");
    w
}

use super::tests::policy;

fn at(now: u64) -> Ctx {
    Ctx { paused: false, now: Millis(now), fresh_token: AttemptToken::fresh(), jitter: 0.5 }
}

fn start(w: WorkflowDef, input: Value) -> Transition {
    submit(TaskId::try_from("t1").unwrap(), w, input, None, &at(1_000), &policy())
}

fn apply_at(task: &Task, e: &Event, now: u64) -> Result<Transition, Stale> {
    apply(task, e, &at(now), &policy())
}

fn go(task: &Task, e: Event, now: u64) -> Transition {
    apply_at(task, &e, now).unwrap_or_else(|s| panic!("{} was stale: {s}", e.name()))
}

fn token(task: &Task) -> AttemptToken {
    task.lock.locked_by.clone().expect("an attempt is running")
}

fn answer(task: &Task, attempt: &AttemptToken, answer: CallbackAnswer) -> Event {
    Event::Callback { attempt: attempt.clone(), unit: task.current_def().name.clone(), answer }
}

fn ok(output: Value) -> CallbackAnswer {
    CallbackAnswer::Succeeded { output }
}

fn beat() -> CallbackAnswer {
    CallbackAnswer::Heartbeat { details: Some(json!({"pct": 50})) }
}

fn requests(fx: &[Effect]) -> Vec<&AgentRequest> {
    fx.iter().filter_map(|e| if let Effect::Dispatch(r) = e { Some(r) } else { None }).collect()
}

fn alerts(fx: &[Effect]) -> Vec<AlertKind> {
    fx.iter().filter_map(|e| if let Effect::Alert(a) = e { Some(a.kind) } else { None }).collect()
}

/// reserve (call) succeeded; ship (callback) claimed at 2_000.
fn shipping(max_attempts: u32, comp: Option<&str>) -> (Task, Vec<Effect>) {
    let t =
        start(flow(vec![call("reserve", Some("release")), ship(max_attempts, comp), call("notify", None)]), json!({}));
    let tr = go(&t.task, Event::AgentSucceeded { attempt: token(&t.task), output: json!({"r": 1}) }, 2_000);
    (tr.task, tr.effects)
}

#[test]
fn a_callback_step_hands_its_token_over_and_its_answer_moves_the_task() {
    let (t, fx) = shipping(3, None);
    let req = requests(&fx)[0];
    let cb = req.callback.as_ref().expect("a callback step's request carries its token");
    assert_eq!((cb.token.task_id().as_str(), cb.token.unit(), cb.token.attempt()), ("t1", "ship", &token(&t)));
    assert_eq!(cb.heartbeat_ms, Some(1_000));
    assert_eq!(req.complete_by, Millis(12_000), "the remote side's deadline is the hard one");
    assert_eq!(t.complete_by, Some(Millis(3_000)), "the first heartbeat is due one window after the start");
    assert_eq!(t.lock.hard_by, Some(Millis(12_000)));
    assert_eq!(t.steps[1].issued, vec![token(&t)]);
    let a = token(&t);
    let done = go(&t, answer(&t, &a, ok(json!({"tracking": "Z1"}))), 2_500);
    assert_eq!(done.task.step_index, 2, "on to notify");
    assert_eq!(done.task.steps[1].output, Some(json!({"tracking": "Z1"})));
    assert_eq!(done.task.steps[1].done_by.as_ref(), Some(&a));
    assert_eq!(done.task.lock.hard_by, None, "notify is a call step");
    assert_eq!(requests(&done.effects)[0].input["outputs"]["ship"], json!({"tracking": "Z1"}));
    // the worker sends its answer again: a duplicate, answered as such, changing nothing
    assert_eq!(apply_at(&done.task, &answer(&t, &a, ok(json!({"tracking": "Z1"}))), 2_600), Err(Stale::Duplicate));
    // a token nobody was given changes nothing, even with the right task and unit
    let forged = AttemptToken::fresh();
    let never = Err(Stale::NeverIssued { unit: "ship".into() });
    assert_eq!(apply_at(&done.task, &answer(&t, &forged, ok(json!({}))), 2_600), never);
    // a forged token says that no attempt was given it, whatever it answers, even while the
    // step waits
    let failed = CallbackAnswer::Failed { error: "no".into(), retryable: false };
    for a in [ok(json!({})), failed, beat()] {
        assert_eq!(apply_at(&t, &answer(&t, &forged, a.clone()), 2_100), never, "{a:?}");
    }
    let other_step = Event::Callback { attempt: a.clone(), unit: "reserve".into(), answer: ok(json!({})) };
    assert_eq!(apply_at(&done.task, &other_step, 2_600), Err(Stale::NeverIssued { unit: "reserve".into() }));
    let said = Stale::NeverIssued { unit: "ship".into() }.to_string();
    assert!(said.starts_with("no attempt of ship was given this token"), "{said}");
}

/// A success that comes after the same attempt answered that it failed (a person rejected, then
/// approved) is late, and says the step had failed, not that it expired.
#[test]
fn a_success_after_the_same_attempt_failed_is_late_because_the_step_had_failed() {
    let (t, _) = shipping(3, None);
    let a = token(&t);
    let rejected = CallbackAnswer::Failed { error: "rejected by alice: over budget".into(), retryable: false };
    let failed = go(&t, answer(&t, &a, rejected), 2_500);
    assert_eq!(failed.task.process_state, ProcessState::Compensating);
    let approved = go(&failed.task, answer(&t, &a, ok(json!({"approved": true}))), 2_600);
    let why = approved.task.late.last.clone().unwrap();
    assert!(
        why.contains("from an attempt that had already answered that it failed (rejected by alice: over budget)")
            && why.contains("the step had failed then"),
        "{why}"
    );
    assert!(!why.contains("expired"), "{why}");
    assert_eq!(alerts(&approved.effects), vec![AlertKind::LateResult]);
}

#[test]
fn heartbeats_move_the_deadline_by_one_window_never_past_the_hard_one_and_write_only_past_half() {
    let (t, _) = shipping(3, None);
    let a = token(&t);
    // at 2_100 the deadline (3_000) is more than half a window away: taken, nothing written
    assert_eq!(
        apply_at(&t, &answer(&t, &a, beat()), 2_100),
        Err(Stale::HeartbeatNotDue { complete_by: Millis(3_000) })
    );
    let tr = go(&t, answer(&t, &a, beat()), 2_600);
    assert_eq!(tr.task.complete_by, Some(Millis(3_600)));
    assert!(tr.effects.is_empty(), "a heartbeat sends nothing");
    assert!(tr.keeps_mark, "it owes no work: the claim's message keeps its mark");
    assert_eq!(tr.task.steps[1].progress, Some(json!({"pct": 50})));
    // heartbeats every 100 ms for 20 s: the deadline never passes the hard one, and writes are
    // one per half window
    let (mut task, mut writes) = (tr.task, 1);
    for now in (2_700..=22_000).step_by(100) {
        if task.complete_by.is_some_and(|cb| cb.0 < now) {
            break;
        }
        if let Ok(tr) = apply_at(&task, &answer(&task, &a, beat()), now) {
            writes += 1;
            task = tr.task;
        }
        assert!(task.complete_by <= Some(Millis(12_000)));
    }
    assert_eq!(task.complete_by, Some(Millis(12_000)), "capped at the hard deadline");
    // 96 heartbeats (2.1 s to 12 s, every 100 ms): one write per half window until the cap
    assert_eq!(writes, 18, "one write per 500 ms over 9.4 s");
    // the hard deadline passes: the attempt expires whatever the heartbeats say
    let expired = go(&task, Event::DeadlineExpired, 12_000);
    assert_eq!(expired.task.process_state, ProcessState::Pending);
    assert!(expired.task.reason.as_deref().unwrap().contains("passed CompleteBy 12000"), "{:?}", expired.task.reason);
}

#[test]
fn heartbeats_that_stop_expire_the_attempt_and_its_old_token_is_stale_for_the_retry() {
    let (t, _) = shipping(3, None);
    let old = token(&t);
    let expired = go(&t, Event::DeadlineExpired, 3_000);
    assert!(
        expired.task.reason.as_deref().unwrap().contains("sent no heartbeat within 1000 ms"),
        "{:?}",
        expired.task.reason
    );
    assert_eq!(expired.task.lock.hard_by, None);
    let retry = go(&expired.task, Event::Claim { rev: expired.task.claim.rev }, 3_200);
    let new = token(&retry.task);
    assert_ne!(new, old, "a retry mints a new token");
    let req = requests(&retry.effects)[0];
    assert_eq!(req.callback.as_ref().unwrap().token.attempt(), &new);
    assert_eq!(
        req.idempotency_key,
        requests(&shipping(3, None).1)[0].idempotency_key,
        "same key: the remote side applies once"
    );
    assert_eq!(apply_at(&retry.task, &answer(&retry.task, &old, beat()), 3_300), Err(Stale::NotCurrentAttempt));
    // the old attempt's success while its unit is still being retried: the effect happened, so it
    // is taken (it shares the idempotency key with the retry)
    let taken = go(&retry.task, answer(&retry.task, &old, ok(json!({"late": true}))), 3_400);
    assert_eq!(taken.task.step_index, 2);
    // then the retry's own success comes: late, but its unit succeeded, so nothing to reconcile
    let late = go(&taken.task, answer(&retry.task, &new, ok(json!({}))), 3_500);
    assert_eq!(late.task.late.count, 1);
    assert!(alerts(&late.effects).is_empty(), "accounted for: no alert");
    assert_eq!(late.task.step_index, 2, "the task does not move");
    assert_eq!(apply_at(&late.task, &answer(&retry.task, &new, ok(json!({}))), 3_600), Err(Stale::LateAgain));
}

#[test]
fn a_callback_that_never_comes_ends_in_compensation_and_its_late_success_alerts_an_operator() {
    let (t, _) = shipping(1, Some("unship"));
    let a = token(&t);
    let gave_up = go(&t, Event::DeadlineExpired, 3_000);
    assert!(gave_up.task.is_compensating());
    assert_eq!(alerts(&gave_up.effects), vec![AlertKind::RetriesExhausted]);
    let Stage::Compensating { plan, .. } = &gave_up.task.stage else { unreachable!() };
    assert_eq!(plan, &vec![1, 0], "ship may have applied (no answer): undone too, then reserve");
    // the compensation of ship waits until ship's attempt can no longer apply (its hard deadline)
    assert_eq!(gave_up.task.claim.not_before, Some(Millis(12_000)));
    let mut task = go(&gave_up.task, Event::Claim { rev: gave_up.task.claim.rev }, 12_000).task;
    for now in [12_010, 12_020] {
        task = go(&task, Event::AgentSucceeded { attempt: token(&task), output: json!({}) }, now).task;
    }
    assert_eq!(task.process_state, ProcessState::Compensated);
    // days later the warehouse confirms the shipment: recorded, counted, and an operator alerted
    let late = go(
        &task,
        Event::Callback { attempt: a.clone(), unit: "ship".into(), answer: ok(json!({"shipped": 1})) },
        99_000,
    );
    assert_eq!(late.task.process_state, ProcessState::Compensated, "a terminal task does not move");
    assert_eq!((late.task.late.count, late.task.late.attempt.as_ref()), (1, Some(&a)));
    assert!(late.task.late.last.as_deref().unwrap().contains("reconcile"));
    assert_eq!(alerts(&late.effects), vec![AlertKind::LateResult]);
    assert_eq!(
        apply_at(
            &late.task,
            &Event::Callback { attempt: a.clone(), unit: "ship".into(), answer: ok(json!({})) },
            99_100
        ),
        Err(Stale::LateAgain)
    );
    // a heartbeat or a failure to an ended task changes nothing and says so
    let hb = Event::Callback { attempt: a, unit: "ship".into(), answer: beat() };
    assert_eq!(apply_at(&late.task, &hb, 99_200), Err(Stale::Terminal(ProcessState::Compensated)));
}

#[test]
fn cancel_while_waiting_for_a_callback_tells_the_heartbeat_to_stop_and_its_answer_releases_compensation() {
    let (t, _) = shipping(3, Some("unship"));
    let a = token(&t);
    let hb = go(&t, answer(&t, &a, beat()), 2_600).task;
    let cancelled = go(&hb, Event::Cancel { reason: "customer".into(), run: None }, 2_700);
    assert_eq!(cancelled.task.lock.awaits.as_ref(), Some(&a));
    assert!(requests(&cancelled.effects).is_empty(), "compensation waits for the callback attempt to settle");
    assert_eq!(
        apply_at(&cancelled.task, &Event::Callback { attempt: a.clone(), unit: "ship".into(), answer: beat() }, 2_800),
        Err(Stale::CancelRequested),
        "the worker's next heartbeat learns it should stop"
    );
    // the worker stops and says so for good: the compensation starts at once
    let stopped = CallbackAnswer::Failed { error: "stopped: cancelled".into(), retryable: false };
    let released =
        go(&cancelled.task, Event::Callback { attempt: a.clone(), unit: "ship".into(), answer: stopped }, 2_900);
    let unship = go(&released.task, Event::Claim { rev: released.task.claim.rev }, 2_900);
    assert_eq!(requests(&unship.effects)[0].step, "unship");
    // or it had shipped already: the success is taken, its output kept for the compensation
    let shipped =
        go(&cancelled.task, Event::Callback { attempt: a, unit: "ship".into(), answer: ok(json!({"id": 7})) }, 2_900);
    let shipped = go(&shipped.task, Event::Claim { rev: shipped.task.claim.rev }, 2_900);
    let req = requests(&shipped.effects)[0];
    assert_eq!((req.step.as_str(), &req.input["outputs"]["ship"]), ("unship", &json!({"id": 7})));
}

#[test]
fn a_cancel_and_a_heartbeat_racing_decide_once_whichever_writes_first() {
    let (t, _) = shipping(3, Some("unship"));
    let a = token(&t);
    // the heartbeat wins: the cancel re-decides on the task the heartbeat wrote
    let hb = go(&t, answer(&t, &a, beat()), 2_600).task;
    let c1 = go(&hb, Event::Cancel { reason: "x".into(), run: None }, 2_600);
    // the cancel wins: the heartbeat re-decides on the cancelled task and is told to stop
    let c2 = go(&t, Event::Cancel { reason: "x".into(), run: None }, 2_600);
    assert_eq!(apply_at(&c2.task, &answer(&t, &a, beat()), 2_600), Err(Stale::CancelRequested));
    assert_eq!(c1.task.process_state, c2.task.process_state);
    assert_eq!(c1.task.lock.awaits, c2.task.lock.awaits);
}

#[test]
fn a_retryable_failure_retries_with_a_new_token_and_its_repeat_is_a_duplicate() {
    let (t, _) = shipping(3, None);
    let a = token(&t);
    let fail = CallbackAnswer::Failed { error: "warehouse busy".into(), retryable: true };
    let tr = go(&t, answer(&t, &a, fail.clone()), 2_500);
    assert_eq!(tr.task.process_state, ProcessState::Pending);
    assert_eq!(apply_at(&tr.task, &answer(&t, &a, fail), 2_600), Err(Stale::Duplicate));
    let hard = CallbackAnswer::Failed { error: "no such address".into(), retryable: false };
    let retry = go(&tr.task, Event::Claim { rev: tr.task.claim.rev }, 3_000).task;
    let refused = go(&retry, answer(&retry, &token(&retry), hard), 3_100);
    assert!(refused.task.is_compensating() || refused.task.process_state.is_terminal());
    assert!(refused.task.reason.as_deref().unwrap().contains("no such address"));
}

#[test]
fn owed_work_of_a_heartbeating_callback_attempt_is_the_same_request() {
    let (t, fx) = shipping(3, None);
    let a = token(&t);
    let moved = go(&t, answer(&t, &a, beat()), 2_600).task;
    let owed = owed_sends(&moved, Millis(2_700), &policy());
    assert_eq!(requests(&owed), requests(&fx), "same attempt, token, key and hard deadline");
    assert!(owed.iter().any(|e| matches!(e, Effect::ArmTimer(tm) if tm.complete_by == Millis(3_600))));
}

#[test]
fn a_wait_step_sleeps_without_an_agent_and_wakes_at_its_deadline() {
    let t = start(
        flow(vec![call("reserve", Some("release")), wait("cool-off", Some(5_000), None), call("remind", None)]),
        json!({}),
    );
    let tr = go(&t.task, Event::AgentSucceeded { attempt: token(&t.task), output: json!({}) }, 2_000);
    assert!(requests(&tr.effects).is_empty(), "no agent for a wait");
    assert!(tr.effects.iter().any(|e| matches!(e, Effect::ArmTimer(tm) if tm.complete_by == Millis(7_000))));
    assert_eq!((tr.task.process_state, tr.task.current_step_name()), (ProcessState::Processing, Some("cool-off")));
    assert_eq!(
        apply_at(&tr.task, &Event::DeadlineExpired, 6_999),
        Err(Stale::NotExpired { complete_by: Millis(7_000), now: Millis(6_999) })
    );
    let woke = go(&tr.task, Event::DeadlineExpired, 7_000);
    assert_eq!(woke.task.steps[1].status, StepStatus::Succeeded);
    assert_eq!(woke.task.failure_count, 0, "waking is not a failure");
    assert_eq!(requests(&woke.effects)[0].step, "remind");
    // the owed work of a wait is its timer only
    let owed = owed_sends(&tr.task, Millis(2_100), &policy());
    assert!(requests(&owed).is_empty() && owed.len() == 1);
    // cancelled while waiting: nothing to await or undo for the wait; reserve is released at once
    let c = go(&tr.task, Event::Cancel { reason: "changed mind".into(), run: None }, 3_000);
    assert_eq!(c.task.lock.awaits, None);
    assert_eq!(requests(&c.effects)[0].step, "release");
    assert!(!c.task.steps[1].maybe_applied);
}

#[test]
fn a_wait_until_reads_its_instant_from_the_task_and_refuses_one_it_cannot_read() {
    let w = || flow(vec![wait("until", None, Some("/input/remind_at")), call("remind", None)]);
    let t = start(w(), json!({"remind_at": 50_000}));
    assert_eq!(t.task.complete_by, Some(Millis(50_000)));
    let t = start(w(), json!({"remind_at": "1970-01-01T00:01:40Z"}));
    assert_eq!(t.task.complete_by, Some(Millis(100_000)));
    let past = start(w(), json!({"remind_at": 10}));
    assert_eq!(past.task.current_step_name(), Some("remind"), "an instant already past wakes at once");
    for bad in [
        json!({}),
        json!({"remind_at": "tomorrow"}),
        json!({"remind_at": true}),
        json!({"remind_at": 99_999_999_999_999u64}),
    ] {
        let t = start(w(), bad.clone());
        assert_eq!(t.task.process_state, ProcessState::Compensated, "{bad}: fails for good with nothing to undo");
        assert!(t.task.reason.as_deref().unwrap().contains("wait_until"), "{bad}: {:?}", t.task.reason);
    }
}

#[test]
fn a_wait_for_reads_its_seconds_from_the_task_and_a_wait_until_may_be_written_as_a_time() {
    let for_ = || {
        let pause = StepDef {
            kind: StepKind::Wait(WaitTime::SecondsAt("/input/delay_s".into())),
            ..wait("pause", Some(0), None)
        };
        flow(vec![pause, call("remind", None)])
    };
    let t = start(for_(), json!({"delay_s": 30}));
    let slept = t.task.complete_by.unwrap().0 - 1_000; // submitted at 1,000
    assert_eq!(slept, 30_000, "{:?}", t.task.complete_by);
    let t = start(for_(), json!({"delay_s": 1.5}));
    assert_eq!(t.task.complete_by.unwrap().0 - 1_000, 1_500);
    for bad in [json!({}), json!({"delay_s": "soon"}), json!({"delay_s": -1}), json!({"delay_s": 1e12})] {
        let t = start(for_(), bad.clone());
        assert_eq!(t.task.process_state, ProcessState::Compensated, "{bad}: fails for good with nothing to undo");
        assert!(t.task.reason.as_deref().unwrap().contains("wait_for"), "{bad}: {:?}", t.task.reason);
    }
    let until = flow(vec![wait("until", None, Some("1970-01-01T00:01:40Z")), call("remind", None)]);
    assert_eq!(start(until, json!({})).task.complete_by, Some(Millis(100_000)), "a time written in the workflow");
    let bad = WorkflowDef { steps: vec![wait("until", None, Some("tomorrow"))], ..flow(vec![call("x", None)]) };
    assert!(bad.validate().unwrap_err().to_string().contains("RFC 3339"));
    let both = json!({"name": "w", "kind": "wait", "wait_ms": 5, "wait_for": "/input/d"});
    let e = serde_json::from_value::<StepDef>(both).unwrap_err().to_string();
    assert!(e.contains("exactly one"), "a wait step with two times does not parse: {e}");
}
