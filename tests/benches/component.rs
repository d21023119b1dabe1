//! The verb's cost in the component against the same logic called natively, and what instance
//! reuse and the pooling allocator change. A benchmark, not a test: it prints figures.
//!
//! `cargo bench -p tests --bench component` (after `cargo build -p guest --target wasm32-wasip2 --release`);
//! `BENCH_ONLY=<words>` runs only the variants whose name holds them (for `perf record`), and
//! `BENCH_CALLS=<n>` sets the calls a variant (3000); `BENCH_ONLY=cold` times the query on caches
//! another process would leave (`BENCH_EVICT_MB` written between calls, 8 by default) and after
//! the thread slept 100 µs (the core idle or lent meanwhile, as between one-at-a-time requests).

use std::time::{Duration, Instant};

use mesh_provisioner::runtime::{EngineOptions, Limits, ReplyCode, Runtime};
use mesh_provisioner::store::backend::MemoryBackend;
use tests::native::Native;

const NEEDS: &str = "mesh-provisioner_needs";
const QUERY: &[u8] = br#"{"what":"needs","node":"n0420","module":"app"}"#;

/// The times of `n` runs of `f`.
fn samples<F: std::future::Future<Output = ()>>(rt: &tokio::runtime::Runtime, n: usize, mut f: impl FnMut() -> F) -> Vec<Duration> {
    rt.block_on(async {
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            f().await;
            times.push(t.elapsed());
        }
        times
    })
}

