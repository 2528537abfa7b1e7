//! Schedules, the I/O around [`sas_protocol::schedules`]: the Supervisor's sweep sends the
//! instants that are due to the submission queue and moves each schedule on ([`fire_due`]);
//! `sasctl schedule` edits the item ([`edit`]) and sends instants now or over a past range
//! ([`send`]); the Submitter reads a schedule's overlap policy ([`overlap_of`]).
//!
//! Order of a firing: the submissions are sent first, then the item is written (conditional on its
//! version). A sweep that dies between the two, or loses the write to another, sends the same
//! instants again at the next sweep: the same task ids, so the same tasks (an idempotent create).
//! An instant is never lost: it is sent before the schedule forgets it.

use serde_json::Value;
use tracing::{error, info, warn};

use crate::bus::{BusError, Outgoing};
use crate::deps::Deps;
use crate::ids::Millis;
use crate::messages::ScheduledRun;
use crate::store::StoreError;
use sas_protocol::schedules::{self, Overlap, Schedule, Schedules};

/// What one sweep did with the schedules.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Fired {
    /// Instants sent.
    pub sent: usize,
    /// Instants missed (older than the catch-up window).
    pub missed: u64,
    pub errors: usize,
}

/// How many times a firing reads again after losing its write to another writer.
const TRIES: usize = 5;

/// Send every instant due now, then record them. Nothing is read but the schedules item (one
/// `GetItem`); nothing is written when nothing is due.
pub async fn fire_due(deps: &Deps) -> Fired {
    let mut fired = Fired::default();
    for _ in 0..TRIES {
        let read = match deps.schedules.load_schedules().await {
            Ok(Some(r)) => r,
            Ok(None) => return fired,
            Err(e) => {
                error!(error = %e, "could not read the schedules; the next sweep tries again");
                fired.errors += 1;
                return fired;
            }
        };
        let now = deps.now();
        let mut next = read.clone();
        let mut out = Vec::new();
        let mut missed = 0;
        for (name, s) in &read.schedules {
            let Some(f) = schedules::due(name, s, now) else { continue };
            if f.missed > 0 {
                warn!(schedule = %name, missed = f.missed, "instants missed by more than the catch-up window: not run");
            }
            missed += f.missed;
            out.extend(f.fire.iter().map(|at| (name.clone(), *at, schedules::submission(name, s, *at, false))));
            if let Some(s) = next.schedules.get_mut(name) {
                s.fired(&f);
            }
        }
        if out.is_empty() && missed == 0 {
            return fired;
        }
        if let Err(e) = send_all(deps, out.iter().map(|(_, _, m)| m)).await {
            error!(error = %e, instants = out.len(), "could not send the schedules' instants; the next sweep sends them");
            fired.errors += 1;
            return fired;
        }
        next.ver = read.ver + 1;
        match deps.schedules.save_schedules(&next, Some(read.ver)).await {
            Ok(true) => {
                for (name, at, _) in &out {
                    info!(schedule = %name, at = %schedules::rfc3339(*at), task_id = %schedules::task_id(name, *at), "schedule fired");
                }
                fired.sent += out.len();
                fired.missed += missed;
                return fired;
            }
            // another writer (an operator, another sweep) came first: what was sent is sent again
            // if still due, as the same tasks
            Ok(false) => {}
            Err(e) => {
                error!(error = %e, "could not record the schedules' firing; the next sweep sends the same instants");
                fired.errors += 1;
                return fired;
            }
        }
    }
    fired
}

async fn send_all<'a>(deps: &Deps, msgs: impl Iterator<Item = &'a Value>) -> Result<(), BusError> {
    let batch: Vec<Outgoing> = msgs.map(|m| Outgoing::new(m.to_string())).collect();
    if batch.is_empty() {
        return Ok(());
    }
    deps.bus.send_batch(&deps.resources.submission_queue_url, batch).await
}

/// Send instants of schedule `name` now (`sasctl schedule trigger` and `backfill`): their task ids
/// are the instants', so an instant already run is not run again.
pub async fn send(deps: &Deps, name: &str, s: &Schedule, instants: &[Millis], backfill: bool) -> Result<(), BusError> {
    let msgs: Vec<Value> = instants.iter().map(|at| schedules::submission(name, s, *at, backfill)).collect();
    for chunk in msgs.chunks(10) {
        send_all(deps, chunk.iter()).await?;
    }
    Ok(())
}

/// Change the schedules item with `change` (given the item as read, and the time), written if no
/// one wrote it in between (else read again). `change`'s error is the operator's mistake: nothing
/// is written.
pub async fn edit<T>(
    deps: &Deps,
    change: impl Fn(&mut Schedules, Millis) -> Result<T, String>,
) -> Result<Result<T, String>, StoreError> {
    loop {
        let read = deps.schedules.load_schedules().await?;
        let mut next = read.clone().unwrap_or_default();
        let out = match change(&mut next, deps.now()) {
            Ok(out) => out,
            Err(why) => return Ok(Err(why)),
        };
        next.ver = read.as_ref().map_or(1, |r| r.ver + 1);
        if deps.schedules.save_schedules(&next, read.as_ref().map(|r| r.ver)).await? {
            return Ok(Ok(out));
        }
    }
}

/// The overlap policy of the run of a schedule: a backfill's tasks wait in line
/// (`buffer_all`); otherwise the schedule's, read from the schedule (a submission never chooses
/// it); `None` when the schedule is gone (its task then runs as under `allow_all`).
pub async fn overlap_of(deps: &Deps, run: &ScheduledRun) -> Result<Option<Overlap>, StoreError> {
    if run.backfill {
        return Ok(Some(Overlap::BufferAll));
    }
    let all = deps.schedules.load_schedules().await?.unwrap_or_default();
    Ok(all.schedules.get(&run.name).map(|s| s.overlap))
}
