//! The `muster-notifier` binary: configuration, then [`muster_notifier::run`] as a process.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::ExitCode,
};

use clap::Parser as _;

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

fn main() -> ExitCode {
    let config = muster_notifier::Config::parse();
    let server = config.server.clone();
    let address = SocketAddr::from((Ipv4Addr::UNSPECIFIED, muster_notifier::DEFAULT_PORT));
    muster_runtime::process::serve("muster-notifier", &server, address, |listener, shutdown| {
        muster_notifier::run(config, listener, shutdown)
    })
}
