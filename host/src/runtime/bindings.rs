//! Host-side bindings of the WIT world `provisioner`, and the imports implemented over a
//! [`Backend`](crate::store::backend::Backend). The generated types are the host's own (the runtime
//! re-exports the reports; nothing copies them). Imports return the host's [`Error`]
//! (`trappable_error_type`); `types::Host::convert_host_error` is the one place it becomes the
//! WIT `host-error` the guest sees.

use wasmtime::component::HasData;

use super::Ctx;
use crate::base::error::{Error, ErrorKind};
use crate::store::mirror::Reach;

wasmtime::component::bindgen!({
    world: "provisioner",
    path: "../wit",
    imports: { default: async | trappable },
    exports: { default: async },
    trappable_error_type: { "mesh:provisioner/types.host-error" => Error },
    additional_derives: [PartialEq, Eq, Hash, PartialOrd, Ord],
});

pub use exports::mesh::provisioner::api;
use mesh::provisioner::{discovery, kept_plans, log, registry_writer, store, types};

impl types::Host for Ctx {
    /// The one mapping from a host failure to what the guest sees. Never a trap: every host
    /// failure is the guest's to answer (a `503`, an internal error), not a reason to stop it.
    fn convert_host_error(&mut self, e: Error) -> wasmtime::Result<types::HostError> {
        let m = e.message().to_string();
        Ok(match e.kind() {
            ErrorKind::Unavailable | ErrorKind::Guest | ErrorKind::Config => types::HostError::Unavailable(m),
            ErrorKind::Conflict => types::HostError::Conflict(m),
            ErrorKind::Denied => types::HostError::Denied(m),
            ErrorKind::Invalid => types::HostError::Invalid(m),
            ErrorKind::Timeout => types::HostError::Timeout(m),
            ErrorKind::NoResponders => types::HostError::NoResponders(m),
            ErrorKind::Corrupt => types::HostError::Corrupt(m),
        })
    }
}

type R<T> = Result<T, Error>;

/// The most marks one `store.reach` may name (the guest asks at most a bucket for each read).
const MAX_MARKS: usize = 256;
/// The longest wait `store.reach` honours, in milliseconds.
const MAX_WAIT_MS: u32 = 10_000;

/// What an import leaves of a call's time, so the guest can still answer with the import's
/// error (a `503`) rather than be interrupted at the deadline itself.
const IMPORT_MARGIN: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs an import's work within the call's deadline: a mirror that is slow to sync or a bus that
/// does not answer can never hold a call (and so a reply) past it. What ran out is a `timeout`,
/// named by `what` (written only then: imports are on every request's path).
async fn within_deadline<T>(
    deadline: std::time::Instant,
    what: impl FnOnce() -> String,
    work: impl std::future::Future<Output = crate::base::error::Result<T>>,
) -> R<T> {
    let until = deadline.checked_sub(IMPORT_MARGIN).unwrap_or(deadline);
    match tokio::time::timeout_at(tokio::time::Instant::from_std(until), work).await {
        Ok(done) => done,
        Err(_) => Err(Error::new(ErrorKind::Timeout, format!("the call's deadline passed during {}", what()))),
    }
}

/// The mirror of `bucket`, in sync, within the call's deadline; recorded, with what the read
/// depends on (the part of the mirror it `reach`es), for the reply cache.
async fn mirror(ctx: &mut Ctx, bucket: &str, reach: Reach) -> R<std::sync::Arc<crate::store::mirror::Mirror>> {
    let m = within_deadline(ctx.deadline, || format!("the wait for {bucket}'s mirror to be in sync"), ctx.backend.mirror(bucket)).await;
    record(&mut ctx.reads, || m.as_ref().ok().and_then(|m| super::Read::of_mirror(bucket, m, reach)));
    m
}

fn entry(e: crate::store::mirror::Entry) -> types::Entry {
    types::Entry { key: e.key, revision: e.revision, value: e.value }
}

impl store::Host for Ctx {
    async fn get(&mut self, bucket: String, key: String) -> R<Option<types::Entry>> {
        Ok(mirror(self, &bucket, Reach::of(&key)).await?.get(&key)?.map(entry))
    }

    async fn scan(&mut self, bucket: String, filter: String, after: Option<String>, limit: u32) -> R<store::Page> {
        let p = mirror(self, &bucket, Reach::of(&filter)).await?.scan(&filter, after.as_deref(), limit)?;
        Ok(store::Page { keys: p.keys, values: p.values, lengths: p.lengths, revisions: p.revisions, more: p.more, revision: p.revision })
    }

    async fn exists(&mut self, bucket: String) -> R<bool> {
        Ok(mirror(self, &bucket, Reach::nothing()).await?.exists())
    }

