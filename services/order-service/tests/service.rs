//! The order service over HTTP, started in-process on an ephemeral port.

use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use sas_order_service::{spawn_local, FaultRule, OrderService};
use serde_json::{json, Value};

struct Api {
    base: String,
    http: reqwest::Client,
    svc: OrderService,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").is_some_and(|v| v == "true")
    }
}

async fn start() -> Api {
    let (base, svc) = spawn_local().await.expect("spawn order service");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    Api { base, http, svc }
}

/// A request body as the HTTP agent sends it.
#[allow(clippy::needless_pass_by_value)]
fn body(order: &str, step: &str, attempt_no: u32, order_input: Value) -> Value {
    json!({"task_id": order, "step": step, "attempt_no": attempt_no, "input": {"input": order_input, "outputs": {}}})
}

fn book_order() -> Value {
    json!({"customer": "c-1", "items": [{"sku": "book", "qty": 1}], "amount_cents": 1999})
}

impl Api {
    async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let res = req.send().await.expect("request");
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON body {text:?}: {e}"));
        Reply { status, headers, body }
    }

    async fn post(&self, path: &str, key: Option<&str>, json: &Value) -> Reply {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(json);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        self.send(req).await
    }

    /// An effect call for `order` with the default order input.
    async fn call(&self, path: &str, key: &str, order: &str) -> Reply {
        self.post(path, Some(key), &body(order, "step", 1, book_order())).await
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(self.http.get(format!("{}{path}", self.base))).await
    }

    fn ledger_for(&self, order: &str) -> Vec<sas_order_service::LedgerEntry> {
        self.svc.ledger().into_iter().filter(|e| e.order == order).collect()
    }
}

