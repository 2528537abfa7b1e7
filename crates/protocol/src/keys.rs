//! Concurrency keys: at most `limit` tasks of one key run at once (`concurrency` in a workflow);
//! the others wait in submission order and start when a task of their key ends.
//!
//! **The key item.** A key has one item in the task table (`TaskId` = `key:{scope}:{value}`,
//! [`key_item`]) holding its slots ([`KeyState`]): the tasks that hold one (`Holders`, task to
//! the instant it was granted), the tasks that wait (`Waiting`, task to its place in line), and
//! a version (`Ver`) every write is conditional on. The decisions are here, pure; the store reads
//! the item, applies one and writes it back with a conditional write, re-deciding on a lost one.
//!
//! **The life of a slot.** A submission enters its key before its task is created
//! ([`enter`]): granted, the task is created with its first step claimed, as any task;
//! waiting, it is created waiting (`Slot.Waiting`), with no run message, and its `CompleteBy` is
//! only the Supervisor's check of the key (see below). A task that ends, in any way, gives its
//! slot back in the effects of the write that ends it ([`release`]), and that release grants the
//! slot to the first task in line, which is sent its run message. A grant is made in the write
//! that frees the slot: no task polls for one.
//!
//! **Recovery.** A function can die between two writes: after entering a key but before
//! creating the task (the submission comes back and enters again: entering is idempotent), after
//! ending a task but before its release (the message comes back and the release is owed again),
//! or after a grant but before the run message. The backstop is a waiting task's `CompleteBy`:
//! when it passes, the Supervisor checks its key ([`recover`]): holders that ended or never came
//! to be are removed, free slots are granted, granted tasks that still wait are sent their run
//! message again. A waiting task that its key no longer lists (replaced, its cancel lost) is
//! cancelled.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::condition::{DataPath, Scope};
use crate::ids::Millis;
pub use crate::workflow::MAX_KEY_LIMIT;
use crate::workflow::{Concurrency, WhenBusy, WorkflowDef};

/// `TaskId` prefix of the key items (`:` never appears in a task id).
pub const KEY_PREFIX: &str = "key:";

/// How many tasks may wait on one key: one item holds them (about 100 bytes each).
pub const MAX_WAITING: usize = 1_000;

/// The longest key value, in bytes.
pub const MAX_KEY_VALUE_BYTES: usize = 256;

/// How long a holder whose task does not exist keeps its slot: a submission enters its key before
/// its task is created, and comes back to create it if its function died in between (SQS
/// redelivers it within its visibility timeout, a few times).
pub const ORPHAN_GRACE_MS: u64 = 15 * 60_000;

/// The highest priority a submission may give (0, the default, is the lowest).
pub const MAX_PRIORITY: u8 = 9;

/// What one level of priority is worth in a key's line: a task of priority `p` goes before the
/// tasks of a lower priority `q` submitted less than `(p - q)` steps before it. So a task is
/// never starved: it waits at most `(9 - q)` steps longer than it would in submission order.
pub const PRIORITY_STEP_MS: u64 = 60_000;

/// A waiting task's place in its key's line: `at`, its submission time less its priority's
/// worth (the lowest goes first), then `seq`, the order of arrival.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Place {
    pub at: Millis,
    pub seq: u64,
    /// Its priority, when not 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u8,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(p: &u8) -> bool {
    *p == 0
}

/// A key's slots, as its item holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeyState {
    /// The tasks that hold a slot, and when each was granted it.
    #[serde(default)]
    pub holders: BTreeMap<String, Millis>,
    /// The tasks that wait, and their place in line (the lowest goes first).
    #[serde(default)]
    pub waiting: BTreeMap<String, Place>,
    /// The last place given.
    #[serde(default)]
    pub seq: u64,
    /// The limit of the last task that entered (workflows of one scope may differ).
    #[serde(default)]
    pub limit: u32,
    /// +1 per write; each write is conditional on the value it read.
    #[serde(default)]
    pub ver: u64,
}

