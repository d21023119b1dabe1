//! Who holds a value (SPEC §7.2): `what: "holders"`, and the notices that tell each holder its
//! value changed.
//!
//! A holder of `<kind>:<name>` is a module that needs it: recorded (a needs key
//! `<node>.<module>.<kind>.<name>`) or planned (its current plan lists it). Recorded holders are
//! found with one subject filter, `*.*.<kind>.<name>`, which the host's mirror answers from its
//! index by last token: the cost follows the holders, not the needs bucket. Modules that only
//! plan the value are found among the assigned modules of the page's range. Each holder is
//! checked where the registry places its value now, against the revision its applied record
//! names (`values`): `current`, `stale`, `never_applied` or `unknown` — never `current` when the
//! record cannot say.
//!
//! Notices: for each put or delete the host saw in an answering bucket (while it holds the
//! seat), the holders whose place it is get one notice each; the host publishes them on
//! `mesh-provisioner.notice.<node>`.

use std::collections::BTreeMap;

use crate::checks::{applied_record, check, generation, Check, Checked, Currency, Generation, Place, Providers};
use crate::env::{Env, HostError};
use crate::escape::{encode, is_identifier, shorten};
use crate::keys::{parse_need, APPLIED, ASSIGNMENTS, NEEDS};
use crate::modules::{grouped, join, keyed_by_pair, pair_cow, Grouping, Pair};
use crate::plan;
use crate::provision::{self, Need};
use crate::registry::{self, Answer};
use crate::reply::{Code, PageBudget, Reply};
use crate::value::{raw, sources, to_json};
use serde::Serialize;
use serde_json::value::RawValue;

/// Most modules one page looks at (each costs its plan and a check).
pub const MAX_MODULES: u32 = 1000;

/// One holder, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub node: String,
    pub module: String,
    pub recorded: bool,
    pub planned: bool,
    pub place: Place,
    pub generation: Generation,
}

/// The kind and name of the needs a plan lists, when readable.
fn planned_needs(p: &plan::Plan) -> Vec<Need> {
    let body = p.entries.first().and_then(|e| e.plan.as_ref()).map(|(_, b)| b.needs.as_slice()).unwrap_or_default();
    body.iter().filter_map(|listed| listed.need().cloned()).collect()
}

/// Checks `module` on `node` as a holder of `kind:name`; `None` when it does not hold it (not
/// recorded, not planned, or of a part not installed there).
fn holder(env: &dyn Env, node: &str, module: &str, kind: &str, name: &str, recorded: bool, providers: &mut Providers) -> Result<Option<Holder>, HostError> {
    let planned_part = planned_needs(&plan::compute(env, node, module, false)?).into_iter().find(|n| n.kind == kind && n.name == name).map(|n| n.part);
    let planned = planned_part.is_some();
    if !recorded && !planned {
        return Ok(None);
    }
    let part = match (recorded, planned_part) {
        (true, _) => env
            .get(NEEDS, &format!("{node}.{module}.{kind}.{}", encode(name)))?
            .and_then(|e| serde_json::from_slice::<serde_json::Value>(&e.value).ok())
            .and_then(|v| v.get("part").and_then(|p| p.as_str()).map(str::to_string)),
        (false, p) => p.flatten(),
    };
    let record = env.get(APPLIED, &format!("{node}.{module}"))?.map(|e| applied_record(&e.value));
    let need = Need { kind: kind.into(), name: name.into(), part };
    let Checked { place, check, .. } =
        check(env, node, module, &need, record.as_ref().and_then(|r| r.parts.as_deref()), record.as_ref().and_then(|r| r.values.as_ref()), providers);
    if check == Check::NotInstalled {
        return Ok(None);
    }
    let generation = generation(&check, record.as_ref(), kind, name);
    Ok(Some(Holder { node: node.into(), module: module.into(), recorded, planned, place, generation }))
}

/// A page of holders: those found, whether more modules follow, and the last module looked at.
pub struct Holders {
    pub holders: Vec<Holder>,
    pub last: Option<String>,
    pub more: bool,
}

