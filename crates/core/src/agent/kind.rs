//! What every agent kind provides behind the one [`Agent`] interface: its configuration (a struct
//! deserialised from its entry in the agents file, variables already expanded), how it is built,
//! whether it can only hand work over (callback steps), and the AWS permissions it needs.
//!
//! Adding a kind is a module with a spec struct implementing [`AgentKind`] and one variant in
//! `config::AgentSpec`; no role and no protocol code changes.

use std::borrow::Cow;
use std::sync::Arc;

use aws_config::SdkConfig;
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;

use super::handover::CallbackEndpoints;
use super::runtime::Agent;

/// What the agents of one process share when they are built.
#[derive(Debug, Clone)]
pub struct BuildContext {
    /// One HTTP client (connection pool) for every HTTP agent.
    pub http: reqwest::Client,
    /// The limit on an answer that becomes step output.
    pub max_response_bytes: usize,
    /// Where the remote side of a callback step answers (told with the token).
    pub callback: CallbackEndpoints,
    /// The AWS configuration, loaded on first use (only kinds that call AWS load it).
    pub aws: AwsConfigCell,
}

/// One AWS call an agent makes on one resource: what its function's role must allow, and the
/// template parameter that grants it (`sasctl validate` compares them with the template's
/// grants). Each kind names its parameters itself: a new kind that calls AWS adds its parameter
/// to `template.yaml` and nowhere else in the code.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// The IAM action, e.g. `lambda:InvokeFunction`.
    pub action: Cow<'static, str>,
    /// The resource: an ARN, or a name when the configuration gives only a name.
    pub resource: String,
    /// The template parameter whose ARNs the Agent function's role is granted `action` on
    /// (comma-separated, `*` wildcards as IAM), e.g. `AgentFunctionArns`.
    pub parameter: &'static str,
    /// The Agent function's variable that names a resource the template grants by itself (the
    /// stack's own approval topic): a grant on that very resource needs no parameter.
    pub stack_variable: Option<&'static str>,
    /// The template parameter that lists the actions granted, when the action is not fixed by
    /// the template (the `aws` kind's `AgentAwsActions`).
    pub action_parameter: Option<&'static str>,
}

impl Grant {
    /// `action` on `resource`, granted by the template parameter `parameter`.
    pub fn new(action: impl Into<Cow<'static, str>>, resource: impl Into<String>, parameter: &'static str) -> Self {
        Grant {
            action: action.into(),
            resource: resource.into(),
            parameter,
            stack_variable: None,
            action_parameter: None,
        }
    }

    /// The same, the action granted by the template parameter `parameter` (a list of actions).
    #[must_use]
    pub fn with_action_parameter(mut self, parameter: &'static str) -> Self {
        self.action_parameter = Some(parameter);
        self
    }

    /// The same, needing no parameter when `resource` is what the variable `variable` names.
    #[must_use]
    pub fn or_stack(mut self, variable: &'static str) -> Self {
        self.stack_variable = Some(variable);
        self
    }
}

/// An agent kind's configuration.
pub trait AgentKind: DeserializeOwned {
    /// Its `"kind"` in the agents file.
    const KIND: &'static str;
    /// It only hands work over (the answer comes later with the token): valid on callback steps only.
    const CALLBACK_ONLY: bool = false;

    /// This agent only hands work over (by default, as its kind: [`AgentKind::CALLBACK_ONLY`]).
    fn serves_callbacks_only(&self) -> bool {
        Self::CALLBACK_ONLY
    }

    /// The agent, from its configuration with variables expanded; a value the kind cannot use is
    /// an error that names the agent.
    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError>;

    /// The AWS calls its agent makes (none for kinds that call no AWS API).
    fn grants(&self) -> Vec<Grant> {
        Vec::new()
    }
}

/// The process's AWS configuration, loaded once on the first call of an agent that needs it
/// (from the environment: endpoint, region, credentials; timeouts as every role's), or given.
#[derive(Clone, Default)]
pub struct AwsConfigCell(Arc<OnceCell<SdkConfig>>);

impl std::fmt::Debug for AwsConfigCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AwsConfigCell").field(&self.0.initialized()).finish()
    }
}

impl AwsConfigCell {
    /// A cell holding `config` (tests, tools).
    pub fn with(config: SdkConfig) -> Self {
        AwsConfigCell(Arc::new(OnceCell::new_with(Some(config))))
    }

    pub async fn get(&self) -> &SdkConfig {
        self.0
            .get_or_init(|| async {
                let timeouts = crate::aws::SdkTimeouts::from_env().unwrap_or_default();
                crate::aws::load_sdk_config_with(&timeouts).await
            })
            .await
    }
}

/// An AWS client an agent builds on its first call, from the process's configuration (an agent
/// that is never called loads nothing), or one given by the caller (tests, tools).
pub struct LazyClient<C> {
    aws: AwsConfigCell,
    client: OnceCell<C>,
    make: fn(&SdkConfig) -> C,
}

impl<C> std::fmt::Debug for LazyClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyClient").field("built", &self.client.initialized()).finish_non_exhaustive()
    }
}

impl<C> LazyClient<C> {
    /// Built by `make` from the configuration `aws` loads, on first use.
    pub fn new(aws: AwsConfigCell, make: fn(&SdkConfig) -> C) -> Self {
        LazyClient { aws, client: OnceCell::new(), make }
    }

    /// This client, as it is.
    pub fn given(client: C, make: fn(&SdkConfig) -> C) -> Self {
        LazyClient { aws: AwsConfigCell::default(), client: OnceCell::new_with(Some(client)), make }
    }

    pub async fn get(&self) -> &C {
        self.client.get_or_init(|| async { (self.make)(self.aws.get().await) }).await
    }
}

/// A configuration the functions refuse (at start: the Agent function does not start).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentConfigError {
    #[error("agent configuration is not valid: {0}")]
    Json(String),
    /// The agents' variables (template parameter `AgentVariables`) cannot be read.
    #[error("AgentVariables (SAS_AGENT_VARIABLES): {0}")]
    Variables(String),
    #[error("cannot read agent file {path}: {message}")]
    Io { path: String, message: String },
    #[error("agent {agent}: {url:?} is not an http(s) URL")]
    BadUrl { agent: String, url: String },
    #[error("agent {agent}: {arn:?} is not an SNS topic ARN")]
    BadTopic { agent: String, arn: String },
    /// A value the agent's kind cannot use.
    #[error("agent {agent}: {message}")]
    Invalid { agent: String, message: String },
}
