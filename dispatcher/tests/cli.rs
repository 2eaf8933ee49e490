//! The binary's command line. (Being an integration test of this package also
//! makes `cargo test --workspace` build the `osprey-dispatcher` binary that the
//! cross-process tests in `tests/` run.)

use std::process::Command;

fn dispatcher() -> Command {
    Command::new(env!("CARGO_BIN_EXE_osprey-dispatcher"))
}

#[test]
fn check_config_accepts_a_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    std::fs::write(
        &path,
        "[pool]\nsize = 2\n[backend]\nhost = \"127.0.0.1\"\nuser = \"app\"\n",
    )
    .unwrap();
    let out = dispatcher()
        .arg("--check-config")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "config ok");
}

#[test]
fn check_config_rejects_unknown_keys_and_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        ("[pool]\nsise = 2\n", "unknown field"),
        ("[pool]\nmin = 5\nmax = 2\n", "pool.min"),
        (
            "[timeouts]\nkeepalive_interval_ms = 5000\nkeepalive_timeout_ms = 1000\n",
            "keepalive_timeout_ms",
        ),
        // More clients than any file limit allows: no descriptors left for workers.
        (
            "[limits]\nmax_client_connections = 2000000000\n",
            "leaves no file descriptors in reserve",
        ),
        ("[admin]\nmax_connections = 0\n", "admin.max_connections"),
        (
            "[admin]\nmax_connections = 8\nmax_connections_per_address = 9\n",
            "admin.max_connections_per_address",
        ),
        ("[admin]\nfirst_head_timeout_ms = 0\n", "admin.first_head_timeout_ms"),
        // A pool so large that its reserve overflows usize: refused, not a panic (debug)
        // or a wrapped, tiny reserve (release).
        (
            "[pool]\nsize = 9223372036854775807\nreplica_size = 1\n",
            "below the dispatcher's own reserve",
        ),
        // The embedded default splits reads: its read slots take replica_size (default size).
        ("[pool]\nsize = 9223372036854775807\n", "pool.replica_size"),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = dispatcher()
            .arg("--check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "accepted: {text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle),
            "error for {text:?} does not mention {needle}: {err}"
        );
    }
}
