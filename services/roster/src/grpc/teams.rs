//! Teams and role definitions: put, read, listed and removed. The trait
//! methods in `mod.rs` call these.

use muster_proto::roster::v1 as pb;
use muster_runtime::paging::page;
use tonic::{Request, Response, Status as GrpcStatus};

use super::convert::{required_id, required_name, role_from_wire, team_from_wire, team_to_wire};
use super::{MAX_PAGE_BYTES, RosterGrpc, page_size};
use crate::error::{Error, Result};
use crate::store::Store;
use muster_runtime::roles::role_to_wire;

impl<S: Store> RosterGrpc<S> {
    pub(super) async fn serve_put_team(
        &self,
        request: Request<pb::PutTeamRequest>,
    ) -> Result<Response<pb::PutTeamResponse>, GrpcStatus> {
        let team = team_from_wire(request.into_inner().team)?;
        let stored = self.inner.store.put_team(&team, self.now()).await?;
        Ok(Response::new(pb::PutTeamResponse { team: Some(team_to_wire(&stored)) }))
    }

    pub(super) async fn serve_list_teams(
        &self,
        request: Request<pb::ListTeamsRequest>,
    ) -> Result<Response<pb::ListTeamsResponse>, GrpcStatus> {
        let request = request.into_inner();
        if !muster_runtime::paging::is_key_token(&request.page_token) {
            return Err(Error::invalid("page_token", muster_runtime::paging::MALFORMED_TOKEN).into());
        }
        let teams = self.inner.store.list_teams().await?;
        let (teams, next_page_token) = page(
            &teams,
            |team| &team.name,
            team_to_wire,
            page_size(request.page_size),
            &request.page_token,
            MAX_PAGE_BYTES,
        );
        Ok(Response::new(pb::ListTeamsResponse { teams, next_page_token }))
    }

    pub(super) async fn serve_remove_team(
        &self,
        request: Request<pb::RemoveTeamRequest>,
    ) -> Result<Response<pb::RemoveTeamResponse>, GrpcStatus> {
        let name = required_id("name", &request.into_inner().name)?;
        self.inner.store.remove_team(&name).await?;
        Ok(Response::new(pb::RemoveTeamResponse {}))
    }

    pub(super) async fn serve_put_role_definition(
        &self,
        request: Request<pb::PutRoleDefinitionRequest>,
    ) -> Result<Response<pb::PutRoleDefinitionResponse>, GrpcStatus> {
        let role = role_from_wire(request.into_inner().role)?;
        let stored = self.inner.store.put_role(&role, self.now()).await?;
        self.announce_roles(pb::RosterChangeKind::RoleUpserted, vec![role_to_wire(&stored)]);
        Ok(Response::new(pb::PutRoleDefinitionResponse { role: Some(role_to_wire(&stored)) }))
    }

    pub(super) async fn serve_get_role_definition(
        &self,
        request: Request<pb::GetRoleDefinitionRequest>,
    ) -> Result<Response<pb::GetRoleDefinitionResponse>, GrpcStatus> {
        let name = required_name("name", &request.into_inner().name)?;
        let role = self.inner.store.get_role(&name).await?;
        Ok(Response::new(pb::GetRoleDefinitionResponse { role: Some(role_to_wire(&role)) }))
    }

    pub(super) async fn serve_list_role_definitions(
        &self,
        request: Request<pb::ListRoleDefinitionsRequest>,
    ) -> Result<Response<pb::ListRoleDefinitionsResponse>, GrpcStatus> {
        let request = request.into_inner();
        if !muster_runtime::paging::is_key_token(&request.page_token) {
            return Err(Error::invalid("page_token", muster_runtime::paging::MALFORMED_TOKEN).into());
        }
        let roles = self.inner.store.list_roles().await?;
        let (roles, next_page_token) = page(
            &roles,
            |role| &role.name,
            role_to_wire,
            page_size(request.page_size),
            &request.page_token,
            MAX_PAGE_BYTES,
        );
        Ok(Response::new(pb::ListRoleDefinitionsResponse { roles, next_page_token }))
    }

    pub(super) async fn serve_remove_role_definition(
        &self,
        request: Request<pb::RemoveRoleDefinitionRequest>,
    ) -> Result<Response<pb::RemoveRoleDefinitionResponse>, GrpcStatus> {
        let name = required_name("name", &request.into_inner().name)?;
        self.inner.store.remove_role(&name).await?;
        let removed = pb::RoleDefinition { name, ..Default::default() };
        self.announce_roles(pb::RosterChangeKind::RoleRemoved, vec![removed]);
        Ok(Response::new(pb::RemoveRoleDefinitionResponse {}))
    }
}
