//! The HTTP side, on when `--http <addr>` is given (and on a free loopback port under `--demo`):
//! `/healthz` and `/readyz` for probes and load balancers, `/metrics` in the Prometheus text
//! format, and `/` — a status page of the mesh, fed by `/api/status` and kept current by
//! `/api/events`: the module state changes this instance tells while it holds the seat, handed
//! over in process (`feed`; a standby's page has none) and forwarded to each page as
//! server-sent events. Nothing published on the bus reaches a page.
//!
//! Served by axum's router on the followers' thread ([`followers`](crate::serve::followers)),
//! never the verbs' (a page writes a hundred thousand modules' states, a scrape reads their
//! tally); `/healthz` answers for the verbs' thread by its [`Beat`],
//! through an accept loop of its own (as an exporter on a shared host is): only the `Host` names the operator allows are answered (others
//! `421`: no DNS rebinding reads the status), a connection that does not send its headers within
//! `--http-header-timeout` is closed, a request that takes longer than `--http-request-timeout`
//! is answered `503`, and past `--http-max-connections` a new connection is closed at once.
//!
//! Probes always answer: past the cap, [`PROBE_RESERVE`] more connections are taken that serve
//! only `/healthz`, `/readyz` and `/metrics` (anything else `503`), and `--http-probes <addr>`
//! gives them a listener no other client reaches. Event streams hold at most half the
//! connections, [`EVENT_STREAMS_PER_PEER`] from one address, each for at most
//! [`EVENT_STREAM_LIFETIME`] (the page's `EventSource` follows again by itself).
//!
//! It only reads: readiness from the connection, the mirrors and the seat; the mesh's status by
//! asking the guest the `status` question a node would ask the verb (every page), so the page
//! shows exactly what the verb says — keys, places, states and revisions, never a value from a
//! bucket. That status read runs off the request path: one refresh at a time, in a task of its
//! own, and every reader gets the last one read (refreshed when older than [`SNAPSHOT_FOR`]),
//! so a slow guest never holds a lock a request waits on and a wall of open browsers costs one
//! guest read per interval.

use crate::base::sync::Locked;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::seat::Seat;
use crate::runtime::ReplyCode;

/// How long one read of the mesh's status is reused.
const SNAPSHOT_FOR: Duration = Duration::from_secs(2);
/// Most modules one status read shows.
const MAX_MODULES: usize = 200_000;
/// Most modules of one node a status read shows, unless told otherwise
/// (`--status-page-per-node`): one node with more never pushes the others off the page or the
/// metrics.
pub const PER_NODE: usize = 10_000;
/// Modules asked a guest call: small enough that a verb served between two calls waits little
/// (a call renders each module whole).
const PAGE_MODULES: usize = 100;
/// After each call, the read waits as long as the call took: a long read (100 000 modules)
/// takes at most half the followers' thread from the plans and states beside it.
const READ_YIELD: u32 = 1;
/// A read is reused this many times as long as it took: at half the thread while it reads
/// ([`READ_YIELD`]), scrapes of a hundred thousand modules cost a tenth of it, not half.
const REUSE_FOR: u32 = 5;
/// The reply budget of a status page read for the page (a NATS reply is no bigger).
const PAGE_BUDGET: u32 = 1 << 20;

/// Most causes the page shows above the grid.
const TOP_CAUSES: usize = 5;

/// How long a reader with no status read yet waits for the first.
const FIRST_READ: Duration = Duration::from_secs(10);
/// The longest a connection is kept, however it is used.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);
/// Connections past the cap that serve only the probes and the metrics.
pub const PROBE_RESERVE: usize = 16;
/// Event streams open at once from one address.
pub const EVENT_STREAMS_PER_PEER: usize = 8;
/// The longest one event stream is followed.
pub const EVENT_STREAM_LIFETIME: Duration = Duration::from_secs(120);

/// How the HTTP side guards itself.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The `Host` names answered (lower case, without a port).
    pub allowed_hosts: Vec<String>,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_connections: usize,
}

