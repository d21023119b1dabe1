//! Answering the verb `mesh-provisioner.provisioning` (SPEC §5).
//!
//! A request becomes the narrowest subject filter its fields allow; only keys in that scope are
//! read, and every one of them is either an entry or listed out of shape with its reason. Pages
//! are cut by `limit` and by the reply's byte budget, whichever comes first, and `next` says
//! where the following page starts.

use crate::env::{Entry, EntryRef, Env, HostError, Page};
use crate::escape::encode;
use crate::fresh;
use crate::keys::{self, parse_applied, parse_collect, parse_need_ref, parse_registry};
use crate::reply::{joined_page, page, PageBudget};
use crate::request::{self, Query, What};
use crate::value::{Object, Shown};
#[cfg(any(test, feature = "schema"))]
use serde::Serialize;
#[cfg(any(test, feature = "schema"))]
use serde_json::value::RawValue;

pub const PROVISIONING: &str = "mesh-provisioner.provisioning";
pub const PLAN: &str = "mesh-provisioner.plan";

pub use crate::reply::{Code, Reply, MAX_MESSAGE, MIN_ANSWER, MIN_REPLY};

/// Any answer of the verb, as its schema says it: which one is the request's `what`'s.
#[cfg(feature = "schema")]
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum AnyAnswer {
    /// `registry`, `needs`, `applied`, `collect`: a page of one bucket's keys.
    Bucket(VerbAnswer<'static>),
    /// `status`: a page of modules, each with its state and needs.
    Status(crate::status::StatusPage),
    /// `holders`: a page of the modules that hold a value.
    Holders(crate::holders::HolderPage<'static>),
    /// `causes`: what keeps the modules of a page from `applied`, each cause once.
    Causes(crate::causes::CausesPage),
}

/// Answers one request of `verb`.
pub fn handle(env: &dyn Env, verb: &str, body: &[u8], max_reply: u32) -> Reply {
    match verb {
        PROVISIONING => match request::parse(body) {
            Err(why) => Reply::error(Code::BadRequest, &why),
            Ok(q) => {
                fresh::answer(env, &q.fresh, max_reply.max(MIN_ANSWER) as usize, &|env, budget| provisioning(env, &q, budget).unwrap_or_else(Reply::from_host))
            }
        },
        PLAN => match request::parse_plan_fresh(body) {
            Err(why) => Reply::error(Code::BadRequest, &why),
            Ok((node, module, f)) => {
                fresh::answer(env, &f, max_reply.max(MIN_ANSWER) as usize, &|env, budget| plan(env, &node, &module, budget).unwrap_or_else(Reply::from_host))
            }
        },
        other => Reply::error(Code::BadRequest, &format!("unknown verb {:?}", crate::escape::shorten(other))),
    }
}

/// Where a query looks: a bucket and the narrowable leading tokens of its shape.
///
/// A key is **in scope** when it has every narrowed token, each equal to the value asked: a key
/// of any length, in shape or not (`alpha.app.extra` is in scope of applied `alpha`/`app`, and
/// `alpha.app` of needs narrowed by module `app`). Keys lacking a narrowed token are not.
struct Scope {
    bucket: &'static str,
    tokens: Vec<Option<String>>,
}

impl Scope {
    /// The scope of a query of one bucket; `None` for `status` and `holders`, which are not.
    fn of(q: &Query) -> Option<Scope> {
        let id = |s: &Option<String>| s.clone();
        Some(match q.what {
            What::Registry => Scope { bucket: keys::REGISTRY, tokens: vec![id(&q.kind)] },
            What::Needs => Scope { bucket: keys::NEEDS, tokens: vec![id(&q.node), id(&q.module), id(&q.kind)] },
            What::Applied => Scope { bucket: keys::APPLIED, tokens: vec![id(&q.node), id(&q.module)] },
            What::Collect => Scope { bucket: keys::COLLECT, tokens: vec![id(&q.node), q.collection.as_deref().map(encode), id(&q.module)] },
            What::Status | What::Holders | What::Causes => return None,
        })
    }

    /// The scope as two disjoint parts that together cover it exactly: the keys with exactly as
    /// many tokens as the last narrowed position (a literal key when nothing before it is a
    /// wildcard), and the longer ones (`… .>`). Unnarrowed, the whole bucket (`>`).
    fn parts(&self) -> Vec<Part> {
        let Some(last) = self.tokens.iter().rposition(Option::is_some) else {
            return vec![Part::Filter(">".into())];
        };
        let base: Vec<&str> = self.tokens[..=last].iter().map(|t| t.as_deref().unwrap_or("*")).collect();
        let base = base.join(".");
        let exact = if self.tokens[..=last].iter().all(Option::is_some) { Part::Key(base.clone()) } else { Part::Filter(base.clone()) };
        vec![exact, Part::Filter(format!("{base}.>"))]
    }
}

/// One part of a scope: a single key, read directly, or a subject filter, scanned.
enum Part {
    Key(String),
    Filter(String),
}

fn provisioning(env: &dyn Env, q: &Query, budget: usize) -> Result<Reply, HostError> {
    let scope = match (q.what, Scope::of(q)) {
        (_, Some(scope)) => scope,
        (What::Holders, None) => {
            let (kind, name) = (q.kind.as_deref().unwrap_or_default(), q.name.as_deref().unwrap_or_default());
            return crate::holders::answer(env, kind, name, q.node.as_deref(), q.after.as_deref(), q.limit, budget);
        }
        (What::Causes, None) => {
            return crate::causes::answer(env, q.node.as_deref(), q.module.as_deref(), q.after.as_deref(), q.limit, budget);
        }
        (_, None) => {
            let after = q.after.clone().or_else(|| q.after_node.as_deref().map(crate::keys::past_node));
            return crate::status::answer(env, q.node.as_deref(), q.module.as_deref(), after.as_deref(), q.limit, budget);
        }
    };
    let after = q.after.as_deref();
    let (mut got, mut pages) = (Vec::new(), Vec::new());
    for part in scope.parts() {
        match part {
            Part::Key(key) => {
                if after.is_some_and(|a| key.as_str() <= a) {
                    continue;
                }
                got.extend(env.get(scope.bucket, &key)?);
            }
            Part::Filter(filter) => pages.push(env.scan(scope.bucket, &filter, after, q.limit)?),
        }
    }
    let mut found: Vec<EntryRef> = got.iter().map(Entry::borrowed).chain(pages.iter().flat_map(Page::entries)).collect();
    let mut more = pages.iter().any(|p| p.more);
    let revision = pages.iter().map(|p| p.revision).max().unwrap_or(0);
    // The last key a part read up to, when it has more: nothing past the lowest such key is
    // known complete (a host may end a page early, by bytes, not only at `limit`).
    let horizon = pages.iter().filter(|p| p.more).filter_map(Page::last).map(|e| e.key).min();
    // The parts are disjoint, each in key order with at most `limit` keys: the first `limit` of
    // their union are the page, and anything cut here is more.
    found.sort_by(|a, b| a.key.cmp(b.key));
    if let Some(h) = horizon {
        found.retain(|e| e.key <= h);
    }
    if found.len() > q.limit as usize {
        found.truncate(q.limit as usize);
        more = true;
    }
    // What the page's revision is the newest of, told with the page: a kept page then holds
    // past writes to the bucket outside its scope, with the revision moved on.
    let floor = found.iter().map(|e| e.revision).max().unwrap_or(0);
    let page = render(q.what, revision.max(floor), &found, more, budget);
    Ok(page.revision_at(q.what.name(), floor, (!pages.is_empty()).then_some(scope.bucket), budget))
}

/// The plan of `module` on `node`, whole: a plan is not paged, so one too large for a reply is
/// an error that says so.
fn plan(env: &dyn Env, node: &str, module: &str, budget: usize) -> Result<Reply, HostError> {
    let body = crate::plan::compute(env, node, module, false)?.render().into_bytes();
    if body.len() > budget {
        let why = format!("the plan of {module} on {node} is {} bytes, more than a reply may hold ({budget})", body.len());
        return Ok(Reply::error(Code::Internal, &why));
    }
    Ok(Reply { code: Code::Ok, body, revision: None })
}

/// One line of the answer: an entry, or a key out of shape with its reason.
#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "BucketLine"))]
pub(crate) struct PlanLine<'a> {
    key: &'a str,
    #[serde(flatten)]
    fields: Option<LineFields<'a>>,
    revision: u64,
    #[serde(flatten)]
    tail: Tail<'a>,
}

/// What the key says, by the bucket's shape.
#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
#[cfg_attr(not(test), allow(dead_code))] // (outside tests only the schema reads it)
enum LineFields<'a> {
    Registry { kind: String },
    Need(#[cfg_attr(feature = "schema", schemars(with = "keys::NeedKey"))] keys::NeedRef<'a>),
    Applied(keys::AppliedKey),
    Collect(keys::CollectKey),
}

#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
#[cfg_attr(not(test), allow(dead_code))] // (outside tests only the schema reads it)
enum Tail<'a> {
    Value(Shown<'a>),
    /// The rare value too large for any reply: its size instead.
    Omitted {
        value_omitted: Omitted,
    },
    /// Why a key is out of shape.
    Reason {
        reason: String,
    },
}

#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
struct Omitted {
    bytes: usize,
    reason: &'static str,
}

/// The line of `e`, rendered, and whether it is out of shape; `value: false` lists an entry
/// with its value's size instead of its value. Written by hand ([`Object`]) as serde writes
/// [`PlanLine`]: every line of every page passes here (`a_line_is_written_as_serde_writes_it`).
#[cfg(test)]
fn line(what: What, e: &EntryRef, value: bool) -> (String, bool) {
    let mut out = String::with_capacity(line_guess(e));
    let out_of_shape = write_line(&mut out, what, e, value);
    (out, out_of_shape)
}

/// Writes the line of `e` at the end of `out` ([`line`]); whether it is out of shape.
fn write_line(out: &mut String, what: What, e: &EntryRef, value: bool) -> bool {
    let mut o = Object::new(out);
    // A key that parses is made of the key alphabet, dots and `=XX` escapes: written, like the
    // tokens borrowed from it, without looking for JSON escapes (a line's most-written strings).
    let shaped = match what {
        What::Registry => parse_registry(e.key).map(|kind| {
            o.plain_str("key", e.key);
            o.plain_str("kind", &kind);
        }),
        What::Needs => parse_need_ref(e.key).map(|k| {
            o.plain_str("key", e.key);
            o.token("node", k.node);
            o.token("module", k.module);
            o.token("kind", k.kind);
            o.token("name", k.name);
        }),
        // (`status` and `holders` list modules; never items of one bucket.)
        What::Applied | What::Status | What::Holders | What::Causes => parse_applied(e.key).map(|k| {
            o.plain_str("key", e.key);
            o.plain_str("node", &k.node);
            o.plain_str("module", &k.module);
        }),
        What::Collect => parse_collect(e.key).map(|k| {
            o.plain_str("key", e.key);
            o.plain_str("node", &k.node);
            o.str("collection", &k.collection);
            o.plain_str("contributor", &k.contributor);
        }),
    };
    if shaped.is_err() {
        o.str("key", e.key);
    }
    o.u64("revision", e.revision);
    match &shaped {
        Ok(()) if value => o.shown(&Shown::of(e.value)),
        Ok(()) => o.object("value_omitted", |o| {
            o.u64("bytes", e.value.len() as u64);
            o.str("reason", OMITTED);
        }),
        Err(reason) => o.str("reason", reason),
    }
    o.end();
    shaped.is_err()
}

/// A line's guess at its value's bytes stops here (a larger value grows the line as it goes).
const MAX_GUESS: usize = 4096;

/// The bytes a line is first given: the key twice (as itself and as its tokens), the value, and
/// the fields' names, quotes and a revision of twenty digits (at most 112 together). A key or
/// value with bytes to escape grows the line past it; a plain one never makes it grow, which
/// would copy it whole.
fn line_guess(e: &EntryRef) -> usize {
    2 * e.key.len() + e.value.len().min(MAX_GUESS) + 112
}

/// Why an entry lists its value's size instead of its value.
const OMITTED: &str = "larger than a reply may be";

/// A page of the answer.
#[cfg(any(test, feature = "schema"))]
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "BucketPage"))]
pub(crate) struct VerbAnswer<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::bucket_what"))]
    what: &'a str,
    /// The bucket's revision when it was read.
    revision: u64,
    /// Keys in shape, with what each key says and its value.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<PlanLine<'static>>"))]
    entries: Vec<Box<RawValue>>,
    /// Keys in scope that fit no shape, each with the reason.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<PlanLine<'static>>"))]
    out_of_shape: Vec<Box<RawValue>>,
    /// Where the next page starts (as `after`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<&'a str>,
}

