//! Host-side bindings of the WIT world `provisioner`, and the imports implemented over a
//! [`Backend`](crate::backend::Backend). Every host failure reaches the guest through
//! [`host_error`], the one place a host [`Error`] becomes the WIT `host-error`.

use std::time::Duration;

use wasmtime::component::HasData;

use super::Ctx;
use crate::error::{Error, ErrorKind};

wasmtime::component::bindgen!({
    world: "provisioner",
    path: "../wit",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use exports::mesh::provisioner::api;
use mesh::provisioner::{bus, kept_plans, log, registry_writer, store, types};

/// Longest a guest's bus request may wait, whatever it asks.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The one mapping from a host failure to what the guest sees.
pub fn host_error(e: Error) -> types::HostError {
    let m = e.message().to_string();
    match e.kind() {
        ErrorKind::Unavailable | ErrorKind::Guest | ErrorKind::Config => types::HostError::Unavailable(m),
        ErrorKind::Conflict => types::HostError::Conflict(m),
        ErrorKind::Denied => types::HostError::Denied(m),
        ErrorKind::Invalid => types::HostError::Invalid(m),
        ErrorKind::Timeout => types::HostError::Timeout(m),
        ErrorKind::NoResponders => types::HostError::NoResponders(m),
        ErrorKind::Corrupt => types::HostError::Corrupt(m),
    }
}

type R<T> = wasmtime::Result<Result<T, types::HostError>>;

fn entry(e: crate::mirror::Entry) -> types::Entry {
    types::Entry { key: e.key, revision: e.revision, value: e.value }
}

impl types::Host for Ctx {}

impl store::Host for Ctx {
    async fn get(&mut self, bucket: String, key: String) -> R<Option<types::Entry>> {
        let got = async { self.backend.mirror(&bucket).await?.get(&key) }.await;
        Ok(got.map(|e| e.map(entry)).map_err(host_error))
    }

    async fn scan(&mut self, bucket: String, filter: String, after: Option<String>, limit: u32) -> R<store::Page> {
        let page = async { self.backend.mirror(&bucket).await?.scan(&filter, after.as_deref(), limit) }.await;
        Ok(page
            .map(|p| store::Page { entries: p.entries.into_iter().map(entry).collect(), more: p.more, revision: p.revision })
            .map_err(host_error))
    }
}

impl registry_writer::Host for Ctx {
    async fn put(&mut self, key: String, value: Vec<u8>, expected: u64) -> R<u64> {
        Ok(self.backend.put_registry(&key, value, expected).await.map_err(host_error))
    }

    async fn delete(&mut self, key: String, expected: u64) -> R<()> {
        Ok(self.backend.delete_registry(&key, expected).await.map_err(host_error))
    }
}

impl kept_plans::Host for Ctx {
    async fn load(&mut self, node: String, module: String) -> R<Option<Vec<u8>>> {
        Ok(self.backend.kept().load(&node, &module).map_err(host_error))
    }

    async fn save(&mut self, node: String, module: String, plan: Vec<u8>) -> R<()> {
        Ok(self.backend.kept().save(&node, &module, &plan).map_err(host_error))
    }
}

impl bus::Host for Ctx {
    async fn request(&mut self, subject: String, body: Vec<u8>, timeout_ms: u32) -> R<Vec<u8>> {
        let timeout = Duration::from_millis(timeout_ms as u64).min(MAX_REQUEST_TIMEOUT);
        Ok(self.backend.request(&subject, body, timeout).await.map_err(host_error))
    }
}

impl log::Host for Ctx {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let message: String = message.chars().take(4096).collect();
        match level {
            log::Level::Trace => tracing::trace!(target: "guest", "{message}"),
            log::Level::Debug => tracing::debug!(target: "guest", "{message}"),
            log::Level::Info => tracing::info!(target: "guest", "{message}"),
            log::Level::Warn => tracing::warn!(target: "guest", "{message}"),
            log::Level::Error => tracing::error!(target: "guest", "{message}"),
        }
        Ok(())
    }
}

/// Marks `Ctx` as the data the imports borrow.
pub struct Imports;

impl HasData for Imports {
    type Data<'a> = &'a mut Ctx;
}
