//! Secrets stay out of argv and the log (issue 24, item 4): the real host binary logs in from
//! password files, and a URL with a password in it is printed redacted.

use std::time::Duration;

use tests::nats::{host_binary, Bus, Host};

#[tokio::test]
async fn passwords_given_in_files_never_show_in_argv_or_the_log() {
    let bus = Bus::start().await;
    let secrets = tempfile::tempdir().expect("dir");
    let (password, service) = (bus.password("mesh-provisioner"), bus.password("mesh-provisioner-service"));
    let (pw_file, svc_file) = (secrets.path().join("nats-password"), secrets.path().join("service-password"));
    std::fs::write(&pw_file, format!("{password}\n")).expect("write");
    std::fs::write(&svc_file, &service).expect("write");
    let (pw_file, svc_file) = (pw_file.display().to_string(), svc_file.display().to_string());
    let args = [
        "--nats-url",
        bus.url(),
        "--user",
        "mesh-provisioner",
        "--password-file",
        &pw_file,
        "--service-user",
        "mesh-provisioner-service",
        "--service-password-file",
        &svc_file,
    ];
    let mut host = Host::spawn_as(tempfile::tempdir().expect("dir"), &tests::component_path(), &args);
    host.wait_serving(&bus).await;
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", host.pid())).expect("cmdline");
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(cmdline.contains("--password-file"), "{cmdline}");
    for secret in [&password, &service] {
        assert!(!cmdline.contains(secret.as_str()), "a password in argv: {cmdline}");
        assert!(!host.log_text().contains(secret.as_str()), "a password in the log:\n{}", host.log_text());
    }
    host.stop().await;

    // A URL carrying a password is printed without it (here: nothing listens there).
    let port = mesh_provisioner::nats::embedded::free_port().expect("port");
    let url = format!("nats://mesh-provisioner:{password}@127.0.0.1:{port}");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(host_binary()).args(["query", "--nats-url", &url, "--timeout", "1s"]).output(),
    )
    .await
    .expect("query gives up")
    .expect("query runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("nats://mesh-provisioner:***@127.0.0.1"), "{said}");
    assert!(!said.contains(password.as_str()), "the password printed: {said}");
    // A user with no password to go with it is refused before anything is sent.
    let out = tokio::process::Command::new(host_binary()).args(["query", "--nats-url", bus.url(), "--user", "node-alpha"]).output().await.expect("runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--user needs --password-file"), "{}", String::from_utf8_lossy(&out.stderr));
}
