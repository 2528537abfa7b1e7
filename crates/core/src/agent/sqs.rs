//! The SQS agent: a callback step's request (with its token) becomes a message on a queue of the
//! user's, which their workers read; they answer with the token through the callback queue or
//! URL. `{"kind": "sqs", "queue_url": "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"}`.
//!
//! The body is the request contract ([`super::handover::request`]); the message attributes
//! `task_id` and `step` let a consumer route without parsing it. A FIFO queue (its URL ends in
//! `.fifo`) gets the task as its message group and the attempt as its deduplication id
//! ([`super::deliver::dedup_id`]), so a call retried within one attempt is delivered once.

use std::sync::Arc;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeNameForSends, MessageSystemAttributeValue};
use futures::future::BoxFuture;
use serde::Deserialize;

use super::deliver::{self, Delivering, Destination};
use super::handover::CallbackEndpoints;
use super::kind::AgentConfigError;
use super::kind::{AgentKind, AwsConfigCell, BuildContext, Grant, LazyClient};
use super::runtime::{Agent, AgentError};
use crate::messages::{AgentRequest, QueueUrl};

/// `{"kind": "sqs", "queue_url": "..."}`: callback steps (call steps with `"payload": "input"`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqsKind {
    /// Where the request (with the token) is sent.
    pub queue_url: String,
    /// What is sent: `request` (the default: the request with the token, for a callback step) or
    /// `input` (the step's input alone, for a call step: sent, and not waited for).
    #[serde(default)]
    pub payload: super::handover::Payload,
}

impl AgentKind for SqsKind {
    const KIND: &'static str = "sqs";
    const CALLBACK_ONLY: bool = true;

    fn serves_callbacks_only(&self) -> bool {
        self.payload == super::handover::Payload::Request
    }

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        let queue = QueueUrl::parse(&self.queue_url).map_err(|e| AgentConfigError::Invalid {
            agent: name.to_owned(),
            message: format!("queue_url {:?} is not an SQS queue URL: {}", self.queue_url, e.why),
        })?;
        let sqs = LazyClient::new(cx.aws.clone(), crate::aws::sqs_client);
        Ok(Arc::new(Delivering::to(SqsQueue { queue, sqs }, cx.callback.clone()).sending(self.payload)))
    }

    fn grants(&self) -> Vec<Grant> {
        vec![Grant::new("sqs:SendMessage", queue_resource(&self.queue_url), "AgentQueueArns")]
    }
}

/// The queue's ARN from its URL: one whose host names its region
/// (`https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`, the legacy `REGION.queue.amazonaws.com`,
/// LocalStack's `sqs.REGION.localhost.localstack.cloud` and path-style `/queue/REGION/ACCOUNT/NAME`)
/// gives `arn:PARTITION:sqs:REGION:ACCOUNT:NAME`. A URL that names no region (LocalStack's
/// `http://localhost:4566/ACCOUNT/NAME`) gives the queue's name alone: the grant is then matched
/// by name. A URL that is not a queue's (refused when the agent is built) is given as it is.
pub fn queue_resource(url: &str) -> String {
    match QueueUrl::parse(url) {
        Ok(q) => match q.region() {
            Some(region) => {
                format!("arn:{}:sqs:{region}:{}:{}", crate::aws_calls::partition(region), q.account(), q.name())
            }
            None => q.name().to_owned(),
        },
        Err(_) => url.to_owned(),
    }
}

/// An SQS queue of the user's, as a [`deliver::Destination`].
#[derive(Debug)]
pub struct SqsQueue {
    queue: QueueUrl,
    sqs: LazyClient<aws_sdk_sqs::Client>,
}

/// The SQS agent: the delivering skeleton around a queue.
pub type SqsAgent = Delivering<SqsQueue>;

impl Delivering<SqsQueue> {
    pub fn new(queue: QueueUrl, callback: CallbackEndpoints) -> Self {
        Delivering::to(
            SqsQueue { queue, sqs: LazyClient::new(AwsConfigCell::default(), crate::aws::sqs_client) },
            callback,
        )
    }

    /// With a client of the caller's (tests, tools).
    pub fn with_client(queue: QueueUrl, callback: CallbackEndpoints, sqs: aws_sdk_sqs::Client) -> Self {
        Delivering::to(SqsQueue { queue, sqs: LazyClient::given(sqs, crate::aws::sqs_client) }, callback)
    }
}

impl Destination for SqsQueue {
    const KIND: &'static str = SqsKind::KIND;
    const WHAT: &'static str = "an SQS message";
    const ID: &'static str = "message_id";

    fn name(&self) -> &str {
        self.queue.as_str()
    }

    fn size(&self, req: &AgentRequest, body: &str) -> usize {
        deliver::message_size(body, &deliver::attributes(req))
    }

