//! Read/write classification: whether one request's SQL may run on a replica.
//!
//! The dispatcher calls [`classify`] on every request's `sql` (single form; a batch goes to
//! the primary without asking). It reads the text once with the crate's lexer
//! ([`crate::pieces`]), default `sql_mode`, and stops looking at the code as soon as the
//! answer is Primary (comments are still read, for hints). `docs/ROUTING.md` says the
//! same for users.
//!
//! # Rules
//! Code is everything outside quotes and comments; the inside of an executable comment
//! (`/*! … */`, `/*!NNNNN … */`, `/*M! … */`) is code, plain comments are not. Words are
//! matched without regard to ASCII case.
//!
//! 1. **Hints** in any comment (not in a string): `osprey:primary` or `osprey:replica`
//!    (`/* osprey:primary */`, `-- osprey:replica`, `# osprey:primary`, spaces allowed
//!    around the `:`, other text in the same comment allowed) decide the route whatever the
//!    statement is: the caller takes responsibility, as with the REQUEST's `read_only` flag.
//!    Primary wins when both appear; an unknown `osprey:` word is ignored.
//! 2. **Replica** for one statement that only reads:
//!    `SELECT`, `WITH … SELECT`, a parenthesised SELECT, UNION/EXCEPT/INTERSECT of those,
//!    `VALUES …`, `TABLE t` (MySQL 8), `SHOW …`, `EXPLAIN`/`DESCRIBE`/`DESC` (plans are not
//!    run), `HELP …`, `SET STATEMENT … FOR <one of these>`. A trailing `;` is fine.
//! 3. **Primary** for everything else, and for a read (rule 2, HELP aside) whose code has:
//!    - a locking clause: `FOR UPDATE`, `FOR SHARE`, `LOCK IN SHARE MODE` (why `locking read`);
//!    - `INTO` (`OUTFILE`, `DUMPFILE`, `@var`, a variable) (why `into`);
//!    - a variable assignment `:=` (why `variable assignment`);
//!    - a call (`name (`, spaces and comments allowed before the `(`, the name plain,
//!      backquoted or double-quoted) of a function with a side effect or whose answer is
//!      the primary's own state: [`SIDE_EFFECT_FUNCTIONS`], or `NEXT VALUE FOR`,
//!      `PREVIOUS VALUE FOR`, `seq.NEXTVAL`, `seq.CURRVAL` (why `side-effect function`).
//!      A name without `(` (a column `t.last_insert_id`) is no call. `SLEEP` and
//!      `BENCHMARK` are allowed: they change nothing, and cost a replica what they would
//!      cost the primary;
//!    - a schema-qualified call `db.f(…)`: always a stored function, which may write
//!      (why `stored function`). An unqualified stored function looks like a built-in one
//!      and is not detected: use the hint;
//!    - a bare `INSERT`/`UPDATE`/`DELETE`/`REPLACE` word in a SELECT or WITH
//!      (`WITH c AS (…) DELETE …`) (why `write`);
//!    - `ANALYZE` (`EXPLAIN ANALYZE`, MariaDB's `ANALYZE stmt`: they run the statement)
//!      (why `analyze`).
//!
//!    `SHOW MASTER STATUS`, `SHOW BINLOG …`, `SHOW BINARY LOGS`, `SHOW MASTER LOGS` go to the
//!    primary: they describe the server that answers, and the one that matters is the
//!    primary (why `primary status`).
//!    Several statements in one text (code after the first `;`) go to the primary
//!    (why `several statements`), as does a text with no statement or an unknown first word
//!    (why `unknown`). A read whose first word is inside a versioned executable comment
//!    (`/*!NNNNN SELECT */`, `/*M! … */`), which some servers skip, is `unknown` too.
//!
//! Not detected (use the hint): stored functions called without a schema, and reads of
//! values that differ per server (`@@server_id`, `@@read_only`, `@@gtid_binlog_pos`). Under
//! `ANSI_QUOTES` or `NO_BACKSLASH_ESCAPES` the lexer may misread a quote, as everywhere in
//! this crate.

use crate::{pieces, Piece};

