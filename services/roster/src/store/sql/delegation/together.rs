//! Delegate calls decided together: calls that arrive while a transaction
//! is running wait, and the next transaction decides all of them (group
//! commit). Each call is answered once that transaction has committed, so a
//! crash loses no reservation that was answered.
//!
//! A transaction of many decisions costs about what one costs: one read of
//! the tasks' slots and queue places, one conditional update that takes
//! every chosen agent's slots, one insert of the reservations and one of the
//! audit records. Decisions come from the organisation in memory, each one
//! seeing the slots taken by those before it in the batch. What this path
//! does not settle goes through [`delegate_alone`], one call at a time, after
//! the batch: a dry run or a task assigned to one agent, a task that holds a
//! slot or waits in the queue, a decision that is not DELEGATE, an urgent
//! task placed over capacity (its reservation has a guard of its own), a
//! task named twice, an agent whose slot went to another writer meanwhile. A call
//! that arrives while nothing is being decided takes this path too, as a
//! batch of one, on its own task; the calls that arrive meanwhile are
//! decided by a task spawned for them.
//!
//! On a SQLite file the transaction runs whole on the calling thread
//! (`muster_runtime::db::NativeSqlite`): the decisions need nothing but the
//! organisation in memory, so nothing waits between its statements.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

use muster_runtime::db::{Backend, placeholder, placeholder_list, placeholders};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::oneshot;

use super::{
    audit::RECORD_COLUMNS,
    delegate_alone,
    reservation::{upsert_reservations, upsert_reservations_natively, workload_change},
    to_json,
};
use crate::domain::{
    delegation::{Decision, DecisionKind, DelegationRequest, Settings, decide},
    model::Agent,
};
use crate::error::{Error, Result};
use crate::store::{
    DelegationOutcome,
    sql::{
        SqlStore,
        index::{Index, WorkloadChange},
    },
};

/// Most calls one transaction decides.
const MOST_TOGETHER: usize = 256;

/// A call waiting for the next transaction.
#[derive(Debug)]
struct Pending {
    request: DelegationRequest,
    now: i64,
    settings: Settings,
    reply: oneshot::Sender<Result<DelegationOutcome>>,
}

/// The calls waiting, and whether a task is deciding them.
#[derive(Debug, Default)]
pub(in crate::store::sql) struct Waiting {
    pending: Vec<Pending>,
    running: bool,
    /// Calls settled by a transaction shared with others, since the start.
    together: u64,
}

impl SqlStore {
    /// How many Delegate calls were settled in a transaction shared with
    /// other calls since this store was made.
    pub fn delegations_decided_together(&self) -> u64 {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).together
    }
}

/// Decides `request` with the calls that arrive meanwhile.
pub(in crate::store::sql) async fn delegate(
    store: &SqlStore,
    request: &DelegationRequest,
    now: i64,
    settings: Settings,
) -> Result<DelegationOutcome> {
    if request.dry_run || !request.assigned_agent_id.is_empty() {
        return delegate_alone(store, request, now, settings).await;
    }
    let (reply, answer) = oneshot::channel();
    let pending = Pending { request: request.clone(), now, settings, reply };
    let lead = {
        let mut waiting = store.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.running {
            waiting.pending.push(pending);
            None
        } else {
            waiting.running = true;
            Some(pending)
        }
    };
    if let Some(pending) = lead {
        // Nobody is deciding: this call decides itself, as a batch of one,
        // without a hand-off to another task, and leaves the calls that
        // arrive meanwhile to a deciding task of their own.
        let _handover = Handover(store.clone());
        decide_batch(store, vec![pending]).await;
    }
    answer.await.map_err(|_| Error::Internal("the delegation batch ended without an answer".into()))?
}

/// Ends a call's own decision: the calls that arrived meanwhile go to a
/// deciding task (a caller that goes away does not stop their decisions),
/// or, with none waiting, the next call decides itself.
struct Handover(SqlStore);

impl Drop for Handover {
    fn drop(&mut self) {
        let mut waiting = self.0.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.pending.is_empty() {
            waiting.running = false;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(waiting);
                runtime.spawn(decide_waiting(self.0.clone()));
            }
            Err(_) => {
                // No runtime to decide them on: they are answered with an error.
                waiting.pending.clear();
                waiting.running = false;
            }
        }
    }
}

/// If the deciding task ends early (a panic), the calls still waiting are
/// answered with an error rather than left waiting, and the next call decides
/// itself.
struct Running {
    waiting: Arc<Mutex<Waiting>>,
    armed: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.armed {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.running = false;
            waiting.pending.clear();
        }
    }
}

