//! `osprey status`: `GET /status`, raw or rendered.

use std::process::ExitCode;

use anyhow::Context;
use osprey_admin_api::Status;

use crate::cli::{admin, Cli};
use crate::render::status::render_status;

pub fn run(cli: &Cli, json: bool) -> anyhow::Result<ExitCode> {
    let body = match admin(cli)?.send("GET", "/status", None)? {
        Ok(body) => body,
        Err(code) => return Ok(code),
    };
    if json {
        println!("{}", body.trim());
    } else {
        let st: Status = serde_json::from_str(&body).context("unexpected /status body")?;
        print!("{}", render_status(&st));
    }
    Ok(ExitCode::SUCCESS)
}
