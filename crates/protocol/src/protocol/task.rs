//! The task as the state store keeps it, and the vocabulary of its parts.
//!
//! A task runs a workflow's steps in order. While something goes wrong it may switch to undoing
//! its completed steps. Either way it is always on one **unit of work**: a forward step, or the
//! compensation of a step. [`Phase`] names which kind of unit; [`Stage`] says where the task is in
//! its plan (forward, or at position `pos` of a compensation plan). Both kinds of unit run the same
//! way (claim, attempt, retry after a backoff, give up), so the transitions handle them through one
//! [`UnitRecord`] view; only what success and giving up lead to differs.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Ctx;
use crate::ids::{AttemptToken, Millis, TaskId};
use crate::messages::{Phase, StatusMessage};
use crate::state::ProcessState;
use crate::workflow::{StepDef, WorkflowDef};

/// The state of one forward step.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Running,
    Succeeded,
    /// Failed for good with a definite answer: no effect to undo.
    Failed,
    /// The last attempt ran out of time: its effect is unknown, so it is compensated.
    TimedOut,
    /// Cancelled while running: its effect is unknown, so it is compensated.
    Cancelled,
    /// Never ran: its guard (`when`) was false, or every step it names in `after` was skipped.
    /// Nothing to undo.
    Skipped,
}

/// The state of one step's compensation.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationStatus {
    Pending,
    Running,
    Done,
    Failed,
}

use crate::messages::is_zero;

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(b: &bool) -> bool {
    !*b
}

/// A step's compensation, created when it is first claimed.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompensationRecord {
    pub name: String,
    pub status: CompensationStatus,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last attempt got a definite "no": its idempotency key was used up without an effect.
    #[serde(default, skip_serializing_if = "is_false")]
    pub refused: bool,
    /// Bumped when an operator resumes a refused unit, so the service sees a new key.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_gen: u32,
    /// A callback unit: the attempt whose answer completed it (a repeat of that answer is a
    /// duplicate, not a late result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_by: Option<AttemptToken>,
    /// A callback unit: the attempts it handed a token to (the last [`MAX_ISSUED`]), so a late
    /// answer is told from a token nobody was given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub issued: Vec<AttemptToken>,
}

/// A forward step: its progress, its output once it succeeded, and its compensation if one ran.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub name: String,
    pub status: StepStatus,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<CompensationRecord>,
    /// Some attempt of this step may have applied its effect (it timed out, failed retryably or
    /// was cancelled while running), whatever later attempts said: the step is compensated.
    #[serde(default, skip_serializing_if = "is_false")]
    pub maybe_applied: bool,
    /// The latest hard deadline (`start_by + timeout_ms`) of an attempt of this step: after it
    /// (and a settling margin) no attempt can start or apply, so its compensation may run. A call
    /// step's compensation may run sooner: one execution time after the task stops waiting for the
    /// step (agents check that their attempt is current before they call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settles_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub refused: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_gen: u32,
    /// A callback step: the attempt whose answer completed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_by: Option<AttemptToken>,
    /// A callback step: the details of the last heartbeat that extended its deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
    /// A callback step: the attempts it handed a token to (the last [`MAX_ISSUED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub issued: Vec<AttemptToken>,
    /// A map step, once started: where its elements are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapProgress>,
    /// A skipped step: why (its guard, as written, or the steps it waits for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// A set of element indexes. Stored as whichever is shorter: a hex bitmap (2,500 characters for
/// 10,000 elements), or its runs of set bits, `r{bytes}:{from}-{to},{i},...` (a map's elements end
/// nearly in order, so `ended` and `ok` are a few runs: `r1250:0-9989,9991-9999`). The parent's
/// item, rewritten at each element's end, thus stays small however long the array.
#[derive(Debug, Clone, Default)]
pub struct Bits(Vec<u8>);

/// Two bitmaps are equal when the same bits are set, whatever their lengths: a bitmap whose bits
/// were all cleared is stored as none at all (`skip_serializing_if`), and reads back empty. (With
/// the derived equality, such a task read back from the table was not the task written, and a
/// write that had landed was taken for another writer's.)
impl PartialEq for Bits {
    fn eq(&self, other: &Bits) -> bool {
        let n = self.0.len().max(other.0.len());
        (0..n).all(|i| self.0.get(i).copied().unwrap_or(0) == other.0.get(i).copied().unwrap_or(0))
    }
}

impl Eq for Bits {}

