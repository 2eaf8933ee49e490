//! `REQUEST` encoded by hand: the SDK writes one per statement, and so does the MySQL
//! front end for each command it admits. Through serde (`Frame::new`) a point select's
//! cost the SDK ~2.7k instructions, 12 % of all it spends on one (callgrind,
//! `scripts/instructions.sh loadgen`). The bytes are exactly serde's: the fields in the
//! struct's order, the optional ones left out as `skip_serializing_if` leaves them;
//! `tests/roundtrip.rs` compares the two on arbitrary requests.

use bytes::Bytes;

use crate::body::{Request, Statement};
use crate::frame::{Frame, Kind};
use crate::msgpack_write::{value_size, Writer};

impl Request {
    /// The body as [`Frame::new`] encodes it.
    pub fn encode(&self) -> Vec<u8> {
        let params = |p: &[crate::Value]| p.iter().map(value_size).sum::<usize>();
        let texts = [&self.cluster, &self.causal_gtid, &self.schema]
            .iter()
            .filter_map(|t| t.as_ref().map(|t| t.len() + 15))
            .sum::<usize>()
            + self.vars.iter().map(|(n, v)| n.len() + v.len() + 11).sum::<usize>()
            + self
                .batch
                .iter()
                .map(|s| s.sql.len() + params(&s.params) + 24)
                .sum::<usize>()
            + 3 * self.blob_params.len();
        // The keys and the fixed fields take at most 250 bytes.
        let mut w = Writer::with_capacity(256 + self.sql.len() + params(&self.params) + texts);
        let fields = 7
            + usize::from(self.cluster.is_some())
            + usize::from(self.causal_gtid.is_some())
            + usize::from(self.open_session)
            + usize::from(self.session.is_some())
            + usize::from(self.text_rows)
            + usize::from(self.prepared)
            + usize::from(!self.blob_params.is_empty())
            + usize::from(self.prepare_only)
            + usize::from(self.multi_results)
            + usize::from(self.raw_rows)
            + usize::from(self.schema.is_some())
            + usize::from(!self.vars.is_empty());
        w.map(fields);
        w.key("sql");
        w.str(&self.sql);
        w.key("params");
        w.values(&self.params);
        w.key("batch");
        w.array(self.batch.len());
        for Statement { sql, params } in &self.batch {
            w.map(2);
            w.key("sql");
            w.str(sql);
            w.key("params");
            w.values(params);
        }
        w.key("read_only");
        w.bool(self.read_only);
        w.key("idempotent");
        w.bool(self.idempotent);
        w.key("force_primary");
        w.bool(self.force_primary);
        w.key("timeout_ms");
        w.uint(self.timeout_ms);
        if let Some(cluster) = &self.cluster {
            w.key("cluster");
            w.str(cluster);
        }
        if let Some(gtid) = &self.causal_gtid {
            w.key("causal_gtid");
            w.str(gtid);
        }
        if self.open_session {
            w.key("open_session");
            w.bool(true);
        }
        if let Some(session) = self.session {
            w.key("session");
            w.uint(u64::from(session));
        }
        if self.text_rows {
            w.key("text_rows");
            w.bool(true);
        }
        if self.prepared {
            w.key("prepared");
            w.bool(true);
        }
        if !self.blob_params.is_empty() {
            w.key("blob_params");
            w.array(self.blob_params.len());
            for i in &self.blob_params {
                w.uint(u64::from(*i));
            }
        }
        if self.prepare_only {
            w.key("prepare_only");
            w.bool(true);
        }
        if self.multi_results {
            w.key("multi_results");
            w.bool(true);
        }
        if self.raw_rows {
            w.key("raw_rows");
            w.bool(true);
        }
        if let Some(schema) = &self.schema {
            w.key("schema");
            w.str(schema);
        }
        if !self.vars.is_empty() {
            w.key("vars");
            w.array(self.vars.len());
            for (name, value) in &self.vars {
                w.array(2);
                w.str(name);
                w.str(value);
            }
        }
        w.finish()
            .unwrap_or_else(|| rmp_serde::to_vec_named(self).expect("body types always serialise"))
    }

    /// A `REQUEST` frame on `stream` carrying this body.
    pub fn to_frame(&self, stream: u32) -> Frame {
        Frame::with_payload(Kind::Request, stream, Bytes::from(self.encode()))
    }
}
