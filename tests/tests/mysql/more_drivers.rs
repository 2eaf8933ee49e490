//! More real drivers, each run once through Osprey's MySQL port and once straight against
//! the primary, their outputs compared line by line: Node.js `mysql2` (`query`, the text
//! protocol, and `execute`, server-side prepared statements) and Python's
//! `mysql-connector-python` (its pure-Python and C-extension paths, plain and prepared
//! cursors, autocommit off and on).

use std::process::Output;

use crate::{run, text, Rig};

/// Runs `program` with `args`, then the database's connection arguments, once through
/// Osprey and once against the primary; both must succeed and print the same lines.
/// Returns what they printed.
async fn same_output(rig: &Rig, program: &str, args: &[&str]) -> String {
    let p = rig.primary();
    let with = |host: String, port: u16, user: &str, password: &str| {
        let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        v.extend([
            host,
            port.to_string(),
            user.to_string(),
            password.to_string(),
            p.database().to_string(),
        ]);
        v
    };
    let via = run(
        program,
        with(
            rig.mysql.ip().to_string(),
            rig.mysql.port(),
            crate::USER,
            crate::PASSWORD,
        ),
        None,
    )
    .await;
    let direct = run(
        program,
        with(p.host().to_string(), p.port(), p.user(), p.password()),
        None,
    )
    .await;
    let show = |o: &Output| format!("stdout:\n{}\nstderr:\n{}", text(&o.stdout), text(&o.stderr));
    assert!(direct.status.success(), "direct: {}", show(&direct));
    assert!(via.status.success(), "through osprey: {}", show(&via));
    let (a, b) = (text(&via.stdout), text(&direct.stdout));
    let differ: Vec<String> = a
        .lines()
        .zip(b.lines())
        .enumerate()
        .filter(|(_, (la, lb))| la != lb)
        .map(|(n, (la, lb))| format!("line {}:\n  osprey: {la}\n  direct: {lb}", n + 1))
        .collect();
    assert!(
        differ.is_empty(),
        "{program} through osprey differs from direct:\n{}",
        differ.join("\n")
    );
    assert_eq!(a, b, "through osprey (left) vs direct (right)");
    a
}

/// Node.js `mysql2`: `query` (the text protocol, placeholders filled in by the driver)
/// and `execute` (COM_STMT_PREPARE/EXECUTE, binary rows) with INT, BIGINT UNSIGNED at
/// its maximum, DECIMAL, DATETIME(3), non-ASCII VARCHAR, a BLOB of 0x00 and 0xFF bytes
/// and NULLs; a transaction rolled back and one committed; duplicate keys and syntax
/// errors (errno, SQLSTATE, message); affected rows, changed rows and insert ids; the
/// column definitions. The script is tests/node/mysql2_driver.js
/// (`npm ci --prefix tests/node`, done by scripts/test.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_mysql2_query_and_execute_match_the_database() {
    let rig = Rig::start("").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/node/mysql2_driver.js");
    let out = same_output(&rig, "node", &[script]).await;
    for expected in [
        r#"query duplicate {"errno":1062,"sqlState":"23000""#,
        r#"execute duplicate {"errno":1062,"sqlState":"23000""#,
        r#""u":"18446744073709551615""#,
        r#""b":"hex:00ff007f80ff""#,
        "héllo wörld ✓ 日本 😀",
        r#"after rollback [{"n":"0","tx":"0"}]"#,
    ] {
        assert!(out.contains(expected), "{expected} missing in:\n{out}");
    }
}

const MYSQL_CONNECTOR: &str = r#"
import signal, sys, datetime
from decimal import Decimal
import mysql.connector
from mysql.connector import errors

signal.alarm(60)  # a driver that hangs fails the test instead of holding it
host, port, user, password, db = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

def show(*a):
    print(*(repr(x) for x in a))

def dup(label, cur, sql, params):
    try:
        cur.execute(sql, params)
        show(label, "no error")
    except errors.IntegrityError as e:
        show(label, e.errno, e.sqlstate, e.msg)

ROW = (-2147483648, 18446744073709551615, Decimal("-12345678901234.123456"),
       datetime.datetime(2024, 2, 29, 23, 59, 59, 123000), "héllo wörld ✓ 日本 😀",
       b"\x00\xff\x00\x7f\x80\xff")
# A Python int past 2**63 cannot be bound by the C extension's prepared cursor: the
# string can.
PROW = ROW[:1] + (str(ROW[1]),) + ROW[2:]
NULLS = (None,) * 6

