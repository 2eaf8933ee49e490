//! `osprey delay`: every replica's delay (`GET /delay`), or a probe connection reset
//! (`POST /delay/reset`).

use std::process::ExitCode;

use crate::admin::url_escape;
use crate::cli::{admin, Cli, DelayCmd};
use crate::render::delay::render_delay;

pub fn run(cli: &Cli, cmd: Option<&DelayCmd>) -> anyhow::Result<ExitCode> {
    let (method, path, body, json) = match cmd.unwrap_or(&DelayCmd::Status { json: false }) {
        DelayCmd::Status { json } => {
            let query = cli
                .cluster
                .as_deref()
                .map(|c| format!("?cluster={}", url_escape(c)))
                .unwrap_or_default();
            ("GET", format!("/delay{query}"), None, *json)
        }
        DelayCmd::Reset { member } => (
            "POST",
            "/delay/reset".to_string(),
            Some(serde_json::json!({ "cluster": cli.cluster, "member": member })),
            false,
        ),
    };
    let v = match admin(cli)?.call(method, &path, body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    match cmd {
        Some(DelayCmd::Reset { member }) => println!(
            "{}/{member}: probe connection reset (a new one next period)",
            v["cluster"].as_str().unwrap_or("?")
        ),
        _ => print!("{}", render_delay(&v)),
    }
    Ok(ExitCode::SUCCESS)
}
