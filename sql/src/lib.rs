//! The SQL text scanner shared by the worker (session-state scan) and the dispatcher's
//! classifier (`classify`) and digest (`digest`): one place that knows MySQL's quoting
//! and comment rules.
//!
//! It assumes the default `sql_mode` (backslash escapes, `"` strings); under
//! `NO_BACKSLASH_ESCAPES` or `ANSI_QUOTES` it may misread a quote, which is why the
//! worker offers `session_reset = "always"`.

pub mod classify;
mod digest;
pub mod vars;
pub use digest::{digest, digest_hash, digest_id, parse_digest_id, Digest, KEYWORDS};

/// Statements that control the transaction or take table locks, in any of the
/// top-level `;`-separated statements of `sql`: with statement-level pooling (like
/// PgBouncer's statement mode) they would leave state behind for the next client, or
/// break a batch's all-or-nothing. `CREATE`/`ALTER` (a routine's body) are not looked into.
pub fn controls_session(sql: &str) -> bool {
    controls_session_in(&code_text(sql))
}

/// [`controls_session`] of a statement's [`code_text`].
fn controls_session_in(code: &str) -> bool {
    top_level_statements(code).any(|part| {
        let mut words = part
            .split(|c: char| c.is_whitespace() || c == '=' || c == '(')
            .filter(|w| !w.is_empty());
        let first = words.next().unwrap_or("");
        let mut second = words.next().unwrap_or("");
        let is = |w: &str, lit: &str| w.eq_ignore_ascii_case(lit);
        if is(first, "rollback") && is(second, "work") {
            second = words.next().unwrap_or("");
        }
        if is(first, "begin") {
            !is(second, "not")
        } else if is(first, "start") {
            is(second, "transaction")
        } else if is(first, "commit") || is(first, "xa") {
            true
        } else if is(first, "rollback") {
            !is(second, "to")
        } else if is(first, "lock") || is(first, "unlock") {
            is(second, "table") || is(second, "tables")
        } else if is(first, "set") {
            part.as_bytes()
                .windows(10)
                .any(|w| w.eq_ignore_ascii_case(b"autocommit"))
        } else {
            false
        }
    })
}

/// Whether a commit of the statement may report its GTID where the OK packets do not
/// show it (a procedure or compound statement that commits inside: the server may report
/// the variable change on a packet it sends before, or not at all): `CALL`, `EXECUTE` and
/// compound statements, in any top-level statement of `sql`. The worker reads
/// `@@last_gtid` after them.
pub fn commits_out_of_sight(sql: &str) -> bool {
    top_level_statements(&code_text(sql)).any(|st| {
        let first = st.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
        matches!(
            first.as_str(),
            "call" | "execute" | "begin" | "if" | "case" | "loop" | "while" | "repeat"
        )
    })
}

/// Whether running `sql` in a session may commit a transaction, so that a worker lost
/// while it ran leaves the outcome unknown: `COMMIT`, a statement that commits implicitly
/// (DDL, `BEGIN`/`START TRANSACTION`, table locks, `SET autocommit`, `LOAD DATA`, table
/// maintenance, `CALL`/`EXECUTE` and compound statements, which may commit inside), and,
/// outside a transaction (`in_transaction` false, so under autocommit), anything but a
/// plain read. Errs on the side of "may": an unknown outcome is never a false promise.
pub fn may_commit(sql: &str, in_transaction: bool) -> bool {
    // Every `;`-separated part (a stored program's body too: a false "may" is harmless).
    let implicit = code_text(sql).split(';').any(|st| {
        let mut words = st
            .split(|c: char| c.is_whitespace() || c == '(')
            .filter(|w| !w.is_empty());
        let first = words.next().unwrap_or("").to_ascii_lowercase();
        match first.as_str() {
            "commit" | "begin" | "start" | "alter" | "create" | "drop" | "rename" | "truncate" | "grant" | "revoke"
            | "lock" | "unlock" | "load" | "analyze" | "optimize" | "repair" | "check" | "flush" | "reset"
            | "install" | "uninstall" | "call" | "execute" | "xa" | "if" | "case" | "loop" | "while" | "repeat"
            | "cache" | "purge" => true,
            "set" => {
                let lower = st.to_ascii_lowercase();
                lower.contains("autocommit") || lower.contains("password")
            }
            _ => false,
        }
    });
    implicit || (!in_transaction && classify::classify(sql).route != classify::Route::Replica)
}

