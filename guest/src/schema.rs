//! The JSON Schemas (draft 2020-12) of everything this server reads or writes on the wire: each
//! verb's request and answer, the error body, a notice, a state-change event and a state record
//! (feature `schema`; never in the component).
//!
//! Answers are derived (`schemars`) from the very types that write them, so a field added to a
//! reply is in its schema; what serde cannot say — an enum written as a `&'static str`, a map
//! written by hand, a page whose entries are rendered one by one — is said here from the same
//! names (`State::ALL`, `Check::NAMES`, …). Requests are read field by field, not derived, so
//! their schemas are built from the reader's own table (`What::ALL`, `What::allows`) and limits
//! (`MAX_LIMIT`, `MAX_AFTER`, `MAX_NAME_BYTES`). `docs/schema/` holds what [`all`] returns; a test
//! fails when the two differ.

use schemars::generate::SchemaSettings;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::escape::MAX_NAME_BYTES;
use crate::request::{What, MAX_AFTER, MAX_LIMIT};

/// Where the schemas' `$id`s start: a name, not a place to fetch from (the files are in
/// `docs/schema/`; `$SRV.INFO` names each endpoint's by these ids).
pub const ID_BASE: &str = "urn:mesh-provisioner:schema:";

/// The error codes the host's service layer writes itself, besides the guest's (`overloaded`:
/// a request past `--max-in-flight`, answered without calling the guest).
pub const HOST_CODES: [&str; 1] = ["overloaded"];

/// What an identifier (node, module, kind) may be, as `escape::is_identifier` checks it.
pub const IDENTIFIER_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_-]*$";

/// Every schema, by file name (`<name>.json` in `docs/schema/`), in a fixed order.
pub fn all() -> Vec<(&'static str, Value)> {
    vec![
        ("provisioning.request", provisioning_request()),
        (
            "provisioning.reply",
            with_revisions(
                derived::<crate::verb::AnyAnswer>(
                    "provisioning.reply",
                    "An answer of mesh-provisioner.provisioning: a page of one bucket, of module states, or of a value's holders, as the request's `what` asks.",
                ),
                &["BucketPage", "StatusPage", "HoldersPage", "CausesPage"],
            ),
        ),
        ("plan.request", plan_request()),
        (
            "plan.reply",
            with_revisions(
                derived::<crate::plan::PlanAnswer>(
                    "plan.reply",
                    "An answer of mesh-provisioner.plan: a module's plan, the builds it was read at and each need's provision.",
                ),
                &[],
            ),
        ),
        (
            "error",
            derived::<crate::reply::ErrorBody>(
                "error",
                "An error reply of either verb; the same code is in the Nats-Service-Error-Code header (400 bad_request, 503 unavailable, 500 internal).",
            ),
        ),
        ("notice", derived::<crate::holders::NoticeBody>("notice", "A notice on mesh-provisioner.notice.<node>: a value a module of the node holds changed.")),
        (
            "event",
            derived::<crate::transitions::StateEvent>(
                "event",
                "An event on mesh-provisioner.event.<node>: a module's state changed (published once, after its record was written).",
            ),
        ),
        (
            "state-record",
            derived::<crate::record::Record>(
                "state-record",
                "A record of mesh-provisioner_states, under <node>.<module>: the state the seat's holder last saw and since when.",
            ),
        ),
    ]
}

/// `schema` with `revisions` (SPEC §5), which `fresh::answer` ends every answer with, in each
/// answer object: the `$defs` named, or the root when none is.
fn with_revisions(mut schema: Value, answers: &[&str]) -> Value {
    let revisions = json!({
        "type": "object",
        "additionalProperties": { "type": "integer", "minimum": 0 },
        "description": "each bucket the answer read, with the newest revision of it the reads saw: the answer reflects at least that (an answer kept and served again says the revisions it was made with)",
    });
    let objects: Vec<&mut Value> = match answers {
        [] => vec![&mut schema],
        names => match schema.get_mut("$defs").and_then(Value::as_object_mut) {
            Some(defs) => defs.iter_mut().filter(|(name, _)| names.contains(&name.as_str())).map(|(_, v)| v).collect(),
            None => Vec::new(),
        },
    };
    for o in objects {
        if let Some(props) = o.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("revisions".into(), revisions.clone());
        }
    }
    schema
}

