//! A record of every AWS call a process makes, for the least-privilege check (`sasctl iam-check`,
//! the Lambda-mode tests): an SDK interceptor that, when `SAS_AWS_CALL_LOG` names a directory,
//! appends one JSON line per operation to `<dir>/<function>.<pid>.jsonl`: the function
//! (`AWS_LAMBDA_FUNCTION_NAME`, else the executable's name), the IAM action the operation needs
//! (`sqs:SendMessage` for `SendMessageBatch` too) and what it touched (a queue URL, a table and
//! index, a topic ARN), read from the serialized request. Unset (the default), no interceptor is
//! registered at all.
//!
//! The record holds what the request says; [`AwsCall::resources`] turns it into the ARNs IAM
//! evaluates, given the account and partition of the caller (a table is named without them).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde::{Deserialize, Serialize};

/// The environment variable naming the directory the call logs go to.
pub const CALL_LOG_ENV: &str = "SAS_AWS_CALL_LOG";

/// One AWS operation a process sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwsCall {
    /// `AWS_LAMBDA_FUNCTION_NAME`, else the executable's name.
    pub function: String,
    /// The IAM action that authorises the operation (`sqs:SendMessage`).
    pub action: String,
    /// The client's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// What the request names.
    pub target: Target,
}

/// The resource a request names, as the request names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Queue {
        url: String,
    },
    Table {
        name: String,
        index: Option<String>,
        /// The partition key (`TaskId`) of a single-item request (`Key`, or `Item` for a put).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// The attributes a request reads (`ProjectionExpression`, names resolved through
        /// `ExpressionAttributeNames`; a document path counts as its top-level attribute),
        /// sorted; `None` when it names none (it reads every attribute).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attributes: Option<Vec<String>>,
    },
    Tables {
        names: Vec<String>,
    },
    Topic {
        arn: String,
    },
    /// The event buses of a PutEvents request's entries (a name or an ARN each; `default` when an
    /// entry names none).
    EventBuses {
        names: Vec<String>,
    },
    /// An S3 bucket, or an object in it (`Bucket`, `Key`: the `aws` agent's S3 actions).
    Bucket {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// An operation that names no resource this module knows (its ARN is `*`).
    Unknown,
}

/// Why a recorded call's resource could not be named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("queue URL {0:?} is not <scheme>://<host>/<account>/<name>")]
    QueueUrl(String),
    #[error("{0} names no region")]
    NoRegion(String),
}

/// The IAM action for an operation of a service (as the SDK's operation metadata names them:
/// `SQS`, `SendMessageBatch`). Batch variants are authorised by their single action.
pub fn iam_action(service: &str, operation: &str) -> String {
    // EventBridge's actions keep CloudWatch Events' prefix
    let prefix = match service.to_ascii_lowercase() {
        s if s == "eventbridge" => "events".to_owned(),
        s => s,
    };
    let op = match (prefix.as_str(), operation) {
        ("sqs", "SendMessageBatch") => "SendMessage",
        ("sqs", "DeleteMessageBatch") => "DeleteMessage",
        ("sqs", "ChangeMessageVisibilityBatch") => "ChangeMessageVisibility",
        ("sns", "PublishBatch") => "Publish",
        (_, op) => op,
    };
    format!("{prefix}:{op}")
}

