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

use muster_proto::{
    execution::v1::execution_service_server::ExecutionServiceServer,
    notifier::v1::notifier_service_client::NotifierServiceClient,
};
use muster_runtime::{ServerArgs, db::Database};
use tokio::net::TcpListener;

pub use error::{Error, Result};
pub use grpc::ACCESS;

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
    let security = muster_runtime::security::Security::following_roster("execution", &config.server)?;
    let database = Database::connect_lazy(&config.database_url, config.database_max_connections)?;
    let store = store::Store::new(database);
    let roster = clients::RosterClient::new(security.channel(&config.server.auth.roster_url)?);
    let validator = clients::ValidatorClient::new(security.channel(&config.validator_url)?);
    let notifier = NotifierServiceClient::new(security.channel(&config.notifier_url)?);
    let lease = std::time::Duration::from_millis(config.worker_lease_ms.max(100));
    let engine = engine::Engine::new(store.clone(), roster, config.max_parallel_steps, lease);
    let api = grpc::ExecutionApi::new(engine.clone(), validator, security.agents().clone());
    let limit = config.server.max_message_bytes;

    let agents = security.agents().clone();
    let ready = async move {
        store.migrate().await?;
        engine.load_matrix().await?;
        // These run for the life of the process.
        tokio::spawn(outbox::publish(store.clone(), notifier, engine.outbox_wake.clone()));
        tokio::spawn(expire_silent_workers(engine.workers.clone(), lease));
        tokio::spawn(drop_revoked_agents(engine.workers.clone(), agents));
        tokio::spawn(follow_matrix(engine.clone()));
        let resumed = engine.resume_unfinished().await?;
        if resumed > 0 {
            tracing::info!(resumed, "resumed unfinished executions");
        }
        Ok::<(), muster_runtime::server::BoxError>(())
    };
    muster_runtime::Server::new(&config.server)
        .add_service(
            ExecutionServiceServer::new(api).max_decoding_message_size(limit).max_encoding_message_size(limit),
            grpc::ACCESS,
        )
        .serve(listener, &security, ready, shutdown)
        .await
}

/// Disconnects the workers silent past their lease.
async fn expire_silent_workers(workers: std::sync::Arc<workers::Workers>, lease: std::time::Duration) {
    let mut tick = tokio::time::interval(lease / 4);
    loop {
        tick.tick().await;
        workers.expire_silent(lease);
    }
}

/// Takes an agent from the workers serving it as soon as the token they
/// presented for it is revoked.
async fn drop_revoked_agents(workers: std::sync::Arc<workers::Workers>, agents: muster_runtime::auth::AgentDirectory) {
    let mut revocations = agents.revocations();
    loop {
        match revocations.recv().await {
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                workers.drop_revoked(|token| !agents.is_active(token));
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Picks up a permission matrix stored by another replica.
async fn follow_matrix(engine: std::sync::Arc<engine::Engine>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tick.tick().await;
        if let Err(error) = engine.load_matrix().await {
            tracing::warn!(%error, "reading the permission matrix failed");
        }
    }
}
