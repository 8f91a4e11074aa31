//! The roster service: the organisation muster's agents belong to.
//!
//! It owns agents (identity, role, team, senior, expertise, status, workload
//! and capacity, credentials), teams, role definitions, the delegation
//! decisions (with the atomic reservation of workload slots, the queue for busy
//! experts, escalation of stale queued tasks and the audit trail), roster
//! import from YAML and Markdown, and the rendering of agents' system prompts.
//!
//! Decisions and the organisation's views are read from the organisation
//! held in memory, indexed by team and expertise (`store/sql/index.rs`); the
//! database keeps the truth and takes each slot in one conditional update,
//! so no slot is ever given twice, even by replicas sharing a database.
//!
//! It does not run anything: executions, steps, tools and notifications belong
//! to the execution and notifier services, which ask the roster who should
//! take a task (`Delegate`), give the slot back (`ReleaseTask`) and who a
//! token belongs to (`Authenticate`).
#![forbid(unsafe_code)]

pub mod clock;
pub mod domain;
pub mod error;
mod grpc;
pub mod store;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use muster_proto::roster::v1::{
    credential_service_server::CredentialServiceServer, roster_service_server::RosterServiceServer,
};
use muster_runtime::{ServerArgs, auth::watch::CredentialStream};

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, Result};
pub use grpc::{ACCESS, CREDENTIAL_ACCESS, RosterGrpc};
use store::{SqlStore, Store};

/// The roster's default port.
pub const DEFAULT_PORT: u16 = 50052;

/// The roster's default listen address: every interface, like the other services.
pub fn default_listen_address() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))
}

/// The roster's settings.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "muster-roster", version, about = "muster's roster service")]
pub struct Config {
    /// Settings every service shares.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Database URL: `sqlite://path` or `postgres://...`.
    #[arg(long, env = "MUSTER_DATABASE_URL", default_value = "sqlite://muster-data/roster.db")]
    pub database_url: String,
    /// Most database connections (PostgreSQL; SQLite uses one).
    #[arg(long, env = "MUSTER_DATABASE_MAX_CONNECTIONS", default_value_t = 10)]
    pub database_max_connections: u32,
    /// Assumed duration of one task, in seconds, for queue wait estimates.
    #[arg(long, env = "MUSTER_ROSTER_AVERAGE_TASK_SECONDS", default_value_t = 1800)]
    pub average_task_seconds: u64,
    /// How often stale queued tasks are looked for, in milliseconds.
    #[arg(long, env = "MUSTER_ROSTER_QUEUE_SWEEP_INTERVAL_MS", default_value_t = 5000)]
    pub queue_sweep_interval_ms: u64,
    /// How often the organisation held in memory takes the changes other
    /// replicas made to the database, in milliseconds.
    #[arg(long, env = "MUSTER_ROSTER_INDEX_REFRESH_INTERVAL_MS", default_value_t = 1000)]
    pub index_refresh_interval_ms: u64,
}

impl Config {
    /// Settings with every default and this database (for tests and embedding).
    pub fn with_database(database_url: impl Into<String>) -> Self {
        Self {
            server: ServerArgs::default(),
            database_url: database_url.into(),
            database_max_connections: 10,
            average_task_seconds: 1800,
            queue_sweep_interval_ms: 5000,
            index_refresh_interval_ms: 1000,
        }
    }

    /// The delegation framework's settings.
    pub fn delegation_settings(&self) -> domain::delegation::Settings {
        domain::delegation::Settings {
            average_task_millis: i64::try_from(self.average_task_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
        }
    }
}

/// Serves the roster on `listener` until `shutdown` resolves, with the system clock.
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    run_with_clock(config, listener, shutdown, Arc::new(SystemClock)).await
}

