//! The five roles by name, and the dispatch every host uses: the Lambda binaries, the local
//! runner and the tests hand a queue's records to [`handle`] through [`process_batch`].

use futures::future::BoxFuture;
use tracing::{error, info_span, warn, Instrument};

use crate::agent::{self, AgentRuntime};
use crate::bus::Outgoing;
pub use crate::bus::Record;
use crate::deps::{Deps, HandlerError};
pub use crate::envelope::Role;
use crate::envelope::{Body, Envelope};
use crate::ids::{clip, TaskId};
use crate::screen;
use crate::{callback, scheduler, submitter, supervisor};

/// Call the handler a role's queue feeds, for one message.
pub fn handle<'a>(
    role: Role,
    deps: &'a Deps,
    agents: &'a AgentRuntime,
    record: &'a Record,
) -> BoxFuture<'a, Result<(), HandlerError>> {
    handle_envelope(deps, agents, Envelope::open(role, record))
}

/// [`handle`] for a record read once ([`Envelope::open`]).
pub fn handle_envelope<'a>(
    deps: &'a Deps,
    agents: &'a AgentRuntime,
    envelope: Envelope<'a>,
) -> BoxFuture<'a, Result<(), HandlerError>> {
    let (role, record) = (envelope.role, envelope.record);
    let body = record.body.as_str();
    let span = envelope.span();
    let message = Some(record.message_id.as_str());
    let handling = async move {
        let handled = match envelope.body {
            Body::Submission(parsed) => submitter::submit_parsed(deps, record, parsed).await.map(drop),
            Body::Scheduler(s) => match s {
                Ok(s) => scheduler::handle_scheduled(deps, s, message).await.map(drop),
                Err(why) => Err(HandlerError::Malformed(why)),
            },
            Body::Agent(req) => match req {
                Ok(req) => agent::handle_request(deps, agents, req, record.sent_at).await.map(drop),
                Err(why) => Err(HandlerError::Malformed(why)),
            },
            Body::Timer(timer) => match timer {
                Ok(t) => supervisor::handle_timer(deps, t, message).await.map(drop),
                Err(why) => Err(HandlerError::Malformed(why)),
            },
            // An answer that changed nothing (stale, late, unknown) is still handled: delivering
            // it again would not change that. `callback::answer` logs what it did (the sender is
            // not there to hear it).
            Body::Callback(answer) => match answer {
                Ok(msg) => callback::answer(deps, &msg, message).await.map(drop),
                Err(why) => Err(HandlerError::Malformed(why)),
            },
        };
        match (handled, role.dead_letter_queue(&deps.resources)) {
            // A message that can never be handled is kept in its DLQ with the reason at once,
            // instead of failing maxReceiveCount times first.
            (Err(e @ (HandlerError::Malformed(_) | HandlerError::Unstorable(_))), Some(dlq)) => {
                let reason = e.to_string();
                if matches!(e, HandlerError::Malformed(_)) {
                    warn!(role = role.name(), %reason, "malformed message moved to its DLQ");
                } else {
                    warn!(role = role.name(), %reason, "a message whose task cannot be stored moved to its DLQ");
                }
                let msg = Outgoing {
                    body: if body.is_empty() { "<empty>".to_owned() } else { body.to_owned() },
                    attributes: vec![
                        ("RejectReason".into(), screen::attribute_safe(clip(&reason, 1024))),
                        ("RejectedAt".into(), deps.now().to_string()),
                    ],
                    ..Outgoing::default()
                };
                deps.bus.send(dlq, msg).await.map_err(HandlerError::from)
            }
            (other, _) => other,
        }
    };
    Box::pin(crate::trace::scope(record.trace_header.clone(), handling.instrument(span)))
}

/// Handle a batch the way an SQS-triggered Lambda with `ReportBatchItemFailures` does: the ids of
/// the records that failed are returned, so only those are delivered again. Each record is read
/// once ([`Envelope::open`]). Records run concurrently, except those naming the same task, which
/// run one after the other in the batch's order: they would only race for the task's item, and
/// each lost conditional write costs a write unit and a re-decision (the ends of a map's elements
/// arrive together, each a write on their parent). `handler` gets each task's records together
/// (see [`handle_group`]) and returns one outcome per record. Not the Agent's: its records are
/// remote calls of up to 110 s each, and two of one task in a row could outlast the function's
/// timeout.
pub async fn process_batch<'a, F, Fut>(role: Role, records: &'a [Record], handler: F) -> Vec<String>
where
    F: Fn(Vec<Envelope<'a>>) -> Fut,
    Fut: std::future::Future<Output = Vec<Result<(), HandlerError>>>,
{
    let mut groups: Vec<(Option<String>, Vec<Envelope<'a>>)> = Vec::new();
    for r in records {
        let envelope = Envelope::open(role, r);
        let task = envelope.task_id().filter(|_| role != Role::Agent).map(str::to_owned);
        match groups.iter_mut().find(|(t, _)| task.is_some() && *t == task) {
            Some((_, rs)) => rs.push(envelope),
            None => groups.push((task, vec![envelope])),
        }
    }
    let handler = &handler;
    let runs = groups.into_iter().map(|(_, rs)| async move {
        let ids: Vec<&str> = rs.iter().map(|e| e.record.message_id.as_str()).collect();
        let outcomes = handler(rs).await;
        let mut failed = Vec::new();
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            if let Err(e) = outcome {
                info_span!("record", message_id = %id)
                    .in_scope(|| error!(error = %e, "record failed; SQS will deliver it again"));
                failed.push(id.to_owned());
            }
        }
        failed
    });
    futures::future::join_all(runs).await.into_iter().flatten().collect()
}

/// Read each record once ([`Envelope::open`]), for [`handle_group`].
pub fn open_all(role: Role, records: &[Record]) -> Vec<Envelope<'_>> {
    records.iter().map(|r| Envelope::open(role, r)).collect()
}

