//! Reading the MessagePack forms our hand-written decoders take (`end_decode`,
//! `request_decode`, `columns_decode`).

/// A cursor over a body. Every read is `None` where the bytes are not of the expected
/// form (or end too soon): the caller leaves the body to serde then.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// The entries of a map (fixmap or map 16).
    pub(crate) fn map_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x80..=0x8F => Some(usize::from(b & 0x0F)),
            0xDE => Some(usize::from(u16::from_be_bytes(self.be()?))),
            _ => None,
        }
    }

    /// A map whose keys are field names, each at most once (serde refuses a duplicate):
    /// `field` gives a name's index (under 32), `each` reads that field's value. `None`
    /// on an unknown or repeated name, or where `each` refuses. The fields seen, a bit per
    /// index.
    pub(crate) fn fields(
        &mut self,
        field: impl Fn(&[u8]) -> Option<u32>,
        mut each: impl FnMut(u32, &mut Self) -> Option<()>,
    ) -> Option<u32> {
        let n = self.map_len()?;
        let mut seen = 0u32;
        for _ in 0..n {
            let f = field(self.fixstr()?)?;
            let bit = 1u32 << f;
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            each(f, self)?;
        }
        Some(seen)
    }

    /// The elements of an array (fixarray, array 16 or array 32).
    pub(crate) fn array_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x90..=0x9F => Some(usize::from(b & 0x0F)),
            0xDC => Some(usize::from(u16::from_be_bytes(self.be()?))),
            0xDD => usize::try_from(u32::from_be_bytes(self.be()?)).ok(),
            _ => None,
        }
    }

    /// The bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// A bin in any of its header sizes.
    pub(crate) fn bin(&mut self) -> Option<&'a [u8]> {
        let len = match self.byte()? {
            0xC4 => usize::from(self.byte()?),
            0xC5 => usize::from(u16::from_be_bytes(self.be()?)),
            0xC6 => usize::try_from(u32::from_be_bytes(self.be()?)).ok()?,
            _ => return None,
        };
        self.take(len)
    }

    /// The next byte, not consumed.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.buf.split_first()?;
        self.buf = rest;
        Some(b)
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    pub(crate) fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A field name: every one is a fixstr.
    pub(crate) fn fixstr(&mut self) -> Option<&'a [u8]> {
        match self.byte()? {
            b @ 0xA0..=0xBF => self.take(usize::from(b & 0x1F)),
            _ => None,
        }
    }

    /// An unsigned integer in any of its widths.
    pub(crate) fn uint(&mut self) -> Option<u64> {
        Some(match self.byte()? {
            b @ 0x00..=0x7F => u64::from(b),
            0xCC => u64::from(self.byte()?),
            0xCD => u64::from(u16::from_be_bytes(self.be()?)),
            0xCE => u64::from(u32::from_be_bytes(self.be()?)),
            0xCF => u64::from_be_bytes(self.be()?),
            _ => return None,
        })
    }

    pub(crate) fn boolean(&mut self) -> Option<bool> {
        match self.byte()? {
            0xC2 => Some(false),
            0xC3 => Some(true),
            _ => None,
        }
    }

    /// A str in any of its header sizes, valid UTF-8 (serde refuses it otherwise).
    pub(crate) fn text(&mut self) -> Option<String> {
        self.str().map(str::to_owned)
    }

    /// A str, borrowed (see [`Reader::text`]).
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        let len = match self.byte()? {
            b @ 0xA0..=0xBF => usize::from(b & 0x1F),
            0xD9 => usize::from(self.byte()?),
            0xDA => usize::from(u16::from_be_bytes(self.be()?)),
            0xDB => usize::try_from(u32::from_be_bytes(self.be()?)).ok()?,
            _ => return None,
        };
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).ok()
    }

    /// `nil`, or what `read` reads. The outer `None`: neither (serde decides).
    pub(crate) fn opt<T>(&mut self, read: fn(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.buf.first() == Some(&0xC0) {
            self.buf = &self.buf[1..];
            return Some(None);
        }
        read(self).map(Some)
    }
}
