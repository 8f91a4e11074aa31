//! Delegation in the database: the snapshot the framework reads, the atomic
//! slot reservation, the queue and the audit trail.

use std::collections::{HashMap, HashSet};

use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use super::{
    DelegationOutcome, DelegationQuery, DelegationRecord, QueueResolution, QueueState, ReleaseOutcome,
    sql::{AGENT_COLUMNS, SqlStore, agent_from_row, fetch_agent},
};
use crate::domain::{
    delegation::{
        Decision, DecisionKind, DelegationRequest, Settings, Snapshot, decide, queue_escalation_decision,
        queue_offer_decision,
    },
    model::{Agent, Status, Team},
};
use crate::error::{Error, QUEUED_TASK, Result};

/// How many times a Delegate re-decides after losing a race for a slot.
const MAX_ATTEMPTS: usize = 16;
/// How far up the hierarchy the snapshot follows seniors.
const MAX_HIERARCHY_DEPTH: usize = 32;

type Tx = Transaction<'static, Any>;

/// Takes one slot of `agent_id` if it has one; false when someone else took the last.
async fn reserve_slot(transaction: &mut Tx, agent_id: &str, now: i64) -> Result<bool> {
    let result = sqlx::query(
        "UPDATE agents SET current_workload = current_workload + 1, updated_at = $2 \
         WHERE id = $1 AND current_workload < workload_capacity AND manual_status NOT IN ('offline', 'busy')",
    )
    .bind(agent_id.to_owned())
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(result.rows_affected() == 1)
}

async fn free_slot(transaction: &mut Tx, agent_id: &str, now: i64) -> Result<()> {
    sqlx::query("UPDATE agents SET current_workload = current_workload - 1, updated_at = $2 WHERE id = $1 AND current_workload > 0")
        .bind(agent_id.to_owned())
        .bind(now)
        .execute(&mut **transaction)
        .await?;
    Ok(())
}

/// Most cross-team matches loaded beyond the delegation chain's length: the
/// framework needs the best two (primary and fallback), ordered as SQL orders them.
const CROSS_TEAM_MARGIN: usize = 8;
/// Most busy experts loaded for the queue tier.
const MAX_BUSY_EXPERTS: usize = 500;
/// Most offline experts loaded (only to explain an escalation).
const MAX_OFFLINE_EXPERTS: usize = 20;

/// A statement under construction: SQL with `$n` placeholders and its text binds.
struct Select {
    from: String,
    conditions: Vec<String>,
    binds: Vec<String>,
}

impl Select {
    fn new() -> Self {
        Self { from: "agents".to_owned(), conditions: Vec::new(), binds: Vec::new() }
    }

    fn bind(&mut self, value: &str) -> String {
        self.binds.push(value.to_owned());
        format!("${}", self.binds.len())
    }

    /// Agents with every required tag (all agents when none is required).
    fn full_match(&mut self, request: &DelegationRequest) {
        if request.required_expertise.is_empty() {
            return;
        }
        let placeholders: Vec<String> = request.required_expertise.iter().map(|tag| self.bind(tag)).collect();
        self.conditions.push(format!(
            "id IN (SELECT agent_id FROM agent_expertise WHERE tag IN ({}) GROUP BY agent_id HAVING COUNT(*) = {})",
            placeholders.join(", "),
            request.required_expertise.len()
        ));
    }

    fn role(&mut self, request: &DelegationRequest) {
        if !request.required_role.is_empty() {
            let placeholder = self.bind(&request.required_role);
            self.conditions.push(format!("role = {placeholder}"));
        }
    }

    async fn fetch(self, transaction: &mut Tx, order_and_limit: &str) -> Result<Vec<Agent>> {
        let conditions = if self.conditions.is_empty() { "1 = 1".to_owned() } else { self.conditions.join(" AND ") };
        let sql = format!("SELECT {AGENT_COLUMNS} FROM {} WHERE {conditions} {order_and_limit}", self.from);
        let mut statement = sqlx::query(AssertSqlSafe(sql));
        for value in self.binds {
            statement = statement.bind(value);
        }
        statement.fetch_all(&mut **transaction).await?.iter().map(agent_from_row).collect()
    }
}

/// Cross-team full matches with a free slot; `idle_only` keeps those without
/// any task and drives the query from the first tag's index, in id order.
fn cross_team_matches(request: &DelegationRequest, home_team: &str, idle_only: bool) -> Select {
    let mut select = Select::new();
    match request.required_expertise.split_first() {
        Some((first, others)) if idle_only => {
            let placeholder = select.bind(first);
            select.from = "agent_expertise JOIN agents ON agents.id = agent_expertise.agent_id".to_owned();
            select.conditions.push(format!("agent_expertise.tag = {placeholder}"));
            for tag in others {
                let placeholder = select.bind(tag);
                select.conditions.push(format!(
                    "EXISTS (SELECT 1 FROM agent_expertise other WHERE other.agent_id = agents.id AND other.tag = {placeholder})"
                ));
            }
        }
        _ => select.full_match(request),
    }
    select.role(request);
    if !home_team.is_empty() {
        let placeholder = select.bind(home_team);
        select.conditions.push(format!("team <> {placeholder}"));
    }
    select.conditions.push(if idle_only {
        "current_workload = 0 AND manual_status NOT IN ('offline', 'busy')".to_owned()
    } else {
        "current_workload < workload_capacity AND manual_status NOT IN ('offline', 'busy')".to_owned()
    });
    select
}