impl Bits {
    pub fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(8)])
    }

    pub fn get(&self, i: u32) -> bool {
        let i = i as usize;
        self.0.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    /// Set bit `i`; whether it was clear.
    pub fn set(&mut self, i: u32) -> bool {
        let i = i as usize;
        if i / 8 >= self.0.len() {
            self.0.resize(i / 8 + 1, 0);
        }
        let was = self.0[i / 8] & (1 << (i % 8)) == 0;
        self.0[i / 8] |= 1 << (i % 8);
        was
    }

    pub fn count(&self) -> u32 {
        self.0.iter().map(|b| b.count_ones()).sum()
    }

    /// The set indexes below `n`, in order.
    pub fn ones(&self, n: u32) -> impl Iterator<Item = u32> + '_ {
        (0..n).filter(|i| self.get(*i))
    }
}

impl Bits {
    /// The runs of set bits, `from-to` (inclusive) or `i`, comma-separated.
    fn runs(&self) -> String {
        use std::fmt::Write;
        let n = u32::try_from(self.0.len() * 8).unwrap_or(u32::MAX);
        let mut out = String::new();
        let mut i = 0;
        while i < n {
            if !self.get(i) {
                i += 1;
                continue;
            }
            let from = i;
            while i + 1 < n && self.get(i + 1) {
                i += 1;
            }
            let sep = if out.is_empty() { "" } else { "," };
            let _ = if from == i { write!(out, "{sep}{i}") } else { write!(out, "{sep}{from}-{i}") };
            i += 1;
        }
        out
    }

    fn from_runs(bytes: usize, runs: &str) -> Result<Bits, String> {
        let mut b = Bits(vec![0; bytes]);
        for run in runs.split(',').filter(|r| !r.is_empty()) {
            let (from, to) = run.split_once('-').unwrap_or((run, run));
            let (from, to): (u32, u32) =
                (from.parse().map_err(|e| format!("{run}: {e}"))?, to.parse().map_err(|e| format!("{run}: {e}"))?);
            if from > to || to as usize >= bytes * 8 {
                return Err(format!("run {run} is not within {bytes} bytes"));
            }
            for i in from..=to {
                b.set(i);
            }
        }
        Ok(b)
    }
}

/// A bitmap is a string: `r{bytes}:{runs}` or hex (see its `Serialize`).
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Bits {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Bits".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string"})
    }
}

impl Serialize for Bits {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use std::fmt::Write;
        let runs = format!("r{}:{}", self.0.len(), self.runs());
        if runs.len() < self.0.len() * 2 {
            return s.serialize_str(&runs);
        }
        let hex = self.0.iter().fold(String::with_capacity(self.0.len() * 2), |mut h, b| {
            let _ = write!(h, "{b:02x}");
            h
        });
        s.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for Bits {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if let Some((bytes, runs)) = text.strip_prefix('r').and_then(|r| r.split_once(':')) {
            let bytes: usize = bytes.parse().map_err(serde::de::Error::custom)?;
            if bytes > 1 << 16 {
                return Err(serde::de::Error::custom(format!("a bitmap of {bytes} bytes is longer than any map")));
            }
            return Bits::from_runs(bytes, runs).map_err(serde::de::Error::custom);
        }
        let hex = text;
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom("a bitmap has an even number of hex digits"));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(serde::de::Error::custom))
            .collect::<Result<Vec<u8>, _>>()
            .map(Bits)
    }
}

/// A map step's elements: each is a task of its own (`{task}~{step}~{i}`, see
/// [`TaskId::child`]); the parent keeps only which have started, ended, succeeded and been undone.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MapProgress {
    /// Elements in the array.
    pub n: u32,
    /// Elements created so far: `0..started` (at most `max_concurrency` more than have ended).
    pub started: u32,
    /// Elements that have ended (their end was counted).
    pub ended: Bits,
    /// Elements that ended `Processed`: their effect is applied.
    pub ok: Bits,
    /// Elements that failed for good (ended in any other state).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: u32,
    /// Elements that ended `Error`: their own compensation failed (an undo resumes it).
    #[serde(default, skip_serializing_if = "Bits::is_empty")]
    pub errored: Bits,
    /// Elements undone by this map's compensation.
    #[serde(default, skip_serializing_if = "Bits::is_empty")]
    pub undone: Bits,
    /// The map is stopping (too many failures, a cancel, its deadline): no element starts, the
    /// running ones are cancelled, and once all have ended the task compensates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<EndCause>,
    /// Every element ended: the outputs are being read (a join message is out).
    #[serde(default, skip_serializing_if = "is_false")]
    pub joining: bool,
    /// The map's own deadline (`map.timeout_ms` from its start): past it, it stops.
    pub deadline: Millis,
    /// A parallel region's branches (see [`crate::graph`]) rather than a map's elements: which
    /// have started (a branch starts once the steps it waits for have succeeded, so the started
    /// ones are not `0..started`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches: Option<Bits>,
    /// A parallel region's branches that were skipped (their guard was false, or every step they
    /// wait for was skipped): ended, never started, nothing to undo.
    #[serde(default, skip_serializing_if = "Bits::is_empty")]
    pub skipped: Bits,
}

