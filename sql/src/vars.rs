//! Session variables a front end can keep for a client without pinning it to one database
//! session: a `SET` made only of assignments to [`TRACKED`] variables with literal values is
//! understood here, remembered by the front end, and applied (only where it differs) on
//! whichever worker runs the client's next statement.
//!
//! The worker checks every assignment again with [`check`] before it builds its `SET`, so
//! that nothing but a tracked name and a plain literal reaches a shared session.

/// The session variables a front end tracks (lower case). Anything else in a `SET` pins
/// the client to one database session. Every one of them is restored by a session reset.
pub const TRACKED: &[&str] = &[
    "autocommit",
    "character_set_client",
    "character_set_connection",
    "character_set_results",
    "collation_connection",
    "sql_mode",
    "time_zone",
    "tx_isolation",
    "transaction_isolation",
    "tx_read_only",
    "transaction_read_only",
    "sql_select_limit",
    "max_statement_time",
    "max_execution_time",
    "group_concat_max_len",
    "sql_auto_is_null",
    "sql_safe_updates",
    "foreign_key_checks",
    "unique_checks",
    "innodb_lock_wait_timeout",
    "lock_wait_timeout",
    "sql_quote_show_create",
    "sql_big_selects",
    "big_tables",
    "div_precision_increment",
    "lc_time_names",
    "sql_notes",
    "sql_warnings",
    "default_storage_engine",
    "optimizer_switch",
    "join_buffer_size",
    "sort_buffer_size",
    "tmp_table_size",
    "max_heap_table_size",
    "long_query_time",
    "names",
];

/// Connection timeouts a client may set (drivers do, at connect): acknowledged and not
/// applied. The front end owns the client connection's timeouts (`[mysql]`), and applied
/// to shared workers they would close the pool's own database sessions.
pub const IGNORED: &[&str] = &[
    "wait_timeout",
    "interactive_timeout",
    "net_read_timeout",
    "net_write_timeout",
];

/// `sql_mode` flags that change how the server quotes (`ANSI_QUOTES`, and the modes that
/// imply it) or escapes (`NO_BACKSLASH_ESCAPES`): Osprey's SQL scanner assumes the
/// default, so a client that sets one is pinned (its own session), never tracked.
const QUOTING_MODES: &[&str] = &[
    "NO_BACKSLASH_ESCAPES",
    "ANSI",
    "ORACLE",
    "MSSQL",
    "DB2",
    "POSTGRESQL",
    "MAXDB",
];

/// One `name = value` of a tracked `SET`, as the worker applies it: `name` lower case
/// from [`TRACKED`], `value` a literal as written (a quoted string, a number or a word).
pub type Assignment = (String, String);

/// What a `SET` statement means for a front end that keeps session state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Set {
    /// Only tracked variables, only literal values: apply these in order.
    Tracked(Vec<Assignment>),
    /// A `SET` that is not fully understood (user variables, `GLOBAL`, an expression, a
    /// variable not tracked, `SET TRANSACTION` for the next transaction only): pin.
    Other,
}

/// Whether `name = value` may be applied on a shared session: a tracked name and a
/// literal value. The message says what is wrong.
pub fn check(name: &str, value: &str) -> Result<(), String> {
    if !TRACKED.contains(&name) {
        return Err(format!("{name:?} is not a tracked session variable"));
    }
    let plain = match name {
        // `SET NAMES cs [COLLATE coll]`
        "names" => match split_collate(value) {
            (cs, Some(coll)) => is_literal(cs) && is_literal(coll),
            (cs, None) => is_literal(cs),
        },
        _ => is_literal(value),
    };
    if !plain {
        return Err(format!("the value of {name} is not a plain literal: {value:?}"));
    }
    if name == "sql_mode" && changes_quoting(value) {
        return Err(format!("sql_mode {value}: a quoting mode is not tracked (it pins)"));
    }
    Ok(())
}

/// `cs COLLATE coll` apart (any case, single spaces as [`parse_set`] writes it).
fn split_collate(value: &str) -> (&str, Option<&str>) {
    match value.to_ascii_lowercase().find(" collate ") {
        Some(i) => (value[..i].trim(), Some(value[i + " collate ".len()..].trim())),
        None => (value, None),
    }
}

fn changes_quoting(sql_mode: &str) -> bool {
    let upper = sql_mode.to_ascii_uppercase();
    QUOTING_MODES.iter().any(|m| upper.contains(m))
}

