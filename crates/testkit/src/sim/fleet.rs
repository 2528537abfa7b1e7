//! The fleet outside the stack: the agents (through the runtime's own reporting rule and slot
//! limits) and the remote services and callback workers they call, whose effects the ledger keeps.

use futures::executor::block_on;
use sas_core::agent::runtime::{execution_deadline, report, CallsEnded};
use sas_core::bus::{Bus, Received};
use sas_core::{agent, callback};
use sas_protocol::ids::{CallbackToken, Millis};
use sas_protocol::messages::{AgentRequest, AgentResult, CallbackAnswer, CallbackMessage, Outcome, Phase, VERSION};
use serde_json::json;

use super::fixtures::CALLBACK_TIMEOUT_MS;
use super::{Action, Applied, Decided, Fate, Sim, Turn, Worker, LIMIT, LIMITED_AGENT};

impl Sim {
    /// The agent fleet, for one request off the agent queue.
    pub(super) fn agent(&mut self, url: &str, m: &Received) {
        let Ok(req) = serde_json::from_str::<AgentRequest>(&m.body) else {
            block_on(self.bus.delete(url, vec![m.receipt.clone()])).ok();
            return;
        };
        self.dispatched.insert(req.attempt.to_string());
        if m.receive_count == 1 && self.chance(self.cfg.faults.crash_before) {
            // the agent died before starting: the request comes back after 720 s
            self.fates.entry(req.attempt.to_string()).or_default().push(Fate::Lost);
            return;
        }
        // its agent's slot first: a request that must wait was sent back; one whose slot could
        // not be asked for stays on the queue (it comes back after its visibility timeout)
        let lease = match self.take_slot(&req, m.sent_at) {
            Turn::Call(lease) => lease,
            Turn::Waits => {
                block_on(self.bus.delete(url, vec![m.receipt.clone()])).ok();
                return;
            }
            Turn::Failed => return,
        };
        block_on(self.bus.delete(url, vec![m.receipt.clone()])).ok();
        if self.chance(self.cfg.faults.agent_duplicate) {
            // SQS delivers the request again, to another agent, a moment later
            let when = self.now().plus_ms(self.between(0, 2_000));
            self.at(when, Action::AgentCopy(Box::new(req.clone())));
        }
        if self.chance(self.cfg.faults.late_copy) {
            // ... or much later, until its start_by (a server of the queue that missed the delete)
            let last = req.start_by.unwrap_or(req.complete_by);
            let now = self.now();
            if last.0 > now.0 + 10_000 {
                let when = now.plus_ms(self.between(10_000, last.0 - now.0));
                self.at(when, Action::AgentCopy(Box::new(req.clone())));
            }
        }
        self.start(&req, lease);
    }

    /// An agent starts a request it holds a slot for (if its agent has a limit): only while the
    /// task still waits for its attempt, as the real agent checks ([`agent::still_current`], on
    /// the twins) once the request is past its `unchecked_until` ([`agent::starts_unchecked`]);
    /// otherwise the copy starts nothing and gives its slot back.
    pub(super) fn start(&mut self, req: &AgentRequest, lease: Option<String>) {
        let now = self.now();
        // one that may no longer start says so (`not started`) without the check, as the agent
        if execution_deadline(req, now).is_some() && !agent::starts_unchecked(req, now) {
            match block_on(agent::still_current(&self.deps, req)) {
                Ok(true) => {}
                Ok(false) => {
                    self.report.fenced += 1;
                    self.fates.entry(req.attempt.to_string()).or_default().push(Fate::Fenced);
                    self.called(lease, None);
                    return;
                }
                Err(_) => {
                    // the read failed: the record fails, SQS delivers it again after 720 s
                    self.called(lease, None);
                    self.fates.entry(req.attempt.to_string()).or_default().push(Fate::Lost);
                    return;
                }
            }
        }
        let ended = self.run_request(req);
        self.called(lease, ended);
    }

