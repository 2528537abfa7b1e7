//! The walk over a state machine's states: each becomes steps of one workflow (or nothing, for a
//! `Pass` or a `Choice`, whose effect is on the data and the guards), in an order where every state
//! comes after the states that lead to it.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::data::{choice_rule, lookup, parse_path, path_text, Cond, Seg, Sym, Vars};
use super::Refusal;

/// A state machine translated: one workflow, the agents its steps name, and what differs.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The workflow, as an entry of a workflows file.
    pub workflow: Value,
    /// The workflows it runs: a Map whose processor is more than one task becomes a workflow of
    /// its own, run once per element (a map of a workflow step). Entries of a workflows file too.
    pub children: Vec<Value>,
    /// The agents, as the `agents` of an agents file.
    pub agents: Map<String, Value>,
    /// What the translation chose, and how the workflow differs from the state machine.
    pub notes: Vec<String>,
}

/// Why a state cannot be translated: each field that cannot be, and why.
#[derive(Debug)]
struct Blocked(Vec<(String, String)>);

impl From<(String, String)> for Blocked {
    fn from(e: (String, String)) -> Self {
        Blocked(vec![e])
    }
}

/// The value, or `None` with the field's error added to `errs` (a state's fields are checked
/// each on its own, so that every one that cannot be translated is named).
fn kept<T>(r: Result<T, (String, String)>, errs: &mut Vec<(String, String)>) -> Option<T> {
    r.map_err(|e| errs.push(e)).ok()
}

/// The longest a call step may take here (the project's limit on a call).
const CALL_LIMIT_S: u64 = sas_protocol::workflow::MAX_STEP_TIMEOUT_MS / 1000;
/// A call step's timeout when the state gives none (Step Functions has none by default).
const DEFAULT_CALL_TIMEOUT_MS: u64 = 60_000;
/// How often a job run to completion is asked for its status (more when its timeout is long).
const JOB_POLL_MS: u64 = 10_000;
/// A callback step's timeout when the state gives none.
const DEFAULT_CALLBACK_TIMEOUT_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// How a translation chooses what Step Functions does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The `max_iterations` of every loop translated (Step Functions bounds none): 1 to
    /// [`sas_protocol::workflow::MAX_LOOP_ITERATIONS`]; [`LOOP_BOUND`] unless said.
    pub loop_bound: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options { loop_bound: LOOP_BOUND }
    }
}

/// Translate one state machine definition into the workflow `name`, version 1, with the default
/// [`Options`].
pub fn import(name: &str, def: &Value) -> Result<Imported, Vec<Refusal>> {
    import_with(name, def, Options::default())
}

/// Translate one state machine definition into the workflow `name`, version 1.
pub fn import_with(name: &str, def: &Value, options: Options) -> Result<Imported, Vec<Refusal>> {
    let mut cx = Cx { workflow: name.to_owned(), options, ..Cx::default() };
    let refuse_top =
        |field: &str, reason: String| vec![Refusal { state: "(state machine)".into(), field: field.into(), reason }];
    if !def.is_object() {
        return Err(refuse_top("definition", "a state machine is an object".into()));
    }
    // JSONata states become their JSONPath equivalent (or are refused, each field named)
    let (rewritten, notes) = super::jsonata::rewrite(def)?;
    cx.notes.extend(notes);
    let text = rewritten.to_string();
    // a States.UUID() is named by the task and its place
    let named = name_uuids(&rewritten);
    if named != rewritten {
        cx.notes.push(
            "States.UUID() is a UUID named by the task's id and the state (States.UUID($.task.id, '<state>#<n>')): \
             the same on every attempt and every read, another in every task, loop iteration and map element"
                .into(),
        );
    }
    let def = &named;
    let Value::Object(top) = def else { return Err(refuse_top("definition", "a state machine is an object".into())) };
    let (Some(Value::Object(states)), Some(Value::String(start))) = (top.get("States"), top.get("StartAt")) else {
        return Err(refuse_top("States", "a state machine has StartAt and States".into()));
    };
    for field in ["Id", "Name"] {
        if text.contains(&format!("$$.Execution.{field}")) {
            cx.notes.push(format!(
                "$$.Execution.{field} is the task's id here ($.task.root: the task submitted, in its loops' \
                 iterations, maps' elements and branches too){}",
                if field == "Id" { ", not an execution's ARN" } else { "" }
            ));
        }
    }
    if let Some(t) = top.get("TimeoutSeconds").and_then(Value::as_u64) {
        cx.notes.push(format!(
            "the state machine's TimeoutSeconds ({t} s) has no equivalent: each step is bounded by its own timeout"
        ));
    }
    let entry = Arrival {
        full: Cond::True,
        local: Cond::True,
        doc: Sym::Ref("$.input".into()),
        after: BTreeSet::new(),
        from_start: true,
        vars: Vars::new(),
    };
    let saga_states;
    let states = match super::saga::recognise(states, start) {
        Some(saga) => {
            saga_states = cx.take_saga(states, &saga);
            &saga_states
        }
        None => states,
    };
    let ended;
    let states = match cx.catches_into_fail(states) {
        Some(kept) => {
            ended = kept;
            &ended
        }
        None => states,
    };
    let ends = cx.block("", states, start, entry, Scope::Task);
    if !cx.refusals.is_empty() {
        return Err(cx.refusals);
    }
    let ends = ends.unwrap_or_default();
    rename_agents(&mut cx.steps, &cx.renamed);
    for child in &mut cx.children {
        if let Some(Value::Array(steps)) = child.get_mut("steps") {
            rename_agents(steps, &cx.renamed);
        }
    }
    in_sequence(&mut cx.steps);
    if cx.steps.is_empty() {
        return Err(refuse_top(
            "States",
            "no state calls anything (no Task, Wait or Fail): there is no workflow to run".into(),
        ));
    }
    let mut workflow = json!({
        "name": name,
        "version": 1,
        "description": top.get("Comment").and_then(Value::as_str)
            .map_or_else(|| format!("imported from a state machine ({name})"), |c| format!("{c} (imported from a state machine)")),
        "steps": cx.steps,
    });
    match result(&ends) {
        Ok(Some(r)) => workflow["result"] = r,
        Ok(None) => {}
        Err(why) => {
            return Err(vec![Refusal { state: "(state machine)".into(), field: "output".into(), reason: why }]);
        }
    }
    Ok(Imported { workflow, children: cx.children, agents: cx.agents, notes: cx.notes })
}

impl Imported {
    /// Every workflow of the translation: the state machine's, then those it runs.
    pub fn workflows(&self) -> Vec<Value> {
        std::iter::once(self.workflow.clone()).chain(self.children.iter().cloned()).collect()
    }
}

/// The ways out of a Choice, one after another: a step that waits for the same steps as the one
/// before it in the list (or the head of that one's chain), with a guard that excludes the
/// other's, follows it in the list instead (its `after` left out: it runs whether that one ran or
/// was skipped). Only one of them runs either way, and a list runs within the task, where steps
/// that wait for the same steps would each be a branch, a task of its own.
fn in_sequence(steps: &mut [Value]) {
    let names: Vec<String> = steps.iter().map(|s| s["name"].as_str().unwrap_or_default().to_owned()).collect();
    let after = |steps: &[Value], i: usize| -> Option<Vec<String>> {
        steps[i]
            .get("after")
            .map(|a| a.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(String::from)).collect())
    };
    // whether step i waits, directly or not, for step j
    let waits_for = |steps: &[Value], i: usize, j: usize| -> bool {
        let mut seen = HashSet::new();
        let mut todo = vec![i];
        while let Some(k) = todo.pop() {
            if k == j {
                return true;
            }
            if !seen.insert(k) {
                continue;
            }
            match after(steps, k) {
                Some(list) => todo.extend(list.iter().filter_map(|n| names.iter().position(|m| m == n))),
                None if k > 0 => todo.push(k - 1),
                None => {}
            }
        }
        false
    };
    // a way out that others follow: its index, and those that follow it
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in 1..steps.len() {
        let (Some(mine), Some(when)) = (after(steps, i), steps[i].get("when").cloned()) else { continue };
        if mine.is_empty() {
            continue;
        }
        let joined = groups.iter_mut().rev().find(|(head, _)| after(steps, *head).as_ref() == Some(&mine));
        match joined {
            Some((head, members))
                if std::iter::once(&*head)
                    .chain(members.iter())
                    .all(|&m| steps[m].get("when").is_some_and(|w| excludes(w, &when)))
                    && waits_for(steps, i - 1, *head) =>
            {
                members.push(i);
                if let Some(o) = steps[i].as_object_mut() {
                    o.remove("after");
                }
            }
            _ => groups.push((i, Vec::new())),
        }
    }
}

/// Whether guards `a` and `b` cannot both hold: one of them requires, among what it requires,
/// that something the other requires does not hold (as the ways out of one Choice do).
fn excludes(a: &Value, b: &Value) -> bool {
    let all = |g: &Value| -> Vec<Value> {
        match g.get("and").and_then(Value::as_array) {
            Some(list) => list.clone(),
            None => vec![g.clone()],
        }
    };
    let denies = |x: &Value, y: &Value| {
        let required = all(y);
        all(x).iter().any(|c| c.get("not").is_some_and(|n| required.contains(n) || n == y))
    };
    denies(a, b) || denies(b, a)
}

/// The workflow's result from the ends where the state machine succeeds.
fn result(ends: &[Arrival]) -> Result<Option<Value>, String> {
    if ends.is_empty() {
        return Ok(None);
    }
    // succeeding at several places: the output of the way the task came
    let doc = Sym::one_of(ends.iter().map(|e| (e.full.clone(), e.doc.clone())).collect());
    match &doc {
        Sym::Ref(p) if p == "$.input" => Ok(Some(json!({"*.$": "$.input"}))),
        doc => doc.template().map(Some).map_err(|e| format!("the output: {e}")),
    }
}

/// How a state is reached: the decision that leads there, the data it gets, after which steps.
#[derive(Debug, Clone)]
struct Arrival {
    /// Everything decided on the way from the start (for a state reached several ways).
    full: Cond,
    /// What was decided since the last step (the guard when it is the only way in).
    local: Cond,
    /// The state's input.
    doc: Sym,
    /// The steps it comes after.
    after: BTreeSet<String>,
    /// It is reached without any step before it.
    from_start: bool,
    /// The variables set on the way (`Assign`), read as `$name`.
    vars: Vars,
}

/// Where a block's paths are read: the task, or one map element (`$.input.item`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Task,
    Element,
}

#[derive(Default)]
struct Cx {
    /// The workflow's name (its children's start with it).
    workflow: String,
    options: Options,
    /// The workflows made of Map processors.
    children: Vec<Value>,
    /// A recognised saga's undoing states: forward task → (its undoing state, that state).
    undo: HashMap<String, (String, Map<String, Value>)>,
    steps: Vec<Value>,
    agents: Map<String, Value>,
    notes: Vec<String>,
    refusals: Vec<Refusal>,
    names: HashSet<String>,
    /// Agent names that two agents would have had (each agent then named apart).
    collided: HashSet<String>,
    /// An agent named apart: the name it would have had.
    bases: HashMap<String, String>,
    /// An agent renamed once another would have had its name: old name → new (applied to the
    /// steps when the translation ends).
    renamed: HashMap<String, String>,
}

/// Where a state leads.
enum To {
    State(String),
    /// The block succeeds with this arrival's data.
    End,
}

impl Cx {
    /// The states without the `Catch` of a `Parallel` or `Map` whose every catcher goes straight
    /// to a `Fail` state: the task fails there anyway (its reason naming the branch or element
    /// that failed), and undoes what it applied. None when there is no such `Catch`.
    fn catches_into_fail(&mut self, states: &Map<String, Value>) -> Option<Map<String, Value>> {
        let is_fail = |name: &Value| {
            name.as_str().and_then(|n| states.get(n)).and_then(|st| st.get("Type")).and_then(Value::as_str)
                == Some("Fail")
        };
        // copied only when a Catch is taken out
        let mut out: Option<Map<String, Value>> = None;
        for (name, st) in states {
            let kind = st.get("Type").and_then(Value::as_str).unwrap_or_default();
            let Some(Value::Array(catchers)) = st.get("Catch") else { continue };
            if !matches!(kind, "Parallel" | "Map")
                || catchers.is_empty()
                || !catchers.iter().all(|c| is_fail(&c["Next"]))
            {
                continue;
            }
            if let Some(o) = out.get_or_insert_with(|| states.clone()).get_mut(name).and_then(Value::as_object_mut) {
                o.remove("Catch");
            }
            let to: Vec<&str> = catchers.iter().filter_map(|c| c["Next"].as_str()).collect();
            self.notes.push(format!(
                "{name}: its Catch leads only to Fail ({}): here the task fails when the {} does, its reason naming \
                 the {} that failed rather than the Fail state's Error and Cause, and undoes what it applied",
                to.join(", "),
                kind,
                if kind == "Map" { "element" } else { "branch" },
            ));
        }
        out
    }

    /// The states without the saga's chain and the catchers that entered it; the undoing states
    /// kept to become the compensations of their tasks.
    fn take_saga(&mut self, states: &Map<String, Value>, saga: &super::saga::Saga) -> Map<String, Value> {
        let mut out: Map<String, Value> = states
            .iter()
            .filter(|(k, _)| !saga.chain.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (task, i) in &saga.catcher {
            if let Some(Value::Array(catchers)) = out.get_mut(task).and_then(|t| t.get_mut("Catch")) {
                catchers.remove(*i);
                if catchers.is_empty() {
                    if let Some(t) = out.get_mut(task).and_then(Value::as_object_mut) {
                        t.remove("Catch");
                    }
                }
            }
        }
        for (task, undoing) in &saga.undo {
            if let Some(Value::Object(st)) = states.get(undoing) {
                self.undo.insert(task.clone(), (undoing.clone(), st.clone()));
            }
            self.notes.push(format!("saga: {task:?} is undone by {undoing:?} (its compensation), run by this project when a later step fails"));
        }
        self.notes.push(
            "saga: the step that fails is undone itself when it may have applied (a function's error, a timeout), as the state machine's catcher does; not after a PermanentError, which applied nothing".into(),
        );
        for t in &saga.tail {
            self.notes.push(format!(
                "saga: {t:?}, after the undoing, is not run: a task that undid its steps ends Compensated, and that status goes to its reply queue"
            ));
        }
        out
    }

    /// The name of the agent `spec`, which would be `base`: `base` while no other agent has it;
    /// else a name of its own: a bus's by its detail type (or its source), the agent that had
    /// `base` renamed so too, one agent per destination and detail type; any other numbered.
    fn agent_named(&mut self, here: &str, base: &str, spec: &Value) -> String {
        let same = self
            .agents
            .iter()
            .find(|(n, v)| *v == spec && (n.as_str() == base || self.bases.get(n.as_str()).is_some_and(|b| b == base)));
        if let Some((n, _)) = same {
            return n.clone();
        }
        if !self.agents.contains_key(base) && !self.collided.contains(base) {
            self.agents.insert(base.to_owned(), spec.clone());
            return base.to_owned();
        }
        self.collided.insert(base.to_owned());
        // the agent that had the name, named by what tells it apart too
        if let Some(old) = self.agents.get(base).cloned() {
            if let Some(q) = apart(base, &old).filter(|q| !self.agents.contains_key(q)) {
                self.agents.remove(base);
                self.agents.insert(q.clone(), old);
                self.bases.insert(q.clone(), base.to_owned());
                self.renamed.insert(base.to_owned(), q);
            }
        }
        let name =
            apart(base, spec).filter(|q| !self.agents.contains_key(q)).unwrap_or_else(|| numbered(base, &self.agents));
        self.agents.insert(name.clone(), spec.clone());
        self.bases.insert(name.clone(), base.to_owned());
        self.notes.push(format!(
            "{here}: its agent is {name}: another agent of this definition calls {} differently ({})",
            base.trim_end_matches(".send"),
            if spec["kind"] == "eventbridge" {
                "one agent per bus and detail type"
            } else {
                "a number tells them apart"
            }
        ));
        name
    }

    fn refuse(&mut self, state: &str, field: &str, reason: impl Into<String>) {
        self.refusals.push(Refusal { state: state.into(), field: field.into(), reason: reason.into() });
    }

    /// A step name for a state: its name where the project allows it, else a safe one (noted).
    fn step_name(&mut self, state: &str) -> String {
        // letters, digits and _ only, not first a digit: `$.outputs.<step>` is then a plain path
        let mut base: String = state.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        base.truncate(60);
        if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert_str(0, "s_");
        }
        let mut name = base.clone();
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        if name != state {
            self.notes.push(format!("state {state:?} is the step {name}"));
        }
        name
    }

    /// Translate the states of one block from `start`; the arrivals at its successful ends, or
    /// `None` when something was refused.
    fn block(
        &mut self,
        prefix: &str,
        states: &Map<String, Value>,
        start: &str,
        entry: Arrival,
        scope: Scope,
    ) -> Option<Vec<Arrival>> {
        let refused_before = self.refusals.len();
        let folded = self.fold_loops(prefix, states, start);
        let states = folded.as_ref().unwrap_or(states);
        let order = self.order(prefix, states, start);
        let mut pending: HashMap<String, Vec<Arrival>> = HashMap::new();
        pending.insert(start.to_owned(), vec![entry]);
        let mut ends = Vec::new();
        for name in order {
            let here = format!("{prefix}{name}");
            let Some(arrivals) = pending.remove(&name) else { continue };
            let Some(state) = states.get(&name).and_then(Value::as_object) else {
                self.refuse(&here, "Type", "a state is an object");
                continue;
            };
            let Some(m) = self.merge(&here, arrivals) else { continue };
            if m.full == Cond::False {
                self.notes.push(format!("state {here:?} is never reached (every way to it is decided against)"));
                continue;
            }
            let flows = self.state(&here, &name, state, m, scope);
            for (to, a) in flows {
                match to {
                    To::State(s) => pending.entry(s).or_default().push(a),
                    To::End => ends.push(a),
                }
            }
        }
        (self.refusals.len() == refused_before).then_some(ends)
    }

    /// The states reachable from `start`, each after every state that leads to it; a loop is
    /// refused (each one), and so is a `Next` that names no state, the states checked all the
    /// same as if that way were not there.
    fn order(&mut self, prefix: &str, states: &Map<String, Value>, start: &str) -> Vec<String> {
        fn visit(
            n: &str,
            states: &Map<String, Value>,
            mark: &mut HashMap<String, u8>,
            stack: &mut Vec<String>,
            out: &mut Vec<String>,
            bad: &mut Vec<(String, String)>,
        ) {
            match mark.get(n) {
                Some(2) => return,
                Some(1) => {
                    let from = stack.iter().position(|s| s == n).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(n.to_owned());
                    bad.push((n.to_owned(), cycle.join(" -> ")));
                    return;
                }
                _ => {}
            }
            let Some(state) = states.get(n) else {
                bad.push((
                    stack.last().cloned().unwrap_or_default(),
                    format!("Next names {n:?}, which is not a state"),
                ));
                return;
            };
            mark.insert(n.to_owned(), 1);
            stack.push(n.to_owned());
            let empty = Map::new();
            for next in successors(state.as_object().unwrap_or(&empty)) {
                visit(&next, states, mark, stack, out, bad);
            }
            stack.pop();
            mark.insert(n.to_owned(), 2);
            out.push(n.to_owned());
        }
        let mut out = Vec::new();
        let mut bad = Vec::new();
        visit(start, states, &mut HashMap::new(), &mut Vec::new(), &mut out, &mut bad);
        for (at, why) in bad {
            if why.contains(" -> ") {
                self.refuse(
                    &format!("{prefix}{at}"),
                    "Next",
                    format!(
                        "a loop ({why}) of a shape not translated: a loop here is translated when it is entered at \
                         one state and left only by one Choice's rules (first, last or in its middle, leading back \
                         directly or through one Wait); write this one as a loop step (kind loop; see \
                         docs/concepts/loops.md), a retry loop as a Retry, a loop over items as a Map"
                    ),
                );
            } else {
                self.refuse(&format!("{prefix}{at}"), "Next", why);
            }
        }
        out.reverse();
        out
    }

    /// The states with each loop that the project can run folded into one state of type
    /// [`LOOP_TYPE`], under its head's name: a region entered only at its head `h`, whose only way
    /// back to `h` is a `Choice` `c` (directly, or through one `Wait`), and whose only ways out are
    /// `c`'s rules. `None` when there is no loop; a loop of another shape is left as it is, and
    /// [`Cx::order`] refuses it naming its states; one of this shape that cannot be folded is
    /// refused here, with why.
    fn fold_loops(&mut self, prefix: &str, states: &Map<String, Value>, start: &str) -> Option<Map<String, Value>> {
        let edges = |n: &str| states.get(n).and_then(Value::as_object).map(successors).unwrap_or_default();
        // the back edges, from a depth-first walk (as `order` walks)
        let mut back = Vec::new();
        let (mut mark, mut stack): (HashMap<String, u8>, Vec<(String, usize)>) = (HashMap::new(), Vec::new());
        mark.insert(start.to_owned(), 1);
        stack.push((start.to_owned(), 0));
        while let Some((n, i)) = stack.last().cloned() {
            let next = edges(&n);
            if i >= next.len() {
                mark.insert(n, 2);
                stack.pop();
                continue;
            }
            if let Some(top) = stack.last_mut() {
                top.1 += 1;
            }
            let to = next[i].clone();
            match mark.get(&to) {
                Some(1) => back.push((n.clone(), to)),
                None if states.contains_key(&to) => {
                    mark.insert(to.clone(), 1);
                    stack.push((to, 0));
                }
                _ => {}
            }
        }
        if back.is_empty() {
            return None;
        }
        let mut out = states.clone();
        let mut folded = false;
        for (from, head) in back {
            if !out.contains_key(&head) || !out.contains_key(&from) {
                continue; // inside a loop folded already: its body's import folds it
            }
            let ty = |n: &str| out.get(n).and_then(|s| s.get("Type")).and_then(Value::as_str).unwrap_or("").to_owned();
            // the check: the Choice the back edge leaves, or the one before the Wait it leaves
            let preds = |n: &str| -> Vec<String> {
                out.iter()
                    .filter(|(_, st)| st.as_object().is_some_and(|o| successors(o).iter().any(|x| x == n)))
                    .map(|(k, _)| k.clone())
                    .collect()
            };
            // the loop's states: reachable from the head, and leading back along the back edge
            let reach = |from: &str, forward: bool| -> HashSet<String> {
                let mut seen = HashSet::from([from.to_owned()]);
                let mut todo = vec![from.to_owned()];
                while let Some(n) = todo.pop() {
                    let next: Vec<String> = if forward {
                        out.get(&n).and_then(Value::as_object).map(successors).unwrap_or_default()
                    } else {
                        preds(&n)
                    };
                    for x in next {
                        if out.contains_key(&x) && seen.insert(x.clone()) {
                            todo.push(x);
                        }
                    }
                }
                seen
            };
            // the check: the Choice the back edge leaves, or the one before the Wait it leaves (a
            // loop that decides last); else the head, when it is a Choice (a loop that decides
            // first); else the one state of the loop that leads out of it, when it is a Choice (a
            // loop that decides in its middle: the states before it run once before the loop, and
            // again at the end of each iteration, after those that follow it)
            let mut middle = false;
            let (check, wait) = match ty(&from).as_str() {
                "Choice" => (from.clone(), None),
                "Wait" if matches!(preds(&from).as_slice(), [c] if ty(c) == "Choice") => {
                    (preds(&from)[0].clone(), Some(from.clone()))
                }
                _ if ty(&head) == "Choice" => (head.clone(), None),
                _ => {
                    let cycle: BTreeSet<String> =
                        reach(&head, true).intersection(&reach(&from, false)).cloned().collect();
                    let leads_out = |n: &&String| {
                        out.get(*n)
                            .and_then(Value::as_object)
                            .is_some_and(|o| successors(o).iter().any(|x| !cycle.contains(x)))
                    };
                    match cycle.iter().filter(leads_out).collect::<Vec<_>>().as_slice() {
                        [c] if ty(c) == "Choice" => {
                            middle = true;
                            ((*c).clone(), None)
                        }
                        _ => continue,
                    }
                }
            };
            let first = check == head || middle;
            let fwd = reach(&head, true);
            let bwd = reach(if first { &from } else { &check }, false);
            let mut region: BTreeSet<String> = fwd.intersection(&bwd).cloned().collect();
            if let Some(w) = &wait {
                region.insert(w.clone());
            }
            let shown = region.iter().cloned().collect::<Vec<_>>().join(", ");
            let here = format!("{prefix}{head}");
            // one way in: the head
            let entered: Vec<String> = region
                .iter()
                .filter(|n| **n != head)
                .flat_map(|n| {
                    preds(n).into_iter().filter(|p| !region.contains(p)).map(move |p| format!("{n} from {p}"))
                })
                .collect();
            if !entered.is_empty() {
                self.refuse(
                    &here,
                    "Next",
                    format!(
                        "a loop over {shown} entered elsewhere than at {head} ({}): a loop here has one way in",
                        entered.join(", ")
                    ),
                );
                continue;
            }
            // one way out: the check's rules (a Fail state is a way out too)
            let leaves: Vec<String> = region
                .iter()
                .filter(|n| **n != check)
                .flat_map(|n| {
                    let o = out.get(n).and_then(Value::as_object).map(successors).unwrap_or_default();
                    o.into_iter().filter(|x| !region.contains(x)).map(move |x| format!("{n} to {x}"))
                })
                .collect();
            if !leaves.is_empty() {
                self.refuse(
                    &here,
                    "Next",
                    format!(
                    "a loop over {shown} left elsewhere than at its check {check} ({}): a loop here is left by its \
                     check's rules only (a Catch out of it: write it as a Retry)",
                    leaves.join(", ")
                ),
                );
                continue;
            }
            let Some(Value::Object(c)) = out.get(&check).cloned() else { continue };
            // where the body starts: the head, or, when the check comes first, the one state inside
            // the loop its rules lead to
            let start_at = if first {
                let inside: BTreeSet<String> = successors(&c).into_iter().filter(|x| region.contains(x)).collect();
                if inside.len() == 1 {
                    inside.into_iter().next().unwrap_or_default()
                } else {
                    self.refuse(
                        &here,
                        "Choices",
                        format!(
                            "a loop over {shown} whose check {check} comes first and leads into it at several states \
                             ({}): a loop here has one way in",
                            inside.into_iter().collect::<Vec<_>>().join(", ")
                        ),
                    );
                    continue;
                }
            } else {
                head.clone()
            };
            // a check in the middle: the states before it (from the head, not through it) stay
            // where they are, to run once before the loop, and run again at the end of each
            // iteration, after the states that follow the check; those lead back to the head only
            let before: BTreeSet<String> = if middle {
                let mut seen = BTreeSet::from([head.clone()]);
                let mut todo = vec![head.clone()];
                while let Some(n) = todo.pop() {
                    for x in out.get(&n).and_then(Value::as_object).map(successors).unwrap_or_default() {
                        if x != check && region.contains(&x) && seen.insert(x.clone()) {
                            todo.push(x);
                        }
                    }
                }
                seen
            } else {
                BTreeSet::new()
            };
            let around: Vec<String> = region
                .iter()
                .filter(|n| **n != check && !before.contains(*n))
                .flat_map(|n| {
                    let o = out.get(n).and_then(Value::as_object).map(successors).unwrap_or_default();
                    o.into_iter().filter(|x| before.contains(x) && *x != head).map(move |x| format!("{n} to {x}"))
                })
                .collect();
            if middle && (!around.is_empty() || before.contains(&start_at)) {
                self.refuse(
                    &here,
                    "Next",
                    format!(
                        "a loop over {shown} whose check {check} is in its middle, with ways around it ({}): a loop \
                         here is entered at its head and left at its check",
                        if around.is_empty() { format!("{check} back to {start_at}") } else { around.join(", ") }
                    ),
                );
                continue;
            }
            let back_to = if first { start_at.clone() } else { wait.clone().unwrap_or_else(|| head.clone()) };
            let exits: Vec<Value> =
                successors(&c).into_iter().filter(|x| *x != back_to && !region.contains(x)).map(Value::from).collect();
            // the body: the region but its check and wait, what led to the check now its end
            let mut body = Map::new();
            let mut bad = Vec::new();
            for n in region.iter().filter(|n| **n != check && Some(*n) != wait.as_ref()) {
                let Some(Value::Object(mut st)) = out.get(n).cloned() else { continue };
                if st.get("Next").and_then(Value::as_str) == Some(check.as_str()) {
                    st.remove("Next");
                    st.insert("End".into(), Value::Bool(true));
                }
                if successors(&st).contains(&check) {
                    bad.push(n.clone());
                }
                body.insert(n.clone(), Value::Object(st));
            }
            if !bad.is_empty() {
                self.refuse(
                    &here,
                    "Next",
                    format!(
                        "a loop over {shown} where {} lead(s) to its check {check} by a Choice rule or a Catch: not \
                     translated yet",
                        bad.join(", ")
                    ),
                );
                continue;
            }
            let mut node = Map::new();
            node.insert("Type".into(), json!(LOOP_TYPE));
            node.insert(LOOP_CHOICE.into(), Value::Object(c));
            node.insert(LOOP_CHOICE_NAME.into(), json!(check));
            node.insert(LOOP_BODY.into(), json!({"StartAt": start_at, "States": body}));
            if first {
                node.insert(LOOP_FIRST.into(), Value::Bool(true));
            }
            if let Some(w) = &wait {
                node.insert(LOOP_WAIT.into(), json!([w, out.get(w).cloned().unwrap_or(Value::Null)]));
            }
            node.insert(LOOP_EXITS.into(), Value::Array(exits));
            for n in region.iter().filter(|n| !before.contains(*n)) {
                out.remove(n);
            }
            out.insert(if first { check.clone() } else { head.clone() }, Value::Object(node));
            folded = true;
        }
        folded.then_some(out)
    }

