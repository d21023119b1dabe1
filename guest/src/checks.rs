//! Places, checks and generations: where a need's value is found (`Place`), what a check of it
//! finds now (`Check`, made by [`check`]: the registry's place read, a bucket's existence,
//! discovery, the provider's assignments), and whether a holder runs the value at its place
//! (`Currency`, `Generation`). Below `status` and `holders`, which both answer with them; it
//! answers nothing itself.

use std::borrow::Cow;

use serde::ser::Serializer;
use serde::Serialize;
use serde_json::Value;

use crate::env::{Env, HostError};
use crate::escape::is_identifier;
use crate::keys::{parse_assignment, APPLIED, ASSIGNMENTS};
use crate::provision::{self, Need, Resolved};
use crate::reconcile::scan_all;
use crate::value::{write_u64, Flat, Object};

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A value is at the key; `applied` is the revision its holder applied, when recorded.
    Present {
        revision: u64,
        applied: Option<u64>,
    },
    /// The holder applied an older revision than the one at its place now (SPEC §7.2).
    Stale {
        applied: u64,
        revision: u64,
    },
    /// A collection read: how many items it holds now, and the newest revision among them.
    Collected {
        items: usize,
        revision: u64,
    },
    Answered {
        responders: u32,
    },
    Missing,
    /// The provider is assigned to a node but applied on none of them (or, for a verb, not yet
    /// answering discovery): the value will come; `node` is the one waited for.
    ProviderPending {
        node: String,
    },
    NoProvider,
    Unanswered,
    NotInstalled,
    Unknown,
}

impl Check {
    /// Every name a check may have ([`Check::name`]).
    pub const NAMES: [&'static str; 9] =
        ["present", "answered", "stale", "missing", "provider_pending", "no_provider", "unanswered", "not_installed", "unknown"];

    pub fn name(&self) -> &'static str {
        match self {
            Check::Present { .. } | Check::Collected { .. } => "present",
            Check::Answered { .. } => "answered",
            Check::Stale { .. } => "stale",
            Check::Missing => "missing",
            Check::ProviderPending { .. } => "provider_pending",
            Check::NoProvider => "no_provider",
            Check::Unanswered => "unanswered",
            Check::NotInstalled => "not_installed",
            Check::Unknown => "unknown",
        }
    }
}

/// Where a need's value is found, as the registry resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Bucket { domain: Cow<'static, str>, bucket: Cow<'static, str>, place: String, filter: bool },
    Verb { domain: String, verb: String },
    Nowhere,
}

/// A module that provides values (a `bound` provider, a verb's service), where the controller
/// assigned it, and whether it is applied on each of those nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Provider {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    pub module: String,
    pub nodes: Vec<ProviderNode>,
    /// Nodes assigned past the [`MAX_PROVIDER_NODES`] listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub more_nodes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One node a provider is assigned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderNode {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    pub node: String,
    pub applied: bool,
}

/// Most nodes of a provider a need lists (a provider may run on every node of a mesh).
pub const MAX_PROVIDER_NODES: usize = 16;

impl Provider {
    /// The first node it is applied on, if any.
    pub fn applied_on(&self) -> Option<&str> {
        self.nodes.iter().find(|n| n.applied).map(|n| n.node.as_str())
    }

    /// The nodes listed, as `a, b (and 3 more)`.
    fn listed(&self) -> String {
        let mut s = self.nodes.iter().map(|n| n.node.as_str()).collect::<Vec<_>>().join(", ");
        if self.more_nodes > 0 {
            s.push_str(&format!(" (and {} more)", self.more_nodes));
        }
        s
    }
}

/// What one answer asks of its host at most once, however many of its modules need it: each
/// provider's assignments, each bucket's existence, each service's responders (every module of
/// a page reads the same values bucket and asks about the same service). An answer is one
/// reading of the mesh, so each is asked once within it.
#[derive(Default)]
pub(crate) struct Providers {
    providers: std::collections::BTreeMap<String, Result<Provider, HostError>>,
    exists: std::collections::BTreeMap<String, Result<bool, HostError>>,
    responders: std::collections::BTreeMap<String, Result<u32, HostError>>,
}

impl Providers {
    pub fn new() -> Providers {
        Providers::default()
    }

    fn exists(&mut self, env: &dyn Env, bucket: &str) -> Result<bool, HostError> {
        self.exists.entry(bucket.to_string()).or_insert_with(|| env.exists(bucket)).clone()
    }

