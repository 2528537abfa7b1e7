//! Workflow definitions: named, versioned, ordered steps. Loaded from configuration at deploy time
//! (`config/workflows.json`, compiled into the binaries, or a file named by `SAS_WORKFLOWS_FILE`);
//! a task pins a copy of the definition it was submitted with.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::condition::{Condition, DataPath, Root};
use crate::graph::StepGraph;
use crate::ids::{check_name, IdError};
use crate::template::{AnswerTemplate, TaskTemplate};

/// The longest a step may run: an agent Lambda's timeout is at most 15 minutes, and SQS
/// DelaySeconds (the precise deadline timer) is at most 15 minutes.
/// One attempt runs inside one invocation of the Agent function (its timeout is 120 s in
/// `template.yaml`); 10 s stay for the function's own work around the call.
pub const MAX_STEP_TIMEOUT_MS: u64 = 110 * 1000;
/// The longest a callback step's attempt may wait for its answer, and the longest wait step: a
/// year and a day, as Lambda durable functions' callbacks and executions (366 days). Anything
/// longer is a schedule, not a step.
pub const MAX_LONG_STEP_MS: u64 = 366 * 24 * 60 * 60 * 1000;
/// The shortest heartbeat timeout: a worker heartbeats more often than this is worth.
pub const MIN_HEARTBEAT_MS: u64 = 1_000;
/// The longest a request may wait in the agent queue before it starts.
pub const MAX_QUEUE_BUDGET_MS: u64 = 60 * 60 * 1000;
/// The shortest schedule-to-start budget a step may set (but 0, no budget): a request not started
/// within it is claimed again, so this bounds how often.
pub const MIN_QUEUE_BUDGET_MS: u64 = 1_000;
/// The longest backoff one SQS delay can express.
pub const MAX_BACKOFF_MS: u64 = 15 * 60 * 1000;

/// Exponential backoff between attempts of one step (the delay before attempt n+1).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Backoff {
    pub base_ms: u64,
    pub max_ms: u64,
    #[serde(default = "default_multiplier")]
    pub multiplier: f64,
}

fn one() -> u32 {
    1
}

fn default_multiplier() -> f64 {
    2.0
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base_ms: 1_000, max_ms: 60_000, multiplier: 2.0 }
    }
}

impl Backoff {
    /// Delay after the `failures`-th failure, with "equal jitter": half fixed, half random.
    /// `jitter` is a number in [0, 1) supplied by the caller, so this stays pure.
    pub fn delay_ms(&self, failures: u32, jitter: f64) -> u64 {
        let exp = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX).min(63);
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let raw = (self.base_ms as f64 * self.multiplier.powi(exp)).min(self.max_ms as f64);
        let j = jitter.clamp(0.0, 1.0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let d = (raw / 2.0 + raw / 2.0 * j) as u64;
        d.min(self.max_ms)
    }
}

/// How a unit of work is done, with the data only that kind has. All kinds run the same attempt
/// machine (claim with a fresh token, a deadline, retry or give up); they differ in what ends an
/// attempt. A file names the kind in `kind` (absent: `call`) beside the kind's own fields; a
/// combination that belongs to no kind (a wait step with an agent, a call with `wait_ms`) does not
/// parse, so the engine never meets one. (`PartialEq` is for a task read back to compare with the
/// task written; code asks a kind what it is by matching it, never with `==`:
/// `crates/core/tests/module_graph.rs` checks.)
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// The agent calls the remote service and reports its answer (within `timeout_ms`, at most
    /// [`MAX_STEP_TIMEOUT_MS`]).
    Call {
        /// The logical agent that performs it (an entry of the agent runtime's registry).
        agent: String,
    },
    /// The agent hands the work and a callback token over and returns; the remote side answers
    /// with the token (succeeded, failed, heartbeat) within `timeout_ms` (up to
    /// [`MAX_LONG_STEP_MS`]) and, when `heartbeat_ms` is set, heartbeats at least that often.
    Callback {
        agent: String,
        /// The remote side must heartbeat at least this often (each heartbeat moves the deadline
        /// to now + this, never past the hard timeout).
        heartbeat_ms: Option<u64>,
    },
    /// No agent: the step sleeps (see [`WaitTime`]), and succeeds.
    Wait(WaitTime),
    /// No agent: the step starts a child task of another workflow, with its `parameters` (or the
    /// task's input) as the child's input, and succeeds with the child's result when the child
    /// ends `Processed`. The child is cancelled with its parent and undoes its own steps when its
    /// parent compensates.
    Workflow(ChildWorkflow),
    /// No agent: the step runs its body (a child workflow, inline or named) once per iteration,
    /// each iteration a child task of its own, while or until its guard holds, at most
    /// `max_iterations` times, with an optional timer between iterations (see [`LoopSpec`]).
    Loop(LoopSpec),
}

/// The most iterations one loop step may run.
pub const MAX_LOOP_ITERATIONS: u32 = 10_000;
/// The most a loop keeps of its last iteration's output (after its `result_selector`): the
/// parent's item holds it at every write.
pub const MAX_LOOP_OUTPUT_BYTES: usize = 16 * 1024;
/// How deep tasks nest: a task, its child (a map's element, a branch, a workflow step's child,
/// a loop's iteration), and that child's child. A child's id holds its place in its parent
/// (`{task}~{step}~{i}`), and an id takes at most two such parts.
pub const MAX_CHILD_LEVELS: usize = 2;

/// A loop step: its body, guard, bound and wait.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopSpec {
    /// What one iteration runs: a workflow (named, pinned at its version), or the `body` of the
    /// file compiled into one (`inline`), named `{step}` at version 0 here (an iteration's task
    /// names it `{workflow}.{step}` at its parent's version).
    pub body: ChildWorkflow,
    /// The body was given inline (`body`), and is written back so.
    pub inline: bool,
    /// When another iteration runs.
    pub guard: LoopGuard,
    /// The most iterations (1 to [`MAX_LOOP_ITERATIONS`]).
    pub max_iterations: u32,
    /// What reaching `max_iterations` with the guard still asking for more means.
    pub on_bound: OnBound,
    /// The timer between two iterations (none before the first).
    pub wait_ms: Option<u64>,
}

/// A loop's guard, in the condition language, decided over the task's data, the loop's output so
/// far (`$.outputs.<loop>`: the last iteration's) and `$.loop.index` (the iterations ended).
#[derive(Debug, Clone, PartialEq)]
pub enum LoopGuard {
    /// `while`: decided before each iteration, the first included (the body may never run).
    While(Condition),
    /// `until`: decided after each iteration (the body runs at least once).
    Until(Condition),
}

impl LoopGuard {
    /// The condition, whichever way it is read.
    pub fn condition(&self) -> &Condition {
        match self {
            LoopGuard::While(c) | LoopGuard::Until(c) => c,
        }
    }
}

/// What a loop that reaches `max_iterations` with its guard still asking for more does.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBound {
    /// The step fails for good (`permanent`): its `on_failure` applies.
    #[default]
    Fail,
    /// The step succeeds with the last iteration's output (a counted loop).
    Succeed,
}

impl OnBound {
    fn is_fail(self) -> bool {
        matches!(self, OnBound::Fail)
    }
}

/// How long a wait step waits: exactly one of a file's `wait_ms`, `wait_until` and `wait_for`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitTime {
    /// `wait_ms`: this long.
    Ms(u64),
    /// `wait_until`: until the instant, an RFC 3339 time (`2026-12-24T18:00:00Z`) or a JSON
    /// pointer into the unit's input (`/input/remind_at`, `/outputs/ship/eta`) naming one (or
    /// epoch milliseconds).
    Until(String),
    /// `wait_for`: a JSON pointer into the unit's input (`/input/delay_s`) naming how many
    /// seconds to wait.
    SecondsAt(String),
}

/// What a workflow step runs: `workflow` pinned at `version` (a new version of the child is a new
/// version of the parent).
#[derive(Debug, Clone, PartialEq)]
pub struct ChildWorkflow {
    pub workflow: String,
    pub version: u32,
    /// The child's definition, filled in by the registry when the workflows load (never written
    /// in a file), so that a task's pinned definition holds its children's.
    pub child: Option<Box<WorkflowDef>>,
}

/// A kind's name in a workflow file (`kind`), the tag of [`StepKind`].
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(
        rename = "StepKind",
        description = "How a unit of work is done. All three run the same attempt machine (claim with a fresh\ntoken, a deadline, retry or give up); they differ in what ends an attempt."
    )
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KindName {
    /// The agent calls the remote service and reports its answer (within `timeout_ms`, at most
    /// [`MAX_STEP_TIMEOUT_MS`]).
    #[default]
    Call,
    /// The agent hands the work and a callback token over and returns; the remote side answers
    /// with the token (succeeded, failed, heartbeat) within `timeout_ms` (up to
    /// [`MAX_LONG_STEP_MS`]) and, when `heartbeat_ms` is set, heartbeats at least that often.
    Callback,
    /// No agent: the step sleeps for `wait_ms`, for the seconds at `wait_for` (a JSON pointer into
    /// the unit's input), or until the instant `wait_until` (an RFC 3339 time, or a JSON pointer
    /// into the unit's input naming epoch milliseconds or an RFC 3339 time), and succeeds.
    Wait,
    /// No agent: the step starts a child task of another workflow (`workflow`, pinned at
    /// `version`), with its `parameters` (or the task's input) as the child's input, and succeeds
    /// with the child's result when the child ends `Processed`. The child is cancelled with its
    /// parent and undoes its own steps when its parent compensates.
    Workflow,
    /// No agent: the step runs its `body` (inline steps) or `workflow` (at `version`) once per
    /// iteration, `while` or `until` a guard holds, at most `max_iterations` times (`on_bound`
    /// says whether reaching it fails the step), `wait_ms` apart.
    Loop,
}

impl KindName {
    /// Its name in a workflow file.
    pub const fn name(self) -> &'static str {
        match self {
            KindName::Call => "call",
            KindName::Callback => "callback",
            KindName::Wait => "wait",
            KindName::Workflow => "workflow",
            KindName::Loop => "loop",
        }
    }

    /// The default kind (left out when a definition is written back).
    pub fn is_call(&self) -> bool {
        matches!(self, KindName::Call)
    }
}

/// What each kind means to the protocol, the tools and validation: every question is one
/// exhaustive `match`, so a new kind does not compile until each is answered for it. Code that
/// needs a kind's data matches the kind itself.
impl StepKind {
    /// Its tag, as a file names it.
    pub const fn tag(&self) -> KindName {
        match self {
            StepKind::Call { .. } => KindName::Call,
            StepKind::Callback { .. } => KindName::Callback,
            StepKind::Wait(_) => KindName::Wait,
            StepKind::Workflow(_) => KindName::Workflow,
            StepKind::Loop(_) => KindName::Loop,
        }
    }

