//! Module status (SPEC §7.1): every module's state, and each of its needs checked now, not read
//! from a record.
//!
//! A module is known from its assignment, its applied record, its needs records, or (when a node
//! is asked) its node engine's compositions. Its needs are the union of its needs records and
//! its current plan's needs, by kind and name. Each need is checked where the registry says its
//! value lives: a bucket key is read from the mirror (`present` with its revision, `missing`, or
//! `no_provider` when the bucket does not exist), a verb's service is asked by discovery only
//! (`answered` with the responder count, or `no_provider`); a value newer than the revision its
//! holder applied (the applied record's `values`) is `stale`; a need of a part the applied record
//! does not list is `not_installed`, a kind no domain answers `unanswered`, and a check that
//! cannot be made now is `unknown`, never passing. The module's state follows, `blocked` first,
//! then `degraded`. Everything here is decided in the guest; the host only answers reads.

use serde_json::Value;

use crate::env::{Env, Health, HostError};
use crate::escape::{is_identifier, shorten};
use crate::registry;
use crate::keys::{composed, parse_applied, parse_assignment, parse_composed, parse_need, APPLIED, ASSIGNMENTS, NEEDS};
use crate::plan;
use crate::provision::{self, Need, Resolved};
use crate::reconcile::scan_all;
use crate::value::{raw, sources, to_json};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;
use crate::verb::{Code, Reply};

/// Most modules one page of status holds: each costs a plan and a check per need.
pub const MAX_MODULES: u32 = 200;
/// Most needs keys read to find one page's modules; past it the page ends early (with `next`).
const MAX_NEEDS_READ: usize = 20_000;

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A value is at the key; `applied` is the revision its holder applied, when recorded.
    Present { revision: u64, applied: Option<u64> },
    /// The holder applied an older revision than the one at its place now (SPEC §7.2).
    Stale { applied: u64, revision: u64 },
    /// A collection read: how many items it holds now, and the newest revision among them.
    Collected { items: usize, revision: u64 },
    Answered { responders: u32 },
    Missing,
    /// The provider is assigned to a node but applied on none of them (or, for a verb, not yet
    /// answering discovery): the value will come; `node` is the one waited for.
    ProviderPending { node: String },
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
    Bucket { domain: String, bucket: String, place: String, filter: bool },
    Verb { domain: String, verb: String },
    Nowhere,
}

/// One need of a module, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeedStatus {
    pub kind: String,
    pub name: String,
    pub part: Option<String>,
    pub recorded: bool,
    pub planned: bool,
    pub place: Place,
    pub check: Check,
    pub reason: String,
    /// For a bucket answer: whether the module runs the value at its place now (SPEC §7.2).
    pub generation: Option<crate::holders::Currency>,
    /// The module that provides the value, where one does (SPEC §7.3).
    pub provider: Option<Provider>,
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
    fn applied_on(&self) -> Option<&str> {
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

/// Each provider's assignments as looked up once for a whole answer: every module of a page
/// that needs a secret asks about the same service.
pub(crate) type Providers = std::collections::BTreeMap<String, Result<Provider, HostError>>;

/// [`provider`], looked up at most once across calls sharing `asked`.
fn provider_once(env: &dyn Env, module: &str, asked: &mut Providers) -> Result<Provider, HostError> {
    asked.entry(module.to_string()).or_insert_with(|| provider(env, module)).clone()
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

/// A module's state (SPEC §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    NeverRan,
    Pending,
    NothingNeeded,
    Applied,
    Degraded,
    Blocked,
}

impl State {
    pub const ALL: [State; 6] = [State::NeverRan, State::Pending, State::NothingNeeded, State::Applied, State::Degraded, State::Blocked];

    pub fn name(self) -> &'static str {
        match self {
            State::NeverRan => "never_ran",
            State::Pending => "pending",
            State::NothingNeeded => "nothing_needed",
            State::Applied => "applied",
            State::Degraded => "degraded",
            State::Blocked => "blocked",
        }
    }
}

/// A key in a module's scope that does not fit its bucket's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OutOfShape {
    pub key: String,
    pub bucket: &'static str,
    pub revision: u64,
    pub reason: String,
}

