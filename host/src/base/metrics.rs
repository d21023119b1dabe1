//! The process's Prometheus metrics, kept with `prometheus-client` and written in its text
//! format at `/metrics` (see `http`).
//!
//! Counters and histograms are bumped where things happen (a request answered, a guest call,
//! an instance made, a swap, a seat change; the per-request ones only once the HTTP side runs,
//! since without it nothing reads them); gauges that describe state (mirrors, module states,
//! the seat's role) are set when a scrape asks, from what the process already holds. Names follow
//! Prometheus conventions: `mesh_provisioner_` prefix, base units, `_total` on counters (added by
//! the encoder). Nothing here reads a key or a value: labels are endpoint, error code, export,
//! bucket name and state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Endpoint {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointError {
    pub endpoint: String,
    /// `bad_request`, `unavailable`, `internal` or `overloaded`.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Export {
    pub export: String,
}

/// A label value that may hold what another party wrote (a bucket's or a stream's name, a
/// key's first token): written as the text format requires (`\\`, `\"` and `\n` escaped;
/// prometheus-client writes a value as it is, so one `"` made the whole page unreadable) and
/// [`visible`](crate::base::visible::visible) for whoever reads the page.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Label(pub String);

impl<T: Into<String>> From<T> for Label {
    fn from(s: T) -> Label {
        Label(s.into())
    }
}

