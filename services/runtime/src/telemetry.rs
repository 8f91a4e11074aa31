//! Logging: `tracing` with a human format on a terminal and JSON lines
//! otherwise, filtered by `MUSTER_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::config::LogFormat;

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat, filter: &str) -> crate::Result<()> {
    let filter = EnvFilter::try_new(filter).map_err(|error| crate::Error::Telemetry(error.to_string()))?;
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let registry = tracing_subscriber::registry().with(filter);
    let result = if json {
        registry.with(fmt::layer().json().with_current_span(false).with_writer(std::io::stderr)).try_init()
    } else {
        registry.with(fmt::layer().with_writer(std::io::stderr)).try_init()
    };
    result.map_err(|error| crate::Error::Telemetry(error.to_string()))
}
