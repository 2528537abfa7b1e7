//! `sasctl ui` in a real browser: headless Chromium driven through WebDriver (chromedriver, from
//! Debian's `chromium-driver`) against the console of a LocalStack stack whose tasks the test runs
//! in-process: a Processed order, an order whose last step is refused (so it is compensated) with
//! markup in its error, an order that hangs with markup and script in its input (cancelled from
//! the page, with markup in the reason), and a callback step approved from the page.
//!
//! Checks: the workflows are drawn; the compensated order's page shows its path, its
//! compensations and its timeline; the hostile values render as text (no element, no script
//! run); a cancel and an approve from the page say what they did and the tasks end so; a POST
//! from another origin, without the form's token, or to another Host is refused. Screenshots of
//! each page go to `target/ui-screenshots/` (CI keeps them; the book's console page shows them).
//!
//! Needs `AWS_ENDPOINT_URL` (LocalStack) and chromedriver with Chromium (`SAS_CHROMEDRIVER`, else
//! `chromedriver` on the PATH; `SAS_CHROMIUM`, else `/usr/bin/chromium`): `.ci/run` installs
//! both (`apt-get install chromium chromium-driver`).

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Killed, Stack};
use fantoccini::{Client, ClientBuilder, Locator};
use sas_core::agent::AgentRuntime;
use sas_core::runner::{Runner, RunnerOptions};
use sas_protocol::protocol::ProcessState;
use serde_json::json;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// chromedriver on a free port, and the WebDriver session it serves.
async fn browser() -> (Killed, Client) {
    let driver = std::env::var("SAS_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned());
    let chromium = std::env::var("SAS_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    let port = free_port();
    let child = Command::new(&driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{driver}: {e}. The console's browser test needs Chromium and chromedriver: apt-get install chromium chromium-driver")
        });
    let child = Killed(child);
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"binary": chromium, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", &format!("--window-size={WINDOW_W},1100")]}),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(c) => return (child, c),
            Err(e) => {
                assert!(Instant::now() < deadline, "no WebDriver session from {driver} on port {port}: {e}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
}

fn shots_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[allow(clippy::print_stderr)] // the test says where its screenshots are
async fn shot(b: &Client, name: &str) {
    let png = b.screenshot().await.expect("screenshot");
    let path = shots_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

async fn text_of(b: &Client, css: &str) -> String {
    b.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}")).text().await.unwrap()
}

/// The text of `#outcome` (an action's answer page), once it is there.
async fn outcome_of(b: &Client) -> String {
    match b.wait().at_most(Duration::from_mins(1)).for_element(Locator::Css("#outcome")).await {
        Ok(e) => e.text().await.unwrap(),
        Err(e) => panic!("no outcome ({e}); the page: {}", b.source().await.unwrap_or_default()),
    }
}

async fn count(b: &Client, css: &str) -> usize {
    b.find_all(Locator::Css(css)).await.unwrap().len()
}

/// Markup and script in what a task carries: shown as text, never run or parsed.
const HOSTILE_INPUT: &str = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">";
const HOSTILE_ERROR: &str = "<img src=x onerror=\"window.__pwned = 3\">card declined";
const HOSTILE_REASON: &str = "<b>stop</b><img src=x onerror=\"window.__pwned = 4\">";

/// The browser's window is this wide (pixels): the task list fits it.
const WINDOW_W: u32 = 1_400;

async fn assert_inert(b: &Client, page: &str) {
    assert_eq!(count(b, "main img").await, 0, "{page}: markup from a task became an element");
    assert_eq!(count(b, "script").await, 0, "{page}: the console serves no script");
    let pwned = b.execute("return window.__pwned === undefined", vec![]).await.unwrap();
    assert_eq!(pwned, json!(true), "{page}: a script from a task ran");
}

/// The task list, at [`WINDOW_W`] pixels with the long id `long` and its long reason in it, fits
/// the window: the ended and reason columns are within it (no horizontal scroll), and the id
/// cell's title is the whole id.
async fn assert_list_fits(b: &Client, long: &str) {
    let js = "const cells = [];
        for (const row of document.querySelectorAll('#tasks tr')) {
            for (const i of [5, 6]) {
                const c = row.children[i], r = c.getBoundingClientRect();
                cells.push({text: c.textContent.slice(0, 40), left: r.left, right: r.right});
            }
        }
        const ids = [...document.querySelectorAll('#tasks td.id a')].map(a => a.title);
        return {inner: window.innerWidth, client: document.documentElement.clientWidth,
                scroll: document.documentElement.scrollWidth, cells, ids};";
    let got = b.execute(js, vec![]).await.unwrap();
    assert_eq!(got["inner"], json!(WINDOW_W), "the window: {got}");
    let width = got["client"].as_f64().unwrap();
    assert!(got["scroll"].as_f64().unwrap() <= width, "the page scrolls sideways: {got}");
    let cells = got["cells"].as_array().unwrap();
    assert!(cells.len() >= 6, "a header and two tasks at least: {got}");
    for c in cells {
        assert!(c["right"].as_f64().unwrap() <= width + 0.5, "a cell ends past the window's {width} px: {c} in {got}");
    }
    assert!(got["ids"].as_array().unwrap().contains(&json!(long)), "the long id's title is the whole id: {got}");
}

/// A compensated task's drawing says how it ended, whole: its end label is inside the drawing.
async fn assert_end_label_whole(b: &Client) {
    let js = "const svg = document.querySelector('#graph svg.graph');
        const t = svg.querySelector('g.end.other text.endlabel');
        const s = svg.getBoundingClientRect(), r = t.getBoundingClientRect();
        return {text: t.textContent, right: r.right, svg_right: s.right};";
    let got = b.execute(js, vec![]).await.unwrap();
    assert_eq!(got["text"], json!("ended Compensated, not Processed"), "{got}");
    assert!(got["right"].as_f64().unwrap() <= got["svg_right"].as_f64().unwrap(), "the end label is cut: {got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_draws_runs_and_acts_in_a_real_browser() {
    let s = Stack::deploy_with(Some(json!({
        "name": "ui-callback",
        "version": 1,
        "steps": [
            {"name": "prepare", "agent": "sim", "timeout_ms": 5_000},
            {"name": "confirm", "kind": "callback", "agent": "sim", "timeout_ms": 600_000, "max_attempts": 1,
             "schedule_to_start_ms": 120_000}
        ]
    })))
    .await;
    let opts =
        RunnerOptions { sweep_every: Duration::from_secs(1), wait: Duration::from_secs(1), ..Default::default() };
    let runner = Runner::new(s.deps.clone(), Arc::new(AgentRuntime::with_builtins()), opts).spawn();
    let run = &s.name[10..];
    let (ok, undone, hung, waits) =
        (format!("{run}-ok"), format!("{run}-undone"), format!("{run}-hostile"), format!("{run}-approve"));
    s.submit(&ok, json!({})).await;
    s.submit(&undone, json!({"sim": {"ship": {"permanent": HOSTILE_ERROR}}})).await;
    // an id near the longest (128) and a reason with a long unbroken word: the list still fits
    let long = format!("{run}-long-{}", "0123456789".repeat(12))[..120].to_owned();
    let word = "card_declined_".repeat(16);
    s.submit(&long, json!({"sim": {"ship": {"permanent": format!("no: {word}")}}})).await;
    // in flight until the page cancels it, however slow the machine: a callback step that waits
    // 10 minutes (a hanging sim-order reserve ends the task after its three attempts, ~30 s, which
    // on a loaded machine can come before the listing is read)
    s.submit_to("ui-callback", &hung, json!({"note": HOSTILE_INPUT})).await;
    s.submit_to("ui-callback", &waits, json!({})).await;
    s.wait_for(&ok, "Processed", |t| t.process_state == ProcessState::Processed).await;
    s.wait_for(&undone, "Compensated", |t| t.process_state == ProcessState::Compensated).await;
    s.wait_for(&long, "Compensated", |t| t.process_state == ProcessState::Compensated).await;
    s.wait_for(&waits, "waiting for its answer", |t| t.step_index == 1 && t.lock.locked_by.is_some()).await;

    let (_ui, base) = s.console(None);
    let (_driver, b) = browser().await;

    // the workflows, drawn
    b.goto(&format!("{base}/workflows")).await.unwrap();
    let drawn = count(&b, "svg.graph").await;
    assert!(drawn >= s.deps.workflows.all().count(), "{drawn} drawings");
    assert!(count(&b, "#wf-sim-order-1 svg g.step").await == 3, "sim-order has 3 steps");
    shot(&b, "workflows").await;

    // the compensated order, from the listing
    b.goto(&format!("{base}/tasks?state=Compensated")).await.unwrap();
    assert!(text_of(&b, "#tasks").await.contains(&undone), "the Compensated listing shows {undone}");
    assert_list_fits(&b, &long).await;
    shot(&b, "tasks").await;
    b.find(Locator::LinkText(&undone)).await.unwrap().click().await.unwrap();
    assert_eq!(text_of(&b, "#state").await, "Compensated");
    assert_eq!(count(&b, "#graph g.step.compensated").await, 2, "reserve and charge were undone");
    assert_eq!(count(&b, "#graph g.step.failed").await, 1, "ship was refused");
    assert!(count(&b, "#timeline rect.bar").await >= 5, "3 attempts and 2 compensations on the time axis");
    assert_end_label_whole(&b).await;
    let timeline = text_of(&b, "table.units").await;
    assert!(timeline.contains("undoes reserve") && timeline.contains("undoes charge"), "{timeline}");
    let steps = text_of(&b, "#steps").await;
    assert!(steps.contains(HOSTILE_ERROR), "the error is shown as the text it is: {steps}");
    assert_inert(&b, "the compensated task").await;
    shot(&b, "task-compensated").await;

    // the tasks in flight (the listing's default), the hostile one among them
    b.goto(&format!("{base}/tasks")).await.unwrap();
    let listed = text_of(&b, "#tasks").await;
    assert!(listed.contains(&hung) && listed.contains(&waits), "in flight: {listed}");
    assert!(!listed.contains(&ok), "an ended task is not in flight: {listed}");
    assert!(text_of(&b, "#counts").await.contains("Compensated 2"), "the counts");
    // it reloads itself, without the counts (their read units grow with the table)
    let reload = b.find(Locator::Css("meta[http-equiv=refresh]")).await.unwrap().attr("content").await.unwrap();
    assert!(
        reload.as_deref().is_some_and(|r| r.starts_with("10; url=/tasks?") && r.ends_with("&auto=1")),
        "{reload:?}"
    );
    b.goto(&format!("{base}/tasks?auto=1")).await.unwrap();
    let counts = text_of(&b, "#counts").await;
    assert!(counts.contains("left out") && !counts.contains("Compensated"), "{counts}");
    assert!(text_of(&b, "#tasks").await.contains(&hung), "the rows are read again");

    // the hostile input, then a cancel from the page
    b.goto(&format!("{base}/tasks/{hung}")).await.unwrap();
    // the input as JSON text: its quotes are escaped, its markup is not touched
    let input = text_of(&b, "#input").await;
    assert!(input.contains(&serde_json::to_string(HOSTILE_INPUT).unwrap()), "{input}");
    assert_inert(&b, "the hostile task").await;
    b.find(Locator::Id("action-cancel")).await.unwrap().click().await.unwrap();
    b.find(Locator::Css("input[name=reason]")).await.unwrap().send_keys(HOSTILE_REASON).await.unwrap();
    shot(&b, "confirm-cancel").await;
    b.find(Locator::Id("confirm")).await.unwrap().click().await.unwrap();
    let outcome = outcome_of(&b).await;
    assert!(count(&b, "p.ok#outcome").await == 1, "the cancel was applied: {outcome}");
    assert!(outcome.contains(&hung), "{outcome}");
    shot(&b, "outcome-cancel").await;
    let t = s.wait_for(&hung, "Cancelled", |t| t.process_state == ProcessState::Cancelled).await;
    assert!(t.reason.as_deref().unwrap_or("").contains(HOSTILE_REASON), "{:?}", t.reason);
    b.find(Locator::Id("back")).await.unwrap().click().await.unwrap();
    b.refresh().await.unwrap();
    assert_eq!(text_of(&b, "#state").await, "Cancelled");
    assert!(text_of(&b, "#reason").await.contains(HOSTILE_REASON));
    assert_inert(&b, "the cancelled task").await;

    // a callback step approved from the page
    b.goto(&format!("{base}/tasks/{waits}")).await.unwrap();
    b.find(Locator::Id("action-approve")).await.unwrap().click().await.unwrap();
    b.find(Locator::Css("input[name=reason]")).await.unwrap().send_keys("looks right").await.unwrap();
    b.find(Locator::Id("confirm")).await.unwrap().click().await.unwrap();
    let outcome = outcome_of(&b).await;
    assert!(outcome.contains("approve task") && outcome.contains(": applied ("), "{outcome}");
    let t = s.wait_for(&waits, "Processed", |t| t.process_state == ProcessState::Processed).await;
    assert_eq!(t.steps[1].output, Some(json!({"approved": true, "comment": "looks right"})));
    b.close().await.unwrap();

    // what no page of this console sent is refused, and changes nothing
    let http = reqwest::Client::new();
    let url = format!("{base}/tasks/{ok}/cancel");
    let port = base.rsplit(':').next().unwrap();
    for (origin, host, why) in [
        ("http://evil.example", format!("127.0.0.1:{port}"), "another origin"),
        (base.as_str(), format!("127.0.0.1:{port}"), "no form token"),
        ("http://evil.example", format!("evil.example:{port}"), "another Host (DNS rebinding)"),
    ] {
        let res = http
            .post(&url)
            .header("Origin", origin)
            .header("Host", host)
            .form(&[("csrf", "not-the-token"), ("reason", "cross-site")])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), reqwest::StatusCode::FORBIDDEN, "{why}");
    }
    let res = http.get(format!("{base}/tasks")).send().await.unwrap();
    let csp = res.headers().get("content-security-policy").map(|v| v.to_str().unwrap().to_owned());
    assert!(csp.as_deref().unwrap_or("").contains("default-src 'none'"), "{csp:?}");
    let t = s.wait_for(&ok, "still Processed", |t| t.process_state == ProcessState::Processed).await;
    assert_eq!(t.reason, None, "no cancel reached it");

    runner.shutdown().await;
    s.delete().await;
}
