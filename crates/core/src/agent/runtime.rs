//! The agent runtime: an [`Agent`] wraps one remote service; the [`AgentRuntime`] hosts several
//! of them in one Lambda and enforces the pattern's rules around every call:
//! - no call is started once the attempt's execution deadline has passed, and a call still
//!   running then is cancelled (its future is dropped);
//! - an attempt that ran out of its execution time, however its calls ended (cut at the deadline,
//!   the client's own timeout, a transient error with no time left, a key still in use), is
//!   reported at once as `timed out` while that is before `CompleteBy` (the attempt is retried
//!   now, its effect counted as maybe applied, instead of waiting for the Supervisor at
//!   `CompleteBy`, which covers a crashed agent); [`report`] is that rule, in one place;
//! - transient errors are retried with exponential backoff and jitter, inside the deadline;
//! - a key in use (another call holds the idempotency key: the effect is in progress there) is
//!   asked again with backoff until the key is free or the deadline, and never counts as a
//!   failure: at the deadline the attempt timed out (its effect is unknown);
//! - permanent errors are reported at once; nothing is reported at or after `CompleteBy`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;
use tracing::{info, warn};

use crate::ids::Millis;
use crate::messages::{AgentRequest, AgentResult, Outcome, VERSION};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// Worth another try (timeouts, 5xx, throttling); `retry_after` honours a server's hint.
    #[error("transient: {message}")]
    Transient { message: String, retry_after: Option<Duration> },
    /// The service works on this idempotency key under another call (an SQS duplicate of the
    /// request, or an earlier attempt still running there): HTTP 409, as Stripe and the IETF
    /// `Idempotency-Key` draft answer a request whose key is in use. No failure of this attempt:
    /// asked again with backoff until the key is free (the holder's answer is then replayed) or
    /// the attempt's deadline, whatever `max_calls`.
    #[error("key in use: {message}")]
    KeyInUse { message: String, retry_after: Option<Duration> },
    /// The service said no for good (4xx, declined): retrying cannot help.
    #[error("permanent: {message}")]
    Permanent { message: String },
}

/// The longest a callback step's hand-off (the agent's call that gives the work and the token
/// to the remote side) may take; the remote side then has the step's whole timeout to answer.
pub const HANDOFF_TIMEOUT_MS: u64 = 60_000;

/// One call of an agent within one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub request: &'a AgentRequest,
    /// 1 for the first call of this attempt.
    pub call_no: u32,
    /// The attempt's own deadline (see [`execution_deadline`]): nothing may be started or applied
    /// after it; services get it as `X-Request-Deadline`.
    pub deadline: Millis,
}

/// When an attempt that starts at `now` must be done: it has the unit's whole execution time,
/// whatever it waited in the queue (`start_by` to `complete_by`), and never runs past
/// `complete_by`. `None` when it may no longer start.
pub fn execution_deadline(req: &AgentRequest, now: Millis) -> Option<Millis> {
    if now >= req.complete_by || req.start_by.is_some_and(|sb| now > sb) {
        return None;
    }
    Some(match req.start_by {
        Some(sb) => now.plus_ms(sb.until(req.complete_by)).min(req.complete_by),
        None => req.complete_by,
    })
}

/// A wrapper around one remote service. Implementations pass `request.idempotency_key` to the
/// service so that retries apply the effect once.
pub trait Agent: Send + Sync {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>>;
}

/// Retries inside one attempt.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRetry {
    /// Calls that fail transiently before the attempt gives up (answers that the key is in use
    /// do not count: they are asked again until the deadline).
    pub max_calls: u32,
    pub base_ms: u64,
    pub max_ms: u64,
}

impl Default for CallRetry {
    fn default() -> Self {
        CallRetry { max_calls: 5, base_ms: 100, max_ms: 5_000 }
    }
}

impl CallRetry {
    /// At least one call, and a base delay within the longest.
    pub fn check(&self) -> Result<(), String> {
        if self.max_calls == 0 || self.base_ms > self.max_ms {
            return Err("needs max_calls of at least 1 and base_ms <= max_ms".into());
        }
        Ok(())
    }

