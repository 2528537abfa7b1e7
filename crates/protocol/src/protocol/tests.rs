use super::task::MAX_ISSUED;
use super::*;
use crate::ids::TaskId;
use crate::messages::{AlertKind, Outcome, Phase};
use crate::workflow::{Backoff, OnFailure, StepDef, StepKind, WorkflowDef};
use proptest::prelude::*;
use serde_json::json;

fn step(name: &str, comp: Option<&str>, max_attempts: u32) -> StepDef {
    let backoff = Backoff { base_ms: 100, max_ms: 1_000, multiplier: 2.0 };
    StepDef {
        max_attempts,
        backoff: backoff.clone(),
        compensation: comp.map(|c| Box::new(StepDef { max_attempts: 2, backoff, ..StepDef::call(c, "sim", 1_000) })),
        ..StepDef::call(name, "sim", 1_000)
    }
}

fn order() -> WorkflowDef {
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "order".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![step("reserve", Some("release"), 3), step("charge", Some("refund"), 3), step("ship", None, 3)],
    }
}

/// The tests' policy (also the callback and map tests').
pub(super) fn policy() -> Policy {
    Policy {
        pause_check_ms: Policy::default().pause_check_ms,
        key_check_ms: Policy::default().key_check_ms,
        start_timeout_ms: 500,
        history_limit: 50,
        queue_budget_ms: 0,
        result_grace_ms: 0,
        settle_ms: 0,
        unchecked_start_ms: 0,
        max_restarts: 8,
    }
}

fn ctx(now: u64) -> Ctx {
    Ctx { paused: false, now: Millis(now), fresh_token: AttemptToken::fresh(), jitter: 0.5 }
}

fn new_task(reply: bool) -> Transition {
    submit(
        TaskId::try_from("t1").unwrap(),
        order(),
        json!({"sku": "a"}),
        reply.then(|| "http://localhost:4566/queue/us-east-1/000000000000/r".to_owned()),
        &ctx(1_010),
        &policy(),
    )
}

fn go(task: &Task, e: Event, now: u64) -> Transition {
    apply(task, &e, &ctx(now), &policy()).unwrap_or_else(|s| panic!("{} was stale: {s}", e.name()))
}

/// The Scheduler takes the run message of the task's current wait.
fn claim(task: &Task, now: u64) -> Transition {
    go(task, Event::Claim { rev: task.claim.rev }, now)
}

fn token(task: &Task) -> AttemptToken {
    task.lock.locked_by.clone().expect("an attempt is running")
}

fn succeed(task: &Task, now: u64) -> Transition {
    go(task, Event::AgentSucceeded { attempt: token(task), output: json!({"ok": task.rev}) }, now)
}

fn dispatched(fx: &[Effect]) -> Vec<&AgentRequest> {
    fx.iter().filter_map(|e| if let Effect::Dispatch(r) = e { Some(r) } else { None }).collect()
}

fn replies(fx: &[Effect]) -> Vec<ProcessState> {
    fx.iter().filter_map(|e| if let Effect::Reply(s) = e { Some(s.state) } else { None }).collect()
}

fn alerts(fx: &[Effect]) -> Vec<AlertKind> {
    fx.iter().filter_map(|e| if let Effect::Alert(a) = e { Some(a.kind) } else { None }).collect()
}

#[test]
fn submission_claims_the_first_step_in_its_one_write() {
    let tr = new_task(true);
    assert_eq!(tr.task.process_state, ProcessState::Processing);
    assert_eq!(tr.task.rev, 1, "created, not yet rewritten");
    assert_eq!(tr.task.complete_by, Some(Millis(2_010)));
    assert!(tr.task.lock.locked_by.is_some());
    assert_eq!(tr.task.steps[0].attempts, 1);
    assert_eq!(replies(&tr.effects), vec![ProcessState::Processing]);
    assert!(!tr.effects.iter().any(|e| matches!(e, Effect::Run { .. })), "no run message: nothing waits");
    let d = dispatched(&tr.effects);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].attempt, token(&tr.task));
    assert!(tr.effects.iter().any(|e| matches!(e, Effect::ArmTimer(t) if t.complete_by == Millis(2_010))));
}

#[test]
fn a_start_sent_again_is_the_same_attempt_until_the_task_moves() {
    for budget in [0, 300_000] {
        let p = Policy { queue_budget_ms: budget, ..policy() };
        let tr = submit(TaskId::try_from("t1").unwrap(), order(), json!({"sku": "a"}), None, &ctx(1_010), &p);
        let again = resend(&tr.task, Millis(1_050), &p);
        let work: Vec<_> = tr.effects.iter().filter(|e| !e.is_notification()).cloned().collect();
        assert_eq!(again.effects, work, "budget {budget}: same request, same key, same timer");
        assert!(again.task.steps[0].maybe_applied, "two copies of one attempt: a refusal of one hides nothing");
        assert_eq!(again.task.rev, 2);
        let third = resend(&again.task, Millis(1_060), &p);
        assert_eq!(third.effects, work, "sent again as often as the message comes back");
        assert_eq!(third.task, again.task, "but written once");
        let refused = Event::AgentFailed { attempt: token(&tr.task), error: "no".into(), retryable: false };
        let r = apply(&again.task, &refused, &ctx(1_070), &p).unwrap().task;
        assert_eq!(r.process_state, ProcessState::Compensating, "the other copy may have reserved: released");
        let moved =
            apply(&tr.task, &Event::AgentSucceeded { attempt: token(&tr.task), output: json!(1) }, &ctx(1_100), &p)
                .unwrap()
                .task;
        let next = resend(&moved, Millis(1_200), &p);
        assert_eq!(dispatched(&next.effects)[0].step, "charge", "a task owes what its last write sent");
    }
}

#[test]
fn happy_path_runs_every_step_in_order() {
    let c = new_task(true);
    assert_eq!(c.task.process_state, ProcessState::Processing);
    assert_eq!(c.task.complete_by, Some(Millis(2_010)));
    let d = dispatched(&c.effects);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].step, "reserve");
    assert_eq!(d[0].idempotency_key.as_str(), "t1:reserve");
    assert_eq!(d[0].attempt_no, 1);
    assert_eq!(d[0].input["input"]["sku"], "a");
    assert!(c.effects.iter().any(|e| matches!(e, Effect::ArmTimer(t) if t.complete_by == Millis(2_010))));

    let s1 = succeed(&c.task, 1_100);
    assert_eq!(dispatched(&s1.effects)[0].step, "charge");
    assert_eq!(dispatched(&s1.effects)[0].input["outputs"]["reserve"], json!({"ok": 1}));
    assert_ne!(s1.task.lock.locked_by, c.task.lock.locked_by, "each step gets a fresh token");
    let s2 = succeed(&s1.task, 1_200);
    assert_eq!(dispatched(&s2.effects)[0].step, "ship");
    let s3 = succeed(&s2.task, 1_300);
    assert_eq!(s3.task.process_state, ProcessState::Processed);
    assert_eq!(s3.task.complete_by, None);
    assert_eq!(s3.task.lock.locked_by, None);
    assert!(dispatched(&s3.effects).is_empty());
    let states: Vec<_> = s3.task.history.iter().map(|h| (h.state, h.step.clone())).collect();
    assert_eq!(
        states,
        vec![
            (ProcessState::Processing, Some("reserve".into())),
            (ProcessState::Processing, Some("charge".into())),
            (ProcessState::Processing, Some("ship".into())),
            (ProcessState::Processed, None),
        ]
    );
    let seqs: Vec<u64> = s3.task.history.iter().map(|h| h.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
}

