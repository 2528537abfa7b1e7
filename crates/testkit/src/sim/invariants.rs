//! The invariants, checked after each instant (`observe`) and at the end of a run (`check`)
//! against the remote services' ledger, the queues and the topic (listed in `sim`'s docs).

use std::collections::{BTreeMap, BTreeSet};

use sas_core::bus::MemoryBus;
use sas_core::ids::{Millis, TaskId};
use sas_core::messages::{Phase, StatusMessage};
use sas_core::protocol::{CompensationStatus, EndCause, ProcessState, Stage, StepStatus};
use sas_core::role::Role;
use sas_core::workflow::StepDef;

use super::{
    Applied, Claim, Episode, Fate, Sim, LATE_HUNG_MS, LATE_LOST_MS, LIMIT, LIMITED_AGENT, MAP_CONCURRENCY,
    MAX_TERMINAL_REPLIES, REPLY_QUEUE, SWEEP_BOUND_MS,
};

/// The most intervals `[start, end)` open at once, and the first instant it was so (a call that
/// ends when another starts is not open with it).
pub(super) fn most_at_once(calls: &[(Millis, Millis)]) -> (u32, Millis) {
    let mut edges: Vec<(Millis, i32)> = calls.iter().flat_map(|(s, e)| [(*s, 1), (*e, -1)]).collect();
    edges.sort(); // at one instant, ends (-1) before starts (+1)
    let (mut open, mut most, mut at) = (0i32, 0i32, Millis(0));
    for (t, d) in edges {
        open += d;
        if open > most {
            most = open;
            at = t;
        }
    }
    (u32::try_from(most).unwrap_or(0), at)
}

impl Sim {
    /// Record the states seen, and any terminal state left.
    pub(super) fn observe(&mut self) {
        let now = self.now();
        let tasks = self.store.tasks();
        self.observe_maps(&tasks);
        for t in tasks {
            let id = t.task_id.to_string();
            // attempts claimed and let go
            let lock = t.locked_by.as_ref().map(ToString::to_string);
            if self.locks.get(&id) != lock.as_ref() {
                if let Some(old) = self.locks.remove(&id) {
                    let cancelled = t.process_state == ProcessState::Cancelled
                        || matches!(t.stage, Stage::Compensating { cause: EndCause::Cancelled, .. });
                    if let Some(c) = self.claims.get_mut(&old) {
                        if c.released.is_none() {
                            let done = t.steps.iter().any(|s| match c.phase {
                                Phase::Forward => s.name == c.step && s.status == StepStatus::Succeeded,
                                Phase::Compensate => s
                                    .compensation
                                    .as_ref()
                                    .is_some_and(|r| r.name == c.step && r.status == CompensationStatus::Done),
                            });
                            c.released = Some(now);
                            c.by_operator = cancelled || t.run != c.run || done;
                            c.expired = now >= c.complete_by.plus_ms(self.deps.settings.policy.result_grace_ms);
                        }
                    }
                }
                if let Some(token) = lock {
                    self.claims.entry(token.clone()).or_insert_with(|| Claim {
                        task: id.clone(),
                        step: t.current_def().name.clone(),
                        phase: t.phase(),
                        run: t.run,
                        complete_by: t.complete_by.unwrap_or(now),
                        released: None,
                        by_operator: false,
                        by_supervisor: self.supervised.contains(&id),
                        claimed_at: now,
                        expired: false,
                    });
                    self.locks.insert(id.clone(), token);
                }
            }
            // Error episodes
            if t.process_state == ProcessState::Error {
                if self.in_error.insert(id.clone()) {
                    self.episodes.entry(id.clone()).or_default().push(Episode::default());
                }
            } else {
                self.in_error.remove(&id);
            }
            // A map element that succeeded is undone when its parent compensates: the one
            // terminal state that is left, for Compensated (or Error, if it cannot undo).
            let undone = t.task_id.is_child()
                && (self.undoing.contains(&id)
                    || (self.terminal.get(&id) == Some(&ProcessState::Processed)
                        && matches!(t.stage, Stage::Compensating { .. })));
            if undone {
                self.undoing.insert(id.clone());
                if t.process_state.is_terminal() {
                    self.terminal.insert(id.clone(), t.process_state);
                }
            }
            match self.terminal.get(&id) {
                Some(&first) if first != t.process_state && !undone => {
                    self.report
                        .violations
                        .push(format!("overwritten: {id}: terminal state {first} overwritten by {}", t.process_state));
                    self.terminal.insert(id, t.process_state);
                }
                None if t.process_state.is_terminal() && t.process_state != ProcessState::Error => {
                    self.terminal.insert(id, t.process_state);
                }
                Some(_) | None => {}
            }
        }
    }

