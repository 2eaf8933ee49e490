//! The MySQL protocol's server side as bytes, with no I/O (the dispatcher's
//! `src/mysql/` owns the sockets and the decisions; docs/MYSQL.md is the contract):
//!
//! - `codec.rs`: a checked reading cursor, length-encoded integers and strings;
//! - `handshake.rs`: the greeting (handshake v10), the capabilities offered, the client's
//!   handshake response read;
//! - `reply.rs`: OK, ERR, EOF, column definitions, text rows, and the table from Osprey's
//!   error codes to MySQL's;
//! - `prepared.rs`: a connection's prepared statements (ids, remembered parameter types,
//!   long data), `COM_STMT_EXECUTE` read, binary rows written;
//! - `state.rs`: what is kept per client (database, tracked variables, autocommit) and
//!   what a statement's text says about pinning;
//! - `text.rs`: query text made UTF-8 (binary strings as hex literals).
//!
//! Every input path returns an error for bad bytes and never panics: the `mysql_packets`
//! fuzz target (fuzz/) checks it.

pub mod codec;
pub mod handshake;
pub mod prepared;
pub mod reply;
pub mod state;
pub mod text;
