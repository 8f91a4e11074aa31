//! The execution service: it owns processes and their versions, executions
//! and their steps, the event history and the outbox of events bound for the
//! notifier. It runs each execution as a DAG (independent steps in parallel,
//! a failed step failing its dependants), finds each step's executor (named,
//! or decided by the roster's `Delegate`), hands steps to agent workers
//! connected over a bidirectional stream, records every state change with its
//! event in one transaction, and resumes unfinished executions after a restart.
//!
//! It does not own agents or roles (the roster does), validation rules (the
//! validator does; the execution service asks it, with the roster as context)
//! or notifications (the notifier does).
#![forbid(unsafe_code)]

mod clients;
mod domain;
mod engine;
mod error;
mod grpc;
mod outbox;
mod store;
mod workers;

use std::{future::Future, net::SocketAddr};

use muster_proto::execution::v1::execution_service_server::ExecutionServiceServer;
use muster_runtime::{ServerArgs, db::Database};
use tokio::net::TcpListener;

pub use error::{Error, Result};

/// The port the execution service listens on by default.
pub const DEFAULT_PORT: u16 = 50051;

/// The execution service's configuration.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "muster-execution", version, about = "muster's execution service")]
pub struct Config {
    /// Settings shared by every service.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Where executions are stored: sqlite://FILE or postgres://...
    #[arg(long, env = "MUSTER_DATABASE_URL", default_value = "sqlite://muster-data/execution.db")]
    pub database_url: String,
    /// Most database connections (PostgreSQL).
    #[arg(long, env = "MUSTER_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,
    /// The roster service.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value = "http://127.0.0.1:50052")]
    pub roster_url: String,
    /// The validator service.
    #[arg(long, env = "MUSTER_VALIDATOR_URL", default_value = "http://127.0.0.1:50053")]
    pub validator_url: String,
    /// The notifier service.
    #[arg(long, env = "MUSTER_NOTIFIER_URL", default_value = "http://127.0.0.1:50054")]
    pub notifier_url: String,
    /// A worker silent (no message, no heartbeat) for longer than this, in
    /// milliseconds, loses its connection and its assignments.
    #[arg(long, env = "MUSTER_WORKER_LEASE_MS", default_value_t = 30_000)]
    pub worker_lease_ms: u64,
    /// Most steps of one execution running at once, unless the process sets `max_parallel`.
    #[arg(long, env = "MUSTER_MAX_PARALLEL_STEPS", default_value_t = 16)]
    pub max_parallel_steps: usize,
}

impl Config {
    /// The address to listen on.
    pub fn listen_address(&self) -> SocketAddr {
        self.server.listen_or(SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))
    }
}

/// Serves the execution service on `listener` until `shutdown` resolves.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::result::Result<(), muster_runtime::Error> {
    let database = Database::connect_lazy(&config.database_url, config.database_max_connections)?;
    let store = store::Store::new(database);
    let invalid_url = |error: Error| muster_runtime::Error::NotReady(error.to_string());
    let roster = clients::RosterClient::new(clients::lazy_channel(&config.roster_url).map_err(invalid_url)?);
    let validator = clients::ValidatorClient::new(clients::lazy_channel(&config.validator_url).map_err(invalid_url)?);
    lazy_check_url(&config.notifier_url).map_err(invalid_url)?;
    let lease = std::time::Duration::from_millis(config.worker_lease_ms.max(100));
    let engine = engine::Engine::new(store.clone(), roster, config.max_parallel_steps, lease);
    let api = grpc::ExecutionApi::new(engine.clone(), validator);
    let limit = config.server.max_message_bytes;

    let notifier_url = config.notifier_url.clone();
    let ready = async move {
        store.migrate().await?;
        let publisher = tokio::spawn(outbox::publish(store.clone(), notifier_url, engine.outbox_wake.clone()));
        drop(publisher); // runs for the life of the process
        let workers = engine.workers.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(lease / 4);
            loop {
                tick.tick().await;
                workers.expire_silent(lease);
            }
        });
        let resumed = engine.resume_unfinished().await?;
        if resumed > 0 {
            tracing::info!(resumed, "resumed unfinished executions");
        }
        Ok::<(), muster_runtime::server::BoxError>(())
    };
    muster_runtime::Server::new(&config.server)
        .add_service(ExecutionServiceServer::new(api).max_decoding_message_size(limit).max_encoding_message_size(limit))
        .serve(listener, ready, shutdown)
        .await
}

fn lazy_check_url(url: &str) -> Result<()> {
    clients::lazy_channel(url).map(drop)
}