#[test]
fn no_reply_effects_without_reply_queue() {
    let c = new_task(false);
    assert!(replies(&c.effects).is_empty());
    assert_eq!(c.task.history.len(), 1, "history is kept either way");
}

/// A task waiting for the claim of its first step's second attempt (after a retryable failure).
fn waiting_task() -> Task {
    let c = new_task(false).task;
    go(&c, Event::AgentFailed { attempt: token(&c), error: "503".into(), retryable: true }, 1_020).task
}

#[test]
fn claims_are_fenced_by_rev_and_lock() {
    let t0 = waiting_task();
    assert_eq!(t0.process_state, ProcessState::Pending);
    assert_eq!(
        apply(&t0, &Event::Claim { rev: 0 }, &ctx(1_200), &policy()),
        Err(Stale::OldRun { message: 0, current: t0.claim.rev })
    );
    let c = claim(&t0, 1_200);
    // the same run message delivered again
    assert_eq!(apply(&c.task, &Event::Claim { rev: t0.claim.rev }, &ctx(1_210), &policy()), Err(Stale::AlreadyClaimed));
    // a run message from an earlier wait (before a retry) claims nothing
    let retry =
        go(&c.task, Event::AgentFailed { attempt: token(&c.task), error: "503".into(), retryable: true }, 1_230);
    assert_eq!(
        apply(&retry.task, &Event::Claim { rev: t0.claim.rev }, &ctx(1_600), &policy()),
        Err(Stale::OldRun { message: t0.claim.rev, current: retry.task.claim.rev })
    );
}

#[test]
fn results_with_a_stale_token_change_nothing() {
    let c = new_task(false).task;
    let e = Event::AgentSucceeded { attempt: AttemptToken::from("old"), output: json!(1) };
    assert_eq!(apply(&c, &e, &ctx(1_020), &policy()), Err(Stale::NotCurrentAttempt));
    let e = Event::AgentFailed { attempt: AttemptToken::from("old"), error: "x".into(), retryable: false };
    assert_eq!(apply(&c, &e, &ctx(1_020), &policy()), Err(Stale::NotCurrentAttempt));
}

#[test]
fn duplicate_result_is_applied_once() {
    let c = new_task(false).task;
    let e = Event::AgentSucceeded { attempt: token(&c), output: json!(1) };
    let once = apply(&c, &e, &ctx(1_020), &policy()).unwrap().task;
    assert_eq!(apply(&once, &e, &ctx(1_030), &policy()), Err(Stale::NotCurrentAttempt));
}

#[test]
fn timeout_then_retry_then_success() {
    let c = new_task(true).task;
    assert!(matches!(apply(&c, &Event::DeadlineExpired, &ctx(2_000), &policy()), Err(Stale::NotExpired { .. })));
    let r = go(&c, Event::DeadlineExpired, 2_010);
    assert_eq!(r.task.process_state, ProcessState::Pending);
    assert_eq!(r.task.failure_count, 1);
    assert_eq!(r.task.lock.locked_by, None);
    // backoff 100 ms * (0.5 + 0.5*0.5) = 75 ms; CompleteBy leaves start_timeout on top
    assert!(r.effects.contains(&Effect::Run { rev: r.task.rev, delay_ms: 75, reason: RunReason::Retry }));
    assert_eq!(r.task.complete_by, Some(Millis(2_010 + 75 + 500)));
    assert_eq!(replies(&r.effects), vec![ProcessState::Pending]);
    assert!(r.task.reason.as_deref().unwrap().contains("retry 2/3"), "{:?}", r.task.reason);
    // the timed-out attempt's result, produced in time (an agent sends nothing after CompleteBy)
    // but delayed, is taken while the task is still on that step...
    let late = Event::AgentSucceeded { attempt: token(&c), output: json!(1) };
    let took = go(&r.task, late.clone(), 2_020);
    assert_eq!((took.task.step_index, took.task.steps[0].status), (1, StepStatus::Succeeded));
    assert_eq!(dispatched(&took.effects)[0].step, "charge");
    // ...and a failure it reports late changes nothing
    let late_no = Event::AgentFailed { attempt: token(&c), error: "503".into(), retryable: true };
    assert_eq!(apply(&r.task, &late_no, &ctx(2_020), &policy()), Err(Stale::NotCurrentAttempt));
    // without it, the retry runs
    let c2 = claim(&r.task, 2_100);
    assert_eq!(dispatched(&c2.effects)[0].attempt_no, 2);
    assert_eq!(dispatched(&c2.effects)[0].idempotency_key.as_str(), "t1:reserve");
    let s = succeed(&c2.task, 2_200);
    assert_eq!(s.task.failure_count, 1);
    assert_eq!(s.task.steps[0].status, StepStatus::Succeeded);
}

fn time_out(task: &Task, now: u64) -> Transition {
    go(task, Event::DeadlineExpired, now)
}

#[test]
fn exhausted_timeouts_compensate_completed_steps_in_reverse_and_alert() {
    let mut t = new_task(true).task;
    t = succeed(&t, 1_100).task; // reserve done, charge running
    t = succeed(&t, 1_200).task; // charge done, ship running
    let mut now = 1_200;
    for attempt in 1..=3 {
        now += 2_000;
        let r = time_out(&t, now);
        if attempt < 3 {
            assert_eq!(r.task.process_state, ProcessState::Pending);
            t = claim(&r.task, now + 100).task;
        } else {
            assert_eq!(alerts(&r.effects), vec![AlertKind::RetriesExhausted]);
            assert_eq!(r.task.process_state, ProcessState::Compensating);
            // ship has no compensation: refund first, then release
            assert_eq!(dispatched(&r.effects)[0].step, "refund");
            assert_eq!(dispatched(&r.effects)[0].phase, Phase::Compensate);
            assert_eq!(r.task.steps[2].status, StepStatus::TimedOut);
            t = r.task;
        }
    }
    assert_eq!(t.failure_count, 3);
    let r = succeed(&t, now + 200);
    assert_eq!(dispatched(&r.effects)[0].step, "release");
    let r = succeed(&r.task, now + 300);
    assert_eq!(r.task.process_state, ProcessState::Compensated);
    assert_eq!(r.task.complete_by, None);
    assert_eq!(r.task.steps[0].compensation.as_ref().unwrap().status, CompensationStatus::Done);
    assert_eq!(r.task.steps[1].compensation.as_ref().unwrap().status, CompensationStatus::Done);
    assert!(r.task.steps[2].compensation.is_none());
    assert!(r.task.reason.as_deref().unwrap().contains("all 3 attempts used"));
}

#[test]
fn timed_out_step_with_a_compensation_is_compensated_too() {
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task; // charge running
    let mut now = 1_100;
    for _ in 0..2 {
        now += 2_000;
        t = claim(&time_out(&t, now).task, now + 10).task;
    }
    let r = time_out(&t, now + 5_000);
    let plan: Vec<_> = match &r.task.stage {
        Stage::Compensating { plan, .. } => plan.clone(),
        Stage::Forward => panic!("not compensating"),
    };
    assert_eq!(plan, vec![1, 0], "the timed-out charge may have happened: refund, then release");
}

#[test]
fn permanent_failure_on_step_two_compensates_step_one() {
    let mut t = new_task(true).task;
    t = succeed(&t, 1_100).task;
    let r = go(&t, Event::AgentFailed { attempt: token(&t), error: "card declined".into(), retryable: false }, 1_200);
    assert_eq!(r.task.steps[1].status, StepStatus::Failed);
    assert_eq!(r.task.failure_count, 1);
    assert_eq!(dispatched(&r.effects)[0].step, "release");
    assert!(alerts(&r.effects).is_empty(), "a permanent business failure is not an operator alert");
    let done = succeed(&r.task, 1_300).task;
    assert_eq!(done.process_state, ProcessState::Compensated);
    assert!(done.reason.unwrap().contains("card declined"));
}

