//! Read-your-writes (SPEC §5): a request's `min_revision`, `wait` and `consistent`, read and
//! checked like its other fields, and an answer made to reflect them. The host waits for its
//! mirrors (`store.reach`); the answer is computed over what they hold then, and ends by saying
//! the revision of each bucket it read (`revisions`). Both verbs answer through [`answer`]; it
//! decides nothing about what an answer holds, and never touches a key.

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::env::{Entry, Env, Health, HostError, Level, Mark, Page, Reached};
use crate::escape::{identifier_problem, shorten};
use crate::reply::{Code, ErrorBody, ErrorLine, Reply, RevisionSlot, MIN_REPLY, REVISIONS_ROOM, REVISION_DIGITS};
use crate::value::{to_json, write_str};

/// How long a request waits for the mirrors unless it says (`wait`).
pub const DEFAULT_WAIT_MS: u32 = 2_000;
/// The longest `wait` honoured; a longer one is clamped to it.
pub const MAX_WAIT_MS: u32 = 10_000;
/// The most buckets and shares one `min_revision` may name.
pub const MAX_MARKS: usize = 16;
/// The fields this module reads, in every request of either verb.
pub const FIELDS: [&str; 3] = ["min_revision", "wait", "consistent"];

/// What a request asks of the answer's freshness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fresh {
    /// Each bucket or node share named, with the revision the answer is to reflect at least.
    pub min_revision: Vec<(String, u64)>,
    /// How long to wait for the mirrors, clamped to [`MAX_WAIT_MS`].
    pub wait_ms: Option<u32>,
    /// Whether to reflect the bus's current revision of every bucket read.
    pub consistent: bool,
}

impl Fresh {
    /// Reads `field` (one of [`FIELDS`]) from a request.
    pub fn read(&mut self, field: &str, v: &Value) -> Result<(), String> {
        match field {
            "min_revision" => self.min_revision = min_revision(v)?,
            "wait" => self.wait_ms = Some(wait(v)?),
            "consistent" => match v {
                Value::Bool(b) => self.consistent = *b,
                _ => return Err("field `consistent` must be true or false".into()),
            },
            other => return Err(format!("unknown field {:?}", shorten(other))),
        }
        Ok(())
    }

    /// Refuses a `wait` with nothing to wait for: a requester who sets it expects a wait.
    pub fn check(&self) -> Result<(), String> {
        if self.wait_ms.is_some() && !self.asks() {
            return Err("field `wait` applies only with `min_revision` or `consistent`".into());
        }
        Ok(())
    }

    fn asks(&self) -> bool {
        !self.min_revision.is_empty() || self.consistent
    }

    fn wait(&self) -> u32 {
        self.wait_ms.unwrap_or(DEFAULT_WAIT_MS)
    }
}

/// `{"<bucket or share>": N, …}`: 1 to [`MAX_MARKS`] names, each an identifier, each with a
/// whole number.
fn min_revision(v: &Value) -> Result<Vec<(String, u64)>, String> {
    let Value::Object(map) = v else {
        return Err("field `min_revision` must be an object of bucket or share names to revisions, e.g. {\"mesh-provisioner_needs\": 42}".into());
    };
    if map.is_empty() || map.len() > MAX_MARKS {
        return Err(format!("field `min_revision` names 1 to {MAX_MARKS} buckets or shares, not {}", map.len()));
    }
    map.iter()
        .map(|(name, n)| {
            if let Some(p) = identifier_problem(name) {
                return Err(format!("field `min_revision`: a name {p}"));
            }
            match n.as_u64() {
                Some(n) => Ok((name.clone(), n)),
                None => Err(format!("field `min_revision`: {name}'s revision must be a whole number, not {}", shorten(&n.to_string()))),
            }
        })
        .collect()
}

