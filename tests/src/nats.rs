//! Real parts for end-to-end tests: a `nats-server` on a free loopback port with the
//! repository's example config and a temporary store, and the real host binary against it.
//! Everything started here is stopped when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::{Client, ConnectOptions};
use mesh_provisioner::nats::bucket::Share;
use mesh_provisioner::nats::embedded::{Access, Server};
use serde_json::Value;
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// Each bucket a plan is read from, and the user of the example config that owns (creates and
/// writes) it.
pub const PLAN_BUCKETS: [(&str, &str); 5] = [
    ("mesh-controller", "mesh-controller_assignments"),
    ("mesh-indexer", "mesh-indexer_builds"),
    ("node-alpha", "composed-alpha"),
    ("node-beta", "composed-beta"),
    ("node-gamma", "composed-gamma"),
];

/// A fresh `nats-server`, configured from `deploy/nats-server.conf`.
pub struct Bus {
    pub server: Server,
    pub dir: TempDir,
}

impl Bus {
    /// A fresh server, its buckets every node writes made of the example nodes' shares, as the
    /// operator's `bootstrap` makes them (the other buckets are made by the host or the test).
    pub async fn start() -> Bus {
        Self::start_with(mesh_provisioner::nats::bucket::BucketLimits::default(), Share::default()).await
    }

    /// A fresh server in operator mode (the example mesh's accounts signed, each user logging
    /// in with its creds), its shared buckets made as [`Bus::start`] makes them.
    pub async fn start_operator() -> Bus {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = Server::start_operator(dir.path(), None, "").await.expect("nats-server starts in operator mode");
        let bus = Bus { server, dir };
        make_shared(&bus.js(OPERATOR).await, mesh_provisioner::nats::bucket::BucketLimits::default(), Share::default(), 1).await;
        bus
    }

    /// The directory of an operator-mode bus's accounts (keys, JWTs, creds).
    pub fn accounts_dir(&self) -> PathBuf {
        self.dir.path().join("accounts")
    }

    /// The creds file of `user` on an operator-mode bus.
    pub fn creds_file(&self, user: &str) -> Option<PathBuf> {
        self.access().creds(user).map(|_| self.accounts_dir().join("creds").join(format!("{user}.creds")))
    }

    /// Connect options as `user`: its creds on an operator-mode bus, else its password; its own
    /// inbox prefix.
    pub fn options(&self, user: &str) -> ConnectOptions {
        mesh_provisioner::nats::connect::embedded_options(self.access(), user, "test")
            .unwrap_or_else(|e| panic!("{user}'s login: {e}"))
            .connection_timeout(Duration::from_secs(10))
    }

    /// A fresh server with no bucket made: for what tests `bootstrap` itself.
    pub async fn start_bare() -> Bus {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = Server::start(dir.path(), None, None).await.expect("nats-server starts (scripts/setup installs it)");
        Bus { server, dir }
    }

    /// As [`Bus::start`], with the shared buckets' value-size limit and each node's share
    /// given.
    pub async fn start_with(limits: mesh_provisioner::nats::bucket::BucketLimits, share: Share) -> Bus {
        let bus = Self::start_bare().await;
        make_shared(&bus.js(OPERATOR).await, limits, share, 1).await;
        bus
    }

    /// Stops the server and starts it again on the same port, store and passwords.
    pub async fn restart(self, down_for: Duration) -> Bus {
        let Bus { server, dir } = self;
        let (port, passwords, signed) = (server.port, server.access.passwords.clone(), !server.access.creds.is_empty());
        server.stop().await;
        tokio::time::sleep(down_for).await;
        let server = if signed {
            Server::start_operator(dir.path(), Some(port), "").await.expect("nats-server restarts in operator mode")
        } else {
            Server::start(dir.path(), Some(port), Some(passwords)).await.expect("nats-server restarts")
        };
        Bus { server, dir }
    }

    /// Stops the server and starts it again on the same port and passwords with an empty
    /// store: a disk lost.
    pub async fn restart_empty(self) -> Bus {
        let Bus { server, dir } = self;
        let (port, passwords) = (server.port, server.access.passwords.clone());
        server.stop().await;
        std::fs::remove_dir_all(dir.path().join("jetstream")).expect("remove the store");
        let server = Server::start(dir.path(), Some(port), Some(passwords)).await.expect("nats-server restarts");
        Bus { server, dir }
    }

