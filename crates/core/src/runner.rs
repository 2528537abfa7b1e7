//! The local runner: the roles without Lambda. It polls each queue the way Lambda's SQS event
//! source mapping does (long poll, batches of up to ten, a visibility timeout, partial batch
//! failures, delete on success, several batches in flight), calls the very same handlers as the
//! Lambda binaries, and fires the Supervisor's sweep on an interval, as the scheduled rule does.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use futures::future::BoxFuture;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::agents::AgentRuntime;
use crate::roles::{self, Deps, HandlerError, Record};

/// Which handler a queue feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Submitter,
    Scheduler,
    Agent,
    Supervisor,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Submitter, Role::Scheduler, Role::Agent, Role::Supervisor];

    pub fn name(self) -> &'static str {
        match self {
            Role::Submitter => "submitter",
            Role::Scheduler => "scheduler",
            Role::Agent => "agent",
            Role::Supervisor => "supervisor",
        }
    }

    /// The visibility timeouts of the template (6x each function's timeout).
    pub fn default_visibility_seconds(self) -> i32 {
        match self {
            Role::Submitter => 60,
            Role::Scheduler => 90,
            Role::Agent => 720,
            Role::Supervisor => 360,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// How often the Supervisor sweeps (the scheduled rule's rate; 1 minute on AWS).
    pub sweep_every: Duration,
    /// Long-poll wait per ReceiveMessage.
    pub wait_seconds: i32,
    /// Batches in flight per queue (Lambda's concurrency).
    pub concurrency: usize,
    pub roles: Vec<Role>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            sweep_every: Duration::from_secs(5),
            wait_seconds: 2,
            concurrency: 4,
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

/// Call the handler a role's queue feeds; the Lambda binaries do the same.
pub fn handle<'a>(
    role: Role,
    deps: &'a Deps,
    agents: &'a AgentRuntime,
    body: &'a str,
) -> BoxFuture<'a, Result<(), HandlerError>> {
    Box::pin(async move {
        match role {
            Role::Submitter => roles::submit(deps, body).await.map(drop),
            Role::Scheduler => roles::schedule(deps, body).await.map(drop),
            Role::Agent => roles::agent(deps, agents, body).await.map(drop),
            Role::Supervisor => roles::timer(deps, body).await.map(drop),
        }
    })
}

impl Runner {
    pub fn new(deps: Arc<Deps>, agents: Arc<AgentRuntime>, opts: RunnerOptions) -> Self {
        Runner { deps, agents, opts }
    }

    pub fn spawn(self) -> RunnerHandle {
        let (stop, rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for role in self.opts.roles.clone() {
            let url = {
                let r = self.deps.bus.resources();
                match role {
                    Role::Submitter => r.submission_queue_url.clone(),
                    Role::Scheduler => r.scheduler_queue_url.clone(),
                    Role::Agent => r.agent_queue_url.clone(),
                    Role::Supervisor => r.supervisor_queue_url.clone(),
                }
            };
            tasks.push(tokio::spawn(poll(
                role,
                url,
                self.deps.clone(),
                self.agents.clone(),
                self.opts.clone(),
                rx.clone(),
            )));
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
                        _ = tick.tick() => { roles::sweep(&deps).await; }
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
    let sqs = deps.bus.sqs().clone();
    let slots = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let mut in_flight = Vec::new();
    loop {
        if *stop.borrow() {
            break;
        }
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = stop.changed() => break,
        };
        let recv = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(opts.wait_seconds)
            .visibility_timeout(role.default_visibility_seconds())
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send();
        let out = tokio::select! {
            r = recv => r,
            _ = stop.changed() => break,
        };
        let msgs = match out {
            Ok(o) => o.messages.unwrap_or_default(),
            Err(e) => {
                warn!(role = role.name(), error = %aws_sdk_sqs::Error::from(e), "ReceiveMessage failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if msgs.is_empty() {
            continue;
        }
        let (deps, agents, sqs, url) = (deps.clone(), agents.clone(), sqs.clone(), url.clone());
        in_flight.retain(|h: &JoinHandle<()>| !h.is_finished());
        in_flight.push(tokio::spawn(async move {
            let _permit = permit;
            let records: Vec<Record> = msgs
                .iter()
                .map(|m| Record {
                    message_id: m.message_id.clone().unwrap_or_default(),
                    body: m.body.clone().unwrap_or_default(),
                })
                .collect();
            let failed = roles::process_batch(&records, |body| handle(role, &deps, &agents, body)).await;
            let done: Vec<DeleteMessageBatchRequestEntry> = msgs
                .iter()
                .enumerate()
                .filter(|(_, m)| !failed.contains(m.message_id.as_ref().unwrap_or(&String::new())))
                .filter_map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .set_receipt_handle(m.receipt_handle.clone())
                        .build()
                        .ok()
                })
                .collect();
            debug!(role = role.name(), received = msgs.len(), failed = failed.len(), "batch done");
            if !done.is_empty() {
                if let Err(e) = sqs.delete_message_batch().queue_url(&url).set_entries(Some(done)).send().await {
                    warn!(role = role.name(), error = %aws_sdk_sqs::Error::from(e), "DeleteMessageBatch failed; the messages will be delivered again");
                }
            }
        }));
    }
    for h in in_flight {
        let _ = h.await;
    }
}
