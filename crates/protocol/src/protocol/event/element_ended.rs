//! [`Event::ElementEnded`](crate::protocol::Event::ElementEnded): a map's element, a parallel
//! region's branch or a workflow step's child task ended; its parent counts it once.
//!
//! Acts in `Processing`, the map running forward: the next element starts, the map stops once
//! more have failed than it tolerates, or, all ended, the join is sent; a branch's end starts the
//! branches that wait for it, and the last one ends the region; a child's end ends its step. Acts
//! in `Compensating`, the map's compensation: an element was undone, or could not undo what it
//! applied. The table's `(Processing, element_ended)` and `(Compensating, element_ended)`.
//!
//! Stale: a notice of no end, or of an element the map does not have, or for a map that does not
//! run or is not the current unit (`NotCurrentAttempt`), an end counted before (`Duplicate`), and
//! an ended task (`Terminal`, from `admit`).

use serde_json::Value;

use super::agent_result::kept;
use crate::ids::TaskId;
use crate::messages::Phase;
use crate::protocol::change::map::loops;
use crate::protocol::change::map::{
    end_stopped, item_at, join_message, map_running, map_spec, note_skips, ready, region_succeeded, stop, undo_message,
    undo_now,
};
use crate::protocol::change::{Change, Ended};
use crate::protocol::task::MapProgress;
use crate::protocol::{Effect, EndCause, ProcessState, Stale, Task};
use crate::workflow::FailureKind;

/// A child that ended `Processed` without its output, too large to come back (its `reason` says
/// so): it counts as applied, and its step (a loop, a workflow step, a region, a map of workflows)
/// stops and fails for good, undone as any failed step is.
fn too_large_to_come_back(task: &Task, step: usize, element: u32, why: &str, mut p: MapProgress, c: &mut Change) {
    let def = &task.workflow.steps[step];
    p.ok.set(element);
    c.t.failure_count += 1;
    if p.stopping.is_none() {
        let what = format!(
            "step {}: its task {} ended Processed, but {why}",
            def.name,
            TaskId::child(&task.task_id, step, element)
        );
        stop(&mut p, EndCause::Failed, &what, step, c);
    }
    let idle = p.running().next().is_none();
    c.t.steps[step].map = Some(p);
    if idle {
        end_stopped(c, EndCause::Failed);
    }
}

