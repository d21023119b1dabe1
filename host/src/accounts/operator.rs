//! Operator mode: the mesh's accounts signed the NATS way. An operator key signs each account's
//! JWT; each account's key signs its users' JWTs and, for what it lends only to some, the
//! activation each importer carries. `MESH` exports each kind of grant once, by wildcard and
//! token-required (`$KV.*.>`, …), so a node joining the mesh is one new account JWT whose
//! imports carry activations for exactly its subjects: no other account changes, and the
//! running server takes it from a push to its resolver.
//!
//! The keys (nkey seeds, `0600`) are kept in the output directory and reused by every later
//! rendering, so a party's identity and creds survive a re-render; a revoked user is never
//! issued again (a JWT issued after its revocation would be valid). Files only here; pushing
//! to a server is `nats::claims`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nkeys::{KeyPair, KeyPairType};
use serde_json::Value;

use super::jwt;
use super::parties::{self, Account, Export, Kind, Mesh, MeshJetStream, MESH, SYS};
use crate::base::error::{Error, ErrorKind, Result};

/// What `MESH` lends only to some, in operator mode: each kind of grant once, by wildcard,
/// each import needing an activation `MESH` signed for exactly its subject.
pub const MESH_TOKEN_EXPORTS: [(Kind, &str); 5] = [
    (Kind::Service, "$KV.*.>"),
    (Kind::Service, "$JS.API.STREAM.INFO.*"),
    (Kind::Service, "$JS.API.DIRECT.GET.*.>"),
    (Kind::Stream, "mesh-provisioner.notice.*"),
    (Kind::Stream, "mesh-provisioner.event.>"),
];

/// The nkeys of the mesh, one file each under `dir` (`0700`), made when first asked for.
pub struct Keys {
    dir: PathBuf,
}

impl Keys {
    pub fn open(dir: &Path) -> Result<Keys> {
        crate::base::files::private_dirs(dir).map_err(|e| Error::new(ErrorKind::Config, format!("the keys directory {}: {e}", dir.display())))?;
        Ok(Keys { dir: dir.to_path_buf() })
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(format!("{file}.nk"))
    }

    /// The key kept as `file`, made (from the OS's randomness) if there is none.
    fn get(&self, file: &str, kind: KeyPairType) -> Result<KeyPair> {
        let path = self.path(file);
        match std::fs::read_to_string(&path) {
            Ok(seed) => {
                let kp = KeyPair::from_seed(seed.trim()).map_err(|e| Error::new(ErrorKind::Config, format!("{} holds no nkey seed: {e}", path.display())))?;
                if kp.key_pair_type() != kind {
                    return Err(Error::new(ErrorKind::Config, format!("{} holds a {:?} key, not a {kind:?} key", path.display(), kp.key_pair_type())));
                }
                Ok(kp)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let kp = KeyPair::new_from_raw(kind.clone(), crate::base::random::random_bytes::<32>()?)
                    .map_err(|e| Error::new(ErrorKind::Config, format!("making a {kind:?} key: {e}")))?;
                let seed = kp.seed().map_err(|e| Error::new(ErrorKind::Config, format!("a new key's seed: {e}")))?;
                crate::base::files::write_private(&path, format!("{seed}\n").as_bytes())
                    .map_err(|e| Error::new(ErrorKind::Config, format!("writing {}: {e}", path.display())))?;
                Ok(kp)
            }
            Err(e) => Err(Error::new(ErrorKind::Config, format!("reading {}: {e}", path.display()))),
        }
    }

    pub fn operator(&self) -> Result<KeyPair> {
        self.get("operator", KeyPairType::Operator)
    }

    pub fn account(&self, name: &str) -> Result<KeyPair> {
        self.get(&format!("account-{name}"), KeyPairType::Account)
    }

    pub fn user(&self, name: &str) -> Result<KeyPair> {
        self.get(&format!("user-{name}"), KeyPairType::User)
    }

    /// The accounts whose keys are kept: every account ever rendered here.
    pub fn accounts(&self) -> Result<Vec<String>> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::new(ErrorKind::Config, format!("reading {}: {e}", self.dir.display())))?;
        let mut out: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("account-")).and_then(|n| n.strip_suffix(".nk")).map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }
}

