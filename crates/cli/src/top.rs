//! `sasctl top`: the tasks in flight by `ProcessState` and the oldest overdue steps, in a few
//! requests.
//!
//! Every task in flight has a `CompleteBy` and an entry in the keys-only `ByCompleteBy` index (the
//! Supervisor's sweep reads the same index). One pass over it (one `Query` per shard and per 1 MB
//! of keys) gives how many tasks are in flight and how many are overdue (`CompleteBy` in the past:
//! an attempt that has not answered by its deadline, or a wait whose run message was not claimed;
//! the next sweep times them out or restarts them). The index holds no state, so the tasks are
//! then read (`BatchGetItem`, 100 per request): all of them when they are few (`read_all`), else
//! only the oldest overdue ones. Ended tasks are counted apart ([`crate::table::TableReader`]'s
//! `Select=COUNT` queries of `ByEnd`). The agents with a `max_in_flight` are shown with their
//! leases ([`agent_limits`]: one `GetItem` each).

use std::fmt::Write as _;

use sas_core::store::{Limiter, PageKey, StateStore, StoreError};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{ProcessState, Task};

use crate::timeline::{duration, utc};

/// Index entries per `Query` page.
const PAGE: usize = 1000;
/// Items per `BatchGetItem`.
const BATCH: usize = 100;
/// `CompleteBy` bound that every in-flight task is below (as the store's own listing uses).
const FAR: Millis = Millis(u64::MAX / 2);

/// An overdue task, as `top` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Overdue {
    pub task_id: TaskId,
    pub workflow: String,
    pub state: ProcessState,
    /// The unit it is on (a step or a compensation).
    pub step: Option<String>,
    /// Attempts of that unit so far.
    pub attempts: u32,
    pub complete_by: Millis,
}

/// What one look at the table found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub at: Millis,
    /// Tasks in the `ByCompleteBy` index: every task in flight.
    pub in_flight: usize,
    /// Their count by state, when every one was read.
    pub by_state: Option<Vec<(ProcessState, usize)>>,
    /// The tasks waiting for a slot of their concurrency key, by key, most first (when every task
    /// was read).
    pub waiting_for_keys: Vec<(String, usize)>,
    /// Tasks parked because their workflow is paused (when every task was read).
    pub parked: usize,
    /// The paused workflows: name, since when, why (when looked at).
    pub paused: Vec<(String, Millis, String)>,
    /// Index entries whose `CompleteBy` is past.
    pub overdue: usize,
    /// The most overdue tasks (at most the `show` asked for), most overdue first.
    pub oldest: Vec<Overdue>,
    /// Ended tasks by state (the `ByEnd` index), when counted.
    pub ended: Vec<(ProcessState, u64)>,
    /// `Query` requests of `ByCompleteBy`.
    pub key_queries: u64,
    /// `BatchGetItem` requests (about: throttled keys are retried).
    pub item_requests: u64,
    pub items_read: usize,
    /// `Select=COUNT` requests of `ByEnd` (at least: one per shard and state, more past 1 MB).
    pub count_queries: u64,
    /// Index entries this build could not read.
    pub unreadable: usize,
    /// The agents with a `max_in_flight` and their leases now, when looked at.
    pub limits: Vec<AgentLimit>,
    /// `GetItem` requests of the agents' limit items.
    pub limit_reads: u64,
}

/// An agent with a `max_in_flight`, as its limit item is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLimit {
    pub agent: String,
    pub max: u32,
    /// Leases not yet ended: calls in flight (or holders about to give their slot back).
    pub held: u32,
    /// Leases past their end: their holder died or hung; the next taker that finds the agent
    /// full reclaims them.
    pub expired: u32,
}

/// The leases of each agent in `agents` (name, `max_in_flight`): one consistent `GetItem` each.
pub async fn agent_limits(
    limiter: &dyn Limiter,
    agents: &[(String, u32)],
    now: Millis,
) -> Result<Vec<AgentLimit>, StoreError> {
    let mut out = Vec::new();
    for (agent, max) in agents {
        let leases = limiter.leases(agent).await?;
        let expired = leases.iter().filter(|(_, until)| *until <= now).count();
        out.push(AgentLimit {
            agent: agent.clone(),
            max: *max,
            held: u32::try_from(leases.len() - expired).unwrap_or(u32::MAX),
            expired: u32::try_from(expired).unwrap_or(u32::MAX),
        });
    }
    Ok(out)
}

/// The ended states whose tasks `top` and the console count (the `ByEnd` index's); rejected
/// submissions never become tasks (they are in the submission DLQ).
pub fn counted_ended_states() -> impl Iterator<Item = ProcessState> {
    ProcessState::ALL.into_iter().filter(|s| s.is_terminal() && *s != ProcessState::Rejected)
}

