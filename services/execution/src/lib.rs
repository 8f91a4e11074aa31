//! The execution service: it owns processes and their versions, executions
//! and their steps, and the log of their events. It runs each execution as a
//! DAG (independent steps in parallel, a failed step failing its
//! dependants), finds each step's executor (named, or decided by the
//! roster's `Delegate`), hands steps to agent workers connected over a
//! bidirectional stream, records every state change with its events in one
//! transaction, streams the log to the notifier, and resumes unfinished
//! executions after a restart. Several replicas may share one PostgreSQL
//! database: each drives the executions it holds a lease on, and the others
//! take them over when it dies or stops. It also starts runs by itself (inboxes,
//! schedules, the roles of the roster that run on their own) within budgets
//! and throttles, and keeps what runs remember (memory).
//!
//! It does not own agents or roles (the roster does) or notifications (the
//! notifier does). The document formats and their rules are the
//! `muster-format` library's; a process is checked once, when it is
//! published, and kept as its checked model.
//!
//! The layers: [`grpc`](crate) turns wire requests into calls of the
//! engine and errors into statuses; the engine (`engine/`) drives
//! executions with domain types (`domain/`) only; storage sits behind the
//! `Store` trait (`store/`), the roster behind the `Roster` trait
//! (`clients/`).
#![forbid(unsafe_code)]

mod clients;
mod engine;
mod grpc;

// The domain types, the errors and the store are the service's own; the
// `testing` feature opens them to the store conformance suite
// (`tests/store_conformance/`), which holds SQLite and PostgreSQL to one
// behaviour from outside the crate.
#[cfg(feature = "testing")]
#[expect(missing_docs, reason = "fields and variants are named for what they hold; the types say what they are")]
pub mod domain;
#[cfg(not(feature = "testing"))]
#[expect(unreachable_pub, reason = "public under the `testing` feature only")]
mod domain;
#[cfg(feature = "testing")]
pub mod error;
#[cfg(not(feature = "testing"))]
#[expect(unreachable_pub, reason = "public under the `testing` feature only")]
mod error;
#[cfg(feature = "testing")]
#[expect(missing_docs, reason = "fields and variants are named for what they hold; the types say what they are")]
pub mod store;
#[cfg(not(feature = "testing"))]
#[expect(unreachable_pub, reason = "public under the `testing` feature only")]
mod store;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use muster_proto::{
    execution::v1::framed::execution_service_server::ExecutionServiceServer,
    notifier::v1::framed_client::notifier_service_client::NotifierServiceClient,
};
use muster_runtime::ServerArgs;
use tokio::net::TcpListener;