/// `sql` with everything inside quotes, backticks and comments (delimiters
/// included) blanked out, so that keywords and `;` found in it are code. The
/// inside of an executable comment (`/*! … */`, `/*M! … */`) is code: the
/// server runs it. Assumes the default sql_mode (backslash escapes, `"` strings).
pub fn code_text(sql: &str) -> String {
    let mut mask = sql.as_bytes().to_vec();
    for (piece, range) in pieces(sql) {
        if piece != Piece::Code {
            mask[range].fill(b' ');
        }
    }
    // Only whole characters were blanked (every byte of one inside a quote or a
    // comment, none in code), so this is still UTF-8: checked, not copied again.
    String::from_utf8(mask).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A statement's code read once: its [`code_text`] and that in ASCII lowercase. The
/// MySQL front end asks several questions of each statement (a transaction? sticky
/// state? `USE`, `SET`, a counter?); each free function here would lex the text again.
#[derive(Debug, Clone)]
pub struct Code {
    code: String,
    lower: String,
}

impl Code {
    pub fn of(sql: &str) -> Code {
        let code = code_text(sql);
        let lower = code.to_ascii_lowercase();
        Code { code, lower }
    }

    /// [`code_text`]: byte for byte the statement, quotes and comments blanked.
    pub fn text(&self) -> &str {
        &self.code
    }

    /// [`Code::text`] in ASCII lowercase (same length, same places).
    pub fn lower(&self) -> &str {
        &self.lower
    }

    /// [`controls_session`] of this statement.
    pub fn controls_session(&self) -> bool {
        controls_session_in(&self.code)
    }

    /// [`touches_session_state`] of this statement.
    pub fn touches_session_state(&self) -> bool {
        touches_session_state_in(&self.lower)
    }
}

/// What a stretch of SQL text is, as the server's lexer sees it (default sql_mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Code the server parses, the inside of executable comments included.
    Code,
    /// A `'…'` or `"…"` string or a `` `…` `` identifier, quotes included. A doubled quote
    /// (`'it''s'`) comes out as two adjacent pieces; an unterminated one runs to the end.
    Quoted(u8),
    /// A comment (`# …`, `-- …`, `/* … */`), delimiters included (a line comment's newline too).
    Comment,
    /// The opener (`/*!NNNNN`, `/*M!NNNNN`) or the closer (`*/`) of an executable comment.
    Executable,
}

/// The pieces of `sql` in order, covering it whole: each [`Piece`] with its byte range.
/// Ranges begin and end at ASCII bytes (or the ends), so they are on character boundaries.
/// The one lexer of this crate: [`code_text`] and [`digest`] are both built on it.
pub fn pieces(sql: &str) -> Pieces<'_> {
    Pieces {
        b: sql.as_bytes(),
        i: 0,
        in_executable: false,
    }
}

/// The iterator of [`pieces`].
pub struct Pieces<'a> {
    b: &'a [u8],
    i: usize,
    in_executable: bool,
}