    /// The slot of a request for [`LIMITED_AGENT`], as the real agent takes it
    /// ([`agent::take_slot`], on the twins).
    pub(super) fn take_slot(&mut self, req: &AgentRequest, sent_at: Option<Millis>) -> Turn {
        if req.agent != LIMITED_AGENT {
            return Turn::Call(None);
        }
        match block_on(agent::take_slot(&self.deps, Some(LIMIT), req, sent_at)) {
            Ok(agent::Slot::Held(holder)) => Turn::Call(Some(holder)),
            Ok(agent::Slot::Unlimited) => Turn::Call(None),
            Ok(agent::Slot::Wait) => {
                self.report.limit_waits += 1;
                Turn::Waits
            }
            Err(_) => Turn::Failed,
        }
    }

    /// A call of a request that held `lease` ended at the agent (`ended`: when, and whether the
    /// agent lived to give its slot back; `None`: it never started).
    pub(super) fn called(&mut self, lease: Option<String>, ended: Option<(Millis, bool)>) {
        let Some(holder) = lease else { return };
        match ended {
            None => self.act(Action::Release { holder }),
            Some((at, alive)) => {
                self.limited_calls.push((self.now(), at));
                if alive {
                    self.at(at, Action::Release { holder });
                }
            }
        }
    }

