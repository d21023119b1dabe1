//! The key shape of every bucket the provisioner reads (SPEC §3): a parser for each, giving a
//! typed key or the reason the key is out of shape.
//!
//! Parsing is total: any string gets an answer, and no key is ever dropped for being odd.

use std::borrow::Cow;

use crate::escape::{decoded, identifier_problem, shorten};

pub const REGISTRY: &str = "mesh-provisioner_registry";
pub const NEEDS: &str = "mesh-provisioner_needs";
pub const APPLIED: &str = "mesh-provisioner_applied";
pub const COLLECT: &str = "mesh-provisioner_collect";
/// The controller's assignments: key `<node>.<module>`, value with the module's `want`.
pub const ASSIGNMENTS: &str = "mesh-controller_assignments";
/// The indexer's builds: key `<module>`, value with the module's `newest` build.
pub const BUILDS: &str = "mesh-indexer_builds";
/// The node engine's compositions are in `composed-<node>`, key `<module>.<build>`.
pub const COMPOSED_PREFIX: &str = "composed-";

/// The composition bucket of `node`.
pub fn composed(node: &str) -> String {
    format!("{COMPOSED_PREFIX}{node}")
}

/// A position past every module of `node` (and every key under it): a status page that starts
/// there begins with the next node's first module. Positions are compared as strings, and no
/// character sorts after U+10FFFF.
pub fn past_node(node: &str) -> String {
    format!("{node}.\u{10FFFF}")
}

/// The node whose compositions `bucket` holds, if it is a composition bucket.
pub fn composed_node(bucket: &str) -> Option<&str> {
    bucket.strip_prefix(COMPOSED_PREFIX).filter(|n| crate::escape::is_identifier(n))
}

/// A key of `mesh-provisioner_needs`: `<node>.<module>.<kind>.<name>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NeedKey {
    pub node: String,
    pub module: String,
    pub kind: String,
    pub name: String,
}

/// A key of `mesh-provisioner_applied`: `<node>.<module>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AppliedKey {
    pub node: String,
    pub module: String,
}

/// A key of `composed-<node>`: `<module>.<build>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposedKey {
    pub module: String,
    pub build: String,
}

/// A key of `mesh-provisioner_collect`: `<node>.<collection>.<contributor>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CollectKey {
    pub node: String,
    pub collection: String,
    pub contributor: String,
}

/// A key of a provider's `<provider>_bound`: `<node>.<module>.<provision>[.<local>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundKey {
    pub node: String,
    pub module: String,
    pub provision: String,
    pub local: Option<String>,
}

/// What one token of a shape holds.
#[derive(Clone, Copy)]
enum Token {
    Ident(&'static str),
    Name(&'static str),
}

/// The `.`-separated tokens of a key, found by bytes: a `char` pattern's searcher costs a
/// component more than the short keys it splits (every key of every answer passes here).
pub(crate) struct Dots<'k>(Option<&'k str>);

pub(crate) fn dots(key: &str) -> Dots<'_> {
    Dots(Some(key))
}

impl<'k> Iterator for Dots<'k> {
    type Item = &'k str;
    fn next(&mut self) -> Option<&'k str> {
        let rest = self.0?;
        match rest.bytes().position(|b| b == b'.') {
            Some(i) => {
                self.0 = Some(&rest[i + 1..]);
                Some(&rest[..i])
            }
            None => {
                self.0 = None;
                Some(rest)
            }
        }
    }
}

