//! A module's plan (SPEC §6), read from the node engine's composition: never composed here.
//!
//! For `module` on `node` the builds read are its want (`mesh-controller_assignments`), or with
//! no want the build its have runs (`mesh-provisioner_applied`), and the indexer's newest build
//! (`mesh-indexer_builds`), so a node running ahead of its want still has its plan entry. Each
//! build's composition (`composed-<node>`, key `<module>.<build>`) is published (`planned`), or
//! refused or not yet published: then the entry is `held` on the module's last kept plan, with
//! the reason, or `waiting` when no plan was ever kept (or the kept one cannot be read). The
//! module's state is its first entry's. Odd values are reasons, never dropped and never a panic.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::env::{Env, HostError};
use crate::escape::{identifier_problem, shorten};
use crate::keys::{composed, APPLIED, ASSIGNMENTS, BUILDS};
use crate::provision::{self, Listed};
use crate::value::to_json;
use serde::Serialize;

/// The version of the kept-plan contents this guest writes and reads.
pub const KEPT_FORMAT: u64 = 1;

/// A module's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanState {
    Planned,
    Held,
    Waiting,
}

/// Why a build is read for a module.
pub const ROLES: [&str; 3] = ["want", "have", "newest"];

impl PlanState {
    pub const ALL: [PlanState; 3] = [PlanState::Planned, PlanState::Held, PlanState::Waiting];

    pub fn name(self) -> &'static str {
        match self {
            PlanState::Planned => "planned",
            PlanState::Held => "held",
            PlanState::Waiting => "waiting",
        }
    }
}

/// One source of a build: the build it names, or why it names none readable.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ValueSource {
    Absent,
    Build(String),
    Odd(String),
}

/// A plan as composed: its JSON text, passed through untouched, and its needs read out.
#[derive(Debug, Clone)]
pub struct Body {
    pub raw: Box<RawValue>,
    pub needs: Vec<Listed>,
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        self.raw.get() == other.raw.get()
    }
}

impl Body {
    /// Reads a plan: an object whose `needs`, if present, is a list. The whole plan is read as
    /// JSON, not only `needs`: it is passed on raw, and a raw value skipped over unread may hold
    /// what no strict reader takes (a lone surrogate `\uDFFF`, found by fuzzing), which would
    /// make the whole answer unreadable to a node.
    ///
    /// Read without a tree when it is plain (its needs typed, the rest only checked); the
    /// tree's reading, below, stays the one that says what is wrong.
    pub fn parse(raw: Box<RawValue>) -> Result<Body, String> {
        match Self::plain_needs(raw.get()) {
            Some(needs) => Ok(Body { raw, needs }),
            None => Self::parse_tree(raw),
        }
    }

    /// The needs of a plan every part of which reads cleanly; `None` for anything else.
    fn plain_needs(text: &str) -> Option<Vec<Listed>> {
        match crate::value::field(text.as_bytes(), "needs").ok()? {
            None => Some(Vec::new()),
            Some(n) if n.get() == "null" => Some(Vec::new()),
            Some(n) if n.get().starts_with('[') => serde_json::from_str::<Vec<&RawValue>>(n.get()).ok()?.into_iter().map(Listed::of_text).collect(),
            Some(_) => None,
        }
    }

    fn parse_tree(raw: Box<RawValue>) -> Result<Body, String> {
        let whole: Value = serde_json::from_str(raw.get()).map_err(|e| format!("the plan cannot be read: {e}"))?;
        let Value::Object(mut fields) = whole else {
            return Err("the plan is not an object".into());
        };
        let needs = match fields.remove("needs") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(n)) => n.into_iter().map(Listed::of_value).collect(),
            Some(_) => return Err("its plan's `needs` is not a list".into()),
        };
        Ok(Body { raw, needs })
    }
}

/// The plan last kept for a module.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub build: String,
    pub plan: Body,
}

