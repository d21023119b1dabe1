//! Replays the fuzz corpora on stable (CI has no nightly): every input in `fuzz/corpus/<target>/`
//! (seeds and the inputs `scripts/fuzz` kept, minimized) and in `fuzz/regressions/<target>/`
//! (every input that ever crashed or hung a target) goes through the same check the fuzz target
//! runs, `guest::fuzzing::<target>`. A missing corpus is a failure, not a pass.

use std::time::{Duration, Instant};

fn inputs(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file() && !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("a corpus file reads")))
        .collect();
    out.sort();
    out
}

#[test]
fn every_kept_fuzz_input_passes_its_check() {
    let fuzz = tests::root().join("fuzz");
    for (target, check) in guest::fuzzing::TARGETS {
        let corpus = inputs(&fuzz.join("corpus").join(target));
        assert!(!corpus.is_empty(), "no corpus for fuzz target {target} in fuzz/corpus/{target}");
        let regressions = inputs(&fuzz.join("regressions").join(target));
        for (name, data) in corpus.iter().chain(&regressions) {
            let started = Instant::now();
            if let Err(e) = std::panic::catch_unwind(|| check(data)) {
                let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                panic!("fuzz target {target}, input {name} ({} bytes): {why}", data.len());
            }
            // A hang the fuzzer once found must stay fixed (generous: this is a debug build).
            assert!(started.elapsed() < Duration::from_secs(5), "fuzz target {target}, input {name} took {:?}", started.elapsed());
        }
    }
}

#[test]
fn the_checks_catch_what_they_claim_to() {
    // A broken property panics (the replay above would report it), not only a crash.
    let caught = |f: fn(&[u8]), data: &[u8]| std::panic::catch_unwind(|| f(data)).is_ok();
    assert!(caught(guest::fuzzing::escape, b"db=2Eurl"));
    assert!(caught(guest::fuzzing::keys, b"alpha.app.config.db=2Eurl"));
    assert!(caught(guest::fuzzing::value, &[0xff, 0, b'{']));
    assert!(caught(guest::fuzzing::request, br#"{"what":"holders","kind":"bound","name":"postgres.db"}"#));
}

/// Each check fails on an implementation that breaks its property: passing good inputs proves
/// nothing about what a check would catch.
#[test]
fn each_check_fails_an_implementation_that_breaks_its_property() {
    let fails = |f: &dyn Fn(), what: &str| assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err(), "the check passed {what}");
    // An encoder that leaves a '.' in a token (a name would then span two key tokens).
    fn dotted(name: &str) -> String {
        guest::escape::encode(name).replace("=2E", ".")
    }
    fails(&|| guest::fuzzing::escape_with(dotted, guest::escape::decode, b"db.url"), "an encoder leaving '.' unescaped");
    // A decoder that also takes lower-case hex (two spellings of one name).
    fn loose(token: &str) -> Result<String, String> {
        guest::escape::decode(&token.to_uppercase())
    }
    fails(&|| guest::fuzzing::escape_with(guest::escape::encode, loose, b"db=2eurl"), "a decoder taking lower-case escapes");
    // A way of showing values that drops bytes it cannot read as UTF-8.
    fn lossy(_: &[u8]) -> guest::value::Shown<'_> {
        guest::value::Shown::Binary { value: String::new(), encoding: "base64" }
    }
    fails(&|| guest::fuzzing::value_with(lossy, &[0xff, 0, b'{']), "a value shown without its bytes");
    // A request reader that takes a wildcard for a node.
    fn wild(body: &[u8]) -> Result<guest::request::Query, String> {
        let mut q = guest::request::parse(br#"{"what":"needs"}"#)?;
        q.node = std::str::from_utf8(body).ok().map(str::to_string);
        Ok(q)
    }
    fails(&|| guest::fuzzing::request_with(wild, guest::request::parse_plan, b"*"), "a reader taking * as a node");
}
