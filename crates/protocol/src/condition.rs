//! A step's guard (`when`) and the paths it reads: a decision over the task's input and the outputs
//! of the steps the guarded step comes after.
//!
//! The operators are those of a Choice rule of the Amazon States Language, spelt in snake case:
//! `string_equals`, `string_less_than`, `string_greater_than`, `string_less_than_equals`,
//! `string_greater_than_equals`, `string_matches` (a `*` wildcard; `\*` and `\\` for the characters
//! themselves), the same five comparisons for `numeric_` and `timestamp_` (RFC 3339), and
//! `boolean_equals`; each comparison also as `…_path`, comparing with the value at another path; the
//! tests `is_present`, `is_null`, `is_numeric`, `is_string`, `is_boolean`, `is_timestamp`; and `and`,
//! `or`, `not` over other conditions.
//!
//! A path is an RFC 9535 JSONPath *singular query* (names and indexes only: `$.input.amount`,
//! `$.outputs.fraud.score`, `$.input.lines[0]['unit price']`; no wildcards, slices, filters or
//! `..`), rooted at the task's input (`$.input`) or at one step's output (`$.outputs.<step>`); and
//! `$.task.id`, the task's id (a child task's own: `{task}~{step}~{i}`), and `$.task.root`, the id
//! of the task a caller submitted (a child's parent's, its parent's...: the id before its first `~`). Three more roots are read
//! where a scope has them: `$.loop.index` and `$.loop.previous…` (a loop's iteration: its index from
//! 0, and the previous iteration's output) and `$.vars.<name>…` (a variable a step before set with
//! `assign`); the workflow loader says where each may be read. A
//! comparison whose variable is missing, or of another type than the operator's, is false (the
//! States Language raises an error there; a guard that tests for something absent says
//! `is_present`).

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A path into a task's data, `$.input…` or `$.outputs.<step>…`: an RFC 9535 singular query; in
/// a template, also one that names many values ([`DataPath::parse_many`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPath {
    text: String,
    /// The names and indexes from the root, up to the first segment that names many values.
    segments: Vec<Segment>,
    /// The rest, from that segment on: a query over the value the segments name (boxed: most
    /// paths have none).
    many: Option<Box<Many>>,
}

/// The part of a path that names many values (`[*].sku`, `[1:]`, `[?@.n > 1]`, `..id`), as an RFC
/// 9535 query over the value before it: the values it names, in document order, are an array.
#[derive(Debug, Clone)]
struct Many {
    text: String,
    query: serde_json_path::JsonPath,
}

