//! `serve`: load the component, reach the bus (or start the embedded one), open the buckets,
//! reconcile the registry at start and on a timer, and serve the verbs until a signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::backend::Backend;
use crate::cli::Serve;
use crate::connect::{self, PROVISIONER_USER};
use crate::current::{Current, Loaded};
use crate::embedded::{self, Access, Server};
use crate::error::{Error, ErrorKind, Result};
use crate::nats::NatsBackend;
use crate::reconciler::Reconciler;
use crate::runtime::{Limits, Runtime};
use crate::seat::Seat;

pub async fn run(args: Serve) -> Result<()> {
    if args.seat_ttl < Duration::from_millis(500) {
        return Err(Error::new(ErrorKind::Config, "--seat-ttl must be at least 500ms"));
    }
    let limits = Limits { deadline: args.guest_deadline, memory: (args.guest_memory as usize) << 20 };
    let state = &args.connect.state_dir;
    crate::trust::private_dir(state)?;
    let trust = match &args.trust_key {
        Some(k) => Some(crate::trust::TrustKey::parse(k)?),
        None => None,
    };

    let runtime = Runtime::new()?;
    let current = Current::new(load(&runtime, &args.component, Some(&state.join("components")), trust.as_ref(), limits).await?);

    let mut embedded: Option<Server> = None;
    // Every (re)connection to the bus after the first bumps this.
    let (events_tx, events) = watch::channel(0u64);
    let on_event = move |event: async_nats::Event| {
        let tx = events_tx.clone();
        async move {
            match event {
                async_nats::Event::Connected => tx.send_modify(|n| *n += 1),
                // A refusal (a permission violation, say) is the operator's to see.
                async_nats::Event::ServerError(e) => tracing::warn!("the server said: {e}"),
                _ => {}
            }
        }
    };
    let client = match &args.connect.nats_url {
        Some(url) => {
            if args.demo {
                return Err(Error::new(ErrorKind::Config, "--demo writes as the example config's node users: it needs the embedded server (no --nats-url)"));
            }
            connect::connect(url, connect::options(&args.connect, "mesh-provisioner").await?.event_callback(on_event)).await?
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
            let o = async_nats::ConnectOptions::with_user_and_password(PROVISIONER_USER.into(), password)
                .name("mesh-provisioner")
                .event_callback(on_event);
            embedded = Some(server);
            connect::connect(&access.url, o).await?
        }
    };

    let kept = crate::kept::KeptPlans::files(state.join("plans"));
    let nats = NatsBackend::open(client.clone(), args.replicas as usize, kept).await?;
    nats.follow_creations().await;
    let backend: Arc<dyn Backend> = nats.clone();
    let instance = match &args.instance {
        Some(i) => i.clone(),
        None => default_instance()?,
    };
    let seat = Seat::open(nats.jetstream(), args.seat_ttl, args.replicas as usize, instance).await?;
    nats.gate_writes(seat.clone());
    // A standby keeps its mirrors warm so that taking over is quick.
    for bucket in [crate::backend::REGISTRY_BUCKET].into_iter().chain(crate::nats::CLIENT_BUCKETS) {
        if let Err(e) = backend.mirror(bucket).await {
            tracing::warn!(bucket, "mirror not in sync yet: {e}");
        }
    }
    let seat_task = tokio::spawn(seat.clone().run());
    let (reconciler, reconciling) = Reconciler::start(current.clone(), backend.clone(), seat.clone(), limits);
    let plans = tokio::spawn(crate::plans::follow(current.clone(), backend.clone(), nats.changes().clone(), limits));
    let notices = tokio::spawn(
        crate::notices::Notifier {
            client: client.clone(),
            nats: nats.clone(),
            backend: backend.clone(),
            current: current.clone(),
            events: nats.events().clone(),
            plan_inputs: nats.changes().clone(),
            seat: seat.clone(),
            limits,
        }
        .run(),
    );

    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {},
        }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });

    // After a reconnect: mirrors replay, and the holder reconciles the registry.
    let reconnects = {
        let (nats, reconciler) = (nats.clone(), reconciler.clone());
        let mut events = events;
        tokio::spawn(async move {
            while events.changed().await.is_ok() {
                // The first connection is not a reconnection.
                if *events.borrow_and_update() < 2 {
                    continue;
                }
                tracing::info!("reconnected to the bus: resyncing mirrors");
                nats.resync();
                reconciler.request("reconnected");
            }
        })
    };

    let ticker = {
        let (reconciler, every) = (reconciler.clone(), args.registry_every);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            t.tick().await;
            loop {
                t.tick().await;
                reconciler.request("timer");
            }
        })
    };
    let watcher = tokio::spawn(
        crate::reload::Reloader {
            path: args.component.clone(),
            runtime: runtime.clone(),
            current: current.clone(),
            cache: state.join("components"),
            limits,
            reconciler: reconciler.clone(),
            poll: !args.no_watch,
            trust,
        }
        .watch(),
    );

    let mut demo_done = !args.demo;
    let mut held = seat.subscribe();
    let mut stopping = stop.clone();
    let served = loop {
        if *stopping.borrow() {
            break Ok(());
        }
        if !*held.borrow_and_update() {
            tracing::info!(instance = seat.instance(), "standing by: mirrors warm, component compiled");
            tokio::select! {
                _ = held.changed() => continue,
                _ = stopping.changed() => continue,
            }
        }
        // Holding the seat: reconcile at once, then serve until the seat is lost or we stop.
        let asked = reconciler.request("took the seat");
        tokio::select! {
            _ = reconciler.finished(asked) => {},
            _ = stopping.changed() => continue,
        }
        if !demo_done {
            if let Some(server) = &embedded {
                crate::demo::write(&server.access).await?;
                tracing::info!("demo mesh written: try `mesh-provisioner query needs --node alpha --state-dir {}`", state.display());
            }
            demo_done = true;
        }
        let (mut lost, mut stop_now) = (seat.subscribe(), stop.clone());
        let until = async move {
            tokio::select! {
                _ = async { while *lost.borrow_and_update() { if lost.changed().await.is_err() { break } } } => {},
                _ = async { while !*stop_now.borrow_and_update() { if stop_now.changed().await.is_err() { break } } } => {},
            }
        };
        if let Err(e) = crate::service::serve(client.clone(), backend.clone(), current.clone(), Some(seat.clone()), limits, args.max_in_flight as usize, until).await {
            break Err(e);
        }
    };
    watcher.abort();
    plans.abort();
    notices.abort();
    ticker.abort();
    reconciling.abort();
    reconnects.abort();
    seat_task.abort();
    seat.release().await;
    let _ = client.drain().await;
    if let Some(server) = embedded {
        server.stop().await;
    }
    served
}

/// `host-pid-tag`: unique per process, readable in the lease.
fn default_instance() -> Result<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "host".into());
    let tag: String = crate::embedded::random_password()?.chars().take(6).collect();
    Ok(format!("{}-{}-{tag}", host.trim(), std::process::id()))
}

/// Reads (as trusted code: see [`crate::trust`]), compiles (or takes from `cache`),
/// type-checks and smoke-runs a component.
pub async fn load(runtime: &Runtime, path: &std::path::Path, cache: Option<&std::path::Path>, trust: Option<&crate::trust::TrustKey>, limits: Limits) -> Result<Loaded> {
    let bytes = crate::trust::read_component(path, trust)?;
    let started = std::time::Instant::now();
    let loaded = crate::reload::prepare(runtime, &bytes, cache, limits).await?;
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
