//! An in-memory [`Env`] for the guest's own tests and the fuzz checks: ordered keys, NATS
//! subject filters, a plan that cannot be kept for the module `app`. Test support only: it
//! stands on `env` and `keys` and nothing above them, so no answer's tests reach back to it
//! through another answer.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::env::{Entry, Env, HostError, Level, Page};

/// One bucket: key → (revision, value).
type Bucket = BTreeMap<String, (u64, Vec<u8>)>;

/// A bucket store for the checks: ordered keys, NATS subject filters.
#[derive(Default)]
pub struct MemEnv {
    buckets: Mutex<BTreeMap<String, Bucket>>,
    revision: Mutex<u64>,
}

impl MemEnv {
    pub fn put(&self, bucket: &str, key: &str, value: &[u8]) {
        let mut r = self.revision.lock().unwrap_or_else(|p| p.into_inner());
        *r += 1;
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        b.entry(bucket.into()).or_default().insert(key.into(), (*r, value.to_vec()));
    }
}

impl Env for MemEnv {
    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, HostError> {
        let b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        Ok(b.get(bucket).and_then(|m| m.get(key)).map(|(r, v)| Entry { key: key.into(), revision: *r, value: v.clone() }))
    }
    fn scan(&self, bucket: &str, filter: &str, after: Option<&str>, limit: u32) -> Result<Page, HostError> {
        let b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut page = Page::default();
        for (k, (r, v)) in b.get(bucket).into_iter().flatten() {
            if after.is_some_and(|a| k.as_str() <= a) || !crate::keys::matches(filter, k) {
                continue;
            }
            if page.len() == limit as usize {
                page.more = true;
                break;
            }
            page.revision = page.revision.max(*r);
            page.push(k, *r, v);
        }
        Ok(page)
    }
    fn exists(&self, bucket: &str) -> Result<bool, HostError> {
        Ok(self.buckets.lock().unwrap_or_else(|p| p.into_inner()).contains_key(bucket))
    }
    fn responders(&self, _: &str) -> Result<u32, HostError> {
        Ok(1)
    }
    fn put_registry(&self, _: &str, _: &[u8], _: u64) -> Result<u64, HostError> {
        Err(HostError::Denied("read-only".into()))
    }
    fn delete_registry(&self, _: &str, _: u64) -> Result<(), HostError> {
        Err(HostError::Denied("read-only".into()))
    }
    fn log(&self, _: Level, _: &str) {}
    fn load_plan(&self, _: &str, _: &str) -> Result<Option<Vec<u8>>, HostError> {
        Ok(None)
    }
    fn save_plan(&self, _: &str, _: &str, _: &[u8]) -> Result<(), HostError> {
        Ok(())
    }
    fn keep_failure(&self, _: &str, module: &str) -> Option<String> {
        (module == "app").then(|| "No space left on device".into())
    }
}
