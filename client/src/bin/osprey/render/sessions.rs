//! `GET /sessions` as a table.

use osprey_admin_api::{SessionClient, SessionView};

use crate::render::table::render_table;

/// One line per session, oldest first, as the dispatcher sends them.
pub fn render_sessions(sessions: &[SessionView]) -> String {
    if sessions.is_empty() {
        return "no session holds a worker\n".into();
    }
    let secs = |ms: u64| format!("{:.1}s", ms as f64 / 1000.0);
    let header: Vec<String> = [
        "conn",
        "session",
        "cluster",
        "member",
        "slot",
        "age",
        "transaction",
        "client",
    ]
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
                s.client.as_ref().map_or("-".into(), client),
            ]
        })
        .collect();
    render_table(&header, &rows)
}

/// `mysql app@127.0.0.1:50122 (mysql_async, pinned: user_variable)`.
fn client(c: &SessionClient) -> String {
    let program = ["program_name", "_client_name"]
        .iter()
        .find_map(|k| c.attrs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()));
    let mut notes: Vec<String> = program.into_iter().map(str::to_string).collect();
    if let Some(why) = &c.pinned_by {
        notes.push(format!("pinned: {why}"));
    }
    let peer = c.peer.as_deref().map(|p| format!("@{p}")).unwrap_or_default();
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!("{} {}{peer}{notes}", c.protocol, c.user)
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
            client: Some(SessionClient {
                protocol: "mysql".into(),
                user: "app".into(),
                peer: Some("127.0.0.1:50122".into()),
                attrs: vec![("_client_name".into(), "libmariadb".into())],
                pinned_by: Some("user_variable".into()),
                connected_ms: 9_000,
            }),
        };
        let text = render_sessions(&[s]);
        assert!(text.contains("conn") && text.contains("primary"), "{text}");
        assert!(
            text.contains("mysql app@127.0.0.1:50122 (libmariadb, pinned: user_variable)"),
            "{text}"
        );
        assert!(text.contains("12.3s") && text.contains("open 2.5s"), "{text}");
        assert_eq!(render_sessions(&[]), "no session holds a worker\n");
    }
}
