//! The switch log: the last switches of every cluster, newest last, for
//! `GET /cluster/events`. Bounded in count; each event is small (a handful of steps).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::cluster::view::SwitchEvent;

/// Events kept; older ones are dropped (they are in the dispatcher's log too).
pub const EVENTS_KEPT: usize = 200;

#[derive(Debug, Default)]
pub struct EventLog {
    events: Mutex<VecDeque<SwitchEvent>>,
}

impl EventLog {
    pub fn push(&self, event: SwitchEvent) {
        tracing::info!(
            cluster = %event.cluster,
            kind = event.kind,
            old = ?event.old_primary,
            new = ?event.new_primary,
            ok = event.ok,
            duration_ms = event.duration_ms,
            steps = ?event.steps.iter().map(|s| (s.step, s.at_ms, s.ok)).collect::<Vec<_>>(),
            "cluster switch"
        );
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == EVENTS_KEPT {
            q.pop_front();
        }
        q.push_back(event);
    }

    /// Events of `cluster` (all clusters when `None`), oldest first.
    pub fn list(&self, cluster: Option<&str>) -> Vec<SwitchEvent> {
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.iter()
            .filter(|e| cluster.is_none_or(|c| e.cluster == c))
            .cloned()
            .collect()
    }
}
