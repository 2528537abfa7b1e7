//! A stand-in for the remote services of the seed's e-commerce example (inventory, payment,
//! shipping), built to be called by the HTTP agent and to show what the agent must get right.
//!
//! * Every effect endpoint requires an `Idempotency-Key` header. The first request with a key
//!   applies the effect once and saves the response; later requests with the key (including ones
//!   that arrive while the first is still being handled) get the saved response with
//!   `Idempotent-Replayed: true` and apply nothing. Injected transient failures (503, 429) are not
//!   saved, so a retry can succeed; permanent failures (422) are.
//! * Every applied effect is appended to a ledger (`GET /ledger`), which is what tests check to
//!   prove "exactly once".
//! * Faults (latency, hangs, transient and permanent failures; late and missing callbacks) are
//!   injected by rules registered with `POST /faults` or carried in the request body at
//!   `input.input.faults`.
//! * Optionally, requests must be authenticated: SigV4-signed for given credentials
//!   ([`OrderService::verify_sigv4`], `SIGV4_VERIFY`; 403 otherwise, with the reason) and carrying
//!   given header values ([`OrderService::require_header`], an API key; 401 otherwise).
//! * A request that carries a `callback` (a callback step's hand-off) is accepted at once (202);
//!   the effect follows in the background, with heartbeats, and is confirmed on the callback
//!   queue with the step's token.
//!
//! See [`OrderService::router`] for the endpoints.

mod callback;
mod faults;
mod ledger;
pub mod sigv4;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn, Instrument};

pub use callback::{CallbackSender, MemorySender, SqsSender};
pub use faults::{FaultEntry, FaultRule};
pub use ledger::{LedgerEntry, TRACKS_TO_DELIVERY};

use callback::{CallbackReq, Job, Mode};
use faults::{normalize_endpoint, Faults};
use ledger::{Books, Op, OrderInput};

/// The request header carrying the idempotency key (required on every effect endpoint).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The response header set (to `true`) on a replayed response.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The request header carrying the caller's deadline in epoch milliseconds (informational).
pub const REQUEST_DEADLINE: &str = "x-request-deadline";

/// The service: cheap to clone, every clone shares the same state.
#[derive(Clone, Default)]
pub struct OrderService {
    inner: Arc<Inner>,
}

struct Inner {
    /// One slot per idempotency key ever seen.
    keys: Mutex<HashMap<String, Arc<KeySlot>>>,
    books: Mutex<Books>,
    faults: Mutex<Faults>,
    /// Turns `true` when the server begins shutting down; releases hanging requests.
    shutdown: watch::Sender<bool>,
    /// Asynchronous effects, per idempotency key.
    jobs: Mutex<HashMap<String, Job>>,
    /// Where asynchronous effects are confirmed.
    sender: Arc<dyn CallbackSender>,
    /// How long an asynchronous effect takes (heartbeating meanwhile) before it is confirmed.
    confirm_after: Duration,
    /// What requests must carry, and what was refused.
    auth: Mutex<Auth>,
    /// Effect requests open now, and the most ever open at once, by endpoint.
    in_flight: Mutex<HashMap<&'static str, InFlight>>,
    /// Pairs of endpoints that had requests open at the same time (each pair once, in order).
    overlaps: Mutex<std::collections::BTreeSet<(&'static str, &'static str)>>,
}

/// Concurrent requests to one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    pub now: u32,
    pub max: u32,
    pub total: u64,
}

/// Counts one open request of an endpoint while it lives.
struct InFlightGuard {
    svc: OrderService,
    path: &'static str,
}

impl InFlightGuard {
    fn open(svc: &OrderService, path: &'static str) -> Self {
        let mut all = lock(&svc.inner.in_flight);
        let mut overlaps = lock(&svc.inner.overlaps);
        for (other, _) in all.iter().filter(|(p, f)| **p != path && f.now > 0) {
            overlaps.insert(if path < *other { (path, other) } else { (other, path) });
        }
        let e = all.entry(path).or_default();
        e.now += 1;
        e.max = e.max.max(e.now);
        e.total += 1;
        InFlightGuard { svc: svc.clone(), path }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Some(e) = lock(&self.svc.inner.in_flight).get_mut(self.path) {
            e.now -= 1;
        }
    }
}

