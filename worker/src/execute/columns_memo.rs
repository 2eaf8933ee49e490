//! The encoded `COLUMNS` payloads of prepared statements' results, kept: a point select
//! sends the same column definitions with every answer, and encoding them again
//! (MessagePack, a map per column) was about a twentieth of the worker's instructions.
//!
//! Keyed on the definitions' `Arc`, which a prepared statement keeps for as long as it is
//! cached. With MariaDB's metadata caching (`MARIADB_CLIENT_CACHE_METADATA`, 10.6+) the
//! server leaves the definitions out of a prepared statement's results and `osprey_wire`
//! hands out that same `Arc` each time; without it (MySQL, older MariaDB) every result
//! brings them again, a new `Arc`, and nothing is kept (`Session::columns_kept` says
//! which). An entry holds its `Arc`, so the address cannot be reused for other
//! definitions while the entry lives. New definitions (after a schema change the server
//! sends them again) are a new `Arc`, hence a new entry.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use osprey_protocol::{Columns, Frame, Kind};

use crate::convert;

/// Entries kept at most (the least recently used goes first): a pipelined point select alone uses up
/// to `MAX_PIPELINE_DEPTH + 2` statements (its text and the tagged variants).
const MAX_ENTRIES: usize = 32;
/// Larger payloads (very wide results) are encoded every time: the memory stays under
/// `MAX_ENTRIES × MAX_PAYLOAD` plus the definitions the statements hold anyway.
const MAX_PAYLOAD: usize = 4096;

struct Entry {
    columns: Arc<[osprey_wire::Column]>,
    result_set: u32,
    payload: Bytes,
}

/// One task uses it (the executor's): no lock.
#[derive(Default)]
pub(crate) struct ColumnsMemo(RefCell<VecDeque<Entry>>);

impl ColumnsMemo {
    /// The `COLUMNS` frame of result set `result_set` with `columns`; `kept`: the
    /// definitions are a prepared statement's and the server caches them (the same `Arc`
    /// comes again), else they are encoded and not kept.
    pub(crate) fn frame(
        &self,
        stream: u32,
        result_set: u32,
        columns: &Arc<[osprey_wire::Column]>,
        kept: bool,
    ) -> Frame {
        if kept {
            let mut entries = self.0.borrow_mut();
            let hit = entries
                .iter()
                .position(|e| e.result_set == result_set && Arc::ptr_eq(&e.columns, columns));
            if let Some(i) = hit {
                // The most recently used first: the oldest unused goes when it is full.
                let entry = entries.remove(i).expect("found");
                let payload = entry.payload.clone();
                entries.push_front(entry);
                return Frame::with_payload(Kind::Columns, stream, payload);
            }
        }
        let body = Columns {
            result_set,
            columns: columns.iter().map(convert::column).collect(),
        };
        let encoded = Frame::new(Kind::Columns, stream, &body);
        if kept && encoded.payload.len() <= MAX_PAYLOAD {
            let mut entries = self.0.borrow_mut();
            if entries.len() >= MAX_ENTRIES {
                entries.pop_back();
            }
            entries.push_front(Entry {
                columns: columns.clone(),
                result_set,
                payload: encoded.payload.clone(),
            });
        }
        encoded
    }
}

#[cfg(test)]
mod tests {
    use osprey_wire::{Column, ColumnFlags, ColumnType};

    use super::*;

    fn defs(name: &str) -> Arc<[Column]> {
        vec![
            Column::new(ColumnType::MYSQL_TYPE_LONG)
                .with_name(b"id")
                .with_table(b"t")
                .with_flags(ColumnFlags::NOT_NULL_FLAG),
            Column::new(ColumnType::MYSQL_TYPE_VAR_STRING).with_name(name.as_bytes()),
        ]
        .into()
    }

    fn fresh(stream: u32, result_set: u32, columns: &[Column]) -> Frame {
        let body = Columns {
            result_set,
            columns: columns.iter().map(convert::column).collect(),
        };
        Frame::new(Kind::Columns, stream, &body)
    }

    #[test]
    fn a_kept_payload_is_the_encoding_of_its_definitions() {
        let memo = ColumnsMemo::default();
        let cols = defs("c");
        for stream in [1, 2, 3] {
            for result_set in [0, 1] {
                let f = memo.frame(stream, result_set, &cols, true);
                let want = fresh(stream, result_set, &cols);
                assert_eq!((f.kind, f.stream, &f.payload), (want.kind, want.stream, &want.payload));
            }
        }
        assert_eq!(
            memo.0.borrow().len(),
            2,
            "one entry per result set of the same definitions"
        );
        // The same definitions in another `Arc` (new ones from the server) are a new entry,
        // encoded from what they say now.
        let renamed = defs("d");
        let f = memo.frame(4, 0, &renamed, true);
        assert_eq!(f.payload, fresh(4, 0, &renamed).payload);
        assert_ne!(f.payload, fresh(4, 0, &cols).payload);
        assert_eq!(memo.0.borrow().len(), 3);
    }

    #[test]
    fn definitions_not_kept_are_not_remembered_and_the_memory_is_bounded() {
        let memo = ColumnsMemo::default();
        let cols = defs("c");
        let f = memo.frame(1, 0, &cols, false);
        assert_eq!(f.payload, fresh(1, 0, &cols).payload);
        assert!(memo.0.borrow().is_empty());
        let all: Vec<_> = (0..MAX_ENTRIES).map(|i| defs(&format!("c{i}"))).collect();
        for c in &all {
            memo.frame(1, 0, c, true);
        }
        assert_eq!(memo.0.borrow().len(), MAX_ENTRIES);
        let has = |c: &Arc<[Column]>| memo.0.borrow().iter().any(|e| Arc::ptr_eq(&e.columns, c));
        // The oldest, used again, stays; the least recently used goes for a new one.
        let hit = memo.frame(2, 0, &all[0], true);
        assert_eq!(hit.payload, fresh(2, 0, &all[0]).payload);
        let newer = defs("newer");
        memo.frame(1, 0, &newer, true);
        assert_eq!(memo.0.borrow().len(), MAX_ENTRIES);
        assert!(has(&all[0]) && has(&newer) && has(&all[MAX_ENTRIES - 1]));
        assert!(!has(&all[1]), "the least recently used was kept");
        let wide: Arc<[Column]> = (0..200)
            .map(|i| Column::new(ColumnType::MYSQL_TYPE_LONG).with_name(format!("column_{i}").as_bytes()))
            .collect::<Vec<_>>()
            .into();
        memo.frame(1, 0, &wide, true);
        assert!(
            !memo.0.borrow().iter().any(|e| Arc::ptr_eq(&e.columns, &wide)),
            "over MAX_PAYLOAD"
        );
    }
}