#[tokio::test]
async fn healthz_and_unknown_routes() {
    let api = start().await;
    let r = api.get("/healthz").await;
    assert_eq!((r.status, r.body), (StatusCode::OK, json!({"ok": true})));
    let r = api.get("/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.body["error"].is_string());
}

#[tokio::test]
async fn same_key_twice_is_replayed_and_applied_once() {
    let api = start().await;
    let first = api.call("/payment/charge", "o1-charge", "o1").await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(!first.replayed());
    assert!(first.body["charge_id"].as_str().unwrap().starts_with("ch-"));
    assert_eq!(first.body["amount_cents"], 1999);

    let second = api.call("/payment/charge", "o1-charge", "o1").await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);

    let ledger = api.ledger_for("o1");
    assert_eq!(ledger.len(), 1);
    assert_eq!((ledger[0].op.as_str(), ledger[0].idempotency_key.as_str()), ("charge", "o1-charge"));
    assert_eq!(ledger[0].detail["charge_id"], first.body["charge_id"]);

    // GET /ledger answers the same data.
    let r = api.get("/ledger").await;
    assert_eq!(r.body["entries"], serde_json::to_value(api.svc.ledger()).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_apply_once() {
    let api = start().await;
    // Latency keeps the first request in flight while the others arrive.
    api.svc.add_fault(FaultRule { order: Some("o1".into()), latency_ms: 100, ..Default::default() });
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (http, url) = (api.http.clone(), format!("{}/inventory/reserve", api.base));
        tasks.push(tokio::spawn(async move {
            let res = http
                .post(url)
                .header("Idempotency-Key", "o1-reserve")
                .json(&body("o1", "reserve", 1, book_order()))
                .send()
                .await
                .unwrap();
            let replayed = res.headers().contains_key("idempotent-replayed");
            (res.status(), replayed, res.json::<Value>().await.unwrap())
        }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    assert!(replies.iter().all(|r| r.0 == StatusCode::OK && r.2 == replies[0].2), "{replies:?}");
    assert_eq!(replies.iter().filter(|r| r.1).count(), 9);
    assert!(replies[0].2["reservation_id"].as_str().unwrap().starts_with("res-"));
    assert_eq!(replies[0].2["items"], json!([{"sku": "book", "qty": 1}]));
    assert_eq!(api.ledger_for("o1").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_distinct_keys_all_apply() {
    let api = start().await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let (http, url) = (api.http.clone(), format!("{}/shipping/ship", api.base));
        tasks.push(tokio::spawn(async move {
            let res = http
                .post(url)
                .header("Idempotency-Key", format!("ship-{i}"))
                .json(&body(&format!("o{i}"), "ship", 1, json!({})))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let ledger = api.svc.ledger();
    assert_eq!(ledger.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());
    assert!(ledger.iter().all(|e| e.op == "ship" && e.detail["shipment_id"].as_str().unwrap().starts_with("shp-")));
}

#[tokio::test]
async fn release_and_refund_undo_only_what_was_done() {
    let api = start().await;
    // Nothing to undo yet: not an error, nothing recorded.
    let r = api.call("/inventory/release", "o1-release-early", "o1").await;
    assert_eq!((r.status, r.body), (StatusCode::OK, json!({"released": false})));
    let r = api.call("/payment/refund", "o1-refund-early", "o1").await;
    assert_eq!((r.status, r.body), (StatusCode::OK, json!({"refunded": false})));
    assert!(api.ledger_for("o1").is_empty());

    api.call("/inventory/reserve", "o1-reserve", "o1").await;
    api.call("/payment/charge", "o1-charge", "o1").await;

    let r = api.call("/inventory/release", "o1-release", "o1").await;
    assert_eq!(r.body, json!({"released": true}));
    let r = api.call("/inventory/release", "o1-release", "o1").await;
    assert_eq!(r.body, json!({"released": true}), "a replay answers what was saved");
    assert!(r.replayed());
    let r = api.call("/inventory/release", "o1-release-again", "o1").await;
    assert_eq!(r.body, json!({"released": false}), "a new key finds nothing left to release");

    let r = api.call("/payment/refund", "o1-refund", "o1").await;
    assert_eq!(r.body, json!({"refunded": true}));
    let r = api.call("/payment/refund", "o1-refund", "o1").await;
    assert_eq!((r.replayed(), r.body), (true, json!({"refunded": true})));
    let r = api.call("/payment/refund", "o1-refund-again", "o1").await;
    assert_eq!(r.body, json!({"refunded": false}));

    let ops: Vec<String> = api.ledger_for("o1").into_iter().map(|e| e.op).collect();
    assert_eq!(ops, ["reserve", "charge", "release", "refund"]);
    let refund = &api.ledger_for("o1")[3];
    assert_eq!(refund.detail["amount_cents"], 1999);

    // Another order's reservation is not released by this one's.
    api.call("/inventory/reserve", "o2-reserve", "o2").await;
    let r = api.call("/inventory/release", "o1-release-3", "o1").await;
    assert_eq!(r.body, json!({"released": false}));
}

#[tokio::test]
async fn charge_amount_defaults_to_1000_per_unit_and_order_fields_are_optional() {
    let api = start().await;
    let input = json!({"items": [{"sku": "book", "qty": 2}, {"sku": "pen", "qty": 3}]});
    let r = api.post("/payment/charge", Some("k1"), &body("o1", "charge", 1, input)).await;
    assert_eq!((r.status, &r.body["amount_cents"]), (StatusCode::OK, &json!(5000)));

    // No input at all: defaults everywhere.
    let r = api.post("/payment/charge", Some("k2"), &json!({"task_id": "o2"})).await;
    assert_eq!((r.status, &r.body["amount_cents"]), (StatusCode::OK, &json!(0)));
    let r = api.post("/inventory/reserve", Some("k3"), &json!({"task_id": "o2"})).await;
    assert_eq!((r.status, &r.body["items"]), (StatusCode::OK, &json!([])));
    let r = api.post("/shipping/ship", Some("k4"), &json!({"task_id": "o2", "input": null})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body["carrier"].is_string());
}

#[tokio::test]
async fn fail_times_answers_503_then_succeeds() {
    let api = start().await;
    let id = api.svc.add_fault(FaultRule {
        order: Some("o1".into()),
        endpoint: Some("/payment/charge".into()),
        fail_times: 2,
        ..Default::default()
    });
    for _ in 0..2 {
        let r = api.call("/payment/charge", "o1-charge", "o1").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.body["error"].is_string());
        assert!(!r.replayed());
        assert!(r.headers.get("retry-after").is_none());
    }
    assert!(api.ledger_for("o1").is_empty(), "a failure applies nothing");
    // The rule is per endpoint: reserve is unaffected.
    assert_eq!(api.call("/inventory/reserve", "o1-reserve", "o1").await.status, StatusCode::OK);

    let r = api.call("/payment/charge", "o1-charge", "o1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.replayed(), "transient failures are not saved");
    assert_eq!(api.ledger_for("o1").len(), 2);

    let faults = api.get("/faults").await.body;
    assert_eq!(faults["faults"][0]["id"], id);
    assert_eq!(faults["faults"][0]["matched"], 3);
    assert_eq!(faults["faults"][0]["fail_times"], 2);
}

#[tokio::test]
async fn retry_after_answers_429_and_is_not_saved() {
    let api = start().await;
    let r = api.post("/faults", None, &json!({"order": "o1", "fail_times": 1, "retry_after_s": 7})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body["id"].is_u64());

    let r = api.call("/shipping/ship", "o1-ship", "o1").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers.get("retry-after").unwrap(), "7");
    let r = api.call("/shipping/ship", "o1-ship", "o1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.replayed());
    assert_eq!(api.ledger_for("o1").len(), 1);
}

#[tokio::test]
async fn error_rate_one_always_fails_and_zero_never() {
    let api = start().await;
    api.svc.add_fault(FaultRule { order: Some("o1".into()), error_rate: 1.0, ..Default::default() });
    api.svc.add_fault(FaultRule { order: Some("o2".into()), error_rate: 0.0, ..Default::default() });
    for i in 0..3 {
        assert_eq!(api.call("/payment/charge", &format!("o1-{i}"), "o1").await.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.call("/payment/charge", &format!("o2-{i}"), "o2").await.status, StatusCode::OK);
    }
    assert!(api.ledger_for("o1").is_empty());
}

#[tokio::test]
async fn permanent_failure_is_saved_and_replayed() {
    let api = start().await;
    api.svc.add_fault(FaultRule {
        endpoint: Some("payment/charge".into()),
        permanent: Some("card declined".into()),
        ..Default::default()
    });
    let r = api.call("/payment/charge", "o1-charge", "o1").await;
    assert_eq!((r.status, r.body.clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!({"error": "card declined"})));
    assert!(!r.replayed());

    // Even with the fault gone, the key keeps its answer.
    api.svc.clear_faults(None);
    let r = api.call("/payment/charge", "o1-charge", "o1").await;
    assert_eq!((r.status, r.body.clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!({"error": "card declined"})));
    assert!(r.replayed());
    assert!(api.ledger_for("o1").is_empty());
}

#[tokio::test]
async fn hang_times_the_client_out_and_does_not_hold_the_key() {
    let api = start().await;
    api.svc.add_fault(FaultRule { order: Some("o1".into()), hang: true, ..Default::default() });
    let started = Instant::now();
    let err = api
        .http
        .post(format!("{}/inventory/reserve", api.base))
        .header("Idempotency-Key", "o1-reserve")
        .timeout(Duration::from_millis(300))
        .json(&body("o1", "reserve", 1, book_order()))
        .send()
        .await
        .expect_err("the service must not answer");
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(api.ledger_for("o1").is_empty());

    // The retry (same key) goes through once the fault is gone, without waiting for the hung one.
    assert_eq!(api.svc.clear_faults(Some("o1")), 1);
    let started = Instant::now();
    let r = api.call("/inventory/reserve", "o1-reserve", "o1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.replayed());
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(api.ledger_for("o1").len(), 1);
}

#[tokio::test]
async fn latency_delays_the_answer() {
    let api = start().await;
    api.svc.add_fault(FaultRule { order: Some("o1".into()), latency_ms: 200, ..Default::default() });
    let started = Instant::now();
    let r = api.call("/inventory/reserve", "o1-reserve", "o1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(200));

    // Replays do not consult faults.
    let started = Instant::now();
    let r = api.call("/inventory/reserve", "o1-reserve", "o1").await;
    assert!(r.replayed());
    assert!(started.elapsed() < Duration::from_millis(200));
}

#[tokio::test]
async fn faults_carried_in_the_request_body() {
    let api = start().await;
    let order = |customer: &str| {
        json!({
            "customer": customer,
            "items": [{"sku": "book", "qty": 1}],
            "faults": {
                "payment/charge": {"fail_times": 2, "retry_after_s": 1},
                "/shipping/ship": {"permanent": "address unknown", "order": "ignored", "endpoint": "ignored"},
            }
        })
    };
    // fail_times counts per (order, endpoint) across requests, whatever their keys.
    let r = api.post("/payment/charge", Some("o1-charge-1"), &body("o1", "charge", 1, order("a"))).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers.get("retry-after").unwrap(), "1");
    let r = api.post("/payment/charge", Some("o1-charge-2"), &body("o1", "charge", 2, order("a"))).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // Another order has its own count.
    let r = api.post("/payment/charge", Some("o2-charge-1"), &body("o2", "charge", 1, order("b"))).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let r = api.post("/payment/charge", Some("o1-charge-3"), &body("o1", "charge", 3, order("a"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["amount_cents"], 1000);

    let r = api.post("/shipping/ship", Some("o1-ship"), &body("o1", "ship", 1, order("a"))).await;
    assert_eq!((r.status, r.body), (StatusCode::UNPROCESSABLE_ENTITY, json!({"error": "address unknown"})));
    // Endpoints without a body fault are unaffected.
    let r = api.post("/inventory/reserve", Some("o1-reserve"), &body("o1", "reserve", 1, order("a"))).await;
    assert_eq!(r.status, StatusCode::OK);

    let ops: Vec<String> = api.ledger_for("o1").into_iter().map(|e| e.op).collect();
    assert_eq!(ops, ["charge", "reserve"]);
    assert!(api.svc.faults().is_empty(), "body faults are not registered");
}

#[tokio::test]
async fn delete_faults_by_order_and_all() {
    let api = start().await;
    for rule in [
        json!({"order": "o1", "fail_times": 100}),
        json!({"order": "o2", "fail_times": 100}),
        json!({"endpoint": "/payment/refund", "error_rate": 1.0}),
    ] {
        assert_eq!(api.post("/faults", None, &rule).await.status, StatusCode::OK);
    }
    assert_eq!(api.get("/faults").await.body["faults"].as_array().unwrap().len(), 3);

    let r = api.send(api.http.delete(format!("{}/faults?order=o1", api.base))).await;
    assert_eq!(r.body, json!({"removed": 1}));
    let left = api.get("/faults").await.body;
    let orders: Vec<&Value> = left["faults"].as_array().unwrap().iter().map(|f| &f["order"]).collect();
    assert_eq!(orders, [&json!("o2"), &Value::Null]);
    assert_eq!(api.call("/payment/charge", "o1-charge", "o1").await.status, StatusCode::OK);
    assert_eq!(api.call("/payment/charge", "o2-charge", "o2").await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(api.call("/payment/refund", "o1-refund", "o1").await.status, StatusCode::SERVICE_UNAVAILABLE);

    let r = api.send(api.http.delete(format!("{}/faults", api.base))).await;
    assert_eq!(r.body, json!({"removed": 2}));
    assert!(api.svc.faults().is_empty());
    assert_eq!(api.call("/payment/charge", "o2-charge", "o2").await.status, StatusCode::OK);
}

#[tokio::test]
async fn bad_requests_are_rejected() {
    let api = start().await;
    let valid = body("o1", "reserve", 1, book_order());

    let r = api.post("/inventory/reserve", None, &valid).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body["error"].as_str().unwrap().contains("Idempotency-Key"));
    let r = api.post("/inventory/reserve", Some("  "), &valid).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let r = api.post("/inventory/reserve", Some("k"), &json!({"input": {}})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body["error"].as_str().unwrap().contains("task_id"));
    let r = api.post("/inventory/reserve", Some("k"), &json!({"task_id": 42})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = api
        .send(api.http.post(format!("{}/inventory/reserve", api.base)).header("Idempotency-Key", "k").body("{not json"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // A key belongs to one operation.
    assert_eq!(api.post("/inventory/reserve", Some("k"), &valid).await.status, StatusCode::OK);
    let r = api.post("/payment/charge", Some("k"), &valid).await;
    assert_eq!(
        (r.status, r.body),
        (StatusCode::UNPROCESSABLE_ENTITY, json!({"error": "idempotency key reused for another operation"}))
    );
    let r = api.post("/inventory/reserve", Some("k"), &body("o2", "reserve", 1, book_order())).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(api.svc.ledger().len(), 1);

    // Fault rules are validated.
    let r = api.post("/faults", None, &json!({"error_rate": 1.5})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = api.post("/faults", None, &json!({"fail_time": 2})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(api.svc.faults().is_empty());
}

#[tokio::test]
async fn ledger_can_be_filtered_by_order_and_accepts_deadlines() {
    let api = start().await;
    let deadline = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 5000;
    for (order, key) in [("o1", "a"), ("o2", "b"), ("o1", "c")] {
        let r = api
            .send(
                api.http
                    .post(format!("{}/shipping/ship", api.base))
                    .header("Idempotency-Key", key)
                    .header("X-Request-Deadline", deadline.to_string())
                    .json(&body(order, "ship", 1, json!({}))),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let entries = api.get("/ledger?order=o1").await.body["entries"].clone();
    let keys: Vec<&str> = entries.as_array().unwrap().iter().map(|e| e["idempotency_key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["a", "c"]);
    assert_eq!(entries[1]["seq"], 3);
    assert!(entries[0]["at_ms"].as_u64().unwrap() > 0);
    assert_eq!(api.get("/ledger").await.body["entries"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn shutdown_answers_hanging_requests() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let svc = OrderService::new();
    svc.add_fault(FaultRule { hang: true, ..Default::default() });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(svc.clone().serve_with_shutdown(listener, async {
        let _ = stopped.await;
    }));

    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/inventory/reserve"))
            .header("Idempotency-Key", "k")
            .json(&json!({"task_id": "o1"}))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map(|r| r.status())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.send(()).unwrap();
    let status = request.await.unwrap().expect("an answer, not a timeout");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    tokio::time::timeout(Duration::from_secs(2), server).await.expect("server stops").unwrap().unwrap();
    assert!(svc.ledger().is_empty());
}

// --- Asynchronous effects (callback steps) ---

/// A service whose asynchronous effects take `confirm_ms` and whose callbacks are kept in memory.
async fn start_async(confirm_ms: u64) -> (Api, std::sync::Arc<sas_order_service::MemorySender>) {
    let sent = std::sync::Arc::new(sas_order_service::MemorySender::default());
    let svc = OrderService::with_callbacks(sent.clone(), Duration::from_millis(confirm_ms));
    let base = sas_order_service::spawn_service(&svc).await.expect("spawn order service");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    (Api { base, http, svc }, sent)
}

fn token(attempt: char, order: &str) -> String {
    format!("{}:ship:{order}", attempt.to_string().repeat(32))
}

/// A ship request as the HTTP agent sends it for a callback step.
fn async_body(order: &str, token: &str, order_input: Value) -> Value {
    let mut b = body(order, "ship", 1, order_input);
    b["callback"] =
        json!({"token": token, "heartbeat_ms": 300, "queue_url": "http://q/000000000000/cb", "url": "https://x"});
    b
}

/// The (status, token) of every callback sent so far.
fn answers(sent: &sas_order_service::MemorySender) -> Vec<(String, String)> {
    sent.sent()
        .into_iter()
        .map(|(q, m)| {
            assert_eq!(q, "http://q/000000000000/cb");
            (m.answer.name().to_owned(), m.token.expose())
        })
        .collect()
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_callback_request_is_accepted_at_once_then_heartbeats_and_confirms_once() {
    let (api, sent) = start_async(1_000).await;
    let t1 = token('a', "o1");
    let started = Instant::now();
    let r = api.post("/shipping/ship", Some("o1:ship"), &async_body("o1", &t1, book_order())).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    assert!(started.elapsed() < Duration::from_millis(500), "answered at once");
    assert_eq!(r.body["accepted"], true);
    assert!(api.ledger_for("o1").is_empty(), "nothing shipped yet");

    wait_until("confirmed", || answers(&sent).iter().any(|a| a.0 == "succeeded")).await;
    let got = answers(&sent);
    let (last, beats) = got.split_last().unwrap();
    assert_eq!(*last, ("succeeded".to_owned(), t1.clone()));
    assert!(beats.len() >= 2 && beats.iter().all(|b| *b == ("heartbeat".to_owned(), t1.clone())), "{got:?}");
    let ledger = api.ledger_for("o1");
    assert_eq!(ledger.len(), 1);
    let output = match &sent.sent().last().unwrap().1.answer {
        sas_protocol::messages::CallbackAnswer::Succeeded { output } => output.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(output["shipment_id"], ledger[0].detail["shipment_id"], "the confirmation carries the effect");
}

#[tokio::test]
async fn a_retry_moves_the_job_to_the_new_token_and_nothing_is_applied_twice() {
    let (api, sent) = start_async(600).await;
    let (t1, t2, t3) = (token('a', "o2"), token('b', "o2"), token('c', "o2"));
    assert_eq!(
        api.post("/shipping/ship", Some("o2:ship"), &async_body("o2", &t1, book_order())).await.status,
        StatusCode::ACCEPTED
    );
    // the step's attempt expired and was retried (a new token) while the warehouse works
    let r = api.post("/shipping/ship", Some("o2:ship"), &async_body("o2", &t2, book_order())).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert!(r.replayed());
    wait_until("confirmed", || answers(&sent).iter().any(|a| a.0 == "succeeded")).await;
    assert_eq!(answers(&sent).last().unwrap(), &("succeeded".to_owned(), t2.clone()), "the newest token");
    // retried once more after it was done: confirmed again to that token, nothing applied again
    let r = api.post("/shipping/ship", Some("o2:ship"), &async_body("o2", &t3, book_order())).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    wait_until("confirmed again", || answers(&sent).iter().any(|a| a.0 == "succeeded" && a.1 == t3)).await;
    assert_eq!(answers(&sent).iter().filter(|a| a.0 == "succeeded").count(), 2);
    assert_eq!(api.ledger_for("o2").len(), 1, "{:?}", api.ledger_for("o2"));
}

#[tokio::test]
async fn late_and_never_faults_shape_the_answer() {
    let (api, sent) = start_async(200).await;
    let late = async_body(
        "o3",
        &token('a', "o3"),
        json!({"items": [{"sku": "book", "qty": 1}], "faults": {"shipping/ship": {"callback_late_ms": 800}}}),
    );
    let never = async_body("o4", &token('a', "o4"), json!({"faults": {"/shipping/ship": {"callback_never": true}}}));
    let started = Instant::now();
    assert_eq!(api.post("/shipping/ship", Some("o3:ship"), &late).await.status, StatusCode::ACCEPTED);
    assert_eq!(api.post("/shipping/ship", Some("o4:ship"), &never).await.status, StatusCode::ACCEPTED);
    wait_until("the late one confirmed", || !answers(&sent).is_empty()).await;
    assert!(started.elapsed() >= Duration::from_millis(750), "late: {:?}", started.elapsed());
    // late: no heartbeat before the one confirmation; never: nothing at all
    assert_eq!(answers(&sent), vec![("succeeded".to_owned(), token('a', "o3"))]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(answers(&sent).len(), 1);
    assert_eq!(api.ledger_for("o3").len(), 1, "shipped, late");
    assert!(api.ledger_for("o4").is_empty(), "never shipped");
}

#[tokio::test]
async fn a_callback_the_service_cannot_answer_is_refused() {
    let (api, sent) = start_async(100).await;
    let mut b = async_body("o5", "not-a-token", book_order());
    let r = api.post("/shipping/ship", Some("o5:ship"), &b).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body["error"].as_str().unwrap().contains("callback.token"), "{:?}", r.body);
    assert!(!r.body["error"].as_str().unwrap().contains("not-a-token"), "the token is not echoed");
    b["callback"] = json!({"token": token('a', "o5")});
    let r = api.post("/shipping/ship", Some("o5:ship"), &b).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body["error"].as_str().unwrap().contains("queue_url"), "{:?}", r.body);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(sent.sent().is_empty() && api.ledger_for("o5").is_empty());
}

/// A map element's request (`{order}~{step}~{line}`, input `{"item", "index"}`) reserves that
/// line only, is booked on its order with the line, is released on its own, and carries the
/// item's faults.
#[tokio::test]
async fn a_map_element_reserves_and_releases_its_own_line() {
    let api = start().await;
    let line = |i: u32, item: Value| {
        json!({"task_id": format!("o7~0~{i}"), "step": "reserve", "attempt_no": 1,
               "input": {"input": {"item": item, "index": i}, "outputs": {}}})
    };
    let r0 = api.post("/inventory/reserve", Some("o7~0~0:reserve"), &line(0, json!({"sku": "a", "qty": 2}))).await;
    assert_eq!(r0.status, StatusCode::OK, "{:?}", r0.body);
    assert_eq!(r0.body["items"], json!([{"sku": "a", "qty": 2}]));
    let r1 = api.post("/inventory/reserve", Some("o7~0~1:reserve"), &line(1, json!({"sku": "b"}))).await;
    assert_eq!(r1.status, StatusCode::OK);
    let oos = json!({"sku": "c", "faults": {"/inventory/reserve": {"permanent": "out of stock: c"}}});
    let r2 = api.post("/inventory/reserve", Some("o7~0~2:reserve"), &line(2, oos)).await;
    assert_eq!(r2.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r2.body["error"], "out of stock: c");
    let back = api.post("/inventory/release", Some("o7~0~1:release"), &line(1, json!({"sku": "b"}))).await;
    assert_eq!(back.body["released"], true);
    let ledger: Vec<(String, String, Value)> =
        api.svc.ledger().into_iter().map(|e| (e.order, e.op, e.detail["line"].clone())).collect();
    assert_eq!(
        ledger,
        vec![
            ("o7".to_owned(), "reserve".to_owned(), json!(0)),
            ("o7".to_owned(), "reserve".to_owned(), json!(1)),
            ("o7".to_owned(), "release".to_owned(), json!(1)),
        ],
        "booked on the order, line by line; line 0 stays reserved"
    );
}

#[tokio::test]
async fn tracking_answers_in_transit_until_the_third_check_after_shipping_each_booked_on_its_order() {
    let api = start().await;
    // before the shipment: nothing to follow
    let r = api.call("/shipping/track", "o7-track-early", "o7~3~0").await;
    assert_eq!((r.status, r.body["status"].clone()), (StatusCode::OK, json!("not_shipped")));
    let ship = api.call("/shipping/ship", "o7-ship", "o7").await;
    let shipment = ship.body["shipment_id"].clone();
    // a loop's iterations (`{order}~{step}~{i}`), each with a key of its own; a duplicate replays
    let mut seen = Vec::new();
    for i in 1..=4 {
        let r = api.call("/shipping/track", &format!("o7-track-{i}"), &format!("o7~3~{i}")).await;
        assert_eq!((r.status, r.body["shipment_id"].clone()), (StatusCode::OK, shipment.clone()));
        seen.push((r.body["status"].as_str().unwrap_or("-").to_owned(), r.body["checks"].clone()));
    }
    let again = api.call("/shipping/track", "o7-track-1", "o7~3~1").await;
    assert!(again.replayed() && again.body["checks"] == json!(1), "{:?}", again.body);
    let want = |s: &str, n: usize| (s.to_owned(), json!(n));
    assert_eq!(
        seen,
        [want("in_transit", 1), want("in_transit", 2), want("delivered", 3), want("delivered", 4)],
        "delivered from check {}",
        sas_order_service::TRACKS_TO_DELIVERY
    );
    let ops: Vec<String> = api.ledger_for("o7").into_iter().map(|e| e.op).collect();
    assert_eq!(ops, ["track", "ship", "track", "track", "track", "track"]);
}