async fn decide_waiting(store: SqlStore) {
    let mut running = Running { waiting: store.waiting.clone(), armed: true };
    loop {
        let batch = {
            let mut waiting = store.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if waiting.pending.is_empty() {
                // Under the lock: a call arriving after this decides itself.
                waiting.running = false;
                running.armed = false;
                return;
            }
            let take = waiting.pending.len().min(MOST_TOGETHER);
            waiting.pending.drain(..take).collect::<Vec<_>>()
        };
        decide_batch(&store, batch).await;
    }
}

async fn decide_batch(store: &SqlStore, batch: Vec<Pending>) {
    let mut seen = HashSet::new();
    let (together, mut alone): (Vec<Pending>, Vec<Pending>) =
        batch.into_iter().partition(|pending| seen.insert(pending.request.task_id.clone()));
    match decide_together(store, &together).await {
        Ok(outcomes) => {
            if together.len() > 1 {
                let settled = outcomes.iter().filter(|outcome| outcome.is_some()).count() as u64;
                store.waiting.lock().unwrap_or_else(PoisonError::into_inner).together += settled;
            }
            for (pending, outcome) in together.into_iter().zip(outcomes) {
                match outcome {
                    Some(outcome) => {
                        let _ = pending.reply.send(Ok(outcome));
                    }
                    None => alone.push(pending),
                }
            }
        }
        Err(error) => {
            tracing::debug!(%error, calls = together.len(), "deciding together failed; deciding one by one");
            alone.extend(together);
        }
    }
    for pending in alone {
        let outcome = delegate_alone(store, &pending.request, pending.now, pending.settings).await;
        let _ = pending.reply.send(outcome);
    }
}

/// What one transaction of calls decided together settled.
struct Settled {
    /// Per call, in order: its decision, or `None` when this path does not
    /// settle it.
    decisions: Vec<Option<Decision>>,
    /// The audit record of each settled decision, in order.
    ids: Vec<String>,
    /// The workloads the transaction changed.
    changes: Vec<WorkloadChange>,
    /// Agents that had fewer free slots than the index knew.
    missed: Vec<String>,
}

/// One transaction for every call of `batch` (task ids distinct); `None` for
/// each call this path does not settle.
async fn decide_together(store: &SqlStore, batch: &[Pending]) -> Result<Vec<Option<DelegationOutcome>>> {
    let index = store.index().await?;
    let settled = match store.database.native() {
        Some(native) => {
            native.write(&store.database.pool, |transaction| settle_natively(transaction, index, batch)).await?
        }
        None => settle(store, index, batch).await?,
    };
    let mut reread = index.apply_workloads(&settled.changes);
    reread.extend(settled.missed);
    store.reread_after_commit(&reread).await;
    let mut ids = settled.ids.into_iter();
    Ok(settled
        .decisions
        .into_iter()
        .map(|decision| {
            let decision = decision?;
            Some(DelegationOutcome {
                changed_agents: vec![decision.primary_agent_id.clone()],
                delegation_id: ids.next()?,
                decision,
                queue_changed: false,
            })
        })
        .collect())
}

/// The tasks of `batch` that hold a slot or wait in the queue: `2 × batch`
/// parameters, the task ids twice.
fn placed_before_sql(backend: Backend, batch: usize) -> String {
    format!(
        "SELECT task_id FROM reservations WHERE task_id IN ({}) \
         UNION SELECT task_id FROM queued_tasks WHERE state = 'queued' AND task_id IN ({})",
        placeholder_list(backend, 1, batch),
        placeholder_list(backend, batch + 1, batch)
    )
}

/// Decides in order, each decision seeing the slots the ones before it
/// took; also the slots each chosen agent must give.
fn decide_in_order(
    index: &Index,
    batch: &[Pending],
    placed_before: &HashSet<String>,
) -> (Vec<Option<Decision>>, HashMap<String, u32>) {
    let mut taken: HashMap<String, u32> = HashMap::new();
    let mut decisions = Vec::with_capacity(batch.len());
    for pending in batch {
        let request = &pending.request;
        if placed_before.contains(&request.task_id) {
            decisions.push(None);
            continue;
        }
        let load = |agent: &Agent| agent.current_workload + taken.get(&agent.id).copied().unwrap_or(0);
        let snapshot = index.snapshot(request, false, &load);
        let decision = decide(request, &snapshot, pending.now, pending.settings);
        // A slot over capacity is taken alone: its update must find the
        // agent exactly at capacity, which the batch's one update, taking
        // the chosen agents' slots below capacity, does not check.
        if decision.kind != DecisionKind::Delegate || decision.over_capacity {
            decisions.push(None);
            continue;
        }
        *taken.entry(decision.primary_agent_id.clone()).or_default() += 1;
        decisions.push(Some(decision));
    }
    (decisions, taken)
}

