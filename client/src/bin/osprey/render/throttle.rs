//! `osprey throttle`: `GET /throttle` (every throttled member's bucket) and the answer to
//! `POST /throttle`.

use super::table::render_table;

/// A rate or a token count: one decimal, `-` for none.
fn rate(v: &serde_json::Value) -> String {
    v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
}

/// `GET /throttle`: the wait bound and queue, then a row per throttled member.
pub fn render_throttle(v: &serde_json::Value) -> String {
    let f = rate;
    let mut out = format!("wait {} ms, queue {} per member\n", v["wait_ms"], v["queue_capacity"]);
    let cols = [
        "member",
        "max_qps",
        "burst",
        "tokens",
        "waiting",
        "accepted",
        "waited",
        "waited_ms",
        "rejected_full",
        "rejected_timeout",
    ];
    let header: Vec<String> = cols.iter().map(|s| s.to_string()).collect();
    let rows: Vec<Vec<String>> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            cols.iter()
                .map(|k| match &m[*k] {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(n) if n.is_f64() => f(&m[*k]),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no member is throttled\n");
    } else {
        out.push_str(&render_table(&header, &rows));
    }
    out
}

/// The answer to `POST /throttle`: the member's new rate and burst, or no limit.
pub fn render_set(v: &serde_json::Value) -> String {
    let f = rate;
    match v["max_qps"].as_f64() {
        Some(_) => format!(
            "{}: max_qps {} burst {}\n",
            v["member"].as_str().unwrap_or("?"),
            f(&v["max_qps"]),
            f(&v["burst"])
        ),
        None => format!("{}: no limit\n", v["member"].as_str().unwrap_or("?")),
    }
}
