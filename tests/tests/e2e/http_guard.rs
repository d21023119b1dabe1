//! The HTTP side guarded like an exporter on a shared host (issue 24, item 1), with real
//! sockets against the real host binary: a foreign `Host` is refused, half-sent requests are
//! closed within the header timeout while `/healthz` keeps answering, a connection flood past
//! the cap is closed at once, and the probes answer whatever holds the connections (issue 46).

use std::time::{Duration, Instant};

use tests::browser::get;
use tests::nats::{Bus, Host};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One GET with the `Host` header `host`: the status code.
async fn get_as(addr: &str, path: &str, host: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
    String::from_utf8_lossy(&raw).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The address of the probes' own listener (`--http-probes`), as the log gives it.
fn probes_of(host: &Host) -> String {
    let log = host.log_text();
    log.lines()
        .find(|l| l.contains("probes alone"))
        .and_then(|l| l.split("url=http://").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .map(|a| a.trim_end_matches('/').to_string())
        .unwrap_or_else(|| panic!("no probes address in the log:\n{log}"))
}

/// The count of HTTP connections refused, as the probes' own listener's `/metrics` says.
async fn refused(probes: &str) -> f64 {
    let (_, _, text) = get(&format!("{probes}/metrics")).await;
    text.lines().find_map(|l| l.strip_prefix("mesh_provisioner_http_connections_refused_total ")).and_then(|v| v.parse().ok()).unwrap_or(-1.0)
}

/// Whether the server closed `s` (a read returns end of file or an error) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn answers_only_its_own_names_closes_slow_clients_and_caps_connections() {
    let bus = Bus::start().await;
    let host =
        Host::start(&bus, &["--http", "127.0.0.1:0", "--http-header-timeout", "3s", "--http-max-connections", "80", "--http-probes", "127.0.0.1:0"]).await;
    let url = host.http_url().await;
    let probes = format!("http://{}", probes_of(&host));
    let addr = url.trim_start_matches("http://").to_string();
    let port = addr.rsplit(':').next().expect("a port").to_string();

    // Its own names are answered; a foreign one (DNS rebinding) is not.
    assert_eq!(get(&format!("{url}/healthz")).await.0, 200);
    // The guests' one memory budget is in the metrics, with what they hold of it.
    let (_, _, metrics) = get(&format!("{url}/metrics")).await;
    assert!(metrics.contains("mesh_provisioner_guest_memory_budget_bytes 1073741824"), "{metrics}");
    let held: f64 = metrics.lines().find_map(|l| l.strip_prefix("mesh_provisioner_guest_memory_bytes ")).and_then(|v| v.parse().ok()).expect("the figure");
    assert!(held > 0.0 && held < 1073741824.0, "{held}");
    for ok in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), "LOCALHOST".to_string()] {
        assert_eq!(get_as(&addr, "/api/status", &ok).await, 200, "{ok}");
    }
    for foreign in [format!("evil.example:{port}"), "attacker.test".to_string(), String::new()] {
        assert_eq!(get_as(&addr, "/api/status", &foreign).await, 421, "{foreign:?}");
    }

    // 64 half-sent requests: closed by the server (at its header timeout, 3 s) while /healthz
    // answers; a client that never ends its request is not held forever.
    let mut slow = Vec::new();
    for _ in 0..64 {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        s.write_all(format!("GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ").as_bytes()).await.expect("send");
        slow.push(s);
    }
    assert_eq!(get(&format!("{url}/healthz")).await.0, 200, "healthz while 64 requests hang");
    for s in slow.iter_mut() {
        assert!(closed_within(s, Duration::from_secs(60)).await, "a half-sent request was kept open");
    }
    assert_eq!(refused(&probes).await, 0.0, "no connection was refused before the flood");

    // A flood past the cap: the connections beyond 80 and the probes' reserve of 16 are refused
    // (closed at once, counted), the others held; once the flood is gone the server answers.
    let mut flood = Vec::new();
    for _ in 0..120 {
        if let Ok(s) = TcpStream::connect(&addr).await {
            flood.push(s);
        }
    }
    assert_eq!(flood.len(), 120, "the listener's backlog took every connection");
    let start = Instant::now();
    while refused(&probes).await < 24.0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the connections past the cap were never refused: {}", refused(&probes).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut held = flood.pop().expect("a connection");
    // (A write to a closed connection may fail: what matters is that nothing is read.)
    let _ = held.write_all(format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").as_bytes()).await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), held.read_to_end(&mut raw)).await;
    let reply = String::from_utf8_lossy(&raw);
    // The last connection in is past the cap and the reserve: refused, it reads nothing.
    assert!(reply.is_empty(), "the 120th connection was served: {reply}");
    assert_eq!(refused(&probes).await, 24.0, "exactly the connections past 80 and the reserve of 16");
    drop(flood);
    let start = Instant::now();
    loop {
        if get_as(&addr, "/healthz", "localhost").await == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the server did not answer after the flood");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    host.stop().await;

    // What `serve` says when it refuses to start with `flags`.
    let refused = |flags: &'static [&'static str]| async move {
        let out = tokio::process::Command::new(tests::nats::host_binary())
            .arg("serve")
            .args(flags)
            .arg("--component")
            .arg(tests::component_path())
            .output()
            .await
            .expect("runs");
        assert!(!out.status.success(), "serve {flags:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A budget that cannot hold one call is refused at start.
    let said = refused(&["--guest-memory", "64", "--guest-memory-total", "32"]).await;
    assert!(said.contains("--guest-memory-total (32 MiB) must hold at least one call's --guest-memory (64 MiB)"), "{said}");
    // So is a call's memory smaller than an instance, named by its flag before anything starts.
    let said = refused(&["--guest-memory", "1"]).await;
    assert!(said.contains("--guest-memory") && said.contains("1 is not in 2..=4096"), "{said}");
}

/// One GET as a browser on this machine would send it: the status code and the body.
async fn fetch(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// An event stream opened and its answer's first line read; the stream is kept open.
async fn follow(addr: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /api/events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n").await.expect("send");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    (s, text)
}

#[tokio::test]
async fn probes_answer_while_event_streams_and_slow_clients_take_every_connection() {
    let bus = Bus::start().await;
    let host =
        Host::start(&bus, &["--http", "127.0.0.1:0", "--http-probes", "127.0.0.1:0", "--http-header-timeout", "60s", "--http-max-connections", "20"]).await;
    let url = host.http_url().await;
    let addr = url.trim_start_matches("http://").to_string();
    let probes = probes_of(&host);
    assert_eq!(fetch(&addr, "/healthz").await.0, 200);

    // One address follows the events eight times; a ninth is refused with the reason.
    let mut streams = Vec::new();
    for _ in 0..8 {
        let (s, head) = follow(&addr).await;
        assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/event-stream"), "{head}");
        streams.push(s);
    }
    let (_, refused) = follow(&addr).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "a ninth stream from one address: {refused}");
    let (code, why) = fetch(&addr, "/api/events").await;
    assert_eq!(code, 503);
    assert!(why.contains("8 event streams are open from this address"), "{why}");

    // Slow clients take the rest of the 20 connections (and hold them: the header timeout is a
    // minute). The probes and the metrics are still answered, in the reserve; nothing else is.
    let mut slow = Vec::new();
    let hang = |addr: String| async move {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        s.write_all(b"GET /api/status HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").await.expect("send");
        s
    };
    for _ in 0..12 {
        slow.push(hang(addr.clone()).await);
    }
    let (code, body) = fetch(&addr, "/api/status").await;
    assert_eq!(code, 503, "every connection is taken: {body}");
    assert!(body.contains("answers only /healthz, /readyz and /metrics"), "{body}");
    assert_eq!(fetch(&addr, "/healthz").await.0, 200);
    let (code, ready) = fetch(&addr, "/readyz").await;
    assert!(code == 200 && ready.contains("\"ready\":true"), "{code} {ready}");
    let (code, metrics) = fetch(&addr, "/metrics").await;
    assert!(code == 200 && metrics.contains("mesh_provisioner_seat_holder 1"), "{code}");

    // The reserve taken too: the probes' own listener still answers them, and only them.
    for _ in 0..16 {
        slow.push(hang(addr.clone()).await);
    }
    assert_eq!(fetch(&addr, "/healthz").await.0, 0, "the reserve is full: the connection is closed at once");
    assert_eq!(fetch(&probes, "/healthz").await.0, 200);
    let (code, ready) = fetch(&probes, "/readyz").await;
    assert!(code == 200 && ready.contains("\"ready\":true"), "{code} {ready}");
    assert_eq!(fetch(&probes, "/metrics").await.0, 200);
    assert_eq!(fetch(&probes, "/api/status").await.0, 503);
    drop((streams, slow));
}
