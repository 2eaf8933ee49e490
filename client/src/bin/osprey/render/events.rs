//! `osprey cluster events`: `GET /cluster/events`, one line per switch.

/// `GET /cluster/events`: one line per switch, its steps with their times.
pub fn render_events(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for e in v["events"].as_array().into_iter().flatten() {
        let steps: Vec<String> = e["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|st| {
                format!(
                    "{}@{:.0}ms{}",
                    st["step"].as_str().unwrap_or("?"),
                    st["at_ms"].as_f64().unwrap_or(0.0),
                    if st["ok"].as_bool() == Some(false) {
                        "(failed)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        out.push_str(&format!(
            "{} {} {}: {} -> {} in {:.0} ms{} [{}]{}\n",
            e["started"].as_u64().unwrap_or(0),
            e["cluster"].as_str().unwrap_or("?"),
            e["kind"].as_str().unwrap_or("?"),
            e["old_primary"].as_str().unwrap_or("-"),
            e["new_primary"].as_str().unwrap_or("-"),
            e["duration_ms"].as_f64().unwrap_or(0.0),
            if e["ok"].as_bool() == Some(false) {
                " FAILED"
            } else {
                ""
            },
            steps.join(" "),
            e["detail"].as_str().map(|d| format!(" {d}")).unwrap_or_default(),
        ));
    }
    if out.is_empty() {
        out.push_str("no switches\n");
    }
    out
}
