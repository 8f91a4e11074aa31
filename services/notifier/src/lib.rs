//! The notifier service (`muster.notifier.v1`).
//!
//! It owns: the execution service's event stream (IngestEvents, which only
//! the execution service may send), deciding who hears of each event (the
//! step's informed agents on completion and failure, its monitors on every
//! event of the step, the execution's lead on every event of the execution,
//! the participants a session event is addressed to), each agent's durable
//! inbox with cursors and acknowledgements (an agent reads and acknowledges
//! only its own), live delivery to subscribed agents, and the NDJSON memory
//! files, written exactly once per notification. Several replicas may share
//! one PostgreSQL: they take turns writing (`ingest`) and each offers its
//! subscribers what any of them stored (`follow`).
//!
//! It does not own: executions, steps or roles (the execution service sends
//! them inside each event), agents (the roster), or what an agent does with a
//! notification.
#![forbid(unsafe_code)]

pub mod domain;
mod error;
mod files;
mod follow;
mod grpc;
mod hub;
mod ingest;
pub mod store;

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

pub use error::{Error, Result};
pub use grpc::ACCESS;
use muster_proto::notifier::v1::framed::notifier_service_server::NotifierServiceServer;
use muster_runtime::ServerArgs;
use tokio::sync::watch;

use crate::{
    files::MemoryFiles,
    grpc::NotifierGrpc,
    hub::Hub,
    ingest::{IngestSettings, Ingestor},
    store::{SqlStore, Store as _},
};

/// The notifier's default port.
pub const DEFAULT_PORT: u16 = 50054;

/// The notifier's configuration: flags with `MUSTER_*` environment overrides.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "muster-notifier", version)]
pub struct Config {
    /// Settings shared by every service.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The database: `sqlite://...` or `postgres://...`.
    #[arg(long, env = "MUSTER_DATABASE_URL", default_value = "sqlite://muster-data/notifier.db")]
    pub database_url: String,
    /// Most database connections (PostgreSQL; SQLite always uses one).
    #[arg(long, env = "MUSTER_DATABASE_MAX_CONNECTIONS", default_value_t = 8)]
    pub database_max_connections: u32,
    /// The directory for the service's files.
    #[arg(long, env = "MUSTER_DATA_DIR", default_value = "muster-data")]
    pub data_dir: PathBuf,
    /// The root of the agents' memory files (`<memory-dir>/<agent>/events/`);
    /// defaults to `<data-dir>/agents`.
    #[arg(long, env = "MUSTER_MEMORY_DIR")]
    pub memory_dir: Option<PathBuf>,
    /// Write the NDJSON memory files (`false` turns them off).
    #[arg(long, env = "MUSTER_MEMORY_FILES", default_value_t = true, action = clap::ArgAction::Set)]
    pub memory_files: bool,
    /// Longest `output_summary`, in characters, before the truncation marker.
    #[arg(long, env = "MUSTER_OUTPUT_SUMMARY_CHARS", default_value_t = 500)]
    pub output_summary_chars: usize,
    /// Live notifications buffered per subscriber before it is cut off and
    /// told to resume from its cursor.
    #[arg(long, env = "MUSTER_SUBSCRIBER_BUFFER", default_value_t = 4096)]
    pub subscriber_buffer: usize,
    /// How long, in milliseconds, the ingest writer waits for more events
    /// before it writes a batch that is not full: events that trickle in
    /// (a running chain of steps) share one transaction and one fsync per
    /// file instead of paying for them each. `0` writes every batch at once.
    #[arg(long, env = "MUSTER_INGEST_LINGER_MS", default_value_t = 2)]
    pub ingest_linger_ms: u64,
}

impl Config {
    /// The memory root: `--memory-dir`, or `<data-dir>/agents`.
    pub fn memory_root(&self) -> PathBuf {
        self.memory_dir.clone().unwrap_or_else(|| self.data_dir.join("agents"))
    }
}

/// Serves the notifier on `listener` until `shutdown` resolves.
///
/// Health turns SERVING once migrations ran and memory lines left unwritten
/// by a crash are rewritten; ingestion starts then.
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let security = muster_runtime::security::Security::following_roster("notifier", &config.server)?;
    let store = Arc::new(SqlStore::connect_lazy(&config.database_url, config.database_max_connections)?);
    let memory = config.memory_files.then(|| MemoryFiles::new(config.memory_root()));
    let hub = Hub::new(config.subscriber_buffer);
    let (ready_sender, ready_receiver) = watch::channel(false);
    // Replicas sharing the database offer their subscribers what any of them stored.
    let follower = store.shared().then(|| Arc::new(follow::Follower::default()));
    if let Some(follower) = &follower {
        follower.spawn(Arc::clone(&store), Arc::clone(&hub), ready_receiver.clone());
    }
    let ingestor = Ingestor::spawn(
        Arc::clone(&store),
        Arc::clone(&hub),
        IngestSettings {
            output_summary_chars: config.output_summary_chars,
            memory: memory.clone(),
            follower,
            linger: Duration::from_millis(config.ingest_linger_ms),
        },
        ready_receiver,
    );

    let ready = {
        let store = Arc::clone(&store);
        async move {
            store.migrate().await?;
            if let Some(memory) = &memory {
                // Written before the services made their data private.
                let root = memory.root().to_owned();
                tokio::task::spawn_blocking(move || muster_runtime::files::make_private(&root)).await??;
                // In its turn: another replica may be appending.
                let turn = store.writer_turn().await?;
                files::recover(store.as_ref(), memory).await?;
                turn.end().await?;
            }
            let _ = ready_sender.send(true);
            Ok::<(), muster_runtime::server::BoxError>(())
        }
    };

    let agents = security.agents().clone();
    let service = NotifierServiceServer::new(NotifierGrpc { store, hub, ingestor, agents })
        .max_decoding_message_size(config.server.max_message_bytes)
        .max_encoding_message_size(config.server.max_message_bytes);
    muster_runtime::Server::new(&config.server)
        .add_service(service, grpc::ACCESS)
        .serve(listener, &security, ready, shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod access_tests {
    #[test]
    fn every_method_has_an_access_rule() {
        let gaps = muster_runtime::auth::layer::rule_gaps("muster.notifier.v1.NotifierService", super::ACCESS);
        assert_eq!(gaps, (Vec::new(), Vec::new()), "(methods without a rule, rules without a method)");
    }
}