    /// Map elements running at once, per parent (not counting the undo of one that succeeded),
    /// and each map step's joins.
    pub(super) fn observe_maps(&mut self, tasks: &[sas_core::protocol::Task]) {
        let mut running: BTreeMap<String, u32> = BTreeMap::new();
        for t in tasks {
            if let Some((parent, _, _)) = t.task_id.parent_of() {
                // an element that succeeded and is undone runs again, but not as the map's work
                let undo = t.steps.first().is_some_and(|s| s.status == StepStatus::Succeeded);
                // a region's branches (which carry their upstream outputs) are not map elements
                if !t.process_state.is_terminal() && !undo && t.upstream.is_none() {
                    *running.entry(parent.to_string()).or_default() += 1;
                }
            }
            for (i, s) in t.steps.iter().enumerate() {
                if s.map.is_none() {
                    continue;
                }
                let key = format!("{}#{i}", t.task_id);
                if s.output.is_some() && self.joined.insert(key.clone()) {
                    *self.joins.entry(key).or_default() += 1;
                }
            }
        }
        for (parent, n) in running {
            self.report.elements_max = self.report.elements_max.max(n);
            if n > MAP_CONCURRENCY {
                self.report.violations.push(format!(
                    "max-concurrency: {parent}: {n} map elements ran at once; its max_concurrency is {MAP_CONCURRENCY}"
                ));
            }
        }
    }

    /// The effect of a unit under any generation of its key (`{task}:{unit}`, `{task}:{unit}#n`):
    /// the earliest, if several generations applied (which an operator's resume allows only after
    /// a refusal).
    pub(super) fn applied(&self, task: &str, unit: &str) -> Option<&Applied> {
        let key = format!("{task}:{unit}");
        self.ledger
            .applied
            .range(key.clone()..)
            .take_while(|(k, _)| k.starts_with(&key))
            .filter(|(k, _)| k.len() == key.len() || k[key.len()..].starts_with('#'))
            .map(|(_, a)| a)
            .min_by_key(|a| a.at)
    }

    /// The effects of a unit under every generation of its key.
    pub(super) fn applied_all(&self, task: &str, unit: &str) -> Vec<&Applied> {
        let key = format!("{task}:{unit}");
        self.ledger
            .applied
            .range(key.clone()..)
            .take_while(|(k, _)| k.starts_with(&key))
            .filter(|(k, _)| k.len() == key.len() || k[key.len()..].starts_with('#'))
            .map(|(_, a)| a)
            .collect()
    }