    /// A folded loop ([`Cx::fold_loops`]): a loop step whose body is the loop's states translated
    /// as a workflow of their own (`<workflow>.<step>`, run once per iteration as a child task, its
    /// result the data its check reads), repeated until its check leads out, at most
    /// [`LOOP_BOUND`] times, the `Wait` between its check and its head as the wait between
    /// iterations. The check's rules are then decided on the loop's output, to where they lead out.
    fn loop_state(&mut self, here: &str, st: &Map<String, Value>, m: &Arrival) -> Result<Vec<(To, Arrival)>, Blocked> {
        let check_name = st.get(LOOP_CHOICE_NAME).and_then(Value::as_str).unwrap_or("check").to_owned();
        let check = st.get(LOOP_CHOICE).and_then(Value::as_object).cloned().unwrap_or_default();
        let machine = st.get(LOOP_BODY).cloned().unwrap_or(Value::Null);
        let first = st.get(LOOP_FIRST).is_some();
        let bound = self.options.loop_bound;
        let head = machine["StartAt"].as_str().unwrap_or_default().to_owned();
        // where the loop's states live: `here` is the folded state's path, under the loop's head
        // (its check, when it comes first)
        let prefix =
            here.strip_suffix(if first { check_name.as_str() } else { head.as_str() }).unwrap_or(here).to_owned();
        let check_at = format!("{prefix}{check_name}");
        let step = self.step_name(&check_name);
        let keep = 64usize.saturating_sub(step.chars().count() + 1);
        let child_name: String =
            format!("{}.{step}", self.workflow.chars().take(keep).collect::<String>()).chars().take(64).collect();
        let mut wait_ms = None;
        let mut back_to = head.clone();
        let mut back_doc = Sym::Ref("$.loop.previous".into());
        back_doc = io(&check, &back_doc, "InputPath")?;
        back_doc = io(&check, &back_doc, "OutputPath")?;
        if let Some(Value::Array(w)) = st.get(LOOP_WAIT) {
            let (name, wst) = (w[0].as_str().unwrap_or_default(), w[1].as_object().cloned().unwrap_or_default());
            name.clone_into(&mut back_to);
            let Some(secs) = wst.get("Seconds").and_then(Value::as_u64) else {
                return Err(Blocked::from((
                    "Next".to_owned(),
                    format!("a loop whose Wait {name} (between its check and its head) waits for other than Seconds: not translated yet"),
                )));
            };
            wait_ms = Some(secs * 1000);
            back_doc = io(&wst, &back_doc, "InputPath")?;
            back_doc = io(&wst, &back_doc, "OutputPath")?;
        }
        let child = match import_with(&child_name, &machine, self.options) {
            Ok(child) => child,
            Err(refusals) => {
                for r in refusals {
                    let state =
                        if r.state == "(state machine)" { here.to_owned() } else { format!("{prefix}{}", r.state) };
                    self.refusals.push(Refusal { state, ..r });
                }
                return Err(Blocked::from((
                    "Next".to_owned(),
                    format!(
                        "the loop {head} .. {check_name} waits on the refusals of its states (it is translated once \
                         they are)"
                    ),
                )));
            }
        };
        let (from, to) = if first { (&check_name, &head) } else { (&head, &check_name) };
        self.notes.push(format!(
            "{check_name}: the loop {from} .. {to} is the loop step {step}; its states are the workflow \
             {child_name}, run once per iteration as a child task (its own steps, retries and compensations)"
        ));
        if first {
            self.notes.push(format!(
                "{check_name}: the check comes first: it decides before each iteration, the first included (the \
                 loop step's while), on what arrives and then on the last iteration's output; a loop that ran no \
                 iteration has the output null, and what follows it reads what arrived"
            ));
        }
        self.notes.push(format!(
            "{check_name}: Step Functions sets a loop no bound; here it fails after {bound} iterations: raise \
             max_iterations in the workflows file (up to {}), or import with --loop-bound",
            sas_protocol::workflow::MAX_LOOP_ITERATIONS
        ));
        self.adopt(here, &child_name, child);
        // a check that comes first decides before each pass, the first included (a `while`): over
        // what arrives at the loop before the first, over the last iteration's output after
        let first_pass = Cond::When(json!({"variable": "$.loop.index", "numeric_equals": 0}));
        let output = Sym::Ref(format!("$.outputs.{step}"));
        let mut entry = m.doc.clone();
        let mut guard = None;
        if first {
            let seen = Sym::one_of(vec![(first_pass.clone(), m.doc.clone()), (first_pass.negated(), output.clone())]);
            guard = Some(Self::leads_to(&check, &seen, &m.vars, &head)?);
            entry = io(&check, &io(&check, &m.doc, "InputPath")?, "OutputPath")?;
        }
        let entry = entry.template().map_err(|e| ("Parameters".to_owned(), format!("the loop's input: {e}")))?;
        let again =
            back_doc.template().map_err(|e| ("Parameters".to_owned(), format!("the loop's next input: {e}")))?;
        let mut s = step_base(&step, m);
        s["kind"] = json!("loop");
        s["workflow"] = json!(child_name);
        s["version"] = json!(1);
        s["parameters"] = json!({"*.choose": [
            {"when": {"variable": "$.loop.index", "numeric_equals": 0}, "value": entry},
            {"value": again}
        ]});
        s["max_iterations"] = json!(bound);
        if let Some(w) = wait_ms {
            s["wait_ms"] = json!(w);
            let all = w.saturating_mul(u64::from(bound));
            if all > sas_protocol::workflow::DEFAULT_MAP_TIMEOUT_MS {
                s["timeout_ms"] = json!(all.min(sas_protocol::workflow::MAX_LONG_STEP_MS));
            }
        }
        let at = self.steps.len();
        self.steps.push(s);
        // the check, decided on the loop's output: the way back is the guard, the others lead on;
        // a loop whose check comes first may have run no iteration (its output null): the check
        // then decided on what arrived
        let doc = if first {
            // no iteration: the step's output is null (or, as kept, absent)
            let at = format!("$.outputs.{step}");
            let none =
                Cond::When(json!({"or": [{"variable": at, "is_present": false}, {"variable": at, "is_null": true}]}));
            Sym::one_of(vec![(none.clone(), m.doc.clone()), (none.negated(), output)])
        } else {
            output
        };
        let after = Arrival { doc, ..after_step(m, &step, Cond::True) };
        let flows = self.choice(&check_at, &check, &after)?;
        let mut on = Vec::new();
        let mut again_when = Cond::False;
        for (to, a) in flows {
            match &to {
                To::State(n) if *n == back_to => again_when = again_when.or(a.local.clone()),
                _ => on.push((to, a)),
            }
        }
        let never = || {
            Blocked::from((
                "Choices".to_owned(),
                format!("a loop whose check {check_name} always or never leads back: not translated"),
            ))
        };
        match (guard, again_when.negated()) {
            (Some(Cond::When(w)), _) => self.steps[at]["while"] = w,
            (None, Cond::When(until)) => self.steps[at]["until"] = until,
            _ => return Err(never()),
        }
        Ok(on)
    }

    /// A workflow translated for a part of this one (a Map's processor, a loop's states), made this
    /// one's child: its notes, its agents among this one's (one that another would have the name
    /// of is named apart), its workflows among the children.
    fn adopt(&mut self, here: &str, child_name: &str, child: Imported) {
        self.notes.extend(child.notes.into_iter().map(|n| format!("{child_name}: {n}")));
        let mut renamed = HashMap::new();
        for (k, v) in child.agents {
            let n = self.agent_named(here, &k, &v);
            if n != k {
                renamed.insert(k, n);
            }
        }
        for mut w in std::iter::once(child.workflow).chain(child.children) {
            if let Some(Value::Array(steps)) = w.get_mut("steps") {
                rename_agents(steps, &renamed);
            }
            self.children.push(w);
        }
    }

    /// One state reached several ways.
    fn merge(&mut self, here: &str, arrivals: Vec<Arrival>) -> Option<Arrival> {
        let mut it = arrivals.into_iter().filter(|a| a.full != Cond::False);
        let Some(mut m) = it.next() else {
            return Some(Arrival {
                full: Cond::False,
                local: Cond::False,
                doc: Sym::Lit(Value::Null),
                after: BTreeSet::new(),
                from_start: false,
                vars: Vars::new(),
            });
        };
        let mut ways = vec![(m.full.clone(), m.doc.clone())];
        let mut var_ways = vec![(m.full.clone(), std::mem::take(&mut m.vars))];
        for a in it {
            ways.push((a.full.clone(), a.doc.clone()));
            var_ways.push((a.full.clone(), a.vars));
            let same_parent = a.after == m.after && a.after.len() <= 1 && a.from_start == m.from_start;
            m.local = if same_parent { m.local.or(a.local) } else { m.full.clone().or(a.full.clone()) };
            m.full = m.full.or(a.full);
            m.after.extend(a.after);
            m.from_start |= a.from_start;
        }
        // reached with different data: what it reads depends on the way the task came
        m.doc = Sym::one_of(ways);
        // a variable set on every way in holds the value of the way taken; one set on some ways
        // only is not read here (Step Functions would fail the execution on the others)
        for name in var_ways[0].1.keys() {
            let each: Option<Vec<(Cond, Sym)>> =
                var_ways.iter().map(|(c, vars)| vars.get(name).map(|v| (c.clone(), v.clone()))).collect();
            if let Some(each) = each {
                m.vars.insert(name.clone(), Sym::one_of(each));
            }
        }
        if m.from_start && !m.after.is_empty() {
            self.refuse(
                here,
                "(input)",
                "the state is reached both before any task runs and after one; a step here either comes after \
                 steps or at the start (not yet translated)",
            );
            return None;
        }
        Some(m)
    }

    fn state(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: Arrival,
        scope: Scope,
    ) -> Vec<(To, Arrival)> {
        let ty = st.get("Type").and_then(Value::as_str).unwrap_or("");
        let next = || match (st.get("Next").and_then(Value::as_str), st.get("End")) {
            (Some(n), _) => To::State(n.to_owned()),
            _ => To::End,
        };
        let before = m.clone();
        let inner = self.refusals.len();
        let r: Result<Vec<(To, Arrival)>, Blocked> = match ty {
            "Pass" => Self::pass(st, m).map(|a| vec![(next(), a)]).map_err(Blocked::from),
            "Succeed" => io(st, &m.doc, "InputPath")
                .and_then(|d| io(st, &d, "OutputPath"))
                .map(|doc| vec![(To::End, Arrival { doc, ..m })])
                .map_err(Blocked::from),
            "Choice" => self.choice(here, st, &m),
            "Wait" => self.wait(name, st, &m).map(|a| vec![(next(), a)]).map_err(Blocked::from),
            "Fail" => self.fail(name, st, &m).map(|()| Vec::new()).map_err(Blocked::from),
            "Task" => self.task(here, name, st, &m, scope, next()),
            "Parallel" => self.parallel(here, st, m, scope).map(|a| vec![(next(), a)]),
            "Map" => self.map(here, name, st, &m, scope).map(|a| vec![(next(), a)]),
            LOOP_TYPE => self.loop_state(here, st, &m),
            other => {
                Err(Blocked::from(("Type".to_owned(), format!("{other:?} is not a state type of the States Language"))))
            }
        };
        match r {
            Ok(flows) => flows,
            Err(Blocked(list)) => {
                // the state's own fields first, then what inside it (a branch, a processor) is refused
                let own = list.into_iter().map(|(field, reason)| Refusal { state: here.to_owned(), field, reason });
                self.refusals.splice(inner..inner, own);
                // the states after it are checked all the same (every blocker of the definition
                // is named), as if it were a step whose output they read
                let stand_in: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
                let doc = Sym::Ref(format!("$.outputs.s_{stand_in}"));
                let a = if matches!(ty, "Pass" | "Choice" | "Succeed") {
                    // no step: what follows comes after the same steps
                    Arrival { doc, ..before }
                } else {
                    Arrival { doc, ..after_step(&before, &format!("s_{stand_in}"), Cond::True) }
                };
                successors(st).into_iter().map(|n| (To::State(n), a.clone())).collect()
            }
        }
    }

    fn pass(st: &Map<String, Value>, m: Arrival) -> Result<Arrival, (String, String)> {
        let input = io(st, &m.doc, "InputPath")?;
        let result = match (st.get("Result"), st.get("Parameters")) {
            (Some(r), _) => Sym::Lit(r.clone()),
            (None, Some(p)) => template(p, &input, &m.vars, Scope::Task).map_err(|e| ("Parameters".into(), e))?,
            (None, None) => input,
        };
        // Assign reads the result, before ResultPath puts it in the input
        let vars = assign(st.get("Assign"), &result, &m.vars)?;
        let doc = result_path(st, m.doc, result)?;
        Ok(Arrival { doc: io(st, &doc, "OutputPath")?, vars, ..m })
    }

