//! MessagePack written by hand, byte for byte as `rmp_serde::to_vec_named` writes our
//! bodies: every integer in its shortest form (`rmp::encode::write_uint`/`write_sint`),
//! strings, binaries, arrays and maps with their shortest headers, a [`Value`] as its
//! `Serialize` impl. The hot bodies (`END`, `ROWS`, `REQUEST`) are encoded with it: serde
//! cost a worker ~1.1k instructions per `ROWS` of one row and the SDK ~2.7k per `REQUEST`
//! (callgrind, `scripts/instructions.sh`), most of it a `Vec` grown from empty and the
//! generic walk. Tests compare every encoder with serde on arbitrary bodies.

use crate::value::Value;

/// A body under construction. A length MessagePack cannot carry (≥ 4 GiB) marks it
/// `unfit`; its encoder then hands the body to serde, so that the bytes stay serde's even
/// there (rmp cuts such a length short; no frame can carry one anyway).
pub(crate) struct Writer {
    pub(crate) out: Vec<u8>,
    pub(crate) unfit: bool,
}

impl Writer {
    pub(crate) fn with_capacity(n: usize) -> Writer {
        Writer {
            out: Vec::with_capacity(n),
            unfit: false,
        }
    }

    /// `None` when a length did not fit: the caller takes serde's encoding.
    pub(crate) fn finish(self) -> Option<Vec<u8>> {
        (!self.unfit).then_some(self.out)
    }

    pub(crate) fn nil(&mut self) {
        self.out.push(0xC0);
    }

    pub(crate) fn bool(&mut self, v: bool) {
        self.out.push(if v { 0xC3 } else { 0xC2 });
    }

    /// A field name (all of ours are fixstr: under 32 bytes).
    pub(crate) fn key(&mut self, name: &'static str) {
        debug_assert!(name.len() < 32);
        self.out.push(0xA0 | name.len() as u8);
        self.out.extend_from_slice(name.as_bytes());
    }

    /// An unsigned integer in its shortest form, as `rmp::encode::write_uint`.
    pub(crate) fn uint(&mut self, v: u64) {
        if v < 128 {
            self.out.push(v as u8);
        } else if let Ok(n) = u8::try_from(v) {
            self.out.extend_from_slice(&[0xCC, n]);
        } else if let Ok(n) = u16::try_from(v) {
            self.out.push(0xCD);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else if let Ok(n) = u32::try_from(v) {
            self.out.push(0xCE);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            self.out.push(0xCF);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// A signed integer in its shortest form, as `rmp::encode::write_sint`: negative
    /// fixint, then int 8/16/32/64 below zero; the unsigned forms from zero up.
    pub(crate) fn sint(&mut self, v: i64) {
        if v >= 0 {
            return self.uint(v as u64);
        }
        if v >= -32 {
            self.out.push(v as u8);
        } else if let Ok(n) = i8::try_from(v) {
            self.out.extend_from_slice(&[0xD0, n as u8]);
        } else if let Ok(n) = i16::try_from(v) {
            self.out.push(0xD1);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else if let Ok(n) = i32::try_from(v) {
            self.out.push(0xD2);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            self.out.push(0xD3);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn str(&mut self, s: &str) {
        let len = s.len();
        if len < 32 {
            self.out.push(0xA0 | len as u8);
        } else if let Ok(n) = u8::try_from(len) {
            self.out.extend_from_slice(&[0xD9, n]);
        } else if let Ok(n) = u16::try_from(len) {
            self.out.push(0xDA);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            self.len32(0xDB, len);
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn bin(&mut self, b: &[u8]) {
        let len = b.len();
        if let Ok(n) = u8::try_from(len) {
            self.out.extend_from_slice(&[0xC4, n]);
        } else if let Ok(n) = u16::try_from(len) {
            self.out.push(0xC5);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            self.len32(0xC6, len);
        }
        self.out.extend_from_slice(b);
    }

    pub(crate) fn array(&mut self, len: usize) {
        if len < 16 {
            self.out.push(0x90 | len as u8);
        } else if let Ok(n) = u16::try_from(len) {
            self.out.push(0xDC);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            self.len32(0xDD, len);
        }
    }

    pub(crate) fn map(&mut self, len: usize) {
        if len < 16 {
            self.out.push(0x80 | len as u8);
        } else if let Ok(n) = u16::try_from(len) {
            self.out.push(0xDE);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            self.len32(0xDF, len);
        }
    }

    fn len32(&mut self, marker: u8, len: usize) {
        let n = u32::try_from(len).unwrap_or_else(|_| {
            self.unfit = true;
            0
        });
        self.out.push(marker);
        self.out.extend_from_slice(&n.to_be_bytes());
    }

    /// A value as `impl Serialize for Value` writes it.
    pub(crate) fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.nil(),
            Value::Int(n) => self.sint(*n),
            Value::Float(f) => {
                self.out.push(0xCA);
                self.out.extend_from_slice(&f.to_bits().to_be_bytes());
            }
            Value::Double(f) => {
                self.out.push(0xCB);
                self.out.extend_from_slice(&f.to_bits().to_be_bytes());
            }
            Value::Bytes(b) => self.bin(b),
            Value::Text(s) => self.str(s),
            Value::UInt(n) => {
                self.out.extend_from_slice(&[0x92, crate::value::TAG_UINT]);
                self.uint(*n);
            }
            Value::Decimal(s) => {
                self.out.extend_from_slice(&[0x92, crate::value::TAG_DECIMAL]);
                self.str(s);
            }
            Value::Json(s) => {
                self.out.extend_from_slice(&[0x92, crate::value::TAG_JSON]);
                self.str(s);
            }
            Value::Bit(b) => {
                self.out.extend_from_slice(&[0x92, crate::value::TAG_BIT]);
                self.bin(b);
            }
            Value::Date {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micro,
            } => {
                self.out.extend_from_slice(&[0x98, crate::value::TAG_DATE]);
                self.uint(u64::from(*year));
                for n in [month, day, hour, minute, second] {
                    self.uint(u64::from(*n));
                }
                self.uint(u64::from(*micro));
            }
            Value::Time {
                negative,
                days,
                hours,
                minutes,
                seconds,
                micros,
            } => {
                self.out.extend_from_slice(&[0x97, crate::value::TAG_TIME]);
                self.bool(*negative);
                self.uint(u64::from(*days));
                for n in [hours, minutes, seconds] {
                    self.uint(u64::from(*n));
                }
                self.uint(u64::from(*micros));
            }
        }
    }

    pub(crate) fn values(&mut self, values: &[Value]) {
        self.array(values.len());
        for v in values {
            self.value(v);
        }
    }
}

/// The most bytes [`Writer::value`] writes for `v`: for sizing buffers.
pub(crate) fn value_size(v: &Value) -> usize {
    match v {
        Value::Null => 1,
        Value::Int(_) | Value::Double(_) => 9,
        Value::Float(_) => 5,
        Value::UInt(_) => 11,
        Value::Bytes(b) | Value::Bit(b) => b.len() + 7,
        Value::Text(s) | Value::Decimal(s) | Value::Json(s) => s.len() + 7,
        // Header and tag, a u16, five u8, a u32 (a bool for the u16 in Time).
        Value::Date { .. } | Value::Time { .. } => 2 + 3 + 5 * 2 + 5,
    }
}
