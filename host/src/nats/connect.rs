//! Connecting to the bus: creds file, nkey, user and password or token, with TLS options and
//! the client's own inbox prefix; or, with no URL, to the embedded server recorded in the state
//! directory.
//!
//! Every connection sets its inbox prefix (`_INBOX_<user>` unless told otherwise): the example
//! config lets each user subscribe only under its own, so no user hears another's replies or the
//! provisioner's mirror deliveries.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::{Client, ConnectOptions};
use clap::Args;

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::flags::default_state_dir;
use crate::nats::embedded::Access;

/// The name the provisioner's own user has in the example config.
pub const PROVISIONER_USER: &str = "mesh-provisioner";
/// The user that serves the verbs in the example config.
pub const SERVICE_USER: &str = "mesh-provisioner-service";
/// The operator, who makes the streams (`bootstrap`), in the example config.
pub const OPERATOR_USER: &str = "mesh-operator";

/// One way to log in; passwords and tokens read from their files here.
#[derive(Clone)]
pub enum Login<'a> {
    Creds(&'a Path),
    Nkey(&'a Path),
    User(&'a str, String),
    Token(String),
    Anonymous,
}

impl std::fmt::Debug for Login<'_> {
    // Never the password or the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Login::Creds(p) => write!(f, "Creds({})", p.display()),
            Login::Nkey(p) => write!(f, "Nkey({})", p.display()),
            Login::User(u, _) => write!(f, "User({u}, <redacted>)"),
            Login::Token(_) => write!(f, "Token(<redacted>)"),
            Login::Anonymous => write!(f, "Anonymous"),
        }
    }
}

/// A secret given inline or in a file (`what` names the flag); a file's trailing newline is
/// not part of it.
fn secret_of(inline: &Option<String>, file: &Option<std::path::PathBuf>, what: &str) -> Result<Option<String>> {
    match (inline, file) {
        (Some(s), _) => Ok(Some(s.clone())),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::new(ErrorKind::Config, format!("--{what}-file {}: {e}", path.display())))?;
            Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()))
        }
        (None, None) => Ok(None),
    }
}