/// The statement that applies `assignments` on a session (`SET NAMES` for `names`, one
/// `SET SESSION` for the rest), or `None` when there is nothing to apply. The caller has
/// [`check`]ed every assignment.
pub fn apply_statement(assignments: &[Assignment]) -> Option<String> {
    let mut parts = Vec::new();
    for (name, value) in assignments {
        if name == "names" {
            parts.push(format!("NAMES {value}"));
        } else {
            parts.push(format!("SESSION {name} = {value}"));
        }
    }
    (!parts.is_empty()).then(|| format!("SET {}", parts.join(", ")))
}

/// Reads a `SET` statement (`sql` holds one statement, comments allowed): whether every
/// assignment is of a tracked variable to a literal. `None`: not a `SET` at all.
pub fn parse_set(sql: &str) -> Option<Set> {
    parse_set_code(sql, &crate::code_text(sql))
}

/// [`parse_set`] with the statement's code already read (`code`: `Code::of(sql)`).
pub fn parse_set_in(sql: &str, code: &crate::Code) -> Option<Set> {
    parse_set_code(sql, code.text())
}

fn parse_set_code(sql: &str, code: &str) -> Option<Set> {
    let (c, b) = (code.as_bytes(), sql.as_bytes());
    // The statement's end: trailing blanks and `;` that are code (a blank in `code` may be
    // a quoted literal, which stays).
    let mut end = b.len();
    while end > 0 && c[end - 1] == b[end - 1] && (b[end - 1] == b';' || b[end - 1].is_ascii_whitespace()) {
        end -= 1;
    }
    let lead = code.len() - code.trim_start().len();
    let rest = strip_word(code.get(lead..end)?, "set")?;
    let start = end - rest.len();
    let text = &sql[start..end];
    if crate::code_text(text).contains(';') {
        return Some(Set::Other);
    }
    Some(parse_assignments(text).map_or(Set::Other, Set::Tracked))
}

fn parse_assignments(text: &str) -> Option<Vec<Assignment>> {
    let mut out = Vec::new();
    for part in split_commas(text)? {
        let part = part.trim();
        if let Some(names) = strip_word(part, "names") {
            let names = names.trim();
            let (charset, collate) = split_collate(names);
            if !is_literal(charset) || collate.is_some_and(|c| !is_literal(c)) || is_default(charset) {
                return None;
            }
            let value = match collate {
                Some(c) => format!("{charset} COLLATE {c}"),
                None => charset.to_string(),
            };
            out.push(("names".to_string(), value));
            continue;
        }
        if let Some(cs) = strip_word(part, "character").and_then(|r| strip_word(r.trim_start(), "set")) {
            let cs = cs.trim();
            if !is_literal(cs) || is_default(cs) {
                return None;
            }
            // SET CHARACTER SET x: client and results x, connection the database's.
            out.push(("character_set_client".into(), cs.to_string()));
            out.push(("character_set_results".into(), cs.to_string()));
            continue;
        }
        let eq = part.find('=')?;
        let (lhs, value) = (part[..eq].trim(), part[eq + 1..].trim());
        let value = value.strip_prefix('=').map_or(value, str::trim); // `:=`
        let lhs = lhs.strip_suffix(':').unwrap_or(lhs).trim();
        let lower = lhs.to_ascii_lowercase();
        let name = if let Some(n) = lower
            .strip_prefix("@@session.")
            .or_else(|| lower.strip_prefix("@@local."))
        {
            n.to_string()
        } else if let Some(n) = lower.strip_prefix("@@") {
            if n.contains('.') {
                return None;
            }
            n.to_string()
        } else if let Some(n) = strip_word(&lower, "session").or_else(|| strip_word(&lower, "local")) {
            n.trim().to_string()
        } else if lower.starts_with('@') || strip_word(&lower, "global").is_some() {
            return None;
        } else {
            lower
        };
        let name = name.trim_matches('`').to_string();
        if IGNORED.contains(&name.as_str()) && is_literal(value) {
            out.push((name, value.to_string()));
            continue;
        }
        if name == "names" || check(&name, value).is_err() {
            return None;
        }
        out.push((name, value.to_string()));
    }
    (!out.is_empty()).then_some(out)
}

/// `text` split at top-level commas (outside quotes and parentheses); `None` if it has
/// parentheses at all (an expression).
fn split_commas(text: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let mut from = 0;
    for (piece, range) in crate::pieces(text) {
        if piece != crate::Piece::Code {
            continue;
        }
        for (i, b) in text.as_bytes()[range.clone()].iter().enumerate() {
            match b {
                b'(' | b')' => return None,
                b',' => {
                    parts.push(&text[from..range.start + i]);
                    from = range.start + i + 1;
                }
                _ => {}
            }
        }
    }
    parts.push(&text[from..]);
    Some(parts)
}

