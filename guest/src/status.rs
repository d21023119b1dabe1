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

use crate::checks::{applied_record, check, currency, Applied, Check, Checked, Currency, Place, Provider, Providers};
use crate::env::{Env, Health, HostError};
use crate::escape::shorten;
use crate::keys::{composed, parse_applied, parse_assignment, parse_need_ref, APPLIED, ASSIGNMENTS, NEEDS};
use crate::modules::{join, modules};
use crate::plan;
use crate::provision::{self, Need};
use crate::reconcile::scan_all;
use crate::reply::{self, Code, PageBudget, Reply};
use crate::value::{object, sources, to_json, Object};
use serde::Serialize;
#[cfg(any(test, feature = "schema"))]
use serde_json::value::RawValue;

pub use crate::checks::{ProviderNode, MAX_PROVIDER_NODES};

/// Most modules one page of status holds: each costs a plan and a check per need.
pub const MAX_MODULES: u32 = 200;

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
    pub generation: Option<Currency>,
    /// The module that provides the value, where one does (SPEC §7.3).
    pub provider: Option<Provider>,
}

/// A module's state (SPEC §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleState {
    NeverRan,
    Pending,
    NothingNeeded,
    Applied,
    Degraded,
    Blocked,
}

impl ModuleState {
    pub const ALL: [ModuleState; 6] =
        [ModuleState::NeverRan, ModuleState::Pending, ModuleState::NothingNeeded, ModuleState::Applied, ModuleState::Degraded, ModuleState::Blocked];

    pub fn name(self) -> &'static str {
        match self {
            ModuleState::NeverRan => "never_ran",
            ModuleState::Pending => "pending",
            ModuleState::NothingNeeded => "nothing_needed",
            ModuleState::Applied => "applied",
            ModuleState::Degraded => "degraded",
            ModuleState::Blocked => "blocked",
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
    pub state: ModuleState,
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
    /// Why the plan of the wanted build is not given (its composition not published, refused
    /// or unreadable); `None` when it is planned.
    pub plan_waiting: Option<String>,
}

impl ModuleStatus {
    /// Whether what this status read shows the module known by a source — a needs key of its
    /// own, recorded or out of shape — so that [`crate::modules::known`] need not ask again.
    /// `false` says nothing: the module may still be assigned, applied or composed.
    pub(crate) fn evidently_known(&self) -> bool {
        self.needs.iter().any(|n| n.recorded) || self.out_of_shape.iter().any(|o| o.bucket == NEEDS)
    }
}

/// The first few `kind:name (reason)` of `needs`, for a module's reason.
fn summary(needs: &[&NeedStatus]) -> String {
    const SHOWN: usize = 3;
    // Joined by hand: every module the state sweep finds not applied says it.
    let mut s = String::new();
    for n in needs.iter().take(SHOWN) {
        if !s.is_empty() {
            s.push_str("; ");
        }
        s.extend([n.kind.as_str(), ":", &n.name, " (", &n.reason, ")"]);
    }
    if needs.len() > SHOWN {
        s.push_str("; and ");
        crate::value::write_u64(&mut s, (needs.len() - SHOWN) as u64);
        s.push_str(" more");
    }
    s
}

/// Each bucket's health as asked once for a whole answer: every module of a page reads the
/// needs' and the applied records' buckets.
type Healths = std::collections::BTreeMap<String, Result<Health, HostError>>;

/// What a whole answer (or one call's state sweep) asks once, however many modules read it.
#[derive(Default)]
pub(crate) struct Asked {
    healths: Healths,
    providers: Providers,
    /// For a page: the applied and assignments keys deeper than each listed module's own key
    /// (`<node>.<module>.…`), out of shape, as the page's one scan of them found them — so no
    /// module scans both buckets again. `None` outside a page: each module scans its own.
    deep: Option<std::collections::HashMap<String, Vec<OutOfShape>>>,
    /// For the state sweep: only each module's state and its reason are wanted, so what decides
    /// neither is not read — the keys deeper than a module's own, the buckets' health, and a
    /// need's `part` unless the applied record lists the parts installed. Its statuses' other
    /// fields are then partial; they are never shown.
    states_only: bool,
}

impl Asked {
    /// What an answer of causes asks: whole statuses, but no keys out of shape (a cause is
    /// never one).
    pub(crate) fn for_causes() -> Asked {
        Asked { deep: Some(std::collections::HashMap::new()), ..Asked::default() }
    }

