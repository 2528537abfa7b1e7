//! The AWS API agent: one action of an AWS service, called with the Agent function's role, as
//! Step Functions' `arn:aws:states:::aws-sdk:SERVICE:ACTION` calls it.
//! `{"kind": "aws", "service": "dynamodb", "action": "putItem", "parameters": {"TableName":
//! "orders"}, "resources": ["arn:aws:dynamodb:*:*:table/orders"]}`.
//!
//! - **The request** is the action's parameters in the service's own names and shapes: the step's
//!   input (an object), with the configuration's `parameters` over it (the operator's: a step
//!   cannot change what they name, a table say). **The answer** is the step's output, as the
//!   service gives it.
//! - **Which services**: every service whose API speaks JSON 1.0 or 1.1 (151 of the 414 in AWS's
//!   published models, DynamoDB, SQS, Step Functions, EventBridge, Kinesis, Firehose, SSM,
//!   Secrets Manager, CloudWatch and its Logs, ECS, Glue, Athena, CodeBuild, Rekognition,
//!   Textract, Transcribe... among them), and 9 that speak REST-JSON (Lambda, Batch, Polly,
//!   Bedrock and its runtimes, EMR Serverless, EventBridge Scheduler: each member put in the path,
//!   the query, a header or the body as the model says). The table of services and their actions
//!   (`sas_protocol`'s `service_models.json`) is generated from botocore's models by
//!   `infra/gen_aws_services.py`; no SDK crate per service is linked. A service of another
//!   protocol (S3's REST-XML, SNS's query, another REST-JSON service) is refused when the agent
//!   is built, naming its protocol.
//! - **Signed** with SigV4 by `aws-sigv4` (the SDK's signer) with the function's credentials;
//!   sent to the SDK configuration's endpoint (`AWS_ENDPOINT_URL`: LocalStack) or the service's
//!   regional one.
//! - **Errors** are named as Step Functions names them, `<Service>.<Code>` with `Exception` at the
//!   end (`DynamoDb.ConditionalCheckFailedException`), the cause as its `(Service: ..., Status
//!   Code: ..., Request ID: ...)`; throttling, server errors and the services' retryable codes are
//!   transient, the rest of 4xx permanent ([`super::aws_error`]).
//! - **Shapes as Step Functions gives them**: the answer's members are cased as Step Functions'
//!   `aws-sdk` tasks give them (the AWS SDK for Java's: `Md5OfMessageBody`, DynamoDB's `Bool`),
//!   the keys of maps (a DynamoDB item's attribute names) kept; a JSON value given to a member that
//!   takes text (a message body, an execution's input) is sent as its JSON text.
//! - **Idempotency**: an action with a client token (`ClientToken`, `ClientRequestToken`... marked
//!   in the model) gets one derived from the step's idempotency key when the request has none, so
//!   a retried call applies once. Other actions apply again when retried (a `putItem` writes the
//!   same item again; a `sendMessage` sends another message): choose `retry` accordingly.

use std::borrow::Cow;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::http::sign::Signer;
use super::kind::{AgentConfigError, AgentKind, AwsConfigCell, BuildContext, Grant};
use super::runtime::{Agent, AgentError, Call};
use crate::aws_calls::CallRecorder;
pub use sas_protocol::service_models::{
    client_token, error_name, models_version, operation, services, Operation, ServiceModel,
};

/// The template parameter whose ARNs the Agent function's role may call the `aws` agents'
/// actions on.
pub const RESOURCES_PARAMETER: &str = "AgentAwsResources";
/// The template parameter listing the actions (`dynamodb:PutItem`) the `aws` agents call.
pub const ACTIONS_PARAMETER: &str = "AgentAwsActions";
/// The actions the template grants the Agent function on a resource of its own, named by one of
/// its variables: a call of that action on that very resource needs neither parameter (the shipped
/// `orders.announce` puts its events on the account's default bus).
pub const STACK_GRANTS: &[(&str, &str)] = &[("DEFAULT_EVENT_BUS_ARN", "events:PutEvents")];