impl PartialEq for Many {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Many {}

/// What a path relative to `value` that may name many values (`$[1:]`, `$[*].Version`) gives
/// there, as a template's path gives it ([`DataPath::value_in`]: Step Functions' rules); `null`
/// when it names nothing.
pub fn query_values(value: &Value, query: &str) -> Result<Value, String> {
    Ok(DataPath::parse_relative_many(query)?.value_in(value).unwrap_or(Value::Null))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Name(String),
    /// From the start (0, 1, …) or, negative, from the end (-1 is the last element).
    Index(i64),
}

/// Where a path starts: the task's input, the output of a step, the task itself (`$.task.id`), a
/// loop's iteration (`$.loop.index`, `$.loop.previous…`) or a variable (`$.vars.<name>…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root<'a> {
    Input,
    Output(&'a str),
    Task,
    /// `$.loop.index`: in a loop's body, the iteration's index from 0; in the loop's guard, the
    /// number of iterations ended (the next one's index).
    LoopIndex,
    /// `$.loop.previous…`: the previous iteration's output (after the loop's `result_selector`);
    /// absent in the first.
    LoopPrevious,
    /// `$.vars.<name>…`: the value a step before set under that name (`assign`).
    Var(&'a str),
}

/// What a path is read against: the task's input and the outputs of the steps that have them.
pub trait Scope {
    fn input(&self) -> &Value;
    /// The output of step `step`, if it has one (it succeeded, or failed with its failure handled).
    fn output(&self, step: &str) -> Option<&Value>;
    /// The task's id (`$.task.id`), when the scope is a task's.
    fn task_id(&self) -> Option<&str> {
        None
    }
    /// `$.loop.index`, when the scope is a loop's iteration or its guard.
    fn loop_index(&self) -> Option<u64> {
        None
    }
    /// `$.loop.previous`, when the scope is a loop's iteration or its guard and an iteration ended.
    fn loop_previous(&self) -> Option<&Value> {
        None
    }
    /// `$.vars.<name>`, when a step set it.
    fn var(&self, _name: &str) -> Option<&Value> {
        None
    }
}

impl DataPath {
    /// Parse a path; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<DataPath, String> {
        let path = DataPath { text: text.to_owned(), segments: Self::segments_of(text)?, many: None };
        Self::rooted(path)
    }

    /// Parse a path of a template, which may name many values from a segment on (a wildcard, a
    /// slice, a filter, `..`): their values, in document order, are an array, as a States
    /// Language path gives them (`$.outputs.list.Versions[*].Version`, `$.input.rows[1:]`).
    pub fn parse_many(text: &str) -> Result<DataPath, String> {
        let (segments, many) = Self::split_many(text)?;
        let path = DataPath { text: text.to_owned(), segments, many };
        if path.many.is_some() && matches!(path.root(), Root::Task | Root::LoopIndex) {
            return Err(format!("{text:?}: $.task.id and $.loop.index are one value each"));
        }
        let rooted = path.segments.len() >= if matches!(path.root(), Root::Input) { 1 } else { 2 };
        if !rooted {
            return Err(format!("{text:?}: a path names its root (its input, a step's output...) before many values"));
        }
        Self::rooted(path)
    }

    /// [`Self::parse_many`] over one value (a step's answer, for its `result_selector`).
    pub fn parse_relative_many(text: &str) -> Result<DataPath, String> {
        let (segments, many) = Self::split_many(text)?;
        Ok(DataPath { text: text.to_owned(), segments, many })
    }

    /// The names and indexes up to the first segment that names many values, and the rest as a
    /// query.
    fn split_many(text: &str) -> Result<(Vec<Segment>, Option<Box<Many>>), String> {
        let query = rsonpath_syntax::parse(text).map_err(|e| not_a_path(text, &e))?;
        let all = query.segments();
        let first =
            all.iter().position(|s| !(s.is_child() && s.selectors().len() == 1 && one(Some(s.selectors().first()))));
        let Some(first) = first else { return Ok((Self::segments_of(text)?, None)) };
        let rest: String =
            std::iter::once("$".to_owned()).chain(all[first..].iter().map(ToString::to_string)).collect();
        let definite: String =
            std::iter::once("$".to_owned()).chain(all[..first].iter().map(ToString::to_string)).collect();
        let parsed = serde_json_path::JsonPath::parse(&rest).map_err(|e| format!("{text:?}: {rest}: {e}"))?;
        Ok((Self::segments_of(&definite)?, Some(Box::new(Many { text: rest, query: parsed }))))
    }

    fn rooted(path: DataPath) -> Result<DataPath, String> {
        let text = path.text.clone();
        let text = text.as_str();
        match path.segments.as_slice() {
            [Segment::Name(r), ..] if r == "input" => Ok(path),
            [Segment::Name(r), Segment::Name(_), ..] if r == "outputs" => Ok(path),
            [Segment::Name(r), Segment::Name(f)] if r == "task" && (f == "id" || f == "root") => Ok(path),
            [Segment::Name(r), ..] if r == "task" => {
                Err(format!("{text:?}: of the task, $.task.id and $.task.root are read"))
            }
            [Segment::Name(r), Segment::Name(f)] if r == "loop" && f == "index" => Ok(path),
            [Segment::Name(r), Segment::Name(f), ..] if r == "loop" && f == "previous" => Ok(path),
            [Segment::Name(r), ..] if r == "loop" => {
                Err(format!("{text:?}: of a loop, $.loop.index and $.loop.previous… are read"))
            }
            [Segment::Name(r), Segment::Name(_), ..] if r == "vars" => Ok(path),
            [Segment::Name(r), ..] if r == "vars" => {
                Err(format!("{text:?}: a variable is read by name, $.vars.<name>…"))
            }
            _ => Err(format!(
                "{text:?} must start at the task's input ($.input…), at a step's output ($.outputs.<step>…), \
                 at a variable ($.vars.<name>…), at a loop's iteration ($.loop.index, $.loop.previous…), or \
                 be the task's id ($.task.id)"
            )),
        }
    }

    fn segments_of(text: &str) -> Result<Vec<Segment>, String> {
        let query = rsonpath_syntax::parse(text).map_err(|e| not_a_path(text, &e))?;
        let mut segments = Vec::new();
        for s in query.segments() {
            let selectors = s.selectors();
            let one = (s.is_child() && selectors.len() == 1).then(|| selectors.first());
            segments.push(match one {
                Some(rsonpath_syntax::Selector::Name(n)) => Segment::Name(n.unquoted().to_owned()),
                Some(rsonpath_syntax::Selector::Index(rsonpath_syntax::Index::FromStart(i))) => {
                    Segment::Index(i64::try_from(i.as_u64()).unwrap_or(i64::MAX))
                }
                Some(rsonpath_syntax::Selector::Index(rsonpath_syntax::Index::FromEnd(i))) => {
                    Segment::Index(-i64::try_from(i.as_u64()).unwrap_or(i64::MAX))
                }
                _ => {
                    return Err(format!(
                        "{text:?} selects more than one value: a path names one value with names and indexes \
                         ($.input.lines[0].sku); wildcards, slices, filters and '..' are not taken"
                    ))
                }
            });
        }
        Ok(segments)
    }

    /// Parse a path into one value (a step's answer, for its `result_selector`): `$` is the value
    /// itself, `$.id` a member of it.
    pub fn parse_relative(text: &str) -> Result<DataPath, String> {
        Self::segments_of(text).map(|segments| DataPath { text: text.to_owned(), segments, many: None })
    }

    /// The value a relative path ([`Self::parse_relative`]) names in `value` (none for a path that
    /// names many values: [`Self::value_in`]).
    pub fn resolve_in<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        if self.many.is_some() {
            return None;
        }
        walk(value, &self.segments)
    }

    /// The value a relative path names in `value`; for one that names many values, their array.
    pub fn value_in(&self, value: &Value) -> Option<Value> {
        let at = walk(value, &self.segments)?;
        match &self.many {
            Some(m) => self.many_values(m, at),
            None => Some(at.clone()),
        }
    }

