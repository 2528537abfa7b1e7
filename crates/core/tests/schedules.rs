//! Schedules on the twins: the Supervisor's sweep sends each instant once (its task id the
//! schedule's name and the instant), a sweep that comes late sends the instants it missed, an
//! instant sent twice is one task; under `skip` an instant is refused while the previous one runs;
//! a backfill's instants wait in line in their order; a paused schedule sends nothing and a
//! resumed one goes on from its next instant; the overlap is the schedule's, never the message's.

use serde_json::json;

use sas_core::config::Settings;
use sas_core::schedules::{self as sched, edit};
use sas_core::submitter::{self, Rejection, Submitted};
use sas_core::supervisor;
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{Event, ProcessState};
use sas_protocol::schedules::{self, Every, Overlap, Schedule};
use sas_protocol::workflow::{WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;

const MIN: u64 = 60_000;
// 2026-11-29T18:00:00Z
const T0: u64 = 1_795_975_200_000;

fn twins() -> Twins {
    let def: WorkflowDef = serde_json::from_value(json!({
        "name": "report", "version": 1,
        "steps": [{"name": "build", "agent": "sim", "timeout_ms": 100_000}]
    }))
    .unwrap();
    Twins::new(WorkflowRegistry::new([def]).unwrap(), Settings::default(), Millis(T0 + 5_000))
}

async fn create(tw: &Twins, name: &str, overlap: Overlap) {
    edit(&tw.deps, |all, now| {
        let s = Schedule::new(
            "report",
            None,
            json!({"day": "today"}),
            Every::Cron("* * * * *".into()),
            None,
            overlap,
            0,
            now,
        )?;
        all.schedules.insert(name.to_owned(), s);
        Ok(())
    })
    .await
    .unwrap()
    .unwrap();
}

/// What the sweep sent to the submission queue, handed to the Submitter: each one's verdict.
async fn submit_sent(tw: &Twins) -> Vec<Submitted> {
    let mut out = Vec::new();
    for body in tw.bus.take(&tw.deps.resources.submission_queue_url) {
        // each its own SQS message, as on the queue
        let record = sas_core::bus::Record::new(uuid::Uuid::new_v4().to_string(), body);
        out.push(submitter::submit_message(&tw.deps, &record).await.unwrap());
    }
    out
}

async fn task(tw: &Twins, id: &str) -> Option<sas_protocol::protocol::Task> {
    tw.deps.store.get(&TaskId::try_from(id).unwrap()).await.unwrap()
}

#[tokio::test]
async fn a_schedule_of_every_minute_sends_each_instant_once_and_skips_while_the_previous_runs() {
    let tw = twins();
    create(&tw, "hourly", Overlap::Skip).await;
    // 18:00:05: its first instant is 18:01
    assert_eq!(supervisor::sweep(&tw.deps).await.scheduled, 0, "nothing due yet");
    tw.clock.advance(MIN);
    assert_eq!(supervisor::sweep(&tw.deps).await.scheduled, 1);
    let got = submit_sent(&tw).await;
    assert_eq!(got, vec![Submitted::Created(TaskId::try_from("hourly-20261129T180100Z").unwrap())]);
    let first = task(&tw, "hourly-20261129T180100Z").await.unwrap();
    assert_eq!(first.input, json!({"day": "today"}));
    assert_eq!(first.slot.as_ref().map(|s| s.key.as_str()), Some("key:schedule:hourly"), "the schedule's key");
    // a sweep again in the same minute sends nothing; an instant sent twice is one task
    assert_eq!(supervisor::sweep(&tw.deps).await.scheduled, 0, "each instant once");
    let s = sched_of(&tw, "hourly").await;
    sched::send(&tw.deps, "hourly", &s, &[Millis(T0 + MIN)], false).await.unwrap();
    assert!(matches!(&submit_sent(&tw).await[..], [Submitted::Duplicate(_)]));
    // 18:02 while 18:01 still runs: skipped (refused, no task, nothing in the DLQ)
    tw.clock.advance(MIN);
    assert_eq!(supervisor::sweep(&tw.deps).await.scheduled, 1);
    let got = submit_sent(&tw).await;
    assert!(matches!(&got[..], [Submitted::Rejected(Rejection::Busy(_))]), "{got:?}");
    assert!(task(&tw, "hourly-20261129T180200Z").await.is_none());
    assert!(tw.bus.take(&tw.deps.resources.submission_dlq_url).is_empty());
    // 18:01 ends; the sweep comes 3 minutes late: it sends 18:03, 18:04, 18:05 in order; the first
    // runs, the others are skipped while it runs
    let cancel = Event::Cancel { reason: "done for the test".into(), run: None };
    sas_core::effects::drive(&tw.deps, first, &cancel, None).await.unwrap();
    assert!(task(&tw, "hourly-20261129T180100Z").await.unwrap().process_state.is_terminal());
    tw.clock.advance(3 * MIN);
    assert_eq!(supervisor::sweep(&tw.deps).await.scheduled, 3);
    let got = submit_sent(&tw).await;
    assert_eq!(got[0], Submitted::Created(TaskId::try_from("hourly-20261129T180300Z").unwrap()), "{got:?}");
    assert!(got[1..].iter().all(|g| matches!(g, Submitted::Rejected(Rejection::Busy(_)))), "{got:?}");
    let s = sched_of(&tw, "hourly").await;
    assert_eq!((s.fired, s.last, s.next), (5, Some(Millis(T0 + 5 * MIN)), Millis(T0 + 6 * MIN)));
}

async fn sched_of(tw: &Twins, name: &str) -> Schedule {
    sas_cli_free_list(tw).await.schedules.remove(name).expect("the schedule")
}

async fn sas_cli_free_list(tw: &Twins) -> schedules::Schedules {
    tw.deps.schedules.load_schedules().await.unwrap().unwrap_or_default()
}

#[tokio::test]
async fn a_backfill_of_an_hour_runs_its_sixty_instants_one_after_another_in_order() {
    let tw = twins();
    create(&tw, "minutely", Overlap::Skip).await;
    tw.clock.advance(2 * 60 * MIN);
    let s = sched_of(&tw, "minutely").await;
    let hour = s.instants(Millis(T0 - 60 * MIN), Millis(T0), schedules::MAX_BACKFILL).unwrap();
    assert_eq!(hour.len(), 60);
    sched::send(&tw.deps, "minutely", &s, &hour, true).await.unwrap();
    let got = submit_sent(&tw).await;
    assert!(got.iter().all(|g| matches!(g, Submitted::Created(_))), "buffer_all: every instant is a task: {got:?}");
    let state = sas_core::keys::state(&tw.deps, "key:schedule:minutely").await.unwrap().unwrap();
    let first = schedules::task_id("minutely", hour[0]);
    assert_eq!(state.holders.keys().cloned().collect::<Vec<_>>(), vec![first], "the first instant runs");
    let line: Vec<String> = hour[1..].iter().map(|at| schedules::task_id("minutely", *at)).collect();
    assert_eq!(state.line(), line.iter().map(String::as_str).collect::<Vec<_>>(), "the others wait, in order");
    // the same hour again: nothing new
    sched::send(&tw.deps, "minutely", &s, &hour, true).await.unwrap();
    let again = submit_sent(&tw).await;
    assert!(again.iter().all(|g| matches!(g, Submitted::Duplicate(_))), "{again:?}");
}

#[tokio::test]
async fn a_paused_schedule_sends_nothing_and_its_overlap_is_read_from_the_schedule() {
    let tw = twins();
    create(&tw, "p", Overlap::AllowAll).await;
    edit(&tw.deps, |all, _| {
        all.schedules.get_mut("p").unwrap().paused = Some("maintenance".into());
        Ok(())
    })
    .await
    .unwrap()
    .unwrap();
    tw.clock.advance(10 * MIN);
    assert_eq!(supervisor::sweep(&tw.deps).await.scheduled, 0);
    // a message that claims to be an instant of "p" under another policy changes nothing: the
    // schedule says allow_all, so no key; of a schedule that does not exist, no key either
    for (id, name) in [("forged-1", "p"), ("forged-2", "none")] {
        let body = json!({"v": 1, "task_id": id, "workflow": "report", "input": {},
                          "schedule": {"name": name, "at": T0}});
        submitter::submit(&tw.deps, &body.to_string()).await.unwrap();
        assert!(task(&tw, id).await.unwrap().slot.is_none(), "{id}");
    }
    let body = json!({"v": 1, "workflow": "report", "schedule": {"name": "p", "at": T0, "overlap": "cancel_previous"}});
    let got = submitter::submit(&tw.deps, &body.to_string()).await.unwrap();
    assert!(matches!(got, Submitted::Rejected(Rejection::Shape(_))), "unknown fields are refused: {got:?}");
    assert_eq!(task(&tw, "forged-1").await.unwrap().process_state, ProcessState::Processing);
}
