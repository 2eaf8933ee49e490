//! `osprey digests`: the top and the blocked digests (`GET /digests`, `/digests/blocked`),
//! block and unblock (`POST`).

use std::process::ExitCode;

use crate::admin::url_escape;
use crate::cli::{admin, Cli, DigestsCmd};
use crate::render::digests::{render_block, render_blocked, render_top, render_unblock};

pub fn run(cli: &Cli, cmd: Option<&DigestsCmd>) -> anyhow::Result<ExitCode> {
    let top = DigestsCmd::Top { limit: 20, json: false };
    let cmd = cmd.unwrap_or(&top);
    let (method, path, body, json) = match cmd {
        DigestsCmd::Top { limit, json } => ("GET", format!("/digests?limit={limit}"), None, *json),
        DigestsCmd::Blocked { json } => ("GET", "/digests/blocked".into(), None, *json),
        DigestsCmd::Block { sql, ttl } => (
            "POST",
            "/digests/block".into(),
            Some(serde_json::json!({ "sql": sql, "ttl_s": ttl })),
            false,
        ),
        DigestsCmd::Unblock { id } => (
            "POST",
            format!("/digests/{}/unblock", url_escape(id)),
            Some(serde_json::json!({})),
            false,
        ),
    };
    let v = match admin(cli)?.call(method, &path, body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    let text = match cmd {
        DigestsCmd::Top { .. } => render_top(&v),
        DigestsCmd::Blocked { .. } => render_blocked(&v),
        DigestsCmd::Block { .. } => render_block(&v),
        DigestsCmd::Unblock { .. } => render_unblock(&v),
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
