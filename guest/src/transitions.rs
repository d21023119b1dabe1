//! State changes (SPEC §7.3): which modules a change of the mesh can move, each one's state
//! found again, and the record and event of every module whose state is no longer the one
//! recorded.
//!
//! The host reports changes of the buckets a status reads (`status-inputs`) while it holds the
//! seat, as it does for plans; here a key names the module it moves (`<node>.<module>…` in the
//! node clients' buckets, a provider's bucket and the config values; `<module>.<build>` in a
//! node's compositions; `<module>` in the builds), an assignment or applied record of a
//! provider also moves the modules that need what it provides, and a change of a whole bucket
//! (a start, a replay, the host's periodic sweep for discovery) moves every module, a page per
//! call. What the guest hands back is a write of the state record (compare-and-set on the
//! revision read) and, with it, the event to publish once the write has landed: a record that
//! lost its race publishes nothing, so a change is told at most once.
//!
//! A module found with no record by a sweep that follows a start or a replay (a whole-bucket
//! change of an input) is recorded without an event: a start is not a change. The host's
//! periodic sweep (a whole-bucket change of the states bucket itself) is live: a module that
//! appeared is told. A module whose record names another state gets an event whenever it is
//! found, so a change that happened while no holder was publishing is told by the next one.
//! A sweep's continuation is a key no bucket holds: `>`, `q` (quiet) or `l` (live), `:`, and the
//! last module read.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::env::{Env, HostError, Level};
use crate::escape::is_identifier;
use crate::keys::{self, composed_node, parse_builds, parse_composed, parse_need, APPLIED, ASSIGNMENTS, BUILDS, NEEDS};
use crate::modules::{self, pair_of, Pair};
use crate::plan;
use crate::provision::{self, Need};
use crate::reconcile::scan_all;
use crate::record::{self, Record, STATES};
use crate::registry::{self, Answer};
use crate::status;

/// Most modules one call finds the state of; the rest is handed back. Small, because the host
/// runs a call on the thread that answers requests: a request that arrives meanwhile waits for
/// it (docs/performance.md has what 200 and 50 a call cost the verb's p99).
pub const MAX_PER_CALL: usize = 50;

/// The buckets whose changes can move a module's state: names, or one `*` in a name.
pub fn inputs() -> Vec<String> {
    let mut out = crate::refresh::inputs();
    out.push(NEEDS.to_string());
    out.extend(crate::holders::inputs());
    out.sort();
    out.dedup();
    out
}

/// One record to write, and the event to publish once it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The record's key, `<node>.<module>`.
    pub key: String,
    /// The record's bytes; empty: delete the record (the module is gone).
    pub value: Vec<u8>,
    /// The revision the record had when read (0: none).
    pub expected: u64,
    /// The node whose event subject is told.
    pub node: String,
    /// The state entered (`gone`: no source knows the module any more).
    pub state: &'static str,
    /// The event's JSON body; `None`: record silently (first seen in a sweep).
    pub event: Option<Vec<u8>>,
}

/// What one call decided.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Transitions {
    /// Modules whose state was found.
    pub computed: u32,
    pub transitions: Vec<Transition>,
    /// Changes left for another call (modules past [`MAX_PER_CALL`], a sweep's continuation).
    pub rest: Vec<(String, Option<String>)>,
}

/// The state an event tells of a module no source knows any more (its record is deleted).
pub const GONE: &str = "gone";

/// An event on `mesh-provisioner.event.<node>`.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub(crate) struct StateEvent<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    node: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    module: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::event_state"))]
    state: &'a str,
    /// The state recorded before (`null`: never recorded).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::module_state_or_null"))]
    was: Option<&'a str>,
    reason: &'a str,
    /// When the module entered `state` (RFC 3339, UTC).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::timestamp"))]
    since: &'a str,
}

/// The change that moves exactly `module` on `node` (handed back as is by the host).
fn module_change(p: &Pair) -> (String, Option<String>) {
    (STATES.to_string(), Some(modules::join(p)))
}