    /// Its name in a workflow file.
    pub const fn name(&self) -> &'static str {
        self.tag().name()
    }

    /// The agent that performs each attempt, for the kinds an agent performs: a request is
    /// dispatched, and the attempt may have applied an effect at the remote side (it is undone
    /// when the task is).
    pub fn agent(&self) -> Option<&str> {
        match self {
            StepKind::Call { agent } | StepKind::Callback { agent, .. } => Some(agent),
            StepKind::Wait(_) | StepKind::Workflow(_) | StepKind::Loop(_) => None,
        }
    }

    /// An agent performs each attempt (see [`StepKind::agent`]).
    pub const fn uses_agent(&self) -> bool {
        match self {
            StepKind::Call { .. } | StepKind::Callback { .. } => true,
            StepKind::Wait(_) | StepKind::Workflow(_) | StepKind::Loop(_) => false,
        }
    }

    /// An attempt is a timer and nothing else: it ends at its deadline, succeeded, with no
    /// result to wait for (no grace after the deadline).
    pub const fn is_timer(&self) -> bool {
        match self {
            StepKind::Wait(_) => true,
            StepKind::Call { .. } | StepKind::Callback { .. } | StepKind::Workflow(_) | StepKind::Loop(_) => false,
        }
    }

    /// The attempt hands a callback token over, and its answer comes with the token (from the
    /// Callback function) instead of the agent's report.
    pub const fn answers_by_token(&self) -> bool {
        match self {
            StepKind::Callback { .. } => true,
            StepKind::Call { .. } | StepKind::Wait(_) | StepKind::Workflow(_) | StepKind::Loop(_) => false,
        }
    }

    /// The agent itself bounds the attempt's effect to `timeout_ms` after it starts (a call is
    /// cut then); a callback's remote side holds its token until the hard deadline instead.
    pub const fn agent_bounds_the_effect(&self) -> bool {
        match self {
            StepKind::Call { .. } => true,
            StepKind::Callback { .. } | StepKind::Wait(_) | StepKind::Workflow(_) | StepKind::Loop(_) => false,
        }
    }

    /// It may be a map: each element runs the step (a workflow step: a child task of its workflow
    /// per element).
    pub const fn may_map(&self) -> bool {
        match self {
            StepKind::Call { .. } | StepKind::Callback { .. } | StepKind::Workflow(_) => true,
            StepKind::Wait(_) | StepKind::Loop(_) => false,
        }
    }

    /// It may be a compensation (it undoes a step).
    pub const fn may_compensate(&self) -> bool {
        match self {
            StepKind::Call { .. } | StepKind::Callback { .. } => true,
            StepKind::Wait(_) | StepKind::Workflow(_) | StepKind::Loop(_) => false,
        }
    }

    /// The child workflow the step runs, for a workflow step (it is undone by the child itself).
    pub const fn child_workflow(&self) -> Option<&ChildWorkflow> {
        match self {
            StepKind::Workflow(w) => Some(w),
            StepKind::Call { .. } | StepKind::Callback { .. } | StepKind::Wait(_) | StepKind::Loop(_) => None,
        }
    }

    /// A loop step's body, guard, bound and wait.
    pub const fn loop_spec(&self) -> Option<&LoopSpec> {
        match self {
            StepKind::Loop(l) => Some(l),
            StepKind::Call { .. } | StepKind::Callback { .. } | StepKind::Wait(_) | StepKind::Workflow(_) => None,
        }
    }

    /// The workflow each of its child tasks runs: a workflow step's child, a loop's body.
    pub const fn child_def(&self) -> Option<&ChildWorkflow> {
        match self {
            StepKind::Workflow(w) => Some(w),
            StepKind::Loop(l) => Some(&l.body),
            StepKind::Call { .. } | StepKind::Callback { .. } | StepKind::Wait(_) => None,
        }
    }

    /// The step runs a child task of another workflow.
    pub const fn starts_a_workflow(&self) -> bool {
        self.child_workflow().is_some()
    }

    /// The heartbeat timeout of a callback step that sets one.
    pub const fn heartbeat_ms(&self) -> Option<u64> {
        match self {
            StepKind::Callback { heartbeat_ms, .. } => *heartbeat_ms,
            StepKind::Call { .. } | StepKind::Wait(_) | StepKind::Workflow(_) | StepKind::Loop(_) => None,
        }
    }
}

/// One unit of work: a forward step or a compensating step. Its file form is [`StepFile`]: read
/// through it, so that a step whose fields fit no kind is refused as the file is read.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(description = "One unit of work: a forward step or a compensating step."))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "StepFile", into = "StepFile")]
pub struct StepDef {
    pub name: String,
    /// The steps this one waits for (see [`crate::graph`]): it starts once all of them have
    /// succeeded. Absent: the step listed before it (none for the first). `[]`: none, it starts
    /// with the task. Steps that do not wait for each other run at once, each as a branch.
    pub after: Option<Vec<String>>,
    /// What it does, with the data of its kind.
    pub kind: StepKind,
    /// How long one attempt may run once an agent starts it (start-to-close); for a callback
    /// step, the hard timeout that heartbeats never extend; for a workflow step, how long the
    /// child may run (0: no limit of its own). 0 for a wait step.
    pub timeout_ms: u64,
    /// How long its request may wait in the agent queue before it starts (schedule-to-start); the
    /// deployment's default when absent. `CompleteBy = claim time + this + timeout_ms`.
    pub schedule_to_start_ms: Option<u64>,
    /// Attempts before the step counts as failed for good (1 = no retry).
    pub max_attempts: u32,
    pub backoff: Backoff,
    /// The step that undoes this one, run in reverse order when the task fails or is cancelled.
    pub compensation: Option<Box<StepDef>>,
    /// A map step: the step runs once per element of an array (see [`MapSpec`]); each element is
    /// a task of its own with its own key, deadline, attempts and compensation.
    pub map: Option<MapSpec>,
    /// A guard (see [`crate::condition`]): the step runs only when it holds.
    pub when: Option<Condition>,
    /// What the step's failure, past its attempts, does to the task.
    pub on_failure: StepFailure,
    /// The failures another attempt is made for (see [`StepFile::retry_on`]); all that may pass
    /// when absent.
    pub retry_on: Option<Vec<Handled>>,
    /// What the agent receives (see [`crate::template`]).
    pub parameters: Option<TaskTemplate>,
    /// What of the agent's answer the step keeps as its output.
    pub result_selector: Option<AnswerTemplate>,
    /// Variables the step sets when it succeeds (see [`StepFile::assign`]).
    pub assign: Option<TaskTemplate>,
}

/// A step as a workflow file (and a task's pinned definition) writes it: the fields of every
/// kind side by side, `kind` naming which apply. Read into a [`StepDef`], which holds only its
/// kind's.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct StepFile {
    pub name: String,
    /// The steps this one waits for (see [`crate::graph`]): it starts once all of them have
    /// succeeded. Absent: the step listed before it (none for the first). `[]`: none, it starts
    /// with the task. Steps that do not wait for each other run at once, each as a branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "KindName::is_call")]
    pub kind: KindName,
    /// The logical agent that performs it (an entry of the agent runtime's registry); empty for
    /// a wait step.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent: String,
    /// How long one attempt may run once an agent starts it (start-to-close); for a callback
    /// step, the hard timeout that heartbeats never extend. Not used by a wait step.
    #[serde(default)]
    pub timeout_ms: u64,
    /// Callback steps: the remote side must heartbeat at least this often (each heartbeat moves
    /// the deadline to now + this, never past the hard timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// Wait steps: how long to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Wait steps: the instant to wait until, an RFC 3339 time (`2026-12-24T18:00:00Z`) or a JSON
    /// pointer into the unit's input (`/input/remind_at`, `/outputs/ship/eta`) naming one (or
    /// epoch milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_until: Option<String>,
    /// Wait steps: a JSON pointer into the unit's input (`/input/delay_s`) naming how many seconds
    /// to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<String>,
    /// How long its request may wait in the agent queue before it starts (schedule-to-start); the
    /// deployment's default when absent. `CompleteBy = claim time + this + timeout_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_to_start_ms: Option<u64>,
    /// Attempts before the step counts as failed for good (1 = no retry).
    #[serde(default = "one")]
    pub max_attempts: u32,
    #[serde(default)]
    pub backoff: Backoff,
    /// The step that undoes this one, run in reverse order when the task fails or is cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Box<StepDef>>,
    /// A map step: the step runs once per element of an array (see [`MapSpec`]); each element is
    /// a task of its own with its own key, deadline, attempts and compensation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapSpec>,
    /// A guard (see [`crate::condition`]): the step runs only when it holds, decided once, when
    /// the steps it waits for are done, over the task's input and their outputs; otherwise the
    /// step is *skipped* (nothing runs, nothing is undone), and so are the steps that name it in
    /// `after` when every step they name was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Condition>,
    /// What the step's failure, past its attempts, does to the task: `fail` (the default: the
    /// workflow's `on_failure` applies), `continue` (the task goes on; the step's output is the
    /// error, `{"error": {"kind", "message"}}`), or `{"continue": [kinds]}` for some kinds only.
    #[serde(default, skip_serializing_if = "StepFailure::is_fail")]
    pub on_failure: StepFailure,
    /// The failures another attempt is made for, within `max_attempts`: kinds (`retryable`,
    /// `timed_out`) and error names as the agent names them (`Lambda.TooManyRequestsException`, a
    /// function's `CustomError`; see `on_failure`). A failure that may pass but is not listed
    /// fails the step at once, as a Step Functions retrier that does not name its error. Absent:
    /// every failure that may pass is retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<Handled>>,
    /// What the agent receives (see [`crate::template`]): a template over the task's input and
    /// the outputs of the steps before this one. Absent: the whole `{"input", "outputs"}`. The
    /// idempotency key does not depend on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<TaskTemplate>,
    /// What of the agent's answer the step keeps as its output: a template over the answer
    /// (`{"charge_id.$": "$.id"}`). Absent: the whole answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_selector: Option<AnswerTemplate>,
    /// Variables the step sets when it succeeds: a template whose top-level names are the
    /// variables (`{"token.$": "$.outputs.list.next_token", "pages": 1}`), filled over the task's
    /// data once the step's output is kept (so it reads `$.outputs.<this step>`), and read by later
    /// steps as `$.vars.<name>` in `when`, `parameters`, compensations' `parameters` and the
    /// workflow's `result`. A name keeps its last value; together they take at most 8 KiB as JSON,
    /// beyond which the step fails for good (and is undone: its effect happened). Not on a step of a
    /// parallel region (a branch is a task of its own: what it sets would not come back), nor on a
    /// compensation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assign: Option<TaskTemplate>,
    /// Workflow steps: the workflow the child task runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// Workflow steps: its version (pinned: a new version of the child is a new version of the
    /// parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Workflow steps: the child's definition, filled in by the registry when the workflows load
    /// (never written in a file), so that a task's pinned definition holds its children's.
    #[cfg_attr(feature = "schema", schemars(skip))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<Box<WorkflowDef>>,
    /// Loop steps: the steps one iteration runs, a workflow of their own (a sequence, or a graph
    /// with `after`), which read `$.loop.index` (this iteration's, from 0) and `$.loop.previous`
    /// (the previous iteration's output, absent in the first). Exactly one of `body` and
    /// `workflow` + `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Vec<StepDef>>,
    /// Loop steps: the next iteration runs while this holds, decided before each one (the first
    /// included). Exactly one of `while` and `until`.
    #[serde(default, rename = "while", skip_serializing_if = "Option::is_none")]
    pub while_: Option<Condition>,
    /// Loop steps: the iterations end once this holds, decided after each one (the body runs at
    /// least once). It reads the loop's output so far (`$.outputs.<loop>`, the last iteration's),
    /// `$.loop.index` (how many iterations ended) and the task's variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Condition>,
    /// Loop steps: the most iterations, 1 to 10000. Required: a loop always has a bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    /// Loop steps: what reaching max_iterations with the guard still asking for more does: `fail`
    /// (the default: the step fails for good, and its on_failure applies) or `succeed` (a
    /// counted loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_bound: Option<OnBound>,
}

