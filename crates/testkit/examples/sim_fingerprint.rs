//! What the simulator did, seed by seed, one line each (messages handled, attempts, units,
//! virtual time, fenced copies, keys in use, end states of tasks and elements, violations): run
//! it before and after a change that must not alter behaviour and compare the two files.
//! `cargo run -p sas-testkit --example sim_fingerprint -- 200 > before.txt` (seeds 1 to 200).
#![allow(clippy::print_stdout)]

use sas_testkit::sim::{self, SimConfig};

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    for seed in sim::seeds(1, n) {
        let r = sim::run(&SimConfig::for_seed(seed));
        println!(
            "seed {seed}: handled {} attempts {} units {} virtual_ms {} not_started {} fenced {} keys_in_use {}/{} skipped {} continued {} \
             limit_waits {} tasks {:?} elements {:?} callbacks {:?} violations {}",
            r.handled,
            r.attempts,
            r.units,
            r.virtual_ms,
            r.not_started,
            r.fenced,
            r.keys_in_use,
            r.keys_in_use_to_the_deadline,
            r.skipped,
            r.handled_failures,
            r.limit_waits,
            r.end_states,
            r.element_states,
            r.callbacks,
            r.violations.len()
        );
    }
}
