//! What the MySQL front end keeps per client so that its statements can run on any
//! worker: the database, the tracked session variables, autocommit, and why (if at all)
//! the client is pinned to one database session.

use osprey_sql::vars::{autocommit_value, Assignment};
use osprey_sql::Code;

/// Why a client holds a pinned session beyond its transaction (the `pinned` metric's
/// `reason` label). Only `COM_RESET_CONNECTION` (or the end of the connection) unpins.
pub fn sticky_reason(sql: &str) -> Option<&'static str> {
    sticky_reason_in(&Code::of(sql))
}

/// [`sticky_reason`] of a statement's [`Code`].
pub fn sticky_reason_in(code: &Code) -> Option<&'static str> {
    sticky_given(code, || counter_query_in(code))
}

/// [`sticky_reason_in`], the statement's counter asked of `counter` only when the text
/// names `last_insert_id` ([`Facts::of`] has it already).
fn sticky_given(statement: &Code, counter: impl FnOnce() -> Option<Counter>) -> Option<&'static str> {
    let code = statement.lower();
    let has = |w: &str| code.contains(w);
    let c = code.as_bytes();
    let user_variable =
        (0..c.len()).any(|i| c[i] == b'@' && c.get(i + 1) != Some(&b'@') && (i == 0 || c[i - 1] != b'@'));
    if user_variable {
        Some("user_variable")
    } else if has("temporary") {
        Some("temporary_table")
    } else if has("get_lock") || has("lock tables") || has("lock table") || has("flush") {
        Some("lock")
    } else if has("sql_calc_found_rows") || has("found_rows") {
        Some("found_rows")
    } else if has("last_insert_id") && counter().is_none() {
        Some("last_insert_id")
    } else if statement.touches_session_state() && !only_transaction_control(code) {
        let first = code.split_whitespace().next().unwrap_or("");
        Some(match first {
            "prepare" | "execute" | "deallocate" => "prepare",
            "set" => "set",
            "call" => "call",
            "handler" => "handler",
            _ => "session_state",
        })
    } else {
        None
    }
}

/// What the front end asks of every statement before it runs it (the questions only a
/// text query can raise aside: several statements, `USE`, `SET`). A prepared statement's
/// are read once, at `COM_STMT_PREPARE`, for all its executions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// [`is_plain_end`].
    pub plain_end: bool,
    /// [`counter_query`].
    pub counter: Option<Counter>,
    /// [`sticky_reason`].
    pub sticky: Option<&'static str>,
    /// `osprey_sql::controls_session`: a transaction's control, table locks, autocommit.
    pub controls_session: bool,
}

impl Facts {
    pub fn of(code: &Code) -> Facts {
        let counter = counter_query_in(code);
        Facts {
            plain_end: is_plain_end_in(code),
            counter,
            sticky: sticky_given(code, || counter),
            controls_session: code.controls_session(),
        }
    }
}

/// `BEGIN`, `START TRANSACTION …`, `COMMIT`, `ROLLBACK`, savepoints: what the open
/// transaction (the server's status) accounts for, not sticky state.
fn only_transaction_control(code: &str) -> bool {
    let words: Vec<&str> = code.trim().trim_end_matches(';').split_whitespace().collect();
    matches!(
        words.as_slice(),
        ["begin"]
            | ["begin", "work"]
            | ["commit", ..]
            | ["rollback", ..]
            | ["savepoint", _]
            | ["release", "savepoint", _]
            | ["start", "transaction", ..]
    )
}

/// A client's session state, as its statements must see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientState {
    /// The current database (`None`: the backend's configured one).
    pub schema: Option<String>,
    /// Tracked variables, in the order they were set, each name once (autocommit aside).
    pub vars: Vec<Assignment>,
    pub autocommit: bool,
}

impl ClientState {
    /// At login: the user's or the client's database, and the client's character set when
    /// it is not the workers' (utf8mb4_general_ci).
    pub fn new(schema: Option<String>, collation: u8) -> ClientState {
        let mut vars = Vec::new();
        if let Some(names) = names_for(collation) {
            vars.push(("names".to_string(), names.to_string()));
        }
        ClientState {
            schema,
            vars,
            autocommit: true,
        }
    }

