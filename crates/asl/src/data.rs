//! The States Language's data flow, worked out when a definition is imported: each state's input
//! and output as a [`Sym`], a value built from the task's input, the steps' outputs and constants.
//! `InputPath`, `Parameters`, `ResultSelector`, `ResultPath` and `OutputPath` are applied to it
//! here, so the workflow reads its data where it lives (`$.input…`, `$.outputs.<step>…`) and keeps
//! no copy of the document a state machine passes from state to state.

use serde_json::{Map, Value};

use sas_protocol::condition::Condition;

/// A segment of a reference path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Name(String),
    Index(usize),
}

/// Parse a States Language reference path (`$`, `$.a.b`, `$['a b'][0]`, and the forms of AWS's
/// own examples: `$.['a b']`, `$.[0].body`, `$.items[0]`); what it cannot be (a wildcard, a slice,
/// a filter, `..`) is refused: a reference path names one value. A quoted name may hold any
/// character, `\'`, `\"` and `\\` escaped.
pub fn parse_path(text: &str) -> Result<Vec<Seg>, String> {
    let bad = |why: &str| Err(format!("path {text:?}: {why}"));
    if text.starts_with("$$") {
        return bad("the context object ($$) is not read here, only the state's input");
    }
    let Some(rest) = text.strip_prefix('$') else { return bad("a path starts with $") };
    if variable_of(text).is_some() {
        return bad(
            "a variable ($name) is read here in Parameters, ResultSelector, ItemSelector, Assign, a Choice rule and \
             an intrinsic function's arguments, not in a path field (InputPath, OutputPath, ItemsPath...)",
        );
    }
    let chars: Vec<char> = rest.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('.', Some('.')) => return bad("`..` names many values; a reference path names one"),
            // `$.['a b']`, `$.[0]`: a dot before a bracket, as AWS's examples write it
            ('.', Some('[')) => i += 1,
            ('.', _) => {
                let end = chars[i + 1..].iter().position(|c| *c == '.' || *c == '[').map_or(chars.len(), |e| i + 1 + e);
                let name: String = chars[i + 1..end].iter().collect();
                if name.is_empty() || name == "*" {
                    return bad("a wildcard or an empty name names no one value");
                }
                out.push(Seg::Name(name));
                i = end;
            }
            ('[', _) => {
                i += 1;
                while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                    i += 1;
                }
                match chars.get(i) {
                    Some(&q) if q == '\'' || q == '"' => {
                        let mut name = String::new();
                        i += 1;
                        loop {
                            match chars.get(i) {
                                None => return bad("an unclosed quoted name"),
                                Some('\\') => {
                                    match chars.get(i + 1) {
                                        Some(&c) if c == '\\' || c == '\'' || c == '"' || c == '/' => name.push(c),
                                        _ => return bad("a quoted name escapes only \\, ' and \""),
                                    }
                                    i += 2;
                                }
                                Some(&c) if c == q => {
                                    i += 1;
                                    break;
                                }
                                Some(&c) => {
                                    name.push(c);
                                    i += 1;
                                }
                            }
                        }
                        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                            i += 1;
                        }
                        if chars.get(i) != Some(&']') {
                            return bad("a quoted name in [ ] is one name, then ]");
                        }
                        out.push(Seg::Name(name));
                        i += 1;
                    }
                    _ => {
                        let Some(end) = chars[i..].iter().position(|c| *c == ']').map(|e| i + e) else {
                            return bad("an unclosed [");
                        };
                        let inner: String = chars[i..end].iter().collect();
                        let inner = inner.trim();
                        match inner.parse::<usize>() {
                            Ok(n) if !inner.starts_with('+') => out.push(Seg::Index(n)),
                            _ => {
                                return bad(&format!(
                                    "[{inner}] (a wildcard, a slice, a filter or a negative index) names no one value"
                                ))
                            }
                        }
                        i = end + 1;
                    }
                }
            }
            _ => return bad("expected . or [ after a name"),
        }
    }
    Ok(out)
}

