//! The `mariadb` command-line client and `mariadb-dump`, through Osprey and straight at
//! the primary, output compared line by line.

use crate::{run, text, Rig};

/// Every statement here runs through the CLI twice (Osprey, then the primary) on the
/// same database; the outputs (results, column metadata, errors) must be the same.
const SCRIPT: &str = r#"
DROP TABLE IF EXISTS cli_types;
CREATE TABLE cli_types (
  id INT PRIMARY KEY AUTO_INCREMENT, ti TINYINT, si SMALLINT UNSIGNED, mi MEDIUMINT,
  bi BIGINT UNSIGNED, f FLOAT, d DOUBLE, de DECIMAL(20,6), dt DATETIME(6), da DATE,
  tm TIME(3), ts TIMESTAMP NULL, y YEAR, c CHAR(5), vc VARCHAR(50), tx TEXT, bl BLOB,
  vb VARBINARY(16), bt BIT(12), e ENUM('a','b'), st SET('x','y'), j JSON
) DEFAULT CHARSET=utf8mb4;
INSERT INTO cli_types VALUES (NULL, -128, 65535, -8388608, 18446744073709551615, 3.1415927,
  1.7976931348623157e308, -12345678901234.123456, '2024-02-29 23:59:59.999999', '0000-00-00',
  '-838:59:59.000', '2038-01-19 03:14:07', 2155, 'ab', 'ünïcödé ✓ 😀', REPEAT('x', 300),
  X'00FF10', X'DEADBEEF', b'101010101010', 'b', 'x,y', '{"a": [1, 2.5, null]}');
INSERT INTO cli_types (id) VALUES (NULL);
INSERT INTO cli_types (f, d, de) VALUES (-0.0, 1e-300, 0.000001);
SELECT * FROM cli_types ORDER BY id;
SELECT 1e20, 0.1 + 0.2, -0.0, 1/3, 'tab	and\nnewline', NULL, X'00', CAST(1 AS UNSIGNED) - 2;
SELECT id, HEX(bl), HEX(bt), LENGTH(vc), CHAR_LENGTH(vc) FROM cli_types ORDER BY id;
INSERT INTO cli_types (id) VALUES (1);
SELEC 1;
SELECT * FROM no_such_table;
SELECT 1; SELECT 2;
SET NAMES utf8mb4 COLLATE utf8mb4_unicode_ci;
SELECT @@collation_connection, 'ß' = 'ss';
SET NAMES utf8mb4;
SET wait_timeout = 28800;
CREATE DATABASE IF NOT EXISTS cli_other;
use cli_other
SELECT DATABASE();
CREATE TABLE IF NOT EXISTS here (a INT);
SHOW TABLES;
DROP DATABASE cli_other;
use osprey
SELECT DATABASE();
SET NAMES latin1;
SELECT @@character_set_client, @@character_set_results, 'é';
SET NAMES utf8mb4;
DELIMITER //
SELECT 1 AS a; SELECT 2 AS b, 'x;y' AS c//
INSERT INTO cli_types (vc) VALUES ('m1'); INSERT INTO cli_types (vc) VALUES ('m2'), ('m3'); SELECT vc FROM cli_types WHERE vc LIKE 'm_' ORDER BY vc//
UPDATE cli_types SET ti = 2 WHERE vc LIKE 'm_'; DELETE FROM cli_types WHERE vc = 'm3'; SELECT COUNT(*) FROM cli_types//
SELECT 1; SELEC 2; SELECT 3//
BEGIN; INSERT INTO cli_types (vc) VALUES ('tx multi'); SELECT COUNT(*) FROM cli_types WHERE vc = 'tx multi'; ROLLBACK//
SELECT COUNT(*) FROM cli_types WHERE vc = 'tx multi'//
DROP PROCEDURE IF EXISTS two_sets//
CREATE PROCEDURE two_sets(IN n INT) BEGIN SELECT n AS first; SELECT n + 1 AS second, 'x' AS third; UPDATE cli_types SET si = n WHERE id = 1; END//
DELIMITER ;
SET sql_mode = 'ANSI_QUOTES', time_zone = '+05:30';
SELECT @@sql_mode, @@time_zone, "quoted" FROM DUAL;
SET sql_mode = DEFAULT;
SET time_zone = 'Mars/Olympus';
BEGIN;
INSERT INTO cli_types (vc) VALUES ('in a transaction');
SELECT COUNT(*) FROM cli_types;
ROLLBACK;
SELECT COUNT(*) FROM cli_types;
SET @a = 41;
SELECT @a + 1;
SET autocommit = 0;
INSERT INTO cli_types (vc) VALUES ('autocommit off');
ROLLBACK;
SELECT COUNT(*) FROM cli_types WHERE vc = 'autocommit off';
SET autocommit = 1;
CREATE TEMPORARY TABLE tmp (a INT);
INSERT INTO tmp VALUES (1), (2);
SELECT SUM(a) FROM tmp;
SELECT SQL_CALC_FOUND_ROWS id FROM cli_types LIMIT 1;
SELECT FOUND_ROWS();
UPDATE cli_types SET ti = 1 WHERE id > 1;
DELETE FROM cli_types WHERE id = 3;
SELECT ROW_COUNT();
CALL two_sets(5);
SELECT si FROM cli_types WHERE id = 1;
DELIMITER //
CALL two_sets(6); SELECT 'after the call' AS c//
DELIMITER ;
DROP PROCEDURE two_sets;
COMMIT;
ROLLBACK;
"#;