/// `"250ms"`, `"3s"`, `"1.5s"` (up to nine digits, and three after a point): at most
/// [`MAX_WAIT_MS`], a longer one clamped.
fn wait(v: &Value) -> Result<u32, String> {
    let bad = || format!("field `wait` must be a duration such as \"500ms\" or \"3s\", not {}", shorten(&v.to_string()));
    let Value::String(s) = v else { return Err(bad()) };
    let (number, scale) = match (s.strip_suffix("ms"), s.strip_suffix('s')) {
        (Some(n), _) => (n, 1.0),
        (None, Some(n)) => (n, 1000.0),
        _ => return Err(bad()),
    };
    let digits = |d: &str, most: usize| (1..=most).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit());
    let well_formed = match number.split_once('.') {
        Some((whole, fraction)) => digits(whole, 9) && digits(fraction, 3),
        None => digits(number, 9),
    };
    let ms = number.parse::<f64>().ok().filter(|_| well_formed).ok_or_else(bad)? * scale;
    Ok(ms.min(MAX_WAIT_MS as f64).round() as u32)
}

/// Answers with `compute` (an answer within the budget it is given) as `fresh` asks: after the
/// mirrors reflect its `min_revision`; for `consistent`, over mirrors that reflect the bus's
/// revisions of every bucket the answer read, found after the request arrived. An `ok` answer
/// ends with `"revisions"`, each bucket it read and the newest revision of it the reads saw
/// (the answer reflects at least that). `compute` is called once, or twice when `consistent`
/// finds a bucket read behind the bus (or the revisions did not fit the room kept for them).
pub fn answer(env: &dyn Env, fresh: &Fresh, budget: usize, compute: &dyn Fn(&dyn Env, usize) -> Reply) -> Reply {
    if !fresh.min_revision.is_empty() {
        let marks: Vec<Mark> = fresh.min_revision.iter().map(|(name, n)| Mark { name: name.clone(), revision: Some(*n) }).collect();
        if let Err(r) = reach(env, &marks, fresh.wait()) {
            return r;
        }
    }
    let mut room = REVISIONS_ROOM as usize;
    let (mut reply, mut read) = recorded(env, budget, room, compute);
    if fresh.consistent && reply.code == Code::Ok {
        let marks: Vec<Mark> = read.keys().map(|name| Mark { name: name.clone(), revision: None }).collect();
        match reach(env, &marks, fresh.wait()) {
            Err(r) => return r,
            // A bucket the reads saw behind the bus: read again, from mirrors that reflect it.
            Ok(reached) if reached.iter().any(|r| read.get(&r.name).is_some_and(|seen| *seen < r.asked)) => {
                (reply, read) = recorded(env, budget, room, compute)
            }
            Ok(_) => {}
        }
    }
    if reply.code != Code::Ok {
        return reply;
    }
    slot_said(&reply, &mut read);
    let mut told = revisions(&read, slot_bucket(&reply));
    if told.0.len() > room {
        // More buckets than the room kept: answer again with room for them all.
        room = told.0.len();
        if budget < MIN_REPLY as usize + room {
            let why = format!("the revisions of the {} buckets read take {room} bytes, more than a reply of {budget} leaves", read.len());
            return Reply::error(Code::Internal, &why);
        }
        (reply, read) = recorded(env, budget, room, compute);
        if reply.code != Code::Ok {
            return reply;
        }
        slot_said(&reply, &mut read);
        told = revisions(&read, slot_bucket(&reply));
        if told.0.len() > room {
            let why = format!("the revisions of the {} buckets read take {} bytes, more than the {room} kept", read.len(), told.0.len());
            return Reply::error(Code::Internal, &why);
        }
    }
    ends_with(reply, &told, budget)
}

/// The bucket whose revision the reply says where (its slot), if any.
fn slot_bucket(reply: &Reply) -> Option<&'static str> {
    reply.revision.as_ref().and_then(|slot| slot.bucket)
}

