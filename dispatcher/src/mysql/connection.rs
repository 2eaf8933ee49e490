//! One MySQL client connection: the connection phase, then commands one at a time. Each
//! statement becomes an Osprey `REQUEST` on an in-process stream and takes admission like
//! any SDK client's (intercept, route, reserve, throttle, the slot group's fair queue):
//! the closed loop, the byte bounds and the slow-consumer rule hold here too. What comes
//! back (`COLUMNS`, `ROWS`, `END`, `ERROR`) is written as MySQL packets.
//!
//! Transactions and untracked session state pin the client to one worker through a
//! session (protocol 1.5): opened when a statement needs it (`BEGIN`, autocommit off, a
//! user variable, a temporary table, a lock, text `PREPARE`, an unparsed `SET`), ended
//! when no transaction is open and nothing sticky was done (`END.in_transaction` is the
//! server's `SERVER_STATUS_IN_TRANS`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use osprey_protocol::{
    Columns, End, ErrorBody, ErrorCode, Frame, Kind, Origin, Request, ResultEnd, Rows, SessionOpened,
    TransactionOutcome, Value,
};
use osprey_sql::vars::{parse_set_in, Set};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info, warn, Instrument};

use osprey_mysql::codec::Cursor;
use osprey_mysql::handshake::{self, CLIENT_DEPRECATE_EOF};
use osprey_mysql::prepared;
use osprey_mysql::reply::{self, SERVER_STATUS_AUTOCOMMIT, SERVER_STATUS_IN_TRANS};
use osprey_mysql::state::{self, ClientState};

use super::login::{self, Login};
use super::packet::{PacketError, PacketReader, PacketWriter, MAX_PAYLOAD};
use super::Front;
use crate::admit::admit_built;
use crate::admit::session::Sessions;
use crate::client::tls::{ClientRead, ClientWrite};
use crate::ctx::Ctx;
use crate::request::clients::{ClientInfo, Registration};
use crate::request::streams::{outbox, ClientShared, Inbox};

const COM_QUIT: u8 = 0x01;
const COM_INIT_DB: u8 = 0x02;
const COM_QUERY: u8 = 0x03;
const COM_FIELD_LIST: u8 = 0x04;
const COM_STATISTICS: u8 = 0x09;
const COM_CHANGE_USER: u8 = 0x11;
const COM_PING: u8 = 0x0E;
const COM_STMT_PREPARE: u8 = 0x16;
const COM_STMT_EXECUTE: u8 = 0x17;
const COM_STMT_SEND_LONG_DATA: u8 = 0x18;
const COM_STMT_CLOSE: u8 = 0x19;
const COM_STMT_RESET: u8 = 0x1A;
const COM_SET_OPTION: u8 = 0x1B;
const COM_RESET_CONNECTION: u8 = 0x1F;

const SERVER_MORE_RESULTS_EXISTS: u16 = 0x0008;

/// Before login, a client may not make us buffer more than a handshake response.
const HANDSHAKE_MAX: usize = 8 * 1024;

type Reader = PacketReader<ClientRead>;
type Writer = PacketWriter<ClientWrite>;

/// Serves one accepted connection until it ends.
pub async fn serve(
    ctx: Arc<Ctx>,
    front: Arc<Front>,
    socket: TcpStream,
    peer: SocketAddr,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
) {
    let id = ctx.next_conn_id();
    let _ = socket.set_nodelay(true);
    let span = tracing::info_span!("mysql", conn = id, %peer);
    async move {
        front.m().connections.inc();
        serve_inner(&ctx, &front, socket, peer, id).await;
        front.m().connections.dec();
    }
    .instrument(span)
    .await
}

