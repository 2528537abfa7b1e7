//! `sasctl validate` on workflows files with guards, templates and workflow steps: it names a
//! guard that reads what can never be there, and workflows that call each other in a cycle.

use std::process::Command;

use serde_json::{json, Value};

fn validate(workflows: &Value) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("sasctl-validate-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("workflows.json");
    std::fs::write(&file, json!({ "workflows": workflows }).to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
        .args([
            "validate",
            "--var",
            "ORDER_SERVICE_URL=http://orders",
            "--var",
            "APPROVAL_TOPIC_ARN=arn:aws:sns:us-east-1:000000000000:a",
            "--var",
            "DEFAULT_EVENT_BUS_ARN=arn:aws:events:us-east-1:000000000000:event-bus/default",
            "--workflows",
        ])
        .arg(&file)
        .output()
        .expect("sasctl runs");
    let _ = std::fs::remove_dir_all(dir);
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn sim(name: &str) -> Value {
    json!({"name": name, "agent": "sim", "timeout_ms": 1000})
}

fn calls(name: &str, callee: &str) -> Value {
    json!({"name": name, "version": 1, "steps": [
        sim("first"), {"name": "sub", "kind": "workflow", "workflow": callee, "version": 1}]})
}

#[test]
fn validate_takes_guards_templates_and_children_and_names_what_can_never_resolve_and_cycles() {
    let mut approve = sim("approve");
    approve["when"] = json!({"variable": "$.outputs.quote.total", "numeric_greater_than": 1000});
    let mut pay = sim("pay");
    pay["parameters"] = json!({"amount.$": "$.outputs.quote.total"});
    let good = json!([{"name": "order", "version": 1, "steps": [sim("quote"), approve, pay],
                       "result": {"paid.$": "$.outputs.pay"}},
                      calls("parent", "order")]);
    let (ok, out) = validate(&good);
    assert!(ok, "{out}");
    assert!(out.contains("valid: 2 workflow(s)"), "{out}");

    let mut unknown = sim("approve");
    unknown["when"] = json!({"variable": "$.outputs.qoute.total", "numeric_greater_than": 1000});
    let (ok, out) = validate(&json!([{"name": "order", "version": 1, "steps": [sim("quote"), unknown]}]));
    assert!(!ok);
    assert!(
        out.contains("step approve: when reads $.outputs.qoute.total, and the workflow has no step \"qoute\""),
        "{out}"
    );

    let (ok, out) = validate(&json!([calls("a", "b"), calls("b", "a")]));
    assert!(!ok);
    assert!(out.contains("workflows call each other in a cycle"), "{out}");
}

/// In a checkout (a directory with `template.yaml` and `config/`), `sasctl validate` reads the
/// files there as they are now, says so, and names every mistake in them: an edit is checked
/// at once, not the copy compiled into sasctl.
#[test]
fn validate_reads_the_checkout_s_config_as_edited_and_names_every_mistake() {
    let dir = std::env::temp_dir().join(format!("sasctl-checkout-{}", uuid::Uuid::new_v4().simple()));
    let sub = dir.join("somewhere/below");
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(dir.join("template.yaml"), "# a stand-in\n").unwrap();
    std::fs::write(dir.join("config/agents.json"), json!({"agents": {"sim": {"kind": "sim"}}}).to_string()).unwrap();
    let edited = json!({"workflows": [
        {"name": "mine", "version": 1, "steps": [sim("one"), sim("two")]},
        {"name": "broken", "version": 1, "steps": [sim("a"), sim("a"), {"name": "b", "agent": "nobody", "timeout_ms": 1000}]},
        {"name": "also", "version": 1, "steps": [{"name": "c", "agent": "ghost", "timeout_ms": 1000}]}]});
    std::fs::write(dir.join("config/workflows.json"), edited.to_string()).unwrap();
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_sasctl"))
            .arg("validate")
            .current_dir(&sub)
            .env_remove("SAS_WORKFLOWS_FILE")
            .env_remove("SAS_AGENTS_FILE")
            .output()
            .expect("sasctl runs");
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let (ok, out) = run();
    assert!(!ok, "{out}");
    let from = dir.join("config/workflows.json");
    assert!(out.contains(&format!("workflows from {}", from.display())), "{out}");
    assert!(out.contains(&format!("agents from {}", dir.join("config/agents.json").display())), "{out}");
    // all three mistakes, in two workflows, in one run
    assert!(out.contains("step name a is used twice"), "{out}");
    assert!(out.contains("agent \"nobody\" is not defined"), "{out}");
    assert!(out.contains("agent \"ghost\" is not defined"), "{out}");
    // fixed on disk: valid at once, with the workflow the user added
    let fixed = json!({"workflows": [{"name": "mine", "version": 1, "steps": [sim("one"), sim("two")]}]});
    std::fs::write(&from, fixed.to_string()).unwrap();
    let (ok, out) = run();
    assert!(ok && out.contains(": mine@1") && out.contains("valid: 1 workflow(s), 1 agent(s)"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn validate_takes_a_bounded_loop_and_refuses_one_without_a_bound_or_with_a_guard_blind_to_its_iterations() {
    let looped = |extra: Value| {
        let mut poll = json!({"name": "poll", "kind": "loop", "max_iterations": 20, "wait_ms": 1000,
            "body": [sim("status")],
            "result_selector": {"state.$": "$.status.state"},
            "until": {"variable": "$.outputs.poll.state", "string_equals": "done"}});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                poll.as_object_mut().unwrap().remove(k);
            } else {
                poll[k] = v.clone();
            }
        }
        json!([{"name": "report", "version": 1, "steps": [sim("start"), poll, sim("notify")]}])
    };
    let (ok, out) = validate(&looped(json!({})));
    assert!(ok, "{out}");
    assert!(out.contains("valid: 1 workflow(s)"), "{out}");
    let (ok, out) = validate(&looped(json!({"max_iterations": null})));
    assert!(!ok);
    assert!(out.contains("step poll: a loop step needs max_iterations, its bound (1 to 10000)"), "{out}");
    let (ok, out) = validate(&looped(json!({"until": {"variable": "$.input.done", "boolean_equals": true}})));
    assert!(!ok);
    assert!(out.contains("until reads nothing an iteration changes"), "{out}");
    let inner = json!({"name": "inner", "kind": "loop", "max_iterations": 3,
        "body": [{"name": "each", "agent": "sim", "timeout_ms": 1000, "map": {"items": "/input/lines"}}],
        "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 2}});
    let (ok, out) = validate(&looped(json!({"body": [inner], "until": {"variable": "$.loop.index",
        "numeric_greater_than_equals": 2}, "result_selector": null})));
    assert!(!ok);
    assert!(out.contains("its tasks would nest 3 levels deep"), "{out}");
}