    /// Full-jitter exponential backoff before call `call_no + 1`.
    pub fn delay(&self, call_no: u32, jitter: f64) -> Duration {
        let exp = call_no.saturating_sub(1).min(20);
        let cap = self.base_ms.saturating_mul(1u64 << exp).min(self.max_ms);
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ms = (cap as f64 * jitter.clamp(0.0, 1.0)) as u64;
        Duration::from_millis(ms.max(1))
    }
}

#[derive(Clone, Default)]
pub struct AgentRuntime {
    agents: HashMap<String, Arc<dyn Agent>>,
    retry: CallRetry,
    /// The `retry` of the agents that declare their own (the file's `retry` for the others).
    retries: HashMap<String, CallRetry>,
    /// `max_in_flight` of the agents that declare one.
    limits: HashMap<String, u32>,
    /// `rate` of the agents that declare one.
    rates: HashMap<String, crate::limit::Rate>,
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.agents.keys().collect();
        names.sort();
        f.debug_struct("AgentRuntime")
            .field("agents", &names)
            .field("retry", &self.retry)
            .field("retries", &self.retries)
            .field("limits", &self.limits)
            .field("rates", &self.rates)
            .finish()
    }
}

impl AgentRuntime {
    pub fn new(retry: CallRetry) -> Self {
        AgentRuntime {
            agents: HashMap::new(),
            retry,
            retries: HashMap::new(),
            limits: HashMap::new(),
            rates: HashMap::new(),
        }
    }

    /// Agent `name` retries within an attempt as `retry` says, not as the file's `retry` does.
    pub fn set_retry(&mut self, name: impl Into<String>, retry: CallRetry) -> &mut Self {
        self.retries.insert(name.into(), retry);
        self
    }

    /// How agent `name` retries within an attempt.
    pub fn retry_of(&self, name: &str) -> &CallRetry {
        self.retries.get(name).unwrap_or(&self.retry)
    }

    /// At most `max` calls of agent `name` may be in flight at once, across all tasks and agent
    /// processes (see [`crate::limit`]).
    pub fn set_limit(&mut self, name: impl Into<String>, max: u32) -> &mut Self {
        self.limits.insert(name.into(), max);
        self
    }

    /// The agent's `max_in_flight`, if it has one.
    pub fn limit(&self, name: &str) -> Option<u32> {
        self.limits.get(name).copied()
    }

    /// Calls of agent `name` start at most at `rate`, across all tasks and agent processes (see
    /// [`crate::limit`]'s pacing).
    pub fn set_rate(&mut self, name: impl Into<String>, rate: crate::limit::Rate) -> &mut Self {
        self.rates.insert(name.into(), rate);
        self
    }

    /// The agent's `rate`, if it has one.
    pub fn rate(&self, name: &str) -> Option<crate::limit::Rate> {
        self.rates.get(name).copied()
    }

    pub fn register(&mut self, name: impl Into<String>, agent: impl Agent + 'static) -> &mut Self {
        self.agents.insert(name.into(), Arc::new(agent));
        self
    }

    /// An agent already shared (as the kinds build them).
    pub fn register_arc(&mut self, name: impl Into<String>, agent: Arc<dyn Agent>) -> &mut Self {
        self.agents.insert(name.into(), agent);
        self
    }

    pub fn knows(&self, name: &str) -> bool {
        self.agents.contains_key(name)
    }

    /// Run one attempt that starts now. `None`: nothing may be sent back (CompleteBy passed, or
    /// a callback step's work was handed over).
    pub async fn run(&self, req: &AgentRequest) -> Option<AgentResult> {
        self.run_from(req, Millis::now()).await
    }

