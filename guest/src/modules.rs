//! Which modules exist, page by page: every source that names a module (assignments, applied
//! records, needs, a node engine's compositions) read in the page's order, `<node>.<module>`.
//! Below `status`, `holders` and `transitions`; it checks nothing.

use std::borrow::Cow;

use crate::env::{Env, HostError};
use crate::escape::is_identifier;
use crate::keys::{composed, parse_assignment, parse_composed, APPLIED, ASSIGNMENTS, NEEDS};

/// Most needs keys read to find one page's modules; past it the page ends early (with `next`).
const MAX_NEEDS_READ: usize = 20_000;

/// A node and a module.
pub(crate) type Pair = (String, String);

/// A page of modules: the `(node, module)` pairs after `after`, in key order of `<node>.<module>`.
pub(crate) struct Modules {
    pub pairs: Vec<Pair>,
    /// With more to come: the position up to which this page is complete (its last module, or
    /// further when a source read past it found no module there), where the next page starts.
    pub upto: Option<String>,
}

/// The identifiers `(node, module)` a key's first two tokens name, if they are identifiers.
pub(crate) fn pair_of(key: &str) -> Option<Pair> {
    pair_in(key).map(|(n, m)| (n.to_string(), m.to_string()))
}

/// [`pair_of`] as a [`Grouping`] reads it.
pub(crate) fn pair_cow(key: &str) -> Option<NamedPair<'_>> {
    pair_in(key).map(|(n, m)| (Cow::Borrowed(n), Cow::Borrowed(m)))
}

/// [`pair_of`], borrowed from the key: a page's scan meets each module once a key.
pub(crate) fn pair_in(key: &str) -> Option<(&str, &str)> {
    let mut t = crate::keys::dots(key);
    let (n, m) = (t.next()?, t.next()?);
    (is_identifier(n) && is_identifier(m)).then_some((n, m))
}

pub(crate) fn join(p: &Pair) -> String {
    format!("{}.{}", p.0, p.1)
}

/// The bytes of `<node>.<module>`, without building it.
fn joined(p: &Pair) -> impl Iterator<Item = u8> + '_ {
    p.0.bytes().chain(std::iter::once(b'.')).chain(p.1.bytes())
}

/// `p` against a position `<node>.<module>` in the page's order (`join(p).cmp(position)`),
/// without building it: a page compares thousands of pairs.
pub(crate) fn cmp_at(p: &Pair, position: &str) -> std::cmp::Ordering {
    joined(p).cmp(position.bytes())
}

/// Two pairs in the page's order (`join(a).cmp(&join(b))`).
fn cmp_pairs(a: &Pair, b: &Pair) -> std::cmp::Ordering {
    if a.0 == b.0 {
        return a.1.cmp(&b.1);
    }
    joined(a).cmp(joined(b))
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
    let found: Vec<Pair> = page.entries().filter_map(|e| parse_assignment(e.key).ok().map(|k| (k.node, k.module))).collect();
    let horizon = page.more.then(|| page.last().map(|e| e.key.to_string())).flatten();
    Ok(Source { found, horizon })
}

/// Whether `bucket` holds any key matching `filter`.
fn any(env: &dyn Env, bucket: &str, filter: &str) -> Result<bool, HostError> {
    Ok(!env.scan(bucket, filter, None, 1)?.is_empty())
}

/// The node and module a key names, borrowed from it where they can be.
pub(crate) type NamedPair<'k> = (Cow<'k, str>, Cow<'k, str>);

/// A bucket whose keys start with a module's tokens: which keys, the module a key names, and
/// whether a module has any key.
pub(crate) struct Grouping<'a> {
    pub bucket: &'a str,
    pub filter: &'a str,
    /// Borrowed from the key where it can be: a page reads each module's key many times over.
    pub module_of: &'a dyn for<'k> Fn(&'k str) -> Option<NamedPair<'k>>,
    pub has: &'a dyn Fn(&Pair) -> Result<bool, HostError>,
}

/// `f` as a [`Grouping`]'s `module_of` (a closure's lifetimes are inferred from its use).
fn module_of<F: for<'k> Fn(&'k str) -> Option<NamedPair<'k>>>(f: F) -> F {
    f
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
    let beyond = |p: &Pair| after.is_none_or(|a| cmp_at(p, a).is_gt());
    while found.len() <= limit as usize && read < MAX_NEEDS_READ {
        let page = env.scan(bucket, filter, cursor.as_deref(), 1000)?;
        read += page.len();
        for e in page.entries() {
            let Some((n, m)) = module_of(e.key) else { continue };
            // The last module found again (its next key): nothing to build.
            if found.last().is_some_and(|(ln, lm)| *ln == *n && *lm == *m) {
                continue;
            }
            let p = (n.into_owned(), m.into_owned());
            if beyond(&p) && seen.insert(p.clone()) {
                found.push(p);
            }
        }
        match (page.more, page.last()) {
            (true, Some(last)) => cursor = Some(last.key.to_string()),
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
    let horizon = if complete { None } else { found.iter().max_by(|a, b| cmp_pairs(a, b)).map(join) };
    found.extend(shorter);
    Ok(Source { found, horizon })
}

/// Whether any source knows `module` on `node`: its assignment, applied record, needs, or its
/// node engine's compositions.
pub fn known(env: &dyn Env, node: &str, module: &str) -> Result<bool, HostError> {
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

pub(crate) fn modules(env: &dyn Env, node: Option<&str>, module: Option<&str>, after: Option<&str>, limit: u32) -> Result<Modules, HostError> {
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
            &Grouping { bucket: NEEDS, filter: &tokens(".>"), module_of: &pair_cow, has: &|p| any(env, NEEDS, &format!("{}.>", join(p))) },
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
        let of = module_of(|k| parse_composed(k).ok().map(|c| (Cow::Owned(n.to_string()), Cow::Owned(c.module))));
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
    all.sort_by(cmp_pairs);
    all.dedup();
    all.retain(|p| after.is_none_or(|a| cmp_at(p, a).is_gt()));
    let mut upto = None;
    if let Some(h) = &horizon {
        // A source read only so far: nothing past what it covers is known to be complete.
        all.retain(|p| cmp_at(p, h).is_le());
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn identifier() -> impl Strategy<Value = String> {
        "[a-b0][a-b0_-]{0,3}"
    }

    #[test]
    fn a_page_sorts_by_the_joined_name_not_by_node_then_module() {
        // '-' sorts before '.': `a-b.x` comes before `a.y`, though node `a` is before `a-b`.
        let mut pairs = [("a".to_string(), "y".to_string()), ("a-b".to_string(), "x".to_string())];
        pairs.sort_by(cmp_pairs);
        assert_eq!(pairs[0].0, "a-b");
        assert!(cmp_at(&pairs[1], "a-b.x").is_gt());
    }

    proptest! {
        #[test]
        fn comparing_without_joining_orders_as_the_joined_names(a in (identifier(), identifier()), b in (identifier(), identifier()), at in "[a-b0._-]{0,8}") {
            prop_assert_eq!(cmp_pairs(&a, &b), join(&a).cmp(&join(&b)));
            prop_assert_eq!(cmp_at(&a, &at), join(&a).as_str().cmp(at.as_str()));
        }
    }
}