    /// What the part that names many values gives over `at`, as Step Functions gives it (as
    /// LocalStack reads AWS's behaviour, `asl/utils/json_path.py`): the array of the values, but
    /// one value alone when exactly one matched and the path does not end at an array's element
    /// (`$.rows[?(@.n > 1)].id` matching one row is its id), or ends with an index
    /// (`$.a[*].b[0]`); nothing matched is `[]` for a path of one wildcard or slice followed by
    /// names (`$.rows[1:]`, `$.items[*].sku`), and no value otherwise (a filter that matched
    /// nothing: Step Functions fails the state, `States.Runtime`; here the template's `null`).
    fn many_values(&self, m: &Many, at: &Value) -> Option<Value> {
        let found = m.query.query_located(at);
        let n = found.len();
        let Some(first) = found.first() else {
            return one_wildcard_or_slice(&self.text).then(|| Value::Array(Vec::new()));
        };
        let at_index = matches!(first.location().last(), Some(serde_json_path::PathElement::Index(_)));
        if n == 1 && (!at_index || ends_with_index(&self.text)) {
            return Some(first.node().clone());
        }
        Some(Value::Array(found.nodes().cloned().collect()))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The member of the input the path reads (`config` for `$.input.config.x`), if it reads
    /// one by name.
    pub fn input_member(&self) -> Option<&str> {
        match self.segments.as_slice() {
            [Segment::Name(r), Segment::Name(m), ..] if r == "input" => Some(m),
            _ => None,
        }
    }

    /// The input, the step whose output the path reads, the task, the loop's iteration or the
    /// variable.
    pub fn root(&self) -> Root<'_> {
        match self.segments.as_slice() {
            [Segment::Name(r), Segment::Name(step), ..] if r == "outputs" => Root::Output(step),
            [Segment::Name(r), ..] if r == "task" => Root::Task,
            [Segment::Name(r), Segment::Name(f), ..] if r == "loop" && f == "index" => Root::LoopIndex,
            [Segment::Name(r), ..] if r == "loop" => Root::LoopPrevious,
            [Segment::Name(r), Segment::Name(name), ..] if r == "vars" => Root::Var(name),
            _ => Root::Input,
        }
    }

    /// The value the path names in `scope`, read in place (the task's id and a loop's index are
    /// not kept as JSON values: [`Self::value`] reads them).
    pub fn resolve<'a>(&self, scope: &'a dyn Scope) -> Option<&'a Value> {
        if self.many.is_some() {
            return None;
        }
        self.definite(scope)
    }

    /// The value the path's names and indexes reach in `scope` (before a part that names many).
    fn definite<'a>(&self, scope: &'a dyn Scope) -> Option<&'a Value> {
        let (start, rest) = match self.root() {
            Root::Input => (scope.input(), &self.segments[1..]),
            Root::Output(step) => (scope.output(step)?, &self.segments[2..]),
            Root::LoopPrevious => (scope.loop_previous()?, &self.segments[2..]),
            Root::Var(name) => (scope.var(name)?, &self.segments[2..]),
            Root::Task | Root::LoopIndex => return None,
        };
        walk(start, rest)
    }

    /// The value the path names in `scope`: read in place, the task's id, or the loop's index.
    pub fn value<'a>(&self, scope: &'a dyn Scope) -> Option<Cow<'a, Value>> {
        match self.root() {
            // `$.task.root`: the task a caller submitted, whose child this one may be
            Root::Task if matches!(self.segments.get(1), Some(Segment::Name(f)) if f == "root") => {
                scope.task_id().map(|id| Cow::Owned(Value::String(id.split('~').next().unwrap_or(id).to_owned())))
            }
            Root::Task => scope.task_id().map(|id| Cow::Owned(Value::String(id.to_owned()))),
            Root::LoopIndex => scope.loop_index().map(|i| Cow::Owned(Value::from(i))),
            _ if self.many.is_some() => {
                let at = self.definite(scope)?;
                self.many_values(self.many.as_ref()?, at).map(Cow::Owned)
            }
            _ => self.resolve(scope).map(Cow::Borrowed),
        }
    }
}

/// Whether a path ends with a literal index (`…[0]`).
fn ends_with_index(path: &str) -> bool {
    path.strip_suffix(']')
        .and_then(|p| p.rsplit_once('['))
        .is_some_and(|(_, i)| !i.is_empty() && i.bytes().all(|c| c.is_ascii_digit()))
}

/// Whether a path is names, then one wildcard or slice (`[*]`, `[1:]`, `[:3]`), then names only
/// (`$.rows[1:]`, `$.items[*].sku`, `$[*]`): Step Functions gives `[]` when it matches nothing.
fn one_wildcard_or_slice(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('$') else { return false };
    let Some((head, tail)) = rest.split_once('[') else { return false };
    let Some((selector, after)) = tail.split_once(']') else { return false };
    let head_ok = head.is_empty() && selector == "*" || head.starts_with('.') && head.len() > 1;
    let selector_ok = selector == "*"
        || selector.split_once(':').is_some_and(|(a, b)| a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit()));
    head_ok && selector_ok && !after.contains('[') && (after.is_empty() || after.starts_with('.'))
}

/// The parser's refusal on one line (its first: what is wrong; the others draw where).
fn not_a_path(text: &str, e: &dyn fmt::Display) -> String {
    let said = e.to_string();
    let first = said
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    format!("{text:?} is not a JSONPath: {first}")
}