    /// The state after `assignments` (of a tracked SET), autocommit taken apart.
    pub fn with(&self, assignments: &[Assignment]) -> Option<ClientState> {
        let mut next = self.clone();
        for (name, value) in assignments {
            if name == "autocommit" {
                next.autocommit = autocommit_value(value)?;
                continue;
            }
            if osprey_sql::vars::IGNORED.contains(&name.as_str()) {
                continue;
            }
            // A character set setting replaces what SET NAMES said about it.
            let touches_names = name.starts_with("character_set_") || name == "collation_connection";
            next.vars
                .retain(|(n, _)| n != name && !(name == "names" && n.starts_with("character_set_")));
            if touches_names {
                if let Some(i) = next.vars.iter().position(|(n, _)| n == "names") {
                    // Keep the order meaningful: the NAMES first, then this change.
                    let names = next.vars.remove(i);
                    next.vars.insert(0, names);
                }
            }
            next.vars.push((name.clone(), value.clone()));
        }
        Some(next)
    }

    /// The variables a statement runs under: the tracked ones, and `autocommit = 0` when
    /// it is off (only ever in a session).
    pub fn request_vars(&self, in_session: bool) -> Vec<Assignment> {
        let mut v = self.vars.clone();
        if in_session && !self.autocommit {
            v.push(("autocommit".into(), "0".into()));
        }
        v
    }
}

/// `SET NAMES` for a client collation id other than the workers' own.
fn names_for(collation: u8) -> Option<&'static str> {
    Some(match collation {
        45 | 0 | 255 => return None,
        8 => "latin1",
        33 => "utf8mb3",
        46 => "utf8mb4 COLLATE utf8mb4_bin",
        224 => "utf8mb4 COLLATE utf8mb4_unicode_ci",
        63 => "binary",
        83 => "utf8mb3 COLLATE utf8mb3_bin",
        47 => "latin1 COLLATE latin1_bin",
        11 => "ascii",
        28 => "gbk",
        _ => return None,
    })
}

/// Plain `COMMIT` or `ROLLBACK` (no savepoint, no chain/release): outside a transaction
/// the front end answers them itself, as the server would (OK, nothing to do).
pub fn is_plain_end(sql: &str) -> bool {
    is_plain_end_in(&Code::of(sql))
}

/// [`is_plain_end`] of a statement's [`Code`].
pub fn is_plain_end_in(code: &Code) -> bool {
    let words: Vec<&str> = code.lower().trim().trim_end_matches(';').split_whitespace().collect();
    matches!(
        words.as_slice(),
        ["commit"] | ["commit", "work"] | ["rollback"] | ["rollback", "work"]
    )
}

/// What a plain `SELECT ROW_COUNT()` or `SELECT LAST_INSERT_ID()` (nothing else in it)
/// asks: the front end answers those from the client's own last OK when it is not pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    RowCount,
    LastInsertId,
}

pub fn counter_query(sql: &str) -> Option<Counter> {
    counter_query_in(&Code::of(sql))
}

/// [`counter_query`] of a statement's [`Code`].
pub fn counter_query_in(code: &Code) -> Option<Counter> {
    let code = code.lower();
    // Most statements name neither: no words to gather then.
    if !code.contains("row_count") && !code.contains("last_insert_id") {
        return None;
    }
    counter_in_words(code)
}

/// The counter a statement's lowercase code asks for, its words compared whole (the
/// fuzz target `mysql_packets` holds [`counter_query_in`]'s early answer against it).
pub fn counter_in_words(code: &str) -> Option<Counter> {
    let words: String = code
        .trim()
        .trim_end_matches(';')
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    match words.as_str() {
        "select row_count()" => Some(Counter::RowCount),
        "select last_insert_id()" => Some(Counter::LastInsertId),
        _ => None,
    }
}

/// Whether `sql` holds several statements (`;` between code), which a server without
/// multi-statements refuses. A compound statement (`BEGIN NOT ATOMIC … END`, `IF`, a loop)
/// and a stored program's body are one statement.
pub fn several_statements(sql: &str) -> bool {
    several_statements_in(&Code::of(sql))
}

