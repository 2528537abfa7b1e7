//! An independent SigV4 verifier (`SIGV4_VERIFY=ACCESS_KEY_ID:SECRET_ACCESS_KEY[:service]`), as API
//! Gateway with IAM auth or a Lambda function URL checks a request: the canonical request, the
//! string to sign, the HMAC-SHA256 key chain, the signature compared in constant time; the body's
//! hash, the credential scope and a clock skew of at most five minutes.
//!
//! It is written from the SigV4 specification with `hmac` and `sha2` (and `hex`,
//! `percent-encoding` and `time` for the encodings and the date), on purpose not with
//! `aws-sigv4` (which the agent signs with): a mistake in how the agent uses the signer (a header
//! left unsigned, the body hashed before it changed, the wrong service or region) shows here as a
//! 403 with the reason, as it would on AWS.
//!
//! Stricter than AWS on one point: every header of the request must be signed except the few a
//! client library or a proxy adds or changes (`user-agent`, `accept`, `accept-encoding`,
//! `content-length`, `connection`, `transfer-encoding`, `expect`, `x-amzn-trace-id`), so a header
//! the agent sends unsigned (an idempotency key, a secret header) is refused.

use std::fmt::{self, Write as _};

use axum::http::HeaderMap;
use hmac::{Hmac, KeyInit, Mac};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

/// The most a request's `x-amz-date` may differ from the server's clock, in seconds.
pub const MAX_SKEW_S: i64 = 300;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Headers that may be sent unsigned (added or changed on the way).
const UNSIGNED_OK: [&str; 9] = [
    "authorization",
    "user-agent",
    "accept",
    "accept-encoding",
    "content-length",
    "connection",
    "transfer-encoding",
    "expect",
    "x-amzn-trace-id",
];

type HmacSha256 = Hmac<Sha256>;