impl TryFrom<StepFile> for StepDef {
    type Error = String;

    /// The step of a file, or why its fields fit no kind: a field of another kind, or a field
    /// its kind needs missing. (Values are checked by [`WorkflowDef::problems`].)
    fn try_from(f: StepFile) -> Result<StepDef, String> {
        let step = &f.name;
        let not_a_loop = || {
            if f.body.is_some()
                || f.while_.is_some()
                || f.until.is_some()
                || f.max_iterations.is_some()
                || f.on_bound.is_some()
            {
                return Err(format!(
                    "step {step}: body, while, until, max_iterations and on_bound belong to loop steps"
                ));
            }
            Ok(())
        };
        let waits = f.wait_ms.is_some() || f.wait_until.is_some() || f.wait_for.is_some();
        let not_a_child = || {
            if f.workflow.is_some() || f.version.is_some() || f.child.is_some() {
                return Err(format!("step {step}: workflow and version belong to steps of kind workflow and loop"));
            }
            not_a_loop()
        };
        let agent = || {
            if f.agent.is_empty() {
                return Err(format!("step {step}: agent is empty"));
            }
            Ok(f.agent.clone())
        };
        let kind = match f.kind {
            KindName::Call => {
                not_a_child()?;
                if f.heartbeat_ms.is_some() || waits {
                    return Err(format!(
                        "step {step}: heartbeat_ms, wait_ms, wait_until and wait_for belong to callback and wait steps"
                    ));
                }
                StepKind::Call { agent: agent()? }
            }
            KindName::Callback => {
                not_a_child()?;
                if waits {
                    return Err(format!("step {step}: wait_ms, wait_until and wait_for belong to wait steps"));
                }
                StepKind::Callback { agent: agent()?, heartbeat_ms: f.heartbeat_ms }
            }
            KindName::Workflow => {
                let (Some(workflow), Some(version)) = (f.workflow.clone(), f.version) else {
                    return Err(format!(
                        "step {step}: a workflow step names the workflow and the version it runs (workflow, version)"
                    ));
                };
                if !f.agent.is_empty() || f.heartbeat_ms.is_some() || waits {
                    return Err(format!(
                        "step {step}: a workflow step has no agent, heartbeat_ms, wait_ms, wait_until or wait_for"
                    ));
                }
                not_a_loop()?;
                StepKind::Workflow(ChildWorkflow { workflow, version, child: f.child.clone() })
            }
            KindName::Loop => StepKind::Loop(loop_of(&f)?),
            KindName::Wait => {
                not_a_child()?;
                if !f.agent.is_empty() || f.timeout_ms != 0 || f.heartbeat_ms.is_some() {
                    return Err(format!("step {step}: a wait step has no agent, timeout_ms or heartbeat_ms"));
                }
                match (f.wait_ms, &f.wait_until, &f.wait_for) {
                    (Some(ms), None, None) => StepKind::Wait(WaitTime::Ms(ms)),
                    (None, Some(at), None) => StepKind::Wait(WaitTime::Until(at.clone())),
                    (None, None, Some(at)) => StepKind::Wait(WaitTime::SecondsAt(at.clone())),
                    _ => {
                        return Err(format!(
                            "step {step}: a wait step needs exactly one of wait_ms, wait_until and wait_for"
                        ))
                    }
                }
            }
        };
        Ok(StepDef {
            name: f.name,
            after: f.after,
            kind,
            timeout_ms: f.timeout_ms,
            schedule_to_start_ms: f.schedule_to_start_ms,
            max_attempts: f.max_attempts,
            backoff: f.backoff,
            compensation: f.compensation,
            map: f.map,
            when: f.when,
            on_failure: f.on_failure,
            retry_on: f.retry_on,
            parameters: f.parameters,
            result_selector: f.result_selector,
            assign: f.assign,
        })
    }
}

impl From<StepDef> for StepFile {
    fn from(s: StepDef) -> StepFile {
        let mut f = StepFile {
            name: s.name,
            after: s.after,
            kind: s.kind.tag(),
            agent: String::new(),
            timeout_ms: s.timeout_ms,
            heartbeat_ms: None,
            wait_ms: None,
            wait_until: None,
            wait_for: None,
            schedule_to_start_ms: s.schedule_to_start_ms,
            max_attempts: s.max_attempts,
            backoff: s.backoff,
            compensation: s.compensation,
            map: s.map,
            when: s.when,
            on_failure: s.on_failure,
            retry_on: s.retry_on,
            parameters: s.parameters,
            result_selector: s.result_selector,
            assign: s.assign,
            workflow: None,
            version: None,
            child: None,
            body: None,
            while_: None,
            until: None,
            max_iterations: None,
            on_bound: None,
        };
        match s.kind {
            StepKind::Call { agent } => f.agent = agent,
            StepKind::Callback { agent, heartbeat_ms } => {
                f.agent = agent;
                f.heartbeat_ms = heartbeat_ms;
            }
            StepKind::Wait(WaitTime::Ms(ms)) => f.wait_ms = Some(ms),
            StepKind::Wait(WaitTime::Until(at)) => f.wait_until = Some(at),
            StepKind::Wait(WaitTime::SecondsAt(at)) => f.wait_for = Some(at),
            StepKind::Workflow(w) => {
                f.workflow = Some(w.workflow);
                f.version = Some(w.version);
                f.child = w.child;
            }
            StepKind::Loop(l) => {
                if l.inline {
                    f.body = l.body.child.map(|c| c.steps);
                } else {
                    f.workflow = Some(l.body.workflow);
                    f.version = Some(l.body.version);
                    f.child = l.body.child;
                }
                match l.guard {
                    LoopGuard::While(c) => f.while_ = Some(c),
                    LoopGuard::Until(c) => f.until = Some(c),
                }
                f.max_iterations = Some(l.max_iterations);
                f.on_bound = (!l.on_bound.is_fail()).then_some(l.on_bound);
                f.wait_ms = l.wait_ms;
            }
        }
        f
    }
}

/// A loop step of a file, or why its fields do not make one.
fn loop_of(f: &StepFile) -> Result<LoopSpec, String> {
    let step = &f.name;
    if !f.agent.is_empty() || f.heartbeat_ms.is_some() || f.wait_until.is_some() || f.wait_for.is_some() {
        return Err(format!(
            "step {step}: a loop step has no agent, heartbeat_ms, wait_until or wait_for (wait_ms is the time between \
             its iterations)"
        ));
    }
    let body = match (&f.body, &f.workflow, f.version) {
        (Some(steps), None, None) => ChildWorkflow {
            workflow: step.clone(),
            version: 0,
            child: Some(Box::new(WorkflowDef {
                name: step.clone(),
                version: 0,
                description: String::new(),
                on_failure: OnFailure::Compensate,
                steps: steps.clone(),
                result: None,
                concurrency: None,
            })),
        },
        (None, Some(workflow), Some(version)) => {
            ChildWorkflow { workflow: workflow.clone(), version, child: f.child.clone() }
        }
        _ => {
            return Err(format!(
                "step {step}: a loop step runs exactly one of body (its steps) and workflow + version (a workflow's)"
            ))
        }
    };
    let guard = match (&f.while_, &f.until) {
        (Some(c), None) => LoopGuard::While(c.clone()),
        (None, Some(c)) => LoopGuard::Until(c.clone()),
        _ => {
            return Err(format!(
                "step {step}: a loop step needs exactly one of while (decided before each iteration) and until \
                 (decided after each)"
            ))
        }
    };
    let Some(max_iterations) = f.max_iterations else {
        return Err(format!("step {step}: a loop step needs max_iterations, its bound (1 to {MAX_LOOP_ITERATIONS})"));
    };
    Ok(LoopSpec {
        inline: f.body.is_some(),
        body,
        guard,
        max_iterations,
        on_bound: f.on_bound.unwrap_or_default(),
        wait_ms: f.wait_ms,
    })
}

/// The most a task's variables (what its steps' `assign` set) may take, as JSON: the item is
/// rewritten at every write, so what it keeps is paid for at every step.
pub const MAX_VARS_BYTES: usize = 8 * 1024;

/// The deepest workflows may call workflows (a task, its child, its grandchild…).
pub const MAX_WORKFLOW_DEPTH: usize = 4;

/// How a step failed for good, as a step's `on_failure` names it.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Its attempts were spent on failures that could have passed (a 503, a throttle).
    Retryable,
    /// The service said no (a 4xx, a failed callback answer that is not retryable, a wait whose
    /// time cannot be read).
    Permanent,
    /// Its last attempt ran out of time.
    TimedOut,
}

impl FailureKind {
    pub const fn name(self) -> &'static str {
        match self {
            FailureKind::Retryable => "retryable",
            FailureKind::Permanent => "permanent",
            FailureKind::TimedOut => "timed_out",
        }
    }
}

/// A step's answer to its own failure past its attempts (see [`StepDef::on_failure`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StepFailure {
    /// The workflow's `on_failure` applies (compensate, or park in `Error`).
    #[default]
    Fail,
    /// The task goes on when the failure is of one of these kinds or has one of these names (all
    /// of them when empty).
    Continue(Vec<Handled>),
}

/// A failure a step's `on_failure` continues on: a kind, or the name of an error as its agent
/// named it (`S3.NoSuchKeyException`, a function's `CustomError`: [`crate::messages::error_name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Kind(FailureKind),
    Error(String),
}

impl Handled {
    /// A kind by its name, or an error's name (it starts with a capital letter: `CustomError`,
    /// `S3.NoSuchKeyException`).
    pub fn parse(h: &str) -> Option<Handled> {
        match serde_json::from_value::<FailureKind>(Value::String(h.to_owned())) {
            Ok(kind) => Some(Handled::Kind(kind)),
            Err(_) if h.starts_with(|c: char| c.is_ascii_uppercase()) && crate::messages::is_name(h) => {
                Some(Handled::Error(h.to_owned()))
            }
            Err(_) => None,
        }
    }

    /// Whether a failure of `kind`, named `name` by its agent, is this.
    pub fn matches(&self, kind: FailureKind, name: Option<&str>) -> bool {
        match self {
            Handled::Kind(k) => *k == kind,
            Handled::Error(e) => name == Some(e.as_str()),
        }
    }
}

impl<'de> Deserialize<'de> for Handled {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let h = String::deserialize(d)?;
        Handled::parse(&h).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{h:?} is neither a failure's kind (retryable, permanent, timed_out) nor an error's name (S3.NoSuchKeyException)"
            ))
        })
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Handled {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Handled".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"anyOf": [{"type": "string", "enum": ["retryable", "permanent", "timed_out"]},
            {"type": "string", "pattern": "^[A-Z][A-Za-z0-9._-]*$",
             "description": "an error's name, as its agent names it: S3.NoSuchKeyException, a function's CustomError"}]})
    }
}