#[test]
fn permanent_failure_on_first_step_has_nothing_to_undo() {
    let t = new_task(false).task;
    let r = go(&t, Event::AgentFailed { attempt: token(&t), error: "no stock".into(), retryable: false }, 1_100);
    assert_eq!(r.task.process_state, ProcessState::Compensated);
    assert!(dispatched(&r.effects).is_empty());
}

#[test]
fn retryable_failure_counts_and_retries() {
    let t = new_task(false).task;
    let r = go(&t, Event::AgentFailed { attempt: token(&t), error: "503".into(), retryable: true }, 1_100);
    assert_eq!(r.task.process_state, ProcessState::Pending);
    assert_eq!(r.task.failure_count, 1);
    assert_eq!(r.task.steps[0].status, StepStatus::Pending);
}

#[test]
fn failing_compensation_ends_in_error_with_an_alert() {
    let mut t = new_task(true).task;
    t = succeed(&t, 1_100).task;
    t = go(&t, Event::AgentFailed { attempt: token(&t), error: "declined".into(), retryable: false }, 1_200).task;
    assert_eq!(t.process_state, ProcessState::Compensating);
    // release: 2 attempts, both time out
    let r = time_out(&t, 5_000);
    assert_eq!(r.task.process_state, ProcessState::Compensating);
    assert_eq!(r.task.lock.locked_by, None);
    let t = claim(&r.task, 5_100).task;
    let r = time_out(&t, 9_000);
    assert_eq!(r.task.process_state, ProcessState::Error);
    assert_eq!(alerts(&r.effects), vec![AlertKind::TaskError]);
    assert_eq!(replies(&r.effects), vec![ProcessState::Error]);
    assert_eq!(r.task.complete_by, None);
}

#[test]
fn cancel_mid_way_compensates_and_ends_cancelled() {
    let mut t = new_task(true).task;
    t = succeed(&t, 1_100).task; // charge running
    let r = go(&t, Event::Cancel { reason: "customer asked".into(), run: None }, 1_150);
    assert_eq!(r.task.process_state, ProcessState::Compensating);
    assert_eq!(r.task.steps[1].status, StepStatus::Cancelled);
    // the charge may still land until its CompleteBy (2_100): the refund must not race it
    assert!(dispatched(&r.effects).is_empty(), "no refund while the charge attempt may still apply");
    assert!(r.effects.contains(&Effect::Run { rev: r.task.rev, delay_ms: 950, reason: RunReason::Compensate }));
    assert_eq!(
        apply(&r.task, &Event::Claim { rev: r.task.rev }, &ctx(1_160), &policy()),
        Err(Stale::TooEarly { not_before: Millis(2_100), now: Millis(1_160) })
    );
    assert_eq!(
        apply(&r.task, &Event::Cancel { reason: "again".into(), run: None }, &ctx(1_170), &policy()),
        Err(Stale::AlreadyCompensating)
    );
    // the charge attempt answers with a success: it can no longer apply, the refund may start,
    // and it gets the charge's output (the charge id a real refund needs)
    let late = Event::AgentSucceeded { attempt: token(&t), output: json!({"charge_id": "ch_1"}) };
    let released = go(&r.task, late.clone(), 1_180);
    assert_eq!(released.task.process_state, ProcessState::Compensating);
    assert!(released.effects.iter().any(|e| matches!(e, Effect::Run { delay_ms: 0, .. })));
    assert_eq!(released.task.steps[1].status, StepStatus::Succeeded, "the charge is known to have applied");
    assert_eq!(apply(&released.task, &late, &ctx(1_185), &policy()), Err(Stale::NotCurrentAttempt), "once");
    let r = claim(&released.task, 1_190);
    let refund = dispatched(&r.effects)[0].clone();
    assert_eq!(refund.step, "refund");
    assert_eq!(refund.input["outputs"]["charge"], json!({"charge_id": "ch_1"}));
    let r = succeed(&r.task, 1_200);
    let r = succeed(&r.task, 1_300);
    assert_eq!(r.task.process_state, ProcessState::Cancelled);
}

#[test]
fn a_task_undone_ends_for_the_reason_it_was_undone_not_for_its_compensations_notes() {
    // a declined charge is undone; the release's first request waits past its start and its
    // second attempt fails retryably: each says so in the task's reason while it compensates,
    // and the task ends Compensated for the decline (what its caller and its parent are told)
    let mut t = new_task(true).task;
    t = succeed(&t, 1_100).task;
    t = go(&t, Event::AgentFailed { attempt: token(&t), error: "card declined".into(), retryable: false }, 1_200).task;
    let r = go(&t, Event::AgentNotStarted { attempt: token(&t), error: "not started: waited".into() }, 1_300);
    assert!(r.task.reason.as_deref().unwrap_or_default().contains("claimed again"), "{:?}", r.task.reason);
    let r = go(&r.task, Event::AgentFailed { attempt: token(&r.task), error: "503".into(), retryable: true }, 1_400);
    assert!(r.task.reason.as_deref().unwrap_or_default().contains("503"), "{:?}", r.task.reason);
    let r = succeed(&claim(&r.task, 5_000).task, 5_100);
    assert_eq!(r.task.process_state, ProcessState::Compensated);
    let reason = r.task.reason.clone().unwrap_or_default();
    assert!(reason.contains("card declined") && !reason.contains("503"), "{reason}");
    assert_eq!(r.task.history.last().and_then(|h| h.reason.clone()), Some(reason), "its last status says it too");
    // the same for a cancel: the task ends Cancelled with the cancel's reason
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task;
    t = succeed(&t, 1_200).task; // reserve and charge done, ship running
    let r = go(&t, Event::Cancel { reason: "replaced by task o-2".into(), run: None }, 1_250);
    assert_eq!(dispatched(&r.effects)[0].step, "refund", "ship has nothing to undo: the refund starts");
    let r = go(&r.task, Event::AgentNotStarted { attempt: token(&r.task), error: "not started: waited".into() }, 1_280);
    assert!(r.task.reason.as_deref().unwrap_or_default().contains("claimed again"), "{:?}", r.task.reason);
    let mut t = r.task;
    while !t.process_state.is_terminal() {
        let now = t.updated_at.0 + 10;
        t = succeed(&t, now).task;
    }
    assert_eq!(t.process_state, ProcessState::Cancelled);
    assert_eq!(t.reason.as_deref(), Some("cancelled: replaced by task o-2"));
}

#[test]
fn only_a_definite_answer_of_the_awaited_attempt_releases_its_compensation() {
    // a 504 from a gateway while the backend works on, or a 503 to a second copy of the attempt
    // while the first applies, is retryable: it proves nothing, so the refund must not race the
    // charge that may still land before its CompleteBy (2_100).
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task; // charge running until 2_100
    let r = go(&t, Event::Cancel { reason: "x".into(), run: None }, 1_150);
    let gateway = Event::AgentFailed { attempt: token(&t), error: "504".into(), retryable: true };
    assert_eq!(apply(&r.task, &gateway, &ctx(1_180), &policy()), Err(Stale::NotCurrentAttempt));
    assert!(matches!(
        apply(&r.task, &Event::Claim { rev: r.task.rev }, &ctx(1_190), &policy()),
        Err(Stale::TooEarly { .. })
    ));
    // a definite "no" does release it: nothing of that attempt can land
    let no = Event::AgentFailed { attempt: token(&t), error: "declined".into(), retryable: false };
    let released = go(&r.task, no, 1_200);
    assert_eq!(dispatched(&claim(&released.task, 1_210).effects)[0].step, "refund");
}

