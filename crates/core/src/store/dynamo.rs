//! The DynamoDB state store: one table, one item per task, one conditional `PutItem` per
//! transition (with `ReturnValuesOnConditionCheckFailure`, so a lost write returns the current
//! item at no extra read).
//!
//! Every write unit is billed per started KB of the item, in the table and again in each index
//! the item is in, so the item is kept small and the indexes sparse:
//! - the pinned workflow definition is stored once, as its own item (`TaskId` =
//!   `workflow:{name}@{version}:{digest}`), and a task names it in `WorkflowRef`;
//! - `Shard` with `CompleteBy`: the keys of the `ByCompleteBy` index (keys only), present only
//!   while the task is in flight ([`super::index_key`]), so the Supervisor's queries cost what is
//!   expired, not the table, and read a few dozen bytes per expired task;
//! - `EndShard` with `UpdatedAt`: the keys of the `ByEnd` index, present only once the task has
//!   ended ([`super::end_key`]): written once per task, spread over the shards;
//! - `ExpiresAt`: the TTL of a terminal task (never for `Error`).
//!
//! A task's history past the protocol's `history_limit` is not rewritten by every later write:
//! each entry the item drops is archived as an item of its own (`TaskId` =
//! `history:{task}:{seq}`, attribute `Entry`), one `PutItem` (1 write unit) per entry dropped,
//! so only tasks with more than `history_limit` status changes pay for it. Archived entries
//! expire `RetentionDays` + 30 days after they were written.
//!
//! An input larger than [`INLINE_INPUT_MAX`] is not rewritten by every write either: it never
//! changes, so it is stored once, as an item of its own (`TaskId` = `input:{task}:{digest}`,
//! attribute `Input`), written before the task's item is created, and the task names it in
//! `InputRef`. A map over a 1,000-line order thus writes a parent of about a kilobyte at each
//! element's end, not the 17 KB array each time. The input is read with the task (strongly
//! consistent, once per process: it is cached, being immutable) and expires 30 days after the task
//! (rewritten with its `ExpiresAt` once, when the task ends).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, ReturnValuesOnConditionCheckFailure, Select};
use aws_sdk_dynamodb::Client;
use fnv::FnvHasher;
use futures::future::BoxFuture;

use super::{
    check_size, end_key, index_key, is_own_write, Page, PageKey, StateStore, StoreError, TaskSummary, TaskWriter,
};
use super::{Acquire, KeyStore, Limiter, Pacer, PauseStore, Pauses, ScheduleStore, PAUSES_KEY, SCHEDULES_KEY};
use crate::ids::{AttemptToken, Millis, TaskId};
use crate::limit::{expired_leases, limit_key};
use crate::protocol::{HistoryEntry, ProcessState, Task, ITEM_FORMAT};
use crate::workflow::WorkflowDef;
use sas_protocol::keys::KeyState;

pub const BY_COMPLETE_BY: &str = "ByCompleteBy";
pub const BY_END: &str = "ByEnd";
/// What an agent reads of a task before it starts a call ([`StateStore::holder`]): its key and
/// `LockedBy`, the attributes the Agent function's role may read (template.yaml, Sid
/// `AgentFence`).
pub const HOLDER_PROJECTION: &str = "TaskId, LockedBy";
/// `TaskId` prefix of workflow definition items (`:` never appears in a task id).
const WORKFLOW_KEY_PREFIX: &str = "workflow:";
const HISTORY_KEY_PREFIX: &str = "history:";
const INPUT_KEY_PREFIX: &str = "input:";
/// An input over this many bytes (as DynamoDB counts them) is stored as an item of its own.
pub const INLINE_INPUT_MAX: usize = 4096;
/// Inputs kept in memory per process (each at most `MaxInputBytes`, 256 KiB).
const INPUT_CACHE_MAX: usize = 64;

/// The key of an archived history entry (`seq` zero-padded: the keys sort as the entries do).
fn history_key(task_id: &TaskId, seq: u64) -> String {
    format!("{HISTORY_KEY_PREFIX}{task_id}:{seq:010}")
}
/// `BatchGetItem` takes at most 100 keys.
const BATCH_GET_MAX: usize = 100;

type Item = HashMap<String, AttributeValue>;

fn aws<E>(
    op: &'static str,
) -> impl FnOnce(aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>) -> StoreError
where
    aws_sdk_dynamodb::Error: From<aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>>,
{
    move |e| backend(op, e.into())
}

fn backend(op: &'static str, e: aws_sdk_dynamodb::Error) -> StoreError {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    if e.code() == Some("ValidationException") {
        // a value DynamoDB cannot hold, an item over its size: the same request fails every time
        let message = aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string();
        return StoreError::Refused { op, message: crate::ids::clip(&message, 1024).to_owned() };
    }
    StoreError::Backend {
        op,
        message: format!("DynamoDB {op}: {}", aws_sdk_dynamodb::error::DisplayErrorContext(&e)),
        source: Some(Box::new(e)),
    }
}

/// Refuse an item of a later format than this build's ([`ITEM_FORMAT`]; absent: format 1).
fn check_format(item: &Item) -> Result<(), StoreError> {
    match item.get("Format") {
        None => Ok(()),
        Some(AttributeValue::N(n)) => match n.parse::<u32>() {
            Ok(format) if format > ITEM_FORMAT => Err(StoreError::LaterFormat { format }),
            Ok(_) => Ok(()),
            Err(_) => Err(StoreError::Codec(format!("the item's Format is not a format: {n}"))),
        },
        Some(other) => Err(StoreError::Codec(format!("the item's Format is not a number: {other:?}"))),
    }
}

#[allow(clippy::needless_pass_by_value)] // used as `map_err(codec)`
fn codec(e: serde_dynamo::Error) -> StoreError {
    StoreError::Codec(e.to_string())
}

/// The name of a workflow definition's item: `{name}@{version}:{digest}`, the digest a hash of the
/// definition, so a definition changed under the same version is stored apart.
pub fn workflow_ref(def: &WorkflowDef) -> String {
    format!("{}@{}:{:016x}", def.name, def.version, digest(def))
}

/// A stable 64-bit digest (FNV-1a, fed bytes only: never `Hash`, whose encoding is not promised to
/// stay) of a definition's JSON.
fn digest(value: &WorkflowDef) -> u64 {
    let mut h = FnvHasher::default();
    h.write(serde_json::to_string(value).unwrap_or_default().as_bytes());
    h.finish()
}

