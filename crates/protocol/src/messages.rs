//! The wire contracts: every message that crosses a queue or a topic. JSON, versioned (`"v": 1`),
//! parsed strictly. The book documents each with an example (docs/reference/messages.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{AttemptToken, CallbackToken, IdempotencyKey, Millis, TaskId};
use crate::state::ProcessState;

/// The only message version this build speaks.
pub const VERSION: u32 = 1;
/// SQS's limit on one message body.
pub const SQS_MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The largest output an [`ElementEnded`] carries back to its parent (a child workflow's result, a
/// loop iteration's, a branch's), serialised: room left under [`SQS_MAX_MESSAGE_BYTES`] for the rest
/// of the message. A `Processed` child whose output is larger ends with no output and a `reason`
/// saying so, and its parent's step fails for good (the child's effects are undone with it).
pub const MAX_ENDED_OUTPUT_BYTES: usize = 192 * 1024;

/// How many bytes a value takes as JSON (what SQS, DynamoDB and the limits here count), counted
/// without building the text; `usize::MAX` for a value that cannot be written (a map whose keys
/// are not strings), so that it is over every limit.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// What an application sends to the submission queue.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    pub v: u32,
    /// The idempotency key of the submission; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<TaskId>,
    pub workflow: String,
    /// Pin a version; the latest deployed version when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<u32>,
    #[serde(default)]
    pub input: Value,
    /// The caller's private queue for status messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// 0 (the default) to 9: where the task waits in the line of its concurrency key, if it
    /// waits (see [`crate::keys`]): each level is worth [`crate::keys::PRIORITY_STEP_MS`] of
    /// waiting. No effect on a workflow without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Sent by a schedule (see [`crate::schedules`]): the schedule and the instant this task is.
    /// The Submitter applies the schedule's overlap policy, read from the schedule itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduledRun>,
}

/// The schedule and instant a submission comes from.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledRun {
    pub name: String,
    /// The instant (epoch ms).
    pub at: Millis,
    /// Sent by `sasctl schedule backfill`: its tasks wait in line and run one after the other
    /// (`buffer_all`), whatever the schedule's overlap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub backfill: bool,
}

/// Why a run message was sent; it only informs logs.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunReason {
    Start,
    Retry,
    Restart,
    /// Compensation may begin: the forward attempt it waited for can no longer apply.
    Compensate,
}

/// Scheduler queue: claim and run the task's current step, if the task is still at `rev`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub rev: u64,
    pub reason: RunReason,
}

/// The name of the error an agent's failure message gives, when it gives one: the message's
/// first word before `: ` when it is a name (letters, digits, `.`, `_`, `-`: the `aws` agent's
/// `DynamoDb.ConditionalCheckFailedException: ...`, as Step Functions names it), or the error type
/// a Lambda function raised (the `lambda` agent's `function F failed (CustomError): ...`). A
/// step's `on_failure` may continue on a name (`{"continue": ["S3.NoSuchKeyException"]}`).
pub fn error_name(message: &str) -> Option<String> {
    let message = message.trim_start();
    if let Some((head, _)) = message.split_once(": ") {
        if is_name(head) {
            return Some(head.to_owned());
        }
    }
    let rest = message.strip_prefix("function ")?;
    let (_, after) = rest.split_once(" failed (")?;
    let (name, _) = after.split_once("): ")?;
    is_name(name).then(|| name.to_owned())
}

/// Whether `t` is an error's name as [`error_name`] reads one: letters, digits, `.`, `_`, `-`, a
/// letter among them, at most 128 characters.
pub fn is_name(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && t.chars().any(|c| c.is_ascii_alphabetic())
        && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// What an agent reports for one attempt.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    Succeeded {
        output: Value,
    },
    /// `retryable: false` is a permanent failure (the remote service said no for good).
    Failed {
        error: String,
        retryable: bool,
    },
    /// The attempt ran out of its execution time (start + `timeout_ms`) before `CompleteBy`:
    /// its effect is unknown, like a retryable failure's, and the step counts as timed out.
    TimedOut {
        error: String,
    },
    /// This copy of the request was not started: it waited (in the agent queue, or for a slot of
    /// an agent at its `max_in_flight`) past its `start_by`. No failure: the Scheduler claims the
    /// unit again with a fresh schedule-to-start budget, so overload is a delay.
    NotStarted {
        error: String,
    },
}