/// One module's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleStatus {
    pub node: String,
    pub module: String,
    pub want: Option<String>,
    pub have: Option<String>,
    pub applied_at: Option<String>,
    pub state: State,
    pub reason: String,
    /// Since when it has been in `state`, as the seat's holder recorded it (SPEC §7.3); `None`
    /// until the holder records this state.
    pub since: Option<String>,
    pub needs: Vec<NeedStatus>,
    pub out_of_shape: Vec<OutOfShape>,
    /// What is wrong with the buckets its status read (unsafe settings, its node past its
    /// quota).
    pub warnings: Vec<String>,
    /// The newest revision among what was read.
    pub revision: u64,
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
    match provision::resolve(node, module, need) {
        Resolved::Unanswered(why) => plain(Place::Nowhere, Check::Unanswered, why),
        Resolved::Malformed(why) => plain(Place::Nowhere, Check::Unanswered, format!("no domain can answer it: {why}")),
        Resolved::Verb { domain, verb } => {
            let place = Place::Verb { domain: domain.to_string(), verb: verb.to_string() };
            let assigned = provider_once(env, domain, providers);
            let (check, why) = match (env.responders(domain), &assigned) {
                (Ok(n), _) if n > 0 => (Check::Answered { responders: n }, format!("{n} instance(s) of {domain} answer")),
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
            let provided = registry::lookup(&need.kind).is_some_and(|d| d.owner == "<provider>");
            let mut provided_by = None;
            if provided {
                match provider_once(env, &domain, providers) {
                    Err(e) => {
                        let why = format!("the assignments of provider {domain} could not be read now: {e}");
                        return plain(Place::Bucket { domain, bucket, place, filter: wild }, Check::Unknown, why);
                    }
                    Ok(p) if p.nodes.is_empty() => {
                        let why = format!("no node is assigned provider {domain} ({ASSIGNMENTS} has no *.{domain}): nothing will write {bucket}");
                        return Checked { place: Place::Bucket { domain, bucket, place, filter: wild }, check: Check::NoProvider, reason: why, provider: Some(p) };
                    }
                    Ok(p) if p.applied_on().is_none() => {
                        let waited = p.nodes[0].node.clone();
                        let why = format!("provider {domain} is assigned to {} and applied on none yet: waiting for {domain} on {waited}", p.listed());
                        return Checked { place: Place::Bucket { domain, bucket, place, filter: wild }, check: Check::ProviderPending { node: waited }, reason: why, provider: Some(p) };
                    }
                    Ok(p) => provided_by = Some(p),
                }
            }
            let (check, why) = match env.exists(&bucket) {
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
                        let value = format!("{}:{}", need.kind, need.name);
                        match applied.and_then(|a| a.get(&value)).copied() {
                            Some(a) if a < e.revision => (
                                Check::Stale { applied: a, revision: e.revision },
                                format!("{value} was applied at revision {a}; revision {} is at {bucket} {place} now", e.revision),
                            ),
                            Some(a) => (Check::Present { revision: e.revision, applied: Some(a) }, format!("revision {} is at {bucket} {place}, as applied", e.revision)),
                            None => (Check::Present { revision: e.revision, applied: None }, format!("a value is at {bucket} {place}")),
                        }
                    }
                    Ok(None) => (Check::Missing, format!("no value at {bucket} {place}")),
                    Err(e) => (Check::Unknown, format!("{bucket} could not be read now: {e}")),
                },
            };
            Checked { place: Place::Bucket { domain, bucket, place, filter: wild }, check, reason: why, provider: provided_by }
        }
    }
}

/// The first few `kind:name (reason)` of `needs`, for a module's reason.
fn summary(needs: &[&NeedStatus]) -> String {
    const SHOWN: usize = 3;
    let mut s: Vec<String> = needs.iter().take(SHOWN).map(|n| format!("{}:{} ({})", n.kind, n.name, n.reason)).collect();
    if needs.len() > SHOWN {
        s.push(format!("and {} more", needs.len() - SHOWN));
    }
    s.join("; ")
}

/// Each bucket's health as asked once for a whole answer: every module of a page reads the
/// needs' and the applied records' buckets.
type Healths = std::collections::BTreeMap<String, Result<Health, HostError>>;

/// What a whole answer asks once, however many modules read it.
#[derive(Default)]
struct Asked {
    healths: Healths,
    providers: Providers,
}

/// The status of `module` on `node`, checked now.
pub fn module(env: &dyn Env, node: &str, module: &str) -> Result<ModuleStatus, HostError> {
    module_with(env, node, module, &mut Asked::default())
}

