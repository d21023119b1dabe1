//! `serve`: load the component, reach the bus (or start the embedded one), open the buckets,
//! reconcile the registry at start and on a timer, and serve the verbs until a signal.
//!
//! [`run`] is its steps in order, each a function below: [`connect`], [`open`], [`start`] (the
//! tasks), [`serve_while_held`], [`shut_down`]. Everything it starts is stopped on the way out.

pub mod audit;
pub mod demo;
pub mod feed;
pub mod flags;
pub mod followers;
pub mod http;
pub mod inputs;
pub mod notices;
pub mod plans;
pub mod prune;
pub mod reconciler;
pub mod reload;
pub mod service;
pub mod shared;
pub mod states;

use std::sync::Arc;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::connect::{self, Login, OPERATOR_USER, PROVISIONER_USER, SERVICE_USER};
use crate::nats::embedded::{self, Access, Server};
use crate::nats::seat::Seat;
use crate::nats::NatsBackend;
use crate::runtime::current::Current;
use crate::runtime::{Limits, Runtime};
use crate::serve::flags::Serve;
use crate::serve::reconciler::Reconciler;
use crate::serve::shared::Shared;
use crate::store::backend::Backend;

pub async fn run(args: Serve) -> Result<()> {
    if args.seat_ttl < std::time::Duration::from_millis(500) {
        return Err(Error::new(ErrorKind::Config, "--seat-ttl must be at least 500ms"));
    }
    if args.guest_memory_total < args.guest_memory {
        return Err(Error::new(
            ErrorKind::Config,
            format!("--guest-memory-total ({} MiB) must hold at least one call's --guest-memory ({} MiB)", args.guest_memory_total, args.guest_memory),
        ));
    }
    let limits = Limits { deadline: args.guest_deadline, memory: (args.guest_memory as usize) << 20 };
    crate::base::files::private_dir(&args.connect.state_dir)?;
    let trust = match &args.trust_key {
        Some(k) => Some(crate::runtime::trust::TrustKey::parse(k)?.remembering(&args.connect.state_dir, args.allow_downgrade)),
        None => None,
    };
    let runtime = Runtime::with_options(crate::runtime::EngineOptions {
        reply_cache: !args.no_reply_cache,
        memory_total: (args.guest_memory_total as usize) << 20,
        // Half the calls in flight may wait for the mirrors; the rest answer what they hold.
        waiters: (args.max_in_flight as usize / 2).max(1),
        ..Default::default()
    })?;
    let cache = args.connect.state_dir.join("components");
    let current = Current::new(crate::runtime::component::load(&runtime, &args.component, Some(&cache), trust.as_ref(), limits).await?);

    // Bound before anything else runs, so a bad address stops the start with its reason.
    let http = match (&args.http, args.demo) {
        (Some(addr), _) => Some(crate::serve::http::bind(addr, PAGE).await?),
        (None, true) => Some(crate::serve::http::bind("127.0.0.1:0", PAGE).await?),
        (None, false) => None,
    };
    let probes = match &args.http_probes {
        Some(addr) => Some(crate::serve::http::bind(addr, "probes alone, /healthz, /readyz, /metrics").await?),
        None => None,
    };
    let (bus, embedded, reconnections) = connect(&args).await?;
    if let Some(server) = &embedded {
        // The embedded default is its own operator: every bucket of the example mesh made
        // with the safe settings before anything writes.
        let access = &server.access;
        let operator = connect::connect(&access.url, connect::embedded_options(access, OPERATOR_USER, "mesh-provisioner bootstrap")?).await?;
        let plan = crate::nats::mesh::Plan::of(&current.get().guest, &embedded::EXAMPLE_NODES, &embedded::EXAMPLE_PROVIDERS, args.buckets, limits).await?;
        let report = crate::nats::mesh::apply(&async_nats::jetstream::new(operator.clone()), &plan).await;
        let _ = operator.drain().await;
        report.log();
        report.result()?;
    }
    let options_for = |listener: &std::net::TcpListener| {
        let bound = listener.local_addr().map_err(|e| Error::new(ErrorKind::Config, format!("--http: {e}")))?;
        Ok::<_, Error>(crate::serve::http::HttpOptions::new(
            bound,
            &args.http_allow_hosts,
            args.http_header_timeout,
            args.http_request_timeout,
            args.http_max_connections as usize,
        ))
    };
    let http = http.map(|l| options_for(&l).map(|o| (l, o))).transpose()?;
    let probes = probes.map(|l| options_for(&l).map(|o| (l, o))).transpose()?;
    let http_side = http.is_some() || probes.is_some();
    if http_side {
        // Requests are counted from the first one on.
        crate::base::metrics::metrics().record();
    }
    let opened = open(&args, bus, current, limits).await?;
    let mut tasks = start(&args, &opened, reconnections, runtime, trust)?;
    let state = crate::serve::http::Http::new(opened.clone(), args.status_page_per_node);
    // The HTTP side on the followers' thread; `/healthz` follows the verbs' by a beat from here.
    let listening = (|| {
        let on = tasks.followers.handle();
        if let Some((listener, options)) = http {
            let listener = crate::serve::http::listen(listener, &on)?;
            tasks.handles.push(tasks.followers.spawn(crate::serve::http::serve(listener, state.clone(), options)));
        }
        if let Some((listener, options)) = probes {
            let listener = crate::serve::http::listen(listener, &on)?;
            tasks.handles.push(tasks.followers.spawn(crate::serve::http::serve_probes(listener, state.clone(), options)));
        }
        if http_side {
            tasks.handles.push(tokio::spawn(crate::serve::http::beat(state)));
        }
        Ok::<_, Error>(())
    })();
    let served = match listening {
        Ok(()) => serve_while_held(&args, &opened, &tasks, embedded.as_ref()).await,
        Err(e) => Err(e),
    };
    shut_down(tasks, &opened, embedded).await;
    served
}

