//! The value-type table of the core tests (tests/tests/core/types.rs), read through this
//! session and through mysql_async from the same server: the decoded `mysql_common::Value`s
//! and the column metadata must be equal, over the text and the binary protocol, with and
//! without CLIENT_DEPRECATE_EOF and MariaDB's metadata caching; and parameters sent by this session must store the same
//! values.

mod common;

use common::{opts, read_response};
use mysql_async::prelude::Queryable;
use osprey_sandbox::Sandbox;
use osprey_wire::{Session, Value};

const CREATE: &str = "CREATE TABLE types (
    id INT PRIMARY KEY,
    ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
    mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
    f FLOAT, d DOUBLE, dc DECIMAL(65,30),
    dt DATE, dtm DATETIME(6), ts TIMESTAMP(6) NULL DEFAULT NULL, tm TIME(6), y YEAR,
    c CHAR(10), vc VARCHAR(100), tx TEXT,
    bn BINARY(4), vb VARBINARY(10), bl BLOB,
    bt BIT(64), js JSON, en ENUM('a','b','c'), st SET('x','y','z')
) DEFAULT CHARSET=utf8mb4";

const COLUMNS: &str = "id, ti, tiu, si, siu, mi, miu, i, iu, bi, biu, f, d, dc, dt, dtm, ts, tm, y, \
                       c, vc, tx, bn, vb, bl, bt, js, en, st";
const NCOLS: usize = 29;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

const JSON_DOC: &str = r#"{"a": [1, 2.5, "x😀"], "b": null, "c": {"d": true}}"#;
const DEC_MAX: &str = "12345678901234567890123456789012345.123456789012345678901234567890";
const DEC_MIN: &str = "-0.000000000000000000000000000001";

/// The core test's rows as SQL literals, plus FLOATs that need more than 6 digits (exact
/// only over the binary protocol) and non-UTF-8 bytes in every string type.
fn rows() -> Vec<String> {
    let lt = "x😀é".repeat(1000);
    let bl: Vec<u8> = (0..1024u32).map(|i| (i % 256) as u8).collect();
    let null_row = |id: u32, extra: &[(usize, &str)]| {
        let vals: Vec<String> = (0..NCOLS)
            .map(|i| match (i, extra.iter().find(|(c, _)| *c == i)) {
                (0, _) => id.to_string(),
                (_, Some((_, v))) => v.to_string(),
                _ => "NULL".into(),
            })
            .collect();
        format!("({})", vals.join(", "))
    };
    vec![
        format!(
            "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, \
             -1.5, -2.2250738585072014e-308, '{DEC_MIN}', '1000-01-01', '1000-01-01 00:00:00.000000', \
             '2000-01-01 00:00:00.000001', '-838:59:59.000000', 1901, 'abc', '', 'émoji 😀 text', \
             x'00FF0000', x'00', x'0000', b'0', '[]', 'a', '')"
        ),
        format!(
            "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, \
             9223372036854775807, 18446744073709551615, 3.25, 1.7976931348623157e308, '{DEC_MAX}', \
             '9999-12-31', '9999-12-31 23:59:59.999999', '2037-12-31 23:59:59.999999', \
             '838:59:59.000000', 2155, '😀😀😀😀😀😀😀😀😀😀', 'héllo wörld 😀 ✓', '{lt}', \
             x'01020304', x'00000000000000000000', x'{}', b'{}', '{JSON_DOC}', 'c', 'x,z')",
            hex(&bl),
            "1".repeat(64)
        ),
        "(3, 0, 1, 0, 1, 0, 1, 0, 1, 0, 9223372036854775808, 0, 0.1, 0, '0000-00-00', \
         '0000-00-00 00:00:00', '0000-00-00 00:00:00', '25:00:00.5', 0, 'x', 'tab\\there \"q\" ''s''', '', \
         x'00000000', x'', x'', b'1', 'null', 'b', 'x,y,z')"
            .to_string(),
        null_row(4, &[]),
        null_row(5, &[(17, "'-00:00:00.000001'")]),
        // FLOAT needing more digits than the text protocol prints; a negative TIME over a day.
        null_row(6, &[(11, "1.2345678"), (12, "-0.1"), (17, "'-100:00:00.5'")]),
        // Bytes that are not UTF-8 in the binary and blob columns; latin1-ish bytes in text
        // columns are converted by the server, so those get valid text.
        null_row(
            7,
            &[
                (22, "x'FFFEFDFC'"),
                (23, "x'C328FF'"),
                (24, "x'80818283FF'"),
                (25, "b'101'"),
            ],
        ),
    ]
}

