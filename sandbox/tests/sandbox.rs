//! Real-server tests of the sandbox. Each test owns its sandbox, so they run in parallel.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use osprey_sandbox::{Instance, Role, Sandbox, SandboxError};

const DEADLINE: Duration = Duration::from_secs(20);

/// Processes whose command line mentions `needle` (a sandbox directory).
fn processes_mentioning(needle: &Path) -> Vec<u32> {
    let needle = needle.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(&needle) {
                found.push(pid);
            }
        }
    }
    found
}

/// Each thread of `pid` with its state letter.
fn thread_states(pid: u32) -> Vec<(String, char)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let tid = t.ok()?.file_name().into_string().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some((tid, state))
        })
        .collect()
}

async fn wait_no_processes(dir: &Path, within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    loop {
        let left = processes_mentioning(dir);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `SELECT v FROM osprey.t WHERE id = ?` on `instance` until it returns a row.
async fn wait_for_row(instance: &Instance, id: i64) -> String {
    let deadline = Instant::now() + DEADLINE;
    let mut conn = instance.conn().await.unwrap();
    loop {
        let v: Option<String> = conn
            .exec_first("SELECT v FROM osprey.t WHERE id = ?", (id,))
            .await
            .unwrap_or(None);
        if let Some(v) = v {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{}: row {id} did not arrive within {DEADLINE:?}",
            instance.name()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn scalar(instance: &Instance, sql: &str) -> String {
    let mut conn = instance.conn().await.unwrap();
    let v: Option<String> = conn.query_first(sql).await.unwrap();
    v.unwrap_or_default()
}

async fn status(instance: &Instance, name: &str) -> String {
    let mut conn = instance.conn().await.unwrap();
    let row: Option<(String, String)> = conn
        .query_first(format!("SHOW GLOBAL STATUS LIKE '{name}'"))
        .await
        .unwrap();
    row.map(|(_, v)| v).unwrap_or_default()
}

#[tokio::test]
async fn a_row_written_on_the_primary_is_read_on_both_replicas() {
    let sandbox = Sandbox::start(2).await.unwrap();
    let primary = sandbox.primary();
    assert_eq!(primary.role(), Role::Primary);
    assert_eq!(sandbox.replicas().len(), 2);
    assert_eq!(primary.host(), "127.0.0.1");
    assert_eq!(
        primary.url(),
        format!("mysql://osprey:osprey-sandbox@127.0.0.1:{}/osprey", primary.port())
    );

    // Replication as promised: GTID, strict mode, semi-sync with both replicas acking.
    assert_eq!(status(primary, "Rpl_semi_sync_master_status").await, "ON");
    assert_eq!(status(primary, "Rpl_semi_sync_master_clients").await, "2");
    assert_eq!(scalar(primary, "SELECT @@max_connections").await, "1000");
    for replica in sandbox.replicas() {
        assert_eq!(replica.role(), Role::Replica);
        assert_eq!(scalar(replica, "SELECT @@gtid_strict_mode").await, "1");
        assert_eq!(scalar(replica, "SELECT @@read_only").await, "1");
        let mut conn = replica.conn().await.unwrap();
        let row: mysql_async::Row = conn.query_first("SHOW SLAVE STATUS").await.unwrap().unwrap();
        assert_eq!(row.get::<String, _>("Slave_IO_Running").unwrap(), "Yes");
        assert_eq!(row.get::<String, _>("Slave_SQL_Running").unwrap(), "Yes");
        assert_eq!(row.get::<String, _>("Using_Gtid").unwrap(), "Slave_Pos");
    }

    let mut conn = primary.conn().await.unwrap();
    conn.query_drop("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64))")
        .await
        .unwrap();
    conn.exec_drop("INSERT INTO t VALUES (?, ?)", (1, "hello replicas"))
        .await
        .unwrap();
    for replica in sandbox.replicas() {
        assert_eq!(wait_for_row(replica, 1).await, "hello replicas");
    }

    conn.exec_drop("INSERT INTO t VALUES (?, ?)", (2, "second"))
        .await
        .unwrap();
    sandbox.wait_replicas_caught_up(DEADLINE).await.unwrap();
    for replica in sandbox.replicas() {
        let mut rc = replica.conn().await.unwrap();
        let v: Option<String> = rc.query_first("SELECT v FROM t WHERE id = 2").await.unwrap();
        assert_eq!(
            v.as_deref(),
            Some("second"),
            "{} after wait_replicas_caught_up",
            replica.name()
        );
    }
}

#[tokio::test]
async fn replicas_still_answer_after_the_primary_is_killed() {
    let sandbox = Sandbox::start(2).await.unwrap();
    let primary = sandbox.primary();
    let mut conn = primary.conn().await.unwrap();
    conn.query_drop("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64))")
        .await
        .unwrap();
    conn.query_drop("INSERT INTO t VALUES (1, 'before the crash')")
        .await
        .unwrap();
    sandbox.wait_replicas_caught_up(DEADLINE).await.unwrap();

    let pid = primary.pid().unwrap();
    primary.kill();
    assert_eq!(primary.pid(), None);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "primary pid {pid} still exists"
    );
    assert!(
        conn.query_drop("SELECT 1").await.is_err(),
        "the old primary connection must be dead"
    );
    assert!(
        primary.conn().await.is_err(),
        "a new login to the killed primary must fail"
    );

    for replica in sandbox.replicas() {
        let mut rc = replica.conn().await.unwrap();
        let one: Option<i64> = rc.query_first("SELECT 1").await.unwrap();
        assert_eq!(one, Some(1));
        let v: Option<String> = rc.query_first("SELECT v FROM t WHERE id = 1").await.unwrap();
        assert_eq!(v.as_deref(), Some("before the crash"), "{}", replica.name());
    }
}

#[tokio::test]
async fn a_stopped_instance_hangs_and_continues() {
    let sandbox = Sandbox::start(1).await.unwrap();
    let replica = &sandbox.replicas()[0];
    let pid = replica.pid().unwrap();
    let mut held = replica.conn().await.unwrap();

    // Queries in flight on other sessions while the signal lands: their threads are awake,
    // the ones a stop must catch before they answer anything more.
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let opts = replica.opts();
            tokio::spawn(async move {
                let mut c = mysql_async::Conn::new(opts).await.unwrap();
                loop {
                    if c.query_drop("SELECT 1").await.is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    // `stop` returns only once the whole server is stopped, not when the signal is queued
    // (a thread woken by a query could otherwise still answer it). A plain kill(SIGSTOP)
    // left threads running at the check in about one round in five here.
    for round in 0..20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        replica.stop();
        let running: Vec<(String, char)> = thread_states(pid)
            .into_iter()
            .filter(|(_, state)| *state != 'T')
            .collect();
        assert!(
            running.is_empty(),
            "round {round}: threads of pid {pid} still running after stop(): {running:?}"
        );
        if round < 19 {
            replica.cont();
        }
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), replica.conn())
            .await
            .is_err(),
        "a login to a stopped server must hang"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), held.query_drop("SELECT 1"))
            .await
            .is_err()
    );

    replica.cont();
    for b in busy {
        b.abort();
    }
    let mut conn = tokio::time::timeout(DEADLINE, replica.conn()).await.unwrap().unwrap();
    conn.query_drop("SELECT 1").await.unwrap();
    assert_eq!(replica.pid(), Some(pid));
    // Replication survives the pause.
    sandbox
        .primary()
        .conn()
        .await
        .unwrap()
        .query_drop("CREATE TABLE after_pause (id INT)")
        .await
        .unwrap();
    sandbox.wait_replicas_caught_up(DEADLINE).await.unwrap();
}

#[tokio::test]
async fn restarted_instances_come_back_on_the_same_port() {
    let sandbox = Sandbox::start(1).await.unwrap();
    let (primary, replica) = (sandbox.primary(), &sandbox.replicas()[0]);
    let mut old = primary.conn().await.unwrap();
    old.query_drop("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(64))")
        .await
        .unwrap();
    old.query_drop("INSERT INTO t VALUES (1, 'one')").await.unwrap();
    let (port, pid) = (primary.port(), primary.pid().unwrap());

    // Clean restart of the primary: old sessions die, new ones work, the replica reconnects.
    let t = Instant::now();
    primary.restart().await.unwrap();
    println!("primary clean restart: {:?}", t.elapsed());
    assert_eq!(primary.port(), port);
    assert_ne!(primary.pid(), Some(pid));
    assert!(old.query_drop("SELECT 1").await.is_err());
    let mut conn = primary.conn().await.unwrap();
    conn.query_drop("INSERT INTO t VALUES (2, 'two')").await.unwrap();
    assert_eq!(wait_for_row(replica, 2).await, "two");

    // After a crash, restart recovers the data.
    primary.kill();
    let t = Instant::now();
    primary.restart().await.unwrap();
    println!("primary restart after kill -9: {:?}", t.elapsed());
    let mut conn = primary.conn().await.unwrap();
    let n: Option<i64> = conn.query_first("SELECT COUNT(*) FROM t").await.unwrap();
    assert_eq!(n, Some(2));
    conn.query_drop("INSERT INTO t VALUES (3, 'three')").await.unwrap();
    assert_eq!(wait_for_row(replica, 3).await, "three");

    // A replica restart resumes replication from its GTID position.
    replica.restart().await.unwrap();
    conn.query_drop("INSERT INTO t VALUES (4, 'four')").await.unwrap();
    sandbox.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let mut rc = replica.conn().await.unwrap();
    let n: Option<i64> = rc.query_first("SELECT COUNT(*) FROM t").await.unwrap();
    assert_eq!(n, Some(4));
}

#[tokio::test]
async fn primary_and_one_replica_start_in_under_three_seconds() {
    // Template built outside the measurement only if this process has not built it yet
    // (it is cached per machine, so normally this is a no-op).
    let t = Instant::now();
    Sandbox::prepare().await.unwrap();
    println!("prepare (binaries + template): {:?}", t.elapsed());

    let t = Instant::now();
    let sandbox = Sandbox::start(1).await.unwrap();
    let elapsed = t.elapsed();
    println!("primary + 1 replica ready in {elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "start took {elapsed:?}");

    let t = Instant::now();
    drop(sandbox);
    println!("drop: {:?}", t.elapsed());
}

#[tokio::test]
async fn drop_removes_processes_and_directories() {
    let sandbox = Sandbox::start(1).await.unwrap();
    let dir = sandbox.dir().to_path_buf();
    let pids: Vec<u32> = sandbox.instances().map(|i| i.pid().unwrap()).collect();
    assert_eq!(
        processes_mentioning(&dir).len(),
        2,
        "both servers run with their datadir under {}",
        dir.display()
    );
    sandbox.replicas()[0].stop(); // a stopped server must go too

    drop(sandbox);
    assert!(processes_mentioning(&dir).is_empty(), "servers left after drop");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} left after drop"
        );
    }
    assert!(!dir.exists(), "{} left after drop", dir.display());
}

