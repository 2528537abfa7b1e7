//! JSONata state machines (`"QueryLanguage": "JSONata"`, on the machine or on a state) rewritten
//! into their JSONPath equivalent before they are translated, when every expression is one the
//! JSONPath fields say exactly:
//!
//! - a path of the state's input, its result, its error, the context object or a variable
//!   (`$states.input.order.id`, `$states.result.Payload`, `$states.errorOutput`,
//!   `$states.context.Execution.Id`, `$total`; `.name`, `` .`a name` `` and `[n]` steps);
//! - a literal (a string in `'…'` or `"…"`, a number, `true`, `false`, `null`);
//! - strings joined with `&` (`States.Format`);
//! - in a Choice rule's `Condition`: `=`, `!=`, `<`, `<=`, `>`, `>=` between a path and a literal,
//!   `and`, `or`, `$not(…)`, `$exists(path)`, and a path alone (`BooleanEquals true`).
//!
//! The fields: `Arguments` becomes `Parameters` (or `InputPath`), `Output` becomes `ResultSelector`
//! or `OutputPath` (or a Pass state's `Parameters`/`Result`), `Condition` a rule, `Items`
//! `ItemsPath`, `Seconds`/`Timestamp` `SecondsPath`/`TimestampPath`, `Error`/`Cause`
//! `ErrorPath`/`CausePath`, `Assign` the JSONPath `Assign` (over what its `$` is there: a task's
//! result, a Pass state's, Choice's or Wait's input, a Catch's error). Anything else is refused
//! naming the state, the field and the expression: other functions (the engine does not evaluate
//! JSONata yet: the book's "Importing Step Functions state machines", JSONata, has the conformance
//! of the Rust crates that could), arithmetic, predicates.

use serde_json::{json, Map, Value};

use crate::data::{path_text, Seg};
use crate::Refusal;

/// Which document an expression's path starts from.
#[derive(Debug, Clone, PartialEq)]
enum Root {
    Input,
    Result,
    ErrorOutput,
    Context,
    /// A variable (`$name`), set by an `Assign` before.
    Var(String),
}

/// An expression of the subset.
#[derive(Debug, Clone, PartialEq)]
enum Ex {
    Path(Root, Vec<Seg>),
    Lit(Value),
    Concat(Vec<Ex>),
    Cmp(&'static str, Box<Ex>, Box<Ex>),
    And(Box<Ex>, Box<Ex>),
    Or(Box<Ex>, Box<Ex>),
    Not(Box<Ex>),
    Exists(Box<Ex>),
}

/// The expression a `{% … %}` string holds, or `None` for a string that is not one.
fn expression(s: &str) -> Option<&str> {
    s.trim().strip_prefix("{%")?.strip_suffix("%}").map(str::trim)
}

/// Parse an expression of the subset; what is outside it is an error that names it.
fn parse(text: &str) -> Result<Ex, String> {
    let mut p = Parser { s: text.chars().collect(), at: 0 };
    let e = p.or().map_err(|why| format!("{{% {text} %}}: {why}"))?;
    p.blank();
    if p.at < p.s.len() {
        let rest: String = p.s[p.at..].iter().collect();
        return Err(format!(
            "{{% {text} %}}: {rest:?} is not translated (only paths, literals, &, comparisons, and, or)"
        ));
    }
    Ok(e)
}

struct Parser {
    s: Vec<char>,
    at: usize,
}

impl Parser {
    fn blank(&mut self) {
        while self.s.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.blank();
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, t: &str) -> bool {
        self.blank();
        let t: Vec<char> = t.chars().collect();
        if self.s[self.at..].starts_with(&t) {
            let after = self.s.get(self.at + t.len());
            // a word operator is a word of its own
            if t[0].is_alphabetic() && after.is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                return false;
            }
            self.at += t.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> String {
        let start = self.at;
        while self.s.get(self.at).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
            self.at += 1;
        }
        self.s[start..self.at].iter().collect()
    }