impl Pieces<'_> {
    /// The non-code piece starting at `i`, if one does: its kind, its end, and whether
    /// an executable comment is open after it.
    #[inline]
    fn special(&self, i: usize) -> Option<(Piece, usize, bool)> {
        let b = self.b;
        let c = b[i];
        let next = b.get(i + 1).copied();
        match c {
            b'\'' | b'"' | b'`' => {
                let mut j = i + 1;
                while j < b.len() {
                    if b[j] == b'\\' && c != b'`' {
                        j += 2;
                    } else if b[j] == c {
                        return Some((Piece::Quoted(c), j + 1, self.in_executable));
                    } else {
                        j += 1;
                    }
                }
                Some((Piece::Quoted(c), b.len(), self.in_executable))
            }
            b'#' => Some((Piece::Comment, line_end(b, i), self.in_executable)),
            // `--` starts a comment only before whitespace or a control character.
            b'-' if next == Some(b'-')
                && b.get(i + 2)
                    .is_none_or(|c| c.is_ascii_whitespace() || c.is_ascii_control()) =>
            {
                Some((Piece::Comment, line_end(b, i), self.in_executable))
            }
            b'/' if next == Some(b'*') => {
                let rest = &b[i + 2..];
                let opener = if rest.starts_with(b"!") {
                    Some(1)
                } else if rest.len() >= 2 && rest[0].eq_ignore_ascii_case(&b'm') && rest[1] == b'!' {
                    Some(2)
                } else {
                    None
                };
                match opener {
                    Some(n) if !self.in_executable => {
                        // `/*!` (or `/*M!`) and the version digits; the rest runs.
                        let digits = rest[n..].iter().take_while(|c| c.is_ascii_digit()).count();
                        Some((Piece::Executable, i + 2 + n + digits, true))
                    }
                    _ => {
                        // The `*` belongs to the opening: `/*/` does not close it.
                        let end = rest
                            .windows(2)
                            .position(|w| w == b"*/")
                            .map_or(b.len(), |p| i + 2 + p + 2);
                        Some((Piece::Comment, end, self.in_executable))
                    }
                }
            }
            b'*' if next == Some(b'/') && self.in_executable => Some((Piece::Executable, i + 2, false)),
            _ => None,
        }
    }
}

/// Bytes at which a non-code piece may begin.
static MAY_START_PIECE: [bool; 256] = {
    let mut t = [false; 256];
    let starts = b"'\"`#-/*";
    let mut i = 0;
    while i < starts.len() {
        t[starts[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether a non-code piece may begin with byte `c` (quotes, `#`, `-`, `/`, `*`).
#[inline]
pub(crate) fn may_start_piece(c: u8) -> bool {
    MAY_START_PIECE[c as usize]
}

impl Pieces<'_> {
    /// For a scanner that walks the code itself (the digest): the non-code piece that
    /// starts at byte `i`, if one does, with its end; the lexer's state moves past it.
    /// `i` must be where the code before it ends (the lexer's state is that of the text
    /// up to `i`), as it is when every piece is taken from here, in order.
    pub(crate) fn piece_at(&mut self, i: usize) -> Option<(Piece, usize)> {
        let (piece, end, open) = self.special(i)?;
        self.in_executable = open;
        self.i = end;
        Some((piece, end))
    }
}

/// The end of the line comment starting at `i`: after its newline, or the end of the text.
fn line_end(b: &[u8], i: usize) -> usize {
    b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p + 1)
}

impl Iterator for Pieces<'_> {
    type Item = (Piece, std::ops::Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        let start = self.i;
        if start >= self.b.len() {
            return None;
        }
        if let Some((piece, end, open)) = self.special(start) {
            self.i = end;
            self.in_executable = open;
            return Some((piece, start..end));
        }
        let b = self.b;
        let mut i = start + 1;
        loop {
            i += b[i.min(b.len())..]
                .iter()
                .position(|&c| MAY_START_PIECE[c as usize])
                .unwrap_or(b.len().saturating_sub(i));
            if i >= b.len() || self.special(i).is_some() {
                break;
            }
            i += 1;
        }
        self.i = i;
        Some((Piece::Code, start..i))
    }
}

/// The code (see [`code_text`]) of each statement of `sql`, split at `;`.
/// A CREATE/ALTER of a stored program (procedure, function, trigger, event, package)
/// carries its body, which is not run now: it is one statement, and left out. Any other
/// CREATE/ALTER (a table, a view, …) ends at its `;` like every statement.
pub fn top_level_statements(code: &str) -> impl Iterator<Item = &str> {
    let first_word = |s: &str| s.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
    let whole = first_word(code);
    let parts: Vec<&str> = if (whole == "create" || whole == "alter") && defines_program(code) {
        vec![code]
    } else {
        code.split(';').collect()
    };
    parts.into_iter().filter(move |p| {
        let w = first_word(p);
        !(w == "create" || w == "alter")
    })
}

/// Whether `code` (starting with CREATE or ALTER) defines a stored program:
/// `CREATE [OR REPLACE] [DEFINER = user] [AGGREGATE] PROCEDURE|FUNCTION|TRIGGER|EVENT|PACKAGE`.
/// The user may be several words (`u@10.0.0.1`), so the keyword is looked for among the
/// first words once the second is one that only a program's CREATE has there.
pub fn defines_program(code: &str) -> bool {
    let program = |w: &str| {
        ["procedure", "function", "trigger", "event", "package"]
            .iter()
            .any(|k| w.eq_ignore_ascii_case(k))
    };
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .take(12)
        .collect();
    match words.get(1) {
        Some(w) if program(w) => true,
        Some(w) if ["or", "definer", "aggregate"].iter().any(|k| w.eq_ignore_ascii_case(k)) => {
            words[2..].iter().any(|w| program(w))
        }
        _ => false,
    }
}

/// Whether `sql` may leave session state behind for the next request on this
/// session: session or user variables (`SET`, `@var`), the current database,
/// temporary tables, user locks (`GET_LOCK`), SQL-level prepared statements,
/// open HANDLERs, or a procedure that may do any of these. Errs on the side of
/// a reset: reading a variable counts too.
pub fn touches_session_state(sql: &str) -> bool {
    touches_session_state_in(&code_text(sql).to_ascii_lowercase())
}

/// [`touches_session_state`] of a statement's [`code_text`] in ASCII lowercase.
fn touches_session_state_in(code: &str) -> bool {
    let c = code.as_bytes();
    // `@name`, not `@@system_variable`.
    let user_variable =
        (0..c.len()).any(|i| c[i] == b'@' && c.get(i + 1) != Some(&b'@') && (i == 0 || c[i - 1] != b'@'));
    user_variable
        || code.split(';').any(|statement| {
            let mut words = statement
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty());
            let first = words.next();
            matches!(
                first,
                Some(
                    "set" | "use" | "prepare" | "execute" | "deallocate" | "call" | "handler"
                    // session locks (LOCK TABLES itself is refused)
                    | "flush" | "backup" | "lock" | "unlock"
                    // MariaDB compound statements outside stored programs: their
                    // inner statements are not at the start of a `;` piece
                    | "begin" | "if" | "case" | "loop" | "while" | "repeat"
                )
            ) || first
                .into_iter()
                .chain(words)
                .any(|w| w == "temporary" || w == "get_lock")
        })
}

