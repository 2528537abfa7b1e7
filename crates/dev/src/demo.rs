//! `sasctl demo`: the main job. Starts the order service (inventory, payment, shipping) and runs
//! every role in this process against a deployed stack, with HTTP agents calling the service;
//! submits sample orders (clean, flaky, slow, hanging once, declined, lost in shipping, a duplicate,
//! a malformed one; on `order-async`, shipping as a callback step answered on time, late, and
//! never), shows them move, and checks each order's end and the service's ledger: every
//! effect applied exactly once, every compensated order released and refunded; then each order's
//! timeline (its steps and attempts on a time axis, [`sas_cli::timeline`]).
//!
//! Two modes: [`run`] hosts the roles in this process (the local runner, against a stack deployed
//! with the functions off); [`run_lambda`] deploys the functions onto LocalStack and lets its
//! event sources and scheduled rule invoke them, with the same orders and the same checks.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_sqs::types::QueueAttributeName;
use sas_cli::timeline;
use sas_core::agent::{AgentRuntime, BUILT_IN_AGENTS};
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_core::runner::{Runner, RunnerHandle, RunnerOptions};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{Submission, VERSION};
use sas_protocol::protocol::{ProcessState, Task};
use sas_protocol::workflow::WorkflowRegistry;
use serde_json::{json, Value};

struct Order {
    id: String,
    what: &'static str,
    workflow: &'static str,
    /// Faults the order service applies to this order, by endpoint.
    faults: Value,
    expect: ProcessState,
    min_failures: u32,
    /// The effects the ledger must show for this order, in order (a map's lines: see
    /// [`lines_ok`]).
    effects: &'static [&'static str],
    /// The order's line items.
    items: Value,
    /// More fields of the order's input (`order-decide`'s `gift` and `risk`).
    extra: Value,
}

const DONE: &[&str] = &["reserve", "charge", "ship"];

fn orders(run: &str) -> Vec<Order> {
    let o = |n: &str, what, faults, expect, min_failures, effects| Order {
        id: format!("{run}-{n}"),
        what,
        workflow: "order",
        faults,
        expect,
        min_failures,
        effects,
        items: json!([{"sku": "book", "qty": 1}]),
        extra: json!({}),
    };
    vec![
        o("clean-1", "clean", json!({}), ProcessState::Processed, 0, DONE),
        o("clean-2", "clean", json!({}), ProcessState::Processed, 0, DONE),
        o(
            "flaky-pay",
            "payment answers 503 three times",
            json!({"payment/charge": {"fail_times": 3}}),
            ProcessState::Processed,
            0,
            DONE,
        ),
        o(
            "slow-stock",
            "inventory takes 1.5 s",
            json!({"inventory/reserve": {"latency_ms": 1500}}),
            ProcessState::Processed,
            0,
            DONE,
        ),
        o("hung-stock", "inventory hangs past CompleteBy once", json!({}), ProcessState::Processed, 1, DONE),
        o(
            "declined",
            "card declined: release the stock",
            json!({"payment/charge": {"permanent": "card declined"}}),
            ProcessState::Compensated,
            1,
            &["reserve", "release"],
        ),
        o(
            "lost-ship",
            "shipping never answers: refund, release, alert",
            json!({"shipping/ship": {"hang": true}}),
            ProcessState::Compensated,
            3,
            &["reserve", "charge", "refund", "release"],
        ),
    ]
}

/// Orders on `order-lines`: each line item is reserved on its own, in a map step (one element task
/// per line), then the charge and a fraud check run at once (two branches); one order has a line
/// out of stock, one is refused by the fraud check.
fn line_orders(run: &str) -> Vec<Order> {
    let o = |n: &str, what, items, expect, min_failures| Order {
        id: format!("{run}-{n}"),
        what,
        workflow: "order-lines",
        faults: if n == "lines-fraud" {
            json!({"fraud/screen": {"permanent": "fraud suspected: card used in three countries today"}})
        } else {
            json!({})
        },
        expect,
        min_failures,
        effects: &[],
        items,
        extra: json!({}),
    };
    let oos = json!({"sku": "lamp", "qty": 1, "faults": {"inventory/reserve": {"permanent": "out of stock: lamp"}}});
    vec![
        o(
            "lines",
            "three lines, each reserved on its own",
            json!([{"sku": "book", "qty": 1}, {"sku": "pen", "qty": 3}, {"sku": "mug", "qty": 2}]),
            ProcessState::Processed,
            0,
        ),
        o(
            "lines-oos",
            "a line out of stock: the reserved lines released, nothing charged",
            json!([{"sku": "book", "qty": 1}, oos, {"sku": "mug", "qty": 2}]),
            ProcessState::Compensated,
            1,
        ),
        o(
            "lines-fraud",
            "the fraud check beside the charge refuses: refunded (if charged), lines released",
            json!([{"sku": "book", "qty": 1}, {"sku": "pen", "qty": 3}]),
            ProcessState::Compensated,
            1,
        ),
    ]
}

