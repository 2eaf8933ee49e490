//! The MySQL protocol front end, judged by real MySQL clients against a real MariaDB:
//! the `mariadb` command-line client, `mariadb-dump`, sysbench, PyMySQL and the Rust
//! `mysql_async` driver, each compared with the database itself where results can be
//! compared; and raw bytes where a hostile client is the point.

mod cli;
mod drivers;
mod failover;
mod faults;
mod more_drivers;
mod sysbench;

use std::net::SocketAddr;
use std::process::{Command, Output};

use osprey_sandbox::Instance;
use osprey_tests::harness::{free_addr, Cluster};

pub const USER: &str = "app";
pub const PASSWORD: &str = "app-Secret-1";

/// A primary, a dispatcher in front of it with the MySQL port on, and the way to reach
/// each with a MySQL client.
pub struct Rig {
    pub cluster: Cluster,
    pub mysql: SocketAddr,
}

impl Rig {
    /// `overrides`: TOML merged on top of the harness defaults and `[mysql]`.
    pub async fn start(overrides: &str) -> Rig {
        Rig::start_with("", overrides).await
    }

    /// [`Rig::start`] with more `[mysql]` keys.
    pub async fn start_with(mysql_keys: &str, overrides: &str) -> Rig {
        let mysql = free_addr();
        let config = format!(
            r#"
[mysql]
listen = "{mysql}"
{mysql_keys}
[[mysql.users]]
name = "{USER}"
native_hash = "{native}"
sha2_hash = "{sha2}"
{overrides}
"#,
            native = osprey_protocol::mysql_auth::native_hash(PASSWORD),
            sha2 = osprey_protocol::mysql_auth::sha2_hash(PASSWORD),
        );
        let cluster = Cluster::start(&config).await.expect("cluster starts");
        Rig { cluster, mysql }
    }

    pub fn primary(&self) -> &Instance {
        self.cluster.sandbox.primary()
    }

    /// The `mariadb` client's connection arguments for Osprey's MySQL port.
    pub fn osprey_args(&self) -> Vec<String> {
        vec![
            format!("-h{}", self.mysql.ip()),
            format!("-P{}", self.mysql.port()),
            format!("-u{USER}"),
            format!("-p{PASSWORD}"),
            self.primary().database().to_string(),
        ]
    }

    /// The same for the primary itself.
    pub fn direct_args(&self) -> Vec<String> {
        let p = self.primary();
        vec![
            format!("-h{}", p.host()),
            format!("-P{}", p.port()),
            format!("-u{}", p.user()),
            format!("-p{}", p.password()),
            p.database().to_string(),
        ]
    }

    /// A `mysql_async` connection through Osprey (text protocol only: `query*`).
    pub async fn conn(&self) -> mysql_async::Conn {
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.mysql.ip().to_string())
            .tcp_port(self.mysql.port())
            .user(Some(USER))
            .pass(Some(PASSWORD))
            .db_name(Some(self.primary().database()))
            .prefer_socket(false);
        mysql_async::Conn::new(opts)
            .await
            .expect("mysql_async connects through osprey")
    }

    pub async fn direct(&self) -> mysql_async::Conn {
        self.primary().conn().await.expect("direct connection")
    }
}

/// Runs `program` with `args`, `stdin` fed in, in a blocking thread.
pub async fn run(program: &str, args: Vec<String>, stdin: Option<String>) -> Output {
    let program = program.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(&program)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e} (is it installed? scripts/test.sh installs it)"));
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
