//! Causes (SPEC §7.4): the distinct reasons that keep modules from `applied`, each said once
//! with the modules and nodes it holds, since when, and what would clear it.
//!
//! A cause is read off the very statuses `status` answers ([`crate::status::module_with`]):
//! each need whose check does not pass names one, and a module held with every need passing
//! is held by its plan (a composition not published or refused) or by its node (nothing
//! applied yet). So a cause is never said that a module's status would not show, and nothing
//! here judges a need again. Pages walk the modules in status order, as `status` does; the
//! causes of several pages are merged by their `kind` and `names` (the CLI and the page do).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::checks::{Check, Place};
use crate::env::{Env, HostError};
use crate::keys::{composed, APPLIED, ASSIGNMENTS, REGISTRY};
use crate::modules::modules;
use crate::reply::{Code, Reply};
use crate::status::{ModuleState, ModuleStatus, NeedStatus};
use crate::value::to_json;

/// Most modules one page of causes examines: each costs a status.
pub const MAX_CAUSE_MODULES: u32 = 500;

/// Most needs a cause lists by `kind:name` (`more_needs` counts the rest).
pub const MAX_CAUSE_NEEDS: usize = 8;

/// Most distinct needs a cause counts on one page.
const MAX_COUNTED_NEEDS: usize = 4096;

/// What keeps a module from `applied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CauseKind {
    /// A provider no node is assigned.
    ProviderUnassigned,
    /// A provider assigned, and applied on no node yet.
    ProviderNotApplied,
    /// A bucket that does not exist, and no provider writes.
    BucketMissing,
    /// A verb no service answers, and no node is assigned to run.
    VerbUnanswered,
    /// No value at the key a need reads.
    ValueMissing,
    /// A value newer than what its holder applied.
    ValueStale,
    /// A kind no registry entry answers (or a need the plan lists that cannot be read).
    NoDomain,
    /// A need of a known kind whose name its domain cannot place.
    NeedMalformed,
    /// A composition of the module's wanted build not published, refused or unreadable.
    Composition,
    /// A module whose node has applied nothing of it yet, every need passing.
    NotApplied,
    /// An applied record that cannot be taken as it is.
    AppliedRecord,
    /// A check the bus could not answer now.
    Unknown,
}

impl CauseKind {
    pub const ALL: [CauseKind; 12] = [
        CauseKind::ProviderUnassigned,
        CauseKind::ProviderNotApplied,
        CauseKind::BucketMissing,
        CauseKind::VerbUnanswered,
        CauseKind::ValueMissing,
        CauseKind::ValueStale,
        CauseKind::NoDomain,
        CauseKind::NeedMalformed,
        CauseKind::Composition,
        CauseKind::NotApplied,
        CauseKind::AppliedRecord,
        CauseKind::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CauseKind::ProviderUnassigned => "provider_unassigned",
            CauseKind::ProviderNotApplied => "provider_not_applied",
            CauseKind::BucketMissing => "bucket_missing",
            CauseKind::VerbUnanswered => "verb_unanswered",
            CauseKind::ValueMissing => "value_missing",
            CauseKind::ValueStale => "value_stale",
            CauseKind::NoDomain => "no_domain",
            CauseKind::NeedMalformed => "need_malformed",
            CauseKind::Composition => "composition",
            CauseKind::NotApplied => "not_applied",
            CauseKind::AppliedRecord => "applied_record",
            CauseKind::Unknown => "unknown",
        }
    }
}

/// One cause as one module shows it: what it is, what it names, what would clear it, and the
/// reason the module's status gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub kind: CauseKind,
    pub names: String,
    pub clear: String,
    pub reason: String,
    /// The need it holds, as `kind:name`; `None` for a cause of the module itself.
    pub need: Option<String>,
}

