//! Running the guest component: one engine, a pre-instantiated component, and calls made in
//! fresh, limited stores.
//!
//! Instances come from the [`ProvisionerPre`](bindings::ProvisionerPre) (tens of microseconds)
//! and serve a bounded number of calls ([`EngineOptions::reuse`]); each call has an epoch deadline and
//! the store a memory limit. A trap, a deadline or an exhausted limit is an [`ErrorKind::Guest`]
//! error, the instance is dropped (never returned to the pool), and the next call starts clean. The guest's WASI context
//! grants nothing: no preopened directories, environment, arguments or sockets. A verb call's
//! reply may be served again from the reply cache ([`cache`]) while nothing it read changed.

mod bindings;
mod cache;
pub mod component;
pub mod current;
pub mod trust;

use crate::base::sync::Locked;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::base::error::{Error, ErrorKind, Result};
use crate::store::backend::Backend;
/// The WIT types a caller of the runtime sees, as bindgen generates them (no host copies):
/// `BuildInfo`, the reports of `reconcile`, `refresh`, `notices` and `transitions`, and what
/// they carry.
pub use bindings::api::{
    BuildInfo, Change, Notice, NoticeReport, ReconcileReport, RefreshReport, ReplyCode, RevisionSlot, Transition, TransitionReport, ValueEvent,
};
use bindings::{Imports, Provisioner, ProvisionerPre};
pub use cache::Read;

/// How often the epoch advances: a long call yields this often and is checked against its deadline.
pub const TICK: Duration = Duration::from_millis(5);

/// Per-call limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Wall time a call may take, host imports included.
    pub deadline: Duration,
    /// Bytes of linear memory (and tables) a call may grow to.
    pub memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { deadline: Duration::from_secs(2), memory: 64 << 20 }
    }
}

/// How instances are made and kept.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    /// Use wasmtime's pooling allocator (pre-reserved slots) instead of on-demand allocation.
    pub pooling: bool,
    /// Calls one instance may serve before it is thrown away (1: a fresh instance per call).
    /// An instance is thrown away after any failure whatever this says.
    pub reuse: u32,
    /// An instance holding more linear memory than this after a call is thrown away rather
    /// than kept: what caps the heap a kept instance grew to (its allocator never gives back),
    /// so that `reuse` need not.
    pub keep_below: usize,
    /// Serve a repeated request over unchanged buckets from the reply cache (see `cache`).
    pub reply_cache: bool,
    /// The memory all instances together may hold (pooled and in flight): one budget for the
    /// guests, whatever each call's own limit (see [`Budget`]).
    pub memory_total: usize,
    /// Calls that may wait for the mirrors (`store.reach`) at once; the others look once and
    /// answer, so requests asking for revisions far ahead hold no more than these of the calls
    /// in flight.
    pub waiters: usize,
}

/// The guests' memory budget: the linear memory every live instance of a runtime holds, kept
/// by each store's limiter as it grows and given back when the store is dropped. A growth past
/// the total traps the guest that asked, never another; before a fresh instance is made the
/// pool's idle instances are let go when the budget could not hold one more.
#[derive(Debug)]
pub struct Budget {
    used: AtomicUsize,
    total: usize,
}

impl Budget {
    /// The bytes the instances hold now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The bytes they may hold together.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Takes `bytes` if they fit.
    fn take(&self, bytes: usize) -> bool {
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(bytes).filter(|t| *t <= self.total)).is_ok()
    }

    fn give(&self, bytes: usize) {
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(bytes)));
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        // Measured (`cargo bench -p tests --bench component`): a call on a fresh instance
        // ~158 µs, on a kept one ~24 µs; at 64 calls an instance, its making and dropping were
        // ~2.5 µs of every call's mean (27.4 µs against 25.0 at 4096). The guest keeps no state
        // between calls, and its heap is capped by `keep_below` (a kept instance holds under
        // 2 MiB, its allocator's arena included): the count only bounds how long any one
        // instance lives.
        EngineOptions { pooling: false, reuse: 4096, keep_below: 16 << 20, reply_cache: true, memory_total: 1 << 30, waiters: 32 }
    }
}

