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
use crate::plan::{self, PlanState};
use crate::reconcile::scan_all;

/// The buckets whose changes can move a plan; a trailing `*` is a prefix.
pub fn inputs() -> Vec<String> {
    vec![ASSIGNMENTS.into(), APPLIED.into(), BUILDS.into(), format!("{}*", keys::COMPOSED_PREFIX)]
}

/// Most plans one refresh computes; the modules beyond are handed back as changes.
pub const MAX_PER_REFRESH: usize = 2000;
/// Keys one call reads of a bucket that changed as a whole: the rest of it is handed back as a
/// continuation (see [`continuation`]), so a bucket of any size is read a page per call and a
/// call's memory stays bounded.
pub const SWEEP_PAGE: u32 = 1000;

/// A whole-bucket change in progress: the bucket's keys after `after` (`None`: from the start).
type Sweep = (String, Option<String>);

/// The change that continues a sweep of `bucket` after `key`.
fn continuation(bucket: &str, key: &str) -> (String, Option<String>) {
    (bucket.to_string(), Some(format!(">{key}")))
}

/// What one refresh did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RefreshReport {
    pub computed: u32,
    pub kept: Vec<String>,
    pub held: Vec<String>,
    pub waiting: Vec<String>,
    /// Changes left for the next call: each a module's assignment key, which moves that module.
    pub rest: Vec<(String, Option<String>)>,
    /// Modules whose newly published plan could not be kept, as the change that moves them
    /// again: the host retries them after a backoff.
    pub retry: Vec<(String, Option<String>)>,
}

type Pairs = BTreeSet<(String, String)>;

/// The (node, module) an assignment or applied key names; `None` for a key out of shape.
fn pair(bucket: &str, key: &str) -> Option<(String, String)> {
    let parsed = if bucket == ASSIGNMENTS { parse_assignment(key) } else { parse_applied(key) };
    parsed.ok().map(|k| (k.node, k.module))
}

/// Every module that the assignments or the applied records name under `filter`
/// (`>`, `*.<module>`, `<node>.*`).
fn modules(env: &dyn Env, filter: &str, into: &mut Pairs) -> Result<(), HostError> {
    for bucket in [ASSIGNMENTS, APPLIED] {
        into.extend(scan_all(env, bucket, filter)?.iter().filter_map(|e| pair(bucket, &e.key)));
    }
    Ok(())
}

/// The modules one change can move; a change of a whole bucket of modules (assignments,
/// applied, and through them the builds) becomes a sweep, read a page at a time.
fn affected(env: &dyn Env, bucket: &str, key: Option<&str>, into: &mut Pairs, sweeps: &mut Vec<Sweep>) -> Result<(), HostError> {
    if let Some(after) = key.and_then(|k| k.strip_prefix('>')) {
        if matches!(bucket, ASSIGNMENTS | APPLIED) {
            sweeps.push((bucket.to_string(), Some(after.to_string())));
        }
        return Ok(());
    }
    match (bucket, key) {
        (ASSIGNMENTS | APPLIED, Some(k)) => into.extend(pair(bucket, k)),
        (ASSIGNMENTS | APPLIED, None) => sweeps.push((bucket.to_string(), None)),
        (BUILDS, Some(k)) => {
            if let Ok(module) = parse_builds(k) {
                modules(env, &format!("*.{module}"), into)?;
            }
        }
        (BUILDS, None) => {
            sweeps.push((ASSIGNMENTS.to_string(), None));
            sweeps.push((APPLIED.to_string(), None));
        }
        (bucket, key) => {
            let Some(node) = composed_node(bucket) else { return Ok(()) };
            let module_of = |k: &str| parse_composed(k).ok().map(|k| (node.to_string(), k.module));
            match key {
                Some(k) => into.extend(module_of(k)),
                None => {
                    modules(env, &format!("{node}.*"), into)?;
                    into.extend(scan_all(env, bucket, ">")?.iter().filter_map(|e| module_of(&e.key)));
                }
            }
        }
    }
    Ok(())
}

/// The change that moves exactly `module` on `node`: its assignment key.
fn module_change(node: &str, module: &str) -> (String, Option<String>) {
    (ASSIGNMENTS.to_string(), Some(format!("{node}.{module}")))
}

/// Recomputes what `changes` can move and keeps what is newly published.
pub fn refresh(env: &dyn Env, changes: &[(String, Option<String>)]) -> Result<RefreshReport, HostError> {
    let mut pairs = Pairs::new();
    let mut sweeps = Vec::new();
    for (bucket, key) in changes {
        affected(env, bucket, key.as_deref(), &mut pairs, &mut sweeps)?;
    }
    let mut report = RefreshReport::default();
    // One page of each bucket being swept; a sweep from the start replaces one in progress.
    sweeps.sort();
    sweeps.dedup_by(|later, earlier| later.0 == earlier.0);
    for (bucket, after) in sweeps {
        let page = env.scan(&bucket, ">", after.as_deref(), SWEEP_PAGE)?;
        pairs.extend(page.entries().filter_map(|e| pair(&bucket, e.key)));
        if let (true, Some(last)) = (page.more, page.last()) {
            report.rest.push(continuation(&bucket, last.key));
        }
    }
    let mut pairs = pairs.into_iter();
    for (node, module) in pairs.by_ref().take(MAX_PER_REFRESH) {
        // One module's failure stays that module's: it waits with the reason, is tried again
        // later, and the rest of the mesh is refreshed.
        let p = match plan::compute(env, &node, &module, true) {
            Ok(p) => p,
            Err(e) => {
                env.log(Level::Warn, &format!("the plan of {node}/{module} could not be computed now: {e}; it will be tried again"));
                report.waiting.push(format!("{node}/{module}: could not be computed now: {e}"));
                report.retry.push(module_change(&node, &module));
                continue;
            }
        };
        report.computed += 1;
        if let Some(k) = &p.to_keep {
            match env.save_plan(&node, &module, &k.to_bytes(&node, &module)) {
                Ok(()) => report.kept.push(format!("{node}/{module}@{}", k.build)),
                Err(e) => {
                    env.log(Level::Warn, &format!("could not keep the plan of {node}/{module} at {}: {e}; it will be tried again", k.build));
                    report.retry.push(module_change(&node, &module));
                }
            }
        }
        let (state, reason) = p.state();
        let line = || format!("{node}/{module}: {}", reason.as_deref().unwrap_or(""));
        match state {
            PlanState::Planned => {}
            PlanState::Held => report.held.push(line()),
            PlanState::Waiting => report.waiting.push(line()),
        }
    }
    report.rest.extend(pairs.map(|(node, module)| module_change(&node, &module)));
    Ok(report)
}
