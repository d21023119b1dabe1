//! The JSON Schemas in `docs/schema/` are what the types that write the wire say, they are
//! schemas, and they say what the readers do: every answer of every `what` fits its schema, a
//! broken answer does not, and the request schemas accept exactly what the request readers
//! accept (identifiers, fields per `what`, `limit`, cursor length).

use guest::keys;
use guest::mem_env::MemEnv;
use proptest::prelude::*;
use serde_json::{json, Value};
use tests::schema;

/// Set to exactly `1` to write `docs/schema/` from the types instead of comparing.
const REGENERATE: &str = "MESH_PROVISIONER_REGENERATE_SCHEMAS";

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("a schema is JSON") + "\n"
}

#[test]
fn docs_schema_holds_exactly_what_the_types_say() {
    let dir = schema::dir();
    let generated = guest::schema::all();
    if std::env::var(REGENERATE).as_deref() == Ok("1") {
        std::fs::create_dir_all(&dir).expect("make docs/schema");
        for (name, v) in &generated {
            std::fs::write(dir.join(format!("{name}.json")), pretty(v)).expect("write a schema");
        }
    }
    let mut drifted = Vec::new();
    for (name, v) in &generated {
        let file = dir.join(format!("{name}.json"));
        if std::fs::read_to_string(&file).ok().as_deref() != Some(pretty(v).as_str()) {
            drifted.push(name.to_string());
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("docs/schema")
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".json")).map(str::to_string))
        .collect();
    on_disk.sort();
    let mut names: Vec<String> = generated.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert!(
        drifted.is_empty(),
        "docs/schema/ differs from the types for {drifted:?}: run `{REGENERATE}=1 cargo test -p tests --test schemas` and review the diff"
    );
    assert_eq!(on_disk, names, "docs/schema/ holds a schema no type writes, or lacks one");
}

#[test]
fn every_schema_is_a_draft_2020_12_schema_with_its_own_id() {
    for (name, v) in guest::schema::all() {
        if let Err(e) = jsonschema::meta::validate(&v) {
            panic!("{name} is not a valid schema: {e}");
        }
        assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema", "{name}");
        assert_eq!(v["$id"], format!("{}{name}", guest::schema::ID_BASE), "{name}");
    }
}

