//! What the CLI's LocalStack tests share: a stack of their own (functions off), the roles run
//! in-process by the test, and `sasctl` run as an operator would.
#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_protocol::ids::TaskId;
use sas_protocol::messages::{Submission, VERSION};
use sas_protocol::protocol::Task;
use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

/// A child process killed when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Stack {
    pub name: String,
    pub sdk: aws_config::SdkConfig,
    pub deps: Arc<Deps>,
    pub outputs: PathBuf,
    /// The workflows file `sasctl` reads (`SAS_WORKFLOWS_FILE`), when not the built-in ones.
    pub workflows_file: Option<PathBuf>,
}

impl Stack {
    pub async fn deploy() -> Stack {
        Self::deploy_with(None).await
    }

    /// With this workflow added to the built-in ones (for the roles here and for `sasctl`).
    pub async fn deploy_with(extra: Option<serde_json::Value>) -> Stack {
        assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
        let sdk = sas_core::aws::load_sdk_config().await;
        let name = format!("t-cli-ops-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let template = sas_cli::stack::local_template(sas_cli::stack::TEMPLATE);
        let out =
            sas_cli::stack::deploy(&sdk, &name, &template, &[("DeployFunctions", "false"), ("SupervisorShards", "2")])
                .await
                .unwrap_or_else(|e| panic!("deploying {name}: {e}"));
        let outputs = std::env::temp_dir().join(format!("{name}-outputs.json"));
        std::fs::write(&outputs, sas_cli::stack::outputs_json(&out)).expect("write outputs");
        let res = Resources::from_outputs(&out).expect("all outputs present");
        let mut all: serde_json::Value = serde_json::from_str(BUILT_IN_WORKFLOWS).expect("built-in workflows");
        let workflows_file = extra.map(|wf| {
            all["workflows"].as_array_mut().expect("a list").push(wf);
            let path = std::env::temp_dir().join(format!("{name}-workflows.json"));
            std::fs::write(&path, all.to_string()).expect("write workflows");
            path
        });
        let workflows = WorkflowRegistry::from_json(&all.to_string()).expect("valid workflows");
        // Short budgets: a cancelled attempt that hangs holds its compensation until its
        // CompleteBy (start_by + timeout), so keep that within the test's waits.
        let mut settings = Settings::default();
        settings.policy.queue_budget_ms = 2_000;
        settings.policy.result_grace_ms = 500;
        settings.policy.settle_ms = 500;
        let deps = Arc::new(Deps::aws(&sdk, res, workflows, settings));
        Stack { name, sdk, deps, outputs, workflows_file }
    }

    pub async fn submit(&self, id: &str, input: serde_json::Value) {
        self.submit_to("sim-order", id, input).await;
    }

    pub async fn submit_to(&self, workflow: &str, id: &str, input: serde_json::Value) {
        let sub = Submission {
            v: VERSION,
            task_id: Some(TaskId::try_from(id).unwrap()),
            workflow: workflow.into(),
            workflow_version: None,
            input,
            reply_to: None,
            priority: None,
            schedule: None,
        };
        let sqs = aws_sdk_sqs::Client::new(&self.sdk);
        sas_cli::ops::send_submission(&sqs, &self.deps.resources.submission_queue_url, &sub).await.expect("submit");
    }

    pub async fn wait_for(&self, id: &str, what: &str, pred: impl Fn(&Task) -> bool) -> Task {
        self.wait_for_within(id, what, pred, Duration::from_secs(90)).await
    }

    /// [`Stack::wait_for`], for at most `wait`; a task that never gets there is shown with its
    /// steps and history (each entry in ms after its creation), so that a failure says where it
    /// stood.
    pub async fn wait_for_within(&self, id: &str, what: &str, pred: impl Fn(&Task) -> bool, wait: Duration) -> Task {
        let deadline = Instant::now() + wait;
        let id = TaskId::try_from(id).unwrap();
        loop {
            let t = self.deps.store.get(&id).await.expect("GetItem");
            if let Some(t) = t.as_ref().filter(|t| pred(t)) {
                return t.clone();
            }
            if Instant::now() >= deadline {
                let seen = t.map(|t| {
                    let steps: Vec<String> =
                        t.steps.iter().map(|s| format!("{} {:?} attempts {}", s.name, s.status, s.attempts)).collect();
                    let history: Vec<String> = t
                        .history
                        .iter()
                        .map(|h| {
                            format!(
                                "+{} ms {:?} {}",
                                h.at.0.saturating_sub(t.created_at.0),
                                h.state,
                                h.step.as_deref().unwrap_or("")
                            )
                        })
                        .collect();
                    format!("{:?}; steps {}; history {}", t.process_state, steps.join(", "), history.join(", "))
                });
                panic!("{id} never became {what} within {wait:?}: {seen:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Run `sasctl` against this stack, as an operator would (with backtraces asked for).
    pub fn sasctl(&self, args: &[&str]) -> Output {
        self.sasctl_recorded(args, None)
    }

    /// [`Stack::sasctl`], recording every AWS call it makes into `calls` (a directory).
    pub fn sasctl_recorded(&self, args: &[&str], calls: Option<&std::path::Path>) -> Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"));
        match calls {
            Some(dir) => cmd.env(sas_core::aws_calls::CALL_LOG_ENV, dir),
            None => cmd.env_remove(sas_core::aws_calls::CALL_LOG_ENV),
        };
        cmd.arg("--outputs").arg(&self.outputs).args(args).env("RUST_BACKTRACE", "1").env_remove("SAS_STACK");
        match &self.workflows_file {
            Some(f) => cmd.env("SAS_WORKFLOWS_FILE", f),
            None => cmd.env_remove("SAS_WORKFLOWS_FILE"),
        };
        cmd.output().expect("sasctl runs")
    }

    /// `sasctl ui` for this stack on a free port (recording its AWS calls into `calls` when
    /// given): the process, killed when dropped, and its base URL (from the line it prints).
    pub fn console(&self, calls: Option<&std::path::Path>) -> (Killed, String) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"));
        match calls {
            Some(dir) => cmd.env(sas_core::aws_calls::CALL_LOG_ENV, dir),
            None => cmd.env_remove(sas_core::aws_calls::CALL_LOG_ENV),
        };
        cmd.arg("--outputs").arg(&self.outputs).args(["ui", "--listen", "127.0.0.1:0"]).env_remove("SAS_STACK");
        match &self.workflows_file {
            Some(f) => cmd.env("SAS_WORKFLOWS_FILE", f),
            None => cmd.env_remove("SAS_WORKFLOWS_FILE"),
        };
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("sasctl ui starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("sasctl ui prints its URL");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .trim_end_matches('/')
            .to_owned();
        (Killed(child), url)
    }

    pub async fn delete(&self) {
        let _ = std::fs::remove_file(&self.outputs);
        if let Some(f) = &self.workflows_file {
            let _ = std::fs::remove_file(f);
        }
        let _ = sas_cli::stack::delete(&aws_sdk_cloudformation::Client::new(&self.sdk), &self.name).await;
    }
}
