//! `element-lost`, `map-undone`, `join-once`: every map's elements (none lost, each succeeded one undone when its
//! task compensates, each join made once) and parallel regions, watched while they run and checked
//! at the end.

use std::collections::{BTreeMap, BTreeSet};

use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{ProcessState, StepStatus};

use crate::sim::{Sim, MAP_CONCURRENCY};

impl Sim {
    /// Map elements running at once, per parent (not counting the undo of one that succeeded),
    /// the loops' iterations running at once, and each map step's joins: kept up to date with
    /// the tasks written since the last look (`changed`), the parents and loops they touch checked.
    pub(super) fn observe_maps(&mut self, changed: &[sas_protocol::protocol::Task]) {
        let mut parents: BTreeSet<String> = BTreeSet::new();
        let mut loops: BTreeSet<String> = BTreeSet::new();
        for t in changed {
            let id = t.task_id.to_string();
            if let Some((parent, step, _)) = t.task_id.parent_of() {
                let parent = parent.to_string();
                // an element that succeeded and is undone runs again, but not as the map's work
                let undo = t.steps.first().is_some_and(|s| s.status == StepStatus::Succeeded);
                // a region's branches (which carry their upstream outputs) are not map elements
                let running = !t.process_state.is_terminal() && !undo && t.upstream.is_none() && !t.called;
                if running && self.map_running.insert(id.clone()) {
                    *self.running_by_parent.entry(parent.clone()).or_default() += 1;
                    parents.insert(parent.clone());
                } else if !running && self.map_running.remove(&id) {
                    if let Some(n) = self.running_by_parent.get_mut(&parent) {
                        *n -= 1;
                        if *n == 0 {
                            self.running_by_parent.remove(&parent);
                        }
                    }
                }
                // `loop-sequential`: a loop's iterations run one after the other (their undos too)
                let key = format!("{parent}#{step}");
                if t.iteration.is_some() && !t.process_state.is_terminal() {
                    if self.iterating.entry(key.clone()).or_default().insert(id.clone()) {
                        loops.insert(key);
                    }
                } else if let Some(ids) = self.iterating.get_mut(&key) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.iterating.remove(&key);
                    }
                }
            }
            for (i, s) in t.steps.iter().enumerate() {
                if s.map.is_none() {
                    continue;
                }
                let key = format!("{}#{i}", t.task_id);
                if s.output.is_some() && self.joined.insert(key.clone()) {
                    *self.joins.entry(key).or_default() += 1;
                }
            }
        }
        for key in loops {
            if let Some(ids) = self.iterating.get(&key).filter(|ids| ids.len() > 1) {
                self.report.violations.push(format!("loop-sequential: {key}: iterations {ids:?} run at once"));
            }
        }
        for parent in parents {
            let n = self.running_by_parent.get(&parent).copied().unwrap_or(0);
            self.report.elements_max = self.report.elements_max.max(n);
            if n > MAP_CONCURRENCY {
                self.report.violations.push(format!(
                    "max-concurrency: {parent}: {n} map elements ran at once; its max_concurrency is {MAP_CONCURRENCY}"
                ));
            }
        }
    }

    /// Every map's elements: none lost (a Processed map has every element Processed, its output
    /// one entry per element), each succeeded element undone when its task compensates, each join
    /// made once.
    pub(super) fn check_maps(&self, tasks: &[sas_protocol::protocol::Task], v: &mut Vec<String>) {
        let by_id: BTreeMap<&str, &sas_protocol::protocol::Task> =
            tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
        for t in tasks {
            for (i, s) in t.steps.iter().enumerate() {
                let Some(p) = &s.map else { continue };
                let key = format!("{}#{i}", t.task_id);
                let elements: Vec<Option<&&sas_protocol::protocol::Task>> =
                    (0..p.n).map(|e| by_id.get(TaskId::child(&t.task_id, i, e).as_str())).collect();
                let existing = elements.iter().filter(|e| e.is_some()).count();
                if existing != p.started as usize {
                    v.push(format!("element-lost: {key}: {} elements started, {existing} exist", p.started));
                }
                if let Some(r) = t.workflow.region_at(i) {
                    self.check_region(t, i, &r, &elements, v);
                    continue;
                }
                if let Some(spec) = t.workflow.steps[i].kind.loop_spec() {
                    self.check_loop(t, i, spec.max_iterations, &elements, v);
                    continue;
                }
                if t.workflow.steps[i].kind.starts_a_workflow() && t.workflow.steps[i].map.is_none() {
                    check_child(t, i, elements.first().copied().flatten().copied(), v);
                    continue;
                }
                match t.process_state {
                    ProcessState::Processed => {
                        let ok = elements
                            .iter()
                            .filter(|e| e.is_some_and(|c| c.process_state == ProcessState::Processed))
                            .count();
                        // over MAX_JOIN_BYTES the output says how many elements' outputs
                        // it points to (their tasks) instead of holding them
                        let out = match s.output.as_ref() {
                            Some(serde_json::Value::Array(a)) => a.len(),
                            Some(o) => o["elements"].as_u64().map_or(0, |n| usize::try_from(n).unwrap_or(0)),
                            None => 0,
                        };
                        if ok != p.n as usize || out != p.n as usize {
                            v.push(format!(
                                "element-lost: {key}: Processed with {ok} of {} elements Processed and {out} outputs",
                                p.n
                            ));
                        }
                    }
                    ProcessState::Compensated | ProcessState::Cancelled => {
                        for c in elements.iter().flatten() {
                            if c.process_state != ProcessState::Compensated
                                && c.process_state != ProcessState::Cancelled
                            {
                                v.push(format!(
                                    "map-undone: {key}: the task ended {} but element {} ended {}",
                                    t.process_state, c.task_id, c.process_state
                                ));
                            }
                        }
                    }
                    _ => {}
                }
                if let Some(n) = self.joins.get(&key).filter(|n| **n > 1) {
                    v.push(format!("join-once: {key}: joined {n} times"));
                }
            }
        }
    }

    /// A loop's iterations, once its task has ended: `loop-bounded` (never more than
    /// `max_iterations`), `loop-done` (a Processed task whose loop succeeded has every iteration
    /// Processed), `loop-undone` (a compensated or cancelled one none left Processed, and each
    /// iteration's undo done after the undos of the iterations after it: the newest first).
    fn check_loop(
        &self,
        t: &sas_protocol::protocol::Task,
        step: usize,
        bound: u32,
        iterations: &[Option<&&sas_protocol::protocol::Task>],
        v: &mut Vec<String>,
    ) {
        let key = format!("{}#{step}", t.task_id);
        let p = t.steps[step].map.as_ref().expect("a loop's progress");
        if p.started > bound || p.n != bound {
            v.push(format!("loop-bounded: {key}: {} iterations started, max_iterations {bound}", p.started));
        }
        if !t.process_state.is_terminal() {
            return;
        }
        let ended: Vec<&sas_protocol::protocol::Task> = iterations.iter().flatten().map(|c| **c).collect();
        match t.process_state {
            ProcessState::Processed if t.steps[step].status == StepStatus::Succeeded => {
                if let Some(c) = ended.iter().find(|c| c.process_state != ProcessState::Processed) {
                    v.push(format!(
                        "loop-done: {key}: Processed, but iteration {} ended {}",
                        c.task_id, c.process_state
                    ));
                }
            }
            ProcessState::Compensated | ProcessState::Cancelled => {
                if let Some(c) = ended.iter().find(|c| c.process_state == ProcessState::Processed) {
                    v.push(format!(
                        "loop-undone: {key}: ended {}, but iteration {} is Processed",
                        t.process_state, c.task_id
                    ));
                }
                // when each iteration's undos landed (the ledger's compensations of its id)
                let undone_at = |c: &sas_protocol::protocol::Task| {
                    let id = format!("{}:", c.task_id);
                    self.ledger
                        .applied
                        .range(id.clone()..)
                        .take_while(|(k, _)| k.starts_with(&id))
                        .filter(|(k, _)| k.contains(":un"))
                        .map(|(_, a)| a.at)
                        .max()
                };
                let at: Vec<(u32, Millis)> =
                    ended.iter().filter_map(|c| Some((c.iteration.as_ref()?.index, undone_at(c)?))).collect();
                for (a, at_a) in &at {
                    for (b, at_b) in &at {
                        if a < b && at_a < at_b {
                            v.push(format!(
                                "loop-undone: {key}: iteration {a} was undone at {at_a}, before iteration {b} (newer) \
                                 at {at_b}"
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// `child-ended`: while a workflow step's child runs, the step has not ended (it is running,
    /// or its task is compensating or cancelling it). A task in `Error` is in an operator's hands,
    /// and so is its child in `Error`: an operator may cancel the child on its own (its compensation
    /// resumes while the parent stays parked).
    pub(super) fn observe_children(&mut self, changed: &[sas_protocol::protocol::Task]) {
        let ids: BTreeSet<&str> = changed.iter().map(|t| t.task_id.as_str()).collect();
        for t in changed {
            // as a parent: each ended workflow step's children
            for (i, s) in t.steps.iter().enumerate() {
                if !t.workflow.steps[i].kind.starts_a_workflow() || !step_ended(t, s) {
                    continue;
                }
                // a map of a workflow step has a child per element
                let n = s.map.as_ref().map_or(1, |p| p.n);
                for e in 0..n {
                    let child = TaskId::child(&t.task_id, i, e);
                    let Some(state) = self.store.peek(&child, |c| c.process_state) else { continue };
                    if !state.is_terminal() {
                        self.child_ended(t, s, &child, state);
                    }
                }
            }
            // as a child whose parent did not change: its parent's step
            let Some((parent, i, _)) = t.task_id.parent_of() else { continue };
            if t.process_state.is_terminal() || ids.contains(parent.as_str()) {
                continue;
            }
            let Some(p) = self.store.task(&parent) else { continue };
            let Some(s) = p.steps.get(i) else { continue };
            if p.workflow.steps[i].kind.starts_a_workflow() && step_ended(&p, s) {
                self.child_ended(&p, s, &t.task_id, t.process_state);
            }
        }
    }

    fn child_ended(
        &mut self,
        t: &sas_protocol::protocol::Task,
        s: &sas_protocol::protocol::StepRecord,
        child: &TaskId,
        state: ProcessState,
    ) {
        self.report.violations.push(format!(
            "child-ended: {}: step {} is {:?} while its child {child} is {state}",
            t.task_id, s.name, s.status
        ));
    }

    /// A parallel region's branches: a Processed task has every branch Processed and every step
    /// of the region its output; a compensated one none left Processed, and each branch undone
    /// after the branches that come after it (`branch-order`).
    pub(super) fn check_region(
        &self,
        t: &sas_protocol::protocol::Task,
        head: usize,
        r: &std::ops::Range<usize>,
        branches: &[Option<&&sas_protocol::protocol::Task>],
        v: &mut Vec<String>,
    ) {
        let key = format!("{}#{head}", t.task_id);
        match t.process_state {
            ProcessState::Processed => {
                // a skipped branch never runs and has no output: it counts for itself
                let skipped = t.steps[r.clone()].iter().filter(|s| s.status == StepStatus::Skipped).count();
                let ok = skipped
                    + branches.iter().filter(|b| b.is_some_and(|c| c.process_state == ProcessState::Processed)).count();
                let outs = skipped + t.steps[r.clone()].iter().filter(|s| s.output.is_some()).count();
                if ok != r.len() || outs != r.len() {
                    v.push(format!(
                        "element-lost: {key}: Processed with {ok} of {} branches Processed and {outs} outputs",
                        r.len()
                    ));
                }
            }
            ProcessState::Compensated | ProcessState::Cancelled => {
                for c in branches.iter().flatten() {
                    if !matches!(c.process_state, ProcessState::Compensated | ProcessState::Cancelled) {
                        v.push(format!(
                            "map-undone: {key}: the task ended {} but branch {} ended {}",
                            t.process_state, c.task_id, c.process_state
                        ));
                    }
                }
                let Ok(graph) = t.workflow.graph() else { return };
                // when a branch's undos landed, first and last: its own, or its elements' when
                // it is a map (`{branch}~{step}~{i}`)
                let undone_at = |e: usize| {
                    let def = &t.workflow.steps[r.start + e];
                    let comp = def.compensation.as_ref()?;
                    let id = TaskId::child(&t.task_id, head, u32::try_from(e).ok()?).to_string();
                    let unit = format!(":{}", comp.name);
                    let ats: Vec<Millis> = self
                        .ledger
                        .applied
                        .range(id.clone()..)
                        .take_while(|(k, _)| k.starts_with(&id))
                        .filter(|(k, _)| k.contains(&unit))
                        .map(|(_, a)| a.at)
                        .collect();
                    Some((def.name.clone(), *ats.iter().min()?, *ats.iter().max()?))
                };
                for a in 0..r.len() {
                    for b in 0..r.len() {
                        if !graph.comes_before(r.start + a, r.start + b) {
                            continue;
                        }
                        if let (Some((an, at_a, _)), Some((bn, _, at_b))) = (undone_at(a), undone_at(b)) {
                            if at_a < at_b {
                                v.push(format!(
                                    "branch-order: {key}: {an} was undone at {at_a}, before {bn} (after it) at {at_b}"
                                ));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// `child-once` / `child-undone`: a workflow step's child exists once it started (its id is the
/// step's: at most one); a Processed task whose step succeeded has its child Processed, one that
/// compensated or was cancelled has no child left Processed (the child undid its own steps: the
/// ledger's `undone` checks each of them).
fn check_child(
    task: &sas_protocol::protocol::Task,
    step: usize,
    child: Option<&sas_protocol::protocol::Task>,
    out: &mut Vec<String>,
) {
    let record = &task.steps[step];
    let id = TaskId::child(&task.task_id, step, 0);
    match (task.process_state, child) {
        (_, None) => {
            out.push(format!(
                "child-once: {}: step {} started, and its child {id} does not exist",
                task.task_id, record.name
            ));
        }
        (ProcessState::Processed, Some(c))
            if record.status == StepStatus::Succeeded && c.process_state != ProcessState::Processed =>
        {
            out.push(format!(
                "child-undone: {}: Processed, but its child {id} ended {}",
                task.task_id, c.process_state
            ));
        }
        (ProcessState::Compensated | ProcessState::Cancelled, Some(c))
            if c.process_state == ProcessState::Processed =>
        {
            out.push(format!(
                "child-undone: {}: ended {}, but its child {id} is still Processed",
                task.task_id, task.process_state
            ));
        }
        _ => {}
    }
}

/// A workflow step that has ended as its task sees it: succeeded or failed, its task neither
/// compensating nor in `Error` (an operator's hands).
fn step_ended(t: &sas_protocol::protocol::Task, s: &sas_protocol::protocol::StepRecord) -> bool {
    matches!(s.status, StepStatus::Succeeded | StepStatus::Failed)
        && !t.is_compensating()
        && t.process_state != ProcessState::Error
}