    fn or(&mut self) -> Result<Ex, String> {
        let mut e = self.and()?;
        while self.eat("or") {
            e = Ex::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Ex, String> {
        let mut e = self.cmp()?;
        while self.eat("and") {
            e = Ex::And(Box::new(e), Box::new(self.cmp()?));
        }
        Ok(e)
    }

    fn cmp(&mut self) -> Result<Ex, String> {
        let a = self.concat()?;
        for op in ["!=", "<=", ">=", "=", "<", ">"] {
            if self.eat(op) {
                let b = self.concat()?;
                return Ok(Ex::Cmp(op, Box::new(a), Box::new(b)));
            }
        }
        Ok(a)
    }

    fn concat(&mut self) -> Result<Ex, String> {
        let mut parts = vec![self.primary()?];
        loop {
            match self.peek() {
                Some('&') => {
                    self.at += 1;
                    parts.push(self.primary()?);
                }
                Some(c @ ('+' | '-' | '*' | '/' | '%')) => {
                    return Err(format!("arithmetic ({c}) is not translated"));
                }
                Some('?') => return Err("a conditional (? :) is not translated".into()),
                _ => break,
            }
        }
        Ok(if parts.len() == 1 { parts.remove(0) } else { Ex::Concat(parts) })
    }

    fn primary(&mut self) -> Result<Ex, String> {
        match self.peek() {
            Some('(') => {
                self.at += 1;
                let e = self.or()?;
                if !self.eat(")") {
                    return Err("an unclosed (".into());
                }
                Ok(e)
            }
            Some(q @ ('\'' | '"')) => {
                self.at += 1;
                let mut out = String::new();
                loop {
                    match self.s.get(self.at) {
                        None => return Err("an unclosed string".into()),
                        Some('\\') => {
                            let c = self.s.get(self.at + 1).copied().ok_or("an unclosed string")?;
                            out.push(match c {
                                'n' => '\n',
                                't' => '\t',
                                'r' => '\r',
                                'u' => return Err("a \\u escape in a string is not translated".into()),
                                c => c,
                            });
                            self.at += 2;
                        }
                        Some(&c) if c == q => {
                            self.at += 1;
                            break;
                        }
                        Some(&c) => {
                            out.push(c);
                            self.at += 1;
                        }
                    }
                }
                Ok(Ex::Lit(Value::String(out)))
            }
            Some(c)
                if c.is_ascii_digit() || (c == '-' && self.s.get(self.at + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let start = self.at;
                self.at += 1;
                while self.s.get(self.at).is_some_and(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E')) {
                    self.at += 1;
                }
                let text: String = self.s[start..self.at].iter().collect();
                let n: Value = serde_json::from_str(&text).map_err(|_| format!("{text} is not a number"))?;
                Ok(Ex::Lit(n))
            }
            Some('$') => {
                self.at += 1;
                let name = self.ident();
                if self.peek() == Some('(') {
                    if !matches!(name.as_str(), "not" | "exists") {
                        return Err(format!("the function ${name} is not translated"));
                    }
                    self.at += 1;
                    let arg = self.or()?;
                    if !self.eat(")") {
                        return Err(format!("${name}( takes one argument here"));
                    }
                    return match name.as_str() {
                        "not" => Ok(Ex::Not(Box::new(arg))),
                        "exists" => Ok(Ex::Exists(Box::new(arg))),
                        _ => Err(format!("the function ${name} is not translated")),
                    };
                }
                match name.as_str() {
                    "states" => {}
                    "" => return Err("$ (the context value) is not translated: read $states.input".into()),
                    v => return Ok(Ex::Path(Root::Var(v.to_owned()), self.steps()?)),
                }
                if !self.eat(".") {
                    return Err("$states is read through .input, .result, .errorOutput or .context".into());
                }
                let root = match self.ident().as_str() {
                    "input" => Root::Input,
                    "result" => Root::Result,
                    "errorOutput" => Root::ErrorOutput,
                    "context" => Root::Context,
                    other => return Err(format!("$states.{other} is not one of input, result, errorOutput, context")),
                };
                Ok(Ex::Path(root, self.steps()?))
            }
            Some(c) if c.is_alphabetic() => {
                let word = self.ident();
                match word.as_str() {
                    "true" => Ok(Ex::Lit(json!(true))),
                    "false" => Ok(Ex::Lit(json!(false))),
                    "null" => Ok(Ex::Lit(Value::Null)),
                    w => Err(format!("{w}: a path here starts at $states (a name alone reads the context value)")),
                }
            }
            Some(c) => Err(format!("{c:?} is not translated")),
            None => Err("an expression ends early".into()),
        }
    }

    /// A path's steps after its root: `.name`, `` .`a name` ``, `[n]`.
    fn steps(&mut self) -> Result<Vec<Seg>, String> {
        let mut segs = Vec::new();
        loop {
            // no blank between a path's steps
            match self.s.get(self.at) {
                Some('.') => {
                    self.at += 1;
                    if self.s.get(self.at) == Some(&'`') {
                        let end = self.s[self.at + 1..].iter().position(|c| *c == '`').ok_or("an unclosed `")?;
                        segs.push(Seg::Name(self.s[self.at + 1..self.at + 1 + end].iter().collect()));
                        self.at += end + 2;
                    } else {
                        let n = self.ident();
                        if n.is_empty() {
                            return Err(
                                "a path step is a name (a wildcard or a function on a path is not translated)".into()
                            );
                        }
                        segs.push(Seg::Name(n));
                    }
                }
                Some('[') => {
                    let end = self.s[self.at..].iter().position(|c| *c == ']').ok_or("an unclosed [")?;
                    let inner: String = self.s[self.at + 1..self.at + end].iter().collect();
                    match inner.trim().parse::<usize>() {
                        Ok(n) => segs.push(Seg::Index(n)),
                        Err(_) => return Err(format!("[{inner}] (a predicate or a negative index) is not translated")),
                    }
                    self.at += end + 1;
                }
                _ => return Ok(segs),
            }
        }
    }
}

/// A JSONPath value: a path (or an intrinsic call) or a literal.
enum Jp {
    Path(String),
    Lit(Value),
}

/// The roots a field's expressions may read, and the JSONPath each starts as.
#[derive(Clone, Copy)]
struct Reads {
    input: Option<&'static str>,
    result: Option<&'static str>,
    error: Option<&'static str>,
}

const INPUT: Reads = Reads { input: Some("$"), result: None, error: None };

fn root_text(root: &Root, reads: Reads) -> Result<String, String> {
    let (got, what) = match root {
        Root::Input => (reads.input, "$states.input"),
        Root::Result => (reads.result, "$states.result"),
        Root::ErrorOutput => (reads.error, "$states.errorOutput"),
        Root::Context => return Ok("$$".into()),
        Root::Var(name) => return Ok(format!("${name}")),
    };
    got.map(str::to_owned).ok_or_else(|| format!("{what} is not read in this field"))
}

/// The JSONPath value of an expression.
fn value(e: &Ex, reads: Reads) -> Result<Jp, String> {
    match e {
        Ex::Path(root, segs) => Ok(Jp::Path(path_text(&root_text(root, reads)?, segs))),
        Ex::Lit(v) => Ok(Jp::Lit(v.clone())),
        Ex::Concat(parts) => {
            let mut format = String::new();
            let mut args = Vec::new();
            for p in parts {
                match value(p, reads)? {
                    Jp::Lit(Value::String(s)) => format.push_str(
                        &s.replace('\\', "\\\\").replace('\'', "\\'").replace('{', "\\{").replace('}', "\\}"),
                    ),
                    Jp::Lit(v) => format.push_str(&v.to_string()),
                    Jp::Path(p) if p.starts_with("States.") => return Err("a nested & is not translated".into()),
                    Jp::Path(p) => {
                        format.push_str("{}");
                        args.push(p);
                    }
                }
            }
            if args.is_empty() {
                return Ok(Jp::Lit(Value::String(format)));
            }
            Ok(Jp::Path(format!("States.Format('{format}', {})", args.join(", "))))
        }
        _ => Err("a condition (true or false) as a value is not translated".into()),
    }
}

/// A Choice rule (without its `Next`) for a condition.
fn rule(e: &Ex) -> Result<Value, String> {
    let reads = INPUT;
    Ok(match e {
        Ex::And(a, b) => json!({"And": [rule(a)?, rule(b)?]}),
        Ex::Or(a, b) => json!({"Or": [rule(a)?, rule(b)?]}),
        Ex::Not(a) => json!({"Not": rule(a)?}),
        Ex::Exists(p) => match value(p, reads)? {
            Jp::Path(p) if !p.starts_with("States.") => json!({"Variable": p, "IsPresent": true}),
            _ => return Err("$exists takes a path here".into()),
        },
        Ex::Path(..) => match value(e, reads)? {
            Jp::Path(p) => json!({"Variable": p, "BooleanEquals": true}),
            Jp::Lit(_) => unreachable!("a path is a path"),
        },
        Ex::Cmp(op, left, right) => {
            let (path, lit, op) = match (value(left, reads)?, value(right, reads)?) {
                (Jp::Path(p), Jp::Lit(v)) => (p, v, *op),
                (Jp::Lit(v), Jp::Path(p)) => (p, v, flipped(op)),
                (Jp::Path(_), Jp::Path(_)) => {
                    return Err("a comparison of two values read from the data is not translated (their type is not known before the task runs): compare one with a literal".into())
                }
                (Jp::Lit(_), Jp::Lit(_)) => return Err("a comparison of two literals is not translated".into()),
            };
            if path.starts_with("States.") {
                return Err("a comparison of a string joined with & is not translated".into());
            }
            let kind = match &lit {
                Value::String(_) => "String",
                Value::Number(_) => "Numeric",
                Value::Bool(_) if matches!(op, "=" | "!=") => "Boolean",
                Value::Null if matches!(op, "=" | "!=") => {
                    let r = json!({"Variable": path, "IsNull": true});
                    return Ok(if op == "=" {
                        r
                    } else {
                        json!({"And": [{"Variable": path, "IsPresent": true}, {"Not": r}]})
                    });
                }
                _ => return Err(format!("{op} with {lit} is not a comparison of the States Language")),
            };
            let (name, negate) = match op {
                "=" => ("Equals", false),
                "!=" => ("Equals", true),
                "<" => ("LessThan", false),
                "<=" => ("LessThanEquals", false),
                ">" => ("GreaterThan", false),
                _ => ("GreaterThanEquals", false),
            };
            let mut r = Map::new();
            r.insert("Variable".into(), Value::String(path.clone()));
            r.insert(format!("{kind}{name}"), lit);
            if negate {
                // JSONata's `!=` is false when the value is missing, as every comparison is
                json!({"And": [{"Variable": path, "IsPresent": true}, {"Not": r}]})
            } else {
                Value::Object(r)
            }
        }
        Ex::Lit(_) | Ex::Concat(_) => return Err("a Condition is a comparison, and, or, $not or $exists".into()),
    })
}

fn flipped(op: &str) -> &'static str {
    match op {
        "<" => ">",
        "<=" => ">=",
        ">" => "<",
        ">=" => "<=",
        "!=" => "!=",
        _ => "=",
    }
}

/// A JSONata template (a value whose strings may be `{% … %}`) as a JSONPath one (`.$` keys).
fn template(v: &Value, reads: Reads) -> Result<Value, String> {
    match v {
        Value::Object(members) => {
            let mut out = Map::new();
            for (k, x) in members {
                match x {
                    Value::String(text) if text.contains("{%") => match expression(text) {
                        Some(e) => match value(&parse(e).map_err(|why| format!("{k}: {why}"))?, reads)
                            .map_err(|why| format!("{k}: {text}: {why}"))?
                        {
                            Jp::Path(p) => {
                                out.insert(format!("{k}.$"), Value::String(p));
                            }
                            Jp::Lit(l) => {
                                out.insert(k.clone(), l);
                            }
                        },
                        None => return Err(format!("{k}: {text:?}: an expression is a whole string, {{% … %}}")),
                    },
                    other => {
                        out.insert(k.clone(), template(other, reads)?);
                    }
                }
            }
            Ok(Value::Object(out))
        }
        Value::Array(a) => {
            if a.iter().any(has_expression) {
                return Err(
                    "a JSONata expression inside an array is not translated: build the array in the function called"
                        .into(),
                );
            }
            Ok(v.clone())
        }
        Value::String(s) if s.contains("{%") => Err(format!("{s:?}: an expression here is a member's value")),
        other => Ok(other.clone()),
    }
}

/// What a whole-field expression (a string `{% … %}`) is, or `None` for another value.
fn whole(v: &Value) -> Option<Result<Ex, String>> {
    let Value::String(s) = v else { return None };
    expression(s).map(parse)
}

/// Whether a value holds an expression anywhere.
fn has_expression(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains("{%"),
        Value::Array(a) => a.iter().any(has_expression),
        Value::Object(o) => o.values().any(has_expression),
        _ => false,
    }
}

/// The fields of the JSONPath flavour, which a JSONata state does not take.
const JSONPATH_FIELDS: &[&str] = &[
    "InputPath",
    "Parameters",
    "ResultSelector",
    "ResultPath",
    "OutputPath",
    "ItemsPath",
    "SecondsPath",
    "TimestampPath",
];

/// Rewrite the definition's JSONata states as JSONPath ones; every state whose fields are outside
/// the subset refused (all of them named). A definition without JSONata comes back the same.
pub fn rewrite(def: &Value) -> Result<(Value, Vec<String>), Vec<Refusal>> {
    let mut out = def.clone();
    let mut refusals = Vec::new();
    let Some(top) = out.as_object_mut() else { return Ok((out, Vec::new())) };
    let jsonata = match top.remove("QueryLanguage") {
        None => false,
        Some(Value::String(l)) if l == "JSONPath" => false,
        Some(Value::String(l)) if l == "JSONata" => true,
        Some(other) => {
            return Err(vec![Refusal {
                state: "(state machine)".into(),
                field: "QueryLanguage".into(),
                reason: format!("{other} is not JSONPath or JSONata"),
            }])
        }
    };
    let mut seen = Seen::default();
    if let Some(Value::Object(states)) = top.get_mut("States") {
        machine("", states, jsonata, &mut refusals, &mut seen);
    }
    if refusals.is_empty() {
        let mut notes = Vec::new();
        if seen.jsonata {
            notes.push(
                "the JSONata expressions are translated into the paths, templates and Choice rules they stand for"
                    .to_owned(),
            );
        }
        if seen.truthy {
            notes.push(
                "a Condition that is a path alone holds here when the value is true (JSONata also takes a non-empty string, \
                 a non-zero number, a non-empty array or object as true)"
                    .to_owned(),
            );
        }
        Ok((out, notes))
    } else {
        Err(refusals)
    }
}

/// What the rewrite met, for the translation's notes.
#[derive(Default)]
struct Seen {
    /// A JSONata state.
    jsonata: bool,
    /// A condition that is a path alone (its truth is JSONata's wider one).
    truthy: bool,
}

/// Whether a condition holds a path alone where a comparison could be.
fn truthy(e: &Ex) -> bool {
    match e {
        Ex::Path(..) => true,
        Ex::And(a, b) | Ex::Or(a, b) => truthy(a) || truthy(b),
        Ex::Not(a) => truthy(a),
        _ => false,
    }
}

/// Rewrite the states of one machine (the top, a branch, a map's processor).
fn machine(prefix: &str, states: &mut Map<String, Value>, jsonata: bool, refusals: &mut Vec<Refusal>, seen: &mut Seen) {
    for (name, st) in states.iter_mut() {
        let here = format!("{prefix}{name}");
        let Value::Object(st) = st else {
            let hint = if name == "QueryLanguage" {
                ": QueryLanguage goes at the top of the definition, beside States"
            } else {
                ""
            };
            refusals.push(Refusal {
                state: here,
                field: "Type".into(),
                reason: format!("a state is an object, not {st}{hint}"),
            });
            continue;
        };
        let mut errs = Vec::new();
        let lang = match st.remove("QueryLanguage") {
            None => jsonata,
            Some(Value::String(l)) if l == "JSONata" => true,
            Some(Value::String(l)) if l == "JSONPath" => {
                if jsonata {
                    errs.push((
                        "QueryLanguage".to_owned(),
                        "a JSONPath state in a JSONata machine is refused by Step Functions".to_owned(),
                    ));
                }
                false
            }
            Some(other) => {
                errs.push(("QueryLanguage".into(), format!("{other} is not JSONPath or JSONata")));
                jsonata
            }
        };
        // a branch's or a map's own states
        if let Some(Value::Array(branches)) = st.get_mut("Branches") {
            for (i, b) in branches.iter_mut().enumerate() {
                if let Some(Value::Object(s)) = b.get_mut("States") {
                    machine(&format!("{here}/branch {i}/"), s, lang, refusals, seen);
                }
            }
        }
        for p in ["ItemProcessor", "Iterator"] {
            if let Some(Value::Object(s)) = st.get_mut(p).and_then(|p| p.get_mut("States")) {
                machine(&format!("{here}/"), s, lang, refusals, seen);
            }
        }
        if lang {
            seen.jsonata = true;
            state(st, &mut errs, seen);
        } else {
            for f in ["Arguments", "Output"] {
                if st.contains_key(f) {
                    errs.push((f.into(), format!("{f} is a field of JSONata states, and this state is JSONPath (give \"QueryLanguage\": \"JSONata\" at the top of the definition or on the state)")));
                }
            }
        }
        refusals.extend(errs.into_iter().map(|(field, reason)| Refusal { state: here.clone(), field, reason }));
    }
}

/// One JSONata state rewritten in place; each field that cannot be added to `errs`.
fn state(st: &mut Map<String, Value>, errs: &mut Vec<(String, String)>, seen: &mut Seen) {
    let ty = st.get("Type").and_then(Value::as_str).unwrap_or("").to_owned();
    for f in JSONPATH_FIELDS {
        if st.contains_key(*f) {
            errs.push((
                (*f).into(),
                format!("{f} is a field of JSONPath states; a JSONata state has Arguments and Output"),
            ));
        }
    }
    // Assign reads what the JSONPath twin's Assign reads as `$`: a task's result, a Pass state's
    // input (when it has no Output, which becomes the result its twin's Assign would read), the
    // input of a Choice or a Wait
    let assign_reads = match ty.as_str() {
        "Task" | "Parallel" | "Map" => Some(Reads { input: None, result: Some("$"), error: None }),
        "Pass" if st.contains_key("Output") => None,
        _ => Some(INPUT),
    };
    if let Some(a) = st.get("Assign").cloned() {
        match assign_reads
            .map_or_else(|| assign(&a, Reads { input: None, result: None, error: None }), |r| assign(&a, r))
        {
            Ok(t) => {
                st.insert("Assign".into(), t);
            }
            Err(why) => errs.push(("Assign".into(), why)),
        }
    }
    if let Some(Err(why)) = st.remove("Arguments").map(|a| arguments(st, &a)) {
        errs.push(("Arguments".into(), why));
    }
    if let Some(Err(why)) = st.remove("Output").map(|o| output(st, &ty, &o)) {
        errs.push(("Output".into(), why));
    }
    if let Some(Value::Array(rules)) = st.get_mut("Choices") {
        let mut bad = Vec::new();
        for (i, r) in rules.iter_mut().enumerate() {
            let Value::Object(r) = r else { continue };
            if r.contains_key("Output") {
                bad.push((
                    format!("Choices[{i}]"),
                    "a rule's Output is not translated: shape the data in the state after it".to_owned(),
                ));
            }
            if let Some(a) = r.get("Assign").cloned() {
                match assign(&a, INPUT) {
                    Ok(t) => {
                        r.insert("Assign".into(), t);
                    }
                    Err(why) => bad.push((format!("Choices[{i}]"), format!("Assign: {why}"))),
                }
            }
            let Some(c) = r.remove("Condition") else {
                bad.push((format!("Choices[{i}]"), "a JSONata rule has a Condition".to_owned()));
                continue;
            };
            let translated = match whole(&c) {
                Some(e) => e.and_then(|e| {
                    seen.truthy |= truthy(&e);
                    rule(&e)
                }),
                None => Err(format!("{c} is not an expression {{% … %}}")),
            };
            match translated {
                Ok(Value::Object(t)) => r.extend(t),
                Ok(_) => {}
                Err(why) => bad.push((format!("Choices[{i}]"), format!("Condition: {why}"))),
            }
        }
        errs.extend(bad);
    }
    for (f, path_field) in [
        ("Seconds", "SecondsPath"),
        ("Timestamp", "TimestampPath"),
        ("Items", "ItemsPath"),
        ("Error", "ErrorPath"),
        ("Cause", "CausePath"),
    ] {
        let Some(Some(e)) = st.get(f).map(whole) else {
            if f == "Items" && st.get(f).is_some_and(|v| !v.is_string()) {
                errs.push((
                    f.into(),
                    "a Map over a literal array is not translated: give Items as a path of the input".into(),
                ));
            }
            continue;
        };
        st.remove(f);
        match e.and_then(|e| value(&e, INPUT)) {
            Ok(Jp::Path(p)) if !p.starts_with("States.") && !p.starts_with("$$") => {
                st.insert(path_field.into(), Value::String(p));
            }
            Ok(Jp::Lit(v)) => {
                st.insert(f.into(), v);
            }
            Ok(Jp::Path(p)) => errs.push((f.into(), format!("{p}: {f} reads one path of the input here"))),
            Err(why) => errs.push((f.into(), why)),
        }
    }
    if let Some(sel) = st.get("ItemSelector").cloned() {
        match template(&sel, INPUT) {
            Ok(t) => {
                st.insert("ItemSelector".into(), t);
            }
            Err(why) => errs.push(("ItemSelector".into(), why)),
        }
    }
    if let Some(Value::Array(catches)) = st.get_mut("Catch") {
        for (i, c) in catches.iter_mut().enumerate() {
            let Value::Object(c) = c else { continue };
            if let Some(a) = c.get("Assign").cloned() {
                match assign(&a, Reads { input: None, result: None, error: Some("$") }) {
                    Ok(t) => {
                        c.insert("Assign".into(), t);
                    }
                    Err(why) => errs.push((format!("Catch[{i}]"), format!("Assign: {why}"))),
                }
            }
            match c.remove("Output") {
                None => {}
                Some(o) => match whole(&o) {
                    Some(Ok(Ex::Path(Root::ErrorOutput, segs))) if segs.is_empty() => {}
                    _ => errs.push((
                        format!("Catch[{i}]"),
                        format!("Output {o}: a Catch's output here is the error ($states.errorOutput)"),
                    )),
                },
            }
        }
    }
    for (f, v) in st.iter() {
        if !matches!(f.as_str(), "Branches" | "ItemProcessor" | "Iterator")
            && has_expression(v)
            && !errs.iter().any(|(e, _)| e.starts_with(f.as_str()))
        {
            errs.push((f.clone(), "a JSONata expression in this field is not translated: write its value".into()));
        }
    }
}

/// An `Assign` (an object of variables) as its JSONPath twin, its expressions reading `reads`.
fn assign(a: &Value, reads: Reads) -> Result<Value, String> {
    if !a.is_object() {
        return Err(format!("{a} is not an object of variables"));
    }
    template(a, reads).map_err(|e| {
        if e.contains("is not read in this field") {
            format!("{e} (an Assign here reads a task's result, a Pass state's input when it has no Output, a Choice's or a Wait's input, a Catch's error)")
        } else {
            e
        }
    })
}

/// `Arguments` as `Parameters` (an object) or `InputPath` (one path of the input).
fn arguments(st: &mut Map<String, Value>, a: &Value) -> Result<(), String> {
    let Some(e) = whole(a) else {
        st.insert("Parameters".into(), template(a, INPUT)?);
        return Ok(());
    };
    match value(&e?, INPUT)? {
        Jp::Path(p) if !p.starts_with("States.") && !p.starts_with("$$") => {
            st.insert("InputPath".into(), Value::String(p));
            Ok(())
        }
        _ => Err("Arguments as one expression is a path of the input here".into()),
    }
}

/// `Output`: over the result (a Task, Parallel, Map) or the input (the other states).
fn output(st: &mut Map<String, Value>, ty: &str, o: &Value) -> Result<(), String> {
    let has_result = matches!(ty, "Task" | "Parallel" | "Map");
    if let Some(e) = whole(o) {
        let path = match e? {
            Ex::Path(Root::Result, segs) if has_result => path_text("$", &segs),
            Ex::Path(Root::Input, segs) => {
                if has_result {
                    st.insert("ResultPath".into(), Value::Null);
                }
                path_text("$", &segs)
            }
            _ => return Err("Output as one expression is a path of the result or the input here".into()),
        };
        st.insert("OutputPath".into(), Value::String(path));
        return Ok(());
    }
    if has_result {
        let reads = Reads { input: None, result: Some("$"), error: None };
        let t = template(o, reads).map_err(|e| {
            if e.contains("$states.input") {
                format!("{e}: an Output that reads the input and the result together is not translated")
            } else {
                e
            }
        })?;
        st.insert("ResultSelector".into(), t);
    } else if ty == "Pass" {
        if has_expression(o) {
            st.insert("Parameters".into(), template(o, INPUT)?);
        } else {
            st.insert("Result".into(), o.clone());
        }
    } else {
        return Err(format!(
            "Output on a {ty} state is translated when it is a path of the input ({{% $states.input.x %}})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(def: &Value) -> Value {
        rewrite(def).unwrap_or_else(|r| panic!("{r:#?}")).0
    }

    fn refused(def: &Value) -> Vec<Refusal> {
        rewrite(def).unwrap_err()
    }

    #[test]
    fn a_jsonata_task_reads_its_input_and_keeps_part_of_its_result_as_jsonpath_says() {
        let out = rw(&json!({"QueryLanguage": "JSONata", "StartAt": "A", "States": {"A": {
            "Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": true,
            "Arguments": {"FunctionName": "f", "Payload": "{% $states.input %}",
                          "Id": "{% $states.context.Execution.Id %}", "N": "{% 3 %}",
                          "Key": "{% 'order-' & $states.input.id & '.json' %}"},
            "Output": "{% $states.result.Payload %}"}}}));
        assert_eq!(
            out["States"]["A"],
            json!({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": true,
                   "Parameters": {"FunctionName": "f", "Payload.$": "$", "Id.$": "$$.Execution.Id", "N": 3,
                                  "Key.$": "States.Format('order-{}.json', $.id)"},
                   "OutputPath": "$.Payload"})
        );
        assert!(out.get("QueryLanguage").is_none());
    }

    #[test]
    fn conditions_become_rules_of_the_choice() {
        let out = rw(&json!({"QueryLanguage": "JSONata", "StartAt": "C", "States": {"C": {"Type": "Choice",
            "Choices": [
                {"Condition": "{% $states.input.Status = 'Failed' %}", "Next": "F"},
                {"Condition": "{% $states.input.n >= 10 and ($states.input.ok or $not($exists($states.input.x))) %}", "Next": "G"},
                {"Condition": "{% 5 > $states.input.n %}", "Next": "H"},
                {"Condition": "{% $states.input.s != null %}", "Next": "H"},
                {"Condition": "{% $states.input.n != -2.5 %}", "Next": "H"}],
            "Default": "D"}}}));
        assert_eq!(
            out["States"]["C"]["Choices"],
            json!([
                {"Variable": "$.Status", "StringEquals": "Failed", "Next": "F"},
                {"And": [{"Variable": "$.n", "NumericGreaterThanEquals": 10},
                         {"Or": [{"Variable": "$.ok", "BooleanEquals": true},
                                 {"Not": {"Variable": "$.x", "IsPresent": true}}]}], "Next": "G"},
                {"Variable": "$.n", "NumericLessThan": 5, "Next": "H"},
                {"And": [{"Variable": "$.s", "IsPresent": true}, {"Not": {"Variable": "$.s", "IsNull": true}}], "Next": "H"},
                {"And": [{"Variable": "$.n", "IsPresent": true}, {"Not": {"Variable": "$.n", "NumericEquals": -2.5}}], "Next": "H"}])
        );
    }

    #[test]
    fn waits_maps_fails_and_pass_states_take_their_path_fields() {
        let out = rw(&json!({"QueryLanguage": "JSONata", "StartAt": "W", "States": {
            "W": {"Type": "Wait", "Seconds": "{% $states.input.delay %}", "Next": "M"},
            "M": {"Type": "Map", "Items": "{% $states.input.lines %}", "Next": "P",
                  "ItemSelector": {"line": "{% $states.context.Map.Item.Value %}"},
                  "ItemProcessor": {"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                      "Arguments": {"FunctionName": "g", "Payload": "{% $states.input.line %}"}, "End": true}}}},
            "P": {"Type": "Pass", "Output": {"total": "{% $states.input.sum %}", "unit": "EUR"}, "Next": "X"},
            "X": {"Type": "Fail", "Error": "Bad", "Cause": "{% $states.input.why %}"}}}));
        let s = &out["States"];
        assert_eq!(s["W"]["SecondsPath"], "$.delay");
        assert_eq!(s["M"]["ItemsPath"], "$.lines");
        assert_eq!(s["M"]["ItemSelector"], json!({"line.$": "$$.Map.Item.Value"}));
        assert_eq!(s["M"]["ItemProcessor"]["States"]["T"]["Parameters"]["Payload.$"], "$.line");
        assert_eq!(s["P"]["Parameters"], json!({"total.$": "$.sum", "unit": "EUR"}));
        assert_eq!((s["X"]["Error"].clone(), s["X"]["CausePath"].clone()), (json!("Bad"), json!("$.why")));
    }

    #[test]
    fn a_jsonata_machine_s_variables_are_its_jsonpath_twin_s() {
        let task = || json!({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "TimeoutSeconds": 5});
        let mut get = task();
        get["Arguments"] = json!({"FunctionName": "get", "Payload": "{% $states.input %}"});
        get["Assign"] = json!({"total": "{% $states.result.Payload.sum %}", "tag": "t"});
        get["Catch"] = json!([{"ErrorEquals": ["States.ALL"], "Assign": {"why": "{% $states.errorOutput.Cause %}"}, "Next": "Say"}]);
        get["Next"] = json!("Big?");
        let mut say = task();
        say["Arguments"] = json!({"FunctionName": "say", "Payload": {"w": "{% $why %}"}});
        say["End"] = json!(true);
        let jsonata = json!({"QueryLanguage": "JSONata", "StartAt": "Get", "States": {
            "Get": get,
            "Big?": {"Type": "Choice", "Default": "Say", "Assign": {"why": "small"},
                     "Choices": [{"Condition": "{% $total > 10 %}", "Assign": {"why": "{% 'big ' & $tag %}"}, "Next": "Say"}]},
            "Say": say}});
        let mut get = task();
        get["Parameters"] = json!({"FunctionName": "get", "Payload.$": "$"});
        get["Assign"] = json!({"total.$": "$.Payload.sum", "tag": "t"});
        get["Catch"] = json!([{"ErrorEquals": ["States.ALL"], "Assign": {"why.$": "$.Cause"}, "Next": "Say"}]);
        get["Next"] = json!("Big?");
        let mut say = task();
        say["Parameters"] = json!({"FunctionName": "say", "Payload": {"w.$": "$why"}});
        say["End"] = json!(true);
        let twin = json!({"StartAt": "Get", "States": {
            "Get": get,
            "Big?": {"Type": "Choice", "Default": "Say", "Assign": {"why": "small"},
                     "Choices": [{"Variable": "$total", "NumericGreaterThan": 10,
                                  "Assign": {"why.$": "States.Format('big {}', $tag)"}, "Next": "Say"}]},
            "Say": say}});
        assert_eq!(rw(&jsonata)["States"], twin["States"]);
        let (a, b) = (crate::import("v", &jsonata).unwrap(), crate::import("v", &twin).unwrap());
        assert_eq!(a.workflows(), b.workflows());
        let say = a.workflows()[0]["steps"].as_array().unwrap().iter().find(|s| s["name"] == "Say").cloned().unwrap();
        let w = say["parameters"]["w"].to_string();
        for way in ["$.outputs.Get.error.message", "$.outputs.Get.sum", "small"] {
            assert!(w.contains(way), "{way} in {w}");
        }
        // a task's Assign is set when it succeeds: on the way through its Catch, not set
        let mut caught = jsonata.clone();
        caught["States"]["Say"]["Arguments"]["Payload"]["g"] = json!("{% $tag %}");
        let r = crate::import("v", &caught).unwrap_err();
        assert!(r.iter().any(|x| x.state == "Say" && x.reason.contains("$tag is not set on every way")), "{r:#?}");
    }

    #[test]
    fn what_the_subset_does_not_say_is_refused_naming_state_field_and_expression() {
        let r = refused(&json!({"QueryLanguage": "JSONata", "StartAt": "A", "States": {
            "A": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Next": "B",
                  "Arguments": {"FunctionName": "f", "Payload": {"id": "{% $uuid() %}"}},
                  "Assign": {"x": "{% $states.result %}"}},
            "B": {"Type": "Choice", "Choices": [{"Condition": "{% $states.input.a < $states.input.b %}", "Next": "A"}], "Default": "C"},
            "C": {"Type": "Pass", "Output": "{% $count($states.input.items) %}", "End": true,
                  "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "A", "Output": {"where": "{% $states.context.State.Name %}"}}]}}}));
        let has = |state: &str, field: &str, text: &str| {
            r.iter().any(|x| x.state == state && x.field == field && x.reason.contains(text))
        };
        assert!(has("A", "Arguments", "$uuid"), "{r:#?}");
        assert!(!r.iter().any(|x| x.field == "Assign"), "an Assign of the result is translated: {r:#?}");
        assert!(has("B", "Choices[0]", "two values read from the data"), "{r:#?}");
        assert!(has("C", "Output", "$count"), "{r:#?}");
        assert!(has("C", "Catch[0]", "$states.errorOutput"), "{r:#?}");
        let r = refused(&json!({"QueryLanguage": "JSONata", "StartAt": "A", "States": {"A": {"Type": "Pass",
            "Output": "{% $states.input.n + 1 %}", "InputPath": "$.x", "End": true}}}));
        assert!(r.iter().any(|x| x.field == "Output" && x.reason.contains("arithmetic")), "{r:#?}");
        assert!(r.iter().any(|x| x.field == "InputPath" && x.reason.contains("JSONPath")), "{r:#?}");
        // a task's Assign reads its result, not its input (its JSONPath twin's `$`)
        let r = refused(&json!({"QueryLanguage": "JSONata", "StartAt": "A", "States": {"A": {"Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke", "Arguments": {"FunctionName": "f"},
            "Assign": {"n": "{% $states.input.n %}"}, "End": true}}}));
        assert!(r.iter().any(|x| x.field == "Assign" && x.reason.contains("$states.input is not read")), "{r:#?}");
        // and a JSONPath machine's read of a variable set nowhere is refused naming it
        let r = crate::import("x", &json!({"StartAt": "A", "States": {"A": {"Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "f", "Payload": {"n.$": "$count"}},
            "End": true}}}))
        .unwrap_err();
        assert!(r[0].reason.contains("the variable $count is not set"), "{r:#?}");
    }

    #[test]
    fn a_jsonata_machine_imports_as_the_same_workflow_as_its_jsonpath_twin() {
        let task = |next: &str, args: Value, out: Value| {
            let mut t = json!({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Next": next,
                "Retry": [{"ErrorEquals": ["Lambda.TooManyRequestsException"], "IntervalSeconds": 1, "MaxAttempts": 3, "BackoffRate": 2}],
                "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Failed"}]});
            t.as_object_mut().unwrap().extend(args.as_object().unwrap().clone());
            t.as_object_mut().unwrap().extend(out.as_object().unwrap().clone());
            t
        };
        let jsonata = json!({"QueryLanguage": "JSONata", "Comment": "orders", "StartAt": "Check", "States": {
            "Check": task("Paid?", json!({"Arguments": {"FunctionName": "check", "Payload": {"id": "{% $states.input.order.id %}",
                "label": "{% 'order ' & $states.input.order.id %}"}}}), json!({"Output": "{% $states.result.Payload %}"})),
            "Paid?": {"Type": "Choice", "Choices": [{"Condition": "{% $states.input.paid = true and $states.input.total > 0 %}", "Next": "Ship"}],
                      "Default": "Failed"},
            "Ship": task("Done", json!({"Arguments": {"FunctionName": "ship", "Payload": "{% $states.input %}"}}),
                         json!({"Output": {"tracking": "{% $states.result.Payload.tracking %}"}})),
            "Done": {"Type": "Succeed"},
            "Failed": {"Type": "Fail", "Error": "{% 'OrderFailed' %}", "Cause": "not paid"}}});
        let jsonpath = json!({"Comment": "orders", "StartAt": "Check", "States": {
            "Check": task("Paid?", json!({"Parameters": {"FunctionName": "check", "Payload": {"id.$": "$.order.id",
                "label.$": "States.Format('order {}', $.order.id)"}}}), json!({"OutputPath": "$.Payload"})),
            "Paid?": {"Type": "Choice", "Choices": [{"And": [{"Variable": "$.paid", "BooleanEquals": true},
                {"Variable": "$.total", "NumericGreaterThan": 0}], "Next": "Ship"}], "Default": "Failed"},
            "Ship": task("Done", json!({"Parameters": {"FunctionName": "ship", "Payload.$": "$"}}),
                         json!({"ResultSelector": {"tracking.$": "$.Payload.tracking"}})),
            "Done": {"Type": "Succeed"},
            "Failed": {"Type": "Fail", "Error": "OrderFailed", "Cause": "not paid"}}});
        let a = crate::import("orders", &jsonata).unwrap_or_else(|r| panic!("{r:#?}"));
        let b = crate::import("orders", &jsonpath).unwrap_or_else(|r| panic!("{r:#?}"));
        assert_eq!(a.workflows(), b.workflows());
        assert_eq!(a.agents, b.agents);
        assert!(a.notes.iter().any(|n| n.contains("JSONata")), "{:?}", a.notes);
        let wf = json!({"workflows": a.workflows()}).to_string();
        sas_protocol::workflow::WorkflowRegistry::from_json(&wf).unwrap_or_else(|e| panic!("{e}\n{wf}"));
    }

    #[test]
    fn a_jsonpath_machine_comes_back_the_same() {
        let def = json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {"FunctionName": "f", "Payload.$": "$"}, "ResultPath": "$.r", "End": true}}});
        assert_eq!(rw(&def), def);
        let mut with = def.clone();
        with["QueryLanguage"] = json!("JSONPath");
        assert_eq!(rw(&with), def);
    }
}