/// Users revoked, by account: a user's public key (or `*`, all of them) and when.
pub type Revocations = BTreeMap<String, BTreeMap<String, u64>>;

/// One account, signed.
#[derive(Debug, Clone)]
pub struct SignedAccount {
    pub name: String,
    pub public_key: String,
    pub jwt: String,
}

/// The mesh signed: what a server trusts and what each party logs in with.
#[derive(Debug, Clone)]
pub struct Signed {
    pub operator_jwt: String,
    pub system_account: String,
    pub accounts: Vec<SignedAccount>,
    /// user → creds file text, for every user not revoked.
    pub creds: Vec<(String, String)>,
    /// Accounts kept from an earlier rendering whose party left the mesh: signed with every
    /// user revoked and nothing imported.
    pub retired: Vec<String>,
}

impl Signed {
    pub fn account(&self, name: &str) -> Option<&SignedAccount> {
        self.accounts.iter().find(|a| a.name == name)
    }
}

/// The exports of `a` in operator mode: public ones as they are; what is lent only to some,
/// token-required (for `MESH`, each kind of grant once, by wildcard).
fn exports_of(a: &Account) -> Vec<(Export, bool)> {
    let mut out: Vec<(Export, bool)> = a.all_exports().filter(|e| e.accounts.is_empty()).map(|e| (e.clone(), false)).collect();
    if a.name == MESH {
        out.extend(MESH_TOKEN_EXPORTS.iter().map(|(kind, s)| (Export { kind: *kind, subject: s.to_string(), accounts: vec![], response_stream: false }, true)));
    } else {
        out.extend(a.all_exports().filter(|e| !e.accounts.is_empty()).map(|e| (e.clone(), true)));
    }
    out
}

/// Signs every account of `mesh` with the keys in `keys`, and every user not revoked.
pub fn sign(mesh: &Mesh, keys: &Keys, revoked: &Revocations) -> Result<Signed> {
    let operator = keys.operator()?;
    let accounts = mesh.accounts();
    let mut account_keys = BTreeMap::new();
    for a in &accounts {
        account_keys.insert(a.name.clone(), keys.account(&a.name)?);
    }
    // Each account's exports worked out once: MESH's grow with the mesh, and every import of
    // every node is checked against them.
    let exported: BTreeMap<&str, Vec<(Export, bool)>> = accounts.iter().map(|a| (a.name.as_str(), exports_of(a))).collect();
    let system_account = account_keys[SYS].public_key();
    let operator_jwt = jwt::operator(&operator, "mesh", &system_account)?;
    let mut signed = Vec::new();
    let mut creds = Vec::new();
    for a in &accounts {
        let key = &account_keys[&a.name];
        let exports = &exported[a.name.as_str()];
        let mut imports = Vec::new();
        // One activation a subject: an account imports some subjects more than once (to more
        // than one local subject), and one token proves each of them.
        let mut tokens: BTreeMap<(String, String), String> = BTreeMap::new();
        for i in &a.imports {
            let from =
                accounts.iter().find(|x| x.name == i.account).ok_or_else(|| Error::new(ErrorKind::Config, format!("{} imports from no account", a.name)))?;
            let token_req = exported[from.name.as_str()]
                .iter()
                .find(|(e, _)| e.kind == i.kind && crate::base::wire::contains(&e.subject, &i.subject))
                .map(|(_, t)| *t)
                .ok_or_else(|| Error::new(ErrorKind::Config, format!("{} exports nothing holding {}'s import {}", from.name, a.name, i.subject)))?;
            let exporter = &account_keys[&from.name];
            let token = match tokens.get(&(from.name.clone(), i.subject.clone())) {
                _ if !token_req => None,
                Some(t) => Some(t.clone()),
                None => {
                    let t = jwt::activation(exporter, &key.public_key(), i)?;
                    tokens.insert((from.name.clone(), i.subject.clone()), t.clone());
                    Some(t)
                }
            };
            imports.push(jwt::import(i, &exporter.public_key(), token));
        }
        let revocations: Vec<(String, u64)> = revoked.get(&a.name).map(|m| m.iter().map(|(k, t)| (k.clone(), *t)).collect()).unwrap_or_default();
        let exports: Vec<Value> = exports.iter().map(|(e, t)| jwt::export(e, *t)).collect();
        let js = a.jetstream.then(|| MeshJetStream::of(mesh));
        let token = jwt::account(&operator, &key.public_key(), &a.name, exports, imports, js, &revocations)?;
        for u in &a.users {
            let ukey = keys.user(&u.name)?;
            let upub = ukey.public_key();
            if revocations.iter().any(|(k, _)| k == &upub || k == "*") {
                continue;
            }
            let ujwt = jwt::user(key, &upub, &u.name, u.grant.as_ref())?;
            let seed = ukey.seed().map_err(|e| Error::new(ErrorKind::Config, format!("{}'s seed: {e}", u.name)))?;
            creds.push((u.name.clone(), jwt::creds(&ujwt, &seed)));
        }
        signed.push(SignedAccount { name: a.name.clone(), public_key: key.public_key(), jwt: token });
    }
    // Parties that left: their accounts stay known to the server, every user refused.
    let mut retired = Vec::new();
    for name in keys.accounts()? {
        if account_keys.contains_key(&name) {
            continue;
        }
        let key = keys.account(&name)?;
        let all = [("*".to_string(), jwt::now())];
        let token = jwt::account(&operator, &key.public_key(), &name, vec![], vec![], None, &all)?;
        signed.push(SignedAccount { name: name.clone(), public_key: key.public_key(), jwt: token });
        retired.push(name);
    }
    Ok(Signed { operator_jwt, system_account, accounts: signed, creds, retired })
}

