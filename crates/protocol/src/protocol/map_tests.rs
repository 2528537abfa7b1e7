//! Map steps, driven purely: a parent and its elements exchange the protocol's own effects
//! through a FIFO "queue", agents answer at once by rule.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde_json::{json, Value};

use super::*;
use crate::ids::TaskId;
use crate::messages::{AlertKind, Phase};
use crate::workflow::{MapSpec, OnFailure, StepDef, Tolerance, WorkflowDef};

fn call(name: &str, comp: Option<&str>) -> StepDef {
    StepDef {
        max_attempts: 2,
        backoff: crate::workflow::Backoff { base_ms: 10, max_ms: 100, multiplier: 2.0 },
        compensation: comp.map(|c| Box::new(StepDef { max_attempts: 2, ..StepDef::call(c, "sim", 1_000) })),
        ..StepDef::call(name, "sim", 1_000)
    }
}

fn map_step(mc: u32, tolerated: Tolerance) -> StepDef {
    StepDef {
        map: Some(MapSpec {
            items: "/input/lines".into(),
            max_concurrency: mc,
            tolerated_failures: tolerated,
            timeout_ms: None,
        }),
        ..call("reserve", Some("release"))
    }
}

fn workflow(map: StepDef) -> WorkflowDef {
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "order".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![call("quote", Some("unquote")), map, call("charge", Some("refund"))],
    }
}

use super::tests::policy;

/// The event a message between tasks carries (as the Scheduler reads it).
fn event_of(m: SchedulerMessage) -> (TaskId, Event) {
    match m {
        SchedulerMessage::ElementEnded(m) => (
            m.task_id,
            Event::ElementEnded {
                step: m.step,
                element: m.element,
                state: m.state,
                reason: m.reason,
                output: m.output,
                vars: m.vars,
            },
        ),
        SchedulerMessage::Undo(m) => (m.task_id, Event::Undo { reason: m.reason }),
        SchedulerMessage::Cancel(m) => (m.task_id, Event::Cancel { reason: m.reason, run: m.run }),
        SchedulerMessage::Join(m) => (m.task_id, Event::Joined { step: m.step, output: Value::Null }),
        other => panic!("not a message between tasks: {other:?}"),
    }
}

/// The parent, its elements, and the messages between them.
struct World {
    tasks: BTreeMap<TaskId, Task>,
    queue: VecDeque<(TaskId, Event)>,
    now: u64,
    /// Elements whose forward step the service refuses.
    refuse: HashSet<u32>,
    /// Parent steps the service refuses.
    refuse_steps: HashSet<&'static str>,
    /// Elements whose compensation the service refuses.
    refuse_undo: HashSet<u32>,
    /// Elements whose every forward attempt fails retryably (a 503).
    flaky: HashSet<u32>,
    /// Parent steps whose every attempt fails retryably.
    flaky_steps: HashSet<&'static str>,
    /// Writes (transitions that applied), per task.
    writes: HashMap<TaskId, u32>,
    /// Compensation calls per task and unit.
    undos: HashMap<(TaskId, String), u32>,
    /// Forward calls that applied, per element task.
    applied: HashMap<TaskId, u32>,
    /// The most elements running (created, not ended) at once.
    most_running: usize,
    /// Join and element-end messages handled, stale or not.
    stale: Vec<String>,
    /// Deliver the queue in this pseudo-random order instead of FIFO (a seed).
    shuffle: Option<u64>,
    /// Deliver every message between tasks twice (SQS is at least once).
    twice: bool,
    /// Operator alerts raised, by task.
    alerts: Vec<(TaskId, AlertKind)>,
    /// Every request an agent took: (task, unit, input), in order.
    requests: Vec<(TaskId, String, Value)>,
    /// At each write of the parent while a map of it runs, the bytes of what changes in its item
    /// (its steps, with the map's progress, and its history; the input never changes, and is stored
    /// apart when large).
    parent_writes: Vec<usize>,
    /// Skip counting the elements running at once (a scan of every task at each start).
    uncounted: bool,
    /// What the service answers to a forward call that applies (else `{"step", "item"}`).
    answer: Option<fn(&AgentRequest) -> Value>,
    /// Timers of tasks that wait (a wait step, a loop between iterations) fire at their time (the
    /// clock jumps there); others are not armed.
    timers: bool,
    /// The idempotency key of every request an agent took, with its task, in order.
    keys: Vec<(TaskId, String)>,
}

impl World {
    fn new(lines: usize, map: StepDef) -> World {
        let lines: Vec<Value> = (0..lines).map(|i| json!({"sku": format!("s{i}")})).collect();
        World::with(workflow(map), json!({"lines": lines}))
    }

    fn with(def: WorkflowDef, input: Value) -> World {
        def.validate().expect("a valid workflow");
        let tr = submit(
            TaskId::try_from("p").unwrap(),
            def,
            input,
            None,
            &Ctx { paused: false, now: Millis(1_000), fresh_token: AttemptToken::fresh(), jitter: 0.5 },
            &policy(),
        );
        let mut w = World {
            tasks: BTreeMap::new(),
            queue: VecDeque::new(),
            now: 1_000,
            refuse: HashSet::new(),
            refuse_steps: HashSet::new(),
            refuse_undo: HashSet::new(),
            flaky: HashSet::new(),
            flaky_steps: HashSet::new(),
            writes: HashMap::new(),
            undos: HashMap::new(),
            applied: HashMap::new(),
            most_running: 0,
            stale: Vec::new(),
            shuffle: None,
            twice: false,
            alerts: Vec::new(),
            requests: Vec::new(),
            parent_writes: Vec::new(),
            uncounted: false,
            answer: None,
            timers: false,
            keys: Vec::new(),
        };
        let id = tr.task.task_id.clone();
        w.tasks.insert(id.clone(), tr.task.clone());
        w.effects(&id, tr.effects);
        w
    }

