//! The bytes of MySQL packets: a checked reading cursor and length-encoded writing.

/// Length-encoded integer.
pub fn put_lenenc_int(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=250 => out.push(v as u8),
        251..=0xFFFF => {
            out.push(0xFC);
            out.extend_from_slice(&(v as u16).to_le_bytes());
        }
        0x1_0000..=0xFF_FFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(v as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xFE);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Length-encoded string.
pub fn put_lenenc_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_lenenc_int(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A cursor over a packet's payload; every read is checked (bad input is an error, never a
/// panic).
pub struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    pub fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    /// A NUL-terminated string (the NUL consumed).
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let i = self.0.iter().position(|&b| b == 0)?;
        let s = &self.0[..i];
        self.0 = &self.0[i + 1..];
        Some(s)
    }

    pub fn lenenc_int(&mut self) -> Option<u64> {
        match self.u8()? {
            n @ 0..=0xFA => Some(u64::from(n)),
            0xFC => self.u16().map(u64::from),
            0xFD => {
                let b = self.take(3)?;
                Some(u64::from(b[0]) | u64::from(b[1]) << 8 | u64::from(b[2]) << 16)
            }
            0xFE => {
                let b = self.take(8)?;
                Some(u64::from_le_bytes(b.try_into().ok()?))
            }
            _ => None,
        }
    }

    pub fn lenenc_bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.lenenc_int()?).ok()?;
        self.take(n)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_input_is_none_not_a_panic() {
        let mut c = Cursor(&[0xFC, 1]);
        assert_eq!(c.lenenc_int(), None);
        let mut c = Cursor(&[0xFE, 1, 2]);
        assert_eq!(c.lenenc_bytes(), None);
        let mut out = Vec::new();
        for v in [0, 250, 251, 65_535, 65_536, 1 << 24, u64::MAX] {
            out.clear();
            put_lenenc_int(&mut out, v);
            assert_eq!(Cursor(&out).lenenc_int(), Some(v));
        }
    }
}
