//! A MySQL/MariaDB client session built on `mysql_common`'s raw protocol, made for
//! **pipelining**: several `COM_QUERY` / `COM_STMT_EXECUTE` commands written before their
//! responses are read, which the server answers in order.
//!
//! ```no_run
//! # async fn demo() -> Result<(), osprey_wire::Error> {
//! use osprey_wire::{Event, Opts, Session};
//! let mut s = Session::connect(&Opts::new("127.0.0.1", 3306, "app", "secret").database("db")).await?;
//! s.send_query("SELECT 1")?;
//! s.send_query("SELECT 2")?;
//! for _ in 0..2 {
//!     loop {
//!         match s.next_event().await? {
//!             Event::Columns(cols) => println!("{} columns", cols.len()),
//!             Event::Row(row) => println!("{:?}", row.unwrap()),
//!             // Only for a command marked with `Session::raw_rows`.
//!             Event::RawRow(packet) => println!("{} bytes", packet.len()),
//!             Event::End { more_results: false, .. } => break,
//!             Event::End { .. } => {}
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Rules of the pipeline:
//! - Responses come back in the order the commands were sent; read each to its end
//!   ([`Event::End`] with `more_results == false`, or an error) before the next one's begin.
//! - A server error ([`Error::Server`]) ends only its own command's response.
//! - The write buffer is not bounded here: the caller bounds how many commands it writes
//!   ahead. Reading drains the write buffer too, so a large pipeline cannot deadlock with
//!   a server that waits for us to read.
//! - Round trips ([`Session::prepare`] on a cache miss, [`Session::ping`],
//!   [`Session::reset_connection`], [`Session::change_user`]) are refused while responses
//!   are pending.
//! - A LOCAL INFILE request is answered with an empty file when nothing is pipelined behind
//!   it; with commands behind it the session is broken (the server would read them as
//!   the file), so such statements must not be pipelined.
//! - Any I/O or protocol error is fatal ([`Error::is_fatal`]); the session then refuses
//!   every call with [`Error::Broken`].
//!
//! What it keeps from the worker's `mysql_async` session: the same capabilities
//! (multi-statements and multi-results, session tracking, DEPRECATE_EOF, LOCAL INFILE
//! answered with an empty file), utf8mb4 (collation 45), `mysql_native_password` and
//! `caching_sha2_password` (full authentication over TLS only), the TLS modes, a prepared
//! statement cache of [`STMT_CACHE_SIZE`], and the same decoded values (`mysql_common`'s).
//! Not supported: compression, the MariaDB extended capabilities (metadata caching, bulk
//! execute), cursors, Unix sockets, client certificates.

#![deny(missing_docs)]

mod error;
mod handshake;
mod io;
mod opts;
mod parse;
mod session;
mod stmt;
mod tls;

pub use error::{Error, Result, ServerError};
pub use opts::{Opts, SslMode, TlsOpts};
pub use session::{Event, Session, STMT_CACHE_SIZE};
pub use stmt::Statement;

pub use mysql_common;
pub use mysql_common::constants::{ColumnFlags, ColumnType, StatusFlags};
pub use mysql_common::packets::{Column, OkPacket};
pub use mysql_common::row::Row;
pub use mysql_common::value::Value;