    fn parent(&self) -> &Task {
        &self.tasks[&TaskId::try_from("p").unwrap()]
    }

    fn ctx(&mut self) -> Ctx {
        self.now += 1;
        Ctx { paused: false, now: Millis(self.now), fresh_token: AttemptToken::fresh(), jitter: 0.5 }
    }

    fn effects(&mut self, from: &TaskId, fx: Vec<Effect>) {
        for e in fx {
            match e {
                Effect::Dispatch(r) => {
                    self.requests.push((r.task_id.clone(), r.step.clone(), r.input.clone()));
                    self.keys.push((r.task_id.clone(), r.idempotency_key.to_string()));
                    let element = r.task_id.parent_of().map(|(_, _, e)| e);
                    let refused = match r.phase {
                        Phase::Forward => {
                            element.is_some_and(|e| self.refuse.contains(&e))
                                || self.refuse_steps.contains(r.step.as_str())
                        }
                        Phase::Compensate => element.is_some_and(|e| self.refuse_undo.contains(&e)),
                    };
                    let flaky = r.phase == Phase::Forward
                        && (element.is_some_and(|e| self.flaky.contains(&e))
                            || self.flaky_steps.contains(r.step.as_str()));
                    let event = if flaky {
                        Event::AgentFailed { attempt: r.attempt, error: "503".into(), retryable: true }
                    } else if refused {
                        Event::AgentFailed {
                            attempt: r.attempt,
                            error: "Shop.OutOfStock: out of stock".into(),
                            retryable: false,
                        }
                    } else {
                        let count = match r.phase {
                            Phase::Forward => self.applied.entry(r.task_id.clone()).or_default(),
                            Phase::Compensate => self.undos.entry((r.task_id.clone(), r.step.clone())).or_default(),
                        };
                        *count += 1;
                        let item = r.input.pointer("/input/item").cloned().unwrap_or(Value::Null);
                        let output = match (self.answer, r.phase) {
                            (Some(answer), Phase::Forward) => answer(&r),
                            _ => json!({"step": r.step, "item": item}),
                        };
                        if r.callback.is_some() {
                            // a callback step: the remote side answers with the attempt's token later
                            let answer = crate::messages::CallbackAnswer::Succeeded { output };
                            Event::Callback { attempt: r.attempt, unit: r.step.clone(), answer }
                        } else {
                            Event::AgentSucceeded { attempt: r.attempt, output }
                        }
                    };
                    self.queue.push_back((r.task_id, event));
                }
                Effect::Run { rev, delay_ms, .. } => {
                    // delivered once its delay has passed (the clock jumps there)
                    self.now += delay_ms;
                    self.queue.push_back((from.clone(), Event::Claim { rev }));
                }
                Effect::Spawn { step, elements, cancel } => {
                    let parent = self.tasks[from].clone();
                    for (e, item) in elements {
                        let ctx = self.ctx();
                        let tr = match &cancel {
                            None => element_task(&parent, step, e, item, &ctx, &policy()),
                            Some(why) => element_tombstone(&parent, step, e, why, &ctx, &policy()),
                        };
                        let id = tr.task.task_id.clone();
                        if cancel.is_some() && self.tasks.get(&id).is_some_and(|t| !t.process_state.is_terminal()) {
                            self.queue.push_back((id, Event::Cancel { reason: "stop".into(), run: None }));
                            continue;
                        }
                        if self.tasks.contains_key(&id) {
                            let again = resend(&self.tasks[&id], Millis(self.now), &policy());
                            self.effects(&id, again.effects);
                            continue;
                        }
                        self.tasks.insert(id.clone(), tr.task);
                        self.effects(&id, tr.effects);
                    }
                    if !self.uncounted {
                        let running = self
                            .tasks
                            .values()
                            .filter(|t| t.task_id.is_child() && !t.process_state.is_terminal())
                            .count();
                        self.most_running = self.most_running.max(running);
                    }
                }
                Effect::Send(m) => {
                    let (id, event) = event_of(m);
                    if self.twice {
                        self.queue.push_back((id.clone(), event.clone()));
                    }
                    self.queue.push_back((id, event));
                }
                Effect::Alert(a) => self.alerts.push((a.task_id, a.kind)),
                Effect::ArmTimer(m) if self.timers && in_wait(&self.tasks[from]) => {
                    self.now = self.now.max(m.complete_by.0);
                    self.queue.push_back((m.task_id, Event::DeadlineExpired));
                }
                Effect::Reply(_) | Effect::ArmTimer(_) | Effect::ReleaseSlot { .. } => {}
            }
        }
    }

    /// The join's reading of the elements' outputs (as the Scheduler does it).
    fn join_output(&self, parent: &Task, step: usize) -> Value {
        let p = parent.steps[step].map.as_ref().unwrap();
        Value::Array(
            (0..p.n)
                .map(|e| {
                    let id = TaskId::child(&parent.task_id, step, e);
                    let t = &self.tasks[&id];
                    if p.ok.get(e) {
                        t.element_output()
                    } else {
                        Value::Null
                    }
                })
                .collect(),
        )
    }

    fn next(&mut self) -> Option<(TaskId, Event)> {
        match self.shuffle.as_mut() {
            Some(seed) if !self.queue.is_empty() => {
                *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let i = usize::try_from(*seed >> 33).unwrap() % self.queue.len();
                self.queue.remove(i)
            }
            _ => self.queue.pop_front(),
        }
    }