/// Whether a segment's one selector names one value (a name, an index).
fn one(s: Option<&rsonpath_syntax::Selector>) -> bool {
    matches!(s, Some(rsonpath_syntax::Selector::Name(_) | rsonpath_syntax::Selector::Index(_)))
}

fn walk<'a>(start: &'a Value, segments: &[Segment]) -> Option<&'a Value> {
    segments.iter().try_fold(start, |v, s| match (s, v) {
        (Segment::Name(n), Value::Object(m)) => m.get(n),
        (Segment::Index(i), Value::Array(a)) => {
            let at = if *i < 0 {
                a.len().checked_sub(usize::try_from(i.unsigned_abs()).ok()?)?
            } else {
                usize::try_from(*i).ok()?
            };
            a.get(at)
        }
        _ => None,
    })
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for DataPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for DataPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        DataPath::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A guard: true or false for a task's data.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    And(Vec<Condition>),
    Or(Vec<Condition>),
    Not(Box<Condition>),
    Rule { variable: DataPath, test: Test },
}

/// What a rule tests of its variable.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    Compare { kind: Kind, op: Op, to: Operand },
    BooleanEquals(Operand),
    StringMatches(String),
    Is { what: Is, expected: bool },
}

/// The type a comparison is made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    String,
    Numeric,
    Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Equals,
    LessThan,
    GreaterThan,
    LessThanEquals,
    GreaterThanEquals,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Is {
    Present,
    Null,
    Numeric,
    String,
    Boolean,
    Timestamp,
}

/// What a comparison compares with: a value, or the value at another path (`…_path`).
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Value(Value),
    Path(DataPath),
}

const KINDS: [(Kind, &str); 3] = [(Kind::String, "string"), (Kind::Numeric, "numeric"), (Kind::Timestamp, "timestamp")];
const OPS: [(Op, &str); 5] = [
    (Op::Equals, "equals"),
    (Op::LessThan, "less_than"),
    (Op::GreaterThan, "greater_than"),
    (Op::LessThanEquals, "less_than_equals"),
    (Op::GreaterThanEquals, "greater_than_equals"),
];
const IS: [(Is, &str); 6] = [
    (Is::Present, "is_present"),
    (Is::Null, "is_null"),
    (Is::Numeric, "is_numeric"),
    (Is::String, "is_string"),
    (Is::Boolean, "is_boolean"),
    (Is::Timestamp, "is_timestamp"),
];

/// The most conditions one guard may nest (and, or, not, rules together).
pub const MAX_CONDITION_NODES: usize = 100;

impl Test {
    /// Its operator's name in a workflow file.
    fn operator(&self) -> String {
        match self {
            Test::Compare { kind, op, to } => {
                let k = KINDS.iter().find(|(x, _)| x == kind).map_or("", |(_, n)| n);
                let o = OPS.iter().find(|(x, _)| x == op).map_or("", |(_, n)| n);
                format!("{k}_{o}{}", if matches!(to, Operand::Path(_)) { "_path" } else { "" })
            }
            Test::BooleanEquals(Operand::Path(_)) => "boolean_equals_path".into(),
            Test::BooleanEquals(Operand::Value(_)) => "boolean_equals".into(),
            Test::StringMatches(_) => "string_matches".into(),
            Test::Is { what, .. } => IS.iter().find(|(x, _)| x == what).map_or("", |(_, n)| n).into(),
        }
    }

    fn operand(&self) -> Value {
        match self {
            Test::Compare { to: Operand::Value(v), .. } | Test::BooleanEquals(Operand::Value(v)) => v.clone(),
            Test::Compare { to: Operand::Path(p), .. } | Test::BooleanEquals(Operand::Path(p)) => {
                Value::String(p.text.clone())
            }
            Test::StringMatches(p) => Value::String(p.clone()),
            Test::Is { expected, .. } => Value::Bool(*expected),
        }
    }

    /// The test for operator `name` with `operand`, checked.
    fn of(name: &str, operand: &Value) -> Result<Test, String> {
        let (base, by_path) = match name.strip_suffix("_path") {
            Some(b) => (b, true),
            None => (name, false),
        };
        let to = |expect: &str, ok: bool| -> Result<Operand, String> {
            if by_path {
                let p = operand.as_str().ok_or_else(|| format!("{name} takes a path ($.input…), not {operand}"))?;
                return DataPath::parse(p).map(Operand::Path);
            }
            if ok {
                Ok(Operand::Value(operand.clone()))
            } else {
                Err(format!("{name} takes {expect}, not {operand}"))
            }
        };
        if let Some((what, _)) = IS.iter().find(|(_, n)| *n == name) {
            let expected = operand.as_bool().ok_or_else(|| format!("{name} takes true or false, not {operand}"))?;
            return Ok(Test::Is { what: *what, expected });
        }
        if name == "string_matches" {
            let p = operand.as_str().ok_or_else(|| format!("string_matches takes a pattern string, not {operand}"))?;
            return Ok(Test::StringMatches(p.to_owned()));
        }
        if base == "boolean_equals" {
            return Ok(Test::BooleanEquals(to("true or false", operand.is_boolean())?));
        }
        for (kind, k) in KINDS {
            for (op, o) in OPS {
                if base.strip_prefix(k).and_then(|r| r.strip_prefix('_')) == Some(o) {
                    let ok = match kind {
                        Kind::String => operand.is_string(),
                        Kind::Numeric => operand.is_number(),
                        Kind::Timestamp => operand.as_str().and_then(timestamp_millis).is_some(),
                    };
                    let expect = match kind {
                        Kind::String => "a string",
                        Kind::Numeric => "a number",
                        Kind::Timestamp => "an RFC 3339 time (2026-11-26T10:00:00Z)",
                    };
                    return Ok(Test::Compare { kind, op, to: to(expect, ok)? });
                }
            }
        }
        Err(format!("unknown operator {name:?}"))
    }

