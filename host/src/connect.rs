//! Connecting to the bus as the provisioner's account: creds file, nkey, user and password or
//! token, with TLS options; or, with no URL, to the embedded server recorded in the state dir.

use std::time::Duration;

use async_nats::{Client, ConnectOptions};

use crate::cli::Connect;
use crate::embedded::Access;
use crate::error::{Error, ErrorKind, Result};

/// The name the provisioner's own user has in the example config.
pub const PROVISIONER_USER: &str = "mesh-provisioner";

/// Builds connect options from the flags.
pub async fn options(c: &Connect, name: &str) -> Result<ConnectOptions> {
    let config = |what: &str, e: &dyn std::fmt::Display| Error::new(ErrorKind::Config, format!("{what}: {e}"));
    let mut o = match (&c.creds, &c.nkey, &c.user, &c.token) {
        (Some(path), None, None, None) => ConnectOptions::with_credentials_file(path).await.map_err(|e| config(&format!("creds file {}", path.display()), &e))?,
        (None, Some(path), None, None) => {
            let seed = std::fs::read_to_string(path).map_err(|e| config(&format!("nkey file {}", path.display()), &e))?;
            ConnectOptions::with_nkey(seed.trim().to_string())
        }
        (None, None, Some(user), None) => ConnectOptions::with_user_and_password(user.clone(), c.password.clone().unwrap_or_default()),
        (None, None, None, Some(token)) => ConnectOptions::with_token(token.clone()),
        (None, None, None, None) => ConnectOptions::new(),
        _ => return Err(Error::new(ErrorKind::Config, "give at most one of --creds, --nkey, --user/--password, --token")),
    };
    if let Some(ca) = &c.tls_ca {
        o = o.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&c.tls_cert, &c.tls_key) {
        o = o.add_client_certificate(cert.clone(), key.clone());
    }
    if c.tls_required {
        o = o.require_tls(true);
    }
    Ok(o.name(name).connection_timeout(Duration::from_secs(5)))
}

/// Connects to `url` (a comma-separated list for a cluster) with `options`.
pub async fn connect(url: &str, options: ConnectOptions) -> Result<Client> {
    let urls: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    options
        .connect(urls.as_slice())
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("connecting to {url}: {e}")))
}

/// Connects as the flags say, or to the embedded server as the provisioner's user.
pub async fn connect_cli(c: &Connect, name: &str) -> Result<Client> {
    match &c.nats_url {
        Some(url) => connect(url, options(c, name).await?).await,
        None => {
            let access = Access::load(&c.state_dir)?;
            let password = access
                .password(PROVISIONER_USER)
                .ok_or_else(|| Error::new(ErrorKind::Config, "the embedded server record has no provisioner password"))?;
            let o = ConnectOptions::with_user_and_password(PROVISIONER_USER.into(), password.into()).name(name);
            connect(&access.url, o).await
        }
    }
}
