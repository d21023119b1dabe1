//! State-directory faults end to end: the real host on a real `nats-server`, its kept plans and
//! its compiled-component cache on small tmpfs mounts that are full or read-only. Each failure
//! is a clear log line, a plan that could not be kept says so in the plan verb's answer
//! (`not_kept`), the server keeps serving throughout, and once the directory is writable again
//! the plan is kept and the answer no longer says it is not.
//!
//! Mounting needs root: run as another user, the test says it is skipped and why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::nats::{ask_raw, ask_verb, Bus, Host};

/// A tmpfs mounted for the test, unmounted when dropped (even when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax) at `dir`, private to this user; `Err` says why not.
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
        if uid != "0" {
            return Err(format!("mounting a tmpfs needs root; this runs as uid {uid}"));
        }
        run("mount", &["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs", &dir.to_string_lossy()])?;
        Ok(Tmpfs(dir.to_path_buf()))
    }

    fn remount(&self, how: &str) {
        run("mount", &["-o", &format!("remount,{how}"), &self.0.to_string_lossy()]).expect("remount");
    }

    /// Fills the file system to the last byte with one file, which it returns.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", &self.0.to_string_lossy()]);
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

async fn plan(c: &async_nats::Client) -> Value {
    let (code, v) = ask_verb(c, "mesh-provisioner.plan", br#"{"node":"alpha","module":"app"}"#).await.expect("the plan verb answers");
    assert_eq!(code, None, "{v}");
    v
}

/// Waits (bounded) until alpha/app's plan satisfies `cond`, checking that the server answers
/// the other verb all along.
async fn plan_until(c: &async_nats::Client, host: &Host, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let p = plan(c).await;
        if cond(&p) {
            return p;
        }
        let (code, v) = ask_raw(c, br#"{"what":"needs","node":"alpha"}"#).await.expect("needs answers");
        assert_eq!(code, None, "{v}");
        assert!(start.elapsed() < Duration::from_secs(40), "alpha/app's plan never {what}: {p}\n{}", host.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the kept-plan file at `path` keeps `build`.
fn holds(path: &Path, build: &str) -> bool {
    let needle = format!("\"build\":\"{build}\"");
    std::fs::read(path).map(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())).unwrap_or(false)
}

async fn want(bus: &Bus, build: &str) {
    bus.put("node-alpha", "composed-alpha", &format!("app.{build}"), tests::sample_composition().as_bytes()).await;
    bus.put("mesh-controller", "mesh-controller_assignments", "alpha.app", json!({ "want": build }).to_string().as_bytes()).await;
}

#[tokio::test]
async fn a_full_or_read_only_state_directory_is_said_in_the_plans_and_the_server_keeps_serving() {
    let state = tempfile::tempdir().expect("temp dir");
    let (plans, components) = match (Tmpfs::mount(&state.path().join("plans"), "64k"), Tmpfs::mount(&state.path().join("components"), "64k")) {
        (Ok(p), Ok(c)) => (p, c),
        (Err(why), _) | (_, Err(why)) => {
            tests::skipped("e2e_state_faults", &why);
            return;
        }
    };
    // The cache's directory is read-only from the start; the plans' is full.
    components.remount("ro");
    let filler = plans.fill();

    let bus = Bus::start().await;
    bus.create_plan_buckets().await;
    let host = Host::start_in(&bus, state, &[]).await;
    let log = host.log_text();
    assert!(log.contains("could not cache the compiled component") && log.contains("Read-only file system"), "{log}");

    // Full: the plan is published and answered, and says it could not be kept.
    let c = bus.client("node-alpha").await;
    want(&bus, "b1").await;
    let p = plan_until(&c, &host, "said it was not kept (full)", |p| p["state"] == "planned" && p["not_kept"].is_string()).await;
    assert!(p["not_kept"].as_str().unwrap_or("").contains("No space left on device"), "{p}");
    assert_eq!(p["want"], "b1", "{p}");
    let log = host.log_text();
    assert!(log.contains("could not keep the plan of alpha/app at b1") && log.contains("No space left on device"), "{log}");

    // Room again: the plan is kept, and no longer said not to be.
    std::fs::remove_file(&filler).expect("remove the filler");
    let p = plan_until(&c, &host, "was kept once there was room", |p| p.get("not_kept").is_none()).await;
    assert_eq!(p["state"], "planned", "{p}");
    let kept = plans.0.join("alpha/app.plan");
    assert!(holds(&kept, "b1"), "{} does not hold b1", kept.display());

    // Read-only: a new build is planned and said not kept; writable again, it is kept.
    plans.remount("ro");
    want(&bus, "b2").await;
    let p = plan_until(&c, &host, "said it was not kept (read-only)", |p| p["want"] == "b2" && p["not_kept"].is_string()).await;
    assert!(p["not_kept"].as_str().unwrap_or("").contains("Read-only file system"), "{p}");
    assert_eq!(p["state"], "planned", "{p}");
    plans.remount("rw");
    plan_until(&c, &host, "was kept once writable", |p| p["want"] == "b2" && p.get("not_kept").is_none()).await;
    assert!(holds(&kept, "b2"), "{} does not hold b2", kept.display());
    drop(host);
}