/// Where a request may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// An eligible replica (or the primary, when none is).
    Replica,
    /// The primary.
    Primary,
}

/// A routing hint found in a comment of the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// `osprey:primary`.
    Primary,
    /// `osprey:replica`.
    Replica,
}

/// The classifier's answer for one request's SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub route: Route,
    /// Why, one of [`REASONS`]: stable, for metrics labels and the status view.
    pub why: &'static str,
    /// The hint the text carried, if any (it decided the route: `why` is `"hint"`).
    pub hint: Option<Hint>,
}

/// The values of [`Decision::why`].
pub mod reason {
    /// A single statement that only reads.
    pub const READ: &str = "read";
    /// An `osprey:primary` / `osprey:replica` comment decided.
    pub const HINT: &str = "hint";
    /// Changes data, schema, privileges or the server (`INSERT`, `CREATE`, `GRANT`, `FLUSH`, …).
    pub const WRITE: &str = "write";
    /// Session or transaction state (`SET`, `USE`, `BEGIN`, `COMMIT`, `LOCK`, `HANDLER`, `PREPARE`, …).
    pub const SESSION: &str = "session";
    /// Runs code that may write (`CALL`, `DO`).
    pub const CALL: &str = "call";
    /// `FOR UPDATE`, `FOR SHARE`, `LOCK IN SHARE MODE`.
    pub const LOCKING_READ: &str = "locking read";
    /// `SELECT … INTO`.
    pub const INTO: &str = "into";
    /// `@var := …`.
    pub const ASSIGNMENT: &str = "variable assignment";
    /// A call of one of [`super::SIDE_EFFECT_FUNCTIONS`], or a sequence's next/previous value.
    pub const SIDE_EFFECT: &str = "side-effect function";
    /// A schema-qualified call `db.f(…)`.
    pub const STORED_FUNCTION: &str = "stored function";
    /// `ANALYZE …`, `EXPLAIN ANALYZE …`: the statement runs.
    pub const ANALYZE: &str = "analyze";
    /// `SHOW MASTER STATUS`, `SHOW BINLOG …`, `SHOW BINARY LOGS`.
    pub const PRIMARY_STATUS: &str = "primary status";
    /// Code after the first `;`.
    pub const SEVERAL: &str = "several statements";
    /// Empty, an unknown first word, or a read that a server may skip.
    pub const UNKNOWN: &str = "unknown";
}

/// Every value [`Decision::why`] takes (for registering metrics labels up front).
pub const REASONS: &[&str] = &[
    reason::READ,
    reason::HINT,
    reason::WRITE,
    reason::SESSION,
    reason::CALL,
    reason::LOCKING_READ,
    reason::INTO,
    reason::ASSIGNMENT,
    reason::SIDE_EFFECT,
    reason::STORED_FUNCTION,
    reason::ANALYZE,
    reason::PRIMARY_STATUS,
    reason::SEVERAL,
    reason::UNKNOWN,
];

/// Functions whose call sends a read to the primary: user locks (the primary's lock
/// table), the session's last statement, sequences (which advance), replication
/// positions and waits (the answer is the server's own), and the server's files.
pub const SIDE_EFFECT_FUNCTIONS: &[&str] = &[
    "BINLOG_GTID_POS",
    "FOUND_ROWS",
    "GET_LOCK",
    "IS_FREE_LOCK",
    "IS_USED_LOCK",
    "LASTVAL",
    "LAST_INSERT_ID",
    "LOAD_FILE",
    "MASTER_GTID_WAIT",
    "MASTER_POS_WAIT",
    "NEXTVAL",
    "RELEASE_ALL_LOCKS",
    "RELEASE_LOCK",
    "ROW_COUNT",
    "SERVICE_GET_READ_LOCKS",
    "SERVICE_GET_WRITE_LOCKS",
    "SERVICE_RELEASE_LOCKS",
    "SETVAL",
    "SOURCE_POS_WAIT",
    "WAIT_FOR_EXECUTED_GTID_SET",
    "WAIT_UNTIL_SQL_THREAD_AFTER_GTIDS",
    "WSREP_LAST_SEEN_GTID",
    "WSREP_LAST_WRITTEN_GTID",
    "WSREP_SYNC_WAIT_UPTO_GTID",
];

