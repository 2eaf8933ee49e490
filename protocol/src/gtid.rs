//! MariaDB GTID positions, as carried by `END.gtid` and `REQUEST.causal_gtid`.
//!
//! A MariaDB GTID is `domain-server-seq` (`0-1-42`): the replication domain, the server
//! id of the server that first wrote the transaction, and its sequence number. A
//! *position* (what `@@gtid_slave_pos`, `@@gtid_binlog_pos` and `@@last_gtid` hold)
//! is a comma-separated list of GTIDs with at most one per domain.
//!
//! Comparison is per domain by sequence number only ([`GtidPos::dominates`]): within
//! a domain MariaDB gives event groups increasing sequence numbers whichever server
//! wrote them (a promoted replica continues the domain's numbering), and a replica
//! applies a domain's event groups in that order. So a replica whose position in
//! domain D is `D-S-N` has applied every event group of D with a sequence number up
//! to N, whatever their server ids; `MASTER_GTID_WAIT` compares the same way. This
//! holds as long as a domain has no diverging histories, which `gtid_strict_mode`
//! (on in Osprey's sandbox and recommended for Osprey's clusters) enforces.

use std::fmt;

/// The most domains one position may hold; real deployments use a handful.
pub const MAX_DOMAINS: usize = 64;
/// The longest text [`GtidPos::parse`] accepts: 64 GTIDs of the longest form
/// (`4294967295-4294967295-18446744073709551615,`, 43 bytes), with room for spaces.
pub const MAX_TEXT: usize = 4096;

/// One MariaDB GTID: `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text(&mut [0u8; GTID_TEXT]))
    }
}

/// The longest GTID in decimal: u32 + u32 + u64 and two dashes, 10 + 10 + 20 + 2 bytes.
const GTID_TEXT: usize = 42;

impl Gtid {
    /// `domain-server-seq` in decimal, written at the end of `buf`. By hand: a worker
    /// writes one for every commit it reports, and `write!` of three integers cost ~1k
    /// instructions, 7 % of a worker's work for a one-row INSERT.
    fn text<'b>(&self, buf: &'b mut [u8; GTID_TEXT]) -> &'b str {
        let mut at = buf.len();
        for (i, n) in [self.seq, u64::from(self.server), u64::from(self.domain)]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                at -= 1;
                buf[at] = b'-';
            }
            let mut n = n;
            loop {
                at -= 1;
                buf[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
        }
        // Only ASCII digits and dashes were written.
        std::str::from_utf8(&buf[at..]).unwrap_or_default()
    }
}

/// Why a text is not a GTID position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GtidError {
    #[error("GTID position of {0} bytes is too long (at most {MAX_TEXT})")]
    TooLong(usize),
    #[error("GTID position has more than {MAX_DOMAINS} domains")]
    TooManyDomains,
    #[error("GTID position has an empty element (a stray comma?)")]
    Empty,
    #[error("`{0}` is not a GTID (domain-server-seq, each a decimal number)")]
    Malformed(String),
    #[error("GTID position names domain {0} twice")]
    DuplicateDomain(u32),
}

/// A MariaDB GTID position: at most one GTID per domain, kept sorted by domain.
///
/// ```
/// use osprey_protocol::GtidPos;
/// let mut a = GtidPos::parse("0-1-10, 1-2-5").unwrap();
/// let b = GtidPos::parse("0-2-12").unwrap();
/// assert!(!a.dominates(&b));
/// a.merge(&b);
/// assert_eq!(a.to_string(), "0-2-12,1-2-5");
/// assert!(a.dominates(&b));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GtidPos {
    /// Sorted by domain, one entry per domain.
    gtids: Vec<Gtid>,
}

impl GtidPos {
    /// The empty position (nothing to wait for).
    pub fn new() -> GtidPos {
        GtidPos::default()
    }

    /// Parses `domain-server-seq[,domain-server-seq...]`. Spaces around elements are
    /// allowed; an empty (or all-blank) text is the empty position. Refused: a text over
    /// [`MAX_TEXT`] bytes, more than [`MAX_DOMAINS`] elements, an empty element, anything
    /// but three decimal numbers in range (`u32`, `u32`, `u64`), a domain named twice.
    pub fn parse(text: &str) -> Result<GtidPos, GtidError> {
        // What a server reports after a commit: one GTID, nothing around it.
        if let Some(gtid) = parse_plain(text.as_bytes()) {
            return Ok(GtidPos { gtids: vec![gtid] });
        }
        parse_general(text)
    }

