//! Who is connected: one entry per authenticated client connection, SDK or MySQL, for
//! the operators' views (`GET /sessions` names the client of each session; `GET /status`
//! counts them by protocol). Entries come and go with their connections (an
//! [`Registration`] removes its own), so the directory is bounded by the connection caps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Connection attributes kept per client at most (a MySQL client sends a few: its
/// library, version, program name, pid), and bytes of each name and value.
const MAX_ATTRS: usize = 32;
const MAX_ATTR_BYTES: usize = 256;

/// What an operator sees of one client connection.
#[derive(Debug)]
pub struct ClientInfo {
    /// `sdk` or `mysql`.
    pub protocol: &'static str,
    /// The MySQL user, or for an SDK client the index of its token and the name it gave.
    pub user: String,
    pub peer: Option<SocketAddr>,
    /// MySQL connection attributes (`_client_name`, `program_name`, …), bounded.
    pub attrs: Vec<(String, String)>,
    pub since: Instant,
    /// Why a MySQL client is pinned to its session beyond a transaction, if it is.
    pinned_by: Mutex<Option<&'static str>>,
}

impl ClientInfo {
    pub fn new(
        protocol: &'static str,
        user: String,
        peer: Option<SocketAddr>,
        attrs: &[(String, String)],
    ) -> ClientInfo {
        // The client chose these bytes: no control character (an escape sequence would
        // reach an operator's terminal through `osprey sessions`).
        let clip = |s: &str| {
            let mut end = s.len().min(MAX_ATTR_BYTES);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end]
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect::<String>()
        };
        ClientInfo {
            protocol,
            user,
            peer,
            attrs: attrs.iter().take(MAX_ATTRS).map(|(k, v)| (clip(k), clip(v))).collect(),
            since: Instant::now(),
            pinned_by: Mutex::new(None),
        }
    }

    pub fn set_pinned_by(&self, why: Option<&'static str>) {
        *self.pinned_by.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    pub fn pinned_by(&self) -> Option<&'static str> {
        *self.pinned_by.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The connected clients, by connection id.
#[derive(Default)]
pub struct Directory {
    by_conn: Mutex<HashMap<u64, Arc<ClientInfo>>>,
}

/// A connection's entry, removed when dropped.
pub struct Registration {
    directory: Arc<Directory>,
    conn: u64,
    pub info: Arc<ClientInfo>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut m = self.directory.lock();
        // A change of user replaced the entry under the same id: only its own goes.
        if m.get(&self.conn).is_some_and(|i| Arc::ptr_eq(i, &self.info)) {
            m.remove(&self.conn);
        }
    }
}

impl Directory {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<ClientInfo>>> {
        self.by_conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enters connection `conn` (again, after a change of user: the new entry replaces
    /// the old).
    pub fn register(self: &Arc<Self>, conn: u64, info: ClientInfo) -> Registration {
        let info = Arc::new(info);
        self.lock().insert(conn, info.clone());
        Registration {
            directory: self.clone(),
            conn,
            info,
        }
    }

    pub fn get(&self, conn: u64) -> Option<Arc<ClientInfo>> {
        self.lock().get(&conn).cloned()
    }

    /// Connections by protocol.
    pub fn count(&self, protocol: &str) -> usize {
        self.lock().values().filter(|i| i.protocol == protocol).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_leave_with_their_connection_and_are_bounded() {
        let d = Arc::new(Directory::default());
        let long = "é".repeat(400);
        let attrs: Vec<(String, String)> = (0..40).map(|i| (format!("k{i}"), long.clone())).collect();
        let a = d.register(1, ClientInfo::new("mysql", "app".into(), None, &attrs));
        assert_eq!(a.info.attrs.len(), MAX_ATTRS);
        let esc = ClientInfo::new(
            "mysql",
            "x".into(),
            None,
            &[("program_name".into(), "a\x1b[2Jb\r".into())],
        );
        assert_eq!(esc.attrs[0].1, "a?[2Jb?");
        assert!(a.info.attrs[0].1.len() <= MAX_ATTR_BYTES);
        let b = d.register(2, ClientInfo::new("sdk", "client_tokens[0]".into(), None, &[]));
        assert_eq!((d.count("mysql"), d.count("sdk")), (1, 1));
        // A change of user: the new entry replaces the old, whose drop leaves it.
        let a2 = d.register(1, ClientInfo::new("mysql", "other".into(), None, &[]));
        drop(a);
        assert_eq!(d.get(1).map(|i| i.user.clone()), Some("other".into()));
        drop((a2, b));
        assert_eq!(d.count("mysql") + d.count("sdk"), 0);
    }
}