    /// Sends the server a signal by name (`STOP`, `CONT`, `KILL`).
    pub fn signal(&self, name: &str) {
        let pid = self.server.pid().expect("nats-server running");
        let ok = std::process::Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "kill -{name} nats-server failed");
    }

    pub fn access(&self) -> &Access {
        &self.server.access
    }

    pub fn url(&self) -> &str {
        &self.server.access.url
    }

    pub fn password(&self, user: &str) -> String {
        self.access().password(user).expect("user in the example config").to_string()
    }

    /// A client logged in as `user` of the example config, with its own inbox prefix
    /// (`_INBOX_<user>`, the only one the config lets it subscribe under).
    pub async fn client(&self, user: &str) -> Client {
        // A loaded machine can miss a connect deadline; a few tries keep that from failing a test.
        let mut last = String::new();
        for _ in 0..5 {
            match self.options(user).connect(self.url()).await {
                Ok(c) => return c,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("connect to {} as {user}: {last}", self.url())
    }

    /// A client logged in as `user` whose permission violations are recorded, so a test can
    /// require the server's refusal itself rather than any error (a timeout proves nothing).
    pub async fn watched(&self, user: &str) -> (Client, Denials) {
        let denials = Denials::default();
        let seen = denials.0.clone();
        let client = self
            .options(user)
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(async_nats::ServerError::Other(message)) = event {
                        seen.lock().unwrap_or_else(|p| p.into_inner()).push(message);
                    }
                }
            })
            .connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("connect to {} as {user}: {e}", self.url()));
        (client, denials)
    }

    /// A JetStream context for `user` with a short timeout, so refused writes fail quickly; a
    /// party outside the buckets' account reaches its imports through its JetStream domain.
    pub async fn js(&self, user: &str) -> jetstream::Context {
        let mut js = mesh_provisioner::nats::connect::jetstream_of(self.client(user).await, user);
        js.set_timeout(Duration::from_millis(1500));
        js
    }

    /// Creates each bucket a plan is read from, as the operator does ([`PLAN_BUCKETS`]).
    pub async fn create_plan_buckets(&self) {
        for (_, bucket) in PLAN_BUCKETS {
            self.make_bucket(bucket).await;
        }
    }

    /// Makes `bucket` as the operator's `bootstrap` would (the mesh's safe settings and default
    /// limits): no node, provider or domain user may make a stream.
    pub async fn make_bucket(&self, bucket: &str) {
        make_bucket(&self.js(OPERATOR).await, &spec(bucket, 1)).await
    }

    /// The instance the seat's lease names, if any.
    pub async fn seat_holder(&self) -> Option<String> {
        self.seat_lease().await.map(|(holder, _)| holder)
    }

    /// The seat's holder and the lease's revision. A read that fails (a server slow under load,
    /// a stream between leaders) is tried again a few times: `None` says no lease was read.
    pub async fn seat_lease(&self) -> Option<(String, u64)> {
        for _ in 0..3 {
            let read = async {
                let kv = self.js("mesh-provisioner").await.get_key_value("mesh-provisioner_seat").await.map_err(|e| e.to_string())?;
                kv.entry("holder").await.map_err(|e| e.to_string())
            };
            match read.await {
                Ok(entry) => {
                    let entry = entry?;
                    let v: Value = serde_json::from_slice(&entry.value).ok()?;
                    return Some((v["instance"].as_str()?.to_string(), entry.revision));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        None
    }

    /// Waits (bounded) until one holder has renewed its lease twice in a row: after an outage, a
    /// holder that kept its lease or took it again is steady, where one that answered once may
    /// still lose a lease it could not renew in time, and stop serving until it takes it back.
    pub async fn until_seat_renewed_twice(&self) {
        let start = Instant::now();
        let mut first = self.seat_lease().await;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = self.seat_lease().await;
            match (&first, &now) {
                (Some((a, r0)), Some((b, r))) if a == b && *r >= r0 + 2 => return,
                (Some((a, _)), Some((b, _))) if a == b => {}
                _ => first = now,
            }
            assert!(start.elapsed() < Duration::from_secs(60), "no holder renewed its lease twice: {first:?}");
        }
    }

    /// Writes `key` = `value` into `bucket` as `user`.
    pub async fn put(&self, user: &str, bucket: &str, key: &str, value: &[u8]) -> u64 {
        let kv = self.js(user).await.get_key_value(bucket).await.unwrap_or_else(|e| panic!("{user} opens {bucket}: {e}"));
        kv.put(key, value.to_vec().into()).await.unwrap_or_else(|e| panic!("{user} puts {bucket}/{key}: {e}"))
    }
}

/// The info of every stream of the account `js` is in, and each that could not be read, said.
async fn stream_infos(js: &jetstream::Context) -> (Vec<jetstream::stream::Info>, Vec<String>) {
    use futures::TryStreamExt;
    let mut pending = Vec::new();
    let names: Vec<String> = match js.stream_names().try_collect().await {
        Ok(n) => n,
        Err(e) => {
            pending.push(format!("listing: {e}"));
            Vec::new()
        }
    };
    let mut infos = Vec::new();
    for name in names {
        match js.get_stream(&name).await {
            Ok(mut s) => match s.info().await {
                Ok(info) => infos.push(info.clone()),
                Err(_) => pending.push(format!("{name}: no info")),
            },
            Err(e) => pending.push(format!("{name}: {e}")),
        }
    }
    (infos, pending)
}

/// The user that makes streams in the example config.
pub const OPERATOR: &str = "mesh-operator";

/// The inbox prefix `user` may subscribe under in the example config.
pub fn inbox_of(user: &str) -> String {
    mesh_provisioner::nats::connect::inbox_of(user)
}

/// A bucket as `bootstrap` makes it, with `replicas` replicas.
pub fn spec(bucket: &str, replicas: usize) -> mesh_provisioner::nats::bucket::Spec {
    use mesh_provisioner::nats::bucket::{BucketLimits as Limits, Spec};
    let limits = if bucket.starts_with("composed-") { Limits { max_value: Limits::COMPOSITION_MAX_VALUE, ..Limits::default() } } else { Limits::default() };
    Spec::new(bucket, "made by a test, as bootstrap makes it", 1, replicas, limits)
}

/// A bucket's stream made by hand, as a KV bucket of one message a key that allows a TTL on
/// each message (`Nats-TTL`), which the KV API does not make.
pub fn bucket_with_ttls(bucket: &str) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        allow_message_ttl: true,
        ..Default::default()
    }
}

