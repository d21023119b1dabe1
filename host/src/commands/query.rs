//! `query`: asks the provisioning verb (or, for `plan`, the plan verb) from a terminal and prints
//! a table (out-of-shape keys shown, not hidden; every provision, unanswered and malformed ones
//! included) or, with `--json`, the raw reply. An error reply exits non-zero. Requests are
//! checked by the server, not here.

use serde_json::{json, Value};

use clap::{Args, ValueEnum};

use std::time::Duration;

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::flags::parse_duration;
use crate::base::wire::{PLAN, PROVISIONING};
use crate::nats::connect::Connect;

/// Asks once; the reply's JSON, or the error reply as an [`ErrorKind::Invalid`] error.
pub async fn ask(client: &async_nats::Client, verb: &str, body: &Value, timeout: std::time::Duration) -> Result<Value> {
    let payload = ask_bytes(client, verb, body, timeout).await?;
    serde_json::from_slice(&payload).map_err(|e| Error::new(ErrorKind::Unavailable, format!("the reply is not JSON: {e}")))
}

/// Asks once; the reply's bytes as sent (a value's JSON text exactly), or the error reply as an
/// [`ErrorKind::Invalid`] error.
pub async fn ask_bytes(client: &async_nats::Client, verb: &str, body: &Value, timeout: std::time::Duration) -> Result<bytes::Bytes> {
    let req = async_nats::Request::new().payload(body.to_string().into()).timeout(Some(timeout));
    let msg = client.send_request(verb.to_string(), req).await.map_err(|e| Error::new(ErrorKind::Unavailable, format!("asking {verb}: {e}")))?;
    let v: Value = serde_json::from_slice(&msg.payload).map_err(|e| Error::new(ErrorKind::Unavailable, format!("the reply is not JSON: {e}")))?;
    let status = msg.headers.as_ref().and_then(|h| h.get(crate::base::wire::ERROR_CODE_HEADER)).map(|c| c.to_string());
    if let Some(err) = v.get("error") {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("{} ({}): {}", err["code"].as_str().unwrap_or("error"), status.as_deref().unwrap_or("no status"), err["message"].as_str().unwrap_or("")),
        ));
    }
    Ok(msg.payload)
}

/// The verb to ask and the request body. Every flag given is sent, so the server (not this
/// command) says which do not apply.
fn request(q: &Query) -> (&'static str, Value) {
    let (verb, mut body) = match q.what {
        What::Registry => (PROVISIONING, json!({ "what": "registry" })),
        What::Needs => (PROVISIONING, json!({ "what": "needs" })),
        What::Applied => (PROVISIONING, json!({ "what": "applied" })),
        What::Collect => (PROVISIONING, json!({ "what": "collect" })),
        What::Plan => (PLAN, json!({})),
        What::Status => (PROVISIONING, json!({ "what": "status" })),
        What::Holders => (PROVISIONING, json!({ "what": "holders" })),
        What::Causes => (PROVISIONING, json!({ "what": "causes" })),
        What::Why => (PROVISIONING, json!({ "what": "status" })),
    };
    for (field, value) in [("node", &q.node), ("module", &q.module), ("kind", &q.kind), ("collection", &q.collection), ("name", &q.name), ("after", &q.after)] {
        if let Some(v) = value {
            body[field] = json!(v);
        }
    }
    if let Some(l) = q.limit {
        body["limit"] = json!(l);
    }
    if q.consistent {
        body["consistent"] = json!(true);
    }
    if !q.min_revision.is_empty() {
        let marks: serde_json::Map<String, Value> = q.min_revision.iter().map(|(name, n)| (name.clone(), json!(n))).collect();
        body["min_revision"] = Value::Object(marks);
    }
    if let Some(w) = q.wait {
        body["wait"] = json!(format!("{}ms", w.as_millis()));
    }
    (verb, body)
}

/// `NAME=REVISION` of `--min-revision`.
fn parse_mark(s: &str) -> std::result::Result<(String, u64), String> {
    let (name, revision) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=REVISION (e.g. NODE_alpha=42)"))?;
    let revision = revision.parse::<u64>().map_err(|e| format!("{s:?}: the revision {revision:?} is not a whole number: {e}"))?;
    Ok((name.to_string(), revision))
}

/// Keeps the status entries in their state since `cutoff` or before (a module whose state the
/// server has not recorded yet has no `since` and is left out: it has just changed).
fn only_since(reply: &mut Value, cutoff: std::time::SystemTime) {
    if let Some(entries) = reply.get_mut("entries").and_then(Value::as_array_mut) {
        entries.retain(|e| e["since"].as_str().and_then(parse_time).is_some_and(|t| t <= cutoff));
    }
}

