//! Concurrency keys at the Submitter, on the twins: a granted task starts, the others wait in the
//! key's line ordered by priority, a release grants the first in line its run; a busy key under
//! `refuse` answers `Rejected` and keeps nothing in the DLQ; a priority out of range, or an input
//! that names no key, is refused with the reason; entering again writes nothing.

use serde_json::json;

use sas_core::config::Settings;
use sas_core::keys;
use sas_core::submitter::{self, Rejection, Submitted};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::SchedulerMessage;
use sas_protocol::protocol::ProcessState;
use sas_protocol::workflow::{WorkflowDef, WorkflowRegistry};
use sas_testkit::twins::Twins;

fn twins() -> Twins {
    let def = |name: &str, when_busy: &str| -> WorkflowDef {
        serde_json::from_value(json!({
            "name": name, "version": 1,
            "concurrency": {"key": "$.input.account", "limit": 1, "when_busy": when_busy},
            "steps": [{"name": "a", "agent": "sim", "timeout_ms": 5_000}]
        }))
        .unwrap()
    };
    let workflows = WorkflowRegistry::new([def("keyed", "wait"), def("strict", "refuse")]).unwrap();
    Twins::new(workflows, Settings::default(), Millis(1_700_000_000_000))
}

#[allow(clippy::needless_pass_by_value)]
fn submission(id: &str, workflow: &str, input: serde_json::Value, priority: Option<u8>) -> String {
    let mut body = json!({"v": 1, "task_id": id, "workflow": workflow, "input": input});
    if let Some(p) = priority {
        body["priority"] = json!(p);
    }
    body.to_string()
}