/// The cause a need that does not pass shows; `None` for one that passes (or counts for
/// nothing: a part not installed).
pub fn of_need(node: &str, n: &NeedStatus) -> Option<Found> {
    let need = Some([n.kind.as_str(), ":", &n.name].concat());
    let found = |kind, names: String, clear: String| Some(Found { kind, names, clear, reason: n.reason.clone(), need: need.clone() });
    let provider = n.provider.as_ref();
    match (&n.check, &n.place) {
        (Check::Present { .. } | Check::Answered { .. } | Check::Collected { .. } | Check::NotInstalled, _) => None,
        (Check::Unanswered, _) if n.kind.is_empty() => {
            found(CauseKind::NoDomain, composed(node), format!("a composition in {} whose needs can be read", composed(node)))
        }
        // A kind the registry answers: the need's name is what its domain cannot place.
        (Check::Unanswered, _) if crate::registry::lookup(&n.kind).is_some() => {
            found(CauseKind::NeedMalformed, n.kind.clone(), format!("each module's need of kind {} named as its domain places it (see the reason)", n.kind))
        }
        (Check::Unanswered, _) => found(
            CauseKind::NoDomain,
            n.kind.clone(),
            format!("a component whose compiled registry answers kind {} (it reconciles {REGISTRY}), or the module not asking it", n.kind),
        ),
        (Check::NoProvider, place) if provider.is_some_and(|p| p.nodes.is_empty()) => {
            let domain = provider.map(|p| p.module.clone()).unwrap_or_default();
            let what = match place {
                Place::Verb { verb, .. } => format!(", or a service answering {verb} run outside the modules"),
                _ => String::new(),
            };
            found(CauseKind::ProviderUnassigned, domain.clone(), format!("provider {domain} assigned to a node ({ASSIGNMENTS} key <node>.{domain}){what}"))
        }
        (Check::NoProvider, Place::Verb { domain, verb }) => {
            found(CauseKind::VerbUnanswered, domain.clone(), format!("a service answering {verb} (discovery $SRV.PING.{domain})"))
        }
        (Check::NoProvider, Place::Bucket { domain, bucket, .. }) => {
            found(CauseKind::BucketMissing, bucket.to_string(), format!("bucket {bucket} made (`mesh-provisioner bootstrap`), or domain {domain} installed"))
        }
        (Check::NoProvider, Place::Nowhere) => {
            found(CauseKind::NoDomain, n.kind.clone(), format!("a component whose compiled registry answers kind {}", n.kind))
        }
        (Check::ProviderPending { node: on }, place) => {
            let domain = match (provider, place) {
                (Some(p), _) => p.module.clone(),
                (None, Place::Verb { domain, .. }) => domain.clone(),
                (None, Place::Bucket { domain, .. }) => domain.to_string(),
                (None, Place::Nowhere) => n.kind.clone(),
            };
            let clear = match (place, provider.and_then(|p| p.applied_on())) {
                // Applied, and its service not answering yet.
                (Place::Verb { verb, .. }, Some(_)) => format!("the service of {domain} on {on} answering {verb} (discovery $SRV.PING.{domain})"),
                (Place::Verb { .. }, None) => {
                    format!("node {on} applying provider {domain} (its engine writes {APPLIED} key {on}.{domain}) and its service answering")
                }
                _ => format!("node {on} applying provider {domain} (its engine writes {APPLIED} key {on}.{domain})"),
            };
            found(CauseKind::ProviderNotApplied, [domain.as_str(), " on ", on].concat(), clear)
        }
        // One value many modules need is one cause: the bucket and the need, whatever module's
        // key holds it (the first one held says where).
        (Check::Missing, Place::Bucket { bucket, place, .. }) => {
            let names = [bucket.as_ref(), " ", &n.kind, ":", &n.name].concat();
            found(CauseKind::ValueMissing, names, format!("a value written at {bucket} key {place}, and at the like key of each module held"))
        }
        (Check::Stale { revision, .. }, Place::Bucket { bucket, place, .. }) => {
            let names = [bucket.as_ref(), " ", &n.kind, ":", &n.name].concat();
            found(
                CauseKind::ValueStale,
                names,
                format!("each holder applying the value now at its place ({bucket} {place} is at revision {revision}; `query holders` lists them)"),
            )
        }
        (Check::Missing | Check::Stale { .. }, _) => found(CauseKind::ValueMissing, n.kind.clone(), "a value for the need".into()),
        (Check::Unknown, place) => {
            let names = match place {
                Place::Bucket { bucket, .. } => bucket.to_string(),
                Place::Verb { domain, .. } => domain.clone(),
                Place::Nowhere => n.kind.clone(),
            };
            found(CauseKind::Unknown, names, "the bus answering again (the check is made at every answer)".into())
        }
    }
}

