//! The importer over the public collection of sample state machines
//! (`tests/data/asl-collection`, see its README): every definition is translated or refused; a
//! translation loads as a workflow and its agents as an agents file; every refusal names its state
//! and field; and the share translated is at least what the book states. Prints the census (the
//! refusals by reason) that `docs/how-to/import-asl.md` reports.

use std::collections::BTreeMap;
use std::path::Path;

/// The definitions the book says are translated (of 170): a change that translates fewer fails.
const TRANSLATED_AT_LEAST: usize = 12;

/// A refusal's reason as the census counts it.
fn class(r: &sas_cli::asl::Refusal) -> String {
    let why = r.reason.as_str();
    let pick = [
        ("a loop", "a loop (Choice back to an earlier state)"),
        (".sync", "a .sync integration"),
        ("AWS SDK integration", "an AWS SDK integration (aws-sdk:*)"),
        ("intrinsic function", "an intrinsic function"),
        ("context object", "the context object ($$.Execution, $$.State...)"),
        ("Distributed Map", "a Distributed Map"),
        ("processor has", "a Map of several states"),
        ("without .waitForTaskToken", "a message sent and not waited for (sqs, sns, events)"),
        ("with different data", "a state reached with different data (a join)"),
        ("different outputs", "ends with different outputs"),
        ("JSONata", "JSONata"),
        ("integration is not translated", "another service integration"),
        ("HTTP task", "an HTTP task (not yet)"),
        ("SecondsPath", "a Wait of SecondsPath"),
        ("call step may take", "a task over the 110 s call limit"),
        ("activity", "an activity"),
    ];
    pick.iter()
        .find(|(k, _)| why.contains(k))
        .map_or_else(|| format!("other: {}: {}", r.field, why), |(_, c)| (*c).to_owned())
}

#[test]
#[allow(clippy::print_stdout)] // the census, for the book
fn the_collection_is_translated_or_refused_with_reasons() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/asl-collection");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the collection")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".asl.json"))
        .collect();
    files.sort();
    assert!(files.len() >= 170, "the collection has {} definitions", files.len());
    let (mut translated, mut unparseable) = (Vec::new(), 0);
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for f in &files {
        let Ok(def) = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(f).expect("readable")) else {
            unparseable += 1;
            continue;
        };
        let name = sas_cli::asl::workflow_name(f);
        match sas_cli::asl::import(&name, &def) {
            Ok(i) => {
                let wf = serde_json::json!({"workflows": [i.workflow]}).to_string();
                sas_core::workflow::WorkflowRegistry::from_json(&wf)
                    .unwrap_or_else(|e| panic!("{}: the translation does not load: {e}\n{wf}", f.display()));
                let ag = sas_cli::asl::agents_file(&i.agents).to_string();
                let report = sas_core::validate::check_with_grants(
                    &wf,
                    &ag,
                    &|_| Some("arn:aws:lambda:us-east-1:000000000000:function:f".into()),
                    &|p| {
                        (p == "AgentFunctionArns")
                            .then(|| "arn:aws:lambda:us-east-1:000000000000:function:*".to_owned())
                    },
                );
                assert!(report.problems.is_empty(), "{}: {:?}", f.display(), report.problems);
                translated.push(name);
            }
            Err(refusals) => {
                assert!(!refusals.is_empty(), "{}: refused without a reason", f.display());
                let mut classes: Vec<String> = refusals.iter().map(class).collect();
                for r in &refusals {
                    assert!(
                        !r.state.is_empty() && !r.field.is_empty() && r.reason.len() > 10,
                        "{}: {r:?}",
                        f.display()
                    );
                }
                classes.sort();
                classes.dedup();
                for c in classes {
                    *by_reason.entry(c).or_default() += 1;
                }
            }
        }
    }
    let n = files.len();
    println!(
        "{} of {n} definitions translated ({}%); {unparseable} not JSON",
        translated.len(),
        translated.len() * 100 / n
    );
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (why, count) in &reasons {
        println!("{count:4}  {why}");
    }
    println!("translated: {}", translated.join(", "));
    assert!(
        translated.len() >= TRANSLATED_AT_LEAST,
        "{} translated, the book says {TRANSLATED_AT_LEAST}",
        translated.len()
    );
}
