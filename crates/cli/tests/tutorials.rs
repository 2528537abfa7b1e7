//! The book's tutorials run as written: every block marked `<!-- ci: run -->` of a page, through
//! `docs/run-tutorial.py`, with `sasctl` on the PATH and a stack of this test's own (the roles
//! run in-process, as `make up`'s local runner does). A command that fails, or a task that ends
//! otherwise than the page says (`sasctl submit --wait`'s exit status), fails the test.
//!
//! Needs `AWS_ENDPOINT_URL` (LocalStack: `source infra/env.sh`) and python3.

use std::sync::Arc;
use std::time::Duration;

mod common;

use common::Stack;
use sas_core::agent::AgentRuntime;
use sas_core::runner::{Runner, RunnerOptions};
use sas_protocol::ids::TaskId;
use sas_protocol::protocol::ProcessState;

/// Run PAGE's marked blocks against stack `s`; its output, or a panic with it.
fn run_page(s: &Stack, page: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_sasctl")).parent().expect("the binary's directory").to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let work = std::env::temp_dir().join(format!("{}-tutorial", s.name));
    std::fs::create_dir_all(&work).expect("a working directory");
    let out = std::process::Command::new("python3")
        .arg(root.join("docs/run-tutorial.py"))
        .arg(root.join(page))
        .current_dir(&work)
        .env("PATH", path)
        .env("SAS_OUTPUTS", &s.outputs)
        .env_remove("SAS_STACK")
        .env_remove("SAS_WORKFLOWS_FILE")
        .output()
        .expect("python3 runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&work);
    assert!(out.status.success(), "{page}'s blocks failed:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guards_data_failures_and_children_tutorial_runs_as_written() {
    let s = Stack::deploy().await;
    let opts =
        RunnerOptions { sweep_every: Duration::from_secs(1), wait: Duration::from_secs(1), ..Default::default() };
    let runner = Runner::new(s.deps.clone(), Arc::new(AgentRuntime::with_builtins()), opts).spawn();
    let out = run_page(&s, "docs/tutorials/guards-data-failures-children.md");
    // what the page says each task did
    let ended = |id: &str| format!("{id}: ended ");
    for (id, state) in [
        ("decide-small", "Processed"),
        ("decide-large", "Processed"),
        ("shaped", "Processed"),
        ("no-paper", "Processed"),
        ("declined", "Compensated"),
        ("child-ok", "Processed"),
        ("child-declined", "Compensated"),
    ] {
        assert!(out.contains(&format!("{}{state} after ", ended(id))), "{id} ended {state}:\n{out}");
    }
    assert!(out.contains("skipped, when was false"), "decide-small's approve was skipped:\n{out}");
    let child = s.deps.store.get(&TaskId::try_from("child-declined~1~0").unwrap()).await.unwrap().expect("the child");
    assert_eq!(child.process_state, ProcessState::Compensated, "the declined order's shipment is undone");
    runner.shutdown().await;
    s.delete().await;
}
