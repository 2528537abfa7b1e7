//! Map steps: a step run once per element of an array, each element a task of its own.
//!
//! An element is a one-step task, `{task}~{step}~{i}` (see [`TaskId::child`]): it is created
//! already claimed, like a submission, and runs through the same protocol as any task (its own
//! idempotency key, deadline, attempts, retries, timer, sweep, and its own compensation when one
//! of its attempts may have applied). When it ends, it tells its parent ([`ElementEnded`], sent
//! again whenever the message that ended it comes back). The parent's map step only keeps
//! bitmaps: which elements started, ended, succeeded, were undone (stored as runs of set bits:
//! elements end nearly in order). So a map of 10,000 elements adds a few hundred bytes to the
//! parent, whatever the elements' inputs and outputs.
//!
//! The parent's map unit, forward:
//! - **start**: read the array at `map.items`; create elements `0..max_concurrency`.
//! - **an element ends**: counted once (its bit). While the failures are within
//!   `tolerated_failures`, the next element starts (so at most `max_concurrency` run at once). Past
//!   them the map **stops**: no element starts, the running ones are cancelled (each compensates
//!   what it may have applied), and once every started element has ended the step gives up;
//!   the task compensates, the map's succeeded elements first among the steps to undo.
//! - **all ended**: a join message reads the elements' outputs (in element order) and the step
//!   succeeds with them as its output.
//!
//! The map step's compensation sends an undo to each element that ended `Processed` and waits
//! until every one of them has ended `Compensated` (an element whose compensation fails ends
//! `Error`, and so does the task).
//!
//! Here: the units' start, their elements' tasks, and what the events share; the events are in
//! `event/`: an element's end (`element_ended.rs`), the join (`joined.rs`), a parent's undo of
//! an element (`undo.rs`), and a running map's share of a deadline (`deadline.rs`) and of a
//! cancel (`cancel.rs`).

use serde_json::{json, Value};

use super::Change;

pub(crate) mod loops;
use crate::ids::TaskId;
use crate::messages::{
    CancelMessage, ElementEnded, JoinMessage, Phase, SchedulerMessage, UndoMessage, MAX_ENDED_OUTPUT_BYTES, VERSION,
};
use crate::protocol::task::{new_task, Bits, CompensationStatus, MapProgress, StepRecord, StepStatus};
use crate::protocol::{Ctx, Effect, EndCause, Policy, Task, Transition};
use crate::state::ProcessState;
use crate::workflow::{FailureKind, MapSpec, OnFailure, WorkflowDef, MAX_MAP_ELEMENTS};

/// The map spec of the unit at step `i` when that unit is a map: none for a parallel region, even
/// one whose first step is a map (that map runs in its branch).
pub(crate) fn map_spec(task: &Task, i: usize) -> Option<&MapSpec> {
    let spec = task.workflow.steps.get(i)?.map.as_ref()?;
    task.workflow.region_at(i).is_none().then_some(spec)
}

/// What `pointer` names in the unit's input (`{"input", "outputs"}`), read in place.
fn source<'a>(task: &'a Task, pointer: &str) -> Option<&'a Value> {
    if let Some(rest) = pointer.strip_prefix("/input") {
        return if rest.is_empty() || rest.starts_with('/') { task.input.pointer(rest) } else { None };
    }
    let rest = pointer.strip_prefix("/outputs/")?;
    let (name, rest) = rest.split_once('/').map_or((rest, ""), |(n, r)| (n, r));
    let name = name.replace("~1", "/").replace("~0", "~");
    let output = match task.steps.iter().find(|s| s.name == name && s.result().is_some()) {
        Some(s) => s.output.as_ref()?,
        None => task.upstream.as_ref()?.get(&name)?,
    };
    if rest.is_empty() {
        Some(output)
    } else {
        output.pointer(&format!("/{rest}"))
    }
}

