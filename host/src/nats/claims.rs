//! Accounts pushed to a running server: each account JWT sent to the full resolver
//! (`$SYS.REQ.CLAIMS.UPDATE`, as the system account's user), which stores it, shares it with
//! the cluster and applies it at once: a new account can log in, a changed one's users and
//! imports change, a revoked user's connections close. The JWTs are rendered elsewhere
//! (`accounts::operator`); here they are only sent and the server's word read.

use std::time::Duration;

use async_nats::Client;
use serde::Deserialize;

use crate::base::error::{Error, ErrorKind, Result};

/// Where the full resolver takes an account JWT.
const CLAIMS_UPDATE: &str = "$SYS.REQ.CLAIMS.UPDATE";

#[derive(Deserialize)]
struct Answer {
    data: Option<Outcome>,
    error: Option<Outcome>,
}

#[derive(Deserialize)]
struct Outcome {
    #[serde(default)]
    code: u16,
    #[serde(default, alias = "description")]
    message: String,
}

/// Pushes `jwt` (the account `name`'s) and returns the server's word when it took it.
pub async fn push(client: &Client, name: &str, jwt: &str) -> Result<String> {
    let reply = tokio::time::timeout(Duration::from_secs(10), client.request(CLAIMS_UPDATE, jwt.to_string().into()))
        .await
        .map_err(|_| Error::new(ErrorKind::Timeout, format!("pushing {name}: no answer from the resolver in 10 s")))?
        .map_err(|e| {
            Error::new(ErrorKind::Unavailable, format!("pushing {name}: {e} (is the server in operator mode with a full resolver, and this the system user?)"))
        })?;
    let answer: Answer = serde_json::from_slice(&reply.payload)
        .map_err(|e| Error::new(ErrorKind::Invalid, format!("pushing {name}: the resolver's answer is unreadable: {e}")))?;
    match (answer.data, answer.error) {
        (_, Some(e)) => Err(Error::new(ErrorKind::Denied, format!("pushing {name}: refused ({}): {}", e.code, e.message))),
        (Some(d), None) if d.code == 200 || d.code == 0 => Ok(d.message),
        (Some(d), None) => Err(Error::new(ErrorKind::Denied, format!("pushing {name}: {} {}", d.code, d.message))),
        (None, None) => Err(Error::new(ErrorKind::Invalid, format!("pushing {name}: the resolver answered neither data nor error"))),
    }
}
