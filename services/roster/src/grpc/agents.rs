//! The agents' RPCs: register (with a first token), read, list with the
//! roster's filters, update, remove, set a status, and render an agent's
//! system prompt. The trait methods in `mod.rs` call these.

use muster_proto::roster::v1 as pb;
use muster_runtime::auth::{Caller, TokenHash, only_for_itself};
use muster_runtime::paging::page;
use tonic::{Request, Response, Status as GrpcStatus};

use super::convert::{agent_from_wire, agent_to_wire, required_id, status_from_wire, update_mask_fields};
use super::{MAX_PAGE_BYTES, RosterGrpc, new_token, page_size};
use crate::domain::{model::normalize_tags, prompt::render_system_prompt};
use crate::error::{Error, Result};
use crate::store::{AgentQuery, Store};

impl<S: Store> RosterGrpc<S> {
    pub(super) async fn serve_register_agent(
        &self,
        request: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, GrpcStatus> {
        let agent = agent_from_wire(request.into_inner().agent)?;
        let token = new_token()?;
        let stored = self.inner.store.insert_agent(&agent, &TokenHash::of(&token), self.now()).await?;
        self.credentials_changed().await;
        tracing::info!(agent_id = %stored.id, "agent registered");
        self.announce_agents(pb::RosterChangeKind::AgentUpserted, std::slice::from_ref(&stored.id)).await;
        Ok(Response::new(pb::RegisterAgentResponse { agent: Some(agent_to_wire(&stored)), token }))
    }

    pub(super) async fn serve_get_agent(
        &self,
        request: Request<pb::GetAgentRequest>,
    ) -> Result<Response<pb::GetAgentResponse>, GrpcStatus> {
        let id = required_id("id", &request.into_inner().id)?;
        let agent = self.inner.store.get_agent(&id).await?;
        Ok(Response::new(pb::GetAgentResponse { agent: Some(agent_to_wire(&agent)) }))
    }

    pub(super) async fn serve_list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, GrpcStatus> {
        let request = request.into_inner();
        if !muster_runtime::paging::is_key_token(&request.page_token) {
            return Err(Error::invalid("page_token", muster_runtime::paging::MALFORMED_TOKEN).into());
        }
        let page_size = page_size(request.page_size) as u32;
        let expertise = if request.expertise.trim().is_empty() {
            String::new()
        } else {
            normalize_tags("expertise", &[request.expertise])
                .map_err(|error| Error::from(error).on_field("expertise"))?
                .into_iter()
                .next()
                .unwrap_or_default()
        };
        let query = AgentQuery {
            team: request.team.trim().to_owned(),
            role: request.role.trim().to_owned(),
            status: status_from_wire("status", request.status)?,
            expertise,
            available_only: false,
            after_id: request.page_token,
            limit: page_size + 1,
        };
        // The query read the page after the token (and one more, to know
        // whether another page follows); long prompts can end it earlier.
        let found = self.inner.store.list_agents(&query).await?;
        let (agents, next_page_token) =
            page(&found, |agent| &agent.id, agent_to_wire, page_size as usize, "", MAX_PAGE_BYTES);
        Ok(Response::new(pb::ListAgentsResponse { agents, next_page_token }))
    }

    pub(super) async fn serve_update_agent(
        &self,
        request: Request<pb::UpdateAgentRequest>,
    ) -> Result<Response<pb::UpdateAgentResponse>, GrpcStatus> {
        let request = request.into_inner();
        let fields = update_mask_fields(request.update_mask.as_ref())?;
        let agent = agent_from_wire(request.agent)?;
        let stored = self.inner.store.update_agent(&agent, &fields, self.now()).await?;
        // Its credentials carry its role.
        self.credentials_changed().await;
        self.announce_agents(pb::RosterChangeKind::AgentUpserted, std::slice::from_ref(&stored.id)).await;
        Ok(Response::new(pb::UpdateAgentResponse { agent: Some(agent_to_wire(&stored)) }))
    }

    pub(super) async fn serve_remove_agent(
        &self,
        request: Request<pb::RemoveAgentRequest>,
    ) -> Result<Response<pb::RemoveAgentResponse>, GrpcStatus> {
        let id = required_id("id", &request.into_inner().id)?;
        self.inner.store.remove_agent(&id, self.now()).await?;
        self.credentials_changed().await;
        tracing::info!(agent_id = %id, "agent removed");
        let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
            kind: pb::RosterChangeKind::AgentRemoved as i32,
            agent: Some(pb::Agent { id, ..Default::default() }),
            role: None,
        });
        Ok(Response::new(pb::RemoveAgentResponse {}))
    }

    pub(super) async fn serve_set_agent_status(
        &self,
        request: Request<pb::SetAgentStatusRequest>,
    ) -> Result<Response<pb::SetAgentStatusResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let id = required_id("id", &request.id)?;
        only_for_itself(&caller, &id, "set the status of another agent")?;
        let status = status_from_wire("status", request.status)?;
        let availability_until = request.availability_until.as_ref().map(muster_runtime::time::from_timestamp);
        let agent = self.inner.store.set_status(&id, status, availability_until, self.now()).await?;
        tracing::info!(agent_id = %id, status = agent.status().as_str(), "agent status set");
        let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
            kind: pb::RosterChangeKind::AgentStatus as i32,
            agent: Some(agent_to_wire(&agent)),
            role: None,
        });
        Ok(Response::new(pb::SetAgentStatusResponse { agent: Some(agent_to_wire(&agent)) }))
    }

    pub(super) async fn serve_render_system_prompt(
        &self,
        request: Request<pb::RenderSystemPromptRequest>,
    ) -> Result<Response<pb::RenderSystemPromptResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let agent_id = required_id("agent_id", &request.into_inner().agent_id)?;
        only_for_itself(&caller, &agent_id, "render the system prompt of another agent")?;
        let agent = self.inner.store.get_agent(&agent_id).await?;
        let senior = if agent.senior_id.is_empty() {
            None
        } else {
            match self.inner.store.get_agent(&agent.senior_id).await {
                Ok(senior) => Some(senior),
                Err(Error::NotFound { .. }) => None,
                Err(error) => return Err(error.into()),
            }
        };
        let role = if agent.role.is_empty() {
            None
        } else {
            match self.inner.store.get_role(&agent.role).await {
                Ok(role) => Some(role),
                Err(Error::NotFound { .. }) => None,
                Err(error) => return Err(error.into()),
            }
        };
        Ok(Response::new(pb::RenderSystemPromptResponse {
            system_prompt: render_system_prompt(&agent, role.as_ref(), senior.as_ref()),
        }))
    }
}
