//! The intrinsic functions of the States Language in templates: a `.$` key whose value is a call,
//! `{"greeting.$": "States.Format('Hello {}', $.input.name)"}`. Its arguments are strings in single
//! quotes (`\'`, `\{`, `\}` and `\\` for those characters), numbers, `true`, `false`, `null`, paths
//! (read as the template's other paths are) and other calls.
//!
//! Supported: `States.Format`, `States.StringToJson`, `States.JsonToString`, `States.Array`,
//! `States.ArrayPartition`, `States.ArrayContains`, `States.ArrayRange`, `States.ArrayGetItem`,
//! `States.ArrayLength`, `States.ArrayUnique`, `States.JsonMerge` (shallow), `States.MathAdd`,
//! `States.StringSplit`, `States.Hash` (`MD5`, `SHA-1`, `SHA-256`, `SHA-384`, `SHA-512`: lowercase
//! hex), `States.Base64Encode` and `States.Base64Decode` (the standard alphabet, padded; a string
//! of at most 10,000 characters, as Step Functions takes), and `States.UUID` **with arguments**:
//! `States.UUID($.task.id, 'ticket')` is a UUID (version 5) named by its arguments' JSON, so the
//! same on every attempt of a step and every read of it, another in every task (a loop's iteration
//! and a map's element are tasks of their own). Not: `States.UUID()` and `States.MathRandom`
//! (a value that would change each time a step's request is made); `sasctl import-asl` writes a
//! definition's `States.UUID()` as `States.UUID($.task.id, '<state>#<n>')`.
//! A call that fails at run time (a wrong type, an index out of range) gives `null`; Step
//! Functions fails the state there (`States.IntrinsicFailure`).

use serde_json::{Map, Value};

use crate::condition::DataPath;

/// The functions a template may call.
pub const FUNCTIONS: &[&str] = &[
    "States.Format",
    "States.StringToJson",
    "States.JsonToString",
    "States.Array",
    "States.ArrayPartition",
    "States.ArrayContains",
    "States.ArrayRange",
    "States.ArrayGetItem",
    "States.ArrayLength",
    "States.ArrayUnique",
    "States.JsonMerge",
    "States.MathAdd",
    "States.StringSplit",
    "States.Hash",
    "States.Base64Encode",
    "States.Base64Decode",
    "States.UUID",
];

/// The namespace of the UUIDs `States.UUID(args)` names (a version 4 UUID drawn once for it).
const UUID_NAMESPACE: uuid::Uuid = uuid::uuid!("5d3c1c56-8a43-4f5e-9b7a-2f6a0e4c9d21");

/// The most characters `States.Hash` and `States.Base64Encode`/`Decode` take (Step Functions').
const MAX_ENCODED_CHARS: usize = 10_000;

/// A parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub function: String,
    pub args: Vec<Arg>,
}

/// One argument of a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// A string as written between its quotes, escapes kept (`States.Format` reads `\{` as a
    /// brace, `{}` as a place for an argument).
    Text(String),
    Value(Value),
    Path(DataPath),
    Call(Call),
}

/// Whether a `.$` value is a call rather than a path.
pub fn is_call(text: &str) -> bool {
    text.trim_start().starts_with("States.")
}

impl Call {
    /// Parse `States.Name(args)`; `path` parses each path argument (task or answer paths).
    pub fn parse(text: &str, path: &dyn Fn(&str) -> Result<DataPath, String>) -> Result<Call, String> {
        Self::parse_with(text, &|p| path(p).map(Arg::Path))
    }

    /// Parse `States.Name(args)`, each path argument (`$…`) made an argument by `path` (a path
    /// of another document rewritten, a value known already).
    pub fn parse_with(text: &str, path: &dyn Fn(&str) -> Result<Arg, String>) -> Result<Call, String> {
        let mut p = Parser { s: text.trim().as_bytes(), at: 0, path };
        let call = p.call()?;
        p.blank();
        if p.at != p.s.len() {
            return Err(format!("{text:?}: unexpected text after the call at {}", p.at));
        }
        Ok(call)
    }