/// What `--http` serves, as its log line says.
const PAGE: &str = "status page, /healthz, /readyz, /metrics";

/// The three connections to the bus: one for the buckets (mirrors, writes, discovery), one for
/// the seat alone, and one that only serves the verbs, as its own user when one is given (`--service-*`; the
/// embedded default's `mesh-provisioner-service`), whose grant is nothing but replies.
///
/// Why two: the serving user may then publish nothing but a reply, and the buckets' user needs
/// no `allow_responses`. And `nats-server` tracks, per connection of a user with
/// `allow_responses`, every reply subject delivered to it, and prunes that table by walking it
/// whole. Every message a mirror's consumer delivers carries a reply subject (`$JS.ACK…`) that
/// is never answered, so on one shared connection a replay of a million keys left a million
/// entries that every request then paid for (the server's CPU went to `pruneReplyPerms`; the
/// figures are in docs/performance.md). The serving connection only ever holds requests it
/// answers.
///
/// Why the seat apart: its renewals must not wait behind a mirror's replay, and a connection
/// that reads what nodes wrote can be cut by it (a reader bug, a slow consumer); the seat's
/// connection reads nothing but the seat's own replies.
struct Bus {
    client: async_nats::Client,
    seat: async_nats::Client,
    service: async_nats::Client,
}