    fn holds(&self, v: Option<&Value>, scope: &dyn Scope) -> bool {
        let operand = |o: &Operand| -> Option<Value> {
            match o {
                Operand::Value(v) => Some(v.clone()),
                Operand::Path(p) => p.value(scope).map(Cow::into_owned),
            }
        };
        match self {
            Test::Is { what, expected } => {
                let is = match (what, v) {
                    (Is::Present, v) => v.is_some(),
                    (_, None) => false,
                    (Is::Null, Some(v)) => v.is_null(),
                    (Is::Numeric, Some(v)) => v.is_number(),
                    (Is::String, Some(v)) => v.is_string(),
                    (Is::Boolean, Some(v)) => v.is_boolean(),
                    (Is::Timestamp, Some(v)) => v.as_str().and_then(timestamp_millis).is_some(),
                };
                is == *expected
            }
            Test::StringMatches(p) => v.and_then(Value::as_str).is_some_and(|s| wildcard_match(p, s)),
            Test::BooleanEquals(o) => match (v.and_then(Value::as_bool), operand(o).and_then(|o| o.as_bool())) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
            Test::Compare { kind, op, to } => {
                let (Some(a), Some(b)) = (v, operand(to)) else { return false };
                let ord = match kind {
                    Kind::String => a.as_str().zip(b.as_str()).map(|(a, b)| a.cmp(b)),
                    Kind::Numeric => compare_numbers(a, &b),
                    Kind::Timestamp => a
                        .as_str()
                        .and_then(timestamp_millis)
                        .zip(b.as_str().and_then(timestamp_millis))
                        .map(|(a, b)| a.cmp(&b)),
                };
                ord.is_some_and(|o| match op {
                    Op::Equals => o.is_eq(),
                    Op::LessThan => o.is_lt(),
                    Op::GreaterThan => o.is_gt(),
                    Op::LessThanEquals => o.is_le(),
                    Op::GreaterThanEquals => o.is_ge(),
                })
            }
        }
    }
}

fn compare_numbers(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return Some(x.cmp(&y));
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return Some(x.cmp(&y));
    }
    a.as_f64()?.partial_cmp(&b.as_f64()?)
}

/// An RFC 3339 time as epoch milliseconds (negative before 1970).
fn timestamp_millis(t: &str) -> Option<i128> {
    let d = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    Some(d.unix_timestamp_nanos() / 1_000_000)
}

