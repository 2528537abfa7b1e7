//! The module graphs of every crate of the workspace, read from source. Each target's root (a
//! crate's `src/lib.rs`, `src/main.rs`, `src/bin/*.rs`, and its tests', examples' and benches'
//! roots) is followed through its `mod` declarations to the modules it compiles; every path in
//! them (`use` trees with their nested groups, and paths in code) is resolved to the module it
//! names. No module imports a module that imports it back (a cycle among sibling modules; a parent
//! and its own children may refer to each other: that is how a folder module re-exports). And the
//! layers: sas-core's pure protocol reaches no engine, adapter or agent code, the deployed
//! crates do not use the simulation or the twins (sas-testkit), and the demo's order service is
//! the developer's binary's alone (sas-dev), not sasctl's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

// ---- Reading Rust: the tokens paths are made of ------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// an identifier, a keyword or a number
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The index after a quoted literal's closing `close`, from `i` just inside it (escapes skipped,
/// lines counted).
fn quoted(c: &[char], mut i: usize, close: char, line: &mut usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => {
                if c.get(i + 1) == Some(&'\n') {
                    *line += 1;
                }
                i += 2;
            }
            x if x == close => return i + 1,
            x => {
                if x == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    i
}

/// The tokens of `code`, each with its line: identifiers, `::` and single punctuation, without
/// comments, strings (raw, byte and C ones too), character literals and lifetimes.
fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = quoted(&c, i + 1, '"', &mut line);
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                i = quoted(&c, i + 1, '\'', &mut line); // '\n', '\'', '\u{1F600}'
            } else if at(i + 2) == '\'' {
                i += 3; // 'x'
            } else {
                i += 1; // a lifetime or a label
                while is_ident(at(i)) {
                    i += 1;
                }
            }
        } else if is_ident(ch) {
            let start = i;
            while is_ident(at(i)) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            if matches!(word.as_str(), "r" | "br" | "cr") && (at(i) == '"' || at(i) == '#') {
                let hashes = (i..c.len()).take_while(|&k| c[k] == '#').count();
                if at(i + hashes) == '"' {
                    i += hashes + 1;
                    while i < c.len() && !(c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                        if c[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                    i += hashes + 1;
                    continue;
                }
                if word == "r" && hashes == 1 && is_ident(at(i + 1)) {
                    let start = i + 1; // a raw identifier: r#type
                    i += 1;
                    while is_ident(at(i)) {
                        i += 1;
                    }
                    out.push((Tok::Ident(c[start..i].iter().collect()), line));
                    continue;
                }
            }
            if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = quoted(&c, i + 1, '"', &mut line);
            } else if word == "b" && at(i) == '\'' {
                i = quoted(&c, i + 1, '\'', &mut line);
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// A path named in a file: in which of the file's inline modules, its segments, its line, and
/// whether only tests compile it (in a `#[cfg(test)]` item or module).
#[derive(Debug, Clone)]
struct PathRef {
    module: ModPath,
    segs: Vec<String>,
    line: usize,
    test: bool,
}

/// What a file says about modules: its `mod name;` and `mod name { .. }` declarations (each with
/// the inline modules it is in, and whether only tests compile it), and the paths it names.
#[derive(Debug, Default)]
struct FileScan {
    declared: Vec<(ModPath, bool)>,
    inline: Vec<(ModPath, bool)>,
    paths: Vec<PathRef>,
}

fn is(t: &[(Tok, usize)], i: usize, tok: &Tok) -> bool {
    t.get(i).is_some_and(|(k, _)| k == tok)
}

fn ident_at(t: &[(Tok, usize)], i: usize) -> Option<&str> {
    match t.get(i) {
        Some((Tok::Ident(w), _)) => Some(w),
        _ => None,
    }
}

/// The paths of one use tree from `t[*i]` on (`a::b`, `a::{b, c::{d, self}}`, `a::*`, `a as b`),
/// each whole, with the line of its last segment; `*i` ends after the tree.
fn use_tree(t: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, usize)>) {
    let mut segs = prefix.to_vec();
    if is(t, *i, &Tok::Sep) {
        *i += 1;
    }
    loop {
        match t.get(*i) {
            Some((Tok::Ident(w), line)) => {
                // `self` in a group names the group's own path
                if !(w == "self" && !prefix.is_empty() && segs.len() == prefix.len()) {
                    segs.push(w.clone());
                }
                *i += 1;
                if is(t, *i, &Tok::Sep) {
                    *i += 1;
                    continue;
                }
                if ident_at(t, *i) == Some("as") {
                    *i += 2;
                }
                out.push((segs, *line));
                return;
            }
            Some((Tok::Punct('{'), _)) => {
                *i += 1;
                while t.get(*i).is_some() && !is(t, *i, &Tok::Punct('}')) {
                    let before = *i;
                    use_tree(t, i, &segs, out);
                    if is(t, *i, &Tok::Punct(',')) {
                        *i += 1;
                    } else if *i == before || !is(t, *i, &Tok::Punct('}')) {
                        break; // not Rust as this reads it: stop here
                    }
                }
                *i += 1;
                return;
            }
            Some((Tok::Punct('*'), line)) => {
                *i += 1;
                out.push((segs, *line));
                return;
            }
            _ => return,
        }
    }
}

/// The path that starts at `t[i]` (`a::b::c`, up to a `::<`, `::{` or `::*`) and the index after it.
fn path_at(t: &[(Tok, usize)], mut i: usize) -> (Vec<String>, usize) {
    let mut segs = Vec::new();
    while let Some(w) = ident_at(t, i) {
        segs.push(w.to_owned());
        if is(t, i + 1, &Tok::Sep) && ident_at(t, i + 2).is_some() {
            i += 2;
        } else {
            i += 1;
            break;
        }
    }
    (segs, i)
}

/// Reads a file: its module declarations and every path it names (in `use` declarations, in code,
/// in attributes such as `#[tokio::main]`; in macro bodies too, where they look like paths).
fn scan(code: &str) -> FileScan {
    let t = tokens(code);
    let mut out = FileScan::default();
    let mut depth = 0usize;
    // the inline modules open here: name, the depth inside its braces, test only
    let mut inline: Vec<(String, usize, bool)> = Vec::new();
    // the `#[cfg(test)]` item being read: the depth it started at
    let mut test_item: Option<usize> = None;
    let mut cfg_test_pending = false;
    let mut file_test = false;
    let mut i = 0;
    while i < t.len() {
        let module: ModPath = inline.iter().map(|m| m.0.clone()).collect();
        // attributes: `#[cfg(test)]` marks the next item, `#![cfg(test)]` the module it is in
        if is(&t, i, &Tok::Punct('#')) {
            let inner = is(&t, i + 1, &Tok::Punct('!'));
            let open = if inner { i + 2 } else { i + 1 };
            if is(&t, open, &Tok::Punct('[')) {
                let mut close = open;
                let mut brackets = 0;
                while let Some((k, _)) = t.get(close) {
                    match k {
                        Tok::Punct('[') => brackets += 1,
                        Tok::Punct(']') => brackets -= 1,
                        _ => {}
                    }
                    if brackets == 0 {
                        break;
                    }
                    close += 1;
                }
                let body: Vec<&Tok> = t[open + 1..close.min(t.len())].iter().map(|(k, _)| k).collect();
                let cfg_test = [Tok::Ident("cfg".into()), Tok::Punct('('), Tok::Ident("test".into()), Tok::Punct(')')];
                if body.len() == 4 && body.iter().zip(&cfg_test).all(|(a, b)| *a == b) {
                    match (inner, inline.last_mut()) {
                        (false, _) => cfg_test_pending = true,
                        (true, Some(m)) => m.2 = true,
                        (true, None) => file_test = true,
                    }
                }
                let test = file_test || test_item.is_some() || inline.iter().any(|m| m.2);
                let mut k = open + 1;
                while k < close {
                    if ident_at(&t, k).is_some() && is(&t, k + 1, &Tok::Sep) && !is(&t, k.wrapping_sub(1), &Tok::Sep) {
                        let (segs, next) = path_at(&t, k);
                        out.paths.push(PathRef { module: module.clone(), segs, line: t[k].1, test });
                        k = next;
                    } else {
                        k += 1;
                    }
                }
                i = close + 1;
                continue;
            }
        }
        if std::mem::take(&mut cfg_test_pending) && test_item.is_none() {
            test_item = Some(depth);
        }
        let test = file_test || test_item.is_some() || inline.iter().any(|m| m.2);
        match &t[i].0 {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|m| depth < m.1) {
                    inline.pop();
                }
                if test_item.is_some_and(|d| depth <= d) {
                    test_item = None;
                }
                i += 1;
            }
            Tok::Punct(';') => {
                if test_item == Some(depth) {
                    test_item = None;
                }
                i += 1;
            }
            Tok::Ident(w)
                if w == "mod"
                    && ident_at(&t, i + 1).is_some()
                    && (is(&t, i + 2, &Tok::Punct(';')) || is(&t, i + 2, &Tok::Punct('{'))) =>
            {
                let name = ident_at(&t, i + 1).unwrap_or_default().to_owned();
                let mut path = module.clone();
                path.push(name.clone());
                if is(&t, i + 2, &Tok::Punct(';')) {
                    out.declared.push((path, test));
                    i += 2; // the `;` ends a `#[cfg(test)]` item
                } else {
                    out.inline.push((path, test));
                    depth += 1;
                    inline.push((name, depth, test));
                    i += 3;
                }
            }
            Tok::Ident(w) if w == "use" => {
                let mut trees = Vec::new();
                i += 1;
                use_tree(&t, &mut i, &[], &mut trees);
                for (segs, line) in trees {
                    out.paths.push(PathRef { module: module.clone(), segs, line, test });
                }
            }
            Tok::Ident(_) if is(&t, i + 1, &Tok::Sep) && !is(&t, i.wrapping_sub(1), &Tok::Sep) => {
                let (segs, next) = path_at(&t, i);
                out.paths.push(PathRef { module: module.clone(), segs, line: t[i].1, test });
                i = next;
            }
            // a global path: `::tokio::spawn` (not `<T>::f`, `f()::g`)
            Tok::Sep
                if ident_at(&t, i + 1).is_some()
                    && !matches!(t.get(i.wrapping_sub(1)), Some((Tok::Ident(_) | Tok::Punct('>' | ')'), _))) =>
            {
                let (segs, next) = path_at(&t, i + 1);
                out.paths.push(PathRef { module: module.clone(), segs, line: t[i].1, test });
                i = next;
            }
            _ => i += 1,
        }
    }
    out
}

