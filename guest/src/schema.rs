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
            derived::<crate::verb::AnyAnswer>(
                "provisioning.reply",
                "An answer of mesh-provisioner.provisioning: a page of one bucket, of module states, or of a value's holders, as the request's `what` asks.",
            ),
        ),
        ("plan.request", plan_request()),
        (
            "plan.reply",
            derived::<crate::plan::PlanAnswer>(
                "plan.reply",
                "An answer of mesh-provisioner.plan: a module's plan, the builds it was read at and each need's provision.",
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
            _ => json!(false),
        }
    };
    let fields = ["node", "module", "kind", "collection", "name", "limit", "after", "after_node"];
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

/// The request of `mesh-provisioner.plan`: a node and a module, nothing else.
fn plan_request() -> Value {
    let mut v = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": { "node": identifier(), "module": identifier() },
        "required": ["node", "module"],
        "additionalProperties": false,
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
