//! muster's console: web pages over the cluster, served by axum, for
//! people who would rather look than type. It lists executions and draws
//! one as its graph, live (`executions`); edits a process as YAML beside
//! its role matrix, with the validator's diagnostics as one types, and
//! publishes and starts it (`editor`); shows the roster, its delegations
//! and who would take a task (`roster`); and a team's sessions, budgets,
//! schedules, permission matrices and memory (`team`).
//!
//! It has no powers of its own: it is a client of the execution service,
//! the roster and the validator through their gRPC contracts, and every
//! call carries the credential of whoever signed in (an operator's or an
//! agent's token), so the cluster's authority decides every action. The
//! session is a sealed cookie (`session`); every change carries a CSRF
//! token; pages load no inline script, and what agents wrote is shown as
//! text (`html`). It keeps no state: any number of replicas sharing a
//! session key serve the same sessions.
#![forbid(unsafe_code)]

use std::{future::Future, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderValue, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};

mod cluster;
mod editor;
mod executions;
mod html;
mod roster;
mod session;
mod signin;
mod team;

use cluster::Cluster;

/// The console's default port.
pub const DEFAULT_PORT: u16 = 50080;

/// The console's configuration.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "muster-console", version, about = "muster's console: web pages over the cluster")]
pub struct Config {
    /// Address to listen on (default 0.0.0.0:50080).
    #[arg(long, env = "MUSTER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Write the bound address here once listening (for port 0).
    #[arg(long, env = "MUSTER_PORT_FILE")]
    pub port_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "MUSTER_LOG_FORMAT", value_enum, default_value_t = muster_runtime::config::LogFormat::Auto)]
    pub log_format: muster_runtime::config::LogFormat,
    /// Log filter, in `tracing` syntax.
    #[arg(long, env = "MUSTER_LOG", default_value = "info")]
    pub log_filter: String,
    /// The execution service (several URLs comma-separated are balanced).
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051")]
    pub execution_url: String,
    /// The roster.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value = "http://127.0.0.1:50052")]
    pub roster_url: String,
    /// The validator.
    #[arg(long, env = "MUSTER_VALIDATOR_URL", default_value = "http://127.0.0.1:50053")]
    pub validator_url: String,
    /// File holding the key sessions are sealed with: 32 bytes, or 64
    /// hexadecimal digits. Replicas sharing it share sessions, and sessions
    /// outlive restarts; without it, a key is made up at start.
    #[arg(long, env = "MUSTER_CONSOLE_SESSION_KEY_FILE")]
    pub session_key_file: Option<PathBuf>,
    /// Minutes a session may go unused before it ends.
    #[arg(long, env = "MUSTER_CONSOLE_IDLE_MINUTES", default_value_t = 30)]
    pub idle_minutes: u64,
    /// Mark the session cookie `Secure`: set it when people reach the
    /// console over HTTPS (a TLS-terminating ingress in front of it).
    #[arg(long, env = "MUSTER_CONSOLE_SECURE_COOKIES")]
    pub secure_cookies: bool,
    /// TLS to the services: the certificate authorities to trust
    /// (`MUSTER_TLS_CA_FILE`), for `https://` URLs.
    #[command(flatten)]
    pub tls: muster_runtime::tls::TlsArgs,
}

/// What every handler shares.
#[derive(Debug)]
pub struct Console {
    cluster: Cluster,
    keys: session::Keys,
    secure_cookies: bool,
    /// Turns true when the console stops: live pages end their streams, so
    /// that stopping does not wait for browsers to close them.
    stopping: tokio::sync::watch::Receiver<bool>,
}

type Shared = Arc<Console>;

