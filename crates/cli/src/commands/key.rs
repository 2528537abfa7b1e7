//! `sasctl key`: a workflow's concurrency key, its running tasks and its line ([`crate::keys`]).
#![allow(clippy::print_stdout)]

use anyhow::Result;

use super::Global;

/// A concurrency key: the tasks that hold its slots (and where each is), and the line of those
/// that wait, first in line first. Two requests.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The key's scope: the workflow's name, or its concurrency.scope.
    pub scope: String,
    /// The key's value (what the workflow's concurrency.key reads in a task's input).
    pub value: String,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let deps = global.deps(&sdk).await?;
    let key = crate::keys::item_id(&args.scope, &args.value);
    match crate::keys::look(&deps, &key).await? {
        None => {
            println!("{key}: no task of this key was ever submitted (no item); nothing runs or waits");
            Ok(1)
        }
        Some((state, running)) => {
            print!("{}", crate::keys::describe(&key, &state, &running, deps.now()));
            Ok(0)
        }
    }
}
