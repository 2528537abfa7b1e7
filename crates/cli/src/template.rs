//! What `template.yaml` says about the code this workspace ships in it: the functions whose
//! `CodeUri` is the workspace (`./`) with the cargo binary that is each one's `bootstrap`, and the
//! layers whose `ContentUri` is a local directory. The stack deployer ([`crate::stack`]) puts
//! placeholders in their place when the functions are off; the Lambda deployer ([`crate::lambda`])
//! zips and uploads them.
//!
//! The template is read with a YAML parser (saphyr), which keeps CloudFormation's short-form tags
//! (`!Ref`, `!If`, `!Sub`, `!GetAtt`...) as tagged nodes. A local `CodeUri`/`ContentUri` is
//! replaced where the parser found its value ([`replace_local_code`]), the rest of the text kept
//! as it is, and the result is parsed again to check that only those values changed.

use std::ops::Range;

use anyhow::{bail, ensure, Context, Result};
use saphyr::{LoadableYamlNode, MarkedYaml, YamlData};

/// One `AWS::Serverless::Function` of the template whose code is this workspace's: its logical
/// ID and the cargo binary (`Metadata.BuildProperties.Binary`) that is its `bootstrap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    pub logical_id: String,
    pub binary: String,
}

impl FunctionSpec {
    /// The stack output that names the deployed function (`SubmitterFunction` -> `SubmitterFunctionName`).
    pub fn output_key(&self) -> String {
        format!("{}Name", self.logical_id)
    }
}

/// One `AWS::Serverless::LayerVersion` of the template with a local `ContentUri` (a directory
/// relative to the template, as `sam deploy` zips it), e.g. `ConfigLayer` with `config/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpec {
    pub logical_id: String,
    pub content_uri: String,
}

/// The one document of `template`.
pub(crate) fn parse(template: &str) -> Result<MarkedYaml<'_>> {
    let mut docs = MarkedYaml::load_from_str(template).context("the template is not YAML")?;
    ensure!(docs.len() == 1, "the template holds {} YAML documents, not one", docs.len());
    Ok(docs.swap_remove(0))
}

/// `node`'s value when it is a string (a tagged node such as `!Ref X` is not).
fn text<'a>(node: &'a MarkedYaml<'_>) -> Option<&'a str> {
    node.data.as_str()
}

/// The node at `path` of mapping keys under `node`.
fn at<'a, 't>(node: &'a MarkedYaml<'t>, path: &[&str]) -> Option<&'a MarkedYaml<'t>> {
    path.iter().try_fold(node, |n, key| n.data.as_mapping_get(key))
}

/// The template's resources, in template order: logical ID, node.
fn resources<'a, 't>(doc: &'a MarkedYaml<'t>) -> Result<Vec<(&'a str, &'a MarkedYaml<'t>)>> {
    let Some(YamlData::Mapping(resources)) = at(doc, &["Resources"]).map(|r| &r.data) else {
        bail!("the template has no Resources mapping");
    };
    resources
        .iter()
        .map(|(id, node)| Ok((text(id).context("a resource's logical ID is not a string")?, node)))
        .collect()
}

/// A `ContentUri` that is a local directory (not `s3://...`, not a mapping, not a tagged node).
fn is_local_directory(uri: &str) -> bool {
    !uri.is_empty() && !uri.contains(':')
}

/// A resource's code that is on this machine: a function's `CodeUri: ./` or a layer's local
/// `ContentUri`, with where its value is in the template's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalCode {
    pub logical_id: String,
    /// `CodeUri` or `ContentUri`
    pub key: &'static str,
    pub value: String,
    /// the value's bytes in the template
    span: Range<usize>,
}

/// The functions' and layers' local code, in template order.
fn local_code(template: &str, doc: &MarkedYaml<'_>) -> Result<Vec<LocalCode>> {
    // the parser's markers count characters; the text is sliced in bytes
    let byte_at = |chars: usize| template.char_indices().nth(chars).map_or(template.len(), |(b, _)| b);
    let mut found = Vec::new();
    for (id, resource) in resources(doc)? {
        let (key, local): (&'static str, fn(&str) -> bool) = match at(resource, &["Type"]).and_then(text) {
            Some("AWS::Serverless::Function") => ("CodeUri", |v| v == "./"),
            Some("AWS::Serverless::LayerVersion") => ("ContentUri", is_local_directory),
            _ => continue,
        };
        let Some(node) = at(resource, &["Properties", key]) else { continue };
        let Some(value) = text(node).filter(|v| local(v)) else { continue };
        let span = byte_at(node.span.start.index())..byte_at(node.span.end.index());
        ensure!(
            template.get(span.clone()) == Some(value),
            "{id}'s {key} {value:?} is not where the parser says ({:?}): quoted or split over lines?",
            template.get(span.clone())
        );
        found.push(LocalCode { logical_id: id.to_owned(), key, value: value.to_owned(), span });
    }
    Ok(found)
}

