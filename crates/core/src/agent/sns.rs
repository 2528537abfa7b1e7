//! The SNS agent: a callback step's request (with its token) is published to a topic of the
//! user's; its subscribers (queues, functions, HTTPS endpoints) do the work and answer with the
//! token through the callback queue or URL. `{"kind": "sns", "topic_arn": "arn:aws:sns:..."}`.
//!
//! The message is the request contract ([`super::handover::request`]); the message attributes
//! `task_id` and `step` are there for subscription filter policies. A FIFO topic (its ARN ends in
//! `.fifo`) gets the task as its message group and the attempt as its deduplication id, as the
//! SQS kind does.

use std::sync::Arc;

use aws_sdk_sns::types::MessageAttributeValue;
use futures::future::BoxFuture;
use serde::Deserialize;

use super::deliver::{self, Delivering, Destination};
use super::handover::CallbackEndpoints;
use super::kind::AgentConfigError;
use super::kind::{AgentKind, AwsConfigCell, BuildContext, Grant, LazyClient};
use super::runtime::{Agent, AgentError};
use crate::messages::AgentRequest;

/// `{"kind": "sns", "topic_arn": "arn:aws:sns:REGION:ACCOUNT:NAME"}`: callback steps (call steps with
/// `"payload": "input"`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnsKind {
    /// Where the request (with the token) is published.
    pub topic_arn: String,
    /// What is sent: `request` (the default: the request with the token, for a callback step) or
    /// `input` (the step's input alone, for a call step: sent, and not waited for).
    #[serde(default)]
    pub payload: super::handover::Payload,
}

/// `arn:PARTITION:sns:REGION:ACCOUNT:NAME`, every part present.
pub fn is_topic_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.split(':').collect();
    parts.len() == 6 && parts[0] == "arn" && parts[2] == "sns" && parts.iter().all(|p| !p.is_empty())
}

impl AgentKind for SnsKind {
    const KIND: &'static str = "sns";
    const CALLBACK_ONLY: bool = true;

    fn serves_callbacks_only(&self) -> bool {
        self.payload == super::handover::Payload::Request
    }

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        if !is_topic_arn(&self.topic_arn) {
            return Err(AgentConfigError::Invalid {
                agent: name.to_owned(),
                message: format!(
                    "topic_arn {:?} is not an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)",
                    self.topic_arn
                ),
            });
        }
        let sns = LazyClient::new(cx.aws.clone(), crate::aws::sns_client);
        Ok(Arc::new(Delivering::to(SnsTopic::new(self.topic_arn, sns), cx.callback.clone()).sending(self.payload)))
    }

    fn grants(&self) -> Vec<Grant> {
        vec![Grant::new("sns:Publish", self.topic_arn.clone(), "AgentTopicArns")]
    }
}

/// An SNS topic of the user's, as a [`deliver::Destination`].
#[derive(Debug)]
pub struct SnsTopic {
    topic_arn: String,
    fifo: bool,
    sns: LazyClient<aws_sdk_sns::Client>,
}

impl SnsTopic {
    fn new(topic_arn: String, sns: LazyClient<aws_sdk_sns::Client>) -> Self {
        // SNS requires the suffix in lower case.
        #[allow(clippy::case_sensitive_file_extension_comparisons)]
        let fifo = topic_arn.ends_with(".fifo");
        SnsTopic { topic_arn, fifo, sns }
    }
}

/// The SNS agent: the delivering skeleton around a topic.
pub type SnsAgent = Delivering<SnsTopic>;

impl Delivering<SnsTopic> {
    pub fn new(topic_arn: impl Into<String>, callback: CallbackEndpoints) -> Self {
        let sns = LazyClient::new(AwsConfigCell::default(), crate::aws::sns_client);
        Delivering::to(SnsTopic::new(topic_arn.into(), sns), callback)
    }

    /// With a client of the caller's (tests, tools).
    pub fn with_client(topic_arn: impl Into<String>, callback: CallbackEndpoints, sns: aws_sdk_sns::Client) -> Self {
        let sns = LazyClient::given(sns, crate::aws::sns_client);
        Delivering::to(SnsTopic::new(topic_arn.into(), sns), callback)
    }
}

