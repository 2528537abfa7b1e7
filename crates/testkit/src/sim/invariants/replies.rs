//! `reply-once`: each task's final status reached its reply queue, and no terminal status too
//! often.

use std::collections::BTreeMap;

use sas_protocol::messages::StatusMessage;
use sas_protocol::protocol::ProcessState;

use crate::sim::{Sim, MAX_TERMINAL_REPLIES, REPLY_QUEUE};

impl Sim {
    /// Every task's final status reached the reply queue, and no terminal status too often.
    pub(super) fn check_replies(&self, tasks: &[sas_protocol::protocol::Task], v: &mut Vec<String>) {
        let mut delivered: BTreeMap<(String, u64), (ProcessState, usize)> = BTreeMap::new();
        for body in self.bus.bodies(REPLY_QUEUE) {
            match serde_json::from_str::<StatusMessage>(&body) {
                // the answer to a duplicate submission is a notice of its own, not a redelivery
                Ok(s) if s.duplicate => {}
                Ok(s) => delivered.entry((s.task_id.to_string(), s.seq)).or_insert((s.state, 0)).1 += 1,
                Err(e) => v.push(format!("reply-once: a reply that is no status: {e}")),
            }
        }
        for ((id, seq), (state, n)) in &delivered {
            let repeats = self.repeated_answers.get(id).copied().unwrap_or(0);
            if state.is_terminal() && *n > MAX_TERMINAL_REPLIES + repeats {
                v.push(format!("reply-once: {id}: status {seq} ({state}) delivered {n} times"));
            }
        }
        for t in tasks.iter().filter(|t| t.reply_to.is_some() && t.process_state.is_terminal()) {
            let id = t.task_id.to_string();
            let Some(last) = t.history.last().map(|h| h.status(&t.task_id)) else { continue };
            if !delivered.get(&(id.clone(), last.seq)).is_some_and(|(state, _)| *state == t.process_state) {
                v.push(format!(
                    "reply-once: {id}: its final status {} (seq {}) never reached the reply queue",
                    t.process_state, last.seq
                ));
            }
        }
    }
}
