//! The protocol end to end on LocalStack: the real template's queues and table, the real handlers.

use sas_core::store::TaskWriter as _;
use std::time::{Duration, Instant};

use sas_core::submitter::Submitted;
use sas_core::transition::Applied;
use sas_core::{agent, scheduler, submitter, supervisor};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentResult, Outcome, SchedulerMessage, StatusMessage};
use sas_protocol::protocol::{CompensationStatus, ProcessState, Stale, StepStatus};
use serde_json::{json, Value};

use crate::common::{stack, Stack};

const SECS: Duration = Duration::from_secs(10);

fn submission(id: &str, input: Value, reply_to: Option<&str>) -> String {
    submission_to("three", id, input, reply_to)
}

fn submission_to(workflow: &str, id: &str, input: Value, reply_to: Option<&str>) -> String {
    let mut v = json!({"v": 1, "task_id": id, "workflow": workflow, "input": input});
    if let Some(r) = reply_to {
        v["reply_to"] = json!(r);
    }
    v.to_string()
}

async fn statuses(s: &Stack, q: &str, want: usize) -> Vec<StatusMessage> {
    s.bodies(q, want, SECS).await.into_iter().map(|b| serde_json::from_value(b).expect("a StatusMessage")).collect()
}

fn states(st: &[StatusMessage]) -> Vec<(ProcessState, Option<String>)> {
    st.iter().map(|m| (m.state, m.step.clone())).collect()
}

