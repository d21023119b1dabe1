//! The command line: `serve`, `query`, `registry`, `check`. Every flag can also come from a
//! `MESH_PROVISIONER_*` environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(name = "mesh-provisioner", version, about = "The provisioning server of the mesh")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of its biggest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Holds the seat: mirrors the buckets, reconciles the registry and serves the verbs.
    Serve(Serve),
    /// Asks the provisioning verb and prints the answer.
    Query(Query),
    /// Compares the running server's answers with the buckets read straight from the bus;
    /// prints each difference and exits 4 on any.
    Verify(Verify),
    /// Prints the registry compiled into a component (runs the component; no bus needed).
    Registry(RegistryCmd),
    /// Runs the checks a component must pass before it may serve.
    Check(Check),
    /// Makes a signing key for components: the secret into a file (0600), the public key
    /// (for `serve --trust-key`) printed.
    Keygen(Keygen),
    /// Signs a component: writes `<component>.sig`, which `serve --trust-key` requires.
    Sign(Sign),
    /// Makes every bucket of the mesh with the safe settings and limits (run with the
    /// operator's credentials, before anything is installed), and makes safe the ones made
    /// before; refuses (exit 1) a stream of a bucket's name that is not a bucket.
    Bootstrap(Bootstrap),
}

#[derive(Args, Debug)]
pub struct Bootstrap {
    /// The component whose buckets are made: the ones its plans and notices read (a `*` in a
    /// name filled with each --node for the per-node buckets, each --provider for the others),
    /// besides the provisioner's own.
    #[arg(long, env = "MESH_PROVISIONER_COMPONENT")]
    pub component: PathBuf,
    /// A node of the mesh (its compositions' bucket is made); repeat for each.
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    /// A provider module of the mesh (its `<provider>_bound` bucket is made); repeat for each.
    #[arg(long = "provider")]
    pub providers: Vec<String>,
    #[command(flatten)]
    pub buckets: BucketFlags,
    #[command(flatten)]
    pub connect: Connect,
}

/// The settings of the buckets the server or `bootstrap` makes.
#[derive(Args, Debug, Clone, Copy)]
pub struct BucketFlags {
    /// Replicas of the buckets made.
    #[arg(long, env = "MESH_PROVISIONER_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: u8,
    /// The byte limit of each bucket made, in MiB (a write past it is refused by the server).
    #[arg(long, env = "MESH_PROVISIONER_BUCKET_MAX_MIB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub bucket_max_mib: u32,
    /// The largest value one write of a node's buckets may carry, in KiB (compositions, which
    /// carry whole plans, may carry 1 MiB).
    #[arg(long, env = "MESH_PROVISIONER_VALUE_MAX_KIB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub value_max_kib: u32,
    /// Each node's share of the buckets every node writes (needs, applied, collect together),
    /// in MiB: the bus refuses that node's write past it, and no other node's.
    #[arg(long, env = "MESH_PROVISIONER_NODE_SHARE_MIB", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub node_share_mib: u32,
    /// Each node's share of those buckets in keys (delete markers count).
    #[arg(long, env = "MESH_PROVISIONER_NODE_SHARE_KEYS", default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1..))]
    pub node_share_keys: u32,
}

impl BucketFlags {
    pub fn limits(&self) -> crate::bucket::Limits {
        crate::bucket::Limits { max_bytes: i64::from(self.bucket_max_mib) << 20, max_value: (self.value_max_kib << 10) as i32 }
    }

    pub fn share(&self) -> crate::bucket::Share {
        crate::bucket::Share { max_bytes: i64::from(self.node_share_mib) << 20, max_keys: i64::from(self.node_share_keys) }
    }
}

#[derive(Args, Debug)]
pub struct Keygen {
    /// Where the secret key goes (created 0600).
    pub secret: PathBuf,
}

#[derive(Args, Debug)]
pub struct Sign {
    /// The secret key file `keygen` wrote.
    #[arg(long)]
    pub key: PathBuf,
    /// The component to sign.
    pub component: PathBuf,
}