/// What a map's `items` names: a JSON pointer's value read in place, or a path's (which may name
/// many values: their array).
fn items_value<'a>(task: &'a Task, items: &str) -> Option<std::borrow::Cow<'a, Value>> {
    if items.starts_with('$') {
        crate::condition::DataPath::parse_many(items).ok()?.value(task)
    } else {
        source(task, items).map(std::borrow::Cow::Borrowed)
    }
}

/// The array a map step runs over, read from the unit's input (`{"input", "outputs"}`).
pub(crate) fn items(task: &Task, spec: &MapSpec) -> Result<Vec<Value>, String> {
    match items_value(task, &spec.items).as_deref() {
        None => Err(format!("map.items {} names nothing in the task", spec.items)),
        Some(Value::Array(a)) if a.len() > MAX_MAP_ELEMENTS => {
            Err(format!("map.items {} has {} elements; a map takes at most {MAX_MAP_ELEMENTS}", spec.items, a.len()))
        }
        Some(Value::Array(a)) => Ok(a.clone()),
        Some(other) => {
            Err(format!("map.items {} is {}, not an array", spec.items, crate::ids::clip(&other.to_string(), 40)))
        }
    }
}

/// Element `i` of a map's array, read in place (an element's end must not copy the whole array).
pub(crate) fn item_at(task: &Task, spec: &MapSpec, i: u32) -> Value {
    items_value(task, &spec.items).and_then(|a| a.get(i as usize).cloned()).unwrap_or(Value::Null)
}

/// Whether step `j` is undone by a unit of its own when the task compensates: a step with a
/// compensation outside the parallel regions, or a region (at its first step) with a step that
/// has one (its branches undo themselves). A region's other steps are undone with it.
pub(crate) fn undoable(task: &Task, regions: &[std::ops::Range<usize>], j: usize) -> bool {
    let steps = &task.workflow.steps;
    match regions.iter().find(|r| r.contains(&j)) {
        Some(r) if r.start == j => steps[r.clone()].iter().any(|s| s.compensation.is_some()),
        Some(_) => false,
        // a child workflow undoes its own steps, and a loop's iterations theirs
        None => steps[j].compensation.is_some() || steps[j].kind.starts_a_workflow() || undoes_anything(&steps[j]),
    }
}

/// Whether a loop's iterations have anything to undo: some step of its body (or of what the body
/// runs) has a compensation. A loop that only reads costs nothing to compensate.
fn undoes_anything(s: &crate::workflow::StepDef) -> bool {
    let Some(body) = s.kind.loop_spec().and_then(|l| l.body.child.as_deref()) else { return false };
    body.steps.iter().any(|b| b.compensation.is_some() || b.kind.starts_a_workflow() || undoes_anything(b))
}

/// Whether forward step `j`, done, has an effect the task's compensation must undo: a step that
/// succeeded or handled a failure that may have applied ([`crate::protocol::StepRecord::applied`]); a
/// parallel region (at its first step) of which some branch succeeded.
pub(crate) fn applied(task: &Task, regions: &[std::ops::Range<usize>], j: usize) -> bool {
    match regions.iter().find(|r| r.contains(&j)) {
        Some(r) if r.start == j => task.steps[j].map.as_ref().is_some_and(|p| !p.ok.is_empty()),
        Some(_) => false,
        None => task.steps[j].applied(),
    }
}

