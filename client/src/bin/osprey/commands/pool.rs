//! `osprey pool resize N`: `POST /pool/size`.

use std::process::ExitCode;

use crate::cli::{admin, Cli};

pub fn resize(cli: &Cli, size: u32) -> anyhow::Result<ExitCode> {
    let req = serde_json::json!({ "size": size });
    let body = match admin(cli)?.send("POST", "/pool/size", Some(req))? {
        Ok(body) => body,
        Err(code) => return Ok(code),
    };
    let new_size = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("size").and_then(|s| s.as_u64()));
    match new_size {
        Some(n) => println!("pool size: {n}"),
        None => println!("pool size: {size} ({})", body.trim()),
    }
    Ok(ExitCode::SUCCESS)
}
