//! `sasctl import-asl`: a state machine of the Amazon States Language (its JSONPath flavour)
//! translated into a workflow and the agents it calls, or refused with the state, the field and
//! what to do instead. See the book's "Bring your Step Functions state machines".
//!
//! The translation works out the state machine's data flow when it is imported ([`data`]): every
//! step reads the task's input and the outputs of the steps before it where they live, through
//! the project's templates; a `Choice` becomes guards on the steps it leads to; a `Catch` a
//! handled failure whose error the next steps read; a `Parallel` state branches of a graph; an
//! inline `Map` over one task a map step; `Fail` a step of the `fail` agent. What cannot be
//! translated exactly is refused, and every difference that remains is said ([`Imported::notes`]).

pub mod data;
mod saga;
mod states;

pub use states::{import, merge_agents, Imported, Refusal};

/// A workflow's name for a definition file: its name without `.asl.json` (or `.json`), in the
/// characters a workflow name may have.
pub fn workflow_name(path: &std::path::Path) -> String {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = file.strip_suffix(".asl.json").or_else(|| file.strip_suffix(".json")).unwrap_or(&file);
    let mut name: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
    name.truncate(64);
    if name.is_empty() {
        name = "imported".into();
    }
    name
}

/// An agents file of the agents imported: a function's error fails the attempt at once (each
/// agent's own `retry`, `max_calls` 1), to be retried only as the state machine's `Retry` says.
/// The `retry` is each agent's, so the entries may be merged into a file of other agents without
/// changing how those retry.
pub fn agents_file(agents: &serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
    let agents: serde_json::Map<String, serde_json::Value> = agents
        .iter()
        .map(|(name, spec)| {
            let mut spec = spec.clone();
            if let Some(o) = spec.as_object_mut() {
                o.entry("retry").or_insert_with(|| serde_json::json!({"max_calls": 1, "base_ms": 100, "max_ms": 1000}));
            }
            (name.clone(), spec)
        })
        .collect();
    serde_json::json!({"agents": agents})
}

/// What the check of a translation needs that was not passed: the variables (`--var`) and the
/// template parameters (`--param`) its problems name, read from the check's problems.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// A variable not set → the agents that read it.
    pub vars: std::collections::BTreeMap<String, Vec<String>>,
    /// A template parameter → what it must grant: (the resource, the agent and its action).
    pub params: std::collections::BTreeMap<String, Vec<(String, String)>>,
}

impl Needs {
    /// The check's problems as what it needs; `Err` with the problems that are not a variable
    /// or a parameter left out (something is wrong with the configuration itself).
    pub fn of(problems: &[String]) -> Result<Needs, Vec<String>> {
        let mut needs = Needs::default();
        let mut other = Vec::new();
        for p in problems {
            let Some(rest) = p.strip_prefix("agent ") else {
                other.push(p.clone());
                continue;
            };
            let var = rest
                .split_once(": variable ")
                .and_then(|(agent, v)| Some((agent, v.strip_suffix(" is not set (every call would fail)")?)));
            let grant = rest.split_once(": needs ").and_then(|(agent, g)| {
                let (what, param) = g.rsplit_once(": add it to the template parameter ")?;
                let (action, resource) = what.split_once(" on ")?;
                Some((agent, action, resource, param.split(' ').next()?))
            });
            match (var, grant) {
                (Some((agent, v)), _) => needs.vars.entry(v.to_owned()).or_default().push(agent.to_owned()),
                (None, Some((agent, action, resource, param))) => needs
                    .params
                    .entry(param.to_owned())
                    .or_default()
                    .push((resource.to_owned(), format!("{action} for {agent}"))),
                (None, None) => other.push(p.clone()),
            }
        }
        if other.is_empty() {
            Ok(needs)
        } else {
            Err(other)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty() && self.params.is_empty()
    }

    /// One line per flag to pass: `--var NAME=VALUE` (the agents that read it), `--param
    /// NAME=ARN,ARN` (what it must grant; a resource named without its ARN is written `<ARN of
    /// name>`).
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (v, agents) in &self.vars {
            out.push(format!("--var {v}=VALUE  (read by {}; or in --param AgentVariables)", agents.join(", ")));
        }
        for (p, grants) in &self.params {
            let mut resources: Vec<String> = grants
                .iter()
                .map(|(r, _)| if r.starts_with("arn:") { r.clone() } else { format!("<ARN of {r}>") })
                .collect();
            resources.dedup();
            let why: Vec<&str> = grants.iter().map(|(_, w)| w.as_str()).collect();
            out.push(format!("--param {p}={}  ({})", resources.join(","), why.join("; ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_s_problems_name_the_variables_and_parameters_to_pass() {
        let problems = [
            "agent fn.quote: variable QuoteFunctionArn is not set (every call would fail)".to_owned(),
            "agent fn.price: variable QuoteFunctionArn is not set (every call would fail)".to_owned(),
            "agent sns.alerts.send: needs sns:Publish on arn:aws:sns:eu-west-1:1:alerts: add it to the template \
             parameter AgentTopicArns (the Agent function's role only)"
                .to_owned(),
            "agent bus.orders.send: needs events:PutEvents on orders: add it to the template parameter \
             AgentEventBusArns (the Agent function's role only)"
                .to_owned(),
        ];
        let needs = Needs::of(&problems).expect("only what was not passed");
        assert_eq!(needs.vars["QuoteFunctionArn"], ["fn.quote", "fn.price"]);
        assert_eq!(
            needs.flags(),
            [
                "--var QuoteFunctionArn=VALUE  (read by fn.quote, fn.price; or in --param AgentVariables)",
                "--param AgentEventBusArns=<ARN of orders>  (events:PutEvents for bus.orders.send)",
                "--param AgentTopicArns=arn:aws:sns:eu-west-1:1:alerts  (sns:Publish for sns.alerts.send)",
            ]
        );
        let other = "workflows: workflow w: step name a is used twice".to_owned();
        let mixed = [problems[0].clone(), other.clone()];
        assert_eq!(Needs::of(&mixed), Err(vec![other]));
        assert!(Needs::of(&[]).unwrap().is_empty());
    }
}