async fn serve_inner(ctx: &Arc<Ctx>, front: &Arc<Front>, socket: TcpStream, peer: SocketAddr, id: u64) {
    let (rd, wr) = socket.into_split();
    let read_timeout = Duration::from_millis(front.config.read_timeout_ms);
    let mut reader = PacketReader::new(ClientRead::Plain(rd), HANDSHAKE_MAX, read_timeout);
    let mut writer = PacketWriter::new(ClientWrite::plain(wr), ctx.client_write_timeout());
    let limit = Duration::from_millis(ctx.config.timeouts.handshake_timeout_ms);
    // Only so many connections log in at once, and each address only its share of them.
    let Some(pending) = front.pending(peer.ip()) else {
        writer.packet(&reply::err_before_greeting(
            1040,
            "Too many connections in handshake from this address; try again",
        ));
        let _ = writer.flush().await;
        return;
    };
    let Ok(Ok(_slot)) = tokio::time::timeout(limit, front.handshakes.clone().acquire_owned()).await else {
        writer.packet(&reply::err_before_greeting(
            1040,
            "Too many connections in handshake; try again",
        ));
        let _ = writer.flush().await;
        return;
    };
    let nonce = login::nonce();
    let tls = front.tls.clone();
    writer.packet(&handshake::greeting(
        &front.version(ctx),
        id as u32,
        &nonce,
        tls.is_some(),
    ));
    let mut secure = false;
    let login = async {
        writer.flush().await?;
        let (seq, first) = reader.read(Some(1)).await?;
        let first = match (handshake::is_ssl_request(&first), &tls) {
            (true, Some(tls)) => {
                // SSLRequest: the rest of the login runs over TLS. Nothing may have come
                // after it in clear.
                if reader.buffered_len() > 0 {
                    return Err(login::LoginError::Bad(handshake::BadResponse::Malformed(
                        "bytes in clear after the SSLRequest",
                    )));
                }
                let (ClientRead::Plain(rd), Some(wr)) = (
                    std::mem::replace(&mut reader, PacketReader::new(ClientRead::Closed, 0, read_timeout)).into_inner(),
                    std::mem::replace(&mut writer, PacketWriter::new(ClientWrite::closed(), Duration::ZERO))
                        .into_inner()
                        .into_plain(),
                ) else {
                    return Err(PacketError::Closed.into());
                };
                let socket = rd.reunite(wr).map_err(|_| PacketError::Closed)?;
                let Some((r, w)) = crate::client::tls::upgrade(socket, tls, limit, &ctx.metrics).await else {
                    return Err(PacketError::Closed.into());
                };
                reader = PacketReader::new(r, HANDSHAKE_MAX, read_timeout);
                writer = PacketWriter::new(w, ctx.client_write_timeout());
                writer.seq = seq.wrapping_add(1);
                secure = true;
                None
            }
            _ => {
                writer.seq = seq.wrapping_add(1);
                Some((seq, first))
            }
        };
        login::login(
            &mut reader,
            &mut writer,
            &front.users,
            &nonce,
            &peer.ip().to_string(),
            first,
            |user| front.auth_blocked(peer.ip(), user),
        )
        .await
    };
    let login = match tokio::time::timeout(limit, login).await {
        Err(_) => {
            debug!("no login within the handshake timeout");
            return;
        }
        Ok(Err(e)) => {
            info!("MySQL login refused: {e}");
            if let login::LoginError::Denied { user, .. } = &e {
                front.auth_failed(peer.ip(), user);
            }
            if let Some(p) = e.reply() {
                writer.packet(&p);
                let _ = writer.flush().await;
            }
            return;
        }
        Ok(Ok(login)) => login,
    };
    front.auth_succeeded(peer.ip(), &login.name);
    drop(_slot);
    drop(pending);
    if front.config.require_secure_transport && !secure {
        writer.packet(&reply::err(
            3159,
            "08004",
            "Connections using insecure transport are prohibited while --require_secure_transport=ON.",
        ));
        let _ = writer.flush().await;
        return;
    }
    let Some(user_slot) = front.user_slot(login.user) else {
        writer.packet(&reply::err(
            1203,
            "42000",
            &format!(
                "User {} already has more than 'max_user_connections' active connections",
                login.name
            ),
        ));
        let _ = writer.flush().await;
        return;
    };
    let user = &front.users[login.user];
    if let Some(c) = &user.cluster {
        if ctx.group_for(Some(c)).is_none() {
            writer.packet(&reply::err(
                1105,
                "HY000",
                &format!("osprey: user's cluster {c:?} is not configured"),
            ));
            let _ = writer.flush().await;
            return;
        }
    }
    debug!(user = %login.name, schema = ?login.schema, "MySQL client logged in");
    reader.set_max(ctx.config.limits.max_payload.min(64 << 20));
    let (out_tx, inbox) = outbox(
        ctx.config.limits.client_write_queue,
        ctx.config.limits.client_write_queue_bytes,
    );
    let shared = ClientShared::new(
        id,
        out_tx,
        ctx.config.limits.max_streams_per_connection as usize,
        0,
        ctx.config.limits.max_request_bytes_per_connection,
        ctx.metrics.clone(),
    );
    // Fair turns: each MySQL user is a tenant of its own, after the client tokens.
    let tenant = (ctx.client_tokens.len() + login.user) as u32;
    for group in &ctx.groups {
        group.open_conn(id, tenant);
    }
    let registered = ctx.clients.register(
        id,
        ClientInfo::new("mysql", login.name.clone(), Some(peer), &login.attrs),
    );
    let mut conn = Conn {
        registered,
        ctx: ctx.clone(),
        front: front.clone(),
        state: ClientState::new(login.schema.clone(), login.collation),
        login_state: ClientState::new(login.schema.clone(), login.collation),
        cluster: user.cluster.clone(),
        shared,
        inbox,
        sessions: Sessions::default(),
        next_stream: 1,
        session: None,
        in_transaction: false,
        sticky: None,
        last_gtid: None,
        deprecate_eof: login.caps & CLIENT_DEPRECATE_EOF != 0,
        found_rows: login.caps & handshake::CLIENT_FOUND_ROWS != 0,
        multi_statements: login.caps & handshake::CLIENT_MULTI_STATEMENTS != 0,
        // MULTI_STATEMENTS implies MULTI_RESULTS, as on a server.
        multi_results: login.caps & (handshake::CLIENT_MULTI_RESULTS | handshake::CLIENT_MULTI_STATEMENTS) != 0,
        session_lost: false,
        lost_outcome: None,
        row_count: -1,
        last_insert_id: 0,
        stmts: prepared::Statements::default(),
        stmt_bytes: None,
        blob_params: Vec::new(),
        long_data_error: None,
        login,
        nonce,
        peer,
        user_slot,
    };
    // A database named at connect must exist, as on a server.
    if let Some(db) = conn.state.schema.clone() {
        if let Err(e) = conn.check_schema(&db).await {
            let (errno, state, msg) = reply::error_of(&e);
            writer.packet(&reply::err(errno, &state, &msg));
            let _ = writer.flush().await;
            conn.close().await;
            return;
        }
    }
    writer.packet(&reply::ok(0, 0, 0, conn.status(), 0));
    if writer.flush().await.is_err() {
        conn.close().await;
        return;
    }
    let why = conn.run(&mut reader, &mut writer).await;
    debug!("MySQL connection ends: {why}");
    writer.shutdown().await;
    conn.close().await;
}

/// Why the command loop ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("{0}")]
    Packet(#[from] PacketError),
    #[error("COM_QUIT")]
    Quit,
    #[error("idle past mysql.idle_timeout_ms")]
    Idle,
    #[error("the dispatcher is draining")]
    Draining,
    #[error("the pinned database session was lost")]
    SessionLost,
    #[error("COM_CHANGE_USER refused")]
    ChangeUserRefused,
    #[error("osprey: {0}")]
    Internal(String),
}

struct Conn {
    ctx: Arc<Ctx>,
    /// Its entry in the operators' directory of clients.
    registered: Registration,
    front: Arc<Front>,
    login: Login,
    /// The greeting's scramble (COM_CHANGE_USER answers it again).
    nonce: [u8; 20],
    peer: SocketAddr,
    /// This connection counted against its user's `max_connections`.
    user_slot: super::UserSlot,
    /// What the client's statements must see.
    state: ClientState,
    /// The state right after login (COM_RESET_CONNECTION goes back to it).
    login_state: ClientState,
    cluster: Option<String>,
    shared: Arc<ClientShared>,
    inbox: Inbox,
    sessions: Sessions,
    next_stream: u32,
    /// The stream of the open session, if the client is pinned.
    session: Option<u32>,
    /// The server said a transaction is open (only ever in a session).
    in_transaction: bool,
    /// Why the client stays pinned beyond its transaction.
    sticky: Option<&'static str>,
    /// Read-your-writes: the newest GTID this connection wrote.
    last_gtid: Option<String>,
    deprecate_eof: bool,
    /// The client asked for `CLIENT_FOUND_ROWS`.
    found_rows: bool,
    /// Several statements in one COM_QUERY are allowed (`CLIENT_MULTI_STATEMENTS`, then
    /// COM_SET_OPTION).
    multi_statements: bool,
    /// The client reads each result apart (`CLIENT_MULTI_RESULTS`): a CALL's status, each
    /// statement's OK.
    multi_results: bool,
    /// The session ended without the client (seen on its stream).
    session_lost: bool,
    /// What its `ERROR` said became of its transaction.
    lost_outcome: Option<TransactionOutcome>,
    /// `ROW_COUNT()` and `LAST_INSERT_ID()` as the client's own statements left them.
    row_count: i64,
    last_insert_id: u64,
    /// Its prepared statements.
    stmts: prepared::Statements,
    /// What they and their long data hold, charged to the port's statement budget
    /// (`mysql.max_statement_bytes`, all connections together).
    stmt_bytes: Option<OwnedSemaphorePermit>,
    /// The BLOB-typed parameters of the EXECUTE being run.
    blob_params: Vec<u16>,
    /// A `COM_STMT_SEND_LONG_DATA` that failed (it has no answer): the next EXECUTE's.
    long_data_error: Option<prepared::StmtError>,
}

