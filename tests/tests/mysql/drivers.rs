//! Real drivers: the Rust `mysql_async` crate (text protocol) and Python's PyMySQL.

use std::time::Duration;

use mysql_async::prelude::Queryable;

use crate::{run, text, Rig};

/// A transaction holds one worker from BEGIN to COMMIT and gives it back after; what it
/// wrote is invisible to others until the COMMIT; autocommit off works like a driver
/// that turns it off (PyMySQL, JDBC with setAutoCommit(false)).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_pin_a_worker_and_give_it_back() {
    let rig = Rig::start("[sessions]\nmax_per_group = 2\n").await;
    let mut a = rig.conn().await;
    let mut b = rig.conn().await;
    a.query_drop("DROP TABLE IF EXISTS tx").await.unwrap();
    a.query_drop("CREATE TABLE tx (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
        .await
        .unwrap();
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO tx VALUES (1, 10)").await.unwrap();
    let seen: Option<i64> = b.query_first("SELECT COUNT(*) FROM tx").await.unwrap();
    assert_eq!(seen, Some(0), "uncommitted row invisible to another client");
    let inside: Option<i64> = a.query_first("SELECT COUNT(*) FROM tx").await.unwrap();
    assert_eq!(inside, Some(1), "the transaction sees its own row");
    let s = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(s.as_array().map(Vec::len), Some(1), "one pinned worker: {s}");
    assert_eq!(s[0]["in_transaction"], true, "{s}");
    a.query_drop("COMMIT").await.unwrap();
    let seen: Option<i64> = b.query_first("SELECT COUNT(*) FROM tx").await.unwrap();
    assert_eq!(seen, Some(1));
    // Unpinned at the COMMIT: the worker went back (its RESET is on its way).
    osprey_tests::harness::wait_for(Duration::from_secs(5), "the session ends", || async {
        let s = rig.cluster.dispatcher.admin_get("/sessions").await.ok()?;
        (s.as_array()?.is_empty()).then_some(())
    })
    .await
    .unwrap();
    // autocommit off: every statement is in a transaction until COMMIT or ROLLBACK.
    a.query_drop("SET autocommit = 0").await.unwrap();
    a.query_drop("INSERT INTO tx VALUES (2, 20)").await.unwrap();
    a.query_drop("ROLLBACK").await.unwrap();
    a.query_drop("INSERT INTO tx VALUES (3, 30)").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    // A tracked SET inside the transaction keeps it (review finding: it reset the
    // session, rolling back the write before it).
    a.query_drop("INSERT INTO tx VALUES (4, 40)").await.unwrap();
    a.query_drop("SET time_zone = '+01:00'").await.unwrap();
    a.query_drop("INSERT INTO tx VALUES (5, 50)").await.unwrap();
    a.query_drop("SET time_zone = '+02:00', sql_select_limit = 1000")
        .await
        .unwrap();
    a.query_drop("COMMIT").await.unwrap();
    a.query_drop("SET autocommit = 1").await.unwrap();
    let ids: Vec<i64> = b.query("SELECT id FROM tx ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![1, 3, 4, 5]);
    let (tz,): (String,) = a.query_first("SELECT @@time_zone").await.unwrap().unwrap();
    assert_eq!(tz, "+02:00");
    drop(a);
    drop(b);
}

/// Tracked variables follow the client from worker to worker without pinning it, and do
/// not leak to another client on the same workers.
/// A statement refused before it runs (here a blocked digest) inside a transaction leaves
/// the transaction as it was: the client stays on its session, so its ROLLBACK undoes
/// every write of the transaction, not just the ones before the refusal (a refused
/// statement's END says no transaction is open, and the front end once believed it,
/// ended the session — rolling the transaction back — and ran the rest in autocommit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_statement_inside_a_transaction_keeps_the_transaction() {
    let rig = Rig::start("").await;
    let d = &rig.cluster.dispatcher;
    let (code, body) = d
        .admin_post("/digests/block", serde_json::json!({ "sql": "SELECT 42 + 1" }))
        .await
        .unwrap();
    assert!((200..300).contains(&code), "{code} {body}");
    let mut a = rig.conn().await;
    a.query_drop("DROP TABLE IF EXISTS tx_refused").await.unwrap();
    a.query_drop("CREATE TABLE tx_refused (id INT PRIMARY KEY) ENGINE=InnoDB")
        .await
        .unwrap();
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO tx_refused VALUES (1)").await.unwrap();
    let refused = a.query_drop("SELECT 7 + 8").await.expect_err("blocked by hand");
    assert!(refused.to_string().contains("block"), "{refused}");
    let s = d.admin_get("/sessions").await.unwrap();
    assert_eq!(s.as_array().map(Vec::len), Some(1), "still pinned: {s}");
    assert_eq!(s[0]["in_transaction"], true, "{s}");
    a.query_drop("INSERT INTO tx_refused VALUES (2)").await.unwrap();
    a.query_drop("ROLLBACK").await.unwrap();
    let mut direct = rig.direct().await;
    let left: Option<i64> = direct.query_first("SELECT COUNT(*) FROM tx_refused").await.unwrap();
    assert_eq!(left, Some(0), "the ROLLBACK undid both inserts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_variables_follow_the_client_without_pinning() {
    let rig = Rig::start("[pool]\nsize = 3\n").await;
    let mut a = rig.conn().await;
    let mut b = rig.conn().await;
    let baseline: (String, u64) = b
        .query_first("SELECT @@time_zone, @@group_concat_max_len")
        .await
        .unwrap()
        .unwrap();
    a.query_drop("SET sql_mode = 'NO_ZERO_DATE', time_zone = '+03:00', SESSION group_concat_max_len = 77")
        .await
        .unwrap();
    a.query_drop("CREATE DATABASE IF NOT EXISTS drv_other").await.unwrap();
    a.query_drop("USE drv_other").await.unwrap();
    for _ in 0..20 {
        let (mode, tz, len, db): (String, String, u64, String) = a
            .query_first("SELECT @@sql_mode, @@time_zone, @@group_concat_max_len, DATABASE()")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (mode.as_str(), tz.as_str(), len, db.as_str()),
            ("NO_ZERO_DATE", "+03:00", 77, "drv_other")
        );
        let (tz, len, db): (String, u64, String) = b
            .query_first("SELECT @@time_zone, @@group_concat_max_len, DATABASE()")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((tz, len), baseline.clone(), "nothing leaked to the other client");
        assert_eq!(db, rig.primary().database());
    }
    let s = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(s.as_array().map(Vec::len), Some(0), "tracked state pins nothing: {s}");
    // SET NAMES with a collation is tracked too, and every later statement still runs.
    a.query_drop("SET NAMES utf8mb4 COLLATE utf8mb4_unicode_ci")
        .await
        .unwrap();
    for _ in 0..5 {
        let (c,): (String,) = a.query_first("SELECT @@collation_connection").await.unwrap().unwrap();
        assert_eq!(c, "utf8mb4_unicode_ci");
    }
    // Several statements in one query run (mysql_async turns multi-statements on) and
    // pin nothing when they change no state.
    let (sets, error) = results(a.query_iter("SELECT @@collation_connection; SELECT 'b'").await).await;
    assert_eq!(error, None);
    let firsts: Vec<mysql_async::Value> = sets.iter().map(|(rows, ..)| rows[0][0].clone()).collect();
    assert_eq!(
        firsts,
        vec![
            mysql_async::Value::Bytes(b"utf8mb4_unicode_ci".to_vec()),
            mysql_async::Value::Bytes(b"b".to_vec())
        ]
    );
    let s = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(s.as_array().map(Vec::len), Some(0), "plain statements pin nothing: {s}");
    // A quoting mode changes how statements must be read: it pins the client instead.
    a.query_drop("SET sql_mode = 'NO_BACKSLASH_ESCAPES'").await.unwrap();
    let s = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(s.as_array().map(Vec::len), Some(1), "NO_BACKSLASH_ESCAPES pins: {s}");
    let (bs,): (String,) = a.query_first(r"SELECT 'a\'").await.unwrap().unwrap();
    assert_eq!(bs, r"a\", "the mode holds on the client's own session");
    // A wrong value fails the SET itself, with the server's own error.
    let e = a.query_drop("SET time_zone = 'Nowhere/Else'").await.unwrap_err();
    match e {
        mysql_async::Error::Server(e) => assert_eq!(e.code, 1298, "{e:?}"),
        e => panic!("{e:?}"),
    }
    // COM_RESET_CONNECTION: back to the login state.
    a.reset().await.unwrap();
    let (tz,): (String,) = a.query_first("SELECT @@time_zone").await.unwrap().unwrap();
    assert_eq!(tz, "SYSTEM");
    a.query_drop("DROP DATABASE drv_other").await.unwrap();
}

const PYMYSQL: &str = r#"
import sys, pymysql
host, port, user, password, db = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
c = pymysql.connect(host=host, port=port, user=user, password=password, database=db, charset="utf8mb4")
cur = c.cursor()
cur.execute("DROP TABLE IF EXISTS py_t")
cur.execute("CREATE TABLE py_t (id INT PRIMARY KEY AUTO_INCREMENT, v VARCHAR(40), d DECIMAL(10,3), t DATETIME(3), b BLOB)")
c.commit()
cur.execute("INSERT INTO py_t (v, d, t, b) VALUES (%s, %s, %s, %s)", ("héllo", "12.345", "2024-01-02 03:04:05.678", b"\x00\x01\xff"))
print("lastrowid", cur.lastrowid, "rowcount", cur.rowcount)
c.rollback()
cur.execute("SELECT COUNT(*) FROM py_t")
print("after rollback", cur.fetchall())
cur.executemany("INSERT INTO py_t (v) VALUES (%s)", [("a",), ("b",), (None,)])
c.commit()
cur.execute("SELECT id, v, d, t, b FROM py_t ORDER BY id")
print(cur.description)
print(cur.fetchall())
c.autocommit(True)
cur.execute("UPDATE py_t SET v = 'z' WHERE v IS NULL")
print("updated", cur.rowcount)
try:
    cur.execute("INSERT INTO py_t (id) VALUES (%s)", (cur.lastrowid or 4,))
    cur.execute("INSERT INTO py_t (id) VALUES (4)")
except pymysql.err.IntegrityError as e:
    print("error", e.args[0])
cur.execute("SELECT @@autocommit, @@in_transaction")
print(cur.fetchall())
# PyMySQL leaves CLIENT_MULTI_STATEMENTS off unless asked: several at once are refused.
try:
    cur.execute("SELECT 1; SELECT 2")
    print("several without the flag", cur.fetchall())
except pymysql.err.MySQLError as e:
    print("several without the flag", e.args[0])
try:
    cur.execute("CREATE TABLE py_x (a INT); DROP TABLE py_t")
    print("a CREATE and more without the flag ran")
except pymysql.err.MySQLError as e:
    print("a CREATE and more without the flag", e.args[0])
c.close()
m = pymysql.connect(host=host, port=port, user=user, password=password, database=db, charset="utf8mb4",
                    client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS)
mc = m.cursor()
mc.execute("SELECT 1 AS a; UPDATE py_t SET v = 'y' WHERE v = 'z'; SELECT COUNT(*) AS n FROM py_t WHERE v = 'y'")
while True:
    print("result", mc.description, mc.rowcount, mc.fetchall())
    if not mc.nextset():
        break
m.rollback()
mc.execute("SELECT COUNT(*) FROM py_t WHERE v = 'y'")
print("rolled back", mc.fetchall())
m.close()
# The status flags (AUTOCOMMIT 2, IN_TRANS 1) after each result, when autocommit changes
# inside a multi-statement query: PyMySQL's get_autocommit() reads them.
s = pymysql.connect(host=host, port=port, user=user, password=password, database=db, autocommit=True,
                    client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS)
sc = s.cursor()
# (ROW_COUNT() right after the query that turned autocommit off: nothing may run before it.)
for q in ["SET autocommit = 0; SELECT 1; SELECT 2", "SELECT 3", "COMMIT; SET autocommit = 1; SELECT 4",
          "SET autocommit = 0; UPDATE py_t SET v = 'w' WHERE v IS NOT NULL", "SELECT ROW_COUNT()",
          "ROLLBACK; SET sql_mode = ''", "SELECT @@autocommit", "SET autocommit = 1; SELECT 5", "SELECT 6"]:
    sc.execute(q)
    flags, rows = [s.server_status & 3], [sc.fetchall()]
    while sc.nextset():
        flags.append(s.server_status & 3)
        rows.append(sc.fetchall())
    print("status flags", q, flags, s.get_autocommit(), rows)
s.close()
"#;

/// PyMySQL (autocommit off by default, then on), its results compared with the same
/// script run against the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymysql_gets_what_the_database_gives() {
    let rig = Rig::start("").await;
    let p = rig.primary();
    let script = |host: String, port: u16, user: &str, password: &str| {
        vec![
            "-c".to_string(),
            PYMYSQL.to_string(),
            host,
            port.to_string(),
            user.to_string(),
            password.to_string(),
            p.database().to_string(),
        ]
    };
    let via = run(
        "python3",
        script(
            rig.mysql.ip().to_string(),
            rig.mysql.port(),
            crate::USER,
            crate::PASSWORD,
        ),
        None,
    )
    .await;
    assert!(via.status.success(), "through osprey: {}", text(&via.stderr));
    let direct = run(
        "python3",
        script(p.host().to_string(), p.port(), p.user(), p.password()),
        None,
    )
    .await;
    assert!(direct.status.success(), "direct: {}", text(&direct.stderr));
    assert!(text(&via.stdout).contains("error 1062"), "{}", text(&via.stdout));
    assert!(
        text(&via.stdout).contains("several without the flag 1064"),
        "{}",
        text(&via.stdout)
    );
    assert!(text(&via.stdout).contains("result (('n',"), "{}", text(&via.stdout));
    assert_eq!(text(&via.stdout), text(&direct.stdout));
}