/// A map order's ledger, line by line: every line reserved once and the order charged and shipped
/// once (`Processed`); or every line reserved released exactly once, the line out of stock never
/// reserved, nothing charged (`Compensated`). Returns whether it holds and the ledger in words.
fn lines_ok(o: &Order, ledger: &[sas_order_service::LedgerEntry]) -> (bool, String) {
    let mine: Vec<_> = ledger.iter().filter(|e| e.order == o.id).collect();
    let lines = o.items.as_array().map_or(0, Vec::len) as u64;
    let of = |op: &str| -> Vec<u64> {
        let mut v: Vec<u64> =
            mine.iter().filter(|e| e.op == op).filter_map(|e| e.detail.get("line").and_then(Value::as_u64)).collect();
        v.sort_unstable();
        v
    };
    let count = |op: &str| mine.iter().filter(|e| e.op == op).count();
    let (reserved, released) = (of("reserve"), of("release"));
    let text = format!(
        "lines reserved {reserved:?}, released {released:?}; charge x{}, refund x{}, fraud check x{}, ship x{}",
        count("charge"),
        count("refund"),
        count("screen"),
        count("ship")
    );
    let all = (0..lines).collect::<Vec<_>>();
    let good = if o.expect == ProcessState::Processed {
        reserved == all && released.is_empty() && count("charge") == 1 && count("screen") == 1 && count("ship") == 1
    } else if o.id.ends_with("lines-fraud") {
        // the charge ran beside the refused check: charged and refunded once, or never charged
        reserved == all
            && released == all
            && count("charge") <= 1
            && count("refund") == count("charge")
            && count("screen") == 0
            && count("ship") == 0
    } else {
        reserved == released && count("charge") == 0 && count("ship") == 0 && !reserved.contains(&1)
    };
    (good, text)
}

/// The late order's confirmation delay: after both ship attempts expired (each a 5 s start budget
/// plus a 3 s heartbeat window plus the result grace) and the order was compensated.
const LATE_MS: u64 = 60_000;

/// Orders on `order-decide`: the fraud score decides between a review and shipping (through the
/// `shipping` workflow, a child task), the charge is sent only what the payment service wants, a
/// gift-wrap runs only when asked for and its failure does not fail the order.
fn decide_orders(run: &str) -> Vec<Order> {
    let o = |n: &str, what, extra, faults, expect, min_failures, effects| Order {
        id: format!("{run}-{n}"),
        what,
        workflow: "order-decide",
        faults,
        expect,
        min_failures,
        effects,
        items: json!([{"sku": "book", "qty": 1}]),
        extra,
    };
    let none = || json!({});
    vec![
        o("decide", "score 5: shipped by the shipping workflow", none(), none(), ProcessState::Processed, 0, DECIDED),
        o(
            "decide-gift",
            "a gift: wrapped, then shipped",
            json!({"gift": true}),
            none(),
            ProcessState::Processed,
            0,
            &["reserve", "screen", "charge", "wrap", "ship"],
        ),
        o(
            "decide-no-paper",
            "a gift, no paper left: shipped unwrapped",
            json!({"gift": true}),
            json!({"gift/wrap": {"permanent": "out of paper"}}),
            ProcessState::Processed,
            1,
            DECIDED,
        ),
        o(
            "decide-review",
            "score 95: reviewed, not shipped",
            json!({"risk": 95}),
            none(),
            ProcessState::Processed,
            0,
            &["reserve", "screen", "charge", "screen"],
        ),
        o(
            "decide-no-address",
            "shipping refuses: its workflow fails, refund, release",
            none(),
            json!({"shipping/ship": {"permanent": "address unknown"}}),
            ProcessState::Compensated,
            1,
            &["reserve", "screen", "charge", "refund", "release"],
        ),
    ]
}

const DECIDED: &[&str] = &["reserve", "screen", "charge", "ship"];

/// The path a task took: the steps that ran (a failure its step handled, and a child workflow's
/// end, said so) and those skipped.
fn path_of(t: &Task) -> String {
    use sas_protocol::protocol::StepStatus;
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    for (s, def) in t.steps.iter().zip(&t.workflow.steps) {
        let name = s.name.as_str();
        match s.status {
            StepStatus::Skipped => skipped.push(name),
            StepStatus::Pending => {}
            StepStatus::Succeeded if let Some(w) = def.kind.child_workflow() => {
                ran.push(format!("{name} (workflow {})", w.workflow));
            }
            StepStatus::Succeeded => match s.output.as_ref().and_then(|o| o.get("score")) {
                Some(score) => ran.push(format!("{name} (score {score})")),
                None => ran.push(name.to_owned()),
            },
            _ if s.result().is_some() => ran.push(format!("{name} (failed, went on)")),
            other => ran.push(format!("{name} ({})", format!("{other:?}").to_lowercase())),
        }
    }
    let mut out = ran.join(" -> ");
    if !skipped.is_empty() {
        let _ = write!(out, "; skipped {}", skipped.join(", "));
    }
    out
}

/// The order on `order-track`: shipped, then its shipment followed by a loop that asks for its
/// status once a second until it is delivered (the order service's carrier delivers at the
/// third check: [`sas_order_service::TRACKS_TO_DELIVERY`]), each check an iteration of its own.
fn track_orders(run: &str) -> Vec<Order> {
    const TRACKED: &[&str] = &["reserve", "charge", "ship", "track", "track", "track"];
    vec![Order {
        id: format!("{run}-track"),
        what: "shipped, then tracked once a second until delivered (a loop)",
        workflow: "order-track",
        faults: json!({}),
        expect: ProcessState::Processed,
        min_failures: 0,
        effects: TRACKED,
        items: json!([{"sku": "book", "qty": 1}]),
        extra: json!({}),
    }]
}

