//! Operator actions, shared by the `sasctl` binary and the tests: each sends the message the
//! Scheduler acts on (it decides, with a conditional write, whether the action still applies).

use aws_sdk_sqs::Client;
use sas_core::bus::{Bus, Outgoing};
use sas_core::ids::TaskId;
use sas_core::messages::{CancelMessage, ResubmitMessage, SchedulerMessage, Submission, VERSION};
use sas_core::protocol::ProcessState;
use sas_core::roles::Deps;

pub async fn send_submission(sqs: &Client, queue: &str, sub: &Submission) -> anyhow::Result<()> {
    sqs.send_message()
        .queue_url(queue)
        .message_body(serde_json::to_string(sub)?)
        .send()
        .await
        .map_err(aws_sdk_sqs::Error::from)?;
    Ok(())
}

fn to_scheduler(msg: &SchedulerMessage) -> Outgoing {
    Outgoing { body: serde_json::to_string(msg).expect("messages serialise"), delay_seconds: 0 }
}

/// Stop a task: its completed steps are compensated and it ends `Cancelled`.
pub async fn cancel(bus: &Bus, task_id: &TaskId, reason: &str) -> anyhow::Result<()> {
    let msg =
        SchedulerMessage::Cancel(CancelMessage { v: VERSION, task_id: task_id.clone(), reason: reason.to_owned() });
    bus.send_batch(&bus.resources().scheduler_queue_url, vec![to_scheduler(&msg)]).await?;
    Ok(())
}

/// Resubmit `Error` tasks: each resumes from its failed step. Sent in batches of ten.
pub async fn resubmit(bus: &Bus, task_ids: &[TaskId], reason: &str) -> anyhow::Result<()> {
    let msgs = task_ids
        .iter()
        .map(|t| {
            to_scheduler(&SchedulerMessage::Resubmit(ResubmitMessage {
                v: VERSION,
                task_id: t.clone(),
                reason: reason.to_owned(),
            }))
        })
        .collect();
    bus.send_batch(&bus.resources().scheduler_queue_url, msgs).await?;
    Ok(())
}

/// Resubmit every task in `Error` (as the operators' index lists them, up to `max`); returns their ids.
pub async fn resubmit_all_in_error(deps: &Deps, reason: &str, max: usize) -> anyhow::Result<Vec<TaskId>> {
    let ids: Vec<TaskId> =
        deps.store.list_by_state(ProcessState::Error, max).await?.into_iter().map(|r| r.task_id).collect();
    resubmit(&deps.bus, &ids, reason).await?;
    Ok(ids)
}