/// Where one REQUEST's `sql` (single form) may go. Hints win over the statement.
/// Never panics, for any text; allocates nothing.
///
/// ```
/// use osprey_sql::classify::{classify, Hint, Route};
/// assert_eq!(classify("SELECT * FROM t WHERE id = 1").route, Route::Replica);
/// assert_eq!(classify("SELECT * FROM t WHERE id = 1 FOR UPDATE").why, "locking read");
/// assert_eq!(classify("SELECT last_insert_id()").why, "side-effect function");
/// let d = classify("/* osprey:replica */ SELECT report(1)");
/// assert_eq!((d.route, d.why, d.hint), (Route::Replica, "hint", Some(Hint::Replica)));
/// ```
pub fn classify(sql: &str) -> Decision {
    let b = sql.as_bytes();
    let mut c = Classifier::default();
    let mut replica_hint = false;
    // Where the last quoted piece ended, and its quote: `a``b` is two adjacent pieces.
    let mut last_quote = (0u8, usize::MAX);
    for (piece, range) in pieces(sql) {
        match piece {
            Piece::Comment => match hint_in(&b[range]) {
                Some(Hint::Primary) => return decision(Route::Primary, reason::HINT, Some(Hint::Primary)),
                Some(Hint::Replica) => replica_hint = true,
                None => {}
            },
            // The answer is Primary: only a hint can change it.
            _ if c.reason.is_some() => {}
            Piece::Code => c.code(&b[range]),
            Piece::Quoted(q) => {
                let continued = last_quote == (q, range.start);
                last_quote = (q, range.end);
                c.quoted(q, &b[range], continued);
            }
            Piece::Executable => c.versioned = is_versioned_opener(&b[range]),
        }
    }
    if replica_hint {
        return decision(Route::Replica, reason::HINT, Some(Hint::Replica));
    }
    match c.finish() {
        Some(why) => decision(Route::Primary, why, None),
        None => decision(Route::Replica, reason::READ, None),
    }
}

fn decision(route: Route, why: &'static str, hint: Option<Hint>) -> Decision {
    Decision { route, why, hint }
}

/// `/*!NNNNN` (skipped by servers older than NNNNN) or `/*M!…` (skipped by MySQL); the
/// closer `*/` and a plain `/*!` (run by every server) are not.
fn is_versioned_opener(p: &[u8]) -> bool {
    p.len() > 3 && p[0] == b'/' && (p[2] == b'!' || p[2] | 0x20 == b'm')
}

/// The hint in one comment piece (delimiters included), if any: `osprey` (not inside a
/// longer word), optional spaces, `:`, optional spaces, `primary` or `replica`.
fn hint_in(c: &[u8]) -> Option<Hint> {
    let word_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let mut found = None;
    let mut i = 0;
    while i + 6 <= c.len() {
        if c[i] | 0x20 != b'o' || !c[i..i + 6].eq_ignore_ascii_case(b"osprey") || (i > 0 && word_byte(c[i - 1])) {
            i += 1;
            continue;
        }
        let skip_space = |mut j: usize| {
            while c.get(j).is_some_and(|b| b.is_ascii_whitespace()) {
                j += 1;
            }
            j
        };
        i += 6;
        let mut j = skip_space(i);
        if c.get(j) != Some(&b':') {
            continue;
        }
        j = skip_space(j + 1);
        let start = j;
        while c.get(j).is_some_and(|&b| word_byte(b)) {
            j += 1;
        }
        let word = &c[start..j];
        if word.eq_ignore_ascii_case(b"primary") {
            return Some(Hint::Primary);
        }
        if word.eq_ignore_ascii_case(b"replica") {
            found = Some(Hint::Replica);
        }
        i = j;
    }
    found
}

/// The words the classifier acts on (a quoted identifier is never one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Kw {
    #[default]
    None,
    Select,
    With,
    Show,
    Explain,
    Help,
    Analyze,
    Set,
    Statement,
    Call,
    Write,
    Session,
    Master,
    Binlog,
    Binary,
    For,
    Update,
    Share,
    Lock,
    In,
    Next,
    Previous,
    Value,
    Into,
    Insert,
    Delete,
    Replace,
}

