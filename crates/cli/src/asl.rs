//! `sasctl import-asl`: the translation is the crate sas-asl's (a definition in, the workflows,
//! agents and notes or the refusals out), re-exported here under the paths sasctl and its tests
//! use; what the command adds is the reading of the check (sas-core's `validate`) that follows
//! it: [`Needs`], the variables and template parameters to pass.

pub use sas_asl::{agents_file, data, import, merge_agents, workflow_name, Imported, Refusal};

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
                // an action granted by a parameter of actions (AgentAwsActions) names no resource:
                // the action is the parameter's value
                let (action, resource) = what.split_once(" on ").unwrap_or((what, what));
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
                .map(|(r, _)| {
                    // a signed URL as its API's ARN (an IAM policy takes no URL); an ARN, `*`, an
                    // action (`states:DescribeExecution`) as written; a name as its ARN
                    if r.starts_with("https://") || r.starts_with("http://") {
                        signed_url_arn(r)
                    } else if r.starts_with("arn:") || r == "*" || r.contains(':') {
                        r.clone()
                    } else {
                        format!("<ARN of {r}>")
                    }
                })
                .collect();
            resources.dedup();
            let why: Vec<&str> = grants.iter().map(|(_, w)| w.as_str()).collect();
            out.push(format!("--param {p}={}  ({})", resources.join(","), why.join("; ")));
        }
        out
    }
}

/// What grants a signed call to `url` in `AgentSignedApiArns`: for an API Gateway address
/// (`https://API.execute-api.REGION.amazonaws.com/STAGE/PATH`) its ARN,
/// `arn:aws:execute-api:REGION:*:API/STAGE/*/PATH` (any account, any method); for another address
/// (a custom domain, a function URL), which names no ARN, what to look up.
fn signed_url_arn(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let parts: Vec<&str> = host.split('.').collect();
    match parts.as_slice() {
        [api, "execute-api", region, "amazonaws", "com"] => {
            let (stage, resource) = path.split_once('/').unwrap_or((path, ""));
            let stage = if stage.is_empty() { "*" } else { stage };
            let resource = if resource.is_empty() { "*" } else { resource };
            format!("arn:aws:execute-api:{region}:*:{api}/{stage}/*/{resource}")
        }
        _ => format!("<ARN of the API or function behind {url}>"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_url_is_granted_by_its_api_s_arn() {
        assert_eq!(
            signed_url_arn("https://a1b2.execute-api.us-east-2.amazonaws.com/prod/pets?x=1"),
            "arn:aws:execute-api:us-east-2:*:a1b2/prod/*/pets"
        );
        assert_eq!(
            signed_url_arn("https://a1b2.execute-api.us-east-2.amazonaws.com"),
            "arn:aws:execute-api:us-east-2:*:a1b2/*/*/*"
        );
        assert!(signed_url_arn("https://abc.lambda-url.eu-west-1.on.aws/").starts_with("<ARN of the API or function"));
    }

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
            "agent aws.sfn.StopExecution: needs states:StopExecution: add it to the template parameter \
             AgentAwsActions (the Agent function's role only)"
                .to_owned(),
            "agent aws.sfn.StopExecution: needs states:StopExecution on *: add it to the template parameter \
             AgentAwsResources (the Agent function's role only)"
                .to_owned(),
        ];
        let needs = Needs::of(&problems).expect("only what was not passed");
        assert_eq!(needs.vars["QuoteFunctionArn"], ["fn.quote", "fn.price"]);
        assert_eq!(
            needs.flags(),
            [
                "--var QuoteFunctionArn=VALUE  (read by fn.quote, fn.price; or in --param AgentVariables)",
                "--param AgentAwsActions=states:StopExecution  (states:StopExecution for aws.sfn.StopExecution)",
                "--param AgentAwsResources=*  (states:StopExecution for aws.sfn.StopExecution)",
                "--param AgentEventBusArns=<ARN of orders>  (events:PutEvents for bus.orders.send)",
                "--param AgentTopicArns=arn:aws:sns:eu-west-1:1:alerts  (sns:Publish for sns.alerts.send)",
            ]
        );
        let other = "workflows: workflow w: step name a is used twice".to_owned();
        let mixed = [problems[0].clone(), other.clone()];
        assert_eq!(Needs::of(&mixed), Err(vec![other]));
        assert!(Needs::of(&[]).unwrap().is_empty());
    }

    /// The importer leaves a function's permanent errors unretried by the rule the lambda agent
    /// applies when it fails an attempt for good: the two read every name alike.
    #[test]
    fn the_importer_reads_permanent_errors_as_the_lambda_agent_does() {
        for name in [
            "PermanentError",
            "Permanent",
            "PermanentFailure",
            "com.example.PermanentError",
            "errors:PermanentError",
            "Outer$PermanentError",
            "mod.sub:Outer$PermanentError",
            "NotPermanentError",
            "PermanentError.Wrapped",
            "permanentError",
            "States.TaskFailed",
            "States.ALL",
            "Lambda.ServiceException",
            "TransientError",
            "",
            ".",
            "Permanent.",
        ] {
            assert_eq!(sas_asl::is_permanent_name(name), sas_core::agent::lambda::is_permanent_type(name), "{name:?}");
        }
    }
}
