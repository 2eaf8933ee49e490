//! The MySQL connection phase's packets: the server's greeting (handshake v10), the
//! capabilities this front end offers, and the client's handshake response read (every
//! read checked: bad input is an error, never a panic).

use crate::codec::Cursor;
use crate::reply;

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
pub const CLIENT_PS_MULTI_RESULTS: u32 = 0x4_0000;
pub const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;
pub const CLIENT_CONNECT_ATTRS: u32 = 0x10_0000;
pub const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA: u32 = 0x20_0000;
pub const CLIENT_SESSION_TRACK: u32 = 0x80_0000;
pub const CLIENT_DEPRECATE_EOF: u32 = 0x100_0000;

/// What this front end advertises: only what it does (and `CLIENT_SSL` when TLS is
/// configured, [`greeting`]). MULTI_STATEMENTS, MULTI_RESULTS, PS_MULTI_RESULTS: several
/// statements in one COM_QUERY and each result of a CALL apart. Not LOCAL_FILES.
/// FOUND_ROWS: an UPDATE's affected rows become its "Rows matched". SESSION_TRACK: an OK's
/// message is length-encoded, as servers write it, and clients that negotiate it (mysql2,
/// Connector/C) read it so; no session state changes are reported (the flag
/// SERVER_SESSION_STATE_CHANGED is never set).
pub const SERVER_CAPABILITIES: u32 = CLIENT_LONG_PASSWORD
    | CLIENT_FOUND_ROWS
    | CLIENT_LONG_FLAG
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_PROTOCOL_41
    | CLIENT_INTERACTIVE
    | CLIENT_TRANSACTIONS
    | CLIENT_SECURE_CONNECTION
    | CLIENT_MULTI_STATEMENTS
    | CLIENT_MULTI_RESULTS
    | CLIENT_PS_MULTI_RESULTS
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_SESSION_TRACK
    | CLIENT_DEPRECATE_EOF;

/// The workers' connection collation (utf8mb4_general_ci), announced in the greeting.
pub const DEFAULT_COLLATION: u8 = 45;

pub const NATIVE: &str = "mysql_native_password";
pub const SHA2: &str = "caching_sha2_password";

/// The greeting: protocol 10, `version`, the connection id, the scramble, capabilities.
pub fn greeting(version: &str, conn_id: u32, nonce: &[u8; 20], tls: bool) -> Vec<u8> {
    let caps = SERVER_CAPABILITIES | if tls { CLIENT_SSL } else { 0 };
    let mut p = Vec::with_capacity(96);
    p.push(10);
    p.extend_from_slice(version.as_bytes());
    p.push(0);
    p.extend_from_slice(&conn_id.to_le_bytes());
    p.extend_from_slice(&nonce[..8]);
    p.push(0);
    p.extend_from_slice(&(caps as u16).to_le_bytes());
    p.push(DEFAULT_COLLATION);
    p.extend_from_slice(&reply::SERVER_STATUS_AUTOCOMMIT.to_le_bytes());
    p.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(&nonce[8..]);
    p.push(0);
    p.extend_from_slice(NATIVE.as_bytes());
    p.push(0);
    p
}

/// Whether a packet after the greeting is an SSLRequest (32 bytes, `CLIENT_SSL` set): a
/// handshake response is always longer (its user name's NUL comes after those 32).
pub fn is_ssl_request(payload: &[u8]) -> bool {
    payload.len() == 32
        && payload[..4]
            .try_into()
            .map(u32::from_le_bytes)
            .is_ok_and(|c| c & CLIENT_SSL != 0)
}

/// What a client's handshake response says.
#[derive(Debug)]
pub struct Response {
    /// The capabilities both sides have.
    pub caps: u32,
    pub collation: u8,
    pub user: String,
    pub auth: Vec<u8>,
    pub schema: Option<String>,
    pub plugin: Option<String>,
    pub attrs: Vec<(String, String)>,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads a handshake response (protocol 4.1).
pub fn parse_response(p: &[u8]) -> Result<Response, BadResponse> {
    let bad = BadResponse::Malformed;
    let mut c = Cursor(p);
    let client_caps = c.u32().ok_or(bad("short"))?;
    if client_caps & CLIENT_PROTOCOL_41 == 0 {
        return Err(bad("protocol 4.1 is required"));
    }
    if client_caps & CLIENT_SSL != 0 && p.len() == 32 {
        // An SSLRequest where none was offered (the front end upgrades before this).
        return Err(BadResponse::NoTls);
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

/// What a `COM_CHANGE_USER` says (its body, the command byte taken off).
#[derive(Debug)]
pub struct ChangeUser {
    pub user: String,
    pub auth: Vec<u8>,
    pub schema: Option<String>,
    pub collation: Option<u8>,
    pub plugin: Option<String>,
}

/// Reads a `COM_CHANGE_USER` body under the capabilities `caps` the connection has.
pub fn parse_change_user(p: &[u8], caps: u32) -> Result<ChangeUser, BadResponse> {
    let bad = BadResponse::Malformed;
    let mut c = Cursor(p);
    let user = text(c.cstr().ok_or(bad("no user name"))?);
    let auth = if caps & CLIENT_SECURE_CONNECTION != 0 {
        let n = c.u8().ok_or(bad("auth data"))?;
        c.take(usize::from(n)).ok_or(bad("auth data"))?
    } else {
        c.cstr().ok_or(bad("auth data"))?
    }
    .to_vec();
    let schema = c.cstr().map(text).filter(|s| !s.is_empty());
    // Two bytes here, one in the handshake: an id past 255 (MySQL 8's utf8mb4_*_0900_*,
    // 255 and up) is one this front end does not name, as an unknown one-byte id is,
    // not the one-byte id its low byte happens to be (264 is not latin1's 8).
    let collation = c.u16().map(|cs| u8::try_from(cs).unwrap_or(0));
    let plugin = if caps & CLIENT_PLUGIN_AUTH != 0 {
        c.cstr().map(text)
    } else {
        None
    };
    Ok(ChangeUser {
        user,
        auth,
        schema,
        collation,
        plugin,
    })
}

/// A handshake response that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadResponse {
    #[error("malformed handshake response: {0}")]
    Malformed(&'static str),
    #[error("TLS was asked for, but this port does not offer it")]
    NoTls,
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
        assert!(matches!(parse_response(&[0; 3]), Err(BadResponse::Malformed(_))));
    }

    #[test]
    fn a_change_users_two_byte_collation_is_not_cut_to_its_low_byte() {
        let body = |cs: u16| {
            let mut p = b"app\0".to_vec();
            p.push(0); // no auth data
            p.extend_from_slice(b"db\0");
            p.extend_from_slice(&cs.to_le_bytes());
            p.extend_from_slice(b"mysql_native_password\0");
            p
        };
        let caps = CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH;
        // 264 is utf8mb4_sv_0900_ai_ci; its low byte, 8, is latin1.
        assert_eq!(parse_change_user(&body(264), caps).unwrap().collation, Some(0));
        assert_eq!(parse_change_user(&body(8), caps).unwrap().collation, Some(8));
        assert_eq!(parse_change_user(&body(224), caps).unwrap().collation, Some(224));
    }

    #[test]
    fn the_greeting_offers_a_20_byte_scramble_and_native_password() {
        let n = [b'a'; 20];
        let g = greeting("10.11.6-MariaDB-osprey", 7, &n, false);
        assert_eq!(g[0], 10);
        assert!(g.ends_with(b"mysql_native_password\0"));
    }
}
