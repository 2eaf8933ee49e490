//! Test 1: every column type round-trips exactly, through Osprey's text path (no params)
//! and binary path (params), compared with what `mysql_async` reads straight from MariaDB.

use mysql_async::consts::{ColumnFlags, ColumnType};
use mysql_async::prelude::Queryable;
use osprey_client::Value;

use crate::{assert_closed_loop, client, cluster, describe};

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

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

fn long_text() -> String {
    "x😀é".repeat(1000)
}

fn blob() -> Vec<u8> {
    (0..1024u32).map(|i| (i % 256) as u8).collect()
}

const JSON_DOC: &str = r#"{"a": [1, 2.5, "x😀"], "b": null, "c": {"d": true}}"#;
const DEC_MAX: &str = "12345678901234567890123456789012345.123456789012345678901234567890";
const DEC_MIN: &str = "-0.000000000000000000000000000001";

/// The rows as SQL literals (inserted directly) and as the values expected back.
fn rows() -> Vec<(String, Vec<Value>)> {
    let lt = long_text();
    let bl = blob();
    vec![
        (
            format!(
                "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, \
                 -1.5, -2.2250738585072014e-308, '{DEC_MIN}', '1000-01-01', '1000-01-01 00:00:00.000000', \
                 '2000-01-01 00:00:00.000001', '-838:59:59.000000', 1901, 'abc', '', 'émoji 😀 text', \
                 x'00FF0000', x'00', x'0000', b'0', '[]', 'a', '')"
            ),
            vec![
                Value::Int(1),
                Value::Int(-128),
                Value::UInt(0),
                Value::Int(-32768),
                Value::UInt(0),
                Value::Int(-8388608),
                Value::UInt(0),
                Value::Int(-2147483648),
                Value::UInt(0),
                Value::Int(i64::MIN),
                Value::UInt(0),
                Value::Float(-1.5),
                Value::Double(-2.2250738585072014e-308),
                Value::Decimal(DEC_MIN.into()),
                Value::date(1000, 1, 1, 0, 0, 0, 0),
                Value::date(1000, 1, 1, 0, 0, 0, 0),
                Value::date(2000, 1, 1, 0, 0, 0, 1),
                Value::time(true, 34, 22, 59, 59, 0),
                Value::Int(1901),
                text("abc"),
                text(""),
                text("émoji 😀 text"),
                Value::Bytes(vec![0, 0xFF, 0, 0]),
                Value::Bytes(vec![0]),
                Value::Bytes(vec![0, 0]),
                Value::Bit(vec![0; 8]),
                text("[]"),
                text("a"),
                text(""),
            ],
        ),
        (
            format!(
                "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, \
                 9223372036854775807, 18446744073709551615, 3.25, 1.7976931348623157e308, '{DEC_MAX}', \
                 '9999-12-31', '9999-12-31 23:59:59.999999', '2037-12-31 23:59:59.999999', \
                 '838:59:59.000000', 2155, '😀😀😀😀😀😀😀😀😀😀', 'héllo wörld 😀 ✓', '{lt}', \
                 x'01020304', x'00000000000000000000', x'{}', b'{}', '{JSON_DOC}', 'c', 'x,z')",
                hex(&bl),
                "1".repeat(64)
            ),
            vec![
                Value::Int(2),
                Value::Int(127),
                Value::UInt(255),
                Value::Int(32767),
                Value::UInt(65535),
                Value::Int(8388607),
                Value::UInt(16777215),
                Value::Int(2147483647),
                Value::UInt(4294967295),
                Value::Int(i64::MAX),
                Value::UInt(u64::MAX),
                Value::Float(3.25),
                Value::Double(1.7976931348623157e308),
                Value::Decimal(DEC_MAX.into()),
                Value::date(9999, 12, 31, 0, 0, 0, 0),
                Value::date(9999, 12, 31, 23, 59, 59, 999999),
                Value::date(2037, 12, 31, 23, 59, 59, 999999),
                Value::time(false, 34, 22, 59, 59, 0),
                Value::Int(2155),
                text("😀😀😀😀😀😀😀😀😀😀"),
                text("héllo wörld 😀 ✓"),
                Value::Text(lt.clone()),
                Value::Bytes(vec![1, 2, 3, 4]),
                Value::Bytes(vec![0; 10]),
                Value::Bytes(bl.clone()),
                Value::Bit(vec![0xFF; 8]),
                text(JSON_DOC),
                text("c"),
                text("x,z"),
            ],
        ),
        (
            // Zero dates (the session runs with sql_mode = '').
            "(3, 0, 1, 0, 1, 0, 1, 0, 1, 0, 9223372036854775808, 0, 0.1, 0, '0000-00-00', \
             '0000-00-00 00:00:00', '0000-00-00 00:00:00', '25:00:00.5', 0, 'x', 'tab\\there \"q\" ''s''', '', \
             x'00000000', x'', x'', b'1', 'null', 'b', 'x,y,z')"
                .to_string(),
            vec![
                Value::Int(3),
                Value::Int(0),
                Value::UInt(1),
                Value::Int(0),
                Value::UInt(1),
                Value::Int(0),
                Value::UInt(1),
                Value::Int(0),
                Value::UInt(1),
                Value::Int(0),
                Value::UInt(1 << 63),
                Value::Float(0.0),
                Value::Double(0.1),
                Value::Decimal("0.000000000000000000000000000000".into()),
                Value::date(0, 0, 0, 0, 0, 0, 0),
                Value::date(0, 0, 0, 0, 0, 0, 0),
                Value::date(0, 0, 0, 0, 0, 0, 0),
                Value::time(false, 1, 1, 0, 0, 500000),
                Value::Int(0),
                text("x"),
                text("tab\there \"q\" 's'"),
                text(""),
                Value::Bytes(vec![0; 4]),
                Value::Bytes(vec![]),
                Value::Bytes(vec![]),
                Value::Bit(vec![0, 0, 0, 0, 0, 0, 0, 1]),
                text("null"),
                text("b"),
                text("x,y,z"),
            ],
        ),
        (
            "(4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
             NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
                .to_string(),
            std::iter::once(Value::Int(4))
                .chain(std::iter::repeat_n(Value::Null, NCOLS - 1))
                .collect(),
        ),
        (
            // A negative TIME under one second; everything else NULL.
            "(5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
             NULL, '-00:00:00.000001', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
                .to_string(),
            (0..NCOLS)
                .map(|i| match i {
                    0 => Value::Int(5),
                    17 => Value::time(true, 0, 0, 0, 0, 1),
                    _ => Value::Null,
                })
                .collect(),
        ),
    ]
}

