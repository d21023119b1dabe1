//! End to end: the real host binary against a real `nats-server` (started per test on a free
//! loopback port, with the example accounts config) and the real component. Each module is one
//! behaviour an operator or a node sees; every test starts its own servers and stops them.
//!
//! A new test goes in the module of the behaviour it checks. No test here asserts a duration or
//! a rate (those are benchmarks, `tests/benches`), and a negative check waits on a positive
//! event first. A test that loads both cores for long holds `tests::heavy()` while it runs.

mod accounts;
mod causes;
mod chaos;
mod cli;
mod connect;
mod dashboards;
mod drift;
mod events;
mod fresh;
mod holders;
mod http;
mod http_guard;
mod leaf;
mod operator;
mod overload;
mod plans;
mod reply_cache;
mod requesters;
mod seat;
mod secrets;
mod serve;
mod service;
mod snapshot;
mod state_faults;
mod status;
mod trust;
mod unavailable;
mod upgrade;
mod writers;

/// `serve --demo` (and `extra`) with its state in `state`, no bus named, its log in
/// `host.log` there; returned once it says the demo mesh is written, failing with its log if it
/// exits first or says nothing for a minute.
async fn serve_demo(state: &std::path::Path, extra: &[&str]) -> tokio::process::Child {
    use std::time::{Duration, Instant};
    let log = state.join("host.log");
    let mut child = tokio::process::Command::new(tests::nats::host_binary())
        .args(["serve", "--demo"])
        .args(extra)
        .args(["--demo-every", "3s", "--seat-ttl", "2s", "--component"])
        .arg(tests::component_path())
        .arg("--state-dir")
        .arg(state)
        .env("RUST_LOG", "info")
        .env_remove("MESH_PROVISIONER_NATS_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the host's log"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve --demo");
    let start = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("demo mesh written") {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("serve --demo {extra:?} exited ({status}):\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no demo mesh:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}