#[tokio::test]
async fn a_panicking_test_still_cleans_up() {
    let (tx, rx) = tokio::sync::oneshot::channel::<PathBuf>();
    let task = tokio::spawn(async move {
        let sandbox = Sandbox::start(1).await.unwrap();
        tx.send(sandbox.dir().to_path_buf()).unwrap();
        panic!("deliberate panic while the sandbox is alive");
    });
    let dir = rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    assert!(processes_mentioning(&dir).is_empty(), "servers left after the panic");
    assert!(!dir.exists());
}

/// Started as a child process by `servers_die_with_a_kill_9_owner`: starts a sandbox, prints
/// its directory (libtest puts it after "test pdeathsig_helper ... "), and waits to be killed.
#[tokio::test]
#[ignore = "helper, run by servers_die_with_a_kill_9_owner"]
async fn pdeathsig_helper() {
    if std::env::var_os("OSPREY_SANDBOX_PDEATHSIG_HELPER").is_none() {
        return;
    }
    let sandbox = Sandbox::start(1).await.unwrap();
    println!("SANDBOX_DIR={}", sandbox.dir().display());
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[tokio::test]
async fn servers_die_with_a_kill_9_owner() {
    use std::io::BufRead;
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pdeathsig_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("OSPREY_SANDBOX_PDEATHSIG_HELPER", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = helper.stdout.take().unwrap();
    let dir = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| {
                line.split_once("SANDBOX_DIR=")
                    .map(|(_, dir)| PathBuf::from(dir.trim()))
            })
    })
    .await
    .unwrap()
    .expect("the helper printed its sandbox dir");
    assert_eq!(processes_mentioning(&dir).len(), 2);

    helper.kill().unwrap(); // SIGKILL: no Drop runs in the helper
    helper.wait().unwrap();
    let left = wait_no_processes(&dir, Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir); // the helper could not clean its files
    assert!(left.is_empty(), "servers {left:?} outlived their kill -9'd owner");
}

