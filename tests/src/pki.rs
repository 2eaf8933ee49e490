//! Certificates made in the test (rcgen, ECDSA P-256): a CA, server and client leaves,
//! written as PEM files into a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority that issues leaves into `dir`.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
    /// PEM file of the CA's certificate.
    pub cert_file: PathBuf,
}

/// A leaf's PEM files.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> anyhow::Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let dir = tempfile::Builder::new().prefix("osprey-pki-").tempdir()?;
        let cert_file = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&cert_file, issuer.pem())?;
        Ok(TestCa { issuer, dir, cert_file })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `names` (DNS names or IP addresses), files `<file>.pem/.key`.
    pub fn server(&self, file: &str, names: &[&str]) -> anyhow::Result<Leaf> {
        self.leaf(file, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, file: &str, name: &str) -> anyhow::Result<Leaf> {
        self.leaf(file, &[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(&self, file: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> anyhow::Result<Leaf> {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or("osprey"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let leaf = Leaf {
            cert_file: self.dir.path().join(format!("{file}.pem")),
            key_file: self.dir.path().join(format!("{file}.key")),
        };
        std::fs::write(&leaf.cert_file, cert.pem())?;
        std::fs::write(&leaf.key_file, key.serialize_pem())?;
        Ok(leaf)
    }
}