    /// Every path the call reads.
    pub fn paths(&self) -> Vec<&DataPath> {
        self.args
            .iter()
            .flat_map(|a| match a {
                Arg::Path(p) => vec![p],
                Arg::Call(c) => c.paths(),
                Arg::Value(_) | Arg::Text(_) => Vec::new(),
            })
            .collect()
    }

    /// The call's value, its paths read by `look` (`None` when the call fails).
    pub fn eval(&self, look: &dyn Fn(&DataPath) -> Option<Value>) -> Option<Value> {
        if self.function == "States.Format" {
            let rest =
                self.args.get(1..).unwrap_or_default().iter().map(|a| arg(a, look)).collect::<Option<Vec<_>>>()?;
            return match self.args.first()? {
                Arg::Text(raw) => format(raw, &rest),
                other => match arg(other, look)? {
                    Value::String(template) => format(&template, &rest),
                    _ => None,
                },
            };
        }
        let args: Vec<Value> = self.args.iter().map(|a| arg(a, look)).collect::<Option<_>>()?;
        apply(&self.function, &args)
    }

    /// Written back as read (paths as their text, strings quoted).
    pub fn to_text(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Text(raw) => format!("'{raw}'"),
                Arg::Value(Value::String(s)) => quote(s),
                Arg::Value(v) => v.to_string(),
                Arg::Path(p) => p.as_str().to_owned(),
                Arg::Call(c) => c.to_text(),
            })
            .collect();
        format!("{}({})", self.function, args.join(", "))
    }
}

fn arg(a: &Arg, look: &dyn Fn(&DataPath) -> Option<Value>) -> Option<Value> {
    match a {
        Arg::Text(t) => Some(Value::String(unescape(t))),
        Arg::Value(v) => Some(v.clone()),
        Arg::Path(p) => look(p),
        Arg::Call(c) => c.eval(look),
    }
}

/// A string argument's characters, its escapes read.
fn unescape(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// `States.Format`: each `{}` of the raw template takes the next argument; `\{` is a brace.
fn format(raw: &str, args: &[Value]) -> Option<Value> {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '{' if chars.peek() == Some(&'}') => {
                chars.next();
                match args.next()? {
                    Value::String(s) => out.push_str(s),
                    v @ (Value::Number(_) | Value::Bool(_) | Value::Null) => out.push_str(&v.to_string()),
                    _ => return None,
                }
            }
            c => out.push(c),
        }
    }
    if args.next().is_some() {
        return None;
    }
    Some(Value::String(out))
}

