//! `sasctl validate`: a configuration checked as the functions will load it ([`crate::validate`]),
//! its report printed, and with `--graph` a workflow drawn ([`crate::diagram`]).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sas_protocol::workflow::WorkflowRegistry;

use super::key_values;

/// Check a configuration before deploying it, as the functions will load it: the workflows
/// parse and respect the limits, every step's agent is defined, every variable an agent needs
/// is set (from --var and the environment), hand-off agents sit on callback steps, every AWS
/// call of an agent is granted by the template parameters (--param). Prints what it checked;
/// exits 1 when anything would fail. Needs no stack.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The workflows file (default: the built-in config/workflows.json).
    #[arg(long, value_name = "FILE")]
    pub workflows: Option<PathBuf>,
    /// The agents file (default: the built-in config/agents.json).
    #[arg(long, value_name = "FILE")]
    pub agents: Option<PathBuf>,
    /// A variable the functions will have, KEY=VALUE (the template's, e.g. ORDER_SERVICE_URL).
    #[arg(long = "var")]
    pub vars: Vec<String>,
    /// A template parameter as you deploy it, NAME=VALUE (e.g.
    /// AgentFunctionArns=arn:aws:lambda:...:function:charge,arn:...): every AWS call an agent
    /// makes must be granted by one (the Agent function's role); without them only the stack's
    /// own resources are. AgentVariables=KEY=VALUE,KEY=VALUE gives the agents' ${VAR}s their
    /// values, as on the stack.
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// Then print this workflow (NAME or NAME@VERSION; the latest version by default) as a
    /// Mermaid flowchart on stdout (the check's report goes to stderr then).
    #[arg(long, value_name = "WORKFLOW")]
    pub graph: Option<String>,
}

pub fn run(args: &Args) -> Result<i32> {
    let Args { workflows, agents, vars, params, graph } = args;
    let r = check(workflows.as_deref(), agents.as_deref(), vars, params, graph.as_deref())?;
    if !r.ok() {
        bail!("{} problem(s): this configuration would fail in the functions", r.problems.len());
    }
    Ok(0)
}

/// Check the files (the ones named, else those [`crate::config_files`] finds) with these
/// variables and template parameters, print the report (on stderr when `graph` is asked, the
/// diagram going to stdout), and return it. `import-asl` checks what it wrote with it.
pub(crate) fn check(
    workflows: Option<&Path>,
    agents: Option<&Path>,
    vars: &[String],
    params: &[String],
    graph: Option<&str>,
) -> Result<crate::validate::Report> {
    let say = |line: String| if graph.is_some() { eprintln!("{line}") } else { println!("{line}") };
    let (wf, ag) = (crate::config_files::workflows(workflows)?, crate::config_files::agents(agents)?);
    let (wf, wf_from, ag, ag_from) = (wf.text, wf.from.to_string(), ag.text, ag.from.to_string());
    let given = key_values("var", vars)?;
    let params = key_values("param", params)?;
    // as the Agent function sees them: its environment, then the template parameter AgentVariables
    let deployed = sas_core::agent::parse_variables(params.get("AgentVariables").map_or("", String::as_str))
        .context("--param AgentVariables")?;
    let lookup = |k: &str| {
        given
            .get(k)
            .cloned()
            .filter(|v| !v.is_empty())
            .or_else(|| std::env::var(k).ok().filter(|v| !v.is_empty()))
            .or_else(|| deployed.get(k).cloned())
            .filter(|v| !v.is_empty())
    };
    let r = crate::validate::check_with_grants(&wf, &ag, &lookup, &|k| params.get(k).cloned());
    say(format!(
        "workflows from {wf_from}: {}",
        if r.workflows.is_empty() { "-".into() } else { r.workflows.join(", ") }
    ));
    say(format!("agents from {ag_from}: {}", if r.agents.is_empty() { "-".into() } else { r.agents.join(", ") }));
    for w in &r.warnings {
        say(format!("warning: {w}"));
    }
    for p in &r.problems {
        say(format!("problem: {p}"));
    }
    if !r.ok() {
        return Ok(r);
    }
    say(format!("valid: {} workflow(s), {} agent(s)", r.workflows.len(), r.agents.len()));
    if let Some(name) = graph {
        let registry = WorkflowRegistry::from_json(&wf)?;
        let (name, version) = match name.split_once('@') {
            Some((n, v)) => {
                (n, Some(v.parse::<u32>().with_context(|| format!("--graph {name}: a version is a number"))?))
            }
            None => (name, None),
        };
        let def = registry
            .resolve(name, version)
            .with_context(|| format!("--graph: no workflow {name} (the file has {})", r.workflows.join(", ")))?;
        print!("{}", crate::diagram::mermaid(def));
    }
    Ok(r)
}
