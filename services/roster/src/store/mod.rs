//! Storage: the repository trait the service talks to and its one sqlx
//! implementation (SQLite and PostgreSQL through the `Any` driver).

mod sql;

use std::{future::Future, sync::Arc};

use muster_runtime::auth::{
    TokenHash,
    directory::{CredentialChange, Position},
};
pub use sql::SqlStore;
pub use sql::index::refresh::FULL_CHECK_EVERY as INDEX_FULL_CHECK_EVERY;

use crate::domain::{
    delegation::{Decision, DelegationRequest, Settings},
    model::{Agent, AgentField, RoleDefinition, Status, Team},
};
use crate::error::Result;

/// ListAgents filters; they combine with AND.
#[derive(Debug, Clone, Default)]
pub struct AgentQuery {
    /// Only this team.
    pub team: String,
    /// Only this role.
    pub role: String,
    /// Only this effective status.
    pub status: Option<Status>,
    /// Only agents with this tag.
    pub expertise: String,
    /// Only agents not offline and below capacity.
    pub available_only: bool,
    /// Only ids greater than this (pagination).
    pub after_id: String,
    /// Most rows; 0 for no limit.
    pub limit: u32,
}

/// What ImportRoster stores, all or nothing.
#[derive(Debug, Clone, Default)]
pub struct ImportPlan {
    /// Teams to create or replace.
    pub teams: Vec<Team>,
    /// Roles to create or replace.
    pub roles: Vec<RoleDefinition>,
    /// Agents to create or update (descriptive fields only for existing ones),
    /// each with the token to give it if it is new.
    pub agents: Vec<(Agent, TokenHash)>,
}

/// The result of a Delegate.
#[derive(Debug, Clone)]
pub struct DelegationOutcome {
    /// The decision.
    pub decision: Decision,
    /// The audit record's id; empty for a dry run.
    pub delegation_id: String,
    /// Agents whose workload changed (the delegate, and the agent a re-delegated task left).
    pub changed_agents: Vec<String>,
    /// Whether the queue of waiting tasks changed (a task queued, or one that waited resolved).
    pub queue_changed: bool,
}

/// A queued task resolved: offered to its expert or escalated.
#[derive(Debug, Clone)]
pub struct QueueResolution {
    /// The task.
    pub task_id: String,
    /// The decision that resolved it.
    pub decision: Decision,
    /// Its audit record's id.
    pub delegation_id: String,
}

/// The result of a ReleaseTask.
#[derive(Debug, Clone, Default)]
pub struct ReleaseOutcome {
    /// The agent whose slot was freed; `None` when the task held none.
    pub agent_id: Option<String>,
    /// The queued task the freed slot went to, if any.
    pub offered: Option<QueueResolution>,
    /// Whether the queue of waiting tasks changed.
    pub queue_changed: bool,
}

/// A queued task's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueState {
    /// Still waiting.
    Queued,
    /// Resolved by this decision.
    Resolved(Box<Decision>),
}

/// A recorded decision.
#[derive(Debug, Clone)]
pub struct DelegationRecord {
    /// Unique id.
    pub id: String,
    /// The task.
    pub task_id: String,
    /// Who asked.
    pub requester_id: String,
    /// The decision.
    pub decision: Decision,
    /// When, in ms since the epoch.
    pub decided_at: i64,
    /// The task's description.
    pub description: String,
    /// Where it is in the audit trail: (`decided_at`, its sequence number).
    pub position: (i64, i64),
}

/// ListDelegations filters.
#[derive(Debug, Clone, Default)]
pub struct DelegationQuery {
    /// Requested by or chose this agent.
    pub agent_id: String,
    /// About this task.
    pub task_id: String,
    /// At or after (ms).
    pub since: Option<i64>,
    /// Before (ms).
    pub until: Option<i64>,
    /// Most records.
    pub limit: u32,
    /// Only records after this position (the last of the previous page).
    pub after: Option<(i64, i64)>,
}

/// The agents other writers of the database changed or removed, as a
/// refresh of the organisation in memory found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexChanges {
    /// Added or changed: read again.
    pub changed: Vec<String>,
    /// Removed (found by the periodic full comparison).
    pub removed: Vec<String>,
}

