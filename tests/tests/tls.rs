//! TLS against real processes, with certificates made in the test (rcgen, ECDSA P-256):
//! the client listener (SDK and raw sockets, client certificates, SIGHUP reload) and
//! workers to a sandbox MariaDB started with a certificate.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use nix::sys::signal::Signal;
use osprey_client::{Client, ClientConfig, ErrorCode, TlsConfig};
use osprey_protocol::{ErrorBody, Frame, FrameCodec, Hello, Kind, Role};
use osprey_sandbox::Sandbox;
use osprey_tests::harness::{bin_dir, wait_for, Dispatcher};
use osprey_tests::pki::{Leaf, TestCa};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, FramedWrite};

fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// `[listen.tls]` for `leaf`, plus `extra` keys inside that section.
fn listen_tls(leaf: &Leaf, extra: &str) -> String {
    format!(
        "[pool]\nsize = 1\n\n[listen.tls]\ncert_file = {}\nkey_file = {}\n{extra}",
        toml_path(&leaf.cert_file),
        toml_path(&leaf.key_file)
    )
}

fn tls_config(d: &Dispatcher, tls: TlsConfig) -> ClientConfig {
    let mut cfg = d.client_config();
    cfg.tls = Some(tls);
    cfg.connect_timeout = Duration::from_secs(5);
    cfg
}

fn trusting(ca: &TestCa) -> TlsConfig {
    TlsConfig {
        ca_file: Some(ca.cert_file.clone()),
        ..Default::default()
    }
}

async fn select_one(client: &Client) -> anyhow::Result<i64> {
    let r = client.query("SELECT 1", &[]).await?;
    Ok(r.rows()[0].get::<i64>(0)?)
}

