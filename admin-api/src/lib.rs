//! The admin API's JSON types, in one place for both sides: the dispatcher's admin module
//! serializes them (`dispatcher/src/admin/http.rs`, `dispatcher/src/pool/group/view.rs`
//! re-export them) and the `osprey` CLI deserializes them, so the two cannot drift apart.
//!
//! `GET /status` is [`Status`]. The other routes (`/cluster`, `/cluster/events`, `/delay`,
//! `/digests`, `/throttle`) still answer with the dispatcher's own types, and the CLI reads
//! them as `serde_json::Value`.

pub mod slots;
pub mod status;

pub use slots::{GroupRole, PoolView, SessionClient, SessionView, SlotState, SlotView};
pub use status::{Clients, ClusterStatus, ClusterSummary, Fds, Status, Streams};

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET /status` of a real dispatcher (the embedded default after a switchover to
    /// replica-1, replica-2 in maintenance, the write slots resized to 6), captured before
    /// these types were shared: it reads into them and writes back the same JSON, every
    /// field, null and enum spelling.
    #[test]
    fn a_real_status_reads_back_unchanged() {
        let sample: serde_json::Value = serde_json::from_str(include_str!("../testdata/status.json")).unwrap();
        let status: Status = serde_json::from_value(sample.clone()).unwrap();
        assert_eq!(status.groups[2].role, GroupRole::Read);
        assert_eq!(
            status.groups[3].hold.as_deref(),
            Some("replica-2 serves no reads: in maintenance")
        );
        assert_eq!(status.clusters[0].status, ClusterStatus::Ok);
        assert_eq!(serde_json::to_value(&status).unwrap(), sample);
    }

    #[test]
    fn cluster_status_is_tagged_with_its_detail() {
        for (status, json) in [
            (ClusterStatus::Starting, r#"{"status":"starting"}"#),
            (ClusterStatus::Ok, r#"{"status":"ok"}"#),
            (
                ClusterStatus::Switching("switchover to r1".into()),
                r#"{"status":"switching","detail":"switchover to r1"}"#,
            ),
            (
                ClusterStatus::Unreachable("replicas still receive".into()),
                r#"{"status":"unreachable","detail":"replicas still receive"}"#,
            ),
            (
                ClusterStatus::NoPrimary("cooldown".into()),
                r#"{"status":"no_primary","detail":"cooldown"}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&status).unwrap(), json);
            assert_eq!(serde_json::from_str::<ClusterStatus>(json).unwrap(), status);
        }
    }

    /// The metrics label a state or a role by `name()`: the same word as the JSON.
    #[test]
    fn names_are_the_json_spellings() {
        for state in [
            SlotState::Starting,
            SlotState::Idle,
            SlotState::Busy,
            SlotState::Quitting,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.name());
        }
        for role in [GroupRole::Write, GroupRole::Read] {
            assert_eq!(serde_json::to_value(role).unwrap(), role.name());
        }
    }
}
