//! Answering the verb `mesh-provisioner.provisioning` (SPEC §5).
//!
//! A request becomes the narrowest subject filter its fields allow; only keys in that scope are
//! read, and every one of them is either an entry or listed out of shape with its reason. Pages
//! are cut by `limit` and by the reply's byte budget, whichever comes first, and `next` says
//! where the following page starts.

use crate::env::{Entry, Env, HostError};
use crate::escape::encode;
use crate::keys::{self, parse_applied, parse_collect, parse_need, parse_registry};
use crate::request::{self, Query, What};
use crate::value::{push_str, push_value};

pub const PROVISIONING: &str = "mesh-provisioner.provisioning";
pub const PLAN: &str = "mesh-provisioner.plan";

/// A reply's code (the WIT `reply-code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    BadRequest,
    Unavailable,
    Internal,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::BadRequest => "bad_request",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: Code,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn error(code: Code, message: &str) -> Reply {
        let mut s = String::from("{\"error\":{\"code\":\"");
        s.push_str(code.name());
        s.push_str("\",\"message\":");
        push_str(&mut s, message);
        s.push_str("}}");
        Reply { code, body: s.into_bytes() }
    }

    fn from_host(e: HostError) -> Reply {
        match e {
            HostError::Unavailable(_) | HostError::Timeout(_) | HostError::NoResponders(_) => {
                Reply::error(Code::Unavailable, &e.to_string())
            }
            other => Reply::error(Code::Internal, &format!("the store failed: {other}")),
        }
    }
}

/// Smallest reply budget honoured: below this not even one out-of-shape line would fit.
pub const MIN_REPLY: u32 = 4096;

/// Answers one request of `verb`.
pub fn handle(env: &dyn Env, verb: &str, body: &[u8], max_reply: u32) -> Reply {
    match verb {
        PROVISIONING => match request::parse(body) {
            Err(why) => Reply::error(Code::BadRequest, &why),
            Ok(q) => provisioning(env, &q, max_reply.max(MIN_REPLY) as usize).unwrap_or_else(Reply::from_host),
        },
        PLAN => match request::parse_plan(body) {
            Err(why) => Reply::error(Code::BadRequest, &why),
            Ok((node, module)) => plan(env, &node, &module, max_reply.max(MIN_REPLY) as usize).unwrap_or_else(Reply::from_host),
        },
        other => Reply::error(Code::BadRequest, &format!("unknown verb {:?}", crate::escape::shorten(other))),
    }
}

/// Where a query looks: a bucket, the narrowable leading tokens of its shape, and how many tokens
/// the shape has.
struct Scope {
    bucket: &'static str,
    tokens: Vec<Option<String>>,
    shape_len: usize,
}

impl Scope {
    fn of(q: &Query) -> Scope {
        let id = |s: &Option<String>| s.clone();
        match q.what {
            What::Registry => Scope { bucket: keys::REGISTRY, tokens: vec![id(&q.kind)], shape_len: 1 },
            What::Needs => Scope {
                bucket: keys::NEEDS,
                tokens: vec![id(&q.node), id(&q.module), id(&q.kind)],
                shape_len: 4,
            },
            What::Applied => Scope { bucket: keys::APPLIED, tokens: vec![id(&q.node), id(&q.module)], shape_len: 2 },
            What::Collect => Scope {
                bucket: keys::COLLECT,
                tokens: vec![id(&q.node), q.collection.as_deref().map(encode), id(&q.module)],
                shape_len: 3,
            },
        }
    }

    /// The narrowest subject filter covering every key in scope, including keys with more
    /// tokens than the shape (out of shape, but in scope, so they must be reported).
    fn filter(&self) -> String {
        let Some(last) = self.tokens.iter().rposition(Option::is_some) else {
            return ">".into();
        };
        let mut parts: Vec<&str> = self.tokens[..=last].iter().map(|t| t.as_deref().unwrap_or("*")).collect();
        if last + 1 < self.shape_len {
            parts.push(">");
        }
        parts.join(".")
    }

    /// Keys shorter than the shape that a `>` filter cannot match but which are in scope: each
    /// fully given leading run of tokens (`alpha`, `alpha.app` for node and module).
    fn prefixes(&self) -> Vec<String> {
        let Some(last) = self.tokens.iter().rposition(Option::is_some) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut acc: Vec<&str> = Vec::new();
        for (i, t) in self.tokens[..=last].iter().enumerate() {
            if i + 1 >= self.shape_len {
                break;
            }
            match t {
                Some(t) => acc.push(t),
                None => break,
            }
            out.push(acc.join("."));
        }
        out
    }
}