/// Orders on `order-async`: shipping is a callback step (the service accepts at once, heartbeats,
/// confirms on the callback queue); one answered on time, one late, one never.
fn async_orders(run: &str) -> Vec<Order> {
    let o = |n: &str, what, faults, expect, min_failures, effects| Order {
        id: format!("{run}-{n}"),
        what,
        workflow: "order-async",
        faults,
        expect,
        min_failures,
        effects,
        items: json!([{"sku": "book", "qty": 1}]),
        extra: json!({}),
    };
    vec![
        o(
            "ship-async",
            "async shipping: accepted, heartbeats, confirmed ~3 s later",
            json!({}),
            ProcessState::Processed,
            0,
            DONE,
        ),
        o(
            "ship-late",
            "async shipping confirms after 60 s: compensated, then late",
            json!({"shipping/ship": {"callback_late_ms": LATE_MS}}),
            ProcessState::Compensated,
            2,
            &["reserve", "charge", "refund", "release", "ship"],
        ),
        o(
            "ship-never",
            "async shipping never answers: retried, compensated",
            json!({"shipping/ship": {"callback_never": true}}),
            ProcessState::Compensated,
            2,
            &["reserve", "charge", "refund", "release"],
        ),
    ]
}

/// The callback answers of the demo's own queue, applied as the callback queue's handler does,
/// until `stop` (local mode: a queue of the run, named in the agents' hand-over).
async fn consume_callbacks(
    sqs: aws_sdk_sqs::Client,
    deps: Arc<Deps>,
    queue: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let got = tokio::select! {
            got = sqs.receive_message().queue_url(&queue).max_number_of_messages(10).wait_time_seconds(1).send() => got,
            _ = stop.changed() => return,
        };
        let msgs = match got {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "receiving callbacks");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for m in msgs {
            let handled = match sas_core::callback::parse(m.body().unwrap_or_default()) {
                Ok(msg) => sas_core::callback::answer(&deps, &msg, m.message_id()).await.map(drop),
                Err(e) => Err(e),
            };
            match handled {
                Ok(()) | Err(sas_core::deps::HandlerError::Malformed(_)) => {
                    if let Some(h) = m.receipt_handle() {
                        let _ = sqs.delete_message().queue_url(&queue).receipt_handle(h).send().await;
                    }
                }
                // delivered again after the visibility timeout
                Err(e) => tracing::warn!(error = %e, "callback answer not applied; it will be retried"),
            }
        }
    }
}

async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String> {
    sqs.get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(aws_sdk_sqs::Error::from)?
        .attributes
        .unwrap_or_default()
        .remove(&QueueAttributeName::QueueArn)
        .context("queue has no ARN")
}

/// Receive and delete everything in `url`: (body, RejectReason attribute if any).
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<Vec<(String, Option<String>)>> {
    let mut bodies = Vec::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("RejectReason")
            .send()
            .await
            .map_err(aws_sdk_sqs::Error::from)?;
        let msgs = out.messages.unwrap_or_default();
        if msgs.is_empty() {
            return Ok(bodies);
        }
        for m in msgs {
            if let Some(h) = m.receipt_handle {
                sqs.delete_message().queue_url(url).receipt_handle(h).send().await.map_err(aws_sdk_sqs::Error::from)?;
            }
            let reason =
                m.message_attributes.as_ref().and_then(|a| a.get("RejectReason")).and_then(|v| v.string_value.clone());
            bodies.push((m.body.unwrap_or_default(), reason));
        }
    }
}

/// Each order's steps and attempts on its time axis (what `sasctl status` shows, without the
/// history and the outputs).
fn print_timelines(orders: &[Order], tasks: &BTreeMap<String, Task>) {
    let opts = timeline::Options::compact(std::io::stdout().is_terminal());
    let now = Millis::now();
    println!("\n  timelines (`sasctl status <order>` adds the whole history and the outputs):");
    for o in orders {
        let Some(t) = tasks.get(&o.id) else { continue };
        println!();
        for line in timeline::render(t, now, &opts).lines() {
            println!("    {line}");
        }
    }
}

fn render(orders: &[Order], tasks: &BTreeMap<String, Task>, elapsed: Duration) -> String {
    let mut s = format!("{:<26} {:<13} {:<9} {:>5}  {}\n", "order", "state", "step", "fails", "scenario");
    for o in orders {
        let (state, step, fails) = tasks.get(&o.id).map_or(("(queued)".to_owned(), "-".to_owned(), 0), |t| {
            (t.process_state.to_string(), t.current_step_name().unwrap_or("-").to_owned(), t.failure_count)
        });
        let _ = writeln!(s, "{:<26} {:<13} {:<9} {:>5}  {}", o.id, state, step, fails, o.what);
    }
    let _ = writeln!(s, "[{:>3} s]", elapsed.as_secs());
    s
}