#[test]
fn a_retryable_failure_of_one_copy_keeps_the_success_of_the_other() {
    // two copies of one attempt (an SQS duplicate): one fails retryably (a 503), the other
    // applies and answers success afterwards. The success is the step's.
    let t = new_task(false).task;
    let busy = go(&t, Event::AgentFailed { attempt: token(&t), error: "503".into(), retryable: true }, 1_100).task;
    assert_eq!(busy.process_state, ProcessState::Pending, "the retry waits for its backoff");
    let ok = go(&busy, Event::AgentSucceeded { attempt: token(&t), output: json!({"r": 1}) }, 1_150);
    assert_eq!(ok.task.steps[0].status, StepStatus::Succeeded);
    assert_eq!(ok.task.current_step_name(), Some("charge"));
    assert_eq!(dispatched(&ok.effects)[0].step, "charge");
}

#[test]
fn an_attempt_its_agent_says_timed_out_is_retried_now_and_counts_as_a_timeout() {
    // the agent says so at start + timeout, so the retry does not wait for the Supervisor to
    // find it at CompleteBy
    let mut t = new_task(false).task;
    for (i, now) in [1_100, 1_300, 1_700].into_iter().enumerate() {
        let out = Event::AgentTimedOut { attempt: token(&t), error: "timed out: no answer within 1000 ms".into() };
        let r = go(&t, out, now);
        assert_eq!(r.task.failure_count, u32::try_from(i).unwrap() + 1);
        assert!(r.task.steps[0].maybe_applied, "its call may land until its deadline");
        if i < 2 {
            assert!(r.task.lock.outstanding.contains(&token(&t)), "a late success of it is still taken");
            assert_eq!(r.task.process_state, ProcessState::Pending, "retried after its backoff, not at CompleteBy");
            t = claim(&r.task, now + 150).task;
        } else {
            assert_eq!(r.task.steps[0].status, StepStatus::TimedOut);
            assert_eq!(alerts(&r.effects), vec![AlertKind::RetriesExhausted]);
        }
    }
}

#[test]
fn an_attempt_not_started_in_time_is_claimed_again_at_once_without_a_failure() {
    // overload is a delay: however often its request waits past start_by, the step is claimed
    // again with a fresh attempt; its attempts are not used up
    let mut t = new_task(false).task;
    for n in 0..12u32 {
        let first = token(&t);
        let r = go(
            &t,
            Event::AgentNotStarted { attempt: first.clone(), error: "not started: waited".into() },
            2_000 + u64::from(n),
        );
        assert_eq!((r.task.failure_count, r.task.steps[0].failures), (0, 0));
        assert_eq!(r.task.process_state, ProcessState::Processing, "claimed in the same write");
        assert_ne!(r.task.lock.locked_by.as_ref(), Some(&first), "a new attempt");
        assert_eq!(dispatched(&r.effects).len(), 1);
        assert!(r.task.lock.outstanding.contains(&first), "another copy may run: its success is taken");
        assert!(r.task.lock.outstanding.len() <= MAX_ISSUED, "the outstanding list stays bounded");
        assert!(r.task.steps[0].maybe_applied, "another copy may have applied: compensated if it fails");
        assert!(r.task.reason.as_deref().unwrap_or_default().contains("claimed again"), "{:?}", r.task.reason);
        t = r.task;
    }
    assert_eq!(t.steps[0].attempts, 13);
    // a stale "not started" (an older attempt) changes nothing
    let old = t.lock.outstanding[0].clone();
    let e = Event::AgentNotStarted { attempt: old.clone(), error: "x".into() };
    assert_eq!(apply(&t, &e, &ctx(3_000), &policy()), Err(Stale::NotCurrentAttempt));
    // a success of an earlier copy still counts
    let r = go(&t, Event::AgentSucceeded { attempt: old, output: json!({"ok": 1}) }, 3_100);
    assert_eq!(r.task.steps[0].status, StepStatus::Succeeded);
}

#[test]
fn a_not_started_copy_does_not_release_a_compensation_waiting_for_its_attempt() {
    // cancelled while running: the compensation waits for the attempt; a copy that did not start
    // proves nothing about another copy
    let t = new_task(false).task;
    let running = token(&t);
    let c = go(&t, Event::Cancel { reason: "c".into(), run: None }, 1_100).task;
    assert_eq!(c.lock.awaits.as_ref(), Some(&running));
    let e = Event::AgentNotStarted { attempt: running, error: "x".into() };
    assert_eq!(apply(&c, &e, &ctx(1_200), &policy()), Err(Stale::NotCurrentAttempt));
}

#[test]
fn commands_are_fenced_by_run_and_an_error_task_takes_only_fenced_ones() {
    // a cancel is a new run; a duplicate or late cancel names the old run and changes nothing,
    // so it never resumes a compensation that failed again.
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task;
    let cancel = Event::Cancel { reason: "c".into(), run: Some(t.run) };
    let c = go(&t, cancel.clone(), 1_150).task;
    assert_eq!(c.run, t.run + 1);
    // the charge answers no; release is refused for good: Error, in an operator's hands
    let c = go(&c, Event::AgentFailed { attempt: token(&t), error: "no".into(), retryable: false }, 1_200).task;
    let c = claim(&c, 1_210).task;
    let e = go(&c, Event::AgentFailed { attempt: token(&c), error: "refused".into(), retryable: false }, 1_300).task;
    assert_eq!(e.process_state, ProcessState::Error);
    assert_eq!(apply(&e, &cancel, &ctx(1_400), &policy()), Err(Stale::OtherRun { message: t.run, current: e.run }));
    let unfenced = Event::Cancel { reason: "app".into(), run: None };
    assert_eq!(apply(&e, &unfenced, &ctx(1_400), &policy()), Err(Stale::Unfenced { current: e.run }));
    let resubmit = Event::Resubmit { reason: "r".into(), run: None };
    assert_eq!(apply(&e, &resubmit, &ctx(1_400), &policy()), Err(Stale::Unfenced { current: e.run }));
    let again = go(&e, Event::Cancel { reason: "op".into(), run: Some(e.run) }, 1_500).task;
    assert_eq!(again.process_state, ProcessState::Compensating);
    assert_eq!(
        apply(&again, &Event::Cancel { reason: "op".into(), run: Some(e.run) }, &ctx(1_600), &policy()),
        Err(Stale::OtherRun { message: e.run, current: again.run }),
        "its duplicate"
    );
}

#[test]
fn what_a_last_write_owes_is_derived_from_the_task() {
    // a message whose sends failed after its write comes back and sends them again: what it
    // owes is derived from the task, not remembered.
    let t = new_task(true).task;
    let p = policy();
    // waiting for a retry: the run message, due at the end of the backoff
    let r = go(&t, Event::AgentFailed { attempt: token(&t), error: "503".into(), retryable: true }, 1_100);
    let owed = owed_sends(&r.task, Millis(1_120), &p);
    let sent: Vec<_> = r.effects.iter().filter(|e| matches!(e, Effect::Run { .. })).cloned().collect();
    match (&owed[..], &sent[..]) {
        ([Effect::Run { rev, .. }], [Effect::Run { rev: sent_rev, .. }]) => assert_eq!(rev, sent_rev),
        other => panic!("{other:?}"),
    }
    // a claimed attempt: its request and timer, the same as the claim sent
    let c = claim(&r.task, 1_400);
    let work: Vec<_> = c.effects.iter().filter(|e| !e.is_notification()).cloned().collect();
    assert_eq!(owed_sends(&c.task, Millis(1_450), &p), work);
    // an ended task: its terminal status (and an alert for Error), nothing else
    let mut d = c.task;
    for now in [1_500, 1_600, 1_700] {
        d = succeed(&d, now).task;
    }
    assert_eq!(d.process_state, ProcessState::Processed);
    assert_eq!(replies(&owed_sends(&d, Millis(1_800), &p)), vec![ProcessState::Processed]);
}

