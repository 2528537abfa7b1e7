//! Domain newtypes: values that cannot exist unless they are valid ("parse, don't validate").

use std::fmt;

use serde::{Deserialize, Serialize};

/// Epoch milliseconds. `CompleteBy`, timestamps and deadlines are all in this unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    pub fn now() -> Self {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    #[must_use]
    pub fn plus_ms(self, ms: u64) -> Self {
        Millis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `self` until `later` (zero when `later` is not after `self`).
    pub fn until(self, later: Millis) -> u64 {
        later.0.saturating_sub(self.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{what} is empty")]
    Empty { what: &'static str },
    #[error("{what} is {len} characters; the limit is {max}")]
    TooLong { what: &'static str, len: usize, max: usize },
    #[error("{what} contains {ch:?}; allowed are letters, digits and . _ -")]
    BadChar { what: &'static str, ch: char },
}

fn check_token_chars(what: &'static str, s: &str, max: usize) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty { what });
    }
    if s.len() > max {
        return Err(IdError::TooLong { what, len: s.len(), max });
    }
    if let Some(ch) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(IdError::BadChar { what, ch });
    }
    Ok(())
}

/// A task's id (the pattern's OrderID). It is the submission's idempotency key: a second
/// submission with the same id creates nothing. `:` is excluded so that `{task}:{step}`
/// idempotency keys cannot collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskId(String);

impl TaskId {
    pub const MAX_LEN: usize = 128;

    pub fn generate() -> Self {
        TaskId(uuid::Uuid::new_v4().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TaskId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        check_token_chars("task_id", &s, Self::MAX_LEN)?;
        Ok(TaskId(s))
    }
}

impl TryFrom<&str> for TaskId {
    type Error = IdError;
    fn try_from(s: &str) -> Result<Self, IdError> {
        TaskId::try_from(s.to_owned())
    }
}

impl From<TaskId> for String {
    fn from(t: TaskId) -> String {
        t.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fencing token of one attempt: a fresh random value written to `LockedBy` by every claim.
/// Every later write about that attempt must present it; a result carrying an older token is stale.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptToken(String);

impl AttemptToken {
    pub fn fresh() -> Self {
        AttemptToken(uuid::Uuid::new_v4().simple().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for AttemptToken {
    fn from(s: &str) -> Self {
        AttemptToken(s.to_owned())
    }
}

impl fmt::Display for AttemptToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key an agent passes to the remote service: `{task}:{step}`, stable across every retry of
/// the same step (unlike the attempt token), so the service applies the effect once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn for_step(task: &TaskId, step: &str) -> Self {
        IdempotencyKey(format!("{task}:{step}"))
    }

    /// The key of a unit (a step or a compensation) in its `generation`: 0 is `{task}:{step}`; an
    /// operator's resume of a refused unit moves to `{task}:{step}#1`, and so on, because the
    /// service spent the old key on a refusal.
    pub fn for_unit(task: &TaskId, unit: &str, generation: u32) -> Self {
        if generation == 0 {
            Self::for_step(task, unit)
        } else {
            IdempotencyKey(format!("{task}:{unit}#{generation}"))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// FNV-1a, 64 bits: a stable digest for short keys (not a defence against a chosen collision).
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The mark a queue message leaves on the task it changed (`LastMessage`): 16 hex digits of its
/// SQS message id, which SQS keeps across redeliveries (and which an SQS duplicate shares).
pub fn message_mark(message_id: &str) -> String {
    format!("{:016x}", fnv64(message_id.as_bytes()))
}

/// `s` cut to at most `max` bytes, on a character boundary (for echoing caller input in reasons
/// and attributes without ever splitting a UTF-8 character).
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// A step, compensation or workflow name.
pub fn check_name(what: &'static str, s: &str) -> Result<(), IdError> {
    check_token_chars(what, s, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_id_rules() {
        assert!(TaskId::try_from("order-42").is_ok());
        assert!(TaskId::try_from("a.b_c-1").is_ok());
        assert_eq!(TaskId::try_from(""), Err(IdError::Empty { what: "task_id" }));
        assert_eq!(TaskId::try_from("a:b"), Err(IdError::BadChar { what: "task_id", ch: ':' }));
        let long = "x".repeat(129);
        assert!(matches!(TaskId::try_from(long), Err(IdError::TooLong { len: 129, .. })));
    }

    #[test]
    fn clip_never_splits_a_character() {
        let s = "заказ".repeat(300);
        for max in 0..40 {
            let c = clip(&s, max);
            assert!(c.len() <= max && s.starts_with(c));
        }
        assert_eq!(clip("abc", 10), "abc");
    }

    #[test]
    fn idempotency_key_is_task_and_step() {
        let t = TaskId::try_from("order-1").unwrap();
        assert_eq!(IdempotencyKey::for_step(&t, "charge").as_str(), "order-1:charge");
    }

    #[test]
    fn task_id_deserialization_validates() {
        let ok: Result<TaskId, _> = serde_json::from_str("\"abc\"");
        assert!(ok.is_ok());
        let bad: Result<TaskId, _> = serde_json::from_str("\"a b\"");
        assert!(bad.is_err());
    }
}
