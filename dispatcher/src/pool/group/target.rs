//! The member a group's workers serve: a new target (or settings) retires the
//! workers spawned for the old one; a lost session retires the member's idle ones;
//! passive health reports.

use std::sync::Arc;

use osprey_protocol::WorkerSettings;
use tokio::sync::watch;

use super::*;

impl SlotGroup {
    pub fn set_passive_sink(&self, sink: PassiveSink) {
        *self.passive.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// A worker of `index` (generation) could not open or lost its database session.
    pub fn report_passive(&self, index: u32, generation: u64, why: &'static str) {
        let member = {
            let g = self.lock();
            g.slots
                .get(&index)
                .filter(|s| s.generation == generation)
                .and_then(|s| s.target.as_ref().map(|t| t.member.clone()))
        };
        let sink = self.passive.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(member), Some(sink)) = (member, sink) {
            sink(&member, why);
        }
    }

    /// Wakes on every change of target, and when a hold ends (a slot task waiting for a
    /// target, or backing off).
    pub fn target_changes(&self) -> watch::Receiver<u64> {
        self.target_tx.subscribe()
    }

    /// Points the group at `member` with `settings`. A change of member or settings
    /// retires every worker of the old target: idle ones at once, busy ones right after
    /// their response, unregistered ones are killed; fresh ones connect to the new
    /// target. Clears a hold.
    pub fn set_target(self: &Arc<Self>, member: &str, settings: WorkerSettings) {
        let mut g = self.lock();
        let held = g.hold.take().is_some();
        g.unavailable = None;
        let same = g
            .target
            .as_ref()
            .is_some_and(|t| t.member == member && t.settings == settings);
        if !same {
            let epoch = g.target.as_ref().map_or(1, |t| t.epoch + 1);
            tracing::info!(cluster = %self.cluster, member, epoch, reads = self.reads.is_some(), "slots re-targeted");
            g.target = Some(Arc::new(Target {
                member: member.to_owned(),
                settings,
                epoch,
            }));
            let stale: Vec<u32> = g
                .slots
                .iter()
                .filter(|(_, s)| s.target.as_ref().is_none_or(|t| t.epoch != epoch))
                .map(|(i, _)| *i)
                .collect();
            for index in stale {
                self.retarget_slot(&mut g, index);
            }
            self.target_tx.send_replace(epoch);
        } else if held {
            // The member is back (no switch): slots backing off after failing to reach
            // it respawn now, not at the end of a back-off longer than queue_timeout_ms.
            self.target_tx.send_modify(|_| {});
        }
        self.pump(&mut g);
        self.publish_states(&g);
    }

    /// The worker of `index` lost its database session (it answered `DATABASE_FATAL`
    /// and exits). The other idle workers of the same target share its fate when the
    /// server died or the network to it broke: they are retired now (fresh ones replace
    /// them), so that the next requests wait for a working session instead of each
    /// meeting a dead one (each would end with an outcome-unknown error).
    pub fn session_lost(self: &Arc<Self>, index: u32, generation: u64) {
        let mut g = self.lock();
        let Some(epoch) = g
            .slots
            .get(&index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.target.as_ref().map(|t| t.epoch))
        else {
            return;
        };
        let idle: Vec<u32> = g
            .slots
            .iter()
            .filter(|(i, s)| {
                **i != index && s.state == SlotState::Idle && s.target.as_ref().is_some_and(|t| t.epoch == epoch)
            })
            .map(|(i, _)| *i)
            .collect();
        if !idle.is_empty() {
            tracing::info!(cluster = %self.cluster, slot = index, retired = idle.len(), "a session died: idle sessions to the same member retired");
        }
        for i in idle {
            self.retarget_slot(&mut g, i);
        }
        self.publish_states(&g);
    }

    /// The member the workers serve now died for us (failover): the requests in flight on
    /// its workers will never be answered (a dead or cut-off server), so those workers are
    /// killed and each request ends with `WORKER_LOST` (dispatched: outcome unknown) now,
    /// rather than at `request_timeout`.
    pub fn abandon_member(self: &Arc<Self>, member: &str) {
        let g = self.lock();
        let busy: Vec<(u32, u64)> = g
            .slots
            .iter()
            .filter(|(_, s)| {
                s.state == SlotState::Busy && s.link.is_some() && s.target.as_ref().is_some_and(|t| t.member == member)
            })
            .map(|(i, s)| (*i, s.generation))
            .collect();
        drop(g);
        for (index, generation) in busy {
            self.kill(
                index,
                generation,
                "its member failed over while a request was in flight",
            );
        }
    }

    /// The worker settings a registering worker of `index` gets: those of the target
    /// it was spawned for.
    /// The member slot `index` (in `generation`) was spawned for.
    pub fn member_for(&self, index: u32, generation: u64) -> Option<String> {
        let g = self.lock();
        g.slots
            .get(&index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.target.as_ref().map(|t| t.member.clone()))
    }

    pub fn settings_for(&self, index: u32, generation: u64) -> Option<WorkerSettings> {
        let g = self.lock();
        g.slots
            .get(&index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.target.as_ref().map(|t| t.settings.clone()))
    }

    pub(super) fn retarget_slot(self: &Arc<Self>, g: &mut Inner, index: u32) {
        let Some(slot) = g.slots.get_mut(&index) else { return };
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
            SlotState::Busy => slot.quit_pending = true,
            // Not registered: no request can be on its way to it. A slot waiting for a
            // target or backing off has no process (no pid) and wakes on the new epoch.
            SlotState::Starting => {
                if slot.pid.is_some() {
                    let _ = slot.kill.send("re-targeted before registration");
                }
            }
            SlotState::Quitting => {}
        }
    }

    /// The member the group's workers serve now (`None` before the cluster names one).
    pub fn target_member(&self) -> Option<String> {
        self.lock().target.as_ref().map(|t| t.member.clone())
    }
}
