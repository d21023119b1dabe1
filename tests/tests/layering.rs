//! ARCHITECTURE.md's layering invariant: in the host and in the guest, each file uses only what
//! is below it — no two modules reach each other, directly or around a circle. Read from the
//! sources: every `crate::<module>` a file names (in code, not in comments).

use std::collections::{BTreeMap, BTreeSet};

/// The modules of the crate in `dir` (below the root) and the modules each one names; `glue`
/// modules (the crate root, the bindings, the feature-only schema and fuzzing checks, which
/// name everything by design) are left out, and so are the lines that only derive a schema.
fn uses(dir: &str, glue: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let src = tests::root().join(dir);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).expect("host/src") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).expect("a module folder") {
                files.push(inner.expect("an entry").path());
            }
        } else {
            files.push(path);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "rs")) {
        let rel = path.strip_prefix(&src).expect("under the crate's src").to_string_lossy().to_string();
        // `runtime/mod.rs` and `runtime/bindings.rs` are the module `runtime`.
        let module = rel.split('/').next().unwrap_or_default().trim_end_matches(".rs").to_string();
        if glue.contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        let used = graph.entry(module.clone()).or_default();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//") && !l.contains("feature = \"schema\"")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && name != module && !glue.contains(&name.as_str()) && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                    used.insert(name);
                }
            }
        }
    }
    graph
}

/// A circle through `from`, if any: the modules on the way back to it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == from {
                return Some(path.clone());
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push((next.clone(), p));
            }
        }
    }
    None
}

#[test]
fn no_host_module_reaches_back_to_itself() {
    let graph = uses("host/src", &["lib", "main"]);
    assert!(graph.contains_key("serve") && graph["serve"].contains("nats"), "the reading of the sources found no uses: {graph:?}");
    let circles: Vec<String> = graph.keys().filter_map(|m| circle(&graph, m)).map(|c| c.join(" -> ")).collect();
    assert!(circles.is_empty(), "host modules in a circle:\n{}", circles.join("\n"));
}

#[test]
fn no_guest_module_reaches_back_to_itself() {
    let graph = uses("guest/src", &["lib", "bindings", "fixture", "schema", "fuzzing", "every_page_fits"]);
    // The answers sit above what they share: replies, module listing, places and checks.
    for (above, below) in [("verb", "status"), ("verb", "holders"), ("status", "checks"), ("holders", "checks"), ("status", "modules"), ("status", "reply")] {
        assert!(graph.get(above).is_some_and(|u| u.contains(below)), "{above} does not use {below}: the reading of the sources found {graph:?}");
    }
    let circles: Vec<String> = graph.keys().filter_map(|m| circle(&graph, m)).map(|c| c.join(" -> ")).collect();
    assert!(circles.is_empty(), "guest modules in a circle:\n{}", circles.join("\n"));
}
