//! The `muster-console` binary: configuration, then [`muster_console::run`] as a process.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::ExitCode,
};

use clap::Parser as _;

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

fn main() -> ExitCode {
    let config = muster_console::Config::parse();
    let filter = config.log_filter.clone();
    let logs = muster_runtime::process::Logs { format: config.log_format, filter: &filter };
    let address = config.listen.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, muster_console::DEFAULT_PORT)));
    muster_runtime::process::serve_at("muster-console", logs, address, |listener, shutdown| {
        muster_console::run(config, listener, shutdown)
    })
}
