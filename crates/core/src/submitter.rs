//! The Submitter: validate an application's submission, record the task and its steps
//! idempotently, and hand it to the Scheduler. A refused message is kept in the submission DLQ
//! with its reason and answered with a `Rejected` status when it names a usable reply queue; it is
//! never retried.

use serde_json::Value;
use tracing::{info, warn};

use crate::bus::Record;
use crate::deps::{Deps, HandlerError};
use crate::effects::{self, Started};
use crate::ids::{clip, message_mark, IdError, TaskId};
use crate::keys;
use crate::messages::{QueueUrl, StatusMessage, Submission, VERSION};
use crate::protocol::{self, ProcessState, Task};
use crate::reply::{self, ReplyToError};
use crate::screen;
use crate::store::{StoreError, MAX_ITEM_BYTES};
use sas_protocol::keys::Entered;
use sas_protocol::schedules::{self, Overlap};

/// Why a submission was refused. The reason is sent to the caller and kept with the raw message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejection {
    #[error("the message is not JSON: {0}")]
    NotJson(String),
    /// Deeper than the parser goes: nothing of it is read but where to send the refusal.
    #[error(
        "the message nests more than {MAX_PARSE_DEPTH} levels deep ({0}); a submission's input may nest at most \
         {max_input} levels",
        max_input = screen::MAX_DEPTH
    )]
    TooDeep(String),
    #[error("the message must be a JSON object")]
    NotObject,
    #[error("unsupported message version {got}; this deployment accepts v={VERSION}")]
    Version { got: String },
    #[error("the submission does not match the contract: {0}")]
    Shape(String),
    #[error("invalid task_id: {0}")]
    TaskId(#[from] IdError),
    #[error("unknown workflow {name}{}", version.map(|v| format!(" version {v}")).unwrap_or_default())]
    UnknownWorkflow { name: String, version: Option<u32> },
    #[error("input is {bytes} bytes; the limit is {limit}")]
    TooLarge { bytes: usize, limit: usize },
    /// Not a queue URL, one of the stack's own queues, or not on the stack's allow-list.
    #[error(transparent)]
    ReplyTo(#[from] ReplyToError),
    #[error("the input cannot be stored: {0}")]
    Unstorable(String),
    /// The input names no usable concurrency key for its workflow.
    #[error("{0}")]
    Key(String),
    /// Its concurrency key is busy and its workflow refuses (`when_busy: refuse`), or its line is
    /// full. Not a mistake of the message: it is answered `Rejected`, not kept in the DLQ.
    #[error("its key is busy: {0}")]
    Busy(String),
}

/// The submitter's verdict on one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created(TaskId),
    Duplicate(TaskId),
    Rejected(Rejection),
}

/// How deep serde_json parses a document (its recursion limit).
pub const MAX_PARSE_DEPTH: usize = 128;

/// Why a message could not be parsed.
fn not_json(e: &serde_json::Error) -> Rejection {
    let text = e.to_string();
    match text.strip_prefix("recursion limit exceeded ") {
        Some(at) => Rejection::TooDeep(at.to_owned()),
        None => Rejection::NotJson(text),
    }
}

fn validate(
    deps: &Deps,
    raw: &str,
    parsed: Result<Value, serde_json::Error>,
    message_id: Option<&str>,
) -> Result<(Submission, TaskId), Rejection> {
    let v: Value = parsed.map_err(|e| not_json(&e))?;
    let obj = v.as_object().ok_or(Rejection::NotObject)?;
    screen::no_duplicate_keys(raw).map_err(|e| Rejection::Shape(clip(&e, 300).to_owned()))?;
    match obj.get("v") {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(VERSION)) => {}
        other => {
            let got = other.map_or_else(|| "(missing)".to_owned(), Value::to_string);
            return Err(Rejection::Version { got: clip(&got, 64).to_owned() });
        }
    }
    let sub: Submission =
        serde_json::from_value(v).map_err(|e| Rejection::Shape(clip(&e.to_string(), 300).to_owned()))?;
    if let Some(r) = &sub.reply_to {
        reply::check(&deps.resources, r)?;
    }
    screen::storable(&sub.input).map_err(Rejection::Unstorable)?;
    let bytes = sas_protocol::messages::json_len(&sub.input);
    if bytes > deps.settings.max_input_bytes {
        return Err(Rejection::TooLarge { bytes, limit: deps.settings.max_input_bytes });
    }
    if let Some(p) = sub.priority.filter(|p| *p > sas_protocol::keys::MAX_PRIORITY) {
        return Err(Rejection::Shape(format!(
            "priority is {p}; it is from 0 (the default, the lowest) to {}",
            sas_protocol::keys::MAX_PRIORITY
        )));
    }
    if deps.workflows.resolve(&sub.workflow, sub.workflow_version).is_none() {
        let name = clip(&sub.workflow, 64).to_owned();
        return Err(Rejection::UnknownWorkflow { name, version: sub.workflow_version });
    }
    let id = match (&sub.task_id, message_id) {
        // `~` marks the ids of map elements, which only the Scheduler creates.
        (Some(id), _) if id.is_child() => return Err(Rejection::TaskId(IdError::BadChar { what: "task_id", ch: '~' })),
        (Some(id), _) => id.clone(),
        // A redelivery of the same message must not create a second task: the id comes from the
        // message, which SQS keeps across deliveries.
        (None, Some(m)) => task_id_for_message(m),
        (None, None) => TaskId::generate(),
    };
    Ok((sub, id))
}