/// The key of the item holding a task's input when it is stored apart (the digest makes two
/// different inputs under one task id two items: a duplicate submission never overwrites one).
///
/// The digest is of the input as DynamoDB holds it, not of its JSON: a task read back must name
/// the same item when written again, and JSON does not survive the trip (`10.0` is stored as the
/// number 10 and reads back as `10`; a map's keys come back in another order).
fn input_key(task_id: &TaskId, input: &AttributeValue) -> String {
    let mut h = FnvHasher::default();
    digest_value(input, &mut h);
    format!("{INPUT_KEY_PREFIX}{task_id}:{:016x}", h.finish())
}

/// FNV-1a over a canonical form of `v`: a tag per kind, lengths before contents, map keys sorted.
fn digest_value(v: &AttributeValue, h: &mut FnvHasher) {
    fn text(h: &mut FnvHasher, tag: u8, s: &str) {
        h.write(&[tag]);
        h.write(&(s.len() as u64).to_le_bytes());
        h.write(s.as_bytes());
    }
    match v {
        AttributeValue::S(s) => text(h, b's', s),
        AttributeValue::N(n) => text(h, b'n', n),
        AttributeValue::Bool(b) => h.write(&[b'b', u8::from(*b)]),
        AttributeValue::Null(_) => h.write(b"z"),
        AttributeValue::L(l) => {
            h.write(b"l");
            h.write(&(l.len() as u64).to_le_bytes());
            for v in l {
                digest_value(v, h);
            }
        }
        AttributeValue::M(m) => {
            h.write(b"m");
            h.write(&(m.len() as u64).to_le_bytes());
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                text(h, b'k', k);
                digest_value(&m[k], h);
            }
        }
        // sets and binaries never come from JSON
        other => text(h, b'?', &format!("{other:?}")),
    }
}

/// The definitions this process knows, and those it knows are stored (one cell per definition,
/// so that concurrent creations store it once: a lost conditional write costs a write unit too).
#[derive(Debug, Default)]
struct Workflows {
    defs: HashMap<String, WorkflowDef>,
    stored: HashMap<String, Arc<tokio::sync::OnceCell<()>>>,
}