/// The holders of `kind:name` among the modules after `after` (`<node>.<module>`), at most
/// `limit` modules looked at.
pub fn find(env: &dyn Env, kind: &str, name: &str, node: Option<&str>, after: Option<&str>, limit: u32) -> Result<Holders, HostError> {
    let limit = limit.clamp(1, MAX_MODULES);
    let suffix = format!("{kind}.{}", encode(name));
    let nodes = node.unwrap_or("*");
    let has = |p: &Pair| Ok(env.get(NEEDS, &format!("{}.{suffix}", join(p)))?.is_some());
    let filter = format!("{nodes}.*.{suffix}");
    let recorded = grouped(env, &Grouping { bucket: NEEDS, filter: &filter, module_of: &pair_cow, has: &has }, after, after, limit)?;
    let assigned = keyed_by_pair(env, ASSIGNMENTS, &format!("{nodes}.*"), after, limit)?;
    let horizon = [&recorded.horizon, &assigned.horizon].into_iter().flatten().min().cloned();
    let in_recorded: std::collections::HashSet<&Pair> = recorded.found.iter().collect();
    let mut pairs: Vec<(String, Pair, bool)> = recorded.found.iter().map(|p| (join(p), p.clone(), true)).collect();
    pairs.extend(assigned.found.iter().filter(|p| !in_recorded.contains(p)).map(|p| (join(p), p.clone(), false)));
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    pairs.retain(|(key, _, _)| after.is_none_or(|a| key.as_str() > a) && horizon.as_ref().is_none_or(|h| key <= h));
    let mut more = horizon.is_some();
    if pairs.len() > limit as usize {
        pairs.truncate(limit as usize);
        more = true;
    }
    let (mut holders, mut providers) = (Vec::new(), Providers::new());
    for (_, (n, m), rec) in &pairs {
        holders.extend(holder(env, n, m, kind, name, *rec, &mut providers)?);
    }
    Ok(Holders { holders, last: pairs.last().map(|(key, _, _)| key.clone()), more })
}

/// Answers `what: "holders"`: one page, cut by `limit` modules and by the reply's byte budget.
/// `all_current` speaks for the holders of this page; a reply with `next` has more to follow
/// (the CLI follows every page and says all current only when each page does).
pub fn answer(env: &dyn Env, kind: &str, name: &str, node: Option<&str>, after: Option<&str>, limit: u32, budget: usize) -> Result<Reply, HostError> {
    let page = find(env, kind, name, node, after, limit)?;
    let mut list: Vec<Box<RawValue>> = Vec::new();
    let (mut last, mut cut, mut all_current) = (None::<String>, false, true);
    // `count` and `all_current` are learned holder by holder: measured at their widest.
    let widest = HolderPage { what: "holders", kind, name, holders: Vec::new(), count: page.holders.len(), all_current: false, next: None };
    let uncut = if page.more { page.last.as_deref() } else { None };
    let mut room = PageBudget::new(budget, &to_json(&widest), uncut);
    for h in &page.holders {
        let item = raw(&HolderLine::of(h));
        let key = format!("{}.{}", h.node, h.module);
        if !room.take(&[(0, item.get())], &key) {
            if last.is_none() {
                return Ok(Reply::error(Code::Internal, &format!("the holder {} cannot fit a reply of {budget} bytes", shorten(&key))));
            }
            cut = true;
            break;
        }
        list.push(item);
        all_current &= h.generation.currency == Currency::Current;
        last = Some(key);
    }
    // Past a cut, the page ends at the last holder listed; otherwise at the last module looked at.
    let next = if cut {
        last
    } else if page.more {
        page.last.clone()
    } else {
        None
    };
    let count = list.len();
    Ok(room.finish(to_json(&HolderPage { what: "holders", kind, name, holders: list, count, all_current, next })))
}

/// A page of `holders`.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "HoldersPage"))]
pub(crate) struct HolderPage<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::holders_what"))]
    what: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    kind: &'a str,
    name: &'a str,
    /// One module each, in `<node>.<module>` order.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<HolderLine<'static>>"))]
    holders: Vec<Box<RawValue>>,
    /// How many holders this page lists.
    count: usize,
    /// Whether every holder listed runs the value at its place now.
    all_current: bool,
    /// Where the next page starts (as `after`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// One holder, as `holders` lists it.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "Holder"))]
struct HolderLine<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    node: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    module: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::sources"))]
    source: &'static [&'static str],
    #[serde(flatten)]
    place: &'a Place,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::currency"))]
    state: &'static str,
    applied_revision: Option<u64>,
    revision: Option<u64>,
    reason: &'a str,
}

impl<'a> HolderLine<'a> {
    fn of(h: &'a Holder) -> Self {
        let g = &h.generation;
        HolderLine {
            node: &h.node,
            module: &h.module,
            source: sources(h.recorded, h.planned),
            place: &h.place,
            state: g.currency.name(),
            applied_revision: g.applied,
            revision: g.now,
            reason: &g.reason,
        }
    }
}

/// A put or delete the host saw in a bucket that answers needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderEvent {
    pub bucket: String,
    pub key: String,
    pub revision: u64,
    pub deleted: bool,
}

