//! A deterministic simulation of the whole system on the in-memory twins.
//!
//! One seed fixes everything: a virtual clock; queues that delay, redeliver and duplicate (a
//! message handled twice at once, a consumer that dies before or after its work and before its
//! delete); sends that fail right after a write (a crash between a transition and its effects);
//! every function invocation of one instant (one per receive, through the functions' own
//! [`role::process_batch`](sas_core::role::process_batch); a duplicate in an invocation of its
//! own) polled together on a store that yields between operations, so two schedulers or two
//! supervisors race on one task; a remote service that applies each idempotency
//! key at most once and never after the request's deadline, behind agents that answer, fail,
//! hang, crash after the effect landed, or answer too late; operators who cancel and resubmit at
//! random moments; bursts beyond the agents' capacity.
//!
//! Also: remote effects that land *after* the agent's retryable answer (a gateway 504 while the
//! backend keeps working); agent requests delivered twice (the second copy finds the key in use:
//! 409, and asks again until it is free or its deadline); conditional writes that apply and still
//! report a failure (an SDK retry of a write that landed); send requests that fail as a whole,
//! taking up to ten buffered messages of different tasks with them; timers delivered again seconds
//! later; a reply queue named by every submission.
//!
//! After each run it checks, against the remote services' ledger, the queues and the topic:
//! 1. `key-once`: no idempotency key applied twice;
//! 2. `terminal`: every task terminal, nothing dead-lettered (`dlq`);
//! 3. `undone`: every effect of a task that did not end `Processed` is undone, after it landed, where a
//!    compensation exists;
//! 4. `error-alert`: `Error` only with a `task_error` alert;
//! 5. `overwritten`: no terminal state overwritten (`Error` may be left by an operator's hand);
//! 6. `reply-once`: each task's final status reached its reply queue at least once, and no
//!    terminal status more than [`MAX_TERMINAL_REPLIES`] times (and one more per callback answer
//!    repeated after it ended its unit: each makes the desk send again what the ending write owed);
//! 7. `alert-once`: at most one `task_error` alert per `Error` episode (from entering `Error` to
//!    the operator's resubmit or cancel), redeliveries and duplicates of a message about the task
//!    excepted;
//! 8. `processed-once`: every step of a `Processed` task applied exactly once (one key generation)
//!    and no compensation applied;
//! 9. `dispatched`: every attempt the store shows claimed reached the agent queue, unless an
//!    operator's cancel or resubmit let it go first;
//! 10. `success-kept`: a success the Scheduler handled while its step was still the running one
//!     (same run) is never dropped;
//! 11. `late-hung` / `late-lost`: a hung attempt (cut by its agent at its execution deadline) is
//!     let go within [`LATE_HUNG_MS`] of that deadline, a lost one (agent dead, never started)
//!     within [`LATE_LOST_MS`] of `CompleteBy` + the result grace;
//! 12. `timers-bounded`: the Supervisor handles no more attempt-less timers for a task than the
//!     sweeps handed it (a timer does not re-arm itself for ever).
//! 13. `callback-lost`: a callback attempt whose worker died is let go within [`LATE_LOST_MS`]
//!     of its heartbeat deadline (one heartbeat window after the worker was last heard of) +
//!     the result grace (the sweep's bound when the Supervisor's own sends failed).
//! 14. `max-in-flight`: never more calls of [`LIMITED_AGENT`] (the `charge` steps' agent, limited
//!     to [`LIMIT`]) open at once at its service than its `max_in_flight`. The fleet takes its
//!     slots through the real [`agent::take_slot`](sas_core::agent::take_slot) on the twins (a copy of a request takes its
//!     own); a request that finds the agent full goes back to the agent queue, and one that
//!     waited past its `start_by` is answered "not started" and claimed again.
//! 15. `hung-reported`: a copy whose calls ended at its execution deadline before `CompleteBy`
//!     (however they ended) was reported by its agent.
//!
//! The agents report what they report through the runtime's own rule ([`report`](sas_core::agent::runtime::report)), and start a
//! request only while its task still waits for its attempt, as the real ones check
//! ([`agent::still_current`](sas_core::agent::still_current) on the twins). The deadline's faults: the remote side's (or the HTTP
//! client's) own timeout fires exactly at the attempt's deadline (`remote_timeout`), an answer
//! comes as the runtime's cut fires (`answer_at_deadline`), and SQS delivers a request again long
//! after the first copy, up to its `start_by` (`late_copy`). A transient error at the deadline
//! is reported, never dropped as if CompleteBy had passed: dropped, `remote_timeout` and
//! `answer_at_deadline` alone fail 293 of 300 seeds (`hung-reported`, `late-hung`). And agents
//! start nothing for an attempt no longer current: the compensation starts one execution time
//! after a cancel or a give-up, and without that check 16 of 300 seeds fail with every fault
//! (`undone`: a charge applied after its refund).
//!
//! Callback and wait steps (workflow `order-async`: a 2 s wait, then `ship` as a callback step,
//! 60 s hard timeout, heartbeats every 5 s, undone by `recall`): the warehouse refuses the
//! hand-off now and then (for good, or for now); its worker heartbeats at random intervals, stops
//! when the answer desk says so (cancelled, stale) and says it stopped, applies its effect once
//! per key and never after its deadline, and answers. Faults: the worker dies (`cb_lost`), its
//! answer is delayed past the attempt's deadline (`cb_late`), sent twice (`cb_duplicate`), or
//! overtaken by a heartbeat (`cb_reorder`); the desk's sends after its write fail (`lost_sends`)
//! and the sender retries. What the desk answered is counted (`SimReport::callbacks`).
//!
//! A callback answer's own content marks its write: a write that landed with its sends failed is
//! recognised when the worker retries (over HTTPS, without a message id), and its sends go then;
//! without that, 76 of 1,000 seeds lose a final status (`reply-once`). Two bounds the invariants
//! allow, not bugs: a claim whose deadline is shorter than its message's redelivery (a callback
//! step's 10 s schedule-to-start) is recovered by its deadline when its sends fail (`dispatched`,
//! `late-lost` allow the redelivery time); and a wait that wakes makes the Supervisor claim the
//! next unit, whose lost timer only the sweep finds.
//!
//! The rules the faults guard, and what each fault set finds on code without the rule, with only
//! its faults on (`SIM_FAULTS=...`, 300 seeds, 500 for the timer that re-arms itself):
//!
//! | rule | faults | found by | seeds failing it | first |
//! |---|---|---|---|---|
//! | only a definite answer of the awaited attempt releases its compensation | `late_effect,cancel` | `undone` (reserve applied after its release) | 4/300 | 26 |
//! | sends that failed after a write fail the message; its redelivery sends them again | `batch_failures` (or `lost_sends`) | `dispatched`; `late-lost` when a timer is lost | 44/300 (114/300) | 6 (3) |
//! | a write reported lost that landed is recognised, and its sends still go | `ambiguous_writes` | `dispatched` | 82/300 | 3 |
//! | the terminal reply and alert are re-sent only for the message that ended the task | `transient,permanent` | `reply-once` (too many), `alert-once` | 284/300, 90/300 | 1, 3 |
//! | a timer the sweep handed over is spent once its deadline is left, never re-armed | `lost_sends,late_duplicate` | `timers-bounded` | 2/500 | 144 |
//! | a retryable failure of one copy of an attempt keeps the other copy's success | `agent_duplicate` (`+transient`) | `success-kept` | 61/300 (83/300) | 1 (1) |
//! | a hung call is reported at its execution deadline, not left to `CompleteBy` | `hang` | `late-hung` | 245/300 | 1 |
//!
//! Without any of them, with every fault on (`make sim`, 2,000 seeds, about 45 s): all seeds
//! fail; `reply-once` 2000, `late-hung` 1945, `dispatched` 1467, `success-kept` 637, `alert-once`
//! 594, `timers-bounded` 153, `late-lost` 16 (a lost timer whose sends are not re-sent), `undone`
//! 9 (a cancel's release applied before the reserve it undoes), `dlq` 5 (a late timer's terminal
//! re-send fails three times).
//!
//! With them: 2,000 seeds, 0 failed, every fault on. Two bounds are what the system can promise:
//! send failures and ambiguous writes are transient like crashes (injected on first deliveries
//! only: a failure on every delivery until `CompleteBy` is the Supervisor's case and costs the
//! attempt), and an attempt is not charged to `dispatched` when another attempt of its unit
//! settled it first or the Supervisor claimed it (its timer message comes back only after 360 s,
//! past `CompleteBy`).
//!
//! The terminal notices' rule matters under almost every other fault too (any retry arms one more
//! timer that would re-send the terminal status, and a late timer's re-send that fails three
//! times fires `dlq`). Re-sending on any redelivery is not enough: timers are redelivered too,
//! and with every fault but `lost_sends`, `batch_failures` and `ambiguous_writes` that leaves 5 of
//! 500 seeds failing `reply-once` with 5 copies (2 re-sends from redeliveries of the message that
//! ended the task, 2 from redelivered timers). So only the message that ended the task re-sends.
//!
//! `BufferedBus` itself is not in the loop: it needs tokio's spawn and timer (a real 20 ms
//! linger per flush, or tokio's paused clock, which the library does not build with), while the
//! simulator runs everything on `block_on` in virtual time. Its failure mode is injected instead:
//! the next 1 to 10 sends of one instant to one queue fail together, as one failed
//! SendMessageBatch of the messages buffered then; the sweep's own `send_batch` fails as a
//! request ([`MemoryBus::fail_requests`]).
//!
//! `SIM_SEED=<n>` replays one seed exactly (see `tests/simulation.rs`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use sas_core::bus::{MemoryBus, QueueConfig};
use sas_core::clock::{Clock, ManualClock};
use sas_core::config::Settings;
use sas_core::deps::Deps;
use sas_core::entropy::SeededEntropy;
use sas_core::store::MemoryStore;
use sas_protocol::ids::{CallbackToken, Millis};
use sas_protocol::messages::{AgentRequest, AgentResult, CallbackMessage, Phase, SchedulerMessage, VERSION};
use sas_protocol::protocol::{Policy, ProcessState};
use serde_json::json;