/// [`several_statements`] of a statement's [`Code`].
pub fn several_statements_in(code: &Code) -> bool {
    let code = code.lower();
    // No `;` in code: one statement, whatever it is.
    if !code.contains(';') {
        return false;
    }
    several_parts(code)
}

/// [`several_statements`] of a statement's lowercase code, every `;`-separated part
/// counted (the fuzz target `mysql_packets` holds [`several_statements_in`]'s early
/// answer against it).
pub fn several_parts(code: &str) -> bool {
    let mut words = code
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty());
    let first = words.next().unwrap_or("");
    // `BEGIN NOT ATOMIC … END` is one statement; `BEGIN; …` starts a transaction. A
    // stored program's CREATE carries its body; any other CREATE ends at its `;`.
    let compound = match first {
        "begin" => words.next() == Some("not"),
        "create" | "alter" => osprey_sql::defines_program(code),
        "if" | "case" | "loop" | "while" | "repeat" | "declare" => true,
        _ => first.ends_with(':'),
    };
    !compound && code.split(';').filter(|p| !p.trim().is_empty()).count() > 1
}

/// The statements of a multi-statement query, as written (split at the `;` that are
/// code, not inside quotes or comments), blank ones left out.
pub fn statements(sql: &str) -> Vec<&str> {
    let code = osprey_sql::code_text(sql);
    let mut parts = Vec::new();
    let mut start = 0;
    // `code_text` keeps every byte's place, so a `;` of the code is one of `sql`.
    for (i, _) in code.match_indices(';').chain(std::iter::once((sql.len(), ""))) {
        let part = &sql[start..i];
        if !part.trim().is_empty() {
            parts.push(part);
        }
        start = (i + 1).min(sql.len());
    }
    parts
}

/// `USE db` as the front end reads it: the database name, unquoted.
pub fn use_schema(sql: &str) -> Option<String> {
    use_schema_in(sql, &Code::of(sql))
}

