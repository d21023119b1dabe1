//! A module's plan (SPEC §6), read from the node engine's composition: never composed here.
//!
//! For `module` on `node` the builds read are its want (`mesh-controller_assignments`), or with
//! no want the build its have runs (`mesh-provisioner_applied`), and the indexer's newest build
//! (`mesh-indexer_builds`), so a node running ahead of its want still has its plan entry. Each
//! build's composition (`composed-<node>`, key `<module>.<build>`) is published (`planned`), or
//! refused or not yet published: then the entry is `held` on the module's last kept plan, with
//! the reason, or `waiting` when no plan was ever kept (or the kept one cannot be read). The
//! module's state is its first entry's. Odd values are reasons, never dropped and never a panic.

use serde_json::{json, Map, Value};

use crate::env::{Env, HostError};
use crate::escape::{identifier_problem, shorten};
use crate::keys::{composed, APPLIED, ASSIGNMENTS, BUILDS};
use crate::provision;

/// The version of the kept-plan contents this guest writes and reads.
pub const KEPT_FORMAT: u64 = 1;

/// A module's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Planned,
    Held,
    Waiting,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Planned => "planned",
            State::Held => "held",
            State::Waiting => "waiting",
        }
    }
}

/// One source of a build: the build it names, or why it names none readable.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Absent,
    Build(String),
    Odd(String),
}

/// The plan last kept for a module.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub build: String,
    pub plan: Value,
}

impl Kept {
    pub fn to_bytes(&self, node: &str, module: &str) -> Vec<u8> {
        json!({ "format": KEPT_FORMAT, "node": node, "module": module, "build": self.build, "plan": self.plan })
            .to_string()
            .into_bytes()
    }

    /// Reads kept bytes back, refusing another module's plan or another format.
    pub fn from_bytes(bytes: &[u8], node: &str, module: &str) -> Result<Kept, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("the kept plan is not JSON: {e}"))?;
        match v.get("format").and_then(Value::as_u64) {
            Some(KEPT_FORMAT) => {}
            Some(other) => return Err(format!("the kept plan is in format {other}; this guest reads format {KEPT_FORMAT}")),
            None => return Err("the kept plan names no format".into()),
        }
        if v.get("node").and_then(Value::as_str) != Some(node) || v.get("module").and_then(Value::as_str) != Some(module) {
            return Err(format!("the kept plan of {node}/{module} names another module"));
        }
        let build = v.get("build").and_then(Value::as_str).ok_or("the kept plan names no build")?;
        let plan = v.get("plan").filter(|p| p.is_object()).ok_or("the kept plan holds no plan object")?;
        Ok(Kept { build: build.to_string(), plan: plan.clone() })
    }
}

/// What the composition of one build says.
#[derive(Debug, Clone, PartialEq)]
enum Composition {
    Published(Value),
    /// Refused, not yet published, or unreadable: the reason.
    Not(String),
}

/// One build read for a module, and what it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Why this build is read: `want`, `have`, `newest`.
    pub roles: Vec<&'static str>,
    pub build: Option<String>,
    pub state: State,
    pub reason: Option<String>,
    /// The plan given: this build's, or the kept one's (`plan_build` says which).
    pub plan: Option<(String, Value)>,
}

/// A module's plan, computed.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub node: String,
    pub module: String,
    pub want: Option<String>,
    pub have: Option<String>,
    pub newest: Option<String>,
    pub entries: Vec<Entry>,
    pub state: State,
    pub reason: Option<String>,
    /// A newly published plan for the first entry that differs from the kept one.
    pub to_keep: Option<Kept>,
}

/// Reads `field` of the JSON object at `key` of `bucket` as a build.
fn source(env: &dyn Env, bucket: &str, key: &str, field: &str) -> Result<Source, HostError> {
    let Some(e) = env.get(bucket, key)? else {
        return Ok(Source::Absent);
    };
    let v: Value = match serde_json::from_slice(&e.value) {
        Ok(v @ Value::Object(_)) => v,
        _ => return Ok(Source::Odd(format!("{bucket} {key:?} is not a JSON object"))),
    };
    Ok(match v.get(field) {
        None | Some(Value::Null) => Source::Absent,
        Some(Value::String(b)) => match identifier_problem(b) {
            None => Source::Build(b.clone()),
            Some(p) => Source::Odd(format!("{bucket} {key:?}: `{field}` {p}")),
        },
        Some(other) => Source::Odd(format!("{bucket} {key:?}: `{field}` is not a build name: {}", shorten(&other.to_string()))),
    })
}