use crate::twins;

mod config;
mod driver;
mod fixtures;
mod fleet;
mod invariants;

pub use config::{Faults, SimConfig, SimReport, LATE_HUNG_MS, LATE_LOST_MS, MAX_TERMINAL_REPLIES, REPLY_QUEUE};
pub use fixtures::{workflows, KEY_LIMIT, LIMIT, LIMITED_AGENT, MAP_CONCURRENCY};

/// One applied remote effect.
#[derive(Debug, Clone)]
struct Applied {
    at: Millis,
    phase: Phase,
}

/// The remote services: at most one effect per idempotency key, never after the request's
/// deadline.
#[derive(Debug, Default)]
struct Ledger {
    applied: BTreeMap<String, Applied>,
    twice: Vec<String>,
    /// What the service knows of each key: a request works on it until `until` (another
    /// request meanwhile is answered 409 "key in use"), and once decided, every later request
    /// with the key is answered the same (a replay).
    keys: BTreeMap<String, KeyState>,
}

#[derive(Debug, Clone, Copy, Default)]
struct KeyState {
    until: Millis,
    decided: Option<Decided>,
}

#[derive(Debug, Clone, Copy)]
enum Decided {
    /// The effect lands (landed) then.
    Applies,
    Declined,
}

/// What became of one copy of an attempt at its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// The agent sent a result (in time).
    Answered,
    /// The call hung or ran long: the agent cut it at the execution deadline.
    Cut { at: Millis },
    /// The agent died, or never started it (past `start_by`).
    Lost,
    /// Not started: the task no longer waited for the attempt when this copy came
    /// ([`agent::still_current`](sas_core::agent::still_current)).
    Fenced,
}