/// Most instances kept warm for reuse.
const POOL: usize = 32;

/// The data of one call's store.
pub struct Ctx {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: Limiter,
    backend: Arc<dyn Backend>,
    /// Calls this instance has served.
    calls: u32,
    /// When the current call must have finished.
    deadline: std::time::Instant,
    /// How long a call may run: a wait for the mirrors (`store.reach`) moves the deadline to this
    /// long after the wait.
    time_limit: Duration,
    /// Permits to wait for the mirrors, shared by the runtime's calls.
    waiting: Arc<tokio::sync::Semaphore>,
    /// What a verb call read, for the reply cache; `None` outside verb calls and once a call
    /// did something a kept reply could not repeat.
    reads: Option<Vec<cache::Read>>,
}

/// Which memory limit a call hit, so its error can say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hit {
    None,
    /// The call's own limit.
    Instance,
    /// The guests' budget, of this many bytes.
    Budget(usize),
}

/// The store's memory limit and its share of the guests' budget.
struct Limiter {
    memory: usize,
    hit: Hit,
    budget: Arc<Budget>,
    /// What this store holds of the budget.
    held: usize,
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        // An error (rather than `false`) traps at once instead of letting the guest's
        // allocator limp on.
        if desired > self.memory {
            self.hit = Hit::Instance;
            return Err(wasmtime::Error::msg(format!("memory limit of {} bytes reached", self.memory)));
        }
        let more = desired.saturating_sub(current);
        if !self.budget.take(more) {
            self.hit = Hit::Budget(self.budget.total);
            return Err(wasmtime::Error::msg(format!("the guests' memory budget of {} bytes is spent", self.budget.total)));
        }
        self.held += more;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        16
    }
}

impl WasiView for Ctx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The wasmtime engine, with its epoch ticking on a thread of its own.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<Ctx>>,
    options: EngineOptions,
    budget: Arc<Budget>,
    /// Permits to wait for the mirrors ([`EngineOptions::waiters`]).
    waiting: Arc<tokio::sync::Semaphore>,
    _ticker: Arc<Ticker>,
}

struct Ticker(Arc<AtomicBool>);

impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Runtime {
    pub fn new() -> Result<Self> {
        Self::with_options(EngineOptions::default())
    }

    pub fn with_options(options: EngineOptions) -> Result<Self> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        // The component model's concurrency (async tasks, streams, futures) is not used: each
        // call is one task on a fiber. Without it a call skips the task machinery.
        config.concurrency_support(false);
        // For profiling only: `perf` then names the guest's functions (/tmp/perf-<pid>.map).
        if std::env::var_os("MESH_PROVISIONER_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        if options.pooling {
            let mut pool = wasmtime::PoolingAllocationConfig::default();
            pool.total_component_instances(1000).total_core_instances(4000).total_memories(2000).total_tables(2000).total_stacks(1000);
            pool.max_memory_size(1 << 30);
            config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&config).map_err(|e| Error::new(ErrorKind::Config, format!("wasmtime engine: {e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(guest_err("linking WASI"))?;
        Provisioner::add_to_linker::<Ctx, Imports>(&mut linker, |c| c).map_err(guest_err("linking imports"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("epoch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    e.increment_epoch();
                }
            })
            .map_err(|e| Error::new(ErrorKind::Config, format!("epoch thread: {e}")))?;
        let budget = Arc::new(Budget { used: AtomicUsize::new(0), total: options.memory_total });
        let waiting = Arc::new(tokio::sync::Semaphore::new(options.waiters));
        Ok(Runtime { engine, linker: Arc::new(linker), options, budget, waiting, _ticker: Arc::new(Ticker(stop)) })
    }

    /// The guests' memory budget, shared by every component this runtime loads.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Compiles `bytes`, or loads the precompiled artifact cached under `cache` for the same
    /// digest and engine, and links it against the WIT world (the type check).
    pub fn load(&self, bytes: &[u8], cache: Option<&Path>) -> Result<Guest> {
        let digest = hex::encode(Sha256::digest(bytes));
        if bytes.get(..4) != Some(b"\0asm") {
            return Err(Error::new(ErrorKind::Guest, "not a WebAssembly file (no \\0asm header)"));
        }
        let (component, cached) = self.compile(bytes, &digest, cache)?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| self.misfit(&component, e))?;
        let pre = ProvisionerPre::new(pre).map_err(|e| self.misfit(&component, e))?;
        Ok(Guest { runtime: self.clone(), pre, digest, cached, pool: Default::default(), replies: Default::default() })
    }

    /// Why a component does not link against this host's world, in words an operator can act
    /// on: built for another version of the WIT package, or importing what this host does not
    /// provide (a way to publish on the bus, say).
    fn misfit(&self, component: &Component, e: wasmtime::Error) -> Error {
        let ty = component.component_type();
        let names: Vec<String> = ty.imports(&self.engine).map(|(n, _)| n.to_string()).chain(ty.exports(&self.engine).map(|(n, _)| n.to_string())).collect();
        let ours = crate::WIT_VERSION.rsplit_once('@').map(|(_, v)| v).unwrap_or_default();
        let other = names.iter().filter_map(|n| n.strip_prefix("mesh:provisioner/")).filter_map(|n| n.rsplit_once('@').map(|(_, v)| v)).find(|v| *v != ours);
        let why = match other {
            Some(v) => format!("the component was built for mesh:provisioner@{v}; this host speaks {}", crate::WIT_VERSION),
            None => format!("the component does not fit the WIT world ({})", crate::WIT_VERSION),
        };
        Error::new(ErrorKind::Guest, format!("{why}: {e:#}"))
    }

    fn compile(&self, bytes: &[u8], digest: &str, cache: Option<&Path>) -> Result<(Component, bool)> {
        let path = cache.map(|dir| self.artifact_path(dir, digest));
        if let Some(p) = path.as_ref().filter(|p| p.exists()) {
            match crate::runtime::trust::trusted_artifact(p) {
                // SAFETY: native code, loaded only as this server wrote it: the directory and
                // the file are this user's alone and the bytes (the very ones loaded, not the
                // file read again) match the digest recorded when `Component::serialize` of an
                // engine with the same compatibility hash (in the name) wrote them; wasmtime
                // also checks the header.
                Ok(bytes) => match unsafe { Component::deserialize(&self.engine, &bytes) } {
                    Ok(c) => return Ok((c, true)),
                    Err(e) => tracing::warn!(path = %p.display(), "cached component unusable, recompiling: {e:#}"),
                },
                Err(why) => tracing::warn!(path = %p.display(), "cached component not trusted, recompiling: {why}"),
            }
        }
        let component = Component::new(&self.engine, bytes).map_err(guest_err("compiling the component"))?;
        if let Some(p) = path {
            let written =
                component.serialize().map_err(|e| e.to_string()).and_then(|art| crate::runtime::trust::write_artifact(&p, &art).map_err(|e| e.to_string()));
            if let Err(e) = written {
                tracing::warn!(path = %p.display(), "could not cache the compiled component: {e}");
            }
        }
        Ok((component, false))
    }

    fn artifact_path(&self, dir: &Path, digest: &str) -> PathBuf {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        dir.join(format!("{digest}-{:016x}.cwasm", h.finish()))
    }
}

fn guest_err(what: &'static str) -> impl Fn(wasmtime::Error) -> Error {
    move |e| Error::new(ErrorKind::Guest, format!("{what}: {e:#}"))
}

/// How a verb's reply is sent: its code as the guest said it, and its body, shared (not copied)
/// when the reply cache serves it again — the one boundary type the host keeps its own — with
/// where the guest said its revision is (the reply cache's business only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: ReplyCode,
    pub body: bytes::Bytes,
    pub revision: Option<RevisionSlot>,
}

impl ReconcileReport {
    pub fn writes(&self) -> usize {
        self.puts.len() + self.deletes.len()
    }
}