/// `{"kind": "aws", "service": "...", "action": "...", "resources": [...]}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsKind {
    /// The service as Step Functions' `aws-sdk:SERVICE:ACTION` names it: botocore's service id in
    /// lower case without spaces (`dynamodb`, `sfn`, `secretsmanager`, `cloudwatchlogs`).
    pub service: String,
    /// The action, as Step Functions writes it (`putItem`) or as the API does (`PutItem`).
    pub action: String,
    /// Parameters of the operator's, over the step's input in every call (a step cannot change
    /// them): the table, queue or secret the agent reaches, say.
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// What the Agent function's role must let it call the action on: ARNs (`*` wildcards as
    /// IAM), or `*` for an action that names no resource. Granted by the template parameters
    /// `AgentAwsActions` and `AgentAwsResources`.
    pub resources: Vec<String>,
    /// The region called; default: the function's.
    #[serde(default)]
    pub region: Option<String>,
    /// Members of the answer that are JSON text, given parsed (as Step Functions' `.sync:2` gives
    /// an execution's `Input` and `Output`): names, or paths of names (`Item.stock.N`); one absent,
    /// or not JSON, is left as it is.
    #[serde(default)]
    pub parse_json: Vec<String>,
    /// For a callback step: the members of the request that carry its token (names, or paths of
    /// names: `Input.TaskToken`, `Item.token.S`), set to it in every call, as Step Functions'
    /// `$$.Task.Token` in a `.waitForTaskToken` task. The remote side answers with it on the
    /// callback queue, the callback URL or with `sasctl complete`.
    #[serde(default)]
    pub task_token: Vec<String>,
}

/// An error's code from a JSON protocol's answer: the query-compatible header (SQS), the
/// `x-amzn-ErrorType` header, or the body's `__type` (`com.amazon...#Code`) or `code`.
pub fn error_code(headers: &reqwest::header::HeaderMap, body: &Value) -> Option<String> {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let raw = header("x-amzn-query-error")
        .and_then(|q| q.split(';').next().map(str::to_owned))
        .or_else(|| header("x-amzn-errortype"))
        .or_else(|| body.get("__type").and_then(Value::as_str).map(str::to_owned))
        .or_else(|| body.get("code").and_then(Value::as_str).map(str::to_owned))?;
    // `aws.protocoltests#Code:http://...` and `Code:http://...` are `Code`
    let code = raw.rsplit('#').next().unwrap_or(&raw);
    let code = code.split(':').next().unwrap_or(code).trim();
    (!code.is_empty()).then(|| code.to_owned())
}

impl AgentKind for AwsKind {
    const KIND: &'static str = "aws";

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        let invalid = |message: String| AgentConfigError::Invalid { agent: name.to_owned(), message };
        let op = operation(&self.service, &self.action).map_err(invalid)?;
        check_resources(&self.resources).map_err(invalid)?;
        let signer = Signer::new(op.signing.clone(), self.region.clone(), cx.aws.clone());
        Ok(Arc::new(AwsApiAgent {
            op,
            parameters: self.parameters,
            region: self.region,
            aws: cx.aws.clone(),
            signer,
            http: cx.http.clone(),
            max_response_bytes: cx.max_response_bytes,
            recorder: CallRecorder::from_env(),
            parse_json: self.parse_json,
            task_token: self.task_token,
        }))
    }

    fn grants(&self) -> Vec<Grant> {
        let Ok(op) = operation(&self.service, &self.action) else { return Vec::new() };
        self.resources
            .iter()
            .map(|r| {
                let g = Grant::new(Cow::Owned(op.iam_action.clone()), r.clone(), RESOURCES_PARAMETER)
                    .with_action_parameter(ACTIONS_PARAMETER);
                match STACK_GRANTS.iter().find(|(_, action)| action.eq_ignore_ascii_case(&op.iam_action)) {
                    Some((variable, _)) => g.or_stack(variable),
                    None => g,
                }
            })
            .collect()
    }
}