/// The words of [`Kw`], upper case, sorted (a word is looked for among those with its first letter).
const KEYWORDS: &[(&str, Kw)] = &[
    ("ALTER", Kw::Write),
    ("ANALYZE", Kw::Analyze),
    ("BACKUP", Kw::Write),
    ("BEGIN", Kw::Session),
    ("BINARY", Kw::Binary),
    ("BINLOG", Kw::Binlog),
    ("CACHE", Kw::Write),
    ("CALL", Kw::Call),
    ("CHANGE", Kw::Write),
    ("CHECK", Kw::Write),
    ("CHECKSUM", Kw::Write),
    ("COMMIT", Kw::Session),
    ("CREATE", Kw::Write),
    ("DEALLOCATE", Kw::Session),
    ("DELETE", Kw::Delete),
    ("DESC", Kw::Explain),
    ("DESCRIBE", Kw::Explain),
    ("DO", Kw::Call),
    ("DROP", Kw::Write),
    ("EXECUTE", Kw::Session),
    ("EXPLAIN", Kw::Explain),
    ("FLUSH", Kw::Write),
    ("FOR", Kw::For),
    ("GRANT", Kw::Write),
    ("HANDLER", Kw::Session),
    ("HELP", Kw::Help),
    ("IMPORT", Kw::Write),
    ("IN", Kw::In),
    ("INSERT", Kw::Insert),
    ("INSTALL", Kw::Write),
    ("INTO", Kw::Into),
    ("KILL", Kw::Write),
    ("LOAD", Kw::Write),
    ("LOCK", Kw::Lock),
    ("MASTER", Kw::Master),
    ("NEXT", Kw::Next),
    ("OPTIMIZE", Kw::Write),
    ("PREPARE", Kw::Session),
    ("PREVIOUS", Kw::Previous),
    ("PURGE", Kw::Write),
    ("RELEASE", Kw::Session),
    ("RENAME", Kw::Write),
    ("REPAIR", Kw::Write),
    ("REPLACE", Kw::Replace),
    ("RESET", Kw::Write),
    ("RESTART", Kw::Write),
    ("REVOKE", Kw::Write),
    ("ROLLBACK", Kw::Session),
    ("SAVEPOINT", Kw::Session),
    ("SELECT", Kw::Select),
    ("SET", Kw::Set),
    ("SHARE", Kw::Share),
    ("SHOW", Kw::Show),
    ("SHUTDOWN", Kw::Write),
    ("START", Kw::Session),
    ("STATEMENT", Kw::Statement),
    ("STOP", Kw::Write),
    ("TABLE", Kw::Select),
    ("TRUNCATE", Kw::Write),
    ("UNINSTALL", Kw::Write),
    ("UNLOCK", Kw::Session),
    ("UPDATE", Kw::Update),
    ("USE", Kw::Session),
    ("VALUE", Kw::Value),
    ("VALUES", Kw::Select),
    ("WITH", Kw::With),
    ("XA", Kw::Session),
];

/// Per first letter, a bit for each length (< 64) that a [`KEYWORDS`] word with it has:
/// most words of a statement (names, FROM, WHERE, AND) are ruled out by these two alone.
static KEYWORD_SHAPES: [u64; 26] = {
    let mut t = [0u64; 26];
    let mut i = 0;
    while i < KEYWORDS.len() {
        add_shape(&mut t, KEYWORDS[i].0);
        i += 1;
    }
    t
};

/// Where the [`KEYWORDS`] with each first letter begin (and, last, the end).
static KEYWORD_LETTERS: [u8; 27] = {
    let mut t = [0u8; 27];
    let mut i = 0;
    while i < KEYWORDS.len() {
        let letter = (KEYWORDS[i].0.as_bytes()[0] - b'A') as usize;
        // Every later letter starts after this word (the list is sorted).
        let mut l = letter + 1;
        while l < 27 {
            t[l] = (i + 1) as u8;
            l += 1;
        }
        i += 1;
    }
    t
};

