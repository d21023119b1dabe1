//! NATS JWTs (version 2) and creds files, as nats-server reads them: a header, claims and an
//! ed25519 signature by the issuer's nkey, each part base64url without padding. Operator,
//! account, user and activation claims are written here from the mesh's model; nothing here
//! decodes a JWT from outside (the server does).

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use nkeys::KeyPair;
use serde_json::{json, Value};
use sha2::{Digest, Sha512_256};

use super::parties::{Export, Grant, Import, Kind, MeshJetStream};
use crate::base::error::{Error, ErrorKind, Result};

/// A response permission's time to answer, in nanoseconds: the server's default for
/// `allow_responses: true` in a config file (two minutes).
const RESPONSE_TTL_NS: u64 = 120_000_000_000;

/// Now, in seconds since the epoch: a claim's `iat`.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A JWT of `nats` claims about `subject` (a public key), issued and signed by `issuer`.
pub fn encode(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> Result<String> {
    let iat = now();
    let iss = issuer.public_key();
    // The id is the hash of the standard claims with no id, as the NATS tools make it.
    let standard = json!({ "iat": iat, "iss": iss, "name": name, "sub": subject });
    let jti = data_encoding::BASE32_NOPAD.encode(&Sha512_256::digest(standard.to_string().as_bytes()));
    let claims = json!({ "jti": jti, "iat": iat, "iss": iss, "name": name, "sub": subject, "nats": nats });
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string().as_bytes()));
    let signature = issuer.sign(signed.as_bytes()).map_err(|e| Error::new(ErrorKind::Config, format!("signing the claims of {name}: {e}")))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// The operator's claims: self-signed, naming the system account.
pub fn operator(operator: &KeyPair, name: &str, system_account: &str) -> Result<String> {
    encode(operator, &operator.public_key(), name, json!({ "type": "operator", "version": 2, "system_account": system_account }))
}

fn kind(k: Kind) -> &'static str {
    match k {
        Kind::Service => "service",
        Kind::Stream => "stream",
    }
}

/// An activation: `exporter` lets the account `importer` (a public key) import `import`.
pub fn activation(exporter: &KeyPair, importer: &str, import: &Import) -> Result<String> {
    encode(exporter, importer, &import.subject, json!({ "type": "activation", "version": 2, "subject": import.subject, "kind": kind(import.kind) }))
}

/// One export of an account JWT: public, or (`token_req`) only to an account holding an
/// activation the exporter signed.
pub fn export(e: &Export, token_req: bool) -> Value {
    let mut v = json!({ "name": e.subject, "subject": e.subject, "type": kind(e.kind) });
    if token_req {
        v["token_req"] = json!(true);
    }
    if e.response_stream {
        v["response_type"] = json!("Stream");
    }
    v
}

/// One import of an account JWT, from the account `from` (a public key), with its activation.
pub fn import(i: &Import, from: &str, token: Option<String>) -> Value {
    let mut v = json!({ "name": i.subject, "subject": i.subject, "account": from, "type": kind(i.kind) });
    if let Some(local) = &i.local {
        v["local_subject"] = json!(local);
    }
    if let Some(token) = token {
        v["token"] = json!(token);
    }
    v
}

