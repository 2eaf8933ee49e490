//! The initialised template data directory, and copying it for each instance.
//!
//! `mariadb-install-db` runs once per machine (per user, server binary and template version):
//! its result, with the sandbox accounts and the `osprey` database already created, is kept in
//! `$TMPDIR/osprey-sandbox-template-<key>` and reused by every later sandbox, in this process
//! and in others. The directory is built beside its final place and renamed into it, so a
//! reader never sees a half-built template and concurrent builders do not clash. Within a
//! process the result is remembered in a `OnceCell`.
//!
//! Because every instance starts from the same data, the accounts exist on the primary and on
//! the replicas without being replicated, and all binary logs start empty.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::UNIX_EPOCH;

use tokio::sync::OnceCell;

use crate::binaries::Binaries;
use crate::{SandboxError, ADMIN_PASSWORD, ADMIN_USER, APP_DATABASE, APP_PASSWORD, APP_USER, REPL_PASSWORD, REPL_USER};

/// Bump when the template's contents change.
const TEMPLATE_VERSION: u32 = 2;
/// Marks a complete template (written last, before the rename).
const MARKER: &str = "osprey-sandbox-template.ok";
/// InnoDB redo log size; the server is started with the same value (the default, 96M, makes
/// each copy slower).
pub(crate) const INNODB_LOG_FILE_SIZE: &str = "8M";

fn template_sql() -> String {
    // `FLUSH PRIVILEGES` loads the grant tables, which bootstrap mode skips; without it
    // `CREATE USER` fails with 1290 (--skip-grant-tables).
    //
    // ALL PRIVILEGES includes READ_ONLY ADMIN, which lets an account write on a server with
    // `read_only=ON`: the app account loses it, so that fencing a primary (read_only=ON) really
    // stops the application's writes, as it would in production. The admin account keeps
    // everything (the failover, the monitor and the tests' replication statements use it).
    format!(
        "FLUSH PRIVILEGES;\n\
         CREATE DATABASE IF NOT EXISTS `{APP_DATABASE}`;\n\
         CREATE USER '{APP_USER}'@'127.0.0.1' IDENTIFIED BY '{APP_PASSWORD}';\n\
         GRANT ALL PRIVILEGES ON *.* TO '{APP_USER}'@'127.0.0.1' WITH GRANT OPTION;\n\
         REVOKE READ_ONLY ADMIN ON *.* FROM '{APP_USER}'@'127.0.0.1';\n\
         CREATE USER '{APP_USER}'@'localhost' IDENTIFIED BY '{APP_PASSWORD}';\n\
         GRANT ALL PRIVILEGES ON *.* TO '{APP_USER}'@'localhost' WITH GRANT OPTION;\n\
         REVOKE READ_ONLY ADMIN ON *.* FROM '{APP_USER}'@'localhost';\n\
         CREATE USER '{ADMIN_USER}'@'127.0.0.1' IDENTIFIED BY '{ADMIN_PASSWORD}';\n\
         GRANT ALL PRIVILEGES ON *.* TO '{ADMIN_USER}'@'127.0.0.1' WITH GRANT OPTION;\n\
         CREATE USER '{ADMIN_USER}'@'localhost' IDENTIFIED BY '{ADMIN_PASSWORD}';\n\
         GRANT ALL PRIVILEGES ON *.* TO '{ADMIN_USER}'@'localhost' WITH GRANT OPTION;\n\
         CREATE USER '{REPL_USER}'@'127.0.0.1' IDENTIFIED BY '{REPL_PASSWORD}';\n\
         GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'127.0.0.1';\n"
    )
}

/// The path of the ready template directory, building it on first use.
pub(crate) async fn template(bins: &Binaries) -> Result<PathBuf, SandboxError> {
    static TEMPLATE: OnceCell<PathBuf> = OnceCell::const_new();
    TEMPLATE
        .get_or_try_init(|| async {
            let bins = bins.clone();
            tokio::task::spawn_blocking(move || ensure_template(&bins))
                .await
                .map_err(|e| SandboxError::io("building the template datadir", std::io::Error::other(e)))?
        })
        .await
        .cloned()
}

