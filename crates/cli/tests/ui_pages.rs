//! The console's pages and checks, requested in-process on the in-memory twins (no LocalStack, no
//! browser): a task's values are escaped, `--read-only` offers and takes no action, a POST needs
//! the console's own Origin and form token, and a request to another Host is refused. The browser
//! test (`tests/ui.rs`) covers the same against LocalStack in Chromium.

use sas_core::store::TaskWriter as _;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use sas_cli::table::TableReader;
use sas_cli::ui::{router, Console};
use sas_core::config::Settings;
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{apply, submit, Ctx, Event, Policy, ProcessState, Task};
use sas_protocol::workflow::WorkflowDef;
use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
use sas_testkit::twins::Twins;
use tower::ServiceExt as _;

const HOSTILE: &str = "<script>alert(1)</script><img src=x onerror=alert(2)>";

const NOW: Millis = Millis(1_700_000_000_000);

/// A console on the twins, with one task in flight whose input carries markup.
async fn console(read_only: bool) -> (axum::Router, TaskId) {
    let def = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve("sim-order", None).unwrap().clone();
    let id = TaskId::try_from("hostile-1").unwrap();
    let t = submit(id.clone(), def, serde_json::json!({"note": HOSTILE}), None, &Ctx::at(NOW), &Policy::default()).task;
    (console_of(&[t], read_only).await, id)
}

/// A console on the twins whose store holds `tasks`.
async fn console_of(tasks: &[Task], read_only: bool) -> axum::Router {
    let tw = Twins::new(WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap(), Settings::default(), NOW);
    for t in tasks {
        tw.store.create(t).await.unwrap();
    }
    // no DynamoDB call is made by the pages requested here (the task page reads the store)
    let sdk = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .build();
    let reader = TableReader::new(&sdk, &tw.deps.resources);
    let addr = "127.0.0.1:8080".parse().unwrap();
    let c = Console::new(Arc::new(tw.deps.clone()), reader, "stack t".into(), addr, read_only);
    router(Arc::new(c))
}

async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).header("host", "127.0.0.1:8080").body(Body::empty()).unwrap()
}

fn post(path: &str, host: &str, origin: Option<&str>, form: &str) -> Request<Body> {
    let mut r = Request::post(path).header("host", host).header("content-type", "application/x-www-form-urlencoded");
    if let Some(o) = origin {
        r = r.header("origin", o);
    }
    r.body(Body::from(form.to_owned())).unwrap()
}

/// The form token of a confirmation page.
fn csrf(page: &str) -> String {
    page.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).expect("a form token").to_owned()
}

