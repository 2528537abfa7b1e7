//! Transition coverage: which (state, event) pairs of the protocol's table a run reached. The
//! engine logs every written transition once (`sas_core::transition`: `"transition"`, with the
//! fields `from` and `event`); [`Recorder`] is a `tracing` subscriber that keeps those pairs, so
//! a test can run scenarios under it ([`record`], [`global`]) and compare what they reached with
//! [`sas_protocol::protocol::TRANSITIONS`], as temporal's sdk-core measures its state machines'.
//!
//! A test binary whose tests run side by side on threads (`cargo test`, as `make sim` runs the
//! simulation) records with [`global`], set before any test reaches the engine: `tracing` caches,
//! for each log statement, which subscribers want it when the statement is first reached, and a
//! statement first reached on another thread while a thread's own subscriber was being set may be
//! cached as wanted by none. That happened once: a `make sim` whose coverage came out empty.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// The module whose `"transition"` event is recorded: the only events a [`Recorder`] takes.
const TARGET: &str = "sas_core::deps::transition";

/// A (state before, event name) pair, as the engine logs it (`Processing`, `agent_failed`).
pub type Pair = (String, String);

/// Keeps the (from, event) pair of every written transition logged on this thread.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    pairs: Arc<Mutex<BTreeSet<Pair>>>,
}

impl Recorder {
    /// The pairs recorded so far.
    pub fn pairs(&self) -> BTreeSet<Pair> {
        self.pairs.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The process's recorder, the global subscriber from the first call on (every thread's
/// transitions); `None` when another global subscriber was set first.
pub fn global() -> Option<&'static Recorder> {
    static GLOBAL: OnceLock<Option<Recorder>> = OnceLock::new();
    GLOBAL
        .get_or_init(|| {
            let recorder = Recorder::default();
            tracing::subscriber::set_global_default(recorder.clone()).ok().map(|()| recorder)
        })
        .as_ref()
}

/// `f` run with a [`Recorder`] as this thread's subscriber, and the pairs it reached. The
/// simulator runs on the calling thread, so every role's transition is seen.
pub fn record<T>(f: impl FnOnce() -> T) -> (T, BTreeSet<Pair>) {
    let recorder = Recorder::default();
    let out = tracing::subscriber::with_default(recorder.clone(), f);
    (out, recorder.pairs())
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    from: Option<String>,
    event: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        let slot = match field.name() {
            "message" => &mut self.message,
            "from" => &mut self.from,
            "event" => &mut self.event,
            _ => return,
        };
        *slot = Some(format!("{value:?}").trim_matches('"').to_owned());
    }
}

impl Subscriber for Recorder {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && metadata.target() == TARGET
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut f = Fields::default();
        event.record(&mut f);
        if let (Some("transition"), Some(from), Some(name)) = (f.message.as_deref(), f.from, f.event) {
            self.pairs.lock().unwrap_or_else(PoisonError::into_inner).insert((from, name));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
