//! Delegation in the database: the atomic slot reservation, the queue and
//! the audit trail. The framework decides from the organisation in memory
//! (`index.rs`); each workload a transaction changes goes to the index once
//! the transaction commits.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use muster_runtime::db::Backend;
use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use super::{
    DelegationOutcome, DelegationQuery, DelegationRecord, QueueResolution, QueueState, ReleaseOutcome,
    index::{Index, WorkloadChange},
    sql::{AGENT_COLUMNS, SqlStore, agent_from_row, fetch_agent},
};
use crate::domain::{
    delegation::{
        Decision, DecisionKind, DelegationRequest, Settings, Snapshot, decide, queue_escalation_decision,
        queue_offer_decision,
    },
    model::{Agent, Status},
};
use crate::error::{Error, QUEUED_TASK, Result};

/// How many times a Delegate re-decides after losing a race for a slot.
const MAX_ATTEMPTS: usize = 16;

type Tx = Transaction<'static, Any>;

/// Runs a workload update that returns `id, version, current_workload`.
async fn workload_update(
    transaction: &mut Tx,
    statement: sqlx::query::Query<'_, Any, sqlx::any::AnyArguments>,
) -> Result<Option<WorkloadChange>> {
    statement.fetch_optional(&mut **transaction).await?.as_ref().map(workload_change).transpose()
}

/// The workload change a row of `id, version, current_workload` tells.
pub(super) fn workload_change(row: &sqlx::any::AnyRow) -> Result<WorkloadChange> {
    let workload: i64 = row.try_get("current_workload")?;
    Ok((row.try_get("id")?, row.try_get("version")?, u32::try_from(workload.max(0)).unwrap_or(u32::MAX)))
}

/// Takes one slot below capacity of agent `$1`, at time `$2`.
const RESERVE_SLOT_SQL: &str = "UPDATE agents SET current_workload = current_workload + 1, updated_at = $2, \
     version = version + 1 \
     WHERE id = $1 AND current_workload < workload_capacity AND manual_status NOT IN ('offline', 'busy') \
     RETURNING id, version, current_workload";

/// Who holds a slot for task `$1` (`held_by`), and whether it waits in the
/// queue (`queued`, a count).
const HELD_AND_QUEUED_SQL: &str = "SELECT (SELECT agent_id FROM reservations WHERE task_id = $1) AS held_by, \
     (SELECT COUNT(*) FROM queued_tasks WHERE task_id = $1 AND state = 'queued') AS queued";

/// Takes the one slot over capacity of agent `$1`, which only an urgent task
/// may take, and only while the agent is exactly at capacity: of any number
/// of concurrent calls, one takes it (6/5), none goes further (7/5).
const RESERVE_SLOT_OVER_CAPACITY_SQL: &str = "UPDATE agents SET current_workload = current_workload + 1, \
     updated_at = $2, version = version + 1 \
     WHERE id = $1 AND current_workload = workload_capacity AND manual_status NOT IN ('offline', 'busy') \
     RETURNING id, version, current_workload";

/// Takes one slot of `agent_id` if it has one, or with `over_capacity` its
/// one slot over capacity; `None` when someone else took it.
async fn reserve_slot(
    transaction: &mut Tx,
    agent_id: &str,
    over_capacity: bool,
    now: i64,
) -> Result<Option<WorkloadChange>> {
    let sql = if over_capacity { RESERVE_SLOT_OVER_CAPACITY_SQL } else { RESERVE_SLOT_SQL };
    workload_update(transaction, sqlx::query(sql).bind(agent_id.to_owned()).bind(now)).await
}

/// Gives back one slot of `agent_id`.
async fn free_slot(transaction: &mut Tx, agent_id: &str, now: i64) -> Result<Option<WorkloadChange>> {
    workload_update(
        transaction,
        sqlx::query(
            "UPDATE agents SET current_workload = current_workload - 1, updated_at = $2, version = version + 1 \
             WHERE id = $1 AND current_workload > 0 RETURNING id, version, current_workload",
        )
        .bind(agent_id.to_owned())
        .bind(now),
    )
    .await
}

/// How many tasks wait for each expert; only the queue tier and a task
/// assigned to one agent read it.
async fn load_queued(transaction: &mut Tx, request: &DelegationRequest) -> Result<HashMap<String, u32>> {
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
    let mut queued = HashMap::new();
    for row in rows {
        let expert: String = row.try_get("expert_id")?;
        let waiting: i64 = row.try_get("waiting")?;
        queued.insert(expert, u32::try_from(waiting).unwrap_or(u32::MAX));
    }
    Ok(queued)
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|error| Error::Internal(error.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| Error::Internal(format!("bad stored json: {error}")))
}

