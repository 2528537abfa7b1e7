//! The least-privilege check: every AWS call a deployed stack's functions made (recorded by
//! [`sas_core::aws_calls`], plus the calls the platform makes with each function's role) is
//! evaluated against that role's policies as IAM stores them for the deployed stack (intrinsics
//! resolved). A call no statement allows fails the check; a grant no call used is reported.
//!
//! LocalStack Community does not enforce IAM, so this is what proves that the template grants
//! what the code needs. `sasctl iam-check --stack NAME --calls DIR` and the Lambda-mode tests
//! (`tests/tests/it/lambda.rs`) run it.
//!
//! The evaluator knows identity policies only: `Allow`/`Deny`, `Action`/`NotAction`,
//! `Resource`/`NotResource` with `*` and `?` wildcards, and two DynamoDB conditions: which item
//! keys a statement allows (`dynamodb:LeadingKeys`) and which attributes it lets a request read
//! (`dynamodb:Attributes` with `dynamodb:Select`). Any other `Condition` (or any other key of a
//! statement) is an error, never silently allowed or ignored.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use sas_core::aws_calls::{partition, AwsCall};

/// Why a policy document cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("policy {policy}: {what}")]
    Unsupported { policy: String, what: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

/// `Action` (`Only`) or `NotAction` (`Except`); the same for resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Patterns {
    Only(Vec<String>),
    Except(Vec<String>),
}

