//! The live operations page (issue 24): `GET /ui` in a real headless chromium against a
//! dispatcher on the embedded default (a real MariaDB primary and two replicas), and its
//! Server-Sent Events feed `GET /ui/events` from the Rust side (the token, the admin
//! connection cap).
//!
//! Screenshots of each state go to `target/ui-screenshots/` (a few are copied into
//! `docs/img/` by hand for the docs).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mysql_async::prelude::Queryable;
use nix::sys::signal::Signal;
use osprey_tests::harness::{bin_dir, free_addr, wait_for, Cluster, Dispatcher};
use osprey_tests::webdriver::{find_chromium, Browser};
use serde_json::{json, Value as Json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn screenshots() -> PathBuf {
    bin_dir().parent().map(|t| t.join("ui-screenshots")).unwrap_or_default()
}

/// `shown(id)`: whether the element is laid out (not `display: none`, nor inside such).
const SHOWN: &str =
    "const shown = id => { const e = document.getElementById(id); return !!e && e.getClientRects().length > 0; };";

/// Polls `script` (a function body returning a value, `null` meaning "not yet") in the
/// page until it returns something else, or fails after `limit` saying `what`, with the
/// page's last snapshot summary for the failure message.
/// [`poll`] until an element matching the CSS `selector` is in the page.
async fn appears(b: &Browser, limit: Duration, what: &str, selector: &str) -> anyhow::Result<()> {
    let script = format!("return document.querySelector({}) ? true : null", json!(selector));
    poll(b, limit, what, &script).await.map(drop)
}

async fn poll(b: &Browser, limit: Duration, what: &str, script: &str) -> anyhow::Result<Json> {
    let deadline = Instant::now() + limit;
    let script = format!("{SHOWN} {script}");
    loop {
        let v = b.eval(&script, json!([]))?;
        if !v.is_null() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            let state = b
                .eval(
                    "const s = window.__osprey && window.__osprey.last; \
                     return s ? JSON.stringify({clusters: s.clusters.map(c => ({primary: c.primary, status: c.status, \
                     members: c.members.map(m => [m.name, m.role]), health: c.health.map(h => [h.member, h.state])})), \
                     delay: s.delay, events: s.events.map(e => [e.kind, e.new_primary])}) : 'no snapshot'",
                    json!([]),
                )
                .unwrap_or_default();
            bail!("timed out after {limit:?} waiting in the page for {what}; last snapshot: {state}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether nothing on the page is wider than the screen.
fn fits(b: &Browser) -> anyhow::Result<(bool, Json)> {
    let v = b.eval(
        "const e = document.scrollingElement; \
         return [e.scrollWidth, window.innerWidth, [...document.querySelectorAll('.panel')] \
           .filter(p => p.getBoundingClientRect().right > window.innerWidth + 0.5).map(p => p.id)];",
        json!([]),
    )?;
    let ok = v[0].as_f64() <= v[1].as_f64() && v[2].as_array().is_some_and(|a| a.is_empty());
    Ok((ok, v))
}

/// `name pid port datadir` lines of the embedded sandbox (`<runtime dir>/sandbox`).
fn sandbox_member(d: &Dispatcher, name: &str) -> anyhow::Result<(u32, u16)> {
    let text = std::fs::read_to_string(d.runtime_dir.path().join("sandbox"))?;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&name) && f.len() >= 3 {
            return Ok((f[1].parse()?, f[2].parse()?));
        }
    }
    bail!("{name} not in the sandbox file:\n{text}")
}

async fn admin_sql(port: u16, sql: &str) -> anyhow::Result<()> {
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port)
        .prefer_socket(false)
        .user(Some(osprey_sandbox::ADMIN_USER))
        .pass(Some(osprey_sandbox::ADMIN_PASSWORD));
    let mut conn = mysql_async::Conn::new(opts).await?;
    conn.query_drop(sql).await?;
    conn.disconnect().await?;
    Ok(())
}

/// The page against the embedded default, in one sandbox: refused without the token;
/// the primary and two replicas; no panel wider than a 1366×768 or a 390×844 screen; the
/// Unblock button; a replica whose SQL thread stopped shows its delay growing and its
/// read slots leaving; kill -9 of the primary shows it down, the failover in the
/// timeline and the new primary, with no reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_page_in_a_real_browser() -> anyhow::Result<()> {
    let Some((chromium, chromedriver)) = find_chromium() else {
        if std::env::var_os("CI").is_some() {
            bail!("chromium and chromedriver are required in CI (scripts/test.sh installs them)");
        }
        eprintln!(
            "SKIPPED operations_page_in_a_real_browser: no chromium/chromedriver \
             (apt-get install chromium chromium-driver, or run scripts/test.sh)"
        );
        return Ok(());
    };
    let shots = screenshots();
    let started = Instant::now();
    let config: toml::Table = format!(
        "[listen]\nclient = \"{}\"\nadmin = \"{}\"\n[auth]\nclient_tokens = [\"t\"]\nadmin_token = \"ui-admin-token\"\n",
        free_addr(),
        free_addr()
    )
    .parse()?;
    let mut d = Dispatcher::spawn_with(config)?;
    d.wait_idle(4, Duration::from_secs(60)).await?;
    let client = d.client().await?;
    // Some traffic for the charts: a write and reads, a few a second, all along.
    client
        .query(
            "CREATE TABLE IF NOT EXISTS ui_t (id INT PRIMARY KEY AUTO_INCREMENT, v INT)",
            &[],
        )
        .await?;
    let load = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 0i64.. {
                let _ = client.query("INSERT INTO ui_t (v) VALUES (?)", &[i.into()]).await;
                let _ = client.query("SELECT COUNT(*) FROM ui_t", &[]).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let b = Browser::start(&chromium, &chromedriver, 1366, 768)?;
    let ui = format!("http://{}/ui", d.admin_addr);

    // Without the token: the login form and nothing else; a wrong token is refused.
    b.goto(&ui)?;
    poll(
        &b,
        Duration::from_secs(10),
        "the login form",
        "return shown('login') && !shown('app') ? true : null",
    )
    .await?;
    let members = b.eval("return document.querySelectorAll('g.member').length", json!([]))?;
    assert_eq!(members, 0, "no topology without the token");
    b.type_into("#token", "not-the-token")?;
    b.click("#login-submit")?;
    poll(
        &b,
        Duration::from_secs(10),
        "the wrong token refused",
        "const t = document.getElementById('login-error').textContent; return t.includes('refused') ? t : null",
    )
    .await?;
    assert_eq!(b.eval(&format!("{SHOWN} return shown('app')"), json!([]))?, false);
    assert_eq!(
        b.eval("return sessionStorage.getItem('osprey.admin_token')", json!([]))?,
        Json::Null
    );
    b.screenshot(&shots.join("login.png"))?;

    // With it: the primary and two replicas.
    b.type_into("#token", &d.admin_token)?;
    b.click("#login-submit")?;
    poll(
        &b,
        Duration::from_secs(15),
        "the primary and two replicas",
        "const m = [...document.querySelectorAll('g.member')].map(g => [g.dataset.member, g.dataset.role, g.dataset.state]); \
         const p = m.filter(x => x[1] === 'primary' && x[2] === 'primary'), r = m.filter(x => x[1] === 'replica' && x[2] === 'replica'); \
         return p.length === 1 && r.length === 2 && m.length === 3 ? m : null",
    )
    .await?;
    assert_eq!(b.eval(&format!("{SHOWN} return shown('login')"), json!([]))?, false);
    let loaded_at = b.eval("return window.__osprey.loadedAt", json!([]))?;
    // The charts need two snapshots for a rate.
    poll(
        &b,
        Duration::from_secs(10),
        "a traffic rate",
        "return window.__osprey.history.length >= 2 ? true : null",
    )
    .await?;
    // Traffic by member and role: the writes went to the primary's write slots, the
    // reads to the replicas' read slots (the read split), each with a rate.
    let by_member = poll(
        &b,
        Duration::from_secs(10),
        "traffic by member and role",
        "const r = [...document.querySelectorAll('#traffic-groups tr[data-traffic]')]            .map(t => [t.dataset.traffic, Number(t.querySelector('[data-figure=rps]').textContent)]);          const w = r.filter(x => x[0].endsWith('/write/primary') && x[1] > 0), rd = r.filter(x => x[0].includes('/read/replica-') && x[1] > 0);          return w.length === 1 && rd.length >= 1 ? r : null",
    )
    .await?;
    println!("traffic by member: {by_member}");
    assert_eq!(
        b.eval(
            "return document.querySelectorAll('#groups td[data-figure=pipelined]').length > 0",
            json!([])
        )?,
        true,
        "the pool panel shows each group's pipelined requests"
    );
    b.screenshot(&shots.join("overview.png"))?;

    // No panel wider than a laptop or a phone screen.
    let (ok, v) = fits(&b)?;
    assert!(ok, "at 1366×768 something is wider than the screen: {v}");
    b.viewport(390, 844)?;
    poll(
        &b,
        Duration::from_secs(5),
        "a render at phone width",
        "return window.innerWidth <= 400 ? true : null",
    )
    .await?;
    let seen = b.eval("return window.__osprey.snapshots", json!([]))?;
    poll(
        &b,
        Duration::from_secs(5),
        "a snapshot at phone width",
        &format!("return window.__osprey.snapshots > {seen} ? true : null"),
    )
    .await?;
    let (ok, v) = fits(&b)?;
    assert!(ok, "at 390×844 something is wider than the screen: {v}");
    b.screenshot(&shots.join("phone.png"))?;
    b.viewport(1366, 768)?;

    // A blocked digest, unblocked with its button (behind a confirm()).
    let (code, body) = d
        .admin_post("/digests/block", json!({"sql": "SELECT 42 AS ui_blocked"}))
        .await?;
    assert_eq!(code, 200, "{body}");
    let id = serde_json::from_str::<Json>(&body)?["id"]
        .as_str()
        .context("digest id")?
        .to_owned();
    let row = format!("tr[data-digest='{id}']");
    appears(&b, Duration::from_secs(5), "the blocked digest's row", &row).await?;
    b.eval(
        &format!("document.querySelector(\"{row}\").scrollIntoView()"),
        json!([]),
    )?;
    b.screenshot(&shots.join("blocked.png"))?;
    b.click(&format!("{row} button.unblock"))?;
    let asked = b.accept_prompt(Duration::from_secs(5))?;
    assert!(asked.contains(&id), "the confirm() names the digest: {asked}");
    wait_for(
        Duration::from_secs(5),
        "the digest unblocked through the API",
        || async {
            let v = d.admin_get("/digests/blocked").await.ok()?;
            v["blocked"]
                .as_array()?
                .iter()
                .all(|b| b["id"] != id.as_str())
                .then_some(())
        },
    )
    .await?;
    poll(
        &b,
        Duration::from_secs(5),
        "the row gone",
        &format!("return document.querySelector(\"{row}\") ? null : true"),
    )
    .await?;
    let notice = b.eval("return document.getElementById('notice').textContent", json!([]))?;
    assert!(notice.as_str().is_some_and(|n| n.contains("unblock: done")), "{notice}");

    // A slow execution (the embedded default's threshold is 1 s) shows among the slow
    // log's latest entries, with its text, time and member.
    client.query("SELECT SLEEP(1.1) AS ui_slow", &[]).await?;
    let slow = poll(
        &b,
        Duration::from_secs(10),
        "the slow log's latest entry",
        "const r = [...document.querySelectorAll('#slowlog tr[data-slow]')].find(t => t.textContent.includes('ui_slow')); \
         return r ? r.textContent : null",
    )
    .await?;
    assert!(
        slow.as_str()
            .is_some_and(|t| t.contains("primary") || t.contains("replica")),
        "{slow}"
    );

    // Maintenance on and off for replica-2 with its buttons (each behind a confirm()),
    // which call the ordinary admin route: the cluster view follows.
    let dr = &d;
    let maintenance = |on: bool| async move {
        let v = dr.admin_get("/cluster").await.ok()?;
        let m = v["clusters"][0]["members"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == "replica-2")?
            .clone();
        (m["maintenance"].as_bool() == Some(on)).then_some(())
    };
    for on in [true, false] {
        let button = format!("button[data-action='maintenance'][data-member='replica-2'][data-on='{on}']");
        appears(&b, Duration::from_secs(10), "replica-2's maintenance button", &button).await?;
        b.click(&button)?;
        let asked = b.accept_prompt(Duration::from_secs(5))?;
        assert!(asked.contains("replica-2"), "the confirm() names the member: {asked}");
        wait_for(
            Duration::from_secs(10),
            "replica-2's maintenance through the API",
            || maintenance(on),
        )
        .await?;
    }

    // replica-1 stops applying: its delay grows past the threshold, its read slots leave.
    let (_, r1_port) = sandbox_member(&d, "replica-1")?;
    admin_sql(r1_port, "STOP SLAVE SQL_THREAD").await?;
    let delay_of_r1 = "const t = document.querySelector(\"g.member[data-member='replica-1'] text.delay\"); \
                       return t && t.dataset.delayMs !== '' ? Number(t.dataset.delayMs) : null";
    let first = poll(&b, Duration::from_secs(10), "replica-1's delay", delay_of_r1).await?;
    poll(
        &b,
        Duration::from_secs(15),
        "replica-1 late, its delay grown and its read slots not serving",
        &format!(
            "const g = document.querySelector(\"g.member[data-member='replica-1']\"); \
             const t = g && g.querySelector('text.delay'); \
             const row = document.querySelector(\"tr[data-group='read:replica-1']\"); \
             return g && g.dataset.state === 'late' && Number(t.dataset.delayMs) > Math.max({first}, 1000) \
               && row && row.dataset.serving === 'false' ? [t.dataset.delayMs, row.dataset.serving] : null"
        ),
    )
    .await?;
    b.screenshot(&shots.join("late-replica.png"))?;
    admin_sql(r1_port, "START SLAVE SQL_THREAD").await?;
    poll(
        &b,
        Duration::from_secs(15),
        "replica-1 back in the read pool",
        "const row = document.querySelector(\"tr[data-group='read:replica-1']\"); \
         const g = document.querySelector(\"g.member[data-member='replica-1']\"); \
         return row && row.dataset.serving === 'true' && g.dataset.state === 'replica' ? true : null",
    )
    .await?;

    // kill -9 of the primary: down, the failover in the timeline, the new primary.
    let (primary_pid, _) = sandbox_member(&d, "primary")?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(primary_pid as i32), Signal::SIGKILL)?;
    let killed = Instant::now();
    let new_primary = poll(
        &b,
        Duration::from_secs(20),
        "the primary down, a failover in the timeline and a new primary",
        "const old = document.querySelector(\"g.member[data-member='primary']\"); \
         const ev = document.querySelector(\"li.event[data-kind='failover'][data-ok='true']\"); \
         const c = document.querySelector('.cluster'); \
         const np = c && c.dataset.primary; \
         const n = np && document.querySelector(`g.member[data-member='${np}']`); \
         return old && old.dataset.health === 'down' && ev && ev.dataset.new === np && np !== 'primary' \
           && n && n.dataset.role === 'primary' && ev.querySelectorAll('.step').length > 0 ? np : null",
    )
    .await?;
    println!(
        "the page showed the failover to {new_primary} {} ms after kill -9",
        killed.elapsed().as_millis()
    );
    assert_eq!(
        b.eval("return window.__osprey.loadedAt", json!([]))?,
        loaded_at,
        "the page was not reloaded"
    );
    b.eval("document.getElementById('events').scrollIntoView()", json!([]))?;
    b.screenshot(&shots.join("failover.png"))?;
    b.eval("window.scrollTo(0, 0)", json!([]))?;
    let (ok, v) = fits(&b)?;
    assert!(ok, "after the failover, something is wider than the screen: {v}");

    load.abort();
    drop(b);
    d.signal(Signal::SIGTERM);
    d.wait_exit(Duration::from_secs(30)).await?;
    println!(
        "operations page test: {} ms; screenshots in {}",
        started.elapsed().as_millis(),
        shots.display()
    );
    Ok(())
}