/// The optional authentication of requests.
#[derive(Debug, Default)]
struct Auth {
    sigv4: Option<sigv4::Verifier>,
    /// Header name (lower case) → the value it must have.
    required: HashMap<HeaderName, String>,
    refusals: Vec<AuthRefusal>,
}

/// A request refused by the authentication: 403 (signature) or 401 (a required header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRefusal {
    pub status: u16,
    pub path: String,
    pub reason: String,
}

/// The largest body the authentication reads (it must hash it).
const MAX_AUTH_BODY: usize = 4 * 1024 * 1024;

/// How long an asynchronous effect takes by default.
pub const DEFAULT_CONFIRM_AFTER: Duration = Duration::from_secs(3);

impl Default for Inner {
    fn default() -> Self {
        Inner {
            keys: Mutex::default(),
            books: Mutex::default(),
            faults: Mutex::default(),
            shutdown: watch::Sender::new(false),
            jobs: Mutex::default(),
            sender: Arc::new(SqsSender::default()),
            confirm_after: DEFAULT_CONFIRM_AFTER,
            auth: Mutex::default(),
            in_flight: Mutex::default(),
            overlaps: Mutex::default(),
        }
    }
}

/// What an idempotency key is bound to, and its saved response once there is one. The async mutex
/// serializes requests with the same key: a duplicate waits for the first to finish.
struct KeySlot {
    op: Op,
    order: String,
    saved: tokio::sync::Mutex<Option<Saved>>,
}

#[derive(Clone)]
struct Saved {
    status: StatusCode,
    body: Value,
}

impl std::fmt::Debug for OrderService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderService")
            .field("keys", &lock(&self.inner.keys).len())
            .field("ledger_entries", &lock(&self.inner.books).entries(None).len())
            .finish_non_exhaustive()
    }
}

impl OrderService {
    pub fn new() -> Self {
        Self::default()
    }

    /// A service whose asynchronous effects take `confirm_after` and are confirmed through
    /// `sender` (the default: SQS, [`DEFAULT_CONFIRM_AFTER`]).
    pub fn with_callbacks(sender: Arc<dyn CallbackSender>, confirm_after: Duration) -> Self {
        OrderService { inner: Arc::new(Inner { sender, confirm_after, ..Inner::default() }) }
    }

