//! Connection phase: the server's greeting, TLS, the handshake response, and the
//! authentication exchange (also used by `COM_CHANGE_USER`).

use mysql_common::constants::{CapabilityFlags, MariadbCapabilities, UTF8MB4_GENERAL_CI};
use mysql_common::io::ParseBuf;
use mysql_common::packets::{
    AuthPlugin, AuthSwitchRequest, CommonOkPacket, ErrPacket, HandshakePacket, HandshakeResponse, OkPacket,
    OkPacketDeserializer, SslRequest,
};
use mysql_common::proto::MySerialize;
use tokio::net::TcpStream;

use crate::error::{Error, Result, ServerError};
use crate::io::{PacketIo, Stream, MAX_PACKET};
use crate::opts::{Opts, SslMode};
use crate::tls;

/// What the connection phase leaves behind for the session.
pub(crate) struct Established {
    pub io: PacketIo,
    pub caps: CapabilityFlags,
    pub mariadb_caps: MariadbCapabilities,
    pub conn_id: u32,
    pub version: (u16, u16, u16),
    pub version_text: String,
    pub mariadb: bool,
    pub tls: bool,
    pub auth: AuthState,
    pub ok: OkPacket<'static>,
}

/// The plugin and nonce of the last exchange: `COM_CHANGE_USER` starts from them.
#[derive(Clone)]
pub(crate) struct AuthState {
    pub plugin: AuthPlugin<'static>,
    pub nonce: Vec<u8>,
}

fn wanted_caps(opts: &Opts) -> CapabilityFlags {
    let mut caps = CapabilityFlags::CLIENT_PROTOCOL_41
        | CapabilityFlags::CLIENT_SECURE_CONNECTION
        | CapabilityFlags::CLIENT_LONG_PASSWORD
        | CapabilityFlags::CLIENT_LONG_FLAG
        | CapabilityFlags::CLIENT_TRANSACTIONS
        // So that a server's LOCAL INFILE request can be answered (with an empty file)
        // instead of the session being lost.
        | CapabilityFlags::CLIENT_LOCAL_FILES
        // As mysql_async: the worker's session reset sends several statements at once.
        | CapabilityFlags::CLIENT_MULTI_STATEMENTS
        | CapabilityFlags::CLIENT_MULTI_RESULTS
        | CapabilityFlags::CLIENT_PS_MULTI_RESULTS
        | CapabilityFlags::CLIENT_PLUGIN_AUTH
        | CapabilityFlags::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
        // The OK packet then carries `last_gtid` when it is tracked.
        | CapabilityFlags::CLIENT_SESSION_TRACK;
    if opts.deprecate_eof {
        caps |= CapabilityFlags::CLIENT_DEPRECATE_EOF;
    }
    if opts.database.is_some() {
        caps |= CapabilityFlags::CLIENT_CONNECT_WITH_DB;
    }
    caps
}

/// ERR packet as a server error (`caps` empty before the handshake response: the server
/// does not know yet that we speak 4.1 and may leave out the SQL state).
pub(crate) fn server_error(packet: &[u8], caps: CapabilityFlags) -> Result<Option<ServerError>> {
    match ParseBuf(packet).parse::<ErrPacket<'_>>(caps) {
        Ok(ErrPacket::Error(e)) => Ok(Some(ServerError::from(&e))),
        Ok(ErrPacket::Progress(_)) => Ok(None),
        Err(e) => Err(Error::protocol(format!("bad ERR packet: {e}"))),
    }
}

pub(crate) fn parse_ok(packet: &[u8], caps: CapabilityFlags) -> Result<OkPacket<'static>> {
    ParseBuf(packet)
        .parse::<OkPacketDeserializer<'_, CommonOkPacket>>(caps)
        .map(|ok| ok.into_inner().into_owned())
        .map_err(|e| Error::protocol(format!("bad OK packet: {e}")))
}

