//! `sasctl complete|fail|heartbeat|approve|reject TOKEN`: an operator (or a person approving)
//! answers a callback step by hand. The answer is a [`CallbackMessage`] applied in-process by
//! [`sas_core::callback::answer`], the same function the callback queue and the HTTPS endpoint
//! use, so it is fenced the same way.
//!
//! The token is a bearer secret: it is checked here before anything touches AWS (a malformed one
//! is refused with the reason, never echoed), and what is printed names only the task and the
//! step it belongs to.

use std::fmt::Write as _;

use sas_protocol::ids::CallbackToken;
use sas_protocol::messages::{CallbackAnswer, CallbackMessage, CallbackReply, CallbackResult, VERSION};
use serde_json::{json, Value};

/// One answer an operator gives.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The step succeeded with this output.
    Complete { output: Value },
    /// The step failed; `retryable: false` fails it for good.
    Fail { error: String, retryable: bool },
    /// Still working (optionally with progress details): extends the attempt's deadline.
    Heartbeat { details: Option<Value> },
    /// A person approved: a success with output `{"approved": true, "comment": ...}`.
    Approve { comment: Option<String> },
    /// A person rejected: a permanent failure `rejected: <reason>`.
    Reject { reason: String },
}

impl Answer {
    pub fn verb(&self) -> &'static str {
        match self {
            Answer::Complete { .. } => "complete",
            Answer::Fail { .. } => "fail",
            Answer::Heartbeat { .. } => "heartbeat",
            Answer::Approve { .. } => "approve",
            Answer::Reject { .. } => "reject",
        }
    }

    /// The wire form of this answer.
    pub fn message(&self, token: CallbackToken) -> CallbackMessage {
        let answer = match self {
            Answer::Complete { output } => CallbackAnswer::Succeeded { output: output.clone() },
            Answer::Fail { error, retryable } => CallbackAnswer::Failed { error: error.clone(), retryable: *retryable },
            Answer::Heartbeat { details } => CallbackAnswer::Heartbeat { details: details.clone() },
            Answer::Approve { comment } => {
                let mut output = json!({"approved": true});
                if let Some(c) = comment {
                    output["comment"] = Value::String(c.clone());
                }
                CallbackAnswer::Succeeded { output }
            }
            Answer::Reject { reason } => {
                CallbackAnswer::Failed { error: format!("rejected: {reason}"), retryable: false }
            }
        };
        CallbackMessage { v: VERSION, token, answer }
    }
}

/// Why an answer cannot even be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The token is not one the stack issues (its text is never repeated: it may be a secret
    /// pasted whole, or most of one).
    #[error(
        "{0}; a callback token reads <32 hex digits>:<step>:<task id>, as the step's agent handed it over (check \
         that it was copied whole)"
    )]
    BadToken(String),
    /// `--output` or `--details` is not JSON.
    #[error("{flag} is not JSON: {why}")]
    BadJson { flag: &'static str, why: String },
    #[error("{0} must not be empty")]
    Empty(&'static str),
}

/// The token as given on the command line, checked.
pub fn parse_token(s: &str) -> Result<CallbackToken, AnswerError> {
    CallbackToken::try_from(s.trim()).map_err(|e| AnswerError::BadToken(e.to_string()))
}

/// A JSON argument (`--output`, `--details`).
pub fn parse_json(flag: &'static str, s: &str) -> Result<Value, AnswerError> {
    serde_json::from_str(s).map_err(|e| AnswerError::BadJson { flag, why: e.to_string() })
}

/// A text argument that must say something (`--error`, `--reason`).
pub fn non_empty(flag: &'static str, s: &str) -> Result<String, AnswerError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(AnswerError::Empty(flag));
    }
    Ok(s.to_owned())
}

/// Whether the answer did what the operator meant: applied, a duplicate of one applied before,
/// or a heartbeat taken. Anything else (stale, late, unknown, cancelled) exits non-zero.
pub fn took(reply: &CallbackReply) -> bool {
    matches!(reply.result, CallbackResult::Applied | CallbackResult::Duplicate | CallbackResult::Alive)
}

/// What a result means, in words.
fn meaning(result: CallbackResult) -> &'static str {
    match result {
        CallbackResult::Applied => "the answer moved the task on",
        CallbackResult::Duplicate => "the same answer was applied before; nothing changed",
        CallbackResult::Alive => "the attempt is alive",
        CallbackResult::Cancelled => "the task was cancelled or has ended: the work should stop",
        CallbackResult::Stale => "the token's attempt is not the one the task waits for now; nothing changed",
        CallbackResult::Late => {
            "the success came after its attempt stopped counting: it is recorded on the task, not taken as the step's result"
        }
        CallbackResult::Unknown => {
            "no task, or no attempt of the step, was given this token (forged or mistyped, another stack, or the task \
             was deleted)"
        }
    }
}