fn comparable(out: &str) -> String {
    out.lines()
        // The server's name in its version, the connection id, the port: what differs.
        .filter(|l| !l.starts_with("Catalog:") && !l.starts_with("Database:"))
        .filter(|l| !l.starts_with("Org_table:") && !l.starts_with("Org_field:"))
        // MariaDB's extended metadata (a JSON column's format) needs MariaDB capabilities,
        // which this port does not offer: the plain type is what a MySQL client sees.
        .map(|l| l.replace(" (format=json)", ""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mariadb_client_gets_what_the_database_gives() {
    let rig = Rig::start("").await;
    // Table mode: --column-type-info prints the metadata there only.
    let flags = [
        "--table",
        "--force",
        "--column-type-info",
        "--default-character-set=utf8mb4",
    ];
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    let mut via = args.clone();
    via.extend(rig.osprey_args());
    args.extend(rig.direct_args());
    let osprey = run("mariadb", via, Some(SCRIPT.into())).await;
    let direct = run("mariadb", args, Some(SCRIPT.into())).await;
    let (o, d) = (comparable(&text(&osprey.stdout)), comparable(&text(&direct.stdout)));
    // Errors: the same lines, the same numbers and SQLSTATEs, verbatim.
    let (oe, de) = (text(&osprey.stderr), text(&direct.stderr));
    assert!(de.contains("ERROR 1062 (23000)"), "the script provokes errors: {de}");
    assert_eq!(oe, de, "stderr differs");
    let (ol, dl): (Vec<&str>, Vec<&str>) = (o.lines().collect(), d.lines().collect());
    for (i, (a, b)) in ol.iter().zip(&dl).enumerate() {
        assert_eq!(a, b, "line {i} differs (osprey, then direct)");
    }
    assert_eq!(ol.len(), dl.len(), "as many lines");
    assert!(o.contains("ünïcödé ✓ 😀") && o.contains("18446744073709551615"), "{o}");
    // Multi-statements and a CALL's result sets came through, each apart.
    for seen in ["| x;y |", "| second | third |", "| after the call |", "| m2 "] {
        assert!(o.contains(seen), "{seen} in {o}");
    }
    assert!(oe.contains("ERROR 1064 (42000) at line"), "{oe}");
    // What was pinned and why shows in the metrics.
    let m = rig.cluster.dispatcher.metrics().await.unwrap();
    // The first statement that pins gives the reason; tracked SETs pinned nothing.
    let pinned: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("osprey_mysql_pinned_total"))
        .collect();
    assert_eq!(
        pinned,
        // (sql_mode = 'ANSI_QUOTES' changes how the server quotes: it pins, as "set".)
        vec!["osprey_mysql_pinned_total{reason=\"set\"} 1"],
        "{m}"
    );
    // Tracked SETs did not pin; the transactions' sessions all ended.
    let sessions = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(sessions.as_array().map(Vec::len), Some(0), "{sessions}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_status_and_dump_work_as_against_the_server() {
    let rig = Rig::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        "DROP TABLE IF EXISTS dumped;\nCREATE TABLE dumped (id INT PRIMARY KEY, v VARCHAR(20), b BLOB);\n\
         INSERT INTO dumped VALUES (1, 'a', X'00'), (2, NULL, NULL), (3, 'it''s', 'x');\n",
    )
    .unwrap();
    let out = run(
        "mariadb",
        rig.osprey_args(),
        Some(format!(
            "source {}\nSELECT COUNT(*) FROM dumped;\n\\s\n",
            script.display()
        )),
    )
    .await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("COUNT(*)\n3"), "{stdout}");
    assert!(stdout.contains("-osprey"), "\\s shows Osprey's version: {stdout}");
    assert!(stdout.contains("Uptime:"), "COM_STATISTICS answered: {stdout}");
    let dump = |args: Vec<String>| async move {
        let mut a = vec!["--skip-dump-date".to_string(), "--skip-comments".to_string()];
        a.extend(args);
        a.push("dumped".into());
        let out = run("mariadb-dump", a, None).await;
        assert!(out.status.success(), "mariadb-dump: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let via = dump(rig.osprey_args()).await;
    let direct = dump(rig.direct_args()).await;
    assert!(via.contains("INSERT INTO `dumped` VALUES"), "{via}");
    assert_eq!(via, direct);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_are_checked_with_both_plugins_and_failures_are_limited() {
    let rig = Rig::start_with("max_auth_failures_per_minute = 3", "").await;
    let q = |extra: &[&str], user: &str, password: &str| {
        let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        a.extend(rig.osprey_args().into_iter().map(|s| {
            if s.starts_with("-p") {
                format!("-p{password}")
            } else if s.starts_with("-u") {
                format!("-u{user}")
            } else {
                s
            }
        }));
        a.extend(["-N".into(), "-e".into(), "SELECT CURRENT_USER() IS NOT NULL".into()]);
        run("mariadb", a, None)
    };
    let app = crate::USER;
    let ok = q(&[], app, crate::PASSWORD).await;
    assert!(ok.status.success(), "native: {}", text(&ok.stderr));
    let sha2 = q(&["--default-auth=caching_sha2_password"], app, crate::PASSWORD).await;
    assert!(sha2.status.success(), "caching_sha2_password: {}", text(&sha2.stderr));
    // Someone behind the same address guesses at a name no user has: refused, then
    // blocked as a real name would be, but the application's own user still logs in (a
    // NAT is not locked out), and another unknown name is not blocked (which would tell
    // that it does not exist).
    for i in 0..4 {
        let e = text(&q(&[], "intruder", "guess").await.stderr);
        let want = if i < 3 { "ERROR 1045 (28000)" } else { "ERROR 1129" };
        assert!(e.contains(want), "attempt {i}: {e}");
    }
    let fresh = text(&q(&[], "someone_else", "guess").await.stderr);
    assert!(fresh.contains("ERROR 1045 (28000)"), "another unknown name: {fresh}");
    let still = q(&[], app, crate::PASSWORD).await;
    assert!(
        still.status.success(),
        "the app's user is not blocked: {}",
        text(&still.stderr)
    );
    // A success forgets the failures before it, as a server's host error count.
    for _ in 0..2 {
        assert!(text(&q(&[], app, "wrong").await.stderr).contains("ERROR 1045 (28000)"));
    }
    assert!(
        q(&[], app, crate::PASSWORD).await.status.success(),
        "2 failures, then in"
    );
    for _ in 0..3 {
        let bad = q(&[], app, "wrong").await;
        let e = text(&bad.stderr);
        assert!(
            e.contains("ERROR 1045 (28000)") && e.contains("Access denied for user 'app'"),
            "{e}"
        );
    }
    // Three in a row: this user, from this address, is blocked for the minute, even with
    // the right password.
    let blocked = q(&[], app, crate::PASSWORD).await;
    assert!(text(&blocked.stderr).contains("1129"), "{}", text(&blocked.stderr));
    let m = rig.cluster.dispatcher.metrics().await.unwrap();
    assert!(m.contains("osprey_mysql_auth_failures_total 9"), "{m}");
}

/// TLS on the MySQL port: the mariadb client upgrades with SSLRequest and logs in over
/// TLS; with require_secure_transport a client that does not is refused with 3159.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_by_sslrequest_and_require_secure_transport() {
    let ca = osprey_tests::pki::TestCa::new("mysql-tls").unwrap();
    let leaf = ca.server("mysql-server", &["localhost", "127.0.0.1"]).unwrap();
    let keys = format!(
        "require_secure_transport = true\n[mysql.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        leaf.cert_file.display().to_string(),
        leaf.key_file.display().to_string()
    );
    let rig = Rig::start_with(&keys, "").await;
    let mut args = vec!["--ssl".to_string()];
    args.extend(rig.osprey_args());
    let tls = run("mariadb", args, Some("\\s\nSELECT 6 * 7;\n".into())).await;
    let out = text(&tls.stdout);
    assert!(tls.status.success(), "{}", text(&tls.stderr));
    assert!(out.contains("Cipher in use"), "the session is TLS: {out}");
    assert!(out.contains("42"), "{out}");
    let mut args = vec!["--skip-ssl".to_string()];
    args.extend(rig.osprey_args());
    args.extend(["-e".into(), "SELECT 1".into()]);
    let plain = run("mariadb", args, None).await;
    assert!(text(&plain.stderr).contains("ERROR 3159"), "{}", text(&plain.stderr));
}

/// `GET /sessions` names the MySQL client that holds each session: its user, address,
/// why it is pinned and the connection attributes its library sent (the mariadb
/// client's `_client_name` and `program_name`, which it gives as `mysql`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_list_names_the_mysql_client() {
    let rig = Rig::start("").await;
    let mut args = rig.osprey_args();
    args.extend(["-e".into(), "SET @x = 1; SELECT SLEEP(4)".into()]);
    let client = tokio::spawn(run("mariadb", args, None));
    let sessions = osprey_tests::harness::wait_for(std::time::Duration::from_secs(3), "the CLI's session", || async {
        let s = rig.cluster.dispatcher.admin_get("/sessions").await.ok()?;
        (s.as_array()?.len() == 1).then_some(s)
    })
    .await
    .unwrap();
    let c = &sessions[0]["client"];
    assert_eq!(
        (c["protocol"].as_str(), c["user"].as_str()),
        (Some("mysql"), Some(crate::USER))
    );
    assert_eq!(c["pinned_by"], "user_variable", "{sessions}");
    let attrs = c["attrs"].as_array().cloned().unwrap_or_default();
    let attr = |k: &str| attrs.iter().find(|a| a[0] == k).map(|a| a[1].clone());
    assert_eq!(attr("_client_name"), Some("libmariadb".into()), "{sessions}");
    assert_eq!(attr("program_name"), Some("mysql".into()), "{sessions}");
    let status = rig.cluster.dispatcher.status().await.unwrap();
    assert_eq!(status["clients"]["mysql_pinned"], 1, "{status}");
    assert!(client.await.unwrap().status.success());
}