    fn send<'a>(&'a self, req: &'a AgentRequest, body: String) -> BoxFuture<'a, Result<String, AgentError>> {
        Box::pin(async move {
            let mut send = self.sqs.get().await.send_message().queue_url(self.queue.as_str()).message_body(body);
            for (k, v) in deliver::attributes(req) {
                let attr = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(v)
                    .build()
                    .map_err(|e| AgentError::Permanent { message: format!("message attribute {k}: {e}") })?;
                send = send.message_attributes(k, attr);
            }
            if self.queue.is_fifo() {
                send = send.message_group_id(deliver::group_id(req)).message_deduplication_id(deliver::dedup_id(req));
            }
            // The task's trace goes on with the message (crate::trace).
            if let Some(h) = crate::trace::current() {
                let header = MessageSystemAttributeValue::builder()
                    .data_type("String")
                    .string_value(h)
                    .build()
                    .map_err(|e| AgentError::Permanent { message: format!("AWSTraceHeader: {e}") })?;
                send = send.message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, header);
            }
            let out = send
                .send()
                .await
                .map_err(|e| super::aws_error::classify(&format!("sending to {}", self.queue.as_str()), &e))?;
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
    use crate::ids::Millis;
    use crate::messages::Outcome;

    #[test]
    fn the_grant_names_the_queue_arn_from_its_url() {
        let r = |u: &str| queue_resource(u);
        assert_eq!(
            r("https://sqs.eu-west-1.amazonaws.com/123456789012/work"),
            "arn:aws:sqs:eu-west-1:123456789012:work"
        );
        assert_eq!(
            r("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/w.fifo"),
            "arn:aws-cn:sqs:cn-north-1:123456789012:w.fifo"
        );
        assert_eq!(
            r("https://us-east-2.queue.amazonaws.com/123456789012/work"),
            "arn:aws:sqs:us-east-2:123456789012:work"
        );
        assert_eq!(
            r("http://sqs.us-east-1.localhost.localstack.cloud:4566/000000000000/work"),
            "arn:aws:sqs:us-east-1:000000000000:work"
        );
        assert_eq!(
            r("http://localhost:4566/queue/us-east-1/000000000000/work"),
            "arn:aws:sqs:us-east-1:000000000000:work"
        );
        // no region in the URL: the name
        assert_eq!(r("http://localhost:4566/000000000000/work"), "work");
        let kind = SqsKind {
            queue_url: "https://sqs.eu-west-1.amazonaws.com/123456789012/work".into(),
            payload: super::super::handover::Payload::Request,
        };
        assert_eq!(
            kind.grants(),
            vec![Grant::new("sqs:SendMessage", "arn:aws:sqs:eu-west-1:123456789012:work", "AgentQueueArns")]
        );
    }

    #[test]
    fn a_queue_url_that_is_not_http_is_refused_naming_the_agent() {
        for url in ["sqs://queue", "work", "", "https://example.com/", "http://localhost:4566/0/q"] {
            let config = format!(r#"{{"agents": {{"w": {{"kind": "sqs", "queue_url": "{url}"}}}}}}"#);
            let e = AgentRuntime::from_config(&config, &|_| None).unwrap_err();
            assert!(
                matches!(&e, AgentConfigError::Invalid { agent, message } if agent == "w" && message.contains("queue_url")),
                "{url}: {e:?}"
            );
        }
        let extra = r#"{"agents": {"w": {"kind": "sqs", "queue_url": "http://localhost:4566/0/q", "topic_arn": "x"}}}"#;
        assert!(matches!(AgentRuntime::from_config(extra, &|_| None), Err(AgentConfigError::Json(_))));
        let ok = r#"{"agents": {"w": {"kind": "sqs", "queue_url": "${Q}"}}}"#;
        let rt = AgentRuntime::from_config(ok, &|_| Some("http://localhost:4566/000000000000/w".into())).unwrap();
        assert!(rt.knows("w"));
        let s = crate::agent::survey(ok, &|_| Some("http://localhost:4566/000000000000/w".into())).unwrap();
        assert_eq!((s[0].kind, s[0].callback_only), ("sqs", true));
        assert_eq!(s[0].grants, vec![Grant::new("sqs:SendMessage", "w", "AgentQueueArns")]);
        // sending the input alone, it serves call steps (a notification)
        let note = r#"{"agents": {"w": {"kind": "sqs", "queue_url": "${Q}", "payload": "input"}}}"#;
        let s = crate::agent::survey(note, &|_| Some("http://localhost:4566/000000000000/w".into())).unwrap();
        assert_eq!((s[0].kind, s[0].callback_only), ("sqs", false));
    }

    fn runtime() -> AgentRuntime {
        // no client is ever built: the refusals come before any call
        let mut rt = AgentRuntime::new(crate::agent::CallRetry::default());
        let queue = QueueUrl::parse("http://localhost:1/000000000000/q.fifo").unwrap();
        rt.register("warehouse", SqsAgent::new(queue, CallbackEndpoints::default()));
        rt
    }

    #[tokio::test]
    async fn a_call_step_fails_for_good_before_any_call() {
        let out = runtime().run(&req("order-1", "0123456789abcdef0123456789abcdef", false)).await.unwrap();
        assert!(
            matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("not a callback step")),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn a_request_over_256_kib_fails_for_good_naming_its_size() {
        let mut r = req("order-1", "0123456789abcdef0123456789abcdef", true);
        r.input = json!({"blob": "x".repeat(300_000)});
        r.complete_by = Millis::now().plus_ms(5_000);
        let out = runtime().run(&r).await.unwrap();
        assert!(
            matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("bytes as an SQS message, over the limit of 262144")),
            "{out:?}"
        );
    }
}