impl Serialize for Handled {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Handled::Kind(k) => s.serialize_str(k.name()),
            Handled::Error(e) => s.serialize_str(e),
        }
    }
}

impl StepFailure {
    pub fn is_fail(&self) -> bool {
        *self == StepFailure::Fail
    }

    /// Whether a failure of `kind`, its error named `name` when its agent named it, is handled:
    /// the task goes on.
    pub fn continues(&self, kind: FailureKind, name: Option<&str>) -> bool {
        match self {
            StepFailure::Fail => false,
            StepFailure::Continue(all) => all.is_empty() || all.iter().any(|h| h.matches(kind, name)),
        }
    }
}

impl Serialize for StepFailure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StepFailure::Fail => s.serialize_str("fail"),
            StepFailure::Continue(k) if k.is_empty() => s.serialize_str("continue"),
            StepFailure::Continue(k) => BTreeMap::from([("continue", k)]).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for StepFailure {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = Value::deserialize(d)?;
        let bad = || {
            D::Error::custom(format!(
                "on_failure of a step is \"fail\", \"continue\" or {{\"continue\": [kinds (\"retryable\", \"permanent\", \"timed_out\") or error names (\"S3.NoSuchKeyException\")]}}, not {v}"
            ))
        };
        match &v {
            Value::String(s) if s == "fail" => Ok(StepFailure::Fail),
            Value::String(s) if s == "continue" => Ok(StepFailure::Continue(Vec::new())),
            Value::Object(m) if m.len() == 1 => {
                let Some(Value::Array(list)) = m.get("continue") else { return Err(bad()) };
                let mut all = Vec::with_capacity(list.len());
                for entry in list {
                    let Value::String(h) = entry else { return Err(bad()) };
                    all.push(Handled::parse(h).ok_or_else(bad)?);
                }
                if all.is_empty() {
                    return Err(bad());
                }
                Ok(StepFailure::Continue(all))
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for StepFailure {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StepFailure".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "What the step's failure past its attempts does: fail (the workflow's on_failure), continue (the task goes on, the error is the step's output), or continue for some kinds or error names only.",
            "oneOf": [
                {"type": "string", "enum": ["fail", "continue"]},
                {"type": "object", "required": ["continue"], "additionalProperties": false,
                 "properties": {"continue": {"type": "array", "minItems": 1, "uniqueItems": true,
                   "items": {"anyOf": [{"type": "string", "enum": ["retryable", "permanent", "timed_out"]},
                                       {"type": "string", "pattern": "^[A-Z][A-Za-z0-9._-]*$",
                                        "description": "an error's name, as its agent names it: S3.NoSuchKeyException, a function's CustomError"}]}}}}
            ]
        })
    }
}

/// The most elements one map step may have.
pub const MAX_MAP_ELEMENTS: usize = 10_000;
/// The most elements of one map step running at once.
pub const MAX_MAP_CONCURRENCY: u32 = 1_000;
/// How long a map step may run, all its elements together, when it does not say.
pub const DEFAULT_MAP_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// What makes a step a map: where its array is, how many elements run at once, how many may fail.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct MapSpec {
    /// A JSON pointer (RFC 6901) into the unit's input, `{"input": …, "outputs": {step: …}}`,
    /// naming the array: `/input/items`, `/outputs/quote/lines`; or a path of a template, which
    /// may name many values, their array the items: `$.outputs.query.Rows[1:]`,
    /// `$.input.orders[?@.paid == true]`.
    pub items: String,
    /// Elements running at once (1 to [`MAX_MAP_CONCURRENCY`]); the next starts as one ends.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: u32,
    /// Elements that may fail for good before the map fails: a count (`2`) or a share (`"10%"`
    /// of the elements, rounded down). 0 when absent.
    #[serde(default, skip_serializing_if = "Tolerance::is_none")]
    pub tolerated_failures: Tolerance,
    /// How long the map may run, all elements together, before it fails (default a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

fn default_concurrency() -> u32 {
    10
}

/// How many elements of a map may fail: a count, or a percentage of the elements.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Tolerance {
    #[default]
    None,
    Count(u32),
    Percent(u32),
}

impl Tolerance {
    pub fn is_none(&self) -> bool {
        matches!(self, Tolerance::None | Tolerance::Count(0))
    }

    /// The most elements of `n` that may fail with the map still succeeding.
    pub fn allowed(self, n: usize) -> usize {
        match self {
            Tolerance::None => 0,
            Tolerance::Count(c) => c as usize,
            Tolerance::Percent(p) => n * p as usize / 100,
        }
    }
}

impl Serialize for Tolerance {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Tolerance::None => s.serialize_u32(0),
            Tolerance::Count(c) => s.serialize_u32(*c),
            Tolerance::Percent(p) => s.serialize_str(&format!("{p}%")),
        }
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Tolerance {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Tolerance".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Elements that may fail for good: a count, or a share of the elements like \"10%\".",
            "oneOf": [
                {"type": "integer", "minimum": 0, "maximum": u32::MAX},
                {"type": "string", "pattern": "^(100|[1-9]?[0-9])%$"}
            ]
        })
    }
}

impl<'de> Deserialize<'de> for Tolerance {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => n
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .map(Tolerance::Count)
                .ok_or_else(|| D::Error::custom(format!("tolerated_failures {n} is not a count"))),
            serde_json::Value::String(t) => t
                .strip_suffix('%')
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|p| *p <= 100)
                .map(Tolerance::Percent)
                .ok_or_else(|| D::Error::custom(format!("tolerated_failures {t:?} is not a percentage like \"10%\""))),
            other => Err(D::Error::custom(format!("tolerated_failures {other} is neither a count nor \"N%\""))),
        }
    }
}

impl MapSpec {
    /// How long the map may run.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_MAP_TIMEOUT_MS)
    }

    fn validate(&self) -> Result<(), String> {
        if self.items.starts_with('$') {
            let path = crate::condition::DataPath::parse_many(&self.items).map_err(|e| format!("map.items: {e}"))?;
            if !matches!(path.root(), crate::condition::Root::Input | crate::condition::Root::Output(_)) {
                return Err(format!("map.items {:?} reads the task's input or a step's output", self.items));
            }
        } else if !self.items.starts_with("/input") && !self.items.starts_with("/outputs/") {
            return Err(format!(
                "map.items {:?} must be a JSON pointer into /input or /outputs/<step> (for example /input/items), or a path ($.outputs.query.Rows[1:])",
                self.items
            ));
        }
        if self.max_concurrency == 0 || self.max_concurrency > MAX_MAP_CONCURRENCY {
            return Err(format!("map.max_concurrency {} is outside 1..={MAX_MAP_CONCURRENCY}", self.max_concurrency));
        }
        if self.timeout_ms.is_some_and(|t| t == 0 || t > MAX_LONG_STEP_MS) {
            return Err(format!("map.timeout_ms must be within 1..={MAX_LONG_STEP_MS}"));
        }
        Ok(())
    }
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct WorkflowDef {
    pub name: String,
    pub version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// What a step that fails for good (permanently, or with its attempts spent) leads to.
    #[serde(default, skip_serializing_if = "OnFailure::is_default")]
    pub on_failure: OnFailure,
    pub steps: Vec<StepDef>,
    /// What a `Processed` task's last status carries as its `result` (see [`crate::template`]): a
    /// template over the input and every step's output. Absent: the status carries `outputs`,
    /// every step's output by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<TaskTemplate>,
    /// At most `limit` of its tasks with the same key run at once (see [`crate::keys`]). Absent:
    /// its tasks pay nothing for the feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
}

/// A workflow's concurrency key: a path into the submission's input whose value names the key,
/// how many tasks of one key may run at once, and what a submission does when its key is busy.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Concurrency {
    /// A path into the input (`$.input.account`) whose value (a string, a number or a boolean)
    /// names the key.
    pub key: String,
    /// How many tasks of one key may run at once: 1 to [`MAX_KEY_LIMIT`].
    #[serde(default = "one")]
    pub limit: u32,
    /// What a submission does when its key already runs `limit` tasks.
    #[serde(default)]
    pub when_busy: WhenBusy,
    /// Whose keys these are: workflows that name the same scope share their keys (and each
    /// applies its own `limit`). Absent: the workflow's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// The largest `limit` a concurrency key may have (one item holds its slots).
pub const MAX_KEY_LIMIT: u32 = 100;

/// What a submission whose key is busy does.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenBusy {
    /// The task is created and waits, in submission order, until a task of its key ends.
    #[default]
    Wait,
    /// The submission is refused (`Rejected`, with the reason): no task is created.
    Refuse,
    /// The task waits, and replaces the tasks of its key that wait (they end `Cancelled` without
    /// having run): at most one waits, the latest ("debounce").
    Replace,
    /// The task waits at the head, the tasks of its key that wait are cancelled, and those that run
    /// are cancelled (their completed steps compensated): the latest wins.
    Cancel,
}

impl WhenBusy {
    pub fn as_str(self) -> &'static str {
        match self {
            WhenBusy::Wait => "wait",
            WhenBusy::Refuse => "refuse",
            WhenBusy::Replace => "replace",
            WhenBusy::Cancel => "cancel",
        }
    }
}

impl Concurrency {
    /// The problem with this key's definition, if any.
    pub fn problem(&self) -> Option<String> {
        match DataPath::parse(&self.key) {
            Err(e) => return Some(format!("concurrency.key {:?}: {e}", self.key)),
            Ok(p) if p.root() != Root::Input => {
                return Some(format!(
                    "concurrency.key {:?} must read the input ($.input...): it is read when the task is submitted",
                    self.key
                ))
            }
            Ok(_) => {}
        }
        if self.limit == 0 || self.limit > MAX_KEY_LIMIT {
            return Some(format!("concurrency.limit is {}; it must be from 1 to {}", self.limit, MAX_KEY_LIMIT));
        }
        if let Some(scope) = &self.scope {
            if let Err(e) = check_name("concurrency.scope", scope) {
                return Some(e.to_string());
            }
        }
        None
    }
}

/// A workflow's answer to a step that failed for good.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Undo the completed steps in reverse order; the task ends `Compensated`.
    #[default]
    Compensate,
    /// Park the task in `Error` with an operator alert; an operator resubmits it (it resumes
    /// from the failed step) or cancels it (its completed steps are compensated).
    Error,
}