/// An RFC 3339 time as the server writes it.
fn parse_time(s: &str) -> Option<std::time::SystemTime> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some(std::time::SystemTime::from(t))
}

/// How long ago `since` was, coarsely (`<1m`, `12m`, `3h 5m`, `2d 4h`): a view redrawn on
/// change does not change every second.
pub fn for_how_long(since: &str, now: std::time::SystemTime) -> String {
    let Some(t) = parse_time(since) else { return String::new() };
    let s = now.duration_since(t).map_or(0, |d| d.as_secs());
    match s {
        0..60 => "<1m".to_string(),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// How a reply is printed.
fn show(q: &Query, verb: &str, reply: &Value, colour: bool) -> String {
    let mut filtered;
    let reply = match (q.what, q.since) {
        (What::Status, Some(d)) => {
            filtered = reply.clone();
            only_since(&mut filtered, std::time::SystemTime::now() - d);
            &filtered
        }
        _ => reply,
    };
    if q.json {
        return format!("{reply}\n");
    }
    // Tables are for a terminal: whatever a node wrote is shown escaped.
    let mut shown = reply.clone();
    crate::base::visible::visible_json(&mut shown);
    let reply = &shown;
    if verb == PLAN {
        plan_table(reply)
    } else if q.what == What::Status {
        status_table(reply, q.needs, colour)
    } else if q.what == What::Holders {
        holders_table(reply)
    } else {
        table(reply)
    }
}

/// Colours only on a terminal, and never with `NO_COLOR` set.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

pub async fn run(q: Query) -> Result<crate::commands::Exit> {
    let client = crate::nats::connect::connect_cli(&q.connect, "mesh-provisioner query").await?;
    if q.watch {
        return watch(&client, &q).await.map(|()| crate::commands::Exit::Done);
    }
    let (verb, mut body) = request(&q);
    let colour = colour();
    if q.what == What::Holders {
        return holders(&client, &q, body).await;
    }
    if q.what == What::Causes {
        let merged = super::causes::all(&client, body, q.timeout).await?;
        match q.json {
            true => println!("{}", json!({"what":"causes","examined":merged.examined,"held":merged.held,"entries":merged.causes})),
            false => print!("{}", super::causes::table(&merged)),
        }
        return Ok(crate::commands::Exit::Done);
    }
    if q.what == What::Why {
        let (Some(node), Some(module)) = (&q.node, &q.module) else {
            return Err(Error::new(ErrorKind::Invalid, "query why needs --node and --module"));
        };
        let status = ask(&client, PROVISIONING, &body, q.timeout).await?;
        if status["entries"].as_array().is_none_or(Vec::is_empty) {
            return Err(Error::new(ErrorKind::Invalid, format!("no source knows module {module} on node {node}")));
        }
        let merged = super::causes::all(&client, json!({"what":"causes","node":node,"module":module}), q.timeout).await?;
        let mut shown = status.clone();
        crate::base::visible::visible_json(&mut shown);
        print!("{}", super::causes::why(&shown, &merged));
        return Ok(crate::commands::Exit::Done);
    }
    loop {
        let reply = ask(&client, verb, &body, q.timeout).await?;
        print!("{}", show(&q, verb, &reply, colour));
        match reply.get("next") {
            Some(next) if q.all => body["after"] = next.clone(),
            Some(next) => {
                if !q.json {
                    println!("more: --after {}", crate::base::visible::visible(next.as_str().unwrap_or_default()));
                }
                return Ok(crate::commands::Exit::Done);
            }
            None => return Ok(crate::commands::Exit::Done),
        }
    }
}

/// Every page of a value's holders, shown; [`Exit::NotCurrent`](crate::commands::Exit) unless
/// every page says all current, so a rotation script can wait on the exit code.
async fn holders(client: &async_nats::Client, q: &Query, mut body: Value) -> Result<crate::commands::Exit> {
    let (mut all_current, mut count) = (true, 0u64);
    loop {
        let reply = ask(client, PROVISIONING, &body, q.timeout).await?;
        print!("{}", show(q, PROVISIONING, &reply, false));
        all_current &= reply["all_current"] == true;
        count += reply["count"].as_u64().unwrap_or(0);
        match reply.get("next") {
            Some(next) => body["after"] = next.clone(),
            None => break,
        }
    }
    let value = crate::base::visible::visible(&format!("{}:{}", q.kind.as_deref().unwrap_or(""), q.name.as_deref().unwrap_or(""))).into_owned();
    if all_current {
        if !q.json {
            println!("all {count} holder(s) of {value} run the value at their place");
        }
        Ok(crate::commands::Exit::Done)
    } else {
        eprintln!("mesh-provisioner: not every holder of {value} runs the value at its place yet ({count} holder(s))");
        Ok(crate::commands::Exit::NotCurrent)
    }
}

/// A value's holders, one row each.
pub fn holders_table(reply: &Value) -> String {
    let text = |v: &Value| v.as_str().map_or_else(|| if v.is_null() { "-".to_string() } else { v.to_string() }, str::to_string);
    let mut rows = vec![vec!["NODE".to_string(), "MODULE".into(), "STATE".into(), "APPLIED".into(), "NOW".into(), "PLACE".into(), "REASON".into()]];
    for h in reply["holders"].as_array().into_iter().flatten() {
        let place = match (h["verb"].as_str(), h["bucket"].as_str()) {
            (Some(v), _) => format!("verb {v}"),
            (None, Some(b)) => format!("{b} {}", h["key"].as_str().or(h["filter"].as_str()).unwrap_or("")),
            _ => String::new(),
        };
        rows.push(vec![
            text(&h["node"]),
            text(&h["module"]),
            text(&h["state"]),
            text(&h["applied_revision"]),
            text(&h["revision"]),
            place,
            cut(&text(&h["reason"]), 70),
        ]);
    }
    render(&rows)
}

/// Every page, shown; asked again every `--every` (status: when a state change is heard, or
/// after `--every` with none), redrawn when anything changed. An error is shown in place and
/// the view goes on (the bus may come back).
async fn watch(client: &async_nats::Client, q: &Query) -> Result<()> {
    let (verb, first) = request(q);
    let colour = colour();
    let mut last = String::new();
    // The state changes of the node asked, or of every node (a user may hear only its own).
    let mut events = match q.what {
        What::Status => {
            let subject = format!("{}{}", crate::base::wire::EVENT_PREFIX, q.node.as_deref().unwrap_or(">"));
            client.subscribe(subject).await.ok()
        }
        _ => None,
    };
    let how = if events.is_some() { format!("on each state change, at least every {:?}", q.every) } else { format!("every {:?}", q.every) };
    loop {
        let mut body = first.clone();
        let mut view = String::new();
        for _ in 0..10_000 {
            match ask(client, verb, &body, q.timeout).await {
                Ok(reply) => {
                    view.push_str(&show(q, verb, &reply, colour));
                    match reply.get("next") {
                        Some(next) => body["after"] = next.clone(),
                        None => break,
                    }
                }
                Err(e) => {
                    view.push_str(&format!("cannot ask now: {e}\n"));
                    break;
                }
            }
        }
        if view != last {
            let at = crate::base::wire::rfc3339(std::time::SystemTime::now());
            // Clear the screen and home the cursor on a terminal; a pipe gets one view after another.
            let clear = if colour { "\x1b[2J\x1b[H" } else { "\n" };
            print!("{clear}{verb} {first} at {at} ({how}; Ctrl-C to stop)\n\n{view}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            last = view;
        }
        match events.as_mut() {
            Some(sub) => {
                use futures::StreamExt;
                // One change is often many: those heard within a moment are one redraw.
                if let Ok(Some(_)) = tokio::time::timeout(q.every, sub.next()).await {
                    let settle = tokio::time::sleep(std::time::Duration::from_millis(100));
                    tokio::pin!(settle);
                    loop {
                        tokio::select! {
                            _ = &mut settle => break,
                            more = sub.next() => if more.is_none() { break },
                        }
                    }
                }
            }
            None => tokio::time::sleep(q.every).await,
        }
    }
}

/// Each module's state, one row a module; with `needs`, a line per need under it.
pub fn status_table(reply: &Value, needs: bool, colour: bool) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let paint = |state: &str| -> String {
        if !colour {
            return state.to_string();
        }
        let code = match state {
            "applied" | "nothing_needed" | "present" | "answered" => "32",
            "pending" | "never_ran" | "not_installed" => "33",
            "degraded" | "missing" | "unknown" | "stale" => "35",
            "blocked" | "no_provider" | "unanswered" => "31",
            "provider_pending" => "33",
            _ => "0",
        };
        format!("\x1b[{code}m{state}\x1b[0m")
    };
    let now = std::time::SystemTime::now();
    let mut rows = vec![vec!["NODE".to_string(), "MODULE".into(), "STATE".into(), "FOR".into(), "WANT".into(), "HAVE".into(), "REASON".into()]];
    let mut lines: Vec<Vec<String>> = Vec::new();
    for e in reply["entries"].as_array().into_iter().flatten() {
        let held = e["since"].as_str().map(|s| for_how_long(s, now)).unwrap_or_default();
        rows.push(vec![text(&e["node"]), text(&e["module"]), text(&e["state"]), held, text(&e["want"]), text(&e["have"]), cut(&text(&e["reason"]), 90)]);
        let mut under = Vec::new();
        if needs {
            for n in e["needs"].as_array().into_iter().flatten() {
                let place = match (n["verb"].as_str(), n["bucket"].as_str()) {
                    (Some(v), _) => format!("verb {v}"),
                    (None, Some(b)) => format!("{b} {}", n["key"].as_str().or(n["filter"].as_str()).unwrap_or("")),
                    _ => String::new(),
                };
                let detail = match (n["revision"].as_u64(), n["responders"].as_u64()) {
                    (Some(r), _) => format!(" (revision {r})"),
                    (None, Some(c)) => format!(" ({c} responder(s))"),
                    _ => String::new(),
                };
                under.push(format!(
                    "    {}:{}  {}{detail}  {place}  {}",
                    text(&n["kind"]),
                    text(&n["name"]),
                    paint(n["check"].as_str().unwrap_or("")),
                    text(&n["reason"])
                ));
            }
        }
        lines.push(under);
    }
    // The table is aligned on plain text; colour goes on after, so widths stay right.
    let mut out = String::new();
    for (i, line) in render(&rows).lines().enumerate() {
        let line = match rows.get(i).map(|r| r[2].as_str()) {
            Some(state) if i > 0 && colour && !state.is_empty() => line.replacen(&format!("  {state}"), &format!("  {}", paint(state)), 1),
            _ => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
        if i > 0 {
            for l in &lines[i - 1] {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out.push_str(&format!("{} module(s) at revision {}\n", rows.len() - 1, reply["revision"]));
    out.push_str(&out_of_shape(reply, &["bucket", "key", "reason"]));
    out
}

/// The reply's out-of-shape keys as a table of `columns`; nothing when there are none.
fn out_of_shape(reply: &Value, columns: &[&str]) -> String {
    let odd = reply["out_of_shape"].as_array().cloned().unwrap_or_default();
    if odd.is_empty() {
        return String::new();
    }
    let mut rows = vec![columns.iter().map(|c| if *c == "revision" { "REV".to_string() } else { c.to_uppercase() }).collect::<Vec<_>>()];
    for e in &odd {
        rows.push(columns.iter().map(|c| e[*c].as_str().map_or_else(|| e[*c].to_string(), str::to_string)).collect());
    }
    format!("\n{} key(s) out of shape:\n{}", odd.len(), render(&rows))
}

/// A readable table of a reply.
pub fn table(reply: &Value) -> String {
    let columns: &[&str] = match reply["what"].as_str() {
        Some("needs") => &["node", "module", "kind", "name"],
        Some("applied") => &["node", "module"],
        Some("collect") => &["node", "collection", "contributor"],
        _ => &["kind"],
    };
    let mut rows: Vec<Vec<String>> = vec![columns.iter().map(|c| c.to_uppercase()).chain(["REV".into(), "VALUE".into()]).collect()];
    for e in reply["entries"].as_array().into_iter().flatten() {
        let mut row: Vec<String> = columns.iter().map(|c| e[*c].as_str().unwrap_or("").to_string()).collect();
        row.push(e["revision"].to_string());
        let mut value = e.get("value").map(|v| v.to_string()).unwrap_or_default();
        if let Some(enc) = e["encoding"].as_str() {
            value = format!("{value} ({enc})");
        }
        row.push(cut(&value, 70));
        rows.push(row);
    }
    let mut out = render(&rows);
    out.push_str(&format!("{} entries at revision {}\n", rows.len() - 1, reply["revision"]));
    out.push_str(&out_of_shape(reply, &["key", "revision", "reason"]));
    out
}

/// A readable account of a plan: the module's state, then each build read with its provisions.
pub fn plan_table(reply: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let mut out = format!("{} on {}: {}", text(&reply["module"]), text(&reply["node"]), text(&reply["state"]));
    if let Some(r) = reply["reason"].as_str() {
        out.push_str(&format!(" ({r})"));
    }
    out.push('\n');
    let builds: Vec<String> = ["want", "have", "newest"].iter().filter_map(|f| reply[*f].as_str().map(|b| format!("{f} {b}"))).collect();
    out.push_str(&format!("builds: {}\n", if builds.is_empty() { "none known".into() } else { builds.join(", ") }));
    for e in reply["entries"].as_array().into_iter().flatten() {
        let roles: Vec<String> = e["as"].as_array().into_iter().flatten().map(text).collect();
        out.push_str(&format!("\nat {} ({}): {}", e["build"].as_str().unwrap_or("?"), roles.join(", "), text(&e["state"])));
        if let Some(b) = e["plan_build"].as_str() {
            out.push_str(&format!(", plan of {b}"));
        }
        out.push('\n');
        if let Some(r) = e["reason"].as_str() {
            out.push_str(&format!("  {r}\n"));
        }
        let Some(provisions) = e["provisions"].as_array() else { continue };
        let mut rows = vec![vec!["KIND".to_string(), "NAME".into(), "PART".into(), "DOMAIN".into(), "WHERE".into()]];
        for p in provisions {
            let place = if let Some(verb) = p["verb"].as_str() {
                format!("verb {verb}")
            } else if let Some(bucket) = p["bucket"].as_str() {
                format!("{bucket} {}", p["key"].as_str().or(p["filter"].as_str()).unwrap_or(""))
            } else if p["unanswered"] == true {
                format!("unanswered: {}", text(&p["reason"]))
            } else {
                format!("malformed: {}", text(&p["reason"]))
            };
            rows.push(vec![text(&p["kind"]), text(&p["name"]), text(&p["part"]), text(&p["domain"]), place]);
        }
        out.push_str(&render(&rows));
    }
    out
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

pub(crate) fn render(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols).map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum What {
    Registry,
    Needs,
    Applied,
    Collect,
    /// A module's plan and provisions (`--node` and `--module`), from `mesh-provisioner.plan`.
    Plan,
    /// Every module's state and reason (`--needs`: each need's check, made now).
    Status,
    /// Who holds a value (`--kind` and `--name`), and whether each runs the one at its place
    /// now; every page is read, and the exit code is 3 unless every holder is current.
    Holders,
    /// The distinct causes that keep modules from `applied` (narrowed by `--node`,
    /// `--module`), each with what it holds and what would clear it; every page is read.
    Causes,
    /// One module's chain (`--node` and `--module`): each need, its check, and the cause that
    /// holds it with what would clear it.
    Why,
}

#[derive(Args, Debug)]
pub struct Query {
    /// What to list.
    #[arg(value_enum, default_value_t = What::Registry)]
    pub what: What,
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long)]
    pub module: Option<String>,
    #[arg(long)]
    pub kind: Option<String>,
    /// A collection, by its name (e.g. shell:zsh:normal).
    #[arg(long)]
    pub collection: Option<String>,
    /// With `holders`: the need's name, decoded (e.g. postgres.db).
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub limit: Option<u64>,
    #[arg(long)]
    pub after: Option<String>,
    /// Answer over what the bus holds now: each bucket read at least at the revision it had
    /// when the request came (the server waits for its mirrors, or says `not_current`).
    #[arg(long)]
    pub consistent: bool,
    /// Read-your-writes: the answer reflects at least this revision of a bucket, or of a node's
    /// share (`NODE_<node>=<sequence its write was acknowledged with>`); repeatable.
    #[arg(long, value_name = "NAME=REVISION", value_parser = parse_mark)]
    pub min_revision: Vec<(String, u64)>,
    /// How long `--consistent` or `--min-revision` may wait for the server's mirrors (the
    /// server's default 2s, at most 10s).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Follow `next` and print every page.
    #[arg(long)]
    pub all: bool,
    /// Print the raw JSON reply.
    #[arg(long)]
    pub json: bool,
    /// With `status`: one line per need, with its check and place.
    #[arg(long)]
    pub needs: bool,
    /// With `status`: only modules that have been in their state for at least this long (e.g.
    /// 10m, 1h): what has been stuck, not what is moving.
    #[arg(long, value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Redraw whenever the answer changes (every page), until interrupted: a view an operator
    /// can leave open. `status` follows the state changes the server publishes
    /// (`mesh-provisioner.event.<node>`, or every node's) and asks again when one comes; the
    /// other answers are asked again every `--every`.
    #[arg(long)]
    pub watch: bool,
    /// How often `--watch` asks (for `status`: at the longest, when no change came).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub every: Duration,
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub connect: Connect,
}