impl HttpOptions {
    /// The options the flags give; the allowed hosts default to the bound address and the
    /// loopback names.
    pub fn new(bound: SocketAddr, allow: &[String], header_timeout: Duration, request_timeout: Duration, max_connections: usize) -> HttpOptions {
        let allowed_hosts = if allow.is_empty() {
            let mut names: Vec<String> = Vec::new();
            for n in [host_name(&bound.ip().to_string()), "localhost".into(), "127.0.0.1".into(), "[::1]".into()] {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
            names
        } else {
            allow.iter().map(|h| host_name(strip_port(h))).collect()
        };
        HttpOptions { allowed_hosts, header_timeout, request_timeout, max_connections: max_connections.max(1) }
    }
}

/// A host as a `Host` header names it: lower case, an IPv6 address in brackets.
fn host_name(h: &str) -> String {
    let h = h.to_ascii_lowercase();
    if h.contains(':') && !h.starts_with('[') {
        format!("[{h}]")
    } else {
        h
    }
}

/// A `Host` header's name without its port (`[::1]:9480` → `[::1]`).
fn strip_port(host: &str) -> &str {
    if let Some(end) = host.strip_prefix('[').and_then(|_| host.find(']')) {
        return &host[..=end];
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

/// One status read: as the metrics read it, and as `/api/status` serves it (its JSON text,
/// made once, off the runtime's thread).
struct StatusRead {
    value: Arc<Value>,
    text: bytes::Bytes,
    /// How long the read took: it is reused [`REUSE_FOR`] times as long (a read of a big mesh
    /// is never started again at once, and reads take at most a tenth of the one thread).
    took: Duration,
    /// The modules by state, tallied once a read (a scrape sets gauges from this, not from
    /// every module).
    states: Vec<StateTally>,
}

/// The modules of one state in a status read, and the earliest time one of them entered it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StateTally {
    state: String,
    modules: i64,
    earliest: Option<time::OffsetDateTime>,
}

/// The modules of a status read (its `entries`) by state, in the order states are first seen.
fn tally(status: &Value) -> Vec<StateTally> {
    let mut tallies: Vec<StateTally> = Vec::new();
    for e in status["entries"].as_array().into_iter().flatten() {
        let Some(state) = e["state"].as_str() else { continue };
        // How long a module has been in its state, for an alert on one stuck (blocked for an
        // hour) that a count by state cannot tell from a new one.
        let since = e["since"].as_str().and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok());
        let at = match tallies.iter().position(|t| t.state == state) {
            Some(at) => at,
            None => {
                tallies.push(StateTally { state: state.to_string(), modules: 0, earliest: None });
                tallies.len() - 1
            }
        };
        let Some(t) = tallies.get_mut(at) else { continue };
        t.modules += 1;
        if let Some(since) = since {
            t.earliest = Some(t.earliest.map_or(since, |e| e.min(since)));
        }
    }
    tallies
}

/// The status last read and when, and why the last read failed (if it did).
type Last = (Option<(Instant, Arc<StatusRead>)>, Option<String>);

/// The status last read, and the one refresh running.
#[derive(Default)]
struct Snapshot {
    last: std::sync::Mutex<Last>,
    refreshing: std::sync::atomic::AtomicBool,
    refreshed: tokio::sync::Notify,
}

/// What the HTTP side reads.
pub struct Http {
    pub shared: crate::serve::shared::Shared,
    /// The verbs' thread's last sign of life, for `/healthz` (answered on another thread).
    pub beat: Beat,
    snapshot: Snapshot,
    /// Most modules of one node a status read shows.
    per_node: usize,
}

impl Http {
    pub fn new(shared: crate::serve::shared::Shared, per_node: usize) -> Arc<Http> {
        Arc::new(Http { shared, beat: Beat::new(), snapshot: Snapshot::default(), per_node: per_node.max(1) })
    }
}

/// How often the verbs' thread stamps its [`Beat`].
pub const BEAT: Duration = Duration::from_secs(1);
/// How long the verbs' thread may go without stamping before `/healthz` says it is stuck: a
/// guest call yields every epoch tick, so nothing legitimate holds the thread for seconds.
const STUCK: Duration = Duration::from_secs(15);

/// When a task on the verbs' thread last ran ([`Beat::stamp`], every [`BEAT`]).
pub struct Beat {
    since: Instant,
    /// Milliseconds after `since`.
    last: std::sync::atomic::AtomicU64,
}

impl Beat {
    fn new() -> Beat {
        Beat { since: Instant::now(), last: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Says the stamping thread ran now.
    pub fn stamp(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Why the stamping thread looks stuck at `now`, if it does.
    fn stuck_at(&self, now: Instant) -> Option<String> {
        let last = self.since + Duration::from_millis(self.last.load(std::sync::atomic::Ordering::Relaxed));
        let quiet = now.saturating_duration_since(last);
        (quiet > STUCK).then(|| format!("the thread serving the verbs has not run for {} s\n", quiet.as_secs()))
    }
}

/// Stamps `h`'s beat every [`BEAT`], on the thread it is spawned on (the verbs').
pub async fn beat(h: Arc<Http>) {
    loop {
        h.beat.stamp();
        tokio::time::sleep(BEAT).await;
    }
}

/// `200 ok` while the verbs' thread runs; `503` with how long it has not.
async fn healthz(State(h): State<Arc<Http>>) -> Response {
    match h.beat.stuck_at(Instant::now()) {
        None => "ok\n".into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

/// The event streams open: in all and from each address.
struct EventStreams {
    most: usize,
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One event stream counted while it is followed.
struct StreamSlot {
    streams: Arc<EventStreams>,
    peer: std::net::IpAddr,
}

impl EventStreams {
    fn new(max_connections: usize) -> Arc<EventStreams> {
        Arc::new(EventStreams { most: (max_connections / 2).max(1), open: Default::default() })
    }

    /// A slot for one more stream from `peer`, or why not.
    fn take(self: &Arc<Self>, peer: std::net::IpAddr) -> std::result::Result<StreamSlot, String> {
        let mut open = self.open.locked();
        let total: usize = open.values().sum();
        if total >= self.most {
            return Err(format!("{total} event streams are open, the most this server follows (half of --http-max-connections)"));
        }
        let mine = open.entry(peer).or_default();
        if *mine >= EVENT_STREAMS_PER_PEER {
            return Err(format!("{EVENT_STREAMS_PER_PEER} event streams are open from this address, the most one address may follow"));
        }
        *mine += 1;
        Ok(StreamSlot { streams: self.clone(), peer })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.open.locked();
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// `/api/events`: each state change this instance tells as a server-sent event (`state`), and
/// `resync` when this page fell behind and should read `/api/status` again (`feed`). Ends
/// after [`EVENT_STREAM_LIFETIME`]; refused (`503`) past the streams' caps.
async fn events(
    State(h): State<Arc<Http>>,
    axum::Extension(streams): axum::Extension<Arc<EventStreams>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
) -> Response {
    use crate::serve::feed::Told;
    use axum::response::sse::{Event, KeepAlive, Sse};
    let slot = match streams.take(peer.ip()) {
        Ok(slot) => slot,
        Err(why) => return (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "10")], format!("{why}\n")).into_response(),
    };
    let until = tokio::time::Instant::now() + EVENT_STREAM_LIFETIME;
    let receiver = h.shared.feed.follow();
    let stream = futures::stream::unfold((receiver, slot), move |(mut r, slot)| async move {
        let event = match tokio::time::timeout_at(until, r.recv()).await {
            Ok(Ok(Told::State(line))) => Event::default().event("state").data(&*line),
            Ok(Ok(Told::Resync) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => Event::default().event("resync").data(""),
            Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) | Err(_) => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(event), (r, slot)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// Binds `addr` (an error names it when it cannot), so a bad address stops the start, not a
/// task later.
/// The listener is handed over as a std one (non-blocking, registered with no runtime): it is
/// served on the followers' thread, never the verbs'.
pub async fn bind(addr: &str, serves: &str) -> Result<std::net::TcpListener> {
    let failed = |e: std::io::Error| Error::new(ErrorKind::Config, format!("--http {addr}: {e}"));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
    let bound: SocketAddr = listener.local_addr().map_err(failed)?;
    tracing::info!(url = %format!("http://{bound}/"), "HTTP: {serves}");
    listener.into_std().map_err(failed)
}

/// The routes a connection in the probes' reserve (or on their own listener) is answered.
fn probe_routes(http: Arc<Http>, options: &Arc<HttpOptions>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "5")], "every connection is taken: this one answers only /healthz, /readyz and /metrics\n")
        })
        .with_state(http)
        .layer(axum::middleware::from_fn_with_state(options.clone(), guard))
}

/// Serves until the task is aborted: each connection accepted within the cap (past it, within
/// the probes' reserve, for the probes only), served by hyper with a header-read timeout, every
/// request checked for its `Host` and bounded in time.
pub async fn serve(listener: tokio::net::TcpListener, http: Arc<Http>, options: HttpOptions) {
    let options = Arc::new(options);
    let app = Router::new()
        .route("/", get(page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/status", get(status))
        .route("/api/events", get(events))
        .with_state(http.clone())
        .layer(axum::Extension(EventStreams::new(options.max_connections)))
        .layer(axum::middleware::from_fn_with_state(options.clone(), guard));
    let probes = probe_routes(http, &options);
    let connections = Arc::new(tokio::sync::Semaphore::new(options.max_connections));
    let reserve = Arc::new(tokio::sync::Semaphore::new(PROBE_RESERVE));
    accept(listener, &options, |_| {
        connections.clone().try_acquire_owned().ok().map(|p| (p, app.clone())).or_else(|| reserve.clone().try_acquire_owned().ok().map(|p| (p, probes.clone())))
    })
    .await
}

/// Serves only `/healthz`, `/readyz` and `/metrics` on a listener of their own
/// (`--http-probes`), [`PROBE_RESERVE`] connections at once.
pub async fn serve_probes(listener: tokio::net::TcpListener, http: Arc<Http>, options: HttpOptions) {
    let options = Arc::new(options);
    let probes = probe_routes(http, &options);
    let connections = Arc::new(tokio::sync::Semaphore::new(PROBE_RESERVE));
    accept(listener, &options, |_| connections.clone().try_acquire_owned().ok().map(|p| (p, probes.clone()))).await
}

/// A listener [`bind`] made, registered with the runtime of `on` (the followers'): the HTTP side
/// is served there, never on the verbs' thread.
pub fn listen(listener: std::net::TcpListener, on: &tokio::runtime::Handle) -> Result<tokio::net::TcpListener> {
    let _entered = on.enter();
    tokio::net::TcpListener::from_std(listener).map_err(|e| Error::new(ErrorKind::Config, format!("the HTTP side cannot listen: {e}")))
}

/// The accept loop: `admit` gives each connection its permit and its routes, or refuses it
/// (closed at once, costing nothing held).
async fn accept(listener: tokio::net::TcpListener, options: &HttpOptions, admit: impl Fn(SocketAddr) -> Option<(tokio::sync::OwnedSemaphorePermit, Router)>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!("the HTTP side could not accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((permit, routes)) = admit(peer) else {
            crate::base::metrics::metrics().http_refused.inc();
            drop(stream);
            continue;
        };
        let routes = routes.layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        let service = hyper_util::service::TowerToHyperService::new(routes);
        let header_timeout = options.header_timeout;
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(permit);
        });
    }
}

/// Answers only the `Host` names allowed (`421` otherwise), each request within its time.
async fn guard(State(options): State<Arc<HttpOptions>>, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(|h| host_name(strip_port(h)));
    if !host.as_ref().is_some_and(|h| options.allowed_hosts.contains(h)) {
        let shown: String = host.unwrap_or_default().chars().take(100).collect();
        return (StatusCode::MISDIRECTED_REQUEST, format!("this server does not answer for host {shown:?} (--http-allow-host)\n")).into_response();
    }
    match tokio::time::timeout(options.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the request took longer than --http-request-timeout\n").into_response(),
    }
}

/// `200` with the role (`holder` or `standby`) when the component is loaded, the connection up
/// and the warm mirrors in sync; `503` with what is missing otherwise.
async fn readyz(State(h): State<Arc<Http>>) -> Response {
    let connected = h.shared.client.connection_state() == async_nats::connection::State::Connected;
    let mirrors = h.shared.backend.mirrors();
    let behind: Vec<&str> = crate::nats::WARM_BUCKETS.iter().copied().filter(|b| !mirrors.iter().any(|(name, m)| name == b && m.is_ready())).collect();
    let loaded = h.shared.current.get();
    // A bucket refused (not a bucket's stream; past the memory budget) and a stream capturing
    // the provisioner's subjects are each a reason not to be ready: said, with what to do.
    let refused: Vec<Value> = mirrors.iter().filter_map(|(b, m)| m.refused().map(|why| json!({"bucket": b, "reason": why}))).collect();
    let captures: Vec<Value> = h
        .shared
        .backend
        .captured()
        .into_iter()
        .map(|(stream, subject)| json!({"stream": stream, "subject": subject, "reason": format!("stream {stream} captures subjects of {subject}: requesters get its acknowledgements instead of answers; delete it")}))
        .collect();
    let ready = connected && behind.is_empty() && refused.is_empty() && captures.is_empty();
    let body = json!({
        "ready": ready,
        "role": role(&h.shared.seat),
        "instance": h.shared.seat.instance(),
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
    let m = crate::base::metrics::metrics();
    m.seat_holder.set(i64::from(h.shared.seat.is_held()));
    for (bucket, mirror) in h.shared.backend.mirrors() {
        let label = crate::base::metrics::Bucket { bucket: bucket.into() };
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
    let quota = h.shared.backend.quota();
    for (bucket, mirror) in h.shared.backend.mirrors() {
        for w in mirror.writers_over(quota) {
            let label = crate::base::metrics::BucketWriter { bucket: bucket.as_str().into(), writer: w.writer.into() };
            m.writer_keys.get_or_create(&label).set(w.keys as i64);
            m.writer_bytes.get_or_create(&label).set(w.bytes as i64);
        }
    }
    m.stream_captures.clear();
    for (stream, subject) in h.shared.backend.captured() {
        m.stream_captures.get_or_create(&crate::base::metrics::StreamLabel { stream: stream.into(), subject: subject.into() }).set(1);
    }
    m.mirrors_bytes.set(crate::store::mirror::total_bytes() as i64);
    let budget = h.shared.current.get().guest.budget().clone();
    m.guest_memory.set(budget.used() as i64);
    m.guest_memory_budget.set(budget.total() as i64);
    // Module states come from the shared status read (at most one guest read per
    // SNAPSHOT_FOR, however often Prometheus scrapes).
    if let Ok(read) = snapshot(&h).await {
        m.status_nodes_cut.set(read.value["cut"].as_array().map_or(0, Vec::len) as i64);
        m.modules.clear();
        m.modules_oldest.clear();
        let now = time::OffsetDateTime::now_utc();
        for t in &read.states {
            let label = crate::base::metrics::StateLabel { state: t.state.clone() };
            m.modules.get_or_create(&label).set(t.modules);
            if let Some(earliest) = t.earliest {
                m.modules_oldest.get_or_create(&label).set((now - earliest).whole_seconds().max(0));
            }
        }
    }
    m.scrape_seconds.set(started.elapsed().as_secs_f64());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], m.encode()).into_response()
}

/// The mesh's status as the page shows it: every node's modules (up to `per_node` a node,
/// [`MAX_MODULES`] in all) with their needs, and when it was read.
async fn status(State(h): State<Arc<Http>>) -> Response {
    match snapshot(&h).await {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s.text.clone()).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "application/json")], json!({"error": e.message()}).to_string()).into_response(),
    }
}

/// The mesh's status as last read, never waiting on a guest call: a read older than
/// [`SNAPSHOT_FOR`] is handed out while one refresh runs in a task of its own. Only a reader
/// that finds no read at all waits (bounded) for the first.
async fn snapshot(h: &Arc<Http>) -> Result<Arc<StatusRead>> {
    let waited = h.snapshot.refreshed.notified();
    tokio::pin!(waited);
    waited.as_mut().enable();
    let last = h.snapshot.last.locked().0.clone();
    match last {
        Some((at, s)) => {
            if at.elapsed() >= SNAPSHOT_FOR.max(s.took * REUSE_FOR) {
                refresh(h);
            }
            return Ok(s);
        }
        None => refresh(h),
    }
    let _ = tokio::time::timeout(FIRST_READ, waited).await;
    let last = h.snapshot.last.locked().clone();
    match last {
        (Some((_, s)), _) => Ok(s),
        (None, Some(why)) => Err(Error::new(ErrorKind::Unavailable, why)),
        (None, None) => Err(Error::new(ErrorKind::Timeout, format!("no status read within {FIRST_READ:?}"))),
    }
}

/// Starts a refresh of the status unless one runs.
fn refresh(h: &Arc<Http>) {
    if h.snapshot.refreshing.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let h = h.clone();
    // On the HTTP side's thread, the followers' (at 100 000 modules a read is a hundred guest
    // calls of milliseconds).
    tokio::spawn(async move {
        let started = Instant::now();
        let read = match read_status(&h).await {
            Ok(value) => {
                let took = started.elapsed();
                let made = value.clone();
                tokio::task::spawn_blocking(move || serde_json::to_vec(&*made).map(|text| (text, tally(&made))))
                    .await
                    .map_err(|e| Error::new(ErrorKind::Unavailable, format!("writing the status: {e}")))
                    .and_then(|text| text.map_err(|e| Error::new(ErrorKind::Guest, format!("writing the status: {e}"))))
                    .map(|(text, states)| Arc::new(StatusRead { value, text: text.into(), took, states }))
            }
            Err(e) => Err(e),
        };
        {
            let mut last = h.snapshot.last.locked();
            match read {
                Ok(s) => *last = (Some((Instant::now(), s)), None),
                Err(e) => last.1 = Some(e.message().to_string()),
            }
        }
        h.snapshot.refreshing.store(false, std::sync::atomic::Ordering::Release);
        h.snapshot.refreshed.notify_waiters();
    });
}

/// Reads `{"what":"status"}` from the guest, page by page: at most `per_node` modules of
/// each node (past it the rest of the node is skipped, `after_node`, and the node named in
/// `cut`) and [`MAX_MODULES`] in all.
async fn read_status(h: &Http) -> Result<Arc<Value>> {
    let loaded = h.shared.current.get();
    let (mut entries, mut complete) = (Vec::new(), false);
    let (mut from, mut last_next) = (json!({}), None::<String>);
    // Whether the component takes `after_node` (one from before it reads the rest of a node
    // and the page shows none of it).
    let mut jumps = true;
    let mut shown: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut cut: Vec<Value> = Vec::new();
    while entries.len() < MAX_MODULES {
        let mut q = json!({"what": "status", "limit": PAGE_MODULES});
        if let (Value::Object(q), Value::Object(from)) = (&mut q, &from) {
            q.extend(from.clone());
        }
        let called = Instant::now();
        let reply =
            loaded.guest.handle(h.shared.backend.clone(), h.shared.limits, crate::base::wire::PROVISIONING, q.to_string().as_bytes(), PAGE_BUDGET).await?;
        tokio::time::sleep(called.elapsed() * READ_YIELD).await;
        if reply.code == ReplyCode::BadRequest && jumps && from.get("after_node").is_some() {
            jumps = false;
            from = json!({"after": last_next});
            continue;
        }
        let page: Value = serde_json::from_slice(&reply.body).map_err(|e| Error::new(ErrorKind::Guest, format!("a status page that is not JSON: {e}")))?;
        if reply.code != ReplyCode::Ok {
            let why = page["error"]["message"].as_str().unwrap_or("the status read failed").to_string();
            return Err(Error::new(ErrorKind::Unavailable, why));
        }
        let mut full = None;
        for e in page["entries"].as_array().into_iter().flatten() {
            let node = e["node"].as_str().unwrap_or_default();
            let n = shown.entry(node.to_string()).or_default();
            if *n >= h.per_node {
                if full.as_deref() != Some(node) && !cut.iter().any(|c| c["node"] == node) {
                    cut.push(json!({"node": node, "shown": h.per_node}));
                }
                full = Some(node.to_string());
                continue;
            }
            *n += 1;
            full = None;
            entries.push(e.clone());
        }
        let Some(next) = page["next"].as_str() else {
            complete = true;
            break;
        };
        last_next = Some(next.to_string());
        // The page ended inside a node already shown in full: the next starts past it.
        from = match full {
            Some(node) if jumps => json!({"after_node": node}),
            _ => json!({"after": next}),
        };
    }
    // Causes that cannot be read now leave the grid as it is, and say why.
    let causes = read_causes(h).await.unwrap_or_else(|e| json!({"top": [], "known": true, "error": e.message()}));
    let s = Arc::new(json!({
        "entries": entries,
        "complete": complete,
        "causes": causes,
        "per_node": h.per_node,
        "cut": cut,
        "role": role(&h.shared.seat),
        "instance": h.shared.seat.instance(),
        "read_at": crate::base::wire::rfc3339(std::time::SystemTime::now()),
    }));
    Ok(s)
}

/// Reads `{"what":"causes"}` from the guest, every page up to [`MAX_MODULES`] modules
/// examined: the causes holding most modules first ([`TOP_CAUSES`] of them), how many modules
/// they hold of how many, and whether every module was examined.
async fn read_causes(h: &Http) -> Result<Value> {
    let loaded = h.shared.current.get();
    let mut merged = crate::base::causes::Merged::default();
    let mut q = json!({"what": "causes", "limit": PAGE_MODULES});
    let complete = loop {
        let called = Instant::now();
        let reply =
            loaded.guest.handle(h.shared.backend.clone(), h.shared.limits, crate::base::wire::PROVISIONING, q.to_string().as_bytes(), PAGE_BUDGET).await?;
        tokio::time::sleep(called.elapsed() * READ_YIELD).await;
        // A component from before `causes` says it does not know the question: the page then
        // shows none, as it did.
        if reply.code == ReplyCode::BadRequest {
            return Ok(json!({"top": [], "known": false}));
        }
        let page: Value = serde_json::from_slice(&reply.body).map_err(|e| Error::new(ErrorKind::Guest, format!("a causes page that is not JSON: {e}")))?;
        if reply.code != ReplyCode::Ok {
            let why = page["error"]["message"].as_str().unwrap_or("the causes read failed").to_string();
            return Err(Error::new(ErrorKind::Unavailable, why));
        }
        merged.add(&page);
        match page["next"].as_str() {
            Some(next) if (merged.examined as usize) < MAX_MODULES => q["after"] = json!(next),
            Some(_) => break false,
            None => break true,
        }
    };
    let mut merged = merged.sorted();
    let count = merged.causes.len();
    merged.causes.truncate(TOP_CAUSES);
    Ok(json!({"top": merged.causes, "count": count, "held": merged.held, "examined": merged.examined, "complete": complete, "known": true}))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_the_verbs_thread_is_stuck_only_past_the_limit() {
        let beat = Beat::new();
        beat.stamp();
        let now = Instant::now();
        assert_eq!(beat.stuck_at(now), None);
        assert_eq!(beat.stuck_at(now + STUCK / 2), None);
        let why = beat.stuck_at(now + STUCK + Duration::from_secs(5)).expect("stuck past the limit");
        assert!(why.starts_with("the thread serving the verbs has not run for 2"), "{why}");
        beat.stamp();
        assert_eq!(beat.stuck_at(Instant::now()), None, "a new stamp clears it");
    }

    #[test]
    fn tallies_modules_by_state_with_the_earliest_time_one_entered_it() {
        let status = json!({"entries": [
            {"state": "ready", "since": "2026-12-07T10:00:00Z"},
            {"state": "blocked", "since": "2026-12-07T09:00:00Z"},
            {"state": "ready", "since": "2026-12-07T08:30:00Z"},
            {"state": "ready", "since": "not a time"},
            {"state": "blocked"},
            {"since": "2026-12-07T07:00:00Z"},
        ]});
        let at = |t: &str| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok();
        assert_eq!(
            tally(&status),
            vec![
                StateTally { state: "ready".into(), modules: 3, earliest: at("2026-12-07T08:30:00Z") },
                StateTally { state: "blocked".into(), modules: 2, earliest: at("2026-12-07T09:00:00Z") },
            ]
        );
        assert_eq!(tally(&json!({"entries": []})), vec![]);
        assert_eq!(tally(&json!({})), vec![]);
    }

    #[test]
    fn reads_a_host_header_without_its_port() {
        assert_eq!(strip_port("127.0.0.1:9480"), "127.0.0.1");
        assert_eq!(strip_port("[::1]:9480"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("Status.Example.com"), "Status.Example.com");
        assert_eq!(host_name("Status.Example.com"), "status.example.com");
        assert_eq!(host_name("::1"), "[::1]");
    }

    #[test]
    fn allows_the_bound_address_and_loopback_unless_told() {
        let bound: SocketAddr = "127.0.0.1:9480".parse().unwrap();
        let o = HttpOptions::new(bound, &[], Duration::from_secs(5), Duration::from_secs(30), 0);
        assert_eq!(o.allowed_hosts, ["127.0.0.1", "localhost", "[::1]"]);
        let any = HttpOptions::new("0.0.0.0:9480".parse().unwrap(), &[], Duration::from_secs(5), Duration::from_secs(30), 8);
        assert_eq!(any.allowed_hosts, ["0.0.0.0", "localhost", "127.0.0.1", "[::1]"]);
        assert_eq!(o.max_connections, 1, "at least one connection");
        let told = HttpOptions::new(bound, &["Status.Example.com:443".into()], Duration::from_secs(5), Duration::from_secs(30), 8);
        assert_eq!(told.allowed_hosts, ["status.example.com"]);
    }
}
