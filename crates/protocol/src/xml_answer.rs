//! A REST-XML answer (S3's) read as JSON by its shape, as Step Functions' `aws-sdk` tasks give
//! it: a structure's members by name (an element named otherwise in the model read under its
//! member's name), a list as an array (flattened, its items repeated in place; or wrapped, its
//! items in one element), a map as an object, numbers and booleans typed, timestamps and the rest
//! as their text. The shapes are the table's (`wire_shapes` of `infra/gen_aws_services.py`).
//!
//! The XML is tokenized by `xmlparser` (the AWS SDK's own XML decoder's tokenizer) into a small
//! tree; the tree is read once by the shape, what the shape does not name is left out.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// An element: its local name, its text (with entities and character references replaced), its
/// child elements.
#[derive(Debug, Default)]
struct Node {
    name: String,
    text: String,
    children: Vec<Node>,
}

fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some(end) = after.find(';') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let entity = &after[..end];
        let ch = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") || e.starts_with("#X") => {
                u32::from_str_radix(&e[2..], 16).ok().and_then(char::from_u32)
            }
            e if e.starts_with('#') => e[1..].parse::<u32>().ok().and_then(char::from_u32),
            _ => None,
        };
        if let Some(c) = ch {
            out.push(c);
        } else {
            out.push('&');
            out.push_str(entity);
            out.push(';');
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The document's root element.
fn parse(text: &str) -> Result<Node, String> {
    use xmlparser::{ElementEnd, Token, Tokenizer};
    let mut stack: Vec<Node> = Vec::new();
    let mut root = None;
    for token in Tokenizer::from(text) {
        match token.map_err(|e| format!("the answer is not XML: {e}"))? {
            Token::ElementStart { local, .. } => {
                stack.push(Node { name: local.as_str().to_owned(), ..Node::default() });
            }
            Token::ElementEnd { end: ElementEnd::Empty | ElementEnd::Close(..), .. } => {
                let node = stack.pop().ok_or("the answer's XML closes an element it did not open")?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(node),
                    None => root = Some(node),
                }
            }
            Token::Text { text } => {
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(&unescape(text.as_str()));
                }
            }
            Token::Cdata { text, .. } => {
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(text.as_str());
                }
            }
            _ => {}
        }
    }
    root.ok_or_else(|| "the answer's XML has no element".to_owned())
}

/// The answer `text` read as the shape `shape` (a structure) of `shapes`.
pub fn read(text: &str, shape: &str, shapes: &BTreeMap<String, Value>) -> Result<Value, String> {
    let root = parse(text)?;
    Ok(value(&root, shape, shapes, 0))
}

/// The answer `text` read as the shape `shape`, found under the root element through the child
/// elements `path` (a query answer's `<PublishResponse><PublishResult>`); a missing element is an
/// empty answer.
pub fn read_in(text: &str, path: &[&str], shape: &str, shapes: &BTreeMap<String, Value>) -> Result<Value, String> {
    let root = parse(text)?;
    let mut at = &root;
    for name in path {
        match at.children.iter().find(|c| c.name == *name) {
            Some(c) => at = c,
            None => return Ok(Value::Object(Map::new())),
        }
    }
    Ok(value(at, shape, shapes, 0))
}

/// The code and message of an XML error answer (`<Error><Code>NoSuchKey</Code><Message>…`, or
/// inside `<ErrorResponse>`).
pub fn error(text: &str) -> Option<(String, Option<String>)> {
    let root = parse(text).ok()?;
    // `<Error>`, `<ErrorResponse><Error>`, or EC2's `<Response><Errors><Error>`
    let error = if root.name == "Error" {
        Some(&root)
    } else {
        root.children.iter().find(|c| c.name == "Error").or_else(|| {
            root.children
                .iter()
                .find(|c| c.name == "Errors")
                .and_then(|e| e.children.iter().find(|c| c.name == "Error"))
        })
    }?;
    let field = |n: &str| error.children.iter().find(|c| c.name == n).map(|c| c.text.trim().to_owned());
    Some((field("Code")?, field("Message")))
}