impl prometheus_client::encoding::EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        for c in crate::base::visible::visible(&self.0).chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Bucket {
    pub bucket: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BucketWriter {
    pub bucket: Label,
    /// A key's first token: a node, in the node clients' buckets.
    pub writer: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Connection {
    /// `buckets`, `seat` or `serving`.
    pub connection: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabel {
    pub stream: Label,
    pub subject: Label,
}

/// What a kept reply read that changed since (a bucket's mirror, `kept plans`, `discovery`,
/// `once`, `backend`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Stale {
    pub read: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

type Seconds = Family<Endpoint, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 50 µs to about 1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    /// Per-request recording (the hot path) is on only when something reads it (`--http`).
    recording: AtomicBool,
    pub requests: Family<Endpoint, Counter>,
    pub errors: Family<EndpointError, Counter>,
    pub request_seconds: Seconds,
    pub guest_call_seconds: Family<Export, Histogram, fn() -> Histogram>,
    pub instances: Counter,
    /// Calls waiting now for the mirrors to reach a revision a request asked for.
    pub reach_waiting: Gauge,
    /// Waits for the mirrors that ended, by outcome (`reached`, `not_reached`, `not_waited`).
    pub reach_waits: Family<Outcome, Counter>,
    pub swaps: Counter,
    pub refusals: Counter,
    pub seat_holder: Gauge,
    pub seat_transitions: Counter,
    pub seat_renewals_failed: Counter,
    pub mirror_keys: Family<Bucket, Gauge>,
    pub mirror_bytes: Family<Bucket, Gauge>,
    pub mirror_lag: Family<Bucket, Gauge>,
    pub mirror_in_sync: Family<Bucket, Gauge>,
    pub mirror_audits: Family<Bucket, Counter>,
    pub mirror_repairs: Family<Bucket, Counter>,
    pub modules: Family<StateLabel, Gauge>,
    pub modules_oldest: Family<StateLabel, Gauge>,
    pub plans_computed: Family<StateLabel, Counter>,
    pub plans_refreshed: Counter,
    pub reply_cache: Family<Outcome, Counter>,
    pub reply_cache_stale: Family<Stale, Counter>,
    pub reply_cache_carried: Counter,
    pub scrape_seconds: Gauge<f64, AtomicU64>,
    pub refused_replies: Family<Endpoint, Counter>,
    pub bucket_refused: Family<Bucket, Gauge>,
    pub bucket_unsafe: Family<Bucket, Gauge>,
    pub writer_keys: Family<BucketWriter, Gauge>,
    pub writer_bytes: Family<BucketWriter, Gauge>,
    pub stream_captures: Family<StreamLabel, Gauge>,
    pub mirrors_bytes: Gauge,
    pub mirrors_budget: Gauge,
    pub guest_memory: Gauge,
    pub guest_memory_budget: Gauge,
    pub state_events: Family<StateLabel, Counter>,
    pub state_records: Counter,
    pub state_conflicts: Counter,
    pub state_sweeps: Counter,
    pub state_sweeps_skipped: Counter,
    pub bus_disconnects: Family<Connection, Counter>,
    /// HTTP connections closed at once: past the cap and the probes' reserve.
    pub http_refused: Counter,
    pub state_dir_bytes: Gauge,
    pub kept_plans: Gauge,
    pub status_nodes_cut: Gauge,
}

/// The process's metrics, made on first use.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("mesh_provisioner");
        let m = Metrics {
            requests: Family::default(),
            errors: Family::default(),
            request_seconds: Family::new_with_constructor(latency),
            guest_call_seconds: Family::new_with_constructor(latency),
            instances: Counter::default(),
            reach_waiting: Gauge::default(),
            reach_waits: Family::default(),
            swaps: Counter::default(),
            refusals: Counter::default(),
            seat_holder: Gauge::default(),
            seat_transitions: Counter::default(),
            seat_renewals_failed: Counter::default(),
            mirror_keys: Family::default(),
            mirror_bytes: Family::default(),
            mirror_lag: Family::default(),
            mirror_in_sync: Family::default(),
            mirror_audits: Family::default(),
            mirror_repairs: Family::default(),
            modules: Family::default(),
            modules_oldest: Family::default(),
            plans_computed: Family::default(),
            plans_refreshed: Counter::default(),
            reply_cache: Family::default(),
            reply_cache_stale: Family::default(),
            reply_cache_carried: Counter::default(),
            scrape_seconds: Gauge::default(),
            refused_replies: Family::default(),
            bucket_refused: Family::default(),
            bucket_unsafe: Family::default(),
            writer_keys: Family::default(),
            writer_bytes: Family::default(),
            stream_captures: Family::default(),
            mirrors_bytes: Gauge::default(),
            mirrors_budget: Gauge::default(),
            guest_memory: Gauge::default(),
            guest_memory_budget: Gauge::default(),
            state_events: Family::default(),
            state_records: Counter::default(),
            state_conflicts: Counter::default(),
            state_sweeps: Counter::default(),
            state_sweeps_skipped: Counter::default(),
            bus_disconnects: Family::default(),
            http_refused: Counter::default(),
            state_dir_bytes: Gauge::default(),
            kept_plans: Gauge::default(),
            status_nodes_cut: Gauge::default(),
            registry: Registry::default(),
            recording: AtomicBool::new(false),
        };
        registry.register("requests", "Verb requests received, by endpoint", m.requests.clone());
        registry.register("request_errors", "Verb requests answered with an error, by endpoint and code", m.errors.clone());
        registry.register("request_duration_seconds", "Time from a verb request's receipt to its reply sent", m.request_seconds.clone());
        registry.register("guest_call_duration_seconds", "Time of one call into the guest component, by export", m.guest_call_seconds.clone());
        registry.register("guest_instances_created", "Guest instances made (each call reuses a kept one when it can)", m.instances.clone());
        registry.register(
            "reach_waiting",
            "Calls waiting now for the mirrors to reach a revision a request asked for (min_revision, consistent)",
            m.reach_waiting.clone(),
        );
        registry.register(
            "reach_waits",
            "Waits for the mirrors, by outcome: reached, not_reached, not_waited (every permit to wait was taken)",
            m.reach_waits.clone(),
        );
        registry.register("component_swaps", "Components hot-replaced in", m.swaps.clone());
        registry.register("component_refusals", "Components refused on upgrade (the running one kept serving)", m.refusals.clone());
        registry.register("seat_holder", "1 while this instance holds the seat, 0 while it stands by", m.seat_holder.clone());
        registry.register("seat_transitions", "Times this instance took or lost the seat", m.seat_transitions.clone());
        registry.register(
            "seat_renewals_failed",
            "Renewals of the seat's lease that failed while it still held (each tried again until the lease runs out)",
            m.seat_renewals_failed.clone(),
        );
        registry.register("mirror_keys", "Keys held by the mirror of a bucket", m.mirror_keys.clone());
        registry.register("mirror_bytes", "Bytes of keys and values held by the mirror of a bucket", m.mirror_bytes.clone());
        registry.register("mirror_lag_messages", "Messages the bucket held past the last one its mirror applied", m.mirror_lag.clone());
        registry.register("mirror_in_sync", "1 when the mirror of a bucket has replayed its history", m.mirror_in_sync.clone());
        registry.register("mirror_audits", "Audits of a bucket's mirror against its stream", m.mirror_audits.clone());
        registry.register("mirror_repairs", "Mirrors rebuilt because an audit found them different from their bucket", m.mirror_repairs.clone());
        registry.register("modules", "Modules by status state (applied, pending, degraded, failed, …), as of the last scrape", m.modules.clone());
        registry.register("module_state_oldest_seconds", "Seconds the longest-held module of each state has been in it (its state record's since), as of the last scrape; a state no module has recorded is absent", m.modules_oldest.clone());
        registry.register("plans_computed", "Plans computed by plan refreshes, by the state they came to (planned, held, waiting)", m.plans_computed.clone());
        registry.register("plan_refreshes", "Plan refreshes made (each a guest call over a batch of changes)", m.plans_refreshed.clone());
        registry.register(
            "reply_cache_lookups",
            "Verb requests looked up in the reply cache, by outcome (hit: the guest was not called)",
            m.reply_cache.clone(),
        );
        registry.register(
            "reply_cache_carried",
            "Kept replies served again after writes to a bucket they read that touched none of the keys they read (their revision rewritten to the bucket's)",
            m.reply_cache_carried.clone(),
        );
        registry.register("reply_cache_stale", "Replies not served from the reply cache, by why: the first thing a kept reply read that changed since (a bucket, kept plans, discovery, once, backend), or why one was not kept", m.reply_cache_stale.clone());
        registry.register("scrape_state_seconds", "Time the last scrape took to read the state it reports", m.scrape_seconds.clone());
        registry.register(
            "refused_replies",
            "Requests not answered because their reply subject is not an inbox, by endpoint ($SRV: discovery)",
            m.refused_replies.clone(),
        );
        registry.register(
            "bucket_refused",
            "1 while a bucket is not read: its stream is not a bucket, or its mirror would pass the memory budget",
            m.bucket_refused.clone(),
        );
        registry.register(
            "bucket_unsafe_settings",
            "Settings of a bucket's stream that let one writer remove or crowd out another's keys (roll-ups, no byte or value-size limit)",
            m.bucket_unsafe.clone(),
        );
        registry.register("writer_over_quota_keys", "Keys held by a writer (a node) of a node clients' bucket past its quota", m.writer_keys.clone());
        registry.register("writer_over_quota_bytes", "Bytes held by a writer (a node) of a node clients' bucket past its quota", m.writer_bytes.clone());
        registry.register("stream_captures", "1 for each stream that captures a subject the provisioner answers or publishes on", m.stream_captures.clone());
        registry.register("mirrors_memory_bytes", "Bytes of keys and values all mirrors hold", m.mirrors_bytes.clone());
        registry.register("mirrors_memory_budget_bytes", "The mirrors' memory budget (0: none)", m.mirrors_budget.clone());
        registry.register("guest_memory_bytes", "Linear memory all guest instances hold (kept for reuse and in flight)", m.guest_memory.clone());
        registry.register("guest_memory_budget_bytes", "The guests' memory budget (--guest-memory-total)", m.guest_memory_budget.clone());
        registry.register("state_events", "Module state changes published on mesh-provisioner.event.<node>, by the state entered", m.state_events.clone());
        registry.register("state_records", "Module state records written (a change, or a module first seen)", m.state_records.clone());
        registry.register("state_record_conflicts", "State records whose compare-and-set lost (found again, nothing published)", m.state_conflicts.clone());
        registry.register(
            "state_sweeps",
            "Sweeps of every module's state begun (at the seat's taking, a replay, and periodically for discovery)",
            m.state_sweeps.clone(),
        );
        registry.register(
            "state_sweeps_skipped",
            "Periodic sweeps not begun: no discovery answer moved since the last one (--state-sweep-every)",
            m.state_sweeps_skipped.clone(),
        );
        registry.register("bus_disconnects", "Times a connection to the bus was lost, by connection (buckets, seat, serving)", m.bus_disconnects.clone());
        registry.register(
            "http_connections_refused",
            "HTTP connections closed at once, past the connection cap and the probes' reserve",
            m.http_refused.clone(),
        );
        registry.register(
            "state_dir_bytes",
            "Bytes of the files in the state directory (kept plans, snapshots, components), as of the last prune round",
            m.state_dir_bytes.clone(),
        );
        registry.register("kept_plans", "Plans kept in the state directory, as of the last prune round", m.kept_plans.clone());
        registry.register(
            "status_nodes_cut",
            "Nodes with more modules than the status page and the module metrics show of one node (the first 10 000 are)",
            m.status_nodes_cut.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Turns per-request recording on (the HTTP side does, when it starts).
    pub fn record(&self) {
        self.recording.store(true, Ordering::Relaxed);
    }

    /// Counts one verb request: its time, and its error code if it failed.
    pub fn request(&self, endpoint: &str, took: Duration, error: Option<&str>) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        let label = Endpoint { endpoint: endpoint.to_string() };
        self.requests.get_or_create(&label).inc();
        self.request_seconds.get_or_create(&label).observe(took.as_secs_f64());
        if let Some(code) = error {
            self.errors.get_or_create(&EndpointError { endpoint: endpoint.to_string(), code: code.to_string() }).inc();
        }
    }

    /// Counts one request not answered because its reply subject is not an inbox (always:
    /// an attack is worth counting whether or not the HTTP side runs).
    pub fn refused_reply(&self, endpoint: &str) {
        self.refused_replies.get_or_create(&Endpoint { endpoint: endpoint.to_string() }).inc();
    }

    /// Counts one loss of a connection to the bus (always: it is what an operator alerts on).
    pub fn bus_disconnect(&self, connection: &str) {
        self.bus_disconnects.get_or_create(&Connection { connection: connection.to_string() }).inc();
    }

    /// Counts one lookup of the reply cache.
    pub fn reply_cache(&self, hit: bool) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        self.reply_cache.get_or_create(&Outcome { outcome: if hit { "hit" } else { "miss" }.into() }).inc();
    }

