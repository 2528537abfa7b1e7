//! `sasctl smoke`: after a deploy, one task through the stack, and what happened to it.
//!
//! It sends a submission of a workflow that needs no remote service (`sim-order` by default) to
//! the stack's submission queue, reads the task until it ends or the time is up, and reports its
//! steps and its history on a time axis relative to the submission. Only the calls an operator's
//! credentials make: `sqs:SendMessage` on the submission queue, `dynamodb:GetItem` on the table
//! (plus `cloudformation:DescribeStacks` with `--stack`).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use sas_core::store::StateStore;
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{Submission, VERSION};
use sas_protocol::protocol::Task;
use serde_json::Value;

/// What `smoke` found.
#[derive(Debug)]
pub struct SmokeReport {
    pub task_id: TaskId,
    /// The workflow it asked for.
    pub workflow: String,
    /// When the submission was sent.
    pub sent_at: Millis,
    /// The task as last read; `None` when it was never created (the Submitter did not run, or
    /// refused the submission: its reason is then in the submission DLQ).
    pub task: Option<Task>,
    /// It was still running when the time was up.
    pub timed_out: bool,
}

impl SmokeReport {
    /// The task ended `Processed`.
    pub fn passed(&self) -> bool {
        self.task.as_ref().is_some_and(|t| t.process_state == sas_protocol::state::ProcessState::Processed)
    }

    /// The report for a person: the verdict, each step, the history on a time axis.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let Some(t) = &self.task else {
            let _ = writeln!(
                out,
                "smoke: FAILED: task {} was never created: the Submitter did not run or refused the submission \
                 (look in the submission DLQ and the Submitter's log group)",
                self.task_id
            );
            let _ = writeln!(
                out,
                "  a refusal's usual cause: the deployed configuration has no workflow {:?}. The shipped one \
                 has sim-order (simulated steps, no service needed); with your own configuration, pass \
                 --workflow NAME --input JSON of a workflow whose steps your stack can run",
                self.workflow
            );
            return out;
        };
        let took = self.sent_at.until(t.updated_at);
        let verdict = if self.passed() {
            format!("ok: {} ended Processed", t.task_id)
        } else if self.timed_out {
            format!("FAILED: {} is still {} (step {}) when the time was up", t.task_id, t.process_state, t.step_index)
        } else {
            format!("FAILED: {} ended {}", t.task_id, t.process_state)
        };
        let _ = writeln!(
            out,
            "smoke: {verdict}, {:.1} s after the submission (workflow {}@{})",
            secs(took),
            t.workflow.name,
            t.workflow.version
        );
        if let Some(reason) = &t.reason {
            let _ = writeln!(out, "  reason: {reason}");
        }
        // The task's steps and attempts on a time axis (relative to its creation), as `sasctl
        // status` shows them; the task as read at the end of the smoke run is "now".
        let created = i128::from(t.created_at.0) - i128::from(self.sent_at.0);
        #[allow(clippy::cast_precision_loss)]
        let created = created as f64 / 1000.0;
        let _ = writeln!(out, "  created {created:+.2} s after the submission; its timeline:");
        let now = t.updated_at.max(self.sent_at);
        out.push_str(&crate::timeline::render(t, now, &crate::timeline::Options::compact(false)));
        out
    }
}

#[allow(clippy::cast_precision_loss)]
fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Send one submission of `workflow` with `input` and read the task every `poll` until it ends or
/// `timeout` passes.
pub async fn run(
    store: &dyn StateStore,
    sqs: &aws_sdk_sqs::Client,
    submission_queue_url: &str,
    workflow: &str,
    input: Value,
    timeout: Duration,
    poll: Duration,
) -> Result<SmokeReport> {
    let task_id = TaskId::try_from(format!("smoke-{}", uuid::Uuid::new_v4().simple()).as_str())?;
    let sub = Submission {
        v: VERSION,
        task_id: Some(task_id.clone()),
        workflow: workflow.to_owned(),
        workflow_version: None,
        input,
        reply_to: None,
        priority: None,
        schedule: None,
    };
    let sent_at = Millis::now();
    crate::ops::send_submission(sqs, submission_queue_url, &sub).await?;
    tracing::info!(%task_id, workflow, "smoke: submitted");
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_state = None;
    loop {
        let task = store.get(&task_id).await?;
        if let Some(t) = &task {
            if last_state != Some((t.process_state, t.step_index)) {
                tracing::info!(state = %t.process_state, step = t.step_index, "smoke: progress");
                last_state = Some((t.process_state, t.step_index));
            }
            if t.process_state.is_terminal() {
                return Ok(SmokeReport { task_id, workflow: workflow.to_owned(), sent_at, task, timed_out: false });
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(SmokeReport { task_id, workflow: workflow.to_owned(), sent_at, task, timed_out: true });
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_core::store::MemoryStore;
    use sas_protocol::protocol::{self, Ctx};
    use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
    use serde_json::json;

    fn submitted(at: Millis) -> Task {
        let all = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).expect("the built-in workflows");
        let wf = all.resolve("sim-order", None).expect("sim-order").clone();
        let tr = protocol::submit(
            TaskId::try_from("smoke-1").unwrap(),
            wf,
            json!({}),
            None,
            &Ctx::at(at),
            &protocol::Policy::default(),
        );
        tr.task
    }

    #[test]
    fn a_task_never_created_fails_and_says_where_to_look() {
        let r = SmokeReport {
            task_id: TaskId::try_from("smoke-1").unwrap(),
            workflow: "mine".into(),
            sent_at: Millis(0),
            task: None,
            timed_out: true,
        };
        assert!(!r.passed());
        let text = r.render();
        assert!(text.contains("FAILED") && text.contains("submission DLQ"), "{text}");
        assert!(text.contains("no workflow \"mine\"") && text.contains("--workflow NAME"), "says what to pass: {text}");
    }

    #[test]
    fn a_running_task_at_the_deadline_fails_with_its_state_and_history_on_the_time_axis() {
        let t = submitted(Millis(10_250));
        let r = SmokeReport {
            task_id: t.task_id.clone(),
            workflow: "sim-order".into(),
            sent_at: Millis(10_000),
            task: Some(t),
            timed_out: true,
        };
        assert!(!r.passed());
        let text = r.render();
        assert!(text.contains("FAILED") && text.contains("still"), "{text}");
        assert!(text.contains("reserve") && text.contains("charge") && text.contains("ship"), "{text}");
        assert!(text.contains("created +0.25 s after the submission"), "{text}");
        assert!(text.contains("attempt 1"), "the timeline's attempts: {text}");
    }

    #[tokio::test]
    async fn a_submission_that_cannot_be_sent_is_an_error_not_a_report() {
        let store = MemoryStore::new(1);
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .credentials_provider(aws_sdk_sqs::config::Credentials::new("a", "b", None, None, "test"))
            .build();
        let sqs = aws_sdk_sqs::Client::from_conf(conf);
        let err = run(
            &store,
            &sqs,
            "http://127.0.0.1:9/000000000000/q",
            "sim-order",
            json!({}),
            Duration::ZERO,
            Duration::ZERO,
        )
        .await
        .expect_err("nothing listens on port 9");
        assert!(format!("{err:#}").to_lowercase().contains("send"), "{err:#}");
    }
}
