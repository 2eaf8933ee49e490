//! What the admin API and the gauges see of a group: slot states, figures, and the
//! shared gauges each group adds its changes to.

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::pool::wait_queue::QueueFigures;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Process spawned (or about to be); not registered and ready yet.
    Starting,
    Idle,
    Busy,
    /// QUIT_NOW sent; waiting for the process to exit.
    Quitting,
}

impl SlotState {
    /// As in `/status` and the `osprey_slots{state}` label.
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Starting => "starting",
            SlotState::Idle => "idle",
            SlotState::Busy => "busy",
            SlotState::Quitting => "quitting",
        }
    }
}

/// Public view of one slot, for the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct SlotView {
    pub slot: u32,
    pub pid: Option<u32>,
    pub state: SlotState,
    pub requests: u64,
    pub age_s: f64,
    pub backend: String,
    pub cluster: String,
    pub db_connection_id: Option<u32>,
    pub retiring: bool,
    /// Requests written to the worker and not ended: the one it runs and those behind it
    /// (prefetch, `pool.pipeline_depth`).
    pub pipeline: usize,
}

/// Group-wide figures, for the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct PoolView {
    /// `write` (the primary's slots) or `read` (a replica's read slots).
    pub role: &'static str,
    pub cluster: String,
    /// The member the workers serve (`null` before the cluster names one).
    pub member: Option<String>,
    /// Why requests wait instead of being dispatched, if they do.
    pub hold: Option<String>,
    /// Why requests fail at once, if they do.
    pub unavailable: Option<String>,
    pub size: usize,
    pub slots: usize,
    pub idle: usize,
    pub busy: usize,
    pub starting: usize,
    pub quitting: usize,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    /// Bytes of REQUEST payload waiting, and their bound.
    pub queue_bytes: usize,
    pub queue_bytes_capacity: usize,
    /// Client connections with at least one request waiting.
    pub waiting_connections: usize,
    /// Of those, connections whose requests wait because they hold their cap of
    /// workers (`pool.max_per_connection` / `pool.max_per_token`).
    pub capped_connections: usize,
    /// Requests waiting in the longest connection queue.
    pub longest_connection_queue: usize,
    /// How long the request waiting longest has waited so far, in ms (0: none waits).
    pub longest_wait_ms: u64,
    /// Workers one connection may hold at once (0 = no cap).
    pub max_per_connection: usize,
    pub respawns: u64,
    pub recycles: u64,
    pub fatal_exits: u64,
}

impl SlotGroup {
    pub fn view(&self) -> (PoolView, Vec<SlotView>) {
        let g = self.lock();
        let count = |st: SlotState| g.slots.values().filter(|s| s.state == st).count();
        let q: QueueFigures = g.queue.figures();
        let limits = g.queue.limits();
        let pool = PoolView {
            cluster: self.cluster.clone(),
            role: if self.reads.is_some() { "read" } else { "write" },
            member: g.target.as_ref().map(|t| t.member.clone()),
            hold: g.hold.clone(),
            unavailable: g.unavailable.clone(),
            size: g.target_size,
            slots: g.slots.len(),
            idle: count(SlotState::Idle),
            busy: count(SlotState::Busy),
            starting: count(SlotState::Starting),
            quitting: count(SlotState::Quitting),
            queue_depth: q.jobs,
            queue_capacity: limits.capacity,
            queue_bytes: q.bytes,
            queue_bytes_capacity: limits.bytes,
            waiting_connections: q.waiting_connections,
            capped_connections: q.capped_connections,
            longest_connection_queue: q.longest_connection_queue,
            longest_wait_ms: q.longest_wait.as_millis() as u64,
            max_per_connection: q.max_per_connection,
            respawns: self.metrics.respawns.get(),
            recycles: self.metrics.recycles.get(),
            fatal_exits: self.metrics.fatal_exits.get(),
        };
        let slots = g
            .slots
            .iter()
            .map(|(i, s)| SlotView {
                slot: *i,
                pid: s.pid,
                state: s.state,
                requests: s.requests,
                age_s: s.started.elapsed().as_secs_f64(),
                backend: s.target.as_ref().map_or_else(String::new, |t| t.member.clone()),
                cluster: self.cluster.clone(),
                db_connection_id: s.db_connection_id,
                retiring: s.retiring,
                pipeline: usize::from(s.state == SlotState::Busy) + s.ahead.len(),
            })
            .collect();
        (pool, slots)
    }

    /// The gauges are shared by every group: each adds what changed in its own counts.
    pub(super) fn publish_states(&self, g: &Inner) {
        for (i, st) in [
            SlotState::Starting,
            SlotState::Idle,
            SlotState::Busy,
            SlotState::Quitting,
        ]
        .into_iter()
        .enumerate()
        {
            let n = g.slots.values().filter(|s| s.state == st).count() as i64;
            if st == SlotState::Busy {
                self.busy_tx
                    .send_if_modified(|b| std::mem::replace(b, n as usize) != n as usize);
            }
            // Under the pool's lock: the swap and the add cannot interleave with another.
            let delta = n - self.published[i].swap(n, Ordering::Relaxed);
            if delta != 0 {
                self.metrics.slot_state(st.name()).inc_by(delta);
            }
        }
    }

    pub(super) fn set_depth(&self, g: &Inner) {
        let n = g.queue.len() as i64;
        let delta = n - self.published_depth.swap(n, Ordering::Relaxed);
        if delta != 0 {
            self.metrics.queue_depth.inc_by(delta);
        }
    }
}
