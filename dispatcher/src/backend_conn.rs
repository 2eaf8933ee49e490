//! The dispatcher's own connections to a database member: the health monitor, the
//! topology providers (replication, Group Replication, Galera), the failover, the delay
//! probe and the slow log all open them here, so that every one of them speaks to the
//! member as the workers do: over TCP, with the cluster's TLS settings (`ssl_mode`,
//! `ssl_ca`, `ssl_server_name`; see `docs/CONFIG.md`).
//!
//! It sits on the ground floor (it knows `mysql_async` and the protocol's [`SslMode`],
//! nothing of the dispatcher), so that both `cluster/` and `policy/` may use it.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use mysql_async::{Conn, DriverError, Opts, OptsBuilder, SslOpts};
use osprey_protocol::SslMode;
use tokio::time::Instant;

/// TLS toward the member, as `[backend]`/`[[cluster]]` `ssl_mode`, `ssl_ca`,
/// `ssl_server_name` give it (the workers get the same through `BackendTls`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    /// PEM file of the CA to trust (`verify_ca`, `verify_identity`); when given the only
    /// one. Read at each connect, as the workers do.
    pub ca: Option<PathBuf>,
    /// `verify_identity`: the name checked against the certificate instead of the host.
    pub server_name: Option<String>,
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No connection within the caller's bound: the member may be slow rather than gone.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The driver's error (network, TLS, authentication), as it gave it.
    #[error(transparent)]
    Mysql(#[from] mysql_async::Error),
}

/// How to reach one member: address, account and TLS, turned into driver options once.
/// Cheap to clone; [`Connector::connect`] opens a new connection each time.
#[derive(Debug, Clone)]
pub struct Connector {
    opts: Opts,
    /// `ssl_mode = "preferred"`: the same options without TLS, for a server that offers
    /// none (the workers go on in clear there too).
    plain: Option<Opts>,
}

impl Connector {
    pub fn new(host: &str, port: u16, user: &str, password: &str, tls: &Tls) -> Connector {
        let base = OptsBuilder::default()
            .ip_or_hostname(host.to_owned())
            .tcp_port(port)
            .user(Some(user.to_owned()))
            .pass(Some(password.to_owned()))
            // Stay on TCP: the driver would otherwise move a local connection to the Unix
            // socket, and stop seeing the network path (and any fault proxy) (CRATE-NOTES).
            .prefer_socket(false)
            // Known values, so that a (re)connect is the handshake alone, with no queries.
            .max_allowed_packet(Some(16 * 1024 * 1024))
            .wait_timeout(Some(28_800));
        let opts: Opts = base.clone().ssl_opts(ssl_opts(tls)).into();
        let plain = (tls.mode == SslMode::Preferred).then(|| base.into());
        Connector { opts, plain }
    }

    /// A new connection, bounded by `limit` as a whole (with `preferred`, the fallback in
    /// clear too).
    pub async fn connect(&self, limit: Duration) -> Result<Conn, ConnectError> {
        let deadline = Instant::now() + limit;
        let first = tokio::time::timeout_at(deadline, Conn::new(self.opts.clone()))
            .await
            .map_err(|_| ConnectError::Timeout(limit))?;
        match (first, &self.plain) {
            (Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer)), Some(plain)) => {
                tracing::warn!(
                    host = self.opts.ip_or_hostname(),
                    port = self.opts.tcp_port(),
                    "ssl_mode preferred: the server offers no TLS; going on in clear"
                );
                let conn = tokio::time::timeout_at(deadline, Conn::new(plain.clone()))
                    .await
                    .map_err(|_| ConnectError::Timeout(limit))??;
                Ok(conn)
            }
            (r, _) => Ok(r?),
        }
    }
}