    /// All routes, with this service's state attached:
    ///
    /// * `POST /inventory/reserve`, `/inventory/release`, `/payment/charge`, `/payment/refund`,
    ///   `/shipping/ship`, `/fraud/screen` (a check: books its verdict and a score from the order's
    ///   `risk`, changes nothing), `/gift/wrap`, `/shipping/track` (a check: the order's shipment
    ///   `in_transit`, then `delivered` at its third check, [`TRACKS_TO_DELIVERY`]): the effects (header `Idempotency-Key` required); a request with a
    ///   `callback` object is accepted at once (202) and confirmed later through the callback
    ///   queue (see the `callback` module);
    /// * `GET /ledger[?order=ID]` → `{"entries": [...]}`;
    /// * `GET /faults` → `{"faults": [...]}`, `POST /faults` (a [`FaultRule`]) → `{"id": n}`,
    ///   `DELETE /faults[?order=ID]` → `{"removed": n}`;
    /// * `GET /healthz` → `{"ok": true}`.
    pub fn router(&self) -> Router {
        let mut router = Router::new();
        for op in Op::ALL {
            router = router.route(
                op.path(),
                post(move |State(svc): State<OrderService>, headers: HeaderMap, body: Bytes| {
                    effect(svc, op, headers, body)
                }),
            );
        }
        router
            .route("/ledger", get(get_ledger))
            .route("/faults", get(list_faults).post(post_fault).delete(delete_faults))
            .route("/healthz", get(healthz))
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(self.clone(), authenticate))
            .with_state(self.clone())
    }

    /// From now on every request but `GET /healthz` must be SigV4-signed for these credentials
    /// (`None`: no signature needed, the default).
    pub fn verify_sigv4(&self, verifier: Option<sigv4::Verifier>) {
        lock(&self.inner.auth).sigv4 = verifier;
    }

    /// From now on every request but `GET /healthz` must carry header `name` with `value`
    /// (`None`: no longer required). Checked after the signature.
    ///
    /// # Panics
    /// `name` is not a valid header name.
    pub fn require_header(&self, name: &str, value: Option<&str>) {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid header name");
        let mut auth = lock(&self.inner.auth);
        match value {
            Some(v) => auth.required.insert(name, v.to_owned()),
            None => auth.required.remove(&name),
        };
    }

    /// The requests refused so far by the authentication, oldest first.
    /// How many effect requests to `endpoint` (e.g. `"/payment/charge"`) are open now, the most
    /// ever open at once, and how many came: what a caller's concurrency limit is checked by.
    pub fn in_flight(&self, endpoint: &str) -> InFlight {
        lock(&self.inner.in_flight).iter().find(|(p, _)| **p == endpoint).map(|(_, f)| *f).unwrap_or_default()
    }

    /// Whether requests to the endpoints `a` and `b` were ever open at the same time: steps that
    /// run at once are seen to.
    pub fn overlapped(&self, a: &str, b: &str) -> bool {
        lock(&self.inner.overlaps).iter().any(|(x, y)| (*x == a && *y == b) || (*x == b && *y == a))
    }

    pub fn auth_refusals(&self) -> Vec<AuthRefusal> {
        lock(&self.inner.auth).refusals.clone()
    }

    /// Serves until the listener fails; never returns otherwise.
    ///
    /// # Errors
    /// The listener's I/O error.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        self.serve_with_shutdown(listener, std::future::pending()).await
    }

    /// Serves until `signal` completes, then stops accepting, answers hanging requests with 503 and
    /// waits for open requests to finish.
    ///
    /// # Errors
    /// The listener's I/O error.
    pub async fn serve_with_shutdown<F>(self, listener: TcpListener, signal: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let router = self.router();
        let inner = self.inner.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                signal.await;
                inner.shutdown.send_replace(true);
            })
            .await
    }

    /// Every ledger entry, in order (what `GET /ledger` answers).
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        lock(&self.inner.books).entries(None)
    }

    /// Registers a fault rule and returns its id (what `POST /faults` does). An `error_rate`
    /// outside `0..=1` is clamped (NaN counts as 0); `POST /faults` rejects it instead.
    pub fn add_fault(&self, mut rule: FaultRule) -> u64 {
        rule.error_rate = if rule.error_rate.is_nan() { 0.0 } else { rule.error_rate.clamp(0.0, 1.0) };
        lock(&self.inner.faults).add(rule)
    }

    /// The registered fault rules (what `GET /faults` lists).
    pub fn faults(&self) -> Vec<FaultEntry> {
        lock(&self.inner.faults).list()
    }

    /// Removes every registered rule (`None`) or those whose `order` is the given one; returns how
    /// many were removed (what `DELETE /faults[?order=]` does).
    pub fn clear_faults(&self, order: Option<&str>) -> usize {
        lock(&self.inner.faults).clear(order)
    }

    /// Finds or creates the slot of `key`; `Err` if the key is bound to another operation.
    fn slot(&self, key: &str, op: Op, order: &str) -> Result<Arc<KeySlot>, Arc<KeySlot>> {
        let mut keys = lock(&self.inner.keys);
        let slot = keys
            .entry(key.to_owned())
            .or_insert_with(|| Arc::new(KeySlot { op, order: order.to_owned(), saved: tokio::sync::Mutex::new(None) }))
            .clone();
        if slot.op == op && slot.order == order {
            Ok(slot)
        } else {
            Err(slot)
        }
    }

    async fn wait_for_shutdown(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        // The sender lives as long as `self`, so this only returns once shutdown began.
        let _ = rx.wait_for(|down| *down).await;
    }
}

/// Starts a service on `127.0.0.1:0` in a background task; returns its base URL
/// (`http://127.0.0.1:PORT`) and a handle sharing its state.
///
/// # Errors
/// Binding the port failed.
pub async fn spawn_local() -> std::io::Result<(String, OrderService)> {
    let svc = OrderService::new();
    Ok((spawn_service(&svc).await?, svc))
}

/// Serves `svc` on `127.0.0.1:0` in a background task; returns its base URL.
///
/// # Errors
/// Binding the port failed.
pub async fn spawn_service(svc: &OrderService) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = svc.clone();
    tokio::spawn(async move {
        if let Err(err) = server.serve(listener).await {
            warn!(%err, "order service stopped");
        }
    });
    Ok(url)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An effect request as the agent sends it:
