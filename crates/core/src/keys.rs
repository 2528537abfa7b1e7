//! Concurrency keys, the shell: each operation reads the key item, applies a decision of
//! [`sas_protocol::keys`] and writes it back conditionally (re-deciding on a lost write), then sends
//! what the decision owes: the run message of each task granted a slot, the cancel of each task a
//! newcomer replaces. See [`sas_protocol::keys`] for the rules.
//!
//! **Cost.** A task of a keyed workflow pays one read and one write of its key item when it is
//! submitted, and one read and one write when it ends (its release, which also grants the slot);
//! a task that waits pays, besides, one write per [`Policy::key_check_ms`](crate::protocol::Policy)
//! while it waits (the Supervisor's check of its key: one read of the key and one of each holder).
//! The key item grows with its line (about 60 bytes a task): a write costs one unit per KB.

use std::collections::BTreeSet;

use tracing::{info, warn};

use crate::deps::{Deps, HandlerError};
use crate::ids::TaskId;
use crate::messages::{CancelMessage, RunMessage, RunReason, SchedulerMessage, VERSION};
use crate::protocol::Task;
use crate::store::StoreError;
use sas_protocol::keys::{self, Decided, Entered, KeyState};
use sas_protocol::workflow::Concurrency;

/// How many times an operation re-decides on a key item that changed under it before it gives
/// up (the message is then retried).
const MAX_ROUNDS: usize = 16;

/// A submission of `task` enters key `key`: what it got. The tasks the decision grants a slot are
/// sent their run message, those it replaces their cancel, before this returns.
pub async fn enter(
    deps: &Deps,
    key: &str,
    task: &TaskId,
    c: &Concurrency,
    priority: u8,
) -> Result<Entered, HandlerError> {
    for _ in 0..MAX_ROUNDS {
        let read = deps.keys.load_key(key).await?;
        let d = keys::enter(read.as_ref(), key, task.as_str(), c, priority, deps.now());
        if let Some(w) = &d.write {
            if !deps.keys.save_key(key, w, read.as_ref().map(|r| r.ver)).await? {
                continue;
            }
        }
        owe(deps, key, &d, task).await?;
        return Ok(d.entered);
    }
    Err(contended())
}

/// Task `task` ended: its slot (or its place in line) of `key` is given back and granted to the
/// first in line, which is sent its run message.
pub async fn release(deps: &Deps, key: &str, task: &TaskId) -> Result<(), HandlerError> {
    for _ in 0..MAX_ROUNDS {
        let Some(read) = deps.keys.load_key(key).await? else { return Ok(()) };
        let Some((write, granted)) = keys::release(&read, task.as_str(), deps.now()) else { return Ok(()) };
        if !deps.keys.save_key(key, &write, Some(read.ver)).await? {
            continue;
        }
        info!(key, task_id = %task, granted = ?granted, "slot of the concurrency key given back");
        start(deps, key, &granted).await?;
        return Ok(());
    }
    Err(contended())
}

/// A task just created waiting: if its key granted it a slot meanwhile (a task of the key ended
/// between its entry and its creation, and the grant's run found no task yet), send its run now
/// rather than at the Supervisor's check. One read of the key item.
pub async fn start_if_granted(deps: &Deps, key: &str, task: &TaskId) -> Result<(), HandlerError> {
    let granted = deps.keys.load_key(key).await?.is_some_and(|k| k.holders.contains_key(task.as_str()));
    if granted {
        start(deps, key, &[task.to_string()]).await?;
    }
    Ok(())
}

/// What the Supervisor's check of a waiting task's key found for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// It waits in line, or holds a slot (and was sent its run message again).
    Listed,
    /// Its key lists it no more (a newcomer replaced it, and the cancel was lost): cancel it.
    Unlisted,
}

/// The Supervisor's check of the key of `waiting` (a task that waits for a slot): the holders that
/// ended or never came to be are removed and their slots granted; every holder that still waits
/// for its run (its grant's run message lost) is sent it again.
pub async fn check(deps: &Deps, waiting: &Task) -> Result<Checked, HandlerError> {
    let Some(slot) = &waiting.slot else { return Ok(Checked::Listed) };
    let key = slot.key.as_str();
    for _ in 0..MAX_ROUNDS {
        let Some(read) = deps.keys.load_key(key).await? else { return Ok(Checked::Unlisted) };
        let now = deps.now();
        let mut gone = BTreeSet::new();
        let mut unstarted = Vec::new();
        for (holder, since) in &read.holders {
            let Ok(id) = TaskId::try_from(holder.as_str()) else {
                gone.insert(holder.clone());
                continue;
            };
            let task = deps.store.get(&id).await?;
            if keys::is_gone(task.as_ref().map(|t| t.process_state), Some(*since), now) {
                gone.insert(holder.clone());
            } else if task.as_ref().is_some_and(Task::waits_for_slot) {
                unstarted.push(holder.clone());
            }
        }
        let (state, granted) = match keys::recover(&read, &gone, now) {
            None => (read, Vec::new()),
            Some((write, granted)) => {
                if !deps.keys.save_key(key, &write, Some(read.ver)).await? {
                    continue;
                }
                warn!(key, removed = ?gone, granted = ?granted, "concurrency key checked: slots of tasks that ended or never came to be taken back");
                (write, granted)
            }
        };
        unstarted.extend(granted);
        start(deps, key, &unstarted).await?;
        let id = waiting.task_id.as_str();
        let listed = state.holders.contains_key(id) || state.waiting.contains_key(id);
        return Ok(if listed { Checked::Listed } else { Checked::Unlisted });
    }
    Err(contended())
}

/// The key item as it is (operators, tests).
pub async fn state(deps: &Deps, key: &str) -> Result<Option<KeyState>, StoreError> {
    deps.keys.load_key(key).await
}

/// Send what a decision owes: runs for the granted, cancels for the replaced (not `task` itself).
async fn owe(deps: &Deps, key: &str, d: &Decided, task: &TaskId) -> Result<(), HandlerError> {
    start(deps, key, &d.granted).await?;
    for victim in &d.cancel {
        let Ok(id) = TaskId::try_from(victim.as_str()) else { continue };
        let why = format!("replaced by task {task} on its concurrency key {key}");
        info!(key, task_id = %id, by = %task, "a newcomer on the key cancels this task");
        let cancel = SchedulerMessage::Cancel(CancelMessage { v: VERSION, task_id: id, reason: why, run: None });
        deps.outbox().to_scheduler(&cancel, 0).await?;
    }
    Ok(())
}

/// Send each granted task its run message (a waiting task's wait is `WaitRev` 1: see
/// [`crate::protocol::submit_waiting`]); a task already running finds it stale.
async fn start(deps: &Deps, key: &str, granted: &[String]) -> Result<(), HandlerError> {
    for g in granted {
        let Ok(id) = TaskId::try_from(g.as_str()) else { continue };
        info!(key, task_id = %id, "slot of the concurrency key granted: run sent");
        let run = SchedulerMessage::Run(RunMessage { v: VERSION, task_id: id, rev: 1, reason: RunReason::Start });
        deps.outbox().to_scheduler(&run, 0).await?;
    }
    Ok(())
}

fn contended() -> HandlerError {
    HandlerError::Contended(u32::try_from(MAX_ROUNDS).unwrap_or(u32::MAX))
}
