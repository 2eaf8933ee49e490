//! Free loopback ports.
//!
//! A port is found by binding `127.0.0.1:0` and releasing it; the server then binds it. Another
//! process can take the port in between, so callers retry with a new port when the server
//! reports the address in use (see [`crate::instance`]). Within one process a port is never
//! handed out twice, so parallel tests in one binary do not race each other for it.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

use crate::SandboxError;

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(Default::default)
}

/// Returns a loopback port that was free a moment ago and that this process has not handed
/// out before.
pub(crate) fn pick_free_port() -> Result<u16, SandboxError> {
    for _ in 0..256 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| SandboxError::io("binding 127.0.0.1:0 to find a free port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| SandboxError::io("reading the address of a probe socket", e))?
            .port();
        drop(listener);
        if handed_out().lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return Ok(port);
        }
    }
    Err(SandboxError::io(
        "finding a free loopback port",
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "every probed port was already handed out",
        ),
    ))
}

/// Whether a server error log says the listening port was taken.
pub(crate) fn log_says_port_in_use(log_tail: &str) -> bool {
    log_tail.contains("Address already in use") || log_tail.contains("errno: 98") || log_tail.contains("error: 98")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_unique_within_the_process() {
        let mut seen = HashSet::new();
        for _ in 0..50 {
            assert!(seen.insert(pick_free_port().unwrap()));
        }
    }

    #[test]
    fn recognises_bind_failure() {
        let log = "[ERROR] Can't start server: Bind on TCP/IP port. Got error: 98: Address already in use";
        assert!(log_says_port_in_use(log));
        assert!(!log_says_port_in_use("[Note] ready for connections"));
    }
}