fn render(what: What, revision: u64, found: &[EntryRef], more: bool, budget: usize) -> Reply {
    const ENTRIES: usize = 0;
    const OUT_OF_SHAPE: usize = 1;
    // Each list's lines joined by commas as they are taken, each line written once into one
    // buffer kept for them all: a page is as many lines as fit, and a line its own string was
    // an allocation and a copy more each.
    let mut lists = [String::new(), String::new()];
    let mut it = String::new();
    // Uncut, the page says `next` only when the scan has more: the last key found.
    let uncut = found.last().filter(|_| more).map(|e| e.key);
    let mut room = PageBudget::new(budget, &page(what.name(), revision, &[], &[], None), uncut);
    let mut cut_at: Option<usize> = None;
    for (i, e) in found.iter().enumerate() {
        it.clear();
        it.reserve(line_guess(e));
        let mut shaped = write_line(&mut it, what, e, true);
        let list = |shaped: bool| if shaped { OUT_OF_SHAPE } else { ENTRIES };
        let mut fits = room.take(&[(list(shaped), &it)], e.key);
        if !fits && i == 0 {
            it.clear();
            shaped = write_line(&mut it, what, e, false);
            fits = room.take(&[(list(shaped), &it)], e.key);
        }
        if !fits {
            if i == 0 {
                // Not even its key fits: an empty page without `next` would end the listing
                // here, silently. Say which key, so the operator can remove it or raise the
                // server's max_payload.
                let why = format!(
                    "the key {:?} ({} bytes) cannot be listed within a reply of {budget} bytes; raise the server's max_payload or remove the key",
                    crate::escape::shorten(e.key),
                    e.key.len()
                );
                return Reply::error(Code::Internal, &why);
            }
            cut_at = Some(i);
            break;
        }
        let joined = &mut lists[list(shaped)];
        if joined.is_empty() {
            // The whole page's lines, most likely: one allocation for them all, never more
            // than the page may hold (a first line of 64 KiB is no measure of a thousand).
            joined.reserve(found.len().saturating_mul(it.len()).min(budget));
        } else {
            joined.push(',');
        }
        joined.push_str(&it);
    }
    let included = cut_at.unwrap_or(found.len());
    let next = ((more || cut_at.is_some()) && included > 0).then(|| found[included - 1].key);
    room.finish(joined_page(what.name(), revision, &lists[ENTRIES], &lists[OUT_OF_SHAPE], next))
}

