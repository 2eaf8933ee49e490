//! Prepared statements and the per-session cache of them (by SQL text, least recently used
//! out first).

use foldhash::{HashMap, HashMapExt};
use std::sync::{Arc, Mutex};

use mysql_common::packets::Column;

/// A statement prepared on one session. Cheap to clone. It stays valid until the cache
/// evicts it, or a session reset / change of user drops every statement (executing it then
/// is a server error, 1243, and the session goes on).
#[derive(Debug, Clone)]
pub struct Statement(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    id: u32,
    params: Arc<[Column]>,
    /// The latest definitions the server sent (at prepare or with an execute's result):
    /// under metadata caching, the ones an execute without definitions means.
    columns: Mutex<Arc<[Column]>>,
}

impl Statement {
    pub(crate) fn new(id: u32, params: Vec<Column>, columns: Vec<Column>) -> Statement {
        Statement(Arc::new(Inner {
            id,
            params: params.into(),
            columns: Mutex::new(columns.into()),
        }))
    }

    /// The server's statement id.
    pub fn id(&self) -> u32 {
        self.0.id
    }

    /// How many `?` markers the server counted.
    pub fn num_params(&self) -> u16 {
        self.0.params.len() as u16
    }

    /// The parameters' metadata, as the server describes them at prepare time.
    pub fn params(&self) -> &Arc<[Column]> {
        &self.0.params
    }

    /// The result columns as last described by the server (at prepare time, or by the
    /// latest execute that sent definitions).
    pub fn columns(&self) -> Arc<[Column]> {
        match self.0.columns.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn set_columns(&self, columns: Arc<[Column]>) {
        match self.0.columns.lock() {
            Ok(mut c) => *c = columns,
            Err(poisoned) => *poisoned.into_inner() = columns,
        }
    }
}

pub(crate) struct StmtCache {
    cap: usize,
    tick: u64,
    map: HashMap<String, (Statement, u64)>,
}

impl StmtCache {
    pub(crate) fn new(cap: usize) -> StmtCache {
        StmtCache {
            cap,
            tick: 0,
            map: HashMap::new(),
        }
    }

    pub(crate) fn get(&mut self, sql: &str) -> Option<Statement> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(sql).map(|(stmt, used)| {
            *used = tick;
            stmt.clone()
        })
    }

    /// Adds `stmt`; returns the statements pushed out, to be closed on the server.
    pub(crate) fn put(&mut self, sql: &str, stmt: Statement) -> Vec<Statement> {
        self.tick += 1;
        let mut out = Vec::new();
        if let Some((old, _)) = self.map.insert(sql.to_owned(), (stmt, self.tick)) {
            out.push(old);
        }
        while self.map.len() > self.cap {
            // A linear scan over at most a few hundred entries, once per eviction.
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((stmt, _)) = self.map.remove(&oldest) {
                out.push(stmt);
            }
        }
        out
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_goes_first() {
        let mut cache = StmtCache::new(2);
        assert!(cache.put("a", Statement::new(1, vec![], vec![])).is_empty());
        assert!(cache.put("b", Statement::new(2, vec![], vec![])).is_empty());
        assert_eq!(cache.get("a").map(|s| s.id()), Some(1));
        let out = cache.put("c", Statement::new(3, vec![], vec![]));
        assert_eq!(out.iter().map(Statement::id).collect::<Vec<_>>(), vec![2]);
        assert!(cache.get("b").is_none());
        assert_eq!(cache.len(), 2);
    }
}
