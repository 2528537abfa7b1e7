//! Screening of caller-supplied JSON before it reaches DynamoDB or SQS, so that what they would
//! refuse becomes a clear `Rejected` at the door instead of a write that fails on every retry:
//! duplicated keys (the contract is strict: JSON's "last wins" would silently drop data), nesting
//! deeper than DynamoDB's 32 levels, empty map keys, and numbers DynamoDB cannot store. Also the
//! characters SQS accepts in a message attribute.

use std::collections::HashSet;
use std::fmt::{self, Write as _};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// DynamoDB nests documents at most 32 levels deep (the item itself is one).
pub const MAX_DEPTH: usize = 31;

/// A JSON text with no object that repeats a key (at any depth).
pub fn no_duplicate_keys(raw: &str) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_str(raw);
    NoDuplicates::deserialize(&mut de).map(drop).map_err(|e| e.to_string())
}

struct NoDuplicates;

impl<'de> Deserialize<'de> for NoDuplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicatesVisitor)
    }
}

struct NoDuplicatesVisitor;

impl<'de> Visitor<'de> for NoDuplicatesVisitor {
    type Value = NoDuplicates;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoDuplicates, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "the key {:?} appears twice in one object",
                    crate::ids::clip(&key, 64)
                )));
            }
            map.next_value::<NoDuplicates>()?;
        }
        Ok(NoDuplicates)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NoDuplicates, A::Error> {
        while seq.next_element::<NoDuplicates>()?.is_some() {}
        Ok(NoDuplicates)
    }

    fn visit_bool<E>(self, _: bool) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_i64<E>(self, _: i64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_u64<E>(self, _: u64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_f64<E>(self, _: f64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_str<E>(self, _: &str) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
    fn visit_unit<E>(self) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }
}

/// How deep an agent's output may nest: it is stored two levels below the item's attributes
/// (`Steps[i].Output`).
pub const MAX_OUTPUT_DEPTH: usize = MAX_DEPTH - 2;

/// A value DynamoDB stores as given: nesting within [`MAX_DEPTH`], no empty map key, every number
/// within DynamoDB's range (magnitude 1E-130 to 9.99E+125, or zero).
pub fn storable(v: &Value) -> Result<(), String> {
    storable_at(v, "input", MAX_DEPTH)
}

/// [`storable`] for a value named `root` in messages, nested at most `max_depth` levels.
pub fn storable_at(v: &Value, root: &str, max_depth: usize) -> Result<(), String> {
    fn walk(v: &Value, depth: usize, max_depth: usize, path: &mut String) -> Result<(), String> {
        if depth > max_depth {
            return Err(format!("{path} is nested deeper than {max_depth} levels (DynamoDB's limit)"));
        }
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    if k.is_empty() {
                        return Err(format!("{path} has an empty key (DynamoDB refuses it)"));
                    }
                    let len = path.len();
                    path.push('.');
                    path.push_str(crate::ids::clip(k, 32));
                    walk(child, depth + 1, max_depth, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    let len = path.len();
                    let _ = write!(path, "[{i}]");
                    walk(child, depth + 1, max_depth, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            Value::Number(n) => match n.as_f64() {
                Some(x) if x == 0.0 || (1e-130..1e126).contains(&x.abs()) => Ok(()),
                _ => Err(format!("{path} = {n} is outside the numbers DynamoDB stores")),
            },
            _ => Ok(()),
        }
    }
    walk(v, 0, max_depth, &mut root.to_owned())
}

/// The largest agent output kept on a task (the HTTP agent's default response limit); larger ones
/// are replaced by [`unstorable_output`]. It also keeps a result message well within SQS's limit.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// What is stored for a successful attempt whose output cannot be: the step succeeded (its effect
/// happened), so it stays a success, and the output says why it is missing (as the HTTP agent
/// does for an oversized body).
pub fn unstorable_output(why: &str) -> Value {
    serde_json::json!({"unstorable": true, "reason": crate::ids::clip(why, 512)})
}

/// An agent's output as it can be stored: as given when DynamoDB holds it (nesting within
/// [`MAX_OUTPUT_DEPTH`], no empty key, numbers in range) and it is at most [`MAX_OUTPUT_BYTES`],
/// else [`unstorable_output`] (logged).
pub fn output(v: &Value) -> Value {
    let bytes = sas_protocol::messages::json_len(v);
    let why = if bytes > MAX_OUTPUT_BYTES {
        format!("output is {bytes} bytes; the limit is {MAX_OUTPUT_BYTES}")
    } else {
        match storable_at(v, "output", MAX_OUTPUT_DEPTH) {
            Ok(()) => return v.clone(),
            Err(why) => why,
        }
    };
    tracing::warn!(reason = %why, "an agent's output cannot be stored: the success is kept with a marker instead");
    unstorable_output(&why)
}

/// `s` with every character SQS refuses in a message attribute replaced by `?` (SQS accepts
/// #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD and #x10000 to #x10FFFF).
pub fn attribute_safe(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}' => c,
            _ => '?',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn duplicated_keys_are_found_at_any_depth() {
        assert!(no_duplicate_keys(r#"{"a": 1, "b": {"c": [1, {"d": 2}]}}"#).is_ok());
        assert!(no_duplicate_keys(r#"{"a": 1, "a": 2}"#).unwrap_err().contains("\"a\" appears twice"));
        assert!(no_duplicate_keys(r#"{"x": [{"k": 1, "k": 1}]}"#).is_err());
    }

    #[test]
    fn what_dynamodb_refuses_is_named() {
        assert!(storable(&json!({"a": [1, 2.5, "s", null, {"b": true}]})).is_ok());
        assert!(storable(&json!({"": 1})).unwrap_err().contains("empty key"));
        assert!(storable(&json!({"n": 1e300})).unwrap_err().contains("input.n"));
        assert!(storable(&json!({"n": 1e-200})).is_err());
        let mut deep = json!(1);
        for _ in 0..40 {
            deep = json!({ "d": deep });
        }
        assert!(storable(&deep).unwrap_err().contains("nested deeper"));
    }

    #[test]
    fn attributes_lose_only_what_sqs_refuses() {
        assert_eq!(attribute_safe("a\u{0}b\u{7}c\td é"), "a?b?c\td é");
    }
}