impl OnFailure {
    pub fn is_default(&self) -> bool {
        *self == OnFailure::Compensate
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkflowError {
    #[error("workflow {workflow}: {source}")]
    Name {
        workflow: String,
        #[source]
        source: IdError,
    },
    #[error("workflow {0} has no steps")]
    NoSteps(String),
    #[error("workflow {workflow}: step name {step} is used twice")]
    DuplicateStep { workflow: String, step: String },
    #[error("workflow {workflow}, step {step}: {problem}")]
    Step { workflow: String, step: String, problem: String },
    /// A problem of the workflow as a whole (its result).
    #[error("workflow {workflow}: {problem}")]
    Workflow { workflow: String, problem: String },
    #[error("workflow {name} version {version} is defined twice")]
    DuplicateVersion { name: String, version: u32 },
    /// Not JSON, or JSON that does not fit the file's format (the error names where).
    #[error("workflow configuration: {0}")]
    Json(crate::config_file::ParseError),
    #[error("cannot read workflow file {path}: {message}")]
    Io { path: String, message: String },
    /// A file that was read but is not a valid configuration (a function refuses to start).
    #[error("workflow file {path} is not valid: {source}")]
    File {
        path: String,
        #[source]
        source: Box<WorkflowError>,
    },
}

/// Whether step `s` sets variable `var`: its `assign`, or a step of its loop's inline body (an
/// inline body's variables come back to its workflow when each iteration ends).
fn sets_var(s: &StepDef, var: &str) -> bool {
    s.assign.as_ref().is_some_and(|t| t.sets(var))
        || s.kind
            .loop_spec()
            .filter(|l| l.inline)
            .and_then(|l| l.body.child.as_ref())
            .is_some_and(|b| b.steps.iter().any(|x| sets_var(x, var)))
}

/// The variables step `s` sets (see [`sets_var`]).
fn assigned_names(s: &StepDef) -> Vec<String> {
    let mut names: Vec<String> =
        s.assign.as_ref().and_then(TaskTemplate::top_level_names).into_iter().flatten().map(str::to_owned).collect();
    if let Some(b) = s.kind.loop_spec().filter(|l| l.inline).and_then(|l| l.body.child.as_ref()) {
        names.extend(b.steps.iter().flat_map(assigned_names));
    }
    names
}

/// Why `what` cannot read `path`, whose root is a loop's iteration or a variable: no step sets a
/// variable yet (`assign`), and no step runs in a loop's body.
fn unset_path(what: &str, path: &DataPath, root: Root<'_>) -> String {
    match root {
        Root::Var(name) => {
            format!("{what} reads {path}, and no step before it sets {name} (assign): it can never resolve")
        }
        _ => format!("{what} reads {path}, and it is not in a loop's body: $.loop is read by a loop's steps and guard"),
    }
}

impl StepDef {
    /// A `call` step with the defaults: 3 attempts, the default backoff, no compensation.
    pub fn call(name: &str, agent: &str, timeout_ms: u64) -> StepDef {
        StepDef::of_kind(name, StepKind::Call { agent: agent.to_owned() }, timeout_ms, 3)
    }

    /// A `wait` step of `wait_ms`.
    pub fn wait(name: &str, wait_ms: u64) -> StepDef {
        StepDef::of_kind(name, StepKind::Wait(WaitTime::Ms(wait_ms)), 0, 1)
    }

    /// A step of `kind` with the other fields' defaults.
    pub fn of_kind(name: &str, kind: StepKind, timeout_ms: u64, max_attempts: u32) -> StepDef {
        StepDef {
            name: name.to_owned(),
            after: None,
            kind,
            timeout_ms,
            schedule_to_start_ms: None,
            max_attempts,
            backoff: Backoff::default(),
            compensation: None,
            map: None,
            when: None,
            on_failure: StepFailure::Fail,
            retry_on: None,
            parameters: None,
            result_selector: None,
            assign: None,
        }
    }

    /// The agent that performs each attempt (see [`StepKind::agent`]).
    pub fn agent(&self) -> Option<&str> {
        self.kind.agent()
    }

    /// The values its kind's fields take: their bounds, and the forms of a wait's time.
    fn validate_kind(&self) -> Result<(), String> {
        let timeout_ms = self.timeout_ms;
        match &self.kind {
            StepKind::Call { .. } => {
                if timeout_ms == 0 || timeout_ms > MAX_STEP_TIMEOUT_MS {
                    return Err(format!("timeout_ms {timeout_ms} is outside 1..={MAX_STEP_TIMEOUT_MS}"));
                }
            }
            StepKind::Callback { heartbeat_ms, .. } => {
                if timeout_ms == 0 {
                    return Err("a callback step needs timeout_ms, its hard timeout: an answer that never comes must end the wait".into());
                }
                if timeout_ms > MAX_LONG_STEP_MS {
                    return Err(format!("timeout_ms {timeout_ms} is over {MAX_LONG_STEP_MS} (366 days)"));
                }
                if let Some(hb) = *heartbeat_ms {
                    if hb < MIN_HEARTBEAT_MS || hb >= timeout_ms {
                        return Err(format!(
                            "heartbeat_ms {hb} must be at least {MIN_HEARTBEAT_MS} and below timeout_ms {timeout_ms}"
                        ));
                    }
                }
            }
            StepKind::Workflow(_) => {
                if timeout_ms > MAX_LONG_STEP_MS {
                    return Err(format!("timeout_ms {timeout_ms} is over {MAX_LONG_STEP_MS} (366 days)"));
                }
                if self.compensation.is_some() || self.max_attempts != 1 {
                    return Err(
                        "a workflow step takes no compensation and no retries: its child undoes its own steps, \
                                and retries its own"
                            .into(),
                    );
                }
            }
            StepKind::Loop(l) => {
                if self.compensation.is_some() || self.max_attempts != 1 {
                    return Err("a loop step takes no compensation and no retries: its iterations undo their own \
                                steps, and its steps retry their own"
                        .into());
                }
                if self.map.is_some() {
                    return Err("a loop step cannot be a map (a map's element may be a workflow with a loop)".into());
                }
                if !(1..=MAX_LOOP_ITERATIONS).contains(&l.max_iterations) {
                    return Err(format!(
                        "max_iterations {} is outside 1..={MAX_LOOP_ITERATIONS}: a loop needs a bound",
                        l.max_iterations
                    ));
                }
                if timeout_ms > MAX_LONG_STEP_MS {
                    return Err(format!("timeout_ms {timeout_ms} is over {MAX_LONG_STEP_MS} (366 days)"));
                }
                let timeout = if timeout_ms == 0 { DEFAULT_MAP_TIMEOUT_MS } else { timeout_ms };
                if let Some(w) = l.wait_ms {
                    let waits = w.saturating_mul(u64::from(l.max_iterations.saturating_sub(1)));
                    if w == 0 || waits > timeout {
                        return Err(format!(
                            "wait_ms {w} between {} iterations waits {waits} ms in all, and the loop's timeout_ms is \
                             {timeout}{}: raise timeout_ms (at most {MAX_LONG_STEP_MS}) or lower max_iterations",
                            l.max_iterations,
                            if timeout_ms == 0 { " (the default)" } else { "" }
                        ));
                    }
                }
            }
            StepKind::Wait(time) => {
                if self.compensation.is_some() {
                    return Err("a wait step has nothing to undo: it takes no compensation".into());
                }
                match time {
                    WaitTime::Ms(ms) if *ms > MAX_LONG_STEP_MS => {
                        return Err(format!("wait_ms {ms} is over {MAX_LONG_STEP_MS} (366 days)"))
                    }
                    WaitTime::Ms(_) => {}
                    WaitTime::Until(p) if p.starts_with('/') || crate::ids::rfc3339_millis(p).is_some() => {}
                    WaitTime::Until(p) => {
                        return Err(format!(
                            "wait_until {p:?} must be a JSON pointer (/input/...) or an RFC 3339 time (2026-12-24T18:00:00Z)"
                        ))
                    }
                    WaitTime::SecondsAt(p) if p.starts_with('/') => {}
                    WaitTime::SecondsAt(p) => return Err(format!("wait_for {p:?} must be a JSON pointer (/input/...)")),
                }
            }
        }
        Ok(())
    }

    fn validate(&self, workflow: &str) -> Result<(), WorkflowError> {
        let problem =
            |p: String| WorkflowError::Step { workflow: workflow.to_owned(), step: self.name.clone(), problem: p };
        check_name("step name", &self.name).map_err(|e| problem(e.to_string()))?;
        self.validate_kind().map_err(problem)?;
        if let Some(assign) = &self.assign {
            let names = assign.top_level_names().ok_or_else(|| {
                problem(
                    "assign names each variable it sets ({\"token.$\": \"$.outputs.list.next\"}): a * or *.choose \
                     at its top is not taken"
                        .into(),
                )
            })?;
            for name in names {
                check_name("variable name", name).map_err(|e| problem(format!("assign: {e}")))?;
            }
            let literal = crate::messages::json_len(&assign.0.to_json());
            if assign.0.paths().is_empty() && literal > MAX_VARS_BYTES {
                return Err(problem(format!(
                    "assign sets {literal} bytes; a task's variables take at most {MAX_VARS_BYTES}"
                )));
            }
        }
        if self.schedule_to_start_ms.is_some_and(|b| b > MAX_QUEUE_BUDGET_MS) {
            return Err(problem(format!("schedule_to_start_ms is over {MAX_QUEUE_BUDGET_MS}")));
        }
        if self.schedule_to_start_ms.is_some_and(|b| b > 0 && b < MIN_QUEUE_BUDGET_MS) {
            // a request not started by then is claimed again: at most once a second
            return Err(problem(format!(
                "schedule_to_start_ms must be 0 (no budget) or at least {MIN_QUEUE_BUDGET_MS}"
            )));
        }
        if self.max_attempts == 0 {
            return Err(problem("max_attempts must be at least 1".into()));
        }
        if self.backoff.max_ms > MAX_BACKOFF_MS || self.backoff.base_ms > self.backoff.max_ms {
            return Err(problem(format!(
                "backoff needs base_ms <= max_ms <= {MAX_BACKOFF_MS} (got {} and {})",
                self.backoff.base_ms, self.backoff.max_ms
            )));
        }
        if !(self.backoff.multiplier >= 1.0 && self.backoff.multiplier <= 10.0) {
            return Err(problem("backoff multiplier must be within 1..=10".into()));
        }
        if let Some(m) = &self.map {
            // a workflow step's are filled as each child is created, from the task's data too
            // (the element's own $.task: its id, and the root task's)
            let reads_outputs = self
                .parameters
                .iter()
                .flat_map(|t| t.0.paths())
                .find(|p| !matches!(p.root(), Root::Input | Root::Task));
            if let Some(p) = reads_outputs.filter(|_| !self.kind.starts_a_workflow()) {
                return Err(problem(format!(
                    "a map step's parameters are filled for each element, from its $.input.item and $.input.index \
                     (and its $.task): {p} is not there"
                )));
            }
            if !self.on_failure.is_fail() {
                return Err(problem(
                    "a map step takes no on_failure: map.tolerated_failures says how many elements may fail".into(),
                ));
            }
            m.validate().map_err(problem)?;
            if !self.kind.may_map() {
                return Err(problem(format!("a {} step cannot be a map", self.kind.name())));
            }
        }
        if let Some(c) = &self.compensation {
            if c.map.is_some() {
                return Err(problem(
                    "a compensation cannot be a map (a map step's compensation undoes each element)".into(),
                ));
            }
            if c.compensation.is_some() {
                return Err(problem("a compensating step cannot have a compensation".into()));
            }
            if !c.kind.may_compensate() {
                return Err(problem(format!("a compensation cannot be a {} step", c.kind.name())));
            }
            if c.after.is_some() {
                return Err(problem(
                    "a compensation takes no after: compensations run in the reverse of the steps' order".into(),
                ));
            }
            if c.when.is_some() || !c.on_failure.is_fail() {
                return Err(problem(
                    "a compensation takes no when or on_failure: it runs whenever its step is undone, and its \
                     failure leaves the task in Error"
                        .into(),
                ));
            }
            if c.assign.is_some() {
                return Err(problem(
                    "a compensation takes no assign: the task reads no variable once it undoes".into(),
                ));
            }
            c.validate(workflow)?;
        }
        Ok(())
    }
}

impl WorkflowDef {
    /// The first rule this workflow breaks, if any (see [`WorkflowDef::problems`]).
    pub fn validate(&self) -> Result<(), WorkflowError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every rule this workflow breaks, in the order of its steps: each step's first mistake (a
    /// step's fields are checked in order, and a later check may assume an earlier one held),
    /// every name used twice, every path that can never resolve. Steps whose `after` lists cannot
    /// run are the last thing named: the checks that need the graph need it whole.
    pub fn problems(&self) -> Vec<WorkflowError> {
        self.problems_in(None)
    }

    /// [`WorkflowDef::problems`] of a workflow, or of a loop's inline body (`in_loop`: the
    /// variables its workflow may have set when the loop starts), whose steps may read `$.loop`.
    fn problems_in(&self, in_loop: Option<&HashSet<String>>) -> Vec<WorkflowError> {
        let mut out = Vec::new();
        if let Err(source) = check_name("workflow name", &self.name) {
            out.push(WorkflowError::Name { workflow: self.name.clone(), source });
        }
        if self.steps.is_empty() {
            out.push(WorkflowError::NoSteps(self.name.clone()));
            return out;
        }
        if let Some(problem) = self.concurrency.as_ref().and_then(Concurrency::problem) {
            out.push(WorkflowError::Workflow { workflow: self.name.clone(), problem });
        }
        let mut seen = HashSet::new();
        for s in &self.steps {
            if let Err(e) = s.validate(&self.name) {
                out.push(e);
            }
            if (s.map.is_some() || s.kind.starts_a_workflow()) && self.on_failure == OnFailure::Error {
                out.push(WorkflowError::Step {
                    workflow: self.name.clone(),
                    step: s.name.clone(),
                    problem: "a map step needs on_failure: compensate (an Error task cannot yet resume a map)".into(),
                });
            }
            if s.kind.loop_spec().is_some() && self.on_failure == OnFailure::Error {
                out.push(WorkflowError::Step {
                    workflow: self.name.clone(),
                    step: s.name.clone(),
                    problem: "a loop step needs on_failure: compensate (an Error task cannot yet resume a loop)".into(),
                });
            }
            let names = std::iter::once(&s.name).chain(s.compensation.as_ref().map(|c| &c.name));
            for n in names {
                if !seen.insert(n.clone()) {
                    out.push(WorkflowError::DuplicateStep { workflow: self.name.clone(), step: n.clone() });
                }
            }
        }
        let graph = match self.graph() {
            Ok(g) => g,
            Err(e) => {
                out.push(e);
                return out;
            }
        };
        self.guard_problems(&graph, in_loop, &mut out);
        self.body_problems(&graph, in_loop, &mut out);
        for region in graph.regions() {
            for s in self.steps[region.clone()].iter().filter(|s| !assigned_names(s).is_empty()) {
                out.push(WorkflowError::Step {
                    workflow: self.name.clone(),
                    step: s.name.clone(),
                    problem: "a step that runs beside others takes no assign: it runs as a task of its own (a \
                              branch), and its variables would not come back"
                        .into(),
                });
            }
        }
        if self.on_failure == OnFailure::Error {
            for region in graph.regions() {
                out.push(WorkflowError::Step {
                    workflow: self.name.clone(),
                    step: self.steps[region.start].name.clone(),
                    problem: "steps that run beside each other need on_failure: compensate (an Error task cannot \
                              yet resume its branches)"
                        .into(),
                });
            }
        }
        out
    }

    /// Every path a guard reads must be able to resolve when the guard is decided: the input, or
    /// the output of a step its step comes after. Each path that cannot is one problem.
    fn guard_problems(&self, graph: &StepGraph, in_loop: Option<&HashSet<String>>, out: &mut Vec<WorkflowError>) {
        let problem = |step: &str, p: String| WorkflowError::Step {
            workflow: self.name.clone(),
            step: step.to_owned(),
            problem: p,
        };
        // in a loop's body: the variables set before the loop, or by any of its steps (an
        // iteration reads what the iterations before it set)
        let outer = |var: &str| in_loop.is_some_and(|o| o.contains(var) || self.steps.iter().any(|x| sets_var(x, var)));
        for (i, s) in self.steps.iter().enumerate() {
            if let Some(l) = s.kind.loop_spec() {
                self.loop_guard_problems(graph, i, l, &outer, out);
            }
            let guard = s.when.iter().flat_map(|w| w.paths()).map(|p| ("when", p, false));
            // a loop's parameters are filled for each iteration: they may read $.loop
            let iterates = s.kind.loop_spec().is_some();
            let sent = s
                .parameters
                .iter()
                .flat_map(|t| t.0.paths())
                .filter(|p| !(iterates && matches!(p.root(), Root::LoopIndex | Root::LoopPrevious)));
            let sent = sent.map(|p| ("parameters", p, false));
            // a compensation reads the outputs of its step and of those before it
            let undo = s.compensation.iter().flat_map(|c| c.parameters.iter()).flat_map(|t| t.0.paths());
            let undo = undo.map(|p| ("its compensation's parameters", p, true));
            // assign is filled once the step's output is kept: it reads that output too
            let assigned = s.assign.iter().flat_map(|t| t.0.paths()).map(|p| ("assign", p, true));
            for (what, path, own) in guard.chain(sent).chain(undo).chain(assigned) {
                let name = match path.root() {
                    Root::Output(name) => name,
                    Root::Input | Root::Task => continue,
                    Root::LoopIndex | Root::LoopPrevious if in_loop.is_some() => continue,
                    Root::Var(var) if outer(var) => continue,
                    Root::Var(var) => {
                        let sets = |j: usize| sets_var(&self.steps[j], var);
                        if !(0..self.steps.len()).any(|j| sets(j) && (graph.comes_before(j, i) || (own && j == i))) {
                            out.push(problem(&s.name, unset_path(what, path, Root::Var(var))));
                        }
                        continue;
                    }
                    other => {
                        out.push(problem(&s.name, unset_path(what, path, other)));
                        continue;
                    }
                };
                match self.steps.iter().position(|d| d.name == name) {
                    None => out.push(problem(
                        &s.name,
                        format!("{what} reads {path}, and the workflow has no step {name:?}: it can never resolve"),
                    )),
                    Some(j) if !(graph.comes_before(j, i) || (own && j == i)) => out.push(problem(
                        &s.name,
                        format!(
                            "{what} reads {path}, and step {name} does not come before {} (name it in after, or \
                             in after of a step before): its output can never be there when it is read",
                            s.name
                        ),
                    )),
                    Some(_) => {}
                }
            }
        }
        for path in self.result.iter().flat_map(|t| t.0.paths()) {
            match path.root() {
                Root::Output(name) if !self.steps.iter().any(|d| d.name == name) => {
                    out.push(problem(name, format!("the workflow's result reads {path}, and there is no such step")));
                }
                Root::Input | Root::Task | Root::Output(_) => {}
                Root::Var(var) if self.steps.iter().any(|d| sets_var(d, var)) => {}
                other => out.push(WorkflowError::Workflow {
                    workflow: self.name.clone(),
                    problem: unset_path("the workflow's result", path, other),
                }),
            }
        }
    }

    /// A loop's guard reads what it can: the task's input, the outputs of the steps before the
    /// loop, its own output (`$.outputs.<loop>`, the last iteration's), `$.loop.*` and the
    /// variables set before it or by its body. And at least one thing an iteration changes:
    /// otherwise it decides the same every time, and the loop runs to its bound or not at all.
    fn loop_guard_problems(
        &self,
        graph: &StepGraph,
        i: usize,
        l: &LoopSpec,
        outer: &dyn Fn(&str) -> bool,
        out: &mut Vec<WorkflowError>,
    ) {
        let s = &self.steps[i];
        let problem = |p: String| WorkflowError::Step { workflow: self.name.clone(), step: s.name.clone(), problem: p };
        let what = match l.guard {
            LoopGuard::While(_) => "while",
            LoopGuard::Until(_) => "until",
        };
        let body_sets =
            |v: &str| l.inline && l.body.child.as_ref().is_some_and(|b| b.steps.iter().any(|x| sets_var(x, v)));
        let mut changes = false;
        for path in l.guard.condition().paths() {
            match path.root() {
                Root::LoopIndex | Root::LoopPrevious => changes = true,
                Root::Output(name) if name == s.name => changes = true,
                Root::Var(v) if body_sets(v) => changes = true,
                Root::Input | Root::Task => {}
                Root::Var(v) => {
                    let before = (0..i).any(|j| sets_var(&self.steps[j], v) && graph.comes_before(j, i));
                    if !before && !outer(v) {
                        out.push(problem(unset_path(what, path, Root::Var(v))));
                    }
                }
                Root::Output(name) => match self.steps.iter().position(|d| d.name == name) {
                    Some(j) if graph.comes_before(j, i) => {}
                    _ => out.push(problem(format!(
                        "{what} reads {path}, and step {name} does not come before the loop: its output can never \
                         be there when the guard is decided"
                    ))),
                },
            }
        }
        if !changes {
            out.push(problem(format!(
                "{what} reads nothing an iteration changes ($.loop.index, $.outputs.{}…, or a variable its body \
                 sets): it would decide the same every time",
                s.name
            )));
        }
    }

    /// The problems of each loop's inline body, named as the loop step's (a named body is a
    /// workflow of the file, checked as one).
    fn body_problems(&self, graph: &StepGraph, in_loop: Option<&HashSet<String>>, out: &mut Vec<WorkflowError>) {
        for (i, s) in self.steps.iter().enumerate() {
            let Some(l) = s.kind.loop_spec().filter(|l| l.inline) else { continue };
            let Some(body) = &l.body.child else { continue };
            // the variables the body may find set: those of the steps before the loop
            let mut vars: HashSet<String> = in_loop.cloned().unwrap_or_default();
            for (j, d) in self.steps.iter().enumerate().filter(|(j, _)| graph.comes_before(*j, i)) {
                let _ = j;
                vars.extend(assigned_names(d));
            }
            for e in body.problems_in(Some(&vars)) {
                let problem = match e {
                    WorkflowError::Step { step, problem, .. } => format!("its body's step {step}: {problem}"),
                    WorkflowError::DuplicateStep { step, .. } => format!("its body names step {step} twice"),
                    WorkflowError::Workflow { problem, .. } => format!("its body: {problem}"),
                    other => format!("its body: {other}"),
                };
                out.push(WorkflowError::Step { workflow: self.name.clone(), step: s.name.clone(), problem });
            }
        }
    }

    /// How many levels of child tasks a task of this workflow makes (see [`MAX_CHILD_LEVELS`]):
    /// a map's elements, a region's branches, a workflow step's child and a loop's iterations are
    /// one level each, plus what they make. Named children count once resolved.
    pub fn child_levels(&self) -> usize {
        let regions = self.regions();
        self.steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let own = if s.map.is_some() || s.kind.child_def().is_some() {
                    1 + s.kind.child_def().and_then(|c| c.child.as_ref()).map_or(0, |c| c.child_levels())
                } else {
                    0
                };
                own + usize::from(regions.iter().any(|r| r.contains(&i)))
            })
            .max()
            .unwrap_or(0)
    }