/// `read` with the slot's bucket at the revision the body says: the two are said alike, so a
/// host rewriting one (a kept reply served after writes elsewhere) rewrites the other.
fn slot_said(reply: &Reply, read: &mut BTreeMap<String, u64>) {
    let Some(slot) = &reply.revision else { return };
    let (Some(bucket), at) = (slot.bucket, slot.offset as usize) else { return };
    let said = reply.body.get(at..at + slot.len as usize).and_then(|d| std::str::from_utf8(d).ok()).and_then(|d| d.parse::<u64>().ok());
    if let Some(revision) = said {
        read.insert(bucket.to_string(), revision);
    }
}

/// The answer over an env that records each bucket read, within `budget` less `room` (never
/// less than [`MIN_REPLY`]).
fn recorded(env: &dyn Env, budget: usize, room: usize, compute: &dyn Fn(&dyn Env, usize) -> Reply) -> (Reply, BTreeMap<String, u64>) {
    let recording = Recording { env, read: RefCell::new(BTreeMap::new()) };
    let reply = compute(&recording, budget.saturating_sub(room).max(MIN_REPLY as usize));
    (reply, recording.read.into_inner())
}

/// Asks the host to reach `marks`; a reply to send instead of the answer when it did not.
fn reach(env: &dyn Env, marks: &[Mark], wait_ms: u32) -> Result<Vec<Reached>, Reply> {
    let reached = env.reach(marks, wait_ms).map_err(|e| match e {
        HostError::Invalid(why) => Reply::error(Code::BadRequest, &format!("field `min_revision`: {why}")),
        other => Reply::from_host(other),
    })?;
    match reached.iter().find(|r| !r.is_reached()) {
        Some(r) => Err(not_current(r, wait_ms)),
        None => Ok(reached),
    }
}

/// The `503` of a mark not reached in time: its name, its revision and the one asked.
pub fn not_current(r: &Reached, wait_ms: u32) -> Reply {
    let message = format!("{} is at revision {} here, not yet {} (waited {wait_ms} ms)", r.name, r.revision, r.asked);
    let line = ErrorLine { code: Code::NotCurrent.name(), message: &message, name: Some(&r.name), revision: Some(r.revision), asked: Some(r.asked) };
    let body = to_json(&ErrorBody { error: line });
    Reply { code: Code::NotCurrent, body: body.into_bytes(), revision: None }
}

/// `,"revisions":{…}`, as it ends a reply, and where in it the revision of `slot` (a bucket)
/// is written.
fn revisions(read: &BTreeMap<String, u64>, slot: Option<&str>) -> (String, Option<usize>) {
    let mut out = String::with_capacity(16 + read.keys().map(|b| b.len() + 24).sum::<usize>());
    out.push_str(",\"revisions\":{");
    let mut at = None;
    for (i, (bucket, revision)) in read.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(&mut out, bucket);
        out.push(':');
        if slot == Some(bucket.as_str()) {
            at = Some(out.len());
        }
        out.push_str(&revision.to_string());
    }
    out.push('}');
    (out, at)
}

/// `reply`'s JSON object with `told` before its closing brace (nothing before it moves, so a
/// revision slot still points at its digits), the slot told where its copy is — or dropped when
/// both rewritten to a revision of any length could pass `budget` (the reply is then kept only
/// while nothing it read changed).
fn ends_with(mut reply: Reply, told: &(String, Option<usize>), budget: usize) -> Reply {
    if reply.body.last() != Some(&b'}') {
        return reply;
    }
    let base = reply.body.len() - 1;
    reply.body.pop();
    reply.body.extend_from_slice(told.0.as_bytes());
    reply.body.push(b'}');
    let size = reply.body.len();
    let fits = |len: u32| size + 2 * REVISION_DIGITS.saturating_sub(len as usize) <= budget;
    reply.revision = match (reply.revision.take(), told.1) {
        (Some(slot), Some(at)) if fits(slot.len) => Some(RevisionSlot { copy: Some((base + at) as u32), ..slot }),
        _ => None,
    };
    reply
}