for pure in (True, False):
    # The C extension's libmysqlclient cannot switch from an asked-for plugin to the
    # database's own (its mysql_native_password is a plugin it fails to load there), so
    # only the pure path names one; its default login is checked on both paths.
    for plugin in (None, "mysql_native_password", "caching_sha2_password") if pure else (None,):
        kw = dict(host=host, port=port, user=user, password=password, database=db,
                  use_pure=pure, ssl_disabled=True, charset="utf8mb4",
                  collation="utf8mb4_general_ci")
        if plugin:
            kw["auth_plugin"] = plugin
        c = mysql.connector.connect(**kw)
        show("pure", pure, "plugin", plugin, "autocommit", c.autocommit)
        c.close()
    c = mysql.connector.connect(host=host, port=port, user=user, password=password,
                                database=db, use_pure=pure, ssl_disabled=True,
                                charset="utf8mb4", collation="utf8mb4_general_ci")
    show("connected", type(c).__name__, c.autocommit)
    t = "mc_t_%d" % pure
    cur = c.cursor()
    ps = c.cursor(prepared=True)
    show("cursors", type(cur).__name__, type(ps).__name__)
    cur.execute("DROP TABLE IF EXISTS " + t)
    cur.execute("CREATE TABLE " + t + " (id INT PRIMARY KEY AUTO_INCREMENT, i INT, u BIGINT UNSIGNED, "
                "d DECIMAL(20,6), t DATETIME(3), v VARCHAR(40), b BLOB, UNIQUE KEY uv (v)) "
                "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
    ins = "INSERT INTO " + t + " (i, u, d, t, v, b) VALUES (%s, %s, %s, %s, %s, %s)"
    pins = "INSERT INTO " + t + " (i, u, d, t, v, b) VALUES (?, ?, ?, ?, ?, ?)"

    # autocommit off (the driver's default): rolled back, then committed.
    cur.execute(ins, ROW)
    show("insert", cur.lastrowid, cur.rowcount)
    cur.execute("SELECT COUNT(*), @@in_transaction FROM " + t)
    show("in transaction", cur.fetchall())
    c.rollback()
    cur.execute("SELECT COUNT(*) FROM " + t)
    show("after rollback", cur.fetchall())
    c.commit()
    cur.execute(ins, ROW)
    show("insert", cur.lastrowid, cur.rowcount)
    cur.execute(ins, NULLS)
    show("insert nulls", cur.lastrowid, cur.rowcount)
    ps.execute(pins, (2147483647, "18446744073709551614", Decimal("0.000001"),
                      datetime.datetime(1999, 12, 31, 23, 59, 59, 999000), "ünïcödé ✓",
                      b"\xff\x00"))
    show("prepared insert", ps.lastrowid, ps.rowcount)
    ps.execute(pins, NULLS)
    show("prepared insert nulls", ps.lastrowid, ps.rowcount)
    c.commit()
    cur.executemany(ins, [(1, 1, "1.5", "2001-01-01 00:00:00", "many %d" % k, None) for k in range(3)])
    show("executemany", cur.rowcount)
    c.rollback()
    dup("duplicate", cur, ins, ROW)
    dup("prepared duplicate", ps, pins, PROW)
    c.rollback()

    # Back, both protocols, with the descriptions.
    cur.execute("SELECT * FROM " + t + " ORDER BY id")
    show("description", cur.description)
    for r in cur.fetchall():
        show("row", r)
    ps.execute("SELECT * FROM " + t + " WHERE id >= ? ORDER BY id", (0,))
    show("prepared description", ps.description)
    for r in ps.fetchall():
        show("prepared row", r)
    ps.execute("SELECT ? + 1, CONCAT(?, 'x'), NULL, ?", (41, "é", b"\x00\xff"))
    show("prepared expressions", ps.fetchall())
    ps.execute("SELECT id FROM " + t + " WHERE id = ?", (999,))
    show("prepared empty", ps.fetchall())
    c.commit()

    # autocommit on.
    c.autocommit = True
    show("autocommit", c.autocommit)
    cur.execute("UPDATE " + t + " SET i = 7 WHERE i IS NULL")
    show("update", cur.rowcount)
    ps.execute("UPDATE " + t + " SET i = ? WHERE i = ?", (8, 7))
    show("prepared update", ps.rowcount)
    cur.execute("SELECT @@autocommit, @@in_transaction")
    show("autocommit state", cur.fetchall())
    c.start_transaction()
    ps.execute("DELETE FROM " + t + " WHERE i = ?", (8,))
    show("delete in transaction", ps.rowcount, c.in_transaction)
    c.rollback()
    cur.execute("SELECT COUNT(*) FROM " + t + " WHERE i = 8")
    show("after rollback", cur.fetchall(), c.in_transaction)
    ps.execute(pins, (5, 5, Decimal("5"), datetime.datetime(2005, 5, 5), "last", None))
    show("last insert", ps.lastrowid, ps.rowcount)
    cur.execute("SELECT LAST_INSERT_ID()")
    show("last insert id", cur.fetchall())
    cur.close()
    ps.close()
    c.close()
"#;

/// Python's `mysql-connector-python`, its pure-Python and C-extension paths: login with
/// mysql_native_password and with caching_sha2_password's fast path, autocommit off (the
/// driver's default: rollback and commit) and on (start_transaction), a plain cursor
/// (text protocol) and `cursor(prepared=True)` (binary protocol) with INT, BIGINT
/// UNSIGNED at its maximum, DECIMAL, DATETIME(3), non-ASCII text, bytes and NULLs,
/// duplicate keys, row counts and last row ids; the output compared with the same script
/// run against the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_connector_python_pure_and_c_match_the_database() {
    let rig = Rig::start("").await;
    let out = same_output(&rig, "python3", &["-c", MYSQL_CONNECTOR]).await;
    for expected in [
        "'connected' 'MySQLConnection' False",
        "'connected' 'CMySQLConnection' False",
        "'duplicate' 1062 '23000'",
        "'prepared duplicate' 1062 '23000'",
        "18446744073709551615",
        "'after rollback' [(0,)]",
    ] {
        assert!(out.contains(expected), "{expected} missing in:\n{out}");
    }
}