/// The protocol allows `UInt` for any unsigned value and `Int` for those that fit an
/// `i64`: compare them as numbers.
fn normalize(v: &Value) -> Value {
    match v {
        Value::UInt(u) if *u <= i64::MAX as u64 => Value::Int(*u as i64),
        other => other.clone(),
    }
}

fn assert_rows_eq(what: &str, got: &[Vec<Value>], want: &[Vec<Value>]) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: row {r} width");
        for (c, (gv, wv)) in g.iter().zip(w).enumerate() {
            let col = COLUMNS.split(", ").nth(c).unwrap_or("?");
            assert_eq!(
                normalize(gv),
                normalize(wv),
                "{what}: row {r} (id {:?}) column {col}",
                w[0]
            );
        }
    }
}

/// `YYYY-MM-DD[ HH:MM:SS[.ffffff]]` as MySQL prints it.
fn parse_datetime(s: &str) -> Value {
    let (d, t) = s.split_once(' ').unwrap_or((s, "00:00:00"));
    let d: Vec<u32> = d.split('-').map(|x| x.parse().expect("date part")).collect();
    let (h, mi, sec, us) = parse_hms(t);
    Value::date(d[0] as u16, d[1] as u8, d[2] as u8, h as u8, mi, sec, us)
}

fn parse_hms(t: &str) -> (u32, u8, u8, u32) {
    let (hms, frac) = t.split_once('.').unwrap_or((t, ""));
    let p: Vec<u32> = hms.split(':').map(|x| x.parse().expect("time part")).collect();
    let us = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}")[..6].parse().expect("micros")
    };
    (p[0], p[1] as u8, p[2] as u8, us)
}