impl Bits {
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }

    /// Clear bit `i`.
    pub fn clear(&mut self, i: u32) {
        let i = i as usize;
        if let Some(b) = self.0.get_mut(i / 8) {
            *b &= !(1 << (i % 8));
        }
    }
}

impl MapProgress {
    pub fn new(n: u32, deadline: Millis) -> Self {
        MapProgress {
            deadline,
            n,
            started: 0,
            ended: Bits::new(n as usize),
            ok: Bits::new(n as usize),
            failed: 0,
            errored: Bits::default(),
            undone: Bits::default(),
            stopping: None,
            joining: false,
            branches: None,
            skipped: Bits::default(),
        }
    }

    /// Whether element (or branch) `e` has started.
    pub fn began(&self, e: u32) -> bool {
        match &self.branches {
            Some(b) => b.get(e),
            None => e < self.started,
        }
    }

    /// Elements started and not yet ended.
    pub fn running(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n).filter(|i| self.began(*i) && !self.ended.get(*i))
    }

    /// Elements the map's compensation undoes: those that succeeded or could not undo themselves,
    /// not yet undone.
    pub fn to_undo(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n).filter(|e| (self.ok.get(*e) || self.errored.get(*e)) && !self.undone.get(*e))
    }
}

/// A guard reads the task's input and the outputs its steps have so far: those of the steps that
/// ended (a failure handled by `on_failure: continue` has its error as output), those a parallel
/// region's branches brought back while the region runs, and, in a branch's task, those of the
/// steps before its region.
impl crate::condition::Scope for Task {
    fn input(&self) -> &Value {
        &self.input
    }

    fn task_id(&self) -> Option<&str> {
        Some(self.task_id.as_str())
    }

    fn output(&self, step: &str) -> Option<&Value> {
        match self.steps.iter().find(|s| s.name == step) {
            Some(s) if s.status != StepStatus::Skipped && s.output.is_some() => s.output.as_ref(),
            _ => self.upstream.as_ref()?.get(step),
        }
    }

    fn var(&self, name: &str) -> Option<&Value> {
        self.vars.get(name)
    }

    fn loop_index(&self) -> Option<u64> {
        self.iteration.as_ref().map(|i| u64::from(i.index))
    }

    fn loop_previous(&self) -> Option<&Value> {
        self.iteration.as_ref()?.previous.as_ref()
    }
}

/// How many attempt tokens a callback unit remembers.
pub const MAX_ISSUED: usize = 8;

impl StepRecord {
    pub fn new(name: &str) -> Self {
        StepRecord {
            name: name.to_owned(),
            status: StepStatus::Pending,
            attempts: 0,
            failures: 0,
            output: None,
            error: None,
            compensation: None,
            maybe_applied: false,
            settles_at: None,
            refused: false,
            key_gen: 0,
            done_by: None,
            progress: None,
            issued: Vec::new(),
            map: None,
            skipped: None,
        }
    }

    /// Whether its effect may stand and must be undone when the task compensates: it succeeded,
    /// or it failed with its failure handled (`on_failure: continue`) after an attempt that may
    /// have applied.
    pub fn applied(&self) -> bool {
        self.status == StepStatus::Succeeded
            || (self.maybe_applied && matches!(self.status, StepStatus::Failed | StepStatus::TimedOut))
    }

    /// What later steps read as this step's output: a success's answer, or the error of a
    /// failure its `on_failure` handled.
    pub fn result(&self) -> Option<&Value> {
        match self.status {
            StepStatus::Succeeded | StepStatus::Failed | StepStatus::TimedOut => self.output.as_ref(),
            _ => None,
        }
    }
}

