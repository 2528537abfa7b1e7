//! sasctl's commands, one module each: the command's arguments (a clap `Args`, whose doc comment
//! is the command's help) and its `run`, which prints what the command did and returns its exit
//! status (an error is printed by the binary: one line, exit status 1). `main.rs` parses the
//! command line and calls the command's `run`; the work itself lives in the library's modules
//! (`ops`, `top`, `validate`, `stack`, ...).
//!
//! What every command shares is here: the global options ([`Global`]) and what they lead to (the
//! stack's outputs, its resources, the [`Deps`] of the roles), the waiting options of cancel and
//! resubmit ([`WaitArgs`]), the answers' `--json` ([`ReplyArgs`]).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_protocol::ids::CallbackToken;
use sas_protocol::workflow::WorkflowRegistry;

use crate::answer::Answer;

pub mod approve;
pub mod cancel;
pub mod complete;
pub mod delete_local;
pub mod deploy_local;
pub mod fail;
pub mod heartbeat;
pub mod iam_check;
pub mod import_asl;
pub mod key;
pub mod list;
pub mod pause;
pub mod reject;
pub mod resubmit;
pub mod run;
pub mod schedule;
pub mod schema;
pub mod smoke;
pub mod status;
pub mod submit;
pub mod sweep;
pub mod top;
pub mod ui;
pub mod validate;

// The options of every command (`global`: before or after the command's name). No doc comment on
// the struct: a flattened struct's would replace the binary's own description.
#[derive(clap::Args, Clone, Debug)]
pub struct Global {
    /// Stack outputs written by `deploy-local` (ignored when --stack is given).
    #[arg(long, global = true, env = "SAS_OUTPUTS", default_value = ".local/outputs.json")]
    pub outputs: PathBuf,
    /// Read resource names from this CloudFormation stack instead (works against AWS).
    #[arg(long, global = true, env = "SAS_STACK")]
    pub stack: Option<String>,
}

impl Global {
    /// The stack's outputs: `--stack`'s, else the file `--outputs` names.
    pub async fn outputs(&self, sdk: &aws_config::SdkConfig) -> Result<HashMap<String, String>> {
        let map: HashMap<String, String> = if let Some(stack) = &self.stack {
            crate::stack::outputs(&aws_sdk_cloudformation::Client::new(sdk), stack).await?
        } else {
            let text = std::fs::read_to_string(&self.outputs).with_context(|| {
                format!(
                    "cannot read {} (run `make up` or `sasctl deploy-local` first, or pass --stack)",
                    self.outputs.display()
                )
            })?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not a JSON object of strings", self.outputs.display()))?
        };
        Ok(map)
    }

    /// The stack's resources, from its outputs.
    pub async fn resources(&self, sdk: &aws_config::SdkConfig) -> Result<Resources> {
        Ok(Resources::from_outputs(&self.outputs(sdk).await?)?)
    }

    /// The stack's resources and the workflows file sasctl reads ([`crate::config_files`]: the
    /// environment's, else the checkout's `config/`, else the built-in copy).
    pub async fn deps(&self, sdk: &aws_config::SdkConfig) -> Result<Deps> {
        Ok(deps_from(sdk, &self.outputs(sdk).await?)?.0)
    }
}

/// [`Global::deps`] from outputs already read, with where its workflows came from.
#[allow(clippy::implicit_hasher)] // the outputs as Global::outputs reads them
pub fn deps_from(
    sdk: &aws_config::SdkConfig,
    outputs: &HashMap<String, String>,
) -> Result<(Deps, crate::config_files::Source)> {
    let workflows = crate::config_files::workflows(None)?;
    let registry =
        WorkflowRegistry::from_json(&workflows.text).with_context(|| format!("workflows {}", workflows.from))?;
    tracing::debug!(from = %workflows.from, "workflows read");
    Ok((Deps::aws(sdk, Resources::from_outputs(outputs)?, registry, Settings::from_env()?), workflows.from))
}

/// The SDK's configuration (endpoint, region, credentials) with the tools' timeouts.
/// A command's outcome, as sasctl and sas-dev both end with it: status 0 returns (main ends
/// normally); another status ends the process with it; an error is printed on one line with its
/// causes (`error: ...: ...`) and ends it with status 1. An operator's refusal is not a crash: no
/// backtrace, even with `RUST_BACKTRACE=1`.
pub fn exit_with(outcome: Result<i32>) {
    match outcome {
        Ok(0) => {}
        Ok(status) => std::process::exit(status),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

pub async fn sdk() -> aws_config::SdkConfig {
    sas_core::aws::load_sdk_config().await
}

/// How often a waiting command reads the task.
pub const POLL: Duration = Duration::from_millis(300);

/// The answers' output option.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ReplyArgs {
    /// Print the reply as JSON (result, stop, state, complete_by, reason) instead of a line.
    #[arg(long)]
    pub json: bool,
}

/// How long cancel and resubmit wait for the command to show on the task.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct WaitArgs {
    /// Wait at most this long for the command to show on the task.
    #[arg(long, default_value_t = 30)]
    pub wait_secs: u64,
    /// Send the command (after the check) and return without waiting.
    #[arg(long)]
    pub no_wait: bool,
}

impl WaitArgs {
    /// How long to wait, `None` with `--no-wait`.
    pub fn wait(self) -> Option<Duration> {
        (!self.no_wait).then(|| Duration::from_secs(self.wait_secs))
    }
}

/// `KEY=VALUE` items of an option (`--var`, `--param`).
pub(crate) fn key_values(what: &str, items: &[String]) -> Result<HashMap<String, String>> {
    items
        .iter()
        .map(|v| {
            let (k, val) = v.split_once('=').with_context(|| format!("--{what} {v}: expected KEY=VALUE"))?;
            Ok((k.to_owned(), val.to_owned()))
        })
        .collect()
}

/// Apply one answer to a callback step, in-process (as the callback queue and the HTTPS endpoint
/// do), and say what it did. Its arguments were checked first, before the SDK is loaded (each
/// answer command's `run`); the token is never printed. Exit 1 (an error line) when the answer was
/// not taken.
pub(crate) async fn answer_step(
    global: &Global,
    token: &CallbackToken,
    answer: &Answer,
    reply_args: ReplyArgs,
) -> Result<i32> {
    let sdk = sdk().await;
    let deps = global.deps(&sdk).await?;
    let (reply, line, took) = crate::answer::apply(&deps, token, answer).await?;
    if reply_args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    }
    if !took {
        bail!("{line}");
    }
    if !reply_args.json {
        println!("{line}");
    }
    Ok(0)
}
