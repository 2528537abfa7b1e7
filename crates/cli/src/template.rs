//! What `template.yaml` says about the code this workspace ships in it: the functions whose
//! `CodeUri` is the workspace (`./`) with the cargo binary that is each one's `bootstrap`, and the
//! layers whose `ContentUri` is a local directory. The stack deployer ([`crate::stack`]) puts
//! placeholders in their place when the functions are off; the Lambda deployer ([`crate::lambda`])
//! zips and uploads them.

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

/// A logical ID line under `Resources:` (two spaces, a name, a colon).
pub(crate) fn resource_line(line: &str) -> Option<&str> {
    let name = line.strip_prefix("  ")?.strip_suffix(':')?;
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric())).then_some(name)
}

pub(crate) fn is_local_code_uri(line: &str) -> bool {
    line.trim() == "CodeUri: ./"
}

/// The functions of `template` with a local `CodeUri: ./`, in template order.
pub fn functions(template: &str) -> Vec<FunctionSpec> {
    let mut found = Vec::new();
    let mut current: Option<&str> = None;
    let (mut binary, mut local) = (None::<String>, false);
    let mut flush = |id: Option<&str>, binary: &mut Option<String>, local: &mut bool| {
        if let (Some(id), Some(b), true) = (id, binary.take(), *local) {
            found.push(FunctionSpec { logical_id: id.to_owned(), binary: b });
        }
        *local = false;
    };
    for line in template.lines() {
        if line == "Outputs:" || line == "Conditions:" || line == "Parameters:" {
            flush(current.take(), &mut binary, &mut local);
        } else if let Some(id) = resource_line(line) {
            flush(current, &mut binary, &mut local);
            current = Some(id);
        } else if let Some(b) = line.trim().strip_prefix("Binary:") {
            binary = Some(b.trim().to_owned());
        } else if is_local_code_uri(line) {
            local = true;
        }
    }
    flush(current, &mut binary, &mut local);
    found
}

/// One `AWS::Serverless::LayerVersion` of the template with a local `ContentUri` (a directory
/// relative to the template, as `sam deploy` zips it), e.g. `ConfigLayer` with `config/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpec {
    pub logical_id: String,
    pub content_uri: String,
}

/// A `ContentUri:` line's value when it is a local directory (not `s3://`, not a mapping).
pub(crate) fn local_content_uri(line: &str) -> Option<&str> {
    let v = line.trim().strip_prefix("ContentUri:")?.trim();
    (!v.is_empty() && !v.starts_with("s3://") && !v.starts_with('!') && !v.contains(':')).then_some(v)
}

/// The layers of `template` with a local `ContentUri`, in template order.
pub fn layers(template: &str) -> Vec<LayerSpec> {
    let mut found = Vec::new();
    let mut current: Option<&str> = None;
    let mut is_layer = false;
    let mut in_resources = false;
    for line in template.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            in_resources = line == "Resources:";
            current = None;
        } else if let Some(id) = resource_line(line).filter(|_| in_resources) {
            current = Some(id);
            is_layer = false;
        } else if line.trim() == "Type: AWS::Serverless::LayerVersion" {
            is_layer = true;
        } else if let (Some(id), true, Some(uri)) = (current, is_layer, local_content_uri(line)) {
            found.push(LayerSpec { logical_id: id.to_owned(), content_uri: uri.to_owned() });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_layers_with_a_local_directory_are_found() {
        let t = "Parameters:\n  ContentUri:\n    Type: String\nResources:\n  A:\n    Type: AWS::Serverless::LayerVersion\n\
                 # a comment\n\n    Properties:\n      ContentUri: layers/a/\n  B:\n    Type: AWS::Serverless::LayerVersion\n\
                 \x20   Properties:\n      ContentUri: s3://bucket/b.zip\n  C:\n    Type: AWS::Serverless::Function\n\
                 \x20   Properties:\n      ContentUri: c/\nOutputs:\n  D:\n    Value: x\n";
        assert_eq!(layers(t), [LayerSpec { logical_id: "A".into(), content_uri: "layers/a/".into() }]);
    }
}
