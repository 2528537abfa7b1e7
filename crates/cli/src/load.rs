//! `sas-dev load` (`make load`): a benchmark on a deployed stack, not a test. It sends a burst of tasks to the
//! submission queue as fast as `SendMessageBatch` allows, polls the table (`BatchGetItem`, 100 ids
//! per request, eventually consistent) until every task is terminal or the time is up, and
//! reports the drain time, the throughput, the latency from submission to the end, the attempts
//! per step, the final states and what the polling cost.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use futures::stream::{self, StreamExt};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{Submission, VERSION};
use sas_protocol::protocol::Task;
use serde::Serialize;
use serde_json::Value;

use crate::table::{ReadCost, TableReader};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub tasks: usize,
    pub workflow: String,
    pub input: Value,
    /// Task ids are `{prefix}-{n:05}`.
    pub prefix: String,
    /// `SendMessageBatch` requests in flight.
    pub send_concurrency: usize,
    /// Give up polling after this long (counted from the first send).
    pub timeout: Duration,
    /// Pause between polling rounds.
    pub poll_every: Duration,
}

/// What the burst sent.
#[derive(Debug, Clone, Default)]
pub struct Burst {
    /// Each task sent, with the instant its batch was sent (epoch ms, this machine's clock).
    pub sent: Vec<(TaskId, Millis)>,
    pub requests: u64,
    pub failed: usize,
    pub first_failure: Option<String>,
    pub elapsed: Duration,
}

/// Progress of the polling, for a live line.
#[derive(Debug, Clone)]
pub struct Progress {
    pub elapsed: Duration,
    pub terminal: usize,
    pub total: usize,
    /// Tasks not terminal yet, by state (`(not created)` for those the submitter has not made).
    pub open: BTreeMap<String, usize>,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:>4} s] terminal {}/{}", self.elapsed.as_secs(), self.terminal, self.total)?;
        if !self.open.is_empty() {
            let open: Vec<String> = self.open.iter().map(|(k, v)| format!("{k} {v}")).collect();
            write!(f, "; open: {}", open.join(", "))?;
        }
        Ok(())
    }
}

/// One `SendMessageBatch`: the entries sent (with when), how many failed, the first failure.
type BatchSent = (Vec<(TaskId, Millis)>, usize, Option<String>);

/// Send `opts.tasks` submissions in `SendMessageBatch` requests of ten.
pub async fn send_burst(sqs: &aws_sdk_sqs::Client, queue: &str, opts: &LoadOptions) -> Result<Burst> {
    let ids: Vec<TaskId> = (0..opts.tasks)
        .map(|n| TaskId::try_from(format!("{}-{n:05}", opts.prefix)))
        .collect::<Result<_, _>>()
        .context("--prefix makes invalid task ids")?;
    let bodies: Vec<(TaskId, String)> = ids
        .into_iter()
        .map(|id| {
            let sub = Submission {
                v: VERSION,
                task_id: Some(id.clone()),
                workflow: opts.workflow.clone(),
                workflow_version: None,
                input: opts.input.clone(),
                reply_to: None,
                priority: None,
                schedule: None,
            };
            serde_json::to_string(&sub).map(|b| (id, b))
        })
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let results: Vec<BatchSent> = stream::iter(bodies.chunks(10))
        .map(|chunk| async move {
            let entries: Vec<SendMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .map(|(i, (_, body))| {
                    SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(body).build()
                })
                .collect::<Result<_, _>>()
                .expect("id and body are set");
            let at = Millis::now();
            match sqs.send_message_batch().queue_url(queue).set_entries(Some(entries)).send().await {
                Ok(out) => {
                    let failed: Vec<usize> = out.failed.iter().filter_map(|f| f.id.parse().ok()).collect();
                    let first = out.failed.first().map(|f| f.message.clone().unwrap_or_else(|| f.code.clone()));
                    let ok = chunk
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !failed.contains(i))
                        .map(|(_, (id, _))| (id.clone(), at))
                        .collect();
                    (ok, out.failed.len(), first)
                }
                Err(e) => (Vec::new(), chunk.len(), Some(aws_sdk_sqs::Error::from(e).to_string())),
            }
        })
        .buffer_unordered(opts.send_concurrency.max(1))
        .collect()
        .await;
    let mut burst = Burst { elapsed: started.elapsed(), ..Burst::default() };
    for (ok, failed, first) in results {
        burst.requests += 1;
        burst.sent.extend(ok);
        burst.failed += failed;
        if burst.first_failure.is_none() {
            burst.first_failure = first;
        }
    }
    Ok(burst)
}

