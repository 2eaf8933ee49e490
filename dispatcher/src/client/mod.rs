//! The client side: the TCP (and TLS) listener and one task per client connection
//! (the streams it opens and their closed-loop guard live in `crate::request`).

pub mod connection;
pub mod listen;
pub mod tls;