/// Scheduler queue: an agent's result for one attempt, fenced by the attempt token.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentResult {
    pub v: u32,
    pub task_id: TaskId,
    pub step: String,
    pub attempt: AttemptToken,
    pub outcome: Outcome,
}

/// Scheduler queue: stop the task; completed steps are compensated.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub reason: String,
    /// The run the sender saw: a cancel applies to that run only. Optional for a running task;
    /// required for a task in `Error` (an operator's), so a late or duplicate cancel never resumes
    /// its compensation a second time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<u32>,
}

/// Scheduler queue: an operator resubmits an `Error` task; it resumes from its failed step.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResubmitMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub reason: String,
    /// The run the operator saw in `Error`: a resubmit applies once, to that run only (a
    /// duplicate delivery, or one that arrives after the task failed again, changes nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<u32>,
}

/// Scheduler queue, from a map element (a task of its own) to its parent: the element ended in
/// `state`. Sent again whenever the message that ended it comes back, and whenever the parent
/// commands an element that has ended; the parent counts each element once.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElementEnded {
    pub v: u32,
    /// The parent task.
    pub task_id: TaskId,
    /// The map step's index in the parent's workflow.
    pub step: usize,
    pub element: u32,
    pub state: ProcessState,
    /// Why it ended so, when it did not succeed (its own reason, clipped to 300 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A branch of a parallel region that succeeded: its step's output (the steps after it in
    /// the region read it). Absent for a map's elements, whose outputs the join reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// A loop's iteration whose body is the loop's inline steps, ended `Processed`: the task's
    /// variables as its steps left them (the loop's task takes them whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vars: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Scheduler queue, from a parent to one of its map elements that ended `Processed`: undo it (run
/// its compensation). The parent's map failed, was cancelled, or a later step failed.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UndoMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub reason: String,
}

/// Scheduler queue: every element of the parent's map step has ended; read their outputs and
/// finish the step.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub step: usize,
}

/// Everything the scheduler queue carries, tagged by `type`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SchedulerMessage {
    Run(RunMessage),
    Result(AgentResult),
    Cancel(CancelMessage),
    Resubmit(ResubmitMessage),
    ElementEnded(ElementEnded),
    Undo(UndoMessage),
    Join(JoinMessage),
}

impl SchedulerMessage {
    pub fn task_id(&self) -> &TaskId {
        match self {
            SchedulerMessage::Run(m) => &m.task_id,
            SchedulerMessage::Result(m) => &m.task_id,
            SchedulerMessage::Cancel(m) => &m.task_id,
            SchedulerMessage::Resubmit(m) => &m.task_id,
            SchedulerMessage::ElementEnded(m) => &m.task_id,
            SchedulerMessage::Undo(m) => &m.task_id,
            SchedulerMessage::Join(m) => &m.task_id,
        }
    }
}

/// A message that says which format it is written in (its `v`): a reader refuses one of another
/// format for that format, before it acts on it (docs/reference/messages.md, "Compatibility").
pub trait Versioned {
    fn format(&self) -> u32;
}

impl Versioned for SchedulerMessage {
    fn format(&self) -> u32 {
        match self {
            SchedulerMessage::Run(m) => m.v,
            SchedulerMessage::Result(m) => m.v,
            SchedulerMessage::Cancel(m) => m.v,
            SchedulerMessage::Resubmit(m) => m.v,
            SchedulerMessage::ElementEnded(m) => m.v,
            SchedulerMessage::Undo(m) => m.v,
            SchedulerMessage::Join(m) => m.v,
        }
    }
}

/// Forward step or compensation.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Compensate,
}

