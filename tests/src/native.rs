//! The guest's logic called natively (no wasm), over the same in-memory mirrors and kept plans
//! the component reads through its imports: the baseline the benchmarks measure the component
//! against. Read-only: registry writes are refused.

use std::sync::Arc;

use guest::env::{Entry, Env, HostError, Level, Page};
use mesh_provisioner::store::backend::{Backend, MemoryBackend};

/// The logic's `Env` over a [`MemoryBackend`].
pub struct Native(pub Arc<MemoryBackend>);

fn entry(e: mesh_provisioner::store::mirror::Entry) -> Entry {
    Entry { key: e.key, revision: e.revision, value: e.value }
}

/// The host's page as the guest reads it (cut into entries by its lengths), or why it cannot be.
pub fn cut(p: mesh_provisioner::store::mirror::Page) -> Result<Page, String> {
    Page::from_parts(p.keys, p.values, p.lengths, p.revisions, p.more, p.revision)
}

/// Every entry of the host's page, owned.
pub fn entries(p: mesh_provisioner::store::mirror::Page) -> Vec<Entry> {
    cut(p).map(|p| p.entries().map(|e| e.owned()).collect()).unwrap_or_else(|why| panic!("a page the guest refuses: {why}"))
}

impl Env for Native {
    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError> {
        let e = self.0.bucket(bucket).get(key).map_err(|e| HostError::Invalid(e.to_string()))?;
        Ok(e.map(entry))
    }
    fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError> {
        let p = self.0.bucket(bucket).scan(filter, after, limit).map_err(|e| HostError::Invalid(e.to_string()))?;
        cut(p).map_err(|why| HostError::Corrupt(format!("a page of {bucket}: {why}")))
    }
    fn exists(&self, bucket: &str) -> Result<bool, HostError> {
        Ok(self.0.bucket(bucket).exists())
    }
    fn responders(&self, service: &str) -> Result<u32, HostError> {
        Ok(self.0.responders_of(service))
    }
    fn put_registry(&self, _: &str, _: &[u8], _: u64) -> Result<u64, HostError> {
        Err(HostError::Denied("read-only".into()))
    }
    fn delete_registry(&self, _: &str, _: u64) -> Result<(), HostError> {
        Err(HostError::Denied("read-only".into()))
    }
    fn log(&self, _: Level, _: &str) {}
    fn load_plan(&self, node: &str, module: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.0.kept().load(node, module).map_err(|e| HostError::Corrupt(e.to_string()))
    }
    fn save_plan(&self, node: &str, module: &str, plan: &[u8]) -> Result<(), HostError> {
        self.0.kept().save(node, module, plan).map_err(|e| HostError::Unavailable(e.to_string()))
    }
    fn keep_failure(&self, node: &str, module: &str) -> Option<String> {
        self.0.kept().last_failure(node, module)
    }
}
