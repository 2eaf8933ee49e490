//! Query text as the front end passes it on: Osprey's requests carry UTF-8, but a client
//! may send bytes that are not (a driver that writes a binary value into the query as
//! `_binary'…'`, as mysql-connector-python's plain cursor does). Each quoted string whose
//! content is not UTF-8 is rewritten as the hex literal of the same bytes (`X'…'`), which
//! the server reads as exactly those bytes; anything else must be UTF-8.

use std::fmt::Write;

/// `sql` as UTF-8 text that means the same to the server (default `sql_mode`: backslash
/// escapes, `"` strings). `None`: bytes that are not UTF-8 outside a quoted string.
pub fn utf8_query(sql: &[u8]) -> Option<String> {
    if let Ok(s) = std::str::from_utf8(sql) {
        return Some(s.to_string());
    }
    let mut out = String::with_capacity(sql.len() * 2);
    let mut i = 0;
    while i < sql.len() {
        let b = sql[i];
        match b {
            b'\'' | b'"' => {
                let (raw, end) = quoted(sql, i)?;
                let literal = &sql[i..end];
                match std::str::from_utf8(literal) {
                    Ok(text) => out.push_str(text),
                    Err(_) => {
                        // `_binary'…'` becomes `_binary X'…'`, not the name `_binaryX`.
                        if out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                            out.push(' ');
                        }
                        out.push_str("X'");
                        for byte in &raw {
                            let _ = write!(out, "{byte:02X}");
                        }
                        out.push('\'');
                    }
                }
                i = end;
            }
            _ => {
                // Up to the next quote: must be UTF-8 (comments and identifiers included).
                let end = sql[i..]
                    .iter()
                    .position(|&c| c == b'\'' || c == b'"')
                    .map_or(sql.len(), |p| i + p);
                out.push_str(std::str::from_utf8(&sql[i..end]).ok()?);
                i = end;
            }
        }
    }
    Some(out)
}

/// The quoted string starting at `start` (its quote character): its bytes unescaped and
/// the index just past its closing quote. `None`: it never closes.
fn quoted(sql: &[u8], start: usize) -> Option<(Vec<u8>, usize)> {
    let q = sql[start];
    let mut raw = Vec::new();
    let mut i = start + 1;
    while i < sql.len() {
        let c = sql[i];
        if c == b'\\' {
            let next = *sql.get(i + 1)?;
            match next {
                b'0' => raw.push(0),
                b'b' => raw.push(8),
                b'n' => raw.push(b'\n'),
                b'r' => raw.push(b'\r'),
                b't' => raw.push(b'\t'),
                b'Z' => raw.push(26),
                // LIKE's escapes keep their backslash.
                b'%' | b'_' => raw.extend_from_slice(&[b'\\', next]),
                other => raw.push(other),
            }
            i += 2;
        } else if c == q {
            if sql.get(i + 1) == Some(&q) {
                raw.push(q);
                i += 2;
            } else {
                return Some((raw, i + 1));
            }
        } else {
            raw.push(c);
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_strings_become_hex_literals() {
        assert_eq!(utf8_query(b"SELECT 'a'").as_deref(), Some("SELECT 'a'"));
        assert_eq!(
            utf8_query(b"INSERT INTO t VALUES (_binary'\x00\xff\\'\\\\x', 'ok', \"\xfe\")").as_deref(),
            Some("INSERT INTO t VALUES (_binary X'00FF275C78', 'ok', X'FE')")
        );
        assert_eq!(utf8_query(b"SELECT '\xff"), None, "a string that never closes");
        assert_eq!(utf8_query(b"SELECT \xff"), None, "not UTF-8 outside a string");
        assert_eq!(
            utf8_query(b"SELECT 'it''s \xe9'").as_deref(),
            Some("SELECT X'6974277320E9'")
        );
    }
}
