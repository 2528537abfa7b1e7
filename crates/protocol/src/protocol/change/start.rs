//! Claiming a unit of work. A unit waits (unlocked) for its claim: a run message for this wait,
//! sent again by the Supervisor when it is lost. Its claim starts it: a call or callback unit gets
//! a fresh attempt (token, deadlines, the agent request, the deadline timer), a wait unit sleeps
//! until its time, and a map, a parallel region or a workflow step creates its tasks (`map.rs`).
//! A forward step whose guard is false, or whose every step it waits for was skipped, is skipped
//! in the write that reaches it.

use serde_json::Value;

use super::Change;
use crate::ids::{AttemptToken, CallbackToken, IdempotencyKey, Millis};
use crate::messages::{AgentRequest, CallbackRef, Phase, RunReason, TimerMessage, VERSION};
use crate::protocol::task::{noun, running_state, waiting_state};
use crate::protocol::{Effect, ProcessState, StepStatus, Task};
use crate::workflow::{FailureKind, StepDef, StepKind, WaitTime, MAX_LONG_STEP_MS};

impl Change<'_> {
    /// Wait (unlocked) for a claim of the current unit from `due`: a run message for this wait,
    /// delayed until then, and a `CompleteBy` by which the Supervisor restarts a lost one.
    pub(crate) fn wait_for_claim(&mut self, due: Millis, reason: RunReason) {
        let now = self.ctx.now;
        self.unlock();
        self.t.claim.restarts = 0;
        self.t.claim.rev = self.t.rev;
        self.t.claim.not_before = None;
        self.t.claim.paused = false;
        self.t.complete_by = Some(due.max(now).plus_ms(self.policy.start_timeout_ms));
        self.t.unit_record().await_retry();
        self.note_wait(waiting_state(self.t.phase()));
        self.fx.push(Effect::Run { rev: self.t.claim.rev, delay_ms: now.until(due), reason });
    }

    /// The run message of the current wait was lost or is stuck behind a lagging queue: send it
    /// again (the first copy to arrive claims), waiting twice as long each time in a row; after
    /// `max_restarts` the task is stuck for a reason no retry fixes, and ends in `Error`.
    pub(crate) fn restart(&mut self) {
        self.t.claim.restarts += 1;
        if self.t.claim.restarts > self.policy.max_restarts {
            self.t.reason = Some(format!(
                "{} {} was not claimed after {} restarts",
                noun(self.t.phase()),
                self.t.current_def().name,
                self.policy.max_restarts
            ));
            self.finish(ProcessState::Error);
            return;
        }
        let wait = self.policy.start_timeout_ms.saturating_mul(1 << (self.t.claim.restarts - 1).min(6));
        self.t.complete_by = Some(self.ctx.now.plus_ms(wait));
        self.fx.push(Effect::Run { rev: self.t.claim.rev, delay_ms: 0, reason: RunReason::Restart });
    }

    /// Claim the current unit: fresh token, deadlines, dispatch and timer. The request may wait
    /// in the agent queue until `start_by` (the queue budget); the attempt then has the unit's full
    /// `timeout_ms`, so `CompleteBy = start_by + timeout_ms`.
    ///
    /// A callback unit's attempt is the same, but for its deadlines: `timeout_ms` is its hard
    /// deadline, and with `heartbeat_ms` the first `CompleteBy` is `start_by + heartbeat_ms`
    /// (each heartbeat moves it on, never past the hard one). A wait unit has no agent: see
    /// [`Change::start_wait`].
    pub(crate) fn start_unit(&mut self) {
        if self.ctx.paused && self.t.phase() == Phase::Forward {
            self.park();
            return;
        }
        self.t.claim.paused = false;
        let i = self.t.unit_step();
        // a parallel region first: its first step may be a map (which runs in its branch)
        if self.t.workflow.region_at(i).is_some() {
            match self.t.phase() {
                Phase::Forward => self.start_map(None),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        if let Some(spec) = self.t.workflow.steps[i].map.clone() {
            match self.t.phase() {
                Phase::Forward => self.start_map(Some(&spec)),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        if self.t.workflow.steps[i].kind.loop_spec().is_some() {
            match self.t.phase() {
                Phase::Forward => self.start_loop(),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        if self.t.workflow.steps[i].kind.starts_a_workflow() {
            match self.t.phase() {
                Phase::Forward => self.start_child(),
                Phase::Compensate => self.start_map_undo(),
            }
            return;
        }
        let def = self.t.current_def().clone();
        if let StepKind::Wait(time) = &def.kind {
            self.start_wait(&def, time);
            return;
        }
        let token = self.ctx.fresh_token.clone();
        let budget = def.schedule_to_start_ms.unwrap_or(self.policy.queue_budget_ms);
        let start_by = self.ctx.now.plus_ms(budget);
        let hard = start_by.plus_ms(def.timeout_ms);
        // a heartbeat is the token holder's: only a step answered by token has one
        let complete_by = match def.kind.heartbeat_ms() {
            Some(hb) => start_by.plus_ms(hb).min(hard),
            None => hard,
        };
        self.t.lock.locked_by = Some(token.clone());
        self.t.complete_by = Some(complete_by);
        self.t.lock.hard_by = (complete_by < hard).then_some(hard);
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.lock.awaits = None;
        let attempt_no = self.t.unit_record().begin_attempt();
        if def.kind.answers_by_token() {
            self.t.unit_record().issue(&token);
        }
        let phase = self.t.phase();
        if phase == Phase::Forward {
            let i = self.t.step_index;
            self.t.steps[i].settles_at = Some(hard);
        }
        self.note(running_state(phase));
        let unchecked = self.policy.unchecked_start_ms;
        let unchecked_until = (unchecked > 0).then(|| self.ctx.now.plus_ms(unchecked));
        let request = attempt_request(&self.t, &token, attempt_no, (budget > 0).then_some(start_by), unchecked_until);
        self.fx.push(Effect::Dispatch(request));
        let task_id = self.t.task_id.clone();
        self.fx.push(Effect::ArmTimer(TimerMessage { v: VERSION, task_id, attempt: Some(token), complete_by }));
    }

    /// The task's workflow is paused: its forward unit waits, unclaimed and with no run message;
    /// its `CompleteBy` is when the Supervisor looks whether the workflow was resumed (and then
    /// sends the run). Compensations are not parked: undoing goes on.
    fn park(&mut self) {
        self.unlock();
        self.t.claim.rev = self.t.rev;
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.claim.paused = true;
        self.t.complete_by = Some(self.ctx.now.plus_ms(self.policy.pause_check_ms));
        self.t.reason = Some(match &self.t.slot {
            None => format!("paused: its workflow {} is paused (sasctl resume)", self.t.workflow.name),
            Some(s) => format!(
                "paused: its workflow {} or its concurrency key {} is paused (sasctl pause lists them; sasctl resume)",
                self.t.workflow.name, s.key
            ),
        });
        self.note_wait(waiting_state(self.t.phase()));
    }

    /// A wait unit: held (so a cancel finds it running) until it wakes; its only effect is the
    /// deadline timer, which ends it. A wake time already past ends it at once; one that cannot
    /// be read fails the step for good, with the reason.
    fn start_wait(&mut self, def: &StepDef, time: &WaitTime) {
        let now = self.ctx.now;
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.lock.awaits = None;
        self.unlock();
        self.t.unit_record().begin_attempt();
        match wake_time(&self.t, time, now) {
            Err(why) => {
                self.t.failure_count += 1;
                self.t.unit_record().refused(&why);
                self.give_up(format!("step {} failed permanently: {why}", def.name), FailureKind::Permanent);
            }
            Ok(at) if at <= now => {
                self.t.unit_record().succeeded();
                self.advance();
            }
            Ok(at) => {
                let token = self.ctx.fresh_token.clone();
                self.t.lock.locked_by = Some(token.clone());
                self.t.complete_by = Some(at);
                self.note(running_state(self.t.phase()));
                let task_id = self.t.task_id.clone();
                self.fx.push(Effect::ArmTimer(TimerMessage {
                    v: VERSION,
                    task_id,
                    attempt: Some(token),
                    complete_by: at,
                }));
            }
        }
    }

    /// Start the forward step at `step_index`, or skip it (and the ones after it) when it is not
    /// to run: its guard is false, or every step it names in `after` was skipped. A skip is
    /// decided here, in the write that ends the steps it waits for (or creates the task): it
    /// costs no write of its own. A parallel region's branches decide theirs as they become ready.
    pub(crate) fn enter(&mut self) {
        loop {
            let i = self.t.step_index;
            if self.t.workflow.region_at(i).is_some() {
                break;
            }
            let t = &self.t;
            let Some(why) = skip_reason(t, i, &|name: &str| t.skipped(name)) else { break };
            self.t.steps[i].status = StepStatus::Skipped;
            self.t.steps[i].skipped = Some(why);
            if i + 1 == self.t.steps.len() {
                self.finish(ProcessState::Processed);
                return;
            }
            self.t.step_index += 1;
        }
        self.start_unit();
    }
}

/// The request for the current unit's attempt `token`, as the task records it.
pub(crate) fn attempt_request(
    task: &Task,
    token: &AttemptToken,
    attempt_no: u32,
    start_by: Option<Millis>,
    unchecked_until: Option<Millis>,
) -> AgentRequest {
    let def = task.current_def();
    AgentRequest {
        v: VERSION,
        idempotency_key: IdempotencyKey::for_unit(&task.task_id, &def.name, task.unit_key_gen()),
        task_id: task.task_id.clone(),
        step: def.name.clone(),
        phase: task.phase(),
        agent: def.agent().expect("only an agent's kind has a request").to_owned(),
        attempt: token.clone(),
        attempt_no,
        start_by,
        complete_by: task.lock.hard_by.or(task.complete_by).expect("a running attempt has a CompleteBy"),
        input: task.unit_request(),
        callback: def.kind.answers_by_token().then(|| CallbackRef {
            token: CallbackToken::new(&task.task_id, &def.name, token),
            heartbeat_ms: def.kind.heartbeat_ms(),
        }),
        waits: 0,
        waiting_since: None,
        unchecked_until,
    }
}

/// [`MAX_LONG_STEP_MS`] in seconds (366 days), exact as an `f64`.
const MOST_WAIT_S: f64 = 31_622_400.0;

/// When a wait unit wakes: after `wait_ms`, after the seconds its `wait_for` pointer names, or
/// at the instant `wait_until` (an RFC 3339 time, or a pointer naming one or epoch milliseconds)
/// in the unit's input. `Err`: why it cannot wait.
fn wake_time(task: &Task, time: &WaitTime, now: Millis) -> Result<Millis, String> {
    let input = task.unit_input();
    let pointer = match time {
        WaitTime::Ms(ms) => return Ok(now.plus_ms(*ms)),
        WaitTime::SecondsAt(pointer) => {
            let secs = match input.pointer(pointer) {
                None => return Err(format!("wait_for {pointer} names nothing in the task")),
                Some(Value::Number(n)) => n.as_f64().filter(|s| *s >= 0.0),
                Some(_) => None,
            };
            let secs = secs.ok_or_else(|| {
                format!(
                    "wait_for {pointer} is {}, not a number of seconds",
                    crate::ids::clip(&input.pointer(pointer).map_or_else(String::new, Value::to_string), 40)
                )
            })?;
            if secs > MOST_WAIT_S {
                return Err(format!("wait_for {pointer} is more than 366 days"));
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0 <= secs <= 366 days
            let ms = (secs * 1000.0).round() as u64;
            return Ok(now.plus_ms(ms));
        }
        WaitTime::Until(pointer) => pointer.as_str(),
    };
    if !pointer.starts_with('/') {
        // a time written in the workflow
        let at = crate::ids::rfc3339_millis(pointer)
            .ok_or_else(|| format!("wait_until {pointer:?} is not an RFC 3339 time"))?;
        if now.until(Millis(at)) > MAX_LONG_STEP_MS {
            return Err(format!("wait_until {pointer} is more than 366 days ahead"));
        }
        return Ok(Millis(at).max(now));
    }
    let at = match input.pointer(pointer) {
        None => return Err(format!("wait_until {pointer} names nothing in the task")),
        Some(Value::Number(n)) => {
            n.as_u64().map(Millis).ok_or_else(|| format!("wait_until {pointer} is {n}, not epoch milliseconds"))?
        }
        Some(Value::String(t)) => {
            let at = crate::ids::rfc3339_millis(t).ok_or_else(|| {
                format!("wait_until {pointer} is {:?}, not an RFC 3339 time", crate::ids::clip(t, 40))
            })?;
            Millis(at)
        }
        Some(other) => {
            return Err(format!("wait_until {pointer} is {}, not a time", crate::ids::clip(&other.to_string(), 40)))
        }
    };
    if now.until(at) > MAX_LONG_STEP_MS {
        return Err(format!("wait_until {pointer} is more than 366 days ahead"));
    }
    Ok(at)
}

/// Why forward step `i` is skipped, decided once the steps it waits for are done: every step it
/// names in `after` was skipped (`skipped` says which were), or its guard is false. `None`: it runs.
///
/// A step that leaves `after` out follows the step listed before it in order only: it runs
/// whether that step ran or was skipped (a guarded step in a list is optional). A step that names
/// steps in `after` depends on them: it is skipped when every one was skipped, and runs (its guard
/// decides) when at least one ran.
pub(crate) fn skip_reason(task: &Task, i: usize, skipped: &dyn Fn(&str) -> bool) -> Option<String> {
    let def = &task.workflow.steps[i];
    if let Some(after) = def.after.as_ref().filter(|a| !a.is_empty()) {
        if after.iter().all(|n| skipped(n)) {
            return Some(format!("every step it waits for was skipped ({})", after.join(", ")));
        }
    }
    let when = def.when.as_ref()?;
    (!when.holds(task)).then(|| format!("when was false: {}", crate::ids::clip(&when.to_string(), 200)))
}