fn value(node: &Node, shape: &str, shapes: &BTreeMap<String, Value>, depth: usize) -> Value {
    if depth > 32 {
        return Value::Null;
    }
    match shapes.get(shape) {
        Some(Value::Object(def)) if def.contains_key("S") => {
            let mut out = Map::new();
            let Some(Value::Object(members)) = def.get("S") else { return Value::Object(out) };
            for (member, spec) in members {
                let (of, element) = match spec {
                    Value::String(of) => (of.as_str(), member.as_str()),
                    Value::Array(a) => (
                        a.first().and_then(Value::as_str).unwrap_or_default(),
                        a.get(1).and_then(Value::as_str).unwrap_or(member),
                    ),
                    _ => continue,
                };
                let flattened = shapes.get(of).and_then(|d| d.get("f")).is_some();
                let found: Vec<&Node> = node.children.iter().filter(|c| c.name == element).collect();
                if found.is_empty() {
                    continue;
                }
                let v = if flattened {
                    // a flattened list: its items are the elements named for the member
                    let item = shapes.get(of).and_then(|d| d.get("L")).and_then(Value::as_str).unwrap_or_default();
                    Value::Array(found.iter().map(|n| value(n, item, shapes, depth + 1)).collect())
                } else {
                    value(found[0], of, shapes, depth + 1)
                };
                out.insert(member.clone(), v);
            }
            Value::Object(out)
        }
        Some(Value::Object(def)) if def.contains_key("L") => {
            let item = def.get("L").and_then(Value::as_str).unwrap_or_default();
            let name = def.get("n").and_then(Value::as_str).unwrap_or("member");
            Value::Array(
                node.children.iter().filter(|c| c.name == name).map(|c| value(c, item, shapes, depth + 1)).collect(),
            )
        }
        Some(Value::Object(def)) if def.contains_key("M") => {
            // a map: its entries, each a key and a value
            let kv: Vec<&str> =
                def.get("M").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            let value_shape = kv.get(1).copied().unwrap_or_default();
            let mut out = Map::new();
            for entry in &node.children {
                let key = entry.children.iter().find(|c| c.name == "key").map(|c| c.text.clone());
                let v = entry.children.iter().find(|c| c.name == "value");
                if let (Some(k), Some(v)) = (key, v) {
                    out.insert(k, value(v, value_shape, shapes, depth + 1));
                }
            }
            Value::Object(out)
        }
        Some(Value::String(t)) => {
            let text = node.text.trim();
            match t.as_str() {
                "i" => text.parse::<i64>().map_or_else(|_| Value::String(text.to_owned()), Value::from),
                "f" => text.parse::<f64>().map_or_else(|_| Value::String(text.to_owned()), Value::from),
                "b" => Value::Bool(text == "true"),
                // a string keeps its spaces
                "s" => Value::String(node.text.clone()),
                // a timestamp as written (ISO 8601 in S3's bodies), a blob's base64 as written
                _ => Value::String(text.to_owned()),
            }
        }
        _ => Value::String(node.text.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S3's shapes of a listing, as the table carries them (the table's own are read by
    /// `service_models`' tests).
    fn s3() -> BTreeMap<String, Value> {
        serde_json::from_value(serde_json::json!({
            "ListObjectsV2Output": {"S": {"Name": "BucketName", "KeyCount": "KeyCount", "IsTruncated": "IsTruncated",
                                          "Contents": "ObjectList", "CommonPrefixes": "CommonPrefixList"}},
            "ObjectList": {"L": "Object", "f": 1},
            "Object": {"S": {"Key": "ObjectKey", "LastModified": "LastModified", "ETag": "ETag", "Size": "Size", "Owner": "Owner"}},
            "Owner": {"S": {"DisplayName": "DisplayName", "ID": "ID"}},
            "CommonPrefixList": {"L": "CommonPrefix", "f": 1},
            "CommonPrefix": {"S": {"Prefix": "Prefix"}},
            "BucketName": "s", "KeyCount": "i", "IsTruncated": "b", "ObjectKey": "s", "LastModified": "t",
            "ETag": "s", "Size": "i", "DisplayName": "s", "ID": "s", "Prefix": "s"
        }))
        .unwrap()
    }

    #[test]
    fn a_listing_is_read_by_its_shape_flattened_lists_typed_members_and_escapes() {
        let text = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>orders</Name><Prefix>in/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>
  <Contents><Key>in/a &amp; b.json</Key><LastModified>2026-11-29T02:00:00.000Z</LastModified><ETag>&quot;9b2&quot;</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>in/c.json</Key><Size>0</Size><Owner><ID>abc</ID><DisplayName>me</DisplayName></Owner></Contents>
  <CommonPrefixes><Prefix>in/sub/</Prefix></CommonPrefixes>
  <Unknown>left out</Unknown>
</ListBucketResult>"#;
        let v = read(text, "ListObjectsV2Output", &s3()).unwrap();
        assert_eq!(v["Name"], "orders");
        assert_eq!(v["KeyCount"], 2);
        assert_eq!(v["IsTruncated"], false);
        assert_eq!(v["Contents"].as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(v["Contents"][0]["Key"], "in/a & b.json");
        assert_eq!(v["Contents"][0]["ETag"], "\"9b2\"");
        assert_eq!(v["Contents"][0]["Size"], 12);
        assert_eq!(v["Contents"][0]["LastModified"], "2026-11-29T02:00:00.000Z");
        assert_eq!(v["Contents"][1]["Owner"], serde_json::json!({"ID": "abc", "DisplayName": "me"}));
        assert_eq!(v["CommonPrefixes"], serde_json::json!([{"Prefix": "in/sub/"}]));
        assert!(v.get("Unknown").is_none());
        // an empty listing has no Contents
        let empty = read(
            "<ListBucketResult><Name>b</Name><KeyCount>0</KeyCount></ListBucketResult>",
            "ListObjectsV2Output",
            &s3(),
        )
        .unwrap();
        assert_eq!(empty, serde_json::json!({"Name": "b", "KeyCount": 0}));
        assert!(read("not xml <", "ListObjectsV2Output", &s3()).is_err());
    }

    #[test]
    fn an_error_answer_names_its_code_and_message() {
        let text = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>x</Key></Error>";
        assert_eq!(error(text), Some(("NoSuchKey".into(), Some("The specified key does not exist.".into()))));
        assert_eq!(
            error("<ErrorResponse><Error><Code>Throttling</Code></Error></ErrorResponse>"),
            Some(("Throttling".into(), None))
        );
        assert_eq!(error("{}"), None);
    }
}