/// As [`module`], asking each bucket's health and each provider's assignments at most once
/// across calls sharing `asked`.
fn module_with(env: &dyn Env, node: &str, module: &str, asked: &mut Asked) -> Result<ModuleStatus, HostError> {
    let pair = format!("{node}.{module}");
    let plan = plan::compute(env, node, module, false)?;
    let mut out_of_shape = Vec::new();
    let mut revision = 0;

    let applied = env.get(APPLIED, &pair)?;
    revision = applied.as_ref().map_or(revision, |e| e.revision.max(revision));
    let record = applied.as_ref().map(|e| applied_record(&e.value));

    // The needs: recorded first (in key order), then the plan's that were not recorded.
    let mut needs: Vec<(Need, bool, bool)> = Vec::new();
    for e in scan_all(env, NEEDS, &format!("{pair}.>"))? {
        revision = revision.max(e.revision);
        match parse_need(&e.key) {
            Ok(k) => {
                let part = serde_json::from_slice::<Value>(&e.value).ok().and_then(|v| v.get("part").and_then(Value::as_str).map(str::to_string));
                needs.push((Need { kind: k.kind, name: k.name, part }, true, false));
            }
            Err(reason) => out_of_shape.push(OutOfShape { bucket: NEEDS, key: e.key, revision: e.revision, reason }),
        }
    }
    for bucket in [APPLIED, ASSIGNMENTS] {
        for e in scan_all(env, bucket, &format!("{pair}.>"))? {
            let parsed = if bucket == APPLIED { parse_applied(&e.key) } else { parse_assignment(&e.key) };
            let reason = parsed.err().unwrap_or_default();
            out_of_shape.push(OutOfShape { bucket, key: e.key, revision: e.revision, reason });
        }
    }
    let planned = plan.entries.first().and_then(|e| e.plan.as_ref());
    let mut unreadable = Vec::new();
    for raw in planned.map(|(_, body)| body.needs.as_slice()).unwrap_or_default() {
        match provision::need(raw) {
            Ok(n) => match needs.iter_mut().find(|(have, _, _)| have.kind == n.kind && have.name == n.name) {
                Some((have, _, planned)) => {
                    *planned = true;
                    if have.part.is_none() {
                        have.part = n.part;
                    }
                }
                None => needs.push((n, false, true)),
            },
            Err(why) => unreadable.push(why),
        }
    }

    let parts = record.as_ref().and_then(|r| r.parts.as_deref());
    let values = record.as_ref().and_then(|r| r.values.as_ref());
    let mut checked: Vec<NeedStatus> = needs
        .into_iter()
        .map(|(need, recorded, planned)| {
            let Checked { place, check, reason, provider } = check(env, node, module, &need, parts, values, &mut asked.providers);
            let generation = matches!(place, Place::Bucket { .. })
                .then(|| crate::holders::generation(&check, record.as_ref(), &format!("{}:{}", need.kind, need.name)).currency);
            NeedStatus { kind: need.kind, name: need.name, part: need.part, recorded, planned, place, check, reason, generation, provider }
        })
        .collect();
    for why in unreadable {
        checked.push(NeedStatus {
            kind: String::new(),
            name: String::new(),
            part: None,
            recorded: false,
            planned: true,
            place: Place::Nowhere,
            check: Check::Unanswered,
            reason: format!("the plan lists a need that cannot be read: {why}"),
            generation: None,
            provider: None,
        });
    }

    let (state, reason) = state(node, module, &plan, record.as_ref(), &checked);
    let since = crate::record::since(env, node, module, state.name());
    let warnings = warnings(env, node, &checked, &mut asked.healths);
    for n in &checked {
        if let Check::Present { revision: r, .. } | Check::Collected { revision: r, .. } | Check::Stale { revision: r, .. } = n.check {
            revision = revision.max(r);
        }
    }
    Ok(ModuleStatus {
        node: node.into(),
        module: module.into(),
        want: plan.want.clone(),
        have: record.as_ref().and_then(|r| r.build.clone()),
        applied_at: record.as_ref().and_then(|r| r.at.clone()),
        state,
        reason,
        since,
        needs: checked,
        out_of_shape,
        warnings,
        revision,
    })
}

/// The module's state and its reason, from its needs' checks and its applied record.
fn state(node: &str, module: &str, plan: &plan::Plan, applied: Option<&Applied>, needs: &[NeedStatus]) -> (State, String) {
    // A need of a part not installed counts for nothing.
    let counted: Vec<&NeedStatus> = needs.iter().filter(|n| n.check != Check::NotInstalled).collect();
    let with = |f: fn(&Check) -> bool| counted.iter().copied().filter(|n| f(&n.check)).collect::<Vec<_>>();
    let blocked = with(|c| matches!(c, Check::Unanswered | Check::NoProvider));
    if !blocked.is_empty() {
        return (State::Blocked, format!("{} need(s) cannot be satisfied now: {}", blocked.len(), summary(&blocked)));
    }
    let waiting = with(|c| matches!(c, Check::ProviderPending { .. }));
    if !waiting.is_empty() {
        // Each need's reason names the provider and the node it waits for.
        return (State::Pending, format!("{} need(s) wait for a provider: {}", waiting.len(), summary(&waiting)));
    }
    let unknown = with(|c| *c == Check::Unknown);
    let unknown_note = if unknown.is_empty() { String::new() } else { format!("; {} check(s) could not be made now: {}", unknown.len(), summary(&unknown)) };
    let Some(applied) = applied else {
        if counted.is_empty() && needs.is_empty() {
            let known = match (&plan.want, plan.entries.is_empty()) {
                (Some(w), _) => format!("assigned (want {w})"),
                (None, false) => "composed".to_string(),
                (None, true) => "known".to_string(),
            };
            return (State::NeverRan, format!("{module} on {node} is {known}, but has no applied record and no needs recorded: its provisioning never ran"));
        }
        return (State::Pending, format!("{} need(s) recorded or planned, nothing applied yet{unknown_note}", needs.len()));
    };
    let build = applied.build.as_deref().unwrap_or("an unnamed build");
    let missing = with(|c| matches!(c, Check::Missing | Check::Stale { .. }));
    if !missing.is_empty() {
        return (State::Degraded, format!("applied {build}, but {} grant(s) no longer hold: {}{unknown_note}", missing.len(), summary(&missing)));
    }
    if !unknown.is_empty() {
        // Never better than it is: a check not made is not a check passed.
        return (State::Degraded, format!("applied {build}, but {} check(s) could not be made now: {}", unknown.len(), summary(&unknown)));
    }
    if let Some(odd) = &applied.odd {
        return (State::Degraded, format!("applied, but {odd}"));
    }
    if counted.is_empty() && applied.needs == Some(0) {
        return (State::NothingNeeded, format!("applied {build} with nothing needed"));
    }
    let skipped = needs.len() - counted.len();
    let skipped = if skipped == 0 { String::new() } else { format!(" ({skipped} of parts not installed)") };
    (State::Applied, format!("applied {build}: every need's check passes now ({} need(s){skipped})", counted.len()))
}

