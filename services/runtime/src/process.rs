//! The life of a service process, shared by the four `main`s: logging, the
//! listener, the service's `run`, and the exit code.

use std::{fmt::Display, future::Future, net::SocketAddr, pin::Pin, process::ExitCode};

use tokio::net::TcpListener;

use crate::config::ServerArgs;

/// The shutdown signal handed to a service's `run`.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Sets up logging, binds `server.listen` (or `default_address`), runs the
/// service until SIGTERM or SIGINT, and turns the outcome into an exit code.
pub async fn serve<Run, Running, Failure>(
    name: &str,
    server: &ServerArgs,
    default_address: SocketAddr,
    run: Run,
) -> ExitCode
where
    Run: FnOnce(TcpListener, Shutdown) -> Running,
    Running: Future<Output = Result<(), Failure>>,
    Failure: Display,
{
    if let Err(error) = crate::telemetry::init(server.log_format, &server.log_filter) {
        eprintln!("{name}: {error}");
        return ExitCode::FAILURE;
    }
    let address = server.listen_or(default_address);
    let listener = match TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%address, %error, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match run(listener, Box::pin(crate::shutdown::signal())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, service = name, "service stopped");
            ExitCode::FAILURE
        }
    }
}
