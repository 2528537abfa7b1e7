//! A deterministic simulation of the whole system on the in-memory twins.
//!
//! One seed fixes everything: a virtual clock; queues that delay, redeliver and duplicate (a
//! message handled twice at once, a consumer that dies before or after its work and before its
//! delete); sends that fail right after a write (a crash between a transition and its effects);
//! every handler of one instant polled together on a store that yields between operations, so two
//! schedulers or two supervisors race on one task; a remote service that applies each idempotency
//! key at most once and never after the request's deadline, behind agents that answer, fail,
//! hang, crash after the effect landed, or answer too late; operators who cancel and resubmit at
//! random moments; bursts beyond the agents' capacity.
//!
//! After each run it checks, against the remote services' ledger:
//! 1. no idempotency key applied twice;
//! 2. every task terminal;
//! 3. every effect of a task that did not end `Processed` is undone, after it landed, where a
//!    compensation exists;
//! 4. `Error` only with a `task_error` alert;
//! 5. no terminal state overwritten (`Error` may be left by an operator's hand).
//!
//! `SIM_SEED=<n>` replays one seed exactly (see `tests/simulation.rs`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use futures::future::join_all;
use serde_json::json;

use crate::agent::runtime::execution_deadline;
use crate::bus::{Bus, MemoryBus, Outgoing, Received};
use crate::clock::{Clock, ManualClock};
use crate::config::Settings;
use crate::deps::Deps;
use crate::entropy::SeededEntropy;
use crate::ids::{Millis, TaskId};
use crate::messages::{
    AgentRequest, AgentResult, CancelMessage, Outcome, Phase, ResubmitMessage, SchedulerMessage, VERSION,
};
use crate::protocol::{Policy, ProcessState};
use crate::role::{self, Record, Role};
use crate::store::MemoryStore;
use crate::workflow::{Backoff, OnFailure, StepDef, WorkflowDef, WorkflowRegistry};
use crate::{agent::AgentRuntime, supervisor, twins};

/// What one run looks like.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    /// Tasks submitted at once at the start.
    pub burst: usize,
    /// Tasks submitted one by one afterwards.
    pub trickle: usize,
    /// Agent requests the agents start per second (their fleet's capacity).
    pub agent_rate: u32,
    /// Probabilities of the faults (0 turns them off).
    pub faults: Faults,
    /// Give up after this much virtual time.
    pub horizon_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Faults {
    /// A consumer dies before handling a message (it comes back after the visibility timeout).
    pub crash_before: f64,
    /// A consumer handles a message and dies before deleting it.
    pub crash_after: f64,
    /// A message is handled by two consumers at once.
    pub duplicate: f64,
    /// The sends right after a handler's write fail (a crash between a write and its effects).
    pub lost_sends: f64,
    /// The next operator alert of a handler batch fails to publish.
    pub lost_alerts: f64,
    /// Remote calls: transient failure, permanent failure, hang, effect without an answer,
    /// effect then a retryable failure, a slow answer.
    pub transient: f64,
    pub permanent: f64,
    pub hang: f64,
    pub effect_no_answer: f64,
    pub effect_then_retryable: f64,
    pub slow: f64,
    /// Operator cancels and resubmits, per task.
    pub cancel: f64,
    pub resubmit: f64,
}

impl Faults {
    pub fn none() -> Self {
        Faults {
            crash_before: 0.0,
            crash_after: 0.0,
            duplicate: 0.0,
            lost_sends: 0.0,
            lost_alerts: 0.0,
            transient: 0.0,
            permanent: 0.0,
            hang: 0.0,
            effect_no_answer: 0.0,
            effect_then_retryable: 0.0,
            slow: 0.0,
            cancel: 0.0,
            resubmit: 0.0,
        }
    }

    pub fn all() -> Self {
        Faults {
            crash_before: 0.02,
            crash_after: 0.02,
            duplicate: 0.05,
            lost_sends: 0.02,
            lost_alerts: 0.3,
            transient: 0.05,
            permanent: 0.02,
            hang: 0.03,
            effect_no_answer: 0.03,
            effect_then_retryable: 0.03,
            slow: 0.05,
            cancel: 0.15,
            resubmit: 0.5,
        }
    }
}

impl SimConfig {
    /// The default run for a seed: a burst and a trickle of tasks with every fault on.
    pub fn for_seed(seed: u64) -> Self {
        SimConfig { seed, burst: 12, trickle: 8, agent_rate: 20, faults: Faults::all(), horizon_ms: 6 * 3_600_000 }
    }
}