    /// A position of one GTID.
    pub fn single(gtid: Gtid) -> GtidPos {
        GtidPos { gtids: vec![gtid] }
    }

    pub fn is_empty(&self) -> bool {
        self.gtids.is_empty()
    }

    /// Number of domains.
    pub fn len(&self) -> usize {
        self.gtids.len()
    }

    /// The GTIDs, sorted by domain.
    pub fn iter(&self) -> impl Iterator<Item = &Gtid> {
        self.gtids.iter()
    }

    /// The canonical text ([`fmt::Display`]'s), written without the formatting machinery
    /// into a string allocated once (what a worker puts in every `END` after a commit).
    pub fn to_text(&self) -> String {
        let mut out = String::with_capacity(self.gtids.len() * (GTID_TEXT + 1));
        let mut buf = [0u8; GTID_TEXT];
        for (i, g) in self.gtids.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(g.text(&mut buf));
        }
        out
    }

    /// This position's GTID in `domain`.
    pub fn get(&self, domain: u32) -> Option<&Gtid> {
        self.gtids
            .binary_search_by_key(&domain, |g| g.domain)
            .ok()
            .map(|i| &self.gtids[i])
    }

    /// Takes in `other`: per domain, the higher sequence number wins (on equal sequence
    /// numbers the higher server id, so that merging is commutative). A merge past
    /// [`MAX_DOMAINS`] keeps every domain: the bound is for untrusted text, not for
    /// positions this process built.
    pub fn merge(&mut self, other: &GtidPos) {
        for g in &other.gtids {
            match self.gtids.binary_search_by_key(&g.domain, |x| x.domain) {
                Ok(i) => {
                    let mine = &mut self.gtids[i];
                    if (g.seq, g.server) > (mine.seq, mine.server) {
                        *mine = *g;
                    }
                }
                Err(i) => self.gtids.insert(i, *g),
            }
        }
    }

    /// Whether a server at this position has applied everything `other` names: for every
    /// domain of `other`, this position has that domain with a sequence number at least
    /// as high. Server ids are not compared (see the module docs). Every position
    /// dominates the empty one.
    pub fn dominates(&self, other: &GtidPos) -> bool {
        other
            .gtids
            .iter()
            .all(|g| self.get(g.domain).is_some_and(|mine| mine.seq >= g.seq))
    }
}

impl fmt::Display for GtidPos {
    /// Canonical form: sorted by domain, comma-separated, no spaces, no leading zeros.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.gtids.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for GtidPos {
    type Err = GtidError;
    fn from_str(s: &str) -> Result<GtidPos, GtidError> {
        GtidPos::parse(s)
    }
}

/// [`GtidPos::parse`] for any text.
fn parse_general(text: &str) -> Result<GtidPos, GtidError> {
    if text.len() > MAX_TEXT {
        return Err(GtidError::TooLong(text.len()));
    }
    let mut gtids = Vec::new();
    if text.trim().is_empty() {
        return Ok(GtidPos { gtids });
    }
    for element in text.split(',') {
        if gtids.len() == MAX_DOMAINS {
            return Err(GtidError::TooManyDomains);
        }
        gtids.push(parse_one(element.trim())?);
    }
    gtids.sort_unstable_by_key(|g| g.domain);
    if let Some(w) = gtids.windows(2).find(|w| w[0].domain == w[1].domain) {
        return Err(GtidError::DuplicateDomain(w[0].domain));
    }
    Ok(GtidPos { gtids })
}

/// `domain-server-seq` exactly (decimal digits, each number in range): the form a server
/// reports, and each element of a position; None for anything else. One pass, no
/// allocation.
fn parse_plain(text: &[u8]) -> Option<Gtid> {
    if text.len() > MAX_TEXT {
        return None; // leading zeros can make it long: refused as any long text
    }
    let mut numbers = [0u64; 3];
    let mut part = 0;
    let mut digits = 0;
    for &b in text {
        match b {
            b'0'..=b'9' => {
                let n = &mut numbers[part];
                *n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                digits += 1;
            }
            b'-' if digits > 0 && part < 2 => {
                part += 1;
                digits = 0;
            }
            _ => return None,
        }
    }
    if part != 2 || digits == 0 {
        return None;
    }
    Some(Gtid {
        domain: u32::try_from(numbers[0]).ok()?,
        server: u32::try_from(numbers[1]).ok()?,
        seq: numbers[2],
    })
}