/// Every chosen agent's slots in one conditional update (`2 × agents`
/// parameters: id, slots; then the time); an agent not returned had fewer
/// free slots than the index knew.
fn take_slots_sql(backend: Backend, agents: usize) -> String {
    format!(
        "WITH wanted (id, slots) AS (VALUES {}) \
         UPDATE agents SET current_workload = agents.current_workload + wanted.slots, updated_at = {}, \
         version = agents.version + 1 FROM wanted \
         WHERE agents.id = wanted.id AND agents.current_workload + wanted.slots <= agents.workload_capacity \
         AND agents.manual_status NOT IN ('offline', 'busy') \
         RETURNING agents.id, agents.version, agents.current_workload",
        placeholders(backend, agents, 2),
        placeholder(backend, 2 * agents + 1)
    )
}

/// Drops the decisions whose agent had no slot left; returns those agents.
fn keep_reserved(
    decisions: &mut [Option<Decision>],
    taken: &HashMap<String, u32>,
    changes: &[WorkloadChange],
) -> Vec<String> {
    let reserved: HashSet<&str> = changes.iter().map(|(agent, _, _)| agent.as_str()).collect();
    for decision in decisions.iter_mut() {
        if decision.as_ref().is_some_and(|decision| !reserved.contains(decision.primary_agent_id.as_str())) {
            *decision = None;
        }
    }
    taken.keys().filter(|agent| !reserved.contains(agent.as_str())).cloned().collect()
}

/// The settled calls with their decisions.
fn placed<'a>(batch: &'a [Pending], decisions: &'a [Option<Decision>]) -> Vec<(&'a Pending, &'a Decision)> {
    batch.iter().zip(decisions).filter_map(|(pending, decision)| Some((pending, decision.as_ref()?))).collect()
}

/// The reservation of each settled call: its task, the agent, since when.
fn reservations<'a>(placed: &[(&'a Pending, &'a Decision)]) -> Vec<(&'a str, &'a str, i64)> {
    placed
        .iter()
        .map(|(pending, decision)| (pending.request.task_id.as_str(), decision.primary_agent_id.as_str(), pending.now))
        .collect()
}

/// The audit records of `rows` calls, 9 parameters each, appended to the log.
fn audit_records_sql(backend: Backend, rows: usize) -> String {
    format!("INSERT INTO delegation_log ({RECORD_COLUMNS}) VALUES {}", placeholders(backend, rows, 9))
}

/// [`decide_together`]'s transaction through the pool.
async fn settle(store: &SqlStore, index: &Index, batch: &[Pending]) -> Result<Settled> {
    let backend = store.database.backend;
    let mut transaction = store.database.begin_write().await?;
    let query = batch
        .iter()
        .chain(batch)
        .fold(sqlx::query(AssertSqlSafe(placed_before_sql(backend, batch.len()))), |query, pending| {
            query.bind(pending.request.task_id.clone())
        });
    let mut placed_before = HashSet::new();
    for row in query.fetch_all(&mut *transaction).await? {
        placed_before.insert(row.try_get::<String, _>("task_id")?);
    }
    let (mut decisions, taken) = decide_in_order(index, batch, &placed_before);
    if taken.is_empty() {
        return Ok(Settled { decisions, ids: Vec::new(), changes: Vec::new(), missed: Vec::new() });
    }

    let now = batch.iter().map(|pending| pending.now).max().unwrap_or_default();
    let query = taken
        .iter()
        .fold(sqlx::query(AssertSqlSafe(take_slots_sql(backend, taken.len()))), |query, (agent, slots)| {
            query.bind(agent.clone()).bind(i64::from(*slots))
        })
        .bind(now);
    let changes: Vec<WorkloadChange> =
        query.fetch_all(&mut *transaction).await?.iter().map(workload_change).collect::<Result<_>>()?;
    let missed = keep_reserved(&mut decisions, &taken, &changes);

    let placed = placed(batch, &decisions);
    let mut ids = Vec::with_capacity(placed.len());
    if !placed.is_empty() {
        upsert_reservations(&mut transaction, backend, &reservations(&placed)).await?;
        let mut query = sqlx::query(AssertSqlSafe(audit_records_sql(backend, placed.len())));
        for (pending, decision) in &placed {
            let id = uuid::Uuid::now_v7().to_string();
            query = query
                .bind(id.clone())
                .bind(pending.request.task_id.clone())
                .bind(pending.request.requester_id.clone())
                .bind(decision.primary_agent_id.clone())
                .bind(decision.kind.as_str().to_owned())
                .bind(decision.tier.as_str().to_owned())
                .bind(to_json(*decision)?)
                .bind(pending.request.description.clone())
                .bind(pending.now);
            ids.push(id);
        }
        query.execute(&mut *transaction).await?;
    }
    transaction.commit().await?;
    Ok(Settled { decisions, ids, changes, missed })
}

