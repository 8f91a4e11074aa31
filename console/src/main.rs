//! The `muster-console` binary: configuration, then [`muster_console::run`] as a process.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::ExitCode,
};

use clap::Parser as _;

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

#[tokio::main]
async fn main() -> ExitCode {
    let config = muster_console::Config::parse();
    muster_runtime::files::private_umask();
    let telemetry = match muster_runtime::telemetry::init("muster-console", config.log_format, &config.log_filter) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("muster-console: {error}");
            return ExitCode::FAILURE;
        }
    };
    let address = config.listen.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, muster_console::DEFAULT_PORT)));
    let code = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => match muster_console::run(config, listener, muster_runtime::shutdown::signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, "console stopped");
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
