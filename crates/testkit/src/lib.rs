//! sas-testkit: what the tests of every crate share, and nothing the functions link.
//!
//! - [`twins`]: the stack wired to in-memory twins (a [`sas_core::store::MemoryStore`], a
//!   [`sas_core::bus::MemoryBus`] with the stack's queues, a [`sas_core::clock::ManualClock`]);
//! - [`sim`]: the deterministic simulation of the whole system on the twins, seed by seed, with the
//!   invariants it checks (`make sim`; `tests/simulation.rs`; `examples/sim_fingerprint.rs`).
//!
//! `publish = false`: the functions, sasctl and the order service never depend on it
//! (`crates/core/tests/module_graph.rs` checks it with `cargo tree`).

pub mod coverage;
pub mod sim;
pub mod twins;