#[tokio::test]
async fn values_and_columns_match_mysql_async() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut db = p.conn().await?;
    db.query_drop(CREATE).await?;
    db.query_drop("SET SESSION sql_mode = ''").await?;
    db.query_drop(format!("INSERT INTO types ({COLUMNS}) VALUES {}", rows().join(", ")))
        .await?;

    let select_text = format!("SELECT {COLUMNS} FROM types WHERE id >= 0 ORDER BY id");
    let select_bin = format!("SELECT {COLUMNS} FROM types WHERE id >= ? ORDER BY id");
    let direct_text: Vec<mysql_async::Row> = db.query(&select_text).await?;
    let direct_bin: Vec<mysql_async::Row> = db.exec(&select_bin, (0,)).await?;
    assert_eq!(direct_text.len(), rows().len());
    // Expressions too: literals of every kind, both protocols.
    let exprs = "SELECT NULL, 1, -1, 18446744073709551615, 1.5, 1.5e0, 'é', _binary x'FF00', \
                 CAST('2024-02-29 12:34:56.789' AS DATETIME(3)), CAST('-1:2:3' AS TIME), DATE('2024-01-01'), \
                 JSON_OBJECT('k', 1), b'11', 1 = 1";
    let direct_exprs_text: Vec<mysql_async::Row> = db.query(exprs).await?;
    let direct_exprs_bin: Vec<mysql_async::Row> = db.exec(exprs, ()).await?;

    for (deprecate_eof, cache_metadata) in [(true, true), (false, true), (true, false)] {
        let mut o = opts(p);
        o.deprecate_eof = deprecate_eof;
        o.cache_metadata = cache_metadata;
        let mut s = Session::connect(&o).await?;
        assert_eq!(
            s.capabilities()
                .contains(osprey_wire::mysql_common::constants::CapabilityFlags::CLIENT_DEPRECATE_EOF),
            deprecate_eof
        );
        common::query(&mut s, "SET SESSION sql_mode = ''").await;

        let compare = |what: &str, mine: &common::Response, theirs: &[mysql_async::Row]| {
            assert!(mine.error.is_none(), "{what}: {:?}", mine.error);
            let set = &mine.results[0];
            let cols = set.columns.as_ref().expect("a result set");
            assert_eq!(
                &cols[..],
                theirs[0].columns_ref(),
                "{what} (deprecate_eof {deprecate_eof}): columns"
            );
            assert_eq!(set.rows.len(), theirs.len(), "{what}: row count");
            for (i, (a, b)) in set.rows.iter().zip(theirs).enumerate() {
                let b = b.clone().unwrap();
                for (j, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(x, y, "{what} (deprecate_eof {deprecate_eof}): row {i}, column {j}");
                }
                assert_eq!(a.len(), b.len());
            }
        };

        let mine = common::query(&mut s, &select_text).await;
        compare("text", &mine, &direct_text);
        let stmt = s.prepare(&select_bin).await?;
        assert_eq!(stmt.num_params(), 1);
        assert_eq!(stmt.columns().len(), NCOLS);
        s.send_execute(&stmt, &[Value::Int(0)])?;
        let mine_bin = read_response(&mut s).await?;
        compare("binary", &mine_bin, &direct_bin);
        // The binary protocol is lossless for FLOAT, the text one is not.
        let exact = &mine_bin.results[0].rows[5][11];
        assert_eq!(*exact, Value::Float(1.2345678), "binary FLOAT");
        assert_eq!(
            mine.results[0].rows[5][11],
            Value::Bytes(b"1.23457".to_vec()),
            "text FLOAT"
        );

        compare(
            "expressions, text",
            &common::query(&mut s, exprs).await,
            &direct_exprs_text,
        );
        let stmt = s.prepare(exprs).await?;
        s.send_execute(&stmt, &[])?;
        compare("expressions, binary", &read_response(&mut s).await?, &direct_exprs_bin);

        // Parameters: this session writes the binary values back under new ids; what
        // mysql_async then reads must equal the originals.
        let base = 100 * (1 + i64::from(deprecate_eof) + 2 * i64::from(cache_metadata));
        let placeholders = vec!["?"; NCOLS].join(", ");
        let insert = s
            .prepare(&format!("INSERT INTO types ({COLUMNS}) VALUES ({placeholders})"))
            .await?;
        for row in &mine_bin.results[0].rows {
            let mut params = row.clone();
            let Value::Int(id) = params[0] else {
                panic!("id {:?}", params[0])
            };
            params[0] = Value::Int(base + id);
            s.send_execute(&insert, &params)?;
        }
        for _ in &mine_bin.results[0].rows {
            let r = read_response(&mut s).await?;
            assert!(r.error.is_none(), "insert: {:?}", r.error);
            assert_eq!(r.ok().affected_rows(), 1);
        }
        let again: Vec<mysql_async::Row> = db
            .exec(format!("SELECT {COLUMNS} FROM types WHERE id > ? ORDER BY id"), (base,))
            .await?;
        assert_eq!(again.len(), direct_bin.len());
        for (a, b) in again.iter().zip(&direct_bin) {
            let (a, b) = (a.clone().unwrap(), b.clone().unwrap());
            assert_eq!(
                &a[1..],
                &b[1..],
                "parameters round trip (deprecate_eof {deprecate_eof})"
            );
        }
        db.query_drop(format!("DELETE FROM types WHERE id > {base}")).await?;
    }
    Ok(())
}

