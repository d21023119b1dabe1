//! Serving the verbs as a NATS micro service (the `io.nats.micro.v1` protocol: the endpoint in
//! queue group `q`, and `$SRV.PING|INFO|STATS` for every instance).
//!
//! The protocol is spoken here rather than through async-nats' `service` because INFO must
//! follow the component as it is swapped (digest, version, last refusal), and restarting a
//! `service::Service` to change its metadata unsubscribes the endpoint, dropping requests in
//! flight. Subscriptions here live as long as the server does. Each request is answered by the
//! current guest; the host only maps the guest's reply code to the micro-service error headers
//! (`400`, `503`, `500`) and keeps the body, which for errors is `{"error":{"code","message"}}`.
//!
//! A reply goes only to an inbox ([`is_inbox`]: `_INBOX` or `_INBOX_<user>`). nats-server lets
//! a responder publish on whatever reply subject a request names, whatever its publish
//! permissions say, so a request whose reply subject is `$KV.mesh-provisioner_seat.holder` or
//! another node's notice subject would otherwise make this server write there. Such a request
//! is answered by nobody, counted (`$SRV.STATS` `data.refused_replies`, the metric
//! `mesh_provisioner_refused_replies_total`) and logged once per requester.

use crate::base::sync::Locked;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_nats::{Client, HeaderMap, Message};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::wire::{rfc3339, ENDPOINTS, ERROR_CODE_HEADER, ERROR_HEADER, PROVISIONING, QUEUE_GROUP, SCHEMA_ID, SERVICE_NAME};
use crate::nats::seat::Seat;
use crate::runtime::current::Current;
use crate::runtime::{Limits, ReplyCode};
use crate::store::backend::Backend;

/// Room left in a message for headers and framing.
const HEADROOM: usize = 1024;

#[derive(Default)]
struct Stats {
    requests: u64,
    errors: u64,
    last_error: String,
    processing: Duration,
    /// Requests shed with `503 overloaded` (also counted as requests and errors).
    overloaded: u64,
    /// Requests not answered because their reply subject is not an inbox.
    refused_replies: u64,
}

/// Most requesters whose refused reply subjects are logged; past them refusals are counted only.
const REFUSALS_LOGGED: usize = 1024;

/// Whether a reply may go to `subject`: an inbox (first token `_INBOX` or `_INBOX_<…>`), a
/// subject with no wildcard (`mirror::check_subject`). Nothing the provisioner publishes on
/// otherwise starts so.
pub fn is_inbox(subject: &str) -> bool {
    let first = subject.split('.').next().unwrap_or_default();
    // `_R_.…`: the server's own mapping of a reply across accounts (a node's leaf account
    // asking through its import); its tokens are the server's, unguessable by a requester.
    let inbox = first == "_INBOX" || (first == "_R_" && subject.len() > "_R_.".len()) || (first.starts_with("_INBOX_") && first.len() > "_INBOX_".len());
    inbox && crate::base::wire::check_subject(subject, false).is_ok()
}

/// Who a refused reply subject points at, for logging once per requester: the subject without
/// its last token (a requester's own unique ids vary there).
fn requester_of(subject: &str) -> &str {
    subject.rsplit_once('.').map_or(subject, |(head, _)| head)
}

/// One instance of the micro service.
pub struct Micro {
    id: String,
    started: String,
    current: Arc<Current>,
    seat: Option<Arc<Seat>>,
    backend: Arc<dyn Backend>,
    /// The mirrors' audits and repairs.
    audits: Arc<crate::serve::audit::Counts>,
    /// Per endpoint, in [`ENDPOINTS`] order.
    stats: Mutex<[Stats; 2]>,
    /// Refused reply subjects already logged (by requester), and refusals of the `$SRV`
    /// subjects.
    refusals: Mutex<(std::collections::HashSet<String>, u64)>,
}