/// The States Language's wildcard match: `*` is any run of characters, `\*` a star, `\\` a backslash.
fn wildcard_match(pattern: &str, s: &str) -> bool {
    // the pattern as literal pieces between stars
    let mut pieces: Vec<String> = vec![String::new()];
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => pieces.last_mut().expect("never empty").push(chars.next().unwrap_or('\\')),
            '*' => pieces.push(String::new()),
            c => pieces.last_mut().expect("never empty").push(c),
        }
    }
    let (first, rest) = pieces.split_first().expect("never empty");
    let Some(mut tail) = s.strip_prefix(first.as_str()) else { return false };
    let Some((last, middle)) = rest.split_last() else { return tail.is_empty() };
    for piece in middle {
        match tail.find(piece.as_str()) {
            Some(at) => tail = &tail[at + piece.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last.as_str())
}

impl Condition {
    /// Whether the condition holds for the task's data in `scope`.
    pub fn holds(&self, scope: &dyn Scope) -> bool {
        match self {
            Condition::And(all) => all.iter().all(|c| c.holds(scope)),
            Condition::Or(any) => any.iter().any(|c| c.holds(scope)),
            Condition::Not(c) => !c.holds(scope),
            Condition::Rule { variable, test } => test.holds(variable.value(scope).as_deref(), scope),
        }
    }

    /// Every path the condition reads.
    pub fn paths(&self) -> Vec<&DataPath> {
        let mut out = Vec::new();
        self.visit(&mut |c| {
            if let Condition::Rule { variable, test } = c {
                out.push(variable);
                if let Test::Compare { to: Operand::Path(p), .. } | Test::BooleanEquals(Operand::Path(p)) = test {
                    out.push(p);
                }
            }
        });
        out
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Condition)) {
        f(self);
        match self {
            Condition::And(cs) | Condition::Or(cs) => cs.iter().for_each(|c| c.visit(f)),
            Condition::Not(c) => c.visit(f),
            Condition::Rule { .. } => {}
        }
    }

    fn nodes(&self) -> usize {
        let mut n = 0;
        self.visit(&mut |_| n += 1);
        n
    }

    /// Read a condition from its JSON form; the error names what does not fit.
    pub fn from_json(v: &Value) -> Result<Condition, String> {
        let c = Self::read(v)?;
        if c.nodes() > MAX_CONDITION_NODES {
            return Err(format!("a condition has at most {MAX_CONDITION_NODES} parts"));
        }
        Ok(c)
    }

    fn read(v: &Value) -> Result<Condition, String> {
        let Value::Object(m) = v else { return Err(format!("a condition is an object, not {v}")) };
        let list = |key: &str, x: &Value| -> Result<Vec<Condition>, String> {
            match x {
                Value::Array(a) if !a.is_empty() => a.iter().map(Self::read).collect(),
                _ => Err(format!("{key} takes a non-empty list of conditions")),
            }
        };
        if m.len() == 1 {
            let (k, x) = m.iter().next().expect("one entry");
            match k.as_str() {
                "and" => return Ok(Condition::And(list(k, x)?)),
                "or" => return Ok(Condition::Or(list(k, x)?)),
                "not" => return Ok(Condition::Not(Box::new(Self::read(x)?))),
                _ => {}
            }
        }
        let variable = match m.get("variable") {
            Some(Value::String(p)) => DataPath::parse(p)?,
            Some(other) => return Err(format!("variable is a path ($.input.amount), not {other}")),
            None => {
                return Err(format!(
                    "a condition is {{\"and\": […]}}, {{\"or\": […]}}, {{\"not\": {{…}}}} or {{\"variable\": \"$.…\", \
                     <operator>: <value>}}; this one has {}",
                    keys(m)
                ))
            }
        };
        let ops: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| k.as_str() != "variable").collect();
        match ops.as_slice() {
            [(name, operand)] => Ok(Condition::Rule { variable, test: Test::of(name, operand)? }),
            [] => Err(format!(
                "the rule on {variable} has no operator (numeric_greater_than, string_equals, is_present, …)"
            )),
            _ => {
                Err(format!("the rule on {variable} has more than one operator ({}): combine rules with and", keys(m)))
            }
        }
    }

    /// Its JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Condition::And(cs) => json_obj("and", Value::Array(cs.iter().map(Condition::to_json).collect())),
            Condition::Or(cs) => json_obj("or", Value::Array(cs.iter().map(Condition::to_json).collect())),
            Condition::Not(c) => json_obj("not", c.to_json()),
            Condition::Rule { variable, test } => {
                let mut m = Map::new();
                m.insert("variable".into(), Value::String(variable.text.clone()));
                m.insert(test.operator(), test.operand());
                Value::Object(m)
            }
        }
    }
}

fn keys(m: &Map<String, Value>) -> String {
    m.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn json_obj(k: &str, v: Value) -> Value {
    Value::Object(Map::from_iter([(k.to_owned(), v)]))
}

/// A short text of the condition, for the reasons in the task and the tools:
/// `$.input.amount numeric_greater_than 1000 and not ($.input.vip boolean_equals true)`.
impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, cs: &[Condition], word: &str| -> fmt::Result {
            for (i, c) in cs.iter().enumerate() {
                if i > 0 {
                    write!(f, " {word} ")?;
                }
                match c {
                    Condition::Rule { .. } | Condition::Not(_) => write!(f, "{c}")?,
                    _ => write!(f, "({c})")?,
                }
            }
            Ok(())
        };
        match self {
            Condition::And(cs) => join(f, cs, "and"),
            Condition::Or(cs) => join(f, cs, "or"),
            Condition::Not(c) => write!(f, "not ({c})"),
            Condition::Rule { variable, test } => write!(f, "{variable} {} {}", test.operator(), test.operand()),
        }
    }
}

