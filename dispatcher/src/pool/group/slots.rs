//! A slot's life: spawn (generation), pid, registration, ready, quit, exit, kill,
//! and the group's size (resize, retire, shutdown). The supervisor and the worker
//! links report here; the slot task follows what [`Spawn`] says.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use osprey_protocol::ErrorCode;
use tokio::sync::{mpsc, watch};

use crate::request::job::{fail_later, Job};

use super::*;

impl SlotGroup {
    /// Asks the supervisor for `size` slots (a read group, as its member becomes a
    /// replica or stops being one).
    pub fn want_size(&self, size: usize) {
        self.wanted_size
            .send_if_modified(|s| std::mem::replace(s, size) != size);
    }

    pub fn wanted_size(&self) -> watch::Receiver<usize> {
        self.wanted_size.subscribe()
    }

    /// Requests running or waiting here (what "least outstanding" compares), or `None`
    /// while no worker is registered (none idle or busy): a group that cannot serve now,
    /// whatever its member's health says.
    pub fn outstanding(&self) -> Option<usize> {
        let g = self.lock();
        let busy = *self.busy_tx.borrow();
        if busy == 0 && g.idle.is_empty() {
            return None;
        }
        Some(g.queue.len() + busy + g.ahead)
    }

    /// Whether slot id `index` belongs to this group.
    pub fn owns(&self, index: u32) -> bool {
        index / GROUP_SLOTS == self.base / GROUP_SLOTS
    }

    /// Registers a new slot (the supervisor then spawns its process).
    pub fn add_slot(&self, index: u32, kill: mpsc::UnboundedSender<&'static str>) -> u64 {
        let mut g = self.lock();
        let generation = g.next_generation;
        g.next_generation += 1;
        let target = g.target.clone();
        g.slots.insert(
            index,
            Slot {
                generation,
                state: SlotState::Starting,
                pid: None,
                link: None,
                db_connection_id: None,
                requests: 0,
                started: Instant::now(),
                quit_pending: false,
                retiring: false,
                holder: None,
                ahead: VecDeque::new(),
                kill,
                target,
            },
        );
        self.publish_states(&g);
        generation
    }

    /// A new process is being started in `index`: its generation, or why not.
    pub fn begin_spawn(&self, index: u32) -> Spawn {
        let mut g = self.lock();
        self.release_slot(&mut g, index);
        if g.shutting_down || g.slots.get(&index).is_some_and(|s| s.retiring) {
            g.slots.remove(&index);
            self.publish_states(&g);
            return Spawn::Gone;
        }
        let Some(target) = g.target.clone() else {
            return Spawn::NoTarget;
        };
        let generation = g.next_generation;
        g.next_generation += 1;
        let Some(slot) = g.slots.get_mut(&index) else {
            return Spawn::Gone;
        };
        slot.generation = generation;
        slot.state = SlotState::Starting;
        slot.pid = None;
        slot.link = None;
        slot.db_connection_id = None;
        slot.requests = 0;
        slot.quit_pending = false;
        slot.started = Instant::now();
        slot.target = Some(target);
        self.publish_states(&g);
        Spawn::Go(generation)
    }

