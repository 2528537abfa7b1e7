//! The Agent side: an [`Agent`] wraps one remote service; the [`AgentRuntime`] hosts several of
//! them in one Lambda and enforces the pattern's rules around every call:
//! - no call is started once `CompleteBy` has passed, and a call still running at `CompleteBy` is
//!   cancelled (its future is dropped);
//! - transient errors are retried with exponential backoff and jitter, inside the deadline;
//! - permanent errors are reported at once; nothing is reported after `CompleteBy`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::ids::Millis;
use crate::messages::{AgentRequest, AgentResult, Outcome, VERSION};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// Worth another try (timeouts, 5xx, throttling); `retry_after` honours a server's hint.
    #[error("transient: {message}")]
    Transient { message: String, retry_after: Option<Duration> },
    /// The service said no for good (4xx, declined): retrying cannot help.
    #[error("permanent: {message}")]
    Permanent { message: String },
}

/// One call of an agent within one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub request: &'a AgentRequest,
    /// 1 for the first call of this attempt.
    pub call_no: u32,
}

/// A wrapper around one remote service. Implementations pass `request.idempotency_key` to the
/// service so that retries apply the effect once.
pub trait Agent: Send + Sync {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>>;
}

/// Retries inside one attempt.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRetry {
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
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.agents.keys().collect();
        names.sort();
        f.debug_struct("AgentRuntime").field("agents", &names).field("retry", &self.retry).finish()
    }
}

impl AgentRuntime {
    pub fn new(retry: CallRetry) -> Self {
        AgentRuntime { agents: HashMap::new(), retry }
    }

    /// The runtime with only the simulated agent (`sim`).
    pub fn with_builtins() -> Self {
        let mut rt = AgentRuntime::new(CallRetry::default());
        rt.register("sim", SimAgent);
        rt
    }