/// A path's text from its root and segments (`$.input.a['b c'][0]`).
pub fn path_text(root: &str, segs: &[Seg]) -> String {
    let mut s = root.to_owned();
    for seg in segs {
        match seg {
            Seg::Name(n)
                if n.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                s.push('.');
                s.push_str(n);
            }
            Seg::Name(n) => {
                s.push_str("['");
                s.push_str(&n.replace('\\', "\\\\").replace('\'', "\\'"));
                s.push_str("']");
            }
            Seg::Index(i) => {
                s.push('[');
                s.push_str(&i.to_string());
                s.push(']');
            }
        }
    }
    s
}

/// A value as the import knows it: constant, or read from the task when the step runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Sym {
    /// A constant (`Result` of a Pass state, literal `Parameters`).
    Lit(Value),
    /// What a path of the task names: `$.input…`, `$.outputs.<step>…` (or, in an answer, `$…`).
    Ref(String),
    /// An object built member by member.
    Obj(Vec<(String, Sym)>),
    /// An array built element by element (a Parallel state's branches).
    Arr(Vec<Sym>),
    /// The object a path names with members added or replaced (`ResultPath` into it).
    Over(String, Vec<(String, Sym)>),
    /// One of several values, by the way the task came (a state reached from several states):
    /// the first whose decision holds.
    Choose(Vec<(Cond, Sym)>),
    /// An intrinsic function's value: the call with its paths rewritten, and those paths.
    Call(String, Vec<String>),
}

impl Sym {
    /// One of `ways` (a decision and the value that way), alike values merged.
    pub fn one_of(ways: Vec<(Cond, Sym)>) -> Sym {
        let mut out: Vec<(Cond, Sym)> = Vec::new();
        for (c, v) in ways {
            match out.iter_mut().find(|(_, x)| *x == v) {
                Some((oc, _)) => *oc = oc.clone().or(c),
                None => out.push((c, v)),
            }
        }
        if out.len() == 1 {
            return out.remove(0).1;
        }
        Sym::Choose(out)
    }
}

fn with(root: &str, segs: &[Seg]) -> String {
    if segs.is_empty() {
        return root.to_owned();
    }
    let mut base = path_text("$", segs);
    base.replace_range(0..1, root);
    base
}

impl Sym {
    /// The part of the value a path names.
    pub fn get(&self, segs: &[Seg]) -> Result<Sym, String> {
        let Some((first, rest)) = segs.split_first() else { return Ok(self.clone()) };
        match (self, first) {
            (Sym::Call(text, _), _) => Err(format!(
                "{} reads into the value of {text}, which is known only when the step runs",
                path_text("$", segs)
            )),
            // the part read on each way (the same part on every way: that part alone)
            (Sym::Choose(ways), _) => {
                Ok(Sym::one_of(ways.iter().map(|(c, x)| Ok((c.clone(), x.get(segs)?))).collect::<Result<_, String>>()?))
            }
            // the array of the values a path names: read as a whole, not into (a path's next
            // segment would apply to each value, not to the array)
            (Sym::Ref(p), _) if split_many(p).is_some() => Err(format!(
                "{} reads into the array of the values {p} names, which is not read here",
                path_text("$", segs)
            )),
            (Sym::Ref(p), _) => Ok(Sym::Ref(with(p, segs))),
            (Sym::Lit(v), _) => {
                let mut at = v;
                for s in segs {
                    at = match (at, s) {
                        (Value::Object(m), Seg::Name(n)) => m.get(n),
                        (Value::Array(a), Seg::Index(i)) => a.get(*i),
                        _ => None,
                    }
                    .ok_or_else(|| format!("{} names nothing in the constant {v}", path_text("$", segs)))?;
                }
                Ok(Sym::Lit(at.clone()))
            }
            (Sym::Obj(m), Seg::Name(n)) => match m.iter().find(|(k, _)| k == n) {
                Some((_, x)) => x.get(rest),
                None => Err(format!("{} names nothing: the value there has only {}", path_text("$", segs), keys(m))),
            },
            (Sym::Over(base, m), Seg::Name(n)) => match m.iter().find(|(k, _)| k == n) {
                Some((_, x)) => x.get(rest),
                None => Ok(Sym::Ref(with(base, segs))),
            },
            (Sym::Arr(a), Seg::Index(i)) => match a.get(*i) {
                Some(x) => x.get(rest),
                None => Err(format!("[{i}] names nothing: the array has {} elements", a.len())),
            },
            _ => Err(format!("{} names nothing: the value there is not of that shape", path_text("$", segs))),
        }
    }