#[test]
fn a_compensation_waits_out_a_forward_attempt_that_never_answers() {
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task; // charge running until 2_100
    let r = go(&t, Event::Cancel { reason: "x".into(), run: None }, 1_150);
    let at = |now| apply(&r.task, &Event::Claim { rev: r.task.rev }, &ctx(now), &policy());
    assert!(matches!(at(2_099), Err(Stale::TooEarly { .. })));
    assert_eq!(dispatched(&at(2_100).unwrap().effects)[0].step, "refund");
}

#[test]
fn may_have_applied_is_remembered_across_every_attempt_of_a_step() {
    // cancel during backoff: attempt 1 timed out (it may have charged), attempt 2 waits
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task; // charge attempt 1 until 2_100
    t = time_out(&t, 2_100).task;
    assert_eq!(t.process_state, ProcessState::Pending);
    let plan = |t: &Task| match &t.stage {
        Stage::Compensating { plan, .. } => plan.clone(),
        Stage::Forward => vec![],
    };
    let c = go(&t, Event::Cancel { reason: "x".into(), run: None }, 2_150);
    assert_eq!(plan(&c.task), vec![1, 0], "the timed-out charge is refunded");
    // retries that end on a retryable error, after a timeout
    let t2 = claim(&t, 2_300).task;
    let r = go(&t2, Event::AgentFailed { attempt: token(&t2), error: "503".into(), retryable: true }, 2_400);
    let t3 = claim(&r.task, 2_600).task;
    let gave_up =
        go(&t3, Event::AgentFailed { attempt: token(&t3), error: "declined".into(), retryable: false }, 2_700);
    assert_eq!(plan(&gave_up.task), vec![1, 0], "a refusal at the end does not undo the uncertainty of attempt 1");
    // cancel of a parked Error task whose step timed out earlier
    let mut p = parked();
    p = time_out(&p, 3_000).task;
    p = claim(&p, 3_200).task;
    let e = go(&p, Event::AgentFailed { attempt: token(&p), error: "down".into(), retryable: false }, 3_300).task;
    assert_eq!(e.process_state, ProcessState::Error);
    assert_eq!(plan(&go(&e, Event::Cancel { reason: "give up".into(), run: Some(e.run) }, 3_400).task), vec![1, 0]);
}

#[test]
fn an_error_left_by_a_failed_compensation_can_be_resubmitted_or_cancelled_with_fresh_keys() {
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task;
    t = go(&t, Event::AgentFailed { attempt: token(&t), error: "declined".into(), retryable: false }, 1_200).task;
    t = go(&t, Event::AgentFailed { attempt: token(&t), error: "release refused".into(), retryable: false }, 1_300)
        .task;
    assert_eq!(t.process_state, ProcessState::Error);
    for e in [
        Event::Resubmit { reason: "r".into(), run: Some(t.run) },
        Event::Cancel { reason: "c".into(), run: Some(t.run) },
    ] {
        let r = go(&t, e.clone(), 2_000);
        assert_eq!(r.task.process_state, ProcessState::Compensating, "{}", e.name());
        let d = claim(&r.task, 2_100);
        assert_eq!(dispatched(&d.effects)[0].idempotency_key.as_str(), "t1:release#1", "{}", e.name());
        let end = succeed(&d.task, 2_200).task.process_state;
        let want = if e.name() == "cancel" { ProcessState::Cancelled } else { ProcessState::Compensated };
        assert_eq!(end, want);
    }
}

#[test]
fn a_cancel_right_after_submission_waits_for_the_first_attempt() {
    let t = new_task(false).task;
    let r = go(&t, Event::Cancel { reason: "x".into(), run: None }, 1_020);
    assert_eq!(r.task.process_state, ProcessState::Compensating);
    assert_eq!(r.task.lock.awaits, t.lock.locked_by, "the first attempt may be running: its compensation waits for it");
    assert!(dispatched(&r.effects).is_empty());
    let answered = go(&r.task, Event::AgentSucceeded { attempt: token(&t), output: json!(1) }, 1_100);
    let undo = claim(&answered.task, 1_110);
    assert_eq!(dispatched(&undo.effects)[0].step, "release");
    assert_eq!(succeed(&undo.task, 1_200).task.process_state, ProcessState::Cancelled);
}

#[test]
fn lost_run_message_is_reissued_without_counting_a_failure() {
    let t = waiting_task();
    let r = time_out(&t, 1_600);
    assert_eq!(r.task.process_state, ProcessState::Pending);
    assert_eq!(r.task.failure_count, t.failure_count);
    assert_eq!(r.task.complete_by, Some(Millis(2_100)));
    // the restart re-sends the same wait's run message, so whichever copy arrives first claims,
    // however late the original is (a restart does not invalidate it)
    let rev = t.claim.rev;
    assert_eq!(r.effects, vec![Effect::Run { rev, delay_ms: 0, reason: RunReason::Restart }]);
    let claimed = claim(&r.task, 1_700).task;
    assert_eq!(claimed.process_state, ProcessState::Processing);
    assert_eq!(apply(&claimed, &Event::Claim { rev }, &ctx(1_710), &policy()), Err(Stale::AlreadyClaimed));
}

#[test]
fn restarts_back_off_and_a_task_never_claimed_ends_in_error() {
    let p = Policy { max_restarts: 3, ..policy() };
    let mut t = waiting_task();
    let mut waits = Vec::new();
    for _ in 0..3 {
        let now = t.complete_by.unwrap().0;
        let r = apply(&t, &Event::DeadlineExpired, &ctx(now), &p).unwrap();
        waits.push(r.task.complete_by.unwrap().0 - now);
        t = r.task;
    }
    assert_eq!(waits, vec![500, 1_000, 2_000], "each restart in a row waits twice as long");
    let now = t.complete_by.unwrap().0;
    let r = apply(&t, &Event::DeadlineExpired, &ctx(now), &p).unwrap();
    assert_eq!(r.task.process_state, ProcessState::Error, "a claim that never happens escalates");
    assert_eq!(alerts(&r.effects), vec![AlertKind::TaskError]);
    assert!(r.task.reason.unwrap().contains("not claimed after 3 restarts"));
}

#[test]
fn terminal_states_are_never_left() {
    let mut t = new_task(false).task;
    for _ in 0..3 {
        t = succeed(&t, 1_100).task;
    }
    assert_eq!(t.process_state, ProcessState::Processed);
    for e in [
        Event::Claim { rev: t.rev },
        Event::DeadlineExpired,
        Event::Cancel { reason: "x".into(), run: None },
        Event::AgentSucceeded { attempt: AttemptToken::from("x"), output: json!(1) },
    ] {
        assert_eq!(apply(&t, &e, &ctx(99_999), &policy()), Err(Stale::Terminal(ProcessState::Processed)));
    }
}

#[test]
fn history_is_bounded() {
    let p = Policy { history_limit: 3, ..policy() };
    let mut t = new_task(false).task;
    for _ in 0..3 {
        t = apply(&t, &Event::AgentSucceeded { attempt: token(&t), output: json!(1) }, &ctx(1_100), &p).unwrap().task;
    }
    assert_eq!(t.history.len(), 3);
    assert_eq!(t.history.last().unwrap().state, ProcessState::Processed);
}

fn parked() -> Task {
    let mut tr = new_task(true);
    tr.task.workflow.on_failure = OnFailure::Error;
    let mut t = tr.task;
    t = succeed(&t, 1_100).task; // charge running
    t
}