/// Local mode: every role runs in this process (the local runner), against a stack deployed with
/// the functions off.
pub async fn run(sdk: &aws_config::SdkConfig, deps: Deps, timeout: Duration) -> Result<bool> {
    let deps = Arc::new(deps);
    let (base, service) = sas_order_service::spawn_local().await.context("starting the order service")?;
    println!("order service (inventory, payment, shipping) listening on {base}");
    // Callback steps' answers: a queue of this run, consumed here as the callback queue's handler.
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let name = format!("sas-demo-callbacks-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let callbacks = sqs.create_queue().queue_name(&name).send().await.map_err(aws_sdk_sqs::Error::from)?;
    let callbacks = callbacks.queue_url.context("no queue url")?;
    println!("callback answers on {callbacks}");
    let vars = |k: &str| match k {
        "ORDER_SERVICE_URL" => Some(base.clone()),
        "CALLBACK_QUEUE_URL" => Some(callbacks.clone()),
        _ => None,
    };
    let agents = AgentRuntime::from_config(BUILT_IN_AGENTS, &vars)?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let consumer = tokio::spawn(consume_callbacks(sqs.clone(), deps.clone(), callbacks.clone(), stopped));
    let handle = Runner::new(
        deps.clone(),
        Arc::new(agents),
        RunnerOptions { sweep_every: Duration::from_secs(2), ..RunnerOptions::default() },
    )
    .spawn();
    let ok = scenario(sdk, &deps, &service, Some(handle), true, timeout).await;
    let _ = stop.send(true);
    let _ = consumer.await;
    let _ = sqs.delete_queue().queue_url(&callbacks).send().await;
    ok
}

/// Lambda mode: the five functions deployed on LocalStack (a fresh stack `name`, their bootstraps
/// from `functions`), invoked by its SQS event source mappings and the scheduled rule; the order
/// service runs here and the Agent function reaches it through `ORDER_SERVICE_URL` (the template's
/// `OrderServiceUrl`). Writes the stack outputs to `outputs`. Ends with what the functions' log
/// groups show.
pub async fn run_lambda(
    sdk: &aws_config::SdkConfig,
    name: &str,
    functions: &Path,
    config: &Path,
    outputs: &Path,
    timeout: Duration,
) -> Result<bool> {
    let (base, service) = sas_order_service::spawn_local().await.context("starting the order service")?;
    println!("order service (inventory, payment, shipping) listening on {base}");
    let cfn = aws_sdk_cloudformation::Client::new(sdk);
    if sas_cli::stack::outputs(&cfn, name).await.is_ok() {
        println!("deleting the previous stack {name}");
        sas_cli::stack::delete_and_wait(&cfn, name, Duration::from_mins(2)).await?;
    }
    // The functions run with the settings this process runs with (QUEUE_BUDGET_MS, ...).
    let settings = Settings::from_env()?;
    let p = &settings.policy;
    let values = [
        ("StartTimeoutMs", p.start_timeout_ms.to_string()),
        ("QueueBudgetMs", p.queue_budget_ms.to_string()),
        ("ResultGraceMs", p.result_grace_ms.to_string()),
        ("SettleMs", p.settle_ms.to_string()),
        ("MaxInputBytes", settings.max_input_bytes.to_string()),
        ("RetentionDays", settings.retention_days.to_string()),
        ("OrderServiceUrl", base.clone()),
    ];
    let params: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
    println!("deploying stack {name} with the functions on; the Agent gets ORDER_SERVICE_URL={base}");
    let out = sas_cli::lambda::deploy_and_report(sdk, name, functions, config, &params).await?;
    if let Some(dir) = outputs.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(outputs, sas_cli::stack::outputs_json(&out))?;
    println!("stack outputs in {}\n", outputs.display());
    let deps = Arc::new(Deps::aws(sdk, Resources::from_outputs(&out)?, WorkflowRegistry::from_env()?, settings));
    // The async orders need the stack's callback queue (the Agent's CALLBACK_QUEUE_URL).
    let async_orders = out.contains_key("CallbackQueueUrl");
    if !async_orders {
        println!("the stack has no callback queue: the async shipping orders are left out");
    }
    let mut ok = scenario(sdk, &deps, &service, None, async_orders, timeout).await?;

    let logs = aws_sdk_cloudwatchlogs::Client::new(sdk);
    println!("\n  function invocations (LocalStack's event sources and rule; CloudWatch Logs /aws/lambda/<fn>):");
    let mut metrics = Emf::default();
    for (id, fname) in sas_cli::lambda::function_names(&out)? {
        let messages = sas_cli::lambda::log_messages(&logs, &fname).await?;
        let n = sas_cli::lambda::invocations(&messages);
        let errors = messages.iter().filter(|m| m.contains("\"level\":\"ERROR\"")).count();
        let records = metrics.add(&messages);
        ok &= n > 0;
        println!(
            "    {} {:<19} {:>4} invocations, {:>3} error lines, {:>3} EMF records   /aws/lambda/{fname}",
            if n > 0 { "ok  " } else { "FAIL" },
            id,
            n,
            errors,
            records
        );
    }
    ok &= metrics.report();
    println!(
        "\n{}",
        if ok { "every function ran, and every order reached its end" } else { "LAMBDA MODE DID NOT DO EVERYTHING" }
    );
    Ok(ok)
}

/// What the demo found once its orders ended, for its summary.
struct Ends<'a> {
    orders: &'a [Order],
    tasks: &'a BTreeMap<String, Task>,
    with_async: bool,
    /// The order whose shipping is confirmed too late.
    late: Option<&'a str>,
    statuses: usize,
    rejected: &'a [String],
    alerts: &'a [(String, Option<String>)],
    ledger: &'a [sas_order_service::LedgerEntry],
    elapsed_secs: u64,
}

