//! `sasctl deploy-local`: template.yaml onto LocalStack (the functions off, or on with
//! `--functions`), its outputs written where `--outputs` says.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::Global;

/// Deploy template.yaml with the functions switched off (LocalStack) and write its outputs.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = "sas-local")]
    pub name: String,
    /// Template parameters, KEY=VALUE.
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// Deploy the functions too, their bootstraps from this folder (e.g. target/debug): zipped,
    /// uploaded to S3, DeployFunctions=true, Architecture = the binaries'.
    #[arg(long, value_name = "DIR")]
    pub functions: Option<PathBuf>,
    /// With --functions: the directory the configuration layer is made of (workflows.json,
    /// agents.json; the functions read them in /opt). Deploying again with another one and the
    /// same binaries changes the workflows without a rebuild.
    #[arg(long, value_name = "DIR", default_value = "config")]
    pub config: PathBuf,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    let Args { name, params, functions, config } = args;
    let sdk = super::sdk().await;
    let mut kv: Vec<(&str, &str)> = vec![("DeployFunctions", "false")];
    for p in params {
        let (k, v) = p.split_once('=').with_context(|| format!("--param {p}: expected KEY=VALUE"))?;
        kv.push((k, v));
    }
    let out = if let Some(dir) = functions {
        crate::lambda::deploy_and_report(&sdk, name, dir, config, &kv[1..]).await?
    } else {
        crate::stack::deploy(&sdk, name, &crate::stack::local_template(crate::stack::TEMPLATE), &kv).await?
    };
    if let Some(dir) = global.outputs.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let json = crate::stack::outputs_json(&out);
    std::fs::write(&global.outputs, json)?;
    println!("stack {name} deployed; outputs in {}", global.outputs.display());
    println!("submission queue: {}", out.get("SubmissionQueueUrl").map_or("?", String::as_str));
    Ok(0)
}
