//! A workflow drawn as a Mermaid flowchart (`sasctl validate --graph NAME`; the book's pages of
//! the shipped workflows): its steps with their agents and retry policy, the `after` edges
//! (parallel branches side by side), maps, and each step's compensation as a dashed edge.

use std::fmt::Write as _;

use sas_protocol::workflow::{LoopGuard, OnBound, StepDef, StepKind, Tolerance, WaitTime, WorkflowDef};

/// The flowchart of `def` (a valid definition; one whose graph cannot be built draws its steps
/// in the listing's order).
pub fn mermaid(def: &WorkflowDef) -> String {
    let mut out = String::from("flowchart TD\n");
    let _ = writeln!(out, "  start((\"{}@{}\"))", text(&def.name), def.version);
    let graph = def.graph().ok();
    let after = |i: usize| -> Vec<usize> {
        match &graph {
            Some(g) => g.after(i).to_vec(),
            None => i.checked_sub(1).into_iter().collect(),
        }
    };
    for (i, s) in def.steps.iter().enumerate() {
        let _ = writeln!(out, "  s{i}[\"{}\"]", label(s));
        if let Some(c) = &s.compensation {
            let _ = writeln!(out, "  c{i}[\"{}\"]:::undo", label(c));
        }
    }
    let _ = writeln!(out, "  done((\"Processed\"))");
    let mut waited_for = vec![false; def.steps.len()];
    for i in 0..def.steps.len() {
        let deps = after(i);
        if deps.is_empty() {
            let _ = writeln!(out, "  start --> s{i}");
        }
        for d in deps {
            waited_for[d] = true;
            let _ = writeln!(out, "  s{d} --> s{i}");
        }
    }
    for (i, w) in waited_for.iter().enumerate() {
        if !w {
            let _ = writeln!(out, "  s{i} --> done");
        }
    }
    for (i, s) in def.steps.iter().enumerate() {
        if s.compensation.is_some() {
            let _ = writeln!(out, "  s{i} -. undone by .-> c{i}");
        }
        if s.kind.loop_spec().is_some() {
            let _ = writeln!(out, "  s{i} -- next iteration --> s{i}");
        }
    }
    out.push_str("  classDef undo stroke-dasharray: 5 5\n");
    out
}

/// A step's box: its name, then what runs it and how often.
fn label(s: &StepDef) -> String {
    let mut lines = vec![format!("<b>{}</b>", text(&s.name))];
    lines.extend(facts(s).iter().map(|l| text(l)));
    lines.join("<br/>")
}

/// What a step's box says under its name, as plain text (one line each; the caller escapes them
/// for where they go): what runs it and how often, its guard, its failure path, what it maps.
/// The Mermaid flowchart and `sasctl ui`'s graphs draw the same lines.
pub fn facts(s: &StepDef) -> Vec<String> {
    let mut lines = Vec::new();
    let attempts = if s.max_attempts == 1 { "1 attempt".to_owned() } else { format!("{} attempts", s.max_attempts) };
    match &s.kind {
        StepKind::Call { agent } => lines.push(format!("{agent} · {} · {attempts}", duration(s.timeout_ms))),
        StepKind::Callback { agent, .. } => {
            lines.push(format!("callback: {agent} · up to {} · {attempts}", duration(s.timeout_ms)));
        }
        StepKind::Wait(WaitTime::Ms(ms)) => lines.push(format!("wait {}", duration(*ms))),
        StepKind::Wait(WaitTime::Until(at)) => lines.push(format!("wait until {at}")),
        StepKind::Wait(WaitTime::SecondsAt(secs)) => lines.push(format!("wait the seconds at {secs}")),
        StepKind::Workflow(w) => lines.push(format!("workflow {} v{}", w.workflow, w.version)),
        StepKind::Loop(l) => {
            let (word, guard) = match &l.guard {
                LoopGuard::While(c) => ("while", c),
                LoopGuard::Until(c) => ("until", c),
            };
            let body = if l.inline {
                let names: Vec<&str> =
                    l.body.child.iter().flat_map(|b| b.steps.iter().map(|s| s.name.as_str())).collect();
                format!("loop over {}", names.join(" → "))
            } else {
                format!("loop over workflow {} v{}", l.body.workflow, l.body.version)
            };
            lines.push(body);
            lines.push(format!("{word} {}", sas_protocol::ids::clip(&guard.to_string(), 80)));
            let wait = l.wait_ms.map(|w| format!(" · {} apart", duration(w))).unwrap_or_default();
            let bound = match l.on_bound {
                OnBound::Fail => "fails",
                OnBound::Succeed => "ends",
            };
            lines.push(format!("at most {} iterations ({bound} there){wait}", l.max_iterations));
        }
    }
    if let Some(w) = &s.when {
        lines.push(format!("when {}", sas_protocol::ids::clip(&w.to_string(), 80)));
    }
    if !s.on_failure.is_fail() {
        lines.push("its failure continues the task".to_owned());
    }
    if let Some(m) = &s.map {
        let tolerated = match m.tolerated_failures {
            Tolerance::None => String::new(),
            Tolerance::Count(n) => format!(", {n} may fail"),
            Tolerance::Percent(p) => format!(", {p}% may fail"),
        };
        lines.push(format!("map over {} · {} at once{tolerated}", m.items, m.max_concurrency));
    }
    lines
}

