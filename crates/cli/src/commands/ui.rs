//! `sasctl ui`: the console in the browser ([`crate::ui`]), served from this process.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sas_protocol::workflow::WorkflowRegistry;

use super::Global;
use crate::table::TableReader;

/// A console in the browser: the workflows drawn, the tasks listed, one task's path and
/// timeline, and cancel, resubmit, approve and reject with what they did. Served from this
/// process with your AWS credentials (nothing is deployed); until Ctrl-C.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to listen. Anything but a loopback address serves every host that can reach it,
    /// with your credentials: it is refused unless --allow-remote is given too.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Listen on a non-loopback address anyway (a warning is printed).
    #[arg(long)]
    pub allow_remote: bool,
    /// Show only: offer and accept no action.
    #[arg(long)]
    pub read_only: bool,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let Args { listen, allow_remote, read_only } = args;
    let sdk = super::sdk().await;
    if !listen.ip().is_loopback() && !allow_remote {
        bail!("--listen {listen} is not a loopback address: anyone who reaches it acts with your AWS credentials; add --allow-remote if that is what you want");
    }
    let outputs = global.outputs(&sdk).await?;
    let (mut deps, files) = super::deps_from(&sdk, &outputs)?;
    // the workflows the stack runs: its configuration layer's when its functions are on,
    // else the files its local runner reads (the same files as here)
    let shown = match outputs.get("SchedulerFunctionName") {
        Some(function) => {
            let d = crate::deployed::config(&sdk, function).await?;
            deps.workflows = Arc::new(
                WorkflowRegistry::from_json(&d.workflows)
                    .with_context(|| format!("the workflows of layer {}", d.layer))?,
            );
            format!("the stack's configuration layer {}", d.layer)
        }
        None => files.to_string(),
    };
    eprintln!("sasctl ui: the workflows page shows the workflows of {shown}");
    let deps = Arc::new(deps);
    let reader = TableReader::new(&sdk, &deps.resources);
    let stack =
        global.stack.as_ref().map_or_else(|| format!("table {}", deps.resources.task_table), |s| format!("stack {s}"));
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        eprintln!("warning: the console listens on {addr}, beyond this machine, and acts with your AWS credentials");
    }
    let console = Arc::new(crate::ui::Console::new(deps, reader, stack, addr, *read_only).with_workflows_from(shown));
    println!(
        "sasctl ui: http://{}/ ({}; Ctrl-C to stop)",
        if addr.ip().is_loopback() { format!("127.0.0.1:{}", addr.port()) } else { addr.to_string() },
        if *read_only { "read-only" } else { "cancel, resubmit, approve and reject ask to confirm" }
    );
    crate::ui::serve(listener, console).await?;
    Ok(0)
}