/// `{"task_id": "order-42", "step": "charge", "attempt_no": 1, "input": {"input": {...order...}, "outputs": {...}}}`.
struct EffectRequest {
    order: String,
    step: Option<String>,
    attempt_no: Option<u64>,
    input: OrderInput,
    /// The fault this request carries for its endpoint, from `input.input.faults`.
    fault: Option<FaultRule>,
    /// Present for a callback step: accept now, confirm later through the callback queue.
    callback: Option<CallbackReq>,
}

impl EffectRequest {
    fn parse(body: &[u8], op: Op) -> Result<Self, String> {
        let body: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
        let order = match body.get("task_id") {
            Some(Value::String(id)) if !id.trim().is_empty() => id.clone(),
            Some(_) => return Err("task_id must be a non-empty string".into()),
            None => return Err("missing task_id".into()),
        };
        // The order is at `input.input`; a bare order at `input` is accepted too.
        let input = body.get("input").filter(|v| v.is_object());
        let order_json =
            input.and_then(|i| i.get("input")).filter(|v| v.is_object()).or(input).cloned().unwrap_or(Value::Null);
        // A map element's request (`task_id` `{order}~{step}~{line}`, input `{"item": …, "index": …}`)
        // is about one line of the order: that item, and the faults it carries.
        let element = order_json.get("item").is_some_and(Value::is_object);
        let order_json = match order_json.get("item").filter(|v| v.is_object()) {
            Some(item) => json!({"items": [item], "faults": item.get("faults").cloned().unwrap_or(Value::Null)}),
            None => order_json,
        };
        let fault = order_json.get("faults").and_then(Value::as_object).and_then(|faults| {
            let (name, spec) =
                faults.iter().find(|(name, _)| normalize_endpoint(name) == normalize_endpoint(op.path()))?;
            match serde_json::from_value::<FaultRule>(spec.clone()) {
                Ok(rule) => Some(rule),
                Err(err) => {
                    warn!(order = %order, fault = %name, %err, "ignoring a malformed fault in the request body");
                    None
                }
            }
        });
        Ok(EffectRequest {
            step: body.get("step").and_then(Value::as_str).map(str::to_owned),
            attempt_no: body.get("attempt_no").and_then(Value::as_u64),
            input: OrderInput { element, ..OrderInput::from_json(&order_json) },
            fault,
            order,
            callback: CallbackReq::parse(&body)?,
        })
    }
}

async fn effect(svc: OrderService, op: Op, headers: HeaderMap, body: Bytes) -> Response {
    let _open = InFlightGuard::open(&svc, op.path());
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned);
    let Some(key) = key else {
        warn!(endpoint = op.path(), "rejected: missing Idempotency-Key header");
        return error(StatusCode::BAD_REQUEST, "missing Idempotency-Key header");
    };
    let req = match EffectRequest::parse(&body, op) {
        Ok(req) => req,
        Err(message) => {
            warn!(endpoint = op.path(), %key, %message, "rejected: bad request");
            return error(StatusCode::BAD_REQUEST, message);
        }
    };
    let span = tracing::info_span!("effect", op = op.name(), order = %req.order, key = %key);
    async move {
        let deadline = headers.get(REQUEST_DEADLINE).and_then(|v| v.to_str().ok());
        let deadline_in_ms = deadline.and_then(|d| d.trim().parse::<i128>().ok()).map(|d| d - i128::from(now_ms()));
        info!(step = req.step.as_deref(), attempt_no = req.attempt_no, deadline, deadline_in_ms, "request");
        handle_effect(&svc, op, &key, req).await
    }
    .instrument(span)
    .await
}