fn settings() -> SchemaGenerator {
    SchemaSettings::draft2020_12().for_serialize().into_generator()
}

/// The root schema of `T`, with its `$id` and a description.
fn derived<T: JsonSchema>(name: &str, description: &str) -> Value {
    let mut v = settings().into_root_schema_for::<T>().to_value();
    root(&mut v, name, description);
    v
}

fn root(v: &mut Value, name: &str, description: &str) {
    if let Some(o) = v.as_object_mut() {
        o.insert("$id".into(), Value::String(format!("{ID_BASE}{name}")));
        o.insert("description".into(), Value::String(description.into()));
        // Stable and short: the title is the file's name, not a Rust type's.
        o.insert("title".into(), Value::String(name.into()));
    }
}

/// A string, one of `names`.
pub(crate) fn one_of(names: &[&str]) -> Schema {
    json_schema!({ "type": "string", "enum": names })
}

fn identifier() -> Value {
    json!({ "type": "string", "pattern": IDENTIFIER_PATTERN, "maxLength": MAX_NAME_BYTES })
}

fn free_name() -> Value {
    json!({ "type": "string", "minLength": 1, "maxLength": MAX_NAME_BYTES, "description": "a free name, escaped by the server into one key token" })
}

/// The request of `mesh-provisioner.provisioning`: one object per `what`, each with exactly the
/// fields `What::allows` lets it have. An empty body is `{}` (the registry).
fn provisioning_request() -> Value {
    let field = |f: &str| -> Value {
        match f {
            "node" | "module" | "kind" => identifier(),
            "after_node" => {
                let mut v = identifier();
                v["description"] = json!("status: start after every module of this node (not with `after`)");
                v
            }
            "collection" | "name" => free_name(),
            "limit" => {
                json!({ "type": "integer", "minimum": 1, "description": format!("page size; above {MAX_LIMIT} it is clamped to {MAX_LIMIT}, the default") })
            }
            "after" => json!({ "type": "string", "minLength": 1, "maxLength": MAX_AFTER, "description": "a `next` this server handed out" }),
            fresh => fresh_field(fresh),
        }
    };
    let fields = ["node", "module", "kind", "collection", "name", "limit", "after", "after_node", "min_revision", "wait", "consistent"];
    let variants: Vec<Value> = What::ALL
        .iter()
        .map(|w| {
            let mut props = Map::new();
            let what = if *w == What::Registry { json!({ "const": "registry", "description": "absent: registry" }) } else { json!({ "const": w.name() }) };
            props.insert("what".into(), what);
            for f in fields.iter().filter(|f| w.allows(f)) {
                props.insert((*f).into(), field(f));
            }
            let required: Vec<&str> = match w {
                What::Registry => vec![],
                What::Holders => vec!["what", "kind", "name"],
                _ => vec!["what"],
            };
            let mut variant = json!({ "type": "object", "properties": props, "required": required, "additionalProperties": false });
            if w.allows("after_node") {
                variant["not"] = json!({ "required": ["after", "after_node"] });
            }
            variant["dependentSchemas"] = wait_needs_a_mark();
            variant
        })
        .collect();
    let mut v = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "oneOf": variants,
        "maxProperties": fields.len() + 1,
    });
    root(&mut v, "provisioning.request", "A request of mesh-provisioner.provisioning (at most 16 KiB of UTF-8; a field given twice is refused).");
    v
}

/// A field of read-your-writes (`fresh::FIELDS`), as `fresh::Fresh::read` reads it.
fn fresh_field(field: &str) -> Value {
    use crate::fresh::{DEFAULT_WAIT_MS, MAX_MARKS, MAX_WAIT_MS};
    match field {
        "min_revision" => json!({
            "type": "object",
            "minProperties": 1,
            "maxProperties": MAX_MARKS,
            "propertyNames": { "pattern": IDENTIFIER_PATTERN, "maxLength": MAX_NAME_BYTES },
            "additionalProperties": { "type": "integer", "minimum": 0 },
            "description": "read-your-writes: each bucket, or node share (`NODE_<node>`, whose sequence a node's writes to its own keys are acknowledged with), and the revision the answer is to reflect at least",
        }),
        "wait" => json!({
            "type": "string",
            "pattern": "^[0-9]{1,9}([.][0-9]{1,3})?(ms|s)$",
            "description": format!("how long `min_revision` or `consistent` may wait for the mirrors (default {DEFAULT_WAIT_MS} ms; above {MAX_WAIT_MS} ms it is clamped)"),
        }),
        "consistent" => json!({ "type": "boolean", "description": "reflect the revision each bucket read holds on the bus when the request came" }),
        _ => json!(false),
    }
}