/// One line telling what the answer did, naming the task and step (never the token):
/// `approve task t-1, step approve: applied (the answer moved the task on); task Processing; why`.
pub fn describe(answer: &Answer, token: &CallbackToken, reply: &CallbackReply) -> String {
    let result = serde_json::to_value(reply.result).ok().and_then(|v| v.as_str().map(str::to_owned));
    let mut s = format!(
        "{} task {}, step {}: {} ({})",
        answer.verb(),
        token.task_id(),
        token.unit(),
        result.as_deref().unwrap_or("?"),
        meaning(reply.result)
    );
    if let Some(state) = reply.state {
        let _ = write!(s, "; task {state}");
    }
    if let Some(by) = reply.complete_by {
        let _ = write!(s, "; next answer due by {by}");
    }
    if !reply.reason.is_empty() {
        let _ = write!(s, "; {}", reply.reason);
    }
    if reply.stop && took(reply) {
        s.push_str("; stop working on it");
    }
    s
}

/// Apply `answer` with `token` in-process, as the callback queue and the HTTPS endpoint do
/// ([`sas_core::callback::answer`]): the reply, the line that says what it did ([`describe`]) and
/// whether it was taken ([`took`]). `sasctl approve|reject|...` and `sasctl ui` answer through it.
pub async fn apply(
    deps: &sas_core::deps::Deps,
    token: &CallbackToken,
    answer: &Answer,
) -> anyhow::Result<(CallbackReply, String, bool)> {
    use anyhow::Context as _;
    let msg = answer.message(token.clone());
    let reply = sas_core::callback::answer(deps, &msg, None).await.with_context(|| {
        format!("{} task {}, step {}: the answer was not applied", answer.verb(), token.task_id(), token.unit())
    })?;
    let line = describe(answer, token, &reply);
    let ok = took(&reply);
    Ok((reply, line, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_protocol::ids::{AttemptToken, TaskId};
    use sas_protocol::state::ProcessState;

    fn token() -> CallbackToken {
        CallbackToken::new(
            &TaskId::try_from("order-7").unwrap(),
            "approve",
            &AttemptToken::from("0123456789abcdef0123456789abcdef"),
        )
    }

    #[test]
    fn approve_and_reject_are_a_success_and_a_permanent_failure() {
        let m = Answer::Approve { comment: Some("ok by me".into()) }.message(token());
        assert_eq!(m.answer, CallbackAnswer::Succeeded { output: json!({"approved": true, "comment": "ok by me"}) });
        let m = Answer::Approve { comment: None }.message(token());
        assert_eq!(m.answer, CallbackAnswer::Succeeded { output: json!({"approved": true}) });
        let m = Answer::Reject { reason: "too expensive".into() }.message(token());
        assert_eq!(m.answer, CallbackAnswer::Failed { error: "rejected: too expensive".into(), retryable: false });
        assert_eq!(m.token, token());
        let wire = serde_json::to_value(&m).unwrap();
        assert_eq!(wire["status"], "failed");
        assert_eq!(wire["token"], token().expose());
    }

    #[test]
    fn a_malformed_token_is_refused_without_repeating_it() {
        let secret = "0123456789abcdef0123456789abcdeX:ship:order-7";
        let e = parse_token(secret).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("not one this stack issues: its attempt part is not 32 lowercase hex digits"), "{text}");
        assert!(!text.contains("0123456789abcdef"), "the token is not echoed: {text}");
        assert_eq!(parse_token(&format!(" {} ", token().expose())).unwrap(), token());
        assert!(matches!(parse_json("--output", "{"), Err(AnswerError::BadJson { flag: "--output", .. })));
        assert_eq!(non_empty("--reason", "  "), Err(AnswerError::Empty("--reason")));
    }

    #[test]
    fn the_reply_reads_as_one_line_without_the_token() {
        let mut reply = CallbackReply::new(CallbackResult::Alive, Some(ProcessState::Processing), "heartbeat taken");
        reply.complete_by = Some(sas_protocol::ids::Millis(1_000));
        let line = describe(&Answer::Heartbeat { details: None }, &token(), &reply);
        assert_eq!(
            line,
            "heartbeat task order-7, step approve: alive (the attempt is alive); task Processing; next answer due by \
             1000; heartbeat taken"
        );
        assert!(took(&reply));
        for r in [CallbackResult::Stale, CallbackResult::Late, CallbackResult::Unknown, CallbackResult::Cancelled] {
            let reply = CallbackReply::new(r, None, "why");
            assert!(!took(&reply), "{r:?} exits non-zero");
            assert!(!describe(&Answer::Complete { output: json!({}) }, &token(), &reply).contains("0123456789abcdef"));
        }
    }
}
