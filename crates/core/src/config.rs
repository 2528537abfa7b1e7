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
    /// Where a message of the scheduler, agent or supervisor queue that can never be handled goes
    /// at once, with its reason (when unset, SQS moves it after maxReceiveCount deliveries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_dlq_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_dlq_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor_dlq_url: Option<String>,
    /// Where workers answer callback steps (`CallbackMessage`s), consumed by the Callback function
    /// (and the local runner); absent for a stack deployed before callback steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_queue_url: Option<String>,
    /// Where a callback queue message that can never be handled goes at once, with its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_dlq_url: Option<String>,
    /// The FIFO queue of the ends of map elements and parallel branches (`element_ended`), one
    /// message group per parent: SQS hands a parent's ends to one Scheduler invocation at a time,
    /// so they never race each other for the parent's item. Consumed by the Scheduler as its
    /// second queue; absent (a stack deployed before it), ends go to the scheduler queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_queue_url: Option<String>,
    /// The ARN pattern of the queues a submission may name as `reply_to` (IAM grants the replying
    /// functions the same); unset, no `reply_to` is accepted. See [`crate::reply`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_queue_arn_pattern: Option<String>,
    /// How many shards the `ByCompleteBy` index is spread over.
    pub shards: u32,
}

/// The fewest and the most shards of the indexes (`SUPERVISOR_SHARDS`). The template's
/// `SupervisorShards` parameter allows exactly this range (a test checks it), so a stack that deploys
/// always starts. 64 carries the book's top scale (`docs/performance/scale.md`: 10,000 three-step
/// tasks a second) with room to spare; every sweep and every operator listing queries each shard.
pub const MIN_SHARDS: u32 = 1;
pub const MAX_SHARDS: u32 = 64;

fn parse_num<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, ConfigError> {
    v.trim().parse().map_err(|_| ConfigError::Invalid { name, value: v.to_owned(), why: "not a number".into() })
}