/// Decide the branches of a parallel region whose waits are over (not started, every step they
/// wait for ended: those before the region have, the region starts after them): each is to start,
/// or is skipped (see [`super::start::skip_reason`]: marked ended in `p`, with why, and the branches
/// waiting for it are decided in turn). Returns those to start, and those skipped with why.
pub(crate) fn ready(
    task: &Task,
    region: &std::ops::Range<usize>,
    p: &mut MapProgress,
) -> (Vec<u32>, Vec<(u32, String)>) {
    let Ok(graph) = task.workflow.graph() else { return (Vec::new(), Vec::new()) };
    let at = |d: usize| u32::try_from(d - region.start).unwrap_or(u32::MAX);
    let (mut start, mut skipped) = (Vec::new(), Vec::new());
    loop {
        let mut changed = false;
        for e in 0..p.n {
            if p.began(e) || p.ended.get(e) || start.contains(&e) {
                continue;
            }
            let s = region.start + e as usize;
            let waits_over =
                graph.after(s).iter().all(|&d| d < region.start || p.ok.get(at(d)) || p.skipped.get(at(d)));
            if !waits_over {
                continue;
            }
            let was_skipped = |name: &str| match task.workflow.steps[region.clone()].iter().position(|x| x.name == name)
            {
                Some(k) => p.skipped.get(u32::try_from(k).unwrap_or(u32::MAX)),
                None => task.skipped(name),
            };
            match super::start::skip_reason(task, s, &was_skipped) {
                Some(why) => skipped.push((e, why)),
                None => start.push(e),
            }
        }
        for (e, _) in &skipped {
            changed |= p.skipped.set(*e);
            p.ended.set(*e);
        }
        if !changed {
            return (start, skipped);
        }
    }
}

/// The region's branches whose undo may start now: a branch is undone after the branches that
/// come after it (dependent compensations in reverse order; independent ones at once).
pub(crate) fn undo_now(task: &Task, step: usize, p: &MapProgress) -> Vec<u32> {
    if loops::loop_at(task, step).is_some() {
        // a loop's iterations one at a time, the newest first
        return p.to_undo().last().into_iter().collect();
    }
    let Some(region) = task.workflow.region_at(step) else { return p.to_undo().collect() };
    let Ok(graph) = task.workflow.graph() else { return Vec::new() };
    let pending: Vec<u32> = p.to_undo().collect();
    pending
        .iter()
        .copied()
        .filter(|&e| {
            !pending.iter().any(|&f| f != e && graph.comes_before(region.start + e as usize, region.start + f as usize))
        })
        .collect()
}

/// The task of one map element: a one-step workflow (the map step without its `map`), input
/// `{"item": …, "index": i}`, waiting for its claim (a run message; if that is lost, the
/// Supervisor sends it again at `CompleteBy`, as for any task waiting for a claim). Created
/// unclaimed, so that nothing is claimed by a write whose sends may be lost for good (the
/// message that made the parent's write may never make it again).
///
/// A branch of the parallel region that starts at `step` is made the same way: its workflow is
/// the region's step `step + element` (without its `after`), its input the parent's, and it gets
/// the outputs of the parent's steps it comes after ([`Task::upstream`]).
pub fn element_task(parent: &Task, step: usize, element: u32, item: Value, ctx: &Ctx, policy: &Policy) -> Transition {
    if loops::loop_at(parent, step).is_some() {
        return loops::iteration_task(parent, step, element, ctx, policy);
    }
    if parent.workflow.steps[step].kind.starts_a_workflow() {
        return child_task(parent, step, element, item, ctx, policy);
    }
    let branch = parent.workflow.region_at(step).map(|r| r.start + element as usize);
    let mut def = parent.workflow.steps[branch.unwrap_or(step)].clone();
    if branch.is_none() {
        def.map = None; // a branch that is a map step runs its map: its elements are its own
        def.on_failure = crate::workflow::StepFailure::Fail; // refused on a map step: kept so
    }
    def.after = None;
    def.when = None; // decided by the parent, once
    def.assign = None; // a map step's, set in the parent once the map has joined
    let workflow = WorkflowDef {
        result: None,
        name: parent.workflow.name.clone(),
        version: parent.workflow.version,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![def],
        concurrency: None,
    };
    let id = TaskId::child(&parent.task_id, step, element);
    let input = match branch {
        Some(_) => parent.input.clone(),
        None => {
            Value::Object(serde_json::Map::from_iter([("item".to_owned(), item), ("index".to_owned(), json!(element))]))
        }
    };
    let mut t = new_task(id, workflow, input, None, ctx);
    if let Some(s) = branch {
        t.upstream = Some(upstream(parent, s));
        t.vars.clone_from(&parent.vars); // read only: a branch's step sets none
    }
    let mut c = Change { t, fx: Vec::new(), ctx, policy, error_name: None };
    c.wait_for_claim(ctx.now, crate::messages::RunReason::Start);
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}