/// The bookkeeping every unit of work has, whichever its kind.
pub(crate) trait UnitRecord {
    /// A new attempt is claimed; returns its number (1 for the first).
    fn begin_attempt(&mut self) -> u32;
    /// An attempt ended without a definite answer; returns the unit's failures so far.
    fn attempt_failed(&mut self, reason: &str) -> u32;
    /// Waiting for the next attempt (after a backoff, or a resubmit).
    fn await_retry(&mut self);
    fn succeeded(&mut self);
    /// A definite "no" from the agent: counts as a failure.
    fn refused(&mut self, error: &str);
    /// No attempt is left; `timed_out` when the last one ran out of time.
    fn exhausted(&mut self, timed_out: bool);
    /// An operator resubmits: the unit starts over with a clean failure count (and a new
    /// idempotency key if its last attempt was refused: the old key is spent).
    fn reset(&mut self);
    /// A callback unit handed `token` to its remote side.
    fn issue(&mut self, token: &AttemptToken);
}

/// One definition of the bookkeeping for both kinds of record; only the status names differ.
macro_rules! unit_record {
    ($record:ty, $status:ident { pending: $p:ident, running: $r:ident, succeeded: $s:ident, failed: $f:ident, timed_out: $t:ident }) => {
        impl UnitRecord for $record {
            fn begin_attempt(&mut self) -> u32 {
                self.status = $status::$r;
                self.refused = false;
                self.attempts += 1;
                self.attempts
            }
            fn attempt_failed(&mut self, reason: &str) -> u32 {
                self.failures += 1;
                self.error = Some(reason.to_owned());
                self.failures
            }
            fn await_retry(&mut self) {
                self.status = $status::$p;
            }
            fn succeeded(&mut self) {
                self.status = $status::$s;
                self.error = None;
            }
            fn refused(&mut self, error: &str) {
                self.status = $status::$f;
                self.refused = true;
                self.failures += 1;
                self.error = Some(error.to_owned());
            }
            fn exhausted(&mut self, timed_out: bool) {
                self.status = if timed_out { $status::$t } else { $status::$f };
            }
            fn reset(&mut self) {
                self.status = $status::$p;
                self.failures = 0;
                if self.refused {
                    self.refused = false;
                    self.key_gen += 1;
                }
            }
            fn issue(&mut self, token: &AttemptToken) {
                self.issued.push(token.clone());
                if self.issued.len() > MAX_ISSUED {
                    self.issued.remove(0);
                }
            }
        }
    };
}

unit_record!(
    StepRecord,
    StepStatus { pending: Pending, running: Running, succeeded: Succeeded, failed: Failed, timed_out: TimedOut }
);
// A compensation that ran out of attempts has failed, whatever its last attempt did.
unit_record!(
    CompensationRecord,
    CompensationStatus { pending: Pending, running: Running, succeeded: Done, failed: Failed, timed_out: Failed }
);

/// A unit's record, read-only: a forward step's or a compensation's.
#[derive(Debug, Clone, Copy)]
pub enum UnitRef<'a> {
    Step(&'a StepRecord),
    Compensation(&'a CompensationRecord),
}

impl UnitRef<'_> {
    pub(crate) fn issued(&self, attempt: &AttemptToken) -> bool {
        match self {
            UnitRef::Step(s) => s.issued.contains(attempt),
            UnitRef::Compensation(c) => c.issued.contains(attempt),
        }
    }

    /// The error `attempt` answered when it failed the unit for good, if it did: the unit's last
    /// attempt was refused, and it is that one.
    pub(crate) fn refused_by(&self, attempt: &AttemptToken) -> Option<&str> {
        let (refused, issued, error) = match self {
            UnitRef::Step(s) => (s.refused, &s.issued, &s.error),
            UnitRef::Compensation(c) => (c.refused, &c.issued, &c.error),
        };
        (refused && issued.last() == Some(attempt)).then(|| error.as_deref().unwrap_or("no reason given"))
    }

    pub(crate) fn done_by(&self) -> Option<&AttemptToken> {
        match self {
            UnitRef::Step(s) => s.done_by.as_ref(),
            UnitRef::Compensation(c) => c.done_by.as_ref(),
        }
    }

    /// Whether the unit's effect is accounted for: it succeeded (by another attempt with the
    /// same idempotency key), so a late success of one of its attempts adds nothing to undo.
    pub fn accounted(&self) -> bool {
        match self {
            UnitRef::Step(s) => s.status == StepStatus::Succeeded,
            UnitRef::Compensation(c) => c.status == CompensationStatus::Done,
        }
    }
}

/// Why compensation runs, which decides the state it ends in.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    Failed,
    Cancelled,
}

