//! The mesh's parties and what each may do (SPEC §8): one account per party, the account `MESH`
//! holding every bucket, and every grant written once here. Both renderings read this model:
//! the static server config (`conf.rs`) and operator mode's signed JWTs (`operator.rs`), so the
//! two cannot grant differently.
//!
//! Bucket names here are the deployment's (the mesh's domains and their buckets), never a key's
//! shape: which keys a node writes is `<bucket>.<node>.>` by SPEC §3, nothing finer.

use crate::base::error::{Error, ErrorKind, Result};

/// The account holding every bucket, the provisioner and the operator.
pub const MESH: &str = "MESH";
/// The system account.
pub const SYS: &str = "SYS";
/// The vault's account: it answers its verbs and its discovery.
pub const VAULT: &str = "MESH_VAULT";
/// The buckets every node writes its own keys of (each node's share sources into them).
pub const NODE_BUCKETS: [&str; 3] = ["mesh-provisioner_needs", "mesh-provisioner_applied", "mesh-provisioner_collect"];
/// The verbs' subjects and the provisioner's discovery.
pub const PROVISIONING: &str = "mesh-provisioner.provisioning";
pub const PLAN: &str = "mesh-provisioner.plan";
const DISCOVERY: [&str; 2] = ["$SRV.*.mesh-provisioner", "$SRV.*.mesh-provisioner.>"];

/// The longest node or provider name: it is in account, stream and bucket names.
pub const MAX_NAME: usize = 64;

/// `MESH`'s JetStream limits (the only account with JetStream): room for every node's share and
/// buckets, growing with the mesh past the example's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshJetStream {
    pub memory_bytes: i64,
    pub file_bytes: i64,
    pub streams: i64,
    pub consumers: i64,
}

impl MeshJetStream {
    /// A node's room on disk: its share (8 MiB by default), the three buckets sourcing it, its
    /// compositions, with margin.
    const PER_NODE_FILE: i64 = 64 << 20;

    pub fn of(mesh: &Mesh) -> MeshJetStream {
        let nodes = mesh.nodes.len() as i64;
        // Each node: its share and its compositions' bucket; each provider: its bucket.
        let streams = (2 * nodes + mesh.providers.len() as i64 + 32).max(256);
        MeshJetStream { memory_bytes: 256 << 20, file_bytes: (nodes * Self::PER_NODE_FILE).max(8 << 30), streams, consumers: (streams * 8).max(8192) }
    }

    /// What the server may store on disk in all: the account's room and 2 GiB besides.
    pub fn server_file_bytes(&self) -> i64 {
        self.file_bytes + (2 << 30)
    }
}

/// The nodes and providers of a mesh: what its accounts are rendered from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Mesh {
    pub nodes: Vec<String>,
    #[serde(default)]
    pub providers: Vec<String>,
}

impl Mesh {
    /// A mesh of `nodes` and `providers`, each name checked: a lowercase subject token, unique
    /// among them all (a node and a provider may not share a name either: their accounts and
    /// users would).
    pub fn new(nodes: Vec<String>, providers: Vec<String>) -> Result<Mesh> {
        let mut seen = std::collections::BTreeSet::new();
        for (what, name) in nodes.iter().map(|n| ("node", n)).chain(providers.iter().map(|p| ("provider", p))) {
            if !is_name(name) {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("{what} {name:?} is not a name: 1 to {MAX_NAME} of a-z, 0-9, - and _, starting with a letter or digit"),
                ));
            }
            if !seen.insert(name.as_str()) {
                return Err(Error::new(ErrorKind::Config, format!("{name:?} is named twice")));
            }
        }
        if nodes.is_empty() {
            return Err(Error::new(ErrorKind::Config, "a mesh needs at least one node"));
        }
        Ok(Mesh { nodes, providers })
    }

    /// Every account of the mesh, `MESH` first and `SYS` last.
    pub fn accounts(&self) -> Vec<Account> {
        let mut out = vec![mesh_account(self)];
        out.extend(self.nodes.iter().map(|n| node_account(n)));
        out.extend(self.providers.iter().map(|p| provider_account(p)));
        out.extend(DOMAINS.iter().map(domain_account));
        out.push(vault_account());
        out.push(Account::new(SYS, &[], vec![User::plain("system")]));
        out
    }
}

/// Whether `s` may name a node or a provider.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// A node's account name.
pub fn node_account_name(node: &str) -> String {
    format!("NODE_{}", node.to_ascii_uppercase())
}

