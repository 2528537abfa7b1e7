//! The state store port: one item per task, every write conditional. A lost condition is the
//! typed outcome [`StoreError::Conflict`] (carrying the current item, so the caller can re-decide
//! without another read) or [`StoreError::AlreadyExists`].
//!
//! Two implementations keep the same semantics:
//! - [`DynamoStore`]: one DynamoDB table with two sparse, sharded indexes: `ByCompleteBy` (keys
//!   only, the tasks in flight) for the Supervisor and for operators' stuck work, `ByEnd` (the
//!   ended tasks, by state and end time) for operators;
//! - [`MemoryStore`]: an in-memory twin for fast tests of the roles and for the simulator.
//!
//! The rules both follow are written here once: which tasks each index holds ([`index_key`],
//! [`end_key`]), how they are sharded ([`shard_of`]) and how large a task may grow
//! ([`check_size`]).

use futures::future::BoxFuture;

use crate::ids::{AttemptToken, Millis, TaskId};
use crate::protocol::{HistoryEntry, ProcessState, Task, ITEM_FORMAT};
use sas_protocol::keys::KeyState;
use sas_protocol::schedules::Schedules;

mod dynamo;
mod memory;

pub use dynamo::{
    item_size, summary as ended_row, workflow_ref, DynamoStore, BY_COMPLETE_BY, BY_END, HOLDER_PROJECTION,
};
pub use memory::{Ambiguity, MemoryStore, StoreOp};

/// DynamoDB's item limit is 400 KB; stay clear of it.
pub const MAX_ITEM_BYTES: usize = 380 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Duplicate submission: nothing to do.
    #[error("a task with this id already exists")]
    AlreadyExists,
    /// The conditional write lost: the task changed since it was read. `current` is the item as
    /// it is now (absent if it was deleted). Re-decide on it.
    #[error("conditional write lost: the task changed since it was read")]
    Conflict { current: Option<Box<Task>> },
    /// The task would not fit in an item: retrying cannot help.
    #[error("task item would be about {bytes} bytes; the limit is {MAX_ITEM_BYTES}")]
    TooLarge { bytes: usize },
    /// The store could not be reached or refused the request: worth a retry.
    #[error("{op}: {message}")]
    Backend {
        op: &'static str,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The store refused the request as invalid (DynamoDB's `ValidationException`: a value it
    /// cannot hold, an item over its limit): retrying cannot help.
    #[error("{op} refused: {message}")]
    Refused { op: &'static str, message: String },
    /// A stored item is not a task this build can read.
    #[error("task item does not match the expected shape: {0}")]
    Codec(String),
    /// The task's item is of a later item format than this build's: a function of a later
    /// release wrote it (a deploy under way, or rolled back). Nothing of the task is read or
    /// written; the message that asked is retried, and reads it once the deploy is done.
    #[error("the task item is written in item format {format}, and this build reads item format {ITEM_FORMAT}: a function of a later release wrote it (finish the deploy: the message is retried until then)")]
    LaterFormat { format: u32 },
}

/// An entry of the Supervisor's index: a task in flight and its `CompleteBy`. Also where a page
/// of the Supervisor's query ends: pass it back to read the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageKey {
    pub task_id: TaskId,
    pub complete_by: Millis,
}

/// One page of the Supervisor's query: keys only, so it reads a few dozen bytes per expired task
/// however large the tasks are.
#[derive(Debug)]
pub struct Page {
    pub keys: Vec<PageKey>,
    pub next: Option<PageKey>,
    /// Entries of the page whose keys this build cannot read (the raw key and why): skipped, so
    /// one bad item never blocks its shard, and reported.
    pub unreadable: Vec<String>,
}

/// A row of an operator's listing.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskSummary {
    pub task_id: TaskId,
    pub process_state: ProcessState,
    #[serde(default)]
    pub workflow_name: Option<String>,
    #[serde(default)]
    pub current_step: Option<String>,
    #[serde(default)]
    pub failure_count: u32,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub created_at: Option<Millis>,
    pub updated_at: Millis,
}