/// How many `?` parameter markers `sql` holds in code (not in quotes, backticks or
/// comments). The server counts the same way when it prepares a statement, so a
/// request can be checked against its parameters before it reaches the driver — except
/// where [`placeholders_depend_on_server`].
pub fn placeholders(sql: &str) -> usize {
    code_text(sql).bytes().filter(|&b| b == b'?').count()
}

/// Whether the server may count the `?` markers of `sql` differently from
/// [`placeholders`]: the text holds a versioned executable comment (`/*!NNNNN`, which a
/// server older than NNNNN skips, or `/*M!`, which MySQL skips), or a backslash (under
/// `NO_BACKSLASH_ESCAPES` it does not escape: `'C:\'` ends there). Looked for anywhere in
/// the text, quotes included: a false `true` only leaves the count to the server.
pub fn placeholders_depend_on_server(sql: &str) -> bool {
    let b = sql.as_bytes();
    b.contains(&b'\\')
        || b.windows(4).any(|w| {
            w[0] == b'/'
                && w[1] == b'*'
                && ((w[2] == b'!' && w[3].is_ascii_digit()) || (w[2] | 0x20 == b'm' && w[3] == b'!'))
        })
}

/// Whether a top-level statement of `sql` is `LOAD DATA|XML ... LOCAL INFILE`: the
/// server would then ask the client for a file of its own. Executable comments count
/// as code, as everywhere here.
pub fn loads_local_file(sql: &str) -> bool {
    // Runs on every request: most hold no `local` at all, which needs no scan of the code.
    if !contains_word_ignore_case(sql, b"local") {
        return false;
    }
    let code = code_text(sql);
    code.split(';').any(|statement| {
        let mut words = statement
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty());
        words.next().is_some_and(|w| w.eq_ignore_ascii_case("load"))
            && words
                .take_while(|w| !w.eq_ignore_ascii_case("infile"))
                .any(|w| w.eq_ignore_ascii_case("local"))
    })
}