/// A provider's account name.
pub fn provider_account_name(provider: &str) -> String {
    format!("PROVIDER_{}", provider.to_ascii_uppercase())
}

/// A node's share of the buckets every node writes: a stream of its own.
pub fn node_stream(node: &str) -> String {
    format!("NODE_{node}")
}

/// Publish or subscribe, in an export or an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request answered by the exporting account.
    Service,
    /// Messages the exporting account publishes.
    Stream,
}

/// What `MESH` (or the vault) lends: to the accounts named, or to every account if none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub kind: Kind,
    pub subject: String,
    pub accounts: Vec<String>,
    /// A service answered by many (a discovery ping).
    pub response_stream: bool,
}

/// What an account takes from another: `subject` as the exporter names it, `local` as this
/// account's users publish it (the same if `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub kind: Kind,
    pub account: String,
    pub subject: String,
    pub local: Option<String>,
}

/// A user's permissions; `None` on a [`User`] means the account's whole subject space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub publish_allow: Vec<String>,
    pub publish_deny: Vec<String>,
    pub subscribe_allow: Vec<String>,
    /// May publish a reply to a request it was delivered (one, within the server's default).
    pub allow_responses: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub comment: Vec<String>,
    pub grant: Option<Grant>,
}

impl User {
    fn plain(name: &str) -> User {
        User { name: name.to_string(), comment: vec![], grant: None }
    }

    fn granted(name: &str, comment: &[&str], grant: Grant) -> User {
        User { name: name.to_string(), comment: lines(comment), grant: Some(grant) }
    }

    /// The placeholder of this user's password in the static config: `{{PASSWORD_NODE_ALPHA}}`.
    pub fn placeholder(&self) -> String {
        let name = self.name.strip_prefix("mesh-provisioner").map(|rest| format!("provisioner{rest}")).unwrap_or_else(|| self.name.clone());
        format!("PASSWORD_{}", name.to_ascii_uppercase().replace('-', "_"))
    }
}

/// A group of exports under one comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exports {
    pub comment: Vec<String>,
    pub exports: Vec<Export>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub comment: Vec<String>,
    pub users: Vec<User>,
    pub exports: Vec<Exports>,
    pub imports: Vec<Import>,
    /// Why the imports are there, when they need saying.
    pub imports_comment: Vec<String>,
    /// `MESH` alone has JetStream.
    pub jetstream: bool,
}

impl Account {
    fn new(name: &str, comment: &[&str], users: Vec<User>) -> Account {
        Account { name: name.into(), comment: lines(comment), users, exports: vec![], imports: vec![], imports_comment: vec![], jetstream: false }
    }

    /// Every export, whatever its group.
    pub fn all_exports(&self) -> impl Iterator<Item = &Export> {
        self.exports.iter().flat_map(|g| g.exports.iter())
    }
}

fn lines(text: &[&str]) -> Vec<String> {
    text.iter().map(|s| s.to_string()).collect()
}

