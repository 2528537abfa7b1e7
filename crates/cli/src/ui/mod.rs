//! `sasctl ui`: a console in the browser for one stack, served from this process on loopback with
//! the operator's own AWS credentials (nothing is deployed for it, no IAM of its own: it makes the
//! calls `sasctl list`, `status`, `top`, `cancel`, `resubmit` and `approve`/`reject` make, through
//! the same functions).
//!
//! Pages (HTML written with maud, which escapes every value it is given, and one stylesheet built
//! into the binary; no script at all):
//! - `/workflows`: every workflow this process knows, drawn ([`graph`]);
//! - `/tasks`: tasks by state, workflow and time, a page at a time through the table's indexes
//!   ([`crate::listing`]), with the counts `sasctl top` gives; it reloads itself;
//! - `/tasks/{id}`: the task's graph with the path it took, its timeline on a time axis (what
//!   `sasctl status` computes, drawn), each step's request, output and error, the whole history
//!   (the archive included) and what it waits for now;
//! - `/tasks/{id}/{cancel|resubmit|approve|reject}`: a confirmation form, whose POST does what the
//!   sasctl command does and shows the line it prints.
//!
//! Safe by default: loopback only unless `--listen` says otherwise (with a warning); requests
//! whose `Host` is not this console's are refused (DNS rebinding); a POST needs this process's
//! random token in the form and an `Origin` equal to the console's own (so no other site can
//! cancel a task); `--read-only` refuses every action; every response forbids scripts, frames and
//! form targets elsewhere (`Content-Security-Policy`).

pub mod graph;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use maud::Markup;
use sas_core::deps::Deps;
use sas_protocol::ids::{CallbackToken, Millis, TaskId};
use sas_protocol::protocol::ProcessState;

use crate::answer::Answer;
use crate::listing;
use crate::ops::Command;
use crate::table::TableReader;

/// How long an action waits to see its command on the task (as `sasctl cancel` does by default).
const ACTION_WAIT: Duration = Duration::from_secs(30);
/// How often it reads the task meanwhile.
const POLL: Duration = Duration::from_millis(300);
/// Rows of a task listing's page.
pub const PAGE: usize = 50;

/// What the console needs, shared by its handlers.
pub struct Console {
    pub deps: Arc<Deps>,
    pub reader: TableReader,
    /// What the pages call the stack.
    pub stack: String,
    /// No action is offered or taken.
    pub read_only: bool,
    /// Where the workflows page's workflows come from (said on the page).
    pub workflows_from: String,
    /// The per-process secret every POST carries (a hidden field of each form).
    secret: String,
    /// The `Host` values this console answers to (`None`: any, when it listens beyond loopback).
    hosts: Option<Vec<String>>,
}

impl Console {
    /// A console for `deps`, listening on `addr`.
    pub fn new(deps: Arc<Deps>, reader: TableReader, stack: String, addr: SocketAddr, read_only: bool) -> Self {
        let port = addr.port();
        let hosts = addr
            .ip()
            .is_loopback()
            .then(|| vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")]);
        let secret = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let workflows_from = "the workflows file sasctl read".to_owned();
        Console { deps, reader, stack, read_only, workflows_from, secret, hosts }
    }

    /// The same console, saying where its workflows come from (a stack's configuration layer, a file).
    #[must_use]
    pub fn with_workflows_from(mut self, from: String) -> Self {
        self.workflows_from = from;
        self
    }
}

/// The console's routes, behind its checks.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/tasks") }))
        .route("/assets/console.css", get(css))
        .route("/workflows", get(workflows))
        .route("/tasks", get(tasks))
        .route("/tasks/{id}", get(task))
        .route("/tasks/{id}/{action}", get(confirm).post(act))
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// Serve `console` on `listener` until Ctrl-C or SIGTERM.
pub async fn serve(listener: tokio::net::TcpListener, console: Arc<Console>) -> anyhow::Result<()> {
    let app = router(console);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        })
        .await?;
    Ok(())
}

const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// Every request: its `Host` must be this console's; every response: no script, no framing, no
/// sniffing, no referrer beyond the console.
async fn guard(State(c): State<Arc<Console>>, req: Request, next: Next) -> Response {
    if let Some(hosts) = &c.hosts {
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        if !hosts.iter().any(|h| h == host) {
            return (StatusCode::FORBIDDEN, "this console answers on 127.0.0.1 or localhost only").into_response();
        }
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // not no-referrer: with it Chrome sends `Origin: null` on the forms' POSTs
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("console.css"))
}

/// A page that could not be made: the error, said plainly.
fn failed(status: StatusCode, c: &Console, title: &str, e: &anyhow::Error) -> Response {
    (status, pages::error(c, title, &format!("{e:#}"))).into_response()
}

