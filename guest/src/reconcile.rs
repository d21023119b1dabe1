//! Reconciling the registry bucket to the compiled table (SPEC §4, "Writing").
//!
//! A put only where the stored bytes differ, a delete for every key no domain answers (malformed
//! keys included), each compare-and-set on the revision read, so a stale holder cannot overwrite
//! a newer one. An unchanged bucket costs zero writes.

use std::collections::BTreeMap;

use crate::env::{Entry, Env, HostError, Level};
use crate::keys::{parse_registry, REGISTRY};
use crate::registry;

/// What a reconciliation did, key by key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    pub puts: Vec<String>,
    pub deletes: Vec<String>,
    pub unchanged: Vec<String>,
    pub conflicts: Vec<String>,
}

/// Reads every key of `bucket` matching `filter`, page by page.
pub fn scan_all(env: &dyn Env, bucket: &str, filter: &str) -> Result<Vec<Entry>, HostError> {
    scan_after(env, bucket, filter, None)
}

/// Every key of `bucket` matching `filter` after `after`, in key order, page by page.
pub fn scan_after(env: &dyn Env, bucket: &str, filter: &str, after: Option<&str>) -> Result<Vec<Entry>, HostError> {
    let mut all = Vec::new();
    let mut after: Option<String> = after.map(str::to_string);
    loop {
        let page = env.scan(bucket, filter, after.as_deref(), 1000)?;
        let last = page.last().map(|e| e.key.to_string());
        all.extend(page.entries().map(|e| e.owned()));
        match (page.more, last) {
            (true, Some(last)) => after = Some(last),
            _ => return Ok(all),
        }
    }
}

pub fn reconcile(env: &dyn Env) -> Result<ReconcileReport, HostError> {
    let wanted: BTreeMap<String, Vec<u8>> = registry::compile().into_iter().collect();
    let stored = scan_all(env, REGISTRY, ">")?;
    let mut report = ReconcileReport::default();
    let mut seen = BTreeMap::new();

    for entry in stored {
        let answered = parse_registry(&entry.key).ok().and_then(|kind| wanted.get(&kind).map(|v| (kind, v)));
        match answered {
            Some((kind, value)) if *value == entry.value => report.unchanged.push(kind),
            Some((kind, value)) => {
                write(env, &mut report, &kind, Some(value), entry.revision)?;
            }
            None => write(env, &mut report, &entry.key, None, entry.revision)?,
        }
        seen.insert(entry.key, ());
    }
    for (kind, value) in &wanted {
        if !seen.contains_key(kind) {
            write(env, &mut report, kind, Some(value), 0)?;
        }
    }
    if !(report.puts.is_empty() && report.deletes.is_empty() && report.conflicts.is_empty()) {
        env.log(
            Level::Info,
            &format!(
                "registry reconciled: put {:?}, deleted {:?}, {} unchanged, conflicts {:?}",
                report.puts,
                report.deletes,
                report.unchanged.len(),
                report.conflicts
            ),
        );
    }
    Ok(report)
}

/// One compare-and-set write; a lost race is recorded, any other failure ends the pass.
fn write(env: &dyn Env, report: &mut ReconcileReport, key: &str, value: Option<&Vec<u8>>, expected: u64) -> Result<(), HostError> {
    let result = match value {
        Some(v) => env.put_registry(key, v, expected).map(|_| ()),
        None => env.delete_registry(key, expected),
    };
    match result {
        Ok(()) if value.is_some() => report.puts.push(key.to_string()),
        Ok(()) => report.deletes.push(key.to_string()),
        Err(HostError::Conflict(why)) => report.conflicts.push(format!("{key}: {why}")),
        Err(e) => return Err(e),
    }
    Ok(())
}