fn strings<const N: usize>(items: [&str; N]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn service(subject: impl Into<String>, accounts: &[String]) -> Export {
    Export { kind: Kind::Service, subject: subject.into(), accounts: accounts.to_vec(), response_stream: false }
}

fn stream(subject: impl Into<String>, accounts: &[String]) -> Export {
    Export { kind: Kind::Stream, subject: subject.into(), accounts: accounts.to_vec(), response_stream: false }
}

fn import(kind: Kind, subject: impl Into<String>, local: Option<String>) -> Import {
    Import { kind, account: MESH.into(), subject: subject.into(), local }
}

/// A party's publish grant and imports for a bucket it writes the keys under `prefix` of
/// (`$KV.<bucket>.<prefix>`): the JetStream publish, its forms through the domain `mesh` and
/// from a leaf (`kv.…`, which carries no `$KV`), the bucket's direct get and stream info as its
/// KV client asks them — answered from `stream`, the stream that holds its keys.
fn writes(grant: &mut Grant, imports: &mut Vec<Import>, bucket: &str, prefix: &str, stream: &str) {
    let keys = format!("{bucket}{prefix}.>");
    grant.publish_allow.extend([
        format!("$KV.{keys}"),
        format!("$JS.mesh.API.$KV.{keys}"),
        format!("kv.{keys}"),
        format!("$JS.mesh.API.DIRECT.GET.KV_{bucket}.$KV.{keys}"),
        format!("$JS.mesh.API.STREAM.INFO.KV_{bucket}"),
    ]);
    imports.extend([
        import(Kind::Service, format!("$KV.{keys}"), None),
        import(Kind::Service, format!("$KV.{keys}"), Some(format!("$JS.mesh.API.$KV.{keys}"))),
        import(Kind::Service, format!("$KV.{keys}"), Some(format!("kv.{keys}"))),
        import(Kind::Service, format!("$JS.API.DIRECT.GET.{stream}.$KV.{keys}"), Some(format!("$JS.mesh.API.DIRECT.GET.KV_{bucket}.$KV.{keys}"))),
        import(Kind::Service, format!("$JS.API.STREAM.INFO.{stream}"), Some(format!("$JS.mesh.API.STREAM.INFO.KV_{bucket}"))),
    ]);
}

/// The verbs a party asks and the provisioner's discovery: its publish grant and imports.
fn asks(grant: &mut Grant, imports: &mut Vec<Import>, verbs: &[&str]) {
    grant.publish_allow.extend(verbs.iter().map(|v| v.to_string()));
    grant.publish_allow.extend(strings(DISCOVERY));
    imports.extend(verbs.iter().chain(DISCOVERY.iter()).map(|s| import(Kind::Service, *s, None)));
}

/// A node's compositions' bucket.
pub fn composed(node: &str) -> String {
    format!("composed-{node}")
}

/// A provider's bucket of bound values.
pub fn bound(provider: &str) -> String {
    format!("{provider}_bound")
}

fn node_account(node: &str) -> Account {
    let (user, leaf, stream) = (format!("node-{node}"), format!("leaf-{node}"), node_stream(node));
    let mut grant = Grant::default();
    let mut imports = Vec::new();
    for bucket in NODE_BUCKETS {
        writes(&mut grant, &mut imports, bucket, &format!(".{node}"), &stream);
    }
    let composed = composed(node);
    writes(&mut grant, &mut imports, &composed, "", &format!("KV_{composed}"));
    // The verbs' imports come first: the order the config has always had.
    let mut asked = Vec::new();
    asks(&mut grant, &mut asked, &[PROVISIONING, PLAN]);
    let mut imports: Vec<Import> = asked.into_iter().chain(imports).collect();
    let heard = [format!("mesh-provisioner.notice.{node}"), format!("mesh-provisioner.event.{node}")];
    grant.subscribe_allow = vec![format!("_INBOX_{user}.>")];
    grant.subscribe_allow.extend(heard.iter().cloned());
    imports.extend(heard.iter().map(|s| import(Kind::Stream, s.clone(), None)));
    let title = format!("Node {node}: its provisioner client and engine (`{user}`) and its leaf server (`{leaf}`,");
    let mut account = Account::new(
        &node_account_name(node),
        &[
            &title,
            "deploy/leaf-node.conf) are one party. Nothing else exists in this account: no other node's",
            "subjects, no JetStream API, no stream to make.",
        ],
        vec![
            User { name: user, comment: lines(&["Its own node's notices (a value it holds changed) and its modules' state changes."]), grant: Some(grant) },
            User::plain(&leaf),
        ],
    );
    account.imports = imports;
    account
}

/// A party that writes one bucket of its own (a provider, a domain): what it asks and hears.
struct Writer {
    account: String,
    user: String,
    bucket: String,
    comment: &'static [&'static str],
    verbs: &'static [&'static str],
    hears_events: bool,
}

const PROVIDER_COMMENT: &[&str] = &[
    "A provider module: writes its own bound values; reads the needs it serves through the verb",
    "(narrowed to its kind, paged) and follows the events. It makes no consumer.",
];

fn provider(p: &str) -> Writer {
    Writer {
        account: provider_account_name(p),
        user: format!("provider-{p}"),
        bucket: bound(p),
        comment: PROVIDER_COMMENT,
        verbs: &[PROVISIONING],
        hears_events: true,
    }
}

/// The mesh's domains: each writes one bucket.
struct Domain {
    name: &'static str,
    bucket: &'static str,
    comment: &'static [&'static str],
    verbs: &'static [&'static str],
    hears_events: bool,
}

