//! The `muster-validator` binary: configuration, then [`muster_validator::run`] as a process.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::ExitCode,
};

use clap::Parser as _;

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

fn main() -> ExitCode {
    let config = muster_validator::Config::parse();
    let server = config.server.clone();
    let address = SocketAddr::from((Ipv4Addr::UNSPECIFIED, muster_validator::DEFAULT_PORT));
    muster_runtime::process::serve("muster-validator", &server, address, |listener, shutdown| {
        muster_validator::run(config, listener, shutdown)
    })
}
