//! The template's dashboard and alarms name only metrics the code emits, with the dimensions it
//! emits them with (the catalogue, `sas_core::metrics::CATALOGUE`, whose every entry
//! `tests/metrics.rs` sees emitted), and the dashboard shows every one of them. Reads
//! `template.yaml` as text: the references are in three shapes, each found by its own pattern. The
//! book's reference pages (docs/reference/) describe every metric, alarm and parameter.

use std::collections::BTreeSet;

use sas_core::metrics::{self, CATALOGUE};

const NS: &str = "${MetricsNamespace}";

fn template() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml")).expect("template.yaml")
}

/// Each `(name, dimensions)` the template reads from the stack's namespace, and where.
fn references(t: &str) -> Vec<(String, Vec<String>, &'static str)> {
    let mut out = Vec::new();
    // Dashboard searches: SEARCH('{${MetricsNamespace},Dim,...} MetricName=\"Name\"', ...)
    let open = format!("SEARCH('{{{NS}");
    for (i, _) in t.match_indices(&open) {
        let rest = &t[i + open.len()..];
        let dims: Vec<String> =
            rest[..rest.find('}').unwrap()].split(',').filter(|d| !d.is_empty()).map(str::to_owned).collect();
        let name = rest.split("MetricName=\\\"").nth(1).unwrap().split('\\').next().unwrap();
        out.push((name.to_owned(), dims, "dashboard search"));
    }
    // Dashboard metrics without dimensions: ["${MetricsNamespace}","Name",{...}]
    let open = format!("[\"{NS}\",\"");
    for (i, _) in t.match_indices(&open) {
        let rest = &t[i + open.len()..];
        let name = &rest[..rest.find('"').unwrap()];
        assert!(rest[name.len()..].starts_with("\",{"), "{name}: a dashboard metric with dimensions; use a search");
        out.push((name.to_owned(), Vec::new(), "dashboard metric"));
    }
    // Alarms on one metric: Namespace: !Ref MetricsNamespace, then MetricName (no Dimensions).
    for (i, _) in t.match_indices("Namespace: !Ref MetricsNamespace\n") {
        let rest = &t[i..];
        let alarm = &rest[..rest.find("\n\n").unwrap_or(rest.len())];
        let name = alarm.split("MetricName: ").nth(1).unwrap().lines().next().unwrap().trim();
        assert!(!alarm.contains("Dimensions:"), "{name}: the alarm's dimensions are not checked here");
        out.push((name.to_owned(), Vec::new(), "alarm"));
    }
    // Alarms on a Metrics Insights query: SELECT SUM(Name) FROM SCHEMA("${MetricsNamespace}", Dim, ...)
    for (i, _) in t.match_indices("SELECT ") {
        let rest = &t[i..];
        let query = rest.lines().next().unwrap();
        let name = query.split('(').nth(1).unwrap().split(')').next().unwrap();
        let schema = query.split("SCHEMA(").nth(1).unwrap().split(')').next().unwrap();
        let mut parts = schema.split(',').map(str::trim);
        assert_eq!(parts.next(), Some(format!("\"{NS}\"").as_str()), "{query}");
        out.push((name.to_owned(), parts.map(str::to_owned).collect(), "alarm query"));
    }
    out
}

#[test]
fn the_dashboard_and_alarms_name_only_emitted_metrics_with_their_dimensions() {
    let t = template();
    let refs = references(&t);
    assert!(refs.len() >= CATALOGUE.len(), "found only {} references: {refs:?}", refs.len());
    for (name, dims, place) in &refs {
        let m = metrics::by_name(name).unwrap_or_else(|| panic!("{place} names {name}, which the code does not emit"));
        let mut want: Vec<&str> = m.dimensions.to_vec();
        let mut got: Vec<&str> = dims.iter().map(String::as_str).collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "{place}: {name} is emitted with dimensions {:?}", m.dimensions);
    }
    let on_dashboard: BTreeSet<&str> =
        refs.iter().filter(|r| r.2.starts_with("dashboard")).map(|r| r.0.as_str()).collect();
    let missing: Vec<&str> = CATALOGUE.iter().map(|m| m.name).filter(|n| !on_dashboard.contains(n)).collect();
    assert!(missing.is_empty(), "emitted but not on the dashboard: {missing:?}");
    let alarmed: BTreeSet<&str> = refs.iter().filter(|r| r.2.starts_with("alarm")).map(|r| r.0.as_str()).collect();
    for m in [metrics::OLDEST_OVERDUE_STEP_AGE.name, metrics::TASKS_FAILED.name] {
        assert!(alarmed.contains(m), "no alarm on {m}");
    }
}

#[test]
fn the_namespace_default_is_the_codes_and_the_dashboard_body_is_json() {
    let t = template();
    let param = t.split("  MetricsNamespace:\n").nth(1).unwrap();
    let default = param.lines().find_map(|l| l.trim().strip_prefix("Default: ")).unwrap();
    assert_eq!(default, metrics::DEFAULT_NAMESPACE);
    let body = t.split("DashboardBody: !Sub |\n").nth(1).unwrap();
    let body: String = body.lines().take_while(|l| l.starts_with("          ")).collect::<Vec<_>>().join("\n");
    // ${...} substitutions become plain strings, as CloudFormation's !Sub makes them.
    let mut plain = String::new();
    let mut rest = body.as_str();
    while let Some(i) = rest.find("${") {
        plain.push_str(&rest[..i]);
        let end = rest[i..].find('}').unwrap();
        plain.push('x');
        rest = &rest[i + end + 1..];
    }
    plain.push_str(rest);
    let v: serde_json::Value = serde_json::from_str(&plain).unwrap_or_else(|e| panic!("{e}: {plain}"));
    assert!(v["widgets"].as_array().is_some_and(|w| w.len() > 10));
}

#[test]
fn the_book_describes_every_metric_and_alarm() {
    // The reference page of metrics and alarms (docs/reference/metrics.md): its metrics table and
    // its alarms table, one row each.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reference/metrics.md");
    let chapter = std::fs::read_to_string(path).expect("docs/reference/metrics.md");
    for m in CATALOGUE {
        assert!(chapter.contains(&format!("`{}`", m.name)), "the book's metrics table lacks {}", m.name);
    }
    // Every alarm of the template has a row saying what it means.
    let t = template();
    for line in t.lines() {
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix("Alarm:")) {
            if !name.contains(' ') && !name.ends_with("Errors") {
                assert!(chapter.contains(&format!("`{name}Alarm`")), "the book does not explain {name}Alarm");
            }
        }
    }
}

#[test]
fn the_book_lists_every_template_parameter_and_counts_them() {
    // docs/reference/parameters.md has a row for each parameter of template.yaml, and says how
    // many there are: a parameter added to the template without its row fails here.
    let t = template();
    let section = &t[t.find("\nParameters:\n").expect("a Parameters section")..];
    let section = &section[..section.find("\nConditions:\n").expect("Conditions after the parameters")];
    let names: Vec<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("  ").and_then(|l| l.strip_suffix(':')))
        .filter(|n| !n.starts_with(' ') && n.chars().all(|c| c.is_ascii_alphanumeric()))
        .collect();
    assert!(names.len() > 30, "{names:?}");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reference/parameters.md");
    let page = std::fs::read_to_string(path).expect("docs/reference/parameters.md");
    for n in &names {
        assert!(page.contains(&format!("| `{n}` |")), "the book's parameter reference lacks {n}");
    }
    let said = format!("`template.yaml` has {} parameters.", names.len());
    assert!(page.contains(&said), "the book's parameter reference should say: {said}");
}
