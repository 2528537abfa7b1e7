//! Loop steps: a body run once per iteration, while or until a guard holds, at most
//! `max_iterations` times, with an optional timer between iterations.
//!
//! Each iteration is a child task, `{task}~{step}~{i}`, of the body's workflow (inline steps or a
//! named workflow), run by the machinery of workflow steps (`map.rs`): its own idempotency keys
//! (its id is in them), attempts, retries, timer, sweep and compensation. The parent's loop step
//! keeps a [`MapProgress`] (which iterations started, ended, succeeded, were undone: bitmaps stored
//! as runs, a few bytes whatever the count) and the last iteration's output, capped at
//! [`MAX_LOOP_OUTPUT_BYTES`]; so the task's item does not grow with the iterations. The history
//! of each iteration is in its own item.
//!
//! The parent's loop unit, forward:
//! - **start**: a `while` guard false at once ends it (output `null`); otherwise iteration 0.
//! - **an iteration ends `Processed`**: its output (after the loop's `result_selector`) becomes
//!   the loop's, and an inline body's variables the task's; then the guard decides. Done: the step
//!   succeeds. Otherwise, at the bound: `on_bound` (fail, or succeed). Otherwise the next
//!   iteration starts, at once or after `wait_ms` (the loop holds the task with a token and a
//!   timer, as a wait step does; the timer's end starts it).
//! - **an iteration ends otherwise** (its step failed and it undid itself, it was cancelled, or it
//!   is in `Error`): the loop stops and fails (`end_stopped`), which its `on_failure` may handle.
//! - **its deadline** (`timeout_ms`, a day by default): the loop stops and fails.
//!
//! Undone like a map (`start_map_undo`), but one iteration at a time, the newest first
//! (`map::undo_now`): each undoes its own applied steps in reverse order, so every applied step of
//! every iteration is undone once, newest first. A cancel stops the running iteration (which undoes
//! what it applied) or the wait, then the task compensates.
//!
//! No event and no state pair of its own: the parent takes `(Processing, element_ended)`,
//! `(Processing, deadline_expired)`, `(Processing, cancel)` and `(Compensating, element_ended)`.

use serde_json::Value;

use super::{end_stopped, stop, watch_ms};
use crate::condition::Scope;
use crate::ids::TaskId;
use crate::messages::{RunReason, TimerMessage, VERSION};
use crate::protocol::change::{Change, Ended};
use crate::protocol::task::{new_task, Iteration, MapProgress};
use crate::protocol::{Ctx, Effect, EndCause, Policy, ProcessState, Task, Transition};
use crate::workflow::{FailureKind, LoopGuard, LoopSpec, OnBound, DEFAULT_MAP_TIMEOUT_MS, MAX_LOOP_OUTPUT_BYTES};

/// What a loop's guard and its iterations' `parameters` read: the task's data, and the loop's
/// `$.loop.index` and `$.loop.previous`.
struct LoopScope<'a> {
    parent: &'a Task,
    index: u32,
    previous: Option<&'a Value>,
}

impl Scope for LoopScope<'_> {
    fn input(&self) -> &Value {
        &self.parent.input
    }

    fn output(&self, step: &str) -> Option<&Value> {
        Scope::output(self.parent, step)
    }

    fn task_id(&self) -> Option<&str> {
        Some(self.parent.task_id.as_str())
    }

    fn var(&self, name: &str) -> Option<&Value> {
        self.parent.vars.get(name)
    }

    fn loop_index(&self) -> Option<u64> {
        Some(u64::from(self.index))
    }

    fn loop_previous(&self) -> Option<&Value> {
        self.previous
    }
}

/// The loop at step `i`, if that step is one.
pub(crate) fn loop_at(task: &Task, i: usize) -> Option<&LoopSpec> {
    task.workflow.steps.get(i)?.kind.loop_spec()
}

/// Whether another iteration is to run once `ended` iterations have ended (`while` holds, or
/// `until` does not), over the task as it is now (the loop's output is the last iteration's).
fn goes_on(task: &Task, step: usize, spec: &LoopSpec, ended: u32) -> bool {
    let scope = LoopScope { parent: task, index: ended, previous: task.steps[step].output.as_ref() };
    match &spec.guard {
        LoopGuard::While(c) => c.holds(&scope),
        LoopGuard::Until(c) => !c.holds(&scope),
    }
}

