//! `serve --demo`: a small mesh written as the node clients and a provider would, through the
//! example config's own users, so that `query` shows something real, one odd key included.

use async_nats::jetstream;
use async_nats::ConnectOptions;

use crate::embedded::Access;
use crate::error::{Error, ErrorKind, Result};

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
    let js = login(access, "provider-postgres").await?;
    let bound = match js.get_key_value("postgres_bound").await {
        Ok(kv) => kv,
        Err(_) => js
            .create_key_value(jetstream::kv::Config { bucket: "postgres_bound".into(), ..Default::default() })
            .await
            .map_err(|e| fail("provider-postgres", "postgres_bound", &e))?,
    };
    bound
        .put("alpha.app.db", br#"{"host":"alpha","port":5432,"database":"app"}"#.to_vec().into())
        .await
        .map_err(|e| fail("provider-postgres", "alpha.app.db", &e))?;
    Ok(())
}

async fn login(access: &Access, user: &str) -> Result<jetstream::Context> {
    let password = access.password(user).unwrap_or_default().to_string();
    let client = ConnectOptions::with_user_and_password(user.into(), password)
        .connect(&access.url)
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("demo: connecting as {user}: {e}")))?;
    Ok(jetstream::new(client))
}

fn fail(user: &str, what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("demo: {user} writing {what}: {e}"))
}