impl TaskSummary {
    pub fn of(task: &Task) -> Self {
        TaskSummary {
            task_id: task.task_id.clone(),
            process_state: task.process_state,
            workflow_name: Some(task.workflow.name.clone()),
            current_step: task.current_step_name().map(str::to_owned),
            failure_count: task.failure_count,
            reason: task.reason.clone(),
            created_at: Some(task.created_at),
            updated_at: task.updated_at,
        }
    }
}

/// The task store's writes: a new task, and a conditional write over the item last read. Only
/// [`crate::transition`] reaches them in the roles: a role's [`crate::deps::Deps`] holds them
/// behind [`crate::transition::Writer`], which only that module opens, so a write that skips its
/// loop (the re-decision on a lost condition, the recognition of a write whose answer was lost)
/// does not compile. Tests and tools that set up tasks call them on a concrete store.
pub trait TaskWriter: Send + Sync + std::fmt::Debug {
    /// Create a new task; `AlreadyExists` if its id is taken (duplicate submission).
    fn create<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Write `task` if the stored item is still `read`: the same `Rev` and the same `LockedBy`
    /// (the attempt's fencing token is re-checked on every write). One request per transition.
    fn save<'a>(&'a self, task: &'a Task, read: &'a Task) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// The task store's reads, which every role may hold ([`crate::deps::Deps::store`]); its writes
/// are [`TaskWriter`]'s.
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// Strongly consistent read of one task.
    fn get<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<Task>, StoreError>>;

    /// The attempt that holds the task now (`LockedBy`), strongly consistent: what an agent reads
    /// before it starts a call ([`crate::agent::still_current`]). `None` when no attempt holds
    /// the task, or no such task exists. DynamoDB reads that one attribute (the Agent function's
    /// role may read no other); this default reads the whole task.
    fn holder<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<AttemptToken>, StoreError>> {
        Box::pin(async move { Ok(self.get(task_id).await?.and_then(|t| t.lock.locked_by)) })
    }

    /// Eventually consistent reads of many tasks (operators' tools); the missing ones are left out.
    fn get_many<'a>(&'a self, ids: &'a [TaskId]) -> BoxFuture<'a, Result<Vec<Task>, StoreError>>;

    /// One page (at most `limit` entries) of the in-flight tasks in `shard` whose
    /// `CompleteBy <= now`, in `CompleteBy` order, starting after `start`. The index may lag the
    /// table: callers re-check with a conditional write.
    fn expired(
        &self,
        shard: u32,
        now: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> BoxFuture<'_, Result<Page, StoreError>>;

    /// Tasks in `state`, for operators (at most `max`): ended ones most recently ended first, in
    /// flight ones most overdue first.
    fn list_by_state(&self, state: ProcessState, max: usize) -> BoxFuture<'_, Result<Vec<TaskSummary>, StoreError>>;

    /// How many shards the Supervisor's index is spread over.
    fn shards(&self) -> u32;

    /// The entries of a task's history that its item no longer holds, `seq` from `from` up to
    /// (not including) `to`, in order. The protocol keeps the last `history_limit` entries in the
    /// item; [`StateStore::save`] archives each entry a write drops (see [`trimmed_history`]), so
    /// operators can read the whole history. Entries whose archive expired are missing.
    fn archived_history<'a>(
        &'a self,
        task_id: &'a TaskId,
        from: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<Vec<HistoryEntry>, StoreError>> {
        let _ = (task_id, from, to);
        Box::pin(async { Ok(Vec::new()) })
    }
}

// ---- agents' concurrency limits (see [`crate::limit`]) ---------------------------------------

