//! What the execution service asks of the roster ([`Roster`]), and its
//! implementation over gRPC ([`RosterClient`]). The engine and the handlers
//! see only the trait, so tests drive the engine with a roster of their own.

use std::{sync::Arc, time::Duration};

use muster_proto::roster::v1 as roster;
use muster_runtime::auth::client::AuthChannel;

use super::placements::Placements;
use crate::{
    domain::model::{AgentContext, Decision, RoleDefinition},
    grpc::convert,
    store::BoxFuture,
};

/// Iterations an agent may run per step when its roster entry says none.
pub(crate) const DEFAULT_MAX_ITERATIONS: u32 = 10;

/// Why the roster did not answer as hoped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RosterFailure {
    /// The roster cannot be reached now: ask again later.
    Unavailable(String),
    /// What was asked about does not exist.
    NotFound(String),
    /// The roster refused the request, saying why.
    Refused(String),
}

impl RosterFailure {
    pub(crate) fn message(&self) -> &str {
        match self {
            Self::Unavailable(message) | Self::NotFound(message) | Self::Refused(message) => message,
        }
    }
}

/// An agent as the execution service needs to know it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AgentInfo {
    pub(crate) id: String,
    pub(crate) role: String,
    pub(crate) offline: bool,
    pub(crate) allow_delegation: bool,
}

/// A delegation to ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DelegationAsk {
    /// `<execution>/<step>`: the roster keeps one reservation per task.
    pub(crate) task_id: String,
    pub(crate) requester_id: String,
    pub(crate) required_expertise: Vec<String>,
    pub(crate) required_role: String,
    pub(crate) team: String,
    /// `low`, `normal`, `high` or `critical`.
    pub(crate) urgency: String,
    /// When the work is due, in milliseconds since the epoch.
    pub(crate) deadline: Option<i64>,
    /// Agents the task passed through: none of them is chosen again.
    pub(crate) delegation_chain: Vec<String>,
    pub(crate) description: String,
    /// The agent the step names (or was handed or reassigned to): the
    /// roster checks only its capacity and status.
    pub(crate) assigned_agent_id: String,
    /// With `assigned_agent_id`: a slot of that agent only if one is free
    /// now; otherwise nothing is written (no queue, no audit record).
    pub(crate) only_if_free: bool,
}

/// What a roster role lists: the tools its agents may use, and the actions
/// they may take outside sessions (none listed: no list binds them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RoleGrants {
    pub(crate) tools: Vec<String>,
    pub(crate) actions: Vec<String>,
}

/// The roster, as the execution service uses it.
pub(crate) trait Roster: Send + Sync + 'static {
    /// Decides (and, for DELEGATE, reserves) who takes a task.
    fn delegate(&self, ask: DelegationAsk) -> BoxFuture<'_, Result<Decision, RosterFailure>>;
    /// Decides many tasks in one call, answering in their order.
    fn delegate_batch(&self, asks: Vec<DelegationAsk>) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>>;
    /// Waits until a queued task is resolved: offered to its expert or
    /// escalated. `Ok(None)` when the roster closed the watch (ask again).
    fn watch_queued(&self, task_id: String) -> BoxFuture<'_, Result<Option<Decision>, RosterFailure>>;
    /// Ends a task's reservation, freeing its slot.
    fn release(&self, task_id: String) -> BoxFuture<'_, Result<(), RosterFailure>>;
    /// Ends many tasks' reservations in one call.
    fn release_batch(&self, task_ids: Vec<String>) -> BoxFuture<'_, Result<(), RosterFailure>>;
    /// Ends `releases`' reservations, then decides `asks` (answering in
    /// their order), in one exchange where the roster can.
    fn place(
        &self,
        releases: Vec<String>,
        asks: Vec<DelegationAsk>,
    ) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        Box::pin(release_then_delegate(self, releases, asks))
    }
    /// An agent, or `NotFound`.
    fn agent(&self, agent_id: String) -> BoxFuture<'_, Result<AgentInfo, RosterFailure>>;
    /// What an assignment tells an agent about itself: role definition,
    /// rendered system prompt, limits, LLM settings.
    fn agent_context(&self, agent_id: String) -> BoxFuture<'_, Result<AgentContext, RosterFailure>>;
    /// The tools and actions a role lists (none for an unknown role).
    fn role_grants(&self, role: String) -> BoxFuture<'_, Result<RoleGrants, RosterFailure>>;
    /// Every agent and role, to check a process's references at publish.
    fn validation_context(&self) -> BoxFuture<'_, Result<muster_format::Context, RosterFailure>>;
}

