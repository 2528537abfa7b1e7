//! What an agent hands to the remote side of a callback step besides the work: the token, the
//! heartbeat it must keep, and where it answers.

use serde_json::{json, Value};

use crate::messages::CallbackRef;

/// Where the remote side of a callback step answers, as the agents tell it (the top-level
/// `"callback"` of the configuration, variables expanded; one whose variable is not set is left
/// out: a worker then answers the way it knows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallbackEndpoints {
    /// The callback queue (workers inside AWS send a `CallbackMessage` there).
    pub queue_url: Option<String>,
    /// The HTTPS endpoint (IAM auth; POST a `CallbackMessage`).
    pub url: Option<String>,
}

impl CallbackEndpoints {
    /// What an agent hands over with the work of a callback step:
    /// `{"token": "...", "heartbeat_ms": N, "queue_url": "...", "url": "..."}` (absent parts left out).
    pub fn handover(&self, cb: &CallbackRef) -> Value {
        let mut v = json!({"token": cb.token.expose()});
        if let Some(h) = cb.heartbeat_ms {
            v["heartbeat_ms"] = json!(h);
        }
        if let Some(q) = &self.queue_url {
            v["queue_url"] = json!(q);
        }
        if let Some(u) = &self.url {
            v["url"] = json!(u);
        }
        v
    }
}
