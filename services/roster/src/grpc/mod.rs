//! The generated `RosterService` trait, implemented over the store.

mod delegation;
mod organisation;

use std::{
    collections::{HashMap, HashSet},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use muster_proto::roster::v1::{self as pb, roster_service_server::RosterService};
use muster_runtime::auth::{
    Access, AgentDirectory, Caller, Rule, TokenHash,
    directory::{CredentialChange, Position},
    only_for_itself, permission_denied, rule, token,
};
use muster_runtime::paging::page;
use tokio::sync::broadcast;
use tokio_stream::{Stream, StreamExt, wrappers::BroadcastStream};
use tonic::{Request, Response, Status as GrpcStatus};

use crate::clock::Clock;
use crate::convert::{
    agent_from_wire, agent_to_wire, decision_to_wire, required_id, required_name, role_from_wire, role_to_wire,
    status_from_wire, team_from_wire, team_to_wire, update_mask_fields,
};
use crate::domain::{delegation::Settings, model::normalize_tags, prompt::render_system_prompt};
use crate::error::{Error, Result};
use crate::store::{AgentQuery, QueueResolution, QueueState, Store};

/// Most agents per ListAgents page.
const MAX_PAGE_SIZE: u32 = 1000;
/// Bytes after which a page ends early (one agent or role is at most a few
/// hundred KiB, so a page stays far below the 4 MiB message limit).
const MAX_PAGE_BYTES: usize = 1024 * 1024;

/// The page size asked for, within bounds (0: the largest).
fn page_size(asked: u32) -> usize {
    (if asked == 0 { MAX_PAGE_SIZE } else { asked.min(MAX_PAGE_SIZE) }) as usize
}
/// Capacity of the change and queue broadcast channels.
const CHANNEL_CAPACITY: usize = 1024;
/// How often a watch of a queued task reads the task's state from the
/// database, for a resolution another replica made (its own it hears of at once).
const QUEUE_WATCH_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// The roster service over a store.
#[derive(Debug)]
pub struct RosterGrpc<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for RosterGrpc<S> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

#[derive(Debug)]
struct Inner<S> {
    store: S,
    clock: Arc<dyn Clock>,
    settings: Settings,
    roster_changes: broadcast::Sender<pb::WatchRosterResponse>,
    /// Watchers that asked for agents' status changes: with none, a
    /// delegation or release announces nothing.
    status_watchers: Arc<std::sync::atomic::AtomicUsize>,
    queue_resolutions: broadcast::Sender<QueueResolution>,
    /// Held while the queue gauge is counted and set (see [`RosterGrpc::refresh_queue_gauge`]).
    queue_gauge: tokio::sync::Mutex<()>,
    /// Notified after every credential change this process makes.
    credentials_changed: tokio::sync::Notify,
    /// The roster's own copy of the credentials, which authenticates its callers.
    directory: AgentDirectory,
    /// The role definitions as this replica last announced or saw them
    /// (`None` until the first refresh): a difference is another replica's change.
    known_roles: Mutex<Option<HashMap<String, pb::RoleDefinition>>>,
}

/// Who may call each method of the RosterService. Finer rules (an agent
/// acting only for itself) are in the handlers.
pub const ACCESS: &[Rule] = &[
    rule("RegisterAgent", Access::OPERATOR),
    rule("GetAgent", Access::ANYONE),
    rule("ListAgents", Access::ANYONE),
    rule("UpdateAgent", Access::OPERATOR),
    rule("RemoveAgent", Access::OPERATOR),
    rule("SetAgentStatus", Access::OPERATOR.or(Access::AGENT)),
    rule("PutTeam", Access::OPERATOR),
    rule("ListTeams", Access::ANYONE),
    rule("RemoveTeam", Access::OPERATOR),
    rule("PutRoleDefinition", Access::OPERATOR),
    rule("GetRoleDefinition", Access::ANYONE),
    rule("ListRoleDefinitions", Access::ANYONE),
    rule("RemoveRoleDefinition", Access::OPERATOR),
    rule("ImportRoster", Access::OPERATOR),
    rule("GetOrganizationRoster", Access::ANYONE),
    rule("Delegate", Access::ANYONE),
    rule("DelegateBatch", Access::OPERATOR.or(Access::SERVICE)),
    rule("ReleaseTask", Access::OPERATOR.or(Access::SERVICE)),
    rule("ReleaseTasks", Access::OPERATOR.or(Access::SERVICE)),
    rule("WatchQueuedTask", Access::OPERATOR.or(Access::SERVICE)),
    rule("ListDelegations", Access::ANYONE),
    rule("WatchRoster", Access::ANYONE),
    rule("RenderSystemPrompt", Access::ANYONE),
    rule("Authenticate", Access::ANYONE),
    rule("RotateToken", Access::OPERATOR.or(Access::AGENT)),
    rule("RevokeToken", Access::OPERATOR.or(Access::AGENT)),
];

/// Who may call the CredentialService: the cluster's services.
pub const CREDENTIAL_ACCESS: &[Rule] = &[rule("WatchCredentials", Access::SERVICE)];

/// One watcher of agents' status changes, counted while it lives.
struct StatusWatcher(Arc<std::sync::atomic::AtomicUsize>);

impl StatusWatcher {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for StatusWatcher {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A new agent token.
fn new_token() -> Result<String> {
    token::generate(token::AGENT_PREFIX).map_err(|error| Error::Internal(error.to_string()))
}

impl<S: Store> RosterGrpc<S> {
    /// A service over `store`, reading time from `clock`.
    pub fn new(store: S, clock: Arc<dyn Clock>, settings: Settings) -> Self {
        let (roster_changes, _) = broadcast::channel(CHANNEL_CAPACITY);
        let (queue_resolutions, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            inner: Arc::new(Inner {
                store,
                clock,
                settings,
                roster_changes,
                status_watchers: Arc::default(),
                queue_resolutions,
                queue_gauge: tokio::sync::Mutex::new(()),
                credentials_changed: tokio::sync::Notify::new(),
                directory: AgentDirectory::new(std::time::Duration::from_secs(5)),
                known_roles: Mutex::new(None),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    fn now(&self) -> i64 {
        self.inner.clock.now_millis()
    }

    /// The roster's own copy of the agent credentials, kept from its
    /// database (see [`muster_runtime::auth::watch::spawn_local_follower`]).
    pub fn directory(&self) -> &AgentDirectory {
        &self.inner.directory
    }

    /// After a credential change: the roster's own copy takes it at once (a
    /// token it just issued works on the next call, one it revoked does not),
    /// and the credential streams are woken.
    async fn credentials_changed(&self) {
        if let Err(status) = muster_runtime::auth::watch::catch_up(self, &self.inner.directory).await {
            tracing::warn!(error = %status.message(), "reading the agents' credentials failed; the follower retries");
        }
        self.inner.credentials_changed.notify_waiters();
    }

    async fn announce_agents(&self, kind: pb::RosterChangeKind, ids: &[String]) {
        let status_unwatched = kind == pb::RosterChangeKind::AgentStatus
            && self.inner.status_watchers.load(std::sync::atomic::Ordering::Relaxed) == 0;
        if self.inner.roster_changes.receiver_count() == 0 || status_unwatched {
            return;
        }
        for id in ids {
            // The organisation in memory has every change this replica committed.
            match self.inner.store.indexed_agent(id).await {
                Ok(agent) => {
                    let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
                        kind: kind as i32,
                        agent: Some(agent_to_wire(&agent)),
                        role: None,
                    });
                }
                Err(error) => {
                    tracing::debug!(%error, agent_id = %id, "agent changed and vanished before it was announced")
                }
            }
        }
    }

    /// Tells the roster's watchers about roles put (as stored) or removed
    /// (by name).
    fn announce_roles(&self, kind: pb::RosterChangeKind, roles: Vec<pb::RoleDefinition>) {
        if let Some(known) = self.known_roles().as_mut() {
            for role in &roles {
                if kind == pb::RosterChangeKind::RoleRemoved {
                    known.remove(&role.name);
                } else {
                    known.insert(role.name.clone(), role.clone());
                }
            }
        }
        for role in roles {
            let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
                kind: kind as i32,
                agent: None,
                role: Some(role),
            });
        }
    }

    fn announce_resolutions(&self, resolutions: &[QueueResolution]) {
        for resolution in resolutions {
            tracing::info!(task_id = %resolution.task_id, decision = resolution.decision.kind.as_str(), agent_id = %resolution.decision.primary_agent_id, "queued task resolved");
            let _ = self.inner.queue_resolutions.send(resolution.clone());
        }
    }

    /// Takes into the organisation held in memory what other replicas
    /// changed in the database; a background task calls this every
    /// `MUSTER_ROSTER_INDEX_REFRESH_INTERVAL_MS`.
    ///
    /// What other replicas changed reaches this replica's `WatchRoster`
    /// streams then: the agents they changed (removals with the periodic full
    /// comparison), and the roles they put or removed.
    pub async fn refresh_index(&self) -> Result<()> {
        let changes = self.inner.store.refresh_index(self.now()).await?;
        self.announce_agents(pb::RosterChangeKind::AgentUpserted, &changes.changed).await;
        for id in changes.removed {
            let _ = self.inner.roster_changes.send(pb::WatchRosterResponse {
                kind: pb::RosterChangeKind::AgentRemoved as i32,
                agent: Some(pb::Agent { id, ..Default::default() }),
                role: None,
            });
        }
        self.follow_roles().await
    }

    fn known_roles(&self) -> MutexGuard<'_, Option<HashMap<String, pb::RoleDefinition>>> {
        self.inner.known_roles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Announces the roles another replica put or removed since the last look.
    async fn follow_roles(&self) -> Result<()> {
        let listed: HashMap<String, pb::RoleDefinition> =
            self.inner.store.list_roles().await?.iter().map(|role| (role.name.clone(), role_to_wire(role))).collect();
        let (put, removed) = {
            let mut known = self.known_roles();
            let Some(previous) = known.as_mut() else {
                *known = Some(listed);
                return Ok(());
            };
            let put: Vec<pb::RoleDefinition> =
                listed.values().filter(|role| previous.get(&role.name) != Some(*role)).cloned().collect();
            let removed: Vec<pb::RoleDefinition> = previous
                .keys()
                .filter(|name| !listed.contains_key(*name))
                .map(|name| pb::RoleDefinition { name: name.clone(), ..Default::default() })
                .collect();
            *previous = listed;
            (put, removed)
        };
        self.announce_roles(pb::RosterChangeKind::RoleUpserted, put);
        self.announce_roles(pb::RosterChangeKind::RoleRemoved, removed);
        Ok(())
    }

    /// Escalates the queued tasks gone stale; the background sweeper calls this.
    ///
    /// It also sets the queue gauge, even when nothing went stale: replicas
    /// sharing a database see each other's changes to the queue this way,
    /// within one sweep interval.
    pub async fn sweep_queue(&self) -> Result<usize> {
        let resolutions = self.inner.store.escalate_stale(self.now()).await?;
        self.announce_resolutions(&resolutions);
        self.refresh_queue_gauge().await?;
        Ok(resolutions.len())
    }

    /// Sets the gauge `muster_roster_queued_tasks` to the number of tasks
    /// waiting in the delegation queue, counted in the store, and returns it.
    ///
    /// Called at startup and after every change to the queue: a Delegate
    /// (which queues a task, or resolves the one queued under its task id),
    /// a release (which withdraws a queued task or offers it the freed slot)
    /// and each sweep (escalations). Counting in the store rather than keeping
    /// a count in memory makes it right after a restart and with several
    /// replicas. Counts are taken and set one at a time, so the value left
    /// after concurrent changes was counted after the last of them.
    pub async fn refresh_queue_gauge(&self) -> Result<u64> {
        let _one_at_a_time = self.inner.queue_gauge.lock().await;
        let queued = self.inner.store.queued_task_count().await?;
        muster_runtime::metrics::set(
            "muster_roster_queued_tasks",
            "Tasks waiting in the delegation queue: QUEUE decisions not yet resolved",
            &[],
            queued as f64,
        );
        Ok(queued)
    }

    /// [`Self::refresh_queue_gauge`] after a change that is already committed:
    /// a failure to count is logged, not returned to the caller.
    async fn refresh_queue_gauge_after_change(&self) {
        if let Err(error) = self.refresh_queue_gauge().await {
            tracing::warn!(%error, "counting the delegation queue failed; its gauge is stale until the next change");
        }
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, GrpcStatus>> + Send + 'static>>;

#[tonic::async_trait]
impl<S: Store> RosterService for RosterGrpc<S> {
    async fn register_agent(
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

    async fn get_agent(
        &self,
        request: Request<pb::GetAgentRequest>,
    ) -> Result<Response<pb::GetAgentResponse>, GrpcStatus> {
        let id = required_id("id", &request.into_inner().id)?;
        let agent = self.inner.store.get_agent(&id).await?;
        Ok(Response::new(pb::GetAgentResponse { agent: Some(agent_to_wire(&agent)) }))
    }

    async fn list_agents(
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

    async fn update_agent(
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

    async fn remove_agent(
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

    async fn set_agent_status(
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

    async fn put_team(
        &self,
        request: Request<pb::PutTeamRequest>,
    ) -> Result<Response<pb::PutTeamResponse>, GrpcStatus> {
        let team = team_from_wire(request.into_inner().team)?;
        let stored = self.inner.store.put_team(&team, self.now()).await?;
        Ok(Response::new(pb::PutTeamResponse { team: Some(team_to_wire(&stored)) }))
    }

    async fn list_teams(
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

    async fn remove_team(
        &self,
        request: Request<pb::RemoveTeamRequest>,
    ) -> Result<Response<pb::RemoveTeamResponse>, GrpcStatus> {
        let name = required_id("name", &request.into_inner().name)?;
        self.inner.store.remove_team(&name).await?;
        Ok(Response::new(pb::RemoveTeamResponse {}))
    }

    async fn put_role_definition(
        &self,
        request: Request<pb::PutRoleDefinitionRequest>,
    ) -> Result<Response<pb::PutRoleDefinitionResponse>, GrpcStatus> {
        let role = role_from_wire(request.into_inner().role)?;
        let stored = self.inner.store.put_role(&role, self.now()).await?;
        self.announce_roles(pb::RosterChangeKind::RoleUpserted, vec![role_to_wire(&stored)]);
        Ok(Response::new(pb::PutRoleDefinitionResponse { role: Some(role_to_wire(&stored)) }))
    }

    async fn get_role_definition(
        &self,
        request: Request<pb::GetRoleDefinitionRequest>,
    ) -> Result<Response<pb::GetRoleDefinitionResponse>, GrpcStatus> {
        let name = required_name("name", &request.into_inner().name)?;
        let role = self.inner.store.get_role(&name).await?;
        Ok(Response::new(pb::GetRoleDefinitionResponse { role: Some(role_to_wire(&role)) }))
    }

    async fn list_role_definitions(
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

    async fn remove_role_definition(
        &self,
        request: Request<pb::RemoveRoleDefinitionRequest>,
    ) -> Result<Response<pb::RemoveRoleDefinitionResponse>, GrpcStatus> {
        let name = required_name("name", &request.into_inner().name)?;
        self.inner.store.remove_role(&name).await?;
        let removed = pb::RoleDefinition { name, ..Default::default() };
        self.announce_roles(pb::RosterChangeKind::RoleRemoved, vec![removed]);
        Ok(Response::new(pb::RemoveRoleDefinitionResponse {}))
    }

    async fn import_roster(
        &self,
        request: Request<pb::ImportRosterRequest>,
    ) -> Result<Response<pb::ImportRosterResponse>, GrpcStatus> {
        Ok(Response::new(self.import_roster(request.into_inner()).await?))
    }

    async fn get_organization_roster(
        &self,
        request: Request<pb::GetOrganizationRosterRequest>,
    ) -> Result<Response<pb::GetOrganizationRosterResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        only_for_itself(&caller, request.agent_id.trim(), "read the organisation as another agent")?;
        Ok(Response::new(self.organization_roster(request).await?))
    }

    async fn delegate(
        &self,
        request: Request<pb::DelegateRequest>,
    ) -> Result<Response<pb::DelegateResponse>, GrpcStatus> {
        self.serve_delegate(request).await
    }

    async fn delegate_batch(
        &self,
        request: Request<pb::DelegateBatchRequest>,
    ) -> Result<Response<pb::DelegateBatchResponse>, GrpcStatus> {
        self.serve_delegate_batch(request).await
    }

    async fn release_task(
        &self,
        request: Request<pb::ReleaseTaskRequest>,
    ) -> Result<Response<pb::ReleaseTaskResponse>, GrpcStatus> {
        self.serve_release_task(request).await
    }

    async fn release_tasks(
        &self,
        request: Request<pb::ReleaseTasksRequest>,
    ) -> Result<Response<pb::ReleaseTasksResponse>, GrpcStatus> {
        self.serve_release_tasks(request).await
    }

    type WatchQueuedTaskStream = ResponseStream<pb::WatchQueuedTaskResponse>;

    async fn watch_queued_task(
        &self,
        request: Request<pb::WatchQueuedTaskRequest>,
    ) -> Result<Response<Self::WatchQueuedTaskStream>, GrpcStatus> {
        let task_id = request.into_inner().task_id.trim().to_owned();
        if task_id.is_empty() {
            return Err(Error::invalid("task_id", "task_id: required").into());
        }
        // Subscribe before reading the state, so a resolution in between is not missed.
        let mut receiver = self.inner.queue_resolutions.subscribe();
        let state = self.inner.store.queue_state(&task_id).await?;
        let roster = self.clone();
        let stream = async_stream_once(async move {
            if let QueueState::Resolved(decision) = state {
                return Ok(pb::WatchQueuedTaskResponse { decision: Some(decision_to_wire(&decision)) });
            }
            loop {
                let Ok(received) = tokio::time::timeout(QUEUE_WATCH_POLL, receiver.recv()).await else {
                    // Another replica may have resolved it.
                    if let QueueState::Resolved(decision) = roster.inner.store.queue_state(&task_id).await? {
                        return Ok(pb::WatchQueuedTaskResponse { decision: Some(decision_to_wire(&decision)) });
                    }
                    continue;
                };
                match received {
                    Ok(resolution) if resolution.task_id == task_id => {
                        return Ok(pb::WatchQueuedTaskResponse {
                            decision: Some(decision_to_wire(&resolution.decision)),
                        });
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if let QueueState::Resolved(decision) = roster.inner.store.queue_state(&task_id).await? {
                            return Ok(pb::WatchQueuedTaskResponse { decision: Some(decision_to_wire(&decision)) });
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(Error::RetryLater {
                            reason: "SHUTTING_DOWN",
                            message: "the roster is shutting down; try again".to_owned(),
                        });
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_delegations(
        &self,
        request: Request<pb::ListDelegationsRequest>,
    ) -> Result<Response<pb::ListDelegationsResponse>, GrpcStatus> {
        self.serve_list_delegations(request).await
    }

    type WatchRosterStream = ResponseStream<pb::WatchRosterResponse>;

    async fn watch_roster(
        &self,
        request: Request<pb::WatchRosterRequest>,
    ) -> Result<Response<Self::WatchRosterStream>, GrpcStatus> {
        let mut kinds = HashSet::new();
        for (index, &kind) in request.get_ref().kinds.iter().enumerate() {
            match pb::RosterChangeKind::try_from(kind) {
                Ok(pb::RosterChangeKind::Unspecified) | Err(_) => {
                    return Err(Error::invalid(
                        format!("kinds[{index}]"),
                        format!("kinds[{index}]: {kind} is not a kind of change"),
                    )
                    .into());
                }
                Ok(_) => {
                    kinds.insert(kind);
                }
            }
        }
        let status = kinds.is_empty() || kinds.contains(&(pb::RosterChangeKind::AgentStatus as i32));
        // Counted while the stream lives.
        let watching = status.then(|| StatusWatcher::new(&self.inner.status_watchers));
        let stream = BroadcastStream::new(self.inner.roster_changes.subscribe()).filter_map(move |change| {
            let _watching = &watching;
            match change {
                Ok(change) if kinds.is_empty() || kinds.contains(&change.kind) => Some(Ok(change)),
                Ok(_) => None,
                Err(error) => {
                    tracing::warn!(%error, "a roster watcher fell behind; changes were skipped");
                    None
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn render_system_prompt(
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

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let token = request.into_inner().token;
        let token = token.trim();
        if token.is_empty() {
            return Err(Error::invalid("token", "token: required").into());
        }
        let agent = self.inner.store.agent_by_token(&TokenHash::of(token)).await?;
        // An agent learns who it is, and nothing of other tokens: another
        // agent's token and an unknown one get the same refusal.
        if let Some(own) = caller.agent_id()
            && agent.as_ref().is_none_or(|agent| agent.id != own)
        {
            return Err(permission_denied(
                &caller,
                "authenticate a token",
                "NOT_THE_AGENT",
                "an agent may authenticate only its own token".to_owned(),
                &[],
            ));
        }
        match agent {
            Some(agent) => Ok(Response::new(pb::AuthenticateResponse { agent: Some(agent_to_wire(&agent)) })),
            None => Err(Error::Unauthenticated {
                reason: "CREDENTIAL_UNKNOWN",
                message: "the token is not valid: unknown, rotated or revoked".into(),
            }
            .into()),
        }
    }

    async fn rotate_token(
        &self,
        request: Request<pb::RotateTokenRequest>,
    ) -> Result<Response<pb::RotateTokenResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let agent_id = required_id("agent_id", &request.into_inner().agent_id)?;
        only_for_itself(&caller, &agent_id, "rotate the token of another agent")?;
        let token = new_token()?;
        self.inner.store.replace_token(&agent_id, Some(&TokenHash::of(&token)), self.now()).await?;
        self.credentials_changed().await;
        tracing::info!(agent_id = %agent_id, "token rotated");
        Ok(Response::new(pb::RotateTokenResponse { token }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, GrpcStatus> {
        let caller = Caller::of(&request)?;
        let agent_id = required_id("agent_id", &request.into_inner().agent_id)?;
        only_for_itself(&caller, &agent_id, "revoke the token of another agent")?;
        self.inner.store.replace_token(&agent_id, None, self.now()).await?;
        self.credentials_changed().await;
        tracing::info!(agent_id = %agent_id, "token revoked");
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }
}

/// A stream of the one item `future` produces; the future is dropped when the client goes away.
fn async_stream_once<T: Send + 'static>(
    future: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> impl Stream<Item = Result<T, GrpcStatus>> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        tokio::select! {
            result = future => {
                let _ = sender.send(result.map_err(GrpcStatus::from)).await;
            }
            () = sender.closed() => {}
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

impl<S: Store> muster_runtime::auth::watch::CredentialLog for RosterGrpc<S> {
    async fn changes_after(&self, position: Position, limit: usize) -> Result<Vec<CredentialChange>, GrpcStatus> {
        Ok(self.inner.store.credential_changes_after(position, limit).await?)
    }

    fn changed(&self) -> &tokio::sync::Notify {
        &self.inner.credentials_changed
    }
}