impl<'a> Login<'a> {
    /// The login the connect flags give.
    pub fn of(c: &'a Connect) -> Result<Login<'a>> {
        let password = secret_of(&c.password, &c.password_file, "password")?;
        let token = secret_of(&c.token, &c.token_file, "token")?;
        match (&c.creds, &c.nkey, &c.user, password, token) {
            (Some(path), None, None, None, None) => Ok(Login::Creds(path)),
            (None, Some(path), None, None, None) => Ok(Login::Nkey(path)),
            (None, None, Some(user), Some(password), None) => Ok(Login::User(user, password)),
            (None, None, Some(_), None, None) => {
                Err(Error::new(ErrorKind::Config, "--user needs --password-file (or --password, or MESH_PROVISIONER_PASSWORD)"))
            }
            (None, None, None, Some(_), None) => Err(Error::new(ErrorKind::Config, "a password needs --user")),
            (None, None, None, None, Some(token)) => Ok(Login::Token(token)),
            (None, None, None, None, None) => Ok(Login::Anonymous),
            _ => Err(Error::new(ErrorKind::Config, "give at most one of --creds, --nkey, --user with a password, --token")),
        }
    }

    /// The login the `--service-*` flags give, if any.
    pub fn of_service(s: &'a ServiceLogin) -> Result<Option<Login<'a>>> {
        let password = secret_of(&s.service_password, &s.service_password_file, "service-password")?;
        match (&s.service_creds, &s.service_nkey, &s.service_user, password) {
            (Some(path), None, None, None) => Ok(Some(Login::Creds(path))),
            (None, Some(path), None, None) => Ok(Some(Login::Nkey(path))),
            (None, None, Some(user), Some(password)) => Ok(Some(Login::User(user, password))),
            (None, None, Some(_), None) => Err(Error::new(ErrorKind::Config, "--service-user needs --service-password-file (or --service-password)")),
            (None, None, None, Some(_)) => Err(Error::new(ErrorKind::Config, "a service password needs --service-user")),
            (None, None, None, None) => Ok(None),
            _ => Err(Error::new(ErrorKind::Config, "give at most one of --service-creds, --service-nkey, --service-user with a password")),
        }
    }

    /// The inbox prefix a user of the example config may subscribe under: `_INBOX_<user>`, the
    /// user a creds file's JWT names, or `default_user`'s when the login names no user.
    pub fn inbox(&self, default_user: &str) -> String {
        match self {
            Login::User(u, _) => inbox_of(u),
            Login::Creds(path) => {
                let named = std::fs::read_to_string(path).ok().and_then(|text| crate::accounts::jwt::user_of_creds(&text));
                inbox_of(named.as_deref().unwrap_or(default_user))
            }
            _ => inbox_of(default_user),
        }
    }
}

pub use crate::base::secrets::redact_url;

/// The inbox prefix of `user` in the example config.
pub fn inbox_of(user: &str) -> String {
    format!("_INBOX_{user}")
}

/// The JetStream domain through which a party outside the buckets' account reaches what its
/// account imports of the JetStream API (`$JS.mesh.API.…`, deploy/nats-server.conf): in an
/// account without JetStream, the server itself answers the plain `$JS.API.…` ("not enabled").
pub const PARTY_DOMAIN: &str = "mesh";

/// The users of the example config's buckets' account (`MESH`); every other user is a party of
/// an account of its own.
pub const MESH_USERS: [&str; 3] = ["mesh-provisioner", "mesh-provisioner-service", OPERATOR_USER];

/// A JetStream context for `client`, logged in as `user` of the example config: through
/// [`PARTY_DOMAIN`] for a party outside the buckets' account, so its standard KV client binds,
/// writes and reads its own keys.
pub fn jetstream_of(client: Client, user: &str) -> async_nats::jetstream::Context {
    if MESH_USERS.contains(&user) {
        async_nats::jetstream::new(client)
    } else {
        async_nats::jetstream::with_domain(client, PARTY_DOMAIN)
    }
}

/// Connect options for `login` with the TLS flags of `c`, the inbox prefix `inbox` and the
/// connection name `name`.
pub async fn options_for(c: &Connect, login: Login<'_>, inbox: &str, name: &str) -> Result<ConnectOptions> {
    let config = |what: &str, e: &dyn std::fmt::Display| Error::new(ErrorKind::Config, format!("{what}: {e}"));
    let mut o = match login {
        Login::Creds(path) => ConnectOptions::with_credentials_file(path).await.map_err(|e| config(&format!("creds file {}", path.display()), &e))?,
        Login::Nkey(path) => {
            let seed = std::fs::read_to_string(path).map_err(|e| config(&format!("nkey file {}", path.display()), &e))?;
            ConnectOptions::with_nkey(seed.trim().to_string())
        }
        Login::User(user, password) => ConnectOptions::with_user_and_password(user.into(), password),
        Login::Token(token) => ConnectOptions::with_token(token),
        Login::Anonymous => ConnectOptions::new(),
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
    check_inbox(inbox)?;
    Ok(o.name(name).custom_inbox_prefix(inbox).connection_timeout(Duration::from_secs(5)))
}

/// Builds connect options from the flags (the buckets' login, its inbox prefix).
pub async fn options(c: &Connect, name: &str) -> Result<ConnectOptions> {
    let login = Login::of(c)?;
    let inbox = c.inbox_prefix.clone().unwrap_or_else(|| login.inbox(PROVISIONER_USER));
    options_for(c, login, &inbox, name).await
}

/// An inbox prefix is a subject of plain tokens: no wildcard, no empty token
/// (`mirror::check_subject`).
fn check_inbox(inbox: &str) -> Result<()> {
    crate::base::wire::check_subject(inbox, false)
        .map_err(|_| Error::new(ErrorKind::Config, format!("--inbox-prefix {inbox:?} is not a subject of plain tokens")))
}

/// Connects to `url` (a comma-separated list for a cluster) with `options`.
pub async fn connect(url: &str, options: ConnectOptions) -> Result<Client> {
    let urls: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    options.connect(urls.as_slice()).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("connecting to {}: {e}", redact_url(url))))
}

/// Connects as the flags say, or to the embedded server as the provisioner's user.
pub async fn connect_cli(c: &Connect, name: &str) -> Result<Client> {
    match &c.nats_url {
        Some(url) => connect(url, options(c, name).await?).await,
        None => connect_embedded(c, PROVISIONER_USER, name).await,
    }
}

/// Connect options as `user` of the embedded server that `access` records (its creds in
/// operator mode, else its password), with that user's own inbox prefix (a user it has no
/// password for gets none, and the server refuses it).
pub fn embedded_options(access: &Access, user: &str, name: &str) -> Result<ConnectOptions> {
    let options = match access.creds(user) {
        Some(creds) => ConnectOptions::with_credentials(creds).map_err(|e| Error::new(ErrorKind::Config, format!("the recorded creds of {user}: {e}")))?,
        None => ConnectOptions::with_user_and_password(user.into(), access.password(user).unwrap_or_default().into()),
    };
    Ok(options.custom_inbox_prefix(inbox_of(user)).name(name))
}

/// Connects to the embedded server recorded in the state directory as `user`.
pub async fn connect_embedded(c: &Connect, user: &str, name: &str) -> Result<Client> {
    // The record names where to send a password: trusted only from a directory no one else
    // could have planted it in.
    crate::base::files::state_dir_is_private(&c.state_dir).map_err(|why| Error::new(ErrorKind::Config, why))?;
    crate::base::files::owned_and_private(&Access::path(&c.state_dir))
        .map_err(|why| Error::new(ErrorKind::Config, format!("the embedded server's record refused: {why}")))?;
    let access = Access::load(&c.state_dir)?;
    if !access.knows(user) {
        return Err(Error::new(ErrorKind::Config, format!("the embedded server record has no password or creds for {user}")));
    }
    connect(&access.url, embedded_options(&access, user, name)?).await
}

/// How to reach the bus.
#[derive(Args, Clone, Default)]
pub struct Connect {
    /// NATS server URL; without it, `serve` starts an embedded nats-server and `query` asks it.
    #[arg(long, env = "MESH_PROVISIONER_NATS_URL")]
    pub nats_url: Option<String>,
    /// A NATS credentials file (JWT and nkey seed).
    #[arg(long, env = "MESH_PROVISIONER_CREDS")]
    pub creds: Option<PathBuf>,
    /// A file holding an nkey seed.
    #[arg(long, env = "MESH_PROVISIONER_NKEY")]
    pub nkey: Option<PathBuf>,
    /// The user to log in as, with --password-file (or --password).
    #[arg(long, env = "MESH_PROVISIONER_USER")]
    pub user: Option<String>,
    /// The password on the command line shows in `ps`: prefer --password-file or the
    /// environment.
    #[arg(long, env = "MESH_PROVISIONER_PASSWORD", hide_env_values = true, conflicts_with = "password_file")]
    pub password: Option<String>,
    /// A file holding the password (a trailing newline is not part of it), e.g. systemd's
    /// `$CREDENTIALS_DIRECTORY/nats-password`.
    #[arg(long, env = "MESH_PROVISIONER_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    /// The token on the command line shows in `ps`: prefer --token-file or the environment.
    #[arg(long, env = "MESH_PROVISIONER_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the token.
    #[arg(long, env = "MESH_PROVISIONER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The prefix of this client's reply subjects (its inbox). The example config lets each
    /// user subscribe only under its own, `_INBOX_<user>`, so that no user hears another's
    /// replies. Default: `_INBOX_<--user>`, else `_INBOX_mesh-provisioner`.
    #[arg(long, env = "MESH_PROVISIONER_INBOX_PREFIX")]
    pub inbox_prefix: Option<String>,
    /// A CA certificate to trust (PEM).
    #[arg(long, env = "MESH_PROVISIONER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), with --tls-key.
    #[arg(long, env = "MESH_PROVISIONER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "MESH_PROVISIONER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Refuse to talk to the server without TLS.
    #[arg(long, env = "MESH_PROVISIONER_TLS_REQUIRED")]
    pub tls_required: bool,
    /// The state directory (component cache, embedded server data, kept plans).
    #[arg(long, env = "MESH_PROVISIONER_STATE_DIR", default_value_os_t = default_state_dir())]
    pub state_dir: PathBuf,
}

/// Shown as set or not, never the secret.
fn secret<T>(v: &Option<T>) -> &'static str {
    if v.is_some() {
        "Some(<redacted>)"
    } else {
        "None"
    }
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect")
            .field("nats_url", &self.nats_url.as_deref().map(crate::base::secrets::redact_url))
            .field("creds", &self.creds)
            .field("nkey", &self.nkey)
            .field("user", &self.user)
            .field("password", &secret(&self.password))
            .field("password_file", &self.password_file)
            .field("token", &secret(&self.token))
            .field("token_file", &self.token_file)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("tls_required", &self.tls_required)
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

impl std::fmt::Debug for ServiceLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceLogin")
            .field("service_user", &self.service_user)
            .field("service_password", &secret(&self.service_password))
            .field("service_password_file", &self.service_password_file)
            .field("service_creds", &self.service_creds)
            .field("service_nkey", &self.service_nkey)
            .finish()
    }
}

