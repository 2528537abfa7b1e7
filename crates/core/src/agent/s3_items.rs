//! The `s3_items` agent: reads a map's items from S3 once and writes them back as pages, so that a
//! map over millions of items never holds them in a task (Step Functions' Distributed Map with an
//! `ItemReader`). `{"kind": "s3_items", "work_bucket": "${MAP_BUCKET}", "sources":
//! ["arn:aws:s3:::orders-in/*"]}`.
//!
//! - **What it reads** (the step's input, in Step Functions' `ItemReader` names): `{"Bucket",
//!   "Key", "ReaderConfig": {"InputType": "JSON" | "JSONL" | "CSV", "CSVHeaderLocation":
//!   "FIRST_ROW" | "GIVEN", "CSVHeaders": [...], "CSVDelimiter": "COMMA" | ..., "MaxItems"}}`
//!   (an object's items: a JSON array, JSON lines, or CSV rows as objects of text, named by the
//!   header), or `{"Bucket", "Prefix"}` (the objects under a prefix, listed: `Key`, `Size`,
//!   `Etag`, `LastModified`, `StorageClass` each). Only objects `sources` names are read: a
//!   submission cannot make the agent read another bucket. With `"ItemBatcher":
//!   {"MaxItemsPerBatch", "MaxInputBytesPerBatch"}` the items are cut into batches (arrays), and
//!   each batch is one element of the map.
//! - **What it writes**: the items as pages, JSON arrays, `{work_prefix}{task}/{step}/{n}.json` in
//!   `work_bucket` (named by the step's idempotency key: a retry writes the same pages again). A
//!   page holds items up to about `page_bytes` of JSON, and at least `count / 10,000` (a map takes
//!   at most 10,000 pages).
//! - **What it answers**: `{"bucket", "prefix", "count", "pages": [0, 1, ...]}`: the map step after
//!   it runs one child task per page, which reads its page (`s3:getObject`) and maps over its items.
//!   Only the page numbers reach the task.
//! - A source that is not what its `InputType` says (not an array, a line that is not JSON, a row
//!   with more fields than the header) fails the step for good, naming where.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::aws_api::{AwsApiAgent, ACTIONS_PARAMETER, RESOURCES_PARAMETER};
use super::kind::{AgentConfigError, AgentKind, BuildContext, Grant};
use super::runtime::{Agent, AgentError, Call};
use sas_protocol::workflow::MAX_MAP_ELEMENTS;

/// The most bytes of one source object read, by default: the object is read whole, and its items
/// take about ten times its size in memory (the Agent function has 256 MB by default).
pub const DEFAULT_MAX_SOURCE_BYTES: usize = 8 * 1024 * 1024;
/// About how much JSON a page holds, by default: a page is what a page's child task holds while
/// its items run (each of their ends rewrites it), so small pages keep those writes at a write
/// unit or two.
pub const DEFAULT_PAGE_BYTES: usize = 2 * 1024;
/// Pages written at once.
const WRITES_AT_ONCE: usize = 16;

/// `{"kind": "s3_items", "work_bucket": "...", "sources": [...]}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3ItemsKind {
    /// The source's bucket when the request names none (a workflow's parameters cannot name a
    /// variable; this may: `"${ORDERS_BUCKET}"`).
    #[serde(default)]
    pub bucket: Option<String>,
    /// The bucket the pages are written to (the map's page tasks read them back from there).
    pub work_bucket: String,
    /// Where in it (default `sas-maps/`): pages are `{work_prefix}{task}/{step}/{n}.json`. A
    /// lifecycle rule on it removes them when no task needs them any more.
    #[serde(default = "default_work_prefix")]
    pub work_prefix: String,
    /// What may be read: object ARNs (`arn:aws:s3:::bucket/*`, `*` wildcards as IAM); a prefix
    /// is listed when its bucket's ARN (`arn:aws:s3:::bucket`) is here.
    pub sources: Vec<String>,
    /// About how much JSON one page holds (default 2 KiB).
    #[serde(default)]
    pub page_bytes: Option<usize>,
    /// The most bytes of one source object read (default 8 MiB; its items take about ten times
    /// that in the function's memory).
    #[serde(default)]
    pub max_source_bytes: Option<usize>,
    /// The region called; default: the function's.
    #[serde(default)]
    pub region: Option<String>,
}

fn default_work_prefix() -> String {
    "sas-maps/".to_owned()
}