/// What a statement's stream came back with.
struct Answer {
    end: End,
    error: Option<ErrorBody>,
    /// A result set was written (its terminator is written too).
    had_rows: bool,
    /// The session the statement was sent to.
    session: Option<u32>,
}

impl Conn {
    fn status(&self) -> u16 {
        let mut s = 0;
        if self.state.autocommit {
            s |= SERVER_STATUS_AUTOCOMMIT;
        }
        if self.in_transaction {
            s |= SERVER_STATUS_IN_TRANS;
        }
        s
    }

    fn stream_id(&mut self) -> u32 {
        let id = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(2).max(1);
        id
    }

    async fn run(&mut self, reader: &mut Reader, writer: &mut Writer) -> Ended {
        let idle = Duration::from_millis(self.front.config.idle_timeout_ms);
        loop {
            // Between commands: a draining dispatcher lets a client go unless it is inside
            // a transaction (that one may finish within drain_timeout). One pinned only by
            // untracked state has nothing to finish.
            let draining = self.ctx.draining.is_cancelled();
            if draining && !self.in_transaction && !reader.buffered() {
                return Ended::Draining;
            }
            let next = tokio::select! {
                r = tokio::time::timeout(idle, reader.read(Some(0))) => r,
                _ = self.ctx.draining.cancelled(), if !draining && !self.in_transaction => return Ended::Draining,
            };
            let (_, packet) = match next {
                Err(_) => return Ended::Idle,
                Ok(Err(PacketError::TooLarge { len, max })) => {
                    writer.seq = 1;
                    writer.packet(&reply::err(
                        reply::ER_NET_PACKET_TOO_LARGE,
                        "08S01",
                        &format!("Got a packet bigger than 'max_allowed_packet' bytes ({len} > {max})"),
                    ));
                    let _ = writer.flush().await;
                    return Ended::Packet(PacketError::TooLarge { len, max });
                }
                Ok(Err(e)) => return e.into(),
                Ok(Ok(p)) => p,
            };
            writer.seq = 1;
            let Some((&command, body)) = packet.split_first() else {
                writer.packet(&reply::err(reply::ER_UNKNOWN_COM, "08S01", "Unknown command"));
                if let Err(e) = writer.flush().await {
                    return e.into();
                }
                continue;
            };
            self.front.m().command(command);
            let result = self.command(command, body, reader, writer).await;
            // What a CLOSE, an EXECUTE or a reset gave back leaves the budget.
            self.charge(0);
            if let Err(ended) = result {
                return ended;
            }
            if let Err(e) = writer.flush().await {
                return e.into();
            }
        }
    }

    async fn command(&mut self, command: u8, body: &[u8], r: &mut Reader, w: &mut Writer) -> Result<(), Ended> {
        // A session that ended while the client was idle (idle-in-transaction timeout, an
        // operator, a lost worker): the client's transaction or state is gone.
        self.take_session_news();
        if command != COM_QUIT && self.session.is_none() && (self.in_transaction || self.sticky.is_some()) {
            // Pinned state was lost with its session: whatever the command, the client
            // must know.
            let outcome = self.lost_outcome.take();
            return self.lost(w, outcome).await;
        }
        match command {
            COM_QUIT => Err(Ended::Quit),
            COM_CHANGE_USER => self.change_user(body, r, w).await,
            COM_PING => {
                w.packet(&reply::ok(0, 0, 0, self.status(), 0));
                Ok(())
            }
            COM_QUERY => match osprey_mysql::text::utf8_query(body) {
                Some(sql) => self.query(&sql, w).await,
                None => {
                    w.packet(&reply::err(
                        1366,
                        "HY000",
                        "osprey: statement text that is not UTF-8 outside its string literals",
                    ));
                    Ok(())
                }
            },
            COM_INIT_DB => {
                let db = String::from_utf8_lossy(body).into_owned();
                self.use_schema(db, w).await
            }
            COM_FIELD_LIST => {
                let table = Cursor(body).cstr().unwrap_or(body);
                let table = String::from_utf8_lossy(table).replace('`', "``");
                self.field_list(&table, w).await
            }
            COM_STATISTICS => {
                let m = &self.ctx.metrics;
                let text = format!(
                    "Uptime: {}  Threads: {}  Questions: {}  Slow queries: 0  Opens: 0  Open tables: 0  Queries per second avg: 0.000",
                    self.front.started.elapsed().as_secs(),
                    self.front.m().connections.get() + m.client_connections.get(),
                    m.streams_opened.get(),
                );
                w.packet(text.as_bytes());
                Ok(())
            }
            COM_RESET_CONNECTION => {
                self.end_session();
                self.state = self.login_state.clone();
                self.sticky = None;
                self.registered.info.set_pinned_by(None);
                self.stmts = prepared::Statements::default();
                self.long_data_error = None;
                self.row_count = -1;
                self.last_insert_id = 0;
                self.last_gtid = None;
                w.packet(&reply::ok(0, 0, 0, self.status(), 0));
                Ok(())
            }
            COM_SET_OPTION => {
                // MYSQL_OPTION_MULTI_STATEMENTS_ON (0) and _OFF (1); the server answers EOF.
                match Cursor(body).u16() {
                    Some(option @ (0 | 1)) => {
                        self.multi_statements = option == 0;
                        // As on a server, multi-statements bring each result apart.
                        self.multi_results |= self.multi_statements;
                        w.packet(&reply::terminator(self.deprecate_eof, self.status(), 0));
                    }
                    _ => w.packet(&reply::err(reply::ER_UNKNOWN_COM, "08S01", "Unknown command")),
                }
                Ok(())
            }
            COM_STMT_PREPARE => {
                let sql = String::from_utf8_lossy(body).into_owned();
                self.prepare(sql, w).await
            }
            COM_STMT_EXECUTE => self.execute_prepared(body, w).await,
            COM_STMT_SEND_LONG_DATA => {
                // No answer: an error waits for the EXECUTE.
                let limit = self.ctx.config.limits.max_request_bytes_per_connection;
                let kept = if self.charge(body.len().saturating_sub(6)) {
                    self.stmts.long_data(body, limit)
                } else {
                    // The port's budget for all connections is spent: as past this
                    // connection's own.
                    Err(prepared::StmtError::LongDataTooLarge)
                };
                if let Err(e) = kept {
                    self.long_data_error.get_or_insert(e);
                }
                w.seq = 0;
                Ok(())
            }
            COM_STMT_CLOSE => {
                self.stmts.close(Cursor(body).u32().unwrap_or(0));
                Ok(())
            }
            COM_STMT_RESET => {
                let id = Cursor(body).u32().unwrap_or(0);
                self.long_data_error = None;
                match self.stmts.reset(id) {
                    Ok(()) => w.packet(&reply::ok(0, 0, 0, self.status(), 0)),
                    Err(e) => {
                        w.packet(&e.reply());
                    }
                }
                Ok(())
            }
            _ => {
                w.packet(&reply::err(reply::ER_UNKNOWN_COM, "08S01", "Unknown command"));
                Ok(())
            }
        }
    }

