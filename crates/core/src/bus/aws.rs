//! The AWS implementation of [`Bus`]: SQS for queues, SNS for the alert topic.

use std::time::Duration;

use aws_sdk_sns::types::MessageAttributeValue as SnsAttr;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::BatchResultErrorEntry;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::types::{MessageSystemAttributeNameForSends, MessageSystemAttributeValue};
use futures::future::BoxFuture;

use super::{batch_outcome, Bus, BusError, Outgoing, Publication, Received, MAX_BATCH};

#[derive(Debug, Clone)]
pub struct AwsBus {
    sqs: aws_sdk_sqs::Client,
    sns: aws_sdk_sns::Client,
}

/// The error codes SQS gives for a queue that does not exist (the JSON protocol's, and the query
/// protocol's that it still sends for compatibility).
fn is_no_such_queue_code(code: &str) -> bool {
    matches!(code, "QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue")
}

/// The error codes (JSON and query protocol spellings, and those of batch entries) with which
/// SQS refuses a send for good: the same request can never succeed. Throttling (`RequestThrottled`,
/// `KMS.ThrottlingException`) and server errors are not among them.
fn is_refusal_code(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied"
            | "AccessDeniedException"
            | "KMS.AccessDeniedException"
            | "KMS.DisabledException"
            | "KMS.InvalidKeyUsageException"
            | "KMS.InvalidStateException"
            | "KMS.NotFoundException"
            | "KMS.OptInRequired"
            | "KmsAccessDenied"
            | "KmsDisabled"
            | "KmsInvalidKeyUsage"
            | "KmsInvalidState"
            | "KmsNotFound"
            | "KmsOptInRequired"
            | "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidAddress"
            | "InvalidSecurity"
            | "InvalidMessageContents"
            | "MissingParameter"
            | "UnsupportedOperation"
            | "ValidationException"
    )
}

fn sqs_error(op: &'static str, queue: &str, e: aws_sdk_sqs::Error) -> BusError {
    if matches!(e, aws_sdk_sqs::Error::QueueDoesNotExist(_)) || e.code().is_some_and(is_no_such_queue_code) {
        return BusError::NoSuchQueue { queue: queue.to_owned() };
    }
    if let Some(code) = e.code().filter(|c| is_refusal_code(c)) {
        return BusError::Refused {
            op,
            target: queue.to_owned(),
            code: code.to_owned(),
            message: e.message().unwrap_or_default().to_owned(),
        };
    }
    BusError::Backend {
        op,
        target: queue.to_owned(),
        message: aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
        source: Some(Box::new(e)),
    }
}

fn sqs_attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder().data_type("String").string_value(v).build().expect("type is set")
}

/// The `AWSTraceHeader` system attribute's value.
fn trace_attr(header: &str) -> MessageSystemAttributeValue {
    MessageSystemAttributeValue::builder().data_type("String").string_value(header).build().expect("type is set")
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A batch entry that SQS refused, as the error a single send of it would give.
fn entry_error(queue: &str, f: &BatchResultErrorEntry) -> BusError {
    if is_no_such_queue_code(&f.code) {
        return BusError::NoSuchQueue { queue: queue.to_owned() };
    }
    if is_refusal_code(&f.code) {
        return BusError::Refused {
            op: "SendMessageBatch",
            target: queue.to_owned(),
            code: f.code.clone(),
            message: f.message.clone().unwrap_or_default(),
        };
    }
    BusError::Backend {
        op: "SendMessageBatch",
        target: queue.to_owned(),
        message: format!(
            "entry refused: {} ({}fault of the sender): {}",
            f.code,
            if f.sender_fault { "" } else { "no " },
            f.message.as_deref().unwrap_or("")
        ),
        source: None,
    }
}

/// The outcome of each entry of one SendMessageBatch request (entries' ids are their indexes).
fn entry_outcomes(
    queue: &str,
    n: usize,
    out: &aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput,
) -> Vec<Result<(), BusError>> {
    let mut results: Vec<Option<Result<(), BusError>>> = (0..n).map(|_| None).collect();
    for ok in &out.successful {
        if let Some(slot) = ok.id.parse::<usize>().ok().and_then(|i| results.get_mut(i)) {
            *slot = Some(Ok(()));
        }
    }
    for f in &out.failed {
        if let Some(slot) = f.id.parse::<usize>().ok().and_then(|i| results.get_mut(i)) {
            *slot = Some(Err(entry_error(queue, f)));
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(BusError::Backend {
                    op: "SendMessageBatch",
                    target: queue.to_owned(),
                    message: "SQS reported no outcome for the entry".into(),
                    source: None,
                })
            })
        })
        .collect()
}

