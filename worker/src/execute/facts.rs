//! What a statement's text alone tells the executor, scanned once per text and kept:
//! the same few statements come back thousands of times a second (a point select with
//! other parameters), and scanning each again (comments, quotes, top-level statements,
//! placeholders) cost the worker about a twentieth of its CPU per request.

use foldhash::HashMap;
use std::cell::RefCell;
use std::rc::Rc;

use osprey_sql::{
    controls_session, ends_sessions, is_plain_select, loads_local_file, placeholders, placeholders_depend_on_server,
    touches_session_state,
};

/// Texts kept at most; past it the memory starts again (a workload of ever-new texts
/// gains nothing from it).
const MAX_TEXTS: usize = 4096;
/// Longer texts are scanned every time: the memory stays under `MAX_TEXTS × MAX_LEN`.
const MAX_LEN: usize = 2048;

/// The facts of one statement text.
#[derive(Debug)]
pub(crate) struct Facts {
    /// Transaction control or table locks (refused as a statement).
    pub(crate) controls_session: bool,
    /// May leave session state behind (the session scan).
    pub(crate) touches_state: bool,
    /// A single plain SELECT (MariaDB bounds its time itself).
    pub(crate) plain_select: bool,
    /// Commits a GTID the OK packets may not show (see `commits_out_of_sight`).
    pub(crate) out_of_sight: bool,
    /// Refused whatever its parameters (LOCAL INFILE, KILL CONNECTION).
    refused: Option<&'static str>,
    /// `?` markers the text has, and whether that count is final (else the server's is).
    markers: usize,
    markers_final: bool,
    /// The first `:name` the text has (refused next to parameters), or `Err` when the text
    /// mixes both kinds in a way the parser rejects.
    named: Result<Option<String>, ()>,
}

impl Facts {
    pub(crate) fn scan(sql: &str) -> Facts {
        let refused = if loads_local_file(sql) {
            Some(
                "LOAD DATA/XML LOCAL INFILE is not supported: the worker has no client files to send \
                 (LOAD DATA INFILE without LOCAL reads files on the database server)",
            )
        } else if ends_sessions(sql) {
            Some(
                "KILL CONNECTION / KILL USER is not supported: the pool's database sessions are Osprey's \
                 (KILL QUERY is; to stop a request of your own, cancel it)",
            )
        } else {
            None
        };
        let named = match mysql_common::named_params::ParsedNamedParams::parse(sql.as_bytes()) {
            Ok(parsed) => Ok(parsed.params().first().map(|p| String::from_utf8_lossy(p).into_owned())),
            Err(_) => Err(()),
        };
        Facts {
            controls_session: controls_session(sql),
            touches_state: touches_session_state(sql),
            plain_select: is_plain_select(sql),
            out_of_sight: osprey_sql::commits_out_of_sight(sql),
            refused,
            markers: placeholders(sql),
            markers_final: !placeholders_depend_on_server(sql),
            named,
        }
    }

    /// The checks of the text against `params` parameters (the packet size aside).
    /// What is refused whatever the parameters (a statement only described,
    /// `REQUEST.prepare_only`).
    pub(crate) fn check_text(&self) -> Result<(), String> {
        self.refused.map_or(Ok(()), |why| Err(why.into()))
    }

