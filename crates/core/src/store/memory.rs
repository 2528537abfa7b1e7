//! The in-memory twin of the state store, for fast tests of the roles and for the simulator. It
//! keeps the semantics the protocol relies on: conditional writes on `Rev` and `LockedBy` with the
//! typed conflict carrying the current item, `AlreadyExists` on a taken id, the size limit, the
//! sparse and sharded `CompleteBy` index queried page by page, and the operators' state listing.
//! Failures can be injected ([`MemoryStore::fail_next`]) to drive a role's error paths, and so can
//! ambiguous writes ([`MemoryStore::ambiguous_next`]): a conditional write that applies and still
//! reports a failure, as DynamoDB does when the SDK retries a request whose first try landed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;

use super::{end_key, index_key, Page, PageKey, StateStore, StoreError, TaskSummary, TaskWriter};
use super::{Acquire, KeyStore, Limiter, Pacer, PauseStore, Pauses, ScheduleStore};
use crate::ids::{Millis, TaskId};
use crate::limit::expired_leases;
use crate::protocol::{HistoryEntry, ProcessState, Task};
use sas_protocol::keys::KeyState;

/// The task as a store gives it back: through its serialised form (as DynamoDB holds it), so
/// every test and simulated run reads what was encoded, not the value the protocol wrote. A
/// task that does not read back equal is a codec fault a real store would turn into a wrong
/// item (and an own write taken for another's): refused here.
fn stored_form(task: &Task) -> Result<Task, StoreError> {
    let bytes = serde_json::to_vec(task).map_err(|e| StoreError::Codec(e.to_string()))?;
    if bytes.len() > super::MAX_ITEM_BYTES {
        return Err(StoreError::TooLarge { bytes: bytes.len() });
    }
    let back: Task = serde_json::from_slice(&bytes).map_err(|e| StoreError::Codec(e.to_string()))?;
    if back != *task {
        return Err(StoreError::Codec(format!("task {} does not read back as written", task.task_id)));
    }
    Ok(back)
}

/// Which operation an injected failure hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Create,
    Get,
    Save,
    Expired,
    ListByState,
    /// Taking or giving back an agent's lease ([`crate::limit::Limiter`]).
    Limit,
    /// Reading or writing a concurrency key's item ([`super::KeyStore`]).
    Key,
}

/// How a conditional write that applied reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ambiguity {
    /// The first try applied but its answer was lost; the SDK's retry fails its condition against
    /// the item the first try wrote: `AlreadyExists` for a create, `Conflict` carrying that very
    /// item for a save (DynamoDB's `ALL_OLD` on `ConditionalCheckFailed`).
    Retried,
    /// The write applied, and the call still failed (the SDK's retries ran out, the connection
    /// dropped after the request was sent): a `Backend` error.
    Failed,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: BTreeMap<TaskId, Task>,
    /// Archived history entries, by task and seq (see [`super::trimmed_history`]).
    history: BTreeMap<(TaskId, u64), HistoryEntry>,
    /// Failures to return, in order, the next time each operation runs.
    failures: Vec<(StoreOp, VecDeque<StoreError>)>,
    /// Writes that will apply and then report a failure, in order (see [`Ambiguity`]).
    ambiguous: VecDeque<(StoreOp, Ambiguity)>,
    /// Requests served, by operation (for tests that count round-trips).
    calls: BTreeMap<&'static str, u64>,
    /// The agents' leases (see [`crate::limit`]): agent, then holder to lease end.
    leases: BTreeMap<String, BTreeMap<String, Millis>>,
    /// The writes in order: each task under the number of its last write (see
    /// [`MemoryStore::written_since`]), and that number by task.
    written: BTreeMap<u64, TaskId>,
    last_write: BTreeMap<TaskId, u64>,
    writes: u64,
    /// The deadline index (`ByCompleteBy`): shard, CompleteBy, task, for the tasks in flight.
    deadlines: BTreeSet<(u32, Millis, String)>,
    /// The concurrency keys' items (see [`sas_protocol::keys`]).
    keys: BTreeMap<String, KeyState>,
    /// The agents' rate items: agent to `Tat` (see [`crate::limit::pace`]).
    rates: BTreeMap<String, Millis>,
    /// The paused workflows' item.
    pauses: Option<Pauses>,
    schedules: Option<sas_protocol::schedules::Schedules>,
}