/// Makes the bucket `spec` through `js` (the operator's), as `bootstrap` makes it, retrying
/// while a cluster elects. A bucket every node writes is made, with the other two, of the
/// example nodes' shares (made once, they are left as they are).
pub async fn make_bucket(js: &jetstream::Context, spec: &mesh_provisioner::nats::bucket::Spec) {
    if spec.shared {
        return make_shared(js, spec.limits, Share::default(), spec.replicas).await;
    }
    let start = Instant::now();
    loop {
        match mesh_provisioner::nats::bucket::create_stream(js, spec).await {
            Ok(()) => return,
            Err(_) if start.elapsed() < Duration::from_secs(30) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => panic!("the operator makes {}: {e}", spec.bucket),
        }
    }
}

/// Makes the buckets every node writes of the example nodes' shares through `js` (the
/// operator's), as `bootstrap --node alpha --node beta --node gamma` makes them, retrying while
/// a cluster elects.
pub async fn make_shared(js: &jetstream::Context, limits: mesh_provisioner::nats::bucket::BucketLimits, share: Share, replicas: usize) {
    let nodes = mesh_provisioner::nats::embedded::EXAMPLE_NODES.iter().map(|n| n.to_string()).collect();
    make_shares(js, nodes, limits, share, replicas).await
}

/// Makes the buckets every node writes of `nodes`' shares, as `bootstrap --node …` makes them
/// (a node given its share anew, the others left as they are), retrying while a cluster elects.
pub async fn make_shares(js: &jetstream::Context, nodes: Vec<String>, limits: mesh_provisioner::nats::bucket::BucketLimits, share: Share, replicas: usize) {
    use mesh_provisioner::nats::bucket::{Spec, SHARED_BUCKETS};
    let buckets = SHARED_BUCKETS.iter().map(|b| Spec::new(b, "made by a test, as bootstrap makes it", 1, replicas, limits)).collect();
    let plan = mesh_provisioner::nats::mesh::Plan { buckets, nodes, share };
    let start = Instant::now();
    loop {
        match mesh_provisioner::nats::mesh::apply(js, &plan).await.result() {
            Ok(()) => return,
            Err(_) if start.elapsed() < Duration::from_secs(30) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => panic!("the operator makes the nodes' shares: {e}"),
        }
    }
}

/// Whose passwords a host is started with.
pub trait Passwords {
    fn password(&self, user: &str) -> String;

    /// The `serve` flags that log `user` in, each prefixed with `prefix` (`""` or `"service-"`).
    fn login(&self, user: &str, prefix: &str) -> Vec<String> {
        vec![format!("--{prefix}user"), user.to_string(), format!("--{prefix}password"), self.password(user)]
    }
}

impl Passwords for Bus {
    fn password(&self, user: &str) -> String {
        Bus::password(self, user)
    }

    fn login(&self, user: &str, prefix: &str) -> Vec<String> {
        match self.creds_file(user) {
            Some(path) => vec![format!("--{prefix}creds"), path.display().to_string()],
            None => vec![format!("--{prefix}user"), user.to_string(), format!("--{prefix}password"), self.password(user)],
        }
    }
}

impl Passwords for Cluster {
    fn password(&self, user: &str) -> String {
        Cluster::password(self, user)
    }
}

