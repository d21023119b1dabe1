//! Misbehaviour for test fixtures, compiled in only by the `fixture-*` features: the real
//! component's functions here are empty. The host must survive each of these.

/// Called first by `info` and `compile-registry`, the host's smoke run.
#[inline(always)]
pub fn at_start() {
    #[cfg(feature = "fixture-trap-at-start")]
    core::arch::wasm32::unreachable();
    #[cfg(feature = "fixture-loop-at-start")]
    spin();
    #[cfg(feature = "fixture-alloc-at-start")]
    hoard();
}

/// Called first by `refresh`: a component whose plans cannot be followed.
#[inline(always)]
pub fn at_refresh() {
    #[cfg(feature = "fixture-trap-at-refresh")]
    core::arch::wasm32::unreachable();
}

/// Called first by `handle`: `{"fixture":"trap"|"loop"|"alloc"}` misbehaves on demand,
/// `{"fixture":"slow"}` answers normally after 1.5 s (time for the seat to be lost meanwhile), and
/// `{"fixture":"probe","port":N}` answers with what the sandbox lets it see (a TCP connection to
/// the test's own listener on port N among it). `Some` is a reply body.
#[inline(always)]
pub fn on_request(_request: &[u8]) -> Option<Vec<u8>> {
    #[cfg(feature = "fixture-misbehave")]
    match _request {
        br#"{"fixture":"trap"}"# => core::arch::wasm32::unreachable(),
        br#"{"fixture":"loop"}"# => spin(),
        br#"{"fixture":"alloc"}"# => hoard(),
        r if r.starts_with(br#"{"fixture":"probe""#) => {
            let port = serde_json::from_slice::<serde_json::Value>(r).ok().and_then(|v| v["port"].as_u64()).unwrap_or(4222);
            return Some(probe(port));
        }
        br#"{"fixture":"slow"}"# => {
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_millis(1500) {
                std::hint::black_box(start);
            }
            return Some(br#"{"slow":true}"#.to_vec());
        }
        _ => {}
    }
    None
}

/// What a guest can reach of the world outside its imports.
#[cfg(feature = "fixture-misbehave")]
fn probe(port: u64) -> Vec<u8> {
    serde_json::json!({
        "env": std::env::vars().count(),
        "args": std::env::args().count(),
        "read_root": std::fs::read_dir("/").is_ok(),
        "read_dot": std::fs::read_dir(".").is_ok(),
        "read_file": std::fs::read("/etc/hostname").is_ok(),
        "write_file": std::fs::write("probe.txt", b"x").is_ok(),
        "tcp": std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_ok(),
        "dns": std::net::ToSocketAddrs::to_socket_addrs(&format!("localhost:{port}")).is_ok(),
    })
    .to_string()
    .into_bytes()
}

#[allow(dead_code)]
fn spin() {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

#[allow(dead_code)]
fn hoard() {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    loop {
        kept.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&kept);
    }
}
