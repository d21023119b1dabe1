//! The plan golden test's fixture mesh (`tests/golden/plans/mesh.json`) and its expected plans
//! (`tests/golden/plans/expected.json`, reviewed by hand).
//!
//! `MESH_PROVISIONER_REGENERATE_GOLDEN=1 cargo test -p tests --test component_plans` rewrites the
//! expected file from what the component answers; review the diff before committing it. Every
//! other run compares and fails on any difference, naming the step and module that differ.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value};

/// Set to `1` to rewrite the expected file instead of comparing.
pub const REGENERATE: &str = "MESH_PROVISIONER_REGENERATE_GOLDEN";

#[derive(Debug, Clone, Deserialize)]
pub struct Mesh {
    pub steps: Vec<Step>,
    /// (node, module) pairs whose plans are pinned after each step.
    pub ask: Vec<(String, String)>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    pub name: String,
    pub writes: Vec<Write>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Write {
    /// The example config's user that makes this write end to end.
    pub user: String,
    pub bucket: String,
    pub key: String,
    /// A JSON value, written as its text…
    pub value: Option<Value>,
    /// …or raw text, for values that are not JSON.
    pub raw: Option<String>,
}

impl Write {
    pub fn bytes(&self) -> Vec<u8> {
        match (&self.value, &self.raw) {
            (Some(v), _) => v.to_string().into_bytes(),
            (None, Some(r)) => r.clone().into_bytes(),
            (None, None) => panic!("write {}/{} has neither value nor raw", self.bucket, self.key),
        }
    }
}

fn dir() -> PathBuf {
    crate::root().join("tests/golden/plans")
}

pub fn mesh() -> Mesh {
    let text = std::fs::read_to_string(dir().join("mesh.json")).expect("read the fixture mesh");
    serde_json::from_str(&text).expect("the fixture mesh parses")
}

/// The key under which a module's plan is pinned.
pub fn name(node: &str, module: &str) -> String {
    format!("{node}/{module}")
}

fn expected_path() -> PathBuf {
    dir().join("expected.json")
}

/// Compares `actual` (step name → module → plan) with the expected file. Returns the
/// differences, empty when equal. With `whole`, every expected step must be in `actual`;
/// otherwise only the steps `actual` holds are compared.
pub fn differences(actual: &Map<String, Value>, whole: bool) -> Vec<String> {
    let text = std::fs::read_to_string(expected_path()).unwrap_or_default();
    let expected: Map<String, Value> = serde_json::from_str(&text).unwrap_or_default();
    let mut out = Vec::new();
    for (step, modules) in actual {
        for (module, plan) in modules.as_object().into_iter().flatten() {
            // The revisions each answer read are the bus's numbering, not the plan: checked by
            // the read-your-writes tests, left out of the plans compared here.
            let mut plan = plan.clone();
            if let Some(o) = plan.as_object_mut() {
                o.remove("revisions");
            }
            let plan = &plan;
            let want = &expected.get(step).and_then(|m| m.get(module));
            match want {
                Some(w) if *w == plan => {}
                Some(w) => {
                    let (at, e, a) = first_difference(w, plan, String::new());
                    out.push(format!("step {step}, {module}: at {at}\n  expected {e}\n  actual   {a}"));
                }
                None => out.push(format!("step {step}, {module}: not expected; actual {plan}")),
            }
        }
    }
    for (step, modules) in &expected {
        if !whole && !actual.contains_key(step) {
            continue;
        }
        if !actual.contains_key(step) {
            out.push(format!("step {step}: expected but not run"));
            continue;
        }
        for module in modules.as_object().into_iter().flatten().map(|(m, _)| m) {
            if actual.get(step).and_then(|m| m.get(module)).is_none() {
                out.push(format!("step {step}, {module}: expected but not asked"));
            }
        }
    }
    out
}

/// Where two JSON values first differ: a path like `.entries[0].provisions[2].key`, and the
/// two values there.
fn first_difference(expected: &Value, actual: &Value, at: String) -> (String, String, String) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for key in e.keys().chain(a.keys()) {
                match (e.get(key), a.get(key)) {
                    (Some(x), Some(y)) if x == y => {}
                    (Some(x), Some(y)) => return first_difference(x, y, format!("{at}.{key}")),
                    (x, y) => return (format!("{at}.{key}"), show(x), show(y)),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            if let Some(i) = (0..e.len()).find(|i| e[*i] != a[*i]) {
                return first_difference(&e[i], &a[i], format!("{at}[{i}]"));
            }
        }
        _ => {}
    }
    (if at.is_empty() { ".".into() } else { at }, expected.to_string(), actual.to_string())
}

fn show(v: Option<&Value>) -> String {
    v.map(Value::to_string).unwrap_or_else(|| "nothing".into())
}

/// Whether this run rewrites the expected file.
pub fn regenerating() -> bool {
    std::env::var(REGENERATE).is_ok_and(|v| v == "1")
}

/// Rewrites the expected file (pretty, one line per field, for review).
pub fn regenerate(actual: &Map<String, Value>) {
    let text = serde_json::to_string_pretty(&Value::Object(actual.clone())).expect("serialize") + "\n";
    std::fs::write(expected_path(), text).expect("write the expected file");
    eprintln!("rewrote {}: review the diff before committing", expected_path().display());
}