/// [`Roster::place`] in two calls: the releases, then the delegations.
async fn release_then_delegate<R: Roster + ?Sized>(
    roster: &R,
    releases: Vec<String>,
    asks: Vec<DelegationAsk>,
) -> Result<Vec<Decision>, RosterFailure> {
    if !releases.is_empty() {
        roster.release_batch(releases).await?;
    }
    if asks.is_empty() {
        return Ok(Vec::new());
    }
    roster.delegate_batch(asks).await
}

/// The roster over gRPC: calls carry the service's credential and the
/// caller's trace context; the channel reconnects by itself. Placements go
/// on one stream ([`super::placements`]).
#[derive(Debug, Clone)]
pub(crate) struct RosterClient {
    client: roster::roster_service_client::RosterServiceClient<AuthChannel>,
    placements: Arc<Placements>,
}

impl RosterClient {
    /// A client over `channel`; call within the Tokio runtime.
    pub(crate) fn new(channel: AuthChannel) -> Self {
        let client = roster::roster_service_client::RosterServiceClient::new(channel);
        Self { placements: Arc::new(Placements::new(client.clone())), client }
    }

    /// Every role definition, page by page.
    pub(crate) async fn roles(&self) -> Result<Vec<RoleDefinition>, RosterFailure> {
        let mut client = self.client.clone();
        let mut roles = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = client
                .list_role_definitions(roster::ListRoleDefinitionsRequest { page_size: 1000, page_token })
                .await
                .map_err(failure)?
                .into_inner();
            for role in page.roles {
                roles.push(role_from_roster(role)?);
            }
            if page.next_page_token.is_empty() {
                return Ok(roles);
            }
            page_token = page.next_page_token;
        }
    }

    /// The roster's changes, as they happen.
    pub(crate) async fn watch(&self) -> Result<RosterChanges, RosterFailure> {
        let mut client = self.client.clone();
        // Not agents' status changes: one comes with every delegation and release.
        let kinds = [
            roster::RosterChangeKind::AgentUpserted,
            roster::RosterChangeKind::AgentRemoved,
            roster::RosterChangeKind::RoleUpserted,
            roster::RosterChangeKind::RoleRemoved,
        ];
        let request = roster::WatchRosterRequest { kinds: kinds.map(|kind| kind as i32).to_vec() };
        Ok(RosterChanges(client.watch_roster(request).await.map_err(failure)?.into_inner()))
    }
}

/// A change of the roster's agents or roles, as the engine follows them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RosterChange {
    /// A role was added or changed.
    RoleUpserted(Box<RoleDefinition>),
    /// The role of this name was removed.
    RoleRemoved(String),
    /// An agent was added, changed or removed (or a role change that does
    /// not read, which is logged).
    Other,
}

/// The roster's changes, as they happen.
pub(crate) struct RosterChanges(tonic::Streaming<roster::WatchRosterResponse>);

impl RosterChanges {
    /// The next change; `None` when the stream ends or breaks.
    pub(crate) async fn next(&mut self) -> Option<RosterChange> {
        let change = self.0.message().await.ok()??;
        let kind = roster::RosterChangeKind::try_from(change.kind).unwrap_or_default();
        Some(match (kind, change.role) {
            (roster::RosterChangeKind::RoleUpserted, Some(role)) => match role_from_roster(role) {
                Ok(role) => RosterChange::RoleUpserted(Box::new(role)),
                Err(failure) => {
                    tracing::warn!(error = %failure.message(), "a role the roster announced does not read");
                    RosterChange::Other
                }
            },
            (roster::RosterChangeKind::RoleRemoved, Some(role)) => RosterChange::RoleRemoved(role.name),
            _ => RosterChange::Other,
        })
    }
}

/// A role definition the roster answered with.
fn role_from_roster(role: roster::RoleDefinition) -> Result<RoleDefinition, RosterFailure> {
    let name = role.name.clone();
    muster_runtime::roles::role_from_wire(role).map_err(|invalid| {
        RosterFailure::Refused(format!("the roster's role definition '{name}' does not read: {}", invalid.message))
    })
}

/// Maps a status: outages are `Unavailable`, the roster's verdicts the others.
pub(super) fn failure(status: tonic::Status) -> RosterFailure {
    let message = status.message().to_owned();
    match status.code() {
        tonic::Code::NotFound => RosterFailure::NotFound(message),
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Unknown
        | tonic::Code::ResourceExhausted
        | tonic::Code::Cancelled
        | tonic::Code::Aborted => RosterFailure::Unavailable(format!("{}: {message}", status.code())),
        _ => RosterFailure::Refused(message),
    }
}

