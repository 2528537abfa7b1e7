//! Decisions on LocalStack in Lambda mode: one workflow takes a different path for two inputs (a
//! guard true and false, a skipped step, a handled failure), sends and keeps the data it declares
//! and ends with its result in the last status; a parent cancelled while its child workflow runs
//! ends with both of the steps the child applied undone once.

use std::time::Duration;

use sas_protocol::ids::TaskId;
use sas_protocol::messages::StatusMessage;
use sas_protocol::protocol::{CompensationStatus, ProcessState, StepStatus, Task};
use sas_protocol::workflow::BUILT_IN_WORKFLOWS;
use serde_json::{json, Value};

use super::{config_dir, lambda_stack_with};

fn sim(name: &str) -> Value {
    json!({"name": name, "agent": "sim", "timeout_ms": 20_000, "max_attempts": 1})
}

fn undone(name: &str, by: &str) -> Value {
    let mut s = sim(name);
    s["compensation"] = sim(by);
    s
}

/// `decide@1`: quote, an approval only above 1,000, a payment that receives only the amount and
/// the currency (and the sim's settings) and keeps only its key, a gift-wrap whose failure
/// continues, an apology only when it failed; its result: the amount, the payment, the gift-wrap.
fn decide() -> Value {
    let mut pay = sim("pay");
    pay["parameters"] = json!({"amount.$": "$.input.amount", "currency": "EUR", "sim.$": "$.input.sim"});
    pay["result_selector"] = json!({"paid_with.$": "$.idempotency_key"});
    let mut approve = sim("approve");
    approve["when"] = json!({"variable": "$.input.amount", "numeric_greater_than": 1000});
    let mut giftwrap = sim("giftwrap");
    giftwrap["on_failure"] = json!("continue");
    let mut apologize = sim("apologize");
    apologize["when"] = json!({"variable": "$.outputs.giftwrap.error", "is_present": true});
    json!({"name": "decide", "version": 1, "steps": [sim("quote"), approve, pay, giftwrap, apologize],
           "result": {"amount.$": "$.input.amount", "paid_with.$": "$.outputs.pay.paid_with",
                      "giftwrap.$": "$.outputs.giftwrap"}})
}

/// `serial@1`: one step of 1.5 s, at most one task per account at once (a concurrency key).
fn serial() -> Value {
    json!({"name": "serial", "version": 1, "concurrency": {"key": "$.input.account"},
           "steps": [sim("work")]})
}

/// `parent@1`: charge (refund), ship through `decide-shipping@1` (pack, label, dispatch; pack and
/// label undone by unpack and unlabel), notify. (Not `shipping`: the built-in workflows, which the
/// test's configuration keeps, have a `shipping@1` of their own.)
fn family() -> [Value; 2] {
    let shipping = json!({"name": "decide-shipping", "version": 1,
        "steps": [undone("pack", "unpack"), undone("label", "unlabel"), sim("dispatch")]});
    let ship = json!({"name": "ship", "kind": "workflow", "workflow": "decide-shipping", "version": 1,
                      "parameters": {"sim.$": "$.input.sim"}});
    let parent = json!({"name": "parent", "version": 1,
        "steps": [undone("charge", "refund"), ship, sim("notify")]});
    [shipping, parent]
}

fn status(t: &Task, name: &str) -> StepStatus {
    t.steps.iter().find(|s| s.name == name).map_or(StepStatus::Pending, |s| s.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::many_single_char_names)]