/// The credentials requests must be signed with, and the service they must be signed for.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    /// One key pair, or (empty id) a directory of them.
    access_key_id: String,
    secret_access_key: String,
    /// `dir:PATH`: each file `PATH/<access key id>` holds that key's secret (LocalStack's Lambda
    /// functions' role credentials, kept by the host executor: `HOST_LAMBDA_CREDENTIALS_DIR`).
    key_dir: Option<std::path::PathBuf>,
    service: Option<String>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("access_key_id", &self.access_key_id)
            .field("key_dir", &self.key_dir)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    pub fn new(
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        service: Option<String>,
    ) -> Self {
        Verifier {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            key_dir: None,
            service,
        }
    }

    /// Keys from a directory: `dir/<access key id>` holds its secret access key.
    pub fn with_key_dir(dir: impl Into<std::path::PathBuf>, service: Option<String>) -> Self {
        Verifier { access_key_id: String::new(), secret_access_key: String::new(), key_dir: Some(dir.into()), service }
    }

    /// The secret of `key_id`, if this verifier knows it.
    fn secret_of(&self, key_id: &str) -> Option<String> {
        match &self.key_dir {
            None => (key_id == self.access_key_id).then(|| self.secret_access_key.clone()),
            Some(dir) => {
                if key_id.is_empty() || !key_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    return None;
                }
                std::fs::read_to_string(dir.join(key_id)).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
            }
        }
    }

    /// `ACCESS_KEY_ID:SECRET_ACCESS_KEY[:service]` (a secret access key holds no `:`), or
    /// `dir:PATH[:service]` (see [`Verifier::with_key_dir`]).
    ///
    /// # Errors
    /// A part is missing or empty.
    pub fn parse(spec: &str) -> Result<Self, String> {
        if let Some(rest) = spec.strip_prefix("dir:") {
            let (path, service) = match rest.rsplit_once(':') {
                Some((p, svc)) if !svc.contains('/') => (p, Some(svc.to_owned()).filter(|s| !s.is_empty())),
                _ => (rest, None),
            };
            if path.is_empty() {
                return Err("SIGV4_VERIFY=dir:PATH[:service]: the directory is missing".into());
            }
            return Ok(Verifier::with_key_dir(path, service));
        }
        let mut parts = spec.splitn(3, ':');
        let (Some(id), Some(secret)) = (parts.next(), parts.next()) else {
            return Err("SIGV4_VERIFY is ACCESS_KEY_ID:SECRET_ACCESS_KEY[:service]".into());
        };
        if id.is_empty() || secret.is_empty() {
            return Err("SIGV4_VERIFY: the access key id and the secret access key must not be empty".into());
        }
        let service = parts.next().filter(|s| !s.is_empty()).map(str::to_owned);
        Ok(Verifier::new(id, secret, service))
    }

    /// Checks one request (`path_and_query` as received, percent-encoding kept) at `now_s` (epoch
    /// seconds).
    ///
    /// # Errors
    /// Why the request is refused (never a secret).
    pub fn verify(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
        now_s: i64,
    ) -> Result<(), String> {
        let auth = headers
            .get("authorization")
            .ok_or("missing Authorization header (SigV4 required)")?
            .to_str()
            .map_err(|_| "the Authorization header is not ASCII")?;
        let fields = auth
            .strip_prefix(ALGORITHM)
            .and_then(|rest| rest.strip_prefix(' '))
            .ok_or("the Authorization header is not AWS4-HMAC-SHA256")?;
        let (mut credential, mut signed, mut signature) = (None, None, None);
        for part in fields.split(',') {
            match part.trim().split_once('=') {
                Some(("Credential", v)) => credential = Some(v),
                Some(("SignedHeaders", v)) => signed = Some(v),
                Some(("Signature", v)) => signature = Some(v),
                _ => return Err(format!("unexpected part {:?} in the Authorization header", part.trim())),
            }
        }
        let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature) else {
            return Err("the Authorization header needs Credential, SignedHeaders and Signature".into());
        };
        let scope: Vec<&str> = credential.split('/').collect();
        let [key_id, date, region, service, terminator] = scope[..] else {
            return Err("Credential is not KEY/DATE/REGION/SERVICE/aws4_request".into());
        };
        if terminator != "aws4_request" {
            return Err("the credential scope does not end in aws4_request".into());
        }
        let Some(secret_access_key) = self.secret_of(key_id) else {
            return Err(format!("unknown access key id {key_id}"));
        };
        if let Some(want) = &self.service {
            if service != want {
                return Err(format!("signed for service {service}, this endpoint is {want}"));
            }
        }
        let amz_date = headers
            .get("x-amz-date")
            .ok_or("missing x-amz-date header")?
            .to_str()
            .map_err(|_| "x-amz-date is not ASCII")?;
        let at = parse_amz_date(amz_date).ok_or("x-amz-date is not YYYYMMDD'T'HHMMSS'Z'")?;
        if !amz_date.starts_with(date) || date.len() != 8 {
            return Err("the credential scope's date is not x-amz-date's".into());
        }
        if (now_s - at).abs() > MAX_SKEW_S {
            return Err(format!("x-amz-date is {}s from the server's clock (at most {MAX_SKEW_S}s)", now_s - at));
        }

        let signed_names: Vec<&str> = signed.split(';').collect();
        if signed_names.iter().any(|n| n.is_empty() || n.bytes().any(|b| b.is_ascii_uppercase()))
            || !signed_names.windows(2).all(|w| w[0] < w[1])
        {
            return Err("SignedHeaders is not a sorted list of lower-case names".into());
        }
        for must in ["host", "x-amz-date"] {
            if !signed_names.contains(&must) {
                return Err(format!("header {must} is not signed"));
            }
        }
        for name in headers.keys() {
            let name = name.as_str();
            if !UNSIGNED_OK.contains(&name) && !signed_names.contains(&name) {
                return Err(format!("header {name} is not signed"));
            }
        }

        let body_hash = hex::encode(Sha256::digest(body));
        if let Some(declared) = headers.get("x-amz-content-sha256") {
            if declared.as_bytes() != body_hash.as_bytes() {
                return Err("x-amz-content-sha256 is not the body's hash (or the payload is unsigned)".into());
            }
        }
        let mut canonical_headers = String::new();
        for name in &signed_names {
            let values: Vec<String> = headers
                .get_all(*name)
                .iter()
                .map(|v| v.to_str().map(canonical_value).map_err(|_| format!("header {name} is not ASCII")))
                .collect::<Result<_, _>>()?;
            if values.is_empty() {
                return Err(format!("signed header {name} is missing"));
            }
            let _ = writeln!(canonical_headers, "{name}:{}", values.join(","));
        }
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        let canonical_request = format!(
            "{method}\n{}\n{}\n{canonical_headers}\n{signed}\n{body_hash}",
            canonical_uri(path),
            canonical_query(query)
        );
        let scope = format!("{date}/{region}/{service}/aws4_request");
        let string_to_sign =
            format!("{ALGORITHM}\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request.as_bytes())));
        let mut key = hmac(format!("AWS4{secret_access_key}").as_bytes(), date.as_bytes());
        for part in [region, service, "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let mut given = [0u8; 32];
        hex::decode_to_slice(signature, &mut given).map_err(|_| "Signature is not 64 hex digits")?;
        let mut mac = keyed(&key);
        mac.update(string_to_sign.as_bytes());
        mac.verify_slice(&given).map_err(|_| "the signature does not match".to_owned())
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("HMAC takes a key of any size")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = keyed(key);
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// A header value as signed: trimmed, runs of spaces made one.
fn canonical_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every byte but RFC 3986's unreserved characters (letters, digits, `-`, `_`, `.`, `~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
/// The same, `/` kept (a path).
const NOT_UNRESERVED_OR_SLASH: &AsciiSet = &NOT_UNRESERVED.remove(b'/');

/// RFC 3986 unreserved characters stay; every other byte is `%XX` (upper case).
fn uri_encode(s: &str, keep_slash: bool) -> String {
    utf8_percent_encode(s, if keep_slash { NOT_UNRESERVED_OR_SLASH } else { NOT_UNRESERVED }).to_string()
}

/// Each `%XX` (two hex digits) as its byte; a `%` without two hex digits after it stays as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    percent_decode_str(s).collect()
}

/// The path with `.` and `..` segments removed, each byte outside the unreserved set encoded
/// (again: the path as received is already encoded, and services other than S3 sign it encoded
/// twice).
fn canonical_uri(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for seg in path.split('/').skip(1) {
        match seg {
            "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    if path.ends_with("/.") || path.ends_with("/..") {
        segments.push("");
    }
    uri_encode(&format!("/{}", segments.join("/")), true)
}

/// The parameters decoded, encoded again, sorted by name then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let enc = |s: &str| uri_encode(&String::from_utf8_lossy(&percent_decode(s)), false);
            (enc(k), enc(v))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// `x-amz-date`'s format: `20150830T123600Z` (ISO 8601 basic, UTC).
const AMZ_DATE: &[time::format_description::BorrowedFormatItem<'_>] =
    time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");

/// `20150830T123600Z` in epoch seconds: a date and time that exist (no 31 February, no second 60).
fn parse_amz_date(text: &str) -> Option<i64> {
    if text.len() != 16 {
        return None;
    }
    time::PrimitiveDateTime::parse(text, AMZ_DATE).ok().map(|t| t.assume_utc().unix_timestamp())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderName, HeaderValue};

    use super::*;

    /// The example credentials of AWS's SigV4 test suite.
    fn example() -> Verifier {
        Verifier::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", Some("service".into()))
    }

    /// 2015-08-30T12:36:00Z, the suite's time.
    const AT: i64 = 1_440_938_160;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn auth(signed: &str, signature: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders={signed}, Signature={signature}"
        )
    }

    const VANILLA: &str = "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";

    fn vanilla() -> HeaderMap {
        headers(&[
            ("host", "example.amazonaws.com"),
            ("x-amz-date", "20150830T123600Z"),
            ("authorization", &auth("host;x-amz-date", VANILLA)),
        ])
    }

    #[test]
    fn the_date_parser_knows_the_epoch() {
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(AT));
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20000301T000000Z"), Some(951_868_800));
        assert_eq!(parse_amz_date("2015-08-30T12:36"), None);
        // leap years (the Gregorian rule), the last second of a day, the ends of the year
        assert_eq!(parse_amz_date("20000229T000000Z"), Some(951_782_400));
        assert_eq!(parse_amz_date("20240229T235959Z"), Some(1_709_251_199));
        assert_eq!(parse_amz_date("19691231T235959Z"), Some(-1));
        assert_eq!(parse_amz_date("20991231T235959Z"), Some(4_102_444_799));
        // dates and times that do not exist, and anything but the exact 16 characters
        for bad in [
            "19000229T000000Z",
            "20150231T000000Z",
            "20151301T000000Z",
            "20150800T000000Z",
            "20150830T240000Z",
            "20150830T126000Z",
            "20150830T123660Z",
            "20150830t123600Z",
            "20150830T123600z",
            "20150830T123600",
            "20150830T123600Z ",
            "+2015830T123600Z",
            "2015083OT123600Z",
            "",
        ] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_uri_encoding_keeps_only_unreserved_characters() {
        assert_eq!(uri_encode("aZ09-_.~", false), "aZ09-_.~");
        assert_eq!(uri_encode("a b/c+d=é%", false), "a%20b%2Fc%2Bd%3D%C3%A9%25");
        assert_eq!(uri_encode("/a b/c", true), "/a%20b/c");
        // decoding: two hex digits of either case after `%`; a `%` without them stays
        assert_eq!(percent_decode("a%20b%2fc%2F"), b"a b/c/");
        assert_eq!(percent_decode("%C3%A9"), "é".as_bytes());
        assert_eq!(percent_decode("100%"), b"100%");
        assert_eq!(percent_decode("%zz%4"), b"%zz%4");
        assert_eq!(percent_decode("%+f%-1"), b"%+f%-1", "a sign is not a hex digit");
        assert_eq!(percent_decode("%%41"), b"%A");
        assert_eq!(canonical_query("b=%2F&a=x%20y&a=%41&c"), "a=A&a=x%20y&b=%2F&c=");
        assert_eq!(canonical_uri("/a/./b/../c%20d"), "/a/c%2520d", "the path as received, encoded again");
    }

    #[test]
    fn the_signature_must_be_64_hex_digits() {
        let with_signature = |sig: &str| {
            let mut h = vanilla();
            h.insert("authorization", HeaderValue::from_str(&auth("host;x-amz-date", sig)).unwrap());
            example().verify("GET", "/", &h, b"", AT)
        };
        assert_eq!(with_signature(VANILLA), Ok(()));
        assert_eq!(with_signature(&VANILLA.to_uppercase()), Ok(()), "hex digits of either case");
        for bad in [&VANILLA[..62], &format!("{VANILLA}00"), &format!("+{}", &VANILLA[1..]), &VANILLA.replace('f', "g")]
        {
            assert_eq!(with_signature(bad), Err("Signature is not 64 hex digits".into()), "{bad}");
        }
    }

    #[test]
    fn keys_can_come_from_a_directory_of_credentials() {
        let dir = std::env::temp_dir().join(format!("sigv4-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let v = Verifier::parse(&format!("dir:{}:service", dir.display())).unwrap();
        assert_eq!(v.service.as_deref(), Some("service"));
        // the key is not there yet: unknown
        let e = v.verify("GET", "/", &vanilla(), b"", AT).unwrap_err();
        assert!(e.contains("unknown access key id AKIDEXAMPLE"), "{e}");
        std::fs::write(dir.join("AKIDEXAMPLE"), "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY\n").unwrap();
        assert_eq!(v.verify("GET", "/", &vanilla(), b"", AT), Ok(()));
        std::fs::write(dir.join("AKIDEXAMPLE"), "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEZ").unwrap();
        assert!(v.verify("GET", "/", &vanilla(), b"", AT).unwrap_err().contains("signature does not match"));
        assert_eq!(v.secret_of("../etc"), None, "only plain key ids name a file");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(Verifier::parse("dir:").is_err());
    }

    #[test]
    fn the_get_vanilla_vector_of_the_aws_test_suite_verifies() {
        assert_eq!(example().verify("GET", "/", &vanilla(), b"", AT), Ok(()));
        // and anything changed is refused, with the reason
        let refuse = |v: &Verifier, method: &str, path: &str, h: &HeaderMap, body: &[u8], now: i64, why: &str| {
            let e = v.verify(method, path, h, body, now).unwrap_err();
            assert!(e.contains(why), "{e} lacks {why}");
        };
        let wrong_secret = Verifier::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEZ", None);
        refuse(&wrong_secret, "GET", "/", &vanilla(), b"", AT, "signature does not match");
        refuse(&example(), "POST", "/", &vanilla(), b"", AT, "signature does not match");
        refuse(&example(), "GET", "/x", &vanilla(), b"", AT, "signature does not match");
        refuse(&example(), "GET", "/?a=b", &vanilla(), b"", AT, "signature does not match");
        refuse(&example(), "GET", "/", &vanilla(), b"{}", AT, "signature does not match");
        refuse(&example(), "GET", "/", &vanilla(), b"", AT + 301, "from the server's clock");
        refuse(&example(), "GET", "/", &vanilla(), b"", AT - 301, "from the server's clock");
        assert_eq!(example().verify("GET", "/", &vanilla(), b"", AT + 300), Ok(()));
        let other_service = Verifier::new("AKIDEXAMPLE", "x", Some("execute-api".into()));
        refuse(&other_service, "GET", "/", &vanilla(), b"", AT, "signed for service service");
        refuse(&Verifier::new("AKIDOTHER", "x", None), "GET", "/", &vanilla(), b"", AT, "unknown access key id");
        let mut h = vanilla();
        h.insert("x-task-id", HeaderValue::from_static("t-1"));
        refuse(&example(), "GET", "/", &h, b"", AT, "header x-task-id is not signed");
        let mut h = vanilla();
        h.insert("host", HeaderValue::from_static("example.amazonaws.com:8080"));
        refuse(&example(), "GET", "/", &h, b"", AT, "signature does not match");
        let mut h = vanilla();
        h.insert("authorization", HeaderValue::from_str(&auth("host;x-amz-date", &VANILLA.replace('5', "6"))).unwrap());
        refuse(&example(), "GET", "/", &h, b"", AT, "signature does not match");
        refuse(&example(), "GET", "/", &HeaderMap::new(), b"", AT, "missing Authorization");
        let h = headers(&[("host", "example.amazonaws.com"), ("authorization", "Bearer abc")]);
        refuse(&example(), "GET", "/", &h, b"", AT, "not AWS4-HMAC-SHA256");
    }

    #[test]
    fn the_query_body_and_header_vectors_of_the_aws_test_suite_verify() {
        // get-vanilla-query-order-key-case
        let h = headers(&[
            ("host", "example.amazonaws.com"),
            ("x-amz-date", "20150830T123600Z"),
            (
                "authorization",
                &auth("host;x-amz-date", "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
            ),
        ]);
        assert_eq!(example().verify("GET", "/?Param2=value2&Param1=value1", &h, b"", AT), Ok(()));
        // post-x-www-form-urlencoded: the body's hash, and content-length signed
        let h = headers(&[
            ("content-type", "application/x-www-form-urlencoded"),
            ("host", "example.amazonaws.com"),
            ("content-length", "13"),
            ("x-amz-date", "20150830T123600Z"),
            ("x-amz-content-sha256", "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"),
            (
                "authorization",
                &auth(
                    "content-length;content-type;host;x-amz-content-sha256;x-amz-date",
                    "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b",
                ),
            ),
        ]);
        assert_eq!(example().verify("POST", "/", &h, b"Param1=value1", AT), Ok(()));
        let e = example().verify("POST", "/", &h, b"Param1=value2", AT).unwrap_err();
        assert!(e.contains("not the body's hash"), "{e}");
        // get-header-value-trim
        let h = headers(&[
            ("host", "example.amazonaws.com"),
            ("my-header1", " value1"),
            ("my-header2", "\"a   b   c\""),
            ("x-amz-date", "20150830T123600Z"),
            (
                "authorization",
                &auth(
                    "host;my-header1;my-header2;x-amz-date",
                    "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
                ),
            ),
        ]);
        assert_eq!(example().verify("GET", "/", &h, b"", AT), Ok(()));
    }

    #[test]
    fn the_setting_is_parsed_and_its_debug_hides_the_secret() {
        let v = Verifier::parse("AKID:se/cr+et:execute-api").unwrap();
        assert_eq!(v, Verifier::new("AKID", "se/cr+et", Some("execute-api".into())));
        assert_eq!(Verifier::parse("AKID:secret").unwrap().service, None);
        assert!(Verifier::parse("AKID").is_err() && Verifier::parse(":x").is_err());
        assert!(!format!("{v:?}").contains("se/cr+et"));
    }
}
