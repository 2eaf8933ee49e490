//! `osprey cluster`: `GET /cluster`, each cluster's status line, its write and read slots
//! and a table of its members.

use super::table::{cell, render_table};

/// `GET /cluster`: per cluster, its status, write and read slots, and its members.
pub fn render_clusters(v: &serde_json::Value) -> String {
    let s = cell;
    let mut out = String::new();
    for c in v["clusters"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "cluster {} ({}): primary {} | status {}{} | semi-sync {} | lock {}{}\n",
            s(&c["name"]),
            s(&c["topology"]),
            s(&c["primary"]),
            s(&c["status"]["status"]),
            c["status"]["detail"]
                .as_str()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default(),
            s(&c["semi_sync"]),
            if c["lock_held"].as_bool() == Some(true) {
                "held"
            } else {
                "not held"
            },
            c["lock_detail"].as_str().map(|d| format!(" ({d})")).unwrap_or_default(),
        ));
        let wp = &c["write_pool"];
        out.push_str(&format!(
            "write slots: member {} | idle {} busy {} starting {} | queue {}{}\n",
            s(&wp["member"]),
            s(&wp["idle"]),
            s(&wp["busy"]),
            s(&wp["starting"]),
            s(&wp["queue_depth"]),
            wp["hold"]
                .as_str()
                .map(|h| format!(" | holding: {h}"))
                .unwrap_or_default(),
        ));
        for rp in c["read_pools"].as_array().into_iter().flatten() {
            let state = match rp["reason"].as_str() {
                _ if rp["serving"] == true => "serving".to_owned(),
                Some(why) => format!("not serving: {why}"),
                None => "not serving".to_owned(),
            };
            out.push_str(&format!(
                "read slots: member {} | {} | size {} idle {} busy {} | queue {}\n",
                s(&rp["member"]),
                state,
                s(&rp["slots"]["size"]),
                s(&rp["slots"]["idle"]),
                s(&rp["slots"]["busy"]),
                s(&rp["slots"]["queue_depth"]),
            ));
        }
        let header: Vec<String> = [
            "member",
            "addr",
            "role",
            "health",
            "fails",
            "read_only",
            "gtid applied",
            "from",
            "maint",
            "reason",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let health = c["health"].as_array().cloned().unwrap_or_default();
        let rows: Vec<Vec<String>> = c["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let h = health.iter().find(|h| h["member"] == m["name"]);
                vec![
                    s(&m["name"]),
                    s(&m["addr"]),
                    s(&m["role"]),
                    h.map_or("-".into(), |h| s(&h["state"])),
                    h.map_or("-".into(), |h| {
                        format!("{}/{}", s(&h["failures_in_window"]), s(&h["fail_threshold"]))
                    }),
                    s(&m["read_only"]),
                    s(&m["gtid_applied"]),
                    s(&m["replicates_from"]),
                    if m["maintenance"].as_bool() == Some(true) {
                        "yes".into()
                    } else {
                        "-".into()
                    },
                    s(&m["reason"]),
                ]
            })
            .collect();
        out.push_str(&render_table(&header, &rows));
        out.push('\n');
    }
    out
}
