//! Building AWS clients once per process. TLS is rustls with ring (no OpenSSL, no aws-lc).
//! Endpoints come from the environment: `AWS_ENDPOINT_URL` (or per service, e.g.
//! `AWS_ENDPOINT_URL_SQS`) points everything at LocalStack; without it, real AWS.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

pub async fn load_sdk_config() -> SdkConfig {
    let http = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    aws_config::defaults(BehaviorVersion::latest()).http_client(http).load().await
}

/// The SQS client of the roles: with the AWS call recorder when `SAS_AWS_CALL_LOG` is set
/// ([`crate::aws_calls`]).
pub fn sqs_client(sdk: &SdkConfig) -> aws_sdk_sqs::Client {
    let mut b = aws_sdk_sqs::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_sqs::Client::from_conf(b.build())
}

/// The SNS client of the roles (with the recorder when asked, as [`sqs_client`]).
pub fn sns_client(sdk: &SdkConfig) -> aws_sdk_sns::Client {
    let mut b = aws_sdk_sns::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_sns::Client::from_conf(b.build())
}

/// The DynamoDB client of the roles (with the recorder when asked, as [`sqs_client`]).
pub fn dynamodb_client(sdk: &SdkConfig) -> aws_sdk_dynamodb::Client {
    let mut b = aws_sdk_dynamodb::config::Builder::from(sdk);
    if let Some(r) = crate::aws_calls::CallRecorder::from_env() {
        b = b.interceptor(r);
    }
    aws_sdk_dynamodb::Client::from_conf(b.build())
}
