//! The approval agent: a person answers a callback step. The agent publishes the step's token to
//! an SNS topic (on AWS, an email subscription) with the task, the step, its input and the exact
//! ways to answer (`sasctl approve|reject TOKEN`, the HTTPS endpoint); the person's answer comes
//! back through the callback desk like any worker's. The publish is the hand-off: once SNS took
//! it, the agent reports nothing and the step waits for the answer (or its timeout).
//!
//! An approval is always a callback step: a request without a token fails permanently (the
//! workflow is wrong, retrying cannot help).

use std::fmt::Write as _;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::info;

use super::handover::CallbackEndpoints;
use super::kind::AgentConfigError;
use super::kind::{AgentKind, AwsConfigCell, BuildContext, Grant, LazyClient};
use super::runtime::{Agent, AgentError, Call};
use crate::messages::AgentRequest;

/// The most of the step's input the message shows (an SNS message holds 256 KiB; an email should
/// stay readable).
pub const MAX_INPUT_SHOWN: usize = 16 * 1024;

/// `{"kind": "approval", "topic_arn": "arn:aws:sns:..."}`: callback steps only.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalKind {
    /// Where the request (with the token) is published.
    pub topic_arn: String,
}

impl AgentKind for ApprovalKind {
    const KIND: &'static str = "approval";
    const CALLBACK_ONLY: bool = true;

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        if !self.topic_arn.starts_with("arn:") {
            return Err(AgentConfigError::BadTopic { agent: name.to_owned(), arn: self.topic_arn });
        }
        let mut agent = ApprovalAgent::new(self.topic_arn, cx.callback.clone());
        agent.sns = LazyClient::new(cx.aws.clone(), crate::aws::sns_client);
        Ok(Arc::new(agent))
    }

    fn grants(&self) -> Vec<Grant> {
        vec![Grant::new("sns:Publish", self.topic_arn.clone(), "AgentTopicArns").or_stack("APPROVAL_TOPIC_ARN")]
    }
}

#[derive(Debug)]
pub struct ApprovalAgent {
    topic_arn: String,
    callback: CallbackEndpoints,
    /// Built on the first call, from the function's configuration (its endpoint, region and
    /// timeouts from the environment).
    sns: LazyClient<aws_sdk_sns::Client>,
}

/// What the agent publishes: a subject and a plain-text body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNote {
    pub subject: String,
    pub message: String,
}

impl ApprovalAgent {
    pub fn new(topic_arn: impl Into<String>, callback: CallbackEndpoints) -> Self {
        ApprovalAgent {
            topic_arn: topic_arn.into(),
            callback,
            sns: LazyClient::new(AwsConfigCell::default(), crate::aws::sns_client),
        }
    }

    /// With a client of the caller's (tests, tools).
    pub fn with_client(topic_arn: impl Into<String>, callback: CallbackEndpoints, sns: aws_sdk_sns::Client) -> Self {
        ApprovalAgent { topic_arn: topic_arn.into(), callback, sns: LazyClient::given(sns, crate::aws::sns_client) }
    }

    pub fn topic_arn(&self) -> &str {
        &self.topic_arn
    }
}

/// A shell argument in single quotes (the token and step names need none, but a reader may paste
/// the line as it is).
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The note for one request; refused (permanently) when the request is not a callback step's.
pub fn note(req: &AgentRequest, callback: &CallbackEndpoints) -> Result<ApprovalNote, AgentError> {
    let Some(cb) = &req.callback else {
        return Err(AgentError::Permanent {
            message: format!(
                "step {} uses an approval agent but is not a callback step: an approval is answered later by a \
                 person, so the step needs kind \"callback\" (with timeout_ms) in its workflow",
                req.step
            ),
        });
    };
    let token = cb.token.expose();
    let mut subject = format!("[sas] approval needed: {} ({})", req.task_id, req.step);
    subject.retain(|c| c.is_ascii() && !c.is_ascii_control());
    subject.truncate(100);
    let input = serde_json::to_string_pretty(&req.input).unwrap_or_else(|_| req.input.to_string());
    let shown = crate::ids::clip(&input, MAX_INPUT_SHOWN);
    let mut m = String::new();
    let _ = writeln!(m, "Task {} waits for your approval at step {}.", req.task_id, req.step);
    let _ = writeln!(m, "Answer by {} (epoch ms); without an answer the step times out.", req.complete_by);
    let _ = writeln!(m, "\nInput:\n{shown}");
    if shown.len() < input.len() {
        let _ = writeln!(m, "(input cut at {MAX_INPUT_SHOWN} of {} bytes)", input.len());
    }
    let _ = writeln!(m, "\nTo approve:\n  sasctl approve {token} --comment 'why'");
    let _ = writeln!(m, "To reject:\n  sasctl reject {token} --reason 'why'");
    if callback.url.is_some() || callback.queue_url.is_some() {
        // The same answers through the channels a person (or their tooling) may use instead of
        // sasctl; without a function URL the queue is the only one, so the JSON is shown either way.
        let approve = json!({"v": 1, "token": token, "status": "succeeded", "output": {"approved": true}});
        let reject = json!({"v": 1, "token": token, "status": "failed", "error": "rejected: why", "retryable": false});
        let _ = writeln!(m, "\nOr send one of these answers (JSON):");
        let _ = writeln!(m, "  approve: {approve}\n  reject:  {reject}");
        if let Some(url) = &callback.url {
            let _ = writeln!(m, "POSTed (signed with AWS SigV4, service lambda) to {url},");
            let _ = writeln!(m, "  e.g. curl --aws-sigv4 aws:amz:REGION:lambda --user KEY:SECRET -H 'content-type: application/json' -d {} {}", quoted(&approve.to_string()), quoted(url));
        }
        if let Some(q) = &callback.queue_url {
            let _ = writeln!(m, "or as a message to the callback queue {q}.");
        }
    }
    let _ = writeln!(m, "\nThe token above is a secret: whoever holds it can answer this step.");
    Ok(ApprovalNote { subject, message: m })
}