    /// The value with `value` put where a `ResultPath` says.
    pub fn set(self, segs: &[Seg], value: Sym) -> Result<Sym, String> {
        let Some((first, rest)) = segs.split_first() else { return Ok(value) };
        let Seg::Name(n) = first else { return Err("a ResultPath takes names, not indexes".into()) };
        let put = |m: &mut Vec<(String, Sym)>, start: Sym| -> Result<(), String> {
            let inner = match m.iter().position(|(k, _)| k == n) {
                Some(i) => m.remove(i).1,
                None => start,
            };
            m.push((n.clone(), inner.set(rest, value.clone())?));
            Ok(())
        };
        match self {
            Sym::Obj(mut m) => {
                put(&mut m, Sym::Obj(Vec::new()))?;
                Ok(Sym::Obj(m))
            }
            Sym::Over(base, mut m) => {
                let start = Sym::Ref(with(&base, std::slice::from_ref(first)));
                put(&mut m, start)?;
                Ok(Sym::Over(base, m))
            }
            Sym::Ref(p) => {
                let mut m = Vec::new();
                put(&mut m, Sym::Ref(with(&p, std::slice::from_ref(first))))?;
                Ok(Sym::Over(p, m))
            }
            Sym::Lit(Value::Object(o)) => {
                Sym::Obj(o.into_iter().map(|(k, v)| (k, Sym::Lit(v))).collect()).set(segs, value)
            }
            Sym::Choose(ways) => Ok(Sym::Choose(
                ways.into_iter().map(|(c, x)| Ok((c, x.set(segs, value.clone())?))).collect::<Result<_, String>>()?,
            )),
            Sym::Lit(other) => Err(format!("a ResultPath cannot add a member to {other}, which is not an object")),
            Sym::Arr(_) => Err("a ResultPath cannot add a member to an array".into()),
            Sym::Call(text, _) => {
                Err(format!("a ResultPath cannot add a member to the value of {text}, known only when the step runs"))
            }
        }
    }

    /// Every `$…` path in an answer's value, moved to `root` (`$.outputs.charge`).
    #[must_use]
    pub fn rebased(&self, root: &str) -> Sym {
        let move_path = |p: &str| format!("{root}{}", &p[1..]);
        match self {
            Sym::Lit(v) => Sym::Lit(v.clone()),
            Sym::Ref(p) => Sym::Ref(move_path(p)),
            Sym::Obj(m) => Sym::Obj(m.iter().map(|(k, x)| (k.clone(), x.rebased(root))).collect()),
            Sym::Arr(a) => Sym::Arr(a.iter().map(|x| x.rebased(root)).collect()),
            Sym::Over(b, m) => Sym::Over(move_path(b), m.iter().map(|(k, x)| (k.clone(), x.rebased(root))).collect()),
            Sym::Choose(ways) => Sym::Choose(ways.iter().map(|(c, x)| (c.clone(), x.rebased(root))).collect()),
            Sym::Call(t, p) => Sym::Call(t.clone(), p.clone()),
        }
    }

    /// The value as a template of this project's (`parameters`, `result_selector`, `result`).
    pub fn template(&self) -> Result<Value, String> {
        match self {
            Sym::Obj(m) => Ok(Value::Object(members(m)?)),
            Sym::Ref(p) => Ok(serde_json::json!({"*.$": p})),
            Sym::Over(b, m) => {
                let mut o = Map::new();
                o.insert("*.$".into(), Value::String(b.clone()));
                o.extend(members(m)?);
                Ok(Value::Object(o))
            }
            Sym::Lit(Value::Object(o)) => {
                check_literal(&Value::Object(o.clone()))?;
                Ok(Value::Object(o.clone()))
            }
            Sym::Lit(v) => {
                check_literal(v)?;
                Ok(serde_json::json!({"*": v}))
            }
            Sym::Arr(_) => Ok(serde_json::json!({"*": self.nested()?})),
            Sym::Call(text, _) => Ok(serde_json::json!({"*.$": text})),
            Sym::Choose(ways) => {
                let mut list = Vec::new();
                for (c, x) in ways {
                    match c {
                        Cond::False => {}
                        Cond::True => list.push(serde_json::json!({"value": x.nested()?})),
                        Cond::When(w) => list.push(serde_json::json!({"when": w, "value": x.nested()?})),
                    }
                }
                Ok(serde_json::json!({"*.choose": list}))
            }
        }
    }

