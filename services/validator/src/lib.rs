//! muster's validator service: checks process definitions, role
//! definitions and permission matrices over gRPC
//! (`muster.validator.v1.ValidatorService`) for any authenticated caller
//! ([`ACCESS`]), and answers with the diagnostics of the `muster-format`
//! library, which owns the formats and their rules (the execution service,
//! the roster and the `muster` command line link that library directly).
//!
//! It is stateless and keeps no database; the only service it calls is the
//! roster, for the agent credentials that authenticate its callers. What it
//! knows of agents, roles and tools comes from the caller's validation
//! context.
#![forbid(unsafe_code)]

use std::future::Future;

mod error;
mod grpc;

pub use error::{Error, Result};
pub use grpc::{ACCESS, ValidatorGrpc};
use muster_format::Limits;

/// The validator's default port.
pub const DEFAULT_PORT: u16 = 50053;

/// The validator's configuration: the shared server settings only; it keeps
/// no state.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "muster-validator", version, about = "muster's validator service")]
pub struct Config {
    /// Shared server settings.
    #[command(flatten)]
    pub server: muster_runtime::ServerArgs,
}

/// Serves the validator on `listener` until `shutdown` resolves.
///
/// It calls no other service for its work; it follows the roster's agent
/// credentials only to authenticate agents that call it.
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let security = muster_runtime::security::Security::following_roster("validator", &config.server)?;
    let max_message_bytes = config.server.max_message_bytes;
    let service = muster_proto::validator::v1::validator_service_server::ValidatorServiceServer::new(
        ValidatorGrpc::new(Limits::default()),
    )
    .max_decoding_message_size(max_message_bytes)
    .max_encoding_message_size(max_message_bytes);
    muster_runtime::Server::new(&config.server)
        .add_service(service, ACCESS)
        .serve(listener, &security, async { Ok(()) }, shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod access_tests {
    #[test]
    fn every_method_has_an_access_rule() {
        let gaps = muster_runtime::auth::layer::rule_gaps("muster.validator.v1.ValidatorService", super::ACCESS);
        assert_eq!(gaps, (Vec::new(), Vec::new()), "(methods without a rule, rules without a method)");
    }
}