/// An env that notes, for each bucket read, the newest revision the reads saw of it: a scan's
/// page revision, a read entry's revision (0 for a key or a bucket found absent).
struct Recording<'a> {
    env: &'a dyn Env,
    read: RefCell<BTreeMap<String, u64>>,
}

impl Recording<'_> {
    fn saw(&self, bucket: &str, revision: u64) {
        let mut read = self.read.borrow_mut();
        match read.get_mut(bucket) {
            Some(r) => *r = (*r).max(revision),
            None => {
                read.insert(bucket.to_string(), revision);
            }
        }
    }
}

impl Env for Recording<'_> {
    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError> {
        let e = self.env.get(bucket, key)?;
        self.saw(bucket, e.as_ref().map_or(0, |e| e.revision));
        Ok(e)
    }
    fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError> {
        let p = self.env.scan(bucket, filter, after, limit)?;
        self.saw(bucket, p.revision);
        Ok(p)
    }
    fn exists(&self, bucket: &str) -> Result<bool, HostError> {
        let exists = self.env.exists(bucket)?;
        self.saw(bucket, 0);
        Ok(exists)
    }
    fn health(&self, bucket: &str) -> Result<Health, HostError> {
        self.env.health(bucket)
    }
    fn reach(&self, marks: &[Mark], wait_ms: u32) -> Result<Vec<Reached>, HostError> {
        self.env.reach(marks, wait_ms)
    }
    fn responders(&self, service: &str) -> Result<u32, HostError> {
        self.env.responders(service)
    }
    fn put_registry(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, HostError> {
        self.env.put_registry(key, value, expected)
    }
    fn delete_registry(&self, key: &str, expected: u64) -> Result<(), HostError> {
        self.env.delete_registry(key, expected)
    }
    fn log(&self, level: Level, message: &str) {
        self.env.log(level, message)
    }
    fn load_plan(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.env.load_plan(node, module)
    }
    fn save_plan(&self, node: &str, module: &str, plan: &[u8]) -> Result<(), HostError> {
        self.env.save_plan(node, module, plan)
    }
    fn keep_failure(&self, node: &str, module: &str) -> Option<String> {
        self.env.keep_failure(node, module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem_env::MemEnv;

    fn fresh(body: &str) -> Result<Fresh, String> {
        let v: serde_json::Map<String, Value> = serde_json::from_str(body).unwrap();
        let mut f = Fresh::default();
        for (k, v) in &v {
            f.read(k, v)?;
        }
        f.check()?;
        Ok(f)
    }

    #[test]
    fn clamps_the_wait_at_ten_seconds_and_reads_its_units() {
        for (given, ms) in
            [("\"0s\"", 0), ("\"250ms\"", 250), ("\"3s\"", 3000), ("\"1.5s\"", 1500), ("\"10s\"", 10_000), ("\"10001ms\"", 10_000), ("\"99999s\"", 10_000)]
        {
            let f = fresh(&format!("{{\"consistent\":true,\"wait\":{given}}}")).unwrap();
            assert_eq!(f.wait(), ms, "{given}");
        }
        assert_eq!(fresh("{\"consistent\":true}").unwrap().wait(), DEFAULT_WAIT_MS);
        for bad in ["\"3\"", "\"s\"", "\"-1s\"", "\"1.2.3s\"", "\"1e3ms\"", "3", "\"NaNs\"", "\"1 s\"", "\".5s\"", "\"1.s\"", "\"1234567890ms\""] {
            let e = fresh(&format!("{{\"consistent\":true,\"wait\":{bad}}}")).unwrap_err();
            assert!(e.contains("field `wait` must be a duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn refuses_a_wait_with_nothing_to_wait_for() {
        assert!(fresh("{\"wait\":\"1s\"}").unwrap_err().contains("applies only with"));
        assert!(fresh("{\"wait\":\"1s\",\"consistent\":false}").unwrap_err().contains("applies only with"));
    }

    #[test]
    fn reads_min_revision_names_and_refuses_what_is_not_one() {
        let f = fresh(r#"{"min_revision":{"mesh-provisioner_needs":42,"NODE_alpha":7}}"#).unwrap();
        assert_eq!(f.min_revision, vec![("NODE_alpha".to_string(), 7), ("mesh-provisioner_needs".to_string(), 42)]);
        assert!(fresh(r#"{"min_revision":{}}"#).unwrap_err().contains("1 to 16"));
        let many: Vec<String> = (0..=MAX_MARKS).map(|i| format!("\"b{i}\":1")).collect();
        assert!(fresh(&format!("{{\"min_revision\":{{{}}}}}", many.join(","))).unwrap_err().contains("not 17"));
        assert!(fresh(r#"{"min_revision":{"KV_x.>":1}}"#).unwrap_err().contains("not an identifier"));
        assert!(fresh(r#"{"min_revision":{"b":-1}}"#).unwrap_err().contains("b's revision must be a whole number"));
        assert!(fresh(r#"{"min_revision":{"b":1.5}}"#).unwrap_err().contains("whole number"));
        assert!(fresh(r#"{"min_revision":[1]}"#).unwrap_err().contains("must be an object"));
        assert!(fresh(r#"{"consistent":"yes"}"#).unwrap_err().contains("true or false"));
    }

    /// A host whose mirrors stand at fixed revisions, and a bus ahead of them.
    struct Behind {
        env: MemEnv,
        mirror: u64,
        bus: u64,
        asked: RefCell<Vec<Vec<Mark>>>,
    }

    impl Env for Behind {
        fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError> {
            self.env.get(bucket, key)
        }
        fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError> {
            self.env.scan(bucket, filter, after, limit)
        }
        fn exists(&self, bucket: &str) -> Result<bool, HostError> {
            self.env.exists(bucket)
        }
        fn reach(&self, marks: &[Mark], _: u32) -> Result<Vec<Reached>, HostError> {
            self.asked.borrow_mut().push(marks.to_vec());
            if marks.iter().any(|m| m.name == "nothing") {
                return Err(HostError::Invalid("nothing is neither a bucket nor a share".into()));
            }
            Ok(marks.iter().map(|m| Reached { name: m.name.clone(), asked: m.revision.unwrap_or(self.bus), revision: self.mirror }).collect())
        }
        fn responders(&self, s: &str) -> Result<u32, HostError> {
            self.env.responders(s)
        }
        fn put_registry(&self, k: &str, v: &[u8], e: u64) -> Result<u64, HostError> {
            self.env.put_registry(k, v, e)
        }
        fn delete_registry(&self, k: &str, e: u64) -> Result<(), HostError> {
            self.env.delete_registry(k, e)
        }
        fn log(&self, l: Level, m: &str) {
            self.env.log(l, m)
        }
        fn load_plan(&self, n: &str, m: &str) -> Result<Option<Vec<u8>>, HostError> {
            self.env.load_plan(n, m)
        }
        fn save_plan(&self, n: &str, m: &str, p: &[u8]) -> Result<(), HostError> {
            self.env.save_plan(n, m, p)
        }
        fn keep_failure(&self, n: &str, m: &str) -> Option<String> {
            self.env.keep_failure(n, m)
        }
    }

    fn behind(mirror: u64, bus: u64) -> Behind {
        let env = MemEnv::default();
        env.put("b1", "alpha.x", b"1");
        env.put("b2", "alpha.y", b"2");
        Behind { env, mirror, bus, asked: RefCell::new(Vec::new()) }
    }

    /// Reads `b1` by a scan and `b2` by a get.
    fn two_buckets(env: &dyn Env, _: usize) -> Reply {
        let page = env.scan("b1", ">", None, 10).unwrap();
        let got = env.get("b2", "alpha.y").unwrap();
        let body = format!("{{\"what\":\"test\",\"revision\":{},\"n\":{}}}", page.revision, page.len() + got.iter().len());
        Reply { code: Code::Ok, body: body.into_bytes(), revision: None }
    }

    fn json(r: &Reply) -> Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn says_the_revision_of_each_bucket_read() {
        let host = behind(2, 2);
        let r = answer(&host, &Fresh::default(), 100_000, &two_buckets);
        assert_eq!(json(&r), serde_json::json!({"what":"test","revision":1,"n":2,"revisions":{"b1":1,"b2":2}}));
        assert!(host.asked.borrow().is_empty(), "a plain request asks the host nothing more");
    }

    #[test]
    fn answers_not_current_naming_the_mark_its_revision_and_the_one_asked() {
        let host = behind(5, 5);
        let f = fresh(r#"{"min_revision":{"NODE_alpha":9},"wait":"250ms"}"#).unwrap();
        let r = answer(&host, &f, 100_000, &two_buckets);
        assert_eq!(r.code, Code::NotCurrent);
        let e = &json(&r)["error"];
        assert_eq!(
            (e["code"].as_str(), e["name"].as_str(), e["revision"].as_u64(), e["asked"].as_u64()),
            (Some("not_current"), Some("NODE_alpha"), Some(5), Some(9))
        );
        assert!(e["message"].as_str().unwrap().contains("NODE_alpha is at revision 5 here, not yet 9 (waited 250 ms)"), "{e}");
        let reached = answer(&host, &fresh(r#"{"min_revision":{"NODE_alpha":5}}"#).unwrap(), 100_000, &two_buckets);
        assert_eq!(reached.code, Code::Ok);
    }

    #[test]
    fn refuses_a_name_the_host_does_not_know_as_a_bad_request() {
        let r = answer(&behind(5, 5), &fresh(r#"{"min_revision":{"nothing":1}}"#).unwrap(), 100_000, &two_buckets);
        assert_eq!(r.code, Code::BadRequest);
        assert!(json(&r)["error"]["message"].as_str().unwrap().contains("field `min_revision`: nothing is neither"), "{:?}", json(&r));
    }

    #[test]
    fn a_consistent_answer_asks_the_bus_for_each_bucket_read() {
        let host = behind(9, 9);
        let r = answer(&host, &fresh(r#"{"consistent":true}"#).unwrap(), 100_000, &two_buckets);
        assert_eq!(r.code, Code::Ok);
        let asked = host.asked.borrow();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0], vec![Mark { name: "b1".into(), revision: None }, Mark { name: "b2".into(), revision: None }]);
        // A mirror behind the bus past the wait: not current, naming the bucket.
        let late = behind(3, 9);
        let r = answer(&late, &fresh(r#"{"consistent":true}"#).unwrap(), 100_000, &two_buckets);
        assert_eq!(r.code, Code::NotCurrent);
        assert_eq!(json(&r)["error"]["name"], "b1");
    }

    #[test]
    fn keeps_room_for_many_revisions_or_says_they_do_not_fit() {
        let many = |env: &dyn Env, budget: usize| {
            for i in 0..60 {
                env.exists(&format!("bucket-with-a-long-name-{i:02}")).unwrap();
            }
            Reply { code: Code::Ok, body: format!("{{\"budget\":{budget}}}").into_bytes(), revision: None }
        };
        let r = answer(&behind(1, 1), &Fresh::default(), 100_000, &many);
        let v = json(&r);
        assert_eq!(v["revisions"].as_object().unwrap().len(), 60);
        assert!(r.body.len() <= 100_000);
        assert!(v["budget"].as_u64().unwrap() < 100_000 - REVISIONS_ROOM as u64, "answered again with more room: {v}");
        let tight = answer(&behind(1, 1), &Fresh::default(), MIN_REPLY as usize + 100, &many);
        assert_eq!(tight.code, Code::Internal);
        assert!(json(&tight)["error"]["message"].as_str().unwrap().contains("revisions of the 60 buckets read"));
    }
}