    fn responders(&mut self, env: &dyn Env, service: &str) -> Result<u32, HostError> {
        self.responders.entry(service.to_string()).or_insert_with(|| env.responders(service)).clone()
    }
}

/// [`provider`], looked up at most once across calls sharing `asked`.
fn provider_once(env: &dyn Env, module: &str, asked: &mut Providers) -> Result<Provider, HostError> {
    asked.providers.entry(module.to_string()).or_insert_with(|| provider(env, module)).clone()
}

/// Where `module` is assigned (the controller's `<node>.<module>` keys) and whether it is
/// applied there. Every assigned node is looked at, so "applied somewhere" is never missed past
/// the listed ones: an applied node is listed first.
pub(crate) fn provider(env: &dyn Env, module: &str) -> Result<Provider, HostError> {
    let mut nodes = Vec::new();
    if is_identifier(module) {
        for e in scan_all(env, ASSIGNMENTS, &format!("*.{module}"))? {
            let Ok(k) = parse_assignment(&e.key) else { continue };
            let applied = env.get(APPLIED, &e.key)?.is_some();
            nodes.push(ProviderNode { node: k.node, applied });
        }
    }
    // Applied ones first, each group in key order, so a cut keeps the one that answers.
    nodes.sort_by_key(|n| !n.applied);
    let more_nodes = nodes.len().saturating_sub(MAX_PROVIDER_NODES);
    nodes.truncate(MAX_PROVIDER_NODES);
    Ok(Provider { module: module.to_string(), nodes, more_nodes })
}

/// The applied record, as far as it can be read.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub build: Option<String>,
    pub needs: Option<u64>,
    pub at: Option<String>,
    pub parts: Option<Vec<String>>,
    /// The revision applied of each value, by `<kind>:<name>`.
    pub values: Option<std::collections::BTreeMap<String, u64>>,
    /// Why the record cannot be read, if it cannot.
    pub odd: Option<String>,
}

pub(crate) fn applied_record(value: &[u8]) -> Applied {
    let v: Value = match serde_json::from_slice(value) {
        Ok(v @ Value::Object(_)) => v,
        _ => return Applied { odd: Some("the applied record is not a JSON object".into()), ..Applied::default() },
    };
    let text = |f: &str| v.get(f).and_then(Value::as_str).map(str::to_string);
    let parts = match v.get("parts") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(a.iter().filter_map(Value::as_str).map(str::to_string).collect()),
        Some(_) => return Applied { odd: Some("the applied record's `parts` is not a list".into()), ..Applied::default() },
    };
    let values = match v.get("values") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o.iter().filter_map(|(k, r)| r.as_u64().map(|r| (k.clone(), r))).collect()),
        Some(_) => return Applied { odd: Some("the applied record's `values` is not an object".into()), ..Applied::default() },
    };
    Applied { build: text("build"), needs: v.get("needs").and_then(Value::as_u64), at: text("at"), parts, values, odd: None }
}

/// What one need's check found: where its value is, the check, why, and its provider.
pub(crate) struct Checked {
    pub place: Place,
    pub check: Check,
    pub reason: String,
    pub provider: Option<Provider>,
}

