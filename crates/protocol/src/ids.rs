//! Domain newtypes: values that cannot exist unless they are valid ("parse, don't validate").

use std::fmt;
use std::hash::Hasher as _;

use serde::{Deserialize, Serialize};

/// Epoch milliseconds. `CompleteBy`, timestamps and deadlines are all in this unit.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

impl TaskId {
    /// The id of element `element` of the map step at index `step` of task `parent`:
    /// `{parent}~{step}~{element}`. `~` is in no submitted id, so an element's id never collides
    /// with a task a caller names.
    pub fn child(parent: &TaskId, step: usize, element: u32) -> TaskId {
        TaskId(format!("{}~{step}~{element}", parent.0))
    }

    /// For a map element's id: its parent task, step index and element index.
    pub fn parent_of(&self) -> Option<(TaskId, usize, u32)> {
        let mut parts = self.0.rsplitn(3, '~');
        let element = parts.next()?.parse().ok()?;
        let step = parts.next()?.parse().ok()?;
        let parent = parts.next()?;
        Some((TaskId(parent.to_owned()), step, element))
    }

    /// Whether this is a map element's id (it has a `~`).
    pub fn is_child(&self) -> bool {
        self.0.contains('~')
    }
}

impl TryFrom<String> for TaskId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        // A map element's or a branch's id: a task id, then `~{step}~{element}` (digits); twice
        // for the element of a map that runs as a branch (`{task}~{r}~{k}~{step}~{i}`).
        if let Some((parent, rest)) = s.split_once('~') {
            let nums: Vec<&str> = rest.split('~').collect();
            let digits = |p: &&str| !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit());
            if !((nums.len() == 2 || nums.len() == 4) && nums.iter().all(digits)) {
                return Err(IdError::BadChar { what: "task_id", ch: '~' });
            }
            check_token_chars("task_id", parent, Self::MAX_LEN)?;
            return Ok(TaskId(s));
        }
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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

/// A callback step's token: what a worker (or an approver) answers with. It is the attempt's
/// fencing token plus what routes the answer to its task and unit: `{attempt}:{unit}:{task_id}`
/// (`:` appears in neither a name nor a task id). An opaque bearer secret to its holder (the
/// attempt part is 122 random bits): it is never logged and never stored outside the task.
/// A retry mints a new attempt, so a new token; the old one is then stale.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CallbackToken {
    attempt: AttemptToken,
    unit: String,
    task_id: TaskId,
}

impl CallbackToken {
    /// The longest token: 32 + 1 + 64 + 1 + 128, and two child suffixes (`~{6 digits}~{6 digits}`).
    pub const MAX_LEN: usize = 226 + 2 * 14;

    pub fn new(task_id: &TaskId, unit: &str, attempt: &AttemptToken) -> Self {
        CallbackToken { attempt: attempt.clone(), unit: unit.to_owned(), task_id: task_id.clone() }
    }

    pub fn attempt(&self) -> &AttemptToken {
        &self.attempt
    }

    /// The step or compensation the token was issued for.
    pub fn unit(&self) -> &str {
        &self.unit
    }

    pub fn task_id(&self) -> &TaskId {
        &self.task_id
    }

    /// The token as its holder sends it.
    pub fn expose(&self) -> String {
        format!("{}:{}:{}", self.attempt, self.unit, self.task_id)
    }
}

/// Never printed whole: a log line names the task and unit, not the secret.
impl fmt::Debug for CallbackToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallbackToken({}/{}, ***)", self.task_id, self.unit)
    }
}

/// The malformed-token refusal (said without echoing the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the callback token is not one this stack issues: {0}")]
pub struct BadCallbackToken(pub &'static str);

impl TryFrom<String> for CallbackToken {
    type Error = BadCallbackToken;
    fn try_from(s: String) -> Result<Self, BadCallbackToken> {
        if s.len() > Self::MAX_LEN {
            return Err(BadCallbackToken("too long"));
        }
        let mut parts = s.splitn(3, ':');
        let (Some(attempt), Some(unit), Some(task)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(BadCallbackToken("it must have three parts"));
        };
        if attempt.len() != 32 || !attempt.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return Err(BadCallbackToken("its attempt part is not 32 lowercase hex digits"));
        }
        check_name("unit", unit).map_err(|_| BadCallbackToken("its unit part is not a step name"))?;
        let task_id = TaskId::try_from(task).map_err(|_| BadCallbackToken("its task part is not a task id"))?;
        Ok(CallbackToken { attempt: AttemptToken(attempt.to_owned()), unit: unit.to_owned(), task_id })
    }
}