/// A node and a module.
pub(crate) type Pair = (String, String);

/// A page of modules: the `(node, module)` pairs after `after`, in key order of `<node>.<module>`.
struct Modules {
    pairs: Vec<Pair>,
    /// With more to come: the position up to which this page is complete (its last module, or
    /// further when a source read past it found no module there), where the next page starts.
    upto: Option<String>,
}

/// The identifiers `(node, module)` a key's first two tokens name, if they are identifiers.
pub(crate) fn pair_of(key: &str) -> Option<Pair> {
    let mut t = key.split('.');
    let (n, m) = (t.next()?, t.next()?);
    (is_identifier(n) && is_identifier(m)).then(|| (n.to_string(), m.to_string()))
}

pub(crate) fn join(p: &Pair) -> String {
    format!("{}.{}", p.0, p.1)
}

/// The modules one source names: those read, and the last module up to which it is complete
/// (`None`: read to its end).
pub(crate) struct Source {
    pub found: Vec<Pair>,
    pub horizon: Option<String>,
}

/// Modules from a bucket keyed by `<node>.<module>` (assignments, applied): its key order is
/// the page's order, so the first `limit + 1` after `after` are exactly its share.
pub(crate) fn keyed_by_pair(env: &dyn Env, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Source, HostError> {
    let page = env.scan(bucket, filter, after, limit + 1)?;
    let found: Vec<Pair> = page.entries.iter().filter_map(|e| parse_assignment(&e.key).ok().map(|k| (k.node, k.module))).collect();
    let horizon = page.more.then(|| page.entries.last().map(|e| e.key.clone())).flatten();
    Ok(Source { found, horizon })
}

/// Whether `bucket` holds any key matching `filter`.
fn any(env: &dyn Env, bucket: &str, filter: &str) -> Result<bool, HostError> {
    Ok(!env.scan(bucket, filter, None, 1)?.entries.is_empty())
}

/// A bucket whose keys start with a module's tokens: which keys, the module a key names, and
/// whether a module has any key.
pub(crate) struct Grouping<'a> {
    pub bucket: &'a str,
    pub filter: &'a str,
    pub module_of: &'a dyn Fn(&str) -> Option<Pair>,
    pub has: &'a dyn Fn(&Pair) -> Result<bool, HostError>,
}

/// Modules from a bucket whose keys start with a module's `<prefix>` tokens (needs:
/// `<node>.<module>.…`; a composition bucket: `<module>.…`). Its key order groups a module's keys
/// by `<prefix>.`, which sorts `app-x` before `app` ('-' < '.'), unlike the page's order: so after
/// reading, each module that extends a shorter one with `-` has that shorter one looked up too.
pub(crate) fn grouped(env: &dyn Env, g: &Grouping, cursor: Option<&str>, after: Option<&str>, limit: u32) -> Result<Source, HostError> {
    let Grouping { bucket, filter, module_of, has } = g;
    let mut found: Vec<Pair> = Vec::new();
    // Membership by hash: a page of thousands of modules must not cost their square.
    let mut seen: std::collections::HashSet<Pair> = std::collections::HashSet::new();
    let mut cursor = cursor.map(str::to_string);
    let (mut read, mut complete) = (0usize, false);
    let beyond = |p: &Pair| after.is_none_or(|a| join(p).as_str() > a);
    while found.len() <= limit as usize && read < MAX_NEEDS_READ {
        let page = env.scan(bucket, filter, cursor.as_deref(), 1000)?;
        read += page.entries.len();
        for e in &page.entries {
            if let Some(p) = module_of(&e.key).filter(beyond) {
                if found.last() != Some(&p) && seen.insert(p.clone()) {
                    found.push(p);
                }
            }
        }
        match (page.more, page.entries.last()) {
            (true, Some(last)) => cursor = Some(last.key.clone()),
            _ => {
                complete = true;
                break;
            }
        }
    }
    // Shorter modules whose keys sort after a longer one's.
    let mut shorter = Vec::new();
    for (node, module) in found.iter().chain(after.and_then(pair_of).as_ref()) {
        for (i, _) in module.match_indices('-').filter(|(i, _)| *i > 0) {
            let p = (node.clone(), module[..i].to_string());
            if beyond(&p) && is_identifier(&p.1) && !seen.contains(&p) && !shorter.contains(&p) && has(&p)? {
                shorter.push(p);
            }
        }
    }
    let horizon = if complete { None } else { found.iter().map(join).max() };
    found.extend(shorter);
    Ok(Source { found, horizon })
}

/// Whether any source knows `module` on `node`: its assignment, applied record, needs, or its
/// node engine's compositions.
pub(crate) fn known(env: &dyn Env, node: &str, module: &str) -> Result<bool, HostError> {
    let key = format!("{node}.{module}");
    Ok(env.get(ASSIGNMENTS, &key)?.is_some()
        || env.get(APPLIED, &key)?.is_some()
        || any(env, NEEDS, &format!("{key}.>"))?
        || unless_refused(any(env, &composed(node), &format!("{module}.*")))?.unwrap_or(false))
}

