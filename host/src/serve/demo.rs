//! `serve --demo`: a small mesh written as the node clients and engines, the controller, the
//! indexer, the config service and a provider would, through the example config's own users, so
//! that `query` and the page show something real: a module in each state of SPEC §7.1 (each
//! state held by one module for good), one odd key, a planned module and one held on its kept
//! plan, and a rotation in progress.
//!
//! Then the mesh moves on by itself ([`story`]): the provider is applied, the rotated value's
//! holder catches up, and every half minute the value is rotated again and caught up with, so
//! the page's event stream and `query status --watch` show changes.

use async_nats::jetstream;

use crate::base::error::{Error, ErrorKind, Result};
use crate::nats::embedded::Access;

type Writes = &'static [(&'static str, &'static str, &'static str)];

const ALPHA: Writes = &[
    ("mesh-provisioner_needs", "alpha.app.config.db=2Eurl", r#"{"placeholder":"${config:db.url}","part":"api"}"#),
    ("mesh-provisioner_needs", "alpha.app.secret.db_password", r#"{"placeholder":"${secret:db_password}","part":"api"}"#),
    ("mesh-provisioner_needs", "alpha.app.bound.postgres=2Edb", r#"{"placeholder":"${bound:postgres.db}"}"#),
    ("mesh-provisioner_needs", "alpha.app.dir.state", r#"{"placeholder":"${dir:state}"}"#),
    ("mesh-provisioner_applied", "alpha.app", r#"{"build":"b7","needs":4,"at":"2026-11-29T10:00:00Z"}"#),
    ("mesh-provisioner_collect", "alpha.shell=3Azsh=3Anormal.app", r#"{"line":"export APP_HOME=/opt/app"}"#),
];
const BETA: Writes = &[
    // Waits for postgres, assigned to gamma and not applied there yet: pending, until the story
    // applies it.
    ("mesh-provisioner_needs", "beta.cache.bound.postgres=2Ecache", r#"{"placeholder":"${bound:postgres.cache}"}"#),
    // Waits for redis, assigned to gamma and never applied: pending for good.
    ("mesh-provisioner_needs", "beta.queue.bound.redis=2Equeue", r#"{"placeholder":"${bound:redis.queue}"}"#),
    ("mesh-provisioner_needs", "beta.api.config.api_url", r#"{"placeholder":"${config:api_url}"}"#),
    ("mesh-provisioner_needs", "beta.web.port.http", r#"{"placeholder":"${port:http}"}"#),
    ("mesh-provisioner_needs", "beta.web.config.base_url", r#"{"placeholder":"${config:base_url}"}"#),
    ("mesh-provisioner_applied", "beta.web", r#"{"build":"w3","needs":2,"at":"2026-11-29T10:01:00Z"}"#),
    ("mesh-provisioner_applied", "beta.metrics", r#"{"build":"m1","needs":0,"at":"2026-11-29T10:01:30Z"}"#),
    ("mesh-provisioner_collect", "beta.shell=3Azsh=3Anormal.web", r#"{"line":"export WEB_PORT=8080"}"#),
];
const ALPHA_CRON: Writes = &[("mesh-provisioner_needs", "alpha.cron.config.schedule", r#"{"placeholder":"${config:schedule}"}"#)];
const GAMMA: Writes = &[
    ("mesh-provisioner_needs", "gamma.api.config.api_url", r#"{"placeholder":"${config:api_url}"}"#),
    ("mesh-provisioner_needs", "gamma.worker.secret.api_key", r#"{"placeholder":"${secret:api_key}"}"#),
    // Out of shape: `=3a` is a lower-case escape.
    ("mesh-provisioner_needs", "gamma.worker.config.queue=3aname", r#"{"placeholder":"${config:queue:name}"}"#),
];

pub async fn write(access: &Access) -> Result<()> {
    for (user, writes) in [("node-alpha", ALPHA), ("node-alpha", ALPHA_CRON), ("node-beta", BETA), ("node-gamma", GAMMA)] {
        let js = login(access, user).await?;
        for (bucket, key, value) in writes {
            let kv = js.get_key_value(*bucket).await.map_err(|e| fail(user, bucket, &e))?;
            kv.put(*key, value.as_bytes().to_vec().into()).await.map_err(|e| fail(user, key, &e))?;
        }
    }
    for (i, (user, bucket, key, value)) in OWNED.iter().enumerate() {
        if i + 1 == OWNED.len() {
            // Give the plans a moment to follow (and keep beta's w3) before its want moves on.
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        // The embedded default's `bootstrap` made every bucket: a writer only writes.
        let js = login(access, user).await?;
        let kv = js.get_key_value(*bucket).await.map_err(|e| fail(user, bucket, &e))?;
        kv.put(*key, value.as_bytes().to_vec().into()).await.map_err(|e| fail(user, key, &e))?;
    }
    values(access).await
}

/// Writes into buckets their writer owns: a provider's bound values, the node
/// engines' compositions, the controller's wants, the indexer's newest builds. Beta's web is
/// wanted at a refused build last, so it is held on the plan kept from w3 (its have).
const OWNED: &[(&str, &str, &str, &str)] = &[
    ("provider-postgres", "postgres_bound", "alpha.app.db", r#"{"host":"alpha","port":5432,"database":"app"}"#),
    (
        "node-alpha",
        "composed-alpha",
        "app.b7",
        r#"{"state":"published","plan":{"parts":["api"],"needs":[{"kind":"config","name":"db.url","part":"api"},{"kind":"secret","name":"db_password","part":"api"},{"kind":"bound","name":"postgres.db","part":"api"},{"kind":"dir","name":"state","part":"api"}],"dirs":[{"name":"state","unknown_files":"keep"}]}}"#,
    ),
    (
        "node-beta",
        "composed-beta",
        "web.w3",
        r#"{"state":"published","plan":{"parts":["site"],"needs":[{"kind":"port","name":"http","part":"site"},{"kind":"config","name":"base_url","part":"site"}],"dirs":[]}}"#,
    ),
    ("node-beta", "composed-beta", "web.w4", r#"{"state":"refused","reason":"part `site` declares ${port:http} twice"}"#),
    ("mesh-controller", "mesh-controller_assignments", "alpha.app", r#"{"want":"b7"}"#),
    ("mesh-indexer", "mesh-indexer_builds", "app", r#"{"newest":"b7"}"#),
    ("mesh-controller", "mesh-controller_assignments", "beta.web", r#"{"want":"w4"}"#),
    // The provider of alpha/app's bound value runs on gamma (SPEC §7.3).
    // Applied by the story, a little later.
    ("mesh-controller", "mesh-controller_assignments", "gamma.postgres", r#"{"want":"p1"}"#),
    // Assigned, and nothing of it recorded: never ran.
    ("mesh-controller", "mesh-controller_assignments", "gamma.batch", r#"{"want":"k1"}"#),
    ("mesh-controller", "mesh-controller_assignments", "gamma.redis", r#"{"want":"r1"}"#),
];

/// Writes `value` as the config service at `<node>.<module>.<name>`: its revision.
async fn rotate(access: &Access, node: &str, module: &str, name: &str, value: &str) -> Result<u64> {
    let config = login(access, "mesh-config").await?;
    let kv = config.get_key_value("mesh-config_values").await.map_err(|e| fail("mesh-config", "mesh-config_values", &e))?;
    let key = format!("{node}.{module}.{name}");
    kv.put(key.as_str(), value.as_bytes().to_vec().into()).await.map_err(|e| fail("mesh-config", &key, &e))
}

/// The revision of the value at `<node>.<module>.<name>` now.
async fn revision(access: &Access, node: &str, module: &str, name: &str) -> Result<u64> {
    let config = login(access, "mesh-config").await?;
    let kv = config.get_key_value("mesh-config_values").await.map_err(|e| fail("mesh-config", "mesh-config_values", &e))?;
    let key = format!("{node}.{module}.{name}");
    match kv.entry(key.as_str()).await.map_err(|e| fail("mesh-config", &key, &e))? {
        Some(e) => Ok(e.revision),
        None => Err(fail("mesh-config", &key, &"the value is gone")),
    }
}

/// Writes the applied record of `<node>.<module>` at `build`, having applied the value `name`
/// at `revision` (what a node's client writes once it ran it).
async fn apply(access: &Access, node: &str, module: &str, name: &str, revision: u64, build: &str) -> Result<()> {
    let at = crate::base::wire::rfc3339(std::time::SystemTime::now());
    let record = serde_json::json!({"build": build, "needs": 1, "values": {format!("config:{name}"): revision}, "at": at});
    put(access, &format!("node-{node}"), "mesh-provisioner_applied", &format!("{node}.{module}"), &record.to_string()).await
}

/// The values of the demo and their holders: alpha/cron applied; beta/api and gamma/api
/// applied at their value's first revision, and the values rotated since (a rotation in
/// progress: beta/api catches up in the story, gamma/api never does).
async fn values(access: &Access) -> Result<()> {
    let r = rotate(access, "gamma", "api", "api_url", "\"https://api.internal/v1\"").await?;
    apply(access, "gamma", "api", "api_url", r, "a1").await?;
    rotate(access, "gamma", "api", "api_url", "\"https://api.internal/v2\"").await?;
    let r = rotate(access, "alpha", "cron", "schedule", "\"*/5 * * * *\"").await?;
    apply(access, "alpha", "cron", "schedule", r, "c1").await?;
    let r = rotate(access, "beta", "api", "api_url", "\"https://api.internal/v1\"").await?;
    apply(access, "beta", "api", "api_url", r, "a1").await?;
    rotate(access, "beta", "api", "api_url", "\"https://api.internal/v2\"").await.map(drop)
}

/// The mesh moving on by itself, a step `every` so long, until `stop`: postgres applied on gamma (and its bound value
/// written for beta/cache, which then applies), beta/api catching up with its rotated value,
/// then a rotation of it every two steps and its catching up. A failed write is logged, and
/// the story ends: the server goes on.
pub async fn story(access: Access, every: std::time::Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
    tokio::select! {
        r = steps(&access, every) => if let Err(e) = r { tracing::warn!(error = %e, "demo: the story stopped") },
        _ = async { while !*stop.borrow_and_update() { if stop.changed().await.is_err() { break } } } => {},
    }
}

async fn steps(access: &Access, every: std::time::Duration) -> Result<()> {
    tokio::time::sleep(every).await;
    put(access, "node-gamma", "mesh-provisioner_applied", "gamma.postgres", r#"{"build":"p1","needs":0}"#).await?;
    put(access, "provider-postgres", "postgres_bound", "beta.cache.cache", r#"{"host":"gamma","port":5432,"database":"cache"}"#).await?;
    put(access, "node-beta", "mesh-provisioner_applied", "beta.cache", r#"{"build":"k7","needs":1}"#).await?;
    tracing::info!("demo: postgres applied on gamma; beta/cache applied");
    let mut round = 2u64;
    loop {
        tokio::time::sleep(every).await;
        apply(access, "beta", "api", "api_url", revision(access, "beta", "api", "api_url").await?, "a1").await?;
        tracing::info!(round, "demo: beta/api caught up with its rotated value");
        tokio::time::sleep(every).await;
        round += 1;
        rotate(access, "beta", "api", "api_url", &format!("\"https://api.internal/v{round}\"")).await?;
        tracing::info!(round, "demo: api_url rotated; beta/api holds the old one");
    }
}

async fn put(access: &Access, user: &str, bucket: &str, key: &str, value: &str) -> Result<()> {
    let js = login(access, user).await?;
    let kv = js.get_key_value(bucket).await.map_err(|e| fail(user, bucket, &e))?;
    kv.put(key, value.as_bytes().to_vec().into()).await.map_err(|e| fail(user, key, &e))?;
    Ok(())
}

async fn login(access: &Access, user: &str) -> Result<jetstream::Context> {
    let client = crate::nats::connect::embedded_options(access, user, "mesh-provisioner demo")?
        .connect(&access.url)
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("demo: connecting as {user}: {e}")))?;
    Ok(crate::nats::connect::jetstream_of(client, user))
}

fn fail(user: &str, what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("demo: {user} writing {what}: {e}"))
}
