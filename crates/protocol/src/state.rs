//! The pattern's `ProcessState`: the one vocabulary the table, the status messages, the alerts and
//! the operators' commands share. A leaf module: it depends on nothing else in the crate.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The pattern's `ProcessState`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for the Scheduler to claim the current step (first start or a retry).
    Pending,
    /// A step is with its Agent; `LockedBy` holds the attempt's token.
    Processing,
    /// Every step succeeded.
    Processed,
    /// Completed steps are being undone, in reverse order.
    Compensating,
    /// The task failed and every completed step was undone.
    Compensated,
    /// The task failed and could not be undone: an operator must look.
    Error,
    /// Stopped on request; completed steps were undone.
    Cancelled,
    /// The submission was refused (it never became a task).
    Rejected,
}

impl ProcessState {
    pub const ALL: [ProcessState; 8] = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Compensating,
        ProcessState::Compensated,
        ProcessState::Error,
        ProcessState::Cancelled,
        ProcessState::Rejected,
    ];

    /// Terminal states are never left by the protocol.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ProcessState::Processed
                | ProcessState::Compensated
                | ProcessState::Error
                | ProcessState::Cancelled
                | ProcessState::Rejected
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Pending => "Pending",
            ProcessState::Processing => "Processing",
            ProcessState::Processed => "Processed",
            ProcessState::Compensating => "Compensating",
            ProcessState::Compensated => "Compensated",
            ProcessState::Error => "Error",
            ProcessState::Cancelled => "Cancelled",
            ProcessState::Rejected => "Rejected",
        }
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown ProcessState {0:?}; one of Pending, Processing, Processed, Compensating, Compensated, Error, Cancelled, Rejected")]
pub struct UnknownState(pub String);

impl FromStr for ProcessState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        ProcessState::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}
