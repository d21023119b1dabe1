//! A reply of either verb: its code, its body, an error reply that fits the smallest budget
//! whatever its message quotes, and [`PageBudget`], the one measure by which every paged answer
//! (a bucket's, `status`, `holders`) decides what fits. Below `verb`, `status` and `holders`,
//! which all answer with it; it reads nothing.

use serde::Serialize;

use crate::env::HostError;
use crate::value::{escaped_char_len, escaped_len, object, to_json};

/// A reply's code (the WIT `reply-code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    BadRequest,
    Unavailable,
    Internal,
    /// The mirrors did not reach a revision the request asked for in time.
    NotCurrent,
}

impl Code {
    pub const ALL: [Code; 5] = [Code::Ok, Code::BadRequest, Code::Unavailable, Code::Internal, Code::NotCurrent];

    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::BadRequest => "bad_request",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
            Code::NotCurrent => "not_current",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: Code,
    pub body: Vec<u8>,
    /// Where the body says its revision, for a host that serves it again (see [`Reply::revision_at`]).
    pub revision: Option<RevisionSlot>,
}

/// Where a page's body says its revision, and what that revision is the newest of (the WIT
/// `revision-slot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionSlot {
    pub offset: u32,
    pub len: u32,
    pub floor: u64,
    pub bucket: Option<&'static str>,
    /// Where the same digits are said again, after `offset` (the answer's `revisions` entry).
    pub copy: Option<u32>,
}

/// The most digits a `u64` takes: the room a rewritten revision may need.
pub(crate) const REVISION_DIGITS: usize = 20;

impl Reply {
    /// An error reply. However long `message` is (it may quote a requester's or a writer's
    /// bytes), the reply fits the smallest budget: a message whose escaped form is longer than
    /// [`MAX_MESSAGE`] is cut, on a character boundary, and ends with `…`.
    pub fn error(code: Code, message: &str) -> Reply {
        let body = to_json(&ErrorBody { error: ErrorLine { code: code.name(), message: &within_message(message), name: None, revision: None, asked: None } });
        Reply { code, body: body.into_bytes(), revision: None }
    }

    /// This page, telling where its body's `"revision"` (what `what` answers with, first after
    /// `what`) is: the newest of `floor` (its entries') and `bucket`'s page revision. Told only
    /// when the body can take a revision of any length within `budget`, so a host rewriting it
    /// never makes a reply too large; never on an error.
    pub fn revision_at(mut self, what: &str, floor: u64, bucket: Option<&'static str>, budget: usize) -> Reply {
        let prefix = format!("{{\"what\":\"{what}\",\"revision\":");
        if self.code != Code::Ok || !self.body.starts_with(prefix.as_bytes()) {
            return self;
        }
        let len = self.body[prefix.len()..].iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 || self.body.len() - len + REVISION_DIGITS > budget {
            return self;
        }
        self.revision = Some(RevisionSlot { offset: prefix.len() as u32, len: len as u32, floor, bucket, copy: None });
        self
    }

    pub(crate) fn from_host(e: HostError) -> Reply {
        match e {
            HostError::Unavailable(_) | HostError::Timeout(_) | HostError::NoResponders(_) => Reply::error(Code::Unavailable, &e.to_string()),
            other => Reply::error(Code::Internal, &format!("the store failed: {other}")),
        }
    }
}

/// The body of an error reply.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub(crate) struct ErrorBody<'a> {
    pub error: ErrorLine<'a>,
}

/// What went wrong: a code (as the header says it) and a message for a person.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub(crate) struct ErrorLine<'a> {
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::names::code"))]
    pub code: &'a str,
    /// Said for a person; the guest's are cut at 1 KiB.
    pub message: &'a str,
    /// `not_current` only: the bucket or node share whose revision was not reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    /// `not_current` only: the revision the mirrors reflect of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// `not_current` only: the revision the request asked for (or the bus held, for `consistent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
}

/// Smallest page budget honoured: below this not even one out-of-shape line would fit.
pub const MIN_REPLY: u32 = 4096;

/// The bytes a reply keeps for its `revisions` (a dozen buckets' names and revisions) past its
/// page; more buckets take more, and the page is made again smaller.
pub const REVISIONS_ROOM: u32 = 1024;

/// Smallest reply budget honoured: a page of the smallest budget and its `revisions`.
pub const MIN_ANSWER: u32 = MIN_REPLY + REVISIONS_ROOM;

/// The most bytes an error message takes in a reply, escaped (well under [`MIN_REPLY`]).
pub const MAX_MESSAGE: usize = 1024;

/// A page of an answer measured as it is built, so that the reply never passes its budget.
///
/// A page is a JSON object: a frame of fixed fields, up to [`LISTS`] lists of lines rendered
/// one by one, and, last, an optional `"next":"<key>"`. The measure is exact for everything a
/// requester or a writer controls (each line as rendered, each comma, the escaped `next`); only
/// numbers the page learns as it goes (a revision, a count) are counted at their widest, in the
/// frame the caller renders.
pub(crate) struct PageBudget {
    budget: usize,
    used: usize,
    /// Whether each list holds a line already (the next one then costs a comma).
    filled: [bool; LISTS],
    /// The bytes of the `next` the page says should it end without a cut.
    uncut: usize,
}

/// How many lists a page may have (`entries` and `out_of_shape`).
pub(crate) const LISTS: usize = 2;