async fn handle_effect(svc: &OrderService, op: Op, key: &str, req: EffectRequest) -> Response {
    let slot = match svc.slot(key, op, &req.order) {
        Ok(slot) => slot,
        Err(other) => {
            warn!(bound_op = other.op.name(), bound_order = %other.order, "rejected: idempotency key reused for another operation");
            return error(StatusCode::UNPROCESSABLE_ENTITY, "idempotency key reused for another operation");
        }
    };
    // A duplicate waits here until the request holding the key is done.
    let mut saved = slot.saved.lock().await;
    if let Some(saved) = saved.as_ref() {
        if let Some(cb) = &req.callback {
            svc.rebind(key, cb, saved);
        }
        info!(status = saved.status.as_u16(), "replayed");
        let mut response = (saved.status, Json(saved.body.clone())).into_response();
        response.headers_mut().insert(HeaderName::from_static(IDEMPOTENT_REPLAYED), HeaderValue::from_static("true"));
        return response;
    }

    let plan = lock(&svc.inner.faults).plan(&req.order, op.path(), req.fault.as_ref());
    if plan.latency_ms > 0 {
        info!(latency_ms = plan.latency_ms, "injected latency");
        tokio::time::sleep(Duration::from_millis(plan.latency_ms)).await;
    }
    if plan.hang {
        // Release the key first, so a retry is not stuck behind a request nobody waits for.
        drop(saved);
        info!("injected hang: not answering");
        svc.wait_for_shutdown().await;
        return error(StatusCode::SERVICE_UNAVAILABLE, "service shutting down");
    }
    if let Some(message) = plan.permanent {
        info!(%message, "injected permanent failure (saved)");
        let body = json!({"error": message});
        *saved = Some(Saved { status: StatusCode::UNPROCESSABLE_ENTITY, body: body.clone() });
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response();
    }
    if let Some(transient) = plan.transient {
        return if let Some(secs) = transient.retry_after_s {
            info!(reason = %transient.reason, retry_after_s = secs, "injected throttling (429, not saved)");
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, transient.reason);
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
            response
        } else {
            info!(reason = %transient.reason, "injected transient failure (503, not saved)");
            error(StatusCode::SERVICE_UNAVAILABLE, transient.reason)
        };
    }

    if let Some(cb) = req.callback {
        let mode = match (plan.callback_never, plan.callback_late_ms) {
            (true, _) => Mode::Never,
            (false, Some(ms)) => Mode::Late(ms),
            (false, None) => Mode::OnTime,
        };
        let job = Job { token: cb.token, queue_url: cb.queue_url, heartbeat_ms: cb.heartbeat_ms, mode, done: None };
        lock(&svc.inner.jobs).insert(key.to_owned(), job);
        let body = json!({"accepted": true, "op": op.name(), "order": req.order});
        info!(?mode, "accepted: the effect follows, confirmed through the callback queue");
        *saved = Some(Saved { status: StatusCode::ACCEPTED, body: body.clone() });
        tokio::spawn(run_job(svc.clone(), op, key.to_owned(), req.order, req.input));
        return (StatusCode::ACCEPTED, Json(body)).into_response();
    }

    let body = lock(&svc.inner.books).apply(op, &req.order, key, &req.input);
    info!(response = %body, "applied");
    *saved = Some(Saved { status: StatusCode::OK, body: body.clone() });
    (StatusCode::OK, Json(body)).into_response()
}

impl OrderService {
    /// A retry of an asynchronous effect (a new attempt: a new token): the job now answers to the
    /// new token; a job already done confirms again, to it (nothing is applied twice). An effect
    /// done synchronously before is confirmed with its saved response.
    fn rebind(&self, key: &str, cb: &CallbackReq, saved: &Saved) {
        let again = {
            let mut jobs = lock(&self.inner.jobs);
            match jobs.get_mut(key) {
                Some(job) => {
                    job.token = cb.token.clone();
                    job.queue_url.clone_from(&cb.queue_url);
                    job.heartbeat_ms = cb.heartbeat_ms;
                    info!(done = job.done.is_some(), "retried: the job answers to the new token");
                    job.done.clone()
                }
                None => saved.status.is_success().then(|| saved.body.clone()),
            }
        };
        if let Some(output) = again {
            let (sender, msg, queue) =
                (self.inner.sender.clone(), callback::succeeded(cb.token.clone(), output), cb.queue_url.clone());
            tokio::spawn(async move { callback::send(sender.as_ref(), &queue, &msg).await });
        }
    }

    /// The current token and queue of a job.
    fn job_target(&self, key: &str) -> Option<(sas_protocol::ids::CallbackToken, String)> {
        lock(&self.inner.jobs).get(key).map(|j| (j.token.clone(), j.queue_url.clone()))
    }
}