/// `/workflows?name=NAME`: only that workflow's versions.
#[derive(Debug, Default, serde::Deserialize)]
pub struct WorkflowFilter {
    #[serde(default)]
    pub name: Option<String>,
}

async fn workflows(State(c): State<Arc<Console>>, Query(f): Query<WorkflowFilter>) -> Markup {
    pages::workflows(&c, f.name.as_deref().filter(|n| !n.is_empty()))
}

/// The listing's filters, as the form sends them.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Filters {
    /// A ProcessState, or `in-flight` (the default): every task in flight.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub workflow: Option<String>,
    /// `1h`, `24h`, `7d`, or empty for any time.
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub after: Option<String>,
    /// Set by the page's own reload: the counts are left out.
    #[serde(default)]
    pub auto: Option<String>,
}

impl Filters {
    fn query(&self, now: Millis) -> anyhow::Result<listing::Query> {
        let state = match self.state.as_deref().filter(|s| !s.is_empty()) {
            None | Some("in-flight") => None,
            Some(s) => Some(s.parse::<ProcessState>()?),
        };
        let since = match self.since.as_deref().unwrap_or_default() {
            "" => None,
            "1h" => Some(3_600_000),
            "24h" => Some(86_400_000),
            "7d" => Some(7 * 86_400_000),
            other => anyhow::bail!("since: {other:?} is not one of 1h, 24h, 7d"),
        }
        .map(|ms| Millis(now.0.saturating_sub(ms)));
        Ok(listing::Query {
            state,
            workflow: self.workflow.clone().filter(|w| !w.is_empty()),
            since,
            after: self.after.as_deref().filter(|a| !a.is_empty()).map(listing::Cursor::parse).transpose()?,
            page: PAGE,
        })
    }
}

async fn tasks(State(c): State<Arc<Console>>, Query(f): Query<Filters>) -> Response {
    let now = Millis::now();
    let q = match f.query(now) {
        Ok(q) => q,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &c, "tasks", &e),
    };
    let page = match c.reader.page(&q).await {
        Ok(p) => p,
        Err(e) => return failed(StatusCode::BAD_GATEWAY, &c, "tasks", &e),
    };
    // the counts only above the first page (each costs a query per shard and ended state)
    let counts = match (&q.after, &f.auto) {
        (None, None) => pages::counts(&c, now).await,
        (None, Some(_)) => pages::Counts { skipped: true, ..pages::Counts::default() },
        (Some(_), _) => pages::Counts::default(),
    };
    pages::tasks(&c, &f, &q, &page, &counts).into_response()
}

fn task_id(id: &str) -> anyhow::Result<TaskId> {
    TaskId::try_from(id).map_err(|e| anyhow::anyhow!("{id:?} is not a task id: {e}"))
}

async fn task(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let read = async {
        let id = task_id(&id)?;
        let Some(t) = c.deps.store.get(&id).await? else { anyhow::bail!("there is no task {id}") };
        crate::ops::with_whole_history(&c.deps, t).await
    };
    match read.await {
        Ok(t) => pages::task(&c, &t, Millis::now()).into_response(),
        Err(e) => failed(StatusCode::NOT_FOUND, &c, "task", &e),
    }
}

/// An action of the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Cancel,
    Resubmit,
    Approve,
    Reject,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "cancel" => Some(Action::Cancel),
            "resubmit" => Some(Action::Resubmit),
            "approve" => Some(Action::Approve),
            "reject" => Some(Action::Reject),
            _ => None,
        }
    }

    pub fn verb(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Resubmit => "resubmit",
            Action::Approve => "approve",
            Action::Reject => "reject",
        }
    }
}

/// The token of the callback step `task` waits for now, if it waits for one (the console holds
/// the operator's credentials, which read the task and with it the attempt).
pub fn waiting_token(t: &sas_protocol::protocol::Task) -> Option<CallbackToken> {
    let attempt = t.lock.locked_by.as_ref()?;
    if t.process_state.is_terminal() || t.is_compensating() {
        return None;
    }
    let def = t.current_def();
    (def.kind.answers_by_token() && t.workflow.steps.get(t.step_index).is_some_and(|s| s.map.is_none()))
        .then(|| CallbackToken::new(&t.task_id, &def.name, attempt))
}

async fn confirm(State(c): State<Arc<Console>>, Path((id, action)): Path<(String, String)>) -> Response {
    let Some(action) = Action::parse(&action) else { return StatusCode::NOT_FOUND.into_response() };
    let read = async {
        let id = task_id(&id)?;
        c.deps.store.get(&id).await?.ok_or_else(|| anyhow::anyhow!("there is no task {id}"))
    };
    match read.await {
        Ok(t) => pages::confirm(&c, &t, action, &c.secret).into_response(),
        Err(e) => failed(StatusCode::NOT_FOUND, &c, action.verb(), &e),
    }
}

