//! The embedded default: with no bus address, `serve` runs its own `nats-server` on loopback,
//! with JetStream and its data in the state directory, configured from the repository's
//! example config (`deploy/nats-server.conf`) so the accounts and limits are the real ones.

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

/// The users of the example config, by the suffix of their `{{PASSWORD_…}}` placeholder.
pub const USERS: [(&str, &str); 15] = [
    ("PROVISIONER", "mesh-provisioner"),
    ("PROVISIONER_SERVICE", "mesh-provisioner-service"),
    ("MESH_OPERATOR", "mesh-operator"),
    ("MESH_CONTROLLER", "mesh-controller"),
    ("MESH_INDEXER", "mesh-indexer"),
    ("NODE_ALPHA", "node-alpha"),
    ("NODE_BETA", "node-beta"),
    ("NODE_GAMMA", "node-gamma"),
    ("LEAF_ALPHA", "leaf-alpha"),
    ("LEAF_BETA", "leaf-beta"),
    ("LEAF_GAMMA", "leaf-gamma"),
    ("PROVIDER_POSTGRES", "provider-postgres"),
    ("MESH_CONFIG", "mesh-config"),
    ("MESH_VAULT", "mesh-vault"),
    ("SYSTEM", "system"),
];

/// The nodes and providers the example config has users for: the embedded default's
/// `bootstrap` makes their buckets.
pub const EXAMPLE_NODES: [&str; 3] = ["alpha", "beta", "gamma"];
pub const EXAMPLE_PROVIDERS: [&str; 1] = ["postgres"];

/// How to reach an embedded server, kept in the state directory so `query` finds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Access {
    pub url: String,
    /// user name → password, for every user of the config.
    pub passwords: Vec<(String, String)>,
}

impl Access {
    pub fn password(&self, user: &str) -> Option<&str> {
        self.passwords.iter().find(|(u, _)| u == user).map(|(_, p)| p.as_str())
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
    for (placeholder, user) in USERS {
        let password = passwords.iter().find(|(u, _)| u == user).map(|(_, p)| p.as_str()).unwrap_or("");
        let hash = bcrypt::hash_with_result(password, BCRYPT_COST)
            .map_err(|e| Error::new(ErrorKind::Config, format!("hashing the password of {user}: {e}")))?
            .format_for_version(bcrypt::Version::TwoA);
        conf = conf.replace(&format!("{{{{PASSWORD_{placeholder}}}}}"), &hash);
    }
    Ok(conf)
}

/// A free loopback port, as the OS hands one out.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::new(ErrorKind::Config, format!("no free port: {e}")))?;
    l.local_addr().map(|a| a.port()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))
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
        for (_, user) in USERS {
            if !passwords.iter().any(|(u, _)| u == user) {
                passwords.push((user.to_string(), crate::base::random::random_password()?));
            }
        }
        let conf_path = dir.join("nats-server.conf");
        let conf = render(port, &dir.join("jetstream"), &passwords, cluster)?;
        write_private(&conf_path, conf.as_bytes()).map_err(|e| io("writing the server config", e))?;
        let log = crate::base::files::create_private(&dir.join("nats-server.log")).map_err(|e| io("creating the server log", e))?;
        let mut command = Command::new("nats-server");
        command.arg("-c").arg(&conf_path).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
        die_with_this_process(&mut command);
        let child =
            command.spawn().map_err(|e| Error::new(ErrorKind::Config, format!("starting nats-server (is it on PATH? scripts/setup installs it): {e}")))?;
        let access = Access { url: format!("nats://127.0.0.1:{port}"), passwords };
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
