//! The `osprey` binary against a fake dispatcher and a fake admin HTTP server.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::thread;

use osprey_protocol::{End, ErrorCode, Origin, Value};
use support::*;

const ADMIN_TOKEN: &str = "admin-secret";

fn osprey(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_osprey"));
    cmd.args(args)
        .env_remove("OSPREY_ADDR")
        .env_remove("OSPREY_TOKEN")
        .env_remove("OSPREY_ADMIN")
        .env_remove("OSPREY_ADMIN_TOKEN")
        .env("OSPREY_RUNTIME_DIR", "/nonexistent/osprey-test");
    cmd
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Serves `n` HTTP requests; each answer is chosen by `respond(method, path, body)`.
fn fake_admin(n: usize, respond: fn(&str, &str, &str) -> (u16, String)) -> (String, thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..n {
            let (sock, _) = l.accept().unwrap();
            let mut r = BufReader::new(sock.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap().to_owned(), parts.next().unwrap().to_owned());
            let (mut len, mut auth) = (0usize, String::new());
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                if h.trim().is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap(),
                    "authorization" => auth = v.trim().to_owned(),
                    _ => {}
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let body = String::from_utf8(body).unwrap();
            let (code, out) = if auth != format!("Bearer {ADMIN_TOKEN}") {
                (401, "{\"error\":\"bad token\"}".to_owned())
            } else {
                respond(&method, &path, &body)
            };
            seen.push(format!("{method} {path} {body}"));
            let mut w = sock;
            write!(w, "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}", out.len()).unwrap();
        }
        seen
    });
    (addr, h)
}

/// A `/status` body as the dispatcher writes it (`osprey_admin_api::Status`: the CLI reads
/// it with that type and refuses a body without one of its fields).
const STATUS: &str = r#"{"version":"0.1.0","pid":123,"uptime_s":12.5,"draining":false,
 "pool":{"role":"write","cluster":"c1","member":"primary","hold":null,"unavailable":null,
         "size":4,"slots":4,"idle":3,"busy":1,"starting":0,"quitting":0,"queue_depth":0,"queue_capacity":1024,
         "queue_bytes":0,"queue_bytes_capacity":67108864,"waiting_connections":0,"capped_connections":0,
         "longest_connection_queue":0,"longest_wait_ms":0,"max_per_connection":1,"respawns":0,"recycles":0,"fatal_exits":0},
 "slots":[{"slot":0,"pid":4242,"state":"idle","requests":10,"age_s":3.2,"backend":"primary","cluster":"c1",
           "db_connection_id":17,"retiring":false,"pipeline":0},
          {"slot":1,"pid":null,"state":"starting","requests":0,"age_s":0.1,"backend":"primary","cluster":"c1",
           "db_connection_id":null,"retiring":false,"pipeline":0}],
 "groups":[],"clusters":[],
 "clients":{"connections":1,"open_streams":0},
 "streams":{"opened":10,"closed":10},
 "fds":{"limit":1024,"reserve":100,"max_client_connections":924,"open":null,"admin_connections":1}}"#;

