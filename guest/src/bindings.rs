//! The thin layer between the WIT world `provisioner` and the plain-Rust logic: imports become
//! an [`Env`], exports call into the crate. No decision is made here.

use crate::env::{Entry, Env, Health, HostError, Level, Mark, Page, Reached};

wit_bindgen::generate!({ world: "provisioner", path: "../wit" });

use exports::mesh::provisioner::api;
use mesh::provisioner::{discovery, kept_plans, log, registry_writer, store, types};

/// The component's imports, as the logic sees them.
struct Imports;

fn host_error(e: types::HostError) -> HostError {
    match e {
        types::HostError::Unavailable(m) => HostError::Unavailable(m),
        types::HostError::Conflict(m) => HostError::Conflict(m),
        types::HostError::Denied(m) => HostError::Denied(m),
        types::HostError::Invalid(m) => HostError::Invalid(m),
        types::HostError::Timeout(m) => HostError::Timeout(m),
        types::HostError::NoResponders(m) => HostError::NoResponders(m),
        types::HostError::Corrupt(m) => HostError::Corrupt(m),
    }
}

fn wit_error(e: HostError) -> types::HostError {
    match e {
        HostError::Unavailable(m) => types::HostError::Unavailable(m),
        HostError::Conflict(m) => types::HostError::Conflict(m),
        HostError::Denied(m) => types::HostError::Denied(m),
        HostError::Invalid(m) => types::HostError::Invalid(m),
        HostError::Timeout(m) => types::HostError::Timeout(m),
        HostError::NoResponders(m) => types::HostError::NoResponders(m),
        HostError::Corrupt(m) => types::HostError::Corrupt(m),
    }
}

fn entry(e: types::Entry) -> Entry {
    Entry { key: e.key, revision: e.revision, value: e.value }
}

impl Env for Imports {
    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError> {
        store::get(bucket, key).map(|e| e.map(entry)).map_err(host_error)
    }

    fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError> {
        let p = store::scan(bucket, filter, after, limit).map_err(host_error)?;
        Page::from_parts(p.keys, p.values, p.lengths, p.revisions, p.more, p.revision).map_err(|why| HostError::Corrupt(format!("a page of {bucket}: {why}")))
    }

    fn exists(&self, bucket: &str) -> Result<bool, HostError> {
        store::exists(bucket).map_err(host_error)
    }

    fn health(&self, bucket: &str) -> Result<Health, HostError> {
        let h = store::health(bucket).map_err(host_error)?;
        let shares = |v: Vec<store::WriterShare>| v.into_iter().map(|w| (w.writer, w.keys, w.bytes)).collect();
        Ok(Health { unsafe_settings: h.unsafe_settings, over_quota: shares(h.over_quota), orphaned: shares(h.orphaned) })
    }

    fn reach(&self, marks: &[Mark], wait_ms: u32) -> Result<Vec<Reached>, HostError> {
        let marks: Vec<store::Mark> = marks.iter().map(|m| store::Mark { name: m.name.clone(), revision: m.revision }).collect();
        let reached = store::reach(&marks, wait_ms).map_err(host_error)?;
        Ok(reached.into_iter().map(|r| Reached { name: r.name, asked: r.asked, revision: r.revision }).collect())
    }

    fn responders(&self, service: &str) -> Result<u32, HostError> {
        discovery::responders(service).map_err(host_error)
    }

    fn put_registry(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, HostError> {
        registry_writer::put(key, value, expected).map_err(host_error)
    }

    fn delete_registry(&self, key: &str, expected: u64) -> Result<(), HostError> {
        registry_writer::delete(key, expected).map_err(host_error)
    }

    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Trace => log::Level::Trace,
            Level::Debug => log::Level::Debug,
            Level::Info => log::Level::Info,
            Level::Warn => log::Level::Warn,
            Level::Error => log::Level::Error,
        };
        log::log(level, message);
    }

    fn load_plan(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>, HostError> {
        kept_plans::load(node, module).map_err(host_error)
    }

    fn save_plan(&self, node: &str, module: &str, plan: &[u8]) -> Result<(), HostError> {
        kept_plans::save(node, module, plan).map_err(host_error)
    }

    fn keep_failure(&self, node: &str, module: &str) -> Option<String> {
        kept_plans::last_failure(node, module)
    }
}

struct Component;

