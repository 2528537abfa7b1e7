//! `sasctl pause` and `sasctl resume`: an operator's pause of a workflow. One item of the table
//! holds the paused workflows (`pause:workflows`); every function reads it at most every 5 s
//! ([`sas_core::deps::PAUSE_CACHE_MS`]). While its workflow is paused, a task's next forward step is
//! parked: not dispatched, no run message, `Pending` with the reason; steps in flight finish,
//! compensations go on; the parked task's deadline is the Supervisor's look at the pause (every
//! `pause_check_ms`, a minute), never a failure. Resumed, that look sends its run.

use sas_core::deps::Deps;
use sas_core::store::{Paused, Pauses, StoreError};

/// What a pause or a resume found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the workflow is now paused (or resumed).
    Done,
    /// Nothing to do: it was paused already (since then, for that reason), or was not paused.
    Already(Option<Paused>),
}

/// The paused workflows now.
pub async fn list(deps: &Deps) -> Result<Pauses, StoreError> {
    Ok(deps.pauses.load_pauses().await?.unwrap_or_default())
}

/// Pause `workflow` (with why); a conditional write on the pauses item, again if it raced.
pub async fn pause(deps: &Deps, workflow: &str, reason: &str) -> Result<Outcome, StoreError> {
    add(deps, |p| &mut p.workflows, workflow, reason).await
}

/// Pause the concurrency key `key` (its item's id, `key:<scope>:<value>`): the tasks that hold
/// it park their next forward step, as a paused workflow's do; the tasks in its line wait as
/// before (and park once granted).
pub async fn pause_key(deps: &Deps, key: &str, reason: &str) -> Result<Outcome, StoreError> {
    add(deps, |p| &mut p.keys, key, reason).await
}

/// Resume `workflow`.
pub async fn resume(deps: &Deps, workflow: &str) -> Result<Outcome, StoreError> {
    remove(deps, |p| &mut p.workflows, workflow).await
}

/// Resume the concurrency key `key`.
pub async fn resume_key(deps: &Deps, key: &str) -> Result<Outcome, StoreError> {
    remove(deps, |p| &mut p.keys, key).await
}

/// The paused workflows, or the paused keys, of the item.
type PausedOf = fn(&mut Pauses) -> &mut std::collections::BTreeMap<String, Paused>;

async fn add(deps: &Deps, of: PausedOf, name: &str, reason: &str) -> Result<Outcome, StoreError> {
    change(deps, |p| {
        if let Some(was) = of(p).get(name) {
            return Err(Outcome::Already(Some(was.clone())));
        }
        of(p).insert(name.to_owned(), Paused { reason: reason.to_owned(), at: deps.now() });
        Ok(())
    })
    .await
}

async fn remove(deps: &Deps, of: PausedOf, name: &str) -> Result<Outcome, StoreError> {
    change(deps, |p| match of(p).remove(name) {
        Some(_) => Ok(()),
        None => Err(Outcome::Already(None)),
    })
    .await
}

async fn change(deps: &Deps, edit: impl Fn(&mut Pauses) -> Result<(), Outcome>) -> Result<Outcome, StoreError> {
    for _ in 0..8 {
        let read = deps.pauses.load_pauses().await?;
        let mut next = read.clone().unwrap_or_default();
        if let Err(nothing) = edit(&mut next) {
            return Ok(nothing);
        }
        next.ver += 1;
        if deps.pauses.save_pauses(&next, read.as_ref().map(|r| r.ver)).await? {
            return Ok(Outcome::Done);
        }
    }
    Err(StoreError::Backend { op: "PutItem", message: "the paused workflows kept changing".into(), source: None })
}
