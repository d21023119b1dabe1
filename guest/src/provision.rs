//! Provisions (SPEC §6): each need of a plan resolved against the compiled registry to the
//! concrete place its value will be found.
//!
//! The registry table is the one source: a domain's key shape (`<node>.<module>.<name>`,
//! `<node>.<module>.<provision>[.<local>]`, `<node>.<collection>.<contributor>`, …) is filled in
//! with the node, the module and what the need's name holds, each free name escaped. A token the
//! need cannot fill (a collection's contributors) becomes `*`, and the place is a subject
//! `filter` rather than a `key`. A kind no domain answers is `unanswered`; a need whose name does
//! not fit its kind is `malformed` with the reason. No need is dropped.

use std::borrow::Cow;

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::escape::{encoded, identifier_problem, name_problem, shorten};
use crate::registry::{self, Answer, Domain};

/// One need of a plan, as the composition lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Need {
    pub kind: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
}

/// Reads a plan's need; `Err` names what is wrong with it (it is still reported as a provision).
pub fn need(v: &Value) -> Result<Need, String> {
    let Value::Object(o) = v else {
        return Err(format!("a need is an object with kind, name and part, not {}", shorten(&v.to_string())));
    };
    if let Some(extra) = o.keys().find(|k| !matches!(k.as_str(), "kind" | "name" | "part")) {
        return Err(format!("a need has kind, name and part; {:?} is not one of them", shorten(extra)));
    }
    let text = |field: &str| match o.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("the need's {field} must be a string, not {}", shorten(&other.to_string()))),
    };
    let (kind, name, part) = (text("kind")?, text("name")?, text("part")?);
    Ok(Need { kind: kind.ok_or("the need has no kind")?, name: name.ok_or("the need has no name")?, part })
}

/// One need as a plan lists it: read, or as written with why it cannot be read (it is still
/// reported, never dropped).
#[derive(Debug, Clone, PartialEq)]
pub enum Listed {
    Read(Need),
    Unreadable { need: Value, why: String },
}

impl Listed {
    /// A need as the plan holds it, read as [`need`] reads its tree.
    pub(crate) fn of_value(written: Value) -> Listed {
        match need(&written) {
            Ok(n) => Listed::Read(n),
            Err(why) => Listed::Unreadable { need: written, why },
        }
    }

    /// A need's text read straight into a [`Need`] when it is the plain object of
    /// strings nearly every need is; anything else is read as a tree, as before. `None`: not
    /// JSON a strict reader takes (the plan is then read the slow way, which says why).
    pub(crate) fn of_text(raw: &RawValue) -> Option<Listed> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Plain {
            kind: String,
            name: String,
            // Present means a string: `null` is an odd need, said by the tree's reading.
            #[serde(default, deserialize_with = "present")]
            part: Option<String>,
        }
        fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
            String::deserialize(d).map(Some)
        }
        // An array would fill the struct by position: only an object is plain.
        if raw.get().starts_with('{') {
            if let Ok(Plain { kind, name, part }) = serde_json::from_str::<Plain>(raw.get()) {
                return Some(Listed::Read(Need { kind, name, part }));
            }
        }
        serde_json::from_str::<Value>(raw.get()).ok().map(Listed::of_value)
    }

    /// The need, when it can be read.
    pub fn need(&self) -> Option<&Need> {
        match self {
            Listed::Read(n) => Some(n),
            Listed::Unreadable { .. } => None,
        }
    }
}

/// The provision of one need of a plan, as the plan verb lists it: the need and where its
/// value is found, or the need as written and why it cannot be read.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub(crate) enum Provision<'a> {
    Read {
        #[serde(flatten)]
        need: Need,
        #[serde(flatten)]
        resolved: Resolved,
    },
    /// A need that is not an object of strings: as written, and why.
    Unreadable {
        #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::any"))]
        need: &'a Value,
        malformed: bool,
        reason: String,
    },
}

/// The provision of `listed`, a need of `module` on `node` as its plan lists it.
pub(crate) fn provision<'a>(node: &str, module: &str, listed: &'a Listed) -> Provision<'a> {
    match listed {
        Listed::Read(need) => Provision::Read { need: need.clone(), resolved: resolve(node, module, need) },
        Listed::Unreadable { need, why } => Provision::Unreadable { need, malformed: true, reason: why.clone() },
    }
}

