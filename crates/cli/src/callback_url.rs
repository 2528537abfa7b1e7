//! A client of the Callback function's URL (`AuthType: AWS_IAM`): a `CallbackMessage` POSTed
//! with a SigV4 signature (service `lambda`) made from the SDK's credentials, answered with a
//! status code and the `CallbackReply` (or an error document; see `sas_functions::url`).
//!
//! On LocalStack the URL is `http://<id>.lambda-url.<region>.<LOCALSTACK_HOST>/`, a host name
//! nothing resolves here: when an endpoint is configured (`AWS_ENDPOINT_URL`), the URL's host is
//! resolved to the endpoint's address instead (the Host header, and so the signature and
//! LocalStack's routing, keep the URL's host).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use aws_credential_types::provider::ProvideCredentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use sas_protocol::messages::{CallbackMessage, CallbackReply};

/// What the URL answered (a 403 `{"Message": …}` comes from Lambda itself: no such URL, or the
/// signature or the caller's grant was refused).
#[derive(Debug, Clone, PartialEq)]
pub struct UrlAnswer {
    pub status: u16,
    /// The body as JSON (`Null` when it is not JSON; `raw` has it).
    pub body: serde_json::Value,
    pub raw: String,
}

impl UrlAnswer {
    /// The reply, when the body is one (statuses 200, 404, 409).
    pub fn reply(&self) -> Option<CallbackReply> {
        serde_json::from_value(self.body.clone()).ok()
    }
}

/// Signs and sends requests to one stack's callback URL.
#[derive(Debug, Clone)]
pub struct CallbackUrlClient {
    http: reqwest::Client,
    url: reqwest::Url,
    region: String,
    credentials: aws_credential_types::provider::SharedCredentialsProvider,
}

/// The address to reach a URL's host at when the SDK talks to an endpoint of its own
/// (LocalStack): that endpoint's, IPv4 first.
fn endpoint_address(endpoint: &str) -> Result<SocketAddr> {
    let e = reqwest::Url::parse(endpoint).with_context(|| format!("endpoint URL {endpoint}"))?;
    let host = e.host_str().context("an endpoint URL without a host")?;
    let port = e.port_or_known_default().unwrap_or(80);
    let mut addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().with_context(|| format!("resolving {host}:{port}"))?.collect();
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs.into_iter().next().with_context(|| format!("{host} resolves to no address"))
}

impl CallbackUrlClient {
    /// A client for `url` (the stack output `CallbackUrl`) with the SDK's credentials and region.
    pub fn new(sdk: &aws_config::SdkConfig, url: &str) -> Result<Self> {
        let url = reqwest::Url::parse(url).with_context(|| format!("callback URL {url}"))?;
        let host = url.host_str().context("a callback URL without a host")?.to_owned();
        let region = sdk.region().context("no AWS region configured")?.to_string();
        let credentials = sdk.credentials_provider().context("no AWS credentials configured")?;
        let mut b = reqwest::Client::builder().timeout(Duration::from_secs(30));
        if let Some(endpoint) = sdk.endpoint_url() {
            b = b.resolve(&host, endpoint_address(endpoint)?);
        }
        Ok(CallbackUrlClient { http: b.build().context("an HTTP client")?, url, region, credentials })
    }

    /// POST one answer.
    pub async fn answer(&self, msg: &CallbackMessage) -> Result<UrlAnswer> {
        self.post(&serde_json::to_string(msg).context("serialising the answer")?).await
    }

    /// POST `body` as it is (tests send malformed ones too), signed.
    pub async fn post(&self, body: &str) -> Result<UrlAnswer> {
        self.send("POST", body).await
    }

    /// Send a request with any method, signed.
    pub async fn send(&self, method: &str, body: &str) -> Result<UrlAnswer> {
        let creds = self.credentials.provide_credentials().await.context("AWS credentials")?;
        let identity = creds.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("lambda")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .context("SigV4 parameters")?
            .into();
        let headers = [("content-type", "application/json")];
        let signable = SignableRequest::new(
            method,
            self.url.as_str(),
            headers.iter().copied(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .context("a signable request")?;
        let (instructions, _signature) = sign(signable, &params).context("signing the request")?.into_parts();
        let mut req = http::Request::builder()
            .method(method)
            .uri(self.url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.as_bytes().to_vec())
            .context("building the request")?;
        instructions.apply_to_request_http1x(&mut req);
        let req = reqwest::Request::try_from(req).context("the request for reqwest")?;
        let resp = self.http.execute(req).await.with_context(|| format!("{method} {}", self.url))?;
        let status = resp.status().as_u16();
        let raw = resp.text().await.context("reading the response")?;
        let body = serde_json::from_str(&raw).unwrap_or(serde_json::Value::Null);
        Ok(UrlAnswer { status, body, raw })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_address_prefers_ipv4() {
        let a = endpoint_address("http://localhost:4566").unwrap();
        assert_eq!(a.port(), 4566);
        assert!(a.ip().is_loopback());
        assert_eq!(endpoint_address("http://127.0.0.1:4599/").unwrap(), "127.0.0.1:4599".parse().unwrap());
        assert!(endpoint_address("not a url").is_err());
    }
}