/// The roster's repository. Every method is one transaction.
pub trait Store: Send + Sync + 'static {
    /// Creates the schema.
    fn migrate(&self) -> impl Future<Output = Result<()>> + Send;

    /// Creates an agent with its token; ALREADY_EXISTS when the id is taken,
    /// INVALID_ARGUMENT when its team or senior does not exist.
    fn insert_agent(&self, agent: &Agent, token: &TokenHash, now: i64) -> impl Future<Output = Result<Agent>> + Send;
    /// One agent; NOT_FOUND when unknown.
    fn get_agent(&self, id: &str) -> impl Future<Output = Result<Agent>> + Send;
    /// Agents by id.
    fn list_agents(&self, query: &AgentQuery) -> impl Future<Output = Result<Vec<Agent>>> + Send;
    /// Changes the descriptive `fields` of an agent to those of `agent`,
    /// keeping the others, the workload, the manual status and the token;
    /// the result is validated again.
    fn update_agent(
        &self,
        agent: &Agent,
        fields: &[AgentField],
        now: i64,
    ) -> impl Future<Output = Result<Agent>> + Send;
    /// Removes an agent and revokes its tokens; FAILED_PRECONDITION while it is a senior.
    fn remove_agent(&self, id: &str, now: i64) -> impl Future<Output = Result<()>> + Send;
    /// Sets or clears a manual status and the availability.
    fn set_status(
        &self,
        id: &str,
        status: Option<Status>,
        availability_until: Option<i64>,
        now: i64,
    ) -> impl Future<Output = Result<Agent>> + Send;

    /// Creates or replaces a team; its lead must exist.
    fn put_team(&self, team: &Team, now: i64) -> impl Future<Output = Result<Team>> + Send;
    /// Teams by name.
    fn list_teams(&self) -> impl Future<Output = Result<Vec<Team>>> + Send;
    /// Removes a team without agents.
    fn remove_team(&self, name: &str) -> impl Future<Output = Result<()>> + Send;

    /// Creates or replaces a role definition.
    fn put_role(&self, role: &RoleDefinition, now: i64) -> impl Future<Output = Result<RoleDefinition>> + Send;
    /// One role definition.
    fn get_role(&self, name: &str) -> impl Future<Output = Result<RoleDefinition>> + Send;
    /// Role definitions by name.
    fn list_roles(&self) -> impl Future<Output = Result<Vec<RoleDefinition>>> + Send;
    /// Removes a role definition.
    fn remove_role(&self, name: &str) -> impl Future<Output = Result<()>> + Send;

    /// The agent a good token belongs to, if any.
    fn agent_by_token(&self, token: &TokenHash) -> impl Future<Output = Result<Option<Agent>>> + Send;
    /// Revokes an agent's good tokens and, with `Some`, gives it this one;
    /// NOT_FOUND for an unknown agent.
    fn replace_token(
        &self,
        agent_id: &str,
        token: Option<&TokenHash>,
        now: i64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Credential changes after `position`, in (revision, token) order, at most `limit`.
    fn credential_changes_after(
        &self,
        position: Position,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<CredentialChange>>> + Send;

    /// Stores an import in one transaction; returns the ids of the agents it created.
    fn import(&self, plan: &ImportPlan, now: i64) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// [`Self::get_agent`] from the organisation held in memory, without a
    /// query. It has every change this store made; another replica's changes
    /// reach it at the next [`Self::refresh_index`], except a new agent,
    /// which it looks for in the database when it does not know the id.
    fn indexed_agent(&self, id: &str) -> impl Future<Output = Result<Arc<Agent>>> + Send;
    /// [`Self::list_agents`] from the organisation held in memory (see [`Self::indexed_agent`]).
    fn indexed_agents(&self, query: &AgentQuery) -> impl Future<Output = Result<Vec<Arc<Agent>>>> + Send;
    /// Takes into memory what other writers of the database changed since
    /// the last refresh, and says which agents those were (the first call loads the organisation, which
    /// otherwise the first read of it does); `now` is the service's clock, in ms.
    fn refresh_index(&self, now: i64) -> impl Future<Output = Result<IndexChanges>> + Send;

    /// Decides who takes the task and, unless a dry run, reserves the slot,
    /// queues the task and records the decision, all in one transaction.
    fn delegate(
        &self,
        request: &DelegationRequest,
        now: i64,
        settings: Settings,
    ) -> impl Future<Output = Result<DelegationOutcome>> + Send;
    /// [`Self::delegate`] for many tasks, answering in their order: tasks
    /// assigned to one agent take its free slots in one transaction; the
    /// rest are decided one by one.
    fn delegate_batch(
        &self,
        requests: &[DelegationRequest],
        now: i64,
        settings: Settings,
    ) -> impl Future<Output = Result<Vec<DelegationOutcome>>> + Send;
    /// [`Self::release_tasks`], then [`Self::delegate_batch`], in one
    /// transaction where the store can settle every request so (on a SQLite
    /// file: each assigned to one agent that takes it within its capacity,
    /// no dry run, no task twice, no freed slot wanted by the queue);
    /// `None`, having written nothing, where it cannot: then the caller
    /// makes the two calls.
    fn place_together(
        &self,
        releases: &[String],
        requests: &[DelegationRequest],
        now: i64,
        settings: Settings,
    ) -> impl Future<Output = Result<Option<(Vec<ReleaseOutcome>, Vec<DelegationOutcome>)>>> + Send;
    /// Frees a task's slot (idempotent) and offers it to the oldest task queued for that agent.
    fn release_task(&self, task_id: &str, now: i64) -> impl Future<Output = Result<ReleaseOutcome>> + Send;
    /// [`Self::release_task`] for many tasks, in one transaction.
    fn release_tasks(&self, task_ids: &[String], now: i64) -> impl Future<Output = Result<Vec<ReleaseOutcome>>> + Send;
    /// Escalates queued tasks that went stale or whose expert went offline or away.
    fn escalate_stale(&self, now: i64) -> impl Future<Output = Result<Vec<QueueResolution>>> + Send;
    /// A queued task's state; NOT_FOUND when it was never queued.
    fn queue_state(&self, task_id: &str) -> impl Future<Output = Result<QueueState>> + Send;
    /// How many tasks wait in the queue: QUEUE decisions not yet resolved
    /// (offered a slot, escalated, superseded) nor released.
    fn queued_task_count(&self) -> impl Future<Output = Result<u64>> + Send;
    /// Recorded decisions, oldest first.
    fn list_delegations(&self, query: &DelegationQuery) -> impl Future<Output = Result<Vec<DelegationRecord>>> + Send;

    /// Moves the audit records that decisions appended since the last call
    /// into the trail [`Store::list_delegations`] reads (which calls
    /// it first); returns how many moved.
    fn fold_audit_trail(&self) -> impl Future<Output = Result<u64>> + Send;
}
