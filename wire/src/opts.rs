//! What [`crate::Session::connect`] needs to know.

use std::path::PathBuf;
use std::time::Duration;

/// How the connection to the server is encrypted, as MySQL's `--ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP.
    #[default]
    Disabled,
    /// TLS when the server offers it (certificate not checked), else plain TCP on the same
    /// connection.
    Preferred,
    /// TLS, or the connection fails; the certificate is not checked.
    Required,
    /// TLS with the certificate chain checked against the trusted roots; any host name.
    VerifyCa,
    /// TLS with the chain and the host name (or [`TlsOpts::server_name`]) checked.
    VerifyIdentity,
}

/// TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOpts {
    /// The mode.
    pub mode: SslMode,
    /// PEM file of the CA(s) to trust; when given, the only roots trusted. Absent: the
    /// system's roots (`rustls-native-certs`).
    pub ca_file: Option<PathBuf>,
    /// Name checked against the certificate under [`SslMode::VerifyIdentity`] instead of
    /// [`Opts::host`].
    pub server_name: Option<String>,
}

/// Connection options. `Debug` leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub struct Opts {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password (empty: none).
    pub password: String,
    /// Default database; `None` connects without one.
    pub database: Option<String>,
    /// TLS; `None` is [`SslMode::Disabled`].
    pub tls: Option<TlsOpts>,
    /// Bound on the whole connection setup (TCP, TLS, authentication).
    pub connect_timeout: Duration,
    /// Ask for `CLIENT_DEPRECATE_EOF` (result sets end with an OK packet, not EOF). On by
    /// default; off exercises the older EOF-terminated result sets.
    pub deprecate_eof: bool,
    /// Ask a MariaDB server (10.6+) for `MARIADB_CLIENT_CACHE_METADATA`: an execute's
    /// result set then comes without column definitions when they have not changed since
    /// the statement last sent them, and the statement's own are used. On by default (as
    /// `mysql_async` asks); off exercises full metadata on every execute.
    pub cache_metadata: bool,
}

impl std::fmt::Debug for Opts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opts")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("deprecate_eof", &self.deprecate_eof)
            .field("cache_metadata", &self.cache_metadata)
            .finish()
    }
}

impl Opts {
    /// Options with the defaults: no database, no TLS, 10 s connect timeout, DEPRECATE_EOF
    /// and metadata caching asked for.
    pub fn new(host: impl Into<String>, port: u16, user: impl Into<String>, password: impl Into<String>) -> Opts {
        Opts {
            host: host.into(),
            port,
            user: user.into(),
            password: password.into(),
            database: None,
            tls: None,
            connect_timeout: Duration::from_secs(10),
            deprecate_eof: true,
            cache_metadata: true,
        }
    }

    /// Sets the default database.
    pub fn database(mut self, db: impl Into<String>) -> Opts {
        self.database = Some(db.into());
        self
    }

    /// Sets the TLS options.
    pub fn tls(mut self, tls: TlsOpts) -> Opts {
        self.tls = Some(tls);
        self
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_leaves_the_password_out() {
        let o = super::Opts::new("h", 1, "u", "s3cret-pass");
        let shown = format!("{o:?}");
        assert!(!shown.contains("s3cret-pass"), "{shown}");
        assert!(shown.contains("redacted"));
    }
}