/// A compiled, linked component, ready to instantiate.
#[derive(Clone)]
pub struct Guest {
    runtime: Runtime,
    pre: ProvisionerPre<Ctx>,
    digest: String,
    cached: bool,
    /// Instances that served without failing, ready for another call.
    pool: Arc<Mutex<Vec<Instance>>>,
    /// Replies kept with what they read (this component's only).
    replies: Arc<cache::ReplyCache>,
}

/// A store and the component instantiated in it.
struct Instance {
    store: Store<Ctx>,
    api: Provisioner,
    memory: usize,
}

impl Guest {
    /// The SHA-256 of the component's bytes, hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether compilation was skipped for a cached artifact.
    pub fn from_cache(&self) -> bool {
        self.cached
    }

    /// The guests' memory budget this component's instances draw on.
    pub fn budget(&self) -> &Arc<Budget> {
        self.runtime.budget()
    }

    /// An instance for one call: a kept one if any (with the same memory limit), else a fresh
    /// one. Its deadline starts now.
    async fn checkout(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<Instance> {
        let kept = {
            let mut pool = self.pool.locked();
            let at = pool.iter().rposition(|i| i.memory == limits.memory);
            at.map(|i| pool.swap_remove(i))
        };
        let mut instance = match kept {
            Some(mut i) => {
                i.store.data_mut().backend = backend;
                i
            }
            None => {
                let budget = self.runtime.budget.clone();
                if budget.used().saturating_add(limits.memory) > budget.total() {
                    // Idle instances hold memory a fresh one may need: let them go first.
                    let idle = std::mem::take(&mut *self.pool.locked());
                    drop(idle);
                }
                let ctx = Ctx {
                    wasi: WasiCtx::builder().build(),
                    table: ResourceTable::new(),
                    limits: Limiter { memory: limits.memory, hit: Hit::None, budget, held: 0 },
                    backend,
                    calls: 0,
                    deadline: std::time::Instant::now() + limits.deadline,
                    time_limit: limits.deadline,
                    waiting: self.runtime.waiting.clone(),
                    reads: None,
                };
                let mut store = Store::new(&self.runtime.engine, ctx);
                store.limiter(|c| &mut c.limits);
                // Every tick a long call yields to the executor (so it never holds a thread
                // that the seat's renewals need) until its deadline, when it is interrupted.
                store.epoch_deadline_callback(|ctx| {
                    Ok(if std::time::Instant::now() >= ctx.data().deadline { wasmtime::UpdateDeadline::Interrupt } else { wasmtime::UpdateDeadline::Yield(1) })
                });
                store.set_epoch_deadline(1);
                // Boxed: a fresh instance is the rare path, and inline its future would size
                // every call's (and so every request's task) for it.
                let api = match Box::pin(self.pre.instantiate_async(&mut store)).await {
                    Ok(api) => api,
                    Err(e) => return Err(call_err(&limits, store.data().limits.hit, e)),
                };
                crate::base::metrics::metrics().instances.inc();
                Instance { store, api, memory: limits.memory }
            }
        };
        instance.store.data_mut().deadline = std::time::Instant::now() + limits.deadline;
        instance.store.data_mut().time_limit = limits.deadline;
        instance.store.data_mut().reads = None;
        instance.store.set_epoch_deadline(1);
        Ok(instance)
    }

    /// Keeps an instance that served without failing, until it has served its share of calls.
    fn checkin(&self, mut instance: Instance) {
        let ctx = instance.store.data_mut();
        ctx.calls += 1;
        if ctx.calls >= self.runtime.options.reuse || ctx.limits.held > self.runtime.options.keep_below {
            return;
        }
        let mut pool = self.pool.locked();
        if pool.len() < POOL {
            pool.push(instance);
        }
    }

    /// One call of an export, the only place an instance is checked out, called, and checked
    /// back in: a failure is named by what stopped the call (its deadline, its memory, a trap)
    /// and the instance is dropped with it; `export`, when given, times the call for the metrics.
    /// `f` is handed the instance and hands it back with what the export returned. Every export
    /// below is this and a conversion of its types.
    async fn call<'c, T>(
        &self,
        backend: Arc<dyn Backend>,
        limits: Limits,
        export: Option<&'static str>,
        f: impl FnOnce(Instance) -> futures::future::BoxFuture<'c, (Instance, wasmtime::Result<T>)>,
    ) -> Result<T> {
        let inst = self.checkout(backend, limits).await?;
        let started = std::time::Instant::now();
        let (inst, r) = f(inst).await;
        let v = r.map_err(|e| call_err(&limits, inst.store.data().limits.hit, e))?;
        if let Some(export) = export {
            crate::base::metrics::metrics().guest_call(export, started.elapsed());
        }
        self.checkin(inst);
        Ok(v)
    }