impl Patterns {
    fn matches(&self, text: &str, case_insensitive: bool) -> bool {
        match self {
            Patterns::Only(p) => p.iter().any(|p| glob(p, text, case_insensitive)),
            Patterns::Except(p) => !p.iter().any(|p| glob(p, text, case_insensitive)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// `<policy>/<Sid>` (or `<policy>/#<index>` without a Sid).
    pub id: String,
    pub effect: Effect,
    pub actions: Patterns,
    pub resources: Patterns,
    /// `Condition: {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [...]}}`: the statement
    /// allows only requests whose item key matches one of these.
    pub leading_keys: Option<Vec<String>>,
    /// `Condition: {"ForAllValues:StringEquals": {"dynamodb:Attributes": [...]},
    /// "StringEqualsIfExists": {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"}}`: the statement allows
    /// only requests that name the attributes they read, all of them among these.
    pub attributes: Option<Vec<String>>,
}

/// IAM's wildcard match: `*` any run of characters, `?` one character. Actions match without
/// regard to case, resources with.
pub fn glob(pattern: &str, text: &str, case_insensitive: bool) -> bool {
    let norm = |s: &str| if case_insensitive { s.to_ascii_lowercase() } else { s.to_owned() };
    let (p, t) = (norm(pattern).into_bytes(), norm(text).into_bytes());
    // Iterative wildcard match with one backtrack point (the last `*`).
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

fn strings(v: &Value, policy: &str, key: &str) -> Result<Vec<String>, PolicyError> {
    let bad = || PolicyError::Unsupported {
        policy: policy.to_owned(),
        what: format!("{key} is not a string or a list of strings"),
    };
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_owned).ok_or_else(bad)).collect(),
        _ => Err(bad()),
    }
}

/// The DynamoDB conditions a statement's `Condition` holds: its item key patterns
/// (`{"ForAllValues:StringLike" | "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [...]}}`)
/// and its attributes (`{"ForAllValues:StringEquals": {"dynamodb:Attributes": [...]}}`, which IAM
/// lets through a request that names no attribute unless `dynamodb:Select` is also held to
/// `SPECIFIC_ATTRIBUTES`: the pair is required). `None` for anything else.
#[allow(clippy::type_complexity)]
fn conditions(c: &Value) -> Option<(Option<Vec<String>>, Option<Vec<String>>)> {
    let list = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_owned)).collect(),
            _ => None,
        }
    };
    let (mut keys, mut attributes, mut select) = (None, None, false);
    for (op, v) in c.as_object().filter(|o| !o.is_empty())? {
        for (key, values) in v.as_object().filter(|o| !o.is_empty())? {
            match (op.as_str(), key.as_str()) {
                ("ForAllValues:StringLike", "dynamodb:LeadingKeys") => keys = Some(list(values)?),
                ("ForAllValues:StringEquals", "dynamodb:LeadingKeys") => {
                    // literal: no wildcards (a literal `*` would not match our keys anyway)
                    keys = Some(list(values)?.into_iter().filter(|k| !k.contains(['*', '?'])).collect());
                }
                ("ForAllValues:StringEquals", "dynamodb:Attributes") => attributes = Some(list(values)?),
                ("StringEqualsIfExists" | "StringEquals", "dynamodb:Select") => {
                    select = list(values)? == ["SPECIFIC_ATTRIBUTES"];
                    if !select {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }
    if attributes.is_some() != select {
        return None;
    }
    Some((keys, attributes))
}

/// The statements of one identity policy document (`policy` names it in ids and errors).
pub fn parse_policy(policy: &str, doc: &Value) -> Result<Vec<Statement>, PolicyError> {
    let unsupported = |what: String| PolicyError::Unsupported { policy: policy.to_owned(), what };
    let stmts = match doc.get("Statement") {
        Some(Value::Array(a)) => a.clone(),
        Some(o @ Value::Object(_)) => vec![o.clone()],
        _ => return Err(unsupported("no Statement".into())),
    };
    let mut out = Vec::new();
    for (i, s) in stmts.iter().enumerate() {
        let o = s.as_object().ok_or_else(|| unsupported(format!("statement {i} is not an object")))?;
        let id =
            format!("{policy}/{}", o.get("Sid").and_then(Value::as_str).map_or_else(|| format!("#{i}"), str::to_owned));
        for key in o.keys() {
            if !matches!(
                key.as_str(),
                "Sid" | "Effect" | "Action" | "NotAction" | "Resource" | "NotResource" | "Condition"
            ) {
                return Err(unsupported(format!("{id}: {key} is not evaluated by this check")));
            }
        }
        let effect = match o.get("Effect").and_then(Value::as_str) {
            Some("Allow") => Effect::Allow,
            Some("Deny") => Effect::Deny,
            other => return Err(unsupported(format!("{id}: Effect {other:?}"))),
        };
        let pair = |only: &str, except: &str| -> Result<Patterns, PolicyError> {
            match (o.get(only), o.get(except)) {
                (Some(v), None) => Ok(Patterns::Only(strings(v, policy, only)?)),
                (None, Some(v)) => Ok(Patterns::Except(strings(v, policy, except)?)),
                _ => Err(unsupported(format!("{id}: exactly one of {only} and {except}"))),
            }
        };
        let (leading_keys, attributes) = match o.get("Condition") {
            None => (None, None),
            Some(c) => conditions(c).ok_or_else(|| {
                unsupported(format!(
                    "{id}: Condition {c} is not evaluated by this check (only dynamodb:LeadingKeys with ForAllValues, \
                     and dynamodb:Attributes with ForAllValues:StringEquals beside dynamodb:Select SPECIFIC_ATTRIBUTES, are)"
                ))
            })?,
        };
        out.push(Statement {
            actions: pair("Action", "NotAction")?,
            resources: pair("Resource", "NotResource")?,
            id,
            effect,
            leading_keys,
            attributes,
        });
    }
    Ok(out)
}

/// IAM's answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by these statements (every Allow that matches).
    Allowed(Vec<String>),
    /// No statement allows it.
    ImplicitDeny,
    /// A Deny statement matches.
    ExplicitDeny(String),
}

pub fn evaluate(statements: &[Statement], action: &str, resource: &str) -> Decision {
    evaluate_keyed(statements, action, resource, None)
}

/// What a single-item table request names: the class of its item key (as
/// [`sas_core::aws_calls::key_class`] classes it) and the attributes it reads (`None`: all).
#[derive(Debug, Clone, Copy, Default)]
pub struct Item<'a> {
    pub key: Option<&'a str>,
    pub attributes: Option<&'a [String]>,
}

/// [`evaluate`] for a request that names an item `key` (as [`sas_core::aws_calls::key_class`]
/// classes it). A statement with a `dynamodb:LeadingKeys` condition allows only requests with a
/// key that matches (stricter than IAM, where `ForAllValues` holds for a request without keys:
/// the check never lets a condition pass for want of a key).
pub fn evaluate_keyed(statements: &[Statement], action: &str, resource: &str, key: Option<&str>) -> Decision {
    evaluate_item(statements, action, resource, Item { key, attributes: None })
}

/// [`evaluate`] for a request on one item. A statement with a `dynamodb:Attributes` condition
/// allows only requests that name the attributes they read, every one of them allowed (stricter
/// than IAM for a request that names none, as for keys).
pub fn evaluate_item(statements: &[Statement], action: &str, resource: &str, item: Item<'_>) -> Decision {
    let keyed = |s: &Statement| match (&s.leading_keys, item.key) {
        (None, _) => true,
        (Some(pats), Some(k)) => pats.iter().any(|p| glob(p, k, false)),
        (Some(_), None) => false,
    };
    let read = |s: &Statement| match (&s.attributes, item.attributes) {
        (None, _) => true,
        (Some(allowed), Some(asked)) => asked.iter().all(|a| allowed.contains(a)),
        (Some(_), None) => false,
    };
    let hit =
        |s: &&Statement| s.actions.matches(action, true) && s.resources.matches(resource, false) && keyed(s) && read(s);
    if let Some(d) = statements.iter().filter(|s| s.effect == Effect::Deny).find(hit) {
        return Decision::ExplicitDeny(d.id.clone());
    }
    let by: Vec<String> =
        statements.iter().filter(|s| s.effect == Effect::Allow).filter(hit).map(|s| s.id.clone()).collect();
    if by.is_empty() {
        Decision::ImplicitDeny
    } else {
        Decision::Allowed(by)
    }
}

/// Where a call comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// Recorded from the function's own SDK clients.
    Code,
    /// The SQS event source mapping, polling the trigger queue with the function's role.
    EventSource,
    /// Lambda writing the function's log group.
    Logs,
    /// Lambda sending the function's trace segments (active tracing).
    Tracing,
    /// SNS encrypting a message the function published to a KMS-encrypted topic.
    TopicKey,
}