impl Kept {
    pub fn to_bytes(&self, node: &str, module: &str) -> Vec<u8> {
        #[derive(Serialize)]
        struct KeptFile<'a> {
            format: u64,
            node: &'a str,
            module: &'a str,
            build: &'a str,
            plan: &'a RawValue,
        }
        to_json(&KeptFile { format: KEPT_FORMAT, node, module, build: &self.build, plan: &self.plan.raw }).into_bytes()
    }

    /// Reads kept bytes back, refusing another module's plan or another format.
    pub fn from_bytes(bytes: &[u8], node: &str, module: &str) -> Result<Kept, String> {
        #[derive(Deserialize)]
        struct KeptFileRead {
            format: Option<Value>,
            node: Option<Value>,
            module: Option<Value>,
            build: Option<Value>,
            plan: Option<Box<RawValue>>,
        }
        let f: KeptFileRead = serde_json::from_slice(bytes).map_err(|e| format!("the kept plan is not JSON: {e}"))?;
        match f.format.as_ref().and_then(Value::as_u64) {
            Some(KEPT_FORMAT) => {}
            Some(other) => return Err(format!("the kept plan is in format {other}; this guest reads format {KEPT_FORMAT}")),
            None => return Err("the kept plan names no format".into()),
        }
        if f.node.as_ref().and_then(Value::as_str) != Some(node) || f.module.as_ref().and_then(Value::as_str) != Some(module) {
            return Err(format!("the kept plan of {node}/{module} names another module"));
        }
        let build = f.build.as_ref().and_then(Value::as_str).ok_or("the kept plan names no build")?;
        let plan = f.plan.ok_or("the kept plan holds no plan object")?;
        let plan = Body::parse(plan).map_err(|_| "the kept plan holds no plan object".to_string())?;
        Ok(Kept { build: build.to_string(), plan })
    }
}

/// What the composition of one build says.
#[derive(Debug, Clone, PartialEq)]
enum Composition {
    Published(Body),
    /// Refused, not yet published, or unreadable: the reason.
    Not(String),
}

/// One build read for a module, and what it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptEntry {
    /// Why this build is read: `want`, `have`, `newest`.
    pub roles: Vec<&'static str>,
    pub build: Option<String>,
    pub state: PlanState,
    pub reason: Option<String>,
    /// The plan given: this build's, or the kept one's (`plan_build` says which).
    pub plan: Option<(String, Body)>,
}

/// A module's plan, computed.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub node: String,
    pub module: String,
    pub want: Option<String>,
    pub have: Option<String>,
    pub newest: Option<String>,
    pub entries: Vec<KeptEntry>,
    /// A newly published plan for the first entry that differs from the kept one.
    pub to_keep: Option<Kept>,
    /// Why the host could not keep this module's plan the last time it tried (its state
    /// directory read-only or full): until it can, a refusal after a restart holds the module
    /// on an older plan, or leaves it waiting.
    pub not_kept: Option<String>,
    /// The module's applied record as read for `have` (a status reads it once).
    pub applied: Option<crate::env::Entry>,
}

/// The record at `key` of `bucket`, if any, and its `field` read as a build.
fn source(env: &dyn Env, bucket: &str, key: &str, field: &str) -> Result<(Option<crate::env::Entry>, ValueSource), HostError> {
    let Some(e) = env.get(bucket, key)? else {
        return Ok((None, ValueSource::Absent));
    };
    let build = field_of(bucket, key, &e.value, field);
    Ok((Some(e), build))
}

/// `field` of a record as a build.
fn field_of(bucket: &str, key: &str, value: &[u8], field: &str) -> ValueSource {
    // The one field, not a tree of the record: read for every module a status lists.
    let raw = match crate::value::field(value, field) {
        Ok(raw) => raw,
        Err(()) => return ValueSource::Odd(format!("{bucket} {key:?} is not a JSON object")),
    };
    let Some(raw) = raw else { return ValueSource::Absent };
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Null) => ValueSource::Absent,
        Ok(Value::String(b)) => match identifier_problem(&b) {
            None => ValueSource::Build(b),
            Some(p) => ValueSource::Odd(format!("{bucket} {key:?}: `{field}` {p}")),
        },
        Ok(other) => ValueSource::Odd(format!("{bucket} {key:?}: `{field}` is not a build name: {}", shorten(&other.to_string()))),
        // Read already by `field`: never reached.
        Err(_) => ValueSource::Odd(format!("{bucket} {key:?} is not a JSON object")),
    }
}

