//! The organisation as a whole: ImportRoster applies a roster file (teams,
//! agents and roles in one plan, or a dry run that reports it), and
//! GetOrganizationRoster answers an agent's view of its organisation.

use std::collections::HashSet;

use muster_proto::roster::v1 as pb;
use muster_runtime::auth::TokenHash;

use super::convert::{agent_to_wire, diagnostic_to_wire, required_id};
use super::{RosterGrpc, new_token};
use crate::domain::{
    import::{self, ImportFile, Severity},
    model::normalize_tags,
};
use crate::error::{Error, Result};
use crate::store::{AgentQuery, ImportPlan, Store};
use muster_runtime::roles::role_to_wire;

impl<S: Store> RosterGrpc<S> {
    pub(super) async fn import_roster(&self, request: pb::ImportRosterRequest) -> Result<pb::ImportRosterResponse> {
        if request.files.is_empty() {
            return Err(Error::invalid("files", "files: at least one file is required"));
        }
        let files: Vec<ImportFile> =
            request.files.into_iter().map(|file| ImportFile { name: file.name, content: file.content }).collect();
        let mut parsed = import::parse_files(&files);
        let existing = import::Existing {
            agents: self
                .inner
                .store
                .list_agents(&AgentQuery::default())
                .await?
                .into_iter()
                .map(|agent| (agent.id, agent.senior_id))
                .collect(),
            teams: self.inner.store.list_teams().await?.into_iter().map(|team| team.name).collect(),
            roles: self.inner.store.list_roles().await?.into_iter().map(|role| role.name).collect(),
        };
        let reference_diagnostics = import::check_references(&parsed, &existing);
        parsed.diagnostics.extend(reference_diagnostics);
        let diagnostics: Vec<pb::FileDiagnostic> = parsed.diagnostics.iter().map(diagnostic_to_wire).collect();
        let has_errors = parsed.diagnostics.iter().any(|diagnostic| diagnostic.severity == Severity::Error);
        let mut response = pb::ImportRosterResponse { diagnostics, ..Default::default() };
        if has_errors || request.dry_run {
            if !has_errors {
                response.agents_imported = u32::try_from(parsed.agents.len()).unwrap_or(u32::MAX);
                response.teams_imported = u32::try_from(parsed.teams.len()).unwrap_or(u32::MAX);
                response.roles_imported = u32::try_from(parsed.roles.len()).unwrap_or(u32::MAX);
            }
            return Ok(response);
        }
        let mut tokens = Vec::with_capacity(parsed.agents.len());
        let mut plan = ImportPlan { teams: parsed.teams.clone(), roles: parsed.roles.clone(), agents: Vec::new() };
        for agent in &parsed.agents {
            let token = new_token()?;
            plan.agents.push((agent.clone(), TokenHash::of(&token)));
            tokens.push((agent.id.clone(), token));
        }
        let created = self.inner.store.import(&plan, self.now()).await?;
        self.credentials_changed().await;
        let created_set: HashSet<&String> = created.iter().collect();
        response.issued_tokens = tokens
            .into_iter()
            .filter(|(id, _)| created_set.contains(id))
            .map(|(agent_id, token)| pb::IssuedToken { agent_id, token })
            .collect();
        response.agents_imported = u32::try_from(plan.agents.len()).unwrap_or(u32::MAX);
        response.teams_imported = u32::try_from(plan.teams.len()).unwrap_or(u32::MAX);
        response.roles_imported = u32::try_from(plan.roles.len()).unwrap_or(u32::MAX);
        let ids: Vec<String> = plan.agents.iter().map(|(agent, _)| agent.id.clone()).collect();
        self.announce_agents(pb::RosterChangeKind::AgentUpserted, &ids).await;
        self.announce_roles(pb::RosterChangeKind::RoleUpserted, plan.roles.iter().map(role_to_wire).collect());
        tracing::info!(
            agents = ids.len(),
            created = created.len(),
            teams = plan.teams.len(),
            roles = plan.roles.len(),
            "roster imported"
        );
        Ok(response)
    }

    pub(super) async fn organization_roster(
        &self,
        request: pb::GetOrganizationRosterRequest,
    ) -> Result<pb::GetOrganizationRosterResponse> {
        let agent_id = required_id("agent_id", &request.agent_id)?;
        // Read from the organisation in memory, like a delegation decision.
        let caller = self.inner.store.indexed_agent(&agent_id).await?;
        let filter = pb::RosterFilter::try_from(request.filter)
            .map_err(|_| Error::invalid("filter", format!("filter: unknown value {}", request.filter)))?;
        let mut query = AgentQuery::default();
        let mut without_team = false;
        match filter {
            pb::RosterFilter::Unspecified | pb::RosterFilter::All => {}
            pb::RosterFilter::MyTeam if caller.team.is_empty() => without_team = true,
            pb::RosterFilter::MyTeam => query.team.clone_from(&caller.team),
            pb::RosterFilter::Available => query.available_only = true,
            pb::RosterFilter::ByExpertise => {
                if request.expertise.trim().is_empty() {
                    return Err(Error::invalid(
                        "expertise",
                        "expertise: required with filter ROSTER_FILTER_BY_EXPERTISE",
                    ));
                }
                // One tag, checked as a list of one: the field is `expertise`, not `expertise[0]`.
                let tags = normalize_tags("expertise", &[request.expertise])
                    .map_err(|error| Error::from(error).on_field("expertise"))?;
                query.expertise = tags.into_iter().next().unwrap_or_default();
            }
        }
        let colleagues = self
            .inner
            .store
            .indexed_agents(&query)
            .await?
            .iter()
            .filter(|agent| agent.id != caller.id && (!without_team || agent.team.is_empty()))
            .map(|agent| agent_to_wire(agent))
            .collect();
        Ok(pb::GetOrganizationRosterResponse { agent_context: Some(agent_to_wire(&caller)), colleagues })
    }
}
