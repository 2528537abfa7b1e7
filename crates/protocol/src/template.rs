//! Data in and out of a step: a template is JSON in which a key that ends in `.$` takes the value
//! at a path instead of the value written (the States Language's `Parameters` and
//! `ResultSelector`): `{"amount.$": "$.input.total", "currency": "EUR"}` is, for an input whose
//! total is 12, `{"amount": 12, "currency": "EUR"}`.
//!
//! - a step's `parameters`: what its agent receives, read from the task's input and the outputs
//!   of the steps before it (paths `$.input…`, `$.outputs.<step>…`); without it the agent receives
//!   the whole `{"input", "outputs"}`;
//! - a step's `result_selector`: what of the agent's answer the step keeps as its output (paths
//!   into the answer: `$.id`, `$.body.charge`; `$` is the whole answer);
//! - a workflow's `result`: what a `Processed` task's last status carries, from the input and
//!   every step's output.
//!
//! The key `*.$` takes the whole value at its path: alone, the template is that value (an
//! array, a number, an object); beside other keys, the value's members come first and the other
//! keys are added to them or replace them, `{"*.$": "$.input", "quote.$": "$.outputs.quote"}` being
//! the input with a `quote` member (a value that is not an object then gives only the other keys).
//! So a template can pass a value on whole, and add to one, as the States Language's `ResultPath`
//! does. The key `*` alone gives the whole value written (`{"*": "Your order shipped"}` is that
//! string; `{"*": [{"*.$": "$.outputs.a"}, 2]}` an array), for a value that is not an object.
//! The key `*.choose` alone gives the value of the first of its choices whose `when` (a
//! [condition](crate::condition) over the task) holds, or that has none:
//! `{"*.choose": [{"when": {"variable": "$.input.express", "boolean_equals": true},
//! "value": {"*.$": "$.outputs.courier"}}, {"value": {"*.$": "$.outputs.post"}}]}` (`null` when
//! none holds): data that depends on which way a task went. Only in templates read over the task.
//!
//! A `.$` value may also call an intrinsic function of the States Language
//! (`"greeting.$": "States.Format('Hello {}', $.input.name)"`, see [`crate::intrinsic`]).
//!
//! A path that names nothing when the template is filled gives `null` (a skipped step has no
//! output); one that can never name anything (a step that does not come before) is refused when
//! the workflow loads.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::condition::{Condition, DataPath, Scope};
use crate::intrinsic::{self, Call};

/// What a template's paths are read against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The task: `$.input…`, `$.outputs.<step>…`.
    Task,
    /// One value (a step's answer): `$`, `$.id`.
    Answer,
}

/// A parsed template (see the module's docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    over: Over,
    root: Node,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Value(Value),
    Path(DataPath),
    Object(Vec<(String, Node)>),
    /// `{"*.$": path, ...}`: the value at the path, with the other members added to it.
    Spread(DataPath, Vec<(String, Node)>),
    /// `{"*": value}`: the value written (with paths inside it), not an object of one member.
    Whole(Box<Node>),
    /// `"key.$": "States.Format(...)"`: an intrinsic function's value.
    Call(Call),
    /// `{"*.choose": [{"when": condition, "value": template}, ...]}`: the first that holds.
    Choose(Vec<(Option<Condition>, Node)>),
    Array(Vec<Node>),
}

/// The key whose path gives the whole value (see the module's docs).
pub const WHOLE: &str = "*";

/// The key of a value chosen by conditions (see the module's docs).
pub const CHOOSE: &str = "*.choose";

/// The most bytes a template may take, written out.
pub const MAX_TEMPLATE_BYTES: usize = 16 * 1024;

impl Template {
    /// Read a template whose paths are read `over` the task or an answer; the error names the
    /// key whose path is wrong.
    pub fn from_json(v: &Value, over: Over) -> Result<Template, String> {
        if crate::messages::json_len(v) > MAX_TEMPLATE_BYTES {
            return Err(format!("a template takes at most {MAX_TEMPLATE_BYTES} bytes"));
        }
        if !v.is_object() {
            return Err(format!("a template is an object ({{\"amount.$\": \"$.input.total\"}}), not {v}"));
        }
        Ok(Template { over, root: node(v, over, "")? })
    }

