//! Shared helpers of the integration and end-to-end tests: where the built component is, one
//! compiled guest per test binary, and a way to ask it.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use mesh_provisioner::runtime::{Guest, Limits, ReplyCode, Runtime};
use mesh_provisioner::store::backend::Backend;
use serde_json::Value;

pub mod bench;
pub mod browser;
pub mod chaos;
pub mod golden;
pub mod native;
pub mod nats;
pub mod proxy;
pub mod schema;
pub mod status_mesh;

/// The workspace's root. Read at run time (cargo sets it for tests and benches): a target
/// directory shared between clones at other paths may hold a binary built in another clone.
pub fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR"))).join("..")
}

/// Where cargo puts build output (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

/// The component built by `cargo build -p guest --target wasm32-wasip2 --release` (the test
/// command builds it first), or `MESH_PROVISIONER_COMPONENT`.
pub fn component_path() -> PathBuf {
    let path = std::env::var_os("MESH_PROVISIONER_COMPONENT").map(PathBuf::from).unwrap_or_else(|| target_dir().join("wasm32-wasip2/release/guest.wasm"));
    assert!(path.exists(), "no component at {}: run the README's test command (scripts/test), which builds it", path.display());
    path
}

/// A test fixture built by `scripts/build-fixtures` (e.g. `v2`, `misbehave`, `not-wasm`).
pub fn fixture(name: &str) -> PathBuf {
    let path = target_dir().join("fixtures").join(format!("{name}.wasm"));
    assert!(path.exists(), "no fixture at {}: run scripts/test, which builds them", path.display());
    path
}

/// Puts `from` at `to` by an atomic rename, as a deployment would.
pub fn install(from: &std::path::Path, to: &std::path::Path) {
    let tmp = to.with_extension("incoming");
    std::fs::copy(from, &tmp).expect("copy component");
    std::fs::rename(&tmp, to).expect("rename component");
}

/// The real component, compiled once for the whole test binary.
pub fn guest() -> Guest {
    static GUEST: OnceLock<Guest> = OnceLock::new();
    GUEST
        .get_or_init(|| {
            let runtime = Runtime::new().expect("wasmtime runtime");
            let bytes = std::fs::read(component_path()).expect("read component");
            runtime.load(&bytes, None).expect("compile component")
        })
        .clone()
}

/// A published composition for the benchmarks: one part, 10 needs of mixed kinds (one of them
/// unanswered), one directory.
pub fn sample_composition() -> String {
    let kinds = ["config", "secret", "bound", "dir", "port", "collected", "shell", "consumers", "seat", "widget"];
    let needs: Vec<Value> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| serde_json::json!({"kind": k, "name": if *k == "bound" { "postgres.db".to_string() } else { format!("name{i}") }, "part": "api"}))
        .collect();
    serde_json::json!({"state": "published", "plan": {"parts": ["api"], "needs": needs, "dirs": [{"name": "state", "unknown_files": "keep"}]}}).to_string()
}

/// Asks the provisioning verb, returning the code and the parsed body.
pub async fn ask(backend: Arc<dyn Backend>, body: &[u8]) -> (ReplyCode, Value) {
    ask_with(backend, body, 1 << 20).await
}

pub async fn ask_with(backend: Arc<dyn Backend>, body: &[u8], max_reply: u32) -> (ReplyCode, Value) {
    let reply = guest().handle(backend, Limits::default(), "mesh-provisioner.provisioning", body, max_reply).await.expect("the guest answers");
    assert!(reply.body.len() <= max_reply.max(guest::verb::MIN_ANSWER) as usize, "reply of {} bytes over {max_reply}", reply.body.len());
    let v: Value = serde_json::from_slice(&reply.body).expect("the reply is JSON");
    schema::check(if reply.code == ReplyCode::Ok { "provisioning.reply" } else { "error" }, &v);
    (reply.code, v)
}

/// The keys of a reply's `entries`.
pub fn keys(v: &Value) -> Vec<String> {
    list(v, "entries")
}

/// The keys of a reply's `out_of_shape`.
pub fn out_of_shape(v: &Value) -> Vec<String> {
    list(v, "out_of_shape")
}

fn list(v: &Value, field: &str) -> Vec<String> {
    v[field].as_array().unwrap_or_else(|| panic!("no {field} in {v}")).iter().map(|e| e["key"].as_str().unwrap_or_default().to_string()).collect()
}

/// The resident memory of process `pid` in KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The most resident memory process `pid` has held, in KiB (0 when it cannot be read).
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Held for its whole run by a test that loads both cores for long (the chaos run, a thousand
/// modules, a bucket of 150 000 values): two of them never run at once, so neither starves the
/// other's servers (a source starved under the chaos run's faults once stalled past its bound).
/// The lock is not reentrant: a test that holds it and then starts a [`nats::Cluster`] (which
/// takes it too) would wait on itself, so a wait past [`HEAVY_WAIT`] fails the test saying so
/// rather than hanging the run.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    match tokio::time::timeout(HEAVY_WAIT, HEAVY.lock()).await {
        Ok(guard) => guard,
        Err(_) => panic!("waited {HEAVY_WAIT:?} for tests::heavy: a heavy test hangs, or this one already holds it (a Cluster takes it)"),
    }
}

/// Longer than any two heavy tests take one after the other on two cores.
pub const HEAVY_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Each module's state in a status answer, by `<node>/<module>`.
pub fn states_of(v: &Value) -> std::collections::BTreeMap<String, String> {
    v["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (format!("{}/{}", e["node"].as_str().unwrap_or(""), e["module"].as_str().unwrap_or("")), e["state"].as_str().unwrap_or("").to_string()))
        .collect()
}

/// At most the first 2000 characters of `s`, for a failure message.
pub fn shorten(s: &str) -> String {
    match s.char_indices().nth(2000) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Says that `test` could not run and why: printed, and (under `scripts/test`, which sets
/// `MESH_PROVISIONER_SKIPPED`) written where the run's summary line counts and names it, so a
/// test that cannot run never reads as passed.
pub fn skipped(test: &str, why: &str) {
    println!("skipped: {test}: {why}");
    if let Some(path) = std::env::var_os("MESH_PROVISIONER_SKIPPED") {
        use std::io::Write;
        let line = format!("{test}: {why}\n");
        let written = std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| f.write_all(line.as_bytes()));
        assert!(written.is_ok(), "cannot record the skipped test in {}: {written:?}", std::path::Path::new(&path).display());
    }
}
