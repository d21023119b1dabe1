//! `serve --demo`: a small mesh written as the node clients and engines, the controller, the
//! indexer and a provider would, through the example config's own users, so that `query` shows
//! something real: one odd key, a planned module and one held on its kept plan.

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
    ("mesh-provisioner_needs", "beta.web.port.http", r#"{"placeholder":"${port:http}"}"#),
    ("mesh-provisioner_needs", "beta.web.config.base_url", r#"{"placeholder":"${config:base_url}"}"#),
    ("mesh-provisioner_applied", "beta.web", r#"{"build":"w3","needs":2,"at":"2026-11-29T10:01:00Z"}"#),
    ("mesh-provisioner_applied", "beta.metrics", r#"{"build":"m1","needs":0,"at":"2026-11-29T10:01:30Z"}"#),
    ("mesh-provisioner_collect", "beta.shell=3Azsh=3Anormal.web", r#"{"line":"export WEB_PORT=8080"}"#),
];
const GAMMA: Writes = &[
    ("mesh-provisioner_needs", "gamma.worker.secret.api_key", r#"{"placeholder":"${secret:api_key}"}"#),
    // Out of shape: `=3a` is a lower-case escape.
    ("mesh-provisioner_needs", "gamma.worker.config.queue=3aname", r#"{"placeholder":"${config:queue:name}"}"#),
];

pub async fn write(access: &Access) -> Result<()> {
    for (user, writes) in [("node-alpha", ALPHA), ("node-beta", BETA), ("node-gamma", GAMMA)] {
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
    Ok(())
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
    ("mesh-controller", "mesh-controller_assignments", "gamma.postgres", r#"{"want":"p1"}"#),
    ("node-gamma", "mesh-provisioner_applied", "gamma.postgres", r#"{"build":"p1","needs":0,"at":"2026-11-30T09:00:00Z"}"#),
];

async fn login(access: &Access, user: &str) -> Result<jetstream::Context> {
    let client = crate::nats::connect::embedded_options(access, user, "mesh-provisioner demo")
        .connect(&access.url)
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("demo: connecting as {user}: {e}")))?;
    Ok(crate::nats::connect::jetstream_of(client, user))
}

fn fail(user: &str, what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("demo: {user} writing {what}: {e}"))
}
