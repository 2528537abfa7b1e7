//! No module imports a module that imports it back. Reads `src/`, resolves every `crate::` and
//! `super::` path to the module it names, and looks for a cycle among sibling modules (a parent
//! and its own children may refer to each other: that is how a folder module re-exports).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

fn module_files(dir: &Path, prefix: &ModPath, out: &mut BTreeMap<ModPath, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let mut p = prefix.clone();
            p.push(name);
            module_files(&path, &p, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut p = prefix.clone();
            if name != "mod" && name != "lib" {
                p.push(name);
            }
            out.insert(p, path);
        }
    }
}

/// The path segments after `crate::` or `super::` at each use, with `{a, b}` groups expanded one
/// level (enough for this crate's imports).
fn references(code: &str) -> Vec<(String, Vec<String>)> {
    let mut refs = Vec::new();
    for line in code.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
        for anchor in ["crate::", "super::"] {
            let mut rest = line;
            while let Some(i) = rest.find(anchor) {
                let before = rest[..i].chars().last();
                rest = &rest[i + anchor.len()..];
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let mut segs = Vec::new();
                let mut tail = rest;
                loop {
                    let end = tail.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(tail.len());
                    if end == 0 {
                        break;
                    }
                    segs.push(tail[..end].to_owned());
                    tail = &tail[end..];
                    match tail.strip_prefix("::") {
                        Some(t) => tail = t,
                        None => break,
                    }
                }
                if let Some(group) = tail.strip_prefix('{') {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    for item in group.split(',') {
                        let first = item.trim().split("::").next().unwrap_or("").trim();
                        if !first.is_empty() {
                            let mut s = segs.clone();
                            s.push(first.to_owned());
                            refs.push((anchor.to_owned(), s));
                        }
                    }
                } else {
                    refs.push((anchor.to_owned(), segs));
                }
            }
        }
    }
    refs
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    module_files(&src, &Vec::new(), &mut files);
    let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
    // edges between siblings: (parent, from child, to child)
    let mut edges: BTreeSet<(ModPath, String, String)> = BTreeSet::new();
    for (from, file) in &files {
        let code = std::fs::read_to_string(file).unwrap();
        let is_folder_root = file.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        for (anchor, segs) in references(&code) {
            let mut base: ModPath = if anchor == "crate::" {
                Vec::new()
            } else {
                // `super` of a folder's mod.rs is the folder's parent; of a file, its parent module.
                let mut p = from.clone();
                if !is_folder_root || !p.is_empty() {
                    p.pop();
                }
                p
            };
            // the longest prefix of the path that is a module
            let mut target = base.clone();
            for s in &segs {
                base.push(s.clone());
                if modules.contains(&base) {
                    target.clone_from(&base);
                } else {
                    break;
                }
            }
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == target.len() {
                continue; // ancestor and descendant
            }
            edges.insert((from[..common].to_vec(), from[common].clone(), target[common].clone()));
        }
    }
    assert!(edges.len() > 20, "the scan found too few imports to mean anything: {edges:?}");
    // a cycle among the children of one parent
    let parents: BTreeSet<&ModPath> = edges.iter().map(|(p, _, _)| p).collect();
    let mut cycles = Vec::new();
    for parent in parents {
        let graph: BTreeMap<&str, Vec<&str>> =
            edges.iter().filter(|(p, _, _)| p == parent).fold(BTreeMap::new(), |mut g, (_, a, b)| {
                g.entry(a.as_str()).or_default().push(b.as_str());
                g
            });
        for start in graph.keys() {
            let mut stack = vec![(*start, vec![*start])];
            let mut seen = BTreeSet::new();
            while let Some((node, path)) = stack.pop() {
                for next in graph.get(node).into_iter().flatten() {
                    if next == start {
                        cycles.push(format!("{}: {} -> {}", parent.join("::"), path.join(" -> "), start));
                    } else if seen.insert(*next) {
                        let mut p = path.clone();
                        p.push(next);
                        stack.push((next, p));
                    }
                }
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_scan_resolves_paths_and_groups() {
    let refs = references(
        "use crate::{agent, scheduler};\nuse super::sim::SimAgent;\n// crate::ignored\nlet x = crate::ids::clip(s);",
    );
    let flat: Vec<String> = refs.iter().map(|(a, s)| format!("{a}{}", s.join("::"))).collect();
    assert_eq!(flat, vec!["crate::agent", "crate::scheduler", "super::sim::SimAgent", "crate::ids::clip"]);
}

/// Every `.rs` file of the workspace's production code (tests aside: test files and `tests/`).
fn production_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !matches!(name.as_str(), "tests" | "target" | "examples" | "benches" | ".git" | ".local") {
                production_sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// A comparison of a step kind with `==`, `!=` or `matches!` (the match of one kind).
fn compares_a_kind(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    let Some(i) = code.find("StepKind::") else { return false };
    let after =
        code[i + "StepKind::".len()..].trim_start_matches(|c: char| c.is_alphanumeric() || c == '_').trim_start();
    code.contains("== StepKind::")
        || code.contains("!= StepKind::")
        || after.starts_with("==")
        || after.starts_with("!=")
        || code[..i].contains("matches!(")
}

#[test]
fn a_step_kind_is_matched_whole_never_compared() {
    // A new kind must not compile until every place that cares has said what it does with it:
    // `StepKind`'s own methods and the matches over all kinds. A `kind == StepKind::Wait`
    // elsewhere compiles as it is and silently treats the new kind as "not a wait".
    assert!(compares_a_kind("if def.kind == StepKind::Wait {") && compares_a_kind("StepKind::Call != k"));
    assert!(compares_a_kind("matches!(d.kind, StepKind::Callback)") && !compares_a_kind("StepKind::Call => 1,"));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["crates", "functions", "services"] {
        production_sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 40, "the scan found too few files to mean anything: {}", files.len());
    let mut found = Vec::new();
    for file in &files {
        let code = std::fs::read_to_string(file).unwrap();
        // inline test modules come last in a file: stop there
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            if compares_a_kind(line) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "ask StepKind's methods or match every kind instead:\n{}", found.join("\n"));
}

#[test]
fn one_module_writes_tasks() {
    // The task store's write methods (`save`, `create`) are called by the writer alone
    // (`transition.rs`: one conditional-write loop, one create); the store's own implementations
    // aside. Tests may set up tasks as they like.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["crates", "functions", "services"] {
        production_sources(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for file in &files {
        let path = file.to_string_lossy().replace('\\', "/");
        if path.ends_with("crates/core/src/transition.rs") || path.contains("crates/core/src/store/") {
            continue;
        }
        let code = std::fs::read_to_string(file).unwrap();
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            if line.contains("store.save(") || line.contains("store.create(") {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "write tasks through sas_core::transition instead:\n{}", found.join("\n"));
}
