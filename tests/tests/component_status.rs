//! `what: "status"` answered by the built component in wasmtime over in-memory buckets: the
//! answer for the status mesh is pinned in `tests/golden/status/expected.json` (reviewed by
//! hand; `MESH_PROVISIONER_REGENERATE_GOLDEN=1` rewrites it), and what a requester may ask of it
//! is checked before anything is read.

use std::sync::Arc;

use mesh_provisioner::backend::Backend;
use mesh_provisioner::runtime::ReplyCode;
use serde_json::{json, Value};

fn golden() -> std::path::PathBuf {
    tests::root().join("tests/golden/status/expected.json")
}

#[tokio::test]
async fn the_status_of_the_mesh_matches_the_golden_file() {
    let b = tests::status_mesh::mesh();
    let (code, v) = tests::ask(b.clone() as Arc<dyn Backend>, json!({"what":"status"}).to_string().as_bytes()).await;
    assert_eq!(code, ReplyCode::Ok, "{v}");
    if std::env::var_os(tests::golden::REGENERATE).is_some() {
        std::fs::create_dir_all(golden().parent().unwrap()).unwrap();
        std::fs::write(golden(), serde_json::to_string_pretty(&v).unwrap() + "\n").unwrap();
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(golden()).expect("the golden status file")).unwrap();
    for (got, want) in v["entries"].as_array().unwrap().iter().zip(want["entries"].as_array().unwrap()) {
        assert_eq!(got, want, "the status of {}/{} differs from the golden file", want["node"], want["module"]);
    }
    assert_eq!(v, want);
    let states: Vec<&str> = v["entries"].as_array().unwrap().iter().map(|e| e["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["applied", "pending", "blocked", "nothing_needed", "blocked", "never_ran"]);
}

#[tokio::test]
async fn refuses_what_status_does_not_take() {
    let b = tests::status_mesh::mesh();
    for (body, why) in [
        (json!({"what":"status","kind":"config"}), "does not apply to what=status"),
        (json!({"what":"status","node":"*"}), "not an identifier"),
        (json!({"what":"status","collection":"x"}), "does not apply"),
    ] {
        let (code, v) = tests::ask(b.clone() as Arc<dyn Backend>, body.to_string().as_bytes()).await;
        assert_eq!(code, ReplyCode::BadRequest, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{v}");
    }
}