    /// The steps as a graph (see [`crate::graph`]), or why their `after` lists cannot run.
    pub fn graph(&self) -> Result<StepGraph, WorkflowError> {
        StepGraph::of(self.steps.iter().map(|s| (s.name.as_str(), s.after.as_deref()))).map_err(|e| {
            WorkflowError::Step { workflow: self.name.clone(), step: e.step().to_owned(), problem: e.to_string() }
        })
    }

    /// The parallel region (a range of step indexes) whose first step is `head`, if there is one.
    pub fn region_at(&self, head: usize) -> Option<std::ops::Range<usize>> {
        self.regions().into_iter().find(|r| r.start == head)
    }

    /// The parallel regions (ranges of step indexes), in order.
    pub fn regions(&self) -> Vec<std::ops::Range<usize>> {
        if self.steps.iter().all(|s| s.after.is_none()) {
            return Vec::new(); // a plain sequence: the common case costs nothing
        }
        self.graph().map(|g| g.regions()).unwrap_or_default()
    }

    /// Every agent name the workflow uses, compensations included.
    pub fn agents(&self) -> impl Iterator<Item = &str> {
        self.steps
            .iter()
            .flat_map(|s| std::iter::once(s).chain(s.compensation.as_deref()))
            .filter_map(|s| s.kind.agent())
    }
}