fn check_resources(resources: &[String]) -> Result<(), String> {
    if resources.is_empty() {
        return Err("resources names what the action may reach (ARNs, or \"*\" for an action that names none)".into());
    }
    for r in resources {
        if r != "*" && !r.starts_with("arn:") {
            return Err(format!("resources: {r:?} is neither an ARN nor \"*\""));
        }
    }
    Ok(())
}

/// The agent of one configured action.
pub struct AwsApiAgent {
    op: Operation,
    parameters: Map<String, Value>,
    region: Option<String>,
    aws: AwsConfigCell,
    signer: Signer,
    http: reqwest::Client,
    max_response_bytes: usize,
    recorder: Option<CallRecorder>,
    parse_json: Vec<String>,
    task_token: Vec<String>,
}

/// `answer` with its members `members` (names, or paths of names: `Item.stock.N`) that are JSON
/// text parsed.
fn parse_members(mut answer: Value, members: &[String]) -> Value {
    for m in members {
        let at = m.split('.').try_fold(&mut answer, |v, name| v.get_mut(name));
        if let Some(v) = at {
            if let Some(parsed) = v.as_str().and_then(|t| serde_json::from_str::<Value>(t).ok()) {
                *v = parsed;
            }
        }
    }
    answer
}

/// `value` put at `path` (names joined by `.`) in `body`, the objects on the way made (a member
/// on the way that is not an object is replaced by one).
fn set_member(body: &mut Map<String, Value>, path: &str, value: Value) {
    let mut names = path.split('.');
    let Some(mut name) = names.next() else { return };
    let mut at = body;
    for next in names {
        let slot = at.entry(name.to_owned()).or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(inner) = slot else { return };
        at = inner;
        name = next;
    }
    at.insert(name.to_owned(), value);
}

impl std::fmt::Debug for AwsApiAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsApiAgent").field("op", &self.op).field("region", &self.region).finish_non_exhaustive()
    }
}

fn permanent(message: String) -> AgentError {
    AgentError::Permanent { message }
}

impl AwsApiAgent {
    /// The agent of `service:action` for another kind's own calls (the `s3_items` agent's reads
    /// and writes): no parameters of the operator's, answers up to `max_response_bytes`.
    pub(super) fn internal(
        service: &str,
        action: &str,
        region: Option<String>,
        cx: &BuildContext,
        max_response_bytes: usize,
    ) -> Result<Self, String> {
        let op = operation(service, action)?;
        let signer = Signer::new(op.signing.clone(), region.clone(), cx.aws.clone());
        Ok(AwsApiAgent {
            op,
            parameters: Map::new(),
            region,
            aws: cx.aws.clone(),
            signer,
            http: cx.http.clone(),
            max_response_bytes,
            recorder: CallRecorder::from_env(),
            parse_json: Vec::new(),
            task_token: Vec::new(),
        })
    }

    /// The request's body: the input's members with the configuration's over them, a callback
    /// step's token at `task_token`, and the client token where the action takes one and the
    /// request gives none.
    pub fn body(
        &self,
        input: &Value,
        idempotency_key: &str,
        callback: Option<&str>,
    ) -> Result<Map<String, Value>, AgentError> {
        let mut body = match input {
            Value::Object(o) => o.clone(),
            Value::Null => Map::new(),
            other => {
                return Err(permanent(format!(
                    "{}:{}: the step's input is the action's parameters, an object, not {}",
                    self.op.service,
                    self.op.name,
                    crate::ids::clip(&other.to_string(), 80)
                )))
            }
        };
        for (k, v) in &self.parameters {
            body.insert(k.clone(), v.clone());
        }
        if !self.task_token.is_empty() {
            let Some(token) = callback else {
                return Err(permanent(format!(
                    "{}:{}: task_token names where a callback step's token goes, and this step is not a callback step",
                    self.op.service, self.op.name
                )));
            };
            for path in &self.task_token {
                set_member(&mut body, path, Value::String(token.to_owned()));
            }
        }
        if let Some((member, most)) = &self.op.token {
            body.entry(member.clone()).or_insert_with(|| Value::String(client_token(idempotency_key, *most)));
        }
        self.op.request_as_api(&mut body);
        Ok(body)
    }

