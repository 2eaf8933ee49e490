//! `osprey mysql-password`: the hashes of a MySQL login for the dispatcher's config, so
//! that no password is ever written into it.

use std::io::{BufRead, IsTerminal};
use std::process::ExitCode;

use osprey_client::mysql_auth;

pub fn run(user: &str) -> anyhow::Result<ExitCode> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("password for {user} (echoed; pipe it in to keep it off the screen): ");
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line)?;
    let password = line.strip_suffix('\n').unwrap_or(&line);
    let password = password.strip_suffix('\r').unwrap_or(password);
    if password.is_empty() {
        anyhow::bail!("an empty password: give one on stdin");
    }
    println!("[[mysql.users]]");
    println!("name = {user:?}");
    println!("native_hash = {:?}", mysql_auth::native_hash(password));
    println!("sha2_hash = {:?}", mysql_auth::sha2_hash(password));
    Ok(ExitCode::SUCCESS)
}
