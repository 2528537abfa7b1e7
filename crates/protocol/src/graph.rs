//! Steps as a graph: each step names the steps it waits for (`after`; by default the step listed
//! before it, so a plain list is a sequence), and independent steps run at once.
//!
//! A workflow's graph is checked when it is loaded: every name in `after` must be another step of
//! the workflow, named once; the graph has no cycle (a step in a cycle, or after one, could never
//! start: that is what "unreachable" means here, since without conditions every other step of an
//! acyclic graph runs); and each step is listed after the steps it waits for, so the listing is an
//! order the steps can run in (and a compensation order, read backwards).
//!
//! **How a graph runs.** A step that every other step either comes after or waits for (directly
//! or not) is a *join point*: it runs on its own, in the task, as in a sequence. The steps between
//! two join points form a **parallel region**: each runs as a **branch**, a task of its own, as a
//! map element does (`{task}~{head}~{k}`, where `head` is the region's first step and `k` the
//! branch's place in it). A branch starts as soon as every step it waits for has succeeded, and
//! the region ends once every branch has. This is exact: a step after a region waits for the join
//! point after it, which waits for every step of the region, so nothing waits longer than its
//! `after` says.

use std::ops::Range;

/// Why a workflow's `after` lists do not make a graph that can run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("step {step}: after names {name}, which is not a step of this workflow")]
    Unknown { step: String, name: String },
    #[error("step {step}: after names the step itself")]
    SelfReference { step: String },
    #[error("step {step}: after names {name} twice")]
    Repeated { step: String, name: String },
    #[error("steps wait for each other in a cycle (each waits for the next), so none of them can start: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
    #[error(
        "step {step} waits for {waits_for}, which is listed after it: list each step after the steps it waits for"
    )]
    ListedBefore { step: String, waits_for: String },
}

impl GraphError {
    /// The step the problem is reported on.
    pub fn step(&self) -> &str {
        match self {
            GraphError::Unknown { step, .. }
            | GraphError::SelfReference { step }
            | GraphError::Repeated { step, .. }
            | GraphError::ListedBefore { step, .. } => step,
            GraphError::Cycle(path) => path.first().map_or("", String::as_str),
        }
    }
}

/// A workflow's steps as a graph, by index in the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepGraph {
    /// The steps each step waits for.
    after: Vec<Vec<usize>>,
    /// `before[i][j]`: step `j` comes before step `i` (it waits for it, directly or not).
    before: Vec<Vec<bool>>,
}

impl StepGraph {
    /// The graph of the steps, each given as its name and its `after`, in the listing's order; or
    /// why it cannot run.
    pub fn of<'a>(listing: impl IntoIterator<Item = (&'a str, Option<&'a [String]>)>) -> Result<StepGraph, GraphError> {
        struct Step<'a> {
            name: &'a str,
            after: Option<&'a [String]>,
        }
        let steps: Vec<Step<'a>> = listing.into_iter().map(|(name, after)| Step { name, after }).collect();
        let index = |name: &str| steps.iter().position(|s| s.name == name);
        let mut after = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            let deps = match s.after {
                None => i.checked_sub(1).into_iter().collect(),
                Some(names) => {
                    let mut deps: Vec<usize> = Vec::with_capacity(names.len());
                    for name in names {
                        let j = index(name)
                            .ok_or_else(|| GraphError::Unknown { step: s.name.to_owned(), name: name.clone() })?;
                        if j == i {
                            return Err(GraphError::SelfReference { step: s.name.to_owned() });
                        }
                        if deps.contains(&j) {
                            return Err(GraphError::Repeated { step: s.name.to_owned(), name: name.clone() });
                        }
                        deps.push(j);
                    }
                    deps
                }
            };
            after.push(deps);
        }
        if let Some(cycle) = find_cycle(&after) {
            return Err(GraphError::Cycle(cycle.into_iter().map(|i| steps[i].name.to_owned()).collect()));
        }
        for (i, deps) in after.iter().enumerate() {
            if let Some(&j) = deps.iter().find(|&&j| j > i) {
                return Err(GraphError::ListedBefore {
                    step: steps[i].name.to_owned(),
                    waits_for: steps[j].name.to_owned(),
                });
            }
        }
        let n = steps.len();
        let mut before = vec![vec![false; n]; n];
        for (i, deps) in after.iter().enumerate() {
            for &d in deps {
                // d < i (checked above): its row is complete
                let (done, rest) = before.split_at_mut(i);
                let row = &mut rest[0];
                row[d] = true;
                for (k, b) in done[d].iter().enumerate() {
                    if *b {
                        row[k] = true;
                    }
                }
            }
        }
        Ok(StepGraph { after, before })
    }

    /// The steps step `i` waits for, directly.
    pub fn after(&self, i: usize) -> &[usize] {
        &self.after[i]
    }

    /// Whether step `j` comes before step `i` (directly or not).
    pub fn comes_before(&self, j: usize, i: usize) -> bool {
        self.before[i][j]
    }

    /// Whether step `i` is a join point: every other step comes before it or after it.
    pub fn is_join_point(&self, i: usize) -> bool {
        let n = self.after.len();
        (0..i).all(|j| self.before[i][j]) && (i + 1..n).all(|k| self.before[k][i])
    }

    /// The parallel regions: the runs of steps between join points, in listing order.
    pub fn regions(&self) -> Vec<Range<usize>> {
        let n = self.after.len();
        let mut regions = Vec::new();
        let mut start = None;
        for i in 0..=n {
            let joins = i == n || self.is_join_point(i);
            match (joins, start) {
                (false, None) => start = Some(i),
                (true, Some(s)) => {
                    if i - s >= 2 {
                        regions.push(s..i);
                    }
                    start = None;
                }
                _ => {}
            }
        }
        regions
    }

    /// The parallel region whose first step is `head`.
    pub fn region_at(&self, head: usize) -> Option<Range<usize>> {
        self.regions().into_iter().find(|r| r.start == head)
    }

    /// Whether every step runs after the one listed before it: a plain sequence.
    pub fn is_sequence(&self) -> bool {
        self.after.iter().enumerate().all(|(i, deps)| deps.len() == usize::from(i > 0) && (i == 0 || deps[0] == i - 1))
    }
}