/// The causes one module's status shows: its needs' that do not pass, or, when it is held and
/// every need passes, the module's own. Nothing for a module `applied` or with nothing needed.
pub fn of_module(s: &ModuleStatus) -> Vec<Found> {
    if matches!(s.state, ModuleState::Applied | ModuleState::NothingNeeded) {
        return Vec::new();
    }
    let mut out: Vec<Found> = s.needs.iter().filter_map(|n| of_need(&s.node, n)).collect();
    if !out.is_empty() {
        return out;
    }
    let own = |kind, names: String, clear: String| Found { kind, names, clear, reason: s.reason.clone(), need: None };
    let (node, module) = (&s.node, &s.module);
    match (s.state, &s.plan_waiting, s.have.is_some() || s.applied_at.is_some()) {
        (ModuleState::Degraded, _, _) => {
            out.push(own(CauseKind::AppliedRecord, format!("{APPLIED} {node}.{module}"), format!("node {node} writing a whole applied record of {module}")))
        }
        (_, Some(why), false) => {
            let key = [module.as_str(), ".", s.want.as_deref().unwrap_or("?")].concat();
            let bucket = composed(node);
            let clear = format!("node {node}'s engine publishing {bucket} key {key} (state published, with a plan)");
            out.push(Found { reason: why.clone(), ..own(CauseKind::Composition, [bucket.as_str(), " ", &key].concat(), clear) });
        }
        (_, None, false) => {
            out.push(own(CauseKind::NotApplied, node.clone(), format!("node {node}'s provisioner applying {module} (it writes {APPLIED} key {node}.{module})")))
        }
        // Not reached by the states status gives today; a held module still says what holds it.
        _ => out.push(own(CauseKind::NotApplied, node.clone(), format!("node {node}'s provisioner applying {module} at what it wants"))),
    }
    out
}

/// A cause as a page says it, merged over the modules it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "Cause"))]
pub struct CauseLine {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::cause_kind"))]
    pub kind: &'static str,
    /// What it names: a provider, a bucket, a key (`<bucket> <key>`), a kind, a node.
    pub names: String,
    /// What would clear it.
    pub clear: String,
    /// The reason the first module it holds gives.
    pub reason: String,
    /// How many modules it holds, and on how many nodes.
    pub modules: u64,
    pub nodes: u64,
    /// The first and the last module it holds, in status order (pages merged in order count a
    /// node both end at once).
    pub first: FirstHeld,
    pub last: FirstHeld,
    /// Since when the longest-held of them has been in its state (absent until recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::timestamp"))]
    pub since: Option<String>,
    /// The needs it holds, as `kind:name` (at most [`MAX_CAUSE_NEEDS`]); empty for a cause of
    /// a module itself.
    pub needs: Vec<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub more_needs: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A module, by node and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FirstHeld {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    pub node: String,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    pub module: String,
}

/// The causes of many modules, merged by kind and what they name.
#[derive(Default)]
pub struct Tally {
    causes: BTreeMap<(CauseKind, String), Merged>,
}

struct Merged {
    line: CauseLine,
    nodes: BTreeSet<String>,
    needs: BTreeSet<String>,
}

impl Tally {
    /// Counts `s`'s causes (each once for the module, however many of its needs show it).
    pub fn add(&mut self, s: &ModuleStatus) {
        let mut seen = BTreeSet::new();
        for f in of_module(s) {
            let id = (f.kind, f.names.clone());
            let fresh = seen.insert(id.clone());
            let m = self.causes.entry(id).or_insert_with(|| Merged {
                line: CauseLine {
                    kind: f.kind.name(),
                    names: f.names.clone(),
                    clear: f.clear.clone(),
                    reason: f.reason.clone(),
                    modules: 0,
                    nodes: 0,
                    first: FirstHeld { node: s.node.clone(), module: s.module.clone() },
                    last: FirstHeld { node: s.node.clone(), module: s.module.clone() },
                    since: None,
                    needs: Vec::new(),
                    more_needs: 0,
                },
                nodes: BTreeSet::new(),
                needs: BTreeSet::new(),
            });
            if let Some(need) = f.need {
                // Distinct needs counted, up to a bound a page cannot outgrow in memory.
                if m.needs.len() < MAX_COUNTED_NEEDS {
                    m.needs.insert(need);
                }
            }
            if !fresh {
                continue;
            }
            m.line.modules += 1;
            m.line.last = FirstHeld { node: s.node.clone(), module: s.module.clone() };
            m.nodes.insert(s.node.clone());
            // RFC 3339 in UTC, all of one width: the oldest sorts first.
            if let Some(since) = &s.since {
                if m.line.since.as_ref().is_none_or(|old| since < old) {
                    m.line.since = Some(since.clone());
                }
            }
        }
    }

