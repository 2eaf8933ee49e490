//! The MySQL protocol front end: every MySQL client, driver and tool reaches Osprey's
//! pool, failover, routing and policies by pointing at this port (docs/MYSQL.md).
//!
//! The connection's I/O and decisions are here; the protocol's bytes (the greeting and
//! handshake response, OK/ERR/EOF, column definitions, rows, prepared statements' codec,
//! what is kept per client) are the `osprey-mysql` crate's (`mysql/`), which does no I/O:
//!
//! - `packet.rs`: bounded MySQL packet reading and writing on the socket;
//! - `login.rs`: the login (`mysql_native_password`, `caching_sha2_password` fast path,
//!   auth switch) against `[[mysql.users]]`;
//! - `connection.rs`: the command loop; each statement goes through admission
//!   (`crate::admit`) as an SDK client's does.

pub mod connection;
pub mod login;
pub mod packet;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::warn;

use crate::config::{MysqlConfig, MysqlUser};
use crate::ctx::Ctx;
use crate::metrics::{Metrics, MysqlMetrics};

/// (address, user) pairs whose failed logins are remembered at most (past it the oldest
/// window is dropped).
const MAX_TRACKED_ADDRESSES: usize = 10_000;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Who failed to log in: a configured user by index, or a name no user has by its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Who {
    User(usize),
    Unknown(u64),
}

/// Failed logins by source address and name: when the window began, how many.
type Failures = HashMap<(IpAddr, Who), (Instant, u32)>;

/// What every MySQL connection shares.
pub struct Front {
    pub config: MysqlConfig,
    /// `[mysql.tls]`: offered to clients that ask (SSLRequest); SIGHUP reloads it.
    pub tls: Option<Arc<crate::client::tls::ServerTls>>,
    pub users: Vec<MysqlUser>,
    metrics: Arc<Metrics>,
    pub started: Instant,
    per_user: Vec<Arc<AtomicUsize>>,
    failures: Mutex<Failures>,
    /// Keyed per process: names no user has are counted by their hash.
    name_hasher: std::collections::hash_map::RandomState,
    /// Logins in progress (greeting sent, no OK yet): the port's own
    /// `limits.max_pending_handshakes`, apart from the SDK port's so that a flood on one
    /// does not hold the other's logins, and each address's share of it.
    pub handshakes: Arc<Semaphore>,
    /// `mysql.max_statement_bytes`: what prepared statements and long data hold, all
    /// connections together.
    pub statement_bytes: Arc<Semaphore>,
    pending: Mutex<HashMap<IpAddr, usize>>,
    pending_per_address: usize,
    max_pending: usize,
}

/// A login in progress, counted against its address's share until dropped.
pub struct Pending<'a> {
    front: &'a Front,
    ip: IpAddr,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut p = self.front.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = p.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                p.remove(&self.ip);
            }
        }
    }
}

/// A connection counted against its user's `max_connections`.
pub struct UserSlot(Arc<AtomicUsize>);

impl Drop for UserSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Front {
    pub fn new(
        config: MysqlConfig,
        tls: Option<Arc<crate::client::tls::ServerTls>>,
        metrics: Arc<Metrics>,
        max_pending_handshakes: usize,
    ) -> Front {
        let users = config.users.clone();
        Front {
            handshakes: Arc::new(Semaphore::new(max_pending_handshakes)),
            statement_bytes: Arc::new(Semaphore::new(config.max_statement_bytes.min(u32::MAX as usize))),
            pending: Mutex::default(),
            // One address may hold an eighth of the logins in progress: a silent flood
            // from one host leaves the others theirs.
            pending_per_address: (max_pending_handshakes / 8).max(1),
            max_pending: max_pending_handshakes,
            tls,
            per_user: users.iter().map(|_| Arc::default()).collect(),
            users,
            config,
            metrics,
            started: Instant::now(),
            failures: Mutex::default(),
            name_hasher: Default::default(),
        }
    }

