//! The deterministic simulation of the whole system (see `sas_testkit::sim`): many seeds, every
//! fault on, invariants checked against the remote services' ledger. `SIM_SEEDS=<n>` sets how
//! many seeds (default 300), `SIM_SEED=<seed>` replays one, `SIM_FAULTS=a,b` turns on only the
//! named faults (the fields of `sim::Faults`), to see which invariant one fault breaks.

// The seed count and the burst figures are the point of running these: print them.
#![allow(clippy::print_stderr)]

use std::collections::BTreeSet;

use sas_protocol::protocol::table::RARE;
use sas_protocol::protocol::TRANSITIONS;
use sas_testkit::sim::{self, Faults, SimConfig};

fn faults() -> Faults {
    match std::env::var("SIM_FAULTS") {
        Ok(names) => {
            let names: Vec<&str> = names.split(',').collect();
            Faults::only(&names).unwrap_or_else(|| panic!("SIM_FAULTS names an unknown fault: {names:?}"))
        }
        Err(_) => Faults::all(),
    }
}

fn seed_count() -> u64 {
    std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300)
}

/// Every test of this file first: when replaying one seed (`SIM_SEED`), the roles' logs on the
/// terminal (RUST_LOG, default info); otherwise the transition recorder as the process's
/// subscriber, before any test reaches the engine (see `sas_testkit::coverage`).
fn setup() -> Option<&'static sas_testkit::coverage::Recorder> {
    if std::env::var("SIM_SEED").is_ok() {
        sas_core::telemetry::init();
        return None;
    }
    sas_testkit::coverage::global()
}