/// What the serialized request body names: `QueueUrl`, `TableName` (+ `IndexName`),
/// `RequestItems`' tables (JSON protocols: SQS, DynamoDB), `Entries`' event buses (EventBridge),
/// `TopicArn` (SNS's query protocol).
pub fn target_of(body: &[u8]) -> Target {
    if let Ok(serde_json::Value::Object(o)) = serde_json::from_slice::<serde_json::Value>(body) {
        let s = |k: &str| o.get(k).and_then(serde_json::Value::as_str).map(str::to_owned);
        if let Some(url) = s("QueueUrl") {
            return Target::Queue { url };
        }
        if let Some(name) = s("TableName") {
            let key =
                ["Key", "Item"].iter().find_map(|k| o.get(*k)?.get("TaskId")?.get("S")?.as_str().map(str::to_owned));
            let attributes = s("ProjectionExpression").map(|p| projected(&p, o.get("ExpressionAttributeNames")));
            return Target::Table { name, index: s("IndexName"), key, attributes };
        }
        if let Some(serde_json::Value::Object(items)) = o.get("RequestItems") {
            return Target::Tables { names: items.keys().cloned().collect() };
        }
        if let Some(serde_json::Value::Array(entries)) = o.get("Entries") {
            let mut names: Vec<String> = entries
                .iter()
                .map(|e| e.get("EventBusName").and_then(serde_json::Value::as_str).unwrap_or("default").to_owned())
                .collect();
            names.sort();
            names.dedup();
            return Target::EventBuses { names };
        }
        if let Some(arn) = s("TopicArn") {
            return Target::Topic { arn };
        }
        if let Some(name) = s("Bucket") {
            return Target::Bucket { name, key: s("Key") };
        }
        return Target::Unknown;
    }
    let form = String::from_utf8_lossy(body);
    for pair in form.split('&') {
        if let Some(v) = pair.strip_prefix("TopicArn=") {
            let v = v.replace('+', " ");
            return Target::Topic { arn: percent_encoding::percent_decode_str(&v).decode_utf8_lossy().into_owned() };
        }
    }
    Target::Unknown
}

/// The top-level attributes a projection expression names (`#n` placeholders resolved through
/// `names`), sorted and without repeats: what IAM's `dynamodb:Attributes` holds for the request.
pub fn projected(expression: &str, names: Option<&serde_json::Value>) -> Vec<String> {
    let mut out: Vec<String> = expression
        .split(',')
        .filter_map(|path| {
            let top = path.trim().split(['.', '[']).next()?.trim();
            let name = if top.starts_with('#') { names?.get(top)?.as_str()? } else { top };
            (!name.is_empty()).then(|| name.to_owned())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The partition of a region (`aws`, `aws-cn`, `aws-us-gov`).
pub fn partition(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    }
}

/// A queue's ARN from its URL (`https://sqs.<region>.amazonaws.com/<account>/<name>`, or
/// LocalStack's `http://localhost:4566/<account>/<name>` and path-style
/// `http://localhost:4566/queue/<region>/<account>/<name>`): the account is the URL's, and so is
/// the region when the path names one.
pub fn queue_arn(url: &str, region: &str) -> Result<String, ResourceError> {
    let bad = || ResourceError::QueueUrl(url.to_owned());
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let path: Vec<&str> = rest.split('/').skip(1).filter(|p| !p.is_empty()).collect();
    let (region, account, name) = match path.as_slice() {
        [account, name] => (region, *account, *name),
        ["queue", region, account, name] => (*region, *account, *name),
        _ => return Err(bad()),
    };
    if account.is_empty() || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok(format!("arn:{}:sqs:{region}:{account}:{name}", partition(region)))
}

/// The class of a table key, as the least-privilege check reports and evaluates it (one row per
/// kind of item, not per task): the prefix of a prefixed item with `…` for the rest
/// (`limit:…`, `history:…`, `workflow:…`), `<task id>` for a task's own item (task ids have no
/// `:`).
pub fn key_class(key: &str) -> String {
    match key.split_once(':') {
        Some((prefix, _)) => format!("{prefix}:…"),
        None => "<task id>".to_owned(),
    }
}

impl AwsCall {
    /// The class ([`key_class`]) of the item key a single-item table request names.
    pub fn leading_key(&self) -> Option<String> {
        match &self.target {
            Target::Table { key: Some(k), .. } => Some(key_class(k)),
            _ => None,
        }
    }

    /// The attributes a table request reads, when it names them (see [`projected`]).
    pub fn attributes(&self) -> Option<Vec<String>> {
        match &self.target {
            Target::Table { attributes, .. } => attributes.clone(),
            _ => None,
        }
    }

    /// The ARNs IAM evaluates this call against; a table is in the caller's `account`.
    pub fn resources(&self, account: &str) -> Result<Vec<String>, ResourceError> {
        let region = || self.region.clone().ok_or_else(|| ResourceError::NoRegion(self.action.clone()));
        let table =
            |region: &str, name: &str| format!("arn:{}:dynamodb:{region}:{account}:table/{name}", partition(region));
        Ok(match &self.target {
            Target::Queue { url } => vec![queue_arn(url, &region()?)?],
            Target::Table { name, index: None, .. } => vec![table(&region()?, name)],
            Target::Table { name, index: Some(i), .. } => vec![format!("{}/index/{i}", table(&region()?, name))],
            Target::Tables { names } => {
                let r = region()?;
                names.iter().map(|n| table(&r, n)).collect()
            }
            Target::Topic { arn } => vec![arn.clone()],
            Target::EventBuses { names } => {
                let r = region()?;
                names
                    .iter()
                    .map(|n| {
                        if n.starts_with("arn:") {
                            n.clone()
                        } else {
                            format!("arn:{}:events:{r}:{account}:event-bus/{n}", partition(&r))
                        }
                    })
                    .collect()
            }
            // S3's ARNs name no region or account
            Target::Bucket { name, key: None } => vec![format!("arn:{}:s3:::{name}", partition(&region()?))],
            Target::Bucket { name, key: Some(k) } => vec![format!("arn:{}:s3:::{name}/{k}", partition(&region()?))],
            Target::Unknown => vec!["*".to_owned()],
        })
    }
}

/// Reads every `*.jsonl` call log in `dir` (none: empty).
pub fn read_dir(dir: &Path) -> std::io::Result<Vec<AwsCall>> {
    let mut calls = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(calls),
        Err(e) => return Err(e),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p)?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let call = serde_json::from_str(line).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}:{}: {e}", p.display(), i + 1))
            })?;
            calls.push(call);
        }
    }
    Ok(calls)
}