/// The task id of a submission that names none: stable for one SQS message.
pub fn task_id_for_message(message_id: &str) -> TaskId {
    let clean: String =
        message_id.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).take(100).collect();
    TaskId::try_from(format!("msg-{clean}")).unwrap_or_else(|_| TaskId::generate())
}

/// Best effort for a refused message: whatever `task_id` it names, if usable, and its `reply_to`
/// if this stack may send to it (a refused reply queue hears nothing: the reason is kept in the
/// submission DLQ). A message the parser cannot read (nested too deep, or cut short) is scanned
/// for those two top-level strings instead.
fn salvage(deps: &Deps, raw: &str) -> (Option<TaskId>, Option<QueueUrl>) {
    let (id, reply) = if let Ok(v) = serde_json::from_str::<Value>(raw) {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        (text("task_id"), text("reply_to"))
    } else {
        let found = top_level_strings(raw, &["task_id", "reply_to"]);
        let text = |k: &str| found.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        (text("task_id"), text("reply_to"))
    };
    let id = id.and_then(|s| TaskId::try_from(s).ok());
    let reply = reply.and_then(|s| reply::check(&deps.resources, &s).ok());
    (id, reply)
}

/// The string members named `keys` at the top level of a JSON object, found without parsing the
/// rest: a scan that counts brackets outside strings, each string decoded by serde_json. For a
/// message the parser refused (nested deeper than [`MAX_PARSE_DEPTH`], or cut short) and that is
/// refused anyway: it only finds where to send the refusal. (serde_json reads deeper documents
/// only with its `unbounded_depth` feature and a growing stack, serde_stacker: a dependency for
/// two strings of a message already refused.) The first member of a name wins.
pub fn top_level_strings(raw: &str, keys: &[&str]) -> Vec<(String, String)> {
    let b = raw.as_bytes();
    let mut out: Vec<(String, String)> = Vec::new();
    if !raw.trim_start().starts_with('{') {
        return out;
    }
    let (mut depth, mut i) = (0usize, 0usize);
    let mut key: Option<String> = None;
    let mut value_next = false;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += usize::from(b[i] == b'\\') + 1;
                }
                let end = (i + 1).min(b.len());
                if depth == 1 {
                    let text = raw.get(start..end).and_then(|s| serde_json::from_str::<String>(s).ok());
                    if value_next {
                        if let (Some(k), Some(v)) = (key.take(), text) {
                            if keys.contains(&k.as_str()) && !out.iter().any(|(seen, _)| *seen == k) {
                                out.push((k, v));
                            }
                        }
                        value_next = false;
                    } else {
                        key = text;
                    }
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth == 2 {
                    (key, value_next) = (None, false);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b':' if depth == 1 => value_next = key.is_some(),
            b',' if depth == 1 => (key, value_next) = (None, false),
            _ => {}
        }
        i += 1;
    }
    out
}

/// Keep the refused message with its reason and tell the caller, if it named a reply queue.
async fn reject(
    deps: &Deps,
    raw: &str,
    message_id: Option<&str>,
    rejection: Rejection,
) -> Result<Submitted, HandlerError> {
    let reason = rejection.to_string();
    let (id, reply) = salvage(deps, raw);
    // The status names the submission it answers: its own task_id when usable, else the id its
    // message would have given it (distinct per message, so FIFO reply queues keep each one).
    let id = id.or_else(|| message_id.map(task_id_for_message));
    warn!(task_id = id.as_ref().map(TaskId::as_str), %reason, "submission rejected");
    let now = deps.now();
    deps.outbox().reject_to_dlq(raw, &reason, now).await?;
    crate::metrics::count(&crate::metrics::SUBMISSIONS_REJECTED, &[], 1);
    if let Some(q) = reply {
        tell_rejected(deps, q.as_str(), id.unwrap_or_else(TaskId::generate), reason).await;
    }
    Ok(Submitted::Rejected(rejection))
}