/// Read the in-flight part: every key of `ByCompleteBy`, then the tasks (every one when there are
/// at most `read_all`, else the `show` most overdue).
pub async fn in_flight(
    store: &dyn StateStore,
    now: Millis,
    read_all: usize,
    show: usize,
) -> Result<Snapshot, StoreError> {
    let mut snap = Snapshot { at: now, ..Snapshot::default() };
    let mut keys: Vec<PageKey> = Vec::new();
    for shard in 0..store.shards().max(1) {
        let mut start = None;
        loop {
            let page = store.expired(shard, FAR, PAGE, start).await?;
            snap.key_queries += 1;
            snap.unreadable += page.unreadable.len();
            keys.extend(page.keys);
            start = page.next;
            if start.is_none() {
                break;
            }
        }
    }
    keys.sort_by(|a, b| (a.complete_by, &a.task_id).cmp(&(b.complete_by, &b.task_id)));
    snap.in_flight = keys.len();
    snap.overdue = keys.iter().filter(|k| k.complete_by <= now).count();
    let all = keys.len() <= read_all;
    let wanted: Vec<TaskId> = if all {
        keys.iter().map(|k| k.task_id.clone()).collect()
    } else {
        keys.iter().filter(|k| k.complete_by <= now).take(show).map(|k| k.task_id.clone()).collect()
    };
    let mut tasks: Vec<Task> = Vec::with_capacity(wanted.len());
    for chunk in wanted.chunks(BATCH) {
        tasks.extend(store.get_many(chunk).await?);
        snap.item_requests += 1;
    }
    snap.items_read = tasks.len();
    // The index lags the table: a task read as ended is no longer in flight.
    tasks.retain(|t| !t.process_state.is_terminal());
    if all {
        let counts = ProcessState::ALL
            .into_iter()
            .filter(|s| !s.is_terminal())
            .map(|s| (s, tasks.iter().filter(|t| t.process_state == s).count()))
            .collect();
        snap.by_state = Some(counts);
        let mut by_key: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for slot in tasks.iter().filter(|t| t.waits_for_slot()).filter_map(|t| t.slot.as_ref()) {
            *by_key.entry(slot.key.as_str()).or_default() += 1;
        }
        let mut by_key: Vec<(String, usize)> = by_key.into_iter().map(|(k, n)| (k.to_owned(), n)).collect();
        by_key.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        snap.waiting_for_keys = by_key;
        snap.parked = tasks.iter().filter(|t| t.claim.paused).count();
    }
    let mut oldest: Vec<Overdue> = tasks
        .iter()
        .filter_map(|t| {
            let cb = t.complete_by.filter(|cb| *cb <= now)?;
            Some(Overdue {
                task_id: t.task_id.clone(),
                workflow: format!("{}@{}", t.workflow.name, t.workflow.version),
                state: t.process_state,
                step: t.current_step_name().map(str::to_owned),
                attempts: current_attempts(t),
                complete_by: cb,
            })
        })
        .collect();
    oldest.sort_by(|a, b| (a.complete_by, &a.task_id).cmp(&(b.complete_by, &b.task_id)));
    oldest.truncate(show);
    snap.oldest = oldest;
    Ok(snap)
}

fn current_attempts(t: &Task) -> u32 {
    let Some(unit) = t.current_step_name() else { return 0 };
    t.steps
        .iter()
        .find_map(|s| {
            if s.name == unit {
                Some(s.attempts)
            } else {
                s.compensation.as_ref().filter(|c| c.name == unit).map(|c| c.attempts)
            }
        })
        .unwrap_or(0)
}

