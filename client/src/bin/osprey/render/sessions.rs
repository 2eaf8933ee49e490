//! `GET /sessions` as a table.

use osprey_admin_api::SessionView;

use crate::render::table::render_table;

/// One line per session, oldest first, as the dispatcher sends them.
pub fn render_sessions(sessions: &[SessionView]) -> String {
    if sessions.is_empty() {
        return "no session holds a worker\n".into();
    }
    let secs = |ms: u64| format!("{:.1}s", ms as f64 / 1000.0);
    let header: Vec<String> = ["conn", "session", "cluster", "member", "slot", "age", "transaction"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.conn.to_string(),
                s.session.to_string(),
                s.cluster.clone(),
                format!("{}{}", s.member, if s.read_only { " (read only)" } else { "" }),
                s.slot.to_string(),
                secs(s.age_ms),
                if s.in_transaction {
                    format!("open {}", secs(s.transaction_ms))
                } else {
                    "-".into()
                },
            ]
        })
        .collect();
    render_table(&header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_render_as_a_table() {
        let s = SessionView {
            conn: 7,
            session: 3,
            cluster: "sandbox".into(),
            member: "primary".into(),
            slot: 1,
            read_only: false,
            age_ms: 12_345,
            in_transaction: true,
            transaction_ms: 2_500,
        };
        let text = render_sessions(&[s]);
        assert!(text.contains("conn") && text.contains("primary"), "{text}");
        assert!(text.contains("12.3s") && text.contains("open 2.5s"), "{text}");
        assert_eq!(render_sessions(&[]), "no session holds a worker\n");
    }
}