/// The modules whose recorded needs wait on one of `providers`, by the rule status judges
/// them by ([`provision::waits_on`]): a value a provider writes, named `<provider>.…`, or a kind
/// a provider's verb answers — whether or not the provider's bucket exists yet. Only modules
/// that may be a provider are looked for: one a verb's owner, one whose assignment changed (an
/// assignment deleted moves its consumers from waiting to blocked), one assigned somewhere, or
/// one with a bucket of its own. (`providers`: each with whether its assignment changed.)
fn consumers(env: &dyn Env, providers: &BTreeMap<String, bool>, into: &mut BTreeSet<Pair>) -> Result<(), HostError> {
    let mut waited = BTreeSet::new();
    for (p, reassigned) in providers {
        let owns_a_verb = registry::table().iter().any(|d| matches!(d.answer, Answer::Verb(_)) && d.owner == p);
        let may_provide = *reassigned || !scan_all(env, ASSIGNMENTS, &format!("*.{p}"))?.is_empty() || env.exists(&format!("{p}_bound"))?;
        if owns_a_verb || (is_identifier(p) && may_provide) {
            waited.insert(p.as_str());
        }
    }
    if waited.is_empty() {
        return Ok(());
    }
    let kinds: BTreeSet<&'static str> = registry::table()
        .iter()
        .filter(|d| d.owner == "<provider>" || (matches!(d.answer, Answer::Verb(_)) && waited.contains(d.owner)))
        .map(|d| d.kind)
        .collect();
    for kind in kinds {
        for e in scan_all(env, NEEDS, &format!("*.*.{kind}.*"))? {
            let Ok(k) = parse_need(&e.key) else { continue };
            let need = Need { kind: k.kind.to_string(), name: k.name.to_string(), part: None };
            let on = provision::waits_on(&provision::resolve(&k.node, &k.module, &need), &need.kind);
            if on.is_some_and(|p| waited.contains(p.as_str())) {
                into.insert((k.node.to_string(), k.module.to_string()));
            }
        }
    }
    planned_consumers(env, &waited, into)
}

/// The modules whose plan (not their recorded needs) waits on one of `waited`, by the same
/// reading a status makes ([`plan::compute`]). Only a module assigned or applied on a node with
/// compositions has a plan; a provider's change is rare, so each such module's plan is read.
fn planned_consumers(env: &dyn Env, waited: &BTreeSet<&str>, into: &mut BTreeSet<Pair>) -> Result<(), HostError> {
    let mut composed: BTreeMap<String, bool> = BTreeMap::new();
    for bucket in [ASSIGNMENTS, APPLIED] {
        for e in scan_all(env, bucket, "*.*")? {
            let Some(p) = pair_of(&e.key) else { continue };
            if into.contains(&p) {
                continue;
            }
            let has_compositions = match composed.get(&p.0) {
                Some(c) => *c,
                None => {
                    let c = env.exists(&keys::composed(&p.0))?;
                    composed.insert(p.0.clone(), c);
                    c
                }
            };
            if !has_compositions {
                continue;
            }
            let plan = plan::compute(env, &p.0, &p.1, false)?;
            let needs = plan.entries.first().and_then(|e| e.plan.as_ref()).map(|(_, body)| body.needs.as_slice()).unwrap_or_default();
            let waits = needs.iter().any(|listed| match listed {
                provision::Listed::Read(n) => provision::waits_on(&provision::resolve(&p.0, &p.1, n), &n.kind).is_some_and(|w| waited.contains(w.as_str())),
                provision::Listed::Unreadable { .. } => false,
            });
            if waits {
                into.insert(p);
            }
        }
    }
    Ok(())
}

/// The modules one keyed change moves directly, and the providers whose consumers it moves.
fn affected(env: &dyn Env, bucket: &str, key: &str, into: &mut BTreeSet<Pair>, providers: &mut BTreeMap<String, bool>) -> Result<(), HostError> {
    match bucket {
        ASSIGNMENTS | APPLIED => {
            if let Some(p) = pair_of(key) {
                *providers.entry(p.1.clone()).or_default() |= bucket == ASSIGNMENTS;
                into.insert(p);
            }
        }
        BUILDS => {
            if let Ok(module) = parse_builds(key) {
                for b in [ASSIGNMENTS, APPLIED] {
                    into.extend(scan_all(env, b, &format!("*.{module}"))?.iter().filter_map(|e| pair_of(&e.key)));
                }
            }
        }
        keys::COLLECT => {
            // A collection is read by the modules of its node.
            if let Some((node, _)) = pair_of(key) {
                for b in [ASSIGNMENTS, APPLIED] {
                    into.extend(scan_all(env, b, &format!("{node}.*"))?.iter().filter_map(|e| pair_of(&e.key)));
                }
            }
        }
        _ => match composed_node(bucket) {
            Some(node) => into.extend(parse_composed(key).ok().map(|k| (node.to_string(), k.module))),
            // The needs, a provider's bucket, the config values, a record to write again.
            None => into.extend(pair_of(key)),
        },
    }
    Ok(())
}