/// An attempt seen claimed in the store.
#[derive(Debug, Clone)]
struct Claim {
    task: String,
    step: String,
    phase: Phase,
    run: u32,
    complete_by: Millis,
    released: Option<Millis>,
    /// Let go by an operator's cancel or resubmit, or because another attempt of its unit (an
    /// outstanding one, whose success is still taken) succeeded first: not charged to it.
    by_operator: bool,
    /// Claimed by the Supervisor (a compensation started when a unit was given up, or the unit
    /// after a wait that woke). If its sends fail, the timer message comes back only after the
    /// supervisor queue's visibility timeout (360 s), past the attempt's `CompleteBy`: its own
    /// deadline recovers it, or, when its timer was among the failed sends, the sweep (a minute
    /// behind, once a minute): `late-lost` allows it that long.
    by_supervisor: bool,
    /// When it was first seen claimed.
    claimed_at: Millis,
    /// Let go because its deadline passed.
    expired: bool,
}

/// How long the sweep may take to find an expired attempt whose timer was lost: its lag and its
/// period (both a minute here).
const SWEEP_BOUND_MS: u64 = 120_000;

/// An `Error` episode of a task: `task_error` alerts published on first, lone deliveries of the
/// messages about it (`fresh`) and on redeliveries or duplicates (`repeated`).
#[derive(Debug, Clone, Default)]
struct Episode {
    fresh: u32,
    repeated: u32,
}