/// Whether a top-level statement of `sql` is a `KILL` that ends sessions rather than a
/// statement: `KILL [HARD|SOFT] [CONNECTION] id`, `KILL ... USER name`. All of a pool's
/// sessions belong to one database user, who may kill any of them; `KILL [HARD|SOFT]
/// QUERY ...` only stops a statement and is not counted.
pub fn ends_sessions(sql: &str) -> bool {
    // Runs on every request: most hold no `kill` at all, which needs no scan of the code.
    if !contains_word_ignore_case(sql, b"kill") {
        return false;
    }
    let code = code_text(sql);
    let kills = top_level_statements(&code).any(|statement| {
        let mut words = statement
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty());
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("kill")) {
            return false;
        }
        let mut next = words.next().unwrap_or("");
        if next.eq_ignore_ascii_case("hard") || next.eq_ignore_ascii_case("soft") {
            next = words.next().unwrap_or("");
        }
        !next.eq_ignore_ascii_case("query")
    });
    kills
}

/// Whether `word` (lowercase ASCII) occurs in `sql` in any case, anywhere (quotes and
/// comments included): `false` rules out the keyword in the code.
fn contains_word_ignore_case(sql: &str, word: &[u8]) -> bool {
    let first = word[0];
    sql.as_bytes()
        .windows(word.len())
        .any(|w| w[0] | 0x20 == first && w.eq_ignore_ascii_case(word))
}

/// A single SELECT that `SET STATEMENT ... FOR` can wrap as is.
pub fn is_plain_select(sql: &str) -> bool {
    let s = sql.trim_start();
    let body = s.trim_end().trim_end_matches(';');
    s.len() > 7
        && s.as_bytes()[..6].eq_ignore_ascii_case(b"select")
        && s.as_bytes()[6].is_ascii_whitespace()
        && !body.contains(';')
}

#[cfg(test)]
mod may_commit_tests {
    use super::may_commit;

    #[test]
    fn commits_and_implicit_commits_are_seen_in_and_out_of_a_transaction() {
        for sql in [
            "COMMIT",
            "commit work",
            "START TRANSACTION",
            "BEGIN",
            "CREATE TABLE t (a INT)",
            "ALTER TABLE t ADD b INT",
            "TRUNCATE t",
            "LOCK TABLES t WRITE",
            "SET autocommit = 1",
            "CALL p()",
            "SELECT 1; COMMIT",
            "/* x */ COMMIT",
        ] {
            assert!(may_commit(sql, true), "{sql}");
            assert!(may_commit(sql, false), "{sql}");
        }
    }

    #[test]
    fn inside_a_transaction_plain_statements_commit_nothing() {
        for sql in [
            "UPDATE t SET a = 1",
            "INSERT INTO t VALUES (1)",
            "DELETE FROM t",
            "SELECT * FROM t FOR UPDATE",
            "SAVEPOINT s",
            "ROLLBACK TO SAVEPOINT s",
            "ROLLBACK",
            "SELECT 'COMMIT'",
            "SET @a = 1",
        ] {
            assert!(!may_commit(sql, true), "{sql}");
        }
    }