    fn step(&mut self, id: &TaskId, event: Event) {
        let task = self.tasks[id].clone();
        let event = match event {
            Event::Joined { step, .. } if task.steps[step].map.as_ref().is_some_and(|p| p.joining) => {
                Event::Joined { step, output: self.join_output(&task, step) }
            }
            other => other,
        };
        let ctx = self.ctx();
        match apply(&task, &event, &ctx, &policy()) {
            Ok(tr) => {
                if !id.is_child() && tr.task.steps.iter().any(|s| s.map.is_some() && s.output.is_none()) {
                    let bytes = serde_json::to_vec(&tr.task.steps).unwrap().len()
                        + serde_json::to_vec(&tr.task.history).unwrap().len();
                    self.parent_writes.push(bytes);
                }
                *self.writes.entry(id.clone()).or_default() += 1;
                self.tasks.insert(id.clone(), tr.task);
                self.effects(id, tr.effects);
            }
            Err(stale) => {
                self.stale.push(format!("{id} {}: {stale}", event.name()));
                let command = matches!(event, Event::Cancel { .. } | Event::Undo { .. });
                if command && id.is_child() {
                    if let Some(notice) = element_notice(&task) {
                        self.effects(id, vec![notice]);
                    }
                }
            }
        }
    }

    fn run(&mut self) {
        let mut n = 0;
        while let Some((id, event)) = self.next() {
            self.step(&id, event);
            n += 1;
            assert!(n < 200_000, "the run does not end");
        }
    }

    fn elements(&self) -> Vec<&Task> {
        self.tasks.values().filter(|t| t.task_id.is_child()).collect()
    }

    fn undone(&self, id: &TaskId) -> u32 {
        self.undos.iter().filter(|((t, _), _)| t == id).map(|(_, n)| *n).sum()
    }
}

#[test]
fn a_map_runs_every_element_at_most_max_concurrency_at_once_and_joins_their_outputs_in_order() {
    for (seed, twice) in [(None, false), (Some(1), false), (Some(7), true), (Some(42), true)] {
        let mut w = World::new(9, map_step(3, Tolerance::None));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        assert_eq!(w.elements().len(), 9);
        assert!(w.elements().iter().all(|t| t.process_state == ProcessState::Processed));
        assert!(w.most_running <= 3, "{seed:?}: {} elements ran at once", w.most_running);
        let out = p.steps[1].output.clone().unwrap();
        let skus: Vec<&str> = out.as_array().unwrap().iter().map(|o| o["item"]["sku"].as_str().unwrap()).collect();
        assert_eq!(skus, (0..9).map(|i| format!("s{i}")).collect::<Vec<_>>(), "element order, whatever the end order");
        assert_eq!(p.steps[2].status, StepStatus::Succeeded, "the step after the map ran");
        assert_eq!(p.outputs()["reserve"], out);
        let bits = p.steps[1].map.as_ref().unwrap();
        assert_eq!((bits.ended.count(), bits.ok.count(), bits.failed), (9, 9, 0));
        assert!(w.applied.iter().filter(|(t, _)| t.is_child()).all(|(_, n)| *n == 1));
    }
}

#[test]
fn an_element_that_fails_past_the_tolerance_stops_the_map_and_every_applied_element_is_undone_once() {
    for (seed, twice) in [(None, false), (Some(3), true), (Some(11), false), (Some(99), true)] {
        let mut w = World::new(8, map_step(3, Tolerance::None));
        w.shuffle = seed;
        w.twice = twice;
        w.refuse.insert(4);
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        let why = "element 4 ended Compensated (step reserve failed permanently: Shop.OutOfStock: out of stock)";
        assert!(p.history.iter().any(|h| h.reason.as_deref().is_some_and(|r| r.contains(why))), "{:?}", p.history);
        let map = p.steps[1].map.as_ref().unwrap();
        if seed.is_none() {
            assert!(map.started < 8, "elements after the stop never started ({} did)", map.started);
        }
        for t in w.elements() {
            let applied = w.applied.get(&t.task_id).copied().unwrap_or(0);
            let (_, _, e) = t.task_id.parent_of().unwrap();
            if e == 4 {
                assert_eq!(applied, 0, "the refused element applied nothing");
                continue;
            }
            // every element that applied is undone exactly once; the others never
            assert_eq!(w.undone(&t.task_id), applied, "{seed:?}: {} applied {applied}", t.task_id);
            assert!(
                matches!(t.process_state, ProcessState::Compensated | ProcessState::Cancelled),
                "{}: {}",
                t.task_id,
                t.process_state
            );
        }
        let parent = TaskId::try_from("p").unwrap();
        assert_eq!(w.undone(&parent), 1, "quote (before the map) is compensated once");
        assert_eq!(w.applied.get(&parent), Some(&1), "charge (after the map) never ran");
    }
}

#[test]
fn failures_within_the_tolerance_leave_null_outputs_and_the_task_processed() {
    let mut w = World::new(10, map_step(4, Tolerance::Percent(20)));
    w.refuse.extend([2, 7]);
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    let out = p.steps[1].output.as_ref().unwrap().as_array().unwrap().clone();
    assert!(out[2].is_null() && out[7].is_null() && out[3]["item"]["sku"] == "s3");
    assert_eq!(p.steps[1].map.as_ref().unwrap().failed, 2);
    assert_eq!(p.failure_count, 2);
    // a third failure is one too many
    assert!(w.alerts.is_empty(), "failures within the tolerance alert nobody: {:?}", w.alerts);
    let mut w = World::new(10, map_step(4, Tolerance::Percent(20)));
    w.refuse.extend([2, 7, 9]);
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Compensated);
    let parent = TaskId::try_from("p").unwrap();
    assert_eq!(w.alerts, vec![(parent, AlertKind::RetriesExhausted)], "one alert, the parent's, when the map stops");
}