/// The user that serves the verbs, when it is not the buckets' user.
#[derive(Args, Clone, Default)]
pub struct ServiceLogin {
    /// The user that serves the verbs (the example config's `mesh-provisioner-service`, which
    /// may publish nothing but replies). Without a --service-* login the verbs are served as
    /// the buckets' user.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_USER")]
    pub service_user: Option<String>,
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_PASSWORD", hide_env_values = true, conflicts_with = "service_password_file")]
    pub service_password: Option<String>,
    /// A file holding the serving user's password.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_PASSWORD_FILE")]
    pub service_password_file: Option<PathBuf>,
    /// A credentials file for the user that serves the verbs.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_CREDS")]
    pub service_creds: Option<PathBuf>,
    /// A file holding the nkey seed of the user that serves the verbs.
    #[arg(long, env = "MESH_PROVISIONER_SERVICE_NKEY")]
    pub service_nkey: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_secret() {
        let c = Connect {
            nats_url: Some("nats://u:url-secret@127.0.0.1:4222".into()),
            user: Some("u".into()),
            password: Some("hunter2".into()),
            token: Some("tok-secret".into()),
            ..Default::default()
        };
        let s = ServiceLogin { service_user: Some("svc".into()), service_password: Some("svc-secret".into()), ..Default::default() };
        let shown = format!("{c:?} {s:?}");
        for secret in ["url-secret", "hunter2", "tok-secret", "svc-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("\"u\"") && shown.contains("svc"), "{shown}");
    }

    #[test]
    fn refuses_an_inbox_prefix_with_a_wildcard_or_an_empty_token() {
        for bad in ["", "_INBOX.>", "*", "a..b", "_INBOX_x.", "has space"] {
            assert!(check_inbox(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["_INBOX_node-alpha", "_INBOX", "_INBOX.mine"] {
            assert!(check_inbox(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn a_password_file_is_read_without_its_newline_and_a_user_needs_one() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").expect("write");
        let c = Connect { user: Some("u".into()), password_file: Some(file), ..Default::default() };
        assert!(matches!(Login::of(&c), Ok(Login::User("u", ref p)) if p == "s3cret"));
        let bare = Connect { user: Some("u".into()), ..Default::default() };
        assert!(Login::of(&bare).unwrap_err().message().contains("--password-file"));
    }

    #[test]
    fn a_login_never_shows_its_secret() {
        let shown = format!("{:?} {:?}", Login::User("u", "hunter2".into()), Login::Token("tok-secret".into()));
        assert!(!shown.contains("hunter2") && !shown.contains("tok-secret"), "{shown}");
    }
}