/// A string as an intrinsic function's argument: `'it\'s'`.
pub fn quote(s: &str) -> String {
    let mut out = String::from("'");
    for c in s.chars() {
        if matches!(c, '\'' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    path: &'a dyn Fn(&str) -> Result<Arg, String>,
}

impl Parser<'_> {
    fn blank(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn text(&self, from: usize) -> String {
        String::from_utf8_lossy(&self.s[from..self.at]).into_owned()
    }

    fn call(&mut self) -> Result<Call, String> {
        let start = self.at;
        while self.at < self.s.len() && (self.s[self.at].is_ascii_alphanumeric() || self.s[self.at] == b'.') {
            self.at += 1;
        }
        let function = self.text(start);
        if !FUNCTIONS.contains(&function.as_str()) {
            return Err(match function.as_str() {
                "States.MathRandom" => {
                    format!("{function} is not supported: its value would change each time the step's request is made")
                }
                f if f.starts_with("States.") => format!("{f} is not supported (yet)"),
                f => format!("{f:?} is not an intrinsic function"),
            });
        }
        self.blank();
        if self.s.get(self.at) != Some(&b'(') {
            return Err(format!("{function}: expected ("));
        }
        self.at += 1;
        let mut args = Vec::new();
        loop {
            self.blank();
            if self.s.get(self.at) == Some(&b')') && args.is_empty() {
                self.at += 1;
                break;
            }
            args.push(self.arg()?);
            self.blank();
            match self.s.get(self.at) {
                Some(b',') => self.at += 1,
                Some(b')') => {
                    self.at += 1;
                    break;
                }
                _ => return Err(format!("{function}: expected , or ) at {}", self.at)),
            }
        }
        if function == "States.UUID" && args.is_empty() {
            return Err(
                "States.UUID() is not supported: its value would change each time the step's request is made; \
                 name the UUID by what makes it unique, States.UUID($.task.id, 'ticket') (the same on every attempt)"
                    .into(),
            );
        }
        Ok(Call { function, args })
    }

    fn arg(&mut self) -> Result<Arg, String> {
        match self.s.get(self.at) {
            Some(b'\'') => {
                self.at += 1;
                let start = self.at;
                loop {
                    match self.s.get(self.at) {
                        None => return Err("an unclosed string".into()),
                        Some(b'\\') => self.at += 2,
                        Some(b'\'') => break,
                        Some(_) => self.at += 1,
                    }
                }
                let raw = self.text(start);
                self.at += 1;
                Ok(Arg::Text(raw))
            }
            Some(b'$') => {
                let start = self.at;
                let mut depth = 0;
                while let Some(&c) = self.s.get(self.at) {
                    match c {
                        b'[' => depth += 1,
                        b']' => depth -= 1,
                        b',' | b')' if depth == 0 => break,
                        _ => {}
                    }
                    self.at += 1;
                }
                let text = self.text(start);
                (self.path)(text.trim())
            }
            Some(b'S') => self.call().map(Arg::Call),
            _ => {
                let start = self.at;
                while let Some(&c) = self.s.get(self.at) {
                    if c == b',' || c == b')' || c.is_ascii_whitespace() {
                        break;
                    }
                    self.at += 1;
                }
                let text = self.text(start);
                serde_json::from_str::<Value>(&text)
                    .ok()
                    .filter(|v| !v.is_object() && !v.is_array() && !v.is_string())
                    .map(Arg::Value)
                    .ok_or_else(|| {
                        format!(
                            "{text:?} is not an argument (a 'string', a number, true, false, null, a path or a call)"
                        )
                    })
            }
        }
    }
}

/// A whole number (`3` or `3.0`, within ±2^53 as JSON numbers are exact).
fn int(v: &Value) -> Option<i64> {
    #[allow(clippy::cast_possible_truncation)] // whole and within 2^53: exact
    v.as_i64()
        .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0).map(|f| f as i64))
}

