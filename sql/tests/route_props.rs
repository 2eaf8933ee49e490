//! Properties of the classifier on arbitrary text: it never panics, is deterministic,
//! ignores ASCII case, and a hint at the front always decides.

use osprey_sql::classify::{classify, Hint, Route, REASONS};
use osprey_sql::Piece;
use proptest::prelude::*;

const TOKENS: &[&str] = &[
    "SELECT",
    "select",
    "WITH",
    "SHOW",
    "EXPLAIN",
    "SET",
    "STATEMENT",
    "HELP",
    "INSERT",
    "UPDATE",
    "DELETE",
    "FOR",
    "SHARE",
    "LOCK",
    "IN",
    "INTO",
    "NEXT",
    "VALUE",
    "ANALYZE",
    "MASTER",
    "GET_LOCK",
    "last_insert_id",
    "nextval",
    "SLEEP",
    "(",
    ")",
    ";",
    ".",
    ":=",
    ":",
    "=",
    "@a",
    "'",
    "\"",
    "`",
    "\\",
    "/*",
    "*/",
    "/*!",
    "/*!50000",
    "/*M!",
    "--",
    "-- ",
    "#",
    "\n",
    "osprey:primary",
    "osprey:replica",
    "osprey",
    "é",
    "1",
];

/// Text made of the tokens the classifier and the lexer treat specially, glued with or
/// without spaces, so that quotes, comments and keywords meet in every order.
fn sqlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        4 => prop::sample::select(TOKENS).prop_map(String::from),
        1 => "[a-z_]{1,4}",
    ];
    (prop::collection::vec(token, 0..24), any::<bool>()).prop_map(|(v, spaced)| v.join(if spaced { " " } else { "" }))
}

fn check(sql: &str) {
    let d = classify(sql);
    assert!(REASONS.contains(&d.why), "{sql:?}: {d:?}");
    assert_eq!(classify(sql), d, "not deterministic: {sql:?}");
    assert_eq!(classify(&sql.to_ascii_uppercase()), d, "upper case changed {sql:?}");
    assert_eq!(classify(&sql.to_ascii_lowercase()), d, "lower case changed {sql:?}");
    match d.hint {
        Some(Hint::Primary) => assert_eq!(d.route, Route::Primary),
        Some(Hint::Replica) => assert_eq!(d.route, Route::Replica),
        None => assert_eq!(d.route == Route::Replica, d.why == "read", "{sql:?}: {d:?}"),
    }
    for prefix in [
        "/* osprey:primary */",
        "/*osprey:primary*/ ",
        "-- osprey:primary\n",
        "# OSPREY : PRIMARY\n",
    ] {
        let p = classify(&format!("{prefix}{sql}"));
        assert_eq!(
            (p.route, p.hint),
            (Route::Primary, Some(Hint::Primary)),
            "{prefix}{sql:?}"
        );
    }
    let r = classify(&format!("/* osprey:replica */{sql}"));
    if d.hint == Some(Hint::Primary) {
        assert_eq!(r, d, "{sql:?}");
    } else {
        assert_eq!((r.route, r.hint), (Route::Replica, Some(Hint::Replica)), "{sql:?}");
    }
    // After a complete statement, any code makes it several statements: Primary, unless
    // the text carries a hint (read the same way: the prefix leaves the lexer in code).
    let several = classify(&format!("SELECT 1; {sql}"));
    let has_code = osprey_sql::pieces(sql).any(|(p, r)| match p {
        Piece::Quoted(_) => true,
        Piece::Code => sql[r].bytes().any(|b| !b" \t\n\r\x0b\x0c".contains(&b)),
        _ => false,
    });
    match d.hint {
        Some(_) => assert_eq!(several.hint, d.hint, "{sql:?}"),
        None if has_code => assert_eq!(several.route, Route::Primary, "SELECT 1; {sql:?}"),
        None => assert_eq!(several.route, Route::Replica, "SELECT 1; {sql:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn arbitrary_text(sql in "\\PC{0,80}") {
        check(&sql);
    }

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn sql_like_text(sql in sqlish()) {
        check(&sql);
    }

    /// A plain comment anywhere between tokens changes nothing (it is not code), unless
    /// it lands inside a quote or comment, where it is not a comment at all.
    #[test]
    fn a_plain_comment_after_a_read_changes_nothing(sql in sqlish()) {
        let d = classify(&sql);
        let code = osprey_sql::code_text(&sql);
        // Only where the text ends in code: a newline then a comment is a comment there.
        let ends_in_code = osprey_sql::pieces(&sql).last().is_none_or(|(p, _)| p == Piece::Code);
        if ends_in_code && !code.contains("/*") {
            prop_assert_eq!(classify(&format!("{sql}\n/* plain */")), d);
        }
    }
}
