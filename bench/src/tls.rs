//! A CA and a server certificate for the `osprey-tls` target, made at start (rcgen).

use std::path::PathBuf;

use osprey_client::TlsConfig;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

pub struct BenchPki {
    _dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl BenchPki {
    pub fn new() -> anyhow::Result<BenchPki> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "osprey-bench CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
        let dir = tempfile::Builder::new().prefix("osprey-bench-pki-").tempdir()?;
        let pki = BenchPki {
            ca_file: dir.path().join("ca.pem"),
            cert_file: dir.path().join("server.pem"),
            key_file: dir.path().join("server.key"),
            _dir: dir,
        };
        std::fs::write(&pki.ca_file, issuer.pem())?;
        std::fs::write(&pki.cert_file, leaf.pem())?;
        std::fs::write(&pki.key_file, key.serialize_pem())?;
        Ok(pki)
    }

    pub fn client_config(&self) -> TlsConfig {
        TlsConfig {
            ca_file: Some(self.ca_file.clone()),
            ..Default::default()
        }
    }
}
