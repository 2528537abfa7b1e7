//! What one run looks like (the seed, the load, the faults) and what it reports.

use std::collections::BTreeMap;

/// What one run looks like.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    /// Tasks submitted at once at the start.
    pub burst: usize,
    /// Tasks submitted one by one afterwards.
    pub trickle: usize,
    /// Agent requests the agents start per second (their fleet's capacity).
    pub agent_rate: u32,
    /// Probabilities of the faults (0 turns them off).
    pub faults: Faults,
    /// Give up after this much virtual time.
    pub horizon_ms: u64,
    /// Every submission is an `order-map` with this many lines (else a mix of workflows, maps of
    /// 1 to 5 lines among them).
    pub map_lines: Option<usize>,
    /// Every submission is an `order-pages`: a map over this many pages of this many items each
    /// (a map over items read from S3, the shape `sasctl import-asl` gives it: a reading step
    /// that answers the page numbers, a child per page that reads its page and maps its items).
    pub pages: Option<(usize, usize)>,
    /// Every submission is an `order-keyed` (at most [`KEY_LIMIT`](super::KEY_LIMIT) at once per
    /// account) for one of this many accounts, drawn at random.
    pub keys: Option<u64>,
    /// A schedule of every minute (`tick`, of workflow `order`, overlap `skip`) runs this many
    /// minutes from the start, then is deleted; its tasks come beside the submissions.
    pub schedule: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Faults {
    /// A consumer dies before handling a message (it comes back after the visibility timeout).
    pub crash_before: f64,
    /// A consumer handles a message and dies before deleting it.
    pub crash_after: f64,
    /// A message is handled by two consumers at once.
    pub duplicate: f64,
    /// The sends right after a handler's write fail (a crash between a write and its effects).
    pub lost_sends: f64,
    /// The next operator alert of a handler batch fails to publish.
    pub lost_alerts: f64,
    /// Remote calls: transient failure, permanent failure, hang, effect without an answer,
    /// effect then a retryable failure, a slow answer.
    pub transient: f64,
    pub permanent: f64,
    pub hang: f64,
    pub effect_no_answer: f64,
    pub effect_then_retryable: f64,
    pub slow: f64,
    /// Operator cancels and resubmits, per task.
    pub cancel: f64,
    pub resubmit: f64,
    /// A gateway in front of the service answers 504 (retryable) while the backend keeps working:
    /// the effect lands after the answer, before the request's deadline.
    pub late_effect: f64,
    /// An agent request is delivered twice (SQS at least once): a second agent runs it a little
    /// later; while the first copy holds the key the service answers 409 "key in use" and the
    /// runtime asks again until the key is free (its answer replayed) or the copy's deadline.
    pub agent_duplicate: f64,
    /// Per handler run of a batch: a conditional write applies and then reports a failure
    /// (`AlreadyExists`/`Conflict` with the item just written, or a `Backend` error).
    pub ambiguous_writes: f64,
    /// Per handler run of a batch: a send request fails as a whole and takes every buffered
    /// message of it (up to 10, of different tasks) with it, as a `BufferedBus` flush whose
    /// SendMessageBatch fails; per sweep, its hand-off batch fails the same way.
    pub batch_failures: f64,
    /// The share of submissions that name the reply queue ([`REPLY_QUEUE`]).
    pub reply_to: f64,
    /// A timer on the supervisor queue is delivered again, 0.5 to 10 s after its first delivery (an
    /// SQS standard queue's duplicate from another server; or EventBridge invoking the sweep
    /// twice while the first hand-off is being handled).
    pub late_duplicate: f64,
    /// Callback steps: the worker dies (its heartbeats stop, its answer never comes).
    pub cb_lost: f64,
    /// Callback steps: the answer is delayed in transit past its attempt's deadline.
    pub cb_late: f64,
    /// Callback steps: the answer is sent twice (the sender retries).
    pub cb_duplicate: f64,
    /// Callback steps: a heartbeat arrives after the answer (reordered in transit).
    pub cb_reorder: f64,
    /// The remote side, or the agent's HTTP client, times out exactly at the attempt's execution
    /// deadline (the client's timeout is that deadline): the call ends then with a transient error
    /// ("timed out: error sending request"), its effect landed before it or not.
    pub remote_timeout: f64,
    /// The service answers (its effect applied) exactly at the attempt's execution deadline, as
    /// the runtime's own cut fires.
    pub answer_at_deadline: f64,
    /// SQS delivers an agent request again long after the first copy (10 s up to its
    /// `start_by`): a copy of an attempt the task may have retried, given up or cancelled since.
    pub late_copy: f64,
}

