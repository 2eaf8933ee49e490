//! Support for the tests against a real MariaDB (osprey-sandbox): options, a response
//! collector, and certificates made with rcgen.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use osprey_sandbox::Instance;
use osprey_wire::{Column, Error, Event, OkPacket, Opts, ServerError, Session, Value};

/// The app account, with the sandbox's database.
pub fn opts(inst: &Instance) -> Opts {
    Opts::new(inst.host(), inst.port(), inst.user(), inst.password()).database(inst.database())
}

/// The admin account, no database.
pub fn admin_opts(inst: &Instance) -> Opts {
    Opts::new(
        inst.host(),
        inst.port(),
        osprey_sandbox::ADMIN_USER,
        osprey_sandbox::ADMIN_PASSWORD,
    )
}

/// One result of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultSet {
    /// `None` for a statement without rows.
    pub columns: Option<Arc<[Column]>>,
    pub rows: Vec<Vec<Value>>,
    pub ok: OkPacket<'static>,
}

/// A whole response: its results, then the error that ended it, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub results: Vec<ResultSet>,
    pub error: Option<ServerError>,
}

impl Response {
    /// The first column of every row of every result set, as text.
    pub fn texts(&self) -> Vec<String> {
        self.results
            .iter()
            .flat_map(|r| r.rows.iter())
            .map(|row| match &row[0] {
                Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                Value::NULL => "NULL".into(),
                v => v.as_sql(false),
            })
            .collect()
    }

    pub fn ok(&self) -> &OkPacket<'static> {
        &self.results.last().expect("a result").ok
    }
}

/// Reads the oldest pending command's whole response. Fatal errors are returned.
pub async fn read_response(s: &mut Session) -> Result<Response, Error> {
    let mut results = Vec::new();
    let mut columns = None;
    let mut rows = Vec::new();
    loop {
        match s.next_event().await {
            Ok(Event::Columns(c)) => columns = Some(c),
            Ok(Event::Row(r)) => rows.push(r.unwrap()),
            Ok(Event::RawRow(_)) => panic!("a raw row nobody asked for"),
            Ok(Event::End { ok, more_results }) => {
                results.push(ResultSet {
                    columns: columns.take(),
                    rows: std::mem::take(&mut rows),
                    ok,
                });
                if !more_results {
                    return Ok(Response { results, error: None });
                }
            }
            Err(Error::Server(e)) => {
                return Ok(Response {
                    results,
                    error: Some(e),
                })
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends `sql` and reads its response.
pub async fn query(s: &mut Session, sql: &str) -> Response {
    s.send_query(sql).expect("send");
    read_response(s).await.expect("no fatal error")
}

/// The single value of a one-row, one-column text result.
pub async fn scalar(s: &mut Session, sql: &str) -> String {
    let r = query(s, sql).await;
    assert!(r.error.is_none(), "{sql}: {:?}", r.error);
    let texts = r.texts();
    assert_eq!(texts.len(), 1, "{sql}: {texts:?}");
    texts[0].clone()
}

/// Waits for `cond` up to `timeout`, checking every 20 ms.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A CA and a server certificate for 127.0.0.1 / localhost, as PEM files.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(ca_name: &str) -> anyhow::Result<Pki> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let dir = tempfile::Builder::new().prefix("osprey-wire-pki-").tempdir()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, ca_name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, issuer.pem())?;
        let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        leaf.distinguished_name.push(DnType::CommonName, "localhost");
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = leaf.signed_by(&key, &issuer)?;
        let cert_file = dir.path().join("server.pem");
        let key_file = dir.path().join("server.key");
        std::fs::write(&cert_file, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        Ok(Pki {
            dir,
            ca,
            cert: cert_file,
            key: key_file,
        })
    }

    pub fn ca(&self) -> &Path {
        &self.ca
    }
}