fn parse_one(element: &str) -> Result<Gtid, GtidError> {
    if element.is_empty() {
        return Err(GtidError::Empty);
    }
    parse_plain(element.as_bytes()).ok_or_else(|| GtidError::Malformed(element.chars().take(64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One GTID read with `str::parse` (the reading before `parse_plain`): the
    /// reference the one-pass reader is held to.
    fn std_reading(text: &str) -> Option<Gtid> {
        let mut parts = text.split('-');
        let (Some(d), Some(s), Some(q), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        // `u64::from_str` also takes a leading `+`: only plain digits are a GTID.
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !(digits(d) && digits(s) && digits(q)) {
            return None;
        }
        Some(Gtid {
            domain: d.parse().ok()?,
            server: s.parse().ok()?,
            seq: q.parse().ok()?,
        })
    }

    fn pos(s: &str) -> GtidPos {
        GtidPos::parse(s).unwrap()
    }

    #[test]
    fn parses_and_prints_canonically() {
        assert_eq!(pos("0-1-42").to_string(), "0-1-42");
        assert_eq!(pos(" 2-1-7 ,0-3-9").to_string(), "0-3-9,2-1-7");
        assert_eq!(pos("007-01-0042").to_string(), "7-1-42");
        assert_eq!(
            pos("4294967295-4294967295-18446744073709551615").to_string(),
            "4294967295-4294967295-18446744073709551615"
        );
        assert!(pos("").is_empty());
        assert!(pos("  ").is_empty());
        assert_eq!(
            pos("1-2-3").get(1),
            Some(&Gtid {
                domain: 1,
                server: 2,
                seq: 3
            })
        );
        assert_eq!(pos("1-2-3").get(0), None);
    }

    #[test]
    fn refuses_what_is_not_a_position() {
        for bad in [
            "0-1",
            "0-1-2-3",
            "a-1-2",
            "0-1-",
            "-1-2",
            "0--2",
            "+0-1-2",
            "0-1-+2",
            "0-1-2,",
            ",0-1-2",
            "0-1-2,,1-1-1",
            "0 -1-2",
            "0-1-2;1-1-1",
            "4294967296-1-1",
            "0-4294967296-1",
            "0-1-18446744073709551616",
            "٣-1-2",
        ] {
            assert!(GtidPos::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(GtidPos::parse("0-1-2,0-2-3"), Err(GtidError::DuplicateDomain(0)));
        assert_eq!(GtidPos::parse("0-1-2,,"), Err(GtidError::Empty));
        let many: Vec<String> = (0..=MAX_DOMAINS).map(|d| format!("{d}-1-1")).collect();
        assert_eq!(GtidPos::parse(&many.join(",")), Err(GtidError::TooManyDomains));
        assert_eq!(
            GtidPos::parse(&many[..MAX_DOMAINS].join(",")).map(|p| p.len()),
            Ok(MAX_DOMAINS)
        );
        let long = " ".repeat(MAX_TEXT + 1);
        assert_eq!(GtidPos::parse(&long), Err(GtidError::TooLong(MAX_TEXT + 1)));
    }

    #[test]
    fn dominance_is_per_domain_by_sequence() {
        assert!(pos("0-1-10").dominates(&pos("0-1-10")));
        assert!(pos("0-1-10").dominates(&pos("0-1-9")));
        assert!(!pos("0-1-9").dominates(&pos("0-1-10")));
        // Another server id in the same domain: only the sequence counts.
        assert!(pos("0-2-10").dominates(&pos("0-1-9")));
        assert!(!pos("0-2-8").dominates(&pos("0-1-9")));
        // A domain the replica has not seen at all.
        assert!(!pos("0-1-10").dominates(&pos("1-1-1")));
        assert!(pos("0-1-10,1-1-1").dominates(&pos("1-1-1")));
        assert!(!pos("0-1-10,1-1-1").dominates(&pos("0-1-5,1-1-2")));
        assert!(pos("").dominates(&pos("")));
        assert!(pos("0-1-1").dominates(&GtidPos::new()));
        assert!(!GtidPos::new().dominates(&pos("0-1-1")));
    }

    #[test]
    fn merge_keeps_the_higher_sequence_per_domain() {
        let mut p = pos("0-1-10,2-1-3");
        p.merge(&pos("0-2-9,1-1-1,2-3-4"));
        assert_eq!(p.to_string(), "0-1-10,1-1-1,2-3-4");
        let mut q = pos("0-1-5");
        q.merge(&pos("0-2-5"));
        assert_eq!(q.to_string(), "0-2-5");
    }

    fn arb_pos() -> impl Strategy<Value = GtidPos> {
        proptest::collection::btree_map(0u32..6, (0u32..4, 0u64..50), 0..5).prop_map(|m| GtidPos {
            gtids: m
                .into_iter()
                .map(|(domain, (server, seq))| Gtid { domain, server, seq })
                .collect(),
        })
    }

    #[test]
    fn a_long_text_of_one_gtid_is_too_long() {
        let text = format!("{}1-1-1", "0".repeat(MAX_TEXT - 4));
        assert_eq!(GtidPos::parse(&text), Err(GtidError::TooLong(MAX_TEXT + 1)));
        assert_eq!(GtidPos::parse(&text[1..]).unwrap().to_string(), "1-1-1");
    }

    #[test]
    fn a_server_s_form_takes_the_plain_path() {
        for text in ["0-1-42", "00-01-0042", "4294967295-4294967295-18446744073709551615"] {
            let g = parse_plain(text.as_bytes()).expect(text);
            assert_eq!(Some(g), std_reading(text));
        }
        // Past each number's range: the general path's refusal.
        for text in ["4294967296-1-1", "1-4294967296-1", "1-1-18446744073709551616"] {
            assert_eq!(parse_plain(text.as_bytes()), None, "{text}");
            assert!(matches!(GtidPos::parse(text), Err(GtidError::Malformed(_))), "{text}");
        }
    }

    proptest! {
        #[test]
        fn merge_is_commutative_idempotent_and_dominates(a in arb_pos(), b in arb_pos()) {
            let mut ab = a.clone();
            ab.merge(&b);
            let mut ba = b.clone();
            ba.merge(&a);
            prop_assert_eq!(&ab, &ba);
            let mut aa = a.clone();
            aa.merge(&a);
            prop_assert_eq!(&aa, &a);
            let mut abb = ab.clone();
            abb.merge(&b);
            prop_assert_eq!(&abb, &ab);
            prop_assert!(ab.dominates(&a));
            prop_assert!(ab.dominates(&b));
            prop_assert!(a.dominates(&a));
        }

        #[test]
        fn display_parses_back(a in arb_pos()) {
            prop_assert_eq!(a.to_text(), a.to_string());
            prop_assert_eq!(GtidPos::parse(&a.to_string()), Ok(a));
        }

        /// The one-pass reader takes what `str::parse` takes, and nothing else.
        #[test]
        fn plain_path_agrees(s in "[0-9-]{0,30}|[0-9]{1,21}-[0-9]{1,11}-[0-9]{1,21}") {
            prop_assert_eq!(parse_plain(s.as_bytes()), std_reading(&s));
        }

        /// Numbers at and past each bound, with leading zeros.
        #[test]
        fn plain_path_bounds(d in 0u64..=u64::from(u32::MAX) + 1, s in 0u64..=u64::from(u32::MAX) + 1, q: u64, z in 0usize..3) {
            let zeros = "0".repeat(z);
            let text = format!("{zeros}{d}-{s}-{zeros}{q}");
            prop_assert_eq!(GtidPos::parse(&text).ok(), std_reading(&text).map(GtidPos::single));
            let edge = format!("{}-{}-{}", u32::MAX as u64 + (d & 1), u32::MAX, u64::MAX);
            prop_assert_eq!(GtidPos::parse(&edge).ok(), std_reading(&edge).map(GtidPos::single));
        }

        /// Canonical text: Display writes what the general parser reads back, as `write!` did.
        #[test]
        fn gtid_display_is_decimal(d: u32, s: u32, q: u64) {
            let g = Gtid { domain: d, server: s, seq: q };
            prop_assert_eq!(g.to_string(), format!("{d}-{s}-{q}"));
        }

        #[test]
        fn parse_never_panics(s in "[0-9, +-]{0,80}|\\PC{0,80}") {
            let _ = GtidPos::parse(&s);
        }
    }
}