    /// One agent runs one copy of an attempt against the remote service. Returns when the agent
    /// let go of the call (it answered, or cut it at its deadline) and whether it lived to give
    /// its slot back; `None` when it never started.
    pub(super) fn run_request(&mut self, req: &AgentRequest) -> Option<(Millis, bool)> {
        let now = self.now();
        let f = self.cfg.faults.clone();
        self.report.attempts += 1;
        let token = req.attempt.to_string();
        // nothing starts after its start_by; started now, it has its whole timeout
        let Some(deadline) = execution_deadline(req, now) else {
            if req.start_by.is_some() && now < req.complete_by {
                // waited past its start_by: the agent says so at once, nothing started
                let when = now.plus_ms(self.between(5, 50));
                let error = "not started: it waited past its start_by".to_owned();
                self.report.not_started += 1;
                self.not_started(req, when, error);
            } else {
                self.fates.entry(token).or_default().push(Fate::Lost);
            }
            return None;
        };
        let key = req.idempotency_key.to_string();
        if let Some(cb) = &req.callback {
            self.hand_over(req, cb.token.clone(), cb.heartbeat_ms.unwrap_or(CALLBACK_TIMEOUT_MS), key);
            return Some((now, true));
        }
        let start = now;
        // Another call holds the key: the service answers 409 "key in use", and the runtime asks
        // again (jittered backoff) until the key is free or the attempt's deadline, counting no
        // failure. Free before the deadline, the key is asked again at once: a decided key's
        // answer is replayed, an undecided one's call is this copy's to make.
        let known = self.ledger.keys.get(&key).copied().unwrap_or_default();
        let in_use = known.until > now;
        self.report.keys_in_use += u64::from(in_use);
        let now = if in_use { known.until.plus_ms(self.between(20, 300)) } else { now };
        if now >= deadline {
            self.report.keys_in_use_to_the_deadline += 1;
            let ended = CallsEnded::OutOfTime { calls: 2, last: Some("409 key in use".into()), key_in_use: true };
            self.ended_at(req, start, deadline, deadline, &ended);
            return Some((deadline, true));
        }
        if let Some(decided) = known.decided {
            let outcome = match decided {
                Decided::Applies => {
                    let mut output = output(req);
                    output["replayed"] = json!(true);
                    Outcome::Succeeded { output }
                }
                Decided::Declined => Outcome::Failed { error: "declined (replayed)".into(), retryable: false },
            };
            self.ends(req, start, deadline, now, &CallsEnded::Answered(outcome));
            return Some((now, true));
        }
        let latency = if self.chance(f.slow) { self.between(3_000, 9_000) } else { self.between(20, 1_500) };
        let done = now.plus_ms(latency);
        let apply = |at: Millis| Action::Apply {
            key: key.clone(),
            task: req.task_id.to_string(),
            applied: Applied { at, phase: req.phase },
            deadline,
        };
        let roll = self.rng.unit();
        let mut p = 0.0;
        let mut pick = |q: f64| {
            p += q;
            roll < p
        };
        // Compensations must eventually succeed for a task to end Compensated: they fail less.
        let k = if req.phase == Phase::Compensate { 0.5 } else { 1.0 };
        let busy_until;
        let mut decided = None;
        // when the agent lets go of the call, and whether it lives to give its slot back
        let mut let_go = done.min(deadline);
        let mut alive = true;
        if pick(f.transient * k) {
            busy_until = done;
            self.ends(req, start, deadline, done, &CallsEnded::GaveUp { error: "503".into(), calls: 1 });
        } else if pick(f.permanent * k) {
            busy_until = done;
            decided = Some(Decided::Declined);
            let no = Outcome::Failed { error: "declined".into(), retryable: false };
            self.ends(req, start, deadline, done, &CallsEnded::Answered(no));
        } else if pick(f.hang * k) {
            // no effect, no answer: the agent cuts the call at the deadline
            busy_until = deadline;
            let_go = deadline;
            self.ends(
                req,
                start,
                deadline,
                deadline,
                &CallsEnded::OutOfTime { calls: 1, last: None, key_in_use: false },
            );
        } else if pick(f.remote_timeout * k) {
            // the client's own timeout (the attempt's deadline) fires first: a transient error at
            // the deadline; the backend may have applied the effect before it
            busy_until = deadline;
            let_go = deadline;
            if deadline.0 > now.0 + 100 && self.chance(0.5) {
                let lands = now.plus_ms(self.between(10, deadline.0 - now.0));
                decided = Some(Decided::Applies);
                self.at(lands, apply(lands));
            }
            let last = Some("timed out: error sending request (operation timed out)".to_owned());
            self.ended_at(req, start, deadline, deadline, &CallsEnded::OutOfTime { calls: 1, last, key_in_use: false });
        } else if pick(f.answer_at_deadline * k) && deadline.0 > now.0 + 1 {
            // the answer comes as the runtime's cut fires; the effect landed just before
            busy_until = deadline;
            let_go = deadline;
            let lands = Millis(deadline.0 - 1);
            decided = Some(Decided::Applies);
            self.at(lands, apply(lands));
            let ok = Outcome::Succeeded { output: output(req) };
            self.ended_at(req, start, deadline, deadline, &CallsEnded::Answered(ok));
        } else if pick(f.effect_no_answer * k) {
            busy_until = done;
            decided = (done < deadline).then_some(Decided::Applies);
            self.at(done, apply(done)); // the agent died after the service applied the effect
            self.fates.entry(token).or_default().push(Fate::Lost);
            alive = false;
        } else if pick(f.effect_then_retryable * k) {
            busy_until = done;
            decided = (done < deadline).then_some(Decided::Applies);
            self.at(done, apply(done));
            let later = done.plus_ms(self.between(10, 500));
            let_go = later.min(deadline);
            self.ends(req, start, deadline, later, &CallsEnded::GaveUp { error: "timeout, then 503".into(), calls: 2 });
        } else if pick(f.late_effect * k) && deadline.0 > now.0 + 2_500 {
            // A gateway answers 504 (the runtime's retries meet 409 while the backend works on),
            // the agent reports a retryable failure, and the effect lands afterwards, before
            // the request's deadline.
            let answered = now.plus_ms(self.between(500, 2_000));
            let lands = answered.plus_ms(self.between(100, deadline.0 - answered.0));
            busy_until = lands;
            // the service works on after the gateway's 504: not a call any agent holds open
            let_go = answered;
            decided = Some(Decided::Applies);
            let gave_up = CallsEnded::GaveUp { error: "504 gateway timeout".into(), calls: 1 };
            self.ends(req, start, deadline, answered, &gave_up);
            self.at(lands, apply(lands));
        } else {
            busy_until = done.min(deadline);
            decided = (done < deadline).then_some(Decided::Applies);
            self.at(done, apply(done));
            self.ends(req, start, deadline, done, &CallsEnded::Answered(Outcome::Succeeded { output: output(req) }));
        }
        let held = self.ledger.keys.entry(key).or_default();
        held.until = held.until.max(busy_until);
        held.decided = held.decided.or(decided);
        Some((let_go, alive))
    }

