//! `serve`: load the component, reach the bus (or start the embedded one), open the buckets,
//! reconcile the registry at start and on a timer, and serve the verbs until a signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::backend::Backend;
use crate::cli::Serve;
use crate::connect::{self, PROVISIONER_USER};
use crate::current::{Current, Loaded};
use crate::embedded::{self, Access, Server};
use crate::error::{Error, ErrorKind, Result};
use crate::nats::NatsBackend;
use crate::runtime::{Limits, Runtime};

/// Reconciling writes over the bus; it gets more time than a verb call.
const RECONCILE_DEADLINE: Duration = Duration::from_secs(30);

pub async fn run(args: Serve) -> Result<()> {
    let limits = Limits { deadline: args.guest_deadline, memory: (args.guest_memory as usize) << 20 };
    let state = &args.connect.state_dir;
    std::fs::create_dir_all(state).map_err(|e| Error::new(ErrorKind::Config, format!("state directory {}: {e}", state.display())))?;

    let runtime = Runtime::new()?;
    let current = Current::new(load(&runtime, &args.component, state, limits).await?);

    let mut embedded: Option<Server> = None;
    let client = match &args.connect.nats_url {
        Some(url) => {
            if args.demo {
                return Err(Error::new(ErrorKind::Config, "--demo writes as the example config's node users: it needs the embedded server (no --nats-url)"));
            }
            connect::connect(url, connect::options(&args.connect, "mesh-provisioner").await?).await?
        }
        None => {
            let dir = state.join("nats");
            // Keep the passwords of an earlier run, so its data stays reachable.
            let passwords = Access::load(state).ok().map(|a| a.passwords);
            let server = Server::start(&dir, args.embedded_port, passwords).await?;
            let access = server.access.clone();
            let text = serde_json::to_vec_pretty(&access).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
            embedded::write_private(&Access::path(state), &text)
                .map_err(|e| Error::new(ErrorKind::Config, format!("recording the embedded server: {e}")))?;
            tracing::info!(
                url = %access.url,
                user = PROVISIONER_USER,
                credentials = %Access::path(state).display(),
                "embedded nats-server started; `mesh-provisioner query --state-dir {}` reaches it",
                state.display()
            );
            let password = access.password(PROVISIONER_USER).unwrap_or_default().to_string();
            let o = async_nats::ConnectOptions::with_user_and_password(PROVISIONER_USER.into(), password).name("mesh-provisioner");
            embedded = Some(server);
            connect::connect(&access.url, o).await?
        }
    };

    let nats = NatsBackend::open(client.clone(), args.replicas as usize).await?;
    let backend: Arc<dyn Backend> = nats.clone();
    reconcile(&current, &backend, limits).await;

    if args.demo {
        if let Some(server) = &embedded {
            crate::demo::write(&server.access).await?;
            tracing::info!("demo mesh written: try `mesh-provisioner query needs --node alpha --state-dir {}`", state.display());
        }
    }

    let ticker = {
        let (current, backend, every) = (current.clone(), backend.clone(), args.registry_every);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            t.tick().await;
            loop {
                t.tick().await;
                reconcile(&current, &backend, limits).await;
            }
        })
    };

    let shutdown = async {
        let mut term = signal(SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {},
        }
        tracing::info!("shutting down");
    };
    let watcher = tokio::spawn(crate::reload::watch(
        args.component.clone(),
        runtime.clone(),
        current.clone(),
        state.join("components"),
        limits,
        backend.clone(),
    ));
    let served = crate::service::serve(client.clone(), backend, current, limits, shutdown).await;
    watcher.abort();
    ticker.abort();
    let _ = client.drain().await;
    if let Some(server) = embedded {
        server.stop().await;
    }
    served
}

/// Reads, compiles (or takes from the cache), type-checks and smoke-runs a component.
pub async fn load(runtime: &Runtime, path: &std::path::Path, state: &std::path::Path, limits: Limits) -> Result<Loaded> {
    let bytes = std::fs::read(path).map_err(|e| Error::new(ErrorKind::Config, format!("component {}: {e}", path.display())))?;
    let started = std::time::Instant::now();
    let loaded = crate::reload::prepare(runtime, &bytes, Some(&state.join("components")), limits).await?;
    tracing::info!(
        component = %path.display(),
        digest = loaded.guest.digest(),
        version = loaded.info.version,
        wit = loaded.info.wit_version,
        from_cache = loaded.guest.from_cache(),
        elapsed = ?started.elapsed(),
        "component loaded"
    );
    Ok(loaded)
}

/// One reconciliation of the registry, logged.
pub async fn reconcile(current: &Current, backend: &Arc<dyn Backend>, limits: Limits) {
    let limits = Limits { deadline: limits.deadline.max(RECONCILE_DEADLINE), ..limits };
    match current.get().guest.reconcile(backend.clone(), limits).await {
        Ok(Ok(r)) => tracing::info!(
            puts = ?r.puts, deletes = ?r.deletes, unchanged = r.unchanged.len(), conflicts = ?r.conflicts,
            writes = r.writes(), "registry reconciled"
        ),
        Ok(Err(e)) => tracing::warn!("registry reconcile failed: {e}"),
        Err(e) => tracing::warn!("the guest failed to reconcile: {e}"),
    }
}
