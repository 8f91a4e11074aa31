//! The life of a service process, shared by the four `main`s: logs and
//! traces, the listener, the service's `run`, and the exit code.

use std::{fmt::Display, future::Future, net::SocketAddr, pin::Pin, process::ExitCode};

use tokio::net::TcpListener;

use crate::config::ServerArgs;

/// The shutdown signal handed to a service's `run`.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Makes what the process writes its owner's alone
/// ([`crate::files::private_umask`]), sets up logs and traces (`name` names
/// the process in them), binds `server.listen` (or `default_address`), runs
/// the service until SIGTERM or SIGINT, and turns the outcome into an exit
/// code.
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
    crate::files::private_umask();
    let telemetry = match crate::telemetry::init(name, server.log_format, &server.log_filter) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let address = server.listen_or(default_address);
    let code = match TcpListener::bind(address).await {
        Ok(listener) => match run(listener, Box::pin(crate::shutdown::signal())).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, service = name, "service stopped");
                ExitCode::FAILURE
            }
        },
        Err(error) => {
            tracing::error!(%address, %error, "cannot listen");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}
