//! The Agent role: run one attempt of a unit of work with the agent it names, and report the
//! result to the Scheduler, unless `CompleteBy` has passed.
//!
//! - [`runtime`]: the [`Agent`] trait and the [`AgentRuntime`] that enforces deadlines, retries
//!   with backoff and stable idempotency keys around every call;
//! - [`http`]: the built-in HTTP agent;
//! - [`lambda`]: the Lambda agent (invokes a function; asynchronously for a callback step);
//! - [`approval`]: the approval agent (a person answers a callback step; the token goes to SNS);
//! - [`sqs`], [`sns`], [`eventbridge`]: callback steps delivered to a queue, a topic or an event
//!   bus of the user's ([`deliver`]: what they share; [`aws_error`]: how AWS errors are told apart);
//! - [`aws_api`]: any action of an AWS service that speaks JSON, with the function's role (Step
//!   Functions' `aws-sdk` integrations);
//! - [`sim`]: the simulated agent for tests and demos; [`fail`]: a step that fails the task (a
//!   `Fail` state);
//! - [`kind`]: what each kind of agent provides (its configuration, how it is built, its IAM);
//! - [`config`]: which agents a function hosts (`config/agents.json`).

use tracing::{debug, info, warn};

use crate::deps::{Deps, HandlerError};
use crate::ids::Millis;
use crate::limit;
use crate::messages::{AgentRequest, AgentResult, Outcome, SchedulerMessage, VERSION};
use crate::metrics;
use crate::store::Acquire;

pub mod approval;
pub mod aws_api;
pub mod aws_error;
pub mod config;
pub mod deliver;
pub mod eventbridge;
pub mod fail;
pub mod handover;
pub mod http;
pub mod kind;
pub mod lambda;
pub mod runtime;
pub mod s3_items;
pub mod sim;
pub mod sns;
pub mod sqs;
#[cfg(test)]
mod tests;

pub use approval::ApprovalAgent;
pub use config::{env_vars, parse_variables, survey, AgentConfigError, AgentSurvey, BUILT_IN_AGENTS, VARIABLES_ENV};
pub use eventbridge::EventBridgeAgent;
pub use handover::CallbackEndpoints;
pub use http::HttpAgent;
pub use kind::{AgentKind, AwsConfigCell, BuildContext, Grant};
pub use runtime::{Agent, AgentError, AgentRuntime, Call, CallRetry};
pub use sim::SimAgent;
pub use sns::SnsAgent;
pub use sqs::SqsAgent;

/// Handle one message of the agent queue. `Ok(true)` when a result was sent back.
pub async fn handle(deps: &Deps, runtime: &AgentRuntime, raw: &str) -> Result<bool, HandlerError> {
    handle_sent(deps, runtime, raw, None).await
}

/// [`handle`] for a request sent at `sent_at` (the queue message's `SentTimestamp`): also records
/// how long it waited in the queue (`StepScheduleTime`) and how long its call took
/// (`StepRunTime`), by agent.
pub async fn handle_sent(
    deps: &Deps,
    runtime: &AgentRuntime,
    raw: &str,
    sent_at: Option<Millis>,
) -> Result<bool, HandlerError> {
    let req: AgentRequest = crate::envelope::read(raw).map_err(HandlerError::Malformed)?;
    handle_request(deps, runtime, req, sent_at).await
}

