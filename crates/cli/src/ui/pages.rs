//! The console's pages, as HTML. Every value goes through maud's escaping: ids, inputs, outputs,
//! errors and reasons come from tasks and are shown as text, never as markup.

use maud::{html, Markup, DOCTYPE};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{ProcessState, Task};
use serde_json::Value;

use super::graph;
use super::{Action, Console, Filters};
use crate::listing::{Page, Query};
use crate::ops::{check, Command};
use crate::timeline::{self, duration, offset, utc};

/// The tasks in flight: how many, by state when each was read, and how many are overdue.
#[derive(Debug, Default)]
pub struct InFlight {
    pub total: usize,
    pub by_state: Option<Vec<(ProcessState, usize)>>,
    pub overdue: usize,
}

/// The counts above a listing: what `sasctl top` says.
#[derive(Debug, Default)]
pub struct Counts {
    pub in_flight: Option<InFlight>,
    pub ended: Vec<(ProcessState, u64)>,
    pub requests: u64,
    pub error: Option<String>,
    /// Not counted: the page reloaded itself.
    pub skipped: bool,
}

/// Tasks in flight are counted by state when there are at most this many (each is read).
const COUNT_ALL_UP_TO: usize = 500;

/// The counts, as `sasctl top` takes them (one `Query` of `ByCompleteBy` per shard and the items
/// in flight, up to [`COUNT_ALL_UP_TO`]; one `Select=COUNT` query of `ByEnd` per shard and ended state).
pub async fn counts(c: &Console, now: Millis) -> Counts {
    let mut out = Counts::default();
    match crate::top::in_flight(c.deps.store.as_ref(), now, COUNT_ALL_UP_TO, 0).await {
        Ok(s) => {
            out.requests += s.key_queries + s.item_requests;
            out.in_flight = Some(InFlight { total: s.in_flight, by_state: s.by_state, overdue: s.overdue });
        }
        Err(e) => out.error = Some(e.to_string()),
    }
    // the ended states at once
    let states: Vec<ProcessState> = crate::top::counted_ended_states().collect();
    let counted = futures::future::join_all(states.iter().map(|s| c.reader.count_by_state(*s))).await;
    for (state, n) in states.into_iter().zip(counted) {
        match n {
            Ok(n) => out.ended.push((state, n)),
            Err(e) => out.error = Some(format!("{e:#}")),
        }
        out.requests += u64::from(c.reader.shards().max(1));
    }
    out
}

/// A page; with `refresh`, it reloads itself after that many seconds, from that URL.
fn layout(c: &Console, title: &str, refresh: Option<(u32, String)>, body: &Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if let Some((secs, url)) = refresh {
                    meta http-equiv="refresh" content=(format!("{secs}; url={url}"));
                }
                title { (title) " · sasctl ui · " (c.stack) }
                link rel="stylesheet" href="/assets/console.css";
            }
            body {
                header {
                    span.brand { "sasctl ui" }
                    span.stack { (c.stack) }
                    nav {
                        a href="/tasks" { "Tasks" }
                        a href="/workflows" { "Workflows" }
                    }
                    @if c.read_only { span.readonly { "read-only" } }
                }
                main { (body) }
            }
        }
    }
}

/// A page that says what went wrong.
pub fn error(c: &Console, title: &str, message: &str) -> Markup {
    layout(
        c,
        title,
        None,
        &html! {
            h1 { (title) }
            p.error id="error" { (message) }
            p { a href="/tasks" { "back to the tasks" } }
        },
    )
}

/// `/workflows`: each workflow and version, drawn.
pub fn workflows(c: &Console, only: Option<&str>) -> Markup {
    let mut defs: Vec<_> = c.deps.workflows.all().filter(|d| only.is_none_or(|n| d.name == n)).collect();
    defs.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
    layout(
        c,
        "Workflows",
        None,
        &html! {
            h1 { "Workflows" }
            p.note id="workflows-from" { (defs.len()) " workflow versions, of " (c.workflows_from) ". "
                     "Boxes: a step, what runs it and how often; arrows: what waits for what; \"undone by\": its compensation." }
            ul.toc { @for d in &defs { li {
                a href=(format!("#wf-{}-{}", d.name, d.version)) { (d.name) "@" (d.version) }
                " " a.note href=(format!("/workflows?name={}", enc(&d.name))) { "alone" }
            } } }
            @for (i, d) in defs.iter().enumerate() {
                section.workflow id=(format!("wf-{}-{}", d.name, d.version)) {
                    h2 { (d.name) "@" (d.version) }
                    @if !d.description.is_empty() { p { (d.description) } }
                    div.scroll { (graph::svg(d, None, &format!("w{i}"))) }
                }
            }
        },
    )
}

