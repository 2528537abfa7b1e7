//! Deploying with the functions on: the five `bootstrap` binaries zipped, uploaded to S3
//! (LocalStack's), the configuration layer's directory (`config/`, or another) zipped and uploaded
//! likewise, and `template.yaml` deployed with `DeployFunctions=true`, each function's `CodeUri`
//! and the layer's `ContentUri` pointing at its zip. LocalStack then runs the functions as host processes (the
//! project's `host` Lambda executor, `infra/lambda-executor/`), invoked by its SQS event source
//! mappings, the scheduled rule and the Callback function's URL (see [`crate::callback_url`]). Also: what a deployed stack's functions look like (their
//! environment, their event sources, the sweep rule) and what their log groups say.
//!
//! `sasctl deploy-local --functions DIR`, `sas-dev demo --functions DIR` and the Lambda-mode tests
//! (`tests/tests/it/lambda.rs`) deploy through [`deploy`].

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use aws_sdk_lambda::types::State;
use sha2::{Digest, Sha256};

use crate::stack;
use crate::template::{functions, layers, replace_local_code, FunctionSpec, LayerSpec};

/// The bucket the code zips go to (`<binary>/<sha256 prefix>.zip`, content-addressed).
pub use crate::stack::CODE_BUCKET;

/// The template with each function's `CodeUri: ./` and each layer's local `ContentUri` replaced
/// by its URI (by logical ID).
pub fn with_code_uris<S: std::hash::BuildHasher>(template: &str, uris: &HashMap<String, String, S>) -> Result<String> {
    let (out, replaced) = replace_local_code(template, |code| uris.get(&code.logical_id).cloned())?;
    if replaced != uris.len() {
        bail!(
            "replaced {replaced} local CodeUri/ContentUri values for {} functions and layers: has the template changed?",
            uris.len()
        );
    }
    Ok(out)
}

/// The architecture an ELF binary is for, as Lambda names it.
pub fn elf_architecture(head: &[u8]) -> Option<&'static str> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return None;
    }
    match u16::from_le_bytes([head[18], head[19]]) {
        0x3e => Some("x86_64"),
        0xb7 => Some("arm64"),
        _ => None,
    }
}

/// This machine's architecture, as Lambda names it.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        other => other,
    }
}