/// One notice for the host to publish on `mesh-provisioner.notice.<node>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub node: String,
    pub body: Vec<u8>,
}

/// The buckets whose changes can concern a holder: every bucket the registry answers from, a
/// `*` standing for a provider's name. The host follows them while it holds the seat.
pub fn inputs() -> Vec<String> {
    let mut out: Vec<String> = registry::table()
        .iter()
        .filter_map(|d| match &d.answer {
            Answer::Bucket { bucket, .. } => Some(bucket.replace("<provider>", "*")),
            Answer::Verb(_) => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The notices one event sends: one per module whose need (recorded or planned) is placed at
/// the event's key, whatever kinds answer from that bucket.
pub fn notices(env: &dyn Env, event: &HolderEvent) -> Result<Vec<Notice>, HostError> {
    // Every bucket place begins `<node>.`: the node is the key's first token, and a place per
    // module continues `<module>.`.
    let mut tokens = event.key.split('.');
    let (Some(node), second) = (tokens.next(), tokens.next()) else { return Ok(vec![]) };
    if !is_identifier(node) {
        return Ok(vec![]);
    }
    // The kinds answered from this bucket, each with whether its place is per module.
    let kinds: Vec<(&str, bool)> = registry::table()
        .iter()
        .filter_map(|d| match &d.answer {
            Answer::Bucket { bucket, key, .. } => {
                let here = match bucket.strip_prefix("<provider>") {
                    Some(suffix) => event.bucket.strip_suffix(suffix).is_some_and(is_identifier),
                    None => *bucket == event.bucket,
                };
                here.then_some((d.kind, key.contains("<module>")))
            }
            Answer::Verb(_) => None,
        })
        .collect();
    // Candidate modules: the key's module for a place per module, the node's modules that record
    // a need of the kind for a collection (its readers).
    let module = second.filter(|m| is_identifier(m));
    let mut candidates: BTreeMap<Pair, Vec<Need>> = BTreeMap::new();
    for (kind, per_module) in &kinds {
        let filter = match (per_module, module) {
            (true, Some(m)) => format!("{node}.{m}.{kind}.*"),
            (true, None) => continue,
            (false, _) => format!("{node}.*.{kind}.*"),
        };
        for e in crate::reconcile::scan_all(env, NEEDS, &filter)? {
            if let Ok(k) = parse_need(&e.key) {
                candidates.entry((k.node, k.module)).or_default().push(Need { kind: k.kind, name: k.name, part: None });
            }
        }
    }
    if let Some(m) = module.filter(|_| kinds.iter().any(|(_, per_module)| *per_module)) {
        candidates.entry((node.to_string(), m.to_string())).or_default();
    }
    let mut out = Vec::new();
    for ((n, m), mut needs) in candidates {
        if module == Some(m.as_str()) {
            let p = plan::compute(env, &n, &m, false)?;
            needs.extend(planned_needs(&p).into_iter().filter(|x| kinds.iter().any(|(k, _)| *k == x.kind)));
        }
        needs.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
        needs.dedup_by(|a, b| a.kind == b.kind && a.name == b.name);
        for need in needs {
            let provision::Resolved::Bucket { bucket, place, wild, .. } = provision::resolve(&n, &m, &need) else { continue };
            if bucket != event.bucket || !(place == event.key || wild && crate::keys::matches(&place, &event.key)) {
                continue;
            }
            let body = to_json(&NoticeBody {
                node: &n,
                module: &m,
                kind: &need.kind,
                name: &need.name,
                place: NoticePlace { bucket: &bucket, key: &event.key },
                revision: event.revision,
                deleted: event.deleted,
            });
            out.push(Notice { node: n.clone(), body: body.into_bytes() });
        }
    }
    Ok(out)
}

/// A notice's body: which need of which module changed, where, at which revision.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub(crate) struct NoticeBody<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    node: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    module: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    kind: &'a str,
    name: &'a str,
    place: NoticePlace<'a>,
    revision: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deleted: bool,
}

#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
struct NoticePlace<'a> {
    bucket: &'a str,
    key: &'a str,
}

/// Most events one call handles; the rest go back to the host.
pub const MAX_EVENTS: usize = 2000;

/// The notices of a slice of `events`, and the events left for another call.
pub fn notify(env: &dyn Env, events: &[HolderEvent]) -> Result<(Vec<Notice>, Vec<HolderEvent>), HostError> {
    let (now, rest) = events.split_at(events.len().min(MAX_EVENTS));
    let mut out = Vec::new();
    for e in now {
        out.extend(notices(env, e)?);
    }
    Ok((out, rest.to_vec()))
}
