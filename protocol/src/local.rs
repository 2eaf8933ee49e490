//! Files shared with a dispatcher on the same machine: the runtime directory and
//! the credentials file the dispatcher writes when it generates tokens.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Name of the credentials file inside the runtime directory.
pub const CREDENTIALS_FILE: &str = "credentials";

/// `$OSPREY_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/osprey`, else `/tmp/osprey-<uid>`.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OSPREY_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("osprey");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/osprey-{uid}"))
}

/// Tokens for the client port and the admin API.
///
/// File format (`<dir>/credentials`, mode 0600): one `key=value` per line,
/// keys `client_token`, `admin_token` and (when the dispatcher generated a MySQL user)
/// `mysql`, a ready-to-paste `mariadb` command line; blank lines and lines starting with `#`
/// are ignored, unknown keys too. A missing key loads as an empty string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub client_token: String,
    pub admin_token: String,
    /// `mariadb -h… -P… -u… -p…` for the MySQL port's generated user, or empty.
    pub mysql: String,
}

impl Credentials {
    /// Path of the credentials file in `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(CREDENTIALS_FILE)
    }

    /// Reads `<dir>/credentials`.
    pub fn load(dir: &Path) -> io::Result<Credentials> {
        let path = Credentials::path(dir);
        let text =
            fs::read_to_string(&path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Credentials::parse(&text))
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Credentials {
        let mut c = Credentials::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                match k.trim() {
                    "client_token" => c.client_token = v.trim().to_owned(),
                    "admin_token" => c.admin_token = v.trim().to_owned(),
                    "mysql" => c.mysql = v.trim().to_owned(),
                    _ => {}
                }
            }
        }
        c
    }

    /// Writes `<dir>/credentials` with mode 0600 (creating `dir` with mode 0700 if
    /// needed). The file is written to a temporary name and renamed into place, so
    /// readers never see a half-written file.
    pub fn store(&self, dir: &Path) -> io::Result<()> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let path = Credentials::path(dir);
        let tmp = dir.join(format!(".{CREDENTIALS_FILE}.{}.tmp", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        write!(
            f,
            "client_token={}\nadmin_token={}\n",
            self.client_token, self.admin_token
        )?;
        if !self.mysql.is_empty() {
            writeln!(f, "mysql={}", self.mysql)?;
        }
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &path)
    }
}