    #[test]
    fn outside_a_transaction_a_write_commits_and_a_read_does_not() {
        assert!(may_commit("UPDATE t SET a = 1", false));
        assert!(may_commit("INSERT INTO t VALUES (1)", false));
        assert!(!may_commit("SELECT * FROM t", false));
        assert!(!may_commit("SELECT 'COMMIT'", false));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn commits_out_of_sight_are_procedures_execute_and_compound_statements() {
        for sql in [
            "CALL p()",
            "call p(1)",
            "SELECT 1; CALL p()",
            "EXECUTE s",
            "BEGIN NOT ATOMIC INSERT INTO t VALUES (1); SELECT 1; END",
            "/* x */ CALL p()",
        ] {
            assert!(super::commits_out_of_sight(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT 'CALL p()'",
            "SELECT 1 -- CALL p()",
            "UPDATE t SET `call` = 1",
            "CREATE PROCEDURE p() BEGIN CALL q(); END",
            "SELECT recall FROM t",
        ] {
            assert!(!super::commits_out_of_sight(sql), "{sql}");
        }
    }

    use super::*;

    #[test]
    fn session_control_statements() {
        for sql in [
            "BEGIN",
            "begin;",
            "START TRANSACTION READ ONLY",
            "LOCK TABLES t WRITE",
            "CREATE TABLE t (a INT); START TRANSACTION",
            "unlock tables",
            "set autocommit=0",
            "SET @@session.autocommit=0",
            "SET LOCAL autocommit = 0",
            "set @@local.AUTOCOMMIT=0",
            "XA START 'x'",
            "COMMIT",
            "rollback",
            "SELECT 1; SET autocommit=0",
            "SELECT 1; LOCK TABLES t WRITE",
            "/*!40000 LOCK TABLES t WRITE */",
            "/* why */ LOCK TABLES t WRITE",
            "/*!40000 SET autocommit=0 */",
        ] {
            assert!(controls_session(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "set @a = 1",
            "INSERT INTO begin_t VALUES (1)",
            "startx transaction",
            "ROLLBACK TO SAVEPOINT a",
            "ROLLBACK WORK TO SAVEPOINT a",
            "SELECT 'x'",
            "BEGIN NOT ATOMIC SELECT 1; END",
            "INSERT INTO notes VALUES ('fixed; commit later')",
            "INSERT INTO notes VALUES (\"a; begin the test\")",
            "SELECT 1 -- a; commit b",
            "SELECT 1 /* ; rollback */",
            "CREATE PROCEDURE p() BEGIN START TRANSACTION; UPDATE t SET a = 1; COMMIT; END",
            "SELECT * FROM commit_log WHERE lock_id = 1",
        ] {
            assert!(!controls_session(sql), "{sql}");
        }
    }

    #[test]
    fn session_state_statements() {
        for sql in [
            "SET @x = 1",
            "set names utf8mb4",
            "SET SESSION sql_mode = ''",
            "set time_zone = '+05:00'",
            "SELECT @x := 5",
            "SELECT 1 INTO @v",
            "SELECT @v",
            "USE mysql",
            "CREATE TEMPORARY TABLE t (a INT)",
            "create or replace temporary table t (a INT)",
            "DROP TEMPORARY TABLE t",
            "SELECT GET_LOCK('l', 0)",
            "select get_lock ( 'l' , 0 )",
            "PREPARE s FROM 'SELECT 1'",
            "EXECUTE s",
            "CALL p()",
            "SELECT 1; SET @a = 2",
            "SELECT 1;set @a=2",
            "  /* hint */ SET @a = 2",
            "SET STATEMENT max_statement_time=1 FOR SELECT 1",
            "HANDLER t OPEN",
            // mysqldump headers: executable comments run
            "/*!40101 SET time_zone='+05:00' */",
            "/*!40014 SET FOREIGN_KEY_CHECKS=0 */;",
            "/*M!100100 SET sql_mode = '' */",
            // MariaDB compound statements
            "IF 1 THEN SET time_zone='+05:00'; END IF",
            "BEGIN NOT ATOMIC SET SESSION sql_mode=''; END",
            // session locks
            "FLUSH TABLES WITH READ LOCK",
            "BACKUP STAGE START",
            // `--` without a space is arithmetic, not a comment
            "SELECT 2--1;SET time_zone='+05:00'",
        ] {
            assert!(touches_session_state(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "SELECT 'a@b.example'",
            "SELECT `odd@name` FROM t",
            "SELECT @@version, @@session.time_zone",
            "SELECT 1 -- SET @x = 1",
            "SELECT 1 # USE mysql",
            "SELECT 1 /*/ ; SET @x = 1 */",
            "SELECT 'it''s; set @x = 1'",
            "SELECT 'a\\'; set @x = 1'",
            "INSERT INTO t VALUES ('set @x', \"get_lock(1)\")",
            "UPDATE t SET a = 1 WHERE id = ?",
            "INSERT INTO t SET a = 1",
            "SELECT temporary_flag, get_lock_count FROM t",
            "SELECT * FROM users WHERE email = ?",
        ] {
            assert!(!touches_session_state(sql), "{sql}");
        }
    }

    #[test]
    fn placeholder_markers() {
        assert_eq!(placeholders("SELECT ?"), 1);
        assert_eq!(placeholders("SELECT ?, ? FROM t WHERE a = ?"), 3);
        assert_eq!(placeholders("SELECT '?', \"?\", `?` -- ?\n /* ? */ # ?"), 0);
        assert_eq!(placeholders("SELECT 'it''s ?', ?"), 1);
        assert_eq!(placeholders("SELECT 'a\\'?', ?"), 1);
        assert_eq!(placeholders("SELECT /*! ? */ 1"), 1);
        assert_eq!(placeholders("SELECT 1"), 0);
    }

    #[test]
    fn placeholder_counts_the_server_decides() {
        for sql in [
            "SELECT ? /*!99999 , ? */",
            "SELECT /*!50700 ? */ 1",
            "SELECT /*M!100500 ? */ 1",
            "SELECT /*m! ? */ 1",
            "SELECT 'C:\\', ?",
            "SELECT ? FROM t WHERE p LIKE 'a\\_b'",
        ] {
            assert!(placeholders_depend_on_server(sql), "{sql}");
        }
        for sql in [
            "SELECT ?",
            "SELECT /*! ? */ 1",
            "SELECT /* 1 */ ?, '/*'",
            "SELECT '?', `?`",
        ] {
            assert!(!placeholders_depend_on_server(sql), "{sql}");
        }
    }

    #[test]
    fn local_infile() {
        for sql in [
            "LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE t",
            "load data low_priority local infile 'x' into table t",
            "LOAD XML CONCURRENT LOCAL INFILE 'x' INTO TABLE t",
            "SELECT 1; LOAD DATA LOCAL INFILE 'x' INTO TABLE t",
            "/*!50000 LOAD DATA LOCAL INFILE 'x' INTO TABLE t */",
            "  LOAD\nDATA\tLOCAL INFILE 'x' INTO TABLE t",
        ] {
            assert!(loads_local_file(sql), "{sql}");
        }
        for sql in [
            "LOAD DATA INFILE '/tmp/x' INTO TABLE local",
            "SELECT 'LOAD DATA LOCAL INFILE'",
            "SELECT 1 -- ; LOAD DATA LOCAL INFILE 'x' INTO TABLE t",
            "INSERT INTO t VALUES ('load', 'local')",
            "SELECT local FROM load_data",
        ] {
            assert!(!loads_local_file(sql), "{sql}");
        }
    }

    #[test]
    fn session_kills() {
        for sql in [
            "KILL 42",
            "kill connection 42",
            "KILL HARD CONNECTION 42",
            "KILL SOFT 42",
            "KILL USER app",
            "KILL CONNECTION_ID()",
            "SELECT 1; KILL 7",
            "/*!KILL 7 */",
            "CREATE TEMPORARY TABLE t (a INT); KILL CONNECTION_ID()",
            "create table t (event int); kill 7",
            "ALTER TABLE t ADD c INT; KILL 7",
            "CREATE VIEW v AS SELECT 1; KILL 7",
        ] {
            assert!(ends_sessions(sql), "{sql}");
        }
        for sql in [
            "KILL QUERY 42",
            "kill hard query 42",
            "KILL QUERY ID 42",
            "SELECT 'KILL 7'",
            "SELECT kill_count FROM t",
            "SELECT 1 -- ; KILL 7",
            "CREATE PROCEDURE p() BEGIN KILL 7; END",
            "create or replace definer = admin@10.0.0.1 procedure p() begin kill 7; end",
            "CREATE DEFINER=`a`@`%` TRIGGER tr BEFORE INSERT ON t FOR EACH ROW BEGIN KILL 7; END",
            "CREATE AGGREGATE FUNCTION f(x INT) RETURNS INT BEGIN KILL 7; RETURN 1; END",
            "CREATE EVENT e ON SCHEDULE EVERY 1 HOUR DO BEGIN KILL 7; END",
            "ALTER EVENT e DO BEGIN KILL 7; END",
        ] {
            assert!(!ends_sessions(sql), "{sql}");
        }
    }

    #[test]
    fn plain_selects() {
        assert!(is_plain_select("SELECT 1"));
        assert!(is_plain_select("  select\n* from t;"));
        assert!(!is_plain_select("SELECT 1; DROP TABLE t"));
        assert!(!is_plain_select("/* x */ SELECT 1"));
        assert!(!is_plain_select("SELECTION"));
        assert!(!is_plain_select("UPDATE t SET a=1"));
        assert!(!is_plain_select("select"));
        assert!(!is_plain_select("séléct 1"));
    }
}