    /// A Choice's rules decided over `doc` (what arrives): each rule's target with when it is the
    /// one taken (no rule before it held), and when none holds.
    fn choice_ways(st: &Map<String, Value>, doc: &Sym, vars: &Vars) -> Result<(Vec<(String, Cond)>, Cond), Blocked> {
        let input = io(st, doc, "InputPath")?;
        let Some(Value::Array(rules)) = st.get("Choices") else {
            return Err(Blocked::from(("Choices".to_owned(), "a Choice state has a list of Choices".to_owned())));
        };
        let mut ways = Vec::new();
        let mut none_before = Cond::True;
        // every rule that cannot be translated is named
        let mut errs = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let Value::Object(rule) = rule else {
                errs.push((format!("Choices[{i}]"), "a rule is an object".into()));
                continue;
            };
            let Some(next) = rule.get("Next").and_then(Value::as_str) else {
                errs.push((format!("Choices[{i}]"), "a rule names its Next".into()));
                continue;
            };
            let Some(c) = kept(choice_rule(rule, &input, vars).map_err(|e| (format!("Choices[{i}]"), e)), &mut errs)
            else {
                continue;
            };
            let taken = none_before.clone().and(c.clone());
            none_before = none_before.and(c.negated());
            ways.push((next.to_owned(), taken));
        }
        if !errs.is_empty() {
            return Err(Blocked(errs));
        }
        Ok((ways, none_before))
    }

    /// When a Choice, over `doc`, leads to `target` (by a rule, or by its `Default`).
    fn leads_to(st: &Map<String, Value>, doc: &Sym, vars: &Vars, target: &str) -> Result<Cond, Blocked> {
        let (ways, none) = Self::choice_ways(st, doc, vars)?;
        let mut c = Cond::False;
        for (next, taken) in ways {
            if next == target {
                c = c.or(taken);
            }
        }
        if st.get("Default").and_then(Value::as_str) == Some(target) {
            c = c.or(none);
        }
        Ok(c)
    }

    fn choice(&mut self, here: &str, st: &Map<String, Value>, m: &Arrival) -> Result<Vec<(To, Arrival)>, Blocked> {
        let input = io(st, &m.doc, "InputPath")?;
        let out = io(st, &input, "OutputPath")?;
        let (ways, none_before) = Self::choice_ways(st, &m.doc, &m.vars)?;
        // the rule taken sets its own Assign; the state's is set when the Default is taken
        let rules = st.get("Choices").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut flows = Vec::new();
        for (i, (next, taken)) in ways.into_iter().enumerate() {
            let vars = assign(rules.get(i).and_then(|r| r.get("Assign")), &input, &m.vars)
                .map_err(|(_, e)| (format!("Choices[{i}].Assign"), e))?;
            flows.push((To::State(next), Arrival { vars, ..edge(m, taken, out.clone()) }));
        }
        match st.get("Default").and_then(Value::as_str) {
            Some(d) => {
                let vars = assign(st.get("Assign"), &input, &m.vars)?;
                flows.push((To::State(d.to_owned()), Arrival { vars, ..edge(m, none_before, out) }));
            }
            None if none_before != Cond::False => {
                // no rule matched: Step Functions fails the execution (States.NoChoiceMatched)
                let step = self.step_name(&format!("{}-no-choice-matched", here.rsplit('/').next().unwrap_or(here)));
                self.fail_agent();
                let a = edge(m, none_before, out);
                let mut s = step_base(&step, &a);
                s["agent"] = json!("asl.fail");
                s["timeout_ms"] = json!(10_000);
                s["parameters"] =
                    json!({"error": "States.NoChoiceMatched", "cause": format!("no Choice rule of {here} matched")});
                self.steps.push(s);
                self.notes.push(format!(
                    "Choice {here:?} has no Default: when no rule matches, the step {step} fails the task (States.NoChoiceMatched)"
                ));
            }
            None => {}
        }
        Ok(flows)
    }

    fn wait(&mut self, name: &str, st: &Map<String, Value>, m: &Arrival) -> Result<Arrival, (String, String)> {
        let input = io(st, &m.doc, "InputPath")?;
        let step = self.step_name(name);
        let mut s = step_base(&step, m);
        s["kind"] = json!("wait");
        if let Some(secs) = st.get("Seconds") {
            let secs =
                secs.as_u64().ok_or(("Seconds".to_owned(), format!("{secs} is not a whole number of seconds")))?;
            s["wait_ms"] = json!(secs * 1000);
        } else if let Some(at) = read(st, &input, "TimestampPath", "the time")? {
            s["wait_until"] = json!(at);
        } else if let Some(secs) = constant_seconds(st, &input) {
            s["wait_ms"] = json!(secs * 1000);
        } else if let Some(secs) = read(st, &input, "SecondsPath", "the seconds")? {
            s["wait_for"] = json!(secs);
        } else if let Some(t) = st.get("Timestamp").and_then(Value::as_str) {
            s["wait_until"] = json!(t);
        } else {
            return Err((
                "Seconds".into(),
                "a Wait state needs Seconds, SecondsPath, Timestamp or TimestampPath".into(),
            ));
        }
        self.steps.push(s);
        let vars = assign(st.get("Assign"), &input, &m.vars)?;
        Ok(Arrival { doc: io(st, &input, "OutputPath")?, vars, ..after_step(m, &step, Cond::True) })
    }

    fn fail_agent(&mut self) {
        self.agents.insert("asl.fail".into(), json!({"kind": "fail"}));
    }

    fn fail(&mut self, name: &str, st: &Map<String, Value>, m: &Arrival) -> Result<(), (String, String)> {
        let step = self.step_name(name);
        self.fail_agent();
        let mut params = Map::new();
        for (k, path_key) in [("error", "Error"), ("cause", "Cause")] {
            if let Some(v) = st.get(path_key) {
                params.insert(k.into(), v.clone());
            } else if let Some(p) = st.get(&format!("{path_key}Path")).and_then(Value::as_str) {
                if p.starts_with("States.") {
                    return Err((format!("{path_key}Path"), "intrinsic functions are not translated yet".into()));
                }
                match m.doc.get(&parse_path(p).map_err(|e| (format!("{path_key}Path"), e))?) {
                    Ok(Sym::Ref(path)) => {
                        params.insert(format!("{k}.$"), json!(path));
                    }
                    Ok(Sym::Lit(v)) => {
                        params.insert(k.into(), v);
                    }
                    Ok(_) => {
                        return Err((format!("{path_key}Path"), "the value there is built by the state machine".into()))
                    }
                    Err(e) => return Err((format!("{path_key}Path"), e)),
                }
            }
        }
        let mut s = step_base(&step, m);
        s["agent"] = json!("asl.fail");
        s["timeout_ms"] = json!(10_000);
        s["parameters"] = Value::Object(params);
        self.steps.push(s);
        Ok(())
    }

    /// A Task state as a step: every field that cannot be translated is named (not only the
    /// first), each checked on its own.
    #[allow(clippy::too_many_lines)] // one state type's fields in the order the States Language gives them
    fn task(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: &Arrival,
        scope: Scope,
        next: To,
    ) -> Result<Vec<(To, Arrival)>, Blocked> {
        let mut errs: Vec<(String, String)> = Vec::new();
        let resource = st.get("Resource").and_then(Value::as_str).unwrap_or("");
        let input = kept(io(st, &m.doc, "InputPath"), &mut errs).unwrap_or_else(|| m.doc.clone());
        let (params, params_ok) = match st.get("Parameters") {
            Some(p) => match template(p, &input, &m.vars, scope) {
                Ok(t) => (Some(t), true),
                Err(e) => {
                    errs.push(("Parameters".into(), e));
                    (None, false)
                }
            },
            None => (None, true),
        };
        let service = match Service::of(resource, params.as_ref()) {
            Ok(service) => Some(service),
            // what the Parameters that could not be read would have named
            Err(e) if !params_ok && e.contains("needs Parameters.") => None,
            Err(e) => {
                errs.push(("Resource".into(), e));
                None
            }
        };
        if resource.starts_with("${") && service.is_some() {
            self.notes.push(format!(
                "{here}: Resource {resource} is taken to be a Lambda function's ARN (its variable names the function)"
            ));
        }
        let step = self.step_name(name);
        let mut s = step_base(&step, m);
        let callback = resource.ends_with(".waitForTaskToken");
        // what the task's answer is, to the paths that read it
        let mut raw = Sym::Ref("$".into());
        // an aws agent parses the answer's members its ResultSelector parses (`States.StringToJson(
        // $.Body)`), so that what follows may read into them
        let (parsed, selector) = match (&service, st.get("ResultSelector")) {
            (Some(Service::Aws { .. }), Some(sel)) => parsed_in_selector(sel),
            (_, sel) => (Vec::new(), sel.cloned()),
        };
        let job = match service {
            Some(Service::Job { job, two, params }) => Some((job, two, params)),
            other => {
                if let Some(service) = other {
                    self.agent_task(here, service, callback, &input, &parsed, &mut raw, &mut s, &mut errs);
                }
                None
            }
        };
        // time bounds
        let timeout = match (st.get("TimeoutSeconds"), st.get("TimeoutSecondsPath")) {
            (_, Some(_)) => {
                errs.push((
                    "TimeoutSecondsPath".into(),
                    "a timeout read from the data is not translated: give TimeoutSeconds".into(),
                ));
                None
            }
            (Some(t), None) => {
                kept(t.as_u64().ok_or(("TimeoutSeconds".to_owned(), format!("{t} is not whole seconds"))), &mut errs)
            }
            (None, None) => None,
        };
        let timed = st.contains_key("TimeoutSeconds") || st.contains_key("TimeoutSecondsPath");
        if let Some((job, two, params)) = job {
            match self.job_loop(here, &step, st, &mut s, job, two, params, timeout) {
                Ok(answer) => raw = answer,
                Err(e) => errs.extend(e),
            }
        } else if callback {
            s["timeout_ms"] = json!(timeout.map_or(DEFAULT_CALLBACK_TIMEOUT_MS, |t| t * 1000));
            if !timed {
                self.notes.push(format!("{here}: no TimeoutSeconds; the callback step waits at most 365 days"));
            }
            match (st.get("HeartbeatSeconds"), st.get("HeartbeatSecondsPath")) {
                (_, Some(_)) => errs.push(("HeartbeatSecondsPath".into(), "give HeartbeatSeconds".into())),
                (Some(h), None) => {
                    let h = h.as_u64().ok_or(("HeartbeatSeconds".to_owned(), format!("{h} is not whole seconds")));
                    if let Some(h) = kept(h, &mut errs) {
                        s["heartbeat_ms"] = json!(h * 1000);
                    }
                }
                (None, None) => {}
            }
        } else {
            match timeout {
                Some(t) if t > CALL_LIMIT_S => errs.push((
                    "TimeoutSeconds".into(),
                    format!(
                        "{t} s is over the {CALL_LIMIT_S} s a call step may take here: make the task a callback \
                         (lambda:invoke.waitForTaskToken, the function answering with the token when done)"
                    ),
                )),
                Some(t) => s["timeout_ms"] = json!(t * 1000),
                None => {
                    s["timeout_ms"] = json!(DEFAULT_CALL_TIMEOUT_MS);
                    if !timed {
                        self.notes.push(format!("{here}: no TimeoutSeconds; the call step's timeout is 60 s"));
                    }
                }
            }
            if st.contains_key("HeartbeatSeconds") {
                self.notes
                    .push(format!("{here}: HeartbeatSeconds has no meaning for a call step, bounded by its timeout"));
            }
        }
        let is_job = s["kind"] == "loop";
        if !is_job {
            kept(self.retry(here, st, &mut s), &mut errs);
        }
        // what of the answer is kept
        let out = format!("$.outputs.{step}");
        // Assign reads the answer as it comes, before ResultSelector (which keeps its part alone)
        let vars = kept(assign(st.get("Assign"), &raw.rebased(&out), &m.vars), &mut errs);
        if let Some(vars) = vars.as_ref().filter(|_| st.contains_key("ResultSelector") && !is_job) {
            let reads_answer = vars.iter().any(|(k, v)| {
                m.vars.get(k) != Some(v) && v.paths().iter().any(|p| p == &out || p.starts_with(&format!("{out}.")))
            });
            if reads_answer {
                errs.push((
                    "Assign".into(),
                    "an Assign that reads the task's answer beside a ResultSelector is not translated (the step keeps \
                     the selected part alone): assign from the selected value in the next state, or select in the Assign"
                        .into(),
                ));
            }
        }
        let mut result = raw.rebased(&out);
        if let Some(sel) = selector.as_ref() {
            // a result selector here is applied to the answer alone, where no variable is
            let said = |e: String| {
                let e = if e.contains("the variable $") {
                    "a ResultSelector that reads a variable is not translated (it is applied to the answer alone \
                     here): read the variable in the next state's Parameters"
                        .to_owned()
                } else {
                    e
                };
                ("ResultSelector".to_owned(), e)
            };
            // the step keeps the selected part alone where the selector is a template of the
            // project's over the answer; a job's (a loop's selector would apply to every poll),
            // or one that calls an intrinsic function over the answer, is applied where the value
            // is read, over the whole answer the step keeps
            let as_step = template(sel, &raw, &Vars::new(), Scope::Task).and_then(|k| k.template());
            match as_step {
                Ok(t) if !is_job => {
                    s["result_selector"] = t;
                    result = Sym::Ref(out.clone());
                }
                _ => match template(sel, &result, &Vars::new(), Scope::Task) {
                    Ok(t) => {
                        if !is_job {
                            self.notes.push(format!(
                                "{here}: its ResultSelector calls an intrinsic function over the answer: the step \
                                 keeps the whole answer, and what reads the selection reads it there"
                            ));
                        }
                        result = t;
                    }
                    Err(e) => errs.push(said(e)),
                },
            }
        }
        // handled failures
        let (ok, caught) = kept(self.catch(here, st, &step, &mut s), &mut errs).unwrap_or((Cond::True, Vec::new()));
        let doc = kept(result_path(st, m.doc.clone(), result.clone()), &mut errs).unwrap_or(result);
        let doc = kept(io(st, &doc, "OutputPath"), &mut errs).unwrap_or(doc);
        if let Some((undoing, _)) = self.undo.get(name).filter(|_| is_job) {
            errs.push((
                "Resource".into(),
                format!("a job run to completion undone by {undoing} is not translated: the job's start is undone by stopping it here"),
            ));
        } else if let Some((undoing, state)) = self.undo.remove(name) {
            // the undoing task reads the data as it was when this step succeeded
            let at = Arrival { doc: doc.clone(), ..after_step(m, &step, Cond::True) };
            match self.task(&undoing, &undoing, &state, &at, scope, To::End) {
                Ok(_) => {
                    let mut c = self.steps.pop().unwrap_or(Value::Null);
                    if let Some(o) = c.as_object_mut() {
                        o.remove("after");
                        o.remove("when");
                    }
                    s["compensation"] = c;
                }
                Err(Blocked(list)) => {
                    for (field, why) in list {
                        self.refuse(&undoing, &field, why);
                    }
                }
            }
        }
        if !errs.is_empty() {
            return Err(Blocked(errs));
        }
        self.steps.push(s);
        let vars = vars.unwrap_or_default();
        let mut flows = vec![(next, Arrival { doc, vars, ..after_step(m, &step, ok) })];
        for (i, (to, cond, result_path_spec, assigned, name)) in caught.into_iter().enumerate() {
            let error = Sym::Obj(vec![
                ("Error".into(), name.map_or_else(|| Sym::Ref(format!("{out}.error.kind")), |n| Sym::Lit(json!(n)))),
                ("Cause".into(), Sym::Ref(format!("{out}.error.message"))),
            ]);
            // a catcher's Assign reads the error output, before its ResultPath
            let vars =
                assign(assigned.as_ref(), &error, &m.vars).map_err(|(_, e)| (format!("Catch[{i}].Assign"), e))?;
            let doc = match result_path_spec {
                Some(Value::Null) => m.doc.clone(),
                Some(Value::String(p)) => m
                    .doc
                    .clone()
                    .set(&parse_path(&p).map_err(|e| ("Catch".to_owned(), e))?, error)
                    .map_err(|e| ("Catch".to_owned(), e))?,
                _ => error,
            };
            flows.push((To::State(to), Arrival { doc, vars, ..after_step(m, &step, cond) }));
        }
        Ok(flows)
    }

    /// An `aws` agent's name (before it is made unique) and its configuration: `pinned` fixed in
    /// its parameters, granted on `resources`.
    fn aws_spec(
        &mut self,
        here: &str,
        service: &str,
        action: &str,
        pinned: &[(String, String)],
        resources: &[String],
    ) -> (String, Value) {
        let fixed: Map<String, Value> = pinned.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        if resources == ["*"] {
            self.notes.push(format!(
                "{here}: the aws agent's resources are \"*\" (the definition names none): narrow them to what {service}:{action} reaches"
            ));
        }
        let spec = json!({"kind": "aws", "service": service, "action": action,
                          "parameters": fixed, "resources": resources});
        let what =
            pinned.first().map_or_else(|| format!("{service}.{action}"), |(_, v)| format!("{service}.{action}:{v}"));
        let base = match pinned.first() {
            Some(_) => agent_name(&format!("aws.{service}.{action}"), &what),
            None => format!("aws.{service}.{action}"),
        };
        (base, spec)
    }

    /// A job run to completion (`.sync`) as a loop step whose body is a workflow of its own: its
    /// first iteration starts the job (the start's compensation stops it), each later one asks for
    /// its status, `JOB_POLL_MS` apart, until a status ends it; a status that ends it badly fails
    /// the iteration (`States.TaskFailed`), so the step. The answer is the last poll's, as the job
    /// table says (`.sync:2`: the execution's input and output parsed by the describe agent).
    #[allow(clippy::too_many_arguments, clippy::too_many_lines)]
    fn job_loop(
        &mut self,
        here: &str,
        step: &str,
        st: &Map<String, Value>,
        s: &mut Value,
        job: &'static sas_protocol::jobs::Job,
        two: bool,
        params: Option<Sym>,
        job_timeout: Option<u64>,
    ) -> Result<Sym, Vec<(String, String)>> {
        use sas_protocol::jobs::From;
        let mut errs = Vec::new();
        let svc = job.service;
        let pinned = pinned_members(params.as_ref());
        let resources = aws_resources(svc, &pinned);
        // an execution's describe and stop reach the executions of the machine started
        let polled: Vec<String> = resources
            .iter()
            .map(|r| match r.split_once(":stateMachine:") {
                Some((head, name)) if svc == "sfn" => {
                    format!("{head}:execution:{}:*", name.split(':').next().unwrap_or(name))
                }
                _ => r.clone(),
            })
            .collect();
        let sent = unpinned(params, &pinned);
        // the describe and stop requests: the id read from the answer before; a name from the
        // start's request (the agent fixes it when the definition writes it)
        let fixed_of = |members: &[sas_protocol::jobs::Member]| -> Vec<(String, String)> {
            members
                .iter()
                .filter_map(|m| match m.from {
                    From::Request(r) => {
                        pinned.iter().find(|(k, _)| k == r).map(|(_, v)| (m.name.to_owned(), v.clone()))
                    }
                    From::Answer { .. } => None,
                })
                .collect()
        };
        let request = |members: &[sas_protocol::jobs::Member], answer: &dyn Fn(&str, &str) -> String, req: &str| {
            let mut o = Map::new();
            for m in members {
                let path = match m.from {
                    From::Answer { start, describe } => answer(start, describe),
                    From::Request(r) if pinned.iter().any(|(k, _)| k == r) => continue,
                    From::Request(r) => format!("{req}.{r}"),
                };
                let value = json!({"*.$": path});
                if m.list {
                    o.insert(m.name.to_owned(), json!([value]));
                } else {
                    o.insert(format!("{}.$", m.name), json!(path));
                }
            }
            Value::Object(o)
        };
        let (start_base, start_spec) = self.aws_spec(here, svc, job.start, &pinned, &resources);
        let start_agent = self.agent_named(here, &start_base, &start_spec);
        let describe_fixed = fixed_of(job.request);
        let (base, mut spec) = self.aws_spec(here, svc, job.describe, &describe_fixed, &polled);
        if two {
            // .sync:2: the execution's input and output as JSON
            spec["parse_json"] = json!(job.json_members);
        }
        let describe_agent = self.agent_named(here, &base, &spec);
        let stop_fixed = fixed_of(job.stop_request);
        let (base, spec) = self.aws_spec(here, svc, job.stop, &stop_fixed, &polled);
        let stop_agent = self.agent_named(here, &base, &spec);
        // the members a poll needs from the start's request are sent the same each time
        let from_request: Vec<(String, Sym)> = job
            .request
            .iter()
            .filter_map(|m| match m.from {
                From::Request(r) if !pinned.iter().any(|(k, _)| k == r) => Some(r),
                _ => None,
            })
            .map(|r| match sent.get(&[Seg::Name(r.into())]) {
                Ok(v) => Ok((r.to_owned(), v)),
                Err(_) => Err((
                    "Parameters".to_owned(),
                    format!("{svc}:{} needs Parameters.{r} (its job is polled by it)", job.start),
                )),
            })
            .filter_map(|r| kept(r, &mut errs))
            .collect();
        let sent_t = kept(sent.template().map_err(|e| ("Parameters".to_owned(), e)), &mut errs);
        let mut carried = Map::new();
        for (k, v) in &from_request {
            if let Some(t) = kept(v.template().map_err(|e| ("Parameters".to_owned(), e)), &mut errs) {
                carried.insert(k.clone(), t);
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        // a member from the start's request is read from what the iteration's input carries
        let after_start = request(job.request, &|start, _| format!("$.loop.previous.start.{start}"), "$.input.carried");
        let after_poll =
            request(job.request, &|_, describe| format!("$.loop.previous.describe.{describe}"), "$.input.carried");
        let carried = Value::Object(carried);
        let parameters = json!({"*.choose": [
            {"when": {"variable": "$.loop.index", "numeric_equals": 0}, "value": {"start": sent_t}},
            {"when": {"variable": "$.loop.index", "numeric_equals": 1}, "value": {"poll": after_start, "carried": carried}},
            {"value": {"poll": after_poll, "carried": carried}}
        ]});
        let mut stop_params =
            request(job.stop_request, &|start, _| format!("$.outputs.start.{start}"), "$.input.start");
        for (k, v) in job.stop_constants {
            stop_params[*k] = json!(v);
        }
        let mut start_step = json!({
            "name": "start", "agent": start_agent, "timeout_ms": DEFAULT_CALL_TIMEOUT_MS,
            "when": {"variable": "$.input.start", "is_present": true},
            "parameters": {"*.$": "$.input.start"},
            "compensation": {"name": "stop", "agent": stop_agent, "timeout_ms": DEFAULT_CALL_TIMEOUT_MS,
                             "max_attempts": 3, "parameters": stop_params}
        });
        if let Err(e) = self.retry(here, st, &mut start_step) {
            return Err(vec![e]);
        }
        let status = format!("$.outputs.describe.{}", job.status);
        let is = |at: &str, list: &[&str]| -> Value {
            let each: Vec<Value> = list.iter().map(|v| json!({"variable": at, "string_equals": v})).collect();
            if each.len() == 1 {
                each[0].clone()
            } else {
                json!({"or": each})
            }
        };
        let output_at = match job.output.0 {
            "" => "$.outputs.describe".to_owned(),
            p => format!("$.outputs.describe.{p}"),
        };
        let mut body = vec![
            start_step,
            json!({"name": "describe", "agent": describe_agent, "timeout_ms": DEFAULT_CALL_TIMEOUT_MS,
                   "max_attempts": 3, "backoff": {"base_ms": 1000, "max_ms": 20_000, "multiplier": 2.0},
                   "when": {"variable": "$.input.poll", "is_present": true}, "parameters": {"*.$": "$.input.poll"}}),
        ];
        if !job.failed.is_empty() {
            self.fail_agent();
            body.push(json!({"name": "failed", "agent": "asl.fail", "timeout_ms": 10_000,
                             "when": is(&status, job.failed),
                             "parameters": {"error": "States.TaskFailed",
                                            "cause.$": format!("States.JsonToString({output_at})")}}));
        }
        let keep = 64usize.saturating_sub(step.chars().count() + 1);
        let child_name: String =
            format!("{}.{step}", self.workflow.chars().take(keep).collect::<String>()).chars().take(64).collect();
        self.children.push(json!({
            "name": child_name, "version": 1,
            "description": format!("one poll of the job {} starts ({}:{}), imported", step, svc, job.start),
            "steps": body,
        }));
        // how long, how often
        let most = sas_protocol::workflow::MAX_LONG_STEP_MS;
        let timeout_ms =
            job_timeout.map_or(sas_protocol::workflow::DEFAULT_MAP_TIMEOUT_MS, |t| t.saturating_mul(1000).min(most));
        let iterations = u64::from(sas_protocol::workflow::MAX_LOOP_ITERATIONS);
        let wait_ms = JOB_POLL_MS.max(timeout_ms.div_ceil(iterations - 1));
        let max_iterations = (timeout_ms / wait_ms + 1).min(iterations);
        s["kind"] = json!("loop");
        s["workflow"] = json!(child_name);
        s["version"] = json!(1);
        s["parameters"] = parameters;
        s["max_iterations"] = json!(max_iterations);
        s["wait_ms"] = json!(wait_ms);
        s["timeout_ms"] = json!(timeout_ms);
        s["until"] = is(&format!("$.outputs.{step}.describe.{}", job.status), job.succeeded);
        self.notes.push(format!(
            "{here}: the job ({svc}:{}) runs to completion as the loop step {step}: its workflow {child_name} starts it \
             in the first iteration, then asks {} for its status every {} s (at most {max_iterations} times, {} s in all{}); \
             the job is stopped ({}) when the task compensates or is cancelled after it started",
            job.start,
            job.describe,
            wait_ms / 1000,
            timeout_ms / 1000,
            if job_timeout.is_some() { ", its TimeoutSeconds" } else { ": no TimeoutSeconds, a day" },
            job.stop,
        ));
        if st.contains_key("Retry") {
            self.notes.push(format!(
                "{here}: Retry retries the job's start here; a job that ends badly is not started again"
            ));
        }
        if st.contains_key("HeartbeatSeconds") {
            self.notes.push(format!("{here}: HeartbeatSeconds has no meaning for a job polled by its status"));
        }
        // the answer: the last poll's, as Step Functions gives it
        let at = match job.output.0 {
            "" => "$.describe".to_owned(),
            p => format!("$.describe.{p}"),
        };
        let mut answer = Sym::Ref(at);
        if let Some(wrap) = job.output.1 {
            answer = Sym::Obj(vec![(wrap.to_owned(), answer)]);
        }
        Ok(answer)
    }

    /// A task that calls an agent once (or waits for its token): the step's agent and parameters,
    /// and the answer as the paths that read it see it.
    #[allow(clippy::too_many_arguments, clippy::too_many_lines)]
    fn agent_task(
        &mut self,
        here: &str,
        service: Service,
        callback: bool,
        input: &Sym,
        parsed: &[String],
        raw: &mut Sym,
        s: &mut Value,
        errs: &mut Vec<(String, String)>,
    ) {
        let (agent, spec, sent, answer) = match service {
            Service::Function { function, qualifier, payload, wrapped } => {
                let sent = payload.unwrap_or(input.clone());
                // the payload alone for a call; a callback's function always gets the request (the token)
                let mut spec = json!({"kind": "lambda", "function": function, "payload": "input"});
                // one agent per function and qualifier
                let name = match &qualifier {
                    Some(q) => agent_name("fn", &format!("{function}.{}", q.trim_start_matches('$'))),
                    None => agent_name("fn", &function),
                };
                if let Some(q) = qualifier {
                    spec["qualifier"] = json!(q);
                }
                let raw = if wrapped {
                    Sym::Obj(vec![
                        ("Payload".into(), Sym::Ref("$".into())),
                        ("StatusCode".into(), Sym::Lit(json!(200))),
                        ("ExecutedVersion".into(), Sym::Lit(json!("$LATEST"))),
                    ])
                } else {
                    Sym::Ref("$".into())
                };
                (name, spec, sent, raw)
            }
            Service::Queue { queue_url, body } => {
                let spec = json!({"kind": "sqs", "queue_url": queue_url});
                let raw = Sym::Obj(vec![("MessageId".into(), Sym::Ref("$.message_id".into()))]);
                (agent_name("sqs", &queue_url), spec, body, raw)
            }
            Service::Topic { topic_arn, message } => {
                let spec = json!({"kind": "sns", "topic_arn": topic_arn});
                let raw = Sym::Obj(vec![("MessageId".into(), Sym::Ref("$.message_id".into()))]);
                (agent_name("sns", &topic_arn), spec, message, raw)
            }
            Service::Bus { bus, source, detail_type, detail } => {
                let mut spec = json!({"kind": "eventbridge", "bus": bus});
                if let Some(x) = &source {
                    spec["source"] = json!(x);
                }
                if let Some(x) = &detail_type {
                    spec["detail_type"] = json!(x);
                }
                let raw = Sym::Obj(vec![
                    (
                        "Entries".into(),
                        Sym::Arr(vec![Sym::Obj(vec![("EventId".into(), Sym::Ref("$.event_id".into()))])]),
                    ),
                    ("FailedEntryCount".into(), Sym::Lit(json!(0))),
                ]);
                (agent_name("bus", &bus), spec, detail, raw)
            }
            Service::Aws { service, action, params } => {
                let pinned = pinned_members(params.as_ref());
                let resources = aws_resources(&service, &pinned);
                let (base, mut spec) = self.aws_spec(here, &service, &action, &pinned, &resources);
                if callback {
                    let at = params.as_ref().map(token_paths).unwrap_or_default();
                    if at.is_empty() {
                        errs.push((
                            "Parameters".into(),
                            "a .waitForTaskToken task hands its token over: put $$.Task.Token in its Parameters".into(),
                        ));
                    }
                    self.notes.push(format!(
                        "{here}: the callback step's token goes in {} (the agent's task_token); the remote side answers \
                         with it on the project's callback queue or URL, or with sasctl complete, not with SendTaskSuccess",
                        at.join(", ")
                    ));
                    spec["task_token"] = json!(at);
                }
                if !parsed.is_empty() {
                    spec["parse_json"] = json!(parsed);
                    self.notes.push(format!(
                        "{here}: the answer's {} parsed by the agent (its parse_json), as the ResultSelector's States.StringToJson does",
                        parsed.join(", ")
                    ));
                }
                (base, spec, unpinned(params, &pinned), Sym::Ref("$".into()))
            }
            Service::Job { .. } => {
                errs.push(("Resource".into(), "a job run to completion is a loop step".into()));
                return;
            }
            Service::Items { params } => {
                let bucket = literal(Some(&params), "Bucket").ok().flatten();
                let listed = member(Some(&params), "Prefix").is_some() || member(Some(&params), "Key").is_none();
                let sources = match &bucket {
                    Some(b) if listed => vec![format!("arn:aws:s3:::{b}"), format!("arn:aws:s3:::{b}/*")],
                    Some(b) => vec![format!("arn:aws:s3:::{b}/*")],
                    None => {
                        self.notes.push(format!(
                            "{here}: the items' bucket is read from the data: the s3_items agent's sources are every \
                             bucket (arn:aws:s3:::*): narrow them to the buckets the tasks name"
                        ));
                        vec!["arn:aws:s3:::*".to_owned(), "arn:aws:s3:::*/*".to_owned()]
                    }
                };
                let spec = json!({"kind": "s3_items", "work_bucket": MAP_BUCKET, "sources": sources});
                (agent_name("items", bucket.as_deref().unwrap_or("any")), spec, params, Sym::Ref("$".into()))
            }
            Service::Http { url, method, body, api } => {
                let mut spec = json!({"kind": "http", "url": url, "method": method, "payload": "input"});
                let raw = Sym::Obj(vec![
                    ("ResponseBody".into(), Sym::Ref("$".into())),
                    ("StatusCode".into(), Sym::Lit(json!(200))),
                    ("StatusText".into(), Sym::Lit(json!("OK"))),
                ]);
                self.notes.push(match api {
                    None => format!(
                        "{here}: the HTTP task's connection (Authentication) is not translated: give the agent its headers from \
                         Secrets Manager or SSM, or sign it (see the http kind); a 2xx answer is StatusCode 200 here"
                    ),
                    Some(ApiAuth::Signed) => {
                        spec["sign"] = json!({"service": "execute-api"});
                        format!(
                            "{here}: the API is called signed for execute-api by the Agent function's role (the task's \
                             Credentials are not assumed): grant it with the template parameter AgentSignedApiArns; \
                             a 2xx answer is StatusCode 200 here, without its Headers"
                        )
                    }
                    Some(ApiAuth::Open) => {
                        format!("{here}: a 2xx answer is StatusCode 200 here, without its Headers")
                    }
                });
                (
                    agent_name("http", url.split('?').next().unwrap_or(&url)),
                    spec,
                    body.unwrap_or(Sym::Lit(json!({}))),
                    raw,
                )
            }
        };
        // a message sent and not waited for: a call step sending the message alone; a callback's
        // answer is the worker's output
        let (agent, spec, answer) = match (spec["kind"].as_str(), callback) {
            (Some("sqs" | "sns" | "eventbridge"), false) => {
                let mut spec = spec;
                spec["payload"] = json!("input");
                (format!("{agent}.send"), spec, answer)
            }
            (Some("sqs" | "sns" | "eventbridge"), true) => (agent, spec, Sym::Ref("$".into())),
            _ => (agent, spec, answer),
        };
        *raw = answer;
        let agent = self.agent_named(here, &agent, &spec);
        // an aws agent puts the token in the request itself (its task_token, noted above)
        let in_request = spec["kind"] == "aws";
        if callback {
            s["kind"] = json!("callback");
            if !in_request {
                self.notes.push(format!(
                    "{here}: a worker answers with the token of the project's callback (the request's callback.token, \
                     answered on the callback queue or URL, or with sasctl), not with SendTaskSuccess"
                ));
            }
        }
        let (sent, dropped) = without_token(sent);
        match (dropped, callback) {
            (true, true) if !in_request => self.notes.push(format!(
                "{here}: $$.Task.Token is left out of what is sent: the token is the request's callback.token"
            )),
            (true, false) => {
                errs.push(("Parameters".into(), "$$.Task.Token belongs to a .waitForTaskToken task".into()));
            }
            _ => {}
        }
        if let Some(t) = kept(sent.template().map_err(|e| ("Parameters".to_owned(), e)), errs) {
            s["parameters"] = t;
        }
        s["agent"] = json!(agent);
    }

    /// `Retry` as the step's attempts and backoff: `max_attempts` is 1 + `MaxAttempts`,
    /// `backoff` is `IntervalSeconds` (its `base_ms`), `BackoffRate` (its `multiplier`) and
    /// `MaxDelaySeconds` (its `max_ms`). A step here has one count of attempts and retries every
    /// failure that may pass (a function's error, Lambda's throttling or 5xx, a timeout): the
    /// retrier with the most attempts gives them, and every way that differs is noted.
    fn retry(&mut self, here: &str, st: &Map<String, Value>, s: &mut Value) -> Result<(), (String, String)> {
        let Some(retriers) = st.get("Retry") else { return Ok(()) };
        let Value::Array(retriers) = retriers else {
            return Err(("Retry".into(), "Retry is a list of retriers".into()));
        };
        let mut parsed = Vec::new();
        for (i, r) in retriers.iter().enumerate() {
            parsed.push(Retrier::of(r).map_err(|e| (format!("Retry[{i}]"), e))?);
        }
        // the most attempts (the first of those with as many), so that no error Step Functions
        // retries gets fewer here
        let Some(best) = parsed.iter().reduce(|a, b| if b.attempts > a.attempts { b } else { a }) else {
            return Ok(());
        };
        let all: Vec<&str> = parsed.iter().flat_map(|r| r.errors.iter().map(String::as_str)).collect();
        let every = all.contains(&"States.ALL");
        if best.attempts == 0 {
            if parsed.len() > 1 || !every {
                self.notes.push(format!("{here}: no retrier has attempts (MaxAttempts 0): the step is not retried"));
            }
            return Ok(());
        }
        let most = sas_protocol::workflow::MAX_BACKOFF_MS;
        let interval_ms = best.interval.saturating_mul(1000);
        let max_ms = best.max_delay.map_or(most, |d| d.saturating_mul(1000).min(most));
        let base_ms = interval_ms.min(max_ms);
        let multiplier = best.rate.clamp(1.0, 10.0);
        s["max_attempts"] = json!(best.attempts.saturating_add(1));
        s["backoff"] = json!({"base_ms": base_ms, "max_ms": max_ms, "multiplier": multiplier});
        let mut said = vec![format!(
            "{} attempts, the waits from {} s, ×{} each{}",
            best.attempts + 1,
            base_ms / 1000,
            multiplier,
            if max_ms < most || best.max_delay.is_some() {
                format!(", at most {} s", max_ms / 1000)
            } else {
                String::new()
            },
        )];
        if interval_ms > max_ms && best.max_delay.is_none() {
            said.push(format!(
                "IntervalSeconds {} is over the longest wait between attempts here ({} s): the waits are {} s at most",
                best.interval,
                most / 1000,
                most / 1000
            ));
        }
        if (best.rate - multiplier).abs() > f64::EPSILON {
            said.push(format!("BackoffRate {} is {multiplier} here (a backoff's multiplier is 1 to 10)", best.rate));
        }
        said.push(match best.jitter.as_deref() {
            Some("FULL") => {
                "each wait between half and all of that (equal jitter; JitterStrategy FULL waits from none to all)"
                    .to_owned()
            }
            _ => "each wait between half and all of Step Functions' (equal jitter)".to_owned(),
        });
        if parsed.len() > 1 {
            said.push(format!(
                "its {} retriers are one count of attempts here (Step Functions counts each apart)",
                parsed.len()
            ));
        }
        // the errors retried: the retriers' names and kinds (retry_on), unless one retries every
        // failure that may pass
        let named: Vec<&str> = all.iter().copied().filter(|e| !e.starts_with("States.")).collect();
        let task_failed = all.contains(&"States.TaskFailed");
        // Lambda's own errors the agent cannot always name (a connection, a 5xx): every failure
        // that may pass
        let lambda_own = named.iter().any(|e| {
            matches!(*e, "Lambda.ServiceException" | "Lambda.AWSLambdaException" | "Lambda.SdkClientException")
        });
        if !every && !task_failed {
            let mut on: Vec<String> = Vec::new();
            if lambda_own {
                on.push("retryable".into());
                said.push(
                    "Lambda's own errors (a 5xx, a connection) are every failure that may pass here: a function's \
                     error is retried too"
                        .into(),
                );
            }
            if all.contains(&"States.Timeout") || all.contains(&"States.HeartbeatTimeout") {
                on.push("timed_out".into());
            }
            for n in &named {
                if sas_protocol::workflow::Handled::parse(n)
                    .is_some_and(|h| matches!(h, sas_protocol::workflow::Handled::Error(_)))
                {
                    on.push((*n).to_owned());
                }
            }
            s["retry_on"] = json!(on);
            if !named.is_empty() && !lambda_own {
                said.push(format!(
                    "only {} retried (and timeouts when a retrier names States.Timeout)",
                    named.join(", ")
                ));
            }
        } else if !every && !all.contains(&"States.Timeout") {
            said.push("a timeout is retried too (no retrier names States.Timeout)".into());
        }
        if every || all.contains(&"States.TaskFailed") || named.iter().any(|e| is_permanent_name(e)) {
            said.push(
                "a function's PermanentError, or a call refused (a missing function, access denied), is not retried"
                    .into(),
            );
        }
        self.notes.push(format!("{here}: Retry: {}", said.join("; ")));
        Ok(())
    }

    /// `Catch` as a handled failure: the kinds and error names the step continues on, the guard of
    /// its normal path, and each catcher's way (its state, its guard, its `ResultPath`, its
    /// `Assign`, and the error's name when it catches one name alone).
    #[allow(clippy::type_complexity)]
    fn catch(
        &mut self,
        here: &str,
        st: &Map<String, Value>,
        step: &str,
        s: &mut Value,
    ) -> Result<(Cond, Vec<Catcher>), (String, String)> {
        let Some(Value::Array(catchers)) = st.get("Catch") else { return Ok((Cond::True, Vec::new())) };
        let out = format!("$.outputs.{step}.error.kind");
        let name_at = format!("$.outputs.{step}.error.name");
        let failed = Cond::When(json!({"variable": out, "is_present": true}));
        let kind_is = |k: &str| Cond::When(json!({"variable": out, "string_equals": k}));
        let name_is = |n: &str| Cond::When(json!({"variable": name_at, "string_equals": n}));
        let mut kinds: BTreeSet<&'static str> = BTreeSet::new();
        let mut names: Vec<String> = Vec::new();
        // what the catchers before take: a later catcher takes what is left
        let mut taken = Cond::False;
        let mut ways = Vec::new();
        for (i, c) in catchers.iter().enumerate() {
            let Some(c) = c.as_object() else { return Err((format!("Catch[{i}]"), "a catcher is an object".into())) };
            let Some(to) = c.get("Next").and_then(Value::as_str) else {
                return Err((format!("Catch[{i}]"), "a catcher names its Next".into()));
            };
            let errors: Vec<&str> = c
                .get("ErrorEquals")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut matches = Cond::False;
            let mut new = false;
            let mut its_names = Vec::new();
            let mut by_kind = false;
            for e in &errors {
                let of_kinds: &[&'static str] = match *e {
                    "States.ALL" => &["retryable", "permanent", "timed_out"],
                    "States.Timeout" | "States.HeartbeatTimeout" => &["timed_out"],
                    "States.TaskFailed" => &["retryable", "permanent"],
                    other if other.starts_with("States.") => {
                        self.notes.push(format!(
                            "{here}: the catcher for {other} cannot tell that error from another here: it catches every failure of the task's own"
                        ));
                        &["retryable", "permanent"]
                    }
                    // an error named as the agent names it (S3.NoSuchKeyException, a function's
                    // CustomError): caught by its name
                    other => {
                        let all_taken = kinds.contains("retryable") && kinds.contains("permanent");
                        if !all_taken && !names.iter().any(|n| n == other) {
                            names.push(other.to_owned());
                            new = true;
                        }
                        its_names.push(other.to_owned());
                        matches = matches.or(name_is(other));
                        continue;
                    }
                };
                by_kind = true;
                for k in of_kinds {
                    new |= kinds.insert(k);
                }
                matches = matches.or(if of_kinds.len() == 3 {
                    failed.clone()
                } else {
                    of_kinds.iter().fold(Cond::False, |acc, k| acc.or(kind_is(k)))
                });
            }
            if !new {
                self.notes
                    .push(format!("{here}: Catch[{i}] is never taken here (the catchers before it take its errors)"));
                continue;
            }
            let cond = matches.clone().and(taken.clone().negated());
            taken = taken.or(matches);
            let name = match (by_kind, its_names.as_slice()) {
                (false, [one]) => Some(one.clone()),
                _ => None,
            };
            ways.push((to.to_owned(), cond, c.get("ResultPath").cloned(), c.get("Assign").cloned(), name));
        }
        let handled: Vec<&str> = kinds.iter().copied().chain(names.iter().map(String::as_str)).collect();
        s["on_failure"] = if kinds.len() == 3 { json!("continue") } else { json!({"continue": handled}) };
        self.notes.push(format!(
            "{here}: a caught error's Error is its name when the catcher names one error (S3.NoSuchKeyException, a \
             function's CustomError), else the failure's kind (retryable, permanent, timed_out); its Cause the message"
        ));
        // every guard that only a handled failure makes false
        let ok = Cond::When(json!({"variable": out, "is_present": true})).negated();
        Ok((ok, ways))
    }

    fn parallel(&mut self, here: &str, st: &Map<String, Value>, m: Arrival, scope: Scope) -> Result<Arrival, Blocked> {
        // every field that cannot be translated is named, and the branches are checked all the same
        let mut errs = Vec::new();
        for f in ["Retry", "Catch"] {
            if st.contains_key(f) {
                errs.push((
                    f.to_owned(),
                    format!("{f} on a Parallel state is not translated yet: put it on the tasks of its branches"),
                ));
            }
        }
        let input = kept(io(st, &m.doc, "InputPath"), &mut errs).unwrap_or_else(|| m.doc.clone());
        let input = match st.get("Parameters") {
            Some(p) => kept(template(p, &input, &m.vars, scope).map_err(|e| ("Parameters".to_owned(), e)), &mut errs)
                .unwrap_or(input),
            None => input,
        };
        // each branch is a task of its own here: a UUID named by the task would be another in each
        if format!("{input:?}{:?}", m.vars).contains("States.UUID($.task.id") {
            errs.push((
                "Branches".into(),
                "a States.UUID() made before this Parallel reaches its branches: each branch is a task of its own \
                 here, and would name another UUID; make the UUID in a Task before it"
                    .into(),
            ));
        }
        let Some(Value::Array(branches)) = st.get("Branches") else {
            errs.push(("Branches".into(), "a Parallel state has Branches".into()));
            return Err(Blocked(errs));
        };
        let mut outputs = Vec::new();
        let mut after = BTreeSet::new();
        for (i, b) in branches.iter().enumerate() {
            let (Some(Value::Object(states)), Some(start)) =
                (b.get("States"), b.get("StartAt").and_then(Value::as_str))
            else {
                errs.push((format!("Branches[{i}]"), "a branch has StartAt and States".into()));
                continue;
            };
            let entry = Arrival { doc: input.clone(), ..m.clone() };
            let Some(ends) = self.block(&format!("{here}/branch {i}/"), states, start, entry, scope) else {
                errs.push((format!("Branches[{i}]"), "(see the refusals inside it)".into()));
                continue;
            };
            if ends.is_empty() {
                errs.push((format!("Branches[{i}]"), "the branch never succeeds".into()));
                continue;
            }
            outputs.push(Sym::one_of(ends.iter().map(|e| (e.full.clone(), e.doc.clone())).collect()));
            for e in &ends {
                if e.after.is_empty() {
                    after.extend(m.after.iter().cloned());
                } else {
                    after.extend(e.after.iter().cloned());
                }
            }
        }
        if !errs.is_empty() {
            return Err(Blocked(errs));
        }
        let mut result = Sym::Arr(outputs);
        // Assign reads the branches' outputs, before ResultSelector (a branch's own variables
        // stay in it)
        let vars = assign(st.get("Assign"), &result, &m.vars)?;
        if let Some(sel) = st.get("ResultSelector") {
            result = template(sel, &result, &m.vars, scope).map_err(|e| ("ResultSelector".to_owned(), e))?;
        }
        let doc = result_path(st, m.doc.clone(), result)?;
        let doc = io(st, &doc, "OutputPath")?;
        let from_start = after.is_empty() && m.from_start;
        Ok(Arrival { full: m.full.clone(), local: m.full, doc, after, from_start, vars })
    }

    fn map(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: &Arrival,
        scope: Scope,
    ) -> Result<Arrival, Blocked> {
        if scope == Scope::Element {
            return Err(Blocked::from((
                "Type".to_owned(),
                "a Map inside a Map is not translated: a map here runs one step per element".to_owned(),
            )));
        }
        // every field that cannot be translated is named, and the processor is checked all the same
        let mut errs = Vec::new();
        if st.contains_key("ItemBatcher") && !st.contains_key("ItemReader") {
            errs.push((
                "ItemBatcher".to_owned(),
                "batches of the task's own items are not translated yet (batches of items read from S3 are): each \
                 item is an element of its own here"
                    .to_owned(),
            ));
        }
        for f in ["ToleratedFailureCountPath", "ToleratedFailurePercentagePath", "ItemsPointer"] {
            if st.contains_key(f) {
                errs.push((
                    f.to_owned(),
                    "read from the data: not translated (write the value in the definition)".into(),
                ));
            }
        }
        for f in ["Retry", "Catch"] {
            if st.contains_key(f) {
                errs.push((f.to_owned(), format!("{f} on a Map state is not translated yet: put Retry on its task; map.tolerated_failures says how many elements may fail")));
            }
        }
        let processor = st.get("ItemProcessor").or_else(|| st.get("Iterator")).and_then(Value::as_object);
        let Some(processor) = processor else {
            errs.push(("ItemProcessor".into(), "a Map state has an ItemProcessor".into()));
            return Err(Blocked(errs));
        };
        if let Some(reader) = st.get("ItemReader") {
            let (steps, children) = (self.steps.len(), self.children.len());
            let done = self.distributed(here, name, st, m, reader, processor);
            if let (Ok(_), true) = (&done, errs.is_empty()) {
                return done;
            }
            self.steps.truncate(steps);
            self.children.truncate(children);
            // the processor was checked unless the reader was refused first: then it is below
            let reader_refused = done.as_ref().err().is_some_and(|e| e.0.iter().any(|(f, _)| f == "ItemReader"));
            errs.extend(done.err().map(|e| e.0).unwrap_or_default());
            if !reader_refused {
                return Err(Blocked(errs));
            }
        }
        if processor.get("ProcessorConfig").and_then(|c| c.get("Mode")).and_then(Value::as_str) == Some("DISTRIBUTED") {
            self.notes.push(format!(
                "{here}: a Distributed Map over the task's data is a map here: each element a child task, at most 10,000"
            ));
        }
        // the execution's id and name are the task's ($.task.root), in an element too; its input is not
        let text = Value::Object(processor.clone()).to_string();
        let reads_execution = text
            .match_indices("$$.Execution")
            .any(|(at, m)| !(text[at + m.len()..].starts_with(".Id") || text[at + m.len()..].starts_with(".Name")));
        if reads_execution {
            errs.push((
                "ItemProcessor".into(),
                "the processor reads $$.Execution's input (or start time); an element here reads its item and \
                 what its ItemSelector gives it: pass what it needs through the ItemSelector"
                    .into(),
            ));
        }
        // a processor of Pass states whose results are dropped (ResultPath null) does nothing a
        // task could see: no step (the sample machines' placeholder "DoSomething")
        let does_nothing = processor.get("States").and_then(Value::as_object).is_some_and(|states| {
            states.values().all(|x| matches!(x.get("Type").and_then(Value::as_str), Some("Pass" | "Succeed")))
        }) && st.get("ResultPath") == Some(&Value::Null)
            && !st.contains_key("Assign");
        if errs.is_empty() && does_nothing {
            self.notes.push(format!(
                "{here}: its processor only passes data and its result is dropped (ResultPath null): no step"
            ));
            let doc = io(st, &m.doc, "OutputPath").map_err(Blocked::from)?;
            return Ok(Arrival { doc, ..m.clone() });
        }
        if errs.is_empty() {
            return self.map_processor(here, name, st, m, processor).map_err(Blocked::from);
        }
        // what inside the processor cannot be translated either (its refusals), the rest dropped
        let (steps, children) = (self.steps.len(), self.children.len());
        if let Err(e) = self.map_processor(here, name, st, m, processor) {
            errs.push(e);
        }
        self.steps.truncate(steps);
        self.children.truncate(children);
        Err(Blocked(errs))
    }

    /// A Map's processor: a map of its one task, or a workflow of its own run per element.
    fn map_processor(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: &Arrival,
        processor: &Map<String, Value>,
    ) -> Result<Arrival, (String, String)> {
        let states = processor.get("States").and_then(Value::as_object).cloned().unwrap_or_default();
        let start = processor.get("StartAt").and_then(Value::as_str).unwrap_or("");
        let task = states.get(start).and_then(Value::as_object);
        // one Task, without a Catch and with the task's result as the element's: a map of that
        // call step; anything else becomes a workflow of its own, run once per element
        let single = states.len() == 1
            && task.is_some_and(|t| {
                t.get("Type").and_then(Value::as_str) == Some("Task")
                    && !["Catch", "ResultPath", "OutputPath", "ResultSelector"].iter().any(|f| t.contains_key(*f))
            });
        let input = io(st, &m.doc, "InputPath")?;
        let items = match st.get("ItemsPath").and_then(Value::as_str) {
            Some(p) => super::data::get(&input, p).map_err(|e| ("ItemsPath".to_owned(), e))?,
            None => input.clone(),
        };
        let Sym::Ref(items) = items else {
            return Err((
                "ItemsPath".into(),
                "the items are built by the state machine; a map here reads its array from the task".into(),
            ));
        };
        let element = match st.get("ItemSelector").or_else(|| st.get("Parameters")) {
            Some(sel) => template(sel, &input, &m.vars, Scope::Element).map_err(|e| ("ItemSelector".into(), e))?,
            None => Sym::Ref("$.input.item".into()),
        };
        // a map of a call step fills its parameters in the element, from the item alone; reading
        // beside it, the processor becomes a workflow (whose parameters are filled from the task)
        let single =
            single && element.paths().iter().all(|p| p.starts_with("$.input.item") || p.starts_with("$.input.index"));
        // a path that names many values (Rows[1:]) is the map's items as it is
        let items = if parse_path(&items).is_ok() { pointer(&items) } else { items };
        let mut spec = json!({"items": items});
        let concurrency = st.get("MaxConcurrency").and_then(Value::as_u64).unwrap_or(0);
        let most = u64::from(sas_protocol::workflow::MAX_MAP_CONCURRENCY);
        spec["max_concurrency"] = json!(if concurrency == 0 { most } else { concurrency.min(most) });
        if concurrency == 0 || concurrency > most {
            self.notes.push(format!("{here}: MaxConcurrency {concurrency} is {most} here (a map's most at once)"));
        }
        if let Some(t) = tolerance(st)? {
            spec["tolerated_failures"] = t;
        }
        if !single {
            return self.map_of_a_workflow(here, name, st, m, processor, &element, spec);
        }
        // the element's processor reads its item, not the variables around the map
        let entry = Arrival {
            doc: element,
            after: BTreeSet::new(),
            from_start: true,
            full: Cond::True,
            local: Cond::True,
            vars: Vars::new(),
        };
        let before = self.steps.len();
        let ends = self
            .block(&format!("{here}/"), &states, start, entry, Scope::Element)
            .ok_or(("ItemProcessor".to_owned(), "(see the refusals inside it)".to_owned()))?;
        let mut s = self
            .steps
            .pop()
            .filter(|_| self.steps.len() == before)
            .ok_or(("ItemProcessor".to_owned(), "the processor is one task".to_owned()))?;
        let inner = s["name"].as_str().unwrap_or_default().to_owned();
        self.names.remove(&inner);
        let step = self.step_name(name);
        let element_out = format!("$.outputs.{inner}");
        if ends.len() != 1 || ends[0].doc != Sym::Ref(element_out.clone()) {
            return Err((
                "ItemProcessor".into(),
                "the element's output is more than its task's result (a ResultPath or OutputPath in the processor): not yet translated".into(),
            ));
        }
        let base = step_base(&step, m);
        for k in ["name", "after", "when"] {
            match base.get(k) {
                Some(v) => s[k] = v.clone(),
                None => {
                    if let Some(o) = s.as_object_mut() {
                        o.remove(k);
                    }
                }
            }
        }
        s["map"] = spec;
        self.steps.push(s);
        self.map_output(here, name, st, m, &step)
    }

    /// What follows a Map state: its `ResultSelector`, `ResultPath` and `OutputPath` over the map
    /// step's output (the elements' outputs in order); with a `ResultWriter`, the outputs written
    /// to S3 first, and the map's output where they are.
    fn map_output(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: &Arrival,
        step: &str,
    ) -> Result<Arrival, (String, String)> {
        let first = |b: Blocked| b.0.into_iter().next().unwrap_or_default();
        let (result, m) = match writer(st)? {
            Some(w) => {
                let all = Arrival { doc: Sym::Ref(format!("$.outputs.{step}")), ..after_step(m, step, Cond::True) };
                let key = w.key("SUCCEEDED_0.json");
                let write = json!({"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:putObject",
                    "Parameters": {"Bucket": w.bucket, "Key.$": key, "Body.$": "$", "ContentType": "application/json"},
                    "ResultPath": null, "TimeoutSeconds": 60, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 3}]});
                let at = self
                    .synthetic(&format!("{here} results"), &format!("{name} results"), &write, &all)
                    .map_err(first)?;
                let files = Sym::Arr(vec![template(&json!({"Key.$": key}), &at.doc, &at.vars, Scope::Task)
                    .map_err(|e| ("ResultWriter".to_owned(), e))?]);
                self.manifest(here, name, &w, files, &at, &m.doc).map_err(first)?
            }
            None => (Sym::Ref(format!("$.outputs.{step}")), after_step(m, step, Cond::True)),
        };
        Self::after_map(st, &m, result)
    }

    /// `ResultSelector`, `ResultPath` and `OutputPath` over what a map gives, `m` the arrival after
    /// its last step (with the data before the map).
    fn after_map(st: &Map<String, Value>, m: &Arrival, mut result: Sym) -> Result<Arrival, (String, String)> {
        // Assign reads the map's output, before ResultSelector
        let vars = assign(st.get("Assign"), &result, &m.vars)?;
        if let Some(sel) = st.get("ResultSelector") {
            result = template(sel, &result, &m.vars, Scope::Task).map_err(|e| ("ResultSelector".into(), e))?;
        }
        let doc = result_path(st, m.doc.clone(), result)?;
        let doc = io(st, &doc, "OutputPath")?;
        Ok(Arrival { doc, vars, ..m.clone() })
    }

    /// A step of the importer's own, translated from the state `state` (a `Task`) arriving at
    /// `m`: the arrival after it.
    fn synthetic(&mut self, here: &str, name: &str, state: &Value, m: &Arrival) -> Result<Arrival, Blocked> {
        let st = state.as_object().cloned().unwrap_or_default();
        let arrivals = self.task(here, name, &st, m, Scope::Task, To::End)?;
        arrivals
            .into_iter()
            .next()
            .map(|(_, a)| a)
            .ok_or_else(|| Blocked::from((name.to_owned(), "(no way out)".to_owned())))
    }

    /// A `ResultWriter`'s manifest (`files`: the result files, `[{"Key": ...}]`) written after the
    /// map, arriving at `m` with the map's output; what the map then gives, as Step Functions:
    /// `{"MapRunArn", "ResultWriterDetails": {"Bucket", "Key"}}` (the run named by the task).
    fn manifest(
        &mut self,
        here: &str,
        name: &str,
        w: &Writer,
        files: Sym,
        m: &Arrival,
        before: &Sym,
    ) -> Result<(Sym, Arrival), Blocked> {
        let key = w.key("manifest.json");
        let body = Sym::Obj(vec![
            ("DestinationBucket".into(), Sym::Lit(json!(w.bucket))),
            ("MapRunArn".into(), Sym::Ref("$.task.root".into())),
            (
                "ResultFiles".into(),
                Sym::Obj(vec![
                    ("FAILED".into(), Sym::Lit(json!([]))),
                    ("PENDING".into(), Sym::Lit(json!([]))),
                    ("SUCCEEDED".into(), files),
                ]),
            ),
        ]);
        let at = Arrival { doc: Sym::Obj(vec![("manifest".into(), body)]), ..m.clone() };
        let write = json!({"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:putObject",
            "Parameters": {"Bucket": w.bucket, "Key.$": key, "Body.$": "$.manifest", "ContentType": "application/json"},
            "ResultPath": null, "TimeoutSeconds": 60, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 3}]});
        let after = self.synthetic(&format!("{here} manifest"), &format!("{name} manifest"), &write, &at)?;
        let details =
            json!({"MapRunArn.$": "$$.Execution.Id", "ResultWriterDetails": {"Bucket": w.bucket, "Key.$": key}});
        let result = template(&details, &m.doc, &m.vars, Scope::Task)
            .map_err(|e| Blocked::from(("ResultWriter".to_owned(), e)))?;
        self.notes.push(format!(
            "{here}: its results are written to s3://{}/{}<task>/ with a manifest.json, as Step Functions' ResultWriter \
             (each file an array of the elements' outputs, not of execution records)",
            w.bucket, w.prefix
        ));
        Ok((result, Arrival { doc: before.clone(), ..after }))
    }

    /// A Map whose processor is more than one task: the processor becomes a workflow of its own
    /// (`<workflow>.<step>`, translated as a state machine whose input is the element), and the
    /// Map a workflow step run once per element, its `parameters` the element's input.
    #[allow(clippy::too_many_arguments)]
    fn map_of_a_workflow(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: &Arrival,
        processor: &Map<String, Value>,
        element: &Sym,
        spec: Value,
    ) -> Result<Arrival, (String, String)> {
        let step = self.step_name(name);
        // at most 64 characters: the workflow's name shortened, the step's kept (counted in
        // characters, so that a name given to `import` by a caller is never cut inside one)
        let keep = 64usize.saturating_sub(step.chars().count() + 1);
        let child_name: String =
            format!("{}.{step}", self.workflow.chars().take(keep).collect::<String>()).chars().take(64).collect();
        let machine = json!({
            "StartAt": processor.get("StartAt").cloned().unwrap_or(Value::Null),
            "States": processor.get("States").cloned().unwrap_or(Value::Null),
        });
        let child = match import_with(&child_name, &machine, self.options) {
            Ok(child) => child,
            Err(refusals) => {
                for r in refusals {
                    let state =
                        if r.state == "(state machine)" { here.to_owned() } else { format!("{here}/{}", r.state) };
                    self.refusals.push(Refusal { state, ..r });
                }
                return Err(("ItemProcessor".to_owned(), "(see the refusals inside it)".to_owned()));
            }
        };
        self.notes.push(format!(
            "{here}: its processor is the workflow {child_name}, run once per element as a child task (its own steps, \
             retries and compensations; the map's output is their results in order)"
        ));
        self.adopt(here, &child_name, child);
        let mut s = step_base(&step, m);
        s["kind"] = json!("workflow");
        s["workflow"] = json!(child_name);
        s["version"] = json!(1);
        s["parameters"] = element.template().map_err(|e| ("ItemSelector".to_owned(), e))?;
        s["map"] = spec;
        self.steps.push(s);
        self.map_output(here, name, st, m, &step)
    }
}

