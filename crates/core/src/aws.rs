//! Building AWS clients once per process. TLS is rustls with ring (no OpenSSL, no aws-lc).
//! Endpoints come from the environment: `AWS_ENDPOINT_URL` (or per service, e.g.
//! `AWS_ENDPOINT_URL_SQS`) points everything at LocalStack; without it, real AWS.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

pub async fn load_sdk_config() -> SdkConfig {
    let http = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    aws_config::defaults(BehaviorVersion::latest()).http_client(http).load().await
}
