//! Finding the installed MariaDB binaries.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::SandboxError;

/// Directories searched after `PATH`: `mariadbd` lives in an `sbin` directory that a
/// non-login shell often lacks.
const EXTRA_DIRS: &[&str] = &["/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"];

/// The server and the data directory initialiser.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub(crate) mariadbd: PathBuf,
    pub(crate) install_db: PathBuf,
}

/// Looks the binaries up in `PATH` and the usual system directories.
pub(crate) fn locate() -> Result<Binaries, SandboxError> {
    let dirs = search_dirs(std::env::var_os("PATH").as_deref());
    locate_in(&dirs)
}

pub(crate) fn locate_in(dirs: &[PathBuf]) -> Result<Binaries, SandboxError> {
    let mariadbd = find_any(&["mariadbd"], dirs)?;
    let install_db = find_any(&["mariadb-install-db", "mysql_install_db"], dirs)?;
    Ok(Binaries { mariadbd, install_db })
}

fn find_any(names: &[&str], dirs: &[PathBuf]) -> Result<PathBuf, SandboxError> {
    names
        .iter()
        .find_map(|name| find_in(name, dirs))
        .ok_or_else(|| SandboxError::NotInstalled {
            binary: names[0].to_owned(),
            searched: dirs.to_vec(),
        })
}

fn search_dirs(path: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = path.map(|p| std::env::split_paths(p).collect()).unwrap_or_default();
    for extra in EXTRA_DIRS {
        let extra = PathBuf::from(extra);
        if !dirs.contains(&extra) {
            dirs.push(extra);
        }
    }
    dirs
}

fn find_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_server_names_the_install_command() {
        let empty = tempfile::tempdir().unwrap();
        let err = locate_in(&[empty.path().to_path_buf()]).unwrap_err();
        assert!(matches!(err, SandboxError::NotInstalled { ref binary, .. } if binary == "mariadbd"));
        let msg = err.to_string();
        assert!(msg.contains("apt-get install -y mariadb-server"), "{msg}");
        assert!(msg.contains(&empty.path().display().to_string()), "{msg}");
    }

    #[test]
    fn search_adds_sbin_dirs_once() {
        let dirs = search_dirs(Some(std::ffi::OsStr::new("/usr/bin:/bin")));
        assert_eq!(dirs.iter().filter(|d| d.as_os_str() == "/usr/bin").count(), 1);
        assert!(dirs.contains(&PathBuf::from("/usr/sbin")));
        assert!(dirs.contains(&PathBuf::from("/usr/local/sbin")));
    }

    #[test]
    fn finds_an_executable_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mariadbd");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        assert!(find_in("mariadbd", &[dir.path().to_path_buf()]).is_none());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_in("mariadbd", &[dir.path().to_path_buf()]), Some(file));
    }
}
