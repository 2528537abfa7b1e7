//! What a write owes the world, decided from the task alone, with no event of its own: sent again
//! when the message that made the write comes back (its handler may have died after the write, or
//! its sends failed), when an event changes nothing but still owes a send, or when a spawn finds an
//! element that exists already.

use super::change::map;
use super::change::start::attempt_request;
use super::task::waiting_state;
use super::{Effect, Event, Policy, ProcessState, Stale, Task, Transition};
use crate::ids::Millis;
use crate::messages::{
    AgentRequest, AgentResult, Alert, AlertKind, CancelMessage, Outcome, Phase, RunReason, SchedulerMessage,
    TimerMessage, VERSION,
};

/// What the last write of a task owes the world, derived from the task alone: for the message
/// that made that write, delivered again (its handler may have died after the write, or its sends
/// failed) or handled twice at once (an SQS duplicate whose twin may yet fail its sends). A task
/// that ended owes its terminal notices; a running attempt its dispatch (the same request: same
/// attempt, same key, same deadlines) and its deadline timer; a task waiting for a claim its run
/// message (delayed until it may claim). Replies for states before the last are not repeated:
/// only the terminal status is owed at least once. Agent requests are idempotent per key and
/// fenced per attempt, so a second copy of one applies nothing twice.
pub fn owed_sends(task: &Task, now: Millis, policy: &Policy) -> Vec<Effect> {
    if task.process_state.is_terminal() {
        terminal_notices(task)
    } else {
        owed_work(task, now, policy)
    }
}

/// The sends a task's last write owes, for the message that made it (see [`owed_sends`]), and
/// the task to write first when they copy a running forward attempt: the first copy may have gone
/// out, so the attempt may now run twice, and one copy may apply while the other is refused; the
/// step is marked *may have applied* (a refusal then still compensates it). That write is made
/// once (the mark stays); later copies need none.
pub fn resend(task: &Task, now: Millis, policy: &Policy) -> Transition {
    let effects = owed_sends(task, now, policy);
    let mut t = task.clone();
    let i = t.step_index;
    let copies = effects.iter().any(|e| matches!(e, Effect::Dispatch(_)));
    if copies && t.phase() == Phase::Forward && !t.steps[i].maybe_applied {
        t.rev += 1;
        t.updated_at = now.max(t.updated_at);
        t.steps[i].maybe_applied = true;
    }
    Transition { task: t, effects, keeps_mark: false }
}

/// The work a non-terminal task's last write sent (see [`owed_sends`]).
fn owed_work(task: &Task, now: Millis, policy: &Policy) -> Vec<Effect> {
    let Some(complete_by) = task.complete_by else { return Vec::new() };
    if task.waits_for_slot() || task.claim.paused {
        // its run is the grant's to send, or the resume's
        return Vec::new();
    }
    if map::map_running(task) {
        return map::owed(task);
    }
    match &task.lock.locked_by {
        Some(token) => {
            let def = task.current_def();
            let timer = Effect::ArmTimer(TimerMessage {
                v: VERSION,
                task_id: task.task_id.clone(),
                attempt: Some(token.clone()),
                complete_by,
            });
            if !def.kind.uses_agent() {
                return vec![timer];
            }
            let budget = def.schedule_to_start_ms.unwrap_or(policy.queue_budget_ms);
            let hard = task.lock.hard_by.unwrap_or(complete_by);
            let start_by = Millis(hard.0.saturating_sub(def.timeout_ms));
            vec![
                // a copy sent again is read before it starts (its claim is not this instant)
                Effect::Dispatch(attempt_request(
                    task,
                    token,
                    task.unit_attempts(),
                    (budget > 0).then_some(start_by),
                    None,
                )),
                timer,
            ]
        }
        None if task.process_state == waiting_state(task.phase()) => {
            let due = task.claim.not_before.unwrap_or(now);
            vec![Effect::Run { rev: task.claim.rev, delay_ms: now.until(due), reason: RunReason::Retry }]
        }
        None => Vec::new(),
    }
}

