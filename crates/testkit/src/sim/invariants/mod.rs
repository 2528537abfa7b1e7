//! The invariants, checked after each instant (`observe`) and at the end of a run (`check`)
//! against the remote services' ledger, the queues and the topic (listed in `sim`'s docs): the
//! tasks' here (`terminal`, `dlq`, `undone`, `error-alert`, `overwritten`, `processed-once`,
//! `history`, `alert-once`, `timers-bounded`, `max-in-flight`, `key-limit`, `key-waited`, `schedule-once`), the maps' and regions' in [`maps`]
//! (`element-lost`, `map-undone`, `join-once`), the replies' in [`replies`] (`reply-once`), the
//! attempts' in [`claims`] (`dispatched`, `late-hung`, `late-lost`, `callback-lost`,
//! `hung-reported`); the decisions' here (`skipped`, `decided-once`) and in [`maps`]
//! (`child-ended`, `child-once`, `child-undone`). `key-once` is the ledger's own (the fleet), `success-kept` the driver's (it
//! sees the results it hands the Scheduler).

use std::collections::BTreeSet;

use sas_core::bus::MemoryBus;
use sas_protocol::ids::Millis;
use sas_protocol::messages::Phase;
use sas_protocol::protocol::{CompensationStatus, EndCause, ProcessState, Stage, StepStatus};
use sas_protocol::workflow::StepDef;

use super::{Applied, Claim, Episode, Sim, KEY_LIMIT, LIMIT, LIMITED_AGENT};

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

mod claims;
mod maps;
mod replies;

impl Sim {
    /// Create the schedule of [`SimConfig::schedule`](super::SimConfig::schedule): every minute,
    /// of `order`, overlap `skip` (its key is checked by `key-limit` as any key).
    pub(super) fn start_schedule(&mut self) {
        use sas_protocol::schedules::{Every, Overlap, Schedule};
        let input = serde_json::json!({"sku": "a", "lines": [{"sku": "s0", "qty": 1}], "cool_off_s": 2});
        let made = futures::executor::block_on(sas_core::schedules::edit(&self.deps, |all, now| {
            let s = Schedule::new(
                "order",
                None,
                input.clone(),
                Every::Cron("* * * * *".into()),
                None,
                Overlap::Skip,
                0,
                now,
            )?;
            all.schedules.insert(super::SCHEDULE.to_owned(), s);
            Ok(())
        }));
        if !matches!(made, Ok(Ok(()))) {
            self.report.violations.push(format!("schedule: could not be created: {made:?}"));
        }
    }

    /// `schedule-once`: the operator deletes the schedule; the sweeps had moved it through every
    /// instant from its first to its next, one by one (each sent once, none skipped), and missed
    /// none.
    pub(super) fn end_schedule(&mut self) {
        let gone = futures::executor::block_on(sas_core::schedules::edit(&self.deps, |all, _| {
            all.schedules.remove(super::SCHEDULE).ok_or_else(|| "no schedule".to_owned())
        }));
        let Ok(Ok(s)) = gone else {
            self.report.violations.push(format!("schedule: could not be deleted: {gone:?}"));
            return;
        };
        let first = s.next_after(s.created).ok().flatten().unwrap_or(s.next);
        let instants = s.instants(first, s.next, 100_000).map_or(u64::MAX, |i| i.len() as u64);
        if s.fired != instants || s.missed != 0 {
            self.report.violations.push(format!(
                "schedule-once: the schedule sent {} instants and missed {}; from its first to its next it had {instants}",
                s.fired, s.missed
            ));
        }
        self.report.scheduled_sent = s.fired;
    }

    /// `key-limit`: never more than [`KEY_LIMIT`] tasks of one concurrency key running (claimed,
    /// not ended) at once. A task resubmitted from `Error` runs beside its key's limit (it gave its
    /// slot back when it ended in `Error`), so tasks that were in `Error` are not counted.
    fn observe_key(&mut self, t: &sas_protocol::protocol::Task, id: &str) {
        let Some(slot) = &t.slot else { return };
        if t.waits_for_slot() && self.keyed_waited.insert(id.to_owned()) {
            self.report.key_waited += 1;
        }
        let running = !t.process_state.is_terminal() && !t.waits_for_slot() && !self.episodes.contains_key(id);
        let now = self.now();
        let set = self.keyed_running.entry(slot.key.clone()).or_default();
        if running {
            set.insert(id.to_owned());
        } else {
            set.remove(id);
        }
        self.report.key_max = self.report.key_max.max(set.len());
        if set.len() > KEY_LIMIT as usize {
            self.report.violations.push(format!(
                "key-limit: {} tasks of key {} run at once at {} ({:?}); its limit is {KEY_LIMIT}",
                set.len(),
                slot.key,
                now.0,
                set
            ));
        }
    }

