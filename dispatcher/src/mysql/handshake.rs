//! The MySQL connection phase: the server's greeting (handshake v10), the client's
//! answer, `mysql_native_password` or `caching_sha2_password` (fast path) checked against
//! the configured hashes, with an auth switch when the client starts with another plugin.

use osprey_protocol::mysql_auth;
use rand::Rng;
use tokio::io::{AsyncRead, AsyncWrite};

use super::packet::{Cursor, PacketError, PacketReader, PacketWriter};
use super::reply;
use crate::config::MysqlUser;

pub const CLIENT_LONG_PASSWORD: u32 = 1;
pub const CLIENT_FOUND_ROWS: u32 = 2;
pub const CLIENT_LONG_FLAG: u32 = 4;
pub const CLIENT_CONNECT_WITH_DB: u32 = 8;
pub const CLIENT_PROTOCOL_41: u32 = 0x200;
pub const CLIENT_INTERACTIVE: u32 = 0x400;
pub const CLIENT_SSL: u32 = 0x800;
pub const CLIENT_TRANSACTIONS: u32 = 0x2000;
pub const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
pub const CLIENT_MULTI_STATEMENTS: u32 = 0x1_0000;
pub const CLIENT_MULTI_RESULTS: u32 = 0x2_0000;
pub const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;
pub const CLIENT_CONNECT_ATTRS: u32 = 0x10_0000;
pub const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA: u32 = 0x20_0000;
pub const CLIENT_DEPRECATE_EOF: u32 = 0x100_0000;

/// What this front end advertises: only what it does. Not SSL (no TLS on this port yet),
/// not MULTI_STATEMENTS/MULTI_RESULTS (one statement per COM_QUERY), not FOUND_ROWS (the
/// workers' sessions count changed rows), not LOCAL_FILES, not SESSION_TRACK.
pub const SERVER_CAPABILITIES: u32 = CLIENT_LONG_PASSWORD
    | CLIENT_LONG_FLAG
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_PROTOCOL_41
    | CLIENT_INTERACTIVE
    | CLIENT_TRANSACTIONS
    | CLIENT_SECURE_CONNECTION
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_DEPRECATE_EOF;

/// The workers' connection collation (utf8mb4_general_ci), announced in the greeting.
pub const DEFAULT_COLLATION: u8 = 45;

const NATIVE: &str = "mysql_native_password";
const SHA2: &str = "caching_sha2_password";

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
    #[error("malformed handshake response: {0}")]
    Malformed(&'static str),
    #[error("Access denied for user '{user}'@'{host}' (using password: {using})")]
    Denied {
        user: String,
        host: String,
        using: &'static str,
    },
    #[error("TLS was asked for, but this port does not offer it")]
    NoTls,
}

impl LoginError {
    /// The ERR the client gets, if it can get one.
    pub fn reply(&self) -> Option<Vec<u8>> {
        match self {
            LoginError::Packet(_) => None,
            LoginError::Malformed(_) => Some(reply::err(1043, "08S01", "Bad handshake")),
            LoginError::Denied { .. } => Some(reply::err(1045, "28000", &self.to_string())),
            LoginError::NoTls => Some(reply::err(1043, "08S01", &self.to_string())),
        }
    }
}

/// A random scramble of 20 printable bytes (no NUL: it is sent NUL-terminated).
pub fn nonce() -> [u8; 20] {
    let mut rng = rand::rng();
    std::array::from_fn(|_| rng.random_range(0x21u8..0x7F))
}