impl EndCause {
    /// The terminal state once every planned compensation is done.
    pub fn end_state(self) -> ProcessState {
        match self {
            EndCause::Failed => ProcessState::Compensated,
            EndCause::Cancelled => ProcessState::Cancelled,
        }
    }
}

/// Where the task is: running its steps forward, or undoing them.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stage {
    #[default]
    Forward,
    /// `plan` lists the step indexes to undo, in the order they are undone; `pos` is the one now.
    Compensating {
        plan: Vec<usize>,
        pos: usize,
        cause: EndCause,
        /// Why the task is undone (the reason that began it): the task's reason again once every
        /// compensation is done, whatever its compensations' own attempts noted on the way (a
        /// retry, a request that waited past its start). Empty in items written before it was kept.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        why: String,
    },
}

impl Stage {
    fn is_forward(&self) -> bool {
        matches!(self, Stage::Forward)
    }

    /// The kind of unit of work this stage runs.
    pub fn phase(&self) -> Phase {
        match self {
            Stage::Forward => Phase::Forward,
            Stage::Compensating { .. } => Phase::Compensate,
        }
    }
}

/// The `ProcessState` of a task waiting for the next attempt of a unit of this kind.
pub(crate) fn waiting_state(phase: Phase) -> ProcessState {
    match phase {
        Phase::Forward => ProcessState::Pending,
        Phase::Compensate => ProcessState::Compensating,
    }
}

/// The `ProcessState` of a task whose unit of this kind is with its agent.
pub(crate) fn running_state(phase: Phase) -> ProcessState {
    match phase {
        Phase::Forward => ProcessState::Processing,
        Phase::Compensate => ProcessState::Compensating,
    }
}

/// What a unit of this kind is called in reasons and alerts.
pub(crate) fn noun(phase: Phase) -> &'static str {
    match phase {
        Phase::Forward => "step",
        Phase::Compensate => "compensation",
    }
}

/// One entry of the status history; each is also sent to `reply_to` as a [`StatusMessage`].
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub seq: u64,
    pub state: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failure_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at: Millis,
    /// The entry begins a wait for a claim of the unit `step` names (a retry's backoff, the first
    /// claim of a compensation, a restart), not an attempt: every `Pending` entry, and the
    /// `Compensating` entries that wait (a compensation's attempts say `Compensating` too).
    /// Written only when true (8 bytes of the item); entries written before it existed lack it,
    /// and read as attempts unless `Pending`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub waiting: bool,
}

impl HistoryEntry {
    /// The status message that tells the caller about this entry.
    pub fn status(&self, task_id: &TaskId) -> StatusMessage {
        StatusMessage {
            step: self.step.clone(),
            failure_count: self.failure_count,
            reason: self.reason.clone(),
            ..StatusMessage::new(task_id.clone(), self.seq, self.state, self.at)
        }
    }
}

/// The format of the task item this build writes and the latest it reads: an item says its format
/// in its `Format` attribute when it is above 1 (absent: 1, so that the items of the releases
/// before the attribute existed are format 1 as they are). A build reads every format up to its
/// own and refuses a later one for that format, before it reads or writes anything of the task
/// (it would drop the attributes it does not know when it wrote the task back). Any change to
/// the item's shape, its workflow definition included, is a new format: the test
/// `the_task_item_has_the_format_kept_for_its_item_format` fails until it is one
/// (docs/reference/table.md, "Item format").
pub const ITEM_FORMAT: u32 = 1;