    async fn endpoint(&self) -> Result<(String, String), AgentError> {
        let sdk = self.aws.get().await;
        let Some(region) = self.region.clone().or_else(|| sdk.region().map(ToString::to_string)) else {
            return Err(permanent(format!(
                "calling {}:{}: no region (set region, or AWS_REGION for the function)",
                self.op.service, self.op.name
            )));
        };
        let url = if let Some(u) = sdk.endpoint_url() {
            u.trim_end_matches('/').to_owned() + "/"
        } else {
            let domain = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
            format!("https://{}.{region}.{domain}/", self.op.endpoint)
        };
        Ok((url, region))
    }

    async fn call_once(&self, call: Call<'_>) -> Result<Value, AgentError> {
        let token = call.request.callback.as_ref().map(|c| c.token.expose());
        let body = self.body(&call.request.input, call.request.idempotency_key.as_str(), token.as_deref())?;
        self.send(&body).await
    }

    /// The action called with `body` (the action's parameters, as the API names them): its
    /// answer, or its error named and classified.
    pub(super) async fn send(&self, body: &Map<String, Value>) -> Result<Value, AgentError> {
        let bytes = serde_json::to_vec(body).map_err(|e| permanent(format!("the request: {e}")))?;
        let (url, region) = self.endpoint().await?;
        let what = format!("{}:{}", self.op.service, self.op.name);
        let mut req = match self.op.rest_request(body) {
            // query (SNS, STS...): one form-encoded POST, Action and Version first
            None if self.op.query.is_some() => {
                let form = self.op.query_request(body).unwrap_or_else(|| Ok(String::new()));
                let form = form.map_err(|e| permanent(format!("{what}: {e}")))?;
                self.http
                    .post(&url)
                    .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded; charset=utf-8")
                    .body(form)
                    .build()
                    .map_err(|e| permanent(format!("{what}: {e}")))?
            }
            // REST-JSON: the model's method and path, members in the path, query and headers
            Some(rest) => {
                let rest = rest.map_err(|e| permanent(format!("{what}: {e}")))?;
                let method = reqwest::Method::from_bytes(rest.method.as_bytes())
                    .map_err(|e| permanent(format!("{what}: method {}: {e}", rest.method)))?;
                let mut b = self
                    .http
                    .request(method, format!("{}{}", url.trim_end_matches('/'), rest.path_and_query))
                    .header(reqwest::header::CONTENT_TYPE, "application/json");
                for (k, v) in &rest.headers {
                    b = b.header(k.as_str(), v.as_str());
                }
                b.body(rest.body).build().map_err(|e| permanent(format!("{what}: {e}")))?
            }
            None => self
                .http
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, format!("application/x-amz-json-{}", self.op.json_version))
                .header("x-amz-target", format!("{}.{}", self.op.target, self.op.name))
                .body(bytes.clone())
                .build()
                .map_err(|e| permanent(format!("{what}: {e}")))?,
        };
        self.signer.sign(&mut req).await?;
        if let Some(rec) = &self.recorder {
            // loud on purpose, as the SDK's recorder: a call missing from the log would pass the check
            rec.record_call(self.op.iam_action.clone(), Some(region), crate::aws_calls::target_of(&bytes))
                .map_err(|e| permanent(format!("{what}: AWS call log {}: {e}", rec.path().display())))?;
        }
        let resp = self.http.execute(req).await.map_err(|e| match crate::agent::http::transport_error(&e) {
            AgentError::Transient { message, retry_after } => {
                AgentError::Transient { message: format!("{what}: {message}"), retry_after }
            }
            other => other,
        })?;
        self.answer(resp).await
    }

    async fn answer(&self, mut resp: reqwest::Response) -> Result<Value, AgentError> {
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| AgentError::Transient {
            message: format!("{}:{}: reading the answer: {e}", self.op.service, self.op.name),
            retry_after: None,
        })? {
            buf.extend_from_slice(&chunk);
            if buf.len() > self.max_response_bytes {
                if status.is_success() {
                    // the action applied: its answer cannot be the step's output
                    return Err(permanent(format!(
                        "{}:{}: the answer is over max_response_bytes ({}): it cannot be the step's output \
                         (ask for less: a Limit, a ProjectionExpression)",
                        self.op.service, self.op.name, self.max_response_bytes
                    )));
                }
                break;
            }
        }
        if status.is_success() {
            if self.op.rest.is_some() {
                let pairs: Vec<(String, String)> = headers
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                    .collect();
                return Ok(self.op.rest_answer(status.as_u16(), &pairs, &buf));
            }
            if self.op.query.is_some() {
                return self
                    .op
                    .query_answer(&buf)
                    .map_err(|e| permanent(format!("{}:{}: {e}", self.op.service, self.op.name)));
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Object(Map::new()));
            }
            let answer: Value = serde_json::from_slice(&buf)
                .map_err(|e| permanent(format!("{}:{}: the answer is not JSON: {e}", self.op.service, self.op.name)))?;
            return Ok(self.op.answer_as_step_functions(answer));
        }
        let body: Value = serde_json::from_slice(&buf).unwrap_or(Value::Null);
        // a REST-XML service's error is XML (`<Error><Code>NoSuchKey</Code>...`); one without a
        // body (a HEAD's) is the service's own, as the AWS SDK names an error its model does not
        // (`S3.S3Exception`), its status the message
        let xml = std::str::from_utf8(&buf).ok().and_then(sas_protocol::xml_answer::error);
        let code = error_code(&headers, &body)
            .or_else(|| xml.as_ref().map(|(c, _)| c.clone()))
            .or_else(|| (buf.is_empty() && status.is_client_error()).then(|| self.op.error_prefix.clone()));
        let said = ["message", "Message", "errorMessage"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_str).map(str::to_owned))
            .or_else(|| xml.and_then(|(_, m)| m))
            .or_else(|| buf.is_empty().then(|| status.canonical_reason().unwrap_or("no body").to_owned()))
            .unwrap_or_else(|| crate::ids::clip(String::from_utf8_lossy(&buf).trim(), 300).to_owned());
        let request_id = headers
            .get("x-amzn-requestid")
            .or_else(|| headers.get("x-amz-request-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        let name = error_name(&self.op.error_prefix, code.as_deref().unwrap_or(&self.op.error_prefix));
        let message = format!(
            "{name}: {said} (Service: {}, Status Code: {}, Request ID: {request_id})",
            self.op.error_prefix,
            status.as_u16()
        );
        let transient = code
            .as_deref()
            .is_some_and(|c| super::aws_error::is_transient_code(c) || c.ends_with("ThrottlingException"));
        if transient || !super::aws_error::is_permanent(code.as_deref(), Some(status.as_u16())) {
            return Err(AgentError::Transient { message, retry_after: None });
        }
        Err(permanent(message))
    }
}

