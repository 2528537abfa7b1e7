//! sas-core: the Scheduler-Agent-Supervisor pattern on AWS serverless.
//!
//! - [`protocol`]: the pure state machine (no I/O) that every role drives;
//! - [`workflow`]: named, versioned workflow definitions;
//! - [`messages`]: the JSON contracts on every queue and topic;
//! - [`ids`]: validated identifiers (task ids, attempt tokens, idempotency keys);
//! - [`store`]: the DynamoDB state store (conditional writes, the sparse CompleteBy index);
//! - [`bus`]: SQS and SNS sends, and the effects of a transition;
//! - [`agents`]: the Agent trait and the runtime that enforces deadlines and retries;
//! - [`http_agent`]: the built-in HTTP agent (endpoints from configuration only);
//! - [`roles`]: Submitter, Scheduler, Agent and Supervisor handlers;
//! - [`runner`]: the local runner that polls the queues like Lambda does.
#![warn(clippy::pedantic)]
#![allow(
    clippy::module_name_repetitions,
    clippy::missing_errors_doc,
    clippy::missing_panics_doc,
    clippy::must_use_candidate,
    clippy::too_many_lines,
    clippy::doc_markdown
)]

pub mod agents;
pub mod aws;
pub mod bus;
pub mod config;
pub mod http_agent;
pub mod ids;
pub mod messages;
pub mod protocol;
pub mod roles;
pub mod runner;
pub mod store;
pub mod telemetry;
pub mod workflow;
