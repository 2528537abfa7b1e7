//! The wire format of every message is kept, so that a change to it is a decision, not an accident.
//!
//! The functions of two releases run side by side during a deploy (and after a rollback): a
//! message written by one is read by the other. Messages are read strictly (unknown fields are
//! refused), so a field added to a message is refused by every function built before it, and a
//! field renamed or made required makes the new build refuse what the old one wrote. The rule
//! (docs/reference/messages.md, "Compatibility"): the format a message says it is (`"v"`) is the
//! format it is written in; a release reads every format up to its own and refuses a later one
//! with a reason that names it (the message then goes to its DLQ, never misread).
//!
//! This test holds the first half: the JSON Schema of each message kind, as this code derives it
//! (field names, types, which are required, the tags of each kind), must equal the one kept for
//! format `VERSION` in `tests/data/wire/v{VERSION}/`. Comments are left out of the comparison.
//! A change that fails here needs a new format: keep the old files, add `v{N+1}`, and write the
//! new fields only in messages that say `"v": N+1`.
//!
//! `SAS_BLESS=1 cargo nextest run -p sas-protocol --test wire_format` rewrites the files of the
//! current format: only before that format is released.

use std::collections::BTreeSet;
use std::path::PathBuf;

use sas_protocol::messages::{
    AgentRequest, Alert, CallbackMessage, CallbackReply, SchedulerMessage, StatusMessage, Submission, TimerMessage,
    VERSION,
};
use sas_protocol::protocol::{Task, ITEM_FORMAT};
use schemars::schema_for;
use serde_json::Value;

/// Each message kind by where it travels, with its schema as this build derives it.
fn kinds() -> Vec<(&'static str, Value)> {
    let v = |s: schemars::Schema| s.to_value();
    vec![
        ("submission", v(schema_for!(Submission))),
        ("status", v(schema_for!(StatusMessage))),
        ("scheduler", v(schema_for!(SchedulerMessage))),
        ("agent_request", v(schema_for!(AgentRequest))),
        ("timer", v(schema_for!(TimerMessage))),
        ("callback", v(schema_for!(CallbackMessage))),
        ("callback_reply", v(schema_for!(CallbackReply))),
        ("alert", v(schema_for!(Alert))),
    ]
}

/// The schema without its comments (`description`, `title`) and its `$schema` line.
fn without_comments(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "description" | "title" | "$schema"))
                .map(|(k, v)| (k.clone(), without_comments(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_comments).collect()),
        other => other.clone(),
    }
}

/// Every field path a schema allows (`outcome.error`, `input.{}`, `items[]`), its `$ref`s
/// followed: what the failure names as added or removed.
fn paths(root: &Value) -> BTreeSet<String> {
    fn walk(root: &Value, node: &Value, at: &str, seen: &mut Vec<String>, out: &mut BTreeSet<String>) {
        let Some(m) = node.as_object() else { return };
        if let Some(r) = m.get("$ref").and_then(Value::as_str) {
            if seen.iter().any(|s| s == r) {
                return;
            }
            let name = r.trim_start_matches("#/$defs/");
            if let Some(def) = root.get("$defs").and_then(|d| d.get(name)) {
                seen.push(r.to_owned());
                walk(root, def, at, seen, out);
                seen.pop();
            }
        }
        if let Some(props) = m.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                let p = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                out.insert(p.clone());
                walk(root, v, &p, seen, out);
            }
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            for v in m.get(key).and_then(Value::as_array).into_iter().flatten() {
                walk(root, v, at, seen, out);
            }
        }
        if let Some(items) = m.get("items") {
            walk(root, items, &format!("{at}[]"), seen, out);
        }
        if let Some(more) = m.get("additionalProperties").filter(|v| v.is_object()) {
            walk(root, more, &format!("{at}.{{}}"), seen, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, "", &mut Vec::new(), &mut out);
    out
}

/// Where the schema of `kind` is kept, for its format.
fn kept(dir: &str, kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/{dir}/{kind}.schema.json"))
}

/// Compare each kind's schema with the one kept in `dir`; the changes, by kind.
fn changes(dir: &str, kinds: Vec<(&'static str, Value)>) -> Vec<String> {
    let bless = std::env::var_os("SAS_BLESS").is_some();
    let mut changed = Vec::new();
    for (kind, schema) in kinds {
        let now = without_comments(&schema);
        let file = kept(dir, kind);
        if bless {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, serde_json::to_string_pretty(&now).unwrap() + "\n").unwrap();
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e} (the format {dir} of {kind} is kept there)", file.display()));
        let then: Value = serde_json::from_str(&text).unwrap();
        if then != now {
            let (a, b) = (paths(&then), paths(&now));
            let added: Vec<_> = b.difference(&a).collect();
            let removed: Vec<_> = a.difference(&b).collect();
            changed.push(format!(
                "{kind}: fields added {added:?}, removed {removed:?} (or a type, a tag or what is required changed)"
            ));
        }
    }
    changed
}