/// [`handle_sent`] for a request read ([`crate::envelope::Envelope::open`]: its version checked).
pub async fn handle_request(
    deps: &Deps,
    runtime: &AgentRuntime,
    req: AgentRequest,
    sent_at: Option<Millis>,
) -> Result<bool, HandlerError> {
    async {
        let now = deps.now();
        match (runtime::execution_deadline(&req, now), req.start_by) {
            (None, Some(start_by)) => return not_started(deps, &req, start_by, sent_at).await,
            (None, None) => {
                info!(complete_by = %req.complete_by, "CompleteBy passed before the request started: nothing started, nothing sent");
                return Ok(false);
            }
            (Some(_), _) => {}
        }
        let lease = match take_slot(deps, runtime.limit(&req.agent), &req, sent_at).await? {
            Slot::Wait => return Ok(false),
            Slot::Held(holder) => Some(holder),
            Slot::Unlimited => None,
        };
        // The attempt's execution time counts from before the check: a call the check lets
        // through ends within one execution time of it (see `still_current`).
        let start = Millis::now();
        let started = deps.now();
        let current = if starts_unchecked(&req, started) {
            debug!("started without reading the task: within unchecked_until of its claim");
            metrics::count(&metrics::STARTED_UNREAD, &[&req.agent], 1);
            Ok(true)
        } else {
            still_current(deps, &req).await
        };
        if !matches!(current, Ok(true)) {
            // not started (or the check failed: the message comes back): the slot is given back
            if let Some(holder) = lease {
                if let Err(e) = deps.limiter.release(&req.agent, &holder).await {
                    warn!(agent = %req.agent, error = %e, "could not give the agent's slot back; it frees itself at the attempt's deadline");
                }
            }
            return current;
        }
        // an agent with a rate: the call waits for its slot (sleeping, or in the agent queue). Its
        // execution time still counts from before the check: a sleep is taken from the attempt's
        // time, so the call ends within one execution time of the check, as `still_current` says.
        if let Some(rate) = runtime.rate(&req.agent) {
            let paced = match pace_call(deps, &rate, &req, sent_at).await {
                // a wait for the slot (a slow table, lost rounds) that took half the attempt's
                // execution time or more: the call goes back to wait rather than run out of time
                // (waiting for the rate is never a failure)
                Ok(true) if pacing_took_the_attempt(&req, start, Millis::now()) => {
                    info!(agent = %req.agent, waited_ms = start.until(Millis::now()), "the wait for the agent's slot took half the attempt's time: the request waits again");
                    wait_again(deps, &req, sent_at, 1).await.map(|()| false)
                }
                other => other,
            };
            match paced {
                Ok(true) => {}
                other => {
                    if let Some(holder) = lease {
                        if let Err(e) = deps.limiter.release(&req.agent, &holder).await {
                            warn!(agent = %req.agent, error = %e, "could not give the agent's slot back; it frees itself at the attempt's deadline");
                        }
                    }
                    return other.map(|_| false);
                }
            }
        }
        if let Some(sent) = req.waiting_since.or(sent_at) {
            metrics::duration_ms(&metrics::STEP_SCHEDULE_TIME, &[&req.agent], sent.until(started));
        }
        let ran = runtime.run_from(&req, start).await;
        if let Some(holder) = lease {
            // a lease not given back ends by itself at the attempt's deadline
            if let Err(e) = deps.limiter.release(&req.agent, &holder).await {
                warn!(agent = %req.agent, error = %e, "could not give the agent's slot back; it frees itself at the attempt's deadline");
            }
        }
        let Some(mut result) = ran else { return Ok(false) };
        metrics::duration_ms(&metrics::STEP_RUN_TIME, &[&req.agent], started.until(deps.now()));
        if let Outcome::Succeeded { output } = &mut result.outcome {
            // what the task cannot store (or SQS carry) goes back as a success with a marker
            *output = crate::screen::output(output);
        }
        if deps.now() >= req.complete_by {
            info!("CompleteBy passed: result not sent");
            return Ok(false);
        }
        deps.outbox().to_scheduler(&SchedulerMessage::Result(result), 0).await?;
        Ok(true)
    }
    .await
}

/// Whether `req` may start without [`still_current`]'s read: it arrived before its
/// `unchecked_until` (its claim plus the Scheduler's `UNCHECKED_START_MS`). The protocol allows
/// for such a start after a decision that moves the task on (`Change::settled_at`: a
/// compensation waits one window more), so only a request that waited pays for the read. A
/// request without the field (sent again, or by a Scheduler that predates it) is always read.
pub fn starts_unchecked(req: &AgentRequest, now: Millis) -> bool {
    req.unchecked_until.is_some_and(|until| now < until)
}