/// The server's greeting. mysql_common computes `auth_plugin_data_len - 8` as an `i8`,
/// which overflows (a panic in debug builds) for a length byte of 0x80..=0x87: such a
/// length (over 127 bytes of scramble) is refused first.
pub(crate) fn parse_greeting(packet: &[u8]) -> Result<HandshakePacket<'_>> {
    let version_end = packet.get(1..).and_then(|rest| rest.iter().position(|&b| b == 0));
    if let Some(end) = version_end {
        // protocol version, version string and its NUL, then 20 bytes up to the length.
        if packet.get(1 + end + 1 + 20).is_some_and(|&len| len >= 0x80) {
            return Err(Error::protocol("handshake packet with an auth data length over 127"));
        }
    }
    ParseBuf(packet)
        .parse::<HandshakePacket<'_>>(())
        .map_err(|e| Error::protocol(format!("bad handshake packet: {e}")))
}

pub(crate) async fn connect(opts: &Opts) -> Result<Established> {
    let tcp = TcpStream::connect((opts.host.as_str(), opts.port)).await?;
    tcp.set_nodelay(true)?;
    let mut io = PacketIo::new(tcp);

    io.set_read_seq(0);
    let packet = io.read_packet().await?;
    if packet.first() == Some(&0xFF) {
        if let Some(e) = server_error(&packet, CapabilityFlags::empty())? {
            return Err(Error::Server(e));
        }
    }
    let hs = parse_greeting(&packet)?;
    if hs.protocol_version() != 10 {
        return Err(Error::protocol(format!(
            "protocol version {}, expected 10",
            hs.protocol_version()
        )));
    }
    let server_caps = hs.capabilities();
    for needed in [
        CapabilityFlags::CLIENT_PROTOCOL_41,
        CapabilityFlags::CLIENT_SECURE_CONNECTION,
    ] {
        if !server_caps.contains(needed) {
            return Err(Error::protocol(format!("the server lacks {needed:?}")));
        }
    }
    let mut nonce = hs.scramble_1_ref().to_vec();
    nonce.extend_from_slice(hs.scramble_2_ref().unwrap_or_default());
    // The server's scramble is 20 bytes plus a NUL; shorter is padded as the server does.
    nonce.resize(20, 0);
    let mariadb_version = hs.maria_db_server_version_parsed();
    let mariadb = mariadb_version.is_some();
    let version = mariadb_version
        .or_else(|| hs.server_version_parsed())
        .unwrap_or((0, 0, 0));
    let version_text = hs.server_version_str().into_owned();
    let conn_id = hs.connection_id();
    let plugin = match hs.auth_plugin() {
        Some(AuthPlugin::CachingSha2Password) => AuthPlugin::CachingSha2Password,
        _ => AuthPlugin::MysqlNativePassword,
    };
    let mut caps = wanted_caps(opts) & server_caps;
    // MariaDB announces its extended capabilities by leaving out CLIENT_LONG_PASSWORD
    // (its CLIENT_MYSQL); only then do those four bytes mean anything.
    let mariadb_caps = if mariadb && !server_caps.contains(CapabilityFlags::CLIENT_LONG_PASSWORD) && opts.cache_metadata
    {
        hs.mariadb_ext_capabilities() & MariadbCapabilities::MARIADB_CLIENT_CACHE_METADATA
    } else {
        MariadbCapabilities::empty()
    };

    let mut seq = io.read_seq();
    let mut secure = false;
    if let Some(tls_opts) = opts.tls.as_ref().filter(|t| t.mode != SslMode::Disabled) {
        if server_caps.contains(CapabilityFlags::CLIENT_SSL) {
            caps |= CapabilityFlags::CLIENT_SSL;
            let request = SslRequest::new(caps, MAX_PACKET as u32, UTF8MB4_GENERAL_CI as u8)
                .with_mariadb_capabilities(mariadb_caps);
            let mut body = Vec::new();
            request.serialize(&mut body);
            seq = io.queue_packet(seq, &body)?;
            io.flush().await?;
            if io.buffered_in() != 0 {
                return Err(Error::protocol("the server sent data before the TLS handshake"));
            }
            let (connector, name) = tls::connector(tls_opts, &opts.host)?;
            let Stream::Plain(tcp) = std::mem::replace(&mut io.stream, Stream::Gone) else {
                return Err(Error::protocol("TLS requested twice"));
            };
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|e| Error::Tls(e.to_string()))?;
            io.stream = Stream::Tls(Box::new(stream));
            secure = true;
        } else if tls_opts.mode == SslMode::Preferred {
            tracing::warn!(host = %opts.host, port = opts.port, "ssl_mode preferred: the server offers no TLS; going on in clear");
        } else {
            return Err(Error::Tls("the server offers no TLS (CLIENT_SSL)".into()));
        }
    }

    let password = Some(opts.password.as_str()).filter(|p| !p.is_empty());
    let data = plugin.gen_data(password, &nonce);
    let response = HandshakeResponse::new(
        data.as_deref(),
        version,
        Some(opts.user.as_bytes()),
        opts.database.as_deref().map(str::as_bytes),
        Some(plugin.clone()),
        caps,
        None,
        MAX_PACKET as u32,
    )
    .with_mariadb_ext_capabilities(mariadb_caps);
    // HandshakeResponse adjusts CONNECT_WITH_DB / PLUGIN_AUTH / CONNECT_ATTRS itself.
    let caps = response.capabilities();
    let mut body = Vec::new();
    response.serialize(&mut body);
    let next = io.queue_packet(seq, &body)?;
    io.set_read_seq(next);
    io.flush().await?;

    let mut auth = AuthState { plugin, nonce };
    let ok = authenticate(&mut io, &mut auth, caps, &opts.password, secure).await?;
    Ok(Established {
        io,
        caps,
        mariadb_caps,
        conn_id,
        version,
        version_text,
        mariadb,
        tls: secure,
        auth,
        ok,
    })
}