/// `[-]HHH:MM:SS[.ffffff]` as MySQL prints it.
fn parse_time(s: &str) -> Value {
    let (negative, t) = match s.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, s),
    };
    let (h, mi, sec, us) = parse_hms(t);
    Value::time(negative, h / 24, (h % 24) as u8, mi, sec, us)
}

/// What Osprey must deliver for a value `mysql_async` read, decided by the column's SQL type.
fn expected(col: &mysql_async::Column, v: mysql_async::Value) -> Value {
    use mysql_async::Value as M;
    let unsigned = col.flags().contains(ColumnFlags::UNSIGNED_FLAG);
    let binary = col.character_set() == 63;
    let utf8 = |b: Vec<u8>| String::from_utf8(b).expect("utf-8 text");
    match (col.column_type(), v) {
        (_, M::NULL) => Value::Null,
        (
            ColumnType::MYSQL_TYPE_TINY
            | ColumnType::MYSQL_TYPE_SHORT
            | ColumnType::MYSQL_TYPE_INT24
            | ColumnType::MYSQL_TYPE_LONG
            | ColumnType::MYSQL_TYPE_LONGLONG
            | ColumnType::MYSQL_TYPE_YEAR,
            v,
        ) => match v {
            M::Int(i) => Value::Int(i),
            M::UInt(u) => Value::UInt(u),
            M::Bytes(b) if unsigned => Value::UInt(utf8(b).parse().expect("unsigned")),
            M::Bytes(b) => Value::Int(utf8(b).parse().expect("integer")),
            other => panic!("integer column {} as {other:?}", col.name_str()),
        },
        (ColumnType::MYSQL_TYPE_FLOAT, v) => match v {
            M::Float(f) => Value::Float(f),
            M::Double(d) => Value::Float(d as f32),
            M::Bytes(b) => Value::Float(utf8(b).parse().expect("float")),
            other => panic!("FLOAT as {other:?}"),
        },
        (ColumnType::MYSQL_TYPE_DOUBLE, v) => match v {
            M::Double(d) => Value::Double(d),
            M::Float(f) => Value::Double(f64::from(f)),
            M::Bytes(b) => Value::Double(utf8(b).parse().expect("double")),
            other => panic!("DOUBLE as {other:?}"),
        },
        (ColumnType::MYSQL_TYPE_DECIMAL | ColumnType::MYSQL_TYPE_NEWDECIMAL, M::Bytes(b)) => Value::Decimal(utf8(b)),
        (
            ColumnType::MYSQL_TYPE_DATE
            | ColumnType::MYSQL_TYPE_NEWDATE
            | ColumnType::MYSQL_TYPE_DATETIME
            | ColumnType::MYSQL_TYPE_DATETIME2
            | ColumnType::MYSQL_TYPE_TIMESTAMP
            | ColumnType::MYSQL_TYPE_TIMESTAMP2,
            v,
        ) => match v {
            M::Date(y, mo, d, h, mi, s, us) => Value::date(y, mo, d, h, mi, s, us),
            M::Bytes(b) => parse_datetime(&utf8(b)),
            other => panic!("date column as {other:?}"),
        },
        (ColumnType::MYSQL_TYPE_TIME | ColumnType::MYSQL_TYPE_TIME2, v) => match v {
            M::Time(neg, d, h, mi, s, us) => Value::time(neg, d, h, mi, s, us),
            M::Bytes(b) => parse_time(&utf8(b)),
            other => panic!("TIME as {other:?}"),
        },
        (ColumnType::MYSQL_TYPE_BIT, M::Bytes(b)) => Value::Bit(b),
        (ColumnType::MYSQL_TYPE_JSON, M::Bytes(b)) => Value::Json(utf8(b)),
        (_, M::Bytes(b)) if binary => Value::Bytes(b),
        (_, M::Bytes(b)) => Value::Text(utf8(b)),
        (t, v) => panic!("unexpected {v:?} in a {t:?} column"),
    }
}

/// Column type code, flags and character set of each column.
type ColumnMeta = Vec<(u8, u16, u16)>;