/// Serves the roster with a given clock (tests move a [`ManualClock`]).
pub async fn run_with_clock(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    clock: Arc<dyn Clock>,
) -> Result<()> {
    let store = SqlStore::connect(&config.database_url, config.database_max_connections)?;
    let roster = RosterGrpc::new(store, clock, config.delegation_settings());
    // The roster checks agent tokens against its own copy of the
    // credentials, fed from its database once migrated.
    let directory = roster.directory().clone();
    let security = muster_runtime::security::Security::with_directory("roster", &config.server, directory.clone())?;
    let (ready_sender, ready_receiver) = tokio::sync::watch::channel(false);
    let (stop_sender, stop_receiver) = tokio::sync::watch::channel(false);
    let sweeper = tokio::spawn(background(
        roster.clone(),
        Duration::from_millis(config.queue_sweep_interval_ms.max(10)),
        Duration::from_millis(config.index_refresh_interval_ms.max(10)),
        ready_receiver,
        stop_receiver,
    ));
    let migrating = roster.clone();
    let (follower_sender, follower) = tokio::sync::oneshot::channel();
    let ready = async move {
        migrating.store().migrate().await.map_err(|error| Box::new(error) as muster_runtime::server::BoxError)?;
        let _ = follower_sender
            .send(muster_runtime::auth::watch::spawn_local_follower(Arc::new(migrating.clone()), directory));
        // The queue outlives the process: its gauge starts from the store.
        migrating.refresh_queue_gauge().await.map_err(|error| Box::new(error) as muster_runtime::server::BoxError)?;
        // The organisation in memory is loaded before the first call: what
        // changes after it reaches the WatchRoster streams (refresh_index).
        migrating.refresh_index().await.map_err(|error| Box::new(error) as muster_runtime::server::BoxError)?;
        let _ = ready_sender.send(true);
        Ok(())
    };
    let credentials = CredentialServiceServer::new(CredentialStream::new(Arc::new(roster.clone())));
    let service = RosterServiceServer::new(roster)
        .max_decoding_message_size(config.server.max_message_bytes)
        .max_encoding_message_size(config.server.max_message_bytes);
    let outcome = muster_runtime::Server::new(&config.server)
        .add_service(service, grpc::ACCESS)
        .add_service(credentials, grpc::CREDENTIAL_ACCESS)
        .serve(listener, &security, ready, shutdown)
        .await;
    let _ = stop_sender.send(true);
    let _ = sweeper.await;
    if let Ok(follower) = follower.await {
        follower.abort();
    }
    Ok(outcome?)
}

/// How often the audit records that decisions appended are moved into the
/// trail that ListDelegations reads (see [`store::Store::fold_audit_trail`]).
pub const AUDIT_FOLD_INTERVAL: Duration = Duration::from_millis(100);

/// Once the database is ready, until `stop`: escalates stale queued tasks
/// every `sweep`, takes other replicas' changes into the organisation held
/// in memory every `refresh`, and folds the audit trail every
/// [`AUDIT_FOLD_INTERVAL`].
async fn background<S: Store>(
    roster: RosterGrpc<S>,
    sweep: Duration,
    refresh: Duration,
    mut ready: tokio::sync::watch::Receiver<bool>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::select! {
        result = ready.wait_for(|ready| *ready) => if result.is_err() { return },
        _ = stop.changed() => return,
    }
    let mut sweeps = tokio::time::interval(sweep);
    let mut refreshes = tokio::time::interval(refresh);
    let mut folds = tokio::time::interval(AUDIT_FOLD_INTERVAL);
    for ticker in [&mut sweeps, &mut refreshes, &mut folds] {
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    loop {
        tokio::select! {
            _ = sweeps.tick() => if let Err(error) = roster.sweep_queue().await {
                tracing::warn!(%error, "sweeping the delegation queue failed");
            },
            _ = refreshes.tick() => if let Err(error) = roster.refresh_index().await {
                tracing::warn!(%error, "refreshing the roster held in memory failed");
            },
            _ = folds.tick() => if let Err(error) = roster.store().fold_audit_trail().await {
                tracing::warn!(%error, "moving the newest audit records into the trail failed");
            },
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod access_tests {
    use muster_runtime::auth::layer::rule_gaps;

    #[test]
    fn every_method_has_an_access_rule() {
        let none = (Vec::new(), Vec::new());
        assert_eq!(rule_gaps("muster.roster.v1.RosterService", super::ACCESS), none);
        assert_eq!(rule_gaps("muster.roster.v1.CredentialService", super::CREDENTIAL_ACCESS), none);
    }
}
