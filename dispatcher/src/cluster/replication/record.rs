//! Timing a switch step by step, running a step on a member, and the ops hook.

use std::time::{Duration, Instant, SystemTime};

use mysql_async::Conn;

use super::{connect, fault_point, ReplError};
use crate::cluster::{ClusterConfig, SwitchEvent, SwitchStep};

/// The steps of one switch, timed from its start.
pub(super) struct Recorder {
    pub(super) t0: Instant,
    pub(super) started: SystemTime,
    pub(super) steps: Vec<SwitchStep>,
}

impl Recorder {
    pub(super) fn new() -> Recorder {
        Recorder {
            t0: Instant::now(),
            started: SystemTime::now(),
            steps: Vec::new(),
        }
    }

    pub(super) fn step(&mut self, step: &'static str, ok: bool, detail: Option<String>) {
        self.step_at(step, self.t0.elapsed(), ok, detail);
    }

    /// A step that ended at `at` (steps that ran side by side).
    pub(super) fn step_at(&mut self, step: &'static str, at: Duration, ok: bool, detail: Option<String>) {
        self.steps.push(SwitchStep {
            step,
            at_ms: at.as_secs_f64() * 1000.0,
            ok,
            detail,
        });
        if ok {
            fault_point(step);
        }
    }

    pub(super) fn finish(
        self,
        cluster: &str,
        kind: &'static str,
        old: Option<&str>,
        new: Option<&str>,
        ok: bool,
        detail: Option<String>,
    ) -> SwitchEvent {
        SwitchEvent {
            cluster: cluster.to_owned(),
            kind,
            old_primary: old.map(str::to_owned),
            new_primary: new.map(str::to_owned),
            started: self.started,
            duration_ms: self.t0.elapsed().as_secs_f64() * 1000.0,
            ok,
            steps: self.steps,
            detail,
        }
    }
}

/// Runs `f` on a fresh monitor connection to `member`, bounded by `timeout` overall.
pub(super) async fn on_member<T, F, Fut>(
    cluster: &ClusterConfig,
    member: &str,
    timeout: Duration,
    f: F,
) -> Result<T, ReplError>
where
    F: FnOnce(Conn) -> Fut,
    Fut: std::future::Future<Output = Result<T, ReplError>>,
{
    let m = cluster
        .member(member)
        .ok_or_else(|| ReplError::Unexpected(member.to_owned(), "not a member of the cluster".into()))?;
    let work = async {
        let conn = connect(cluster, m, timeout).await?;
        f(conn).await
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ReplError::Timeout {
            member: member.to_owned(),
            what: "the step".into(),
            after: timeout,
        }),
    }
}

pub(super) fn describe(results: &[(String, Result<(), ReplError>)]) -> String {
    results
        .iter()
        .map(|(m, r)| match r {
            Ok(()) => format!("{m}: ok"),
            Err(e) => format!("{m}: {e}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub(super) async fn run_hook(cmd: String, env: [(&'static str, String); 5], timeout: Duration) {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "on_switch could not start");
            return;
        }
    };
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(st)) if st.success() => tracing::info!("on_switch done"),
        Ok(Ok(st)) => tracing::warn!(status = %st, "on_switch failed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "on_switch: wait failed"),
        Err(_) => {
            let _ = child.kill().await;
            tracing::warn!(?timeout, "on_switch killed at its timeout");
        }
    }
}