#[test]
fn a_step_after_the_map_that_fails_undoes_every_element() {
    let mut w = World::new(5, map_step(2, Tolerance::None));
    w.twice = true;
    w.shuffle = Some(5);
    w.refuse_steps.insert("charge");
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Compensated, "{:?}", p.reason);
    for t in w.elements() {
        assert_eq!(t.process_state, ProcessState::Compensated, "{}", t.task_id);
        assert_eq!(w.undone(&t.task_id), 1);
    }
    assert_eq!(p.steps[1].compensation.as_ref().unwrap().status, CompensationStatus::Done);
}

#[test]
fn a_cancel_mid_map_cancels_the_running_elements_and_undoes_the_finished_ones() {
    let mut w = World::new(6, map_step(2, Tolerance::None));
    // run until two elements have ended
    while let Some((id, e)) = w.next() {
        w.step(&id, e);
        if w.parent().steps[1].map.as_ref().is_some_and(|p| p.ended.count() == 2) {
            break;
        }
    }
    let p = w.parent().clone();
    let cancel = Event::Cancel { reason: "customer".into(), run: None };
    w.step(&p.task_id, cancel);
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Cancelled, "{:?}", p.reason);
    for t in w.elements() {
        let applied = w.applied.get(&t.task_id).copied().unwrap_or(0);
        assert_eq!(w.undone(&t.task_id), applied, "{} applied {applied}", t.task_id);
    }
    assert!(w.elements().len() < 6, "elements after the cancel never started");
}

#[test]
fn an_element_end_counts_once_and_a_command_to_an_ended_element_makes_it_say_so_again() {
    let mut w = World::new(2, map_step(2, Tolerance::None));
    // handle everything but the last element end
    let mut held = None;
    while let Some((id, e)) = w.next() {
        if matches!(e, Event::ElementEnded { element: 1, .. }) && held.is_none() {
            held = Some((id, e));
            continue;
        }
        w.step(&id, e);
    }
    let (pid, ended) = held.unwrap();
    w.step(&pid, ended.clone());
    let joined_at = w.parent().rev;
    w.step(&pid, ended);
    assert!(w.stale.last().unwrap().contains("applied before"), "{:?}", w.stale.last());
    assert_eq!(w.parent().rev, joined_at, "counted once");
    // an undo to an element that ended Processed undoes it; the second is stale and re-sends
    let child = TaskId::child(&pid, 1, 0);
    w.run();
    w.step(&child, Event::Cancel { reason: "late".into(), run: None });
    assert!(
        matches!(w.queue.back(), Some((p, Event::ElementEnded { element: 0, state: ProcessState::Processed, .. })) if *p == pid)
    );
}

#[test]
fn a_map_over_nothing_succeeds_and_one_over_no_array_fails_for_good() {
    let mut w = World::new(0, map_step(2, Tolerance::None));
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Processed);
    assert_eq!(w.parent().steps[1].output, Some(json!([])));
    let bad = StepDef {
        map: Some(MapSpec {
            items: "/input/nope".into(),
            max_concurrency: 2,
            tolerated_failures: Tolerance::None,
            timeout_ms: None,
        }),
        ..call("reserve", Some("release"))
    };
    let mut w = World::new(3, bad);
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Compensated);
    assert!(p.reason.as_deref().unwrap().contains("map.items /input/nope names nothing"), "{:?}", p.reason);
    assert!(w.elements().is_empty());
}

#[test]
fn a_map_past_its_deadline_stops() {
    let mut w = World::new(4, map_step(2, Tolerance::None));
    // the first two elements are created; then nothing answers
    while let Some((id, e)) = w.next() {
        w.step(&id, e);
        if w.parent().steps[1].map.is_some() {
            break;
        }
    }
    w.queue.clear();
    let p = w.parent().clone();
    assert!(p.complete_by.unwrap() < p.steps[1].map.as_ref().unwrap().deadline, "watched before its deadline");
    let late = p.steps[1].map.as_ref().unwrap().deadline.0 + 1;
    let ctx = Ctx { paused: false, now: Millis(late), fresh_token: AttemptToken::fresh(), jitter: 0.5 };
    let tr = apply(&p, &Event::DeadlineExpired, &ctx, &policy()).unwrap();
    let cancels = tr.effects.iter().filter(|e| matches!(e, Effect::Send(SchedulerMessage::Cancel(_)))).count();
    assert_eq!(cancels, 2, "the running elements are cancelled");
    assert!(tr.task.reason.as_deref().unwrap().contains("did not end within 86400000 ms (0 of 4 elements ended)"));
    assert_eq!(tr.task.process_state, ProcessState::Processing, "it waits for the cancelled elements to end");
    let again = resend(&tr.task, Millis(late + 5), &policy());
    assert!(
        matches!(&again.effects[..], [Effect::Spawn { elements, cancel: Some(_), .. }] if elements.len() == 2),
        "owed again: each running element cancelled, or created ended if its creation was lost: {:?}",
        again.effects
    );
}

#[test]
fn an_element_that_cannot_undo_itself_leaves_the_task_in_error() {
    let mut w = World::new(3, map_step(3, Tolerance::None));
    w.refuse_steps.insert("charge");
    w.refuse_undo.insert(1);
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Error, "{:?}", p.reason);
    assert!(p.reason.as_deref().unwrap().contains("element 1 (p~1~1) could not undo"), "{:?}", p.reason);
    let child = TaskId::try_from("p~1~1").unwrap();
    assert_eq!(w.tasks[&child].process_state, ProcessState::Error);
}