/// Poll the sent tasks until each is terminal or `opts.timeout` (from `started`) passes. Terminal
/// tasks are read once more and then no more (a terminal task is never left by itself).
pub async fn poll_until_terminal(
    reader: &TableReader,
    ids: &[TaskId],
    started: Instant,
    opts: &LoadOptions,
    mut progress: impl FnMut(&Progress),
) -> Result<(HashMap<TaskId, Task>, ReadCost)> {
    let mut done: HashMap<TaskId, Task> = HashMap::with_capacity(ids.len());
    let mut open: Vec<TaskId> = ids.to_vec();
    let mut cost = ReadCost::default();
    let mut last_seen: HashMap<TaskId, Task> = HashMap::new();
    loop {
        let (found, c) = reader.get_many(&open, false).await?;
        cost += c;
        let mut states: BTreeMap<String, usize> = BTreeMap::new();
        open.retain(|id| match found.get(id) {
            Some(t) if t.process_state.is_terminal() => {
                done.insert(id.clone(), t.clone());
                false
            }
            Some(t) => {
                *states.entry(t.process_state.to_string()).or_default() += 1;
                last_seen.insert(id.clone(), t.clone());
                true
            }
            None => {
                *states.entry("(not created)".into()).or_default() += 1;
                true
            }
        });
        progress(&Progress { elapsed: started.elapsed(), terminal: done.len(), total: ids.len(), open: states });
        if open.is_empty() || started.elapsed() >= opts.timeout {
            break;
        }
        tokio::time::sleep(opts.poll_every).await;
    }
    // What is still open is reported as last seen.
    for id in open {
        if let Some(t) = last_seen.remove(&id) {
            done.insert(id, t);
        }
    }
    Ok((done, cost))
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Latency {
    /// Nearest-rank percentiles; `None` for no samples.
    pub fn of(mut samples: Vec<u64>) -> Option<Latency> {
        samples.sort_unstable();
        let max = *samples.last()?;
        Some(Latency {
            p50: percentile(&samples, 50),
            p90: percentile(&samples, 90),
            p99: percentile(&samples, 99),
            max,
        })
    }
}

/// The nearest-rank `p`th percentile of sorted, non-empty `sorted`.
pub fn percentile(sorted: &[u64], p: usize) -> u64 {
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p50 {}, p90 {}, p99 {}, max {}", secs(self.p50), secs(self.p90), secs(self.p99), secs(self.max))
    }
}

#[allow(clippy::cast_precision_loss)] // durations in ms are far below 2^52
fn secs(ms: u64) -> String {
    format!("{:.2} s", ms as f64 / 1000.0)
}

/// Attempts over units of work that ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Attempts {
    pub attempts: u64,
    pub units: u64,
    pub per_unit: f64,
}

impl Attempts {
    fn of(attempts: u64, units: u64) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let per_unit = if units == 0 { 0.0 } else { attempts as f64 / units as f64 };
        Attempts { attempts, units, per_unit }
    }
}

/// The benchmark's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    /// The task id prefix of this run.
    pub run: String,
    pub workflow: String,
    pub requested: usize,
    pub sent: usize,
    pub send_failed: usize,
    pub send_requests: u64,
    pub send_secs: f64,
    /// Tasks that reached a terminal state.
    pub terminal: usize,
    /// Tasks never seen in the table (the submitter did not create them in time).
    pub missing: usize,
    /// Every sent task terminal?
    pub drained: bool,
    /// From the first send to the last terminal `UpdatedAt` (when drained), else to the end of
    /// polling.
    pub drain_secs: f64,
    /// Terminal tasks per second over `drain_secs`.
    pub throughput_per_s: f64,
    /// Send of the task's batch to its terminal `UpdatedAt`.
    pub latency_from_submission_ms: Option<Latency>,
    /// `CreatedAt` (the submitter made the task) to its terminal `UpdatedAt`.
    pub latency_from_created_ms: Option<Latency>,
    /// Send to `CreatedAt`: time in the submission queue and the submitter.
    pub submission_wait_ms: Option<Latency>,
    /// Over forward steps with at least one attempt.
    pub attempts_per_step: Attempts,
    /// Over compensations with at least one attempt.
    pub attempts_per_compensation: Attempts,
    /// Every task seen, by its last state (terminal or not).
    pub states: BTreeMap<String, usize>,
    /// Tasks with `FailureCount > 0`.
    pub with_failures: usize,
    pub failure_count_total: u64,
    pub reads: ReadCost,
}

