//! The mesh's buckets and making them: what `bootstrap` makes before anything is installed (and
//! `serve --demo` on its embedded bus), with
//! the settings that keep each user inside its grant (`bucket::Spec`: subjects exactly
//! `$KV.<bucket>.>`, roll-ups and API deletes refused, a byte and a value-size limit). Node
//! users, providers and the domains are granted no `STREAM.CREATE`, so no stream is made by
//! anyone else.
//!
//! Which buckets: the provisioner's own (registry, seat, the node clients' three) and every
//! bucket the component names as a plan or notice input — the component owns those names; a
//! `*` in one is filled with each node for the per-node buckets the plans read (compositions),
//! with each provider for the others (`<provider>_bound`). A bucket that exists is made safe in
//! place (an update of its stream); a stream of a bucket's name that is not a bucket is refused
//! and left alone (the operator deletes it).
//!
//! The buckets every node writes (needs, applied, collect) are made of the nodes' shares
//! (`bucket::Share`): a stream a node, `NODE_<node>`, and each bucket sourcing all of them. A
//! node named anew gets its stream and is added to each bucket's sources; one of those buckets
//! made before as one stream gives up its subjects (its keys stay) and sources the shares.

use std::sync::Arc;

use async_nats::jetstream;
use clap::Args;

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::bucket::{create_stream_as, named_stream_info, node_config, node_stream, shape, stream_info, BucketLimits, Shape, Share, Spec};
use crate::runtime::Guest;
use crate::store::backend::MemoryBackend;

/// Every bucket to make, with its settings.
#[derive(Debug, Clone)]
pub struct Plan {
    pub buckets: Vec<Spec>,
    /// The nodes whose shares make the buckets every node writes (none: each is made as one
    /// stream, as `serve` makes it).
    pub nodes: Vec<String>,
    pub share: Share,
}

impl Plan {
    /// The buckets of a mesh of `nodes` and `providers`, as `guest` names them.
    pub async fn of(
        guest: &Guest,
        nodes: &[impl AsRef<str>],
        providers: &[impl AsRef<str>],
        flags: BucketFlags,
        limits: crate::runtime::Limits,
    ) -> Result<Plan> {
        for name in nodes.iter().map(AsRef::as_ref).chain(providers.iter().map(AsRef::as_ref)) {
            if !plain_token(name) {
                return Err(Error::new(ErrorKind::Config, format!("{name:?} is not a node or provider name (letters, digits, - and _, at most {MAX_NAME})")));
            }
        }
        let backend: Arc<dyn crate::store::backend::Backend> = MemoryBackend::new();
        let plan_inputs = guest.plan_inputs(backend.clone(), limits).await?;
        let notice_inputs = guest.notice_inputs(backend, limits).await?;
        let options = crate::nats::BackendOptions { replicas: flags.replicas as usize, limits: flags.limits(), ..Default::default() };
        let mut buckets = crate::nats::owned_buckets(&options);
        buckets.push(crate::nats::seat::seat_bucket(crate::nats::seat::DEFAULT_TTL, options.replicas));
        let per_node = BucketLimits { max_value: BucketLimits::COMPOSITION_MAX_VALUE.max(options.limits.max_value), ..options.limits };
        let mut add = |name: String, limits: BucketLimits| {
            if !buckets.iter().any(|b| b.bucket == name) {
                buckets.push(Spec::new(&name, "made by mesh-provisioner bootstrap", 1, options.replicas, limits));
            }
        };
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let providers: Vec<&str> = providers.iter().map(AsRef::as_ref).collect();
        for (patterns, fills, filled_limits) in [(&plan_inputs, &nodes, per_node), (&notice_inputs, &providers, options.limits)] {
            for pattern in patterns {
                match pattern.split_once('*') {
                    Some((head, tail)) => fills.iter().for_each(|f| add(format!("{head}{f}{tail}"), filled_limits)),
                    None => add(pattern.clone(), options.limits),
                }
            }
        }
        Ok(Plan { buckets, nodes: nodes.iter().map(|n| n.to_string()).collect(), share: flags.share() })
    }
}

