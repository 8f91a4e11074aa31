//! The generated `RosterService` trait, implemented over the store. Who may
//! call what is [`ACCESS`]; the trait's methods call the room of their
//! subject: [`agents`], [`teams`] (and role definitions), [`organisation`]
//! (import and the organisation's view), [`delegation`], [`credentials`]
//! (tokens) and the long-lived [`watches`]; the wire forms of the domain
//! types are in [`convert`].

mod agents;
mod convert;
mod credentials;
mod delegation;
mod organisation;
mod teams;
mod watches;

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
};

use muster_proto::roster::v1::{self as pb, roster_service_server::RosterService};
use muster_runtime::auth::{Access, AgentDirectory, Caller, Rule, only_for_itself, rule, token};
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::{Request, Response, Status as GrpcStatus};

use crate::clock::Clock;
use crate::domain::delegation::Settings;
use crate::error::{Error, Result};
use crate::store::{QueueResolution, Store};

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
    rule("PlaceTasks", Access::OPERATOR.or(Access::SERVICE)),
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
        self.serve_register_agent(request).await
    }

    async fn get_agent(
        &self,
        request: Request<pb::GetAgentRequest>,
    ) -> Result<Response<pb::GetAgentResponse>, GrpcStatus> {
        self.serve_get_agent(request).await
    }

    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, GrpcStatus> {
        self.serve_list_agents(request).await
    }

    async fn update_agent(
        &self,
        request: Request<pb::UpdateAgentRequest>,
    ) -> Result<Response<pb::UpdateAgentResponse>, GrpcStatus> {
        self.serve_update_agent(request).await
    }

    async fn remove_agent(
        &self,
        request: Request<pb::RemoveAgentRequest>,
    ) -> Result<Response<pb::RemoveAgentResponse>, GrpcStatus> {
        self.serve_remove_agent(request).await
    }

    async fn set_agent_status(
        &self,
        request: Request<pb::SetAgentStatusRequest>,
    ) -> Result<Response<pb::SetAgentStatusResponse>, GrpcStatus> {
        self.serve_set_agent_status(request).await
    }

    async fn put_team(
        &self,
        request: Request<pb::PutTeamRequest>,
    ) -> Result<Response<pb::PutTeamResponse>, GrpcStatus> {
        self.serve_put_team(request).await
    }

    async fn list_teams(
        &self,
        request: Request<pb::ListTeamsRequest>,
    ) -> Result<Response<pb::ListTeamsResponse>, GrpcStatus> {
        self.serve_list_teams(request).await
    }

    async fn remove_team(
        &self,
        request: Request<pb::RemoveTeamRequest>,
    ) -> Result<Response<pb::RemoveTeamResponse>, GrpcStatus> {
        self.serve_remove_team(request).await
    }

    async fn put_role_definition(
        &self,
        request: Request<pb::PutRoleDefinitionRequest>,
    ) -> Result<Response<pb::PutRoleDefinitionResponse>, GrpcStatus> {
        self.serve_put_role_definition(request).await
    }

    async fn get_role_definition(
        &self,
        request: Request<pb::GetRoleDefinitionRequest>,
    ) -> Result<Response<pb::GetRoleDefinitionResponse>, GrpcStatus> {
        self.serve_get_role_definition(request).await
    }

    async fn list_role_definitions(
        &self,
        request: Request<pb::ListRoleDefinitionsRequest>,
    ) -> Result<Response<pb::ListRoleDefinitionsResponse>, GrpcStatus> {
        self.serve_list_role_definitions(request).await
    }

    async fn remove_role_definition(
        &self,
        request: Request<pb::RemoveRoleDefinitionRequest>,
    ) -> Result<Response<pb::RemoveRoleDefinitionResponse>, GrpcStatus> {
        self.serve_remove_role_definition(request).await
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

    type PlaceTasksStream = ResponseStream<pb::PlaceTasksResponse>;

    async fn place_tasks(
        &self,
        request: Request<tonic::Streaming<pb::PlaceTasksRequest>>,
    ) -> Result<Response<Self::PlaceTasksStream>, GrpcStatus> {
        self.serve_place_tasks(request).await
    }

    type WatchQueuedTaskStream = ResponseStream<pb::WatchQueuedTaskResponse>;

    async fn watch_queued_task(
        &self,
        request: Request<pb::WatchQueuedTaskRequest>,
    ) -> Result<Response<Self::WatchQueuedTaskStream>, GrpcStatus> {
        self.serve_watch_queued_task(request).await
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
        self.serve_watch_roster(request).await
    }

    async fn render_system_prompt(
        &self,
        request: Request<pb::RenderSystemPromptRequest>,
    ) -> Result<Response<pb::RenderSystemPromptResponse>, GrpcStatus> {
        self.serve_render_system_prompt(request).await
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, GrpcStatus> {
        self.serve_authenticate(request).await
    }

    async fn rotate_token(
        &self,
        request: Request<pb::RotateTokenRequest>,
    ) -> Result<Response<pb::RotateTokenResponse>, GrpcStatus> {
        self.serve_rotate_token(request).await
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, GrpcStatus> {
        self.serve_revoke_token(request).await
    }
}