// ---- Module trees ----------------------------------------------------------------------------

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A file's path from the workspace's root, for messages.
fn shown(file: &Path) -> String {
    let root = workspace_root();
    file.strip_prefix(&root).unwrap_or(file).to_string_lossy().replace('\\', "/")
}

/// One target's module tree: each module (a file's or an inline one) with its file and whether only
/// tests compile it, and every path each module names.
struct Tree {
    root: PathBuf,
    modules: BTreeMap<ModPath, (PathBuf, bool)>,
    paths: Vec<(PathRef, PathBuf)>,
}

/// The tree of the target whose root file is `root`, followed through `mod` declarations.
fn tree(root: &Path) -> Tree {
    let mut tree = Tree { root: root.to_owned(), modules: BTreeMap::new(), paths: Vec::new() };
    // a file, its module, whether its children's files are beside it (a crate root, a mod.rs), test only
    let mut queue = vec![(root.to_owned(), ModPath::new(), true, false)];
    while let Some((file, module, mod_rs, test)) = queue.pop() {
        let code = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let found = scan(&code);
        tree.modules.insert(module.clone(), (file.clone(), test));
        for (inline, inline_test) in found.inline {
            tree.modules.insert([module.clone(), inline].concat(), (file.clone(), test || inline_test));
        }
        let dir = if mod_rs { file.parent().unwrap().to_owned() } else { file.with_extension("") };
        for (declared, declared_test) in found.declared {
            let base = declared.iter().fold(dir.clone(), |d, s| d.join(s));
            let (flat, folder) = (base.with_extension("rs"), base.join("mod.rs"));
            let child = match (flat.is_file(), folder.is_file()) {
                (true, false) => (flat, false),
                (false, true) => (folder, true),
                _ => panic!("{}: `mod {}`: no file, or two, for it", shown(&file), declared.join("::")),
            };
            queue.push((child.0, [module.clone(), declared].concat(), child.1, test || declared_test));
        }
        for p in found.paths {
            let module = [module.clone(), p.module].concat();
            tree.paths.push((PathRef { module, test: p.test || test, ..p }, file.clone()));
        }
    }
    tree
}

