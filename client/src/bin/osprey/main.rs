//! `osprey`: run SQL through a dispatcher and drive its admin API.
//!
//! `cli.rs` reads the command line; `commands/` does each subcommand; `admin.rs` speaks to
//! the admin API; `render/` shows its answers.

mod admin;
mod cli;
mod commands;
mod render;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Cmd, PoolCmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.cmd {
        Cmd::Sql {
            sql,
            json,
            params,
            timeout,
            primary,
        } => commands::sql::run(&cli, sql, *json, params, *timeout, *primary),
        Cmd::Shell { read_only } => commands::shell::run(&cli, *read_only),
        Cmd::MysqlPassword { user } => commands::mysql_password::run(user),
        Cmd::Status { json } => commands::status::run(&cli, *json),
        Cmd::Pool {
            cmd: PoolCmd::Resize { size },
        } => commands::pool::resize(&cli, *size),
        Cmd::Cluster { cmd } => commands::cluster::run(&cli, cmd.as_ref()),
        Cmd::Digests { cmd } => commands::digests::run(&cli, cmd.as_ref()),
        Cmd::Throttle { cmd } => commands::throttle::run(&cli, cmd.as_ref()),
        Cmd::Delay { cmd } => commands::delay::run(&cli, cmd.as_ref()),
        Cmd::Sessions { cmd } => commands::sessions::run(&cli, cmd.as_ref()),
    }
}
