//! The importer over the public collection of sample state machines
//! (`tests/data/asl-collection`, see its README): every definition is translated or refused; a
//! translation loads as a workflow and its agents as an agents file; every refusal names its state
//! and field; and the share translated is at least what the book states. Prints the census (the
//! refusals by reason) that `docs/how-to/import-asl.md` reports.

use std::collections::BTreeMap;
use std::path::Path;

/// The definitions the book says are translated (of 170): a change that translates fewer fails.
const TRANSLATED_AT_LEAST: usize = 115;

/// Every task's `Resource` in a definition (inside Parallel branches and Map processors).
fn resources(states: &serde_json::Value, out: &mut Vec<String>) {
    for st in states.as_object().into_iter().flat_map(|m| m.values()) {
        if let Some(r) = st.get("Resource").and_then(serde_json::Value::as_str) {
            out.push(r.to_owned());
        }
        for b in st.get("Branches").and_then(serde_json::Value::as_array).into_iter().flatten() {
            resources(&b["States"], out);
        }
        for p in ["ItemProcessor", "Iterator"] {
            if let Some(p) = st.get(p) {
                resources(&p["States"], out);
            }
        }
    }
}

/// A definition whose tasks use only the integrations the importer is for: Lambda functions
/// (an ARN, a `${...}` substitution, `lambda:invoke`), messages to queues, topics and buses, HTTP
/// tasks, with or without `.waitForTaskToken`.
fn in_subset(def: &serde_json::Value) -> bool {
    let mut rs = Vec::new();
    resources(&def["States"], &mut rs);
    let text = def.to_string();
    !text.contains("{%")
        && !text.contains("ItemReader")
        && !text.contains("\"DISTRIBUTED\"")
        && rs.iter().all(|r| {
            let integration = r.split_once(":states:::").map(|(_, i)| i.trim_end_matches(".waitForTaskToken"));
            match integration {
                Some(i) => {
                    ["lambda:invoke", "sqs:sendMessage", "sns:publish", "events:putEvents", "http:invoke"].contains(&i)
                }
                None => {
                    r.starts_with("arn:aws:lambda:")
                        || (r.starts_with("${") && !r.to_ascii_lowercase().contains("activity"))
                }
            }
        })
}