impl Serialize for Condition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Condition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Condition::from_json(&v).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Condition {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Condition".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut operators: Vec<String> = Vec::new();
        for (_, k) in KINDS {
            for (_, o) in OPS {
                operators.push(format!("{k}_{o}"));
                operators.push(format!("{k}_{o}_path"));
            }
        }
        operators.extend(["boolean_equals", "boolean_equals_path", "string_matches"].map(String::from));
        operators.extend(IS.iter().map(|(_, n)| (*n).to_owned()));
        let path = serde_json::json!({"type": "string", "pattern": "^\\$\\.(input|outputs|task\\.id$|vars|loop)"});
        let mut rule = Map::new();
        rule.insert("variable".into(), path);
        for o in &operators {
            rule.insert(o.clone(), serde_json::json!({}));
        }
        schemars::json_schema!({
            "description": "A guard: a Choice rule of the Amazon States Language in snake case. {\"variable\": \"$.input.amount\", \"numeric_greater_than\": 1000}, or {\"and\": [...]}, {\"or\": [...]}, {\"not\": {...}}.",
            "oneOf": [
                {"type": "object", "required": ["and"], "additionalProperties": false,
                 "properties": {"and": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/Condition"}}}},
                {"type": "object", "required": ["or"], "additionalProperties": false,
                 "properties": {"or": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/Condition"}}}},
                {"type": "object", "required": ["not"], "additionalProperties": false,
                 "properties": {"not": {"$ref": "#/$defs/Condition"}}},
                {"type": "object", "required": ["variable"], "additionalProperties": false,
                 "minProperties": 2, "maxProperties": 2, "properties": rule}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Data(Value, Value);
    impl Scope for Data {
        fn input(&self) -> &Value {
            &self.0
        }
        fn output(&self, step: &str) -> Option<&Value> {
            self.1.get(step)
        }
        fn task_id(&self) -> Option<&str> {
            Some("order-42")
        }
    }

    /// A child task (a map's element of a loop's iteration).
    struct Child;
    impl Scope for Child {
        fn input(&self) -> &Value {
            &Value::Null
        }
        fn output(&self, _: &str) -> Option<&Value> {
            None
        }
        fn task_id(&self) -> Option<&str> {
            Some("order-42~1~7~0~3")
        }
    }

    fn data() -> Data {
        Data(
            json!({"amount": 1500, "currency": "EUR", "vip": false, "at": "2026-11-26T10:00:00Z",
                   "lines": [{"sku": "GIFT-1"}, {"sku": "BOOK-2"}], "note": null, "a b": 1}),
            json!({"fraud": {"score": 85.5, "limit": 80}}),
        )
    }

    #[allow(clippy::needless_pass_by_value)]
    fn holds(c: Value) -> bool {
        Condition::from_json(&c).unwrap_or_else(|e| panic!("{c}: {e}")).holds(&data())
    }

    #[test]
    fn paths_are_singular_queries_from_the_input_or_a_step_s_output() {
        let d = data();
        let at = |p: &str| DataPath::parse(p).unwrap().resolve(&d).cloned();
        assert_eq!(at("$.input.amount"), Some(json!(1500)));
        assert_eq!(at("$.input.lines[1].sku"), Some(json!("BOOK-2")));
        assert_eq!(at("$.input.lines[-1]['sku']"), Some(json!("BOOK-2")));
        assert_eq!(at("$['input']['a b']"), Some(json!(1)));
        assert_eq!(at("$.outputs.fraud.score"), Some(json!(85.5)));
        assert_eq!(at("$.outputs.ship"), None);
        assert_eq!(at("$.input.lines[5]"), None);
        assert_eq!(DataPath::parse("$.outputs.fraud.score").unwrap().root(), Root::Output("fraud"));
        let id = DataPath::parse("$.task.id").unwrap();
        assert_eq!(id.root(), Root::Task);
        assert_eq!(id.value(&d).map(std::borrow::Cow::into_owned), Some(json!("order-42")), "the task's id");
        assert!(holds(json!({"variable": "$.task.id", "string_matches": "order-*"})));
        // a constant read at import gives what the same path gives at run time
        let rows = json!({"rows": [{"n": 1}, {"n": 2}]});
        assert_eq!(query_values(&rows, "$.rows[?@.n == 2].n"), Ok(json!(2)), "one match alone");
        assert_eq!(query_values(&rows, "$.rows[1:]"), Ok(json!([{"n": 2}])), "an array's element: an array");
        assert_eq!(query_values(&rows, "$.rows[5:]"), Ok(json!([])));
        // a child task's root: the task a caller submitted
        let root = DataPath::parse("$.task.root").unwrap();
        assert_eq!(root.value(&Child).map(std::borrow::Cow::into_owned), Some(json!("order-42")));
        assert_eq!(root.value(&d).map(std::borrow::Cow::into_owned), Some(json!("order-42")));
        for bad in [
            "$.input.lines[*]",
            "$..sku",
            "$.input.lines[0:1]",
            "$.outputs",
            "$.order",
            "input.amount",
            "$",
            "$.task",
            "$.task.name",
            "$.loop",
            "$.loop.count",
            "$.loop.index.x",
            "$.vars",
        ] {
            assert!(DataPath::parse(bad).is_err(), "{bad} was taken");
        }
    }

    /// A loop's iteration and the variables: read where a scope has them, absent elsewhere.
    #[test]
    fn loop_and_variable_paths_read_what_their_scope_has_and_nothing_elsewhere() {
        struct Iteration(Value, Value);
        impl Scope for Iteration {
            fn input(&self) -> &Value {
                &self.0
            }
            fn output(&self, _: &str) -> Option<&Value> {
                None
            }
            fn loop_index(&self) -> Option<u64> {
                Some(3)
            }
            fn loop_previous(&self) -> Option<&Value> {
                Some(&self.1)
            }
            fn var(&self, name: &str) -> Option<&Value> {
                self.0.get("vars")?.get(name)
            }
        }
        let it = Iteration(json!({"vars": {"token": "p-4", "seen": [1, 2]}}), json!({"next": "p-3"}));
        let read = |p: &str, scope: &dyn Scope| DataPath::parse(p).unwrap().value(scope).map(Cow::into_owned);
        assert_eq!(DataPath::parse("$.loop.index").unwrap().root(), Root::LoopIndex);
        assert_eq!(DataPath::parse("$.loop.previous.next").unwrap().root(), Root::LoopPrevious);
        assert_eq!(DataPath::parse("$.vars.token").unwrap().root(), Root::Var("token"));
        assert_eq!(read("$.loop.index", &it), Some(json!(3)));
        assert_eq!(read("$.loop.previous", &it), Some(json!({"next": "p-3"})));
        assert_eq!(read("$.loop.previous.next", &it), Some(json!("p-3")));
        assert_eq!(read("$.vars.token", &it), Some(json!("p-4")));
        assert_eq!(read("$.vars.seen[-1]", &it), Some(json!(2)));
        assert_eq!(read("$.vars.other", &it), None);
        let until = json!({"variable": "$.loop.index", "numeric_greater_than_equals": 3});
        assert!(Condition::from_json(&until).unwrap().holds(&it));
        // a scope without them: the task's, today
        let d = data();
        for p in ["$.loop.index", "$.loop.previous.next", "$.vars.token"] {
            assert_eq!(read(p, &d), None, "{p} outside a loop, with no variables");
        }
        assert!(!Condition::from_json(&until).unwrap().holds(&d));
    }

    #[test]
    fn the_choice_operators_decide_as_the_states_language_does() {
        assert!(holds(json!({"variable": "$.input.amount", "numeric_greater_than": 1000})));
        assert!(!holds(json!({"variable": "$.input.amount", "numeric_less_than_equals": 1000})));
        assert!(holds(json!({"variable": "$.input.amount", "numeric_equals": 1500.0})));
        assert!(holds(
            json!({"variable": "$.outputs.fraud.score", "numeric_greater_than_path": "$.outputs.fraud.limit"})
        ));
        assert!(holds(json!({"variable": "$.input.currency", "string_equals": "EUR"})));
        assert!(holds(json!({"variable": "$.input.currency", "string_less_than": "USD"})));
        assert!(holds(json!({"variable": "$.input.lines[0].sku", "string_matches": "GIFT-*"})));
        assert!(!holds(json!({"variable": "$.input.lines[1].sku", "string_matches": "GIFT-*"})));
        assert!(holds(json!({"variable": "$.input.vip", "boolean_equals": false})));
        assert!(holds(json!({"variable": "$.input.at", "timestamp_greater_than": "2026-11-26T09:00:00+00:00"})));
        assert!(holds(json!({"variable": "$.input.at", "timestamp_equals": "2026-11-26T11:00:00+01:00"})));
        assert!(holds(json!({"variable": "$.input.note", "is_null": true})));
        assert!(holds(json!({"variable": "$.input.note", "is_present": true})));
        assert!(holds(json!({"variable": "$.input.gift", "is_present": false})));
        assert!(holds(json!({"variable": "$.input.at", "is_timestamp": true})));
        assert!(holds(json!({"variable": "$.input.amount", "is_numeric": true})));
        // missing or of another type: false, whatever the operator
        assert!(!holds(json!({"variable": "$.input.gift", "numeric_greater_than": 0})));
        assert!(!holds(json!({"variable": "$.input.currency", "numeric_greater_than": 0})));
        assert!(!holds(json!({"variable": "$.input.gift", "is_null": true})));
        // and, or, not
        assert!(holds(json!({"and": [
            {"variable": "$.input.amount", "numeric_greater_than": 1000},
            {"not": {"variable": "$.input.vip", "boolean_equals": true}}]})));
        assert!(holds(json!({"or": [
            {"variable": "$.input.amount", "numeric_less_than": 10},
            {"variable": "$.outputs.fraud.score", "numeric_greater_than_equals": 80}]})));
        assert!(!holds(json!({"not": {"variable": "$.input.amount", "is_present": true}})));
    }

    #[test]
    fn wildcards_match_as_the_states_language_says() {
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a*c", "abbbc"));
        assert!(wildcard_match("a*b*c", "abc"));
        assert!(!wildcard_match("a*b*c", "acb"));
        assert!(wildcard_match("*.log", "x.log"));
        assert!(!wildcard_match("*.log", "x.log.gz"));
        assert!(wildcard_match(r"a\*b", "a*b"));
        assert!(!wildcard_match(r"a\*b", "axb"));
        assert!(!wildcard_match("aa*aa", "aaa"));
        assert!(wildcard_match("exact", "exact"));
    }

    #[test]
    fn a_condition_that_cannot_be_read_says_why() {
        let err = |c: Value| Condition::from_json(&c).unwrap_err();
        assert!(err(json!({"variable": "$.input.a", "numeric_greater_than": "ten"})).contains("takes a number"));
        assert!(err(json!({"variable": "$.input.a", "numeric_bigger_than": 1})).contains("unknown operator"));
        assert!(err(json!({"variable": "$.input.a"})).contains("no operator"));
        assert!(err(json!({"variable": "$.input.a", "is_null": true, "is_present": true})).contains("more than one"));
        assert!(err(json!({"and": []})).contains("non-empty"));
        assert!(err(json!({"variable": "$.input.a", "timestamp_equals": "yesterday"})).contains("RFC 3339"));
        assert!(err(json!({"variable": "$.input.a", "string_equals_path": "amount"})).contains("not a JSONPath"));
        assert!(err(json!({"Variable": "$.input.a", "NumericEquals": 1})).contains("this one has"));
    }

    #[test]
    fn a_condition_is_written_back_as_it_was_read() {
        let c = json!({"or": [
            {"variable": "$.input.amount", "numeric_greater_than_equals_path": "$.outputs.fraud.limit"},
            {"not": {"variable": "$.input.vip", "is_present": false}},
            {"and": [{"variable": "$.input.currency", "string_matches": "E*"}]}]});
        let read = Condition::from_json(&c).unwrap();
        assert_eq!(read.to_json(), c);
        assert_eq!(serde_json::from_value::<Condition>(serde_json::to_value(&read).unwrap()).unwrap(), read);
        assert_eq!(
            read.to_string(),
            "$.input.amount numeric_greater_than_equals_path \"$.outputs.fraud.limit\" or not ($.input.vip is_present false) or ($.input.currency string_matches \"E*\")"
        );
    }
}
