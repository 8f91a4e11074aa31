//! The `muster-execution` binary: configuration, then [`muster_execution::run`] as a process.

use std::process::ExitCode;

use clap::Parser as _;

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

fn main() -> ExitCode {
    let config = muster_execution::Config::parse();
    let server = config.server.clone();
    let address = config.listen_address();
    muster_runtime::process::serve("muster-execution", &server, address, |listener, shutdown| {
        muster_execution::run(config, listener, shutdown)
    })
}