/// Finds the state of every module `changes` can move; `now` (RFC 3339) is the time a change
/// found now is said to have happened.
pub fn transitions(env: &dyn Env, changes: &[(String, Option<String>)], now: &str) -> Result<Transitions, HostError> {
    let mut report = Transitions::default();
    let (mut pairs, mut providers) = (BTreeSet::new(), BTreeMap::new());
    // One sweep: the earliest position asked, quiet if any quiet one was asked (a start).
    let mut sweep: Option<(Option<String>, bool)> = None;
    let mut ask = |after: Option<String>, quiet: bool| {
        sweep = Some(match sweep.take() {
            None => (after, quiet),
            Some((a, q)) => (
                match (a, after) {
                    (None, _) | (_, None) => None,
                    (Some(a), Some(b)) => Some(a.min(b)),
                },
                q || quiet,
            ),
        });
    };
    for (bucket, key) in changes {
        match key.as_deref() {
            // The states bucket itself: the host's periodic sweep, a live one.
            None if bucket == STATES => ask(None, false),
            // Any other whole bucket: a start or a replay.
            None => ask(None, true),
            Some(k) if k.starts_with('>') => {
                let (mode, after) = k[1..].split_once(':').unwrap_or(("q", ""));
                ask((!after.is_empty()).then(|| after.to_string()), mode != "l");
            }
            Some(k) => affected(env, bucket, k, &mut pairs, &mut providers)?,
        }
    }
    consumers(env, &providers, &mut pairs)?;
    let (mut swept, mut quiet_sweep) = (BTreeSet::new(), true);
    if let Some((after, quiet)) = sweep {
        let (page, next) = modules::page(env, after.as_deref(), MAX_PER_CALL as u32)?;
        if let Some(next) = next {
            let mode = if quiet { "q" } else { "l" };
            report.rest.push((STATES.to_string(), Some(format!(">{mode}:{next}"))));
        }
        swept.extend(page);
        quiet_sweep = quiet;
    }
    let live: Vec<Pair> = pairs.into_iter().collect();
    let (now_live, later) = live.split_at(live.len().min(MAX_PER_CALL));
    report.rest.extend(later.iter().map(module_change));
    // One call is one moment: each bucket's health, existence and each provider are asked once
    // for all its modules, as for a page of status.
    let mut asked = status::Asked::for_states();
    for (p, quiet) in now_live.iter().map(|p| (p, false)).chain(swept.iter().filter(|p| !now_live.contains(p)).map(|p| (p, quiet_sweep))) {
        match transition(env, p, now, quiet, &mut asked) {
            Ok(Some(t)) => report.transitions.push(t),
            Ok(None) => {}
            Err(e @ (HostError::Unavailable(_) | HostError::Timeout(_))) => return Err(e),
            Err(e) => {
                env.log(Level::Warn, &format!("the state of {}/{} could not be found now: {e}", p.0, p.1));
                continue;
            }
        }
        report.computed += 1;
    }
    Ok(report)
}

/// The record and event for `p`, if its state is not the one recorded. `quiet`: found by a
/// sweep, so a module never recorded is recorded without an event.
fn transition(env: &dyn Env, p: &Pair, now: &str, quiet: bool, asked: &mut status::Asked) -> Result<Option<Transition>, HostError> {
    let (node, module) = (p.0.as_str(), p.1.as_str());
    let recorded = record::read(env, node, module)?;
    let expected = recorded.as_ref().map_or(0, |(_, r)| *r);
    let was = recorded.as_ref().map(|(r, _)| r.state.as_str()).filter(|s| !s.is_empty());
    let key = modules::join(p);
    // The status first: when what it read shows a source, `known`'s reads are not made again.
    let s = status::module_recorded(env, node, module, asked, status::Recorded::Read(recorded.as_ref().map(|(r, _)| r)))?;
    if !s.evidently_known() && !modules::known(env, node, module)? {
        // Gone from every source: its record goes, and a watcher is told once.
        let Some(was) = was else { return Ok(None) };
        let reason = format!("{module} on {node} is no longer assigned, applied, needed or composed");
        let event = StateEvent { node, module, state: GONE, was: Some(was), reason: &reason, since: now };
        let event = Some(crate::value::to_json(&event).into_bytes());
        return Ok(Some(Transition { key, value: Vec::new(), expected, node: node.into(), state: GONE, event }));
    }
    let state = s.state.name();
    if was == Some(state) {
        return Ok(None);
    }
    let value = Record { state: state.to_string(), since: now.to_string() }.to_bytes();
    let event = (!quiet || was.is_some()).then(|| {
        let e = StateEvent { node, module, state, was, reason: &s.reason, since: now };
        crate::value::to_json(&e).into_bytes()
    });
    Ok(Some(Transition { key, value, expected, node: node.into(), state, event }))
}