/// Loads the agents that may matter to one request, and no more: the
/// requester's team; the best cross-team full matches with a free slot (in
/// the framework's order: workload, then id); busy full-match experts (for the
/// queue); a few offline experts (to explain an escalation); the requester,
/// the named colleague, the delegation chain, the seniors above the requester
/// and the team's lead.
///
/// With `with_unavailable` false the busy and offline experts are left out:
/// they never change a DELEGATE decision, only the queue and escalation tiers,
/// so the store loads them only when the first decision is not DELEGATE.
async fn load_snapshot(transaction: &mut Tx, request: &DelegationRequest, with_unavailable: bool) -> Result<Snapshot> {
    let mut agents = Vec::new();
    let mut seen = HashSet::new();
    let mut keep = |batch: Vec<Agent>, agents: &mut Vec<Agent>| {
        for agent in batch {
            if seen.insert(agent.id.clone()) {
                agents.push(agent);
            }
        }
    };
    let requester =
        if request.requester_id.is_empty() { None } else { fetch_agent(transaction, &request.requester_id).await? };
    let home_team = if request.team.is_empty() {
        requester.as_ref().map(|agent| agent.team.clone()).unwrap_or_default()
    } else {
        request.team.clone()
    };
    keep(requester.into_iter().collect(), &mut agents);
    if !request.assigned_agent_id.is_empty() {
        // Only the assigned agent, and whom it escalates to, can matter.
        keep(fetch_agent(transaction, &request.assigned_agent_id).await?.into_iter().collect(), &mut agents);
    } else {
        load_candidates(transaction, request, &home_team, with_unavailable, &mut agents, &mut keep).await?;
    }

    // The seniors above the requester, for escalation.
    let mut senior_id = agents
        .iter()
        .find(|agent| agent.id == request.requester_id)
        .map(|agent| agent.senior_id.clone())
        .unwrap_or_default();
    for _ in 0..MAX_HIERARCHY_DEPTH {
        if senior_id.is_empty() {
            break;
        }
        let senior = match agents.iter().find(|agent| agent.id == senior_id) {
            Some(agent) => Some(agent.clone()),
            None => fetch_agent(transaction, &senior_id).await?,
        };
        let Some(senior) = senior else { break };
        senior_id.clone_from(&senior.senior_id);
        keep(vec![senior], &mut agents);
    }

    let mut teams = Vec::new();
    if !home_team.is_empty() {
        let row = sqlx::query("SELECT name, description, lead_agent_id FROM teams WHERE name = $1")
            .bind(home_team)
            .fetch_optional(&mut **transaction)
            .await?;
        if let Some(row) = row {
            let team = Team {
                name: row.try_get("name")?,
                description: row.try_get("description")?,
                lead_agent_id: row.try_get("lead_agent_id")?,
            };
            if !team.lead_agent_id.is_empty() && !agents.iter().any(|agent| agent.id == team.lead_agent_id) {
                keep(fetch_agent(transaction, &team.lead_agent_id).await?.into_iter().collect(), &mut agents);
            }
            teams.push(team);
        }
    }

    let mut queued = HashMap::new();
    let rows = if request.assigned_agent_id.is_empty() {
        sqlx::query("SELECT expert_id, COUNT(*) AS waiting FROM queued_tasks WHERE state = 'queued' GROUP BY expert_id")
            .fetch_all(&mut **transaction)
            .await?
    } else {
        sqlx::query(
            "SELECT expert_id, COUNT(*) AS waiting FROM queued_tasks WHERE state = 'queued' AND expert_id = $1 \
             GROUP BY expert_id",
        )
        .bind(request.assigned_agent_id.clone())
        .fetch_all(&mut **transaction)
        .await?
    };
    for row in rows {
        let expert: String = row.try_get("expert_id")?;
        let waiting: i64 = row.try_get("waiting")?;
        queued.insert(expert, u32::try_from(waiting).unwrap_or(u32::MAX));
    }
    Ok(Snapshot { agents, queued, teams })
}

