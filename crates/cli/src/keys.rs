//! `sasctl key`: a concurrency key as its item holds it: the tasks that run (with where each
//! is), the line of those that wait (first in line first, with its priority and how long it has
//! waited). Two requests: the key item, and one `BatchGetItem` of the tasks that run.

use std::fmt::Write as _;

use sas_core::deps::Deps;
use sas_core::store::StoreError;
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::keys::{KeyState, KEY_PREFIX};
use sas_protocol::protocol::Task;

/// The key item's id for `key`: a full id (`key:orders:acme`) as given, else `scope` and `value`.
pub fn item_id(scope: &str, value: &str) -> String {
    format!("{KEY_PREFIX}{scope}:{value}")
}

/// Read key item `key` and the tasks that hold its slots; `None` when the key has no item (no
/// task of it was ever submitted).
pub async fn look(deps: &Deps, key: &str) -> Result<Option<(KeyState, Vec<Task>)>, StoreError> {
    let Some(state) = deps.keys.load_key(key).await? else { return Ok(None) };
    let ids: Vec<TaskId> = state.holders.keys().filter_map(|h| TaskId::try_from(h.as_str()).ok()).collect();
    let running = if ids.is_empty() { Vec::new() } else { deps.store.get_many(&ids).await? };
    Ok(Some((state, running)))
}

/// How long from `from` to `now`, as a person reads it.
fn span(from: Millis, now: Millis) -> String {
    let s = from.until(now) / 1_000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3_599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3_600, (s % 3_600) / 60),
    }
}

/// What `sasctl key` prints.
pub fn describe(key: &str, state: &KeyState, running: &[Task], now: Millis) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{key}: {} running (limit {}), {} waiting",
        state.holders.len(),
        state.limit,
        state.waiting.len()
    );
    for (holder, since) in &state.holders {
        let line = match running.iter().find(|t| t.task_id.as_str() == holder) {
            None => "no such task (its submission has not created it yet, or it expired): the Supervisor's check takes the slot back after 15 min".to_owned(),
            Some(t) if t.process_state.is_terminal() => {
                format!("{}: ended, its slot not given back yet (its release comes again, or the Supervisor's check takes it)", t.process_state)
            }
            Some(t) if t.waits_for_slot() => "granted, its run on the way".to_owned(),
            Some(t) => format!("{} at {}", t.process_state, t.current_step_name().unwrap_or("-")),
        };
        let _ = writeln!(out, "  running  {holder}  {line}  (granted {} ago)", span(*since, now));
    }
    for (i, task) in state.line().into_iter().enumerate() {
        let place = state.waiting[task];
        let priority = if place.priority > 0 { format!("  priority {}", place.priority) } else { String::new() };
        let since = Millis(place.at.0 + u64::from(place.priority) * sas_protocol::keys::PRIORITY_STEP_MS);
        let _ = writeln!(out, "  {:>7}  {task}{priority}  (waiting {})", format!("#{}", i + 1), span(since, now));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_protocol::keys::Place;
    use sas_protocol::protocol::{submit_in_slot, submit_waiting, Ctx, Policy};
    use sas_protocol::workflow::StepDef;

    #[test]
    fn a_key_is_told_with_its_running_tasks_and_its_line() {
        let t0 = Millis(1_700_000_000_000);
        let wf = sas_protocol::workflow::WorkflowDef {
            name: "orders".into(),
            version: 1,
            description: String::new(),
            on_failure: sas_protocol::workflow::OnFailure::Compensate,
            steps: vec![StepDef::call("charge", "sim", 5_000)],
            result: None,
            concurrency: None,
        };
        let key = item_id("orders", "acme");
        let ctx = Ctx::at(t0);
        let id = |s: &str| TaskId::try_from(s).unwrap();
        let run = submit_in_slot(
            id("t1"),
            wf.clone(),
            serde_json::json!({}),
            None,
            Some(key.clone()),
            &ctx,
            &Policy::default(),
        );
        let granted = submit_waiting(id("t2"), wf, serde_json::json!({}), None, key.clone(), &ctx, &Policy::default());
        let mut state = KeyState { limit: 2, ver: 7, seq: 3, ..KeyState::default() };
        state.holders.insert("t1".into(), t0);
        state.holders.insert("t2".into(), t0.plus_ms(1_000));
        state.holders.insert("ghost".into(), t0);
        state.waiting.insert("t3".into(), Place { at: t0, seq: 2, priority: 0 });
        state.waiting.insert("t4".into(), Place { at: Millis(t0.0 - 9 * 60_000 + 30_000), seq: 3, priority: 9 });
        let text = describe(&key, &state, &[run.task, granted.task], t0.plus_ms(90_000));
        assert!(text.starts_with("key:orders:acme: 3 running (limit 2), 2 waiting\n"), "{text}");
        assert!(text.contains("running  t1  Processing at charge  (granted 1 min 30 s ago)"), "{text}");
        assert!(text.contains("running  t2  granted, its run on the way"), "{text}");
        assert!(text.contains("running  ghost  no such task"), "{text}");
        let first = text.find("#1  t4  priority 9  (waiting 1 min 0 s)").expect(&text);
        let second = text.find("#2  t3  (waiting 1 min 30 s)").expect(&text);
        assert!(first < second, "{text}");
    }
}