/// Agent queue: one attempt of one step.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRequest {
    pub v: u32,
    pub task_id: TaskId,
    pub step: String,
    pub phase: Phase,
    pub agent: String,
    /// The fencing token; the result must carry it back.
    pub attempt: AttemptToken,
    /// 1 for the first attempt of this step, 2 for the first retry...
    pub attempt_no: u32,
    /// The attempt may start until this instant (epoch ms); a request still queued after it is
    /// dropped unstarted. Started at `s`, it may run until `s + (complete_by - start_by)`: time
    /// spent waiting in the queue is not taken from the step's execution time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_by: Option<Millis>,
    /// Nothing may be started, applied or sent back after this instant (epoch ms).
    pub complete_by: Millis,
    /// `{task}:{step}`, stable across retries: the remote service applies the effect once.
    pub idempotency_key: IdempotencyKey,
    pub input: Value,
    /// Present for a callback step: the agent hands the work and this token over and reports
    /// nothing once the remote side accepted it; the remote side answers with the token. A
    /// hand-off that fails is reported like any failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackRef>,
    /// How often this request found its agent at its `max_in_flight` and was sent back to the
    /// agent queue to wait (absent: never).
    #[serde(default, skip_serializing_if = "crate::messages::is_zero")]
    pub waits: u32,
    /// When it first found its agent full (epoch ms): its schedule-to-start time counts from
    /// then as from its first send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<Millis>,
    /// Until this instant (epoch ms; its claim plus the Scheduler's `UNCHECKED_START_MS`) the
    /// agent may start the request without reading its task's `LockedBy`: a decision that moves
    /// the task on (a cancel, a give-up) allows for a call that starts this late (its
    /// compensation waits one such window more). Later, the agent reads first. Absent: it always
    /// reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked_until: Option<Millis>,
}

impl Versioned for AgentRequest {
    fn format(&self) -> u32 {
        self.v
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl AgentRequest {
    /// The first forward attempt of `step` (a fresh attempt token, no queue budget, no callback):
    /// what a tool or a test hands an agent directly; the protocol builds its own from the task.
    /// `task_input` reaches the agent as a first step sees it: `{"input": ..., "outputs": {}}`.
    pub fn first_attempt(task_id: TaskId, step: &str, agent: &str, task_input: Value, complete_by: Millis) -> Self {
        AgentRequest {
            v: VERSION,
            idempotency_key: IdempotencyKey::for_step(&task_id, step),
            task_id,
            step: step.into(),
            phase: Phase::Forward,
            agent: agent.into(),
            attempt: AttemptToken::fresh(),
            attempt_no: 1,
            start_by: None,
            complete_by,
            input: Value::Object(serde_json::Map::from_iter([
                ("input".to_owned(), task_input),
                ("outputs".to_owned(), Value::Object(serde_json::Map::new())),
            ])),
            callback: None,
            waits: 0,
            waiting_since: None,
            unchecked_until: None,
        }
    }

    /// The same request under another attempt token (before [`AgentRequest::with_callback`]).
    #[must_use]
    pub fn with_attempt(mut self, attempt: AttemptToken) -> Self {
        self.attempt = attempt;
        self
    }

    /// As a callback step's attempt: its token, and the heartbeat asked of the remote side.
    #[must_use]
    pub fn with_callback(mut self, heartbeat_ms: Option<u64>) -> Self {
        let token = CallbackToken::new(&self.task_id, &self.step, &self.attempt);
        self.callback = Some(CallbackRef { token, heartbeat_ms });
        self
    }
}

/// What a callback step's agent hands to the remote side besides the work.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackRef {
    pub token: CallbackToken,
    /// The remote side must heartbeat at least this often, or the attempt expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
}

/// What the remote side of a callback step says, with its token: on the callback queue, in the
/// body of a request to the callback endpoint, or from `sasctl complete|fail|heartbeat`.
/// `{"v":1,"token":"…","status":"succeeded","output":{…}}`,
/// `{"v":1,"token":"…","status":"failed","error":"…","retryable":false}`,
/// `{"v":1,"token":"…","status":"heartbeat","details":{…}}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackMessage {
    /// Unknown fields are refused by the answer's own shape (`status` decides which are known).
    pub v: u32,
    pub token: CallbackToken,
    #[serde(flatten)]
    pub answer: CallbackAnswer,
}

impl Versioned for CallbackMessage {
    fn format(&self) -> u32 {
        self.v
    }
}

/// The three answers a callback step takes.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum CallbackAnswer {
    Succeeded {
        #[serde(default)]
        output: Value,
    },
    /// `retryable: false` (the default) fails the step for good.
    Failed {
        error: String,
        #[serde(default)]
        retryable: bool,
    },
    /// Still working: extends the attempt's deadline (never past its hard timeout). `details`
    /// (progress) are kept on the task with the heartbeats that extend the deadline.
    Heartbeat {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<Value>,
    },
}

impl CallbackAnswer {
    pub fn name(&self) -> &'static str {
        match self {
            CallbackAnswer::Succeeded { .. } => "succeeded",
            CallbackAnswer::Failed { .. } => "failed",
            CallbackAnswer::Heartbeat { .. } => "heartbeat",
        }
    }
}