#[tokio::test]
async fn replication_can_be_broken_and_repaired() {
    let sandbox = Sandbox::builder()
        .replicas(1)
        .semi_sync_timeout(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let (primary, replica) = (sandbox.primary(), &sandbox.replicas()[0]);
    assert!(matches!(
        primary.break_replication().await,
        Err(SandboxError::NotAReplica { .. })
    ));

    replica.break_replication().await.unwrap();
    let mut conn = primary.conn().await.unwrap();
    conn.query_drop("CREATE TABLE t (id INT)").await.unwrap();
    let err = sandbox
        .wait_replicas_caught_up(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::NotCaughtUp { .. }), "{err}");
    println!("expected: {err}");

    replica.repair_replication().await.unwrap();
    sandbox.wait_replicas_caught_up(DEADLINE).await.unwrap();
    let mut rc = replica.conn().await.unwrap();
    let n: Option<i64> = rc
        .query_first("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema='osprey' AND table_name='t'")
        .await
        .unwrap();
    assert_eq!(n, Some(1));
}

#[tokio::test]
async fn the_app_account_can_do_what_the_dispatcher_needs() {
    let sandbox = Sandbox::builder().max_connections(200).start().await.unwrap();
    let primary = sandbox.primary();
    assert!(sandbox.replicas().is_empty());
    assert_eq!(scalar(primary, "SELECT @@max_connections").await, "200");
    assert_eq!(scalar(primary, "SELECT CURRENT_USER()").await, "osprey@127.0.0.1");
    assert_eq!(scalar(primary, "SELECT DATABASE()").await, "osprey");

    // TCP, not the Unix socket (prefer_socket(false)).
    let mut conn = primary.conn().await.unwrap();
    let host: Option<String> = conn
        .query_first("SELECT host FROM information_schema.processlist WHERE id = CONNECTION_ID()")
        .await
        .unwrap();
    assert!(host.unwrap().starts_with("127.0.0.1:"));

    conn.query_drop("CREATE TABLE t (id INT PRIMARY KEY)").await.unwrap();
    conn.query_drop("SELECT * FROM performance_schema.threads LIMIT 1")
        .await
        .unwrap();
    conn.query_drop("SHOW SLAVE STATUS").await.unwrap();
    conn.query_drop("SHOW BINARY LOGS").await.unwrap();

    // KILL QUERY on another session of the same account: error 1317, the session survives.
    let victim_id = conn.id();
    let killer = async {
        let mut other = primary.conn().await.unwrap();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let running: Option<i64> = other
                .exec_first(
                    "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ? AND info LIKE 'SELECT SLEEP%'",
                    (victim_id,),
                )
                .await
                .unwrap();
            if running == Some(1) {
                break;
            }
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        other.query_drop(format!("KILL QUERY {victim_id}")).await.unwrap();
    };
    let (slept, ()) = tokio::join!(conn.query_drop("SELECT SLEEP(30)"), killer);
    match slept {
        Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1317, "{e}"),
        // MariaDB may also end SLEEP() early with result 1 instead of an error.
        Ok(()) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
    conn.query_drop("SELECT 1").await.unwrap();
}