impl AwsBus {
    pub fn new(sqs: aws_sdk_sqs::Client, sns: aws_sdk_sns::Client) -> Self {
        AwsBus { sqs, sns }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig) -> Self {
        Self::new(crate::aws::sqs_client(sdk), crate::aws::sns_client(sdk))
    }

    async fn send_one(&self, queue: &str, msg: Outgoing) -> Result<(), BusError> {
        let mut req = self.sqs.send_message().queue_url(queue).message_body(msg.body);
        if let Some(f) = msg.fifo {
            req = req.message_group_id(f.group).message_deduplication_id(f.dedup);
        } else if msg.delay_seconds > 0 {
            req = req.delay_seconds(to_i32(msg.delay_seconds));
        }
        for (k, v) in &msg.attributes {
            req = req.message_attributes(k, sqs_attr(v));
        }
        if let Some(h) = &msg.trace_header {
            req = req.message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, trace_attr(h));
        }
        req.send().await.map_err(|e| sqs_error("SendMessage", queue, e.into()))?;
        Ok(())
    }

    async fn send_many(&self, queue: &str, msgs: Vec<Outgoing>) -> Vec<Result<(), BusError>> {
        let mut results = Vec::with_capacity(msgs.len());
        for chunk in msgs.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let mut e = SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(m.body.clone());
                    if let Some(f) = &m.fifo {
                        e = e.message_group_id(&f.group).message_deduplication_id(&f.dedup);
                    } else {
                        e = e.delay_seconds(to_i32(m.delay_seconds));
                    }
                    for (k, v) in &m.attributes {
                        e = e.message_attributes(k, sqs_attr(v));
                    }
                    if let Some(h) = &m.trace_header {
                        e = e.message_system_attributes(
                            MessageSystemAttributeNameForSends::AwsTraceHeader,
                            trace_attr(h),
                        );
                    }
                    e.build().expect("id and body are set")
                })
                .collect();
            match self.sqs.send_message_batch().queue_url(queue).set_entries(Some(entries)).send().await {
                Ok(out) => results.extend(entry_outcomes(queue, chunk.len(), &out)),
                Err(e) => {
                    let e = sqs_error("SendMessageBatch", queue, e.into());
                    results.extend((1..chunk.len()).map(|_| Err(e.duplicate())));
                    results.push(Err(e));
                }
            }
        }
        results
    }

    async fn publish_one(&self, topic: &str, note: Publication) -> Result<(), BusError> {
        let mut req = self.sns.publish().topic_arn(topic).subject(note.subject).message(note.message);
        for (k, v) in &note.attributes {
            let attr = SnsAttr::builder().data_type("String").string_value(v).build().expect("type is set");
            req = req.message_attributes(k, attr);
        }
        req.send().await.map_err(|e| {
            let e = aws_sdk_sns::Error::from(e);
            BusError::Backend {
                op: "Publish",
                target: topic.to_owned(),
                message: aws_sdk_sns::error::DisplayErrorContext(&e).to_string(),
                source: Some(Box::new(e)),
            }
        })?;
        Ok(())
    }

    async fn receive_some(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Received>, BusError> {
        let wait = wait.min(Duration::from_secs(20));
        let out = self
            .sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(i32::try_from(max.clamp(1, MAX_BATCH)).unwrap_or(10))
            .wait_time_seconds(i32::try_from(wait.as_secs()).unwrap_or(20))
            .visibility_timeout(i32::try_from(visibility.as_secs()).unwrap_or(i32::MAX))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
            .customize()
            .config_override(aws_sdk_sqs::config::Builder::default().timeout_config(long_poll_timeouts(wait)))
            .send()
            .await
            .map_err(|e| sqs_error("ReceiveMessage", queue, e.into()))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| Received {
                receive_count: m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1),
                trace_header: m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::AwsTraceHeader))
                    .cloned(),
                sent_at: m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|n| n.parse().ok())
                    .map(crate::ids::Millis),
                message_id: m.message_id.unwrap_or_default(),
                receipt: m.receipt_handle.unwrap_or_default(),
                body: m.body.unwrap_or_default(),
            })
            .collect())
    }

    async fn delete_some(&self, queue: &str, receipts: Vec<String>) -> Result<(), BusError> {
        for chunk in receipts.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .build()
                        .expect("id and receipt are set")
                })
                .collect();
            self.sqs
                .delete_message_batch()
                .queue_url(queue)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| sqs_error("DeleteMessageBatch", queue, e.into()))?;
        }
        Ok(())
    }
}