impl Tree {
    /// The module of this tree a path names from module `from` (the longest prefix of it that is
    /// a module), or None: another crate's path, or a name of `from`'s own.
    fn resolve(&self, from: &ModPath, segs: &[String]) -> Option<ModPath> {
        let (mut base, rest) = match segs.first().map(String::as_str) {
            Some("crate") => (ModPath::new(), &segs[1..]),
            Some("self") => (from.clone(), &segs[1..]),
            Some("super") => {
                let n = segs.iter().take_while(|s| *s == "super").count();
                let mut base = from.clone();
                for _ in 0..n {
                    base.pop()?;
                }
                (base, &segs[n..])
            }
            // a bare path names a child module of `from`, or another crate
            Some(first) if self.modules.contains_key(&[from.clone(), vec![first.to_owned()]].concat()) => {
                (from.clone(), segs)
            }
            _ => return None,
        };
        let mut target = base.clone();
        for s in rest {
            base.push(s.clone());
            if !self.modules.contains_key(&base) {
                break;
            }
            target.clone_from(&base);
        }
        Some(target)
    }

    /// The paths that name a module of this tree: (from, to, where).
    fn references(&self) -> Vec<(ModPath, ModPath, String)> {
        self.paths
            .iter()
            .filter_map(|(p, file)| {
                let to = self.resolve(&p.module, &p.segs)?;
                Some((p.module.clone(), to, format!("{}:{}", shown(file), p.line)))
            })
            .collect()
    }

