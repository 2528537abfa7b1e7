//! `sasctl validate`: check a configuration (workflows and agents) before it is deployed, as the
//! functions will load it, and what the functions would only find out task by task: a step naming
//! an agent that is not defined, an agent whose variable is not set, a hand-off agent (approval,
//! queue, topic, bus) on a step that is not a callback step, and an agent whose AWS calls the
//! Agent function's role would refuse (the template's `Agent*Arns` parameters, each named by the
//! agent kind's [`sas_core::agent::Grant`]).

use std::collections::BTreeSet;

use serde_json::Value;

use sas_core::agent::{self, AgentSurvey};
use sas_protocol::config_file::parse_value;
use sas_protocol::workflow::{StepDef, WorkflowDef, WorkflowRegistry};

/// What is wrong (the functions would fail on it) or worth a look.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The workflows and versions checked, `name@version`.
    pub workflows: Vec<String>,
    /// The agents defined, `name (kind)`.
    pub agents: Vec<String>,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// IAM's wildcard match: `*` any run of characters, `?` one.
fn glob(pattern: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut pi, mut si, mut star, mut mark) = (0, 0, None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether `granted` (an ARN pattern of a parameter) covers `resource` (an ARN, or a name when
/// the configuration gives only a name: then the ARN's last part must be that name, or for a
/// Secrets Manager ARN that name and its 6-character suffix).
fn covers(granted: &str, resource: &str) -> bool {
    if resource.starts_with("arn:") {
        return glob(granted, resource);
    }
    let name = resource.trim_start_matches('/');
    granted.char_indices().filter(|&(_, c)| c == ':' || c == '/').any(|(i, _)| {
        let tail = &granted[i + 1..];
        glob(tail, name) || glob(tail, &format!("{name}-ABCDEF")) && granted.contains(":secretsmanager:")
    })
}

/// The problems with one agent's grants, given the template parameters `params`.
fn grant_problems(
    a: &AgentSurvey,
    vars: &dyn Fn(&str) -> Option<String>,
    params: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for g in &a.grants {
        // the stack's own resource, which the template grants by itself
        if g.stack_variable.is_some_and(|var| vars(var).as_deref() == Some(g.resource.as_str())) {
            continue;
        }
        let param = g.parameter;
        let list = |p: &str| -> Vec<String> {
            params(p)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let granted = list(param);
        // an action the template does not fix is granted by a list of actions
        if let Some(actions) = g.action_parameter {
            if !list(actions).iter().any(|p| glob(&p.to_ascii_lowercase(), &g.action.to_ascii_lowercase())) {
                out.push(format!(
                    "agent {}: needs {}: add it to the template parameter {actions} (the Agent function's role only)",
                    a.name, g.action
                ));
            }
        }
        // a signed URL names no ARN: the parameter must grant something
        let url = g.resource.starts_with("http://") || g.resource.starts_with("https://");
        let ok = if url { !granted.is_empty() } else { granted.iter().any(|p| covers(p, &g.resource)) };
        if !ok {
            out.push(format!(
                "agent {}: needs {} on {}: add it to the template parameter {param} (the Agent function's role only)",
                a.name, g.action, g.resource
            ));
        }
    }
    out
}

/// Check `workflows_json` and `agents_json` with the variables `vars` (those the template gives
/// the functions), without the IAM part (see [`check_with_grants`]).
pub fn check(workflows_json: &str, agents_json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Report {
    check_config(workflows_json, agents_json, vars)
}

/// [`check`], and every AWS call an agent makes granted by the template parameters `params`
/// (each [`sas_core::agent::Grant`]'s `parameter`, as given to `sam deploy --parameter-overrides`).
pub fn check_with_grants(
    workflows_json: &str,
    agents_json: &str,
    vars: &dyn Fn(&str) -> Option<String>,
    params: &dyn Fn(&str) -> Option<String>,
) -> Report {
    let mut r = check_config(workflows_json, agents_json, vars);
    if let Ok(agents) = agent::survey(agents_json, vars) {
        for a in &agents {
            r.problems.extend(grant_problems(a, vars, params));
        }
    }
    r
}

/// The workflows file read as the functions read it; where they would refuse it, every mistake
/// found, not only the first: each step and each workflow is read on its own, each with its path
/// in the file (`workflows[1].steps[2].backoff`).
fn read_workflows(json: &str, problems: &mut Vec<String>) -> Result<WorkflowRegistry, Vec<WorkflowDef>> {
    let err = match WorkflowRegistry::from_json(json) {
        Ok(registry) => return Ok(registry),
        Err(e) => e,
    };
    // the workflows that parse, whatever rules they break, for the checks of the agents they use
    let mut parsed = Vec::new();
    let before = problems.len();
    let file: Option<Value> = serde_json::from_str(json).ok();
    let list = file.as_ref().and_then(|f| f.get("workflows")).and_then(Value::as_array);
    if let (Some(file), Some(list)) = (file.as_ref().and_then(Value::as_object), list) {
        if let Some(k) = file.keys().find(|k| !["workflows", "$schema"].contains(&k.as_str())) {
            problems
                .push(format!("workflows: unknown field `{k}` at the top level, expected `workflows` or `$schema`"));
        }
        for (i, w) in list.iter().enumerate() {
            let at = format!("workflows[{i}]");
            let mut w = w.clone();
            let mut found = false;
            if let Err(e) = sas_protocol::workflow::apply_defaults(&mut w, &at) {
                problems.push(format!("workflows: {e}"));
                found = true;
            }
            let w = &w;
            let steps = w.get("steps").and_then(Value::as_array);
            for (j, step) in steps.into_iter().flatten().enumerate() {
                if let Err(e) = parse_value::<StepDef>(step, &format!("{at}.steps[{j}]")) {
                    problems.push(format!("workflows: {e}"));
                    found = true;
                }
            }
            // the workflow's own fields, its steps set aside
            let mut own = w.clone();
            if steps.is_some() {
                own["steps"] = Value::Array(Vec::new());
            }
            match parse_value::<WorkflowDef>(&own, &at) {
                Err(e) => problems.push(format!("workflows: {e}")),
                Ok(_) if found => {}
                Ok(_) => match parse_value::<WorkflowDef>(w, &at) {
                    Err(e) => problems.push(format!("workflows: {e}")),
                    Ok(d) => {
                        problems.extend(d.problems().into_iter().map(|e| format!("workflows: {at}: {e}")));
                        parsed.push(d);
                    }
                },
            }
        }
    }
    if problems.len() == before {
        // not JSON, not an object with a list, or a mistake across workflows (a version twice)
        problems.push(format!("workflows: {err}"));
    }
    Err(parsed)
}

/// The agents file as [`agent::survey`] reads it; where it refuses the file, each agent is read
/// on its own (with the file's other settings) so that every agent's mistake is named.
fn read_agents(json: &str, vars: &dyn Fn(&str) -> Option<String>, problems: &mut Vec<String>) -> Vec<AgentSurvey> {
    let err = match agent::survey(json, vars) {
        Ok(agents) => return agents,
        Err(e) => e,
    };
    let before = problems.len();
    let mut file: Option<serde_json::Map<String, Value>> = serde_json::from_str(json).ok();
    let agents = file.as_mut().and_then(|f| f.remove("agents"));
    if let (Some(rest), Some(Value::Object(agents))) = (file, agents) {
        let settings_ok = agent::survey(&Value::Object(with_agents(&rest, serde_json::Map::new())).to_string(), vars)
            .map_err(|e| problems.push(format!("agents: {e}")))
            .is_ok();
        if settings_ok {
            for (name, entry) in agents {
                let one = serde_json::Map::from_iter([(name, entry)]);
                if let Err(e) = agent::survey(&Value::Object(with_agents(&rest, one)).to_string(), vars) {
                    problems.push(format!("agents: {e}"));
                }
            }
        }
    }
    if problems.len() == before {
        problems.push(format!("agents: {err}"));
    }
    Vec::new()
}

/// An agents file's settings (`rest`) with `agents` as its agents.
fn with_agents(
    rest: &serde_json::Map<String, Value>,
    agents: serde_json::Map<String, Value>,
) -> serde_json::Map<String, Value> {
    let mut file = rest.clone();
    file.insert("agents".to_owned(), Value::Object(agents));
    file
}

/// A workflow's steps and their compensations, with those of its loops' inline bodies (a body is
/// no workflow of the file of its own: `{workflow} loop {step}`), each with the workflow it is in.
fn steps_with_bodies<'a>(wf: &str, def: &'a WorkflowDef, out: &mut Vec<(String, &'a sas_protocol::workflow::StepDef)>) {
    for step in &def.steps {
        out.extend(std::iter::once(step).chain(step.compensation.as_deref()).map(|s| (wf.to_owned(), s)));
        if let Some(body) = step.kind.loop_spec().filter(|l| l.inline).and_then(|l| l.body.child.as_deref()) {
            steps_with_bodies(&format!("{wf} loop {}", step.name), body, out);
        }
    }
}

fn check_config(workflows_json: &str, agents_json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Report {
    let mut r = Report::default();
    let registry = read_workflows(workflows_json, &mut r.problems);
    let agents: Vec<AgentSurvey> = read_agents(agents_json, vars, &mut r.problems);
    for a in &agents {
        let mut said = vec![a.kind.to_owned()];
        said.extend(a.max_in_flight.map(|max| format!("max_in_flight {max}")));
        said.extend(a.rate.map(|rate| {
            let per = if rate.per_ms == 1_000 { "second" } else { "minute" };
            format!("rate {} a {per}, burst {}", rate.calls, rate.burst)
        }));
        r.agents.push(format!("{} ({})", a.name, said.join(", ")));
        if let Some(var) = &a.missing_var {
            r.problems.push(format!("agent {}: variable {var} is not set (every call would fail)", a.name));
        }
    }
    // with a workflows file that breaks a rule, the workflows that parse are checked all the same
    let (defs, whole): (Vec<WorkflowDef>, bool) = match registry {
        Ok(registry) => (registry.all().cloned().collect(), true),
        Err(parsed) => (parsed, false),
    };
    let mut used = BTreeSet::new();
    for def in &defs {
        r.workflows.push(format!("{}@{}", def.name, def.version));
        let mut steps = Vec::new();
        steps_with_bodies(&format!("{}@{}", def.name, def.version), def, &mut steps);
        for (wf, step) in steps {
            let Some(agent) = step.agent() else { continue };
            used.insert(agent.to_owned());
            match agents.iter().find(|a| a.name == agent) {
                None => r.problems.push(format!(
                    "workflow {wf} step {}: agent {agent:?} is not defined in the agents file",
                    step.name
                )),
                Some(a) if a.callback_only && !step.kind.answers_by_token() => r.problems.push(format!(
                    "workflow {wf} step {}: agent {} ({}) only hands the work over, so the step must be kind \"callback\" (with timeout_ms)",
                    step.name, a.name, a.kind
                )),
                Some(a) if a.max_in_flight.is_some() && step.schedule_to_start_ms.is_none() => r.warnings.push(format!(
                    "workflow {wf} step {}: agent {} takes at most {} calls at once; a request waiting for a slot \
                     uses the queue budget (template parameter QueueBudgetMs): set schedule_to_start_ms to the longest wait you accept",
                    step.name, a.name, a.max_in_flight.unwrap_or_default()
                )),
                Some(_) => {}
            }
        }
    }
    r.workflows.sort();
    // (an agent used only by a workflow that did not parse is not "used by no workflow")
    for a in agents.iter().filter(|a| whole && !used.contains(&a.name)) {
        r.warnings.push(format!("agent {} is used by no workflow", a.name));
    }
    r
}

#[cfg(test)]
mod grant_tests {
    use super::*;

    #[test]
    fn iam_wildcards_match_as_iam_does() {
        assert!(glob("arn:aws:lambda:*:123:function:charge", "arn:aws:lambda:eu-west-1:123:function:charge"));
        assert!(glob(
            "arn:aws:lambda:eu-west-1:123:function:charge:*",
            "arn:aws:lambda:eu-west-1:123:function:charge:live"
        ));
        assert!(!glob(
            "arn:aws:lambda:eu-west-1:123:function:charge",
            "arn:aws:lambda:eu-west-1:123:function:charge:live"
        ));
        assert!(glob("arn:aws:sqs:*:*:work-?", "arn:aws:sqs:us-east-1:1:work-7"));
        assert!(!glob("arn:aws:sqs:*:*:work-?", "arn:aws:sqs:us-east-1:1:work-77"));
        // a name is matched against the ARN's last part (a secret's with its random suffix)
        assert!(covers("arn:aws:lambda:eu-west-1:123:function:charge", "charge"));
        assert!(!covers("arn:aws:lambda:eu-west-1:123:function:charge", "charg"));
        assert!(covers("arn:aws:secretsmanager:eu-west-1:123:secret:prod/api-key-??????", "prod/api-key"));
        assert!(covers("arn:aws:ssm:eu-west-1:123:parameter/prod/key", "/prod/key"));
        assert!(covers("arn:aws:events:eu-west-1:123:event-bus/orders", "orders"));
    }

    #[test]
    fn every_kind_s_grant_parameter_is_one_the_template_grants_the_agent_role_by() {
        // one agent of every kind that calls AWS, each call's grant naming its own parameter
        let ag = r#"{"agents": {
            "fn": {"kind": "lambda", "function": "arn:aws:lambda:eu-west-1:123:function:charge"},
            "api": {"kind": "http", "url": "https://a.execute-api.eu-west-1.amazonaws.com/p", "sign": {"service": "execute-api"},
                    "headers": {"X-A": {"secret": "s"}, "X-B": {"parameter": "arn:aws:ssm:eu-west-1:123:parameter/p"}}},
            "q": {"kind": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/work"},
            "t": {"kind": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123:work"},
            "b": {"kind": "eventbridge", "bus": "arn:aws:events:eu-west-1:123:event-bus/orders", "source": "s", "detail_type": "d"},
            "ask": {"kind": "approval", "topic_arn": "arn:aws:sns:eu-west-1:123:approvals"},
            "put": {"kind": "aws", "service": "dynamodb", "action": "putItem", "resources": ["arn:aws:dynamodb:*:*:table/t"]}}}"#;
        let survey = sas_core::agent::survey(ag, &|_| None).expect("valid agents");
        let grants: Vec<&sas_core::agent::Grant> = survey.iter().flat_map(|a| &a.grants).collect();
        let params: BTreeSet<&str> =
            grants.iter().map(|g| g.parameter).chain(grants.iter().filter_map(|g| g.action_parameter)).collect();
        assert_eq!(params.len(), 9, "{params:?}");
        let template = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml")).unwrap();
        // the Parameters section: its lines up to the next top-level key
        let after = template.split("\nParameters:\n").nth(1).expect("a Parameters section");
        let declared: BTreeSet<&str> = after
            .lines()
            .take_while(|l| l.is_empty() || l.starts_with(' ') || l.starts_with('#'))
            .filter_map(|l| l.strip_prefix("  ").and_then(|n| n.strip_suffix(':')))
            .collect();
        for p in params {
            assert!(declared.contains(p), "template.yaml declares no parameter {p}");
            let refs = template
                .match_indices(&format!("!Ref {p}"))
                .any(|(i, m)| !template[i + m.len()..].starts_with(|c: char| c.is_ascii_alphanumeric()));
            assert!(refs, "template.yaml grants nothing by {p}");
        }
    }

    #[test]
    fn every_agent_call_needs_its_grant_in_the_template_parameters() {
        let wf = r#"{"workflows": [{"name": "w", "version": 1, "steps": [
            {"name": "a", "agent": "fn", "timeout_ms": 1000},
            {"name": "b", "agent": "ask", "kind": "callback", "timeout_ms": 1000}]}]}"#;
        let ag = r#"{"agents": {"fn": {"kind": "lambda", "function": "arn:aws:lambda:eu-west-1:123:function:charge"},
            "ask": {"kind": "approval", "topic_arn": "${APPROVAL_TOPIC_ARN}"}}}"#;
        let vars =
            |k: &str| (k == "APPROVAL_TOPIC_ARN").then(|| "arn:aws:sns:eu-west-1:123:stack-approvals".to_owned());
        let none = check_with_grants(wf, ag, &vars, &|_| None);
        assert_eq!(none.problems.len(), 1, "{:#?}", none.problems);
        assert!(
            none.problems[0].contains("lambda:InvokeFunction on arn:aws:lambda:eu-west-1:123:function:charge")
                && none.problems[0].contains("AgentFunctionArns"),
            "{}",
            none.problems[0]
        );
        let other = check_with_grants(wf, ag, &vars, &|k| {
            (k == "AgentFunctionArns").then(|| "arn:aws:lambda:eu-west-1:123:function:refund".to_owned())
        });
        assert_eq!(other.problems.len(), 1, "another function's grant does not count");
        let granted = check_with_grants(wf, ag, &vars, &|k| {
            (k == "AgentFunctionArns").then(|| {
                " arn:aws:lambda:eu-west-1:123:function:refund, arn:aws:lambda:*:123:function:charge".to_owned()
            })
        });
        assert!(granted.ok(), "{:#?}", granted.problems);
        // a topic other than the one the template sets APPROVAL_TOPIC_ARN to needs its grant
        let ag2 = ag.replace("${APPROVAL_TOPIC_ARN}", "arn:aws:sns:eu-west-1:999:not-ours");
        let r = check_with_grants(wf, &ag2, &vars, &|k| {
            (k == "AgentFunctionArns").then(|| "arn:aws:lambda:*:123:function:charge".to_owned())
        });
        assert!(
            r.problems.iter().any(|p| p.contains("sns:Publish") && p.contains("AgentTopicArns")),
            "{:#?}",
            r.problems
        );
    }

    #[test]
    fn validate_checks_the_delivering_kinds_against_the_template_parameters_and_their_steps() {
        let wf = r#"{"workflows": [{"name": "w", "version": 1, "steps": [
            {"name": "a", "agent": "q", "kind": "callback", "timeout_ms": 1000},
            {"name": "b", "agent": "local", "kind": "callback", "timeout_ms": 1000},
            {"name": "c", "agent": "t", "kind": "callback", "timeout_ms": 1000},
            {"name": "d", "agent": "bus", "kind": "callback", "timeout_ms": 1000},
            {"name": "e", "agent": "bus-arn", "kind": "callback", "timeout_ms": 1000}]}]}"#;
        let ag = r#"{"agents": {
            "q": {"kind": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/work"},
            "local": {"kind": "sqs", "queue_url": "http://localhost:4566/000000000000/local-work"},
            "t": {"kind": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:work"},
            "bus": {"kind": "eventbridge", "bus": "orders"},
            "bus-arn": {"kind": "eventbridge", "bus": "arn:aws:events:eu-west-1:123456789012:event-bus/shop"}}}"#;
        let none = check_with_grants(wf, ag, &|_| None, &|_| None);
        let mut said: Vec<&str> = none
            .problems
            .iter()
            .map(|p| {
                ["AgentQueueArns", "AgentTopicArns", "AgentEventBusArns"]
                    .into_iter()
                    .find(|param| p.contains(param))
                    .unwrap_or_else(|| panic!("{p}"))
            })
            .collect();
        said.sort_unstable();
        assert_eq!(
            said,
            ["AgentEventBusArns", "AgentEventBusArns", "AgentQueueArns", "AgentQueueArns", "AgentTopicArns"],
            "{:#?}",
            none.problems
        );
        let params = |k: &str| match k {
            "AgentQueueArns" => Some("arn:aws:sqs:eu-west-1:123456789012:work,arn:aws:sqs:*:*:local-*".to_owned()),
            "AgentTopicArns" => Some("arn:aws:sns:eu-west-1:123456789012:work".to_owned()),
            "AgentEventBusArns" => Some("arn:aws:events:*:123456789012:event-bus/*".to_owned()),
            _ => None,
        };
        let granted = check_with_grants(wf, ag, &|_| None, &params);
        assert!(granted.ok(), "{:#?}", granted.problems);
        // a call step cannot use them: nothing would ever answer
        let sync = wf.replace(r#""agent": "q", "kind": "callback""#, r#""agent": "q""#);
        let r = check_with_grants(&sync, ag, &|_| None, &params);
        assert_eq!(r.problems.len(), 1, "{:#?}", r.problems);
        assert!(r.problems[0].contains("step a: agent q (sqs) only hands the work over"), "{}", r.problems[0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_core::agent::BUILT_IN_AGENTS;
    use sas_protocol::workflow::BUILT_IN_WORKFLOWS;

    fn deployed(k: &str) -> Option<String> {
        // what the template sets for the Agent function
        ["ORDER_SERVICE_URL", "APPROVAL_TOPIC_ARN", "DEFAULT_EVENT_BUS_ARN", "CALLBACK_QUEUE_URL", "CALLBACK_URL"]
            .contains(&k)
            .then(|| match k {
                "APPROVAL_TOPIC_ARN" => "arn:aws:sns:us-east-1:1:t".into(),
                "DEFAULT_EVENT_BUS_ARN" => "arn:aws:events:us-east-1:1:event-bus/default".into(),
                _ => "https://x".into(),
            })
    }

    #[test]
    fn an_aws_agent_on_the_stack_s_default_bus_needs_no_parameter_and_another_bus_does() {
        let wf = r#"{"workflows": [{"name": "w", "version": 1, "steps": [
            {"name": "a", "agent": "announce", "timeout_ms": 1000}]}]}"#;
        let ag = r#"{"agents": {"announce": {"kind": "aws", "service": "eventbridge", "action": "putEvents",
            "resources": ["${DEFAULT_EVENT_BUS_ARN}"]}}}"#;
        let shipped = check_with_grants(wf, ag, &deployed, &|_| None);
        assert!(shipped.ok(), "the template grants events:PutEvents on its default bus: {:#?}", shipped.problems);
        let other = ag.replace("${DEFAULT_EVENT_BUS_ARN}", "arn:aws:events:us-east-1:1:event-bus/billing");
        let r = check_with_grants(wf, &other, &deployed, &|_| None);
        assert!(
            r.problems.iter().any(|p| p.contains("events:PutEvents") && p.contains("AgentAwsActions"))
                && r.problems.iter().any(|p| p.contains("event-bus/billing") && p.contains("AgentAwsResources")),
            "{:#?}",
            r.problems
        );
        // another action on the default bus is not what the template grants on it
        let list = ag.replace("putEvents", "listRules");
        let r = check_with_grants(wf, &list, &deployed, &|_| None);
        assert!(r.problems.iter().any(|p| p.contains("events:ListRules")), "{:#?}", r.problems);
    }

    #[test]
    fn the_shipped_configuration_is_valid() {
        let r = check(BUILT_IN_WORKFLOWS, BUILT_IN_AGENTS, &deployed);
        assert!(r.ok(), "{:?}", r.problems);
        assert!(r.workflows.iter().any(|w| w == "order@1"), "{:?}", r.workflows);
        assert!(r.agents.iter().any(|a| a == "approval (approval)"), "{:?}", r.agents);
    }

    #[test]
    fn an_unknown_agent_an_unset_variable_and_a_synchronous_approval_are_problems() {
        let wf = r#"{"workflows": [{"name": "w", "version": 2, "steps": [
            {"name": "a", "agent": "nope", "timeout_ms": 1000},
            {"name": "b", "agent": "ask", "timeout_ms": 1000},
            {"name": "c", "agent": "svc", "timeout_ms": 1000}]}]}"#;
        let ag = r#"{"agents": {"ask": {"kind": "approval", "topic_arn": "arn:aws:sns:us-east-1:1:t"},
            "svc": {"kind": "http", "url": "${SVC_URL}/x"}, "spare": {"kind": "sim"}}}"#;
        let r = check(wf, ag, &|_| None);
        assert_eq!(r.problems.len(), 3, "{:#?}", r.problems);
        assert!(r.problems[0].contains("SVC_URL"), "{}", r.problems[0]);
        assert!(r.problems.iter().any(|p| p.contains("step a") && p.contains("\"nope\" is not defined")));
        assert!(r.problems.iter().any(|p| p.contains("step b") && p.contains("callback")));
        assert_eq!(r.warnings, vec!["agent spare is used by no workflow".to_owned()]);
        let fixed = check(wf, ag, &|k| (k == "SVC_URL").then(|| "http://svc".into()));
        assert_eq!(fixed.problems.len(), 2, "the variable set, its problem is gone");
    }

    #[test]
    fn the_steps_of_a_loop_s_inline_body_are_checked_against_the_agents_as_any_step() {
        let wf = r#"{"workflows": [{"name": "w", "version": 1, "steps": [
            {"name": "poll", "kind": "loop", "max_iterations": 3, "timeout_ms": 60000,
             "body": [{"name": "ask", "agent": "status", "timeout_ms": 1000},
                      {"name": "note", "agent": "nope", "timeout_ms": 1000}],
             "until": {"variable": "$.loop.index", "numeric_greater_than_equals": 2}}]}]}"#;
        let ag = r#"{"agents": {"status": {"kind": "sim"}}}"#;
        let r = check(wf, ag, &|_| None);
        assert_eq!(
            r.problems,
            vec!["workflow w@1 loop poll step note: agent \"nope\" is not defined in the agents file".to_owned()]
        );
        assert!(r.warnings.is_empty(), "status is used, by the loop's body: {:?}", r.warnings);
    }

    #[test]
    fn the_readme_s_workflow_is_valid_with_the_shipped_agents() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```json\n{\"workflows\"").expect("the README's workflow") + "```json\n".len();
        let wf = &readme[start..start + readme[start..].find("```").expect("its end")];
        let r = check(wf, BUILT_IN_AGENTS, &deployed);
        assert!(r.ok(), "{:#?}", r.problems);
        assert_eq!(r.workflows, vec!["order@2".to_owned()]);
    }

    #[test]
    fn every_mistake_of_a_file_is_named_with_its_path_not_only_the_first() {
        // three mistakes in the workflows file (a misspelt field, a wrong type, an unknown
        // on_failure), two in the agents file, and a `$schema` key, which is no mistake
        let wf = r#"{"$schema": "./schemas/workflows.schema.json", "workflows": [
            {"name": "w", "version": 1, "steps": [
                {"name": "a", "agent": "svc", "timeout_ms": 1000, "max_atempts": 3},
                {"name": "b", "agent": "svc", "timeout_ms": "5s"}]},
            {"name": "v", "version": 1, "on_failure": "shrug", "steps": [
                {"name": "c", "agent": "svc", "timeout_ms": 1000}]}]}"#;
        let ag = r#"{"$schema": "./schemas/agents.schema.json", "agents": {
            "svc": {"kind": "http", "url": "https://svc/x"},
            "bad": {"kind": "http", "url": "ftp://x"},
            "odd": {"kind": "htp", "url": "https://svc/y"}}}"#;
        let r = check(wf, ag, &|_| None);
        let has = |needle: &str| r.problems.iter().any(|p| p.contains(needle));
        assert_eq!(r.problems.len(), 5, "{:#?}", r.problems);
        assert!(has("at workflows[0].steps[0].max_atempts: unknown field `max_atempts`"), "{:#?}", r.problems);
        assert!(has("at workflows[0].steps[1].timeout_ms: invalid type: string \"5s\""), "{:#?}", r.problems);
        assert!(has("at workflows[1].on_failure: unknown variant `shrug`"), "{:#?}", r.problems);
        assert!(has("ftp://x") && has("htp"), "{:#?}", r.problems);
        assert!(!r.problems.iter().any(|p| p.contains("not valid JSON")), "shape is not syntax: {:#?}", r.problems);
        // the same files without their mistakes are valid, `$schema` and all
        let wf = wf.replace(r#", "max_atempts": 3"#, "").replace(r#""5s""#, "5000").replace(r#""shrug""#, r#""error""#);
        let ag = ag.replace("ftp://x", "https://x").replace("htp", "http");
        let r = check(&wf, &ag, &|_| None);
        assert!(r.ok(), "{:#?}", r.problems);
        // a file that is not JSON says so, with its line
        let r = check("{\"workflows\": [", &ag, &|_| None);
        assert!(
            r.problems.len() == 1 && r.problems[0].contains("not valid JSON") && r.problems[0].contains("line 1"),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn every_rule_a_workflow_breaks_is_named_and_the_others_are_checked_all_the_same() {
        // one workflow breaks three rules (a step name twice, a guard reading a step that does not
        // exist, a result reading another); the other is sound but calls an agent not defined
        let wf = r#"{"workflows": [
            {"name": "w", "version": 1, "result": {"x.$": "$.outputs.nowhere.x"}, "steps": [
                {"name": "a", "agent": "svc", "timeout_ms": 1000},
                {"name": "a", "agent": "svc", "timeout_ms": 1000},
                {"name": "b", "agent": "svc", "timeout_ms": 1000, "when": {"variable": "$.outputs.ghost.ok", "boolean_equals": true}}]},
            {"name": "v", "version": 1, "steps": [{"name": "c", "agent": "missing", "timeout_ms": 1000}]}]}"#;
        let ag = r#"{"agents": {"svc": {"kind": "http", "url": "https://svc/x"}}}"#;
        let r = check(wf, ag, &|_| None);
        let has = |needle: &str| r.problems.iter().any(|p| p.contains(needle));
        assert!(has("workflows[0]: workflow w: step name a is used twice"), "{:#?}", r.problems);
        assert!(has("ghost"), "the guard: {:#?}", r.problems);
        assert!(has("nowhere"), "the result: {:#?}", r.problems);
        assert!(has("agent \"missing\" is not defined"), "the other workflow: {:#?}", r.problems);
        assert_eq!(r.problems.len(), 4, "{:#?}", r.problems);
        assert!(!r.warnings.iter().any(|w| w.contains("used by no workflow")), "{:#?}", r.warnings);
    }

    #[test]
    fn files_the_functions_would_refuse_are_refused() {
        let r = check(
            "{\"workflows\": [{}]}",
            "{\"agents\": {\"x\": {\"kind\": \"http\", \"url\": \"ftp://x\"}}}",
            &|_| None,
        );
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.problems[0].starts_with("workflows: ") && r.problems[1].contains("ftp://x"), "{:?}", r.problems);
    }
}