/// The deployed set of workflows, by name and version.
#[derive(Debug, Clone, Default)]
pub struct WorkflowRegistry {
    by_name: HashMap<String, BTreeMap<u32, WorkflowDef>>,
}

/// Workflow `name@version` with the definition of every workflow it calls filled in (its workflow
/// steps' `child`, and theirs), or why it cannot be: a call of a workflow that is not defined, a
/// cycle of workflows calling each other, calls deeper than [`MAX_WORKFLOW_DEPTH`].
fn resolve_calls(
    all: &HashMap<String, BTreeMap<u32, WorkflowDef>>,
    name: &str,
    version: u32,
    calling: &mut Vec<String>,
) -> Result<WorkflowDef, WorkflowError> {
    let mut def = all.get(name).and_then(|v| v.get(&version)).cloned().expect("called with a defined workflow");
    calling.push(format!("{name}@{version}"));
    resolve_steps(all, name, &mut def.steps, calling)?;
    calling.pop();
    Ok(def)
}

/// [`resolve_calls`] for the steps of workflow `name` (or of a loop's inline body in it): each
/// workflow step's child and each loop's named body filled in, and an inline body's own calls.
fn resolve_steps(
    all: &HashMap<String, BTreeMap<u32, WorkflowDef>>,
    name: &str,
    steps: &mut [StepDef],
    calling: &mut Vec<String>,
) -> Result<(), WorkflowError> {
    for s in steps {
        let step = s.name.clone();
        let problem = |p: String| WorkflowError::Step { workflow: name.to_owned(), step: step.clone(), problem: p };
        let call = match &mut s.kind {
            StepKind::Workflow(call) => call,
            StepKind::Loop(l) if !l.inline => &mut l.body,
            StepKind::Loop(l) => {
                let body = l.body.child.as_mut().expect("an inline body is compiled as it is read");
                if calling.len() >= MAX_WORKFLOW_DEPTH {
                    return Err(problem(format!(
                        "workflows and loops nest {} deep here ({} -> the body of loop {step}); at most \
                         {MAX_WORKFLOW_DEPTH}",
                        calling.len() + 1,
                        calling.join(" -> ")
                    )));
                }
                let body_name = format!("{name}.{step}");
                calling.push(body_name.clone());
                resolve_steps(all, &body_name, &mut body.steps, calling)?;
                calling.pop();
                continue;
            }
            StepKind::Call { .. } | StepKind::Callback { .. } | StepKind::Wait(_) => continue,
        };
        let (child, v) = (call.workflow.clone(), call.version);
        if all.get(&child).and_then(|vs| vs.get(&v)).is_none() {
            return Err(problem(format!("it runs workflow {child} version {v}, which is not defined")));
        }
        let callee = format!("{child}@{v}");
        if let Some(at) = calling.iter().position(|c| *c == callee) {
            let cycle: Vec<&str> = calling[at..].iter().map(String::as_str).chain([callee.as_str()]).collect();
            return Err(problem(format!("workflows call each other in a cycle: {}", cycle.join(" -> "))));
        }
        if calling.len() >= MAX_WORKFLOW_DEPTH {
            return Err(problem(format!(
                "workflows call workflows {} deep here ({} -> {callee}); at most {MAX_WORKFLOW_DEPTH}",
                calling.len() + 1,
                calling.join(" -> ")
            )));
        }
        call.child = Some(Box::new(resolve_calls(all, &child, v, calling)?));
    }
    Ok(())
}

/// A workflow's `defaults`: values its steps take for the fields they do not set, so that a file
/// does not repeat its retry policy on every step. Call and callback steps take `timeout_ms`,
/// `schedule_to_start_ms`, `max_attempts` and `backoff` (callback steps `heartbeat_ms` too);
/// compensation steps take `compensation`'s values first, then the others. Wait steps take none.
/// Applied as the file is read ([`apply_defaults`]): a task's definition holds the result.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct StepDefaults {
    pub timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    pub schedule_to_start_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub backoff: Option<Backoff>,
    /// What compensation steps take before the values above.
    pub compensation: Option<Box<StepDefaults>>,
}

/// The fields [`StepDefaults`] fills, and the step kinds that take each.
const DEFAULTED: &[(&str, &[&str])] = &[
    ("timeout_ms", &["call", "callback"]),
    ("heartbeat_ms", &["callback"]),
    ("schedule_to_start_ms", &["call", "callback"]),
    ("max_attempts", &["call", "callback"]),
    ("backoff", &["call", "callback"]),
];

/// Fill the steps of one workflow of a file (`workflow`, at `at` in the file) from its
/// `defaults`, which is taken out (checked first: a mistake there is named at its own path).
pub fn apply_defaults(workflow: &mut Value, at: &str) -> Result<(), crate::config_file::ParseError> {
    let Some(obj) = workflow.as_object_mut() else { return Ok(()) };
    let Some(defaults) = obj.remove("defaults") else { return Ok(()) };
    let checked: StepDefaults = crate::config_file::parse_value(&defaults, &format!("{at}.defaults"))?;
    if checked.compensation.as_ref().is_some_and(|c| c.compensation.is_some()) {
        return Err(crate::config_file::ParseError::Shape {
            path: format!("{at}.defaults.compensation.compensation"),
            message: "compensation steps have no compensation of their own".into(),
        });
    }
    let for_compensation = defaults.get("compensation").cloned().unwrap_or(Value::Null);
    let fill = |step: &mut Value, first: Option<&Value>| {
        let Some(step) = step.as_object_mut() else { return };
        let kind = step.get("kind").and_then(Value::as_str).unwrap_or("call").to_owned();
        for (field, kinds) in DEFAULTED {
            if step.contains_key(*field) || !kinds.contains(&kind.as_str()) {
                continue;
            }
            let value = first.and_then(|f| f.get(*field)).or_else(|| defaults.get(*field));
            if let Some(v) = value {
                step.insert((*field).to_owned(), v.clone());
            }
        }
    };
    // a loop's inline body takes its workflow's defaults too
    let mut steps: Vec<&mut Value> = obj.get_mut("steps").and_then(Value::as_array_mut).into_iter().flatten().collect();
    while let Some(step) = steps.pop() {
        fill(step, None);
        let Some(step) = step.as_object_mut() else { continue };
        if let Some(c) = step.get_mut("compensation") {
            fill(c, Some(&for_compensation));
        }
        if let Some(Value::Array(body)) = step.get_mut("body") {
            steps.extend(body.iter_mut());
        }
    }
    Ok(())
}

/// The configuration file's shape: `{"workflows": [ ... ]}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowFile {
    /// The JSON Schema an editor checks the file against; not read here.
    #[serde(rename = "$schema", default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    _schema: Option<serde::de::IgnoredAny>,
    workflows: Vec<WorkflowDef>,
}

/// The definitions compiled into every binary.
pub const BUILT_IN_WORKFLOWS: &str = include_str!("../../../config/workflows.json");

impl WorkflowRegistry {
    pub fn new(defs: impl IntoIterator<Item = WorkflowDef>) -> Result<Self, WorkflowError> {
        let mut by_name: HashMap<String, BTreeMap<u32, WorkflowDef>> = HashMap::new();
        for d in defs {
            d.validate()?;
            let versions = by_name.entry(d.name.clone()).or_default();
            if versions.contains_key(&d.version) {
                return Err(WorkflowError::DuplicateVersion { name: d.name, version: d.version });
            }
            versions.insert(d.version, d);
        }
        let mut resolved = by_name.clone();
        for (name, versions) in &by_name {
            for version in versions.keys() {
                let def = resolve_calls(&by_name, name, *version, &mut Vec::new())?;
                let levels = def.child_levels();
                if levels > MAX_CHILD_LEVELS {
                    return Err(WorkflowError::Workflow {
                        workflow: name.clone(),
                        problem: format!(
                            "its tasks would nest {levels} levels deep (each map, parallel region, workflow step and \
                             loop runs its work as child tasks, and theirs as grandchildren); at most \
                             {MAX_CHILD_LEVELS}: call a workflow with a map or a loop from the top, not from inside \
                             another"
                        ),
                    });
                }
                resolved.get_mut(name).expect("listed").insert(*version, def);
            }
        }
        Ok(WorkflowRegistry { by_name: resolved })
    }

    pub fn from_json(json: &str) -> Result<Self, WorkflowError> {
        let mut file: Value = crate::config_file::parse(json).map_err(WorkflowError::Json)?;
        let list = file.get_mut("workflows").and_then(Value::as_array_mut);
        for (i, w) in list.into_iter().flatten().enumerate() {
            apply_defaults(w, &format!("workflows[{i}]")).map_err(WorkflowError::Json)?;
        }
        let f: WorkflowFile = crate::config_file::parse_value(&file, "").map_err(WorkflowError::Json)?;
        Self::new(f.workflows)
    }

    /// The built-in definitions, or the file named by `SAS_WORKFLOWS_FILE` when it is set (the
    /// functions: `/opt/workflows.json`, the configuration layer's).
    pub fn from_env() -> Result<Self, WorkflowError> {
        match std::env::var("SAS_WORKFLOWS_FILE") {
            Ok(path) if !path.is_empty() => Self::from_file(&path),
            _ => Self::from_json(BUILT_IN_WORKFLOWS),
        }
    }