    /// The imports between sibling modules, (parent, from child, to child), each with where it is
    /// first named.
    fn sibling_edges(&self) -> BTreeMap<(ModPath, String, String), String> {
        let mut edges = BTreeMap::new();
        for (from, to, at) in self.references() {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // ancestor and descendant
            }
            edges.entry((from[..common].to_vec(), from[common].clone(), to[common].clone())).or_insert(at);
        }
        edges
    }
}

/// The workspace's members, from the root `Cargo.toml`.
fn members() -> Vec<PathBuf> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let list =
        manifest.split("members").nth(1).and_then(|s| s.split('[').nth(1)?.split(']').next()).unwrap_or_default();
    list.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()).map(|m| root.join(m)).collect()
}

/// The root files of a member's targets: (file, whether it is a `src/` one (the library, the
/// binaries) rather than a test's, an example's, a bench's or the build script's).
fn targets(member: &Path) -> BTreeSet<(PathBuf, bool)> {
    let mut roots = BTreeSet::new();
    let mut add = |file: PathBuf| {
        if file.is_file() {
            let src = file.starts_with(member.join("src"));
            roots.insert((file, src));
        }
    };
    for file in ["src/lib.rs", "src/main.rs", "build.rs"] {
        add(member.join(file));
    }
    for dir in ["src/bin", "tests", "examples", "benches"] {
        for entry in std::fs::read_dir(member.join(dir)).into_iter().flatten() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                add(path.join("main.rs"));
            } else if path.extension().is_some_and(|e| e == "rs") {
                add(path);
            }
        }
    }
    // the targets the manifest places elsewhere
    let manifest = std::fs::read_to_string(member.join("Cargo.toml")).unwrap();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if let Some(path) = line.strip_prefix("path").map(str::trim).and_then(|l| l.strip_prefix('=')) {
            if matches!(section, "[lib]" | "[[bin]]" | "[[test]]" | "[[example]]" | "[[bench]]") {
                add(member.join(path.trim().trim_matches('"')));
            }
        }
    }
    roots
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(path);
        }
    }
}