const fn add_shape(t: &mut [u64; 26], word: &str) {
    let w = word.as_bytes();
    t[(w[0] - b'A') as usize] |= 1 << w.len();
}

/// Whether `w`'s first letter and length are those of a word in the table of shapes.
#[inline]
fn may_be(shapes: &[u64; 26], w: &[u8]) -> bool {
    match w.first() {
        Some(&c) if c.is_ascii_alphabetic() && w.len() < 64 => {
            shapes[((c | 0x20) - b'a') as usize] & (1 << w.len()) != 0
        }
        _ => false,
    }
}

#[inline]
fn keyword(w: &[u8]) -> Kw {
    if !may_be(&KEYWORD_SHAPES, w) {
        return Kw::None;
    }
    let letter = ((w[0] | 0x20) - b'a') as usize;
    KEYWORDS[KEYWORD_LETTERS[letter] as usize..KEYWORD_LETTERS[letter + 1] as usize]
        .iter()
        .find(|(k, _)| k.len() == w.len() && k.as_bytes().eq_ignore_ascii_case(w))
        .map_or(Kw::None, |&(_, kw)| kw)
}

/// Whether a called name (plain or the inside of quotes) is one of [`SIDE_EFFECT_FUNCTIONS`].
fn is_side_effect_function(name: &[u8]) -> bool {
    // Most calls (COUNT, NOW, CONCAT…) are ruled out by their first letter and length.
    may_be(&SIDE_EFFECT_SHAPES, name)
        && SIDE_EFFECT_FUNCTIONS
            .iter()
            .any(|f| f.len() == name.len() && f.as_bytes().eq_ignore_ascii_case(name))
}

static SIDE_EFFECT_SHAPES: [u64; 26] = {
    let mut t = [0u64; 26];
    let mut i = 0;
    while i < SIDE_EFFECT_FUNCTIONS.len() {
        add_shape(&mut t, SIDE_EFFECT_FUNCTIONS[i]);
        i += 1;
    }
    t
};

/// What the first statement is, as far as its words so far tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Head {
    /// Before the first word (only `(` so far).
    #[default]
    Start,
    /// SELECT, VALUES, TABLE, WITH: a bare INSERT/UPDATE/DELETE/REPLACE makes it a write.
    Select,
    /// SHOW, waiting for its second word.
    Show,
    /// Another read (SHOW x, EXPLAIN, DESCRIBE).
    Read,
    /// HELP: a read whatever its words.
    Help,
    /// SET, waiting for its second word.
    Set,
    /// SET STATEMENT …, waiting for the `FOR` (outside parentheses) before the statement.
    SetStatement,
}

/// A word waiting for the next token, which says whether it is called.
#[derive(Debug, Clone, Copy)]
struct Word<'a> {
    /// The name (a quoted identifier's inside); `None` for one with a doubled quote inside.
    name: Option<&'a [u8]>,
    kw: Kw,
    after_dot: bool,
    versioned: bool,
}

/// A token other than a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Punct {
    Open,
    Close,
    Semi,
    Dot,
    Assign,
    /// A string literal, a number's punctuation, an operator.
    Other,
}

#[derive(Default)]
struct Classifier<'a> {
    head: Head,
    /// Why the text goes to the primary, once that is known (then the code is not read on).
    reason: Option<&'static str>,
    depth: u32,
    /// The first statement's `;` has been seen.
    first_done: bool,
    /// The word waiting for the next token, kept field by field: a stored word read back
    /// whole after its fields were written one by one stalls the store buffer every time.
    pending: bool,
    pending_name: Option<&'a [u8]>,
    pending_kw: Kw,
    pending_after_dot: bool,
    pending_versioned: bool,
    after_dot: bool,
    /// The two words before the current one (`NEXT VALUE FOR`, `FOR UPDATE`, `LOCK IN`).
    prev: [Kw; 2],
    /// Inside a versioned executable comment.
    versioned: bool,
}

/// Bytes of an unquoted word (identifiers, keywords, numbers).
static WORD_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
        i += 1;
    }
    t
};