impl Inner {
    /// Store `task` (as written), numbering the write and keeping its deadline index entry.
    fn put(&mut self, task: Task, shards: u32) {
        if let Some((shard, cb)) = self.tasks.get(&task.task_id).and_then(|old| index_key(old, shards)) {
            self.deadlines.remove(&(shard, cb, task.task_id.to_string()));
        }
        if let Some((shard, cb)) = index_key(&task, shards) {
            self.deadlines.insert((shard, cb, task.task_id.to_string()));
        }
        self.writes += 1;
        if let Some(before) = self.last_write.insert(task.task_id.clone(), self.writes) {
            self.written.remove(&before);
        }
        self.written.insert(self.writes, task.task_id.clone());
        self.tasks.insert(task.task_id.clone(), task);
    }
}

/// The in-memory implementation of [`StateStore`]. Clones share the same tasks.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    shards: u32,
    /// Yield to the executor before each operation, so that handlers polled together interleave
    /// between a read and a write (as two Lambdas do).
    interleave: bool,
}

/// A future that is pending once, then ready: a point where another handler may run.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            std::task::Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
}

impl MemoryStore {
    pub fn new(shards: u32) -> Self {
        MemoryStore { inner: Arc::default(), shards: shards.max(1), interleave: false }
    }

    /// A store whose every operation first yields to the executor (see the field).
    pub fn interleaved(shards: u32) -> Self {
        MemoryStore { interleave: true, ..MemoryStore::new(shards) }
    }