/// A task as the state store keeps it. Field names are the pattern's, as DynamoDB attributes.
/// The groups of related fields ([`Lock`], [`ClaimWait`], [`UndeliveredReplies`],
/// [`LateResults`]) are flattened: their fields are attributes of the item like the others, under
/// the same names as ever (`LockedBy`, `WaitRev`, `UndeliveredReplies`, `LateResult`, ...).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Task {
    pub task_id: TaskId,
    /// The definition pinned at submission.
    pub workflow: WorkflowDef,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    pub process_state: ProcessState,
    /// Absent while forward (most of a task's life): one attribute less in every write.
    #[serde(default, skip_serializing_if = "Stage::is_forward")]
    pub stage: Stage,
    /// Index of the current forward step.
    pub step_index: usize,
    pub steps: Vec<StepRecord>,
    /// Failures of all steps together; it never decreases. Absent while 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failure_count: u32,
    /// 1, then +1 for each cancel or resubmit (commands name the run they are for).
    #[serde(default = "first_run")]
    pub run: u32,
    /// The attempt that holds the task, and the earlier ones whose answers still count.
    #[serde(flatten)]
    pub lock: Lock,
    /// The deadline of whatever the task waits for; present exactly while not terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<Millis>,
    /// The wait for the next claim of the current unit (while no attempt holds the task).
    #[serde(flatten)]
    pub claim: ClaimWait,
    /// Bumped by every transition; every write is conditional on the value read.
    pub rev: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// The `seq` of the last status: +1 per state change, so a caller sees no gap.
    #[serde(default)]
    pub status_seq: u64,
    /// A digest of the queue message whose event made the last write (see
    /// [`crate::ids::message_mark`]). When that message comes back (its handler may have died, or
    /// its sends failed, after the write), what the write owes the world is sent again: the
    /// current unit's work, or the terminal notices. Any other message finds nothing owed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message: Option<String>,
    /// Statuses that could never reach `reply_to`.
    #[serde(flatten)]
    pub undelivered: UndeliveredReplies,
    /// Successes of callback attempts that came too late to count.
    #[serde(flatten)]
    pub late: LateResults,
    /// A branch of a parallel region: the outputs of its parent's steps that it comes after,
    /// which its agent receives among `outputs` as if it ran in its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Value>,
    /// The child task of a parent's workflow step: its end tells the parent its result.
    #[serde(default, skip_serializing_if = "is_false")]
    pub called: bool,
    /// The variables its steps set (`assign`), read as `$.vars.<name>`: a name keeps its last
    /// value, so the attribute does not grow with the steps that set it; at most
    /// [`MAX_VARS_BYTES`](crate::workflow::MAX_VARS_BYTES) as JSON. A branch of a parallel
    /// region reads a copy of its parent's. Absent while empty.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub vars: Map<String, Value>,
    /// A loop's iteration (`{task}~{step}~{i}`): its index and the previous iteration's output,
    /// what its steps read as `$.loop.index` and `$.loop.previous`. Its end brings its output and,
    /// for an inline body, its variables back to the loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<Iteration>,
    /// The slot of its concurrency key (attribute `Slot`), when its workflow has one: given back
    /// when the task ends (see [`crate::keys`]). Absent for every other task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
}

/// A task's place under its workflow's concurrency key (attribute `Slot`: `Key`, `Waiting`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Slot {
    /// The key item's id (`key:{scope}:{value}`).
    pub key: String,
    /// It waits for a slot: created unclaimed, no run message sent; the grant sends it.
    /// `CompleteBy` is then the Supervisor's check of the key, not a deadline of the task.
    #[serde(default, skip_serializing_if = "is_false")]
    pub waiting: bool,
}

impl Task {
    /// It waits for a slot of its concurrency key (created, never claimed).
    pub fn waits_for_slot(&self) -> bool {
        self.slot.as_ref().is_some_and(|s| s.waiting) && !self.process_state.is_terminal()
    }
}

/// What a loop's iteration knows of the loop (attribute `Iteration`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Iteration {
    /// Its index, from 0.
    pub index: u32,
    /// The previous iteration's output (after the loop's `result_selector`); absent in the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Value>,
    /// Its body is the loop's inline steps: it shares the task's variables (a copy in, the copy
    /// back when it ends).
    #[serde(default, skip_serializing_if = "is_false")]
    pub shares_vars: bool,
}

/// The fence of the current unit's attempts ([`Task::lock`]): the attempt that holds the task,
/// its hard deadline, and the earlier attempts whose answers are still taken. Attributes
/// `LockedBy`, `HardBy`, `Outstanding`, `Awaits`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Lock {
    /// The current attempt's fencing token; absent while no attempt is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_by: Option<AttemptToken>,
    /// A callback attempt with a heartbeat timeout: its hard deadline, which heartbeats (that
    /// move `CompleteBy`) never pass. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_by: Option<Millis>,
    /// Timed-out attempts of the current unit: they answered in time if they answer at all (an
    /// agent sends nothing after `CompleteBy`), so a success of one is taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outstanding: Vec<AttemptToken>,
    /// The forward attempt a compensation waits for (cancelled while running): compensation starts
    /// when it answers, or once it can no longer apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaits: Option<AttemptToken>,
}

/// The wait for the next claim of the current unit ([`Task::claim`]): which run messages may
/// claim, from when, and how often the Supervisor re-sent them. Attributes `WaitRev`,
/// `NotBefore`, `Restarts`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ClaimWait {
    /// The revision at which the task began to wait for its current claim. Run messages carry it;
    /// a restart re-sends it unchanged, so a run message delayed in a lagging queue still claims.
    #[serde(rename = "WaitRev", default)]
    pub rev: u64,
    /// No claim before this instant (a retry's backoff, a compensation waiting for its forward
    /// attempt to settle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Millis>,
    /// Restarts since the last claim (a lost or never-claimed run message).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// Its workflow is paused: its next forward unit waits, unclaimed, with no run message;
    /// `CompleteBy` is when the Supervisor looks whether the workflow was resumed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub paused: bool,
}