    /// A callback step's agent hands the work over: the warehouse refuses it (for good, or for
    /// now), or accepts it and a worker starts; an effect already decided for the key (a retry of
    /// an attempt whose worker finished) is confirmed at once.
    pub(super) fn hand_over(&mut self, req: &AgentRequest, token: CallbackToken, heartbeat_ms: u64, key: String) {
        let now = self.now();
        let f = self.cfg.faults.clone();
        let reply = |outcome| reply_to(req, outcome);
        let k = if req.phase == Phase::Compensate { 0.5 } else { 1.0 };
        // the warehouse decides once per key: a copy of a request it took (a duplicate) is taken
        // again, one it refused for good is refused again
        let known = self.ledger.keys.get(&key).and_then(|k| k.decided);
        let refuse = match known {
            Some(Decided::Declined) => true,
            Some(Decided::Applies) => false,
            None => self.chance(f.permanent * k),
        };
        if refuse {
            self.ledger.keys.entry(key).or_default().decided = Some(Decided::Declined);
            self.at(now.plus_ms(50), reply(Outcome::Failed { error: "warehouse refuses".into(), retryable: false }));
            return;
        }
        self.ledger.keys.entry(key.clone()).or_default().decided = Some(Decided::Applies);
        if known.is_none() && self.chance(f.transient * k) {
            self.at(now.plus_ms(50), reply(Outcome::Failed { error: "warehouse busy".into(), retryable: true }));
            return;
        }
        let decided = self.ledger.applied.contains_key(&key);
        let done_at = now.plus_ms(if decided { self.between(50, 500) } else { self.between(500, 20_000) });
        let dies_at = self.chance(f.cb_lost).then(|| now.plus_ms(self.between(0, now.until(done_at))));
        let w = Worker { token, key, phase: req.phase, hard: req.complete_by, heartbeat_ms, done_at, dies_at };
        self.heard.insert(w.token.attempt().to_string(), (now, heartbeat_ms));
        let first = now.plus_ms(self.between(100, heartbeat_ms / 2)).min(done_at);
        self.at(first, Action::Worker(Box::new(w)));
    }

    pub(super) fn count_callback(&mut self, result: sas_protocol::messages::CallbackResult) {
        let name = serde_json::to_value(result).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        *self.report.callbacks.entry(name).or_default() += 1;
    }

    /// One turn of a callback worker: dead, done (effect and answer), or a heartbeat (stopping
    /// when the desk says so).
    pub(super) fn work(&mut self, w: Worker) {
        let now = self.now();
        let token = w.token.attempt().to_string();
        let f = self.cfg.faults.clone();
        if w.dies_at.is_some_and(|d| d <= now) {
            self.dead.insert(token);
            return;
        }
        if now >= w.hard {
            return; // past its deadline a worker neither applies nor answers
        }
        if now >= w.done_at {
            let task = w.token.task_id().to_string();
            self.act(Action::Apply {
                key: w.key.clone(),
                task,
                applied: Applied { at: now, phase: w.phase },
                deadline: w.hard,
            });
            let msg = CallbackMessage {
                v: VERSION,
                token: w.token.clone(),
                answer: CallbackAnswer::Succeeded { output: json!({"shipped": true}) },
            };
            let transit = if self.chance(f.cb_late) { self.between(5_000, 90_000) } else { self.between(10, 300) };
            let at = now.plus_ms(transit);
            if self.chance(f.cb_reorder) {
                let beat = CallbackMessage { answer: CallbackAnswer::Heartbeat { details: None }, ..msg.clone() };
                self.at(at.plus_ms(self.between(1, 2_000)), Action::Answer(Box::new(beat)));
            }
            if self.chance(f.cb_duplicate) {
                self.at(at.plus_ms(self.between(1, 3_000)), Action::Answer(Box::new(msg.clone())));
            }
            self.at(at, Action::Answer(Box::new(msg)));
            return;
        }
        let beat = CallbackMessage {
            v: VERSION,
            token: w.token.clone(),
            answer: CallbackAnswer::Heartbeat { details: Some(json!({"at": now.0})) },
        };
        let Ok(reply) = block_on(callback::answer(&self.deps, &beat, None)) else {
            let again = now.plus_ms(1_000);
            self.at(again, Action::Worker(Box::new(w)));
            return;
        };
        self.count_callback(reply.result);
        if reply.stop {
            // told to stop (cancelled, or no longer the current attempt): the worker says it
            // stopped without an effect, for good
            let stopped = CallbackMessage {
                answer: CallbackAnswer::Failed { error: format!("stopped: {:?}", reply.result), retryable: false },
                ..beat
            };
            self.at(now.plus_ms(self.between(10, 300)), Action::Answer(Box::new(stopped)));
            return;
        }
        self.heard.insert(token, (now, w.heartbeat_ms));
        let next = now.plus_ms(self.between(w.heartbeat_ms / 5, w.heartbeat_ms * 2 / 5)).min(w.done_at);
        self.at(next, Action::Worker(Box::new(w)));
    }