fn apply(f: &str, a: &[Value]) -> Option<Value> {
    Some(match (f, a) {
        ("States.UUID", args) if !args.is_empty() => Value::String(
            uuid::Uuid::new_v5(&UUID_NAMESPACE, Value::Array(args.to_vec()).to_string().as_bytes()).to_string(),
        ),
        ("States.StringToJson", [Value::String(s)]) => serde_json::from_str(s).ok()?,
        ("States.JsonToString", [v]) => Value::String(v.to_string()),
        ("States.Array", args) => Value::Array(args.to_vec()),
        ("States.ArrayPartition", [Value::Array(items), n]) => {
            let n = usize::try_from(int(n)?).ok().filter(|n| *n > 0)?;
            Value::Array(items.chunks(n).map(|c| Value::Array(c.to_vec())).collect())
        }
        ("States.ArrayContains", [Value::Array(items), v]) => Value::Bool(items.contains(v)),
        ("States.ArrayRange", [from, to, step]) => {
            let (from, to, step) = (int(from)?, int(to)?, int(step)?);
            if step == 0 {
                return None;
            }
            let mut out = Vec::new();
            let mut i = from;
            while (step > 0 && i <= to) || (step < 0 && i >= to) {
                out.push(Value::from(i));
                if out.len() > 1000 {
                    return None;
                }
                i += step;
            }
            Value::Array(out)
        }
        ("States.ArrayGetItem", [Value::Array(items), i]) => items.get(usize::try_from(int(i)?).ok()?)?.clone(),
        ("States.ArrayLength", [Value::Array(items)]) => Value::from(items.len()),
        ("States.ArrayUnique", [Value::Array(items)]) => {
            let mut out: Vec<Value> = Vec::new();
            for v in items {
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            Value::Array(out)
        }
        ("States.JsonMerge", [Value::Object(a), Value::Object(b), Value::Bool(false)]) => {
            let mut out: Map<String, Value> = a.clone();
            out.extend(b.iter().map(|(k, v)| (k.clone(), v.clone())));
            Value::Object(out)
        }
        ("States.MathAdd", [x, y]) => Value::from(int(x)?.checked_add(int(y)?)?),
        ("States.StringSplit", [Value::String(s), Value::String(sep)]) => {
            let seps: Vec<char> = sep.chars().collect();
            Value::Array(
                s.split(|c| seps.contains(&c)).filter(|p| !p.is_empty()).map(|p| Value::String(p.to_owned())).collect(),
            )
        }
        ("States.Hash", [Value::String(data), Value::String(algorithm)])
            if data.chars().count() <= MAX_ENCODED_CHARS =>
        {
            Value::String(hash(data.as_bytes(), algorithm)?)
        }
        ("States.Base64Encode", [Value::String(s)]) if s.chars().count() <= MAX_ENCODED_CHARS => {
            Value::String(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s))
        }
        ("States.Base64Decode", [Value::String(s)]) if s.len() <= MAX_ENCODED_CHARS => {
            let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, s).ok()?;
            Value::String(String::from_utf8(bytes).ok()?)
        }
        _ => return None,
    })
}