impl Faults {
    pub fn none() -> Self {
        Faults {
            crash_before: 0.0,
            crash_after: 0.0,
            duplicate: 0.0,
            lost_sends: 0.0,
            lost_alerts: 0.0,
            transient: 0.0,
            permanent: 0.0,
            hang: 0.0,
            effect_no_answer: 0.0,
            effect_then_retryable: 0.0,
            slow: 0.0,
            cancel: 0.0,
            resubmit: 0.0,
            late_effect: 0.0,
            agent_duplicate: 0.0,
            ambiguous_writes: 0.0,
            batch_failures: 0.0,
            reply_to: 0.0,
            late_duplicate: 0.0,
            cb_lost: 0.0,
            cb_late: 0.0,
            cb_duplicate: 0.0,
            cb_reorder: 0.0,
            remote_timeout: 0.0,
            answer_at_deadline: 0.0,
            late_copy: 0.0,
        }
    }

    pub fn all() -> Self {
        Faults {
            crash_before: 0.02,
            crash_after: 0.02,
            duplicate: 0.05,
            lost_sends: 0.02,
            lost_alerts: 0.3,
            transient: 0.05,
            permanent: 0.02,
            hang: 0.03,
            effect_no_answer: 0.03,
            effect_then_retryable: 0.03,
            slow: 0.05,
            cancel: 0.15,
            resubmit: 0.5,
            late_effect: 0.03,
            agent_duplicate: 0.05,
            ambiguous_writes: 0.01,
            batch_failures: 0.01,
            reply_to: 1.0,
            late_duplicate: 0.1,
            cb_lost: 0.1,
            cb_late: 0.1,
            cb_duplicate: 0.2,
            cb_reorder: 0.2,
            remote_timeout: 0.03,
            answer_at_deadline: 0.02,
            late_copy: 0.03,
        }
    }

    /// Only the named faults, at their [`Faults::all`] rates (names as the fields; a reply queue
    /// is always named, so that its invariants are checked). `None` for an unknown name.
    pub fn only(names: &[&str]) -> Option<Self> {
        let all = Faults::all();
        let mut f = Faults { reply_to: all.reply_to, ..Faults::none() };
        for name in names {
            let (to, from) = match name.trim() {
                "crash_before" => (&mut f.crash_before, all.crash_before),
                "crash_after" => (&mut f.crash_after, all.crash_after),
                "duplicate" => (&mut f.duplicate, all.duplicate),
                "lost_sends" => (&mut f.lost_sends, all.lost_sends),
                "lost_alerts" => (&mut f.lost_alerts, all.lost_alerts),
                "transient" => (&mut f.transient, all.transient),
                "permanent" => (&mut f.permanent, all.permanent),
                "hang" => (&mut f.hang, all.hang),
                "effect_no_answer" => (&mut f.effect_no_answer, all.effect_no_answer),
                "effect_then_retryable" => (&mut f.effect_then_retryable, all.effect_then_retryable),
                "slow" => (&mut f.slow, all.slow),
                "cancel" => (&mut f.cancel, all.cancel),
                "resubmit" => (&mut f.resubmit, all.resubmit),
                "late_effect" => (&mut f.late_effect, all.late_effect),
                "agent_duplicate" => (&mut f.agent_duplicate, all.agent_duplicate),
                "ambiguous_writes" => (&mut f.ambiguous_writes, all.ambiguous_writes),
                "batch_failures" => (&mut f.batch_failures, all.batch_failures),
                "late_duplicate" => (&mut f.late_duplicate, all.late_duplicate),
                "cb_lost" => (&mut f.cb_lost, all.cb_lost),
                "cb_late" => (&mut f.cb_late, all.cb_late),
                "cb_duplicate" => (&mut f.cb_duplicate, all.cb_duplicate),
                "cb_reorder" => (&mut f.cb_reorder, all.cb_reorder),
                "remote_timeout" => (&mut f.remote_timeout, all.remote_timeout),
                "answer_at_deadline" => (&mut f.answer_at_deadline, all.answer_at_deadline),
                "late_copy" => (&mut f.late_copy, all.late_copy),
                "" => continue,
                _ => return None,
            };
            *to = from;
        }
        Some(f)
    }
}