#[test]
fn ten_thousand_elements_keep_the_parent_small() {
    let size = |p: &MapProgress| serde_json::to_vec(p).unwrap().len();
    let round_trips = |p: &MapProgress| {
        let back: MapProgress = serde_json::from_slice(&serde_json::to_vec(p).unwrap()).unwrap();
        assert_eq!(&back, p);
    };
    // every element ended and was undone: a run per bitmap
    let mut p = MapProgress::new(10_000, Millis(1));
    p.started = 10_000;
    for e in 0..10_000 {
        p.ended.set(e);
        p.ok.set(e);
        p.undone.set(e);
    }
    assert!(size(&p) < 200, "{} bytes for 10,000 elements", size(&p));
    round_trips(&p);
    assert_eq!(serde_json::from_slice::<MapProgress>(&serde_json::to_vec(&p).unwrap()).unwrap().ok.count(), 10_000);

    // mid-run, ten at once ending out of order, a few failed: still a few runs
    let mut p = MapProgress::new(10_000, Millis(1));
    p.started = 6_010;
    for e in (0..6_000).chain([6_003, 6_007]) {
        p.ended.set(e);
        if e % 1_000 != 17 {
            p.ok.set(e);
        }
    }
    assert!(size(&p) < 300, "{} bytes mid-run", size(&p));
    round_trips(&p);

    // the worst case (every other element): the hex bitmap, as before
    let mut p = MapProgress::new(10_000, Millis(1));
    p.started = 10_000;
    for e in (0..10_000).step_by(2) {
        p.ended.set(e);
        p.ok.set(e);
        p.undone.set(e);
    }
    assert!(size(&p) < 8_000, "{} bytes at worst", size(&p));
    round_trips(&p);
}

/// Point 3's bound: a map over 10,000 elements keeps its parent small at every write (under 4 KB,
/// where the hex bitmaps alone were 5 KB and more by the end), so what the map writes to its parent
/// grows with the elements, not with their square.
#[test]
fn a_ten_thousand_element_map_writes_a_small_parent_at_every_end() {
    // lines as numbers: the world clones the parent at each event, and 10,000 objects would make
    // that the test's cost
    let lines: Vec<u32> = (0..10_000).collect();
    let mut w = World::with(workflow(map_step(10, Tolerance::None)), json!({"lines": lines}));
    w.shuffle = Some(3);
    w.uncounted = true;
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    assert_eq!(p.steps[1].output.as_ref().and_then(Value::as_array).map(Vec::len), Some(10_000));
    let most = *w.parent_writes.iter().max().unwrap();
    assert!(most < 4_096, "a write of the parent carried {most} bytes");
    // one write per element's end, and a few for the parent's own steps
    assert!(w.parent_writes.len() <= 10_000 + 20, "{} writes", w.parent_writes.len());
    let total: usize = w.parent_writes.iter().sum();
    assert!(total < 10_000 * 2_048, "{total} bytes written to the parent in all");
}