/// Whether `req`'s attempt is still the one its task waits for: one strongly consistent read of
/// the task's `LockedBy` ([`crate::store::StateStore::holder`]), just before the agent starts its
/// calls. A copy of a request whose task has moved on (a retry claimed with a new token, a cancel,
/// a give-up, the task ended or gone: an SQS duplicate, a redelivery, a resent dispatch, a request
/// that waited for a slot) starts nothing and reports nothing; its message is done.
///
/// This is what lets a compensation start soon after a cancel or a give-up instead of at the
/// attempt's `CompleteBy`: a call that starts after the decision's write is refused here, and one
/// that started before it ends within one execution time (`timeout_ms`) of it, so no effect of the
/// attempt can land after `min(CompleteBy, decision + timeout_ms)` + settle (the protocol's
/// `settled_at`). Cost: one read unit per attempt while the item is under 4 KB, paid only by a
/// request that arrives after its `unchecked_until` ([`starts_unchecked`]).
pub async fn still_current(deps: &Deps, req: &AgentRequest) -> Result<bool, HandlerError> {
    let holder = deps.store.holder(&req.task_id).await?;
    if holder.as_ref() == Some(&req.attempt) {
        return Ok(true);
    }
    let now_held_by = holder.as_ref().map_or("no attempt", |_| "another attempt");
    info!(task_id = %req.task_id, step = %req.step, attempt_no = req.attempt_no, held_by = now_held_by, "not started: the task no longer waits for this attempt (it was retried, cancelled, given up or ended); nothing is called or sent");
    metrics::count(&metrics::STALE_REQUESTS, &[&req.agent], 1);
    Ok(false)
}

/// A request that may no longer start (it waited past `start_by`): before `CompleteBy` the
/// Scheduler is told at once, so it claims the step again with a fresh budget (not a failure);
/// after it nothing may be sent.
async fn not_started(
    deps: &Deps,
    req: &AgentRequest,
    start_by: Millis,
    sent_at: Option<Millis>,
) -> Result<bool, HandlerError> {
    let now = deps.now();
    if now >= req.complete_by {
        info!("CompleteBy passed before the request started: nothing started, nothing sent");
        return Ok(false);
    }
    let waited = req.waiting_since.or(sent_at).map_or(0, |s| s.until(now));
    let slot = if req.waits > 0 {
        format!(", {} times sent back to wait for a slot of agent {}", req.waits, req.agent)
    } else {
        String::new()
    };
    let error =
        format!("not started: it waited past its start_by ({} ms late; {waited} ms waited{slot})", start_by.until(now));
    info!(%error, "request not started");
    let result = AgentResult {
        v: VERSION,
        task_id: req.task_id.clone(),
        step: req.step.clone(),
        attempt: req.attempt.clone(),
        outcome: Outcome::NotStarted { error },
    };
    deps.outbox().to_scheduler(&SchedulerMessage::Result(result), 0).await?;
    Ok(true)
}

/// Wait for a slot of the request's agent's `rate` (see [`crate::limit`]'s pacing): `true` once
/// its slot has come (after sleeping until it); `false` when the request was sent back to the agent
/// queue to ask again: its next slot is too far to sleep for (delayed until about then), or it woke
/// after its slot's slack (a loaded process: starting late could put one call too many in a
/// period, and trying again here would spend the attempt's time). Waiting is never a failure.
pub async fn pace_call(
    deps: &Deps,
    rate: &limit::Rate,
    req: &AgentRequest,
    sent_at: Option<Millis>,
) -> Result<bool, HandlerError> {
    let now = deps.now();
    let delay = match deps.pacer.reserve(&req.agent, rate, now).await? {
        limit::Pace::Reserve { slot, .. } => {
            let wait = deps.now().until(slot);
            if wait > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
            let at = deps.now();
            if at <= slot.plus_ms(limit::PACE_SLACK_MS) {
                return Ok(true);
            }
            debug!(agent = %req.agent, late_ms = slot.until(at), "woke after its slot: asks again from the queue");
            1
        }
        // whole seconds (SQS), arriving before the slot rather than after it
        limit::Pace::Later { slot } => u32::try_from(now.until(slot) / 1_000).unwrap_or(900).clamp(1, 900),
    };
    wait_again(deps, req, sent_at, delay).await?;
    Ok(false)
}