/// The DynamoDB implementation of [`StateStore`].
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    shards: u32,
    retention_days: u32,
    workflows: Arc<Mutex<Workflows>>,
    /// Inputs stored apart, by key (immutable: a cached one is never stale).
    inputs: Arc<Mutex<HashMap<String, AttributeValue>>>,
    /// How long the rate items' writes take here, smoothed (ms): the pacing's lead.
    pace_write_ms: Arc<AtomicU64>,
}

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32, retention_days: u32) -> Self {
        DynamoStore {
            client,
            table: table.into(),
            shards,
            retention_days,
            workflows: Arc::default(),
            inputs: Arc::default(),
            pace_write_ms: Arc::default(),
        }
    }

    /// Know these definitions without reading them (the deployed ones); tasks pinned to other
    /// definitions are read once per process.
    #[must_use]
    pub fn knowing<'a>(self, defs: impl IntoIterator<Item = &'a WorkflowDef>) -> Self {
        {
            let mut w = self.known();
            for d in defs {
                w.defs.insert(workflow_ref(d), d.clone());
            }
        }
        self
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn known(&self) -> MutexGuard<'_, Workflows> {
        self.workflows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The item as written: the task, its workflow by reference, and the derived attributes.
    pub fn to_item(&self, task: &Task) -> Result<Item, StoreError> {
        check_size(task)?;
        let mut item: Item = serde_dynamo::to_item(task).map_err(codec)?;
        item.remove("Workflow");
        let r = workflow_ref(&task.workflow);
        self.known().defs.entry(r.clone()).or_insert_with(|| task.workflow.clone());
        item.insert("WorkflowRef".into(), AttributeValue::S(r));
        if ITEM_FORMAT > 1 {
            item.insert("Format".into(), AttributeValue::N(ITEM_FORMAT.to_string()));
        }
        if item.get("Input").is_some_and(|v| value_size(v) > INLINE_INPUT_MAX) {
            let input = item.remove("Input").expect("checked above");
            item.insert("InputRef".into(), AttributeValue::S(input_key(&task.task_id, &input)));
        }
        if task.process_state.is_terminal() {
            // An Error task waits for an operator: it never expires.
            if self.retention_days > 0 && task.process_state != ProcessState::Error {
                let expires = task.updated_at.0 / 1000 + u64::from(self.retention_days) * 86_400;
                item.insert("ExpiresAt".into(), AttributeValue::N(expires.to_string()));
            }
            if let Some(k) = end_key(task, self.shards) {
                item.insert("EndShard".into(), AttributeValue::S(k));
            }
        } else if let Some((shard, _)) = index_key(task, self.shards) {
            item.insert("Shard".into(), AttributeValue::S(shard.to_string()));
        }
        Ok(item)
    }

    /// The task an item holds, its workflow definition resolved (read once per process).
    pub async fn decode(&self, mut item: Item) -> Result<Task, StoreError> {
        check_format(&item)?;
        if !item.contains_key("Workflow") {
            let r = match item.get("WorkflowRef") {
                Some(AttributeValue::S(r)) => r.clone(),
                _ => return Err(StoreError::Codec("the item has neither Workflow nor WorkflowRef".into())),
            };
            let def = self.workflow(&r).await?;
            item.insert("Workflow".into(), serde_dynamo::to_attribute_value(def).map_err(codec)?);
        }
        if let Some(AttributeValue::S(r)) = item.remove("InputRef") {
            item.insert("Input".into(), self.input(&r).await?);
        }
        serde_dynamo::from_item(item).map_err(codec)
    }

    /// The input stored apart under `key`: from this process's cache, else a strongly consistent
    /// `GetItem` (it was written before the task's item that names it).
    async fn input(&self, key: &str) -> Result<AttributeValue, StoreError> {
        if let Some(v) = self.cached_inputs().get(key) {
            return Ok(v.clone());
        }
        let v = self
            .get_raw(key.to_owned())
            .await?
            .and_then(|mut i| i.remove("Input"))
            .ok_or_else(|| StoreError::Codec(format!("the task's input {key} is not in the table")))?;
        let mut cache = self.cached_inputs();
        if cache.len() >= INPUT_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key.to_owned(), v.clone());
        Ok(v)
    }

    fn cached_inputs(&self) -> MutexGuard<'_, HashMap<String, AttributeValue>> {
        self.inputs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The item holding the task's input when its item names one (`InputRef`), with the task's
    /// `ExpiresAt` plus 30 days once the task has one.
    fn input_item(task: &Task, item: &Item) -> Result<Option<Item>, StoreError> {
        let Some(AttributeValue::S(key)) = item.get("InputRef") else { return Ok(None) };
        let mut input = Item::from([
            ("TaskId".to_owned(), AttributeValue::S(key.clone())),
            ("Input".to_owned(), serde_dynamo::to_attribute_value(&task.input).map_err(codec)?),
        ]);
        if let Some(AttributeValue::N(at)) = item.get("ExpiresAt") {
            let at: u64 = at.parse().unwrap_or(0);
            input.insert("ExpiresAt".into(), AttributeValue::N((at + 30 * 86_400).to_string()));
        }
        Ok(Some(input))
    }

    async fn workflow(&self, r: &str) -> Result<WorkflowDef, StoreError> {
        if let Some(d) = self.known().defs.get(r) {
            return Ok(d.clone());
        }
        let def = self
            .get_raw(format!("{WORKFLOW_KEY_PREFIX}{r}"))
            .await?
            .and_then(|mut i| i.remove("Definition"))
            .ok_or_else(|| StoreError::Codec(format!("workflow definition {r} is not in the table")))?;
        let def: WorkflowDef = serde_dynamo::from_attribute_value(def).map_err(codec)?;
        let mut w = self.known();
        w.defs.insert(r.to_owned(), def.clone());
        let _ = w.stored.entry(r.to_owned()).or_default().set(());
        Ok(def)
    }

    /// Store the task's workflow definition unless this process knows it is stored (one
    /// conditional write per definition and process).
    async fn ensure_workflow(&self, def: &WorkflowDef) -> Result<(), StoreError> {
        let r = workflow_ref(def);
        let cell = self.known().stored.entry(r.clone()).or_default().clone();
        cell.get_or_try_init(|| self.put_workflow(&r, def)).await.copied()
    }

    async fn put_workflow(&self, r: &str, def: &WorkflowDef) -> Result<(), StoreError> {
        let item = Item::from([
            ("TaskId".to_owned(), AttributeValue::S(format!("{WORKFLOW_KEY_PREFIX}{r}"))),
            ("Definition".to_owned(), serde_dynamo::to_attribute_value(def).map_err(codec)?),
        ]);
        // already stored (by another process): as good
        self.put_new(item).await.map(drop)
    }

    async fn create_item(&self, task: &Task) -> Result<(), StoreError> {
        let item = self.to_item(task)?;
        self.ensure_workflow(&task.workflow).await?;
        let input = Self::input_item(task, &item)?;
        if let Some(input) = &input {
            // there already (a create sent again): the same content, by its key's digest
            self.put_new(input.clone()).await?;
        }
        let Some(there) = self.put_new(item.clone()).await? else { return Ok(()) };
        if there == item {
            // The item there is the very item this create wrote: the SDK sent the request again
            // after the first copy had landed. Created, not a duplicate. (Compared as stored: a
            // task read back is not always the task written, e.g. an input's 10.0 reads as 10.)
            return Ok(());
        }
        if let (Some(input), false) = (input, there.get("InputRef") == item.get("InputRef")) {
            // A duplicate with another input: the input just stored is no task's. It expires in a
            // day (a caller repeating a task id with new inputs does not grow the table for good).
            self.expire_orphan(task, input).await;
        }
        // An item in another layout (written before an upgrade) may still hold this very task.
        match self.decode(there).await {
            Ok(t) if is_own_write(&t, task) => Ok(()),
            _ => Err(StoreError::AlreadyExists),
        }
    }

    async fn expire_orphan(&self, task: &Task, mut input: Item) {
        let at = Millis::now().0 / 1000 + 86_400;
        input.insert("ExpiresAt".into(), AttributeValue::N(at.to_string()));
        if let Err(e) = self.client.put_item().table_name(&self.table).set_item(Some(input)).send().await {
            let e = aws_sdk_dynamodb::Error::from(e);
            tracing::warn!(task_id = %task.task_id, error = %e, "a duplicate's input item not given its ExpiresAt");
        }
    }

    /// Write `item` if its key is free: `Ok(Some(existing))` (the item there) when it is taken.
    async fn put_new(&self, item: Item) -> Result<Option<Item>, StoreError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(TaskId)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(None),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                    Ok(Some(c.item.unwrap_or_default()))
                }
                other => Err(backend("PutItem", other.into())),
            },
        }
    }

    /// The item under `key`, strongly consistent.
    async fn get_raw(&self, key: String) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("TaskId", AttributeValue::S(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(aws("GetItem"))?;
        Ok(out.item)
    }

    /// `LockedBy` of the task, strongly consistent, and nothing else (1 read unit while the item
    /// is under 4 KB: DynamoDB bills the item, not the projection).
    async fn get_holder(&self, task_id: &TaskId) -> Result<Option<AttemptToken>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("TaskId", AttributeValue::S(task_id.to_string()))
            .projection_expression(HOLDER_PROJECTION)
            .consistent_read(true)
            .send()
            .await
            .map_err(aws("GetItem"))?;
        Ok(out.item.and_then(|mut i| i.remove("LockedBy")).and_then(|v| match v {
            AttributeValue::S(s) => Some(AttemptToken::from(s.as_str())),
            _ => None,
        }))
    }

    async fn get_item(&self, task_id: &TaskId) -> Result<Option<Task>, StoreError> {
        match self.get_raw(task_id.to_string()).await? {
            Some(item) => Ok(Some(self.decode(item).await?)),
            None => Ok(None),
        }
    }

    /// Eventually consistent `BatchGetItem`s, 100 keys each; what DynamoDB leaves unprocessed
    /// (throttling) is asked again after a backoff.
    pub async fn get_items(&self, ids: &[TaskId]) -> Result<Vec<Task>, StoreError> {
        let keys = ids.iter().map(ToString::to_string).collect();
        let mut tasks = Vec::with_capacity(ids.len());
        for item in self.batch_get(keys).await? {
            tasks.push(self.decode(item).await?);
        }
        Ok(tasks)
    }

    /// The items of these `TaskId` keys that exist, eventually consistent: `BatchGetItem`s of 100
    /// keys, what DynamoDB leaves unprocessed (throttling) asked again after a backoff.
    async fn batch_get(&self, keys: Vec<String>) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_MAX) {
            let keys: Vec<Item> =
                chunk.iter().map(|k| Item::from([("TaskId".to_owned(), AttributeValue::S(k.clone()))])).collect();
            let mut pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .build()
                    .map_err(|e| StoreError::Codec(format!("BatchGetItem keys: {e}")))?,
            );
            let mut backoff = Duration::from_millis(50);
            while let Some(ka) = pending.take() {
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, ka)
                    .send()
                    .await
                    .map_err(aws("BatchGetItem"))?;
                items.extend(out.responses.unwrap_or_default().remove(&self.table).unwrap_or_default());
                pending = out.unprocessed_keys.unwrap_or_default().remove(&self.table).filter(|k| !k.keys().is_empty());
                if pending.is_some() {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        Ok(items)
    }

    /// Archive the history entries this write drops (see [`super::trimmed_history`]): written
    /// before the task, unconditionally (the same entry always has the same content).
    async fn archive_history(&self, task: &Task, read: &Task) -> Result<(), StoreError> {
        for h in super::trimmed_history(task, read) {
            let mut item = Item::from([
                ("TaskId".to_owned(), AttributeValue::S(history_key(&task.task_id, h.seq))),
                ("Entry".to_owned(), serde_dynamo::to_attribute_value(h).map_err(codec)?),
            ]);
            if self.retention_days > 0 {
                let expires = h.at.0 / 1000 + (u64::from(self.retention_days) + 30) * 86_400;
                item.insert("ExpiresAt".into(), AttributeValue::N(expires.to_string()));
            }
            self.client.put_item().table_name(&self.table).set_item(Some(item)).send().await.map_err(aws("PutItem"))?;
        }
        Ok(())
    }

    async fn archived(&self, task_id: &TaskId, from: u64, to: u64) -> Result<Vec<HistoryEntry>, StoreError> {
        let keys = (from..to).map(|seq| history_key(task_id, seq)).collect();
        let mut out = Vec::new();
        for mut item in self.batch_get(keys).await? {
            if let Some(e) = item.remove("Entry") {
                out.push(serde_dynamo::from_attribute_value::<_, HistoryEntry>(e).map_err(codec)?);
            }
        }
        out.sort_by_key(|h| h.seq);
        Ok(out)
    }

    async fn save_item(&self, task: &Task, read: &Task) -> Result<(), StoreError> {
        let item = self.to_item(task)?;
        let written = item.clone();
        self.archive_history(task, read).await?;
        // The item names its definition by a reference computed here: make sure the definition
        // item is there before any item names it (a task read in the previous layout, or a
        // definition that serialises differently in this build, names one nobody stored yet).
        // Once per definition and process.
        self.ensure_workflow(&task.workflow).await?;
        let mut req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .expression_attribute_names("#rev", "Rev")
            .expression_attribute_values(":rev", AttributeValue::N(read.rev.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        req = match &read.lock.locked_by {
            Some(token) => req
                .condition_expression("#rev = :rev AND LockedBy = :lock")
                .expression_attribute_values(":lock", AttributeValue::S(token.to_string())),
            None => req.condition_expression("#rev = :rev AND attribute_not_exists(LockedBy)"),
        };
        match req.send().await {
            Ok(_) => {}
            Err(e) => match e.into_service_error() {
                // The item there is the very item this write carried: it landed, and the SDK's
                // retry of it failed its condition (compared as stored, see create).
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c)
                    if c.item.as_ref() == Some(&written) => {}
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                    let current = match c.item {
                        Some(item) => Some(Box::new(self.decode(item).await?)),
                        None => None,
                    };
                    return Err(StoreError::Conflict { current });
                }
                other => return Err(backend("PutItem", other.into())),
            },
        }
        if !read.process_state.is_terminal() {
            self.expire_input(task, &written).await;
        }
        Ok(())
    }

    /// The task has just ended (`item` as written carries its `ExpiresAt`): its input stored apart
    /// expires 30 days after it. After the task's write, so that a crash between the two leaves an
    /// input that never expires rather than a task without its input; a failure is logged, not
    /// returned (the task's write stands, and a retry of the message would find it done).
    async fn expire_input(&self, task: &Task, item: &Item) {
        if !item.contains_key("ExpiresAt") {
            return;
        }
        let put = match Self::input_item(task, item) {
            Ok(Some(input)) => self.client.put_item().table_name(&self.table).set_item(Some(input)).send().await,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(task_id = %task.task_id, error = %e, "input item not encoded: it will not expire");
                return;
            }
        };
        if let Err(e) = put {
            let e = aws_sdk_dynamodb::Error::from(e);
            tracing::warn!(task_id = %task.task_id, error = %e, "input item not given its ExpiresAt: it will not expire");
        }
    }

    /// One page of a shard of `ByCompleteBy`, up to `until`.
    async fn query_in_flight(
        &self,
        shard: u32,
        until: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> Result<Page, StoreError> {
        let start = start.map(|k| {
            Item::from([
                ("TaskId".to_owned(), AttributeValue::S(k.task_id.to_string())),
                ("Shard".to_owned(), AttributeValue::S(shard.to_string())),
                ("CompleteBy".to_owned(), AttributeValue::N(k.complete_by.0.to_string())),
            ])
        });
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(BY_COMPLETE_BY)
            .key_condition_expression("#s = :s AND CompleteBy <= :now")
            .expression_attribute_names("#s", "Shard")
            .expression_attribute_values(":s", AttributeValue::S(shard.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(until.0.to_string()))
            .limit(i32::try_from(limit.clamp(1, 1000)).unwrap_or(1000))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(aws("Query"))?;
        let mut keys = Vec::new();
        let mut unreadable = Vec::new();
        for item in out.items.unwrap_or_default() {
            match page_key(&item) {
                Ok(k) => keys.push(k),
                Err(e) => unreadable.push(e.to_string()),
            }
        }
        let next = match out.last_evaluated_key {
            None => None,
            Some(k) => Some(page_key(&k)?),
        };
        Ok(Page { keys, next, unreadable })
    }

    /// A query of one shard of `ByEnd` for `state`.
    fn ended_query(
        &self,
        state: ProcessState,
        shard: u32,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.table)
            .index_name(BY_END)
            .key_condition_expression("EndShard = :k")
            .expression_attribute_values(":k", AttributeValue::S(format!("{state}#{shard}")))
    }

    /// Ended tasks in `state`, most recently ended first: every shard of `ByEnd`, merged.
    async fn query_ended(&self, state: ProcessState, max: usize) -> Result<Vec<TaskSummary>, StoreError> {
        let mut rows = Vec::new();
        for shard in 0..self.shards.max(1) {
            let mut start = None;
            let mut taken = 0;
            loop {
                let out = self
                    .ended_query(state, shard)
                    .scan_index_forward(false)
                    .limit(i32::try_from(max.clamp(1, 1000)).unwrap_or(1000))
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(aws("Query"))?;
                for item in out.items.unwrap_or_default() {
                    rows.push(summary(item)?);
                    taken += 1;
                }
                start = out.last_evaluated_key;
                if start.is_none() || taken >= max {
                    break;
                }
            }
        }
        rows.sort_by_key(|r| std::cmp::Reverse(r.updated_at));
        rows.truncate(max);
        Ok(rows)
    }

    /// Tasks in flight in `state`, most overdue first: the keys of every shard of
    /// `ByCompleteBy`, then the items.
    async fn query_in_flight_state(&self, state: ProcessState, max: usize) -> Result<Vec<TaskSummary>, StoreError> {
        let mut keys = Vec::new();
        for shard in 0..self.shards.max(1) {
            let mut start = None;
            loop {
                let page = self.query_in_flight(shard, Millis(u64::MAX / 2), 1000, start).await?;
                keys.extend(page.keys);
                start = page.next;
                if start.is_none() {
                    break;
                }
            }
        }
        keys.sort_by(|a, b| (a.complete_by, &a.task_id).cmp(&(b.complete_by, &b.task_id)));
        let mut rows = Vec::new();
        for chunk in keys.chunks(BATCH_GET_MAX) {
            let ids: Vec<TaskId> = chunk.iter().map(|k| k.task_id.clone()).collect();
            let mut tasks = self.get_items(&ids).await?;
            tasks.sort_by_key(|t| (t.complete_by, t.task_id.clone()));
            rows.extend(tasks.iter().filter(|t| t.process_state == state).map(TaskSummary::of));
            if rows.len() >= max {
                break;
            }
        }
        rows.truncate(max);
        Ok(rows)
    }

    async fn query_by_state(&self, state: ProcessState, max: usize) -> Result<Vec<TaskSummary>, StoreError> {
        if state.is_terminal() {
            self.query_ended(state, max).await
        } else {
            self.query_in_flight_state(state, max).await
        }
    }

    /// How many ended tasks are in `state` (`Select=COUNT` over every shard of `ByEnd`).
    pub async fn count_ended(&self, state: ProcessState) -> Result<u64, StoreError> {
        let mut count = 0u64;
        for shard in 0..self.shards.max(1) {
            let mut start = None;
            loop {
                let out = self
                    .ended_query(state, shard)
                    .select(Select::Count)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(aws("Query"))?;
                count += u64::try_from(out.count).unwrap_or(0);
                start = out.last_evaluated_key;
                if start.is_none() {
                    break;
                }
            }
        }
        Ok(count)
    }
}