    async fn turn(&self) {
        if self.interleave {
            YieldOnce(false).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Make the next call of `op` fail with `error` (calls after it succeed again).
    pub fn fail_next(&self, op: StoreOp, error: StoreError) {
        let mut inner = self.lock();
        if let Some((_, q)) = inner.failures.iter_mut().find(|(o, _)| *o == op) {
            q.push_back(error);
        } else {
            inner.failures.push((op, VecDeque::from([error])));
        }
    }

    /// Make the next write of `op` (`Create` or `Save`) that applies report a failure as `how`
    /// says, after it applied. Writes that lose their condition are not affected.
    pub fn ambiguous_next(&self, op: StoreOp, how: Ambiguity) {
        self.lock().ambiguous.push_back((op, how));
    }

    /// Forget every ambiguous write not used yet.
    pub fn clear_ambiguous(&self) {
        self.lock().ambiguous.clear();
    }

    /// The failure an applied write of `op` reports, if one was injected: `written` is the item
    /// the write just stored.
    fn after_applied(inner: &mut Inner, op: StoreOp, written: &Task) -> Result<(), StoreError> {
        let Some(i) = inner.ambiguous.iter().position(|(o, _)| *o == op) else { return Ok(()) };
        let how = inner.ambiguous.remove(i).map(|(_, how)| how);
        match (how, op) {
            (Some(Ambiguity::Retried), StoreOp::Create) => Err(StoreError::AlreadyExists),
            (Some(Ambiguity::Retried), _) => Err(StoreError::Conflict { current: Some(Box::new(written.clone())) }),
            (Some(Ambiguity::Failed), _) => Err(StoreError::Backend {
                op: if op == StoreOp::Create { "PutItem" } else { "PutItem (save)" },
                message: "injected: the write applied, then the call failed".into(),
                source: None,
            }),
            (None, _) => Ok(()),
        }
    }

    /// Every task, as stored now.
    pub fn tasks(&self) -> Vec<Task> {
        self.lock().tasks.values().cloned().collect()
    }

    /// One task as stored now (no request counted, no failure injected: the simulator's look).
    pub fn task(&self, task_id: &TaskId) -> Option<Task> {
        self.lock().tasks.get(task_id).cloned()
    }

    /// `f` of one task as stored now, without a copy (as [`Self::task`]).
    pub fn peek<R>(&self, task_id: &TaskId, f: impl FnOnce(&Task) -> R) -> Option<R> {
        self.lock().tasks.get(task_id).map(f)
    }

    /// The tasks written after the write numbered `mark` (0: every task), in the order of their
    /// last write, and the number of the last write: what a look that keeps its own state reads
    /// at each instant instead of every task (the simulator's invariants, over 100,000 tasks).
    pub fn written_since(&self, mark: u64) -> (Vec<Task>, u64) {
        let inner = self.lock();
        let tasks = inner.written.range(mark + 1..).filter_map(|(_, id)| inner.tasks.get(id).cloned()).collect();
        (tasks, inner.writes)
    }

    /// Put a task as is, bypassing every condition (to set up a test).
    pub fn put_unchecked(&self, task: Task) {
        self.lock().put(task, self.shards);
    }

    /// How many requests of `op` were served (`"create"`, `"get"`, `"save"`, `"expired"`, `"list"`).
    pub fn calls(&self, op: &str) -> u64 {
        self.lock().calls.get(op).copied().unwrap_or(0)
    }

    fn begin(&self, op: StoreOp, name: &'static str) -> Result<MutexGuard<'_, Inner>, StoreError> {
        let mut inner = self.lock();
        *inner.calls.entry(name).or_default() += 1;
        if let Some((_, q)) = inner.failures.iter_mut().find(|(o, _)| *o == op) {
            if let Some(e) = q.pop_front() {
                return Err(e);
            }
        }
        Ok(inner)
    }

    /// Every archived history entry of `task_id`, in order (the simulator's check).
    pub fn archived(&self, task_id: &TaskId) -> Vec<HistoryEntry> {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.history.range((task_id.clone(), 0)..=(task_id.clone(), u64::MAX)).map(|(_, h)| h.clone()).collect()
    }

    fn create_now(&self, task: &Task) -> Result<(), StoreError> {
        let mut inner = self.begin(StoreOp::Create, "create")?;
        let stored = stored_form(task)?;
        if inner.tasks.contains_key(&task.task_id) {
            return Err(StoreError::AlreadyExists);
        }
        inner.put(stored, self.shards);
        Self::after_applied(&mut inner, StoreOp::Create, task)
    }

    fn save_now(&self, task: &Task, read: &Task) -> Result<(), StoreError> {
        let mut inner = self.begin(StoreOp::Save, "save")?;
        let stored = stored_form(task)?;
        match inner.tasks.get(&task.task_id) {
            None => Err(StoreError::Conflict { current: None }),
            Some(current) if current.rev != read.rev || current.lock.locked_by != read.lock.locked_by => {
                Err(StoreError::Conflict { current: Some(Box::new(current.clone())) })
            }
            Some(_) => {
                // As DynamoDB does it: the dropped entries are archived before the write (here
                // under the same lock; a lost write archives committed entries all the same).
                for h in super::trimmed_history(task, read) {
                    inner.history.insert((task.task_id.clone(), h.seq), h.clone());
                }
                inner.put(stored, self.shards);
                Self::after_applied(&mut inner, StoreOp::Save, task)
            }
        }
    }

    fn expired_now(&self, shard: u32, now: Millis, limit: usize, start: Option<&PageKey>) -> Result<Page, StoreError> {
        let inner = self.begin(StoreOp::Expired, "expired")?;
        // the index read in its order, (CompleteBy, task), from after the page's start key
        let from = match start {
            None => Bound::Included((shard, Millis(0), String::new())),
            Some(k) => Bound::Excluded((shard, k.complete_by, k.task_id.to_string())),
        };
        let limit = limit.max(1);
        let keys: Vec<PageKey> = inner
            .deadlines
            .range((from, Bound::Unbounded))
            .take_while(|(s, cb, _)| *s == shard && *cb <= now)
            .take(limit)
            .map(|(_, cb, id)| PageKey {
                task_id: TaskId::try_from(id.as_str()).expect("an indexed task's id is valid"),
                complete_by: *cb,
            })
            .collect();
        // As DynamoDB does: a full page carries a key, even when nothing follows it.
        let next = if keys.len() == limit { keys.last().cloned() } else { None };
        Ok(Page { keys, next, unreadable: Vec::new() })
    }

    /// As `DynamoStore` lists: ended tasks from the end index (latest first), tasks in flight
    /// from the deadline index (most overdue first).
    fn list_now(&self, state: ProcessState, max: usize) -> Result<Vec<TaskSummary>, StoreError> {
        let inner = self.begin(StoreOp::ListByState, "list")?;
        let mut rows: Vec<&Task> = inner
            .tasks
            .values()
            .filter(|t| t.process_state == state)
            .filter(|t| end_key(t, self.shards).is_some() || index_key(t, self.shards).is_some())
            .collect();
        if state.is_terminal() {
            rows.sort_by_key(|t| std::cmp::Reverse(t.updated_at));
        } else {
            rows.sort_by_key(|t| (t.complete_by, t.task_id.clone()));
        }
        Ok(rows.into_iter().take(max).map(TaskSummary::of).collect())
    }
}

impl Limiter for MemoryStore {
    fn acquire<'a>(
        &'a self,
        agent: &'a str,
        max: u32,
        holder: &'a str,
        until: Millis,
        now: Millis,
    ) -> BoxFuture<'a, Result<Acquire, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let mut inner = self.begin(StoreOp::Limit, "acquire")?;
            let leases = inner.leases.entry(agent.to_owned()).or_default();
            let mut reclaimed = 0;
            if leases.len() >= max as usize {
                let all: Vec<_> = leases.iter().map(|(h, u)| (h.clone(), *u)).collect();
                for (h, _) in expired_leases(&all, now, all.len()) {
                    leases.remove(&h);
                    reclaimed += 1;
                }
            }
            if leases.len() >= max as usize {
                return Ok(Acquire::Full { held: u32::try_from(leases.len()).unwrap_or(u32::MAX) });
            }
            leases.insert(holder.to_owned(), until);
            Ok(Acquire::Taken { reclaimed })
        })
    }

    fn release<'a>(&'a self, agent: &'a str, holder: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let mut inner = self.begin(StoreOp::Limit, "release")?;
            if let Some(leases) = inner.leases.get_mut(agent) {
                leases.remove(holder);
            }
            Ok(())
        })
    }

    fn leases<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Result<Vec<(String, Millis)>, StoreError>> {
        Box::pin(async move {
            let inner = self.begin(StoreOp::Get, "leases")?;
            Ok(inner.leases.get(agent).map(|l| l.iter().map(|(h, u)| (h.clone(), *u)).collect()).unwrap_or_default())
        })
    }
}

