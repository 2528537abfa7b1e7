//! The one path that performs a committed transition's effects, in the order the protocol
//! requires: notifications first (`Reply`, `Alert`), then work (`Run`, `Dispatch`, `ArmTimer`).
//! A failed send is logged, not retried here: the task is already written with a `CompleteBy`, so
//! the Supervisor recovers anything a lost message would have moved.

use futures::future::join_all;
use tracing::{info, warn};

use crate::bus::{delay_seconds, encode, BusError, Outgoing};
use crate::deps::{Deps, HandlerError};
use crate::ids::Millis;
use crate::messages::{RunMessage, RunReason, SchedulerMessage, VERSION};
use crate::protocol::{Effect, Event, Task};
use crate::transition::{commit, Applied, Committed};

/// Commit a transition, then perform its effects.
pub async fn drive(deps: &Deps, task: Task, event: &Event) -> Result<Applied, HandlerError> {
    let (applied, committed) = commit(deps, task, event).await?;
    if let Some(c) = committed {
        perform(deps, c).await;
    }
    Ok(applied)
}

/// The Scheduler's run message for `task` at `rev`.
pub fn run_message(task: &Task, rev: u64, reason: RunReason) -> SchedulerMessage {
    SchedulerMessage::Run(RunMessage { v: VERSION, task_id: task.task_id.clone(), rev, reason })
}

/// Perform one transition's effects. Returns how many sends failed.
pub async fn perform(deps: &Deps, c: Committed) -> usize {
    let (notes, work): (Vec<_>, Vec<_>) = c.effects.into_iter().partition(Effect::is_notification);
    let mut failed = 0;
    // Within a group the sends go to different queues and need no order: send them together.
    for group in [notes, work] {
        let results = join_all(group.iter().map(|e| perform_one(deps, &c.task, e, c.now))).await;
        for (e, r) in group.iter().zip(results) {
            match r {
                Ok(()) => {
                    if let Effect::Alert(a) = e {
                        info!(task_id = %c.task.task_id, kind = ?a.kind, "operator alert published");
                    }
                }
                Err(err) => {
                    failed += 1;
                    warn!(task_id = %c.task.task_id, effect = e.name(), error = %err, "effect not delivered; the supervisor will recover the task if it stalls");
                }
            }
        }
    }
    failed
}

/// Perform the effects of several transitions (a supervisor sweep's page): each task's
/// notifications and other work as [`perform`] does, and all their run messages to the scheduler
/// queue in batches (SendMessageBatch), after every notification. Returns how many sends failed.
pub async fn perform_many(deps: &Deps, done: Vec<Committed>) -> usize {
    let mut failed = 0;
    let mut runs = Vec::new();
    for c in done {
        let (run, rest): (Vec<_>, Vec<_>) = c.effects.into_iter().partition(|e| matches!(e, Effect::Run { .. }));
        for e in run {
            if let Effect::Run { rev, delay_ms, reason } = e {
                let body = encode(&run_message(&c.task, rev, reason)).expect("run messages are small");
                runs.push(Outgoing::delayed(body, delay_seconds(delay_ms)));
            }
        }
        failed += perform(deps, Committed { task: c.task, effects: rest, now: c.now }).await;
    }
    let n = runs.len();
    if n > 0 {
        if let Err(e) = deps.outbox().to_scheduler_batch(runs).await {
            failed += match e {
                BusError::Batch { failed, .. } => failed,
                _ => n,
            };
            warn!(error = %e, messages = n, "run messages not delivered; the next sweep recovers those tasks again");
        }
    }
    failed
}

async fn perform_one(deps: &Deps, task: &Task, e: &Effect, now: Millis) -> Result<(), BusError> {
    let out = deps.outbox();
    match e {
        Effect::Reply(s) => match &task.reply_to {
            Some(q) => out.reply(q, s).await,
            None => Ok(()),
        },
        Effect::Alert(a) => out.alert(a).await,
        Effect::Run { rev, delay_ms, reason } => {
            out.to_scheduler(&run_message(task, *rev, *reason), delay_seconds(*delay_ms)).await
        }
        Effect::Dispatch(r) => out.dispatch(r).await,
        Effect::ArmTimer(t) => out.arm_timer(t, now, deps.settings.policy.result_grace_ms).await,
    }
}