#[test]
fn every_seed_keeps_the_invariants() {
    let recorder = setup();
    let seeds = sim::seeds(1, seed_count());
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    // each invariant broken: in how many seeds, the first of them and its first violation
    let mut broken: std::collections::BTreeMap<String, (usize, u64, String)> = std::collections::BTreeMap::new();
    let (mut handled, mut attempts, mut limit_waits, mut limited_max, mut elements_max, mut fenced) =
        (0, 0, 0, 0, 0, 0);
    let (mut skipped, mut handled_failures) = (0, 0);
    let mut children: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut callbacks: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let faults = faults();
    // every written transition's (state, event) pair, for the protocol's table (not when
    // replaying one seed: its logs go to the terminal)
    let replaying = std::env::var("SIM_SEED").is_ok();
    assert!(replaying || recorder.is_some(), "another global subscriber was set before the transition recorder");
    for &seed in &seeds {
        let r = sim::run(&SimConfig { faults: faults.clone(), ..SimConfig::for_seed(seed) });
        handled += r.handled;
        attempts += r.attempts;
        limit_waits += r.limit_waits;
        fenced += r.fenced;
        skipped += r.skipped;
        handled_failures += r.handled_failures;
        for (k, n) in &r.child_states {
            *children.entry(k.clone()).or_default() += n;
        }
        limited_max = limited_max.max(r.limited_max);
        elements_max = elements_max.max(r.elements_max);
        for (k, n) in &r.callbacks {
            *callbacks.entry(k.clone()).or_default() += n;
        }
        if !r.violations.is_empty() {
            failed.push(sim::describe(&r));
        }
        let mut kinds = std::collections::BTreeSet::new();
        for v in &r.violations {
            let kind = v.split_once(':').map_or("?", |(k, _)| k).to_owned();
            if kinds.insert(kind.clone()) {
                let e = broken.entry(kind).or_insert_with(|| (0, seed, v.clone()));
                e.0 += 1;
            }
        }
    }
    eprintln!(
        "simulation: {} seeds, {} failed, {handled} messages handled, {attempts} agent attempts, in {:.1} s",
        seeds.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    eprintln!("callback answers and heartbeats, by what the desk said: {callbacks:?}");
    eprintln!(
        "{}: {limit_waits} requests waited for a slot; at most {limited_max} calls open at once (max_in_flight {})",
        sim::LIMITED_AGENT,
        sim::LIMIT
    );
    eprintln!(
        "map elements: at most {elements_max} of one map running at once (max_concurrency {})",
        sim::MAP_CONCURRENCY
    );
    eprintln!("{fenced} copies of agent requests not started: their task no longer waited for their attempt");
    eprintln!("{skipped} steps skipped by their guards; {handled_failures} failures handled by on_failure: continue");
    eprintln!("child workflows' tasks, by how they ended: {children:?}");
    for (kind, (n, first, text)) in &broken {
        eprintln!("  {kind}: {n} seeds, first seed {first}: {text}");
    }
    let reached = recorder.map(sas_testkit::coverage::Recorder::pairs).unwrap_or_default();
    let table: BTreeSet<(String, String)> =
        TRANSITIONS.iter().map(|(state, event)| (state.to_string(), (*event).to_owned())).collect();
    let outside: Vec<_> = reached.difference(&table).collect();
    assert!(
        replaying || outside.is_empty(),
        "written transitions in (state, event) pairs the protocol's table does not list \
         (crates/protocol/src/protocol/table.rs): {outside:?}"
    );
    if seeds.len() >= 300 && std::env::var("SIM_FAULTS").is_err() {
        // the default run reaches every pair of the table: each is put to the test, but for the
        // rare ones (RARE), which a run may or may not meet
        let rare: BTreeSet<(String, String)> =
            RARE.iter().map(|(state, event)| (state.to_string(), (*event).to_owned())).collect();
        let unreached: Vec<_> = table.difference(&reached).filter(|pair| !rare.contains(*pair)).collect();
        assert!(unreached.is_empty(), "pairs of the protocol's table no seed reached: {unreached:?}");
    }
    eprintln!("transition coverage: {} of the table's {} (state, event) pairs reached", reached.len(), table.len());
    if seeds.len() >= 50 {
        // the limit was met, so the max-in-flight invariant was put to the test
        assert!(limit_waits > 0 && limited_max == sim::LIMIT, "{limit_waits} waits, at most {limited_max} at once");
        // maps ran elements side by side, so the max-concurrency invariant was put to the test
        assert_eq!(elements_max, sim::MAP_CONCURRENCY, "at most {elements_max} elements of a map at once");
        // late copies met tasks that had moved on, so the agents' check was put to the test
        if faults.late_copy > 0.0 {
            assert!(fenced > 0, "no copy was refused by the agents' check");
        }
        // guards went both ways and failures were handled, so the `skipped` invariant was put to the test
        assert!(skipped > 0, "no step was skipped");
        // children ran, and some were undone with their parent
        assert!(children.get("Processed").is_some_and(|n| *n > 0), "{children:?}");
        assert!(children.get("Compensated").is_some_and(|n| *n > 0), "{children:?}");
        if faults.permanent > 0.0 || faults.transient > 0.0 {
            assert!(handled_failures > 0, "no failure was handled by on_failure: continue");
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} seeds broke an invariant:\n{}",
        failed.len(),
        seeds.len(),
        failed.iter().take(5).cloned().collect::<String>()
    );
}

#[test]
fn a_seed_replays_exactly() {
    setup();
    let a = sim::run(&SimConfig::for_seed(42));
    let b = sim::run(&SimConfig::for_seed(42));
    assert_eq!(
        (a.handled, a.attempts, a.virtual_ms, &a.end_states, &a.violations),
        (b.handled, b.attempts, b.virtual_ms, &b.end_states, &b.violations)
    );
    let c = sim::run(&SimConfig::for_seed(43));
    assert_ne!((a.handled, a.attempts, a.virtual_ms), (c.handled, c.attempts, c.virtual_ms), "seeds differ");
}

#[test]
fn a_burst_far_beyond_capacity_drains_with_every_task_processed() {
    setup();
    // 300 three-step tasks at once; the agents start 20 requests a second: 45 s of queue for
    // 5 s steps. No fault: every task must end Processed, at about one attempt per step.
    let cfg = SimConfig {
        seed: 7,
        burst: 300,
        trickle: 0,
        agent_rate: 20,
        faults: Faults::none(),
        horizon_ms: 3_600_000,
        map_lines: None,
        pages: None,
        keys: None,
        schedule: None,
    };
    let r = sim::run(&cfg);
    let processed = r.end_states.get("Processed").copied().unwrap_or(0);
    #[allow(clippy::cast_precision_loss)]
    let per_unit = (r.attempts - r.not_started) as f64 / r.units.max(1) as f64;
    eprintln!(
        "burst: {:?}, {} attempts for {} units ({per_unit:.2} per step; {} more not started: they waited \
         past their start_by and were claimed again), {} waits for a slot of {}, {} s virtual",
        r.end_states,
        r.attempts - r.not_started,
        r.units,
        r.not_started,
        r.limit_waits,
        sim::LIMITED_AGENT,
        r.virtual_ms / 1000
    );
    assert_eq!(processed, 300, "{}", sim::describe(&r));
    assert!(per_unit < 1.05, "attempts per step {per_unit:.2}");
}

/// A 1,000-element map (two elements at once) under every fault of the infrastructure (crashes,
/// duplicates of messages and of agent requests, lost sends, ambiguous writes, failed batches; the
/// services answer, slowly at times) ends `Processed` with every element `Processed` once, in each
/// of [`MAP_SEEDS`] seeds (`MAP_SEEDS=n` for more); under every fault of the services too
/// (refusals, hangs, cancels), it ends, with its invariants kept.
///
/// Agent requests are duplicated four times as often as in [`Faults::all`], so that copies meet a
/// key held by another call (a slow one): such a copy waits for the key, and a 409 is not a failed
/// attempt (counted as one, three of them fail the element, and the map compensates in 10 of 12
/// seeds). Slow calls are rarer than in [`Faults::all`] (1 in 100): three in a row past the step's
/// timeout fail an element by the retry policy, as they should (in 2 of 28 seeds at 1 in 20). The
/// remote side's timeouts are off like its other faults: at [`Faults::all`]'s 3 in 100 they failed
/// an element three times running in about one seed of twenty (2 of 12 seeds, 0 of 12 others,
/// depending only on the order of the random draws).
/// The infrastructure's faults alone (crashes, duplicates of messages and of agent requests, lost
/// sends, ambiguous writes, a slow call now and then): the services never refuse, hang or time out.
fn infrastructure_faults() -> Faults {
    Faults {
        transient: 0.0,
        permanent: 0.0,
        hang: 0.0,
        remote_timeout: 0.0,
        effect_no_answer: 0.0,
        effect_then_retryable: 0.0,
        late_effect: 0.0,
        cancel: 0.0,
        resubmit: 0.0,
        slow: 0.01,
        agent_duplicate: 0.2,
        ..Faults::all()
    }
}

#[test]
fn a_thousand_element_map_ends() {
    setup();
    let infrastructure = infrastructure_faults();
    let seeds = std::env::var("MAP_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(MAP_SEEDS);
    let runs: Vec<(u64, Faults, bool)> =
        (1..=seeds).map(|seed| (seed, infrastructure.clone(), true)).chain([(5, Faults::all(), false)]).collect();
    // the seeds side by side: each is a few seconds
    let reports: Vec<sim::SimReport> = std::thread::scope(|s| {
        let running: Vec<_> = runs
            .iter()
            .map(|(seed, faults, _)| {
                s.spawn(move || {
                    let cfg = SimConfig {
                        burst: 1,
                        trickle: 0,
                        map_lines: Some(1_000),
                        horizon_ms: 48 * 3_600_000,
                        faults: faults.clone(),
                        ..SimConfig::for_seed(*seed)
                    };
                    sim::run(&cfg)
                })
            })
            .collect();
        running.into_iter().map(|h| h.join().expect("a seed's run")).collect()
    });
    let mut failed = Vec::new();
    let mut keys_in_use = 0;
    for ((seed, _, processed), r) in runs.iter().zip(&reports) {
        eprintln!(
            "1,000-element map, seed {seed}{}: {:?} after {} s virtual, {} messages, {} attempts, {} copies \
             found the key in use ({} to their deadline), at most {} elements at once",
            if *processed { "" } else { " (every fault)" },
            (&r.end_states, &r.element_states),
            r.virtual_ms / 1000,
            r.handled,
            r.attempts,
            r.keys_in_use,
            r.keys_in_use_to_the_deadline,
            r.elements_max,
        );
        assert!(r.violations.is_empty(), "seed {seed}: {}", sim::describe(r));
        if *processed {
            keys_in_use += r.keys_in_use;
            let ok = r.end_states.get("Processed") == Some(&1)
                && r.element_states.get("Processed") == Some(&1_000)
                && r.elements_max == sim::MAP_CONCURRENCY;
            if !ok {
                failed.push(format!("seed {seed}: {:?}", r.unprocessed));
            }
        }
    }
    assert!(failed.is_empty(), "{} of {seeds} seeds did not end Processed:\n{}", failed.len(), failed.join("\n"));
    // the case was met: copies found their key held by another call
    assert!(keys_in_use > 0, "no copy of an agent request found its key in use");
}

/// A map over items in pages, as `sasctl import-asl` translates a Distributed Map over S3 (a
/// reading step answers the page numbers, a child task per page reads its page and maps its items):
/// 5 pages of 100 items, each item a task of its own (two levels of children), end `Processed`
/// under the infrastructure's faults, every item reserved once. `SIM_PAGES=PAGESxITEMS` runs
/// another size: `SIM_PAGES=1000x100` (100,000 items, 5.7 days of virtual time) ends in 41 s with
/// `--release`.
#[test]
fn a_map_over_pages_of_items_ends() {
    setup();
    let (pages, per_page) = std::env::var("SIM_PAGES")
        .ok()
        .and_then(|v| v.split_once('x').and_then(|(p, k)| Some((p.parse().ok()?, k.parse().ok()?))))
        .unwrap_or((5, 100));
    let infrastructure = infrastructure_faults();
    let cfg = SimConfig {
        burst: 1,
        trickle: 0,
        pages: Some((pages, per_page)),
        agent_rate: 200,
        horizon_ms: 30 * 24 * 3_600_000,
        faults: infrastructure,
        ..SimConfig::for_seed(1)
    };
    let started = std::time::Instant::now();
    let r = sim::run(&cfg);
    eprintln!(
        "{pages} pages of {per_page} items: {:?} after {} s virtual ({:.0} s here), {} messages, {} attempts",
        (&r.end_states, &r.child_states, &r.element_states),
        r.virtual_ms / 1000,
        started.elapsed().as_secs_f64(),
        r.handled,
        r.attempts,
    );
    assert!(r.violations.is_empty(), "{}", sim::describe(&r));
    assert_eq!(r.end_states.get("Processed"), Some(&1), "{:?}", r.unprocessed);
    assert_eq!(r.child_states.get("Processed"), Some(&pages), "every page's child ended Processed");
    assert_eq!(r.element_states.get("Processed"), Some(&(pages * per_page)), "every item ended Processed");
}

/// Seeds of [`a_thousand_element_map_ends`] under infrastructure faults.
const MAP_SEEDS: u64 = 6;

/// A burst of 300 tasks on 10 accounts, at most one at a time per account (`order-keyed`'s
/// concurrency key): one at a time per key (`key-limit`, checked at every instant), nothing lost
/// or doubled (every task `Processed`, each step applied once: `processed-once`, `key-once`), no
/// task left waiting (`key-waited`). Without faults, then under the infrastructure's faults
/// (crashes between writes and sends, duplicates, lost sends: lost grants and releases are
/// recovered by the Supervisor's check of the key).
#[test]
fn a_burst_on_ten_keys_with_a_limit_of_one_runs_one_at_a_time_per_key() {
    setup();
    let runs = [(11, Faults::none()), (12, infrastructure_faults()), (13, infrastructure_faults())];
    let reports: Vec<sim::SimReport> = std::thread::scope(|s| {
        let handles: Vec<_> = runs
            .iter()
            .map(|(seed, faults)| {
                let cfg = SimConfig {
                    burst: 300,
                    trickle: 0,
                    keys: Some(10),
                    agent_rate: 50,
                    horizon_ms: 7 * 24 * 3_600_000,
                    faults: faults.clone(),
                    ..SimConfig::for_seed(*seed)
                };
                s.spawn(move || sim::run(&cfg))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a run")).collect()
    });
    for r in &reports {
        eprintln!(
            "seed {}: {:?}, {} waited for a slot, at most {} running per key, {} s virtual, {} messages",
            r.seed,
            r.end_states,
            r.key_waited,
            r.key_max,
            r.virtual_ms / 1000,
            r.handled
        );
        assert!(r.violations.is_empty(), "{}", sim::describe(r));
        assert_eq!(r.end_states.get("Processed"), Some(&300), "{}: {:?}", r.seed, r.unprocessed);
        assert_eq!(r.key_max, 1, "one at a time per key, and the keys did run");
        assert!(r.key_waited >= 250, "most of the burst waited for its key: {}", r.key_waited);
    }
}

/// A schedule of every minute, under `skip`, for an hour beside a trickle of submissions: the
/// sweeps (sometimes two at once, their hand-offs failing now and then) send each instant once
/// (`schedule-once`), never two of its tasks run at once (`key-limit`), and every task ends.
#[test]
fn a_schedule_of_every_minute_sends_each_instant_once_and_never_runs_two_at_once() {
    setup();
    let runs = [(21, Faults::none()), (22, infrastructure_faults()), (23, infrastructure_faults())];
    for (seed, faults) in runs {
        let cfg = SimConfig { burst: 0, trickle: 10, schedule: Some(60), faults, ..SimConfig::for_seed(seed) };
        let r = sim::run(&cfg);
        eprintln!(
            "seed {}: {} instants sent, {} tasks of the schedule, {:?}, at most {} running per key, {} s virtual",
            r.seed,
            r.scheduled_sent,
            r.scheduled_tasks,
            r.end_states,
            r.key_max,
            r.virtual_ms / 1000
        );
        assert!(r.violations.is_empty(), "{}", sim::describe(&r));
        assert!(r.scheduled_sent >= 55, "an hour of minutes: {}", r.scheduled_sent);
        assert!(r.scheduled_tasks >= 1 && r.scheduled_tasks as u64 <= r.scheduled_sent, "{}", r.scheduled_tasks);
        assert!(r.key_max <= 1, "one of the schedule's tasks at a time");
    }
}