/// What a request for a slot got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The lease is held: call, then [`Limiter::release`].
    Taken {
        /// Expired leases reclaimed on the way (their holders died or hung).
        reclaimed: u32,
    },
    /// `held` unexpired leases are out: wait.
    Full { held: u32 },
}

/// Where the leases live: the task table (DynamoDB), or the in-memory twin.
pub trait Limiter: Send + Sync + std::fmt::Debug {
    /// Take a lease for `holder` on one of `agent`'s `max` slots, ending at `until`, unless `max`
    /// unexpired leases are out at `now`. Expired leases are reclaimed on the way.
    fn acquire<'a>(
        &'a self,
        agent: &'a str,
        max: u32,
        holder: &'a str,
        until: Millis,
        now: Millis,
    ) -> BoxFuture<'a, Result<Acquire, StoreError>>;

    /// Give `holder`'s lease back (nothing if it was reclaimed already).
    fn release<'a>(&'a self, agent: &'a str, holder: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The leases of `agent` (holder, end), for operators and tests.
    fn leases<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Result<Vec<(String, Millis)>, StoreError>>;
}

// ---- agents' rates (see [`crate::limit`]'s pacing) -------------------------------------------

/// Where the agents' rate items live (`Tat`, see [`crate::limit::pace`]).
pub trait Pacer: Send + Sync + std::fmt::Debug {
    /// A slot for one call of `agent` at `rate`, asked at `now`: read the rate item, decide
    /// ([`crate::limit::pace`]) and, for a slot, write it conditionally (re-deciding on a lost
    /// race).
    fn reserve<'a>(
        &'a self,
        agent: &'a str,
        rate: &'a crate::limit::Rate,
        now: Millis,
    ) -> BoxFuture<'a, Result<crate::limit::Pace, StoreError>>;
}

// ---- operators' pauses of workflows ---------------------------------------------------------

/// The item of the paused workflows (`:` never appears in a task id).
pub const PAUSES_KEY: &str = "pause:workflows";

/// The paused workflows and concurrency keys, one item (`TaskId` = [`PAUSES_KEY`]): `Workflows`
/// (name to why and since when), `Keys` (a key item's id, `key:<scope>:<value>`, to why and since
/// when), `Ver` (+1 per write; each write is conditional on the version read).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Pauses {
    #[serde(default)]
    pub workflows: std::collections::BTreeMap<String, Paused>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub keys: std::collections::BTreeMap<String, Paused>,
    #[serde(default)]
    pub ver: u64,
}

/// Why, by whom and since when a workflow is paused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Paused {
    pub reason: String,
    pub at: Millis,
}

/// Where the pauses live: the task table (DynamoDB), or the in-memory twin.
pub trait PauseStore: Send + Sync + std::fmt::Debug {
    /// The pauses item as it is now (strongly consistent), if it exists.
    fn load_pauses(&self) -> BoxFuture<'_, Result<Option<Pauses>, StoreError>>;

    /// Write `pauses` if the item is still at version `read` (`None`: it must not exist).
    /// `Ok(false)`: the condition failed, read again.
    fn save_pauses<'a>(&'a self, pauses: &'a Pauses, read: Option<u64>) -> BoxFuture<'a, Result<bool, StoreError>>;
}

// ---- schedules (see [`sas_protocol::schedules`]) -----------------------------------------------

/// The item of every schedule of the stack (`:` never appears in a task id).
pub const SCHEDULES_KEY: &str = "schedule:all";

/// Where the schedules live: the task table (DynamoDB), or the in-memory twin.
pub trait ScheduleStore: Send + Sync + std::fmt::Debug {
    /// The schedules item as it is now (strongly consistent), if it exists.
    fn load_schedules(&self) -> BoxFuture<'_, Result<Option<Schedules>, StoreError>>;