/// The columns of an audit record, in `delegation_log` and `delegations` alike.
macro_rules! record_columns {
    () => {
        "id, task_id, requester_id, primary_agent_id, decision, tier, decision_json, description, decided_at"
    };
}
pub(super) const RECORD_COLUMNS: &str = record_columns!();

/// Appends a decision's audit record to `delegation_log`, in the decision's
/// transaction; [`fold_audit_trail`] moves it into `delegations`.
async fn record(
    transaction: &mut Tx,
    task_id: &str,
    requester_id: &str,
    decision: &Decision,
    description: &str,
    now: i64,
) -> Result<String> {
    let id = uuid::Uuid::now_v7().to_string();
    sqlx::query(concat!(
        "INSERT INTO delegation_log (",
        record_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    ))
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
/// of its slots for the task; or, urgent, finds the agent exactly at
/// capacity and takes its one slot over): reserved in one short
/// transaction, without a snapshot. `None` when the agent has no slot for
/// it, is offline or busy, or is not in the roster: the framework decides
/// then.
async fn take_assigned_slot(
    transaction: &mut Tx,
    request: &DelegationRequest,
    held_by: Option<&String>,
    now: i64,
    settings: Settings,
    changes: &mut Vec<WorkloadChange>,
) -> Result<Option<Decision>> {
    let assigned = &request.assigned_agent_id;
    let agent = if held_by == Some(assigned) {
        let Some(mut agent) = fetch_agent(transaction, assigned).await? else { return Ok(None) };
        // The slot it holds for this task counts as free for it, even when
        // the agent went over capacity since (an urgent task took the slot over).
        agent.current_workload =
            agent.current_workload.saturating_sub(1).min(agent.workload_capacity.saturating_sub(1));
        agent
    } else {
        // An urgent task may take the slot over capacity too (`$3` is 1):
        // the workload it returns tells which it took, and the decision
        // below, from the workload as the task found it, says so.
        let row = sqlx::query(AssertSqlSafe(format!(
            "UPDATE agents SET current_workload = current_workload + 1, updated_at = $2, version = version + 1 \
             WHERE id = $1 AND current_workload < workload_capacity + $3 \
             AND manual_status NOT IN ('offline', 'busy') RETURNING {AGENT_COLUMNS}, version"
        )))
        .bind(assigned.clone())
        .bind(now)
        .bind(i64::from(request.urgency.is_urgent() && !request.only_if_free))
        .fetch_optional(&mut **transaction)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let mut agent = agent_from_row(&row)?;
        changes.push((agent.id.clone(), row.try_get("version")?, agent.current_workload));
        agent.current_workload = agent.current_workload.saturating_sub(1);
        agent
    };
    let decision = decide(request, &Snapshot { agents: vec![Arc::new(agent)], ..Snapshot::default() }, now, settings);
    if decision.kind != DecisionKind::Delegate {
        return Err(Error::Internal(format!("an agent with a free slot was not chosen: {}", decision.reasoning)));
    }
    Ok(Some(decision))
}

/// A task assigned to one agent, in the common case, on the SQLite file's
/// native connection (the transaction on the calling thread, without a
/// hand-off per statement): the task holds no slot and waits in no queue,
/// and the agent, in the organisation in memory, takes it within its
/// capacity. `Ok(None)`, with nothing written, when any of that is not so:
/// the general path decides (an urgent task over capacity, a queue, a slot
/// held, an agent not in memory yet).
fn take_named_natively(
    transaction: &rusqlite::Connection,
    index: &Index,
    request: &DelegationRequest,
    now: i64,
    settings: Settings,
) -> Result<Option<(Decision, WorkloadChange)>> {
    let assigned = request.assigned_agent_id.as_str();
    let Some(known) = index.agent(assigned) else { return Ok(None) };
    // As the agent would be decided on with a free slot: one whose status
    // in memory says otherwise goes the general way, which reads the row.
    let with_a_slot = Agent {
        current_workload: known.current_workload.min(known.workload_capacity.saturating_sub(1)),
        ..(*known).clone()
    };
    let decision =
        decide(request, &Snapshot { agents: vec![Arc::new(with_a_slot)], ..Snapshot::default() }, now, settings);
    if decision.kind != DecisionKind::Delegate || decision.over_capacity {
        return Ok(None);
    }
    // The statements of the general path, their `$n` parameters bound by name.
    let (held_by, queued): (Option<String>, i64) = transaction
        .prepare_cached(HELD_AND_QUEUED_SQL)?
        .query_row(rusqlite::named_params! {"$1": request.task_id.as_str()}, |row| {
            Ok((row.get("held_by")?, row.get("queued")?))
        })?;
    if held_by.is_some() || queued > 0 {
        return Ok(None);
    }
    let taken: Option<(i64, i64)> = transaction
        .prepare_cached(RESERVE_SLOT_SQL)?
        .query_row(rusqlite::named_params! {"$1": assigned, "$2": now}, |row| {
            Ok((row.get("current_workload")?, row.get("version")?))
        })
        .map(Some)
        .or_else(|error| match error {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            other => Err(other),
        })?;
    let Some((workload, version)) = taken else { return Ok(None) };
    let workload = u32::try_from(workload.max(0)).unwrap_or(u32::MAX);
    // Decided as the general path does: from the agent as the task found it.
    let agent = Agent { current_workload: workload.saturating_sub(1), ..(*known).clone() };
    let decision = decide(request, &Snapshot { agents: vec![Arc::new(agent)], ..Snapshot::default() }, now, settings);
    if decision.kind != DecisionKind::Delegate || decision.over_capacity {
        return Err(Error::Internal(format!("an agent with a free slot was not chosen: {}", decision.reasoning)));
    }
    upsert_reservations_natively(transaction, &[(request.task_id.as_str(), assigned, now)])?;
    Ok(Some((decision, (assigned.to_owned(), version, workload))))
}

/// Decides from the organisation in memory, with the queue lengths from the
/// database when the decision may need them; agents whose last slot went
/// to a concurrent call count as full (`lost_races`: `true` when their slot
/// over capacity went too).
async fn decide_from_index(
    store: &SqlStore,
    transaction: &mut Tx,
    request: &DelegationRequest,
    held_by: Option<&String>,
    lost_races: &HashMap<String, bool>,
    now: i64,
    settings: Settings,
) -> Result<Decision> {
    let index = store.index().await?;
    let mut decided = None;
    for with_unavailable in [false, true] {
        // An agent whose last slot went to another writer is full (and past
        // it, when its slot over capacity went too); the one that holds
        // this task's slot has it back to give.
        let load = |agent: &Agent| {
            if let Some(&over) = lost_races.get(&agent.id) {
                agent.current_workload.max(agent.workload_capacity.saturating_add(u32::from(over)))
            } else if held_by == Some(&agent.id) {
                agent.current_workload.saturating_sub(1)
            } else {
                agent.current_workload
            }
        };
        let mut snapshot = index.snapshot(request, with_unavailable, &load);
        if with_unavailable || !request.assigned_agent_id.is_empty() {
            snapshot.queued = load_queued(transaction, request).await?;
        }
        let decision = decide(request, &snapshot, now, settings);
        // A placement over capacity waits for the look that includes the
        // unavailable: the primary expert at capacity may be one the first
        // look leaves out.
        let settled = (decision.kind == DecisionKind::Delegate && !decision.over_capacity)
            || !request.assigned_agent_id.is_empty();
        decided = Some(decision);
        if settled {
            break;
        }
    }
    decided.ok_or_else(|| Error::Internal("no decision".into()))
}

/// One Delegate in a transaction of its own (see `together.rs` for the
/// calls decided together).
pub(super) async fn delegate_alone(
    store: &SqlStore,
    request: &DelegationRequest,
    now: i64,
    settings: Settings,
) -> Result<DelegationOutcome> {
    // Loaded before the transaction: a first load reads the whole roster.
    let index = store.index().await?;
    if let Some(native) = store.database.native()
        && !request.assigned_agent_id.is_empty()
        && !request.dry_run
    {
        let taken = native
            .write(&store.database.pool, |transaction| take_named_natively(transaction, index, request, now, settings))
            .await?;
        if let Some((decision, change)) = taken {
            let reread = store.index.apply_workloads(std::slice::from_ref(&change));
            store.reread_after_commit(&reread).await;
            return Ok(DelegationOutcome {
                decision,
                delegation_id: String::new(),
                changed_agents: vec![request.assigned_agent_id.clone()],
                queue_changed: false,
            });
        }
    }
    let mut changes = Vec::new();
    let mut lost_races: HashMap<String, bool> = HashMap::new();
    let outcome = delegate_in_transaction(store, request, now, settings, &mut changes, &mut lost_races).await;
    // What the database now holds, committed or not, for the next decision.
    let mut reread: Vec<String> = lost_races.into_keys().collect();
    if outcome.is_ok() {
        reread.extend(store.index.apply_workloads(&changes));
    }
    store.reread_after_commit(&reread).await;
    outcome
}

async fn delegate_in_transaction(
    store: &SqlStore,
    request: &DelegationRequest,
    now: i64,
    settings: Settings,
    changes: &mut Vec<WorkloadChange>,
    lost_races: &mut HashMap<String, bool>,
) -> Result<DelegationOutcome> {
    let mut transaction = store.database.pool.begin().await?;
    // A task holds one slot; the agent holding it has that slot for it. One
    // statement also tells whether the task waits in the queue.
    let row = sqlx::query(HELD_AND_QUEUED_SQL).bind(request.task_id.clone()).fetch_one(&mut *transaction).await?;
    let held_by: Option<String> = row.try_get("held_by")?;
    let was_queued = row.try_get::<i64, _>("queued")? > 0;
    // A decision that places the task takes it out of the queue.
    let leave_queue = async |transaction: &mut Tx, decision: &Decision| -> Result<bool> {
        if was_queued { resolve_queued(transaction, &request.task_id, "superseded", decision).await } else { Ok(false) }
    };
    if !request.assigned_agent_id.is_empty()
        && !request.dry_run
        && let Some(decision) =
            take_assigned_slot(&mut transaction, request, held_by.as_ref(), now, settings, changes).await?
    {
        let mut changed_agents = vec![request.assigned_agent_id.clone()];
        if let Some(previous) = held_by.filter(|previous| *previous != decision.primary_agent_id) {
            changes.extend(free_slot(&mut transaction, &previous, now).await?);
            changed_agents.push(previous);
        }
        upsert_reservation(&mut transaction, &request.task_id, &decision.primary_agent_id, now).await?;
        let queue_changed = leave_queue(&mut transaction, &decision).await?;
        // A task a process assigned by name is no choice of the roster's: the
        // audit trail keeps its queue waits and escalations, not this, unless
        // the task took the agent's slot over capacity.
        let delegation_id = if decision.over_capacity {
            record(&mut transaction, &request.task_id, &request.requester_id, &decision, &request.description, now)
                .await?
        } else {
            String::new()
        };
        transaction.commit().await?;
        return Ok(DelegationOutcome { decision, delegation_id, changed_agents, queue_changed });
    }
    let mut decision = None;
    for _ in 0..MAX_ATTEMPTS {
        let candidate =
            decide_from_index(store, &mut transaction, request, held_by.as_ref(), lost_races, now, settings).await?;
        if candidate.kind != DecisionKind::Delegate
            || request.dry_run
            || held_by.as_ref() == Some(&candidate.primary_agent_id)
        {
            decision = Some(candidate);
            break;
        }
        if let Some(change) =
            reserve_slot(&mut transaction, &candidate.primary_agent_id, candidate.over_capacity, now).await?
        {
            changes.push(change);
            decision = Some(candidate);
            break;
        }
        tracing::debug!(
            agent_id = %candidate.primary_agent_id,
            task_id = %request.task_id,
            over_capacity = candidate.over_capacity,
            "lost the race for a slot; deciding again"
        );
        lost_races.insert(candidate.primary_agent_id, candidate.over_capacity);
    }
    let decision = decision.ok_or_else(|| Error::RetryLater {
        reason: "ROSTER_BUSY",
        message: "the roster changed too often while deciding; try again".to_owned(),
    })?;
    // A dry run writes nothing; nor does a task asked for only if its agent
    // has a free slot, when it has none (the transaction rolls back).
    if !request.writes(decision.kind) {
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
                changes.extend(free_slot(&mut transaction, &previous, now).await?);
                changed_agents.push(previous);
            }
            upsert_reservation(&mut transaction, &request.task_id, &decision.primary_agent_id, now).await?;
            leave_queue(&mut transaction, &decision).await?
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
        DecisionKind::Escalate => leave_queue(&mut transaction, &decision).await?,
    };
    let delegation_id = if decision.kind == DecisionKind::Delegate
        && !request.assigned_agent_id.is_empty()
        && !decision.over_capacity
    {
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
        let mut changes = Vec::new();
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
                &mut changes,
            )
            .await?;
        }
        transaction.commit().await?;
        store.apply_workloads(&changes).await;
    }
    let mut answered = Vec::with_capacity(requests.len());
    for (request, outcome) in requests.iter().zip(outcomes) {
        answered.push(match outcome {
            Some(outcome) => outcome,
            None => super::together::delegate(store, request, now, settings).await?,
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
    changes: &mut Vec<WorkloadChange>,
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
        let updated = workload_update(
            transaction,
            sqlx::query(
                "UPDATE agents SET current_workload = current_workload + $2, updated_at = $3, version = version + 1 \
                 WHERE id = $1 AND current_workload + $2 <= workload_capacity \
                 AND manual_status NOT IN ('offline', 'busy') RETURNING id, version, current_workload",
            )
            .bind(agent_id.to_owned())
            .bind(want as i64)
            .bind(now),
        )
        .await?;
        if let Some(change) = updated {
            changes.push(change);
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
            changes.extend(free_slot(transaction, previous, now).await?);
        }
    }
    let reservations: Vec<(&str, &str, i64)> =
        wanted[..taken].iter().map(|&index| (requests[index].task_id.as_str(), agent_id, now)).collect();
    upsert_reservations(transaction, backend, &reservations).await?;
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
            // Its own slot counts as free for it, even over capacity.
            seen.current_workload =
                seen.current_workload.saturating_sub(1).min(seen.workload_capacity.saturating_sub(1));
        }
        let decision =
            decide(request, &Snapshot { agents: vec![Arc::new(seen)], ..Snapshot::default() }, now, settings);
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

/// Many tasks' reservations, `(task, agent holding its slot, since)` each,
/// in multi-row statements.
pub(super) async fn upsert_reservations(
    transaction: &mut Tx,
    backend: Backend,
    rows: &[(&str, &str, i64)],
) -> Result<()> {
    for chunk in rows.chunks(BATCH_ROWS_PER_STATEMENT) {
        let query = chunk.iter().fold(
            sqlx::query(AssertSqlSafe(reservations_sql(backend, chunk.len()))),
            |query, (task_id, agent_id, at)| query.bind((*task_id).to_owned()).bind((*agent_id).to_owned()).bind(*at),
        );
        query.execute(&mut **transaction).await?;
    }
    Ok(())
}

/// [`upsert_reservations`] in a transaction on a SQLite file's native
/// connection.
pub(super) fn upsert_reservations_natively(
    transaction: &rusqlite::Connection,
    rows: &[(&str, &str, i64)],
) -> Result<()> {
    for chunk in rows.chunks(BATCH_ROWS_PER_STATEMENT) {
        let mut statement = transaction.prepare_cached(&reservations_sql(Backend::Sqlite, chunk.len()))?;
        for (row, (task_id, agent_id, at)) in chunk.iter().enumerate() {
            statement.raw_bind_parameter(row * 3 + 1, *task_id)?;
            statement.raw_bind_parameter(row * 3 + 2, *agent_id)?;
            statement.raw_bind_parameter(row * 3 + 3, *at)?;
        }
        statement.raw_execute()?;
    }
    Ok(())
}

/// Upserts `rows` reservations, 3 parameters each.
fn reservations_sql(backend: Backend, rows: usize) -> String {
    format!(
        "INSERT INTO reservations (task_id, agent_id, reserved_at) VALUES {} \
         ON CONFLICT (task_id) DO UPDATE SET agent_id = excluded.agent_id, reserved_at = excluded.reserved_at",
        muster_runtime::db::placeholders(backend, rows, 3)
    )
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

/// What a release transaction did.
#[derive(Default)]
struct Released {
    /// Who held a slot for each task.
    held: HashMap<String, String>,
    /// How long each task held its slot, in ms.
    held_for: HashMap<String, i64>,
    /// The agents whose observed task duration changed, with the new average.
    averages: Vec<(String, i64)>,
    /// The tasks that left the queue (a task that ends while still queued
    /// is never offered a slot).
    left_queue: HashSet<String>,
    /// The queued tasks each agent's freed slots went to, oldest first.
    offers: HashMap<String, std::collections::VecDeque<QueueResolution>>,
    /// The workloads it changed.
    changes: Vec<WorkloadChange>,
}

/// Frees the slots of many tasks in one transaction, each as [`release_task`]
/// would: the reservations and queue entries go in multi-row statements,
/// each agent's freed slots in one update, and then, one at a time, to the
/// oldest tasks queued for that agent. A fan-out's ends cost a few
/// statements instead of four per task.
///
/// On a SQLite file, a release whose agents have no task waiting for them
/// (nearly every one) runs on the calling thread
/// ([`muster_runtime::db::NativeSqlite`]), like the Delegate calls decided
/// together: besides sparing a thread hand-off per statement, one
/// connection writing keeps SQLite's page cache, which a transaction
/// discards whenever another connection wrote since its last one.
pub(super) async fn release_tasks(store: &SqlStore, task_ids: &[String], now: i64) -> Result<Vec<ReleaseOutcome>> {
    // A task named twice is released at its first mention.
    let mut distinct = HashSet::with_capacity(task_ids.len());
    let first_mention: Vec<bool> = task_ids.iter().map(|task_id| distinct.insert(task_id.as_str())).collect();
    let first_mentions: Vec<&String> =
        task_ids.iter().zip(&first_mention).filter(|(_, first)| **first).map(|(task_id, _)| task_id).collect();
    let natively = match store.database.native() {
        Some(native) => {
            native
                .write(&store.database.pool, |transaction| release_natively(transaction, &first_mentions, now))
                .await?
        }
        None => None,
    };
    let mut released = match natively {
        Some(released) => released,
        None => release_in_pool(store, &first_mentions, now).await?,
    };
    store.apply_workloads(&released.changes).await;
    store.index.apply_averages(&released.averages);
    let outcomes = task_ids
        .iter()
        .zip(first_mention)
        .map(|(task_id, first)| {
            if !first {
                return ReleaseOutcome::default();
            }
            let agent_id = released.held.get(task_id).cloned();
            let offered = agent_id.as_deref().and_then(|agent| released.offers.get_mut(agent)?.pop_front());
            let queue_changed = released.left_queue.contains(task_id) || offered.is_some();
            ReleaseOutcome { agent_id, offered, queue_changed }
        })
        .collect();
    Ok(outcomes)
}

/// Each agent's freed slots, in the order its tasks were named, with how
/// long those tasks took on average (ms; 0 when unknown).
fn freed_slots(released: &Released, first_mentions: &[&String]) -> Vec<(String, u32, i64)> {
    let mut freed: Vec<(&str, u32, i64)> = Vec::new();
    for task_id in first_mentions {
        if let Some(agent_id) = released.held.get(task_id.as_str()) {
            let took = released.held_for.get(task_id.as_str()).copied().unwrap_or(0).max(0);
            match freed.iter_mut().find(|(agent, _, _)| *agent == agent_id) {
                Some((_, count, total)) => {
                    *count += 1;
                    *total = total.saturating_add(took);
                }
                None => freed.push((agent_id, 1, took)),
            }
        }
    }
    freed.into_iter().map(|(agent, count, total)| (agent.to_owned(), count, total / i64::from(count))).collect()
}

/// Gives back `$2` slots of agent `$1` at time `$3`, whose tasks took `$4`
/// ms on average: the agent's observed task duration moves a fifth of the
/// way towards it (or starts at it).
const FREE_SLOTS_SQL: &str = "UPDATE agents SET current_workload = \
     CASE WHEN current_workload > $2 THEN current_workload - $2 ELSE 0 END, \
     average_task_millis = CASE WHEN $4 <= 0 THEN average_task_millis \
     WHEN average_task_millis <= 0 THEN $4 ELSE (average_task_millis * 4 + $4) / 5 END, \
     updated_at = $3, version = version + 1 WHERE id = $1 \
     RETURNING id, version, current_workload, average_task_millis";

/// [`release_tasks`]'s transaction through the pool, offering the freed
/// slots to the tasks queued for them.
async fn release_in_pool(store: &SqlStore, first_mentions: &[&String], now: i64) -> Result<Released> {
    let backend = store.database.backend;
    let mut transaction = store.database.pool.begin().await?;
    let mut released = Released::default();
    for chunk in first_mentions.chunks(BATCH_ROWS_PER_STATEMENT) {
        let list = muster_runtime::db::placeholder_list(backend, 1, chunk.len());
        let sql =
            format!("DELETE FROM reservations WHERE task_id IN ({list}) RETURNING task_id, agent_id, reserved_at");
        let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, task_id| query.bind((*task_id).clone()));
        for row in query.fetch_all(&mut *transaction).await? {
            let task_id: String = row.try_get("task_id")?;
            released.held_for.insert(task_id.clone(), now - row.try_get::<i64, _>("reserved_at")?);
            released.held.insert(task_id, row.try_get("agent_id")?);
        }
        let sql = format!("DELETE FROM queued_tasks WHERE state = 'queued' AND task_id IN ({list}) RETURNING task_id");
        let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, task_id| query.bind((*task_id).clone()));
        for row in query.fetch_all(&mut *transaction).await? {
            released.left_queue.insert(row.try_get("task_id")?);
        }
    }
    for (agent_id, count, took) in freed_slots(&released, first_mentions) {
        let row = sqlx::query(FREE_SLOTS_SQL)
            .bind(agent_id.clone())
            .bind(i64::from(count))
            .bind(now)
            .bind(took)
            .fetch_optional(&mut *transaction)
            .await?;
        if let Some(row) = row {
            released.changes.push(workload_change(&row)?);
            released.averages.push((agent_id.clone(), row.try_get("average_task_millis")?));
        }
        let mut offered = std::collections::VecDeque::new();
        for _ in 0..count {
            match offer_slot(&mut transaction, &agent_id, now, &mut released.changes).await? {
                Some(resolution) => offered.push_back(resolution),
                None => break,
            }
        }
        released.offers.insert(agent_id, offered);
    }
    transaction.commit().await?;
    Ok(released)
}