fn urgency(urgency: &str) -> roster::Urgency {
    match urgency {
        "low" => roster::Urgency::Low,
        "high" => roster::Urgency::High,
        "critical" => roster::Urgency::Critical,
        _ => roster::Urgency::Normal,
    }
}

fn agent_info(agent: roster::Agent) -> AgentInfo {
    AgentInfo {
        offline: agent.status == roster::AgentStatus::Offline as i32,
        allow_delegation: agent.allow_delegation,
        id: agent.id,
        role: agent.role,
    }
}

fn delegate_request(ask: DelegationAsk) -> roster::DelegateRequest {
    roster::DelegateRequest {
        task_id: ask.task_id,
        requester_id: ask.requester_id,
        required_expertise: ask.required_expertise,
        required_role: ask.required_role,
        team: ask.team,
        urgency: urgency(&ask.urgency) as i32,
        deadline: ask.deadline.map(muster_runtime::time::to_timestamp),
        delegation_chain: ask.delegation_chain,
        description: ask.description,
        assigned_agent_id: ask.assigned_agent_id,
        only_if_free: ask.only_if_free,
        ..Default::default()
    }
}

/// Most tasks in one `DelegateBatch`.
const BATCH: usize = 1000;

impl Roster for RosterClient {
    fn delegate(&self, ask: DelegationAsk) -> BoxFuture<'_, Result<Decision, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let response = client.delegate(delegate_request(ask)).await.map_err(failure)?.into_inner();
            Ok(convert::decision_from_wire(response.decision.unwrap_or_default()))
        })
    }

    fn delegate_batch(&self, asks: Vec<DelegationAsk>) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let mut decisions = Vec::with_capacity(asks.len());
            let mut asks = asks.into_iter().peekable();
            while asks.peek().is_some() {
                let requests: Vec<_> = asks.by_ref().take(BATCH).map(delegate_request).collect();
                let asked = requests.len();
                let response = client
                    .delegate_batch(roster::DelegateBatchRequest { requests })
                    .await
                    .map_err(failure)?
                    .into_inner();
                if response.responses.len() != asked {
                    return Err(RosterFailure::Refused(format!(
                        "the roster answered {} of {asked} tasks",
                        response.responses.len()
                    )));
                }
                decisions.extend(
                    response
                        .responses
                        .into_iter()
                        .map(|answer| convert::decision_from_wire(answer.decision.unwrap_or_default())),
                );
            }
            Ok(decisions)
        })
    }

    fn watch_queued(&self, task_id: String) -> BoxFuture<'_, Result<Option<Decision>, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let mut stream = client
                .watch_queued_task(roster::WatchQueuedTaskRequest { task_id })
                .await
                .map_err(failure)?
                .into_inner();
            match stream.message().await.map_err(failure)? {
                Some(roster::WatchQueuedTaskResponse { decision: Some(decision) }) => {
                    Ok(Some(convert::decision_from_wire(decision)))
                }
                _ => Ok(None),
            }
        })
    }

    fn release(&self, task_id: String) -> BoxFuture<'_, Result<(), RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            client.release_task(roster::ReleaseTaskRequest { task_id }).await.map_err(failure)?;
            Ok(())
        })
    }

    fn release_batch(&self, task_ids: Vec<String>) -> BoxFuture<'_, Result<(), RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            for chunk in task_ids.chunks(BATCH) {
                let request = roster::ReleaseTasksRequest { task_ids: chunk.to_vec() };
                client.release_tasks(request).await.map_err(failure)?;
            }
            Ok(())
        })
    }

    fn place(
        &self,
        releases: Vec<String>,
        asks: Vec<DelegationAsk>,
    ) -> BoxFuture<'_, Result<Vec<Decision>, RosterFailure>> {
        Box::pin(async move {
            if self.placements.unimplemented() || releases.len() > BATCH || asks.len() > BATCH {
                return release_then_delegate(self, releases, asks).await;
            }
            let asked = asks.len();
            let request = roster::PlaceTasksRequest {
                id: 0,
                release_task_ids: releases.clone(),
                delegations: asks.iter().cloned().map(delegate_request).collect(),
                trace_parent: muster_runtime::telemetry::traceparent(&tracing::Span::current()),
            };
            let answer = match self.placements.place(request).await {
                // A roster without the stream learnt so just now.
                Err(_) if self.placements.unimplemented() => return release_then_delegate(self, releases, asks).await,
                answer => answer?,
            };
            if let Some(refusal) = answer.refusal {
                return Err(failure(tonic::Status::new(tonic::Code::from(refusal.code), refusal.message)));
            }
            if answer.delegations.len() != asked {
                return Err(RosterFailure::Refused(format!(
                    "the roster answered {} of {asked} tasks",
                    answer.delegations.len()
                )));
            }
            Ok(answer
                .delegations
                .into_iter()
                .map(|answer| convert::decision_from_wire(answer.decision.unwrap_or_default()))
                .collect())
        })
    }

    fn agent(&self, agent_id: String) -> BoxFuture<'_, Result<AgentInfo, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let response = client.get_agent(roster::GetAgentRequest { id: agent_id.clone() }).await.map_err(
                |status| match status.code() {
                    // An id the roster cannot hold is an agent it does not have.
                    tonic::Code::InvalidArgument => RosterFailure::NotFound(status.message().to_owned()),
                    _ => failure(status),
                },
            )?;
            response
                .into_inner()
                .agent
                .map(agent_info)
                .ok_or_else(|| RosterFailure::NotFound(format!("agent '{agent_id}' is not in the roster")))
        })
    }

    fn agent_context(&self, agent_id: String) -> BoxFuture<'_, Result<AgentContext, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let agent = client
                .get_agent(roster::GetAgentRequest { id: agent_id.clone() })
                .await
                .map_err(failure)?
                .into_inner()
                .agent
                .ok_or_else(|| RosterFailure::NotFound(format!("agent '{agent_id}' is not in the roster")))?;
            let role_definition = if agent.role.is_empty() {
                None
            } else {
                match client.get_role_definition(roster::GetRoleDefinitionRequest { name: agent.role.clone() }).await {
                    Ok(response) => response.into_inner().role.map(role_from_roster).transpose()?,
                    Err(status) if status.code() == tonic::Code::NotFound => None,
                    Err(status) => return Err(failure(status)),
                }
            };
            let system_prompt = client
                .render_system_prompt(roster::RenderSystemPromptRequest { agent_id })
                .await
                .map_err(failure)?
                .into_inner()
                .system_prompt;
            Ok(AgentContext {
                roster_role: agent.role,
                role_definition,
                system_prompt: Arc::from(system_prompt),
                max_iterations: if agent.max_iterations == 0 { DEFAULT_MAX_ITERATIONS } else { agent.max_iterations },
                llm_config_json: agent
                    .llm_config
                    .as_ref()
                    .and_then(|config| muster_runtime::json::struct_to_text(Some(config)).ok())
                    .unwrap_or_default(),
                allow_delegation: agent.allow_delegation,
                memory: Vec::new(),
            })
        })
    }

    fn role_grants(&self, role: String) -> BoxFuture<'_, Result<RoleGrants, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            match client.get_role_definition(roster::GetRoleDefinitionRequest { name: role }).await {
                Ok(response) => Ok(response
                    .into_inner()
                    .role
                    .map(|role| RoleGrants { tools: role.tools, actions: role.permitted_actions })
                    .unwrap_or_default()),
                Err(status) if status.code() == tonic::Code::NotFound => Ok(RoleGrants::default()),
                Err(status) => Err(failure(status)),
            }
        })
    }

    fn validation_context(&self) -> BoxFuture<'_, Result<muster_format::Context, RosterFailure>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let mut agents = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .list_agents(roster::ListAgentsRequest { page_size: 1000, page_token, ..Default::default() })
                    .await
                    .map_err(failure)?
                    .into_inner();
                agents.extend(page.agents.into_iter().map(|agent| muster_format::KnownAgent {
                    offline: agent.status == roster::AgentStatus::Offline as i32,
                    role: (!agent.role.is_empty()).then_some(agent.role),
                    id: agent.id,
                }));
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            let roles: Vec<muster_format::KnownRole> = self
                .roles()
                .await?
                .into_iter()
                .map(|role| muster_format::KnownRole {
                    name: role.name,
                    permitted_tools: role.tools,
                    permitted_actions: role.permitted_actions,
                })
                .collect();
            Ok(muster_format::Context {
                agents: Some(agents),
                // Roles are checked when the roster defines some.
                roles: (!roles.is_empty()).then_some(roles),
                tools: None,
            })
        })
    }
}

/// The pause between two calls to a roster that is unavailable.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Retries `call` while the roster is unavailable, waiting `pause` between
/// attempts; its verdicts (found, not found, refused) end the wait.
pub(crate) async fn patiently<T, F>(
    pause: Duration,
    what: &str,
    mut call: impl FnMut() -> F,
) -> Result<T, RosterFailure>
where
    F: std::future::Future<Output = Result<T, RosterFailure>>,
{
    loop {
        match call().await {
            Err(RosterFailure::Unavailable(message)) => {
                tracing::warn!(error = %message, "the roster is unavailable; {what} waits");
                tokio::time::sleep(pause).await;
            }
            outcome => return outcome,
        }
    }
}