enum Action {
    /// The service applies the request's effect (if its deadline has not passed).
    Apply { key: String, task: String, applied: Applied, deadline: Millis },
    /// The agent sends its result.
    Reply(Box<AgentResult>),
    /// An operator's command.
    Operator(SchedulerMessage),
    /// A later submission.
    Submit(String),
    /// A second delivery of an agent request, to another agent.
    AgentCopy(Box<AgentRequest>),
    /// The remote worker of a callback step works on: heartbeats, or finishes.
    Worker(Box<Worker>),
    /// A callback answer reaches the answer desk (retried while the desk fails).
    Answer(Box<CallbackMessage>),
    /// A message delivered again later (a copy put back on its queue).
    Again { queue: String, body: String },
    /// An agent gives its slot of [`LIMITED_AGENT`] back.
    Release { holder: String },
    /// An operator deletes the schedule ([`SimConfig::schedule`]).
    EndSchedule,
}

/// The simulation's schedule ([`SimConfig::schedule`]).
pub(super) const SCHEDULE: &str = "tick";

/// Whether an agent may call for a request now.
enum Turn {
    /// Yes, holding this lease (none for an agent without a limit).
    Call(Option<String>),
    /// Its agent is full: the request was sent back to wait.
    Waits,
    /// The slot could not be asked for: the message stays on its queue.
    Failed,
}

/// The remote side of one callback attempt: it heartbeats until `done_at`, then applies its
/// effect (once per key, never after `hard`) and answers; it stops when told to.
#[derive(Debug, Clone)]
struct Worker {
    token: CallbackToken,
    key: String,
    phase: Phase,
    hard: Millis,
    heartbeat_ms: u64,
    done_at: Millis,
    /// The worker dies then (`cb_lost`).
    dies_at: Option<Millis>,
}

struct Sim {
    cfg: SimConfig,
    deps: Deps,
    store: MemoryStore,
    bus: MemoryBus,
    clock: ManualClock,
    rng: SeededEntropy,
    ledger: Ledger,
    actions: BinaryHeap<(Reverse<Millis>, Reverse<u64>, usize)>,
    slots: Vec<Option<Action>>,
    seq: u64,
    /// The terminal state each task was first seen in (Error excepted: operators may act).
    terminal: BTreeMap<String, ProcessState>,
    report: SimReport,
    agents_free_at: Millis,
    /// Attempt tokens whose request reached the agent queue.
    dispatched: BTreeSet<String>,
    /// Attempts seen claimed (by token), and the token each task holds now.
    claims: BTreeMap<String, Claim>,
    locks: BTreeMap<String, String>,
    /// What became of each copy of each attempt at its agent.
    fates: BTreeMap<String, Vec<Fate>>,
    /// The tasks whose timers the Supervisor handled in the batch being observed.
    supervised: BTreeSet<String>,
    /// Attempts whose result or timer message crashed a consumer on its first delivery (their
    /// release waits a visibility timeout: not checked for lateness).
    delayed: BTreeSet<String>,
    /// `Error` episodes by task, the tasks in `Error` now, and the publications looked at.
    episodes: BTreeMap<String, Vec<Episode>>,
    in_error: BTreeSet<String>,
    /// Steps seen skipped, by task (their indexes): a guard is decided once, so they stay skipped.
    skips_seen: BTreeMap<String, BTreeSet<usize>>,
    publications_seen: usize,
    /// Attempt-less timers by task: handed by a sweep, and handled (distinct message ids).
    timers_handed: BTreeMap<String, usize>,
    timers_handled: BTreeMap<String, BTreeSet<String>>,
    /// Callback attempts: when their worker was last heard of (hand-off or heartbeat), and its
    /// heartbeat window; and those whose worker died.
    heard: BTreeMap<String, (Millis, u64)>,
    dead: BTreeSet<String>,
    /// Map elements that succeeded and are being undone.
    undoing: BTreeSet<String>,
    /// Map steps (`{task}#{step}`) seen with an output, and how often each was joined.
    joined: BTreeSet<String>,
    joins: BTreeMap<String, u32>,
    /// The calls of [`LIMITED_AGENT`] at its service: from the start to when the agent let go.
    limited_calls: Vec<(Millis, Millis)>,
    /// Callback answers taken as repeats of the one that ended their unit, by task: each one
    /// (a worker's retry after an error, a duplicate) makes the desk send again what the ending
    /// write owed, its terminal status among it, so each one allows one more status.
    repeated_answers: BTreeMap<String, usize>,
    /// The last write of the store each look has read (`observe`, `quiet`): each instant reads
    /// the tasks written since, not every task (100,000 elements would make a run quadratic).
    observed: u64,
    quiet_mark: u64,
    /// Map elements running now (see `observe_maps`), how many per parent, and the loops'
    /// iterations running now (`{parent}#{step}` to the iterations' ids).
    map_running: BTreeSet<String>,
    running_by_parent: BTreeMap<String, u32>,
    iterating: BTreeMap<String, BTreeSet<String>>,
    /// The tasks not terminal now, and the submitted ones (not children) seen, for `quiet`.
    live: BTreeSet<String>,
    roots: BTreeSet<String>,
    /// The tasks of each concurrency key running now (claimed, not ended), and the tasks seen
    /// waiting for a slot.
    keyed_running: BTreeMap<String, BTreeSet<String>>,
    keyed_waited: BTreeSet<String>,
}

