//! The session: commands written ahead of their responses, and the responses read back in
//! order as [`Event`]s.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use mysql_common::constants::{CapabilityFlags, MariadbCapabilities, StatusFlags, UTF8MB4_GENERAL_CI};
use mysql_common::io::ParseBuf;
use mysql_common::packets::{
    Column, ComChangeUser, ComChangeUserMoreData, ComStmtClose, ComStmtExecuteRequestBuilder, ComStmtSendLongData,
    OkPacket, OkPacketDeserializer, OldEofPacket, ResultSetTerminator, StmtPacket,
};
use mysql_common::proto::MySerialize;
use mysql_common::row::Row;
use mysql_common::value::Value;

use crate::error::{Error, Result};
use crate::handshake::{self, parse_ok, server_error, AuthState};
use crate::io::PacketIo;
use crate::opts::Opts;
use crate::parse::{is_old_eof, parse_column, parse_row, Proto};
use crate::stmt::{Statement, StmtCache};

/// Prepared statements kept per session (as the worker's `mysql_async` setting).
pub const STMT_CACHE_SIZE: usize = 256;
/// The largest column count accepted in a result set header (a prepared statement's
/// counts are 16-bit, and no server sends more).
const MAX_COLUMNS: u64 = u16::MAX as u64;
/// Long data goes in chunks that, with their 7-byte header, fit one packet.
const LONG_DATA_CHUNK: usize = mysql_common::constants::MAX_PAYLOAD_LEN - 6;

const COM_QUIT: u8 = 0x01;
const COM_QUERY: u8 = 0x03;
const COM_PING: u8 = 0x0E;
const COM_STMT_PREPARE: u8 = 0x16;
const COM_RESET_CONNECTION: u8 = 0x1F;

/// One step of a command's response.
///
/// A response is zero or more results, each either a result set (`Columns`, `Row`s, `End`)
/// or a bare `End` (a statement without rows); it is complete after an `End` with
/// `more_results == false`, or when [`Session::next_event`] returns an error.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A result set begins; its rows follow.
    Columns(Arc<[Column]>),
    /// One row of the current result set: text-protocol rows hold [`Value::Bytes`] and
    /// [`Value::NULL`] only; binary-protocol rows hold the values decoded by column type.
    Row(Row),
    /// One row of a command sent with [`Session::raw_rows`]: the row packet's payload as
    /// the server sent it, not parsed.
    RawRow(Bytes),
    /// A result ended: the terminating OK/EOF of a result set, or the OK of a statement
    /// without rows. (For a result set's terminator, `affected_rows` and `last_insert_id`
    /// are 0, as `mysql_common` reads them.)
    End {
        /// The packet: status flags, warnings, affected rows, last insert id, info and
        /// session state changes.
        ok: OkPacket<'static>,
        /// Another result of the same command follows.
        more_results: bool,
    },
}

#[derive(Debug)]
struct Pending {
    proto: Proto,
    /// The executed statement (binary results): its columns stand in for skipped metadata.
    stmt: Option<Statement>,
    /// The sequence id the response's first packet carries.
    first_seq: u8,
    started: bool,
    /// Rows come as [`Event::RawRow`].
    raw: bool,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for a result's first packet.
    Result,
    /// Reading the column definitions of a result set.
    Columns { want: usize, cols: Vec<Column> },
    /// Waiting for the EOF after the definitions (without `CLIENT_DEPRECATE_EOF`).
    ColumnsEof { cols: Arc<[Column]> },
    /// Reading rows.
    Rows { cols: Arc<[Column]> },
}

