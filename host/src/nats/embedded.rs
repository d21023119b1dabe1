//! The embedded default: with no bus address, `serve` runs its own `nats-server` on loopback,
//! with JetStream and its data in the state directory, configured from the repository's
//! example config (`deploy/nats-server.conf`) so the accounts and limits are the real ones; or,
//! with `--operator`, the same accounts signed for operator mode (`accounts::operator`), each
//! party logging in with its creds.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::files::write_private;

/// The example server config, with `{{…}}` placeholders.
pub const SERVER_CONF: &str = include_str!("../../../deploy/nats-server.conf");

/// The nodes and providers the example config has users for: the embedded default's
/// `bootstrap` makes their buckets.
pub const EXAMPLE_NODES: [&str; 3] = ["alpha", "beta", "gamma"];
pub const EXAMPLE_PROVIDERS: [&str; 1] = ["postgres"];

/// The example mesh: what the example config is the rendering of.
pub fn example_mesh() -> crate::accounts::Mesh {
    crate::accounts::Mesh { nodes: EXAMPLE_NODES.map(String::from).to_vec(), providers: EXAMPLE_PROVIDERS.map(String::from).to_vec() }
}

/// The users of the example config, each with its password's placeholder (`PASSWORD_…`).
pub fn users() -> Vec<(String, String)> {
    example_mesh().accounts().iter().flat_map(|a| a.users.iter().map(|u| (u.placeholder(), u.name.clone()))).collect()
}

/// How to reach an embedded server, kept in the state directory so `query` finds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Access {
    pub url: String,
    /// user name → password, for every user of the config.
    pub passwords: Vec<(String, String)>,
    /// user name → creds file text, for every user of an operator-mode server.
    #[serde(default)]
    pub creds: Vec<(String, String)>,
}

impl Access {
    pub fn password(&self, user: &str) -> Option<&str> {
        self.passwords.iter().find(|(u, _)| u == user).map(|(_, p)| p.as_str())
    }

    pub fn creds(&self, user: &str) -> Option<&str> {
        self.creds.iter().find(|(u, _)| u == user).map(|(_, c)| c.as_str())
    }

    /// Whether `user` can log in: a password or creds are recorded for it.
    pub fn knows(&self, user: &str) -> bool {
        self.password(user).is_some() || self.creds(user).is_some()
    }

    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("embedded.json")
    }

    pub fn load(state_dir: &Path) -> Result<Access> {
        let path = Self::path(state_dir);
        let text =
            std::fs::read_to_string(&path).map_err(|e| Error::new(ErrorKind::Config, format!("no embedded server recorded at {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| Error::new(ErrorKind::Config, format!("{} is unreadable: {e}", path.display())))
    }
}

/// The bcrypt cost of the rendered passwords: each connection costs the server one check at it
/// (a few milliseconds), and the passwords are 144 random bits, not words to guess.
const BCRYPT_COST: u32 = 6;

/// Renders the example config for a port, a store directory, passwords and a cluster block. The
/// config holds each password's bcrypt hash (`$2a$…`, which nats-server checks), never the
/// password: the passwords live only in the state directory's private record.
pub fn render(port: u16, store_dir: &Path, passwords: &[(String, String)], cluster: &str) -> Result<String> {
    let mut conf =
        SERVER_CONF.replace("{{PORT}}", &port.to_string()).replace("{{STORE_DIR}}", &store_dir.display().to_string()).replace("{{CLUSTER}}", cluster);
    for (placeholder, user) in users() {
        let password = passwords.iter().find(|(u, _)| *u == user).map(|(_, p)| p.as_str()).unwrap_or("");
        let hash = bcrypt::hash_with_result(password, BCRYPT_COST)
            .map_err(|e| Error::new(ErrorKind::Config, format!("hashing the password of {user}: {e}")))?
            .format_for_version(bcrypt::Version::TwoA);
        conf = conf.replace(&format!("{{{{{placeholder}}}}}"), &hash);
    }
    Ok(conf)
}

/// A free loopback port, as the OS hands one out.
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct free loopback ports. Every listener is held until all are picked: ports
/// picked one after another may repeat once the first is let go, and a server told to listen
/// twice on one port (clients and routes) cannot start however often it is tried.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::new(ErrorKind::Config, format!("no free port: {e}")))?;
    held.iter().map(|l| l.local_addr().map(|a| a.port()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))).collect()
}

/// A running `nats-server`, stopped when dropped.
pub struct Server {
    child: Child,
    pub access: Access,
    pub port: u16,
}

impl Server {
    /// Starts `nats-server` with the example config under `dir` (`dir/jetstream` holds the data),
    /// on `port` (a free one if `None`), and waits until it accepts connections.
    pub async fn start(dir: &Path, port: Option<u16>, passwords: Option<Vec<(String, String)>>) -> Result<Server> {
        Self::start_with(dir, port, passwords, "").await
    }

    /// As [`Server::start`], with `cluster` (a `cluster { … }` block) in the config.
    pub async fn start_with(dir: &Path, port: Option<u16>, passwords: Option<Vec<(String, String)>>, cluster: &str) -> Result<Server> {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let io = |what: &str, e: std::io::Error| Error::new(ErrorKind::Config, format!("{what}: {e}"));
        crate::base::files::private_dirs(dir).map_err(|e| io("creating the state directory", e))?;
        // Users the kept passwords do not name (added to the config since) get new ones.
        let mut passwords = passwords.unwrap_or_default();
        for (_, user) in users() {
            if !passwords.iter().any(|(u, _)| *u == user) {
                passwords.push((user, crate::base::random::random_password()?));
            }
        }
        let conf = render(port, &dir.join("jetstream"), &passwords, cluster)?;
        let access = Access { url: format!("nats://127.0.0.1:{port}"), passwords, creds: vec![] };
        Self::start_config(dir, port, &conf, access).await
    }

