//! Operator actions, shared by the `sasctl` binary and the tests: each sends the message the
//! Scheduler acts on (it decides, with a conditional write, whether the action still applies).

use aws_sdk_sqs::Client;
use sas_core::bus::{encode, Outgoing};
use sas_core::deps::Deps;
use sas_core::ids::TaskId;
use sas_core::messages::{CancelMessage, ResubmitMessage, SchedulerMessage, Submission, VERSION};
use sas_core::protocol::ProcessState;

pub async fn send_submission(sqs: &Client, queue: &str, sub: &Submission) -> anyhow::Result<()> {
    sqs.send_message()
        .queue_url(queue)
        .message_body(serde_json::to_string(sub)?)
        .send()
        .await
        .map_err(aws_sdk_sqs::Error::from)?;
    Ok(())
}

/// Stop a task: its completed steps are compensated and it ends `Cancelled`.
pub async fn cancel(deps: &Deps, task_id: &TaskId, reason: &str) -> anyhow::Result<()> {
    let msg =
        SchedulerMessage::Cancel(CancelMessage { v: VERSION, task_id: task_id.clone(), reason: reason.to_owned() });
    deps.outbox().to_scheduler(&msg, 0).await?;
    Ok(())
}

/// Resubmit `Error` tasks: each resumes from its failed step. Sent in batches of ten.
pub async fn resubmit(deps: &Deps, task_ids: &[TaskId], reason: &str) -> anyhow::Result<()> {
    let msgs = task_ids
        .iter()
        .map(|t| {
            let msg = SchedulerMessage::Resubmit(ResubmitMessage {
                v: VERSION,
                task_id: t.clone(),
                reason: reason.to_owned(),
                run: None,
            });
            encode(&msg).map(Outgoing::new)
        })
        .collect::<Result<Vec<_>, _>>()?;
    deps.outbox().to_scheduler_batch(msgs).await?;
    Ok(())
}

/// Resubmit every task in `Error` (as the operators' index lists them, up to `max`); returns their ids.
pub async fn resubmit_all_in_error(deps: &Deps, reason: &str, max: usize) -> anyhow::Result<Vec<TaskId>> {
    let ids: Vec<TaskId> =
        deps.store.list_by_state(ProcessState::Error, max).await?.into_iter().map(|r| r.task_id).collect();
    resubmit(deps, &ids, reason).await?;
    Ok(ids)
}
