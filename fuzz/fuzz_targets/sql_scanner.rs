//! The SQL text scanner (`osprey-sql`): `code_text`, `controls_session`,
//! `touches_session_state`, `placeholders`, `is_plain_select`, `digest`, `classify::classify`
//! and their invariants.
//! Input: SQL text (bytes that are not UTF-8 are replaced, as no SQL reaches the
//! scanner without passing the UTF-8 check).
#![no_main]

use osprey_sql::classify::{classify, Hint, Route, REASONS};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let sql = String::from_utf8_lossy(data);
    osprey_fuzz::check_sql(&sql);
    check_route(&sql);
});

/// The classifier's promises: a reason from the fixed set, the same answer every time and
/// in any ASCII case, a hint in front always decides (primary over replica).
fn check_route(sql: &str) {
    let d = classify(sql);
    assert!(REASONS.contains(&d.why), "why {:?} for {sql:?}", d.why);
    assert_eq!(classify(sql), d, "classify of {sql:?} is not deterministic");
    assert_eq!(classify(&sql.to_ascii_uppercase()), d, "classify: case of {sql:?}");
    assert_eq!(classify(&sql.to_ascii_lowercase()), d, "classify: case of {sql:?}");
    match d.hint {
        Some(Hint::Primary) => assert_eq!(d.route, Route::Primary),
        Some(Hint::Replica) => assert_eq!(d.route, Route::Replica),
        None => assert_eq!(d.route == Route::Replica, d.why == "read", "{sql:?}: {d:?}"),
    }
    let p = classify(&format!("/* osprey:primary */{sql}"));
    assert_eq!(
        (p.route, p.hint),
        (Route::Primary, Some(Hint::Primary)),
        "primary hint before {sql:?}"
    );
    let r = classify(&format!("-- osprey:replica\n{sql}"));
    let want = if d.hint == Some(Hint::Primary) {
        Hint::Primary
    } else {
        Hint::Replica
    };
    assert_eq!(r.hint, Some(want), "replica hint before {sql:?}");
}