/// The figures from what was sent and the tasks as last read (pure).
pub fn report<S: std::hash::BuildHasher>(
    workflow: &str,
    requested: usize,
    burst: &Burst,
    tasks: &HashMap<TaskId, Task, S>,
    elapsed: Duration,
    reads: ReadCost,
) -> LoadReport {
    let first_send = burst.sent.iter().map(|(_, at)| *at).min().unwrap_or_default();
    let mut from_sub = Vec::new();
    let mut from_created = Vec::new();
    let mut waits = Vec::new();
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let (mut steps, mut comps) = ((0u64, 0u64), (0u64, 0u64));
    let mut last_end = first_send;
    let mut terminal = 0;
    for (id, sent_at) in &burst.sent {
        let Some(t) = tasks.get(id) else { continue };
        *states.entry(t.process_state.to_string()).or_default() += 1;
        waits.push(sent_at.until(t.created_at));
        for s in &t.steps {
            if s.attempts > 0 {
                steps.0 += u64::from(s.attempts);
                steps.1 += 1;
            }
            if let Some(c) = s.compensation.as_ref().filter(|c| c.attempts > 0) {
                comps.0 += u64::from(c.attempts);
                comps.1 += 1;
            }
        }
        if t.process_state.is_terminal() {
            terminal += 1;
            from_sub.push(sent_at.until(t.updated_at));
            from_created.push(t.created_at.until(t.updated_at));
            last_end = last_end.max(t.updated_at);
        }
    }
    let drained = terminal == burst.sent.len() && !burst.sent.is_empty();
    #[allow(clippy::cast_precision_loss)]
    let drain_secs = if drained { first_send.until(last_end) as f64 / 1000.0 } else { elapsed.as_secs_f64() };
    #[allow(clippy::cast_precision_loss)]
    let throughput_per_s = if drain_secs > 0.0 { terminal as f64 / drain_secs } else { 0.0 };
    let seen: Vec<&Task> = burst.sent.iter().filter_map(|(id, _)| tasks.get(id)).collect();
    LoadReport {
        run: String::new(),
        workflow: workflow.to_owned(),
        requested,
        sent: burst.sent.len(),
        send_failed: burst.failed,
        send_requests: burst.requests,
        send_secs: burst.elapsed.as_secs_f64(),
        terminal,
        missing: burst.sent.len() - seen.len(),
        drained,
        drain_secs,
        throughput_per_s,
        latency_from_submission_ms: Latency::of(from_sub),
        latency_from_created_ms: Latency::of(from_created),
        submission_wait_ms: Latency::of(waits),
        attempts_per_step: Attempts::of(steps.0, steps.1),
        attempts_per_compensation: Attempts::of(comps.0, comps.1),
        states,
        with_failures: seen.iter().filter(|t| t.failure_count > 0).count(),
        failure_count_total: seen.iter().map(|t| u64::from(t.failure_count)).sum(),
        reads,
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let na = || "-".to_owned();
        if !self.run.is_empty() {
            writeln!(f, "run         {}-NNNNN", self.run)?;
        }
        writeln!(
            f,
            "sent        {} of {} {} tasks in {:.2} s ({} SendMessageBatch requests, {} entries failed)",
            self.sent, self.requested, self.workflow, self.send_secs, self.send_requests, self.send_failed
        )?;
        writeln!(
            f,
            "drain       {} of {} terminal in {:.1} s{}",
            self.terminal,
            self.sent,
            self.drain_secs,
            if self.drained { " (first send to last terminal UpdatedAt)" } else { " (NOT drained: timed out)" }
        )?;
        writeln!(f, "throughput  {:.1} tasks/s", self.throughput_per_s)?;
        writeln!(
            f,
            "latency     submission -> terminal:  {}",
            self.latency_from_submission_ms.map_or_else(na, |l| l.to_string())
        )?;
        writeln!(
            f,
            "            CreatedAt -> terminal:   {}",
            self.latency_from_created_ms.map_or_else(na, |l| l.to_string())
        )?;
        writeln!(
            f,
            "            submission -> CreatedAt: {}",
            self.submission_wait_ms.map_or_else(na, |l| l.to_string())
        )?;
        writeln!(
            f,
            "attempts    {:.2} per step ({} attempts over {} steps that ran); {:.2} per compensation ({} over {})",
            self.attempts_per_step.per_unit,
            self.attempts_per_step.attempts,
            self.attempts_per_step.units,
            self.attempts_per_compensation.per_unit,
            self.attempts_per_compensation.attempts,
            self.attempts_per_compensation.units
        )?;
        let states: Vec<String> = self.states.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let missing = if self.missing > 0 { format!(", never created {}", self.missing) } else { String::new() };
        writeln!(f, "states      {}{missing}", if states.is_empty() { "-".to_owned() } else { states.join(", ") })?;
        writeln!(
            f,
            "failures    {} tasks with FailureCount > 0 ({} failures in all)",
            self.with_failures, self.failure_count_total
        )?;
        write!(f, "reads       BatchGetItem (eventually consistent, <= 100 ids): {}", self.reads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_protocol::protocol::{self, Ctx, Event, Policy, ProcessState};
    use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!((percentile(&v, 50), percentile(&v, 90), percentile(&v, 99)), (50, 90, 99));
        assert_eq!(percentile(&[7], 99), 7);
        let l = Latency::of(vec![30, 10, 20]).unwrap();
        assert_eq!((l.p50, l.p90, l.p99, l.max), (20, 30, 30, 30));
        assert_eq!(Latency::of(Vec::new()), None);
    }

    fn go(t: &Task, e: &Event, now: &mut u64) -> Task {
        *now += 100;
        let ctx = Ctx { paused: false, now: Millis(*now), fresh_token: format!("k{now}").as_str().into(), jitter: 0.0 };
        protocol::apply(
            t,
            e,
            &ctx,
            &Policy { queue_budget_ms: 0, result_grace_ms: 0, settle_ms: 0, ..Policy::default() },
        )
        .unwrap()
        .task
    }

    /// A sim-order task run to the end: every step succeeds, `retries` timeouts on the first.
    fn run(id: &str, created: u64, retries: u32) -> Task {
        let wf = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve("sim-order", None).unwrap().clone();
        let policy = Policy { queue_budget_ms: 0, result_grace_ms: 0, settle_ms: 0, ..Policy::default() };
        let mut now = created;
        let ctx = protocol::Ctx::at(Millis(now));
        let mut t =
            protocol::submit(TaskId::try_from(id).unwrap(), wf, serde_json::json!({}), None, &ctx, &policy).task;
        for _ in 0..retries {
            now += 10_000;
            t = go(&t, &Event::DeadlineExpired, &mut now);
            t = go(&t, &Event::Claim { rev: t.claim.rev }, &mut now);
        }
        while t.process_state == ProcessState::Processing {
            let attempt = t.lock.locked_by.clone().unwrap();
            t = go(&t, &Event::AgentSucceeded { attempt, output: serde_json::json!({}) }, &mut now);
        }
        t
    }

    #[test]
    fn report_counts_states_attempts_and_latencies() {
        let a = run("a", 1_100, 0);
        let b = run("b", 1_500, 1);
        let id = |s: &str| TaskId::try_from(s).unwrap();
        let burst = Burst {
            sent: vec![(id("a"), Millis(1_000)), (id("b"), Millis(1_000)), (id("c"), Millis(1_000))],
            requests: 1,
            ..Burst::default()
        };
        let mut tasks = HashMap::from([(id("a"), a.clone()), (id("b"), b.clone())]);
        let r = report("sim-order", 3, &burst, &tasks, Duration::from_secs(30), ReadCost::default());
        assert!(!r.drained, "c was never created");
        assert_eq!((r.terminal, r.missing, r.with_failures), (2, 1, 1));
        assert_eq!(r.states, BTreeMap::from([("Processed".to_owned(), 2)]));
        // a: 3 steps, 1 attempt each; b: 2 attempts on reserve.
        assert_eq!((r.attempts_per_step.attempts, r.attempts_per_step.units), (7, 6));
        assert!((r.drain_secs - 30.0).abs() < 1e-9, "not drained: the time polled");
        let l = r.latency_from_submission_ms.unwrap();
        assert_eq!(l.max, b.updated_at.0 - 1_000);
        assert_eq!(r.submission_wait_ms.unwrap().max, 500);

        tasks.insert(id("c"), run("c", 1_200, 0));
        let r = report("sim-order", 3, &burst, &tasks, Duration::from_secs(30), ReadCost::default());
        assert!(r.drained);
        assert_eq!(r.terminal, 3);
        #[allow(clippy::cast_precision_loss)]
        let drain = (b.updated_at.0 - 1_000) as f64 / 1000.0;
        assert!((r.drain_secs - drain).abs() < 1e-9);
        assert!((r.throughput_per_s - 3.0 / drain).abs() < 1e-9);
        let text = r.to_string();
        assert!(text.contains("states      Processed 3"), "{text}");
        assert!(text.contains("1.11 per step (10 attempts over 9 steps that ran)"), "{text}");
    }
}
