//! The HTTP side, on when `--http <addr>` is given (and on a free loopback port under `--demo`):
//! `/healthz` and `/readyz` for probes and load balancers, `/metrics` in the Prometheus text
//! format, and `/` — a status page of the mesh, fed by `/api/status`.
//!
//! Served by axum on the process's runtime. It only reads: readiness from the connection, the
//! mirrors and the seat; the mesh's status by asking the guest the `status` question a node
//! would ask the verb (every page), so the page shows exactly what the verb says — keys, places,
//! states and revisions, never a value from a bucket. A status read is shared by every request
//! within [`SNAPSHOT_FOR`], so a wall of open browsers costs one guest read per interval.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::current::Current;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{Limits, ReplyCode};
use crate::seat::Seat;

/// How long one read of the mesh's status is reused.
const SNAPSHOT_FOR: Duration = Duration::from_secs(2);
/// Most status pages one read follows (1 000 modules a page).
const MAX_PAGES: usize = 200;
/// The reply budget of a status page read for the page (a NATS reply is no bigger).
const PAGE_BUDGET: u32 = 1 << 20;

/// What the HTTP side reads.
pub struct Http {
    pub client: async_nats::Client,
    pub backend: Arc<dyn Backend>,
    pub current: Arc<Current>,
    pub seat: Arc<Seat>,
    pub limits: Limits,
    snapshot: tokio::sync::Mutex<Option<(Instant, Arc<Value>)>>,
}

impl Http {
    pub fn new(client: async_nats::Client, backend: Arc<dyn Backend>, current: Arc<Current>, seat: Arc<Seat>, limits: Limits) -> Arc<Http> {
        Arc::new(Http { client, backend, current, seat, limits, snapshot: Default::default() })
    }
}

/// Binds `addr` (an error names it when it cannot), so a bad address stops the start, not a
/// task later.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::new(ErrorKind::Config, format!("--http {addr}: {e}")))?;
    let bound: SocketAddr = listener.local_addr().map_err(|e| Error::new(ErrorKind::Config, format!("--http {addr}: {e}")))?;
    tracing::info!(url = %format!("http://{bound}/"), "HTTP: status page, /healthz, /readyz, /metrics");
    Ok(listener)
}

/// Serves until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, http: Arc<Http>) {
    crate::metrics::metrics().record();
    let app = Router::new()
        .route("/", get(page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/status", get(status))
        .with_state(http);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!("the HTTP server stopped: {e}");
    }
}