/// A mesh with something of every kind: needs (in shape, out of shape, a value that is not
/// JSON, one that is not UTF-8), an applied record, a collection, a bound value, assignments,
/// a provider, compositions and builds.
fn mesh() -> MemEnv {
    let env = MemEnv::default();
    env.put(keys::NEEDS, "alpha.app.config.db_url", br#"{"part":"api"}"#);
    env.put(keys::NEEDS, "alpha.app.bound.postgres=2Edb", b"{}");
    env.put(keys::NEEDS, "alpha.app.secret.token", b"plain text");
    env.put(keys::NEEDS, "alpha.app.dir.state", &[0xff, 0x00, 0x80]);
    env.put(keys::NEEDS, "alpha.app", b"short");
    env.put(keys::APPLIED, "alpha.app", br#"{"build":"b1","needs":2,"values":{"bound:postgres.db":3,"config:db_url":1}}"#);
    env.put(keys::APPLIED, "alpha.ghost.extra", b"{}");
    env.put(keys::COLLECT, "alpha.shell=3Azsh.app", br#"{"line":"x"}"#);
    env.put("postgres_bound", "alpha.app.db", b"{}");
    env.put("mesh-config_values", "alpha.app.db_url", b"x");
    env.put("mesh-controller_assignments", "alpha.app", br#"{"want":"b2"}"#);
    env.put("mesh-controller_assignments", "beta.postgres", br#"{"want":"p1"}"#);
    env.put("mesh-indexer_builds", "app", br#"{"newest":"b3"}"#);
    env.put("composed-alpha", "app.b2", tests::sample_composition().as_bytes());
    env.put("composed-alpha", "app.b3", br#"{"state":"refused","reason":"a cycle"}"#);
    env
}

fn answer(env: &MemEnv, verb: &str, body: &Value, budget: u32) -> (guest::verb::Code, Value) {
    let r = guest::verb::handle(env, verb, body.to_string().as_bytes(), budget);
    (r.code, serde_json::from_slice(&r.body).expect("an answer is JSON"))
}

/// Every page of `body`'s answer at `budget`, each checked against its schema.
fn every_page_fits(env: &MemEnv, body: Value, budget: u32) -> usize {
    let mut body = body;
    let mut pages = 0;
    loop {
        let (code, v) = answer(env, guest::verb::PROVISIONING, &body, budget);
        schema::check(if code == guest::verb::Code::Ok { "provisioning.reply" } else { "error" }, &v);
        pages += 1;
        match v.get("next") {
            Some(n) if pages < 1000 => body["after"] = n.clone(),
            _ => return pages,
        }
    }
}

#[test]
fn every_answer_of_every_what_fits_its_schema_at_any_budget() {
    let env = mesh();
    let asks = [
        json!({}),
        json!({"what":"registry","kind":"config"}),
        json!({"what":"needs","node":"alpha"}),
        json!({"what":"applied"}),
        json!({"what":"collect","node":"alpha","collection":"shell:zsh"}),
        json!({"what":"status","node":"alpha"}),
        json!({"what":"status"}),
        json!({"what":"holders","kind":"bound","name":"postgres.db"}),
        json!({"what":"holders","kind":"config","name":"db_url","node":"alpha"}),
        json!({"what":"needs","limit":1}),
    ];
    for budget in [4096, 8192, 1 << 20] {
        for ask in &asks {
            every_page_fits(&env, ask.clone(), budget);
        }
    }
    for plan in [json!({"node":"alpha","module":"app"}), json!({"node":"alpha","module":"nothing"}), json!({"node":"beta","module":"postgres"})] {
        let (code, v) = answer(&env, guest::verb::PLAN, &plan, 1 << 20);
        assert_eq!(code, guest::verb::Code::Ok, "{v}");
        schema::check("plan.reply", &v);
    }
    for bad in [json!({"what":"nothing"}), json!({"node":"a.b"}), json!({"what":"holders"})] {
        let (code, v) = answer(&env, guest::verb::PROVISIONING, &bad, 4096);
        assert_eq!(code, guest::verb::Code::BadRequest, "{v}");
        schema::check("error", &v);
    }
}

#[test]
fn a_broken_answer_does_not_fit() {
    let env = mesh();
    let (_, status) = answer(&env, guest::verb::PROVISIONING, &json!({"what":"status","node":"alpha"}), 1 << 20);
    assert!(schema::errors("provisioning.reply", &status).is_empty());
    let broken: [(&str, fn(&mut Value)); 5] = [
        ("a state no module has", |v| v["entries"][0]["state"] = json!("fine")),
        ("a check of no name", |v| v["entries"][0]["needs"][0]["check"] = json!("looks ok")),
        ("no node", |v| drop(v["entries"][0].as_object_mut().map(|o| o.remove("node")))),
        ("a revision that is text", |v| v["revision"] = json!("7")),
        ("a since that is no time", |v| v["entries"][0]["since"] = json!("yesterday")),
    ];
    for (what, breaks) in broken {
        let mut v = status.clone();
        breaks(&mut v);
        assert!(!schema::errors("provisioning.reply", &v).is_empty(), "{what} fits the schema: {v}");
    }
    let mut error = json!({"error":{"code":"bad_request","message":"x"}});
    assert!(schema::errors("error", &error).is_empty());
    error["error"]["code"] = json!("teapot");
    assert!(!schema::errors("error", &error).is_empty(), "an unknown error code fits");
    let event = json!({"node":"alpha","module":"app","state":"applied","was":null,"reason":"r","since":"2026-12-01T10:00:00Z"});
    assert!(schema::errors("event", &event).is_empty());
    let gone = json!({"node":"alpha","module":"app","state":"gone","was":"applied","reason":"r","since":"2026-12-01T10:00:00Z"});
    assert!(schema::errors("event", &gone).is_empty(), "a module gone is an event");
    for (field, bad) in [("state", json!("done")), ("node", json!("a.b")), ("since", json!("now"))] {
        let mut e = event.clone();
        e[field] = bad;
        assert!(!schema::errors("event", &e).is_empty(), "an event with {field} {e} fits");
    }
}

/// The fields a request may be made of, with values in and out of each field's rules.
fn field() -> impl Strategy<Value = (&'static str, Value)> {
    let text = prop_oneof![
        Just(json!("alpha")),
        Just(json!("a-b_9")),
        Just(json!("*")),
        Just(json!("a.b")),
        Just(json!("")),
        Just(json!("é")),
        Just(json!("x".repeat(256))),
        Just(json!("x".repeat(257))),
        Just(json!(7)),
        Just(json!(null)),
    ];
    let whats = prop_oneof![
        Just(json!("registry")),
        Just(json!("needs")),
        Just(json!("applied")),
        Just(json!("collect")),
        Just(json!("status")),
        Just(json!("holders")),
        Just(json!("plan")),
        Just(json!(1)),
    ];
    let limits = prop_oneof![Just(json!(0)), Just(json!(1)), Just(json!(1000)), Just(json!(5000)), Just(json!(-1)), Just(json!("10"))];
    let afters = prop_oneof![Just(json!("")), Just(json!("alpha.app")), Just(json!("x".repeat(4096))), Just(json!("x".repeat(4097))), Just(json!(3))];
    let marks = prop_oneof![
        Just(json!({"mesh-provisioner_needs": 42})),
        Just(json!({"NODE_alpha": 0, "composed-alpha": 7})),
        Just(json!({})),
        Just(json!({"a.b": 1})),
        Just(json!({"NODE_alpha": -1})),
        Just(json!({"NODE_alpha": 1.5})),
        Just(json!(Value::Object((0..17).map(|i| (format!("b{i}"), json!(1))).collect()))),
        Just(json!([1])),
    ];
    let waits = prop_oneof![
        Just(json!("250ms")),
        Just(json!("1.5s")),
        Just(json!("999999999s")),
        Just(json!("1.2.3s")),
        Just(json!(".5s")),
        Just(json!("1234567890ms")),
        Just(json!("3")),
        Just(json!(3)),
    ];
    let consistent = prop_oneof![Just(json!(true)), Just(json!(false)), Just(json!("true"))];
    prop_oneof![
        marks.prop_map(|v| ("min_revision", v)),
        waits.prop_map(|v| ("wait", v)),
        consistent.prop_map(|v| ("consistent", v)),
        whats.prop_map(|v| ("what", v)),
        text.clone().prop_map(|v| ("node", v)),
        text.clone().prop_map(|v| ("module", v)),
        text.clone().prop_map(|v| ("kind", v)),
        text.clone().prop_map(|v| ("collection", v)),
        text.prop_map(|v| ("name", v)),
        limits.prop_map(|v| ("limit", v)),
        afters.prop_map(|v| ("after", v)),
        Just(("extra", json!(true))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_request_schemas_accept_exactly_what_the_readers_accept(fields in proptest::collection::vec(field(), 0..5)) {
        let mut o = serde_json::Map::new();
        for (k, v) in fields {
            // A field given twice is refused by the reader and cannot be said in a schema (a
            // JSON object has one value per name): the generator gives each field once.
            o.entry(k).or_insert(v);
        }
        let body = Value::Object(o);
        let bytes = body.to_string();
        let read = guest::request::parse(bytes.as_bytes()).is_ok();
        prop_assert_eq!(schema::errors("provisioning.request", &body).is_empty(), read, "provisioning {}", bytes);
        let read = guest::request::parse_plan(bytes.as_bytes()).is_ok();
        prop_assert_eq!(schema::errors("plan.request", &body).is_empty(), read, "plan {}", bytes);
    }
}

#[test]
fn an_identifier_fits_the_pattern_exactly_when_the_reader_takes_it() {
    let ident = json!({"type":"string","pattern": guest::schema::IDENTIFIER_PATTERN});
    let v = jsonschema::validator_for(&ident).expect("a schema");
    for b in 0u8..=255 {
        for s in [format!("{}", b as char), format!("a{}", b as char), format!("{}a", b as char)] {
            assert_eq!(v.is_valid(&json!(s)), guest::escape::is_identifier(&s), "{s:?}");
        }
    }
}