/// The operator-mode server config: the operator, the system account, and a full resolver
/// preloaded with the mesh's own accounts (all but the nodes'). Its directory is a placeholder,
/// `{{RESOLVER_DIR}}`, as the port and the store are: seeded from `resolver/` (every account,
/// `<public key>.jwt`, the full resolver's own layout), so a server starts with thousands of
/// node accounts without parsing them, and takes later ones by push.
pub fn server_config(mesh: &Mesh, signed: &Signed) -> String {
    use std::fmt::Write;
    let limits = MeshJetStream::of(mesh);
    let mut out = String::with_capacity(signed.accounts.len() * 4096 + 4096);
    out.push_str(
        "# The mesh's accounts in operator mode (`mesh-provisioner accounts --operator`): the operator\n\
         # JWT, the system account, and a full resolver preloaded with the mesh's own accounts; the\n\
         # nodes' are in its directory (seed it with a copy of resolver/). A node that joins later\n\
         # is pushed to the resolver (`accounts --operator --push`), no restart.\n\
         # Each party logs in with its creds file (creds/<user>.creds). The placeholders in double\n\
         # braces (PORT, STORE_DIR, RESOLVER_DIR, CLUSTER) are filled in by whoever runs it.\n\n",
    );
    out.push_str("listen: \"127.0.0.1:{{PORT}}\"\nserver_name: \"mesh-{{PORT}}\"\n\n{{CLUSTER}}\n\n");
    let _ = writeln!(
        out,
        "jetstream {{\n  store_dir: \"{{{{STORE_DIR}}}}\"\n  max_memory_store: {}MB\n  max_file_store: {}GB\n}}\n",
        limits.memory_bytes >> 20,
        limits.server_file_bytes() >> 30
    );
    let _ = writeln!(out, "operator: \"{}\"\nsystem_account: {}\n", signed.operator_jwt, signed.system_account);
    out.push_str("resolver: {\n  type: full\n  dir: \"{{RESOLVER_DIR}}\"\n  allow_delete: false\n  interval: \"2m\"\n  timeout: \"2s\"\n}\n\n");
    out.push_str("resolver_preload: {\n");
    for a in signed.accounts.iter().filter(|a| !mesh.nodes.iter().any(|n| parties::node_account_name(n) == a.name)) {
        let _ = writeln!(out, "  # {}\n  {}: \"{}\"", a.name, a.public_key, a.jwt);
    }
    out.push_str("}\n");
    out
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::base::files::write_private(path, bytes).map_err(|e| Error::new(ErrorKind::Config, format!("writing {}: {e}", path.display())))
}

