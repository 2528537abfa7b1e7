pub mod answer;
pub mod callback_url;
pub mod iam;
pub mod lambda;
pub mod load;
pub mod ops;
pub mod smoke;
pub mod stack;
pub mod table;
pub mod timeline;
pub mod top;

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
        let file: serde_json::Value = serde_json::from_str(sas_core::workflow::BUILT_IN_WORKFLOWS).unwrap();
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