/// A row of `ByEnd` (it projects what a listing shows).
pub fn summary(item: Item) -> Result<TaskSummary, StoreError> {
    let workflow = match item.get("WorkflowRef") {
        Some(AttributeValue::S(r)) => r.split('@').next().map(str::to_owned),
        _ => None,
    };
    let mut row: TaskSummary = serde_dynamo::from_item(item).map_err(codec)?;
    row.workflow_name = workflow;
    Ok(row)
}

/// An item's size as DynamoDB bills it: attribute names plus values (numbers at about one byte
/// per two digits, maps and lists at 3 bytes plus 1 per element). One write unit per started KB.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(l) => l.iter().map(String::len).sum(),
        AttributeValue::Ns(l) => l.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(l) => l.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::M(m) => 3 + m.iter().map(|(k, v)| k.len() + value_size(v) + 1).sum::<usize>(),
        AttributeValue::L(l) => 3 + l.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        _ => 1,
    }
}

fn number_size(n: &str) -> usize {
    let digits = n.trim_start_matches('-').chars().filter(char::is_ascii_digit).count();
    digits.div_ceil(2) + 1
}

/// The typed page key of a `ByCompleteBy` LastEvaluatedKey.
fn page_key(k: &Item) -> Result<PageKey, StoreError> {
    let bad = || StoreError::Codec(format!("unexpected LastEvaluatedKey {k:?}"));
    let task_id = match k.get("TaskId") {
        Some(AttributeValue::S(s)) => TaskId::try_from(s.as_str()).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    let complete_by = match k.get("CompleteBy") {
        Some(AttributeValue::N(n)) => Millis(n.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    Ok(PageKey { task_id, complete_by })
}

/// At most this many expired leases are reclaimed by one write (its condition names each).
const RECLAIM_MAX: usize = 20;

/// The leases of a limit item.
fn leases_of(item: &Item) -> Vec<(String, Millis)> {
    match item.get("Leases") {
        Some(AttributeValue::M(m)) => m
            .iter()
            .map(|(h, v)| {
                let until = match v {
                    AttributeValue::N(n) => n.parse().unwrap_or(0),
                    _ => 0,
                };
                (h.clone(), Millis(until))
            })
            .collect(),
        _ => Vec::new(),
    }
}

impl DynamoStore {
    /// One try at a lease: `Ok(Ok(taken))`, or `Ok(Err(item))` with the item as it is (`None`:
    /// no item yet) when the agent was full or the leases changed under us.
    async fn try_lease(
        &self,
        agent: &str,
        max: u32,
        holder: &str,
        until: Millis,
        reclaim: &[(String, Millis)],
    ) -> Result<Result<Acquire, Option<Item>>, StoreError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("TaskId", AttributeValue::S(limit_key(agent)))
            .expression_attribute_names("#h", holder)
            .expression_attribute_values(":until", AttributeValue::N(until.0.to_string()))
            .expression_attribute_values(":max", AttributeValue::N((max as usize + reclaim.len()).to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let mut condition = "size(Leases) < :max".to_owned();
        let mut removes = Vec::new();
        for (i, (h, u)) in reclaim.iter().enumerate() {
            req = req
                .expression_attribute_names(format!("#e{i}"), h)
                .expression_attribute_values(format!(":e{i}"), AttributeValue::N(u.0.to_string()));
            let _ = write!(condition, " AND Leases.#e{i} = :e{i}");
            removes.push(format!("Leases.#e{i}"));
        }
        let update = if removes.is_empty() {
            "SET Leases.#h = :until".to_owned()
        } else {
            format!("SET Leases.#h = :until REMOVE {}", removes.join(", "))
        };
        match req.update_expression(update).condition_expression(condition).send().await {
            Ok(_) => Ok(Ok(Acquire::Taken { reclaimed: u32::try_from(reclaim.len()).unwrap_or(u32::MAX) })),
            Err(e) => match e.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(c) => Ok(Err(c.item)),
                other => Err(backend("UpdateItem", other.into())),
            },
        }
    }

    async fn acquire_lease(
        &self,
        agent: &str,
        max: u32,
        holder: &str,
        until: Millis,
        now: Millis,
    ) -> Result<Acquire, StoreError> {
        let mut reclaim = Vec::new();
        // A few rounds: each lost one means the leases changed (taken, given back, reclaimed).
        for _ in 0..4 {
            let item = match self.try_lease(agent, max, holder, until, &reclaim).await? {
                Ok(taken) => return Ok(taken),
                Err(item) => item,
            };
            let Some(item) = item else {
                // the agent's first lease ever: create its item
                let mut first = Item::new();
                first.insert("TaskId".into(), AttributeValue::S(limit_key(agent)));
                first.insert(
                    "Leases".into(),
                    AttributeValue::M(HashMap::from([(holder.to_owned(), AttributeValue::N(until.0.to_string()))])),
                );
                if self.put_new(first).await?.is_none() {
                    return Ok(Acquire::Taken { reclaimed: 0 });
                }
                reclaim.clear();
                continue;
            };
            let leases = leases_of(&item);
            reclaim = if leases.len() >= max as usize { expired_leases(&leases, now, RECLAIM_MAX) } else { Vec::new() };
            if leases.len() - reclaim.len() >= max as usize {
                let held = leases.iter().filter(|(_, u)| *u > now).count();
                return Ok(Acquire::Full { held: u32::try_from(held).unwrap_or(u32::MAX) });
            }
        }
        // still changing under us: as full, the request waits and asks again
        Ok(Acquire::Full { held: max })
    }

    async fn release_lease(&self, agent: &str, holder: &str) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("TaskId", AttributeValue::S(limit_key(agent)))
            .expression_attribute_names("#h", holder)
            .update_expression("REMOVE Leases.#h")
            // not a new item with the key alone when the lease (or the item) is gone
            .condition_expression("attribute_exists(Leases.#h)")
            .send()
            .await;
        match out {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(_) => Ok(()), // reclaimed already
                other => Err(backend("UpdateItem", other.into())),
            },
        }
    }
}

impl DynamoStore {
    /// Put `item` under `key` if the stored one is still at version `read` (`Ver`; `None`: there
    /// is none): the key items' and the pauses item's writes. `Ok(false)`: the condition failed.
    async fn put_versioned(
        &self,
        key: &str,
        item: Result<Item, StoreError>,
        read: Option<u64>,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::operation::put_item::PutItemError;
        let mut item = item?;
        item.insert("TaskId".into(), AttributeValue::S(key.to_owned()));
        let req = self.client.put_item().table_name(&self.table).set_item(Some(item));
        let req = match read {
            None => req.condition_expression("attribute_not_exists(TaskId)"),
            Some(v) => {
                req.condition_expression("Ver = :v").expression_attribute_values(":v", AttributeValue::N(v.to_string()))
            }
        };
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                PutItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(backend("PutItem", other.into())),
            },
        }
    }
}

