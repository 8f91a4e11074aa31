//! The validator's process: configuration, logging, listener, run.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use clap::Parser;
use muster_validator::{Config, DEFAULT_PORT};

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(error) = muster_runtime::telemetry::init(config.server.log_format, &config.server.log_filter) {
        eprintln!("muster-validator: {error}");
        return ExitCode::FAILURE;
    }
    let address = config.server.listen_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, DEFAULT_PORT)));
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%address, %error, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match muster_validator::run(config, listener, muster_runtime::shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "validator stopped");
            ExitCode::FAILURE
        }
    }
}
