//! The client side: the TCP (and TLS) listener, one task per client connection,
//! and the per-stream closed-loop guard.

pub mod connection;
pub mod listen;
pub mod route;
pub mod streams;
pub mod tls;
