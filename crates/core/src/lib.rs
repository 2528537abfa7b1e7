//! sas-core: the Scheduler-Agent-Supervisor pattern on AWS serverless.
//!
//! - [`protocol`]: the pure state machine (no I/O) that every role drives;
//! - [`workflow`]: named, versioned workflow definitions;
//! - [`messages`]: the JSON contracts on every queue and topic;
//! - [`ids`]: validated identifiers (task ids, attempt tokens, idempotency keys).
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions, clippy::missing_errors_doc, clippy::missing_panics_doc, clippy::must_use_candidate)]

pub mod ids;
pub mod messages;
pub mod protocol;
pub mod workflow;
