//! What every muster service shares and nothing a single service owns:
//! typed configuration ([`config`]), logs and OpenTelemetry traces with W3C
//! trace context across calls ([`telemetry`]), the life of a service process
//! on a Tokio runtime whose idle threads give freed memory back ([`process`]),
//! the one gRPC server builder that adds health, reflection,
//! request spans, metrics and graceful shutdown to every service
//! ([`server`]; its admission of calls, none before the service is ready
//! and a bounded number at once: [`shed`]), the termination signal
//! ([`shutdown`]), database pools and migrations for SQLite and
//! PostgreSQL, SQLite write transactions run whole on the calling thread
//! and its log checkpointed off it ([`db`]),
//! Prometheus metrics
//! ([`metrics`]), and the convention by which a service's errors become gRPC
//! statuses ([`status`]), who is calling and what it may call ([`auth`],
//! with the service-to-service credentials of [`security`]), TLS and mutual
//! TLS ([`tls`]), files that hold secrets ([`files`]), the size limits of
//! every request field, checked on the wire ([`limits`]), and JSON values,
//! durations and the role model converted at the wire ([`json`], [`time`],
//! [`roles`]).
//!
//! What a client of the cluster needs too lives in `muster-client`, which
//! clients (the worker library) link without this crate's databases, HTTP
//! server and OTLP exporter: the credentials calls carry
//! ([`auth::client`], [`auth::error_info`]), balancing over replicas
//! ([`balance`]), the TLS settings and TLS to `https://` URLs ([`tls`]),
//! [`json`] and [`time`], the check of a request against the limits
//! ([`limits::check`]), the status naming a field and the bounds on a
//! status ([`status`]), and trace context propagation ([`telemetry`]'s
//! `extract`, `traceparent`, ...). This crate re-exports them where they
//! were; the server side of each (the authentication and limits layers, TLS
//! on the server) stays here.
//!
//! This crate is not deployable on its own; it holds no business logic.
#![forbid(unsafe_code)]

pub mod auth;
pub mod config;
pub mod db;
pub mod files;
pub mod limits;
pub mod metrics;
pub mod paging;
pub mod process;
pub mod roles;
pub mod security;
pub mod server;
pub mod shed;
pub mod shutdown;
pub mod status;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod timeouts;
pub mod tls;

pub use muster_client::{balance, json, time};

/// The allocator every muster binary uses (`#[global_allocator] static
/// ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;`):
/// mimalloc, whose per-thread free lists spare the services the arena locks
/// and chunk consolidation of glibc's malloc on their hot paths. The
/// services' runtime makes its threads give what they freed back to the
/// system when they go idle ([`process::serve`]).
pub use muster_allocator::Allocator;

pub use config::ServerArgs;
pub use server::Server;

/// Errors of the runtime itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be reached or migrated.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A transaction on a SQLite file's native connection failed.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Migrations failed.
    #[error("migration: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// A database URL names a backend muster does not support.
    #[error("unsupported database URL {0:?}: use sqlite:// or postgres://")]
    UnsupportedDatabase(String),
    /// The settings of a client of another service are wrong: a service
    /// URL, a token, TLS files ([`muster_client::Error`]).
    #[error(transparent)]
    Client(#[from] muster_client::Error),
    /// The gRPC server failed.
    #[error("server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reading or writing a file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The service's readiness check failed.
    #[error("not ready: {0}")]
    NotReady(String),
    /// Logging or reflection could not be set up.
    #[error("setup: {0}")]
    Telemetry(String),
    /// The settings are wrong: a file that cannot be parsed, a missing credential.
    #[error("{0}")]
    Config(String),
    /// The service stopped because another process took its work over
    /// (a replica that lost its lease).
    #[error("{0}")]
    Deposed(String),
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