    pub(crate) fn check_params(&self, params: usize) -> Result<(), String> {
        // The worker has no files to give (osprey-wire answers a request the scan misses
        // with an empty file, which breaks the session if statements are pipelined behind
        // it). Every session of the pool belongs to one database user, who may kill any of
        // them: one KILL would take a worker down (and its own id, this one).
        if let Some(why) = self.refused {
            return Err(why.into());
        }
        // Only where the text alone decides the count: otherwise the server's own count
        // does (the prepared statement's, checked in `run_statement`; without params the
        // text goes as it is, and a `?` the server does see is its syntax error, which
        // keeps the session).
        if self.markers != params && self.markers_final {
            return Err(format!(
                "the statement has {} parameter markers (?) but {params} parameters were sent",
                self.markers
            ));
        }
        if params > 0 {
            // Kept from the mysql_async days (which rewrote `:name` into a named
            // parameter): clients were told `:name` is refused next to `?` markers, and
            // still are.
            match &self.named {
                Ok(None) => {}
                Ok(Some(name)) => {
                    return Err(format!(
                        "`:{name}` in a statement with parameters would be taken as a named parameter; only \
                         positional ? markers are supported (write `: {name}` with a space if it is not a parameter)",
                    ))
                }
                Err(()) => {
                    return Err(
                        "the statement mixes ? markers with `:name` (named parameters are not supported)".into(),
                    )
                }
            }
        }
        Ok(())
    }
}

/// The facts of the texts seen lately. One task uses it (the executor's): no lock.
#[derive(Debug, Default)]
pub(crate) struct Known(RefCell<HashMap<Box<str>, Rc<Facts>>>);

impl Known {
    /// The facts of `sql`, scanned now if not known.
    pub(crate) fn of(&self, sql: &str) -> Rc<Facts> {
        if sql.len() > MAX_LEN {
            return Rc::new(Facts::scan(sql));
        }
        if let Some(f) = self.0.borrow().get(sql) {
            return f.clone();
        }
        let facts = Rc::new(Facts::scan(sql));
        let mut map = self.0.borrow_mut();
        if map.len() >= MAX_TEXTS {
            map.clear();
        }
        map.insert(sql.into(), facts.clone());
        facts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_text_gives_what_the_scans_give() {
        let known = Known::default();
        for sql in [
            "SELECT c FROM sbtest1 WHERE id = ?",
            "BEGIN",
            "SET @x = 1",
            "CALL p(?)",
            "LOAD DATA LOCAL INFILE 'x' INTO TABLE t",
            "KILL CONNECTION 5",
            "SELECT :name, ?",
            "SELECT '?' FROM t WHERE a = ?",
        ] {
            // The second time from memory.
            for _ in 0..2 {
                let f = known.of(sql);
                assert_eq!(f.controls_session, controls_session(sql), "{sql}");
                assert_eq!(f.touches_state, touches_session_state(sql), "{sql}");
                assert_eq!(f.plain_select, is_plain_select(sql), "{sql}");
                assert_eq!(f.out_of_sight, osprey_sql::commits_out_of_sight(sql), "{sql}");
            }
        }
        assert!(known.of("BEGIN").controls_session);
        assert!(known.of("CALL p(?)").out_of_sight);
        let point = known.of("SELECT c FROM sbtest1 WHERE id = ?");
        assert!(point.check_params(1).is_ok());
        assert!(point
            .check_params(2)
            .unwrap_err()
            .contains("1 parameter markers (?) but 2"));
        assert!(known.of("SELECT '?' FROM t WHERE a = ?").check_params(1).is_ok());
        assert!(known
            .of("SELECT :name, ?")
            .check_params(1)
            .unwrap_err()
            .contains("`:name`"));
        assert!(known.of("SELECT :name").check_params(0).is_ok());
        assert!(known
            .of("KILL CONNECTION 5")
            .check_params(0)
            .unwrap_err()
            .contains("KILL CONNECTION"));
        assert!(known
            .of("LOAD DATA LOCAL INFILE 'x' INTO TABLE t")
            .check_params(0)
            .unwrap_err()
            .contains("LOCAL INFILE"));
    }

    #[test]
    fn the_memory_is_bounded() {
        let known = Known::default();
        for i in 0..MAX_TEXTS + 10 {
            known.of(&format!("SELECT {i}"));
        }
        assert!(known.0.borrow().len() <= MAX_TEXTS);
        let long = format!("SELECT '{}'", "x".repeat(MAX_LEN));
        known.of(&long);
        assert!(!known.0.borrow().contains_key(long.as_str()));
    }
}