fn p(state: ProcessState, step: &str) -> (ProcessState, Option<String>) {
    (state, if step.is_empty() { None } else { Some(step.to_owned()) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn happy_path_through_three_steps_with_ordered_statuses() {
    let s = stack("happy").await;
    let reply = s.reply_queue("replies", true).await;
    let runner = s.runner();
    s.send(&s.res.submission_queue_url, &submission_to("three-slow", "h1", json!({"sku": "x"}), Some(&reply))).await;
    let t = s.wait_terminal("h1").await;
    assert_eq!(t.process_state, ProcessState::Processed);
    assert_eq!(t.failure_count, 0);
    assert!(t.steps.iter().all(|st| st.status == StepStatus::Succeeded && st.attempts == 1));
    assert_eq!(t.steps[1].output.as_ref().unwrap()["idempotency_key"], "h1:b");
    assert_eq!((t.lock.locked_by.clone(), t.complete_by), (None, None));
    let got = statuses(&s, &reply, 4).await;
    use ProcessState::{Processed, Processing};
    assert_eq!(states(&got), vec![p(Processing, "a"), p(Processing, "b"), p(Processing, "c"), p(Processed, "")]);
    let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "a FIFO reply queue receives statuses in order: {seqs:?}");
    // the last status carries the result: every step's output as the table holds it
    let outputs = got[3].outputs.as_ref().expect("the Processed status carries the outputs");
    for st in &t.steps {
        assert_eq!(Some(&outputs[&st.name]), st.output.as_ref(), "step {}", st.name);
    }
    assert!(got[..3].iter().all(|m| m.outputs.is_none() && !m.duplicate));
    // the same task id again: nothing created, the caller told so, with the result
    s.send(&s.res.submission_queue_url, &submission_to("three-slow", "h1", json!({"sku": "y"}), Some(&reply))).await;
    let dup = statuses(&s, &reply, 1).await;
    assert!(dup[0].duplicate, "{dup:?}");
    assert_eq!((dup[0].state, dup[0].seq, dup[0].outputs.as_ref()), (Processed, 4, Some(outputs)));
    assert_eq!(s.wait_terminal("h1").await.input, t.input, "the first submission's task is unchanged");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transient_agent_errors_then_success() {
    let s = stack("transient").await;
    let runner = s.runner();
    // b: two failing calls inside the first attempt (agent-side retries) ...
    s.send(
        &s.res.submission_queue_url,
        &submission_to("three-slow", "tr1", json!({"sim": {"b": {"fail_calls": 2}}}), None),
    )
    .await;
    // ... and c: a whole first attempt failing transiently (the scheduler retries it).
    s.send(
        &s.res.submission_queue_url,
        &submission_to("three-slow", "tr2", json!({"sim": {"c": {"fail_attempts": 1}}}), None),
    )
    .await;
    let t1 = s.wait_terminal("tr1").await;
    assert_eq!((t1.process_state, t1.failure_count), (ProcessState::Processed, 0));
    assert_eq!(t1.steps[1].output.as_ref().unwrap()["calls"], 3);
    let t2 = s.wait_terminal("tr2").await;
    assert_eq!((t2.process_state, t2.failure_count), (ProcessState::Processed, 1));
    assert_eq!(t2.steps[2].attempts, 2);
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_call_is_reported_by_its_agent_and_retried_at_once() {
    // the agent gives up at the attempt's execution deadline (start + timeout) and says so,
    // long before CompleteBy (start_by + timeout); the retry does not wait for the Supervisor.
    let mut s = stack("crash").await;
    // a long start budget: no request found not started, no result late, on a slow machine (the
    // agent still gives up 3 s after the start, far from CompleteBy)
    std::sync::Arc::get_mut(&mut s.deps).expect("not shared yet").settings.policy.queue_budget_ms = 60_000;
    let runner = s.runner();
    s.send(&s.res.submission_queue_url, &submission("cr1", json!({"sim": {"b": {"hang_attempts": 1}}}), None)).await;
    let t = s.wait_terminal("cr1").await;
    assert_eq!(t.process_state, ProcessState::Processed);
    assert_eq!(t.failure_count, 1);
    assert_eq!((t.steps[1].attempts, t.steps[1].failures), (2, 1));
    assert!(t.history.iter().any(|h| h.state == ProcessState::Pending
        && h.reason.as_deref().is_some_and(|r| r.contains("timed out: no answer within"))));
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_deadline_timer_alone_recovers_a_timed_out_step() {
    let s = stack("timer").await;
    // No sweep in this test's lifetime: only the delayed message on the supervisor queue can act.
    let opts = sas_core::runner::RunnerOptions {
        sweep_every: Duration::from_hours(1),
        wait: Duration::from_secs(1),
        ..Default::default()
    };
    let agents = std::sync::Arc::new(sas_core::agent::AgentRuntime::with_builtins());
    // No queue budget: an attempt's execution deadline is its CompleteBy, so a hung agent has no
    // time left to say it timed out (as a crashed one never does): only the timer can act.
    let mut deps = (*s.deps).clone();
    deps.settings.policy.queue_budget_ms = 0;
    let runner = sas_core::runner::Runner::new(std::sync::Arc::new(deps), agents, opts).spawn();
    tokio::time::sleep(Duration::from_millis(200)).await; // let the interval's first, immediate tick pass
    s.send(&s.res.submission_queue_url, &submission("tm1", json!({"sim": {"a": {"hang_attempts": 1}}}), None)).await;
    let t = s.wait_terminal("tm1").await;
    // every step has a 3 s CompleteBy here: on a slow machine a later step may time out too, so
    // the count is at least one
    assert_eq!(t.process_state, ProcessState::Processed);
    assert!(t.failure_count >= 1, "{t:?}");
    // Without the timer the task would wait an hour for the sweep; a's hung first attempt was
    // ended by its deadline and retried.
    assert!(
        t.history.iter().any(|h| h.state == ProcessState::Pending
            && h.reason.as_deref().is_some_and(|r| r.contains("step a attempt 1 passed CompleteBy"))),
        "a retry after the timeout: {:?}",
        t.history
    );
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_timeouts_compensate_in_reverse_alert_and_report() {
    let mut s = stack("timeouts").await;
    // a long start budget: no undo step found not started (a status more) on a slow machine; c's
    // hung calls are still given up by the agent 3 s after each start
    std::sync::Arc::get_mut(&mut s.deps).expect("not shared yet").settings.policy.queue_budget_ms = 60_000;
    let reply = s.reply_queue("replies", true).await;
    let alerts = s.alert_listener().await;
    let runner = s.runner();
    s.send(&s.res.submission_queue_url, &submission("to1", json!({"sim": {"c": {"hang_attempts": 99}}}), Some(&reply)))
        .await;
    let t = s.wait_for("to1", Duration::from_secs(90), |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Compensated);
    assert_eq!(t.failure_count, 3);
    assert_eq!(t.steps[2].status, StepStatus::TimedOut);
    for i in [0, 1] {
        assert_eq!(t.steps[i].compensation.as_ref().unwrap().status, CompensationStatus::Done);
    }
    let got = statuses(&s, &reply, 11).await;
    let comp: Vec<_> = states(&got).into_iter().filter(|(st, _)| *st == ProcessState::Compensating).collect();
    assert_eq!(
        comp,
        vec![p(ProcessState::Compensating, "undo_b"), p(ProcessState::Compensating, "undo_a")],
        "reverse order"
    );
    assert_eq!(got.last().unwrap().state, ProcessState::Compensated);
    assert_eq!(got.iter().filter(|m| m.state == ProcessState::Pending).count(), 2, "two retries");
    let alert = s.bodies(&alerts, 1, SECS).await;
    assert_eq!(alert.len(), 1, "{alert:#?}");
    assert_eq!(alert[0]["kind"], "retries_exhausted");
    assert_eq!(alert[0]["task_id"], "to1");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permanent_error_on_step_two_compensates_step_one() {
    let s = stack("perm").await;
    let runner = s.runner();
    s.send(
        &s.res.submission_queue_url,
        &submission_to("three-slow", "pe1", json!({"sim": {"b": {"permanent": "card declined"}}}), None),
    )
    .await;
    let t = s.wait_terminal("pe1").await;
    assert_eq!(t.process_state, ProcessState::Compensated);
    assert_eq!(t.steps[1].status, StepStatus::Failed);
    assert!(t.steps[1].compensation.is_none(), "a definite no leaves nothing to undo");
    assert_eq!(t.steps[0].compensation.as_ref().unwrap().status, CompensationStatus::Done);
    assert!(t.reason.unwrap().contains("card declined"));
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_compensation_ends_in_error_with_an_alert() {
    let s = stack("comperr").await;
    let alerts = s.alert_listener().await;
    let runner = s.runner();
    let input = json!({"sim": {"b": {"permanent": "declined"}, "undo_a": {"permanent": "cannot release"}}});
    s.send(&s.res.submission_queue_url, &submission_to("three-slow", "ce1", input, None)).await;
    let t = s.wait_terminal("ce1").await;
    assert_eq!(t.process_state, ProcessState::Error);
    let got = s.bodies(&alerts, 1, SECS).await;
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0]["kind"], "task_error");
    assert_eq!(got[0]["state"], "Error");
    runner.shutdown().await;
    s.delete().await;
}

/// The one run message on the scheduler queue.
async fn take_run_message(s: &Stack) -> String {
    let msgs = s.drain(&s.res.scheduler_queue_url, 1, SECS).await;
    assert_eq!(msgs.len(), 1, "one run message");
    msgs[0].body.clone().unwrap()
}

/// The one agent request on the agent queue (a submission's start), taken away from any agent.
async fn take_dispatch(s: &Stack) -> String {
    let msgs = s.drain(&s.res.agent_queue_url, 1, SECS).await;
    assert_eq!(msgs.len(), 1, "one agent request");
    msgs[0].body.clone().unwrap()
}

/// Submit, and fail the first attempt retryably: the task waits for the claim of its retry.
/// Returns that run message.
async fn waiting(s: &Stack, body: &str) -> String {
    submitter::submit(&s.deps, body).await.unwrap();
    let req: sas_protocol::messages::AgentRequest = serde_json::from_str(&take_dispatch(s).await).unwrap();
    let failed = SchedulerMessage::Result(AgentResult {
        v: 1,
        task_id: req.task_id,
        step: req.step,
        attempt: req.attempt,
        outcome: Outcome::Failed { error: "503".into(), retryable: true },
    });
    scheduler::schedule(&s.deps, &serde_json::to_string(&failed).unwrap()).await.unwrap();
    take_run_message(s).await
}

/// One sweep, then the timer handler on every message of the supervisor queue (the sweep's
/// hand-overs, and any deadline timer due by then). Returns how many of them changed a task.
async fn sweep_and_handle(s: &Stack) -> usize {
    let report = supervisor::sweep(&s.deps).await;
    assert_eq!(report.errors, 0, "{report:?}");
    let timers = s.drain(&s.res.supervisor_queue_url, report.handed, SECS).await;
    let mut changed = 0;
    for t in timers {
        if let Applied::Changed { .. } = supervisor::timer(&s.deps, t.body().unwrap()).await.unwrap() {
            changed += 1;
        }
    }
    changed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schedulers_racing_to_claim_dispatch_once() {
    let s = stack("race-claim").await;
    let run = waiting(&s, &submission_to("three-slow", "rc1", json!({}), None)).await;
    let (a, b) = tokio::join!(scheduler::schedule(&s.deps, &run), scheduler::schedule(&s.deps, &run));
    let outcomes = [a.unwrap(), b.unwrap()];
    assert_eq!(outcomes.iter().filter(|o| matches!(o, Applied::Changed { .. })).count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| matches!(o, Applied::Stale(_))).count(), 1, "{outcomes:?}");
    let dispatched = s.drain(&s.res.agent_queue_url, 1, Duration::from_secs(3)).await;
    assert_eq!(dispatched.len(), 1, "exactly one dispatch");
    let t = s.task("rc1").await.unwrap();
    assert_eq!(t.steps[0].attempts, 2, "the first attempt, then one claim of the retry");
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_supervisors_racing_on_one_expired_step_recover_once() {
    let s = stack("race-sup").await;
    submitter::submit(&s.deps, &submission("rs1", json!({}), None)).await.unwrap();
    take_dispatch(&s).await; // nobody runs the agent
                             // Wait for CompleteBy and the result grace to pass.
    let grace = s.deps.settings.policy.result_grace_ms;
    s.wait_for("rs1", SECS, |t| t.complete_by.is_some_and(|c| c.plus_ms(grace) < Millis::now())).await;
    let (a, b) = tokio::join!(supervisor::sweep(&s.deps), supervisor::sweep(&s.deps));
    assert_eq!((a.handed, b.handed), (1, 1), "{a:?} {b:?}");
    // Both hand-overs and the task's own deadline timer, handled at once: one recovery.
    let timers = s.drain(&s.res.supervisor_queue_url, 3, SECS).await;
    assert_eq!(timers.len(), 3, "{timers:?}");
    let handled = futures::future::join_all(timers.iter().map(|t| supervisor::timer(&s.deps, t.body().unwrap()))).await;
    let changed = handled.iter().filter(|r| matches!(r, Ok(Applied::Changed { .. }))).count();
    assert_eq!(changed, 1, "{handled:?}");
    let t = s.task("rs1").await.unwrap();
    assert_eq!((t.process_state, t.failure_count), (ProcessState::Pending, 1));
    let runs = s.bodies(&s.res.scheduler_queue_url, 1, Duration::from_secs(5)).await;
    assert_eq!(runs.len(), 1, "one retry message: {runs:?}");
    assert_eq!(runs[0]["reason"], "retry");
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_submission_creates_one_task() {
    let s = stack("dup").await;
    let body = submission_to("three-slow", "d1", json!({"n": 1}), None);
    let id = TaskId::try_from("d1").unwrap();
    assert_eq!(submitter::submit(&s.deps, &body).await.unwrap(), Submitted::Created(id.clone()));
    let other = submission_to("three-slow", "d1", json!({"n": 2}), None);
    assert_eq!(submitter::submit(&s.deps, &other).await.unwrap(), Submitted::Duplicate(id));
    assert_eq!(s.task("d1").await.unwrap().input, json!({"n": 1}));
    assert_eq!(s.drain(&s.res.agent_queue_url, 1, Duration::from_secs(3)).await.len(), 1, "one start");
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_delivery_of_an_agent_result_is_applied_once_and_late_results_change_nothing() {
    let s = stack("dup-result").await;
    submitter::submit(&s.deps, &submission_to("three-slow", "dr1", json!({}), None)).await.unwrap();
    let req = take_dispatch(&s).await;
    let agents = sas_core::agent::AgentRuntime::with_builtins();
    assert!(agent::handle(&s.deps, &agents, &req).await.unwrap(), "result sent");
    let result = s.drain(&s.res.scheduler_queue_url, 1, SECS).await.remove(0).body.unwrap();
    let applied = scheduler::schedule(&s.deps, &result).await.unwrap();
    assert!(matches!(applied, Applied::Changed { state: ProcessState::Processing, .. }), "{applied:?} {result}");
    assert_eq!(scheduler::schedule(&s.deps, &result).await.unwrap(), Applied::Stale(Stale::NotCurrentAttempt));
    let t = s.task("dr1").await.unwrap();
    assert_eq!((t.step_index, t.steps[0].attempts), (1, 1));

    // A result from an attempt that is no longer current (here: the step-a token, replayed with a
    // failure) changes nothing either.
    let old: AgentResult = match serde_json::from_str::<SchedulerMessage>(&result).unwrap() {
        SchedulerMessage::Result(r) => r,
        other => panic!("{other:?}"),
    };
    let late = SchedulerMessage::Result(AgentResult {
        outcome: Outcome::Failed { error: "late".into(), retryable: false },
        attempt: old.attempt,
        ..old
    });
    let before = s.task("dr1").await.unwrap();
    assert_eq!(
        scheduler::schedule(&s.deps, &serde_json::to_string(&late).unwrap()).await.unwrap(),
        Applied::Stale(Stale::NotCurrentAttempt)
    );
    assert_eq!(s.task("dr1").await.unwrap(), before);
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_result_of_a_timed_out_attempt_is_taken_while_its_step_is_current_and_only_then() {
    // an agent answers only before its deadline, so a late result was produced in time: it
    // must not lose to the timer. Once the task has moved on, it changes nothing.
    let s = stack("late").await;
    submitter::submit(&s.deps, &submission("lt1", json!({}), None)).await.unwrap();
    take_dispatch(&s).await;
    let first = s.task("lt1").await.unwrap();
    let token = first.lock.locked_by.clone().unwrap();
    let grace = s.deps.settings.policy.result_grace_ms;
    s.wait_for("lt1", SECS, |t| t.complete_by.is_some_and(|c| c.plus_ms(grace) < Millis::now())).await;
    assert_eq!(sweep_and_handle(&s).await, 1);
    let retried = s.task("lt1").await.unwrap();
    assert_eq!(retried.process_state, ProcessState::Pending);
    let late = |outcome| {
        serde_json::to_string(&SchedulerMessage::Result(AgentResult {
            v: 1,
            task_id: TaskId::try_from("lt1").unwrap(),
            step: "a".into(),
            attempt: token.clone(),
            outcome,
        }))
        .unwrap()
    };
    let failed = scheduler::schedule(&s.deps, &late(Outcome::Failed { error: "late".into(), retryable: true })).await;
    assert_eq!(failed.unwrap(), Applied::Stale(Stale::NotCurrentAttempt), "a late failure changes nothing");
    assert_eq!(s.task("lt1").await.unwrap(), retried);
    let ok = late(Outcome::Succeeded { output: json!({"late": true}) });
    let got = scheduler::schedule(&s.deps, &ok).await.unwrap();
    assert!(matches!(got, Applied::Changed { state: ProcessState::Processing, .. }), "{got:?}");
    let moved = s.task("lt1").await.unwrap();
    assert_eq!((moved.step_index, moved.steps[0].output.clone()), (1, Some(json!({"late": true}))));
    assert_eq!(scheduler::schedule(&s.deps, &ok).await.unwrap(), Applied::Stale(Stale::NotCurrentAttempt), "once");
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_bad_input_class_is_rejected_with_a_reason_and_kept() {
    let s = stack("bad").await;
    let reply = s.reply_queue("replies", false).await;
    let big = "x".repeat(20 * 1024);
    let cases: Vec<(String, &str, bool)> = vec![
        ("{not json".into(), "not JSON", false),
        (
            json!({"v": 2, "task_id": "b2", "workflow": "three", "reply_to": reply}).to_string(),
            "unsupported message version 2",
            true,
        ),
        (
            json!({"v": 1, "task_id": "b3", "workflow": "nope", "reply_to": reply}).to_string(),
            "unknown workflow nope",
            true,
        ),
        (
            json!({"v": 1, "task_id": "b4", "workflow": "three", "input": {"blob": big}, "reply_to": reply})
                .to_string(),
            "the limit is 16384",
            true,
        ),
        (
            json!({"v": 1, "task_id": "b5", "workflow": "three", "reply_to": "https://evil.example/x"}).to_string(),
            "not an SQS queue URL",
            false,
        ),
        (
            json!({"v": 1, "task_id": "b:6", "workflow": "three", "reply_to": reply}).to_string(),
            "task_id contains ':'",
            true,
        ),
        (
            json!({"v": 1, "workflow": "three", "callback": "x", "reply_to": reply}).to_string(),
            "does not match the contract",
            true,
        ),
        // A long multi-byte name echoed in the reason must be cut on a character boundary.
        (
            json!({"v": 1, "task_id": "b8", "workflow": "заказ".repeat(120), "reply_to": reply}).to_string(),
            "unknown workflow заказ",
            true,
        ),
    ];
    let runner = s.runner();
    for (body, _, _) in &cases {
        s.send(&s.res.submission_queue_url, body).await;
    }
    let kept = s.drain(s.out("SubmissionDlqUrl"), cases.len(), Duration::from_secs(30)).await;
    assert_eq!(kept.len(), cases.len(), "every refused message is kept in the DLQ");
    for (body, why, _) in &cases {
        let m =
            kept.iter().find(|m| m.body.as_deref() == Some(body.as_str())).unwrap_or_else(|| panic!("{body} not kept"));
        let reason = m
            .message_attributes
            .as_ref()
            .and_then(|a| a.get("RejectReason"))
            .and_then(|v| v.string_value.clone())
            .unwrap_or_default();
        assert!(reason.contains(why), "reason {reason:?} should mention {why:?}");
    }
    let answered = cases.iter().filter(|c| c.2).count();
    let got = statuses(&s, &reply, answered).await;
    assert_eq!(got.len(), answered, "a Rejected status for each message naming a usable reply queue");
    assert!(got.iter().all(|m| m.state == ProcessState::Rejected && m.reason.is_some()));
    for id in ["b2", "b3", "b4"] {
        assert!(got.iter().any(|m| m.task_id.as_str() == id), "{id} answered");
        assert!(s.task(id).await.is_none(), "no task created for {id}");
    }
    // the runner deletes a batch once its rejections are kept and answered: polled, with a bound
    let until = Instant::now() + Duration::from_secs(20);
    while s.depth(&s.res.submission_queue_url).await != 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(s.depth(&s.res.submission_queue_url).await, 0, "nothing left to retry");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reply_to_is_refused_off_the_allow_list_and_for_every_queue_of_the_stack() {
    let s = stack("replyto").await;
    // A queue of the account that is not on the allow-list (<stack>-reply-*), and the DLQs, each
    // also spelled another way than the output gives it.
    let foreign = s.queue("billing", false).await;
    let respell = |url: &str| -> String {
        // e.g. http://localhost:4566/queue/<region>/<account>/<name> -> http://LOCALHOST:4566/<account>/<name>
        let mut segs = url.rsplit('/');
        let (name, account) = (segs.next().unwrap_or_default(), segs.next().unwrap_or_default());
        format!("http://LOCALHOST:4566/{account}/{name}")
    };
    let mut cases: Vec<(String, &str)> = vec![(foreign.clone(), "is not on this stack's allow-list")];
    for out in ["SubmissionDlqUrl", "SchedulerDlqUrl", "AgentDlqUrl", "SupervisorDlqUrl", "SchedulerQueueUrl"] {
        cases.push((s.out(out).to_owned(), "own queues"));
        cases.push((respell(s.out(out)), "own queues"));
    }
    for (i, (reply_to, why)) in cases.iter().enumerate() {
        let body = submission(&format!("r{i}"), json!({}), Some(reply_to));
        let got = submitter::submit(&s.deps, &body).await.unwrap();
        let Submitted::Rejected(r) = got else { panic!("{reply_to}: {got:?}") };
        assert!(r.to_string().contains(why), "{reply_to}: {r}");
        assert!(s.task(&format!("r{i}")).await.is_none(), "no task for {reply_to}");
    }
    let kept = s.drain(s.out("SubmissionDlqUrl"), cases.len(), SECS).await;
    assert_eq!(kept.len(), cases.len(), "every refused submission is kept with its reason");
    let reasons: Vec<String> =
        kept.iter().filter_map(|m| m.message_attributes.as_ref()?.get("RejectReason")?.string_value.clone()).collect();
    assert!(
        reasons.iter().any(|r| r.contains(&format!(":{}-billing is not on this stack's allow-list", s.name))),
        "{reasons:#?}"
    );
    // Nothing was written where the submissions pointed.
    for q in [&foreign, &s.res.scheduler_queue_url] {
        assert_eq!(s.depth(q).await, 0, "{q} got nothing");
    }
    for out in ["SchedulerDlqUrl", "AgentDlqUrl", "SupervisorDlqUrl"] {
        assert_eq!(s.depth(s.out(out)).await, 0, "{out} got nothing");
    }
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancellation_stops_a_task_mid_way() {
    let s = stack("cancel").await;
    let runner = s.runner();
    s.send(
        &s.res.submission_queue_url,
        &submission_to("three-slow", "ca1", json!({"sim": {"b": {"delay_ms": 15_000}}}), None),
    )
    .await;
    s.wait_for("ca1", Duration::from_mins(1), |t| t.process_state == ProcessState::Processing && t.step_index == 1)
        .await;
    // Cancel once b's call has started: its request taken from the agent queue (an agent checks
    // that its attempt is current before it calls; a request taken after the cancel is not started,
    // and the compensation then waits for the attempt's deadline, a minute here).
    let started = Instant::now();
    loop {
        let out = s
            .sqs
            .get_queue_attributes()
            .queue_url(&s.res.agent_queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .expect("GetQueueAttributes");
        let taken = out
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible))
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
        if taken > 0 {
            break;
        }
        assert!(started.elapsed() < SECS, "b's request was never taken from the agent queue");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancel = json!({"type": "cancel", "v": 1, "task_id": "ca1", "reason": "customer changed their mind"});
    s.send(&s.res.scheduler_queue_url, &cancel.to_string()).await;
    let t = s.wait_terminal("ca1").await;
    assert_eq!(t.process_state, ProcessState::Cancelled);
    // b's success came after the cancel: known to have applied, it is undone with its output
    assert_eq!(t.steps[1].status, StepStatus::Succeeded);
    assert!(t.steps[1].output.is_some());
    assert_eq!(t.steps[2].attempts, 0, "step c never started");
    assert_eq!(t.steps[1].compensation.as_ref().unwrap().status, CompensationStatus::Done, "b was mid-flight: undone");
    assert_eq!(t.steps[0].compensation.as_ref().unwrap().status, CompensationStatus::Done);
    // nothing changes afterwards
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(s.task("ca1").await.unwrap().rev, t.rev);
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_start_is_retried_by_the_supervisor() {
    let s = stack("lost").await;
    submitter::submit(&s.deps, &submission("ls1", json!({}), None)).await.unwrap();
    // The agent request is lost: to the Supervisor it is an attempt that never answered.
    take_dispatch(&s).await;
    assert_eq!(s.task("ls1").await.unwrap().process_state, ProcessState::Processing);
    let runner = s.runner();
    let t = s.wait_terminal("ls1").await;
    assert_eq!(t.process_state, ProcessState::Processed);
    assert_eq!((t.failure_count, t.steps[0].attempts), (1, 2), "timed out once, then retried");
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_supervisor_reads_only_expired_tasks_page_by_page() {
    let mut s = stack("bounded").await;
    // the tasks are made with the short test budgets: their CompleteBy is derived from them
    let policy = s.deps.settings.policy.clone();
    let deps = std::sync::Arc::get_mut(&mut s.deps).expect("not shared yet");
    deps.settings.sweep_page_size = 2;
    // A recovered task's new CompleteBy is its backoff plus the start budget: long for the
    // Supervisor, so that the last sweep holds however long the machine takes over the seven timers.
    deps.settings.policy.start_timeout_ms = 600_000;
    deps.settings.policy.queue_budget_ms = 600_000;
    let wf = s.deps.workflows.resolve("three", None).unwrap().clone();
    let now = Millis::now();
    let make = |id: String, created: u64, done: bool| {
        let mut t = sas_protocol::protocol::submit(
            TaskId::try_from(id).unwrap(),
            wf.clone(),
            json!({}),
            None,
            &sas_protocol::protocol::Ctx::at(Millis(created)),
            &policy,
        )
        .task;
        if done {
            t.process_state = ProcessState::Processed;
            t.complete_by = None;
        }
        t
    };
    let mut tasks = Vec::new();
    for i in 0..7 {
        tasks.push(make(format!("expired-{i}"), now.0 - 60_000, false)); // CompleteBy a minute ago
    }
    for i in 0..10 {
        tasks.push(make(format!("waiting-{i}"), now.0 + 600_000, false)); // CompleteBy ten minutes ahead
        tasks.push(make(format!("finished-{i}"), now.0 - 60_000, true)); // terminal: not in the index
    }
    for t in &tasks {
        s.table().create(t).await.unwrap();
    }
    let report = supervisor::sweep(&s.deps).await;
    assert_eq!(report.expired, 7, "only the expired tasks are read: {report:?}");
    assert_eq!(report.handed, 7, "every page was followed: {report:?}");
    assert_eq!(report.errors, 0);
    let timers = s.drain(&s.res.supervisor_queue_url, 7, SECS).await;
    assert_eq!(timers.len(), 7, "one hand-over each");
    let handled_from = Millis::now();
    for t in &timers {
        supervisor::timer(&s.deps, t.body().unwrap()).await.unwrap();
    }
    for i in 0..7 {
        let t = s.task(&format!("expired-{i}")).await.unwrap();
        assert_eq!((t.process_state, t.failure_count), (ProcessState::Pending, 1), "expired-{i} retried once");
        assert!(t.complete_by.is_some_and(|c| c > handled_from), "expired-{i} carries a new CompleteBy: {t:?}");
    }
    assert_eq!(supervisor::sweep(&s.deps).await.expired, 0, "recovered tasks carry a new CompleteBy");
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_item_in_the_index_is_skipped_and_reported_not_blocking_its_shard() {
    // an undecodable item is skipped and reported, or it would fail its shard's every page,
    // forever. The index is keys only: what can be unreadable is a key (here, ids no task can have).
    let s = stack("unreadable").await;
    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let table = s.out("TaskTableName").to_owned();
    for shard in ["0", "1"] {
        ddb.put_item()
            .table_name(&table)
            .item("TaskId", aws_sdk_dynamodb::types::AttributeValue::S(format!("garbage {shard}!")))
            .item("Shard", aws_sdk_dynamodb::types::AttributeValue::S(shard.into()))
            .item("CompleteBy", aws_sdk_dynamodb::types::AttributeValue::N("1".into()))
            .item("ProcessState", aws_sdk_dynamodb::types::AttributeValue::S("Pending".into()))
            .send()
            .await
            .expect("PutItem");
    }
    submitter::submit(&s.deps, &submission("ur1", json!({}), None)).await.unwrap();
    take_dispatch(&s).await; // the start is lost
    let grace = s.deps.settings.policy.result_grace_ms;
    s.wait_for("ur1", SECS, |t| t.complete_by.is_some_and(|c| c.plus_ms(grace) < Millis::now())).await;
    let report = supervisor::sweep(&s.deps).await;
    assert_eq!(report.errors, 2, "both bad items reported: {report:?}");
    assert_eq!(report.handed, 1, "the real task behind them is handed over: {report:?}");
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_entries_a_write_drops_are_archived_in_the_table_and_read_back() {
    use sas_protocol::protocol::{self as proto, Ctx, HistoryEntry};
    let s = stack("history").await;
    let def = crate::common::workflows().resolve("three-slow", None).unwrap().clone();
    let id = TaskId::try_from("hist-1").unwrap();
    let mut read =
        proto::submit(id.clone(), def, json!({}), None, &Ctx::at(Millis::now()), &proto::Policy::default()).task;
    let entry = |seq: u64| HistoryEntry {
        seq,
        state: ProcessState::Processing,
        step: Some("reserve".into()),
        failure_count: 0,
        reason: Some(format!("entry {seq}")),
        at: Millis(1_795_000_000_000 + seq),
        waiting: false,
    };
    read.history = (1..=6).map(entry).collect();
    read.status_seq = 6;
    s.table().create(&read).await.unwrap();
    // The next write keeps the last four entries and one new: 1, 2 and 3 are dropped.
    let mut next = read.clone();
    next.rev += 1;
    next.history = (4..=7).map(entry).collect();
    next.status_seq = 7;
    s.table().save(&next, &read).await.unwrap();
    let archived = s.deps.store.archived_history(&id, 1, 4).await.unwrap();
    assert_eq!(archived, (1..=3).map(entry).collect::<Vec<_>>());
    // A write that drops nothing archives nothing more; the item itself is unchanged in shape.
    let mut again = next.clone();
    again.rev += 1;
    s.table().save(&again, &next).await.unwrap();
    assert_eq!(s.deps.store.archived_history(&id, 1, 10).await.unwrap().len(), 3);
    assert_eq!(s.task("hist-1").await.unwrap().history, next.history);
    s.delete().await;
}