/// The `Rejected` status of a submission that made no task, to its reply queue (checked); a send
/// that fails is logged, the verdict stands.
async fn tell_rejected(deps: &Deps, queue: &str, task_id: TaskId, reason: String) {
    let status =
        StatusMessage { reason: Some(reason), ..StatusMessage::new(task_id, 0, ProcessState::Rejected, deps.now()) };
    if let Err(e) = deps.outbox().reply(queue, &status).await {
        warn!(error = %e, "could not send the Rejected status");
    }
}

/// A submission whose concurrency key is busy, under `when_busy: refuse` (or with a full line):
/// nothing is created; the caller hears `Rejected` with the reason. Not a mistake of the message,
/// so it is not kept in the submission DLQ (a schedule that skips while its last run goes on
/// would fill it).
async fn refuse_busy(
    deps: &Deps,
    task_id: &TaskId,
    reply_to: Option<&str>,
    why: String,
) -> Result<Submitted, HandlerError> {
    let rejection = Rejection::Busy(why);
    info!(%task_id, reason = %rejection, "submission refused: its concurrency key is busy");
    crate::metrics::count(&crate::metrics::SUBMISSIONS_REJECTED, &[], 1);
    if let Some(q) = reply_to.and_then(|r| reply::check(&deps.resources, r).ok()) {
        tell_rejected(deps, q.as_str(), task_id.clone(), rejection.to_string()).await;
    }
    Ok(Submitted::Rejected(rejection))
}

/// Handle one message of the submission queue (a submission without `task_id` gets one derived
/// from the message id, the same on every delivery).
pub async fn submit_message(deps: &Deps, record: &Record) -> Result<Submitted, HandlerError> {
    submit_with(deps, &record.body, serde_json::from_str(&record.body), Some(&record.message_id)).await
}

/// [`submit_message`] for a record read once ([`crate::envelope::Envelope::open`]): `parsed`
/// is its body as JSON.
pub async fn submit_parsed(
    deps: &Deps,
    record: &Record,
    parsed: Result<Value, serde_json::Error>,
) -> Result<Submitted, HandlerError> {
    submit_with(deps, &record.body, parsed, Some(&record.message_id)).await
}

/// Handle one submission body (a submission without `task_id` gets a fresh random id).
pub async fn submit(deps: &Deps, raw: &str) -> Result<Submitted, HandlerError> {
    submit_with(deps, raw, serde_json::from_str(raw), None).await
}

/// Tell the reply queue of a submission that created nothing that its task exists, and how it
/// stands (with its outputs when it is `Processed`). Best effort, like every status: a failed send
/// is logged, and the submission is not retried for it.
async fn tell_duplicate(deps: &Deps, reply_to: &str, task: &Task) {
    // every state change is in the history, so its last entry is the task's state (the fallback
    // is for an item written by hand)
    let mut status = match task.history.last() {
        Some(last) => task.status_of(last),
        None => StatusMessage::new(task.task_id.clone(), task.status_seq, task.process_state, task.updated_at),
    };
    status.duplicate = true;
    status.reason = Some(format!(
        "duplicate submission: task {} exists already ({}); this submission created nothing{}",
        task.task_id,
        task.process_state,
        status.reason.as_deref().map(|r| format!(" (task: {r})")).unwrap_or_default()
    ));
    if let Err(e) = deps.outbox().reply(reply_to, &status).await {
        warn!(task_id = %task.task_id, error = %e, "could not send the duplicate-submission status");
    }
}