/// A cycle among the steps (each waiting for the next), if there is one.
fn find_cycle(after: &[Vec<usize>]) -> Option<Vec<usize>> {
    // 0 unvisited, 1 on the path, 2 done
    fn visit(i: usize, after: &[Vec<usize>], mark: &mut [u8], path: &mut Vec<usize>) -> Option<Vec<usize>> {
        mark[i] = 1;
        path.push(i);
        for &j in &after[i] {
            if mark[j] == 1 {
                let from = path.iter().position(|&p| p == j)?;
                let mut cycle = path[from..].to_vec();
                cycle.push(j);
                return Some(cycle);
            }
            if mark[j] == 0 {
                if let Some(c) = visit(j, after, mark, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        mark[i] = 2;
        None
    }
    let mut mark = vec![0u8; after.len()];
    for i in 0..after.len() {
        if mark[i] == 0 {
            if let Some(c) = visit(i, after, &mut mark, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(steps: &[(&str, Option<&[&str]>)]) -> Result<StepGraph, GraphError> {
        let owned: Vec<(String, Option<Vec<String>>)> = steps
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.map(|a| a.iter().map(|s| (*s).to_owned()).collect())))
            .collect();
        StepGraph::of(owned.iter().map(|(n, a)| (n.as_str(), a.as_deref())))
    }

    #[test]
    fn a_list_without_after_is_a_sequence_with_no_region() {
        let g = graph(&[("a", None), ("b", None), ("c", None)]).unwrap();
        assert!(g.is_sequence());
        assert!(g.regions().is_empty());
        assert!((0..3).all(|i| g.is_join_point(i)));
        assert!(g.comes_before(0, 2) && !g.comes_before(2, 0));
    }

    #[test]
    fn two_branches_between_join_points_make_one_region() {
        // reserve -> (charge, fraud) -> ship
        let g = graph(&[
            ("reserve", None),
            ("charge", None),
            ("fraud", Some(&["reserve"])),
            ("ship", Some(&["charge", "fraud"])),
        ])
        .unwrap();
        assert!(!g.is_sequence());
        assert_eq!(g.regions(), vec![1..3]);
        assert_eq!(g.region_at(1), Some(1..3));
        assert_eq!(g.region_at(0), None);
        assert!(g.is_join_point(0) && g.is_join_point(3));
        assert!(!g.comes_before(1, 2) && !g.comes_before(2, 1));
    }

    #[test]
    fn a_region_keeps_its_inner_order() {
        // a -> b -> d, c beside both; e after all: region b, c, d with b before d
        let g = graph(&[("a", None), ("b", None), ("c", Some(&["a"])), ("d", Some(&["b"])), ("e", Some(&["c", "d"]))])
            .unwrap();
        assert_eq!(g.regions(), vec![1..4]);
        assert!(g.comes_before(1, 3) && !g.comes_before(2, 3));
    }

    #[test]
    fn roots_at_the_start_and_leaves_at_the_end_are_regions() {
        let g =
            graph(&[("a", Some(&[])), ("b", Some(&[])), ("c", Some(&["a", "b"])), ("d", None), ("e", Some(&["c"]))])
                .unwrap();
        assert_eq!(g.regions(), vec![0..2, 3..5]);
    }

    #[test]
    fn bad_graphs_are_refused_with_the_reason() {
        let unknown = graph(&[("a", None), ("b", Some(&["nope"]))]).unwrap_err();
        assert_eq!(unknown, GraphError::Unknown { step: "b".into(), name: "nope".into() });
        assert_eq!(graph(&[("a", Some(&["a"]))]).unwrap_err(), GraphError::SelfReference { step: "a".into() });
        assert!(matches!(graph(&[("a", None), ("b", Some(&["a", "a"]))]).unwrap_err(), GraphError::Repeated { .. }));
        let cycle = graph(&[("a", Some(&["c"])), ("b", Some(&["a"])), ("c", Some(&["b"]))]).unwrap_err();
        assert_eq!(cycle, GraphError::Cycle(vec!["a".into(), "c".into(), "b".into(), "a".into()]));
        assert!(cycle.to_string().contains("a -> c -> b -> a"), "{cycle}");
        let order = graph(&[("a", Some(&["b"])), ("b", Some(&[]))]).unwrap_err();
        assert_eq!(order, GraphError::ListedBefore { step: "a".into(), waits_for: "b".into() });
    }
}