impl S3ItemsKind {
    /// The buckets (`arn:aws:s3:::b`) among the sources: prefixes there may be listed.
    fn listed_buckets(&self) -> impl Iterator<Item = &String> {
        self.sources.iter().filter(|s| s.strip_prefix("arn:aws:s3:::").is_some_and(|b| !b.contains('/')))
    }

    fn work_arn(&self) -> String {
        format!("arn:aws:s3:::{}/{}*", self.work_bucket, self.work_prefix)
    }
}

impl AgentKind for S3ItemsKind {
    const KIND: &'static str = "s3_items";

    fn build(self, name: &str, cx: &BuildContext) -> Result<Arc<dyn Agent>, AgentConfigError> {
        let invalid = |message: String| AgentConfigError::Invalid { agent: name.to_owned(), message };
        if self.work_bucket.is_empty() || self.work_bucket.contains('/') {
            return Err(invalid(format!("work_bucket {:?} is not a bucket's name", self.work_bucket)));
        }
        if self.sources.is_empty() {
            return Err(invalid("sources names what may be read (arn:aws:s3:::bucket/*)".into()));
        }
        if let Some(s) = self.sources.iter().find(|s| !s.starts_with("arn:aws:s3:::")) {
            return Err(invalid(format!("sources: {s:?} is not an S3 ARN (arn:aws:s3:::bucket/key)")));
        }
        let max_source_bytes = self.max_source_bytes.unwrap_or(DEFAULT_MAX_SOURCE_BYTES);
        let op = |action: &str, most: usize| {
            AwsApiAgent::internal("s3", action, self.region.clone(), cx, most).map_err(|e| invalid(e.clone()))
        };
        Ok(Arc::new(S3ItemsAgent {
            get: op("getObject", max_source_bytes)?,
            list: op("listObjectsV2", 16 * 1024 * 1024)?,
            put: op("putObject", 64 * 1024)?,
            bucket: self.bucket,
            work_bucket: self.work_bucket,
            work_prefix: self.work_prefix,
            sources: self.sources,
            page_bytes: self.page_bytes.unwrap_or(DEFAULT_PAGE_BYTES).max(1),
        }))
    }

    fn grants(&self) -> Vec<Grant> {
        let grant = |action: &'static str, resource: String| {
            Grant::new(action, resource, RESOURCES_PARAMETER).with_action_parameter(ACTIONS_PARAMETER)
        };
        let mut grants: Vec<Grant> = self
            .sources
            .iter()
            .filter(|s| s.contains('/'))
            .map(|s| grant("s3:GetObject", s.clone()))
            .chain(self.listed_buckets().map(|b| grant("s3:ListBucket", b.clone())))
            .collect();
        grants.push(grant("s3:PutObject", self.work_arn()));
        grants
    }
}

/// Reads a source, writes its pages.
pub struct S3ItemsAgent {
    bucket: Option<String>,
    get: AwsApiAgent,
    list: AwsApiAgent,
    put: AwsApiAgent,
    work_bucket: String,
    work_prefix: String,
    sources: Vec<String>,
    page_bytes: usize,
}

impl std::fmt::Debug for S3ItemsAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3ItemsAgent").field("work_bucket", &self.work_bucket).finish_non_exhaustive()
    }
}

fn permanent(message: impl Into<String>) -> AgentError {
    AgentError::Permanent { message: message.into() }
}

/// What the step asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// One object's items.
    Object { bucket: String, key: String, format: Format },
    /// The objects under a prefix.
    Listing { bucket: String, prefix: String },
}

/// How an object's items are written.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    Json,
    JsonLines,
    /// CSV: the header (given, or `None`: the first row) and the delimiter.
    Csv {
        header: Option<Vec<String>>,
        delimiter: u8,
    },
}

/// Batches of items: at most so many items, at most so many bytes of JSON (each at least one item).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Batcher {
    pub max_items: Option<usize>,
    pub max_bytes: Option<usize>,
}

/// The items cut into batches, each an array.
pub fn batches(items: Vec<Value>, b: Batcher) -> Vec<Value> {
    let mut out = Vec::new();
    let mut batch: Vec<Value> = Vec::new();
    let mut bytes = 2;
    for item in items {
        let size = serde_json::to_string(&item).map_or(0, |t| t.len()) + 1;
        let full = b.max_items.is_some_and(|n| batch.len() >= n) || b.max_bytes.is_some_and(|n| bytes + size > n);
        if full && !batch.is_empty() {
            out.push(Value::Array(std::mem::take(&mut batch)));
            bytes = 2;
        }
        bytes += size;
        batch.push(item);
    }
    if !batch.is_empty() {
        out.push(Value::Array(batch));
    }
    out
}