/// The interceptor: one line per operation (after serialization, so once per operation, not per
/// retry attempt).
#[derive(Debug, Clone)]
pub struct CallRecorder {
    function: String,
    path: PathBuf,
    file: Arc<Mutex<Option<File>>>,
}

impl CallRecorder {
    /// A recorder appending to `<dir>/<function>.<pid>.jsonl` (created on the first call).
    pub fn new(dir: &Path, function: &str) -> Self {
        let safe: String =
            function.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        let path = dir.join(format!("{safe}.{}.jsonl", std::process::id()));
        CallRecorder { function: function.to_owned(), path, file: Arc::new(Mutex::new(None)) }
    }

    /// From the environment: `SAS_AWS_CALL_LOG` set and not empty, else `None`.
    pub fn from_env() -> Option<Self> {
        let dir = std::env::var_os(CALL_LOG_ENV).filter(|d| !d.is_empty())?;
        let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok().filter(|f| !f.is_empty()).unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "process".to_owned())
        });
        Some(Self::new(Path::new(&dir), &function))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a call this process's function made outside the SDK (the `aws` agent's).
    pub fn record_call(&self, action: String, region: Option<String>, target: Target) -> std::io::Result<()> {
        self.record(&AwsCall { function: self.function.clone(), action, region, target })
    }

    /// Appends one call (one `write` of the whole line).
    pub fn record(&self, call: &AwsCall) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(call).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut guard = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            *guard = Some(OpenOptions::new().create(true).append(true).open(&self.path)?);
        }
        guard.as_mut().map_or(Ok(()), |f| f.write_all(&line))
    }
}