fn state_options(selected: &str) -> Markup {
    let mut states: Vec<&str> = vec!["in-flight"];
    states.extend(ProcessState::ALL.iter().filter(|s| **s != ProcessState::Rejected).map(|s| s.as_str()));
    html! {
        @for s in states {
            option value=(s) selected[s == selected] { (if s == "in-flight" { "in flight (any)" } else { s }) }
        }
    }
}

/// `/tasks`: a page of tasks and the counts.
pub fn tasks(c: &Console, f: &Filters, q: &Query, page: &Page, counts: &Counts) -> Markup {
    let state = f.state.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "in-flight".to_owned());
    let mut names = c.deps.workflows.names();
    names.sort();
    names.dedup();
    let wf = f.workflow.clone().unwrap_or_default();
    let since = f.since.clone().unwrap_or_default();
    let link = |after: Option<&str>| {
        let mut s = format!("/tasks?state={}&workflow={}&since={}", enc(&state), enc(&wf), enc(&since));
        if let Some(a) = after {
            s.push_str("&after=");
            s.push_str(&enc(a));
        }
        s
    };
    let ended = q.state.is_some_and(ProcessState::is_terminal);
    layout(
        c,
        "Tasks",
        // the first page reloads itself without the counts (their read units grow with the table)
        q.after.is_none().then(|| (10, format!("{}&auto=1", link(None)))),
        &html! {
            h1 { "Tasks" }
            div.counts id="counts" {
                @if let Some(f) = &counts.in_flight {
                    span { "in flight: " b { (f.total) } }
                    @if let Some(by) = &f.by_state { @for (s, k) in by { span { (s.as_str()) " " b { (k) } } } }
                    span class=(if f.overdue > 0 { "warn" } else { "" }) { "overdue " b { (f.overdue) } }
                }
                @for (s, k) in &counts.ended { span { (s.as_str()) " " b { (k) } } }
                @if let Some(e) = &counts.error { span.error { "counts: " (e) } }
            @if counts.skipped { span.note { "counts: left out of a page that reloaded itself (" a href=(link(None)) { "count" } ")" } }
            }
            form.filters method="get" action="/tasks" {
                label { "state " select name="state" { (state_options(&state)) } }
                label { "workflow " select name="workflow" {
                    option value="" selected[wf.is_empty()] { "any" }
                    @for n in &names { option value=(n) selected[*n == wf] { (n) } }
                } }
                label { (if ended { "ended " } else { "created " }) select name="since" {
                    @for (v, l) in [("", "any time"), ("1h", "in the last hour"), ("24h", "in the last 24 hours"), ("7d", "in the last 7 days")] {
                        option value=(v) selected[v == since] { (l) }
                    }
                } }
                button type="submit" { "show" }
            }
            table.tasks id="tasks" {
                colgroup { col.id; col.state; col.workflow; col.step; col.fails; col.time; col.reason; }
                thead { tr { th { "task" } th { "state" } th { "workflow" } th { "step" } th { "fails" }
                             th { (if ended { "ended" } else { "updated" }) } th { "reason" } } }
                tbody {
                    @for r in &page.rows {
                        tr {
                            td.id { a href=(format!("/tasks/{}", enc(r.task_id.as_str()))) title=(r.task_id) { (r.task_id) } }
                            td { span class=(format!("state {}", state_class(r.process_state))) { (r.process_state.as_str()) } }
                            td { (r.workflow_name.as_deref().unwrap_or("-")) }
                            td { (r.current_step.as_deref().unwrap_or("-")) }
                            td.num { (r.failure_count) }
                            td.time { (utc(r.updated_at)) }
                            td.reason { (clipped(r.reason.as_deref().unwrap_or(""), 160)) }
                        }
                    }
                }
            }
            @if page.rows.is_empty() { p.note { "no task here" } }
            p.pager {
                @if q.after.is_some() { a href=(link(None)) { "first page" } }
                @if let Some(next) = &page.next { a id="next" href=(link(Some(&next.encode()))) { "next page" } }
            }
            p.note {
                "this page: " (page.rows.len()) " rows, " (page.requests) " DynamoDB requests, " (page.index_rows)
                " index entries read" @if q.after.is_none() && !counts.skipped { "; the counts: " (counts.requests) " requests" }
                ". " (if ended { "Ended tasks come from the ByEnd index, newest first." }
                      else { "Tasks in flight come from the ByCompleteBy index, most overdue first." })
            " The first page reloads itself every 10 s, without the counts."
            }
        },
    )
}

