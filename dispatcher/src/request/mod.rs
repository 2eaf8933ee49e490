//! One client request on its way: the stream it opens on its client connection, the
//! guard that closes its loop whatever happens, and the job that carries it to a worker.
//! Neutral ground: the client front end creates them, the pool and the relay carry them,
//! and neither imports the other for it.

pub mod clients;
pub mod job;
pub mod session;
pub mod streams;