/// The background half of an asynchronous effect: heartbeats while it "works", then the effect
/// (its ledger entry) and the confirmation, to the newest token.
async fn run_job(svc: OrderService, op: Op, key: String, order: String, input: OrderInput) {
    let Some((mode, every)) =
        lock(&svc.inner.jobs).get(&key).map(|j| (j.mode, callback::heartbeat_every(j.heartbeat_ms)))
    else {
        return;
    };
    let span = tracing::info_span!("job", op = op.name(), order = %order, key = %key);
    async move {
        let wait = match mode {
            Mode::OnTime => svc.inner.confirm_after,
            Mode::Late(ms) => Duration::from_millis(ms),
            Mode::Never => {
                info!("injected: never answering");
                return;
            }
        };
        let until = tokio::time::Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let nap = match (mode, every) {
                (Mode::OnTime, Some(every)) => every.min(left),
                _ => left,
            };
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = svc.wait_for_shutdown() => return,
            }
            if mode == Mode::OnTime && every.is_some() && tokio::time::Instant::now() < until {
                if let Some((token, queue)) = svc.job_target(&key) {
                    callback::send(svc.inner.sender.as_ref(), &queue, &callback::heartbeat(token, "packing")).await;
                }
            }
        }
        let output = lock(&svc.inner.books).apply(op, &order, &key, &input);
        info!(response = %output, "applied (asynchronously)");
        let target = {
            let mut jobs = lock(&svc.inner.jobs);
            jobs.get_mut(&key).map(|j| {
                j.done = Some(output.clone());
                (j.token.clone(), j.queue_url.clone())
            })
        };
        if let Some((token, queue)) = target {
            callback::send(svc.inner.sender.as_ref(), &queue, &callback::succeeded(token, output)).await;
        }
    }
    .instrument(span)
    .await;
}

#[derive(Deserialize)]
struct OrderQuery {
    order: Option<String>,
}

async fn get_ledger(State(svc): State<OrderService>, Query(q): Query<OrderQuery>) -> Json<Value> {
    Json(json!({"entries": lock(&svc.inner.books).entries(q.order.as_deref())}))
}

async fn list_faults(State(svc): State<OrderService>) -> Json<Value> {
    Json(json!({"faults": svc.faults()}))
}

async fn post_fault(State(svc): State<OrderService>, body: Bytes) -> Response {
    let rule: FaultRule = match serde_json::from_slice(&body) {
        Ok(rule) => rule,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid fault rule: {e}")),
    };
    if !(0.0..=1.0).contains(&rule.error_rate) {
        return error(StatusCode::BAD_REQUEST, format!("error_rate must be within 0..=1, got {}", rule.error_rate));
    }
    let id = svc.add_fault(rule.clone());
    info!(id, ?rule, "fault rule added");
    Json(json!({"id": id})).into_response()
}

async fn delete_faults(State(svc): State<OrderService>, Query(q): Query<OrderQuery>) -> Json<Value> {
    let removed = svc.clear_faults(q.order.as_deref());
    info!(order = q.order.as_deref(), removed, "fault rules cleared");
    Json(json!({"removed": removed}))
}

/// The authentication in front of every route (see [`OrderService::verify_sigv4`] and
/// [`OrderService::require_header`]); with neither set, requests pass untouched.
async fn authenticate(State(svc): State<OrderService>, req: Request, next: Next) -> Response {
    let (verifier, required) = {
        let auth = lock(&svc.inner.auth);
        (auth.sigv4.clone(), auth.required.clone())
    };
    if (verifier.is_none() && required.is_empty()) || req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let path = req.uri().path().to_owned();
    let refuse = |status: StatusCode, reason: String| {
        warn!(%path, status = status.as_u16(), %reason, "rejected: authentication");
        lock(&svc.inner.auth).refusals.push(AuthRefusal {
            status: status.as_u16(),
            path: path.clone(),
            reason: reason.clone(),
        });
        error(status, reason)
    };
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_AUTH_BODY).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("body over {MAX_AUTH_BODY} bytes"));
    };
    if let Some(verifier) = verifier {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let now = i64::try_from(now_ms() / 1_000).unwrap_or(i64::MAX);
        if let Err(reason) = verifier.verify(parts.method.as_str(), target, &parts.headers, &body, now) {
            return refuse(StatusCode::FORBIDDEN, format!("signature: {reason}"));
        }
    }
    for (name, want) in &required {
        if parts.headers.get(name).is_none_or(|v| v.as_bytes() != want.as_bytes()) {
            // the name only: never the value
            return refuse(StatusCode::UNAUTHORIZED, format!("missing or wrong {name} header"));
        }
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}

async fn healthz() -> Json<Value> {
    Json(json!({"ok": true}))
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint")
}