    /// As [`Server::start_with`], in operator mode: the example mesh's accounts signed with the
    /// keys kept in `dir/accounts` (made the first time), its full resolver's directory
    /// `dir/resolver` seeded from them.
    pub async fn start_operator(dir: &Path, port: Option<u16>, cluster: &str) -> Result<Server> {
        Self::start_signed(dir, port, cluster, &example_mesh()).await
    }

    /// Starts a server in operator mode for `mesh`, its accounts under `dir/accounts`.
    pub async fn start_signed(dir: &Path, port: Option<u16>, cluster: &str, mesh: &crate::accounts::Mesh) -> Result<Server> {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let io = |what: &str, e: std::io::Error| Error::new(ErrorKind::Config, format!("{what}: {e}"));
        crate::base::files::private_dirs(dir).map_err(|e| io("creating the state directory", e))?;
        let signed = crate::accounts::operator::render_into(mesh, &dir.join("accounts"), &[])?;
        // The server's resolver directory seeded from the rendering's, as an operator copies
        // it: an account it holds already (pushed since) is kept; a later rendering reaches the
        // running server only by a push.
        let resolver = dir.join("resolver");
        crate::base::files::private_dirs(&resolver).map_err(|e| io("creating the resolver directory", e))?;
        for a in &signed.accounts {
            let path = resolver.join(format!("{}.jwt", a.public_key));
            if !path.exists() {
                write_private(&path, a.jwt.as_bytes()).map_err(|e| io("seeding the resolver", e))?;
            }
        }
        let conf = std::fs::read_to_string(dir.join("accounts/nats-server.conf")).map_err(|e| io("reading the rendered config", e))?;
        let conf = conf
            .replace("{{PORT}}", &port.to_string())
            .replace("{{STORE_DIR}}", &dir.join("jetstream").display().to_string())
            .replace("{{RESOLVER_DIR}}", &resolver.display().to_string())
            .replace("{{CLUSTER}}", cluster);
        let access = Access { url: format!("nats://127.0.0.1:{port}"), passwords: vec![], creds: signed.creds };
        Self::start_config(dir, port, &conf, access).await
    }

    /// Starts `nats-server` with `conf` (every placeholder filled) under `dir`, reached as
    /// `access` says.
    pub async fn start_config(dir: &Path, port: u16, conf: &str, access: Access) -> Result<Server> {
        let io = |what: &str, e: std::io::Error| Error::new(ErrorKind::Config, format!("{what}: {e}"));
        let conf_path = dir.join("nats-server.conf");
        write_private(&conf_path, conf.as_bytes()).map_err(|e| io("writing the server config", e))?;
        let log = crate::base::files::create_private(&dir.join("nats-server.log")).map_err(|e| io("creating the server log", e))?;
        let mut command = Command::new("nats-server");
        command.arg("-c").arg(&conf_path).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
        die_with_this_process(&mut command);
        let child =
            command.spawn().map_err(|e| Error::new(ErrorKind::Config, format!("starting nats-server (is it on PATH? scripts/setup installs it): {e}")))?;
        let mut server = Server { child, access, port };
        server.wait_ready(Duration::from_secs(20)).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::new(ErrorKind::Config, format!("nats-server exited at start ({status}); see its log")));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::new(ErrorKind::Unavailable, "nats-server did not start listening in time"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The server must not outlive the process that started it: `kill_on_drop` covers every exit
/// but a `SIGKILL`, after which an orphaned server would hold the port and the store, and the
/// next start on the same state directory would fail. On Linux the kernel kills the child when
/// its parent thread ends (the runtime's thread, which lives as long as the process).
fn die_with_this_process(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id();
        // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid) run, and
        // nothing allocates (`last_os_error` and `from_raw_os_error` hold a code, not a box).
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the prctl: then nothing would signal us. The
                // error is a raw OS code: nothing may allocate between fork and exec in a
                // threaded process (another thread may have held the allocator's lock).
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_the_rendering_of_the_example_mesh() {
        let rendered = crate::accounts::conf::render(&example_mesh());
        assert!(
            SERVER_CONF == rendered,
            "deploy/nats-server.conf is not what `mesh-provisioner accounts --nodes alpha,beta,gamma --providers postgres --out deploy` writes: run that"
        );
    }

    #[test]
    fn ports_picked_together_are_all_different() {
        let ports = free_ports(256).expect("free ports");
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice among {ports:?}");
        assert!(!ports.contains(&0), "port 0 is not a port a server can be told");
    }

    #[test]
    fn every_placeholder_of_the_example_config_is_filled() {
        let conf = render(4222, Path::new("/tmp/store"), &[], "").expect("rendered");
        assert!(!conf.contains("{{"), "a placeholder left: {}", conf.split("{{").nth(1).unwrap_or_default().chars().take(40).collect::<String>());
        assert_eq!(users().len(), 15, "every user of the example: {:?}", users());
    }
}
