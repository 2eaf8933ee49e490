//! `osprey`: run SQL through a dispatcher and drive its admin API.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use osprey_client::local::{runtime_dir, Credentials};
use osprey_client::{display_value, Client, ClientConfig, Error, QueryResult, Request, RequestExt, TlsConfig, Value};
use serde::Deserialize;

#[derive(Parser, Debug)]
#[command(name = "osprey", version, about = "Osprey dispatcher client and admin tool")]
struct Cli {
    /// Dispatcher client address.
    #[arg(long, global = true, env = "OSPREY_ADDR", default_value = osprey_client::DEFAULT_ADDR)]
    addr: String,
    /// Client token (default: `client_token` from the local credentials file).
    #[arg(long, global = true, env = "OSPREY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Admin HTTP address.
    #[arg(long, global = true, env = "OSPREY_ADMIN", default_value = osprey_client::DEFAULT_ADMIN_ADDR)]
    admin: String,
    /// Admin token (default: `admin_token` from the local credentials file).
    #[arg(
        long = "admin-token",
        global = true,
        env = "OSPREY_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,
    /// Connect to the dispatcher with TLS (implied by any other --tls-* option).
    #[arg(long, global = true, env = "OSPREY_TLS")]
    tls: bool,
    /// PEM CA file for the dispatcher's certificate (default: the system's roots).
    #[arg(long = "tls-ca", global = true, env = "OSPREY_TLS_CA", value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Name the dispatcher's certificate must be valid for (default: the host of --addr).
    #[arg(
        long = "tls-server-name",
        global = true,
        env = "OSPREY_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    tls_server_name: Option<String>,
    /// PEM client certificate chain, for a dispatcher that asks for one (with --tls-key).
    #[arg(long = "tls-cert", global = true, env = "OSPREY_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", global = true, env = "OSPREY_TLS_KEY", value_name = "FILE")]
    tls_key: Option<std::path::PathBuf>,
    /// The cluster to run SQL on, or to show and operate (default: the dispatcher's first).
    #[arg(long, global = true, env = "OSPREY_CLUSTER")]
    cluster: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
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
}

#[derive(Subcommand, Debug)]
enum DelayCmd {
    /// Every replica's delay, status, message, last active time and probe connection (the default).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Close MEMBER's probe connection; the next round opens a new one.
    Reset { member: String },
}