/// What an answer did, told to whoever sent it (the HTTPS endpoint's body, `sasctl`'s output, a
/// log line for the callback queue).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackResult {
    /// The answer moved the task on.
    Applied,
    /// The same answer with the same token was applied before (senders retry): nothing changed.
    Duplicate,
    /// A heartbeat was taken: the attempt is alive until `complete_by`.
    Alive,
    /// The task was cancelled or has ended: stop the work (a success is still recorded as late).
    Cancelled,
    /// The token's attempt is not the one the task waits for now (it expired and a later attempt
    /// holds the step, or the step is done): nothing changed. `reason` says which.
    Stale,
    /// A success that came after its attempt stopped counting (it had expired, or it had answered
    /// that it failed): recorded on the task and counted, since an effect may have happened; the
    /// protocol did not take it as the step's result. `reason` says which.
    Late,
    /// No task, or no attempt of the step it names, was given this token (forged, mistyped, from
    /// another stack, or the task was deleted).
    Unknown,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackReply {
    pub v: u32,
    pub result: CallbackResult,
    /// The worker should stop working on this attempt (cancelled, stale, late or unknown).
    pub stop: bool,
    /// The task's state after the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ProcessState>,
    /// For a heartbeat taken: the attempt's deadline now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<Millis>,
    /// Why, in words.
    pub reason: String,
}

impl CallbackReply {
    pub fn new(result: CallbackResult, state: Option<ProcessState>, reason: impl Into<String>) -> Self {
        let stop = matches!(
            result,
            CallbackResult::Cancelled | CallbackResult::Stale | CallbackResult::Late | CallbackResult::Unknown
        );
        CallbackReply { v: VERSION, result, stop, state, complete_by: None, reason: reason.into() }
    }
}

/// Supervisor queue (delayed): check this attempt at its CompleteBy.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerMessage {
    pub v: u32,
    pub task_id: TaskId,
    /// The attempt to check; absent when the sweep hands over a task whose decision ends it (so
    /// that the terminal transition, and its alert, happen in a handler SQS retries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<AttemptToken>,
    pub complete_by: Millis,
}

impl Versioned for TimerMessage {
    fn format(&self) -> u32 {
        self.v
    }
}

/// Sent to the caller's `reply_to` queue on every state change. Standard queues may reorder
/// messages: `seq` increases with every change of one task, so consumers order by it (a FIFO
/// reply queue receives them in order, grouped by task).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusMessage {
    pub v: u32,
    pub task_id: TaskId,
    pub seq: u64,
    pub state: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub failure_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Epoch milliseconds.
    pub at: Millis,
    /// On `Processed`: the task's result, each step's output by step name (what later steps saw
    /// as `outputs`). Absent when they would not fit (see `outputs_omitted`) and on other states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Value>,
    /// On `Processed`, when the outputs are over [`MAX_STATUS_OUTPUTS_BYTES`]: their size, and
    /// where to read them instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_omitted: Option<OmittedOutputs>,
    /// On `Processed`, when the workflow declares a `result`: that template filled from the input
    /// and the steps' outputs, instead of `outputs` (absent, with `outputs_omitted`, when it would
    /// not fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// This status answers a submission that created nothing: a task with its `task_id` existed
    /// already (the status is that task's current one). An SQS redelivery of the caller's own
    /// submission after its task moved on is answered the same way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// The most bytes of outputs a status message carries (serialised): a status must fit in one SQS
/// message (256 KiB) with room for the rest.
pub const MAX_STATUS_OUTPUTS_BYTES: usize = 128 * 1024;

/// Outputs too large for a status message.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OmittedOutputs {
    /// Their size, serialised.
    pub bytes: u64,
    pub limit: u64,
    /// Where to read them: the task item's `Steps` (each step's `Output`), or `sasctl status TASK_ID`.
    pub read: String,
}

impl StatusMessage {
    /// A status with no step, failures, reason or outputs.
    pub fn new(task_id: TaskId, seq: u64, state: ProcessState, at: Millis) -> Self {
        StatusMessage {
            v: VERSION,
            task_id,
            seq,
            state,
            step: None,
            failure_count: 0,
            reason: None,
            at,
            outputs: None,
            outputs_omitted: None,
            result: None,
            duplicate: false,
        }
    }