const DOMAINS: [Domain; 3] = [
    Domain {
        name: "mesh-config",
        bucket: "mesh-config_values",
        comment: &["The config domain: writes the values of `config` needs."],
        verbs: &[],
        hears_events: false,
    },
    Domain {
        name: "mesh-controller",
        bucket: "mesh-controller_assignments",
        comment: &["The controller: writes the assignments (each module's want), asks for plans, hears every", "module's state changes."],
        verbs: &[PLAN],
        hears_events: true,
    },
    Domain {
        name: "mesh-indexer",
        bucket: "mesh-indexer_builds",
        comment: &["The indexer: writes each module's newest build, asks for plans."],
        verbs: &[PLAN],
        hears_events: false,
    },
];

impl Domain {
    fn writer(&self) -> Writer {
        Writer {
            account: self.name.to_ascii_uppercase().replace('-', "_"),
            user: self.name.to_string(),
            bucket: self.bucket.to_string(),
            comment: self.comment,
            verbs: self.verbs,
            hears_events: self.hears_events,
        }
    }
}

fn provider_account(p: &str) -> Account {
    writer_account(provider(p))
}

fn domain_account(d: &Domain) -> Account {
    writer_account(d.writer())
}

fn writer_account(w: Writer) -> Account {
    let mut grant = Grant::default();
    let mut keys = Vec::new();
    writes(&mut grant, &mut keys, &w.bucket, "", &format!("KV_{}", w.bucket));
    let mut imports = Vec::new();
    asks(&mut grant, &mut imports, w.verbs);
    imports.extend(keys);
    grant.subscribe_allow = vec![format!("_INBOX_{}.>", w.user)];
    if w.hears_events {
        grant.subscribe_allow.push("mesh-provisioner.event.>".into());
        imports.push(import(Kind::Stream, "mesh-provisioner.event.>", None));
    }
    let mut account = Account::new(&w.account, w.comment, vec![User::granted(&w.user, &[], grant)]);
    account.imports = imports;
    account
}

fn vault_account() -> Account {
    let grant = Grant {
        publish_allow: strings(["$SRV.>"]),
        subscribe_allow: strings(["_INBOX_mesh-vault.>", "mesh-vault.>", "$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.*.mesh-vault", "$SRV.*.mesh-vault.>"]),
        allow_responses: true,
        ..Grant::default()
    };
    let mut account = Account::new(
        VAULT,
        &["The vault: answers its verbs and discovery (exported to MESH, for the provisioner's checks);", "holds no bucket."],
        vec![User::granted("mesh-vault", &[], grant)],
    );
    let mesh = [MESH.to_string()];
    account.exports = vec![Exports {
        comment: vec![],
        exports: ["$SRV.PING.mesh-vault", "$SRV.INFO.mesh-vault"].iter().map(|s| Export { response_stream: true, ..service(*s, &mesh) }).collect(),
    }];
    account
}

/// The buckets the provisioner makes and writes (registry, seat, states) and the ones it makes
/// when the operator has not (the three every node writes).
const OWN_BUCKETS: [&str; 3] = ["mesh-provisioner_registry", "mesh-provisioner_seat", "mesh-provisioner_states"];

fn provisioner_grant() -> Grant {
    let mut publish = strings(["$JS.API.INFO"]);
    publish.extend(OWN_BUCKETS.iter().chain(NODE_BUCKETS.iter()).map(|b| format!("$JS.API.STREAM.CREATE.KV_{b}")));
    // Reads of every stream of MESH: each is a bucket it serves or a node's share of one (read
    // for read-your-writes). Granted by stream-name wildcard, so a node or a provider joining
    // the mesh needs no change to this grant, nor a new connection.
    publish.extend(strings([
        "$JS.API.STREAM.INFO.*",
        "$JS.API.CONSUMER.CREATE.*",
        "$JS.API.CONSUMER.CREATE.*.>",
        "$JS.API.CONSUMER.DELETE.*.>",
        "$JS.API.DIRECT.GET.*",
        "$JS.API.DIRECT.GET.*.>",
        "$JS.API.STREAM.MSG.GET.*",
        "$JS.FC.>",
    ]));
    publish.extend(OWN_BUCKETS.iter().map(|b| format!("$KV.{b}.>")));
    publish.extend(strings([PROVISIONING, PLAN, "mesh-provisioner.notice.>", "mesh-provisioner.event.>", "$JS.API.STREAM.NAMES", "$SRV.>"]));
    Grant { publish_allow: publish, subscribe_allow: strings(["_INBOX_mesh-provisioner.>", "$JS.EVENT.ADVISORY.STREAM.CREATED.>"]), ..Grant::default() }
}