/// The private `Resource` of the state that reads a Distributed Map's items (the `s3_items` kind).
const ITEMS_RESOURCE: &str = "(sas:s3_items)";
/// The bucket the `s3_items` agents write their pages to: a variable of the agents file
/// (`AgentVariables`: `MAP_BUCKET=...`).
const MAP_BUCKET: &str = "${MAP_BUCKET}";
/// Items of one page run at once, and pages at once, for a Distributed Map's `MaxConcurrency`.
const PAGE_CONCURRENCY: u64 = 10;

/// A Map's `ResultWriter`: the bucket and the prefix its results are written under.
struct Writer {
    bucket: String,
    /// Empty, or ending in `/`.
    prefix: String,
}

impl Writer {
    /// The key of the file `file` of a task's results, as a `States.Format` of the task's id.
    fn key(&self, file: &str) -> String {
        format!("States.Format('{}{{}}/{file}', $$.Execution.Id)", self.prefix)
    }
}

/// `ResultWriter` (`s3:putObject` to a bucket and prefix written in the definition), if any.
fn writer(st: &Map<String, Value>) -> Result<Option<Writer>, (String, String)> {
    let Some(w) = st.get("ResultWriter") else { return Ok(None) };
    let refuse = |why: String| ("ResultWriter".to_owned(), why);
    let resource = w.get("Resource").and_then(Value::as_str).unwrap_or("");
    if !resource.ends_with(":::s3:putObject") {
        return Err(refuse(format!("{resource:?}: results are written here with s3:putObject")));
    }
    if w.get("WriterConfig").is_some() {
        return Err(refuse("WriterConfig (OutputType, Transformation) is not translated".into()));
    }
    let params = w.get("Parameters").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(k) = params.keys().find(|k| k.ends_with(".$")) {
        return Err(refuse(format!("{k}: a bucket or prefix read from the data is not translated: write it")));
    }
    let text = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_owned);
    let bucket =
        text("Bucket").filter(|b| !b.is_empty()).ok_or_else(|| refuse("ResultWriter names its Bucket".into()))?;
    let mut prefix = text("Prefix").unwrap_or_default();
    if prefix.contains(['{', '}', '\'', '\\']) {
        return Err(refuse(format!("the prefix {prefix:?} holds a character States.Format takes as its own")));
    }
    if !prefix.is_empty() && !prefix.ends_with('/') {
        prefix.push('/');
    }
    Ok(Some(Writer { bucket, prefix }))
}

/// `ToleratedFailureCount` or `ToleratedFailurePercentage` as a map's `tolerated_failures`.
fn tolerance(st: &Map<String, Value>) -> Result<Option<Value>, (String, String)> {
    match (st.get("ToleratedFailureCount"), st.get("ToleratedFailurePercentage")) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err((
            "ToleratedFailureCount".into(),
            "a count and a percentage of tolerated failures together are not translated: give one".into(),
        )),
        (Some(c), None) => c
            .as_u64()
            .filter(|c| u32::try_from(*c).is_ok())
            .map(|c| Some(json!(c)))
            .ok_or(("ToleratedFailureCount".into(), format!("{c} is not a count"))),
        (None, Some(p)) => p
            .as_f64()
            .filter(|p| (0.0..=100.0).contains(p))
            // a share here is whole percents, rounded down (Step Functions takes a fraction)
            .map(|p| Some(json!(format!("{}%", p.floor()))))
            .ok_or(("ToleratedFailurePercentage".into(), format!("{p} is not a percentage"))),
    }
}

impl Cx {
    /// A Distributed Map whose items are read from S3 (`ItemReader`): a step of the `s3_items`
    /// kind reads them once and writes them as pages to the work bucket, and the map runs one
    /// child task per page (the workflow `<workflow>.<map>`), which reads its page and maps its
    /// items over the processor. No task holds more than a page.
    fn distributed(
        &mut self,
        here: &str,
        name: &str,
        st: &Map<String, Value>,
        m: &Arrival,
        reader: &Value,
        processor: &Map<String, Value>,
    ) -> Result<Arrival, Blocked> {
        let refuse = |field: &str, why: String| Blocked(vec![(field.to_owned(), why)]);
        let resource = reader.get("Resource").and_then(Value::as_str).unwrap_or("");
        let action = resource.rsplit(":::").next().unwrap_or("");
        let config = reader.get("ReaderConfig").cloned().unwrap_or(json!({}));
        match (action, config.get("InputType").and_then(Value::as_str)) {
            ("s3:getObject", None | Some("JSON" | "JSONL" | "CSV")) | ("s3:listObjectsV2", None) => {}
            ("s3:getObject", Some(other)) => {
                return Err(refuse("ItemReader", format!("InputType {other} is not read here (JSON, JSONL, CSV)")))
            }
            _ => {
                return Err(refuse(
                    "ItemReader",
                    format!(
                        "{resource:?}: items are read here from s3:getObject (JSON, JSONL, CSV) or s3:listObjectsV2"
                    ),
                ))
            }
        }
        if config.get("MaxItemsPath").is_some() {
            return Err(refuse("ItemReader", "MaxItemsPath is not translated: give MaxItems".into()));
        }
        // the processor's items and index are a page's: an index would be the item's in its page
        let text = Value::Object(processor.clone()).to_string()
            + &st.get("ItemSelector").or_else(|| st.get("Parameters")).map(Value::to_string).unwrap_or_default();
        if text.contains("$$.Map.Item.Index") {
            return Err(refuse(
                "ItemSelector",
                "$$.Map.Item.Index is not translated for items read from S3 (each page of items is mapped on its own)"
                    .into(),
            ));
        }
        let input = io(st, &m.doc, "InputPath").map_err(Blocked::from)?;
        // 1. the items read once and written as pages (of batches, with an ItemBatcher)
        let mut params = reader.get("Parameters").cloned().unwrap_or(json!({}));
        if let Some(o) = params.as_object_mut() {
            o.insert("ReaderConfig".into(), config.clone());
        }
        let mut selector = st.get("ItemSelector").or_else(|| st.get("Parameters")).cloned();
        if let Some(batcher) = st.get("ItemBatcher").and_then(Value::as_object) {
            if selector.is_some() {
                return Err(refuse(
                    "ItemSelector",
                    "an ItemSelector with an ItemBatcher is not translated (it would apply to each item of a batch)"
                        .into(),
                ));
            }
            if let Some(f) = batcher.keys().find(|k| k.ends_with("Path")) {
                return Err(refuse("ItemBatcher", format!("{f} is not translated: write the value in the definition")));
            }
            let sizes: Map<String, Value> = ["MaxItemsPerBatch", "MaxInputBytesPerBatch"]
                .iter()
                .filter_map(|k| batcher.get(*k).map(|v| ((*k).to_owned(), v.clone())))
                .collect();
            if let Some(o) = params.as_object_mut() {
                o.insert("ItemBatcher".into(), Value::Object(sizes));
            }
            // what the processor gets: Step Functions' batch
            let mut batch = json!({"Items.$": "$$.Map.Item.Value"});
            if let Some(input) = batcher.get("BatchInput") {
                batch["BatchInput"] = input.clone();
            }
            selector = Some(batch);
        }
        let read = json!({"Type": "Task", "Resource": ITEMS_RESOURCE, "Parameters": params, "ResultPath": null,
            "TimeoutSeconds": CALL_LIMIT_S, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2}]});
        let after_read = self.synthetic(&format!("{here} items"), &format!("{name} items"), &read, m)?;
        let read_step = self.steps.last().and_then(|s| s["name"].as_str()).unwrap_or_default().to_owned();
        // 2. the page's workflow: its page read, its items mapped. What the selector reads beside
        // the item (the map's input, the context) is read in the parent, as each page's child is
        // made, and given to the page as its `ctx`; what reads the item is read in the page
        let mut beside = Map::new();
        if let Some(Value::Object(sel)) = selector.as_mut() {
            for (k, v) in std::mem::take(sel) {
                let text = v.to_string();
                let reads_item = text.contains("$$.Map.Item");
                let reads_beside = k.ends_with(".$")
                    && text
                        .match_indices('$')
                        .any(|(at, _)| !text[at..].starts_with("$$.Map.Item") && !text[..at].ends_with('$'))
                    || (v.is_object() && v.to_string().contains(".$\""));
                match (reads_item, reads_beside) {
                    (true, true) => {
                        return Err(refuse(
                            "ItemSelector",
                            format!("{k}: a value that reads the item and the map's input together is not translated for items read from S3"),
                        ))
                    }
                    (false, true) => {
                        let name = k.trim_end_matches(".$").to_owned();
                        sel.insert(format!("{name}.$"), json!(format!("$.ctx['{}']", name.replace('\'', "\\'"))));
                        beside.insert(k, v);
                    }
                    _ => {
                        sel.insert(k, v);
                    }
                }
            }
        }
        let concurrency = st.get("MaxConcurrency").and_then(Value::as_u64).filter(|c| *c > 0);
        let per_page = concurrency.map_or(PAGE_CONCURRENCY, |c| c.min(PAGE_CONCURRENCY));
        let most = u64::from(sas_protocol::workflow::MAX_MAP_CONCURRENCY);
        let pages_at_once = (concurrency.unwrap_or(most).min(most) / per_page).max(1);
        let writes = writer(st).map_err(Blocked::from)?;
        let mut inner = json!({"Type": "Map", "ItemsPath": "$.__page.items", "MaxConcurrency": per_page, "End": true,
            "ItemProcessor": processor});
        inner["ItemProcessor"]["ProcessorConfig"] = json!({"Mode": "INLINE"});
        if let Some(sel) = selector {
            inner["ItemSelector"] = sel;
        }
        for f in ["ToleratedFailureCount", "ToleratedFailurePercentage"] {
            if let Some(v) = st.get(f) {
                inner[f] = v.clone();
            }
        }
        let mut machine = json!({"StartAt": "Read page", "States": {
            "Read page": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:getObject",
                "Parameters": {"Bucket": MAP_BUCKET, "Key.$": "States.Format('{}{}.json', $.prefix, $.page)"},
                "ResultSelector": {"items.$": "States.StringToJson($.Body)"}, "ResultPath": "$.__page",
                "TimeoutSeconds": 60, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 3}], "Next": name},
        }});
        // a ResultWriter: each page writes its items' outputs, and gives the file's key
        if let Some(w) = &writes {
            inner.as_object_mut().map(|o| o.remove("End"));
            inner["ResultPath"] = json!("$.__results");
            inner["Next"] = json!("Write results");
            let key = format!("States.Format('{}{{}}/SUCCEEDED_{{}}.json', $$.Execution.Id, $.page)", w.prefix);
            machine["States"]["Write results"] = json!({"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:putObject",
                "Parameters": {"Bucket": w.bucket, "Key.$": key, "Body.$": "$.__results", "ContentType": "application/json"},
                "ResultPath": null, "TimeoutSeconds": 60, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 3}],
                "Next": "Written"});
            machine["States"]["Written"] = json!({"Type": "Pass", "Parameters": {"Key.$": key}, "End": true});
        }
        machine["States"][name] = inner;
        let step = self.step_name(name);
        // `<workflow>.<step>_pages` (the processor's own workflow, if any, is `<that>.<step>`)
        let keep = 64usize.saturating_sub(step.chars().count() + 7);
        let child_name: String =
            format!("{}.{step}_pages", self.workflow.chars().take(keep).collect::<String>()).chars().take(64).collect();
        let child = match import_with(&child_name, &machine, self.options) {
            Ok(child) => child,
            Err(refusals) => {
                for r in refusals {
                    let state = match r.state.as_str() {
                        "(state machine)" => here.to_owned(),
                        s => format!("{here}/{}", s.strip_prefix(&format!("{name}/")).unwrap_or(s)),
                    };
                    self.refusals.push(Refusal { state, ..r });
                }
                return Err(refuse("ItemProcessor", "(see the refusals inside it)".into()));
            }
        };
        self.adopt(here, &child_name, child);
        // 3. the map over the pages
        let mut element = vec![
            ("page".to_owned(), Sym::Ref("$.input.item".into())),
            ("prefix".to_owned(), Sym::Ref(format!("$.outputs.{read_step}.prefix"))),
        ];
        if !beside.is_empty() {
            let ctx = template(&Value::Object(beside), &input, &m.vars, Scope::Element)
                .map_err(|e| refuse("ItemSelector", e))?;
            element.push(("ctx".to_owned(), ctx));
        }
        let mut s = step_base(&step, &after_read);
        s["kind"] = json!("workflow");
        s["workflow"] = json!(child_name);
        s["version"] = json!(1);
        s["parameters"] = Sym::Obj(element).template().map_err(|e| refuse("ItemSelector", e))?;
        s["map"] = json!({"items": format!("/outputs/{read_step}/pages"), "max_concurrency": pages_at_once});
        self.steps.push(s);
        self.notes.push(format!(
            "{here}: its items are read from S3 by the s3_items agent {agent} (set MAP_BUCKET in AgentVariables: \
             the bucket its pages are written to), then mapped a page at a time: the workflow {child_name}, one child \
             task per page (about 2 KiB of items), up to {pages_at_once} pages and {per_page} items of each at once",
            agent = self.steps.iter().find(|s| s["name"] == read_step).and_then(|s| s["agent"].as_str()).unwrap_or("-"),
        ));
        if st.contains_key("ToleratedFailureCount") {
            self.notes.push(format!("{here}: ToleratedFailureCount is counted per page of items here"));
        }
        // the map's output: the pages' outputs, one array; or where the pages wrote them
        let after = after_step(m, &step, Cond::True);
        let (result, after) = if let Some(w) = &writes {
            let files = Sym::Ref(format!("$.outputs.{step}"));
            self.manifest(here, name, w, files, &after, &m.doc)?
        } else {
            // (no items: no page, and `[*][*]` would name nothing, which is null: the empty array)
            let none = Cond::When(json!({"variable": format!("$.outputs.{read_step}.count"), "numeric_equals": 0}));
            let all = Sym::Ref(format!("$.outputs.{step}[*][*]"));
            let empty = Sym::Call("States.Array()".into(), Vec::new());
            (Sym::one_of(vec![(none, empty), (Cond::True, all)]), after)
        };
        Self::after_map(st, &after, result).map_err(Blocked::from)
    }
}