fn composition(env: &dyn Env, node: &str, module: &str, build: &str) -> Result<Composition, HostError> {
    #[derive(Deserialize)]
    struct Composed {
        state: Option<Value>,
        reason: Option<Value>,
        plan: Option<Box<RawValue>>,
    }
    let bucket = composed(node);
    let key = format!("{module}.{build}");
    let Some(e) = env.get(&bucket, &key)? else {
        return Ok(Composition::Not(format!("the composition of {module} at {build} is not yet published")));
    };
    let odd = |why: String| Ok(Composition::Not(format!("the composition of {module} at {build} cannot be read: {why}")));
    if !e.value.trim_ascii_start().starts_with(b"{") {
        return odd("not a JSON object".into());
    }
    let c: Composed = match serde_json::from_slice(&e.value) {
        Ok(c) => c,
        Err(err) => return odd(format!("not JSON ({err})")),
    };
    match c.state.as_ref().and_then(Value::as_str) {
        Some("published") => match c.plan {
            Some(p) if p.get().starts_with('{') => match Body::parse(p) {
                Ok(body) => Ok(Composition::Published(body)),
                Err(why) => odd(why),
            },
            _ => odd("published without a plan object".into()),
        },
        Some("refused") => {
            let why = c.reason.as_ref().and_then(Value::as_str).unwrap_or("no reason given");
            Ok(Composition::Not(format!("the composition of {module} at {build} was refused: {why}")))
        }
        Some(other) => odd(format!("state {:?} is neither published nor refused", shorten(other))),
        None => odd("it has no state".into()),
    }
}

/// Computes the plan of `module` on `node` from the buckets and the kept plan. With `keeping`,
/// also says what to keep (`to_keep`), which reads the kept plan even when every build is
/// published; without it (the read-only verb), the kept plan is read only when needed.
pub fn compute(env: &dyn Env, node: &str, module: &str, keeping: bool) -> Result<Plan, HostError> {
    let pair = format!("{node}.{module}");
    let (assignment, want) = source(env, ASSIGNMENTS, &pair, "want")?;
    let (applied, have) = source(env, APPLIED, &pair, "build")?;
    let assigned = assignment.is_some();
    let (_, newest) = source(env, BUILDS, module, "newest")?;

    // The first entry: the want, or with no want the have; then the newest if another build.
    let mut reads: Vec<(Vec<&'static str>, ValueSource)> = Vec::new();
    match (&want, &have) {
        (ValueSource::Absent, ValueSource::Absent) => {}
        (ValueSource::Absent, have) => reads.push((vec!["have"], have.clone())),
        (want, _) => reads.push((vec!["want"], want.clone())),
    }
    // A module with neither an assignment nor an applied record on this node is not on it: no
    // composition is read (a requester naming nodes that do not exist must not make the host
    // follow their buckets).
    match reads.first_mut() {
        Some((roles, first)) if *first == newest => roles.push("newest"),
        _ if newest != ValueSource::Absent && (assigned || applied.is_some()) => reads.push((vec!["newest"], newest.clone())),
        _ => {}
    }

    // Each build's composition: (roles, build, what it says).
    let mut read = Vec::with_capacity(reads.len());
    for (roles, src) in reads {
        read.push(match src {
            ValueSource::Build(b) => {
                // A compositions bucket the host refuses to read (its stream is not a bucket)
                // holds this module as an unreadable composition would, with the reason; it
                // never fails the answer for the rest of the mesh.
                let c = match composition(env, node, module, &b) {
                    Ok(c) => c,
                    Err(HostError::Denied(why)) => Composition::Not(format!("the composition of {module} at {b} cannot be read: {why}")),
                    Err(e) => return Err(e),
                };
                (roles, Some(b), c)
            }
            ValueSource::Odd(why) => (roles, None, Composition::Not(why)),
            ValueSource::Absent => (roles, None, Composition::Not("no build".into())),
        });
    }
    let needs_kept = keeping || read.iter().any(|(_, _, c)| matches!(c, Composition::Not(_)));
    let kept = if !needs_kept {
        Ok(None)
    } else {
        match env.load_plan(node, module) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => Kept::from_bytes(&bytes, node, module).map(Some),
            Err(e) => Err(format!("the kept plan cannot be read ({e})")),
        }
    };

    let mut entries = Vec::new();
    let mut to_keep = None;
    for (i, (roles, build, got)) in read.into_iter().enumerate() {
        let (state, reason, plan) = match (got, &kept) {
            (Composition::Published(plan), _) => {
                // Only a build's own composition is published, so it has a build.
                let b = build.clone().unwrap_or_default();
                let differs = !matches!(&kept, Ok(Some(k)) if k.build == b && k.plan == plan);
                if keeping && i == 0 && differs {
                    to_keep = Some(Kept { build: b.clone(), plan: plan.clone() });
                }
                (PlanState::Planned, None, Some((b, plan)))
            }
            (Composition::Not(why), Ok(Some(k))) => {
                (PlanState::Held, Some(format!("{why}; held on the plan kept from {}", k.build)), Some((k.build.clone(), k.plan.clone())))
            }
            (Composition::Not(why), Ok(None)) => (PlanState::Waiting, Some(format!("{why}; no plan was kept")), None),
            (Composition::Not(why), Err(unreadable)) => (PlanState::Waiting, Some(format!("{why}; {unreadable}")), None),
        };
        entries.push(KeptEntry { roles, build, state, reason, plan });
    }
    let named = |s: &ValueSource| match s {
        ValueSource::Build(b) => Some(b.clone()),
        _ => None,
    };
    Ok(Plan {
        node: node.into(),
        module: module.into(),
        want: named(&want),
        have: named(&have),
        newest: named(&newest),
        entries,
        to_keep,
        not_kept: env.keep_failure(node, module),
        applied,
    })
}