/// What a link's path or query value escapes: all but letters, digits and `-._~` (RFC 3986's
/// unreserved characters).
const LINK: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Text in a link's path or query.
fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, LINK).to_string()
}

fn clipped(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut c: String = s.chars().take(max - 1).collect();
        c.push('…');
        c
    }
}

fn state_class(s: ProcessState) -> &'static str {
    match s {
        ProcessState::Processed => "good",
        ProcessState::Error | ProcessState::Rejected => "bad",
        ProcessState::Compensated | ProcessState::Cancelled => "warn",
        _ => "live",
    }
}

fn json(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// The actions the task takes now, as links to their confirmation.
fn actions(c: &Console, t: &Task) -> Vec<(Action, String)> {
    if c.read_only {
        return Vec::new();
    }
    let mut out = Vec::new();
    if check(Command::Cancel, &t.task_id, Some(t)).is_ok() {
        out.push((Action::Cancel, "cancel (its completed steps are undone)".to_owned()));
    }
    if check(Command::Resubmit, &t.task_id, Some(t)).is_ok() {
        out.push((Action::Resubmit, "resubmit (resume from the failed step)".to_owned()));
    }
    if let Some(token) = super::waiting_token(t) {
        out.push((Action::Approve, format!("approve step {}", token.unit())));
        out.push((Action::Reject, format!("reject step {}", token.unit())));
    }
    out
}

/// How many tasks step `i` started (a map's elements, a child workflow), once it started them,
/// and the first; a branch of a parallel region: its own task, once it started (a skipped branch
/// has none).
fn children(t: &Task, i: usize) -> Option<(u32, TaskId)> {
    if let Some(r) = t.workflow.regions().into_iter().find(|r| r.contains(&i)) {
        let e = u32::try_from(i - r.start).ok()?;
        let p = t.steps.get(r.start)?.map.as_ref()?;
        let ran = p.began(e) && timeline::skipped_branch(t, i).is_none();
        return ran.then(|| (1, TaskId::child(&t.task_id, r.start, e)));
    }
    let p = t.steps.get(i)?.map.as_ref()?;
    (p.n > 0).then(|| (p.n, TaskId::child(&t.task_id, i, 0)))
}

/// `/tasks/{id}`: the task.
pub fn task(c: &Console, t: &Task, now: Millis) -> Markup {
    let drawn = timeline::drawn(t, now);
    let acts = actions(c, t);
    let id = t.task_id.as_str();
    layout(
        c,
        id,
        (!t.process_state.is_terminal()).then(|| (5, format!("/tasks/{}", enc(id)))),
        &html! {
            h1 { "Task " span.id { (id) } }
            dl.facts {
                dt { "state" } dd { span id="state" class=(format!("state {}", state_class(t.process_state))) { (t.process_state.as_str()) } }
                dt { "workflow" } dd { a href=(format!("/workflows?name={}#wf-{}-{}", enc(&t.workflow.name), t.workflow.name, t.workflow.version)) { (t.workflow.name) "@" (t.workflow.version) } }
                dt { "created" } dd { (utc(t.created_at)) }
                dt { "updated" } dd { (utc(t.updated_at)) " (" (offset(t.created_at, t.updated_at)) ")" }
                dt { "failures" } dd { (t.failure_count) }
                @if let Some(r) = &t.reason { dt { "reason" } dd #reason { (r) } }
                @if let Some(cb) = t.complete_by { dt { "CompleteBy" } dd { (utc(cb)) } }
                @if let Some((parent, _, _)) = t.task_id.parent_of() {
                    dt { "part of" } dd { a href=(format!("/tasks/{}", enc(parent.as_str()))) { (parent) } }
                }
                dt { "now" } dd #now { (drawn.now) }
            }
            @if !acts.is_empty() {
                div.actions {
                    @for (a, label) in &acts {
                        a.button id=(format!("action-{}", a.verb())) href=(format!("/tasks/{}/{}", enc(id), a.verb())) { (label) }
                    }
                }
            }
            h2 { "Path" }
            p.note { "Each step coloured by its state; bold arrows: the path taken." }
            div.scroll id="graph" { (graph::svg(&t.workflow, Some(t), "task")) }
            h2 { "Timeline" }
            (timeline_svg(&drawn))
            h2 { "Steps" }
            table.steps id="steps" {
                thead { tr { th { "step" } th { "state" } th { "request" } th { "output / error" } } }
                tbody {
                    @for (i, d) in t.workflow.steps.iter().enumerate() {
                        @let st = graph::step_state(t, i);
                        @let rec = t.steps.get(i);
                        tr data-step=(d.name) {
                            td { b { (d.name) }
                                @if let Some((n, first)) = children(t, i) {
                                    br; span.note { (if n == 1 { "its task: ".to_owned() } else { format!("{n} element tasks, the first: ") }) }
                                    a href=(format!("/tasks/{}", enc(first.as_str()))) { (first) }
                                }
                            }
                            td { span class=(format!("state {}", st.class)) { (st.text) } }
                            td { @match &d.parameters {
                                Some(p) => { pre { (json(&p.0.fill(t))) } span.note { "its parameters, filled from the task" } }
                                None => { span.note { "the task's input and the outputs of the steps before it" } }
                            } }
                            td {
                                @if let Some(o) = rec.and_then(|r| r.output.as_ref()) { pre.output { (json(o)) } }
                                @if let Some(e) = rec.and_then(|r| r.error.as_ref()) { pre.error { (e) } }
                                @if let Some(comp) = rec.and_then(|r| r.compensation.as_ref()) {
                                    p.note { "compensation: " (format!("{:?}", comp.status)) ", " (comp.attempts) " attempt(s)"
                                        @if let Some(e) = &comp.error { ": " (e) } }
                                }
                            }
                        }
                    }
                }
            }
            @if t.late.count > 0 {
                p.warn { "late results: " (t.late.count) " (a success after its attempt expired); last: "
                    (t.late.last.as_deref().unwrap_or("-")) }
            }
            h2 { "Input" }
            pre id="input" { (json(&t.input)) }
            @if !t.vars.is_empty() {
                h2 { "Variables" }
                p.note { "$.vars, set by the steps' assign" }
                pre id="vars" { (json(&serde_json::Value::Object(t.vars.clone()))) }
            }
            @if let Some(r) = t.result() { h2 { "Result" } pre id="result" { (json(&r)) } }
            h2 { "History" }
            table.history id="history" {
                thead { tr { th { "#" } th { "at" } th { "state" } th { "step" } th { "fails" } th { "reason" } } }
                tbody {
                    @for h in &t.history {
                        tr {
                            td.num { (h.seq) }
                            td.time { (offset(t.created_at, h.at)) }
                            td { (h.state.as_str()) @if h.waiting { " (waiting)" } }
                            td { (h.step.as_deref().unwrap_or("-")) }
                            td.num { (h.failure_count) }
                            td.reason { (h.reason.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        },
    )
}

/// The timeline: one row per unit of work, a bar per attempt, wait or sleep on one time axis.
fn timeline_svg(d: &timeline::Drawn) -> Markup {
    const LABEL: u32 = 260;
    const AXIS: u32 = 640;
    const ROW: u32 = 26;
    let total = d.t0.until(d.t1).max(1);
    let x = |t: Millis| -> u32 {
        let at = u128::from(d.t0.until(t).min(total));
        LABEL + u32::try_from(at * u128::from(AXIS) / u128::from(total)).unwrap_or(AXIS)
    };
    let rows: Vec<_> = d.rows.iter().collect();
    let height = ROW * u32::try_from(rows.len()).unwrap_or(0) + 40;
    let width = LABEL + AXIS + 20;
    html! {
        div.scroll id="timeline" {
            svg.timeline xmlns="http://www.w3.org/2000/svg" width=(width) height=(height) viewBox=(format!("0 0 {width} {height}")) {
                line.axis x1=(LABEL) y1=(height - 24) x2=(LABEL + AXIS) y2=(height - 24) {}
                text.tick x=(LABEL) y=(height - 8) { "+0s" }
                text.tick x=(LABEL + AXIS) y=(height - 8) text-anchor="end" { "+" (duration(total)) }
                @for (r, row) in rows.iter().enumerate() {
                    @let y = u32::try_from(r).unwrap_or(0) * ROW + 6;
                    g.row data-unit=(row.name) {
                        text x="4" y=(y + 15) class=(format!("label {}", row.tone)) { (clipped(&row.name, 34)) }
                        @for b in &row.spans {
                            @let (x1, x2) = (x(b.start), x(b.end).max(x(b.start) + 3));
                            rect class=(format!("bar {}", b.tone)) x=(x1) y=(y + 3) width=(x2 - x1) height="16" rx="3" {
                                title { (row.name) ": " (b.kind) " " (offset(d.t0, b.start)) ", "
                                    (duration(b.start.until(b.end))) @if b.open { "…" } ", " (b.outcome)
                                    @if let Some(w) = &b.why { " (" (w) ")" } }
                            }
                        }
                    }
                }
            }
        }
        table.units {
            @for row in &d.rows {
                tr { td { (row.name) } td class=(row.tone) { (row.summary)
                    @if row.unseen > 0 { " (" (row.unseen) " earlier attempt(s) not in the kept history)" } } }
            }
        }
    }
}

/// `/tasks/{id}/{action}`: what the action will do, and the form that does it.
pub fn confirm(c: &Console, t: &Task, action: Action, secret: &str) -> Markup {
    let id = t.task_id.as_str();
    let (what, field) = match action {
        Action::Cancel => ("stops the task; the steps it completed are undone, and it ends Cancelled", "reason"),
        Action::Resubmit => ("resumes the task from its failed step (completed steps are not redone)", "reason"),
        Action::Approve => ("answers the step it waits for: approved, with the comment as its output", "comment"),
        Action::Reject => {
            ("answers the step it waits for: rejected for good, with the reason; the task compensates", "reason")
        }
    };
    let available = actions(c, t).iter().any(|(a, _)| *a == action);
    layout(
        c,
        &format!("{} {id}", action.verb()),
        None,
        &html! {
            h1 { (action.verb()) " task " span.id { (id) } "?" }
            p { "Task " b { (id) } " is " b { (t.process_state.as_str()) } ". This " (what) "." }
            @if !available { p.warn { "The task does not take this now; sending it will be refused with the reason." } }
            form method="post" action=(format!("/tasks/{}/{}", enc(id), action.verb())) {
                input type="hidden" name="csrf" value=(secret);
                label { (field) " " input type="text" name="reason" size="60"; }
                button type="submit" id="confirm" { (action.verb()) " " (id) }
                " "
                a href=(format!("/tasks/{}", enc(id))) { "back" }
            }
        },
    )
}

/// What an action did.
pub fn outcome(c: &Console, id: &sas_protocol::ids::TaskId, action: Action, result: &Result<String, String>) -> Markup {
    layout(
        c,
        &format!("{} {id}", action.verb()),
        None,
        &html! {
            h1 { (action.verb()) " task " span.id { (id) } }
            @match result {
                Ok(line) => p.ok id="outcome" { (line) },
                Err(line) => p.error id="outcome" { (line) },
            }
            p { a id="back" href=(format!("/tasks/{}", enc(id.as_str()))) { "the task" } " · " a href="/tasks" { "the tasks" } }
        },
    )
}