/// Run one seed.
pub fn run(cfg: &SimConfig) -> SimReport {
    let clock = ManualClock::at(Millis(1_700_000_000_000));
    let res = twins::resources(2);
    let store = MemoryStore::interleaved(res.shards);
    let bus = MemoryBus::for_stack(Arc::new(clock.clone()), &res);
    bus.create_queue(REPLY_QUEUE, QueueConfig::default());
    let settings = Settings {
        policy: Policy {
            pause_check_ms: Policy::default().pause_check_ms,
            // a waiting task's check of its key: often, so lost grants and releases are recovered in a run
            key_check_ms: 30_000,
            start_timeout_ms: 10_000,
            // Small, so that the store's archive of dropped entries runs under every fault.
            history_limit: 6,
            queue_budget_ms: 120_000,
            result_grace_ms: 2_000,
            settle_ms: 500,
            // as deployed: copies that arrive within 2 s of their claim start unread
            unchecked_start_ms: 2_000,
            max_restarts: 8,
        },
        retention_days: 1,
        max_input_bytes: 64 * 1024,
        sweep_page_size: 5,
        sweep_lag_ms: 60_000,
        ..Settings::default()
    };
    let deps = Deps {
        store: Arc::new(store.clone()),
        writer: sas_core::transition::Writer::new(Arc::new(store.clone())),
        limiter: Arc::new(store.clone()),
        keys: Arc::new(store.clone()),
        pacer: Arc::new(store.clone()),
        pauses: Arc::new(store.clone()),
        schedules: Arc::new(store.clone()),
        pause_cache: Arc::default(),
        bus: Arc::new(bus.clone()),
        resources: res,
        workflows: Arc::new(workflows()),
        settings,
        clock: Arc::new(clock.clone()),
        entropy: Arc::new(SeededEntropy::new(cfg.seed.wrapping_mul(31).wrapping_add(7))),
    };
    let mut sim = Sim {
        cfg: cfg.clone(),
        deps,
        store,
        bus,
        clock,
        rng: SeededEntropy::new(cfg.seed),
        ledger: Ledger::default(),
        actions: BinaryHeap::new(),
        slots: Vec::new(),
        seq: 0,
        terminal: BTreeMap::new(),
        report: SimReport { seed: cfg.seed, ..SimReport::default() },
        agents_free_at: Millis(0),
        dispatched: BTreeSet::new(),
        limited_calls: Vec::new(),
        repeated_answers: BTreeMap::new(),
        claims: BTreeMap::new(),
        locks: BTreeMap::new(),
        fates: BTreeMap::new(),
        supervised: BTreeSet::new(),
        delayed: BTreeSet::new(),
        episodes: BTreeMap::new(),
        in_error: BTreeSet::new(),
        skips_seen: BTreeMap::new(),
        publications_seen: 0,
        timers_handed: BTreeMap::new(),
        timers_handled: BTreeMap::new(),
        heard: BTreeMap::new(),
        dead: BTreeSet::new(),
        undoing: BTreeSet::new(),
        joined: BTreeSet::new(),
        joins: BTreeMap::new(),
        observed: 0,
        quiet_mark: 0,
        map_running: BTreeSet::new(),
        running_by_parent: BTreeMap::new(),
        iterating: BTreeMap::new(),
        live: BTreeSet::new(),
        roots: BTreeSet::new(),
        keyed_running: BTreeMap::new(),
        keyed_waited: BTreeSet::new(),
    };
    sim.go();
    sim.report
}