/// [`release_tasks`]'s transaction on a SQLite file's native connection;
/// `None`, having written nothing, when a task waits in the queue for an
/// agent whose slot it frees (the pool's path offers it the slot).
fn release_natively(
    transaction: &rusqlite::Connection,
    first_mentions: &[&String],
    now: i64,
) -> Result<Option<Released>> {
    let mut released = Released::default();
    for chunk in first_mentions.chunks(BATCH_ROWS_PER_STATEMENT) {
        let list = muster_runtime::db::placeholder_list(Backend::Sqlite, 1, chunk.len());
        let mut waiting = transaction.prepare_cached(&format!(
            "SELECT 1 FROM reservations r JOIN queued_tasks q ON q.expert_id = r.agent_id AND q.state = 'queued' \
             WHERE r.task_id IN ({list}) LIMIT 1"
        ))?;
        for (position, task_id) in chunk.iter().enumerate() {
            waiting.raw_bind_parameter(position + 1, task_id.as_str())?;
        }
        if waiting.raw_query().next()?.is_some() {
            return Ok(None);
        }
    }
    for chunk in first_mentions.chunks(BATCH_ROWS_PER_STATEMENT) {
        let list = muster_runtime::db::placeholder_list(Backend::Sqlite, 1, chunk.len());
        for (sql, taken) in [
            (
                format!("DELETE FROM reservations WHERE task_id IN ({list}) RETURNING task_id, agent_id, reserved_at"),
                true,
            ),
            (
                format!("DELETE FROM queued_tasks WHERE state = 'queued' AND task_id IN ({list}) RETURNING task_id"),
                false,
            ),
        ] {
            let mut statement = transaction.prepare_cached(&sql)?;
            for (position, task_id) in chunk.iter().enumerate() {
                statement.raw_bind_parameter(position + 1, task_id.as_str())?;
            }
            let mut rows = statement.raw_query();
            while let Some(row) = rows.next()? {
                if taken {
                    let task_id: String = row.get(0)?;
                    released.held_for.insert(task_id.clone(), now - row.get::<_, i64>(2)?);
                    released.held.insert(task_id, row.get(1)?);
                } else {
                    released.left_queue.insert(row.get(0)?);
                }
            }
        }
    }
    let mut statement = transaction.prepare_cached(&super::sql::for_rusqlite(FREE_SLOTS_SQL))?;
    for (agent_id, count, took) in freed_slots(&released, first_mentions) {
        let mut rows = statement.query(rusqlite::params![agent_id, i64::from(count), now, took])?;
        if let Some(row) = rows.next()? {
            let workload: i64 = row.get(2)?;
            released.changes.push((row.get(0)?, row.get(1)?, u32::try_from(workload.max(0)).unwrap_or(u32::MAX)));
            released.averages.push((agent_id, row.get(3)?));
        }
    }
    drop(statement);
    Ok(Some(released))
}