fn runs(tw: &Twins) -> Vec<String> {
    tw.bus
        .take(&tw.deps.resources.scheduler_queue_url)
        .iter()
        .filter_map(|b| match serde_json::from_str(b).unwrap() {
            SchedulerMessage::Run(r) => Some(r.task_id.to_string()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_first_runs_the_others_wait_by_priority_and_a_release_grants_the_first_in_line() {
    let tw = twins();
    let acme = json!({"account": "acme"});
    for (id, p) in [("a", None), ("b", None), ("c", Some(9)), ("d", Some(0))] {
        let got = submitter::submit(&tw.deps, &submission(id, "keyed", acme.clone(), p)).await.unwrap();
        assert!(matches!(got, Submitted::Created(_)), "{id}: {got:?}");
        tw.clock.advance(1_000);
    }
    let task = |id: &str| {
        let id = TaskId::try_from(id).unwrap();
        let tw = tw.clone();
        async move { tw.deps.store.get(&id).await.unwrap().unwrap() }
    };
    let a = task("a").await;
    assert!(a.lock.locked_by.is_some() && !a.waits_for_slot(), "a holds the slot and runs");
    for id in ["b", "c", "d"] {
        let t = task(id).await;
        assert!(t.waits_for_slot() && t.lock.locked_by.is_none(), "{id} waits");
        assert_eq!(t.process_state, ProcessState::Pending);
        assert!(t.reason.as_deref().is_some_and(|r| r.contains("key:keyed:acme")), "{:?}", t.reason);
    }
    let state = keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap();
    assert_eq!(state.line(), vec!["c", "b", "d"], "priority 9 first, then in order of arrival");
    assert!(runs(&tw).is_empty(), "no run for a waiting task");

    // a submission that comes back enters again and writes nothing
    submitter::submit(&tw.deps, &submission("b", "keyed", acme.clone(), None)).await.unwrap();
    assert_eq!(keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap(), state);

    // a ends: its release grants c, which is sent its run
    keys::release(&tw.deps, "key:keyed:acme", &TaskId::try_from("a").unwrap()).await.unwrap();
    assert_eq!(runs(&tw), vec!["c".to_owned()]);
    let state = keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap();
    assert_eq!(state.holders.keys().map(String::as_str).collect::<Vec<_>>(), vec!["c"]);
    assert_eq!(state.line(), vec!["b", "d"]);
    // another key is free
    let got = submitter::submit(&tw.deps, &submission("e", "keyed", json!({"account": 7}), None)).await.unwrap();
    assert!(matches!(got, Submitted::Created(_)));
    assert!(!task("e").await.waits_for_slot());
}

#[tokio::test]
async fn a_busy_key_that_refuses_and_bad_submissions_are_rejected_with_the_reason() {
    let tw = twins();
    let acme = json!({"account": "acme"});
    submitter::submit(&tw.deps, &submission("s1", "strict", acme.clone(), None)).await.unwrap();
    let got = submitter::submit(&tw.deps, &submission("s2", "strict", acme.clone(), None)).await.unwrap();
    assert!(
        matches!(&got, Submitted::Rejected(Rejection::Busy(why)) if why.contains("when_busy is refuse")),
        "{got:?}"
    );
    assert!(tw.deps.store.get(&TaskId::try_from("s2").unwrap()).await.unwrap().is_none(), "nothing created");
    assert!(tw.bus.take(&tw.deps.resources.submission_dlq_url).is_empty(), "a busy key is no mistake of the message");

    let got = submitter::submit(&tw.deps, &submission("s3", "keyed", json!({"customer": 1}), None)).await.unwrap();
    assert!(matches!(&got, Submitted::Rejected(Rejection::Key(why)) if why.contains("names nothing")), "{got:?}");
    let got = submitter::submit(&tw.deps, &submission("s4", "keyed", acme, Some(12))).await.unwrap();
    assert!(matches!(&got, Submitted::Rejected(Rejection::Shape(why)) if why.contains("priority is 12")), "{got:?}");
    assert_eq!(tw.bus.take(&tw.deps.resources.submission_dlq_url).len(), 2, "both kept in the DLQ with their reason");
}

/// A crash between a task's end and its release leaves its slot held by an ended task: the
/// Supervisor's check of a waiting task's key (at its `CompleteBy`) takes the slot back and grants
/// it. A waiting task its key no longer lists (replaced, its cancel lost) is cancelled there.
#[tokio::test]
async fn the_supervisor_s_check_of_a_waiting_task_s_key_recovers_a_lost_release_and_an_unlisted_task() {
    use sas_core::store::{StoreError, StoreOp};
    use sas_protocol::messages::{TimerMessage, VERSION};
    use sas_protocol::protocol::Event;
    let tw = twins();
    let acme = json!({"account": "acme"});
    for id in ["a", "b"] {
        submitter::submit(&tw.deps, &submission(id, "keyed", acme.clone(), None)).await.unwrap();
    }
    let get = |id: &str| {
        let (tw, id) = (tw.clone(), TaskId::try_from(id).unwrap());
        async move { tw.deps.store.get(&id).await.unwrap().unwrap() }
    };
    // a is cancelled; its release fails (the key item cannot be read): the message would come
    // back, but say it is lost
    tw.store.fail_next(StoreOp::Key, StoreError::Backend { op: "GetItem", message: "lost".into(), source: None });
    let cancel = Event::Cancel { reason: "test".into(), run: None };
    let _ = sas_core::effects::drive(&tw.deps, get("a").await, &cancel, None).await;
    assert_eq!(get("a").await.process_state, ProcessState::Cancelled);
    let state = keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap();
    assert!(state.holders.contains_key("a"), "the release was lost: {state:?}");
    runs(&tw);
    // b's check comes due: the ended holder's slot is taken back and granted to b
    let b = get("b").await;
    let due = b.complete_by.unwrap();
    tw.clock.set(due.plus_ms(60_000));
    let timer = TimerMessage { v: VERSION, task_id: b.task_id.clone(), attempt: None, complete_by: due };
    sas_core::supervisor::handle_timer(&tw.deps, timer, None).await.unwrap();
    assert_eq!(runs(&tw), vec!["b".to_owned()], "b is sent its run");
    let state = keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap();
    assert_eq!(state.holders.keys().map(String::as_str).collect::<Vec<_>>(), vec!["b"]);
    let b = get("b").await;
    assert!(b.waits_for_slot() && b.complete_by > Some(due), "b waits for its run, its next check set");

    // a waiting task that its key does not list is cancelled at its check
    submitter::submit(&tw.deps, &submission("c", "keyed", acme.clone(), None)).await.unwrap();
    let (write, _) = sas_protocol::keys::release(
        &keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap(),
        "c",
        tw.deps.now(),
    )
    .unwrap();
    let current = keys::state(&tw.deps, "key:keyed:acme").await.unwrap().unwrap();
    assert!(tw.deps.keys.save_key("key:keyed:acme", &write, Some(current.ver)).await.unwrap());
    let c = get("c").await;
    let due = c.complete_by.unwrap();
    tw.clock.set(due.plus_ms(60_000));
    let timer = TimerMessage { v: VERSION, task_id: c.task_id.clone(), attempt: None, complete_by: due };
    sas_core::supervisor::handle_timer(&tw.deps, timer, None).await.unwrap();
    let c = get("c").await;
    assert_eq!(c.process_state, ProcessState::Cancelled, "{:?}", c.reason);
    assert!(c.reason.as_deref().is_some_and(|r| r.contains("lists it no more")), "{:?}", c.reason);
}

/// A grant whose run was lost (sent before its task existed, or its sender died) is found by the
/// waiting task's own submission when it comes back: it sends the run, instead of leaving it to
/// the Supervisor's check minutes later. (The Submitter makes the same look right after creating a
/// waiting task, for a grant made between its entry and its creation.)
#[tokio::test]
async fn a_grant_whose_run_was_lost_is_started_when_the_submission_comes_back() {
    let tw = twins();
    let acme = json!({"account": "acme"});
    submitter::submit(&tw.deps, &submission("a", "keyed", acme.clone(), None)).await.unwrap();
    submitter::submit(&tw.deps, &submission("b", "keyed", acme.clone(), None)).await.unwrap();
    let b = TaskId::try_from("b").unwrap();
    assert!(tw.deps.store.get(&b).await.unwrap().unwrap().waits_for_slot());
    keys::release(&tw.deps, "key:keyed:acme", &TaskId::try_from("a").unwrap()).await.unwrap();
    assert_eq!(runs(&tw), vec!["b".to_owned()], "the grant's run (taken away here: lost)");
    let again = submitter::submit(&tw.deps, &submission("b", "keyed", acme, None)).await.unwrap();
    assert!(matches!(again, Submitted::Duplicate(_)), "{again:?}");
    assert_eq!(runs(&tw), vec!["b".to_owned()], "sent again by the submission that came back");
}

/// An operator's pause of one key (`sasctl pause --key keyed:acme`): a task of that key is
/// created parked (no run), one of another key runs; resumed, the parked task's look at the pause
/// (its `CompleteBy`) sends its run.
#[tokio::test]
async fn a_paused_key_parks_its_tasks_and_a_resume_runs_them() {
    use sas_core::store::{Paused, Pauses};
    use sas_protocol::messages::{TimerMessage, VERSION};
    let tw = twins();
    let mut pauses = Pauses::default();
    pauses.keys.insert("key:keyed:acme".into(), Paused { reason: "audit".into(), at: tw.deps.now() });
    pauses.ver = 1;
    assert!(tw.deps.pauses.save_pauses(&pauses, None).await.unwrap());
    for (id, account) in [("p1", "acme"), ("p2", "zeta")] {
        let got =
            submitter::submit(&tw.deps, &submission(id, "keyed", json!({"account": account}), None)).await.unwrap();
        assert!(matches!(got, Submitted::Created(_)), "{id}: {got:?}");
    }
    let get = |id: &str| {
        let (tw, id) = (tw.clone(), TaskId::try_from(id).unwrap());
        async move { tw.deps.store.get(&id).await.unwrap().unwrap() }
    };
    let p1 = get("p1").await;
    assert!(p1.claim.paused && p1.lock.locked_by.is_none(), "p1 is parked: {:?}", p1.reason);
    assert!(
        p1.reason.as_deref().is_some_and(|r| r.contains("or its concurrency key key:keyed:acme is paused")),
        "{:?}",
        p1.reason
    );
    assert!(!get("p2").await.claim.paused, "another key runs");
    assert_eq!(runs(&tw), Vec::<String>::new(), "p2 was claimed in its create; p1 has no run");
    // resumed: once the functions' cache of the pauses is old, p1's look sends its run
    pauses.keys.clear();
    pauses.ver = 2;
    assert!(tw.deps.pauses.save_pauses(&pauses, Some(1)).await.unwrap());
    let due = p1.complete_by.expect("its look at the pause");
    let grace = tw.deps.settings.policy.result_grace_ms;
    tw.clock.advance(due.0 - tw.deps.now().0 + grace.max(sas_core::deps::PAUSE_CACHE_MS) + 1);
    let timer = TimerMessage { v: VERSION, task_id: p1.task_id.clone(), attempt: None, complete_by: due };
    sas_core::supervisor::handle_timer(&tw.deps, timer, None).await.unwrap();
    let p1 = get("p1").await;
    assert!(!p1.claim.paused, "{:?}", p1.reason);
    assert_eq!(runs(&tw), vec!["p1".to_owned()], "its run is sent");
}