impl Agent for AwsApiAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(async move { self.call_once(call).await.map(|a| parse_members(a, &self.parse_json)) })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn members_named_to_parse_are_given_as_json_and_others_left_as_they_are() {
        let answer = json!({"Status": "SUCCEEDED", "Output": "{\"total\":3}", "Input": "not json", "Name": "{}"});
        let parsed = parse_members(answer, &["Output".into(), "Input".into(), "Missing".into()]);
        assert_eq!(parsed, json!({"Status": "SUCCEEDED", "Output": {"total": 3}, "Input": "not json", "Name": "{}"}));
        let item = json!({"Item": {"stock": {"N": "12"}, "doc": {"S": "[1,2]"}}});
        let parsed = parse_members(item, &["Item.stock.N".into(), "Item.doc.S".into(), "Item.none.S".into()]);
        assert_eq!(parsed, json!({"Item": {"stock": {"N": 12}, "doc": {"S": [1, 2]}}}));
    }

    #[test]
    fn errors_are_named_as_step_functions_names_them() {
        let mut h = reqwest::header::HeaderMap::new();
        let body = json!({"__type": "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException", "message": "no"});
        assert_eq!(error_code(&h, &body).as_deref(), Some("ResourceNotFoundException"));
        assert_eq!(
            error_code(&h, &json!({"__type": "ValidationException:http://internal"})).as_deref(),
            Some("ValidationException")
        );
        h.insert("x-amzn-query-error", "AWS.SimpleQueueService.NonExistentQueue;Sender".parse().unwrap());
        assert_eq!(error_code(&h, &body).as_deref(), Some("AWS.SimpleQueueService.NonExistentQueue"));
        assert_eq!(error_code(&reqwest::header::HeaderMap::new(), &json!({})), None);
    }

    #[test]
    fn a_configuration_is_checked_when_the_agent_is_built() {
        let agents = |spec: &str| format!(r#"{{"agents": {{"put": {spec}}}}}"#);
        let ok = agents(
            r#"{"kind": "aws", "service": "dynamodb", "action": "putItem", "parameters": {"TableName": "orders"}, "resources": ["arn:aws:dynamodb:*:*:table/orders"]}"#,
        );
        let rt = crate::agent::AgentRuntime::from_config(&ok, &|_| None).unwrap();
        assert!(rt.knows("put"));
        let s = crate::agent::survey(&ok, &|_| None).unwrap();
        assert_eq!((s[0].kind, s[0].callback_only), ("aws", false));
        assert_eq!(
            s[0].grants,
            vec![Grant::new("dynamodb:PutItem", "arn:aws:dynamodb:*:*:table/orders", RESOURCES_PARAMETER)
                .with_action_parameter(ACTIONS_PARAMETER)]
        );
        for (spec, says) in [
            (r#"{"kind": "aws", "service": "route53", "action": "listHostedZones", "resources": ["*"]}"#, "rest-xml"),
            (r#"{"kind": "aws", "service": "dynamodb", "action": "putItem", "resources": []}"#, "resources"),
            (
                r#"{"kind": "aws", "service": "dynamodb", "action": "putItem", "resources": ["orders"]}"#,
                "neither an ARN",
            ),
        ] {
            let e = crate::agent::AgentRuntime::from_config(&agents(spec), &|_| None).unwrap_err();
            assert!(
                matches!(&e, AgentConfigError::Invalid { agent, message } if agent == "put" && message.contains(says)),
                "{spec}: {e:?}"
            );
        }
        let missing = agents(r#"{"kind": "aws", "service": "dynamodb", "action": "putItem"}"#);
        assert!(matches!(crate::agent::AgentRuntime::from_config(&missing, &|_| None), Err(AgentConfigError::Json(_))));
    }

    /// An agent of `spec` that calls the loopback server at `url` (its endpoint), signing with
    /// fixed credentials for us-west-2.
    fn agent(spec: &Value, url: &str) -> Arc<dyn Agent> {
        let creds = aws_credential_types::Credentials::new("AKIDEXAMPLE", "secret", None, None, "test");
        let aws = AwsConfigCell::with(
            aws_config::SdkConfig::builder()
                .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(creds))
                .region(aws_config::Region::new("us-west-2"))
                .endpoint_url(url.trim_end_matches("/charge"))
                .behavior_version(aws_config::BehaviorVersion::latest())
                .build(),
        );
        let cx = BuildContext {
            http: crate::agent::http::client(),
            max_response_bytes: 1_000,
            callback: crate::agent::CallbackEndpoints::default(),
            aws,
        };
        let kind: AwsKind = serde_json::from_value(spec.clone()).unwrap();
        kind.build("a", &cx).unwrap()
    }

    async fn run(agent: &dyn Agent, input: Value) -> Result<Value, AgentError> {
        let task = crate::ids::TaskId::try_from("t-1").unwrap();
        let mut r = crate::messages::AgentRequest::first_attempt(
            task,
            "put",
            "a",
            json!({}),
            crate::ids::Millis::now().plus_ms(10_000),
        );
        // the step's parameters, as the Scheduler sends them
        r.input = input;
        agent.call(Call { request: &r, call_no: 1, deadline: r.complete_by }).await
    }

    #[tokio::test]
    async fn a_call_is_the_action_s_json_request_signed_for_its_service_with_the_operator_s_parameters_over_the_input()
    {
        use crate::agent::http::tests::{server, Seen};
        let (url, seen) = server(Arc::new(|_: &Seen| (200, r#"{"Attributes": {"n": {"N": "1"}}}"#.into()))).await;
        let put = agent(
            &json!({"service": "dynamodb", "action": "putItem", "parameters": {"TableName": "orders"}, "resources": ["*"]}),
            &url,
        );
        let out = run(put.as_ref(), json!({"TableName": "another", "Item": {"id": {"S": "o-1"}}})).await.unwrap();
        assert_eq!(out, json!({"Attributes": {"n": {"N": "1"}}}));
        let s = seen.lock().unwrap()[0].clone();
        assert_eq!(s.path, "/");
        assert_eq!(s.headers["x-amz-target"], "DynamoDB_20120810.PutItem");
        assert_eq!(s.headers["content-type"], "application/x-amz-json-1.0");
        assert!(s.headers["authorization"].starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), "{:?}", s.headers);
        assert!(s.headers["authorization"].contains("/us-west-2/dynamodb/aws4_request"), "{:?}", s.headers);
        let body: Value = serde_json::from_slice(&s.body).unwrap();
        // the operator's table, whatever the step sent
        assert_eq!(body, json!({"TableName": "orders", "Item": {"id": {"S": "o-1"}}}));
        // an action with a client token gets the step's, the same on every call
        let (url, seen) = server(Arc::new(|_: &Seen| (200, String::new()))).await;
        let tx = agent(&json!({"service": "dynamodb", "action": "TransactWriteItems", "resources": ["*"]}), &url);
        assert_eq!(run(tx.as_ref(), json!({"TransactItems": []})).await.unwrap(), json!({}));
        assert_eq!(run(tx.as_ref(), Value::Null).await.unwrap(), json!({}));
        let bodies: Vec<Value> =
            seen.lock().unwrap().iter().map(|s| serde_json::from_slice(&s.body).unwrap()).collect();
        let token = client_token("t-1:put", 36);
        assert_eq!(bodies[0]["ClientRequestToken"], json!(token));
        assert_eq!(bodies[1], json!({"ClientRequestToken": token}));
        // a token of the step's own is kept
        run(tx.as_ref(), json!({"ClientRequestToken": "mine"})).await.unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&seen.lock().unwrap()[2].body).unwrap()["ClientRequestToken"],
            "mine"
        );
    }

    #[tokio::test]
    async fn a_callback_step_s_token_is_put_where_the_definition_put_its_task_token() {
        use crate::agent::http::tests::{server, Seen};
        let (url, seen) =
            server(Arc::new(|_: &Seen| (200, r#"{"executionArn": "arn:x", "startDate": 1}"#.into()))).await;
        let start = agent(
            &json!({"service": "sfn", "action": "startExecution", "parameters": {"StateMachineArn": "arn:sm"},
                    "task_token": ["Input.TaskToken", "Input.deep.token"], "resources": ["*"]}),
            &url,
        );
        let task = crate::ids::TaskId::try_from("t-1").unwrap();
        let r = crate::messages::AgentRequest::first_attempt(
            task,
            "child",
            "a",
            json!({}),
            crate::ids::Millis::now().plus_ms(10_000),
        )
        .with_callback(None);
        let r = crate::messages::AgentRequest { input: json!({"Input": {"order": 7, "deep": 1}}), ..r };
        let token = r.callback.as_ref().unwrap().token.expose();
        start.call(Call { request: &r, call_no: 1, deadline: r.complete_by }).await.unwrap();
        let body: Value = serde_json::from_slice(&seen.lock().unwrap()[0].body).unwrap();
        // the input is sent as its JSON text (a text member), the token inside it
        let input: Value = serde_json::from_str(body["input"].as_str().unwrap()).unwrap();
        assert_eq!(input, json!({"order": 7, "TaskToken": token, "deep": {"token": token}}));
        assert_eq!(body["stateMachineArn"], "arn:sm");
        // not a callback step: said, not sent without its token
        let err = run(start.as_ref(), json!({"Input": {}})).await.unwrap_err();
        assert!(
            matches!(&err, AgentError::Permanent { message } if message.contains("not a callback step")),
            "{err:?}"
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn errors_carry_step_functions_names_and_are_transient_only_when_another_try_can_help() {
        use crate::agent::http::tests::{server, Seen};
        let (url, _) = server(Arc::new(|s: &Seen| {
            let body: Value = serde_json::from_slice(&s.body).unwrap();
            match body["Case"].as_str().unwrap_or_default() {
                "condition" => (400, r#"{"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException", "message": "The conditional request failed"}"#.into()),
                "capacity" => (400, r#"{"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException", "message": "slow down"}"#.into()),
                "throttled" => (400, r#"{"__type": "ThrottlingException", "message": "Rate exceeded"}"#.into()),
                "missing" => (400, r#"{"__type": "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException", "message": "no table"}"#.into()),
                "big" => (200, format!(r#"{{"Items": "{}"}}"#, "x".repeat(2_000))),
                _ => (500, r#"{"__type": "InternalServerError", "message": "oops"}"#.into()),
            }
        }))
        .await;
        let a = agent(&json!({"service": "dynamodb", "action": "putItem", "resources": ["*"]}), &url);
        let e = run(a.as_ref(), json!({"Case": "condition"})).await.unwrap_err();
        assert!(
            matches!(&e, AgentError::Permanent { message } if message.starts_with("DynamoDb.ConditionalCheckFailedException: The conditional request failed (Service: DynamoDb, Status Code: 400")),
            "{e:?}"
        );
        let e = run(a.as_ref(), json!({"Case": "missing"})).await.unwrap_err();
        assert!(
            matches!(&e, AgentError::Permanent { message } if message.starts_with("DynamoDb.ResourceNotFoundException")),
            "{e:?}"
        );
        for case in ["capacity", "throttled", "server"] {
            let e = run(a.as_ref(), json!({"Case": case})).await.unwrap_err();
            assert!(
                matches!(&e, AgentError::Transient { message, .. } if message.starts_with("DynamoDb.")),
                "{case}: {e:?}"
            );
        }
        // an answer over max_response_bytes: the action applied, its answer cannot be the output
        let e = run(a.as_ref(), json!({"Case": "big"})).await.unwrap_err();
        assert!(matches!(&e, AgentError::Permanent { message } if message.contains("max_response_bytes")), "{e:?}");
        // an input that is not an object is refused before any call
        let e = run(a.as_ref(), json!([1, 2])).await.unwrap_err();
        assert!(matches!(&e, AgentError::Permanent { message } if message.contains("an object")), "{e:?}");
    }
}
