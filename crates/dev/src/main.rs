//! sas-dev: the developer's commands, apart from sasctl (the operator's tool): `demo` (the main
//! job: the order service and sample orders on a stack of LocalStack) and `load` (the load
//! benchmark). `demo` links the order service, which sasctl does not; both read the stack as
//! sasctl does (the same global options, `sas_cli::commands::Global`) and print their errors as it
//! does: one line, exit status 1.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use sas_cli::commands::Global;

mod demo;
mod load;

#[derive(Parser)]
#[command(
    name = "sas-dev",
    version,
    about = "Scheduler-Agent-Supervisor, the developer's commands: the demo, the load benchmark"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Demo(DemoArgs),
    Load(load::Args),
}

/// The main job: run every role here, submit sample orders, show them move, check the ends.
#[derive(clap::Args)]
struct DemoArgs {
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 240)]
    timeout: u64,
    /// Lambda mode: deploy stack --name with the functions on, their bootstraps from this
    /// folder, and let LocalStack's event sources and scheduled rule invoke them (no local runner).
    #[arg(long, value_name = "DIR")]
    functions: Option<PathBuf>,
    /// Lambda mode: the directory the configuration layer is made of (workflows.json, agents.json).
    #[arg(long, value_name = "DIR", default_value = "config")]
    config: PathBuf,
    /// The stack of the Lambda mode (created, or updated with this run's order service URL).
    #[arg(long, default_value = "sas-demo-lambda")]
    name: String,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    sas_core::telemetry::init_with_default("info");
    // boxed: run holds every command's future, too large for the stack of main's own
    sas_cli::commands::exit_with(Box::pin(run(&cli)).await);
}

/// The command's `run`, and its exit status.
async fn run(cli: &Cli) -> Result<i32> {
    let g = &cli.global;
    match &cli.cmd {
        Cmd::Demo(a) => {
            let sdk = sas_cli::commands::sdk().await;
            let timeout = Duration::from_secs(a.timeout);
            let ok = match &a.functions {
                Some(dir) => demo::run_lambda(&sdk, &a.name, dir, &a.config, &g.outputs, timeout).await?,
                None => demo::run(&sdk, g.deps(&sdk).await?, timeout).await?,
            };
            Ok(i32::from(!ok))
        }
        Cmd::Load(a) => load::run(a, g).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The book's page of commands, `docs/reference/sasctl.md`, which has sas-dev's too.
    const PAGE: &str = include_str!("../../../docs/reference/sasctl.md");

    /// `--long` in `text`, as a whole option (`--timeout` is not in `--timeout-secs`).
    fn names_option(text: &str, long: &str) -> bool {
        let needle = format!("--{long}");
        text.match_indices(&needle)
            .any(|(at, _)| !text[at + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
    }

    /// Every command of sas-dev has its row on the page (`` | `sas-dev demo ...` | ... ``) naming
    /// each of its long options, and every sas-dev row names a command that exists.
    #[test]
    fn the_book_s_sasctl_page_names_every_sas_dev_command_and_option() {
        let cli = Cli::command();
        let commands: Vec<&clap::Command> = cli.get_subcommands().filter(|c| c.get_name() != "help").collect();
        let mut missing = Vec::new();
        for cmd in &commands {
            let name = cmd.get_name();
            let prefix = format!("| `sas-dev {name}");
            let rows: Vec<&str> = PAGE
                .lines()
                .filter(|l| l.strip_prefix(&prefix).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('`')))
                .collect();
            if rows.is_empty() {
                missing.push(format!("command {name} (a row `| `sas-dev {name} ...` | ... |`)"));
                continue;
            }
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) else { continue };
                if !arg.is_global_set() && !rows.iter().any(|r| names_option(r, long)) {
                    missing.push(format!("option --{long} of {name} (in its row)"));
                }
            }
        }
        assert!(missing.is_empty(), "docs/reference/sasctl.md does not name: {missing:#?}");
        for line in PAGE.lines() {
            let Some(rest) = line.strip_prefix("| `sas-dev ") else { continue };
            let word: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
            assert!(
                commands.iter().any(|c| c.get_name() == word),
                "docs/reference/sasctl.md has a row for `sas-dev {word}`, which sas-dev does not have: {line}"
            );
        }
    }
}