/// Statuses that could never reach `reply_to` (the queue refused them for good or is gone):
/// counted, not retried; the task goes on regardless ([`Task::undelivered`]). Attributes
/// `UndeliveredReplies`, `ReplyError`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UndeliveredReplies {
    /// How many.
    #[serde(rename = "UndeliveredReplies", default, skip_serializing_if = "is_zero")]
    pub count: u32,
    /// Why the last of them was not delivered.
    #[serde(rename = "ReplyError", default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Successes of callback attempts that came after their attempt had expired and were not taken
/// as a result: an effect happened that the task may not account for ([`Task::late`]).
/// Attributes `LateResults`, `LateResult`, `LateAttempt`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LateResults {
    /// How many.
    #[serde(rename = "LateResults", default, skip_serializing_if = "is_zero")]
    pub count: u32,
    /// The last of them, in words.
    #[serde(rename = "LateResult", default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// The attempt of the last of them (its repeat is not counted twice).
    #[serde(rename = "LateAttempt", default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<AttemptToken>,
}

fn first_run() -> u32 {
    1
}

/// A task as it is before its first transition.
pub(crate) fn new_task(
    task_id: TaskId,
    workflow: WorkflowDef,
    input: Value,
    reply_to: Option<String>,
    ctx: &Ctx,
) -> Task {
    let steps = workflow.steps.iter().map(|s| StepRecord::new(&s.name)).collect();
    Task {
        task_id,
        workflow,
        input,
        reply_to,
        process_state: ProcessState::Pending,
        stage: Stage::Forward,
        step_index: 0,
        steps,
        failure_count: 0,
        run: 1,
        lock: Lock::default(),
        complete_by: None,
        claim: ClaimWait { rev: 1, not_before: None, restarts: 0, paused: false },
        rev: 1,
        reason: None,
        created_at: ctx.now,
        updated_at: ctx.now,
        history: Vec::new(),
        status_seq: 0,
        last_message: None,
        undelivered: UndeliveredReplies::default(),
        late: LateResults::default(),
        upstream: None,
        called: false,
        vars: Map::new(),
        iteration: None,
        slot: None,
    }
}

impl Task {
    /// The task with `n` more statuses that could never be delivered, the last because of
    /// `error`. A write of its own (the revision moves, so a racing transition re-decides on it);
    /// nothing else changes, `UpdatedAt` included.
    #[must_use]
    pub fn with_undelivered_replies(&self, n: u32, error: &str) -> Task {
        let mut t = self.clone();
        t.undelivered.count = t.undelivered.count.saturating_add(n);
        t.undelivered.error = Some(crate::ids::clip(error, 300).to_owned());
        t.rev += 1;
        t
    }

    pub fn is_compensating(&self) -> bool {
        matches!(self.stage, Stage::Compensating { .. })
    }

    /// The kind of the unit of work the task is on.
    pub fn phase(&self) -> Phase {
        self.stage.phase()
    }

    /// The index of the step the current unit belongs to: the forward step itself, or the step
    /// being compensated.
    pub fn unit_step(&self) -> usize {
        match &self.stage {
            Stage::Forward => self.step_index,
            Stage::Compensating { plan, pos, .. } => plan[*pos],
        }
    }

    /// The definition of the unit of work the task is on: a forward step or a compensation.
    pub fn current_def(&self) -> &StepDef {
        let step = &self.workflow.steps[self.unit_step()];
        match self.stage {
            Stage::Forward => step,
            // a parallel region's undo (its branches undo themselves) may have none of its own
            Stage::Compensating { .. } => step.compensation.as_deref().unwrap_or(step),
        }
    }

    /// The name of the current unit (for status messages and the `CurrentStep` attribute).
    pub fn current_step_name(&self) -> Option<&str> {
        if self.process_state.is_terminal() {
            return None;
        }
        Some(self.current_def().name.as_str())
    }

    /// Attempts claimed so far for the current unit.
    pub(crate) fn unit_attempts(&self) -> u32 {
        let step = &self.steps[self.unit_step()];
        match self.stage {
            Stage::Forward => step.attempts,
            Stage::Compensating { .. } => step.compensation.as_ref().map_or(0, |c| c.attempts),
        }
    }