/// Reaches the bus named by `--nats-url`, or starts the embedded `nats-server` (recording how to
/// reach it in the state directory). Also returns a counter bumped on every (re)connection of
/// the buckets' connection.
async fn connect(args: &Serve) -> Result<(Bus, Option<Server>, watch::Receiver<u64>)> {
    let state = &args.connect.state_dir;
    let (events_tx, events) = watch::channel(0u64);
    let on_event = move |event: async_nats::Event| {
        let tx = events_tx.clone();
        async move {
            if let async_nats::Event::Connected = event {
                tx.send_modify(|n| *n += 1);
            }
            on_connection_event("buckets", event);
        }
    };
    let on_seat_event = |event: async_nats::Event| async move { on_connection_event("seat", event) };
    let on_server_error = |event: async_nats::Event| async move { on_connection_event("serving", event) };
    if let Some(url) = &args.connect.nats_url {
        if args.demo {
            return Err(Error::new(ErrorKind::Config, "--demo writes as the example config's node users: it needs the embedded server (no --nats-url)"));
        }
        let client = connect::connect(
            url,
            connect::options(&args.connect, "mesh-provisioner").await?.subscription_capacity(crate::nats::SUBSCRIPTION_CAPACITY).event_callback(on_event),
        )
        .await?;
        let seat = connect::connect(url, connect::options(&args.connect, "mesh-provisioner-seat").await?.event_callback(on_seat_event)).await?;
        let service_options = match Login::of_service(&args.service)? {
            Some(login) => {
                let inbox = login.inbox(SERVICE_USER);
                connect::options_for(&args.connect, login, &inbox, "mesh-provisioner-service").await?
            }
            None => {
                tracing::warn!("the verbs are served as the buckets' user: give --service-user (or --service-creds, --service-nkey) for a user that may publish nothing but replies");
                connect::options(&args.connect, "mesh-provisioner-service").await?
            }
        };
        let service = connect::connect(url, service_options.event_callback(on_server_error)).await?;
        return Ok((Bus { client, seat, service }, None, events));
    }
    let dir = state.join("nats");
    // Keep the passwords of an earlier run, so its data stays reachable.
    let server = if args.operator {
        // The keys are kept under the state directory: a restart signs with the same ones.
        Server::start_operator(&dir, args.embedded_port, "").await?
    } else {
        let passwords = Access::load(state).ok().map(|a| a.passwords);
        Server::start(&dir, args.embedded_port, passwords).await?
    };
    let access = server.access.clone();
    let text = serde_json::to_vec_pretty(&access).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    crate::base::files::write_private(&Access::path(state), &text).map_err(|e| Error::new(ErrorKind::Config, format!("recording the embedded server: {e}")))?;
    tracing::info!(
        url = %access.url,
        user = PROVISIONER_USER,
        credentials = %Access::path(state).display(),
        "embedded nats-server started; `mesh-provisioner query --state-dir {}` reaches it",
        state.display()
    );
    let client = connect::connect(
        &access.url,
        connect::embedded_options(&access, PROVISIONER_USER, "mesh-provisioner")?
            .subscription_capacity(crate::nats::SUBSCRIPTION_CAPACITY)
            .event_callback(on_event),
    )
    .await?;
    let seat =
        connect::connect(&access.url, connect::embedded_options(&access, PROVISIONER_USER, "mesh-provisioner-seat")?.event_callback(on_seat_event)).await?;
    let service =
        connect::connect(&access.url, connect::embedded_options(&access, SERVICE_USER, "mesh-provisioner-service")?.event_callback(on_server_error)).await?;
    Ok((Bus { client, seat, service }, Some(server), events))
}

/// What each connection tells: a refusal (a permission violation, say) is the operator's to
/// see, and every loss of a connection is counted.
fn on_connection_event(connection: &'static str, event: async_nats::Event) {
    match event {
        async_nats::Event::ServerError(e) => tracing::warn!(connection, "the server said: {e}"),
        async_nats::Event::Disconnected => {
            tracing::warn!(connection, "disconnected from the bus");
            crate::base::metrics::metrics().bus_disconnect(connection);
        }
        async_nats::Event::ClientError(e) => tracing::warn!(connection, "bus client error: {e}"),
        _ => {}
    }
}