/// `s` without its first word if that is `word` (any case), else `None`.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let s = s.trim_start();
    let head = s.get(..word.len())?;
    let rest = &s[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(|c: char| c.is_whitespace() || c == '@' || c == '`'))
        .then_some(rest)
}

fn is_default(v: &str) -> bool {
    v.eq_ignore_ascii_case("default")
}

/// A plain literal: a quoted string with no backslash and no quote of its kind inside, a
/// number, or a word of letters, digits and `_` (ON, OFF, DEFAULT, utf8mb4, READ-COMMITTED
/// quoted). Nothing else may reach a shared session.
pub fn is_literal(v: &str) -> bool {
    let b = v.as_bytes();
    match b.first() {
        None => false,
        Some(&q @ (b'\'' | b'"')) => {
            b.len() >= 2 && b[b.len() - 1] == q && !b[1..b.len() - 1].iter().any(|&c| c == q || c == b'\\')
        }
        Some(_) => {
            let num = v.strip_prefix('-').unwrap_or(v);
            (!num.is_empty() && num.bytes().all(|c| c.is_ascii_digit() || c == b'.'))
                || v.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        }
    }
}

/// `autocommit`'s value as a bool, if it is one MySQL accepts.
pub fn autocommit_value(v: &str) -> Option<bool> {
    let v = v.trim_matches(|c| c == '\'' || c == '"');
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" => Some(true),
        "0" | "off" | "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(sql: &str) -> Vec<Assignment> {
        match parse_set(sql) {
            Some(Set::Tracked(a)) => a,
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn tracked_sets() {
        assert_eq!(tracked("SET autocommit=0"), vec![("autocommit".into(), "0".into())]);
        assert_eq!(
            tracked("set @@session.sql_mode = 'TRADITIONAL', SESSION time_zone='+00:00';"),
            vec![
                ("sql_mode".into(), "'TRADITIONAL'".into()),
                ("time_zone".into(), "'+00:00'".into())
            ]
        );
        assert_eq!(
            tracked("SET NAMES utf8mb4 COLLATE utf8mb4_bin"),
            vec![("names".into(), "utf8mb4 COLLATE utf8mb4_bin".into())]
        );
        assert_eq!(
            tracked("/* driver */ SET NAMES 'latin1'"),
            vec![("names".into(), "'latin1'".into())]
        );
        assert_eq!(
            tracked("SET @@autocommit := 1"),
            vec![("autocommit".into(), "1".into())]
        );
        assert_eq!(
            tracked("SET tx_isolation='READ-COMMITTED'"),
            vec![("tx_isolation".into(), "'READ-COMMITTED'".into())]
        );
    }

    #[test]
    fn what_pins() {
        for sql in [
            "SET @x = 1",
            "SET GLOBAL sql_mode=''",
            "SET @@global.sql_mode=''",
            "SET sql_mode = CONCAT(@@sql_mode, ',ANSI')",
            "SET session_track_system_variables='*'",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET time_zone = 'a\\' ; DROP TABLE t; --'",
            "SET autocommit=0; SELECT 1",
            "SET NAMES DEFAULT",
            "SET sql_mode = @x",
            "SET sql_mode = 'ANSI'",
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES'",
            "SET sql_mode = 'oracle'",
        ] {
            assert_eq!(parse_set(sql), Some(Set::Other), "{sql}");
        }
        assert_eq!(parse_set("SELECT 1"), None);
        assert_eq!(parse_set("SETTLE"), None);
    }

    #[test]
    fn names_with_a_collation_pass_the_workers_check() {
        let a = tracked("SET NAMES utf8mb4 COLLATE utf8mb4_unicode_ci");
        assert_eq!(check(&a[0].0, &a[0].1), Ok(()));
        assert!(check("names", "utf8mb4 COLLATE x; DROP TABLE t").is_err());
        assert!(check("names", "utf8mb4 COLLATE").is_err());
        assert_eq!(
            tracked("SET wait_timeout = 28800, sql_mode = 'STRICT_ALL_TABLES'").len(),
            2
        );
        assert!(check("wait_timeout", "1").is_err(), "acknowledged, never applied");
    }

    #[test]
    fn the_worker_check_refuses_what_is_not_a_literal() {
        assert!(check("autocommit", "0").is_ok());
        assert!(check("sql_mode", "'a' , @@x").is_err());
        assert!(check("sql_mode", "'it''s'").is_err());
        assert!(check("x", "1").is_err());
        assert!(check("time_zone", "'+00:00'").is_ok());
    }
}