#[test]
fn status_and_pool_resize() {
    let (admin, h) = fake_admin(4, |method, path, body| match (method, path) {
        ("GET", "/status") => (200, STATUS.to_owned()),
        ("POST", "/pool/size") => {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            if v["size"] == 0 {
                (400, "{\"error\":\"size must be at least 1\"}".into())
            } else {
                (200, format!("{{\"size\":{}}}", v["size"]))
            }
        }
        _ => (404, "{}".into()),
    });
    let o = osprey(&["--admin", &admin, "--admin-token", ADMIN_TOKEN, "status"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("pool: size 4 | idle 3 | busy 1"), "{out}");
    assert!(out.contains("4242") && out.contains("starting"), "{out}");

    let o = osprey(&["--admin", &admin, "pool", "resize", "6"])
        .env("OSPREY_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(text(&o).0, "pool size: 6\n");

    let o = osprey(&["--admin", &admin, "--admin-token", ADMIN_TOKEN, "pool", "resize", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("size must be at least 1"));

    let o = osprey(&["--admin", &admin, "--admin-token", "wrong", "status"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("401"));
    let seen = h.join().unwrap();
    assert_eq!(seen[1], "POST /pool/size {\"size\":6}");
}

#[test]
fn missing_credentials_are_explained() {
    let o = osprey(&["--addr", "127.0.0.1:1", "sql", "SELECT 1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("credentials"), "{}", text(&o).1);
}

#[tokio::test]
async fn sql_prints_table_json_and_errors() {
    let mut server = FakeServer::start(Settings::default()).await;
    let addr = server.addr.clone();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            osprey(&args).output().unwrap()
        })
    };
    let base = |extra: &[&str]| {
        let mut v = vec![
            "--addr".to_string(),
            addr.clone(),
            "--token".into(),
            TOKEN.into(),
            "sql".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };

    let p = run(base(&["SELECT id, name, raw FROM t WHERE id > ?", "--param", "int:0"]));
    let mut conn = server.accept().await;
    let (s, req) = conn.request().await;
    assert_eq!(req.params, vec![Value::Int(0)]);
    conn.columns(s, &["id", "name", "raw"]).await;
    conn.rows(
        s,
        vec![
            vec![
                Value::Int(1),
                Value::Text("alice".into()),
                Value::Bytes(vec![0xff, 0x01]),
            ],
            vec![Value::Int(22), Value::Null, Value::Bytes(b"ok".to_vec())],
        ],
    )
    .await;
    conn.end(
        s,
        End {
            rows: 2,
            ..Default::default()
        },
    )
    .await;
    let o = p.await.unwrap();
    let (out, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert_eq!(
        out,
        "id | name  | raw\n---+-------+-------\n1  | alice | 0xFF01\n22 | NULL  | ok\n2 rows\n"
    );

    let p = run(base(&["SELECT id FROM t", "--json"]));
    let mut conn = server.accept().await;
    let (s, _) = conn.request().await;
    conn.answer(s, "id", vec![vec![Value::Int(1)], vec![Value::Int(2)]])
        .await;
    let (out, _) = text(&p.await.unwrap());
    assert_eq!(out, "{\"id\":1}\n{\"id\":2}\n");

    let p = run(base(&["DELETE FROM t"]));
    let mut conn = server.accept().await;
    let (s, _) = conn.request().await;
    conn.end(
        s,
        End {
            affected_rows: 5,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(text(&p.await.unwrap()).0, "affected rows: 5\n");

    // A write's GTID (protocol 1.3), in text and JSON.
    for (json, expected) in [
        (false, "affected rows: 1\ngtid: 0-1-9\n"),
        (
            true,
            "{\"affected_rows\":1,\"gtid\":\"0-1-9\",\"last_insert_id\":null,\"warnings\":0}\n",
        ),
    ] {
        let mut args = vec!["DELETE FROM t WHERE id = 1"];
        if json {
            args.push("--json");
        }
        let p = run(base(&args));
        let mut conn = server.accept().await;
        let (s, _) = conn.request().await;
        conn.end(
            s,
            End {
                affected_rows: 1,
                gtid: Some("0-1-9".into()),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(text(&p.await.unwrap()).0, expected);
    }

    let p = run(base(&["SELEC 1"]));
    let mut conn = server.accept().await;
    let (s, _) = conn.request().await;
    let mut body = err(ErrorCode::Database, true);
    body.origin = Origin::Database;
    body.errno = Some(1064);
    body.sqlstate = Some("42000".into());
    body.message = "You have an error in your SQL syntax".into();
    conn.error(s, body).await;
    let o = p.await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    let (_, err) = text(&o);
    assert!(
        err.contains("DATABASE_ERROR (origin database, errno 1064, SQLSTATE 42000, dispatched)")
            && err.contains("You have an error"),
        "{err}"
    );
}
