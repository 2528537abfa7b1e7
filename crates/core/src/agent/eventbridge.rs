//! The EventBridge agent: a callback step's request (with its token) becomes an event on a bus
//! of the user's; its rules route it to whatever does the work, which answers with the token
//! through the callback queue or URL.
//! `{"kind": "eventbridge", "bus": "NAME or ARN", "source": "sas.agent", "detail_type": "..."}`.
//!
//! The event's `detail` is the request contract ([`super::handover::request`]); `source` (default
//! `sas.agent`) and `detail-type` (default the agent's name) are what rules match on.

use std::sync::Arc;

use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use futures::future::BoxFuture;
use serde::Deserialize;

use super::deliver::{Delivering, Destination};
use super::handover::CallbackEndpoints;
use super::kind::AgentConfigError;
use super::kind::{AgentKind, AwsConfigCell, BuildContext, Grant, LazyClient};
use super::runtime::{Agent, AgentError};
use crate::messages::AgentRequest;

/// The event source when the configuration names none.
pub const DEFAULT_SOURCE: &str = "sas.agent";

/// The longest event bus name EventBridge takes.
pub const MAX_BUS_NAME_LEN: usize = 256;

/// `{"kind": "eventbridge", "bus": "...", "source": "...", "detail_type": "..."}`: callback steps
/// only.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBridgeKind {
    /// The event bus: its name or ARN.
    pub bus: String,
    /// The events' `source` (default [`DEFAULT_SOURCE`]).
    #[serde(default)]
    pub source: Option<String>,
    /// The events' `detail-type` (default the agent's name).
    #[serde(default)]
    pub detail_type: Option<String>,
    /// What is sent: `request` (the default: the request with the token, for a callback step) or
    /// `input` (the step's input alone, for a call step: sent, and not waited for).
    #[serde(default)]
    pub payload: super::handover::Payload,
}

impl AgentKind for EventBridgeKind {
    const KIND: &'static str = "eventbridge";
    const CALLBACK_ONLY: bool = true;

    fn serves_callbacks_only(&self) -> bool {
        self.payload == super::handover::Payload::Request
    }

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        let invalid = |message: String| AgentConfigError::Invalid { agent: name.to_owned(), message };
        // an ARN's name part is held to the name's limit
        let bus_name = self.bus.rsplit_once(":event-bus/").map_or(self.bus.as_str(), |(_, n)| n);
        if bus_name.is_empty() || bus_name.len() > MAX_BUS_NAME_LEN {
            return Err(invalid(format!(
                "bus {:?} must be an event bus name (1 to {MAX_BUS_NAME_LEN} characters) or its ARN",
                self.bus
            )));
        }
        if self.bus.starts_with("arn:") && !self.bus.contains(":events:") {
            return Err(invalid(format!("bus {:?} is not an EventBridge event bus ARN", self.bus)));
        }
        let source = self.source.unwrap_or_else(|| DEFAULT_SOURCE.to_owned());
        if source.trim().is_empty() {
            return Err(invalid("source must not be empty".into()));
        }
        if source.starts_with("aws.") {
            return Err(invalid(format!("source {source:?}: sources starting with \"aws.\" are AWS's own")));
        }
        let detail_type = self.detail_type.unwrap_or_else(|| name.to_owned());
        if detail_type.trim().is_empty() {
            return Err(invalid("detail_type must not be empty".into()));
        }
        let events = LazyClient::new(cx.aws.clone(), crate::aws::eventbridge_client);
        Ok(Arc::new(
            Delivering::to(EventBus { bus: self.bus, source, detail_type, events }, cx.callback.clone())
                .sending(self.payload),
        ))
    }

    /// On the bus's ARN when the configuration gives one; a bare name stays the name (its ARN is
    /// `arn:aws:events:REGION:ACCOUNT:event-bus/NAME` in the function's own region and account).
    fn grants(&self) -> Vec<Grant> {
        vec![Grant::new("events:PutEvents", self.bus.clone(), "AgentEventBusArns")]
    }
}

/// An event bus of the user's (with the events' source and detail-type), as a
/// [`deliver::Destination`].
#[derive(Debug)]
pub struct EventBus {
    bus: String,
    source: String,
    detail_type: String,
    events: LazyClient<aws_sdk_eventbridge::Client>,
}

/// The EventBridge agent: the delivering skeleton around a bus.
pub type EventBridgeAgent = Delivering<EventBus>;

/// The size of an event entry as EventBridge counts it: its source, detail-type and detail.
pub fn entry_size(source: &str, detail_type: &str, detail: &str) -> usize {
    source.len() + detail_type.len() + detail.len()
}

