//! Upgrades and rollbacks with tasks in flight (docs/how-to/change-workflows.md, "Upgrade the
//! stack, and roll back"). A stack is deployed with the previous release's five functions (built
//! from the commit `infra/previous-release` names, by `infra/previous-release.sh`, into
//! `SAS_PREVIOUS_FUNCTIONS`; `make test-lambda` does both) and `GradualDeploy=true`: its event
//! sources, sweep rule and Callback URL invoke each function's alias `live`. Tasks of every step
//! kind are started, and the functions are moved to this build one at a time while they run, the
//! way a deploy moves them: the new code published as a version and the alias pointed at it, a
//! task of them all submitted after each, a few seconds of the mix (old Agents answering a new
//! Scheduler, and so on) before the next. Then back to the previous versions, one at a time in the
//! reverse order, as CodeDeploy's rollback does (the alias pointed at the version it had), while
//! the tasks started on the new build run on. Every task ends as it would have: `Processed`, each
//! step succeeded (or skipped by its guard) with its stable idempotency key, nothing undone, and
//! no message dead-lettered (both releases write messages and items of format 1: nothing either
//! refuses).
//!
//! LocalStack has no CodeDeploy (it skips the deployment groups GradualDeploy=true declares), so
//! the test moves the alias itself, with the calls a deploy makes (UpdateFunctionCode,
//! PublishVersion, UpdateAlias). It cannot weight the alias between two versions (LocalStack
//! 4.13's UpdateAlias fails on a routing configuration), so a function's two versions overlap only
//! while the invocations that started before the move finish. Attempts may be more than one (the
//! promise is at-least-once with a stable key), and the bound on the end covers the longest
//! visibility timeout (the Supervisor's, 6 minutes) should a function's environment stop with a
//! record in flight.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aws_sdk_lambda::types::LastUpdateStatus;
use sas_protocol::ids::CallbackToken;
use sas_protocol::protocol::{ProcessState, StepStatus, Task};
use sas_protocol::workflow::StepKind;
use serde_json::{json, Value};

use super::{answer, config_dir, functions_dir, lambda_stack_from, Fns};

/// The previous release's bootstraps.
fn previous_dir() -> PathBuf {
    let dir = std::env::var("SAS_PREVIOUS_FUNCTIONS").unwrap_or_else(|_| {
        panic!(
            "SAS_PREVIOUS_FUNCTIONS is not set: the folder with the previous release's bootstraps \
             (`infra/previous-release.sh` builds them and prints it; `make test-lambda` sets it)"
        )
    });
    PathBuf::from(dir)
}

/// How long each mix of the two releases runs before the next function moves.
const MIXED: Duration = Duration::from_secs(3);

/// The alias the stack's invokers name (template.yaml, `AutoPublishAlias`).
const ALIAS: &str = sas_cli::lambda::ALIAS;

/// The functions in the order they are upgraded (rolled back in the reverse order).
const ORDER: [&str; 5] =
    ["SubmitterFunction", "SchedulerFunction", "AgentFunction", "SupervisorFunction", "CallbackFunction"];