impl PauseStore for DynamoStore {
    fn load_pauses(&self) -> BoxFuture<'_, Result<Option<Pauses>, StoreError>> {
        Box::pin(async move {
            match self.get_raw(PAUSES_KEY.to_owned()).await? {
                Some(item) => Ok(Some(serde_dynamo::from_item(item).map_err(codec)?)),
                None => Ok(None),
            }
        })
    }

    fn save_pauses<'a>(&'a self, pauses: &'a Pauses, read: Option<u64>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.put_versioned(PAUSES_KEY, serde_dynamo::to_item(pauses).map_err(codec), read))
    }
}

impl ScheduleStore for DynamoStore {
    fn load_schedules(&self) -> BoxFuture<'_, Result<Option<sas_protocol::schedules::Schedules>, StoreError>> {
        Box::pin(async move {
            match self.get_raw(SCHEDULES_KEY.to_owned()).await? {
                Some(item) => Ok(Some(serde_dynamo::from_item(item).map_err(codec)?)),
                None => Ok(None),
            }
        })
    }

    fn save_schedules<'a>(
        &'a self,
        schedules: &'a sas_protocol::schedules::Schedules,
        read: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.put_versioned(SCHEDULES_KEY, serde_dynamo::to_item(schedules).map_err(codec), read))
    }
}

