//! Serving the verbs as a NATS micro service (`$SRV.PING|INFO|STATS` included).
//!
//! Each request is answered by the current guest in a fresh instance; the host only maps the
//! guest's reply code to the micro-service error headers (`400`, `503`, `500`) and keeps the body,
//! which for errors is `{"error":{"code","message"}}`.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::service::{self, ServiceExt};
use async_nats::{Client, HeaderMap};
use futures::StreamExt;
use tokio::sync::Semaphore;

use crate::backend::Backend;
use crate::current::Current;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{Limits, ReplyCode};

pub const SERVICE_NAME: &str = "mesh-provisioner";
pub const PROVISIONING: &str = "mesh-provisioner.provisioning";
/// Requests answered at once; more wait for a slot.
const CONCURRENCY: usize = 256;
/// Room left in a message for headers and framing.
const HEADROOM: usize = 1024;

/// Starts the micro service and answers requests until `shutdown` resolves.
pub async fn serve(
    client: Client,
    backend: Arc<dyn Backend>,
    current: Arc<Current>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let loaded = current.get();
    let mut metadata = HashMap::new();
    metadata.insert("component_digest".to_string(), loaded.guest.digest().to_string());
    metadata.insert("component_version".to_string(), loaded.info.version.clone());
    metadata.insert("component_name".to_string(), loaded.info.name.clone());
    metadata.insert("wit".to_string(), loaded.info.wit_version.clone());
    let svc = client
        .service_builder()
        .description("mesh-provisioner: the registry of placeholder kinds and what the nodes need, applied and collected")
        .metadata(metadata)
        .start(SERVICE_NAME, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("starting the micro service: {e}")))?;
    let mut endpoint = svc
        .endpoint_builder()
        .name("provisioning")
        .add(PROVISIONING)
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("adding the endpoint: {e}")))?;
    let max_reply = client.server_info().max_payload.saturating_sub(HEADROOM).max(4096) as u32;
    tracing::info!(subject = PROVISIONING, max_reply, "serving");
    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    tokio::pin!(shutdown);
    loop {
        let request = tokio::select! {
            r = endpoint.next() => match r {
                Some(r) => r,
                None => break,
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().acquire_owned().await else { break };
        let (backend, current) = (backend.clone(), current.clone());
        tokio::spawn(async move {
            answer(request, backend, current, limits, max_reply).await;
            drop(permit);
        });
    }
    let _ = svc.stop().await;
    Ok(())
}

async fn answer(request: service::Request, backend: Arc<dyn Backend>, current: Arc<Current>, limits: Limits, max_reply: u32) {
    let loaded = current.get();
    let body = &request.message.payload;
    let (code, body) = match loaded.guest.handle(backend, limits, PROVISIONING, body, max_reply).await {
        Ok(reply) => (reply.code, reply.body),
        Err(e) => {
            tracing::warn!("guest failed a request: {e}");
            (ReplyCode::Internal, error_body("internal", e.message()))
        }
    };
    let sent = match code {
        ReplyCode::Ok => request.respond(Ok(body.into())).await,
        other => {
            let (status, number) = match other {
                ReplyCode::BadRequest => ("bad request", 400),
                ReplyCode::Unavailable => ("unavailable", 503),
                _ => ("internal error", 500),
            };
            let mut headers = HeaderMap::new();
            headers.insert(service::NATS_SERVICE_ERROR, status);
            headers.insert(service::NATS_SERVICE_ERROR_CODE, number.to_string().as_str());
            request.respond_with_headers(Ok(body.into()), headers).await
        }
    };
    if let Err(e) = sent {
        tracing::warn!("could not send a reply: {e}");
    }
}

/// The error body of the SPEC, for failures the guest could not answer itself.
pub fn error_body(code: &str, message: &str) -> Vec<u8> {
    serde_json::json!({"error": {"code": code, "message": message}}).to_string().into_bytes()
}