/// Flattened into a provision: `domain` and `verb`, or `domain`, `bucket` (`collection`) and
/// `key` (or `filter`), or `unanswered`/`malformed` with the reason.
impl Serialize for Resolved {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self {
            Resolved::Verb { domain, verb } => {
                m.serialize_entry("domain", domain)?;
                m.serialize_entry("verb", verb)?;
            }
            Resolved::Bucket { domain, bucket, collection, place, wild } => {
                m.serialize_entry("domain", domain)?;
                m.serialize_entry("bucket", bucket)?;
                if let Some(c) = collection {
                    m.serialize_entry("collection", c)?;
                }
                m.serialize_entry(if *wild { "filter" } else { "key" }, place)?;
            }
            Resolved::Unanswered(reason) => {
                m.serialize_entry("unanswered", &true)?;
                m.serialize_entry("reason", reason)?;
            }
            Resolved::Malformed(reason) => {
                m.serialize_entry("malformed", &true)?;
                m.serialize_entry("reason", reason)?;
            }
        }
        m.end()
    }
}

pub(crate) enum Resolved {
    Verb {
        domain: &'static str,
        verb: &'static str,
    },
    /// The domain and the bucket are borrowed from the registry unless a need's name fills them
    /// (a provider's): every need of every status resolves here.
    Bucket {
        domain: Cow<'static, str>,
        bucket: Cow<'static, str>,
        collection: Option<String>,
        place: String,
        wild: bool,
    },
    Unanswered(String),
    Malformed(String),
}

/// The module a resolved need waits on, if any: the service whose verb answers its kind, or
/// the provider a provider-written value names (`bound:<provider>.…`). Status judges such a
/// need by that module's assignments and applied records (`checks`), and a change of those
/// moves the need's module (`transitions`): both ask here, so the two cannot disagree on who
/// waits for whom.
pub(crate) fn waits_on(resolved: &Resolved, kind: &str) -> Option<String> {
    match resolved {
        Resolved::Verb { domain, .. } => Some(domain.to_string()),
        Resolved::Bucket { domain, .. } if registry::lookup(kind).is_some_and(|d| d.owner == "<provider>") => Some(domain.to_string()),
        _ => None,
    }
}

pub(crate) fn resolve(node: &str, module: &str, need: &Need) -> Resolved {
    if let Some(p) = identifier_problem(&need.kind) {
        return Resolved::Malformed(format!("the kind {p}"));
    }
    if let Some(p) = name_problem(&need.name) {
        return Resolved::Malformed(format!("the name {p}"));
    }
    if let Some(part) = &need.part {
        if let Some(p) = identifier_problem(part) {
            return Resolved::Malformed(format!("the part {p}"));
        }
    }
    let Some((at, domain)) = registry::lookup_at(&need.kind) else {
        return Resolved::Unanswered(format!("no domain answers the kind {:?}", need.kind));
    };
    fill(at, domain, node, module, &need.name).unwrap_or_else(Resolved::Malformed)
}

/// What a need's name fills in a domain's shapes.
#[derive(Default)]
struct Filled {
    provider: Option<String>,
    provision: Option<String>,
    local: Option<String>,
}

/// `<provider>.<provision>[.<local>]`, each an identifier.
fn split_bound(kind: &str, name: &str) -> Result<Filled, String> {
    let parts: Vec<&str> = name.split('.').collect();
    let shape = format!("a {kind} need is named <provider>.<provision>[.<local>]");
    if !(2..=3).contains(&parts.len()) {
        return Err(format!("{shape}: {:?} has {} part{}", shorten(name), parts.len(), if parts.len() == 1 { "" } else { "s" }));
    }
    for (what, p) in ["provider", "provision", "local"].iter().zip(&parts) {
        if let Some(problem) = identifier_problem(p) {
            return Err(format!("{shape}: the {what} {problem}"));
        }
    }
    Ok(Filled { provider: Some(parts[0].to_string()), provision: Some(parts[1].to_string()), local: parts.get(2).map(|s| s.to_string()) })
}

/// A slot of a domain's shape, by name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Node,
    Module,
    Name,
    Provider,
    Provision,
    Local,
    Collection,
    /// A slot no need fills (`<contributor>`): `*`.
    Open,
}

impl Slot {
    fn named(name: &str) -> Slot {
        match name {
            "node" => Slot::Node,
            "module" => Slot::Module,
            "name" => Slot::Name,
            "provider" => Slot::Provider,
            "provision" => Slot::Provision,
            "local" => Slot::Local,
            "collection" => Slot::Collection,
            _ => Slot::Open,
        }
    }
}