    /// The agent says a request did not start (no call was made): at once, before CompleteBy.
    pub(super) fn not_started(&mut self, req: &AgentRequest, when: Millis, error: String) {
        if when < req.complete_by {
            self.fates.entry(req.attempt.to_string()).or_default().push(Fate::Answered);
            self.at(when, reply_to(req, Outcome::NotStarted { error }));
        }
    }

    /// How one copy's calls ended at its agent (`ended`, at `when`): a call still running at the
    /// execution `deadline` (an answer at or after it) is cut then, with no effect.
    pub(super) fn ends(
        &mut self,
        req: &AgentRequest,
        start: Millis,
        deadline: Millis,
        when: Millis,
        ended: &CallsEnded,
    ) {
        if when < deadline {
            self.ended_at(req, start, deadline, when, ended);
        } else {
            let cut = CallsEnded::OutOfTime { calls: 1, last: None, key_in_use: false };
            self.ended_at(req, start, deadline, deadline, &cut);
        }
    }

    /// One copy's calls ended `at`, as `ended` says, reported by the runtime's own rule
    /// ([`report`]). A copy whose calls ended at the execution deadline however they ended (the
    /// runtime's cut, the client's own timeout, an answer as the cut fires) is a `Cut` fate: its
    /// task must let it go within [`LATE_HUNG_MS`] (`late-hung`), and, before CompleteBy, its
    /// agent must report it (`hung-reported`).
    pub(super) fn ended_at(
        &mut self,
        req: &AgentRequest,
        start: Millis,
        deadline: Millis,
        at: Millis,
        ended: &CallsEnded,
    ) {
        let token = req.attempt.to_string();
        self.fates.entry(token.clone()).or_default().push(if at < deadline {
            Fate::Answered
        } else {
            Fate::Cut { at }
        });
        match report(ended, at, start, deadline, req.complete_by) {
            Some(outcome) => self.at(at, reply_to(req, outcome)),
            None if at < req.complete_by => self.report.violations.push(format!(
                "hung-reported: {}: attempt {token} of {} ended at {at} ({ended:?}), before its CompleteBy {}, and its agent reported nothing",
                req.task_id, req.step, req.complete_by
            )),
            None => {}
        }
    }
}

/// The agent's report of `outcome` for `req`.
pub(super) fn reply_to(req: &AgentRequest, outcome: Outcome) -> Action {
    Action::Reply(Box::new(AgentResult {
        v: VERSION,
        task_id: req.task_id.clone(),
        step: req.step.clone(),
        attempt: req.attempt.clone(),
        outcome,
    }))
}

/// What the service answers to a call that applies: `{"ok": true}`, but for `order-pages`'s
/// reading step, the page numbers (`{"pages": [0, 1, ...]}`, as the `s3_items` agent answers), and
/// for a page's read, its items (`{"items": [...]}`, as the page's `s3:getObject`): what the maps
/// after them run over, the same for every copy of the request.
fn output(req: &AgentRequest) -> serde_json::Value {
    let n = |k: &str| req.input.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    match (req.phase, req.step.as_str()) {
        (Phase::Forward, "read") => {
            json!({"pages": (0..n("pages")).collect::<Vec<_>>(), "count": n("pages") * n("per_page")})
        }
        (Phase::Forward, "page") => {
            let page = n("page");
            json!({"items": (0..n("per_page")).map(|i| json!({"sku": format!("p{page}-{i}")})).collect::<Vec<_>>()})
        }
        _ => json!({"ok": true}),
    }
}
