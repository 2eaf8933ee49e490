//! `osprey status`: `GET /status`, the pool's figures and a table of its slots.

use osprey_admin_api::Status;

use super::table::render_table;

/// `GET /status`: the process, the first cluster's write slots, clients and streams, then
/// a row per slot of every group.
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
    let (pinned, cap, in_txn, longest) = st.groups.iter().fold((0, 0, 0, 0), |(a, b, c, d), g| {
        (
            a + g.sessions,
            b + g.max_sessions,
            c + g.sessions_in_transaction,
            d.max(g.longest_transaction_ms),
        )
    });
    out.push_str(&format!(
        "sessions: {pinned} pinned (at most {cap}), {in_txn} in a transaction, longest transaction {:.1}s\n",
        longest as f64 / 1000.0
    ));
    out.push_str(&format!(
        "clients: {} connections, {} open streams; MySQL: {} connections, {} pinned to a session\n",
        st.clients.connections, st.clients.open_streams, st.clients.mysql_connections, st.clients.mysql_pinned
    ));
    out.push_str(&format!(
        "streams: {} opened, {} closed\n",
        st.streams.opened, st.streams.closed
    ));
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
                s.state.name().to_string(),
                s.requests.to_string(),
                format!("{:.1}s", s.age_s),
                s.backend.clone(),
                s.db_connection_id.map_or_else(dash, |i| i.to_string()),
                s.pipeline.to_string(),
            ]
        })
        .collect();
    out.push_str(&render_table(&header, &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A /status body as the dispatcher writes it (`osprey_admin_api::Status`), and its
    /// text, byte for byte as the CLI printed it before it read the shared types.
    #[test]
    fn status_renders_starting_slots() {
        let body = r#"{"version":"0.1.0","pid":123,"uptime_s":12.5,"draining":false,
           "pool":{"role":"write","cluster":"c1","member":"primary","hold":null,"unavailable":null,
                   "size":2,"slots":2,"idle":1,"busy":0,"starting":1,"quitting":0,
                   "queue_depth":0,"queue_capacity":1024,"queue_bytes":0,"queue_bytes_capacity":67108864,
                   "waiting_connections":0,"capped_connections":0,"longest_connection_queue":0,"longest_wait_ms":0,
                   "max_per_connection":1,"respawns":0,"recycles":0,"fatal_exits":0},
           "slots":[{"slot":0,"pid":4242,"state":"idle","requests":10,"age_s":3.2,"backend":"primary","cluster":"c1",
                     "db_connection_id":17,"retiring":false,"pipeline":0},
                    {"slot":1,"pid":null,"state":"starting","requests":0,"age_s":0.0,"backend":"primary","cluster":"c1",
                     "db_connection_id":null,"retiring":false,"pipeline":0}],
           "groups":[],
           "clusters":[{"name":"c1","topology":"replication","primary":"primary","status":{"status":"ok"},"epoch":1}],
           "clients":{"connections":1,"open_streams":0},"streams":{"opened":10,"closed":10},
           "fds":{"limit":1024,"reserve":100,"max_client_connections":924,"open":null,"admin_connections":1}}"#;
        let st: Status = serde_json::from_str(body).unwrap();
        let out = render_status(&st);
        assert!(out.contains("pool: size 2 | idle 1"), "{out}");
        assert!(out.contains("0    | 4242 | idle"), "{out}");
        assert!(out.contains("| 17      | 0"), "the pipeline figure: {out}");
        assert!(out.contains("1    | -    | starting"), "{out}");
        assert_eq!(
            out,
            "osprey 0.1.0 (pid 123), up 12.5s
pool: size 2 | idle 1 | busy 0 | starting 1 | quitting 0
queue: 0/1024 from 0 connections (0 at their worker cap) | respawns 0 | recycles 0 | fatal exits 0
sessions: 0 pinned (at most 0), 0 in a transaction, longest transaction 0.0s
clients: 1 connections, 0 open streams; MySQL: 0 connections, 0 pinned to a session
streams: 10 opened, 10 closed

slot | pid  | state    | requests | age  | backend | db conn | pipeline
-----+------+----------+----------+------+---------+---------+---------
0    | 4242 | idle     | 10       | 3.2s | primary | 17      | 0
1    | -    | starting | 0        | 0.0s | primary | -       | 0
"
        );
    }
}