/// `data`'s digest by one of `States.Hash`'s algorithms, in lowercase hex.
fn hash(data: &[u8], algorithm: &str) -> Option<String> {
    use sha2::Digest;
    Some(match algorithm {
        "MD5" => hex::encode(md5::Md5::digest(data)),
        "SHA-1" => hex::encode(sha1::Sha1::digest(data)),
        "SHA-256" => hex::encode(sha2::Sha256::digest(data)),
        "SHA-384" => hex::encode(sha2::Sha384::digest(data)),
        "SHA-512" => hex::encode(sha2::Sha512::digest(data)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(text: &str, input: &Value) -> Option<Value> {
        let call = Call::parse(text, &DataPath::parse).unwrap();
        assert_eq!(
            Call::parse(&call.to_text(), &DataPath::parse).unwrap(),
            call,
            "written back as read: {}",
            call.to_text()
        );
        call.eval(&|p| {
            let root = json!({"input": input});
            p.resolve_in(&root).cloned()
        })
    }

    #[test]
    fn the_intrinsic_functions_compute_as_the_states_language_says() {
        let input = json!({"name": "Ada", "n": 3, "list": [1, 2, 2, 3], "doc": "{\"a\":1}", "o": {"a": 1, "b": 2}});
        assert_eq!(
            eval("States.Format('Hello {}, {} \\'items\\'', $.input.name, $.input.n)", &input),
            Some(json!("Hello Ada, 3 'items'"))
        );
        assert_eq!(eval("States.StringToJson($.input.doc)", &input), Some(json!({"a": 1})));
        assert_eq!(eval("States.JsonToString($.input.o)", &input), Some(json!("{\"a\":1,\"b\":2}")));
        assert_eq!(eval("States.Array('a', 1, $.input.n, null)", &input), Some(json!(["a", 1, 3, null])));
        assert_eq!(eval("States.ArrayPartition($.input.list, 3)", &input), Some(json!([[1, 2, 2], [3]])));
        assert_eq!(eval("States.ArrayContains($.input.list, 3)", &input), Some(json!(true)));
        assert_eq!(eval("States.ArrayRange(1, 9, 3)", &input), Some(json!([1, 4, 7])));
        assert_eq!(eval("States.ArrayGetItem($.input.list, 1)", &input), Some(json!(2)));
        assert_eq!(eval("States.ArrayLength($.input.list)", &input), Some(json!(4)));
        // the digests of "abc" (FIPS 180 and RFC 1321 test vectors)
        for (algorithm, digest) in [
            ("MD5", "900150983cd24fb0d6963f7d28e17f72"),
            ("SHA-1", "a9993e364706816aba3e25717850c26c9cd0d89d"),
            ("SHA-256", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ] {
            assert_eq!(eval(&format!("States.Hash('abc', '{algorithm}')"), &input), Some(json!(digest)), "{algorithm}");
        }
        assert_eq!(eval("States.Hash($.input.name, 'SHA-512')", &input).unwrap().as_str().unwrap().len(), 128);
        assert_eq!(eval("States.Hash($.input.name, 'SHA-384')", &input).unwrap().as_str().unwrap().len(), 96);
        assert_eq!(eval("States.Hash('abc', 'CRC32')", &input), None, "an algorithm Step Functions does not take");
        assert_eq!(eval("States.Base64Encode('Data to encode')", &input), Some(json!("RGF0YSB0byBlbmNvZGU=")));
        assert_eq!(eval("States.Base64Decode('RGF0YSB0byBlbmNvZGU=')", &input), Some(json!("Data to encode")));
        assert_eq!(eval("States.Base64Decode('not base64!')", &input), None);
        assert_eq!(eval("States.Base64Encode($.input.n)", &input), None, "a string only");
        assert_eq!(eval("States.ArrayUnique($.input.list)", &input), Some(json!([1, 2, 3])));
        assert_eq!(
            eval("States.JsonMerge($.input.o, States.StringToJson('\\{\"b\": 5\\}'), false)", &input),
            Some(json!({"a": 1, "b": 5}))
        );
        assert_eq!(eval("States.MathAdd($.input.n, -5)", &input), Some(json!(-2)));
        assert_eq!(eval("States.StringSplit('a,b, c', ', ')", &input), Some(json!(["a", "b", "c"])));
        // a UUID named by its arguments: the same for the same names, another for others
        let uuid = eval("States.UUID($.input.name, 'ticket')", &input).unwrap();
        let text = uuid.as_str().unwrap();
        assert!(text.len() == 36 && text.as_bytes()[14] == b'5', "a version 5 UUID: {text}");
        assert_eq!(eval("States.UUID($.input.name, 'ticket')", &input), Some(uuid.clone()), "read again");
        assert_ne!(eval("States.UUID($.input.name, 'order')", &input), Some(uuid.clone()));
        assert_ne!(eval("States.UUID($.input.n, 'ticket')", &input), Some(uuid));
        // failures give nothing (the template gives null)
        assert_eq!(eval("States.ArrayGetItem($.input.list, 9)", &input), None);
        assert_eq!(eval("States.MathAdd($.input.name, 1)", &input), None);
        assert_eq!(eval("States.Format('{} {}', $.input.n)", &input), None);
    }

    #[test]
    fn calls_that_cannot_be_read_say_why() {
        let err = |t: &str| Call::parse(t, &DataPath::parse).unwrap_err();
        assert!(err("States.UUID()").contains("would change"));
        assert!(err("States.MathRandom(1, 9)").contains("would change"));
        assert!(err("States.Encrypt($.input.a)").contains("not supported"));
        assert!(err("States.Format('x'").contains("expected"));
        assert!(err("States.Format($.nowhere)").contains("$.nowhere"));
        assert!(err("States.Array({})").contains("not an argument"));
    }
}