/// Not a request the simulation schedules or counts: every transition may look (through a cache),
/// and a workflow paused is an operator's act the simulation does not make.
impl PauseStore for MemoryStore {
    fn load_pauses(&self) -> BoxFuture<'_, Result<Option<Pauses>, StoreError>> {
        let pauses = self.lock().pauses.clone();
        Box::pin(async move { Ok(pauses) })
    }

    fn save_pauses<'a>(&'a self, pauses: &'a Pauses, read: Option<u64>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            if inner.pauses.as_ref().map(|p| p.ver) != read {
                return Ok(false);
            }
            inner.pauses = Some(pauses.clone());
            Ok(true)
        })
    }
}

/// Like the pauses: an operator's item, read by every sweep, not a request the simulation counts.
impl ScheduleStore for MemoryStore {
    fn load_schedules(&self) -> BoxFuture<'_, Result<Option<sas_protocol::schedules::Schedules>, StoreError>> {
        let schedules = self.lock().schedules.clone();
        Box::pin(async move { Ok(schedules) })
    }

    fn save_schedules<'a>(
        &'a self,
        schedules: &'a sas_protocol::schedules::Schedules,
        read: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            if inner.schedules.as_ref().map(|s| s.ver) != read {
                return Ok(false);
            }
            inner.schedules = Some(schedules.clone());
            Ok(true)
        })
    }
}