/// How often the Supervisor looks at a running iteration: as at a workflow step, about one
/// attempt of the body's slowest step.
fn loop_watch_ms(task: &Task, step: usize, policy: &Policy) -> u64 {
    let spec = loop_at(task, step).expect("a loop");
    spec.body.child.iter().flat_map(|b| b.steps.iter()).map(|s| watch_ms(s, policy)).max().unwrap_or(60_000)
}

/// The task of iteration `i` of the loop at `step`: the body's workflow (an inline body named
/// `{workflow}.{step}` at the parent's version), input the loop's `parameters` filled over the
/// task's data and `$.loop` (the task's input without them), the previous iteration's output, and
/// for an inline body a copy of the task's variables. Created waiting for its claim, as a map's
/// element. The parent's data does not change while an iteration runs, so a spawn sent again
/// makes the same task.
pub(crate) fn iteration_task(parent: &Task, step: usize, i: u32, ctx: &Ctx, policy: &Policy) -> Transition {
    let def = &parent.workflow.steps[step];
    let spec = def.kind.loop_spec().expect("an iteration's step is a loop");
    let mut workflow = spec.body.child.as_deref().cloned().expect("a loaded loop has its body's definition");
    if spec.inline {
        workflow.name = format!("{}.{}", parent.workflow.name, def.name);
        workflow.version = parent.workflow.version;
    }
    let previous = parent.steps[step].output.clone().filter(|_| i > 0);
    let scope = LoopScope { parent, index: i, previous: previous.as_ref() };
    let input = match &def.parameters {
        Some(t) => t.0.fill(&scope),
        None => parent.input.clone(),
    };
    let mut t = new_task(TaskId::child(&parent.task_id, step, i), workflow, input, None, ctx);
    t.called = true;
    t.iteration = Some(Iteration { index: i, previous, shares_vars: spec.inline });
    if spec.inline {
        t.vars.clone_from(&parent.vars);
    }
    let mut c = Change { t, fx: Vec::new(), ctx, policy, error_name: None };
    c.wait_for_claim(ctx.now, RunReason::Start);
    Transition { task: c.t, effects: c.fx, keeps_mark: false }
}

/// An iteration of the loop at `step` ended (counted once: its bit in `p.ended` is set). See the
/// module's comment for what follows.
/// `output` is the iteration's output after the loop's `result_selector`.
pub(crate) fn iteration_ended(
    task: &Task,
    step: usize,
    element: u32,
    end: &Ended,
    output: Value,
    mut p: MapProgress,
    c: &mut Change,
) {
    let def = &task.workflow.steps[step];
    let spec = def.kind.loop_spec().expect("a loop");
    if end.state == ProcessState::Processed {
        p.ok.set(element);
        c.t.steps[step].maybe_applied = true;
        if let (true, Some(vars)) = (spec.inline, end.vars) {
            c.t.vars.clone_from(vars);
        }
    } else {
        p.failed += 1;
        c.t.failure_count += 1;
        if end.state == ProcessState::Error {
            p.errored.set(element);
        }
        if p.stopping.is_none() {
            let why = format!(
                "loop step {}: its iteration {element} (task {}) ended {}{}",
                def.name,
                TaskId::child(&task.task_id, step, element),
                end.state,
                end.reason.map(|r| format!(" ({r})")).unwrap_or_default(),
            );
            stop(&mut p, EndCause::Failed, &why, step, c);
        }
    }
    if let Some(cause) = p.stopping {
        // a cancel or a failure stopped the loop: nothing runs any more, it ends
        let idle = p.running().next().is_none();
        c.t.steps[step].map = Some(p);
        if idle {
            end_stopped(c, cause);
        }
        return;
    }
    c.t.steps[step].map = Some(p);
    let size = crate::messages::json_len(&output);
    if size > MAX_LOOP_OUTPUT_BYTES {
        let why = format!(
            "its iteration {element}'s output is {size} bytes, and a loop keeps at most {MAX_LOOP_OUTPUT_BYTES}: \
             narrow it with the loop's result_selector"
        );
        c.refuse_loop(&why);
        return;
    }
    c.t.steps[step].output = Some(output);
    let ended = element + 1;
    if !goes_on(&c.t, step, spec, ended) {
        c.loop_succeeded();
    } else if ended >= spec.max_iterations {
        match spec.on_bound {
            OnBound::Succeed => c.loop_succeeded(),
            OnBound::Fail => c.refuse_loop(&format!(
                "it ran max_iterations ({}) with its {} still asking for more",
                spec.max_iterations,
                match spec.guard {
                    LoopGuard::While(_) => "while",
                    LoopGuard::Until(_) => "until",
                }
            )),
        }
    } else if let Some(wait) = spec.wait_ms {
        c.loop_waits(wait);
    } else {
        c.next_iteration();
    }
}