impl Micro {
    pub fn new(current: Arc<Current>, seat: Option<Arc<Seat>>, backend: Arc<dyn Backend>, audits: Arc<crate::serve::audit::Counts>) -> Result<Arc<Self>> {
        let id = crate::base::random::random_password()?.chars().take(22).collect();
        Ok(Arc::new(Micro { id, started: rfc3339(SystemTime::now()), current, seat, backend, audits, stats: Mutex::default(), refusals: Mutex::default() }))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Which component serves, and the last refused one.
    fn metadata(&self) -> Value {
        let loaded = self.current.get();
        let (refusals, last) = self.current.refusals();
        let mut m = json!({
            "component_digest": loaded.guest.digest(),
            "component_version": loaded.info.version,
            "component_name": loaded.info.name,
            "wit": loaded.info.wit_version,
            "swaps": self.current.swaps().to_string(),
            "refusals": refusals.to_string(),
            "mirrors": self.backend.mirrored().to_string(),
        });
        if let Some(seat) = &self.seat {
            m["instance"] = json!(seat.instance());
        }
        if let Some(r) = last {
            m["last_refusal_digest"] = json!(r.digest);
            m["last_refusal"] = json!(r.reason.chars().take(512).collect::<String>());
        }
        m
    }

    fn head(&self, kind: &str) -> Value {
        json!({
            "type": format!("io.nats.micro.v1.{kind}_response"),
            "name": SERVICE_NAME,
            "id": self.id,
            "version": env!("CARGO_PKG_VERSION"),
            "metadata": self.metadata(),
        })
    }

    fn ping(&self) -> Value {
        self.head("ping")
    }

    fn info(&self) -> Value {
        let mut v = self.head("info");
        v["description"] = json!("mesh-provisioner: the registry of placeholder kinds and what the nodes need, applied and collected");
        v["endpoints"] = ENDPOINTS
            .iter()
            .map(|(name, subject)| {
                let metadata = json!({
                    "request_schema": format!("{SCHEMA_ID}{name}.request"),
                    "response_schema": format!("{SCHEMA_ID}{name}.reply"),
                    "error_schema": format!("{SCHEMA_ID}error"),
                });
                json!({ "name": name, "subject": subject, "queue_group": QUEUE_GROUP, "metadata": metadata })
            })
            .collect();
        v
    }

    fn stats(&self) -> Value {
        let all = self.stats.locked();
        let mut v = self.head("stats");
        v["started"] = json!(self.started);
        // Per bucket: how often its mirror was compared with the bucket, and rebuilt.
        let (mut audits, mut repairs) = (serde_json::Map::new(), serde_json::Map::new());
        for (bucket, (a, r)) in self.audits.snapshot() {
            audits.insert(bucket.clone(), json!(a));
            repairs.insert(bucket, json!(r));
        }
        let (audits, repairs) = (Value::Object(audits), Value::Object(repairs));
        let srv_refused = self.refusals.locked().1;
        v["endpoints"] = ENDPOINTS
            .iter()
            .zip(all.iter())
            .map(|((name, subject), s)| {
                let average = (s.processing.as_nanos() as u64).checked_div(s.requests).unwrap_or(0);
                json!({
                    "name": name, "subject": subject, "queue_group": QUEUE_GROUP,
                    "num_requests": s.requests, "num_errors": s.errors, "last_error": s.last_error,
                    "processing_time": s.processing.as_nanos() as u64, "average_processing_time": average,
                    "data": {
                        "overloaded": s.overloaded, "refused_replies": s.refused_replies, "srv_refused_replies": srv_refused,
                        "mirror_audits": audits, "mirror_repairs": repairs,
                    },
                })
            })
            .collect();
        v
    }

    /// Whether a reply may go to `reply`; when not, the refusal is counted (per endpoint, or
    /// for the `$SRV` subjects with `endpoint` none) and logged once per requester.
    fn may_reply(&self, endpoint: Option<usize>, reply: &str) -> bool {
        if is_inbox(reply) {
            return true;
        }
        let name = endpoint.and_then(|e| ENDPOINTS.get(e)).map_or("$SRV", |e| e.0);
        crate::base::metrics::metrics().refused_reply(name);
        if let Some(e) = endpoint {
            let mut all = self.stats.locked();
            if let Some(s) = all.get_mut(e) {
                s.refused_replies += 1;
            }
        }
        let requester = requester_of(reply);
        let mut logged = self.refusals.locked();
        if endpoint.is_none() {
            logged.1 += 1;
        }
        if logged.0.len() < REFUSALS_LOGGED && logged.0.insert(requester.to_string()) {
            let shown: String = reply.chars().take(256).collect();
            tracing::warn!(
                endpoint = name,
                reply = shown,
                "a request asked for its reply on a subject that is not an inbox: not answered (further ones from {requester:?} are counted, not logged)"
            );
        }
        false
    }

    fn count_overloaded(&self, endpoint: usize) {
        let mut all = self.stats.locked();
        if let Some(s) = all.get_mut(endpoint) {
            s.overloaded += 1;
        }
    }

    /// Counts a request; a failed one as its metric code (`overloaded`, `bad_request`, …) and
    /// its `$SRV.STATS` error text (`503:overloaded`, …).
    fn count(&self, endpoint: usize, took: Duration, error: Option<(&'static str, String)>) {
        let name = ENDPOINTS.get(endpoint).map_or("unknown", |e| e.0);
        crate::base::metrics::metrics().request(name, took, error.as_ref().map(|e| e.0));
        let mut all = self.stats.locked();
        let Some(s) = all.get_mut(endpoint) else { return };
        s.requests += 1;
        s.processing += took;
        if let Some((_, e)) = error {
            s.errors += 1;
            s.last_error = e;
        }
    }
}

/// What serving stands on.
pub struct Serving {
    /// Its `service` connection serves; its seat's term each reply is checked against.
    pub shared: crate::serve::shared::Shared,
    /// Requests answered at once; one more is shed with `503 overloaded`.
    pub max_in_flight: usize,
    /// The mirrors' audits, for `$SRV.STATS`.
    pub audits: Arc<crate::serve::audit::Counts>,
}

/// Serves until `shutdown` resolves: the endpoint and the `$SRV` subjects, on subscriptions
/// that outlive any swap of the component.
pub async fn serve(serving: Serving, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let Serving { shared, max_in_flight, audits } = serving;
    let crate::serve::shared::Shared { service: client, backend, current, seat, limits, .. } = shared;
    let seat = Some(seat);
    let max_in_flight = max_in_flight.max(1);
    let micro = Micro::new(current.clone(), seat, backend.clone(), audits)?;
    let sub_err = |e: async_nats::SubscribeError| Error::new(ErrorKind::Unavailable, format!("subscribing: {e}"));
    let mut endpoints = Vec::new();
    for (i, (_, subject)) in ENDPOINTS.iter().enumerate() {
        let s = client.queue_subscribe(*subject, QUEUE_GROUP.into()).await.map_err(sub_err)?;
        endpoints.push(s.map(move |m| (i, m)));
    }
    let mut endpoint = futures::stream::select_all(endpoints);
    let mut control = Vec::new();
    for verb in ["PING", "INFO", "STATS"] {
        for subject in [format!("$SRV.{verb}"), format!("$SRV.{verb}.{SERVICE_NAME}"), format!("$SRV.{verb}.{SERVICE_NAME}.{}", micro.id)] {
            control.push(client.subscribe(subject).await.map_err(sub_err)?.map(move |m| (verb, m)));
        }
    }
    let mut control = futures::stream::select_all(control);
    crate::nats::bucket::bounded(|| "flushing subscriptions".to_string(), async {
        client.flush().await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("flushing subscriptions: {e}")))
    })
    .await?;
    let max_reply = client.server_info().max_payload.saturating_sub(HEADROOM).max(4096) as u32;
    tracing::info!(subjects = ?ENDPOINTS.map(|e| e.1), id = micro.id, max_reply, "serving");
    // The bounded backlog: requests in flight. One more is shed at once rather than queued, so
    // a flood costs a fast `503` each and never memory without bound, and whatever else runs on
    // this thread (the seat's renewals) keeps getting its turn.
    let slots = Arc::new(Semaphore::new(max_in_flight));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            request = endpoint.next() => {
                let Some((which, request)) = request else { break };
                // Before any work: a request that wants its answer anywhere but an inbox gets
                // none, and costs no slot.
                match &request.reply {
                    Some(reply) if micro.may_reply(Some(which), reply) => {}
                    _ => continue,
                }
                let permit = match slots.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(tokio::sync::TryAcquireError::NoPermits) => {
                        shed(&client, which, request, &micro, max_in_flight).await;
                        continue;
                    }
                    Err(tokio::sync::TryAcquireError::Closed) => break,
                };
                let (client, backend, micro) = (client.clone(), backend.clone(), micro.clone());
                tokio::spawn(async move {
                    answer(&client, which, request, backend, &micro, limits, max_reply).await;
                    drop(permit);
                });
            }
            Some((verb, m)) = control.next() => {
                let body = match verb {
                    "PING" => micro.ping(),
                    "INFO" => micro.info(),
                    _ => micro.stats(),
                };
                if let Some(reply) = m.reply {
                    if micro.may_reply(None, &reply) {
                        let _ = client.publish(reply, body.to_string().into()).await;
                    }
                }
            }
            _ = &mut shutdown => break,
        }
    }
    // Answer what was already delivered before going.
    for s in endpoint.iter_mut() {
        let _ = s.get_mut().unsubscribe().await;
    }
    let _ = slots.acquire_many(max_in_flight as u32).await;
    Ok(())
}