#[cfg(test)]
mod written {
    use super::*;
    use crate::value::to_json;

    /// What serde writes for the line of `e`, from the structs the schema is made from, and
    /// whether the key is out of shape (no fields).
    fn by_serde(what: What, e: &Entry, value: bool) -> (String, bool) {
        let fields = match what {
            What::Registry => parse_registry(&e.key).map(|kind| LineFields::Registry { kind }),
            What::Needs => parse_need_ref(&e.key).map(LineFields::Need),
            What::Applied | What::Status | What::Holders | What::Causes => parse_applied(&e.key).map(LineFields::Applied),
            What::Collect => parse_collect(&e.key).map(LineFields::Collect),
        };
        let (fields, tail) = match fields {
            Ok(f) if value => (Some(f), Tail::Value(Shown::of(&e.value))),
            Ok(f) => (Some(f), Tail::Omitted { value_omitted: Omitted { bytes: e.value.len(), reason: OMITTED } }),
            Err(reason) => (None, Tail::Reason { reason }),
        };
        let out_of_shape = fields.is_none();
        (to_json(&PlanLine { key: &e.key, fields, revision: e.revision, tail }), out_of_shape)
    }

    #[test]
    fn a_line_of_plain_parts_fits_in_its_first_guess() {
        let value = br#"{"placeholder":"${config:x}","part":"api"}"#.to_vec();
        let big = vec![b'7'; 5000];
        let cases = [
            (What::Needs, "alpha.app.config.db_url", &value),
            (What::Needs, "a.b.c.d", &big),
            (What::Applied, "alpha.app", &value),
            (What::Collect, "alpha.metrics.beta", &value),
            (What::Registry, "config", &value),
            (What::Needs, "a.b", &value),
        ];
        for (what, key, value) in cases {
            for (shown, revision) in [(true, u64::MAX), (false, u64::MAX), (true, 0)] {
                let e = Entry { key: key.into(), revision, value: value.clone() };
                let (text, _) = line(what, &e.borrowed(), shown);
                assert!(
                    text.len() <= line_guess(&e.borrowed()) || value.len() > MAX_GUESS,
                    "{text} is {} bytes, guessed {}",
                    text.len(),
                    line_guess(&e.borrowed())
                );
            }
        }
    }

