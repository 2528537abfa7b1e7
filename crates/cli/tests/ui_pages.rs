//! The console's pages and checks, requested in-process on the in-memory twins (no LocalStack, no
//! browser): a task's values are escaped, `--read-only` offers and takes no action, a POST needs
//! the console's own Origin and form token, and a request to another Host is refused. The browser
//! test (`tests/ui.rs`) covers the same against LocalStack in Chromium.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use sas_cli::table::TableReader;
use sas_cli::ui::{router, Console};
use sas_core::config::Settings;
use sas_core::ids::{Millis, TaskId};
use sas_core::protocol::{submit, Ctx, Policy};
use sas_core::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};
use sas_testkit::twins::Twins;
use tower::ServiceExt as _;

const HOSTILE: &str = "<script>alert(1)</script><img src=x onerror=alert(2)>";

/// A console on the twins, with one task in flight whose input carries markup.
async fn console(read_only: bool) -> (axum::Router, TaskId) {
    let now = Millis(1_700_000_000_000);
    let tw = Twins::new(WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap(), Settings::default(), now);
    let def = tw.deps.workflows.resolve("sim-order", None).unwrap().clone();
    let id = TaskId::try_from("hostile-1").unwrap();
    let t = submit(id.clone(), def, serde_json::json!({"note": HOSTILE}), None, &Ctx::at(now), &Policy::default()).task;
    tw.deps.store.create(&t).await.unwrap();
    // no DynamoDB call is made by the pages requested here (the task page reads the store)
    let sdk = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .build();
    let reader = TableReader::new(&sdk, &tw.deps.resources);
    let addr = "127.0.0.1:8080".parse().unwrap();
    let c = Console::new(Arc::new(tw.deps.clone()), reader, "stack t".into(), addr, read_only);
    (router(Arc::new(c)), id)
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