/// The modules of the whole mesh after `after`, at most `limit`, in status order; and, when
/// more follow, where the next page starts (past the last module when a page of keys named none).
pub(crate) fn page(env: &dyn Env, after: Option<&str>, limit: u32) -> Result<(Vec<Pair>, Option<String>), HostError> {
    let m = modules(env, None, None, after, limit)?;
    Ok((m.pairs, m.upto))
}

fn modules(env: &dyn Env, node: Option<&str>, module: Option<&str>, after: Option<&str>, limit: u32) -> Result<Modules, HostError> {
    if let (Some(n), Some(m)) = (node, module) {
        // One module: listed when any source knows it.
        let pair = (n.to_string(), m.to_string());
        let key = join(&pair);
        if after.is_some_and(|a| key.as_str() <= a) {
            return Ok(Modules { pairs: vec![], upto: None });
        }
        let pairs = if known(env, n, m)? { vec![pair] } else { vec![] };
        return Ok(Modules { pairs, upto: None });
    }
    let tokens = |rest: &str| match (node, module) {
        (Some(n), _) => format!("{n}.*{rest}"),
        (None, Some(m)) => format!("*.{m}{rest}"),
        (None, None) => format!("*.*{rest}"),
    };
    let mut sources = vec![
        keyed_by_pair(env, ASSIGNMENTS, &tokens(""), after, limit)?,
        keyed_by_pair(env, APPLIED, &tokens(""), after, limit)?,
        grouped(
            env,
            &Grouping {
                bucket: NEEDS,
                filter: &tokens(".>"),
                module_of: &pair_of,
                has: &|p| any(env, NEEDS, &format!("{}.>", join(p))),
            },
            after,
            after,
            limit,
        )?,
    ];
    // A node's engine may have composed modules nothing else names yet: read the compositions
    // of the node asked, or of each node this page reaches (and the cursor's). A node known from
    // its compositions alone is listed when asked by name (a bucket cannot be listed here).
    let mut nodes: Vec<String> = match node {
        Some(n) => vec![n.to_string()],
        None => sources.iter().flat_map(|s| s.found.iter().map(|(n, _)| n.clone())).chain(after.and_then(pair_of).map(|(n, _)| n)).collect(),
    };
    nodes.sort();
    nodes.dedup();
    let module_filter = module.map_or(">".to_string(), |m| format!("{m}.*"));
    for n in &nodes {
        let bucket = composed(n);
        let module_after = match after {
            Some(a) if a < format!("{n}.").as_str() => None,
            Some(a) => a.strip_prefix(&format!("{n}.")).map(str::to_string),
            None => None,
        };
        if after.is_some_and(|a| a >= format!("{n}/").as_str()) {
            continue;
        }
        let of = |k: &str| parse_composed(k).ok().map(|c| (n.to_string(), c.module));
        let has = |p: &Pair| any(env, &bucket, &format!("{}.*", p.1));
        let grouping = Grouping { bucket: &bucket, filter: &module_filter, module_of: &of, has: &has };
        // A node's compositions bucket the host refuses (not a bucket's stream) lists nothing;
        // its modules known elsewhere say why in their status.
        if let Some(source) = unless_refused(grouped(env, &grouping, module_after.as_deref(), after, limit))? {
            sources.push(source);
        }
    }
    let horizon = sources.iter().filter_map(|s| s.horizon.clone()).min();
    let mut all: Vec<Pair> = sources.into_iter().flat_map(|s| s.found).collect();
    all.sort_by_key(join);
    all.dedup();
    all.retain(|p| after.is_none_or(|a| join(p).as_str() > a));
    let mut upto = None;
    if let Some(h) = &horizon {
        // A source read only so far: nothing past what it covers is known to be complete.
        all.retain(|p| join(p) <= *h);
        upto = Some(h.clone());
    }
    if all.len() > limit as usize {
        all.truncate(limit as usize);
        upto = all.last().map(join);
    }
    Ok(Modules { pairs: all, upto })
}