    /// Every path the template reads.
    pub fn paths(&self) -> Vec<&DataPath> {
        fn visit<'a>(n: &'a Node, out: &mut Vec<&'a DataPath>) {
            match n {
                Node::Path(p) => out.push(p),
                Node::Object(m) => m.iter().for_each(|(_, x)| visit(x, out)),
                Node::Spread(p, m) => {
                    out.push(p);
                    for (_, x) in m {
                        visit(x, out);
                    }
                }
                Node::Whole(x) => visit(x, out),
                Node::Call(c) => out.extend(c.paths()),
                Node::Choose(cs) => {
                    for (c, x) in cs {
                        out.extend(c.iter().flat_map(Condition::paths));
                        visit(x, out);
                    }
                }
                Node::Array(a) => a.iter().for_each(|x| visit(x, out)),
                Node::Value(_) => {}
            }
        }
        let mut out = Vec::new();
        visit(&self.root, &mut out);
        out
    }

    /// Fill a template read over the task.
    pub fn fill(&self, scope: &dyn Scope) -> Value {
        debug_assert_eq!(self.over, Over::Task);
        render(&self.root, &|p| p.value(scope).map(std::borrow::Cow::into_owned), Some(scope))
    }

    /// Fill a template read over an answer.
    pub fn fill_from(&self, answer: &Value) -> Value {
        debug_assert_eq!(self.over, Over::Answer);
        render(&self.root, &|p| p.value_in(answer), None)
    }

    pub fn to_json(&self) -> Value {
        fn members(m: &[(String, Node)]) -> impl Iterator<Item = (String, Value)> + '_ {
            m.iter().map(|(k, x)| {
                (if matches!(x, Node::Path(_) | Node::Call(_)) { format!("{k}.$") } else { k.clone() }, back(x))
            })
        }
        fn back(n: &Node) -> Value {
            match n {
                Node::Value(v) => v.clone(),
                Node::Path(p) => Value::String(p.as_str().to_owned()),
                Node::Object(m) => Value::Object(members(m).collect()),
                Node::Spread(p, m) => Value::Object(
                    std::iter::once((format!("{WHOLE}.$"), Value::String(p.as_str().to_owned())))
                        .chain(members(m))
                        .collect(),
                ),
                Node::Whole(x) if matches!(**x, Node::Call(_)) => serde_json::json!({ format!("{WHOLE}.$"): back(x) }),
                Node::Whole(x) => serde_json::json!({ WHOLE: back(x) }),
                Node::Call(c) => Value::String(c.to_text()),
                Node::Choose(cs) => {
                    let list: Vec<Value> = cs
                        .iter()
                        .map(|(c, x)| match c {
                            Some(c) => serde_json::json!({"when": c.to_json(), "value": back(x)}),
                            None => serde_json::json!({"value": back(x)}),
                        })
                        .collect();
                    serde_json::json!({ CHOOSE: list })
                }
                Node::Array(a) => Value::Array(a.iter().map(back).collect()),
            }
        }
        back(&self.root)
    }
}