/// Errors of the console's start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings are wrong.
    #[error("{0}")]
    Config(String),
    /// Serving failed.
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves the console on `listener` until `shutdown` resolves.
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let idle = Duration::from_secs(config.idle_minutes.max(1) * 60);
    let keys = match &config.session_key_file {
        Some(path) => {
            let material = std::fs::read(path)
                .map_err(|error| Error::Config(format!("reading the session key {}: {error}", path.display())))?;
            session::Keys::from_material(&material, idle)
                .map_err(|error| Error::Config(format!("{}: {error}", path.display())))?
        }
        None => {
            tracing::warn!("no session key file: sessions end when the console stops, and replicas do not share them");
            session::Keys::random(idle)
        }
    };
    let cluster = Cluster::connect(&config).map_err(|error| Error::Config(error.to_string()))?;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let console = Arc::new(Console { cluster, keys, secure_cookies: config.secure_cookies, stopping });
    if let Some(port_file) = &config.port_file {
        muster_runtime::server::write_port_file(port_file, &listener.local_addr()?.to_string())
            .map_err(|error| Error::Config(error.to_string()))?;
    }
    tracing::info!(address = %listener.local_addr()?, "console serving");
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    axum::serve(listener, router(console)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

/// Every page and call of the console.
pub fn router(console: Shared) -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/executions") }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/assets/console.css", get(stylesheet))
        .route("/assets/console.js", get(script))
        .route("/signin", get(signin::form).post(signin::sign_in))
        .route("/signout", post(signin::sign_out))
        .route("/executions", get(executions::list))
        .route("/executions/{id}", get(executions::show))
        .route("/executions/{id}/state", get(executions::state))
        .route("/executions/{id}/events", get(executions::events))
        .route("/executions/{id}/decide", post(executions::decide))
        .route("/executions/{id}/intervene", post(executions::intervene))
        .route("/editor", get(editor::page))
        .route("/editor/analyse", post(editor::analyse))
        .route("/editor/roles", post(editor::roles))
        .route("/editor/publish", post(editor::publish))
        .route("/roster", get(roster::page))
        .route("/roster/delegate", post(roster::dry_run))
        .route("/team", get(team::page))
        .layer(middleware::from_fn_with_state(console.clone(), sessions))
        .layer(middleware::from_fn(security_headers))
        .with_state(console)
}

/// Opens the session cookie for the handlers (as a request extension) and
/// seals it again on the way out, so that its idle time starts over.
async fn sessions(State(console): State<Shared>, mut request: Request, next: Next) -> Response {
    if request.uri().path().starts_with("/assets/") || request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    let session = cookie(&request).and_then(|value| console.keys.open(&value));
    if let Some(session) = &session {
        request.extensions_mut().insert(session.clone());
    }
    let mut response = next.run(request).await;
    if let Some(session) = session
        && !response.headers().contains_key(header::SET_COOKIE)
    {
        let value = console.set_cookie(&console.keys.seal(&session));
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

fn cookie(request: &Request) -> Option<String> {
    request.headers().get_all(header::COOKIE).iter().filter_map(|value| value.to_str().ok()).find_map(|line| {
        line.split(';').find_map(|pair| pair.trim().strip_prefix(session::COOKIE)?.strip_prefix('=').map(str::to_owned))
    })
}

impl Console {
    /// The `Set-Cookie` value carrying `sealed` (empty: ending the session).
    fn set_cookie(&self, sealed: &str) -> HeaderValue {
        let age = if sealed.is_empty() { 0 } else { self.keys.idle().as_secs() };
        let secure = if self.secure_cookies { "; Secure" } else { "" };
        let value = format!("{}={sealed}; Path=/; HttpOnly; SameSite=Strict; Max-Age={age}{secure}", session::COOKIE);
        HeaderValue::from_str(&value).expect("a sealed session is URL-safe text")
    }
}

/// What every answer carries: a policy that runs only the console's own
/// script and loads nothing from elsewhere, no framing, no sniffing, no
/// referrer, and pages that are not cached.
async fn security_headers(request: Request, next: Next) -> Response {
    let is_asset = request.uri().path().starts_with("/assets/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                  form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if !is_asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn stylesheet() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("../assets/console.css"))
}

async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("../assets/console.js"))
}