    fn nested(&self) -> Result<Value, String> {
        match self {
            Sym::Lit(v) => {
                check_literal(v)?;
                Ok(v.clone())
            }
            Sym::Arr(a) => Ok(Value::Array(a.iter().map(Sym::nested).collect::<Result<_, _>>()?)),
            other => other.template(),
        }
    }

    /// The value, when it is known at import (every part a constant).
    pub fn constant(&self) -> Option<Value> {
        match self {
            Sym::Lit(v) => Some(v.clone()),
            Sym::Obj(m) => m
                .iter()
                .map(|(k, x)| Some((k.clone(), x.constant()?)))
                .collect::<Option<Map<_, _>>>()
                .map(Value::Object),
            Sym::Arr(a) => a.iter().map(Sym::constant).collect::<Option<Vec<_>>>().map(Value::Array),
            _ => None,
        }
    }

    /// Every path the value reads.
    pub fn paths(&self) -> Vec<&str> {
        match self {
            Sym::Lit(_) => Vec::new(),
            Sym::Ref(p) => vec![p.as_str()],
            Sym::Obj(m) => m.iter().flat_map(|(_, x)| x.paths()).collect(),
            Sym::Arr(a) => a.iter().flat_map(Sym::paths).collect(),
            Sym::Over(b, m) => std::iter::once(b.as_str()).chain(m.iter().flat_map(|(_, x)| x.paths())).collect(),
            Sym::Choose(ways) => ways.iter().flat_map(|(_, x)| x.paths()).collect(),
            Sym::Call(_, paths) => paths.iter().map(String::as_str).collect(),
        }
    }
}

fn keys(m: &[(String, Sym)]) -> String {
    if m.is_empty() {
        return "no members".into();
    }
    m.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ")
}

fn members(m: &[(String, Sym)]) -> Result<Map<String, Value>, String> {
    let mut o = Map::new();
    for (k, x) in m {
        match x {
            Sym::Ref(p) => o.insert(format!("{k}.$"), Value::String(p.clone())),
            Sym::Call(text, _) => o.insert(format!("{k}.$"), Value::String(text.clone())),
            other => o.insert(k.clone(), other.nested()?),
        };
    }
    Ok(o)
}

/// A constant that this project's templates would read as a path (`"x.$"`, `"*"`) cannot be written
/// as one.
fn check_literal(v: &Value) -> Result<(), String> {
    match v {
        Value::Object(o) => {
            if let Some(k) = o.keys().find(|k| k.ends_with(".$") || k.as_str() == "*") {
                return Err(format!("the constant member {k:?} would be read as a path"));
            }
            o.values().try_for_each(check_literal)
        }
        Value::Array(a) => a.iter().try_for_each(check_literal),
        _ => Ok(()),
    }
}

/// A decision as the import knows it: always, never, or a guard of this project's.
#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    True,
    False,
    When(Value),
}

impl Cond {
    #[must_use]
    pub fn and(self, other: Cond) -> Cond {
        match (self, other) {
            (Cond::False, _) | (_, Cond::False) => Cond::False,
            (Cond::True, x) | (x, Cond::True) => x,
            // a decision and its opposite: never both
            (Cond::When(a), Cond::When(b)) if opposite(&a, &b) => Cond::False,
            (Cond::When(a), Cond::When(b)) => Cond::When(joined("and", a, b)),
        }
    }

    #[must_use]
    pub fn or(self, other: Cond) -> Cond {
        match (self, other) {
            (Cond::True, _) | (_, Cond::True) => Cond::True,
            (Cond::False, x) | (x, Cond::False) => x,
            (Cond::When(a), Cond::When(b)) if a == b => Cond::When(a),
            // a decision or its opposite: always (the ways out of a Choice joined again)
            (Cond::When(a), Cond::When(b)) if opposite(&a, &b) => Cond::True,
            (Cond::When(a), Cond::When(b)) => Cond::When(joined("or", a, b)),
        }
    }