/// What a terminal task owes the world, sent again when the message that ended it comes back
/// (its handler may have died after the write): the caller's last status and, for `Error`, the
/// operator's alert. Both are idempotent for their consumers (`seq`, and the alert's task id).
pub fn terminal_notices(task: &Task) -> Vec<Effect> {
    if !task.process_state.is_terminal() {
        return Vec::new();
    }
    let mut fx = Vec::new();
    if task.reply_to.is_some() {
        if let Some(last) = task.history.last().filter(|h| h.state == task.process_state) {
            fx.push(Effect::Reply(task.status_of(last)));
        }
    }
    if task.process_state == ProcessState::Error {
        fx.push(Effect::Alert(Alert {
            v: VERSION,
            kind: AlertKind::TaskError,
            task_id: task.task_id.clone(),
            workflow: format!("{}@{}", task.workflow.name, task.workflow.version),
            state: task.process_state,
            step: Some(task.current_def().name.clone()),
            failure_count: task.failure_count,
            reason: task.reason.clone().unwrap_or_default(),
            at: task.updated_at,
        }));
    }
    fx.extend(map::ended_notice(task));
    fx.extend(task.slot.as_ref().map(|s| Effect::ReleaseSlot { key: s.key.clone() }));
    fx
}

/// The end a map element owes its parent, once it has ended (none for other tasks).
pub fn element_notice(task: &Task) -> Option<Effect> {
    map::ended_notice(task)
}

/// What a spawn owes an element that exists already (an earlier delivery created it): a
/// stopping map cancels it while it runs; one that has ended says so to its parent again (only
/// that: its alert, if any, went out already); one that runs is sent what its last write owes.
pub fn existing_element(child: &Task, cancel: Option<&str>) -> ExistingElement {
    match cancel {
        Some(why) if !child.process_state.is_terminal() => {
            ExistingElement::Send(vec![Effect::Send(SchedulerMessage::Cancel(CancelMessage {
                v: VERSION,
                task_id: child.task_id.clone(),
                reason: why.to_owned(),
                run: None,
            }))])
        }
        _ if child.process_state.is_terminal() => ExistingElement::Send(element_notice(child).into_iter().collect()),
        _ => ExistingElement::Resend,
    }
}

/// See [`existing_element`].
#[derive(Debug, Clone, PartialEq)]
pub enum ExistingElement {
    /// These sends, and nothing written.
    Send(Vec<Effect>),
    /// What its last write owes ([`resend`]).
    Resend,
}

/// What an event that changes nothing still owes, decided on the task as the event found it:
/// a run message that came before its wait may claim (SQS delays at most 15 minutes) is sent on
/// for the rest of the wait; a parent's command (cancel, undo) to a map element that has ended
/// has the element say its end again (its first notice may be the one the parent is missing).
pub fn stale_sends(task: &Task, event: &Event, stale: &Stale) -> Vec<Effect> {
    match (stale, event) {
        (Stale::TooEarly { not_before, now }, Event::Claim { rev }) => {
            vec![Effect::Run { rev: *rev, delay_ms: now.until(*not_before), reason: RunReason::Retry }]
        }
        (_, Event::Cancel { .. } | Event::Undo { .. }) if task.task_id.is_child() => {
            element_notice(task).into_iter().collect()
        }
        _ => Vec::new(),
    }
}

/// The result an agent request that can never be sent stands for (its input and the earlier
/// steps' outputs exceed the queue's limit): the attempt fails for good at once, instead of
/// timing out again and again.
pub fn undeliverable_request(request: &AgentRequest, bytes: usize, limit: usize) -> SchedulerMessage {
    SchedulerMessage::Result(AgentResult {
        v: VERSION,
        task_id: request.task_id.clone(),
        step: request.step.clone(),
        attempt: request.attempt.clone(),
        outcome: Outcome::Failed {
            error: format!("the agent request is {bytes} bytes; SQS accepts at most {limit}"),
            retryable: false,
        },
    })
}
