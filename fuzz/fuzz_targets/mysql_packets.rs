//! The MySQL front end's input paths (`osprey-mysql`): a client's handshake response and
//! `COM_CHANGE_USER`, a
//! `COM_STMT_EXECUTE` and `COM_STMT_SEND_LONG_DATA` body for a statement of 0 to 8
//! parameters, and a query's text through what the front end reads from it (SET, USE,
//! pins, several statements).
//! Input: `[params, bytes…]`; the bytes are each of those in turn.
#![no_main]

use osprey_mysql::handshake::{parse_change_user, parse_response};
use osprey_mysql::prepared::Statements;
use osprey_mysql::state::{self, ClientState};
use osprey_protocol::Column;
use osprey_sql::vars::{self, Set};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let _ = parse_response(rest);
    let _ = parse_change_user(rest, u32::from(first) << 8 | u32::from(first) << 12);
    check_execute(first, rest);
    let sql = String::from_utf8_lossy(rest);
    check_text(&sql, first);
    // Query text made UTF-8: unchanged when it was, and only ever valid UTF-8 (a String).
    if let Some(text) = osprey_mysql::text::utf8_query(rest) {
        if let Ok(orig) = std::str::from_utf8(rest) {
            assert_eq!(text, orig);
        }
    }
});

fn check_execute(first: u8, body: &[u8]) {
    let n = usize::from(first % 9);
    let param = Column {
        name: "?".into(),
        table: String::new(),
        column_type: 0xFD,
        flags: 0,
        charset: 63,
        length: 0,
        decimals: 0,
    };
    let mut st = Statements::default();
    let id = st
        .add("SELECT ?".into(), vec![param; n], vec![])
        .expect("one statement fits");
    let mut execute = id.to_le_bytes().to_vec();
    execute.extend_from_slice(body);
    if let Ok(e) = st.execute(&execute) {
        assert_eq!(e.id, id);
        assert_eq!(e.values.len(), n, "one value per parameter");
        assert!(
            e.blob.iter().all(|&i| usize::from(i) < n),
            "blob indexes within the parameters"
        );
    }
    // Long data for parameter 0, then an execute that takes it in.
    let mut long = id.to_le_bytes().to_vec();
    long.extend_from_slice(&[0, 0]);
    long.extend_from_slice(body);
    let _ = st.long_data(&long, 1 << 16);
    let _ = st.execute(&execute);
    let _ = st.reset(id);
}

/// What the front end reads from a query, and the promise between the two sides of
/// `vars`: every assignment `parse_set` calls tracked passes the worker's check (or is one
/// of the ignored connection timeouts, which the client state drops), so a SET the front
/// end accepts can never make every later statement fail at the worker.
fn check_text(sql: &str, collation: u8) {
    let code = osprey_sql::Code::of(sql);
    let _ = state::Facts::of(&code);
    let _ = state::use_schema_in(sql, &code);
    let _ = state::is_plain_end_in(&code);
    // The two questions that answer early (no counter's name, no `;` in the code) give
    // what the whole reading gives.
    assert_eq!(
        state::several_statements_in(&code),
        state::several_parts(code.lower()),
        "{sql:?}"
    );
    assert_eq!(
        state::counter_query_in(&code),
        state::counter_in_words(code.lower()),
        "{sql:?}"
    );
    if let Some(Set::Tracked(assignments)) = vars::parse_set(sql) {
        for (name, value) in &assignments {
            let ok = vars::check(name, value).is_ok();
            let ignored = vars::IGNORED.contains(&name.as_str());
            assert!(
                ok != ignored,
                "{sql:?}: {name} = {value}: check {ok}, ignored {ignored}"
            );
        }
        if let Some(next) = ClientState::new(None, collation).with(&assignments) {
            for (name, value) in next.request_vars(true) {
                assert!(vars::check(&name, &value).is_ok(), "{sql:?}: sent {name} = {value}");
            }
        }
    }
}