    /// Brings the charge for the prepared statements to what they hold plus `extra` about
    /// to be kept. False: the dispatcher's budget has no room for `extra` (nothing held
    /// changes then).
    fn charge(&mut self, extra: usize) -> bool {
        let want = self.stmts.bytes().saturating_add(extra);
        let have = self.stmt_bytes.as_ref().map_or(0, |p| p.num_permits());
        if want > have {
            let more = u32::try_from(want - have).unwrap_or(u32::MAX);
            let Ok(p) = self.front.statement_bytes.clone().try_acquire_many_owned(more) else {
                return false;
            };
            match &mut self.stmt_bytes {
                Some(held) => held.merge(p),
                None => self.stmt_bytes = Some(p),
            }
        } else if want < have {
            if let Some(held) = &mut self.stmt_bytes {
                drop(held.split(have - want));
            }
        }
        true
    }

    /// Frames of the session's own stream that came while no statement was running.
    fn take_session_news(&mut self) {
        while let Some(q) = self.inbox.try_recv() {
            self.on_stray(q.frame);
        }
    }

    /// A frame that is not for the statement being answered: only the session's stream
    /// has any (its abort, its end); anything else is of a stream already given up.
    fn on_stray(&mut self, frame: Frame) {
        if Some(frame.stream) != self.session {
            return;
        }
        match frame.kind {
            Kind::Error => {
                let body = frame.body::<ErrorBody>().ok();
                warn!(
                    "pinned session ended: {}",
                    body.as_ref().map_or("", |e| e.message.as_str())
                );
                self.lost_outcome = body.and_then(|e| e.transaction);
                self.session_lost = true;
            }
            Kind::End => {
                self.session = None;
                self.session_lost = true;
            }
            _ => {}
        }
    }

    /// A `COM_QUERY`: the text protocol.
    async fn query(&mut self, sql: &str, w: &mut Writer) -> Result<(), Ended> {
        // Read once: every question below is asked of the same code.
        let code = osprey_sql::Code::of(sql);
        if state::several_statements_in(&code) {
            if !self.multi_statements {
                // As a server whose client did not turn multi-statements on.
                w.packet(&reply::err(
                    1064,
                    "42000",
                    "You have an error in your SQL syntax: several statements in one query, and this connection \
                     did not turn multi-statements on (CLIENT_MULTI_STATEMENTS or COM_SET_OPTION)",
                ));
                return Ok(());
            }
            return self.several(sql, w).await;
        }
        if let Some(db) = state::use_schema_in(sql, &code) {
            return self.use_schema(db, w).await;
        }
        if let Some(Set::Tracked(assignments)) = parse_set_in(sql, &code) {
            return self.set(sql, &assignments, w).await;
        }
        self.statement(sql, None, state::Facts::of(&code), w).await
    }

    /// One statement: from `COM_QUERY` (`params` None: the text protocol) or a prepared
    /// statement's `COM_STMT_EXECUTE` (the binary protocol), with what its text says.
    async fn statement(
        &mut self,
        sql: &str,
        params: Option<Vec<Value>>,
        facts: state::Facts,
        w: &mut Writer,
    ) -> Result<(), Ended> {
        if self.session.is_none() && facts.plain_end {
            // Nothing is open: the server would answer OK.
            w.packet(&reply::ok(0, 0, 0, self.status(), 0));
            return Ok(());
        }
        if let (None, Some(c)) = (self.session, facts.counter) {
            return self.counter(c, params.is_some(), w).await;
        }
        if let Err(e) = self.pin(facts.sticky, facts.controls_session).await {
            return self.error(w, &e);
        }
        let mut request = self.request(sql.to_string());
        if let Some(params) = params {
            request.params = params;
            request.blob_params = std::mem::take(&mut self.blob_params);
            request.prepared = true;
            request.text_rows = false;
        }
        let answer = self.execute(request, w, false).await?;
        self.finish(answer, w).await
    }

    /// Several statements in one COM_QUERY: they run together on one worker of the
    /// primary (the server splits them), each result apart. State they change cannot be
    /// followed statement by statement, so such a query pins the client as an untracked
    /// statement would; a transaction in them pins until it ends.
    async fn several(&mut self, sql: &str, w: &mut Writer) -> Result<(), Ended> {
        let mut pin = None;
        let mut transaction = false;
        for (i, part) in state::statements(sql).into_iter().enumerate() {
            let code = osprey_sql::Code::of(part);
            // A ROW_COUNT() after a statement of the same query is the server's to answer;
            // first, it would read the worker's last statement, not the client's.
            let tracked = state::use_schema_in(part, &code).is_some()
                || matches!(parse_set_in(part, &code), Some(Set::Tracked(_)))
                || (i == 0 && state::counter_query_in(&code).is_some());
            pin = pin
                .or(state::sticky_reason_in(&code))
                .or(tracked.then_some("multi_statement"));
            transaction |= code.controls_session();
        }
        if let Err(e) = self.pin(pin, transaction).await {
            return self.error(w, &e);
        }
        let mut request = self.request(sql.to_string());
        // A read among writes: the classifier sees one statement.
        request.force_primary = true;
        let answer = self.execute(request, w, false).await?;
        self.finish(answer, w).await
    }

    /// Opens a session if there is none and the statement(s) need one (a transaction,
    /// autocommit off, state that cannot be tracked: `pin`, which then pins until reset).
    async fn pin(&mut self, pin: Option<&'static str>, transaction: bool) -> Result<(), ErrorBody> {
        if self.session.is_none() && (transaction || pin.is_some() || !self.state.autocommit) {
            self.open_session().await?;
        }
        if let Some(reason) = pin {
            if self.sticky.is_none() {
                self.front.m().pinned(reason);
            }
            self.sticky.get_or_insert(reason);
            self.registered.info.set_pinned_by(self.sticky);
        }
        Ok(())
    }