/// The longest node or provider name: a node's name is in its stream's name and in every
/// sourcing header, which its share's room allows for ([`Share::SOURCE_OVERHEAD`]).
const MAX_NAME: usize = 64;

fn plain_token(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= MAX_NAME && chars.next().is_some_and(|c| c.is_ascii_alphanumeric()) && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// What became of one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketOutcome {
    Made,
    /// It existed with the safe settings.
    Safe,
    /// It existed and was made safe: what changed.
    Fixed(Vec<String>),
    /// Its stream is not a bucket: left alone, for the operator to delete.
    Refused(String),
    /// The bus said no.
    Failed(String),
}

/// Each bucket and what became of it.
#[derive(Debug, Default)]
pub struct BucketReport {
    pub buckets: Vec<(String, BucketOutcome)>,
}

impl BucketReport {
    /// A line per bucket, to the log.
    pub fn log(&self) {
        for (bucket, outcome) in &self.buckets {
            match outcome {
                BucketOutcome::Made => tracing::info!(bucket, "bootstrap: made"),
                BucketOutcome::Safe => tracing::debug!(bucket, "bootstrap: already safe"),
                BucketOutcome::Fixed(what) => tracing::warn!(bucket, changed = ?what, "bootstrap: made safe"),
                BucketOutcome::Refused(why) => tracing::error!(bucket, "bootstrap: refused: {why}"),
                BucketOutcome::Failed(why) => tracing::error!(bucket, "bootstrap: failed: {why}"),
            }
        }
    }

    /// An error naming every bucket refused or failed, if any.
    pub fn result(&self) -> Result<()> {
        let bad: Vec<String> = self
            .buckets
            .iter()
            .filter_map(|(b, o)| match o {
                BucketOutcome::Refused(why) | BucketOutcome::Failed(why) => Some(format!("{b}: {why}")),
                _ => None,
            })
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::Config, format!("bootstrap could not make every bucket: {}", bad.join("; "))))
        }
    }
}

/// Makes or makes safe every bucket of `plan`, and each node's share.
pub async fn apply(js: &jetstream::Context, plan: &Plan) -> BucketReport {
    let mut report = BucketReport::default();
    let nodes: Vec<&str> = plan.nodes.iter().map(String::as_str).collect();
    for spec in &plan.buckets {
        let outcome = if spec.shared && !nodes.is_empty() { shared(js, spec, &nodes, plan.share).await } else { one(js, spec).await };
        report.buckets.push((spec.bucket.clone(), outcome.unwrap_or_else(|e| BucketOutcome::Failed(e.message().to_string()))));
    }
    // The nodes' streams after the shared buckets: those must first give up any subjects of
    // their own, since no two streams may capture the same subject.
    if let Some(spec) = plan.buckets.iter().find(|b| b.shared) {
        for node in &nodes {
            let outcome = share(js, node, plan.share, spec).await.unwrap_or_else(|e| BucketOutcome::Failed(e.message().to_string()));
            report.buckets.push((node_stream(node), outcome));
        }
    }
    report
}