#[test]
fn bitmaps_round_trip_in_either_form() {
    use crate::protocol::task::Bits;
    let mut seed: u64 = 7;
    for case in 0..300 {
        let n = (case * 37) % 700 + 1;
        let mut b = Bits::new(n);
        // density from empty to full, in runs and scattered
        for i in 0..u32::try_from(n).unwrap() {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            if (seed >> 33) % 100 < (case % 101) as u64 {
                b.set(i);
            }
        }
        let json = serde_json::to_string(&b).unwrap();
        let back: Bits = serde_json::from_str(&json).unwrap();
        assert_eq!(back, b, "case {case}: {json}");
    }
    // the form items were written in before runs existed still reads
    let old: Bits = serde_json::from_str("\"0f01\"").unwrap();
    assert!((0..4).all(|i| old.get(i)) && old.get(8) && old.count() == 5);
    assert_eq!(serde_json::to_string(&old).unwrap(), "\"0f01\"", "hex when no shorter");
    let runs: Bits = serde_json::from_str("\"r2:0-3,8\"").unwrap();
    assert_eq!(runs, old);
    // a bitmap whose bits were all cleared is left out of the item, and reads back empty: equal
    let mut p = MapProgress::new(5, Millis(1));
    p.errored.set(3);
    p.errored.clear(3);
    let back: MapProgress = serde_json::from_slice(&serde_json::to_vec(&p).unwrap()).unwrap();
    assert_eq!(back, p, "a task read back must be the task written (an own write is recognised by it)");
    assert_eq!(Bits::new(16), Bits::default());
    assert_ne!(Bits::new(16), runs);
    for bad in ["\"r2:9-3\"", "\"r1:8\"", "\"r2:x\"", "\"r99999999:\""] {
        assert!(serde_json::from_str::<Bits>(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_map_of_callback_steps_runs_each_element_through_its_own_token() {
    let step = StepDef {
        kind: crate::workflow::StepKind::Callback { agent: "sim".into(), heartbeat_ms: Some(5_000) },
        timeout_ms: 60_000,
        ..map_step(3, Tolerance::None)
    };
    let mut w = World::new(7, step);
    w.shuffle = Some(9);
    w.run();
    let p = w.parent();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    let out = p.steps[1].output.as_ref().unwrap().as_array().unwrap().clone();
    assert_eq!(out.len(), 7);
    assert!(out.iter().enumerate().all(|(i, o)| o["item"]["sku"] == format!("s{i}")), "{out:?}");
    for t in w.elements() {
        let s = &t.steps[0];
        assert_eq!((s.status, s.issued.len()), (StepStatus::Succeeded, 1), "{}: one token, answered", t.task_id);
        assert_eq!(s.done_by.as_ref(), s.issued.first(), "{}", t.task_id);
    }
    assert!(w.most_running <= 3);
}

#[test]
fn elements_that_use_up_their_attempts_raise_no_alert_of_their_own_their_parent_raises_one() {
    // within the tolerance: no alert at all
    let mut w = World::new(6, map_step(3, Tolerance::Count(1)));
    w.flaky.insert(2);
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Processed, "{:?}", w.parent().reason);
    let e2 = &w.tasks[&TaskId::try_from("p~1~2").unwrap()];
    assert_eq!((e2.process_state, e2.steps[0].attempts), (ProcessState::Compensated, 2), "both attempts used");
    assert!(w.alerts.is_empty(), "{:?}", w.alerts);
    // past it: one alert, the parent's
    let mut w = World::new(6, map_step(3, Tolerance::None));
    w.flaky.extend([1, 2]);
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Compensated);
    let alerts: Vec<&(TaskId, AlertKind)> =
        w.alerts.iter().filter(|(_, k)| *k == AlertKind::RetriesExhausted).collect();
    assert_eq!(alerts, vec![&(TaskId::try_from("p").unwrap(), AlertKind::RetriesExhausted)], "{:?}", w.alerts);
}

// ---- parallel regions (steps with `after`) ------------------------------------------------------

fn after(step: StepDef, names: &[&str]) -> StepDef {
    StepDef { after: Some(names.iter().map(|n| (*n).to_owned()).collect()), ..step }
}

/// quote, then charge and a fraud check at once, then ship once both have succeeded.
fn diamond() -> WorkflowDef {
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "order".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![
            call("quote", Some("unquote")),
            call("charge", Some("refund")),
            after(call("fraud", None), &["quote"]),
            after(call("ship", Some("unship")), &["charge", "fraud"]),
        ],
    }
}

/// a, then b and c at once, d after b (beside c), then e after c and d: a region b, c, d in
/// which d's undo must come before b's.
fn chain_in_region() -> WorkflowDef {
    WorkflowDef {
        concurrency: None,
        result: None,
        name: "deep".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![
            call("a", Some("undo_a")),
            call("b", Some("undo_b")),
            after(call("c", Some("undo_c")), &["a"]),
            after(call("d", Some("undo_d")), &["b"]),
            after(call("e", None), &["c", "d"]),
        ],
    }
}

const ORDERS: [(Option<u64>, bool); 4] = [(None, false), (Some(5), false), (Some(17), true), (Some(23), true)];

#[test]
fn two_branches_run_at_once_as_tasks_of_their_own_and_the_step_after_them_sees_both_outputs() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(diamond(), json!({"order": 1}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        assert!(p.steps.iter().all(|s| s.status == StepStatus::Succeeded), "{:?}", p.steps);
        let outputs = p.outputs();
        for s in ["quote", "charge", "fraud", "ship"] {
            assert_eq!(outputs[s]["step"], s, "{seed:?}: the output of {s} is kept: {outputs}");
        }
        // the branches ran as tasks of their own, each once, with the outputs of what they come after
        let branches: Vec<_> = w.requests.iter().filter(|(t, _, _)| t.is_child()).collect();
        assert_eq!(branches.len(), 2, "{branches:?}");
        for (t, step, input) in &branches {
            assert_eq!(input["input"]["order"], 1, "{t} gets the task's input");
            assert_eq!(input["outputs"]["quote"]["step"], "quote", "{t} ({step}) gets quote's output");
        }
        let ship = w.requests.iter().find(|(_, s, _)| s == "ship").unwrap();
        assert_eq!(ship.2["outputs"]["charge"]["step"], "charge");
        assert_eq!(ship.2["outputs"]["fraud"]["step"], "fraud");
        if seed.is_none() {
            assert_eq!(w.most_running, 2, "charge and fraud ran at once");
        }
        let pid = TaskId::try_from("p").unwrap();
        assert_eq!(w.applied[&pid], 2, "quote and ship, in the task");
        assert!(w.applied.iter().all(|(t, n)| *t == pid || *n == 1), "each branch applied once: {:?}", w.applied);
    }
}

#[test]
fn inside_a_region_a_branch_starts_only_once_the_branches_it_waits_for_succeeded() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(chain_in_region(), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        let order: Vec<&str> = w.requests.iter().map(|(_, s, _)| s.as_str()).collect();
        let at = |s: &str| order.iter().position(|o| *o == s).unwrap();
        assert!(at("b") < at("d") && at("a") < at("c") && at("d") < at("e") && at("c") < at("e"), "{order:?}");
        let d = w.requests.iter().find(|(_, s, _)| s == "d").unwrap();
        assert_eq!(d.2["outputs"]["b"]["step"], "b", "d reads the output of b, a sibling branch");
        assert!(d.2["outputs"].get("c").is_none(), "d does not come after c: {}", d.2["outputs"]);
    }
}

#[test]
fn a_branch_that_fails_for_good_cancels_its_sibling_and_every_step_that_applied_is_undone_once() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(diamond(), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        w.refuse_steps.insert("fraud");
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        assert!(p.reason.as_deref().is_some_and(|r| r.contains("branch fraud ended Compensated")), "{:?}", p.reason);
        assert!(!w.requests.iter().any(|(_, s, _)| s == "ship"), "ship never ran");
        // charge ran as a branch: applied once and refunded once, or cancelled before it applied
        let charge = w.requests.iter().find(|(_, s, _)| s == "charge").map(|(t, _, _)| t.clone());
        if let Some(charge) = charge {
            let applied = w.applied.get(&charge).copied().unwrap_or(0);
            assert_eq!(w.undone(&charge), applied, "{seed:?}: charge applied {applied}");
        }
        assert_eq!(w.undone(&TaskId::try_from("p").unwrap()), 1, "quote undone once");
        assert!(w.elements().iter().all(|t| t.process_state != ProcessState::Processed), "no branch left applied");
    }
}