    /// Attach a finished task's result (its workflow's `result`), as [`Self::with_outputs`] does
    /// its outputs.
    #[must_use]
    pub fn with_result(self, result: Value) -> Self {
        let mut s = self.with_outputs(result);
        s.result = s.outputs.take();
        s
    }

    /// Attach a finished task's outputs (by step name), or say where to read them when they are
    /// over [`MAX_STATUS_OUTPUTS_BYTES`].
    #[must_use]
    pub fn with_outputs(mut self, outputs: Value) -> Self {
        let bytes = json_len(&outputs);
        if bytes <= MAX_STATUS_OUTPUTS_BYTES {
            self.outputs = Some(outputs);
        } else {
            self.outputs_omitted = Some(OmittedOutputs {
                bytes: bytes as u64,
                limit: MAX_STATUS_OUTPUTS_BYTES as u64,
                read: format!(
                    "the Output of each step in the task item's Steps (TaskId {}), or sasctl status {}",
                    self.task_id, self.task_id
                ),
            });
        }
        self
    }
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A step used all its attempts; compensation follows.
    RetriesExhausted,
    /// The task ended in Error: an operator must look.
    TaskError,
    /// A callback step's success came after its attempt expired and the task did not take it:
    /// an effect happened that the task may not account for (reconcile by hand).
    LateResult,
}

/// Published to the alert topic for operators.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alert {
    pub v: u32,
    pub kind: AlertKind,
    pub task_id: TaskId,
    pub workflow: String,
    pub state: ProcessState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub failure_count: u32,
    pub reason: String,
    pub at: Millis,
}

impl Alert {
    pub fn subject(&self) -> String {
        let what = match self.kind {
            AlertKind::RetriesExhausted => "retries exhausted",
            AlertKind::TaskError => "task in Error",
            AlertKind::LateResult => "late result",
        };
        // SNS subjects: at most 100 printable ASCII characters.
        let mut s = format!("[sas] {what}: {} ({})", self.task_id, self.workflow);
        s.retain(|c| c.is_ascii() && !c.is_ascii_control());
        s.truncate(100);
        s
    }
}

/// An SQS queue URL, as AWS and LocalStack write them: `<scheme>://<host>/<12-digit account>/<name>`
/// or LocalStack's path style `<scheme>://<host>/queue/<region>/<account>/<name>`. The queue it
/// names is its account and name (SQS resolves the queue from those, in the region of the
/// endpoint the request goes to); the host only tells the region, when it is a known form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueUrl {
    url: String,
    region: Option<String>,
    account: String,
    name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reply_to {url:?} is not an SQS queue URL: {why}")]
pub struct QueueUrlError {
    pub url: String,
    pub why: &'static str,
}

/// A region name as AWS writes them (`us-east-1`, `eu-central-2`, `us-gov-west-1`).
fn is_region(s: &str) -> bool {
    (4..=30).contains(&s.len())
        && s.contains('-')
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().last().is_some_and(|b| b.is_ascii_digit())
}

/// The region a queue URL's host names, for the host forms SQS and LocalStack use:
/// `sqs.<region>.amazonaws.com[.cn]`, `sqs.<region>.api.aws`, `<region>.queue.amazonaws.com[.cn]`,
/// `queue.amazonaws.com` (us-east-1) and `sqs.<region>.localhost.localstack.cloud`.
fn host_region(host: &str) -> Option<String> {
    if host == "queue.amazonaws.com" {
        return Some("us-east-1".to_owned());
    }
    let region = host
        .strip_prefix("sqs.")
        .and_then(|h| {
            [".amazonaws.com", ".amazonaws.com.cn", ".api.aws", ".localhost.localstack.cloud"]
                .iter()
                .find_map(|suffix| h.strip_suffix(suffix))
        })
        .or_else(|| [".queue.amazonaws.com", ".queue.amazonaws.com.cn"].iter().find_map(|s| host.strip_suffix(s)))?;
    is_region(region).then(|| region.to_owned())
}