/// Answers a request that found every slot taken: `503` with code `overloaded`, at once.
async fn shed(client: &Client, which: usize, request: Message, micro: &Micro, max_in_flight: usize) {
    let started = Instant::now();
    micro.count_overloaded(which);
    let Some(reply_to) = request.reply else { return };
    let body = error_body("overloaded", &format!("{max_in_flight} requests are in flight already; retry shortly"));
    let sent = send(client, reply_to, ReplyCode::Unavailable, body).await;
    micro.count(which, started.elapsed(), Some(("overloaded", "503:overloaded".into())));
    if let Err(e) = sent {
        tracing::debug!("could not send an overloaded reply: {e}");
    }
}

/// Sends a reply: the body alone when ok, else with the micro-service error headers.
async fn send(client: &Client, reply_to: async_nats::Subject, code: ReplyCode, body: bytes::Bytes) -> std::result::Result<(), async_nats::PublishError> {
    match code {
        ReplyCode::Ok => client.publish(reply_to, body).await,
        other => {
            let mut headers = HeaderMap::new();
            let (status, number, _) = status_of(other);
            headers.insert(ERROR_HEADER, status);
            headers.insert(ERROR_CODE_HEADER, number.to_string().as_str());
            client.publish_with_headers(reply_to, headers, body).await
        }
    }
}