#[test]
fn a_parking_workflow_ends_in_error_without_compensating() {
    let t = parked();
    let r = go(&t, Event::AgentFailed { attempt: token(&t), error: "gateway down".into(), retryable: false }, 1_200);
    assert_eq!(r.task.process_state, ProcessState::Error);
    assert_eq!(alerts(&r.effects), vec![AlertKind::TaskError]);
    assert!(dispatched(&r.effects).is_empty(), "nothing is compensated");
    assert_eq!(r.task.complete_by, None);
    assert_eq!(r.task.steps[0].status, StepStatus::Succeeded);
}

#[test]
fn resubmit_resumes_an_error_task_from_its_failed_step() {
    let t = parked();
    let e =
        go(&t, Event::AgentFailed { attempt: token(&t), error: "gateway down".into(), retryable: false }, 1_200).task;
    let r = go(&e, Event::Resubmit { reason: "gateway fixed".into(), run: Some(1) }, 5_000);
    assert_eq!(r.task.process_state, ProcessState::Pending);
    assert_eq!(r.task.run, 2);
    assert_eq!(r.task.complete_by, Some(Millis(5_500)));
    assert_eq!(r.task.failure_count, 1, "FailureCount never decreases");
    assert!(r.effects.contains(&Effect::Run { rev: r.task.rev, delay_ms: 0, reason: RunReason::Retry }));
    let c = claim(&r.task, 5_100);
    let d = dispatched(&c.effects);
    assert_eq!(
        (d[0].step.as_str(), d[0].attempt_no),
        ("charge", 2),
        "resumes at the failed step, reserve is not redone"
    );
    // the refused attempt spent its key at the service (which may keep the refusal); the resumed
    // step asks with a new one
    assert_eq!(d[0].idempotency_key.as_str(), "t1:charge#1");
    let done = succeed(&succeed(&c.task, 5_200).task, 5_300).task;
    assert_eq!(done.process_state, ProcessState::Processed);
    assert_eq!(done.steps[0].attempts, 1);
}

#[test]
fn resubmit_finishes_a_failed_compensation() {
    let mut t = new_task(false).task;
    t = succeed(&t, 1_100).task;
    t = go(&t, Event::AgentFailed { attempt: token(&t), error: "declined".into(), retryable: false }, 1_200).task;
    t = go(&t, Event::AgentFailed { attempt: token(&t), error: "release refused".into(), retryable: false }, 1_300)
        .task;
    assert_eq!(t.process_state, ProcessState::Error);
    let r = go(&t, Event::Resubmit { reason: "fixed".into(), run: Some(t.run) }, 2_000);
    assert_eq!(r.task.process_state, ProcessState::Compensating);
    let c = claim(&r.task, 2_100);
    assert_eq!(dispatched(&c.effects)[0].step, "release");
    assert_eq!(succeed(&c.task, 2_200).task.process_state, ProcessState::Compensated);
}

#[test]
fn only_error_tasks_are_resubmitted_and_cancel_undoes_a_parked_task() {
    let t = new_task(false).task;
    assert_eq!(
        apply(&t, &Event::Resubmit { reason: "x".into(), run: None }, &ctx(1_020), &policy()),
        Err(Stale::NotResubmittable(ProcessState::Processing))
    );
    let t = parked();
    let e = go(&t, Event::AgentFailed { attempt: token(&t), error: "down".into(), retryable: false }, 1_200).task;
    let r = go(&e, Event::Cancel { reason: "give up".into(), run: Some(e.run) }, 1_300);
    assert_eq!(r.task.process_state, ProcessState::Compensating);
    assert_eq!(dispatched(&r.effects)[0].step, "release", "the definite failure of charge leaves only reserve to undo");
    assert_eq!(succeed(&r.task, 1_400).task.process_state, ProcessState::Cancelled);
}

#[test]
fn process_state_parses_case_insensitively() {
    assert_eq!("error".parse::<ProcessState>(), Ok(ProcessState::Error));
    assert!("nope".parse::<ProcessState>().is_err());
    for s in ProcessState::ALL {
        assert_eq!(s.as_str().parse::<ProcessState>(), Ok(s));
    }
}

// ---- property tests -------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Move {
    ClaimCurrent,
    ClaimOld,
    SucceedCurrent,
    SucceedStale,
    FailRetryable,
    FailPermanent,
    Expire,
    ExpireEarly,
    Cancel,
    Resubmit,
    NotStarted,
}

fn a_move() -> impl Strategy<Value = Move> {
    prop_oneof![
        3 => Just(Move::ClaimCurrent),
        1 => Just(Move::ClaimOld),
        4 => Just(Move::SucceedCurrent),
        1 => Just(Move::SucceedStale),
        2 => Just(Move::FailRetryable),
        1 => Just(Move::FailPermanent),
        2 => Just(Move::Expire),
        1 => Just(Move::ExpireEarly),
        1 => Just(Move::Cancel),
        1 => Just(Move::Resubmit),
        1 => Just(Move::NotStarted),
    ]
}

fn a_workflow() -> impl Strategy<Value = WorkflowDef> {
    (prop::collection::vec((any::<bool>(), 1u32..4), 1..5), any::<bool>()).prop_map(|(specs, park)| WorkflowDef {
        concurrency: None,
        result: None,
        name: "w".into(),
        version: 1,
        description: String::new(),
        on_failure: if park { OnFailure::Error } else { OnFailure::Compensate },
        steps: specs
            .into_iter()
            .enumerate()
            .map(|(i, (comp, max))| {
                let undo = format!("undo{i}");
                step(&format!("s{i}"), comp.then_some(undo.as_str()), max)
            })
            .collect(),
    })
}