    pub async fn info(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<BuildInfo> {
        self.call(backend, limits, None, |mut i| {
            Box::pin(async move {
                let r = i.api.mesh_provisioner_api().call_info(&mut i.store).await;
                (i, r)
            })
        })
        .await
    }

    pub async fn compile_registry(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<(String, Vec<u8>)>> {
        let rows = self
            .call(backend, limits, None, |mut i| {
                Box::pin(async move {
                    let r = i.api.mesh_provisioner_api().call_compile_registry(&mut i.store).await;
                    (i, r)
                })
            })
            .await?;
        Ok(rows.into_iter().map(|r| (r.kind, r.value)).collect())
    }

    /// Reconciles the registry; the inner error is the store's or writer's failure as the guest
    /// reported it.
    pub async fn reconcile(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<Result<ReconcileReport, String>> {
        let r = self
            .call(backend, limits, None, |mut i| {
                Box::pin(async move {
                    let r = i.api.mesh_provisioner_api().call_reconcile(&mut i.store).await;
                    (i, r)
                })
            })
            .await?;
        Ok(r.map_err(|e| format!("{e:?}")))
    }

    /// The buckets whose changes can move a plan (a trailing `*`: a prefix).
    pub async fn plan_inputs(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<String>> {
        self.call(backend, limits, None, |mut i| {
            Box::pin(async move {
                let r = i.api.mesh_provisioner_api().call_plan_inputs(&mut i.store).await;
                (i, r)
            })
        })
        .await
    }

    /// Recomputes the plans `changes` can move; the inner error is a store failure as the guest
    /// reported it.
    pub async fn refresh(&self, backend: Arc<dyn Backend>, limits: Limits, changes: &[Change]) -> Result<Result<RefreshReport, String>> {
        let r = self
            .call(backend, limits, Some("refresh"), |mut i| {
                Box::pin(async move {
                    let r = i.api.mesh_provisioner_api().call_refresh(&mut i.store, changes).await;
                    (i, r)
                })
            })
            .await?;
        Ok(r.map_err(|e| format!("{e:?}")))
    }

    /// The buckets notices come from (names, or one `*` in a name).
    pub async fn notice_inputs(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<String>> {
        self.call(backend, limits, None, |mut i| {
            Box::pin(async move {
                let r = i.api.mesh_provisioner_api().call_notice_inputs(&mut i.store).await;
                (i, r)
            })
        })
        .await
    }

    /// The notices `events` send; the inner error is a store failure as the guest reported it.
    pub async fn notices(&self, backend: Arc<dyn Backend>, limits: Limits, events: &[ValueEvent]) -> Result<Result<NoticeReport, String>> {
        let r = self
            .call(backend, limits, None, |mut i| {
                Box::pin(async move {
                    let r = i.api.mesh_provisioner_api().call_notices(&mut i.store, events).await;
                    (i, r)
                })
            })
            .await?;
        Ok(r.map_err(|e| format!("{e:?}")))
    }

    /// The buckets a module's state depends on (names, or one `*` in a name).
    pub async fn status_inputs(&self, backend: Arc<dyn Backend>, limits: Limits) -> Result<Vec<String>> {
        self.call(backend, limits, None, |mut i| {
            Box::pin(async move {
                let r = i.api.mesh_provisioner_api().call_status_inputs(&mut i.store).await;
                (i, r)
            })
        })
        .await
    }

    /// The state records and events `changes` move; the inner error is a store failure as the
    /// guest reported it.
    pub async fn transitions(&self, backend: Arc<dyn Backend>, limits: Limits, changes: &[Change], now: &str) -> Result<Result<TransitionReport, String>> {
        let r = self
            .call(backend, limits, Some("transitions"), |mut i| {
                Box::pin(async move {
                    let r = i.api.mesh_provisioner_api().call_transitions(&mut i.store, changes, now).await;
                    (i, r)
                })
            })
            .await?;
        Ok(r.map_err(|e| format!("{e:?}")))
    }

    pub async fn handle(&self, backend: Arc<dyn Backend>, limits: Limits, verb: &str, body: &[u8], max_reply: u32) -> Result<Reply> {
        if !self.runtime.options.reply_cache {
            return Ok(self.handle_uncached(backend, limits, verb, body, max_reply).await?.0);
        }
        if let Some(reply) = self.replies.get(&backend, verb, body, max_reply, true) {
            crate::base::metrics::metrics().reply_cache(true);
            return Ok(reply);
        }
        // The same request already being answered: wait for that answer (a hash collision or a
        // reply that could not be kept just means calling the guest after the wait).
        let flight = self.replies.fly(verb, body, max_reply, limits.deadline).await.ok();
        // Looked again whether leading or after waiting: a call that finished between the first
        // look and the flight kept its reply before it landed (one lookup saves a guest call).
        if let Some(reply) = self.replies.get(&backend, verb, body, max_reply, false) {
            crate::base::metrics::metrics().reply_cache(true);
            return Ok(reply);
        }
        crate::base::metrics::metrics().reply_cache(false);
        let (reply, reads) = self.handle_uncached(backend.clone(), limits, verb, body, max_reply).await?;
        self.replies.put(&backend, verb, body, max_reply, &reply, reads);
        drop(flight);
        Ok(reply)
    }

    /// How many requests wait now for the answer to the same request another call is computing.
    pub fn requests_waiting(&self) -> usize {
        self.replies.waiting()
    }

    /// One call of the guest's `handle`, and what it read (see [`cache`]).
    pub async fn handle_uncached(
        &self,
        backend: Arc<dyn Backend>,
        limits: Limits,
        verb: &str,
        body: &[u8],
        max_reply: u32,
    ) -> Result<(Reply, Option<Vec<cache::Read>>)> {
        // Recorded only for the cache: with it off, a call's reads are not worth the copies.
        let record = self.runtime.options.reply_cache;
        let (r, reads) = self
            .call(backend, limits, Some("handle"), |mut i| {
                Box::pin(async move {
                    i.store.data_mut().reads = record.then(Vec::new);
                    let r = i.api.mesh_provisioner_api().call_handle(&mut i.store, verb, body, max_reply).await;
                    let reads = i.store.data_mut().reads.take();
                    (i, r.map(|r| (r, reads)))
                })
            })
            .await?;
        Ok((Reply { code: r.code, body: r.body.into(), revision: r.revision }, reads))
    }
}

/// Names what stopped a call: the deadline, the memory limit, or another trap.
fn call_err(limits: &Limits, hit: Hit, e: wasmtime::Error) -> Error {
    let what = match (hit, e.downcast_ref::<Trap>()) {
        (Hit::Instance, _) => format!("the guest exhausted its memory limit of {} bytes", limits.memory),
        (Hit::Budget(total), _) => {
            format!("the guests' memory budget of {total} bytes is spent (--guest-memory-total); this call was stopped, the others go on")
        }
        (Hit::None, Some(Trap::Interrupt)) => format!("the guest ran past its deadline of {:?}", limits.deadline),
        (Hit::None, Some(t)) => format!("the guest trapped: {t}"),
        (Hit::None, None) => format!("the guest failed: {e:#}"),
    };
    Error::new(ErrorKind::Guest, what)
}
