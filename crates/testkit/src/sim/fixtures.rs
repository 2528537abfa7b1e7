//! The simulated stack's workflows: an order in its variants (compensated, parked in Error, with a
//! wait and a callback step, with a map and a parallel region).

use sas_protocol::condition::Condition;
use sas_protocol::ids::TaskId;
use sas_protocol::messages::{CancelMessage, SchedulerMessage, VERSION};
use sas_protocol::template::TaskTemplate;
use sas_protocol::workflow::{
    Backoff, ChildWorkflow, Concurrency, MapSpec, OnFailure, StepDef, StepFailure, StepKind, Tolerance, WaitTime,
    WhenBusy, WorkflowDef, WorkflowRegistry,
};

const STEP_TIMEOUT_MS: u64 = 5_000;

fn step(name: &str, comp: Option<&str>) -> StepDef {
    StepDef {
        max_attempts: 3,
        backoff: Backoff { base_ms: 500, max_ms: 5_000, multiplier: 2.0 },
        compensation: comp.map(|c| Box::new(step(c, None))),
        ..StepDef::call(name, "sim", STEP_TIMEOUT_MS)
    }
}

/// The agent of the `charge` steps: at most [`LIMIT`] of its calls in flight at once, across
/// all tasks (`max_in_flight`; the other agents have no limit).
pub const LIMITED_AGENT: &str = "sim.pay";
pub const LIMIT: u32 = 2;

/// `order-keyed` runs at most this many tasks of one account at once (its concurrency key).
pub const KEY_LIMIT: u32 = 1;

/// The most iterations of `order-loop`'s loop (its guard ends it after 3).
pub const LOOP_BOUND: u32 = 5;

/// `order-map` reserves each of its lines in a map step, this many at once.
pub const MAP_CONCURRENCY: u32 = 2;

/// How often a callback step's worker must heartbeat, and its hard timeout.
const CALLBACK_HEARTBEAT_MS: u64 = 5_000;
pub(super) const CALLBACK_TIMEOUT_MS: u64 = 60_000;

fn when(step: StepDef, c: &serde_json::Value) -> StepDef {
    StepDef { when: Some(Condition::from_json(c).expect("a valid guard")), ..step }
}

/// An order of at least `n` lines.
fn lines_at_least(n: usize) -> serde_json::Value {
    serde_json::json!({"variable": format!("$.input.lines[{}]", n - 1), "is_present": true})
}