/// Stops sourcing `node`'s share into each bucket every node writes: the node has left the mesh.
/// The keys it wrote stay in the buckets (the provisioner names them orphaned in its modules'
/// status) and its share stream is left for the operator to delete.
pub async fn retire(js: &jetstream::Context, node: &str) -> BucketReport {
    let mut report = BucketReport::default();
    let name = node_stream(node);
    for bucket in crate::nats::bucket::SHARED_BUCKETS {
        let outcome = async {
            let Some(info) = stream_info(js, bucket).await? else {
                return Ok(BucketOutcome::Safe);
            };
            let mut config = info.config.clone();
            let sources = config.sources.get_or_insert_with(Vec::new);
            let before = sources.len();
            sources.retain(|s| s.name != name);
            if sources.len() == before {
                return Ok(BucketOutcome::Safe);
            }
            crate::nats::bucket::bounded(|| format!("updating bucket {bucket}"), async {
                js.update_stream(&config).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("updating bucket {bucket}: {e}")))
            })
            .await?;
            Ok::<_, Error>(BucketOutcome::Fixed(vec![format!("no longer sources {name} (its keys stay, orphaned)")]))
        }
        .await;
        report.buckets.push((bucket.to_string(), outcome.unwrap_or_else(|e| BucketOutcome::Failed(e.message().to_string()))));
    }
    report
}

/// A bucket every node writes, made of `nodes`' shares: made so, or an existing one (one stream
/// until now, or the shares of fewer nodes) made so in place. Keys it holds stay; from now on
/// each node's writes go to its share.
async fn shared(js: &jetstream::Context, spec: &Spec, nodes: &[&str], share: Share) -> Result<BucketOutcome> {
    let want = spec.sourced_config(nodes, share);
    let Some(info) = stream_info(js, &spec.bucket).await? else {
        create_stream_as(js, want, &format!("bucket {}", spec.bucket)).await?;
        return Ok(BucketOutcome::Made);
    };
    if let Shape::Refused(why) = shape(&spec.bucket, &info.config) {
        return Ok(BucketOutcome::Refused(why));
    }
    let mut config = info.config.clone();
    let mut changed = safe_in_place(&mut config, spec);
    if !config.subjects.is_empty() {
        config.subjects = Vec::new();
        changed.push("made of its nodes' shares (the keys it holds stay)".to_string());
    }
    let sources = config.sources.get_or_insert_with(Vec::new);
    for source in want.sources.unwrap_or_default() {
        if !sources.iter().any(|s| s.name == source.name) {
            changed.push(format!("sources {}", source.name));
            sources.push(source);
        }
    }
    // Room for the whole share of every node it sources (those named before too), besides what
    // it holds of its own (keys kept from when it was one stream): a bucket that filled would
    // stop every node's sourcing, silently.
    let held = if info.config.subjects.is_empty() { 0 } else { info.state.bytes as i64 };
    let room = share.room().saturating_mul(sources.len() as i64).saturating_add(held);
    if config.max_bytes < room {
        config.max_bytes = room;
        changed.push(format!("byte limit {room} (room for every node's share)"));
    }
    if config.duplicate_window > want.duplicate_window {
        config.duplicate_window = want.duplicate_window;
        changed.push("a node's Nats-Msg-Id kept its own".to_string());
    }
    update(js, spec, &config, changed).await
}

/// `node`'s stream of its keys of the shared buckets, made with its share; one that exists is
/// left as it is (its limits are the operator's).
async fn share(js: &jetstream::Context, node: &str, share: Share, spec: &Spec) -> Result<BucketOutcome> {
    let name = node_stream(node);
    if named_stream_info(js, &name, &name).await?.is_some() {
        return Ok(BucketOutcome::Safe);
    }
    create_stream_as(js, node_config(node, share, spec), &name).await?;
    Ok(BucketOutcome::Made)
}

async fn one(js: &jetstream::Context, spec: &Spec) -> Result<BucketOutcome> {
    let Some(info) = stream_info(js, &spec.bucket).await? else {
        crate::nats::bucket::create_stream(js, spec).await?;
        return Ok(BucketOutcome::Made);
    };
    if let Shape::Refused(why) = shape(&spec.bucket, &info.config) {
        return Ok(BucketOutcome::Refused(why));
    }
    let mut config = info.config.clone();
    let changed = safe_in_place(&mut config, spec);
    update(js, spec, &config, changed).await
}