    #[must_use]
    pub fn negated(self) -> Cond {
        match self {
            Cond::True => Cond::False,
            Cond::False => Cond::True,
            Cond::When(Value::Object(mut o)) if o.len() == 1 && o.contains_key("not") => {
                Cond::When(o.remove("not").unwrap_or(Value::Null))
            }
            Cond::When(x) => Cond::When(serde_json::json!({"not": x})),
        }
    }
}

/// Whether one guard is the other's `not` (a guard holds or not: a missing value makes a
/// comparison false, and its `not` true).
fn opposite(a: &Value, b: &Value) -> bool {
    let not_of = |x: &Value, y: &Value| x.as_object().is_some_and(|o| o.len() == 1 && o.get("not") == Some(y));
    not_of(a, b) || not_of(b, a)
}

/// `a` and `b` joined by `and` or `or`, a join of the same kind flattened into the list.
fn joined(how: &str, a: Value, b: Value) -> Value {
    let mut parts = Vec::new();
    for x in [a, b] {
        match x {
            Value::Object(mut o) if o.len() == 1 && o.contains_key(how) => {
                if let Some(Value::Array(xs)) = o.remove(how) {
                    parts.extend(xs);
                }
            }
            x => parts.push(x),
        }
    }
    serde_json::json!({ how: parts })
}

/// The comparison operators of a Choice rule, as this project spells them.
const OPERATORS: &[&str] = &[
    "StringEquals",
    "StringLessThan",
    "StringGreaterThan",
    "StringLessThanEquals",
    "StringGreaterThanEquals",
    "StringMatches",
    "NumericEquals",
    "NumericLessThan",
    "NumericGreaterThan",
    "NumericLessThanEquals",
    "NumericGreaterThanEquals",
    "BooleanEquals",
    "TimestampEquals",
    "TimestampLessThan",
    "TimestampGreaterThan",
    "TimestampLessThanEquals",
    "TimestampGreaterThanEquals",
    "IsPresent",
    "IsNull",
    "IsNumeric",
    "IsString",
    "IsBoolean",
    "IsTimestamp",
];

