//! Which agents a function hosts: `config/agents.json` (compiled in) or the file named by
//! `SAS_AGENTS_FILE`. Endpoints come from configuration only, never from a submission, so a caller
//! cannot make an agent call an arbitrary URL. Each kind's configuration lives in its module (see
//! [`super::kind`]); this file reads the file, expands variables and dispatches.

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, warn};

use super::handover::CallbackEndpoints;

use std::sync::Arc;

pub use super::kind::AgentConfigError;
use super::kind::{AgentKind, AwsConfigCell, BuildContext, Grant};
use super::runtime::{Agent, AgentError, AgentRuntime, Call, CallRetry};
use super::sim::SimAgent;
use super::{approval, aws_api, eventbridge, fail, http, lambda, s3_items, sim, sns, sqs};

impl AgentRuntime {
    /// The runtime with only the simulated agent (`sim`).
    pub fn with_builtins() -> Self {
        let mut rt = AgentRuntime::new(CallRetry::default());
        rt.register("sim", SimAgent);
        rt
    }

    /// The agents of a configuration file (see `config/agents.json`). `${NAME}` in any of an
    /// agent's values is taken from `vars`; an agent that names an unset variable is registered as
    /// unconfigured: its calls fail permanently with a message that says which variable is missing.
    pub fn from_config(json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self, AgentConfigError> {
        Self::from_config_with(json, vars, AwsConfigCell::default())
    }

    /// As [`AgentRuntime::from_config`], with the AWS configuration the agents that call AWS use.
    pub fn from_config_with(
        json: &str,
        vars: &dyn Fn(&str) -> Option<String>,
        aws: AwsConfigCell,
    ) -> Result<Self, AgentConfigError> {
        let file: AgentFile = crate::config_file::parse(json).map_err(|e| AgentConfigError::Json(e.to_string()))?;
        let mut rt = AgentRuntime::new(file.retry.clone().unwrap_or_default());
        let cx = BuildContext {
            http: http::client(),
            max_response_bytes: file.max_response_bytes.unwrap_or(http::DEFAULT_MAX_RESPONSE_BYTES),
            callback: file.callback.clone().map(|c| c.expand(vars)).unwrap_or_default(),
            aws,
        };
        for entry in file.entries(vars)? {
            if let Some(max) = entry.max_in_flight {
                rt.set_limit(entry.name.clone(), max);
            }
            if let Some(rate) = entry.rate {
                rt.set_rate(entry.name.clone(), rate);
            }
            if let Some(retry) = entry.retry.clone() {
                rt.set_retry(entry.name.clone(), retry);
            }
            if let Some(spec) = entry.spec {
                let agent = spec.build(&entry.name, &cx)?;
                rt.register_arc(entry.name, agent);
            } else {
                let message = format!(
                    "agent {} is not configured: {} is not set",
                    entry.name,
                    entry.missing_var.as_deref().unwrap_or("a variable")
                );
                warn!("{message}");
                rt.register(entry.name, Unconfigured { message });
            }
        }
        Ok(rt)
    }

    /// The built-in agent configuration, or the file named by `SAS_AGENTS_FILE`, with the
    /// variables of [`env_vars`].
    pub fn from_env() -> Result<Self, AgentConfigError> {
        let text = match std::env::var("SAS_AGENTS_FILE") {
            Ok(path) if !path.is_empty() => std::fs::read_to_string(&path)
                .map_err(|e| AgentConfigError::Io { path: path.clone(), message: e.to_string() })?,
            _ => BUILT_IN_AGENTS.to_owned(),
        };
        let vars = env_vars()?;
        Self::from_config(&text, &vars)
    }
}

/// The environment variable that gives an agents file's `${VAR}`s their values on a deployed
/// stack: the template parameter `AgentVariables`, `KEY=VALUE` pairs separated by commas.
pub const VARIABLES_ENV: &str = "SAS_AGENT_VARIABLES";

/// `KEY=VALUE,KEY=VALUE` (the template parameter `AgentVariables`): the values of an agents file's
/// variables. Spaces around a pair are ignored; a key is a variable's name (`A-Z`, `0-9`, `_`, not
/// starting with a digit); a value may not hold a comma.
pub fn parse_variables(text: &str) -> Result<std::collections::BTreeMap<String, String>, AgentConfigError> {
    let bad = |message: String| AgentConfigError::Variables(message);
    let mut out = std::collections::BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| bad(format!("{pair:?} is not KEY=VALUE")))?;
        let k = k.trim();
        let name_ok = k.chars().next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
            && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !name_ok {
            return Err(bad(format!("{k:?} is not a variable name (A-Z, 0-9 and _, not starting with a digit)")));
        }
        if out.insert(k.to_owned(), v.trim().to_owned()).is_some() {
            return Err(bad(format!("{k} is given twice")));
        }
    }
    Ok(out)
}

