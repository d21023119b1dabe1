//! The wire's JSON Schemas as a client sees them: the files in `docs/schema/`, each compiled
//! once per test binary by an independent validator (the `jsonschema` crate, not our code), so
//! an end-to-end test can require that every reply it receives fits its schema.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;

/// The folder of the schemas.
pub fn dir() -> std::path::PathBuf {
    crate::root().join("docs/schema")
}

fn validators() -> &'static BTreeMap<String, jsonschema::Validator> {
    static V: OnceLock<BTreeMap<String, jsonschema::Validator>> = OnceLock::new();
    V.get_or_init(|| {
        let mut out = BTreeMap::new();
        let entries = std::fs::read_dir(dir()).unwrap_or_else(|e| panic!("{}: {e}", dir().display()));
        for e in entries.flatten() {
            let path = e.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json")) else { continue };
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let schema: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
            let v = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .should_validate_formats(true)
                .build(&schema)
                .unwrap_or_else(|e| panic!("{} is not a schema: {e}", path.display()));
            out.insert(name.to_string(), v);
        }
        out
    })
}

/// Why `v` does not fit the schema `name` (`docs/schema/<name>.json`); empty when it fits.
pub fn errors(name: &str, v: &Value) -> Vec<String> {
    let validator = validators().get(name).unwrap_or_else(|| panic!("no schema {name} in {}", dir().display()));
    validator.iter_errors(v).map(|e| format!("at {}: {e}", e.instance_path())).collect()
}

/// Fails the test when `v` does not fit the schema `name`, saying where and why.
pub fn check(name: &str, v: &Value) {
    let errors = errors(name, v);
    assert!(errors.is_empty(), "a {name} that does not fit docs/schema/{name}.json:\n  {}\n{}", errors.join("\n  "), crate::shorten(&v.to_string()));
}

/// The schema a verb's reply has: its answer's, or the error's when it carries an error code.
pub fn of_reply(verb: &str, error_code: Option<&str>) -> &'static str {
    match (verb, error_code) {
        (_, Some(_)) => "error",
        ("mesh-provisioner.plan", None) => "plan.reply",
        _ => "provisioning.reply",
    }
}