    #[test]
    fn a_line_is_written_as_serde_writes_it() {
        let keys = ["config", "alpha.app.config.db=2Eurl", "alpha.app", "alpha.=2Fetc.web", "alpha.app.config.x.y", "al\"pha", ""];
        let values: [&[u8]; 5] = [br#"{"placeholder":"${config:x}","part":"api"}"#, b"text \"quoted\"\n", &[0xff, 0x00], b"", b"1e999"];
        for what in What::ALL {
            for key in keys {
                for value in values {
                    for (revision, whole) in [(0, true), (u64::MAX, false)] {
                        let e = Entry { key: key.into(), revision, value: value.to_vec() };
                        assert_eq!(line(what, &e.borrowed(), whole), by_serde(what, &e, whole), "{what:?} {key:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_page_is_written_as_serde_writes_it() {
        let e = Entry { key: "alpha.app.config.x".into(), revision: 3, value: b"{}".to_vec() };
        let lines = [line(What::Needs, &e.borrowed(), true).0, line(What::Needs, &e.borrowed(), false).0];
        let raws = |l: &[String]| l.iter().map(|l| RawValue::from_string(l.clone()).expect("a line is JSON")).collect::<Vec<_>>();
        for (entries, shapes, next) in [(&lines[..], &lines[1..], Some("alpha.\"x\"")), (&[][..], &[][..], None)] {
            let want = VerbAnswer { what: "needs", revision: 12, entries: raws(entries), out_of_shape: raws(shapes), next };
            assert_eq!(page("needs", 12, entries, shapes, next), to_json(&want));
        }
    }
}
