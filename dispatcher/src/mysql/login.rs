//! The MySQL login: the client's handshake response, `mysql_native_password` or
//! `caching_sha2_password` (fast path) checked against the configured hashes, with an
//! auth switch when the client starts with another plugin.

use osprey_mysql::handshake::{parse_response, BadResponse, NATIVE, SHA2};
use osprey_mysql::reply;
use osprey_protocol::mysql_auth;
use rand::Rng;
use tokio::io::{AsyncRead, AsyncWrite};

use super::packet::{PacketError, PacketReader, PacketWriter};
use crate::config::MysqlUser;

/// A client that logged in.
#[derive(Debug)]
pub struct Login {
    /// Index into `[[mysql.users]]`.
    pub user: usize,
    pub name: String,
    /// The capabilities both sides have.
    pub caps: u32,
    /// The collation the client asked for.
    pub collation: u8,
    pub schema: Option<String>,
    /// Connection attributes (`_client_name`, `program_name`, …), for the session list.
    pub attrs: Vec<(String, String)>,
}

/// Why a login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("{0}")]
    Packet(#[from] PacketError),
    #[error("{0}")]
    Bad(#[from] BadResponse),
    #[error("Access denied for user '{user}'@'{host}' (using password: {using})")]
    Denied {
        user: String,
        host: String,
        using: &'static str,
    },
    #[error(
        "Host '{host}' is blocked for user '{user}' because of many failed logins (mysql.max_auth_failures_per_minute); try again in a minute"
    )]
    Blocked { user: String, host: String },
}

impl LoginError {
    /// The ERR the client gets, if it can get one.
    pub fn reply(&self) -> Option<Vec<u8>> {
        match self {
            LoginError::Packet(_) => None,
            LoginError::Bad(BadResponse::Malformed(_)) => Some(reply::err(1043, "08S01", "Bad handshake")),
            LoginError::Denied { .. } => Some(reply::err(1045, "28000", &self.to_string())),
            LoginError::Blocked { .. } => Some(reply::err(1129, "HY000", &self.to_string())),
            LoginError::Bad(BadResponse::NoTls) => Some(reply::err(1043, "08S01", &self.to_string())),
        }
    }
}

/// A random scramble of 20 printable bytes (no NUL: it is sent NUL-terminated).
pub fn nonce() -> [u8; 20] {
    let mut rng = rand::rng();
    std::array::from_fn(|_| rng.random_range(0x21u8..0x7F))
}

/// Runs the connection phase after the greeting was written: reads the response, checks
/// the password (switching the client to `mysql_native_password` when it started with a
/// plugin this user cannot check), and answers OK or ERR (the caller sends the ERR).
pub async fn login<R, W>(
    reader: &mut PacketReader<R>,
    writer: &mut PacketWriter<W>,
    users: &[MysqlUser],
    nonce: &[u8; 20],
    host: &str,
    first: Option<(u8, bytes::BytesMut)>,
    blocked: impl Fn(&str) -> bool,
) -> Result<Login, LoginError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // `first`: the response when it was read already (a plain client's, read to tell it
    // from an SSLRequest).
    let (seq, payload) = match first {
        Some(p) => p,
        None => reader.read(Some(writer.seq)).await?,
    };
    writer.seq = seq.wrapping_add(1);
    let r = parse_response(&payload)?;
    if blocked(&r.user) {
        return Err(LoginError::Blocked {
            user: r.user,
            host: host.to_string(),
        });
    }
    let index = authenticate(
        reader,
        writer,
        users,
        nonce,
        host,
        &r.user,
        r.plugin.as_deref(),
        r.auth.clone(),
    )
    .await?;
    let user = &users[index];
    Ok(Login {
        user: index,
        name: r.user,
        caps: r.caps,
        collation: r.collation,
        schema: r.schema.or_else(|| user.schema.clone()),
        attrs: r.attrs,
    })
}

/// One answer against one stored hash. An empty answer is an empty password; a trailing
/// NUL some clients add to the native answer is not part of it.
fn check(hash: &str, answer: &[u8], nonce: &[u8; 20], native: bool) -> bool {
    let answer = match answer {
        [a @ .., 0] if native && a.len() == 20 => a,
        a => a,
    };
    if answer.is_empty() {
        return if native {
            hash == mysql_auth::native_hash("")
        } else {
            hash == mysql_auth::sha2_hash("")
        };
    }
    if native {
        mysql_auth::verify_native(hash, nonce, answer)
    } else {
        mysql_auth::verify_sha2(hash, nonce, answer)
    }
}

/// Checks a login's (or a `COM_CHANGE_USER`'s) answer for user `name`, switching the
/// client to another plugin when it started with one this user cannot check: the user's
/// index, or `Denied`. Queues the "fast auth succeeded" of `caching_sha2_password`; the OK
/// is the caller's.
#[allow(clippy::too_many_arguments)]
pub async fn authenticate<R, W>(
    reader: &mut PacketReader<R>,
    writer: &mut PacketWriter<W>,
    users: &[MysqlUser],
    nonce: &[u8; 20],
    host: &str,
    name: &str,
    plugin: Option<&str>,
    auth: Vec<u8>,
) -> Result<usize, LoginError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let found = users.iter().position(|u| u.name == name);
    let denied = |using: bool| LoginError::Denied {
        user: name.to_string(),
        host: host.to_string(),
        using: if using { "YES" } else { "NO" },
    };
    let plugin = plugin.unwrap_or(NATIVE);
    // An unknown user goes through the same steps as a known one (a switch if the
    // plugin asks for one) so that the answer does not tell which names exist.
    let user = found.map(|i| &users[i]);
    let can = |p: &str| match (p, user) {
        (NATIVE, Some(u)) => u.native_hash.is_some(),
        (SHA2, Some(u)) => u.sha2_hash.is_some(),
        // An unknown user looks like one with both hashes.
        (NATIVE | SHA2, None) => true,
        _ => false,
    };
    // A caching_sha2_password client that starts with no answer (libmariadb's plugin,
    // when the greeting named another) waits to be switched to its own plugin.
    let waits = plugin == SHA2 && auth.is_empty();
    let (plugin, answer) = if can(plugin) && !waits {
        (plugin, auth)
    } else {
        // Auth switch: to caching_sha2 for a client that asked for it and a user that has
        // its hash; else to native if the user has it; else to caching_sha2.
        let to = if waits && can(SHA2) {
            SHA2
        } else if user.is_none_or(|u| u.native_hash.is_some()) {
            NATIVE
        } else {
            SHA2
        };
        let mut p = vec![0xFE];
        p.extend_from_slice(to.as_bytes());
        p.push(0);
        p.extend_from_slice(nonce);
        p.push(0);
        writer.packet(&p);
        writer.flush().await?;
        let (seq, answer) = reader.read(Some(writer.seq)).await?;
        writer.seq = seq.wrapping_add(1);
        (to, answer.to_vec())
    };
    let Some((index, user)) = found.zip(user) else {
        return Err(denied(!answer.is_empty()));
    };
    let ok = match plugin {
        NATIVE => user
            .native_hash
            .as_deref()
            .is_some_and(|h| check(h, &answer, nonce, true)),
        _ => user
            .sha2_hash
            .as_deref()
            .is_some_and(|h| check(h, &answer, nonce, false)),
    };
    if !ok {
        return Err(denied(!answer.is_empty()));
    }
    if plugin == SHA2 {
        // caching_sha2_password: "fast auth succeeded", then the OK.
        writer.packet(&[0x01, 0x03]);
    }
    Ok(index)
}
