//! `sasctl delete-local`: delete a stack deployed with deploy-local, and wait until it is gone.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use anyhow::Result;

use super::Global;

/// Delete a stack deployed with deploy-local, and wait until it is gone.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = "sas-local")]
    pub name: String,
}

pub async fn run(args: &Args, _global: &Global) -> Result<i32> {
    let sdk = super::sdk().await;
    let cfn = aws_sdk_cloudformation::Client::new(&sdk);
    crate::stack::delete_and_wait(&cfn, &args.name, Duration::from_mins(2)).await?;
    println!("stack {} deleted", args.name);
    Ok(0)
}