/// S3's date of a listed object (`2026-11-29T13:26:51.000Z`) as Step Functions gives it in a
/// Distributed Map's items, epoch seconds (`1795958811`); anything else as it is.
fn epoch_seconds(date: Value) -> Value {
    let parsed = date
        .as_str()
        .and_then(|d| aws_smithy_types::DateTime::from_str(d, aws_smithy_types::date_time::Format::DateTime).ok());
    parsed.map_or(date, |t| json!(t.secs()))
}

/// The request: what to read (in `bucket` when it names no `Bucket`), at most how many items,
/// and in batches or not.
pub fn source(input: &Value, bucket: Option<&str>) -> Result<(Source, Option<usize>, Option<Batcher>), String> {
    let text = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
    let bucket = text("Bucket")
        .or_else(|| bucket.map(str::to_owned))
        .filter(|b| !b.is_empty())
        .ok_or("the source names its Bucket")?;
    let config = input.get("ReaderConfig").cloned().unwrap_or(json!({}));
    let conf = |k: &str| config.get(k).and_then(Value::as_str).map(str::to_owned);
    let most = match config.get("MaxItems") {
        None | Some(Value::Null) => None,
        Some(v) => {
            Some(v.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or(format!("MaxItems {v} is not a count"))?)
        }
    };
    let source = match (text("Key"), text("Prefix")) {
        (Some(key), None) => {
            let format = match conf("InputType").as_deref() {
                None | Some("JSON") => Format::Json,
                Some("JSONL") => Format::JsonLines,
                Some("CSV") => {
                    let header = match conf("CSVHeaderLocation").as_deref() {
                        None | Some("FIRST_ROW") => None,
                        Some("GIVEN") => Some(
                            config
                                .get("CSVHeaders")
                                .and_then(Value::as_array)
                                .map(|h| h.iter().map(|v| v.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>())
                                .and_then(|h| h.filter(|h| !h.is_empty()))
                                .ok_or("CSVHeaderLocation GIVEN needs CSVHeaders, a list of names")?,
                        ),
                        Some(other) => return Err(format!("CSVHeaderLocation {other:?} is FIRST_ROW or GIVEN")),
                    };
                    let delimiter = match conf("CSVDelimiter").as_deref() {
                        None | Some("COMMA") => b',',
                        Some("PIPE") => b'|',
                        Some("SEMICOLON") => b';',
                        Some("SPACE") => b' ',
                        Some("TAB") => b'\t',
                        Some(other) => return Err(format!("CSVDelimiter {other:?} is not one Step Functions names")),
                    };
                    Format::Csv { header, delimiter }
                }
                Some(other) => return Err(format!("InputType {other:?} is not read here (JSON, JSONL or CSV)")),
            };
            Source::Object { bucket, key, format }
        }
        (None, prefix) => Source::Listing { bucket, prefix: prefix.unwrap_or_default() },
        (Some(_), Some(_)) => {
            return Err("the source is an object (Key) or the objects under a Prefix, not both".into())
        }
    };
    let count = |v: &Value, k: &str| {
        v.get(k)
            .map(|n| {
                n.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or(format!("{k} {n} is not a count"))
            })
            .transpose()
    };
    let batcher = match input.get("ItemBatcher") {
        None | Some(Value::Null) => None,
        Some(b) => {
            Some(Batcher { max_items: count(b, "MaxItemsPerBatch")?, max_bytes: count(b, "MaxInputBytesPerBatch")? })
        }
    };
    Ok((source, most, batcher))
}

/// An object's items, as its format writes them.
pub fn items(text: &str, format: &Format) -> Result<Vec<Value>, String> {
    match format {
        Format::Json => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => Ok(items),
            Ok(other) => {
                Err(format!("the object is JSON but not an array: {}", crate::ids::clip(&other.to_string(), 80)))
            }
            Err(e) => Err(format!("the object is not JSON: {e}")),
        },
        Format::JsonLines => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {} is not JSON: {e}", i + 1)))
            .collect(),
        Format::Csv { header, delimiter } => {
            let mut reader = csv::ReaderBuilder::new()
                .delimiter(*delimiter)
                .has_headers(header.is_none())
                .flexible(true)
                .from_reader(text.as_bytes());
            let names: Vec<String> = match header {
                Some(h) => h.clone(),
                None => {
                    reader.headers().map_err(|e| format!("the CSV header: {e}"))?.iter().map(str::to_owned).collect()
                }
            };
            if let Some(twice) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)).map(|(_, n)| n) {
                return Err(format!("the CSV header names {twice:?} twice (a row is an object of its names)"));
            }
            let mut out = Vec::new();
            for (i, row) in reader.records().enumerate() {
                let row = row.map_err(|e| format!("CSV row {}: {e}", i + 1))?;
                if row.len() > names.len() {
                    return Err(format!(
                        "CSV row {} has {} fields, the header {} ({})",
                        i + 1,
                        row.len(),
                        names.len(),
                        names.join(",")
                    ));
                }
                // a short row's missing fields are empty text, as Step Functions reads them
                let obj: Map<String, Value> = names
                    .iter()
                    .enumerate()
                    .map(|(j, n)| (n.clone(), Value::String(row.get(j).unwrap_or_default().to_owned())))
                    .collect();
                out.push(Value::Object(obj));
            }
            Ok(out)
        }
    }
}