fn snake(name: &str) -> String {
    let mut s = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

/// The variables (`Assign`) set on the way to a state: what each holds, as the import knows it.
pub type Vars = std::collections::BTreeMap<String, Sym>;

/// The name of the variable a path reads (`$name`, `$name.a`, `$name[0]`), if it reads one.
fn variable_of(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('$')?;
    if !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let end = rest.find(['.', '[']).unwrap_or(rest.len());
    Some((&rest[..end], &rest[end..]))
}

/// The value a path names: a part of the state's input (`$…`), or of a variable (`$name…`).
pub fn lookup(path: &str, doc: &Sym, vars: &Vars) -> Result<Sym, String> {
    match variable_of(path) {
        Some((name, rest)) => {
            let value = vars.get(name).ok_or_else(|| {
                format!(
                    "{path}: the variable ${name} is not set on every way to this state (by an Assign before it; a \
                     Map's processor and a loop's states, workflows of their own here, read only the variables they set)"
                )
            })?;
            get(value, &format!("${rest}"))
        }
        None => get(doc, path),
    }
}

/// What `path` names in `value`: one value, or, for a path that names many from a segment on (a
/// wildcard, a slice, a filter, `..`: `$.Versions[*].Version`, `$.List[1:]`), their array, read
/// where the value lives (a path of the task that names many: templates read it as Step Functions
/// does) or worked out now (a constant).
pub fn get(value: &Sym, path: &str) -> Result<Sym, String> {
    let one = match parse_path(path) {
        Ok(segs) => return value.get(&segs),
        Err(e) => e,
    };
    let Some((head, rest)) = split_many(path) else { return Err(one) };
    many(&value.get(&parse_path(head)?)?, rest).map_err(|e| format!("path {path:?}: {e}"))
}

/// The values `rest` (a path's part that names many: `[*].id`) names in `at`.
fn many(at: &Sym, rest: &str) -> Result<Sym, String> {
    match at {
        Sym::Ref(p) => {
            let text = format!("{p}{rest}");
            // the query checked here (its root is the importer's)
            sas_protocol::condition::DataPath::parse_relative_many(&text)?;
            Ok(Sym::Ref(text))
        }
        Sym::Lit(v) => sas_protocol::condition::query_values(v, &format!("${rest}")).map(Sym::Lit),
        Sym::Choose(ways) => {
            Ok(Sym::Choose(ways.iter().map(|(c, x)| Ok((c.clone(), many(x, rest)?))).collect::<Result<_, String>>()?))
        }
        _ => Err(format!("{rest} names many values of a value the state machine builds, which is not read here")),
    }
}

/// A path cut where it starts naming many values: the part before (names and indexes) and the
/// rest (`$.a.b` and `[*].c` of `$.a.b[*].c`); none when every segment names one value.
fn split_many(path: &str) -> Option<(&str, &str)> {
    let b = path.as_bytes();
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'.' if b.get(i + 1) == Some(&b'.') || b.get(i + 1) == Some(&b'*') => {
                return Some((&path[..i], &path[i..]))
            }
            b'[' => {
                // a quoted name is one value; [*], [?...], [1:], [0,1], [-1] name many
                let inner = path[i + 1..].trim_start();
                if inner.starts_with('\'') || inner.starts_with('"') {
                    let q = inner.as_bytes()[0];
                    let start = path.len() - inner.len() + 1;
                    let mut j = start;
                    while j < b.len() && b[j] != q {
                        j += if b[j] == b'\\' { 2 } else { 1 };
                    }
                    i = j + 1;
                    continue;
                }
                let end = path[i..].find(']').map_or(path.len(), |e| i + e);
                let sel = path[i + 1..end].trim();
                if sel.is_empty() || !sel.bytes().all(|c| c.is_ascii_digit()) {
                    return Some((&path[..i], &path[i..]));
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// A Choice rule (without its `Next`) as a decision over the task, its variables read in `doc`
/// (the state's input) and `vars`.
pub fn choice_rule(rule: &Map<String, Value>, doc: &Sym, vars: &Vars) -> Result<Cond, String> {
    // a document that depends on the way the task came: the rule decided on each way's
    if let Sym::Choose(ways) = doc {
        let mut out = Cond::False;
        for (c, v) in ways {
            out = out.or(c.clone().and(choice_rule(rule, v, vars)?));
        }
        return Ok(out);
    }
    for (op, join) in [("And", true), ("Or", false)] {
        if let Some(list) = rule.get(op) {
            let Value::Array(list) = list else { return Err(format!("{op} takes a list of rules")) };
            let mut out = if join { Cond::True } else { Cond::False };
            for r in list {
                let Value::Object(r) = r else { return Err(format!("{op} takes rules (objects)")) };
                let c = choice_rule(r, doc, vars)?;
                out = if join { out.and(c) } else { out.or(c) };
            }
            return Ok(out);
        }
    }
    if let Some(r) = rule.get("Not") {
        let Value::Object(r) = r else { return Err("Not takes a rule (an object)".into()) };
        return Ok(choice_rule(r, doc, vars)?.negated());
    }
    let Some(Value::String(variable)) = rule.get("Variable") else {
        return Err("a Choice rule needs Variable (or And, Or, Not)".into());
    };
    let ops: Vec<(&String, &Value)> =
        rule.iter().filter(|(k, _)| !matches!(k.as_str(), "Variable" | "Next" | "Comment" | "Assign")).collect();
    let [(op, operand)] = ops.as_slice() else {
        return Err(format!("a Choice rule takes one comparison, this one has {}", ops.len()));
    };
    let (base, by_path) = match op.strip_suffix("Path") {
        Some(b) if OPERATORS.contains(&b) && !b.starts_with("Is") => (b, true),
        _ if OPERATORS.contains(&op.as_str()) => (op.as_str(), false),
        _ => return Err(format!("{op} is not a comparison of the States Language")),
    };
    let mut operand = (*operand).clone();
    let mut key = snake(base);
    if by_path {
        let Value::String(p) = &operand else { return Err(format!("{op} takes a path")) };
        match lookup(p, doc, vars)? {
            Sym::Ref(p) => {
                key.push_str("_path");
                operand = Value::String(p);
            }
            Sym::Lit(v) => operand = v,
            _ => return Err(format!("{op} {p}: the value there is built by the state machine, not read")),
        }
    }
    let var = lookup(variable, doc, vars)?;
    compare(variable, op, &key, &operand, var)
}

/// One comparison of a Choice rule on the value its variable names.
fn compare(variable: &str, op: &str, key: &str, operand: &Value, var: Sym) -> Result<Cond, String> {
    if let Sym::Choose(ways) = var {
        // by the way the task came: that way's decision and the comparison of that way's value
        let mut out = Cond::False;
        for (c, v) in ways {
            out = out.or(c.and(compare(variable, op, key, operand, v)?));
        }
        return Ok(out);
    }
    let mut c = Map::new();
    c.insert(key.to_owned(), operand.clone());
    match var {
        Sym::Ref(p) => {
            c.insert("variable".into(), Value::String(p));
            let v = Value::Object(c);
            Condition::from_json(&v).map_err(|e| format!("Variable {variable}: {e}"))?;
            Ok(Cond::When(v))
        }
        // a constant: decided now, as the rule would decide at run time
        Sym::Lit(value) => {
            c.insert("variable".into(), Value::String("$.input".into()));
            let cond = Condition::from_json(&Value::Object(c)).map_err(|e| format!("Variable {variable}: {e}"))?;
            Ok(if cond.holds(&Known(value)) { Cond::True } else { Cond::False })
        }
        _ => {
            if op == "IsPresent" {
                return Ok(if *operand == Value::Bool(true) { Cond::True } else { Cond::False });
            }
            Err(format!("Variable {variable}: the value there is built by the state machine (an object or array), which {op} cannot compare"))
        }
    }
}

struct Known(Value);

impl sas_protocol::condition::Scope for Known {
    fn input(&self) -> &Value {
        &self.0
    }
    fn output(&self, _: &str) -> Option<&Value> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(s: &str) -> Vec<Seg> {
        parse_path(s).unwrap()
    }

    #[test]
    fn reference_paths_name_one_value() {
        assert_eq!(p("$"), vec![]);
        assert_eq!(p("$.a['b c'][2]"), vec![Seg::Name("a".into()), Seg::Name("b c".into()), Seg::Index(2)]);
        for bad in ["a.b", "$..a", "$.a[*]", "$.a[-1]", "$.*", "$.a[?(@.x)]"] {
            assert!(parse_path(bad).is_err(), "{bad}");
        }
        assert_eq!(path_text("$.input", &p("$.a['b c'][2]")), "$.input.a['b c'][2]");
    }

    #[test]
    fn bracket_paths_as_aws_s_examples_write_them_name_one_value() {
        let n = |s: &str| Seg::Name(s.into());
        assert_eq!(p("$.['a b']"), vec![n("a b")]);
        assert_eq!(p("$['a']"), vec![n("a")]);
        assert_eq!(p("$.[0].body"), vec![Seg::Index(0), n("body")]);
        assert_eq!(p("$.items[0]"), vec![n("items"), Seg::Index(0)]);
        assert_eq!(p("$.a.['b'].[1]"), vec![n("a"), n("b"), Seg::Index(1)]);
        assert_eq!(p(r#"$["x.y"][ 'c]d' ]"#), vec![n("x.y"), n("c]d")]);
        assert_eq!(p(r"$['it\'s']['back\\slash']"), vec![n("it's"), n("back\\slash")]);
        for bad in ["$.[*]", "$.['a'", "$[a]", "$.[-1]", "$.[]", "$['a' 'b']", "$[1:2]", r"$['\x']"] {
            assert!(parse_path(bad).is_err(), "{bad}");
        }
        // written back as a path this project's templates read (RFC 9535), the same names
        for text in ["$.['a b']", "$.[0].body", r"$['it\'s'].x", "$['1st']"] {
            let written = path_text("$.input", &p(text));
            sas_protocol::condition::DataPath::parse(&written).unwrap_or_else(|e| panic!("{text} -> {written}: {e}"));
            assert_eq!(p(&written)[1..], p(text)[..], "{written}");
        }
    }

    #[test]
    fn result_paths_add_to_what_a_state_read_and_paths_read_through_them() {
        let doc = Sym::Ref("$.input".into());
        let doc = doc.set(&p("$.quote"), Sym::Ref("$.outputs.q".into())).unwrap();
        assert_eq!(doc.get(&p("$.quote.id")).unwrap(), Sym::Ref("$.outputs.q.id".into()));
        assert_eq!(doc.get(&p("$.order")).unwrap(), Sym::Ref("$.input.order".into()));
        assert_eq!(doc.template().unwrap(), json!({"*.$": "$.input", "quote.$": "$.outputs.q"}));
        let deeper = doc.set(&p("$.a.b"), Sym::Lit(json!(1))).unwrap();
        assert_eq!(
            deeper.template().unwrap(),
            json!({"*.$": "$.input", "quote.$": "$.outputs.q", "a": {"*.$": "$.input.a", "b": 1}})
        );
        let lit = Sym::Lit(json!({"x": {"y": 2}}));
        assert_eq!(lit.get(&p("$.x.y")).unwrap(), Sym::Lit(json!(2)));
        assert!(lit.get(&p("$.z")).is_err());
        assert!(Sym::Lit(json!(3)).set(&p("$.a"), Sym::Lit(json!(1))).is_err());
        let arr = Sym::Arr(vec![Sym::Ref("$.outputs.a".into()), Sym::Lit(json!(2))]);
        assert_eq!(Sym::Obj(vec![("r".into(), arr)]).template().unwrap(), json!({"r": [{"*.$": "$.outputs.a"}, 2]}));
        assert_eq!(Sym::Ref("$".into()).rebased("$.outputs.s"), Sym::Ref("$.outputs.s".into()));
    }

    #[test]
    fn a_decision_and_its_opposite_are_never_both_and_always_one() {
        let c = Cond::When(json!({"variable": "$.input.n", "numeric_greater_than": 10}));
        assert_eq!(c.clone().or(c.clone().negated()), Cond::True);
        assert_eq!(c.clone().negated().or(c.clone()), Cond::True);
        assert_eq!(c.clone().and(c.clone().negated()), Cond::False);
        let d = Cond::When(json!({"variable": "$.input.m", "is_present": true}));
        assert!(matches!(c.or(d.negated()), Cond::When(_)), "other decisions stay");
    }

    #[test]
    fn choice_rules_become_guards_and_constants_are_decided_at_once() {
        let doc = Sym::Over("$.input".into(), vec![("k".into(), Sym::Lit(json!(5)))]);
        let rule = |v: Value| choice_rule(v.as_object().unwrap(), &doc, &Vars::new()).unwrap();
        assert_eq!(
            rule(json!({"Variable": "$.amount", "NumericGreaterThan": 10})),
            Cond::When(json!({"variable": "$.input.amount", "numeric_greater_than": 10}))
        );
        assert_eq!(rule(json!({"Variable": "$.k", "NumericGreaterThan": 10})), Cond::False);
        assert_eq!(rule(json!({"Variable": "$.k", "NumericEquals": 5})), Cond::True);
        assert_eq!(
            rule(json!({"Variable": "$.a", "NumericLessThanPath": "$.k"})),
            Cond::When(json!({"variable": "$.input.a", "numeric_less_than": 5}))
        );
        assert_eq!(
            rule(json!({"Not": {"Variable": "$.a", "StringEqualsPath": "$.b"}})),
            Cond::When(json!({"not": {"variable": "$.input.a", "string_equals_path": "$.input.b"}}))
        );
        assert_eq!(
            rule(json!({"And": [{"Variable": "$.a", "IsPresent": true}, {"Variable": "$.k", "IsNumeric": true}]})),
            Cond::When(json!({"variable": "$.input.a", "is_present": true}))
        );
        assert!(
            choice_rule(json!({"Variable": "$.a", "Whatever": 1}).as_object().unwrap(), &doc, &Vars::new()).is_err()
        );
    }
}