/// Prepared statements (the binary protocol, `mysql_async`'s `exec`): every core type
/// bound as a parameter and read back, compared value by value with the same statements
/// run straight against the primary; statements spread over several workers; many
/// distinct statements stay bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_bind_and_return_what_the_database_does() {
    use mysql_async::Value as V;
    let rig = Rig::start("[pool]\nsize = 3\n").await;
    let mut via = rig.conn().await;
    let mut direct = rig.direct().await;
    via.query_drop("DROP TABLE IF EXISTS ps_types").await.unwrap();
    via.query_drop(
        "CREATE TABLE ps_types (id INT PRIMARY KEY, ti TINYINT, us SMALLINT UNSIGNED, bi BIGINT, ub BIGINT UNSIGNED, \
         f FLOAT, d DOUBLE, de DECIMAL(20,6), dt DATETIME(6), da DATE, tm TIME(6), y YEAR, vc VARCHAR(40), \
         bl BLOB, bt BIT(12), j JSON, e ENUM('a','b')) DEFAULT CHARSET=utf8mb4",
    )
    .await
    .unwrap();
    let row = |id: i64| {
        vec![
            V::Int(id),
            V::Int(-128),
            V::UInt(65535),
            V::Int(i64::MIN),
            V::UInt(u64::MAX),
            V::Float(2.718_281_7),
            V::Double(-1.7976931348623157e308),
            V::Bytes(b"-12345678901234.123456".to_vec()),
            V::Date(2024, 2, 29, 23, 59, 59, 999_999),
            V::Date(2000, 1, 1, 0, 0, 0, 0),
            V::Time(true, 34, 22, 59, 59, 500_000),
            V::Int(2155),
            V::Bytes("ünïcödé ✓".as_bytes().to_vec()),
            V::Bytes(vec![0, 1, 0xFF]),
            V::Bytes(vec![0x0A, 0xAA]),
            V::Bytes(br#"{"a": [1, null]}"#.to_vec()),
            V::Bytes(b"b".to_vec()),
        ]
    };
    let insert = "INSERT INTO ps_types VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    via.exec_drop(insert, row(1)).await.unwrap();
    let mut nulls = row(2);
    for v in nulls.iter_mut().skip(1) {
        *v = V::NULL;
    }
    via.exec_drop(insert, nulls).await.unwrap();
    for id in 3..=12 {
        via.exec_drop(insert, row(id)).await.unwrap();
    }
    let select = "SELECT * FROM ps_types WHERE id >= ? ORDER BY id";
    let a: Vec<mysql_async::Row> = via.exec(select, (1,)).await.unwrap();
    let b: Vec<mysql_async::Row> = direct.exec(select, (1,)).await.unwrap();
    assert_eq!(a.len(), 12);
    for (ra, rb) in a.iter().zip(&b) {
        let (va, vb): (Vec<V>, Vec<V>) = (ra.clone().unwrap(), rb.clone().unwrap());
        assert_eq!(va, vb, "binary row through osprey vs direct");
        let names = |r: &mysql_async::Row| {
            r.columns_ref()
                .iter()
                .map(|c| (c.name_str().into_owned(), c.column_type()))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(ra), names(rb));
    }
    // Expressions and an empty result, the affected rows and last insert id of an execute.
    let e: Vec<(i64, String, Option<f64>)> = via.exec("SELECT ? + 1, CONCAT(?, 'x'), NULL", (41, "a")).await.unwrap();
    assert_eq!(e, vec![(42, "ax".to_string(), None)]);
    let none: Vec<(i64,)> = via.exec("SELECT id FROM ps_types WHERE id = ?", (999,)).await.unwrap();
    assert!(none.is_empty());
    let r = via
        .exec_iter("UPDATE ps_types SET ti = ? WHERE id > ?", (1, 10))
        .await
        .unwrap();
    assert_eq!(r.affected_rows(), 2);
    drop(r);
    // A prepared transaction (sysbench prepares BEGIN and COMMIT too).
    via.exec_drop("BEGIN", ()).await.unwrap();
    via.exec_drop("DELETE FROM ps_types WHERE id = ?", (12,)).await.unwrap();
    via.exec_drop("ROLLBACK", ()).await.unwrap();
    let n: Option<i64> = direct.query_first("SELECT COUNT(*) FROM ps_types").await.unwrap();
    assert_eq!(n, Some(12), "the prepared ROLLBACK undid the delete");
    // Many distinct statements: each prepared and closed by the driver's cache; the
    // dispatcher's table and the workers' caches stay bounded.
    for i in 0..600 {
        let v: Option<i64> = via.exec_first(format!("SELECT ? + {i}"), (1,)).await.unwrap();
        assert_eq!(v, Some(1 + i));
    }
    let bad = via.exec_drop("SELEC ?", (1,)).await.unwrap_err();
    assert!(
        matches!(bad, mysql_async::Error::Server(ref e) if e.code == 1064),
        "{bad:?}"
    );
}

