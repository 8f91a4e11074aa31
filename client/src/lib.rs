//! What every client of a muster cluster needs, and nothing a server does:
//! the bearer credential and trace context every call carries ([`auth`]),
//! calls balanced over a service's replicas and reads tried again
//! ([`balance`]), TLS to `https://` URLs with certificates reloaded when
//! their files change ([`tls`]), JSON values and durations converted at the
//! wire ([`json`], [`time`]), the size limits of every request field checked
//! before sending ([`limits`]), the INVALID_ARGUMENT status that names a
//! field and the bound on a status's size ([`status`]), and W3C trace
//! context carried across calls and messages ([`trace`]).
//!
//! It does not serve: the server builder, the authentication layer, the tower
//! layer enforcing the limits, TLS on the server side, telemetry set-up and
//! databases are `muster-runtime`'s, which links this crate and re-exports
//! its modules where they were. A client (the worker library, `muster
//! agent`) links this crate alone, without SQLite, sqlx, axum or the OTLP
//! exporter.
#![forbid(unsafe_code)]

pub mod auth;
pub mod balance;
pub mod json;
pub mod limits;
pub mod observe;
pub mod schema;
pub mod status;
pub mod time;
pub mod tls;
pub mod trace;

/// Errors of the client library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings are wrong: a service URL that cannot be used, a token
    /// that cannot travel in metadata, TLS files that cannot be read.
    #[error("{0}")]
    Config(String),
}

/// The client library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
