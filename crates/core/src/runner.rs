//! The local runner: the roles without Lambda. It polls each queue the way Lambda's SQS event
//! source mapping does (long poll, batches of up to ten, a visibility timeout, partial batch
//! failures, delete on success, several batches in flight), calls the very same handlers as the
//! Lambda binaries, and fires the Supervisor's sweep on an interval, as the scheduled rule does.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::agent::AgentRuntime;
use crate::deps::Deps;
use crate::role::{handle_group, process_batch, Record, Role};
use crate::supervisor;

#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// How often the Supervisor sweeps (the scheduled rule's rate; 1 minute on AWS).
    pub sweep_every: Duration,
    /// Long-poll wait per ReceiveMessage.
    pub wait: Duration,
    /// Batches in flight per queue (Lambda's concurrency).
    pub concurrency: usize,
    /// Like an event source's `MaximumBatchingWindowInSeconds`: after a receive that returned
    /// fewer than ten messages, wait this long and receive once more to fill the batch. Fewer,
    /// fuller batches: fewer receives, deletes and invocations, and sends that share requests.
    /// Not on a FIFO queue (the ends queue), as Lambda has none for FIFO event sources.
    pub batch_window: Duration,
    pub roles: Vec<Role>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            sweep_every: Duration::from_secs(5),
            wait: Duration::from_secs(2),
            concurrency: 4,
            batch_window: Duration::ZERO,
            roles: Role::ALL.to_vec(),
        }
    }
}

pub struct Runner {
    deps: Arc<Deps>,
    agents: Arc<AgentRuntime>,
    opts: RunnerOptions,
}

/// Stops the runner when asked (or when dropped, at the next poll).
pub struct RunnerHandle {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunnerHandle {
    /// Stop polling and wait for the batches in flight to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

impl Runner {
    pub fn new(deps: Arc<Deps>, agents: Arc<AgentRuntime>, opts: RunnerOptions) -> Self {
        Runner { deps, agents, opts }
    }

    pub fn spawn(self) -> RunnerHandle {
        let (stop, rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for role in self.opts.roles.clone() {
            if !role.has_queue(&self.deps.resources) {
                info!(role = role.name(), "no queue for this role in the stack: not polled");
                continue;
            }
            for url in role.queues(&self.deps.resources) {
                tasks.push(tokio::spawn(poll(
                    role,
                    url.to_owned(),
                    self.deps.clone(),
                    self.agents.clone(),
                    self.opts.clone(),
                    rx.clone(),
                )));
            }
        }
        if self.opts.roles.contains(&Role::Supervisor) {
            let deps = self.deps.clone();
            let every = self.opts.sweep_every;
            let mut rx = rx.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => { supervisor::sweep(&deps).await; crate::telemetry::flush_metrics(); }
                        _ = rx.changed() => break,
                    }
                }
            }));
        }
        info!(roles = ?self.opts.roles.iter().map(|r| r.name()).collect::<Vec<_>>(), "local runner started");
        RunnerHandle { stop, tasks }
    }
}

async fn poll(
    role: Role,
    url: String,
    deps: Arc<Deps>,
    agents: Arc<AgentRuntime>,
    opts: RunnerOptions,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let visibility = Duration::from_secs(role.default_visibility_seconds());
    let fifo = crate::messages::QueueUrl::parse(&url).is_ok_and(|q| q.is_fifo());
    let mut in_flight = Vec::new();
    loop {
        if *stop.borrow() {
            break;
        }
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = stop.changed() => break,
        };
        // Not cut short by a stop: the messages a cancelled receive was handed would stay hidden
        // for the whole visibility timeout (12 minutes on the agent queue). A stop waits for the
        // poll (at most `wait`) and the batch it brings.
        let out = deps.bus.receive(&url, 10, opts.wait, visibility).await;
        let mut msgs = match out {
            Ok(m) => m,
            Err(e) => {
                warn!(role = role.name(), error = %e, "ReceiveMessage failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if msgs.is_empty() {
            continue;
        }
        // Not on a FIFO queue: Lambda has no batching window for FIFO event sources.
        if msgs.len() < 10 && !opts.batch_window.is_zero() && !fifo {
            // what arrives within the window joins the batch (one more receive)
            tokio::time::sleep(opts.batch_window).await;
            match deps.bus.receive(&url, 10 - msgs.len(), Duration::ZERO, visibility).await {
                Ok(more) => msgs.extend(more),
                Err(e) => {
                    warn!(role = role.name(), error = %e, "ReceiveMessage (to fill the batch) failed; the batch goes as it is");
                }
            }
        }
        let (deps, agents, url) = (deps.clone(), agents.clone(), url.clone());
        in_flight.retain(|h: &JoinHandle<()>| !h.is_finished());
        in_flight.push(tokio::spawn(async move {
            let _permit = permit;
            let records: Vec<Record> =
                msgs.iter()
                    .map(|m| Record {
                        message_id: m.message_id.clone(),
                        body: m.body.clone(),
                        receive_count: m.receive_count,
                        sent_at: m.sent_at,
                        trace_header: m.trace_header.clone(),
                    })
                    .collect();
            let failed = process_batch(role, &records, |rs| handle_group(&deps, &agents, rs)).await;
            // As a function does after each invocation (nothing without a recorder).
            crate::telemetry::flush_metrics();
            let done: Vec<String> =
                msgs.iter().filter(|m| !failed.contains(&m.message_id)).map(|m| m.receipt.clone()).collect();
            debug!(role = role.name(), received = msgs.len(), failed = failed.len(), "batch done");
            if !done.is_empty() {
                if let Err(e) = deps.bus.delete(&url, done).await {
                    warn!(role = role.name(), error = %e, "DeleteMessageBatch failed; the messages will be delivered again");
                }
            }
        }));
    }
    for h in in_flight {
        let _ = h.await;
    }
}