/// The child task of the workflow step at `step`: its workflow is the step's `child` (pinned with
/// the parent's definition), its input the step's `parameters` filled from the parent (the
/// parent's input without them), read again at each spawn (the parent's data does not change
/// while the step runs, so each copy is the same). Created waiting for its claim, as an element.
/// A workflow step that is a map starts one child per element: its input is `{"item", "index"}`,
/// or the step's `parameters` filled from that (as a map's call step reads them in its element).
fn child_task(parent: &Task, step: usize, element: u32, item: Value, ctx: &Ctx, policy: &Policy) -> Transition {
    let def = &parent.workflow.steps[step];
    let workflow = def
        .kind
        .child_workflow()
        .and_then(|w| w.child.as_deref().cloned())
        .expect("a loaded workflow step has its child's definition");
    let id = TaskId::child(&parent.task_id, step, element);
    let mut t = if map_spec(parent, step).is_some() {
        let mut element_input =
            serde_json::Map::from_iter([("item".to_owned(), item), ("index".to_owned(), json!(element))]);
        let input = match &def.parameters {
            Some(p) => {
                // beside the element, the members of the task's input the parameters read (only
                // those: the task's input holds the whole array), and its steps' outputs
                for m in p.0.paths().into_iter().filter_map(crate::condition::DataPath::input_member) {
                    if let (false, Some(v)) = (element_input.contains_key(m), parent.input.get(m)) {
                        element_input.insert(m.to_owned(), v.clone());
                    }
                }
                p.0.fill(&ElementScope { input: Value::Object(element_input), parent })
            }
            None => Value::Object(element_input),
        };
        new_task(id, workflow, input, None, ctx)
    } else {
        let input = match &def.parameters {
            Some(t) => t.0.fill(parent),
            None => parent.input.clone(),
        };
        new_task(id, workflow, input, None, ctx)
    };
    t.called = true;
    let mut c = Change { t, fx: Vec::new(), ctx, policy, error_name: None };
    c.wait_for_claim(ctx.now, crate::messages::RunReason::Start);
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}

/// What the parameters of a map of a workflow step are filled from, for one element: the element
/// (`$.input.item`, `$.input.index`, which hide members of the task's input so named), the
/// members of the task's input they read, and the task's steps' outputs.
struct ElementScope<'a> {
    input: Value,
    parent: &'a Task,
}

impl crate::condition::Scope for ElementScope<'_> {
    fn input(&self) -> &Value {
        &self.input
    }

    fn output(&self, step: &str) -> Option<&Value> {
        crate::condition::Scope::output(self.parent, step)
    }

    fn task_id(&self) -> Option<&str> {
        Some(self.parent.task_id.as_str())
    }
}

/// The outputs of the steps that step `s` comes after (the parent's, and those its branches
/// brought back), by name.
fn upstream(parent: &Task, s: usize) -> Value {
    let Ok(graph) = parent.workflow.graph() else { return json!({}) };
    let mut out = match &parent.upstream {
        Some(Value::Object(up)) => up.clone(),
        _ => serde_json::Map::new(),
    };
    for (j, rec) in parent.steps.iter().enumerate().take(s) {
        if let (true, Some(o)) = (graph.comes_before(j, s), &rec.output) {
            out.insert(rec.name.clone(), o.clone());
        }
    }
    Value::Object(out)
}

