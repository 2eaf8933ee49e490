//! sysbench's OLTP workloads through the MySQL port: prepare, run, cleanup, with its
//! prepared-statement mode on `auto` (it falls back to client-side statements on 1295)
//! and `disable`. No error may reach sysbench.

use crate::{run, text, Rig};

fn args(rig: &Rig, test: &str, command: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        test.to_string(),
        format!("--mysql-host={}", rig.mysql.ip()),
        format!("--mysql-port={}", rig.mysql.port()),
        format!("--mysql-user={}", crate::USER),
        format!("--mysql-password={}", crate::PASSWORD),
        format!("--mysql-db={}", rig.primary().database()),
        "--tables=2".into(),
        "--table-size=500".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push(command.into());
    a
}

fn figure(out: &str, what: &str) -> u64 {
    out.lines()
        .find(|l| l.trim_start().starts_with(what))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {what:?} in {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysbench_oltp_runs_without_an_error() {
    let rig = Rig::start("[pool]\nsize = 4\n[sessions]\nmax_per_group = 4\n").await;
    let prepare = run("sysbench", args(&rig, "oltp_read_write", "prepare", &[]), None).await;
    assert!(
        prepare.status.success(),
        "prepare: {}{}",
        text(&prepare.stdout),
        text(&prepare.stderr)
    );
    for (test, mode) in [
        ("oltp_read_write", "auto"),
        ("oltp_read_write", "disable"),
        ("oltp_point_select", "auto"),
    ] {
        let extra = ["--threads=8", "--time=3", &format!("--db-ps-mode={mode}") as &str];
        let out = run("sysbench", args(&rig, test, "run", &extra), None).await;
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success() && !o.contains("FATAL") && !e.contains("FATAL"),
            "{test} {mode}: {o}{e}"
        );
        // "ignored errors" are the database's own deadlocks (1213) and lock waits, which
        // sysbench retries; anything else would have been FATAL.
        assert_eq!(figure(&o, "reconnects"), 0, "{test} {mode}: {o}");
        assert!(figure(&o, "transactions") > 10, "{test} {mode}: {o}");
    }
    let cleanup = run("sysbench", args(&rig, "oltp_read_write", "cleanup", &[]), None).await;
    assert!(cleanup.status.success(), "cleanup: {}", text(&cleanup.stderr));
    let s = rig.cluster.dispatcher.admin_get("/sessions").await.unwrap();
    assert_eq!(
        s.as_array().map(Vec::len),
        Some(0),
        "every transaction gave its worker back: {s}"
    );
}
