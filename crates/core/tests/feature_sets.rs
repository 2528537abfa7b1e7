//! The workspace's builds ask the same features of every crate they share, so each crate is
//! compiled once per profile (see `crates/workspace-hack/Cargo.toml` for why it matters).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// `cargo tree` of the whole workspace: each package (name and version) with the feature sets it
/// is built with.
fn features(extra: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--workspace", "--offline", "--prefix", "none", "-f", "{p}|{f}"])
        .args(extra)
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let mut by_package: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim_end_matches(" (*)").trim();
        if let Some((package, features)) = line.split_once('|') {
            // `name vX.Y.Z (path)` for workspace members: the name and version identify it
            let package = package.split(' ').take(2).collect::<Vec<_>>().join(" ");
            by_package.entry(package).or_default().insert(features.trim().to_owned());
        }
    }
    by_package
}

#[test]
fn the_binaries_and_the_tests_build_the_shared_crates_alike() {
    let binaries = features(&["-e", "no-dev"]);
    let tests = features(&[]);
    assert!(binaries.len() > 100, "cargo tree found too few packages to mean anything: {}", binaries.len());
    let differ: Vec<String> = binaries
        .iter()
        .filter(|(package, set)| tests.get(*package).is_some_and(|t| t != *set))
        .map(|(package, set)| format!("{package}: binaries {set:?}, tests {:?}", tests[package]))
        .collect();
    assert!(
        differ.is_empty(),
        "a dev-dependency turns on features the binaries do not ask for: each such crate, and all above \
         it, is compiled twice; add the features to crates/workspace-hack/Cargo.toml:\n{}",
        differ.join("\n")
    );
}

/// The project's scripts (what CI, `make test`, `make demo` run) build and test the whole
/// workspace: `cargo build -p a -p b` asks the features of `a` and `b` only, a third feature set,
/// and every AWS SDK crate is compiled again (about 1.3 GB of disk and minutes of CI, as `-p sas-tests`
/// in `make test-lambda` once did).
#[test]
fn every_script_builds_the_whole_workspace() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut scripts = vec![root.join("Makefile"), root.join(".ci/run"), root.join("examples/byow/walkthrough.sh")];
    for entry in std::fs::read_dir(root.join("infra")).expect("infra/ is read") {
        let path = entry.expect("an entry of infra/").path();
        if path.extension().is_some_and(|e| e == "sh") {
            scripts.push(path);
        }
    }
    assert!(scripts.len() > 8, "too few scripts found to mean anything: {scripts:?}");
    let mut builds = 0;
    let mut partial = Vec::new();
    for script in &scripts {
        let text = std::fs::read_to_string(script).expect("the script is read");
        for (n, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or(line).trim_start();
            if code.starts_with('#') || code.starts_with("echo") || code.starts_with("phase ") {
                continue;
            }
            let Some(at) = ["cargo build", "cargo test", "cargo nextest run", "cargo clippy", "cargo run"]
                .iter()
                .find_map(|c| code.find(c))
            else {
                continue;
            };
            builds += 1;
            if !code[at..].contains("--workspace") {
                partial.push(format!("{}:{}: {}", script.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(builds >= 10, "too few cargo builds found in the scripts to mean anything: {builds}");
    assert!(
        partial.is_empty(),
        "these builds select packages instead of the workspace (another feature set: everything compiled twice):\n{}",
        partial.join("\n")
    );
}