/// `wait` only with something to wait for: a `min_revision`, or `consistent` true.
fn wait_needs_a_mark() -> Value {
    json!({ "wait": { "anyOf": [{ "required": ["min_revision"] }, { "required": ["consistent"], "properties": { "consistent": { "const": true } } }] } })
}

/// The request of `mesh-provisioner.plan`: a node and a module, and how fresh the plan is to be.
fn plan_request() -> Value {
    let mut v = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "node": identifier(),
            "module": identifier(),
            "min_revision": fresh_field("min_revision"),
            "wait": fresh_field("wait"),
            "consistent": fresh_field("consistent"),
        },
        "required": ["node", "module"],
        "additionalProperties": false,
        "dependentSchemas": wait_needs_a_mark(),
    });
    root(&mut v, "plan.request", "A request of mesh-provisioner.plan.");
    v
}

/// `schema_with` helpers: each enum written as a name, from the names its type gives.
pub(crate) mod names {
    use super::*;

    pub fn module_state(_: &mut SchemaGenerator) -> Schema {
        one_of(&crate::status::ModuleState::ALL.map(crate::status::ModuleState::name))
    }
    /// A module's state, or `gone`: no source knows it any more.
    pub fn event_state(_: &mut SchemaGenerator) -> Schema {
        let mut names: Vec<&str> = crate::status::ModuleState::ALL.map(crate::status::ModuleState::name).to_vec();
        names.push(crate::transitions::GONE);
        one_of(&names)
    }
    pub fn module_state_or_null(_: &mut SchemaGenerator) -> Schema {
        let mut names: Vec<Value> = crate::status::ModuleState::ALL.iter().map(|s| Value::from(s.name())).collect();
        names.push(Value::Null);
        json_schema!({ "enum": names })
    }
    pub fn check(_: &mut SchemaGenerator) -> Schema {
        one_of(&crate::checks::Check::NAMES)
    }
    pub fn currency(_: &mut SchemaGenerator) -> Schema {
        one_of(&crate::checks::Currency::ALL.map(crate::checks::Currency::name))
    }
    pub fn sources(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "array", "items": { "enum": crate::value::SOURCES }, "uniqueItems": true })
    }
    pub fn plan_state(_: &mut SchemaGenerator) -> Schema {
        one_of(&crate::plan::PlanState::ALL.map(crate::plan::PlanState::name))
    }
    pub fn roles(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "array", "items": { "enum": crate::plan::ROLES }, "minItems": 1, "uniqueItems": true })
    }
    pub fn code(_: &mut SchemaGenerator) -> Schema {
        let guest = crate::reply::Code::ALL.iter().filter(|c| **c != crate::reply::Code::Ok).map(|c| c.name());
        one_of(&guest.chain(HOST_CODES).collect::<Vec<_>>())
    }
    pub fn bucket_what(_: &mut SchemaGenerator) -> Schema {
        one_of(&[What::Registry, What::Needs, What::Applied, What::Collect].map(What::name))
    }
    pub fn status_what(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "const": "status" })
    }
    pub fn causes_what(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "const": "causes" })
    }
    pub fn cause_kind(_: &mut SchemaGenerator) -> Schema {
        one_of(&crate::causes::CauseKind::ALL.map(crate::causes::CauseKind::name))
    }
    pub fn holders_what(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "const": "holders" })
    }
    pub fn identifier(_: &mut SchemaGenerator) -> Schema {
        Schema::try_from(super::identifier()).unwrap_or_default()
    }
    pub fn timestamp(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "format": "date-time" })
    }
    pub fn utf8(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "const": "utf-8" })
    }
    pub fn base64(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "const": "base64" })
    }
    /// Any JSON: a stored value passed through as it is.
    pub fn any(_: &mut SchemaGenerator) -> Schema {
        json_schema!(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_names_its_draft_and_id() {
        for (name, v) in all() {
            assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema", "{name}");
            assert_eq!(v["$id"], format!("{ID_BASE}{name}"), "{name}");
        }
    }
}
