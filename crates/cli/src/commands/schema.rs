//! `sasctl schema`: the JSON Schema of a configuration file, generated from its types.
#![allow(clippy::print_stdout)]

use anyhow::Result;

/// Print the JSON Schema of a configuration file (the repository's schemas/ holds both): name
/// it in the file with "$schema" and an editor completes and checks the file as you type.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which file: workflows or agents.
    #[arg(value_parser = ["workflows", "agents"])]
    pub file: String,
}

pub fn run(args: &Args) -> Result<i32> {
    let schema = if args.file == "agents" { sas_core::schema::agents() } else { sas_core::schema::workflows() };
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(0)
}