#[test]
fn a_step_after_a_region_that_fails_undoes_dependent_branches_in_reverse_order_and_independent_ones_at_once() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(chain_in_region(), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        w.refuse_steps.insert("e");
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Compensated, "{seed:?}: {:?}", p.reason);
        let undos: Vec<&str> =
            w.requests.iter().filter(|(_, s, _)| s.starts_with("undo_")).map(|(_, s, _)| s.as_str()).collect();
        let at = |s: &str| undos.iter().position(|o| *o == s).unwrap_or_else(|| panic!("{s} not undone: {undos:?}"));
        assert!(at("undo_d") < at("undo_b"), "{seed:?}: d comes after b, so it is undone first: {undos:?}");
        assert!(at("undo_b") < at("undo_a") && at("undo_c") < at("undo_a"), "{undos:?}");
        for u in ["undo_a", "undo_b", "undo_c", "undo_d"] {
            assert_eq!(undos.iter().filter(|s| **s == u).count(), 1, "{u} once: {undos:?}");
        }
        if seed.is_none() {
            // c and d are independent: d's undo went out with c's, before either ended
            let sent = |s: &str| w.requests.iter().position(|(_, r, _)| r == s).unwrap();
            assert!(sent("undo_c").abs_diff(sent("undo_d")) == 1, "{undos:?}");
        }
        assert!(w.elements().iter().all(|t| t.process_state == ProcessState::Compensated));
    }
}

#[test]
fn a_cancel_while_branches_run_stops_them_and_undoes_what_applied() {
    for (seed, twice) in ORDERS {
        let mut w = World::with(diamond(), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        // run until both branches exist, then cancel the parent
        while w.elements().len() < 2 {
            let (id, e) = w.next().expect("the branches start");
            w.step(&id, e);
        }
        let pid = TaskId::try_from("p").unwrap();
        w.step(&pid, Event::Cancel { reason: "customer".into(), run: None });
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Cancelled, "{seed:?}: {:?}", p.reason);
        for t in w.elements() {
            let applied = w.applied.get(&t.task_id).copied().unwrap_or(0);
            let comp = t.steps[0].name == "charge";
            assert_eq!(w.undone(&t.task_id), if comp { applied } else { 0 }, "{seed:?}: {}", t.task_id);
            assert!(t.process_state != ProcessState::Processed || !comp, "{}", t.task_id);
        }
        assert!(!w.requests.iter().any(|(_, s, _)| s == "ship"));
    }
}

#[test]
fn bad_graphs_are_refused_when_the_workflow_loads() {
    let mut bad = diamond();
    bad.steps[3] = after(call("ship", None), &["charge", "nope"]);
    assert!(bad.validate().unwrap_err().to_string().contains("after names nope"));
    let mut map_beside = diamond();
    map_beside.steps[2] = after(map_step(2, Tolerance::None), &["quote"]);
    map_beside.steps[3] = after(call("ship", None), &["charge", "reserve"]);
    map_beside.validate().expect("a map may run as a branch");
    let mut parked = diamond();
    parked.on_failure = OnFailure::Error;
    assert!(parked.validate().unwrap_err().to_string().contains("on_failure: compensate"));
}

#[test]
fn a_task_may_start_with_branches_and_end_with_them() {
    // a and b start with the task (after: []), c waits for both; d and e both wait only for c
    let def = WorkflowDef {
        concurrency: None,
        result: None,
        name: "edges".into(),
        version: 1,
        description: String::new(),
        on_failure: OnFailure::Compensate,
        steps: vec![
            after(call("a", Some("undo_a")), &[]),
            after(call("b", None), &[]),
            after(call("c", Some("undo_c")), &["a", "b"]),
            after(call("d", Some("undo_d")), &["c"]),
            after(call("e", None), &["c"]),
        ],
    };
    assert_eq!(def.regions(), vec![0..2, 3..5]);
    for (seed, twice) in ORDERS {
        let mut w = World::with(def.clone(), json!({}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        assert_eq!(w.elements().len(), 4, "a, b, d and e ran as branches");
        let c = w.requests.iter().find(|(_, s, _)| s == "c").unwrap();
        assert_eq!(
            (c.2["outputs"]["a"]["step"].clone(), c.2["outputs"]["b"]["step"].clone()),
            (json!("a"), json!("b"))
        );
        assert_eq!(p.outputs().as_object().map(serde_json::Map::len), Some(5), "{}", p.outputs());
    }
    // the last region fails: c and the first region are undone (a's undo after c's)
    let mut w = World::with(def, json!({}));
    w.refuse_steps.insert("e");
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Compensated);
    let undos: Vec<&str> =
        w.requests.iter().filter(|(_, s, _)| s.starts_with("undo_")).map(|(_, s, _)| s.as_str()).collect();
    assert_eq!(undos.first(), Some(&"undo_d"), "{undos:?}");
    let at = |s: &str| undos.iter().position(|o| *o == s).unwrap();
    assert!(at("undo_d") < at("undo_c") && at("undo_c") < at("undo_a"), "{undos:?}");
}

#[test]
fn a_branch_that_cannot_undo_itself_parks_the_task_and_a_resubmit_after_the_mend_undoes_only_what_is_left() {
    let mut w = World::with(diamond(), json!({}));
    w.refuse_steps.insert("ship");
    w.refuse_undo.insert(0); // the charge branch's refund
    w.run();
    let pid = TaskId::try_from("p").unwrap();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Error, "{:?}", p.reason);
    assert!(p.reason.as_deref().unwrap().contains("element 0 (p~1~0) could not undo"), "{:?}", p.reason);
    let charge = TaskId::try_from("p~1~0").unwrap();
    assert_eq!(w.tasks[&charge].process_state, ProcessState::Error);
    assert_eq!(w.undone(&pid), 0, "the region is undone before quote, and it could not be: {:?}", w.undos);
    // the refund service is mended; the operator resubmits the task: only what is left is undone
    w.refuse_undo.clear();
    let applied_before = w.applied.clone();
    w.step(&pid, Event::Resubmit { reason: "refunds work again".into(), run: Some(p.run) });
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Compensated, "{:?}", p.reason);
    assert_eq!(w.applied, applied_before, "no forward step ran again");
    assert_eq!(w.undos.get(&(charge.clone(), "refund".to_owned())), Some(&1), "refunded once: {:?}", w.undos);
    assert_eq!(w.undos.get(&(pid.clone(), "unquote".to_owned())), Some(&1), "quote undone once: {:?}", w.undos);
    assert_eq!(w.tasks[&charge].process_state, ProcessState::Compensated);
}

