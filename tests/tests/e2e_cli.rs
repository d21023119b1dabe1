//! The command line, as an operator uses it: `query` against a real bus, `check` and `registry`
//! on real and bad components, SIGHUP.

use std::process::Output;
use std::time::Duration;

use tests::nats::{host_binary, Bus, Host};
use tests::fixture;

fn run(args: &[&str]) -> Output {
    std::process::Command::new(host_binary()).args(args).output().expect("run the host binary")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test]
async fn query_prints_a_table_with_odd_keys_and_exits_non_zero_on_an_error_reply() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.db=2Eurl", br#"{"placeholder":"${config:db.url}"}"#).await;
    bus.put("node-alpha", "mesh-provisioner_needs", "alpha.app.config.=3a", b"{}").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pw = bus.password("node-alpha");
    let conn = ["--nats-url", bus.url(), "--user", "node-alpha", "--password", pw.as_str()];
    let out = run(&[&["query", "needs", "--node", "alpha"][..], &conn].concat());
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("db.url") && t.contains("NODE") && t.contains("1 key(s) out of shape") && t.contains("alpha.app.config.=3a"), "{t}");

    let out = run(&[&["query", "needs", "--node", "alpha", "--json"][..], &conn].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints the reply");
    assert_eq!(v["what"], "needs");

    let out = run(&[&["query", "needs", "--node", "*"][..], &conn].concat());
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("bad_request (400)") && t.contains("not an identifier"), "{t}");
    host.stop().await;
}

#[test]
fn check_passes_the_real_component_and_refuses_bad_ones_with_the_reason() {
    let ok = run(&["check", tests::component_path().to_str().unwrap()]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("13 registry kinds"));
    for (name, why) in [("not-wasm", "not a WebAssembly file"), ("incompatible", "does not"), ("trap-at-start", "trapped"), ("loop-at-start", "deadline")] {
        let out = run(&["check", fixture(name).to_str().unwrap()]);
        assert!(!out.status.success(), "{name} passed the check");
        assert!(text(&out).contains(why), "{name}: {}", text(&out));
    }
    let reg = run(&["registry", "--component", tests::component_path().to_str().unwrap()]);
    assert!(reg.status.success());
    assert_eq!(String::from_utf8_lossy(&reg.stdout).lines().count(), 13);
}

#[tokio::test]
async fn sighup_rereads_the_component() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    host.signal("HUP");
    let start = std::time::Instant::now();
    while !host.log_text().contains("component unchanged") {
        assert!(start.elapsed() < Duration::from_secs(10), "SIGHUP not acted on:\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.stop().await;
}