impl Destination for SnsTopic {
    const KIND: &'static str = SnsKind::KIND;
    const WHAT: &'static str = "an SNS message";
    const ID: &'static str = "message_id";

    fn name(&self) -> &str {
        &self.topic_arn
    }

    fn size(&self, req: &AgentRequest, body: &str) -> usize {
        deliver::message_size(body, &deliver::attributes(req))
    }

    fn send<'a>(&'a self, req: &'a AgentRequest, body: String) -> BoxFuture<'a, Result<String, AgentError>> {
        Box::pin(async move {
            let mut publish = self.sns.get().await.publish().topic_arn(&self.topic_arn).message(body);
            for (k, v) in deliver::attributes(req) {
                let attr = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(v)
                    .build()
                    .map_err(|e| AgentError::Permanent { message: format!("message attribute {k}: {e}") })?;
                publish = publish.message_attributes(k, attr);
            }
            if self.fifo {
                publish =
                    publish.message_group_id(deliver::group_id(req)).message_deduplication_id(deliver::dedup_id(req));
            }
            // The task's trace goes on with the message (the SDK would send the invocation's).
            let published = match crate::trace::current() {
                Some(h) => {
                    publish
                        .customize()
                        .mutate_request(move |r| {
                            r.headers_mut().insert("X-Amzn-Trace-Id", h.clone());
                        })
                        .send()
                        .await
                }
                None => publish.send().await,
            };
            let out =
                published.map_err(|e| super::aws_error::classify(&format!("publishing to {}", self.topic_arn), &e))?;
            Ok(out.message_id().unwrap_or_default().to_owned())
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::agent::deliver::tests::req;
    use crate::agent::AgentRuntime;
    use crate::messages::Outcome;

    #[test]
    fn the_topic_must_be_an_sns_arn_and_is_the_grant() {
        assert!(is_topic_arn("arn:aws:sns:us-east-1:123456789012:work"));
        assert!(is_topic_arn("arn:aws-cn:sns:cn-north-1:123456789012:work.fifo"));
        for bad in [
            "work",
            "arn:aws:sqs:us-east-1:123456789012:work",
            "arn:aws:sns:us-east-1:123456789012",
            "arn:aws:sns::1:t",
        ] {
            assert!(!is_topic_arn(bad), "{bad}");
            let config = format!(r#"{{"agents": {{"p": {{"kind": "sns", "topic_arn": "{bad}"}}}}}}"#);
            let e = AgentRuntime::from_config(&config, &|_| None).unwrap_err();
            assert!(
                matches!(&e, AgentConfigError::Invalid { agent, message } if agent == "p" && message.contains("not an SNS topic ARN")),
                "{bad}: {e:?}"
            );
        }
        let ok = r#"{"agents": {"p": {"kind": "sns", "topic_arn": "arn:aws:sns:us-east-1:123456789012:work"}}}"#;
        let s = crate::agent::survey(ok, &|_| None).unwrap();
        assert_eq!((s[0].kind, s[0].callback_only), ("sns", true));
        assert_eq!(
            s[0].grants,
            vec![Grant::new("sns:Publish", "arn:aws:sns:us-east-1:123456789012:work", "AgentTopicArns")]
        );
    }

    #[tokio::test]
    async fn refusals_come_before_any_call() {
        let mut rt = AgentRuntime::new(crate::agent::CallRetry::default());
        rt.register("warehouse", SnsAgent::new("arn:aws:sns:us-east-1:000000000000:t", CallbackEndpoints::default()));
        let out = rt.run(&req("order-1", "0123456789abcdef0123456789abcdef", false)).await.unwrap();
        assert!(
            matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("not a callback step")),
            "{out:?}"
        );
        let mut big = req("order-1", "0123456789abcdef0123456789abcdef", true);
        big.input = json!({"blob": "x".repeat(270_000)});
        let out = rt.run(&big).await.unwrap();
        assert!(
            matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("bytes as an SNS message, over the limit")),
            "{out:?}"
        );
    }
}
