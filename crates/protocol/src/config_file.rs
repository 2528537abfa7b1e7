//! Reading a configuration file (workflows, agents): a file that is not JSON is told apart from
//! one that is JSON of the wrong shape, and the latter names where, as a path into the file
//! (`workflows[2].steps[0].backoff`), so that a person can find the mistake without counting.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a configuration file (or a part of one) could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all: the parser's message, with its line and column.
    #[error("not valid JSON: {0}")]
    Syntax(String),
    /// JSON, but a value does not fit the file's format: an unknown or missing field, a wrong type.
    #[error("does not fit the format at {path}: {message}")]
    Shape { path: String, message: String },
}

/// `json` read as a `T`; where it does not fit, the path of the value that does not.
pub fn parse<T: DeserializeOwned>(json: &str) -> Result<T, ParseError> {
    let de = &mut serde_json::Deserializer::from_str(json);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| from_path_error(e, ""))?;
    de.end().map_err(|e| ParseError::Syntax(e.to_string()))?;
    Ok(value)
}

/// A part of a file already read as JSON, read as a `T`; paths start at `prefix` (the part's own
/// path in the file, e.g. `workflows[0].steps[3]`).
pub fn parse_value<T: DeserializeOwned>(value: &Value, prefix: &str) -> Result<T, ParseError> {
    serde_path_to_error::deserialize(value).map_err(|e| from_path_error(e, prefix))
}

fn from_path_error(e: serde_path_to_error::Error<serde_json::Error>, prefix: &str) -> ParseError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() || inner.is_io() {
        return ParseError::Syntax(inner.to_string());
    }
    let path = match (prefix, path.as_str()) {
        ("", ".") => "the top level".to_owned(),
        (p, ".") => p.to_owned(),
        ("", rest) => rest.to_owned(),
        (p, rest) if rest.starts_with('[') => format!("{p}{rest}"),
        (p, rest) => format!("{p}.{rest}"),
    };
    // (a value read from a `Value` has no line: its message has none either)
    let message = inner.to_string();
    ParseError::Shape { path, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct File {
        items: Vec<Item>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        name: String,
        #[serde(default)]
        count: u32,
    }

    #[test]
    fn syntax_and_shape_are_told_apart_and_the_shape_names_its_path() {
        assert!(matches!(parse::<File>(r#"{"items": [}"#), Err(ParseError::Syntax(_))));
        assert!(matches!(parse::<File>(r#"{"items": []} x"#), Err(ParseError::Syntax(_))));
        let e = parse::<File>(r#"{"items": [{"name": "a"}, {"name": "b", "cuont": 2}]}"#).unwrap_err();
        let ParseError::Shape { path, message } = &e else { panic!("{e}") };
        assert_eq!(path, "items[1].cuont");
        assert!(message.starts_with("unknown field `cuont`, expected `name` or `count`"), "{message}");
        let e = parse::<File>(r#"{"items": [{"name": "a", "count": "two"}]}"#).unwrap_err();
        assert!(matches!(&e, ParseError::Shape { path, .. } if path == "items[0].count"), "{e}");
        let e = parse::<File>(r#"{"itemz": []}"#).unwrap_err();
        assert!(matches!(&e, ParseError::Shape { path, .. } if path == "itemz"), "{e}");
        let e = parse::<File>("{}").unwrap_err();
        assert_eq!(e.to_string(), "does not fit the format at the top level: missing field `items` at line 1 column 2");
        let v: Value = serde_json::from_str(r#"{"name": 3}"#).unwrap();
        let e = parse_value::<Item>(&v, "items[4]").unwrap_err();
        assert_eq!(
            e,
            ParseError::Shape {
                path: "items[4].name".into(),
                message: "invalid type: integer `3`, expected a string".into()
            }
        );
    }
}