    /// Counts a kept reply found stale because `read` changed.
    pub fn reply_cache_stale(&self, read: &str) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        self.reply_cache_stale.get_or_create(&Stale { read: read.to_string() }).inc();
    }

    /// Counts a kept reply served past writes elsewhere in a bucket it read.
    pub fn reply_cache_carried(&self) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        self.reply_cache_carried.inc();
    }

    /// Times one call into the guest.
    pub fn guest_call(&self, export: &str, took: Duration) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        self.guest_call_seconds.get_or_create(&Export { export: export.to_string() }).observe(took.as_secs_f64());
    }

    /// The text format, for a scrape.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = metrics();
        m.record();
        m.request("provisioning", Duration::from_micros(120), Some("overloaded"));
        m.guest_call("handle", Duration::from_micros(40));
        let text = m.encode();
        for line in [
            "mesh_provisioner_requests_total{endpoint=\"provisioning\"}",
            "mesh_provisioner_request_errors_total{endpoint=\"provisioning\",code=\"overloaded\"}",
            "mesh_provisioner_request_duration_seconds_bucket{le=",
            "mesh_provisioner_guest_call_duration_seconds_count{export=\"handle\"}",
            "# TYPE mesh_provisioner_seat_holder gauge",
            "# TYPE mesh_provisioner_guest_instances_created counter",
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
    }
}