/// The demo's summary (each order's end against what it was set up for, the asynchronous orders,
/// the counts, the rejected submission, the alerts, the service's ledger), and whether every
/// check held. The README shows an excerpt of it; a test keeps the two in step.
fn summary(e: &Ends<'_>) -> (String, bool) {
    let mut out = String::new();
    let _ = writeln!(out, "\nsummary after {} s", e.elapsed_secs);
    let mut ok = true;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for o in e.orders {
        let t = e.tasks.get(&o.id);
        let state = t.map(|t| t.process_state);
        *counts.entry(state.map_or("missing".into(), |s| s.to_string())).or_default() += 1;
        let good = state == Some(o.expect) && t.is_some_and(|t| t.failure_count >= o.min_failures);
        ok &= good;
        let _ = writeln!(
            out,
            "  {} {:<26} expected {:<12} got {:<12} failures {}",
            if good { "ok  " } else { "FAIL" },
            o.id,
            o.expect.to_string(),
            state.map_or("-".into(), |s| s.to_string()),
            t.map_or(0, |t| t.failure_count)
        );
    }
    if e.with_async {
        let _ = writeln!(out, "\n  asynchronous shipping (callback steps):");
        for o in e.orders.iter().filter(|o| o.workflow == "order-async") {
            let Some(t) = e.tasks.get(&o.id) else { continue };
            let ship = t.steps.iter().find(|s| s.name == "ship");
            let mut what = format!("{}; ship attempts {}", t.process_state, ship.map_or(0, |s| s.attempts));
            if t.late.count > 0 {
                let _ = write!(what, "; late results {} ({})", t.late.count, t.late.last.as_deref().unwrap_or("-"));
            }
            if let Some(r) = &t.reason {
                let _ = write!(what, "; {r}");
            }
            let _ = writeln!(out, "    {:<26} {what}", o.id);
        }
        let late_ok = e.late.is_some_and(|l| e.tasks.get(l).is_some_and(|t| t.late.count == 1));
        let late_alert = e.alerts.iter().any(|(a, _)| a.contains("late_result"));
        let _ = writeln!(
            out,
            "  the late confirmation was recorded on its order and alerted: {}",
            if late_ok && late_alert { "yes" } else { "NO" }
        );
        ok &= late_ok && late_alert;
    }
    let tracked: Vec<&Order> = e.orders.iter().filter(|o| o.workflow == "order-track").collect();
    if !tracked.is_empty() {
        let _ = writeln!(
            out,
            "\n  a loop (order-track), tracked once a second until delivered, then announced by an aws step:"
        );
        for o in tracked {
            let Some(t) = e.tasks.get(&o.id) else { continue };
            let output = |name: &str| t.steps.iter().find(|s| s.name == name).and_then(|s| s.output.clone());
            let track = output("track").unwrap_or_default();
            let announce = output("announce").unwrap_or_default();
            let delivered = track["status"] == "delivered";
            let announced = announce["event_id"].is_string() && announce["failed"] == 0;
            ok &= delivered && announced;
            let _ = writeln!(
                out,
                "    {} {:<26} {} at check {}, event {}",
                if delivered && announced { "ok  " } else { "FAIL" },
                o.id,
                track["status"].as_str().unwrap_or("-"),
                track["checks"],
                announce["event_id"].as_str().unwrap_or("not put")
            );
        }
    }
    let decided: Vec<&Order> = e.orders.iter().filter(|o| o.workflow == "order-decide").collect();
    if !decided.is_empty() {
        let _ = writeln!(out, "\n  decisions (order-decide), the path each took:");
        for o in decided {
            let Some(t) = e.tasks.get(&o.id) else { continue };
            let _ = writeln!(out, "    {:<26} {}", o.id, path_of(t));
        }
    }
    let retried = e.tasks.values().filter(|t| t.failure_count > 0).count();
    let count = |state: &str| counts.get(state).copied().unwrap_or(0);
    let _ =
        writeln!(out,
        "\n  processed {}, compensated {}, error {}, cancelled {}, rejected {}; retried (FailureCount > 0) {retried}",
        count("Processed"),
        count("Compensated"),
        count("Error"),
        count("Cancelled"),
        e.rejected.len()
    );
    let _ = writeln!(out, "  status messages on the reply queue: {}", e.statuses);
    let _ = writeln!(
        out,
        "  rejected submissions (kept in the submission DLQ): {} ({})",
        e.rejected.len(),
        e.rejected.join("; ")
    );
    let _ = writeln!(out, "  operator alerts: {}", e.alerts.len());
    for (a, _) in e.alerts {
        let v: Value = serde_json::from_str(a).unwrap_or_default();
        let _ = writeln!(
            out,
            "    - {} {}: {}",
            v["kind"].as_str().unwrap_or("?"),
            v["task_id"].as_str().unwrap_or("?"),
            v["reason"].as_str().unwrap_or("")
        );
    }
    let mut ledger_ok = true;
    let _ = writeln!(out, "\n  order service ledger (effects applied, per order):");
    for o in e.orders {
        let (good, text) = if o.workflow == "order-lines" {
            lines_ok(o, e.ledger)
        } else {
            let got: Vec<String> = e.ledger.iter().filter(|l| l.order == o.id).map(|l| l.op.clone()).collect();
            (got == o.effects, got.join(" -> "))
        };
        ledger_ok &= good;
        let _ = writeln!(out, "    {} {:<26} {text}", if good { "ok  " } else { "FAIL" }, o.id);
    }
    let keys: std::collections::HashSet<&str> = e.ledger.iter().map(|l| l.idempotency_key.as_str()).collect();
    let exactly_once = keys.len() == e.ledger.len();
    let _ = writeln!(
        out,
        "  every effect applied exactly once (no idempotency key twice in the ledger): {}",
        if exactly_once { "yes" } else { "NO" }
    );
    ok &= ledger_ok && exactly_once;
    let dup_ok = e
        .tasks
        .get(&e.orders[0].id)
        .is_some_and(|t| t.history.iter().filter(|h| h.seq == 1).count() == 1 && t.steps[0].attempts == 1);
    let _ = writeln!(out, "  duplicate submission created nothing new: {}", if dup_ok { "yes" } else { "NO" });
    ok &= dup_ok && e.rejected.len() == 1 && !e.alerts.is_empty();
    (out, ok)
}