impl QueueUrl {
    pub fn parse(url: &str) -> Result<Self, QueueUrlError> {
        let err = |why| QueueUrlError { url: url.chars().take(300).collect(), why };
        if url.len() > 1024 {
            return Err(err("longer than 1024 characters"));
        }
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| err("it must start with https:// or http://"))?;
        let (host, path) = rest.split_once('/').ok_or_else(|| err("it has no path"))?;
        if host.is_empty() || host.contains('@') || host.chars().any(char::is_whitespace) {
            return Err(err("its host is not valid"));
        }
        if url.contains('?') || url.contains('#') {
            return Err(err("it must not carry a query or fragment"));
        }
        let segs: Vec<&str> = path.split('/').collect();
        let (path_region, account, name) = match segs.as_slice() {
            [account, name] => (None, *account, *name),
            ["queue", region, account, name] if is_region(region) => (Some(*region), *account, *name),
            _ => {
                return Err(err("its path must be /<account>/<queue name> (or /queue/<region>/<account>/<queue name>)"))
            }
        };
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("the path segment before the queue name must be a 12-digit account id"));
        }
        let base = name.strip_suffix(".fifo").unwrap_or(name);
        if base.is_empty()
            || base.len() > 80
            || !base.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(err("the queue name must be 1-80 letters, digits, - or _ (optionally .fifo)"));
        }
        let host = host.to_ascii_lowercase();
        let host = match host.rsplit_once(':') {
            Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host.as_str(),
        };
        let host_region = host_region(host);
        let region = match (path_region, host_region) {
            (Some(p), Some(h)) if p != h => return Err(err("its host and its path name different regions")),
            (Some(p), _) => Some(p.to_owned()),
            (None, h) => h,
        };
        Ok(QueueUrl { url: url.to_owned(), region, account: account.to_owned(), name: name.to_owned() })
    }

    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The region the URL names, when its host (or LocalStack's path) tells it.
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    pub fn account(&self) -> &str {
        &self.account
    }

    /// The queue's name, `.fifo` included.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether both URLs name the same queue (same account and name), however each is spelled.
    pub fn same_queue(&self, other: &QueueUrl) -> bool {
        self.account == other.account && self.name == other.name
    }

    pub fn is_fifo(&self) -> bool {
        // SQS requires the suffix in lower case.
        #[allow(clippy::case_sensitive_file_extension_comparisons)]
        let fifo = self.name.ends_with(".fifo");
        fifo
    }
}

/// An IAM-style ARN pattern for SQS queues, `arn:<partition>:sqs:<region>:<account>:<name>`. Each
/// field is matched on its own, case-sensitively, with `*` (any run of characters) and `?` (any
/// one character), as IAM matches resource ARNs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArnPattern {
    text: String,
    partition: String,
    region: String,
    account: String,
    name: String,
}

/// The partition of a region (`aws` unless it is a China, GovCloud or ISO region).
fn partition_of(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else if region.starts_with("us-isob-") {
        "aws-iso-b"
    } else if region.starts_with("us-iso-") {
        "aws-iso"
    } else {
        "aws"
    }
}

/// `*` and `?` wildcard matching (greedy with backtracking to the last `*`), as IAM matches
/// ARNs.
pub fn glob(pattern: &str, s: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), s.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, si));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    pi = sp + 1;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