    /// `SELECT ROW_COUNT()` / `SELECT LAST_INSERT_ID()` from the client's own last OK.
    async fn counter(&mut self, c: state::Counter, binary: bool, w: &mut Writer) -> Result<(), Ended> {
        let (name, value, flags) = match c {
            state::Counter::RowCount => ("ROW_COUNT()", Value::Int(self.row_count), 0x8081u16),
            state::Counter::LastInsertId => ("LAST_INSERT_ID()", Value::UInt(self.last_insert_id), 0x80A1),
        };
        let column = osprey_protocol::Column {
            name: name.into(),
            table: String::new(),
            column_type: 8,
            flags,
            charset: 63,
            length: 21,
            decimals: 0,
        };
        let deprecate_eof = self.deprecate_eof;
        let status = self.status();
        let mut sink = Sink::Client {
            w,
            deprecate_eof,
            binary,
            columns: Vec::new(),
        };
        let columns = Columns {
            result_set: 0,
            columns: vec![column],
        };
        sink.columns(columns, false, status).await?;
        sink.rows(&Rows {
            rows: vec![vec![value]],
        })
        .await?;
        w.packet(&reply::terminator(deprecate_eof, status, 0));
        self.row_count = -1;
        Ok(())
    }

    /// `COM_STMT_PREPARE`: the statement described by a worker (its parameters and
    /// columns), kept under an id of the dispatcher's.
    async fn prepare(&mut self, sql: String, w: &mut Writer) -> Result<(), Ended> {
        let mut request = self.request(sql.clone());
        request.prepare_only = true;
        request.text_rows = false;
        let mut sets = Vec::new();
        let answer = {
            let mut sink = Some(Sink::Describe(&mut sets));
            self.run_stream(request, &mut sink).await?
        };
        if let Some(e) = &answer.error {
            if answer.session.is_some() && (is_lost(e) || !self.sessions.is_open(answer.session.unwrap_or_default())) {
                let outcome = self.session_outcome(answer.session.unwrap_or_default()).await;
                return self.lost(w, outcome).await;
            }
            return self.error(w, e);
        }
        let mut sets = sets.into_iter();
        let params = sets.next().unwrap_or_default();
        let columns = sets.next().unwrap_or_default();
        if !self.charge(prepared::cost(&sql, &params, &columns)) {
            w.packet(&reply::err(
                1041,
                "HY000",
                "osprey: out of memory for prepared statements (mysql.max_statement_bytes is spent); try again",
            ));
            return Ok(());
        }
        let id = match self.stmts.add(sql, params, columns) {
            Ok(id) => id,
            Err(e) => {
                w.packet(&e.reply());
                return Ok(());
            }
        };
        let p = self.stmts.get(id).expect("just added");
        w.packet(&prepared::prepare_ok(id, p.columns.len(), p.params.len()));
        for defs in [&p.params, &p.columns] {
            if defs.is_empty() {
                continue;
            }
            for c in defs.iter() {
                w.packet(&reply::column(c));
            }
            if !self.deprecate_eof {
                w.packet(&reply::eof(self.status(), 0));
            }
        }
        Ok(())
    }

    /// `COM_STMT_EXECUTE`.
    async fn execute_prepared(&mut self, body: &[u8], w: &mut Writer) -> Result<(), Ended> {
        if let Some(e) = self.long_data_error.take() {
            w.packet(&e.reply());
            return Ok(());
        }
        let taken = self.stmts.execute(body);
        // The long data moves into the REQUEST, which admission charges on its own.
        self.charge(0);
        match taken {
            Ok(execute) => {
                let Some((sql, facts)) = self.stmts.get(execute.id).map(|p| (p.sql.clone(), p.facts)) else {
                    // `execute` found it a moment ago.
                    w.packet(&prepared::StmtError::Unknown(execute.id).reply());
                    return Ok(());
                };
                self.blob_params = execute.blob;
                self.statement(&sql, Some(execute.values), facts, w).await
            }
            Err(e) => {
                w.packet(&e.reply());
                Ok(())
            }
        }
    }

    /// A SET of tracked variables: checked on a worker (which keeps them applied), then
    /// remembered; in a session it runs there as written.
    async fn set(&mut self, sql: &str, assignments: &[(String, String)], w: &mut Writer) -> Result<(), Ended> {
        let Some(next) = self.state.with(assignments) else {
            w.packet(&reply::err(
                1231,
                "42000",
                "Variable 'autocommit' can't be set to the value given",
            ));
            return Ok(());
        };
        if self.session.is_some() {
            let request = self.request(sql.to_string());
            let answer = self.execute(request, w, false).await?;
            if answer.error.is_none() {
                // Autocommit as the server had it after the statement (`execute` took it
                // from END) unless this SET named it: `next` was computed before.
                let autocommit = self.state.autocommit;
                self.state = next;
                if !assignments.iter().any(|(n, _)| n == "autocommit") {
                    self.state.autocommit = autocommit;
                }
            }
            return self.finish(answer, w).await;
        }
        let only_autocommit = next.vars == self.state.vars;
        if !only_autocommit {
            let mut request = self.request("DO 0".into());
            request.vars = next.request_vars(false);
            let answer = self.execute(request, w, true).await?;
            if let Some(e) = &answer.error {
                return self.error(w, e);
            }
        }
        self.state = next;
        self.row_count = 0;
        w.packet(&reply::ok(0, 0, 0, self.status(), 0));
        Ok(())
    }

    async fn use_schema(&mut self, db: String, w: &mut Writer) -> Result<(), Ended> {
        if self.session.is_some() {
            let sql = format!("USE `{}`", db.replace('`', "``"));
            let request = self.request(sql);
            let answer = self.execute(request, w, false).await?;
            if answer.error.is_none() {
                self.state.schema = Some(db);
            }
            return self.finish(answer, w).await;
        }
        match self.check_schema(&db).await {
            Ok(()) => {
                self.state.schema = Some(db);
                w.packet(&reply::ok(0, 0, 0, self.status(), 0));
                Ok(())
            }
            Err(e) if is_lost(&e) => Err(Ended::Internal(e.message)),
            Err(e) => self.error(w, &e),
        }
    }

    /// Whether `db` can be the default database (the worker's `USE` says).
    async fn check_schema(&mut self, db: &str) -> Result<(), ErrorBody> {
        let mut request = self.request("DO 0".into());
        request.schema = Some(db.to_string());
        let mut sink = None;
        match self.run_stream(request, &mut sink).await {
            Ok(a) => a.error.map_or(Ok(()), Err),
            Err(e) => Err(ErrorBody::undispatched(
                Origin::Dispatcher,
                ErrorCode::Internal,
                e.to_string(),
            )),
        }
    }

    async fn field_list(&mut self, table: &str, w: &mut Writer) -> Result<(), Ended> {
        let request = self.request(format!("SELECT * FROM `{table}` LIMIT 0"));
        let mut columns = None;
        let answer = {
            let mut sink = Some(Sink::FieldList(&mut columns));
            self.run_stream(request, &mut sink).await?
        };
        if let Some(e) = &answer.error {
            return self.error(w, e);
        }
        for c in columns.unwrap_or_default() {
            let mut p = reply::column(&c);
            p.push(0xFB); // no default value
            w.packet(&p);
        }
        w.packet(&reply::eof(self.status(), 0));
        Ok(())
    }