/// Opens the buckets and the seat, and warms the mirrors a standby keeps in sync.
async fn open(args: &Serve, bus: Bus, current: Arc<Current>, limits: Limits) -> Result<Shared> {
    let Bus { client, seat, service } = bus;
    let kept = crate::store::kept::KeptPlans::files(args.connect.state_dir.join("plans")).with_per_node(args.kept_plans_per_node);
    let options = crate::nats::BackendOptions {
        replicas: args.buckets.replicas as usize,
        limits: args.buckets.limits(),
        mirror_budget: usize::try_from(args.mirror_budget_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        quota: crate::store::mirror::Quota { keys: args.node_quota_keys, bytes: args.node_quota_mib.saturating_mul(1 << 20) },
    };
    crate::base::metrics::metrics().mirrors_budget.set(i64::try_from(options.mirror_budget).unwrap_or(i64::MAX));
    let nats = NatsBackend::open(client.clone(), options, kept).await?;
    if !args.no_snapshots {
        nats.resume_from(crate::store::snapshot::Snapshots::new(args.connect.state_dir.join("mirrors")));
    }
    nats.follow_creations().await;
    let backend: Arc<dyn Backend> = nats.clone();
    let instance = match &args.instance {
        Some(i) => i.clone(),
        None => default_instance()?,
    };
    let seat = Seat::open(&async_nats::jetstream::new(seat), args.seat_ttl, args.buckets.replicas as usize, instance).await?;
    nats.gate_writes(seat.clone());
    // A standby keeps its mirrors warm so that taking over is quick.
    for bucket in crate::nats::WARM_BUCKETS {
        if let Err(e) = backend.mirror(bucket).await {
            tracing::warn!(bucket, "mirror not in sync yet: {e}");
        }
    }
    Ok(Shared { client, service, nats, backend, seat, current, limits, feed: Default::default() })
}

/// The tasks that run while the process does, and how to stop them.
struct Tasks {
    reconciler: Reconciler,
    audits: Arc<crate::serve::audit::Counts>,
    stop: watch::Receiver<bool>,
    handles: Vec<JoinHandle<()>>,
    /// Where plans, module states, notices and the HTTP side run (its thread ends
    /// when it is dropped).
    followers: crate::serve::followers::Followers,
}

/// Starts the seat's renewals, the reconciler, plans, notices, the reconnect handler, the
/// registry timer, the component watcher and the signal handler. Plans, module states and
/// notices run on a thread of their own ([`followers`]; `run` puts the HTTP side there too): the
/// verbs never wait behind them on one thread.
fn start(args: &Serve, o: &Shared, mut reconnections: watch::Receiver<u64>, runtime: Runtime, trust: Option<crate::runtime::trust::TrustKey>) -> Result<Tasks> {
    let followers = crate::serve::followers::Followers::start()?;
    let mut handles = Vec::new();
    handles.push(tokio::spawn(o.seat.clone().run()));
    let (reconciler, reconciling) = Reconciler::start(o);
    handles.push(reconciling);
    handles.push(followers.spawn(inputs::follow(o.clone(), crate::serve::plans::Plans::new(o))));
    handles.push(tokio::spawn(crate::serve::prune::Pruner::new(o.clone(), args.connect.state_dir.clone(), args.kept_plan_grace).run()));
    handles.push(followers.spawn(inputs::follow(o.clone(), crate::serve::notices::Notifier::new(o.clone()))));
    handles.push(followers.spawn(inputs::follow(o.clone(), crate::serve::states::Recorder::new(o.clone(), args.state_sweep_every))));

    let (stop_tx, stop) = watch::channel(false);
    handles.push(tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {},
        }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    }));

    if let Some(snapshots) = o.nats.snapshots() {
        handles.push(tokio::spawn(crate::store::snapshot::Keeper::new(o.backend.clone(), snapshots.clone()).run(args.snapshot_every)));
    }
    let audits = Arc::new(crate::serve::audit::Counts::default());
    handles.push(tokio::spawn(
        crate::serve::audit::Auditor { shared: o.clone(), reconciler: reconciler.clone(), every: args.audit_every, counts: audits.clone() }
            .run(reconnections.clone()),
    ));
    // After a reconnect: mirrors replay, and the holder reconciles the registry.
    let (nats, r) = (o.nats.clone(), reconciler.clone());
    handles.push(tokio::spawn(async move {
        while reconnections.changed().await.is_ok() {
            // The first connection is not a reconnection.
            if *reconnections.borrow_and_update() < 2 {
                continue;
            }
            tracing::info!("reconnected to the bus: resyncing mirrors");
            nats.resync();
            r.request("reconnected");
        }
    }));

    let (r, every) = (reconciler.clone(), args.registry_every);
    handles.push(tokio::spawn(async move {
        let mut t = tokio::time::interval(every);
        t.tick().await;
        loop {
            t.tick().await;
            r.request("timer");
        }
    }));
    handles.push(tokio::spawn(
        crate::serve::reload::Reloader {
            shared: o.clone(),
            path: args.component.clone(),
            runtime,
            cache: args.connect.state_dir.join("components"),
            reconciler: reconciler.clone(),
            poll: !args.no_watch,
            trust,
        }
        .watch(),
    ));
    Ok(Tasks { reconciler, audits, stop, handles, followers })
}