/// One request to evaluate: an action on a resource, made with a role, how many times.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub action: String,
    pub resource: String,
    pub origin: Origin,
    /// The class of the item key a single-item table request names (see
    /// [`sas_core::aws_calls::key_class`]).
    pub key: Option<String>,
    /// The attributes a table request reads, when it names them.
    pub attributes: Option<Vec<String>>,
}

impl Request {
    /// A call made by code, on a resource, naming no item key or attributes.
    pub fn code(action: &str, resource: &str) -> Request {
        Request { action: action.into(), resource: resource.into(), origin: Origin::Code, key: None, attributes: None }
    }
}

/// One grant: an action pattern on a resource pattern of an Allow statement (a `NotAction` or
/// `NotResource` statement is one grant as a whole).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub statement: String,
    pub action: String,
    pub resource: String,
}

fn grants(statements: &[Statement]) -> Vec<(Grant, Statement)> {
    let mut out = Vec::new();
    for s in statements.iter().filter(|s| s.effect == Effect::Allow) {
        match (&s.actions, &s.resources) {
            (Patterns::Only(acts), Patterns::Only(ress)) => {
                for a in acts {
                    for r in ress {
                        let one = Statement {
                            id: s.id.clone(),
                            effect: Effect::Allow,
                            actions: Patterns::Only(vec![a.clone()]),
                            resources: Patterns::Only(vec![r.clone()]),
                            leading_keys: s.leading_keys.clone(),
                            attributes: s.attributes.clone(),
                        };
                        out.push((Grant { statement: s.id.clone(), action: a.clone(), resource: r.clone() }, one));
                    }
                }
            }
            _ => out.push((
                Grant { statement: s.id.clone(), action: "(whole statement)".into(), resource: String::new() },
                s.clone(),
            )),
        }
    }
    out
}

/// The verdict for one role.
#[derive(Debug, Clone, Default)]
pub struct RoleReport {
    pub function: String,
    pub role: String,
    /// Every distinct request with how often it was made and the decision.
    pub requests: Vec<(Request, usize, Decision)>,
    /// Grants no allowed request matched.
    pub unused: Vec<Grant>,
}

impl RoleReport {
    pub fn denied(&self) -> impl Iterator<Item = &(Request, usize, Decision)> {
        self.requests.iter().filter(|(_, _, d)| !matches!(d, Decision::Allowed(_)))
    }
}

/// Evaluate `requests` (with counts) against one role's statements.
pub fn check_role(
    function: &str,
    role: &str,
    statements: &[Statement],
    requests: &BTreeMap<Request, usize>,
) -> RoleReport {
    let mut used = BTreeSet::new();
    let all = grants(statements);
    let mut out = Vec::new();
    for (r, n) in requests {
        let item = Item { key: r.key.as_deref(), attributes: r.attributes.as_deref() };
        let d = evaluate_item(statements, &r.action, &r.resource, item);
        if matches!(d, Decision::Allowed(_)) {
            for (g, one) in &all {
                if matches!(
                    evaluate_item(std::slice::from_ref(one), &r.action, &r.resource, item),
                    Decision::Allowed(_)
                ) {
                    used.insert(g.clone());
                }
            }
        }
        out.push((r.clone(), *n, d));
    }
    let unused = all.into_iter().map(|(g, _)| g).filter(|g| !used.contains(g)).collect();
    RoleReport { function: function.to_owned(), role: role.to_owned(), requests: out, unused }
}

/// The whole check's verdict.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub stack: String,
    pub roles: Vec<RoleReport>,
}

impl Report {
    pub fn denied_count(&self) -> usize {
        self.roles.iter().map(|r| r.denied().count()).sum()
    }

    /// `(function, grant)` for every grant no call used.
    pub fn unused(&self) -> Vec<(String, Grant)> {
        self.roles.iter().flat_map(|r| r.unused.iter().map(|g| (r.function.clone(), g.clone()))).collect()
    }