/// The cycles among the sibling modules of a tree: each set of modules that import each other,
/// with the imports that close it (where each is first named).
fn cycles(tree: &Tree) -> Vec<String> {
    let edges = tree.sibling_edges();
    let parents: BTreeSet<&ModPath> = edges.keys().map(|(p, _, _)| p).collect();
    let mut found = Vec::new();
    for parent in parents {
        let graph: BTreeMap<&str, Vec<&str>> =
            edges.keys().filter(|(p, _, _)| p == parent).fold(BTreeMap::new(), |mut g, (_, a, b)| {
                g.entry(a.as_str()).or_default().push(b.as_str());
                g
            });
        let reach = |start: &str| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![start];
            while let Some(node) = stack.pop() {
                for next in graph.get(node).into_iter().flatten() {
                    if seen.insert(*next) {
                        stack.push(next);
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&str, BTreeSet<&str>> = graph.keys().map(|n| (*n, reach(n))).collect();
        let mut reported = BTreeSet::new();
        for (node, reached) in &reaches {
            // the modules that reach this one and are reached by it: one cycle, or several sharing it
            let cycle: BTreeSet<&str> =
                reached.iter().copied().filter(|m| reaches.get(m).is_some_and(|r| r.contains(node))).collect();
            if cycle.is_empty() || !reported.insert(cycle.clone()) {
                continue;
            }
            let closing: Vec<String> = edges
                .iter()
                .filter(|((p, a, b), _)| p == parent && cycle.contains(a.as_str()) && cycle.contains(b.as_str()))
                .map(|((_, a, b), at)| format!("  {a} -> {b} ({at})"))
                .collect();
            let name = if parent.is_empty() { "the crate root".to_owned() } else { parent.join("::") };
            found.push(format!(
                "{}, in {name}: {} import each other:\n{}",
                shown(&tree.root),
                cycle.iter().copied().collect::<Vec<_>>().join(", "),
                closing.join("\n")
            ));
        }
    }
    found
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    // Every crate of the workspace, each target's tree on its own: the library's `src/`, each
    // binary's root (`src/main.rs`, `src/bin/*.rs`), the tests', examples' and benches' roots.
    let members = members();
    assert!(members.len() >= 6, "the workspace's members, read from Cargo.toml: {members:?}");
    let mut found = Vec::new();
    for member in &members {
        let roots = targets(member);
        let trees: Vec<Tree> = roots.iter().map(|(root, _)| tree(root)).collect();
        // The scan read what the crate compiles: every file under `src/` is a module of one of
        // its library's or binaries' trees (a file no `mod` declares would go unread)...
        let mut under_src = BTreeSet::new();
        rust_files(&member.join("src"), &mut under_src);
        let read: BTreeSet<&PathBuf> = trees.iter().flat_map(|t| t.modules.values().map(|(f, _)| f)).collect();
        let unread: Vec<String> = under_src.iter().filter(|f| !read.contains(f)).map(|f| shown(f)).collect();
        assert!(unread.is_empty(), "{}: files no module tree reads: {unread:?}", shown(member));
        // ...and resolved at least one path to a module of the crate per module file besides the
        // roots (a file's tests `use super::*`, a parent names its children, siblings each other):
        // fewer, and the scan has stopped seeing imports. A crate of roots alone has none to see.
        let module_files: BTreeSet<&PathBuf> =
            read.into_iter().filter(|f| !roots.iter().any(|(r, _)| r == *f)).collect();
        let references: usize = trees.iter().map(|t| t.references().len()).sum();
        assert!(
            references >= module_files.len(),
            "{}: the scan found too few imports to mean anything: {references} paths to its modules, {} module files",
            shown(member),
            module_files.len()
        );
        for tree in &trees {
            found.extend(cycles(tree));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn the_scan_reads_rust_as_the_compiler_does() {
    let code = r#"
        //! crate::doc_comment
        pub(crate) use crate::{agent, bus::{Bus, memory::MemoryBus as Twin}, self as me};
        use super::{
            sim::SimAgent,
            store::{self, StateStore},
        };
        /* crate::block /* nested crate::comment */ still a comment */
        let x = crate::ids::clip(s, "crate::in_a_string \" crate::escaped", b"crate::bytes", c"crate::c");
        let c = ('{', '\'', b'}'); fn f<'a>(s: &'a str) -> &'a str { s }
        #[cfg(test)]
        mod tests { use super::*; use crate::twins::Twins; }
        #[cfg(test)]
        use crate::sim::Sim;
        mod child;
        #[tokio::main]
        async fn main() { ::reqwest::get(u); tokio::spawn(async {}); }
    "#;
    let found = scan(code);
    let paths: Vec<String> = found
        .paths
        .iter()
        .map(|p| format!("{}{}{}", p.module.join("::"), if p.test { " (test) " } else { " " }, p.segs.join("::")))
        .collect();
    assert_eq!(
        paths,
        [
            " crate::agent",
            " crate::bus::Bus",
            " crate::bus::memory::MemoryBus",
            " crate",
            " super::sim::SimAgent",
            " super::store",
            " super::store::StateStore",
            " crate::ids::clip",
            "tests (test) super",
            "tests (test) crate::twins::Twins",
            " (test) crate::sim::Sim",
            " tokio::main",
            " reqwest::get",
            " tokio::spawn",
        ]
    );
    assert_eq!(found.inline, [(vec!["tests".to_owned()], true)]);
    assert_eq!(found.declared, [(vec!["child".to_owned()], false)]);
    // lines: the `use` groups' paths are where their last segment is
    assert_eq!(found.paths.iter().map(|p| p.line).collect::<Vec<_>>()[..8], [3, 3, 3, 3, 5, 6, 6, 9]);
    // raw strings end at their own number of hashes; `r#` before a name is a raw identifier
    let raw = scan("let s = r##\"crate::a \"# crate::b\"##; r#type::crate::c; br#\"crate::d\"#; crate::e::f()");
    let raw: Vec<String> = raw.paths.iter().map(|p| p.segs.join("::")).collect();
    assert_eq!(raw, ["type::crate::c", "crate::e::f"]);
}

/// A path into a crate of I/O: the async runtime, HTTP, the AWS SDK and its foundations (`aws_*`:
/// `aws_config`, `aws_sdk_*`, `aws_smithy_*`, SigV4), DynamoDB's serde, the Lambda runtime, the
/// log subscriber, the metrics' exporter.
fn names_io(segs: &[String]) -> bool {
    let Some(krate) = segs.first().map(String::as_str) else { return false };
    krate.starts_with("aws_")
        || matches!(
            krate,
            "tokio"
                | "reqwest"
                | "http"
                | "futures"
                | "serde_dynamo"
                | "lambda_runtime"
                | "tracing_subscriber"
                | "metrics_cloudwatch_embedded"
        )
}

/// sas-core's modules of the engine (what writes, sends, schedules, supervises and runs), of the
/// adapters (AWS, the store, the bus), of the agents and of the telemetry.
fn is_engine_adapter_or_agent(module: &str) -> bool {
    module.starts_with("aws")
        || matches!(
            module,
            "store"
                | "bus"
                | "agent"
                | "effects"
                | "transition"
                | "scheduler"
                | "supervisor"
                | "submitter"
                | "callback"
                | "runner"
                | "role"
                | "deps"
                | "telemetry"
                | "metrics"
        )
}

/// The library root of the crate that holds the pure protocol, and whether all of that crate is
/// the protocol's: sas-protocol once the protocol has a crate of its own, sas-core before.
fn protocol_home() -> (PathBuf, bool) {
    for member in members() {
        let manifest = std::fs::read_to_string(member.join("Cargo.toml")).unwrap_or_default();
        if manifest.lines().any(|l| l.replace(' ', "") == "name=\"sas-protocol\"") {
            return (member.join("src/lib.rs"), true);
        }
    }
    (workspace_root().join("crates/core/src/lib.rs"), false)
}

/// The crates a manifest's `[dependencies]` name (dev-dependencies aside), as paths spell them.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut section = String::new();
    for line in manifest.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if line.starts_with('[') {
            line.trim_matches(|c| c == '[' || c == ']').clone_into(&mut section);
            if let Some(name) = section.strip_prefix("dependencies.") {
                found.push(name.replace('-', "_"));
            }
        } else if section == "dependencies" || (section.starts_with("target.") && section.ends_with(".dependencies")) {
            let key = line.split('=').next().unwrap_or_default().trim();
            found.push(key.split('.').next().unwrap_or_default().replace('-', "_"));
        }
    }
    found
}

/// The layering true today: the pure protocol names no module of the engine, the adapters, the
/// agents or the telemetry, no crate of I/O ([`names_io`]; a wait's RFC 3339 time is
/// parsed with the `time` crate) and no other crate of the workspace; tests aside. In sas-core the protocol is
/// `protocol/**` and every module its code names, and theirs, to the end (`config_file`, `graph`,
/// `ids`, `messages`, `state`, `workflow`); as a crate of its own (sas-protocol) it is all of that
/// crate, and its manifest depends on no crate of I/O either. Not checked here: std's clock,
/// environment and files (`ids.rs` reads the wall clock, `workflow.rs` the file named by
/// `SAS_WORKFLOWS_FILE`) and uuid's randomness (`ids.rs`' new task ids and attempt tokens).
#[test]
fn the_pure_protocol_reaches_no_engine_adapter_or_agent_code() {
    let (lib, own_crate) = protocol_home();
    let home = tree(&lib);
    let non_test: Vec<(&PathRef, &PathBuf)> = home.paths.iter().filter(|(p, _)| !p.test).map(|(p, f)| (p, f)).collect();
    // the protocol and the modules its code names, and theirs, to the end (tests aside)
    let mut layer: BTreeSet<String> = if own_crate {
        home.modules.keys().filter_map(|m| m.first().cloned()).collect()
    } else {
        BTreeSet::from(["protocol".to_owned()])
    };
    let mut brought: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let before = layer.len();
        for (p, file) in &non_test {
            // (not on through a module it must not reach: that one is the finding)
            let Some(top) = p.module.first().filter(|m| layer.contains(*m) && !is_engine_adapter_or_agent(m)) else {
                continue;
            };
            if let Some(to) = home.resolve(&p.module, &p.segs).and_then(|to| to.first().cloned()) {
                if layer.insert(to.clone()) {
                    brought.insert(to, format!("{top} names {} ({}:{})", p.segs.join("::"), shown(file), p.line));
                }
            }
        }
        if layer.len() == before {
            break;
        }
    }
    assert!(layer.len() >= 5, "the scan found too little of the protocol's layer to mean anything: {layer:?}");
    let mut found: Vec<String> = layer
        .iter()
        .filter(|m| is_engine_adapter_or_agent(m))
        .map(|m| format!("{m}: {}", brought.get(m).map_or("", String::as_str)))
        .collect();
    for (p, file) in &non_test {
        let in_layer =
            own_crate || p.module.first().is_some_and(|m| layer.contains(m) && !is_engine_adapter_or_agent(m));
        let other_crate = home.resolve(&p.module, &p.segs).is_none();
        if in_layer && other_crate && (names_io(&p.segs) || p.segs.first().is_some_and(|c| c.starts_with("sas_"))) {
            found.push(format!("{} ({}:{}) in {}", p.segs.join("::"), shown(file), p.line, p.module.join("::")));
        }
    }
    if own_crate {
        let manifest = lib.parent().and_then(Path::parent).unwrap().join("Cargo.toml");
        let deps = dependencies(&std::fs::read_to_string(&manifest).unwrap());
        for dep in deps.iter().filter(|d| names_io(&[(*d).clone()]) || d.starts_with("sas_")) {
            found.push(format!("{} depends on {dep}", shown(&manifest)));
        }
    }
    assert!(
        found.is_empty(),
        "the protocol's layer ({}) reaches engine, adapter, agent or I/O code:\n{}",
        layer.iter().cloned().collect::<Vec<_>>().join(", "),
        found.join("\n")
    );
}

/// The Step Functions importer (sas-asl, `crates/asl`) is pure: a definition in, workflows, agents
/// and refusals out. Its manifest depends on no crate of I/O ([`names_io`]) and on no crate of the
/// workspace but sas-protocol (not sas-core: checking what it translates is sasctl's); its code,
/// tests aside, names neither, nor std's files, network, processes or environment.
#[test]
fn the_importer_is_pure_and_depends_on_the_protocol_alone() {
    let member = workspace_root().join("crates/asl");
    let manifest = member.join("Cargo.toml");
    let deps = dependencies(&std::fs::read_to_string(&manifest).unwrap());
    assert!(deps.iter().any(|d| d == "sas_protocol"), "{}: {deps:?}", shown(&manifest));
    let not_allowed =
        |krate: &str| names_io(&[krate.to_owned()]) || (krate.starts_with("sas_") && krate != "sas_protocol");
    let mut found: Vec<String> =
        deps.iter().filter(|d| not_allowed(d)).map(|d| format!("{} depends on {d}", shown(&manifest))).collect();
    let home = tree(&member.join("src/lib.rs"));
    let outside: Vec<&(PathRef, PathBuf)> =
        home.paths.iter().filter(|(p, _)| !p.test && home.resolve(&p.module, &p.segs).is_none()).collect();
    assert!(
        outside.iter().any(|(p, _)| p.segs.first().is_some_and(|c| c == "sas_protocol")),
        "the scan found too little of the importer's code to mean anything: {} paths",
        home.paths.len()
    );
    for (p, file) in outside {
        let krate = p.segs.first().map_or("", String::as_str);
        let std_io =
            krate == "std" && p.segs.get(1).is_some_and(|m| matches!(m.as_str(), "fs" | "net" | "process" | "env"));
        if not_allowed(krate) || std_io {
            found.push(format!("{} ({}:{}) in {}", p.segs.join("::"), shown(file), p.line, p.module.join("::")));
        }
    }
    assert!(
        found.is_empty(),
        "the importer reaches I/O or a crate of the workspace but sas-protocol:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_deployed_crates_use_neither_the_simulation_nor_the_twins() {
    let root = workspace_root();
    let src_trees = |member: &str| -> Vec<Tree> {
        targets(&root.join(member)).into_iter().filter(|(_, src)| *src).map(|(r, _)| tree(&r)).collect()
    };
    let mut found = Vec::new();
    // sas-core is below every other crate of the workspace but sas-protocol: it names none of them
    for t in src_trees("crates/core") {
        for (p, file) in &t.paths {
            if p.segs.first().is_some_and(|c| {
                matches!(
                    c.as_str(),
                    "sas_asl"
                        | "sas_cli"
                        | "sas_dev"
                        | "sas_functions"
                        | "sas_order_service"
                        | "sas_tests"
                        | "sas_testkit"
                )
            }) {
                found.push(format!("{}:{}: {}", shown(file), p.line, p.segs.join("::")));
            }
        }
    }
    // what is deployed runs on the real ports: the simulation and the twins (sas-testkit) are for
    // tests, a dev-dependency at most, named by no production source
    for member in ["crates/protocol", "crates/core", "crates/asl", "functions", "crates/cli", "services/order-service"]
    {
        let manifest = root.join(member).join("Cargo.toml");
        if dependencies(&std::fs::read_to_string(&manifest).unwrap()).iter().any(|d| d == "sas_testkit") {
            found.push(format!("{} depends on sas-testkit (a dev-dependency at most)", shown(&manifest)));
        }
        for t in src_trees(member) {
            for (p, file) in t.paths.iter().filter(|(p, _)| !p.test) {
                if p.segs.first().is_some_and(|c| c == "sas_testkit")
                    || (p.segs.first().is_some_and(|c| c == "sas_core")
                        && p.segs.get(1).is_some_and(|m| m == "sim" || m == "twins"))
                {
                    found.push(format!("{}:{}: {}", shown(file), p.line, p.segs.join("::")));
                }
            }
        }
    }
    assert!(found.is_empty(), "imports across the layers:\n{}", found.join("\n"));
}

/// The order service, the demo's stand-in for remote services, is linked by the developer's binary
/// alone (sas-dev, `crates/dev`): sasctl (sas-cli), the functions, the engine, the protocol and the
/// importer neither depend on it nor name it outside their tests. sas-dev stands on sas-cli's
/// library and the order service (and sas-core, sas-protocol), never on the test kit, the
/// functions or the integration tests; and no crate of the workspace depends on sas-dev.
#[test]
fn the_order_service_is_the_developer_binary_s_alone() {
    let root = workspace_root();
    let deps_of = |member: &str| dependencies(&std::fs::read_to_string(root.join(member).join("Cargo.toml")).unwrap());
    let mut found = Vec::new();
    for member in ["crates/protocol", "crates/core", "crates/asl", "crates/cli", "functions"] {
        if deps_of(member).iter().any(|d| d == "sas_order_service") {
            found.push(format!("{member}/Cargo.toml depends on sas-order-service"));
        }
        for (r, _) in targets(&root.join(member)).into_iter().filter(|(_, src)| *src) {
            for (p, file) in tree(&r).paths.iter().filter(|(p, _)| !p.test) {
                if p.segs.first().is_some_and(|c| c == "sas_order_service") {
                    found.push(format!("{}:{}: {}", shown(file), p.line, p.segs.join("::")));
                }
            }
        }
    }
    let dev = deps_of("crates/dev");
    assert!(
        ["sas_cli", "sas_order_service"].iter().all(|d| dev.iter().any(|x| x == d)),
        "crates/dev/Cargo.toml: sas-dev is sas-cli's library and the order service: {dev:?}"
    );
    let allowed = ["sas_cli", "sas_core", "sas_protocol", "sas_order_service"];
    for d in dev.iter().filter(|d| d.starts_with("sas_") && !allowed.contains(&d.as_str())) {
        found.push(format!("crates/dev/Cargo.toml depends on {d}"));
    }
    for member in members() {
        let manifest = member.join("Cargo.toml");
        if dependencies(&std::fs::read_to_string(&manifest).unwrap()).iter().any(|d| d == "sas_dev") {
            found.push(format!("{} depends on sas-dev", shown(&manifest)));
        }
    }
    assert!(found.is_empty(), "the order service beyond the developer's binary:\n{}", found.join("\n"));
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
