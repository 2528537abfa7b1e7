//! Where the stack may send a caller's status messages. `reply_to` is checked at the door against
//! the stack's allow-list: the ARN pattern IAM grants the four replying functions (Submitter,
//! Scheduler, Supervisor, Callback; template parameter `ReplyQueueArnPattern`, by default the
//! queues named `<stack>-reply-*` of the stack's account and region). None of the stack's own
//! queues (the six queues and the DLQs the functions know: all but the ends queue's) is ever a
//! reply queue, however its URL is spelled: they are compared by account and name.

use crate::config::Resources;
use crate::messages::{ArnPattern, QueueUrl, QueueUrlError};

/// Why a `reply_to` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyToError {
    #[error(transparent)]
    Url(#[from] QueueUrlError),
    #[error("reply_to names one of this stack's own queues ({name}); name a queue of your own")]
    OwnQueue { name: String },
    #[error("reply_to queue {arn} is not on this stack's allow-list: reply queues must match {pattern}")]
    NotAllowed { arn: String, pattern: String },
    #[error("this stack accepts no reply_to: it has no reply queue allow-list")]
    NoneAllowed,
}

/// Every queue of the stack: the four queues, the callback and ends queues and the DLQs the
/// functions know.
fn own_queues(res: &Resources) -> impl Iterator<Item = QueueUrl> + '_ {
    [
        Some(&res.submission_queue_url),
        Some(&res.submission_dlq_url),
        Some(&res.scheduler_queue_url),
        Some(&res.agent_queue_url),
        Some(&res.supervisor_queue_url),
        res.scheduler_dlq_url.as_ref(),
        res.agent_dlq_url.as_ref(),
        res.supervisor_dlq_url.as_ref(),
        res.callback_queue_url.as_ref(),
        res.callback_dlq_url.as_ref(),
        res.ends_queue_url.as_ref(),
    ]
    .into_iter()
    .flatten()
    .filter_map(|u| QueueUrl::parse(u).ok())
}

/// The reply queue `reply_to` names, if this stack may send to it: a valid SQS URL, none of the
/// stack's own queues, and on the allow-list.
pub fn check(res: &Resources, reply_to: &str) -> Result<QueueUrl, ReplyToError> {
    let q = QueueUrl::parse(reply_to)?;
    if own_queues(res).any(|own| own.same_queue(&q)) {
        return Err(ReplyToError::OwnQueue { name: q.name().to_owned() });
    }
    let Some(pattern) = res.reply_queue_arn_pattern.as_deref().and_then(|p| ArnPattern::parse(p).ok()) else {
        return Err(ReplyToError::NoneAllowed);
    };
    match pattern.check(&q) {
        (_, true) => Ok(q),
        (arn, false) => Err(ReplyToError::NotAllowed { arn, pattern: pattern.as_str().to_owned() }),
    }
}