/// quote, then the charge beside a map that reserves every line (a branch that is a map: its
/// elements are the branch's own, `p~1~1~0~i`), then ship.
fn map_beside_charge() -> WorkflowDef {
    let mut wf = diamond();
    wf.steps[2] = after(map_step(2, Tolerance::None), &["quote"]);
    wf.steps[3] = after(call("ship", Some("unship")), &["charge", "reserve"]);
    wf
}

/// The same with the map first in the region (the region's first step is a map step: the region
/// runs, and the map runs in its branch `p~1~0`).
fn map_first_beside_charge() -> WorkflowDef {
    let mut wf = map_beside_charge();
    wf.steps.swap(1, 2);
    wf.steps[1].after = Some(vec!["quote".into()]);
    wf.steps[2].after = Some(vec!["quote".into()]);
    wf
}

#[test]
fn a_region_whose_first_step_is_a_map_runs_the_map_in_its_branch() {
    let lines: Vec<Value> = (0..4).map(|i| json!({"sku": format!("s{i}")})).collect();
    let mut w = World::with(map_first_beside_charge(), json!({"lines": lines}));
    w.run();
    let p = w.parent().clone();
    assert_eq!(p.process_state, ProcessState::Processed, "{:?}", p.reason);
    assert_eq!(p.outputs()["reserve"].as_array().map(Vec::len), Some(4));
    for i in 0..4 {
        let id = TaskId::try_from(format!("p~1~0~0~{i}")).unwrap();
        assert_eq!(w.tasks[&id].process_state, ProcessState::Processed, "{id}");
    }
    let charge = TaskId::try_from("p~1~1").unwrap();
    assert_eq!(w.tasks[&charge].process_state, ProcessState::Processed);
}

#[test]
fn a_map_runs_as_a_branch_beside_the_charge_and_is_undone_element_by_element() {
    let lines: Vec<Value> = (0..5).map(|i| json!({"sku": format!("s{i}")})).collect();
    for (seed, twice) in ORDERS {
        let mut w = World::with(map_beside_charge(), json!({"lines": lines}));
        w.shuffle = seed;
        w.twice = twice;
        w.run();
        let p = w.parent().clone();
        assert_eq!(p.process_state, ProcessState::Processed, "{seed:?}: {:?}", p.reason);
        let out = p.outputs()["reserve"].as_array().cloned().expect("the map's outputs");
        let skus: Vec<&str> = out.iter().map(|o| o["item"]["sku"].as_str().unwrap()).collect();
        assert_eq!(skus, ["s0", "s1", "s2", "s3", "s4"], "{seed:?}");
        for i in 0..5 {
            let id = TaskId::try_from(format!("p~1~1~0~{i}")).unwrap();
            assert_eq!(w.tasks[&id].process_state, ProcessState::Processed, "{id}");
            assert_eq!(id.parent_of().map(|(p, _, _)| p.to_string()), Some("p~1~1".to_owned()));
        }
        assert!(w.applied.iter().all(|(t, n)| t.as_str() == "p" || *n == 1), "{:?}", w.applied);
    }
    // ship fails: every line released once, the charge refunded once, quote undone once
    let mut w = World::with(map_beside_charge(), json!({"lines": lines}));
    w.shuffle = Some(3);
    w.refuse_steps.insert("ship");
    w.run();
    assert_eq!(w.parent().process_state, ProcessState::Compensated, "{:?}", w.parent().reason);
    for i in 0..5 {
        let id = TaskId::try_from(format!("p~1~1~0~{i}")).unwrap();
        assert_eq!(w.undos.get(&(id.clone(), "release".to_owned())), Some(&1), "{id}: {:?}", w.undos);
    }
    let charge = TaskId::try_from("p~1~0").unwrap();
    assert_eq!(w.undos.get(&(charge, "refund".to_owned())), Some(&1), "{:?}", w.undos);
    assert_eq!(w.undone(&TaskId::try_from("p").unwrap()), 1, "quote once");
    assert!(w.elements().iter().all(|t| t.process_state == ProcessState::Compensated), "nothing left applied");
}

mod decisions;
mod loops;
mod variables;

#[test]
fn a_map_over_a_path_that_names_many_values_runs_one_element_per_value() {
    // the header row left out, and only the paid rows' ids (a Step Functions machine's
    // `ItemsPath: $.rows[1:]`, `$.orders[?@.paid == true].id`), in every delivery order
    for (items, want) in
        [("$.input.lines[1:]", vec!["s1", "s2", "s3"]), ("$.input.lines[?@.paid == true].sku", vec!["s0", "s2"])]
    {
        for seed in [None, Some(3)] {
            let mut map = map_step(2, Tolerance::None);
            map.map.as_mut().unwrap().items = items.into();
            let lines: Vec<Value> = (0..4).map(|i| json!({"sku": format!("s{i}"), "paid": i % 2 == 0})).collect();
            let mut w = World::with(workflow(map), json!({"lines": lines}));
            w.shuffle = seed;
            w.run();
            let p = w.parent();
            assert_eq!(p.process_state, ProcessState::Processed, "{items}: {:?}", p.reason);
            let got: Vec<Value> = w.elements().iter().map(|t| t.input["item"].clone()).collect();
            let got: Vec<&str> = got.iter().map(|i| i.as_str().or_else(|| i["sku"].as_str()).unwrap()).collect();
            assert_eq!(got, want, "{items}");
        }
    }
}
