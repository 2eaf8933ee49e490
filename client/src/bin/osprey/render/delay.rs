//! `osprey delay`: `GET /delay`, one line per replica as DBLE shows it.

use super::table::{cell, render_table};

/// `GET /delay` as DBLE shows it: one line per replica.
pub fn render_delay(v: &serde_json::Value) -> String {
    let s = cell;
    let mut out = String::new();
    for c in v["clusters"].as_array().into_iter().flatten() {
        if c["enabled"].as_bool() != Some(true) {
            out.push_str(&format!("cluster {}: delay detection off\n\n", s(&c["cluster"])));
            continue;
        }
        let p = &c["primary"];
        out.push_str(&format!(
            "cluster {}: period {} ms, threshold {} ms, source {} | heartbeat on {} ({}): {} ts {} conn {}{}\n",
            s(&c["cluster"]),
            s(&c["period_ms"]),
            s(&c["threshold_ms"]),
            s(&c["source"]),
            s(&p["name"]),
            s(&p["host"]),
            s(&p["status"]),
            s(&p["logic_timestamp"]),
            s(&p["connection_id"]),
            p["message"].as_str().map(|m| format!(" ({m})")).unwrap_or_default(),
        ));
        let cols = [
            "name",
            "host",
            "delay_ms",
            "wall_delay_ms",
            "status",
            "eligible",
            "last_active",
            "connection_id",
            "gtid_applied",
            "message",
        ];
        let header: Vec<String> = cols.iter().map(|c| c.to_string()).collect();
        let rows: Vec<Vec<String>> = c["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| cols.iter().map(|k| s(&r[*k])).collect())
            .collect();
        out.push_str(&render_table(&header, &rows));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_renders_dble_columns() {
        let v = serde_json::json!({ "clusters": [
            { "cluster": "c1", "enabled": true, "source": "h:7400", "period_ms": 500, "threshold_ms": 1000,
              "primary": { "name": "p", "host": "10.0.0.1:3306", "status": "ok", "logic_timestamp": 42, "connection_id": 7 },
              "replicas": [
                { "name": "r1", "host": "10.0.0.2:3306", "delay_ms": 0, "wall_delay_ms": 3, "status": "ok",
                  "eligible": true, "last_active": 1, "connection_id": 9, "gtid_applied": "0-1-42", "message": null },
                { "name": "r2", "host": "10.0.0.3:3306", "delay_ms": null, "status": "timeout",
                  "eligible": false, "message": "no answer within 400 ms" } ] },
            { "cluster": "c2", "enabled": false } ] });
        let text = render_delay(&v);
        assert!(
            text.contains("heartbeat on p (10.0.0.1:3306): ok ts 42 conn 7"),
            "{text}"
        );
        let r1 = text.lines().find(|l| l.starts_with("r1")).unwrap();
        assert!(r1.contains("0-1-42") && r1.contains("true"), "{r1}");
        let r2 = text.lines().find(|l| l.starts_with("r2")).unwrap();
        assert!(r2.contains("timeout") && r2.contains("no answer within 400 ms"), "{r2}");
        assert!(text.contains("cluster c2: delay detection off"), "{text}");
    }
}