/// The greeting: protocol 10, `version`, the connection id, the scramble, capabilities.
pub fn greeting(version: &str, conn_id: u32, nonce: &[u8; 20]) -> Vec<u8> {
    let mut p = Vec::with_capacity(96);
    p.push(10);
    p.extend_from_slice(version.as_bytes());
    p.push(0);
    p.extend_from_slice(&conn_id.to_le_bytes());
    p.extend_from_slice(&nonce[..8]);
    p.push(0);
    p.extend_from_slice(&(SERVER_CAPABILITIES as u16).to_le_bytes());
    p.push(DEFAULT_COLLATION);
    p.extend_from_slice(&reply::SERVER_STATUS_AUTOCOMMIT.to_le_bytes());
    p.extend_from_slice(&((SERVER_CAPABILITIES >> 16) as u16).to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(&nonce[8..]);
    p.push(0);
    p.extend_from_slice(NATIVE.as_bytes());
    p.push(0);
    p
}

struct Response {
    caps: u32,
    collation: u8,
    user: String,
    auth: Vec<u8>,
    schema: Option<String>,
    plugin: Option<String>,
    attrs: Vec<(String, String)>,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn parse_response(p: &[u8]) -> Result<Response, LoginError> {
    let bad = LoginError::Malformed;
    let mut c = Cursor(p);
    let client_caps = c.u32().ok_or(bad("short"))?;
    if client_caps & CLIENT_PROTOCOL_41 == 0 {
        return Err(bad("protocol 4.1 is required"));
    }
    if client_caps & CLIENT_SSL != 0 && p.len() == 32 {
        return Err(LoginError::NoTls);
    }
    let caps = client_caps & SERVER_CAPABILITIES;
    c.u32().ok_or(bad("short"))?; // max packet
    let collation = c.u8().ok_or(bad("short"))?;
    c.take(23).ok_or(bad("short"))?;
    let user = text(c.cstr().ok_or(bad("no user name"))?);
    let auth = if caps & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA != 0 {
        c.lenenc_bytes().ok_or(bad("auth data"))?
    } else if caps & CLIENT_SECURE_CONNECTION != 0 {
        let n = c.u8().ok_or(bad("auth data"))?;
        c.take(usize::from(n)).ok_or(bad("auth data"))?
    } else {
        c.cstr().ok_or(bad("auth data"))?
    }
    .to_vec();
    let schema = if caps & CLIENT_CONNECT_WITH_DB != 0 {
        c.cstr().map(text).filter(|s| !s.is_empty())
    } else {
        None
    };
    let plugin = if caps & CLIENT_PLUGIN_AUTH != 0 {
        c.cstr().map(text)
    } else {
        None
    };
    let mut attrs = Vec::new();
    if caps & CLIENT_CONNECT_ATTRS != 0 {
        if let Some(all) = c.lenenc_bytes() {
            let mut a = Cursor(all);
            while !a.is_empty() && attrs.len() < 64 {
                let (Some(k), Some(v)) = (a.lenenc_bytes(), a.lenenc_bytes()) else {
                    break;
                };
                attrs.push((text(k), text(v)));
            }
        }
    }
    Ok(Response {
        caps,
        collation,
        user,
        auth,
        schema,
        plugin,
        attrs,
    })
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
) -> Result<Login, LoginError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (seq, payload) = reader.read(Some(1)).await?;
    writer.seq = seq.wrapping_add(1);
    let r = parse_response(&payload)?;
    let found = users.iter().position(|u| u.name == r.user);
    let denied = |using: bool| LoginError::Denied {
        user: r.user.clone(),
        host: host.to_string(),
        using: if using { "YES" } else { "NO" },
    };
    let plugin = r.plugin.as_deref().unwrap_or(NATIVE);
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
    let waits = plugin == SHA2 && r.auth.is_empty();
    let (plugin, answer) = if can(plugin) && !waits {
        (plugin, r.auth.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_response_is_malformed_not_a_panic() {
        for n in 0..40 {
            let p = vec![0xFFu8; n];
            let _ = parse_response(&p);
        }
        assert!(matches!(parse_response(&[0; 3]), Err(LoginError::Malformed(_))));
    }

    #[test]
    fn the_greeting_offers_a_20_byte_scramble_and_native_password() {
        let n = nonce();
        let g = greeting("10.11.6-MariaDB-osprey", 7, &n);
        assert_eq!(g[0], 10);
        assert!(g.ends_with(b"mysql_native_password\0"));
        assert!(n.iter().all(|&b| b != 0));
    }
}