/// The snapshot for people.
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "sasctl top at {}", utc(s.at));
    let _ = write!(out, "in flight: {} task{}", s.in_flight, if s.in_flight == 1 { "" } else { "s" });
    match &s.by_state {
        Some(counts) => {
            let parts: Vec<String> = counts.iter().map(|(st, n)| format!("{st} {n}")).collect();
            let _ = writeln!(out, " ({})", parts.join(", "));
        }
        None => {
            let _ = writeln!(out, " (too many to read each one: --read-all to raise the limit)");
        }
    }
    for (name, at, reason) in &s.paused {
        match name.strip_prefix(sas_protocol::keys::KEY_PREFIX) {
            Some(key) => {
                let _ = writeln!(
                    out,
                    "paused: concurrency key {name} since {} ({reason}); sasctl resume --key {key}",
                    utc(*at)
                );
            }
            None => {
                let _ = writeln!(out, "paused: workflow {name} since {} ({reason}); sasctl resume {name}", utc(*at));
            }
        }
    }
    if s.parked > 0 {
        let _ = writeln!(out, "parked (their workflow or key paused; they continue once it is resumed): {}", s.parked);
    }
    if !s.waiting_for_keys.is_empty() {
        let total: usize = s.waiting_for_keys.iter().map(|(_, n)| n).sum();
        let parts: Vec<String> = s.waiting_for_keys.iter().take(10).map(|(k, n)| format!("{k} {n}")).collect();
        let more = s.waiting_for_keys.len().saturating_sub(10);
        let more = if more > 0 { format!(" and {more} more keys") } else { String::new() };
        let _ = writeln!(
            out,
            "waiting for a slot of their concurrency key (Pending, not overdue: a task of the key that ends grants it): {total}: {}{more} (sasctl key SCOPE VALUE shows a key's line)",
            parts.join(", ")
        );
    }
    if !s.ended.is_empty() {
        let parts: Vec<String> = s.ended.iter().map(|(st, n)| format!("{st} {n}")).collect();
        let _ = writeln!(
            out,
            "ended, still in the table (finished tasks expire after RetentionDays; Error ones stay): {}",
            parts.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "overdue (CompleteBy in the past; the Supervisor's next sweep times them out or restarts them): {}",
        s.overdue
    );
    if !s.oldest.is_empty() {
        let _ = writeln!(out, "oldest overdue steps, most overdue first:");
        let id_w = s.oldest.iter().map(|o| o.task_id.as_str().len()).max().unwrap_or(4).max(4);
        let _ = writeln!(
            out,
            "  {:<id_w$}  {:<16} {:<13} {:<14} {:>8}  {:>12}",
            "task", "workflow", "state", "step", "attempts", "overdue by"
        );
        for o in &s.oldest {
            let _ = writeln!(
                out,
                "  {:<id_w$}  {:<16} {:<13} {:<14} {:>8}  {:>12}",
                o.task_id.as_str(),
                o.workflow,
                o.state.as_str(),
                o.step.as_deref().unwrap_or("-"),
                o.attempts,
                duration(o.complete_by.until(s.at))
            );
        }
    }
    if !s.limits.is_empty() {
        let _ = writeln!(out, "agents with a max_in_flight (leases held now / the limit):");
        let w = s.limits.iter().map(|l| l.agent.len()).max().unwrap_or(5).max(5);
        for l in &s.limits {
            let note = if l.expired > 0 {
                format!(
                    ", {} expired (holders that died or hung; reclaimed by the next request that finds it full)",
                    l.expired
                )
            } else if l.held >= l.max {
                ": full, requests wait on the agent queue (metric AgentAtLimit)".to_owned()
            } else {
                String::new()
            };
            let _ = writeln!(out, "  {:<w$}  {}/{}{note}", l.agent, l.held, l.max);
        }
    }
    let _ = writeln!(
        out,
        "requests: {} ByCompleteBy queries (keys only), {} BatchGetItem ({} tasks read){}{}",
        s.key_queries,
        s.item_requests,
        s.items_read,
        if s.count_queries > 0 {
            format!(", at least {} Select=COUNT queries of ByEnd", s.count_queries)
        } else {
            String::new()
        },
        if s.limit_reads > 0 {
            format!(", {} GetItem of agents' limits and the paused workflows", s.limit_reads)
        } else {
            String::new()
        }
    );
    if s.unreadable > 0 {
        let _ = writeln!(out, "{} index entries could not be read by this build", s.unreadable);
    }
    out
}

#[cfg(test)]
mod limit_tests {
    use super::*;
    use sas_core::store::MemoryStore;