impl Pacer for DynamoStore {
    /// With `UpdateItem` alone (the Agent function's role may not read the item): the first
    /// write guesses the agent idle (its `Tat` at or before the slot now + the lead); a lost guess
    /// returns the item, and the second write is conditional on the `Tat` it read. Each round
    /// asks from the time it is sent (`now` plus the time the rounds before took), with a lead of
    /// twice what the writes take here ([`crate::limit::pace_lead_ms`]): under contention and on a
    /// loaded table, a slot taken is one its call can still sleep for.
    fn reserve<'a>(
        &'a self,
        agent: &'a str,
        rate: &'a crate::limit::Rate,
        now: Millis,
    ) -> BoxFuture<'a, Result<crate::limit::Pace, StoreError>> {
        Box::pin(async move {
            use crate::limit::{pace, pace_lead_ms, Pace};
            use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
            let key = crate::limit::rate_key(agent);
            let started = std::time::Instant::now();
            // `None`: not read yet; then the item's `Tat` as the last lost write returned it
            let mut known: Option<Option<Millis>> = None;
            // a few rounds: each lost one means another call took a slot meanwhile
            for _ in 0..8 {
                let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let now = now.plus_ms(elapsed);
                let lead = pace_lead_ms(self.pace_write_ms.load(Ordering::Relaxed));
                let (decided, condition, value) = match known {
                    None => {
                        let slot = now.plus_ms(lead);
                        let idle = Pace::Reserve { slot, tat: slot.plus_ms(rate.interval_ms()) };
                        (idle, "attribute_not_exists(Tat) OR Tat <= :t", Some(slot))
                    }
                    Some(tat) => match pace(tat, now, lead, rate) {
                        later @ Pace::Later { .. } => return Ok(later),
                        reserve => match tat {
                            None => (reserve, "attribute_not_exists(Tat)", None),
                            Some(t) => (reserve, "Tat = :t", Some(t)),
                        },
                    },
                };
                let Pace::Reserve { tat: next, .. } = decided else { unreachable!("a reservation") };
                let mut req = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .key("TaskId", AttributeValue::S(key.clone()))
                    .update_expression("SET Tat = :next")
                    .expression_attribute_values(":next", AttributeValue::N(next.0.to_string()))
                    .condition_expression(condition)
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
                if let Some(t) = value {
                    req = req.expression_attribute_values(":t", AttributeValue::N(t.0.to_string()));
                }
                let sent = std::time::Instant::now();
                let answer = req.send().await;
                // the writes' time, smoothed (a quarter of each new one)
                let took = u64::try_from(sent.elapsed().as_millis()).unwrap_or(u64::MAX);
                let before = self.pace_write_ms.load(Ordering::Relaxed);
                self.pace_write_ms.store(before.saturating_mul(3).saturating_add(took) / 4, Ordering::Relaxed);
                match answer {
                    Ok(_) => return Ok(decided),
                    Err(e) => match e.into_service_error() {
                        UpdateItemError::ConditionalCheckFailedException(c) => {
                            let tat = c
                                .item
                                .as_ref()
                                .and_then(|i| i.get("Tat"))
                                .and_then(|v| v.as_n().ok())
                                .and_then(|n| n.parse().ok())
                                .map(Millis);
                            known = Some(tat);
                        }
                        other => return Err(backend("UpdateItem", other.into())),
                    },
                }
            }
            // still racing: ask again a little later
            Ok(Pace::Later { slot: now.plus_ms(1_000) })
        })
    }
}

