//! Where the stack's resources are, and the tunables. Lambda functions read the environment the
//! template sets; local tools read the stack outputs (`sasctl deploy-local` writes them).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::protocol::Policy;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("missing setting {0}")]
    Missing(&'static str),
    #[error("setting {name} = {value:?} is not valid: {why}")]
    Invalid { name: &'static str, value: String, why: String },
}

/// The deployed resources the roles talk to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub task_table: String,
    pub submission_queue_url: String,
    pub submission_dlq_url: String,
    pub scheduler_queue_url: String,
    pub agent_queue_url: String,
    pub supervisor_queue_url: String,
    pub alert_topic_arn: String,
    /// How many shards the `ByCompleteBy` index is spread over.
    pub shards: u32,
}

fn parse_num<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, ConfigError> {
    v.trim().parse().map_err(|_| ConfigError::Invalid { name, value: v.to_owned(), why: "not a number".into() })
}

impl Resources {
    /// From the environment the template gives every function.
    pub fn from_env() -> Result<Self, ConfigError> {
        let get = |name: &'static str| std::env::var(name).map_err(|_| ConfigError::Missing(name));
        let shards = match std::env::var("SUPERVISOR_SHARDS") {
            Ok(v) => parse_num("SUPERVISOR_SHARDS", &v)?,
            Err(_) => 4,
        };
        Self {
            task_table: get("TASK_TABLE")?,
            submission_queue_url: get("SUBMISSION_QUEUE_URL")?,
            submission_dlq_url: get("SUBMISSION_DLQ_URL")?,
            scheduler_queue_url: get("SCHEDULER_QUEUE_URL")?,
            agent_queue_url: get("AGENT_QUEUE_URL")?,
            supervisor_queue_url: get("SUPERVISOR_QUEUE_URL")?,
            alert_topic_arn: get("ALERT_TOPIC_ARN")?,
            shards,
        }
        .checked()
    }

    /// From CloudFormation stack outputs (`SubmissionQueueUrl`, `TaskTableName`, ...).
    pub fn from_outputs(outputs: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let get = |name: &'static str| outputs.get(name).cloned().ok_or(ConfigError::Missing(name));
        let shards = match outputs.get("SupervisorShards") {
            Some(v) => parse_num("SupervisorShards", v)?,
            None => 4,
        };
        Self {
            task_table: get("TaskTableName")?,
            submission_queue_url: get("SubmissionQueueUrl")?,
            submission_dlq_url: get("SubmissionDlqUrl")?,
            scheduler_queue_url: get("SchedulerQueueUrl")?,
            agent_queue_url: get("AgentQueueUrl")?,
            supervisor_queue_url: get("SupervisorQueueUrl")?,
            alert_topic_arn: get("AlertTopicArn")?,
            shards,
        }
        .checked()
    }

    fn checked(self) -> Result<Self, ConfigError> {
        if self.shards == 0 || self.shards > 64 {
            return Err(ConfigError::Invalid {
                name: "SUPERVISOR_SHARDS",
                value: self.shards.to_string(),
                why: "must be within 1..=64".into(),
            });
        }
        Ok(self)
    }
}

/// Tunables that are not per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub policy: Policy,
    /// Terminal tasks expire (DynamoDB TTL) this many days after they end; 0 keeps them.
    pub retention_days: u32,
    /// The largest accepted submission `input`, serialised. It keeps task items under DynamoDB's
    /// 400 KB and agent messages under SQS's 256 KiB with room for outputs.
    pub max_input_bytes: usize,
    /// Items per page of the Supervisor's index query.
    pub sweep_page_size: i32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { policy: Policy::default(), retention_days: 30, max_input_bytes: 64 * 1024, sweep_page_size: 100 }
    }
}

impl Settings {
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut s = Settings::default();
        if let Ok(v) = std::env::var("RETENTION_DAYS") {
            s.retention_days = parse_num("RETENTION_DAYS", &v)?;
        }
        if let Ok(v) = std::env::var("START_TIMEOUT_MS") {
            s.policy.start_timeout_ms = parse_num("START_TIMEOUT_MS", &v)?;
        }
        if let Ok(v) = std::env::var("MAX_INPUT_BYTES") {
            s.max_input_bytes = parse_num("MAX_INPUT_BYTES", &v)?;
        }
        Ok(s)
    }
}
