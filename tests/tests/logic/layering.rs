//! ARCHITECTURE.md's layering invariant: in the host and in the guest, each file uses only what
//! is below it — no two modules reach each other, directly or around a circle. Read from the
//! sources: every `crate::<module>` a file names (in code, not in comments). And the structure's
//! other invariants read from the sources: the host knows no key shape, runs on one thread,
//! branches on no error's text, and speaks the `wit/` folder's version as the guest does.

use std::collections::{BTreeMap, BTreeSet};

/// Every `.rs` file below `dir`, by its path below `dir`.
fn sources(dir: &str) -> Vec<(String, String)> {
    let src = tests::root().join(dir);
    let mut out = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(at) = dirs.pop() {
        for entry in std::fs::read_dir(&at).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                out.push((path.strip_prefix(&src).expect("under src").to_string_lossy().to_string(), text));
            }
        }
    }
    out
}

/// The module a file is part of, at most `depth` path segments deep: with 2,
/// `serve/states.rs` is `serve::states`, `store/mirror/table.rs` is `store::mirror`, `cli.rs`
/// is `cli`.
fn module_of(rel: &str, depth: usize) -> String {
    let parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').filter(|p| *p != "mod").collect();
    parts[..parts.len().min(depth)].join("::")
}

/// The modules of the crate in `dir` (a root file, or a folder's file, `depth` segments deep)
/// and the modules each one names; `glue` modules (the crate root, the bindings, the
/// feature-only schema and fuzzing checks, which name everything by design) are left out, and
/// so are the lines that only derive a schema. Read from the sources: every `crate::<path>` a
/// file names in code, not in comments.
fn uses(dir: &str, depth: usize, glue: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let root = tests::root().join(dir);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in sources(dir) {
        let module = module_of(&rel, depth);
        if glue.contains(&module.as_str()) {
            continue;
        }
        let used = graph.entry(module.clone()).or_default();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//") && !l.contains("feature = \"schema\"")) {
            for (at, _) in line.match_indices("crate::") {
                let path: Vec<String> = line[at + 7..]
                    .split("::")
                    .map(|seg| seg.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>())
                    .take_while(|seg| seg.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
                    .take(depth)
                    .collect();
                let Some(first) = path.first() else { continue };
                // A folder's module is named by two segments, a root file's by one.
                let name = if root.join(first).is_dir() { path.join("::") } else { first.clone() };
                if name != module && !glue.contains(&name.as_str()) {
                    used.insert(name);
                }
            }
        }
    }
    graph
}

/// The host's layers as ARCHITECTURE.md's "Layers" list gives them, top first: each line's
/// folders (`serve/`) and root files (`cli.rs`), named without the slash or `.rs`.
fn layers() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(tests::root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = doc.split("\n## Layers").nth(1).expect("ARCHITECTURE.md has a \"## Layers\" section");
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter(|l| l.starts_with("- "))
        .map(|l| {
            let head = l.split(" — ").next().unwrap_or(l);
            head.split('`').skip(1).step_by(2).map(|n| n.trim_end_matches('/').trim_end_matches(".rs").to_string()).collect::<Vec<_>>()
        })
        .filter(|names| !names.is_empty())
        .collect()
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
fn each_host_folder_uses_only_the_folders_below_it() {
    let layers = layers();
    // Every folder and root file of the host is on the list, and nothing else is.
    let mut present: BTreeSet<String> = BTreeSet::new();
    for entry in std::fs::read_dir(tests::root().join("host/src")).expect("host/src") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().trim_end_matches(".rs").to_string();
        if (path.is_dir() || path.extension().is_some_and(|e| e == "rs")) && name != "lib" && name != "main" {
            present.insert(name);
        }
    }
    let listed: BTreeSet<String> = layers.iter().flatten().cloned().collect();
    assert_eq!(present, listed, "ARCHITECTURE.md's layers and host/src differ");
    assert!(layers.len() >= 5, "the layers read: {layers:?}");
    let level = |module: &str| layers.iter().position(|line| line.iter().any(|n| module.split("::").next() == Some(n.as_str())));
    let graph = uses("host/src", 2, &["lib", "main"]);
    assert!(
        graph.get("serve::states").is_some_and(|u| u.contains("serve::inputs") && u.contains("base::wire")),
        "the reading of the sources found no uses: {graph:?}"
    );
    let mut upward = Vec::new();
    for (module, used) in &graph {
        let folder = module.split("::").next();
        let Some(at) = level(module) else {
            upward.push(format!("{module} is on no line"));
            continue;
        };
        for u in used {
            match level(u) {
                Some(below) if below > at || u.split("::").next() == folder => {}
                _ => upward.push(format!("{module} uses {u}")),
            }
        }
    }
    assert!(upward.is_empty(), "uses that do not go down the layers:\n{}", upward.join("\n"));
}

