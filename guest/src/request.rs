//! Reading and validating a request of the verb `mesh-provisioner.provisioning` (SPEC §5).
//!
//! Everything a requester controls is checked before any read: the body's size and encoding,
//! that it is one JSON object without repeated fields, each field's type, which fields apply to
//! `what`, identifiers, and the paging limit (clamped). A request is refused, never widened.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::escape::{identifier_problem, name_problem, shorten};
use crate::fresh::Fresh;

/// Largest request body read; a request is a handful of short fields.
pub const MAX_BODY: usize = 16 * 1024;
/// Default and largest page.
pub const MAX_LIMIT: u32 = 1000;
/// Longest `after` cursor: the longest key a mirror holds (a subject fits a 4 KiB control
/// line), so every `next` the server hands out is accepted back.
pub const MAX_AFTER: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Registry,
    Needs,
    Applied,
    Collect,
    Status,
    Holders,
    Causes,
}

impl What {
    /// Every `what`, in the order the SPEC lists them.
    pub const ALL: [What; 7] = [What::Registry, What::Needs, What::Applied, What::Collect, What::Status, What::Holders, What::Causes];

    pub fn name(self) -> &'static str {
        match self {
            What::Registry => "registry",
            What::Needs => "needs",
            What::Applied => "applied",
            What::Collect => "collect",
            What::Status => "status",
            What::Holders => "holders",
            What::Causes => "causes",
        }
    }

    /// Whether a request for `self` may carry `field`.
    pub fn allows(self, field: &str) -> bool {
        matches!(
            (self, field),
            (_, "what" | "limit" | "after" | "min_revision" | "wait" | "consistent")
                | (What::Registry, "kind")
                | (What::Needs, "node" | "module" | "kind")
                | (What::Applied, "node" | "module")
                | (What::Collect, "node" | "module" | "collection")
                | (What::Status, "node" | "module" | "after_node")
                | (What::Holders, "node" | "kind" | "name")
                | (What::Causes, "node" | "module")
        )
    }
}

/// A validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub what: What,
    pub node: Option<String>,
    pub module: Option<String>,
    pub kind: Option<String>,
    /// The decoded collection name.
    pub collection: Option<String>,
    /// The decoded need name (`holders`).
    pub name: Option<String>,
    pub limit: u32,
    pub after: Option<String>,
    /// `status` only: start after every module of this node (a reader that shows a few of a
    /// node's modules skips the rest of them).
    pub after_node: Option<String>,
    /// How fresh the answer is to be (`min_revision`, `wait`, `consistent`).
    pub fresh: Fresh,
}