/// Sends a reply in the running exchange (the sequence continues from the last packet read).
async fn reply(io: &mut PacketIo, body: &[u8]) -> Result<()> {
    let next = io.queue_packet(io.read_seq(), body)?;
    io.set_read_seq(next);
    io.flush().await
}

/// Reads the server's side of the exchange after our first auth data went out, until OK.
pub(crate) async fn authenticate(
    io: &mut PacketIo,
    auth: &mut AuthState,
    caps: CapabilityFlags,
    password: &str,
    secure: bool,
) -> Result<OkPacket<'static>> {
    let mut switched = false;
    loop {
        let packet = io.read_packet().await?;
        match packet.first() {
            Some(0x00) => return parse_ok(&packet, caps),
            Some(0xFF) => {
                return Err(match server_error(&packet, caps)? {
                    Some(e) => Error::Server(e),
                    None => Error::protocol("progress report during authentication"),
                })
            }
            Some(0xFE) if !switched => {
                switched = true;
                if packet.len() == 1 {
                    return Err(Error::Auth(
                        "the server asks for the old (pre-4.1) password scheme, which is not supported".into(),
                    ));
                }
                let request = ParseBuf(&packet)
                    .parse::<AuthSwitchRequest<'_>>(())
                    .map_err(|e| Error::protocol(format!("bad auth switch request: {e}")))?;
                let plugin = match request.auth_plugin() {
                    AuthPlugin::MysqlNativePassword => AuthPlugin::MysqlNativePassword,
                    AuthPlugin::CachingSha2Password => AuthPlugin::CachingSha2Password,
                    other => {
                        return Err(Error::Auth(format!(
                            "the server asks for auth plugin {:?}, which is not supported",
                            String::from_utf8_lossy(other.as_bytes())
                        )))
                    }
                };
                auth.nonce = request.plugin_data().to_vec();
                auth.plugin = plugin;
                let pass = Some(password).filter(|p| !p.is_empty());
                let data = auth.plugin.gen_data(pass, &auth.nonce);
                let mut body = Vec::new();
                if let Some(data) = data {
                    data.serialize(&mut body);
                }
                reply(io, &body).await?;
            }
            Some(0x01) if auth.plugin == AuthPlugin::CachingSha2Password => match packet.get(1) {
                // Fast authentication succeeded; the OK follows.
                Some(0x03) => continue,
                Some(0x04) => {
                    if !secure {
                        return Err(Error::Auth(
                            "caching_sha2_password needs full authentication (the password is not \
                             in the server's cache), which this client does only over TLS"
                                .into(),
                        ));
                    }
                    let mut body = password.as_bytes().to_vec();
                    body.push(0);
                    reply(io, &body).await?;
                }
                _ => return Err(Error::protocol("unexpected caching_sha2_password data")),
            },
            _ => {
                return Err(Error::protocol(format!(
                    "unexpected packet during authentication (first byte {:?})",
                    packet.first()
                )))
            }
        }
    }
}