/// How to reach the bus.
#[derive(Args, Clone, Default)]
pub struct Connect {
    /// NATS server URL; without it, `serve` starts an embedded nats-server and `query` asks it.
    #[arg(long, env = "MESH_PROVISIONER_NATS_URL")]
    pub nats_url: Option<String>,
    /// A NATS credentials file (JWT and nkey seed).
    #[arg(long, env = "MESH_PROVISIONER_CREDS")]
    pub creds: Option<PathBuf>,
    /// A file holding an nkey seed.
    #[arg(long, env = "MESH_PROVISIONER_NKEY")]
    pub nkey: Option<PathBuf>,
    /// The user to log in as, with --password-file (or --password).
    #[arg(long, env = "MESH_PROVISIONER_USER")]
    pub user: Option<String>,
    /// The password on the command line shows in `ps`: prefer --password-file or the
    /// environment.
    #[arg(long, env = "MESH_PROVISIONER_PASSWORD", hide_env_values = true, conflicts_with = "password_file")]
    pub password: Option<String>,
    /// A file holding the password (a trailing newline is not part of it), e.g. systemd's
    /// `$CREDENTIALS_DIRECTORY/nats-password`.
    #[arg(long, env = "MESH_PROVISIONER_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    /// The token on the command line shows in `ps`: prefer --token-file or the environment.
    #[arg(long, env = "MESH_PROVISIONER_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the token.
    #[arg(long, env = "MESH_PROVISIONER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The prefix of this client's reply subjects (its inbox). The example config lets each
    /// user subscribe only under its own, `_INBOX_<user>`, so that no user hears another's
    /// replies. Default: `_INBOX_<--user>`, else `_INBOX_mesh-provisioner`.
    #[arg(long, env = "MESH_PROVISIONER_INBOX_PREFIX")]
    pub inbox_prefix: Option<String>,
    /// A CA certificate to trust (PEM).
    #[arg(long, env = "MESH_PROVISIONER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), with --tls-key.
    #[arg(long, env = "MESH_PROVISIONER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "MESH_PROVISIONER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Refuse to talk to the server without TLS.
    #[arg(long, env = "MESH_PROVISIONER_TLS_REQUIRED")]
    pub tls_required: bool,
    /// The state directory (component cache, embedded server data, kept plans).
    #[arg(long, env = "MESH_PROVISIONER_STATE_DIR", default_value_os_t = default_state_dir())]
    pub state_dir: PathBuf,
}

/// Shown as set or not, never the secret.
fn secret<T>(v: &Option<T>) -> &'static str {
    if v.is_some() {
        "Some(<redacted>)"
    } else {
        "None"
    }
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect")
            .field("nats_url", &self.nats_url.as_deref().map(crate::secrets::redact_url))
            .field("creds", &self.creds)
            .field("nkey", &self.nkey)
            .field("user", &self.user)
            .field("password", &secret(&self.password))
            .field("password_file", &self.password_file)
            .field("token", &secret(&self.token))
            .field("token_file", &self.token_file)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("tls_required", &self.tls_required)
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

impl std::fmt::Debug for ServiceLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceLogin")
            .field("service_user", &self.service_user)
            .field("service_password", &secret(&self.service_password))
            .field("service_password_file", &self.service_password_file)
            .field("service_creds", &self.service_creds)
            .field("service_nkey", &self.service_nkey)
            .finish()
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// The user that serves the verbs, when it is not the buckets' user.
#[derive(Args, Clone, Default)]
pub struct ServiceLogin {
    /// The user that serves the verbs (the example config's `mesh-provisioner-service`, which
    /// may publish nothing but replies). Without a --service-* login the verbs are served as
    /// the buckets' user.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_USER")]
    pub service_user: Option<String>,
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_PASSWORD", hide_env_values = true, conflicts_with = "service_password_file")]
    pub service_password: Option<String>,
    /// A file holding the serving user's password.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_PASSWORD_FILE")]
    pub service_password_file: Option<PathBuf>,
    /// A credentials file for the user that serves the verbs.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_CREDS")]
    pub service_creds: Option<PathBuf>,
    /// A file holding the nkey seed of the user that serves the verbs.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_NKEY")]
    pub service_nkey: Option<PathBuf>,
}

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
    /// How often every module's state is found again while holding the seat (a verb's service
    /// starting or stopping changes no bucket); changes of the buckets are followed as they
    /// come. A sweep never takes more than about half of a core, however large the mesh.
    #[arg(long, env = "MESH_PROVISIONER_STATE_SWEEP_EVERY", default_value = "15s", value_parser = parse_duration)]
    pub state_sweep_every: Duration,
    /// How long a kept plan outlives the last source that names its module (its needs,
    /// applied record, compositions and assignment all gone) before it is removed.
    #[arg(long, env = "MESH_PROVISIONER_KEPT_PLAN_GRACE", default_value = "24h", value_parser = parse_duration)]
    pub kept_plan_grace: Duration,
    /// Most plans kept for one node; past it a new module's plan is not kept (the plan verb
    /// says why), so no node's churn of module names fills the disk.
    #[arg(long, env = "MESH_PROVISIONER_KEPT_PLANS_PER_NODE", default_value_t = crate::kept::MAX_PER_NODE)]
    pub kept_plans_per_node: usize,
    /// Wall time one guest call may take.
    #[arg(long, env = "MESH_PROVISIONER_GUEST_DEADLINE", default_value = "2s", value_parser = parse_duration)]
    pub guest_deadline: Duration,
    /// Memory one guest call may use, in MiB.
    #[arg(long, env = "MESH_PROVISIONER_GUEST_MEMORY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
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
    #[arg(long, env = "MESH_PROVISIONER_STATUS_PAGE_PER_NODE", default_value_t = crate::http::PER_NODE)]
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

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum What {
    Registry,
    Needs,
    Applied,
    Collect,
    /// A module's plan and provisions (`--node` and `--module`), from `mesh-provisioner.plan`.
    Plan,
    /// Every module's state and reason (`--needs`: each need's check, made now).
    Status,
    /// Who holds a value (`--kind` and `--name`), and whether each runs the one at its place
    /// now; every page is read, and the exit code is 3 unless every holder is current.
    Holders,
}