impl Plan {
    /// The module's state and its reason: its first entry's, or `waiting` with nothing to plan.
    pub fn state(&self) -> (PlanState, Option<String>) {
        match self.entries.first() {
            Some(e) => (e.state, e.reason.clone()),
            None if self.newest.is_some() => (
                PlanState::Waiting,
                Some(format!(
                    "nothing to plan: {} has no want and no applied build on {}: it is not on that node (the indexer's newest build is not read for it)",
                    self.module, self.node
                )),
            ),
            None => (
                PlanState::Waiting,
                Some(format!("nothing to plan: {} on {} has no want, no applied build, and the indexer knows no build of it", self.module, self.node)),
            ),
        }
    }

    /// The answer of the verb `mesh-provisioner.plan`, as JSON text.
    pub fn render(&self) -> String {
        let (state, reason) = self.state();
        let not_kept = self.not_kept.as_ref().map(|why| {
            format!("the host could not keep this plan ({why}); it tries again, and until it can, a refusal after a restart holds the module on an older plan or leaves it waiting")
        });
        let entries = self
            .entries
            .iter()
            .map(|e| StepLine {
                roles: &e.roles,
                build: e.build.as_deref(),
                state: e.state.name(),
                reason: e.reason.as_deref(),
                plan_build: e.plan.as_ref().map(|(b, _)| b.as_str()),
                plan: e.plan.as_ref().map(|(_, p)| &*p.raw),
                provisions: e.plan.as_ref().map(|(_, p)| p.needs.iter().map(|listed| provision::provision(&self.node, &self.module, listed)).collect()),
            })
            .collect();
        to_json(&PlanAnswer {
            node: &self.node,
            module: &self.module,
            state: state.name(),
            reason,
            want: self.want.as_deref(),
            have: self.have.as_deref(),
            newest: self.newest.as_deref(),
            not_kept,
            entries,
        })
    }
}