/// The type of the state that stands for a loop once folded ([`Cx::fold_loops`]): a name no state
/// machine's state type has.
const LOOP_TYPE: &str = "(loop)";
/// A folded loop's fields: its Choice (the check), that Choice's name, its states (the body), the
/// Wait between its check and its head, that Wait's name, and the states its check leads out to.
const LOOP_CHOICE: &str = "(choice)";
const LOOP_CHOICE_NAME: &str = "(choice name)";
const LOOP_BODY: &str = "(body)";
const LOOP_WAIT: &str = "(wait)";
const LOOP_EXITS: &str = "(exits)";
/// Present when the check comes first (a `while`): it decides before the first pass too.
const LOOP_FIRST: &str = "(check first)";
/// The bound a translated loop gets (Step Functions sets none).
pub const LOOP_BOUND: u32 = 1_000;

/// The states a state leads to.
fn successors(state: &Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |v: Option<&Value>| {
        if let Some(n) = v.and_then(Value::as_str) {
            if !out.iter().any(|x| x == n) {
                out.push(n.to_owned());
            }
        }
    };
    add(state.get("Next"));
    add(state.get("Default"));
    for exit in state.get(LOOP_EXITS).and_then(Value::as_array).into_iter().flatten() {
        add(Some(exit));
    }
    for list in ["Choices", "Catch"] {
        for rule in state.get(list).and_then(Value::as_array).into_iter().flatten() {
            add(rule.get("Next"));
        }
    }
    out
}

/// A way out of a state that is not a step: what was decided is added.
fn edge(m: &Arrival, cond: Cond, doc: Sym) -> Arrival {
    Arrival {
        full: m.full.clone().and(cond.clone()),
        local: m.local.clone().and(cond),
        doc,
        after: m.after.clone(),
        from_start: m.from_start,
        vars: m.vars.clone(),
    }
}

/// The way out of a step: after it, with `cond` decided on its outcome.
fn after_step(m: &Arrival, step: &str, cond: Cond) -> Arrival {
    Arrival {
        full: m.full.clone().and(cond.clone()),
        local: cond,
        doc: m.doc.clone(),
        after: BTreeSet::from([step.to_owned()]),
        from_start: false,
        vars: m.vars.clone(),
    }
}

/// A step's name, what it comes after, and its guard.
fn step_base(name: &str, m: &Arrival) -> Value {
    let mut s = json!({"name": name, "after": m.after.iter().collect::<Vec<_>>()});
    if let Cond::When(c) = &m.local {
        s["when"] = c.clone();
    }
    s
}

/// `InputPath` or `OutputPath` applied (`null`: an empty object).
fn io(st: &Map<String, Value>, doc: &Sym, field: &str) -> Result<Sym, (String, String)> {
    match st.get(field) {
        None => Ok(doc.clone()),
        Some(Value::Null) => Ok(Sym::Lit(json!({}))),
        // a path (InputPath, OutputPath) may name many values: their array
        Some(Value::String(p)) => super::data::get(doc, p).map_err(|e| (field.to_owned(), e)),
        Some(other) => Err((field.into(), format!("{other} is not a path"))),
    }
}

/// `ResultPath` applied: the result replaces the input, is added to it, or is dropped.
fn result_path(st: &Map<String, Value>, doc: Sym, result: Sym) -> Result<Sym, (String, String)> {
    match st.get("ResultPath") {
        None => Ok(result),
        Some(Value::Null) => Ok(doc),
        Some(Value::String(p)) => {
            let segs: Vec<Seg> = parse_path(p).map_err(|e| ("ResultPath".to_owned(), e))?;
            doc.set(&segs, result).map_err(|e| ("ResultPath".to_owned(), e))
        }
        Some(other) => Err(("ResultPath".into(), format!("{other} is not a path"))),
    }
}

/// A `Parameters`-like template (keys ending `.$` take a path) over `doc`.
fn template(t: &Value, doc: &Sym, vars: &Vars, scope: Scope) -> Result<Sym, String> {
    Ok(match t {
        Value::Object(o) => {
            let mut out = Vec::new();
            for (k, v) in o {
                match k.strip_suffix(".$") {
                    Some(name) => {
                        let Value::String(p) = v else { return Err(format!("{k} takes a path, not {v}")) };
                        out.push((name.to_owned(), reference(p, doc, vars, scope).map_err(|e| format!("{k}: {e}"))?));
                    }
                    None => out.push((k.clone(), template(v, doc, vars, scope)?)),
                }
            }
            Sym::Obj(out)
        }
        Value::Array(a) => {
            let parts = a.iter().map(|x| template(x, doc, vars, scope)).collect::<Result<Vec<_>, _>>()?;
            if parts.iter().all(|p| matches!(p, Sym::Lit(_))) {
                Sym::Lit(Value::Array(
                    parts.into_iter().map(|p| if let Sym::Lit(v) = p { v } else { Value::Null }).collect(),
                ))
            } else {
                Sym::Arr(parts)
            }
        }
        other => Sym::Lit(other.clone()),
    })
}

/// The value a `.$` key names: a path of the state's input, the context object, or an intrinsic.
fn reference(p: &str, doc: &Sym, vars: &Vars, scope: Scope) -> Result<Sym, String> {
    if sas_protocol::intrinsic::is_call(p) {
        return intrinsic(p, doc, vars, scope);
    }
    if let Some(ctx) = p.strip_prefix("$$") {
        return match (ctx, scope) {
            (".Execution.Input", Scope::Task) => Ok(Sym::Ref("$.input".into())),
            (c, Scope::Task) if c.starts_with(".Execution.Input.") || c.starts_with(".Execution.Input[") => {
                Ok(Sym::Ref(path_text("$.input", &parse_path(&format!("${}", &c[".Execution.Input".len()..]))?)))
            }
            // the execution: the task submitted, in its children too (a loop's iterations, a
            // map's elements, a branch)
            (".Execution.Id" | ".Execution.Name", _) => Ok(Sym::Ref("$.task.root".into())),
            // the importer's own (States.UUID()'s name): the task or child task that makes it
            (".sas.TaskId", _) => Ok(Sym::Ref("$.task.id".into())),
            (".Task.Token", _) => Ok(Sym::Lit(json!(TOKEN))),
            (".Map.Item.Value", Scope::Element) => Ok(Sym::Ref("$.input.item".into())),
            (c, Scope::Element) if c.starts_with(".Map.Item.Value.") || c.starts_with(".Map.Item.Value[") => {
                Ok(Sym::Ref(path_text("$.input.item", &parse_path(&format!("${}", &c[".Map.Item.Value".len()..]))?)))
            }
            (".Map.Item.Index", Scope::Element) => Ok(Sym::Ref("$.input.index".into())),
            _ => Err(format!(
                "the context object's {p} is not translated (a step here reads the task's input, the outputs of the steps before it, and a map element its item and index)"
            )),
        };
    }
    lookup(p, doc, vars)
}

/// A state's `Assign` (or a Choice rule's, or a catcher's) over `base`, what its paths read as
/// `$`: the variables after it. Every value reads the variables as they were before it.
fn assign(spec: Option<&Value>, base: &Sym, vars: &Vars) -> Result<Vars, (String, String)> {
    let Some(spec) = spec else { return Ok(vars.clone()) };
    let err = |e: String| ("Assign".to_owned(), e);
    if !spec.is_object() {
        return Err(err(format!("{spec} is not an object of variables")));
    }
    let Sym::Obj(set) = template(spec, base, vars, Scope::Task).map_err(err)? else {
        return Err(err("an object of variables".into()));
    };
    let mut out = vars.clone();
    for (name, value) in set {
        let ok = name.starts_with(|c: char| c.is_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_alphanumeric() || c == '_')
            && name != "states";
        if !ok {
            return Err(err(format!("{name:?} is not a variable's name (letters, digits and _, not $states)")));
        }
        out.insert(name, value);
    }
    Ok(out)
}

/// The definition with each `States.UUID()` in a `.$` value (a call a step would make again on each
/// attempt) written `States.UUID($$.sas.TaskId, '<state>#<n>')` (the importer's own context path,
/// `$.task.id`): a UUID named by the (child) task and
/// the place that calls it, so that a retry, a second read and the state after it see the same.
fn name_uuids(def: &Value) -> Value {
    fn in_state(v: &Value, state: &str, n: &mut usize, dotted: bool) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| {
                        let x = match k.as_str() {
                            "States" => states(x),
                            _ => in_state(x, state, n, k.ends_with(".$")),
                        };
                        (k.clone(), x)
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|x| in_state(x, state, n, false)).collect()),
            Value::String(t) if dotted && t.contains("States.UUID()") => {
                let place: String =
                    state.chars().map(|c| if c.is_alphanumeric() || " -_".contains(c) { c } else { '_' }).collect();
                let parts: Vec<&str> = t.split("States.UUID()").collect();
                let mut out = parts[0].to_owned();
                for part in &parts[1..] {
                    *n += 1;
                    out = format!("{out}States.UUID($$.sas.TaskId, '{place}#{n}'){part}");
                }
                Value::String(out)
            }
            other => other.clone(),
        }
    }
    fn states(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(name, st)| {
                        let mut n = 0;
                        (name.clone(), in_state(st, name, &mut n, false))
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    match def {
        Value::Object(m) => Value::Object(
            m.iter().map(|(k, x)| (k.clone(), if k == "States" { states(x) } else { x.clone() })).collect(),
        ),
        other => other.clone(),
    }
}

/// An intrinsic function's call, each of its paths read through `doc`: a path of the task, or a
/// value known at import.
fn intrinsic(text: &str, doc: &Sym, vars: &Vars, scope: Scope) -> Result<Sym, String> {
    intrinsic_over(text, &|p| reference(p, doc, vars, scope))
}

/// An intrinsic function's call, its paths read by `read`. An argument that depends on the way the
/// task came (a variable set apart on two ways) makes the call a choose: on each way, the call
/// over that way's value.
fn intrinsic_over(text: &str, read: &dyn Fn(&str) -> Result<Sym, String>) -> Result<Sym, String> {
    use sas_protocol::intrinsic::{Arg, Call};
    let paths = std::cell::RefCell::new(Vec::new());
    let by_way = std::cell::RefCell::new(None);
    let parsed = Call::parse_with(text, &|p| match read(p)? {
        Sym::Ref(task_path) => {
            paths.borrow_mut().push(task_path.clone());
            sas_protocol::condition::DataPath::parse_many(&task_path).map(Arg::Path)
        }
        Sym::Lit(v) if v == json!(TOKEN) => {
            Err("$$.Task.Token is not an argument here: the token is the request's".into())
        }
        Sym::Lit(v) => Ok(Arg::Value(v)),
        // a call the state machine made before (a Pass's States.UUID()): the call, made here
        Sym::Call(call, read) => {
            paths.borrow_mut().extend(read);
            Call::parse(&call, &sas_protocol::condition::DataPath::parse_many).map(Arg::Call)
        }
        Sym::Choose(ways) => {
            by_way.borrow_mut().get_or_insert((p.to_owned(), ways));
            Ok(Arg::Value(Value::Null))
        }
        _ => Err(format!("{p} names a value the state machine builds, which an intrinsic function here cannot read")),
    });
    if let Some((at, ways)) = by_way.into_inner() {
        let ways = ways
            .into_iter()
            .map(|(c, v)| Ok((c, intrinsic_over(text, &|p| if p == at { Ok(v.clone()) } else { read(p) })?)))
            .collect::<Result<Vec<_>, String>>()?;
        return Ok(Sym::one_of(ways));
    }
    let call = parsed.map_err(|e| format!("{text}: {e}"))?;
    Ok(Sym::Call(call.to_text(), paths.into_inner()))
}

/// Where `$$.Task.Token` is in a task's parameters: paths of names (`Input.TaskToken`).
fn token_paths(s: &Sym) -> Vec<String> {
    match s {
        Sym::Obj(m) => m
            .iter()
            .flat_map(|(k, v)| {
                if *v == Sym::Lit(json!(TOKEN)) {
                    vec![k.clone()]
                } else {
                    token_paths(v).into_iter().map(|p| format!("{k}.{p}")).collect()
                }
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// What `$$.Task.Token` stands for while a template is built (left out of what is sent).
const TOKEN: &str = "\u{0}task-token\u{0}";

/// The value without the members that carried the task token; whether there were any.
fn without_token(s: Sym) -> (Sym, bool) {
    match s {
        Sym::Obj(m) => {
            let mut dropped = false;
            let kept = m
                .into_iter()
                .filter_map(|(k, v)| {
                    if v == Sym::Lit(json!(TOKEN)) {
                        dropped = true;
                        return None;
                    }
                    let (v, d) = without_token(v);
                    dropped |= d;
                    Some((k, v))
                })
                .collect();
            (Sym::Obj(kept), dropped)
        }
        other => (other, false),
    }
}

/// A `SecondsPath` that names a whole number known at import (a `Pass` state's `Result`).
fn constant_seconds(st: &Map<String, Value>, input: &Sym) -> Option<u64> {
    let path = parse_path(st.get("SecondsPath")?.as_str()?).ok()?;
    match input.get(&path).ok()? {
        Sym::Lit(Value::Number(n)) => n.as_u64(),
        _ => None,
    }
}

/// The JSON pointer into the task that a state's `field` (a path of its input) names, if it has
/// the field; refused when the value there is built by the state machine (`what`: what it is).
fn read(st: &Map<String, Value>, input: &Sym, field: &str, what: &str) -> Result<Option<String>, (String, String)> {
    let Some(p) = st.get(field).and_then(Value::as_str) else { return Ok(None) };
    match input.get(&parse_path(p).map_err(|e| (field.to_owned(), e))?) {
        Ok(Sym::Ref(path)) => Ok(Some(pointer(&path))),
        Ok(_) => Err((
            field.to_owned(),
            format!("{what} there is built by the state machine; a wait here reads it from the task"),
        )),
        Err(e) => Err((field.to_owned(), e)),
    }
}

/// A JSON pointer (RFC 6901) for a path of the task (`$.input.a` → `/input/a`).
fn pointer(path: &str) -> String {
    let segs = parse_path(path).unwrap_or_default();
    let mut out = String::new();
    for s in segs {
        out.push('/');
        match s {
            Seg::Name(n) => out.push_str(&n.replace('~', "~0").replace('/', "~1")),
            Seg::Index(i) => out.push_str(&i.to_string()),
        }
    }
    out
}

/// An agent's name from what it calls (`fn.charge-card`, `sqs.orders`).
fn agent_name(kind: &str, what: &str) -> String {
    let last = what.trim_end_matches('/').rsplit([':', '/']).find(|s| !s.is_empty()).unwrap_or(what);
    let last = last.trim_start_matches("${").trim_end_matches('}');
    let clean: String = last
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' { c } else { '-' })
        .collect();
    let mut name = format!("{kind}.{clean}");
    name.truncate(64);
    name
}

/// An agent's name told apart from another's that would be `base`: a bus's by its detail type
/// (or its source): `bus.orders.OrderPlaced.send`.
fn apart(base: &str, spec: &Value) -> Option<String> {
    if spec["kind"] != "eventbridge" {
        return None;
    }
    let what = spec["detail_type"].as_str().or_else(|| spec["source"].as_str())?;
    let clean: String =
        what.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect();
    let (stem, send) = match base.strip_suffix(".send") {
        Some(stem) => (stem, ".send"),
        None => (base, ""),
    };
    Some(format!("{stem}.{clean}{send}").chars().take(64).collect())
}

/// `base` with the first number that no agent has (`fn.quote-2`, `sqs.orders-2.send`).
fn numbered(base: &str, agents: &Map<String, Value>) -> String {
    let (stem, send) = match base.strip_suffix(".send") {
        Some(stem) => (stem, ".send"),
        None => (base, ""),
    };
    let stem: String = stem.chars().take(56).collect();
    let mut n = 2;
    loop {
        let name = format!("{stem}-{n}{send}");
        if !agents.contains_key(&name) {
            return name;
        }
        n += 1;
    }
}

/// The steps (and their compensations) with the agents `renamed` names renamed.
fn rename_agents(steps: &mut [Value], renamed: &HashMap<String, String>) {
    if renamed.is_empty() {
        return;
    }
    for s in steps {
        if let Some(new) = s.get("agent").and_then(Value::as_str).and_then(|a| renamed.get(a)) {
            s["agent"] = json!(new);
        }
        if let Some(c) = s.get_mut("compensation") {
            rename_agents(std::slice::from_mut(c), renamed);
        }
    }
}

/// The agents of `imported` added to `all` (the agents of the definitions imported before it):
/// an agent another already has the name of is named apart (by its bus's detail type, or a
/// number), in its workflows too; what was renamed, said.
pub fn merge_agents(all: &mut Map<String, Value>, imported: &mut Imported) -> Vec<String> {
    let mut renamed = HashMap::new();
    let mut said = Vec::new();
    for (k, v) in std::mem::take(&mut imported.agents) {
        let name = match all.get(&k) {
            None => k.clone(),
            Some(old) if *old == v => k.clone(),
            Some(_) => match all.iter().find(|(n, x)| **x == v && n.starts_with(k.trim_end_matches(".send"))) {
                Some((n, _)) => n.clone(),
                None => apart(&k, &v).filter(|q| !all.contains_key(q)).unwrap_or_else(|| numbered(&k, all)),
            },
        };
        if name != k {
            said.push(format!(
                "its agent {k} is {name}: a definition imported before it has an agent {k} that calls {} differently",
                k.trim_end_matches(".send")
            ));
            renamed.insert(k, name.clone());
        }
        all.insert(name.clone(), v.clone());
        imported.agents.insert(name, v);
    }
    for w in std::iter::once(&mut imported.workflow).chain(imported.children.iter_mut()) {
        if let Some(Value::Array(steps)) = w.get_mut("steps") {
            rename_agents(steps, &renamed);
        }
    }
    said
}

/// What a Task state's `Resource` calls, and with what.
enum Service {
    Function {
        function: String,
        qualifier: Option<String>,
        payload: Option<Sym>,
        wrapped: bool,
    },
    Queue {
        queue_url: String,
        body: Sym,
    },
    Topic {
        topic_arn: String,
        message: Sym,
    },
    Bus {
        bus: String,
        source: Option<String>,
        detail_type: Option<String>,
        detail: Sym,
    },
    Http {
        url: String,
        method: String,
        body: Option<Sym>,
        /// `apigateway:invoke` (an API Gateway API, signed for `execute-api` with IAM auth), not an
        /// HTTP task through a connection
        api: Option<ApiAuth>,
    },
    /// An action of an AWS service that speaks JSON (the `aws` kind): Step Functions' names.
    Aws {
        service: String,
        action: String,
        params: Option<Sym>,
    },
    /// A Distributed Map's `ItemReader` (the `s3_items` kind): its items read from S3 and
    /// written back as pages.
    Items {
        params: Sym,
    },
    /// A job run to completion (`.sync`, `.sync:2` when `two`): started, then polled until its
    /// status ends it.
    Job {
        job: &'static sas_protocol::jobs::Job,
        two: bool,
        params: Option<Sym>,
    },
}

/// A `.sync` integration (`states:startExecution.sync:2`, `batch:submitJob.sync`): a job of the
/// job table, its action one the `aws` kind calls.
fn job_action(resource: &str, integration: &str, two: bool, params: Option<&Sym>) -> Result<Service, String> {
    let (svc, action) = integration.split_once(':').unwrap_or((integration, ""));
    if svc == "aws-sdk" {
        return Err(format!(
            "{resource}: an aws-sdk task runs no job to completion (.sync is for the optimized integrations)"
        ));
    }
    let svc = if svc == "states" { "sfn" } else { svc };
    let op = sas_protocol::service_models::operation(svc, action)
        .map_err(|e| format!("{resource}: the {svc} integration is not translated ({e})"))?;
    let Some(job) = sas_protocol::jobs::job(&op.service, &op.name) else {
        return Err(format!(
            "{resource}: a .sync job of {svc}:{action} is not translated (the jobs run to completion here: {})",
            sas_protocol::jobs::known()
        ));
    };
    if two && job.json_members.is_empty() {
        return Err(format!("{resource}: .sync:2 is Step Functions' own (an execution's input and output as JSON)"));
    }
    Ok(Service::Job { job, two, params: params.cloned() })
}

/// An `aws-sdk:SERVICE:ACTION` task, or an optimized integration that is the API's action with
/// its answer (`dynamodb:putItem`, `states:startExecution`), as the `aws` kind calls it; the
/// refusal names the protocol of a service the kind does not speak.
fn aws_action(service: &str, action: &str, params: Option<&Sym>) -> Result<Service, String> {
    let op = sas_protocol::service_models::operation(service, action)?;
    Ok(Service::Aws { service: op.service, action: op.name, params: params.cloned() })
}

/// The members of an `aws` task's parameters that name what it reaches, written in the
/// definition: they go to the agent's own `parameters` (a step cannot change them), and name its
/// resources.
fn pinned_members(params: Option<&Sym>) -> Vec<(String, String)> {
    let Some(Sym::Obj(members)) = params else {
        return match params.and_then(Sym::constant) {
            Some(Value::Object(o)) => o
                .into_iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())).filter(|_| names_a_resource(&k)))
                .collect(),
            _ => Vec::new(),
        };
    };
    members
        .iter()
        .filter(|(k, _)| names_a_resource(k))
        .filter_map(|(k, v)| match v {
            Sym::Lit(Value::String(x)) => Some((k.clone(), x.clone())),
            _ => None,
        })
        .collect()
}

fn names_a_resource(key: &str) -> bool {
    ["Name", "Arn", "ARN", "Url", "Id"].iter().any(|s| key.ends_with(s)) || key == "Bucket"
}

/// The answer's members a `ResultSelector` reads only through `States.StringToJson($.a.b)` (a
/// path of names), and the selector reading them as paths: an `aws` agent parses them itself
/// (`parse_json`), so that what follows reads into their values.
fn parsed_in_selector(sel: &Value) -> (Vec<String>, Option<Value>) {
    fn calls(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    match (k.ends_with(".$"), x) {
                        (true, Value::String(t)) => {
                            let inner = t.strip_prefix("States.StringToJson($.").and_then(|r| r.strip_suffix(')'));
                            if let Some(p) = inner.filter(|p| {
                                !p.is_empty()
                                    && p.split('.')
                                        .all(|n| !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_'))
                            }) {
                                out.push(p.to_owned());
                            }
                        }
                        _ => calls(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| calls(x, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    calls(sel, &mut found);
    let text = sel.to_string();
    // a member read otherwise too (as its text) is left to the selector
    found.retain(|p| {
        let call = format!("States.StringToJson($.{p})");
        text.matches(&format!("$.{p}")).count() == text.matches(&call).count()
    });
    found.sort();
    found.dedup();
    if found.is_empty() {
        return (found, Some(sel.clone()));
    }
    let mut rewritten = text;
    for p in &found {
        rewritten = rewritten.replace(&format!("States.StringToJson($.{p})"), &format!("$.{p}"));
    }
    (found, serde_json::from_str(&rewritten).ok().or_else(|| Some(sel.clone())))
}

/// What an `aws` step sends: its parameters but the members its agent fixes.
fn unpinned(params: Option<Sym>, pinned: &[(String, String)]) -> Sym {
    let fixed = |k: &String| pinned.iter().any(|(p, _)| p == k);
    match params {
        Some(Sym::Obj(members)) => Sym::Obj(members.into_iter().filter(|(k, _)| !fixed(k)).collect()),
        Some(Sym::Lit(Value::Object(o))) => Sym::Lit(Value::Object(o.into_iter().filter(|(k, _)| !fixed(k)).collect())),
        Some(other) => other,
        None => Sym::Lit(json!({})),
    }
}

/// What an `aws` agent of `service` reaching `pinned` is granted on: the ARNs written, a table's
/// ARN from its name, a queue's from its URL; `*` when nothing names one.
fn aws_resources(service: &str, pinned: &[(String, String)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (k, v) in pinned {
        if v.starts_with("arn:") {
            out.push(v.clone());
        } else if service == "dynamodb" && k == "TableName" {
            out.push(format!("arn:aws:dynamodb:*:*:table/{v}"));
            out.push(format!("arn:aws:dynamodb:*:*:table/{v}/index/*"));
        } else if service == "s3" && k == "Bucket" {
            // the bucket (a listing) and its objects
            out.push(format!("arn:aws:s3:::{v}"));
            out.push(format!("arn:aws:s3:::{v}/*"));
        } else if service == "sqs" && k == "QueueUrl" && !v.contains("${") {
            if let Some(name) = v.trim_end_matches('/').rsplit('/').next() {
                out.push(format!("arn:aws:sqs:*:*:{name}"));
            }
        }
    }
    if out.is_empty() {
        out.push("*".into());
    }
    out
}

/// A query string's part, percent-encoded (RFC 3986 unreserved characters kept).
fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!("%{b:02X}"));
        }
    }
    out
}

/// A member of a service's `Parameters` that must be written in the definition.
/// A catcher's way: its state, its guard, its `ResultPath`, its `Assign`, and the error's name when
/// it catches one name alone.
type Catcher = (String, Cond, Option<Value>, Option<Value>, Option<String>);

/// How `apigateway:invoke` reaches its API: `AuthType` `NO_AUTH`, or `IAM_ROLE` and
/// `RESOURCE_POLICY` (both SigV4-signed for `execute-api` here, by the Agent function's role).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApiAuth {
    Open,
    Signed,
}

/// `apigateway:invoke`: an http agent calling `https://ApiEndpoint/Stage/Path`, signed when the
/// API takes IAM auth; every part of the address written in the definition.
fn api_gateway(params: Option<&Sym>) -> Result<Service, String> {
    let fixed = |key: &str| {
        literal(params, key)
            .map_err(|e| format!("apigateway:invoke's {e}: an http agent calls one address, written in the definition"))
    };
    let host =
        fixed("ApiEndpoint")?.ok_or("apigateway:invoke needs Parameters.ApiEndpoint, written in the definition")?;
    let mut url = if host.contains("://") { host } else { format!("https://{host}") };
    for part in [fixed("Stage")?, fixed("Path")?].into_iter().flatten() {
        let part = part.trim_matches('/');
        if !part.is_empty() {
            url = format!("{}/{part}", url.trim_end_matches('/'));
        }
    }
    let method = fixed("Method")?.unwrap_or_else(|| "GET".into()).to_ascii_uppercase();
    if member(params, "Headers").is_some() {
        return Err("apigateway:invoke's Headers are not translated: an http agent sends its own headers (from Secrets Manager or SSM: see the http kind)".into());
    }
    match member(params, "QueryParameters").map(|q| q.constant()) {
        None => {}
        // API Gateway's query parameters: each name with a list of values
        Some(Some(Value::Object(q))) => {
            let mut pairs = Vec::new();
            for (k, v) in &q {
                let values = match v {
                    Value::Array(a) => a.clone(),
                    other => vec![other.clone()],
                };
                for v in values {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    pairs.push(format!("{}={}", query_escape(k), query_escape(&v)));
                }
            }
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&pairs.join("&"));
        }
        Some(_) => return Err(
            "apigateway:invoke's QueryParameters read from the data are not translated: write them in the definition"
                .into(),
        ),
    }
    let api = match fixed("AuthType")?.as_deref() {
        None | Some("NO_AUTH") => ApiAuth::Open,
        Some("IAM_ROLE" | "RESOURCE_POLICY") => ApiAuth::Signed,
        Some(other) => {
            return Err(format!("apigateway:invoke's AuthType {other} is not NO_AUTH, IAM_ROLE or RESOURCE_POLICY"))
        }
    };
    Ok(Service::Http { url, method, body: member(params, "RequestBody"), api: Some(api) })
}

fn literal(params: Option<&Sym>, key: &str) -> Result<Option<String>, String> {
    let Some(p) = params else { return Ok(None) };
    match p.get(&[Seg::Name(key.into())]) {
        Ok(Sym::Lit(Value::String(s))) => Ok(Some(s)),
        Ok(Sym::Lit(other)) => Err(format!("{key} is {other}, not a name")),
        Ok(_) => Err(format!("{key} is read from the data; an agent here names what it calls in its configuration")),
        Err(_) => Ok(None),
    }
}

fn member(params: Option<&Sym>, key: &str) -> Option<Sym> {
    params.and_then(|p| p.get(&[Seg::Name(key.into())]).ok())
}

impl Service {
    fn of(resource: &str, params: Option<&Sym>) -> Result<Service, String> {
        if resource == ITEMS_RESOURCE {
            return Ok(Service::Items { params: params.cloned().unwrap_or(Sym::Lit(json!({}))) });
        }
        let integration = resource.strip_prefix("arn:aws:states:::").or_else(|| {
            // arn:${AWS::Partition}:states:::... in SAM and CloudFormation definitions
            resource.strip_prefix("arn:").and_then(|r| r.split_once(":states:::")).map(|(_, rest)| rest)
        });
        // arn:aws:states:REGION:ACCOUNT:aws-sdk:..., which Step Functions takes too
        let integration = integration.or_else(|| {
            let parts: Vec<&str> = resource.splitn(6, ':').collect();
            match parts.as_slice() {
                ["arn", _, "states", _, _, rest] if rest.starts_with("aws-sdk:") => Some(*rest),
                _ => None,
            }
        });
        let Some(integration) = integration else {
            // the Lambda short form: the function's ARN (or a substitution that names one)
            let function = resource.to_owned();
            let is_arn = function.starts_with("arn:") && function.split(':').nth(2) == Some("lambda");
            let is_substitution =
                function.starts_with("${") && function.ends_with('}') && !function[2..].contains("${");
            // an activity's ARN, or a substitution named for one
            if function.contains(":activity:")
                || (is_substitution && function.to_ascii_lowercase().contains("activity"))
            {
                return Err("an activity is not translated: a worker of an activity becomes a callback step's worker (answering with the token)".into());
            }
            if !is_arn && !is_substitution {
                return Err(format!(
                    "{resource:?} is not a Lambda function's ARN nor an integration of Step Functions"
                ));
            }
            let (function, qualifier) = split_qualifier(&function);
            return Ok(Service::Function { function, qualifier, payload: params.cloned(), wrapped: false });
        };
        let (service, flavour) = match integration.split_once('.') {
            Some((s, f)) => (s, Some(f)),
            None => (integration, None),
        };
        match flavour {
            None | Some("waitForTaskToken") => {}
            Some(f @ ("sync" | "sync:2")) => return job_action(resource, service, f == "sync:2", params),
            Some(other) => {
                return Err(format!("{resource}: the .{other} flavour is not an integration pattern translated here"))
            }
        }
        let callback = flavour.is_some();
        match service {
            "lambda:invoke" => {
                let Some(function) = literal(params, "FunctionName")? else {
                    return Err("lambda:invoke needs Parameters.FunctionName".into());
                };
                if let Some(Sym::Lit(t)) = member(params, "InvocationType") {
                    if t != "RequestResponse" {
                        return Err(format!("InvocationType {t} is not translated: an asynchronous invoke is a callback step (.waitForTaskToken)"));
                    }
                }
                if function.contains('<') {
                    return Err(format!(
                        "FunctionName {function:?} holds a placeholder to fill in (<...>): write the function's name or ARN, \
                         or a ${{Variable}}"
                    ));
                }
                let (function, mut qualifier) = split_qualifier(&function);
                if let Some(q) = literal(params, "Qualifier")? {
                    qualifier = Some(q);
                }
                let payload = member(params, "Payload").unwrap_or(Sym::Lit(json!({})));
                Ok(Service::Function { function, qualifier, payload: Some(payload), wrapped: !callback })
            }

            "sqs:sendMessage" => {
                let queue_url = literal(params, "QueueUrl")?.ok_or("sqs:sendMessage needs Parameters.QueueUrl")?;
                Ok(Service::Queue { queue_url, body: member(params, "MessageBody").unwrap_or(Sym::Lit(json!({}))) })
            }
            "sns:publish" => {
                let topic_arn = literal(params, "TopicArn")?.ok_or("sns:publish needs Parameters.TopicArn (a phone number or target is not translated)")?;
                Ok(Service::Topic { topic_arn, message: member(params, "Message").unwrap_or(Sym::Lit(json!({}))) })
            }
            "events:putEvents" => {
                let Some(Sym::Arr(entries)) = member(params, "Entries").map(|e| match e {
                    Sym::Lit(Value::Array(a)) => Sym::Arr(a.into_iter().map(Sym::Lit).collect()),
                    other => other,
                }) else {
                    return Err("events:putEvents needs Parameters.Entries, a list".into());
                };
                let [entry] = entries.as_slice() else { return Err("events:putEvents with more than one entry is not translated".into()) };
                let bus = literal(Some(entry), "EventBusName")?.unwrap_or_else(|| "default".into());
                Ok(Service::Bus {
                    bus,
                    source: literal(Some(entry), "Source")?,
                    detail_type: literal(Some(entry), "DetailType")?,
                    detail: member(Some(entry), "Detail").unwrap_or(Sym::Lit(json!({}))),
                })
            }
            "http:invoke" if callback => Err("http:invoke.waitForTaskToken is not an integration of Step Functions".into()),
            "http:invoke" => {
                let Some(mut url) = literal(params, "ApiEndpoint")? else {
                    return Err("http:invoke needs Parameters.ApiEndpoint, written in the definition".into());
                };
                let method = literal(params, "Method")?.unwrap_or_else(|| "POST".into());
                for f in ["Headers", "Transform"] {
                    if member(params, f).is_some() {
                        return Err(format!(
                            "http:invoke's {f} is not translated: an http agent sends its own headers (from Secrets Manager or SSM: see the http kind)"
                        ));
                    }
                }
                match member(params, "QueryParameters").map(|q| q.constant()) {
                    None => {}
                    Some(Some(Value::Object(q))) => {
                        let pairs: Vec<String> = q
                            .iter()
                            .map(|(k, v)| {
                                let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                                format!("{}={}", query_escape(k), query_escape(&v))
                            })
                            .collect();
                        url.push(if url.contains('?') { '&' } else { '?' });
                        url.push_str(&pairs.join("&"));
                    }
                    Some(_) => return Err("http:invoke's QueryParameters read from the data are not translated: write them in the definition".into()),
                }
                Ok(Service::Http { url, method, body: member(params, "RequestBody"), api: None })
            }
            "apigateway:invoke" if !callback => api_gateway(params),
            s if s.starts_with("aws-sdk:") => {
                let mut parts = s.splitn(3, ':').skip(1);
                let (Some(svc), Some(action)) = (parts.next(), parts.next()) else {
                    return Err(format!("{resource}: an aws-sdk resource is aws-sdk:SERVICE:ACTION"));
                };
                aws_action(svc, action, params).map_err(|e| format!("{resource}: {e}"))
            }
            s if s.starts_with("activity") => Err("an activity is not translated: its worker becomes a callback step's worker".into()),
            // an optimized integration whose answer is the API's: the aws kind calls the action
            // (with a token: the action hands it over, and a callback step waits for the answer)
            other if !other.starts_with("apigateway:") => {
                let (svc, action) = other.split_once(':').unwrap_or((other, ""));
                // the integrations' names that are not the API's service: Step Functions' own, and
                // Bedrock's model calls (Bedrock Runtime's)
                let svc = match (svc, action) {
                    ("states", _) => "sfn",
                    ("bedrock", "invokeModel") => "bedrockruntime",
                    (s, _) => s,
                };
                aws_action(svc, action, params).map_err(|e| {
                    format!(
                        "{resource}: the {svc} integration is not translated ({e})"
                    )
                })
            }
            other => Err(format!(
                "{resource}: the {} integration with a token is not translated: call the service from a Lambda function (a lambda agent)",
                other.split(':').next().unwrap_or(other)
            )),
        }
    }
}

/// One retrier of a `Retry`, with the States Language's defaults (3 attempts, 1 s, rate 2).
#[derive(Debug)]
struct Retrier {
    errors: Vec<String>,
    attempts: u64,
    interval: u64,
    rate: f64,
    max_delay: Option<u64>,
    jitter: Option<String>,
}

impl Retrier {
    fn of(r: &Value) -> Result<Retrier, String> {
        let Value::Object(r) = r else { return Err("a retrier is an object".into()) };
        let errors: Vec<String> = match r.get("ErrorEquals") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|e| e.as_str().map(str::to_owned).ok_or_else(|| format!("ErrorEquals names errors, not {e}")))
                .collect::<Result<_, _>>()?,
            _ => return Err("a retrier names its errors (ErrorEquals, a non-empty list)".into()),
        };
        let whole = |key: &str, default: u64, least: u64| -> Result<u64, String> {
            match r.get(key) {
                None => Ok(default),
                Some(v) => match v.as_u64() {
                    Some(n) if n >= least => Ok(n),
                    _ => Err(format!("{key} is a whole number of at least {least}, not {v}")),
                },
            }
        };
        let attempts = whole("MaxAttempts", 3, 0)?;
        let interval = whole("IntervalSeconds", 1, 1)?;
        let max_delay = match r.get("MaxDelaySeconds") {
            None => None,
            Some(_) => Some(whole("MaxDelaySeconds", 1, 1)?),
        };
        let rate = match r.get("BackoffRate") {
            None => 2.0,
            Some(v) => match v.as_f64() {
                Some(x) if x >= 1.0 => x,
                _ => return Err(format!("BackoffRate is a number of at least 1.0, not {v}")),
            },
        };
        let jitter = match r.get("JitterStrategy") {
            None => None,
            Some(Value::String(j)) if j == "FULL" || j == "NONE" => Some(j.clone()),
            Some(v) => return Err(format!("JitterStrategy is FULL or NONE, not {v}")),
        };
        Ok(Retrier { errors, attempts, interval, rate, max_delay, jitter })
    }
}