/// The median of `n` timed runs of `f`.
fn timed<F: std::future::Future<Output = ()>>(rt: &tokio::runtime::Runtime, n: usize, f: impl FnMut() -> F) -> Duration {
    median(samples(rt, n, f))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let backend = MemoryBackend::new();
    for n in 0..1000 {
        for k in 0..10 {
            backend.put(NEEDS, &format!("n{n:04}.app.config.name{k}"), br#"{"placeholder":"${config:x}","part":"api"}"#);
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    let bytes = std::fs::read(tests::component_path()).expect("component");
    let n: usize = std::env::var("BENCH_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(3000);
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();

    let native = Native(backend.clone());
    let reply = guest::verb::handle(&native, "mesh-provisioner.provisioning", QUERY, 1 << 20);
    assert_eq!(reply.code, guest::verb::Code::Ok);
    let mut native_times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = guest::verb::handle(&native, "mesh-provisioner.provisioning", QUERY, 1 << 20);
        native_times.push(t.elapsed());
        std::hint::black_box(r);
    }
    let native_p50 = median(native_times);
    println!("needs bucket: 10 000 keys; query returns 10 entries; {n} calls each");
    println!("{:<44} {:>10.1} µs   1.00×", "native logic (baseline)", native_p50.as_secs_f64() * 1e6);

    for (name, options) in [
        ("wasm, fresh instance per call", EngineOptions { pooling: false, reuse: 1, reply_cache: false, ..Default::default() }),
        ("wasm, fresh instance, pooling allocator", EngineOptions { pooling: true, reuse: 1, reply_cache: false, ..Default::default() }),
        ("wasm, instance reused (≤64 calls)", EngineOptions { pooling: false, reuse: 64, reply_cache: false, ..Default::default() }),
        ("wasm, instance reused as served (default options, no cache)", EngineOptions { reply_cache: false, ..Default::default() }),
        ("wasm, reused, reply cache (a repeated request)", EngineOptions { pooling: false, reuse: 64, reply_cache: true, ..Default::default() }),
        ("wasm, reused, pooling allocator", EngineOptions { pooling: true, reuse: 64, reply_cache: false, ..Default::default() }),
    ] {
        if !name.contains(only.as_str()) {
            continue;
        }
        let runtime = Runtime::with_options(options).expect("runtime");
        let guest = runtime.load(&bytes, None).expect("compile");
        let times = samples(&rt, n, || {
            let (guest, b) = (guest.clone(), backend.clone());
            async move {
                let r = guest.handle(b, Limits::default(), "mesh-provisioner.provisioning", QUERY, 1 << 20).await.expect("call");
                assert_eq!(r.code, ReplyCode::Ok);
            }
        });
        let mean = times.iter().sum::<Duration>() / times.len().max(1) as u32;
        let p50 = median(times);
        let floor = timed(&rt, n, || {
            let (guest, b) = (guest.clone(), backend.clone());
            async move {
                guest.info(b, Limits::default()).await.expect("info");
            }
        });
        println!("{:<44} {:>10.1} µs   (an empty call: the floor)", format!("  {name}: info()"), floor.as_secs_f64() * 1e6);
        println!("{:<44} {:>10.1} MiB", format!("  {name}: memory the kept instances hold"), runtime.budget().used() as f64 / (1 << 20) as f64);
        println!(
            "{name:<44} {:>10.1} µs {:>6.2}×   (mean {:.1} µs: instances made and dropped included)",
            p50.as_secs_f64() * 1e6,
            p50.as_secs_f64() / native_p50.as_secs_f64(),
            mean.as_secs_f64() * 1e6
        );
    }

    // The call as the bus bench asks it, one request at a time between other processes' work:
    // each call after `BENCH_EVICT_MB` (8) MiB written elsewhere, past this machine's 2 MiB L2
    // (48: past its 32 MiB L3 too), against the same call back to back.
    if "cold".contains(only.as_str()) || only.is_empty() {
        let runtime = Runtime::with_options(EngineOptions { reply_cache: false, ..Default::default() }).expect("runtime");
        let guest = runtime.load(&bytes, None).expect("compile");
        let evict = std::env::var("BENCH_EVICT_MB").ok().and_then(|m| m.parse::<usize>().ok()).unwrap_or(8);
        let mut other = vec![0u8; evict << 20];
        // One write to each cache line of `other`.
        let mut elsewhere = || {
            for (i, b) in other.iter_mut().enumerate().step_by(64) {
                *b = b.wrapping_add(i as u8);
            }
            std::hint::black_box(&other);
        };
        let mut ask = |cold: bool| {
            if cold {
                elsewhere();
            }
            let (guest, b) = (guest.clone(), backend.clone());
            let t = Instant::now();
            rt.block_on(async move {
                let r = guest.handle(b, Limits::default(), "mesh-provisioner.provisioning", QUERY, 1 << 20).await.expect("call");
                assert_eq!(r.code, ReplyCode::Ok);
            });
            t.elapsed()
        };
        let warm = median((0..n).map(|_| ask(false)).collect());
        let cold = median((0..n).map(|_| ask(true)).collect());
        // As a request finds it after the thread slept in between (the core idle or running
        // another process meanwhile), with nothing written.
        let idle = median(
            (0..n)
                .map(|_| {
                    std::thread::sleep(Duration::from_micros(100));
                    ask(false)
                })
                .collect(),
        );
        // The same logic natively, each call after `before`: what of the cost is the logic's.
        let native_after = |before: &mut dyn FnMut()| {
            median(
                (0..n)
                    .map(|_| {
                        before();
                        let t = Instant::now();
                        std::hint::black_box(guest::verb::handle(&native, "mesh-provisioner.provisioning", QUERY, 1 << 20));
                        t.elapsed()
                    })
                    .collect(),
            )
        };
        let native_idle = native_after(&mut || std::thread::sleep(Duration::from_micros(100)));
        println!(
            "the query, 10 entries, after the thread slept 100 µs {:>6.1} µs = {:.2}× back to back; natively {:.1} µs = {:.2}× its back to back",
            idle.as_secs_f64() * 1e6,
            idle.as_secs_f64() / warm.as_secs_f64(),
            native_idle.as_secs_f64() * 1e6,
            native_idle.as_secs_f64() / native_p50.as_secs_f64()
        );
        let native_cold = native_after(&mut elsewhere);
        println!(
            "the query, 10 entries, after {evict} MiB written elsewhere {:>6.1} µs = {:.2}× back to back ({:.1} µs); natively {:.1} µs = {:.2}× its back to back",
            cold.as_secs_f64() * 1e6,
            cold.as_secs_f64() / warm.as_secs_f64(),
            warm.as_secs_f64() * 1e6,
            native_cold.as_secs_f64() * 1e6,
            native_cold.as_secs_f64() / native_p50.as_secs_f64()
        );
    }

    // Where a call's time goes, on an instance as served: the call alone (a request refused
    // before any read), the two reads with nothing found (the same query over an empty bucket),
    // the whole query; each the guest's logic natively beside it.
    if "breakdown".contains(only.as_str()) || only.is_empty() {
        let runtime = Runtime::with_options(EngineOptions { reply_cache: false, ..Default::default() }).expect("runtime");
        let guest = runtime.load(&bytes, None).expect("compile");
        let empty = MemoryBackend::new();
        const REFUSED: &[u8] = br#"{"what":"needs","node":"-"}"#;
        let ask = |b: &std::sync::Arc<MemoryBackend>, body: &'static [u8], code: ReplyCode| {
            let (guest, b) = (guest.clone(), b.clone());
            async move {
                let r = guest.handle(b, Limits::default(), "mesh-provisioner.provisioning", body, 1 << 20).await.expect("call");
                assert_eq!(r.code, code);
            }
        };
        let info = timed(&rt, n, || {
            let (guest, b) = (guest.clone(), backend.clone());
            async move {
                guest.info(b, Limits::default()).await.expect("info");
            }
        });
        let refused = timed(&rt, n, || ask(&backend, REFUSED, ReplyCode::BadRequest));
        let nothing = timed(&rt, n, || ask(&empty, QUERY, ReplyCode::Ok));
        let whole = timed(&rt, n, || ask(&backend, QUERY, ReplyCode::Ok));
        let native = |b: &std::sync::Arc<MemoryBackend>, body: &[u8]| {
            let native = Native(b.clone());
            let mut times = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                std::hint::black_box(guest::verb::handle(&native, "mesh-provisioner.provisioning", body, 1 << 20));
                times.push(t.elapsed());
            }
            median(times)
        };
        let (n_refused, n_nothing, n_whole) = (native(&backend, REFUSED), native(&empty, QUERY), native(&backend, QUERY));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!("where an uncached call's time goes (instance as served; the guest's logic natively beside each):");
        println!("  an empty call (info)                          {:>6.1} µs", us(info));
        println!("  a request refused before any read             {:>6.1} µs   (native {:.1} µs)", us(refused), us(n_refused));
        println!("  the query over an empty bucket (two reads)    {:>6.1} µs   (native {:.1} µs)", us(nothing), us(n_nothing));
        println!("  the query, 10 entries                         {:>6.1} µs   (native {:.1} µs)", us(whole), us(n_whole));
        println!(
            "  so: the call {:.1} µs, the two reads {:.1} µs, ten entries read and written {:.1} µs (of which the logic natively {:.1} µs)",
            us(refused),
            us(nothing.saturating_sub(refused)),
            us(whole.saturating_sub(nothing)),
            us(n_whole.saturating_sub(n_nothing))
        );
    }
}