    /// The agents of a configuration file (see `config/agents.json`). `${NAME}` in a URL is taken
    /// from `vars`; an agent whose URL names an unset variable is registered as unconfigured: its
    /// calls fail permanently with a message that says which variable is missing.
    pub fn from_config(json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self, AgentConfigError> {
        let file: AgentFile = serde_json::from_str(json).map_err(|e| AgentConfigError::Json(e.to_string()))?;
        let mut rt = AgentRuntime::new(file.retry.unwrap_or_default());
        let client = crate::http_agent::client();
        let max = file.max_response_bytes.unwrap_or(crate::http_agent::DEFAULT_MAX_RESPONSE_BYTES);
        for (name, spec) in file.agents {
            match spec {
                AgentSpec::Sim => {
                    rt.register(name, SimAgent);
                }
                AgentSpec::Http { url } => match expand(&url, vars) {
                    Ok(url) => {
                        if !(url.starts_with("http://") || url.starts_with("https://")) {
                            return Err(AgentConfigError::BadUrl { agent: name, url });
                        }
                        rt.register(name, crate::http_agent::HttpAgent::new(client.clone(), url, max));
                    }
                    Err(var) => {
                        let message = format!("agent {name} is not configured: {var} is not set");
                        warn!("{message}");
                        rt.register(name, Unconfigured { message });
                    }
                },
            }
        }
        Ok(rt)
    }

    /// The built-in agent configuration, or the file named by `SAS_AGENTS_FILE`, with variables
    /// from the environment (`ORDER_SERVICE_URL` for the order workflow's agents).
    pub fn from_env() -> Result<Self, AgentConfigError> {
        let text = match std::env::var("SAS_AGENTS_FILE") {
            Ok(path) if !path.is_empty() => std::fs::read_to_string(&path)
                .map_err(|e| AgentConfigError::Io { path: path.clone(), message: e.to_string() })?,
            _ => BUILT_IN_AGENTS.to_owned(),
        };
        Self::from_config(&text, &|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    pub fn register(&mut self, name: impl Into<String>, agent: impl Agent + 'static) -> &mut Self {
        self.agents.insert(name.into(), Arc::new(agent));
        self
    }

    pub fn knows(&self, name: &str) -> bool {
        self.agents.contains_key(name)
    }

    /// Run one attempt. `None`: nothing may be sent back (CompleteBy passed, or the call was cut).
    pub async fn run(&self, req: &AgentRequest) -> Option<AgentResult> {
        let result = |outcome| AgentResult {
            v: VERSION,
            task_id: req.task_id.clone(),
            step: req.step.clone(),
            attempt: req.attempt.clone(),
            outcome,
        };
        if Millis::now() >= req.complete_by {
            info!(task_id = %req.task_id, step = %req.step, "CompleteBy passed before the attempt started: nothing started");
            return None;
        }
        let Some(agent) = self.agents.get(&req.agent) else {
            warn!(task_id = %req.task_id, agent = %req.agent, "no such agent in this runtime");
            return Some(result(Outcome::Failed {
                error: format!("no agent named {:?} is deployed", req.agent),
                retryable: false,
            }));
        };
        let mut call_no = 1;
        loop {
            let left = Millis::now().until(req.complete_by);
            if left == 0 {
                return None;
            }
            let call = agent.call(Call { request: req, call_no });
            let answer = match tokio::time::timeout(Duration::from_millis(left), call).await {
                Err(_) => {
                    warn!(task_id = %req.task_id, step = %req.step, call_no, "call cancelled at CompleteBy; nothing is sent back");
                    return None;
                }
                Ok(a) => a,
            };
            let outcome = match answer {
                Ok(output) => Outcome::Succeeded { output },
                Err(AgentError::Permanent { message }) => Outcome::Failed { error: message, retryable: false },
                Err(AgentError::Transient { message, retry_after }) => {
                    let backoff = retry_after.unwrap_or_else(|| self.retry.delay(call_no, rand::random()));
                    let time_left = Millis::now().until(req.complete_by);
                    if call_no >= self.retry.max_calls || u128::from(time_left) <= backoff.as_millis() {
                        info!(task_id = %req.task_id, step = %req.step, call_no, error = %message, "giving up this attempt");
                        Outcome::Failed { error: format!("{message} (after {call_no} calls)"), retryable: true }
                    } else {
                        info!(task_id = %req.task_id, step = %req.step, call_no, error = %message, backoff_ms = backoff.as_millis(), "transient error; retrying");
                        tokio::time::sleep(backoff).await;
                        call_no += 1;
                        continue;
                    }
                }
            };
            if Millis::now() >= req.complete_by {
                info!(task_id = %req.task_id, step = %req.step, "answer came after CompleteBy: not sent");
                return None;
            }
            return Some(result(outcome));
        }
    }
}

/// The agent definitions compiled into every binary.
pub const BUILT_IN_AGENTS: &str = include_str!("../../../config/agents.json");

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentConfigError {
    #[error("agent configuration is not valid: {0}")]
    Json(String),
    #[error("cannot read agent file {path}: {message}")]
    Io { path: String, message: String },
    #[error("agent {agent}: {url:?} is not an http(s) URL")]
    BadUrl { agent: String, url: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    agents: std::collections::BTreeMap<String, AgentSpec>,
    #[serde(default)]
    retry: Option<CallRetry>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum AgentSpec {
    Sim,
    Http { url: String },
}

/// Replace every `${NAME}`; `Err(NAME)` for the first one that is not set.
fn expand(s: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| after.to_owned())?;
        let name = &after[..end];
        out.push_str(vars(name).ok_or_else(|| name.to_owned())?.trim_end_matches('/'));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Stands in for an agent whose configuration is incomplete.
#[derive(Debug)]
struct Unconfigured {
    message: String,
}

impl Agent for Unconfigured {
    fn call<'a>(&'a self, _call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move { Err(AgentError::Permanent { message: self.message.clone() }) })
    }
}

/// A built-in agent for tests and the demo: it performs no effect and behaves as the task's input
/// tells it, under `input.sim.<step name>`:
/// `{"delay_ms": 50, "hang_attempts": 1, "fail_calls": 2, "fail_attempts": 1, "permanent": "declined"}`
/// - `hang_attempts`: attempts 1..=n never answer (as a crashed or hung service);
/// - `fail_calls`: in every attempt, calls 1..=n fail transiently;
/// - `fail_attempts`: attempts 1..=n fail transiently on every call;
/// - `permanent`: fail permanently with this message.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimAgent;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimSpec {
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    hang_attempts: u32,
    #[serde(default)]
    fail_calls: u32,
    #[serde(default)]
    fail_attempts: u32,
    #[serde(default)]
    permanent: Option<String>,
}

impl Agent for SimAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let req = call.request;
            let spec = match req.input.pointer(&format!("/input/sim/{}", req.step)) {
                None => SimSpec::default(),
                Some(v) => SimSpec::deserialize(v).map_err(|e| AgentError::Permanent {
                    message: format!("bad sim spec for step {}: {e}", req.step),
                })?,
            };
            if spec.delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(spec.delay_ms)).await;
            }
            if req.attempt_no <= spec.hang_attempts {
                futures::future::pending::<()>().await;
            }
            if let Some(message) = spec.permanent {
                return Err(AgentError::Permanent { message });
            }
            if req.attempt_no <= spec.fail_attempts || call.call_no <= spec.fail_calls {
                return Err(AgentError::Transient {
                    message: format!("simulated transient failure (attempt {}, call {})", req.attempt_no, call.call_no),
                    retry_after: None,
                });
            }
            Ok(json!({
                "agent": "sim",
                "step": req.step,
                "idempotency_key": req.idempotency_key,
                "attempt_no": req.attempt_no,
                "calls": call.call_no,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AttemptToken, IdempotencyKey, TaskId};
    use crate::messages::Phase;

    fn req(sim: Value, attempt_no: u32, deadline_in_ms: u64) -> AgentRequest {
        let task_id = TaskId::try_from("t").unwrap();
        AgentRequest {
            v: 1,
            idempotency_key: IdempotencyKey::for_step(&task_id, "charge"),
            task_id,
            step: "charge".into(),
            phase: Phase::Forward,
            agent: "sim".into(),
            attempt: AttemptToken::from("a"),
            attempt_no,
            complete_by: Millis::now().plus_ms(deadline_in_ms),
            input: json!({"input": {"sim": {"charge": sim}}, "outputs": {}}),
        }
    }

    fn fast() -> AgentRuntime {
        let mut rt = AgentRuntime::new(CallRetry { max_calls: 4, base_ms: 1, max_ms: 5 });
        rt.register("sim", SimAgent);
        rt
    }

    #[tokio::test]
    async fn success_carries_output() {
        let r = fast().run(&req(json!({}), 1, 5_000)).await.unwrap();
        assert!(matches!(r.outcome, Outcome::Succeeded { ref output } if output["idempotency_key"] == "t:charge"));
    }

    #[tokio::test]
    async fn transient_errors_are_retried_within_the_attempt() {
        let r = fast().run(&req(json!({"fail_calls": 2}), 1, 5_000)).await.unwrap();
        assert!(matches!(r.outcome, Outcome::Succeeded { ref output } if output["calls"] == 3), "{r:?}");
    }

    #[tokio::test]
    async fn too_many_transient_errors_report_a_retryable_failure() {
        let r = fast().run(&req(json!({"fail_calls": 10}), 1, 5_000)).await.unwrap();
        assert!(matches!(r.outcome, Outcome::Failed { retryable: true, .. }), "{r:?}");
    }

    #[tokio::test]
    async fn permanent_errors_are_reported_at_once() {
        let r = fast().run(&req(json!({"permanent": "declined"}), 1, 5_000)).await.unwrap();
        assert_eq!(r.outcome, Outcome::Failed { error: "declined".into(), retryable: false });
    }

    #[tokio::test]
    async fn a_hung_call_is_cut_at_complete_by_and_nothing_is_sent() {
        let started = std::time::Instant::now();
        assert!(fast().run(&req(json!({"hang_attempts": 1}), 1, 200)).await.is_none());
        assert!(started.elapsed() < Duration::from_secs(2));
        // the next attempt answers
        assert!(fast().run(&req(json!({"hang_attempts": 1}), 2, 2_000)).await.is_some());
    }

    #[tokio::test]
    async fn nothing_starts_after_complete_by() {
        let mut r = req(json!({}), 1, 0);
        r.complete_by = Millis(r.complete_by.0 - 1);
        assert!(fast().run(&r).await.is_none());
    }

    #[tokio::test]
    async fn answers_after_complete_by_are_dropped() {
        assert!(fast().run(&req(json!({"delay_ms": 300}), 1, 100)).await.is_none());
    }

    #[tokio::test]
    async fn unknown_agents_fail_permanently() {
        let mut r = req(json!({}), 1, 5_000);
        r.agent = "nope".into();
        let out = fast().run(&r).await.unwrap();
        assert!(matches!(out.outcome, Outcome::Failed { retryable: false, .. }));
    }

    #[test]
    fn configuration_expands_variables_and_flags_missing_ones() {
        assert_eq!(expand("${A}/x", &|_| Some("http://h:1/".into())).unwrap(), "http://h:1/x");
        assert_eq!(expand("${MISSING}/x", &|_| None), Err("MISSING".to_owned()));
        let rt = AgentRuntime::from_config(BUILT_IN_AGENTS, &|_| Some("http://127.0.0.1:9".into())).unwrap();
        for a in ["sim", "inventory.reserve", "inventory.release", "payment.charge", "payment.refund", "shipping.ship"]
        {
            assert!(rt.knows(a), "{a}");
        }
        let bad = r#"{"agents": {"x": {"kind": "http", "url": "file:///etc/passwd"}}}"#;
        assert!(matches!(AgentRuntime::from_config(bad, &|_| None), Err(AgentConfigError::BadUrl { .. })));
    }

    #[tokio::test]
    async fn an_unconfigured_agent_fails_permanently_with_the_missing_variable() {
        let rt = AgentRuntime::from_config(BUILT_IN_AGENTS, &|_| None).unwrap();
        let mut r = req(json!({}), 1, 5_000);
        r.agent = "payment.charge".into();
        let out = rt.run(&r).await.unwrap();
        assert!(
            matches!(out.outcome, Outcome::Failed { retryable: false, ref error } if error.contains("ORDER_SERVICE_URL")),
            "{out:?}"
        );
    }

    #[test]
    fn call_backoff_is_capped() {
        let c = CallRetry { max_calls: 5, base_ms: 100, max_ms: 1_000 };
        assert_eq!(c.delay(1, 1.0), Duration::from_millis(100));
        assert_eq!(c.delay(3, 1.0), Duration::from_millis(400));
        assert_eq!(c.delay(30, 1.0), Duration::from_secs(1));
    }
}