/// What an action's form sends.
#[derive(Debug, serde::Deserialize)]
pub struct ActionForm {
    pub csrf: String,
    #[serde(default)]
    pub reason: String,
}

/// Whether a POST comes from this console's own page: its `Origin` is the console's (`http://`
/// and the `Host` it was sent to, which [`guard`] checked).
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok());
    matches!((host, origin), (Some(h), Some(o)) if o == format!("http://{h}"))
}

async fn act(
    State(c): State<Arc<Console>>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    let Some(action) = Action::parse(&action) else { return StatusCode::NOT_FOUND.into_response() };
    if c.read_only {
        let e = anyhow::anyhow!("this console is read-only (sasctl ui --read-only): nothing was sent");
        return failed(StatusCode::FORBIDDEN, &c, action.verb(), &e);
    }
    if !same_origin(&headers) || form.csrf != c.secret {
        let e = anyhow::anyhow!(
            "refused: the request did not come from this console's own page (its Origin or its form token does not \
             match); nothing was sent"
        );
        return failed(StatusCode::FORBIDDEN, &c, action.verb(), &e);
    }
    let id = match task_id(&id) {
        Ok(id) => id,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &c, action.verb(), &e),
    };
    let outcome = run(&c, action, &id, form.reason.trim()).await;
    pages::outcome(&c, &id, action, &outcome).into_response()
}

/// Do `action` on task `id` as sasctl does: `Ok(line)` when it did what was asked, `Err(line)`
/// when it was refused or not taken (the line says why).
async fn run(c: &Console, action: Action, id: &TaskId, reason: &str) -> Result<String, String> {
    let command = |cmd: Command, default: &str| {
        let reason = if reason.is_empty() { default.to_owned() } else { reason.to_owned() };
        async move {
            crate::ops::one_command(&c.deps, cmd, id, &reason, Some(ACTION_WAIT), POLL)
                .await
                .map_err(|e| format!("{e:#}"))
        }
    };
    match action {
        Action::Cancel => command(Command::Cancel, "cancelled from sasctl ui").await,
        Action::Resubmit => command(Command::Resubmit, "resubmitted from sasctl ui").await,
        Action::Approve | Action::Reject => {
            let t = match c.deps.store.get(id).await {
                Ok(Some(t)) => t,
                Ok(None) => return Err(format!("there is no task {id}")),
                Err(e) => return Err(format!("reading task {id}: {e}")),
            };
            let Some(token) = waiting_token(&t) else {
                return Err(format!(
                    "{} task {id}: it waits for no answer now ({}); nothing was sent",
                    action.verb(),
                    t.process_state
                ));
            };
            let answer = if action == Action::Approve {
                Answer::Approve { comment: (!reason.is_empty()).then(|| reason.to_owned()) }
            } else {
                if reason.is_empty() {
                    return Err("reject: a reason is needed (it is the step's error)".to_owned());
                }
                Answer::Reject { reason: reason.to_owned() }
            };
            match crate::answer::apply(&c.deps, &token, &answer).await {
                Ok((_, line, true)) => Ok(line),
                Ok((_, line, false)) => Err(line),
                Err(e) => Err(format!("{e:#}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        h
    }

    #[test]
    fn only_a_post_from_the_console_s_own_origin_is_taken() {
        assert!(same_origin(&headers("127.0.0.1:8080", Some("http://127.0.0.1:8080"))));
        assert!(!same_origin(&headers("127.0.0.1:8080", Some("http://evil.example"))));
        assert!(!same_origin(&headers("127.0.0.1:8080", Some("null"))));
        assert!(!same_origin(&headers("127.0.0.1:8080", None)), "no Origin: refused");
        assert!(!same_origin(&headers("127.0.0.1:8080", Some("http://127.0.0.1:9090"))));
    }

    #[test]
    fn filters_read_states_workflows_and_times() {
        let now = Millis(10 * 86_400_000);
        let q = Filters::default().query(now).unwrap();
        assert_eq!((q.state, q.since, q.after), (None, None, None));
        let f = Filters {
            state: Some("Error".into()),
            workflow: Some("order".into()),
            since: Some("24h".into()),
            after: None,
            auto: None,
        };
        let q = f.query(now).unwrap();
        assert_eq!(q.state, Some(ProcessState::Error));
        assert_eq!(q.since, Some(Millis(9 * 86_400_000)));
        assert_eq!(q.workflow.as_deref(), Some("order"));
        assert!(Filters { state: Some("Sleeping".into()), ..Filters::default() }.query(now).is_err());
        assert!(Filters { since: Some("2y".into()), ..Filters::default() }.query(now).is_err());
    }
}
