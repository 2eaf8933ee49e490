//! `osprey digests`: `GET /digests` (the top digests), `GET /digests/blocked`, and the
//! answers to block and unblock.

use super::table::render_table;

/// A JSON value as a digests cell: `-` for null, strings unquoted, numbers rounded.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), |f| format!("{f:.0}")),
        other => other.to_string(),
    }
}

/// `GET /digests`: the slow-statement rule, then the digests by count and by time.
pub fn render_top(v: &serde_json::Value) -> String {
    let s = cell;
    let mut out = format!(
        "slow: {} ms x {} within {} s blocks for {} s (0: until unblocked)\n",
        s(&v["slow_threshold_ms"]),
        s(&v["slow_count"]),
        s(&v["slow_window_s"]),
        s(&v["block_ttl_s"])
    );
    let header: Vec<String> = ["id", "state", "count", "total_ms", "max_ms", "slow", "text"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (title, key) in [("by count", "by_count"), ("by time", "by_time")] {
        let rows: Vec<Vec<String>> = v[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                ["id", "state", "count", "total_ms", "max_ms", "slow", "text"]
                    .iter()
                    .map(|k| s(&d[*k]))
                    .collect()
            })
            .collect();
        out.push_str(&format!("{title}:\n"));
        out.push_str(&render_table(&header, &rows));
    }
    out
}

/// `GET /digests/blocked`: who blocked each digest, for how long yet, what it refused.
pub fn render_blocked(v: &serde_json::Value) -> String {
    let s = cell;
    let header: Vec<String> = ["id", "by", "remaining_s", "rejected", "text"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = v["blocked"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            vec![
                s(&d["id"]),
                s(&d["reason"]["by"]),
                s(&d["remaining_s"]),
                s(&d["rejected"]),
                s(&d["text"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        "no blocked digests\n".to_string()
    } else {
        render_table(&header, &rows)
    }
}

/// The answer to `POST /digests/block`.
pub fn render_block(v: &serde_json::Value) -> String {
    format!("blocked {}: {}\n", cell(&v["id"]), cell(&v["text"]))
}

/// The answer to `POST /digests/{id}/unblock`.
pub fn render_unblock(v: &serde_json::Value) -> String {
    format!("unblocked {}\n", cell(&v["id"]))
}