/// The bytes `,"next":"<key>"` adds to a page.
fn next_len(key: Option<&str>) -> usize {
    key.map_or(0, |k| ",\"next\":".len() + escaped_len(k))
}

impl PageBudget {
    /// A page within `budget` whose `frame` is its JSON with every list empty, no `next`, and
    /// each number it learns later at its widest; `uncut` is the `next` it says should it end
    /// with no line cut (the position the listing read up to), if any.
    pub fn new(budget: usize, frame: &str, uncut: Option<&str>) -> PageBudget {
        PageBudget { budget, used: frame.len(), filled: [false; LISTS], uncut: next_len(uncut) }
    }

    /// What `lines` (each with the list it goes to) would add, and whether the page still fits
    /// with them, should it end after them with `next` = `cut` or the uncut `next`.
    fn cost(&self, lines: &[(usize, &str)]) -> usize {
        let mut filled = self.filled;
        lines
            .iter()
            .map(|(list, line)| {
                let comma = usize::from(std::mem::replace(&mut filled[*list], true));
                line.len() + comma
            })
            .sum()
    }

    /// Takes `lines` into the page if they fit together with the `next` it would say were it
    /// cut after them (`cut`); says whether it took them. Nothing is taken in part.
    pub fn take(&mut self, lines: &[(usize, &str)], cut: &str) -> bool {
        let add = self.cost(lines);
        if self.used + add + next_len(Some(cut)).max(self.uncut) > self.budget {
            return false;
        }
        self.used += add;
        for (list, _) in lines {
            self.filled[*list] = true;
        }
        true
    }

    /// The page, rendered: ok when it is within the budget, as the measure promised; otherwise
    /// (a bug in the measure, never a requester's doing) an internal error that says so, not a
    /// reply the bus would refuse.
    pub fn finish(&self, body: String) -> Reply {
        if body.len() > self.budget {
            let why = format!("a page of {} bytes was built for a reply of {} (measured {})", body.len(), self.budget, self.used);
            return Reply::error(Code::Internal, &why);
        }
        Reply { code: Code::Ok, body: body.into_bytes(), revision: None }
    }
}

/// A page of lines rendered already, as [`PageBudget`] measures it and as serde writes the page
/// structs of `status` and of a bucket's answer (each answer's `written` tests hold it so):
/// `what`, `revision`, `entries`, `out_of_shape`, and `next` when there is one.
pub(crate) fn page(what: &str, revision: u64, entries: &[String], out_of_shape: &[String], next: Option<&str>) -> String {
    joined_page(what, revision, &entries.join(","), &out_of_shape.join(","), next)
}

/// [`page`] of each list's lines joined by commas already.
pub(crate) fn joined_page(what: &str, revision: u64, entries: &str, out_of_shape: &str, next: Option<&str>) -> String {
    object(entries.len() + out_of_shape.len() + 2 * next.map_or(0, str::len) + 96, |o| {
        o.str("what", what);
        o.u64("revision", revision);
        o.joined("entries", entries);
        o.joined("out_of_shape", out_of_shape);
        o.some_str("next", next);
    })
}

/// `message`, cut so that its JSON-escaped form takes at most [`MAX_MESSAGE`] bytes.
fn within_message(message: &str) -> std::borrow::Cow<'_, str> {
    let (mut used, mut end) = (0, 0);
    for (i, c) in message.char_indices() {
        used += escaped_char_len(c);
        if used > MAX_MESSAGE - 3 {
            return format!("{}…", &message[..end]).into();
        }
        end = i + c.len_utf8();
    }
    message.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_fits_the_smallest_reply_whatever_its_message_quotes() {
        for message in ["\"".repeat(5000), "\u{1}".repeat(5000), "é".repeat(5000), "x".repeat(MAX_MESSAGE - 3)] {
            let r = Reply::error(Code::BadRequest, &message);
            assert!(r.body.len() <= MIN_REPLY as usize, "{} bytes", r.body.len());
            let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
            let said = v["error"]["message"].as_str().expect("a message");
            assert!(message.starts_with(said.trim_end_matches('…')), "{said}");
            assert_eq!(said.ends_with('…'), said.len() < message.len());
        }
    }

    #[test]
    fn a_page_says_where_its_revision_is_when_any_revision_would_fit() {
        let page = |body: &str| Reply { code: Code::Ok, body: body.as_bytes().to_vec(), revision: None };
        let body = r#"{"what":"needs","revision":4812,"entries":[]}"#;
        let told = page(body).revision_at("needs", 4790, Some("mesh-provisioner_needs"), 1000).revision.expect("told");
        let (at, len) = (told.offset as usize, told.len as usize);
        assert_eq!(&body[at..at + len], "4812");
        assert_eq!((told.floor, told.bucket), (4790, Some("mesh-provisioner_needs")));
        // At the edge: room for 20 digits in place of 4, and one byte less.
        let room = body.len() - 4 + 20;
        assert!(page(body).revision_at("needs", 0, None, room).revision.is_some());
        assert_eq!(page(body).revision_at("needs", 0, None, room - 1).revision, None, "a rewritten revision could pass the budget");
        assert_eq!(page(body).revision_at("applied", 0, None, 1000).revision, None, "not the page it says it is");
        assert_eq!(Reply::error(Code::Internal, "no").revision_at("needs", 0, None, 1000).revision, None);
    }
}