fn dir(path: &Path) -> Result<()> {
    crate::base::files::private_dirs(path).map_err(|e| Error::new(ErrorKind::Config, format!("making {}: {e}", path.display())))
}

/// Signs `mesh` with the keys under `out/keys`, revoking `revoke` first, and writes every file
/// of operator mode under `out`.
pub fn render_into(mesh: &Mesh, out: &Path, revoke: &[String]) -> Result<Signed> {
    dir(out)?;
    let keys = Keys::open(&out.join("keys"))?;
    let revocations_path = out.join("revocations.json");
    let mut revoked: Revocations = match std::fs::read_to_string(&revocations_path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| Error::new(ErrorKind::Config, format!("{} is unreadable: {e}", revocations_path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Revocations::new(),
        Err(e) => return Err(Error::new(ErrorKind::Config, format!("reading {}: {e}", revocations_path.display()))),
    };
    let accounts = mesh.accounts();
    for user in revoke {
        let account = accounts
            .iter()
            .find(|a| a.users.iter().any(|u| &u.name == user))
            .ok_or_else(|| Error::new(ErrorKind::Config, format!("--revoke {user}: no user of that name in this mesh")))?;
        revoked.entry(account.name.clone()).or_default().insert(keys.user(user)?.public_key(), jwt::now());
    }
    let text = serde_json::to_vec_pretty(&revoked).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    write(&revocations_path, &text)?;
    let signed = sign(mesh, &keys, &revoked)?;
    for sub in ["resolver", "creds"] {
        dir(&out.join(sub))?;
    }
    write(&out.join("operator.jwt"), signed.operator_jwt.as_bytes())?;
    for a in &signed.accounts {
        write(&out.join("resolver").join(format!("{}.jwt", a.public_key)), a.jwt.as_bytes())?;
    }
    let names: BTreeMap<&str, &str> = signed.accounts.iter().map(|a| (a.name.as_str(), a.public_key.as_str())).collect();
    let index = serde_json::to_vec_pretty(&names).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    write(&out.join("accounts.json"), &index)?;
    // Only the creds of users who may log in: a revoked or retired user's are removed.
    let users: std::collections::BTreeSet<&str> = signed.creds.iter().map(|(u, _)| u.as_str()).collect();
    let entries = std::fs::read_dir(out.join("creds")).map_err(|e| Error::new(ErrorKind::Config, format!("reading {}/creds: {e}", out.display())))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().trim_end_matches(".creds").to_string();
        if !users.contains(name.as_str()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    for (user, text) in &signed.creds {
        write(&out.join("creds").join(format!("{user}.creds")), text.as_bytes())?;
    }
    write(&out.join("nats-server.conf"), server_config(mesh, &signed).as_bytes())?;
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    fn claims(jwt: &str) -> Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(jwt.split('.').nth(1).expect("claims")).expect("b64")).expect("json")
    }

    fn mesh(nodes: &[&str]) -> Mesh {
        Mesh::new(nodes.iter().map(|s| s.to_string()).collect(), vec!["postgres".into()]).expect("mesh")
    }

    #[test]
    fn keys_are_kept_and_reused_and_private() {
        let dir = tempfile::tempdir().expect("dir");
        let keys = Keys::open(&dir.path().join("keys")).expect("keys");
        let a = keys.account("MESH").expect("made").public_key();
        assert_eq!(keys.account("MESH").expect("read").public_key(), a);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("keys/account-MESH.nk")).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join("keys/user-x.nk"), keys.operator().expect("op").seed().expect("seed")).expect("write");
        let e = keys.user("x").expect_err("an operator key is no user key");
        assert!(e.message().contains("not a User key"), "{}", e.message());
    }

    #[test]
    fn a_node_imports_by_activations_of_exactly_its_subjects() {
        let dir = tempfile::tempdir().expect("dir");
        let keys = Keys::open(dir.path()).expect("keys");
        let signed = sign(&mesh(&["alpha", "beta"]), &keys, &Revocations::new()).expect("signed");
        let mesh_pub = signed.account(MESH).expect("mesh").public_key.clone();
        let alpha = signed.account("NODE_ALPHA").expect("alpha");
        let c = claims(&alpha.jwt);
        let imports = c["nats"]["imports"].as_array().expect("imports");
        let mut tokens = 0;
        for i in imports {
            if let Some(token) = i["token"].as_str() {
                tokens += 1;
                let act = claims(token);
                assert_eq!(act["iss"], mesh_pub, "signed by MESH");
                assert_eq!(act["sub"], alpha.public_key, "for alpha's account");
                assert!(crate::base::wire::contains(act["nats"]["subject"].as_str().expect("subject"), i["subject"].as_str().expect("s")));
                assert!(!act["nats"]["subject"].as_str().expect("s").contains("beta"));
            }
        }
        assert!(tokens >= 20, "every bucket, share and stream import carries an activation: {tokens}");
        let exports = claims(&signed.account(MESH).expect("mesh").jwt)["nats"]["exports"].as_array().expect("exports").clone();
        assert!(exports
            .iter()
            .all(|e| e["token_req"] == true || e["subject"].as_str().is_some_and(|s| s.starts_with("mesh-provisioner.") || s.starts_with("$SRV"))));
    }

    #[test]
    fn a_node_added_changes_no_other_accounts_grant() {
        let dir = tempfile::tempdir().expect("dir");
        let keys = Keys::open(dir.path()).expect("keys");
        let two = sign(&mesh(&["alpha", "beta"]), &keys, &Revocations::new()).expect("two");
        let three = sign(&mesh(&["alpha", "beta", "gamma"]), &keys, &Revocations::new()).expect("three");
        for name in ["MESH", "NODE_ALPHA", "PROVIDER_POSTGRES"] {
            let strip = |s: &Signed| {
                let mut c = claims(&s.account(name).expect("there").jwt);
                for f in ["iat", "jti"] {
                    c.as_object_mut().expect("object").remove(f);
                }
                // Activations are signed anew each time; what they grant is compared.
                for i in c["nats"]["imports"].as_array_mut().into_iter().flatten() {
                    if let Some(t) = i.get("token").and_then(Value::as_str).map(str::to_string) {
                        i["token"] = claims(&t)["nats"].clone();
                    }
                }
                c
            };
            assert_eq!(strip(&two), strip(&three), "{name} is unchanged by gamma joining");
        }
        assert_eq!(two.account("NODE_ALPHA").expect("a").public_key, three.account("NODE_ALPHA").expect("a").public_key);
    }

    #[test]
    fn a_party_that_left_is_retired_with_every_user_revoked() {
        let dir = tempfile::tempdir().expect("dir");
        let keys = Keys::open(dir.path()).expect("keys");
        sign(&mesh(&["alpha", "beta"]), &keys, &Revocations::new()).expect("two");
        let one = sign(&mesh(&["alpha"]), &keys, &Revocations::new()).expect("one");
        assert_eq!(one.retired, ["NODE_BETA"]);
        let beta = claims(&one.account("NODE_BETA").expect("kept").jwt);
        assert!(beta["nats"]["revocations"]["*"].as_u64().is_some());
        assert!(beta["nats"].get("imports").is_none());
        assert!(!one.creds.iter().any(|(u, _)| u == "node-beta"));
    }

    #[test]
    fn a_revoked_user_is_not_issued_again() {
        let dir = tempfile::tempdir().expect("dir");
        let keys = Keys::open(dir.path()).expect("keys");
        let alpha = keys.user("node-alpha").expect("key").public_key();
        let mut revoked = Revocations::new();
        revoked.entry("NODE_ALPHA".into()).or_default().insert(alpha.clone(), jwt::now());
        let signed = sign(&mesh(&["alpha"]), &keys, &revoked).expect("signed");
        assert!(!signed.creds.iter().any(|(u, _)| u == "node-alpha"));
        assert!(signed.creds.iter().any(|(u, _)| u == "leaf-alpha"));
        assert!(claims(&signed.account("NODE_ALPHA").expect("a").jwt)["nats"]["revocations"][&alpha].as_u64().is_some());
    }
}