/// An element created ended (`Cancelled`, never run) by a map that is stopping: a spawn that was
/// lost (its handler died before it) can no longer start it, and the parent learns it ended.
pub fn element_tombstone(
    parent: &Task,
    step: usize,
    element: u32,
    reason: &str,
    ctx: &Ctx,
    policy: &Policy,
) -> Transition {
    let mut t = element_task(parent, step, element, Value::Null, ctx, policy).task;
    let name = t.steps[0].name.clone();
    t.steps[0] = StepRecord { status: StepStatus::Cancelled, ..StepRecord::new(&name) };
    t.history.clear();
    t.status_seq = 0;
    t.reason = Some(format!("never started: {reason}"));
    let mut c = Change { t, fx: Vec::new(), ctx, policy, error_name: None };
    c.finish(ProcessState::Cancelled);
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}

/// A parallel region has no deadline of its own (each branch has its step's, and a branch starts
/// only once those it waits for end): this is a bound far past any of them.
pub(crate) const REGION_TIMEOUT_MS: u64 = 10 * crate::workflow::MAX_LONG_STEP_MS;

/// How often the Supervisor looks at a running map (its `CompleteBy`): about one attempt of its
/// step (schedule-to-start and timeout), at least a minute, at most an hour. Each look creates any
/// element whose creation was lost and makes each element that ended say so again.
pub(crate) fn watch_ms(def: &crate::workflow::StepDef, policy: &Policy) -> u64 {
    (def.schedule_to_start_ms.unwrap_or(policy.queue_budget_ms) + def.timeout_ms).clamp(60_000, 3_600_000)
}

/// The notice a map element owes its parent once it has ended (none for other tasks).
pub(crate) fn ended_notice(task: &Task) -> Option<Effect> {
    if !task.process_state.is_terminal() {
        return None;
    }
    let (parent, step, element) = task.task_id.parent_of()?;
    let mut output = (task.process_state == ProcessState::Processed)
        .then(|| {
            // a map's element brings its output back with the join, not here
            (task.called || task.upstream.is_some()).then(|| task.element_output())
        })
        .flatten();
    let mut reason = task
        .reason
        .as_deref()
        .filter(|_| task.process_state != ProcessState::Processed)
        .map(|r| crate::ids::clip(r, 300).to_owned());
    // an output too large for the notice: none, and why (its parent fails the step for good)
    let size = output.as_ref().map_or(0, crate::messages::json_len);
    if size > MAX_ENDED_OUTPUT_BYTES {
        output = None;
        reason = Some(format!(
            "its output is {size} bytes, over the {MAX_ENDED_OUTPUT_BYTES} an end may carry back: narrow it (the \
             workflow's result, or a loop body's steps' outputs)"
        ));
    }
    Some(Effect::Send(SchedulerMessage::ElementEnded(ElementEnded {
        v: VERSION,
        task_id: parent,
        step,
        element,
        state: task.process_state,
        reason,
        output,
        vars: task
            .iteration
            .as_ref()
            .filter(|i| i.shares_vars && task.process_state == ProcessState::Processed && !task.vars.is_empty())
            .map(|_| task.vars.clone()),
    })))
}

/// Whether the task's current unit is a map step's (forward or its compensation) that has
/// started and not ended.
pub(crate) fn map_running(task: &Task) -> bool {
    if task.process_state.is_terminal() || task.lock.locked_by.is_some() {
        return false;
    }
    let i = task.unit_step();
    let def = &task.workflow.steps[i];
    if def.map.is_none()
        && task.workflow.region_at(i).is_none()
        && !def.kind.starts_a_workflow()
        && def.kind.loop_spec().is_none()
    {
        return false;
    }
    let step = &task.steps[i];
    match task.phase() {
        Phase::Forward => step.status == StepStatus::Running && step.map.is_some(),
        Phase::Compensate => step.compensation.as_ref().is_some_and(|c| c.status == CompensationStatus::Running),
    }
}

fn cancel_message(task: &Task, step: usize, element: u32, reason: &str) -> Effect {
    Effect::Send(SchedulerMessage::Cancel(CancelMessage {
        v: VERSION,
        task_id: TaskId::child(&task.task_id, step, element),
        reason: reason.to_owned(),
        run: None,
    }))
}