/// A JSON object read field by field, refusing a field given twice (serde_json would keep the
/// last, letting `{"node":"alpha","node":"*"}` slip past a reviewer's eye).
pub struct Fields(pub Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            // serde's own message for any other JSON quotes the value whole: say only what it is.
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Fields, E> {
                Err(E::custom("a string, not a JSON object"))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Fields, A::Error> {
                Err(serde::de::Error::custom("an array, not a JSON object"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields: Vec<(String, Value)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    if fields.iter().any(|(seen, _)| *seen == k) {
                        return Err(serde::de::Error::custom(format!("field {:?} is given twice", shorten(&k))));
                    }
                    fields.push((k, v));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads a body into its fields: at most [`MAX_BODY`] bytes of UTF-8 holding one JSON object.
/// An empty body is `{}`.
pub fn fields(body: &[u8]) -> Result<Vec<(String, Value)>, String> {
    if body.len() > MAX_BODY {
        return Err(format!("the body is {} bytes; at most {MAX_BODY} are read", body.len()));
    }
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str::<Fields>(text).map(|f| f.0).map_err(|e| format!("the body must be one JSON object: {e}"))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The field's string, or why it is not one.
pub fn string_field(field: &str, v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!("field `{field}` must be a string, not {}", type_name(other))),
    }
}

/// The field's identifier, or why it is not one.
pub fn identifier_field(field: &str, v: &Value) -> Result<String, String> {
    let s = string_field(field, v)?;
    match identifier_problem(&s) {
        None => Ok(s),
        Some(p) => Err(format!("field `{field}` {p}")),
    }
}

pub fn parse(body: &[u8]) -> Result<Query, String> {
    let fields = fields(body)?;
    let what = match fields.iter().find(|(k, _)| k == "what") {
        None => What::Registry,
        Some((_, v)) => match string_field("what", v)?.as_str() {
            "registry" => What::Registry,
            "needs" => What::Needs,
            "applied" => What::Applied,
            "collect" => What::Collect,
            "status" => What::Status,
            "holders" => What::Holders,
            "causes" => What::Causes,
            other => return Err(format!("field `what` is {:?}; it is one of registry, needs, applied, collect, status, holders, causes", shorten(other))),
        },
    };
    let mut q = Query {
        what,
        node: None,
        module: None,
        kind: None,
        collection: None,
        name: None,
        limit: MAX_LIMIT,
        after: None,
        after_node: None,
        fresh: Fresh::default(),
    };
    for (field, v) in &fields {
        let known = matches!(field.as_str(), "what" | "node" | "module" | "kind" | "collection" | "name" | "limit" | "after" | "after_node");
        if !known && !crate::fresh::FIELDS.contains(&field.as_str()) {
            return Err(format!("unknown field {:?}", shorten(field)));
        }
        if !what.allows(field) {
            return Err(format!("field `{field}` does not apply to what={}", what.name()));
        }
        match field.as_str() {
            "node" => q.node = Some(identifier_field(field, v)?),
            "module" => q.module = Some(identifier_field(field, v)?),
            "kind" => q.kind = Some(identifier_field(field, v)?),
            "collection" => {
                let c = string_field(field, v)?;
                if let Some(p) = name_problem(&c) {
                    return Err(format!("field `collection` {p}"));
                }
                q.collection = Some(c);
            }
            "name" => {
                let n = string_field(field, v)?;
                if let Some(p) = name_problem(&n) {
                    return Err(format!("field `name` {p}"));
                }
                q.name = Some(n);
            }
            "limit" => q.limit = limit(v)?,
            "after" => q.after = Some(after(v)?),
            "after_node" => q.after_node = Some(identifier_field(field, v)?),
            "what" => {}
            fresh => q.fresh.read(fresh, v)?,
        }
    }
    q.fresh.check()?;
    if q.after.is_some() && q.after_node.is_some() {
        return Err("fields `after` and `after_node` are both given; a page starts after one of them".into());
    }
    if what == What::Holders {
        for (field, given) in [("kind", q.kind.is_some()), ("name", q.name.is_some())] {
            if !given {
                return Err(format!("field `{field}` is required by what=holders (e.g. {{\"what\":\"holders\",\"kind\":\"bound\",\"name\":\"postgres.db\"}})"));
            }
        }
    }
    Ok(q)
}

/// A request of the verb `mesh-provisioner.plan`: `node` and `module`, both required, both
/// identifiers, nothing else.
pub fn parse_plan(body: &[u8]) -> Result<(String, String), String> {
    parse_plan_fresh(body).map(|(node, module, _)| (node, module))
}

/// A request of the verb `mesh-provisioner.plan`: `node` and `module`, both required, both
/// identifiers, and how fresh the plan is to be (`min_revision`, `wait`, `consistent`).
pub fn parse_plan_fresh(body: &[u8]) -> Result<(String, String, Fresh), String> {
    let (mut node, mut module, mut fresh) = (None, None, Fresh::default());
    for (field, v) in fields(body)? {
        match field.as_str() {
            "node" => node = Some(identifier_field(&field, &v)?),
            "module" => module = Some(identifier_field(&field, &v)?),
            f if crate::fresh::FIELDS.contains(&f) => fresh.read(f, &v)?,
            other => return Err(format!("unknown field {:?}; a plan is asked by node and module", shorten(other))),
        }
    }
    fresh.check()?;
    match (node, module) {
        (Some(n), Some(m)) => Ok((n, m, fresh)),
        (None, _) => Err("field `node` is required".into()),
        (_, None) => Err("field `module` is required".into()),
    }
}

/// `limit` is a whole number from 1; above [`MAX_LIMIT`] it is clamped.
fn limit(v: &Value) -> Result<u32, String> {
    match v.as_u64() {
        Some(0) => Err("field `limit` must be at least 1".into()),
        Some(n) => Ok(n.min(MAX_LIMIT as u64) as u32),
        None => Err(format!("field `limit` must be a whole number from 1, not {}", shorten(&v.to_string()))),
    }
}

/// `after` is a cursor, compared with keys and never used as a filter, so any key the server
/// listed (whatever its characters) is accepted back; only its length is bounded.
fn after(v: &Value) -> Result<String, String> {
    let s = string_field("after", v)?;
    if s.is_empty() || s.len() > MAX_AFTER {
        return Err(format!("field `after` must be 1 to {MAX_AFTER} bytes, not {}", s.len()));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_body_asks_for_the_registry() {
        let q = parse(b"").unwrap();
        assert_eq!((q.what, q.limit), (What::Registry, MAX_LIMIT));
        assert_eq!(parse(b"  {} ").unwrap().what, What::Registry);
    }

    #[test]
    fn clamps_the_limit_at_its_edges() {
        assert_eq!(parse(br#"{"limit":1}"#).unwrap().limit, 1);
        assert_eq!(parse(br#"{"limit":1000}"#).unwrap().limit, 1000);
        assert_eq!(parse(br#"{"limit":1001}"#).unwrap().limit, 1000);
        assert_eq!(parse(br#"{"limit":18446744073709551615}"#).unwrap().limit, 1000);
        assert!(parse(br#"{"limit":0}"#).unwrap_err().contains("at least 1"));
        assert!(parse(br#"{"limit":-1}"#).unwrap_err().contains("whole number"));
        assert!(parse(br#"{"limit":2.5}"#).unwrap_err().contains("whole number"));
    }

    #[test]
    fn takes_any_key_back_as_after_up_to_the_longest_a_key_may_be() {
        // A cursor is compared with keys, never used as a filter: whatever a key holds is fine.
        for key in ["alpha.>", "alpha.*.x", "a b", "é", "alpha.app.config.=3a"] {
            assert_eq!(parse(json_after(key).as_bytes()).unwrap().after.as_deref(), Some(key));
        }
        let longest = "k".repeat(MAX_AFTER);
        assert_eq!(parse(json_after(&longest).as_bytes()).unwrap().after.as_deref(), Some(longest.as_str()));
        assert!(parse(json_after(&"k".repeat(MAX_AFTER + 1)).as_bytes()).unwrap_err().contains("not 4097"));
        assert!(parse(br#"{"after":""}"#).unwrap_err().contains("1 to 4096 bytes"));
    }

    fn json_after(key: &str) -> String {
        serde_json::json!({ "after": key }).to_string()
    }

    #[test]
    fn says_what_a_body_that_is_not_an_object_is_without_quoting_it() {
        let long = format!("\"{}\"", "\\\\".repeat(2000));
        let e = parse(long.as_bytes()).unwrap_err();
        assert!(e.contains("a string, not a JSON object") && e.len() < 200, "{e}");
        assert!(parse(b"[1,2]").unwrap_err().contains("an array, not a JSON object"));
        assert!(parse(b"7").unwrap_err().contains("one JSON object"));
    }

    #[test]
    fn refuses_a_field_given_twice() {
        let e = parse(br#"{"what":"needs","node":"alpha","node":"*"}"#).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn asks_a_plan_by_node_and_module_only() {
        assert_eq!(parse_plan(br#"{"node":"alpha","module":"app"}"#).unwrap(), ("alpha".into(), "app".into()));
        assert!(parse_plan(br#"{"node":"alpha"}"#).unwrap_err().contains("`module` is required"));
        assert!(parse_plan(b"").unwrap_err().contains("`node` is required"));
        assert!(parse_plan(br#"{"node":"*","module":"app"}"#).unwrap_err().contains("field `node`"));
        assert!(parse_plan(br#"{"node":"alpha","module":"app","what":"needs"}"#).unwrap_err().contains("unknown field"));
        assert!(parse_plan(br#"{"node":"alpha","module":"app","module":"web"}"#).unwrap_err().contains("given twice"));
        assert!(parse_plan(br#"["alpha","app"]"#).unwrap_err().contains("one JSON object"));
    }

    #[test]
    fn refuses_a_body_over_the_limit() {
        let body = vec![b' '; MAX_BODY + 1];
        assert!(parse(&body).unwrap_err().contains("at most"));
    }
}
