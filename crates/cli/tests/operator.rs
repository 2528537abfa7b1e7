//! The operator commands against LocalStack, through the `sasctl` binary: a no-op is refused at
//! once as one line (no backtrace, even with `RUST_BACKTRACE=1`) and exit 1; a cancel and a
//! resubmit print the states they led to; `status` prints a task's timeline; `top` counts the tasks
//! by state; `list` says when it stops at `--limit`;
//! `resubmit --state Error` counts what moved.
//!
//! Needs `AWS_ENDPOINT_URL` (LocalStack: `source infra/env.sh`). Deploys its own stack, runs the
//! roles in-process (sim agents), and deletes the stack at the end.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::Stack;
use sas_core::agent::AgentRuntime;
use sas_core::runner::{Runner, RunnerOptions};
use sas_protocol::ids::{AttemptToken, CallbackToken, TaskId};
use sas_protocol::protocol::{ProcessState, Task};
use serde_json::json;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_owned()
}

/// Exit 1 and exactly one line on stderr, starting `error: `.
fn assert_refused(out: &Output, expect: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line, no backtrace: {err}");
    assert!(err.starts_with("error: ") && err.contains(expect), "{err}");
}

fn assert_ok(out: &Output) -> String {
    assert!(out.status.success(), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_commands_report_their_outcome() {
    let s = Stack::deploy().await;
    let opts =
        RunnerOptions { sweep_every: Duration::from_secs(1), wait: Duration::from_secs(1), ..Default::default() };
    let runner = Runner::new(s.deps.clone(), Arc::new(AgentRuntime::with_builtins()), opts).spawn();

    let run = &s.name[10..];
    let (ok1, ok2, stuck, err) =
        (format!("{run}-ok-1"), format!("{run}-ok-2"), format!("{run}-stuck"), format!("{run}-err"));
    s.submit(&ok1, json!({})).await;
    s.submit(&ok2, json!({})).await;
    // reserve hangs past CompleteBy on every attempt: the task stays in flight (Processing, or
    // Pending between attempts) long enough to be cancelled.
    s.submit(&stuck, json!({"sim": {"reserve": {"hang_attempts": 3}}})).await;
    // charge is declined and release refused: Error after a failed compensation.
    s.submit(&err, json!({"sim": {"charge": {"permanent": "declined"}, "release": {"permanent": "stock says no"}}}))
        .await;
    let is = |state| move |t: &Task| t.process_state == state;

    // A cancel that applies says what it led to (first: the stuck task gives up after 3 attempts).
    s.wait_for(&stuck, "Processing", is(ProcessState::Processing)).await;
    let out = assert_ok(&s.sasctl(&["cancel", &stuck, "--reason", "customer asked"]));
    assert!(out.starts_with(&format!("{stuck}: ")) && out.contains("(cancelled: customer asked)"), "{out}");
    // (the cancel waits for the hung attempt to settle past its CompleteBy, then undoes it: 25 s
    // alone, once over 90 s beside CPU burners and the heaviest tests)
    s.wait_for_within(&stuck, "Cancelled", is(ProcessState::Cancelled), Duration::from_mins(4)).await;

    s.wait_for(&ok1, "Processed", is(ProcessState::Processed)).await;
    s.wait_for(&ok2, "Processed", is(ProcessState::Processed)).await;
    s.wait_for(&err, "Error", is(ProcessState::Error)).await;

    // status: the facts and the timeline, every step's attempt on the time axis
    let out = assert_ok(&s.sasctl(&["status", &ok1]));
    assert!(out.contains("ProcessState  Processed") && out.contains("now: ended Processed at +"), "{out}");
    // Each of the three steps succeeded once. Which attempt did is the machine's business: an
    // attempt that waited in the agent queue past its start_by is not started and claimed again
    // (more attempts and history entries on a busy machine), and the timeline says so.
    for step in ["reserve", "charge", "ship"] {
        let head = out.lines().find(|l| l.trim_start().starts_with(&format!("{step} "))).unwrap_or_default();
        assert!(head.contains("succeeded"), "{step}: {out}");
    }
    let attempts = out.lines().filter(|l| l.trim_start().starts_with("attempt ") && l.contains("succeeded"));
    assert_eq!(attempts.count(), 3, "one succeeded attempt per step: {out}");
    let kept = out
        .split("history: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_default();
    assert!(kept >= 4 && out.contains("entries kept on the task item"), "submitted, 3 steps, ended: {out}");
    let out = assert_ok(&s.sasctl(&["status", &stuck]));
    assert!(out.contains("cancelled") && out.contains("now: ended Cancelled at +"), "{out}");

    // No-ops are refused at once, naming the state and why.
    assert_refused(&s.sasctl(&["cancel", &format!("{run}-nope")]), "there is no such task");
    assert_refused(&s.sasctl(&["cancel", &ok1]), &format!("cannot cancel {ok1}: it is Processed"));
    assert_refused(&s.sasctl(&["resubmit", &stuck]), "it is Cancelled");

    // So does a resubmit.
    let out = assert_ok(&s.sasctl(&["resubmit", &err, "--reason", "stock fixed"]));
    assert!(out.starts_with(&format!("{err}: Error -> Compensating")), "{out}");
    // (The release is refused again at once, so the line may already end in Error.)
    let t = s.wait_for(&err, "resubmitted", |t| t.run == 2).await;
    assert!(t.history.iter().any(|h| h.reason.as_deref() == Some("resubmitted (run 2): stock fixed")), "{t:?}");

    // The listing says when it stops at its limit.
    let out = assert_ok(&s.sasctl(&["list", "--state", "Processed", "--limit", "1"]));
    assert!(out.ends_with("showing 1 of 2 Processed tasks, most recently ended first; --limit to see more"), "{out}");

    // Every Error task, in batches, with a summary (the release is refused again: back to Error).
    s.wait_for(&err, "Error again", |t| t.process_state == ProcessState::Error && t.run == 2).await;
    // top: nothing in flight, the ended tasks counted, and what it cost (2 shards)
    let out = assert_ok(&s.sasctl(&["top"]));
    assert!(out.contains("in flight: 0 tasks (Pending 0, Processing 0, Compensating 0)"), "{out}");
    assert!(out.contains("Processed 2, Compensated 0, Error 1, Cancelled 1"), "{out}");
    assert!(out.contains("requests: 2 ByCompleteBy queries (keys only), 0 BatchGetItem"), "{out}");
    let out = assert_ok(&s.sasctl(&["resubmit", "--state", "Error"]));
    assert!(out.ends_with("resubmit --state Error: requested 1, moved 1, unchanged 0"), "{out}");

    // A task not created (yet) is told apart from a failure to read, with what to do.
    let none = format!("{run}-never");
    assert_refused(&s.sasctl(&["status", &none]), &format!("no task {none}: the table has none (yet)"));
    // submit --wait: the task's end, its timeline, and an exit status a script can branch on.
    let waited = format!("{run}-waited");
    let out = assert_ok(&s.sasctl(&["submit", "--workflow", "sim-order", "--task-id", &waited, "--wait"]));
    assert!(out.starts_with(&waited) && out.contains("now: ended Processed at +"), "{out}");
    assert!(out.lines().last().unwrap_or_default().starts_with(&format!("{waited}: ended Processed after ")), "{out}");
    let created = format!("{run}-created");
    let out = assert_ok(&s.sasctl(&["submit", "--workflow", "sim-order", "--task-id", &created, "--wait=created"]));
    assert!(out.contains(&format!("{created}: created, ")) && out.contains("(sim-order@"), "{out}");
    let declined = format!("{run}-declined");
    let input = r#"{"sim": {"charge": {"permanent": "declined"}}}"#;
    let out = s.sasctl(&["submit", "--workflow", "sim-order", "--task-id", &declined, "--input", input, "--wait"]);
    let printed = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "another end is exit 2: {printed}\n{}", text(&out.stderr));
    assert!(printed.contains(&format!("{declined}: ended Compensated after ")), "{printed}");
    s.wait_for(&created, "Processed", is(ProcessState::Processed)).await;

    runner.shutdown().await;
    s.delete().await;
}

/// The two managed policies the stack gives its users, as IAM stores them: `OperatorPolicy` allows
/// every call sasctl's task commands made here (recorded: status, list, top with an overdue task,
/// submit, resubmit, cancel; plus `--stack`'s DescribeStacks) and grants nothing they did not
/// use; `ApplicationPolicy` allows exactly the calls the book's first-hour tutorial makes
/// (submit, create and read its own reply queue, read the stack's outputs). Each refuses what is
/// not its holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_and_application_policies_allow_exactly_their_calls() {
    let s = Stack::deploy().await;
    let calls = std::env::temp_dir().join(format!("{}-calls", s.name));
    let _ = std::fs::remove_dir_all(&calls);
    std::fs::create_dir_all(&calls).expect("the call log directory");
    let opts =
        RunnerOptions { sweep_every: Duration::from_secs(1), wait: Duration::from_secs(1), ..Default::default() };
    let runner = Runner::new(s.deps.clone(), Arc::new(AgentRuntime::with_builtins()), opts).spawn();
    let run = &s.name[10..];
    let sasctl = |args: &[&str]| assert_ok(&s.sasctl_recorded(args, Some(&calls)));
    let is = |state| move |t: &Task| t.process_state == state;

    let (ok, err, stuck) = (format!("{run}-ok"), format!("{run}-err"), format!("{run}-stuck"));
    sasctl(&["submit", "--workflow", "sim-order", "--task-id", &ok]);
    let declined = r#"{"sim": {"charge": {"permanent": "declined"}, "release": {"permanent": "no"}}}"#;
    sasctl(&["submit", "--workflow", "sim-order", "--task-id", &err, "--input", declined]);
    s.wait_for(&ok, "Processed", is(ProcessState::Processed)).await;
    sasctl(&["status", &ok]);
    sasctl(&["list", "--state", "Processed", "--limit", "1"]);
    s.wait_for(&err, "Error", is(ProcessState::Error)).await;
    sasctl(&["resubmit", &err, "--reason", "policy check"]);
    let hangs = format!("{run}-ui");
    // sasctl ui: its pages and a cancel from its form, with the same policy (approve and reject
    // answer in-process, as `sasctl approve` does: not the operator's; see docs/how-to/console.md)
    let (console, base) = s.console(Some(&calls));
    let http = reqwest::Client::new();
    for page in [
        "/tasks".to_owned(),
        "/tasks?state=Processed&workflow=sim-order&since=1h".to_owned(),
        format!("/tasks/{ok}"),
        "/workflows".to_owned(),
    ] {
        let res = http.get(format!("{base}{page}")).send().await.expect("a page");
        assert!(res.status().is_success(), "{page}: {}", res.status());
    }
    // the workflows page says whose workflows it shows: a stack without functions runs the files
    // its local runner reads, the checkout's config/ here
    let page = http.get(format!("{base}/workflows")).send().await.unwrap().text().await.unwrap();
    let from = page.split("id=\"workflows-from\"").nth(1).and_then(|r| r.split("</p>").next()).unwrap_or_default();
    assert!(from.contains("config/workflows.json"), "the workflows page's source: {from}");
    // a task in flight to cancel, submitted once the pages are read: its three hung attempts end it
    // by itself some 20 s later, which the cancel must come before on a slow machine too
    s.submit(&hangs, json!({"sim": {"reserve": {"hang_attempts": 3}}})).await;
    s.wait_for(&hangs, "Processing", is(ProcessState::Processing)).await;
    let form = http.get(format!("{base}/tasks/{hangs}/cancel")).send().await.unwrap().text().await.unwrap();
    let csrf = form.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).expect("the form's token");
    let done = http
        .post(format!("{base}/tasks/{hangs}/cancel"))
        .header("Origin", &base)
        .form(&[("csrf", csrf), ("reason", "from the console")])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(done.contains("class=\"ok\" id=\"outcome\""), "the console's cancel: {done}");
    drop(console);
    // A task overdue for top to read: claimed, then nobody left to run or sweep it.
    sasctl(&[
        "submit",
        "--workflow",
        "sim-order",
        "--task-id",
        &stuck,
        "--input",
        r#"{"sim": {"reserve": {"hang_attempts": 3}}}"#,
    ]);
    let claimed = s.wait_for(&stuck, "Processing", is(ProcessState::Processing)).await;
    runner.shutdown().await;
    // With nobody left to run or sweep it, the stuck task's current deadline passes (not the
    // first claim's: its attempt may have expired and been claimed again before the runner
    // stopped). Then top reads it as overdue; it is asked again, within a bound, for as long as
    // the task item read says it is not yet overdue.
    assert!(claimed.complete_by.is_some(), "a claimed step has a CompleteBy");
    let mut top = String::new();
    for _ in 0..120 {
        let t = s.wait_for(&stuck, "read", |_| true).await;
        match t.complete_by {
            Some(cb) if sas_protocol::ids::Millis::now() > cb => {
                top = sasctl(&["top"]);
                if top.contains(&stuck) {
                    break;
                }
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(top.contains(&stuck) && !top.contains(" 0 BatchGetItem"), "top reads the overdue task: {top}");
    sasctl(&["cancel", &stuck, "--no-wait"]);
    // a pause and a resume (the runner is stopped: no task of the workflow is parked by them)
    let paused = sasctl(&["pause", "sim-order", "--reason", "policy check"]);
    assert!(paused.contains("workflow sim-order paused"), "{paused}");
    let listed = sasctl(&["pause"]);
    assert!(listed.contains("sim-order: paused since") && listed.contains("policy check"), "{listed}");
    let resumed = sasctl(&["resume", "sim-order"]);
    assert!(resumed.contains("workflow sim-order resumed"), "{resumed}");
    let key = sasctl(&["pause", "--key", "sim-order:acct-1", "--reason", "audit"]);
    assert!(key.contains("concurrency key key:sim-order:acct-1 paused"), "{key}");
    assert!(sasctl(&["resume", "--key", "sim-order:acct-1"]).contains("resumed"));
    // a schedule, through each of its commands (the runner is stopped: its instants wait in the
    // submission queue)
    let created = sasctl(&[
        "schedule",
        "create",
        "nightly",
        "--workflow",
        "sim-order",
        "--cron",
        "0 2 * * *",
        "--tz",
        "Europe/Paris",
    ]);
    assert!(
        created.contains("schedule nightly created: workflow sim-order, overlap skip; its first instant"),
        "{created}"
    );
    let listed = sasctl(&["schedule", "list"]);
    assert!(listed.contains("nightly: sim-order cron \"0 2 * * *\" Europe/Paris, overlap skip; next "), "{listed}");
    assert!(sasctl(&["schedule", "pause", "nightly"]).contains("schedule nightly paused"));
    assert!(sasctl(&["schedule", "resume", "nightly"]).contains("schedule nightly resumed: its next instant is "));
    let sent =
        sasctl(&["schedule", "backfill", "nightly", "--from", "2026-11-01T00:00:00Z", "--to", "2026-11-03T00:00:00Z"]);
    assert!(sent.contains("2 instants sent") && sent.contains("nightly-20261101T010000Z"), "{sent}");
    let triggered = sasctl(&["schedule", "trigger", "nightly", "--at", "2026-11-05T01:00:00Z"]);
    assert!(triggered.contains("task nightly-20261105T010000Z"), "{triggered}");
    assert!(sasctl(&["schedule", "delete", "nightly"]).contains("schedule nightly deleted"));

    let cfn = aws_sdk_cloudformation::Client::new(&s.sdk);
    let described = cfn.describe_stacks().stack_name(&s.name).send().await.expect("DescribeStacks");
    let stack_arn = described.stacks()[0].stack_id().expect("a stack ID").to_owned();
    let account = stack_arn.split(':').nth(4).expect("an account").to_owned();
    let outputs = sas_cli::stack::outputs(&cfn, &s.name).await.expect("the outputs");
    let iam = aws_sdk_iam::Client::new(&s.sdk);
    let req = sas_cli::iam::Request::code;
    let (table, scheduler, submission) =
        (&outputs["TaskTableArn"], &outputs["SchedulerQueueArn"], &outputs["SubmissionQueueArn"]);

    // The operator: what sasctl did, recorded, and what --stack does.
    let recorded = sas_core::aws_calls::read_dir(&calls).expect("the recorded calls");
    let mut needed = sas_cli::iam::requests_of(&recorded, &account).expect("the calls' resources");
    needed.insert(req("cloudformation:DescribeStacks", &stack_arn), 1);
    let operator = sas_cli::iam::managed_policy(&iam, &outputs["OperatorPolicyArn"]).await.expect("OperatorPolicy");
    let r = sas_cli::iam::check_role("sasctl", "OperatorPolicy", &operator, &needed);
    assert_eq!(r.denied().count(), 0, "{:#?}", r.requests);
    assert!(r.unused.is_empty(), "grants sasctl did not use: {:#?}\n{:#?}", r.unused, r.requests);
    for action in ["dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchGetItem", "sqs:SendMessage"] {
        assert!(needed.keys().any(|q| q.action == action), "sasctl made no {action}: {needed:#?}");
    }
    for (action, resource) in [
        ("dynamodb:PutItem", table.as_str()),
        ("dynamodb:UpdateItem", table.as_str()),
        ("dynamodb:DeleteItem", table.as_str()),
        ("sqs:ReceiveMessage", scheduler.as_str()),
        ("sqs:SendMessage", outputs["AgentQueueArn"].as_str()),
    ] {
        let d = sas_cli::iam::evaluate(&operator, action, resource);
        assert_eq!(d, sas_cli::iam::Decision::ImplicitDeny, "an operator may not {action} on {resource}");
    }

    // The application: the first-hour tutorial's calls.
    let reply = format!("arn:aws:sqs:us-east-1:{account}:{}-reply-myapp", s.name);
    let needed: std::collections::BTreeMap<sas_cli::iam::Request, usize> = [
        (req("cloudformation:DescribeStacks", &stack_arn), 1),
        (req("sqs:SendMessage", submission), 1),
        (req("sqs:CreateQueue", &reply), 1),
        (req("sqs:GetQueueUrl", &reply), 1),
        (req("sqs:ReceiveMessage", &reply), 1),
        (req("sqs:DeleteMessage", &reply), 1),
    ]
    .into();
    let app = sas_cli::iam::managed_policy(&iam, &outputs["ApplicationPolicyArn"]).await.expect("ApplicationPolicy");
    let r = sas_cli::iam::check_role("application", "ApplicationPolicy", &app, &needed);
    assert_eq!(r.denied().count(), 0, "{:#?}", r.requests);
    assert!(r.unused.is_empty(), "grants an application does not need: {:#?}", r.unused);
    for (action, resource) in [
        ("sqs:ReceiveMessage", submission.as_str()),
        ("sqs:SendMessage", scheduler.as_str()),
        ("sqs:CreateQueue", &format!("arn:aws:sqs:us-east-1:{account}:another-queue")),
        ("dynamodb:GetItem", table.as_str()),
    ] {
        let d = sas_cli::iam::evaluate(&app, action, resource);
        assert_eq!(d, sas_cli::iam::Decision::ImplicitDeny, "an application may not {action} on {resource}");
    }
    let _ = std::fs::remove_dir_all(&calls);
    s.delete().await;
}

/// The token of the attempt a task's callback step waits for (what the agent handed over).
fn token_of(t: &Task, unit: &str) -> String {
    let attempt = t.lock.locked_by.as_ref().expect("a waiting attempt holds the task");
    CallbackToken::new(&t.task_id, unit, attempt).expose()
}

/// A callback step answered by hand: heartbeat, complete (and its duplicate), approve, reject,
/// and the answers that are not taken (stale, unknown) exit 1, none printing the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callback_steps_are_answered_with_sasctl() {
    let s = Stack::deploy_with(Some(json!({
        "name": "sim-callback",
        "version": 1,
        // the stack's queue budget is 2 s (for the cancel tests): a request that waited longer on a
        // busy machine was not started and the step claimed again with a new token, so the token
        // read here was stale (CI, once). The step gets a budget of its own.
        "steps": [{"name": "confirm", "kind": "callback", "agent": "sim", "timeout_ms": 600_000, "max_attempts": 1,
                   "schedule_to_start_ms": 120_000}]
    })))
    .await;
    let opts =
        RunnerOptions { sweep_every: Duration::from_secs(1), wait: Duration::from_secs(1), ..Default::default() };
    let runner = Runner::new(s.deps.clone(), Arc::new(AgentRuntime::with_builtins()), opts).spawn();
    let run = &s.name[10..];
    let (done, approved, rejected) = (format!("{run}-cb-done"), format!("{run}-cb-ok"), format!("{run}-cb-no"));
    for id in [&done, &approved, &rejected] {
        s.submit_to("sim-callback", id, json!({})).await;
    }
    let waiting = |t: &Task| t.process_state == ProcessState::Processing && t.lock.locked_by.is_some();
    let no_token = |out: &Output, token: &str| {
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!all.contains(token), "the token is never printed: {all}");
    };

    // heartbeat, then complete: the step succeeds with the output given
    let t = s.wait_for(&done, "waiting for its callback", waiting).await;
    let token = token_of(&t, "confirm");
    let out = s.sasctl(&["heartbeat", &token, "--details", r#"{"progress": "half"}"#]);
    let line = assert_ok(&out);
    assert!(line.starts_with(&format!("heartbeat task {done}, step confirm: alive")), "{line}");
    no_token(&out, &token);
    let out = s.sasctl(&["complete", &token, "--output", r#"{"shipped": 3}"#]);
    let line = assert_ok(&out);
    assert!(line.starts_with(&format!("complete task {done}, step confirm: applied")), "{line}");
    no_token(&out, &token);
    let t = s.wait_for(&done, "Processed", |t| t.process_state == ProcessState::Processed).await;
    assert_eq!(t.steps[0].output, Some(json!({"shipped": 3})), "{t:?}");
    // the same answer again (a sender retrying) is not an error
    let line = assert_ok(&s.sasctl(&["complete", &token, "--output", r#"{"shipped": 3}"#]));
    assert!(line.contains(": duplicate ("), "{line}");

    // approve: a success whose output says so
    let t = s.wait_for(&approved, "waiting for its approval", waiting).await;
    let token = token_of(&t, "confirm");
    // a token of an attempt nobody was given changes nothing, and says so (exit 1): "unknown",
    // never "stale (... it expired and was retried with a new token)"
    let forged = CallbackToken::new(&t.task_id, "confirm", &AttemptToken::from("ffffffffffffffffffffffffffffffff"));
    let out = s.sasctl(&["approve", &forged.expose()]);
    assert_refused(&out, &format!("approve task {approved}, step confirm: unknown"));
    assert_refused(&out, "no attempt of confirm was given this token");
    no_token(&out, &forged.expose());
    let line = assert_ok(&s.sasctl(&["approve", &token, "--comment", "fine by me"]));
    assert!(line.contains(": applied ("), "{line}");
    let t = s.wait_for(&approved, "Processed", |t| t.process_state == ProcessState::Processed).await;
    assert_eq!(t.steps[0].output, Some(json!({"approved": true, "comment": "fine by me"})));

    // reject: a permanent failure with the reason; the task ends without the step
    let t = s.wait_for(&rejected, "waiting for its approval", waiting).await;
    let token = token_of(&t, "confirm");
    let line = assert_ok(&s.sasctl(&["reject", &token, "--reason", "too expensive"]));
    assert!(line.contains(": applied ("), "{line}");
    let t = s.wait_for(&rejected, "ended", |t| t.process_state.is_terminal()).await;
    assert_eq!(t.process_state, ProcessState::Compensated, "{t:?}");
    assert!(t.reason.as_deref().unwrap_or("").contains("rejected: too expensive"), "{:?}", t.reason);
    // an approval after the rejection: late, because the step had failed, not because the
    // attempt expired
    let out = s.sasctl(&["approve", &token]);
    assert_refused(&out, &format!("approve task {rejected}, step confirm: late"));
    assert_refused(&out, "from an attempt that had already answered that it failed (rejected: too expensive)");
    assert!(!text(&out.stderr).contains("expired"), "{}", text(&out.stderr));

    // a token for no task at all
    let nobody = CallbackToken::new(
        &TaskId::try_from(format!("{run}-nobody").as_str()).unwrap(),
        "confirm",
        &AttemptToken::from("0123456789abcdef0123456789abcdef"),
    );
    assert_refused(&s.sasctl(&["complete", &nobody.expose()]), ": unknown (no task, or no attempt of the step,");

    runner.shutdown().await;
    s.delete().await;
}

/// A malformed callback token is refused before anything is read or sent: with no outputs file
/// and no reachable AWS endpoint, the one error line is about the token, and never repeats it.
#[test]
fn a_malformed_callback_token_is_refused_without_touching_aws() {
    let missing = std::env::temp_dir().join(format!("no-such-outputs-{}.json", uuid::Uuid::new_v4().simple()));
    let secret = "0123456789abcdef0123456789abcdeX:ship:order-7";
    let sasctl = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
            .arg("--outputs")
            .arg(&missing)
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env_remove("SAS_STACK")
            .output()
            .expect("sasctl runs")
    };
    for args in [
        vec!["complete", secret, "--output", "{}"],
        vec!["fail", secret, "--error", "boom"],
        vec!["heartbeat", secret],
        vec!["approve", secret, "--comment", "fine"],
        vec!["reject", secret, "--reason", "no"],
        vec!["complete", "not-a-token"],
    ] {
        let out = sasctl(&args);
        assert_refused(&out, "the callback token is not one this stack issues");
        let err = text(&out.stderr);
        assert!(!err.contains("0123456789abcdef"), "the token is never echoed: {err}");
        assert!(!err.contains("outputs"), "nothing read before the token is checked: {err}");
    }
    let out = sasctl(&["complete", "0123456789abcdef0123456789abcdef:ship:order-7", "--output", "{"]);
    assert_refused(&out, "--output is not JSON");
}