pub(crate) fn undo_message(task: &Task, step: usize, element: u32) -> Effect {
    let what = match task.workflow.region_at(step) {
        Some(r) => format!("its branch {}", task.workflow.steps[r.start + element as usize].name),
        None => format!("its map step {}", task.workflow.steps[step].name),
    };
    Effect::Send(SchedulerMessage::Undo(UndoMessage {
        v: VERSION,
        task_id: TaskId::child(&task.task_id, step, element),
        reason: format!("task {} compensates {what}", task.task_id),
    }))
}

pub(crate) fn join_message(task: &Task, step: usize) -> Effect {
    Effect::Send(SchedulerMessage::Join(JoinMessage { v: VERSION, task_id: task.task_id.clone(), step }))
}

/// What a running map unit's last write sent, sent again (idempotent for their receivers: an
/// element is created once, a command to an element that ended makes it say so again).
pub(crate) fn owed(task: &Task) -> Vec<Effect> {
    let i = task.unit_step();
    let Some(p) = &task.steps[i].map else { return Vec::new() };
    match task.phase() {
        Phase::Forward if p.joining => vec![join_message(task, i)],
        Phase::Forward => {
            let elements: Vec<(u32, Value)> = match map_spec(task, i) {
                Some(spec) => p.running().map(|e| (e, item_at(task, spec, e))).collect(),
                None => p.running().map(|e| (e, Value::Null)).collect(),
            };
            let cancel = p.stopping.map(|_| task.reason.clone().unwrap_or_default());
            vec![Effect::Spawn { step: i, elements, cancel }]
        }
        Phase::Compensate => undo_now(task, i, p).into_iter().map(|e| undo_message(task, i, e)).collect(),
    }
}

/// Record why each of these branches of region `r` was skipped (on its step's record; its
/// status says so once the region ends).
pub(crate) fn note_skips(c: &mut Change, r: &std::ops::Range<usize>, skipped: Vec<(u32, String)>) {
    for (e, why) in skipped {
        c.t.steps[r.start + e as usize].skipped = Some(why);
    }
}

/// Every branch of the parallel region `r` succeeded: so did each of its steps, and the task goes
/// on after the region.
pub(crate) fn region_succeeded(c: &mut Change, r: &std::ops::Range<usize>) {
    let skipped = c.t.steps[r.start].map.as_ref().map(|p| p.skipped.clone()).unwrap_or_default();
    c.t.unit_record().succeeded();
    for j in r.clone() {
        let e = u32::try_from(j - r.start).unwrap_or(u32::MAX);
        c.t.steps[j].status = if skipped.get(e) { StepStatus::Skipped } else { StepStatus::Succeeded };
    }
    c.t.reason = None;
    c.t.step_index = r.end - 1;
    c.advance();
}

/// Stop the map: no element starts any more, the running ones are cancelled.
pub(crate) fn stop(p: &mut MapProgress, cause: EndCause, why: &str, step: usize, c: &mut Change) {
    p.stopping = Some(cause);
    p.joining = false;
    c.t.reason = Some(why.to_owned());
    let cancels: Vec<Effect> = p.running().map(|e| cancel_message(&c.t, step, e, why)).collect();
    c.fx.extend(cancels);
}