impl<'a> Classifier<'a> {
    fn code(&mut self, s: &'a [u8]) {
        let mut i = 0;
        while i < s.len() && self.reason.is_none() {
            let c = s[i];
            if WORD_BYTE[c as usize] {
                let start = i;
                while i < s.len() && WORD_BYTE[s[i] as usize] {
                    i += 1;
                }
                let w = &s[start..i];
                self.word_token(Some(w), keyword(w));
                continue;
            }
            i += 1;
            let p = match c {
                b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => continue,
                b'(' => Punct::Open,
                b')' => Punct::Close,
                b';' => Punct::Semi,
                b'.' => Punct::Dot,
                b':' if s.get(i) == Some(&b'=') => {
                    i += 1;
                    Punct::Assign
                }
                _ => Punct::Other,
            };
            self.punct(p);
        }
    }

    /// A quoted piece: a `'…'` string is a value; a `` `…` `` or `"…"` name may be called
    /// (a `"…"` one only under ANSI_QUOTES, but a string before `(` is an error anyway).
    fn quoted(&mut self, q: u8, p: &'a [u8], continued: bool) {
        if q == b'\'' {
            self.punct(Punct::Other);
            return;
        }
        if continued && self.pending {
            self.pending_name = None;
            return;
        }
        let inner = &p[1..];
        let inner = inner.strip_suffix(&[q]).unwrap_or(inner);
        self.word_token(Some(inner), Kw::None);
    }

    /// Before any token: the word waiting for it is resolved. `false`: nothing more to do
    /// (the answer is Primary).
    #[inline]
    fn before_token(&mut self, open: bool) -> bool {
        if self.first_done {
            self.reason = Some(reason::SEVERAL);
            return false;
        }
        if self.pending {
            self.pending = false;
            let w = Word {
                name: self.pending_name,
                kw: self.pending_kw,
                after_dot: self.pending_after_dot,
                versioned: self.pending_versioned,
            };
            self.word(w, open);
        }
        self.reason.is_none()
    }

    fn word_token(&mut self, name: Option<&'a [u8]>, kw: Kw) {
        if !self.before_token(false) {
            return;
        }
        self.pending = true;
        self.pending_name = name;
        self.pending_kw = kw;
        self.pending_after_dot = std::mem::replace(&mut self.after_dot, false);
        self.pending_versioned = self.versioned;
    }

    fn punct(&mut self, p: Punct) {
        if !self.before_token(p == Punct::Open) {
            return;
        }
        self.after_dot = false;
        self.prev = [Kw::None; 2];
        match p {
            Punct::Open => self.depth = self.depth.saturating_add(1),
            Punct::Close => self.depth = self.depth.saturating_sub(1),
            Punct::Semi => {
                self.end_statement();
                self.first_done = true;
            }
            Punct::Dot => self.after_dot = true,
            Punct::Assign if matches!(self.head, Head::Select | Head::Show | Head::Read) => {
                self.reason = Some(reason::ASSIGNMENT)
            }
            Punct::Assign | Punct::Other => {}
        }
        if self.head == Head::Start && p != Punct::Open {
            self.reason = Some(reason::UNKNOWN);
        }
    }

    /// One word, now that the token after it is known (`call`: it is `(`). Inlined: a
    /// word passed through memory, its fields just written one by one, stalls the loads.
    #[inline(always)]
    fn word(&mut self, w: Word<'a>, call: bool) {
        match self.head {
            Head::Start => self.first_word(w),
            Head::Set if w.kw == Kw::Statement => self.head = Head::SetStatement,
            Head::Set => self.reason = Some(reason::SESSION),
            Head::SetStatement if w.kw == Kw::For && self.depth == 0 => self.head = Head::Start,
            Head::SetStatement | Head::Help => {}
            Head::Show if matches!(w.kw, Kw::Master | Kw::Binlog | Kw::Binary) => {
                self.reason = Some(reason::PRIMARY_STATUS)
            }
            Head::Show | Head::Read | Head::Select => {
                if self.head == Head::Show {
                    self.head = Head::Read;
                }
                self.read_word(w, call);
            }
        }
        self.prev = [self.prev[1], if w.after_dot { Kw::None } else { w.kw }];
    }

