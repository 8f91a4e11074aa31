//! Clients of the services the execution service depends on: the roster
//! (agents, roles, delegation) and the validator. Channels connect lazily and
//! reconnect by themselves, so a dependency that restarts is picked up again.

use std::time::Duration;

use muster_proto::{roster::v1 as roster, validator::v1 as validator};
use muster_runtime::telemetry::{TracedChannel, traced};
use tonic::transport::Endpoint;

use crate::{Error, Result};

pub(crate) type RosterClient = roster::roster_service_client::RosterServiceClient<TracedChannel>;
pub(crate) type ValidatorClient = validator::validator_service_client::ValidatorServiceClient<TracedChannel>;

/// A channel that connects on first use; its calls carry the caller's trace context.
pub(crate) fn lazy_channel(url: &str) -> Result<TracedChannel> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|error| Error::InvalidArgument(format!("invalid service URL {url:?}: {error}")))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30));
    Ok(traced(endpoint.connect_lazy()))
}

/// Maps a dependency's failure: its own verdicts pass through, outages become UNAVAILABLE.
pub(crate) fn dependency_error(service: &'static str, status: tonic::Status) -> Error {
    match status.code() {
        tonic::Code::NotFound => Error::NotFound(status.message().to_owned()),
        tonic::Code::InvalidArgument => Error::InvalidArgument(status.message().to_owned()),
        tonic::Code::FailedPrecondition | tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
            Error::FailedPrecondition(format!("{service}: {}", status.message()))
        }
        _ => Error::Unavailable { service, detail: format!("{}: {}", status.code(), status.message()) },
    }
}

/// Every agent of the roster.
pub(crate) async fn all_agents(roster: &mut RosterClient) -> Result<Vec<roster::Agent>> {
    let mut agents = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = roster
            .list_agents(roster::ListAgentsRequest { page_size: 1000, page_token, ..Default::default() })
            .await
            .map_err(|status| dependency_error("roster", status))?
            .into_inner();
        agents.extend(page.agents);
        if page.next_page_token.is_empty() {
            return Ok(agents);
        }
        page_token = page.next_page_token;
    }
}