/// One workflow per step kind, and one with them all in a row: calls with a compensation, a
/// wait, a callback, a map, a child workflow, guards on a variable, a loop. Only what the
/// previous release knows.
fn workflows() -> Vec<Value> {
    let call = |name: &str| {
        json!({"name": name, "agent": "sim", "timeout_ms": 20_000, "max_attempts": 5,
               "schedule_to_start_ms": 60_000, "backoff": {"base_ms": 200, "max_ms": 1_000}})
    };
    let mut reserve = call("reserve");
    reserve["compensation"] = call("release");
    let wait = json!({"name": "cool", "kind": "wait", "wait_ms": 15_000});
    let callback =
        json!({"name": "ship", "kind": "callback", "agent": "sim", "timeout_ms": 900_000, "max_attempts": 1});
    let mut map = call("pick");
    map["map"] = json!({"items": "/input/lines", "max_concurrency": 2});
    let child = json!({"name": "sub", "kind": "workflow", "workflow": "u-calls", "version": 1});
    let mut list = call("list");
    list["assign"] = json!({"listed": true});
    let mut tag = call("tag");
    tag["when"] = json!({"variable": "$.vars.listed", "boolean_equals": true});
    let mut skip = call("skip");
    skip["when"] = json!({"variable": "$.vars.listed", "boolean_equals": false});
    let looped = json!({"name": "pages", "kind": "loop", "max_iterations": 10, "wait_ms": 2_000,
                        "body": [call("page")],
                        "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 2}});
    let wf = |name: &str, steps: Vec<Value>| json!({"name": name, "version": 1, "steps": steps});
    vec![
        wf("u-calls", vec![reserve.clone(), call("charge")]),
        wf("u-wait", vec![wait.clone(), call("after")]),
        wf("u-callback", vec![call("open"), callback.clone(), call("confirm")]),
        wf("u-map", vec![map.clone(), call("pack")]),
        wf("u-child", vec![call("open"), child.clone(), call("close")]),
        wf("u-guard", vec![list.clone(), tag.clone(), skip.clone()]),
        wf("u-loop", vec![looped.clone()]),
        wf("u-all", vec![reserve, wait, callback, map, child, list, tag, skip, looped]),
    ]
}

/// The workflows tasks are submitted to (`u-calls` also runs as every `sub` step's child).
const SUBMITTED: [&str; 8] = ["u-calls", "u-wait", "u-callback", "u-map", "u-child", "u-guard", "u-loop", "u-all"];

/// Where each workflow's callback step is, if it has one.
fn callback_step(workflow: &str) -> Option<usize> {
    match workflow {
        "u-callback" => Some(1),
        "u-all" => Some(2),
        _ => None,
    }
}

/// What the test keeps of the tasks it started.
#[derive(Default)]
struct Run {
    /// Task id -> workflow.
    tasks: BTreeMap<String, &'static str>,
    /// Tasks whose callback step is not answered yet.
    unanswered: BTreeMap<String, usize>,
}

impl Run {
    /// A task of each workflow of `workflows`, as `{batch}-{workflow}`.
    async fn submit_batch(&mut self, f: &Fns, batch: &str, workflows: &[&'static str]) {
        for &wf in workflows {
            let id = format!("{batch}-{wf}");
            let body = json!({"v": 1, "task_id": id, "workflow": wf, "input": {"lines": [1, 2, 3]}});
            f.s.send(&f.s.res.submission_queue_url, &body.to_string()).await;
            if let Some(step) = callback_step(wf) {
                self.unanswered.insert(id.clone(), step);
            }
            self.tasks.insert(id, wf);
        }
    }

    /// Answer every callback step that runs now; with `wait`, wait (bounded) for each to run.
    async fn answer_ready(&mut self, f: &Fns, wait: Option<Duration>) {
        let deadline = wait.map(|w| Instant::now() + w);
        let callbacks = f.s.res.callback_queue_url.clone().expect("a callback queue");
        loop {
            let mut left = BTreeMap::new();
            for (id, step) in std::mem::take(&mut self.unanswered) {
                let t = f.s.task(&id).await;
                let running = t.as_ref().filter(|t| {
                    t.step_index == step && t.steps[step].status == StepStatus::Running && t.lock.locked_by.is_some()
                });
                match running {
                    Some(t) => {
                        let token = CallbackToken::new(
                            &t.task_id,
                            &t.workflow.steps[step].name,
                            t.lock.locked_by.as_ref().expect("an attempt"),
                        );
                        let body = answer(&token, "succeeded", json!({"output": {"shipped": id}}));
                        f.s.send(&callbacks, &body.to_string()).await;
                    }
                    None => {
                        left.insert(id, step);
                    }
                }
            }
            self.unanswered = left;
            match deadline {
                Some(d) if !self.unanswered.is_empty() => {
                    assert!(
                        Instant::now() < d,
                        "callback steps never ran: {:?}",
                        self.unanswered.keys().collect::<Vec<_>>()
                    );
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                _ => return,
            }
        }
    }

    /// Every task ends `Processed` as it would have; the tasks, by id.
    async fn check_all_processed(&mut self, f: &Fns, phase: &str) {
        self.answer_ready(f, Some(Duration::from_mins(10))).await;
        let give_up = Instant::now() + Duration::from_mins(12);
        for (id, wf) in &self.tasks {
            let left = give_up.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            let t = f.s.wait_for(id, left, |t| t.process_state.is_terminal()).await;
            check_task(&t, wf, phase);
        }
    }
}

/// A task that ended as it would have without the deploy.
fn check_task(t: &Task, workflow: &str, phase: &str) {
    let id = &t.task_id;
    assert_eq!(
        t.process_state,
        ProcessState::Processed,
        "{phase}: {id} ({workflow}): {:?}\n{:#?}",
        t.reason,
        t.history
    );
    let ended = t.history.iter().filter(|h| h.state == ProcessState::Processed).count();
    assert_eq!(ended, 1, "{phase}: {id} ended once: {:#?}", t.history);
    assert!(
        t.history.iter().all(|h| h.state != ProcessState::Compensating),
        "{phase}: {id}: nothing undone: {:#?}",
        t.history
    );
    for (def, step) in t.workflow.steps.iter().zip(&t.steps) {
        let want = if def.name == "skip" { StepStatus::Skipped } else { StepStatus::Succeeded };
        assert_eq!(step.status, want, "{phase}: {id}: step {}: {step:?}", def.name);
        // a call of the sim agent says the key it was called with: the task's and the step's,
        // whichever release sent it and however many attempts it took
        let out = step.output.as_ref();
        let call = matches!(def.kind, StepKind::Call { .. }) && def.map.is_none();
        if let Some(key) = out.and_then(|o| o.get("idempotency_key")).filter(|_| call) {
            assert_eq!(key, &json!(format!("{id}:{}", def.name)), "{phase}: {id}: step {}", def.name);
        }
    }
    if workflow == "u-guard" || workflow == "u-all" {
        assert_eq!(t.vars.get("listed"), Some(&json!(true)), "{phase}: {id}: the variable survived");
    }
}

/// Publish the zip at `key` of the code bucket as a new version of one function (its `$LATEST`
/// updated, then published, as CloudFormation does with `AutoPublishAlias`). The version.
async fn publish(f: &Fns, id: &str, key: &str) -> String {
    let name = f.name(id).to_owned();
    let started = Instant::now();
    f.lambda
        .update_function_code()
        .function_name(&name)
        .s3_bucket(sas_cli::lambda::CODE_BUCKET)
        .s3_key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("UpdateFunctionCode {name}: {}", aws_sdk_lambda::Error::from(e)));
    loop {
        let c =
            f.lambda.get_function_configuration().function_name(&name).send().await.expect("GetFunctionConfiguration");
        match c.last_update_status() {
            Some(LastUpdateStatus::Successful) => break,
            Some(LastUpdateStatus::Failed) => panic!("{id}: the update failed: {:?}", c.last_update_status_reason()),
            _ => {}
        }
        assert!(started.elapsed() < Duration::from_mins(3), "{id}: not updated after 3 minutes");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let v = f
        .lambda
        .publish_version()
        .function_name(&name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("PublishVersion {name}: {}", aws_sdk_lambda::Error::from(e)));
    let version = v.version().expect("a version").to_owned();
    eprintln!("[{}] {id}: {key} published as version {version} in {:.1} s", f.s.name, started.elapsed().as_secs_f64());
    version
}

/// Point one function's alias at `version`.
async fn point(f: &Fns, id: &str, version: &str) {
    let name = f.name(id);
    f.lambda
        .update_alias()
        .function_name(name)
        .name(ALIAS)
        .function_version(version)
        .send()
        .await
        .unwrap_or_else(|e| panic!("UpdateAlias {name}:{ALIAS}: {}", aws_sdk_lambda::Error::from(e)));
}

/// The version one function's alias points at, and the hash of that version's code.
async fn live(f: &Fns, id: &str) -> (String, String) {
    let name = f.name(id);
    let a = f.lambda.get_alias().function_name(name).name(ALIAS).send().await.expect("GetAlias");
    let version = a.function_version().expect("a version").to_owned();
    let c = f
        .lambda
        .get_function_configuration()
        .function_name(name)
        .qualifier(&version)
        .send()
        .await
        .expect("GetFunctionConfiguration");
    (version, c.code_sha256().unwrap_or_default().to_owned())
}

/// Each function's zip in the code bucket, by logical ID: the bootstraps of `dir`, uploaded.
async fn code_keys(f: &Fns, dir: &std::path::Path) -> BTreeMap<String, String> {
    let packages = sas_cli::lambda::package(dir, sas_cli::stack::TEMPLATE).await.expect("zipping the bootstraps");
    let objects: Vec<(&str, &str, &[u8])> =
        packages.iter().map(|p| (p.function.logical_id.as_str(), p.key.as_str(), p.zip.as_slice())).collect();
    sas_cli::lambda::upload(&sas_cli::stack::s3_client(&f.s.sdk), &objects).await.expect("uploading the zips");
    packages.into_iter().map(|p| (p.function.logical_id, p.key)).collect()
}

/// Every dead-letter queue of the stack is empty.
async fn no_dead_letters(f: &Fns, phase: &str) {
    let r = &f.s.res;
    let dlqs = [
        Some(&r.submission_dlq_url),
        r.scheduler_dlq_url.as_ref(),
        r.agent_dlq_url.as_ref(),
        r.supervisor_dlq_url.as_ref(),
        r.callback_dlq_url.as_ref(),
    ];
    for q in dlqs.into_iter().flatten() {
        assert_eq!(f.s.depth(q).await, 0, "{phase}: messages in {q}");
    }
}

/// How one function moves to its target version in a phase.
enum Move<'a> {
    /// Publish the zip at this key of the code bucket and point the alias at it.
    Publish(&'a str),
    /// Point the alias back at this version (CodeDeploy's rollback).
    Back(&'a str),
}

/// One phase (`up`: the upgrade, `down`: the rollback): a task of each workflow started, then
/// the functions moved in `order`, one at a time, one task of them all in a row started after
/// each, the callbacks answered from the third function on (their steps wait across the first
/// two), a few seconds of the mix before the next; then every task ends as it would have and no
/// message is dead-lettered. Each function's live version and its code hash after the phase.
async fn phase(
    f: &Fns,
    name: &str,
    order: &[&str],
    moves: &BTreeMap<&str, Move<'_>>,
) -> BTreeMap<String, (String, String)> {
    let mut run = Run::default();
    run.submit_batch(f, &format!("{name}0"), &SUBMITTED).await;
    for (k, id) in order.iter().enumerate() {
        let (from, _) = live(f, id).await;
        let to = match moves[id] {
            Move::Publish(key) => publish(f, id, key).await,
            Move::Back(version) => version.to_owned(),
        };
        assert_ne!(from, to, "{name}: {id} moves to another version");
        point(f, id, &to).await;
        eprintln!("[{}] {name}: {id} on version {to} (was {from})", f.s.name);
        run.submit_batch(f, &format!("{name}{}", k + 1), &["u-all"]).await;
        if k >= 2 {
            run.answer_ready(f, None).await;
        }
        tokio::time::sleep(MIXED).await;
    }
    run.check_all_processed(f, name).await;
    no_dead_letters(f, name).await;
    let mut out = BTreeMap::new();
    for id in order {
        out.insert((*id).to_owned(), live(f, id).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_an_upgrade_and_a_rollback_one_function_at_a_time_lose_nothing_with_tasks_of_every_kind_in_flight() {
    let previous = previous_dir();
    let config = config_dir("upgrade", &workflows());
    let f = lambda_stack_from("upgrade", &previous, &config, &[("GradualDeploy", "true")]).await;
    assert_eq!(
        f.s.outputs.get("InvokedQualifier").map(String::as_str),
        Some(ALIAS),
        "with GradualDeploy=true the stack's invokers name the alias"
    );
    // the event sources, the sweep rule's permission and the Callback URL are the alias's
    let checks = sas_cli::lambda::verify(&f.s.sdk, &f.s.outputs).await.expect("verify");
    let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.what.as_str()).collect();
    assert!(failed.is_empty(), "the stack's wiring to the alias: {failed:#?}");
    let mut before = BTreeMap::new();
    for id in ORDER {
        before.insert(id, live(&f, id).await);
    }
    let (old, new) = (code_keys(&f, &previous).await, code_keys(&f, &functions_dir()).await);
    assert!(old.iter().all(|(id, key)| new[id] != *key), "the previous release's bootstraps are this build's: {old:?}");

    // the upgrade: each function's new code published and shifted to
    let order: Vec<&str> = ORDER.to_vec();
    let up: BTreeMap<&str, Move> = ORDER.iter().map(|id| (*id, Move::Publish(new[*id].as_str()))).collect();
    let upgraded = phase(&f, "up", &order, &up).await;
    for (id, (version, hash)) in &upgraded {
        assert_ne!(hash, &before[id.as_str()].1, "{id}: version {version} runs the new code");
    }
    // the rollback: the functions shifted back to their previous versions, in reverse order
    let reverse: Vec<&str> = ORDER.iter().rev().copied().collect();
    let down: BTreeMap<&str, Move> = ORDER.iter().map(|id| (*id, Move::Back(before[id].0.as_str()))).collect();
    for (id, (version, hash)) in phase(&f, "down", &reverse, &down).await {
        assert_eq!(
            (&version, &hash),
            (&before[id.as_str()].0, &before[id.as_str()].1),
            "{id}: the previous release again"
        );
    }

    let _ = std::fs::remove_dir_all(config);
    f.delete().await;
}