/// A name for a new reply queue that the allow-list admits (`<prefix><suffix>`), when the pattern
/// names its queues by a prefix: what the demo and the tests create.
pub fn queue_name(res: &Resources, suffix: &str) -> Option<String> {
    let pattern = ArnPattern::parse(res.reply_queue_arn_pattern.as_deref()?).ok()?;
    pattern.name_prefix().map(|p| format!("{p}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources() -> Resources {
        let q = |name: &str| format!("https://sqs.eu-west-1.amazonaws.com/123456789012/st-{name}-ABC");
        Resources {
            task_table: "t".into(),
            submission_queue_url: q("SubmissionQueue"),
            submission_dlq_url: q("SubmissionDLQ"),
            scheduler_queue_url: q("SchedulerQueue"),
            agent_queue_url: q("AgentQueue"),
            supervisor_queue_url: q("SupervisorQueue"),
            alert_topic_arn: "arn:aws:sns:eu-west-1:123456789012:a".into(),
            scheduler_dlq_url: Some(q("SchedulerDLQ")),
            agent_dlq_url: Some(q("AgentDLQ")),
            supervisor_dlq_url: Some(q("SupervisorDLQ")),
            callback_queue_url: Some(q("CallbackQueue")),
            callback_dlq_url: Some(q("CallbackDLQ")),
            ends_queue_url: None,
            // wide on purpose: the stack's own queues are refused whatever the pattern allows
            reply_queue_arn_pattern: Some("arn:aws:sqs:*:123456789012:*".into()),
            shards: 1,
        }
    }

    #[test]
    fn every_own_queue_is_refused_however_it_is_spelled() {
        let res = resources();
        for q in [
            "SubmissionQueue",
            "SubmissionDLQ",
            "SchedulerQueue",
            "SchedulerDLQ",
            "AgentQueue",
            "AgentDLQ",
            "SupervisorQueue",
            "SupervisorDLQ",
            "CallbackQueue",
            "CallbackDLQ",
        ] {
            let name = format!("st-{q}-ABC");
            for spelling in [
                format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{name}"),
                format!("http://sqs.eu-west-1.amazonaws.com/123456789012/{name}"),
                format!("https://SQS.eu-west-1.AmazonAWS.com/123456789012/{name}"),
                format!("https://sqs.eu-west-1.amazonaws.com:443/123456789012/{name}"),
                format!("https://eu-west-1.queue.amazonaws.com/123456789012/{name}"),
                format!("https://sqs.us-east-1.amazonaws.com/123456789012/{name}"),
                format!("http://localhost:4566/123456789012/{name}"),
                format!("http://localhost:4566/queue/eu-west-1/123456789012/{name}"),
                format!("http://evil.example/123456789012/{name}"),
            ] {
                assert_eq!(check(&res, &spelling), Err(ReplyToError::OwnQueue { name: name.clone() }), "{spelling}");
            }
            // a trailing slash is not a queue URL at all: refused too
            let slash = format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{name}/");
            assert!(matches!(check(&res, &slash), Err(ReplyToError::Url(_))), "{slash}");
        }
        // another account's queue of the same name is not ours (the pattern then decides)
        let other = "https://sqs.eu-west-1.amazonaws.com/210987654321/st-SchedulerDLQ-ABC";
        assert!(matches!(check(&res, other), Err(ReplyToError::NotAllowed { .. })), "{other}");
        assert!(check(&res, "https://sqs.eu-west-1.amazonaws.com/123456789012/mine").is_ok());
    }

    #[test]
    fn a_queue_name_on_the_allow_list() {
        let res = Resources {
            reply_queue_arn_pattern: Some("arn:aws:sqs:eu-west-1:123456789012:st-reply-*".into()),
            ..resources()
        };
        assert_eq!(queue_name(&res, "demo1").as_deref(), Some("st-reply-demo1"));
        let u = format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{}", queue_name(&res, "x.fifo").unwrap());
        assert!(check(&res, &u).is_ok());
        assert_eq!(queue_name(&resources(), "x"), None, "a pattern that is not a prefix names no queue");
    }

    #[test]
    fn without_an_allow_list_no_reply_queue_is_accepted() {
        let res = Resources { reply_queue_arn_pattern: None, ..resources() };
        assert_eq!(
            check(&res, "https://sqs.eu-west-1.amazonaws.com/123456789012/mine"),
            Err(ReplyToError::NoneAllowed)
        );
    }

    #[test]
    fn the_refusal_names_the_queue_and_the_rule() {
        let res = Resources {
            reply_queue_arn_pattern: Some("arn:aws:sqs:eu-west-1:123456789012:st-reply-*".into()),
            ..resources()
        };
        let e = check(&res, "https://sqs.eu-west-1.amazonaws.com/123456789012/payments").unwrap_err();
        assert_eq!(
            e.to_string(),
            "reply_to queue arn:aws:sqs:eu-west-1:123456789012:payments is not on this stack's allow-list: reply \
             queues must match arn:aws:sqs:eu-west-1:123456789012:st-reply-*"
        );
    }
}
