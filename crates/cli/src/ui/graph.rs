//! A workflow drawn as SVG for `sasctl ui`, and, given a task, the path it took: each step a box
//! in the row of its depth in the `after` graph (branches side by side), the edges of the graph,
//! what runs each step and how (the lines of the book's Mermaid drawings,
//! [`crate::diagram::facts`]), its compensation, and with a task each box coloured by its
//! step's state and the edges it went along drawn bold.
//!
//! Every text goes through maud, so what a workflow or a task says is escaped wherever it is shown.

use maud::{html, Markup};
use sas_protocol::protocol::{CompensationStatus, StepStatus, Task};
use sas_protocol::workflow::WorkflowDef;

/// A box's width, the line height, the gaps between boxes (pixels).
const BOX_W: u32 = 250;
const LINE: u32 = 16;
const GAP_X: u32 = 28;
const GAP_Y: u32 = 44;
const MARGIN: u32 = 16;
/// The end circles' radius.
const R: u32 = 14;
/// The widest line in a box (characters); the whole text is in the box's tooltip.
const CLIP: usize = 36;

/// What the graph says about one step of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepState {
    /// A CSS class: `pending`, `running`, `succeeded`, `failed`, `cancelled`, `skipped`,
    /// `compensated`, `compensating`.
    pub class: &'static str,
    /// In words, for the box: `succeeded · 2 attempts`, `skipped: when was false`.
    pub text: String,
}

/// The state of step `i` of `task` as the graph colours it.
pub fn step_state(task: &Task, i: usize) -> StepState {
    let Some(s) = task.steps.get(i) else { return StepState { class: "pending", text: "no record".into() } };
    // a skipped branch of a parallel region: its status says so only once the region succeeded
    if let Some(why) = crate::timeline::skipped_branch(task, i) {
        return StepState { class: "skipped", text: format!("skipped: {why}") };
    }
    let attempts = match s.attempts {
        0 => String::new(),
        1 => " · 1 attempt".to_owned(),
        n => format!(" · {n} attempts"),
    };
    let comp = s.compensation.as_ref().map(|c| c.status);
    let (class, word) = match (s.status, comp) {
        (_, Some(CompensationStatus::Done)) => ("compensated", "undone".to_owned()),
        (_, Some(CompensationStatus::Running | CompensationStatus::Pending)) if task.is_compensating() => {
            ("compensating", "being undone".to_owned())
        }
        (_, Some(CompensationStatus::Failed)) => ("failed", "its undo failed".to_owned()),
        (StepStatus::Pending, _) => ("pending", "not started".to_owned()),
        (StepStatus::Running, _) => ("running", "running".to_owned()),
        (StepStatus::Succeeded, _) => ("succeeded", "succeeded".to_owned()),
        (StepStatus::Failed, _) => ("failed", if s.refused { "refused" } else { "failed" }.to_owned()),
        (StepStatus::TimedOut, _) => ("failed", "timed out".to_owned()),
        (StepStatus::Cancelled, _) => ("cancelled", "cancelled".to_owned()),
        (StepStatus::Skipped, _) => {
            let why = s.skipped.as_deref().unwrap_or("skipped");
            return StepState { class: "skipped", text: format!("skipped: {why}") };
        }
    };
    StepState { class, text: format!("{word}{attempts}") }
}