/// An error name a function gives when retrying cannot help (`PermanentError`), as the lambda
/// agent reads it (sas-core's `agent::lambda::is_permanent_type`, the same rule: the last part of
/// the name after `.`, `:` or `$` starts with `Permanent`; sasctl's tests check the two agree):
/// such a failure is not retried here.
pub fn is_permanent_name(error: &str) -> bool {
    error.rsplit(['.', ':', '$']).next().is_some_and(|last| last.starts_with("Permanent"))
}

/// `arn:...:function:name:qualifier` as the function and its qualifier.
fn split_qualifier(function: &str) -> (String, Option<String>) {
    let parts: Vec<&str> = function.split(':').collect();
    if function.starts_with("arn:") && parts.len() == 8 {
        (parts[..7].join(":"), Some(parts[7].to_owned()))
    } else {
        (function.to_owned(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(i: &Imported) -> HashMap<String, Value> {
        i.workflow["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["name"].as_str().unwrap().to_owned(), s.clone()))
            .collect()
    }

    fn loads(i: &Imported) {
        let wf = json!({"workflows": i.workflows()}).to_string();
        sas_protocol::workflow::WorkflowRegistry::from_json(&wf).unwrap_or_else(|e| panic!("{e}\n{wf}"));
    }

    #[test]
    fn a_distributed_map_reads_its_items_once_and_maps_them_a_page_at_a_time() {
        let def = json!({"StartAt": "Rows", "States": {
            "Rows": {"Type": "Map", "MaxConcurrency": 40, "ToleratedFailurePercentage": 12.5,
                "ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
                    "ReaderConfig": {"InputType": "CSV", "CSVHeaderLocation": "FIRST_ROW", "MaxItems": 500},
                    "Parameters": {"Bucket": "orders-in", "Key.$": "$.key"}},
                "ItemSelector": {"row.$": "$$.Map.Item.Value", "batch.$": "$.batch"},
                "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED"}, "StartAt": "Put", "States": {
                    "Put": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:put", "End": true}}},
                "ResultSelector": {"n.$": "States.ArrayLength($)"}, "ResultPath": "$.written", "Next": "Done"},
            "Done": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:done", "End": true}}});
        let i = import("rows", &def).unwrap();
        loads(&i);
        let s = steps(&i);
        // 1. the items read once: the reader's parameters and its configuration, by the s3_items agent
        let read = &s["Rows_items"];
        assert_eq!(
            read["parameters"],
            json!({"Bucket": "orders-in", "Key.$": "$.input.key",
                   "ReaderConfig": {"InputType": "CSV", "CSVHeaderLocation": "FIRST_ROW", "MaxItems": 500}})
        );
        let agent = &i.agents[read["agent"].as_str().unwrap()];
        assert_eq!(
            *agent,
            json!({"kind": "s3_items", "work_bucket": "${MAP_BUCKET}", "sources": ["arn:aws:s3:::orders-in/*"]})
        );
        // 2. a child task per page, given the page and the prefix (and the map's input, which the
        // selector reads), at most 40 items at once in all
        let map = &s["Rows"];
        assert_eq!(map["after"], json!(["Rows_items"]));
        assert_eq!(map["map"], json!({"items": "/outputs/Rows_items/pages", "max_concurrency": 4}));
        assert_eq!(
            map["parameters"],
            json!({"page.$": "$.input.item", "prefix.$": "$.outputs.Rows_items.prefix", "ctx": {"batch.$": "$.input.batch"}})
        );
        let pages = i.children.iter().find(|c| c["name"] == "rows.Rows_pages").expect("the page's workflow");
        let pages: HashMap<String, Value> = pages["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["name"].as_str().unwrap().to_owned(), s.clone()))
            .collect();
        let get = &i.agents[pages["Read_page"]["agent"].as_str().unwrap()];
        assert_eq!((&get["service"], &get["parse_json"]), (&json!("s3"), &json!(["Body"])));
        assert_eq!(get["parameters"], json!({"Bucket": "${MAP_BUCKET}"}));
        assert_eq!(
            pages["Read_page"]["parameters"]["Key.$"],
            "States.Format('{}{}.json', $.input.prefix, $.input.page)"
        );
        // the page's items mapped over the processor, the share of failures kept per page
        let each = &pages["Rows"];
        assert_eq!(
            each["map"],
            json!({"items": "/outputs/Read_page/items", "max_concurrency": 10, "tolerated_failures": "12%"})
        );
        // what the selector reads beside the item is read in the parent, and given to the page
        assert_eq!(each["parameters"], json!({"row.$": "$.input.item", "batch.$": "$.input.ctx.batch"}), "{each}");
        // 3. the map's output is every page's outputs, one array (an empty one when there is none)
        assert_eq!(
            s["Done"]["parameters"]["written"]["n"]["*.choose"],
            json!([{"value": {"*.$": "States.ArrayLength(States.Array())"},
                    "when": {"numeric_equals": 0, "variable": "$.outputs.Rows_items.count"}},
                   {"value": {"*.$": "States.ArrayLength($.outputs.Rows[*][*])"}}]),
            "{:?}",
            s["Done"]
        );
        assert!(i.notes.iter().any(|n| n.contains("set MAP_BUCKET in AgentVariables")), "{:?}", i.notes);
        // what a page cannot keep is refused
        let refused = |states: Value| import("x", &json!({"StartAt": "A", "States": states})).unwrap_err();
        let r = refused(json!({"A": {"Type": "Map", "ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
            "Parameters": {"Bucket": "b", "Key": "k"}}, "ItemSelector": {"i.$": "$$.Map.Item.Index"},
            "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:p", "End": true}}},
            "End": true}}));
        assert!(r[0].reason.contains("Map.Item.Index"), "{r:?}");
        let r = refused(json!({"A": {"Type": "Map", "ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
            "ReaderConfig": {"InputType": "MANIFEST"}, "Parameters": {"Bucket": "b", "Key": "k"}},
            "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:p", "End": true}}},
            "End": true}}));
        assert!(r[0].reason.contains("MANIFEST"), "{r:?}");
        // results written to S3: each page writes its items' outputs, the map a manifest of them
        let mut written = def.clone();
        written["States"]["Rows"]["ResultWriter"] =
            json!({"Resource": "arn:aws:states:::s3:putObject", "Parameters": {"Bucket": "out", "Prefix": "runs"}});
        written["States"]["Rows"].as_object_mut().unwrap().remove("ResultSelector");
        let i = import("rows", &written).unwrap();
        loads(&i);
        let s = steps(&i);
        let manifest = &s["Rows_manifest"];
        assert_eq!(manifest["after"], json!(["Rows"]));
        assert_eq!(manifest["parameters"]["Key.$"], "States.Format('runs/{}/manifest.json', $.task.root)");
        assert_eq!(
            manifest["parameters"]["Body"],
            json!({"DestinationBucket": "out", "MapRunArn.$": "$.task.root",
                   "ResultFiles": {"FAILED": [], "PENDING": [], "SUCCEEDED.$": "$.outputs.Rows"}})
        );
        assert_eq!(s["Done"]["after"], json!(["Rows_manifest"]));
        let pages = i.children.iter().find(|c| c["name"] == "rows.Rows_pages").expect("the page's workflow");
        assert_eq!(
            pages["result"],
            json!({"Key.$": "States.Format('runs/{}/SUCCEEDED_{}.json', $.task.root, $.input.page)"})
        );
        let put =
            pages["steps"].as_array().unwrap().iter().find(|s| s["name"] == "Write_results").expect("the page's write");
        assert_eq!(put["parameters"]["Body.$"], "$.outputs.Rows");
        // an inline map's outputs written once, after it
        let i = import("x", &json!({"StartAt": "A", "States": {"A": {"Type": "Map", "ItemsPath": "$.l", "End": true,
            "ResultWriter": {"Resource": "arn:aws:states:::s3:putObject", "Parameters": {"Bucket": "out"}},
            "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:p", "End": true}}}}}}))
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["A_results"]["parameters"]["Body.$"], "$.outputs.A");
        assert_eq!(s["A_results"]["parameters"]["Key.$"], "States.Format('{}/SUCCEEDED_0.json', $.task.root)");
        assert_eq!(
            s["A_manifest"]["parameters"]["Body"]["ResultFiles"]["SUCCEEDED"],
            json!([{"Key.$": "States.Format('{}/SUCCEEDED_0.json', $.task.root)"}])
        );
        assert_eq!(
            i.workflow["result"],
            json!({"MapRunArn.$": "$.task.root",
                   "ResultWriterDetails": {"Bucket": "out", "Key.$": "States.Format('{}/manifest.json', $.task.root)"}})
        );
        // a Distributed Map over the task's data is a map
        let i = import("x", &json!({"StartAt": "A", "States": {"A": {"Type": "Map", "ItemsPath": "$.l",
            "ToleratedFailureCount": 3, "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED"}, "StartAt": "P",
            "States": {"P": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:p", "End": true}}}, "End": true}}}))
        .unwrap();
        assert_eq!(steps(&i)["A"]["map"]["tolerated_failures"], json!(3));
    }

    #[test]
    fn a_map_of_several_states_runs_a_workflow_of_its_own_per_element() {
        let def = json!({
            "StartAt": "Lines",
            "States": {
                "Lines": {"Type": "Map", "ItemsPath": "$.lines", "MaxConcurrency": 2,
                          "ItemSelector": {"sku.$": "$$.Map.Item.Value.sku", "n.$": "$$.Map.Item.Index"},
                          "ItemProcessor": {"StartAt": "Reserve", "States": {
                              "Reserve": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:reserve",
                                          "ResultPath": "$.reserved", "Next": "InStock"},
                              "InStock": {"Type": "Choice", "Choices": [
                                  {"Variable": "$.reserved.ok", "BooleanEquals": true, "Next": "Pick"}],
                                  "Default": "Backorder"},
                              "Pick": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:pick", "End": true},
                              "Backorder": {"Type": "Pass", "Result": {"backorder": true}, "End": true}}},
                          "ResultPath": "$.picked", "Next": "Ship"},
                "Ship": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:ship",
                         "Parameters": {"picked.$": "$.picked"}, "End": true}
            }
        });
        let i = import("order", &def).expect("translated");
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["Lines"]["kind"], "workflow");
        assert_eq!(s["Lines"]["workflow"], "order.Lines");
        assert_eq!(s["Lines"]["map"], json!({"items": "/input/lines", "max_concurrency": 2}));
        assert_eq!(s["Lines"]["parameters"], json!({"sku.$": "$.input.item.sku", "n.$": "$.input.index"}));
        assert_eq!(s["Ship"]["parameters"], json!({"picked.$": "$.outputs.Lines"}));
        assert_eq!(i.children.len(), 1);
        let child = &i.children[0];
        assert_eq!(child["name"], "order.Lines");
        let names: Vec<&str> = child["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["Reserve", "Pick"], "the processor's tasks; the Choice is Pick's guard");
        assert!(child["steps"][1]["when"].to_string().contains("$.outputs.Reserve.ok"), "{}", child["steps"][1]);
        // the element's output: Pick's answer, or the Backorder constant, by the way it went
        assert!(child["result"].get("*.choose").is_some(), "{}", child["result"]);
        assert!(i.notes.iter().any(|n| n.contains("the workflow order.Lines")), "{:?}", i.notes);
        assert!(
            i.agents.contains_key("fn.pick") || i.agents.keys().any(|k| k.contains("pick")),
            "{:?}",
            i.agents.keys()
        );
    }

    #[test]
    fn the_ways_out_of_a_choice_follow_each_other_in_the_task_and_a_parallel_s_branches_stay_branches() {
        let def = json!({"StartAt": "Quote", "States": {
            "Quote": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:quote", "ResultPath": "$.q", "Next": "Which"},
            "Which": {"Type": "Choice", "Choices": [
                {"Variable": "$.q.way", "StringEquals": "buy", "Next": "Buy"},
                {"Variable": "$.q.way", "StringEquals": "sell", "Next": "Sell"}], "Default": "Hold"},
            "Buy": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:buy", "ResultPath": "$.done", "Next": "Confirm"},
            "Confirm": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:confirm", "ResultPath": "$.done", "Next": "Report"},
            "Sell": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:sell", "ResultPath": "$.done", "Next": "Report"},
            "Hold": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:hold", "ResultPath": "$.done", "Next": "Report"},
            "Report": {"Type": "Parallel", "End": true, "Branches": [
                {"StartAt": "Mail", "States": {"Mail": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:mail", "End": true}}},
                {"StartAt": "Log", "States": {"Log": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:log", "End": true}}}]}}});
        let i = import("trade", &def).expect("translated");
        loads(&i);
        let s = steps(&i);
        let order: Vec<&str> =
            i.workflow["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        // the first way out waits for Quote; the others follow the step before them in the list
        let first = order.iter().position(|n| ["Buy", "Sell", "Hold"].contains(n)).unwrap();
        assert_eq!(s[order[first]]["after"], json!(["Quote"]));
        for way in ["Buy", "Sell", "Hold"].iter().filter(|w| **w != order[first]) {
            assert!(s[*way].get("after").is_none(), "{way} follows the list: {}", s[*way]);
        }
        assert_eq!(s["Confirm"]["after"], json!(["Buy"]), "a way's chain still names its head (skipped with it)");
        // the Parallel's branches wait for the same steps and have no guards that exclude each other
        assert!(s["Mail"].get("after").is_some() && s["Log"].get("after").is_some(), "{} {}", s["Mail"], s["Log"]);
        let wf = sas_protocol::workflow::WorkflowRegistry::from_json(&json!({"workflows": i.workflows()}).to_string())
            .unwrap();
        let def = wf.resolve("trade", None).unwrap();
        let region_of = |n: &str| def.region_at(def.steps.iter().position(|s| s.name == n).unwrap());
        assert!(
            ["Buy", "Sell", "Hold", "Confirm"].iter().all(|n| region_of(n).is_none()),
            "no branch of a task of its own"
        );
        assert!(region_of("Mail").is_some(), "the Parallel's branches are branches");
    }

    #[test]
    fn a_catch_on_a_parallel_into_a_fail_state_is_the_task_failing_and_any_other_is_refused() {
        let branches = json!([
            {"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:a", "End": true}}},
            {"StartAt": "B", "States": {"B": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:b", "End": true}}}]);
        let def = |catch_to: &str| {
            json!({"StartAt": "Both", "States": {
            "Both": {"Type": "Parallel", "Branches": branches, "End": true,
                     "Catch": [{"ErrorEquals": ["States.ALL"], "Next": catch_to}]},
            "Rejected": {"Type": "Fail", "Error": "Rejected"},
            "Tidy": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:tidy", "End": true}}})
        };
        let i = import("both", &def("Rejected")).expect("translated");
        loads(&i);
        let names: Vec<&str> =
            i.workflow["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["A", "B"], "no step for the Fail state: the task fails as the Parallel does");
        assert!(i.notes.iter().any(|n| n.contains("its Catch leads only to Fail (Rejected)")), "{:?}", i.notes);
        let refused = import("both", &def("Tidy")).expect_err("a Catch into a task is refused");
        assert!(refused.iter().any(|r| r.state == "Both" && r.field == "Catch"), "{refused:?}");
    }

    #[test]
    fn the_execution_s_id_and_name_are_the_submitted_task_s_id_in_a_map_too_but_not_its_input() {
        let def = json!({"StartAt": "Log", "States": {
            "Log": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:log",
                    "Parameters": {"execution.$": "$$.Execution.Id", "name.$": "$$.Execution.Name", "x.$": "$.x"}, "End": true}}});
        let i = import("audit", &def).expect("translated");
        loads(&i);
        assert_eq!(
            steps(&i)["Log"]["parameters"],
            json!({"execution.$": "$.task.root", "name.$": "$.task.root", "x.$": "$.input.x"})
        );
        assert!(i.notes.iter().any(|n| n.contains("$$.Execution.Id is the task's id here")), "{:?}", i.notes);
        // in a map's processor (a workflow run per element): the submitted task's id too
        let in_map = |read: &str| {
            json!({"StartAt": "Each", "States": {"Each": {"Type": "Map", "ItemsPath": "$.l", "End": true,
            "ItemProcessor": {"StartAt": "A", "States": {
                "A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:a",
                      "Parameters": {"run.$": read, "item.$": "$"}, "Next": "B"},
                "B": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:b", "End": true}}}}}})
        };
        let i = import("audit", &in_map("$$.Execution.Id")).unwrap_or_else(|r| panic!("{r:#?}"));
        loads(&i);
        let child = i.children.iter().find(|c| c["name"] == "audit.Each").expect("the processor's workflow");
        assert_eq!(child["steps"][0]["parameters"]["run.$"], "$.task.root", "{child}");
        // its input is the element's here, not the execution's: refused
        let refused = import("audit", &in_map("$$.Execution.Input")).expect_err("refused");
        assert!(refused.iter().any(|r| r.state == "Each" && r.reason.contains("ItemSelector")), "{refused:?}");
    }

    #[test]
    fn a_refusal_inside_a_map_s_workflow_names_the_state_inside_the_map() {
        let def = json!({
            "StartAt": "Lines",
            "States": {
                "Lines": {"Type": "Map", "ItemProcessor": {"StartAt": "A", "States": {
                    "A": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:a", "Next": "B"},
                    "B": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:route53:listHostedZones", "End": true}}},
                    "End": true}
            }
        });
        let refused = import("order", &def).expect_err("refused");
        assert!(refused.iter().any(|r| r.state == "Lines/B" && r.field == "Resource"), "{refused:?}");
    }

    #[test]
    fn a_state_machine_becomes_steps_that_read_the_data_where_it_lives() {
        let def = json!({
            "Comment": "orders",
            "StartAt": "Defaults",
            "States": {
                "Defaults": {"Type": "Pass", "Result": {"currency": "EUR"}, "ResultPath": "$.config", "Next": "Quote"},
                "Quote": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                          "Parameters": {"FunctionName": "quote", "Payload": {"amount.$": "$.total", "cur.$": "$.config.currency"}},
                          "ResultSelector": {"price.$": "$.Payload.price"}, "ResultPath": "$.quote",
                          "TimeoutSeconds": 20, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2, "IntervalSeconds": 3}],
                          "Catch": [{"ErrorEquals": ["States.Timeout"], "Next": "TooSlow", "ResultPath": "$.err"}],
                          "Next": "Big?"},
                "Big?": {"Type": "Choice", "Choices": [{"Variable": "$.quote.price", "NumericGreaterThan": 100, "Next": "Approve"}],
                         "Default": "Ship"},
                "Approve": {"Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                            "Parameters": {"QueueUrl": "https://sqs.eu-west-1.amazonaws.com/1/approvals",
                                           "MessageBody": {"token.$": "$$.Task.Token", "price.$": "$.quote.price"}},
                            "HeartbeatSeconds": 600, "ResultPath": null, "Next": "Ship"},
                "Ship": {"Type": "Parallel", "Branches": [
                    {"StartAt": "Label", "States": {"Label": {"Type": "Task", "Resource": "arn:aws:lambda:eu-west-1:1:function:label", "End": true}}},
                    {"StartAt": "Pause", "States": {"Pause": {"Type": "Wait", "Seconds": 5, "End": true}}}],
                         "ResultPath": "$.shipped", "Next": "Each"},
                "Each": {"Type": "Map", "ItemsPath": "$.lines", "MaxConcurrency": 4,
                         "ItemProcessor": {"StartAt": "Pack", "States": {"Pack": {"Type": "Task", "Resource": "${PackFunctionArn}",
                            "Parameters": {"sku.$": "$$.Map.Item.Value.sku", "i.$": "$$.Map.Item.Index"}, "End": true}}},
                         "ResultPath": "$.packed", "End": true},
                "TooSlow": {"Type": "Fail", "Error": "Slow", "CausePath": "$.err.Cause"}
            }
        });
        let i = import("orders", &def).unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(s.len(), 6, "{s:?}");
        // Pass is no step; its constant is read into the template as a constant
        assert_eq!(s["Quote"]["parameters"], json!({"amount.$": "$.input.total", "cur": "EUR"}));
        assert_eq!(
            s["Quote"]["result_selector"],
            json!({"price.$": "$.price"}),
            "lambda:invoke's Payload is the answer"
        );
        assert_eq!((s["Quote"]["timeout_ms"].clone(), s["Quote"]["max_attempts"].clone()), (json!(20_000), json!(3)));
        assert_eq!(s["Quote"]["on_failure"], json!({"continue": ["timed_out"]}));
        // the Choice: a guard on the step it leads to, and on the normal path, not failed
        let guard = s["Approve"]["when"].to_string();
        assert!(guard.contains("$.outputs.Quote.price") && guard.contains("numeric_greater_than"), "{guard}");
        assert!(guard.contains("$.outputs.Quote.error.kind"), "{guard}");
        assert_eq!(s["Approve"]["kind"], "callback");
        assert_eq!(s["Approve"]["heartbeat_ms"], 600_000);
        assert_eq!(
            s["Approve"]["parameters"],
            json!({"price.$": "$.outputs.Quote.price"}),
            "the token is the request's"
        );
        // both ways join at the Parallel: its branches come after either, when either way was taken
        assert_eq!(s["Label"]["after"], json!(["Approve", "Quote"]));
        assert!(s["Label"]["when"].to_string().contains("\"or\""), "{}", s["Label"]["when"]);
        assert_eq!(s["Label"]["parameters"]["*.$"], "$.input", "a branch gets the Parallel's input");
        assert_eq!(s["Pause"]["wait_ms"], 5000);
        assert_eq!(s["Each"]["after"], json!(["Label", "Pause"]));
        assert_eq!(s["Each"]["map"], json!({"items": "/input/lines", "max_concurrency": 4}));
        assert_eq!(s["Each"]["parameters"], json!({"sku.$": "$.input.item.sku", "i.$": "$.input.index"}));
        // the catcher's way: the Fail reads the error the step kept
        assert_eq!(s["TooSlow"]["agent"], "asl.fail");
        assert_eq!(s["TooSlow"]["parameters"], json!({"error": "Slow", "cause.$": "$.outputs.Quote.error.message"}));
        assert_eq!(
            s["TooSlow"]["when"],
            json!({"variable": "$.outputs.Quote.error.kind", "string_equals": "timed_out"})
        );
        // the agents
        assert_eq!(i.agents["fn.quote"], json!({"kind": "lambda", "function": "quote", "payload": "input"}));
        assert_eq!(i.agents["sqs.approvals"]["kind"], "sqs");
        assert_eq!(i.agents["fn.PackFunctionArn"]["function"], "${PackFunctionArn}");
        assert!(i.notes.iter().any(|n| n.contains("SendTaskSuccess")), "{:?}", i.notes);
    }

    #[test]
    fn variables_are_read_where_their_values_live_whatever_way_set_them() {
        let p_of = |s: &Value| s["parameters"].clone();
        let lambda = |f: &str, payload: Value| {
            json!({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "TimeoutSeconds": 10,
                   "Parameters": {"FunctionName": f, "Payload": payload}})
        };
        let mut get = lambda("get", json!({"id.$": "$.id"}));
        // Assign reads the answer as it comes (its Payload: the step's output here)
        get["ResultPath"] = json!("$.got");
        get["Assign"] = json!({"raw.$": "$.Payload", "tag": "t1", "first.$": "$.Payload.n"});
        get["Next"] = json!("Check");
        let mut use_ = lambda(
            "use",
            json!({"size.$": "$size", "big.$": "$big", "tag.$": "$tag", "n.$": "$raw.n", "at.$": "$.id", "first.$": "$first",
                   "line.$": "States.Format('{} is {}', $raw.n, $size)"}),
        );
        use_["Catch"] = json!([{"ErrorEquals": ["States.ALL"], "Assign": {"why.$": "$.Cause"}, "Next": "Report"}]);
        use_["End"] = json!(true);
        let mut report = lambda("report", json!({"why.$": "$why", "tag.$": "$tag"}));
        report["End"] = json!(true);
        let def = json!({"StartAt": "Get", "States": {
            "Get": get,
            "Check": {"Type": "Choice", "Assign": {"big": false}, "Default": "Small", "Choices": [
                {"Variable": "$raw.n", "NumericGreaterThan": 10, "Assign": {"big": true}, "Next": "Big"}]},
            // every value of one Assign reads the variables as they were before it
            "Big": {"Type": "Pass", "Parameters": {"m.$": "$.got.Payload.m"}, "ResultPath": "$.big", "Assign": {"size": "big", "first.$": "$.m", "tag.$": "$first"}, "Next": "Use"},
            "Small": {"Type": "Pass", "Assign": {"size": "small"}, "Next": "Use"},
            "Use": use_,
            "Report": report
        }});
        let i = import("vars", &def).unwrap_or_else(|r| panic!("{r:#?}"));
        let s = steps(&i);
        assert_eq!(s["Use"]["after"], json!(["Get"]), "{:#}", s["Use"]);
        // reached on both ways out of the Choice: no guard (a decision or its opposite always holds)
        assert!(s["Use"].get("when").is_none(), "{:#}", s["Use"]);
        assert_eq!(p_of(&s["Use"])["at.$"], "$.input.id", "the same on both ways: one path");
        let p = &s["Use"]["parameters"];
        assert_eq!(p["n.$"], "$.outputs.Get.n", "a variable of the answer (a function's Payload): {p:#}");
        let big = json!({"variable": "$.outputs.Get.n", "numeric_greater_than": 10});
        let by_way = |on_big: Value, on_small: Value| json!({"*.choose": [{"value": on_big, "when": big}, {"value": on_small, "when": {"not": big}}]});
        // set on each way: the value of the way taken
        assert_eq!(p["size"], by_way(json!("big"), json!("small")), "{p:#}");
        assert_eq!(p["big"], by_way(json!(true), json!(false)), "{p:#}");
        // an intrinsic function over a value that depends on the way: the call on each way
        let call = |size: &str| json!({"*.$": format!("States.Format('{{}} is {{}}', $.outputs.Get.n, '{size}')")});
        assert_eq!(p["line"], by_way(call("big"), call("small")), "{p:#}");
        // `first` reset on the big way only; `tag` there read the old `first`
        assert_ne!(p["first"], Value::Null, "{p:#}");
        let first = serde_json::to_string(&p["first"]).unwrap();
        assert!(first.contains("$.outputs.Get.m") && first.contains("$.outputs.Get.n"), "{first}");
        let tag = serde_json::to_string(&p["tag"]).unwrap();
        assert!(tag.contains("$.outputs.Get.n") && tag.contains("t1"), "{tag}");
        // a catcher's Assign reads the error
        let r = &s["Report"]["parameters"];
        assert_eq!(r["why.$"], "$.outputs.Use.error.message", "{r:#}");
        // read where it was never set, or set on one way only: refused, naming it
        let mut def2 = def.clone();
        def2["States"]["Small"]["Assign"] = json!({"other": 1});
        let r = import("vars", &def2).unwrap_err();
        assert!(
            r.iter().any(|x| x.state == "Use" && x.reason.contains("the variable $size is not set on every way")),
            "{r:#?}"
        );
        // a ResultSelector applied to the answer alone reads no variable; beside it, the answer
        // is not kept whole for an Assign to read
        let mut def3 = def.clone();
        def3["States"]["Get"]["ResultSelector"] = json!({"n.$": "$tag"});
        let r = import("vars", &def3).unwrap_err();
        assert!(r.iter().any(|x| x.state == "Get" && x.field == "ResultSelector"), "{r:#?}");
        def3["States"]["Get"]["ResultSelector"] = json!({"n.$": "$.Payload.n"});
        let r = import("vars", &def3).unwrap_err();
        assert!(
            r.iter().any(|x| x.state == "Get" && x.field == "Assign" && x.reason.contains("ResultSelector")),
            "{r:#?}"
        );
        // not a variable's name
        let mut def4 = def.clone();
        def4["States"]["Small"]["Assign"] = json!({"size": "small", "states": 1});
        let r = import("vars", &def4).unwrap_err();
        assert!(r.iter().any(|x| x.state == "Small" && x.field == "Assign"), "{r:#?}");
    }

    #[test]
    fn a_polling_loop_becomes_a_loop_step_whose_body_is_a_workflow_and_whose_check_leads_on() {
        // the book's poll.asl.json, with Lambda functions: wait, ask, and go back until done
        let def = json!({"StartAt": "Start", "States": {
            "Start": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:start", "ResultPath": "$.job", "Next": "Wait"},
            "Wait": {"Type": "Wait", "Seconds": 30, "Next": "Status"},
            "Status": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:status",
                       "Parameters": {"id.$": "$.job.id"}, "ResultPath": "$.status", "Next": "Done?"},
            "Done?": {"Type": "Choice", "Choices": [
                {"Variable": "$.status.state", "StringEquals": "SUCCEEDED", "Next": "Store"},
                {"Variable": "$.status.state", "StringEquals": "FAILED", "Next": "Failed"}], "Default": "Wait"},
            "Failed": {"Type": "Fail", "Error": "JobFailed"},
            "Store": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:store", "End": true}
        }});
        let i = import("poll", &def).unwrap_or_else(|r| panic!("{r:?}"));
        let steps = steps(&i);
        let l = &steps["Done_"];
        assert_eq!(
            (l["kind"].clone(), l["workflow"].clone(), l["max_iterations"].clone()),
            (json!("loop"), json!("poll.Done_"), json!(LOOP_BOUND))
        );
        assert_eq!(l["after"], json!(["Start"]));
        // the first iteration reads what arrives at the loop, the next ones the last one's output
        assert_eq!(l["parameters"]["*.choose"][1]["value"], json!({"*.$": "$.loop.previous"}));
        // it goes on while neither rule leading out holds
        let until = l["until"].to_string();
        assert!(
            until.contains("SUCCEEDED") && until.contains("FAILED") && until.contains("$.outputs.Done_.status.state"),
            "{until}"
        );
        // the body: the wait and the call, a workflow of its own whose result is the data the check reads
        let body = &i.children[0];
        let names: Vec<&str> = body["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["Wait", "Status"]);
        assert!(body["result"].to_string().contains("$.outputs.Status"), "{}", body["result"]);
        // after the loop: Store when SUCCEEDED, the failure when FAILED, both read the loop's output
        assert!(steps["Store"]["when"].to_string().contains("$.outputs.Done_.status.state"), "{}", steps["Store"]);
        assert!(steps.contains_key("Failed"));
        assert!(i.notes.iter().any(|n| n.contains("fails after 1000 iterations")), "{:?}", i.notes);
        loads(&i);
    }

    #[test]
    fn a_loop_whose_check_comes_first_is_a_while_loop_that_may_run_no_iteration() {
        // pagination: list, then fetch a page while there is a next one
        let def = json!({"StartAt": "List", "States": {
            "List": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:list", "Next": "More?"},
            "More?": {"Type": "Choice", "Choices": [{"Variable": "$.next", "IsPresent": true, "Next": "Page"}], "Default": "Done"},
            "Page": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:page",
                     "Parameters": {"token.$": "$.next"}, "Next": "Pause"},
            "Pause": {"Type": "Wait", "Seconds": 1, "Next": "More?"},
            "Done": {"Type": "Pass", "Parameters": {"last.$": "$.count"}, "End": true}
        }});
        let i = import("pages", &def).unwrap_or_else(|r| panic!("{r:?}"));
        let all = steps(&i);
        let l = &all["More_"];
        assert_eq!((l["kind"].clone(), l["workflow"].clone()), (json!("loop"), json!("pages.More_")));
        assert_eq!(l["after"], json!(["List"]));
        assert!(l.get("until").is_none() && l.get("when").is_none(), "{l}");
        // decided before each iteration: on List's output first, on the last iteration's after
        let w = l["while"].to_string();
        assert!(
            w.contains("$.loop.index") && w.contains("$.outputs.List.next") && w.contains("$.outputs.More_.next"),
            "{w}"
        );
        assert_eq!(l["parameters"]["*.choose"][0]["value"], json!({"*.$": "$.outputs.List"}));
        assert_eq!(l["parameters"]["*.choose"][1]["value"], json!({"*.$": "$.loop.previous"}));
        // the body: the page and the pause, in that order, each iteration
        let body = &i.children[0];
        let names: Vec<&str> = body["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["Page", "Pause"]);
        // after no iteration (output null), what follows reads List's output; after some, the last
        let result = i.workflow["result"].to_string();
        assert!(
            result.contains("is_null")
                && result.contains("$.outputs.List.count")
                && result.contains("$.outputs.More_.count"),
            "{result}"
        );
        assert!(i.notes.iter().any(|n| n.contains("the check comes first")), "{:?}", i.notes);
        loads(&i);
        // a loop at the very start, without a Default: it reads the task's input first, and a
        // check that matches no rule fails the task, before the loop or after it
        let def = json!({"StartAt": "Again?", "States": {
            "Again?": {"Type": "Choice", "Choices": [
                {"Variable": "$.n", "NumericLessThan": 3, "Next": "Add"},
                {"Variable": "$.n", "NumericGreaterThanEquals": 3, "Next": "Stop"}]},
            "Add": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:add", "Next": "Again?"},
            "Stop": {"Type": "Succeed"}
        }});
        let i = import("count", &def).unwrap_or_else(|r| panic!("{r:?}"));
        let all = steps(&i);
        let l = &all["Again_"];
        assert_eq!(l["after"], json!([]));
        assert!(l["while"].to_string().contains("$.input.n"), "{}", l["while"]);
        assert_eq!(l["parameters"]["*.choose"][0]["value"], json!({"*.$": "$.input"}));
        assert!(all.keys().any(|k| k.contains("no_choice_matched")), "{:?}", all.keys());
        loads(&i);
    }

    #[test]
    fn a_loop_whose_check_is_in_its_middle_runs_the_states_before_it_once_and_again_in_each_iteration() {
        // process a page, then fetch the next one while there is one, and process it
        let def = json!({"StartAt": "List", "States": {
            "List": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:list", "ResultPath": "$.page", "Next": "Process"},
            "Process": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:process",
                        "Parameters": {"items.$": "$.page.items"}, "ResultPath": "$.done", "Next": "More?"},
            "More?": {"Type": "Choice", "Choices": [{"Variable": "$.page.next", "IsPresent": true, "Next": "Next page"}],
                      "Default": "Finish"},
            "Next page": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:list",
                          "Parameters": {"token.$": "$.page.next"}, "ResultPath": "$.page", "Next": "Process"},
            "Finish": {"Type": "Succeed"}
        }});
        let i = import("pages", &def).unwrap_or_else(|r| panic!("{r:?}"));
        let all = steps(&i);
        let names: Vec<&str> =
            i.workflow["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["List", "Process", "More_"]);
        let l = &all["More_"];
        assert_eq!((l["kind"].clone(), l["after"].clone()), (json!("loop"), json!(["Process"])));
        let w = l["while"].to_string();
        assert!(w.contains("$.outputs.List.next") && w.contains("$.outputs.More_.page.next"), "{w}");
        // each iteration: the next page, then the processing again
        let body = &i.children[0];
        let names: Vec<&str> = body["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["Next_page", "Process"]);
        loads(&i);
    }

    #[test]
    fn what_cannot_be_translated_is_refused_with_its_state_and_field() {
        let refused = |states: Value| import("x", &json!({"StartAt": "A", "States": states})).unwrap_err();
        // a loop entered in its middle (B, from Start) is refused, naming where
        let r = import("x", &json!({"StartAt": "Start", "States": {
            "Start": {"Type": "Choice", "Choices": [{"Variable": "$.skip", "BooleanEquals": true, "Next": "B"}], "Default": "A"},
            "A": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "f"}, "Next": "B"},
            "B": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "g"}, "Next": "Done?"},
            "Done?": {"Type": "Choice", "Choices": [{"Variable": "$.Payload.done", "BooleanEquals": false, "Next": "A"}], "Default": "End"},
            "End": {"Type": "Succeed"}
        }}))
        .unwrap_err();
        assert_eq!((r[0].state.as_str(), r[0].field.as_str()), ("A", "Next"));
        assert!(
            r[0].reason.contains("a loop over A, B, Done? entered elsewhere than at A (B from Start)"),
            "{}",
            r[0].reason
        );
        // a loop whose check comes first and leads into it at two states
        let r = refused(json!({
            "A": {"Type": "Choice", "Choices": [{"Variable": "$.more", "BooleanEquals": true, "Next": "B"},
                                                {"Variable": "$.more", "StringEquals": "yes", "Next": "C"}], "Default": "End"},
            "B": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "f"}, "OutputPath": "$.Payload", "Next": "C"},
            "C": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "g"}, "OutputPath": "$.Payload", "Next": "A"},
            "End": {"Type": "Succeed"}
        }));
        assert!(
            r[0].reason.contains("whose check A comes first and leads into it at several states (B, C)"),
            "{}",
            r[0].reason
        );
        let r = refused(
            json!({"A": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:route53:listHostedZones", "End": true}}),
        );
        assert_eq!(r[0].field, "Resource");
        assert!(r[0].reason.contains("Lambda function"), "says what to do instead: {}", r[0].reason);
        let r =
            refused(json!({"A": {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:putItem.sync", "End": true}}));
        assert!(r[0].reason.contains(".sync"), "{}", r[0].reason);
        let r = refused(
            json!({"A": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f", "TimeoutSeconds": 300, "End": true}}),
        );
        assert!(r[0].field == "TimeoutSeconds" && r[0].reason.contains("callback"), "{r:?}");
        let r = refused(json!({"A": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f",
                                     "Parameters": {"x.$": "States.MathRandom(1, 9)"}, "End": true}}));
        assert!(r[0].field == "Parameters" && r[0].reason.contains("would change"), "{r:?}");
        // an intrinsic function it can call: its paths rewritten to where the data lives
        let i = import("x", &json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f",
            "Parameters": {"x.$": "States.Format('{} items', $.n)", "y.$": "States.ArrayLength($$.Execution.Input.l)"}, "End": true}}}))
        .unwrap();
        assert_eq!(
            i.workflow["steps"][0]["parameters"],
            json!({"x.$": "States.Format('{} items', $.input.n)", "y.$": "States.ArrayLength($.input.l)"})
        );
        let r = refused(json!({"A": {"Type": "Map", "ItemReader": {}, "ItemProcessor": {}, "End": true}}));
        assert!(r[0].field == "ItemReader" && r[0].reason.contains("s3:listObjectsV2"), "{r:?}");
        let r = refused(
            json!({"A": {"Type": "Map", "ItemBatcher": {"MaxItemsPerBatch": 2}, "ItemProcessor": {}, "End": true}}),
        );
        assert!(r[0].field == "ItemBatcher" && r[0].reason.contains("batches"), "{r:?}");
        let r = import("x", &json!({"QueryLanguage": "XPath", "StartAt": "A", "States": {}})).unwrap_err();
        assert_eq!(r[0].field, "QueryLanguage");
    }

    #[test]
    fn a_uuid_is_named_by_the_task_and_the_state_that_makes_it_so_every_read_and_attempt_sees_one() {
        let i = import("x", &json!({"StartAt": "Id", "States": {
            "Id": {"Type": "Pass", "Parameters": {"id.$": "States.UUID()", "n.$": "$.n"}, "Next": "Put"},
            "Put": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f",
                    "Parameters": {"ticket.$": "States.Format('t-{}', $.id)", "again.$": "$.id", "other.$": "States.UUID()"},
                    "End": true}}}))
        .unwrap();
        let made = "States.UUID($.task.id, 'Id#1')";
        assert_eq!(
            i.workflow["steps"][0]["parameters"],
            json!({"ticket.$": format!("States.Format('t-{{}}', {made})"), "again.$": made,
                   "other.$": "States.UUID($.task.id, 'Put#1')"})
        );
        assert!(i.notes.iter().any(|n| n.contains("States.UUID() is a UUID named by the task")), "{:?}", i.notes);
        // made before a Parallel and read in its branches: each branch is a task of its own
        let r = import("x", &json!({"StartAt": "Id", "States": {"Id": {"Type": "Pass", "Parameters": {"id.$": "States.UUID()"}, "Next": "Both"},
            "Both": {"Type": "Parallel", "End": true, "Branches": [
                {"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:a", "End": true}}}]}}}))
        .unwrap_err();
        assert!(r.iter().any(|x| x.state == "Both" && x.reason.contains("States.UUID()")), "{r:?}");
    }

    #[test]
    fn an_http_task_is_an_http_agent_sending_its_request_body() {
        let i = import(
            "x",
            &json!({"StartAt": "Call", "States": {"Call": {"Type": "Task", "Resource": "arn:aws:states:::http:invoke",
            "Parameters": {"ApiEndpoint": "https://api.example.com/v1/items", "Method": "PUT",
                           "Authentication": {"ConnectionArn": "arn:aws:events:r:1:connection/c/x"},
                           "QueryParameters": {"mode": "fast lane"}, "RequestBody": {"sku.$": "$.sku"}},
            "ResultSelector": {"id.$": "$.ResponseBody.id", "code.$": "$.StatusCode"}, "End": true}}}),
        )
        .unwrap();
        loads(&i);
        assert_eq!(
            i.agents["http.items"],
            json!({"kind": "http", "url": "https://api.example.com/v1/items?mode=fast%20lane", "method": "PUT", "payload": "input"})
        );
        let s = steps(&i);
        assert_eq!(s["Call"]["parameters"], json!({"sku.$": "$.input.sku"}));
        assert_eq!(s["Call"]["result_selector"], json!({"id.$": "$.id", "code": 200}));
        assert!(i.notes.iter().any(|n| n.contains("Authentication")), "{:?}", i.notes);
        let r = import(
            "x",
            &json!({"StartAt": "C", "States": {"C": {"Type": "Task", "Resource": "arn:aws:states:::http:invoke",
            "Parameters": {"ApiEndpoint": "https://a/", "Headers": {"x": "1"}}, "End": true}}}),
        )
        .unwrap_err();
        assert!(r[0].reason.contains("Headers"), "{r:?}");
    }

    #[test]
    fn catchers_of_named_errors_continue_on_those_names_and_a_later_catcher_takes_the_rest() {
        let i = import("x", &json!({"StartAt": "Get", "States": {
            "Get": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:getObject",
                    "Parameters": {"Bucket": "b", "Key.$": "$.key"}, "ResultPath": "$.got", "Next": "Done",
                    "Catch": [{"ErrorEquals": ["S3.NoSuchKeyException"], "ResultPath": "$.error", "Next": "Missing"},
                              {"ErrorEquals": ["States.Timeout"], "Next": "Late"}]},
            "Missing": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:m", "Parameters": {"e.$": "$.error.Error"}, "End": true},
            "Late": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:l", "End": true},
            "Done": {"Type": "Succeed"}}}))
        .unwrap_or_else(|r| panic!("{r:#?}"));
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["Get"]["on_failure"], json!({"continue": ["timed_out", "S3.NoSuchKeyException"]}));
        let missing = s["Missing"]["when"].to_string();
        assert!(missing.contains("$.outputs.Get.error.name") && missing.contains("S3.NoSuchKeyException"), "{missing}");
        let late = s["Late"]["when"].to_string();
        assert!(late.contains("timed_out") && late.contains("\"not\""), "the name's way taken first: {late}");
        // the catcher of one name gives that name as the Error
        assert_eq!(s["Missing"]["parameters"], json!({"e": "S3.NoSuchKeyException"}));
    }

    #[test]
    fn a_path_that_names_many_values_is_read_as_their_array_where_the_data_lives() {
        let i = import("x", &json!({"StartAt": "Consts", "States": {
            "Consts": {"Type": "Pass", "Result": [1, 2, 3], "ResultPath": "$.consts", "Next": "List"},
            "List": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:lambda:listVersionsByFunction",
                     "Parameters": {"FunctionName": "f"}, "ResultSelector": {"versions.$": "$.Versions[*].Version"},
                     "ResultPath": "$.listed", "Next": "Keep"},
            "Keep": {"Type": "Pass", "Parameters": {"rest.$": "$.listed.versions[1:]", "first.$": "$.listed.versions[0]",
                                                   "fixed.$": "$.consts[1:]"}, "ResultPath": "$.kept", "Next": "Use"},
            "Use": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f",
                    "Parameters": {"rest.$": "$.kept.rest", "rows.$": "$.rows[?(@.n > 1)].id", "fixed.$": "$.kept.fixed"}, "End": true}}}))
        .unwrap_or_else(|r| panic!("{r:#?}"));
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["List"]["result_selector"], json!({"versions.$": "$.Versions[*].Version"}));
        assert_eq!(
            s["Use"]["parameters"],
            json!({"rest.$": "$.outputs.List.versions[1:]", "rows.$": "$.input.rows[?(@.n > 1)].id", "fixed": [2, 3]})
        );
        // a filter Step Functions' own library reads but RFC 9535 does not (an unquoted string): said
        let r = import(
            "x",
            &json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f",
            "Parameters": {"x.$": "$.labels[?(@.Name==Receipt)]"}, "End": true}}}),
        )
        .unwrap_err();
        assert!(r[0].reason.contains("is not a JSONPath"), "{r:?}");
    }

    #[test]
    fn an_api_gateway_task_is_an_http_agent_signed_for_execute_api_at_its_stage_and_path() {
        let call = |params: Value| {
            import(
                "x",
                &json!({"StartAt": "Add", "States": {"Add": {"Type": "Task", "Resource": "arn:aws:states:::apigateway:invoke",
                "Parameters": params, "ResultSelector": {"body.$": "$.ResponseBody", "code.$": "$.StatusCode"}, "End": true}}}),
            )
        };
        let i = call(json!({"ApiEndpoint": "${APIID}.execute-api.${REGION}.amazonaws.com", "Method": "POST",
            "Stage": "prod", "Path": "/pets", "QueryParameters": {"tag": ["a", "b c"]}, "RequestBody.$": "$.pet",
            "AuthType": "IAM_ROLE"}))
        .unwrap();
        loads(&i);
        let (name, agent) = i.agents.iter().next().unwrap();
        assert_eq!(name, "http.pets");
        assert_eq!(
            agent,
            &json!({"kind": "http", "url": "https://${APIID}.execute-api.${REGION}.amazonaws.com/prod/pets?tag=a&tag=b%20c",
                    "method": "POST", "payload": "input", "sign": {"service": "execute-api"}})
        );
        let s = steps(&i);
        assert_eq!(s["Add"]["parameters"], json!({"*.$": "$.input.pet"}));
        assert_eq!(s["Add"]["result_selector"], json!({"body.$": "$", "code": 200}));
        assert!(i.notes.iter().any(|n| n.contains("AgentSignedApiArns")), "{:?}", i.notes);
        // without IAM auth: not signed; GET by default
        let i = call(json!({"ApiEndpoint": "https://abc.execute-api.eu-west-1.amazonaws.com", "AuthType": "NO_AUTH"}))
            .unwrap();
        let agent = i.agents.values().next().unwrap();
        assert!(agent.get("sign").is_none() && agent["method"] == "GET", "{agent}");
        // an address read from the data, or headers: refused
        let r = call(json!({"ApiEndpoint": "a.execute-api.r.amazonaws.com", "Path.$": "$.path"})).unwrap_err();
        assert!(r[0].reason.contains("Path is read from the data"), "{r:?}");
        let r = call(json!({"ApiEndpoint": "a", "Headers": {"x": ["1"]}})).unwrap_err();
        assert!(r[0].reason.contains("Headers"), "{r:?}");
    }

    #[test]
    fn waits_of_seconds_read_from_the_data_and_of_a_written_time_are_wait_steps() {
        let i = import(
            "x",
            &json!({"StartAt": "A", "States": {
            "A": {"Type": "Wait", "SecondsPath": "$.delay", "Next": "B"},
            "B": {"Type": "Wait", "Timestamp": "2026-12-24T18:00:00Z", "End": true}}}),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!((s["A"]["kind"].clone(), s["A"]["wait_for"].clone()), (json!("wait"), json!("/input/delay")));
        assert_eq!(s["B"]["wait_until"], "2026-12-24T18:00:00Z");
    }

    #[test]
    fn a_state_reached_two_ways_reads_the_data_of_the_way_taken() {
        let i = import("x", &json!({"StartAt": "C", "States": {
            "C": {"Type": "Choice", "Choices": [{"Variable": "$.express", "BooleanEquals": true, "Next": "Courier"}], "Default": "Post"},
            "Courier": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:courier", "Next": "Label"},
            "Post": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:post", "Next": "Label"},
            "Label": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:label", "End": true}
        }}))
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["Label"]["after"], json!(["Courier", "Post"]));
        let choose = &s["Label"]["parameters"]["*.choose"];
        assert_eq!(choose[0]["value"], json!({"*.$": "$.outputs.Courier"}), "{choose}");
        assert_eq!(choose[0]["when"], json!({"variable": "$.input.express", "boolean_equals": true}));
        assert_eq!(choose[1]["value"], json!({"*.$": "$.outputs.Post"}));
        assert_eq!(i.workflow["result"], json!({"*.$": "$.outputs.Label"}));
    }

    #[test]
    fn a_choice_without_default_fails_the_task_when_no_rule_matches() {
        let i = import(
            "x",
            &json!({"StartAt": "C", "States": {
                "C": {"Type": "Choice", "Choices": [{"Variable": "$.n", "NumericEquals": 1, "Next": "One"}]},
                "One": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:one", "End": true}
            }}),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["C_no_choice_matched"]["agent"], "asl.fail");
        assert_eq!(s["C_no_choice_matched"]["when"], json!({"not": {"variable": "$.input.n", "numeric_equals": 1}}));
        assert_eq!(s["One"]["when"], json!({"variable": "$.input.n", "numeric_equals": 1}));
        assert_eq!(i.agents["asl.fail"], json!({"kind": "fail"}));
    }

    fn lambda_task(retry: &Value) -> Value {
        json!({"StartAt": "Charge", "States": {"Charge": {"Type": "Task",
            "Resource": "arn:aws:lambda:eu-west-1:1:function:charge", "Retry": retry, "End": true}}})
    }

    #[test]
    fn a_lambda_retrier_is_the_step_s_attempts_interval_and_backoff_rate() {
        // the retrier the console writes: Lambda's own errors, 6 retries from 2 s, doubling
        let i = import(
            "x",
            &lambda_task(&json!([{"ErrorEquals": ["Lambda.ServiceException", "Lambda.AWSLambdaException",
                "Lambda.SdkClientException", "Lambda.TooManyRequestsException"],
                "IntervalSeconds": 2, "MaxAttempts": 6, "BackoffRate": 2}])),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["Charge"]["max_attempts"], 7, "a throttle is retried 6 times, as Step Functions does");
        assert_eq!(s["Charge"]["backoff"], json!({"base_ms": 2000, "max_ms": 900_000, "multiplier": 2.0}));
        let note = i.notes.iter().find(|n| n.starts_with("Charge: Retry:")).expect("the retry's note");
        assert!(note.contains("Lambda's own errors"), "{note}");
        assert!(note.contains("equal jitter"), "{note}");
        assert_eq!(
            s["Charge"]["retry_on"],
            json!([
                "retryable",
                "Lambda.ServiceException",
                "Lambda.AWSLambdaException",
                "Lambda.SdkClientException",
                "Lambda.TooManyRequestsException"
            ])
        );
        // a retrier of a function's own error: that error only (and a timeout when named)
        let i =
            import("x", &lambda_task(&json!([{"ErrorEquals": ["CustomError", "States.Timeout"], "MaxAttempts": 2}])))
                .unwrap();
        loads(&i);
        assert_eq!(steps(&i)["Charge"]["retry_on"], json!(["timed_out", "CustomError"]));
        // the agent makes one call per attempt: the step's attempts are the retries
        let file = crate::agents_file(&i.agents);
        assert_eq!(file["agents"]["fn.charge"]["retry"]["max_calls"], 1);

        // every field: MaxDelaySeconds caps the waits, BackoffRate as written, States.ALL's note
        let i = import(
            "x",
            &lambda_task(&json!([{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 3, "MaxAttempts": 4,
                "BackoffRate": 1.5, "MaxDelaySeconds": 10, "JitterStrategy": "FULL"}])),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(s["Charge"]["max_attempts"], 5);
        assert_eq!(s["Charge"]["backoff"], json!({"base_ms": 3000, "max_ms": 10_000, "multiplier": 1.5}));
        let note = i.notes.iter().find(|n| n.starts_with("Charge: Retry:")).unwrap();
        assert!(note.contains("PermanentError") && note.contains("FULL"), "{note}");
        assert!(steps(&i)["Charge"].get("retry_on").is_none(), "States.ALL: every failure that may pass");

        // defaults (3 attempts, 1 s, ×2); a retrier of a timeout only says a timeout is retried
        let i = import("x", &lambda_task(&json!([{"ErrorEquals": ["States.TaskFailed"]}]))).unwrap();
        let s = steps(&i);
        assert_eq!(s["Charge"]["max_attempts"], 4);
        assert_eq!(s["Charge"]["backoff"], json!({"base_ms": 1000, "max_ms": 900_000, "multiplier": 2.0}));
        assert!(i.notes.iter().any(|n| n.contains("a timeout is retried too")), "{:?}", i.notes);

        // several retriers: the most attempts, with that retrier's waits
        let i = import(
            "x",
            &lambda_task(&json!([
                {"ErrorEquals": ["Lambda.TooManyRequestsException"], "IntervalSeconds": 2, "MaxAttempts": 6, "BackoffRate": 2},
                {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 5, "MaxAttempts": 2}])),
        )
        .unwrap();
        let s = steps(&i);
        assert_eq!(
            (s["Charge"]["max_attempts"].clone(), s["Charge"]["backoff"]["base_ms"].clone()),
            (json!(7), json!(2000))
        );
        assert!(i.notes.iter().any(|n| n.contains("2 retriers are one count")), "{:?}", i.notes);

        // MaxAttempts 0: no retry; out-of-range values are said and kept within the model's bounds
        let i = import("x", &lambda_task(&json!([{"ErrorEquals": ["States.ALL"], "MaxAttempts": 0}]))).unwrap();
        assert!(steps(&i)["Charge"].get("max_attempts").is_none());
        let i = import(
            "x",
            &lambda_task(&json!([{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 3600, "BackoffRate": 20}])),
        )
        .unwrap();
        loads(&i);
        assert_eq!(steps(&i)["Charge"]["backoff"], json!({"base_ms": 900_000, "max_ms": 900_000, "multiplier": 10.0}));
        let note = i.notes.iter().find(|n| n.starts_with("Charge: Retry:")).unwrap();
        assert!(note.contains("IntervalSeconds 3600") && note.contains("BackoffRate 20"), "{note}");
        // a retrier that is not one is refused with its place
        let r = import("x", &lambda_task(&json!([{"ErrorEquals": [], "MaxAttempts": 2}]))).unwrap_err();
        assert_eq!((r[0].field.as_str(), r[0].state.as_str()), ("Retry[0]", "Charge"), "{r:?}");
        let r = import("x", &lambda_task(&json!([{"ErrorEquals": ["States.ALL"], "BackoffRate": 0.5}]))).unwrap_err();
        assert!(r[0].reason.contains("BackoffRate"), "{r:?}");
    }

    #[test]
    fn bracket_paths_read_the_names_they_quote() {
        let i = import(
            "x",
            &json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:f",
                "Parameters": {"who.$": "$.['first name']", "body.$": "$.[0].body", "item.$": "$.items[0]",
                               "id.$": "$['id']", "run.$": "$$.Execution.Input.['run id']"},
                "ResultSelector": {"x.$": "$.['a b']"}, "End": true}}}),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert_eq!(
            s["A"]["parameters"],
            json!({"who.$": "$.input['first name']", "body.$": "$.input[0].body", "item.$": "$.input.items[0]",
                   "id.$": "$.input.id", "run.$": "$.input['run id']"})
        );
        assert_eq!(s["A"]["result_selector"], json!({"x.$": "$['a b']"}));
    }

    #[test]
    fn events_to_one_bus_with_different_detail_types_are_one_agent_each() {
        let put = |detail_type: &str, next: Value| {
            let mut st = json!({"Type": "Task", "Resource": "arn:aws:states:::events:putEvents",
                "Parameters": {"Entries": [{"EventBusName": "orders", "Source": "shop", "DetailType": detail_type,
                                            "Detail": {"id.$": "$.id"}}]}, "ResultPath": null});
            match next {
                Value::String(n) => st["Next"] = json!(n),
                _ => st["End"] = json!(true),
            }
            st
        };
        let i = import(
            "x",
            &json!({"StartAt": "Placed", "States": {
                "Placed": put("OrderPlaced", json!("Paid")),
                "Paid": put("OrderPaid", json!("Shipped")),
                "Shipped": put("Order Shipped", Value::Null)}}),
        )
        .expect("translated");
        loads(&i);
        let s = steps(&i);
        let agent = |step: &str| s[step]["agent"].as_str().unwrap().to_owned();
        assert_eq!(
            [agent("Placed"), agent("Paid"), agent("Shipped")],
            ["bus.orders.OrderPlaced.send", "bus.orders.OrderPaid.send", "bus.orders.Order-Shipped.send"]
        );
        for (name, dt) in [("Placed", "OrderPlaced"), ("Paid", "OrderPaid"), ("Shipped", "Order Shipped")] {
            assert_eq!(i.agents[&agent(name)]["detail_type"], dt);
        }
        assert_eq!(i.agents.len(), 3, "{:?}", i.agents.keys());
        // the same event twice is one agent; other agents that would share a name are numbered
        let i = import(
            "x",
            &json!({"StartAt": "A", "States": {
            "A": {"Type": "Task", "Resource": "arn:aws:lambda:eu-west-1:1:function:quote", "Next": "B"},
            "B": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:2:function:quote", "Next": "C"},
            "C": {"Type": "Task", "Resource": "arn:aws:lambda:eu-west-1:1:function:quote", "End": true}}}),
        )
        .unwrap();
        let s = steps(&i);
        assert_eq!(
            [&s["A"]["agent"], &s["B"]["agent"], &s["C"]["agent"]],
            [&json!("fn.quote"), &json!("fn.quote-2"), &json!("fn.quote")]
        );
        // across definitions imported together: the later one's agent is named apart, in its steps too
        let one = |dt: &str| import("x", &json!({"StartAt": "P", "States": {"P": put(dt, Value::Null)}})).unwrap();
        let mut all = Map::new();
        let mut first = one("OrderPlaced");
        assert!(merge_agents(&mut all, &mut first).is_empty());
        let mut second = one("OrderPaid");
        let said = merge_agents(&mut all, &mut second);
        assert_eq!(second.workflow["steps"][0]["agent"], "bus.orders.OrderPaid.send", "{said:?}");
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn a_refusal_names_every_blocker_of_the_definition() {
        let r = import("x", &json!({"StartAt": "Get", "States": {
            "Get": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:route53:getHostedZone",
                    "TimeoutSecondsPath": "$.t", "Parameters": {"id.$": "States.MathRandom(1, 9)"}, "Next": "Check"},
            "Check": {"Type": "Choice", "Choices": [{"Variable": "$.done", "BooleanEquals": false, "Next": "Get"}],
                      "Default": "Both"},
            "Both": {"Type": "Parallel", "Retry": [{"ErrorEquals": ["States.ALL"]}], "Next": "Each", "Branches": [
                {"StartAt": "Glue", "States": {"Glue": {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:putItem.sync", "End": true}}},
                {"StartAt": "Ok", "States": {"Ok": {"Type": "Task", "Resource": "arn:aws:lambda:r:1:function:ok", "End": true}}}]},
            "Each": {"Type": "Map", "ItemReader": {}, "ItemProcessor": {"StartAt": "Put", "States": {
                "Put": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:apigateway:getRestApis", "End": true}}}, "End": true}
        }}))
        .unwrap_err();
        let has = |state: &str, field: &str| r.iter().any(|x| x.state == state && x.field == field);
        assert!(has("Get", "Next"), "the loop: {r:#?}");
        assert!(has("Get", "Resource") && has("Get", "TimeoutSecondsPath") && has("Get", "Parameters"), "{r:#?}");
        assert!(has("Both", "Retry") && has("Both/branch 0/Glue", "Resource"), "{r:#?}");
        assert!(has("Each", "ItemReader") && has("Each/Put", "Resource"), "{r:#?}");
        assert!(!has("Both/branch 1/Ok", "Resource"), "{r:#?}");
        // the protocol of a service the aws kind does not speak is named
        assert!(r.iter().any(|x| x.state == "Each/Put" && x.reason.contains("rest-json")), "{r:#?}");
    }

    #[test]
    fn an_aws_sdk_task_is_an_aws_agent_with_the_names_written_in_the_definition_fixed() {
        let i = import("x", &json!({"StartAt": "Put", "States": {
            "Put": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:dynamodb:putItem", "Next": "Start",
                    "Parameters": {"TableName": "orders", "Item": {"id": {"S.$": "$.id"}}}, "ResultPath": "$.put"},
            "Start": {"Type": "Task", "Resource": "arn:aws:states:::states:startExecution", "End": true,
                      "Parameters": {"StateMachineArn": "arn:aws:states:us-east-1:1:stateMachine:child", "Input.$": "$.put"}}
        }}))
        .unwrap();
        let s = steps(&i);
        let put = &i.agents[s["Put"]["agent"].as_str().unwrap()];
        assert_eq!(
            put,
            &json!({"kind": "aws", "service": "dynamodb", "action": "PutItem", "parameters": {"TableName": "orders"},
                    "resources": ["arn:aws:dynamodb:*:*:table/orders", "arn:aws:dynamodb:*:*:table/orders/index/*"]})
        );
        // the step sends what the agent does not fix
        assert_eq!(s["Put"]["parameters"], json!({"Item": {"id": {"S.$": "$.input.id"}}}));
        let start = &i.agents[s["Start"]["agent"].as_str().unwrap()];
        assert_eq!(start["service"], "sfn");
        assert_eq!(start["action"], "StartExecution");
        assert_eq!(start["resources"], json!(["arn:aws:states:us-east-1:1:stateMachine:child"]));
        // the answer is the output, under ResultPath
        assert_eq!(s["Start"]["parameters"]["Input.$"], "$.outputs.Put");
        // a ResultSelector calling an intrinsic over the answer: the step keeps the answer, and
        // what reads the selection reads the call over it
        let i = import(
            "x",
            &json!({"StartAt": "Get", "States": {
                "Get": {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:getItem", "Next": "Use",
                        "Parameters": {"TableName": "locks", "Key": {"id": {"S.$": "$.id"}}},
                        "ResultSelector": {"text.$": "States.JsonToString($.Item)", "id.$": "$.Item.id.S"}},
                "Use": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:use", "End": true,
                        "Parameters": {"text.$": "$.text", "id.$": "$.id"}}
            }}),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        assert!(s["Get"].get("result_selector").is_none(), "the step keeps the whole answer");
        assert_eq!(s["Use"]["parameters"]["text.$"], "States.JsonToString($.outputs.Get.Item)");
        assert_eq!(s["Use"]["parameters"]["id.$"], "$.outputs.Get.Item.id.S");
        // an S3 object's body parsed by the selector: the agent parses it, what follows reads into it
        let i = import(
            "x",
            &json!({"StartAt": "Get", "States": {
                "Get": {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:getObject", "Next": "Use",
                        "Parameters": {"Bucket": "reports", "Key.$": "$.key"},
                        "ResultSelector": {"doc.$": "States.StringToJson($.Body)", "type.$": "$.ContentType"}},
                "Use": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:use", "End": true,
                        "Parameters": {"first.$": "$.doc.items[0]"}}
            }}),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        let get = &i.agents[s["Get"]["agent"].as_str().unwrap()];
        assert_eq!(get["parse_json"], json!(["Body"]));
        assert_eq!(get["resources"], json!(["arn:aws:s3:::reports", "arn:aws:s3:::reports/*"]));
        assert_eq!(s["Get"]["result_selector"], json!({"doc.$": "$.Body", "type.$": "$.ContentType"}));
        assert_eq!(s["Use"]["parameters"]["first.$"], "$.outputs.Get.doc.items[0]");
        // read as text too: left to the selector
        let (parsed, _) = parsed_in_selector(&json!({"a.$": "States.StringToJson($.Body)", "raw.$": "$.Body"}));
        assert!(parsed.is_empty());
        for (resource, says) in [
            ("arn:aws:states:::aws-sdk:route53:listHostedZones", "rest-xml"),
            ("arn:aws:states:::aws-sdk:dynamodb:dropTable", "no action"),
        ] {
            let r = import(
                "x",
                &json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": resource, "End": true}}}),
            )
            .unwrap_err();
            assert!(r.iter().any(|x| x.field == "Resource" && x.reason.contains(says)), "{resource}: {r:#?}");
        }
        // a token to hand over, and none in the request
        let r = import("x", &json!({"StartAt": "A", "States": {"A": {"Type": "Task", "End": true,
            "Resource": "arn:aws:states:::aws-sdk:dynamodb:putItem.waitForTaskToken", "Parameters": {"TableName": "t"}}}}))
        .unwrap_err();
        assert!(r.iter().any(|x| x.field == "Parameters" && x.reason.contains("$$.Task.Token")), "{r:#?}");
    }

    #[test]
    fn a_sync_job_is_a_loop_that_starts_it_then_polls_its_status_and_stops_it_when_undone() {
        let i = import("x", &json!({"StartAt": "Child", "States": {
            "Child": {"Type": "Task", "Resource": "arn:aws:states:::states:startExecution.sync:2", "Next": "Use",
                      "Parameters": {"StateMachineArn": "arn:aws:states:us-east-1:1:stateMachine:child", "Input.$": "$.order"},
                      "ResultSelector": {"result.$": "$.Output.total", "status.$": "$.Status"}, "ResultPath": "$.child",
                      "TimeoutSeconds": 600, "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2}],
                      "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Failed"}]},
            "Use": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:use", "End": true,
                    "Parameters": {"total.$": "$.child.result", "status.$": "$.child.status"}},
            "Failed": {"Type": "Fail", "Error": "ChildFailed"}
        }}))
        .unwrap();
        loads(&i);
        let s = steps(&i);
        let job = &s["Child"];
        assert_eq!(job["kind"], "loop");
        assert_eq!(job["timeout_ms"], 600_000);
        assert_eq!(job["wait_ms"], JOB_POLL_MS);
        assert_eq!(job["max_iterations"], 61, "600 s, polled every 10 s, and the start");
        assert_eq!(job["until"], json!({"variable": "$.outputs.Child.describe.Status", "string_equals": "SUCCEEDED"}));
        assert_eq!(job["on_failure"], "continue", "Catch States.ALL");
        assert!(job.get("result_selector").is_none(), "a selector would apply to every poll");
        // the first iteration starts the job with the task's data; the next ones poll with its id
        let choices = job["parameters"]["*.choose"].as_array().unwrap();
        assert_eq!(choices[0]["value"]["start"]["Input.$"], "$.input.order");
        assert_eq!(choices[1]["value"]["poll"]["ExecutionArn.$"], "$.loop.previous.start.ExecutionArn");
        assert_eq!(choices[2]["value"]["poll"]["ExecutionArn.$"], "$.loop.previous.describe.ExecutionArn");
        // what reads the job's answer reads the last poll's, selected, with its output parsed
        assert_eq!(s["Use"]["parameters"]["status.$"], "$.outputs.Child.describe.Status");
        assert_eq!(s["Use"]["parameters"]["total.$"], "$.outputs.Child.describe.Output.total");
        let body = i.children.iter().find(|w| w["name"] == job["workflow"]).expect("the poll's workflow");
        let body: HashMap<String, Value> = body["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (x["name"].as_str().unwrap().to_owned(), x.clone()))
            .collect();
        assert_eq!(body["start"]["max_attempts"], 3, "Retry retries the start");
        let stop = &body["start"]["compensation"];
        assert_eq!(i.agents[stop["agent"].as_str().unwrap()]["action"], "StopExecution");
        assert_eq!(stop["parameters"]["ExecutionArn.$"], "$.outputs.start.ExecutionArn");
        let describe = &i.agents[body["describe"]["agent"].as_str().unwrap()];
        assert_eq!(describe["action"], "DescribeExecution");
        assert_eq!(describe["resources"], json!(["arn:aws:states:us-east-1:1:execution:child:*"]));
        assert_eq!(body["failed"]["parameters"]["error"], "States.TaskFailed");
        assert_eq!(body["failed"]["when"]["or"].as_array().map(Vec::len), Some(3));

        // a Batch job: the id in a list, the answer the job itself
        let i = import(
            "x",
            &json!({"StartAt": "Run", "States": {
                "Run": {"Type": "Task", "Resource": "arn:aws:states:::batch:submitJob.sync", "End": true,
                        "Parameters": {"JobName": "nightly", "JobQueue": "arn:aws:batch:us-east-1:1:job-queue/q",
                                       "JobDefinition": "arn:aws:batch:us-east-1:1:job-definition/d:1"}}
            }}),
        )
        .unwrap();
        loads(&i);
        let s = steps(&i);
        let choices = s["Run"]["parameters"]["*.choose"].as_array().unwrap().clone();
        assert_eq!(choices[1]["value"]["poll"]["Jobs"], json!([{"*.$": "$.loop.previous.start.JobId"}]));
        assert_eq!(i.workflow["result"], json!({"*.$": "$.outputs.Run.describe.Jobs[0]"}));

        // a Glue job's name, read from the data, is sent again with each poll
        let i = import(
            "x",
            &json!({"StartAt": "Etl", "States": {
                "Etl": {"Type": "Task", "Resource": "arn:aws:states:::glue:startJobRun.sync", "End": true,
                        "Parameters": {"JobName.$": "$.job"}}
            }}),
        )
        .unwrap();
        loads(&i);
        let choices = steps(&i)["Etl"]["parameters"]["*.choose"].as_array().unwrap().clone();
        assert_eq!(choices[2]["value"]["carried"]["JobName"], json!({"*.$": "$.input.job"}));
        assert_eq!(choices[2]["value"]["poll"]["JobName.$"], "$.input.carried.JobName");

        for (resource, says) in [
            (
                "arn:aws:states:::dynamodb:putItem.sync",
                "is not translated (the jobs run to completion here: sfn:StartExecution",
            ),
            ("arn:aws:states:::aws-sdk:sfn:startExecution.sync", "runs no job to completion"),
            ("arn:aws:states:::batch:submitJob.sync:2", ".sync:2 is Step Functions' own"),
        ] {
            let r = import(
                "x",
                &json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": resource, "End": true}}}),
            )
            .unwrap_err();
            assert!(r.iter().any(|x| x.field == "Resource" && x.reason.contains(says)), "{resource}: {r:#?}");
        }
    }
}
