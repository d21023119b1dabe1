//! ARCHITECTURE.md's layering invariant: in the host and in the guest, each file uses only what
//! is below it — no two modules reach each other, directly or around a circle. Read from the
//! sources: every `crate::<module>` a file names (in code, not in comments). And the structure's
//! other invariants read from the sources: the host knows no key shape, runs on one thread,
//! branches on no error's text, and speaks the `wit/` folder's version as the guest does.

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

/// Every host source file outside `#[cfg(test)]` modules, by path below `host/src`.
fn host_code() -> Vec<(String, String)> {
    let src = tests::root().join("host/src");
    let mut out = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_string();
                out.push((path.strip_prefix(&src).expect("under src").to_string_lossy().to_string(), code));
            }
        }
    }
    assert!(out.len() > 20, "found only {} host files", out.len());
    out
}

/// Lines of `code` that are not comments.
fn code_lines(code: &str) -> impl Iterator<Item = &str> {
    code.lines().map(str::trim).filter(|l| !l.starts_with("//"))
}

#[test]
fn the_host_knows_no_key_shape() {
    // The guest's crate is not a dependency of the host: no parser of it can be called.
    let manifest = std::fs::read_to_string(tests::root().join("host/Cargo.toml")).expect("host/Cargo.toml");
    assert!(!manifest.lines().any(|l| l.trim_start().starts_with("guest")), "the host depends on the guest crate");
    // Nor is one written again: no escape decoded, no token of a key read past the writer's.
    // (`demo.rs` writes a fixed mesh as a node client would: data, never read back.)
    let tells = ["from_str_radix", "=2E", "=3A", "parse_need", "parse_applied", "parse_collect", "parse_registry", "split('.').nth(1", "split('.').nth(2"];
    let found: Vec<String> = host_code()
        .iter()
        .filter(|(file, _)| file != "demo.rs")
        .flat_map(|(file, code)| code_lines(code).filter(|l| tells.iter().any(|t| l.contains(t))).map(move |l| format!("{file}: {l}")).collect::<Vec<_>>())
        .collect();
    assert!(found.is_empty(), "the host reads a key's shape:\n{}", found.join("\n"));
}

#[test]
fn no_host_code_branches_on_an_errors_text() {
    let tells = [".message().contains(", ".message().starts_with(", "to_string().contains(", "to_string().starts_with(", "}\").contains("];
    let found: Vec<String> = host_code()
        .iter()
        .flat_map(|(file, code)| code_lines(code).filter(|l| tells.iter().any(|t| l.contains(t))).map(move |l| format!("{file}: {l}")).collect::<Vec<_>>())
        .collect();
    assert!(found.is_empty(), "branching on an error's text, not its kind:\n{}", found.join("\n"));
}

#[test]
fn the_host_runs_on_one_thread() {
    let main = host_code().into_iter().find(|(f, _)| f == "main.rs").expect("main.rs").1;
    assert!(main.contains("#[tokio::main(flavor = \"current_thread\")]"), "main.rs does not run on one thread");
    let threaded: Vec<String> = host_code()
        .iter()
        .flat_map(|(file, code)| {
            code_lines(code)
                .filter(|l| l.contains("new_multi_thread") || l.contains("flavor = \"multi_thread\""))
                .map(move |l| format!("{file}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(threaded.is_empty(), "{}", threaded.join("\n"));
}

/// Where the test `file::name` (or `file::module::name`) ARCHITECTURE.md names should be: a
/// test binary of `tests/tests`, or a module of the guest.
fn test_exists(path: &str) -> bool {
    let parts: Vec<&str> = path.split("::").collect();
    let (Some(file), Some(name)) = (parts.first(), parts.last()) else { return false };
    let candidates = [
        format!("tests/tests/{file}.rs"),
        format!("guest/src/{file}.rs"),
        format!("host/src/{file}.rs"),
        format!("host/src/mirror/{file}.rs"),
        format!("host/src/nats/{file}.rs"),
        format!("host/src/runtime/{file}.rs"),
    ];
    candidates.iter().filter_map(|c| std::fs::read_to_string(tests::root().join(c)).ok()).any(|text| text.contains(&format!("fn {name}(")))
}

#[test]
fn every_architecture_invariant_names_a_test_that_exists() {
    let doc = std::fs::read_to_string(tests::root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let invariants: Vec<&str> = doc.split("**Architecture Invariant:**").skip(1).map(|p| p.split("\n\n").next().unwrap_or_default()).collect();
    assert!(invariants.len() >= 20, "found {} invariants", invariants.len());
    for inv in invariants {
        let named: Vec<&str> = inv
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| s.contains("::") && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':'))
            .collect();
        assert!(!named.is_empty(), "an invariant names no test:\n{inv}");
        for t in named {
            assert!(test_exists(t), "ARCHITECTURE.md names {t}, which is no test:\n{inv}");
        }
    }
}

/// The version each side says it speaks is the `wit/` folder's: a host refuses a component whose
/// build info names another (`reload.rs`), so a constant left behind at a WIT bump would refuse
/// every upgrade.
#[test]
fn host_and_guest_speak_the_version_of_the_wit_folder() {
    let wit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/provisioner.wit")).expect("the WIT file");
    let package = wit.lines().find_map(|l| l.trim().strip_prefix("package ")).and_then(|p| p.strip_suffix(';')).expect("a package line");
    assert_eq!(mesh_provisioner::WIT_VERSION, package, "the host's WIT_VERSION");
    assert_eq!(guest::WIT_VERSION, package, "the guest's WIT_VERSION");
}
