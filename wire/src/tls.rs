//! rustls client configuration for the [`SslMode`]s, with the same meaning as the worker's
//! `mysql_async` settings: PREFERRED/REQUIRED encrypt against a passive listener only (any
//! certificate), VERIFY_CA checks the chain but no name, VERIFY_IDENTITY checks both.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, Result};
use crate::opts::{SslMode, TlsOpts};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(tls: &TlsOpts) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match &tls.ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| Error::Tls(format!("cannot read CA file {}: {e}", path.display())))?;
            for cert in certs {
                let cert = cert.map_err(|e| Error::Tls(format!("bad CA file {}: {e}", path.display())))?;
                store
                    .add(cert)
                    .map_err(|e| Error::Tls(format!("bad CA certificate in {}: {e}", path.display())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // One unparsable system certificate should not stop the others from working.
                let _ = store.add(cert);
            }
        }
    }
    if store.is_empty() {
        return Err(Error::Tls("no trusted CA certificate".into()));
    }
    Ok(store)
}

/// The connector for `tls` (not [`SslMode::Disabled`]) and the name to present.
pub(crate) fn connector(tls: &TlsOpts, host: &str) -> Result<(tokio_rustls::TlsConnector, ServerName<'static>)> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match tls.mode {
        SslMode::Disabled | SslMode::Preferred | SslMode::Required => Arc::new(AnyCert(provider)),
        SslMode::VerifyCa | SslMode::VerifyIdentity => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(tls)?), provider)
                .build()
                .map_err(|e| Error::Tls(e.to_string()))?;
            if tls.mode == SslMode::VerifyCa {
                Arc::new(AnyName(webpki))
            } else {
                webpki
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let name = match (tls.mode, &tls.server_name) {
        (SslMode::VerifyIdentity, Some(name)) => name.as_str(),
        _ => host,
    };
    let name = ServerName::try_from(name.to_owned()).map_err(|e| Error::Tls(format!("server name {name:?}: {e}")))?;
    Ok((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
}

/// Accepts any certificate, but still checks the handshake signatures made with it.
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The chain is checked, the name is not. webpki checks the chain before the name, so a
/// name error means the chain was good.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
