//! Connecting: passwords, databases, TLS modes, against a real MariaDB.

mod common;

use common::{opts, scalar, Pki};
use osprey_sandbox::Sandbox;
use osprey_wire::{Error, Opts, Session, SslMode, TlsOpts};

#[tokio::test]
async fn password_login_with_and_without_database() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();

    let mut s = Session::connect(&opts(p)).await?;
    assert_eq!(scalar(&mut s, "SELECT DATABASE()").await, p.database());
    assert_eq!(
        scalar(&mut s, "SELECT CONNECTION_ID()").await,
        s.connection_id().to_string()
    );
    assert!(s.is_mariadb());
    let version = scalar(&mut s, "SELECT VERSION()").await;
    let (ma, mi, pa) = s.server_version();
    assert!(
        version.starts_with(&format!("{ma}.{mi}.{pa}")),
        "{version} vs {:?}",
        s.server_version()
    );
    // utf8mb4_general_ci, as mysql_async asks for.
    assert_eq!(
        scalar(&mut s, "SELECT @@collation_connection").await,
        "utf8mb4_general_ci"
    );
    s.ping().await?;
    assert!(!s.is_tls());
    s.quit().await?;

    let mut no_db = opts(p);
    no_db.database = None;
    let mut s = Session::connect(&no_db).await?;
    assert_eq!(scalar(&mut s, "SELECT DATABASE()").await, "NULL");
    assert_eq!(
        scalar(&mut s, "SELECT CURRENT_USER()").await,
        format!("{}@127.0.0.1", p.user())
    );
    Ok(())
}

#[tokio::test]
async fn wrong_password_is_a_server_error() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut o = opts(sandbox.primary());
    o.password = "not-the-password".into();
    match Session::connect(&o).await {
        Err(Error::Server(e)) => {
            assert_eq!(e.code, 1045, "{e}");
            assert_eq!(e.state, "28000");
        }
        other => panic!("expected access denied, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn connect_timeout_against_a_silent_listener() -> anyhow::Result<()> {
    // A listener that accepts and never greets.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let mut o = Opts::new("127.0.0.1", port, "u", "p");
    o.connect_timeout = std::time::Duration::from_millis(300);
    let started = std::time::Instant::now();
    match Session::connect(&o).await {
        Err(Error::ConnectTimeout(_)) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    Ok(())
}

fn tls(mode: SslMode, ca: Option<&std::path::Path>, name: Option<&str>) -> TlsOpts {
    TlsOpts {
        mode,
        ca_file: ca.map(Into::into),
        server_name: name.map(Into::into),
    }
}

async fn cipher(s: &mut Session) -> String {
    let r = common::query(s, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").await;
    match &r.results[0].rows[0][1] {
        osprey_wire::Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        v => panic!("{v:?}"),
    }
}

#[tokio::test]
async fn tls_modes_against_a_server_with_tls() -> anyhow::Result<()> {
    let pki = Pki::new("wire-test-ca")?;
    let other = Pki::new("other-ca")?;
    let sandbox = Sandbox::builder().tls(&pki.cert, &pki.key, &pki.ca).start().await?;
    let p = sandbox.primary();

    for mode in [SslMode::Preferred, SslMode::Required] {
        // No CA needed: these modes do not check the certificate.
        let mut s = Session::connect(&opts(p).tls(tls(mode, Some(other.ca()), None))).await?;
        assert!(s.is_tls(), "{mode:?}");
        assert!(!cipher(&mut s).await.is_empty(), "{mode:?}");
    }
    let mut s = Session::connect(&opts(p).tls(tls(SslMode::VerifyCa, Some(pki.ca()), None))).await?;
    assert!(!cipher(&mut s).await.is_empty());
    // Prepared statements and a larger result over TLS.
    let stmt = s.prepare("SELECT REPEAT('x', ?)").await?;
    s.send_execute(&stmt, &[osprey_wire::Value::Int(300_000)])?;
    let r = common::read_response(&mut s).await?;
    assert_eq!(r.results[0].rows[0][0], osprey_wire::Value::Bytes(vec![b'x'; 300_000]));

    // Pipelined over TLS, with a response far over one TLS record.
    for i in 0..20 {
        s.send_query(&format!("SELECT {i}, REPEAT('t', 100000)"))?;
    }
    for i in 0..20 {
        let r = common::read_response(&mut s).await?;
        assert_eq!(
            r.results[0].rows[0][0],
            osprey_wire::Value::Bytes(i.to_string().into_bytes())
        );
    }

    // The certificate names localhost and 127.0.0.1.
    let mut s = Session::connect(&opts(p).tls(tls(SslMode::VerifyIdentity, Some(pki.ca()), None))).await?;
    assert!(!cipher(&mut s).await.is_empty());
    let s = Session::connect(&opts(p).tls(tls(SslMode::VerifyIdentity, Some(pki.ca()), Some("localhost")))).await?;
    assert!(s.is_tls());
    // A name the certificate lacks fails identity, not CA.
    match Session::connect(&opts(p).tls(tls(SslMode::VerifyIdentity, Some(pki.ca()), Some("db.example")))).await {
        Err(Error::Tls(e)) => assert!(e.contains("not valid for") || e.contains("NotValidForName"), "{e}"),
        other => panic!("expected a name mismatch, got {other:?}"),
    }
    let mut s = Session::connect(&opts(p).tls(tls(SslMode::VerifyCa, Some(pki.ca()), Some("db.example")))).await?;
    assert!(!cipher(&mut s).await.is_empty());
    // Another CA's certificate is refused by both verifying modes.
    for mode in [SslMode::VerifyCa, SslMode::VerifyIdentity] {
        match Session::connect(&opts(p).tls(tls(mode, Some(other.ca()), None))).await {
            Err(Error::Tls(_)) => {}
            other => panic!("{mode:?}: expected a certificate error, got {other:?}"),
        }
    }
    Ok(())
}

#[tokio::test]
async fn tls_preferred_falls_back_required_fails_without_server_tls() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut s = Session::connect(&opts(p).tls(tls(SslMode::Preferred, None, None))).await?;
    assert!(!s.is_tls());
    assert_eq!(cipher(&mut s).await, "");
    for mode in [SslMode::Required, SslMode::VerifyCa, SslMode::VerifyIdentity] {
        match Session::connect(&opts(p).tls(tls(mode, None, None))).await {
            Err(Error::Tls(e)) => assert!(e.contains("offers no TLS"), "{e}"),
            other => panic!("{mode:?}: expected no TLS, got {other:?}"),
        }
    }
    Ok(())
}