/// Where a function's `bootstrap` is in `dir`: `<binary>` (cargo's `target/debug` or
/// `target/release`), `<binary>/bootstrap` (cargo lambda's `target/lambda`) or
/// `<LogicalId>/bootstrap` (sam build's `.aws-sam/build`).
pub fn find_bootstrap(dir: &Path, f: &FunctionSpec) -> Result<PathBuf> {
    let candidates =
        [dir.join(&f.binary), dir.join(&f.binary).join("bootstrap"), dir.join(&f.logical_id).join("bootstrap")];
    candidates.iter().find(|p| p.is_file()).cloned().with_context(|| {
        format!(
            "no bootstrap for {} in {}: looked for {} (build it: cargo build -p sas-functions --bins)",
            f.logical_id,
            dir.display(),
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// One file of a zip archive: its name (`/`-separated), its content and its Unix mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    pub name: String,
    pub bytes: Vec<u8>,
    pub mode: u32,
}

/// A zip archive of `entries`, in their order, deflated, each with its Unix mode and the
/// timestamp 1980-01-01 00:00 (zip's earliest): the same files give the same bytes, hence the same
/// content-addressed S3 key.
pub fn zip_files(entries: &[ZipEntry]) -> Result<Vec<u8>> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for e in entries {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .compression_level(Some(1))
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(e.mode)
            .large_file(e.bytes.len() >= 0xFFFF_FFFF);
        w.start_file(e.name.as_str(), options).with_context(|| format!("zipping {}", e.name))?;
        w.write_all(&e.bytes).with_context(|| format!("zipping {}", e.name))?;
    }
    Ok(w.finish().context("finishing a zip")?.into_inner())
}

/// A zip archive holding one file, `bootstrap`, executable (Unix mode 0755): a function's code.
pub fn zip_bootstrap(bytes: &[u8]) -> Result<Vec<u8>> {
    zip_files(&[ZipEntry { name: "bootstrap".into(), bytes: bytes.to_vec(), mode: 0o755 }])
}

/// The files under `dir`, recursively, named relative to it with `/`, sorted by name; mode 0755
/// for a file executable by its owner, 0644 otherwise (what Lambda unpacks a layer with).
pub fn dir_entries(dir: &Path) -> Result<Vec<ZipEntry>> {
    use std::os::unix::fs::PermissionsExt as _;
    fn walk(root: &Path, dir: &Path, out: &mut Vec<ZipEntry>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry.with_context(|| format!("reading {}", dir.display()))?.path();
            let meta = std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?;
            if meta.is_dir() {
                walk(root, &path, out)?;
            } else if meta.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .with_context(|| format!("{} is not under {}", path.display(), root.display()))?;
                let name = rel.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("/");
                let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                let mode = if meta.permissions().mode() & 0o100 == 0 { 0o644 } else { 0o755 };
                out.push(ZipEntry { name, bytes, mode });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// One function's code, ready to upload.
#[derive(Debug, Clone)]
pub struct Package {
    pub function: FunctionSpec,
    pub bootstrap: PathBuf,
    pub architecture: &'static str,
    pub zip: Vec<u8>,
    pub key: String,
}

/// Zip every function's bootstrap found in `dir` (concurrently: compressing debug binaries takes
/// a moment).
pub async fn package(dir: &Path, template: &str) -> Result<Vec<Package>> {
    let specs = functions(template)?;
    if specs.is_empty() {
        bail!("no function with `CodeUri: ./` and `Metadata.BuildProperties.Binary` in the template");
    }
    let jobs = specs.into_iter().map(|function| {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || -> Result<Package> {
            let bootstrap = find_bootstrap(&dir, &function)?;
            let bytes = std::fs::read(&bootstrap).with_context(|| format!("reading {}", bootstrap.display()))?;
            let architecture = elf_architecture(&bytes)
                .with_context(|| format!("{} is not an x86_64 or arm64 ELF binary", bootstrap.display()))?;
            let zip = zip_bootstrap(&bytes)?;
            let key = format!("{}/{}.zip", function.binary, &hex::encode(Sha256::digest(&zip))[..16]);
            Ok(Package { function, bootstrap, architecture, zip, key })
        })
    });
    let mut out = Vec::new();
    for j in futures::future::join_all(jobs).await {
        out.push(j.context("zipping a bootstrap")??);
    }
    let archs: Vec<&str> = out.iter().map(|p| p.architecture).collect();
    if archs.iter().any(|a| *a != archs[0]) {
        bail!("the bootstraps are built for different architectures: {archs:?}");
    }
    Ok(out)
}

/// One layer's content, ready to upload.
#[derive(Debug, Clone)]
pub struct LayerPackage {
    pub layer: LayerSpec,
    /// The directory it was made of.
    pub dir: PathBuf,
    /// The files in it, as the functions see them under `/opt`.
    pub files: Vec<String>,
    pub zip: Vec<u8>,
    pub key: String,
}

/// Zip each layer's directory (`dir_of` says where each one's `ContentUri` is on this machine);
/// a directory that is missing or holds no file is an error naming it.
pub fn package_layers(template: &str, dir_of: &dyn Fn(&LayerSpec) -> Result<PathBuf>) -> Result<Vec<LayerPackage>> {
    layers(template)?
        .into_iter()
        .map(|layer| {
            let dir = dir_of(&layer)?;
            let entries = dir_entries(&dir).with_context(|| format!("layer {}", layer.logical_id))?;
            if entries.is_empty() {
                bail!("layer {}: {} holds no file", layer.logical_id, dir.display());
            }
            let zip = zip_files(&entries)?;
            let key = format!("{}/{}.zip", layer.logical_id, &hex::encode(Sha256::digest(&zip))[..16]);
            let files = entries.into_iter().map(|e| e.name).collect();
            Ok(LayerPackage { layer, dir, files, zip, key })
        })
        .collect()
}

/// Upload each object (logical ID, content-addressed key, zip) to [`CODE_BUCKET`] unless an
/// object of that key is there; returns logical ID -> `s3://` URI and how many were uploaded.
pub async fn upload(
    s3: &aws_sdk_s3::Client,
    objects: &[(&str, &str, &[u8])],
) -> Result<(HashMap<String, String>, usize)> {
    stack::ensure_bucket(s3, CODE_BUCKET).await.with_context(|| format!("creating bucket {CODE_BUCKET}"))?;
    let mut uris = HashMap::new();
    let mut uploaded = 0;
    for (id, key, zip) in objects {
        let present = s3.head_object().bucket(CODE_BUCKET).key(*key).send().await.is_ok();
        if !present {
            s3.put_object()
                .bucket(CODE_BUCKET)
                .key(*key)
                .body(aws_sdk_s3::primitives::ByteStream::from(zip.to_vec()))
                .send()
                .await
                .map_err(aws_sdk_s3::Error::from)
                .with_context(|| format!("uploading s3://{CODE_BUCKET}/{key}"))?;
            uploaded += 1;
        }
        uris.insert((*id).to_owned(), format!("s3://{CODE_BUCKET}/{key}"));
    }
    Ok((uris, uploaded))
}

/// What [`deploy`] did.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// The stack's outputs (with the five `<Fn>FunctionName` keys and `CallbackUrl`) plus `StackName`.
    pub outputs: HashMap<String, String>,
    pub architecture: &'static str,
    /// Zips uploaded this time (0 when this build's code was already in the bucket).
    pub uploaded: usize,
    /// Their sizes in bytes, by binary (and by layer: `ConfigLayer`).
    pub zip_bytes: BTreeMap<String, usize>,
    /// Each layer's S3 key and the files it holds (under `/opt` for the functions).
    pub layers: Vec<(String, String, Vec<String>)>,
    pub timings: Vec<(&'static str, Duration)>,
}

/// The layer holding the configuration (`config/`: workflows.json, agents.json), in `/opt`.
pub const CONFIG_LAYER: &str = "ConfigLayer";

/// Deploy `template.yaml` as `stack` with the functions on, their code taken from `dir` and the
/// configuration layer ([`CONFIG_LAYER`]) made of `config` (the workspace's `config/`, or another
/// directory with the same files): package, upload, CreateStack/UpdateStack with
/// `DeployFunctions=true` and `Architecture` = the binaries' (`params` may add or override
/// parameters), then wait until every function is `Active` and every event source mapping
/// `Enabled`. Deploying again with another `config` and the same binaries changes only the layer:
/// a new layer version, which the functions read at their next cold start.
pub async fn deploy(
    sdk: &aws_config::SdkConfig,
    stack_name: &str,
    dir: &Path,
    config: &Path,
    params: &[(&str, &str)],
) -> Result<Deployed> {
    let mut timings = Vec::new();
    let t = Instant::now();
    let packages = package(dir, stack::TEMPLATE).await?;
    let layers = package_layers(stack::TEMPLATE, &|l| {
        if l.logical_id == CONFIG_LAYER {
            Ok(config.to_owned())
        } else {
            bail!("no directory for layer {} (ContentUri {})", l.logical_id, l.content_uri)
        }
    })?;
    timings.push(("zip", t.elapsed()));
    let architecture = packages[0].architecture;
    if architecture != host_architecture() {
        tracing::warn!(
            binaries = architecture,
            host = host_architecture(),
            "the bootstraps are not built for this machine: LocalStack's host executor cannot run them"
        );
    }
    let t = Instant::now();
    let objects: Vec<(&str, &str, &[u8])> = packages
        .iter()
        .map(|p| (p.function.logical_id.as_str(), p.key.as_str(), p.zip.as_slice()))
        .chain(layers.iter().map(|l| (l.layer.logical_id.as_str(), l.key.as_str(), l.zip.as_slice())))
        .collect();
    let (uris, uploaded) = upload(&stack::s3_client(sdk), &objects).await?;
    timings.push(("upload", t.elapsed()));
    let body = with_code_uris(stack::TEMPLATE, &uris)?;
    let mut kv: BTreeMap<&str, &str> = [("DeployFunctions", "true"), ("Architecture", architecture)].into();
    for (k, v) in params {
        kv.insert(k, v);
    }
    let kv: Vec<(&str, &str)> = kv.into_iter().collect();
    let t = Instant::now();
    let outputs = stack::deploy(sdk, stack_name, &body, &kv).await?;
    timings.push(("stack", t.elapsed()));
    let t = Instant::now();
    let names = function_names(&outputs)?;
    wait_ready(&aws_sdk_lambda::Client::new(sdk), &names, invoked_qualifier(&outputs), Duration::from_mins(2)).await?;
    timings.push(("functions ready", t.elapsed()));
    let zip_bytes = packages
        .iter()
        .map(|p| (p.function.binary.clone(), p.zip.len()))
        .chain(layers.iter().map(|l| (l.layer.logical_id.clone(), l.zip.len())))
        .collect();
    let layers = layers.into_iter().map(|l| (l.layer.logical_id, l.key, l.files)).collect();
    Ok(Deployed { outputs, architecture, uploaded, zip_bytes, layers, timings })
}

/// [`deploy`], then [`verify`]; prints what was done and each check, and fails when a check did.
#[allow(clippy::print_stdout)]
pub async fn deploy_and_report(
    sdk: &aws_config::SdkConfig,
    stack_name: &str,
    dir: &Path,
    config: &Path,
    params: &[(&str, &str)],
) -> Result<HashMap<String, String>> {
    let started = Instant::now();
    let d = deploy(sdk, stack_name, dir, config, params).await?;
    let sizes: Vec<String> = d.zip_bytes.iter().map(|(b, n)| format!("{b} {:.1} MB", mb(*n))).collect();
    let steps: Vec<String> = d.timings.iter().map(|(what, t)| format!("{what} {:.1} s", t.as_secs_f64())).collect();
    println!(
        "stack {stack_name} deployed with its functions ({}, from {}) in {:.1} s: {}",
        d.architecture,
        dir.display(),
        started.elapsed().as_secs_f64(),
        steps.join(", ")
    );
    println!("  code zips ({} uploaded, the rest already in s3://{CODE_BUCKET}): {}", d.uploaded, sizes.join(", "));
    for (id, key, files) in &d.layers {
        println!("  layer {id} from {} (s3://{CODE_BUCKET}/{key}): /opt/{}", config.display(), files.join(", /opt/"));
    }
    let checks = verify(sdk, &d.outputs).await?;
    for c in &checks {
        println!("  {} {}", if c.ok { "ok  " } else { "FAIL" }, c.what);
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        bail!("{failed} of the deployed stack's checks failed");
    }
    Ok(d.outputs)
}

#[allow(clippy::cast_precision_loss)]
fn mb(n: usize) -> f64 {
    n as f64 / 1_000_000.0
}

/// The deployed functions' names by logical ID (`SubmitterFunction` -> `t-x-SubmitterFunction-ab12`).
pub fn function_names<S: std::hash::BuildHasher>(
    outputs: &HashMap<String, String, S>,
) -> Result<BTreeMap<String, String>> {
    functions(stack::TEMPLATE)?
        .into_iter()
        .map(|f| {
            let name = outputs
                .get(&f.output_key())
                .with_context(|| format!("no output {} (deployed with DeployFunctions=false?)", f.output_key()))?;
            Ok((f.logical_id, name.clone()))
        })
        .collect()
}

/// The alias every deploy points at the function's newest version (template.yaml,
/// `AutoPublishAlias`).
pub const ALIAS: &str = "live";

/// What the stack's event sources, sweep rule and Callback URL invoke: `Some(ALIAS)` with
/// `GradualDeploy=true` (the output `InvokedQualifier`), else `None`: each function (`$LATEST`),
/// as every stack deployed before the output existed.
pub fn invoked_qualifier<S: std::hash::BuildHasher>(outputs: &HashMap<String, String, S>) -> Option<&str> {
    outputs.get("InvokedQualifier").map(String::as_str).filter(|q| *q != "$LATEST")
}

/// A function's name as its invokers name it: `name` or `name:qualifier`. Lambda lists the event
/// source mappings of exactly that (an alias's are not the function's).
pub fn invoked_name(name: &str, qualifier: Option<&str>) -> String {
    qualifier.map_or_else(|| name.to_owned(), |q| format!("{name}:{q}"))
}

/// Wait until every function is `Active` and each of its event source mappings `Enabled` (the mappings of
/// `qualifier`: see [`invoked_qualifier`]).
pub async fn wait_ready(
    lambda: &aws_sdk_lambda::Client,
    names: &BTreeMap<String, String>,
    qualifier: Option<&str>,
    limit: Duration,
) -> Result<()> {
    let started = Instant::now();
    for name in names.values() {
        loop {
            let f = lambda.get_function().function_name(name).send().await.map_err(aws_sdk_lambda::Error::from)?;
            let state = f.configuration().and_then(|c| c.state().cloned());
            let esms = lambda
                .list_event_source_mappings()
                .function_name(invoked_name(name, qualifier))
                .send()
                .await
                .map_err(aws_sdk_lambda::Error::from)?;
            let esm_states: Vec<String> =
                esms.event_source_mappings().iter().map(|m| m.state().unwrap_or("?").to_owned()).collect();
            match state {
                Some(State::Active) if esm_states.iter().all(|s| s == "Enabled") => break,
                Some(State::Failed) => bail!(
                    "function {name} is Failed: {}",
                    f.configuration().and_then(|c| c.state_reason()).unwrap_or("no reason given")
                ),
                _ if started.elapsed() > limit => {
                    bail!("function {name} not ready after {limit:?}: state {state:?}, event sources {esm_states:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }
    Ok(())
}

/// One line of [`verify`]'s report.
#[derive(Debug, Clone)]
pub struct Check {
    pub ok: bool,
    pub what: String,
}

/// Every variable a function reads at start (`Resources::from_env`, `Settings::from_env`, the
/// agents' `${ORDER_SERVICE_URL}`, the log filter), with the stack output it must equal, if any.
pub const FUNCTION_ENVIRONMENT: &[(&str, Option<&str>)] = &[
    ("TASK_TABLE", Some("TaskTableName")),
    ("SUBMISSION_QUEUE_URL", Some("SubmissionQueueUrl")),
    ("SUBMISSION_DLQ_URL", Some("SubmissionDlqUrl")),
    ("SCHEDULER_QUEUE_URL", Some("SchedulerQueueUrl")),
    ("AGENT_QUEUE_URL", Some("AgentQueueUrl")),
    ("SUPERVISOR_QUEUE_URL", Some("SupervisorQueueUrl")),
    ("ALERT_TOPIC_ARN", Some("AlertTopicArn")),
    ("REPLY_QUEUE_ARN_PATTERN", Some("ReplyQueueArnPattern")),
    ("SUPERVISOR_SHARDS", Some("SupervisorShards")),
    ("CALLBACK_QUEUE_URL", Some("CallbackQueueUrl")),
    ("CALLBACK_DLQ_URL", Some("CallbackDlqUrl")),
    ("ENDS_QUEUE_URL", Some("EndsQueueUrl")),
    ("RETENTION_DAYS", None),
    ("START_TIMEOUT_MS", None),
    ("QUEUE_BUDGET_MS", None),
    ("RESULT_GRACE_MS", None),
    ("SETTLE_MS", None),
    ("UNCHECKED_START_MS", None),
    ("MAX_INPUT_BYTES", None),
    ("SEND_LINGER_MS", None),
    ("SWEEP_LAG_MS", None),
    ("SDK_CONNECT_TIMEOUT_MS", None),
    ("SDK_ATTEMPT_TIMEOUT_MS", None),
    ("SDK_OPERATION_TIMEOUT_MS", None),
    ("RUST_LOG", None),
    ("SAS_METRICS_NAMESPACE", Some("MetricsNamespace")),
    ("ORDER_SERVICE_URL", None),
    ("SAS_WORKFLOWS_FILE", None),
];

/// The variables only one function has (what it hands over or publishes to), with the stack
/// output each must equal.
pub const OWN_ENVIRONMENT: &[(&str, &str, &str)] = &[
    ("AgentFunction", "CALLBACK_URL", "CallbackUrl"),
    ("AgentFunction", "APPROVAL_TOPIC_ARN", "ApprovalTopicArn"),
    ("AgentFunction", "DEFAULT_EVENT_BUS_ARN", "DefaultEventBusArn"),
];

/// The queues (output keys of their ARNs) whose event source mappings invoke each function.
const EVENT_SOURCES: &[(&str, &[&str])] = &[
    ("SubmitterFunction", &["SubmissionQueueArn"]),
    ("SchedulerFunction", &["SchedulerQueueArn", "EndsQueueArn"]),
    ("AgentFunction", &["AgentQueueArn"]),
    ("SupervisorFunction", &["SupervisorQueueArn"]),
    ("CallbackFunction", &["CallbackQueueArn"]),
];

/// Read back what the deployed functions are wired to: each one's runtime, architecture and
/// environment (every variable the code reads, equal to the stack's outputs), its SQS event
/// sources (its own queues, batch size 10, `ReportBatchItemFailures`, enabled), and the sweep rule
/// with its permission to invoke the Supervisor; of the alias `live` when the stack invokes it
/// ([`invoked_qualifier`]).
pub async fn verify<S: std::hash::BuildHasher>(
    sdk: &aws_config::SdkConfig,
    outputs: &HashMap<String, String, S>,
) -> Result<Vec<Check>> {
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let names = function_names(outputs)?;
    // what the event sources, the rule and the URL invoke: the function or its alias
    let qualifier = invoked_qualifier(outputs);
    let mut checks = Vec::new();
    let mut check = |ok: bool, what: String| checks.push(Check { ok, what });
    for (id, name) in &names {
        // the version the alias points at (LocalStack reads no configuration by an alias)
        let version = match qualifier {
            Some(alias) => {
                let a = lambda
                    .get_alias()
                    .function_name(name)
                    .name(alias)
                    .send()
                    .await
                    .map_err(aws_sdk_lambda::Error::from)?;
                a.function_version().map(str::to_owned)
            }
            None => None,
        };
        let c = lambda
            .get_function_configuration()
            .function_name(name)
            .set_qualifier(version)
            .send()
            .await
            .map_err(aws_sdk_lambda::Error::from)?;
        let runtime = c.runtime().map(|r| r.as_str().to_owned()).unwrap_or_default();
        let archs: Vec<&str> = c.architectures().iter().map(aws_sdk_lambda::types::Architecture::as_str).collect();
        check(
            runtime.starts_with("provided") && c.handler() == Some("bootstrap"),
            format!("{id}: runtime {runtime}, handler {:?}, architectures {archs:?}", c.handler().unwrap_or("-")),
        );
        let layers: Vec<&str> = c.layers().iter().filter_map(aws_sdk_lambda::types::Layer::arn).collect();
        let config_layer = format!(":layer:{}-config:", outputs.get("StackName").map_or("", String::as_str));
        check(
            layers.len() == 1 && layers[0].contains(&config_layer),
            format!("{id}: layers {layers:?} (the configuration, in /opt)"),
        );
        let env = c.environment().and_then(|e| e.variables()).cloned().unwrap_or_default();
        let mut missing = Vec::new();
        let own = OWN_ENVIRONMENT.iter().filter(|(f, _, _)| f == id).map(|(_, var, output)| (*var, Some(*output)));
        let wanted: Vec<(&str, Option<&str>)> = FUNCTION_ENVIRONMENT.iter().copied().chain(own).collect();
        for (var, output) in &wanted {
            let good = match (env.get(*var), output.and_then(|o| outputs.get(o))) {
                (Some(v), Some(want)) => v == want,
                (Some(_), None) => output.is_none(),
                (None, _) => false,
            };
            if !good {
                missing.push(*var);
            }
        }
        check(
            missing.is_empty(),
            if missing.is_empty() {
                format!("{id}: environment has the {} variables the code reads", wanted.len())
            } else {
                format!("{id}: environment lacks or mismatches {missing:?}")
            },
        );
        let mut want: Vec<&str> = EVENT_SOURCES
            .iter()
            .find(|(f, _)| f == id)
            .map(|(_, qs)| qs.iter().filter_map(|q| outputs.get(*q).map(String::as_str)).collect())
            .unwrap_or_default();
        want.sort_unstable();
        let esms = lambda
            .list_event_source_mappings()
            .function_name(invoked_name(name, qualifier))
            .send()
            .await
            .map_err(aws_sdk_lambda::Error::from)?;
        let m = esms.event_source_mappings();
        let mut got: Vec<&str> = m.iter().filter_map(|m| m.event_source_arn()).collect();
        got.sort_unstable();
        let good = !want.is_empty()
            && got == want
            && m.iter().all(|m| {
                m.batch_size() == Some(10)
                    && m.state() == Some("Enabled")
                    && m.function_response_types()
                        .contains(&aws_sdk_lambda::types::FunctionResponseType::ReportBatchItemFailures)
            });
        let described: Vec<String> = m
            .iter()
            .map(|m| {
                format!(
                    "{} (batch size {:?}, response types {:?}, state {:?})",
                    m.event_source_arn().and_then(|a| a.rsplit(':').next()).unwrap_or("NONE"),
                    m.batch_size(),
                    m.function_response_types()
                        .iter()
                        .map(aws_sdk_lambda::types::FunctionResponseType::as_str)
                        .collect::<Vec<_>>(),
                    m.state(),
                )
            })
            .collect();
        check(
            good,
            format!(
                "{id}: SQS event sources {} of {} wanted: {}",
                m.len(),
                want.len(),
                if described.is_empty() { "NONE".to_owned() } else { described.join(", ") }
            ),
        );
    }
    // The sweep rule: a resource of the stack, and the Supervisor's policy lets it invoke.
    let cfn = aws_sdk_cloudformation::Client::new(sdk);
    let stack_name = outputs.get("StackName").context("no StackName")?;
    let rule = cfn
        .describe_stack_resource()
        .stack_name(stack_name)
        .logical_resource_id("SupervisorSweepRule")
        .send()
        .await
        .map_err(aws_sdk_cloudformation::Error::from)?;
    let rule = rule.stack_resource_detail();
    let rule_name = rule.and_then(|r| r.physical_resource_id()).unwrap_or_default().to_owned();
    let rule_status = rule.and_then(|r| r.resource_status()).map(|s| s.as_str().to_owned()).unwrap_or_default();
    let supervisor = names.get("SupervisorFunction").context("no SupervisorFunction")?;
    let policy = lambda
        .get_policy()
        .function_name(supervisor)
        .set_qualifier(qualifier.map(str::to_owned))
        .send()
        .await
        .map_err(aws_sdk_lambda::Error::from)?;
    let policy = policy.policy().unwrap_or_default();
    let rule_id = rule_name.rsplit('/').next().unwrap_or(&rule_name);
    check(
        rule_status.ends_with("_COMPLETE")
            && !rule_id.is_empty()
            && policy.contains("events.amazonaws.com")
            && policy.contains(rule_id),
        format!("SupervisorSweepRule {rule_id} ({rule_status}) may invoke the Supervisor (events.amazonaws.com)"),
    );
    // The Callback function's URL: IAM auth, and the one the stack outputs (and the Agent hands over).
    let callback = names.get("CallbackFunction").context("no CallbackFunction")?;
    let url = lambda
        .get_function_url_config()
        .function_name(callback)
        .set_qualifier(qualifier.map(str::to_owned))
        .send()
        .await
        .map_err(aws_sdk_lambda::Error::from)?;
    check(
        url.auth_type() == &aws_sdk_lambda::types::FunctionUrlAuthType::AwsIam
            && outputs.get("CallbackUrl").map(String::as_str) == Some(url.function_url()),
        format!("CallbackFunction: URL {} with auth {}", url.function_url(), url.auth_type().as_str()),
    );
    Ok(checks)
}

/// The messages of a function's log group `/aws/lambda/<name>`, oldest first (empty when the
/// group does not exist yet).
pub async fn log_messages(logs: &aws_sdk_cloudwatchlogs::Client, function_name: &str) -> Result<Vec<String>> {
    let group = format!("/aws/lambda/{function_name}");
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let r = logs.filter_log_events().log_group_name(&group).set_next_token(token.take()).send().await;
        let page = match r {
            Ok(p) => p,
            Err(e) => {
                let e = aws_sdk_cloudwatchlogs::Error::from(e);
                if matches!(e, aws_sdk_cloudwatchlogs::Error::ResourceNotFoundException(_)) {
                    return Ok(out);
                }
                return Err(e.into());
            }
        };
        out.extend(page.events().iter().filter_map(|e| e.message().map(str::to_owned)));
        match page.next_token() {
            Some(t) if !page.events().is_empty() => token = Some(t.to_owned()),
            _ => return Ok(out),
        }
    }
}

/// How many invocations a function's log shows (its `START` lines, or `platform.start` records
/// with JSON logging).
pub fn invocations(messages: &[String]) -> usize {
    messages.iter().filter(|m| m.starts_with("START RequestId:") || m.contains("\"type\":\"platform.start\"")).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invokers_name_the_alias_only_when_the_stack_says_so() {
        let outputs = |q: Option<&str>| -> HashMap<String, String> {
            q.map(|q| ("InvokedQualifier".to_owned(), q.to_owned())).into_iter().collect()
        };
        assert_eq!(invoked_qualifier(&outputs(Some(ALIAS))), Some(ALIAS));
        assert_eq!(invoked_qualifier(&outputs(Some("$LATEST"))), None);
        // a stack deployed before the output existed invokes each function
        assert_eq!(invoked_qualifier(&outputs(None)), None);
        assert_eq!(invoked_name("s-AgentFunction-1", Some(ALIAS)), "s-AgentFunction-1:live");
        assert_eq!(invoked_name("s-AgentFunction-1", None), "s-AgentFunction-1");
        // the template's output says the same as the code's alias
        assert!(stack::TEMPLATE.contains("    AutoPublishAlias: live\n"));
        assert!(stack::TEMPLATE.contains("    Value: !If [GradualDeploys, live, $LATEST]\n"));
    }

    #[test]
    fn the_template_names_five_functions_with_their_binaries() {
        let f = functions(stack::TEMPLATE).unwrap();
        let got: Vec<(&str, &str)> = f.iter().map(|f| (f.logical_id.as_str(), f.binary.as_str())).collect();
        assert_eq!(
            got,
            vec![
                ("SubmitterFunction", "sas-submitter"),
                ("SchedulerFunction", "sas-scheduler"),
                ("AgentFunction", "sas-agent"),
                ("SupervisorFunction", "sas-supervisor"),
                ("CallbackFunction", "sas-callback"),
            ]
        );
    }

    #[test]
    fn code_uris_replace_exactly_the_functions_local_code() {
        let uris: HashMap<String, String> = functions(stack::TEMPLATE)
            .unwrap()
            .into_iter()
            .map(|f| (f.logical_id.clone(), format!("s3://b/{}.zip", f.binary)))
            .collect();
        let t = with_code_uris(stack::TEMPLATE, &uris).unwrap();
        assert!(!t.contains("CodeUri: ./"));
        assert!(t.contains("      CodeUri: s3://b/sas-agent.zip\n"));
        assert_eq!(t.lines().count(), stack::TEMPLATE.lines().count());
        let mut fewer = uris.clone();
        fewer.insert("NoSuchFunction".into(), "s3://b/x.zip".into());
        assert!(with_code_uris(stack::TEMPLATE, &fewer).is_err());
    }

    #[test]
    fn elf_headers_tell_the_architecture() {
        let mut h = vec![0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[18] = 0x3e;
        assert_eq!(elf_architecture(&h), Some("x86_64"));
        h[18] = 0xb7;
        assert_eq!(elf_architecture(&h), Some("arm64"));
        assert_eq!(elf_architecture(b"#!/bin/sh\n"), None);
    }

    /// Every entry of a zip: name, Unix mode, content.
    fn unzip(z: &[u8]) -> Vec<(String, Option<u32>, Vec<u8>)> {
        let mut a = zip::ZipArchive::new(std::io::Cursor::new(z)).expect("a zip");
        (0..a.len())
            .map(|i| {
                let mut f = a.by_index(i).expect("an entry");
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut bytes).expect("inflates");
                (f.name().expect("a UTF-8 name").into_owned(), f.unix_mode(), bytes)
            })
            .collect()
    }

    #[test]
    fn the_zip_is_one_executable_bootstrap_that_inflates_back() {
        let body: Vec<u8> = (0..100_000u32).map(|i| u8::try_from(i % 251).unwrap()).collect();
        let z = zip_bootstrap(&body).unwrap();
        let got = unzip(&z);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "bootstrap");
        assert_eq!(got[0].1.map(|m| m & 0o777), Some(0o755));
        assert_eq!(got[0].2, body);
        assert!(z.len() < body.len() / 2, "deflated: {} bytes", z.len());
        assert_eq!(zip_bootstrap(&body).unwrap(), z, "the same binary gives the same bytes (and S3 key)");
    }

    #[test]
    fn a_directory_zips_to_its_files_in_name_order_with_their_modes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("sas-zip-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("workflows.json"), b"{\"workflows\": []}").unwrap();
        std::fs::write(dir.join("agents.json"), b"{}").unwrap();
        std::fs::write(dir.join("sub/run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(dir.join("sub/run.sh"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let entries = dir_entries(&dir).unwrap();
        let z = zip_files(&entries).unwrap();
        let again = zip_files(&dir_entries(&dir).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let got = unzip(&z);
        let names: Vec<(&str, Option<u32>)> = got.iter().map(|(n, m, _)| (n.as_str(), m.map(|m| m & 0o777))).collect();
        assert_eq!(names, [("agents.json", Some(0o644)), ("sub/run.sh", Some(0o755)), ("workflows.json", Some(0o644))]);
        assert_eq!(got[2].2, b"{\"workflows\": []}");
        assert_eq!(again, z, "the same files give the same bytes (and S3 key)");
        assert!(dir_entries(&dir).is_err(), "a missing directory is an error");
    }

    #[test]
    fn the_template_has_one_layer_the_configuration() {
        assert_eq!(
            layers(stack::TEMPLATE).unwrap(),
            [LayerSpec { logical_id: CONFIG_LAYER.into(), content_uri: "config/".into() }]
        );
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        let p = package_layers(stack::TEMPLATE, &|_| Ok(config.clone())).unwrap();
        assert_eq!(p[0].files, ["agents.json", "workflows.json"]);
        let hash = p[0].key.strip_prefix("ConfigLayer/").and_then(|k| k.strip_suffix(".zip"));
        assert!(hash.is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit())), "{}", p[0].key);
        let empty = std::env::temp_dir().join(format!("sas-empty-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = package_layers(stack::TEMPLATE, &|_| Ok(empty.clone())).unwrap_err();
        std::fs::remove_dir(&empty).unwrap();
        assert!(format!("{e:#}").contains("holds no file"), "{e:#}");
    }

    #[test]
    fn the_layers_content_uri_is_replaced_with_its_zip() {
        let mut uris: HashMap<String, String> = functions(stack::TEMPLATE)
            .unwrap()
            .into_iter()
            .map(|f| (f.logical_id.clone(), format!("s3://b/{}.zip", f.binary)))
            .collect();
        uris.insert(CONFIG_LAYER.into(), "s3://b/ConfigLayer/0123.zip".into());
        let t = with_code_uris(stack::TEMPLATE, &uris).unwrap();
        assert!(!t.contains("ContentUri: config/"));
        assert!(t.contains("      ContentUri: s3://b/ConfigLayer/0123.zip\n"));
        assert!(layers(&t).unwrap().is_empty(), "no local directory is left");
        assert_eq!(t.lines().count(), stack::TEMPLATE.lines().count());
        // byte for byte the text the earlier line-by-line rewrite gave
        let mut by_text = stack::TEMPLATE.replace("ContentUri: config/", "ContentUri: s3://b/ConfigLayer/0123.zip");
        for f in functions(stack::TEMPLATE).unwrap() {
            let at = by_text.find("CodeUri: ./").unwrap();
            by_text.replace_range(at..at + "CodeUri: ./".len(), &format!("CodeUri: s3://b/{}.zip", f.binary));
        }
        assert!(t == by_text, "only the local code URIs differ from the shipped template");
    }

    #[test]
    fn invocations_count_start_lines_in_either_log_format() {
        let m = vec![
            "START RequestId: 1 Version: $LATEST".to_owned(),
            r#"{"time":"x","type":"platform.start","record":{"requestId":"2"}}"#.to_owned(),
            r#"{"level":"INFO","message":"task created"}"#.to_owned(),
        ];
        assert_eq!(invocations(&m), 2);
    }
}