fn map_direct(rows: Vec<mysql_async::Row>) -> (Vec<Vec<Value>>, ColumnMeta) {
    let meta = rows
        .first()
        .map(|r| {
            r.columns_ref()
                .iter()
                .map(|c| (c.column_type() as u8, c.flags().bits(), c.character_set()))
                .collect()
        })
        .unwrap_or_default();
    let values = rows
        .into_iter()
        .map(|r| {
            let cols = r.columns();
            r.unwrap()
                .into_iter()
                .zip(cols.iter())
                .map(|(v, c)| expected(c, v))
                .collect()
        })
        .collect();
    (values, meta)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_column_type_round_trips_exactly() {
    let c = cluster("[pool]\nsize = 1\n").await;
    let mut db = c.sandbox.primary().conn().await.expect("direct connection");
    db.query_drop(CREATE).await.expect("create table");
    db.query_drop("SET SESSION sql_mode = ''").await.unwrap();
    let rows = rows();
    let values: Vec<&str> = rows.iter().map(|(sql, _)| sql.as_str()).collect();
    db.query_drop(format!("INSERT INTO types ({COLUMNS}) VALUES {}", values.join(", ")))
        .await
        .expect("insert");
    let want: Vec<Vec<Value>> = rows.into_iter().map(|(_, v)| v).collect();

    let select = format!("SELECT {COLUMNS} FROM types WHERE id >= ? ORDER BY id");
    let select_text = format!("SELECT {COLUMNS} FROM types WHERE id >= 0 ORDER BY id");

    // Straight from MariaDB: the reference, through both protocols.
    let direct_text: Vec<mysql_async::Row> = db.query(&select_text).await.unwrap();
    let direct_bin: Vec<mysql_async::Row> = db.exec(&select, (0,)).await.unwrap();
    let (direct_text, meta_text) = map_direct(direct_text);
    let (direct_bin, meta_bin) = map_direct(direct_bin);
    assert_eq!(meta_text.len(), NCOLS);
    assert_rows_eq("mysql_async binary vs literals", &direct_bin, &want);
    assert_rows_eq("mysql_async text vs literals", &direct_text, &want);

    // Through Osprey.
    let client = client(&c).await;
    for (what, sql, params) in [
        ("osprey text protocol (no params)", &select_text, vec![]),
        ("osprey binary protocol (params)", &select, vec![Value::Int(0)]),
    ] {
        let r = client
            .query(sql.as_str(), &params)
            .await
            .unwrap_or_else(|e| panic!("{what}: {}", describe(&e)));
        let got: Vec<Vec<Value>> = r.rows().iter().map(|row| row.values().to_vec()).collect();
        let direct = if params.is_empty() { &direct_text } else { &direct_bin };
        assert_rows_eq(&format!("{what} vs mysql_async"), &got, direct);
        assert_rows_eq(&format!("{what} vs literals"), &got, &want);
        let got_meta: ColumnMeta = r
            .columns()
            .iter()
            .map(|c| (c.column_type, c.flags, c.charset))
            .collect();
        let direct_meta = if params.is_empty() { &meta_text } else { &meta_bin };
        assert_eq!(&got_meta, direct_meta, "{what}: column types / flags / charsets");
        assert_eq!(r.summary.rows, want.len() as u64, "{what}: END.rows");
    }

    // Parameters round-trip too: insert every row again through Osprey (binary protocol
    // parameters of every variant) and read it back.
    let placeholders = vec!["?"; NCOLS].join(", ");
    for row in &want {
        let mut params = row.clone();
        params[0] = match row[0] {
            Value::Int(id) => Value::Int(id + 10),
            _ => unreachable!(),
        };
        client
            .execute(
                format!("INSERT INTO types ({COLUMNS}) VALUES ({placeholders})"),
                &params,
            )
            .await
            .unwrap_or_else(|e| panic!("insert id {:?} through osprey: {}", params[0], describe(&e)));
    }
    let again = client
        .query(
            format!("SELECT {COLUMNS} FROM types WHERE id > ? ORDER BY id"),
            &[Value::Int(10)],
        )
        .await
        .expect("read back");
    let got: Vec<Vec<Value>> = again
        .rows()
        .iter()
        .map(|row| {
            let mut v = row.values().to_vec();
            if let Value::Int(id) = v[0] {
                v[0] = Value::Int(id - 10);
            }
            v
        })
        .collect();
    assert_rows_eq("rows inserted with osprey params", &got, &want);

    assert_closed_loop(&c, &[&client]).await;
}