/// What a run did and what it broke.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub seed: u64,
    pub violations: Vec<String>,
    pub tasks: usize,
    pub end_states: BTreeMap<String, usize>,
    pub handled: u64,
    pub attempts: u64,
    pub units: u64,
    pub virtual_ms: u64,
}

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
}

const STEP_TIMEOUT_MS: u64 = 5_000;

fn step(name: &str, comp: Option<&str>) -> StepDef {
    StepDef {
        name: name.into(),
        agent: "sim".into(),
        timeout_ms: STEP_TIMEOUT_MS,
        schedule_to_start_ms: None,
        max_attempts: 3,
        backoff: Backoff { base_ms: 500, max_ms: 5_000, multiplier: 2.0 },
        compensation: comp.map(|c| Box::new(step(c, None))),
    }
}

/// `order` compensates on failure; `order-parked` parks in `Error` for an operator.
pub fn workflows() -> WorkflowRegistry {
    let wf = |name: &str, on_failure| WorkflowDef {
        name: name.into(),
        version: 1,
        description: "simulated order".into(),
        on_failure,
        steps: vec![step("reserve", Some("release")), step("charge", Some("refund")), step("ship", None)],
    };
    WorkflowRegistry::new([wf("order", OnFailure::Compensate), wf("order-parked", OnFailure::Error)])
        .expect("valid simulated workflows")
}

