//! Every way the host logs in (SPEC §8), each against a real `nats-server` configured for it: a
//! token, an nkey, a creds file (operator mode: JWTs signed here with nkeys) and TLS with a CA
//! of the test's own. In each, the real host serves and a client logged in the same way is
//! answered.

use async_nats::ConnectOptions;
use base64::Engine;
use serde_json::json;
use tests::nats::{Host, RawServer};

/// JetStream in the server's own temporary directory, on its port; `auth` says who may log in.
fn config(auth: &str) -> String {
    format!("listen: \"127.0.0.1:{{{{PORT}}}}\"\njetstream {{ store_dir: \"{{{{DIR}}}}/js\" }}\n{auth}\n")
}

/// Starts the host with `login` and waits until a client connecting with `options` is answered.
async fn serves(server: &RawServer, url: &str, login: &[&str], options: ConnectOptions) -> Host {
    let mut args = vec!["--nats-url", url, "--seat-ttl", "2s"];
    args.extend_from_slice(login);
    let mut host = Host::spawn_as(tempfile::tempdir().unwrap(), &tests::component_path(), &args);
    let client = options.connect(url).await.unwrap_or_else(|e| panic!("the test client connects: {e}\n{}", server.log_text()));
    host.wait_answering(&client).await;
    let v = tests::nats::ask_ok(&client, json!({"what": "registry", "kind": "config"})).await;
    assert_eq!(tests::keys(&v), ["config"], "{v}");
    host
}

#[tokio::test]
async fn logs_in_with_a_token() {
    let server = RawServer::start(&config("authorization { token: \"t0ken-for-the-test\" }")).await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let host = serves(&server, &url, &["--token", "t0ken-for-the-test"], ConnectOptions::with_token("t0ken-for-the-test".into())).await;
    host.stop().await;
    // A wrong token is refused, and the host says so and exits.
    let out = std::process::Command::new(tests::nats::host_binary()).args(["query", "--nats-url", &url, "--token", "wrong"]).output().expect("run query");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).to_lowercase().contains("authorization"), "{}", String::from_utf8_lossy(&out.stderr));
    server.stop().await;
}

#[tokio::test]
async fn logs_in_with_an_nkey() {
    let user = nkeys::KeyPair::new_user();
    let server = RawServer::start(&config(&format!("authorization {{ users: [ {{ nkey: \"{}\" }} ] }}", user.public_key()))).await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let seed = user.seed().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("provisioner.nk");
    std::fs::write(&file, format!("{seed}\n")).unwrap();
    let host = serves(&server, &url, &["--nkey", file.to_str().unwrap()], ConnectOptions::with_nkey(seed)).await;
    host.stop().await;
    server.stop().await;
}

/// A JWT as nats-server reads it: header, claims, and the issuer's ed25519 signature.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let iat = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims = json!({"jti": format!("{name}{iat}"), "iat": iat, "iss": issuer.public_key(), "name": name, "sub": subject, "nats": nats});
    let body = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let signature = issuer.sign(body.as_bytes()).unwrap();
    format!("{body}.{}", b64(&signature))
}

#[tokio::test]
async fn logs_in_with_a_creds_file() {
    let (operator, account, user) = (nkeys::KeyPair::new_operator(), nkeys::KeyPair::new_account(), nkeys::KeyPair::new_user());
    let op_jwt = jwt(&operator, &operator.public_key(), "test-operator", json!({"type": "operator", "version": 2}));
    let unlimited = json!({"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1});
    let acc_jwt = jwt(&operator, &account.public_key(), "MESH", json!({"type": "account", "version": 2, "limits": unlimited}));
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "mesh-provisioner",
        json!({"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}),
    );
    // JetStream needs a system account in operator mode.
    let system = nkeys::KeyPair::new_account();
    let sys_jwt = jwt(&operator, &system.public_key(), "SYS", json!({"type": "account", "version": 2}));
    let auth = format!(
        "operator: \"{op_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{ {acc}: \"{acc_jwt}\", {sys}: \"{sys_jwt}\" }}",
        acc = account.public_key(),
        sys = system.public_key()
    );
    let server = RawServer::start(&config(&auth)).await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("provisioner.creds");
    let seed = user.seed().unwrap();
    std::fs::write(
        &creds,
        format!("-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"),
    )
    .unwrap();
    let options = ConnectOptions::with_credentials_file(&creds).await.expect("read the creds file");
    let host = serves(&server, &url, &["--creds", creds.to_str().unwrap()], options).await;
    host.stop().await;
    server.stop().await;
}

/// A CA and a server certificate for 127.0.0.1, made with the openssl command.
fn certificates(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    run(&[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=mesh test CA"]].concat());
    run(&[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]].concat());
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

#[tokio::test]
async fn logs_in_over_tls_trusting_the_given_ca() {
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let at = |f: &str| certs.path().join(f).display().to_string();
    let auth = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\" }}\nauthorization {{ user: \"prov\", password: \"pw-for-the-test\" }}",
        at("server.pem"),
        at("server.key")
    );
    let server = RawServer::start(&config(&auth)).await;
    let url = format!("tls://127.0.0.1:{}", server.port);
    let options =
        ConnectOptions::with_user_and_password("prov".into(), "pw-for-the-test".into()).add_root_certificates(certs.path().join("ca.pem")).require_tls(true);
    let ca = at("ca.pem");
    let host = serves(&server, &url, &["--user", "prov", "--password", "pw-for-the-test", "--tls-ca", &ca, "--tls-required"], options).await;
    // The same query with the CA and without it, while the host serves: only trusting the CA
    // connects and is answered, and the refusal is the certificate's (not a port or a password).
    let query = |with_ca: bool| {
        let mut args = vec!["query", "--nats-url", &url, "--user", "prov", "--password", "pw-for-the-test", "--tls-required"];
        if with_ca {
            args.extend(["--tls-ca", &ca]);
        }
        std::process::Command::new(tests::nats::host_binary()).args(&args).output().expect("run query")
    };
    let trusted = query(true);
    assert!(trusted.status.success(), "the query trusting the CA failed: {}", String::from_utf8_lossy(&trusted.stderr));
    let out = query(false);
    let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(!out.status.success(), "connected over TLS without trusting the CA");
    assert!(said.contains("certificate") || said.contains("unknownissuer"), "refused for another reason than the certificate: {said}");
    host.stop().await;
    server.stop().await;
}