/// The variables an agent function's agents see: its environment (what the template sets, e.g.
/// `ORDER_SERVICE_URL`), then the pairs of [`VARIABLES_ENV`]. Empty values count as unset, so a
/// variable the template leaves empty (`OrderServiceUrl` not given) may come from the pairs.
pub fn env_vars() -> Result<impl Fn(&str) -> Option<String>, AgentConfigError> {
    variables(|k| std::env::var(k).ok(), &std::env::var(VARIABLES_ENV).unwrap_or_default())
}

/// [`env_vars`] from an environment `env` and the pairs `pairs`.
pub fn variables(
    env: impl Fn(&str) -> Option<String>,
    pairs: &str,
) -> Result<impl Fn(&str) -> Option<String>, AgentConfigError> {
    let given = parse_variables(pairs)?;
    Ok(move |k: &str| env(k).filter(|v| !v.is_empty()).or_else(|| given.get(k).cloned()).filter(|v| !v.is_empty()))
}

/// One agent of a configuration as `sasctl validate` sees it: its kind, the first variable it
/// needs that is not set (the function would register it as unconfigured: every call fails), and
/// the AWS calls it makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSurvey {
    pub name: String,
    pub kind: &'static str,
    /// It only hands work over: valid on callback steps only.
    pub callback_only: bool,
    pub missing_var: Option<String>,
    /// Empty when a variable is missing (the resources are not known).
    pub grants: Vec<Grant>,
    /// How many of its calls may be in flight at once, if it says.
    pub max_in_flight: Option<u32>,
    /// How fast its calls may start, if it says.
    pub rate: Option<crate::limit::Rate>,
}

/// The agents of a configuration file, checked as [`AgentRuntime::from_config`] builds them, and
/// the variables and permissions each needs.
pub fn survey(json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<Vec<AgentSurvey>, AgentConfigError> {
    // a file the functions would refuse is refused here the same way
    AgentRuntime::from_config(json, vars)?;
    let file: AgentFile = crate::config_file::parse(json).map_err(|e| AgentConfigError::Json(e.to_string()))?;
    Ok(file
        .entries(vars)?
        .into_iter()
        .map(|e| AgentSurvey {
            name: e.name,
            kind: e.kind,
            callback_only: e.callback_only,
            missing_var: e.missing_var,
            grants: e.spec.map(|s| s.grants()).unwrap_or_default(),
            max_in_flight: e.max_in_flight,
            rate: e.rate,
        })
        .collect())
}

/// The agent definitions compiled into every binary.
pub const BUILT_IN_AGENTS: &str = include_str!("../../../../config/agents.json");

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Deserialize)]
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

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentFile {
    /// The JSON Schema an editor checks the file against; not read here.
    #[serde(rename = "$schema", default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    _schema: Option<serde::de::IgnoredAny>,
    /// Each agent's entry as written: checked against its kind before and after its variables are
    /// expanded.
    #[cfg_attr(feature = "schema", schemars(with = "std::collections::BTreeMap<String, AgentSpec>"))]
    agents: std::collections::BTreeMap<String, Value>,
    #[serde(default)]
    retry: Option<CallRetry>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
    /// Where callback steps are answered, told to the remote side with the token.
    #[serde(default)]
    callback: Option<CallbackSpec>,
}

/// One agent of a file: `spec` with its variables expanded, `None` when one is not set.
struct Entry {
    name: String,
    kind: &'static str,
    callback_only: bool,
    missing_var: Option<String>,
    spec: Option<AgentSpec>,
    /// How many of its calls may be in flight at once, across all tasks (see [`crate::limit`]).
    max_in_flight: Option<u32>,
    /// How it retries within an attempt, when not as the file's `retry` says.
    retry: Option<CallRetry>,
    /// How fast its calls may start, across all tasks (see [`crate::limit`]'s pacing).
    rate: Option<crate::limit::Rate>,
}

/// An entry's `rate` (any kind may have one), taken out of the entry.
fn take_rate(name: &str, v: &mut Value) -> Result<Option<crate::limit::Rate>, AgentConfigError> {
    let Some(raw) = v.as_object_mut().and_then(|o| o.remove("rate")) else { return Ok(None) };
    let spec = crate::limit::RateSpec::deserialize(&raw).map_err(|e| e.to_string());
    spec.and_then(|s| crate::limit::Rate::of(&s))
        .map(Some)
        .map_err(|e| AgentConfigError::Json(format!("agent {name}: rate: {e}")))
}

