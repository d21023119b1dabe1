//! `what: "status"` answered by the built component in wasmtime over in-memory buckets: the
//! answer for the status mesh is pinned in `tests/golden/status/expected.json` (reviewed by
//! hand; `MESH_PROVISIONER_REGENERATE_GOLDEN=1` rewrites it), and what a requester may ask of it
//! is checked before anything is read.

use std::sync::Arc;

use mesh_provisioner::runtime::ReplyCode;
use mesh_provisioner::store::backend::Backend;
use serde_json::{json, Value};

fn golden() -> std::path::PathBuf {
    tests::root().join("tests/golden/status/expected.json")
}

#[tokio::test]
async fn the_status_of_the_mesh_matches_the_golden_file() {
    let b = tests::status_mesh::mesh();
    let (code, v) = tests::ask(b.clone() as Arc<dyn Backend>, json!({"what":"status"}).to_string().as_bytes()).await;
    assert_eq!(code, ReplyCode::Ok, "{v}");
    // Only `=1` rewrites the file: `=0` or an empty value must not.
    if tests::golden::regenerating() {
        std::fs::create_dir_all(golden().parent().unwrap()).unwrap();
        std::fs::write(golden(), serde_json::to_string_pretty(&v).unwrap() + "\n").unwrap();
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(golden()).expect("the golden status file")).unwrap();
    for (got, want) in v["entries"].as_array().unwrap().iter().zip(want["entries"].as_array().unwrap()) {
        assert_eq!(got, want, "the status of {}/{} differs from the golden file", want["node"], want["module"]);
    }
    assert_eq!(v, want);
    let states: Vec<&str> = v["entries"].as_array().unwrap().iter().map(|e| e["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["applied", "pending", "blocked", "nothing_needed", "blocked", "nothing_needed", "never_ran"]);
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

/// The status mesh with alpha/app's applied record naming the revision it applied of
/// `bound:postgres.db`, and a second holder that applied an older one.
fn rotated_mesh() -> Arc<mesh_provisioner::store::backend::MemoryBackend> {
    let b = tests::status_mesh::mesh();
    let now = b.bucket("postgres_bound").get("alpha.app.db").unwrap().unwrap().revision;
    let record = json!({"build":"b7","needs":4,"parts":["api"],"values":{"bound:postgres.db":now}});
    b.put("mesh-provisioner_applied", "alpha.app", record.to_string().as_bytes());
    b.put("mesh-provisioner_needs", "beta.api.bound.postgres=2Edb", b"{}");
    b.put("postgres_bound", "beta.api.db", b"{}");
    b.put("mesh-provisioner_applied", "beta.api", json!({"build":"a1","needs":1,"values":{"bound:postgres.db":1}}).to_string().as_bytes());
    b
}

#[tokio::test]
async fn the_component_answers_holders_as_the_logic_does_natively() {
    let b = rotated_mesh();
    let body = json!({"what":"holders","kind":"bound","name":"postgres.db"}).to_string();
    let (code, v) = tests::ask(b.clone() as Arc<dyn Backend>, body.as_bytes()).await;
    assert_eq!(code, ReplyCode::Ok, "{v}");
    let native = guest::verb::handle(&tests::native::Native(b.clone()), guest::verb::PROVISIONING, body.as_bytes(), 1 << 20);
    assert_eq!(v, serde_json::from_slice::<Value>(&native.body).unwrap());
    let states: Vec<(&str, &str)> = v["holders"].as_array().unwrap().iter().map(|h| (h["node"].as_str().unwrap(), h["state"].as_str().unwrap())).collect();
    assert_eq!(states, [("alpha", "current"), ("beta", "stale")]);
    assert_eq!(v["all_current"], false);
}

#[tokio::test]
async fn the_component_decides_who_hears_of_a_change() {
    use mesh_provisioner::runtime::{Limits, ValueEvent};
    let b = rotated_mesh();
    let guest = tests::guest();
    let inputs = guest.notice_inputs(b.clone() as Arc<dyn Backend>, Limits::default()).await.unwrap();
    assert!(inputs.contains(&"*_bound".to_string()), "{inputs:?}");
    let events = vec![
        ValueEvent { bucket: "postgres_bound".into(), key: "beta.api.db".into(), revision: 77, deleted: false },
        ValueEvent { bucket: "postgres_bound".into(), key: "nobody.holds.this".into(), revision: 78, deleted: false },
    ];
    let r = guest.notices(b.clone() as Arc<dyn Backend>, Limits::default(), &events).await.unwrap().unwrap();
    assert!(r.rest.is_empty());
    assert_eq!(r.notices.len(), 1, "{:?}", r.notices);
    assert_eq!(r.notices[0].node, "beta");
    let body: Value = serde_json::from_slice(&r.notices[0].body).unwrap();
    assert_eq!(
        body,
        json!({"node":"beta","module":"api","kind":"bound","name":"postgres.db","place":{"bucket":"postgres_bound","key":"beta.api.db"},"revision":77})
    );
}