pub(crate) use error::{Error, Result};
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
    /// Most database connections of the engine's writes (PostgreSQL).
    #[arg(long, env = "MUSTER_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,
    /// Connections of their own for reads (GetExecution, ListExecutions,
    /// WatchExecution's history...), so that reads never take the engine's.
    #[arg(long, env = "MUSTER_DATABASE_READERS", default_value_t = 4)]
    pub database_readers: u32,
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
    /// How long a step may wait for a worker to take it, in seconds, unless
    /// it sets `schedule_to_start_seconds`; 0 waits as long as it takes.
    #[arg(long, env = "MUSTER_SCHEDULE_TO_START_SECONDS", default_value_t = 600)]
    pub schedule_to_start_seconds: u64,
    /// How long, in milliseconds, a replica's hold on the executions it
    /// drives lasts without renewal (renewed every third of it): when a
    /// replica dies, another takes its executions over within about this
    /// time. A replica that cannot renew in time stops.
    #[arg(long, env = "MUSTER_REPLICA_LEASE_MS", default_value_t = 10_000)]
    pub replica_lease_ms: u64,
    /// This replica's stable identity (a StatefulSet's pod name, or
    /// `execution-0` under `muster up`): letters, digits, `-`, `_` and `.`,
    /// at most 63. A replica that starts again with the identity it had
    /// takes its executions back at once, rather than waiting for its old
    /// lease to lapse; its previous incarnation, should it still live, can
    /// no longer write. Two live replicas must never share one. Empty: a
    /// new identity at each start (the host name and a random suffix).
    #[arg(long, env = "MUSTER_REPLICA_ID", default_value = "")]
    pub replica_id: String,
    /// The URL the other replicas reach this one at, to hand it the calls
    /// about the executions it drives (approvals, interventions, roles,
    /// cancellation), e.g. http://$(POD_IP):50051. Empty: the address it
    /// listens on, when that names one host.
    #[arg(long, env = "MUSTER_REPLICA_URL", default_value = "")]
    pub replica_url: String,
    /// The IP address the other replicas connect to when MUSTER_REPLICA_URL
    /// names a Service rather than this replica (under TLS, whose
    /// certificates name the Services): e.g. $(POD_IP). The connection goes
    /// there and TLS still verifies the URL's host. Empty: where the URL's
    /// host leads.
    #[arg(long, env = "MUSTER_REPLICA_ADDRESS", default_value = "")]
    pub replica_address: String,
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
    let store: Arc<dyn store::Store> = Arc::new(store::SqlStore::connect(
        &config.database_url,
        config.database_max_connections,
        config.database_readers,
    )?);
    let roster = Arc::new(clients::roster::RosterClient::new(security.channel(&config.server.auth.roster_url)?));
    let notifier = NotifierServiceClient::new(security.channel(&config.notifier_url)?);
    let lease = Duration::from_millis(config.worker_lease_ms.max(100));
    let settings = engine::Settings {
        max_parallel: config.max_parallel_steps,
        worker_lease: lease,
        schedule_to_start: (config.schedule_to_start_seconds > 0)
            .then(|| Duration::from_secs(config.schedule_to_start_seconds)),
        ownership_lease: Duration::from_millis(config.replica_lease_ms.max(300)),
        replica_identity: replica_identity(&config.replica_id)?,
    };
    let engine = engine::Engine::new(store.clone(), Arc::new(clients::batched::Batched::new(roster.clone())), settings);
    let measured = Arc::downgrade(&engine);
    muster_runtime::metrics::collect_on_render(move || {
        let Some(engine) = measured.upgrade() else { return false };
        muster_runtime::metrics::set(
            "muster_execution_steps_waiting_for_worker",
            "Steps whose executor is chosen and that wait for a connected worker with room",
            &[],
            engine.workers.waiting() as f64,
        );
        muster_runtime::metrics::set(
            "muster_execution_workers",
            "Connected workers",
            &[],
            engine.workers.count() as f64,
        );
        muster_runtime::metrics::set(
            "muster_executions_running",
            "Executions this replica drives now (started and not ended)",
            &[],
            engine.running() as f64,
        );
        true
    });
    let limit = config.server.max_message_bytes;
    let api = grpc::ExecutionGrpc::new(engine.clone(), security.clone(), limit);
    let relays = api.relays();
    let replica_url = match (config.replica_url.as_str(), listener.local_addr()) {
        ("", Ok(address)) if !address.ip().is_unspecified() => {
            let scheme = if security.server_tls.is_some() { "https" } else { "http" };
            format!("{scheme}://{address}")
        }
        (url, _) => url.to_owned(),
    };

    if !config.replica_address.is_empty() && config.replica_address.parse::<std::net::IpAddr>().is_err() {
        return Err(muster_runtime::Error::Config(format!(
            "MUSTER_REPLICA_ADDRESS={:?} is not an IP address",
            config.replica_address
        )));
    }
    let replica_address = config.replica_address.clone();
    let agents = security.agents().clone();
    let started = engine.clone();
    let ready = async move {
        store.migrate().await?;
        started.join(&replica_url, &replica_address).await?;
        started.spawn(started.clone().keep_lease());
        started.load_matrix().await?;
        started.load_agent_budgets().await?;
        // These run for the life of the engine.
        started.spawn(clients::notifier::publish(store.clone(), notifier, started.log_wake.clone()));
        started.spawn(clients::notifier::measure_outbox(store.clone()));
        started.spawn(expire_silent_workers(started.clone(), lease));
        started.spawn(drop_revoked_agents(started.clone(), agents));
        started.spawn(follow_matrix(started.clone()));
        started.spawn(started.clone().run_schedules());
        started.spawn(started.clone().follow_roles(roster));
        let resumed = started.adopt().await?;
        if resumed > 0 {
            tracing::info!(resumed, "resumed unfinished executions");
        }
        started.spawn(started.clone().adopt_orphans());
        started.spawn(relays.follow_peers());
        // Messages posted while no run could start (the service stopped) start one now.
        if let Err(error) = started.trigger_waiting_inboxes().await {
            tracing::warn!(%error, "could not start the runs of waiting inbox messages");
        }
        Ok::<(), muster_runtime::server::BoxError>(())
    };
    let served = muster_runtime::Server::new(&config.server)
        .add_service(
            ExecutionServiceServer::new(api).max_decoding_message_size(limit).max_encoding_message_size(limit),
            grpc::ACCESS,
        )
        .serve(listener, &security, ready, shutdown_or_deposed(shutdown, engine.deposed.clone()))
        .await;
    if engine.deposed.is_cancelled() {
        // Its drivers may wait on a database that does not answer (a cut
        // network), which refuses what they would commit anyway: a second.
        if tokio::time::timeout(Duration::from_secs(1), engine.shutdown()).await.is_err() {
            tracing::warn!("the executions' drivers did not stop within a second; leaving them");
        }
    } else {
        engine.shutdown().await;
    }
    if engine.deposed.is_cancelled() {
        return Err(muster_runtime::Error::Deposed(format!(
            "replica {} lost its lease on its executions (another replica takes them over)",
            engine.replica
        )));
    }
    served
}

