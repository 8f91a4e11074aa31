//! Clients of the services the execution service depends on: the roster
//! (agents, roles, delegation) and the validator. Channels connect lazily and
//! reconnect by themselves, so a dependency that restarts is picked up again;
//! their calls carry the service's credential and the caller's trace context
//! (`muster_runtime::security`).

use muster_proto::{roster::v1 as roster, validator::v1 as validator};
use muster_runtime::auth::client::AuthChannel;

use crate::{Error, Result};

pub(crate) type RosterClient = roster::roster_service_client::RosterServiceClient<AuthChannel>;
pub(crate) type ValidatorClient = validator::validator_service_client::ValidatorServiceClient<AuthChannel>;

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
