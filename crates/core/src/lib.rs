//! sas-core: the Scheduler-Agent-Supervisor pattern on AWS serverless.
//!
//! The pattern, one place each:
//! - `sas_protocol::protocol`: the pure state machine (no I/O) that every role drives, with the
//!   contracts (`messages`), definitions (`workflow`), `ids` and `state`: the crate sas-protocol,
//!   which callers import themselves (this crate does not re-export it);
//! - [`submitter`], [`scheduler`], [`agent`], [`supervisor`]: the four roles' handlers;
//! - [`transition`]: the one module that writes tasks (decide, conditional write, create);
//! - [`envelope`]: a queue record read once, for its role;
//! - [`effects`]: the one path that performs a written transition's effects.
//!
//! The ports, each with an AWS implementation and an in-memory twin:
//! - [`store`]: the state store (DynamoDB; [`store::MemoryStore`]);
//! - [`bus`]: queues and the alert topic (SQS and SNS; [`bus::MemoryBus`]);
//! - [`clock`]: the time ([`clock::SystemClock`]; [`clock::ManualClock`]);
//! - [`entropy`]: attempt tokens and jitter ([`entropy::OsEntropy`]; [`entropy::SeededEntropy`]).
//!
//! Around them: [`config`], [`reply`] (which `reply_to` queues the stack may answer on),
//! [`deps`] (the composition root), [`role`] (the role enum and dispatch), [`runner`] (the local
//! runner that polls queues as Lambda does), [`aws`] (SDK clients), [`aws_calls`] (the record
//! of AWS calls for the least-privilege check), [`telemetry`] (logs and the metrics recorder),
//! [`metrics`] (what is measured), [`trace`] (one trace per task).
//!
//! The stack wired to the twins and the deterministic simulation of the whole system live in the
//! crate sas-testkit (`crates/testkit`, not published), which the tests depend on and the
//! functions, sasctl and the order service do not.

// The contracts, definitions and the pure protocol live in sas-protocol (no I/O): this crate's
// modules name them `crate::protocol`, ...; other crates import them from sas-protocol itself, so
// every import shows which side of the crate line it is on.
use sas_protocol::{config_file, ids, messages, protocol, state, workflow};

pub mod agent;
pub mod aws;
pub mod aws_calls;
pub mod bus;
pub mod callback;
pub mod clock;
pub mod config;
pub mod deps;
pub mod effects;
pub mod entropy;
pub mod envelope;
pub mod keys;
pub mod limit;
pub mod metrics;
pub mod reply;
pub mod role;
pub mod runner;
pub mod scheduler;
pub mod schedules;
#[cfg(feature = "schema")]
pub mod schema;
pub mod screen;
pub mod store;
pub mod submitter;
pub mod supervisor;
pub mod telemetry;
pub mod trace;
pub use deps::transition;