    /// The definitions of a workflows file; an error names the file.
    pub fn from_file(path: &str) -> Result<Self, WorkflowError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| WorkflowError::Io { path: path.to_owned(), message: e.to_string() })?;
        Self::from_json(&text).map_err(|e| WorkflowError::File { path: path.to_owned(), source: Box::new(e) })
    }

    /// The named workflow at `version`, or its latest version when none is given.
    pub fn resolve(&self, name: &str, version: Option<u32>) -> Option<&WorkflowDef> {
        let versions = self.by_name.get(name)?;
        match version {
            Some(v) => versions.get(&v),
            None => versions.values().next_back(),
        }
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_name.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn all(&self) -> impl Iterator<Item = &WorkflowDef> {
        self.by_name.values().flat_map(BTreeMap::values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn step(name: &str) -> StepDef {
        StepDef::call(name, "sim", 1_000)
    }

    #[test]
    fn built_in_workflows_are_valid() {
        let r = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap();
        assert!(r.resolve("order", None).is_some());
    }

    #[test]
    fn a_missing_or_invalid_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("sas-wf-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.json").to_string_lossy().into_owned();
        let e = WorkflowRegistry::from_file(&missing).unwrap_err();
        assert!(e.to_string().starts_with(&format!("cannot read workflow file {missing}: ")), "{e}");
        let bad = dir.join("workflows.json");
        std::fs::write(&bad, r#"{"workflows": [{"name": "x"#).unwrap();
        let bad = bad.to_string_lossy().into_owned();
        let e = WorkflowRegistry::from_file(&bad).unwrap_err();
        assert!(e.to_string().starts_with(&format!("workflow file {bad} is not valid: ")), "{e}");
        std::fs::write(&bad, r#"{"workflows": [{"name": "x", "version": 1, "steps": []}]}"#).unwrap();
        let e = WorkflowRegistry::from_file(&bad).unwrap_err();
        assert_eq!(e.to_string(), format!("workflow file {bad} is not valid: workflow x has no steps"));
        std::fs::write(&bad, BUILT_IN_WORKFLOWS).unwrap();
        assert!(WorkflowRegistry::from_file(&bad).unwrap().resolve("order", None).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn latest_version_is_resolved_by_default() {
        let mut a = WorkflowDef {
            concurrency: None,
            result: None,
            name: "w".into(),
            version: 1,
            description: String::new(),
            on_failure: OnFailure::Compensate,
            steps: vec![step("a")],
        };
        let r = WorkflowRegistry::new([a.clone(), {
            a.version = 3;
            a.clone()
        }])
        .unwrap();
        assert_eq!(r.resolve("w", None).unwrap().version, 3);
        assert_eq!(r.resolve("w", Some(1)).unwrap().version, 1);
        assert!(r.resolve("w", Some(2)).is_none());
        assert!(r.resolve("x", None).is_none());
    }

    #[test]
    fn invalid_definitions_are_refused() {
        let mut w = WorkflowDef {
            concurrency: None,
            result: None,
            name: "w".into(),
            version: 1,
            description: String::new(),
            on_failure: OnFailure::Compensate,
            steps: vec![],
        };
        assert_eq!(w.validate(), Err(WorkflowError::NoSteps("w".into())));
        w.steps = vec![step("a"), step("a")];
        assert!(matches!(w.validate(), Err(WorkflowError::DuplicateStep { .. })));
        let mut s = step("a");
        s.compensation = Some(Box::new(step("a")));
        w.steps = vec![s];
        assert!(matches!(w.validate(), Err(WorkflowError::DuplicateStep { .. })));
        let mut s = step("a");
        s.timeout_ms = MAX_STEP_TIMEOUT_MS + 1;
        w.steps = vec![s];
        assert!(matches!(w.validate(), Err(WorkflowError::Step { .. })));
        let mut s = step("a");
        s.max_attempts = 0;
        w.steps = vec![s];
        assert!(matches!(w.validate(), Err(WorkflowError::Step { .. })));
    }

    #[test]
    fn each_step_kind_needs_what_it_uses_and_nothing_else() {
        let check = |s: StepDef| {
            WorkflowDef {
                concurrency: None,
                result: None,
                name: "w".into(),
                version: 1,
                description: String::new(),
                on_failure: OnFailure::Compensate,
                steps: vec![s],
            }
            .validate()
        };
        let callback = |timeout_ms, heartbeat_ms| StepDef {
            kind: StepKind::Callback { agent: "sim".into(), heartbeat_ms },
            timeout_ms,
            ..step("cb")
        };
        assert!(check(callback(3 * 24 * 3_600_000, Some(60_000))).is_ok(), "days, with heartbeats");
        assert!(check(callback(0, None)).is_err(), "a callback step without a hard timeout is refused");
        assert!(check(callback(MAX_LONG_STEP_MS + 1, None)).is_err());
        assert!(check(callback(10_000, Some(10_000))).is_err(), "the heartbeat window is below the hard timeout");
        assert!(check(callback(10_000, Some(10))).is_err());
        let wait = |time| StepDef::of_kind("w", StepKind::Wait(time), 0, 1);
        assert!(check(wait(WaitTime::Ms(60_000))).is_ok());
        assert!(check(wait(WaitTime::Ms(MAX_LONG_STEP_MS + 1))).is_err());
        assert!(check(wait(WaitTime::Until("/input/at".into()))).is_ok());
        assert!(check(wait(WaitTime::Until("2026-12-24T18:00:00Z".into()))).is_ok());
        assert!(check(wait(WaitTime::Until("input.at".into()))).is_err(), "a JSON pointer or a time");
        assert!(check(wait(WaitTime::SecondsAt("delay".into()))).is_err(), "a JSON pointer");
        let mut s = step("a");
        s.compensation = Some(Box::new(wait(WaitTime::Ms(1))));
        assert!(check(s).is_err(), "a compensation is never a wait");
        let mut s = wait(WaitTime::Ms(1));
        s.compensation = Some(Box::new(step("b")));
        assert!(check(s).is_err(), "a wait has nothing to undo");

        // a combination of fields that fits no kind does not parse, and says why
        let parse = |v: Value| serde_json::from_value::<StepDef>(v).map_err(|e| e.to_string());
        for (file, why) in [
            (
                json!({"name": "c", "agent": "sim", "timeout_ms": 5, "heartbeat_ms": 1_000}),
                "belong to callback and wait",
            ),
            (json!({"name": "c", "timeout_ms": 5}), "agent is empty"),
            (json!({"name": "c", "agent": "sim", "timeout_ms": 5, "wait_ms": 5}), "belong to callback and wait"),
            (json!({"name": "c", "agent": "sim", "timeout_ms": 5, "workflow": "x", "version": 1}), "kind workflow"),
            (json!({"name": "b", "kind": "callback", "agent": "sim", "timeout_ms": 5, "wait_for": "/d"}), "wait steps"),
            (json!({"name": "w", "kind": "wait"}), "exactly one of wait_ms"),
            (json!({"name": "w", "kind": "wait", "wait_ms": 1, "wait_until": "/input/at"}), "exactly one of"),
            (json!({"name": "w", "kind": "wait", "wait_ms": 1, "agent": "sim"}), "no agent"),
            (json!({"name": "w", "kind": "wait", "wait_ms": 1, "timeout_ms": 5}), "no agent, timeout_ms"),
            (json!({"name": "k", "kind": "workflow", "workflow": "x"}), "names the workflow and the version"),
            (json!({"name": "k", "kind": "workflow", "workflow": "x", "version": 1, "agent": "sim"}), "no agent"),
        ] {
            let e = parse(file.clone()).expect_err(&file.to_string());
            assert!(e.contains(why) && e.contains(&format!("step {}", file["name"].as_str().unwrap())), "{file}: {e}");
        }
        // a wait step reads without timeout_ms or max_attempts; each kind round-trips as written
        let w = parse(json!({"name": "cool", "kind": "wait", "wait_ms": 5})).unwrap();
        assert_eq!((&w.kind, w.max_attempts, w.timeout_ms), (&StepKind::Wait(WaitTime::Ms(5)), 1, 0));
        for file in [
            json!({"name": "cool", "kind": "wait", "wait_until": "/input/at", "timeout_ms": 0, "max_attempts": 1}),
            json!({"name": "cool", "kind": "wait", "wait_for": "/input/s", "timeout_ms": 0, "max_attempts": 1}),
            json!({"name": "cb", "kind": "callback", "agent": "a", "timeout_ms": 9, "heartbeat_ms": 2, "max_attempts": 1}),
            json!({"name": "c", "agent": "a", "timeout_ms": 9, "max_attempts": 3}),
            json!({"name": "k", "kind": "workflow", "workflow": "x", "version": 2, "timeout_ms": 0, "max_attempts": 1}),
        ] {
            let step = parse(file.clone()).unwrap();
            let mut back = serde_json::to_value(&step).unwrap();
            back.as_object_mut().unwrap().remove("backoff");
            assert_eq!(back, file, "written back as read");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff { base_ms: 100, max_ms: 1_000, multiplier: 2.0 };
        assert_eq!(b.delay_ms(1, 1.0), 100);
        assert_eq!(b.delay_ms(2, 1.0), 200);
        assert_eq!(b.delay_ms(3, 1.0), 400);
        assert_eq!(b.delay_ms(10, 1.0), 1_000);
        assert_eq!(b.delay_ms(1, 0.0), 50);
        assert_eq!(b.delay_ms(u32::MAX, 0.5), 750);
    }

    #[test]
    fn a_workflow_s_defaults_fill_what_its_steps_leave_out_and_nothing_else() {
        let with = r#"{"workflows": [{"name": "w", "version": 1,
            "defaults": {"timeout_ms": 5000, "max_attempts": 3, "backoff": {"base_ms": 1000, "max_ms": 10000},
                         "heartbeat_ms": 2000, "compensation": {"max_attempts": 5}},
            "steps": [
                {"name": "a", "agent": "sim", "compensation": {"name": "undo-a", "agent": "sim"}},
                {"name": "b", "agent": "sim", "timeout_ms": 9000, "max_attempts": 1},
                {"name": "c", "kind": "callback", "agent": "sim"},
                {"name": "d", "kind": "wait", "wait_ms": 10}]}]}"#;
        let written = r#"{"workflows": [{"name": "w", "version": 1, "steps": [
                {"name": "a", "agent": "sim", "timeout_ms": 5000, "max_attempts": 3,
                 "backoff": {"base_ms": 1000, "max_ms": 10000},
                 "compensation": {"name": "undo-a", "agent": "sim", "timeout_ms": 5000, "max_attempts": 5,
                                  "backoff": {"base_ms": 1000, "max_ms": 10000}}},
                {"name": "b", "agent": "sim", "timeout_ms": 9000, "max_attempts": 1,
                 "backoff": {"base_ms": 1000, "max_ms": 10000}},
                {"name": "c", "kind": "callback", "agent": "sim", "timeout_ms": 5000, "heartbeat_ms": 2000,
                 "max_attempts": 3, "backoff": {"base_ms": 1000, "max_ms": 10000}},
                {"name": "d", "kind": "wait", "wait_ms": 10}]}]}"#;
        let a = WorkflowRegistry::from_json(with).unwrap();
        let b = WorkflowRegistry::from_json(written).unwrap();
        assert_eq!(a.resolve("w", None), b.resolve("w", None));
        let bad = with.replace(r#""max_attempts": 5"#, r#""max_atempts": 5"#);
        let e = WorkflowRegistry::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains("at workflows[0].defaults.compensation.max_atempts: unknown field"), "{e}");
    }
}