    /// Record the states seen, and any terminal state left.
    ///
    /// Reads the tasks written since the last look only (in the order of their ids, as a look at
    /// every task would take them): what it records is each task's own, or kept up to date with
    /// each change (the elements running per map, the loops' iterations), so a task left as it was
    /// has nothing new to say, and an invariant broken is reported when a task involved changes.
    pub(super) fn observe(&mut self) {
        let now = self.now();
        let (mut tasks, mark) = self.store.written_since(self.observed);
        self.observed = mark;
        tasks.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        self.observe_maps(&tasks);
        self.observe_children(&tasks);
        for t in tasks {
            let id = t.task_id.to_string();
            // attempts claimed and let go
            let lock = t.lock.locked_by.as_ref().map(ToString::to_string);
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
                // a lock with no agent (a wait step, a loop between iterations) is a timer: no request
                if let Some(token) = lock.filter(|_| t.current_def().kind.uses_agent()) {
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
            self.observe_key(&t, &id);
            // a guard is decided once per unit: a step seen skipped stays skipped
            if let Some(seen) = self.skips_seen.get(&id) {
                for &j in seen {
                    if t.steps[j].status != StepStatus::Skipped {
                        self.report.violations.push(format!(
                            "decided-once: {id}: step {} was skipped, and is now {:?}",
                            t.steps[j].name, t.steps[j].status
                        ));
                    }
                }
            }
            for (j, _) in t.steps.iter().enumerate().filter(|(_, s)| s.status == StepStatus::Skipped) {
                if !self.skips_seen.get(&id).is_some_and(|seen| seen.contains(&j)) {
                    self.skips_seen.entry(id.clone()).or_default().insert(j);
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

    /// `skipped`: a step the protocol skipped (its guard was false, or every step it waits for
    /// was) was never claimed, never run as a branch, never applied and never undone, under any
    /// key. Returns the steps skipped and the failures handled (`on_failure: continue`).
    fn check_skips(&self, tasks: &[sas_protocol::protocol::Task], v: &mut Vec<String>) -> (u64, u64) {
        let (mut skipped, mut handled) = (0, 0);
        let all: BTreeSet<String> = tasks.iter().map(|t| t.task_id.to_string()).collect();
        for t in tasks {
            let id = t.task_id.to_string();
            let regions = t.workflow.regions();
            for (j, (s, def)) in t.steps.iter().zip(&t.workflow.steps).enumerate() {
                if s.status != StepStatus::Skipped {
                    handled += u64::from(s.status != StepStatus::Succeeded && s.result().is_some());
                    continue;
                }
                skipped += 1;
                let claimed = self.claims.values().any(|c| c.task == id && c.step == s.name);
                let applied = !self.applied_all(&id, &s.name).is_empty();
                let undone = def.compensation.as_ref().is_some_and(|c| !self.applied_all(&id, &c.name).is_empty());
                let spawned = regions.iter().find(|r| r.contains(&j)).is_some_and(|r| {
                    let e = u32::try_from(j - r.start).unwrap_or(u32::MAX);
                    all.contains(&sas_protocol::ids::TaskId::child(&t.task_id, r.start, e).to_string())
                });
                if claimed || applied || undone || spawned {
                    v.push(format!(
                        "skipped: {id}: step {} was skipped ({}), yet claimed {claimed}, run as a branch {spawned}, \
                         applied {applied}, undone {undone}",
                        s.name,
                        s.skipped.as_deref().unwrap_or("-")
                    ));
                }
            }
        }
        (skipped, handled)
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
        let prefix = format!("{}-", super::SCHEDULE);
        let scheduled = |t: &&sas_protocol::protocol::Task| t.task_id.as_str().starts_with(&prefix);
        self.report.scheduled_tasks = tasks.iter().filter(scheduled).count();
        let submitted = tasks.iter().filter(|t| !t.task_id.is_child() && !scheduled(t)).count();
        if submitted != self.report.tasks {
            v.push(format!("terminal: {submitted} of {} submissions became tasks", self.report.tasks));
        }
        self.check_maps(&tasks, &mut v);
        // `key-waited`: every task that waited for a slot of its key started or was cancelled
        for (key, state) in self.store.keys() {
            if !state.waiting.is_empty() {
                v.push(format!("key-waited: {} task(s) still wait on {key}: {:?}", state.waiting.len(), state.line()));
            }
        }
        for q in self.queues() {
            for body in self.bus.bodies(&MemoryBus::dlq_of(&q)) {
                v.push(format!("dlq: dead-lettered from {q}: {}", sas_protocol::ids::clip(&body, 200)));
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
            let states = if t.called {
                &mut self.report.child_states
            } else if t.task_id.is_child() {
                &mut self.report.element_states
            } else {
                &mut self.report.end_states
            };
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
                    let record = t.steps.iter().find(|s| s.name == def.name);
                    // a skipped step never applies; one whose failure was handled applied at most once
                    let expected = match record.map(|r| r.status) {
                        Some(StepStatus::Skipped) => 0..=0,
                        Some(StepStatus::Failed | StepStatus::TimedOut) => 0..=1,
                        _ => 1..=1,
                    };
                    if !expected.contains(&n) {
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
                if t.steps.iter().any(|s| s.name == def.name && s.status == StepStatus::Skipped) {
                    continue; // `skipped` speaks for it
                }
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
        (self.report.skipped, self.report.handled_failures) = self.check_skips(&tasks, &mut v);
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
}