    /// The REQUEST for `sql` as this client's state says: in its session, or with its
    /// database, variables and read-your-writes position.
    fn request(&self, sql: String) -> Request {
        Request {
            sql,
            text_rows: true,
            // The rows go to the client as the server sent them (issue 23 item 9): the
            // same protocol (text for COM_QUERY, binary for a prepared statement) on both
            // sides, and only the packet headers are the dispatcher's.
            raw_rows: true,
            schema: self.state.schema.clone(),
            vars: self.state.request_vars(self.session.is_some()),
            cluster: self.cluster.clone(),
            session: self.session,
            multi_results: self.multi_results,
            causal_gtid: if self.session.is_none() {
                self.last_gtid.clone()
            } else {
                None
            },
            ..Default::default()
        }
    }

    /// Runs one statement and writes its result set (if any) to the client; the OK or ERR
    /// that ends it is for [`Conn::finish`]. `quiet`: write nothing (a check).
    async fn execute(&mut self, request: Request, w: &mut Writer, quiet: bool) -> Result<Answer, Ended> {
        let deprecate_eof = self.deprecate_eof;
        let binary = request.prepared;
        let mut sink = (!quiet).then_some(Sink::Client {
            w,
            deprecate_eof,
            binary,
            columns: Vec::new(),
        });
        let answer = self.run_stream(request, &mut sink).await?;
        if let (Some(_), Some(on)) = (answer.session, answer.end.autocommit) {
            // Statements of a session may turn autocommit on or off themselves (several
            // in one query, which pin): the client's state follows the server's.
            self.state.autocommit = on;
        }
        if let Some(Sink::Client { w, .. }) = sink {
            if answer.had_rows {
                // The terminator of the last result set, now that its status is known.
                self.in_transaction = answer.end.in_transaction && self.session.is_some();
                let status = self.status();
                let warnings = answer.end.warnings.min(u32::from(u16::MAX)) as u16;
                w.packet(&reply::terminator(self.deprecate_eof, status, warnings));
            }
        }
        Ok(answer)
    }

    /// Sends `request` through admission and reads its stream to the end, handing what
    /// comes to `sink`.
    async fn run_stream(&mut self, request: Request, sink: &mut Option<Sink<'_>>) -> Result<Answer, Ended> {
        let stream = self.stream_id();
        let draining = self.ctx.draining.is_cancelled();
        let session = request.session;
        if let Err(e) = admit_built(&self.ctx, &self.shared, &self.sessions, stream, request, draining).await {
            return Err(Ended::Internal(e.message));
        }
        let mut answer = Answer {
            end: End::default(),
            error: None,
            had_rows: false,
            session,
        };
        loop {
            let Some(q) = self.inbox.recv().await else {
                return Err(Ended::Internal("the answer queue closed".into()));
            };
            let frame = q.frame;
            if frame.stream != stream {
                self.on_stray(frame);
                continue;
            }
            let bad = |e: osprey_protocol::ProtocolError| Ended::Internal(format!("bad frame from a worker: {e}"));
            match frame.kind {
                Kind::Columns => {
                    let cols = Columns::from_frame(&frame).map_err(bad)?;
                    if let Some(sink) = sink {
                        sink.columns(cols, answer.had_rows, self.status()).await?;
                    }
                    answer.had_rows = true;
                }
                // Rows only inside a result set: written anywhere else, a row would read as
                // something else to the client (an OK, a LOCAL INFILE request).
                Kind::Rows | Kind::RawRows if !answer.had_rows => {
                    return Err(Ended::Internal(format!(
                        "bad frame from a worker: {} outside a result set",
                        frame.kind.name()
                    )));
                }
                Kind::Rows => {
                    let rows: Rows = frame.body().map_err(bad)?;
                    if let Some(sink) = sink {
                        sink.rows(&rows).await?;
                    }
                }
                Kind::RawRows => {
                    let rows = osprey_protocol::raw_rows::decode(&frame.payload).map_err(bad)?;
                    if let Some(sink) = sink {
                        sink.raw_rows(&rows).await?;
                    }
                }
                Kind::ResultEnd => {
                    let end: ResultEnd = frame.body().map_err(bad)?;
                    if let Some(id) = end.last_insert_id {
                        self.last_insert_id = id;
                    }
                    // The status as the server had it after that result.
                    let mut status = (self.status() & !SERVER_STATUS_IN_TRANS) | SERVER_MORE_RESULTS_EXISTS;
                    if self.session.is_some() && end.in_transaction {
                        status |= SERVER_STATUS_IN_TRANS;
                    }
                    // In a session the statements may change autocommit themselves
                    // (`SET autocommit = 0; …`): the server's own flag.
                    match end.autocommit.filter(|_| self.session.is_some()) {
                        Some(true) => status |= SERVER_STATUS_AUTOCOMMIT,
                        Some(false) => status &= !SERVER_STATUS_AUTOCOMMIT,
                        None => {}
                    }
                    if let Some(sink) = sink {
                        sink.result_end(&end, answer.had_rows, status, self.found_rows);
                    }
                    answer.had_rows = false;
                }
                Kind::Error => answer.error = Some(frame.body().map_err(bad)?),
                Kind::End => {
                    answer.end = End::from_frame(&frame).map_err(bad)?;
                    if answer.error.is_some() {
                        answer.had_rows = false;
                    }
                    return Ok(answer);
                }
                _ => {}
            }
        }
    }

    /// Ends a statement: OK (or the result set's terminator, already written) or ERR, and
    /// whether the client stays pinned.
    async fn finish(&mut self, answer: Answer, w: &mut Writer) -> Result<(), Ended> {
        let in_session = self.session.is_some() || answer.session.is_some();
        let sent_in = answer.session;
        if let Some(gtid) = &answer.end.gtid {
            self.last_gtid = Some(gtid.clone());
        }
        self.row_count = match (&answer.error, answer.had_rows) {
            (None, false) => answer.end.affected_rows as i64,
            _ => -1,
        };
        if let Some(id) = answer.end.last_insert_id.filter(|id| *id != 0) {
            self.last_insert_id = id;
        }
        if let Some(e) = &answer.error {
            let ended = match sent_in {
                Some(id) => is_lost(e) || self.session_lost || !self.sessions.is_open(id),
                None => false,
            };
            if ended {
                let outcome = match e.transaction {
                    Some(t) => Some(t),
                    None => self.session_outcome(sent_in.unwrap_or_default()).await,
                };
                return self.lost(w, outcome).await;
            }
            // A statement refused before it ran (blocked, throttled, a full queue: not
            // dispatched) changed nothing on the session, whatever its END says: believing
            // "no transaction" would end the session and roll back the client's open
            // transaction, and its next statements would autocommit.
            if e.dispatched || sent_in.is_none() {
                self.in_transaction = in_session && answer.end.in_transaction;
            }
            self.error(w, e)?;
        } else {
            self.in_transaction = in_session && answer.end.in_transaction;
            if !answer.had_rows {
                let warnings = answer.end.warnings.min(u32::from(u16::MAX)) as u16;
                w.packet(&statement_ok(
                    answer.end.affected_rows,
                    answer.end.last_insert_id,
                    self.status(),
                    warnings,
                    answer.end.info.as_deref(),
                    self.found_rows,
                ));
            }
        }
        if self.session.is_some() && !self.in_transaction && self.sticky.is_none() {
            self.end_session();
        }
        Ok(())
    }