/// Handle the records of one task from one batch ([`process_batch`]'s groups), in order: each on
/// its own ([`handle_envelope`]), except a run of two or more ends of elements (or branches) of
/// one parent for the Scheduler, which are applied together and written once
/// ([`scheduler::handle_ends`]): one conditional write on the parent instead of one each, each a
/// race with the other invocations' writers. The run's outcome is each of its records'. One
/// outcome per record.
pub fn handle_group<'a>(
    deps: &'a Deps,
    agents: &'a AgentRuntime,
    records: Vec<Envelope<'a>>,
) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
    Box::pin(async move {
        let mut out = Vec::with_capacity(records.len());
        let mut rest = records.into_iter().peekable();
        while let Some(first) = rest.next() {
            let mut run = vec![first];
            if let Some(parent) = run[0].ended_parent().cloned() {
                while let Some(next) = rest.next_if(|e| e.ended_parent() == Some(&parent)) {
                    run.push(next);
                }
            }
            if run.len() < 2 {
                for e in run {
                    out.push(handle_envelope(deps, agents, e).await);
                }
                continue;
            }
            let role = run[0].role;
            let parent = run[0].ended_parent().map_or("-", TaskId::as_str).to_owned();
            let span = info_span!("records", role = role.name(), task_id = parent, ends = run.len());
            match scheduler::handle_ends(deps, &run).instrument(span.clone()).await {
                Ok(()) => out.extend(run.iter().map(|_| Ok(()))),
                // A message the task cannot take: one by one, so that it goes to the DLQ alone.
                Err(e @ (HandlerError::Malformed(_) | HandlerError::Unstorable(_))) => {
                    span.in_scope(|| warn!(error = %e, "ends handled together refused; handling them one by one"));
                    for e in run {
                        out.push(handle_envelope(deps, agents, e).await);
                    }
                }
                // Anything else fails the run's records alike: SQS delivers them again, and
                // the one whose mark a landed write kept resends what it owes.
                Err(e) => {
                    let why = e.to_string();
                    let others = run.len() - 1;
                    out.push(Err(e));
                    out.extend((0..others).map(|_| Err(HandlerError::WithRun(why.clone()))));
                }
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn record(id: &str, body: &str) -> Record {
        Record { message_id: id.to_owned(), body: body.to_owned(), receive_count: 1, sent_at: None, trace_header: None }
    }

    #[tokio::test]
    async fn records_of_one_task_run_in_order_and_others_beside_them() {
        // deadline timers: the records are grouped by the task their message names, once read
        let timer = |task: &str, n: u64| format!(r#"{{"v":1,"task_id":"{task}","complete_by":{n}}}"#);
        let records = vec![
            record("a1", &timer("a", 1)),
            record("b1", &timer("b", 1)),
            record("a2", &timer("a", 2)),
            record("x", "not json"),
            record("a3", &timer("a", 3)),
            record("y", "not json either"),
        ];
        let now = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let per_task: Mutex<HashMap<String, usize>> = Mutex::default();
        let order = Mutex::new(Vec::new());
        let each = |r: &Record| {
            let (now, most, per_task, order) = (&now, &most, &per_task, &order);
            let r = r.clone();
            async move {
                let task = serde_json::from_str::<serde_json::Value>(&r.body)
                    .ok()
                    .and_then(|v| v["task_id"].as_str().map(str::to_owned));
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                if let Some(t) = &task {
                    let mut m = per_task.lock().unwrap();
                    let n = m.entry(t.clone()).or_default();
                    *n += 1;
                    assert_eq!(*n, 1, "two records of task {t} at once");
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                if let Some(t) = &task {
                    *per_task.lock().unwrap().get_mut(t).unwrap() -= 1;
                }
                order.lock().unwrap().push(r.message_id.clone());
                now.fetch_sub(1, Ordering::SeqCst);
                if r.message_id == "a2" {
                    Err(HandlerError::Malformed("refused".into()))
                } else {
                    Ok(())
                }
            }
        };
        let failed = process_batch(Role::Supervisor, &records, |rs| async {
            let mut out = Vec::new();
            for r in rs {
                out.push(each(r.record).await);
            }
            out
        })
        .await;
        assert_eq!(failed, vec!["a2".to_owned()], "a failed record is reported, and the ones after it still run");
        let order = order.into_inner().unwrap();
        let pos = |id: &str| order.iter().position(|o| o == id).unwrap();
        assert!(pos("a1") < pos("a2") && pos("a2") < pos("a3"), "{order:?}");
        assert_eq!(order.len(), 6);
        // a, b and each record without a task ran beside each other
        assert_eq!(most.into_inner(), 4);

        // the Agent's records all run at once
        let most = AtomicUsize::new(0);
        let now = AtomicUsize::new(0);
        let failed = process_batch(Role::Agent, &records, |rs| {
            let (now, most) = (&now, &most);
            async move {
                assert_eq!(rs.len(), 1, "the Agent's records are not grouped");
                most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                vec![Ok::<_, HandlerError>(())]
            }
        })
        .await;
        assert!(failed.is_empty());
        assert_eq!(most.into_inner(), 6);
    }
}
