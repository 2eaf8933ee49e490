//! `osprey throttle`: every throttled member (`GET /throttle`), or a member's live rate
//! (`POST /throttle`).

use std::process::ExitCode;

use crate::cli::{admin, Cli, ThrottleCmd};
use crate::render::throttle::{render_set, render_throttle};

pub fn run(cli: &Cli, cmd: Option<&ThrottleCmd>) -> anyhow::Result<ExitCode> {
    let (method, body, json) = match cmd.unwrap_or(&ThrottleCmd::Status { json: false }) {
        ThrottleCmd::Status { json } => ("GET", None, *json),
        ThrottleCmd::Set { member, qps, burst } => (
            "POST",
            Some(serde_json::json!({ "cluster": cli.cluster, "member": member, "max_qps": qps, "burst": burst })),
            false,
        ),
    };
    let v = match admin(cli)?.call(method, "/throttle", body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    match cmd {
        Some(ThrottleCmd::Set { .. }) => print!("{}", render_set(&v)),
        _ => print!("{}", render_throttle(&v)),
    }
    Ok(ExitCode::SUCCESS)
}