/// `ssl_mode` in the driver's terms, with the meaning the workers give it
/// (`wire/src/tls.rs`): `None` is plain TCP; `preferred` and `required` encrypt without
/// checking the certificate; `verify_ca` checks the chain only; `verify_identity` the
/// chain and the name.
fn ssl_opts(tls: &Tls) -> Option<SslOpts> {
    // The CA given is the only one trusted; without one (verify_identity only), the
    // system's roots as the workers load them, never the driver's own built-in list, so
    // that a worker and the monitor cannot disagree about a certificate.
    let trusted = |o: SslOpts| {
        let roots = match &tls.ca {
            Some(ca) => vec![ca.clone().into()],
            None => system_roots().iter().map(|der| der.clone().into()).collect(),
        };
        o.with_root_certs(roots).with_disable_built_in_roots(true)
    };
    match tls.mode {
        SslMode::Disabled => None,
        SslMode::Preferred | SslMode::Required => Some(
            SslOpts::default()
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
        ),
        SslMode::VerifyCa => Some(trusted(SslOpts::default()).with_danger_skip_domain_validation(true)),
        SslMode::VerifyIdentity => {
            Some(trusted(SslOpts::default()).with_danger_tls_hostname_override(tls.server_name.clone()))
        }
    }
}

/// The system's CA certificates (DER), read once (a few ms, the first time a
/// `verify_identity` member without `ssl_ca` is reached): `rustls-native-certs`, as the
/// workers' `wire` does. Certificates rustls cannot take are left out here, as the workers
/// skip them: the driver would fail the whole connection on the first one.
fn system_roots() -> &'static [Vec<u8>] {
    static ROOTS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "system CA certificates: not all could be read");
        }
        let mut check = rustls::RootCertStore::empty();
        found
            .certs
            .into_iter()
            .filter(|c| check.add(c.clone()).is_ok())
            .map(|c| c.to_vec())
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(mode: SslMode, ca: Option<&str>, name: Option<&str>) -> Tls {
        Tls {
            mode,
            ca: ca.map(PathBuf::from),
            server_name: name.map(str::to_owned),
        }
    }

    #[test]
    fn every_mode_maps_to_the_drivers_options() {
        let c = Connector::new("db", 3307, "mon", "pw", &Tls::default());
        assert!(c.opts.ssl_opts().is_none());
        assert!(!c.opts.prefer_socket(), "TCP only");
        assert_eq!(c.opts.ip_or_hostname(), "db");
        assert_eq!(c.opts.tcp_port(), 3307);
        assert_eq!(c.opts.user(), Some("mon"));
        assert!(c.plain.is_none());

        for mode in [SslMode::Preferred, SslMode::Required] {
            let c = Connector::new("db", 3306, "mon", "pw", &tls(mode, None, None));
            let s = c.opts.ssl_opts().expect("TLS");
            assert!(s.accept_invalid_certs() && s.skip_domain_validation(), "{mode:?}");
            assert_eq!(c.plain.is_some(), mode == SslMode::Preferred);
        }

        let c = Connector::new("db", 3306, "mon", "pw", &tls(SslMode::VerifyCa, Some("/ca.pem"), None));
        let s = c.opts.ssl_opts().unwrap();
        assert!(!s.accept_invalid_certs() && s.skip_domain_validation());
        assert!(s.disable_built_in_roots());
        assert_eq!(s.root_certs().len(), 1);

        let c = Connector::new(
            "10.0.0.1",
            3306,
            "mon",
            "pw",
            &tls(SslMode::VerifyIdentity, Some("/ca.pem"), Some("db.internal")),
        );
        let s = c.opts.ssl_opts().unwrap();
        assert!(!s.accept_invalid_certs() && !s.skip_domain_validation());
        assert!(s.disable_built_in_roots());
        assert_eq!(s.tls_hostname_override(), Some("db.internal"));

        // No CA: the system's roots, as the workers (not the driver's built-in list).
        let c = Connector::new("db", 3306, "mon", "pw", &tls(SslMode::VerifyIdentity, None, None));
        let s = c.opts.ssl_opts().unwrap();
        assert!(s.disable_built_in_roots());
        assert_eq!(s.root_certs().len(), system_roots().len());
        assert_eq!(s.tls_hostname_override(), None);
    }
}