#[derive(Args, Debug)]
pub struct Query {
    /// What to list.
    #[arg(value_enum, default_value_t = What::Registry)]
    pub what: What,
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long)]
    pub module: Option<String>,
    #[arg(long)]
    pub kind: Option<String>,
    /// A collection, by its name (e.g. shell:zsh:normal).
    #[arg(long)]
    pub collection: Option<String>,
    /// With `holders`: the need's name, decoded (e.g. postgres.db).
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub limit: Option<u64>,
    #[arg(long)]
    pub after: Option<String>,
    /// Follow `next` and print every page.
    #[arg(long)]
    pub all: bool,
    /// Print the raw JSON reply.
    #[arg(long)]
    pub json: bool,
    /// With `status`: one line per need, with its check and place.
    #[arg(long)]
    pub needs: bool,
    /// With `status`: only modules that have been in their state for at least this long (e.g.
    /// 10m, 1h): what has been stuck, not what is moving.
    #[arg(long, value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Redraw whenever the answer changes (every page), until interrupted: a view an operator
    /// can leave open. `status` follows the state changes the server publishes
    /// (`mesh-provisioner.event.<node>`, or every node's) and asks again when one comes; the
    /// other answers are asked again every `--every`.
    #[arg(long)]
    pub watch: bool,
    /// How often `--watch` asks (for `status`: at the longest, when no change came).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub every: Duration,
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub connect: Connect,
}

#[derive(Args, Debug)]
pub struct Verify {
    /// Compare a bucket again (a second apart) while it differs, up to this many times, so
    /// writes in flight settle.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub attempts: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// How long one page of an answer may take.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub connect: Connect,
}

#[derive(Args, Debug)]
pub struct RegistryCmd {
    #[arg(long, env = "MESH_PROVISIONER_COMPONENT")]
    pub component: PathBuf,
}

#[derive(Args, Debug)]
pub struct Check {
    /// The component to check.
    pub component: PathBuf,
}

/// `$XDG_STATE_HOME/mesh-provisioner`, else `~/.local/state/mesh-provisioner`.
pub fn default_state_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("mesh-provisioner");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/state/mesh-provisioner"),
        None => PathBuf::from(".mesh-provisioner"),
    }
}

/// `250ms`, `10s`, `30m`, `1h`, `2d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    // A bare number is seconds, as before units were required.
    let d = match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 250ms, 10s, 30m or 1h: {e}"))?,
    };
    if d.is_zero() {
        return Err("a duration must be more than zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_durations_and_refuses_nonsense() {
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("1 fortnight").unwrap_err().contains("not a duration like"));
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let c = Connect {
            nats_url: Some("nats://u:url-secret@127.0.0.1:4222".into()),
            user: Some("u".into()),
            password: Some("hunter2".into()),
            token: Some("tok-secret".into()),
            ..Default::default()
        };
        let s = ServiceLogin { service_user: Some("svc".into()), service_password: Some("svc-secret".into()), ..Default::default() };
        let shown = format!("{c:?} {s:?}");
        for secret in ["url-secret", "hunter2", "tok-secret", "svc-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("\"u\"") && shown.contains("svc"), "{shown}");
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

/// How a command that ran to its end came out, when that is more than done: what a script
/// waits on (its exit code), not a failure of the bus or the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Not every holder of a value runs the one at its place yet (`query holders`): exit 3.
    NotCurrent,
    /// The server's answers differ from the bus (`verify`): exit 4.
    Diverged,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::NotCurrent => 3,
            Outcome::Diverged => 4,
        }
    }
}
