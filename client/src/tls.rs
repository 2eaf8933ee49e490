//! TLS to the dispatcher (rustls with the ring provider).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use osprey_protocol::ErrorCode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig as RustlsConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::error::Error;

/// TLS settings of a [`ClientConfig`](crate::ClientConfig).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM CA certificates the dispatcher's certificate must chain to. `None`: the
    /// system's roots (`/etc/ssl/certs`, through rustls-native-certs).
    pub ca_file: Option<PathBuf>,
    /// Name the dispatcher's certificate must be valid for. `None`: the host part of
    /// the address being connected to (a DNS name or an IP address).
    pub server_name: Option<String>,
    /// PEM certificate chain presented to a dispatcher that asks for client certificates.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

pub(crate) type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

fn config_error(message: String) -> Error {
    Error::client(ErrorCode::ConnectFailed, false, message)
}

fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| config_error(format!("TLS {what} {}: {e}", path.display())))
}

fn certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = read_pem(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error(format!("TLS {what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(config_error(format!(
            "TLS {what} {}: no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// Builds the rustls configuration: read at every connection attempt, so that a CA or
/// client certificate rotated on disk is picked up at the next reconnect.
fn rustls_config(cfg: &TlsConfig) -> Result<Arc<RustlsConfig>, Error> {
    let mut roots = RootCertStore::empty();
    match &cfg.ca_file {
        Some(path) => {
            for cert in certs("CA file", path)? {
                roots
                    .add(cert)
                    .map_err(|e| config_error(format!("TLS CA file {}: {e}", path.display())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(config_error(format!(
                    "TLS: no system root certificates found ({} errors); set a CA file",
                    found.errors.len()
                )));
            }
        }
    }
    let builder = RustlsConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match (&cfg.cert_file, &cfg.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = certs("client certificate", cert)?;
            let key = PrivateKeyDer::from_pem_slice(&read_pem("client key", key)?)
                .map_err(|e| config_error(format!("TLS client key {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error(format!("TLS client certificate: {e}")))?
        }
        _ => {
            return Err(config_error(
                "TLS: a client certificate needs both cert_file and key_file".into(),
            ))
        }
    };
    Ok(Arc::new(config))
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    }
}

/// Says in words what a failed TLS exchange most likely means.
pub(crate) fn describe(addr: &str, e: &io::Error) -> String {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return format!("TLS with {addr} failed: {e}");
    };
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let hint = match tls {
        E::InvalidMessage(_) => {
            " (the server does not speak TLS: is this a plaintext Osprey port? connect without TLS)"
        }
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            " (the dispatcher's certificate is not signed by a CA this client trusts: check the CA file)"
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            " (the certificate is for another name: check the address or set the TLS server name)"
        }
        E::AlertReceived(A::CertificateRequired | A::BadCertificate | A::UnknownCA | A::HandshakeFailure) => {
            " (the dispatcher refused this client's certificate, or wants one: check the client certificate)"
        }
        _ => "",
    };
    format!("TLS with {addr} failed: {tls}{hint}")
}

/// Connects TLS over `sock`: the handshake is done when this returns.
pub(crate) async fn connect(addr: &str, cfg: &TlsConfig, sock: TcpStream) -> Result<(BoxRead, BoxWrite), Error> {
    let config = rustls_config(cfg)?;
    let name = cfg.server_name.as_deref().unwrap_or_else(|| host_of(addr));
    let name =
        ServerName::try_from(name.to_owned()).map_err(|e| config_error(format!("TLS server name {name:?}: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, sock)
        .await
        .map_err(|e| config_error(describe(addr, &e)))?;
    let (r, w) = tokio::io::split(stream);
    Ok((Box::new(r), Box::new(w)))
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("db.example:7400"), "db.example");
        assert_eq!(host_of("127.0.0.1:7400"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7400"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
        assert_eq!(host_of("::1"), "::1");
    }
}
