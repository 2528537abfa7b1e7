//! `sasctl import-asl`'s translation: a state machine of the Amazon States Language (JSONPath, or
//! JSONata within the subset [`jsonata`] rewrites into JSONPath) translated into a workflow and the agents it calls, or refused with the state, the
//! field and what to do instead. See the book's "Bring your Step Functions state machines".
//!
//! Pure: a definition (a [`serde_json::Value`]) in, the workflows, agents and notes
//! ([`Imported`]) or the refusals ([`Refusal`]) out; no I/O, no async runtime, no AWS SDK. Reading
//! the files, writing the workflows and agents files, checking them (sas-core's `validate`) and
//! the exit status are sasctl's.
//!
//! The translation works out the state machine's data flow when it is imported ([`data`]): every
//! step reads the task's input and the outputs of the steps before it where they live, through
//! the project's templates; a `Choice` becomes guards on the steps it leads to; a `Catch` a
//! handled failure whose error the next steps read; a `Parallel` state branches of a graph; an
//! inline `Map` over one task a map step; `Fail` a step of the `fail` agent. What cannot be
//! translated exactly is refused, and every difference that remains is said ([`Imported::notes`]).

pub mod data;
pub mod jsonata;
mod saga;
mod states;

pub use states::{import, import_with, is_permanent_name, merge_agents, Imported, Options, LOOP_BOUND};

/// Why a state cannot be translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The state (`Parallel/branch 1/Charge` inside others), or `(state machine)`.
    pub state: String,
    /// The field that cannot be (`Resource`, `Retry`, `Next`...).
    pub field: String,
    /// Why, and what to do instead.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "state {:?}, {}: {}", self.state, self.field, self.reason)
    }
}

/// A workflow's name for a definition file: its name without `.asl.json` (or `.json`), in the
/// characters a workflow name may have.
pub fn workflow_name(path: &std::path::Path) -> String {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = file.strip_suffix(".asl.json").or_else(|| file.strip_suffix(".json")).unwrap_or(&file);
    let mut name: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
    name.truncate(64);
    if name.is_empty() {
        name = "imported".into();
    }
    name
}

/// An agents file of the agents imported: a function's error fails the attempt at once (each
/// agent's own `retry`, `max_calls` 1), to be retried only as the state machine's `Retry` says.
/// The `retry` is each agent's, so the entries may be merged into a file of other agents without
/// changing how those retry.
pub fn agents_file(agents: &serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
    let agents: serde_json::Map<String, serde_json::Value> = agents
        .iter()
        .map(|(name, spec)| {
            let mut spec = spec.clone();
            if let Some(o) = spec.as_object_mut() {
                o.entry("retry").or_insert_with(|| serde_json::json!({"max_calls": 1, "base_ms": 100, "max_ms": 1000}));
            }
            (name.clone(), spec)
        })
        .collect();
    serde_json::json!({"agents": agents})
}
