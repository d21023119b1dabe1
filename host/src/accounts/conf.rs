//! The static server config: the mesh's accounts as a `nats-server` config file with `{{…}}`
//! placeholders (the port, the store, a cluster block, one password a user), which the embedded
//! default and the tests fill in. `deploy/nats-server.conf` is this rendering for the example
//! mesh. No I/O here: text in, text out.

use std::fmt::Write;

use super::parties::{Account, Export, Grant, Import, Kind, Mesh, MESH, SYS};

/// What the file says before its settings: what the layout is and why.
const HEADER: &str = r#"# An example nats-server configuration for a mesh with mesh-provisioner (SPEC §8: accounts are
# the boundary).
#
# Inside one account any responder — the JetStream API included (`INFO`, `DIRECT.GET`, …) —
# publishes wherever a request's reply subject names, so no party shares an account with a
# bucket it may not write. The account MESH holds every bucket and has three users only: the
# provisioner (its buckets' connection), its serving connection and the operator. Every other
# party is an account of its own, which imports from MESH exactly its subjects:
# - NODE_<NODE> (a node's client and engine, `node-<node>`, and its leaf server, `leaf-<node>`):
#   the two verbs and `$SRV` discovery of the provisioner; its own keys of needs, applied and
#   collect (`$KV.<bucket>.<node>.>`; `kv.<bucket>.<node>.>` from a leaf, which carries no
#   `$KV` subject) and its own compositions (`composed-<node>`), each a JetStream publish whose
#   acknowledgement comes back; its own notices and events. Its standard KV client reaches the
#   JetStream API through the domain `mesh` (`$JS.mesh.API.…`: an account without JetStream has
#   the server answer the plain `$JS.API.…` itself): binding a shared bucket is answered by the
#   node's own stream, NODE_<node>, and a get by a direct get of that stream, so it sees its
#   own keys and usage and never another node's;
# - PROVIDER_POSTGRES, MESH_CONFIG, MESH_CONTROLLER, MESH_INDEXER: their own bucket (write,
#   stream info, direct get), the verbs they ask, the events they follow;
# - MESH_VAULT answers its verbs and discovery; its discovery is exported to MESH for the
#   provisioner's checks.
# No account but MESH has JetStream: no party can make a stream or a consumer, bounce an API
# answer, or read another's keys from a stream (the verb, read-only, answers what the nodes
# need to whoever asks it). Across accounts the server sends an answer back only to the
# account that asked (a reply is rewritten to `_R_.…`), so a reply subject aimed at another
# party's subjects lands nowhere.
#
# Each node's share: its keys of needs, applied and collect live in a stream of its own,
# NODE_<node> (`mesh-provisioner bootstrap --node …` makes it, `--node-share-mib`,
# `--node-share-keys`), which refuses that node's write past its share and no other's; each of
# those buckets' streams captures no subject of its own and sources every node's stream,
# filtered to its keys of that bucket. Readers keep the bucket names and key shapes.
#
# Roll-ups are refused by every bucket (`Nats-Rollup: all` would purge every writer's keys),
# API deletes too; each bucket has byte and value-size limits, discard new.
#
# Every user subscribes only under its own inbox prefix, _INBOX_<user>.> (clients set it with
# their library's custom inbox prefix). The verbs are served by mesh-provisioner-service, which
# may publish nothing but replies; the provisioner itself answers only replies aimed at an inbox
# (`_INBOX…`, or `_R_.…`: a reply mapped across accounts).
#
# The placeholders in double braces (PORT, STORE_DIR, CLUSTER: empty or a `cluster` block, and a
# `leafnodes { listen: ... }` block where nodes join as leaf nodes (deploy/leaf-node.conf), and
# one PASSWORD_ per user) are filled in by whoever runs it: the embedded default of
# `mesh-provisioner serve` and the end-to-end tests render this very file.
#
# This file is the output of `mesh-provisioner accounts --nodes alpha,beta,gamma --providers
# postgres` (a test holds the two equal): a mesh of other nodes renders its own. For a real
# mesh, `accounts --operator` renders the same accounts signed the NATS way (operator mode),
# with a creds file per party instead of passwords."#;

/// The static config of `mesh`, placeholders left in.
pub fn render(mesh: &Mesh) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str(HEADER);
    out.push_str("\n\nlisten: \"127.0.0.1:{{PORT}}\"\nserver_name: \"mesh-{{PORT}}\"\n\n{{CLUSTER}}\n\n");
    let limits = super::parties::MeshJetStream::of(mesh);
    let _ = write!(
        out,
        "jetstream {{\n  store_dir: \"{{{{STORE_DIR}}}}\"\n  max_memory_store: {}MB\n  max_file_store: {}GB\n}}\n\naccounts {{\n",
        limits.memory_bytes >> 20,
        limits.server_file_bytes() >> 30
    );
    for account in mesh.accounts() {
        render_account(&mut out, &account, mesh);
    }
    let _ = write!(out, "}}\nsystem_account: {SYS}\n");
    out
}

fn comment(out: &mut String, indent: &str, lines: &[String]) {
    for l in lines {
        let _ = writeln!(out, "{indent}# {l}");
    }
}

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