impl KeyState {
    /// The waiting tasks in line order.
    pub fn line(&self) -> Vec<&str> {
        let mut w: Vec<(&Place, &String)> = self.waiting.iter().map(|(t, p)| (p, t)).collect();
        w.sort();
        w.into_iter().map(|(_, t)| t.as_str()).collect()
    }

    /// Grant free slots to the tasks first in line; the tasks granted, to be sent their run message.
    fn promote(&mut self, now: Millis) -> Vec<String> {
        let mut granted = Vec::new();
        while self.holders.len() < self.limit.max(1) as usize {
            let Some(first) = self.line().first().map(|s| (*s).to_owned()) else { break };
            self.waiting.remove(&first);
            self.holders.insert(first.clone(), now);
            granted.push(first);
        }
        granted
    }
}

/// What a submission got from its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entered {
    /// It holds a slot: create the task with its first step claimed.
    Granted,
    /// It waits, with `ahead` tasks before it: create it waiting.
    Waiting { ahead: usize },
    /// The key is busy and its workflow refuses (or too many wait): create nothing.
    Refused(String),
}

/// A decision on a key item: what to write (nothing when `None`), what the submission got, the
/// tasks granted a slot (to be sent their run message) and the tasks to cancel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub write: Option<KeyState>,
    pub entered: Entered,
    pub granted: Vec<String>,
    pub cancel: Vec<String>,
}

/// The task id of the key item of a submission of `def` with `input`, or `None` when its workflow
/// has no key. The error says why the input names no key (the submission is refused).
pub fn key_item(def: &WorkflowDef, input: &Value) -> Result<Option<String>, String> {
    let Some(c) = &def.concurrency else { return Ok(None) };
    let path = DataPath::parse(&c.key).map_err(|e| format!("concurrency.key {}: {e}", c.key))?;
    let value = match path.resolve(&InputOnly(input)) {
        Some(Value::String(s)) => s.clone(),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
        Some(other) => {
            return Err(format!(
                "the workflow's concurrency key {} is {}; it must be a string, a number or a boolean",
                c.key,
                type_name(other)
            ))
        }
        None => return Err(format!("the workflow's concurrency key {} names nothing in the input", c.key)),
    };
    if value.len() > MAX_KEY_VALUE_BYTES {
        return Err(format!(
            "the workflow's concurrency key {} is {} bytes; a key is at most {MAX_KEY_VALUE_BYTES}",
            c.key,
            value.len()
        ));
    }
    let scope = c.scope.as_deref().unwrap_or(&def.name);
    Ok(Some(format!("{KEY_PREFIX}{scope}:{value}")))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
        Value::String(_) | Value::Number(_) | Value::Bool(_) => "a scalar",
    }
}

struct InputOnly<'a>(&'a Value);

impl Scope for InputOnly<'_> {
    fn input(&self) -> &Value {
        self.0
    }
    fn output(&self, _: &str) -> Option<&Value> {
        None
    }
}