/// Checks one need of `module` on `node` now; `applied` is the applied record's revisions, by
/// `<kind>:<name>`.
///
/// A need with a provider module (a `bound` value's provider, a verb's service) is checked
/// against the provider first (SPEC §7.3): assigned nowhere is `no_provider` (nothing will
/// come); assigned but applied nowhere (a verb: not answering discovery) is `provider_pending`,
/// naming the node waited for; only then is the value itself read.
pub(crate) fn check(
    env: &dyn Env,
    node: &str,
    module: &str,
    need: &Need,
    parts: Option<&[String]>,
    applied: Option<&std::collections::BTreeMap<String, u64>>,
    providers: &mut Providers,
) -> Checked {
    let plain = |place, check, reason| Checked { place, check, reason, provider: None };
    if let (Some(part), Some(parts)) = (&need.part, parts) {
        if !parts.iter().any(|p| p == part) {
            let why = format!("part {part} is not installed on {node} (the applied record lists {})", parts.join(", "));
            return plain(Place::Nowhere, Check::NotInstalled, why);
        }
    }
    let resolved = provision::resolve(node, module, need);
    let waits_on = provision::waits_on(&resolved, &need.kind);
    match resolved {
        Resolved::Unanswered(why) => plain(Place::Nowhere, Check::Unanswered, why),
        Resolved::Malformed(why) => plain(Place::Nowhere, Check::Unanswered, format!("no domain can answer it: {why}")),
        Resolved::Verb { domain, verb } => {
            let place = Place::Verb { domain: domain.to_string(), verb: verb.to_string() };
            let assigned = provider_once(env, domain, providers);
            let (check, why) = match (providers.responders(env, domain), &assigned) {
                (Ok(n), _) if n > 0 => {
                    let mut why = String::new();
                    write_u64(&mut why, u64::from(n));
                    why.extend([" instance(s) of ", domain, " answer"]);
                    (Check::Answered { responders: n }, why)
                }
                (Err(e), _) => (Check::Unknown, format!("discovery of {domain} could not be made now: {e}")),
                (Ok(_), Err(e)) => (Check::Unknown, format!("no instance of {domain} answers discovery, and its assignments could not be read now: {e}")),
                (Ok(_), Ok(p)) => match p.nodes.first() {
                    None => (Check::NoProvider, format!("no instance of {domain} answers discovery ($SRV.PING.{domain}) and no node is assigned {domain}")),
                    Some(first) => {
                        let waited = p.nodes.iter().find(|n| !n.applied).unwrap_or(first).node.clone();
                        let why = format!("{domain} is assigned to {} but no instance answers discovery yet: waiting for {domain} on {waited}", p.listed());
                        (Check::ProviderPending { node: waited }, why)
                    }
                },
            };
            // A service run outside the modules (assigned nowhere, answering) names no provider.
            let provider = assigned.ok().filter(|p| !p.nodes.is_empty());
            Checked { place, check, reason: why, provider }
        }
        Resolved::Bucket { domain, bucket, place, wild, .. } => {
            // A value a provider module writes: nothing will come unless it is assigned, and
            // nothing yet until it is applied somewhere.
            let provided = waits_on.is_some();
            let mut provided_by = None;
            if provided {
                match provider_once(env, &domain, providers) {
                    Err(e) => {
                        let why = format!("the assignments of provider {domain} could not be read now: {e}");
                        return plain(Place::Bucket { domain, bucket, place, filter: wild }, Check::Unknown, why);
                    }
                    Ok(p) if p.nodes.is_empty() => {
                        let why = format!("no node is assigned provider {domain} ({ASSIGNMENTS} has no *.{domain}): nothing will write {bucket}");
                        return Checked {
                            place: Place::Bucket { domain, bucket, place, filter: wild },
                            check: Check::NoProvider,
                            reason: why,
                            provider: Some(p),
                        };
                    }
                    Ok(p) if p.applied_on().is_none() => {
                        let waited = p.nodes[0].node.clone();
                        let why = format!("provider {domain} is assigned to {} and applied on none yet: waiting for {domain} on {waited}", p.listed());
                        return Checked {
                            place: Place::Bucket { domain, bucket, place, filter: wild },
                            check: Check::ProviderPending { node: waited },
                            reason: why,
                            provider: Some(p),
                        };
                    }
                    Ok(p) => provided_by = Some(p),
                }
            }
            let (check, why) = match providers.exists(env, &bucket) {
                Err(e) => (Check::Unknown, format!("{bucket} could not be read now: {e}")),
                Ok(false) if provided => {
                    let on = provided_by.as_ref().and_then(|p| p.applied_on()).unwrap_or_default().to_string();
                    (Check::Missing, format!("bucket {bucket} does not exist yet: provider {domain} is applied on {on} and has written nothing"))
                }
                Ok(false) => (Check::NoProvider, format!("bucket {bucket} does not exist: {domain} is not installed")),
                Ok(true) if wild => match scan_all(env, &bucket, &place) {
                    Ok(items) => {
                        let revision = items.iter().map(|e| e.revision).max().unwrap_or(0);
                        (Check::Collected { items: items.len(), revision }, format!("the collection holds {} item(s)", items.len()))
                    }
                    Err(e) => (Check::Unknown, format!("{bucket} could not be read now: {e}")),
                },
                Ok(true) => match env.get(&bucket, &place) {
                    Ok(Some(e)) => {
                        let value = [need.kind.as_str(), ":", &need.name].concat();
                        match applied.and_then(|a| a.get(&value)).copied() {
                            Some(a) if a < e.revision => {
                                let mut why = [value.as_str(), " was applied at revision "].concat();
                                write_u64(&mut why, a);
                                why.push_str("; revision ");
                                write_u64(&mut why, e.revision);
                                why.extend([" is at ", &bucket, " ", &place, " now"]);
                                (Check::Stale { applied: a, revision: e.revision }, why)
                            }
                            Some(a) => {
                                let mut why = String::from("revision ");
                                write_u64(&mut why, e.revision);
                                why.extend([" is at ", &bucket, " ", &place, ", as applied"]);
                                (Check::Present { revision: e.revision, applied: Some(a) }, why)
                            }
                            None => (Check::Present { revision: e.revision, applied: None }, ["a value is at ", &bucket, " ", &place].concat()),
                        }
                    }
                    // Every need's check says its reason: joined by hand, as `format!` costs a
                    // component several times a few appends.
                    Ok(None) => (Check::Missing, ["no value at ", &bucket, " ", &place].concat()),
                    Err(e) => (Check::Unknown, format!("{bucket} could not be read now: {e}")),
                },
            };
            Checked { place: Place::Bucket { domain, bucket, place, filter: wild }, check, reason: why, provider: provided_by }
        }
    }
}