#[tokio::test]
async fn ok_packets_match_mysql_async() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let p = sandbox.primary();
    let mut db = p.conn().await?;
    db.query_drop("CREATE TABLE ai (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
        .await?;
    let mut s = Session::connect(&opts(p)).await?;
    // Non-strict: the division by zero and the bad integer below are warnings.
    db.query_drop("SET SESSION sql_mode = ''").await?;
    common::query(&mut s, "SET SESSION sql_mode = ''").await;
    for sql in [
        "INSERT INTO ai (v) VALUES (1), (2), (3)",
        "UPDATE ai SET v = v + 1 WHERE v >= 2",
        "INSERT INTO ai (v) VALUES (1/0)",
        "DELETE FROM ai WHERE v = 99",
    ] {
        db.query_drop(sql).await?;
        let theirs = db.last_ok_packet().cloned().expect("an OK");
        let mine = common::query(&mut s, sql).await;
        let ok = mine.ok();
        assert_eq!(ok.affected_rows(), theirs.affected_rows(), "{sql}");
        assert_eq!(ok.warnings(), theirs.warnings(), "{sql}");
        assert_eq!(ok.info_ref(), theirs.info_ref(), "{sql}");
        assert_eq!(ok.status_flags(), theirs.status_flags(), "{sql}");
        assert_eq!(
            ok.last_insert_id().is_some(),
            theirs.last_insert_id().is_some(),
            "{sql}"
        );
        assert_eq!(s.last_ok(), Some(ok));
    }
    let r = common::query(&mut s, "INSERT INTO ai (v) VALUES ('x')").await;
    assert_eq!(r.ok().warnings(), 1, "{r:?}");
    assert_eq!(common::query(&mut s, "SHOW WARNINGS").await.results[0].rows.len(), 1);
    Ok(())
}