#[test]
fn no_host_module_reaches_back_to_itself() {
    let graph = uses("host/src", 2, &["lib", "main"]);
    assert!(graph.get("serve::plans").is_some_and(|u| u.contains("serve::inputs")), "the reading of the sources found no uses: {graph:?}");
    let circles: Vec<String> = graph.keys().filter_map(|m| circle(&graph, m)).map(|c| c.join(" -> ")).collect();
    assert!(circles.is_empty(), "host modules in a circle:\n{}", circles.join("\n"));
}

#[test]
fn no_guest_module_reaches_back_to_itself() {
    // The test support (`mem_env`) counts like any module: no answer's tests may reach back to
    // it through another answer.
    let graph = uses("guest/src", 1, &["lib", "bindings", "fixture", "schema", "fuzzing", "every_page_fits"]);
    // The answers sit above what they share: replies, module listing, places and checks.
    for (above, below) in [
        ("verb", "status"),
        ("verb", "holders"),
        ("status", "checks"),
        ("holders", "checks"),
        ("status", "modules"),
        ("status", "reply"),
        ("status", "mem_env"),
    ] {
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
    // (`serve/demo.rs` writes a fixed mesh as a node client would: data, never read back.)
    let tells = ["from_str_radix", "=2E", "=3A", "parse_need", "parse_applied", "parse_collect", "parse_registry", "split('.').nth(1", "split('.').nth(2"];
    let found: Vec<String> = host_code()
        .iter()
        .filter(|(file, _)| file != "serve/demo.rs")
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
fn the_verbs_and_the_followers_run_on_a_thread_each() {
    let main = host_code().into_iter().find(|(f, _)| f == "main.rs").expect("main.rs").1;
    assert!(main.contains("#[tokio::main(flavor = \"current_thread\")]"), "main.rs does not run on one thread");
    let runtimes: Vec<String> = host_code()
        .iter()
        .flat_map(|(file, code)| {
            code_lines(code)
                .filter(|l| l.contains("new_multi_thread") || l.contains("flavor = \"multi_thread\"") || l.contains("new_current_thread"))
                .map(move |l| format!("{file}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    // The one runtime beside main's: the followers' thread.
    assert!(runtimes.len() == 1 && runtimes[0].starts_with("serve/followers.rs: "), "runtimes other than main's and the followers': {runtimes:#?}");
    // The HTTP side runs there too: a page writes every module's state, a status read tallies them.
    let serve = host_code().into_iter().find(|(f, _)| f == "serve/mod.rs").expect("serve/mod.rs").1;
    let http: Vec<&str> = code_lines(&serve).filter(|l| l.contains("serve::http::serve")).collect();
    assert!(!http.is_empty() && http.iter().all(|l| l.contains("followers.spawn(")), "the HTTP side is not spawned on the followers' thread: {http:#?}");
}

/// Whether the test `path` ARCHITECTURE.md names exists: `e2e::accounts::name` in
/// `tests/tests/e2e/accounts.rs`, `serve::states::tests::name` in `host/src/serve/states.rs`,
/// `status::name` in `guest/src/status.rs` (a leading `guest::` or `mesh_provisioner::` names
/// the crate) — some prefix of it is a file that holds `fn name(`.
fn test_exists(path: &str) -> bool {
    let parts: Vec<&str> = path.split("::").collect();
    let Some(name) = parts.last() else { return false };
    let (roots, parts): (&[&str], &[&str]) = match parts.first() {
        Some(&"guest") => (&["guest/src"], &parts[1..]),
        Some(&"mesh_provisioner") => (&["host/src"], &parts[1..]),
        _ => (&["tests/tests", "guest/src", "host/src"], &parts[..]),
    };
    (1..parts.len()).rev().any(|k| {
        let p = parts[..k].join("/");
        roots
            .iter()
            .flat_map(|r| [format!("{r}/{p}.rs"), format!("{r}/{p}/mod.rs"), format!("{r}/{p}/main.rs")])
            .filter_map(|c| std::fs::read_to_string(tests::root().join(c)).ok())
            .any(|text| text.contains(&format!("fn {name}(")))
    })
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
