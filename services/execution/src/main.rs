//! The execution service's process: configuration, logging, listener, run.

use std::process::ExitCode;

use clap::Parser;
use muster_execution::Config;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(error) = muster_runtime::telemetry::init(config.server.log_format, &config.server.log_filter) {
        eprintln!("muster-execution: {error}");
        return ExitCode::FAILURE;
    }
    let address = config.listen_address();
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%address, %error, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match muster_execution::run(config, listener, muster_runtime::shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "execution service stopped");
            ExitCode::FAILURE
        }
    }
}