fn ensure_template(bins: &Binaries) -> Result<PathBuf, SandboxError> {
    let tmp = std::env::temp_dir();
    let dir = tmp.join(format!("osprey-sandbox-template-{:016x}", cache_key(bins)));
    if is_usable(&dir) {
        tracing::debug!(dir = %dir.display(), "reusing MariaDB template datadir");
        return Ok(dir);
    }
    let started = std::time::Instant::now();
    let build = tempfile::Builder::new()
        .prefix("osprey-sandbox-template-build-")
        .tempdir_in(&tmp)
        .map_err(|e| SandboxError::io(format!("creating a build dir in {}", tmp.display()), e))?;
    let data = build.path().join("data");
    let sql = build.path().join("init.sql");
    std::fs::write(&sql, template_sql()).map_err(|e| SandboxError::io("writing the template SQL", e))?;

    let mut cmd = Command::new(&bins.install_db);
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg("--skip-name-resolve")
        .arg(format!("--extra-file={}", sql.display()))
        .arg(format!("--innodb-log-file-size={INNODB_LOG_FILE_SIZE}"));
    if let Some(dir) = bins.mariadbd.parent().and_then(Path::parent) {
        // Lets the script find `mariadbd` under `<basedir>/sbin` even when `PATH` lacks it.
        cmd.arg(format!("--basedir={}", dir.display()));
    }
    if nix::unistd::geteuid().is_root() {
        cmd.arg("--user=root");
    }
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| SandboxError::io(format!("running {}", bins.install_db.display()), e))?;
    if !output.status.success() {
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        return Err(SandboxError::InstallDb {
            status: output.status.to_string(),
            output_tail: tail_lines(&text, 30),
        });
    }
    std::fs::write(data.join(MARKER), b"").map_err(|e| SandboxError::io("marking the template complete", e))?;
    match std::fs::rename(&data, &dir) {
        Ok(()) => {}
        // Another process finished first: use its template.
        Err(_) if is_usable(&dir) => {}
        Err(e) => return Err(SandboxError::io(format!("moving the template to {}", dir.display()), e)),
    }
    tracing::info!(dir = %dir.display(), elapsed = ?started.elapsed(), "built MariaDB template datadir");
    Ok(dir)
}

fn is_usable(dir: &Path) -> bool {
    let owned_by_us = std::fs::metadata(dir)
        .map(|m| m.uid() == nix::unistd::geteuid().as_raw())
        .unwrap_or(false);
    owned_by_us && dir.join(MARKER).is_file()
}

/// FNV-1a over everything that decides the template's contents (stable across toolchains,
/// unlike `DefaultHasher`).
fn cache_key(bins: &Binaries) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    feed(&TEMPLATE_VERSION.to_le_bytes());
    feed(template_sql().as_bytes());
    feed(INNODB_LOG_FILE_SIZE.as_bytes());
    feed(&nix::unistd::geteuid().as_raw().to_le_bytes());
    for bin in [&bins.mariadbd, &bins.install_db] {
        feed(bin.as_os_str().as_encoded_bytes());
        if let Ok(m) = std::fs::metadata(bin) {
            feed(&m.len().to_le_bytes());
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .unwrap_or_default();
            feed(&mtime.as_nanos().to_le_bytes());
        }
    }
    h
}

/// Copies the template into `dest` (which must not exist yet).
pub(crate) fn copy_template(template: &Path, dest: &Path) -> Result<(), SandboxError> {
    copy_dir(template, dest).map_err(|e| {
        SandboxError::io(
            format!("copying the template {} to {}", template.display(), dest.display()),
            e,
        )
    })
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == MARKER {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The last `n` lines of `text`.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