impl Agent for ApprovalAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move {
            let req = call.request;
            let note = note(req, &self.callback)?;
            let sent = self
                .sns
                .get()
                .await
                .publish()
                .topic_arn(&self.topic_arn)
                .subject(note.subject)
                .message(note.message)
                .send()
                .await;
            match sent {
                Ok(out) => {
                    let id = out.message_id().unwrap_or_default();
                    info!(task_id = %req.task_id, step = %req.step, message_id = id, "approval request published");
                    Ok(json!({"published": true, "message_id": id}))
                }
                Err(e) => Err(super::aws_error::classify(&format!("publishing to {}", self.topic_arn), &e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AttemptToken, Millis, TaskId};

    fn req(callback: bool) -> AgentRequest {
        let task_id = TaskId::try_from("order-9").unwrap();
        let attempt = AttemptToken::from("0123456789abcdef0123456789abcdef");
        let r = AgentRequest::first_attempt(
            task_id,
            "approve",
            "approval",
            json!({"order": "o-9", "amount": 1250}),
            Millis(86_400_000),
        )
        .with_attempt(attempt);
        if callback {
            r.with_callback(None)
        } else {
            r
        }
    }

    #[test]
    fn an_approval_without_a_callback_is_refused_for_good() {
        let e = note(&req(false), &CallbackEndpoints::default()).unwrap_err();
        assert!(matches!(&e, AgentError::Permanent { message } if message.contains("not a callback step")), "{e:?}");
    }

    #[test]
    fn the_note_carries_the_token_the_task_the_input_and_how_to_answer() {
        let ends = CallbackEndpoints {
            queue_url: Some("http://q/000000000000/cb".into()),
            url: Some("https://abc.lambda-url.us-east-1.on.aws/".into()),
        };
        let r = req(true);
        let token = r.callback.as_ref().unwrap().token.expose();
        let n = note(&r, &ends).unwrap();
        assert_eq!(n.subject, "[sas] approval needed: order-9 (approve)");
        let m = &n.message;
        assert!(m.contains("Task order-9 waits for your approval at step approve."), "{m}");
        assert!(m.contains(&format!("sasctl approve {token} --comment")), "{m}");
        assert!(m.contains(&format!("sasctl reject {token} --reason")), "{m}");
        assert!(m.contains("\"amount\": 1250"), "{m}");
        assert!(m.contains("to https://abc.lambda-url.us-east-1.on.aws/"), "{m}");
        assert!(m.contains("callback queue http://q/000000000000/cb"), "{m}");
        assert!(
            m.contains(&format!(r#"{{"output":{{"approved":true}},"status":"succeeded","token":"{token}","v":1}}"#)),
            "{m}"
        );
        // without endpoints configured, sasctl is the way to answer
        let m = note(&r, &CallbackEndpoints::default()).unwrap().message;
        assert!(!m.contains("POST") && !m.contains("callback queue") && m.contains("sasctl approve"), "{m}");
        // with the queue only (a stack without its function URL), the answers to send are shown
        let queue_only = CallbackEndpoints { queue_url: Some("http://q/000000000000/cb".into()), url: None };
        let m = note(&r, &queue_only).unwrap().message;
        assert!(!m.contains("POST") && m.contains("callback queue http://q/000000000000/cb"), "{m}");
        assert!(
            m.contains(&format!(
                r#"approve: {{"output":{{"approved":true}},"status":"succeeded","token":"{token}","v":1}}"#
            )),
            "{m}"
        );
    }

    #[test]
    fn a_huge_input_is_cut() {
        let mut r = req(true);
        r.input = json!({"blob": "x".repeat(100_000)});
        let m = note(&r, &CallbackEndpoints::default()).unwrap().message;
        assert!(m.len() < MAX_INPUT_SHOWN + 4_096, "{}", m.len());
        assert!(m.contains("(input cut at 16384 of"), "{m}");
    }

    #[tokio::test]
    async fn a_request_without_a_callback_fails_before_any_call() {
        // no client is ever built: the refusal comes first
        let rt = {
            let mut rt = crate::agent::AgentRuntime::new(crate::agent::CallRetry::default());
            rt.register(
                "approval",
                ApprovalAgent::new("arn:aws:sns:us-east-1:000000000000:t", CallbackEndpoints::default()),
            );
            rt
        };
        let mut r = req(false);
        r.complete_by = Millis::now().plus_ms(5_000);
        let out = rt.run(&r).await.unwrap();
        assert!(
            matches!(out.outcome, crate::messages::Outcome::Failed { retryable: false, ref error } if error.contains("not a callback step")),
            "{out:?}"
        );
    }
}
