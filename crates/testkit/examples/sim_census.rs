//! Count the kinds of invariant violations over many seeds (a tool for reading the simulator's
//! findings): `cargo run -p sas-testkit --example sim_census -- 1000`.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;

use sas_testkit::sim::{self, SimConfig};

fn kind(v: &str) -> &'static str {
    if v.contains("after its compensation") {
        "a forward effect landed after its compensation (F1)"
    } else if v.contains("was never undone") {
        "a possibly-applied effect was never undone (F2)"
    } else if v.contains("not terminal") {
        "a task never ended"
    } else if v.contains("without a task_error alert") {
        "Error without an alert"
    } else if v.contains("overwritten") {
        "a terminal state was overwritten"
    } else if v.contains("became tasks") {
        "a submission was lost"
    } else {
        "other"
    }
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(500);
    let mut kinds: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut failed = 0;
    for seed in 1..=n {
        let r = sim::run(&SimConfig::for_seed(seed));
        if !r.violations.is_empty() {
            failed += 1;
        }
        for v in &r.violations {
            let e = kinds.entry(kind(v)).or_insert((0, seed));
            e.0 += 1;
        }
    }
    println!("{n} seeds, {failed} with a violation");
    for (k, (count, first)) in kinds {
        println!("  {count:5}  {k} (first seed {first})");
    }
}