    async fn reach(&mut self, marks: Vec<store::Mark>, wait_ms: u32) -> R<Vec<store::Reached>> {
        // A reply made after a wait holds what the bus held then, not what a kept reply's reads say.
        self.reads = None;
        if marks.len() > MAX_MARKS {
            return Err(Error::new(ErrorKind::Invalid, format!("{} marks asked at once; at most {MAX_MARKS}", marks.len())));
        }
        // Past the permits, a call looks once and answers: a requester asking for revisions far
        // ahead cannot hold every call in flight for the longest wait.
        let permit = self.waiting.clone().try_acquire_owned().ok();
        let wait = if permit.is_some() { std::time::Duration::from_millis(u64::from(wait_ms.min(MAX_WAIT_MS))) } else { std::time::Duration::ZERO };
        let until = std::time::Instant::now() + wait;
        // The wait is the requester's to ask: the call may run past its deadline by it, no more.
        self.deadline = self.deadline.max(until + self.time_limit);
        let backend = self.backend.clone();
        let asked = futures::future::try_join_all(marks.iter().map(|m| {
            let backend = backend.clone();
            async move {
                match m.revision {
                    Some(r) => Ok(r),
                    None => backend.bus_revision(&m.name).await,
                }
            }
        }));
        let asked = within_deadline(self.deadline, || "asking the bus where its buckets stand".into(), asked).await?;
        let metrics = crate::base::metrics::metrics();
        metrics.reach_waiting.inc();
        let reached = futures::future::try_join_all(marks.iter().zip(&asked).map(|(m, &want)| backend.reach(&m.name, want, until)));
        let reached = within_deadline(self.deadline, || "the wait for the mirrors".into(), reached).await;
        metrics.reach_waiting.dec();
        drop(permit);
        let reached = reached?;
        let outcome = match (wait.is_zero() && wait_ms > 0, reached.iter().zip(&asked).all(|(r, a)| r >= a)) {
            (true, _) => "not_waited",
            (false, true) => "reached",
            (false, false) => "not_reached",
        };
        metrics.reach_waits.get_or_create(&crate::base::metrics::Outcome { outcome: outcome.into() }).inc();
        Ok(marks.into_iter().zip(asked).zip(reached).map(|((m, asked), revision)| store::Reached { name: m.name, asked, revision }).collect())
    }

    async fn health(&mut self, bucket: String) -> R<store::BucketHealth> {
        let quota = self.backend.quota();
        // Every put moves a writer's count.
        let m = mirror(self, &bucket, Reach::everything()).await?;
        Ok(store::BucketHealth {
            unsafe_settings: m.health().unsafe_settings,
            over_quota: m.writers_over(quota).into_iter().map(|w| store::WriterShare { writer: w.writer, keys: w.keys, bytes: w.bytes }).collect(),
            orphaned: m.writers_unsourced(&bucket).into_iter().map(|w| store::WriterShare { writer: w.writer, keys: w.keys, bytes: w.bytes }).collect(),
        })
    }
}

impl discovery::Host for Ctx {
    async fn responders(&mut self, service: String) -> R<u32> {
        let count = within_deadline(self.deadline, || format!("discovery of {service}"), self.backend.responders(&service)).await;
        // A reply that used a count is kept only while the count holds (never one that failed).
        record(&mut self.reads, || count.as_ref().ok().and_then(|c| super::Read::of_count(&service, c)));
        count.map(|c| c.responders)
    }
}

impl registry_writer::Host for Ctx {
    async fn put(&mut self, key: String, value: Vec<u8>, expected: u64) -> R<u64> {
        self.reads = None;
        within_deadline(self.deadline, || "a registry write".into(), self.backend.put_registry(&key, value, expected)).await
    }

    async fn delete(&mut self, key: String, expected: u64) -> R<()> {
        self.reads = None;
        within_deadline(self.deadline, || "a registry delete".into(), self.backend.delete_registry(&key, expected)).await
    }
}

impl kept_plans::Host for Ctx {
    async fn load(&mut self, node: String, module: String) -> R<Option<Vec<u8>>> {
        // A file on disk, which nothing versions: a reply that read one is not kept.
        self.reads = None;
        self.backend.kept().load_off_thread(&node, &module).await
    }

    async fn save(&mut self, node: String, module: String, plan: Vec<u8>) -> R<()> {
        self.reads = None;
        self.backend.kept().save_off_thread(&node, &module, &plan).await
    }

    async fn last_failure(&mut self, node: String, module: String) -> wasmtime::Result<Option<String>> {
        self.read_kept();
        Ok(self.backend.kept().last_failure(&node, &module))
    }
}

impl Ctx {
    /// Records a read of the kept plans' failures (held in memory), at their version before
    /// the read.
    fn read_kept(&mut self) {
        record(&mut self.reads, || Some(super::Read::Kept { version: self.backend.kept().version() }));
    }
}

/// Records what a read depends on in a call's `reads`; `None` (nothing could say) leaves the
/// reply unkept. `read` is worked out only while the reply may still be kept: never with the
/// reply cache off, nor after a read that made it unkept.
fn record(reads: &mut Option<Vec<super::Read>>, read: impl FnOnce() -> Option<super::Read>) {
    let Some(kept) = reads.as_mut() else { return };
    match read() {
        Some(r) => kept.push(r),
        None => *reads = None,
    }
}

impl log::Host for Ctx {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        // A replay would not log again.
        self.reads = None;
        let message: String = message.chars().take(4096).collect();
        match level {
            log::Level::Trace => tracing::trace!(target: "guest", "{message}"),
            log::Level::Debug => tracing::debug!(target: "guest", "{message}"),
            log::Level::Info => tracing::info!(target: "guest", "{message}"),
            log::Level::Warn => tracing::warn!(target: "guest", "{message}"),
            log::Level::Error => tracing::error!(target: "guest", "{message}"),
        }
        Ok(())
    }
}

/// Marks `Ctx` as the data the imports borrow.
pub struct Imports;

impl HasData for Imports {
    type Data<'a> = &'a mut Ctx;
}