/// The candidates of a request decided by its criteria (see [`load_snapshot`]).
async fn load_candidates(
    transaction: &mut Tx,
    request: &DelegationRequest,
    home_team: &str,
    with_unavailable: bool,
    agents: &mut Vec<Agent>,
    keep: &mut impl FnMut(Vec<Agent>, &mut Vec<Agent>),
) -> Result<()> {
    if !home_team.is_empty() {
        let mut same_team = Select::new();
        let placeholder = same_team.bind(home_team);
        same_team.conditions.push(format!("team = {placeholder}"));
        keep(same_team.fetch(transaction, "").await?, agents);
    }

    // The best cross-team matches with a free slot, in the framework's order
    // (workload, then id). Idle agents come first in that order, and reading
    // them in id order can stop early on an index, so try them alone first.
    let limit = request.delegation_chain.len() + CROSS_TEAM_MARGIN;
    let idle_order = if request.required_expertise.is_empty() { "id" } else { "agent_expertise.agent_id" };
    let idle = cross_team_matches(request, home_team, true)
        .fetch(transaction, &format!("ORDER BY {idle_order} LIMIT {limit}"))
        .await?;
    if idle.len() == limit {
        keep(idle, agents);
    } else {
        let any_workload = cross_team_matches(request, home_team, false)
            .fetch(transaction, &format!("ORDER BY current_workload, id LIMIT {limit}"))
            .await?;
        keep(any_workload, agents);
    }

    if with_unavailable {
        let mut busy = Select::new();
        busy.full_match(request);
        busy.role(request);
        busy.conditions.push(
            "manual_status <> 'offline' AND (current_workload >= workload_capacity OR manual_status = 'busy')"
                .to_owned(),
        );
        keep(busy.fetch(transaction, &format!("ORDER BY id LIMIT {MAX_BUSY_EXPERTS}")).await?, agents);

        if !request.required_expertise.is_empty() {
            let mut offline = Select::new();
            let placeholders: Vec<String> = request.required_expertise.iter().map(|tag| offline.bind(tag)).collect();
            offline.conditions.push(format!(
                "id IN (SELECT agent_id FROM agent_expertise WHERE tag IN ({}))",
                placeholders.join(", ")
            ));
            offline.conditions.push("manual_status = 'offline'".to_owned());
            keep(offline.fetch(transaction, &format!("ORDER BY id LIMIT {MAX_OFFLINE_EXPERTS}")).await?, agents);
        }
    }

    let mut named: Vec<&String> = request.delegation_chain.iter().collect();
    named.push(&request.preferred_agent_id);
    for id in named {
        if !id.is_empty() && !agents.iter().any(|agent| agent.id == *id) {
            keep(fetch_agent(transaction, id).await?.into_iter().collect(), agents);
        }
    }

    Ok(())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|error| Error::Internal(error.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| Error::Internal(format!("bad stored json: {error}")))
}