    /// The generation of the current unit's idempotency key.
    pub(crate) fn unit_key_gen(&self) -> u32 {
        let step = &self.steps[self.unit_step()];
        match self.stage {
            Stage::Forward => step.key_gen,
            Stage::Compensating { .. } => step.compensation.as_ref().map_or(0, |c| c.key_gen),
        }
    }

    /// What the current unit's agent receives: the task input, the outputs of the steps that
    /// succeeded, and (for a compensation) which step it undoes.
    /// What the current unit's agent receives: its `parameters` filled, or the whole
    /// [`Self::unit_input`].
    pub(crate) fn unit_request(&self) -> Value {
        match &self.current_def().parameters {
            Some(t) => t.0.fill(self),
            None => self.unit_input(),
        }
    }

    /// The workflow's `result`, filled, when the task is `Processed` and its workflow declares one.
    pub fn result(&self) -> Option<Value> {
        let r = self.workflow.result.as_ref().filter(|_| self.process_state == ProcessState::Processed)?;
        Some(r.0.fill(self))
    }

    pub(crate) fn unit_input(&self) -> Value {
        let mut v = serde_json::json!({ "input": self.input, "outputs": self.outputs() });
        if self.is_compensating() {
            v["compensating"] = Value::String(self.steps[self.unit_step()].name.clone());
        }
        v
    }

    /// What this task, as a child of another (a map's element, a parallel branch, a child
    /// workflow), gives its parent's step: a child workflow's result (or every output of its
    /// steps), else its one step's output.
    pub fn element_output(&self) -> Value {
        if self.called {
            self.result().unwrap_or_else(|| self.outputs())
        } else {
            self.steps.first().and_then(|s| s.output.clone()).unwrap_or(Value::Null)
        }
    }

    /// The outputs of the steps that succeeded, by step name: what later steps receive as
    /// `outputs`, and a `Processed` task's result.
    pub fn outputs(&self) -> Value {
        let mut outputs = match &self.upstream {
            Some(Value::Object(up)) => up.clone(),
            _ => serde_json::Map::new(),
        };
        for s in &self.steps {
            if let Some(o) = s.result() {
                outputs.insert(s.name.clone(), o.clone());
            }
        }
        Value::Object(outputs)
    }

    /// Whether step `name` was skipped (a region's branches: once the region has ended).
    pub fn skipped(&self, name: &str) -> bool {
        self.steps.iter().any(|s| s.name == name && s.status == StepStatus::Skipped)
    }

    /// The status message that tells the caller about `entry`, with the task's outputs when it
    /// says `Processed`.
    pub fn status_of(&self, entry: &HistoryEntry) -> StatusMessage {
        let status = entry.status(&self.task_id);
        match (&self.workflow.result, entry.state) {
            (Some(r), ProcessState::Processed) => status.with_result(r.0.fill(self)),
            (None, ProcessState::Processed) => status.with_outputs(self.outputs()),
            _ => status,
        }
    }

    /// The record of the unit named `unit` (a forward step or a compensation that has run).
    pub fn unit_named(&self, unit: &str) -> Option<UnitRef<'_>> {
        self.steps.iter().find_map(|s| {
            if s.name == unit {
                Some(UnitRef::Step(s))
            } else {
                s.compensation.as_ref().filter(|c| c.name == unit).map(UnitRef::Compensation)
            }
        })
    }

    /// Record that `attempt`'s answer completed the unit named `unit`.
    pub(crate) fn set_done_by(&mut self, unit: &str, attempt: &AttemptToken) {
        for s in &mut self.steps {
            if s.name == unit {
                s.done_by = Some(attempt.clone());
                s.progress = None;
            } else if let Some(c) = s.compensation.as_mut().filter(|c| c.name == unit) {
                c.done_by = Some(attempt.clone());
            }
        }
    }

    /// The current unit's record (a compensation's is created on first use).
    pub(crate) fn unit_record(&mut self) -> &mut dyn UnitRecord {
        let i = self.unit_step();
        if let Stage::Compensating { .. } = self.stage {
            let name = self.current_def().name.clone();
            self.steps[i].compensation.get_or_insert(CompensationRecord {
                name,
                status: CompensationStatus::Pending,
                attempts: 0,
                failures: 0,
                error: None,
                refused: false,
                key_gen: 0,
                done_by: None,
                issued: Vec::new(),
            })
        } else {
            &mut self.steps[i]
        }
    }
}
