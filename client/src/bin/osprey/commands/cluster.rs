//! `osprey cluster`: status and switch events (`GET /cluster`, `/cluster/events`),
//! switchover and maintenance (`POST`, answered with raw JSON).

use std::process::ExitCode;

use crate::admin::url_escape;
use crate::cli::{admin, Cli, ClusterCmd};
use crate::render::clusters::render_clusters;
use crate::render::events::render_events;

pub fn run(cli: &Cli, cmd: Option<&ClusterCmd>) -> anyhow::Result<ExitCode> {
    let query = cli
        .cluster
        .as_deref()
        .map(|c| format!("?cluster={}", url_escape(c)))
        .unwrap_or_default();
    let (method, path, body, json) = match cmd.unwrap_or(&ClusterCmd::Status { json: false }) {
        ClusterCmd::Status { json } => ("GET", format!("/cluster{query}"), None, *json),
        ClusterCmd::Events { json } => ("GET", format!("/cluster/events{query}"), None, *json),
        ClusterCmd::Switchover { to } => (
            "POST",
            "/cluster/switchover".into(),
            Some(serde_json::json!({ "cluster": cli.cluster, "to": to })),
            true,
        ),
        ClusterCmd::Maintenance { member, state } => (
            "POST",
            "/cluster/maintenance".into(),
            Some(serde_json::json!({ "cluster": cli.cluster, "member": member, "on": state == "on" })),
            true,
        ),
    };
    let v = match admin(cli)?.call(method, &path, body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    match cmd {
        Some(ClusterCmd::Events { .. }) => print!("{}", render_events(&v)),
        _ => print!("{}", render_clusters(&v)),
    }
    Ok(ExitCode::SUCCESS)
}
