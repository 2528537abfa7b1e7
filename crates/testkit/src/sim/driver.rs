//! The driver: virtual time, the operators, and each instant's deliveries to the roles, through the
//! functions' own batch handling (one invocation per receive).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::executor::block_on;
use futures::future::join_all;
use sas_core::agent::AgentRuntime;
use sas_core::bus::{Bus, Outgoing, Received};
use sas_core::role::{Record, Role};
use sas_core::store::{Ambiguity, StoreOp};
use sas_core::{callback, role, supervisor};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{Outcome, Phase, ResubmitMessage, SchedulerMessage, TimerMessage, VERSION};
use sas_protocol::protocol::ProcessState;

use super::fixtures::cancel;
use super::{Action, Episode, Sim, Turn, LIMITED_AGENT};

impl Sim {
    pub(super) fn go(&mut self) {
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
                // half of the cancels come while the burst still runs, the rest any time in a minute
                let within = if self.chance(0.5) { 5_000 } else { 60_000 };
                let when = start.plus_ms(self.between(0, within));
                let msg = cancel(TaskId::try_from(id.as_str()).expect("valid id"), None);
                self.at(when, Action::Operator(msg));
            }
        }
        if let Some(minutes) = self.cfg.schedule {
            self.start_schedule();
            self.at(start.plus_ms(minutes * 60_000 + 1), Action::EndSchedule);
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
                if self.chance(self.cfg.faults.batch_failures * 10.0) {
                    self.bus.fail_requests(&self.deps.resources.supervisor_queue_url, 1);
                }
                let before = self.attempt_less_timers();
                let deps = &self.deps;
                if two {
                    block_on(futures::future::join(supervisor::sweep(deps), supervisor::sweep(deps)));
                } else {
                    block_on(supervisor::sweep(deps));
                }
                self.bus.clear_send_failures();
                for (task, n) in self.attempt_less_timers() {
                    let added = n.saturating_sub(before.get(&task).copied().unwrap_or(0));
                    *self.timers_handed.entry(task).or_default() += added;
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

    /// The stack's queues the roles consume (the ends queue when the stack has one).
    pub(super) fn queues(&self) -> Vec<String> {
        let r = &self.deps.resources;
        [&r.submission_queue_url, &r.scheduler_queue_url, &r.agent_queue_url, &r.supervisor_queue_url]
            .into_iter()
            .chain(&r.ends_queue_url)
            .cloned()
            .collect()
    }

    /// Nothing left to happen: every task terminal, no message, no pending action.
    pub(super) fn quiet(&mut self) -> bool {
        let (written, mark) = self.store.written_since(self.quiet_mark);
        self.quiet_mark = mark;
        for t in written {
            let id = t.task_id.to_string();
            // the submissions' tasks (the schedule's come beside them)
            if !t.task_id.is_child() && !id.starts_with(&format!("{}-", super::SCHEDULE)) {
                self.roots.insert(id.clone());
            }
            if t.process_state.is_terminal() {
                self.live.remove(&id);
            } else {
                self.live.insert(id);
            }
        }
        self.actions.is_empty()
            && self.queues().iter().all(|q| self.bus.depth(q) == 0)
            && self.roots.len() == self.report.tasks
            && self.live.is_empty()
    }

    pub(super) fn next_time(&self, sweep: Millis, operators: Millis) -> Millis {
        let mut t = sweep.min(operators);
        for q in self.queues() {
            if let Some(v) = self.bus.next_visible(&q) {
                let v = if q == self.deps.resources.agent_queue_url { v.max(self.agents_free_at) } else { v };
                t = t.min(v);
            }
        }
        if let Some((Reverse(when), _, _)) = self.actions.peek() {
            t = t.min(*when);
        }
        t
    }

    /// Timers without an attempt waiting in the supervisor queue, by task.
    pub(super) fn attempt_less_timers(&self) -> BTreeMap<String, usize> {
        let mut by_task = BTreeMap::new();
        for body in self.bus.bodies(&self.deps.resources.supervisor_queue_url) {
            if let Ok(t) = serde_json::from_str::<TimerMessage>(&body) {
                if t.attempt.is_none() {
                    *by_task.entry(t.task_id.to_string()).or_default() += 1;
                }
            }
        }
        by_task
    }

    pub(super) fn act(&mut self, action: Action) {
        match action {
            Action::AgentCopy(req) => {
                // another agent: it takes its own slot (or waits, or fails and the copy is gone)
                if let Turn::Call(lease) = self.take_slot(&req, None) {
                    self.start(&req, lease);
                }
            }
            Action::Release { holder } => {
                // a release that fails leaves the lease to expire at its end
                block_on(self.deps.limiter.release(LIMITED_AGENT, &holder)).ok();
            }
            Action::Worker(w) => self.work(*w),
            Action::EndSchedule => self.end_schedule(),
            Action::Answer(msg) => {
                // the desk's sends after its write fail now and then (the sender sees a 5xx)
                if self.chance(self.cfg.faults.lost_sends) {
                    self.bus.fail_sends("*", u32::try_from(self.between(1, 4)).unwrap_or(1));
                }
                let answered = block_on(callback::answer(&self.deps, &msg, None));
                self.bus.clear_send_failures();
                if let Ok(reply) = answered {
                    if reply.result == sas_protocol::messages::CallbackResult::Duplicate {
                        *self.repeated_answers.entry(msg.token.task_id().to_string()).or_default() += 1;
                    }
                    self.count_callback(reply.result);
                } else {
                    // the sender tries again
                    let when = self.now().plus_ms(1_000);
                    self.at(when, Action::Answer(msg));
                }
            }
            Action::Again { queue, body } => {
                block_on(self.bus.send(&queue, Outgoing::new(body))).ok();
            }
            Action::Apply { key, task, applied, deadline } => {
                if self.now() >= deadline {
                    return; // the service does not apply a request after its deadline
                }
                if let Some(first) = self.ledger.applied.get(&key) {
                    if first.phase != applied.phase {
                        self.ledger.twice.push(format!("key-once: {task}: key {key} used for two kinds of effect"));
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
    pub(super) fn operators(&mut self) {
        // the tasks the last look saw in Error (every write is looked at before an operator round)
        let parked: Vec<(TaskId, u32)> = self
            .in_error
            .iter()
            .filter_map(|id| TaskId::try_from(id.as_str()).ok())
            .filter_map(|id| self.store.task(&id))
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
                cancel(task_id, Some(run))
            };
            let when = self.now().plus_ms(self.between(0, 1_000));
            self.at(when, Action::Operator(msg));
        }
    }

    /// Hand every visible message to its role (the agents at their fleet's rate), all of one
    /// instant polled together.
    pub(super) fn deliver(&mut self) {
        let res = self.deps.resources.clone();
        // Each receive is one function invocation's batch, as an event source mapping hands it over
        // (up to 10 records): (invocation, role, queue, message).
        let mut batch: Vec<(usize, Role, String, Received)> = Vec::new();
        let mut invocations = 0;
        for role in [Role::Submitter, Role::Scheduler, Role::Supervisor] {
            let visibility = Duration::from_secs(role.default_visibility_seconds());
            for url in role.queues(&res) {
                loop {
                    let got = block_on(self.bus.receive(url, 10, Duration::ZERO, visibility)).unwrap_or_default();
                    if got.is_empty() {
                        break;
                    }
                    batch.extend(got.into_iter().map(|m| (invocations, role, url.to_owned(), m)));
                    invocations += 1;
                }
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
        // (invocation, role, queue, receipt, record, delete afterwards)
        let mut runs: Vec<(usize, Role, String, String, Record, bool)> = Vec::new();
        // tasks a redelivered or duplicated message of this batch is about
        let mut repeats: BTreeSet<String> = BTreeSet::new();
        for (invocation, role, url, m) in batch {
            // Consumers die on a message's first delivery only: a message that kills every consumer
            // ends in its DLQ after maxReceiveCount deliveries, as SQS promises (the DLQ alarm's
            // case, not the protocol's).
            let first = m.receive_count == 1;
            if first && self.chance(f.crash_before) {
                if let Some(token) = attempt_of(&m.body) {
                    self.delayed.insert(token);
                }
                continue; // the consumer died: the message comes back after its visibility timeout
            }
            let record = Record {
                message_id: m.message_id,
                body: m.body,
                receive_count: m.receive_count,
                sent_at: m.sent_at,
                trace_header: m.trace_header,
            };
            let delete = !(first && self.chance(f.crash_after));
            let task = task_of(&record.body);
            if !first {
                repeats.extend(task.clone());
            }
            if self.chance(f.duplicate) {
                // the copy is in another invocation's batch, handled at the same time
                repeats.extend(task);
                runs.push((invocations + invocation, role, url.clone(), m.receipt.clone(), record.clone(), false));
            }
            runs.push((invocation, role, url, m.receipt, record, delete));
        }
        #[allow(clippy::cast_precision_loss)] // a few hundred at most
        let n = runs.len() as f64;
        // Send failures are transient, like crashes: not on a batch that redelivers a message, so
        // a message whose sends failed goes through on its redelivery (a failure on every
        // delivery until CompleteBy is the Supervisor's case, and costs the attempt).
        let first_deliveries = runs.iter().all(|r| r.4.receive_count == 1);
        if first_deliveries && self.chance(f.lost_sends * n) {
            self.bus.fail_sends("*", u32::try_from(self.between(1, 4)).unwrap_or(1));
        }
        if first_deliveries && self.chance(f.batch_failures * n) {
            // One BufferedBus flush fails as a whole: the messages buffered for one queue in this
            // instant, up to 10, of whichever tasks sent them.
            let r = &self.deps.resources;
            let queues: Vec<&String> = [&r.agent_queue_url, &r.supervisor_queue_url, &r.scheduler_queue_url]
                .into_iter()
                .chain(&r.ends_queue_url)
                .collect();
            let len = u64::try_from(queues.len()).unwrap_or(1);
            let q = queues[usize::try_from(self.between(0, len)).unwrap_or(0).min(queues.len() - 1)].clone();
            self.bus.fail_sends(&q, u32::try_from(self.between(1, 11)).unwrap_or(1));
        }
        if first_deliveries && self.chance(f.ambiguous_writes * n) {
            let op = if self.chance(0.3) { StoreOp::Create } else { StoreOp::Save };
            let how = if self.chance(0.5) { Ambiguity::Retried } else { Ambiguity::Failed };
            self.store.ambiguous_next(op, how);
        }
        // like crashes, lost alerts are transient: not on a batch that redelivers a message
        if runs.iter().all(|r| r.4.receive_count == 1) && self.chance(f.lost_alerts) {
            self.bus.fail_sends(&self.deps.resources.alert_topic_arn, 1);
        }
        // successes handed to the Scheduler, and attempt-less timers to the Supervisor
        let mut successes: Vec<(String, String)> = Vec::new();
        let mut late: BTreeSet<String> = BTreeSet::new();
        for (_, role, _, _, r, _) in &runs {
            match role {
                Role::Scheduler => {
                    if let Ok(SchedulerMessage::Result(res)) = serde_json::from_str(&r.body) {
                        if matches!(res.outcome, Outcome::Succeeded { .. }) {
                            successes.push((res.task_id.to_string(), res.attempt.to_string()));
                        }
                    }
                }
                Role::Supervisor => {
                    let Ok(t) = serde_json::from_str::<TimerMessage>(&r.body) else { continue };
                    if t.attempt.is_none() {
                        self.timers_handled.entry(t.task_id.to_string()).or_default().insert(r.message_id.clone());
                    }
                    if r.receive_count == 1 && !late.contains(&r.message_id) && self.chance(f.late_duplicate) {
                        late.insert(r.message_id.clone());
                        if t.attempt.is_none() {
                            *self.timers_handed.entry(t.task_id.to_string()).or_default() += 1;
                        }
                        let when = self.now().plus_ms(self.between(500, 10_000));
                        let queue = self.deps.resources.supervisor_queue_url.clone();
                        self.at(when, Action::Again { queue, body: r.body.clone() });
                    }
                }
                _ => {}
            }
        }
        let deps = &self.deps;
        let agents = &AgentRuntime::default();
        // Every invocation of this instant at once, each through the functions' own batch handling
        // (role::process_batch: one task's records one after the other, a parent's ends together).
        let mut batches: BTreeMap<usize, (Role, Vec<Record>)> = BTreeMap::new();
        for (invocation, role, _, _, r, _) in &runs {
            batches.entry(*invocation).or_insert_with(|| (*role, Vec::new())).1.push(r.clone());
        }
        let failed: BTreeMap<usize, Vec<String>> = {
            let handled = batches.iter().map(|(&invocation, (role, records))| async move {
                let failed = role::process_batch(*role, records, |es| role::handle_group(deps, agents, es)).await;
                (invocation, failed)
            });
            block_on(join_all(handled)).into_iter().collect()
        };
        let results: Vec<bool> =
            runs.iter().map(|(invocation, _, _, _, r, _)| !failed[invocation].contains(&r.message_id)).collect();
        self.supervised = runs.iter().filter(|r| r.1 == Role::Supervisor).filter_map(|r| task_of(&r.4.body)).collect();
        self.bus.clear_send_failures();
        self.store.clear_ambiguous();
        self.report.handled += runs.len() as u64;
        let mut deletes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for ((_, _, url, receipt, _, delete), ok) in runs.into_iter().zip(results) {
            if delete && ok {
                deletes.entry(url).or_default().push(receipt);
            }
        }
        for (url, receipts) in deletes {
            block_on(self.bus.delete(&url, receipts)).ok();
        }
        self.observe();
        self.supervised.clear();
        self.count_alerts(&repeats);
        self.check_successes(&successes);
    }

    /// Attribute the `task_error` alerts published since the last look to their task's current
    /// `Error` episode.
    pub(super) fn count_alerts(&mut self, repeats: &BTreeSet<String>) {
        let published = self.bus.published();
        for (_, p) in published.iter().skip(self.publications_seen) {
            if !p.attributes.iter().any(|(k, v)| k == "kind" && v == "task_error") {
                continue;
            }
            let Some(task) = p.attributes.iter().find(|(k, _)| k == "task_id").map(|(_, v)| v.clone()) else {
                continue;
            };
            let repeated = repeats.contains(&task);
            let episodes = self.episodes.entry(task).or_default();
            if episodes.is_empty() {
                episodes.push(Episode::default());
            }
            let e = episodes.last_mut().expect("one episode at least");
            if repeated {
                e.repeated += 1;
            } else {
                e.fresh += 1;
            }
        }
        self.publications_seen = published.len();
    }

    /// A success the Scheduler handled must not be dropped while its step is still the one
    /// running, in the same run: it either moved the task on, or the task had moved on already.
    pub(super) fn check_successes(&mut self, successes: &[(String, String)]) {
        for (task_id, token) in successes {
            let Some(claim) = self.claims.get(token) else { continue };
            if claim.phase != Phase::Forward {
                continue;
            }
            let Ok(id) = TaskId::try_from(task_id.as_str()) else { continue };
            let Some(t) = self.store.task(&id) else { continue };
            let still_running = !t.process_state.is_terminal()
                && !t.is_compensating()
                && t.run == claim.run
                && t.phase() == Phase::Forward
                && t.current_def().name == claim.step;
            if still_running {
                let msg = format!(
                    "success-kept: {task_id}: {} attempt {token} succeeded and the Scheduler dropped its result while {} was still the running step ({})",
                    claim.step, claim.step, t.process_state
                );
                self.report.violations.push(msg);
            }
        }
    }
}

/// The task a message is about, if it names one.
pub(super) fn task_of(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v.get("task_id")?.as_str().map(str::to_owned)
}

/// The attempt a result or a timer message is about.
pub(super) fn attempt_of(body: &str) -> Option<String> {
    if let Ok(SchedulerMessage::Result(r)) = serde_json::from_str(body) {
        return Some(r.attempt.to_string());
    }
    serde_json::from_str::<TimerMessage>(body).ok()?.attempt.map(|a| a.to_string())
}