impl KeyStore for DynamoStore {
    fn load_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyState>, StoreError>> {
        Box::pin(async move {
            match self.get_raw(key.to_owned()).await? {
                Some(item) => Ok(Some(serde_dynamo::from_item(item).map_err(codec)?)),
                None => Ok(None),
            }
        })
    }

    fn save_key<'a>(
        &'a self,
        key: &'a str,
        state: &'a KeyState,
        read: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.put_versioned(key, serde_dynamo::to_item(state).map_err(codec), read))
    }
}

impl Limiter for DynamoStore {
    fn acquire<'a>(
        &'a self,
        agent: &'a str,
        max: u32,
        holder: &'a str,
        until: Millis,
        now: Millis,
    ) -> BoxFuture<'a, Result<Acquire, StoreError>> {
        Box::pin(self.acquire_lease(agent, max, holder, until, now))
    }

    fn release<'a>(&'a self, agent: &'a str, holder: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.release_lease(agent, holder))
    }

    fn leases<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Result<Vec<(String, Millis)>, StoreError>> {
        Box::pin(async move {
            let out = self
                .client
                .get_item()
                .table_name(&self.table)
                .key("TaskId", AttributeValue::S(limit_key(agent)))
                .consistent_read(true)
                .send()
                .await
                .map_err(aws("GetItem"))?;
            Ok(out.item.as_ref().map(leases_of).unwrap_or_default())
        })
    }
}

impl TaskWriter for DynamoStore {
    fn create<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.create_item(task))
    }

    fn save<'a>(&'a self, task: &'a Task, read: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.save_item(task, read))
    }
}

impl StateStore for DynamoStore {
    fn get<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<Task>, StoreError>> {
        Box::pin(self.get_item(task_id))
    }

    fn holder<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<AttemptToken>, StoreError>> {
        Box::pin(self.get_holder(task_id))
    }

    fn get_many<'a>(&'a self, ids: &'a [TaskId]) -> BoxFuture<'a, Result<Vec<Task>, StoreError>> {
        Box::pin(self.get_items(ids))
    }

    fn archived_history<'a>(
        &'a self,
        task_id: &'a TaskId,
        from: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<Vec<HistoryEntry>, StoreError>> {
        Box::pin(self.archived(task_id, from, to))
    }

    fn expired(
        &self,
        shard: u32,
        now: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        Box::pin(self.query_in_flight(shard, now, limit, start))
    }

