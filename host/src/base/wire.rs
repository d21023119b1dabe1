//! The names the bus sees, in one place: the subject syntax a key or filter must have, the
//! service's name, endpoints and headers, the subjects events and notices go out on, and the
//! time format every answer uses. Other folders spell none of these themselves.

use std::time::SystemTime;

use crate::base::error::{Error, ErrorKind, Result};

/// Longest filter or key accepted from the guest.
pub const MAX_SUBJECT: usize = 4096;

/// NATS subject matching: `*` is one token, a final `>` one or more.
pub fn matches(pattern: &[&str], key: &str) -> bool {
    let mut tokens = key.split('.');
    for (i, p) in pattern.iter().enumerate() {
        if *p == ">" {
            return i + 1 == pattern.len() && tokens.next().is_some();
        }
        match tokens.next() {
            Some(t) if *p == "*" || *p == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// Whether every subject `subject` matches is matched by `pattern` (both may hold wildcards):
/// how an import is checked against an export.
pub fn contains(pattern: &str, subject: &str) -> bool {
    let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A key or filter as NATS would accept it: non-empty tokens of printable ASCII without spaces;
/// wildcards only in filters, `>` only last. Every key of a replay and of a snapshot passes
/// here: each token is read once, byte by byte, and judged in the order the reasons are given.
pub fn check_subject(s: &str, filter: bool) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::new(ErrorKind::Invalid, format!("{} {:?}: {why}", if filter { "filter" } else { "key" }, s.chars().take(80).collect::<String>())))
    };
    if s.is_empty() || s.len() > MAX_SUBJECT {
        return bad("empty or too long");
    }
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        let start = i;
        let (mut graphic, mut wildcard) = (true, false);
        while let Some(&c) = b.get(i).filter(|&&c| c != b'.') {
            graphic &= c.is_ascii_graphic();
            wildcard |= c == b'*' || c == b'>';
            i += 1;
        }
        let (t, last) = (&b[start..i], i == b.len());
        if t.is_empty() {
            return bad("empty token");
        }
        if !graphic {
            return bad("not printable ASCII");
        }
        let wild = t == b"*" || t == b">";
        if wild && !filter {
            return bad("a key holds no wildcard");
        }
        if t == b">" && !last {
            return bad("`>` must be the last token");
        }
        if !wild && wildcard {
            return bad("a wildcard must be a whole token");
        }
        if last {
            return Ok(());
        }
        i += 1;
    }
}

/// `<prefix><node>`, if `node` is one subject token: a node the guest names can never widen a
/// publish past its own subject (no `.`, `*`, `>`, space or control byte).
fn node_subject(prefix: &str, node: &str) -> Option<String> {
    let ok = !node.is_empty() && node.len() <= 256 && node.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'.' | b'*' | b'>'));
    ok.then(|| format!("{prefix}{node}"))
}

/// The service's name in `$SRV.PING|INFO|STATS` (the `io.nats.micro.v1` protocol).
pub const SERVICE_NAME: &str = "mesh-provisioner";
/// The provisioning verb's subject.
pub const PROVISIONING: &str = "mesh-provisioner.provisioning";
/// The plan verb's subject.
pub const PLAN: &str = "mesh-provisioner.plan";
/// The endpoints, by name and subject; the subject is the verb the guest is asked.
pub const ENDPOINTS: [(&str, &str); 2] = [("provisioning", PROVISIONING), ("plan", PLAN)];
/// The `$id` prefix of the wire's JSON Schemas (`docs/schema/<name>.json`); each endpoint's
/// `$SRV.INFO` metadata names its request, response and error schemas by id, as the NATS
/// ecosystem's services do (the end-to-end tests check each names a file of `docs/schema/`).
pub const SCHEMA_ID: &str = "urn:mesh-provisioner:schema:";
/// The queue group every instance's endpoints join, so one answers each request.
pub const QUEUE_GROUP: &str = "q";
/// The micro protocol's error headers: the reason, and its code.
pub const ERROR_HEADER: &str = "Nats-Service-Error";
pub const ERROR_CODE_HEADER: &str = "Nats-Service-Error-Code";
/// The subject a node's state changes are published on, before the node's name.
pub const EVENT_PREFIX: &str = "mesh-provisioner.event.";
/// The subject a node's notices are published on, before the node's name.
pub const NOTICE_PREFIX: &str = "mesh-provisioner.notice.";