fn node(v: &Value, over: Over, at: &str) -> Result<Node, String> {
    Ok(match v {
        Value::Object(m) if m.contains_key(CHOOSE) => choose(m, over, at)?,
        Value::Object(m) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, x) in m {
                let here = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                match k.strip_suffix(".$") {
                    Some(name) => {
                        let Value::String(p) = x else { return Err(format!("{here} takes a path, not {x}")) };
                        let parse = |p: &str| match over {
                            Over::Task => DataPath::parse_many(p),
                            Over::Answer => DataPath::parse_relative_many(p),
                        };
                        let read = if intrinsic::is_call(p) {
                            Node::Call(Call::parse(p, &parse).map_err(|e| format!("{here}: {e}"))?)
                        } else {
                            Node::Path(parse(p).map_err(|e| format!("{here}: {e}"))?)
                        };
                        if out.iter().any(|(n, _): &(String, Node)| n == name) || m.contains_key(name) {
                            return Err(format!("{here}: {name} is given twice"));
                        }
                        out.push((name.to_owned(), read));
                    }
                    None => out.push((k.clone(), node(x, over, &here)?)),
                }
            }
            match out.iter().position(|(k, _)| k == WHOLE) {
                Some(i) if matches!(out[i].1, Node::Path(_)) => {
                    let Node::Path(p) = out.remove(i).1 else { unreachable!("matched above") };
                    Node::Spread(p, out)
                }
                Some(_) if out.len() == 1 => Node::Whole(Box::new(out.remove(0).1)),
                Some(_) => {
                    return Err(format!(
                        "{at}{}the key {WHOLE} (a whole value) stands alone",
                        if at.is_empty() { "" } else { ": " }
                    ))
                }
                None => Node::Object(out),
            }
        }
        Value::Array(a) => Node::Array(a.iter().map(|x| node(x, over, at)).collect::<Result<_, _>>()?),
        other => Node::Value(other.clone()),
    })
}

fn choose(m: &Map<String, Value>, over: Over, at: &str) -> Result<Node, String> {
    let here = if at.is_empty() { CHOOSE.to_owned() } else { format!("{at}.{CHOOSE}") };
    if m.len() != 1 {
        return Err(format!("{here}: the key {CHOOSE} stands alone"));
    }
    if over != Over::Task {
        return Err(format!("{here}: a choice reads the task; it is not for a template read over an answer"));
    }
    let Some(Value::Array(list)) = m.get(CHOOSE) else {
        return Err(format!("{here} takes a list of {{\"when\": condition, \"value\": template}}"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        let Value::Object(c) = c else { return Err(format!("{here}[{i}] is an object")) };
        if let Some(k) = c.keys().find(|k| !matches!(k.as_str(), "when" | "value")) {
            return Err(format!("{here}[{i}]: {k} is not when or value"));
        }
        let when = c.get("when").map(Condition::from_json).transpose().map_err(|e| format!("{here}[{i}].when: {e}"))?;
        let value = node(c.get("value").unwrap_or(&Value::Null), over, &format!("{here}[{i}].value"))?;
        out.push((when, value));
    }
    Ok(Node::Choose(out))
}

fn render(n: &Node, look: &dyn Fn(&DataPath) -> Option<Value>, scope: Option<&dyn Scope>) -> Value {
    match n {
        Node::Value(v) => v.clone(),
        Node::Path(p) => look(p).unwrap_or(Value::Null),
        Node::Object(m) => {
            Value::Object(m.iter().map(|(k, x)| (k.clone(), render(x, look, scope))).collect::<Map<_, _>>())
        }
        Node::Whole(x) => render(x, look, scope),
        Node::Call(c) => c.eval(look).unwrap_or(Value::Null),
        Node::Choose(cs) => cs
            .iter()
            .find(|(c, _)| c.as_ref().is_none_or(|c| scope.is_some_and(|s| c.holds(s))))
            .map_or(Value::Null, |(_, x)| render(x, look, scope)),
        Node::Spread(p, m) => {
            let whole = look(p).unwrap_or(Value::Null);
            if m.is_empty() {
                return whole;
            }
            let mut out = match whole {
                Value::Object(o) => o,
                _ => Map::new(),
            };
            for (k, x) in m {
                out.insert(k.clone(), render(x, look, scope));
            }
            Value::Object(out)
        }
        Node::Array(a) => Value::Array(a.iter().map(|x| render(x, look, scope)).collect()),
    }
}

/// A template read over the task (`parameters`, a workflow's `result`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskTemplate(pub Template);

impl TaskTemplate {
    /// The names it sets at its top level, as a step's `assign`: `None` when the template is not an object
    /// of named members (a `*` or `*.$` value, a `*.choose`).
    pub fn top_level_names(&self) -> Option<Vec<&str>> {
        match &self.0.root {
            Node::Object(members) => Some(members.iter().map(|(k, _)| k.as_str()).collect()),
            _ => None,
        }
    }

    /// Whether, as a step's `assign`, it sets variable `name`.
    pub fn sets(&self, name: &str) -> bool {
        self.top_level_names().is_some_and(|names| names.contains(&name))
    }
}

/// A template read over a step's answer (`result_selector`).
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerTemplate(pub Template);

macro_rules! serde_template {
    ($t:ident, $over:expr, $name:literal, $about:literal) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.to_json().serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = Value::deserialize(d)?;
                Template::from_json(&v, $over).map($t).map_err(serde::de::Error::custom)
            }
        }

        #[cfg(feature = "schema")]
        impl schemars::JsonSchema for $t {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                $name.into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({"description": $about, "type": "object"})
            }
        }
    };
}