    /// Run one attempt taken at `start`: its execution deadline is counted from then (the Agent
    /// role takes the instant before it checks that the attempt is still the task's current one,
    /// so a call that check let through ends within one execution time of it).
    pub async fn run_from(&self, req: &AgentRequest, start: Millis) -> Option<AgentResult> {
        let result = |outcome| AgentResult {
            v: VERSION,
            task_id: req.task_id.clone(),
            step: req.step.clone(),
            attempt: req.attempt.clone(),
            outcome,
        };
        let Some(deadline) = execution_deadline(req, start) else {
            info!(task_id = %req.task_id, step = %req.step, start_by = ?req.start_by, complete_by = %req.complete_by, "the request waited past its start_by (or CompleteBy): nothing started");
            return None;
        };
        // A callback step's agent only hands the work over: that gets a short deadline of its own.
        let deadline = if req.callback.is_some() { deadline.min(start.plus_ms(HANDOFF_TIMEOUT_MS)) } else { deadline };
        let Some(agent) = self.agents.get(&req.agent) else {
            warn!(task_id = %req.task_id, agent = %req.agent, "no such agent in this runtime");
            return Some(result(Outcome::Failed {
                error: format!("no agent named {:?} is deployed", req.agent),
                retryable: false,
            }));
        };
        let ended = self.calls(agent.as_ref(), req, deadline).await;
        let now = Millis::now();
        let Some(outcome) = report(&ended, now, start, deadline, req.complete_by) else {
            info!(task_id = %req.task_id, step = %req.step, %deadline, complete_by = %req.complete_by, ?ended, "the calls ended at or after CompleteBy: nothing is sent (the Supervisor's timer decides)");
            return None;
        };
        if let Outcome::TimedOut { error } = &outcome {
            info!(task_id = %req.task_id, step = %req.step, %deadline, complete_by = %req.complete_by, %error, "the attempt ran out of its execution time before CompleteBy: reported timed out");
        }
        if let (Outcome::Succeeded { .. }, Some(cb)) = (&outcome, &req.callback) {
            // Handed over: the remote side answers with the token; nothing to report now.
            info!(task_id = %req.task_id, step = %req.step, heartbeat_ms = cb.heartbeat_ms, "callback step handed over; waiting for its answer");
            return None;
        }
        Some(result(outcome))
    }

    /// The calls of one attempt, with backoff, until an answer for good, the call budget, or the
    /// attempt's `deadline` (a call still running then is cut: its future is dropped).
    async fn calls(&self, agent: &dyn Agent, req: &AgentRequest, deadline: Millis) -> CallsEnded {
        let retry = self.retry_of(&req.agent);
        let mut call_no = 1;
        // transient failures so far (a key in use is none); the last answer that the key is in use
        let mut failed_calls = 0;
        let mut in_use: Option<String> = None;
        loop {
            let left = Millis::now().until(deadline);
            if left == 0 {
                let key_in_use = in_use.is_some();
                return CallsEnded::OutOfTime { calls: call_no - 1, last: in_use, key_in_use };
            }
            let call = agent.call(Call { request: req, call_no, deadline });
            let Ok(answer) = tokio::time::timeout(Duration::from_millis(left), call).await else {
                warn!(task_id = %req.task_id, step = %req.step, call_no, %deadline, "call cut at the attempt's deadline");
                // still waiting for a key in use: that is the service's last answer
                let key_in_use = in_use.is_some();
                return CallsEnded::OutOfTime { calls: call_no, last: in_use, key_in_use };
            };
            match answer {
                Ok(output) => return CallsEnded::Answered(Outcome::Succeeded { output }),
                Err(AgentError::Permanent { message }) => {
                    return CallsEnded::Answered(Outcome::Failed { error: message, retryable: false })
                }
                Err(AgentError::KeyInUse { message, retry_after }) => {
                    // The effect is in progress under another call: wait for it, up to the deadline.
                    let backoff = retry_after.unwrap_or_else(|| retry.delay(call_no, rand::random()));
                    let backoff = backoff.min(Duration::from_millis(Millis::now().until(deadline)));
                    info!(task_id = %req.task_id, step = %req.step, call_no, error = %message, backoff_ms = backoff.as_millis(), "the idempotency key is in use by another call; asking again");
                    in_use = Some(message);
                    tokio::time::sleep(backoff).await;
                    call_no += 1;
                }
                Err(AgentError::Transient { message, retry_after }) => {
                    failed_calls += 1;
                    let waited_for_key = in_use.take();
                    let backoff = retry_after.unwrap_or_else(|| retry.delay(failed_calls, rand::random()));
                    let time_left = Millis::now().until(deadline);
                    if u128::from(time_left) <= backoff.as_millis() {
                        // the client's own timeout at the deadline, or no time for another call
                        info!(task_id = %req.task_id, step = %req.step, call_no, error = %message, %deadline, time_left_ms = time_left, "transient error with no time left for another call");
                        return match waited_for_key {
                            // asking again for a key in use when the time ran out: the key may
                            // still be held, which is the news, not the error that ended the ask
                            // (the client's own timeout at the deadline, typically)
                            Some(in_use) => CallsEnded::OutOfTime {
                                calls: call_no,
                                last: Some(format!("{in_use}; the next call: {message}")),
                                key_in_use: true,
                            },
                            _ => CallsEnded::OutOfTime { calls: call_no, last: Some(message), key_in_use: false },
                        };
                    }
                    if failed_calls >= retry.max_calls {
                        info!(task_id = %req.task_id, step = %req.step, call_no, error = %message, "giving up this attempt: its calls are used");
                        return CallsEnded::GaveUp { error: message, calls: call_no };
                    }
                    info!(task_id = %req.task_id, step = %req.step, call_no, error = %message, backoff_ms = backoff.as_millis(), "transient error; retrying");
                    tokio::time::sleep(backoff).await;
                    call_no += 1;
                }
            }
        }
    }
}

