//! Only trusted code is loaded, end to end (the real host binary and a real `nats-server`): a
//! planted or tampered compiled-component cache is compiled afresh, never loaded; a component
//! file others may write is refused; with `--trust-key`, only a component signed by that key
//! loads or swaps in.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tests::nats::{host_binary, Bus, Host};
use tests::{fixture, install};

/// The one cached artifact of the state directory.
fn artifact(state: &Path) -> PathBuf {
    let dir = state.join("components");
    let found: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "cwasm")).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

#[tokio::test]
async fn a_planted_or_tampered_cache_is_compiled_afresh_never_loaded() {
    let bus = Bus::start().await;
    let host = Host::start(&bus, &[]).await;
    let state = host.stop().await;
    let mode = std::fs::metadata(state.path().join("components")).unwrap().permissions().mode();
    let cwasm = artifact(state.path());
    // Tampered: the bytes change after they were written.
    let mut bytes = std::fs::read(&cwasm).unwrap();
    bytes.push(0);
    std::fs::write(&cwasm, &bytes).unwrap();
    let host = Host::start_in(&bus, state, &[]).await;
    let log = host.log_text();
    assert!(log.contains("cached component not trusted") && log.contains("does not match the digest"), "{log}");
    assert_eq!(log.matches("from_cache=false").count(), 2, "{log}");
    let state = host.stop().await;
    // Planted: an artifact with no record of having been written here.
    std::fs::remove_file(cwasm.with_extension("cwasm.sha256")).unwrap();
    let host = Host::start_in(&bus, state, &[]).await;
    assert_eq!(host.log_text().matches("from_cache=false").count(), 3, "{}", host.log_text());
    let state = host.stop().await;
    // As written: trusted.
    let host = Host::start_in(&bus, state, &[]).await;
    assert!(host.log_text().contains("from_cache=true"), "{}", host.log_text());
    let state = host.stop().await;
    // A cache directory others may write is never trusted.
    std::fs::set_permissions(state.path().join("components"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let host = Host::start_in(&bus, state, &[]).await;
    assert!(host.log_text().contains("may be written by group or others (mode 0777)"), "{}", host.log_text());
    assert_eq!(host.log_text().matches("from_cache=true").count(), 1);
    host.stop().await;
    assert_eq!(mode & 0o077, 0, "the cache directory is open to others: {mode:o}");
}

#[tokio::test]
async fn a_component_others_may_write_is_refused() {
    let bus = Bus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let component = dir.path().join("guest.wasm");
    install(&tests::component_path(), &component);
    std::fs::set_permissions(&component, std::fs::Permissions::from_mode(0o666)).unwrap();
    // At start: the server does not start.
    let out = std::process::Command::new(host_binary())
        .args(["serve", "--nats-url", bus.url(), "--user", "mesh-provisioner", "--password", &bus.password("mesh-provisioner"), "--component"])
        .arg(&component)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("may be written by group or others (mode 0666)"), "{text}");
    // On a swap: refused, counted, the current one keeps serving.
    std::fs::set_permissions(&component, std::fs::Permissions::from_mode(0o644)).unwrap();
    let host = Host::start_with(&bus, tempfile::tempdir().unwrap(), &component, &[]).await;
    let c = bus.client("node-alpha").await;
    let tmp = component.with_extension("incoming");
    std::fs::copy(fixture("v2"), &tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::fs::rename(&tmp, &component).unwrap();
    let m = Host::info_until(&c, "a refusal", |m| m["refusals"] == "1").await;
    assert!(m["last_refusal"].as_str().unwrap().contains("mode 0664"), "{m}");
    assert_ne!(m["component_version"], "0.2.0-fixture");
    host.stop().await;
}

fn cli(args: &[&str]) -> String {
    let out = std::process::Command::new(host_binary()).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn with_a_trust_key_only_signed_components_load() {
    let bus = Bus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (secret, other) = (dir.path().join("signing.key"), dir.path().join("other.key"));
    let public = cli(&["keygen", secret.to_str().unwrap()]);
    cli(&["keygen", other.to_str().unwrap()]);
    let component = dir.path().join("guest.wasm");
    install(&tests::component_path(), &component);
    // Unsigned: the server does not start.
    let unsigned = std::process::Command::new(host_binary())
        .args([
            "serve",
            "--nats-url",
            bus.url(),
            "--user",
            "mesh-provisioner",
            "--password",
            &bus.password("mesh-provisioner"),
            "--trust-key",
            &public,
            "--component",
        ])
        .arg(&component)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!unsigned.status.success() && String::from_utf8_lossy(&unsigned.stderr).contains("signature"), "{}", String::from_utf8_lossy(&unsigned.stderr));
    cli(&["sign", "--key", secret.to_str().unwrap(), component.to_str().unwrap()]);
    let host = Host::start_with(&bus, tempfile::tempdir().unwrap(), &component, &["--trust-key", &public]).await;
    let c = bus.client("node-alpha").await;

    // v2 signed by another key: refused.
    let staged = dir.path().join("staged.wasm");
    install(&fixture("v2"), &staged);
    cli(&["sign", "--key", other.to_str().unwrap(), staged.to_str().unwrap()]);
    std::fs::copy(dir.path().join("staged.wasm.sig"), dir.path().join("guest.wasm.sig")).unwrap();
    install(&staged, &component);
    let m = Host::info_until(&c, "a refusal", |m| m["refusals"] == "1").await;
    assert!(m["last_refusal"].as_str().unwrap().contains("does not verify"), "{m}");
    // Signed by the trusted key: swapped in (SIGHUP, the file itself being unchanged).
    let said = cli(&["sign", "--key", secret.to_str().unwrap(), component.to_str().unwrap()]);
    assert!(said.contains("version 0.2.0-fixture, sha256 "), "sign says what it bound: {said}");
    host.signal("HUP");
    Host::info_until(&c, "v2 swapped in", |m| m["component_version"] == "0.2.0-fixture").await;

    // The older version, signed by the trusted key all the same, copied back: a rollback,
    // refused and counted; v2 keeps serving.
    let old = dir.path().join("old.wasm");
    install(&tests::component_path(), &old);
    cli(&["sign", "--key", secret.to_str().unwrap(), old.to_str().unwrap()]);
    std::fs::copy(dir.path().join("old.wasm.sig"), dir.path().join("guest.wasm.sig")).unwrap();
    install(&old, &component);
    let m = Host::info_until(&c, "the rollback refused", |m| m["refusals"] == "2").await;
    assert!(m["last_refusal"].as_str().unwrap().contains("older than 0.2.0-fixture"), "{m}");
    assert_eq!(m["component_version"], "0.2.0-fixture");
    let state = host.stop().await;

    // Nor at a restart on the same state directory; an operator's deliberate downgrade is a flag.
    let out = std::process::Command::new(host_binary())
        .args([
            "serve",
            "--nats-url",
            bus.url(),
            "--user",
            "mesh-provisioner",
            "--password",
            &bus.password("mesh-provisioner"),
            "--trust-key",
            &public,
            "--component",
        ])
        .arg(&component)
        .arg("--state-dir")
        .arg(state.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("a rollback is refused"), "{said}");
    let host = Host::start_with(&bus, state, &component, &["--trust-key", &public, "--allow-downgrade"]).await;
    Host::info_until(&c, "the downgrade", |m| m["component_version"] != "0.2.0-fixture").await;
    host.stop().await;
}

/// Starts `serve` with `component` and `state`; it must not start: what it said.
fn refused_at_start(bus: &Bus, component: &Path, state: &Path) -> String {
    let out = std::process::Command::new(host_binary())
        .args(["serve", "--nats-url", bus.url(), "--user", "mesh-provisioner", "--password", &bus.password("mesh-provisioner"), "--component"])
        .arg(component)
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "it started: {text}");
    text
}

#[tokio::test]
async fn a_stranger_can_slip_in_no_component_and_no_record() {
    let bus = Bus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let component = dir.path().join("guest.wasm");
    install(&tests::component_path(), &component);
    std::fs::set_permissions(&component, std::fs::Permissions::from_mode(0o644)).unwrap();

    // Through a link (the stat and the read could see two files): refused.
    let link = dir.path().join("link.wasm");
    std::os::unix::fs::symlink(&component, &link).unwrap();
    let said = refused_at_start(&bus, &link, &state);
    assert!(said.contains("is a symbolic link"), "{said}");

    // In a directory others may write (they could rename another file over it): refused.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let inside = open.join("guest.wasm");
    install(&tests::component_path(), &inside);
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let said = refused_at_start(&bus, &inside, &state);
    assert!(said.contains("its directory") && said.contains("mode 0777"), "{said}");

    // Owned by another user (neither root nor this server's): refused. Only root can give a
    // file away, which is how this suite runs (and CI); as another user this part is skipped.
    if std::fs::metadata(dir.path()).unwrap().uid() == 0 {
        let theirs = dir.path().join("theirs.wasm");
        install(&tests::component_path(), &theirs);
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let said = refused_at_start(&bus, &theirs, &state);
        assert!(said.contains("belongs to uid 65534"), "{said}");
    } else {
        tests::skipped("e2e::trust (a component owned by another user)", "not root: a file cannot be given away here");
    }

    // A state directory others may read: refused, naming the fix.
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let said = refused_at_start(&bus, &component, &state);
    assert!(said.contains("mode 0755") && said.contains("chmod 700"), "{said}");

    // A record of the embedded server planted in a state directory others may write: `query`
    // does not send the provisioner's password where it says.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(state.join("embedded.json"), r#"{"url":"nats://127.0.0.1:1","passwords":[["mesh-provisioner","x"]]}"#).unwrap();
    let out = std::process::Command::new(host_binary()).args(["query", "--state-dir"]).arg(&state).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("state directory") && said.contains("chmod 700"), "{said}");
}