/// Splits `key` into the tokens of `shape` (at most four), checking each; `optional` trailing
/// tokens may be absent (then empty: a token present is never empty). A token is borrowed
/// from the key unless it had escapes to decode.
fn split<'k, const N: usize>(key: &'k str, what: &str, shape: &[Token; N], optional: usize) -> Result<[Cow<'k, str>; 4], String> {
    // Every shape is a literal here: one longer than the tokens kept fails the build.
    const { assert!(N <= 4, "a key shape has at most four tokens") };
    let min = N - optional;
    let mut out: [Cow<'k, str>; 4] = Default::default();
    let mut read = 0;
    let mut tokens = dots(key);
    // The shape first: zipped the other way, a token past the shape would be taken and lost.
    for (i, (t, token)) in shape.iter().zip(tokens.by_ref()).enumerate() {
        let checked = match t {
            Token::Ident(name) => match identifier_problem(token) {
                None => Ok(Cow::Borrowed(token)),
                Some(p) => Err(format!("token {} (<{name}>) {p}", i + 1)),
            },
            Token::Name(name) => decoded(token).map_err(|e| format!("token {} (<{name}>) {:?}: {e}", i + 1, shorten(token))),
        };
        match checked {
            Ok(t) => {
                out[i] = t;
                read = i + 1;
            }
            // A token out of shape is said only when the count is right: the count comes first.
            Err(e) => {
                let count = i + 1 + tokens.count();
                return Err(if (min..=shape.len()).contains(&count) { e } else { wrong_count(what, shape, min, count) });
            }
        }
    }
    let count = read + tokens.count();
    if count < min || count > shape.len() {
        return Err(wrong_count(what, shape, min, count));
    }
    Ok(out)
}

/// The error of a key with `count` tokens where `shape` wants `min` to `shape.len()`.
fn wrong_count(what: &str, shape: &[Token], min: usize, count: usize) -> String {
    let spelled: String = shape
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = match t {
                Token::Ident(n) | Token::Name(n) => *n,
            };
            if i >= min {
                format!("[.<{name}>]")
            } else if i == 0 {
                format!("<{name}>")
            } else {
                format!(".<{name}>")
            }
        })
        .collect();
    format!("{what} keys are {spelled}: {count} token{}", if count == 1 { "" } else { "s" })
}

/// A registry key is one kind.
pub fn parse_registry(key: &str) -> Result<String, String> {
    let [kind, ..] = split(key, "registry", &[Token::Ident("kind")], 0)?;
    Ok(kind.into_owned())
}

/// A key of `mesh-provisioner_needs`, borrowed from it (the name too, unless it was escaped):
/// a status reads every key of a module's needs and keeps only their kinds and names, and the
/// needs verb writes each one's tokens into its line without copying them first.
#[derive(serde::Serialize)]
pub struct NeedRef<'k> {
    pub node: Cow<'k, str>,
    pub module: Cow<'k, str>,
    pub kind: Cow<'k, str>,
    pub name: Cow<'k, str>,
}

pub fn parse_need_ref(key: &str) -> Result<NeedRef<'_>, String> {
    let shape = [Token::Ident("node"), Token::Ident("module"), Token::Ident("kind"), Token::Name("name")];
    let [node, module, kind, name] = split(key, "needs", &shape, 0)?;
    Ok(NeedRef { node, module, kind, name })
}

pub fn parse_need(key: &str) -> Result<NeedKey, String> {
    let NeedRef { node, module, kind, name } = parse_need_ref(key)?;
    Ok(NeedKey { node: node.into_owned(), module: module.into_owned(), kind: kind.into_owned(), name: name.into_owned() })
}

/// `<node>.<module>`, as the bucket `what` keys it.
fn node_module(key: &str, what: &str) -> Result<AppliedKey, String> {
    let shape = [Token::Ident("node"), Token::Ident("module")];
    let [node, module, ..] = split(key, what, &shape, 0)?;
    Ok(AppliedKey { node: node.into_owned(), module: module.into_owned() })
}

pub fn parse_applied(key: &str) -> Result<AppliedKey, String> {
    node_module(key, "applied")
}

/// An assignment key has the applied shape, `<node>.<module>`.
pub fn parse_assignment(key: &str) -> Result<AppliedKey, String> {
    node_module(key, "assignment")
}

pub fn parse_composed(key: &str) -> Result<ComposedKey, String> {
    let shape = [Token::Ident("module"), Token::Ident("build")];
    let [module, build, ..] = split(key, "composed", &shape, 0)?;
    Ok(ComposedKey { module: module.into_owned(), build: build.into_owned() })
}

/// A builds key is one module.
pub fn parse_builds(key: &str) -> Result<String, String> {
    let [module, ..] = split(key, "builds", &[Token::Ident("module")], 0)?;
    Ok(module.into_owned())
}