/// Makes `config` safe in place: roll-ups and API deletes refused, the limits set where there
/// were none (a limit the operator chose is kept). What changed.
fn safe_in_place(config: &mut async_nats::jetstream::stream::Config, spec: &Spec) -> Vec<String> {
    let mut changed = Vec::new();
    if config.allow_rollup {
        config.allow_rollup = false;
        changed.push("roll-ups refused".to_string());
    }
    if !config.deny_delete {
        config.deny_delete = true;
        changed.push("API deletes refused".to_string());
    }
    if config.max_bytes <= 0 {
        config.max_bytes = spec.limits.max_bytes;
        changed.push(format!("byte limit {}", spec.limits.max_bytes));
    }
    if config.max_message_size <= 0 {
        config.max_message_size = spec.limits.max_value;
        changed.push(format!("value-size limit {}", spec.limits.max_value));
    }
    if config.discard != async_nats::jetstream::stream::DiscardPolicy::New {
        config.discard = async_nats::jetstream::stream::DiscardPolicy::New;
        changed.push("a write past a limit refused, never evicting older keys (discard new)".to_string());
    }
    if config.max_messages > 0 {
        config.max_messages = -1;
        changed.push("no limit on the count of messages in all (each node's share limits its own)".to_string());
    }
    changed
}

/// Updates `spec.bucket`'s stream to `config` when anything `changed`.
async fn update(js: &jetstream::Context, spec: &Spec, config: &async_nats::jetstream::stream::Config, changed: Vec<String>) -> Result<BucketOutcome> {
    if changed.is_empty() {
        return Ok(BucketOutcome::Safe);
    }
    crate::nats::bucket::bounded(|| format!("updating bucket {}", spec.bucket), async {
        js.update_stream(config).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("updating bucket {}: {e}", spec.bucket)))
    })
    .await?;
    Ok(BucketOutcome::Fixed(changed))
}

/// The settings of the buckets the server or `bootstrap` makes.
#[derive(Args, Debug, Clone, Copy)]
pub struct BucketFlags {
    /// Replicas of the buckets made.
    #[arg(long, env = "MESH_PROVISIONER_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: u8,
    /// The byte limit of each bucket made, in MiB (a write past it is refused by the server).
    #[arg(long, env = "MESH_PROVISIONER_BUCKET_MAX_MIB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub bucket_max_mib: u32,
    /// The largest value one write of a node's buckets may carry, in KiB (compositions, which
    /// carry whole plans, may carry 1 MiB).
    #[arg(long, env = "MESH_PROVISIONER_VALUE_MAX_KIB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub value_max_kib: u32,
    /// Each node's share of the buckets every node writes (needs, applied, collect together),
    /// in MiB: the bus refuses that node's write past it, and no other node's.
    #[arg(long, env = "MESH_PROVISIONER_NODE_SHARE_MIB", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub node_share_mib: u32,
    /// Each node's share of those buckets in keys (delete markers count).
    #[arg(long, env = "MESH_PROVISIONER_NODE_SHARE_KEYS", default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1..))]
    pub node_share_keys: u32,
}

impl BucketFlags {
    pub fn limits(&self) -> crate::nats::bucket::BucketLimits {
        crate::nats::bucket::BucketLimits { max_bytes: i64::from(self.bucket_max_mib) << 20, max_value: (self.value_max_kib << 10) as i32 }
    }

    pub fn share(&self) -> crate::nats::bucket::Share {
        crate::nats::bucket::Share { max_bytes: i64::from(self.node_share_mib) << 20, max_keys: i64::from(self.node_share_keys) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_node_name_that_is_not_a_token() {
        assert!(plain_token("alpha") && plain_token("node-7_b"));
        assert!(plain_token(&"n".repeat(MAX_NAME)));
        for bad in ["", "*", ">", "a.b", "-x", "a b", &"n".repeat(MAX_NAME + 1)] {
            assert!(!plain_token(bad), "{bad:?}");
        }
    }
}
