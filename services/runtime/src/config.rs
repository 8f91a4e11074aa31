//! Settings every service takes, as command-line flags with `MUSTER_*`
//! environment overrides and defaults in code. Each service flattens
//! [`ServerArgs`] into its own typed configuration.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Pretty on a terminal, JSON otherwise.
    Auto,
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Settings shared by all four services.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address to listen on; port 0 picks a free port (see --port-file).
    #[arg(long, env = "MUSTER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Once listening, write the bound address to this file (for tests and supervisors).
    #[arg(long, env = "MUSTER_PORT_FILE")]
    pub port_file: Option<PathBuf>,
    /// Also serve gRPC health and `/metrics` on this address, in plain text
    /// and without credentials: for Kubernetes probes and Prometheus when the
    /// main port demands mutual TLS.
    #[arg(long, env = "MUSTER_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Log format.
    #[arg(long, env = "MUSTER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
    /// Log filter, in `tracing` syntax (`info`, `muster_roster=debug`, ...).
    #[arg(long, env = "MUSTER_LOG", default_value = "info")]
    pub log_filter: String,
    /// Seconds to let in-flight calls finish after SIGTERM or SIGINT.
    #[arg(long, env = "MUSTER_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,
    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, env = "MUSTER_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Most concurrent requests per connection handled at once (more wait
    /// for a slot); no more than the streams a connection may open.
    #[arg(long, env = "MUSTER_MAX_CONCURRENT_REQUESTS", default_value_t = 256)]
    pub max_concurrent_requests: usize,
    /// Most HTTP/2 streams one connection may have open at once, advertised
    /// in the server's SETTINGS (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    #[arg(long, env = "MUSTER_MAX_CONCURRENT_STREAMS", default_value_t = 256)]
    pub max_concurrent_streams: u32,
    /// Milliseconds a connection has to send the HTTP/2 preface and its
    /// SETTINGS (after TLS, if any) before it is closed.
    #[arg(long, env = "MUSTER_HANDSHAKE_TIMEOUT_MS", default_value_t = 10_000)]
    pub handshake_timeout_ms: u64,
    /// Seconds the server waits for the answer to its keepalive ping (sent
    /// every 30 s) before it closes the connection.
    #[arg(long, env = "MUSTER_KEEPALIVE_TIMEOUT_SECONDS", default_value_t = 20)]
    pub keepalive_timeout_seconds: u64,
    /// Milliseconds the request of a unary or server-streaming call has to
    /// arrive whole; past it the call ends with DEADLINE_EXCEEDED and frees
    /// its slot. (Client- and bidirectional-streaming calls have leases.)
    #[arg(long, env = "MUSTER_REQUEST_BODY_TIMEOUT_MS", default_value_t = 10_000)]
    pub request_body_timeout_ms: u64,
    /// Milliseconds an answer's next message may wait for the client to
    /// read (its flow-control window closed); past it the call's slot is
    /// freed and the connection closed.
    #[arg(long, env = "MUSTER_RESPONSE_IDLE_TIMEOUT_MS", default_value_t = 30_000)]
    pub response_idle_timeout_ms: u64,
    /// Most calls of clients that are not reads handled at once by the
    /// whole service (a streaming call counts while it opens); more wait
    /// 25 ms for a slot, then are refused with RESOURCE_EXHAUSTED and a
    /// retry delay.
    #[arg(long, env = "MUSTER_MAX_IN_FLIGHT", default_value_t = 256)]
    pub max_in_flight: usize,
    /// Most calls of the cluster's own services handled at once; more wait
    /// for a slot (up to ten seconds, then RESOURCE_EXHAUSTED) instead of
    /// being refused like a client's.
    #[arg(long, env = "MUSTER_MAX_SERVICE_CALLS_IN_FLIGHT", default_value_t = 1024)]
    pub max_service_calls_in_flight: usize,
    /// Most reads (`Get*`, `List*`, `Watch*`, `Subscribe`, `Check*`,
    /// `Render*`) handled at once, shed like the rest past it; by default
    /// two per core the service may use (at least four). Kept small: a read in flight
    /// competes for the CPU with the work (an answer showing a large
    /// execution is CPU-bound), and more reads at once only queue longer.
    /// No caller holds more than a quarter of them (at least one), and
    /// agents leave one free for operators.
    #[arg(long, env = "MUSTER_MAX_READS_IN_FLIGHT", default_value_t = default_reads_in_flight())]
    pub max_reads_in_flight: usize,
    /// Most watches (`Watch*`, `Subscribe`) opening at once, a budget apart
    /// from the short reads' and shared the same way; an open watch holds
    /// no slot.
    #[arg(long, env = "MUSTER_MAX_WATCHES_OPENING", default_value_t = default_reads_in_flight())]
    pub max_watches_opening: usize,
    /// Who may call: operators, agents' credentials, the service secret.
    #[command(flatten)]
    pub auth: crate::auth::AuthArgs,
    /// TLS and mutual TLS.
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

impl ServerArgs {
    /// The listen address, or the service's default.
    pub fn listen_or(&self, default: SocketAddr) -> SocketAddr {
        self.listen.unwrap_or(default)
    }

    /// The shutdown grace period.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_seconds)
    }

    /// How long a connection has to start speaking HTTP/2 (at least 1 ms).
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms.max(1))
    }

    /// How long a keepalive ping may go unanswered (at least 1 s).
    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_secs(self.keepalive_timeout_seconds.max(1))
    }

    /// How long a request has to arrive whole (at least 1 ms).
    pub fn request_body_timeout(&self) -> Duration {
        Duration::from_millis(self.request_body_timeout_ms.max(1))
    }

    /// How long an answer may wait for its reader (at least 1 ms).
    pub fn response_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.response_idle_timeout_ms.max(1))
    }
}

/// Two reads in flight per core the process may use (its CPU quota in a
/// container), at least four: the reads that cost are CPU-bound.
fn default_reads_in_flight() -> usize {
    std::thread::available_parallelism().map_or(4, |cores| (2 * cores.get()).max(4))
}

impl Default for ServerArgs {
    fn default() -> Self {
        Self {
            listen: None,
            port_file: None,
            health_listen: None,
            log_format: LogFormat::Auto,
            log_filter: "info".to_owned(),
            shutdown_grace_seconds: 10,
            max_message_bytes: 4 * 1024 * 1024,
            max_concurrent_requests: 256,
            max_concurrent_streams: 256,
            handshake_timeout_ms: 10_000,
            keepalive_timeout_seconds: 20,
            request_body_timeout_ms: 10_000,
            response_idle_timeout_ms: 30_000,
            max_in_flight: 256,
            max_service_calls_in_flight: 1024,
            max_reads_in_flight: default_reads_in_flight(),
            max_watches_opening: default_reads_in_flight(),
            auth: crate::auth::AuthArgs::default(),
            tls: crate::tls::TlsArgs::default(),
        }
    }
}