    /// What a person reads: every request with its verdict, then the unused grants.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "least privilege, stack {}", self.stack);
        for r in &self.roles {
            let calls: usize = r.requests.iter().map(|(_, n, _)| n).sum();
            let _ = writeln!(
                s,
                "  {} (role {}): {} distinct requests, {calls} calls",
                r.function,
                r.role,
                r.requests.len()
            );
            for (q, n, d) in &r.requests {
                let verdict = match d {
                    Decision::Allowed(by) => format!("allowed by {}", by.join(", ")),
                    Decision::ImplicitDeny => "DENIED: no statement allows it".to_owned(),
                    Decision::ExplicitDeny(by) => format!("DENIED by {by}"),
                };
                let _ = writeln!(
                    s,
                    "    {:<5} {} on {}{}{} ({:?}, {n}x): {verdict}",
                    if matches!(d, Decision::Allowed(_)) { "ok" } else { "FAIL" },
                    q.action,
                    q.resource,
                    q.key.as_ref().map(|k| format!(" key {k}")).unwrap_or_default(),
                    q.attributes.as_ref().map(|a| format!(" reading {}", a.join(", "))).unwrap_or_default(),
                    q.origin
                );
            }
        }
        let unused = self.unused();
        let _ = writeln!(s, "  denied: {}", self.denied_count());
        let _ = writeln!(s, "  grants never used: {}", unused.len());
        for (f, g) in unused {
            let _ = writeln!(s, "    {f}: {} {} on {}", g.statement, g.action, g.resource);
        }
        s
    }
}

/// A policy document as IAM returns it: JSON, URL-encoded on AWS (LocalStack: either).
pub fn decode_document(text: &str) -> Result<Value> {
    let trimmed = text.trim_start();
    let json = if trimmed.starts_with('{') {
        trimmed.to_owned()
    } else {
        percent_encoding::percent_decode_str(trimmed)
            .decode_utf8()
            .context("policy document is not UTF-8")?
            .into_owned()
    };
    serde_json::from_str(&json).context("policy document is not JSON")
}

/// The statements of every policy of a role: its inline policies and its attached managed ones.
pub async fn role_statements(iam: &aws_sdk_iam::Client, role: &str) -> Result<Vec<Statement>> {
    let mut out = Vec::new();
    let inline = iam.list_role_policies().role_name(role).send().await.map_err(aws_sdk_iam::Error::from)?;
    for name in inline.policy_names() {
        let p =
            iam.get_role_policy().role_name(role).policy_name(name).send().await.map_err(aws_sdk_iam::Error::from)?;
        out.extend(parse_policy(name, &decode_document(p.policy_document())?)?);
    }
    let attached = iam.list_attached_role_policies().role_name(role).send().await.map_err(aws_sdk_iam::Error::from)?;
    for a in attached.attached_policies() {
        let arn = a.policy_arn().context("attached policy without an ARN")?;
        let p = iam.get_policy().policy_arn(arn).send().await.map_err(aws_sdk_iam::Error::from)?;
        let version =
            p.policy().and_then(|p| p.default_version_id()).context("managed policy without a default version")?;
        let v = iam
            .get_policy_version()
            .policy_arn(arn)
            .version_id(version)
            .send()
            .await
            .map_err(aws_sdk_iam::Error::from)?;
        let doc = v.policy_version().and_then(|v| v.document()).context("policy version without a document")?;
        out.extend(parse_policy(a.policy_name().unwrap_or(arn), &decode_document(doc)?)?);
    }
    Ok(out)
}

/// A deployed function as the check sees it.
#[derive(Debug, Clone)]
pub struct DeployedFunction {
    pub logical_id: String,
    pub name: String,
    pub role: String,
    pub log_group: String,
    /// The ARNs of its SQS event sources.
    pub queues: Vec<String>,
    /// Active tracing: Lambda sends its segments to X-Ray with the function's role.
    pub tracing: bool,
}

