//! The pages of a `causes` answer merged, as the CLI and the status page show them.
//!
//! The server judges every cause; this only adds pages up. Pages walk the modules in order, so a
//! cause's modules add up, and a node is counted twice only when one page's last module and the
//! next page's first are on it: that one is taken off.

use serde_json::{json, Value};

/// Most needs a cause lists, as the server lists them (`more_needs` counts the rest).
pub const LISTED_NEEDS: usize = 8;

/// The causes of many pages.
#[derive(Default, Debug)]
pub struct Merged {
    pub causes: Vec<Value>,
    pub examined: u64,
    pub held: u64,
    /// Where each cause is in `causes`, by its kind and what it names.
    at: std::collections::HashMap<(String, String), usize>,
}

impl Merged {
    /// Adds one page, in walk order.
    pub fn add(&mut self, page: &Value) {
        self.examined += page["examined"].as_u64().unwrap_or(0);
        self.held += page["held"].as_u64().unwrap_or(0);
        for c in page["entries"].as_array().into_iter().flatten() {
            let id = (c["kind"].as_str().unwrap_or_default().to_string(), c["names"].as_str().unwrap_or_default().to_string());
            let Some(m) = self.at.get(&id).and_then(|i| self.causes.get_mut(*i)) else {
                self.at.insert(id, self.causes.len());
                self.causes.push(c.clone());
                continue;
            };
            let count = |v: &Value, f: &str| v[f].as_u64().unwrap_or(0);
            let joined = u64::from(m["last"]["node"] == c["first"]["node"]);
            m["modules"] = json!(count(m, "modules") + count(c, "modules"));
            m["nodes"] = json!((count(m, "nodes") + count(c, "nodes")).saturating_sub(joined));
            m["last"] = c["last"].clone();
            if let (Some(new), old) = (c["since"].as_str(), m["since"].as_str()) {
                if old.is_none_or(|o| new < o) {
                    m["since"] = json!(new);
                }
            }
            let mut needs: Vec<Value> = m["needs"].as_array().cloned().unwrap_or_default();
            let mut more = count(m, "more_needs") + count(c, "more_needs");
            for n in c["needs"].as_array().into_iter().flatten() {
                if needs.contains(n) {
                    continue;
                }
                if needs.len() < LISTED_NEEDS {
                    needs.push(n.clone());
                } else {
                    more += 1;
                }
            }
            m["needs"] = json!(needs);
            m["more_needs"] = json!(more);
        }
    }

    /// The causes, the one holding most modules first (then by kind and name).
    pub fn sorted(mut self) -> Merged {
        self.causes.sort_by(|a, b| {
            let n = |v: &Value| v["modules"].as_u64().unwrap_or(0);
            n(b).cmp(&n(a)).then_with(|| a["kind"].as_str().cmp(&b["kind"].as_str())).then_with(|| a["names"].as_str().cmp(&b["names"].as_str()))
        });
        self.at.clear();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(modules: u64, nodes: u64, first: &str, last: &str, since: &str) -> Value {
        json!({"kind":"provider_unassigned","names":"postgres","clear":"c","reason":"r","modules":modules,"nodes":nodes,
            "first":{"node":first,"module":"m"},"last":{"node":last,"module":"m"},"since":since,"needs":["bound:postgres.db"]})
    }

    #[test]
    fn pages_merged_in_order_count_a_node_both_end_at_once() {
        let mut m = Merged::default();
        m.add(&json!({"examined":500,"held":500,"entries":[cause(500, 2, "alpha", "beta", "2026-12-04T10:00:00Z")]}));
        m.add(&json!({"examined":500,"held":400,"entries":[cause(400, 2, "beta", "gamma", "2026-12-04T09:00:00Z")]}));
        let m = m.sorted();
        let c = &m.causes[0];
        assert_eq!((c["modules"].as_u64(), c["nodes"].as_u64()), (Some(900), Some(3)));
        assert_eq!(c["since"], "2026-12-04T09:00:00Z");
        assert_eq!(c["first"]["node"], "alpha");
        assert_eq!(c["last"]["node"], "gamma");
        assert_eq!((m.examined, m.held), (1000, 900));
    }

    #[test]
    fn the_cause_holding_most_comes_first() {
        let mut m = Merged::default();
        let mut small = cause(3, 1, "a", "a", "2026-12-04T10:00:00Z");
        small["names"] = json!("aaa");
        m.add(&json!({"examined":12,"held":10,"entries":[small, cause(7, 1, "a", "a", "2026-12-04T10:00:00Z")]}));
        let m = m.sorted();
        assert_eq!(m.causes[0]["modules"], 7);
        assert_eq!((m.examined, m.held), (12, 10));
    }
}