pub fn parse_collect(key: &str) -> Result<CollectKey, String> {
    let shape = [Token::Ident("node"), Token::Name("collection"), Token::Ident("contributor")];
    let [node, collection, contributor, _] = split(key, "collect", &shape, 0)?;
    Ok(CollectKey { node: node.into_owned(), collection: collection.into_owned(), contributor: contributor.into_owned() })
}

pub fn parse_bound(key: &str) -> Result<BoundKey, String> {
    let shape = [Token::Ident("node"), Token::Ident("module"), Token::Ident("provision"), Token::Ident("local")];
    let [node, module, provision, local] = split(key, "bound", &shape, 1)?;
    Ok(BoundKey {
        node: node.into_owned(),
        module: module.into_owned(),
        provision: provision.into_owned(),
        // Absent: empty (a token present is never empty).
        local: (!local.is_empty()).then(|| local.into_owned()),
    })
}

/// Whether the NATS subject `filter` matches `key`.
pub(crate) fn matches(filter: &str, key: &str) -> bool {
    let (mut f, mut k) = (filter.split('.'), key.split('.'));
    loop {
        match (f.next(), k.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_shape() {
        assert_eq!(
            parse_need("alpha.app.config.db=2Eurl").unwrap(),
            NeedKey { node: "alpha".into(), module: "app".into(), kind: "config".into(), name: "db.url".into() }
        );
        assert_eq!(parse_applied("alpha.app").unwrap().module, "app");
        assert_eq!(parse_collect("alpha.shell=3Azsh=3Anormal.app").unwrap().collection, "shell:zsh:normal");
        assert_eq!(parse_bound("a.m.db").unwrap().local, None);
        assert_eq!(parse_bound("a.m.db.ro").unwrap().local.as_deref(), Some("ro"));
        assert_eq!(parse_registry("config").unwrap(), "config");
        assert_eq!(parse_composed("app.b7").unwrap(), ComposedKey { module: "app".into(), build: "b7".into() });
        assert_eq!(parse_builds("app").unwrap(), "app");
        assert_eq!(parse_assignment("alpha.app").unwrap().node, "alpha");
        assert_eq!(composed_node("composed-alpha"), Some("alpha"));
        assert_eq!(composed_node("composed-"), None);
        assert_eq!(composed_node("mesh-config_values"), None);
    }

    #[test]
    fn counts_every_token_even_an_empty_one() {
        assert_eq!(dots("").collect::<Vec<_>>(), [""]);
        assert_eq!(dots("a..b.").collect::<Vec<_>>(), ["a", "", "b", ""]);
        assert!(parse_need("alpha.app.config.x.").unwrap_err().contains("5 tokens"));
        assert!(parse_need("").unwrap_err().contains("1 token"));
        // The count is said before a token's problem, past the shape as within it.
        assert!(parse_applied("a=3D.b.c").unwrap_err().contains("3 tokens"));
        assert!(parse_need("alpha.app.config").unwrap_err().contains("3 tokens"));
    }

    #[test]
    fn says_why_a_key_is_out_of_shape() {
        assert_eq!(parse_collect("alpha.shell").unwrap_err(), "collect keys are <node>.<collection>.<contributor>: 2 tokens");
        assert!(parse_need("alpha.app.config.x.y").unwrap_err().contains("5 tokens"));
        assert!(parse_need("alpha..config.x").unwrap_err().contains("token 2 (<module>) is empty"));
        assert!(parse_need("alpha.app.config.=3a").unwrap_err().contains("upper-case"));
        assert!(parse_need("alpha.app.config.=C3").unwrap_err().contains("UTF-8"));
        assert!(parse_applied("alpha.a=3Db").unwrap_err().contains("not an identifier"));
        assert!(parse_bound("a.m").unwrap_err().contains("<node>.<module>.<provision>[.<local>]"));
        assert!(parse_registry("a.b").unwrap_err().contains("2 tokens"));
        assert!(parse_composed("app.b=2E7").unwrap_err().contains("(<build>)"));
        assert!(parse_builds("app.b7").unwrap_err().contains("builds keys are <module>"));
    }
}