async fn lambda_decisions_take_two_paths_shape_their_data_and_a_cancelled_parent_undoes_its_child_s_steps_once() {
    let built_in: Value = serde_json::from_str(BUILT_IN_WORKFLOWS).expect("built-in workflows");
    let mut workflows = built_in["workflows"].as_array().expect("a list").clone();
    workflows.push(decide());
    workflows.push(serial());
    workflows.extend(family());
    let config = config_dir("decide", &workflows);
    let f = lambda_stack_with("decide", &config, &[]).await;
    let reply = f.s.reply_queue("decide", true).await;
    let run = &f.s.name[f.s.name.len() - 8..];
    let (big, small, parent) = (format!("big-{run}"), format!("small-{run}"), format!("parent-{run}"));

    // two inputs, two paths
    let submit = |id: &str, input: Value| {
        json!({"v": 1, "task_id": id, "workflow": "decide", "reply_to": reply, "input": input}).to_string()
    };
    f.s.send(&f.s.res.submission_queue_url, &submit(&big, json!({"amount": 1500, "note": "x"}))).await;
    let refused = json!({"amount": 500, "sim": {"giftwrap": {"permanent": "no paper left"}}});
    f.s.send(&f.s.res.submission_queue_url, &submit(&small, refused)).await;
    // three tasks of one account at once, through the deployed Submitter, Scheduler and Agent
    let serials: Vec<String> = (0..3).map(|i| format!("serial-{i}-{run}")).collect();
    for id in &serials {
        let body = json!({"v": 1, "task_id": id, "workflow": "serial",
                          "input": {"account": run, "sim": {"work": {"delay_ms": 1_500}}}});
        f.s.send(&f.s.res.submission_queue_url, &body.to_string()).await;
    }

    let b = f.s.wait_for(&big, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    let s = f.s.wait_for(&small, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
    assert_eq!(
        (b.process_state, s.process_state),
        (ProcessState::Processed, ProcessState::Processed),
        "{:#?}",
        s.history
    );
    assert_eq!(
        ["approve", "giftwrap", "apologize"].map(|n| status(&b, n)),
        [StepStatus::Succeeded, StepStatus::Succeeded, StepStatus::Skipped]
    );
    assert_eq!(
        ["approve", "giftwrap", "apologize"].map(|n| status(&s, n)),
        [StepStatus::Skipped, StepStatus::Failed, StepStatus::Succeeded]
    );
    // the three of one account ran one at a time, each once, and left the key empty
    let mut runs = Vec::new();
    for id in &serials {
        let t = f.s.wait_for(id, Duration::from_mins(2), |t| t.process_state.is_terminal()).await;
        assert_eq!(t.process_state, ProcessState::Processed, "{id}: {:#?}", t.history);
        let claimed = t.history.iter().find(|h| h.state == ProcessState::Processing).map(|h| h.at).unwrap();
        let ended = t.history.last().map(|h| h.at).unwrap();
        runs.push((claimed, ended, id.clone()));
    }
    runs.sort();
    for w in runs.windows(2) {
        assert!(w[1].0 >= w[0].1, "{} started before {} ended: {runs:?}", w[1].2, w[0].2);
    }
    let key = f.s.table();
    let key = sas_core::store::KeyStore::load_key(&key, &format!("key:serial:{run}")).await.unwrap().unwrap();
    assert!(key.holders.is_empty() && key.waiting.is_empty(), "{key:?}");
    let why = s.steps.iter().find(|x| x.name == "approve").and_then(|x| x.skipped.clone());
    assert_eq!(why.as_deref(), Some("when was false: $.input.amount numeric_greater_than 1000"));
    assert_eq!(s.outputs()["giftwrap"]["error"]["kind"], "permanent");
    // the payment kept only its key (and its agent saw only what its parameters send: the sim
    // agent answers with its step and key, nothing of the input)
    let key = |t: &Task| format!("{}:pay", t.task_id);
    assert_eq!(b.outputs()["pay"], json!({"paid_with": key(&b)}));
    // each last status carries the workflow's result instead of every output
    let statuses: Vec<StatusMessage> =
        f.s.bodies(&reply, 2, Duration::from_secs(30))
            .await
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("a status"))
            .filter(|m: &StatusMessage| m.state == ProcessState::Processed)
            .collect();
    for t in [&b, &s] {
        let last = statuses.iter().find(|m| m.task_id == t.task_id).expect("its Processed status");
        assert!(last.outputs.is_none(), "{last:?}");
        let result = last.result.as_ref().expect("the workflow's result");
        assert_eq!(result["paid_with"], json!(key(t)));
        assert_eq!(result["amount"], t.input["amount"]);
    }
    assert_eq!(
        statuses.iter().find(|m| m.task_id == s.task_id).unwrap().result.as_ref().unwrap()["giftwrap"]["error"]["kind"],
        "permanent"
    );

    // the parent: its child hangs in its third step, and the parent is cancelled then. Sent only
    // now: sent with the others, its child's dispatch (one 20 s attempt) can time out while the
    // two paths above are checked on a busy machine, ending the child before the cancel comes
    let hang = json!({"v": 1, "task_id": parent, "workflow": "parent",
                      "input": {"sim": {"dispatch": {"hang_attempts": 1}}}});
    f.s.send(&f.s.res.submission_queue_url, &hang.to_string()).await;
    // the parent, cancelled once its child has applied pack and label
    let child = TaskId::child(&TaskId::try_from(parent.as_str()).unwrap(), 1, 0);
    f.s.wait_for(child.as_str(), Duration::from_mins(2), |c| {
        c.steps[1].status == StepStatus::Succeeded && c.steps[2].status == StepStatus::Running
    })
    .await;
    sas_cli::ops::cancel(&f.s.deps, &TaskId::try_from(parent.as_str()).unwrap(), "customer cancelled")
        .await
        .expect("cancel");
    let p = f.s.wait_for(&parent, Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(p.process_state, ProcessState::Cancelled, "{:#?}", p.history);
    let c = f.s.task(child.as_str()).await.expect("the child task");
    assert_eq!(c.process_state, ProcessState::Cancelled, "{:#?}", c.history);
    assert!(c.called && c.workflow.name == "decide-shipping");
    // the ledger: each step the child applied undone once, by one attempt, and the parent's charge
    for (t, step) in [(&c, "pack"), (&c, "label"), (&p, "charge")] {
        let r = t.steps.iter().find(|x| x.name == step).and_then(|x| x.compensation.as_ref()).expect("undone");
        assert_eq!((r.status, r.attempts), (CompensationStatus::Done, 1), "{}: {step}", t.task_id);
    }
    assert!(c.steps[2].compensation.is_none(), "dispatch has nothing to undo");
    let _ = std::fs::remove_dir_all(config);
    f.delete().await;
}
