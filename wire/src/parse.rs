//! Parsing the packets of a response, on mysql_common's deserializers.

use std::sync::Arc;

use mysql_common::io::ParseBuf;
use mysql_common::packets::Column;
use mysql_common::proto::{Binary, Text};
use mysql_common::row::{Row, RowDeserializer};
use mysql_common::value::ServerSide;

use crate::error::{Error, Result};

/// Which protocol a command's rows come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    Text,
    Binary,
}

pub(crate) fn parse_column(packet: &[u8]) -> Result<Column> {
    ParseBuf(packet)
        .parse::<Column>(())
        .map_err(|e| Error::protocol(format!("bad column definition: {e}")))
}

pub(crate) fn is_old_eof(packet: &[u8]) -> bool {
    packet.first() == Some(&0xFE) && packet.len() < 9
}

pub(crate) fn parse_row(proto: Proto, packet: &[u8], cols: Arc<[Column]>) -> Result<Row> {
    let mut buf = ParseBuf(packet);
    let row: Result<Row, std::io::Error> = match proto {
        Proto::Text => buf.parse::<RowDeserializer<ServerSide, Text>>(cols).map(Into::into),
        Proto::Binary => buf.parse::<RowDeserializer<ServerSide, Binary>>(cols).map(Into::into),
    };
    let row = row.map_err(|e| Error::protocol(format!("bad row: {e}")))?;
    if !buf.is_empty() {
        return Err(Error::protocol("a row longer than its columns"));
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{self, parse_ok, server_error};
    use crate::Error;
    use mysql_common::constants::CapabilityFlags;
    use mysql_common::constants::{ColumnFlags, ColumnType};
    use mysql_common::packets::AuthSwitchRequest;
    use mysql_common::packets::{OkPacketDeserializer, OldEofPacket, ResultSetTerminator, StmtPacket};

    /// A greeting whose auth data length byte is 0x80..=0x87 made mysql_common's
    /// `HandshakePacket` parser overflow an `i8` (found by the test below).
    #[test]
    fn greeting_with_a_huge_auth_data_length_is_refused() {
        let mut packet = vec![10u8];
        packet.extend_from_slice(b"10.11.0-MariaDB\0");
        packet.extend_from_slice(&[1, 0, 0, 0]); // connection id
        packet.extend_from_slice(&[b's'; 8]); // scramble 1
        packet.push(0); // filler
        packet.extend_from_slice(&[0xFF, 0xFF]); // capabilities (lower)
        packet.push(45); // collation
        packet.extend_from_slice(&[2, 0]); // status
        packet.extend_from_slice(&[0xFF, 0xFF]); // capabilities (upper)
        for len in 0x80..=0x87u8 {
            let mut p = packet.clone();
            p.push(len);
            p.extend_from_slice(&[0; 10]);
            p.extend_from_slice(&[b't'; 13]);
            assert!(
                matches!(handshake::parse_greeting(&p), Err(Error::Protocol(_))),
                "{len:#x}"
            );
        }
        let mut p = packet.clone();
        p.push(21);
        p.extend_from_slice(&[0; 10]);
        p.extend_from_slice(b"tttttttttttt\0mysql_native_password\0");
        let hs = handshake::parse_greeting(&p).expect("a good greeting");
        assert_eq!(hs.connection_id(), 1);
    }

    /// Every parser the session runs on server bytes, fed garbage: errors, never panics.
    #[test]
    fn garbage_from_the_server_never_panics() {
        let types = [
            ColumnType::MYSQL_TYPE_DECIMAL,
            ColumnType::MYSQL_TYPE_TINY,
            ColumnType::MYSQL_TYPE_SHORT,
            ColumnType::MYSQL_TYPE_LONG,
            ColumnType::MYSQL_TYPE_FLOAT,
            ColumnType::MYSQL_TYPE_DOUBLE,
            ColumnType::MYSQL_TYPE_NULL,
            ColumnType::MYSQL_TYPE_TIMESTAMP,
            ColumnType::MYSQL_TYPE_LONGLONG,
            ColumnType::MYSQL_TYPE_INT24,
            ColumnType::MYSQL_TYPE_DATE,
            ColumnType::MYSQL_TYPE_TIME,
            ColumnType::MYSQL_TYPE_DATETIME,
            ColumnType::MYSQL_TYPE_YEAR,
            ColumnType::MYSQL_TYPE_VARCHAR,
            ColumnType::MYSQL_TYPE_BIT,
            ColumnType::MYSQL_TYPE_JSON,
            ColumnType::MYSQL_TYPE_NEWDECIMAL,
            ColumnType::MYSQL_TYPE_ENUM,
            ColumnType::MYSQL_TYPE_SET,
            ColumnType::MYSQL_TYPE_BLOB,
            ColumnType::MYSQL_TYPE_VAR_STRING,
            ColumnType::MYSQL_TYPE_STRING,
        ];
        let caps = CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_SESSION_TRACK
            | CapabilityFlags::CLIENT_DEPRECATE_EOF;
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..100_000u32 {
            let len = (next() % 48) as usize;
            let mut packet: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Often start like the real thing, so parsing gets past the first byte.
            if round % 2 == 0 && !packet.is_empty() {
                packet[0] = [0x00, 0xFE, 0xFF, 0xFB, 0x01, 0x0A][round as usize / 2 % 6];
            }
            let ncols = 1 + (next() % 4) as usize;
            let cols: Arc<[Column]> = (0..ncols)
                .map(|_| {
                    let t = types[(next() % types.len() as u64) as usize];
                    let flags = if next() % 2 == 0 {
                        ColumnFlags::UNSIGNED_FLAG
                    } else {
                        ColumnFlags::empty()
                    };
                    Column::new(t).with_flags(flags)
                })
                .collect();
            let _ = parse_row(Proto::Text, &packet, cols.clone());
            let _ = parse_row(Proto::Binary, &packet, cols);
            let _ = parse_ok(&packet, caps);
            let _ = server_error(&packet, caps);
            let _ = server_error(&packet, CapabilityFlags::empty());
            let _ = parse_column(&packet);
            let _ = ParseBuf(&packet).parse::<OkPacketDeserializer<'_, ResultSetTerminator>>(caps);
            let _ = ParseBuf(&packet).parse::<OkPacketDeserializer<'_, OldEofPacket>>(caps);
            let _ = ParseBuf(&packet).parse::<StmtPacket>(());
            let _ = handshake::parse_greeting(&packet);
            let _ = ParseBuf(&packet).parse::<AuthSwitchRequest<'_>>(());
            if let Ok(ok) = parse_ok(&packet, caps) {
                for change in ok.session_state_info().unwrap_or_default() {
                    let _ = change.decode();
                }
            }
        }
    }
}