/// Opens `GET /ui/events` on a raw connection; the status line and what came with it.
async fn open_feed(addr: std::net::SocketAddr, token: Option<&str>) -> anyhow::Result<(TcpStream, String)> {
    let mut s = TcpStream::connect(addr).await?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(format!("GET /ui/events HTTP/1.1\r\nHost: osprey\r\n{auth}\r\n").as_bytes())
        .await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await??;
        if n == 0 {
            bail!("closed before a response head: {:?}", String::from_utf8_lossy(&got));
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok((s, String::from_utf8_lossy(&got).into_owned()))
}

/// Reads the feed until `n` more snapshots came (within `limit`); returns the last one.
async fn snapshots(s: &mut TcpStream, seen: &mut String, n: usize, limit: Duration) -> anyhow::Result<Json> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 16384];
    let mut last = Json::Null;
    let mut count = 0;
    loop {
        // One SSE event per chunk: `data: {json}` then a blank line.
        while let Some(start) = seen.find("data: ") {
            let Some(len) = seen[start..].find("\n\n") else { break };
            last = serde_json::from_str(&seen[start + 6..start + len])?;
            *seen = seen[start + len..].to_owned();
            count += 1;
            if count == n {
                return Ok(last);
            }
        }
        let r = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .with_context(|| format!("{count} of {n} snapshots within {limit:?}"))??;
        if r == 0 {
            bail!("feed closed after {count} of {n} snapshots (last: {last})");
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..r]));
    }
}

