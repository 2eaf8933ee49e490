//! `osprey shell`: an interactive SQL prompt on one session, so that a person can try a
//! transaction by hand (`BEGIN`, a few statements, `COMMIT`) as in the mariadb client.
//! Statements end with `;` at the end of a line; results print as `osprey sql` prints
//! them. A session that ends without us (idle in a transaction, its worker lost) is said
//! so, with what became of the transaction, and a new one is opened for the next statement.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use osprey_client::{Client, ClientConfig, ErrorCode, Session, SessionOptions};

use crate::cli::{client_token, tls_config, Cli};
use crate::commands::sql::{print_error, print_result};

/// Where the next statement's lines come from: a line editor with history on a terminal,
/// plain lines otherwise (a script piped in).
enum Input {
    Editor(Box<rustyline::DefaultEditor>, Option<std::path::PathBuf>),
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    fn open() -> Input {
        if std::io::stdin().is_terminal() {
            if let Ok(mut ed) = rustyline::DefaultEditor::new() {
                let history = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".osprey_history"));
                if let Some(h) = &history {
                    let _ = ed.load_history(h);
                }
                return Input::Editor(Box::new(ed), history);
            }
        }
        Input::Lines(std::io::stdin().lock())
    }

    /// The next line (`None`: end of input).
    fn line(&mut self, prompt: &str) -> Option<String> {
        match self {
            Input::Editor(ed, _) => match ed.readline(prompt) {
                Ok(l) => Some(l),
                // Ctrl-C drops the line being typed, as the mariadb client does.
                Err(rustyline::error::ReadlineError::Interrupted) => Some(String::new()),
                Err(_) => None,
            },
            Input::Lines(lines) => {
                let mut l = String::new();
                match lines.read_line(&mut l) {
                    Ok(0) | Err(_) => None,
                    Ok(_) => Some(l.trim_end_matches(['\n', '\r']).to_owned()),
                }
            }
        }
    }

    fn remember(&mut self, statement: &str) {
        if let Input::Editor(ed, _) = self {
            let _ = ed.add_history_entry(statement);
        }
    }

    fn save(&mut self) {
        if let Input::Editor(ed, Some(h)) = self {
            let _ = ed.save_history(h);
        }
    }
}

/// Runs the prompt until `\q`, `quit`, `exit` or the end of input. Exit code 1 if the
/// last statement failed (as `mariadb < script` stops being 0 on an error).
pub fn run(cli: &Cli, read_only: bool) -> anyhow::Result<ExitCode> {
    let token = client_token(cli)?;
    let mut cfg = ClientConfig::new(cli.addr.clone(), token);
    cfg.tls = tls_config(cli)?;
    cfg.name = format!("osprey-shell[{}]", std::process::id());
    cfg.connection_wait = cfg.connect_timeout;
    cfg.cluster = cli.cluster.clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = rt.block_on(Client::connect(cfg))?;
    let interactive = std::io::stdin().is_terminal();
    let opts = SessionOptions {
        read_only,
        ..Default::default()
    };
    let mut session: Option<Session> = None;
    let mut input = Input::open();
    let mut pending = String::new();
    let mut failed = false;
    loop {
        let prompt = if pending.is_empty() { "osprey> " } else { "     -> " };
        let Some(line) = input.line(prompt) else { break };
        let trimmed = line.trim();
        if pending.is_empty() && matches!(trimmed, "\\q" | "quit" | "exit" | "quit;" | "exit;") {
            break;
        }
        if trimmed.is_empty() && pending.is_empty() {
            continue;
        }
        if !pending.is_empty() {
            pending.push('\n');
        }
        pending.push_str(&line);
        if !trimmed.ends_with(';') {
            continue;
        }
        let statement = std::mem::take(&mut pending);
        input.remember(&statement);
        let sql = statement.trim().trim_end_matches(';').trim().to_owned();
        if sql.is_empty() {
            continue;
        }
        if session.is_none() {
            match rt.block_on(client.session_with(opts.clone())) {
                Ok(s) => {
                    if interactive {
                        eprintln!("(session on {} slot {})", s.member(), s.slot());
                    }
                    session = Some(s);
                }
                Err(e) => {
                    print_error(&e);
                    failed = true;
                    continue;
                }
            }
        }
        let s = session.as_ref().expect("opened above");
        match rt.block_on(s.query(sql, &[])) {
            Ok(r) => {
                print_result(&r, false);
                failed = false;
            }
            Err(e) => {
                print_error(&e);
                failed = true;
                if e.code() == ErrorCode::SessionAborted {
                    eprintln!("(the session ended; the next statement opens a new one)");
                    session = None;
                }
            }
        }
        let _ = std::io::stdout().flush();
    }
    input.save();
    if let Some(s) = session {
        // An open transaction is rolled back, as when the mariadb client quits.
        if let Err(e) = rt.block_on(s.close()) {
            print_error(&e);
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
