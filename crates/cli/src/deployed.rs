//! What a stack with its functions on runs: the workflows and agents files of its configuration
//! layer (`ConfigLayer`, `config/` as deployed, read by the functions from `/opt` at cold start),
//! read back through the Scheduler function that uses it. `sasctl ui` shows these workflows, not
//! the files on this machine, whenever the stack's outputs name the Scheduler function.
//!
//! Three requests: `lambda:GetFunctionConfiguration` (the function's layers and its
//! `SAS_WORKFLOWS_FILE`), `lambda:GetLayerVersion` (the layer's content URL, presigned) and the
//! download of that zip; the operator's policy grants the first two on this stack's function and
//! layer only.

use std::io::Read as _;

use anyhow::{bail, Context};

/// The configuration a deployed function reads.
#[derive(Clone, Debug)]
pub struct Deployed {
    /// The workflows file's text.
    pub workflows: String,
    /// The agents file's text, when the layer has one.
    pub agents: Option<String>,
    /// Where it was read: the layer version's ARN.
    pub layer: String,
}

/// The workflows file of a function's configuration, from the path its `SAS_WORKFLOWS_FILE`
/// names: under `/opt`, the layer's file of that name.
pub async fn config(sdk: &aws_config::SdkConfig, function: &str) -> anyhow::Result<Deployed> {
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let f = lambda
        .get_function_configuration()
        .function_name(function)
        .send()
        .await
        .with_context(|| format!("reading function {function}'s configuration"))?;
    let vars = f.environment().and_then(|e| e.variables());
    let path = vars.and_then(|v| v.get("SAS_WORKFLOWS_FILE")).map_or("/opt/workflows.json", String::as_str);
    let Some(name) = path.strip_prefix("/opt/") else {
        bail!("function {function} reads its workflows from {path}, not from its configuration layer");
    };
    let agents_name = vars
        .and_then(|v| v.get("SAS_AGENTS_FILE"))
        .and_then(|p| p.strip_prefix("/opt/"))
        .unwrap_or("agents.json")
        .to_owned();
    let http = reqwest::Client::new();
    for layer in f.layers() {
        let Some(arn) = layer.arn() else { continue };
        let v =
            lambda.get_layer_version_by_arn().arn(arn).send().await.with_context(|| format!("reading layer {arn}"))?;
        let Some(url) = v.content().and_then(|c| c.location()) else { continue };
        let zip = http
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("downloading layer {arn}"))?
            .bytes()
            .await
            .with_context(|| format!("downloading layer {arn}"))?;
        let mut files = files_in(&zip, &[name, &agents_name]).with_context(|| format!("layer {arn}"))?;
        if let Some(workflows) = files.remove(name) {
            return Ok(Deployed { workflows, agents: files.remove(&agents_name), layer: arn.to_owned() });
        }
    }
    bail!("no layer of function {function} has {name}")
}

/// The named files of a zip, as text (those it has).
fn files_in(zip: &[u8], names: &[&str]) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip)).context("not a zip")?;
    let mut out = std::collections::HashMap::new();
    for name in names {
        let Ok(mut f) = archive.by_name(name) else { continue };
        let mut text = String::new();
        f.read_to_string(&mut text).with_context(|| format!("{name} is not UTF-8 text"))?;
        out.insert((*name).to_owned(), text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    #[test]
    fn the_files_named_are_read_from_the_layer_s_zip() {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (name, text) in [("workflows.json", "{\"workflows\": []}"), ("README", "not asked for")] {
            w.start_file(name, zip::write::SimpleFileOptions::default()).unwrap();
            w.write_all(text.as_bytes()).unwrap();
        }
        let bytes = w.finish().unwrap().into_inner();
        let files = super::files_in(&bytes, &["workflows.json", "agents.json"]).unwrap();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files["workflows.json"], "{\"workflows\": []}");
        assert!(super::files_in(b"not a zip", &["workflows.json"]).is_err());
    }
}