/// A submission of task `task` enters its key (`read`: the item as it is, if it exists). Entering
/// again (the submission came back) finds its own entry and writes nothing. Free slots go to the
/// tasks in line before the newcomer, so a grant whose release was lost never lets a newcomer pass.
pub fn enter(read: Option<&KeyState>, key: &str, task: &str, c: &Concurrency, priority: u8, now: Millis) -> Decided {
    let mut s = read.cloned().unwrap_or_default();
    let nothing = |entered| Decided { write: None, entered, granted: Vec::new(), cancel: Vec::new() };
    if s.holders.contains_key(task) {
        return nothing(Entered::Granted);
    }
    if s.waiting.contains_key(task) {
        let ahead = s.line().iter().take_while(|t| **t != task).count();
        return nothing(Entered::Waiting { ahead });
    }
    s.limit = c.limit;
    let granted = s.promote(now);
    let mut cancel = Vec::new();
    let entered = if s.holders.len() < c.limit as usize {
        s.holders.insert(task.to_owned(), now);
        Entered::Granted
    } else {
        let running = s.holders.len();
        match c.when_busy {
            WhenBusy::Refuse => Entered::Refused(format!(
                "its concurrency key {key} runs {running} task(s), its limit; the workflow's when_busy is refuse"
            )),
            WhenBusy::Wait if s.waiting.len() >= MAX_WAITING => Entered::Refused(format!(
                "{} tasks wait on its concurrency key {key} already, the most one key takes",
                s.waiting.len()
            )),
            WhenBusy::Wait => Entered::Waiting { ahead: 0 },
            WhenBusy::Replace => {
                cancel.extend(std::mem::take(&mut s.waiting).into_keys());
                Entered::Waiting { ahead: 0 }
            }
            WhenBusy::Cancel => {
                cancel.extend(std::mem::take(&mut s.waiting).into_keys());
                cancel.extend(s.holders.keys().cloned());
                Entered::Waiting { ahead: 0 }
            }
        }
    };
    if matches!(entered, Entered::Waiting { .. }) {
        s.seq += 1;
        let priority = priority.min(MAX_PRIORITY);
        let at = Millis(now.0.saturating_sub(u64::from(priority) * PRIORITY_STEP_MS));
        s.waiting.insert(task.to_owned(), Place { at, seq: s.seq, priority });
    }
    if matches!(entered, Entered::Refused(_)) && granted.is_empty() {
        return nothing(entered);
    }
    let entered = match entered {
        Entered::Waiting { .. } => Entered::Waiting { ahead: s.line().iter().take_while(|t| **t != task).count() },
        other => other,
    };
    s.ver += 1;
    Decided { write: Some(s), entered, granted, cancel }
}

/// Task `task` ended (or was cancelled while it waited): its slot, or its place in line, is given
/// back, and free slots go to the first in line. `None`: nothing to write (released already).
pub fn release(read: &KeyState, task: &str, now: Millis) -> Option<(KeyState, Vec<String>)> {
    forget(read, &BTreeSet::from([task.to_owned()]), now)
}

/// The Supervisor's check of a key: `gone` are the tasks it lists that ended or never came to be
/// (see [`is_gone`]); they are removed and free slots granted. `None`: nothing to write.
pub fn recover(read: &KeyState, gone: &BTreeSet<String>, now: Millis) -> Option<(KeyState, Vec<String>)> {
    forget(read, gone, now)
}

fn forget(read: &KeyState, tasks: &BTreeSet<String>, now: Millis) -> Option<(KeyState, Vec<String>)> {
    let mut s = read.clone();
    for t in tasks {
        s.holders.remove(t);
        s.waiting.remove(t);
    }
    let granted = s.promote(now);
    if s == *read {
        return None;
    }
    s.ver += 1;
    Some((s, granted))
}