#[tokio::test]
async fn a_task_s_values_are_text_and_its_actions_need_the_console_s_own_form() {
    let (app, id) = console(false).await;
    let (status, page) = send(&app, get(&format!("/tasks/{id}"))).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(!page.contains("<script>") && !page.contains("<img"), "markup from the task: {page}");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"), "{page}");
    assert!(page.contains("id=\"action-cancel\""), "a task in flight can be cancelled: {page}");
    assert!(!page.contains("id=\"action-resubmit\""), "only a task in Error is resubmitted");

    let (_, form) = send(&app, get(&format!("/tasks/{id}/cancel"))).await;
    let token = csrf(&form);
    let path = format!("/tasks/{id}/cancel");
    let body = format!("csrf={token}&reason=x");
    for (host, origin, why) in [
        ("127.0.0.1:8080", Some("http://evil.example"), "another origin"),
        ("127.0.0.1:8080", None, "no origin"),
        ("127.0.0.1:8080", Some("null"), "an opaque origin"),
    ] {
        let (status, page) = send(&app, post(&path, host, origin, &body)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{why}: {page}");
        assert!(page.contains("nothing was sent"), "{page}");
    }
    let (status, _) =
        send(&app, post(&path, "127.0.0.1:8080", Some("http://127.0.0.1:8080"), "csrf=forged&reason=x")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a forged token");
    let (status, _) = send(&app, post(&path, "evil.example", Some("http://evil.example"), &body)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another Host (DNS rebinding)");
    let (status, _) =
        send(&app, Request::get("/tasks").header("host", "attacker.example:8080").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a page for another Host");
    let res = app.clone().oneshot(get(&format!("/tasks/{id}"))).await.unwrap();
    let csp = res.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("default-src 'none'") && !csp.contains("script-src"), "{csp}");
}

#[tokio::test]
async fn a_read_only_console_offers_no_action_and_takes_none() {
    let (app, id) = console(true).await;
    let (_, page) = send(&app, get(&format!("/tasks/{id}"))).await;
    assert!(!page.contains("id=\"action-"), "no action offered: {page}");
    assert!(page.contains("read-only"));
    let (status, page) =
        send(&app, post(&format!("/tasks/{id}/cancel"), "127.0.0.1:8080", Some("http://127.0.0.1:8080"), "csrf=x"))
            .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(page.contains("read-only") && page.contains("nothing was sent"), "{page}");
}

/// One of three branches picked by guards (`pick-3`: big runs, mid and small are skipped), while
/// the region runs and once it ended: the skipped branches are drawn and listed as skipped, with
/// why, and no page links a task for them (they have none).
#[tokio::test]
async fn a_one_of_three_task_shows_its_skipped_branches_as_skipped_with_no_task() {
    let when = |size: &str| serde_json::json!({"variable": "$.input.size", "string_equals": size});
    let def: WorkflowDef = serde_json::from_value(serde_json::json!({
        "name": "pick", "version": 1,
        "steps": [
            {"name": "route", "agent": "sim", "timeout_ms": 5_000},
            {"name": "big", "agent": "sim", "timeout_ms": 5_000, "after": ["route"], "when": when("big")},
            {"name": "mid", "agent": "sim", "timeout_ms": 5_000, "after": ["route"], "when": when("mid")},
            {"name": "small", "agent": "sim", "timeout_ms": 5_000, "after": ["route"], "when": when("small")},
            {"name": "pack", "agent": "sim", "timeout_ms": 5_000, "after": ["big", "mid", "small"]}
        ]
    }))
    .unwrap();
    let policy = Policy::default();
    let go = |t: &Task, e: Event| apply(t, &e, &Ctx::at(NOW), &policy).unwrap().task;
    let mut tasks = Vec::new();
    for (id, ended) in [("pick-running", false), ("pick-ended", true)] {
        let t = submit(
            TaskId::try_from(id).unwrap(),
            def.clone(),
            serde_json::json!({"size": "big"}),
            None,
            &Ctx::at(NOW),
            &policy,
        )
        .task;
        let attempt = t.lock.locked_by.clone().unwrap();
        let mut t = go(&t, Event::AgentSucceeded { attempt, output: serde_json::json!({}) });
        if ended {
            let end = Event::ElementEnded {
                step: 1,
                element: 0,
                state: ProcessState::Processed,
                reason: None,
                output: Some(serde_json::json!({})),
                vars: None,
            };
            t = go(&t, end);
        }
        tasks.push(t);
    }
    let app = console_of(&tasks, false).await;
    for (id, big) in [("pick-running", "running"), ("pick-ended", "succeeded")] {
        let (status, page) = send(&app, get(&format!("/tasks/{id}"))).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for skipped in ["mid", "small"] {
            assert!(
                page.contains(&format!("<g class=\"step skipped\" data-step=\"{skipped}\">")),
                "{id}: {skipped} drawn skipped: {page}"
            );
            assert!(
                page.contains(&format!("{skipped} skipped (when was false: $.input.size string_equals")),
                "{id}: {page}"
            );
        }
        assert!(page.contains("<g class=\"step succeeded\" data-step=\"route\">"), "{id}: {page}");
        assert!(page.contains(&format!("big {big} (task {id}~1~0)")), "{id}: {page}");
        assert!(page.contains(&format!("href=\"/tasks/{id}~1~0\"")), "{id}: big's task is linked: {page}");
        for e in [1, 2] {
            assert!(!page.contains(&format!("{id}~1~{e}")), "{id}: a skipped branch has no task: {page}");
        }
        assert!(!page.contains("step failed") && !page.contains(" failed ("), "{id}: nothing failed: {page}");
    }
}
