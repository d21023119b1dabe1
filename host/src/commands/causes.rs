//! `query causes` and `query why`: what keeps modules from `applied`, for a terminal.
//!
//! The server judges every cause (`{"what":"causes"}`, one page per few hundred modules); this
//! file reads every page of one walk, merged by [`Merged`], and prints them.

use serde_json::Value;

use crate::base::causes::Merged;
use crate::base::error::Result;
use crate::base::wire::PROVISIONING;

/// The causes of every page of `body` (a `causes` request), merged: the one holding most
/// modules first.
pub async fn all(client: &async_nats::Client, mut body: Value, timeout: std::time::Duration) -> Result<Merged> {
    let mut merged = Merged::default();
    loop {
        let reply = super::query::ask(client, PROVISIONING, &body, timeout).await?;
        merged.add(&reply);
        match reply.get("next") {
            Some(next) => body["after"] = next.clone(),
            None => return Ok(merged.sorted()),
        }
    }
}

/// One row a cause, with what would clear it and an example reason under it.
pub fn table(merged: &Merged) -> String {
    // Tables are for a terminal: whatever a node wrote (a refusal's reason) is shown escaped.
    let causes = visible(&merged.causes);
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let now = std::time::SystemTime::now();
    let mut rows = vec![vec!["KIND".to_string(), "NAMES".into(), "MODULES".into(), "NODES".into(), "FOR".into(), "FIRST".into()]];
    let mut under = Vec::new();
    for c in &causes {
        let held = c["since"].as_str().map(|s| super::query::for_how_long(s, now)).unwrap_or_default();
        let first = format!("{}/{}", text(&c["first"]["node"]), text(&c["first"]["module"]));
        rows.push(vec![text(&c["kind"]), text(&c["names"]), c["modules"].to_string(), c["nodes"].to_string(), held, first]);
        under.push(format!("    clear: {}\n    e.g.:  {}\n", text(&c["clear"]), text(&c["reason"])));
    }
    let mut out = String::new();
    for (i, line) in super::query::render(&rows).lines().enumerate() {
        out.push_str(line);
        out.push('\n');
        if i > 0 {
            out.push_str(&under[i - 1]);
        }
    }
    out.push_str(&format!("{} cause(s) hold {} of {} module(s)\n", merged.causes.len(), merged.held, merged.examined));
    out
}

/// `causes` with whatever a node wrote in them escaped for a terminal.
fn visible(causes: &[Value]) -> Vec<Value> {
    let mut shown = Value::Array(causes.to_vec());
    crate::base::visible::visible_json(&mut shown);
    match shown {
        Value::Array(c) => c,
        _ => Vec::new(),
    }
}

/// One module's chain, from each need to what holds it and what would clear it: the module's
/// status (its needs as checked now) and its causes, side by side.
pub fn why(status: &Value, merged: &Merged) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let Some(s) = status["entries"].as_array().and_then(|e| e.first()) else {
        return "no such module: no source knows it\n".into();
    };
    let causes = visible(&merged.causes);
    let mut out = format!("{}/{}: {} — {}\n", text(&s["node"]), text(&s["module"]), text(&s["state"]), text(&s["reason"]));
    let cause_of = |need: &str| causes.iter().find(|c| c["needs"].as_array().is_some_and(|n| n.iter().any(|n| n == need)));
    for n in s["needs"].as_array().into_iter().flatten() {
        let need = format!("{}:{}", text(&n["kind"]), text(&n["name"]));
        out.push_str(&format!("  {need}  {}  ({})\n", text(&n["check"]), text(&n["reason"])));
        if let Some(c) = cause_of(&need) {
            out.push_str(&format!("    ← {} {}: clear with {}\n", text(&c["kind"]), text(&c["names"]), text(&c["clear"])));
        }
    }
    for c in causes.iter().filter(|c| c["needs"].as_array().is_none_or(Vec::is_empty)) {
        out.push_str(&format!(
            "  the module itself ← {} {}: clear with {}\n    ({})\n",
            text(&c["kind"]),
            text(&c["names"]),
            text(&c["clear"]),
            text(&c["reason"])
        ));
    }
    if causes.is_empty() {
        out.push_str("  nothing holds it\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_table_says_how_many_of_the_modules_each_cause_holds() {
        let mut m = Merged::default();
        let cause = json!({"kind":"provider_unassigned","names":"postgres","clear":"assign it","reason":"r","modules":10,"nodes":1,
            "first":{"node":"alpha","module":"m"},"last":{"node":"alpha","module":"z"},"needs":["bound:postgres.db"]});
        m.add(&json!({"examined":12,"held":10,"entries":[cause]}));
        let t = table(&m.sorted());
        assert!(t.contains("provider_unassigned") && t.contains("clear: assign it") && t.contains("alpha/m"), "{t}");
        assert!(t.contains("1 cause(s) hold 10 of 12 module(s)"), "{t}");
    }

    #[test]
    fn why_ties_each_need_to_the_cause_that_holds_it() {
        let mut m = Merged::default();
        let cause = json!({"kind":"provider_unassigned","names":"postgres","clear":"assign postgres","reason":"r","modules":1,"nodes":1,
            "first":{"node":"alpha","module":"app"},"last":{"node":"alpha","module":"app"},"needs":["bound:postgres.db"]});
        m.add(&json!({"examined":1,"held":1,"entries":[cause]}));
        let m = m.sorted();
        let status = json!({"entries":[{"node":"alpha","module":"app","state":"blocked","reason":"1 need",
            "needs":[{"kind":"bound","name":"postgres.db","check":"no_provider","reason":"no node is assigned"},
                     {"kind":"config","name":"x","check":"present","reason":"ok"}]}]});
        let w = why(&status, &m);
        assert!(w.contains("bound:postgres.db  no_provider") && w.contains("← provider_unassigned postgres: clear with assign postgres"), "{w}");
        assert_eq!(w.matches('←').count(), 1, "{w}");
    }

    #[test]
    fn what_a_node_wrote_reaches_the_terminal_escaped() {
        let mut m = Merged::default();
        let cause = json!({"kind":"composition","names":"composed-alpha app.b2","clear":"c","reason":"refused: \u{1b}[2Jgone","modules":1,"nodes":1,
            "first":{"node":"alpha","module":"app"},"last":{"node":"alpha","module":"app"},"needs":[]});
        m.add(&json!({"examined":1,"held":1,"entries":[cause]}));
        let m = m.sorted();
        let status = json!({"entries":[{"node":"alpha","module":"app","state":"pending","reason":"r","needs":[]}]});
        for out in [table(&m), why(&status, &m)] {
            assert!(!out.contains('\u{1b}'), "{out:?}");
        }
    }
}