fn render_account(out: &mut String, a: &Account, mesh: &Mesh) {
    comment(out, "  ", &a.comment);
    let _ = writeln!(out, "  {} {{", a.name);
    if a.jetstream {
        let l = super::parties::MeshJetStream::of(mesh);
        out.push_str("    # The account's JetStream limits: every stream must say its byte limit (so no bucket grows\n");
        out.push_str("    # without one), and the account's streams together stay within these. Only the\n");
        out.push_str("    # provisioner's instances and the operator make consumers here.\n");
        let _ = writeln!(
            out,
            "    jetstream: {{\n      max_memory: {}MB\n      max_file: {}GB\n      max_streams: {}\n      max_consumers: {}\n      max_bytes_required: true\n    }}",
            l.memory_bytes >> 20,
            l.file_bytes >> 30,
            l.streams,
            l.consumers
        );
    }
    out.push_str("    users: [\n");
    for u in &a.users {
        comment(out, "      ", &u.comment);
        let password = format!("{{{{{}}}}}", u.placeholder());
        match &u.grant {
            None => {
                let _ = writeln!(out, "      {{ user: {}, password: {} }}", quoted(&u.name), quoted(&password));
            }
            Some(g) => {
                let _ = writeln!(out, "      {{\n        user: {}, password: {}", quoted(&u.name), quoted(&password));
                render_grant(out, g);
                out.push_str("      }\n");
            }
        }
    }
    out.push_str("    ]\n");
    if !a.exports.is_empty() {
        if a.name == MESH {
            out.push_str("    # What MESH lends the other accounts: each export names the accounts that may import it, so\n");
            out.push_str("    # an import written wider than its party's grant is refused by the server.\n");
        }
        out.push_str("    exports: [\n");
        for g in &a.exports {
            comment(out, "      ", &g.comment);
            for e in &g.exports {
                render_export(out, e);
            }
        }
        out.push_str("    ]\n");
    }
    if !a.imports.is_empty() {
        out.push_str("    imports: [\n");
        comment(out, "      ", &a.imports_comment);
        for i in &a.imports {
            render_import(out, i);
        }
        out.push_str("    ]\n");
    }
    out.push_str("  }\n");
}

fn list(out: &mut String, indent: &str, name: &str, items: &[String]) {
    let _ = writeln!(out, "{indent}{name}: [");
    let inner = format!("{indent}  ");
    let body: Vec<String> = items.iter().map(|s| format!("{inner}{}", quoted(s))).collect();
    out.push_str(&body.join(",\n"));
    let _ = writeln!(out, "\n{indent}]");
}

fn render_grant(out: &mut String, g: &Grant) {
    out.push_str("        permissions: {\n");
    if !g.publish_allow.is_empty() || !g.publish_deny.is_empty() {
        out.push_str("          publish: {\n");
        if !g.publish_allow.is_empty() {
            list(out, "            ", "allow", &g.publish_allow);
        }
        if !g.publish_deny.is_empty() {
            list(out, "            ", "deny", &g.publish_deny);
        }
        out.push_str("          }\n");
    }
    if !g.subscribe_allow.is_empty() {
        out.push_str("          subscribe: {\n");
        list(out, "            ", "allow", &g.subscribe_allow);
        out.push_str("          }\n");
    }
    if g.allow_responses {
        out.push_str("          allow_responses: true\n");
    }
    out.push_str("        }\n");
}

fn kind(k: Kind) -> &'static str {
    match k {
        Kind::Service => "service",
        Kind::Stream => "stream",
    }
}

fn render_export(out: &mut String, e: &Export) {
    let _ = write!(out, "      {{ {}: {}", kind(e.kind), quoted(&e.subject));
    if !e.accounts.is_empty() {
        let _ = write!(out, ", accounts: [{}]", e.accounts.join(", "));
    }
    if e.response_stream {
        out.push_str(", response_type: stream");
    }
    out.push_str(" }\n");
}

fn render_import(out: &mut String, i: &Import) {
    let _ = write!(out, "      {{ {}: {{ account: {}, subject: {} }}", kind(i.kind), i.account, quoted(&i.subject));
    if let Some(local) = &i.local {
        let _ = write!(out, ", to: {}", quoted(local));
    }
    out.push_str(" }\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(nodes: &[&str]) -> Mesh {
        Mesh::new(nodes.iter().map(|s| s.to_string()).collect(), vec!["postgres".into()]).expect("a mesh")
    }

    #[test]
    fn lists_each_user_once_with_a_password_placeholder() {
        let text = render(&mesh(&["alpha", "beta"]));
        for user in ["mesh-provisioner", "node-alpha", "leaf-beta", "provider-postgres", "system"] {
            assert_eq!(text.matches(&format!("user: \"{user}\"")).count(), 1, "{user}");
        }
        assert!(text.contains("password: \"{{PASSWORD_NODE_BETA}}\""));
        assert!(!text.contains("node-gamma") && !text.contains("NODE_GAMMA"));
    }

    #[test]
    fn a_node_added_adds_its_account_and_changes_no_other_party() {
        let two = render(&mesh(&["alpha", "beta"]));
        let three = render(&mesh(&["alpha", "beta", "gamma"]));
        assert!(three.contains("  NODE_GAMMA {") && !two.contains("NODE_GAMMA"));
        let section = |text: &str, name: &str| text.split(&format!("  {name} {{")).nth(1).and_then(|s| s.split("\n  }\n").next()).map(str::to_string);
        assert_eq!(section(&two, "NODE_ALPHA"), section(&three, "NODE_ALPHA"));
        assert_eq!(section(&two, "PROVIDER_POSTGRES"), section(&three, "PROVIDER_POSTGRES"));
    }
}