/// COM_CHANGE_USER (mysql_async's `change_user`): the new user's password is checked,
/// everything of the old one goes (its pinned session, its variables), the new one's
/// default database applies; a wrong password closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_user_checks_the_new_user_and_starts_afresh() {
    let other = format!(
        "[[mysql.users]]\nname = \"other\"\nnative_hash = \"{}\"\nschema = \"cu_other\"\nmax_connections = 1\n",
        osprey_protocol::mysql_auth::native_hash("other-pw")
    );
    let rig = Rig::start(&other).await;
    let mut a = rig.conn().await;
    a.query_drop("CREATE DATABASE IF NOT EXISTS cu_other").await.unwrap();
    a.query_drop("SET @x = 41").await.unwrap();
    let s = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(s.as_array().map(Vec::len), Some(1), "a user variable pins: {s}");
    // The operators see who holds it, and why (mysql_async sends no connection
    // attributes: the CLI test sees the mariadb client's).
    let client = &s[0]["client"];
    assert_eq!(client["protocol"], "mysql", "{s}");
    assert_eq!(client["user"], crate::USER, "{s}");
    assert_eq!(client["pinned_by"], "user_variable", "{s}");
    let status = rig.cluster.dispatcher.status().await.unwrap();
    assert_eq!(status["clients"]["mysql_connections"], 1, "{status}");
    assert_eq!(status["clients"]["mysql_pinned"], 1, "{status}");
    // No database named: the new user's configured one applies.
    let opts = mysql_async::ChangeUserOpts::default()
        .with_user(Some("other".into()))
        .with_pass(Some("other-pw".into()))
        .with_db_name(None);
    a.change_user(opts).await.unwrap();
    osprey_tests::harness::wait_for(Duration::from_secs(5), "the old session ends", || async {
        let s = rig.cluster.dispatcher.admin_get("/sessions").await.ok()?;
        (s.as_array()?.is_empty()).then_some(())
    })
    .await
    .unwrap();
    let (db,): (Option<String>,) = a.query_first("SELECT DATABASE()").await.unwrap().unwrap();
    assert_eq!(db.as_deref(), Some("cu_other"), "the new user's database");
    let (x,): (Option<i64>,) = a.query_first("SELECT @x").await.unwrap().unwrap();
    assert_eq!(x, None, "nothing of the old user's session");
    // The same user again, at its cap of one connection: it keeps its own place.
    let again = mysql_async::ChangeUserOpts::default()
        .with_user(Some("other".into()))
        .with_pass(Some("other-pw".into()));
    a.change_user(again).await.unwrap();
    a.query_drop("SELECT 1").await.unwrap();
    let bad = mysql_async::ChangeUserOpts::default()
        .with_user(Some("other".into()))
        .with_pass(Some("wrong".into()));
    let e = a.change_user(bad).await.unwrap_err();
    assert!(format!("{e:?}").contains("1045"), "{e:?}");
    assert!(
        a.query_drop("SELECT 1").await.is_err(),
        "closed after a refused change of user"
    );
    a.query_drop("DROP DATABASE IF EXISTS cu_other").await.ok();
}