/// Every started element of a stopping map has ended: the step gives up. Its succeeded elements
/// are undone by its compensation; an element that could not undo itself (`Error`) leaves the
/// task in `Error` for an operator.
pub(crate) fn end_stopped(c: &mut Change, cause: EndCause) {
    let i = c.t.step_index;
    let p = c.t.steps[i].map.clone().expect("a stopping map has its progress");
    c.t.steps[i].maybe_applied = p.to_undo().next().is_some();
    c.t.steps[i].status = if cause == EndCause::Cancelled { StepStatus::Cancelled } else { StepStatus::Failed };
    let reason = c.t.reason.clone().unwrap_or_default();
    if let Some(e) = p.errored.ones(p.n).next() {
        c.t.reason = Some(format!(
            "{reason}; {} element(s) could not undo what they applied and are in Error (the first: task {}): \
             resubmit this task once they are mended, or cancel it (their compensation is resumed)",
            p.errored.count(),
            TaskId::child(&c.t.task_id, i, e)
        ));
        c.finish(ProcessState::Error);
        return;
    }
    match cause {
        EndCause::Failed => {
            // the one alert for the elements that failed (they raise none of their own), unless
            // the step handles its failure
            if !c.handles(FailureKind::Permanent) {
                let alert = c.alert(crate::messages::AlertKind::RetriesExhausted, &reason);
                c.fx.push(Effect::Alert(alert));
            }
            c.give_up(reason, FailureKind::Permanent);
        }
        EndCause::Cancelled => c.begin_compensation(EndCause::Cancelled, reason),
    }
}