/// `s` cut to [`CLIP`] characters, with an ellipsis when cut.
fn clip(s: &str) -> String {
    if s.chars().count() <= CLIP {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(CLIP - 1).collect();
    out.push('…');
    out
}

/// One box: where, and what it says.
struct Node {
    x: u32,
    y: u32,
    h: u32,
    lines: Vec<(&'static str, String)>,
}

/// The steps each step waits for (the listing's order when the graph cannot be built).
fn parents(def: &WorkflowDef) -> Vec<Vec<usize>> {
    let graph = def.graph().ok();
    (0..def.steps.len())
        .map(|i| match &graph {
            Some(g) => g.after(i).to_vec(),
            None => i.checked_sub(1).into_iter().collect(),
        })
        .collect()
}

/// Each step's depth: 0 for a step that waits for none, else one more than its deepest parent.
fn ranks(parents: &[Vec<usize>]) -> Vec<usize> {
    let mut rank = vec![0usize; parents.len()];
    // parents may be listed after their children: settle in at most n rounds
    for _ in 0..parents.len() {
        let mut moved = false;
        for (i, ps) in parents.iter().enumerate() {
            let r = ps.iter().filter(|p| **p < rank.len()).map(|p| rank[*p] + 1).max().unwrap_or(0);
            if r > rank[i] && r < parents.len() {
                rank[i] = r;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    rank
}

/// The drawing of `def`; with `task`, the path it took. `id` makes the drawing's element ids
/// unique on its page.
#[allow(clippy::many_single_char_names)] // x, y, h, n, r: coordinates and counts of a drawing
pub fn svg(def: &WorkflowDef, task: Option<&Task>, id: &str) -> Markup {
    let parents = parents(def);
    let rank = ranks(&parents);
    let n = def.steps.len();
    let depth = rank.iter().copied().max().map_or(0, |m| m + 1);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for i in 0..n {
        rows[rank[i]].push(i);
    }
    let states: Vec<Option<StepState>> = (0..n).map(|i| task.map(|t| step_state(t, i))).collect();
    // what each box says
    let lines: Vec<Vec<(&'static str, String)>> = def
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut l = vec![("name", s.name.clone())];
            l.extend(crate::diagram::facts(s).into_iter().map(|f| ("fact", f)));
            if let Some(c) = &s.compensation {
                l.push(("undo", format!("undone by {} ({})", c.name, c.agent().unwrap_or_default())));
            }
            if let Some(st) = &states[i] {
                l.push(("state", st.text.clone()));
            }
            l
        })
        .collect();
    let widest = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
    // the end: Processed, or, for a task that ended otherwise, how it ended
    let (end_class, end_label) = match task.map(|t| t.process_state) {
        Some(sas_protocol::protocol::ProcessState::Processed) => ("end reached", "Processed".to_owned()),
        Some(s) if s.is_terminal() => ("end other", format!("ended {s}, not Processed")),
        _ => ("end", "Processed".to_owned()),
    };
    let title = format!("{}@{}", def.name, def.version);
    // the end circles' labels start beside the middle: room for the longer one whole
    let label = [&title, &end_label].iter().map(|l| text_width(l)).max().unwrap_or(0);
    let width = (2 * MARGIN + u32::try_from(widest).unwrap_or(1) * (BOX_W + GAP_X) - GAP_X)
        .max(2 * (R + 6 + label + MARGIN))
        .max(440);
    let mut nodes: Vec<Option<Node>> = (0..n).map(|_| None).collect();
    let mut y = MARGIN + 2 * R + GAP_Y;
    for row in &rows {
        let k = u32::try_from(row.len()).unwrap_or(1);
        let row_w = k * (BOX_W + GAP_X) - GAP_X;
        let mut x = (width - row_w) / 2;
        let h = row.iter().map(|i| box_height(&lines[*i])).max().unwrap_or(LINE);
        for i in row {
            nodes[*i] = Some(Node { x, y, h: box_height(&lines[*i]), lines: lines[*i].clone() });
            x += BOX_W + GAP_X;
        }
        y += h + GAP_Y;
    }
    let height = y + 2 * R + MARGIN;
    let cx = width / 2;
    let (start_y, end_y) = (MARGIN + R, y + R);
    let waited_for: Vec<bool> = (0..n).map(|i| parents.iter().any(|ps| ps.contains(&i))).collect();
    let ran = |i: usize| states[i].as_ref().is_some_and(|s| !matches!(s.class, "pending" | "skipped"));
    let ended_processed = task.is_some_and(|t| t.process_state == sas_protocol::protocol::ProcessState::Processed);
    let mut edges: Vec<(u32, u32, u32, u32, bool)> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let Some(node) = node else { continue };
        let top = (node.x + BOX_W / 2, node.y);
        if parents[i].is_empty() {
            edges.push((cx, start_y + R, top.0, top.1, ran(i)));
        }
        for p in &parents[i] {
            if let Some(pn) = nodes.get(*p).and_then(Option::as_ref) {
                edges.push((pn.x + BOX_W / 2, pn.y + pn.h, top.0, top.1, ran(*p) && ran(i)));
            }
        }
        if !waited_for[i] {
            edges.push((top.0, node.y + node.h, cx, end_y - R, ended_processed && ran(i)));
        }
    }
    let marker = format!("arrow-{id}");
    html! {
        svg class="graph" xmlns="http://www.w3.org/2000/svg" width=(width) height=(height)
            viewBox=(format!("0 0 {width} {height}")) role="img" aria-label=(format!("the steps of {title}")) {
            defs {
                marker id=(marker) viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse" {
                    path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead" {}
                }
            }
            @for (x1, y1, x2, y2, taken) in &edges {
                @let mid = (y1 + y2) / 2;
                path class=(if *taken { "edge taken" } else { "edge" })
                    d=(format!("M {x1} {y1} C {x1} {mid} {x2} {mid} {x2} {y2}"))
                    marker-end=(format!("url(#{marker})")) {}
            }
            g class="end" {
                circle cx=(cx) cy=(start_y) r=(R) {}
                text x=(cx + R + 6) y=(start_y + 4) class="endlabel" { (title) }
            }
            g class=(end_class) {
                circle cx=(cx) cy=(end_y) r=(R) {}
                text x=(cx + R + 6) y=(end_y + 4) class="endlabel" { (end_label) }
            }
            @for (i, node) in nodes.iter().enumerate() {
                @if let Some(node) = node {
                    @let class = states[i].as_ref().map_or("def", |s| s.class);
                    g class=(format!("step {class}")) data-step=(def.steps[i].name) {
                        title { @for (_, l) in &node.lines { (l) "\n" } }
                        rect x=(node.x) y=(node.y) width=(BOX_W) height=(node.h) rx="6" {}
                        @for (j, (kind, l)) in node.lines.iter().enumerate() {
                            text x=(node.x + 10) y=(node.y + 18 + u32::try_from(j).unwrap_or(0) * LINE) class=(kind) { (clip(l)) }
                        }
                    }
                }
            }
        }
    }
}

/// How wide a 12-pixel label is drawn, at most (pixels): 8 a character, more than the sans-serif
/// fonts' widest usual letters take on average.
fn text_width(s: &str) -> u32 {
    u32::try_from(s.chars().count()).unwrap_or(u32::MAX / 16).saturating_mul(8)
}

fn box_height(lines: &[(&'static str, String)]) -> u32 {
    u32::try_from(lines.len()).unwrap_or(1) * LINE + 12
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

    #[test]
    fn every_built_in_workflow_is_drawn_with_a_box_per_step_and_an_edge_per_wait() {
        let all = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap();
        for def in all.all() {
            let s = svg(def, None, "t").into_string();
            assert_eq!(s.matches("<g class=\"step def\"").count(), def.steps.len(), "{}: {s}", def.name);
            let waits: usize = parents(def).iter().map(|p| p.len().max(1)).sum();
            // inside <svg> an HTML parser takes no void elements: each shape is closed
            for shape in ["rect", "path", "circle", "text"] {
                assert_eq!(
                    s.matches(&format!("<{shape} ")).count(),
                    s.matches(&format!("</{shape}>")).count(),
                    "{shape}"
                );
            }
            assert!(s.matches("<path class=\"edge").count() >= waits, "{}", def.name);
        }
    }

    #[test]
    fn branches_are_side_by_side_and_a_join_below_both() {
        let def: WorkflowDef = serde_json::from_value(serde_json::json!({
            "name": "fan", "version": 1,
            "steps": [
                {"name": "a", "agent": "sim"},
                {"name": "b", "agent": "sim", "after": ["a"]},
                {"name": "c", "agent": "sim", "after": ["a"]},
                {"name": "d", "agent": "sim", "after": ["b", "c"]}
            ]
        }))
        .unwrap();
        assert_eq!(ranks(&parents(&def)), [0, 1, 1, 2]);
    }

    #[test]
    fn what_a_workflow_says_is_text_in_the_drawing() {
        let def: WorkflowDef = serde_json::from_value(serde_json::json!({
            "name": "x<script>", "version": 1,
            "steps": [{"name": "<b>bold</b>", "agent": "a\"&'"}]
        }))
        .unwrap();
        let s = svg(&def, None, "t").into_string();
        assert!(!s.contains("<script>") && !s.contains("<b>"), "{s}");
        assert!(s.contains("x&lt;script&gt;") && s.contains("&lt;b&gt;bold&lt;/b&gt;"), "{s}");
    }
}
