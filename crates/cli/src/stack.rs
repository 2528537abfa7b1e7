//! The project's one stack deployer: `template.yaml` through CloudFormation (LocalStack, with the
//! functions switched off while the handlers run in-process), a stack's outputs, and its deletion.
//! `sasctl deploy-local`, `sasctl delete-local`, `make up`, `make demo` and every integration test
//! deploy through it.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_cloudformation::config::http::HttpResponse;
use aws_sdk_cloudformation::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_cloudformation::types::{Capability, Parameter, StackStatus};
use aws_sdk_cloudformation::Client;

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("CloudFormation {op}: {}", aws_sdk_cloudformation::error::DisplayErrorContext(source.as_ref()))]
    Aws {
        op: &'static str,
        #[source]
        source: Box<aws_sdk_cloudformation::Error>,
    },
    #[error("stack {stack} ended {status}: {reasons}")]
    Failed { stack: String, status: String, reasons: String },
    #[error("stack {stack} did not finish within {secs} s (last status {status})")]
    Timeout { stack: String, secs: u64, status: String },
    #[error("stack {0} does not exist")]
    Missing(String),
    #[error("uploading the template ({bytes} bytes) to s3://{bucket}: {message}")]
    Upload { bucket: String, bytes: usize, message: String },
}

/// The largest `TemplateBody` CloudFormation accepts in a request.
pub const MAX_TEMPLATE_BODY: usize = 51_200;