    fn error(&self, w: &mut Writer, e: &ErrorBody) -> Result<(), Ended> {
        let (errno, state, msg) = reply::error_of(e);
        w.packet(&reply::err(errno, &state, &msg));
        Ok(())
    }

    /// The pinned session is gone (its worker lost, an idle-in-transaction timeout, an
    /// operator): ERR 08S01 and the connection closes, so that a driver's pool discards it
    /// — never a silent move to another session.
    async fn lost(&mut self, w: &mut Writer, outcome: Option<TransactionOutcome>) -> Result<(), Ended> {
        let fate = match outcome {
            Some(TransactionOutcome::Unknown) => "; the outcome of the COMMIT in flight is unknown",
            Some(TransactionOutcome::RolledBack) => "; the open transaction was rolled back",
            _ if self.in_transaction => "; the open transaction was rolled back",
            _ => "",
        };
        w.packet(&reply::err(
            reply::ER_CONNECTION_KILLED,
            "08S01",
            &format!("osprey: the database session this connection was pinned to was lost{fate}; reconnect"),
        ));
        let _ = w.flush().await;
        Err(Ended::SessionLost)
    }

    /// `COM_CHANGE_USER`: the new user checked (an auth switch if its plugin asks), then
    /// everything of the old one goes (its session rolled back and its worker reset, its
    /// state, its prepared statements), as on a server. A refusal closes the connection.
    async fn change_user(&mut self, body: &[u8], r: &mut Reader, w: &mut Writer) -> Result<(), Ended> {
        let c = match handshake::parse_change_user(body, self.login.caps) {
            Ok(c) => c,
            Err(e) => {
                w.packet(&reply::err(1043, "08S01", &e.to_string()));
                let _ = w.flush().await;
                return Err(Ended::ChangeUserRefused);
            }
        };
        let host = self.peer.ip().to_string();
        let front = self.front.clone();
        if front.auth_blocked(self.peer.ip(), &c.user) {
            let e = login::LoginError::Blocked { user: c.user, host };
            if let Some(p) = e.reply() {
                w.packet(&p);
                let _ = w.flush().await;
            }
            return Err(Ended::ChangeUserRefused);
        }
        // An auth switch waits for the client's answer: bounded as at login (the command
        // loop's idle timeout does not run meanwhile).
        let limit = Duration::from_millis(self.ctx.config.timeouts.handshake_timeout_ms);
        let checked = tokio::time::timeout(
            limit,
            login::authenticate(
                r,
                w,
                &front.users,
                &self.nonce,
                &host,
                &c.user,
                c.plugin.as_deref(),
                c.auth,
            ),
        )
        .await;
        let Ok(checked) = checked else {
            debug!("no answer to COM_CHANGE_USER's auth switch within the handshake timeout");
            return Err(Ended::ChangeUserRefused);
        };
        let index = match checked {
            Ok(index) => {
                front.auth_succeeded(self.peer.ip(), &c.user);
                index
            }
            Err(e) => {
                info!("MySQL change of user refused: {e}");
                if let login::LoginError::Denied { user, .. } = &e {
                    front.auth_failed(self.peer.ip(), user);
                }
                if let Some(p) = e.reply() {
                    w.packet(&p);
                    let _ = w.flush().await;
                }
                return Err(Ended::ChangeUserRefused);
            }
        };
        // The same user keeps its place (it would count twice for a moment otherwise).
        let slot = if index == self.login.user {
            None
        } else {
            match front.user_slot(index) {
                Some(slot) => Some(slot),
                None => {
                    w.packet(&reply::err(
                        1203,
                        "42000",
                        &format!(
                            "User {} already has more than 'max_user_connections' active connections",
                            c.user
                        ),
                    ));
                    let _ = w.flush().await;
                    return Err(Ended::ChangeUserRefused);
                }
            }
        };
        if let Some(slot) = slot {
            self.user_slot = slot;
        }
        self.end_session();
        let user = &front.users[index];
        let schema = c.schema.or_else(|| user.schema.clone());
        self.login_state = ClientState::new(schema.clone(), c.collation.unwrap_or(self.login.collation));
        self.state = self.login_state.clone();
        self.sticky = None;
        self.stmts = prepared::Statements::default();
        self.long_data_error = None;
        self.row_count = -1;
        self.last_insert_id = 0;
        self.last_gtid = None;
        self.cluster = user.cluster.clone();
        self.registered = self.ctx.clients.register(
            self.shared.id,
            ClientInfo::new("mysql", c.user.clone(), Some(self.peer), &self.registered.info.attrs),
        );
        self.login.user = index;
        self.login.name = c.user;
        let tenant = (self.ctx.client_tokens.len() + index) as u32;
        for group in &self.ctx.groups {
            group.open_conn(self.shared.id, tenant);
        }
        if let Some(db) = schema {
            if let Err(e) = self.check_schema(&db).await {
                return self.error(w, &e);
            }
        }
        w.packet(&reply::ok(0, 0, 0, self.status(), 0));
        Ok(())
    }