/// One piece of a shape: text as it is, a `<slot>`, or `[.<local>]` (`.<local>` when there is
/// a local, else nothing).
#[derive(Clone, Copy)]
enum Piece {
    Text(&'static str),
    Slot(Slot),
    OptionalLocal,
}

/// A domain's bucket and key shapes read into pieces once, not at every need.
struct Shapes {
    bucket: Vec<Piece>,
    key: Vec<Piece>,
}

impl Shapes {
    fn has(&self, slot: Slot) -> bool {
        self.bucket.iter().chain(&self.key).any(|p| matches!(p, Piece::Slot(s) if *s == slot))
    }
}

/// A shape's `<slot>`s and `[.<local>]`; an unclosed `<` is text.
fn pieces(shape: &'static str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut rest = shape;
    while let Some(open) = rest.bytes().position(|b| b == b'<' || b == b'[') {
        if open > 0 {
            out.push(Piece::Text(&rest[..open]));
        }
        rest = &rest[open..];
        if let Some(after) = rest.strip_prefix("[.<local>]") {
            out.push(Piece::OptionalLocal);
            rest = after;
            continue;
        }
        let Some(close) = rest.bytes().position(|b| b == b'>') else { break };
        out.push(Piece::Slot(Slot::named(&rest[1..close])));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    out
}

/// Builds the domains' shapes now, if not yet (they are kept for the instance's life).
pub fn prepare() {
    let _ = shapes(0);
}

/// The shapes of the bucket domain at `at` in the table (`None`: a verb).
fn shapes(at: usize) -> Option<&'static Shapes> {
    static SHAPES: std::sync::OnceLock<Vec<Option<Shapes>>> = std::sync::OnceLock::new();
    let all = SHAPES.get_or_init(|| {
        registry::table()
            .iter()
            .map(|d| match &d.answer {
                Answer::Bucket { bucket, key, .. } => Some(Shapes { bucket: pieces(bucket), key: pieces(key) }),
                Answer::Verb(_) => None,
            })
            .collect()
    });
    all.get(at)?.as_ref()
}

/// Fills `pieces` with `value(slot)`; a slot with no value becomes `*` (and `wild` is set).
fn subst<'v>(pieces: &[Piece], value: impl Fn(Slot) -> Option<Cow<'v, str>>, wild: &mut bool) -> String {
    let mut out = String::with_capacity(48);
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::OptionalLocal => {
                if let Some(l) = value(Slot::Local) {
                    out.push('.');
                    out.push_str(&l);
                }
            }
            Piece::Slot(slot) => match value(*slot) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push('*');
                    *wild = true;
                }
            },
        }
    }
    out
}

fn fill(at: usize, domain: &'static Domain, node: &str, module: &str, name: &str) -> Result<Resolved, String> {
    let (collection, shapes) = match (&domain.answer, shapes(at)) {
        (Answer::Bucket { collection, .. }, Some(shapes)) => (*collection, shapes),
        (Answer::Verb(verb), _) => return Ok(Resolved::Verb { domain: domain.owner, verb }),
        (Answer::Bucket { .. }, None) => return Err(format!("the registry's shapes for {:?} were not read", domain.kind)),
    };
    let filled = if shapes.has(Slot::Provider) || shapes.has(Slot::Provision) { split_bound(domain.kind, name)? } else { Filled::default() };
    // A domain with a collection of its own (`shell`) reads that one; `collected` reads the
    // collection its need names.
    let collection = match collection {
        Some(c) => Some(c.to_string()),
        None if shapes.key.iter().any(|p| matches!(p, Piece::Slot(Slot::Collection))) => Some(name.to_string()),
        None => None,
    };
    let value = |slot: Slot| match slot {
        Slot::Node => Some(Cow::Borrowed(node)),
        Slot::Module => Some(Cow::Borrowed(module)),
        Slot::Name => Some(encoded(name)),
        Slot::Provider => filled.provider.as_deref().map(Cow::Borrowed),
        Slot::Provision => filled.provision.as_deref().map(Cow::Borrowed),
        Slot::Local => filled.local.as_deref().map(Cow::Borrowed),
        Slot::Collection => collection.as_deref().map(encoded),
        Slot::Open => None,
    };
    let mut wild = false;
    let bucket = match shapes.bucket.as_slice() {
        [Piece::Text(t)] => Cow::Borrowed(*t),
        pieces => Cow::Owned(subst(pieces, value, &mut wild)),
    };
    let place = subst(&shapes.key, value, &mut wild);
    let domain = match (&filled.provider, domain.owner) {
        (Some(p), "<provider>") => Cow::Owned(p.clone()),
        (_, owner) => Cow::Borrowed(owner),
    };
    Ok(Resolved::Bucket { domain, bucket, collection, place, wild })
}

