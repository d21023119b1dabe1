//! A small mesh with one module in each status state (SPEC §7.1), shared by the native state
//! table tests and the component's golden status answer.

use std::sync::Arc;

use mesh_provisioner::store::backend::MemoryBackend;

const NEEDS: &str = "mesh-provisioner_needs";
const APPLIED: &str = "mesh-provisioner_applied";
const ASSIGNMENTS: &str = "mesh-controller_assignments";
const CONFIG: &str = "mesh-config_values";

/// A mesh with one module in each state.
pub fn mesh() -> Arc<MemoryBackend> {
    let b = MemoryBackend::new();
    // alpha/app: applied, every grant holds; one need of a part not installed.
    b.put(APPLIED, "alpha.app", br#"{"build":"b7","needs":4,"parts":["api"],"at":"2026-11-30T10:00:00Z"}"#);
    b.put(NEEDS, "alpha.app.config.db_url", br#"{"placeholder":"${config:db_url}","part":"api"}"#);
    b.put(NEEDS, "alpha.app.secret.db_password", br#"{"part":"api"}"#);
    b.put(NEEDS, "alpha.app.bound.postgres=2Edb", br#"{"part":"api"}"#);
    b.put(NEEDS, "alpha.app.config.report_url", br#"{"part":"reports"}"#);
    b.put(CONFIG, "alpha.app.db_url", b"postgres://db");
    b.put("postgres_bound", "alpha.app.db", br#"{"user":"app"}"#);
    // gamma/postgres: the provider of alpha/app's bound value, assigned and applied (SPEC §7.3).
    b.put(ASSIGNMENTS, "gamma.postgres", br#"{"want":"p1"}"#);
    b.put(APPLIED, "gamma.postgres", br#"{"build":"p1","needs":0}"#);
    b.set_responders("mesh-vault", 2);
    // alpha/web: needs recorded, nothing applied.
    b.put(NEEDS, "alpha.web.config.base_url", b"{}");
    // beta/cache: applied, but its provider is not installed.
    b.put(APPLIED, "beta.cache", br#"{"build":"c1","needs":1}"#);
    b.put(NEEDS, "beta.cache.bound.redis=2Ecache", b"{}");
    b.remove_bucket("redis_bound");
    // beta/metrics: applied with nothing needed.
    b.put(APPLIED, "beta.metrics", br#"{"build":"m1","needs":0}"#);
    // gamma/worker: assigned, never ran.
    b.put(ASSIGNMENTS, "gamma.worker", br#"{"want":"k1"}"#);
    // gamma/odd: a kind no domain answers.
    b.put(NEEDS, "gamma.odd.widget.x", b"{}");
    b
}
