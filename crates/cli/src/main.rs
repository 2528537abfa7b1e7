//! sasctl: deploy the stack onto LocalStack, run the roles locally, and operate tasks.
//!
//! This file is the dispatcher: the top-level parser, the global options and one `match` that
//! calls each command's `run`. Each command (its arguments and its `run`) is a module of
//! `sas_cli::commands` (`crates/cli/src/commands/`). The developer's commands (demo, load) are
//! another binary's, sas-dev (`crates/dev`): the demo links the order service, sasctl does not.
//!
//! Errors end the process through `commands::exit_with` (as sas-dev's do): one line with their
//! causes (`error: ...: ...`) and exit code 1, since an operator's refusal is not a crash (no
//! backtrace even with `RUST_BACKTRACE=1`). A command's other exit statuses are its `run`'s
//! (`import-asl`, `submit --wait`).

use anyhow::Result;
use clap::{Parser, Subcommand};
use sas_cli::commands::{self, Global};

#[derive(Parser)]
#[command(name = "sasctl", version, about = "Scheduler-Agent-Supervisor: deploy, run locally, operate tasks")]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The commands, in the order `sasctl --help` lists them; each one's help is its `Args`' doc
/// comment.
#[derive(Subcommand)]
enum Cmd {
    DeployLocal(commands::deploy_local::Args),
    IamCheck(commands::iam_check::Args),
    Validate(commands::validate::Args),
    ImportAsl(commands::import_asl::Args),
    Schema(commands::schema::Args),
    DeleteLocal(commands::delete_local::Args),
    Run(commands::run::Args),
    Sweep(commands::sweep::Args),
    Submit(commands::submit::Args),
    Status(commands::status::Args),
    List(commands::list::Args),
    Top(commands::top::Args),
    Key(commands::key::Args),
    Pause(commands::pause::PauseArgs),
    Resume(commands::pause::ResumeArgs),
    Schedule(commands::schedule::Args),
    Ui(commands::ui::Args),
    Resubmit(commands::resubmit::Args),
    Cancel(commands::cancel::Args),
    Complete(commands::complete::Args),
    Fail(commands::fail::Args),
    Heartbeat(commands::heartbeat::Args),
    Approve(commands::approve::Args),
    Reject(commands::reject::Args),
    Smoke(commands::smoke::Args),
}

impl Cmd {
    /// The commands that print what they did themselves: the library's log lines would only
    /// repeat it (an answer, validate, import-asl, schema).
    fn quiet(&self) -> bool {
        matches!(
            self,
            Cmd::Complete(_)
                | Cmd::Fail(_)
                | Cmd::Heartbeat(_)
                | Cmd::Approve(_)
                | Cmd::Reject(_)
                | Cmd::Validate(_)
                | Cmd::ImportAsl(_)
                | Cmd::Schema(_)
        )
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    sas_core::telemetry::init_with_default(if cli.cmd.quiet() { "error" } else { "info" });
    // boxed: run holds every command's future, too large for the stack of main's own
    commands::exit_with(Box::pin(run(&cli)).await);
}

/// The command's `run`, and its exit status.
async fn run(cli: &Cli) -> Result<i32> {
    let g = &cli.global;
    match &cli.cmd {
        Cmd::DeployLocal(a) => commands::deploy_local::run(a, g).await,
        Cmd::IamCheck(a) => commands::iam_check::run(a, g).await,
        Cmd::Validate(a) => commands::validate::run(a),
        Cmd::ImportAsl(a) => commands::import_asl::run(a),
        Cmd::Schema(a) => commands::schema::run(a),
        Cmd::DeleteLocal(a) => commands::delete_local::run(a, g).await,
        Cmd::Run(a) => commands::run::run(a, g).await,
        Cmd::Sweep(a) => commands::sweep::run(a, g).await,
        Cmd::Submit(a) => commands::submit::run(a, g).await,
        Cmd::Status(a) => commands::status::run(a, g).await,
        Cmd::List(a) => commands::list::run(a, g).await,
        Cmd::Top(a) => commands::top::run(a, g).await,
        Cmd::Key(a) => commands::key::run(a, g).await,
        Cmd::Pause(a) => commands::pause::pause(a, g).await,
        Cmd::Resume(a) => commands::pause::resume(a, g).await,
        Cmd::Schedule(a) => commands::schedule::run(a, g).await,
        Cmd::Ui(a) => commands::ui::run(a, g).await,
        Cmd::Resubmit(a) => commands::resubmit::run(a, g).await,
        Cmd::Cancel(a) => commands::cancel::run(a, g).await,
        Cmd::Complete(a) => commands::complete::run(a, g).await,
        Cmd::Fail(a) => commands::fail::run(a, g).await,
        Cmd::Heartbeat(a) => commands::heartbeat::run(a, g).await,
        Cmd::Approve(a) => commands::approve::run(a, g).await,
        Cmd::Reject(a) => commands::reject::run(a, g).await,
        Cmd::Smoke(a) => commands::smoke::run(a, g).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The book's page of commands, `docs/reference/sasctl.md`.
    const PAGE: &str = include_str!("../../../docs/reference/sasctl.md");

    /// The page's table rows that name `command`: `` | `command ...` | ... ``.
    fn rows<'a>(page: &'a str, command: &str) -> Vec<&'a str> {
        page.lines()
            .filter(|l| {
                l.strip_prefix("| `")
                    .and_then(|rest| rest.strip_prefix(command))
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('`'))
            })
            .collect()
    }

    /// `--long` in `text`, as a whole option (`--wait` is not in `--wait-secs`).
    fn names_option(text: &str, long: &str) -> bool {
        let needle = format!("--{long}");
        text.match_indices(&needle)
            .any(|(at, _)| !text[at + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
    }

    /// The reference cannot rot: every command of `sasctl` has its row on the page, every long
    /// option of a command is in its row, the global options are on the page, the page's count of
    /// commands is right, and every row that names a command names one that exists.
    #[test]
    fn the_book_s_sasctl_page_names_every_command_and_every_option() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for arg in cli.get_arguments() {
            if let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) {
                if !names_option(PAGE, long) {
                    missing.push(format!("global option --{long}"));
                }
            }
        }
        let commands: Vec<&clap::Command> = cli.get_subcommands().filter(|c| c.get_name() != "help").collect();
        for cmd in &commands {
            let name = cmd.get_name();
            let rows = rows(PAGE, name);
            if rows.is_empty() {
                missing.push(format!("command {name} (a row `| `{name} ...` | ... |`)"));
                continue;
            }
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) else { continue };
                if arg.is_global_set() {
                    continue;
                }
                if !rows.iter().any(|r| names_option(r, long)) {
                    missing.push(format!("option --{long} of {name} (in its row)"));
                }
            }
        }
        assert!(missing.is_empty(), "docs/reference/sasctl.md does not name: {missing:#?}");
        let count = format!("has {} commands", commands.len());
        assert!(PAGE.contains(&count), "docs/reference/sasctl.md should say sasctl {count}");
        // and names no command that is gone: a row that starts with a name (not an option) is a command's
        // (sas-dev's rows, `sas-dev demo ...`, are checked by sas-dev's own test)
        for line in PAGE.lines() {
            let Some(rest) = line.strip_prefix("| `") else { continue };
            let word: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
            if word.is_empty() || word.starts_with('-') || word == "sas-dev" {
                continue;
            }
            assert!(
                commands.iter().any(|c| c.get_name() == word),
                "docs/reference/sasctl.md has a row for `{word}`, which sasctl does not have: {line}"
            );
        }
    }
}