/// `200` with the role (`holder` or `standby`) when the component is loaded, the connection up
/// and the warm mirrors in sync; `503` with what is missing otherwise.
async fn readyz(State(h): State<Arc<Http>>) -> Response {
    let connected = h.client.connection_state() == async_nats::connection::State::Connected;
    let mirrors = h.backend.mirrors();
    let behind: Vec<&str> = crate::nats::WARM_BUCKETS.iter().copied().filter(|b| !mirrors.iter().any(|(name, m)| name == b && m.is_ready())).collect();
    let loaded = h.current.get();
    // A bucket refused (not a bucket's stream; past the memory budget) and a stream capturing
    // the provisioner's subjects are each a reason not to be ready: said, with what to do.
    let refused: Vec<Value> = mirrors.iter().filter_map(|(b, m)| m.refused().map(|why| json!({"bucket": b, "reason": why}))).collect();
    let captures: Vec<Value> = h
        .backend
        .captured()
        .into_iter()
        .map(|(stream, subject)| json!({"stream": stream, "subject": subject, "reason": format!("stream {stream} captures subjects of {subject}: requesters get its acknowledgements instead of answers; delete it")}))
        .collect();
    let ready = connected && behind.is_empty() && refused.is_empty() && captures.is_empty();
    let body = json!({
        "ready": ready,
        "role": role(&h.seat),
        "instance": h.seat.instance(),
        "connected": connected,
        "mirrors_behind": behind,
        "buckets_refused": refused,
        "streams_capturing": captures,
        "component": {"version": loaded.info.version, "digest": loaded.guest.digest()},
    });
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The Prometheus text format; the gauges that describe state are read now.
async fn metrics(State(h): State<Arc<Http>>) -> Response {
    let started = Instant::now();
    let m = crate::metrics::metrics();
    m.seat_holder.set(i64::from(h.seat.is_held()));
    for (bucket, mirror) in h.backend.mirrors() {
        let label = crate::metrics::Bucket { bucket };
        m.mirror_keys.get_or_create(&label).set(mirror.len() as i64);
        m.mirror_bytes.get_or_create(&label).set(mirror.bytes() as i64);
        m.mirror_lag.get_or_create(&label).set(mirror.lag() as i64);
        m.mirror_in_sync.get_or_create(&label).set(i64::from(mirror.is_ready()));
        let health = mirror.health();
        m.bucket_refused.get_or_create(&label).set(i64::from(health.refused.is_some()));
        m.bucket_unsafe.get_or_create(&label).set(health.unsafe_settings.len() as i64);
    }
    m.writer_keys.clear();
    m.writer_bytes.clear();
    let quota = h.backend.quota();
    for (bucket, mirror) in h.backend.mirrors() {
        for w in mirror.writers_over(quota) {
            let label = crate::metrics::BucketWriter { bucket: bucket.clone(), writer: w.writer };
            m.writer_keys.get_or_create(&label).set(w.keys as i64);
            m.writer_bytes.get_or_create(&label).set(w.bytes as i64);
        }
    }
    m.stream_captures.clear();
    for (stream, subject) in h.backend.captured() {
        m.stream_captures.get_or_create(&crate::metrics::Stream { stream, subject }).set(1);
    }
    m.mirrors_bytes.set(crate::mirror::total_bytes() as i64);
    // Module states come from the shared status read (at most one guest read per
    // SNAPSHOT_FOR, however often Prometheus scrapes).
    if let Ok(s) = snapshot(&h).await {
        m.modules.clear();
        for e in s["entries"].as_array().into_iter().flatten() {
            if let Some(state) = e["state"].as_str() {
                m.modules.get_or_create(&crate::metrics::State { state: state.to_string() }).inc();
            }
        }
    }
    m.scrape_seconds.set(started.elapsed().as_secs_f64());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], m.encode()).into_response()
}

/// The mesh's status as the page shows it: every module (up to [`MAX_PAGES`] pages) with its
/// needs, and when it was read.
async fn status(State(h): State<Arc<Http>>) -> Response {
    match snapshot(&h).await {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s.to_string()).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "application/json")], json!({"error": e.message()}).to_string()).into_response(),
    }
}

/// Reads every page of `{"what":"status"}` from the guest, or reuses a read younger than
/// [`SNAPSHOT_FOR`].
async fn snapshot(h: &Http) -> Result<Arc<Value>> {
    let mut cached = h.snapshot.lock().await;
    if let Some((at, s)) = cached.as_ref() {
        if at.elapsed() < SNAPSHOT_FOR {
            return Ok(s.clone());
        }
    }
    let loaded = h.current.get();
    let (mut entries, mut after, mut complete) = (Vec::new(), None::<String>, false);
    for _ in 0..MAX_PAGES {
        let mut q = json!({"what": "status", "limit": 1000});
        if let Some(a) = &after {
            q["after"] = json!(a);
        }
        let reply = loaded.guest.handle(h.backend.clone(), h.limits, crate::service::PROVISIONING, q.to_string().as_bytes(), PAGE_BUDGET).await?;
        let page: Value = serde_json::from_slice(&reply.body).map_err(|e| Error::new(ErrorKind::Guest, format!("a status page that is not JSON: {e}")))?;
        if reply.code != ReplyCode::Ok {
            let why = page["error"]["message"].as_str().unwrap_or("the status read failed").to_string();
            return Err(Error::new(ErrorKind::Unavailable, why));
        }
        if let Value::Array(list) = &page["entries"] {
            entries.extend(list.iter().cloned());
        }
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => {
                complete = true;
                break;
            }
        }
    }
    let s = Arc::new(json!({
        "entries": entries,
        "complete": complete,
        "role": role(&h.seat),
        "instance": h.seat.instance(),
        "read_at": crate::service::rfc3339(std::time::SystemTime::now()),
    }));
    *cached = Some((Instant::now(), s.clone()));
    Ok(s)
}

fn role(seat: &Seat) -> &'static str {
    if seat.is_held() {
        "holder"
    } else {
        "standby"
    }
}

async fn page() -> Html<&'static str> {
    Html(include_str!("status_page.html"))
}
