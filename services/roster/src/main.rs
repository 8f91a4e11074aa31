//! The `muster-roster` binary: configuration, then [`muster_roster::run`] as a process.

use std::process::ExitCode;

use clap::Parser as _;

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

fn main() -> ExitCode {
    let config = muster_roster::Config::parse();
    let server = config.server.clone();
    let address = muster_roster::default_listen_address();
    muster_runtime::process::serve("muster-roster", &server, address, |listener, shutdown| {
        muster_roster::run(config, listener, shutdown)
    })
}