    pub(super) fn check(&mut self) {
        let mut v = std::mem::take(&mut self.report.violations);
        v.extend(self.ledger.twice.iter().cloned());
        let (most, at) = most_at_once(&self.limited_calls);
        self.report.limited_max = most;
        if most > LIMIT {
            v.push(format!(
                "max-in-flight: {most} calls of {LIMITED_AGENT} were open at once at {}; its max_in_flight is {LIMIT}",
                at.0
            ));
        }
        let tasks = self.store.tasks();
        let submitted = tasks.iter().filter(|t| !t.task_id.is_child()).count();
        if submitted != self.report.tasks {
            v.push(format!("terminal: {submitted} of {} submissions became tasks", self.report.tasks));
        }
        self.check_maps(&tasks, &mut v);
        for q in self.queues() {
            for body in self.bus.bodies(&MemoryBus::dlq_of(&q)) {
                v.push(format!("dlq: dead-lettered from {q}: {}", sas_core::ids::clip(&body, 200)));
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
            let states =
                if t.task_id.is_child() { &mut self.report.element_states } else { &mut self.report.end_states };
            *states.entry(t.process_state.to_string()).or_default() += 1;
            if !t.task_id.is_child() && t.process_state != ProcessState::Processed && self.report.unprocessed.len() < 20
            {
                let why = format!("{}: {}", t.process_state, t.reason.as_deref().unwrap_or("-"));
                self.report.unprocessed.insert(id.clone(), why);
            }
            self.report.units += t.steps.iter().filter(|s| s.attempts > 0).count() as u64;
            if !t.process_state.is_terminal() {
                v.push(format!(
                    "terminal: {id}: not terminal after {} s: {} ({:?})",
                    self.report.virtual_ms / 1000,
                    t.process_state,
                    t.reason
                ));
            }
            // The item's entries and the archive are the whole history, each status once.
            let seqs: Vec<u64> = self.store.archived(&t.task_id).iter().chain(&t.history).map(|h| h.seq).collect();
            if seqs != (1..=t.status_seq).collect::<Vec<u64>>() {
                v.push(format!("history: {id}: statuses kept and archived {seqs:?}, {} written", t.status_seq));
            }
            if t.process_state == ProcessState::Error && !alerts.contains(&id) {
                v.push(format!("error-alert: {id}: Error without a task_error alert"));
            }
            if t.process_state == ProcessState::Processed {
                // a map step applies nothing itself, nor do a region's steps: its elements and
                // branches are tasks, checked as such
                let regions = t.workflow.regions();
                let in_region = |d: &StepDef| {
                    let j = t.workflow.steps.iter().position(|s| s.name == d.name).unwrap_or(0);
                    regions.iter().any(|r| r.contains(&j))
                };
                for def in t.workflow.steps.iter().filter(|d| d.kind.uses_agent() && d.map.is_none() && !in_region(d)) {
                    let n = self.applied_all(&id, &def.name).len();
                    if n != 1 {
                        v.push(format!("processed-once: {id}: Processed, but step {} applied {n} times", def.name));
                    }
                    if let Some(comp) = &def.compensation {
                        if !self.applied_all(&id, &comp.name).is_empty() {
                            v.push(format!("processed-once: {id}: Processed, but {} was compensated", def.name));
                        }
                    }
                }
                continue;
            }
            for def in &t.workflow.steps {
                let Some(comp) = &def.compensation else { continue };
                let fwd = self.applied(&id, &def.name);
                let undo = self.applied(&id, &comp.name);
                match (fwd, undo) {
                    (Some(f), None) if t.process_state != ProcessState::Error => v.push(format!(
                        "undone: {id}: ended {} but {} applied at {} was never undone",
                        t.process_state, def.name, f.at
                    )),
                    (Some(f), Some(u)) if u.at < f.at => v.push(format!(
                        "undone: {id}: {} applied at {} after its compensation {} at {}",
                        def.name, f.at, comp.name, u.at
                    )),
                    _ => {}
                }
            }
        }
        self.check_replies(&tasks, &mut v);
        self.check_claims(&mut v);
        for (id, episodes) in &self.episodes {
            for (i, e) in episodes.iter().enumerate() {
                if e.fresh > 1 {
                    v.push(format!(
                        "alert-once: {id}: {} task_error alerts for Error episode {} ({} more on redeliveries)",
                        e.fresh,
                        i + 1,
                        e.repeated
                    ));
                }
            }
        }
        for (id, handled) in &self.timers_handled {
            let handed = self.timers_handed.get(id).copied().unwrap_or(0);
            if handled.len() > handed {
                v.push(format!(
                    "timers-bounded: {id}: the Supervisor handled {} timers without an attempt; the sweeps handed it {handed}",
                    handled.len()
                ));
            }
        }
        self.report.violations = v;
    }

    /// Every map's elements: none lost (a Processed map has every element Processed, its output
    /// one entry per element), each succeeded element undone when its task compensates, each join
    /// made once.
    pub(super) fn check_maps(&self, tasks: &[sas_core::protocol::Task], v: &mut Vec<String>) {
        let by_id: BTreeMap<&str, &sas_core::protocol::Task> = tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
        for t in tasks {
            for (i, s) in t.steps.iter().enumerate() {
                let Some(p) = &s.map else { continue };
                let key = format!("{}#{i}", t.task_id);
                let elements: Vec<Option<&&sas_core::protocol::Task>> =
                    (0..p.n).map(|e| by_id.get(TaskId::child(&t.task_id, i, e).as_str())).collect();
                let existing = elements.iter().filter(|e| e.is_some()).count();
                if existing != p.started as usize {
                    v.push(format!("element-lost: {key}: {} elements started, {existing} exist", p.started));
                }
                if let Some(r) = t.workflow.region_at(i) {
                    self.check_region(t, i, &r, &elements, v);
                    continue;
                }
                match t.process_state {
                    ProcessState::Processed => {
                        let ok = elements
                            .iter()
                            .filter(|e| e.is_some_and(|c| c.process_state == ProcessState::Processed))
                            .count();
                        let out = s.output.as_ref().and_then(|o| o.as_array()).map_or(0, Vec::len);
                        if ok != p.n as usize || out != p.n as usize {
                            v.push(format!(
                                "element-lost: {key}: Processed with {ok} of {} elements Processed and {out} outputs",
                                p.n
                            ));
                        }
                    }
                    ProcessState::Compensated | ProcessState::Cancelled => {
                        for c in elements.iter().flatten() {
                            if c.process_state != ProcessState::Compensated
                                && c.process_state != ProcessState::Cancelled
                            {
                                v.push(format!(
                                    "map-undone: {key}: the task ended {} but element {} ended {}",
                                    t.process_state, c.task_id, c.process_state
                                ));
                            }
                        }
                    }
                    _ => {}
                }
                if let Some(n) = self.joins.get(&key).filter(|n| **n > 1) {
                    v.push(format!("join-once: {key}: joined {n} times"));
                }
            }
        }
    }

    /// A parallel region's branches: a Processed task has every branch Processed and every step
    /// of the region its output; a compensated one none left Processed, and each branch undone
    /// after the branches that come after it (`branch-order`).
    pub(super) fn check_region(
        &self,
        t: &sas_core::protocol::Task,
        head: usize,
        r: &std::ops::Range<usize>,
        branches: &[Option<&&sas_core::protocol::Task>],
        v: &mut Vec<String>,
    ) {
        let key = format!("{}#{head}", t.task_id);
        match t.process_state {
            ProcessState::Processed => {
                let ok =
                    branches.iter().filter(|b| b.is_some_and(|c| c.process_state == ProcessState::Processed)).count();
                let outs = t.steps[r.clone()].iter().filter(|s| s.output.is_some()).count();
                if ok != r.len() || outs != r.len() {
                    v.push(format!(
                        "element-lost: {key}: Processed with {ok} of {} branches Processed and {outs} outputs",
                        r.len()
                    ));
                }
            }
            ProcessState::Compensated | ProcessState::Cancelled => {
                for c in branches.iter().flatten() {
                    if !matches!(c.process_state, ProcessState::Compensated | ProcessState::Cancelled) {
                        v.push(format!(
                            "map-undone: {key}: the task ended {} but branch {} ended {}",
                            t.process_state, c.task_id, c.process_state
                        ));
                    }
                }
                let Ok(graph) = t.workflow.graph() else { return };
                // when a branch's undos landed, first and last: its own, or its elements' when
                // it is a map (`{branch}~{step}~{i}`)
                let undone_at = |e: usize| {
                    let def = &t.workflow.steps[r.start + e];
                    let comp = def.compensation.as_ref()?;
                    let id = TaskId::child(&t.task_id, head, u32::try_from(e).ok()?).to_string();
                    let unit = format!(":{}", comp.name);
                    let ats: Vec<Millis> = self
                        .ledger
                        .applied
                        .range(id.clone()..)
                        .take_while(|(k, _)| k.starts_with(&id))
                        .filter(|(k, _)| k.contains(&unit))
                        .map(|(_, a)| a.at)
                        .collect();
                    Some((def.name.clone(), *ats.iter().min()?, *ats.iter().max()?))
                };
                for a in 0..r.len() {
                    for b in 0..r.len() {
                        if !graph.comes_before(r.start + a, r.start + b) {
                            continue;
                        }
                        if let (Some((an, at_a, _)), Some((bn, _, at_b))) = (undone_at(a), undone_at(b)) {
                            if at_a < at_b {
                                v.push(format!(
                                    "branch-order: {key}: {an} was undone at {at_a}, before {bn} (after it) at {at_b}"
                                ));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Every task's final status reached the reply queue, and no terminal status too often.
    pub(super) fn check_replies(&self, tasks: &[sas_core::protocol::Task], v: &mut Vec<String>) {
        let mut delivered: BTreeMap<(String, u64), (ProcessState, usize)> = BTreeMap::new();
        for body in self.bus.bodies(REPLY_QUEUE) {
            match serde_json::from_str::<StatusMessage>(&body) {
                // the answer to a duplicate submission is a notice of its own, not a redelivery
                Ok(s) if s.duplicate => {}
                Ok(s) => delivered.entry((s.task_id.to_string(), s.seq)).or_insert((s.state, 0)).1 += 1,
                Err(e) => v.push(format!("reply-once: a reply that is no status: {e}")),
            }
        }
        for ((id, seq), (state, n)) in &delivered {
            let repeats = self.repeated_answers.get(id).copied().unwrap_or(0);
            if state.is_terminal() && *n > MAX_TERMINAL_REPLIES + repeats {
                v.push(format!("reply-once: {id}: status {seq} ({state}) delivered {n} times"));
            }
        }
        for t in tasks.iter().filter(|t| t.reply_to.is_some() && t.process_state.is_terminal()) {
            let id = t.task_id.to_string();
            let Some(last) = t.history.last().map(|h| h.status(&t.task_id)) else { continue };
            if !delivered.get(&(id.clone(), last.seq)).is_some_and(|(state, _)| *state == t.process_state) {
                v.push(format!(
                    "reply-once: {id}: its final status {} (seq {}) never reached the reply queue",
                    t.process_state, last.seq
                ));
            }
        }
    }

    /// Every claimed attempt was dispatched, and attempts that hung or were lost did not hold
    /// their task past the bounds.
    pub(super) fn check_claims(&self, v: &mut Vec<String>) {
        let grace = self.deps.settings.policy.result_grace_ms;
        let end = self.now();
        let redelivery = Role::Scheduler.default_visibility_seconds() * 1_000;
        for token in &self.dead {
            let (Some(c), Some((heard, window))) = (self.claims.get(token), self.heard.get(token)) else { continue };
            if self.delayed.contains(token) {
                continue;
            }
            // its deadline is at most one heartbeat window after it was last heard of (or the
            // first window after the queue budget, if it never heartbeated)
            let due = heard.plus_ms(*window).max(c.complete_by).plus_ms(grace).max(c.claimed_at.plus_ms(redelivery));
            let released = c.released.unwrap_or(end);
            let bound = if c.by_supervisor { SWEEP_BOUND_MS } else { LATE_LOST_MS };
            if released.0 > due.0 + bound {
                v.push(format!(
                    "callback-lost: {}: the worker of attempt {token} of {} died; the task let it go {} ms after its heartbeat deadline + grace",
                    c.task,
                    c.step,
                    released.0 - due.0
                ));
            }
        }
        for (token, c) in &self.claims {
            // A claim whose sends failed is sent again when its message comes back after the
            // queue's visibility timeout; if its deadline comes first, the Supervisor recovers it
            // (it costs the attempt): not charged.
            let outrun = c.expired && c.complete_by.plus_ms(grace) <= c.claimed_at.plus_ms(redelivery);
            if !self.dispatched.contains(token) && !c.by_operator && !c.by_supervisor && !outrun {
                v.push(format!(
                    "dispatched: {}: attempt {token} of {} was claimed but its request never reached the agent queue",
                    c.task, c.step
                ));
                continue;
            }
            let fates = self.fates.get(token).map(Vec::as_slice).unwrap_or_default();
            if fates.is_empty() || fates.contains(&Fate::Answered) || self.delayed.contains(token) {
                continue;
            }
            let released = c.released.unwrap_or(end);
            let cut = fates.iter().filter_map(|f| if let Fate::Cut { at } = f { Some(*at) } else { None }).min();
            if let Some(at) = cut {
                if released.0 > at.0 + LATE_HUNG_MS {
                    v.push(format!(
                        "late-hung: {}: attempt {token} of {} was cut by its agent at {at}; the task let it go {} ms later",
                        c.task,
                        c.step,
                        released.0 - at.0
                    ));
                }
            } else {
                // its timer is due then, or, when the claim's sends failed, its message comes
                // back after the scheduler queue's visibility timeout and sends them again
                let due = c.complete_by.plus_ms(grace).max(c.claimed_at.plus_ms(redelivery));
                let bound = if c.by_supervisor { SWEEP_BOUND_MS } else { LATE_LOST_MS };
                if released.0 > due.0 + bound {
                    v.push(format!(
                        "late-lost: {}: attempt {token} of {} was lost; the task let it go {} ms after CompleteBy + grace",
                        c.task,
                        c.step,
                        released.0 - due.0
                    ));
                }
            }
        }
    }
}