/// `Resolved` is written by hand (above); its schema says the same maps.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Resolved {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Resolved".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Where the need's value is found: a verb, or a bucket and a key (a subject filter when a token cannot be filled); or why it cannot be read.",
            "type": "object",
            "anyOf": [
                { "properties": { "domain": { "type": "string" }, "verb": { "type": "string" } }, "required": ["domain", "verb"] },
                {
                    "properties": {
                        "domain": { "type": "string" }, "bucket": { "type": "string" }, "collection": { "type": "string" },
                        "key": { "type": "string" }, "filter": { "type": "string" }
                    },
                    "required": ["domain", "bucket"],
                    "oneOf": [{ "required": ["key"] }, { "required": ["filter"] }]
                },
                { "properties": { "unanswered": { "const": true }, "reason": { "type": "string" } }, "required": ["unanswered", "reason"] },
                { "properties": { "malformed": { "const": true }, "reason": { "type": "string" } }, "required": ["malformed", "reason"] }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(kind: &str, name: &str) -> Value {
        let raw = json!({"kind": kind, "name": name});
        serde_json::from_str(&crate::value::to_json(&provision("alpha", "app", &Listed::of_value(raw)))).expect("a provision is JSON")
    }

    #[test]
    fn fills_a_config_key_with_the_name_escaped() {
        assert_eq!(
            at("config", "db.url"),
            json!({"kind":"config","name":"db.url","domain":"mesh-config","bucket":"mesh-config_values","key":"alpha.app.db=2Eurl"})
        );
    }

    #[test]
    fn names_the_verb_of_a_secret() {
        assert_eq!(at("secret", "db_password"), json!({"kind":"secret","name":"db_password","domain":"mesh-vault","verb":"mesh-vault.secret"}));
    }

    #[test]
    fn splits_a_bound_name_into_provider_provision_and_local() {
        assert_eq!(at("bound", "postgres.db"), json!({"kind":"bound","name":"postgres.db","domain":"postgres","bucket":"postgres_bound","key":"alpha.app.db"}));
        assert_eq!(at("bound", "postgres.db.ro")["key"], "alpha.app.db.ro");
    }

    #[test]
    fn reports_a_bound_need_without_provider_and_provision() {
        let p = at("bound", "postgres");
        assert_eq!(p["malformed"], true);
        assert!(p["reason"].as_str().unwrap().contains("<provider>.<provision>[.<local>]: \"postgres\" has 1 part"), "{p}");
        let p = at("bound", "postgres.d b");
        assert!(p["reason"].as_str().unwrap().contains("the provision"), "{p}");
        assert_eq!(at("bound", "a.b.c.d")["malformed"], true);
    }

    #[test]
    fn reads_collections_as_filters_over_contributors() {
        assert_eq!(
            at("collected", "shell:zsh:normal"),
            json!({"kind":"collected","name":"shell:zsh:normal","domain":"mesh-provisioner","bucket":"mesh-provisioner_collect",
                   "collection":"shell:zsh:normal","filter":"alpha.shell=3Azsh=3Anormal.*"})
        );
        assert_eq!(at("shell", "zsh")["filter"], "alpha.shell.*");
        assert_eq!(at("shell", "zsh")["collection"], "shell");
    }

    #[test]
    fn places_placement_kinds_at_the_assignment() {
        let p = at("dir", "state");
        assert_eq!((p["bucket"].as_str(), p["key"].as_str()), (Some("mesh-controller_assignments"), Some("alpha.app")));
    }

    #[test]
    fn says_which_kinds_are_unanswered_and_which_needs_are_malformed() {
        let p = at("widget", "x");
        assert_eq!(p["unanswered"], true);
        assert!(p["reason"].as_str().unwrap().contains("\"widget\""));
        assert_eq!(at("con fig", "x")["malformed"], true);
        assert_eq!(at("config", "")["malformed"], true);
        assert!(need(&json!({"kind":"config"})).unwrap_err().contains("no name"));
        assert!(need(&json!({"kind":"config","name":3})).unwrap_err().contains("must be a string"));
        assert!(need(&json!("config:x")).unwrap_err().contains("an object"));
        assert!(need(&json!({"kind":"config","name":"x","extra":1})).unwrap_err().contains("\"extra\""));
    }
}
