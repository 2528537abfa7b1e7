//! Which agents a function hosts: `config/agents.json` (compiled in) or the file named by
//! `SAS_AGENTS_FILE`. Endpoints come from configuration only, never from a submission, so a caller
//! cannot make an agent call an arbitrary URL.

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, warn};

use super::handover::CallbackEndpoints;

use super::approval::ApprovalAgent;
use super::http::{self, HttpAgent};
use super::runtime::{Agent, AgentError, AgentRuntime, Call, CallRetry};
use super::sim::SimAgent;

impl AgentRuntime {
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
        let client = http::client();
        let max = file.max_response_bytes.unwrap_or(http::DEFAULT_MAX_RESPONSE_BYTES);
        let callback = file.callback.map(|c| c.expand(vars)).unwrap_or_default();
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
                        rt.register(name, HttpAgent::new(client.clone(), url, max).with_callback(callback.clone()));
                    }
                    Err(var) => {
                        let message = format!("agent {name} is not configured: {var} is not set");
                        warn!("{message}");
                        rt.register(name, Unconfigured { message });
                    }
                },
                AgentSpec::Approval { topic_arn } => match expand(&topic_arn, vars) {
                    Ok(arn) => {
                        if !arn.starts_with("arn:") {
                            return Err(AgentConfigError::BadTopic { agent: name, arn });
                        }
                        rt.register(name, ApprovalAgent::new(arn, callback.clone()));
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
}

/// One agent of a configuration as `sasctl validate` sees it: its kind, and the first variable it
/// needs that is not set (the function would register it as unconfigured: every call fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSurvey {
    pub name: String,
    pub kind: &'static str,
    pub missing_var: Option<String>,
}

/// The agents of a configuration file, checked as [`AgentRuntime::from_config`] builds them, and
/// the variables each needs.
pub fn survey(json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<Vec<AgentSurvey>, AgentConfigError> {
    // a file the functions would refuse is refused here the same way
    AgentRuntime::from_config(json, vars)?;
    let file: AgentFile = serde_json::from_str(json).map_err(|e| AgentConfigError::Json(e.to_string()))?;
    Ok(file
        .agents
        .into_iter()
        .map(|(name, spec)| {
            let (kind, template) = match spec {
                AgentSpec::Sim => ("sim", None),
                AgentSpec::Http { url } => ("http", Some(url)),
                AgentSpec::Approval { topic_arn } => ("approval", Some(topic_arn)),
            };
            let missing_var = template.and_then(|t| expand(&t, vars).err());
            AgentSurvey { name, kind, missing_var }
        })
        .collect())
}

/// The agent definitions compiled into every binary.
pub const BUILT_IN_AGENTS: &str = include_str!("../../../../config/agents.json");

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentConfigError {
    #[error("agent configuration is not valid: {0}")]
    Json(String),
    #[error("cannot read agent file {path}: {message}")]
    Io { path: String, message: String },
    #[error("agent {agent}: {url:?} is not an http(s) URL")]
    BadUrl { agent: String, url: String },
    #[error("agent {agent}: {arn:?} is not an SNS topic ARN")]
    BadTopic { agent: String, arn: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallbackSpec {
    #[serde(default)]
    queue_url: Option<String>,
    #[serde(default)]
    url: Option<String>,
}

impl CallbackSpec {
    fn expand(self, vars: &dyn Fn(&str) -> Option<String>) -> CallbackEndpoints {
        let one = |what: &str, s: Option<String>| {
            let s = s?;
            match expand(&s, vars) {
                Ok(v) => Some(v),
                Err(var) => {
                    debug!("callback {what} left out of the hand-over: {var} is not set");
                    None
                }
            }
        };
        CallbackEndpoints { queue_url: one("queue_url", self.queue_url), url: one("url", self.url) }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    agents: std::collections::BTreeMap<String, AgentSpec>,
    #[serde(default)]
    retry: Option<CallRetry>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
    /// Where callback steps are answered, told to the remote side with the token.
    #[serde(default)]
    callback: Option<CallbackSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum AgentSpec {
    Sim,
    Http {
        url: String,
    },
    /// A person approves: the token goes to an SNS topic (an email subscription), answered with
    /// `sasctl approve|reject TOKEN` or the HTTPS endpoint.
    Approval {
        topic_arn: String,
    },
}

/// Replace every `${NAME}`; `Err(NAME)` for the first one that is not set.
pub(super) fn expand(s: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
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