    #[tokio::test]
    async fn agents_limits_show_held_and_expired_leases() {
        let store = MemoryStore::new(1);
        let now = Millis(1_000_000);
        store.acquire("pay", 2, "a", now.plus_ms(5_000), now).await.unwrap();
        store.acquire("pay", 2, "b", Millis(now.0 - 1), Millis(now.0 - 10)).await.unwrap();
        store.acquire("ship", 1, "c", now.plus_ms(5_000), now).await.unwrap();
        let agents = vec![("pay".to_owned(), 2), ("ship".to_owned(), 1), ("idle".to_owned(), 4)];
        let limits = agent_limits(&store, &agents, now).await.unwrap();
        let got: Vec<(u32, u32)> = limits.iter().map(|l| (l.held, l.expired)).collect();
        assert_eq!(got, vec![(1, 1), (1, 0), (0, 0)]);
        let text = render(&Snapshot { at: now, limits, limit_reads: 3, ..Snapshot::default() });
        assert!(text.contains("  pay    1/2, 1 expired (holders that died or hung"), "{text}");
        assert!(text.contains("  ship   1/1: full, requests wait on the agent queue"), "{text}");
        assert!(text.contains("  idle   0/4\n"), "{text}");
        assert!(text.contains(", 3 GetItem of agents' limits"), "{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_core::store::{MemoryStore, TaskWriter};
    use sas_protocol::ids::AttemptToken;
    use sas_protocol::protocol::{self, apply, Ctx, Event, Policy};
    use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
    use serde_json::json;

    const T0: u64 = 1_795_300_000_000;

    fn ctx(ms: u64) -> Ctx {
        Ctx { paused: false, now: Millis(T0 + ms), fresh_token: AttemptToken::fresh(), jitter: 0.5 }
    }

    fn policy() -> Policy {
        Policy { queue_budget_ms: 10_000, ..Policy::default() }
    }

    /// A task submitted `at` ms after T0 (its first step claimed: CompleteBy = at + 10 s + 5 s).
    fn submitted(id: &str, at: u64) -> Task {
        let wf = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve("order", None).unwrap().clone();
        protocol::submit(TaskId::try_from(id).unwrap(), wf, json!({}), None, &ctx(at), &policy()).task
    }

    async fn store_with(tasks: &[Task]) -> MemoryStore {
        let store = MemoryStore::new(4);
        for t in tasks {
            store.create(t).await.unwrap();
        }
        store
    }

    #[tokio::test]
    async fn counts_in_flight_by_state_and_lists_the_most_overdue_first() {
        let old = submitted("a-old", 0); // CompleteBy +15 s
        let newer = submitted("b-newer", 5_000); // +20 s
        let not_yet = submitted("c-not-yet", 30_000); // +45 s
                                                      // its first attempt failed retryably: it waits (Pending) for a claim, at most 30 s
        let pending = submitted("d-pending", 0);
        let attempt = pending.lock.locked_by.clone().unwrap();
        let failed = Event::AgentFailed { attempt, error: "503".into(), retryable: true };
        let pending = apply(&pending, &failed, &ctx(1_000), &policy()).unwrap().task;
        assert_eq!(pending.process_state, ProcessState::Pending);
        let done = {
            let mut t = submitted("e-done", 0);
            for ms in [100, 200, 300] {
                let attempt = t.lock.locked_by.clone().unwrap();
                t = apply(&t, &Event::AgentSucceeded { attempt, output: json!({}) }, &ctx(ms), &policy()).unwrap().task;
            }
            t
        };
        assert_eq!(done.process_state, ProcessState::Processed);
        let store = store_with(&[old, newer, not_yet, pending, done]).await;
        let now = Millis(T0 + 35_000);
        let snap = in_flight(&store, now, 100, 10).await.unwrap();
        assert_eq!(snap.in_flight, 4, "the ended task is not in the index");
        assert_eq!(snap.overdue, 3);
        assert_eq!(
            snap.by_state,
            Some(vec![(ProcessState::Pending, 1), (ProcessState::Processing, 3), (ProcessState::Compensating, 0)])
        );
        let ids: Vec<&str> = snap.oldest.iter().map(|o| o.task_id.as_str()).collect();
        assert_eq!(ids, ["a-old", "b-newer", "d-pending"]);
        assert_eq!(snap.key_queries, 4, "one query per shard");
        assert_eq!((snap.item_requests, snap.items_read), (1, 4));
        let text = render(&snap);
        assert!(text.contains("in flight: 4 tasks (Pending 1, Processing 3, Compensating 0)"), "{text}");
        assert!(text.contains("overdue (CompleteBy in the past"), "{text}");
        let a_line = text.lines().find(|l| l.contains("a-old")).unwrap();
        assert!(a_line.contains("order@1") && a_line.contains("reserve") && a_line.contains("20.000s"), "{text}");
        let d_line = text.lines().find(|l| l.contains("d-pending")).unwrap();
        // CompleteBy: its retry is due at +1.75 s (a 750 ms backoff), plus the 30 s start timeout
        assert!(d_line.contains("Pending") && d_line.contains("3.250s"), "{text}");
        assert!(text.contains("requests: 4 ByCompleteBy queries (keys only), 1 BatchGetItem (4 tasks read)"), "{text}");
    }

    #[tokio::test]
    async fn many_tasks_in_flight_read_only_the_oldest_overdue() {
        let tasks: Vec<Task> = (0..30).map(|i| submitted(&format!("t-{i:02}"), i * 1_000)).collect();
        let store = store_with(&tasks).await;
        // at +30 s: the tasks submitted before +15 s are overdue (CompleteBy = submit + 15 s)
        let snap = in_flight(&store, Millis(T0 + 30_000), 10, 3).await.unwrap();
        assert_eq!((snap.in_flight, snap.overdue), (30, 16));
        assert_eq!(snap.by_state, None);
        assert_eq!(snap.items_read, 3, "only the three shown are read");
        let ids: Vec<&str> = snap.oldest.iter().map(|o| o.task_id.as_str()).collect();
        assert_eq!(ids, ["t-00", "t-01", "t-02"]);
        assert!(render(&snap).contains("too many to read each one"));
    }
}