/// A refusal's reason as the census counts it.
fn class(r: &sas_asl::Refusal) -> String {
    let why = r.reason.as_str();
    // (a reason that names where a path may start says "at a loop's index": not a loop's)
    if why.starts_with("a loop") {
        return "a loop of a shape not translated".to_owned();
    }
    let pick = [
        (
            "waits on the refusals of its states",
            "a loop translated but for its states' own refusals (counted in their rows)",
        ),
        (".sync", "a .sync integration"),
        ("speaks the rest-xml protocol", "an AWS API that speaks REST-XML (CloudFront, Route 53...)"),
        ("request is an XML document", "an S3 action whose request is an XML document (PutObjectTagging...)"),
        (
            "speaks the rest-json protocol",
            "a REST-JSON API the aws kind does not carry (API Gateway, IoT Analytics...)",
        ),
        ("speaks the query protocol", "an AWS API that speaks EC2's protocol or a query one not carried (EC2, RDS)"),
        ("speaks the ec2 protocol", "an AWS API that speaks EC2's protocol or a query one not carried (EC2, RDS)"),
        ("integration with a token is not translated", "another service integration with a token (.waitForTaskToken)"),
        ("is not a service of AWS's models", "an AWS service no longer in AWS's models (Lookout for Vision)"),
        ("has no action", "an AWS API action not in AWS's models"),
        ("aws-sdk task that waits for a token", "an aws-sdk task with a token (.waitForTaskToken)"),
        ("intrinsic function", "an intrinsic function"),
        ("context object", "the context object ($$.Execution, $$.State...)"),
        ("Distributed Map", "a Distributed Map"),
        ("processor reads $$.Execution", "the context object ($$.Execution inside a Map's processor)"),
        ("without .waitForTaskToken", "a message sent and not waited for (sqs, sns, events)"),
        ("with different data", "a state reached with different data (a join)"),
        ("different outputs", "ends with different outputs"),
        ("is not set on every way", "a variable read where it is not set (inside a Map or a loop)"),
        ("an Assign here reads", "a JSONata Assign reading a task's input (its JSONPath twin reads the result)"),
        ("two values read from the data", "a JSONata comparison of two values read from the data"),
        ("the function $", "a JSONata function other than $not and $exists"),
        ("arithmetic (", "JSONata arithmetic"),
        ("JSONata", "JSONata (another form)"),
        ("{% $states.input.x %}", "JSONata (another form)"),
        ("a rule's Output", "JSONata (another form)"),
        ("integration is not translated", "another service integration"),
        ("HTTP task", "an HTTP task (not yet)"),
        ("SecondsPath", "a Wait of SecondsPath"),
        ("on a Parallel state", "Retry or Catch on a Parallel or Map state"),
        ("on a Map state", "Retry or Catch on a Parallel or Map state"),
        ("built by the state machine", "a value the state machine builds, read where the task's data is needed"),
        ("known only when the step runs", "a value the state machine builds, read where the task's data is needed"),
        ("Task.Token belongs", "$$.Task.Token outside a .waitForTaskToken task"),
        ("no state calls anything", "no task at all"),
        ("call step may take", "a task over the 110 s call limit"),
        ("activity", "an activity"),
        ("names no one value", "a path naming many values (a slice, a wildcard, a filter)"),
        ("is not a JSONPath", "a path outside RFC 9535 (a filter's unquoted string)"),
        ("would change each time", "States.UUID (a value that would change each time)"),
        ("must start at the task's input", "an intrinsic function over a task's answer (ResultSelector)"),
        ("reached both before any task runs", "a state reached both at the start and after a task"),
        ("read from the data; an agent", "a function or an event source read from the data"),
        ("never succeeds", "a Parallel branch that never succeeds"),
        ("TimeoutSecondsPath", "a timeout read from the data (TimeoutSecondsPath)"),
    ];
    pick.iter()
        .find(|(k, _)| why.contains(k) || r.field == *k)
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
    let (mut subset, mut subset_translated) = (0, 0);
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    let mut in_subset_refused: Vec<String> = Vec::new();
    for f in &files {
        let Ok(def) = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(f).expect("readable")) else {
            unparseable += 1;
            continue;
        };
        let name = sas_asl::workflow_name(f);
        let covered = in_subset(&def);
        subset += usize::from(covered);
        match sas_asl::import(&name, &def) {
            Ok(i) => {
                let wf = serde_json::json!({"workflows": i.workflows()}).to_string();
                sas_protocol::workflow::WorkflowRegistry::from_json(&wf)
                    .unwrap_or_else(|e| panic!("{}: the translation does not load: {e}\n{wf}", f.display()));
                // each ${Variable} of a definition given a value of its kind, every grant given
                let mut agents = i.agents.clone();
                for spec in agents.values_mut() {
                    let (field, value) = match spec["kind"].as_str() {
                        Some("lambda") => ("function", "arn:aws:lambda:us-east-1:000000000000:function:f"),
                        Some("sqs") => ("queue_url", "https://sqs.us-east-1.amazonaws.com/000000000000/q"),
                        Some("sns") => ("topic_arn", "arn:aws:sns:us-east-1:000000000000:t"),
                        Some("eventbridge") => ("bus", "arn:aws:events:us-east-1:000000000000:event-bus/b"),
                        // an aws agent's names and ARNs, an API's address: each ${Variable} given a name
                        Some("aws" | "http" | "s3_items") => {
                            let mut text = spec.to_string();
                            while let Some(at) = text.find("${") {
                                let end = text[at..].find('}').map_or(text.len(), |e| at + e + 1);
                                text.replace_range(at..end, "given");
                            }
                            *spec = serde_json::from_str(&text).expect("the spec with names given");
                            continue;
                        }
                        _ => continue,
                    };
                    if spec[field].as_str().is_some_and(|v| v.contains("${")) {
                        spec[field] = serde_json::json!(value);
                    }
                }
                let ag = sas_asl::agents_file(&agents).to_string();
                let report = sas_cli::validate::check_with_grants(&wf, &ag, &|_| None, &|_| Some("*".to_owned()));
                // grants depend on how the stack is deployed (a bus given by name is granted by name)
                let problems: Vec<_> =
                    report.problems.iter().filter(|p| !p.contains("add it to the template parameter")).collect();
                assert!(problems.is_empty(), "{}: {problems:?}", f.display());
                subset_translated += usize::from(covered);
                translated.push(name);
            }
            Err(refusals) => {
                assert!(!refusals.is_empty(), "{}: refused without a reason", f.display());
                // a Parallel's refusal that only points at those inside it is not a reason of its own
                let mut classes: Vec<String> =
                    refusals.iter().filter(|r| !r.reason.starts_with("(see the refusals")).map(class).collect();
                for r in &refusals {
                    assert!(
                        !r.state.is_empty() && !r.field.is_empty() && r.reason.len() > 10,
                        "{}: {r:?}",
                        f.display()
                    );
                }
                classes.sort();
                classes.dedup();
                if covered || std::env::var_os("CENSUS_ALL").is_some() {
                    in_subset_refused.push(format!("{name}: {}", classes.join("; ")));
                }
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
    println!(
        "of the {subset} whose tasks use only the integrations covered, {subset_translated} translated ({}%)",
        subset_translated * 100 / subset.max(1)
    );
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (why, count) in &reasons {
        println!("{count:4}  {why}");
    }
    println!("translated: {}", translated.join(", "));
    // CENSUS_ALL=1: every refused definition, with its reasons (what one feature would free)
    println!("refused within the integrations covered (all with CENSUS_ALL=1):");
    for r in &in_subset_refused {
        println!("  {r}");
    }
    assert!(
        translated.len() >= TRANSLATED_AT_LEAST,
        "{} translated, the book says {TRANSLATED_AT_LEAST}",
        translated.len()
    );
}

#[test]
fn the_collection_s_sagas_become_per_step_compensation() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/asl-collection");
    for file in [
        "saga-pattern-sam_statemachine_statemachine.asl.json",
        "saga-pattern-cdk_resources_statemachine.asl.json",
        "saga-pattern-tf_statemachine_statemachine.asl.json",
    ] {
        let def: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        let i = sas_asl::import("saga", &def).unwrap_or_else(|r| panic!("{file}: {r:?}"));
        let undone: Vec<(String, String)> = i.workflow["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| Some((s["name"].as_str()?.to_owned(), s["compensation"]["name"].as_str()?.to_owned())))
            .collect();
        let want = [
            ("ReserveFlight", "CancelFlightReservation"),
            ("ReserveCarRental", "CancelRentalReservation"),
            ("ProcessPayment", "RefundPayment"),
        ];
        assert_eq!(undone, want.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec(), "{file}");
        let names: Vec<&str> =
            i.workflow["steps"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert!(!names.contains(&"RefundPayment") && !names.contains(&"Reservation_Failed"), "{file}: {names:?}");
        assert!(
            i.notes.iter().any(|n| n.contains("SendingSMSFailure") && n.contains("not run")),
            "{file}: {:?}",
            i.notes
        );
    }
}

/// The page's console blocks of `sasctl import-asl` (`docs/how-to/import-asl.md`): each command
/// run on the page's examples (`tests/data/examples/`, `orders.asl.json` and `poll.asl.json`) prints
/// what the page shows, and `echo $?` the exit status it shows. The lines in which validate lists
/// what it read (`workflows …`, `agents …`) are validate's own wording and not compared.
#[test]
fn the_page_s_example_prints_what_the_page_shows_and_exits_as_it_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("../../docs/how-to/import-asl.md")).expect("the page");
    let dir = std::env::temp_dir().join(format!("asl-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    for e in std::fs::read_dir(root.join("tests/data/examples")).expect("the examples") {
        let e = e.expect("an example");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("the example copied");
    }
    std::fs::write(dir.join("broken.asl.json"), "{").expect("a file that is not JSON");
    let compared = |s: &str| -> Vec<String> {
        s.lines().filter(|l| !l.starts_with("workflows ") && !l.starts_with("agents ")).map(str::to_owned).collect()
    };
    let mut blocks = 0;
    let mut lines = page.lines();
    while let Some(l) = lines.next() {
        if l != "```console" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        if !block.first().is_some_and(|l| l.starts_with("$ sasctl import-asl")) {
            continue;
        }
        blocks += 1;
        let mut status = None;
        let mut i = 0;
        while i < block.len() {
            let mut command = block[i].trim_start_matches("$ ").to_owned();
            while command.ends_with('\\') {
                command.pop();
                i += 1;
                command.push_str(block[i]);
            }
            i += 1;
            let start = i;
            while i < block.len() && !block[i].starts_with("$ ") {
                i += 1;
            }
            let shown = block[start..i].join("\n");
            if command == "echo $?" {
                assert_eq!(Some(shown.trim().to_owned()), status, "the exit status the page shows");
                continue;
            }
            let args: Vec<&str> = command.split_whitespace().collect();
            assert_eq!(&args[..2], ["sasctl", "import-asl"], "{command}");
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
                .args(&args[1..])
                .current_dir(&dir)
                .output()
                .expect("sasctl runs");
            let printed = String::from_utf8_lossy(&out.stdout).into_owned();
            assert_eq!(
                compared(&printed),
                compared(&shown),
                "{command}: what it prints (left) and the page (right); stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            status = out.status.code().map(|c| c.to_string());
        }
    }
    assert!(blocks >= 2, "the page shows the command ({blocks} block(s))");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loop_bound_sets_every_translated_loop_s_max_iterations_and_refuses_a_bound_out_of_range() {
    let dir = std::env::temp_dir().join(format!("asl-bound-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let def = serde_json::json!({"StartAt": "Step", "States": {
        "Step": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:add", "Next": "More?"},
        "More?": {"Type": "Choice", "Choices": [{"Variable": "$.n", "NumericLessThan": 3, "Next": "Step"}], "Default": "Done"},
        "Done": {"Type": "Succeed"}}});
    std::fs::write(dir.join("count.asl.json"), def.to_string()).expect("written");
    let run = |bound: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sasctl"))
            .current_dir(&dir)
            .args(["import-asl", "count.asl.json", "--loop-bound", bound])
            .output()
            .expect("sasctl runs")
    };
    let out = run("25");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("here it fails after 25 iterations"), "{text}");
    let wf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("imported-workflows.json")).expect("written"))
            .expect("JSON");
    let bounds: Vec<&serde_json::Value> =
        wf["workflows"][0]["steps"].as_array().expect("steps").iter().map(|s| &s["max_iterations"]).collect();
    assert!(bounds.contains(&&serde_json::json!(25)), "{wf}");
    for bad in ["0", "10001"] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "clap refuses {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--loop-bound"), "{out:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