/// Stands by while another instance holds the seat; while this one holds it, reconciles at once
/// and serves the verbs until the seat is lost or a signal stops the process.
async fn serve_while_held(args: &Serve, o: &Shared, tasks: &Tasks, embedded: Option<&Server>) -> Result<()> {
    let mut demo_done = !args.demo;
    let mut held = o.seat.subscribe();
    let mut stopping = tasks.stop.clone();
    loop {
        if *stopping.borrow() {
            return Ok(());
        }
        if !*held.borrow_and_update() {
            tracing::info!(instance = o.seat.instance(), "standing by: mirrors warm, component compiled");
            tokio::select! {
                _ = held.changed() => continue,
                _ = stopping.changed() => continue,
            }
        }
        // Holding the seat: reconcile at once, then serve until the seat is lost or we stop.
        let asked = tasks.reconciler.request("took the seat");
        tokio::select! {
            _ = tasks.reconciler.finished(asked) => {},
            _ = stopping.changed() => continue,
        }
        if !demo_done {
            if let Some(server) = embedded {
                crate::serve::demo::write(&server.access).await?;
                tracing::info!("demo mesh written: try `mesh-provisioner query status --watch --state-dir {}`", args.connect.state_dir.display());
                tokio::spawn(crate::serve::demo::story(server.access.clone(), args.demo_every, tasks.stop.clone()));
            }
            demo_done = true;
        }
        let (mut lost, mut stop_now) = (o.seat.subscribe(), tasks.stop.clone());
        let until = async move {
            tokio::select! {
                _ = async { while *lost.borrow_and_update() { if lost.changed().await.is_err() { break } } } => {},
                _ = async { while !*stop_now.borrow_and_update() { if stop_now.changed().await.is_err() { break } } } => {},
            }
        };
        let serving = crate::serve::service::Serving { shared: o.clone(), max_in_flight: args.max_in_flight as usize, audits: tasks.audits.clone() };
        crate::serve::service::serve(serving, until).await?;
    }
}

/// Stops every task, gives the seat up (so a standby takes over at once), drains the
/// connection and stops the embedded server.
async fn shut_down(mut tasks: Tasks, o: &Shared, embedded: Option<Server>) {
    for t in &tasks.handles {
        t.abort();
    }
    // Stopped, not only told to: a follower on its own thread may be between its check of the
    // seat and a publish, which must not land after the seat is given up (a standby takes it
    // at once). An abort lands at the task's next yield, within a guest call's tick.
    let stopped = futures::future::join_all(tasks.handles.iter_mut());
    let _ = tokio::time::timeout(crate::nats::bucket::BUS_DEADLINE, stopped).await;
    o.seat.release().await;
    // After the seat is given up (a standby need not wait for it): the next start resumes here.
    if let Some(snapshots) = o.nats.snapshots() {
        let started = std::time::Instant::now();
        let written = crate::store::snapshot::Keeper::new(o.backend.clone(), snapshots.clone()).save_all().await;
        tracing::info!(written, elapsed = ?started.elapsed(), "mirror snapshots written");
    }
    // A server that hangs must not hold the process at its exit.
    let _ = tokio::time::timeout(crate::nats::bucket::BUS_DEADLINE, async { tokio::join!(o.service.drain(), o.client.drain()) }).await;
    if let Some(server) = embedded {
        server.stop().await;
    }
}

/// `host-pid-tag`: unique per process, readable in the lease.
fn default_instance() -> Result<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "host".into());
    let tag: String = crate::base::random::random_password()?.chars().take(6).collect();
    Ok(format!("{}-{}-{tag}", host.trim(), std::process::id()))
}
