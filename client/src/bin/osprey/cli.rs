//! The command line: flags and subcommands (clap), and what the flags resolve to (the
//! tokens, from a flag or the local credentials file; the TLS settings; the admin API).

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use osprey_client::local::{runtime_dir, Credentials};
use osprey_client::TlsConfig;

use crate::admin::Admin;

#[derive(Parser, Debug)]
#[command(name = "osprey", version, about = "Osprey dispatcher client and admin tool")]
pub struct Cli {
    /// Dispatcher client address.
    #[arg(long, global = true, env = "OSPREY_ADDR", default_value = osprey_client::DEFAULT_ADDR)]
    pub addr: String,
    /// Client token (default: `client_token` from the local credentials file).
    #[arg(long, global = true, env = "OSPREY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Admin HTTP address.
    #[arg(long, global = true, env = "OSPREY_ADMIN", default_value = osprey_client::DEFAULT_ADMIN_ADDR)]
    pub admin: String,
    /// Admin token (default: `admin_token` from the local credentials file).
    #[arg(
        long = "admin-token",
        global = true,
        env = "OSPREY_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Connect to the dispatcher with TLS (implied by any other --tls-* option).
    #[arg(long, global = true, env = "OSPREY_TLS")]
    pub tls: bool,
    /// PEM CA file for the dispatcher's certificate (default: the system's roots).
    #[arg(long = "tls-ca", global = true, env = "OSPREY_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Name the dispatcher's certificate must be valid for (default: the host of --addr).
    #[arg(
        long = "tls-server-name",
        global = true,
        env = "OSPREY_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,
    /// PEM client certificate chain, for a dispatcher that asks for one (with --tls-key).
    #[arg(long = "tls-cert", global = true, env = "OSPREY_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", global = true, env = "OSPREY_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The cluster to run SQL on, or to show and operate (default: the dispatcher's first).
    #[arg(long, global = true, env = "OSPREY_CLUSTER")]
    pub cluster: Option<String>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run one SQL statement and print its result.
    Sql {
        /// The statement; `?` placeholders take the --param values in order.
        sql: String,
        /// Print rows as JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// A parameter: text by default; `null`, `int:N`, `uint:N`, `float:X`, `str:TEXT`
        /// or `hex:BYTES` for other types.
        #[arg(long = "param", short = 'p', value_name = "V", allow_hyphen_values = true)]
        params: Vec<String>,
        /// Client-side timeout in seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Run on the primary whatever the read/write split says (`force_primary`).
        #[arg(long)]
        primary: bool,
    },
    /// An interactive SQL prompt on one session (a pinned worker): `BEGIN` … `COMMIT`,
    /// temporary tables and variables work as in the mariadb client. Statements end with
    /// `;`; `\\q` (or `quit`, `exit`, end of input) leaves. Reads stdin without a prompt
    /// when it is not a terminal.
    Shell {
        /// Open a read-only session (it may run on a replica).
        #[arg(long)]
        read_only: bool,
    },
    /// Print the password hashes for a `[[mysql.users]]` entry of the dispatcher's config
    /// (the password is read from stdin, or prompted for on a terminal; never stored).
    MysqlPassword {
        /// The user name to put in the printed entry.
        #[arg(long, default_value = "app")]
        user: String,
    },
    /// Show the dispatcher's pool and slots.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Worker pool operations.
    Pool {
        #[command(subcommand)]
        cmd: PoolCmd,
    },
    /// Clusters: members, health, switches; switchover and maintenance.
    Cluster {
        #[command(subcommand)]
        cmd: Option<ClusterCmd>,
    },
    /// Statement digests: the top ones, the blocked ones; block and unblock.
    Digests {
        #[command(subcommand)]
        cmd: Option<DigestsCmd>,
    },
    /// The per-member throttle: status, and live limits.
    Throttle {
        #[command(subcommand)]
        cmd: Option<ThrottleCmd>,
    },
    /// Replica delay: each replica's delay, status and read-pool eligibility; reset a probe.
    Delay {
        #[command(subcommand)]
        cmd: Option<DelayCmd>,
    },
    /// Sessions holding a worker: who, where, for how long, in a transaction; end one.
    Sessions {
        #[command(subcommand)]
        cmd: Option<SessionsCmd>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SessionsCmd {
    /// Every session pinned to a worker now, oldest first (the default).
    List {
        #[arg(long)]
        json: bool,
    },
    /// End a session (SESSION_ABORTED to its client, an open transaction rolled back):
    /// CONN and SESSION as `osprey sessions` lists them.
    Kill { conn: u64, session: u32 },
}

#[derive(Subcommand, Debug)]
pub enum DelayCmd {
    /// Every replica's delay, status, message, last active time and probe connection (the default).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Close MEMBER's probe connection; the next round opens a new one.
    Reset { member: String },
}

#[derive(Subcommand, Debug)]
pub enum DigestsCmd {
    /// The most executed and the most time-consuming digests, with their state (the default).
    Top {
        /// Rows per list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// The blocked digests.
    Blocked {
        #[arg(long)]
        json: bool,
    },
    /// Block a statement (its digest: every statement that differs only in its values).
    Block {
        sql: String,
        /// Seconds the block lasts (default: until unblocked).
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// Lift a block (ID: the 16 hex digits of the digest, as SQL_BLOCKED names it).
    Unblock { id: String },
}

#[derive(Subcommand, Debug)]
pub enum ThrottleCmd {
    /// Every throttled member: rate, tokens, waiting, waited, rejected (the default).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Set MEMBER's rate (0: no limit), live, until the next SIGHUP.
    Set {
        member: String,
        qps: f64,
        /// Tokens the bucket holds at most (default: a tenth of a second's worth).
        #[arg(long)]
        burst: Option<f64>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Members, their role, health and replication positions (the default).
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// The last switches (failovers, switchovers, followed changes), oldest first.
    Events {
        #[arg(long)]
        json: bool,
    },
    /// Planned switchover: the primary goes read-only, TO catches up and is promoted;
    /// writes wait meanwhile instead of failing.
    Switchover {
        /// The member to promote (default: the most advanced eligible replica).
        to: Option<String>,
    },
    /// Maintenance of a member: no new requests (in-flight ones finish), or back.
    Maintenance {
        member: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Change the number of worker slots.
    Resize { size: u32 },
}

/// The local credentials file (`<runtime_dir>/credentials`), for a token no flag gave.
fn credentials() -> anyhow::Result<Credentials> {
    let dir = runtime_dir();
    Credentials::load(&dir).with_context(|| {
        format!(
            "no token given and the local credentials file is unreadable (looked in {})",
            dir.display()
        )
    })
}

/// TLS settings from the --tls* options; `None`: plain TCP.
pub fn tls_config(cli: &Cli) -> anyhow::Result<Option<TlsConfig>> {
    let any = cli.tls_ca.is_some() || cli.tls_server_name.is_some() || cli.tls_cert.is_some() || cli.tls_key.is_some();
    if cli.tls_cert.is_some() != cli.tls_key.is_some() {
        return Err(anyhow!("--tls-cert and --tls-key go together"));
    }
    Ok((cli.tls || any).then(|| TlsConfig {
        ca_file: cli.tls_ca.clone(),
        server_name: cli.tls_server_name.clone(),
        cert_file: cli.tls_cert.clone(),
        key_file: cli.tls_key.clone(),
    }))
}

/// The client token: --token, else `client_token` from the local credentials file.
pub fn client_token(cli: &Cli) -> anyhow::Result<String> {
    match &cli.token {
        Some(t) => Ok(t.clone()),
        None => Ok(credentials()?.client_token),
    }
}

/// The admin API the flags name: --admin, with --admin-token, else `admin_token` from the
/// local credentials file.
pub fn admin(cli: &Cli) -> anyhow::Result<Admin> {
    let token = match &cli.admin_token {
        Some(t) => t.clone(),
        None => credentials()?.admin_token,
    };
    Ok(Admin::new(&cli.admin, token))
}