/// The task exists: if this very submission created it (its mark is the task's last write: the
/// message came back, or an SQS duplicate ran beside it, possibly after its handler died or its
/// sends failed) and the task has not moved since, its start is owed and is sent again. A
/// different submission that reuses the task id finds nothing owed. A resend that fails fails the
/// record, like a first send: the submission comes back (a submission DLQ entry for a task that
/// exists means its start could not be sent for `maxReceiveCount` deliveries; the Supervisor
/// retries the attempt regardless).
async fn resend(deps: &Deps, task: Task, mark: Option<&str>) -> Result<(), HandlerError> {
    let Some(mark) = mark else { return Ok(()) };
    if task.last_message.as_deref() != Some(mark) {
        return Ok(());
    }
    match effects::resend(deps, task).await?.work {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

async fn submit_with(
    deps: &Deps,
    raw: &str,
    parsed: Result<Value, serde_json::Error>,
    message_id: Option<&str>,
) -> Result<Submitted, HandlerError> {
    let (sub, task_id) = match validate(deps, raw, parsed, message_id) {
        Ok(ok) => ok,
        Err(rejection) => return reject(deps, raw, message_id, rejection).await,
    };
    let def = deps.workflows.resolve(&sub.workflow, sub.workflow_version).expect("validated").clone();
    let mut key = match sas_protocol::keys::key_item(&def, &sub.input) {
        Ok(key) => key,
        Err(why) => return reject(deps, raw, message_id, Rejection::Key(why)).await,
    };
    let mut concurrency = def.concurrency.clone();
    if let (None, Some(run)) = (&key, &sub.schedule) {
        // an instant of a schedule: the schedule's overlap policy, as the schedule's key
        if let Some(when_busy) = crate::schedules::overlap_of(deps, run).await?.and_then(Overlap::when_busy) {
            let (k, c) = schedules::key(&run.name, when_busy);
            (key, concurrency) = (Some(k), Some(c));
        }
    }
    // a keyed task enters its key first: granted, it starts; else it waits, or is refused
    let mut waiting = None;
    if let (Some(key), Some(c)) = (&key, &concurrency) {
        match keys::enter(deps, key, &task_id, c, sub.priority.unwrap_or(0)).await? {
            Entered::Granted => {}
            Entered::Waiting { ahead } => waiting = Some(ahead),
            Entered::Refused(why) => return refuse_busy(deps, &task_id, sub.reply_to.as_deref(), why).await,
        }
    }
    let ctx = crate::protocol::Ctx { paused: deps.paused(&def.name, key.as_deref()).await?, ..deps.ctx() };
    let now = ctx.now;
    let policy = &deps.settings.policy;
    let mut tr = match (&key, waiting) {
        (Some(k), Some(_)) => {
            protocol::submit_waiting(task_id.clone(), def, sub.input, sub.reply_to, k.clone(), &ctx, policy)
        }
        _ => protocol::submit_in_slot(task_id.clone(), def, sub.input, sub.reply_to, key.clone(), &ctx, policy),
    };
    let mark = message_id.map(message_mark);
    tr.task.last_message.clone_from(&mark);
    let reply_to = tr.task.reply_to.clone();
    // A create that landed but whose answer was lost (the SDK sent it again) finds its own item:
    // that is a new task too, and its start is still to be sent.
    let started = effects::start(deps, tr, now).await;
    if let Some(k) = &key {
        // the key lists this id, but this submission created no task of it that runs: an ended
        // task, another submission's, or none at all
        let created = match &started {
            Ok(Started::New { .. }) => true,
            Ok(Started::Exists(t)) => !t.process_state.is_terminal() && t.slot.as_ref().is_some_and(|s| &s.key == k),
            Err(_) => false,
        };
        let retried = matches!(&started, Err(e) if !e.is_permanent() && !matches!(e, StoreError::AlreadyExists));
        if !created && !retried {
            keys::release(deps, k, &task_id).await?;
        }
    }
    let (task, sent) = match started {
        Ok(Started::New { task, sent }) => (task, sent),
        Ok(Started::Exists(t)) => {
            info!(%task_id, "duplicate submission: the task exists, nothing created");
            if let Some(q) = &reply_to {
                tell_duplicate(deps, q, &t).await;
            }
            if let Some(slot) = t.slot.as_ref().filter(|_| t.waits_for_slot()) {
                // a grant made while its first creation's handler died finds no run sent
                keys::start_if_granted(deps, &slot.key, &task_id).await?;
            }
            resend(deps, *t, mark.as_deref()).await?;
            return Ok(Submitted::Duplicate(task_id));
        }
        Err(StoreError::AlreadyExists) => {
            info!(%task_id, "duplicate submission: the task existed (it expired since), nothing created");
            return Ok(Submitted::Duplicate(task_id));
        }
        Err(StoreError::TooLarge { bytes }) => {
            return reject(deps, raw, message_id, Rejection::TooLarge { bytes, limit: MAX_ITEM_BYTES }).await
        }
        Err(e @ StoreError::Refused { .. }) => {
            return reject(deps, raw, message_id, Rejection::Unstorable(e.to_string())).await
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(ahead) = waiting {
        info!(
            %task_id, workflow = %task.workflow.name, version = task.workflow.version, key = key.as_deref().unwrap_or("-"),
            ahead, "task created, waiting for a slot of its concurrency key"
        );
    } else {
        info!(
            %task_id, workflow = %task.workflow.name, version = task.workflow.version,
            step = task.current_step_name().unwrap_or("-"), "task created, first step claimed"
        );
    }
    crate::metrics::record_created(&task);
    if let (Some(k), Some(_)) = (&key, waiting) {
        keys::start_if_granted(deps, k, &task_id).await?;
    }
    // The start did not go out: fail the record, so the submission comes back and the start is
    // sent again (above), long before the Supervisor would find the attempt lost.
    if let Some(e) = sent.work {
        return Err(e.into());
    }
    effects::record_undelivered(deps, &task, &sent).await;
    Ok(Submitted::Created(task_id))
}
