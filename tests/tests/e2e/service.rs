//! The systemd unit in `deploy/`: `systemd-analyze verify` takes it without a word (its
//! `ExecStart` pointed at the built binary, since the installed path does not exist here), it
//! names the hardening the README promises, its reload is a hot replace (SIGHUP), and the
//! command it runs is one the binary accepts.

use std::process::Command;

fn unit() -> String {
    std::fs::read_to_string(tests::root().join("deploy/mesh-provisioner.service")).expect("deploy/mesh-provisioner.service")
}

#[test]
fn systemd_takes_the_unit_without_a_warning() {
    let binary = tests::nats::host_binary();
    let text = unit().replace("/usr/local/bin/mesh-provisioner", &binary.to_string_lossy());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("mesh-provisioner.service");
    std::fs::write(&path, &text).expect("write the unit");
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze runs (scripts/setup installs it)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify failed: {said}");
    let about_ours: Vec<&str> = said.lines().filter(|l| l.contains("mesh-provisioner.service")).collect();
    assert!(about_ours.is_empty(), "systemd-analyze warns about the unit:\n{}", about_ours.join("\n"));
}

#[test]
fn systemd_would_say_so_of_a_mistake() {
    // The check above means something only if a wrong key is reported.
    let text = unit().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("mesh-provisioner.service");
    std::fs::write(&path, text).expect("write the unit");
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unknown key 'NoNewPrivilege'"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_unit_is_hardened_and_reloads_by_hot_replace() {
    let text = unit();
    let settings: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with('#') && l.contains('=')).collect();
    for wanted in [
        "DynamicUser=yes",
        "StateDirectory=mesh-provisioner",
        "StateDirectoryMode=0700",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "UMask=0077",
    ] {
        assert!(settings.contains(&wanted), "the unit does not say {wanted}");
    }
}

#[test]
fn the_binary_accepts_the_command_the_unit_runs() {
    let text = unit();
    let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/mesh-provisioner"));
    let args: Vec<&str> = words.collect();
    // `--help` after the unit's own arguments: clap checks every argument before printing help.
    let out = Command::new(tests::nats::host_binary()).args(&args).arg("--help").output().expect("the host binary runs");
    assert!(out.status.success(), "the binary refuses {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}