impl Place {
    /// Flattened into a need or a holder: `domain` and `bucket` + `key` (or `filter`), or
    /// `domain` and `verb`; nothing for a need nowhere.
    pub fn fields(&self) -> Flat<&str, 3> {
        match self {
            Place::Bucket { domain, bucket, place, filter } => {
                Flat::new().with("domain", &**domain).with("bucket", &**bucket).with(if *filter { "filter" } else { "key" }, place.as_str())
            }
            Place::Verb { domain, verb } => Flat::new().with("domain", domain.as_str()).with("verb", verb.as_str()),
            Place::Nowhere => Flat::new(),
        }
    }
}

impl Serialize for Place {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.fields().serialize(s)
    }
}

impl Check {
    /// Flattened into a need: what its check found (revisions, items, responders).
    pub fn fields(&self) -> Flat<u64, 2> {
        match *self {
            Check::Present { revision, applied } => {
                let f = Flat::new().with("revision", revision);
                match applied {
                    Some(a) => f.with("applied_revision", a),
                    None => f,
                }
            }
            Check::Stale { applied, revision } => Flat::new().with("revision", revision).with("applied_revision", applied),
            Check::Collected { items, revision } => Flat::new().with("items", items as u64).with("revision", revision),
            Check::Answered { responders } => Flat::new().with("responders", u64::from(responders)),
            _ => Flat::new(),
        }
    }
}

impl Serialize for Check {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.fields().serialize(s)
    }
}

impl Provider {
    /// Written into a need's line as serde writes it (the derive stays, for holders and the
    /// schema; `a_status_line_is_written_as_serde_writes_it` holds the two equal).
    pub fn write(&self, o: &mut Object) {
        o.str("module", &self.module);
        o.objects("nodes", &self.nodes, |o, n| {
            o.str("node", &n.node);
            o.bool("applied", n.applied);
        });
        if self.more_nodes > 0 {
            o.u64("more_nodes", self.more_nodes as u64);
        }
    }
}

/// `Place` and `Check` are written by hand (above); their schemas say the same maps.
#[cfg(feature = "schema")]
mod schema {
    use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
    use std::borrow::Cow;

    impl JsonSchema for super::Place {
        fn schema_name() -> Cow<'static, str> {
            "Place".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "description": "Where the value is: a bucket and a key (or a subject filter), or a verb; nothing for a need no domain answers.",
                "type": "object",
                "properties": {
                    "domain": { "type": "string" },
                    "bucket": { "type": "string" },
                    "key": { "type": "string" },
                    "filter": { "type": "string" },
                    "verb": { "type": "string" }
                },
                "dependentRequired": { "bucket": ["domain"], "verb": ["domain"], "key": ["bucket"], "filter": ["bucket"] }
            })
        }
    }

    impl JsonSchema for super::Check {
        fn schema_name() -> Cow<'static, str> {
            "Found".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "description": "What the check found: the revision at the place (and the one its holder applied), a collection's items, a verb's responders.",
                "type": "object",
                "properties": {
                    "revision": { "type": "integer", "minimum": 0 },
                    "applied_revision": { "type": "integer", "minimum": 0 },
                    "items": { "type": "integer", "minimum": 0 },
                    "responders": { "type": "integer", "minimum": 0 }
                }
            })
        }
    }
}