/// The permission violations the server reported to one client.
#[derive(Clone, Default)]
pub struct Denials(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Denials {
    /// Waits (bounded) until the server has refused `what` (`Publish to` or `Subscription to`)
    /// on exactly `subject`.
    pub async fn expect(&self, what: &str, subject: &str) {
        let want = format!("permissions violation for {what} \"{subject}\"").to_lowercase();
        let start = Instant::now();
        loop {
            let seen = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if seen.iter().any(|m| m.to_lowercase().contains(&want)) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "the server never refused {what} {subject:?}; it refused: {seen:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything refused so far.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// `nats-server`s in one JetStream cluster, each with the example config; a server can be
/// killed and started again on its own store, port and passwords.
pub struct Cluster {
    pub servers: Vec<Option<Bus>>,
    /// The store of each server that is down, kept for its restart.
    parked: Vec<Option<TempDir>>,
    ports: Vec<u16>,
    /// Each server's port for leaf nodes (the hub's `leafnodes` block), when it has one.
    pub leaf_ports: Vec<u16>,
    blocks: Vec<String>,
    passwords: Vec<(String, String)>,
    /// Three servers and a host load both cores: a cluster's test takes turns with the other
    /// heavy ones (`tests::heavy`) for as long as the cluster lives.
    _heavy: tokio::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    pub async fn start(n: usize) -> Cluster {
        Self::start_hub(n, false).await
    }

    /// A cluster whose servers also accept leaf nodes (each listens for them on
    /// [`Cluster::leaf_ports`]; a node's leaf server logs in as the node's user). The leaf
    /// ports are not advertised, so a leaf stays on the link it was given.
    pub async fn start_hub(n: usize, leaf_nodes: bool) -> Cluster {
        // Every port of the cluster picked at once, so no two are the same.
        let picked = mesh_provisioner::nats::embedded::free_ports(3 * n).expect("free ports");
        let ports: Vec<(u16, u16)> = (0..n).map(|i| (picked[i], picked[n + i])).collect();
        let passwords: Vec<(String, String)> =
            mesh_provisioner::nats::embedded::users().into_iter().map(|(_, u)| (u, mesh_provisioner::base::random::random_password().unwrap())).collect();
        let _heavy = crate::heavy().await;
        let mut cluster = Cluster { servers: Vec::new(), parked: Vec::new(), ports: Vec::new(), leaf_ports: Vec::new(), blocks: Vec::new(), passwords, _heavy };
        for (i, (port, cport)) in ports.iter().enumerate() {
            let routes: Vec<String> = ports.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, (_, c))| format!("\"nats-route://127.0.0.1:{c}\"")).collect();
            // Each server tagged `s<i>`, so a test can place a stream on one server.
            let mut block =
                format!("server_tags: [\"s{i}\"]\ncluster {{\n  name: \"mesh\"\n  listen: \"127.0.0.1:{cport}\"\n  routes: [{}]\n}}", routes.join(", "));
            if leaf_nodes {
                let lport = picked[2 * n + i];
                block.push_str(&format!("\nleafnodes {{\n  listen: \"127.0.0.1:{lport}\"\n  no_advertise: true\n}}"));
                cluster.leaf_ports.push(lport);
            }
            cluster.ports.push(*port);
            cluster.blocks.push(block);
            cluster.parked.push(Some(tempfile::tempdir().expect("temp dir")));
            cluster.servers.push(None);
        }
        for i in 0..n {
            cluster.restart(i).await;
        }
        let mut js = jetstream::new(cluster.client(OPERATOR).await);
        js.set_timeout(Duration::from_secs(5));
        make_shared(&js, mesh_provisioner::nats::bucket::BucketLimits::default(), Share::default(), n.min(3)).await;
        cluster
    }

    pub fn bus(&self, i: usize) -> &Bus {
        self.servers[i].as_ref().expect("server running")
    }

    /// Any running server.
    pub fn any(&self) -> &Bus {
        self.servers.iter().flatten().next().expect("a server running")
    }

    /// Every server's URL, comma-separated (those down too: a client tries each).
    pub fn urls(&self) -> String {
        self.ports.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// The index of the server named `name` (`mesh-<port>` in the example config).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.ports.iter().position(|p| name == format!("mesh-{p}"))
    }

    /// Moves every stream of the buckets' account onto server `i` alone (one replica, placed by
    /// its tag), and waits until each is led there: what a test needs so that the other
    /// servers can die with the JetStream meta group's quorum while every bucket stays served.
    pub async fn pin_streams_to(&self, i: usize) {
        let js = self.bus(i).js(OPERATOR).await;
        let leader = format!("mesh-{}", self.ports[i]);
        let start = Instant::now();
        loop {
            let (infos, mut pending) = stream_infos(&js).await;
            for info in infos {
                let name = info.config.name.clone();
                let placed = info.config.placement.as_ref().is_some_and(|p| p.tags == [format!("s{i}")]);
                let here = info.cluster.as_ref().is_some_and(|c| c.leader.as_deref() == Some(leader.as_str()) && c.replicas.is_empty());
                // Scaled down first, then moved: the server takes one at a time.
                let update = match (info.config.num_replicas != 1, placed) {
                    (true, _) => Some(jetstream::stream::Config { num_replicas: 1, ..info.config.clone() }),
                    (false, false) => Some(jetstream::stream::Config {
                        placement: Some(jetstream::stream::Placement { cluster: None, tags: vec![format!("s{i}")] }),
                        ..info.config.clone()
                    }),
                    (false, true) => None,
                };
                if let Some(config) = update {
                    if let Err(e) = js.update_stream(config).await {
                        pending.push(format!("{name}: {e}"));
                        continue;
                    }
                }
                if !here {
                    pending.push(format!("{name}: led by {:?}", info.cluster.as_ref().and_then(|c| c.leader.clone())));
                }
            }
            if pending.is_empty() {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "streams not on server {i}: {pending:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits (bounded) until every stream of the buckets' account answers its info with a
    /// leader: after a server dies, each stream it led is leaderless until its group elects
    /// another (nats-server's election timeout is seconds), and a write to it meanwhile has no
    /// responder.
    pub async fn until_every_stream_is_led(&self) -> Duration {
        let js = self.any().js(OPERATOR).await;
        let start = Instant::now();
        loop {
            let (infos, mut pending) = stream_infos(&js).await;
            pending.extend(
                infos.into_iter().filter(|i| i.cluster.as_ref().and_then(|c| c.leader.as_ref()).is_none()).map(|i| format!("{}: no leader", i.config.name)),
            );
            if pending.is_empty() {
                return start.elapsed();
            }
            assert!(start.elapsed() < Duration::from_secs(60), "streams without a leader: {pending:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stops server `i` for good (its store is dropped).
    pub async fn kill(&mut self, i: usize) {
        if let Some(b) = self.servers[i].take() {
            b.server.stop().await;
        }
    }

    /// `SIGKILL`s server `i`, keeping its store for [`Cluster::restart`].
    pub async fn crash(&mut self, i: usize) {
        if let Some(b) = self.servers[i].take() {
            let Bus { server, dir } = b;
            server.stop().await;
            self.parked[i] = Some(dir);
        }
    }

    /// Starts server `i` again on its store, port and passwords. A few tries: its ports were
    /// free when picked, but a test running beside this one may be probing for a free port
    /// at the moment the server binds.
    pub async fn restart(&mut self, i: usize) {
        let dir = self.parked[i].take().expect("server down");
        let mut tries = 0;
        let server = loop {
            match Server::start_with(dir.path(), Some(self.ports[i]), Some(self.passwords.clone()), &self.blocks[i]).await {
                Ok(s) => break s,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("cluster server {i} did not start ({e}): trying again");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => panic!("cluster server {i} starts: {e}\n{}", std::fs::read_to_string(dir.path().join("nats-server.log")).unwrap_or_default()),
            }
        };
        self.servers[i] = Some(Bus { server, dir });
    }

    /// A client of `user` that knows every server, so it moves to another when one goes down.
    pub async fn client(&self, user: &str) -> Client {
        let password = self.passwords.iter().find(|(u, _)| u == user).map(|(_, p)| p.clone()).expect("user in the example config");
        let urls: Vec<String> = self.ports.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect();
        ConnectOptions::with_user_and_password(user.into(), password)
            .custom_inbox_prefix(inbox_of(user))
            .connection_timeout(Duration::from_secs(10))
            .retry_on_initial_connect()
            .connect(urls.as_slice())
            .await
            .unwrap_or_else(|e| panic!("connect to the cluster as {user}: {e}"))
    }

    pub fn password(&self, user: &str) -> String {
        self.passwords.iter().find(|(u, _)| u == user).map(|(_, p)| p.clone()).expect("user in the example config")
    }

    /// Makes `bucket` with three replicas, as the operator does.
    pub async fn make_bucket(&self, bucket: &str) {
        let mut js = jetstream::new(self.client(OPERATOR).await);
        js.set_timeout(Duration::from_secs(5));
        make_bucket(&js, &spec(bucket, 3)).await
    }
}

/// A `nats-server` with a config of the test's own (another way to authenticate, TLS), JetStream
/// in a temporary store, on a free loopback port; stopped when dropped.
pub struct RawServer {
    pub port: u16,
    pub dir: TempDir,
    child: Child,
}

impl RawServer {
    /// Starts `nats-server` with `config` (`{{PORT}}` and `{{DIR}}` filled in) and waits until it
    /// listens.
    pub async fn start(config: &str) -> RawServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = mesh_provisioner::nats::embedded::free_port().expect("a free port");
        let text = config.replace("{{PORT}}", &port.to_string()).replace("{{DIR}}", &dir.path().display().to_string());
        let conf = dir.path().join("server.conf");
        std::fs::write(&conf, text).expect("write the config");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("server log");
        let mut child = Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server on PATH (scripts/setup installs it)");
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nats-server exited ({status}):\n{}", std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default());
            }
            assert!(start.elapsed() < Duration::from_secs(20), "nats-server did not listen on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        RawServer { port, dir, child }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Rewrites the config (same port and directory) and makes the running server reload it.
    pub fn reload(&self, config: &str) {
        let text = config.replace("{{PORT}}", &self.port.to_string()).replace("{{DIR}}", &self.dir.path().display().to_string());
        std::fs::write(self.dir.path().join("server.conf"), text).expect("rewrite the config");
        let pid = self.child.id().expect("nats-server running");
        let ok = std::process::Command::new("kill").arg("-HUP").arg(pid.to_string()).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "kill -HUP nats-server failed");
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Makes `dir` this user's alone (`0700`), as an operator makes a state directory: the server
/// refuses one others may read (a temporary directory is made `0755`).
pub fn private(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).expect("chmod 700 the state directory");
}

/// For benchmarks: use the release host binary when one is built.
pub fn prefer_release_binary() {
    let release = crate::target_dir().join("release/mesh-provisioner");
    if release.exists() && std::env::var_os("MESH_PROVISIONER_BIN").is_none() {
        std::env::set_var("MESH_PROVISIONER_BIN", &release);
    }
    println!("host binary: {}", host_binary().display());
}

/// The built host binary (scripts/test builds it), or `MESH_PROVISIONER_BIN`.
pub fn host_binary() -> PathBuf {
    let path = std::env::var_os("MESH_PROVISIONER_BIN").map(PathBuf::from).unwrap_or_else(|| crate::target_dir().join("debug/mesh-provisioner"));
    assert!(path.exists(), "no host binary at {}: run the README's test command (scripts/test), which builds it", path.display());
    path
}

/// The real host binary, serving against a [`Bus`] as the provisioner's user.
pub struct Host {
    pub child: Child,
    pub state: TempDir,
    pub log: PathBuf,
}

impl Host {
    pub async fn start(bus: &Bus, extra: &[&str]) -> Host {
        let state = tempfile::tempdir().expect("temp dir");
        Self::start_in(bus, state, extra).await
    }

    pub async fn start_in(bus: &Bus, state: TempDir, extra: &[&str]) -> Host {
        Self::start_with(bus, state, &crate::component_path(), extra).await
    }

    /// Starts the host serving the component at `component`, and waits until it serves.
    pub async fn start_with(bus: &Bus, state: TempDir, component: &std::path::Path, extra: &[&str]) -> Host {
        let mut host = Self::spawn(bus.url(), bus, state, component, extra);
        host.wait_serving(bus).await;
        host
    }

    /// Starts the host against `url` (comma-separated for a cluster) without waiting, as the
    /// example config's provisioner: its buckets' user and the user that serves the verbs.
    pub fn spawn(url: &str, passwords: &dyn Passwords, state: TempDir, component: &std::path::Path, extra: &[&str]) -> Host {
        let mut owned = vec!["--nats-url".to_string(), url.to_string()];
        owned.extend(passwords.login("mesh-provisioner", ""));
        owned.extend(passwords.login("mesh-provisioner-service", "service-"));
        let mut args: Vec<&str> = owned.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        Self::spawn_as(state, component, &args)
    }

    /// Starts `serve` with exactly `args` (how to reach the bus and log in, and any more)
    /// besides the component and the state directory, without waiting.
    pub fn spawn_as(state: TempDir, component: &std::path::Path, args: &[&str]) -> Host {
        private(state.path());
        let log = state.path().join("host.log");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let child = Command::new(host_binary())
            .arg("serve")
            .arg("--component")
            .arg(component)
            .arg("--state-dir")
            .arg(state.path())
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the host binary");
        Host { child, state, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("host running")
    }

    /// Sends a signal by name (`STOP`, `CONT`, `KILL`, `HUP`).
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill").arg(format!("-{name}")).arg(self.pid().to_string()).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "kill -{name} failed");
    }

    /// Waits until the verb answers (bounded).
    pub async fn wait_serving(&mut self, bus: &Bus) {
        let client = bus.client("node-alpha").await;
        self.wait_answering(&client).await;
    }

    pub async fn wait_answering(&mut self, client: &Client) {
        let client = client.clone();
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the host exited ({status}):\n{}", self.log_text());
            }
            // Serving means answering: a 503 (not ready, no seat) is not serving yet.
            if matches!(ask_raw(&client, b"{}").await, Ok((None, _))) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "the host did not serve within 30 s:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The HTTP side's address (`http://127.0.0.1:<port>`, no trailing slash), from the host's
    /// log line; waits for it (bounded).
    pub async fn http_url(&self) -> String {
        let start = Instant::now();
        loop {
            let log = self.log_text();
            if let Some(at) = log.find("url=http://") {
                return log[at + 4..].split_whitespace().next().unwrap_or_default().trim_end_matches('/').to_string();
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no HTTP address in the log:\n{log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the host, handing back its state directory.
    pub async fn stop(mut self) -> TempDir {
        let _ = self.child.kill().await;
        self.state
    }

    /// Waits (bounded) until the `$SRV.INFO` metadata satisfies `cond`, returning it.
    pub async fn info_until(client: &Client, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            // No answer yet (a seat taken back, a reconnect) is "not yet" too.
            let m = Self::try_info(client).await;
            if let Ok(v) = &m {
                if cond(v) {
                    return v.clone();
                }
            }
            assert!(start.elapsed() < Duration::from_secs(30), "INFO never showed {what}: {m:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The micro service's `$SRV.INFO` metadata.
    pub async fn info(client: &Client) -> Value {
        Self::try_info(client).await.unwrap_or_else(|e| panic!("INFO answers: {e}"))
    }

    /// As [`Host::info`]; `Err` saying why when it did not answer.
    async fn try_info(client: &Client) -> Result<Value, String> {
        let m = client.request("$SRV.INFO.mesh-provisioner", "".into()).await.map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&m.payload).map_err(|e| format!("INFO is not JSON ({e}): {:?}", m.payload))?;
        Ok(v["metadata"].clone())
    }
}

/// Runs `mesh-provisioner verify --json` against `url` as `user`: its exit code and report.
pub async fn run_verify(url: &str, user: &str, password: &str) -> (Option<i32>, Value) {
    try_verify(url, user, password).await.unwrap_or_else(|e| panic!("{e}"))
}

/// As [`run_verify`]; `Err` with what it printed when it made no report (it could not ask).
pub async fn try_verify(url: &str, user: &str, password: &str) -> Result<(Option<i32>, Value), String> {
    let out =
        Command::new(host_binary()).args(["verify", "--json", "--nats-url", url, "--user", user, "--password", password]).output().await.expect("run verify");
    let text = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str(text.trim()) {
        Ok(report) => Ok((out.status.code(), report)),
        Err(_) => Err(format!("verify printed no report (exit {:?}):\n{text}\n{}", out.status.code(), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// Every key (entries and out of shape) the verb answers for `body`, each page followed, with its
/// revision, in the order answered; `Err` on an error reply or no reply within `timeout`.
pub async fn answered_keys(client: &Client, body: Value, timeout: Duration) -> Result<Vec<(String, u64)>, String> {
    Ok(answered_items(client, body, timeout)
        .await?
        .iter()
        .map(|e| (e["key"].as_str().unwrap_or_default().to_string(), e["revision"].as_u64().unwrap_or(0)))
        .collect())
}

/// Every item (entries and out of shape) the verb answers for `body`, each page followed, in the
/// order answered; `Err` on an error reply or no reply within `timeout`.
pub async fn answered_items(client: &Client, mut body: Value, timeout: Duration) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    loop {
        let (code, mut v) = ask_within(client, body.to_string().as_bytes(), timeout).await?;
        if code.is_some() {
            return Err(format!("error {code:?}: {v}"));
        }
        for list in ["entries", "out_of_shape"] {
            if let Some(items) = v.get_mut(list).and_then(Value::as_array_mut) {
                out.append(items);
            }
        }
        match v.get("next") {
            Some(n) => body["after"] = n.clone(),
            None => return Ok(out),
        }
    }
}

/// The kinds of the registry the component compiles, as `mesh-provisioner registry` prints
/// them (a kind and its row per line), sorted.
pub async fn compiled_kinds() -> Vec<String> {
    let out = Command::new(host_binary()).arg("registry").arg("--component").arg(crate::component_path()).output().await.expect("run registry");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut kinds: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect();
    kinds.sort();
    kinds
}

/// The micro service's `$SRV.STATS` for the provisioning endpoint's `data`.
pub async fn stats_data(client: &Client) -> Value {
    let m = client.request("$SRV.STATS.mesh-provisioner", "".into()).await.expect("STATS answers");
    let v: Value = serde_json::from_slice(&m.payload).expect("STATS is JSON");
    v["endpoints"][0]["data"].clone()
}

/// One request of the verb: the reply's error-code header (if any) and its JSON body.
pub async fn ask_raw(client: &Client, body: &[u8]) -> Result<(Option<String>, Value), String> {
    ask_within(client, body, Duration::from_secs(5)).await
}

/// As [`ask_raw`], waiting at most `timeout`: a request in flight to a responder that dies is
/// lost, and a client retries it.
pub async fn ask_within(client: &Client, body: &[u8], timeout: Duration) -> Result<(Option<String>, Value), String> {
    ask_verb_within(client, "mesh-provisioner.provisioning", body, timeout).await
}

/// One request of `verb` (`mesh-provisioner.plan`, …): the error-code header and the JSON body.
pub async fn ask_verb(client: &Client, verb: &str, body: &[u8]) -> Result<(Option<String>, Value), String> {
    ask_verb_within(client, verb, body, Duration::from_secs(5)).await
}

async fn ask_verb_within(client: &Client, verb: &str, body: &[u8], timeout: Duration) -> Result<(Option<String>, Value), String> {
    let req = async_nats::Request::new().payload(body.to_vec().into()).timeout(Some(timeout));
    let msg = client.send_request(verb.to_string(), req).await.map_err(|e| e.to_string())?;
    let code = msg.headers.as_ref().and_then(|h| h.get("Nats-Service-Error-Code")).map(|v| v.to_string());
    let v = serde_json::from_slice(&msg.payload).map_err(|e| format!("not JSON ({e}): {:?}", msg.payload))?;
    // Every reply a test receives fits the schema a client would check it against.
    crate::schema::check(crate::schema::of_reply(verb, code.as_deref()), &v);
    Ok((code, v))
}

/// Asks and expects a normal answer.
pub async fn ask_ok(client: &Client, body: Value) -> Value {
    let (code, v) = ask_raw(client, body.to_string().as_bytes()).await.expect("the verb answers");
    assert_eq!(code, None, "error reply to {body}: {v}");
    v
}

/// The status entry of one module, as `node-alpha` or whoever `c` is asks it.
pub async fn module_status(c: &Client, node: &str, module: &str) -> Value {
    ask_ok(c, serde_json::json!({"what":"status","node":node,"module":module})).await["entries"][0].clone()
}

/// Asks the status of one module until `cond` holds of it (at most 30 s, failing with `what`
/// and the last answer), returning it.
pub async fn status_until(c: &Client, node: &str, module: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    status_until_else(c, node, module, what, cond, async || String::new()).await
}

/// As [`status_until`], the failure also saying what `more` finds then (the host's log, its
/// counters): for a wait whose cause is not in the answer.
pub async fn status_until_else(c: &Client, node: &str, module: &str, what: &str, cond: impl Fn(&Value) -> bool, more: impl AsyncFnOnce() -> String) -> Value {
    let body = serde_json::json!({"what":"status","node":node,"module":module});
    let what = format!("{node}/{module} showing {what}");
    ask_until_else(c, body, &what, |v| cond(&v["entries"][0]), more).await["entries"][0].clone()
}

/// Asks the verb `body` until a normal answer satisfies `cond` (at most 30 s, failing with
/// `what` and the last answer), returning it.
pub async fn ask_until(c: &Client, body: Value, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    ask_until_else(c, body, what, cond, async || String::new()).await
}

/// As [`ask_until`], the failure also saying what `more` finds then. A wait, not a check of the
/// verb: an error reply or none (a seat being taken back, a reconnect) is "not yet".
pub async fn ask_until_else(c: &Client, body: Value, what: &str, cond: impl Fn(&Value) -> bool, more: impl AsyncFnOnce() -> String) -> Value {
    let start = Instant::now();
    let body = body.to_string();
    loop {
        let last = match ask_raw(c, body.as_bytes()).await {
            Ok((None, v)) if cond(&v) => return v,
            Ok((None, v)) => v,
            Ok((Some(code), v)) => serde_json::json!({"error reply": code, "body": v}),
            Err(e) => serde_json::json!({"no answer": e}),
        };
        if start.elapsed() >= Duration::from_secs(30) {
            panic!("never answered {what}: {last}{}", more().await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of the host's `/metrics` (at `http`) that count a lost connection to the bus:
/// none while every connection held.
pub async fn lost_connections(http: &str) -> Vec<String> {
    let (_, _, page) = crate::browser::get(&format!("{http}/metrics")).await;
    page.lines().filter(|l| l.starts_with("mesh_provisioner_bus_disconnects_total")).map(str::to_string).collect()
}

/// A stand-in for the vault's micro service: answers `$SRV.PING.mesh-vault` as the vault's own
/// user until dropped.
pub struct Vault(tokio::task::JoinHandle<()>);

impl Vault {
    pub async fn start(bus: &Bus) -> Vault {
        use futures::StreamExt;
        let client = bus.client("mesh-vault").await;
        let mut pings = client.subscribe("$SRV.PING.mesh-vault").await.expect("subscribe as the vault");
        client.flush().await.expect("flush");
        Vault(tokio::spawn(async move {
            while let Some(m) = pings.next().await {
                if let Some(reply) = m.reply {
                    let body = serde_json::json!({"type":"io.nats.micro.v1.ping_response","name":"mesh-vault","id":"vault-test-1","version":"0.0.1"});
                    let _ = client.publish(reply, body.to_string().into()).await;
                }
            }
        }))
    }
}

impl Drop for Vault {
    fn drop(&mut self) {
        self.0.abort();
    }
}