/// Send `req` back to the agent queue, delayed `delay` s, to ask for a slot of its agent again.
async fn wait_again(deps: &Deps, req: &AgentRequest, sent_at: Option<Millis>, delay: u32) -> Result<(), HandlerError> {
    let mut again = req.clone();
    again.waits = req.waits.saturating_add(1);
    again.waiting_since = req.waiting_since.or(sent_at).or(Some(deps.now()));
    info!(agent = %req.agent, waits = again.waits, delay_s = delay, "agent at its rate: the request waits");
    metrics::count(&metrics::AGENT_AT_LIMIT, &[&req.agent], 1);
    deps.outbox().dispatch_later(&again, delay).await?;
    Ok(())
}

/// Whether the wait for a paced call's slot, from `start` (the attempt's execution time counts
/// from there) to `now`, took half the attempt's execution time or more.
pub fn pacing_took_the_attempt(req: &AgentRequest, start: Millis, now: Millis) -> bool {
    let Some(start_by) = req.start_by else { return false };
    let execution = start_by.until(req.complete_by);
    start.until(now).saturating_mul(2) >= execution
}

/// Whether a request may call its agent now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// The agent has no `max_in_flight`.
    Unlimited,
    /// A lease is held by this holder: give it back once the calls are done.
    Held(String),
    /// The agent is full: the request was sent back to the agent queue to wait.
    Wait,
}

/// Take a slot of the request's agent if it has a `max_in_flight` (`max`; see [`crate::limit`]);
/// when it is full, send the request back to the agent queue to ask again later (a request that
/// may no longer start is left to [`AgentRuntime::run`], which says so and starts nothing). An
/// error leaves the message to come back: it was not sent back.
pub async fn take_slot(
    deps: &Deps,
    max: Option<u32>,
    req: &AgentRequest,
    sent_at: Option<Millis>,
) -> Result<Slot, HandlerError> {
    let Some(max) = max else { return Ok(Slot::Unlimited) };
    let now = deps.now();
    let Some(deadline) = runtime::execution_deadline(req, now) else { return Ok(Slot::Unlimited) };
    let holder = format!("{}.{}", req.attempt, &deps.entropy.token().to_string()[..8]);
    let until = deadline.plus_ms(limit::LEASE_MARGIN_MS);
    match deps.limiter.acquire(&req.agent, max, &holder, until, now).await? {
        Acquire::Taken { reclaimed } => {
            if reclaimed > 0 {
                warn!(agent = %req.agent, reclaimed, "reclaimed slots whose holders passed their deadline without giving them back");
            }
            Ok(Slot::Held(holder))
        }
        Acquire::Full { held } => {
            let mut again = req.clone();
            again.waits = req.waits.saturating_add(1);
            again.waiting_since = req.waiting_since.or(sent_at).or(Some(now));
            let delay = limit::wait_delay(again.waits, deps.entropy.jitter());
            info!(agent = %req.agent, max_in_flight = max, held, waits = again.waits, delay_s = delay, "agent at its max_in_flight: the request waits");
            metrics::count(&metrics::AGENT_AT_LIMIT, &[&req.agent], 1);
            deps.outbox().dispatch_later(&again, delay).await?;
            Ok(Slot::Wait)
        }
    }
}