fn provisioning(env: &dyn Env, q: &Query, budget: usize) -> Result<Reply, HostError> {
    let scope = Scope::of(q);
    let after = q.after.as_deref();
    let mut found: Vec<Entry> = Vec::new();
    for key in scope.prefixes() {
        if after.is_some_and(|a| key.as_str() <= a) {
            continue;
        }
        if let Some(e) = env.get(scope.bucket, &key)? {
            found.push(e);
        }
    }
    let page = env.scan(scope.bucket, &scope.filter(), after, q.limit)?;
    let mut more = page.more;
    found.extend(page.entries);
    found.sort_by(|a, b| a.key.cmp(&b.key));
    if found.len() > q.limit as usize {
        found.truncate(q.limit as usize);
        more = true;
    }
    Ok(render(q.what, page.revision, &found, more, budget))
}

/// The plan of `module` on `node`, whole: a plan is not paged, so one too large for a reply is
/// an error that says so.
fn plan(env: &dyn Env, node: &str, module: &str, budget: usize) -> Result<Reply, HostError> {
    let body = crate::plan::compute(env, node, module, false)?.render().into_bytes();
    if body.len() > budget {
        let why = format!("the plan of {module} on {node} is {} bytes, more than a reply may hold ({budget})", body.len());
        return Ok(Reply::error(Code::Internal, &why));
    }
    Ok(Reply { code: Code::Ok, body })
}

/// One rendered line of the answer.
enum Item {
    Entry(String),
    OutOfShape(String),
}

fn item(what: What, e: &Entry) -> Item {
    let mut s = String::from("{\"key\":");
    push_str(&mut s, &e.key);
    let field = |s: &mut String, name: &str, v: &str| {
        s.push_str(",\"");
        s.push_str(name);
        s.push_str("\":");
        push_str(s, v);
    };
    let parsed = match what {
        What::Registry => parse_registry(&e.key).map(|kind| field(&mut s, "kind", &kind)),
        What::Needs => parse_need(&e.key).map(|k| {
            field(&mut s, "node", &k.node);
            field(&mut s, "module", &k.module);
            field(&mut s, "kind", &k.kind);
            field(&mut s, "name", &k.name);
        }),
        What::Applied => parse_applied(&e.key).map(|k| {
            field(&mut s, "node", &k.node);
            field(&mut s, "module", &k.module);
        }),
        What::Collect => parse_collect(&e.key).map(|k| {
            field(&mut s, "node", &k.node);
            field(&mut s, "collection", &k.collection);
            field(&mut s, "contributor", &k.contributor);
        }),
    };
    s.push_str(",\"revision\":");
    s.push_str(&e.revision.to_string());
    match parsed {
        Ok(()) => {
            push_value(&mut s, &e.value);
            s.push('}');
            Item::Entry(s)
        }
        Err(reason) => {
            field(&mut s, "reason", &reason);
            s.push('}');
            Item::OutOfShape(s)
        }
    }
}

/// The same entry without its value, for the rare value too large for any reply.
fn without_value(what: What, e: &Entry) -> Item {
    let mut lean = e.clone();
    lean.value = Vec::new();
    match item(what, &lean) {
        Item::Entry(mut s) => {
            s.truncate(s.len() - 1);
            let cut = s.rfind(",\"value\":").unwrap_or(s.len());
            s.truncate(cut);
            s.push_str(&format!(",\"value_omitted\":{{\"bytes\":{},\"reason\":\"larger than a reply may be\"}}}}", e.value.len()));
            Item::Entry(s)
        }
        shape => shape,
    }
}

fn render(what: What, revision: u64, found: &[Entry], more: bool, budget: usize) -> Reply {
    let head = format!("{{\"what\":\"{}\",\"revision\":{revision},\"entries\":[", what.name());
    let mid = "],\"out_of_shape\":[";
    let (mut entries, mut shapes) = (String::new(), String::new());
    let mut cut_at: Option<usize> = None;
    let mut scratch = String::new();
    for (i, e) in found.iter().enumerate() {
        let mut it = item(what, e);
        scratch.clear();
        push_str(&mut scratch, &e.key);
        let next_len = scratch.len() + 10;
        let fixed = head.len() + mid.len() + 2 + next_len;
        let fits = |it: &Item, entries: &str, shapes: &str| {
            let add = match it {
                Item::Entry(s) | Item::OutOfShape(s) => s.len() + 1,
            };
            fixed + entries.len() + shapes.len() + add <= budget
        };
        if !fits(&it, &entries, &shapes) && i == 0 {
            it = without_value(what, e);
        }
        if !fits(&it, &entries, &shapes) {
            cut_at = Some(i);
            break;
        }
        let (list, s) = match it {
            Item::Entry(s) => (&mut entries, s),
            Item::OutOfShape(s) => (&mut shapes, s),
        };
        if !list.is_empty() {
            list.push(',');
        }
        list.push_str(&s);
    }
    let included = cut_at.unwrap_or(found.len());
    let mut body = head;
    body.push_str(&entries);
    body.push_str(mid);
    body.push_str(&shapes);
    body.push(']');
    if (more || cut_at.is_some()) && included > 0 {
        body.push_str(",\"next\":");
        push_str(&mut body, &found[included - 1].key);
    }
    body.push('}');
    Reply { code: Code::Ok, body: body.into_bytes() }
}