impl ArnPattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        let fields: Vec<&str> = text.split(':').collect();
        let [arn, partition, service, region, account, name] = fields.as_slice() else {
            return Err("an SQS ARN pattern has six fields: arn:<partition>:sqs:<region>:<account>:<queue name>".into());
        };
        if *arn != "arn" || *service != "sqs" {
            return Err("it must start with arn:<partition>:sqs:".into());
        }
        if [partition, region, account, name].iter().any(|f| f.is_empty()) {
            return Err("no field may be empty (use * for any)".into());
        }
        Ok(ArnPattern {
            text: text.to_owned(),
            partition: (*partition).to_owned(),
            region: (*region).to_owned(),
            account: (*account).to_owned(),
            name: (*name).to_owned(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The fixed start of the names the pattern allows, when its name is `<prefix>*` (as the
    /// template's default `<stack>-reply-*` is).
    pub fn name_prefix(&self) -> Option<&str> {
        self.name.strip_suffix('*').filter(|p| !p.is_empty() && !p.contains(['*', '?']))
    }

    /// The queue's ARN, and whether the pattern allows it. A URL that names no region (LocalStack's
    /// `http://localhost:4566/<account>/<name>`) is sent in the stack's own region, which the
    /// pattern names: its region and partition are taken as the pattern's.
    pub fn check(&self, q: &QueueUrl) -> (String, bool) {
        let (partition, region, located) = match q.region() {
            Some(r) => (partition_of(r), r, glob(&self.region, r) && glob(&self.partition, partition_of(r))),
            None => ("aws", "<this region>", true),
        };
        let arn = format!("arn:{partition}:sqs:{region}:{}:{}", q.account(), q.name());
        (arn, located && glob(&self.account, q.account()) && glob(&self.name, q.name()))
    }
}

#[cfg(test)]
mod error_names {
    use super::error_name;

    #[test]
    fn an_agent_s_message_names_its_error_as_step_functions_does() {
        let name = |m: &str| error_name(m);
        assert_eq!(
            name("S3.NoSuchKeyException: The specified key does not exist. (Service: S3, ...)").as_deref(),
            Some("S3.NoSuchKeyException")
        );
        assert_eq!(
            name("DynamoDb.ConditionalCheckFailedException: no (after 1 calls)").as_deref(),
            Some("DynamoDb.ConditionalCheckFailedException")
        );
        assert_eq!(
            name("function arn:aws:lambda:r:1:function:f failed (CustomError): boom").as_deref(),
            Some("CustomError")
        );
        assert_eq!(name("HTTP 503 from https://x: busy"), None, "words are no name");
        assert_eq!(name("out of stock"), None);
        assert_eq!(name("503: busy").as_deref(), None, "a number is no name");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_len_counts_the_bytes_of_the_text_and_a_value_that_cannot_be_written_is_over_every_limit() {
        for v in
            [serde_json::json!({"a": [1, "é\u{0}", null], "b": {"c": 2.5}}), Value::Null, serde_json::json!("x\"y")]
        {
            assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len(), "{v}");
        }
        let bad: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert_eq!(json_len(&bad), usize::MAX);
    }

    fn pattern(p: &str) -> ArnPattern {
        ArnPattern::parse(p).unwrap()
    }

    fn url(u: &str) -> QueueUrl {
        QueueUrl::parse(u).unwrap_or_else(|e| panic!("{u}: {e}"))
    }

    #[test]
    fn glob_matches_like_iam() {
        for (p, s, want) in [
            ("*", "", true),
            ("*", "anything", true),
            ("sas-reply-*", "sas-reply-x", true),
            ("sas-reply-*", "sas-reply-", true),
            ("sas-reply-*", "sas-replies", false),
            ("sas-reply-*", "SAS-reply-x", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*-dlq", "x-dlq-dlq", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob(p, s), want, "{p} ~ {s}");
        }
    }

    #[test]
    fn queue_urls_give_region_account_and_name_in_every_host_form() {
        for (u, region) in [
            ("https://sqs.eu-west-1.amazonaws.com/123456789012/r", Some("eu-west-1")),
            ("https://SQS.EU-WEST-1.AMAZONAWS.COM/123456789012/r", Some("eu-west-1")),
            ("https://sqs.eu-west-1.amazonaws.com:443/123456789012/r", Some("eu-west-1")),
            ("https://eu-west-1.queue.amazonaws.com/123456789012/r", Some("eu-west-1")),
            ("https://queue.amazonaws.com/123456789012/r", Some("us-east-1")),
            ("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/r", Some("cn-north-1")),
            ("https://sqs.eu-west-1.api.aws/123456789012/r", Some("eu-west-1")),
            ("http://sqs.eu-west-1.localhost.localstack.cloud:4566/123456789012/r", Some("eu-west-1")),
            ("http://localhost:4566/queue/eu-west-1/123456789012/r", Some("eu-west-1")),
            ("http://localhost:4566/123456789012/r", None),
            ("http://vpce-1a2b.sqs.eu-west-1.vpce.amazonaws.com/123456789012/r", None),
        ] {
            let q = url(u);
            assert_eq!((q.region(), q.account(), q.name()), (region, "123456789012", "r"), "{u}");
        }
        for bad in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/r/",
            "https://sqs.eu-west-1.amazonaws.com/x/123456789012/r",
            "https://sqs.eu-west-1.amazonaws.com//123456789012/r",
            "http://sqs.eu-west-1.localhost.localstack.cloud:4566/queue/us-east-1/123456789012/r",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/r%2Fx",
        ] {
            assert!(QueueUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn arn_pattern_allows_its_queues_only() {
        let p = pattern("arn:aws:sqs:eu-west-1:123456789012:orders-reply-*");
        for (u, arn, ok) in [
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-reply-a",
                "arn:aws:sqs:eu-west-1:123456789012:orders-reply-a",
                true,
            ),
            (
                "http://localhost:4566/queue/eu-west-1/123456789012/orders-reply-b.fifo",
                "arn:aws:sqs:eu-west-1:123456789012:orders-reply-b.fifo",
                true,
            ),
            (
                "http://localhost:4566/123456789012/orders-reply-c",
                "arn:aws:sqs:<this region>:123456789012:orders-reply-c",
                true,
            ),
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/billing-queue",
                "arn:aws:sqs:eu-west-1:123456789012:billing-queue",
                false,
            ),
            (
                "https://sqs.eu-west-1.amazonaws.com/999999999999/orders-reply-a",
                "arn:aws:sqs:eu-west-1:999999999999:orders-reply-a",
                false,
            ),
            (
                "https://sqs.us-east-1.amazonaws.com/123456789012/orders-reply-a",
                "arn:aws:sqs:us-east-1:123456789012:orders-reply-a",
                false,
            ),
            (
                "https://sqs.cn-north-1.amazonaws.com.cn/123456789012/orders-reply-a",
                "arn:aws-cn:sqs:cn-north-1:123456789012:orders-reply-a",
                false,
            ),
        ] {
            assert_eq!(p.check(&url(u)), (arn.to_owned(), ok), "{u}");
        }
        assert!(pattern("arn:*:sqs:*:*:*").check(&url("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/x")).1);
        for bad in
            ["", "*", "arn:aws:sns:eu-west-1:123456789012:x", "arn:aws:sqs:eu-west-1:123456789012", "arn:aws:sqs::1:x"]
        {
            assert!(ArnPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queue_urls() {
        for ok in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/replies",
            "http://localhost:4566/queue/us-east-1/000000000000/my-replies",
            "http://localhost:4566/000000000000/r.fifo",
        ] {
            assert!(QueueUrl::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "ftp://x/123456789012/q",
            "https://sqs.amazonaws.com/replies",
            "https://sqs.amazonaws.com/12345/q",
            "https://sqs.amazonaws.com/123456789012/bad name",
            "https://sqs.amazonaws.com/123456789012/",
            "https://user@evil/123456789012/q",
            "https://h/123456789012/q?x=1",
        ] {
            assert!(QueueUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scheduler_messages_round_trip_with_type_tag() {
        let m = SchedulerMessage::Result(AgentResult {
            v: 1,
            task_id: TaskId::try_from("t1").unwrap(),
            step: "charge".into(),
            attempt: AttemptToken::from("tok"),
            outcome: Outcome::Failed { error: "declined".into(), retryable: false },
        });
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.contains(r#""type":"result""#), "{s}");
        assert!(s.contains(r#""status":"failed""#), "{s}");
        assert_eq!(serde_json::from_str::<SchedulerMessage>(&s).unwrap(), m);
    }

    #[test]
    fn submission_is_strict() {
        let ok = r#"{"v":1,"task_id":"order-42","workflow":"order","input":{"sku":"a"}}"#;
        assert!(serde_json::from_str::<Submission>(ok).is_ok());
        let extra = r#"{"v":1,"workflow":"order","input":{},"callback":"http://x"}"#;
        assert!(serde_json::from_str::<Submission>(extra).is_err());
    }

    #[test]
    fn alert_subject_is_sns_safe() {
        let a = Alert {
            v: 1,
            kind: AlertKind::TaskError,
            task_id: TaskId::try_from("x".repeat(128)).unwrap(),
            workflow: "order".into(),
            state: ProcessState::Error,
            step: None,
            failure_count: 3,
            reason: "r".into(),
            at: Millis(1),
        };
        assert!(a.subject().len() <= 100);
    }
}

#[cfg(test)]
mod book_examples {
    use super::StatusMessage;

    /// Every status example in the book's message contracts (docs/reference/messages.md: a JSON
    /// block with `"seq"` and `"state"`) is one the contract accepts, so the documented fields are
    /// the real ones.
    #[test]
    fn the_books_status_examples_parse() {
        let page = include_str!("../../../docs/reference/messages.md");
        let mut seen = 0;
        for block in page.split("```json").skip(1) {
            let json = block.split("```").next().unwrap();
            if json.contains("\"seq\"") && json.contains("\"state\"") {
                let s: StatusMessage = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
                seen += 1;
                assert!(s.outputs.is_none() || s.state == crate::state::ProcessState::Processed);
            }
        }
        assert!(seen >= 4, "the book shows {seen} status examples");
    }
}
