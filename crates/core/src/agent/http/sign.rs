//! SigV4 signing of an HTTP agent's requests (`"sign": {"service": "execute-api", "region":
//! "us-east-1"}`): API Gateway with IAM auth (`execute-api`), Lambda function URLs (`lambda`), or
//! any service that takes SigV4. The signature is made by `aws-sigv4` (the AWS SDK's signer) with
//! the function's credentials (the SDK configuration's provider), over the body's hash and every
//! header the agent sends (the signer leaves out only `user-agent` and the ones a proxy may change).

use std::time::SystemTime;

use aws_credential_types::provider::ProvideCredentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_types::error::display::DisplayErrorContext;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;

use crate::agent::kind::AwsConfigCell;
use crate::agent::runtime::AgentError;

/// `"sign"` as written.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignSpec {
    /// The signing name: `execute-api`, `lambda`, ...
    pub service: String,
    /// The region signed for; default: the function's (the AWS configuration's).
    #[serde(default)]
    pub region: Option<String>,
}

/// Signs requests for one service.
#[derive(Debug, Clone)]
pub struct Signer {
    service: String,
    region: Option<String>,
    aws: AwsConfigCell,
}

/// S3 signs its paths as sent (not normalised, encoded once) over the body's hash in
/// `x-amz-content-sha256`; every other service the default way.
fn settings(service: &str) -> SigningSettings {
    let mut s = SigningSettings::default();
    if service == "s3" {
        s.percent_encoding_mode = aws_sigv4::http_request::PercentEncodingMode::Single;
        s.payload_checksum_kind = aws_sigv4::http_request::PayloadChecksumKind::XAmzSha256;
        s.uri_path_normalization_mode = aws_sigv4::http_request::UriPathNormalizationMode::Disabled;
    }
    s
}

fn permanent(message: String) -> AgentError {
    AgentError::Permanent { message }
}

impl Signer {
    pub fn new(service: impl Into<String>, region: Option<String>, aws: AwsConfigCell) -> Self {
        Signer { service: service.into(), region, aws }
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    /// Add the signature (`authorization`, `x-amz-date`, and `x-amz-security-token` with session
    /// credentials) to `req`, whose body and headers are final. Credentials that cannot be had now
    /// are a transient error; a request that cannot be signed is a permanent one.
    pub async fn sign(&self, req: &mut reqwest::Request) -> Result<(), AgentError> {
        let sdk = self.aws.get().await;
        let Some(region) = self.region.clone().or_else(|| sdk.region().map(ToString::to_string)) else {
            return Err(permanent(format!(
                "signing for {}: no region (set sign.region, or AWS_REGION for the function)",
                self.service
            )));
        };
        let Some(provider) = sdk.credentials_provider() else {
            return Err(AgentError::Transient {
                message: format!("signing for {}: no AWS credentials provider", self.service),
                retry_after: None,
            });
        };
        let identity = provider
            .provide_credentials()
            .await
            .map_err(|e| AgentError::Transient {
                message: format!("signing for {}: AWS credentials: {}", self.service, DisplayErrorContext(&e)),
                retry_after: None,
            })?
            .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&region)
            .name(&self.service)
            .time(SystemTime::now())
            .settings(settings(&self.service))
            .build()
            .map_err(|e| permanent(format!("signing for {}: {e}", self.service)))?
            .into();
        let mut headers = Vec::with_capacity(req.headers().len());
        for (name, value) in req.headers() {
            let value = value
                .to_str()
                .map_err(|_| permanent(format!("signing for {}: header {name} is not visible ASCII", self.service)))?;
            headers.push((name.as_str(), value));
        }
        let body = req.body().and_then(reqwest::Body::as_bytes).unwrap_or_default();
        let signable = SignableRequest::new(
            req.method().as_str(),
            req.url().as_str(),
            headers.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| permanent(format!("signing for {}: {e}", self.service)))?;
        let (instructions, _signature) =
            sign(signable, &params).map_err(|e| permanent(format!("signing for {}: {e}", self.service)))?.into_parts();
        let (signed, query) = instructions.into_parts();
        debug_assert!(query.is_empty(), "header signing adds no query parameter");
        for h in signed {
            let mut value = HeaderValue::from_str(h.value())
                .map_err(|_| permanent(format!("signing for {}: header {} is not valid", self.service, h.name())))?;
            value.set_sensitive(h.sensitive() || h.name() == "authorization");
            let name = HeaderName::from_bytes(h.name().as_bytes())
                .map_err(|_| permanent(format!("signing for {}: header {} is not valid", self.service, h.name())))?;
            req.headers_mut().insert(name, value);
        }
        Ok(())
    }
}