/// The answer of `mesh-provisioner.plan`.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "Plan"))]
pub(crate) struct PlanAnswer<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    node: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::identifier"))]
    module: &'a str,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::plan_state"))]
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    want: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    have: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    newest: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_kept: Option<String>,
    entries: Vec<StepLine<'a>>,
}
/// One build read for the module, and what it gives.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "PlanBuild"))]
struct StepLine<'a> {
    #[serde(rename = "as")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::roles"))]
    roles: &'a [&'static str],
    build: Option<&'a str>,
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::plan_state"))]
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan_build: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The plan given, as the composition holds it.
    plan: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    provisions: Option<Vec<provision::Provision<'a>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_plan_no_strict_reader_takes() {
        let raw = RawValue::from_string(r#"{"needs":[],"x":"\uDFFF"}"#.into()).expect("serde_json's raw value takes it");
        assert!(Body::parse(raw).unwrap_err().contains("surrogate"));
        let raw = RawValue::from_string(r#"["needs"]"#.into()).unwrap();
        assert!(Body::parse(raw).unwrap_err().contains("not an object"));
    }

    /// Pieces of needs and plans, plain and odd, joined into texts a composition may hold.
    fn plan_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let text = prop::sample::select(vec![r#""config""#, r#""db.url""#, r#""api""#, r#""k\u0069nd""#, r#""\uDFFF""#, "null", "7", "[]", "{}", r#""a\"b""#]);
        let key = prop::sample::select(vec![r#""kind""#, r#""name""#, r#""part""#, r#""k\u0069nd""#, r#""extra""#, r#""needs""#]);
        // Mostly near-plain needs: the plain reading's edges are where it could differ.
        let field = (
            prop_oneof![4 => prop::sample::select(vec![r#""kind""#, r#""name""#, r#""part""#]), 1 => key.clone()],
            prop_oneof![4 => Just(r#""config""#), 1 => text.clone()],
        );
        let value = prop_oneof![4 => Just(r#""config""#), 1 => text.clone()];
        let near_plain = (value.clone(), value.clone(), prop::option::of(value), prop::option::weighted(0.2, key.clone()), any::<bool>()).prop_map(
            |(k, n, part, extra, reversed)| {
                let mut f = vec![format!(r#""kind":{k}"#), format!(r#""name":{n}"#)];
                f.extend(part.map(|p| format!(r#""part":{p}"#)));
                f.extend(extra.map(|e| format!(r#"{e}:"x""#)));
                if reversed {
                    f.reverse();
                }
                format!("{{{}}}", f.join(","))
            },
        );
        let need = prop_oneof![
            3 => near_plain,
            1 => prop::collection::vec(field, 0..5).prop_map(|f| format!("{{{}}}", f.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(","))),
            1 => prop::collection::vec(text.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            1 => text.clone().prop_map(str::to_string),
        ];
        let needs = prop_oneof![prop::collection::vec(need, 0..4).prop_map(|n| format!("[{}]", n.join(","))), text.clone().prop_map(str::to_string)];
        // A plan lists its needs, perhaps twice, beside other fields; a few plans are no object.
        let fields = prop::collection::vec(
            prop_oneof![3 => needs.prop_map(|n| format!(r#""needs":{n}"#)), 1 => (key, text).prop_map(|(k, v)| format!("{k}:{v}"))],
            0..4,
        );
        (fields, prop::bool::weighted(0.1))
            .prop_map(|(fields, array)| if array { format!("[{}]", fields.join(",")) } else { format!("{{{}}}", fields.join(",")) })
    }

    proptest::proptest! {
        /// The plain reading is a shortcut, never another answer: whatever the plan holds, its
        /// needs (read or said unreadable) and its refusal are the tree's.
        #[test]
        fn a_plan_reads_the_same_plainly_as_by_its_tree(text in plan_text()) {
            let Ok(raw) = RawValue::from_string(text.clone()) else { return Ok(()) };
            let fast = Body::parse(raw.clone()).map(|b| b.needs);
            let tree = Body::parse_tree(raw).map(|b| b.needs);
            proptest::prop_assert_eq!(fast, tree, "{}", text);
        }
    }

    #[test]
    fn a_plain_need_is_read_without_a_tree_and_an_odd_one_as_before() {
        let plain =
            Body::plain_needs(r#"{"parts":["api"],"needs":[{"kind":"config","name":"db.url","part":"api"},{"kind":"dir","name":"state"}]}"#).expect("plain");
        assert_eq!(plain[0], Listed::Read(provision::Need { kind: "config".into(), name: "db.url".into(), part: Some("api".into()) }));
        assert_eq!(plain[1].need().map(|n| n.part.clone()), Some(None));
        // `part: null` and a need by position are odd: said, as the tree says them.
        let odd = Body::plain_needs(r#"{"needs":[{"kind":"config","name":"x","part":null},["config","x"]]}"#).expect("readable");
        assert!(matches!(&odd[0], Listed::Unreadable { why, .. } if why.contains("part must be a string")), "{odd:?}");
        assert!(matches!(&odd[1], Listed::Unreadable { why, .. } if why.contains("is an object")), "{odd:?}");
        // What a strict reader refuses is left to the tree, which names it.
        assert_eq!(Body::plain_needs(r#"{"needs":[],"x":"\uDFFF"}"#), None);
    }

    #[test]
    fn reads_back_what_it_keeps_and_refuses_another_format_or_module() {
        let raw = RawValue::from_string(r#"{"needs":[]}"#.into()).unwrap();
        let k = Kept { build: "b7".into(), plan: Body::parse(raw).unwrap() };
        let bytes = k.to_bytes("alpha", "app");
        assert_eq!(Kept::from_bytes(&bytes, "alpha", "app").unwrap(), k);
        assert!(Kept::from_bytes(&bytes, "alpha", "web").unwrap_err().contains("another module"));
        let v2 = String::from_utf8(bytes).unwrap().replace("\"format\":1", "\"format\":2");
        assert!(Kept::from_bytes(v2.as_bytes(), "alpha", "app").unwrap_err().contains("format 2"));
        assert!(Kept::from_bytes(b"{\"format\":1", "alpha", "app").unwrap_err().contains("not JSON"));
    }
}
