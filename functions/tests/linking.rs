//! Only the Agent function links the agent kinds (and the SDK clients they need): the other
//! binaries serve no agents, so the code is not in them. Checked on the built binaries by
//! strings only the kinds' code holds.

/// Texts (string literals: debug info keeps names of code the linker dropped, so no symbol names)
/// of the agent kinds' code: the Lambda kind's, the HTTP kind's secret headers', the Secrets
/// Manager client's and the EventBridge client's.
const KIND_MARKERS: &[&str] = &[
    "is not a Lambda function ARN",
    "a binary secret cannot be a header value",
    "secretsmanager.GetSecretValue",
    "AWSEvents.PutEvents",
];

fn holds(path: &str, text: &str) -> bool {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let t = text.as_bytes();
    let mut at = 0;
    while let Some(i) = bytes[at..].iter().position(|&b| b == t[0]) {
        let start = at + i;
        if bytes.get(start..start + t.len()) == Some(t) {
            return true;
        }
        at = start + 1;
    }
    false
}

#[test]
fn only_the_agent_binary_links_the_agent_kinds() {
    let agent = env!("CARGO_BIN_EXE_sas-agent");
    for m in KIND_MARKERS {
        assert!(holds(agent, m), "the Agent binary hosts the kinds ({m:?} not found: a marker that proves nothing)");
    }
    for (name, path) in [
        ("sas-scheduler", env!("CARGO_BIN_EXE_sas-scheduler")),
        ("sas-submitter", env!("CARGO_BIN_EXE_sas-submitter")),
        ("sas-supervisor", env!("CARGO_BIN_EXE_sas-supervisor")),
        ("sas-callback", env!("CARGO_BIN_EXE_sas-callback")),
    ] {
        for m in KIND_MARKERS {
            assert!(!holds(path, m), "{name} links agent-kind code ({m:?})");
        }
    }
}