/// The micro-service status and number of a reply code that is not ok, and its metric code.
fn status_of(code: ReplyCode) -> (&'static str, u16, &'static str) {
    match code {
        ReplyCode::BadRequest => ("bad request", 400, "bad_request"),
        ReplyCode::Unavailable => ("unavailable", 503, "unavailable"),
        ReplyCode::NotCurrent => ("not current", 503, "not_current"),
        _ => ("internal error", 500, "internal"),
    }
}

async fn answer(client: &Client, which: usize, request: Message, backend: Arc<dyn Backend>, micro: &Micro, limits: Limits, max_reply: u32) {
    let verb = ENDPOINTS.get(which).map(|e| e.1).unwrap_or(PROVISIONING);
    let started = Instant::now();
    let Some(reply_to) = request.reply.clone() else { return };
    let loaded = micro.current.get();
    // The term of the lease as the call starts; none without a seat (tests, tools).
    let term = micro.seat.as_ref().map(|s| s.term());
    let holding = !matches!(term, Some(None));
    let (code, body) = if !holding {
        // Between losing the seat and unsubscribing: say so rather than answer as the holder.
        (ReplyCode::Unavailable, error_body("unavailable", "this instance no longer holds the seat; retry"))
    } else {
        match loaded.guest.handle(backend, limits, verb, &request.payload, max_reply).await {
            Ok(reply) => (reply.code, reply.body),
            Err(e) => {
                tracing::warn!("guest failed a request: {e}");
                (ReplyCode::Internal, error_body("internal", e.message()))
            }
        }
    };
    // The seat is checked again as the reply goes out: a holder that lost its lease while the
    // guest ran (paused, cut off), even one that took it back since, must not answer as the
    // holder of the term it started in.
    let lost = micro.seat.as_ref().is_some_and(|s| Some(s.term()) != term);
    let (code, body) = if code == ReplyCode::Ok && lost {
        (ReplyCode::Unavailable, error_body("unavailable", "this instance lost the seat while answering; retry"))
    } else {
        (code, body)
    };
    let error = (code != ReplyCode::Ok).then(|| {
        let (status, number, metric) = status_of(code);
        (metric, format!("{number}:{status}"))
    });
    let sent = send(client, reply_to, code, body).await;
    micro.count(which, started.elapsed(), error);
    if let Err(e) = sent {
        tracing::warn!("could not send a reply: {e}");
    }
}

/// The error body of the SPEC, for failures the guest could not answer itself.
pub fn error_body(code: &str, message: &str) -> bytes::Bytes {
    json!({"error": {"code": code, "message": message}}).to_string().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_only_to_an_inbox() {
        for ok in ["_INBOX.abc.1", "_INBOX_node-alpha.x.y", "_INBOX_mesh-provisioner.Zz9", "_R_.ab12.Cd34"] {
            assert!(is_inbox(ok), "{ok}");
        }
        for refused in [
            "$KV.mesh-provisioner_seat.holder",
            "$KV.mesh-provisioner_registry.config",
            "mesh-provisioner.notice.beta",
            "mesh-provisioner.provisioning",
            "$SRV.PING",
            "$JS.API.STREAM.DELETE.KV_mesh-provisioner_needs",
            "_INBOX_",
            "_R_",
            "_R_.",
            "_R_X.a",
            "_INBOXX.a",
            "_INBOX.>",
            "_INBOX.*.a",
            "_INBOX..a",
            "x._INBOX.a",
            "",
        ] {
            assert!(!is_inbox(refused), "{refused}");
        }
        assert!(!is_inbox(&format!("_INBOX.{}", "a".repeat(crate::base::wire::MAX_SUBJECT))));
    }

    #[test]
    fn names_a_requester_by_its_reply_subject_without_the_last_token() {
        assert_eq!(requester_of("$KV.mesh-provisioner_seat.holder"), "$KV.mesh-provisioner_seat");
        assert_eq!(requester_of("single"), "single");
    }

    #[test]
    fn writes_rfc3339_dates() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000)), "2026-11-30T00:53:20Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
    }
}