/// The template as it is sent: without its full-line comments (outside block scalars), which
/// CloudFormation ignores but counts towards [`MAX_TEMPLATE_BODY`].
pub fn compact(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    // The indentation of the key that opened a block scalar (`key: >-`, `key: |`): its lines
    // are text, `#` included, as long as they are indented deeper (or blank).
    let mut block: Option<usize> = None;
    for line in template.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(key_indent) = block {
            if trimmed.is_empty() || indent > key_indent {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            block = None;
        }
        if trimmed.starts_with('#') {
            continue;
        }
        let code = trimmed.split(" #").next().unwrap_or_default().trim_end();
        if ["|", "|-", "|+", ">", ">-", ">+"].iter().any(|m| code.ends_with(&format!(" {m}")) || code == *m) {
            block = Some(indent);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn aws<E>(op: &'static str) -> impl FnOnce(SdkError<E, HttpResponse>) -> StackError
where
    aws_sdk_cloudformation::Error: From<SdkError<E, HttpResponse>>,
{
    move |e| StackError::Aws { op, source: Box::new(e.into()) }
}

/// The template, as shipped with the project.
pub const TEMPLATE: &str = include_str!("../../../template.yaml");

/// The template for a deployment with the functions switched off: SAM's transform accepts only
/// an S3 `CodeUri` (and layer `ContentUri`) outside `sam build`/`sam package`, so the local paths
/// become placeholders that nothing reads (no function or layer is created).
///
/// # Panics
/// `template` is not a template this module can read (the shipped one is: a unit test reads it).
pub fn local_template(template: &str) -> String {
    let placeholder = |code: &crate::template::LocalCode| {
        let what = if code.key == "CodeUri" { "function" } else { "layer" };
        Some(format!("s3://sas-local-placeholder/{what}.zip"))
    };
    let t = crate::template::replace_local_code(template, placeholder)
        .expect("the template's local code URIs are replaced")
        .0;
    without_versions(&t)
}

/// The template without what publishes the functions' versions and shifts traffic to them
/// (`AutoPublishAlias`, `AutoPublishAliasAllProperties`, each `DeploymentPreference` block and
/// the `DependsOn`s on the aliases): nothing of it exists without functions, and LocalStack 4.13
/// cannot delete a stack whose functions are off while they are there (it resolves the alias's
/// reference to its version, which the condition left out: "Unresolved resource dependencies").
fn without_versions(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    // the indentation of a `DeploymentPreference:` key whose block is being left out
    let mut skipping: Option<usize> = None;
    for line in template.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(key) = skipping {
            if indent > key && !trimmed.is_empty() {
                continue;
            }
            if !trimmed.is_empty() {
                skipping = None;
            }
        }
        if trimmed == "DeploymentPreference:" {
            skipping = Some(indent);
            continue;
        }
        let versions = trimmed.starts_with("AutoPublishAlias:")
            || trimmed.starts_with("AutoPublishAliasAllProperties:")
            || (trimmed.starts_with("DependsOn: ") && trimmed.ends_with("FunctionAliaslive"));
        if !versions {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The bucket templates over [`MAX_TEMPLATE_BODY`] and the functions' code go to (created when
/// missing). Keys are content-addressed, so stacks deployed from the same build share an upload.
pub const CODE_BUCKET: &str = "sas-local-code";

/// An S3 client; path-style addressing when an endpoint is set (LocalStack: no DNS for
/// `<bucket>.localhost`).
pub fn s3_client(sdk: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::from(sdk).force_path_style(sdk.endpoint_url().is_some()).build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// Create `bucket` unless it exists (and is ours).
pub async fn ensure_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> Result<(), aws_sdk_s3::Error> {
    match s3.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e) => match aws_sdk_s3::Error::from(e) {
            aws_sdk_s3::Error::BucketAlreadyOwnedByYou(_) | aws_sdk_s3::Error::BucketAlreadyExists(_) => Ok(()),
            e => Err(e),
        },
    }
}

/// Where the template goes: in the request when it fits [`MAX_TEMPLATE_BODY`], else uploaded to
/// [`CODE_BUCKET`] (as `sam deploy` does) and named by URL.
enum Source {
    Body(String),
    Url(String),
}

async fn source(sdk: &aws_config::SdkConfig, template: String) -> Result<Source, StackError> {
    if template.len() <= MAX_TEMPLATE_BODY {
        return Ok(Source::Body(template));
    }
    let bytes = template.len();
    let key = {
        use sha2::Digest as _;
        let hash = sha2::Sha256::digest(template.as_bytes());
        format!("templates/{}.yaml", hex::encode(&hash[..16]))
    };
    let s3 = s3_client(sdk);
    let failed = |message: String| StackError::Upload { bucket: CODE_BUCKET.into(), bytes, message };
    ensure_bucket(&s3, CODE_BUCKET)
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
    s3.put_object()
        .bucket(CODE_BUCKET)
        .key(&key)
        .body(aws_sdk_s3::primitives::ByteStream::from(template.into_bytes()))
        .send()
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
    Ok(Source::Url(match sdk.endpoint_url() {
        Some(endpoint) => format!("{}/{CODE_BUCKET}/{key}", endpoint.trim_end_matches('/')),
        None => format!(
            "https://{CODE_BUCKET}.s3.{}.amazonaws.com/{key}",
            sdk.region().map_or("us-east-1", aws_config::Region::as_ref)
        ),
    }))
}

/// The parameters this deployer sets unless `params` name them: its stacks are throw-away stacks
/// (tests, the demo, `make up`), so they ask for no deletion protection on the task table, which
/// the template otherwise turns on (a `sam deploy` to AWS keeps its default).
pub const THROWAWAY_DEFAULTS: &[(&str, &str)] = &[("TableDeletionProtection", "false")];

/// `params` with [`THROWAWAY_DEFAULTS`] for the parameters they do not name.
fn with_throwaway_defaults<'a>(params: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = params.to_vec();
    for &(k, v) in THROWAWAY_DEFAULTS {
        if !params.iter().any(|(name, _)| *name == k) {
            all.push((k, v));
        }
    }
    all
}

/// Create the stack, or update it if it exists, and wait for it; returns its outputs plus
/// `StackName`. A template over [`MAX_TEMPLATE_BODY`] (comments left out) goes through S3.
/// [`THROWAWAY_DEFAULTS`] apply to the parameters `params` does not name.
pub async fn deploy(
    sdk: &aws_config::SdkConfig,
    stack: &str,
    template_body: &str,
    params: &[(&str, &str)],
) -> Result<HashMap<String, String>, StackError> {
    let cfn = &Client::new(sdk);
    let (body, url) = match source(sdk, compact(template_body)).await? {
        Source::Body(b) => (Some(b), None),
        Source::Url(u) => (None, Some(u)),
    };
    let parameters: Vec<Parameter> = with_throwaway_defaults(params)
        .iter()
        .map(|(k, v)| Parameter::builder().parameter_key(*k).parameter_value(*v).build())
        .collect();
    let caps = [Capability::CapabilityIam, Capability::CapabilityNamedIam, Capability::CapabilityAutoExpand];
    let exists = status(cfn, stack).await?.is_some_and(|s| s != StackStatus::DeleteComplete);
    if exists {
        let r = cfn
            .update_stack()
            .stack_name(stack)
            .set_template_body(body.clone())
            .set_template_url(url.clone())
            .set_parameters(Some(parameters))
            .set_capabilities(Some(caps.to_vec()))
            .send()
            .await;
        if let Err(e) = r {
            let no_updates =
                e.as_service_error().and_then(ProvideErrorMetadata::message).is_some_and(|m| m.contains("No updates"));
            if !no_updates {
                return Err(StackError::Aws { op: "UpdateStack", source: Box::new(e.into()) });
            }
        }
    } else {
        cfn.create_stack()
            .stack_name(stack)
            .set_template_body(body)
            .set_template_url(url)
            .set_parameters(Some(parameters))
            .set_capabilities(Some(caps.to_vec()))
            .send()
            .await
            .map_err(aws("CreateStack"))?;
    }
    wait(cfn, stack, Duration::from_mins(5)).await?;
    outputs(cfn, stack).await
}

async fn status(cfn: &Client, stack: &str) -> Result<Option<StackStatus>, StackError> {
    match cfn.describe_stacks().stack_name(stack).send().await {
        Ok(out) => Ok(out.stacks().first().and_then(|s| s.stack_status().cloned())),
        Err(e) => {
            let missing = e
                .as_service_error()
                .and_then(ProvideErrorMetadata::message)
                .is_some_and(|m| m.contains("does not exist"));
            if missing {
                Ok(None)
            } else {
                Err(StackError::Aws { op: "DescribeStacks", source: Box::new(e.into()) })
            }
        }
    }
}

async fn wait(cfn: &Client, stack: &str, limit: Duration) -> Result<(), StackError> {
    let started = std::time::Instant::now();
    loop {
        let st = status(cfn, stack).await?.ok_or_else(|| StackError::Missing(stack.to_owned()))?;
        let s = st.as_str();
        if s.ends_with("_COMPLETE") && !s.contains("ROLLBACK") {
            return Ok(());
        }
        if s.ends_with("_FAILED") || (s.contains("ROLLBACK") && s.ends_with("_COMPLETE")) {
            return Err(StackError::Failed {
                stack: stack.to_owned(),
                status: s.to_owned(),
                reasons: failures(cfn, stack).await,
            });
        }
        if started.elapsed() > limit {
            return Err(StackError::Timeout { stack: stack.to_owned(), secs: limit.as_secs(), status: s.to_owned() });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn failures(cfn: &Client, stack: &str) -> String {
    let Ok(out) = cfn.describe_stack_events().stack_name(stack).send().await else {
        return "(no events)".into();
    };
    let reasons: Vec<String> = out
        .stack_events()
        .iter()
        .filter(|e| e.resource_status().is_some_and(|s| s.as_str().ends_with("FAILED")))
        .map(|e| {
            format!(
                "{}: {}",
                e.logical_resource_id().unwrap_or("?"),
                e.resource_status_reason().unwrap_or("no reason given")
            )
        })
        .collect();
    if reasons.is_empty() {
        "(no failed resources reported)".into()
    } else {
        reasons.join("; ")
    }
}

/// A stack's outputs by key, plus `StackName`.
pub async fn outputs(cfn: &Client, stack: &str) -> Result<HashMap<String, String>, StackError> {
    let out = cfn.describe_stacks().stack_name(stack).send().await.map_err(aws("DescribeStacks"))?;
    let s = out.stacks().first().ok_or_else(|| StackError::Missing(stack.to_owned()))?;
    let mut map: HashMap<String, String> =
        s.outputs().iter().filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned()))).collect();
    map.insert("StackName".into(), stack.to_owned());
    for p in s.parameters() {
        if p.parameter_key() == Some("SupervisorShards") {
            if let Some(v) = p.parameter_value() {
                map.insert("SupervisorShards".into(), v.to_owned());
            }
        }
    }
    Ok(map)
}

/// Ask CloudFormation to delete the stack (returns at once).
pub async fn delete(cfn: &Client, stack: &str) -> Result<(), StackError> {
    cfn.delete_stack().stack_name(stack).send().await.map_err(aws("DeleteStack"))?;
    Ok(())
}

/// Delete the stack and wait until it is gone.
pub async fn delete_and_wait(cfn: &Client, stack: &str, limit: Duration) -> Result<(), StackError> {
    delete(cfn, stack).await?;
    let started = std::time::Instant::now();
    loop {
        match status(cfn, stack).await? {
            None | Some(StackStatus::DeleteComplete) => return Ok(()),
            Some(StackStatus::DeleteFailed) => {
                return Err(StackError::Failed {
                    stack: stack.to_owned(),
                    status: "DELETE_FAILED".into(),
                    reasons: failures(cfn, stack).await,
                })
            }
            Some(s) if started.elapsed() > limit => {
                return Err(StackError::Timeout {
                    stack: stack.to_owned(),
                    secs: limit.as_secs(),
                    status: s.to_string(),
                })
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// The outputs as a JSON object, `SubmissionQueueUrl` first (what an application needs), then the
/// rest by name.
pub fn outputs_json<S: std::hash::BuildHasher>(outputs: &HashMap<String, String, S>) -> String {
    let mut keys: Vec<&String> = outputs.keys().collect();
    keys.sort_by_key(|k| (k.as_str() != "SubmissionQueueUrl", k.as_str()));
    let lines: Vec<String> = keys
        .iter()
        .map(|k| {
            format!("  {}: {}", serde_json::Value::from(k.as_str()), serde_json::Value::from(outputs[*k].as_str()))
        })
        .collect();
    format!("{{\n{}\n}}\n", lines.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throwaway_stacks_ask_for_no_table_protection_unless_told_and_the_template_protects_by_default() {
        let all = with_throwaway_defaults(&[("DeployFunctions", "false")]);
        assert_eq!(all, [("DeployFunctions", "false"), ("TableDeletionProtection", "false")]);
        let told = with_throwaway_defaults(&[("TableDeletionProtection", "true")]);
        assert_eq!(told, [("TableDeletionProtection", "true")]);
        // The template's own default is what any other deploy (sam deploy to AWS) gets: the
        // string "true" (a String parameter's default; unquoted, YAML would read a boolean).
        let doc = crate::template::parse(TEMPLATE).unwrap();
        let default =
            doc.data.as_mapping_get("Parameters").and_then(|p| p.data.as_mapping_get("TableDeletionProtection"));
        let default = default.and_then(|p| p.data.as_mapping_get("Default")).expect("the parameter's default");
        assert_eq!(default.data.as_str(), Some("true"));
    }

    #[test]
    fn outputs_json_puts_the_submission_queue_first_and_parses() {
        let m: HashMap<String, String> =
            [("AlertTopicArn", "arn:x"), ("SubmissionQueueUrl", "http://q"), ("Zeta", "\"z\"")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        let j = outputs_json(&m);
        assert!(j.starts_with("{\n  \"SubmissionQueueUrl\": \"http://q\""), "{j}");
        let back: HashMap<String, String> = serde_json::from_str(&j).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn the_compact_template_keeps_everything_but_comments() {
        let t = "A:\n  # gone\n  B: >-\n    text\n    # kept: text of the scalar\n\n    more\n  # gone too\n  C: 1 # kept\n";
        assert_eq!(compact(t), "A:\n  B: >-\n    text\n    # kept: text of the scalar\n\n    more\n  C: 1 # kept\n");
        // (over MAX_TEMPLATE_BODY it goes through S3: the LocalStack tests deploy it so)
        let c = compact(TEMPLATE);
        let without = |t: &str| -> Vec<String> {
            t.lines().filter(|l| !l.trim_start().starts_with('#')).map(|l| l.trim_end().to_owned()).collect()
        };
        assert_eq!(without(&c), without(TEMPLATE), "only comment lines are dropped");
        let parse = crate::template::parse;
        assert!(parse(&c).unwrap() == parse(TEMPLATE).unwrap(), "the same document");
    }

    #[test]
    fn local_template_replaces_every_local_code_uri() {
        let t = local_template(TEMPLATE);
        assert!(!t.contains("CodeUri: ./"));
        assert_eq!(
            t.matches("s3://sas-local-placeholder/function.zip").count(),
            TEMPLATE.matches("CodeUri: ./").count()
        );
        assert!(!t.contains("ContentUri: config/"), "the configuration layer's local directory is replaced too");
        assert_eq!(t.matches("ContentUri: s3://sas-local-placeholder/layer.zip").count(), 1);
        assert!(crate::template::functions(&t).unwrap().is_empty() && crate::template::layers(&t).unwrap().is_empty());
        // no versions, aliases or traffic shifts without functions; all else as shipped
        for gone in ["AutoPublishAlias", "DeploymentPreference", "Aliaslive", "PassthroughCondition"] {
            let code = |s: &str| s.lines().filter(|l| !l.trim_start().starts_with('#')).any(|l| l.contains(gone));
            assert!(code(TEMPLATE) && !code(&t), "{gone} is left out");
        }
        let kept: Vec<&str> = TEMPLATE
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                !(l.starts_with("AutoPublishAlias")
                    || l.starts_with("DependsOn: ") && l.ends_with("Aliaslive")
                    || ["DeploymentPreference:", "Enabled: !Ref GradualDeploy", "Type: !Ref DeploymentType"]
                        .contains(&l)
                    || l.starts_with("PassthroughCondition:")
                    || l.starts_with("Alarms: [!Sub")
                    || l.starts_with("# CodeDeploy's application")
                    || l.starts_with("# rolled back as soon as"))
            })
            .collect();
        let by_text = (kept.join("\n") + "\n")
            .replace("CodeUri: ./", "CodeUri: s3://sas-local-placeholder/function.zip")
            .replace("ContentUri: config/", "ContentUri: s3://sas-local-placeholder/layer.zip");
        assert!(t == by_text, "only the local code URIs and the versions' lines differ from the shipped template");
        assert!(crate::template::parse(&t).is_ok(), "still YAML");
    }
}
