//! `osprey sql`: one statement through the SDK, its result printed as a table or as JSON
//! lines, an error with its origin, code and whether it reached a database.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use osprey_client::{display_value, Client, ClientConfig, Error, QueryResult, Request, RequestExt, Value};

use crate::cli::{client_token, tls_config, Cli};
use crate::render::table::render_table;

/// Runs `sql` with `params` (as --param spells them) and prints its result.
pub fn run(
    cli: &Cli,
    sql: &str,
    json: bool,
    params: &[String],
    timeout: Option<f64>,
    primary: bool,
) -> anyhow::Result<ExitCode> {
    let token = client_token(cli)?;
    let params = params
        .iter()
        .map(|p| parse_param(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut cfg = ClientConfig::new(cli.addr.clone(), token);
    cfg.tls = tls_config(cli)?;
    cfg.name = format!("osprey-cli[{}]", std::process::id());
    cfg.connection_wait = cfg.connect_timeout;
    cfg.request_timeout = timeout.map(Duration::from_secs_f64);
    cfg.cluster = cli.cluster.clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = rt.block_on(async move {
        let client = Client::connect(cfg).await?;
        let request = Request::sql(sql).with_params(params).with_force_primary(primary);
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

/// One --param: text by default; `null`, `int:N`, `uint:N`, `float:X`, `str:TEXT`, `hex:BYTES`.
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

pub fn print_error(e: &Error) {
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

pub fn print_result(r: &QueryResult, json: bool) {
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
}
