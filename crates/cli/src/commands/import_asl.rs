//! `sasctl import-asl`: Step Functions state machines translated ([`sas_asl`]), the two files
//! written, then checked as `validate` does; the exit status says how it went.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Translate Step Functions state machines (Amazon States Language, JSONPath) into a
/// workflows file and an agents file, then check them as validate does (with --var and
/// --param as validate takes them). Each FILE becomes a workflow named after it (NAME.asl.json
/// is NAME); what cannot be translated is refused with every state and field that cannot be
/// and what to do instead; how the translation differs from the state machine is printed
/// with it. Exit status: 0 every file translated and the check clean; 2 a file refused (the
/// others still written); 3 every file translated but the check needs variables (--var) or
/// template parameters (--param) not passed, each named with the flag to pass; 1 an error (a
/// file unreadable or not JSON, a file not written, a problem of the check's own).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// State machine definitions (JSON).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where the workflows file is written.
    #[arg(long, value_name = "FILE", default_value = "imported-workflows.json")]
    pub workflows: PathBuf,
    /// Where the agents file is written.
    #[arg(long, value_name = "FILE", default_value = "imported-agents.json")]
    pub agents: PathBuf,
    /// A variable the functions will have, KEY=VALUE, for the check (a definition's
    /// ${FunctionArn} substitutions stay variables of the agents file).
    #[arg(long = "var")]
    pub vars: Vec<String>,
    /// A template parameter as you deploy it, NAME=VALUE, for the check, as validate takes it
    /// (AgentFunctionArns=arn:aws:lambda:...:function:quote,...: every AWS call an agent makes
    /// must be granted by one).
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// The max_iterations of every loop translated (Step Functions bounds none; a loop that
    /// reaches it fails its task): 1 to 10000.
    #[arg(long, value_name = "N", default_value_t = sas_asl::LOOP_BOUND,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(sas_protocol::workflow::MAX_LOOP_ITERATIONS)))]
    pub loop_bound: u32,
}

/// Translate each file, print what was translated, refused and noted, write the two files (even
/// when some were refused, with the others), check them; the exit status (0 all translated and
/// clean, 2 a file refused, 3 the check needs --var or --param not passed, 1 an error).
pub fn run(args: &Args) -> Result<i32> {
    let Args { files, workflows, agents, vars, params, loop_bound } = args;
    let options = sas_asl::Options { loop_bound: *loop_bound };
    import_asl(files, workflows, agents, vars, params, options)
}

fn import_asl(
    files: &[PathBuf],
    workflows: &Path,
    agents: &Path,
    vars: &[String],
    params: &[String],
    options: sas_asl::Options,
) -> Result<i32> {
    let mut wfs = Vec::new();
    let mut all_agents = serde_json::Map::new();
    let (mut refused, mut unread) = (0, 0);
    for f in files {
        let def = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display())).and_then(|text| {
            serde_json::from_str::<serde_json::Value>(&text).with_context(|| format!("{} is not JSON", f.display()))
        });
        let def = match def {
            Ok(def) => def,
            Err(e) => {
                unread += 1;
                println!("{}: error: {e:#}", f.display());
                continue;
            }
        };
        let name = sas_asl::workflow_name(f);
        match sas_asl::import_with(&name, &def, options) {
            Ok(mut i) => {
                let renamed = sas_asl::merge_agents(&mut all_agents, &mut i);
                let steps = i.workflow["steps"].as_array().map_or(0, Vec::len);
                let children = i.children.iter().filter_map(|w| w["name"].as_str()).collect::<Vec<_>>();
                let runs =
                    if children.is_empty() { String::new() } else { format!(", running {}", children.join(", ")) };
                println!(
                    "{}: translated as workflow {name}: {steps} step(s), {} agent(s){runs}",
                    f.display(),
                    i.agents.len()
                );
                for n in i.notes.iter().chain(&renamed) {
                    println!("  differs: {n}");
                }
                wfs.extend(i.workflows());
            }
            Err(rs) => {
                refused += 1;
                println!("{}: refused ({} reason(s)):", f.display(), rs.len());
                for r in rs {
                    println!("  {r}");
                }
            }
        }
    }
    if wfs.is_empty() {
        println!("nothing translated: {refused} file(s) refused, {unread} not read; no file written");
        return Ok(if unread > 0 { 1 } else { 2 });
    }
    let wf = serde_json::json!({"workflows": wfs});
    let agent_count = all_agents.len();
    let ag = sas_asl::agents_file(&all_agents);
    std::fs::write(workflows, serde_json::to_string_pretty(&wf)? + "\n")
        .with_context(|| format!("writing {}", workflows.display()))?;
    std::fs::write(agents, serde_json::to_string_pretty(&ag)? + "\n")
        .with_context(|| format!("writing {}", agents.display()))?;
    println!(
        "wrote {} ({} workflow(s)) and {} ({} agent(s)); checking them:",
        workflows.display(),
        wfs.len(),
        agents.display(),
        agent_count
    );
    let report = super::validate::check(Some(workflows), Some(agents), vars, params, None)?;
    let needs = crate::asl::Needs::of(&report.problems);
    if let Ok(needs) = &needs {
        if !needs.is_empty() {
            println!("the check needs what was not passed; pass:");
            for flag in needs.flags() {
                println!("  {flag}");
            }
        }
    }
    let (status, why) = match (&needs, unread, refused) {
        (Err(other), _, _) => (1, format!("{} problem(s) of the translation's own (above)", other.len())),
        (_, 1.., _) => (1, format!("{unread} of {} file(s) not read (above)", files.len())),
        (_, _, 1..) => (2, format!("{refused} of {} file(s) refused (above)", files.len())),
        (Ok(n), _, _) if !n.is_empty() => (
            3,
            format!(
                "translated, but the check needs {} variable(s) and {} template parameter(s) not passed (above)",
                n.vars.len(),
                n.params.len()
            ),
        ),
        _ => (0, String::new()),
    };
    if status != 0 {
        println!("exit status {status}: {why}");
    }
    Ok(status)
}
