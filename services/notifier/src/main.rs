//! The `muster-notifier` binary: configuration, telemetry, [`muster_notifier::run`], exit code.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::ExitCode,
};

use clap::Parser as _;
use muster_notifier::{Config, DEFAULT_PORT};

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(error) = muster_runtime::telemetry::init(config.server.log_format, &config.server.log_filter) {
        eprintln!("muster-notifier: {error}");
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
    match muster_notifier::run(config, listener, muster_runtime::shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "notifier stopped");
            ExitCode::FAILURE
        }
    }
}
