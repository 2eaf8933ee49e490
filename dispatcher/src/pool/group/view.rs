//! What the admin API and the gauges see of a group: slot states, figures, and the
//! shared gauges each group adds its changes to.

use std::sync::atomic::Ordering;

use crate::pool::wait_queue::QueueFigures;

use super::*;

pub use osprey_admin_api::{GroupRole, PoolView, SlotState, SlotView};

impl SlotGroup {
    pub fn view(&self) -> (PoolView, Vec<SlotView>) {
        let g = self.lock();
        let count = |st: SlotState| g.slots.values().filter(|s| s.state == st).count();
        let q: QueueFigures = g.queue.figures();
        let limits = g.queue.limits();
        let pinned = self.sessions.sessions();
        let transactions: Vec<_> = pinned.iter().filter_map(|s| s.transaction_age()).collect();
        let pool = PoolView {
            cluster: self.cluster.clone(),
            role: if self.reads.is_some() {
                GroupRole::Read
            } else {
                GroupRole::Write
            },
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
            sessions: pinned.len(),
            // The cap is the config's: `status_of` fills it in.
            max_sessions: 0,
            sessions_in_transaction: transactions.len(),
            longest_transaction_ms: transactions.iter().max().map_or(0, |d| d.as_millis() as u64),
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
    /// Called at every slot's change of state (twice per request when the pool is not
    /// saturated): one walk of the slots, and each gauge's handle looked up once.
    pub(super) fn publish_states(&self, g: &Inner) {
        let mut counts = [0i64; 4];
        for s in g.slots.values() {
            counts[state_index(s.state)] += 1;
        }
        let busy = counts[state_index(SlotState::Busy)] as usize;
        self.busy_tx.send_if_modified(|b| std::mem::replace(b, busy) != busy);
        for (i, n) in counts.into_iter().enumerate() {
            // Under the pool's lock: the swap and the add cannot interleave with another.
            let delta = n - self.published[i].swap(n, Ordering::Relaxed);
            if delta != 0 {
                self.state_gauges[i]
                    .get_or_init(|| self.metrics.slot_state(PUBLISHED_STATES[i].name()))
                    .inc_by(delta);
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

/// The slot states the `osprey_slots{state}` gauges count, in `published`'s order.
const PUBLISHED_STATES: [SlotState; 4] = [
    SlotState::Starting,
    SlotState::Idle,
    SlotState::Busy,
    SlotState::Quitting,
];

fn state_index(st: SlotState) -> usize {
    match st {
        SlotState::Starting => 0,
        SlotState::Idle => 1,
        SlotState::Busy => 2,
        SlotState::Quitting => 3,
    }
}