#[tokio::test]
async fn a_server_that_cannot_start_reports_its_error_log() {
    let err = Sandbox::builder()
        .server_arg("--no-such-option=1")
        .start()
        .await
        .unwrap_err();
    println!("expected: {err}");
    assert!(matches!(err, SandboxError::Exited { .. }), "{err}");
    assert!(
        err.to_string().contains("no-such-option"),
        "the log tail names the problem: {err}"
    );
}

/// Fencing a primary means `read_only=ON` stops the application: the app account must not
/// bypass it (ALL PRIVILEGES would, through READ_ONLY ADMIN); the admin account may.
#[tokio::test]
async fn the_app_account_obeys_read_only_and_the_admin_account_does_not() {
    let sandbox = Sandbox::start(1).await.unwrap();
    let (primary, replica) = (sandbox.primary(), &sandbox.replicas()[0]);
    primary
        .conn()
        .await
        .unwrap()
        .query_drop("CREATE TABLE t (id INT PRIMARY KEY)")
        .await
        .unwrap();
    sandbox.wait_replicas_caught_up(DEADLINE).await.unwrap();

    let mut app = replica.conn().await.unwrap();
    let err = app.query_drop("INSERT INTO t VALUES (1)").await.unwrap_err();
    match err {
        mysql_async::Error::Server(e) => assert_eq!(e.code, 1290, "{e:?}"), // ER_OPTION_PREVENTS_STATEMENT
        other => panic!("expected 1290 --read-only, got {other:?}"),
    }

    // Nor may it change read_only (10.11: that takes READ_ONLY ADMIN; SUPER no longer has it).
    let err = app.query_drop("SET GLOBAL read_only = OFF").await.unwrap_err();
    assert!(
        matches!(err, mysql_async::Error::Server(ref e) if e.code == 1227),
        "{err:?}"
    ); // ER_SPECIFIC_ACCESS_DENIED_ERROR

    let mut admin = replica.admin_conn().await.unwrap();
    let who: Option<String> = admin.query_first("SELECT CURRENT_USER()").await.unwrap();
    assert_eq!(who.as_deref(), Some("osprey_admin@127.0.0.1"));
    admin.query_drop("INSERT INTO osprey.t VALUES (2)").await.unwrap();
    admin.query_drop("SET GLOBAL read_only = ON").await.unwrap();
    assert_eq!(replica.monitor_user(), "osprey_admin");
}