/// An element ended: count it once, then start the next, stop, or join. A parallel region's
/// branch: its output is kept, the branches waiting for it start, and once all have succeeded the
/// region has (no join: each branch brought its output back with its end). A loop's iteration:
/// see `change/loops.rs`.
pub(crate) fn element_ended(task: &Task, step: usize, element: u32, end: &Ended, c: &mut Change) -> Result<(), Stale> {
    let (state, reason, output) = (end.state, end.reason, end.output);
    if !state.is_terminal() {
        return Err(Stale::NotCurrentAttempt);
    }
    let Some(p) = task.steps.get(step).and_then(|s| s.map.as_ref()) else { return Err(Stale::NotCurrentAttempt) };
    if element >= p.n || !map_running(task) || task.unit_step() != step {
        return Err(Stale::NotCurrentAttempt);
    }
    let mut p = p.clone();
    if task.phase() == Phase::Compensate {
        return element_undone(task, step, element, state, p, c);
    }
    if !p.began(element) || !p.ended.set(element) {
        return Err(Stale::Duplicate);
    }
    if let (ProcessState::Processed, Some(r)) = (state, reason) {
        // it succeeded, but its output could not come back (too large: see `ended_notice`): what it
        // applied stays to be undone, and its step fails for good
        too_large_to_come_back(task, step, element, r, p, c);
        return Ok(());
    }
    if let Some(def) = task.workflow.steps.get(step).filter(|d| d.kind.loop_spec().is_some()) {
        let output = kept(def, output.unwrap_or(&Value::Null));
        loops::iteration_ended(task, step, element, end, output, p, c);
        return Ok(());
    }
    let region = task.workflow.region_at(step);
    let def = &task.workflow.steps[step];
    let spec = map_spec(task, step).cloned();
    if state == ProcessState::Processed && def.kind.starts_a_workflow() && spec.is_none() {
        // the child ended: the step succeeds with its result
        p.ok.set(element);
        c.t.steps[step].map = Some(p);
        c.t.steps[step].output = Some(kept(def, output.unwrap_or(&Value::Null)));
        c.t.unit_record().succeeded();
        c.t.reason = None;
        c.advance();
        return Ok(());
    }
    if state == ProcessState::Processed {
        p.ok.set(element);
        if let Some(r) = &region {
            c.t.steps[r.start + element as usize].output = Some(output.cloned().unwrap_or(Value::Null));
        }
    } else {
        p.failed += 1;
        c.t.failure_count += 1;
        if state == ProcessState::Error {
            p.errored.set(element);
        }
        let allowed = spec.as_ref().map_or(0, |s| s.tolerated_failures.allowed(p.n as usize));
        if p.stopping.is_none() && p.failed as usize > allowed {
            let why = match &region {
                Some(r) => format!(
                    "branch {} ended {state}{}",
                    task.workflow.steps[r.start + element as usize].name,
                    reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                ),
                None if def.kind.starts_a_workflow() && spec.is_none() => format!(
                    "workflow step {}: its child task {} ended {state}{}",
                    def.name,
                    TaskId::child(&task.task_id, step, element),
                    reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                ),
                None => format!(
                    "map step {}: element {element} ended {state}{}; {} of {} elements failed for good, {allowed} tolerated",
                    def.name,
                    reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                    p.failed,
                    p.n
                ),
            };
            stop(&mut p, EndCause::Failed, &why, step, c);
        }
    }
    if let Some(r) = region.filter(|_| p.stopping.is_none()) {
        let (next, skipped) = ready(&c.t, &r, &mut p);
        note_skips(c, &r, skipped);
        if next.is_empty() && p.ended.count() == p.n {
            c.t.steps[step].map = Some(p);
            region_succeeded(c, &r);
            return Ok(());
        }
        for e in &next {
            if let Some(b) = p.branches.as_mut() {
                b.set(*e);
            }
            p.started += 1;
        }
        if !next.is_empty() {
            c.fx.push(Effect::Spawn {
                step,
                elements: next.into_iter().map(|e| (e, Value::Null)).collect(),
                cancel: None,
            });
        }
    } else if let (None, Some(spec)) = (p.stopping, spec.as_ref().filter(|_| p.started < p.n)) {
        let next = p.started;
        p.started += 1;
        let item = item_at(&c.t, spec, next);
        c.fx.push(Effect::Spawn { step, elements: vec![(next, item)], cancel: None });
    } else if p.stopping.is_none() && p.ended.count() == p.n {
        p.joining = true;
        let fx = join_message(&c.t, step);
        c.fx.push(fx);
    }
    let done_stopping = p.stopping.filter(|_| p.running().next().is_none());
    c.t.steps[step].map = Some(p);
    if let Some(cause) = done_stopping {
        end_stopped(c, cause);
    }
    Ok(())
}

/// The map step's compensation: an element it asked to undo has ended.
fn element_undone(
    task: &Task,
    step: usize,
    element: u32,
    state: ProcessState,
    mut p: MapProgress,
    c: &mut Change,
) -> Result<(), Stale> {
    if !(p.ok.get(element) || p.errored.get(element)) || p.undone.get(element) {
        return Err(Stale::Duplicate);
    }
    match state {
        // Cancelled: an operator resumed its failed undo with a cancel; undone either way
        ProcessState::Compensated | ProcessState::Cancelled => {
            let before = undo_now(task, step, &p);
            p.undone.set(element);
            let done = p.to_undo().next().is_none();
            // a region's branches that waited for this one's undo (the branches after them) go now
            let next: Vec<Effect> = undo_now(task, step, &p)
                .into_iter()
                .filter(|e| !before.contains(e))
                .map(|e| undo_message(task, step, e))
                .collect();
            c.fx.extend(next);
            c.t.steps[step].map = Some(p);
            if done {
                c.t.unit_record().succeeded();
                c.advance();
            }
            Ok(())
        }
        ProcessState::Error => {
            c.t.failure_count += 1;
            let name = task.current_def().name.clone();
            c.t.unit_record().refused(&format!("element {element} could not be undone"));
            c.give_up(
                format!(
                    "compensation {name} failed: element {element} ({}) could not undo what it applied",
                    TaskId::child(&task.task_id, step, element)
                ),
                FailureKind::Permanent,
            );
            Ok(())
        }
        // Processed: the element has not taken the undo yet (a notice from before it).
        _ => Err(Stale::Duplicate),
    }
}
