//! The admin API's HTTP client: one request to the dispatcher's admin address with the
//! bearer token, a non-2xx answer reported on stderr.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};

/// The dispatcher's admin API: its address (`host:port` or a URL) and the admin token.
pub struct Admin {
    addr: String,
    token: String,
}

impl Admin {
    pub fn new(addr: &str, token: String) -> Admin {
        Admin {
            addr: addr.to_owned(),
            token,
        }
    }

    /// One request. `Err(code)`: the API answered with an error, reported on stderr;
    /// `Ok`: the body of its 2xx answer.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        json: Option<serde_json::Value>,
    ) -> anyhow::Result<Result<String, ExitCode>> {
        let (code, body) = http(&self.addr, method, path, &self.token, json)?;
        if !(200..300).contains(&code) {
            eprintln!("admin API answered HTTP {code}: {}", body.trim());
            return Ok(Err(ExitCode::FAILURE));
        }
        Ok(Ok(body))
    }

    /// One request whose answer is JSON. `Err(code)`: nothing left to do (an HTTP error
    /// was reported, or the raw body was printed for `--json`); `Ok`: the JSON body to
    /// render.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        raw: bool,
    ) -> anyhow::Result<Result<serde_json::Value, ExitCode>> {
        let text = match self.send(method, path, body)? {
            Ok(text) => text,
            Err(code) => return Ok(Err(code)),
        };
        if raw {
            println!("{}", text.trim());
            return Ok(Err(ExitCode::SUCCESS));
        }
        Ok(Ok(serde_json::from_str(&text).context("unexpected admin API body")?))
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

/// `s` as one URL path segment or query value.
pub fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
