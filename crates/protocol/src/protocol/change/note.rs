//! Notes: each state change recorded in the task's history and, when the caller named a reply
//! queue, told to it (one status per change, numbered without gaps); an operator's alert.

use super::Change;
use crate::messages::{Alert, AlertKind, VERSION};
use crate::protocol::task::HistoryEntry;
use crate::protocol::{Effect, ProcessState};

impl Change<'_> {
    /// Record a state change in the history and, when the caller named a reply queue, tell it.
    pub(crate) fn note(&mut self, state: ProcessState) {
        self.note_entry(state, false);
    }

    /// [`Self::note`] for an entry that begins a wait for a claim ([`HistoryEntry::waiting`]).
    pub(crate) fn note_wait(&mut self, state: ProcessState) {
        self.note_entry(state, true);
    }

    fn note_entry(&mut self, state: ProcessState, waiting: bool) {
        let t = &mut self.t;
        t.process_state = state;
        t.status_seq += 1;
        let entry = HistoryEntry {
            seq: t.status_seq,
            state,
            step: if state.is_terminal() { None } else { Some(t.current_def().name.clone()) },
            failure_count: t.failure_count,
            reason: if state == ProcessState::Processed { None } else { t.reason.clone() },
            at: self.ctx.now,
            waiting,
        };
        if t.reply_to.is_some() {
            self.fx.push(Effect::Reply(t.status_of(&entry)));
        }
        t.history.push(entry);
        if t.history.len() > self.policy.history_limit {
            let extra = t.history.len() - self.policy.history_limit;
            t.history.drain(..extra);
        }
    }

    pub(crate) fn alert(&self, kind: AlertKind, reason: &str) -> Alert {
        let t = &self.t;
        Alert {
            v: VERSION,
            kind,
            task_id: t.task_id.clone(),
            workflow: format!("{}@{}", t.workflow.name, t.workflow.version),
            state: t.process_state,
            step: Some(t.current_def().name.clone()),
            failure_count: t.failure_count,
            reason: reason.to_owned(),
            at: self.ctx.now,
        }
    }
}
