//! Compiling and reconciling the registry, by the built component in wasmtime.

use std::sync::Arc;

use mesh_provisioner::store::backend::{Backend, MemoryBackend};
use serde_json::Value;

const REGISTRY: &str = "mesh-provisioner_registry";

async fn reconcile(b: &Arc<MemoryBackend>) -> mesh_provisioner::runtime::ReconcileReport {
    tests::guest().reconcile(b.clone() as Arc<dyn Backend>, Default::default()).await.expect("guest runs").expect("reconciles")
}

#[tokio::test]
async fn compiles_thirteen_canonical_entries() {
    let rows = tests::guest().compile_registry(MemoryBackend::new(), Default::default()).await.unwrap();
    assert_eq!(rows.len(), 13);
    for (kind, value) in &rows {
        let v: Value = serde_json::from_slice(value).unwrap();
        assert_eq!(v["kind"], kind.as_str());
        // Canonical: re-serializing (sorted keys, no spaces) gives the same bytes.
        assert_eq!(v.to_string().as_bytes(), value.as_slice());
    }
    let config = rows.iter().find(|(k, _)| k == "config").unwrap();
    assert_eq!(String::from_utf8_lossy(&config.1), r#"{"bucket":"mesh-config_values","key":"<node>.<module>.<name>","kind":"config","owner":"mesh-config"}"#);
}

#[tokio::test]
async fn fills_an_empty_bucket_then_writes_nothing() {
    let b = MemoryBackend::new();
    let first = reconcile(&b).await;
    assert_eq!((first.puts.len(), first.deletes.len()), (13, 0));
    assert_eq!(b.registry_writes(), 13);
    let second = reconcile(&b).await;
    assert_eq!((second.writes(), second.unchanged.len()), (0, 13));
    assert_eq!(b.registry_writes(), 13, "an unchanged mesh causes zero writes");
}

#[tokio::test]
async fn restores_a_drifted_entry_and_deletes_stale_kinds() {
    let b = MemoryBackend::new();
    reconcile(&b).await;
    b.put(REGISTRY, "config", br#"{"kind":"config","owner":"someone-else"}"#);
    b.put(REGISTRY, "retired", br#"{"kind":"retired"}"#);
    b.put(REGISTRY, "not.a.kind", b"{}");
    b.delete(REGISTRY, "port");
    let r = reconcile(&b).await;
    assert_eq!(r.puts, ["config", "port"]);
    assert_eq!(r.deletes, ["not.a.kind", "retired"]);
    assert_eq!(r.unchanged.len(), 11);
    let config = b.bucket(REGISTRY).get("config").unwrap().unwrap();
    assert!(String::from_utf8_lossy(&config.value).contains("mesh-config_values"));
    assert!(b.bucket(REGISTRY).get("retired").unwrap().is_none());
    assert_eq!(reconcile(&b).await.writes(), 0);
}