/// Offers a freed slot of `agent_id` to the oldest task queued for it, if the
/// agent can take it; `None` when nobody waits or the agent cannot.
async fn offer_slot(
    transaction: &mut Tx,
    agent_id: &str,
    now: i64,
    changes: &mut Vec<WorkloadChange>,
) -> Result<Option<QueueResolution>> {
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
    let Some(reserved) = reserve_slot(transaction, agent_id, false, now).await? else { return Ok(None) };
    changes.push(reserved);
    // A task handed to a busy agent may still hold its former slot.
    let former = sqlx::query("SELECT agent_id FROM reservations WHERE task_id = $1")
        .bind(queued_task.clone())
        .fetch_optional(&mut **transaction)
        .await?;
    if let Some(former) = former {
        changes.extend(free_slot(transaction, &former.try_get::<String, _>("agent_id")?, now).await?);
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

/// Most audit records one transaction of [`fold_audit_trail`] moves.
const FOLD_BATCH: usize = 512;

/// Moves the audit records in `delegation_log` into `delegations`, oldest
/// first, [`FOLD_BATCH`] per transaction, until none that was there when it
/// began is left (another replica may be moving some: it waits for those).
/// Returns how many this call moved.
pub(super) async fn fold_audit_trail(store: &SqlStore) -> Result<u64> {
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT MAX(seq) FROM delegation_log").fetch_one(&store.database.pool).await?;
    let Some(newest) = newest else { return Ok(0) };
    let mut moved = 0;
    loop {
        let (batch, left) = match store.database.native() {
            Some(native) => {
                native.write(&store.database.pool, |transaction| fold_natively(transaction, newest)).await?
            }
            None => fold_in_pool(store, newest).await?,
        };
        moved += batch;
        if !left {
            return Ok(moved);
        }
        // Decisions waiting for the writer take it between two batches.
        tokio::task::yield_now().await;
    }
}

/// On SQLite: the oldest records up to `$1` into `delegations`, then out of the log.
fn fold_sqlite_sql() -> [String; 2] {
    let oldest = format!("SELECT seq FROM delegation_log WHERE seq <= $1 ORDER BY seq LIMIT {FOLD_BATCH}");
    [
        format!(
            "INSERT INTO delegations ({RECORD_COLUMNS}) SELECT {RECORD_COLUMNS} FROM delegation_log \
             WHERE seq IN ({oldest}) ORDER BY seq"
        ),
        format!("DELETE FROM delegation_log WHERE seq IN ({oldest})"),
    ]
}

/// Whether the log still holds records up to `$1`.
const FOLD_LEFT_SQL: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM delegation_log WHERE seq <= $1 LIMIT 1) AS left_over";

/// One batch of [`fold_audit_trail`] on a SQLite file's native connection:
/// how many moved, and whether more are left.
fn fold_natively(transaction: &rusqlite::Connection, newest: i64) -> Result<(u64, bool)> {
    let [insert, delete] = fold_sqlite_sql();
    let moved = transaction.prepare_cached(&super::sql::for_rusqlite(&insert))?.execute([newest])?;
    transaction.prepare_cached(&super::sql::for_rusqlite(&delete))?.execute([newest])?;
    let left: i64 =
        transaction.prepare_cached(&super::sql::for_rusqlite(FOLD_LEFT_SQL))?.query_row([newest], |row| row.get(0))?;
    Ok((moved as u64, left > 0))
}

/// One batch of [`fold_audit_trail`] through the pool. On PostgreSQL one
/// statement moves the records, locking them first: a replica moving the
/// same records meanwhile is waited for, and each record moves once.
async fn fold_in_pool(store: &SqlStore, newest: i64) -> Result<(u64, bool)> {
    let mut transaction = store.database.pool.begin().await?;
    let moved = match store.database.backend {
        Backend::Sqlite => {
            let [insert, delete] = fold_sqlite_sql();
            let moved = sqlx::query(AssertSqlSafe(insert)).bind(newest).execute(&mut *transaction).await?;
            sqlx::query(AssertSqlSafe(delete)).bind(newest).execute(&mut *transaction).await?;
            moved.rows_affected()
        }
        Backend::Postgres => {
            let sql = format!(
                "WITH moved AS (DELETE FROM delegation_log WHERE seq IN \
                 (SELECT seq FROM delegation_log WHERE seq <= $1 ORDER BY seq LIMIT {FOLD_BATCH} FOR UPDATE) \
                 RETURNING seq, {RECORD_COLUMNS}) \
                 INSERT INTO delegations ({RECORD_COLUMNS}) SELECT {RECORD_COLUMNS} FROM moved ORDER BY seq"
            );
            sqlx::query(AssertSqlSafe(sql)).bind(newest).execute(&mut *transaction).await?.rows_affected()
        }
    };
    let left: i64 = sqlx::query_scalar(FOLD_LEFT_SQL).bind(newest).fetch_one(&mut *transaction).await?;
    transaction.commit().await?;
    Ok((moved, left > 0))
}

pub(super) async fn list_delegations(store: &SqlStore, query: &DelegationQuery) -> Result<Vec<DelegationRecord>> {
    // Every decision answered before this call is in the trail it reads.
    fold_audit_trail(store).await?;
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