/// Whether a task a key lists no longer needs it: it ended, or it does not exist and its entry is
/// older than [`ORPHAN_GRACE_MS`] (its submission never created it). `since`: when it entered
/// (granted) or `None` for a waiting task (its place says nothing of time: it waits as long as
/// its line does, so only an ended task leaves the line this way).
pub fn is_gone(task_state: Option<crate::state::ProcessState>, since: Option<Millis>, now: Millis) -> bool {
    match task_state {
        Some(s) => s.is_terminal(),
        None => since.is_some_and(|at| at.plus_ms(ORPHAN_GRACE_MS) <= now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ProcessState::{Pending, Processed};

    fn conc(limit: u32, when_busy: WhenBusy) -> Concurrency {
        Concurrency { key: "$.input.account".into(), limit, when_busy, scope: None }
    }

    fn apply(s: &mut KeyState, d: &Decided) {
        if let Some(w) = &d.write {
            *s = w.clone();
        }
    }

    #[test]
    fn tasks_beyond_the_limit_wait_in_order_and_each_release_grants_the_first() {
        let c = conc(2, WhenBusy::Wait);
        let mut s = KeyState::default();
        for (i, t) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            let d = enter(Some(&s), "k", t, &c, 0, Millis(i as u64));
            let want = if i < 2 { Entered::Granted } else { Entered::Waiting { ahead: i - 2 } };
            assert_eq!(d.entered, want, "{t}");
            apply(&mut s, &d);
        }
        assert_eq!(s.line(), vec!["c", "d", "e"]);
        let (s2, granted) = release(&s, "b", Millis(10)).unwrap();
        assert_eq!(granted, vec!["c".to_owned()]);
        assert_eq!(s2.holders.keys().collect::<Vec<_>>(), vec!["a", "c"]);
        assert_eq!(s2.ver, s.ver + 1);
        assert!(release(&s2, "b", Millis(11)).is_none(), "a second release writes nothing");
        // a waiting task cancelled leaves the line and grants nothing
        let (s3, granted) = release(&s2, "d", Millis(12)).unwrap();
        assert!(granted.is_empty());
        assert_eq!(s3.line(), vec!["e"]);
    }

    #[test]
    fn entering_again_writes_nothing_and_says_the_same() {
        let c = conc(1, WhenBusy::Wait);
        let mut s = KeyState::default();
        let d = enter(Some(&s), "k", "a", &c, 0, Millis(1));
        apply(&mut s, &d);
        let d = enter(Some(&s), "k", "b", &c, 0, Millis(2));
        apply(&mut s, &d);
        let again = enter(Some(&s), "k", "a", &c, 0, Millis(3));
        assert_eq!((again.write, again.entered), (None, Entered::Granted));
        let again = enter(Some(&s), "k", "b", &c, 0, Millis(3));
        assert_eq!((again.write, again.entered), (None, Entered::Waiting { ahead: 0 }));
    }

    #[test]
    fn a_free_slot_goes_to_the_line_before_a_newcomer() {
        let c = conc(1, WhenBusy::Wait);
        let mut s = KeyState { limit: 1, ..KeyState::default() };
        s.waiting.insert("old".into(), Place { at: Millis(0), seq: 1, priority: 0 });
        s.seq = 1;
        let d = enter(Some(&s), "k", "new", &c, 0, Millis(5));
        assert_eq!(d.granted, vec!["old".to_owned()]);
        assert_eq!(d.entered, Entered::Waiting { ahead: 0 });
        assert_eq!(d.write.unwrap().line(), vec!["new"]);
    }

    #[test]
    fn the_strategies_refuse_replace_and_cancel() {
        let mut s = KeyState::default();
        let d = enter(Some(&s), "k", "run", &conc(1, WhenBusy::Wait), 0, Millis(1));
        apply(&mut s, &d);
        let d = enter(Some(&s), "k", "w1", &conc(1, WhenBusy::Wait), 0, Millis(2));
        apply(&mut s, &d);
        let refused = enter(Some(&s), "k", "x", &conc(1, WhenBusy::Refuse), 0, Millis(3));
        assert!(matches!(refused.entered, Entered::Refused(ref why) if why.contains("when_busy is refuse")));
        assert_eq!(refused.write, None, "a refusal writes nothing");
        let replaced = enter(Some(&s), "k", "w2", &conc(1, WhenBusy::Replace), 0, Millis(3));
        assert_eq!(replaced.cancel, vec!["w1".to_owned()]);
        assert_eq!(replaced.write.as_ref().unwrap().line(), vec!["w2"]);
        assert!(replaced.write.as_ref().unwrap().holders.contains_key("run"), "the running task runs on");
        let cancelled = enter(Some(&s), "k", "w3", &conc(1, WhenBusy::Cancel), 0, Millis(3));
        assert_eq!(cancelled.cancel, vec!["w1".to_owned(), "run".to_owned()]);
        let w = cancelled.write.unwrap();
        assert_eq!(w.line(), vec!["w3"]);
        assert!(w.holders.contains_key("run"), "a cancelled holder keeps its slot until it has ended");
    }

    #[test]
    fn priority_moves_a_task_ahead_by_its_worth_in_time_and_no_further() {
        let c = conc(1, WhenBusy::Wait);
        let mut s = KeyState::default();
        let min = PRIORITY_STEP_MS;
        let at = |s: &mut KeyState, t: &str, p: u8, ms: u64| {
            let d = enter(Some(s), "k", t, &c, p, Millis(1_700_000_000_000 + ms));
            *s = d.write.unwrap();
            d.entered
        };
        assert_eq!(at(&mut s, "run", 0, 0), Entered::Granted);
        at(&mut s, "low-old", 0, 0);
        at(&mut s, "low-new", 0, 10 * min);
        // priority 9 submitted 5 minutes after low-old passes it, and low-new
        assert_eq!(at(&mut s, "high", 9, 5 * min), Entered::Waiting { ahead: 0 });
        // priority 1 submitted 2 minutes after low-old does not pass it (it is worth one minute)
        assert_eq!(at(&mut s, "one", 1, 2 * min), Entered::Waiting { ahead: 2 });
        assert_eq!(s.line(), vec!["high", "low-old", "one", "low-new"]);
        // a task of priority 9 submitted 10 minutes after low-old comes after it (never starved),
        // and after one (worth the same instant, it came first), but before low-new
        at(&mut s, "late-high", 9, 10 * min);
        assert_eq!(s.line(), vec!["high", "low-old", "one", "late-high", "low-new"]);
        assert_eq!(s.waiting["high"].priority, 9);
    }

    #[test]
    fn a_full_line_refuses() {
        let c = conc(1, WhenBusy::Wait);
        let mut s = KeyState { limit: 1, ..KeyState::default() };
        s.holders.insert("run".into(), Millis(0));
        for i in 0..MAX_WAITING {
            s.waiting.insert(format!("w{i}"), Place { at: Millis(0), seq: i as u64, priority: 0 });
        }
        assert!(matches!(enter(Some(&s), "k", "late", &c, 0, Millis(1)).entered, Entered::Refused(_)));
    }

    #[test]
    fn recovery_removes_ended_and_orphaned_holders_and_grants_their_slots() {
        let c = conc(2, WhenBusy::Wait);
        let mut s = KeyState::default();
        for t in ["a", "b", "c", "d"] {
            let d = enter(Some(&s), "k", t, &c, 0, Millis(0));
            apply(&mut s, &d);
        }
        let now = Millis(ORPHAN_GRACE_MS);
        assert!(is_gone(Some(Processed), Some(Millis(0)), Millis(1)));
        assert!(!is_gone(Some(Pending), Some(Millis(0)), now));
        assert!(!is_gone(None, Some(Millis(1)), now), "a fresh entry may yet be created");
        assert!(is_gone(None, Some(Millis(0)), now));
        assert!(!is_gone(None, None, now), "a waiting task that does not exist is not judged by time");
        let (s2, granted) = recover(&s, &BTreeSet::from(["a".to_owned(), "b".to_owned()]), now).unwrap();
        assert_eq!(granted, vec!["c".to_owned(), "d".to_owned()]);
        assert!(s2.waiting.is_empty());
        assert!(recover(&s2, &BTreeSet::new(), now).is_none());
    }

    #[test]
    fn a_key_is_read_from_the_input_and_scoped() {
        let mut def: WorkflowDef = serde_json::from_value(serde_json::json!({
            "name": "orders", "version": 1, "steps": [{"name": "a", "agent": "x"}],
            "concurrency": {"key": "$.input.account"}
        }))
        .unwrap();
        assert_eq!(key_item(&def, &serde_json::json!({"account": "acme"})).unwrap().unwrap(), "key:orders:acme");
        assert_eq!(key_item(&def, &serde_json::json!({"account": 42})).unwrap().unwrap(), "key:orders:42");
        let missing = key_item(&def, &serde_json::json!({})).unwrap_err();
        assert!(missing.contains("names nothing"), "{missing}");
        let object = key_item(&def, &serde_json::json!({"account": {}})).unwrap_err();
        assert!(object.contains("must be a string"), "{object}");
        def.concurrency.as_mut().unwrap().scope = Some("accounts".into());
        assert_eq!(key_item(&def, &serde_json::json!({"account": "acme"})).unwrap().unwrap(), "key:accounts:acme");
        def.concurrency = None;
        assert_eq!(key_item(&def, &serde_json::json!({})).unwrap(), None);
    }
}
