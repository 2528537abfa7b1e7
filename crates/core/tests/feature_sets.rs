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