    /// What the state sweep asks: [`Asked::states_only`].
    pub(crate) fn for_states() -> Asked {
        Asked { states_only: true, ..Asked::default() }
    }
}

/// The status of `module` on `node`, checked now.
pub fn module(env: &dyn Env, node: &str, module: &str) -> Result<ModuleStatus, HostError> {
    module_with(env, node, module, &mut Asked::default())
}

/// A module's state record, for its `since`: read by the status, or as its caller has just
/// read it (the state sweep reads it to compare, and need not have it read twice).
pub(crate) enum Recorded<'r> {
    ToRead,
    Read(Option<&'r crate::record::Record>),
}

/// As [`module`], asking each bucket's health and each provider's assignments at most once
/// across calls sharing `asked`.
pub(crate) fn module_with(env: &dyn Env, node: &str, module: &str, asked: &mut Asked) -> Result<ModuleStatus, HostError> {
    module_recorded(env, node, module, asked, Recorded::ToRead)
}

/// As [`module_with`], with the module's state record as `recorded` says.
pub(crate) fn module_recorded(env: &dyn Env, node: &str, module: &str, asked: &mut Asked, recorded: Recorded) -> Result<ModuleStatus, HostError> {
    // Joined by hand: `format!` costs a component several times a few appends.
    let pair = [node, ".", module].concat();
    let plan = plan::compute(env, node, module, false)?;
    let mut out_of_shape = Vec::new();
    let mut revision = 0;

    // Read once, for the plan's `have`.
    let applied = plan.applied.clone();
    revision = applied.as_ref().map_or(revision, |e| e.revision.max(revision));
    let record = applied.as_ref().map(|e| applied_record(&e.value));
    // A part decides a state only against the parts an applied record lists.
    let read_parts = !asked.states_only || record.as_ref().is_some_and(|r| r.parts.is_some());

    // The needs: recorded first (in key order), then the plan's that were not recorded.
    let mut needs: Vec<(Need, bool, bool)> = Vec::new();
    let deeper = [pair.as_str(), ".>"].concat();
    for e in scan_all(env, NEEDS, &deeper)? {
        revision = revision.max(e.revision);
        match parse_need_ref(&e.key) {
            Ok(k) => {
                let part = read_parts
                    .then(|| crate::value::field(&e.value, "part").ok().flatten().and_then(|raw| serde_json::from_str::<String>(raw.get()).ok()))
                    .flatten();
                needs.push((Need { kind: k.kind.into_owned(), name: k.name.into_owned(), part }, true, false));
            }
            Err(reason) => out_of_shape.push(OutOfShape { bucket: NEEDS, key: e.key, revision: e.revision, reason }),
        }
    }
    match asked.deep.as_mut() {
        Some(deep) => out_of_shape.extend(deep.remove(&pair).unwrap_or_default()),
        None if asked.states_only => {}
        None => {
            for bucket in [APPLIED, ASSIGNMENTS] {
                for e in scan_all(env, bucket, &deeper)? {
                    let reason = why_not_a_module(bucket, &e.key);
                    out_of_shape.push(OutOfShape { bucket, key: e.key, revision: e.revision, reason });
                }
            }
        }
    }
    let planned = plan.entries.first().and_then(|e| e.plan.as_ref());
    let mut unreadable = Vec::new();
    for listed in planned.map(|(_, body)| body.needs.as_slice()).unwrap_or_default() {
        match listed {
            provision::Listed::Read(n) => match needs.iter_mut().find(|(have, _, _)| have.kind == n.kind && have.name == n.name) {
                Some((have, _, planned)) => {
                    *planned = true;
                    if have.part.is_none() {
                        have.part = n.part.clone();
                    }
                }
                None => needs.push((n.clone(), false, true)),
            },
            provision::Listed::Unreadable { why, .. } => unreadable.push(why.clone()),
        }
    }

    let parts = record.as_ref().and_then(|r| r.parts.as_deref());
    let values = record.as_ref().and_then(|r| r.values.as_ref());
    let mut checked: Vec<NeedStatus> = needs
        .into_iter()
        .map(|(need, recorded, planned)| {
            let Checked { place, check, reason, provider } = check(env, node, module, &need, parts, values, &mut asked.providers);
            let generation = matches!(place, Place::Bucket { .. }).then(|| currency(&check, record.as_ref(), &need.kind, &need.name));
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
    let since = match recorded {
        Recorded::ToRead => crate::record::since(env, node, module, state.name()),
        Recorded::Read(r) => crate::record::since_in(r, state.name()),
    };
    let warnings = if asked.states_only { Vec::new() } else { warnings(env, node, &checked, &mut asked.healths) };
    for n in &checked {
        if let Check::Present { revision: r, .. } | Check::Collected { revision: r, .. } | Check::Stale { revision: r, .. } = n.check {
            revision = revision.max(r);
        }
    }
    let plan_waiting = plan.entries.first().filter(|e| e.state != plan::PlanState::Planned).and_then(|e| e.reason.clone());
    Ok(ModuleStatus {
        plan_waiting,
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
fn state(node: &str, module: &str, plan: &plan::Plan, applied: Option<&Applied>, needs: &[NeedStatus]) -> (ModuleState, String) {
    // A need of a part not installed counts for nothing.
    let counted: Vec<&NeedStatus> = needs.iter().filter(|n| n.check != Check::NotInstalled).collect();
    let with = |f: fn(&Check) -> bool| counted.iter().copied().filter(|n| f(&n.check)).collect::<Vec<_>>();
    let blocked = with(|c| matches!(c, Check::Unanswered | Check::NoProvider));
    if !blocked.is_empty() {
        return (ModuleState::Blocked, format!("{} need(s) cannot be satisfied now: {}", blocked.len(), summary(&blocked)));
    }
    let waiting = with(|c| matches!(c, Check::ProviderPending { .. }));
    if !waiting.is_empty() {
        // Each need's reason names the provider and the node it waits for.
        return (ModuleState::Pending, format!("{} need(s) wait for a provider: {}", waiting.len(), summary(&waiting)));
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
            return (
                ModuleState::NeverRan,
                format!("{module} on {node} is {known}, but has no applied record and no needs recorded: its provisioning never ran"),
            );
        }
        return (ModuleState::Pending, format!("{} need(s) recorded or planned, nothing applied yet{unknown_note}", needs.len()));
    };
    let build = applied.build.as_deref().unwrap_or("an unnamed build");
    let missing = with(|c| matches!(c, Check::Missing | Check::Stale { .. }));
    if !missing.is_empty() {
        return (ModuleState::Degraded, format!("applied {build}, but {} grant(s) no longer hold: {}{unknown_note}", missing.len(), summary(&missing)));
    }
    if !unknown.is_empty() {
        // Never better than it is: a check not made is not a check passed.
        return (ModuleState::Degraded, format!("applied {build}, but {} check(s) could not be made now: {}", unknown.len(), summary(&unknown)));
    }
    if let Some(odd) = &applied.odd {
        return (ModuleState::Degraded, format!("applied, but {odd}"));
    }
    if counted.is_empty() && applied.needs == Some(0) {
        return (ModuleState::NothingNeeded, format!("applied {build} with nothing needed"));
    }
    let skipped = needs.len() - counted.len();
    let skipped = if skipped == 0 { String::new() } else { format!(" ({skipped} of parts not installed)") };
    (ModuleState::Applied, format!("applied {build}: every need's check passes now ({} need(s){skipped})", counted.len()))
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
            if !buckets.contains(&bucket.as_ref()) {
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
        for (writer, keys, _) in &health.orphaned {
            if writer == node {
                out.push(format!("node {node} left the mesh: {bucket} no longer sources its share, and its {keys} keys there are orphaned"));
            }
        }
    }
    out
}

/// A key of the applied or assignments bucket (both `<node>.<module>`), read by its bucket's
/// parser.
fn parse_module_key(bucket: &str, key: &str) -> Result<crate::keys::AppliedKey, String> {
    if bucket == APPLIED {
        parse_applied(key)
    } else {
        parse_assignment(key)
    }
}

/// Why `key`, read deeper than a module's own key or otherwise odd, is out of shape.
fn why_not_a_module(bucket: &str, key: &str) -> String {
    parse_module_key(bucket, key).err().unwrap_or_default()
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
            for e in page.entries() {
                if !within(e.key) {
                    break 'pairs;
                }
                if let (Err(reason), true) = (parse_module_key(bucket, e.key), beyond(e.key)) {
                    out.push((e.key.to_string(), OutOfShape { bucket, key: e.key.to_string(), revision: e.revision, reason }));
                }
            }
            match (page.more, page.last()) {
                (true, Some(l)) => cursor = Some(l.key.to_string()),
                _ => break,
            }
        }
        for filter in std::iter::once(&deep).chain(single.as_ref()) {
            for e in crate::reconcile::scan_after(env, bucket, filter, after)? {
                let p = position(&e.key);
                if beyond(&p) && within(&p) {
                    let reason = why_not_a_module(bucket, &e.key);
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
    let (mut entries, mut shapes): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    // The page's revision is learned module by module: measured at its widest.
    let frame = reply::page("status", u64::MAX, &[], &[], None);
    let mut room = PageBudget::new(budget, &frame, page.upto.as_deref());
    let (mut revision, mut last, mut cut) = (0u64, None::<String>, false);
    let mut asked = Asked::default();
    // Keys in scope that name no listed module, each said once: with the first module that
    // sorts after it, or at the end of the last page.
    let end = page.upto.clone();
    let listed: std::collections::HashSet<String> = page.pairs.iter().map(join).collect();
    // The keys at a listed module's position that are deeper than its own key are said by its
    // status (in the order its own scans would give: applied first, each in key order).
    let mut deep: std::collections::HashMap<String, Vec<OutOfShape>> = std::collections::HashMap::new();
    let mut unlisted = Vec::new();
    for (p, o) in orphans(env, node, module, after, end.as_deref())? {
        match listed.contains(&p) {
            true if o.key.len() > p.len() => deep.entry(p).or_default().push(o),
            true => {}
            false => unlisted.push((p, o)),
        }
    }
    for keys in deep.values_mut() {
        keys.sort_by(|a, b| (a.bucket != APPLIED, &a.key).cmp(&(b.bucket != APPLIED, &b.key)));
    }
    asked.deep = Some(deep);
    let mut orphans = unlisted.into_iter().peekable();
    for (n, m) in &page.pairs {
        let s = module_with(env, n, m, &mut asked)?;
        let entry = line(&s);
        let key = join(&(n.clone(), m.clone()));
        let mut before: Vec<String> = Vec::new();
        while let Some((_, o)) = orphans.next_if(|(p, _)| *p < key) {
            before.push(to_json(&o));
        }
        let shape: Vec<String> = before.into_iter().chain(s.out_of_shape.iter().map(to_json)).collect();
        let lines: Vec<(usize, &str)> = std::iter::once((ENTRIES, entry.as_str())).chain(shape.iter().map(|o| (OUT_OF_SHAPE, o.as_str()))).collect();
        if !room.take(&lines, &key) {
            if last.is_none() {
                let size: usize = lines.iter().map(|(_, l)| l.len()).sum();
                let why = format!("the status of {} ({size} bytes) cannot fit a reply of {budget} bytes", shorten(&key));
                return Ok(Reply::error(Code::Internal, &why));
            }
            cut = true;
            break;
        }
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
        let group: Vec<String> = rest.drain(..n).map(|(_, o)| to_json(&o)).collect();
        let lines: Vec<(usize, &str)> = group.iter().map(|o| (OUT_OF_SHAPE, o.as_str())).collect();
        if !room.take(&lines, &p) {
            if entries.is_empty() && shapes.is_empty() {
                let size: usize = group.iter().map(String::len).sum();
                let why = format!("the keys out of shape at {} ({size} bytes) cannot fit a reply of {budget} bytes", shorten(&p));
                return Ok(Reply::error(Code::Internal, &why));
            }
            cut = true;
            break;
        }
        shapes.extend(group);
        last = Some(p);
    }
    let next = if cut { last } else { page.upto.clone() };
    Ok(room.finish(reply::page("status", revision, &entries, &shapes, next.as_deref())))
}

/// A module's line, written as serde writes [`StatusLine`] (`a_status_line_is_written_as_serde_writes_it`):
/// every module of every page passes here, ~2.6 KB each for ten needs.
fn line(s: &ModuleStatus) -> String {
    object(512 + 256 * s.needs.len(), |o| {
        o.str("node", &s.node);
        o.str("module", &s.module);
        o.str("state", s.state.name());
        o.str("reason", &s.reason);
        o.some_str("since", s.since.as_deref());
        o.some_str("want", s.want.as_deref());
        o.some_str("have", s.have.as_deref());
        o.some_str("applied_at", s.applied_at.as_deref());
        o.objects("needs", &s.needs, need_line);
        if !s.warnings.is_empty() {
            o.strs("warnings", &s.warnings);
        }
    })
}

/// One need of a module's line, as serde writes [`NeedLine`].
fn need_line(o: &mut Object, n: &NeedStatus) {
    o.str("kind", &n.kind);
    o.str("name", &n.name);
    o.some_str("part", n.part.as_deref());
    o.strs("source", sources(n.recorded, n.planned));
    o.flat(&n.place.fields());
    o.str("check", n.check.name());
    o.some_str("generation", n.generation.map(|g| g.name()));
    o.flat(&n.check.fields());
    o.str("reason", &n.reason);
    if let Some(p) = &n.provider {
        o.object("provider", |o| p.write(o));
    }
}

/// The lists of a status page, as [`PageBudget`] counts them.
const ENTRIES: usize = 0;
const OUT_OF_SHAPE: usize = 1;

/// A page of `status`.
#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "StatusPage"))]
pub(crate) struct StatusPage {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::status_what"))]
    what: &'static str,
    /// The newest revision among the modules listed.
    revision: u64,
    /// One module each, in `<node>.<module>` order.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<StatusLine<'static>>"))]
    entries: Vec<Box<RawValue>>,
    /// Keys in a listed module's scope that fit no shape.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<OutOfShape>"))]
    out_of_shape: Vec<Box<RawValue>>,
    /// Where the next page starts (as `after`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// One module's status, as `status` lists it.
#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "ModuleStatus"))]
struct StatusLine<'a> {
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

#[cfg(test)]
impl<'a> StatusLine<'a> {
    fn of(s: &'a ModuleStatus) -> Self {
        StatusLine {
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
#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "NeedStatus"))]
struct NeedLine<'a> {
    kind: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<&'a str>,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::sources"))]
    source: &'static [&'static str],
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

#[cfg(test)]
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

#[cfg(test)]
mod out_of_shape {
    use super::*;
    use crate::mem_env::MemEnv;
    use proptest::prelude::*;
    use serde_json::Value;

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
        env.put(APPLIED, "alpha.-odd", b"{}");
        env.put(ASSIGNMENTS, "alpha", b"{}");
        env.put(APPLIED, "beta.ghost.extra", b"{}");
        let mut got = said(&env, Some("alpha"), 1000, 1 << 20);
        got.sort();
        let want: Vec<(String, String)> = [
            (APPLIED, "alpha.-odd"),
            (APPLIED, "alpha.app"),
            (APPLIED, "alpha.app.extra"),
            (APPLIED, "alpha.ghost.extra"),
            (ASSIGNMENTS, "alpha"),
            (ASSIGNMENTS, "alpha.-odd"),
        ]
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
        prop_oneof![
            Just("a".to_string()),
            Just("b".to_string()),
            Just("a-x".to_string()),
            Just("=ZZ".to_string()),
            Just("-".to_string()),
            Just("b_1".to_string())
        ]
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

#[cfg(test)]
mod written {
    use super::*;
    use crate::checks::ProviderNode;
    use std::borrow::Cow;

    fn need(place: Place, check: Check, generation: Option<Currency>, provider: Option<Provider>) -> NeedStatus {
        NeedStatus {
            kind: "config".into(),
            name: "db \"url\"\n".into(),
            part: Some("api".into()),
            recorded: true,
            planned: false,
            place,
            check,
            reason: "why \\ not".into(),
            generation,
            provider,
        }
    }

    /// A status of every shape a line can take: each place, each check, a provider listing
    /// more nodes than it shows, and the optional fields present and absent.
    fn statuses() -> Vec<ModuleStatus> {
        let bucket = |filter| Place::Bucket { domain: Cow::Borrowed("config"), bucket: Cow::Owned("b_1".into()), place: "alpha.x".into(), filter };
        let provider = Provider {
            module: "vault".into(),
            nodes: vec![ProviderNode { node: "n1".into(), applied: true }, ProviderNode { node: "n2".into(), applied: false }],
            more_nodes: 1,
        };
        let checks = [
            Check::Present { revision: 7, applied: Some(5) },
            Check::Present { revision: 7, applied: None },
            Check::Stale { applied: 2, revision: u64::MAX },
            Check::Collected { items: 4, revision: 9 },
            Check::Answered { responders: 2 },
            Check::Missing,
            Check::ProviderPending { node: "n2".into() },
            Check::NoProvider,
            Check::Unanswered,
            Check::NotInstalled,
            Check::Unknown,
        ];
        let mut needs: Vec<NeedStatus> = checks.iter().map(|c| need(bucket(false), c.clone(), Some(Currency::Stale), None)).collect();
        needs.push(need(bucket(true), Check::Missing, None, Some(provider.clone())));
        needs.push(need(Place::Verb { domain: "verb".into(), verb: "svc.get".into() }, Check::Answered { responders: 1 }, None, None));
        needs.push(need(Place::Nowhere, Check::Unknown, Some(Currency::NeverApplied), Some(Provider { more_nodes: 0, ..provider })));
        let full = ModuleStatus {
            node: "alpha".into(),
            module: "app".into(),
            want: Some("b2".into()),
            have: Some("b1".into()),
            applied_at: Some("2026-12-02T00:00:00Z".into()),
            state: ModuleState::Degraded,
            reason: "a \"reason\"".into(),
            since: Some("2026-12-01T00:00:00Z".into()),
            needs,
            out_of_shape: Vec::new(),
            warnings: vec!["bucket \"x\" unsafe".into()],
            revision: 3,
            plan_waiting: None,
        };
        let bare = ModuleStatus {
            want: None,
            have: None,
            applied_at: None,
            since: None,
            needs: Vec::new(),
            warnings: Vec::new(),
            state: ModuleState::NeverRan,
            ..full.clone()
        };
        vec![full, bare]
    }

    #[test]
    fn a_status_line_is_written_as_serde_writes_it() {
        for s in statuses() {
            assert_eq!(line(&s), to_json(&StatusLine::of(&s)));
        }
    }

    #[test]
    fn a_status_page_is_written_as_serde_writes_it() {
        let lines: Vec<String> = statuses().iter().map(line).collect();
        let raws = |l: &[String]| l.iter().map(|l| RawValue::from_string(l.clone()).expect("a line is JSON")).collect::<Vec<_>>();
        for (entries, shapes, next) in [(&lines[..], &lines[1..], Some("alpha.\"x\"")), (&[][..], &[][..], None)] {
            let page = StatusPage { what: "status", revision: 12, entries: raws(entries), out_of_shape: raws(shapes), next: next.map(str::to_string) };
            assert_eq!(crate::reply::page("status", 12, entries, shapes, next), to_json(&page));
        }
    }
}