    fn list_by_state(&self, state: ProcessState, max: usize) -> BoxFuture<'_, Result<Vec<TaskSummary>, StoreError>> {
        Box::pin(self.query_by_state(state, max))
    }

    fn shards(&self) -> u32 {
        self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{apply, submit, Ctx, Event, Policy};
    use crate::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
    use futures::executor::block_on;

    fn store() -> DynamoStore {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        DynamoStore::new(Client::from_conf(conf), "t", 4, 30)
    }

    fn workflow(name: &str) -> WorkflowDef {
        WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve(name, None).unwrap().clone()
    }

    fn task(name: &str) -> Task {
        submit(
            // as long as the ids the submitter derives from SQS message ids
            TaskId::try_from("msg-0f3c9a5e-7a1b-4c2d-9e8f-0123456789ab").unwrap(),
            workflow(name),
            serde_json::json!({"n": 1.5, "s": "x", "l": [1, null, true], "empty": {}}),
            Some("https://sqs.us-east-1.amazonaws.com/123456789012/orders-replies".into()),
            &Ctx::at(Millis(1_700_000_000_000)),
            &Policy::default(),
        )
        .task
    }

    /// Every item a task writes, from creation to `Processed`, each step succeeding at once.
    fn life(name: &str) -> Vec<Task> {
        let mut t = task(name);
        let mut items = vec![t.clone()];
        let mut now = 1_700_000_001_000;
        while let Some(attempt) = t.lock.locked_by.clone() {
            // what the simulated agent answers (the benchmarks' workloads)
            let step = t.current_def().name.clone();
            let output = serde_json::json!({
                "agent": "sim", "step": step, "idempotency_key": format!("{}:{step}", t.task_id),
                "attempt_no": 1, "calls": 1,
            });
            let e = Event::AgentSucceeded { attempt, output };
            t = apply(&t, &e, &Ctx::at(Millis(now)), &Policy::default()).unwrap().task;
            // every write records the message that caused it
            t.last_message = Some(crate::ids::message_mark("5fea7756-0ea4-451a-a703-a558b933e274"));
            items.push(t.clone());
            now += 1_000;
        }
        items
    }

    #[test]
    fn an_item_of_a_later_format_is_refused_for_its_format_and_retried() {
        let s = store();
        let t = task("sim-order");
        let mut item = s.to_item(&t).unwrap();
        // this build's format is 1: written as no attribute, so that its items are the release
        // before's as they are
        assert!(!item.contains_key("Format"));
        // a later release's item, with an attribute this build does not know (it would drop it
        // when it wrote the task back): refused before it is read, for its format
        item.insert("Format".into(), AttributeValue::N("2".into()));
        item.insert("Lane".into(), AttributeValue::S("fast".into()));
        let e = block_on(s.decode(item.clone())).expect_err("a later format is not read");
        assert!(matches!(e, StoreError::LaterFormat { format: 2 }), "{e:?}");
        let why = e.to_string();
        assert!(why.contains("item format 2") && why.contains("reads item format 1"), "{why}");
        // the message that asked is retried (the deploy ends), not dead-lettered at once
        assert!(!e.is_permanent());
        // a format it reads, said or not, reads
        item.remove("Lane");
        item.insert("Format".into(), AttributeValue::N("1".into()));
        assert_eq!(block_on(s.decode(item.clone())).unwrap(), t);
        item.insert("Format".into(), AttributeValue::S("2".into()));
        assert!(matches!(block_on(s.decode(item)), Err(StoreError::Codec(_))));
    }

    #[test]
    fn item_round_trips_and_names_its_workflow() {
        let s = store();
        let t = task("sim-order");
        let item = s.to_item(&t).unwrap();
        assert!(!item.contains_key("Workflow"), "the definition is stored once, not in every task");
        assert_eq!(item.get("WorkflowRef"), Some(&AttributeValue::S(workflow_ref(&t.workflow))));
        assert!(!item.contains_key("LockedBy") || t.lock.locked_by.is_some(), "absent, not NULL");
        assert_eq!(block_on(s.decode(item)).unwrap(), t);
        // an item written before definitions were stored apart still reads
        let old: Item = serde_dynamo::to_item(&t).unwrap();
        assert_eq!(block_on(store().decode(old)).unwrap(), t);
    }

    /// The digests name items in users' tables (a pinned definition, an input stored apart): they
    /// must never change between versions, or tasks in flight would lose their items.
    #[test]
    fn the_digests_that_name_items_do_not_change() {
        let def = WorkflowDef {
            concurrency: None,
            result: None,
            name: "pinned".into(),
            version: 3,
            description: String::new(),
            on_failure: crate::workflow::OnFailure::Compensate,
            steps: vec![crate::workflow::StepDef::call("a", "sim", 5_000)],
        };
        let input = AttributeValue::M(
            [
                ("sku".to_owned(), AttributeValue::S("a-1".into())),
                ("qty".to_owned(), AttributeValue::N("2".into())),
                ("gift".to_owned(), AttributeValue::Bool(true)),
                (
                    "lines".to_owned(),
                    AttributeValue::L(vec![AttributeValue::Null(true), AttributeValue::N("1.5".into())]),
                ),
            ]
            .into_iter()
            .collect(),
        );
        let task_id = TaskId::try_from("order-1").unwrap();
        // the values FNV-1a gave when these keys were first written (the hand-written digest, before
        // the fnv crate)
        assert_eq!(workflow_ref(&def), "pinned@3:7f2dba3e1d5c6782");
        assert_eq!(input_key(&task_id, &input), "input:order-1:d4750480965f964d");
    }

    #[test]
    fn a_definition_changed_under_the_same_version_is_another_reference() {
        let a = workflow("sim-order");
        let mut b = a.clone();
        b.steps[0].timeout_ms += 1;
        assert_ne!(workflow_ref(&a), workflow_ref(&b));
        assert!(workflow_ref(&a).starts_with("sim-order@1:"));
    }

    #[test]
    fn index_keys_follow_the_task_in_flight_then_ended() {
        let s = store();
        let t = task("sim-order");
        let item = s.to_item(&t).unwrap();
        assert!(item.contains_key("Shard") && item.contains_key("CompleteBy"));
        assert!(!item.contains_key("EndShard") && !item.contains_key("ExpiresAt"));

        let done = life("sim-order").pop().unwrap();
        assert_eq!(done.process_state, ProcessState::Processed);
        let item = s.to_item(&done).unwrap();
        assert!(!item.contains_key("Shard") && !item.contains_key("CompleteBy"), "sparse: gone when ended");
        let shard = super::super::shard_of(&done.task_id, 4);
        assert_eq!(item.get("EndShard"), Some(&AttributeValue::S(format!("Processed#{shard}"))));
        assert!(item.contains_key("ExpiresAt"));

        let mut error = done;
        error.process_state = ProcessState::Error;
        let item = s.to_item(&error).unwrap();
        assert!(item.contains_key("EndShard") && !item.contains_key("ExpiresAt"), "Error waits for an operator");
    }

    #[test]
    fn every_write_of_a_plain_task_fits_in_one_write_unit() {
        // The cost model (docs/performance/cost.md) counts one write unit per write of a plain
        // task: its items stay within 1 KB.
        let s = store();
        for name in ["sim-step", "sim-order"] {
            for (i, t) in life(name).iter().enumerate() {
                let bytes = item_size(&s.to_item(t).unwrap());
                assert!(bytes <= 1024, "{name}, write {i} ({}): {bytes} bytes", t.process_state);
            }
        }
    }

    #[test]
    fn a_large_input_is_named_not_carried() {
        let s = store();
        let mut t = task("sim-order");
        let lines: Vec<_> = (0..1000).map(|i| serde_json::json!({"sku": format!("sku-{i}"), "qty": 1})).collect();
        t.input = serde_json::json!({"items": lines});
        let item = s.to_item(&t).unwrap();
        assert!(!item.contains_key("Input"));
        let Some(AttributeValue::S(key)) = item.get("InputRef").cloned() else { panic!("no InputRef") };
        assert!(key.starts_with("input:msg-0f3c9a5e-7a1b-4c2d-9e8f-0123456789ab:"), "{key}");
        assert!(item_size(&item) <= 1024, "{} bytes", item_size(&item));
        // the item holding it: no expiry while the task runs
        let input = DynamoStore::input_item(&t, &item).unwrap().unwrap();
        assert!(item_size(&input) > 10_000 && !input.contains_key("ExpiresAt"), "{} bytes", item_size(&input));
        // read back whole (the input from this process's cache: nothing to ask DynamoDB)
        s.cached_inputs().insert(key.clone(), input["Input"].clone());
        assert_eq!(block_on(s.decode(item)).unwrap(), t);
        // another input under the same id is another item (a duplicate never overwrites one)
        let mut other = t.clone();
        other.input["items"][0]["qty"] = serde_json::json!(2);
        assert_ne!(s.to_item(&other).unwrap()["InputRef"], AttributeValue::S(key));
        // a small input stays in the item
        assert!(s.to_item(&task("sim-order")).unwrap().contains_key("Input"));
        // a task read back names the same input item when written again, though its JSON changed
        // on the way (10.0 comes back as 10)
        let mut t = task("sim-order");
        let lines: Vec<_> = (0..500).map(|i| serde_json::json!({"price": 10.0, "sku": format!("s{i}")})).collect();
        t.input = serde_json::json!({"lines": lines, "total": 5000.0});
        let item = s.to_item(&t).unwrap();
        let input = DynamoStore::input_item(&t, &item).unwrap().unwrap();
        s.cached_inputs().insert(item["InputRef"].as_s().unwrap().clone(), input["Input"].clone());
        let back = block_on(s.decode(item.clone())).unwrap();
        assert_ne!(serde_json::to_string(&back.input).unwrap(), serde_json::to_string(&t.input).unwrap());
        assert_eq!(s.to_item(&back).unwrap()["InputRef"], item["InputRef"]);
    }

    #[test]
    fn sizes_count_names_and_values() {
        let item = Item::from([
            ("TaskId".to_owned(), AttributeValue::S("t-1".into())),
            ("Rev".to_owned(), AttributeValue::N("12".into())),
            ("Steps".to_owned(), AttributeValue::L(vec![AttributeValue::Bool(true)])),
        ]);
        // 6 + 3, 3 + 2, 5 + (3 + 1 + 1)
        assert_eq!(item_size(&item), 9 + 5 + 10);
    }

    #[test]
    fn page_keys_round_trip_through_last_evaluated_key() {
        let k = Item::from([
            ("TaskId".to_owned(), AttributeValue::S("t-1".into())),
            ("Shard".to_owned(), AttributeValue::S("3".into())),
            ("CompleteBy".to_owned(), AttributeValue::N("1234".into())),
        ]);
        assert_eq!(
            page_key(&k).unwrap(),
            PageKey { task_id: TaskId::try_from("t-1").unwrap(), complete_by: Millis(1234) }
        );
        assert!(matches!(page_key(&Item::new()), Err(StoreError::Codec(_))));
    }
}