impl Pacer for MemoryStore {
    fn reserve<'a>(
        &'a self,
        agent: &'a str,
        rate: &'a crate::limit::Rate,
        now: Millis,
    ) -> BoxFuture<'a, Result<crate::limit::Pace, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let mut inner = self.begin(StoreOp::Limit, "reserve")?;
            let pace = crate::limit::pace(inner.rates.get(agent).copied(), now, crate::limit::PACE_LEAD_MS, rate);
            if let crate::limit::Pace::Reserve { tat, .. } = pace {
                inner.rates.insert(agent.to_owned(), tat);
            }
            Ok(pace)
        })
    }
}

impl KeyStore for MemoryStore {
    fn load_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyState>, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let inner = self.begin(StoreOp::Key, "load_key")?;
            Ok(inner.keys.get(key).cloned())
        })
    }

    fn save_key<'a>(
        &'a self,
        key: &'a str,
        state: &'a KeyState,
        read: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let mut inner = self.begin(StoreOp::Key, "save_key")?;
            if inner.keys.get(key).map(|k| k.ver) != read {
                return Ok(false);
            }
            inner.keys.insert(key.to_owned(), state.clone());
            Ok(true)
        })
    }
}

impl MemoryStore {
    /// The concurrency keys' items, for tests and the simulator's checks (not a request).
    pub fn keys(&self) -> BTreeMap<String, KeyState> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys.clone()
    }
}

impl TaskWriter for MemoryStore {
    fn create<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.turn().await;
            self.create_now(task)
        })
    }

    fn save<'a>(&'a self, task: &'a Task, read: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.turn().await;
            self.save_now(task, read)
        })
    }
}

