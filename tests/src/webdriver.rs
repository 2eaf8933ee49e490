//! A real headless browser for the operations page's tests: Debian's `chromium`, driven
//! by its `chromedriver` over the W3C WebDriver protocol (plain HTTP + JSON, through
//! `ureq`), and the DevTools commands chromedriver passes on (`goog/cdp/execute`) for the
//! screen size and full-page screenshots.
//!
//! A small client of our own rather than a WebDriver crate: the handful of commands the
//! tests use are a few lines each on the HTTP client the harness already has, and need no
//! async HTTP stack of their own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine;
use serde_json::{json, Value as Json};

/// The key W3C WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where chromium and chromedriver are: `OSPREY_CHROMIUM` / `OSPREY_CHROMEDRIVER`, or
/// Debian's places. `None` when either is missing.
pub fn find_chromium() -> Option<(PathBuf, PathBuf)> {
    let pick = |var: &str, places: &[&str]| -> Option<PathBuf> {
        std::env::var_os(var)
            .map(PathBuf::from)
            .into_iter()
            .chain(places.iter().map(PathBuf::from))
            .find(|p| p.is_file())
    };
    let browser = pick(
        "OSPREY_CHROMIUM",
        &[
            "/usr/lib/chromium/chromium",
            "/usr/bin/chromium",
            "/usr/bin/chromium-browser",
        ],
    )?;
    let driver = pick(
        "OSPREY_CHROMEDRIVER",
        &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"],
    )?;
    Some((browser, driver))
}

/// One chromedriver process and one browser session in it. Both end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless chromium session in it, with a
    /// `width`×`height` viewport.
    pub fn start(browser: &Path, driver: &Path, width: u32, height: u32) -> anyhow::Result<Browser> {
        let port = crate::harness::free_addr().port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", driver.display()))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let profile = tempfile::Builder::new().prefix("osprey-chromium-").tempdir()?;
        let mut b = Browser {
            driver: child,
            base: format!("http://127.0.0.1:{port}"),
            agent,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ready = b
                .agent
                .get(&format!("{}/status", b.base))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_json::<Json>().ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("chromedriver not ready within 15 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {
                "binary": browser.display().to_string(),
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                    format!("--user-data-dir={}", b._profile.path().display()),
                    format!("--window-size={width},{height}"),
                ],
            },
        }}});
        let v = b.raw("POST", "/session", Some(caps))?;
        let id = v["sessionId"].as_str().context("no sessionId in the new session")?;
        b.base = format!("{}/session/{id}", b.base);
        b.viewport(width, height)?;
        Ok(b)
    }

    fn raw(&self, method: &str, path: &str, body: Option<Json>) -> anyhow::Result<Json> {
        let url = format!("{}{path}", self.base);
        let mut resp = match method {
            "GET" => self.agent.get(&url).call()?,
            "DELETE" => self.agent.delete(&url).call()?,
            _ => self.agent.post(&url).send_json(body.unwrap_or_else(|| json!({})))?,
        };
        let status = resp.status().as_u16();
        let v: Json = resp.body_mut().read_json()?;
        if status != 200 {
            bail!("WebDriver {method} {path}: HTTP {status}: {}", v["value"]);
        }
        Ok(v["value"].clone())
    }

    /// A WebDriver command of this session.
    pub fn cmd(&self, method: &str, path: &str, body: Option<Json>) -> anyhow::Result<Json> {
        self.raw(method, path, body)
    }

    fn cdp(&self, cmd: &str, params: Json) -> anyhow::Result<Json> {
        self.cmd("POST", "/goog/cdp/execute", Some(json!({"cmd": cmd, "params": params})))
    }

    pub fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).map(drop)
    }

    /// Runs `body` (a function body: `return …`) in the page with `args`.
    pub fn eval(&self, body: &str, args: Json) -> anyhow::Result<Json> {
        self.cmd("POST", "/execute/sync", Some(json!({"script": body, "args": args})))
    }

    /// The page's viewport as a screen of `width`×`height` CSS pixels (a phone width
    /// is emulated as a mobile screen).
    pub fn viewport(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600}),
        )
        .map(drop)
    }

    /// The whole page (beyond the viewport) as a PNG at `path`.
    pub fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        let v = self.cdp(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        )?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v["data"].as_str().context("no screenshot data")?)
            .context("screenshot is not base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    fn element(&self, css: &str) -> anyhow::Result<String> {
        let v = self
            .cmd("POST", "/element", Some(json!({"using": "css selector", "value": css})))
            .with_context(|| format!("finding {css}"))?;
        Ok(v[ELEMENT].as_str().context("no element reference")?.to_owned())
    }

    pub fn click(&self, css: &str) -> anyhow::Result<()> {
        let id = self.element(css)?;
        self.cmd("POST", &format!("/element/{id}/click"), None)
            .with_context(|| format!("clicking {css}"))
            .map(drop)
    }

    pub fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let id = self.element(css)?;
        self.cmd("POST", &format!("/element/{id}/clear"), None)?;
        self.cmd("POST", &format!("/element/{id}/value"), Some(json!({ "text": text })))
            .map(drop)
    }

    /// Accepts the open `confirm()` (waiting up to `limit` for it) and returns its text.
    pub fn accept_prompt(&self, limit: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(text) = self.cmd("GET", "/alert/text", None) {
                self.cmd("POST", "/alert/accept", None)?;
                return Ok(text.as_str().unwrap_or_default().to_owned());
            }
            if Instant::now() > deadline {
                bail!("no confirm() opened within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.raw("DELETE", "", None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