/// The reply queue every simulated submission names (the callers' queue, not the stack's).
pub const REPLY_QUEUE: &str = "http://twins.local/000000000000/sas-reply-sim";

/// How often one terminal status may reach the reply queue: the message that ended the task,
/// one duplicate of it handled at the same time, one redelivery after a crash or a failed
/// essential send, and one duplicate of that redelivery. A late timer of an earlier attempt is
/// not among them.
pub const MAX_TERMINAL_REPLIES: usize = 4;

/// How long after its execution deadline a hung attempt (its agent cut the call) may still hold
/// its task: the agent's report is handled in the instant it is sent (attempts whose report's
/// first delivery crashed are not checked), so 5 s leaves room for a duplicate's race and SQS's
/// whole-second delays, far below the queue budget (120 s here) an unreported attempt waits.
pub const LATE_HUNG_MS: u64 = 5_000;

/// How long after `CompleteBy` + the result grace a lost attempt (its agent died or never
/// started it) may still hold its task: its own timer is due then, delayed by SQS in whole
/// seconds (attempts whose timer's first delivery crashed are not checked). The sweep, a minute
/// behind, is the backstop for what this bound calls late.
pub const LATE_LOST_MS: u64 = 5_000;

impl SimConfig {
    /// The default run for a seed: a burst and a trickle of tasks with every fault on.
    pub fn for_seed(seed: u64) -> Self {
        SimConfig {
            seed,
            burst: 12,
            trickle: 8,
            agent_rate: 20,
            faults: Faults::all(),
            horizon_ms: 6 * 3_600_000,
            map_lines: None,
            pages: None,
            keys: None,
            schedule: None,
        }
    }
}

/// What a run did and what it broke.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Why top-level tasks that did not end `Processed` ended as they did (the first 20).
    pub unprocessed: BTreeMap<String, String>,
    pub seed: u64,
    pub violations: Vec<String>,
    pub tasks: usize,
    pub end_states: BTreeMap<String, usize>,
    pub handled: u64,
    pub attempts: u64,
    pub units: u64,
    pub virtual_ms: u64,
    /// What the answer desk said to the callback workers' answers and heartbeats, by result.
    pub callbacks: BTreeMap<String, u64>,
    /// Requests for [`LIMITED_AGENT`](super::LIMITED_AGENT) that found it at its limit and were put back to wait.
    pub limit_waits: u64,
    /// Copies of attempts their agent did not start (they waited past `start_by`): each is
    /// claimed again, not counted as a failure. Included in `attempts`.
    pub not_started: u64,
    /// Copies of attempts that found their key in use by another call (409) and asked again
    /// until it was free; and of those, the ones whose key was still held at their deadline (each
    /// timed out).
    pub keys_in_use: u64,
    pub keys_in_use_to_the_deadline: u64,
    /// Copies of attempts their agent did not start because the task no longer waited for them
    /// ([`agent::still_current`](sas_core::agent::still_current)): a late copy after a retry, a cancel or the task's end.
    pub fenced: u64,
    /// The most calls of [`LIMITED_AGENT`](super::LIMITED_AGENT) open at once.
    pub limited_max: u32,
    /// The most elements of one map running at once.
    pub elements_max: u32,
    /// How the map elements ended (`end_states` counts the submitted tasks only).
    pub element_states: BTreeMap<String, usize>,
    /// Steps skipped (a guard false, or every step they wait for skipped), all tasks together.
    pub skipped: u64,
    /// Failures a step's `on_failure: continue` handled (the task went on).
    pub handled_failures: u64,
    /// How the child tasks of workflow steps ended.
    pub child_states: BTreeMap<String, usize>,
    /// The most tasks of one concurrency key seen running at once (claimed, not ended).
    pub key_max: usize,
    /// Tasks created waiting for a slot of their key.
    pub key_waited: usize,
    /// The schedule's instants sent (by the sweeps, before it was deleted), and the tasks they made.
    pub scheduled_sent: u64,
    pub scheduled_tasks: usize,
}