impl Sim {
    fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.rng.unit() < p
    }

    fn between(&self, lo: u64, hi: u64) -> u64 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let x = lo + (self.rng.unit() * (hi - lo) as f64) as u64;
        x
    }

    fn at(&mut self, when: Millis, action: Action) {
        self.seq += 1;
        self.slots.push(Some(action));
        self.actions.push((Reverse(when), Reverse(self.seq), self.slots.len() - 1));
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    /// A submission; one in five names no task id (the Submitter derives one from the message).
    fn submission(&self, id: &str) -> String {
        let roll = self.rng.unit();
        let workflow = if self.cfg.keys.is_some() {
            "order-keyed"
        } else if self.cfg.pages.is_some() {
            "order-pages"
        } else if self.cfg.map_lines.is_some() {
            "order-map"
        } else if roll < 0.2 {
            "order-parked"
        } else if roll < 0.4 {
            "order-async"
        } else if roll < 0.6 {
            "order-map"
        } else if roll < 0.8 {
            "order-graph"
        } else if roll < 0.87 {
            "order-choice"
        } else if roll < 0.905 {
            "order-child"
        } else if roll < 0.94 {
            "order-children"
        } else if roll < 0.97 {
            "order-loop"
        } else {
            "order"
        };
        let n = self.cfg.map_lines.unwrap_or_else(|| usize::try_from(self.between(1, 6)).unwrap_or(1));
        let lines: Vec<serde_json::Value> = (0..n).map(|i| json!({"sku": format!("s{i}"), "qty": 1})).collect();
        let mut input = json!({"sku": "a", "lines": lines, "cool_off_s": 2});
        if let Some((pages, per_page)) = self.cfg.pages {
            input = json!({"sku": "a", "pages": pages, "per_page": per_page});
        }
        if let Some(keys) = self.cfg.keys {
            input["account"] = json!(format!("acct{}", self.between(0, keys)));
        }
        let mut body = if self.chance(0.2) {
            input["ref"] = json!(id);
            json!({"v": VERSION, "workflow": workflow, "input": input})
        } else {
            json!({"v": VERSION, "task_id": id, "workflow": workflow, "input": input})
        };
        if self.chance(self.cfg.faults.reply_to) {
            body["reply_to"] = json!(REPLY_QUEUE);
        }
        body.to_string()
    }
}

/// The seeds of a batch: `SIM_SEED` alone if set, else `count` seeds from `first`.
pub fn seeds(first: u64, count: u64) -> Vec<u64> {
    match std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => (first..first + count).collect(),
    }
}

/// A short account of a run, for a failing seed.
#[allow(clippy::cast_precision_loss)]
pub fn describe(r: &SimReport) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "seed {} ({} tasks, {} messages handled, {} agent attempts, {:.0} s virtual): {:?}\n",
        r.seed,
        r.tasks,
        r.handled,
        r.attempts,
        r.virtual_ms as f64 / 1000.0,
        r.end_states
    );
    for line in r.violations.iter().take(10) {
        s.push_str("  - ");
        s.push_str(line);
        s.push('\n');
    }
    if r.violations.len() > 10 {
        let _ = writeln!(s, "  ... and {} more", r.violations.len() - 10);
    }
    let _ = writeln!(s, "  replay: SIM_SEED={} cargo test -p sas-core --test simulation", r.seed);
    s
}
