//! A saga written the States Language way, recognised: forward tasks whose `Catch` (of every
//! error) enters one chain of undoing tasks, each later forward task entering it nearer its head,
//! the chain ending in a `Fail` (perhaps after a notification). Each forward task's undoing tasks
//! are the chain's part between where its catcher enters and where the task before it enters; it
//! becomes the step's `compensation`, and this project runs the compensations itself, in reverse
//! order, when a step fails for good.
//!
//! ```text
//! Reserve ──▶ Charge ──▶ Ship ──▶ Done            Reserve: compensation Release
//!    │ catch    │ catch    │ catch                Charge:  compensation Refund
//!    ▼          ▼          ▼                       Ship:    none
//!  Release ◀── Refund ◀────┘  (Refund → Release → Notify → Failed)
//! ```

use std::collections::{BTreeMap, HashSet};

use serde_json::{Map, Value};

/// A saga found in a block of states.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Saga {
    /// Forward task → the state that undoes it.
    pub undo: BTreeMap<String, String>,
    /// Every state of the undoing chain and what follows it (the block's walk leaves them out).
    pub chain: HashSet<String>,
    /// Forward task → the catcher (its index) that entered the chain (dropped from the task).
    pub catcher: BTreeMap<String, usize>,
    /// The tasks after the chain (notifications) that the translation does not run.
    pub tail: Vec<String>,
}

fn catches_everything(c: &Value) -> bool {
    c.get("ErrorEquals")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|e| matches!(e.as_str(), Some("States.ALL" | "States.TaskFailed"))))
}

/// The saga of `states` (reached from `start`), if they have that shape.
pub fn recognise(states: &Map<String, Value>, start: &str) -> Option<Saga> {
    // the forward path: from the start along Next
    let mut forward = Vec::new();
    let mut at = Some(start.to_owned());
    let mut seen = HashSet::new();
    while let Some(name) = at {
        if !seen.insert(name.clone()) {
            return None;
        }
        let st = states.get(&name)?;
        if st.get("Type").and_then(Value::as_str) == Some("Task") {
            forward.push(name.clone());
        }
        at = st.get("Next").and_then(Value::as_str).map(str::to_owned);
    }
    // where each forward task's catch-all enters
    let mut entries: Vec<(String, usize, String)> = Vec::new();
    for f in &forward {
        let catchers = states[f].get("Catch").and_then(Value::as_array);
        if let Some((i, c)) = catchers.into_iter().flatten().enumerate().find(|(_, c)| catches_everything(c)) {
            entries.push((f.clone(), i, c.get("Next")?.as_str()?.to_owned()));
        }
    }
    if entries.len() < 2 {
        return None;
    }
    // the chain: from the entry of the last forward task, along Next, tasks without Catch
    let head = entries.last()?.2.clone();
    let mut chain = Vec::new();
    let mut at = Some(head);
    let mut end = None;
    while let Some(name) = at {
        let st = states.get(&name)?;
        match st.get("Type").and_then(Value::as_str) {
            Some("Task") if st.get("Catch").is_none() && !forward.contains(&name) && !chain.contains(&name) => {
                chain.push(name.clone());
                at = st.get("Next").and_then(Value::as_str).map(str::to_owned);
            }
            Some("Fail") => {
                end = Some(name);
                at = None;
            }
            _ => return None,
        }
    }
    let end = end?;
    let pos = |s: &str| chain.iter().position(|c| c == s);
    // each entry nearer the head than the one before it; the last entry's state undoes nothing
    // after it: what lies between one entry and the next undoes the task that enters there
    let mut undo = BTreeMap::new();
    let mut catcher = BTreeMap::new();
    let mut limit = None;
    for (f, i, entry) in &entries {
        let p = pos(entry)?;
        let stop = limit.unwrap_or_else(|| first_notification(states, &chain).unwrap_or(chain.len()));
        if p > stop {
            return None;
        }
        match stop - p {
            0 => {}
            1 => {
                undo.insert(f.clone(), chain[p].clone());
            }
            _ => return None, // several states undo one task: not a per-step compensation
        }
        catcher.insert(f.clone(), *i);
        limit = Some(p);
    }
    // every undoing state is some task's; what follows them is the tail
    let undoing: HashSet<&String> = undo.values().collect();
    let first_tail = chain.iter().position(|c| !undoing.contains(c)).unwrap_or(chain.len());
    if chain[..first_tail].iter().any(|c| !undoing.contains(c))
        || chain[first_tail..].iter().any(|c| undoing.contains(c))
    {
        return None;
    }
    let tail = chain[first_tail..].to_vec();
    let mut all: HashSet<String> = chain.into_iter().collect();
    all.insert(end);
    Some(Saga { undo, chain: all, catcher, tail })
}

/// Where the notifications at the chain's end begin: the first task that sends a message (SNS,
/// SQS, EventBridge) without waiting, with no undoing task after it.
fn first_notification(states: &Map<String, Value>, chain: &[String]) -> Option<usize> {
    let notifies = |s: &String| {
        let r = states[s].get("Resource").and_then(Value::as_str).unwrap_or("");
        ["sns:publish", "sqs:sendMessage", "events:putEvents"].iter().any(|k| r.ends_with(k))
    };
    let first = chain.iter().position(notifies)?;
    chain[first..].iter().all(notifies).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(next: &str, catch: Option<&str>) -> Value {
        let mut t = json!({"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f", "Next": next});
        if let Some(c) = catch {
            t["Catch"] = json!([{"ErrorEquals": ["States.ALL"], "Next": c}]);
        }
        t
    }

    #[test]
    fn the_collection_s_saga_shape_is_per_step_compensation() {
        let states = json!({
            "ReserveFlight": task("ReserveCar", Some("CancelFlight")),
            "ReserveCar": task("Pay", Some("CancelCar")),
            "Pay": task("Confirm", Some("Refund")),
            "Confirm": task("Done", Some("Refund")),
            "Done": {"Type": "Succeed"},
            "Refund": task("CancelCar", None),
            "CancelCar": task("CancelFlight", None),
            "CancelFlight": task("Notify", None),
            "Notify": {"Type": "Task", "Resource": "arn:aws:states:::sns:publish", "Next": "Failed"},
            "Failed": {"Type": "Fail"}
        });
        let s = recognise(states.as_object().unwrap(), "ReserveFlight").expect("a saga");
        let undo: Vec<(&str, &str)> = s.undo.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(undo, vec![("Pay", "Refund"), ("ReserveCar", "CancelCar"), ("ReserveFlight", "CancelFlight")]);
        assert_eq!(s.tail, vec!["Notify".to_owned()]);
        assert!(s.chain.contains("Failed") && s.chain.contains("Refund"));
        assert_eq!(s.catcher.len(), 4);
    }

    #[test]
    fn other_shapes_are_not_a_saga() {
        // an entry further from the head than the one before: not undone in reverse order
        let states = json!({
            "A": task("B", Some("UndoA")),
            "B": task("Done", Some("UndoB")),
            "Done": {"Type": "Succeed"},
            "UndoA": task("UndoB", None),
            "UndoB": task("Failed", None),
            "Failed": {"Type": "Fail"}
        });
        assert_eq!(recognise(states.as_object().unwrap(), "A"), None);
        // the chain does not end in Fail
        let states = json!({
            "A": task("B", Some("UndoA")),
            "B": task("Done", Some("UndoB")),
            "Done": {"Type": "Succeed"},
            "UndoB": task("UndoA", None),
            "UndoA": task("Done", None)
        });
        assert_eq!(recognise(states.as_object().unwrap(), "A"), None);
    }
}