/// Submit the sample orders, watch them, stop the runner if there is one, and check their ends.
async fn scenario(
    sdk: &aws_config::SdkConfig,
    deps: &Arc<Deps>,
    service: &sas_order_service::OrderService,
    runner: Option<RunnerHandle>,
    with_async: bool,
    timeout: Duration,
) -> Result<bool> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let run = format!("demo{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let res = deps.resources.clone();

    // The caller's private reply queue, and an operator's alert inbox on the topic.
    // Named on the stack's allow-list (by default `<stack>-reply-*`): any other reply_to is refused.
    let reply_name = sas_core::reply::queue_name(&res, &run)
        .context("the stack's ReplyQueueArnPattern names no queue prefix: the demo cannot name a reply queue on it")?;
    let reply = sqs.create_queue().queue_name(reply_name).send().await.map_err(aws_sdk_sqs::Error::from)?;
    let reply = reply.queue_url.context("no queue url")?;
    let inbox =
        sqs.create_queue().queue_name(format!("{run}-alerts")).send().await.map_err(aws_sdk_sqs::Error::from)?;
    let inbox = inbox.queue_url.context("no queue url")?;
    aws_sdk_sns::Client::new(sdk)
        .subscribe()
        .topic_arn(&res.alert_topic_arn)
        .protocol("sqs")
        .endpoint(queue_arn(&sqs, &inbox).await?)
        .attributes("RawMessageDelivery", "true")
        .attributes("FilterPolicy", r#"{"kind": [{"exists": true}]}"#)
        .send()
        .await
        .map_err(aws_sdk_sns::Error::from)?;

    let mut orders = orders(&run);
    orders.extend(line_orders(&run));
    orders.extend(decide_orders(&run));
    orders.extend(track_orders(&run));
    if with_async {
        orders.extend(async_orders(&run));
    }
    let late = orders.iter().find(|o| o.id.ends_with("-ship-late")).map(|o| o.id.clone());
    // hung-stock: inventory hangs until the supervisor has counted the timed-out attempt.
    let hung = orders.iter().find(|o| o.id.ends_with("hung-stock")).map(|o| o.id.clone()).expect("listed");
    service.add_fault(serde_json::from_value(json!({"order": hung, "endpoint": "/inventory/reserve", "hang": true}))?);
    let mut hung_lifted = false;
    let mut bodies: Vec<String> = orders
        .iter()
        .map(|o| {
            serde_json::to_string(&Submission {
                v: VERSION,
                task_id: Some(TaskId::try_from(o.id.as_str()).expect("valid id")),
                workflow: o.workflow.into(),
                workflow_version: None,
                input: {
                    let mut input =
                        json!({"customer": "c-42", "items": o.items, "amount_cents": 1999, "faults": o.faults});
                    if let (Some(i), Some(extra)) = (input.as_object_mut(), o.extra.as_object()) {
                        i.extend(extra.clone());
                    }
                    input
                },
                reply_to: Some(reply.clone()),
                priority: None,
                schedule: None,
            })
            .expect("serialises")
        })
        .collect();
    bodies.push(bodies[0].clone()); // a duplicate submission: nothing new is created
    bodies.push(format!(r#"{{"v": 1, "task_id": "{run}-broken", "workflow": "order", "input": {{"#)); // malformed
    println!(
        "submitting {} messages ({} orders, 1 duplicate, 1 malformed) to {}\n",
        bodies.len(),
        orders.len(),
        res.submission_queue_url
    );
    for b in bodies {
        sqs.send_message()
            .queue_url(&res.submission_queue_url)
            .message_body(b)
            .send()
            .await
            .map_err(aws_sdk_sqs::Error::from)?;
    }

    let started = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    let mut tasks = BTreeMap::new();
    loop {
        for o in &orders {
            if let Some(t) = deps.store.get(&TaskId::try_from(o.id.as_str())?).await? {
                tasks.insert(o.id.clone(), t);
            }
        }
        if !hung_lifted && tasks.get(&hung).is_some_and(|t| t.failure_count >= 1) {
            service.clear_faults(Some(&hung));
            hung_lifted = true;
        }
        let table = render(&orders, &tasks, started.elapsed());
        let body = table.rsplit_once('[').map_or(table.as_str(), |(b, _)| b).to_owned();
        if tty {
            print!("\x1b[2J\x1b[H{table}");
        } else if body != last {
            println!("{table}");
        }
        last = body;
        // ... and the late confirmation has come (after its order ended)
        let done = orders.iter().all(|o| tasks.get(&o.id).is_some_and(|t| t.process_state.is_terminal()))
            && late.as_ref().is_none_or(|l| tasks.get(l).is_some_and(|t| t.late.count > 0));
        if done || started.elapsed() > timeout {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if let Some(handle) = runner {
        handle.shutdown().await;
    }

    let statuses = drain(&sqs, &reply).await?;
    let alerts = drain(&sqs, &inbox).await?;
    // Refused submissions are kept in the submission DLQ with their reason.
    let rejected: Vec<String> = drain(&sqs, &res.submission_dlq_url)
        .await?
        .into_iter()
        .filter(|(body, _)| body.contains(&run))
        .filter_map(|(_, reason)| reason)
        .collect();

    let ledger = service.ledger();
    let (text, ok) = summary(&Ends {
        orders: &orders,
        tasks: &tasks,
        with_async,
        late: late.as_deref(),
        statuses: statuses.len(),
        rejected: &rejected,
        alerts: &alerts,
        ledger: &ledger,
        elapsed_secs: started.elapsed().as_secs(),
    });
    print!("{text}");
    print_timelines(&orders, &tasks);
    println!(
        "\n{}",
        if ok { "every order reached the end it was set up for" } else { "SOME ORDERS DID NOT END AS EXPECTED" }
    );
    Ok(ok)
}

/// The metrics the functions wrote to their logs (EMF records), each checked against the format's
/// specification, summed by name.
#[derive(Default)]
struct Emf {
    records: usize,
    invalid: Vec<String>,
    totals: BTreeMap<String, f64>,
}

impl Emf {
    /// Take the EMF records among `messages`; how many there were.
    fn add(&mut self, messages: &[String]) -> usize {
        let mut n = 0;
        for line in messages.iter().filter(|m| m.contains("\"_aws\"")) {
            n += 1;
            match sas_core::metrics::check_emf(line) {
                Ok(rec) => {
                    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
                    for (name, _, _) in rec.metrics {
                        let x = match &v[&name] {
                            serde_json::Value::Array(a) => f64::from(u32::try_from(a.len()).unwrap_or(u32::MAX)),
                            x => x.as_f64().unwrap_or(0.0),
                        };
                        *self.totals.entry(name).or_default() += x;
                    }
                }
                Err(e) => self.invalid.push(format!("{e}: {line}")),
            }
        }
        self.records += n;
        n
    }

    /// Print the sums; whether every record was valid and there were some.
    fn report(&self) -> bool {
        let sums: Vec<String> = self.totals.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "\n  metrics the functions wrote (CloudWatch EMF records in their logs; durations: how many values):\n    {}",
            if sums.is_empty() { "none".to_owned() } else { sums.join(", ") }
        );
        if self.invalid.is_empty() && self.records > 0 {
            println!("    ok   all {} records valid against the EMF specification", self.records);
            true
        } else {
            println!("    FAIL {} of {} records invalid: {:?}", self.invalid.len(), self.records, self.invalid);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_order_service::LedgerEntry;
    use sas_protocol::protocol::{self, Ctx, HistoryEntry};
    use sas_protocol::workflow::BUILT_IN_WORKFLOWS;

    /// A run in which every order ended as it was set up to, with the ledger that goes with it.
    fn ended(run: &str) -> (Vec<Order>, BTreeMap<String, Task>, Vec<LedgerEntry>) {
        let all = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).expect("the built-in workflows");
        let mut orders = orders(run);
        orders.extend(line_orders(run));
        orders.extend(decide_orders(run));
        orders.extend(track_orders(run));
        orders.extend(async_orders(run));
        let (mut tasks, mut ledger) = (BTreeMap::new(), Vec::new());
        let mut effect = |order: &str, op: &str, detail: Value| {
            let seq = ledger.len() as u64 + 1;
            let key = format!("{order}:{op}:{seq}");
            ledger.push(LedgerEntry {
                seq,
                order: order.into(),
                op: op.into(),
                idempotency_key: key,
                at_ms: 0,
                detail,
            });
        };
        for o in &orders {
            let wf = all.resolve(o.workflow, None).expect("the order's workflow").clone();
            let id = TaskId::try_from(o.id.as_str()).unwrap();
            let policy = protocol::Policy::default();
            let mut t = protocol::submit(id, wf, json!({}), None, &Ctx::at(Millis(1_000)), &policy).task;
            t.process_state = o.expect;
            t.failure_count = o.min_failures;
            if o.expect == ProcessState::Compensated {
                t.reason = Some("a step failed for good".into());
            }
            t.steps[0].attempts = 1;
            t.history = vec![HistoryEntry {
                seq: 1,
                state: ProcessState::Processing,
                step: Some(t.steps[0].name.clone()),
                failure_count: 0,
                reason: None,
                at: Millis(1_000),
                waiting: false,
            }];
            if o.workflow == "order-decide" {
                decided(&mut t, o);
            }
            if o.workflow == "order-track" {
                let track = t.steps.iter_mut().find(|s| s.name == "track").expect("order-track's loop");
                track.output = Some(json!({"status": "delivered", "checks": 3}));
                let announce = t.steps.iter_mut().find(|s| s.name == "announce").expect("order-track's announce");
                announce.output = Some(json!({"event_id": "5f0e7a52-8c1d-4b8e-9d3a-2b6c71e0f4a9", "failed": 0}));
            }
            if o.id.ends_with("-ship-late") {
                t.late.count = 1;
                t.late.last = Some("succeeded after the step had expired".into());
                if let Some(ship) = t.steps.iter_mut().find(|s| s.name == "ship") {
                    ship.attempts = 2;
                }
            }
            if o.workflow == "order-lines" {
                let lines = o.items.as_array().map_or(0, Vec::len);
                if o.expect == ProcessState::Processed {
                    (0..lines).for_each(|i| effect(&o.id, "reserve", json!({"line": i})));
                    for op in ["charge", "screen", "ship"] {
                        effect(&o.id, op, json!({}));
                    }
                } else if o.id.ends_with("lines-fraud") {
                    (0..lines).for_each(|i| effect(&o.id, "reserve", json!({"line": i})));
                    effect(&o.id, "charge", json!({}));
                    effect(&o.id, "refund", json!({}));
                    (0..lines).for_each(|i| effect(&o.id, "release", json!({"line": i})));
                } else {
                    effect(&o.id, "reserve", json!({"line": 0}));
                    effect(&o.id, "release", json!({"line": 0}));
                }
            } else {
                for op in o.effects {
                    effect(&o.id, op, json!({}));
                }
            }
            tasks.insert(o.id.clone(), t);
        }
        (orders, tasks, ledger)
    }

    /// An `order-decide` task's steps as its order's run leaves them.
    fn decided(t: &mut Task, o: &Order) {
        use sas_protocol::protocol::StepStatus::{Failed, Pending, Skipped, Succeeded};
        let risky = o.extra.get("risk").is_some();
        let gift = o.extra.get("gift").is_some();
        let no_paper = o.id.ends_with("-no-paper");
        let no_address = o.id.ends_with("-no-address");
        let statuses = [
            Succeeded,
            Succeeded,
            Succeeded,
            if !gift {
                Skipped
            } else if no_paper {
                Failed
            } else {
                Succeeded
            },
            if risky { Succeeded } else { Skipped },
            if risky {
                Skipped
            } else if no_address {
                Failed
            } else {
                Succeeded
            },
        ];
        for (s, status) in t.steps.iter_mut().zip(statuses) {
            s.status = if o.expect == ProcessState::Compensated && status == Pending { Pending } else { status };
        }
        t.steps[1].output = Some(json!({"score": if risky { 95 } else { 5 }, "verdict": "clear"}));
        if risky {
            t.steps[4].output = Some(json!({"score": 95, "verdict": "review"}));
        }
        if no_paper {
            t.steps[3].output = Some(json!({"error": {"kind": "permanent", "message": "out of paper"}}));
        }
    }

    /// Whether `line` is `pattern`, where each `…` of the pattern stands for any text.
    fn matches(pattern: &str, line: &str) -> bool {
        let parts: Vec<&str> = pattern.split('…').collect();
        let (first, last) = (parts[0], parts[parts.len() - 1]);
        if parts.len() == 1 {
            return line == pattern;
        }
        if !line.starts_with(first) || !line.ends_with(last) || line.len() < first.len() + last.len() {
            return false;
        }
        let mut rest = &line[first.len()..line.len() - last.len()];
        for p in &parts[1..parts.len() - 1] {
            match rest.find(p) {
                Some(i) => rest = &rest[i + p.len()..],
                None => return false,
            }
        }
        true
    }

    /// The README's excerpt of the demo's output is what the demo prints: each of its lines (its
    /// `←` notes left out; `…` for what varies from run to run) is a line of the summary of a run
    /// in which every order ended as set up, in the same order; its closing lines are the demo's.
    #[test]
    fn the_readme_s_excerpt_of_the_demo_is_what_the_demo_prints() {
        let run = "demofbb444";
        let (orders, tasks, ledger) = ended(run);
        let rejected = vec!["the message is not JSON: EOF while parsing an object at line 1 column 72".to_owned()];
        let alerts = vec![(
            format!(r#"{{"kind": "late_result", "task_id": "{run}-ship-late", "reason": "late"}}"#),
            None::<String>,
        )];
        let (text, ok) = summary(&Ends {
            orders: &orders,
            tasks: &tasks,
            with_async: true,
            late: orders.iter().find(|o| o.id.ends_with("-ship-late")).map(|o| o.id.as_str()),
            statuses: 60,
            rejected: &rejected,
            alerts: &alerts,
            ledger: &ledger,
            elapsed_secs: 95,
        });
        assert!(ok, "every check holds on a run that ended as set up:\n{text}");
        let readme = include_str!("../../../README.md");
        let start = readme.find("\nsummary after").expect("the README's excerpt of the demo");
        let excerpt = &readme[start + 1..];
        let excerpt = &excerpt[..excerpt.find("```").expect("the excerpt's end")];
        let rendered: Vec<&str> = text.lines().collect();
        let mut at = 0;
        let source = include_str!("demo.rs");
        for line in excerpt.lines() {
            let line = line.split("   ←").next().unwrap_or(line).trim_end();
            // an elided stretch, or a closing line printed after the summary
            if line.trim().is_empty() || line.trim_start().starts_with('…') {
                continue;
            }
            if !line.starts_with(' ') && !line.starts_with("summary") {
                assert!(
                    source.contains(&format!("\"{line}\"")),
                    "the README's closing line {line:?} is not the demo's"
                );
                continue;
            }
            let found = rendered[at..].iter().position(|r| matches(line, r));
            let Some(i) = found else {
                panic!("the README's line {line:?} is not in the demo's summary (from line {at}):\n{text}")
            };
            at += i + 1;
        }
        assert!(at > 10, "the excerpt was checked ({at} lines of the summary reached)");
    }

    #[test]
    fn an_ellipsis_matches_any_text_and_only_there() {
        assert!(matches("summary after … s", "summary after 95 s"));
        assert!(!matches("summary after … s", "summary before 95 s"));
        assert!(matches("a … b … c", "a 1 b 2 c"));
        assert!(!matches("a … b … c", "a 1 c 2 b"));
        assert!(matches("exact", "exact") && !matches("exact", "exact!"));
    }
}