    /// A login from `ip` may start: `None` when that address holds its share already
    /// while the pool is contended (more than half of it in use). An address alone (an
    /// application's hosts behind one SNAT address reconnecting after a restart) may use
    /// half the pool.
    pub fn pending(&self, ip: IpAddr) -> Option<Pending<'_>> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let contended = self.handshakes.available_permits() < self.max_pending / 2;
        let n = p.entry(ip).or_default();
        if *n >= self.pending_per_address && contended {
            return None;
        }
        *n += 1;
        Some(Pending { front: self, ip })
    }

    pub fn m(&self) -> &MysqlMetrics {
        &self.metrics.mysql
    }

    /// `<backend version>-osprey`, as the greeting shows it.
    pub fn version(&self, ctx: &Ctx) -> String {
        let backend = ctx
            .groups
            .iter()
            .find_map(|g| g.server_version.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_else(|| "10.11.0-MariaDB".to_string());
        format!("{backend}-osprey")
    }

    pub fn user_slot(&self, user: usize) -> Option<UserSlot> {
        let count = self.per_user.get(user)?.clone();
        let max = self.users[user].max_connections.unwrap_or(usize::MAX);
        if count.fetch_add(1, Ordering::Relaxed) >= max {
            count.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(UserSlot(count))
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, Failures> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The failure counter's key: per name, so that failures for one user from an
    /// address shared by many clients (a NAT) do not lock the others out, and a name no
    /// user has counts like one that exists (a shared count for unknown names would tell
    /// which names exist). The table is bounded all the same (its oldest window goes).
    fn failure_key(&self, ip: IpAddr, user: &str) -> (IpAddr, Who) {
        use std::hash::BuildHasher;
        let who = match self.users.iter().position(|u| u.name == user) {
            Some(i) => Who::User(i),
            None => Who::Unknown(self.name_hasher.hash_one(user)),
        };
        (ip, who)
    }

    /// Whether `user` failed to log in from `ip` too often within the last minute.
    pub fn auth_blocked(&self, ip: IpAddr, user: &str) -> bool {
        let max = self.config.max_auth_failures_per_minute;
        max > 0
            && self
                .failures()
                .get(&self.failure_key(ip, user))
                .is_some_and(|(since, n)| since.elapsed() < FAILURE_WINDOW && *n >= max)
    }

    pub fn auth_failed(&self, ip: IpAddr, user: &str) {
        self.m().auth_failures.inc();
        let key = self.failure_key(ip, user);
        let mut f = self.failures();
        if f.len() >= MAX_TRACKED_ADDRESSES && !f.contains_key(&key) {
            f.retain(|_, (since, _)| since.elapsed() < FAILURE_WINDOW);
            if f.len() >= MAX_TRACKED_ADDRESSES {
                // Full of recent failures: the oldest window goes, so that a new address
                // is still counted.
                if let Some(oldest) = f.iter().min_by_key(|(_, (since, _))| *since).map(|(k, _)| *k) {
                    f.remove(&oldest);
                }
            }
        }
        let e = f.entry(key).or_insert((Instant::now(), 0));
        if e.0.elapsed() >= FAILURE_WINDOW {
            *e = (Instant::now(), 0);
        }
        e.1 += 1;
    }

    /// A login succeeded: its failures are forgotten, as a server's host error count is.
    pub fn auth_succeeded(&self, ip: IpAddr, user: &str) {
        let key = self.failure_key(ip, user);
        let mut f = self.failures();
        if !f.is_empty() {
            f.remove(&key);
        }
    }
}

/// Accepts MySQL clients until the task is aborted (at the drain). Past
/// `mysql.max_connections`, or past the client descriptors shared with the SDK port
/// (`client_fds`, what the file-descriptor budget leaves beside the workers' and the
/// admin port's reserve), a new connection gets ERR 1040 and is closed.
pub async fn accept(ctx: Arc<Ctx>, front: Arc<Front>, listener: TcpListener, client_fds: Arc<Semaphore>) {
    let limit = Arc::new(Semaphore::new(front.config.max_connections));
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!("MySQL accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permits = limit
            .clone()
            .try_acquire_owned()
            .ok()
            .zip(client_fds.clone().try_acquire_owned().ok());
        match permits {
            Some(permits) => {
                tokio::spawn(connection::serve(ctx.clone(), front.clone(), socket, peer, permits));
            }
            None => {
                ctx.metrics.client_rejected.inc();
                tokio::spawn(async move {
                    let (_, wr) = socket.into_split();
                    let mut w = packet::PacketWriter::new(wr, Duration::from_secs(1));
                    w.packet(&osprey_mysql::reply::err_before_greeting(
                        osprey_mysql::reply::ER_CON_COUNT,
                        "Too many connections",
                    ));
                    let _ = w.flush().await;
                });
            }
        }
    }
}