async fn record(
    transaction: &mut Tx,
    task_id: &str,
    requester_id: &str,
    decision: &Decision,
    description: &str,
    now: i64,
) -> Result<String> {
    let id = uuid::Uuid::now_v7().to_string();
    sqlx::query(
        "INSERT INTO delegations (id, task_id, requester_id, primary_agent_id, decision, tier, decision_json, description, decided_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id.clone())
    .bind(task_id.to_owned())
    .bind(requester_id.to_owned())
    .bind(decision.primary_agent_id.clone())
    .bind(decision.kind.as_str().to_owned())
    .bind(decision.tier.as_str().to_owned())
    .bind(to_json(decision)?)
    .bind(description.to_owned())
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(id)
}

/// Resolves the task's place in the queue, if it has one; true if it had.
async fn resolve_queued(transaction: &mut Tx, task_id: &str, state: &str, decision: &Decision) -> Result<bool> {
    let result =
        sqlx::query("UPDATE queued_tasks SET state = $2, resolution_json = $3 WHERE task_id = $1 AND state = 'queued'")
            .bind(task_id.to_owned())
            .bind(state.to_owned())
            .bind(to_json(decision)?)
            .execute(&mut **transaction)
            .await?;
    Ok(result.rows_affected() > 0)
}

/// A task assigned to an agent that has a free slot (or already holds one
/// of its slots for the task): reserved in one short transaction, without
/// loading a snapshot. `None` when the agent has no free slot, is offline or
/// busy, or is not in the roster: the framework decides then.
async fn take_assigned_slot(
    transaction: &mut Tx,
    request: &DelegationRequest,
    held_by: Option<&String>,
    now: i64,
    settings: Settings,
) -> Result<Option<(Decision, Vec<String>)>> {
    let assigned = &request.assigned_agent_id;
    let agent = if held_by == Some(assigned) {
        let Some(mut agent) = fetch_agent(transaction, assigned).await? else { return Ok(None) };
        // Its slot for this task counts as free for it.
        agent.current_workload = agent.current_workload.saturating_sub(1);
        agent
    } else {
        let row = sqlx::query(AssertSqlSafe(format!(
            "UPDATE agents SET current_workload = current_workload + 1, updated_at = $2 \
             WHERE id = $1 AND current_workload < workload_capacity AND manual_status NOT IN ('offline', 'busy') \
             RETURNING {AGENT_COLUMNS}"
        )))
        .bind(assigned.clone())
        .bind(now)
        .fetch_optional(&mut **transaction)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let mut agent = agent_from_row(&row)?;
        agent.current_workload = agent.current_workload.saturating_sub(1);
        agent
    };
    let decision = decide(request, &Snapshot { agents: vec![agent], ..Snapshot::default() }, now, settings);
    if decision.kind != DecisionKind::Delegate {
        return Err(Error::Internal(format!("an agent with a free slot was not chosen: {}", decision.reasoning)));
    }
    Ok(Some((decision, vec![assigned.clone()])))
}

pub(super) async fn delegate(
    store: &SqlStore,
    request: &DelegationRequest,
    now: i64,
    settings: Settings,
) -> Result<DelegationOutcome> {
    let mut transaction = store.database.pool.begin().await?;
    // A task holds one slot; the agent holding it has that slot for it.
    let held_by: Option<String> = sqlx::query("SELECT agent_id FROM reservations WHERE task_id = $1")
        .bind(request.task_id.clone())
        .fetch_optional(&mut *transaction)
        .await?
        .map(|row| row.try_get("agent_id"))
        .transpose()?;
    if !request.assigned_agent_id.is_empty()
        && !request.dry_run
        && let Some((decision, changed_agents)) =
            take_assigned_slot(&mut transaction, request, held_by.as_ref(), now, settings).await?
    {
        let mut changed_agents = changed_agents;
        if let Some(previous) = held_by.filter(|previous| *previous != decision.primary_agent_id) {
            free_slot(&mut transaction, &previous, now).await?;
            changed_agents.push(previous);
        }
        upsert_reservation(&mut transaction, &request.task_id, &decision.primary_agent_id, now).await?;
        let queue_changed = resolve_queued(&mut transaction, &request.task_id, "superseded", &decision).await?;
        transaction.commit().await?;
        // A task a process assigned by name is no choice of the roster's: the
        // audit trail keeps its queue waits and escalations, not this.
        return Ok(DelegationOutcome { decision, delegation_id: String::new(), changed_agents, queue_changed });
    }
    let mut lost_races: HashSet<String> = HashSet::new();
    let mut decision = None;
    for _ in 0..MAX_ATTEMPTS {
        let mut candidate = None;
        for with_unavailable in [false, true] {
            let mut snapshot = load_snapshot(&mut transaction, request, with_unavailable).await?;
            for agent in &mut snapshot.agents {
                if lost_races.contains(&agent.id) {
                    // Its last slot went to a concurrent call: full for this call.
                    agent.current_workload = agent.current_workload.max(agent.workload_capacity);
                } else if held_by.as_ref() == Some(&agent.id) {
                    agent.current_workload = agent.current_workload.saturating_sub(1);
                }
            }
            let decided = decide(request, &snapshot, now, settings);
            let settled = decided.kind == DecisionKind::Delegate || !request.assigned_agent_id.is_empty();
            candidate = Some(decided);
            if settled {
                break;
            }
        }
        let candidate = candidate.ok_or_else(|| Error::Internal("no decision".into()))?;
        if candidate.kind != DecisionKind::Delegate
            || request.dry_run
            || held_by.as_ref() == Some(&candidate.primary_agent_id)
        {
            decision = Some(candidate);
            break;
        }
        if reserve_slot(&mut transaction, &candidate.primary_agent_id, now).await? {
            decision = Some(candidate);
            break;
        }
        tracing::debug!(agent_id = %candidate.primary_agent_id, task_id = %request.task_id, "lost the race for a slot; deciding again");
        lost_races.insert(candidate.primary_agent_id);
    }
    let decision = decision.ok_or_else(|| Error::RetryLater {
        reason: "ROSTER_BUSY",
        message: "the roster changed too often while deciding; try again".to_owned(),
    })?;
    if request.dry_run {
        return Ok(DelegationOutcome {
            decision,
            delegation_id: String::new(),
            changed_agents: Vec::new(),
            queue_changed: false,
        });
    }
    let mut changed_agents = Vec::new();
    let queue_changed = match decision.kind {
        DecisionKind::Delegate => {
            changed_agents.push(decision.primary_agent_id.clone());
            // A task holds one slot: a re-delegation moves it, one to the
            // agent holding it keeps it.
            if let Some(previous) = held_by.filter(|previous| *previous != decision.primary_agent_id) {
                free_slot(&mut transaction, &previous, now).await?;
                changed_agents.push(previous);
            }
            upsert_reservation(&mut transaction, &request.task_id, &decision.primary_agent_id, now).await?;
            resolve_queued(&mut transaction, &request.task_id, "superseded", &decision).await?
        }
        DecisionKind::Queue => {
            let existing = sqlx::query("SELECT queued_at FROM queued_tasks WHERE task_id = $1 AND state = 'queued'")
                .bind(request.task_id.clone())
                .fetch_optional(&mut *transaction)
                .await?;
            // A task queued again keeps its place and its age.
            let queued_at = match existing {
                Some(row) => row.try_get::<i64, _>("queued_at")?,
                None => now,
            };
            let limit = request.urgency.max_wait_millis().map(|limit| queued_at.saturating_add(limit));
            let expires_at = match (limit, request.deadline) {
                (Some(limit), Some(deadline)) => Some(limit.min(deadline)),
                (limit, deadline) => limit.or(deadline),
            };
            sqlx::query(
                "INSERT INTO queued_tasks (task_id, expert_id, requester_id, escalate_to, request_json, queued_at, expires_at, state) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued') \
                 ON CONFLICT (task_id) DO UPDATE SET expert_id = excluded.expert_id, requester_id = excluded.requester_id, \
                 escalate_to = excluded.escalate_to, request_json = excluded.request_json, queued_at = excluded.queued_at, \
                 expires_at = excluded.expires_at, state = 'queued', resolution_json = NULL",
            )
            .bind(request.task_id.clone())
            .bind(decision.primary_agent_id.clone())
            .bind(request.requester_id.clone())
            .bind(decision.fallback_agent_id.clone())
            .bind(to_json(request)?)
            .bind(queued_at)
            .bind(expires_at)
            .execute(&mut *transaction)
            .await?;
            true
        }
        DecisionKind::Escalate => resolve_queued(&mut transaction, &request.task_id, "superseded", &decision).await?,
    };
    let delegation_id = if decision.kind == DecisionKind::Delegate && !request.assigned_agent_id.is_empty() {
        String::new()
    } else {
        record(&mut transaction, &request.task_id, &request.requester_id, &decision, &request.description, now).await?
    };
    transaction.commit().await?;
    Ok(DelegationOutcome { decision, delegation_id, changed_agents, queue_changed })
}

/// Most rows in one multi-row statement of a batch.
const BATCH_ROWS_PER_STATEMENT: usize = 300;

/// [`delegate`] for many tasks. Tasks assigned to the same agent are placed
/// together in one transaction: those already holding a slot of the agent
/// keep it, the others take as many of its free slots as there are (one
/// conditional workload update for all of them). Every task left over — not
/// assigned, or with no free slot for it — is decided alone.
pub(super) async fn delegate_batch(
    store: &SqlStore,
    requests: &[DelegationRequest],
    now: i64,
    settings: Settings,
) -> Result<Vec<DelegationOutcome>> {
    let mut by_agent: std::collections::BTreeMap<&str, Vec<usize>> = std::collections::BTreeMap::new();
    for (index, request) in requests.iter().enumerate() {
        if !request.assigned_agent_id.is_empty() && !request.dry_run {
            by_agent.entry(request.assigned_agent_id.as_str()).or_default().push(index);
        }
    }
    let mut outcomes: Vec<Option<DelegationOutcome>> = requests.iter().map(|_| None).collect();
    if !by_agent.is_empty() {
        let mut transaction = store.database.pool.begin().await?;
        for (agent_id, indexes) in by_agent {
            place_on_agent(
                &mut transaction,
                store.database.backend,
                requests,
                agent_id,
                &indexes,
                now,
                settings,
                &mut outcomes,
            )
            .await?;
        }
        transaction.commit().await?;
    }
    let mut answered = Vec::with_capacity(requests.len());
    for (request, outcome) in requests.iter().zip(outcomes) {
        answered.push(match outcome {
            Some(outcome) => outcome,
            None => delegate(store, request, now, settings).await?,
        });
    }
    Ok(answered)
}

/// Places the tasks at `indexes` (all assigned to `agent_id`) on its free
/// slots, filling their `outcomes`; tasks it has no slot for are left `None`.
#[allow(clippy::too_many_arguments)]
async fn place_on_agent(
    transaction: &mut Tx,
    backend: muster_runtime::db::Backend,
    requests: &[DelegationRequest],
    agent_id: &str,
    indexes: &[usize],
    now: i64,
    settings: Settings,
    outcomes: &mut [Option<DelegationOutcome>],
) -> Result<()> {
    // Who holds each task's slot now.
    let mut held_by: HashMap<String, String> = HashMap::new();
    for chunk in indexes.chunks(BATCH_ROWS_PER_STATEMENT) {
        let sql = format!(
            "SELECT task_id, agent_id FROM reservations WHERE task_id IN ({})",
            muster_runtime::db::placeholder_list(backend, 1, chunk.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for &index in chunk {
            query = query.bind(requests[index].task_id.clone());
        }
        for row in query.fetch_all(&mut **transaction).await? {
            held_by.insert(row.try_get("task_id")?, row.try_get("agent_id")?);
        }
    }
    let (kept, wanted): (Vec<usize>, Vec<usize>) =
        indexes.iter().partition(|&&index| held_by.get(&requests[index].task_id).map(String::as_str) == Some(agent_id));
    // Take as many free slots as the agent has, in one conditional update.
    let mut taken = 0;
    let mut agent = None;
    for _ in 0..MAX_ATTEMPTS {
        let Some(current) = fetch_agent(transaction, agent_id).await? else { break };
        let free = if matches!(current.status(), Status::Offline) || current.manual_status == Some(Status::Busy) {
            0
        } else {
            current.workload_capacity.saturating_sub(current.current_workload) as usize
        };
        let want = free.min(wanted.len());
        if want == 0 {
            agent = Some(current);
            break;
        }
        let updated = sqlx::query(
            "UPDATE agents SET current_workload = current_workload + $2, updated_at = $3 \
             WHERE id = $1 AND current_workload + $2 <= workload_capacity AND manual_status NOT IN ('offline', 'busy')",
        )
        .bind(agent_id.to_owned())
        .bind(want as i64)
        .bind(now)
        .execute(&mut **transaction)
        .await?;
        if updated.rows_affected() == 1 {
            taken = want;
            agent = Some(current);
            break;
        }
    }
    let Some(mut agent) = agent else { return Ok(()) };
    let placed: Vec<usize> = kept.iter().copied().chain(wanted[..taken].iter().copied()).collect();
    if placed.is_empty() {
        return Ok(());
    }
    // A task moving here gives back the slot it held elsewhere.
    for &index in &wanted[..taken] {
        if let Some(previous) = held_by.get(&requests[index].task_id) {
            free_slot(transaction, previous, now).await?;
        }
    }
    for chunk in wanted[..taken].chunks(BATCH_ROWS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO reservations (task_id, agent_id, reserved_at) VALUES {} \
             ON CONFLICT (task_id) DO UPDATE SET agent_id = excluded.agent_id, reserved_at = excluded.reserved_at",
            muster_runtime::db::placeholders(backend, chunk.len(), 3)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for &index in chunk {
            query = query.bind(requests[index].task_id.clone()).bind(agent_id.to_owned()).bind(now);
        }
        query.execute(&mut **transaction).await?;
    }
    // Tasks that waited in a queue leave it (rare: a step handed to the agent while queued).
    let mut queued = HashSet::new();
    for chunk in placed.chunks(BATCH_ROWS_PER_STATEMENT) {
        let sql = format!(
            "SELECT task_id FROM queued_tasks WHERE state = 'queued' AND task_id IN ({})",
            muster_runtime::db::placeholder_list(backend, 1, chunk.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for &index in chunk {
            query = query.bind(requests[index].task_id.clone());
        }
        for row in query.fetch_all(&mut **transaction).await? {
            queued.insert(row.try_get::<String, _>("task_id")?);
        }
    }
    // Each decision as the framework words it, the agent's workload as each task found it.
    for (count, &index) in placed.iter().enumerate() {
        let request = &requests[index];
        let mut seen = agent.clone();
        if count < kept.len() {
            seen.current_workload = seen.current_workload.saturating_sub(1);
        }
        let decision = decide(request, &Snapshot { agents: vec![seen], ..Snapshot::default() }, now, settings);
        if decision.kind != DecisionKind::Delegate {
            return Err(Error::Internal(format!("an agent with a free slot was not chosen: {}", decision.reasoning)));
        }
        let queue_changed = queued.contains(&request.task_id)
            && resolve_queued(transaction, &request.task_id, "superseded", &decision).await?;
        let mut changed_agents = vec![agent_id.to_owned()];
        changed_agents.extend(held_by.get(&request.task_id).filter(|previous| previous.as_str() != agent_id).cloned());
        outcomes[index] =
            Some(DelegationOutcome { decision, delegation_id: String::new(), changed_agents, queue_changed });
        if count >= kept.len() {
            agent.current_workload += 1;
        }
    }
    Ok(())
}

/// The task's one reservation: `agent_id` holds a slot for it.
async fn upsert_reservation(transaction: &mut Tx, task_id: &str, agent_id: &str, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO reservations (task_id, agent_id, reserved_at) VALUES ($1, $2, $3) \
         ON CONFLICT (task_id) DO UPDATE SET agent_id = excluded.agent_id, reserved_at = excluded.reserved_at",
    )
    .bind(task_id.to_owned())
    .bind(agent_id.to_owned())
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

pub(super) async fn release_task(store: &SqlStore, task_id: &str, now: i64) -> Result<ReleaseOutcome> {
    let mut outcomes = release_tasks(store, std::slice::from_ref(&task_id.to_owned()), now).await?;
    Ok(outcomes.pop().unwrap_or_default())
}

/// Frees the slots of many tasks in one transaction, each as [`release_task`]
/// would: the reservations and queue entries go in multi-row statements,
/// each agent's freed slots in one update, and then, one at a time, to the
/// oldest tasks queued for that agent. A fan-out's ends cost a few
/// statements instead of four per task.
pub(super) async fn release_tasks(store: &SqlStore, task_ids: &[String], now: i64) -> Result<Vec<ReleaseOutcome>> {
    let backend = store.database.backend;
    // A task named twice is released at its first mention.
    let mut distinct = HashSet::with_capacity(task_ids.len());
    let first_mention: Vec<bool> = task_ids.iter().map(|task_id| distinct.insert(task_id.as_str())).collect();
    let first_mentions: Vec<&String> =
        task_ids.iter().zip(&first_mention).filter(|(_, first)| **first).map(|(task_id, _)| task_id).collect();
    let mut transaction = store.database.pool.begin().await?;
    // Who held a slot for each task, and which tasks leave the queue (a task
    // that ends while still queued is never offered a slot).
    let mut held: HashMap<String, String> = HashMap::new();
    let mut left_queue: HashSet<String> = HashSet::new();
    for chunk in first_mentions.chunks(BATCH_ROWS_PER_STATEMENT) {
        let list = muster_runtime::db::placeholder_list(backend, 1, chunk.len());
        let sql = format!("DELETE FROM reservations WHERE task_id IN ({list}) RETURNING task_id, agent_id");
        let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, task_id| query.bind((*task_id).clone()));
        for row in query.fetch_all(&mut *transaction).await? {
            held.insert(row.try_get("task_id")?, row.try_get("agent_id")?);
        }
        let sql = format!("DELETE FROM queued_tasks WHERE state = 'queued' AND task_id IN ({list}) RETURNING task_id");
        let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, task_id| query.bind((*task_id).clone()));
        for row in query.fetch_all(&mut *transaction).await? {
            left_queue.insert(row.try_get("task_id")?);
        }
    }
    // Each agent's freed slots, in the order its tasks were named.
    let mut freed: Vec<(&str, u32)> = Vec::new();
    for task_id in &first_mentions {
        if let Some(agent_id) = held.get(task_id.as_str()) {
            match freed.iter_mut().find(|(agent, _)| *agent == agent_id) {
                Some((_, count)) => *count += 1,
                None => freed.push((agent_id, 1)),
            }
        }
    }
    let mut offers: HashMap<&str, std::collections::VecDeque<QueueResolution>> = HashMap::new();
    for &(agent_id, count) in &freed {
        sqlx::query(
            "UPDATE agents SET current_workload = CASE WHEN current_workload > $2 THEN current_workload - $2 ELSE 0 END, \
             updated_at = $3 WHERE id = $1",
        )
        .bind(agent_id.to_owned())
        .bind(i64::from(count))
        .bind(now)
        .execute(&mut *transaction)
        .await?;
        let offered = offers.entry(agent_id).or_default();
        for _ in 0..count {
            match offer_slot(&mut transaction, agent_id, now).await? {
                Some(resolution) => offered.push_back(resolution),
                None => break,
            }
        }
    }
    transaction.commit().await?;
    let outcomes = task_ids
        .iter()
        .zip(first_mention)
        .map(|(task_id, first)| {
            if !first {
                return ReleaseOutcome::default();
            }
            let agent_id = held.get(task_id).cloned();
            let offered = agent_id.as_deref().and_then(|agent| offers.get_mut(agent)?.pop_front());
            let queue_changed = left_queue.contains(task_id) || offered.is_some();
            ReleaseOutcome { agent_id, offered, queue_changed }
        })
        .collect();
    Ok(outcomes)
}

/// Offers a freed slot of `agent_id` to the oldest task queued for it, if the
/// agent can take it; `None` when nobody waits or the agent cannot.
async fn offer_slot(transaction: &mut Tx, agent_id: &str, now: i64) -> Result<Option<QueueResolution>> {
    let next = sqlx::query(
        "SELECT task_id, request_json, queued_at FROM queued_tasks WHERE expert_id = $1 AND state = 'queued' \
         ORDER BY queued_at, seq LIMIT 1",
    )
    .bind(agent_id.to_owned())
    .fetch_optional(&mut **transaction)
    .await?;
    let Some(next) = next else { return Ok(None) };
    let queued_task: String = next.try_get("task_id")?;
    let request: DelegationRequest = from_json(&next.try_get::<String, _>("request_json")?)?;
    let queued_at: i64 = next.try_get("queued_at")?;
    if !reserve_slot(transaction, agent_id, now).await? {
        return Ok(None);
    }
    // A task handed to a busy agent may still hold its former slot.
    let former = sqlx::query("SELECT agent_id FROM reservations WHERE task_id = $1")
        .bind(queued_task.clone())
        .fetch_optional(&mut **transaction)
        .await?;
    if let Some(former) = former {
        free_slot(transaction, &former.try_get::<String, _>("agent_id")?, now).await?;
    }
    let expert = fetch_agent(transaction, agent_id).await?.ok_or_else(|| Error::Internal("expert vanished".into()))?;
    let decision = queue_offer_decision(&expert, queued_at, now);
    upsert_reservation(transaction, &queued_task, agent_id, now).await?;
    resolve_queued(transaction, &queued_task, "delegated", &decision).await?;
    let delegation_id =
        record(transaction, &queued_task, &request.requester_id, &decision, &request.description, now).await?;
    Ok(Some(QueueResolution { task_id: queued_task, decision, delegation_id }))
}

pub(super) async fn escalate_stale(store: &SqlStore, now: i64) -> Result<Vec<QueueResolution>> {
    let mut transaction = store.database.pool.begin().await?;
    let rows = sqlx::query(
        "SELECT q.task_id, q.expert_id, q.escalate_to, q.request_json, q.expires_at, a.manual_status AS expert_status \
         FROM queued_tasks q LEFT JOIN agents a ON a.id = q.expert_id \
         WHERE q.state = 'queued' AND ((q.expires_at IS NOT NULL AND q.expires_at <= $1) \
         OR a.id IS NULL OR a.manual_status = 'offline') ORDER BY q.queued_at, q.seq",
    )
    .bind(now)
    .fetch_all(&mut *transaction)
    .await?;
    let mut resolutions = Vec::new();
    for row in rows {
        let task_id: String = row.try_get("task_id")?;
        let expert_id: String = row.try_get("expert_id")?;
        let escalate_to: String = row.try_get("escalate_to")?;
        let request: DelegationRequest = from_json(&row.try_get::<String, _>("request_json")?)?;
        let expert_status: Option<String> = row.try_get("expert_status")?;
        let reason = match expert_status.as_deref() {
            None => format!("expert {expert_id} left the roster while the task was queued"),
            Some(status) if status == Status::Offline.as_str() => {
                format!("expert {expert_id} went offline while the task was queued")
            }
            Some(_) => format!(
                "the task waited for {expert_id} longer than a {} task may wait{}",
                request.urgency.as_str(),
                if request.deadline.is_some() { " (or its deadline came)" } else { "" }
            ),
        };
        let senior = if escalate_to.is_empty() { None } else { fetch_agent(&mut transaction, &escalate_to).await? };
        let decision = queue_escalation_decision(&expert_id, senior.as_ref(), &reason);
        resolve_queued(&mut transaction, &task_id, "escalated", &decision).await?;
        let delegation_id =
            record(&mut transaction, &task_id, &request.requester_id, &decision, &request.description, now).await?;
        resolutions.push(QueueResolution { task_id, decision, delegation_id });
    }
    transaction.commit().await?;
    Ok(resolutions)
}

pub(super) async fn queue_state(store: &SqlStore, task_id: &str) -> Result<QueueState> {
    let row = sqlx::query("SELECT state, resolution_json FROM queued_tasks WHERE task_id = $1")
        .bind(task_id.to_owned())
        .fetch_optional(&store.database.pool)
        .await?
        .ok_or_else(|| Error::not_found(QUEUED_TASK, task_id, format!("task {task_id:?} was never queued")))?;
    let state: String = row.try_get("state")?;
    if state == "queued" {
        return Ok(QueueState::Queued);
    }
    let resolution: Option<String> = row.try_get("resolution_json")?;
    let resolution =
        resolution.ok_or_else(|| Error::Internal(format!("queued task {task_id:?} resolved without a decision")))?;
    Ok(QueueState::Resolved(Box::new(from_json(&resolution)?)))
}

pub(super) async fn queued_task_count(store: &SqlStore) -> Result<u64> {
    let row = sqlx::query("SELECT COUNT(*) AS waiting FROM queued_tasks WHERE state = 'queued'")
        .fetch_one(&store.database.pool)
        .await?;
    Ok(u64::try_from(row.try_get::<i64, _>("waiting")?).unwrap_or(0))
}

pub(super) async fn list_delegations(store: &SqlStore, query: &DelegationQuery) -> Result<Vec<DelegationRecord>> {
    let mut conditions = vec!["1 = 1".to_owned()];
    let mut text_binds: Vec<String> = Vec::new();
    let mut time_binds: Vec<i64> = Vec::new();
    if !query.agent_id.is_empty() {
        text_binds.push(query.agent_id.clone());
        let index = text_binds.len();
        conditions.push(format!("(requester_id = ${index} OR primary_agent_id = ${index})"));
    }
    if !query.task_id.is_empty() {
        text_binds.push(query.task_id.clone());
        conditions.push(format!("task_id = ${}", text_binds.len()));
    }
    if let Some(since) = query.since {
        time_binds.push(since);
        conditions.push(format!("decided_at >= ${}", text_binds.len() + time_binds.len()));
    }
    if let Some(until) = query.until {
        time_binds.push(until);
        conditions.push(format!("decided_at < ${}", text_binds.len() + time_binds.len()));
    }
    if let Some((decided_at, seq)) = query.after {
        time_binds.extend([decided_at, decided_at, seq]);
        let first = text_binds.len() + time_binds.len() - 2;
        conditions.push(format!("(decided_at > ${first} OR (decided_at = ${} AND seq > ${}))", first + 1, first + 2));
    }
    let limit = if query.limit == 0 { 1000 } else { query.limit.min(10_000) };
    let sql = format!(
        "SELECT id, task_id, requester_id, decision_json, description, decided_at, seq FROM delegations WHERE {} ORDER BY decided_at, seq LIMIT {limit}",
        conditions.join(" AND ")
    );
    let mut statement = sqlx::query(AssertSqlSafe(sql));
    for value in text_binds {
        statement = statement.bind(value);
    }
    for value in time_binds {
        statement = statement.bind(value);
    }
    let rows = statement.fetch_all(&store.database.pool).await?;
    rows.iter()
        .map(|row| {
            Ok(DelegationRecord {
                id: row.try_get("id")?,
                task_id: row.try_get("task_id")?,
                requester_id: row.try_get("requester_id")?,
                decision: from_json(&row.try_get::<String, _>("decision_json")?)?,
                decided_at: row.try_get("decided_at")?,
                description: row.try_get("description")?,
                position: (row.try_get("decided_at")?, row.try_get("seq")?),
            })
        })
        .collect()
}