impl Resources {
    /// From the environment the template gives every function.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::assemble(|env, _| env, |name| std::env::var(name).ok())
    }

    /// From CloudFormation stack outputs (`SubmissionQueueUrl`, `TaskTableName`, ...).
    pub fn from_outputs(outputs: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::assemble(|_, output| output, |name| outputs.get(name).cloned())
    }

    /// Each setting has an environment variable and a stack output name; `pick` chooses which
    /// one `get` is asked for.
    fn assemble(
        pick: impl Fn(&'static str, &'static str) -> &'static str,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let required = |env, output| {
            let name = pick(env, output);
            get(name).ok_or(ConfigError::Missing(name))
        };
        let shards_name = pick("SUPERVISOR_SHARDS", "SupervisorShards");
        let shards = match get(shards_name) {
            Some(v) => parse_num(shards_name, &v)?,
            None => 4,
        };
        Self {
            task_table: required("TASK_TABLE", "TaskTableName")?,
            submission_queue_url: required("SUBMISSION_QUEUE_URL", "SubmissionQueueUrl")?,
            submission_dlq_url: required("SUBMISSION_DLQ_URL", "SubmissionDlqUrl")?,
            scheduler_queue_url: required("SCHEDULER_QUEUE_URL", "SchedulerQueueUrl")?,
            agent_queue_url: required("AGENT_QUEUE_URL", "AgentQueueUrl")?,
            supervisor_queue_url: required("SUPERVISOR_QUEUE_URL", "SupervisorQueueUrl")?,
            alert_topic_arn: required("ALERT_TOPIC_ARN", "AlertTopicArn")?,
            scheduler_dlq_url: get(pick("SCHEDULER_DLQ_URL", "SchedulerDlqUrl")),
            agent_dlq_url: get(pick("AGENT_DLQ_URL", "AgentDlqUrl")),
            supervisor_dlq_url: get(pick("SUPERVISOR_DLQ_URL", "SupervisorDlqUrl")),
            callback_queue_url: get(pick("CALLBACK_QUEUE_URL", "CallbackQueueUrl")).filter(|u| !u.is_empty()),
            callback_dlq_url: get(pick("CALLBACK_DLQ_URL", "CallbackDlqUrl")).filter(|u| !u.is_empty()),
            ends_queue_url: get(pick("ENDS_QUEUE_URL", "EndsQueueUrl")).filter(|u| !u.is_empty()),
            reply_queue_arn_pattern: get(pick("REPLY_QUEUE_ARN_PATTERN", "ReplyQueueArnPattern"))
                .filter(|p| !p.is_empty()),
            shards,
        }
        .checked()
    }

    fn checked(self) -> Result<Self, ConfigError> {
        if let Some(url) = &self.ends_queue_url {
            if !crate::messages::QueueUrl::parse(url).is_ok_and(|q| q.is_fifo()) {
                return Err(ConfigError::Invalid {
                    name: "ENDS_QUEUE_URL",
                    value: url.clone(),
                    why: "must be the URL of a FIFO queue (its name ends in .fifo)".into(),
                });
            }
        }
        if !(MIN_SHARDS..=MAX_SHARDS).contains(&self.shards) {
            return Err(ConfigError::Invalid {
                name: "SUPERVISOR_SHARDS",
                value: self.shards.to_string(),
                why: format!("must be within {MIN_SHARDS}..={MAX_SHARDS}"),
            });
        }
        if let Some(p) = &self.reply_queue_arn_pattern {
            if let Err(why) = crate::messages::ArnPattern::parse(p) {
                return Err(ConfigError::Invalid { name: "REPLY_QUEUE_ARN_PATTERN", value: p.clone(), why });
            }
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
    pub sweep_page_size: usize,
    /// How long past `CompleteBy` + the result grace the sweep leaves a task to its own deadline
    /// timer before handing it over too: the sweep is the backstop for lost timers, and a timer
    /// waiting in a backlogged supervisor queue should not be joined by a copy every sweep.
    pub sweep_lag_ms: u64,
    /// How long a send to a queue waits for others to the same queue, to go with them in one
    /// SendMessageBatch request (see `bus::BufferedBus`); 0 sends each message on its own.
    pub send_linger_ms: u64,
}

/// The longest accepted `SEND_LINGER_MS`: every send waits up to this long.
pub const MAX_SEND_LINGER_MS: u64 = 1_000;

fn parse_send_linger(v: &str) -> Result<u64, ConfigError> {
    let ms = parse_num("SEND_LINGER_MS", v)?;
    if ms > MAX_SEND_LINGER_MS {
        return Err(ConfigError::Invalid {
            name: "SEND_LINGER_MS",
            value: v.to_owned(),
            why: format!("must be within 0..={MAX_SEND_LINGER_MS} (milliseconds; 0 disables batching)"),
        });
    }
    Ok(ms)
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            policy: Policy::default(),
            retention_days: 30,
            max_input_bytes: 64 * 1024,
            sweep_page_size: 100,
            sweep_lag_ms: 60_000,
            send_linger_ms: 20,
        }
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
        if let Ok(v) = std::env::var("QUEUE_BUDGET_MS") {
            s.policy.queue_budget_ms = parse_num("QUEUE_BUDGET_MS", &v)?;
            let min = crate::workflow::MIN_QUEUE_BUDGET_MS;
            if s.policy.queue_budget_ms > 0 && s.policy.queue_budget_ms < min {
                let why = format!("0 (no budget) or at least {min}: a request not started within it is claimed again");
                return Err(ConfigError::Invalid { name: "QUEUE_BUDGET_MS", value: v, why });
            }
        }
        if let Ok(v) = std::env::var("RESULT_GRACE_MS") {
            s.policy.result_grace_ms = parse_num("RESULT_GRACE_MS", &v)?;
        }
        if let Ok(v) = std::env::var("SETTLE_MS") {
            s.policy.settle_ms = parse_num("SETTLE_MS", &v)?;
        }
        if let Ok(v) = std::env::var("UNCHECKED_START_MS") {
            s.policy.unchecked_start_ms = parse_num("UNCHECKED_START_MS", &v)?;
        }
        if let Ok(v) = std::env::var("SWEEP_LAG_MS") {
            s.sweep_lag_ms = parse_num("SWEEP_LAG_MS", &v)?;
        }
        if let Ok(v) = std::env::var("MAX_INPUT_BYTES") {
            s.max_input_bytes = parse_num("MAX_INPUT_BYTES", &v)?;
        }
        if let Ok(v) = std::env::var("SEND_LINGER_MS") {
            s.send_linger_ms = parse_send_linger(&v)?;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_map_to_resources_and_missing_ones_are_named() {
        let mut o: HashMap<String, String> = [
            "TaskTableName",
            "SubmissionQueueUrl",
            "SubmissionDlqUrl",
            "SchedulerQueueUrl",
            "AgentQueueUrl",
            "SupervisorQueueUrl",
            "AlertTopicArn",
        ]
        .iter()
        .map(|k| ((*k).to_owned(), format!("v-{k}")))
        .collect();
        let r = Resources::from_outputs(&o).unwrap();
        assert_eq!(
            (r.task_table.as_str(), r.alert_topic_arn.as_str(), r.shards),
            ("v-TaskTableName", "v-AlertTopicArn", 4)
        );
        assert_eq!(r.reply_queue_arn_pattern, None, "no allow-list output: no reply queue is allowed");
        o.insert("ReplyQueueArnPattern".into(), "arn:aws:sqs:us-east-1:123456789012:st-reply-*".into());
        let r = Resources::from_outputs(&o).unwrap();
        assert_eq!(r.reply_queue_arn_pattern.as_deref(), Some("arn:aws:sqs:us-east-1:123456789012:st-reply-*"));
        o.insert("ReplyQueueArnPattern".into(), "arn:aws:sns:us-east-1:123456789012:x".into());
        assert!(
            matches!(Resources::from_outputs(&o), Err(ConfigError::Invalid { name: "REPLY_QUEUE_ARN_PATTERN", .. })),
            "an allow-list that is not an SQS ARN pattern is a setup error"
        );
        o.remove("ReplyQueueArnPattern");
        assert_eq!(r.ends_queue_url, None, "no ends queue output: ends go to the scheduler queue");
        o.insert("EndsQueueUrl".into(), "http://localhost:4566/000000000000/st-EndsQueue-x.fifo".into());
        let r = Resources::from_outputs(&o).unwrap();
        assert_eq!(r.ends_queue_url.as_deref(), Some("http://localhost:4566/000000000000/st-EndsQueue-x.fifo"));
        o.insert("EndsQueueUrl".into(), "http://localhost:4566/000000000000/st-EndsQueue-x".into());
        assert!(
            matches!(Resources::from_outputs(&o), Err(ConfigError::Invalid { name: "ENDS_QUEUE_URL", .. })),
            "a standard queue would let one parent's ends race again (and refuse their group ids)"
        );
        o.remove("EndsQueueUrl");
        o.insert("SupervisorShards".into(), "0".into());
        assert!(matches!(Resources::from_outputs(&o), Err(ConfigError::Invalid { .. })));
        o.remove("AgentQueueUrl");
        assert_eq!(Resources::from_outputs(&o), Err(ConfigError::Missing("AgentQueueUrl")));
    }

    /// `key: value` of the template parameter `name` (its block: the lines indented under it).
    fn template_parameter(template: &str, name: &str, key: &str) -> Option<String> {
        let mut lines = template.lines().skip_while(|l| l.trim_end() != "Parameters:").skip(1);
        let header = format!("  {name}:");
        lines.find(|l| l.trim_end() == header)?;
        lines
            .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
            .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
            .map(|v| v.split(" #").next().unwrap_or_default().trim().to_owned())
    }

    #[test]
    fn the_template_allows_exactly_the_shards_the_code_accepts() {
        let template = include_str!("../../../template.yaml");
        let bound = |key| {
            template_parameter(template, "SupervisorShards", key)
                .unwrap_or_else(|| panic!("template.yaml: SupervisorShards has no {key}"))
                .parse::<u32>()
                .unwrap_or_else(|e| panic!("template.yaml: SupervisorShards {key}: {e}"))
        };
        assert_eq!(
            (bound("MinValue"), bound("MaxValue")),
            (MIN_SHARDS, MAX_SHARDS),
            "template.yaml's SupervisorShards range must be the code's (config::MIN_SHARDS..=MAX_SHARDS)"
        );
        let default = bound("Default");
        assert!((MIN_SHARDS..=MAX_SHARDS).contains(&default), "the default {default} must start");
        let with = |n: u32| {
            let mut o: HashMap<String, String> = [
                "TaskTableName",
                "SubmissionQueueUrl",
                "SubmissionDlqUrl",
                "SchedulerQueueUrl",
                "AgentQueueUrl",
                "SupervisorQueueUrl",
                "AlertTopicArn",
            ]
            .iter()
            .map(|k| ((*k).to_owned(), "v".to_owned()))
            .collect();
            o.insert("SupervisorShards".into(), n.to_string());
            Resources::from_outputs(&o).map(|r| r.shards)
        };
        assert_eq!(with(MAX_SHARDS), Ok(MAX_SHARDS));
        assert_eq!(with(MIN_SHARDS), Ok(MIN_SHARDS));
        assert!(with(MAX_SHARDS + 1).is_err() && with(MIN_SHARDS - 1).is_err());
    }

    #[test]
    fn send_linger_is_milliseconds_within_bounds() {
        assert_eq!(parse_send_linger("0"), Ok(0));
        assert_eq!(parse_send_linger(" 20 "), Ok(20));
        assert_eq!(parse_send_linger("1000"), Ok(1000));
        for bad in ["1001", "-1", "20ms", ""] {
            let e = parse_send_linger(bad).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { name: "SEND_LINGER_MS", value, .. } if value == bad),
                "{bad:?}: {e:?}"
            );
        }
        assert_eq!(Settings::default().send_linger_ms, 20);
    }
}
