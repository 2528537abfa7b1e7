//! `sasctl validate`: check a configuration (workflows and agents) before it is deployed, as the
//! functions will load it, and what the functions would only find out task by task: a step naming
//! an agent that is not defined, an agent whose variable is not set, an approval agent on a step
//! that is not a callback step.

use std::collections::BTreeSet;

use crate::agent::{self, AgentSurvey};
use crate::workflow::{StepKind, WorkflowRegistry};

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

/// Check `workflows_json` and `agents_json` with the variables `vars` (those the template gives
/// the functions).
pub fn check(workflows_json: &str, agents_json: &str, vars: &dyn Fn(&str) -> Option<String>) -> Report {
    let mut r = Report::default();
    let registry =
        WorkflowRegistry::from_json(workflows_json).map_err(|e| r.problems.push(format!("workflows: {e}"))).ok();
    let agents: Vec<AgentSurvey> =
        agent::survey(agents_json, vars).map_err(|e| r.problems.push(format!("agents: {e}"))).unwrap_or_default();
    for a in &agents {
        r.agents.push(format!("{} ({})", a.name, a.kind));
        if let Some(var) = &a.missing_var {
            r.problems.push(format!("agent {}: variable {var} is not set (every call would fail)", a.name));
        }
    }
    let Some(registry) = registry else { return r };
    let mut used = BTreeSet::new();
    for def in registry.all() {
        r.workflows.push(format!("{}@{}", def.name, def.version));
        for step in def.steps.iter().flat_map(|s| std::iter::once(s).chain(s.compensation.as_deref())) {
            if step.kind == StepKind::Wait {
                continue;
            }
            used.insert(step.agent.clone());
            match agents.iter().find(|a| a.name == step.agent) {
                None => r.problems.push(format!(
                    "workflow {}@{} step {}: agent {:?} is not defined in the agents file",
                    def.name, def.version, step.name, step.agent
                )),
                Some(a) if a.callback_only && step.kind != StepKind::Callback => r.problems.push(format!(
                    "workflow {}@{} step {}: agent {} ({}) only hands the work over, so the step must be kind \"callback\" (with timeout_ms)",
                    def.name, def.version, step.name, a.name, a.kind
                )),
                Some(_) => {}
            }
        }
    }
    r.workflows.sort();
    for a in agents.iter().filter(|a| !used.contains(&a.name)) {
        r.warnings.push(format!("agent {} is used by no workflow", a.name));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::BUILT_IN_AGENTS;
    use crate::workflow::BUILT_IN_WORKFLOWS;

    fn deployed(k: &str) -> Option<String> {
        // what the template sets for the Agent function
        ["ORDER_SERVICE_URL", "APPROVAL_TOPIC_ARN", "CALLBACK_QUEUE_URL", "CALLBACK_URL"].contains(&k).then(|| {
            if k == "APPROVAL_TOPIC_ARN" {
                "arn:aws:sns:us-east-1:1:t".into()
            } else {
                "https://x".into()
            }
        })
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
