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
//! - [`sim`]: the simulated agent for tests and demos;
//! - [`kind`]: what each kind of agent provides (its configuration, how it is built, its IAM);
//! - [`config`]: which agents a function hosts (`config/agents.json`).

use tracing::info;

use crate::deps::{Deps, HandlerError};
use crate::ids::Millis;
use crate::messages::{AgentRequest, Outcome, SchedulerMessage, VERSION};
use crate::metrics;

pub mod approval;
pub mod aws_error;
pub mod config;
pub mod deliver;
pub mod eventbridge;
pub mod handover;
pub mod http;
pub mod kind;
pub mod lambda;
pub mod runtime;
pub mod sim;
pub mod sns;
pub mod sqs;
#[cfg(test)]
mod tests;

pub use approval::ApprovalAgent;
pub use config::{survey, AgentConfigError, AgentSurvey, BUILT_IN_AGENTS};
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
    let req: AgentRequest = serde_json::from_str(raw).map_err(|e| HandlerError::Malformed(e.to_string()))?;
    if req.v != VERSION {
        return Err(HandlerError::Malformed(format!("unsupported version {}", req.v)));
    }
    async {
        let started = deps.now();
        if let Some(sent) = sent_at {
            metrics::duration_ms(&metrics::STEP_SCHEDULE_TIME, &[&req.agent], sent.until(started));
        }
        let Some(mut result) = runtime.run(&req).await else { return Ok(false) };
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