    /// The causes, the one holding most modules first (then by kind and name).
    pub fn lines(self) -> Vec<CauseLine> {
        let mut out: Vec<CauseLine> = self
            .causes
            .into_values()
            .map(|m| {
                let more_needs = m.needs.len().saturating_sub(MAX_CAUSE_NEEDS) as u64;
                CauseLine { nodes: m.nodes.len() as u64, needs: m.needs.into_iter().take(MAX_CAUSE_NEEDS).collect(), more_needs, ..m.line }
            })
            .collect();
        out.sort_by(|a, b| b.modules.cmp(&a.modules).then_with(|| (a.kind, &a.names).cmp(&(b.kind, &b.names))));
        out
    }
}

/// A page of `causes`.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub(crate) struct CausesPage {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::causes_what"))]
    what: &'static str,
    /// The newest revision among what the modules' statuses read.
    revision: u64,
    /// How many modules this page examined (every module in scope after `after`, up to `limit`).
    examined: u64,
    /// How many of them are held (neither `applied` nor `nothing_needed`).
    held: u64,
    /// The causes, the one holding most modules first.
    entries: Vec<CauseLine>,
    /// Where the next page starts (as `after`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// Answers `what: "causes"`: the causes of the modules in scope after `after`, at most `limit`
/// of them examined. A page whose causes cannot fit the reply ends at an earlier module (its
/// `next` there), so no cause is dropped and no count is short.
pub fn answer(env: &dyn Env, node: Option<&str>, module: Option<&str>, after: Option<&str>, limit: u32, budget: usize) -> Result<Reply, HostError> {
    let limit = limit.clamp(1, MAX_CAUSE_MODULES);
    let page = modules(env, node, module, after, limit)?;
    let mut asked = crate::status::Asked::for_causes();
    let mut statuses = Vec::with_capacity(page.pairs.len());
    for (n, m) in &page.pairs {
        statuses.push(crate::status::module_with(env, n, m, &mut asked)?);
    }
    let mut upto = statuses.len();
    loop {
        let examined = &statuses[..upto];
        let mut tally = Tally::default();
        examined.iter().for_each(|s| tally.add(s));
        let next = match upto == statuses.len() {
            true => page.upto.clone(),
            false => examined.last().map(|s| crate::modules::join(&(s.node.clone(), s.module.clone()))),
        };
        let body = CausesPage {
            what: "causes",
            revision: examined.iter().map(|s| s.revision).max().unwrap_or(0),
            examined: upto as u64,
            held: examined.iter().filter(|s| !matches!(s.state, ModuleState::Applied | ModuleState::NothingNeeded)).count() as u64,
            entries: tally.lines(),
            next,
        };
        let text = to_json(&body);
        if text.len() <= budget {
            return Ok(Reply { code: Code::Ok, body: text.into_bytes(), revision: None });
        }
        if upto <= 1 {
            let at = examined.first().map(|s| [s.node.as_str(), "/", &s.module].concat()).unwrap_or_default();
            return Ok(Reply::error(Code::Internal, &format!("the causes of {at} ({} bytes) cannot fit a reply of {budget} bytes", text.len())));
        }
        upto /= 2;
    }
}
