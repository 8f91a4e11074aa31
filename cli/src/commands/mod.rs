//! The subcommands.

pub(crate) mod act;
pub(crate) mod admin;
pub(crate) mod agent;
pub(crate) mod budget;
pub(crate) mod demo;
pub(crate) mod executions;
pub(crate) mod inbox;
pub(crate) mod mcp;
pub(crate) mod memory;
pub(crate) mod notifications;
pub(crate) mod output;
pub(crate) mod roster;
pub(crate) mod run;
pub(crate) mod schedule;
pub(crate) mod session;
pub(crate) mod up;

use muster::credentials::{Endpoint, resolve};

/// The service at `url`, called with the command's credential.
/// A JSON object given on the command line (`flag`), as the contract
/// carries it; empty text is none.
pub(crate) fn json_object(flag: &str, text: &str) -> anyhow::Result<Option<prost_types::Struct>> {
    muster_runtime::json::struct_from_text(text).map_err(|problem| anyhow::anyhow!("{flag} {problem}"))
}

pub(crate) fn endpoint(url: &str, token: Option<&str>) -> anyhow::Result<Endpoint> {
    Ok(Endpoint::new(url, resolve(token)?))
}

/// A refusal from a service, as people read it.
pub(crate) fn refused(status: tonic::Status) -> anyhow::Error {
    let hint = match status.code() {
        tonic::Code::Unauthenticated => " (check --token or MUSTER_TOKEN)",
        tonic::Code::Unavailable => " (is the cluster running? `muster up`)",
        _ => "",
    };
    anyhow::anyhow!("{:?}: {}{hint}", status.code(), status.message())
}