impl StateStore for MemoryStore {
    fn get<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<Task>, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            Ok(self.begin(StoreOp::Get, "get")?.tasks.get(task_id).cloned())
        })
    }

    fn archived_history<'a>(
        &'a self,
        task_id: &'a TaskId,
        from: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<Vec<HistoryEntry>, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let inner = self.begin(StoreOp::Get, "archived_history")?;
            let range = (task_id.clone(), from)..(task_id.clone(), to.max(from));
            Ok(inner.history.range(range).map(|(_, h)| h.clone()).collect())
        })
    }

    fn get_many<'a>(&'a self, ids: &'a [TaskId]) -> BoxFuture<'a, Result<Vec<Task>, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            let inner = self.begin(StoreOp::Get, "get_many")?;
            Ok(ids.iter().filter_map(|id| inner.tasks.get(id).cloned()).collect())
        })
    }

    fn expired(
        &self,
        shard: u32,
        now: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            self.expired_now(shard, now, limit, start.as_ref())
        })
    }

    fn list_by_state(&self, state: ProcessState, max: usize) -> BoxFuture<'_, Result<Vec<TaskSummary>, StoreError>> {
        Box::pin(async move {
            self.turn().await;
            self.list_now(state, max)
        })
    }

    fn shards(&self) -> u32 {
        self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::AttemptToken;
    use crate::protocol::{submit, Policy};
    use crate::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

    fn task(id: &str, created: u64) -> Task {
        let wf = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve("order", None).unwrap().clone();
        submit(
            TaskId::try_from(id).unwrap(),
            wf,
            serde_json::json!({}),
            None,
            &crate::protocol::Ctx::at(Millis(created)),
            &Policy::default(),
        )
        .task
    }

    #[tokio::test]
    async fn writes_are_conditional_and_conflicts_carry_the_current_item() {
        let s = MemoryStore::new(2);
        let t = task("a", 0);
        s.create(&t).await.unwrap();
        assert!(matches!(s.create(&t).await, Err(StoreError::AlreadyExists)));
        let mut next = t.clone();
        next.rev += 1;
        next.lock.locked_by = Some(AttemptToken::from("tok"));
        s.save(&next, &t).await.unwrap();
        // a second writer that read the old revision loses and is handed what is there now
        let mut other = t.clone();
        other.rev += 1;
        match s.save(&other, &t).await {
            Err(StoreError::Conflict { current: Some(cur) }) => assert_eq!(*cur, next),
            r => panic!("expected a conflict, got {r:?}"),
        }
        // the same revision but another lock holder loses too
        let mut forged = next.clone();
        forged.lock.locked_by = Some(AttemptToken::from("other"));
        let mut after = next.clone();
        after.rev += 1;
        assert!(matches!(s.save(&after, &forged).await, Err(StoreError::Conflict { current: Some(_) })));
        // a missing task is a conflict with nothing current
        let ghost = task("ghost", 0);
        assert!(matches!(s.save(&ghost, &ghost).await, Err(StoreError::Conflict { current: None })));
    }

    #[tokio::test]
    async fn the_index_is_sparse_sharded_and_paged() {
        let s = MemoryStore::new(1);
        for i in 0..5 {
            s.create(&task(&format!("t{i}"), i * 10)).await.unwrap();
        }
        let mut done = task("done", 0);
        done.process_state = ProcessState::Processed;
        done.complete_by = None;
        s.put_unchecked(done);
        let far = Millis(10_000_000);
        let p1 = s.expired(0, far, 2, None).await.unwrap();
        assert_eq!(p1.keys.len(), 2);
        let p2 = s.expired(0, far, 2, p1.next.clone()).await.unwrap();
        let p3 = s.expired(0, far, 2, p2.next.clone()).await.unwrap();
        let ids: Vec<String> =
            [p1.keys, p2.keys, p3.keys].concat().into_iter().map(|k| k.task_id.to_string()).collect();
        assert_eq!(ids, vec!["t0", "t1", "t2", "t3", "t4"], "CompleteBy order, each once, the terminal task absent");
        assert!(p3.next.is_none());
        // nothing has expired yet at the start
        assert!(s.expired(0, Millis(0), 10, None).await.unwrap().keys.is_empty());
    }

    #[tokio::test]
    async fn ambiguous_writes_apply_and_then_report_a_failure() {
        let s = MemoryStore::new(1);
        let t = task("a", 0);
        s.ambiguous_next(StoreOp::Create, Ambiguity::Retried);
        assert!(matches!(s.create(&t).await, Err(StoreError::AlreadyExists)), "the SDK's retry finds the item");
        assert_eq!(s.tasks(), vec![t.clone()], "the first try applied");
        let mut next = t.clone();
        next.rev += 1;
        next.lock.locked_by = Some(AttemptToken::from("tok"));
        // a write that loses its condition does not use the injected ambiguity
        s.ambiguous_next(StoreOp::Save, Ambiguity::Retried);
        let mut stale = t.clone();
        stale.rev = 7;
        match s.save(&next, &stale).await {
            Err(StoreError::Conflict { current: Some(cur) }) => assert_eq!(*cur, t),
            r => panic!("expected a plain conflict, got {r:?}"),
        }
        match s.save(&next, &t).await {
            Err(StoreError::Conflict { current: Some(cur) }) => assert_eq!(*cur, next, "the item just written"),
            r => panic!("expected the retry's conflict, got {r:?}"),
        }
        assert_eq!(s.tasks(), vec![next.clone()]);
        let mut third = next.clone();
        third.rev += 1;
        s.ambiguous_next(StoreOp::Save, Ambiguity::Failed);
        assert!(matches!(s.save(&third, &next).await, Err(StoreError::Backend { .. })));
        assert_eq!(s.tasks(), vec![third.clone()], "applied all the same");
        s.ambiguous_next(StoreOp::Save, Ambiguity::Failed);
        s.clear_ambiguous();
        let mut fourth = third.clone();
        fourth.rev += 1;
        s.save(&fourth, &third).await.unwrap();
    }

    #[tokio::test]
    async fn the_deadline_index_pages_as_a_scan_of_every_task_would_and_follows_each_write() {
        let s = MemoryStore::new(2);
        let mut all = Vec::new();
        for i in 0..40u64 {
            let t = task(&format!("t{i:02}"), 1_000 * (i % 7));
            s.create(&t).await.unwrap();
            all.push(t);
        }
        // some end (out of the index), some move their deadline (their entry moves)
        for (i, t) in all.iter_mut().enumerate() {
            let mut next = t.clone();
            next.rev += 1;
            match i % 4 {
                0 => next.process_state = ProcessState::Processed,
                1 => next.complete_by = next.complete_by.map(|c| c.plus_ms(50_000)),
                _ => continue,
            }
            s.save(&next, t).await.unwrap();
            *t = next;
        }
        let now = Millis(all.iter().filter_map(|t| t.complete_by).map(|c| c.0).min().unwrap() + 40_000);
        for shard in 0..2 {
            let mut want: Vec<PageKey> = all
                .iter()
                .filter_map(|t| index_key(t, 2).map(|(sh, cb)| (sh, cb, t)))
                .filter(|(sh, cb, _)| *sh == shard && *cb <= now)
                .map(|(_, cb, t)| PageKey { task_id: t.task_id.clone(), complete_by: cb })
                .collect();
            want.sort_by(|a, b| (a.complete_by, &a.task_id).cmp(&(b.complete_by, &b.task_id)));
            assert!(want.len() > 3, "a few pages in shard {shard}: {}", want.len());
            let (mut got, mut start) = (Vec::new(), None);
            loop {
                let page = s.expired(shard, now, 3, start).await.unwrap();
                got.extend(page.keys);
                match page.next {
                    Some(k) => start = Some(k),
                    None => break,
                }
            }
            assert_eq!(got, want, "shard {shard}");
        }
    }

    #[tokio::test]
    async fn written_since_gives_each_task_written_after_the_mark_once_as_it_is_now() {
        let s = MemoryStore::new(1);
        let (a, b) = (task("a", 0), task("b", 0));
        s.create(&a).await.unwrap();
        let (first, mark) = s.written_since(0);
        assert_eq!(first, vec![a.clone()]);
        s.create(&b).await.unwrap();
        let mut a2 = a.clone();
        a2.rev += 1;
        s.save(&a2, &a).await.unwrap();
        let mut b2 = b.clone();
        b2.rev += 1;
        s.save(&b2, &b).await.unwrap();
        let (next, end) = s.written_since(mark);
        assert_eq!(next, vec![a2.clone(), b2.clone()], "in the order of their last write, each once");
        assert_eq!(s.written_since(end).0, Vec::<Task>::new(), "nothing since");
        assert_eq!(s.task(&a2.task_id), Some(a2.clone()));
        assert_eq!(s.peek(&b2.task_id, |t| t.rev), Some(b2.rev));
        assert_eq!(s.calls("get"), 0, "the looks are not requests");
    }

    #[tokio::test]
    async fn injected_failures_hit_once() {
        let s = MemoryStore::new(1);
        s.fail_next(StoreOp::Get, StoreError::Backend { op: "GetItem", message: "down".into(), source: None });
        let id = TaskId::try_from("x").unwrap();
        assert!(matches!(s.get(&id).await, Err(StoreError::Backend { .. })));
        assert!(s.get(&id).await.unwrap().is_none());
        assert_eq!(s.calls("get"), 2);
    }
}