/// One MySQL/MariaDB client session over TCP (optionally TLS).
///
/// Commands are *sent* ([`Session::send_query`], [`Session::send_execute`]) into a write
/// buffer, which goes out on [`Session::flush`] or while reading; their responses are read
/// in the same order with [`Session::next_event`]. Several commands may be sent before
/// the first response is read (pipelining): the server answers them one after the other.
/// The round trips ([`Session::prepare`] on a cache miss, [`Session::ping`],
/// [`Session::reset_connection`], [`Session::change_user`]) need every response read first.
///
/// Errors: a server's ERR packet is [`Error::Server`] and leaves the session usable; any
/// other error from I/O or the protocol breaks the session, and every later call returns
/// [`Error::Broken`].
pub struct Session {
    io: PacketIo,
    opts: Opts,
    caps: CapabilityFlags,
    mariadb_caps: MariadbCapabilities,
    metadata_skips: u64,
    conn_id: u32,
    version: (u16, u16, u16),
    version_text: String,
    mariadb: bool,
    tls: bool,
    auth: AuthState,
    last_ok: Option<OkPacket<'static>>,
    status: StatusFlags,
    pending: VecDeque<Pending>,
    phase: Phase,
    cache: StmtCache,
    broken: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("conn_id", &self.conn_id)
            .field("server", &self.version_text)
            .field("tls", &self.tls)
            .field("pending", &self.pending.len())
            .field("broken", &self.broken)
            .finish()
    }
}

impl Session {
    /// Connects and authenticates within `opts.connect_timeout`.
    pub async fn connect(opts: &Opts) -> Result<Session> {
        let est = tokio::time::timeout(opts.connect_timeout, handshake::connect(opts))
            .await
            .map_err(|_| Error::ConnectTimeout(opts.connect_timeout))??;
        Ok(Session {
            io: est.io,
            opts: opts.clone(),
            caps: est.caps,
            mariadb_caps: est.mariadb_caps,
            metadata_skips: 0,
            conn_id: est.conn_id,
            version: est.version,
            version_text: est.version_text,
            mariadb: est.mariadb,
            tls: est.tls,
            auth: est.auth,
            status: est.ok.status_flags(),
            last_ok: Some(est.ok),
            pending: VecDeque::new(),
            phase: Phase::Result,
            cache: StmtCache::new(STMT_CACHE_SIZE),
            broken: false,
        })
    }

    /// The server's id for this connection (for `KILL QUERY`).
    pub fn connection_id(&self) -> u32 {
        self.conn_id
    }

    /// The server's version, as parsed from its greeting (MariaDB's own, not the
    /// `5.5.5-` prefix).
    pub fn server_version(&self) -> (u16, u16, u16) {
        self.version
    }

    /// The server's version string as sent.
    pub fn server_version_text(&self) -> &str {
        &self.version_text
    }

    /// The server is MariaDB.
    pub fn is_mariadb(&self) -> bool {
        self.mariadb
    }

    /// The connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The capabilities in use (ours and the server's).
    pub fn capabilities(&self) -> CapabilityFlags {
        self.caps
    }

    /// `MARIADB_CLIENT_CACHE_METADATA` is in use.
    pub fn caches_metadata(&self) -> bool {
        self.mariadb_caps
            .contains(MariadbCapabilities::MARIADB_CLIENT_CACHE_METADATA)
    }

    /// Binary result sets that came without column definitions (the statement's cached
    /// ones were used), since connect.
    pub fn metadata_skips(&self) -> u64 {
        self.metadata_skips
    }

    /// The options the session was opened with.
    pub fn opts(&self) -> &Opts {
        &self.opts
    }