/// Milliseconds as a person says them: `5 s`, `2 min`, `1 h 30 min`, `7 d`.
fn duration(ms: u64) -> String {
    const S: u64 = 1_000;
    const MIN: u64 = 60 * S;
    const H: u64 = 60 * MIN;
    const D: u64 = 24 * H;
    match ms {
        0 => "0 s".to_owned(),
        ms if ms % D == 0 => format!("{} d", ms / D),
        ms if ms % H == 0 => format!("{} h", ms / H),
        ms if ms >= H && ms % MIN == 0 => format!("{} h {} min", ms / H, ms % H / MIN),
        ms if ms % MIN == 0 => format!("{} min", ms / MIN),
        ms if ms % S == 0 => format!("{} s", ms / S),
        ms => format!("{ms} ms"),
    }
}

/// Text inside a Mermaid label: quotes and markup characters as entities.
fn text(s: &str) -> String {
    s.replace('&', "#amp;").replace('"', "#quot;").replace('<', "#lt;").replace('>', "#gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

    #[test]
    fn the_order_workflow_is_a_chain_with_its_compensations_dashed() {
        let all = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap();
        let m = mermaid(all.resolve("order", None).unwrap());
        for line in [
            "  start --> s0",
            "  s0 --> s1",
            "  s1 --> s2",
            "  s2 --> done",
            "  s0 -. undone by .-> c0",
            "  s1 -. undone by .-> c1",
        ] {
            assert!(m.lines().any(|l| l == line), "{line:?} not in\n{m}");
        }
        assert!(m.contains("<b>charge</b><br/>payment.charge · 5 s · 3 attempts"), "{m}");
        assert!(m.contains("c1[\"<b>refund</b><br/>payment.refund · 5 s · 5 attempts\"]:::undo"), "{m}");
        assert!(!m.contains("s2 -. undone"), "ship has no compensation:\n{m}");
    }

    #[test]
    fn branches_join_and_maps_say_what_they_map() {
        let all = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap();
        for def in all.all() {
            let m = mermaid(def);
            let starts = m.lines().filter(|l| l.starts_with("  start --> ")).count();
            let ends = m.lines().filter(|l| l.ends_with(" --> done")).count();
            assert!(starts >= 1 && ends >= 1, "{}: every graph starts and ends\n{m}", def.name);
            let g = def.graph().unwrap();
            let edges = (0..def.steps.len()).map(|i| g.after(i).len()).sum::<usize>();
            assert_eq!(
                m.lines()
                    .filter(|l| l.starts_with("  s") && !l.starts_with("  start") && l.contains(" --> s"))
                    .filter(|l| !l.contains("next iteration"))
                    .count(),
                edges,
                "{m}"
            );
            // a loop's box has an arrow back to itself
            let loops = def.steps.iter().filter(|s| s.kind.loop_spec().is_some()).count();
            assert_eq!(m.matches(" -- next iteration --> ").count(), loops, "{}: {m}", def.name);
            if def.steps.iter().any(|s| s.map.is_some()) {
                assert!(m.contains("map over /"), "{}: {m}", def.name);
            }
        }
        assert_eq!(duration(90 * 60_000), "1 h 30 min");
        assert_eq!(duration(7 * 86_400_000), "7 d");
        assert_eq!(duration(1_500), "1500 ms");
        assert_eq!(text("a\"<b>"), "a#quot;#lt;b#gt;");
    }
}
