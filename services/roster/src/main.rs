//! The roster service binary: configuration, telemetry, run, exit code.

use std::process::ExitCode;

use clap::Parser as _;
use muster_roster::{Config, default_listen_address, run};

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(error) = muster_runtime::telemetry::init(config.server.log_format, &config.server.log_filter) {
        eprintln!("muster-roster: {error}");
        return ExitCode::FAILURE;
    }
    let address = config.server.listen_or(default_listen_address());
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, %address, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match run(config, listener, muster_runtime::shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "roster stopped");
            ExitCode::FAILURE
        }
    }
}