/// Whether a holder runs what is at its place now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Currency {
    Current,
    Stale,
    NeverApplied,
    Unknown,
}

impl Currency {
    pub const ALL: [Currency; 4] = [Currency::Current, Currency::Stale, Currency::NeverApplied, Currency::Unknown];

    pub fn name(self) -> &'static str {
        match self {
            Currency::Current => "current",
            Currency::Stale => "stale",
            Currency::NeverApplied => "never_applied",
            Currency::Unknown => "unknown",
        }
    }
}

/// A holder's currency: what it applied (`applied`), what is at its place now (`now`), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub currency: Currency,
    pub applied: Option<u64>,
    pub now: Option<u64>,
    pub reason: String,
}

/// Why a holder's currency is what it is: [`Generation::reason`] before it is written.
enum Why {
    NeverApplied,
    NoValues,
    NotNamed,
    Verb,
    Unreadable,
    Gone(u64),
    Runs(u64),
    Behind { applied: u64, now: u64 },
    Ahead { applied: u64, now: u64 },
}

/// The comparison [`generation`] words and [`currency`] does not: a state needs only the
/// currency, and writing every need's reason for nothing was a tenth of a module's status.
/// `now` is the revision the check found at the need's place ([`revision_now`]).
fn judge(check: &Check, now: Option<u64>, record: Option<&Applied>, kind: &str, name: &str) -> (Currency, Option<u64>, Why) {
    let Some(record) = record else {
        return (Currency::NeverApplied, None, Why::NeverApplied);
    };
    let applied = record.values.as_ref().and_then(|v| v.get(&[kind, ":", name].concat())).copied();
    let not_named = if record.values.is_none() { Why::NoValues } else { Why::NotNamed };
    match (check, now, applied) {
        (Check::Answered { .. }, ..) => (Currency::Unknown, None, Why::Verb),
        (Check::NoProvider | Check::ProviderPending { .. } | Check::Unanswered | Check::Unknown | Check::NotInstalled, ..) => {
            (Currency::Unknown, applied, Why::Unreadable)
        }
        (_, Some(_), None) | (_, None, None) => (Currency::Unknown, None, not_named),
        (_, None, Some(a)) => (Currency::Stale, Some(a), Why::Gone(a)),
        (_, Some(r), Some(a)) if a == r => (Currency::Current, Some(a), Why::Runs(r)),
        (_, Some(r), Some(a)) if a < r => (Currency::Stale, Some(a), Why::Behind { applied: a, now: r }),
        (_, Some(r), Some(a)) => (Currency::Unknown, Some(a), Why::Ahead { applied: a, now: r }),
    }
}

/// The revision a check found at the need's place, if it found one.
fn revision_now(check: &Check) -> Option<u64> {
    match check {
        Check::Present { revision, .. } | Check::Stale { revision, .. } => Some(*revision),
        Check::Collected { items, revision } if *items > 0 => Some(*revision),
        _ => None,
    }
}

/// Compares what the holder applied (its applied record, if any) with what a check found at
/// the need's place now, for the need `<kind>:<name>`.
pub(crate) fn generation(check: &Check, record: Option<&Applied>, kind: &str, name: &str) -> Generation {
    let now = revision_now(check);
    let (currency, applied, why) = judge(check, now, record, kind, name);
    let reason = match why {
        Why::NeverApplied => format!("no applied record: {kind}:{name} was never applied here"),
        Why::NoValues => "the applied record has no `values`: which revision was applied cannot be said".to_string(),
        Why::NotNamed => format!("the applied record's `values` names no revision of {kind}:{name}"),
        Why::Verb => "a verb answers it: there is no revision to compare".into(),
        Why::Unreadable => format!("its place cannot be read now ({})", check.name()),
        Why::Gone(a) => format!("revision {a} was applied; no value is at its place now"),
        Why::Runs(r) => format!("runs revision {r}, the one at its place"),
        Why::Behind { applied, now } => format!("runs revision {applied}; revision {now} is at its place now"),
        Why::Ahead { applied, now } => format!("the applied record names revision {applied}, newer than revision {now} at its place"),
    };
    Generation { currency, applied, now, reason }
}

/// [`generation`]'s currency alone.
pub(crate) fn currency(check: &Check, record: Option<&Applied>, kind: &str, name: &str) -> Currency {
    judge(check, revision_now(check), record, kind, name).0
}