/// A UTC time as RFC 3339, to the second (the `time` crate's formatter).
pub fn rfc3339(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    let t = t.replace_nanosecond(0).unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// The subject for `node`'s state changes, if `node` is one subject token.
pub fn event_subject(node: &str) -> Option<String> {
    node_subject(EVENT_PREFIX, node)
}

/// The subject for `node`'s notices, if `node` is one subject token.
pub fn notice_subject(node: &str) -> Option<String> {
    node_subject(NOTICE_PREFIX, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_contains_the_imports_within_it_and_no_wider() {
        assert!(contains("$KV.*.>", "$KV.mesh-provisioner_needs.alpha.>"));
        assert!(contains("a.*", "a.*") && contains("a.>", "a.*.c") && contains("a.b", "a.b"));
        assert!(!contains("a.*", "a.>"), "`*` holds one token, `>` may be more");
        assert!(!contains("a.*.>", "a.b"), "`>` needs a token");
        assert!(!contains("a.b", "a.*") && !contains("a.b", "a.b.c") && !contains("a.b.c", "a.b"));
    }

    #[test]
    fn publishes_only_to_a_node_token() {
        assert_eq!(event_subject("alpha").as_deref(), Some("mesh-provisioner.event.alpha"));
        assert_eq!(notice_subject("alpha").as_deref(), Some("mesh-provisioner.notice.alpha"));
        for bad in ["", "a.b", "*", ">", "a b", "é"] {
            assert_eq!((event_subject(bad), notice_subject(bad)), (None, None), "{bad:?}");
        }
    }

    /// `check_subject` as first written, token by token with a pass for each rule: the one pass
    /// must judge every subject as it did, with the same reason.
    fn judged_token_by_token(s: &str, filter: bool) -> std::result::Result<(), &'static str> {
        if s.is_empty() || s.len() > MAX_SUBJECT {
            return Err("empty or too long");
        }
        let mut tokens = s.split('.').peekable();
        while let Some(t) = tokens.next() {
            if t.is_empty() {
                return Err("empty token");
            }
            if !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err("not printable ASCII");
            }
            let wild = t == "*" || t == ">";
            if wild && !filter {
                return Err("a key holds no wildcard");
            }
            if t == ">" && tokens.peek().is_some() {
                return Err("`>` must be the last token");
            }
            if !wild && (t.contains('*') || t.contains('>')) {
                return Err("a wildcard must be a whole token");
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn judges_any_subject_as_token_by_token(s in "[a.*> \u{7f}é]{0,8}", filter in proptest::prelude::any::<bool>()) {
            let got = check_subject(&s, filter).map_err(|e| e.to_string());
            match judged_token_by_token(&s, filter) {
                Ok(()) => proptest::prop_assert!(got.is_ok(), "{:?}: {:?}", s, got),
                Err(why) => proptest::prop_assert!(got.as_ref().is_err_and(|e| e.ends_with(why)), "{:?}: {:?}, want {}", s, got, why),
            }
        }
    }

    #[test]
    fn matches_like_nats() {
        let m = |f: &str, k| matches(&f.split('.').collect::<Vec<_>>(), k);
        assert!(m("a.>", "a.b.c"));
        assert!(!m("a.>", "a"));
        assert!(m("*.b", "a.b"));
        assert!(!m("*.b", "a.b.c"));
        assert!(m(">", "a"));
        assert!(m("a.b", "a.b"));
    }
}