/// An account's claims: its exports and imports, its limits (JetStream only where given), and
/// the users it revoked (public key, or `*` for all, and the time before which their JWTs are
/// refused).
pub fn account(
    operator: &KeyPair,
    account: &str,
    name: &str,
    exports: Vec<Value>,
    imports: Vec<Value>,
    jetstream: Option<MeshJetStream>,
    revocations: &[(String, u64)],
) -> Result<String> {
    let mut limits = json!({ "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1 });
    if let Some(js) = jetstream {
        limits["mem_storage"] = json!(js.memory_bytes);
        limits["disk_storage"] = json!(js.file_bytes);
        limits["streams"] = json!(js.streams);
        limits["consumer"] = json!(js.consumers);
        limits["max_bytes_required"] = json!(true);
    }
    let mut nats = json!({ "type": "account", "version": 2, "limits": limits, "default_permissions": { "pub": {}, "sub": {} } });
    if !exports.is_empty() {
        nats["exports"] = Value::Array(exports);
    }
    if !imports.is_empty() {
        nats["imports"] = Value::Array(imports);
    }
    if !revocations.is_empty() {
        nats["revocations"] = revocations.iter().map(|(k, t)| (k.clone(), json!(t))).collect::<serde_json::Map<_, _>>().into();
    }
    encode(operator, account, name, nats)
}

/// A user's claims, issued by its account: its grant, or the account's whole space if none.
pub fn user(account: &KeyPair, user: &str, name: &str, grant: Option<&Grant>) -> Result<String> {
    let mut nats = json!({ "type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1 });
    if let Some(g) = grant {
        let mut publish = json!({});
        if !g.publish_allow.is_empty() {
            publish["allow"] = json!(g.publish_allow);
        }
        if !g.publish_deny.is_empty() {
            publish["deny"] = json!(g.publish_deny);
        }
        nats["pub"] = publish;
        nats["sub"] = if g.subscribe_allow.is_empty() { json!({}) } else { json!({ "allow": g.subscribe_allow }) };
        if g.allow_responses {
            nats["resp"] = json!({ "max": 1, "ttl": RESPONSE_TTL_NS });
        }
    }
    encode(account, user, name, nats)
}

/// A creds file: the user's JWT and its nkey seed, in the form every NATS client reads.
pub fn creds(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// The user a creds file's JWT names (its `name` claim), if the file holds one that reads: the
/// user's inbox prefix is named after it. Read, not trusted: the server checks the JWT.
pub fn user_of_creds(text: &str) -> Option<String> {
    let jwt = text.lines().skip_while(|l| !l.contains("BEGIN NATS USER JWT")).nth(1)?.trim();
    // A JWT's parts: header, claims, signature.
    let (_header, rest) = jwt.split_once('.')?;
    let (claims, _signature) = rest.split_once('.')?;
    let claims = URL_SAFE_NO_PAD.decode(claims).ok()?;
    let claims: Value = serde_json::from_slice(&claims).ok()?;
    let name = claims.get("name")?.as_str()?;
    crate::base::wire::check_subject(name, false).ok().map(|_| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(jwt: &str, i: usize) -> Value {
        let p = jwt.split('.').nth(i).expect("three parts");
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).expect("base64url")).expect("json")
    }

    #[test]
    fn a_jwt_is_signed_by_its_issuer_over_header_and_claims() {
        let op = KeyPair::new_operator();
        let acc = KeyPair::new_account();
        let jwt = account(&op, &acc.public_key(), "MESH", vec![], vec![], None, &[]).expect("signed");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(part(&jwt, 0)["alg"], "ed25519-nkey");
        let claims = part(&jwt, 1);
        assert_eq!(claims["iss"], op.public_key());
        assert_eq!(claims["sub"], acc.public_key());
        assert_eq!(claims["nats"]["type"], "account");
        assert_eq!(claims["nats"]["limits"]["subs"], -1, "no limit, not none");
        assert!(claims["nats"]["limits"].get("disk_storage").is_none(), "no JetStream unless given");
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).expect("signature");
        op.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig).expect("the operator's signature verifies");
        assert!(acc.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig).is_err(), "and no other key's");
    }

    #[test]
    fn a_users_grant_is_its_permissions_and_responses_are_one_each() {
        let acc = KeyPair::new_account();
        let u = KeyPair::new_user();
        let grant = Grant { publish_deny: vec![">".into()], subscribe_allow: vec!["a.b".into()], allow_responses: true, ..Grant::default() };
        let claims = part(&user(&acc, &u.public_key(), "svc", Some(&grant)).expect("signed"), 1);
        assert_eq!(claims["nats"]["pub"], json!({ "deny": [">"] }));
        assert_eq!(claims["nats"]["sub"], json!({ "allow": ["a.b"] }));
        assert_eq!(claims["nats"]["resp"]["max"], 1);
        let whole = part(&user(&acc, &u.public_key(), "leaf", None).expect("signed"), 1);
        assert!(whole["nats"].get("pub").is_none(), "no grant: the account's whole space");
    }

    #[test]
    fn a_creds_file_names_its_user_and_nothing_else_does() {
        let acc = KeyPair::new_account();
        let u = KeyPair::new_user();
        let token = user(&acc, &u.public_key(), "node-alpha", None).expect("signed");
        assert_eq!(user_of_creds(&creds(&token, "SUX")).as_deref(), Some("node-alpha"));
        assert_eq!(user_of_creds("not a creds file"), None);
        assert_eq!(user_of_creds(&creds("eyJ.!!.x", "SUX")), None);
        let odd = user(&acc, &u.public_key(), "a b.>", None).expect("signed");
        assert_eq!(user_of_creds(&creds(&odd, "SUX")), None, "a name that is no subject token names no inbox");
    }

    #[test]
    fn creds_hold_the_jwt_and_the_seed_where_clients_look() {
        let text = creds("eyJ.x.y", "SUABC");
        assert!(text.contains("-----BEGIN NATS USER JWT-----\neyJ.x.y\n------END NATS USER JWT------"));
        assert!(text.contains("-----BEGIN USER NKEY SEED-----\nSUABC\n------END USER NKEY SEED------"));
    }
}