/// A stable replica identity, checked: it names the replica in the store
/// and in logs, before the incarnation's suffix.
fn replica_identity(identity: &str) -> std::result::Result<String, muster_runtime::Error> {
    let allowed = |character: char| character.is_ascii_alphanumeric() || matches!(character, '-' | '_' | '.');
    if identity.len() > 63 || !identity.chars().all(allowed) {
        return Err(muster_runtime::Error::Config(format!(
            "MUSTER_REPLICA_ID={identity:?} is not a replica identity: at most 63 letters, digits, '-', '_' and '.'"
        )));
    }
    Ok(identity.to_owned())
}

/// Resolves on `shutdown`, or when the replica lost its lease.
async fn shutdown_or_deposed(
    shutdown: impl Future<Output = ()> + Send + 'static,
    deposed: tokio_util::sync::CancellationToken,
) {
    tokio::select! {
        () = shutdown => {}
        () = deposed.cancelled() => {}
    }
}

/// Disconnects the workers silent past their lease.
async fn expire_silent_workers(engine: Arc<engine::Engine>, lease: Duration) {
    let mut tick = tokio::time::interval(lease / 4);
    loop {
        tick.tick().await;
        engine.workers.expire_silent(lease);
    }
}

/// Takes an agent from the workers serving it as soon as the token they
/// presented for it is revoked.
async fn drop_revoked_agents(engine: Arc<engine::Engine>, agents: muster_runtime::auth::AgentDirectory) {
    let mut revocations = agents.revocations();
    loop {
        match revocations.recv().await {
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                engine.workers.drop_revoked(|token| !agents.is_active(token));
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Picks up a permission matrix stored by another replica.
async fn follow_matrix(engine: Arc<engine::Engine>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        if let Err(error) = engine.load_matrix().await {
            tracing::warn!(%error, "reading the permission matrix failed");
        }
        if let Err(error) = engine.load_agent_budgets().await {
            tracing::warn!(%error, "reading the agents' budgets failed");
        }
    }
}