fn event_for(t: &Task, m: &Move, stale_token: &AttemptToken) -> (Event, u64) {
    let now = t.updated_at.0 + 10;
    let cur = t.lock.locked_by.clone().unwrap_or_else(|| stale_token.clone());
    match m {
        Move::ClaimCurrent => (Event::Claim { rev: t.claim.rev }, now),
        Move::ClaimOld => (Event::Claim { rev: t.claim.rev.saturating_sub(1) }, now),
        Move::SucceedCurrent => (Event::AgentSucceeded { attempt: cur, output: json!(1) }, now),
        Move::SucceedStale => (Event::AgentSucceeded { attempt: stale_token.clone(), output: json!(1) }, now),
        Move::FailRetryable => (Event::AgentFailed { attempt: cur, error: "e".into(), retryable: true }, now),
        Move::FailPermanent => (Event::AgentFailed { attempt: cur, error: "e".into(), retryable: false }, now),
        Move::Expire => (Event::DeadlineExpired, t.complete_by.map_or(now, |c| c.0.max(now))),
        Move::ExpireEarly => (Event::DeadlineExpired, t.complete_by.map_or(now, |c| c.0.saturating_sub(1))),
        Move::Cancel => (Event::Cancel { reason: "r".into(), run: Some(t.run) }, now),
        Move::Resubmit => (Event::Resubmit { reason: "r".into(), run: Some(t.run) }, now),
        Move::NotStarted => (Event::AgentNotStarted { attempt: cur, error: "e".into() }, now),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold_for_any_event_sequence(wf in a_workflow(), moves in prop::collection::vec(a_move(), 1..60)) {
        let p = policy();
        let mut t = submit(TaskId::try_from("p").unwrap(), wf, json!({}), None, &ctx(1_000), &p).task;
        let stale = AttemptToken::from("never-issued");
        for m in &moves {
            let (event, now) = event_for(&t, m, &stale);
            let c = Ctx { paused: false, now: Millis(now.max(t.updated_at.0)), fresh_token: AttemptToken::fresh(), jitter: 0.3 };
            let before = t.clone();
            match apply(&t, &event, &c, &p) {
                Err(_) => {
                    // a stale event changes nothing (the caller keeps the old task)
                    if before.process_state.is_terminal() && before.process_state != ProcessState::Error {
                        prop_assert!(matches!(
                            apply(&before, &event, &c, &p),
                            Err(Stale::Terminal(_) | Stale::NotResubmittable(_))
                        ));
                    }
                }
                Ok(tr) => {
                    let operator = matches!(event, Event::Cancel { .. } | Event::Resubmit { .. });
                    prop_assert!(
                        !before.process_state.is_terminal() || (before.process_state == ProcessState::Error && operator),
                        "{} left terminal state {}", event.name(), before.process_state
                    );
                    prop_assert_eq!(tr.task.rev, before.rev + 1);
                    prop_assert!(tr.task.failure_count >= before.failure_count, "FailureCount decreased");
                    t = tr.task;
                }
            }
            // stale tokens never apply
            let e = Event::AgentSucceeded { attempt: stale.clone(), output: json!(0) };
            prop_assert!(apply(&t, &e, &c, &p).is_err());
            // every non-terminal state has a CompleteBy; terminal ones hold no lock and no deadline
            if t.process_state.is_terminal() {
                prop_assert!(t.complete_by.is_none() && t.lock.locked_by.is_none());
            } else {
                prop_assert!(t.complete_by.is_some(), "{} without CompleteBy", t.process_state);
            }
            if t.process_state == ProcessState::Processing {
                prop_assert!(t.lock.locked_by.is_some());
            }
            if t.process_state == ProcessState::Pending {
                prop_assert!(t.lock.locked_by.is_none());
            }
            let seqs: Vec<u64> = t.history.iter().map(|h| h.seq).collect();
            prop_assert!(seqs.windows(2).all(|w| w[0] < w[1]), "history out of order: {:?}", seqs);
        }
    }
}

#[test]
fn status_seq_has_no_gap_when_a_transition_changes_no_state() {
    // seq counts statuses, not revisions: a restart bumps the revision without a status
    let c = new_task(true).task;
    let t = go(&c, Event::AgentFailed { attempt: token(&c), error: "503".into(), retryable: true }, 1_020).task;
    let restarted = time_out(&t, 1_600).task; // a restart: no state change, no status
    let c = claim(&restarted, 1_700);
    let seqs: Vec<u64> = c.task.history.iter().map(|h| h.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert!(c.effects.iter().any(|e| matches!(e, Effect::Reply(s) if s.seq == 3)));
}

fn statuses(fx: &[Effect]) -> Vec<&StatusMessage> {
    fx.iter().filter_map(|e| if let Effect::Reply(s) = e { Some(s) } else { None }).collect()
}

#[test]
fn the_processed_status_carries_every_steps_output_and_only_it_does() {
    let c = new_task(true);
    let s1 = succeed(&c.task, 1_100);
    let s2 = succeed(&s1.task, 1_200);
    for s in statuses(&c.effects).into_iter().chain(statuses(&s1.effects)).chain(statuses(&s2.effects)) {
        assert_eq!((s.outputs.as_ref(), s.outputs_omitted.as_ref()), (None, None), "{:?} carries no outputs", s.state);
    }
    let s3 = succeed(&s2.task, 1_300);
    let done = statuses(&s3.effects);
    assert_eq!(done.len(), 1);
    let want = json!({"reserve": {"ok": c.task.rev}, "charge": {"ok": s1.task.rev}, "ship": {"ok": s2.task.rev}});
    assert_eq!(done[0].outputs.as_ref(), Some(&want));
    assert!(!done[0].duplicate);
    // the status sent again when the ending message comes back is the same, outputs included
    let again = terminal_notices(&s3.task);
    assert_eq!(statuses(&again), done);
    // and a consumer of the contract reads it back
    let wire = serde_json::to_string(done[0]).unwrap();
    assert_eq!(&serde_json::from_str::<StatusMessage>(&wire).unwrap(), done[0]);
}

#[test]
fn outputs_too_large_for_a_status_say_where_to_read_them() {
    let c = new_task(true);
    let big = json!({"blob": "x".repeat(crate::messages::MAX_STATUS_OUTPUTS_BYTES)});
    let s1 = go(&c.task, Event::AgentSucceeded { attempt: token(&c.task), output: big }, 1_100);
    let s3 = succeed(&succeed(&s1.task, 1_200).task, 1_300);
    let done = statuses(&s3.effects);
    assert_eq!(done[0].state, ProcessState::Processed);
    assert_eq!(done[0].outputs, None);
    let omitted = done[0].outputs_omitted.as_ref().expect("says why the outputs are absent");
    assert!(omitted.bytes > omitted.limit, "{omitted:?}");
    assert!(omitted.read.contains("sasctl status t1"), "{}", omitted.read);
    assert!(serde_json::to_vec(done[0]).unwrap().len() < 256 * 1024, "fits in one SQS message");
}

/// Once a task stops waiting for a call step's attempt (a cancel, or its last attempt given up),
/// its compensation starts one execution time (`timeout_ms`) plus the settling margin later, not
/// at the attempt's hard deadline (`start_by + timeout_ms`, the whole queue budget away): agents
/// start a call only while its attempt is current, so a call started before the decision is cut
/// within `timeout_ms`, and none starts after it. A callback step's remote side holds its token
/// until the hard deadline: its bound stays.
#[test]
fn a_call_step_settles_one_execution_time_after_the_task_stops_waiting_for_it() {
    let p = Policy { queue_budget_ms: 300_000, settle_ms: 2_000, ..policy() };
    let at = |now: u64| Ctx { paused: false, now: Millis(now), fresh_token: AttemptToken::fresh(), jitter: 0.5 };
    let go = |t: &Task, e: Event, now: u64| apply(t, &e, &at(now), &p).unwrap();
    // cancelled while its first attempt runs (claimed at 1_000: hard deadline 302_000)
    let t = submit(TaskId::try_from("t1").unwrap(), order(), json!({}), None, &at(1_000), &p).task;
    assert_eq!(t.steps[0].settles_at, Some(Millis(302_000)));
    let cancelled = go(&t, Event::Cancel { reason: "customer".into(), run: None }, 1_500);
    assert_eq!(cancelled.task.claim.not_before, Some(Millis(1_500 + 1_000 + 2_000)), "cancel + timeout + settle");
    assert!(matches!(cancelled.effects.as_slice(), [Effect::Run { delay_ms: 3_000, .. }]), "{:?}", cancelled.effects);
    let early = Event::Claim { rev: cancelled.task.claim.rev };
    assert!(matches!(apply(&cancelled.task, &early, &at(4_499), &p), Err(Stale::TooEarly { .. })));
    let undo = go(&cancelled.task, early, 4_500);
    assert_eq!(dispatched(&undo.effects)[0].step, "release");

    // every attempt of the charge times out (said by its agent): the last one given up at 20_000
    let mut t = go(&t, Event::AgentSucceeded { attempt: token(&t), output: json!({}) }, 2_000).task;
    for i in 0..3 {
        let now = 5_000 + 5_000 * i;
        if t.lock.locked_by.is_none() {
            t = go(&t, Event::Claim { rev: t.claim.rev }, now - 1_000).task;
        }
        t = go(&t, Event::AgentTimedOut { attempt: token(&t), error: "timed out".into() }, now).task;
    }
    assert_eq!(t.process_state, ProcessState::Compensating);
    assert_eq!(t.claim.not_before, Some(Millis(15_000 + 1_000 + 2_000)), "the last report + timeout + settle");

    // a callback step: its worker may act until the hard deadline
    let mut wf = order();
    let agent = wf.steps[0].agent().unwrap().to_owned();
    wf.steps[0] =
        StepDef { kind: StepKind::Callback { agent, heartbeat_ms: None }, timeout_ms: 60_000, ..wf.steps[0].clone() };
    let t = submit(TaskId::try_from("t2").unwrap(), wf, json!({}), None, &at(1_000), &p).task;
    let cancelled = go(&t, Event::Cancel { reason: "customer".into(), run: None }, 1_500);
    assert_eq!(cancelled.task.claim.not_before, Some(Millis(1_000 + 300_000 + 60_000 + 2_000)), "hard + settle");
}

/// A request may start without its agent reading the task within `unchecked_start_ms` of its
/// claim (`unchecked_until`): a cancel allows for such a call, so its compensation waits one
/// window more. A copy dispatched again (the claim's sends owed once more) carries no window: its
/// agent reads first.
#[test]
fn a_call_step_settles_one_unchecked_window_later_and_a_resent_request_is_read() {
    let p = Policy { queue_budget_ms: 300_000, settle_ms: 2_000, unchecked_start_ms: 2_000, ..policy() };
    let at = |now: u64| Ctx { paused: false, now: Millis(now), fresh_token: AttemptToken::fresh(), jitter: 0.5 };
    let claimed = submit(TaskId::try_from("t1").unwrap(), order(), json!({}), None, &at(1_000), &p);
    assert_eq!(dispatched(&claimed.effects)[0].unchecked_until, Some(Millis(3_000)), "claim + window");
    let cancelled = apply(&claimed.task, &Event::Cancel { reason: "customer".into(), run: None }, &at(1_500), &p);
    let not_before = cancelled.unwrap().task.claim.not_before;
    assert_eq!(not_before, Some(Millis(1_500 + 2_000 + 1_000 + 2_000)), "cancel + window + timeout + settle");
    // the same claim's sends owed again (its message came back): the request is read first
    let again = owed_sends(&claimed.task, Millis(1_200), &p);
    let resent = dispatched(&again);
    assert_eq!(resent.len(), 1, "{again:?}");
    assert_eq!((resent[0].attempt.clone(), resent[0].unchecked_until), (token(&claimed.task), None));
}

#[test]
fn a_request_that_can_never_be_sent_stands_for_a_failure_for_good_of_its_attempt() {
    let t = new_task(false);
    let Some(Effect::Dispatch(r)) = t.effects.iter().find(|e| matches!(e, Effect::Dispatch(_))).cloned() else {
        panic!("a new task dispatches its first step: {:?}", t.effects)
    };
    let SchedulerMessage::Result(res) = undeliverable_request(&r, 300_000, 262_144) else { panic!("a result") };
    assert_eq!((&res.task_id, res.step.as_str(), &res.attempt), (&r.task_id, "reserve", &r.attempt));
    assert!(
        matches!(&res.outcome, Outcome::Failed { retryable: false, error } if error.contains("300000 bytes") && error.contains("262144")),
        "{:?}",
        res.outcome
    );
}

#[test]
fn an_event_that_changes_nothing_owes_sends_only_where_the_protocol_says() {
    let t = new_task(false).task;
    // a run message before its wait may claim: sent on for the rest of the wait
    let early = Stale::TooEarly { not_before: Millis(5_000), now: Millis(2_000) };
    assert_eq!(
        stale_sends(&t, &Event::Claim { rev: 7 }, &early),
        vec![Effect::Run { rev: 7, delay_ms: 3_000, reason: RunReason::Retry }]
    );
    // a cancel for a top-level task owes nothing; nor does any other stale event
    let cancel = Event::Cancel { reason: "x".into(), run: None };
    assert!(stale_sends(&t, &cancel, &Stale::Terminal(ProcessState::Processed)).is_empty());
    assert!(stale_sends(&t, &Event::DeadlineExpired, &early).is_empty());
    // an element that runs, asked by a stopping map: cancelled; without a stop: its owed work
    let mut child = t.clone();
    child.task_id = TaskId::child(&t.task_id, 1, 0);
    match existing_element(&child, Some("the map stops")) {
        ExistingElement::Send(sends) => assert!(
            matches!(sends.as_slice(), [Effect::Send(SchedulerMessage::Cancel(c))] if c.task_id == child.task_id && c.reason == "the map stops"),
            "{sends:?}"
        ),
        other @ ExistingElement::Resend => panic!("{other:?}"),
    }
    assert_eq!(existing_element(&child, None), ExistingElement::Resend);
}

/// A paused workflow: a step in flight finishes, the next one is parked (unclaimed, no run, no
/// dispatch: `Pending`, the reason says why); its deadline is the look at the pause, never a
/// failure or a restart; once resumed, the look sends the run, which claims the step.
#[test]
fn a_paused_workflow_parks_the_next_step_and_its_deadline_resumes_it_once_unpaused() {
    let paused = |now: u64| Ctx { paused: true, ..ctx(now) };
    let t = new_task(true).task;
    // the first step's success, while paused: the second is parked
    let done =
        apply(&t, &Event::AgentSucceeded { attempt: token(&t), output: json!({}) }, &paused(2_000), &policy()).unwrap();
    let p = &done.task;
    assert_eq!(p.process_state, ProcessState::Pending);
    assert!(p.claim.paused && p.lock.locked_by.is_none());
    assert_eq!((p.step_index, p.steps[0].status), (1, StepStatus::Succeeded));
    assert!(
        p.reason.as_deref().is_some_and(|r| r.starts_with("paused: its workflow order is paused")),
        "{:?}",
        p.reason
    );
    assert!(
        dispatched(&done.effects).is_empty()
            && !done.effects.iter().any(|e| matches!(e, Effect::Run { .. } | Effect::ArmTimer(_)))
    );
    assert_eq!(replies(&done.effects), vec![ProcessState::Pending], "the caller hears it is paused");
    assert_eq!(p.complete_by, Some(Millis(2_000 + policy().pause_check_ms)));
    assert!(owed_sends(p, Millis(2_000), &policy()).is_empty(), "nothing owed: the resume sends the run");
    // its look, still paused: looks again later, no failure
    let later = 2_000 + policy().pause_check_ms;
    let again = apply(p, &Event::DeadlineExpired, &paused(later), &policy()).unwrap();
    assert!(again.task.claim.paused && again.effects.is_empty());
    assert_eq!((again.task.failure_count, again.task.claim.restarts), (0, 0));
    // a claim while paused parks it again; resumed, the look sends the run, which claims the step
    let reclaimed = apply(p, &Event::Claim { rev: p.claim.rev }, &paused(later), &policy()).unwrap();
    assert!(reclaimed.task.claim.paused && dispatched(&reclaimed.effects).is_empty());
    let t2 = &again.task;
    let resumed = go(t2, Event::DeadlineExpired, later + policy().pause_check_ms);
    assert!(!resumed.task.claim.paused && resumed.task.reason.is_none());
    assert!(matches!(resumed.effects.as_slice(), [.., Effect::Run { .. }]), "{:?}", resumed.effects);
    let running = claim(&resumed.task, later + policy().pause_check_ms + 10);
    assert_eq!(running.task.process_state, ProcessState::Processing);
    assert_eq!(dispatched(&running.effects).len(), 1);
    // a parked task is cancelled as any waiting one: its completed step is undone
    let cancelled = go(p, Event::Cancel { reason: "stop".into(), run: None }, 3_000);
    assert_eq!(cancelled.task.process_state, ProcessState::Compensating);
    assert!(!cancelled.task.claim.paused, "undoing is not paused");
}
