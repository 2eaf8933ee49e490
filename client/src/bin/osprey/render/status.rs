//! `osprey status`: `GET /status`, the pool's figures and a table of its slots.

use serde::Deserialize;

use super::table::render_table;

#[derive(Debug, Deserialize)]
pub struct Status {
    version: String,
    pid: u32,
    uptime_s: f64,
    draining: bool,
    pool: Pool,
    #[serde(default)]
    slots: Vec<Slot>,
    clients: Option<Clients>,
    streams: Option<Streams>,
}

#[derive(Debug, Deserialize)]
struct Pool {
    size: u64,
    idle: u64,
    busy: u64,
    starting: u64,
    quitting: u64,
    queue_depth: u64,
    queue_capacity: u64,
    #[serde(default)]
    waiting_connections: u64,
    #[serde(default)]
    capped_connections: u64,
    respawns: u64,
    recycles: u64,
    fatal_exits: u64,
}

#[derive(Debug, Deserialize)]
struct Slot {
    slot: u32,
    pid: Option<u32>,
    state: String,
    requests: u64,
    age_s: f64,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    db_connection_id: Option<u64>,
    /// Requests written to the worker (prefetch), the current one included; absent before 1.4.
    #[serde(default)]
    pipeline: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Clients {
    connections: u64,
    open_streams: u64,
}

#[derive(Debug, Deserialize)]
struct Streams {
    opened: u64,
    closed: u64,
}

pub fn render_status(st: &Status) -> String {
    let p = &st.pool;
    let mut out = format!(
        "osprey {} (pid {}), up {:.1}s{}\n",
        st.version,
        st.pid,
        st.uptime_s,
        if st.draining { ", DRAINING" } else { "" }
    );
    out.push_str(&format!(
        "pool: size {} | idle {} | busy {} | starting {} | quitting {}\n",
        p.size, p.idle, p.busy, p.starting, p.quitting
    ));
    out.push_str(&format!(
        "queue: {}/{} from {} connections ({} at their worker cap) | respawns {} | recycles {} | fatal exits {}\n",
        p.queue_depth,
        p.queue_capacity,
        p.waiting_connections,
        p.capped_connections,
        p.respawns,
        p.recycles,
        p.fatal_exits
    ));
    if let Some(c) = &st.clients {
        out.push_str(&format!(
            "clients: {} connections, {} open streams\n",
            c.connections, c.open_streams
        ));
    }
    if let Some(s) = &st.streams {
        out.push_str(&format!("streams: {} opened, {} closed\n", s.opened, s.closed));
    }
    out.push('\n');
    let header: Vec<String> = [
        "slot", "pid", "state", "requests", "age", "backend", "db conn", "pipeline",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = st
        .slots
        .iter()
        .map(|s| {
            vec![
                s.slot.to_string(),
                s.pid.map_or_else(dash, |p| p.to_string()),
                s.state.clone(),
                s.requests.to_string(),
                format!("{:.1}s", s.age_s),
                s.backend.clone().unwrap_or_else(dash),
                s.db_connection_id.map_or_else(dash, |i| i.to_string()),
                s.pipeline.map_or_else(dash, |p| p.to_string()),
            ]
        })
        .collect();
    out.push_str(&render_table(&header, &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_renders_starting_slots() {
        let body = r#"{"version":"0.1.0","pid":123,"uptime_s":12.5,"draining":false,
           "pool":{"size":2,"idle":1,"busy":0,"starting":1,"quitting":0,"queue_depth":0,"queue_capacity":1024,"respawns":0,"recycles":0,"fatal_exits":0},
           "slots":[{"slot":0,"pid":4242,"state":"idle","requests":10,"age_s":3.2,"backend":"primary","db_connection_id":17,"pipeline":0},
                    {"slot":1,"pid":null,"state":"starting","requests":0,"age_s":0.0,"backend":"primary","db_connection_id":null}],
           "clients":{"connections":1,"open_streams":0},"streams":{"opened":10,"closed":10}}"#;
        let st: Status = serde_json::from_str(body).unwrap();
        let out = render_status(&st);
        assert!(out.contains("pool: size 2 | idle 1"), "{out}");
        assert!(out.contains("0    | 4242 | idle"), "{out}");
        assert!(out.contains("| 17      | 0"), "the pipeline figure: {out}");
        assert!(out.contains("1    | -    | starting"), "{out}");
    }
}
