pub mod answer;
pub mod asl;
pub mod callback_url;
pub mod commands;
pub mod config_files;
pub mod deployed;
pub mod diagram;
pub mod iam;
pub mod keys;
pub mod lambda;
pub mod listing;
pub mod load;
pub mod ops;
pub mod pause;
pub mod schedule;
pub mod smoke;
pub mod stack;
pub mod table;
pub mod template;
pub mod timeline;
pub mod top;
pub mod ui;
pub mod validate;

#[cfg(test)]
mod schema_files {
    /// The schemas in the repository are the ones the types generate: change a configuration
    /// type, and this fails until `schemas/` is generated again.
    #[test]
    fn the_repository_s_schemas_are_the_generated_ones() {
        for (name, generated) in [("workflows", sas_core::schema::workflows()), ("agents", sas_core::schema::agents())]
        {
            let path = format!("{}/../../schemas/{name}.schema.json", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("the schema file");
            let shipped: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert!(
                shipped == generated,
                "schemas/{name}.schema.json is not the generated one: cargo run -p sas-cli --bin sasctl -- schema {name} > schemas/{name}.schema.json"
            );
        }
    }

    /// What the schemas cannot say, they do not pretend to: every field a step may have is in
    /// the schema of a step, so an editor does not flag a valid file.
    #[test]
    fn the_schemas_name_every_field_of_the_shipped_configuration() {
        let schema = sas_core::schema::workflows();
        let step = &schema["$defs"]["StepDef"]["properties"];
        let workflow = &schema["$defs"]["WorkflowDef"]["properties"];
        let file: serde_json::Value = serde_json::from_str(sas_protocol::workflow::BUILT_IN_WORKFLOWS).unwrap();
        for w in file["workflows"].as_array().unwrap() {
            for k in w.as_object().unwrap().keys() {
                assert!(workflow.get(k).is_some(), "workflow field {k} not in the schema");
            }
            for s in w["steps"].as_array().unwrap() {
                for k in s.as_object().unwrap().keys() {
                    assert!(step.get(k).is_some(), "step field {k} not in the schema");
                }
            }
        }
    }
}

/// The book's page of the shipped workflows, drawn (`docs/reference/shipped-workflows.md`).
pub fn shipped_workflows_page() -> String {
    use std::fmt::Write as _;
    let all = sas_protocol::workflow::WorkflowRegistry::from_json(sas_protocol::workflow::BUILT_IN_WORKFLOWS)
        .expect("the built-in workflows are valid");
    let mut page = String::from(
        "# The shipped workflows\n\n\
         `config/workflows.json` as `sasctl validate --graph NAME` draws it: each step with its agent, its\n\
         timeout and its attempts, the steps it waits for (`after`; branches side by side), maps, and\n\
         each step's compensation (dashed), which runs in reverse order when the task fails or is\n\
         cancelled. The `sim-*` workflows need no service (the `sim` agent); the `order*` ones call the\n\
         order service (`ORDER_SERVICE_URL`); `order-track` ends with an `aws` step, EventBridge's\n\
         `PutEvents` on the account's default bus, which the template grants. This page is generated,\n\
         and a test fails when it is not the drawing of the shipped file:\n\
         `SAS_WRITE_DOCS=1 cargo test -p sas-cli --lib shipped_workflows` writes it again.\n",
    );
    let mut defs: Vec<_> = all.all().collect();
    defs.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
    for def in defs {
        let _ = write!(page, "\n## {}@{}\n\n", def.name, def.version);
        if !def.description.is_empty() {
            let _ = write!(page, "{}\n\n", def.description);
        }
        let _ = write!(page, "```mermaid\n{}```\n", crate::diagram::mermaid(def));
    }
    page
}

#[cfg(test)]
mod shipped_workflows {
    #[test]
    fn the_book_draws_the_shipped_workflows() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reference/shipped-workflows.md");
        let page = super::shipped_workflows_page();
        if std::env::var("SAS_WRITE_DOCS").is_ok_and(|v| v == "1") {
            std::fs::write(path, &page).expect("write the page");
        }
        let shipped = std::fs::read_to_string(path).expect("the page");
        assert!(
            shipped == page,
            "docs/reference/shipped-workflows.md is not the drawing of config/workflows.json: \
             SAS_WRITE_DOCS=1 cargo test -p sas-cli --lib shipped_workflows"
        );
    }
}
