//! Following plans: which modules a change can move, their plans recomputed, and each newly
//! published plan kept (so a later refusal holds the module on it, across restarts).
//!
//! The host reports changes as (bucket, key) without knowing what a key means; here a key of
//! the assignments or applied bucket names one module on one node, an indexer key a module on
//! every node that has it, and a composition key a module on the bucket's node. A change of a
//! whole bucket (a replayed mirror, a start) moves everything that bucket feeds.

use std::collections::BTreeSet;

use crate::env::{Env, HostError, Level};
use crate::keys::{self, composed_node, parse_applied, parse_assignment, parse_builds, parse_composed, APPLIED, ASSIGNMENTS, BUILDS};
use crate::plan::{self, State};
use crate::reconcile::scan_all;

/// The buckets whose changes can move a plan; a trailing `*` is a prefix.
pub fn inputs() -> Vec<String> {
    vec![ASSIGNMENTS.into(), APPLIED.into(), BUILDS.into(), format!("{}*", keys::COMPOSED_PREFIX)]
}

/// Most plans one refresh computes; the modules beyond are handed back as changes.
pub const MAX_PER_REFRESH: usize = 2000;

/// What one refresh did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub computed: u32,
    pub kept: Vec<String>,
    pub held: Vec<String>,
    pub waiting: Vec<String>,
    /// Changes left for the next call: each a module's assignment key, which moves that module.
    pub rest: Vec<(String, Option<String>)>,
}

type Pairs = BTreeSet<(String, String)>;

/// Every (node, module) of the keys of `bucket` matching `filter`, read with `parse`.
fn pairs_in(env: &dyn Env, bucket: &str, filter: &str, into: &mut Pairs) -> Result<(), HostError> {
    for e in scan_all(env, bucket, filter)? {
        let parsed = if bucket == ASSIGNMENTS { parse_assignment(&e.key) } else { parse_applied(&e.key) };
        if let Ok(k) = parsed {
            into.insert((k.node, k.module));
        }
    }
    Ok(())
}

/// The modules one change can move.
fn affected(env: &dyn Env, bucket: &str, key: Option<&str>, into: &mut Pairs) -> Result<(), HostError> {
    match (bucket, key) {
        (ASSIGNMENTS, Some(k)) => {
            if let Ok(k) = parse_assignment(k) {
                into.insert((k.node, k.module));
            }
        }
        (APPLIED, Some(k)) => {
            if let Ok(k) = parse_applied(k) {
                into.insert((k.node, k.module));
            }
        }
        (ASSIGNMENTS | APPLIED, None) => pairs_in(env, bucket, ">", into)?,
        (BUILDS, Some(k)) => {
            if let Ok(module) = parse_builds(k) {
                let filter = format!("*.{module}");
                pairs_in(env, ASSIGNMENTS, &filter, into)?;
                pairs_in(env, APPLIED, &filter, into)?;
            }
        }
        (BUILDS, None) => {
            pairs_in(env, ASSIGNMENTS, ">", into)?;
            pairs_in(env, APPLIED, ">", into)?;
        }
        (bucket, key) => {
            let Some(node) = composed_node(bucket) else { return Ok(()) };
            match key {
                Some(k) => {
                    if let Ok(k) = parse_composed(k) {
                        into.insert((node.to_string(), k.module));
                    }
                }
                None => {
                    let filter = format!("{node}.*");
                    pairs_in(env, ASSIGNMENTS, &filter, into)?;
                    pairs_in(env, APPLIED, &filter, into)?;
                    for e in scan_all(env, bucket, ">")? {
                        if let Ok(k) = parse_composed(&e.key) {
                            into.insert((node.to_string(), k.module));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Recomputes what `changes` can move and keeps what is newly published.
pub fn refresh(env: &dyn Env, changes: &[(String, Option<String>)]) -> Result<Report, HostError> {
    let mut pairs = Pairs::new();
    for (bucket, key) in changes {
        affected(env, bucket, key.as_deref(), &mut pairs)?;
    }
    let mut report = Report::default();
    let mut pairs = pairs.into_iter();
    for (node, module) in pairs.by_ref().take(MAX_PER_REFRESH) {
        let p = plan::compute(env, &node, &module, true)?;
        report.computed += 1;
        if let Some(k) = &p.to_keep {
            match env.save_plan(&node, &module, &k.to_bytes(&node, &module)) {
                Ok(()) => report.kept.push(format!("{node}/{module}@{}", k.build)),
                Err(e) => env.log(Level::Warn, &format!("could not keep the plan of {node}/{module} at {}: {e}", k.build)),
            }
        }
        let line = || format!("{node}/{module}: {}", p.reason.as_deref().unwrap_or(""));
        match p.state {
            State::Planned => {}
            State::Held => report.held.push(line()),
            State::Waiting => report.waiting.push(line()),
        }
    }
    report.rest = pairs.map(|(node, module)| (ASSIGNMENTS.to_string(), Some(format!("{node}.{module}")))).collect();
    Ok(report)
}