/// A read of a bucket the host refuses to read (`denied`) as nothing; any other failure as it is.
fn unless_refused<T>(r: Result<T, HostError>) -> Result<Option<T>, HostError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(HostError::Denied(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What is wrong with the buckets a module's status read, besides their contents: settings
/// that put their keys at risk, a bucket not read at all (its node's compositions among them),
/// and this module's node past its quota of one. A bucket that cannot be asked now is said by
/// the checks that read it.
fn warnings(env: &dyn Env, node: &str, needs: &[NeedStatus], healths: &mut Healths) -> Vec<String> {
    let compositions = composed(node);
    let mut buckets: Vec<&str> = vec![NEEDS, APPLIED, &compositions];
    for n in needs {
        if let Place::Bucket { bucket, .. } = &n.place {
            if !buckets.contains(&bucket.as_str()) {
                buckets.push(bucket);
            }
        }
    }
    let mut out = Vec::new();
    for bucket in buckets {
        let asked = healths.entry(bucket.to_string()).or_insert_with(|| env.health(bucket));
        let health = match asked.clone() {
            Ok(h) => h,
            // Not read at all (its stream is not a bucket; past the host's memory budget).
            Err(HostError::Denied(why)) => {
                out.push(format!("bucket {bucket} is not read: {why}"));
                continue;
            }
            // Could not be asked now: the checks that read it say so.
            Err(_) => continue,
        };
        out.extend(health.unsafe_settings.iter().map(|why| format!("bucket {bucket} {why}")));
        for (writer, keys, bytes) in &health.over_quota {
            if writer == node {
                out.push(format!("node {node} holds {keys} keys ({bytes} bytes) of {bucket}, past its quota"));
            }
        }
    }
    out
}

/// The keys of the assignments and applied buckets in a status request's scope that name no
/// module this page lists: a key of one token, two that are not identifiers, or more than two
/// under a pair that is no module (`alpha.ghost.extra` with no `ghost` on alpha). Each is said
/// with the position it sorts at among modules (its first two tokens), after `after`; a deeper
/// key of a listed module is said by that module's status instead. Sorted by position, then
/// bucket and key.
fn orphans(env: &dyn Env, node: Option<&str>, module: Option<&str>, after: Option<&str>, end: Option<&str>) -> Result<Vec<(String, OutOfShape)>, HostError> {
    let beyond = |p: &str| after.is_none_or(|a| p > a);
    let within = |p: &str| end.is_none_or(|e| p <= e);
    let position = |key: &str| -> String {
        let mut t = key.splitn(3, '.');
        match (t.next(), t.next()) {
            (Some(a), Some(b)) => format!("{a}.{b}"),
            _ => key.to_string(),
        }
    };
    // Keys of exactly two tokens sort as their position, so their scan stops at `end`; deeper
    // and one-token keys are rare and read whole after `after` (a key sorts after its position).
    let (pairs, deep, single): (String, String, Option<String>) = match (node, module) {
        (Some(n), Some(m)) => (format!("{n}.{m}"), format!("{n}.{m}.>"), None),
        (Some(n), None) => (format!("{n}.*"), format!("{n}.*.>"), Some(n.to_string())),
        (None, Some(m)) => (format!("*.{m}"), format!("*.{m}.>"), None),
        (None, None) => ("*.*".into(), "*.*.>".into(), Some("*".into())),
    };
    let mut out = Vec::new();
    for bucket in [ASSIGNMENTS, APPLIED] {
        let mut cursor = after.map(str::to_string);
        'pairs: loop {
            let page = env.scan(bucket, &pairs, cursor.as_deref(), 1000)?;
            for e in &page.entries {
                if !within(&e.key) {
                    break 'pairs;
                }
                if parse_assignment(&e.key).is_err() && beyond(&e.key) {
                    let reason = parse_assignment(&e.key).err().unwrap_or_default();
                    out.push((e.key.clone(), OutOfShape { bucket, key: e.key.clone(), revision: e.revision, reason }));
                }
            }
            match (page.more, page.entries.last()) {
                (true, Some(l)) => cursor = Some(l.key.clone()),
                _ => break,
            }
        }
        for filter in std::iter::once(&deep).chain(single.as_ref()) {
            for e in crate::reconcile::scan_after(env, bucket, filter, after)? {
                let p = position(&e.key);
                if beyond(&p) && within(&p) {
                    let reason = if bucket == APPLIED { parse_applied(&e.key) } else { parse_assignment(&e.key) }.err().unwrap_or_default();
                    out.push((p, OutOfShape { bucket, key: e.key, revision: e.revision, reason }));
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.0, a.1.bucket, &a.1.key).cmp(&(&b.0, b.1.bucket, &b.1.key)));
    Ok(out)
}

/// Answers `what: "status"`: a page of modules, each rendered whole, cut by `limit` and by the
/// reply's byte budget.
pub fn answer(env: &dyn Env, node: Option<&str>, module: Option<&str>, after: Option<&str>, limit: u32, budget: usize) -> Result<Reply, HostError> {
    let limit = limit.min(MAX_MODULES);
    let page = modules(env, node, module, after, limit)?;
    let head_len = 64;
    let (mut entries, mut shapes): (Vec<Box<RawValue>>, Vec<Box<RawValue>>) = (Vec::new(), Vec::new());
    let (mut used, mut revision, mut last, mut cut) = (0usize, 0u64, None::<String>, false);
    let mut asked = Asked::default();
    // Keys in scope that name no listed module, each said once: with the first module that
    // sorts after it, or at the end of the last page.
    let end = page.upto.clone();
    let listed: std::collections::HashSet<String> = page.pairs.iter().map(join).collect();
    let mut orphans = orphans(env, node, module, after, end.as_deref())?.into_iter().filter(|(p, _)| !listed.contains(p)).peekable();
    for (n, m) in &page.pairs {
        let s = module_with(env, n, m, &mut asked)?;
        let entry = raw(&Line::of(&s));
        let key = join(&(n.clone(), m.clone()));
        let mut before: Vec<Box<RawValue>> = Vec::new();
        while let Some((_, o)) = orphans.next_if(|(p, _)| *p < key) {
            before.push(raw(&o));
        }
        let shape: Vec<Box<RawValue>> = before.into_iter().chain(s.out_of_shape.iter().map(raw)).collect();
        let size = entry.get().len() + shape.iter().map(|o| o.get().len() + 1).sum::<usize>();
        let next_len = key.len() + 12;
        if head_len + used + size + next_len + 2 > budget {
            if last.is_none() {
                let why = format!("the status of {} ({size} bytes) cannot fit a reply of {budget} bytes", shorten(&key));
                return Ok(Reply::error(Code::Internal, &why));
            }
            cut = true;
            break;
        }
        used += size + 1;
        entries.push(entry);
        shapes.extend(shape);
        revision = revision.max(s.revision);
        last = Some(key);
    }
    // Past the last module: the rest, a position's keys together, while they fit.
    let mut rest: Vec<(String, OutOfShape)> = if cut { Vec::new() } else { orphans.collect() };
    while !rest.is_empty() {
        let p = rest[0].0.clone();
        let n = rest.iter().take_while(|(q, _)| *q == p).count();
        let group: Vec<Box<RawValue>> = rest.drain(..n).map(|(_, o)| raw(&o)).collect();
        let size = group.iter().map(|o| o.get().len() + 1).sum::<usize>();
        if head_len + used + size + p.len() + 14 > budget {
            if entries.is_empty() && shapes.is_empty() {
                let why = format!("the keys out of shape at {} ({size} bytes) cannot fit a reply of {budget} bytes", shorten(&p));
                return Ok(Reply::error(Code::Internal, &why));
            }
            cut = true;
            break;
        }
        used += size;
        shapes.extend(group);
        last = Some(p);
    }
    let next = if cut { last } else { page.upto.clone() };
    let body = to_json(&Page { what: "status", revision, entries, out_of_shape: shapes, next });
    Ok(Reply { code: Code::Ok, body: body.into_bytes() })
}

/// A page of `status`.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "StatusPage"))]
pub(crate) struct Page {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::status_what"))]
    what: &'static str,
    /// The newest revision among the modules listed.
    revision: u64,
    /// One module each, in `<node>.<module>` order.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<Line<'static>>"))]
    entries: Vec<Box<RawValue>>,
    /// Keys in a listed module's scope that fit no shape.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<OutOfShape>"))]
    out_of_shape: Vec<Box<RawValue>>,
    /// Where the next page starts (as `after`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// One module's status, as `status` lists it.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "ModuleStatus"))]
struct Line<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    node: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    module: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::module_state"))]
    state: &'static str,
    reason: &'a str,
    /// Since when the module has been in `state` (absent until the seat's holder recorded it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::timestamp"))]
    since: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    want: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    have: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    applied_at: Option<&'a str>,
    needs: Vec<NeedLine<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

impl<'a> Line<'a> {
    fn of(s: &'a ModuleStatus) -> Self {
        Line {
            node: &s.node,
            module: &s.module,
            state: s.state.name(),
            reason: &s.reason,
            since: s.since.as_deref(),
            want: s.want.as_deref(),
            have: s.have.as_deref(),
            applied_at: s.applied_at.as_deref(),
            needs: s.needs.iter().map(NeedLine::of).collect(),
            warnings: &s.warnings,
        }
    }
}

/// One need of a module's status.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "NeedStatus"))]
struct NeedLine<'a> {
    kind: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<&'a str>,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::sources"))]
    source: Vec<&'static str>,
    #[serde(flatten)]
    place: &'a Place,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::check"))]
    check: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::currency"))]
    generation: Option<&'static str>,
    #[serde(flatten)]
    found: &'a Check,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<&'a Provider>,
}

impl<'a> NeedLine<'a> {
    fn of(n: &'a NeedStatus) -> Self {
        NeedLine {
            kind: &n.kind,
            name: &n.name,
            part: n.part.as_deref(),
            source: sources(n.recorded, n.planned),
            place: &n.place,
            check: n.check.name(),
            generation: n.generation.map(|g| g.name()),
            found: &n.check,
            reason: &n.reason,
            provider: n.provider.as_ref(),
        }
    }
}

/// Flattened into a need or a holder: `domain` and `bucket` + `key` (or `filter`), or `domain`
/// and `verb`; nothing for a need nowhere.
impl Serialize for Place {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self {
            Place::Bucket { domain, bucket, place, filter } => {
                m.serialize_entry("domain", domain)?;
                m.serialize_entry("bucket", bucket)?;
                m.serialize_entry(if *filter { "filter" } else { "key" }, place)?;
            }
            Place::Verb { domain, verb } => {
                m.serialize_entry("domain", domain)?;
                m.serialize_entry("verb", verb)?;
            }
            Place::Nowhere => {}
        }
        m.end()
    }
}

/// Flattened into a need: what its check found (revisions, items, responders).
impl Serialize for Check {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match *self {
            Check::Present { revision, applied } => {
                m.serialize_entry("revision", &revision)?;
                if let Some(a) = applied {
                    m.serialize_entry("applied_revision", &a)?;
                }
            }
            Check::Stale { applied, revision } => {
                m.serialize_entry("revision", &revision)?;
                m.serialize_entry("applied_revision", &applied)?;
            }
            Check::Collected { items, revision } => {
                m.serialize_entry("items", &items)?;
                m.serialize_entry("revision", &revision)?;
            }
            Check::Answered { responders } => m.serialize_entry("responders", &responders)?,
            _ => {}
        }
        m.end()
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

#[cfg(all(test, feature = "fuzzing"))]
mod out_of_shape {
    use super::*;
    use crate::fuzzing::MemEnv;
    use proptest::prelude::*;

    /// Every `(bucket, key)` of the assignments and applied buckets a status listing says: a
    /// module listed (its exact keys) or a key out of shape; asked page by page at `limit` and
    /// `budget`, with `node` narrowing.
    fn said(env: &MemEnv, node: Option<&str>, limit: u32, budget: usize) -> Vec<(String, String)> {
        let (mut out, mut after) = (Vec::new(), None::<String>);
        for _ in 0..1000 {
            let r = answer(env, node, None, after.as_deref(), limit, budget).expect("answers");
            let v: Value = serde_json::from_slice(&r.body).expect("JSON");
            assert_eq!(r.code, Code::Ok, "{v}");
            for e in v["entries"].as_array().into_iter().flatten() {
                let key = format!("{}.{}", e["node"].as_str().unwrap_or_default(), e["module"].as_str().unwrap_or_default());
                for bucket in [ASSIGNMENTS, APPLIED] {
                    if env.get(bucket, &key).ok().flatten().is_some() {
                        out.push((bucket.to_string(), key.clone()));
                    }
                }
            }
            for o in v["out_of_shape"].as_array().into_iter().flatten() {
                if o["bucket"] == ASSIGNMENTS || o["bucket"] == APPLIED {
                    out.push((o["bucket"].as_str().unwrap_or_default().to_string(), o["key"].as_str().unwrap_or_default().to_string()));
                }
            }
            match v.get("next").and_then(Value::as_str) {
                Some(n) => after = Some(n.to_string()),
                None => return out,
            }
        }
        panic!("more than 1000 pages")
    }

    #[test]
    fn a_key_that_names_no_module_is_out_of_shape_once() {
        let env = MemEnv::default();
        env.put(APPLIED, "alpha.app", br#"{"build":"b1","needs":0}"#);
        env.put(APPLIED, "alpha.ghost.extra", b"{}");
        env.put(APPLIED, "alpha.app.extra", b"{}");
        env.put(ASSIGNMENTS, "alpha.-odd", b"{}");
        env.put(ASSIGNMENTS, "alpha", b"{}");
        env.put(APPLIED, "beta.ghost.extra", b"{}");
        let mut got = said(&env, Some("alpha"), 1000, 1 << 20);
        got.sort();
        let want: Vec<(String, String)> = [(APPLIED, "alpha.app"), (APPLIED, "alpha.app.extra"), (APPLIED, "alpha.ghost.extra"), (ASSIGNMENTS, "alpha"), (ASSIGNMENTS, "alpha.-odd")]
            .iter()
            .map(|(b, k)| (b.to_string(), k.to_string()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(got, want);
        let r = answer(&env, Some("alpha"), Some("ghost"), None, 1000, 1 << 20).expect("answers");
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["entries"], serde_json::json!([]), "{v}");
        assert_eq!(v["out_of_shape"][0]["key"], "alpha.ghost.extra", "{v}");
    }

    #[test]
    fn pages_cut_by_bytes_say_every_key_once() {
        let env = MemEnv::default();
        let mut want = Vec::new();
        for i in 0..60 {
            let (bucket, key) = if i % 2 == 0 { (APPLIED, format!("n{i:02}.app")) } else { (APPLIED, format!("n{i:02}.ghost.extra")) };
            env.put(bucket, &key, b"{}");
            want.push((bucket.to_string(), key));
        }
        let mut got = said(&env, None, 1000, 4096);
        got.sort();
        let pages = {
            let r = answer(&env, None, None, None, 1000, 4096).unwrap();
            serde_json::from_slice::<Value>(&r.body).unwrap()["next"].is_string()
        };
        assert!(pages, "one page held everything: the test no longer cuts by bytes");
        assert_eq!(got, want);
    }

    fn token() -> impl Strategy<Value = String> {
        prop_oneof![Just("a".to_string()), Just("b".to_string()), Just("a-x".to_string()), Just("=ZZ".to_string()), Just("-".to_string()), Just("b_1".to_string())]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn every_key_in_scope_is_said_exactly_once_across_pages(
            keys in proptest::collection::btree_set((proptest::arbitrary::any::<bool>(), proptest::collection::vec(token(), 1..4)), 0..24),
            limit in prop_oneof![Just(1u32), Just(2u32), Just(1000u32)],
            budget in prop_oneof![Just(4096usize), Just(1usize << 20)],
            node in prop_oneof![Just(None), Just(Some("a")), Just(Some("b"))],
        ) {
            let env = MemEnv::default();
            let mut want = Vec::new();
            for (applied, tokens) in &keys {
                let bucket = if *applied { APPLIED } else { ASSIGNMENTS };
                let key = tokens.join(".");
                env.put(bucket, &key, b"{}");
                if node.is_none_or(|n| tokens[0] == n) {
                    want.push((bucket.to_string(), key));
                }
            }
            want.sort();
            want.dedup();
            let mut got = said(&env, node, limit, budget);
            got.sort();
            prop_assert_eq!(got, want);
        }
    }
}