/// `order` compensates on failure; `order-parked` parks in `Error` for an operator;
/// `order-async` waits a moment after the charge and ships through a callback step (a warehouse
/// that heartbeats and confirms later), undone by `recall`; `order-choice` decides: an approval
/// for orders of four lines or more, a gift-wrap whose failure does not fail the order, an apology
/// only when the gift-wrap failed, and a hold only after an apology (skipped with it); in
/// `order-graph` the fraud check runs only for orders of two lines or more; `order-child` ships
/// through the `shipping` workflow, a child task of its own; `order-loop` tracks its parcel in a
/// loop.
pub fn workflows() -> WorkflowRegistry {
    let wf = |name: &str, on_failure| WorkflowDef {
        concurrency: None,
        result: None,
        name: name.into(),
        version: 1,
        description: "simulated order".into(),
        on_failure,
        steps: vec![
            step("reserve", Some("release")),
            StepDef { kind: StepKind::Call { agent: LIMITED_AGENT.into() }, ..step("charge", Some("refund")) },
            step("ship", None),
        ],
    };
    let mut async_order = wf("order-async", OnFailure::Compensate);
    let ship = step("ship", Some("recall"));
    async_order.steps[2] = StepDef {
        kind: StepKind::Callback {
            agent: ship.agent().unwrap_or_default().to_owned(),
            heartbeat_ms: Some(CALLBACK_HEARTBEAT_MS),
        },
        timeout_ms: CALLBACK_TIMEOUT_MS,
        // the first heartbeat window starts when the request may start at the latest
        schedule_to_start_ms: Some(10_000),
        ..ship
    };
    // the wait reads its seconds from the order (`wait_for`; every simulated order says 2)
    async_order.steps.insert(
        2,
        StepDef {
            kind: StepKind::Wait(WaitTime::SecondsAt("/input/cool_off_s".into())),
            ..StepDef::wait("cool-off", 2_000)
        },
    );
    let mut map_order = wf("order-map", OnFailure::Compensate);
    map_order.steps[0].map = Some(MapSpec {
        items: "/input/lines".into(),
        max_concurrency: MAP_CONCURRENCY,
        tolerated_failures: Tolerance::None,
        timeout_ms: None,
    });
    // reserve, then three branches at once-ish: the charge, and a fraud check followed by a
    // notice to each line's customer, a map run as a branch (its elements the branch's own; its
    // undo must come before the fraud check's); ship once the charge and the notices are
    let after =
        |s: StepDef, names: &[&str]| StepDef { after: Some(names.iter().map(|n| (*n).to_owned()).collect()), ..s };
    let mut graph_order = wf("order-graph", OnFailure::Compensate);
    graph_order.steps = vec![
        step("reserve", Some("release")),
        StepDef { kind: StepKind::Call { agent: LIMITED_AGENT.into() }, ..step("charge", Some("refund")) },
        when(after(step("fraud", Some("clear")), &["reserve"]), &lines_at_least(2)),
        StepDef {
            map: Some(MapSpec {
                items: "/input/lines".into(),
                max_concurrency: MAP_CONCURRENCY,
                tolerated_failures: Tolerance::None,
                timeout_ms: None,
            }),
            ..step("notify", Some("unnotify"))
        },
        after(step("ship", None), &["charge", "notify"]),
    ];
    let failed = serde_json::json!({"variable": "$.outputs.giftwrap.error", "is_present": true});
    let mut choice_order = wf("order-choice", OnFailure::Compensate);
    choice_order.steps = vec![
        step("reserve", Some("release")),
        when(step("approve", Some("unapprove")), &lines_at_least(4)),
        StepDef { on_failure: StepFailure::Continue(Vec::new()), ..step("giftwrap", Some("unwrap")) },
        when(step("apologize", Some("retract")), &failed),
        after(step("hold", Some("unhold")), &["apologize"]),
        // what the ship step is sent: a value chosen by the way the order went (`*.choose`) and
        // intrinsic functions over the order's data
        StepDef {
            parameters: Some(template(serde_json::json!({
                "wrap": {"*.choose": [{"when": &failed, "value": {"wrapped": false}}, {"value": {"wrapped": true}}]},
                "lines.$": "States.ArrayLength($.input.lines)",
                "label.$": "States.Format('order {} of {} lines', $.task.id, States.ArrayLength($.input.lines))"
            }))),
            ..step("ship", None)
        },
    ];
    choice_order.result = Some(template(serde_json::json!({"shipped.$": "$.outputs.ship", "approved": {"*.choose": [
        {"when": {"variable": "$.outputs.approve", "is_present": true}, "value": true}, {"value": false}
    ]}})));
    // `order-child`: the charge, then shipping as a workflow of its own (pack, label, dispatch),
    // then a notice; `shipping` undoes its own steps when the order compensates or is cancelled
    let mut shipping = wf("shipping", OnFailure::Compensate);
    shipping.steps = vec![step("pack", Some("unpack")), step("label", Some("unlabel")), step("dispatch", None)];
    shipping.result = Some(template(serde_json::json!({"label.$": "$.outputs.label", "sku.$": "$.input.sku"})));
    let mut child_order = wf("order-child", OnFailure::Compensate);
    child_order.steps = vec![
        StepDef { kind: StepKind::Call { agent: LIMITED_AGENT.into() }, ..step("charge", Some("refund")) },
        shipping_step(serde_json::json!({"sku.$": "$.input.sku"})),
        step("notify", None),
    ];
    // `order-children`: the charge, then `shipping` once per line (a map of a workflow step, two
    // at once), each child reading its line and, beside it, the order's sku
    let mut children_order = wf("order-children", OnFailure::Compensate);
    children_order.steps = vec![
        step("charge", Some("refund")),
        StepDef {
            map: Some(sas_protocol::workflow::MapSpec {
                items: "/input/lines".into(),
                max_concurrency: 2,
                tolerated_failures: sas_protocol::workflow::Tolerance::None,
                timeout_ms: None,
            }),
            ..shipping_step(serde_json::json!({"sku.$": "$.input.sku", "line.$": "$.input.item"}))
        },
        step("notify", None),
    ];
    // `order-loop`: reserve (which sets the variable `tracked` to 0), then a loop that tracks the
    // parcel once per iteration, a second apart, until three iterations have run (at most
    // [`LOOP_BOUND`]), each iteration counting itself into `tracked`; then ship, sent the count
    let mut loop_order = wf("order-loop", OnFailure::Compensate);
    loop_order.steps[0].assign = Some(template(serde_json::json!({"tracked": 0})));
    // an inline body as a file writes it (its definition is the step's: the task's item holds it so)
    let mut poll: StepDef = serde_json::from_value(serde_json::json!({
        "name": "poll", "kind": "loop", "max_iterations": LOOP_BOUND, "wait_ms": 1_000,
        "body": [step("track", Some("untrack"))],
        "until": {"variable": "$.vars.tracked", "numeric_greater_than_equals": 3}
    }))
    .expect("a valid loop");
    if let StepKind::Loop(l) = &mut poll.kind {
        let track = &mut l.body.child.as_mut().expect("an inline body").steps[0];
        track.parameters = Some(template(serde_json::json!({"poll.$": "$.loop.index"})));
        track.assign = Some(template(serde_json::json!({"tracked.$": "States.MathAdd($.vars.tracked, 1)"})));
    }
    loop_order.steps[2] = poll;
    loop_order.steps.push(StepDef {
        parameters: Some(template(serde_json::json!({"tracked.$": "$.vars.tracked"}))),
        ..step("ship", None)
    });
    loop_order.steps.remove(1); // no charge: the loop takes its place
                                // `order-pages`: a map over items in pages, as `sasctl import-asl` writes a Distributed Map
                                // over S3: `read` answers the page numbers, a child `order-page` per page reads its page
                                // (`page` answers its items) and reserves each item in a map of its own; then the charge
    let mut page = wf("order-page", OnFailure::Compensate);
    page.steps = vec![
        StepDef {
            parameters: Some(template(serde_json::json!({"page.$": "$.input.page", "per_page.$": "$.input.per_page"}))),
            ..step("page", None)
        },
        StepDef {
            map: Some(MapSpec {
                items: "/outputs/page/items".into(),
                max_concurrency: MAP_CONCURRENCY,
                tolerated_failures: Tolerance::None,
                timeout_ms: None,
            }),
            ..step("reserve", Some("release"))
        },
    ];
    let mut pages_order = wf("order-pages", OnFailure::Compensate);
    pages_order.steps = vec![
        StepDef {
            parameters: Some(template(
                serde_json::json!({"pages.$": "$.input.pages", "per_page.$": "$.input.per_page"}),
            )),
            ..step("read", None)
        },
        StepDef {
            kind: StepKind::Workflow(ChildWorkflow { workflow: "order-page".into(), version: 1, child: None }),
            timeout_ms: 0,
            max_attempts: 1,
            // two pages at once, two items at once in each: 100,000 items take about six days
            // of virtual time, more than a map's default day
            map: Some(MapSpec {
                items: "/outputs/read/pages".into(),
                max_concurrency: MAP_CONCURRENCY,
                tolerated_failures: Tolerance::None,
                timeout_ms: Some(14 * 24 * 3_600_000),
            }),
            parameters: Some(template(serde_json::json!({"page.$": "$.input.item", "per_page.$": "$.input.per_page"}))),
            ..step("pages", None)
        },
        StepDef { kind: StepKind::Call { agent: LIMITED_AGENT.into() }, ..step("charge", Some("refund")) },
    ];
    let mut keyed_order = wf("order-keyed", OnFailure::Compensate);
    keyed_order.concurrency =
        Some(Concurrency { key: "$.input.account".into(), limit: KEY_LIMIT, when_busy: WhenBusy::Wait, scope: None });
    WorkflowRegistry::new([
        keyed_order,
        page,
        pages_order,
        loop_order,
        wf("order", OnFailure::Compensate),
        choice_order,
        shipping,
        child_order,
        children_order,
        wf("order-parked", OnFailure::Error),
        async_order,
        map_order,
        graph_order,
    ])
    .expect("valid simulated workflows")
}

/// A template of the fixtures' workflows (parameters, a result).
fn template(v: serde_json::Value) -> TaskTemplate {
    serde_json::from_value(v).expect("a valid template")
}

/// `ship`: a step that runs `shipping@1` with `parameters`.
#[allow(clippy::needless_pass_by_value)]
fn shipping_step(parameters: serde_json::Value) -> StepDef {
    StepDef {
        kind: StepKind::Workflow(ChildWorkflow { workflow: "shipping".into(), version: 1, child: None }),
        timeout_ms: 0,
        max_attempts: 1,
        compensation: None,
        parameters: Some(template(parameters)),
        ..step("ship", None)
    }
}

/// An operator's cancel of `task_id`; `run`: the run the operator saw (for the fence the cancel
/// will carry).
pub(super) fn cancel(task_id: TaskId, run: Option<u32>) -> SchedulerMessage {
    SchedulerMessage::Cancel(CancelMessage { v: VERSION, task_id, reason: "simulated operator".into(), run })
}