fn mesh_account(mesh: &Mesh) -> Account {
    let users = vec![
        User::granted(
            "mesh-provisioner",
            &[
                "The provisioner's own user, for its buckets: an allow list of exactly what it does",
                "(defence in depth: no other party is in this account). It creates and writes its own",
                "buckets (registry, seat, states; the node clients' needs, applied and collect it creates",
                "as one stream each if the operator has not made them of the nodes' shares) with the",
                "mesh's safe settings; it reads every stream of this account (stream info, ordered",
                "consumers for its mirrors, which it deletes, direct and message get): each is a bucket it",
                "serves or a node's share of one; it can delete, purge or update no stream and write no",
                "other bucket; it asks its own verbs and the $SRV discovery subjects, lists stream names",
                "and hears the stream-created advisories (only MESH's own streams'), and publishes the",
                "notices (mesh-provisioner.notice.<node>) and each module's state changes",
                "(mesh-provisioner.event.<node>; its status page is told them in process, never by the",
                "bus). It answers no request (no allow_responses).",
            ],
            provisioner_grant(),
        ),
        User::granted(
            "mesh-provisioner-service",
            &[
                "The provisioner's serving connection: it hears the two verbs and the micro-service",
                "discovery subjects, and may publish nothing but a reply to a request it was delivered",
                "(allow_responses). nats-server lets a reply go to whatever subject the request names,",
                "so the provisioner itself sends one only to an inbox (_INBOX, _INBOX_<user> or _R_).",
            ],
            Grant {
                publish_deny: strings([">"]),
                subscribe_allow: strings([PROVISIONING, PLAN, "$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.*.mesh-provisioner", "$SRV.*.mesh-provisioner.>"]),
                allow_responses: true,
                ..Grant::default()
            },
        ),
        User::granted(
            "mesh-operator",
            &[
                "The operator: makes the mesh's streams (`mesh-provisioner bootstrap`) with the safe",
                "settings and limits, and may manage them (update, purge, delete) and read them whole",
                "(its ordered consumers' flow control answered: a large bucket's listing never stalls);",
                "it writes no bucket.",
            ],
            Grant { publish_allow: strings(["$JS.API.>", "$JS.FC.>"]), subscribe_allow: strings(["_INBOX_mesh-operator.>"]), ..Grant::default() },
        ),
    ];
    let mut account = Account::new(MESH, &[], users);
    account.jetstream = true;
    let mut groups = vec![Exports {
        comment: lines(&[
            "The verbs and the provisioner's discovery: every party may ask. A discovery ping is",
            "answered by every instance (a stream of answers).",
        ]),
        exports: vec![
            service(PROVISIONING, &[]),
            service(PLAN, &[]),
            Export { response_stream: true, ..service(DISCOVERY[0], &[]) },
            Export { response_stream: true, ..service(DISCOVERY[1], &[]) },
        ],
    }];
    for node in &mesh.nodes {
        let to = [node_account_name(node)];
        let (stream_name, composed) = (node_stream(node), composed(node));
        let mut exports: Vec<Export> = NODE_BUCKETS.iter().map(|b| service(format!("$KV.{b}.{node}.>"), &to)).collect();
        exports.extend([
            service(format!("$JS.API.STREAM.INFO.{stream_name}"), &to),
            service(format!("$JS.API.DIRECT.GET.{stream_name}.>"), &to),
            service(format!("$KV.{composed}.>"), &to),
            service(format!("$JS.API.STREAM.INFO.KV_{composed}"), &to),
            service(format!("$JS.API.DIRECT.GET.KV_{composed}.$KV.{composed}.>"), &to),
            stream(format!("mesh-provisioner.notice.{node}"), &to),
            stream(format!("mesh-provisioner.event.{node}"), &to),
        ]);
        groups.push(Exports {
            comment: vec![format!(
                "Node {node}: its own keys and its share ({stream_name}: stream info and direct gets), its compositions, its notices and events."
            )],
            exports,
        });
    }
    let writers: Vec<Writer> = mesh.providers.iter().map(|p| provider(p)).chain(DOMAINS.iter().map(Domain::writer)).collect();
    let mut single = Vec::new();
    for w in &writers {
        let to = [w.account.clone()];
        single.extend([
            service(format!("$KV.{}.>", w.bucket), &to),
            service(format!("$JS.API.STREAM.INFO.KV_{}", w.bucket), &to),
            service(format!("$JS.API.DIRECT.GET.KV_{}.>", w.bucket), &to),
        ]);
    }
    groups.push(Exports { comment: lines(&["Single-writer buckets: each writer, its own."]), exports: single });
    let hearers: Vec<String> = writers.iter().filter(|w| w.hears_events).map(|w| w.account.clone()).collect();
    groups.push(Exports {
        comment: lines(&["Every module's state changes, for the controller and the providers."]),
        exports: vec![stream("mesh-provisioner.event.>", &hearers)],
    });
    account.exports = groups;
    account.imports_comment = lines(&[
        "The vault's discovery, for the provisioner's checks (`answered`); its verbs are the",
        "nodes' to ask (a mesh that routes them imports them into each node's account).",
    ]);
    account.imports = ["$SRV.PING.mesh-vault", "$SRV.INFO.mesh-vault"]
        .iter()
        .map(|s| Import { kind: Kind::Service, account: VAULT.into(), subject: s.to_string(), local: None })
        .collect();
    account
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Mesh {
        Mesh::new(vec!["alpha".into(), "beta".into()], vec!["postgres".into()]).expect("a mesh")
    }

    #[test]
    fn refuses_a_name_that_is_not_a_lowercase_token() {
        for bad in ["", "Alpha", "a.b", "a*", "a>", "-a", "a b", &"x".repeat(MAX_NAME + 1)] {
            let e = Mesh::new(vec![bad.to_string()], vec![]).expect_err(bad);
            assert!(e.message().contains("is not a name"), "{bad}: {}", e.message());
        }
        assert!(Mesh::new(vec!["node-7_b".into(), "x".repeat(MAX_NAME)], vec![]).is_ok());
    }

    #[test]
    fn refuses_a_name_given_twice_or_no_node() {
        let e = Mesh::new(vec!["a".into()], vec!["a".into()]).expect_err("twice");
        assert!(e.message().contains("named twice"), "{}", e.message());
        let e = Mesh::new(vec![], vec!["p".into()]).expect_err("no node");
        assert!(e.message().contains("at least one node"), "{}", e.message());
    }

    #[test]
    fn every_party_is_an_account_of_its_own() {
        let names: Vec<String> = example().accounts().into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["MESH", "NODE_ALPHA", "NODE_BETA", "PROVIDER_POSTGRES", "MESH_CONFIG", "MESH_CONTROLLER", "MESH_INDEXER", "MESH_VAULT", "SYS"]);
    }

    #[test]
    fn a_node_writes_its_own_keys_and_no_other_nodes() {
        let accounts = example().accounts();
        let alpha = accounts.iter().find(|a| a.name == "NODE_ALPHA").expect("alpha");
        let grant = alpha.users[0].grant.as_ref().expect("a grant");
        assert!(grant.publish_allow.contains(&"$KV.mesh-provisioner_needs.alpha.>".to_string()));
        for s in grant.publish_allow.iter().chain(alpha.imports.iter().map(|i| &i.subject)) {
            assert!(!s.contains("beta"), "alpha's grant names beta: {s}");
        }
        assert!(alpha.imports.iter().all(|i| i.account == MESH));
    }

    #[test]
    fn every_import_is_exported_to_its_importer() {
        let accounts = example().accounts();
        for a in &accounts {
            for i in &a.imports {
                let from = accounts.iter().find(|x| x.name == i.account).expect("the exporter exists");
                let covered = from.all_exports().any(|e| {
                    e.kind == i.kind && crate::base::wire::contains(&e.subject, &i.subject) && (e.accounts.is_empty() || e.accounts.contains(&a.name))
                });
                assert!(covered, "{}'s import of {} from {} is exported to it", a.name, i.subject, i.account);
            }
        }
    }

    #[test]
    fn placeholders_name_each_user() {
        let accounts = example().accounts();
        let users: Vec<String> = accounts.iter().flat_map(|a| a.users.iter().map(User::placeholder)).collect();
        assert!(users.contains(&"PASSWORD_PROVISIONER".to_string()));
        assert!(users.contains(&"PASSWORD_PROVISIONER_SERVICE".to_string()));
        assert!(users.contains(&"PASSWORD_NODE_ALPHA".to_string()));
        assert!(users.contains(&"PASSWORD_LEAF_BETA".to_string()));
        assert!(users.contains(&"PASSWORD_SYSTEM".to_string()));
    }
}