/// `GET /ui/events` wants the token; `/ui` itself holds no data and needs none. A feed
/// pushes a snapshot at once and then about every second, outlives the admin idle
/// timeout while it is read, and holds a place of `admin.max_connections`; but feeds
/// cannot lock the operator out: with two feeds open and the cap at 2, an operator's
/// request takes the oldest feed's place (the page's EventSource reconnects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_wants_the_token_and_counts_against_the_admin_cap() -> anyhow::Result<()> {
    let c = Cluster::start("[admin]\nmax_connections = 2\nmax_connections_per_address = 2\nidle_timeout_ms = 1500\n")
        .await?;
    let d = &c.dispatcher;
    let addr = d.admin_addr;
    let (mut none, head) = open_feed(addr, None).await?;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    drop(none.shutdown().await);
    let (_, head) = open_feed(addr, Some("wrong")).await?;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    let (mut page, head) = {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET /ui HTTP/1.1\r\nHost: osprey\r\nConnection: close\r\n\r\n")
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        (s, text)
    };
    drop(page.shutdown().await);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-security-policy"), "{head}");
    assert!(head.contains("/ui/app.js"), "the shell names its script: {head}");

    // Only the /status request of this wait is open: the two failed feeds are gone.
    wait_for(Duration::from_secs(5), "the admin connections to close", || async {
        (d.status().await.ok()?["fds"]["admin_connections"] == 1).then_some(())
    })
    .await?;

    let (mut feed1, head) = open_feed(addr, Some(&d.admin_token)).await?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let mut seen1 = head[head.find("\r\n\r\n").unwrap_or(0)..].to_owned();
    let first = snapshots(&mut feed1, &mut seen1, 1, Duration::from_secs(3)).await?;
    for key in [
        "status", "clusters", "delay", "events", "digests", "throttle", "traffic",
    ] {
        assert!(!first[key].is_null(), "snapshot has {key}: {first}");
    }
    assert_eq!(first["status"]["pool"]["size"], 4);
    // Three more over ~3 s: more than twice the 1.5 s idle timeout of this admin port.
    let t = Instant::now();
    let later = snapshots(&mut feed1, &mut seen1, 3, Duration::from_secs(6)).await?;
    assert!(t.elapsed() >= Duration::from_millis(1500), "{:?}", t.elapsed());
    assert!(
        later["traffic"]["rps"].is_number(),
        "a rate from the second snapshot on: {later}"
    );

    let (mut feed2, head) = open_feed(addr, Some(&d.admin_token)).await?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut seen2 = head[head.find("\r\n\r\n").unwrap_or(0)..].to_owned();
    snapshots(&mut feed2, &mut seen2, 1, Duration::from_secs(3)).await?;

    // The cap is full of feeds: an operator's request gets in, in the oldest feed's
    // place (ops are never locked out by open pages).
    let s = d
        .status()
        .await
        .context("osprey status with two feeds open and a cap of 2")?;
    assert_eq!(s["fds"]["admin_connections"], 2, "{}", s["fds"]);
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            match feed1.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the oldest feed was closed to make room");
    snapshots(&mut feed2, &mut seen2, 1, Duration::from_secs(3)).await?;
    let m = d.metrics().await?;
    let evicted: f64 = m
        .lines()
        .find(|l| l.starts_with("osprey_admin_connections_evicted_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .context("osprey_admin_connections_evicted_total")?;
    assert!(evicted >= 1.0, "the feed's eviction was counted");
    drop(feed2);
    Ok(())
}
