//! The digests of the statement texts seen lately, kept: the same few texts come back
//! thousands of times a second (a point select with other parameters), and normalising
//! each again was about a twelfth of the dispatcher's instructions per request
//! (callgrind). A digest depends on the text alone, so a kept one is exact.

use std::hash::BuildHasher;
use std::sync::Mutex;

use foldhash::HashMap;
use osprey_sql::Digest;

/// Shards (by the text's hash), so that threads of a multi-threaded runtime rarely meet.
const SHARDS: usize = 8;
/// Texts kept per shard at most; past it the shard starts again (a workload of ever-new
/// texts gains nothing from it).
const PER_SHARD: usize = 512;
/// Longer texts are digested every time: the memory stays under
/// `SHARDS × PER_SHARD × (MAX_LEN + the digest text)`, about 8 MiB at worst.
const MAX_LEN: usize = 1024;

pub struct DigestMemo {
    hasher: foldhash::fast::RandomState,
    shards: [Mutex<HashMap<Box<str>, Digest>>; SHARDS],
}

impl Default for DigestMemo {
    fn default() -> Self {
        DigestMemo {
            hasher: foldhash::fast::RandomState::default(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::default())),
        }
    }
}

impl DigestMemo {
    /// `osprey_sql::digest(sql)`, from memory when the text was seen lately.
    pub fn digest(&self, sql: &str) -> Digest {
        if sql.len() > MAX_LEN {
            return osprey_sql::digest(sql);
        }
        let shard = &self.shards[self.hasher.hash_one(sql) as usize % SHARDS];
        if let Some(d) = shard.lock().unwrap_or_else(|e| e.into_inner()).get(sql) {
            return d.clone();
        }
        let d = osprey_sql::digest(sql);
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= PER_SHARD {
            map.clear();
        }
        map.insert(sql.into(), d.clone());
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_digest_is_the_digest() {
        let memo = DigestMemo::default();
        for sql in [
            "SELECT c FROM sbtest1 WHERE id = ?",
            "select c from sbtest1 where id = 42",
            "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
            "",
        ] {
            for _ in 0..2 {
                let d = memo.digest(sql);
                let fresh = osprey_sql::digest(sql);
                assert_eq!((d.hash, &d.text), (fresh.hash, &fresh.text), "{sql:?}");
            }
        }
    }

    #[test]
    fn the_memory_is_bounded() {
        let memo = DigestMemo::default();
        for i in 0..SHARDS * PER_SHARD * 2 {
            memo.digest(&format!("SELECT {i} FROM t{i}"));
        }
        for shard in &memo.shards {
            assert!(shard.lock().unwrap().len() <= PER_SHARD);
        }
        let long = format!("SELECT '{}'", "x".repeat(MAX_LEN));
        assert_eq!(memo.digest(&long).hash, osprey_sql::digest(&long).hash);
        assert!(memo
            .shards
            .iter()
            .all(|s| !s.lock().unwrap().contains_key(long.as_str())));
    }
}