/// Every result of a query, each apart: its rows, affected rows, insert id and message;
/// then the server error that stopped it, if one did.
type Results = (
    Vec<(Vec<Vec<mysql_async::Value>>, u64, Option<u64>, String)>,
    Option<u16>,
);

async fn results<P: mysql_async::prelude::Protocol>(
    r: mysql_async::Result<mysql_async::QueryResult<'_, '_, P>>,
) -> Results {
    let mut out = Vec::new();
    let mut r = match r {
        Ok(r) => r,
        Err(mysql_async::Error::Server(e)) => return (out, Some(e.code)),
        Err(e) => panic!("{e:?}"),
    };
    // Bounded: a result that never ends is a failure, not a hang.
    for _ in 0..16 {
        match r.collect::<mysql_async::Row>().await {
            Ok(rows) => {
                let rows = rows.into_iter().map(|row| row.unwrap()).collect();
                out.push((rows, r.affected_rows(), r.last_insert_id(), r.info().into_owned()));
            }
            Err(mysql_async::Error::Server(e)) => return (out, Some(e.code)),
            Err(e) => panic!("{e:?}"),
        }
        if r.is_empty() {
            return (out, None);
        }
    }
    panic!("more than 16 results: {out:?}");
}

/// Several statements in one query (mysql_async turns CLIENT_MULTI_STATEMENTS on) and a
/// procedure's result sets, by the text and the binary protocol: each result apart, with
/// its own affected rows and insert id, as the server gives them; an error part-way
/// stops there, after the results before it; a transaction opened in one query pins
/// until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_results_come_apart_as_from_the_server() {
    let rig = Rig::start("").await;
    let mut direct = rig.direct().await;
    direct
        .query_drop(
            "DROP TABLE IF EXISTS drv_multi; CREATE TABLE drv_multi (id INT PRIMARY KEY AUTO_INCREMENT, v INT); \
             DROP PROCEDURE IF EXISTS drv_sets",
        )
        .await
        .unwrap();
    direct
        .query_drop(
            "CREATE PROCEDURE drv_sets(IN n INT) BEGIN SELECT n AS a; INSERT INTO drv_multi (v) VALUES (n); \
             SELECT n * 2 AS b, 'x' AS c; UPDATE drv_multi SET v = v + 1 WHERE v = n; END",
        )
        .await
        .unwrap();
    let mut via = rig.conn().await;
    let sessions = || async { rig.cluster.dispatcher.admin_get("/sessions").await.unwrap() };
    // Unpinned, then a transaction across two queries, then a CALL (which pins).
    let texts = [
        "SELECT 1 AS a; SELECT 'two' AS b, NULL AS c",
        "INSERT INTO drv_multi (v) VALUES (10), (11); UPDATE drv_multi SET v = v + 100 WHERE v >= 10; \
         SELECT COUNT(*) FROM drv_multi; INSERT INTO drv_multi (v) VALUES (12)",
        "SELECT 1; SELEC 2; SELECT 3",
        "DELETE FROM drv_multi WHERE v = 110; SELECT v FROM drv_multi ORDER BY id",
        "CALL drv_sets(7)",
    ];
    for sql in texts {
        direct.query_drop("TRUNCATE drv_multi").await.unwrap();
        direct
            .query_drop("INSERT INTO drv_multi (v) VALUES (110)")
            .await
            .unwrap();
        // mysql_async hands over an error after a result at the next query: asked for.
        let code = |e: mysql_async::Error| match e {
            mysql_async::Error::Server(e) => e.code,
            e => panic!("{e:?}"),
        };
        let a = results(via.query_iter(sql).await).await;
        let a_after = via.query_drop("DO 0").await.err().map(code);
        direct.query_drop("TRUNCATE drv_multi").await.unwrap();
        direct
            .query_drop("INSERT INTO drv_multi (v) VALUES (110)")
            .await
            .unwrap();
        let b = results(direct.query_iter(sql).await).await;
        let b_after = direct.query_drop("DO 0").await.err().map(code);
        assert_eq!((&a, a_after), (&b, b_after), "{sql} (osprey, then the server)");
        if sql.contains("SELEC ") {
            assert_eq!(a_after, Some(1064), "the second statement's error");
        }
        // (mysql_async stops at the first result before an error: the CLI test sees it.)
        assert!(
            a.0.len() >= 2 || sql.contains("SELEC "),
            "{sql}: several results: {a:?}"
        );
        if sql.starts_with("SELECT 1 AS a") {
            assert_eq!(
                sessions().await.as_array().map(Vec::len),
                Some(0),
                "plain statements pin nothing"
            );
        }
    }
    // The binary protocol: a prepared CALL (CLIENT_PS_MULTI_RESULTS).
    for n in [3, 4] {
        direct.query_drop("TRUNCATE drv_multi").await.unwrap();
        let a = results(via.exec_iter("CALL drv_sets(?)", (n,)).await).await;
        direct.query_drop("TRUNCATE drv_multi").await.unwrap();
        let b = results(direct.exec_iter("CALL drv_sets(?)", (n,)).await).await;
        assert_eq!(a, b, "prepared CALL (osprey, then the server)");
        // (mysql_async reads the CALL's closing OK with the last result set.)
        assert_eq!(a.0.len(), 2, "two result sets: {a:?}");
    }
    // A transaction opened in one query and ended in the next, on a fresh connection.
    direct.query_drop("TRUNCATE drv_multi").await.unwrap();
    let mut t = rig.conn().await;
    let (_, e) = results(
        t.query_iter("BEGIN; INSERT INTO drv_multi (v) VALUES (1); SELECT COUNT(*) FROM drv_multi")
            .await,
    )
    .await;
    assert_eq!(e, None);
    let open = sessions().await;
    assert_eq!(
        open.as_array().map(Vec::len),
        Some(2),
        "the CALL's and the transaction's: {open}"
    );
    let (r, e) = results(t.query_iter("ROLLBACK; SELECT COUNT(*) FROM drv_multi").await).await;
    assert_eq!(e, None);
    let count = r.last().map(|(rows, ..)| rows[0][0].clone());
    assert_eq!(
        count,
        Some(mysql_async::Value::Bytes(b"0".to_vec())),
        "rolled back: {r:?}"
    );
    // The session ends after the answer: its worker is reset (a round trip to the
    // database) before the list drops it, so the list is looked at until it does.
    let left = osprey_tests::harness::wait_for(Duration::from_secs(5), "the transaction's session to end", || async {
        let open = sessions().await;
        (open.as_array().map(Vec::len) == Some(1)).then_some(open)
    })
    .await
    .unwrap();
    assert_eq!(
        left[0]["client"]["pinned_by"], "call",
        "the CALL's session is left: {left}"
    );
}