serde_template!(
    TaskTemplate,
    Over::Task,
    "TaskTemplate",
    "JSON in which a key ending in .$ takes the value at a path into the task ($.input.total, $.outputs.quote.id); the key *.$ the whole value there, the other keys added to it."
);
serde_template!(
    AnswerTemplate,
    Over::Answer,
    "AnswerTemplate",
    "JSON in which a key ending in .$ takes the value at a path into the agent's answer ($ is the answer, $.id a member)."
);

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
    }

    #[test]
    fn a_path_that_names_many_values_gives_their_array_as_a_state_machine_s_path_does() {
        let data = Data(
            json!({"rows": [{"n": 1}, {"n": 2}, {"n": 3}], "label": "x"}),
            json!({"list": {"Versions": [{"Version": "1"}, {"Version": "2"}], "Labels": [{"Name": "Receipt", "c": 9}]}}),
        );
        let t = json!({"rest.$": "$.input.rows[1:]", "ns.$": "$.input.rows[*].n", "versions.$": "$.outputs.list.Versions[*].Version",
                       "receipt.$": "$.outputs.list.Labels[?@.Name == 'Receipt']", "none.$": "$.input.rows[9:]",
                       "count.$": "States.ArrayLength($.input.rows[?@.n > 1])", "missing.$": "$.input.nowhere[*]"});
        let tpl = Template::from_json(&t, Over::Task).unwrap();
        assert_eq!(
            tpl.fill(&data),
            json!({"rest": [{"n": 2}, {"n": 3}], "ns": [1, 2, 3], "versions": ["1", "2"],
                   "receipt": [{"Name": "Receipt", "c": 9}], "none": [], "count": 2, "missing": null})
        );
        assert_eq!(tpl.to_json(), t, "written back as read");
        // as Step Functions gives them: one value that is not an array's element is itself; a
        // filter that matches nothing names nothing (null here; Step Functions fails the state)
        let quirks = json!({"one.$": "$.input.rows[?@.n == 2].n", "whole.$": "$.input.rows[?@.n == 2]",
                            "nothing.$": "$.input.rows[?@.n == 7].n", "first.$": "$.input.rows[*].n[0]"});
        let data = Data(json!({"rows": [{"n": 1}, {"n": 2}, {"n": [5]}]}), json!({}));
        assert_eq!(
            Template::from_json(&quirks, Over::Task).unwrap().fill(&data),
            json!({"one": 2, "whole": [{"n": 2}], "nothing": null, "first": 5})
        );
        let sel =
            Template::from_json(&json!({"v.$": "$.Versions[*].Version", "first.$": "$.Versions[0]"}), Over::Answer)
                .unwrap();
        assert_eq!(
            sel.fill_from(&json!({"Versions": [{"Version": "a"}, {"Version": "b"}]})),
            json!({"v": ["a", "b"], "first": {"Version": "a"}})
        );
        // a condition reads one value; a filter of another dialect is refused with the reason
        assert!(Condition::from_json(&json!({"variable": "$.input.rows[*].n", "is_present": true})).is_err());
        let err = Template::from_json(&json!({"x.$": "$.input.rows[?(@.n==one)]"}), Over::Task).unwrap_err();
        assert!(err.starts_with("x.$: "), "{err}");
        assert!(Template::from_json(&json!({"x.$": "$.task.id[*]"}), Over::Task).is_err());
    }

    #[test]
    fn a_template_takes_values_at_paths_and_keeps_the_rest() {
        let t = json!({"amount.$": "$.input.total", "currency": "EUR", "lines": [{"sku.$": "$.input.lines[0].sku"}],
                       "quote.$": "$.outputs.quote", "gone.$": "$.outputs.skipped.id", "nested": {"n": 1}});
        let tpl = Template::from_json(&t, Over::Task).unwrap();
        let data = Data(json!({"total": 12, "lines": [{"sku": "a"}]}), json!({"quote": {"id": "q1"}}));
        assert_eq!(
            tpl.fill(&data),
            json!({"amount": 12, "currency": "EUR", "lines": [{"sku": "a"}], "quote": {"id": "q1"}, "gone": null,
                   "nested": {"n": 1}})
        );
        assert_eq!(tpl.to_json(), t, "written back as read");
        assert_eq!(tpl.paths().len(), 4);
        let sel = Template::from_json(&json!({"charge_id.$": "$.body.id", "all.$": "$"}), Over::Answer).unwrap();
        assert_eq!(sel.fill_from(&json!({"body": {"id": 7}})), json!({"charge_id": 7, "all": {"body": {"id": 7}}}));
    }

    #[test]
    fn the_task_s_id_is_read_at_its_own_path_and_in_intrinsic_calls() {
        struct Named(Value);
        impl Scope for Named {
            fn input(&self) -> &Value {
                &self.0
            }
            fn output(&self, _: &str) -> Option<&Value> {
                None
            }
            fn task_id(&self) -> Option<&str> {
                Some("order-42")
            }
        }
        let t = json!({"ref.$": "$.task.id", "label.$": "States.Format('{}/{}', $.task.id, $.input.n)"});
        let tpl = Template::from_json(&t, Over::Task).unwrap();
        assert_eq!(tpl.fill(&Named(json!({"n": 3}))), json!({"ref": "order-42", "label": "order-42/3"}));
        assert_eq!(
            tpl.fill(&Data(json!({"n": 3}), json!({}))),
            json!({"ref": null, "label": null}),
            "a scope that is no task's has no id"
        );
    }

    #[test]
    fn the_whole_key_passes_a_value_on_and_adds_members_to_an_object() {
        let data = Data(json!({"total": 12, "lines": [1, 2], "keep": "me"}), json!({"quote": {"id": "q1"}}));
        let fill = |t: Value| {
            let tpl = Template::from_json(&t, Over::Task).unwrap();
            assert_eq!(tpl.to_json(), t, "written back as read");
            tpl.fill(&data)
        };
        assert_eq!(fill(json!({"*.$": "$.input.lines"})), json!([1, 2]), "alone: the value itself");
        assert_eq!(
            fill(json!({"*.$": "$.input", "total": 13, "quote.$": "$.outputs.quote.id"})),
            json!({"total": 13, "lines": [1, 2], "keep": "me", "quote": "q1"}),
            "beside others: the members, then the others added or replaced"
        );
        assert_eq!(fill(json!({"*.$": "$.input.total", "a": 1})), json!({"a": 1}), "not an object: the others only");
        assert_eq!(fill(json!({"x": [{"*.$": "$.input.keep"}]})), json!({"x": ["me"]}), "inside an array");
        assert_eq!(fill(json!({"*": "Your order shipped"})), json!("Your order shipped"), "a whole value written");
        assert_eq!(fill(json!({"*": [{"*.$": "$.input.total"}, 2]})), json!([12, 2]), "with paths inside it");
        assert!(Template::from_json(&json!({"*": 1, "a": 2}), Over::Task).unwrap_err().contains("stands alone"));
        // an intrinsic function's value, whole or as a member
        let data = Data(json!({"name": "Ada", "lines": [1, 2]}), json!({}));
        let t = json!({"hi.$": "States.Format('Hello {}', $.input.name)", "n.$": "States.ArrayLength($.input.lines)"});
        let tpl = Template::from_json(&t, Over::Task).unwrap();
        assert_eq!(tpl.to_json(), t);
        assert_eq!(tpl.fill(&data), json!({"hi": "Hello Ada", "n": 2}));
        assert_eq!(tpl.paths().len(), 2);
        let whole = json!({"*.$": "States.Array($.input.name, 1)"});
        let tpl = Template::from_json(&whole, Over::Task).unwrap();
        assert_eq!((tpl.fill(&data), tpl.to_json()), (json!(["Ada", 1]), whole));
        assert!(Template::from_json(&json!({"a.$": "States.UUID()"}), Over::Task).unwrap_err().starts_with("a.$: "));
    }

    #[test]
    fn a_choice_gives_the_first_value_whose_condition_holds() {
        let t = json!({"label.*": 1, "via": {"*.choose": [
            {"when": {"variable": "$.input.total", "numeric_greater_than": 100}, "value": {"*.$": "$.outputs.quote"}},
            {"when": {"variable": "$.input.keep", "is_present": true}, "value": {"k.$": "$.input.keep"}},
            {"value": "none"}]}});
        let tpl = Template::from_json(&t, Over::Task).unwrap();
        assert_eq!(tpl.to_json(), t, "written back as read");
        assert_eq!(tpl.paths().len(), 4, "the conditions' paths are read too");
        let quote = json!({"quote": {"id": "q1"}});
        assert_eq!(tpl.fill(&Data(json!({"total": 120}), quote.clone()))["via"], json!({"id": "q1"}));
        assert_eq!(tpl.fill(&Data(json!({"total": 12, "keep": 3}), quote.clone()))["via"], json!({"k": 3}));
        assert_eq!(tpl.fill(&Data(json!({"total": 12}), quote))["via"], json!("none"));
        let none = Template::from_json(
            &json!({"*.choose": [{"when": {"variable": "$.input.x", "is_present": true}, "value": 1}]}),
            Over::Task,
        );
        assert_eq!(none.unwrap().fill(&Data(json!({}), json!({}))), Value::Null, "none holds: null");
        let err = |v: Value, over| Template::from_json(&v, over).unwrap_err();
        assert!(err(json!({"*.choose": [], "a": 1}), Over::Task).contains("stands alone"));
        assert!(err(json!({"*.choose": [{"value": 1}]}), Over::Answer).contains("reads the task"));
        assert!(err(json!({"*.choose": [{"when": {"variable": "$.x", "is_present": true}, "value": 1}]}), Over::Task)
            .contains("when"));
        let t = Template::from_json(&json!({"*.$": "$.outputs.quote", "a.$": "$.input.total"}), Over::Task).unwrap();
        assert_eq!(t.paths().len(), 2, "the whole key's path is read too");
        assert_eq!(
            Template::from_json(&json!({"*.$": "$.body", "n": 1}), Over::Answer)
                .unwrap()
                .fill_from(&json!({"body": {"m": 2}})),
            json!({"m": 2, "n": 1})
        );
    }

    #[test]
    fn a_template_that_cannot_be_read_names_the_key() {
        let err = |v: Value, over| Template::from_json(&v, over).unwrap_err();
        assert!(err(json!({"a": {"b.$": "$.order.x"}}), Over::Task).starts_with("a.b.$: "), "the path must be rooted");
        assert!(err(json!({"a.$": 3}), Over::Task).contains("a.$ takes a path"));
        assert!(err(json!({"a.$": "$.input.x", "a": 1}), Over::Task).contains("given twice"));
        assert!(err(json!({"a.$": "$.x[?(@.n==one)]"}), Over::Answer).contains("not a JSONPath"));
        assert!(err(json!("$.input"), Over::Task).contains("is an object"));
    }
}
