//! The answer desk of callback steps: one answer (succeeded, failed, heartbeat) with its token,
//! from the callback queue, the HTTPS endpoint or `sasctl`, becomes one protocol event on one
//! task, fenced by the attempt the token names; what it did is told back ([`CallbackReply`]).

use crate::deps::{Deps, HandlerError};
use crate::messages::{CallbackMessage, CallbackReply, CallbackResult};

/// Apply one answer. `message`: the id of the queue message that carried it (`None` for the
/// HTTPS endpoint and direct calls).
pub async fn answer(deps: &Deps, msg: &CallbackMessage, message: Option<&str>) -> Result<CallbackReply, HandlerError> {
    let _ = (deps, msg, message);
    Ok(CallbackReply::new(CallbackResult::Unknown, None, "not built yet"))
}