/// [`decide_together`]'s transaction on a SQLite file, run whole on the
/// calling thread: the same statements without a thread hand-off for each.
fn settle_natively(transaction: &rusqlite::Connection, index: &Index, batch: &[Pending]) -> Result<Settled> {
    let backend = Backend::Sqlite;
    let mut statement = transaction.prepare_cached(&placed_before_sql(backend, batch.len()))?;
    for (position, pending) in batch.iter().chain(batch).enumerate() {
        statement.raw_bind_parameter(position + 1, pending.request.task_id.as_str())?;
    }
    let mut placed_before = HashSet::new();
    let mut rows = statement.raw_query();
    while let Some(row) = rows.next()? {
        placed_before.insert(row.get::<_, String>(0)?);
    }
    drop(rows);
    drop(statement);
    let (mut decisions, taken) = decide_in_order(index, batch, &placed_before);
    if taken.is_empty() {
        return Ok(Settled { decisions, ids: Vec::new(), changes: Vec::new(), missed: Vec::new() });
    }

    let now = batch.iter().map(|pending| pending.now).max().unwrap_or_default();
    let mut statement = transaction.prepare_cached(&take_slots_sql(backend, taken.len()))?;
    for (position, (agent, slots)) in taken.iter().enumerate() {
        statement.raw_bind_parameter(2 * position + 1, agent.as_str())?;
        statement.raw_bind_parameter(2 * position + 2, i64::from(*slots))?;
    }
    statement.raw_bind_parameter(2 * taken.len() + 1, now)?;
    let mut changes: Vec<WorkloadChange> = Vec::with_capacity(taken.len());
    let mut rows = statement.raw_query();
    while let Some(row) = rows.next()? {
        let workload: i64 = row.get(2)?;
        changes.push((row.get(0)?, row.get(1)?, u32::try_from(workload.max(0)).unwrap_or(u32::MAX)));
    }
    drop(rows);
    drop(statement);
    let missed = keep_reserved(&mut decisions, &taken, &changes);

    let placed = placed(batch, &decisions);
    let mut ids = Vec::with_capacity(placed.len());
    if !placed.is_empty() {
        upsert_reservations_natively(transaction, &reservations(&placed))?;
        let mut statement = transaction.prepare_cached(&audit_records_sql(backend, placed.len()))?;
        for (row, (pending, decision)) in placed.iter().enumerate() {
            let id = uuid::Uuid::now_v7().to_string();
            let first = row * 9;
            statement.raw_bind_parameter(first + 1, id.as_str())?;
            statement.raw_bind_parameter(first + 2, pending.request.task_id.as_str())?;
            statement.raw_bind_parameter(first + 3, pending.request.requester_id.as_str())?;
            statement.raw_bind_parameter(first + 4, decision.primary_agent_id.as_str())?;
            statement.raw_bind_parameter(first + 5, decision.kind.as_str())?;
            statement.raw_bind_parameter(first + 6, decision.tier.as_str())?;
            statement.raw_bind_parameter(first + 7, to_json(*decision)?)?;
            statement.raw_bind_parameter(first + 8, pending.request.description.as_str())?;
            statement.raw_bind_parameter(first + 9, pending.now)?;
            ids.push(id);
        }
        statement.raw_execute()?;
    }
    Ok(Settled { decisions, ids, changes, missed })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        domain::model::{Agent, Team},
        store::Store,
    };

    const NOW: i64 = 1_700_000_000_000;

    async fn store_with_a_team() -> SqlStore {
        let store = SqlStore::connect("sqlite::memory:", 1).unwrap();
        store.migrate().await.unwrap();
        store.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
        for (id, senior) in [("lead", ""), ("dev", "lead")] {
            let agent = Agent {
                id: id.into(),
                team: "core".into(),
                senior_id: senior.into(),
                expertise: vec!["rust".into()],
                workload_capacity: 10,
                ..Agent::default()
            }
            .normalize()
            .unwrap();
            store.insert_agent(&agent, &muster_runtime::auth::TokenHash::of(id), NOW).await.unwrap();
        }
        store
    }

    fn call(task_id: &str) -> (Pending, oneshot::Receiver<Result<DelegationOutcome>>) {
        let request = DelegationRequest {
            task_id: task_id.into(),
            requester_id: "lead".into(),
            required_expertise: vec!["rust".into()],
            ..DelegationRequest::default()
        };
        let (reply, answer) = oneshot::channel();
        (Pending { request, now: NOW, settings: Settings::default(), reply }, answer)
    }

    /// Calls decided together each see the slots the ones before them
    /// took: thirty calls from a team of thirty-one idle colleagues go to
    /// thirty different colleagues.
    #[tokio::test]
    async fn calls_decided_together_spread_over_the_idle_colleagues() {
        let store = store_with_a_team().await;
        for member in 0..30 {
            let id = format!("dev-{member:02}");
            let agent = Agent {
                id: id.clone(),
                team: "core".into(),
                senior_id: "lead".into(),
                expertise: vec!["rust".into()],
                workload_capacity: 5,
                ..Agent::default()
            }
            .normalize()
            .unwrap();
            store.insert_agent(&agent, &muster_runtime::auth::TokenHash::of(&id), NOW).await.unwrap();
        }
        let (batch, answers): (Vec<_>, Vec<_>) = (0..30).map(|task| call(&format!("task-{task}"))).unzip();
        decide_batch(&store, batch).await;
        let mut chosen = HashSet::new();
        for answer in answers {
            let outcome = answer.await.unwrap().unwrap();
            assert_eq!(outcome.decision.kind, DecisionKind::Delegate);
            assert!(chosen.insert(outcome.decision.primary_agent_id.clone()), "chosen twice: {outcome:?}");
        }
    }

    /// Urgent calls decided in one batch against an expert at capacity:
    /// the batch leaves the slot over capacity to the calls decided alone,
    /// and exactly one of them takes it.
    #[tokio::test]
    async fn one_urgent_call_of_a_batch_takes_the_slot_over_capacity() {
        let store = store_with_a_team().await;
        for task in 0..10 {
            delegate(&store, &call(&format!("fill-{task}")).0.request, NOW, Settings::default()).await.unwrap();
        }
        assert_eq!(store.get_agent("dev").await.unwrap().current_workload, 10);
        let (mut batch, answers): (Vec<_>, Vec<_>) = (0..8).map(|task| call(&format!("urgent-{task}"))).unzip();
        for pending in &mut batch {
            pending.request.urgency = crate::domain::delegation::Urgency::Critical;
        }
        decide_batch(&store, batch).await;
        let mut over = 0;
        for answer in answers {
            let decision = answer.await.unwrap().unwrap().decision;
            if decision.kind == DecisionKind::Delegate {
                assert!(decision.over_capacity && decision.primary_agent_id == "dev", "{decision:?}");
                over += 1;
            }
        }
        assert_eq!(over, 1);
        assert_eq!(store.get_agent("dev").await.unwrap().current_workload, 11, "10/10 plus one over, never two");
    }

    /// A call that decided itself and ends (or whose caller went away
    /// before it ended) leaves the calls that arrived meanwhile to a task
    /// that decides them; with none, the next call decides itself.
    #[tokio::test]
    async fn the_calls_that_wait_on_a_call_deciding_itself_are_decided_after_it() {
        let store = store_with_a_team().await;
        let (waiting_call, answer) = call("waited");
        {
            let mut waiting = store.waiting.lock().unwrap();
            waiting.running = true;
            waiting.pending.push(waiting_call);
        }
        drop(Handover(store.clone()));
        let outcome = tokio::time::timeout(Duration::from_secs(10), answer).await.unwrap().unwrap().unwrap();
        assert_eq!(
            (outcome.decision.kind, outcome.decision.primary_agent_id.as_str()),
            (DecisionKind::Delegate, "dev")
        );
        for _ in 0..100 {
            if !store.waiting.lock().unwrap().running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!store.waiting.lock().unwrap().running, "the deciding task ended with nothing waiting");

        drop(Handover(store.clone()));
        assert!(!store.waiting.lock().unwrap().running, "nothing waited: the next call decides itself");
        let outcome = delegate(&store, &call("next").0.request, NOW, Settings::default()).await.unwrap();
        assert_eq!(outcome.decision.kind, DecisionKind::Delegate);
        assert_eq!(store.get_agent("dev").await.unwrap().current_workload, 2);
    }
}