#[derive(Subcommand, Debug)]
enum DigestsCmd {
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
enum ThrottleCmd {
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
enum ClusterCmd {
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
enum PoolCmd {
    /// Change the number of worker slots.
    Resize { size: u32 },
}

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
fn tls_config(cli: &Cli) -> anyhow::Result<Option<TlsConfig>> {
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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Sql {
            ref sql,
            json,
            ref params,
            timeout,
            primary,
        } => {
            let token = match cli.token.clone() {
                Some(t) => t,
                None => credentials()?.client_token,
            };
            let params = params
                .iter()
                .map(|p| parse_param(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut cfg = ClientConfig::new(cli.addr.clone(), token);
            cfg.tls = tls_config(&cli)?;
            cfg.name = format!("osprey-cli[{}]", std::process::id());
            cfg.connection_wait = cfg.connect_timeout;
            cfg.request_timeout = timeout.map(Duration::from_secs_f64);
            cfg.cluster = cli.cluster.clone();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let result = rt.block_on(async move {
                let client = Client::connect(cfg).await?;
                let request = Request::sql(sql.as_str())
                    .with_params(params)
                    .with_force_primary(primary);
                client.send(request).await
            });
            match result {
                Ok(r) => {
                    print_result(&r, json);
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    print_error(&e);
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Cmd::Status { json } => {
            let token = admin_token(&cli)?;
            let (code, body) = http(&cli.admin, "GET", "/status", &token, None)?;
            if !(200..300).contains(&code) {
                eprintln!("admin API answered HTTP {code}: {}", body.trim());
                return Ok(ExitCode::FAILURE);
            }
            if json {
                println!("{}", body.trim());
            } else {
                let st: Status = serde_json::from_str(&body).context("unexpected /status body")?;
                print!("{}", render_status(&st));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Pool {
            cmd: PoolCmd::Resize { size },
        } => {
            let token = admin_token(&cli)?;
            let req = serde_json::json!({ "size": size });
            let (code, body) = http(&cli.admin, "POST", "/pool/size", &token, Some(req))?;
            if !(200..300).contains(&code) {
                eprintln!("admin API answered HTTP {code}: {}", body.trim());
                return Ok(ExitCode::FAILURE);
            }
            let new_size = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("size").and_then(|s| s.as_u64()));
            match new_size {
                Some(n) => println!("pool size: {n}"),
                None => println!("pool size: {size} ({})", body.trim()),
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cluster { ref cmd } => cluster_cmd(&cli, cmd.as_ref()),
        Cmd::Digests { ref cmd } => digests_cmd(&cli, cmd.as_ref()),
        Cmd::Throttle { ref cmd } => throttle_cmd(&cli, cmd.as_ref()),
        Cmd::Delay { ref cmd } => delay_cmd(&cli, cmd.as_ref()),
    }
}

fn digests_cmd(cli: &Cli, cmd: Option<&DigestsCmd>) -> anyhow::Result<ExitCode> {
    let top = DigestsCmd::Top { limit: 20, json: false };
    let cmd = cmd.unwrap_or(&top);
    let (method, path, body, json) = match cmd {
        DigestsCmd::Top { limit, json } => ("GET", format!("/digests?limit={limit}"), None, *json),
        DigestsCmd::Blocked { json } => ("GET", "/digests/blocked".into(), None, *json),
        DigestsCmd::Block { sql, ttl } => (
            "POST",
            "/digests/block".into(),
            Some(serde_json::json!({ "sql": sql, "ttl_s": ttl })),
            false,
        ),
        DigestsCmd::Unblock { id } => (
            "POST",
            format!("/digests/{}/unblock", url_escape(id)),
            Some(serde_json::json!({})),
            false,
        ),
    };
    let v = match admin_call(cli, method, &path, body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), |f| format!("{f:.0}")),
        other => other.to_string(),
    };
    match cmd {
        DigestsCmd::Top { .. } => {
            println!(
                "slow: {} ms x {} within {} s blocks for {} s (0: until unblocked)",
                s(&v["slow_threshold_ms"]),
                s(&v["slow_count"]),
                s(&v["slow_window_s"]),
                s(&v["block_ttl_s"])
            );
            let header: Vec<String> = ["id", "state", "count", "total_ms", "max_ms", "slow", "text"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            for (title, key) in [("by count", "by_count"), ("by time", "by_time")] {
                let rows: Vec<Vec<String>> = v[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| {
                        ["id", "state", "count", "total_ms", "max_ms", "slow", "text"]
                            .iter()
                            .map(|k| s(&d[*k]))
                            .collect()
                    })
                    .collect();
                println!("{title}:");
                print!("{}", render_table(&header, &rows));
            }
        }
        DigestsCmd::Blocked { .. } => {
            let header: Vec<String> = ["id", "by", "remaining_s", "rejected", "text"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let rows: Vec<Vec<String>> = v["blocked"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    vec![
                        s(&d["id"]),
                        s(&d["reason"]["by"]),
                        s(&d["remaining_s"]),
                        s(&d["rejected"]),
                        s(&d["text"]),
                    ]
                })
                .collect();
            if rows.is_empty() {
                println!("no blocked digests");
            } else {
                print!("{}", render_table(&header, &rows));
            }
        }
        DigestsCmd::Block { .. } => println!("blocked {}: {}", s(&v["id"]), s(&v["text"])),
        DigestsCmd::Unblock { .. } => println!("unblocked {}", s(&v["id"])),
    }
    Ok(ExitCode::SUCCESS)
}

fn throttle_cmd(cli: &Cli, cmd: Option<&ThrottleCmd>) -> anyhow::Result<ExitCode> {
    let (method, body, json) = match cmd.unwrap_or(&ThrottleCmd::Status { json: false }) {
        ThrottleCmd::Status { json } => ("GET", None, *json),
        ThrottleCmd::Set { member, qps, burst } => (
            "POST",
            Some(serde_json::json!({ "cluster": cli.cluster, "member": member, "max_qps": qps, "burst": burst })),
            false,
        ),
    };
    let v = match admin_call(cli, method, "/throttle", body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    let f = |v: &serde_json::Value| v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.1}"));
    if let Some(ThrottleCmd::Set { .. }) = cmd {
        match v["max_qps"].as_f64() {
            Some(_) => println!(
                "{}: max_qps {} burst {}",
                v["member"].as_str().unwrap_or("?"),
                f(&v["max_qps"]),
                f(&v["burst"])
            ),
            None => println!("{}: no limit", v["member"].as_str().unwrap_or("?")),
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!("wait {} ms, queue {} per member", v["wait_ms"], v["queue_capacity"]);
    let cols = [
        "member",
        "max_qps",
        "burst",
        "tokens",
        "waiting",
        "accepted",
        "waited",
        "waited_ms",
        "rejected_full",
        "rejected_timeout",
    ];
    let header: Vec<String> = cols.iter().map(|s| s.to_string()).collect();
    let rows: Vec<Vec<String>> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            cols.iter()
                .map(|k| match &m[*k] {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(n) if n.is_f64() => f(&m[*k]),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    if rows.is_empty() {
        println!("no member is throttled");
    } else {
        print!("{}", render_table(&header, &rows));
    }
    Ok(ExitCode::SUCCESS)
}

fn cluster_cmd(cli: &Cli, cmd: Option<&ClusterCmd>) -> anyhow::Result<ExitCode> {
    let query = cli
        .cluster
        .as_deref()
        .map(|c| format!("?cluster={}", url_escape(c)))
        .unwrap_or_default();
    let (method, path, body, json) = match cmd.unwrap_or(&ClusterCmd::Status { json: false }) {
        ClusterCmd::Status { json } => ("GET", format!("/cluster{query}"), None, *json),
        ClusterCmd::Events { json } => ("GET", format!("/cluster/events{query}"), None, *json),
        ClusterCmd::Switchover { to } => (
            "POST",
            "/cluster/switchover".into(),
            Some(serde_json::json!({ "cluster": cli.cluster, "to": to })),
            true,
        ),
        ClusterCmd::Maintenance { member, state } => (
            "POST",
            "/cluster/maintenance".into(),
            Some(serde_json::json!({ "cluster": cli.cluster, "member": member, "on": state == "on" })),
            true,
        ),
    };
    let v = match admin_call(cli, method, &path, body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    match cmd {
        Some(ClusterCmd::Events { .. }) => print!("{}", render_events(&v)),
        _ => print!("{}", render_clusters(&v)),
    }
    Ok(ExitCode::SUCCESS)
}

fn delay_cmd(cli: &Cli, cmd: Option<&DelayCmd>) -> anyhow::Result<ExitCode> {
    let (method, path, body, json) = match cmd.unwrap_or(&DelayCmd::Status { json: false }) {
        DelayCmd::Status { json } => {
            let query = cli
                .cluster
                .as_deref()
                .map(|c| format!("?cluster={}", url_escape(c)))
                .unwrap_or_default();
            ("GET", format!("/delay{query}"), None, *json)
        }
        DelayCmd::Reset { member } => (
            "POST",
            "/delay/reset".to_string(),
            Some(serde_json::json!({ "cluster": cli.cluster, "member": member })),
            false,
        ),
    };
    let v = match admin_call(cli, method, &path, body, json)? {
        Ok(v) => v,
        Err(code) => return Ok(code),
    };
    match cmd {
        Some(DelayCmd::Reset { member }) => println!(
            "{}/{member}: probe connection reset (a new one next period)",
            v["cluster"].as_str().unwrap_or("?")
        ),
        _ => print!("{}", render_delay(&v)),
    }
    Ok(ExitCode::SUCCESS)
}

/// A JSON value as a table cell: `-` for null, strings unquoted.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `GET /delay` as DBLE shows it: one line per replica.
fn render_delay(v: &serde_json::Value) -> String {
    let s = cell;
    let mut out = String::new();
    for c in v["clusters"].as_array().into_iter().flatten() {
        if c["enabled"].as_bool() != Some(true) {
            out.push_str(&format!("cluster {}: delay detection off\n\n", s(&c["cluster"])));
            continue;
        }
        let p = &c["primary"];
        out.push_str(&format!(
            "cluster {}: period {} ms, threshold {} ms, source {} | heartbeat on {} ({}): {} ts {} conn {}{}\n",
            s(&c["cluster"]),
            s(&c["period_ms"]),
            s(&c["threshold_ms"]),
            s(&c["source"]),
            s(&p["name"]),
            s(&p["host"]),
            s(&p["status"]),
            s(&p["logic_timestamp"]),
            s(&p["connection_id"]),
            p["message"].as_str().map(|m| format!(" ({m})")).unwrap_or_default(),
        ));
        let cols = [
            "name",
            "host",
            "delay_ms",
            "wall_delay_ms",
            "status",
            "eligible",
            "last_active",
            "connection_id",
            "gtid_applied",
            "message",
        ];
        let header: Vec<String> = cols.iter().map(|c| c.to_string()).collect();
        let rows: Vec<Vec<String>> = c["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| cols.iter().map(|k| s(&r[*k])).collect())
            .collect();
        out.push_str(&render_table(&header, &rows));
        out.push('\n');
    }
    out
}

fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn render_clusters(v: &serde_json::Value) -> String {
    let s = cell;
    let mut out = String::new();
    for c in v["clusters"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "cluster {} ({}): primary {} | status {}{} | semi-sync {} | lock {}{}\n",
            s(&c["name"]),
            s(&c["topology"]),
            s(&c["primary"]),
            s(&c["status"]["status"]),
            c["status"]["detail"]
                .as_str()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default(),
            s(&c["semi_sync"]),
            if c["lock_held"].as_bool() == Some(true) {
                "held"
            } else {
                "not held"
            },
            c["lock_detail"].as_str().map(|d| format!(" ({d})")).unwrap_or_default(),
        ));
        let wp = &c["write_pool"];
        out.push_str(&format!(
            "write slots: member {} | idle {} busy {} starting {} | queue {}{}\n",
            s(&wp["member"]),
            s(&wp["idle"]),
            s(&wp["busy"]),
            s(&wp["starting"]),
            s(&wp["queue_depth"]),
            wp["hold"]
                .as_str()
                .map(|h| format!(" | holding: {h}"))
                .unwrap_or_default(),
        ));
        for rp in c["read_pools"].as_array().into_iter().flatten() {
            let state = match rp["reason"].as_str() {
                _ if rp["serving"] == true => "serving".to_owned(),
                Some(why) => format!("not serving: {why}"),
                None => "not serving".to_owned(),
            };
            out.push_str(&format!(
                "read slots: member {} | {} | size {} idle {} busy {} | queue {}\n",
                s(&rp["member"]),
                state,
                s(&rp["slots"]["size"]),
                s(&rp["slots"]["idle"]),
                s(&rp["slots"]["busy"]),
                s(&rp["slots"]["queue_depth"]),
            ));
        }
        let header: Vec<String> = [
            "member",
            "addr",
            "role",
            "health",
            "fails",
            "read_only",
            "gtid applied",
            "from",
            "maint",
            "reason",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let health = c["health"].as_array().cloned().unwrap_or_default();
        let rows: Vec<Vec<String>> = c["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let h = health.iter().find(|h| h["member"] == m["name"]);
                vec![
                    s(&m["name"]),
                    s(&m["addr"]),
                    s(&m["role"]),
                    h.map_or("-".into(), |h| s(&h["state"])),
                    h.map_or("-".into(), |h| {
                        format!("{}/{}", s(&h["failures_in_window"]), s(&h["fail_threshold"]))
                    }),
                    s(&m["read_only"]),
                    s(&m["gtid_applied"]),
                    s(&m["replicates_from"]),
                    if m["maintenance"].as_bool() == Some(true) {
                        "yes".into()
                    } else {
                        "-".into()
                    },
                    s(&m["reason"]),
                ]
            })
            .collect();
        out.push_str(&render_table(&header, &rows));
        out.push('\n');
    }
    out
}

fn render_events(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for e in v["events"].as_array().into_iter().flatten() {
        let steps: Vec<String> = e["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|st| {
                format!(
                    "{}@{:.0}ms{}",
                    st["step"].as_str().unwrap_or("?"),
                    st["at_ms"].as_f64().unwrap_or(0.0),
                    if st["ok"].as_bool() == Some(false) {
                        "(failed)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        out.push_str(&format!(
            "{} {} {}: {} -> {} in {:.0} ms{} [{}]{}\n",
            e["started"].as_u64().unwrap_or(0),
            e["cluster"].as_str().unwrap_or("?"),
            e["kind"].as_str().unwrap_or("?"),
            e["old_primary"].as_str().unwrap_or("-"),
            e["new_primary"].as_str().unwrap_or("-"),
            e["duration_ms"].as_f64().unwrap_or(0.0),
            if e["ok"].as_bool() == Some(false) {
                " FAILED"
            } else {
                ""
            },
            steps.join(" "),
            e["detail"].as_str().map(|d| format!(" {d}")).unwrap_or_default(),
        ));
    }
    if out.is_empty() {
        out.push_str("no switches\n");
    }
    out
}

/// One admin API call. `Err(code)`: nothing left to do (an HTTP error was reported, or the
/// raw body was printed for `--json`); `Ok`: the JSON body to render.
fn admin_call(
    cli: &Cli,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
    raw: bool,
) -> anyhow::Result<Result<serde_json::Value, ExitCode>> {
    let token = admin_token(cli)?;
    let (code, text) = http(&cli.admin, method, path, &token, body)?;
    if !(200..300).contains(&code) {
        eprintln!("admin API answered HTTP {code}: {}", text.trim());
        return Ok(Err(ExitCode::FAILURE));
    }
    if raw {
        println!("{}", text.trim());
        return Ok(Err(ExitCode::SUCCESS));
    }
    Ok(Ok(serde_json::from_str(&text).context("unexpected admin API body")?))
}

fn admin_token(cli: &Cli) -> anyhow::Result<String> {
    match &cli.admin_token {
        Some(t) => Ok(t.clone()),
        None => Ok(credentials()?.admin_token),
    }
}

fn http(
    admin: &str,
    method: &str,
    path: &str,
    token: &str,
    json: Option<serde_json::Value>,
) -> anyhow::Result<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let base = if admin.starts_with("http://") || admin.starts_with("https://") {
        admin.trim_end_matches('/').to_owned()
    } else {
        format!("http://{admin}")
    };
    let url = format!("{base}{path}");
    let auth = format!("Bearer {token}");
    let resp = match (method, json) {
        ("POST", Some(body)) => agent
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(body.to_string()),
        _ => agent.get(&url).header("Authorization", &auth).call(),
    };
    let mut resp = resp.map_err(|e| anyhow!("{method} {url}: {e}"))?;
    let code = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    Ok((code, body))
}

fn parse_param(p: &str) -> anyhow::Result<Value> {
    let bad = |what: &str| anyhow!("--param {p:?}: not a valid {what}");
    Ok(if p == "null" {
        Value::Null
    } else if let Some(v) = p.strip_prefix("int:") {
        Value::Int(v.parse().map_err(|_| bad("integer"))?)
    } else if let Some(v) = p.strip_prefix("uint:") {
        Value::UInt(v.parse().map_err(|_| bad("unsigned integer"))?)
    } else if let Some(v) = p.strip_prefix("float:") {
        Value::Double(v.parse().map_err(|_| bad("number"))?)
    } else if let Some(v) = p.strip_prefix("str:") {
        Value::Text(v.to_owned())
    } else if let Some(v) = p.strip_prefix("hex:") {
        let v = v.trim_start_matches("0x");
        if v.len() % 2 != 0 {
            return Err(bad("hex string"));
        }
        let bytes = (0..v.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&v[i..i + 2], 16))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("hex string"))?;
        Value::Bytes(bytes)
    } else {
        Value::Text(p.to_owned())
    })
}

fn print_error(e: &Error) {
    let origin = format!("{:?}", e.origin()).to_lowercase();
    let mut line = format!("error: {} (origin {origin}", e.code());
    if let Some(n) = e.errno() {
        line.push_str(&format!(", errno {n}"));
    }
    if let Some(s) = e.sqlstate() {
        line.push_str(&format!(", SQLSTATE {s}"));
    }
    line.push_str(if e.dispatched() {
        ", dispatched)"
    } else {
        ", not dispatched)"
    });
    eprintln!("{line}\n  {}", e.message());
}

fn print_result(r: &QueryResult, json: bool) {
    if json {
        for set in &r.sets {
            for row in &set.rows {
                println!("{}", serde_json::Value::Object(row.to_json()));
            }
        }
        if r.sets.is_empty() {
            let s = &r.summary;
            let mut summary = serde_json::json!({"affected_rows": s.affected_rows, "last_insert_id": s.last_insert_id, "warnings": s.warnings});
            if let Some(gtid) = &s.gtid {
                summary["gtid"] = gtid.clone().into();
            }
            println!("{summary}");
        }
        return;
    }
    for (i, set) in r.sets.iter().enumerate() {
        if i > 0 {
            println!();
        }
        let header: Vec<String> = set.columns().iter().map(|c| c.name.clone()).collect();
        let rows: Vec<Vec<String>> = set
            .rows
            .iter()
            .map(|row| row.values().iter().map(display_value).collect())
            .collect();
        print!("{}", render_table(&header, &rows));
        let n = set.rows.len();
        println!("{n} row{}", if n == 1 { "" } else { "s" });
    }
    if r.sets.is_empty() {
        println!("affected rows: {}", r.summary.affected_rows);
        if let Some(id) = r.summary.last_insert_id {
            println!("last insert id: {id}");
        }
    }
    if let Some(gtid) = &r.summary.gtid {
        println!("gtid: {gtid}");
    }
    if r.summary.warnings > 0 {
        println!("warnings: {}", r.summary.warnings);
    }
}

/// An aligned table with a header rule.
fn render_table(header: &[String], rows: &[Vec<String>]) -> String {
    let clean = |s: &str| s.replace(['\n', '\t'], " ");
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(clean(cell).chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{:<w$}", clean(c), w = *w))
            .collect();
        format!("{}\n", parts.join(" | ").trim_end())
    };
    let mut out = line(header);
    out.push_str(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("-+-"));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

#[derive(Debug, Deserialize)]
struct Status {
    version: String,
    pid: u32,
    uptime_s: f64,
    draining: bool,
    pool: Pool,
    #[serde(default)]
    slots: Vec<Slot>,
    clients: Option<Clients>,
    streams: Option<Streams>,
}

#[derive(Debug, Deserialize)]
struct Pool {
    size: u64,
    idle: u64,
    busy: u64,
    starting: u64,
    quitting: u64,
    queue_depth: u64,
    queue_capacity: u64,
    #[serde(default)]
    waiting_connections: u64,
    #[serde(default)]
    capped_connections: u64,
    respawns: u64,
    recycles: u64,
    fatal_exits: u64,
}

#[derive(Debug, Deserialize)]
struct Slot {
    slot: u32,
    pid: Option<u32>,
    state: String,
    requests: u64,
    age_s: f64,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    db_connection_id: Option<u64>,
    /// Requests written to the worker (prefetch), the current one included; absent before 1.4.
    #[serde(default)]
    pipeline: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Clients {
    connections: u64,
    open_streams: u64,
}

#[derive(Debug, Deserialize)]
struct Streams {
    opened: u64,
    closed: u64,
}

fn render_status(st: &Status) -> String {
    let p = &st.pool;
    let mut out = format!(
        "osprey {} (pid {}), up {:.1}s{}\n",
        st.version,
        st.pid,
        st.uptime_s,
        if st.draining { ", DRAINING" } else { "" }
    );
    out.push_str(&format!(
        "pool: size {} | idle {} | busy {} | starting {} | quitting {}\n",
        p.size, p.idle, p.busy, p.starting, p.quitting
    ));
    out.push_str(&format!(
        "queue: {}/{} from {} connections ({} at their worker cap) | respawns {} | recycles {} | fatal exits {}\n",
        p.queue_depth,
        p.queue_capacity,
        p.waiting_connections,
        p.capped_connections,
        p.respawns,
        p.recycles,
        p.fatal_exits
    ));
    if let Some(c) = &st.clients {
        out.push_str(&format!(
            "clients: {} connections, {} open streams\n",
            c.connections, c.open_streams
        ));
    }
    if let Some(s) = &st.streams {
        out.push_str(&format!("streams: {} opened, {} closed\n", s.opened, s.closed));
    }
    out.push('\n');
    let header: Vec<String> = [
        "slot", "pid", "state", "requests", "age", "backend", "db conn", "pipeline",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = st
        .slots
        .iter()
        .map(|s| {
            vec![
                s.slot.to_string(),
                s.pid.map_or_else(dash, |p| p.to_string()),
                s.state.clone(),
                s.requests.to_string(),
                format!("{:.1}s", s.age_s),
                s.backend.clone().unwrap_or_else(dash),
                s.db_connection_id.map_or_else(dash, |i| i.to_string()),
                s.pipeline.map_or_else(dash, |p| p.to_string()),
            ]
        })
        .collect();
    out.push_str(&render_table(&header, &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse() {
        assert_eq!(parse_param("null").unwrap(), Value::Null);
        assert_eq!(parse_param("int:-3").unwrap(), Value::Int(-3));
        assert_eq!(parse_param("hex:0xDEad").unwrap(), Value::Bytes(vec![0xde, 0xad]));
        assert_eq!(parse_param("str:null").unwrap(), Value::Text("null".into()));
        assert_eq!(parse_param("007").unwrap(), Value::Text("007".into()));
        assert!(parse_param("int:x").is_err());
    }

    #[test]
    fn table_is_aligned() {
        let t = render_table(
            &["id".into(), "name".into()],
            &[vec!["1".into(), "NULL".into()], vec!["100".into(), "bob".into()]],
        );
        assert_eq!(t, "id  | name\n----+-----\n1   | NULL\n100 | bob\n");
    }

    #[test]
    fn delay_renders_dble_columns() {
        let v = serde_json::json!({ "clusters": [
            { "cluster": "c1", "enabled": true, "source": "h:7400", "period_ms": 500, "threshold_ms": 1000,
              "primary": { "name": "p", "host": "10.0.0.1:3306", "status": "ok", "logic_timestamp": 42, "connection_id": 7 },
              "replicas": [
                { "name": "r1", "host": "10.0.0.2:3306", "delay_ms": 0, "wall_delay_ms": 3, "status": "ok",
                  "eligible": true, "last_active": 1, "connection_id": 9, "gtid_applied": "0-1-42", "message": null },
                { "name": "r2", "host": "10.0.0.3:3306", "delay_ms": null, "status": "timeout",
                  "eligible": false, "message": "no answer within 400 ms" } ] },
            { "cluster": "c2", "enabled": false } ] });
        let text = render_delay(&v);
        assert!(
            text.contains("heartbeat on p (10.0.0.1:3306): ok ts 42 conn 7"),
            "{text}"
        );
        let r1 = text.lines().find(|l| l.starts_with("r1")).unwrap();
        assert!(r1.contains("0-1-42") && r1.contains("true"), "{r1}");
        let r2 = text.lines().find(|l| l.starts_with("r2")).unwrap();
        assert!(r2.contains("timeout") && r2.contains("no answer within 400 ms"), "{r2}");
        assert!(text.contains("cluster c2: delay detection off"), "{text}");
    }

    #[test]
    fn status_renders_starting_slots() {
        let body = r#"{"version":"0.1.0","pid":123,"uptime_s":12.5,"draining":false,
           "pool":{"size":2,"idle":1,"busy":0,"starting":1,"quitting":0,"queue_depth":0,"queue_capacity":1024,"respawns":0,"recycles":0,"fatal_exits":0},
           "slots":[{"slot":0,"pid":4242,"state":"idle","requests":10,"age_s":3.2,"backend":"primary","db_connection_id":17,"pipeline":0},
                    {"slot":1,"pid":null,"state":"starting","requests":0,"age_s":0.0,"backend":"primary","db_connection_id":null}],
           "clients":{"connections":1,"open_streams":0},"streams":{"opened":10,"closed":10}}"#;
        let st: Status = serde_json::from_str(body).unwrap();
        let out = render_status(&st);
        assert!(out.contains("pool: size 2 | idle 1"), "{out}");
        assert!(out.contains("0    | 4242 | idle"), "{out}");
        assert!(out.contains("| 17      | 0"), "the pipeline figure: {out}");
        assert!(out.contains("1    | -    | starting"), "{out}");
    }
}