    pub fn set_pid(&self, index: u32, generation: u64, pid: u32) {
        let mut g = self.lock();
        let current = g.target.as_ref().map(|t| t.epoch);
        if let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) {
            slot.pid = Some(pid);
            // Re-targeted while the process was being forked: `retarget_slot` saw no pid
            // and sent no kill. The slot task drained its kill channel before
            // `begin_spawn`, so this one reaches this process.
            if slot.target.as_ref().map(|t| t.epoch) != current {
                let _ = slot.kill.send("re-targeted before registration");
            }
        }
    }

    /// The pid the supervisor spawned for a slot that is waiting to register.
    pub fn expected_registration(&self, index: u32) -> Option<(u64, u32)> {
        let g = self.lock();
        let slot = g.slots.get(&index)?;
        (slot.state == SlotState::Starting && slot.link.is_none()).then_some((slot.generation, slot.pid?))
    }

    /// The worker of `index` registered and opened its database session.
    pub fn worker_ready(
        self: &Arc<Self>,
        index: u32,
        generation: u64,
        link: WorkerLink,
        db_connection_id: u32,
    ) -> bool {
        let mut g = self.lock();
        let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) else {
            return false;
        };
        slot.link = Some(link);
        slot.db_connection_id = Some(db_connection_id);
        slot.started = Instant::now();
        self.make_available(&mut g, index);
        true
    }

    pub fn is_ready(&self, index: u32, generation: u64) -> bool {
        let g = self.lock();
        g.slots
            .get(&index)
            .is_some_and(|s| s.generation == generation && s.link.is_some())
    }

    /// The worker asked to retire (`QUIT_REQUEST`).
    pub fn quit_requested(self: &Arc<Self>, index: u32, generation: u64) {
        let mut g = self.lock();
        let Some(slot) = g.slots.get_mut(&index).filter(|s| s.generation == generation) else {
            return;
        };
        self.metrics.recycles.inc();
        match slot.state {
            SlotState::Idle => {
                slot.state = SlotState::Quitting;
                if let Some(link) = &slot.link {
                    link.quit.cancel();
                }
                g.idle.retain(|&(i, _)| i != index);
                self.arm_quit_deadline(index, generation);
            }
            SlotState::Busy => slot.quit_pending = true,
            SlotState::Starting | SlotState::Quitting => {}
        }
        self.publish_states(&g);
    }

    /// The link to the worker of `index` ended; its process is told to die.
    pub fn link_lost(self: &Arc<Self>, index: u32, generation: u64, why: &'static str, closed_by_worker: bool) {
        let mut g = self.lock();
        // No link: already handled (killed by `kill`, or never registered).
        let Some(slot) = g.linked(index, generation) else {
            return;
        };
        slot.link = None;
        if slot.state != SlotState::Quitting {
            slot.state = SlotState::Starting;
            if closed_by_worker {
                // A worker closes its link as it exits (fatal error, lost session): let
                // it finish, so its exit status (e.g. 2 = fatal database error) is kept.
                self.arm_exit_deadline(index, generation, why);
            } else {
                self.metrics.worker_kills.inc();
                let _ = slot.kill.send(why);
            }
        }
        g.idle.retain(|&(i, _)| i != index);
        self.release_slot(&mut g, index);
        self.publish_states(&g);
    }

    /// Kills the process of `index` if it has not exited by itself within [`EXIT_GRACE`].
    pub(super) fn arm_exit_deadline(self: &Arc<Self>, index: u32, generation: u64, why: &'static str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(EXIT_GRACE).await;
            let Some(pool) = pool.upgrade() else { return };
            let g = pool.lock();
            if let Some(slot) = g
                .slots
                .get(&index)
                .filter(|s| s.generation == generation && s.pid.is_some())
            {
                pool.metrics.worker_kills.inc();
                let _ = slot.kill.send(why);
            }
        });
    }

    /// A worker told to quit must be gone within [`QUIT_DEADLINE`] (it may have
    /// hung, or missed its QUIT_NOW); otherwise it is killed and the slot refilled.
    pub(super) fn arm_quit_deadline(self: &Arc<Self>, index: u32, generation: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(QUIT_DEADLINE).await;
            let Some(pool) = pool.upgrade() else { return };
            let g = pool.lock();
            if let Some(slot) = g
                .slots
                .get(&index)
                .filter(|s| s.generation == generation && s.state == SlotState::Quitting)
            {
                pool.metrics.worker_kills.inc();
                let _ = slot.kill.send("did not exit after QUIT_NOW");
            }
        });
    }

    /// Kills the process of `index` (request timeout, abandoned request).
    pub fn kill(&self, index: u32, generation: u64, why: &'static str) {
        let mut g = self.lock();
        if let Some(slot) = g.linked(index, generation) {
            self.metrics.worker_kills.inc();
            slot.link = None;
            slot.state = SlotState::Starting;
            let _ = slot.kill.send(why);
            g.idle.retain(|&(i, _)| i != index);
            self.release_slot(&mut g, index);
            self.publish_states(&g);
        }
    }

    /// The process of `index` exited. Returns false when the slot must not be refilled.
    pub fn process_exited(&self, index: u32, generation: u64) -> bool {
        let mut g = self.lock();
        let shutting_down = g.shutting_down;
        let Some(slot) = g.slots.get_mut(&index) else {
            return false;
        };
        let current = slot.generation == generation;
        if current {
            slot.link = None;
            slot.pid = None;
            slot.state = SlotState::Starting;
        }
        let keep = !slot.retiring && !shutting_down;
        g.idle.retain(|&(i, _)| i != index);
        if current {
            self.release_slot(&mut g, index);
        }
        if !keep {
            g.slots.remove(&index);
        }
        self.publish_states(&g);
        keep
    }

    pub fn target_size(&self) -> usize {
        self.lock().target_size
    }

    /// Changes the number of slots. Returns the indices of slots to create; slots
    /// over the target retire through the quit handshake (idle ones first).
    pub fn resize(self: &Arc<Self>, size: usize) -> Vec<u32> {
        let mut g = self.lock();
        g.target_size = size;
        // The default per-connection cap follows the pool's size.
        let limits = g.queue.limits();
        g.queue.set_limits(limits, size);
        let active: Vec<u32> = g.slots.iter().filter(|(_, s)| !s.retiring).map(|(i, _)| *i).collect();
        let mut created = Vec::new();
        if active.len() < size {
            let mut index = self.base;
            while active.len() + created.len() < size {
                if !g.slots.contains_key(&index) {
                    created.push(index);
                }
                index += 1;
            }
        } else if active.len() > size {
            let mut excess = active.len() - size;
            // Idle first, then starting, then busy; highest index first within each.
            for wanted in [
                SlotState::Idle,
                SlotState::Starting,
                SlotState::Busy,
                SlotState::Quitting,
            ] {
                let candidates: Vec<u32> = active
                    .iter()
                    .rev()
                    .copied()
                    .filter(|i| g.slots.get(i).is_some_and(|s| s.state == wanted))
                    .collect();
                for index in candidates {
                    if excess == 0 {
                        break;
                    }
                    excess -= 1;
                    self.retire(&mut g, index);
                }
            }
        }
        // A larger default cap may let capped connections have a worker that is idle.
        self.pump(&mut g);
        self.publish_states(&g);
        created
    }

    pub(super) fn retire(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let Some(slot) = g.slots.get_mut(&index) else { return };
        slot.retiring = true;
        match slot.state {
            SlotState::Idle => {
                slot.state = SlotState::Quitting;
                if let Some(link) = &slot.link {
                    link.quit.cancel();
                }
                let generation = slot.generation;
                g.idle.retain(|&(i, _)| i != index);
                self.arm_quit_deadline(index, generation);
            }
            // No request can be on its way to a worker that has not registered.
            SlotState::Starting => {
                let _ = slot.kill.send("slot retired before registration");
            }
            SlotState::Busy | SlotState::Quitting => {}
        }
    }

    /// Stops handing out workers: waiting jobs fail, idle workers quit, busy ones
    /// quit after their response.
    pub fn shutdown(self: &Arc<Self>) {
        let mut g = self.lock();
        g.shutting_down = true;
        let waiting: Vec<Job> = g.queue.drain();
        self.set_depth(&g);
        fail_later(
            waiting,
            self.metrics.clone(),
            "shutting_down",
            ErrorCode::ShuttingDown,
            "the dispatcher is shutting down",
        );
        let indices: Vec<u32> = g.slots.keys().copied().collect();
        for index in indices {
            self.retire(&mut g, index);
        }
        self.publish_states(&g);
    }

    pub fn slot_count(&self) -> usize {
        self.lock().slots.len()
    }
}
