//! The registry table (SPEC §4): which domain answers each kind of placeholder, and where a
//! client finds the values. Compiled in: upgrading the component is how the table changes.
//!
//! Values are canonical JSON (keys sorted, no spaces), so "differs" is a byte comparison.

use serde_json::{json, Value};

/// Where a kind's values are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A bucket, with the key shape a client fills in.
    Bucket { bucket: &'static str, key: &'static str, collection: Option<&'static str> },
    /// A verb asked on request and reply (a secret is never in a bucket).
    Verb(&'static str),
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub kind: &'static str,
    pub owner: &'static str,
    pub answer: Answer,
}

const PLACEMENT: &str = "mesh-controller_assignments";
const PLACEMENT_KEY: &str = "<node>.<module>";

/// The table, in kind order, built once.
pub fn table() -> &'static [Domain] {
    static TABLE: std::sync::OnceLock<Vec<Domain>> = std::sync::OnceLock::new();
    TABLE.get_or_init(build)
}

fn build() -> Vec<Domain> {
    use Answer::*;
    let bucket = |bucket, key| Bucket { bucket, key, collection: None };
    let collection = |name: &'static str, key| Bucket { bucket: crate::keys::COLLECT, key, collection: Some(name) };
    let mut rows = vec![
        Domain { kind: "config", owner: "mesh-config", answer: bucket("mesh-config_values", "<node>.<module>.<name>") },
        Domain { kind: "secret", owner: "mesh-vault", answer: Verb("mesh-vault.secret") },
        Domain { kind: "bound", owner: "<provider>", answer: bucket("<provider>_bound", "<node>.<module>.<provision>[.<local>]") },
        Domain { kind: "consumers", owner: "mesh-vault", answer: Verb("mesh-vault.consumers") },
        Domain { kind: "collected", owner: "mesh-provisioner", answer: bucket(crate::keys::COLLECT, "<node>.<collection>.<contributor>") },
        Domain { kind: "shell", owner: "mesh-provisioner", answer: collection("shell", "<node>.shell.<contributor>") },
        Domain { kind: "environment", owner: "mesh-provisioner", answer: collection("environment", "<node>.environment.<contributor>") },
        Domain { kind: "contribution", owner: "mesh-provisioner", answer: collection("contribution", "<node>.contribution.<contributor>") },
    ];
    // The second-version fixture answers a kind more and drops `machine`, to prove an upgrade
    // reconciles the bucket to the new table.
    #[cfg(feature = "fixture-v2")]
    rows.push(Domain { kind: "archive", owner: "mesh-archive", answer: Verb("mesh-archive.fetch") });
    #[cfg(not(feature = "fixture-v2"))]
    let placement = ["dir", "access", "port", "seat", "machine"];
    #[cfg(feature = "fixture-v2")]
    let placement = ["dir", "access", "port", "seat"];
    for kind in placement {
        rows.push(Domain { kind, owner: "mesh-controller", answer: bucket(PLACEMENT, PLACEMENT_KEY) });
    }
    rows.sort_by_key(|d| d.kind);
    rows
}

/// The domain answering `kind`, if any.
pub fn lookup(kind: &str) -> Option<&'static Domain> {
    lookup_at(kind).map(|(_, d)| d)
}

/// [`lookup`], with the domain's place in the [`table`] (what is kept beside it is found there).
pub fn lookup_at(kind: &str) -> Option<(usize, &'static Domain)> {
    table().iter().enumerate().find(|(_, d)| d.kind == kind)
}

impl Domain {
    /// The entry's value as stored in the registry bucket: canonical JSON.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "kind": self.kind, "owner": self.owner });
        match &self.answer {
            Answer::Bucket { bucket, key, collection } => {
                v["bucket"] = json!(bucket);
                v["key"] = json!(key);
                if let Some(c) = collection {
                    v["collection"] = json!(c);
                }
            }
            Answer::Verb(verb) => v["verb"] = json!(verb),
        }
        v
    }

    /// Canonical bytes: serde_json's map is ordered by key and writes no spaces.
    pub fn canonical(&self) -> Vec<u8> {
        self.to_json().to_string().into_bytes()
    }
}

/// The compiled table as (kind, canonical value) pairs.
pub fn compile() -> Vec<(String, Vec<u8>)> {
    table().iter().map(|d| (d.kind.to_string(), d.canonical())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_thirteen_kinds_of_the_spec() {
        let kinds: Vec<_> = table().iter().map(|d| d.kind).collect();
        assert_eq!(
            kinds,
            ["access", "bound", "collected", "config", "consumers", "contribution", "dir", "environment", "machine", "port", "seat", "secret", "shell"]
        );
        for d in table() {
            assert!(crate::escape::is_identifier(d.kind));
        }
    }

    #[test]
    fn writes_canonical_json() {
        let config = lookup("config").unwrap().canonical();
        assert_eq!(
            String::from_utf8(config).unwrap(),
            r#"{"bucket":"mesh-config_values","key":"<node>.<module>.<name>","kind":"config","owner":"mesh-config"}"#
        );
        let secret = lookup("secret").unwrap().canonical();
        assert_eq!(String::from_utf8(secret).unwrap(), r#"{"kind":"secret","owner":"mesh-vault","verb":"mesh-vault.secret"}"#);
        assert!(lookup("nope").is_none());
    }
}