/// The functions of `template` with a local `CodeUri: ./` and a `Metadata.BuildProperties.Binary`,
/// in template order.
pub fn functions(template: &str) -> Result<Vec<FunctionSpec>> {
    let doc = parse(template)?;
    let mut found = Vec::new();
    for (id, resource) in resources(&doc)? {
        if at(resource, &["Type"]).and_then(text) != Some("AWS::Serverless::Function")
            || at(resource, &["Properties", "CodeUri"]).and_then(text) != Some("./")
        {
            continue;
        }
        if let Some(binary) = at(resource, &["Metadata", "BuildProperties", "Binary"]).and_then(text) {
            found.push(FunctionSpec { logical_id: id.to_owned(), binary: binary.to_owned() });
        }
    }
    Ok(found)
}

/// The layers of `template` with a local `ContentUri`, in template order.
pub fn layers(template: &str) -> Result<Vec<LayerSpec>> {
    let doc = parse(template)?;
    Ok(local_code(template, &doc)?
        .into_iter()
        .filter(|c| c.key == "ContentUri")
        .map(|c| LayerSpec { logical_id: c.logical_id, content_uri: c.value })
        .collect())
}

/// `template` with the value of each local `CodeUri`/`ContentUri` that `with` gives a URI for
/// replaced by that URI (as a plain scalar, where the old value was), and how many were. The
/// result is parsed again: it must be the same document but for those values, each now its URI.
pub(crate) fn replace_local_code(
    template: &str,
    with: impl Fn(&LocalCode) -> Option<String>,
) -> Result<(String, usize)> {
    let doc = parse(template)?;
    let mut out = String::with_capacity(template.len() + 512);
    let mut replaced = Vec::new();
    let mut copied = 0;
    for code in local_code(template, &doc)? {
        if let Some(uri) = with(&code) {
            out.push_str(&template[copied..code.span.start]);
            out.push_str(&uri);
            copied = code.span.end;
            replaced.push((code, uri));
        }
    }
    out.push_str(&template[copied..]);
    // the same document, but for the values replaced
    let mut want = doc;
    for (code, uri) in &replaced {
        let node = want
            .data
            .as_mapping_get_mut("Resources")
            .and_then(|r| r.data.as_mapping_get_mut(&code.logical_id))
            .and_then(|r| r.data.as_mapping_get_mut("Properties"))
            .and_then(|p| p.data.as_mapping_get_mut(code.key))
            .context("a replaced value's node")?;
        *node = MarkedYaml::scalar_from_string(uri.clone());
        ensure!(text(node) == Some(uri.as_str()), "{uri:?} is not a plain YAML string");
    }
    ensure!(parse(&out)? == want, "replacing the local code URIs changed more than those values");
    Ok((out, replaced.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = include_str!("../../../template.yaml");

    #[test]
    fn the_shipped_template_parses_with_its_short_form_tags() {
        let doc = parse(TEMPLATE).unwrap();
        let tag = |path: &[&str]| match &at(&doc, path).unwrap().data {
            YamlData::Tagged(tag, _) => tag.suffix.clone(),
            other => panic!("{path:?} is not tagged: {other:?}"),
        };
        assert_eq!(tag(&["Conditions", "FunctionsEnabled"]), "Equals");
        assert_eq!(tag(&["Resources", "ConfigLayer", "Properties", "LayerName"]), "Sub");
        assert_eq!(tag(&["Resources", "SubmitterFunction", "Properties", "LoggingConfig", "LogGroup"]), "Ref");
        let resources = resources(&doc).unwrap();
        assert!(resources.len() > 50, "{} resources", resources.len());
        assert_eq!(at(&doc, &["Transform"]).and_then(text), Some("AWS::Serverless-2016-10-31"));
        // the template's functions and layer, and the local code a deployment replaces
        assert_eq!(functions(TEMPLATE).unwrap().len(), 5);
        assert_eq!(
            layers(TEMPLATE).unwrap(),
            [LayerSpec { logical_id: "ConfigLayer".into(), content_uri: "config/".into() }]
        );
        let code = local_code(TEMPLATE, &doc).unwrap();
        let got: Vec<(&str, &str, &str)> =
            code.iter().map(|c| (c.logical_id.as_str(), c.key, c.value.as_str())).collect();
        assert_eq!(
            got,
            [
                ("ConfigLayer", "ContentUri", "config/"),
                ("SubmitterFunction", "CodeUri", "./"),
                ("SchedulerFunction", "CodeUri", "./"),
                ("AgentFunction", "CodeUri", "./"),
                ("SupervisorFunction", "CodeUri", "./"),
                ("CallbackFunction", "CodeUri", "./"),
            ]
        );
    }

    #[test]
    fn only_layers_with_a_local_directory_are_found() {
        let t = "Parameters:\n  ContentUri:\n    Type: String\nResources:\n  A:\n    Type: AWS::Serverless::LayerVersion\n\
                 # a comment\n\n    Properties:\n      ContentUri: layers/a/\n  B:\n    Type: AWS::Serverless::LayerVersion\n\
                 \x20   Properties:\n      ContentUri: s3://bucket/b.zip\n  C:\n    Type: AWS::Serverless::Function\n\
                 \x20   Properties:\n      ContentUri: c/\n  E:\n    Type: AWS::Serverless::LayerVersion\n\
                 \x20   Properties:\n      ContentUri: !Ref LayerUri\nOutputs:\n  D:\n    Value: x\n";
        assert_eq!(layers(t).unwrap(), [LayerSpec { logical_id: "A".into(), content_uri: "layers/a/".into() }]);
    }

    #[test]
    fn functions_need_local_code_and_a_binary_in_any_layout_yaml_allows() {
        // flow mappings, other indentation, a comment after the value, keys in another order
        let t = "Resources:\n    F: {Type: AWS::Serverless::Function, Properties: {CodeUri: ./}, \
                 Metadata: {BuildProperties: {Binary: f-bin}}}\n    G:\n        Metadata:\n            BuildProperties:\n\
                 \x20               Binary: g-bin\n        Properties:\n            CodeUri: ./ # the workspace\n\
                 \x20       Type: AWS::Serverless::Function\n    H:\n        Type: AWS::Serverless::Function\n\
                 \x20       Properties: {CodeUri: s3://b/h.zip}\n        Metadata: {BuildProperties: {Binary: h-bin}}\n\
                 \x20   I:\n        Type: AWS::Serverless::Function\n        Properties: {CodeUri: ./}\n";
        let f: Vec<(String, String)> = functions(t).unwrap().into_iter().map(|f| (f.logical_id, f.binary)).collect();
        assert_eq!(f, [("F".to_owned(), "f-bin".to_owned()), ("G".to_owned(), "g-bin".to_owned())]);
        let (out, n) = replace_local_code(t, |c| Some(format!("s3://b/{}.zip", c.logical_id))).unwrap();
        assert_eq!(n, 3, "I has local code too, without a binary");
        assert!(
            out.contains("{CodeUri: s3://b/F.zip}") && out.contains("CodeUri: s3://b/G.zip # the workspace"),
            "{out}"
        );
        assert!(functions(&out).unwrap().is_empty());
    }

    #[test]
    fn a_replacement_that_would_change_more_than_its_value_is_refused() {
        let t = "Resources:\n  L:\n    Type: AWS::Serverless::LayerVersion\n    Properties:\n      ContentUri: dir/\n";
        let (out, n) = replace_local_code(t, |_| Some("s3://b/l.zip".into())).unwrap();
        assert_eq!((out.as_str(), n), (t.replace("dir/", "s3://b/l.zip").as_str(), 1));
        let e = replace_local_code(t, |_| Some("x\n      Extra: 1".into())).unwrap_err();
        assert!(format!("{e:#}").contains("changed more than"), "{e:#}");
        let e = replace_local_code(t, |_| Some("x # y".into())).unwrap_err();
        assert!(format!("{e:#}").contains("changed more than"), "{e:#}");
        assert!(parse("a: [").is_err() && functions("a: 1\n---\nb: 2\n").is_err());
        assert!(functions("Parameters: {}\n").is_err(), "no Resources");
    }
}