/// An entry's `max_in_flight` and `retry` (any kind may have them), taken out of the entry so its
/// kind's own fields are checked without them.
fn take_common(name: &str, raw: &Value) -> Result<(Value, Option<u32>, Option<CallRetry>), AgentConfigError> {
    let mut v = raw.clone();
    let retry = v
        .as_object_mut()
        .and_then(|o| o.remove("retry"))
        .map(|r| {
            let retry = CallRetry::deserialize(&r).map_err(|e| e.to_string())?;
            retry.check().map(|()| retry)
        })
        .transpose()
        .map_err(|e| AgentConfigError::Json(format!("agent {name}: retry: {e}")))?;
    let Some(max) = v.as_object_mut().and_then(|o| o.remove("max_in_flight")) else { return Ok((v, None, retry)) };
    match max.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|n| (1..=crate::limit::MAX_IN_FLIGHT).contains(n)) {
        Some(n) => Ok((v, Some(n), retry)),
        None => Err(AgentConfigError::Json(format!(
            "agent {name}: max_in_flight is {max}; it must be a whole number from 1 to {}",
            crate::limit::MAX_IN_FLIGHT
        ))),
    }
}

impl AgentFile {
    fn entries(&self, vars: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Entry>, AgentConfigError> {
        let parse = |name: &str, v: &Value| {
            AgentSpec::deserialize(v).map_err(|e| AgentConfigError::Json(format!("agent {name}: {e}")))
        };
        let mut out = Vec::new();
        for (name, raw) in &self.agents {
            let mut raw = raw.clone();
            let rate = take_rate(name, &mut raw)?;
            let (raw, max_in_flight, retry) = take_common(name, &raw)?;
            // the entry as written must already be a valid one of its kind
            let written = parse(name, &raw)?;
            let (spec, missing_var) = match expand_value(&raw, vars) {
                Ok(v) => (Some(parse(name, &v)?), None),
                Err(var) => (None, Some(var)),
            };
            out.push(Entry {
                name: name.clone(),
                kind: written.kind(),
                callback_only: written.callback_only(),
                missing_var,
                spec,
                max_in_flight,
                retry,
                rate,
            });
        }
        Ok(out)
    }
}

/// Every kind of agent: its `"kind"` and its module's configuration.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum AgentSpec {
    Sim(sim::SimKind),
    Http(http::HttpKind),
    Approval(approval::ApprovalKind),
    Lambda(lambda::LambdaKind),
    Sqs(sqs::SqsKind),
    Sns(sns::SnsKind),
    #[serde(rename = "eventbridge")]
    EventBridge(eventbridge::EventBridgeKind),
    Fail(fail::FailKind),
    Aws(aws_api::AwsKind),
    S3Items(s3_items::S3ItemsKind),
}

/// One arm per kind, the same call on each.
macro_rules! each_kind {
    ($spec:expr, $k:ident => $e:expr) => {
        match $spec {
            AgentSpec::Sim($k) => $e,
            AgentSpec::Http($k) => $e,
            AgentSpec::Approval($k) => $e,
            AgentSpec::Lambda($k) => $e,
            AgentSpec::Sqs($k) => $e,
            AgentSpec::Sns($k) => $e,
            AgentSpec::EventBridge($k) => $e,
            AgentSpec::Fail($k) => $e,
            AgentSpec::Aws($k) => $e,
            AgentSpec::S3Items($k) => $e,
        }
    };
}

impl AgentSpec {
    fn kind(&self) -> &'static str {
        fn of<K: AgentKind>(_: &K) -> &'static str {
            K::KIND
        }
        each_kind!(self, k => of(k))
    }

    fn callback_only(&self) -> bool {
        each_kind!(self, k => k.serves_callbacks_only())
    }

    fn grants(&self) -> Vec<Grant> {
        each_kind!(self, k => k.grants())
    }

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        each_kind!(self, k => k.build(name, cx))
    }
}

/// Every string of `v` with its `${NAME}`s replaced; `Err(NAME)` for the first one not set.
fn expand_value(v: &Value, vars: &dyn Fn(&str) -> Option<String>) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => Value::String(expand(s, vars)?),
        Value::Array(a) => Value::Array(a.iter().map(|x| expand_value(x, vars)).collect::<Result<_, _>>()?),
        Value::Object(o) => Value::Object(
            o.iter().map(|(k, x)| Ok((k.clone(), expand_value(x, vars)?))).collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
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