#[test]
fn every_message_kind_has_the_format_kept_for_its_version() {
    let changed = changes(&format!("wire/v{VERSION}"), kinds());
    assert!(
        changed.is_empty(),
        "the wire format {VERSION} changed:\n  {}\n\
         A function of the release before refuses a field it does not know, and this build refuses \
         what it no longer knows: a change needs a new format (docs/reference/messages.md, \
         \"Compatibility\"). Only before format {VERSION} is released: SAS_BLESS=1 rewrites the files.",
        changed.join("\n  ")
    );
}

/// The task item (the table's one item per task, its workflow definition included as the
/// `workflow:` item it names) is kept the same way, for its own format ([`ITEM_FORMAT`]): a
/// task item is read by a build other than the one that wrote it during a deploy and after a
/// rollback, and a build that does not know an attribute drops it when it writes the task back,
/// so every change of its shape needs a new item format (docs/reference/table.md, "Item format").
#[test]
fn the_task_item_has_the_format_kept_for_its_item_format() {
    let changed = changes(&format!("items/v{ITEM_FORMAT}"), vec![("task", schema_for!(Task).to_value())]);
    assert!(
        changed.is_empty(),
        "the task item's format {ITEM_FORMAT} changed:\n  {}\n\
         A build of the release before drops an attribute it does not know when it writes the task \
         back, and this build cannot read what it no longer knows: a change needs item format \
         {} (ITEM_FORMAT; docs/reference/table.md, \"Item format\"). Only before item format \
         {ITEM_FORMAT} is released: SAS_BLESS=1 rewrites the file.",
        changed.join("\n  "),
        ITEM_FORMAT + 1
    );
}

#[test]
fn the_kept_format_names_fields_the_messages_have() {
    // the comparison above is only as good as what the schemas say: a few fields every reader
    // depends on are in them
    let all: BTreeSet<String> =
        kinds().iter().flat_map(|(k, s)| paths(s).into_iter().map(move |p| format!("{k}:{p}"))).collect();
    for p in [
        "submission:v",
        "submission:task_id",
        "submission:schedule.at",
        "scheduler:type",
        "scheduler:outcome.status",
        "scheduler:vars",
        "agent_request:unchecked_until",
        "agent_request:idempotency_key",
        "status:seq",
        "timer:complete_by",
    ] {
        assert!(all.contains(p), "{p} is not among the schemas' fields: {all:#?}");
    }
}

fn read_as<T: serde::de::DeserializeOwned>(v: &Value) -> Result<(), String> {
    serde_json::from_value::<T>(v.clone()).map(drop).map_err(|e| e.to_string())
}

/// The book's examples of each message (docs/reference/messages.md): every one is read by this
/// build as the kind its section names, the examples being format 1 messages as a reader of the
/// contract writes them.
#[test]
fn every_example_in_the_message_contracts_is_read_by_this_build() {
    let page = include_str!("../../../docs/reference/messages.md");
    let mut read = Vec::new();
    let mut section = "";
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h;
        }
        if line.trim() != "```json" {
            continue;
        }
        let mut block = String::new();
        for l in lines.by_ref() {
            if l.trim() == "```" {
                break;
            }
            block.push_str(l);
            block.push('\n');
        }
        for v in serde_json::Deserializer::from_str(&block).into_iter::<Value>() {
            let v = v.unwrap_or_else(|e| panic!("{section}: an example is not JSON: {e}\n{block}"));
            let parsed = match section {
                "Submission" => read_as::<Submission>(&v),
                "Status messages" => read_as::<StatusMessage>(&v),
                "Scheduler queue" => read_as::<SchedulerMessage>(&v),
                "Agent request" => read_as::<AgentRequest>(&v),
                "Deadline timer" => read_as::<TimerMessage>(&v),
                "Callback answer" => read_as::<CallbackMessage>(&v),
                "Callback reply" => read_as::<CallbackReply>(&v),
                "Alert" => read_as::<Alert>(&v),
                other => panic!("an example in section {other:?}: which message is it?"),
            };
            assert!(parsed.is_ok(), "{section}: {v}: {}", parsed.unwrap_err());
            assert_eq!(v["v"], 1, "{section}: {v}");
            read.push(section);
        }
    }
    for s in [
        "Submission",
        "Status messages",
        "Scheduler queue",
        "Agent request",
        "Deadline timer",
        "Callback answer",
        "Callback reply",
        "Alert",
    ] {
        assert!(read.contains(&s), "no example of {s} read: {read:?}");
    }
}