/// Run one seed.
pub fn run(cfg: &SimConfig) -> SimReport {
    let clock = ManualClock::at(Millis(1_700_000_000_000));
    let res = twins::resources(2);
    let store = MemoryStore::interleaved(res.shards);
    let bus = MemoryBus::for_stack(Arc::new(clock.clone()), &res);
    let settings = Settings {
        policy: Policy {
            start_timeout_ms: 10_000,
            history_limit: 50,
            queue_budget_ms: 120_000,
            result_grace_ms: 2_000,
            settle_ms: 500,
            max_restarts: 8,
        },
        retention_days: 1,
        max_input_bytes: 16 * 1024,
        sweep_page_size: 5,
        sweep_lag_ms: 60_000,
        ..Settings::default()
    };
    let deps = Deps {
        store: Arc::new(store.clone()),
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
        let workflow = if self.chance(0.3) { "order-parked" } else { "order" };
        if self.chance(0.2) {
            return json!({"v": VERSION, "workflow": workflow, "input": {"sku": "a", "ref": id}}).to_string();
        }
        json!({"v": VERSION, "task_id": id, "workflow": workflow, "input": {"sku": "a"}}).to_string()
    }

    fn go(&mut self) {
        let start = self.now();
        let total = self.cfg.burst + self.cfg.trickle;
        self.report.tasks = total;
        for i in 0..total {
            let id = format!("t{i:03}");
            let body = self.submission(&id);
            if i < self.cfg.burst {
                block_on(self.bus.send(&self.deps.resources.submission_queue_url, Outgoing::new(body))).ok();
            } else {
                let when = start.plus_ms(self.between(0, 120_000));
                self.at(when, Action::Submit(body));
            }
            if self.chance(self.cfg.faults.cancel) {
                let when = start.plus_ms(self.between(0, 60_000));
                let msg = SchedulerMessage::Cancel(CancelMessage {
                    v: VERSION,
                    task_id: TaskId::try_from(id.as_str()).expect("valid id"),
                    reason: "simulated operator".into(),
                    run: None,
                });
                self.at(when, Action::Operator(msg));
            }
        }
        let mut next_sweep = start.plus_ms(60_000);
        let mut next_operator_round = start.plus_ms(300_000);
        loop {
            let now = self.now();
            if now.0 - start.0 > self.cfg.horizon_ms {
                break;
            }
            // actions due now
            while let Some((Reverse(when), _, slot)) = self.actions.peek().copied() {
                if when > now {
                    break;
                }
                self.actions.pop();
                if let Some(action) = self.slots[slot].take() {
                    self.act(action);
                }
            }
            if now >= next_sweep {
                next_sweep = now.plus_ms(60_000);
                let two = self.chance(0.3);
                let deps = &self.deps;
                if two {
                    block_on(futures::future::join(supervisor::sweep(deps), supervisor::sweep(deps)));
                } else {
                    block_on(supervisor::sweep(deps));
                }
                self.observe();
            }
            if now >= next_operator_round {
                next_operator_round = now.plus_ms(300_000);
                self.operators();
            }
            self.deliver();
            if self.quiet() {
                break;
            }
            let next = self.next_time(next_sweep, next_operator_round);
            self.clock.set(next.max(now.plus_ms(1)));
        }
        self.report.virtual_ms = self.now().0 - start.0;
        self.check();
    }

    /// Nothing left to happen: every task terminal, no message, no pending action.
    fn quiet(&self) -> bool {
        let r = &self.deps.resources;
        let queues = [&r.submission_queue_url, &r.scheduler_queue_url, &r.agent_queue_url, &r.supervisor_queue_url];
        self.actions.is_empty()
            && queues.iter().all(|q| self.bus.depth(q) == 0)
            && self.store.tasks().len() == self.report.tasks
            && self.store.tasks().iter().all(|t| t.process_state.is_terminal())
    }

    fn next_time(&self, sweep: Millis, operators: Millis) -> Millis {
        let r = &self.deps.resources;
        let mut t = sweep.min(operators);
        for q in [&r.submission_queue_url, &r.scheduler_queue_url, &r.agent_queue_url, &r.supervisor_queue_url] {
            if let Some(v) = self.bus.next_visible(q) {
                let v = if q == &r.agent_queue_url { v.max(self.agents_free_at) } else { v };
                t = t.min(v);
            }
        }
        if let Some((Reverse(when), _, _)) = self.actions.peek() {
            t = t.min(*when);
        }
        t
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Apply { key, task, applied, deadline } => {
                if self.now() >= deadline {
                    return; // the service does not apply a request after its deadline
                }
                if let Some(first) = self.ledger.applied.get(&key) {
                    if first.phase != applied.phase {
                        self.ledger.twice.push(format!("{task}: key {key} used for two kinds of effect"));
                    }
                    return; // a replay: applied once
                }
                self.ledger.applied.insert(key, applied);
            }
            Action::Reply(result) => {
                let msg = SchedulerMessage::Result(*result);
                let body = serde_json::to_string(&msg).expect("results serialise");
                block_on(self.bus.send(&self.deps.resources.scheduler_queue_url, Outgoing::new(body))).ok();
            }
            Action::Operator(msg) => {
                let body = serde_json::to_string(&msg).expect("commands serialise");
                block_on(self.bus.send(&self.deps.resources.scheduler_queue_url, Outgoing::new(body))).ok();
            }
            Action::Submit(body) => {
                block_on(self.bus.send(&self.deps.resources.submission_queue_url, Outgoing::new(body))).ok();
            }
        }
    }

    /// Operators resubmit what is parked in Error, sometimes, and sometimes cancel it instead.
    fn operators(&mut self) {
        let parked: Vec<(TaskId, u32)> = self
            .store
            .tasks()
            .into_iter()
            .filter(|t| t.process_state == ProcessState::Error)
            .map(|t| (t.task_id, t.run))
            .collect();
        for (task_id, run) in parked {
            let msg = if self.chance(self.cfg.faults.resubmit) {
                SchedulerMessage::Resubmit(ResubmitMessage {
                    v: VERSION,
                    task_id,
                    reason: "simulated operator".into(),
                    run: Some(run),
                })
            } else {
                SchedulerMessage::Cancel(CancelMessage {
                    v: VERSION,
                    task_id,
                    reason: "simulated operator".into(),
                    run: Some(run),
                })
            };
            let when = self.now().plus_ms(self.between(0, 1_000));
            self.at(when, Action::Operator(msg));
        }
    }

    /// Hand every visible message to its role (the agents at their fleet's rate), all of one
    /// instant polled together.
    fn deliver(&mut self) {
        let res = self.deps.resources.clone();
        let mut batch: Vec<(Role, String, Received)> = Vec::new();
        for role in [Role::Submitter, Role::Scheduler, Role::Supervisor] {
            let url = role.queue(&res).to_owned();
            let visibility = Duration::from_secs(role.default_visibility_seconds());
            loop {
                let got = block_on(self.bus.receive(&url, 10, Duration::ZERO, visibility)).unwrap_or_default();
                if got.is_empty() {
                    break;
                }
                batch.extend(got.into_iter().map(|m| (role, url.clone(), m)));
            }
        }
        // the agents take requests at their rate; the rest waits in the queue
        let now = self.now();
        if now >= self.agents_free_at {
            let per_ms = u64::from(self.cfg.agent_rate.max(1));
            let take = 10usize;
            let got = block_on(self.bus.receive(&res.agent_queue_url, take, Duration::ZERO, Duration::from_mins(12)))
                .unwrap_or_default();
            if !got.is_empty() {
                self.agents_free_at = now.plus_ms(got.len() as u64 * 1_000 / per_ms);
            }
            for m in &got {
                self.agent(&res.agent_queue_url, m);
            }
        }
        if batch.is_empty() {
            return;
        }
        let f = self.cfg.faults.clone();
        // (role, queue, receipt, record, delete afterwards)
        let mut runs: Vec<(Role, String, String, Record, bool)> = Vec::new();
        for (role, url, m) in batch {
            // Consumers die on a message's first delivery only: a message that kills every consumer
            // ends in its DLQ after maxReceiveCount deliveries, as SQS promises (the DLQ alarm's
            // case, not the protocol's).
            let first = m.receive_count == 1;
            if first && self.chance(f.crash_before) {
                continue; // the consumer died: the message comes back after its visibility timeout
            }
            let record = Record { message_id: m.message_id, body: m.body, receive_count: m.receive_count };
            let delete = !(first && self.chance(f.crash_after));
            if self.chance(f.duplicate) {
                runs.push((role, url.clone(), m.receipt.clone(), record.clone(), false));
            }
            runs.push((role, url, m.receipt, record, delete));
        }
        #[allow(clippy::cast_precision_loss)] // a few hundred at most
        let lost = f.lost_sends * runs.len() as f64;
        if self.chance(lost) {
            self.bus.fail_sends("*", u32::try_from(self.between(1, 4)).unwrap_or(1));
        }
        // like crashes, lost alerts are transient: not on a batch that redelivers a message
        if runs.iter().all(|r| r.3.receive_count == 1) && self.chance(f.lost_alerts) {
            self.bus.fail_sends(&self.deps.resources.alert_topic_arn, 1);
        }
        let deps = &self.deps;
        let agents = AgentRuntime::default();
        let results = block_on(join_all(runs.iter().map(|(role, _, _, r, _)| role::handle(*role, deps, &agents, r))));
        self.bus.clear_send_failures();
        self.report.handled += runs.len() as u64;
        let mut deletes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for ((_, url, receipt, _, delete), r) in runs.into_iter().zip(results) {
            if delete && r.is_ok() {
                deletes.entry(url).or_default().push(receipt);
            }
        }
        for (url, receipts) in deletes {
            block_on(self.bus.delete(&url, receipts)).ok();
        }
        self.observe();
    }

    /// The agent fleet and the remote services, for one request.
    fn agent(&mut self, url: &str, m: &Received) {
        let now = self.now();
        let f = self.cfg.faults.clone();
        if m.receive_count == 1 && self.chance(f.crash_before) {
            return; // the agent died before starting: the request comes back after 720 s
        }
        block_on(self.bus.delete(url, vec![m.receipt.clone()])).ok();
        let Ok(req) = serde_json::from_str::<AgentRequest>(&m.body) else { return };
        self.report.attempts += 1;
        // nothing starts after its start_by; started now, it has its whole timeout
        let Some(deadline) = execution_deadline(&req, now) else { return };
        let latency = if self.chance(f.slow) { self.between(3_000, 9_000) } else { self.between(20, 1_500) };
        let done = now.plus_ms(latency);
        let apply = Action::Apply {
            key: req.idempotency_key.to_string(),
            task: req.task_id.to_string(),
            applied: Applied { at: done, phase: req.phase },
            deadline,
        };
        let reply = |outcome| {
            Action::Reply(Box::new(AgentResult {
                v: VERSION,
                task_id: req.task_id.clone(),
                step: req.step.clone(),
                attempt: req.attempt.clone(),
                outcome,
            }))
        };
        let roll = self.rng.unit();
        let mut p = 0.0;
        let mut pick = |q: f64| {
            p += q;
            roll < p
        };
        // Compensations must eventually succeed for a task to end Compensated: they fail less.
        let k = if req.phase == Phase::Compensate { 0.5 } else { 1.0 };
        if pick(f.transient * k) {
            self.answer(done, deadline, reply(Outcome::Failed { error: "503".into(), retryable: true }));
        } else if pick(f.permanent * k) {
            self.answer(done, deadline, reply(Outcome::Failed { error: "declined".into(), retryable: false }));
        } else if pick(f.hang * k) {
            // no effect, no answer
        } else if pick(f.effect_no_answer * k) {
            self.at(done, apply); // the agent died after the service applied the effect
        } else if pick(f.effect_then_retryable * k) {
            self.at(done, apply);
            let later = done.plus_ms(self.between(10, 500));
            self.answer(later, deadline, reply(Outcome::Failed { error: "timeout, then 503".into(), retryable: true }));
        } else {
            self.at(done, apply);
            self.answer(done, deadline, reply(Outcome::Succeeded { output: json!({"ok": true}) }));
        }
    }

    /// An agent sends its result only before the attempt's deadline.
    fn answer(&mut self, when: Millis, deadline: Millis, action: Action) {
        if when < deadline {
            self.at(when, action);
        }
    }

    /// Record the states seen, and any terminal state left.
    fn observe(&mut self) {
        for t in self.store.tasks() {
            let id = t.task_id.to_string();
            match self.terminal.get(&id) {
                Some(&first) if first != t.process_state => {
                    self.report
                        .violations
                        .push(format!("{id}: terminal state {first} overwritten by {}", t.process_state));
                    self.terminal.insert(id, t.process_state);
                }
                None if t.process_state.is_terminal() && t.process_state != ProcessState::Error => {
                    self.terminal.insert(id, t.process_state);
                }
                Some(_) | None => {}
            }
        }
    }

    /// The effect of a unit under any generation of its key (`{task}:{unit}`, `{task}:{unit}#n`):
    /// the earliest, if several generations applied (which an operator's resume allows only after
    /// a refusal).
    fn applied(&self, task: &str, unit: &str) -> Option<&Applied> {
        let key = format!("{task}:{unit}");
        self.ledger
            .applied
            .range(key.clone()..)
            .take_while(|(k, _)| k.starts_with(&key))
            .filter(|(k, _)| k.len() == key.len() || k[key.len()..].starts_with('#'))
            .map(|(_, a)| a)
            .min_by_key(|a| a.at)
    }

    fn check(&mut self) {
        let mut v = std::mem::take(&mut self.report.violations);
        v.extend(self.ledger.twice.iter().cloned());
        let tasks = self.store.tasks();
        if tasks.len() != self.report.tasks {
            v.push(format!("{} of {} submissions became tasks", tasks.len(), self.report.tasks));
        }
        let r = &self.deps.resources;
        for q in [&r.submission_queue_url, &r.scheduler_queue_url, &r.agent_queue_url, &r.supervisor_queue_url] {
            for body in self.bus.bodies(&format!("{q}-dlq")) {
                v.push(format!("dead-lettered from {q}: {}", crate::ids::clip(&body, 200)));
            }
        }
        let alerts: BTreeSet<String> = self
            .bus
            .published()
            .into_iter()
            .filter(|(_, p)| p.attributes.iter().any(|(k, val)| k == "kind" && val == "task_error"))
            .filter_map(|(_, p)| p.attributes.iter().find(|(k, _)| k == "task_id").map(|(_, val)| val.clone()))
            .collect();
        for t in &tasks {
            let id = t.task_id.to_string();
            *self.report.end_states.entry(t.process_state.to_string()).or_default() += 1;
            self.report.units += t.steps.iter().filter(|s| s.attempts > 0).count() as u64;
            if !t.process_state.is_terminal() {
                v.push(format!(
                    "{id}: not terminal after {} s: {} ({:?})",
                    self.report.virtual_ms / 1000,
                    t.process_state,
                    t.reason
                ));
            }
            if t.process_state == ProcessState::Error && !alerts.contains(&id) {
                v.push(format!("{id}: Error without a task_error alert"));
            }
            if t.process_state == ProcessState::Processed {
                continue;
            }
            for def in &t.workflow.steps {
                let Some(comp) = &def.compensation else { continue };
                let fwd = self.applied(&id, &def.name);
                let undo = self.applied(&id, &comp.name);
                match (fwd, undo) {
                    (Some(f), None) if t.process_state != ProcessState::Error => v.push(format!(
                        "{id}: ended {} but {} applied at {} was never undone",
                        t.process_state, def.name, f.at
                    )),
                    (Some(f), Some(u)) if u.at < f.at => v.push(format!(
                        "{id}: {} applied at {} after its compensation {} at {}",
                        def.name, f.at, comp.name, u.at
                    )),
                    _ => {}
                }
            }
        }
        self.report.violations = v;
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
