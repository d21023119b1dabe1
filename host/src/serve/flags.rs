//! `serve`'s flags: how to reach the bus and serve the verbs, the limits of a call, the
//! timers of the tasks, the HTTP side and the state directory.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::base::flags::parse_duration;
use crate::base::logging::LogFormat;
use crate::nats::connect::{Connect, ServiceLogin};
use crate::nats::mesh::BucketFlags;

#[derive(Args, Debug)]
pub struct Serve {
    #[command(flatten)]
    pub connect: Connect,
    #[command(flatten)]
    pub service: ServiceLogin,
    #[command(flatten)]
    pub buckets: BucketFlags,
    /// The memory all mirrors together may hold (keys and values), in MiB: a bucket whose
    /// mirror would pass it is not mirrored (said in /readyz, status and the metrics) rather
    /// than grow the process until it is killed. 0: no budget.
    #[arg(long, env = "MESH_PROVISIONER_MIRROR_BUDGET_MIB", default_value_t = 4096)]
    pub mirror_budget_mib: u64,
    /// Keys one node may hold in a node clients' bucket (needs, applied, collect) before it is
    /// named in status and the metrics.
    #[arg(long, env = "MESH_PROVISIONER_NODE_QUOTA_KEYS", default_value_t = 100_000)]
    pub node_quota_keys: u64,
    /// Bytes (keys and values), in MiB, one node may hold in a node clients' bucket before it
    /// is named in status and the metrics.
    #[arg(long, env = "MESH_PROVISIONER_NODE_QUOTA_MIB", default_value_t = 64)]
    pub node_quota_mib: u64,
    /// The guest component (.wasm).
    #[arg(long, env = "MESH_PROVISIONER_COMPONENT")]
    pub component: PathBuf,
    /// How often the registry is reconciled (e.g. 1h, 30m, 10s).
    #[arg(long, env = "MESH_PROVISIONER_REGISTRY_EVERY", default_value = "1h", value_parser = parse_duration)]
    pub registry_every: Duration,
    /// How often every mirror is compared with its bucket's stream (and rebuilt if they
    /// differ); also done after every reconnect.
    #[arg(long, env = "MESH_PROVISIONER_AUDIT_EVERY", default_value = "1m", value_parser = parse_duration)]
    pub audit_every: Duration,
    /// How often each mirror whose bucket changed is written to the state directory
    /// (`mirrors/`), and written at shutdown: a restart loads it and resumes the bucket's watch
    /// after it instead of replaying the whole bucket.
    #[arg(long, env = "MESH_PROVISIONER_SNAPSHOT_EVERY", default_value = "1m", value_parser = parse_duration)]
    pub snapshot_every: Duration,
    /// Neither write nor load snapshots of the mirrors: every start replays every bucket.
    #[arg(long, env = "MESH_PROVISIONER_NO_SNAPSHOTS")]
    pub no_snapshots: bool,
    /// How often discovery is asked again while holding the seat (a verb's service starting or
    /// stopping changes no bucket): when an answer moved, every module's state is found again
    /// (and every twentieth time anyway); changes of the buckets are followed as they come. A
    /// sweep alone takes about a tenth of the thread, however large the mesh (a mesh of a
    /// hundred thousand modules is swept in about a minute).
    #[arg(long, env = "MESH_PROVISIONER_STATE_SWEEP_EVERY", default_value = "15s", value_parser = parse_duration)]
    pub state_sweep_every: Duration,
    /// How long a kept plan outlives the last source that names its module (its needs,
    /// applied record, compositions and assignment all gone) before it is removed.
    #[arg(long, env = "MESH_PROVISIONER_KEPT_PLAN_GRACE", default_value = "24h", value_parser = parse_duration)]
    pub kept_plan_grace: Duration,
    /// Most plans kept for one node; past it a new module's plan is not kept (the plan verb
    /// says why), so no node's churn of module names fills the disk.
    #[arg(long, env = "MESH_PROVISIONER_KEPT_PLANS_PER_NODE", default_value_t = crate::store::kept::MAX_PER_NODE)]
    pub kept_plans_per_node: usize,
    /// Wall time one guest call may take.
    #[arg(long, env = "MESH_PROVISIONER_GUEST_DEADLINE", default_value = "2s", value_parser = parse_duration)]
    pub guest_deadline: Duration,
    /// Memory one guest call may use, in MiB (at least 2: an instance alone takes more than one).
    #[arg(long, env = "MESH_PROVISIONER_GUEST_MEMORY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub guest_memory: u32,
    /// Memory all guest instances together may hold (kept for reuse and in flight), in MiB: a
    /// call whose guest would grow past it is stopped with a `500`, the others go on. At least
    /// --guest-memory.
    #[arg(long, env = "MESH_PROVISIONER_GUEST_MEMORY_TOTAL", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub guest_memory_total: u32,
    /// Requests answered at once; one arriving while this many are in flight gets a fast `503`
    /// with code `overloaded` (counted in `$SRV.STATS`) instead of waiting in an unbounded queue.
    #[arg(long, env = "MESH_PROVISIONER_MAX_IN_FLIGHT", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_in_flight: u32,
    /// The seat's lease: a holder that cannot renew within it loses the seat.
    #[arg(long, env = "MESH_PROVISIONER_SEAT_TTL", default_value = "10s", value_parser = parse_duration)]
    pub seat_ttl: Duration,
    /// This instance's name in the seat's lease (default: host name, pid and a random tag).
    #[arg(long, env = "MESH_PROVISIONER_INSTANCE")]
    pub instance: Option<String>,
    /// The embedded server's port (a free one if not given).
    #[arg(long, env = "MESH_PROVISIONER_EMBEDDED_PORT")]
    pub embedded_port: Option<u16>,
    /// Load or swap in only components signed by this ed25519 public key (64 hex digits, as
    /// `keygen` prints): each needs `<component>.sig` (made by `sign`).
    #[arg(long, env = "MESH_PROVISIONER_TRUST_KEY")]
    pub trust_key: Option<String>,
    /// With --trust-key: let a component older than the highest version accepted before load
    /// (a deliberate downgrade; it is remembered as the one serving). Without it such a
    /// rollback is refused.
    #[arg(long, env = "MESH_PROVISIONER_ALLOW_DOWNGRADE", requires = "trust_key")]
    pub allow_downgrade: bool,
    /// Call the guest for every request, even one asked before over buckets unchanged since
    /// (the reply cache is on by default; this is for measuring and for doubt).
    #[arg(long, env = "MESH_PROVISIONER_NO_REPLY_CACHE")]
    pub no_reply_cache: bool,
    /// Replace the component only on SIGHUP (e.g. systemd's ExecReload), not whenever the file
    /// at --component changes.
    #[arg(long, env = "MESH_PROVISIONER_NO_WATCH")]
    pub no_watch: bool,
    /// Also write a small demo mesh, as node clients would (embedded server only). Turns the
    /// HTTP side on at a free loopback port unless --http says where.
    #[arg(long)]
    pub demo: bool,
    /// Run the embedded server in operator mode: the example mesh's accounts signed with nkeys
    /// (kept under the state directory), each party logging in with its creds (embedded
    /// server only).
    #[arg(long, conflicts_with = "nats_url")]
    pub operator: bool,
    /// How often the demo mesh moves on by itself (a provider applied, a value rotated, its
    /// holder catching up).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub demo_every: Duration,
    /// Serve /healthz, /readyz, /metrics and the status page (/) over HTTP at this address
    /// (e.g. 127.0.0.1:9480; keep it on loopback or behind a proxy: it has no authentication).
    /// Off unless given.
    #[arg(long, env = "MESH_PROVISIONER_HTTP", value_name = "ADDR")]
    pub http: Option<String>,
    /// Also serve /healthz, /readyz and /metrics alone at this address, on connections no
    /// other client can take (for an orchestrator's probes and the scraper).
    #[arg(long, env = "MESH_PROVISIONER_HTTP_PROBES", value_name = "ADDR")]
    pub http_probes: Option<String>,
    /// Most modules of one node the status page (and the module metrics) shows; past it the
    /// page names the node, and every other node is still shown.
    #[arg(long, env = "MESH_PROVISIONER_STATUS_PAGE_PER_NODE", default_value_t = crate::serve::http::PER_NODE)]
    pub status_page_per_node: usize,
    /// A `Host` the HTTP side answers (repeat for each; a name, or a name:port). Others get
    /// `421`, so a web page cannot read the status through DNS rebinding. Default: the bound
    /// address, `localhost`, `127.0.0.1` and `[::1]`.
    #[arg(long = "http-allow-host", env = "MESH_PROVISIONER_HTTP_ALLOW_HOST", value_delimiter = ',')]
    pub http_allow_hosts: Vec<String>,
    /// How long a client may take to send a request's headers before its connection is closed.
    #[arg(long, env = "MESH_PROVISIONER_HTTP_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,
    /// How long one request may take, headers to the last byte of the answer.
    #[arg(long, env = "MESH_PROVISIONER_HTTP_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub http_request_timeout: Duration,
    /// Connections the HTTP side holds at once; one more is closed at once.
    #[arg(long, env = "MESH_PROVISIONER_HTTP_MAX_CONNECTIONS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub http_max_connections: u32,
    #[arg(long, env = "MESH_PROVISIONER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}