async fn connect_err(cfg: ClientConfig) -> osprey_client::Error {
    match Client::connect(cfg).await {
        Ok(_) => panic!("connect unexpectedly succeeded"),
        Err(e) => e,
    }
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_serves_tls_and_refuses_plaintext_and_wrong_ca() -> anyhow::Result<()> {
    let ca = TestCa::new("osprey-test")?;
    let other_ca = TestCa::new("other")?;
    let leaf = ca.server("server", &["localhost", "127.0.0.1"])?;
    let sandbox = Sandbox::start(0).await?;
    let overrides = format!("{}\n[timeouts]\nhandshake_timeout_ms = 1000\n", listen_tls(&leaf, ""));
    let d = Dispatcher::start(sandbox.primary(), &overrides).await?;

    // End to end: the certificate is checked against the host of the address (an IP here).
    let client = Client::connect(tls_config(&d, trusting(&ca))).await?;
    assert_eq!(select_one(&client).await?, 1);
    // A name given explicitly is checked instead.
    let mut by_name = trusting(&ca);
    by_name.server_name = Some("localhost".into());
    assert_eq!(select_one(&Client::connect(tls_config(&d, by_name)).await?).await?, 1);

    // The SDK in plaintext on the TLS port: the dispatcher's plain ERROR frame says why.
    let e = connect_err(d.client_config()).await;
    assert_eq!(e.code(), ErrorCode::ProtocolViolation, "{e}");
    assert!(e.message().contains("requires TLS"), "{e}");

    // A raw plaintext HELLO: an ERROR frame it can read, then a prompt close.
    let started = Instant::now();
    let sock = TcpStream::connect(d.client_addr).await?;
    let (r, w) = sock.into_split();
    let mut writer = FramedWrite::new(w, FrameCodec::default());
    let mut reader = FramedRead::new(r, FrameCodec::default());
    let hello = Hello {
        version_major: 1,
        version_minor: 1,
        role: Role::Client,
        token: Some(d.client_token.clone()),
        secret: None,
        slot: None,
        pid: None,
        name: Some("raw-plaintext".into()),
        stream_window: None,
    };
    writer.send(Frame::new(Kind::Hello, 0, &hello)).await?;
    let frame = tokio::time::timeout(Duration::from_secs(5), reader.next())
        .await?
        .expect("an ERROR frame")?;
    assert_eq!(frame.kind, Kind::Error);
    let body: ErrorBody = frame.body()?;
    assert_eq!(body.code, ErrorCode::ProtocolViolation);
    assert!(body.message.contains("requires TLS"), "{}", body.message);
    let end = tokio::time::timeout(Duration::from_secs(5), reader.next()).await?;
    assert!(end.is_none(), "the dispatcher closes after the ERROR");
    assert!(started.elapsed() < Duration::from_secs(3), "closed promptly");

    // A CA that did not sign the dispatcher's certificate: a clear SDK error.
    let e = connect_err(tls_config(&d, trusting(&other_ca))).await;
    assert_eq!(e.code(), ErrorCode::ConnectFailed, "{e}");
    assert!(e.message().contains("not signed by a CA this client trusts"), "{e}");
    // A name the certificate does not carry.
    let mut wrong_name = trusting(&ca);
    wrong_name.server_name = Some("db.example".into());
    let e = connect_err(tls_config(&d, wrong_name)).await;
    assert!(e.message().contains("certificate is for another name"), "{e}");

    // A connection that starts no TLS handshake (silent, or a ClientHello cut short) is
    // closed after handshake_timeout_ms.
    for first in [&b""[..], &[0x16, 0x03][..]] {
        let started = Instant::now();
        let mut sock = TcpStream::connect(d.client_addr).await?;
        tokio::io::AsyncWriteExt::write_all(&mut sock, first).await?;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read(&mut sock, &mut buf),
        )
        .await?
        .unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }

    // The refusals are counted by reason (and logged).
    let m = d.metrics().await?;
    assert_eq!(
        metric(&m, "osprey_client_tls_refused_total{reason=\"plaintext\"}"),
        2,
        "{m}"
    );
    assert!(
        metric(&m, "osprey_client_tls_refused_total{reason=\"handshake\"}") >= 2,
        "{m}"
    );
    assert_eq!(
        metric(&m, "osprey_client_tls_refused_total{reason=\"timeout\"}"),
        2,
        "{m}"
    );

    // The CLI: TLS from flags or the environment, and a clear error without it. (A
    // blocking child process is fine here: the dispatcher is another process.)
    let (addr, token) = (d.client_addr.to_string(), d.client_token.clone());
    let cli = |flags: &[&str], env: Option<(&str, &str)>| {
        let mut cmd = std::process::Command::new(bin_dir().join("osprey"));
        cmd.args(["--addr", &addr, "--token", &token])
            .args(flags)
            .args(["sql", "SELECT 40 + 2 AS answer"])
            .env_remove("OSPREY_TLS_CA");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run osprey");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let ca_path = ca.cert_file.display().to_string();
    let (code, out) = cli(&["--tls-ca", &ca_path], None);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("42"), "{out}");
    let (code, out) = cli(&[], Some(("OSPREY_TLS_CA", &ca_path)));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("42"), "{out}");
    let (code, out) = cli(&[], None);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("requires TLS"), "{out}");

    // The connection that was up all along still works.
    assert_eq!(select_one(&client).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_on_a_plain_port_gets_a_clear_error() -> anyhow::Result<()> {
    let ca = TestCa::new("osprey-test")?;
    let sandbox = Sandbox::start(0).await?;
    let d = Dispatcher::start(sandbox.primary(), "[pool]\nsize = 1\n").await?;
    let e = connect_err(tls_config(&d, trusting(&ca))).await;
    assert_eq!(e.code(), ErrorCode::ConnectFailed, "{e}");
    assert!(e.message().contains("does not speak TLS"), "{e}");
    assert_eq!(select_one(&d.client().await?).await?, 1, "plain clients are served");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_required_or_optional() -> anyhow::Result<()> {
    let ca = TestCa::new("osprey-test")?;
    let clients_ca = TestCa::new("clients")?;
    let stranger_ca = TestCa::new("stranger")?;
    let leaf = ca.server("server", &["127.0.0.1"])?;
    let good = clients_ca.client("app", "app-1")?;
    let stranger = stranger_ca.client("stranger", "app-2")?;
    let with_cert = |leaf: &Leaf| TlsConfig {
        cert_file: Some(leaf.cert_file.clone()),
        key_file: Some(leaf.key_file.clone()),
        ..trusting(&ca)
    };
    let sandbox = Sandbox::start(0).await?;

    let required = listen_tls(
        &leaf,
        &format!("client_ca_file = {}\n", toml_path(&clients_ca.cert_file)),
    );
    let d = Dispatcher::start(sandbox.primary(), &required).await?;
    let e = connect_err(tls_config(&d, trusting(&ca))).await;
    assert_eq!(e.code(), ErrorCode::ConnectFailed, "{e}");
    assert!(
        e.message().contains("refused this client's certificate, or wants one"),
        "{e}"
    );
    let e = connect_err(tls_config(&d, with_cert(&stranger))).await;
    assert!(e.message().contains("refused this client's certificate"), "{e}");
    assert_eq!(
        select_one(&Client::connect(tls_config(&d, with_cert(&good))).await?).await?,
        1
    );
    // The token is still checked on top of the certificate.
    let mut bad_token = tls_config(&d, with_cert(&good));
    bad_token.token = "not-the-token".into();
    assert_eq!(connect_err(bad_token).await.code(), ErrorCode::AuthFailed);
    drop(d);

    let optional = listen_tls(
        &leaf,
        &format!(
            "client_ca_file = {}\nclient_auth = \"optional\"\n",
            toml_path(&clients_ca.cert_file)
        ),
    );
    let d = Dispatcher::start(sandbox.primary(), &optional).await?;
    assert_eq!(
        select_one(&Client::connect(tls_config(&d, trusting(&ca))).await?).await?,
        1
    );
    assert_eq!(
        select_one(&Client::connect(tls_config(&d, with_cert(&good))).await?).await?,
        1
    );
    let e = connect_err(tls_config(&d, with_cert(&stranger))).await;
    assert!(e.message().contains("refused this client's certificate"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_keeps_it_when_the_new_files_are_bad() -> anyhow::Result<()> {
    let ca1 = TestCa::new("first")?;
    let ca2 = TestCa::new("second")?;
    let live = ca1.server("live", &["127.0.0.1"])?;
    let next = ca2.server("next", &["127.0.0.1"])?;
    let sandbox = Sandbox::start(0).await?;
    let d = Dispatcher::start(sandbox.primary(), &listen_tls(&live, "")).await?;
    let before = Client::connect(tls_config(&d, trusting(&ca1))).await?;

    std::fs::copy(&next.cert_file, &live.cert_file)?;
    std::fs::copy(&next.key_file, &live.key_file)?;
    d.signal(Signal::SIGHUP);
    wait_for(
        Duration::from_secs(10),
        "the new certificate on new connections",
        || async { Client::connect(tls_config(&d, trusting(&ca2))).await.ok() },
    )
    .await?;
    let e = connect_err(tls_config(&d, trusting(&ca1))).await;
    assert!(e.message().contains("not signed by a CA this client trusts"), "{e}");
    assert_eq!(select_one(&before).await?, 1, "an open connection keeps its session");

    // A broken key on the next reload is refused and the certificate in use stays. The
    // pool size changes in the same reload, so that its effect shows the reload ran.
    std::fs::write(
        &live.key_file,
        "-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n",
    )?;
    let config = std::fs::read_to_string(&d.config_path)?.replace("size = 1", "size = 2");
    std::fs::write(&d.config_path, config)?;
    d.signal(Signal::SIGHUP);
    d.wait_idle(2, Duration::from_secs(20)).await?;
    let after = Client::connect(tls_config(&d, trusting(&ca2))).await?;
    assert_eq!(select_one(&after).await?, 1);
    // A key that does not belong to the certificate is refused as well.
    std::fs::copy(&ca1.server("stray", &["127.0.0.1"])?.key_file, &live.key_file)?;
    let config = std::fs::read_to_string(&d.config_path)?.replace("size = 2", "size = 1");
    std::fs::write(&d.config_path, config)?;
    d.signal(Signal::SIGHUP);
    d.wait_idle(1, Duration::from_secs(20)).await?;
    assert_eq!(
        select_one(&Client::connect(tls_config(&d, trusting(&ca2))).await?).await?,
        1
    );
    Ok(())
}

/// A sandbox MariaDB with a certificate for `names`, signed by `ca`.
async fn tls_sandbox(ca: &TestCa, names: &[&str]) -> anyhow::Result<Sandbox> {
    let leaf = ca.server("mariadb", names)?;
    Ok(Sandbox::builder()
        .tls(&leaf.cert_file, &leaf.key_file, &ca.cert_file)
        .start()
        .await?)
}

fn backend_tls(mode: &str, ca: Option<&TestCa>, extra: &str) -> String {
    let ca = ca
        .map(|c| format!("ssl_ca = {}\n", toml_path(&c.cert_file)))
        .unwrap_or_default();
    format!("[pool]\nsize = 1\n\n[backend]\nssl_mode = \"{mode}\"\n{ca}{extra}")
}

async fn ssl_cipher(client: &Client) -> anyhow::Result<String> {
    let r = client.query("SHOW SESSION STATUS LIKE 'Ssl_cipher'", &[]).await?;
    Ok(r.rows()[0].get::<String>(1)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_reach_mariadb_over_tls_in_every_mode() -> anyhow::Result<()> {
    let ca = TestCa::new("db")?;
    let other_ca = TestCa::new("not-the-db")?;
    // Valid for db.internal only, not for 127.0.0.1, the address the workers use.
    let sandbox = tls_sandbox(&ca, &["db.internal"]).await?;
    let db = sandbox.primary();
    let named = "ssl_server_name = \"db.internal\"\n";

    let d = Dispatcher::start(db, &backend_tls("verify_identity", Some(&ca), named)).await?;
    let client = d.client().await?;
    let cipher = ssl_cipher(&client).await?;
    assert!(!cipher.is_empty(), "the worker's session is encrypted");
    // A cancel's KILL QUERY goes over a side connection with the same options: the
    // worker survives it (a failed KILL would cost the process after cancel_grace_ms).
    let pids = d.worker_pids().await?;
    let mut stream = client.stream(osprey_client::Request::sql("SELECT SLEEP(30)"));
    let first = tokio::spawn(async move {
        let r = stream.next_row().await;
        (stream, r.is_none())
    });
    wait_for(Duration::from_secs(10), "the sleep to run", || async {
        (d.status().await.ok()?["pool"]["busy"].as_u64() == Some(1)).then_some(())
    })
    .await?;
    first.abort();
    let started = Instant::now();
    d.wait_idle(1, Duration::from_secs(10)).await?;
    assert!(started.elapsed() < Duration::from_secs(5), "cancelled, not timed out");
    assert_eq!(d.worker_pids().await?, pids, "the worker was not killed");
    assert!(
        !ssl_cipher(&client).await?.is_empty(),
        "the worker kept its TLS session"
    );
    drop(d);

    for mode in ["required", "preferred"] {
        let d = Dispatcher::start(db, &backend_tls(mode, None, "")).await?;
        assert!(!ssl_cipher(&d.client().await?).await?.is_empty(), "{mode}: encrypted");
    }

    // verify_ca checks the chain, not the name: the host, 127.0.0.1, is not in the
    // certificate. (This needs the vendored mysql_async fix, see vendor/README.md.)
    let d = Dispatcher::start(db, &backend_tls("verify_ca", Some(&ca), "")).await?;
    assert!(!ssl_cipher(&d.client().await?).await?.is_empty());
    drop(d);

    // Refused: the host's name under verify_identity (not in the certificate), another
    // name, and another CA under verify_ca.
    for overrides in [
        backend_tls("verify_identity", Some(&ca), ""),
        backend_tls("verify_identity", Some(&ca), "ssl_server_name = \"db.example\"\n"),
        backend_tls("verify_ca", Some(&other_ca), ""),
    ] {
        let overrides = overrides.replace("size = 1\n", "size = 1\nqueue_timeout_ms = 500\n");
        let config = Dispatcher::config_for(db, &overrides);
        let d = Dispatcher::spawn_with(config)?;
        wait_for(Duration::from_secs(30), "the dispatcher's admin API", || async {
            d.status().await.ok()
        })
        .await?;
        let client = d.client().await?;
        let e = client.query("SELECT 1", &[]).await.expect_err("no worker can connect");
        assert!(!e.dispatched(), "{e}");
        let status = d.status().await?;
        assert_eq!(status["pool"]["idle"].as_u64(), Some(0), "{overrides}: {status}");
        assert!(status["pool"]["slots"].as_u64() >= Some(1));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_falls_back_to_plain_when_the_database_has_no_tls() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let d = Dispatcher::start(sandbox.primary(), &backend_tls("preferred", None, "")).await?;
    assert_eq!(ssl_cipher(&d.client().await?).await?, "", "plain TCP");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_with_a_bad_certificate_does_not_start() -> anyhow::Result<()> {
    let ca = TestCa::new("osprey-test")?;
    let leaf = ca.server("server", &["127.0.0.1"])?;
    std::fs::write(&leaf.cert_file, "not a certificate")?;
    let sandbox = Sandbox::start(0).await?;
    let config = Dispatcher::config_for(sandbox.primary(), &listen_tls(&leaf, ""));
    let mut d = Dispatcher::spawn_with(config)?;
    let code = d.wait_exit(Duration::from_secs(20)).await?;
    assert_ne!(code, Some(0), "refused to start");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_downtime_restart_on_a_tls_port() -> anyhow::Result<()> {
    let ca = TestCa::new("osprey-test")?;
    let leaf = ca.server("server", &["127.0.0.1"])?;
    let sandbox = Sandbox::start(0).await?;
    let mut old = Dispatcher::start(sandbox.primary(), &listen_tls(&leaf, "")).await?;
    let client = Client::connect(tls_config(&old, trusting(&ca))).await?;
    assert_eq!(select_one(&client).await?, 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let (mut ok, mut errors) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match select_one(&client).await {
                    Ok(_) => ok += 1,
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (ok, errors)
        }
    });
    let new = old.start_beside().await?;
    old.signal(Signal::SIGTERM);
    assert_eq!(old.wait_exit(Duration::from_secs(20)).await?, Some(0));
    wait_for(Duration::from_secs(10), "requests on the new dispatcher", || async {
        let s = new.status().await.ok()?;
        (s["streams"]["opened"].as_u64()? > 0).then_some(())
    })
    .await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, errors) = load.await?;
    assert!(
        errors.is_empty(),
        "{} errors across the switch: {errors:?}",
        errors.len()
    );
    assert!(ok > 0);
    assert!(client.stats().reconnects >= 1, "the client moved over TLS");
    Ok(())
}