/// An entry EventBridge refused in its 200 answer: throttled or its own failure (worth another
/// try), or anything else (for good).
pub fn entry_error(bus: &str, code: &str, message: &str) -> AgentError {
    let message = format!("putting an event on {bus}: entry refused: {code}: {message}");
    if matches!(code, "ThrottlingException" | "InternalException" | "InternalFailure") {
        AgentError::Transient { message, retry_after: None }
    } else {
        AgentError::Permanent { message }
    }
}

/// The event's id from PutEvents' answer (200 even when the entry failed): its entry's error,
/// when it has one, classified by [`entry_error`]; an answer that says neither is worth another try.
pub fn delivered<'o>(
    bus: &str,
    out: &'o aws_sdk_eventbridge::operation::put_events::PutEventsOutput,
) -> Result<&'o str, AgentError> {
    let first = out.entries().first();
    if let Some(code) = first.and_then(|e| e.error_code()) {
        return Err(entry_error(bus, code, first.and_then(|e| e.error_message()).unwrap_or_default()));
    }
    match first.and_then(|e| e.event_id()) {
        Some(id) if out.failed_entry_count() == 0 => Ok(id),
        _ => Err(AgentError::Transient {
            message: format!(
                "putting an event on {bus}: the answer names no event id ({} entries failed, none said why)",
                out.failed_entry_count()
            ),
            retry_after: None,
        }),
    }
}

impl Delivering<EventBus> {
    pub fn new(
        bus: impl Into<String>,
        source: impl Into<String>,
        detail_type: impl Into<String>,
        callback: CallbackEndpoints,
    ) -> Self {
        let events = LazyClient::new(AwsConfigCell::default(), crate::aws::eventbridge_client);
        Delivering::to(
            EventBus { bus: bus.into(), source: source.into(), detail_type: detail_type.into(), events },
            callback,
        )
    }

    /// With a client of the caller's (tests, tools).
    pub fn with_client(
        bus: impl Into<String>,
        source: impl Into<String>,
        detail_type: impl Into<String>,
        callback: CallbackEndpoints,
        events: aws_sdk_eventbridge::Client,
    ) -> Self {
        let mut agent = Self::new(bus, source, detail_type, callback);
        agent.to.events = LazyClient::given(events, crate::aws::eventbridge_client);
        agent
    }
}

impl Destination for EventBus {
    const KIND: &'static str = EventBridgeKind::KIND;
    const WHAT: &'static str = "an EventBridge event entry";
    const ID: &'static str = "event_id";

    fn name(&self) -> &str {
        &self.bus
    }

    fn size(&self, _: &AgentRequest, detail: &str) -> usize {
        entry_size(&self.source, &self.detail_type, detail)
    }