impl Bus for AwsBus {
    fn send<'a>(&'a self, queue: &'a str, msg: Outgoing) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(self.send_one(queue, msg))
    }

    fn send_batch<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move { batch_outcome(self.send_many(queue, msgs).await) })
    }

    fn send_entries<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Vec<Result<(), BusError>>> {
        Box::pin(self.send_many(queue, msgs))
    }

    fn publish<'a>(&'a self, topic: &'a str, note: Publication) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(self.publish_one(topic, note))
    }

    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<Vec<Received>, BusError>> {
        Box::pin(self.receive_some(queue, max, wait, visibility))
    }

    fn delete<'a>(&'a self, queue: &'a str, receipts: Vec<String>) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(self.delete_some(queue, receipts))
    }
}

/// How long a ReceiveMessage may take beyond its long poll's `wait` before the client gives it up.
///
/// Generous on purpose: SQS hides the messages it hands to a receive (for the visibility timeout,
/// 12 minutes on the agent queue) whether or not the answer reaches the caller. A receive cut short
/// by the client, then sent again by the SDK's retry, loses the first answer's messages until that
/// timeout ends: on a loaded LocalStack, whose answers came more than 2 s after the wait, three
/// agent requests of a burst were held back so for 12 minutes.
pub const RECEIVE_MARGIN: Duration = Duration::from_secs(30);

/// A long poll waits for messages up to `wait` by design: its attempt may take that long on top of
/// the usual time (the process's SDK timeouts are far shorter than the 20 s a poll may wait), and
/// [`RECEIVE_MARGIN`] more before its answer is given up.
fn long_poll_timeouts(wait: Duration) -> aws_config::timeout::TimeoutConfig {
    let attempt = wait + RECEIVE_MARGIN;
    aws_config::timeout::TimeoutConfig::builder()
        .operation_attempt_timeout(attempt)
        .operation_timeout(attempt * 2)
        .build()
}

#[cfg(test)]
mod tests {
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
    use aws_sdk_sqs::types::SendMessageBatchResultEntry;

    use super::*;

    fn ok(id: &str) -> SendMessageBatchResultEntry {
        SendMessageBatchResultEntry::builder().id(id).message_id("m").md5_of_message_body("x").build().unwrap()
    }

    fn failed(id: &str, code: &str) -> BatchResultErrorEntry {
        BatchResultErrorEntry::builder().id(id).code(code).sender_fault(true).message("no").build().unwrap()
    }

    #[test]
    fn each_batch_entry_gets_its_own_outcome_by_id() {
        let out = SendMessageBatchOutput::builder()
            .successful(ok("0"))
            .successful(ok("3"))
            .failed(failed("2", "InvalidParameterValue"))
            .failed(failed("1", "AWS.SimpleQueueService.NonExistentQueue"))
            .build()
            .unwrap();
        // Entry 4 is in neither list.
        let r = entry_outcomes("https://q", 5, &out);
        assert_eq!(r.len(), 5);
        assert!(r[0].is_ok() && r[3].is_ok(), "{r:?}");
        assert!(matches!(&r[1], Err(BusError::NoSuchQueue { queue }) if queue == "https://q"), "{r:?}");
        assert!(
            matches!(&r[2], Err(BusError::Refused { code, .. }) if code == "InvalidParameterValue"),
            "an entry SQS refuses for good is told apart from a failure worth a retry: {r:?}"
        );
        assert!(matches!(&r[4], Err(BusError::Backend { .. })), "{r:?}");
    }