impl Change<'_> {
    /// Start a map step: read its array, create its first elements. Without a spec, start the
    /// parallel region that begins at the current step: create the branches that wait for no
    /// other branch.
    pub(super) fn start_map(&mut self, spec: Option<&MapSpec>) {
        let i = self.t.step_index;
        let name = self.t.workflow.steps[i].name.clone();
        if self.begin_or_resume(spec) {
            return;
        }
        let Some(spec) = spec else {
            let Some(region) = self.t.workflow.region_at(i) else { return };
            let n = u32::try_from(region.len()).expect("a region has few steps");
            let mut p = MapProgress::new(n, self.ctx.now.plus_ms(REGION_TIMEOUT_MS));
            p.branches = Some(Bits::new(n as usize));
            let (first, skipped) = ready(&self.t, &region, &mut p);
            note_skips(self, &region, skipped);
            for e in &first {
                p.branches.as_mut().expect("set above").set(*e);
            }
            p.started = u32::try_from(first.len()).expect("a region has few steps");
            let all_skipped = first.is_empty();
            self.t.steps[i].map = Some(p);
            if all_skipped {
                region_succeeded(self, &region);
                return;
            }
            let watch =
                region.clone().map(|j| watch_ms(&self.t.workflow.steps[j], self.policy)).max().unwrap_or(60_000);
            self.t.complete_by = Some(self.ctx.now.plus_ms(watch));
            self.note(ProcessState::Processing);
            self.fx.push(Effect::Spawn {
                step: i,
                elements: first.into_iter().map(|e| (e, Value::Null)).collect(),
                cancel: None,
            });
            return;
        };
        let all = match items(&self.t, spec) {
            Ok(all) => all,
            Err(why) => {
                self.t.failure_count += 1;
                self.t.unit_record().refused(&why);
                self.give_up(format!("step {name} failed permanently: {why}"), FailureKind::Permanent);
                return;
            }
        };
        if all.is_empty() {
            self.t.steps[i].output = Some(Value::Array(Vec::new()));
            self.t.unit_record().succeeded();
            self.advance();
            return;
        }
        let n = u32::try_from(all.len()).expect("at most MAX_MAP_ELEMENTS");
        let deadline = self.ctx.now.plus_ms(spec.timeout_ms());
        let mut p = MapProgress::new(n, deadline);
        p.started = n.min(spec.max_concurrency);
        let elements = all.into_iter().take(p.started as usize).zip(0..).map(|(v, e)| (e, v)).collect();
        self.t.steps[i].map = Some(p);
        let watch = self.ctx.now.plus_ms(watch_ms(&self.t.workflow.steps[i], self.policy));
        self.t.complete_by = Some(watch.min(deadline));
        self.note(ProcessState::Processing);
        self.fx.push(Effect::Spawn { step: i, elements, cancel: None });
    }

    /// The start every unit that runs as tasks of its own shares (a map, a region, a workflow
    /// step): no wait, no lock, an attempt counted. When it ran before (an operator resubmits the
    /// task after it stopped), it goes on stopping from where it was: `true`, nothing left to do.
    pub(super) fn begin_or_resume(&mut self, spec: Option<&MapSpec>) -> bool {
        let i = self.t.step_index;
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.lock.awaits = None;
        self.unlock();
        self.t.unit_record().begin_attempt();
        match self.t.steps[i].map.clone() {
            Some(p) => {
                self.resume_map(p, spec);
                true
            }
            None => false,
        }
    }

    /// Start a workflow step: create its child task (one element, whose end is the step's).
    pub(super) fn start_child(&mut self) {
        let i = self.t.step_index;
        if self.begin_or_resume(None) {
            return;
        }
        let def = &self.t.workflow.steps[i];
        let timeout = if def.timeout_ms == 0 { crate::workflow::DEFAULT_MAP_TIMEOUT_MS } else { def.timeout_ms };
        let deadline = self.ctx.now.plus_ms(timeout);
        let mut p = MapProgress::new(1, deadline);
        p.started = 1;
        self.t.steps[i].map = Some(p);
        let watch = self.ctx.now.plus_ms(watch_ms(def, self.policy));
        self.t.complete_by = Some(watch.min(deadline));
        self.note(ProcessState::Processing);
        self.fx.push(Effect::Spawn { step: i, elements: vec![(0, Value::Null)], cancel: None });
    }

    /// An operator resubmits a task whose map stopped (some element could not undo itself): its
    /// elements are not run again; the ends of those that did not succeed are read again (a
    /// mended element now says `Compensated`), and the map goes on stopping from there.
    fn resume_map(&mut self, mut p: MapProgress, spec: Option<&MapSpec>) {
        let i = self.t.step_index;
        for e in 0..p.n {
            if p.began(e) && p.ended.get(e) && !p.ok.get(e) {
                p.ended.clear(e);
                p.errored.clear(e);
            }
        }
        p.failed = 0;
        p.stopping.get_or_insert(EndCause::Failed);
        let why = self.t.reason.clone().unwrap_or_default();
        let elements: Vec<(u32, Value)> =
            p.running().map(|e| (e, spec.map_or(Value::Null, |s| item_at(&self.t, s, e)))).collect();
        self.t.steps[i].map = Some(p);
        self.t.complete_by = Some(self.ctx.now.plus_ms(watch_ms(&self.t.workflow.steps[i], self.policy)));
        self.note(ProcessState::Processing);
        if elements.is_empty() {
            end_stopped(self, EndCause::Failed);
        } else {
            self.fx.push(Effect::Spawn { step: i, elements, cancel: Some(why) });
        }
    }

    /// Start a map step's compensation: undo each element that succeeded.
    pub(super) fn start_map_undo(&mut self) {
        let i = self.t.unit_step();
        self.t.claim.not_before = None;
        self.t.claim.restarts = 0;
        self.t.lock.awaits = None;
        self.unlock();
        self.t.unit_record().begin_attempt();
        if let (Some(r), Some(p)) = (self.t.workflow.region_at(i), self.t.steps[i].map.as_mut()) {
            // a branch whose step has no compensation has nothing to undo
            for e in 0..p.n {
                let undoes = self.t.workflow.steps[r.start + e as usize].compensation.is_some();
                if p.ok.get(e) && !p.errored.get(e) && !undoes {
                    p.undone.set(e);
                }
            }
        }
        let undos: Vec<Effect> = match &self.t.steps[i].map {
            Some(p) => undo_now(&self.t, i, p).into_iter().map(|e| undo_message(&self.t, i, e)).collect(),
            None => Vec::new(),
        };
        if undos.is_empty() {
            self.t.unit_record().succeeded();
            self.advance();
            return;
        }
        self.t.complete_by = Some(self.ctx.now.plus_ms(watch_ms(&self.t.workflow.steps[i], self.policy)));
        self.note(ProcessState::Compensating);
        self.fx.extend(undos);
    }
}
