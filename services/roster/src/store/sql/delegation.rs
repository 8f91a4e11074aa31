//! Delegation in the database: the atomic slot reservation, the queue and
//! the audit trail. The framework decides from the organisation in memory
//! (`index.rs`); each workload a transaction changes goes to the index once
//! the transaction commits.

pub(super) mod audit;
pub(super) mod queue;
pub(super) mod release;
pub(super) mod reservation;
pub(super) mod together;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use crate::domain::{
    delegation::{Decision, DecisionKind, DelegationRequest, Settings, Snapshot, decide},
    model::{Agent, Status},
};
use crate::error::{Error, Result};
use crate::store::{
    DelegationOutcome, ReleaseOutcome,
    sql::{
        AGENT_COLUMNS, SqlStore, agent_from_row, fetch_agent,
        index::{Index, WorkloadChange},
    },
};
use audit::record;
use queue::{load_queued, resolve_queued};
use reservation::{
    HELD_AND_QUEUED_SQL, RESERVE_SLOT_SQL, free_slot, reserve_slot, upsert_reservation, upsert_reservations,
    upsert_reservations_natively, workload_update,
};

/// How many times a Delegate re-decides after losing a race for a slot.
const MAX_ATTEMPTS: usize = 16;

type Tx = Transaction<'static, Any>;

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
            store.apply_workloads(std::slice::from_ref(&change)).await;
            return Ok(taken_natively(request, decision));
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
    let mut transaction = store.database.begin_write().await?;
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

/// [`delegate`] for many tasks. Tasks assigned to the same agent are placed
/// together in one transaction: those already holding a slot of the agent
/// keep it, the others take as many of its free slots as there are (one
/// conditional workload update for all of them). On a SQLite file, the
/// tasks in the common case (an agent with room, no slot held, no queue)
/// are placed first, all in one transaction on the native connection, and
/// only the others go this way. Every task left over — not assigned, or
/// with no free slot for it — is decided alone.
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
    if let Some(native) = store.database.native() {
        let named: Vec<usize> = by_agent.values().flatten().copied().collect();
        take_named_together_natively(store, native, requests, &named, now, settings, &mut outcomes).await?;
        by_agent.retain(|_, indexes| {
            indexes.retain(|&index| outcomes[index].is_none());
            !indexes.is_empty()
        });
    }
    if !by_agent.is_empty() {
        let mut transaction = store.database.begin_write().await?;
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
            None => crate::store::sql::delegation::together::delegate(store, request, now, settings).await?,
        });
    }
    Ok(answered)
}

/// The tasks of a batch at `named` (each assigned to one agent, none a dry
/// run), in the common case ([`take_named_natively`]), all in one
/// transaction on the SQLite file's native connection: their `outcomes`
/// filled, the others left `None` for the general path.
async fn take_named_together_natively(
    store: &SqlStore,
    native: &muster_runtime::db::NativeSqlite,
    requests: &[DelegationRequest],
    named: &[usize],
    now: i64,
    settings: Settings,
    outcomes: &mut [Option<DelegationOutcome>],
) -> Result<()> {
    if named.is_empty() {
        return Ok(());
    }
    let index = store.index().await?;
    let taken = native
        .write(&store.database.pool, |transaction| {
            let mut taken = Vec::new();
            for &position in named {
                if let Some(placed) = take_named_natively(transaction, index, &requests[position], now, settings)? {
                    taken.push((position, placed));
                }
            }
            Ok::<_, Error>(taken)
        })
        .await?;
    let changes: Vec<WorkloadChange> = taken.iter().map(|(_, (_, change))| change.clone()).collect();
    store.apply_workloads(&changes).await;
    for (position, (decision, _)) in taken {
        outcomes[position] = Some(taken_natively(&requests[position], decision));
    }
    Ok(())
}

/// Why a placement on the native connection gives way.
enum Placing {
    Failed(Error),
    /// Something [`place_natively`] does not settle: nothing is written,
    /// and the releases and delegations go apart.
    GivesWay,
}

impl<E: Into<Error>> From<E> for Placing {
    fn from(error: E) -> Self {
        Self::Failed(error.into())
    }
}

/// `releases` released, then `requests` placed, in one transaction on the
/// SQLite file's native connection, when each is settled as
/// [`take_named_natively`] settles it (assigned to one agent, which takes
/// it within its capacity; no dry run, no task twice) and no freed slot
/// has a task queued for it: a chain's step gives its slot back and takes
/// the next one's in one commit. `None`, having written nothing, otherwise.
pub(in crate::store) async fn place_natively(
    store: &SqlStore,
    releases: &[String],
    requests: &[DelegationRequest],
    now: i64,
    settings: Settings,
) -> Result<Option<(Vec<ReleaseOutcome>, Vec<DelegationOutcome>)>> {
    let Some(native) = store.database.native() else { return Ok(None) };
    let mut tasks = HashSet::with_capacity(requests.len());
    if requests.iter().any(|request| {
        request.assigned_agent_id.is_empty() || request.dry_run || !tasks.insert(request.task_id.as_str())
    }) {
        return Ok(None);
    }
    let index = store.index().await?;
    let (first_mention, first_mentions) = release::first_mentions(releases);
    let placed = native
        .write(&store.database.pool, |transaction| {
            let released = release::release_natively(transaction, &first_mentions, now)?.ok_or(Placing::GivesWay)?;
            let mut taken = Vec::with_capacity(requests.len());
            for request in requests {
                taken.push(take_named_natively(transaction, index, request, now, settings)?.ok_or(Placing::GivesWay)?);
            }
            Ok((released, taken))
        })
        .await;
    let (released, taken) = match placed {
        Ok(placed) => placed,
        Err(Placing::GivesWay) => return Ok(None),
        Err(Placing::Failed(error)) => return Err(error),
    };
    let released = release::outcomes(store, releases, &first_mention, released).await;
    let changes: Vec<WorkloadChange> = taken.iter().map(|(_, change)| change.clone()).collect();
    store.apply_workloads(&changes).await;
    let decided =
        requests.iter().zip(taken).map(|(request, (decision, _))| taken_natively(request, decision)).collect();
    Ok(Some((released, decided)))
}

/// The outcome of a task [`take_named_natively`] placed on its agent.
fn taken_natively(request: &DelegationRequest, decision: Decision) -> DelegationOutcome {
    DelegationOutcome {
        decision,
        delegation_id: String::new(),
        changed_agents: vec![request.assigned_agent_id.clone()],
        queue_changed: false,
    }
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
    for chunk in muster_runtime::db::in_statements(indexes) {
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
    for chunk in muster_runtime::db::in_statements(&placed) {
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

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|error| Error::Internal(error.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| Error::Internal(format!("bad stored json: {error}")))
}