    #[test]
    fn both_no_such_queue_codes_are_recognised() {
        assert!(is_no_such_queue_code("QueueDoesNotExist"));
        assert!(is_no_such_queue_code("AWS.SimpleQueueService.NonExistentQueue"));
        assert!(!is_no_such_queue_code("InvalidParameterValue"));
        assert!(matches!(entry_error("q", &failed("0", "QueueDoesNotExist")), BusError::NoSuchQueue { .. }));
    }

    #[test]
    fn refusals_for_good_are_told_apart_from_failures_worth_a_retry() {
        for code in [
            "AccessDenied",
            "AccessDeniedException",
            "KMS.AccessDeniedException",
            "KMS.DisabledException",
            "KMS.NotFoundException",
            "KMS.InvalidStateException",
            "InvalidParameterValue",
            "InvalidAddress",
        ] {
            let e = entry_error("q", &failed("0", code));
            assert!(matches!(&e, BusError::Refused { code: c, .. } if c == code), "{code}: {e:?}");
            assert!(e.is_permanent(), "{code}");
        }
        for code in ["RequestThrottled", "KMS.ThrottlingException", "InternalError", "ServiceUnavailable"] {
            let e = entry_error("q", &failed("0", code));
            assert!(matches!(e, BusError::Backend { .. }), "{code}: {e:?}");
            assert!(!e.is_permanent(), "{code}");
        }
        // whole requests: the SDK's error, by its code
        let denied = aws_sdk_sqs::Error::KmsAccessDenied(
            aws_sdk_sqs::types::error::KmsAccessDenied::builder()
                .meta(
                    aws_sdk_sqs::error::ErrorMetadata::builder()
                        .code("KMS.AccessDeniedException")
                        .message("no grant")
                        .build(),
                )
                .build(),
        );
        let e = sqs_error("SendMessage", "q", denied);
        assert!(
            matches!(&e, BusError::Refused { op: "SendMessage", code, message, .. } if code == "KMS.AccessDeniedException" && message == "no grant"),
            "{e:?}"
        );
    }

    /// An SQS endpoint on loopback whose first answer comes `late` after the request (carrying one
    /// message, which SQS would have hidden for its visibility timeout by then); every later
    /// request is answered at once with no message.
    async fn late_sqs(late: Duration) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut first = true;
            while let Ok((mut sock, _)) = listener.accept().await {
                let body = if std::mem::take(&mut first) {
                    r#"{"Messages":[{"MessageId":"m-1","ReceiptHandle":"r-1","Body":"late","Attributes":{"ApproximateReceiveCount":"1"}}]}"#
                } else {
                    "{}"
                };
                let delay = if body == "{}" { Duration::ZERO } else { late };
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let _ = sock.read(&mut buf).await;
                    tokio::time::sleep(delay).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body.as_bytes()).await;
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_receive_whose_answer_comes_seconds_after_its_wait_still_gets_its_messages() {
        // a loaded endpoint: the answer to a receive that waits 0 s comes 4 s later. Cut short
        // and sent again, the receive would get nothing, and the message it was handed would stay
        // hidden for its visibility timeout.
        let endpoint = late_sqs(Duration::from_secs(4)).await;
        let creds = aws_credential_types::Credentials::new("AKIDEXAMPLE", "secret", None, None, "test");
        let sdk = crate::aws::sdk_config_loader(&crate::aws::TOOL_TIMEOUTS)
            .endpoint_url(&endpoint)
            .credentials_provider(creds)
            .region(aws_config::Region::new("us-east-1"))
            .load()
            .await;
        let bus = AwsBus::from_sdk(&sdk);
        let got =
            bus.receive_some(&format!("{endpoint}/000000000000/q"), 10, Duration::ZERO, Duration::from_mins(12)).await;
        let got = got.expect("the receive answers");
        assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["late"], "the late answer's message");
    }
}