/// The calls the platform makes with the function's role: the event source's polling of each
/// trigger queue (`ReceiveMessage`, `DeleteMessage`, `GetQueueAttributes`, as AWS's
/// `AWSLambdaSQSQueueExecutionRole` grants), the log group's writes, the trace segments of a
/// function with active tracing, and for every KMS-encrypted
/// topic the function published to, the key's `GenerateDataKey` and `Decrypt`.
pub fn platform_requests(
    f: &DeployedFunction,
    region: &str,
    account: &str,
    topic_keys: &BTreeMap<String, String>,
    code: &BTreeMap<Request, usize>,
) -> Vec<Request> {
    let mut out = Vec::new();
    for q in &f.queues {
        for action in ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"] {
            out.push(Request {
                action: action.into(),
                resource: q.clone(),
                origin: Origin::EventSource,
                key: None,
                attributes: None,
            });
        }
    }
    let stream = format!(
        "arn:{}:logs:{region}:{account}:log-group:{}:log-stream:2026/01/01/[$LATEST]0123456789abcdef",
        partition(region),
        f.log_group
    );
    for action in ["logs:CreateLogStream", "logs:PutLogEvents"] {
        out.push(Request {
            action: action.into(),
            resource: stream.clone(),
            origin: Origin::Logs,
            key: None,
            attributes: None,
        });
    }
    if f.tracing {
        // X-Ray takes no resource-level permissions: "*" is the only resource it evaluates.
        for action in ["xray:PutTraceSegments", "xray:PutTelemetryRecords"] {
            out.push(Request {
                action: action.into(),
                resource: "*".into(),
                origin: Origin::Tracing,
                key: None,
                attributes: None,
            });
        }
    }
    for r in code.keys().filter(|r| r.action == "sns:Publish") {
        if let Some(key) = topic_keys.get(&r.resource) {
            for action in ["kms:GenerateDataKey", "kms:Decrypt"] {
                out.push(Request {
                    action: action.into(),
                    resource: key.clone(),
                    origin: Origin::TopicKey,
                    key: None,
                    attributes: None,
                });
            }
        }
    }
    out
}

/// A key ID or ARN as the ARN IAM evaluates (an alias cannot be resolved here: an error).
pub fn key_arn(key: &str, region: &str, account: &str) -> Result<String> {
    if key.starts_with("arn:") && key.contains(":key/") {
        return Ok(key.to_owned());
    }
    if key.starts_with("alias/") || key.contains(":alias/") {
        bail!("topic key {key} is an alias: name the key itself");
    }
    Ok(format!("arn:{}:kms:{region}:{account}:key/{key}", partition(region)))
}

/// Region and account from a stack ARN (`arn:aws:cloudformation:<region>:<account>:stack/...`).
fn region_account(stack_arn: &str) -> Result<(String, String)> {
    let parts: Vec<&str> = stack_arn.split(':').collect();
    if parts.len() < 6 {
        bail!("not a stack ARN: {stack_arn}");
    }
    Ok((parts[3].to_owned(), parts[4].to_owned()))
}

/// Check a deployed stack: its functions' roles against `calls` (those of its functions; a call
/// of a function not in the stack is an error) and the platform's calls.
/// The requests IAM evaluates for recorded calls (`account`: the caller's), each with how many
/// times it was made.
pub fn requests_of(calls: &[AwsCall], account: &str) -> Result<BTreeMap<Request, usize>> {
    let mut code: BTreeMap<Request, usize> = BTreeMap::new();
    for c in calls {
        for resource in c.resources(account)? {
            let (key, attributes) = (c.leading_key(), c.attributes());
            let r = Request { action: c.action.clone(), resource, origin: Origin::Code, key, attributes };
            *code.entry(r).or_default() += 1;
        }
    }
    Ok(code)
}

/// The statements of a customer managed policy's default version, as IAM stores them.
pub async fn managed_policy(iam: &aws_sdk_iam::Client, arn: &str) -> Result<Vec<Statement>> {
    let p = iam.get_policy().policy_arn(arn).send().await.map_err(aws_sdk_iam::Error::from)?;
    let version = p.policy().and_then(|p| p.default_version_id()).context("a policy without a default version")?;
    let v =
        iam.get_policy_version().policy_arn(arn).version_id(version).send().await.map_err(aws_sdk_iam::Error::from)?;
    let doc = v.policy_version().and_then(|v| v.document()).context("a policy version without a document")?;
    let name = arn.rsplit('/').next().unwrap_or(arn);
    Ok(parse_policy(name, &decode_document(doc)?)?)
}