impl Intercept for CallRecorder {
    fn name(&self) -> &'static str {
        "CallRecorder"
    }

    fn read_after_serialization(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(meta) = cfg.load::<Metadata>() else {
            return Err("AWS call log: an operation without metadata".into());
        };
        let body = context.request().body().bytes().unwrap_or_default();
        let call = AwsCall {
            function: self.function.clone(),
            action: iam_action(meta.service(), meta.name()),
            region: cfg.load::<aws_config::Region>().map(|r| r.as_ref().to_owned()),
            target: target_of(body),
        };
        // Failing the call is loud on purpose: a call missing from the log would pass the check.
        self.record(&call).map_err(|e| format!("AWS call log {}: {e}", self.path.display()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_operations_need_their_single_action() {
        assert_eq!(iam_action("SQS", "SendMessageBatch"), "sqs:SendMessage");
        assert_eq!(iam_action("SQS", "ReceiveMessage"), "sqs:ReceiveMessage");
        assert_eq!(iam_action("DynamoDB", "BatchGetItem"), "dynamodb:BatchGetItem");
        assert_eq!(iam_action("SNS", "Publish"), "sns:Publish");
        assert_eq!(iam_action("EventBridge", "PutEvents"), "events:PutEvents");
    }

    #[test]
    fn targets_are_read_from_json_and_query_bodies() {
        assert_eq!(
            target_of(br#"{"QueueUrl":"http://localhost:4566/000000000000/q","MessageBody":"x"}"#),
            Target::Queue { url: "http://localhost:4566/000000000000/q".into() }
        );
        assert_eq!(
            target_of(br#"{"TableName":"t","IndexName":"ByCompleteBy"}"#),
            Target::Table { name: "t".into(), index: Some("ByCompleteBy".into()), key: None, attributes: None }
        );
        // what an agent reads of a task before it calls: its key and LockedBy, nothing else
        assert_eq!(
            target_of(
                br##"{"TableName":"t","Key":{"TaskId":{"S":"o-1"}},"ProjectionExpression":"TaskId, #l, Steps[0].Name, LockedBy","ExpressionAttributeNames":{"#l":"LockedBy"},"ConsistentRead":true}"##
            ),
            Target::Table {
                name: "t".into(),
                index: None,
                key: Some("o-1".into()),
                attributes: Some(vec!["LockedBy".into(), "Steps".into(), "TaskId".into()])
            }
        );
        assert_eq!(
            target_of(br#"{"RequestItems":{"a":{},"b":{}}}"#),
            Target::Tables { names: vec!["a".into(), "b".into()] }
        );
        assert_eq!(
            target_of(b"Action=Publish&Version=2010-03-31&TopicArn=arn%3Aaws%3Asns%3Aus-east-1%3A1%3Atopic&Message=x"),
            Target::Topic { arn: "arn:aws:sns:us-east-1:1:topic".into() }
        );
        assert_eq!(
            target_of(br#"{"Entries":[{"EventBusName":"orders","Detail":"{}"},{"Source":"s"}]}"#),
            Target::EventBuses { names: vec!["default".into(), "orders".into()] }
        );
        assert_eq!(target_of(b"{}"), Target::Unknown);
        assert_eq!(
            target_of(br#"{"Bucket": "reports", "Key": "2026/a.json", "Body": "{}"}"#),
            Target::Bucket { name: "reports".into(), key: Some("2026/a.json".into()) }
        );
    }

    #[test]
    fn resources_are_the_arns_iam_evaluates() {
        let call =
            |target| AwsCall { function: "f".into(), action: "x:Y".into(), region: Some("eu-west-1".into()), target };
        let q = call(Target::Queue { url: "https://sqs.eu-west-1.amazonaws.com/222233334444/replies.fifo".into() });
        assert_eq!(q.resources("111122223333").unwrap(), vec!["arn:aws:sqs:eu-west-1:222233334444:replies.fifo"]);
        let i =
            call(Target::Table { name: "t".into(), index: Some("ByCompleteBy".into()), key: None, attributes: None });
        assert_eq!(
            i.resources("111122223333").unwrap(),
            vec!["arn:aws:dynamodb:eu-west-1:111122223333:table/t/index/ByCompleteBy"]
        );
        let path_style =
            call(Target::Queue { url: "http://localhost:4566/queue/us-east-1/000000000000/s-AgentDLQ".into() });
        assert_eq!(path_style.resources("1").unwrap(), vec!["arn:aws:sqs:us-east-1:000000000000:s-AgentDLQ"]);
        let buses = call(Target::EventBuses {
            names: vec!["orders".into(), "arn:aws:events:us-east-1:222233334444:event-bus/shop".into()],
        });
        assert_eq!(
            buses.resources("111122223333").unwrap(),
            vec![
                "arn:aws:events:eu-west-1:111122223333:event-bus/orders",
                "arn:aws:events:us-east-1:222233334444:event-bus/shop"
            ]
        );
        let bad = call(Target::Queue { url: "http://localhost:4566/q".into() });
        assert!(matches!(bad.resources("1"), Err(ResourceError::QueueUrl(_))));
    }

    #[test]
    fn the_recorder_appends_lines_read_back_by_read_dir() {
        let dir = std::env::temp_dir().join(format!("sas-calls-{}", uuid::Uuid::new_v4().simple()));
        let r = CallRecorder::new(&dir, "fn:1");
        let call = AwsCall {
            function: "fn:1".into(),
            action: "sqs:SendMessage".into(),
            region: Some("us-east-1".into()),
            target: Target::Unknown,
        };
        r.record(&call).unwrap();
        r.record(&call).unwrap();
        assert_eq!(read_dir(&dir).unwrap(), vec![call.clone(), call]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