/// The items cut into pages: each about `page_bytes` of JSON, at least `count / 10,000` items
/// (rounded up), never empty.
pub fn pages(items: &[Value], page_bytes: usize) -> Vec<&[Value]> {
    let least = items.len().div_ceil(MAX_MAP_ELEMENTS).max(1);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let size = serde_json::to_string(item).map_or(0, |t| t.len()) + 1;
        if i > start && i - start >= least && bytes + size > page_bytes {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Whether one of the IAM-style patterns of `sources` (`*` and `?`) matches `arn`.
fn allowed(sources: &[String], arn: &str) -> bool {
    sources.iter().any(|p| sas_protocol::messages::glob(p, arn))
}

impl S3ItemsAgent {
    async fn read(&self, source: &Source) -> Result<Vec<Value>, AgentError> {
        match source {
            Source::Object { bucket, key, format } => {
                let arn = format!("arn:aws:s3:::{bucket}/{key}");
                if !allowed(&self.sources, &arn) {
                    return Err(permanent(format!("{arn} is not among the agent's sources")));
                }
                let body = Map::from_iter([("Bucket".into(), json!(bucket)), ("Key".into(), json!(key))]);
                let answer = self.get.send(&body).await?;
                let text = answer.get("Body").and_then(Value::as_str).unwrap_or_default();
                items(text, format).map_err(|e| permanent(format!("s3://{bucket}/{key}: {e}")))
            }
            Source::Listing { bucket, prefix } => {
                let arn = format!("arn:aws:s3:::{bucket}");
                if !allowed(&self.sources, &arn) {
                    return Err(permanent(format!("{arn} is not among the agent's sources (listing {prefix:?})")));
                }
                let mut out = Vec::new();
                let mut next: Option<String> = None;
                loop {
                    let mut body = Map::from_iter([("Bucket".into(), json!(bucket)), ("Prefix".into(), json!(prefix))]);
                    if let Some(t) = next.take() {
                        body.insert("ContinuationToken".into(), json!(t));
                    }
                    let answer = self.list.send(&body).await?;
                    for o in answer.get("Contents").and_then(Value::as_array).into_iter().flatten() {
                        // as Step Functions gives a listed object (its date in epoch seconds)
                        let pick = |k: &str| o.get(k).cloned().unwrap_or(Value::Null);
                        out.push(
                            json!({"Etag": pick("ETag"), "Key": pick("Key"), "LastModified": epoch_seconds(pick("LastModified")),
                                        "Size": pick("Size"), "StorageClass": pick("StorageClass")}),
                        );
                    }
                    match answer.get("NextContinuationToken").and_then(Value::as_str) {
                        Some(t) if answer.get("IsTruncated") == Some(&json!(true)) => next = Some(t.to_owned()),
                        _ => break,
                    }
                }
                Ok(out)
            }
        }
    }

    async fn run(&self, call: Call<'_>) -> Result<Value, AgentError> {
        let (source, most, batcher) = source(&call.request.input, self.bucket.as_deref()).map_err(permanent)?;
        let mut items = self.read(&source).await?;
        // (MaxItems 0 is no limit, as Step Functions reads it)
        if let Some(most) = most.filter(|n| *n > 0) {
            items.truncate(most);
        }
        let count = items.len();
        if let Some(b) = batcher {
            items = batches(items, b);
        }
        // one prefix per step of a task: `{task}:{step}` is the idempotency key
        let prefix = format!("{}{}/", self.work_prefix, call.request.idempotency_key.as_str().replacen(':', "/", 1));
        let pages = pages(&items, self.page_bytes);
        if pages.len() > MAX_MAP_ELEMENTS {
            return Err(permanent(format!(
                "{} items make {} pages, over {MAX_MAP_ELEMENTS}",
                items.len(),
                pages.len()
            )));
        }
        let writes: Vec<Map<String, Value>> = pages
            .iter()
            .enumerate()
            .map(|(n, page)| {
                Map::from_iter([
                    ("Bucket".into(), json!(self.work_bucket)),
                    ("Key".into(), json!(format!("{prefix}{n}.json"))),
                    ("Body".into(), json!(Value::Array(page.to_vec()).to_string())),
                    ("ContentType".into(), json!("application/json")),
                ])
            })
            .collect();
        // (chunks rather than a buffered stream: that stream's future is not Send here)
        for chunk in writes.chunks(WRITES_AT_ONCE) {
            futures::future::try_join_all(chunk.iter().map(|body| self.put.send(body))).await?;
        }
        let mut answer = json!({"bucket": self.work_bucket, "prefix": prefix, "count": count,
                                "pages": (0..pages.len()).collect::<Vec<_>>()});
        if batcher.is_some() {
            answer["batches"] = json!(items.len());
        }
        Ok(answer)
    }
}

impl Agent for S3ItemsAgent {
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, AgentError>> {
        Box::pin(self.run(call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_object_s_date_is_given_in_epoch_seconds_as_step_functions_gives_it() {
        assert_eq!(epoch_seconds(json!("2022-11-17T15:44:41.000Z")), json!(1_668_699_881));
        assert_eq!(epoch_seconds(json!(1_668_699_881)), json!(1_668_699_881), "a number is kept");
        assert_eq!(epoch_seconds(json!("yesterday")), json!("yesterday"), "text that is no date is kept");
    }

    #[test]
    fn sources_are_read_as_step_functions_item_readers_name_them() {
        let (s, most, batcher) = source(
            &json!({"Bucket": "in", "Key": "a.csv", "ReaderConfig": {"InputType": "CSV",
            "CSVHeaderLocation": "GIVEN", "CSVHeaders": ["id", "qty"], "CSVDelimiter": "PIPE", "MaxItems": 5}}),
            None,
        )
        .unwrap();
        let header = Some(vec!["id".to_owned(), "qty".to_owned()]);
        assert_eq!(
            s,
            Source::Object {
                bucket: "in".into(),
                key: "a.csv".into(),
                format: Format::Csv { header, delimiter: b'|' }
            }
        );
        assert_eq!((most, batcher), (Some(5), None));
        let (s, _, batcher) =
            source(&json!({"Bucket": "in", "Prefix": "raw/", "ItemBatcher": {"MaxItemsPerBatch": 3}}), None).unwrap();
        assert_eq!(batcher, Some(Batcher { max_items: Some(3), max_bytes: None }));
        assert_eq!(s, Source::Listing { bucket: "in".into(), prefix: "raw/".into() });
        let (s, ..) = source(&json!({"Bucket": "in", "Key": "a.json"}), None).unwrap();
        assert_eq!(s, Source::Object { bucket: "in".into(), key: "a.json".into(), format: Format::Json });
        // the agent's own bucket, when the request names none
        let (s, ..) = source(&json!({"Key": "a.json"}), Some("mine")).unwrap();
        assert_eq!(s, Source::Object { bucket: "mine".into(), key: "a.json".into(), format: Format::Json });
        for (bad, says) in [
            (json!({"Key": "a"}), "Bucket"),
            (json!({"Bucket": "in", "Key": "a", "ReaderConfig": {"InputType": "MANIFEST"}}), "MANIFEST"),
            (
                json!({"Bucket": "in", "Key": "a", "ReaderConfig": {"InputType": "CSV", "CSVHeaderLocation": "GIVEN"}}),
                "CSVHeaders",
            ),
            (json!({"Bucket": "in", "Key": "a", "ReaderConfig": {"MaxItems": -1}}), "MaxItems"),
            (json!({"Bucket": "in", "Key": "a", "Prefix": "b"}), "not both"),
            (json!({"Bucket": "in", "Key": "a", "ItemBatcher": {"MaxItemsPerBatch": 0}}), "MaxItemsPerBatch"),
        ] {
            let e = source(&bad, None).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn an_object_s_items_are_its_array_its_lines_or_its_rows() {
        assert_eq!(items("[1, {\"a\": 2}]", &Format::Json).unwrap(), vec![json!(1), json!({"a": 2})]);
        assert!(items("{\"a\": 1}", &Format::Json).unwrap_err().contains("not an array"));
        assert_eq!(items("{\"a\":1}\n\n[2]\n", &Format::JsonLines).unwrap(), vec![json!({"a": 1}), json!([2])]);
        assert!(items("{\"a\":1}\nnope\n", &Format::JsonLines).unwrap_err().contains("line 2"));
        let csv = "id,qty\n1,3\n\"2,5\",\n7\n";
        assert_eq!(
            items(csv, &Format::Csv { header: None, delimiter: b',' }).unwrap(),
            vec![json!({"id": "1", "qty": "3"}), json!({"id": "2,5", "qty": ""}), json!({"id": "7", "qty": ""})]
        );
        let given = Format::Csv { header: Some(vec!["a".into()]), delimiter: b';' };
        assert_eq!(items("x\ny\n", &given).unwrap(), vec![json!({"a": "x"}), json!({"a": "y"})]);
        assert!(items("x;z\n", &given).unwrap_err().contains("row 1 has 2 fields"));
        assert!(items("a,b,a\n1,2,3\n", &Format::Csv { header: None, delimiter: b',' })
            .unwrap_err()
            .contains("\"a\" twice"));
    }

    #[test]
    fn batches_hold_at_most_their_items_and_bytes_and_at_least_one_item() {
        let items: Vec<Value> = (0..7).map(|i| json!(i)).collect();
        let b = batches(items.clone(), Batcher { max_items: Some(3), max_bytes: None });
        assert_eq!(b, vec![json!([0, 1, 2]), json!([3, 4, 5]), json!([6])]);
        // "[0,1]" is 5 bytes: at most 6 makes batches of two
        let b = batches(items.clone(), Batcher { max_items: None, max_bytes: Some(6) });
        assert_eq!(b, vec![json!([0, 1]), json!([2, 3]), json!([4, 5]), json!([6])]);
        let b = batches(vec![json!("a long item")], Batcher { max_items: None, max_bytes: Some(1) });
        assert_eq!(b, vec![json!(["a long item"])]);
    }

    #[test]
    fn pages_hold_about_their_bytes_and_never_more_than_a_map_takes() {
        let items: Vec<Value> = (0..100).map(|i| json!({"id": format!("{i:08}")})).collect();
        // each item is 16 bytes of JSON and a separator: 5 to a page of 100 bytes
        let p = pages(&items, 100);
        assert_eq!(p.len(), 20);
        assert!(p.iter().all(|p| p.len() == 5));
        assert_eq!(p.concat(), items);
        // one item over the size is a page of its own
        assert_eq!(pages(&items[..3], 1).len(), 3);
        assert!(pages(&[], 100).is_empty());
        // 100,000 items: at least 10 to a page
        let many: Vec<Value> = (0..100_000).map(|i| json!(i)).collect();
        let p = pages(&many, 1);
        assert_eq!(p.len(), MAX_MAP_ELEMENTS);
        assert_eq!(p.iter().map(|p| p.len()).sum::<usize>(), 100_000);
    }

    #[test]
    fn the_agent_is_granted_its_sources_and_its_pages_only() {
        let kind: S3ItemsKind = serde_json::from_value(json!({"work_bucket": "work", "sources":
            ["arn:aws:s3:::in/*", "arn:aws:s3:::listed"]}))
        .unwrap();
        let g: Vec<(String, String)> = kind.grants().into_iter().map(|g| (g.action.into_owned(), g.resource)).collect();
        assert_eq!(
            g,
            vec![
                ("s3:GetObject".to_owned(), "arn:aws:s3:::in/*".to_owned()),
                ("s3:ListBucket".to_owned(), "arn:aws:s3:::listed".to_owned()),
                ("s3:PutObject".to_owned(), "arn:aws:s3:::work/sas-maps/*".to_owned()),
            ]
        );
        assert!(allowed(&kind.sources, "arn:aws:s3:::in/orders/1.csv"));
        assert!(!allowed(&kind.sources, "arn:aws:s3:::other/1.csv"));
        assert!(!allowed(&kind.sources, "arn:aws:s3:::in"));
    }
}