pub async fn check_stack(sdk: &aws_config::SdkConfig, stack: &str, calls: &[AwsCall]) -> Result<Report> {
    let cfn = aws_sdk_cloudformation::Client::new(sdk);
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let iam = aws_sdk_iam::Client::new(sdk);
    let sns = aws_sdk_sns::Client::new(sdk);
    let described =
        cfn.describe_stacks().stack_name(stack).send().await.map_err(aws_sdk_cloudformation::Error::from)?;
    let stack_arn = described.stacks().first().and_then(|s| s.stack_id()).context("stack without an ID")?;
    // what the event sources invoke: each function, or its alias with GradualDeploy=true
    let outputs: HashMap<String, String> = described
        .stacks()
        .first()
        .map(|s| {
            s.outputs()
                .iter()
                .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let qualifier = crate::lambda::invoked_qualifier(&outputs);
    let (region, account) = region_account(stack_arn)?;
    let resources =
        cfn.describe_stack_resources().stack_name(stack).send().await.map_err(aws_sdk_cloudformation::Error::from)?;
    let mut functions = Vec::new();
    for r in resources.stack_resources() {
        if r.resource_type() != Some("AWS::Lambda::Function") {
            continue;
        }
        let (Some(logical), Some(name)) = (r.logical_resource_id(), r.physical_resource_id()) else { continue };
        let conf = lambda
            .get_function_configuration()
            .function_name(name)
            .send()
            .await
            .map_err(aws_sdk_lambda::Error::from)?;
        let role_arn = conf.role().context("function without a role")?;
        let role = role_arn.rsplit('/').next().unwrap_or(role_arn).to_owned();
        let log_group = conf
            .logging_config()
            .and_then(|l| l.log_group())
            .map_or_else(|| format!("/aws/lambda/{name}"), str::to_owned);
        let esms = lambda
            .list_event_source_mappings()
            .function_name(crate::lambda::invoked_name(name, qualifier))
            .send()
            .await
            .map_err(aws_sdk_lambda::Error::from)?;
        let queues = esms
            .event_source_mappings()
            .iter()
            .filter_map(|m| m.event_source_arn())
            .filter(|a| a.contains(":sqs:"))
            .map(str::to_owned)
            .collect();
        functions.push(DeployedFunction {
            logical_id: logical.to_owned(),
            name: name.to_owned(),
            role,
            log_group,
            queues,
            tracing: conf.tracing_config().and_then(|t| t.mode()) == Some(&aws_sdk_lambda::types::TracingMode::Active),
        });
    }
    if functions.is_empty() {
        bail!("stack {stack} has no functions (deployed with DeployFunctions=false?)");
    }
    functions.sort_by(|a, b| a.logical_id.cmp(&b.logical_id));
    if let Some(c) = calls.iter().find(|c| !functions.iter().any(|f| f.name == c.function)) {
        bail!("a call of {}, which is not a function of stack {stack}: {c:?}", c.function);
    }
    let mut topic_keys = BTreeMap::new();
    let mut report = Report { stack: stack.to_owned(), roles: Vec::new() };
    for f in &functions {
        let mine: Vec<AwsCall> = calls.iter().filter(|c| c.function == f.name).cloned().collect();
        let code = requests_of(&mine, &account)?;
        for r in code.keys().filter(|r| r.action == "sns:Publish") {
            if topic_keys.contains_key(&r.resource) {
                continue;
            }
            let attrs =
                sns.get_topic_attributes().topic_arn(&r.resource).send().await.map_err(aws_sdk_sns::Error::from)?;
            if let Some(k) = attrs.attributes().and_then(|a| a.get("KmsMasterKeyId")).filter(|k| !k.is_empty()) {
                topic_keys.insert(r.resource.clone(), key_arn(k, &region, &account)?);
            }
        }
        let mut all = code.clone();
        for p in platform_requests(f, &region, &account, &topic_keys, &code) {
            *all.entry(p).or_default() += 1;
        }
        let statements =
            role_statements(&iam, &f.role).await.with_context(|| format!("the policies of role {}", f.role))?;
        report.roles.push(check_role(&f.logical_id, &f.role, &statements, &all));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globs_match_as_iam_does() {
        assert!(glob("kms:GenerateDataKey*", "kms:GenerateDataKey", true));
        assert!(glob("SQS:sendmessage", "sqs:SendMessage", true));
        assert!(!glob("arn:aws:sqs:r:1:Q", "arn:aws:sqs:r:1:q", false));
        assert!(glob("arn:aws:sqs:r:1:orders-replies-*", "arn:aws:sqs:r:1:orders-replies-a.fifo", false));
        assert!(!glob("arn:aws:sqs:r:1:orders-replies-*", "arn:aws:sqs:r:1:orders-other", false));
        assert!(glob("arn:aws:logs:r:1:log-group:g:*", "arn:aws:logs:r:1:log-group:g:log-stream:x", false));
        assert!(glob("a?c", "abc", false) && !glob("a?c", "ac", false));
        assert!(glob("*", "", false) && glob("*a*b", "xxaxxb", false) && !glob("*a*b", "xxaxxbc", false));
    }

    fn doc(statements: &Value) -> Vec<Statement> {
        parse_policy("p", &json!({"Version": "2012-10-17", "Statement": statements})).unwrap()
    }

    #[test]
    fn deny_wins_and_nothing_is_allowed_by_default() {
        let s = doc(&json!([
            {"Sid": "Send", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:r:1:*"},
            {"Sid": "NotDlq", "Effect": "Deny", "Action": "sqs:*", "Resource": "arn:aws:sqs:r:1:dlq"}
        ]));
        assert_eq!(evaluate(&s, "sqs:SendMessage", "arn:aws:sqs:r:1:q"), Decision::Allowed(vec!["p/Send".into()]));
        assert_eq!(evaluate(&s, "sqs:SendMessage", "arn:aws:sqs:r:1:dlq"), Decision::ExplicitDeny("p/NotDlq".into()));
        assert_eq!(evaluate(&s, "sqs:ReceiveMessage", "arn:aws:sqs:r:1:q"), Decision::ImplicitDeny);
        let not = doc(&json!({"Effect": "Allow", "NotAction": "iam:*", "NotResource": ["arn:aws:sqs:r:1:dlq"]}));
        assert!(matches!(evaluate(&not, "sqs:SendMessage", "arn:aws:sqs:r:1:q"), Decision::Allowed(_)));
        assert_eq!(evaluate(&not, "iam:PassRole", "arn:aws:sqs:r:1:q"), Decision::ImplicitDeny);
        assert_eq!(evaluate(&not, "sqs:SendMessage", "arn:aws:sqs:r:1:dlq"), Decision::ImplicitDeny);
    }

    #[test]
    fn a_leading_keys_condition_allows_only_the_keys_it_names() {
        let s = doc(&json!([{"Sid": "Limits", "Effect": "Allow",
            "Action": ["dynamodb:UpdateItem", "dynamodb:PutItem"], "Resource": "arn:aws:dynamodb:r:1:table/t",
            "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["limit:*"]}}}]));
        let t = "arn:aws:dynamodb:r:1:table/t";
        assert!(matches!(evaluate_keyed(&s, "dynamodb:UpdateItem", t, Some("limit:…")), Decision::Allowed(_)));
        assert_eq!(evaluate_keyed(&s, "dynamodb:UpdateItem", t, Some("<task id>")), Decision::ImplicitDeny);
        assert_eq!(evaluate_keyed(&s, "dynamodb:PutItem", t, Some("history:…")), Decision::ImplicitDeny);
        // stricter than IAM: a request without a key is not let through by the condition
        assert_eq!(evaluate(&s, "dynamodb:UpdateItem", t), Decision::ImplicitDeny);
        let other = json!({"Statement": [{"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*",
            "Condition": {"ForAnyValue:StringLike": {"dynamodb:LeadingKeys": ["limit:*"]}}}]});
        assert!(parse_policy("p", &other).unwrap_err().to_string().contains("not evaluated"));
    }

    /// The Agent function's check before a call: a consistent read of a task's `LockedBy`, and of
    /// nothing else (template.yaml, Sid `AgentFence`).
    #[test]
    fn an_attributes_condition_allows_only_requests_that_read_those_attributes() {
        let s = doc(&json!([{"Sid": "AgentFence", "Effect": "Allow", "Action": "dynamodb:GetItem",
            "Resource": "arn:aws:dynamodb:r:1:table/t",
            "Condition": {"ForAllValues:StringEquals": {"dynamodb:Attributes": ["TaskId", "LockedBy"]},
                          "StringEqualsIfExists": {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"}}}]));
        let t = "arn:aws:dynamodb:r:1:table/t";
        let get = |attributes: Option<&[String]>| {
            evaluate_item(&s, "dynamodb:GetItem", t, Item { key: Some("<task id>"), attributes })
        };
        let fence = ["LockedBy".to_owned(), "TaskId".to_owned()];
        assert_eq!(get(Some(&fence)), Decision::Allowed(vec!["p/AgentFence".into()]));
        assert_eq!(get(Some(&fence[..1])), Decision::Allowed(vec!["p/AgentFence".into()]));
        assert_eq!(
            get(Some(&["Input".to_owned(), "LockedBy".to_owned()])),
            Decision::ImplicitDeny,
            "one attribute more"
        );
        assert_eq!(get(None), Decision::ImplicitDeny, "a read of the whole item");
        // the attributes alone would let a read of the whole item through IAM: refused
        let alone = json!({"Statement": [{"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*",
            "Condition": {"ForAllValues:StringEquals": {"dynamodb:Attributes": ["LockedBy"]}}}]});
        assert!(parse_policy("p", &alone).unwrap_err().to_string().contains("not evaluated"));
    }

    #[test]
    fn conditions_and_unknown_keys_are_errors_not_ignored() {
        let cond = json!({"Statement": [{"Effect": "Allow", "Action": "sns:Publish", "Resource": "*",
                                         "Condition": {"StringEquals": {"aws:SourceAccount": "1"}}}]});
        let e = parse_policy("p", &cond).unwrap_err();
        assert!(e.to_string().contains("is not evaluated by this check"), "{e}");
        let both = json!({"Statement": {"Effect": "Allow", "Action": "a:b", "NotAction": "a:c", "Resource": "*"}});
        assert!(parse_policy("p", &both).is_err());
        assert!(
            parse_policy("p", &json!({"Statement": [{"Effect": "Maybe", "Action": "a:b", "Resource": "*"}]})).is_err()
        );
    }

    fn req(action: &str, resource: &str) -> Request {
        Request { action: action.into(), resource: resource.into(), origin: Origin::Code, key: None, attributes: None }
    }

    /// Submitter statements that reach the agent queue only through the reply wildcard: once it
    /// is narrowed to a pattern, the first dispatch to the agent queue is denied.
    #[test]
    fn a_missing_grant_fails_the_check_and_an_extra_one_is_reported() {
        let before = doc(&json!([
            {"Sid": "Queues", "Effect": "Allow", "Action": "sqs:SendMessage",
             "Resource": ["arn:aws:sqs:r:1:s-SchedulerQueue", "arn:aws:sqs:r:1:s-SubmissionDLQ"]},
            {"Sid": "ReplyQueues", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:r:1:replies-*"},
            {"Sid": "TaskTable", "Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"],
             "Resource": "arn:aws:dynamodb:r:1:table/t"}
        ]));
        let requests: BTreeMap<Request, usize> = [
            (req("sqs:SendMessage", "arn:aws:sqs:r:1:s-AgentQueue"), 2),
            (req("sqs:SendMessage", "arn:aws:sqs:r:1:replies-a"), 1),
            (req("dynamodb:PutItem", "arn:aws:dynamodb:r:1:table/t"), 2),
            (req("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/t"), 1),
        ]
        .into();
        let r = check_role("SubmitterFunction", "role", &before, &requests);
        let denied: Vec<&str> = r.denied().map(|(q, _, _)| q.resource.as_str()).collect();
        assert_eq!(denied, vec!["arn:aws:sqs:r:1:s-AgentQueue"]);
        let unused: Vec<(&str, &str)> = r.unused.iter().map(|g| (g.action.as_str(), g.resource.as_str())).collect();
        assert_eq!(
            unused,
            vec![
                ("sqs:SendMessage", "arn:aws:sqs:r:1:s-SchedulerQueue"),
                ("sqs:SendMessage", "arn:aws:sqs:r:1:s-SubmissionDLQ"),
                ("dynamodb:UpdateItem", "arn:aws:dynamodb:r:1:table/t"),
            ]
        );
        let report = Report { stack: "s".into(), roles: vec![r] };
        assert_eq!(report.denied_count(), 1);
        assert!(
            report.render().contains("FAIL  sqs:SendMessage on arn:aws:sqs:r:1:s-AgentQueue"),
            "{}",
            report.render()
        );
    }

    #[test]
    fn the_platform_polls_the_trigger_writes_logs_and_uses_the_topic_key() {
        let f = DeployedFunction {
            logical_id: "SchedulerFunction".into(),
            name: "s-SchedulerFunction-x".into(),
            role: "s-SchedulerRole-x".into(),
            log_group: "s-SchedulerLogGroup-x".into(),
            tracing: false,
            queues: vec!["arn:aws:sqs:r:1:s-SchedulerQueue".into()],
        };
        let code: BTreeMap<Request, usize> = [(req("sns:Publish", "arn:aws:sns:r:1:alerts"), 1)].into();
        let keys: BTreeMap<String, String> =
            [("arn:aws:sns:r:1:alerts".to_owned(), "arn:aws:kms:r:1:key/k".to_owned())].into();
        let p = platform_requests(&f, "r", "1", &keys, &code);
        let actions: Vec<(&str, &str)> = p.iter().map(|r| (r.action.as_str(), r.resource.as_str())).collect();
        assert_eq!(
            actions[..3].iter().map(|a| a.0).collect::<Vec<_>>(),
            ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"]
        );
        assert!(actions[3].1.starts_with("arn:aws:logs:r:1:log-group:s-SchedulerLogGroup-x:log-stream:"));
        assert_eq!(
            &actions[5..],
            &[("kms:GenerateDataKey", "arn:aws:kms:r:1:key/k"), ("kms:Decrypt", "arn:aws:kms:r:1:key/k")]
        );
        assert_eq!(key_arn("k", "r", "1").unwrap(), "arn:aws:kms:r:1:key/k");
        assert!(key_arn("alias/aws/sns", "r", "1").is_err());
    }

    #[test]
    fn policy_documents_come_url_encoded_or_plain() {
        let plain = decode_document(r#"{"Statement": []}"#).unwrap();
        let encoded = decode_document("%7B%22Statement%22%3A%20%5B%5D%7D").unwrap();
        assert_eq!(plain, encoded);
    }
}