/// [`use_schema`] with the statement's code already read (`code`: `Code::of(sql)`).
pub fn use_schema_in(sql: &str, code: &Code) -> Option<String> {
    let code = code.text();
    let trimmed = code.trim();
    let head = trimmed.get(..4)?;
    if !head.eq_ignore_ascii_case("use ") {
        return None;
    }
    let start = code.len() - code.trim_start().len() + 4;
    let name = sql.get(start..)?.trim().trim_end_matches(';').trim();
    match name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) {
        Some(quoted) if !quoted.is_empty() => Some(quoted.replace("``", "`")),
        Some(_) => None,
        None => (!name.is_empty() && !name.contains(|c: char| c.is_whitespace() || c == '`')).then(|| name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_pins_and_why() {
        assert_eq!(sticky_reason("SELECT @a := 1"), Some("user_variable"));
        assert_eq!(
            sticky_reason("CREATE TEMPORARY TABLE t (a int)"),
            Some("temporary_table")
        );
        assert_eq!(sticky_reason("SELECT GET_LOCK('x', 1)"), Some("lock"));
        assert_eq!(sticky_reason("SELECT SQL_CALC_FOUND_ROWS * FROM t"), Some("found_rows"));
        assert_eq!(sticky_reason("PREPARE s FROM 'SELECT 1'"), Some("prepare"));
        assert_eq!(sticky_reason("SELECT @@version, 'a@b'"), None);
        assert_eq!(sticky_reason("UPDATE t SET a = 1"), None);
        assert_eq!(sticky_reason("BEGIN"), None);
        assert_eq!(sticky_reason("START TRANSACTION READ ONLY"), None);
        assert_eq!(sticky_reason("BEGIN NOT ATOMIC SELECT 1; END"), Some("session_state"));
    }

    #[test]
    fn a_statements_facts() {
        let facts = |sql: &str| Facts::of(&Code::of(sql));
        assert!(facts("rollback work;").plain_end);
        assert!(!facts("ROLLBACK TO SAVEPOINT a").plain_end);
        assert_eq!(facts("SELECT ROW_COUNT()").counter, Some(Counter::RowCount));
        assert_eq!(facts("select last_insert_id() ;").counter, Some(Counter::LastInsertId));
        // The counter asked once: the sticky reason takes the same answer.
        assert_eq!(facts("select last_insert_id() ;").sticky, None);
        let used = facts("SELECT LAST_INSERT_ID() + 1");
        assert_eq!((used.counter, used.sticky), (None, Some("last_insert_id")));
        assert_eq!(facts("SELECT @a := 1").sticky, Some("user_variable"));
        assert!(facts("START TRANSACTION READ ONLY").controls_session);
        assert!(facts("SET autocommit = 0").controls_session);
        let plain = facts("SELECT c FROM sbtest1 WHERE id = ?");
        assert_eq!(
            (plain.plain_end, plain.counter, plain.sticky, plain.controls_session),
            (false, None, None, false)
        );
        // The early answers: no counter's name in code, no `;` in code.
        assert_eq!(counter_query("SELECT 'row_count()'"), None);
        assert_eq!(counter_query("/* row_count() */ SELECT 1"), None);
        assert_eq!(counter_query("SELECT LAST_INSERT_ID() + 1"), None);
        assert_eq!(sticky_reason("SELECT LAST_INSERT_ID() + 1"), Some("last_insert_id"));
        assert!(!several_statements("SELECT 1 /* ; SELECT 2 */"));
        assert!(!several_statements("SELECT ';'"));
        assert!(several_statements("/*!40101 SET @a = 1; SET @b = 2 */"));
    }

    #[test]
    fn state_follows_sets() {
        let s = ClientState::new(None, 45);
        let s = s
            .with(&[("autocommit".into(), "OFF".into()), ("sql_mode".into(), "''".into())])
            .unwrap();
        assert!(!s.autocommit);
        assert_eq!(s.request_vars(false), vec![("sql_mode".into(), "''".into())]);
        assert_eq!(s.request_vars(true).last().unwrap().1, "0");
        let s = s.with(&[("sql_mode".into(), "'ANSI'".into())]).unwrap();
        assert_eq!(s.vars, vec![("sql_mode".into(), "'ANSI'".into())]);
        assert!(s.with(&[("autocommit".into(), "maybe".into())]).is_none());
        assert_eq!(ClientState::new(None, 8).vars[0].1, "latin1");
    }

    #[test]
    fn use_and_plain_ends() {
        assert_eq!(use_schema("USE sbtest"), Some("sbtest".into()));
        assert_eq!(use_schema("use `my db`;"), Some("my db".into()));
        assert_eq!(use_schema("user()"), None);
        assert!(several_statements("SELECT 1; SELECT 2"));
        assert!(!several_statements("SELECT 1;"));
        assert!(!several_statements("SELECT ';'"));
        assert!(!several_statements("BEGIN NOT ATOMIC SELECT 1; SELECT 2; END"));
        assert!(several_statements("BEGIN; UPDATE t SET a = 1; COMMIT"));
        assert!(several_statements("begin work; select 1"));
        assert!(several_statements("CREATE TABLE x (a INT); DROP TABLE y"));
        assert!(!several_statements(
            "CREATE PROCEDURE p() BEGIN SELECT 1; SELECT 2; END"
        ));
        assert!(!several_statements(
            "create definer = root@localhost trigger t before insert on x for each row begin set @a = 1; set @b = 2; end"
        ));
        assert_eq!(
            statements("SELECT ';' AS a; /* ; */ UPDATE t SET b = 'x;y' ;; SELECT 2"),
            vec!["SELECT ';' AS a", " /* ; */ UPDATE t SET b = 'x;y' ", " SELECT 2"]
        );
        assert_eq!(statements("SELECT 'é;'"), vec!["SELECT 'é;'"]);
        assert!(is_plain_end("COMMIT"));
        assert!(is_plain_end("rollback work;"));
        assert!(!is_plain_end("ROLLBACK TO SAVEPOINT a"));
        assert_eq!(counter_query("select  ROW_COUNT() ;"), Some(Counter::RowCount));
        assert_eq!(counter_query("SELECT LAST_INSERT_ID()"), Some(Counter::LastInsertId));
        assert_eq!(counter_query("SELECT LAST_INSERT_ID() + 1"), None);
        assert_eq!(sticky_reason("SELECT LAST_INSERT_ID()"), None);
        assert_eq!(sticky_reason("SELECT LAST_INSERT_ID(5)"), Some("last_insert_id"));
    }
}