    fn send<'a>(&'a self, _: &'a AgentRequest, detail: String) -> BoxFuture<'a, Result<String, AgentError>> {
        Box::pin(async move {
            let entry = PutEventsRequestEntry::builder()
                .event_bus_name(&self.bus)
                .source(&self.source)
                .detail_type(&self.detail_type)
                .detail(detail)
                // The task's trace goes on with the event (crate::trace).
                .set_trace_header(crate::trace::current())
                .build();
            let out = self
                .events
                .get()
                .await
                .put_events()
                .entries(entry)
                .send()
                .await
                .map_err(|e| super::aws_error::classify(&format!("putting an event on {}", self.bus), &e))?;
            delivered(&self.bus, &out).map(str::to_owned)
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

    fn build(entry: &str) -> Result<AgentRuntime, AgentConfigError> {
        AgentRuntime::from_config(&format!(r#"{{"agents": {{"ev": {entry}}}}}"#), &|_| None)
    }

    #[test]
    fn the_bus_the_source_and_the_detail_type_are_checked() {
        assert!(build(r#"{"kind": "eventbridge", "bus": "orders"}"#).is_ok());
        assert!(build(r#"{"kind": "eventbridge", "bus": "arn:aws:events:us-east-1:123456789012:event-bus/orders", "source": "shop.orders", "detail_type": "ship"}"#).is_ok());
        let long = "b".repeat(257);
        for (entry, says) in [
            (r#"{"kind": "eventbridge", "bus": ""}"#.to_owned(), "bus \"\""),
            (format!(r#"{{"kind": "eventbridge", "bus": "{long}"}}"#), "1 to 256 characters"),
            (
                r#"{"kind": "eventbridge", "bus": "arn:aws:sns:us-east-1:1:event-bus/x"}"#.to_owned(),
                "not an EventBridge",
            ),
            (r#"{"kind": "eventbridge", "bus": "b", "source": ""}"#.to_owned(), "source must not be empty"),
            (r#"{"kind": "eventbridge", "bus": "b", "source": "aws.s3"}"#.to_owned(), "AWS's own"),
            (r#"{"kind": "eventbridge", "bus": "b", "detail_type": " "}"#.to_owned(), "detail_type must not be empty"),
        ] {
            let e = build(&entry).unwrap_err();
            assert!(
                matches!(&e, AgentConfigError::Invalid { agent, message } if agent == "ev" && message.contains(says)),
                "{entry}: {e:?}"
            );
        }
        assert!(matches!(build(r#"{"kind": "eventbridge"}"#), Err(AgentConfigError::Json(_))));
    }

    #[test]
    fn the_grant_is_put_events_on_the_bus() {
        let s =
            crate::agent::survey(r#"{"agents": {"ev": {"kind": "eventbridge", "bus": "orders"}}}"#, &|_| None).unwrap();
        assert_eq!((s[0].kind, s[0].callback_only), ("eventbridge", true));
        assert_eq!(s[0].grants, vec![Grant::new("events:PutEvents", "orders", "AgentEventBusArns")]);
        let arn = "arn:aws:events:us-east-1:123456789012:event-bus/orders";
        let kind = EventBridgeKind {
            bus: arn.into(),
            source: None,
            detail_type: None,
            payload: super::super::handover::Payload::Request,
        };
        assert_eq!(kind.grants(), vec![Grant::new("events:PutEvents", arn, "AgentEventBusArns")]);
    }

    #[test]
    fn refused_entries_are_classified_by_their_code() {
        for code in ["ThrottlingException", "InternalException", "InternalFailure"] {
            let e = entry_error("b", code, "later");
            assert!(matches!(&e, AgentError::Transient { message, .. } if message.contains(code)), "{e:?}");
        }
        for code in ["AccessDeniedException", "MalformedDetail", "InvalidArgument", "NotAuthorizedForSourceException"] {
            let e = entry_error("b", code, "no");
            assert!(matches!(&e, AgentError::Permanent { message } if message.contains(code)), "{e:?}");
        }
    }

    #[test]
    fn the_answer_of_put_events_is_read_entry_by_entry() {
        use aws_sdk_eventbridge::operation::put_events::PutEventsOutput;
        use aws_sdk_eventbridge::types::PutEventsResultEntry;
        let answer = |count: i32, entry: PutEventsResultEntry| {
            PutEventsOutput::builder().failed_entry_count(count).entries(entry).build()
        };
        let ok = answer(0, PutEventsResultEntry::builder().event_id("e-1").build());
        assert_eq!(delivered("b", &ok).unwrap(), "e-1");
        let failed = |code: &str| {
            answer(1, PutEventsResultEntry::builder().error_code(code).error_message("said EventBridge").build())
        };
        let e = delivered("b", &failed("ThrottlingException")).unwrap_err();
        assert!(matches!(&e, AgentError::Transient { message, .. } if message.contains("said EventBridge")), "{e:?}");
        let e = delivered("b", &failed("AccessDeniedException")).unwrap_err();
        assert!(matches!(&e, AgentError::Permanent { message } if message.contains("AccessDeniedException")), "{e:?}");
        // a failed count without an error code, or no entry at all: not delivered
        let e = delivered("b", &answer(1, PutEventsResultEntry::builder().build())).unwrap_err();
        assert!(matches!(&e, AgentError::Transient { .. }), "{e:?}");
        let e = delivered("b", &PutEventsOutput::builder().failed_entry_count(0).build()).unwrap_err();
        assert!(matches!(&e, AgentError::Transient { .. }), "{e:?}");
    }

    #[tokio::test]
    async fn refusals_come_before_any_call() {
        let mut rt = AgentRuntime::new(crate::agent::CallRetry::default());
        rt.register("warehouse", EventBridgeAgent::new("b", DEFAULT_SOURCE, "warehouse", CallbackEndpoints::default()));
        let out = rt.run(&req("order-1", "0123456789abcdef0123456789abcdef", false)).await.unwrap();
        assert!(
            matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("not a callback step")),
            "{out:?}"
        );
        let mut big = req("order-1", "0123456789abcdef0123456789abcdef", true);
        big.input = json!({"blob": "x".repeat(270_000)});
        let out = rt.run(&big).await.unwrap();
        assert!(
            matches!(&out.outcome, Outcome::Failed { retryable: false, error } if error.contains("bytes as an EventBridge event entry, over the limit")),
            "{out:?}"
        );
        assert_eq!(entry_size("sas.agent", "warehouse", "{}"), 9 + 9 + 2);
    }
}