    /// What became of the transaction of the session opened on `id`, which ended: its
    /// stream's ERROR says, and its END follows (the closed loop: it comes).
    async fn session_outcome(&mut self, id: u32) -> Option<TransactionOutcome> {
        if self.session_lost && self.session.is_none() {
            // Its frames were read already (`on_stray`).
            return self.lost_outcome.take();
        }
        let mut outcome = self.lost_outcome.take();
        let wait = async {
            while let Some(q) = self.inbox.recv().await {
                if q.frame.stream != id {
                    continue;
                }
                match q.frame.kind {
                    Kind::Error => outcome = q.frame.body::<ErrorBody>().ok().and_then(|e| e.transaction),
                    Kind::End => break,
                    _ => {}
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), wait).await;
        self.session = None;
        outcome
    }

    /// Opens a session: a worker of the user's cluster's primary pinned to this client.
    async fn open_session(&mut self) -> Result<(), ErrorBody> {
        let stream = self.stream_id();
        let request = Request {
            open_session: true,
            cluster: self.cluster.clone(),
            ..Default::default()
        };
        let draining = self.ctx.draining.is_cancelled();
        admit_built(&self.ctx, &self.shared, &self.sessions, stream, request, draining).await?;
        let mut error = None;
        loop {
            let Some(q) = self.inbox.recv().await else {
                return Err(ErrorBody::undispatched(
                    Origin::Dispatcher,
                    ErrorCode::Internal,
                    "the answer queue closed",
                ));
            };
            let frame = q.frame;
            if frame.stream != stream {
                self.on_stray(frame);
                continue;
            }
            match frame.kind {
                Kind::Session => {
                    let opened: Result<SessionOpened, _> = frame.body();
                    debug!(session = stream, member = ?opened.map(|o| o.member).ok(), "pinned");
                    self.session = Some(stream);
                    self.session_lost = false;
                    self.in_transaction = false;
                    self.front.m().sessions_opened.inc();
                    return Ok(());
                }
                Kind::Error => error = frame.body::<ErrorBody>().ok(),
                Kind::End => {
                    return Err(error.unwrap_or_else(|| {
                        ErrorBody::undispatched(Origin::Dispatcher, ErrorCode::Internal, "the session ended at once")
                    }))
                }
                _ => {}
            }
        }
    }

    /// Ends the session (its worker is reset before anyone else uses it); its `END`
    /// arrives later and is dropped.
    fn end_session(&mut self) {
        if let Some(stream) = self.session.take() {
            self.shared.cancel(stream);
        }
        self.in_transaction = false;
    }

    async fn close(mut self) {
        self.end_session();
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.cancel_all();
        for job in self.ctx.groups.iter().flat_map(|g| g.take_waiting_conn(self.shared.id)) {
            drop(job);
        }
        // What is still on its way is dropped with the queue.
        while self.inbox.try_recv().is_some() {}
        let _ = &self.login;
    }
}

/// A statement's OK packet. With CLIENT_FOUND_ROWS an UPDATE counts the rows it matched
/// (read from the server's message), as a server does.
fn statement_ok(
    affected: u64,
    last_insert_id: Option<u64>,
    status: u16,
    warnings: u16,
    info: Option<&str>,
    found_rows: bool,
) -> Vec<u8> {
    let info = info.unwrap_or("");
    let affected = match (found_rows, reply::rows_matched(info)) {
        (true, Some(matched)) => matched,
        _ => affected,
    };
    reply::ok_info(affected, last_insert_id.unwrap_or(0), status, warnings, info)
}

/// Errors after which the session's database state is gone.
fn is_lost(e: &ErrorBody) -> bool {
    matches!(
        e.code,
        ErrorCode::SessionAborted
            | ErrorCode::WorkerLost
            | ErrorCode::DatabaseFatal
            | ErrorCode::KeepaliveTimeout
            | ErrorCode::Internal
    )
}

/// Where a statement's result set goes.
enum Sink<'a> {
    Client {
        w: &'a mut Writer,
        deprecate_eof: bool,
        /// Binary-protocol rows (a prepared statement's), by the current result's columns.
        binary: bool,
        columns: Vec<osprey_protocol::Column>,
    },
    /// COM_FIELD_LIST: the column definitions only.
    FieldList(&'a mut Option<Vec<osprey_protocol::Column>>),
    /// A statement described (`prepare_only`): each result set's definitions.
    Describe(&'a mut Vec<Vec<osprey_protocol::Column>>),
}

impl Sink<'_> {
    async fn columns(&mut self, cols: Columns, after_another: bool, status: u16) -> Result<(), Ended> {
        match self {
            Sink::FieldList(out) => **out = Some(cols.columns),
            Sink::Describe(out) => out.push(cols.columns),
            Sink::Client {
                w,
                deprecate_eof,
                binary,
                columns,
            } => {
                if after_another {
                    // A statement with several results (a CALL): the one before ends with
                    // "more results".
                    w.packet(&reply::terminator(
                        *deprecate_eof,
                        status | SERVER_MORE_RESULTS_EXISTS,
                        0,
                    ));
                }
                let mut count = Vec::with_capacity(9);
                osprey_mysql::codec::put_lenenc_int(&mut count, cols.columns.len() as u64);
                w.packet(&count);
                for c in &cols.columns {
                    w.packet(&reply::column(c));
                }
                if !*deprecate_eof {
                    w.packet(&reply::eof(status, 0));
                }
                if *binary {
                    *columns = cols.columns;
                }
            }
        }
        Ok(())
    }

    /// The end of one result of several (`RESULT_END`): the result set's terminator, or
    /// the statement's OK, each saying that more follow.
    fn result_end(&mut self, end: &ResultEnd, had_rows: bool, status: u16, found_rows: bool) {
        let Sink::Client { w, deprecate_eof, .. } = self else {
            return;
        };
        let warnings = end.warnings.min(u32::from(u16::MAX)) as u16;
        if had_rows {
            w.packet(&reply::terminator(*deprecate_eof, status, warnings));
            return;
        }
        w.packet(&statement_ok(
            end.affected_rows,
            end.last_insert_id,
            status,
            warnings,
            end.info.as_deref(),
            found_rows,
        ));
    }

    /// Rows as the server sent them to the worker (`RAW_ROWS`), each one packet to the
    /// client. A packet no server sends as a row (one a client would read as the result's
    /// end or an error) is a broken worker's: the connection ends rather than pass it on.
    async fn raw_rows(&mut self, rows: &[&[u8]]) -> Result<(), Ended> {
        if let Sink::Client { w, binary, .. } = self {
            for row in rows {
                let ok = match row.first() {
                    // A binary row's header.
                    Some(&b) if *binary => b == 0x00,
                    // A text row starts with a value's length (0xFE: an 8-byte one, for a
                    // value of 16 MiB or more) or NULL (0xFB); never 0xFF, never a 0xFE
                    // packet under 16 MiB (a client reads one as the result's end, an EOF or,
                    // with DEPRECATE_EOF, an OK).
                    Some(&0xFF) | None => false,
                    Some(&0xFE) => row.len() >= MAX_PAYLOAD,
                    Some(_) => true,
                };
                if !ok {
                    return Err(Ended::Internal(format!(
                        "a worker sent a row packet no server sends (first byte {:#04x?}, {} bytes)",
                        row.first(),
                        row.len()
                    )));
                }
                w.packet(row);
                if w.buffered() >= Writer::HIGH_WATER {
                    w.flush().await?;
                }
            }
        }
        Ok(())
    }

    async fn rows(&mut self, rows: &Rows) -> Result<(), Ended> {
        if let Sink::Client { w, binary, columns, .. } = self {
            let mut p = Vec::new();
            for row in &rows.rows {
                p.clear();
                if *binary {
                    prepared::binary_row(&mut p, columns, row);
                } else {
                    reply::text_row(&mut p, row);
                }
                w.packet(&p);
                if w.buffered() >= Writer::HIGH_WATER {
                    w.flush().await?;
                }
            }
        }
        Ok(())
    }
}