/// How the calls of one attempt ended, before the agent decides what to report ([`report`]).
#[derive(Debug, Clone, PartialEq)]
pub enum CallsEnded {
    /// The service answered for good: its output, or a definite "no".
    Answered(Outcome),
    /// Transient failures used the attempt's call budget (`max_calls`) while time was left.
    GaveUp { error: String, calls: u32 },
    /// The attempt's execution time ran out: a call cut at the deadline, a transient failure (the
    /// client's own timeout at the deadline among them) with no time left for another call, or
    /// the idempotency key still in use by another call (`last`: the service's last answer).
    OutOfTime { calls: u32, last: Option<String>, key_in_use: bool },
}

/// What the agent reports for an attempt started at `start` (execution `deadline`) whose calls
/// ended at `now` ([`CallsEnded`]). One rule decides what is dropped: nothing is sent at or after
/// `CompleteBy` (the Supervisor's timer decides then). Before it, an answer for good is reported
/// as it is, whenever it came; an attempt that ran out of its time, however it ended (the
/// runtime's cut, the client's own timeout, a transient error with no time left, a key still in
/// use), or a transient failure at or after its deadline, is `timed out` (its effect is unknown:
/// the Scheduler retries at once); transient failures that used the call budget with time left
/// are a retryable failure. The simulator reports through this function too.
pub fn report(
    ended: &CallsEnded,
    now: Millis,
    start: Millis,
    deadline: Millis,
    complete_by: Millis,
) -> Option<Outcome> {
    if now >= complete_by {
        return None;
    }
    let within = start.until(deadline);
    Some(match ended {
        CallsEnded::Answered(outcome) => outcome.clone(),
        CallsEnded::GaveUp { error, calls } if now < deadline => {
            Outcome::Failed { error: format!("{error} (after {calls} calls)"), retryable: true }
        }
        CallsEnded::GaveUp { error, calls } => Outcome::TimedOut {
            error: format!(
                "timed out: no answer within the attempt's {within} ms (after {calls} calls; last error: {error})"
            ),
        },
        CallsEnded::OutOfTime { calls, last: Some(last), key_in_use: true } => Outcome::TimedOut {
            error: format!(
                "timed out: the idempotency key was still in use by another call at the attempt's deadline \
                 ({within} ms, {calls} calls; last answer: {last})"
            ),
        },
        CallsEnded::OutOfTime { calls, last: Some(last), .. } => Outcome::TimedOut {
            error: format!(
                "timed out: no answer within the attempt's {within} ms (after {calls} calls; last error: {last})"
            ),
        },
        CallsEnded::OutOfTime { calls, last: None, .. } => Outcome::TimedOut {
            error: format!("timed out: no answer within the attempt's {within} ms (after {calls} calls)"),
        },
    })
}
