//! Schedules against LocalStack: the local runner's Supervisor sweep (every 0.7 s here, every
//! minute on AWS) sends each instant of a schedule once, through a restart of the functions; under
//! `skip` the instants that come while the previous one's task runs make no task; a backfill of
//! an hour of a per-minute schedule runs its 60 instants one after another, each once.

use std::time::Duration;

use serde_json::json;

use sas_cli::schedule::{self as sched, Spec};
use sas_protocol::ids::{CallbackToken, Millis};
use sas_protocol::protocol::{ProcessState, StepStatus, Task};
use sas_protocol::schedules::{self, Every, Overlap};
use sas_protocol::workflow::WorkflowRegistry;

use crate::common::{ran, stack_with, workflow};

#[tokio::test]
async fn a_schedule_sends_each_instant_once_through_a_restart_skips_while_one_runs_and_backfills_an_hour() {
    // "held": a step the test answers (the task runs until then); "quick": a wait of 1 ms
    let held = workflow(json!({
        "name": "held", "version": 1,
        "steps": [{"name": "hold", "kind": "callback", "agent": "sim", "timeout_ms": 600_000, "max_attempts": 1}]
    }));
    let quick =
        workflow(json!({"name": "quick", "version": 1, "steps": [{"name": "tick", "kind": "wait", "wait_ms": 1}]}));
    let s = stack_with("sched", WorkflowRegistry::new([held, quick]).unwrap()).await;
    let callbacks = s.res.callback_queue_url.clone().expect("the stack has a callback queue");
    let spec = |name: &str, workflow: &str, every: Every| Spec {
        name: name.into(),
        workflow: workflow.into(),
        version: None,
        input: json!({"report": name}),
        every,
        time_zone: None,
        overlap: Overlap::Skip,
        jitter_ms: 0,
    };
    // every 2 s, skip
    let first = sched::create(&s.deps, &spec("beat", "held", Every::RateMs(2_000))).await.unwrap().unwrap();
    let mut runner = s.runner();
    let first_id = schedules::task_id("beat", first);
    let holding = |t: &Task| t.steps[0].status == StepStatus::Running && t.lock.locked_by.is_some();
    let t1 = s.wait_for(&first_id, Duration::from_mins(2), holding).await;
    assert_eq!(t1.input, json!({"report": "beat"}));
    // while it holds, the instants that come are sent and skipped: no task of theirs
    let give_up = std::time::Instant::now() + Duration::from_mins(2);
    let fired_while_held = loop {
        let all = sched::list(&s.deps).await.unwrap();
        let beat = &all.schedules["beat"];
        if beat.fired >= 4 {
            break beat.clone();
        }
        assert!(
            std::time::Instant::now() < give_up,
            "4 instants of a 2-s schedule not sent within 2 minutes: {beat:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let skipped: Vec<Millis> = (1..fired_while_held.fired).map(|k| Millis(first.0 + 2_000 * k)).collect();
    for at in &skipped {
        assert!(s.task(&schedules::task_id("beat", *at)).await.is_none(), "{at}: skipped while {first_id} runs");
    }
    // the functions stop for a few instants and start again: the instants passed meanwhile are
    // sent once they are back; the first task ends, and the next instant runs
    runner.shutdown().await;
    let stopped_at = sched::list(&s.deps).await.unwrap().schedules["beat"].next;
    tokio::time::sleep(Duration::from_secs(5)).await;
    runner = s.runner();
    let token = CallbackToken::new(&t1.task_id, "hold", t1.lock.locked_by.as_ref().expect("an attempt"));
    let answer = json!({"v": 1, "token": token.expose(), "status": "succeeded", "output": {}});
    s.send(&callbacks, &answer.to_string()).await;
    let t1 = s.wait_for(&first_id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    assert_eq!(t1.process_state, ProcessState::Processed);
    // an instant after the first's end becomes a task
    let after = loop {
        let beat = sched::list(&s.deps).await.unwrap().schedules["beat"].clone();
        let ids: Vec<Millis> = (0..beat.fired).map(|k| Millis(first.0 + 2_000 * k)).collect();
        let mut found = None;
        for at in ids.iter().rev() {
            if *at > stopped_at {
                if let Some(t) = s.task(&schedules::task_id("beat", *at)).await {
                    found = Some(t);
                    break;
                }
            }
        }
        if let Some(t) = found {
            break t;
        }
        assert!(beat.fired < 200, "no instant after the restart became a task: {beat:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(ran(&t1).1 <= after.history[0].at, "{} started after {first_id} ended", after.task_id);
    let beat = sched::delete(&s.deps, "beat").await.unwrap().unwrap();
    // each instant once, none lost through the restart: the schedule moved from the first instant
    // to its next one instant by instant (its count is the instants between them)
    assert_eq!(beat.fired, (beat.next.0 - first.0) / 2_000, "{beat:?}");
    assert!(beat.last.is_some_and(|l| l > stopped_at), "instants after the restart were sent: {beat:?}");

    // every five minutes, backfilled over an hour of the past: 12 tasks, one after another
    let fively = spec("fively", "quick", Every::Cron("*/5 * * * *".into()));
    sched::create(&s.deps, &fively).await.unwrap().unwrap();
    sched::set_paused(&s.deps, "fively", Some("only backfilled here")).await.unwrap().unwrap();
    let now = Millis::now().0 / 60_000 * 60_000;
    let (from, to) = (Millis(now - 2 * 3_600_000), Millis(now - 3_600_000));
    let sent = sched::backfill(&s.deps, "fively", from, to).await.unwrap().unwrap();
    assert_eq!(sent.len(), 12);
    // they run one at a time, in an order the test does not know: one bound for them all, of a
    // minute each (a task of one 1-ms wait takes a few seconds on a loaded machine)
    let give_up = std::time::Instant::now() + Duration::from_mins(sent.len() as u64);
    let mut runs = Vec::new();
    for at in &sent {
        let id = schedules::task_id("fively", *at);
        let left = give_up.saturating_duration_since(std::time::Instant::now()).max(Duration::from_secs(1));
        let t = s.wait_for(&id, left, |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:?}", t.reason);
        runs.push((ran(&t), id));
    }
    // one at a time (in the order they reached the Submitter: the submission queue keeps none)
    runs.sort();
    for w in runs.windows(2) {
        let (((_, end), before), ((start, _), after)) = (&w[0], &w[1]);
        assert!(start >= end, "{after} started at {start} before {before} ended at {end}");
    }
    // asked again, the hour runs nothing twice
    sched::backfill(&s.deps, "fively", from, to).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (_, id) in &runs {
        let t = s.task(id).await.unwrap();
        assert_eq!(t.history.iter().filter(|h| h.state == ProcessState::Processing).count(), 1, "{id} ran once");
    }
    let listed = sched::render(&sched::list(&s.deps).await.unwrap());
    assert!(
        listed.contains("fively: quick cron \"*/5 * * * *\" UTC, overlap skip; paused (only backfilled here)"),
        "{listed}"
    );
    runner.shutdown().await;
    s.delete().await;
}