impl TryFrom<&str> for CallbackToken {
    type Error = BadCallbackToken;
    fn try_from(s: &str) -> Result<Self, BadCallbackToken> {
        CallbackToken::try_from(s.to_owned())
    }
}

impl From<CallbackToken> for String {
    fn from(t: CallbackToken) -> String {
        t.expose()
    }
}

/// The key an agent passes to the remote service: `{task}:{step}`, stable across every retry of
/// the same step (unlike the attempt token), so the service applies the effect once.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
/// The bytes go to `Hasher::write` alone (no length prefix, as `Hash for [u8]` would add).
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
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

/// An RFC 3339 date-time in UTC (`Z`, `T` between date and time, fractions allowed) as epoch
/// milliseconds (0 for a time before 1970); `None` for anything else.
pub(crate) fn rfc3339_millis(t: &str) -> Option<u64> {
    if !t.ends_with('Z') || (t.len() > 10 && !matches!(t.as_bytes()[10], b'T' | b't')) {
        return None;
    }
    let d = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    Some(u64::try_from(d.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
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
        let parent = TaskId::try_from("order-42").unwrap();
        let child = TaskId::child(&parent, 1, 17);
        assert_eq!(child.as_str(), "order-42~1~17");
        assert_eq!(TaskId::try_from("order-42~1~17"), Ok(child.clone()));
        assert_eq!(child.parent_of(), Some((parent.clone(), 1, 17)));
        assert!(child.is_child() && !parent.is_child());
        assert_eq!(parent.parent_of(), None);
        for bad in ["a~1", "a~1~", "a~x~1", "a~1~2~3", "~1~2", "a:b~1~2", "a~1~1234567"] {
            assert!(TaskId::try_from(bad).is_err(), "{bad}");
        }
        let long = "x".repeat(129);
        assert!(matches!(TaskId::try_from(long), Err(IdError::TooLong { len: 129, .. })));
    }

    #[test]
    fn callback_tokens_round_trip_and_refuse_what_they_did_not_issue() {
        let t = TaskId::try_from("order.1-a").unwrap();
        let a = AttemptToken::fresh();
        let tok = CallbackToken::new(&t, "ship", &a);
        let back = CallbackToken::try_from(tok.expose()).unwrap();
        assert_eq!(back, tok);
        assert_eq!((back.task_id(), back.unit(), back.attempt()), (&t, "ship", &a));
        assert!(!format!("{tok:?}").contains(a.as_str()), "the secret part is never printed");
        let json = serde_json::to_string(&tok).unwrap();
        assert_eq!(serde_json::from_str::<CallbackToken>(&json).unwrap(), tok);
        for bad in ["", "x", "abc:ship:order", &format!("{a}:ship"), &format!("{a}:sh ip:o"), &format!("{a}:ship:o:b")]
        {
            assert!(CallbackToken::try_from(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(CallbackToken::try_from(format!("{}:ship:{}", a.as_str().to_uppercase(), t)).is_err());
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

    /// The digests are stored (a task's `LastMessage` mark in DynamoDB): pinned as the hand-written
    /// FNV-1a gave them, so a change of implementation that changes a value fails here.
    #[test]
    fn fnv64_and_message_marks_keep_their_values() {
        assert_eq!(fnv64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv64("\u{e9}~1".as_bytes()), 0xf934_bec6_f2e5_cf34);
        assert_eq!(message_mark("5fea7756-0ea4-451a-a703-a558b933e274"), "937fae9804aee4b9");
        assert_eq!(message_mark("m-0"), "08dba119181b0e4d", "16 digits, leading zeros kept");
    }

    #[test]
    fn task_id_deserialization_validates() {
        let ok: Result<TaskId, _> = serde_json::from_str("\"abc\"");
        assert!(ok.is_ok());
        let bad: Result<TaskId, _> = serde_json::from_str("\"a b\"");
        assert!(bad.is_err());
    }
}