    fn first_word(&mut self, w: Word<'a>) {
        let (head, why) = match w.kw {
            Kw::Select | Kw::With => (Head::Select, None),
            Kw::Show => (Head::Show, None),
            Kw::Explain => (Head::Read, None),
            Kw::Help => (Head::Help, None),
            Kw::Set => (Head::Set, None),
            Kw::Analyze => (Head::Start, Some(reason::ANALYZE)),
            Kw::Call => (Head::Start, Some(reason::CALL)),
            Kw::Insert | Kw::Update | Kw::Delete | Kw::Replace | Kw::Binlog | Kw::Write => {
                (Head::Start, Some(reason::WRITE))
            }
            Kw::Lock | Kw::Session => (Head::Start, Some(reason::SESSION)),
            _ => (Head::Start, Some(reason::UNKNOWN)),
        };
        if why.is_none() && w.versioned && head != Head::Set {
            // A server older than the comment's version skips this word: the statement
            // it then runs is not the one read here.
            self.reason = Some(reason::UNKNOWN);
            return;
        }
        self.head = head;
        self.reason = why;
    }

    /// A word of a read statement.
    fn read_word(&mut self, w: Word<'a>, call: bool) {
        if call {
            if w.after_dot {
                self.reason = Some(reason::STORED_FUNCTION);
            } else if w.name.is_some_and(is_side_effect_function) {
                self.reason = Some(reason::SIDE_EFFECT);
            }
            if self.reason.is_some() {
                return;
            }
        }
        if w.after_dot {
            // After a `.` a word is a name (even a reserved one), except a sequence's
            // `.NEXTVAL` / `.CURRVAL` (MariaDB, Oracle mode).
            if w.name
                .is_some_and(|n| n.eq_ignore_ascii_case(b"nextval") || n.eq_ignore_ascii_case(b"currval"))
            {
                self.reason = Some(reason::SIDE_EFFECT);
            }
            return;
        }
        let why = match (self.prev, w.kw) {
            ([_, Kw::For], Kw::Update | Kw::Share) | ([_, Kw::Lock], Kw::In) => reason::LOCKING_READ,
            ([Kw::Next | Kw::Previous, Kw::Value], Kw::For) => reason::SIDE_EFFECT,
            (_, Kw::Into) => reason::INTO,
            (_, Kw::Analyze) => reason::ANALYZE,
            (_, Kw::Insert | Kw::Update | Kw::Delete | Kw::Replace) if self.head == Head::Select && !call => {
                reason::WRITE
            }
            _ => return,
        };
        self.reason = Some(why);
    }

    /// The first statement's end (its `;`, or the end of the text).
    fn end_statement(&mut self) {
        if self.pending {
            self.before_token(false);
        }
        if self.reason.is_some() {
            return;
        }
        match self.head {
            Head::Start => self.reason = Some(reason::UNKNOWN),
            Head::Set | Head::SetStatement => self.reason = Some(reason::SESSION),
            Head::Show | Head::Select | Head::Read | Head::Help => {}
        }
    }

    fn finish(mut self) -> Option<&'static str> {
        if self.reason.is_none() && !self.first_done {
            self.end_statement();
        }
        self.reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_table() {
        assert!(KEYWORDS.windows(2).all(|w| w[0].0 < w[1].0), "KEYWORDS must be sorted");
        for &(k, kw) in KEYWORDS {
            assert_eq!(keyword(k.as_bytes()), kw, "{k}");
            assert_eq!(keyword(k.to_ascii_lowercase().as_bytes()), kw, "{k}");
            assert_eq!(keyword(format!("{k}X").as_bytes()), Kw::None, "{k}X");
        }
        for w in ["", "1", "_", "ID", "FROM", "WHERE", "é", "SELECTS", "ZZ"] {
            assert_eq!(keyword(w.as_bytes()), Kw::None, "{w}");
        }
        for f in SIDE_EFFECT_FUNCTIONS {
            assert!(is_side_effect_function(f.as_bytes()), "{f}");
        }
        assert!(!is_side_effect_function(b"COUNT"));
        assert!(!is_side_effect_function(b""));
    }
}
