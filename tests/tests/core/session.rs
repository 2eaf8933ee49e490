//! Statement-level pooling and session state, through the whole system.

use osprey_client::Value;

use crate::{assert_closed_loop, client, cluster, describe};

/// `[backend] session_reset = "always"` reaches the workers: a user variable set by a stored
/// function inside a plain `SELECT` (which the worker's text scan cannot see, so `auto`
/// would let it through) does not reach the next request on the same, only worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_reset_always_reaches_the_workers() {
    let c = cluster("[pool]\nsize = 1\n[backend]\nsession_reset = \"always\"\n").await;
    let client = client(&c).await;
    client
        .execute(
            "CREATE FUNCTION sets_a_variable() RETURNS INT DETERMINISTIC NO SQL \
             BEGIN SET @hidden = 42; RETURN 1; END",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("create function: {}", describe(&e)));
    let before = client.query("SELECT CONNECTION_ID()", &[]).await.unwrap();
    client.query("SELECT sets_a_variable()", &[]).await.unwrap();
    let r = client
        .query("SELECT @hidden, ? + 1, CONNECTION_ID()", &[Value::Int(41)])
        .await
        .unwrap();
    assert_eq!(r.rows()[0].get::<Option<i64>>(0).unwrap(), None, "a variable leaked");
    assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), 42);
    // One worker, one session: the reset kept the connection.
    assert_eq!(
        r.rows()[0].get::<i64>(2).unwrap(),
        before.rows()[0].get::<i64>(0).unwrap()
    );
    assert_closed_loop(&c, &[&client]).await;
}

/// A prepared statement's column definitions are encoded once per statement on the worker
/// (its `COLUMNS` memo) and still follow the table: after an `ALTER TABLE` the same
/// statement, on the same session, shows the new columns and values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_follow_a_schema_change_on_a_prepared_statement() {
    let c = cluster("[pool]\nsize = 1\n").await;
    let client = client(&c).await;
    for sql in [
        "CREATE TABLE memo_t (id INT PRIMARY KEY, a INT)",
        "INSERT INTO memo_t VALUES (1, 10)",
    ] {
        client
            .execute(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    }
    let select = "SELECT * FROM memo_t WHERE id = ?";
    let names = |r: &osprey_client::QueryResult| r.columns().iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    for _ in 0..3 {
        let r = client.query(select, &[Value::Int(1)]).await.unwrap();
        assert_eq!(names(&r), ["id", "a"]);
        assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), 10);
    }
    client
        .execute(
            "ALTER TABLE memo_t CHANGE a renamed BIGINT, ADD COLUMN b VARCHAR(10) DEFAULT 'x'",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("alter: {}", describe(&e)));
    for _ in 0..3 {
        let r = client.query(select, &[Value::Int(1)]).await.unwrap();
        assert_eq!(names(&r), ["id", "renamed", "b"]);
        assert_eq!(r.rows()[0].get::<i64>(1).unwrap(), 10);
        assert_eq!(r.rows()[0].get::<String>(2).unwrap(), "x");
        // BIGINT now: the type code follows too.
        assert_eq!(r.columns()[1].column_type, 8);
    }
    assert_closed_loop(&c, &[&client]).await;
}