    /// The last OK packet (or result set terminator) read, as `mysql_async`'s
    /// `last_ok_packet()`: `None` after a server error, until the next OK.
    pub fn last_ok(&self) -> Option<&OkPacket<'static>> {
        self.last_ok.as_ref()
    }

    /// The server status flags of the last OK packet; empty after a server error.
    pub fn status_flags(&self) -> StatusFlags {
        self.status
    }

    /// Commands sent whose responses are not completely read.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether the next packet of a response is already read from the socket whole, so
    /// that [`Session::next_event`] gets it without waiting: a caller with answers of its
    /// own to send may hold them until it would wait.
    pub fn packet_buffered(&self) -> bool {
        self.io.chunk_buffered()
    }

    /// The column definitions of the response being read come again, the same `Arc`,
    /// with the next results of the same statement (until the server sends new ones), so
    /// that a caller may key a cache on them: the response is a prepared statement's and
    /// the server caches metadata ([`Session::caches_metadata`]). Otherwise every result
    /// brings new definitions.
    pub fn columns_kept(&self) -> bool {
        self.caches_metadata() && self.pending.front().is_some_and(|p| p.stmt.is_some())
    }

    /// An earlier fatal error broke the session.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Prepared statements in the cache.
    pub fn cached_statements(&self) -> usize {
        self.cache.len()
    }

    fn usable(&self) -> Result<()> {
        if self.broken {
            Err(Error::Broken)
        } else {
            Ok(())
        }
    }

    /// Marks the session broken on a fatal error.
    fn check<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.is_fatal() {
                if !self.broken {
                    tracing::debug!(conn_id = self.conn_id, error = %e, "session broken");
                }
                self.broken = true;
            }
        }
        r
    }

    fn idle(&self, what: &str) -> Result<()> {
        self.usable()?;
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(Error::Refused(format!(
                "{what} needs every response read first ({} pending)",
                self.pending.len()
            )))
        }
    }

    /// Queues one command packet (sequence 0); returns the reply's first sequence id.
    fn queue_command(&mut self, body: &[u8]) -> Result<u8> {
        self.io.queue_packet(0, body)
    }

    /// Sends `COM_QUERY` (into the write buffer). Several statements separated by `;` are
    /// allowed (`CLIENT_MULTI_STATEMENTS`): each gives one result of the response.
    pub fn send_query(&mut self, sql: &str) -> Result<()> {
        self.usable()?;
        let mut body = Vec::with_capacity(sql.len() + 1);
        body.push(COM_QUERY);
        body.extend_from_slice(sql.as_bytes());
        let first_seq = self.queue_command(&body)?;
        self.push_pending(Proto::Text, None, first_seq);
        Ok(())
    }

    /// Sends `COM_STMT_EXECUTE` of `stmt` with `params` (into the write buffer); parameters
    /// that make the packet exceed 16 MiB go ahead as `COM_STMT_SEND_LONG_DATA`. A wrong
    /// parameter count is refused here, with nothing sent.
    pub fn send_execute(&mut self, stmt: &Statement, params: &[Value]) -> Result<()> {
        self.send_execute_typed(stmt, params, &[])
    }

    /// [`Session::send_execute`], with the parameters whose `blob` is true bound as
    /// `MYSQL_TYPE_BLOB` (binary) instead of the string type `mysql_common` gives bytes.
    pub fn send_execute_typed(&mut self, stmt: &Statement, params: &[Value], blob: &[bool]) -> Result<()> {
        self.usable()?;
        if params.len() != usize::from(stmt.num_params()) {
            return Err(Error::Refused(format!(
                "the statement has {} parameters, {} given",
                stmt.num_params(),
                params.len()
            )));
        }
        let (request, as_long_data) = ComStmtExecuteRequestBuilder::new(stmt.id()).build(params);
        // Sized once: growing it from empty cost ~1.5 % of a worker's point select.
        let data: usize = match as_long_data {
            true => 0,
            false => params.iter().map(|p| p.bin_len() as usize).sum(),
        };
        let mut body = Vec::with_capacity(11 + params.len().div_ceil(8) + 2 * params.len() + data);
        request.serialize(&mut body);
        // [0x17, id 4, flags 1, iterations 4], the NULL bitmap, new-params-bound, types.
        let types_at = 10 + params.len().div_ceil(8) + 1;
        if blob.iter().any(|b| *b) && body.get(types_at - 1) == Some(&1) {
            for (i, _) in blob.iter().enumerate().filter(|(_, b)| **b) {
                if let Some(t) = body.get_mut(types_at + 2 * i) {
                    if *t == mysql_common::constants::ColumnType::MYSQL_TYPE_VAR_STRING as u8 {
                        *t = mysql_common::constants::ColumnType::MYSQL_TYPE_BLOB as u8;
                    }
                }
            }
        }
        if body.len() > crate::io::MAX_PACKET {
            return Err(Error::Refused(format!("an execute packet of {} bytes", body.len())));
        }
        if as_long_data {
            for (i, value) in params.iter().enumerate() {
                let Value::Bytes(bytes) = value else { continue };
                let index = u16::try_from(i).map_err(|_| Error::Refused("over 65535 parameters".into()))?;
                let mut chunks: Vec<&[u8]> = bytes.chunks(LONG_DATA_CHUNK).collect();
                if chunks.is_empty() {
                    chunks.push(&[]);
                }
                for chunk in chunks {
                    let mut packet = Vec::with_capacity(chunk.len() + 7);
                    ComStmtSendLongData::new(stmt.id(), index, chunk).serialize(&mut packet);
                    // No response to long data.
                    self.queue_command(&packet)?;
                }
            }
        }
        let first_seq = self.queue_command(&body)?;
        self.push_pending(Proto::Binary, Some(stmt.clone()), first_seq);
        Ok(())
    }

    fn push_pending(&mut self, proto: Proto, stmt: Option<Statement>, first_seq: u8) {
        self.pending.push_back(Pending {
            proto,
            stmt,
            first_seq,
            started: false,
            raw: false,
        });
    }

    /// The rows of the command sent last come as [`Event::RawRow`], the packets as the
    /// server sent them (for a caller that hands them on in the same protocol), instead
    /// of parsed [`Event::Row`]s. Nothing changes once its response has begun to be read.
    pub fn raw_rows(&mut self) {
        if let Some(p) = self.pending.back_mut().filter(|p| !p.started) {
            p.raw = true;
        }
    }

    /// Writes out everything sent so far. Not needed before [`Session::next_event`], which
    /// writes while it reads. While the socket is full it reads responses ahead (up to
    /// 64 MiB) so that a server blocked on writing to us goes on reading; with more than
    /// that in responses to commands not yet written out, only reading frees it.
    pub async fn flush(&mut self) -> Result<()> {
        self.usable()?;
        let r = self.io.flush().await;
        self.check(r)
    }

    /// The next event of the oldest command whose response is not completely read.
    /// `Err(Error::Server)` ends that command's response (the next command's follows);
    /// `Err(Error::Refused)` if no command is pending. Cancel-safe: a dropped call loses
    /// nothing, the next one goes on where it stopped.
    pub async fn next_event(&mut self) -> Result<Event> {
        self.usable()?;
        let r = self.next_event_inner().await;
        self.check(r)
    }

    async fn next_event_inner(&mut self) -> Result<Event> {
        let Some(head) = self.pending.front_mut() else {
            return Err(Error::Refused("no command is pending".into()));
        };
        let proto = head.proto;
        let raw = head.raw;
        if !head.started {
            head.started = true;
            self.io.set_read_seq(head.first_seq);
            self.phase = Phase::Result;
        }
        // Commands queued since the last read go out before we wait on (or decode from)
        // the read buffer.
        self.io.write_now()?;
        loop {
            let packet = self.io.read_packet().await?;
            if let Some(event) = self.on_packet(proto, raw, packet).await? {
                return Ok(event);
            }
        }
    }

    /// Takes one packet of the head command's response; `None`: nothing to report yet.
    async fn on_packet(&mut self, proto: Proto, raw: bool, packet: Bytes) -> Result<Option<Event>> {
        let Some(&first) = packet.first() else {
            return Err(Error::protocol("an empty packet in a response"));
        };
        if first == 0xFF {
            let Some(e) = server_error(&packet, self.caps)? else {
                // A progress report (not asked for, but harmless).
                return Ok(None);
            };
            self.finish_command();
            self.last_ok = None;
            self.status = StatusFlags::empty();
            return Err(Error::Server(e));
        }
        match std::mem::replace(&mut self.phase, Phase::Result) {
            Phase::Result => match first {
                0x00 => {
                    let ok = parse_ok(&packet, self.caps)?;
                    Ok(Some(self.end_result(ok)))
                }
                0xFB => {
                    self.answer_local_infile(&packet).await?;
                    Ok(None)
                }
                _ => {
                    let mut buf = ParseBuf(&packet);
                    let count = buf
                        .checked_eat_lenenc_int()
                        .filter(|n| (1..=MAX_COLUMNS).contains(n))
                        .ok_or_else(|| Error::protocol("bad column count packet"))?;
                    let want = count as usize;
                    let follows = if self.caches_metadata() {
                        buf.checked_eat_u8()
                    } else {
                        Some(1)
                    };
                    match follows {
                        Some(1) if buf.is_empty() => {
                            self.phase = Phase::Columns {
                                want,
                                cols: Vec::with_capacity(want.min(1024)),
                            };
                            Ok(None)
                        }
                        Some(0) if buf.is_empty() => self.cached_columns(want),
                        _ => Err(Error::protocol("bad column count packet")),
                    }
                }
            },
            Phase::Columns { want, mut cols } => {
                cols.push(parse_column(&packet)?);
                if cols.len() < want {
                    self.phase = Phase::Columns { want, cols };
                    return Ok(None);
                }
                let cols: Arc<[Column]> = cols.into();
                if let Some(stmt) = self.pending.front().and_then(|p| p.stmt.as_ref()) {
                    stmt.set_columns(cols.clone());
                }
                if self.deprecate_eof() {
                    self.phase = Phase::Rows { cols: cols.clone() };
                    Ok(Some(Event::Columns(cols)))
                } else {
                    self.phase = Phase::ColumnsEof { cols };
                    Ok(None)
                }
            }
            Phase::ColumnsEof { cols } => {
                if !is_old_eof(&packet) {
                    return Err(Error::protocol("no EOF after the column definitions"));
                }
                self.phase = Phase::Rows { cols: cols.clone() };
                Ok(Some(Event::Columns(cols)))
            }
            Phase::Rows { cols } => {
                if self.is_terminator(&packet) {
                    let ok = self.parse_terminator(&packet)?;
                    return Ok(Some(self.end_result(ok)));
                }
                if raw {
                    self.phase = Phase::Rows { cols };
                    return Ok(Some(Event::RawRow(packet)));
                }
                let row = parse_row(proto, &packet, cols.clone())?;
                self.phase = Phase::Rows { cols };
                Ok(Some(Event::Row(row)))
            }
        }
    }

    /// A result set whose definitions the server left out: the executed statement's.
    fn cached_columns(&mut self, want: usize) -> Result<Option<Event>> {
        let Some(stmt) = self.pending.front().and_then(|p| p.stmt.as_ref()) else {
            return Err(Error::protocol("column definitions left out of a text result"));
        };
        let cols = stmt.columns();
        if cols.len() != want {
            return Err(Error::protocol(format!(
                "column definitions left out for {want} columns, but the statement has {}",
                cols.len()
            )));
        }
        self.metadata_skips += 1;
        if self.deprecate_eof() {
            self.phase = Phase::Rows { cols: cols.clone() };
            Ok(Some(Event::Columns(cols)))
        } else {
            self.phase = Phase::ColumnsEof { cols };
            Ok(None)
        }
    }

    fn deprecate_eof(&self) -> bool {
        self.caps.contains(CapabilityFlags::CLIENT_DEPRECATE_EOF)
    }

    fn is_terminator(&self, packet: &[u8]) -> bool {
        // A text row may start with 0xFE too: an 8-byte length prefix, which needs a
        // packet of 16 MiB or more.
        packet.first() == Some(&0xFE)
            && if self.deprecate_eof() {
                packet.len() < mysql_common::constants::MAX_PAYLOAD_LEN
            } else {
                packet.len() < 9
            }
    }

    fn parse_terminator(&self, packet: &[u8]) -> Result<OkPacket<'static>> {
        let r = if self.deprecate_eof() {
            ParseBuf(packet)
                .parse::<OkPacketDeserializer<'_, ResultSetTerminator>>(self.caps)
                .map(|ok| ok.into_inner().into_owned())
        } else {
            ParseBuf(packet)
                .parse::<OkPacketDeserializer<'_, OldEofPacket>>(self.caps)
                .map(|ok| ok.into_inner().into_owned())
        };
        r.map_err(|e| Error::protocol(format!("bad result set terminator: {e}")))
    }

    fn end_result(&mut self, ok: OkPacket<'static>) -> Event {
        let more_results = ok.status_flags().contains(StatusFlags::SERVER_MORE_RESULTS_EXISTS);
        self.status = ok.status_flags();
        self.last_ok = Some(ok.clone());
        if !more_results {
            self.finish_command();
        }
        self.phase = Phase::Result;
        Event::End { ok, more_results }
    }

    fn finish_command(&mut self) {
        self.pending.pop_front();
        self.phase = Phase::Result;
    }

    /// Answers a LOCAL INFILE request with an empty file: the server loads nothing and the
    /// statement ends normally. Fatal when commands are pipelined behind it: the server
    /// reads what follows on the socket as the file's content.
    async fn answer_local_infile(&mut self, packet: &[u8]) -> Result<()> {
        if self.pending.len() > 1 {
            return Err(Error::protocol(format!(
                "the server asked for a LOCAL INFILE while {} more commands were pipelined behind it",
                self.pending.len() - 1
            )));
        }
        tracing::debug!(
            file = %String::from_utf8_lossy(packet.get(1..).unwrap_or_default()),
            "LOCAL INFILE requested: sending an empty file"
        );
        let next = self.io.queue_packet(self.io.read_seq(), &[])?;
        self.io.set_read_seq(next);
        self.io.flush().await
    }

    /// Reads the rest of the oldest pending command's response, rows discarded; returns its
    /// last OK packet.
    pub async fn drain(&mut self) -> Result<OkPacket<'static>> {
        loop {
            if let Event::End {
                ok,
                more_results: false,
            } = self.next_event().await?
            {
                return Ok(ok);
            }
        }
    }

    /// Runs `sql` and discards its rows (needs every earlier response read).
    pub async fn query_drop(&mut self, sql: &str) -> Result<OkPacket<'static>> {
        self.idle("query_drop")?;
        self.send_query(sql)?;
        self.drain().await
    }

    /// The statement for `sql`, from the cache or prepared now (a round trip, which needs
    /// every earlier response read). A statement the cache pushes out is closed on the
    /// server (`COM_STMT_CLOSE`, sent with the next command). Not cancel-safe on a miss.
    pub async fn prepare(&mut self, sql: &str) -> Result<Statement> {
        self.usable()?;
        if let Some(stmt) = self.cache.get(sql) {
            return Ok(stmt);
        }
        self.idle("prepare")?;
        let r = self.prepare_inner(sql).await;
        let stmt = self.check(r)?;
        for old in self.cache.put(sql, stmt.clone()) {
            let mut body = Vec::with_capacity(5);
            ComStmtClose::new(old.id()).serialize(&mut body);
            // No response to COM_STMT_CLOSE.
            let r = self.queue_command(&body).map(|_| ());
            self.check(r)?;
        }
        Ok(stmt)
    }

    async fn prepare_inner(&mut self, sql: &str) -> Result<Statement> {
        let mut body = Vec::with_capacity(sql.len() + 1);
        body.push(COM_STMT_PREPARE);
        body.extend_from_slice(sql.as_bytes());
        let first = self.queue_command(&body)?;
        self.io.set_read_seq(first);
        self.io.flush().await?;
        let packet = self.io.read_packet().await?;
        if packet.first() == Some(&0xFF) {
            self.last_ok = None;
            self.status = StatusFlags::empty();
            return Err(match server_error(&packet, self.caps)? {
                Some(e) => Error::Server(e),
                None => Error::protocol("progress report to COM_STMT_PREPARE"),
            });
        }
        let head = ParseBuf(&packet)
            .parse::<StmtPacket>(())
            .map_err(|e| Error::protocol(format!("bad COM_STMT_PREPARE response: {e}")))?;
        let params = self.read_definitions(head.num_params()).await?;
        let columns = self.read_definitions(head.num_columns()).await?;
        Ok(Statement::new(head.statement_id(), params, columns))
    }

    async fn read_definitions(&mut self, n: u16) -> Result<Vec<Column>> {
        let mut cols = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let packet = self.io.read_packet().await?;
            cols.push(parse_column(&packet)?);
        }
        if n > 0 && !self.deprecate_eof() {
            let packet = self.io.read_packet().await?;
            if !is_old_eof(&packet) {
                return Err(Error::protocol("no EOF after the definitions"));
            }
        }
        Ok(cols)
    }

    /// A round trip of a one-byte command answered by OK or ERR.
    async fn simple(&mut self, what: &str, command: u8) -> Result<OkPacket<'static>> {
        self.idle(what)?;
        let r = async {
            let first = self.queue_command(&[command])?;
            self.io.set_read_seq(first);
            self.io.flush().await?;
            let packet = self.io.read_packet().await?;
            match packet.first() {
                Some(0x00) => {
                    let ok = parse_ok(&packet, self.caps)?;
                    self.status = ok.status_flags();
                    self.last_ok = Some(ok.clone());
                    Ok(ok)
                }
                Some(0xFF) => match server_error(&packet, self.caps)? {
                    Some(e) => Err(Error::Server(e)),
                    None => Err(Error::protocol(format!("progress report to {what}"))),
                },
                _ => Err(Error::protocol(format!("unexpected response to {what}"))),
            }
        }
        .await;
        self.check(r)
    }

    /// `COM_PING`.
    pub async fn ping(&mut self) -> Result<()> {
        self.simple("COM_PING", COM_PING).await.map(|_| ())
    }

    /// `COM_RESET_CONNECTION`: the session's variables, temporary tables, locks and
    /// prepared statements go back to a fresh login's (the current database stays). A
    /// server without it answers 1047 ([`Error::Server`]); [`Session::change_user`] is the
    /// older way.
    pub async fn reset_connection(&mut self) -> Result<()> {
        self.simple("COM_RESET_CONNECTION", COM_RESET_CONNECTION).await?;
        self.cache.clear();
        Ok(())
    }

    /// `COM_CHANGE_USER` with the session's own credentials and database: a full reset,
    /// the default database included. Any failure is fatal (the server does not keep a
    /// session whose re-authentication failed).
    pub async fn change_user(&mut self) -> Result<()> {
        self.idle("COM_CHANGE_USER")?;
        let r = self.change_user_inner().await.map_err(|e| match e {
            Error::Server(e) => Error::Auth(format!("COM_CHANGE_USER refused: {e}")),
            e => e,
        });
        let ok = self.check(r)?;
        self.status = ok.status_flags();
        self.last_ok = Some(ok);
        self.cache.clear();
        Ok(())
    }

    async fn change_user_inner(&mut self) -> Result<OkPacket<'static>> {
        let password = Some(self.opts.password.as_str()).filter(|p| !p.is_empty());
        let data = self.auth.plugin.gen_data(password, &self.auth.nonce);
        let command = ComChangeUser::new()
            .with_user(Some(self.opts.user.as_bytes()))
            .with_database(self.opts.database.as_deref().map(str::as_bytes))
            .with_auth_plugin_data(data.as_deref())
            .with_more_data(Some(
                ComChangeUserMoreData::new(UTF8MB4_GENERAL_CI).with_auth_plugin(Some(self.auth.plugin.clone())),
            ));
        let mut body = Vec::new();
        command.serialize(&mut body);
        let first = self.queue_command(&body)?;
        self.io.set_read_seq(first);
        self.io.flush().await?;
        let password = self.opts.password.clone();
        handshake::authenticate(&mut self.io, &mut self.auth, self.caps, &password, self.tls).await
    }

    /// `COM_QUIT`, then closes the connection. Responses still pending are abandoned.
    pub async fn quit(mut self) -> Result<()> {
        self.usable()?;
        self.queue_command(&[COM_QUIT])?;
        self.io.flush().await
    }
}