impl api::Guest for Component {
    fn info() -> api::BuildInfo {
        crate::fixture::at_start();
        api::BuildInfo { name: crate::NAME.into(), version: crate::VERSION.into(), wit_version: crate::WIT_VERSION.into() }
    }

    fn compile_registry() -> Vec<api::RegistryEntry> {
        crate::fixture::at_start();
        crate::registry::compile().into_iter().map(|(kind, value)| api::RegistryEntry { kind, value }).collect()
    }

    fn reconcile() -> Result<api::ReconcileReport, types::HostError> {
        let r = crate::reconcile::reconcile(&Imports).map_err(wit_error)?;
        Ok(api::ReconcileReport { puts: r.puts, deletes: r.deletes, unchanged: r.unchanged, conflicts: r.conflicts })
    }

    fn handle(verb: String, request: Vec<u8>, max_reply: u32) -> api::Reply {
        if let Some(body) = crate::fixture::on_request(&request) {
            return api::Reply { code: api::ReplyCode::Ok, body, revision: None };
        }
        let r = crate::allocator::call(|| crate::verb::handle(&Imports, &verb, &request, max_reply));
        let code = match r.code {
            crate::verb::Code::Ok => api::ReplyCode::Ok,
            crate::verb::Code::BadRequest => api::ReplyCode::BadRequest,
            crate::verb::Code::Unavailable => api::ReplyCode::Unavailable,
            crate::verb::Code::Internal => api::ReplyCode::Internal,
            crate::verb::Code::NotCurrent => api::ReplyCode::NotCurrent,
        };
        let revision = r.revision.map(|s| api::RevisionSlot { offset: s.offset, len: s.len, floor: s.floor, bucket: s.bucket.map(String::from), copy: s.copy });
        api::Reply { code, body: r.body, revision }
    }

    fn plan_inputs() -> Vec<String> {
        crate::refresh::inputs()
    }

    fn refresh(changes: Vec<api::Change>) -> Result<api::RefreshReport, types::HostError> {
        crate::fixture::at_refresh();
        let changes: Vec<(String, Option<String>)> = changes.into_iter().map(|c| (c.bucket, c.key)).collect();
        let r = crate::allocator::call(|| crate::refresh::refresh(&Imports, &changes)).map_err(wit_error)?;
        let change = |(bucket, key)| api::Change { bucket, key };
        let (rest, retry) = (r.rest.into_iter().map(change).collect(), r.retry.into_iter().map(change).collect());
        Ok(api::RefreshReport { computed: r.computed, kept: r.kept, held: r.held, waiting: r.waiting, rest, retry })
    }

    fn notice_inputs() -> Vec<String> {
        crate::holders::inputs()
    }

    fn notices(events: Vec<api::ValueEvent>) -> Result<api::NoticeReport, types::HostError> {
        use crate::holders::HolderEvent;
        let events: Vec<HolderEvent> =
            events.into_iter().map(|e| HolderEvent { bucket: e.bucket, key: e.key, revision: e.revision, deleted: e.deleted }).collect();
        let (notices, rest) = crate::allocator::call(|| crate::holders::notify(&Imports, &events)).map_err(wit_error)?;
        Ok(api::NoticeReport {
            notices: notices.into_iter().map(|n| api::Notice { node: n.node, body: n.body }).collect(),
            rest: rest.into_iter().map(|e| api::ValueEvent { bucket: e.bucket, key: e.key, revision: e.revision, deleted: e.deleted }).collect(),
        })
    }

    fn status_inputs() -> Vec<String> {
        crate::transitions::inputs()
    }

    fn transitions(changes: Vec<api::Change>, now: String) -> Result<api::TransitionReport, types::HostError> {
        let changes: Vec<(String, Option<String>)> = changes.into_iter().map(|c| (c.bucket, c.key)).collect();
        let r = crate::allocator::call(|| crate::transitions::transitions(&Imports, &changes, &now)).map_err(wit_error)?;
        Ok(api::TransitionReport {
            computed: r.computed,
            transitions: r
                .transitions
                .into_iter()
                .map(|t| api::Transition { key: t.key, value: t.value, expected: t.expected, node: t.node, state: t.state.to_string(), event: t.event })
                .collect(),
            rest: r.rest.into_iter().map(|(bucket, key)| api::Change { bucket, key }).collect(),
        })
    }
}

export!(Component);