    /// Write `schedules` if the item is still at version `read` (`None`: it must not exist).
    /// `Ok(false)`: the condition failed, read again.
    fn save_schedules<'a>(
        &'a self,
        schedules: &'a Schedules,
        read: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

// ---- concurrency keys (see [`sas_protocol::keys`]) -------------------------------------------

/// Where the key items live: the task table (DynamoDB), or the in-memory twin. Each write is
/// conditional on the version read ([`KeyState::ver`]); the decisions are
/// [`sas_protocol::keys`]'s, the loop around them [`crate::keys`]'.
pub trait KeyStore: Send + Sync + std::fmt::Debug {
    /// The key item `key` as it is now (strongly consistent), if it exists.
    fn load_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyState>, StoreError>>;

    /// Write `state` as key item `key` if the item is still at version `read` (`None`: it must
    /// not exist). `Ok(false)`: the condition failed, read again.
    fn save_key<'a>(
        &'a self,
        key: &'a str,
        state: &'a KeyState,
        read: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// The history entries `read` (the item as stored) holds that `task` (the item to write) no
/// longer does: the oldest ones, dropped by the protocol at its `history_limit`. A save archives
/// them before its conditional write: they are committed facts whichever write wins.
pub fn trimmed_history<'a>(task: &Task, read: &'a Task) -> &'a [HistoryEntry] {
    let first = task.history.first().map_or(u64::MAX, |h| h.seq);
    let n = read.history.iter().take_while(|h| h.seq < first).count();
    &read.history[..n]
}

/// The shard a task's index entry lives in: a stable hash of its id (FNV-1a).
pub fn shard_of(task_id: &TaskId, shards: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in task_id.as_str().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % shards.max(1)
}

/// The task's entry in the Supervisor's index, `(shard, CompleteBy)`: present only while the task
/// is in flight, so the index stays as small as the work in progress.
pub fn index_key(task: &Task, shards: u32) -> Option<(u32, Millis)> {
    if task.process_state.is_terminal() {
        return None;
    }
    task.complete_by.map(|cb| (shard_of(&task.task_id, shards), cb))
}

/// The task's entry in the operators' index of ended tasks, `"{state}#{shard}"` (sorted by
/// `UpdatedAt`): present only once the task is terminal, so a task writes it once, when it ends,
/// and each state's writes spread over every shard.
pub fn end_key(task: &Task, shards: u32) -> Option<String> {
    task.process_state.is_terminal().then(|| format!("{}#{}", task.process_state, shard_of(&task.task_id, shards)))
}

/// Whether the item a lost conditional write found (`current`) is the very task that write
/// carried (`written`). A write can land while its answer is lost (a dropped connection, a 5xx
/// after the commit); the SDK then sends it again, and that copy fails its condition against the
/// item the first one wrote. Equality means "ours": the write landed, it is not lost (nor is a
/// create a duplicate). Another writer's item is equal only if it made the same decision from the
/// same item in the same millisecond without a fresh attempt token (a claim always draws one):
/// both then perform the same effects, as for a duplicate delivery (consumers dedupe).
pub fn is_own_write(current: &Task, written: &Task) -> bool {
    current == written
}

impl StoreError {
    /// The write can never succeed as it is (too large, refused as invalid): the same request
    /// fails every time, so it must not be retried.
    pub fn is_permanent(&self) -> bool {
        matches!(self, StoreError::TooLarge { .. } | StoreError::Refused { .. })
    }
}

/// Refuse a task that would not fit in one item.
pub fn check_size(task: &Task) -> Result<(), StoreError> {
    let bytes = sas_protocol::messages::json_len(task);
    if bytes > MAX_ITEM_BYTES {
        return Err(StoreError::TooLarge { bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_in_range() {
        let id = TaskId::try_from("abc").unwrap();
        assert_eq!(shard_of(&id, 8), shard_of(&id, 8));
        let hits: std::collections::HashSet<u32> =
            (0..200).map(|i| shard_of(&TaskId::try_from(format!("t{i}")).unwrap(), 4)).collect();
        assert_eq!(hits.len(), 4, "ids spread over every shard");
    }
}