fn composition(env: &dyn Env, node: &str, module: &str, build: &str) -> Result<Composition, HostError> {
    let bucket = composed(node);
    let key = format!("{module}.{build}");
    let Some(e) = env.get(&bucket, &key)? else {
        return Ok(Composition::Not(format!("the composition of {module} at {build} is not yet published")));
    };
    let odd = |why: String| Ok(Composition::Not(format!("the composition of {module} at {build} cannot be read: {why}")));
    let v: Value = match serde_json::from_slice(&e.value) {
        Ok(v) => v,
        Err(err) => return odd(format!("not JSON ({err})")),
    };
    match v.get("state").and_then(Value::as_str) {
        Some("published") => match v.get("plan") {
            Some(p @ Value::Object(_)) => match p.get("needs") {
                None | Some(Value::Array(_)) => Ok(Composition::Published(p.clone())),
                Some(_) => odd("its plan's `needs` is not a list".into()),
            },
            _ => odd("published without a plan object".into()),
        },
        Some("refused") => {
            let why = v.get("reason").and_then(Value::as_str).unwrap_or("no reason given");
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
    let want = source(env, ASSIGNMENTS, &pair, "want")?;
    let have = source(env, APPLIED, &pair, "build")?;
    let newest = source(env, BUILDS, module, "newest")?;

    // The first entry: the want, or with no want the have; then the newest if another build.
    let mut reads: Vec<(Vec<&'static str>, Source)> = Vec::new();
    match (&want, &have) {
        (Source::Absent, Source::Absent) => {}
        (Source::Absent, have) => reads.push((vec!["have"], have.clone())),
        (want, _) => reads.push((vec!["want"], want.clone())),
    }
    match reads.first_mut() {
        Some((roles, first)) if *first == newest => roles.push("newest"),
        _ if newest != Source::Absent => reads.push((vec!["newest"], newest.clone())),
        _ => {}
    }

    let mut read = Vec::with_capacity(reads.len());
    for (roles, src) in reads {
        read.push(match src {
            Source::Build(b) => {
                let c = composition(env, node, module, &b)?;
                (roles, Some(b), c)
            }
            Source::Odd(why) => (roles, None, Composition::Not(why)),
            Source::Absent => (roles, None, Composition::Not("no build".into())),
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
        let entry = match (got, &kept) {
            (Composition::Published(plan), _) => {
                let build = build.clone().unwrap_or_default();
                let differs = !matches!(&kept, Ok(Some(k)) if k.build == build && k.plan == plan);
                if keeping && i == 0 && differs {
                    to_keep = Some(Kept { build: build.clone(), plan: plan.clone() });
                }
                Entry { roles, build: Some(build.clone()), state: State::Planned, reason: None, plan: Some((build, plan)) }
            }
            (Composition::Not(why), Ok(Some(k))) => Entry {
                roles,
                build,
                state: State::Held,
                reason: Some(format!("{why}; held on the plan kept from {}", k.build)),
                plan: Some((k.build.clone(), k.plan.clone())),
            },
            (Composition::Not(why), Ok(None)) => Entry {
                roles,
                build,
                state: State::Waiting,
                reason: Some(format!("{why}; no plan was kept")),
                plan: None,
            },
            (Composition::Not(why), Err(unreadable)) => Entry {
                roles,
                build,
                state: State::Waiting,
                reason: Some(format!("{why}; {unreadable}")),
                plan: None,
            },
        };
        entries.push(entry);
    }
    let (state, reason) = match entries.first() {
        Some(e) => (e.state, e.reason.clone()),
        None => (State::Waiting, Some(format!("nothing to plan: {module} on {node} has no want, no applied build, and the indexer knows no build of it"))),
    };
    let named = |s: &Source| match s {
        Source::Build(b) => Some(b.clone()),
        _ => None,
    };
    Ok(Plan {
        node: node.into(),
        module: module.into(),
        want: named(&want),
        have: named(&have),
        newest: named(&newest),
        entries,
        state,
        reason,
        to_keep,
    })
}

/// The provisions of a plan's needs, in the plan's order.
pub fn provisions(node: &str, module: &str, plan: &Value) -> Vec<Value> {
    let Some(needs) = plan.get("needs").and_then(Value::as_array) else {
        return Vec::new();
    };
    needs
        .iter()
        .map(|raw| match provision::need(raw) {
            Ok(n) => provision::provision(node, module, &n),
            Err(why) => provision::malformed(raw, &why),
        })
        .collect()
}

impl Plan {
    /// The answer of the verb `mesh-provisioner.plan`.
    pub fn to_json(&self) -> Value {
        let mut v = Map::new();
        v.insert("node".into(), json!(self.node));
        v.insert("module".into(), json!(self.module));
        v.insert("state".into(), json!(self.state.name()));
        if let Some(r) = &self.reason {
            v.insert("reason".into(), json!(r));
        }
        for (field, b) in [("want", &self.want), ("have", &self.have), ("newest", &self.newest)] {
            if let Some(b) = b {
                v.insert(field.into(), json!(b));
            }
        }
        let entries: Vec<Value> = self
            .entries
            .iter()
            .map(|e| {
                let mut o = Map::new();
                o.insert("as".into(), json!(e.roles));
                o.insert("build".into(), json!(e.build));
                o.insert("state".into(), json!(e.state.name()));
                if let Some(r) = &e.reason {
                    o.insert("reason".into(), json!(r));
                }
                if let Some((build, plan)) = &e.plan {
                    o.insert("plan_build".into(), json!(build));
                    o.insert("plan".into(), plan.clone());
                    o.insert("provisions".into(), Value::Array(provisions(&self.node, &self.module, plan)));
                }
                Value::Object(o)
            })
            .collect();
        v.insert("entries".into(), Value::Array(entries));
        Value::Object(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_keeps_and_refuses_another_format_or_module() {
        let k = Kept { build: "b7".into(), plan: json!({"needs":[]}) };
        let bytes = k.to_bytes("alpha", "app");
        assert_eq!(Kept::from_bytes(&bytes, "alpha", "app").unwrap(), k);
        assert!(Kept::from_bytes(&bytes, "alpha", "web").unwrap_err().contains("another module"));
        let v2 = String::from_utf8(bytes).unwrap().replace("\"format\":1", "\"format\":2");
        assert!(Kept::from_bytes(v2.as_bytes(), "alpha", "app").unwrap_err().contains("format 2"));
        assert!(Kept::from_bytes(b"{\"format\":1", "alpha", "app").unwrap_err().contains("not JSON"));
    }
}