impl Change<'_> {
    /// Start a loop step: its first iteration, unless its `while` is false at once (the step then
    /// succeeds with `null`, having run nothing).
    pub(in crate::protocol::change) fn start_loop(&mut self) {
        let i = self.t.step_index;
        if self.begin_or_resume(None) {
            return;
        }
        let def = &self.t.workflow.steps[i];
        let spec = def.kind.loop_spec().expect("a loop").clone();
        let timeout = if def.timeout_ms == 0 { DEFAULT_MAP_TIMEOUT_MS } else { def.timeout_ms };
        self.t.steps[i].map = Some(MapProgress::new(spec.max_iterations, self.ctx.now.plus_ms(timeout)));
        if matches!(spec.guard, LoopGuard::While(_)) && !goes_on(&self.t, i, &spec, 0) {
            self.t.steps[i].output = Some(Value::Null);
            self.loop_succeeded();
            return;
        }
        self.note(ProcessState::Processing);
        self.next_iteration();
    }

    /// Start the loop's next iteration (its watch as `CompleteBy`), unless the loop's deadline has
    /// passed: it then stops and fails.
    pub(crate) fn next_iteration(&mut self) {
        let i = self.t.step_index;
        let mut p = self.t.steps[i].map.clone().expect("a running loop has its progress");
        if self.ctx.now >= p.deadline {
            let def = &self.t.workflow.steps[i];
            let timeout = if def.timeout_ms == 0 { DEFAULT_MAP_TIMEOUT_MS } else { def.timeout_ms };
            let why = format!("loop step {} did not end within {timeout} ms ({} iterations ran)", def.name, p.started);
            stop(&mut p, EndCause::Failed, &why, i, self);
            self.t.steps[i].map = Some(p);
            end_stopped(self, EndCause::Failed);
            return;
        }
        let e = p.started;
        p.started += 1;
        let watch = self.ctx.now.plus_ms(loop_watch_ms(&self.t, i, self.policy));
        self.t.complete_by = Some(watch.min(p.deadline));
        self.t.steps[i].map = Some(p);
        self.fx.push(Effect::Spawn { step: i, elements: vec![(e, Value::Null)], cancel: None });
    }

    /// Hold the loop between two iterations: a token, `CompleteBy` at the wake, and its timer (as
    /// a wait step holds the task). Its deadline starts the next iteration.
    fn loop_waits(&mut self, wait_ms: u64) {
        let token = self.ctx.fresh_token.clone();
        let at = self.ctx.now.plus_ms(wait_ms);
        self.t.lock.locked_by = Some(token.clone());
        self.t.complete_by = Some(at);
        let task_id = self.t.task_id.clone();
        self.fx.push(Effect::ArmTimer(TimerMessage { v: VERSION, task_id, attempt: Some(token), complete_by: at }));
    }

    /// The loop is done: the step succeeds with its last iteration's output.
    fn loop_succeeded(&mut self) {
        self.t.unit_record().succeeded();
        self.t.reason = None;
        self.advance();
    }

    /// The loop fails for good (`why`): its bound reached, or an output too big. Its iterations
    /// that applied are undone when the task compensates (unless its `on_failure` continues).
    fn refuse_loop(&mut self, why: &str) {
        let name = self.t.current_def().name.clone();
        self.t.failure_count += 1;
        self.t.unit_record().refused(why);
        self.give_up(format!("loop step {name} failed permanently: {why}"), FailureKind::Permanent);
    }
}
