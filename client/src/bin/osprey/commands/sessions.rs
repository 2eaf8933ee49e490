//! `osprey sessions`: the sessions holding a worker (`GET /sessions`), or end one
//! (`POST /sessions/kill`).

use std::process::ExitCode;

use osprey_admin_api::SessionView;

use crate::cli::{admin, Cli, SessionsCmd};
use crate::render::sessions::render_sessions;

pub fn run(cli: &Cli, cmd: Option<&SessionsCmd>) -> anyhow::Result<ExitCode> {
    match cmd.unwrap_or(&SessionsCmd::List { json: false }) {
        SessionsCmd::List { json } => {
            let v = match admin(cli)?.call("GET", "/sessions", None, *json)? {
                Ok(v) => v,
                Err(code) => return Ok(code),
            };
            let sessions: Vec<SessionView> =
                serde_json::from_value(v).map_err(|e| anyhow::anyhow!("unexpected /sessions body: {e}"))?;
            print!("{}", render_sessions(&sessions));
        }
        SessionsCmd::Kill { conn, session } => {
            let body = serde_json::json!({ "conn": conn, "session": session });
            if let Err(code) = admin(cli)?.call("POST", "/sessions/kill", Some(body), false)? {
                return Ok(code);
            }
            println!("session {session} of connection {conn} ended (its client gets SESSION_ABORTED)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
