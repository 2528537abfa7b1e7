//! sas-protocol: what the Scheduler-Agent-Supervisor project's roles agree on, with no I/O.
//!
//! - [`protocol`]: the pure state machine, `(task, event) -> (task', effects)`, that every role
//!   drives (sas-core performs its effects and writes its tasks);
//! - [`messages`]: the JSON contracts of the queues, the callback answers and the statuses;
//! - [`workflow`] and [`graph`]: workflow definitions and their steps as a graph; [`condition`]: a
//!   step's guard and the paths it reads; [`template`]: the data a step sends and keeps;
//! - [`service_models`]: AWS's APIs as the `aws` agent calls them (services, actions, protocols);
//! - [`ids`], [`state`]: identifiers, times and `ProcessState`; [`config_file`]: configuration
//!   files read with the path of every mistake.
//!
//! It depends on serde and nothing that does I/O: no async runtime, no AWS SDK (the order
//! service and outside callers can depend on it for the wire types alone).

pub mod condition;
pub mod config_file;
pub mod graph;
pub mod ids;
pub mod intrinsic;
pub mod jobs;
pub mod keys;
pub mod messages;
pub mod protocol;
pub mod schedules;
pub mod service_models;
pub mod state;
pub mod template;
pub mod workflow;
pub mod xml_answer;
