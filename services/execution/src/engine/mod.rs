//! The engine: publishes processes, starts executions and drives each one
//! in a task of its own (its [`driver`], the only writer of its state),
//! hands steps to the connected [`workers`], starts the runs that inboxes
//! ([`inbox`]) and schedules ([`schedule`]) trigger, keeps the processes of
//! the roles that run on their own ([`roles`]), and resumes unfinished
//! executions after a restart. Several replicas may share one database:
//! each drives the executions it holds a lease on ([`Engine::keep_lease`]),
//! and takes over those of a replica whose lease lapsed or that left. It
//! speaks domain types only; the roster is
//! reached through the [`Roster`] trait and storage through [`Store`], so
//! tests drive it with their own.
//!
//! Background work (drivers, the tasks that ask the roster, the notifier
//! publisher, the lease sweeper) runs on one [`TaskTracker`]: on shutdown
//! the engine stops taking work, cancels them and waits for them.

mod contexts;
mod driver;
mod handoff;
pub(crate) mod inbox;
mod intervention;
pub(crate) mod roles;
pub(crate) mod schedule;
pub(crate) mod schema;
mod session;
#[cfg(test)]
mod tests;
pub(crate) mod workers;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use sha2::Digest as _;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

pub(crate) use driver::step_roles;
pub(crate) use intervention::{Intervention, InterventionAction};
pub(crate) use session::{refused_steps, step_views};
use workers::{Slot, Workers};

use crate::{
    Error, Result,
    clients::roster::{Roster, RosterFailure},
    domain::{
        ExecutionStatus,
        authority::{DEFAULT_MATRIX, Matrix, RoleAssignment, Session, SubtaskRequest},
        budget::Budget,
        model::{
            AgentContext, Event, EventKind, Execution, Finding, HandOff, HandOffAnswer, Outcome, ProcessVersion, Step,
            Warnings,
        },
        progress::Progress,
    },
    store::{NewProcess, Published, Replica, StepWrite, Store, Write},
};

/// How the engine runs executions.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Most steps of one execution in flight at once, unless the process sets `max_parallel`.
    pub(crate) max_parallel: usize,
    /// How long a worker may stay silent before it loses its assignments.
    pub(crate) worker_lease: Duration,
    /// How long a step may wait for a worker, unless it sets its own
    /// `schedule_to_start_seconds`; `None`: as long as it takes.
    pub(crate) schedule_to_start: Option<Duration>,
    /// How long this replica's hold on its executions lasts without being
    /// renewed (it is renewed every third of it): after a crash, other
    /// replicas take the executions over within about this time.
    pub(crate) ownership_lease: Duration,
    /// This replica's stable identity (`MUSTER_REPLICA_ID`); empty: a new
    /// one at each start.
    pub(crate) replica_identity: String,
}

/// Where a worker's report (or a slot on a worker) goes: the driver of the
/// step's execution, with the step and its attempt.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) driver: mpsc::UnboundedSender<Input>,
    pub(crate) position: usize,
    pub(crate) attempt: u32,
}

impl Route {
    pub(crate) fn report(&self, outcome: Outcome) {
        let _ = self.driver.send(Input::Report { position: self.position, attempt: self.attempt, outcome });
    }

    pub(crate) fn progress(&self, progress: Progress) {
        let _ = self.driver.send(Input::Progress { position: self.position, attempt: self.attempt, progress });
    }

    fn is(&self, other: &Route) -> bool {
        self.position == other.position && self.attempt == other.attempt && self.driver.same_channel(&other.driver)
    }
}

/// What a driver is told.
#[derive(Debug)]
pub(crate) enum Input {
    /// A worker reported on an attempt (or lost it).
    Report { position: usize, attempt: u32, outcome: Outcome },
    /// A worker reported how a running attempt goes: its use so far, a model call.
    Progress { position: usize, attempt: u32, progress: Progress },
    /// The roster answered who executes an attempt.
    Executor { position: usize, attempt: u32, found: Found },
    /// What an agent's assignments tell it, fetched from the roster, with
    /// the version of the memory it carries.
    Context { agent_id: String, context: std::result::Result<Arc<AgentContext>, String>, memory_version: i64 },
    /// An agent's memory checked for an attempt it is to be assigned: as it
    /// is now when it changed since its context was read (`None`: it did not).
    Memory {
        agent_id: String,
        position: usize,
        attempt: u32,
        fresh: Option<(i64, Vec<crate::domain::memory::MemoryEntry>)>,
    },
    /// What the executor of an attempt used in its budget's period.
    AgentUsage { position: usize, attempt: u32, budget: Budget, usage: crate::domain::budget::Usage },
    /// A worker has room for an attempt that waited for one.
    WorkerReady { position: usize, attempt: u32, slot: Slot },
    /// A request from a caller.
    Control(Control),
}

/// The roster's answer for a delegated step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// The roster chose an agent (a delegate, or a senior it escalated to).
    Chosen { agent_id: String, escalated: bool, detail: String },
    /// The step waits in a busy expert's queue; the roster answers again
    /// when the expert takes it or the wait goes stale.
    Queued { expert_id: String, wait_seconds: u64, detail: String },
    /// Nobody can take it.
    Failed { code: String, message: String },
}

/// A request to an execution's driver.
#[derive(Debug)]
pub(crate) enum Control {
    /// End the execution as cancelled, with the reason.
    Cancel(String),
    /// Decide a human approval step.
    Decide {
        step_id: String,
        approved: bool,
        by: String,
        comment: String,
        /// The permission matrix version that authorised it (0: none applied).
        matrix_version: u32,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A worker hands its step onward.
    HandOff { request: HandOff, reply: oneshot::Sender<HandOffAnswer> },
    /// A monitor's, the lead's or an operator's intervention.
    Intervene { intervention: Intervention, reply: oneshot::Sender<Result<()>> },
    /// The lead assigns a role in the session.
    AssignRole { assignment: RoleAssignment, matrix_version: u32, reply: oneshot::Sender<Result<()>> },
    /// A participant asks the lead for a subtask.
    RequestSubtask { request: Box<SubtaskRequest>, reply: oneshot::Sender<Result<()>> },
    /// The lead's decision on a pending subtask request (`decided` is the
    /// request as decided); an approval comes with the assignment it makes.
    DecideSubtask {
        decided: Box<SubtaskRequest>,
        assignment: Option<Box<RoleAssignment>>,
        matrix_version: u32,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A new lead.
    SetLead { agent_id: String, by: String, reply: oneshot::Sender<Result<()>> },
}

/// What a caller asks to start.
pub(crate) struct StartRequest {
    pub(crate) process: Arc<ProcessVersion>,
    pub(crate) inputs_json: String,
    pub(crate) lead_agent_id: String,
    pub(crate) idempotency_key: Option<String>,
    /// Set to run the execution as a team session.
    pub(crate) session: Option<Session>,
    /// The inbox messages the run takes (see [`inbox`]).
    pub(crate) claimed_messages: Vec<String>,
    /// The due time the run fires its process's schedule for, and the next
    /// one (see [`schedule`]).
    pub(crate) fired_schedule: Option<(i64, i64)>,
}

/// The step type that waits for a decision instead of a worker.
pub(crate) const HUMAN_APPROVAL: &str = "human_approval";
/// The step type the engine runs by invoking a tool.
pub(crate) const TOOL_CALL: &str = "tool_call";

/// Most published versions kept parsed in memory.
const PROCESSES_KEPT: usize = 256;

/// Shared by the gRPC handlers and the drivers.
pub(crate) struct Engine {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) roster: Arc<dyn Roster>,
    pub(crate) workers: Arc<Workers>,
    /// Every recorded event, as it is committed, for watchers.
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    /// Woken when events enter the log, for the notifier's publisher.
    pub(crate) log_wake: Arc<Notify>,
    pub(crate) settings: Settings,
    /// The background work; closed and awaited on shutdown.
    pub(crate) tasks: TaskTracker,
    /// Cancelled when the service stops.
    pub(crate) stopping: CancellationToken,
    /// This replica's name among the replicas on the store.
    pub(crate) replica: String,
    /// Whether it joined them (and leaves them when it stops).
    joined: std::sync::atomic::AtomicBool,
    /// Cancelled when this replica lost its lease: the service must stop.
    pub(crate) deposed: CancellationToken,
    drivers: Mutex<HashMap<String, mpsc::UnboundedSender<Input>>>,
    /// The permission matrix in force.
    matrix: RwLock<Arc<Matrix>>,
    /// Published versions, which never change, by name and version.
    processes: Mutex<HashMap<(String, u32), Arc<ProcessVersion>>>,
    /// Held while an inbox's run is decided on and started, so that one
    /// inbox never has two runs.
    inbox_gate: tokio::sync::Mutex<()>,
    /// Held while a run of a process with a budget or a throttle is checked
    /// and started.
    admission_gate: tokio::sync::Mutex<()>,
    /// Inboxes whose throttled run is due to start later.
    delayed_triggers: Mutex<HashSet<String>>,
    /// Agents' budgets by agent id, as last read from the store.
    agent_budgets: RwLock<Arc<HashMap<String, Budget>>>,
    /// Agents' contexts and roles' memories, for every execution.
    pub(crate) contexts: contexts::Contexts,
}

/// Held from a run's admission until it is created: see [`Engine::admit`].
pub(crate) struct Admitted<'a> {
    _local: tokio::sync::MutexGuard<'a, ()>,
    _shared: Option<crate::store::AdmissionLock>,
}

impl Engine {
    pub(crate) fn new(store: Arc<dyn Store>, roster: Arc<dyn Roster>, settings: Settings) -> Arc<Self> {
        let (events, _) = broadcast::channel(16_384);
        let replica = replica_name(&settings.replica_identity);
        Arc::new(Self {
            store,
            roster,
            workers: Arc::new(Workers::default()),
            events,
            log_wake: Arc::new(Notify::new()),
            settings,
            tasks: TaskTracker::new(),
            stopping: CancellationToken::new(),
            replica,
            joined: std::sync::atomic::AtomicBool::new(false),
            deposed: CancellationToken::new(),
            drivers: Mutex::new(HashMap::new()),
            matrix: RwLock::new(Arc::new(default_matrix())),
            processes: Mutex::new(HashMap::new()),
            inbox_gate: tokio::sync::Mutex::new(()),
            admission_gate: tokio::sync::Mutex::new(()),
            delayed_triggers: Mutex::new(HashSet::new()),
            agent_budgets: RwLock::new(Arc::new(HashMap::new())),
            contexts: contexts::Contexts::default(),
        })
    }

    /// Stops the background work: drivers stop between turns, and the call
    /// returns when every task has ended. Then the replica gives its
    /// unfinished executions back, for another replica (or the next start)
    /// to take over at once.
    pub(crate) async fn shutdown(&self) {
        self.stopping.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        if self.joined.load(std::sync::atomic::Ordering::Acquire)
            && !self.deposed.is_cancelled()
            && let Err(error) = self.store.leave().await
        {
            tracing::warn!(%error, "could not give this replica's executions back; they are taken over when its lease lapses");
        }
    }

    /// Joins the replicas on the store, with this replica's lease; the
    /// others reach it at `url` (empty: they cannot).
    /// Joins the replicas, reached by the others at `url` (connecting to
    /// `address`, when the URL's host names a Service rather than this replica).
    pub(crate) async fn join(&self, url: &str, address: &str) -> Result<()> {
        let me = Replica { id: self.replica.clone(), url: url.to_owned(), address: address.to_owned() };
        self.store.join(&me, self.settings.ownership_lease).await?;
        self.joined.store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(replica = %self.replica, lease_ms = self.settings.ownership_lease.as_millis() as u64, "joined the execution service's replicas");
        Ok(())
    }

    /// Renews this replica's lease every third of it, until the engine
    /// stops. When the lease is lost (it lapsed: another replica may drive
    /// the executions now), or cannot be renewed before it lapses, cancels
    /// [`Engine::deposed`]. Nothing else waits in this loop: a long takeover
    /// ([`Engine::adopt_orphans`]) never makes a renewal late.
    pub(crate) async fn keep_lease(self: Arc<Self>) {
        let lease = self.settings.ownership_lease;
        let mut tick = tokio::time::interval(lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Measured from before each renewal asks, so never later than the
        // database's own expiry.
        let mut held_until = tokio::time::Instant::now() + lease;
        loop {
            tick.tick().await;
            let asked = tokio::time::Instant::now();
            match self.store.renew(lease).await {
                Ok(true) => held_until = asked + lease,
                Ok(false) => return self.depose("its lease lapsed"),
                Err(error) if tokio::time::Instant::now() >= held_until => {
                    return self.depose(&format!("it could not renew its lease in time: {error}"));
                }
                Err(error) => tracing::warn!(%error, "renewing this replica's lease failed; retrying"),
            }
        }
    }

    /// Takes over the executions no replica drives, every third of the
    /// lease, until the engine stops.
    pub(crate) async fn adopt_orphans(self: Arc<Self>) {
        let period = self.settings.ownership_lease / 3;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.adopt().await {
                Ok(0) => {}
                Ok(adopted) => tracing::info!(adopted, "took over executions no replica drove"),
                Err(error) => tracing::warn!(%error, "taking over executions no replica drives failed"),
            }
        }
    }

    fn depose(&self, why: &str) {
        tracing::error!(replica = %self.replica, "this replica no longer drives its executions ({why}); stopping");
        self.deposed.cancel();
    }

    /// Spawns background work that stops with the engine.
    pub(crate) fn spawn<F>(&self, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let stopping = self.stopping.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = stopping.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// The permission matrix in force.
    pub(crate) fn matrix(&self) -> Arc<Matrix> {
        self.matrix.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the matrix in force from the store, storing the default as
    /// version 1 on first start; a newer version stored elsewhere (another
    /// replica) is picked up the same way.
    pub(crate) async fn load_matrix(&self) -> Result<()> {
        let matrix = match self.store.latest_matrix().await? {
            Some(matrix) => matrix,
            None => self.store.first_matrix(default_matrix()).await?,
        };
        self.set_matrix(matrix);
        Ok(())
    }

    /// Reads the agents' budgets (set here or on another replica).
    pub(crate) async fn load_agent_budgets(&self) -> Result<()> {
        let budgets: HashMap<String, Budget> = self
            .store
            .agent_budgets()
            .await?
            .into_iter()
            .filter_map(|budget| Some((budget.agent_id()?.to_owned(), budget)))
            .collect();
        *self.agent_budgets.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(budgets);
        Ok(())
    }

    /// An agent's budget, if it has one with a limit per period.
    pub(crate) fn agent_budget(&self, agent_id: &str) -> Option<Budget> {
        let budgets = self.agent_budgets.read().unwrap_or_else(PoisonError::into_inner);
        budgets.get(agent_id).filter(|budget| budget.has_period_limit()).cloned()
    }

    /// Puts a matrix in force, unless a newer one already is.
    pub(crate) fn set_matrix(&self, matrix: Matrix) {
        let mut current = self.matrix.write().unwrap_or_else(PoisonError::into_inner);
        if matrix.version >= current.version {
            if matrix.version > current.version {
                tracing::info!(version = matrix.version, "permission matrix in force");
            }
            *current = Arc::new(matrix);
        }
    }

    /// Checks a process (with the roster's agents and roles as context) and
    /// stores it as a new version, unless its latest version has the same
    /// source; returns the version and whether it is new.
    pub(crate) async fn publish(&self, source: String) -> Result<(Arc<ProcessVersion>, bool)> {
        let context = self.roster.validation_context().await.map_err(|failure| match failure {
            RosterFailure::Unavailable(detail) => Error::Unavailable { service: "roster", detail },
            other => Error::precondition("ROSTER_REFUSED", "roster", format!("the roster: {}", other.message())),
        })?;
        self.publish_checked(source, context).await
    }

    /// [`Engine::publish`], checking references against `context` (an empty
    /// one checks none).
    pub(crate) async fn publish_checked(
        &self,
        source: String,
        context: muster_format::Context,
    ) -> Result<(Arc<ProcessVersion>, bool)> {
        let checked_source = source.clone();
        let report = tokio::task::spawn_blocking(move || muster_format::validate_process(&checked_source, &context))
            .await
            .map_err(|error| Error::Storage(format!("validation stopped: {error}")))?;
        let findings: Vec<Finding> = report.diagnostics.iter().map(Finding::from).collect();
        let Some(definition) = report.process else {
            return Err(Error::InvalidProcess(findings));
        };
        let published = self
            .store
            .publish_process(NewProcess {
                name: definition.name.clone(),
                content_hash: hex::encode(sha2::Sha256::digest(source.as_bytes())),
                source,
                published_at: muster_runtime::time::now_millis(),
                warnings: Warnings::keep(findings),
                definition: Arc::new(definition),
            })
            .await?;
        let (version, new) = match published {
            Published::New(version) => (version, true),
            Published::Unchanged(version) => (version, false),
        };
        Ok((self.remember(version), new))
    }

    fn remember(&self, version: ProcessVersion) -> Arc<ProcessVersion> {
        let version = Arc::new(version);
        let mut processes = self.processes.lock().unwrap_or_else(PoisonError::into_inner);
        if processes.len() >= PROCESSES_KEPT {
            processes.clear();
        }
        processes.insert((version.name.clone(), version.version), version.clone());
        version
    }

    /// What an agent of `role` (empty: none) remembers: the global memory's
    /// newest entries, then the role's, within an assignment's room, with
    /// the version of the memories they are no newer than (read first). A
    /// store that fails is asked again until it answers.
    pub(crate) async fn recall(&self, role: &str) -> (i64, Vec<crate::domain::memory::MemoryEntry>) {
        use crate::domain::memory::{ASSIGNMENT_ENTRIES, within_assignment};
        loop {
            let read = async {
                let version = self.store.memory_version(role).await?;
                let global = self.store.memory("", None, ASSIGNMENT_ENTRIES).await?;
                let own = if role.is_empty() {
                    Vec::new()
                } else {
                    self.store.memory(role, None, ASSIGNMENT_ENTRIES).await?
                };
                Ok::<_, Error>((version, within_assignment([global, own])))
            };
            match read.await {
                Ok(memory) => return memory,
                Err(error) => {
                    tracing::warn!(%error, "reading the memory for an assignment failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// What an agent of `role` remembers, read again only if the memories'
    /// version moved from `known`: `None` when it did not.
    pub(crate) async fn recall_if_changed(
        &self,
        role: &str,
        known: i64,
    ) -> Option<(i64, Vec<crate::domain::memory::MemoryEntry>)> {
        match self.store.memory_version(role).await {
            Ok(version) if version == known => None,
            _ => Some(self.recall(role).await),
        }
    }

    /// A published version (`None`: the latest), from memory once read.
    pub(crate) async fn process(&self, name: &str, version: Option<u32>) -> Result<Option<Arc<ProcessVersion>>> {
        if let Some(version) = version
            && let Some(found) =
                self.processes.lock().unwrap_or_else(PoisonError::into_inner).get(&(name.to_owned(), version))
        {
            return Ok(Some(found.clone()));
        }
        Ok(self.store.process(name, version).await?.map(|version| self.remember(version)))
    }

    /// The definition an execution runs.
    pub(crate) async fn definition_of(&self, execution: &Execution) -> Result<Arc<ProcessVersion>> {
        self.process(&execution.process_name, Some(execution.process_version)).await?.ok_or_else(|| {
            Error::Storage(format!(
                "version {} of process '{}' is missing",
                execution.process_version, execution.process_name
            ))
        })
    }

    /// Creates an execution and starts driving it; with an idempotency key
    /// already used, returns that execution instead.
    pub(crate) async fn start(self: &Arc<Self>, request: StartRequest) -> Result<Execution> {
        if let Some(key) = &request.idempotency_key
            && let Some(existing) = self.store.find_by_idempotency_key(key).await?
        {
            return self.store.execution(&existing).await?.ok_or_else(|| {
                Error::not_found(
                    "muster.execution.v1.Execution",
                    existing.to_string(),
                    format!("execution {existing} vanished"),
                )
            });
        }
        // A tool step runs under an agent's identity: the one it names, the
        // roster's choice, or the execution's lead.
        if request.lead_agent_id.is_empty()
            && let Some(step) = request
                .process
                .definition
                .steps
                .iter()
                .find(|step| step.step_type == TOOL_CALL && step.executor().is_none() && step.delegate.is_none())
        {
            return Err(Error::precondition(
                "TOOL_STEP_WITHOUT_AGENT",
                format!("step/{}", step.id),
                format!(
                    "tool_call step '{}' runs under an agent's identity: name it with 'agent' or 'roles.executor', \
                 ask the roster with 'delegate', or give the execution a lead",
                    step.id
                ),
            ));
        }
        let (_admitted, budget) = self.admit(&request.process).await?;
        let now = muster_runtime::time::now_millis();
        let trace_parent = muster_runtime::telemetry::traceparent(&tracing::Span::current());
        let mut execution = Execution {
            id: uuid::Uuid::now_v7().to_string(),
            process_name: request.process.name.clone(),
            process_version: request.process.version,
            status: ExecutionStatus::Running,
            reason: String::new(),
            lead_agent_id: request.lead_agent_id,
            inputs_json: request.inputs_json,
            idempotency_key: request.idempotency_key,
            started_at: now,
            ended_at: None,
            last_sequence: 0,
            // The execution joins the trace of the call that starts it.
            trace_parent: trace_parent.clone(),
            session: request.session,
        };
        let mut events = vec![Event::new(&mut execution, EventKind::ExecutionStarted, now, trace_parent.clone())];
        if let Some(session) = execution.session.clone() {
            // The task context goes to every participant.
            let mut started = Event::new(&mut execution, EventKind::SessionStarted, now, trace_parent);
            started.participants = session.assignments.keys().cloned().collect();
            started.detail =
                crate::domain::session::context_window(&execution.id, &session, &execution.lead_agent_id, &[]);
            started.matrix_version = self.matrix().version;
            events.push(started);
        }
        let definition = &request.process.definition;
        let steps: Vec<Step> = definition.steps.iter().map(|_| Step::new()).collect();
        let step_writes = steps
            .iter()
            .zip(&definition.steps)
            .enumerate()
            .map(|(position, (step, step_definition))| StepWrite {
                execution_id: execution.id.clone(),
                position: position as u32,
                step_id: step_definition.id.clone(),
                step: step.clone(),
            })
            .collect();
        let mut writes =
            vec![Write::CreateExecution(execution.clone()), Write::Steps(step_writes), Write::Events(events.clone())];
        if let Some((due, next)) = request.fired_schedule {
            writes.push(Write::FireSchedule {
                process_name: execution.process_name.clone(),
                due,
                next,
                execution_id: execution.id.clone(),
                fired_at: now,
            });
        }
        if !request.claimed_messages.is_empty() {
            writes.push(Write::ClaimMessages {
                execution_id: execution.id.clone(),
                message_ids: request.claimed_messages,
            });
        }
        self.store.commit(writes).await?;
        self.announce(events);
        tracing::info!(execution_id = %execution.id, process = %execution.process_name, version = execution.process_version, "execution started");
        self.spawn_driver(execution.clone(), steps, request.process, Some(budget));
        Ok(execution)
    }

    /// Checks that a run of `process` may start now, under its budget, its
    /// throttle and the budgets of the agents it names; the budget in
    /// force, for the run's driver. Runs under a limit per period or a
    /// throttle start one at a time, each after the check (the guard
    /// answered is held until it is created), in this replica and, on
    /// PostgreSQL, across replicas, so that concurrent starts cannot
    /// overrun them. An agent's budget is locked as a process's is, by its
    /// key (`agent:ID`, which no process name can be).
    async fn admit(&self, process: &ProcessVersion) -> Result<(Option<Admitted<'_>>, Option<Budget>)> {
        // The agents the process names as executors, in order: every
        // replica locks them in that order, then the process.
        let mut named: Vec<&str> = process.definition.steps.iter().filter_map(|step| step.executor()).collect();
        named.sort_unstable();
        named.dedup();
        let agent_budgets: Vec<Budget> = named.into_iter().filter_map(|agent_id| self.agent_budget(agent_id)).collect();
        let budget = self.budget_of(process).await?;
        let period_limited = budget.as_ref().filter(|budget| budget.has_period_limit());
        let throttle = process
            .definition
            .throttle
            .filter(|throttle| throttle.min_interval_seconds > 0 || throttle.max_concurrent > 0);
        if agent_budgets.is_empty() && period_limited.is_none() && throttle.is_none() {
            return Ok((None, budget));
        }
        // One start at a time in this replica, then across replicas (the
        // local gate first: a replica holds at most one start's database
        // connections waiting for the shared locks).
        let local = self.admission_gate.lock().await;
        let keys: Vec<&str> = agent_budgets
            .iter()
            .map(|agent_budget| agent_budget.process_name.as_str())
            .chain((period_limited.is_some() || throttle.is_some()).then_some(process.name.as_str()))
            .collect();
        let admitted = Admitted { _local: local, _shared: self.store.admission_lock(&keys).await? };
        let now = muster_runtime::time::now_millis();
        for agent_budget in &agent_budgets {
            let agent_id = agent_budget.agent_id().unwrap_or_default();
            let usage = self.store.agent_usage(agent_id, agent_budget.period_start(now)).await?;
            if let Some(exhausted) = agent_budget.exhausted(&usage) {
                return Err(Error::BudgetExhausted {
                    key: agent_budget.process_name.clone(),
                    description: format!("{} ({} budget)", exhausted.description, agent_budget.source.as_str()),
                });
            }
        }
        if let Some(budget) = period_limited {
            let usage = self.store.process_usage(&budget.process_name, budget.period_start(now), "").await?;
            if let Some(exhausted) = budget.exhausted(&usage) {
                return Err(Error::BudgetExhausted {
                    key: budget.process_name.clone(),
                    description: format!("{} ({} budget)", exhausted.description, budget.source.as_str()),
                });
            }
        }
        if let Some(throttle) = throttle {
            let activity = self.store.process_activity(&process.name).await?;
            let throttled = |description: String, retry_after| Error::Throttled {
                process: process.name.clone(),
                description,
                retry_after,
            };
            if throttle.max_concurrent > 0 && activity.underway >= u64::from(throttle.max_concurrent) {
                let runs = if throttle.max_concurrent == 1 { "run" } else { "runs" };
                return Err(throttled(
                    format!(
                        "it allows {} {runs} at a time; {} of {} runs underway",
                        throttle.max_concurrent, activity.underway, throttle.max_concurrent
                    ),
                    None,
                ));
            }
            let interval = i64::try_from(throttle.min_interval_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
            if let Some(last) = activity.last_started_at
                && now < last.saturating_add(interval)
            {
                let wait = last.saturating_add(interval) - now;
                return Err(throttled(
                    format!(
                        "it starts runs at least {} s apart; the next may start in {} s",
                        throttle.min_interval_seconds,
                        (wait as u64).div_ceil(1000)
                    ),
                    Some(Duration::from_millis(wait as u64)),
                ));
            }
        }
        Ok((Some(admitted), budget))
    }

    /// The budget in force for a process: the one an operator set, else the
    /// one it declares.
    pub(crate) async fn budget_of(&self, process: &ProcessVersion) -> Result<Option<Budget>> {
        if let Some(budget) = self.store.budget(&process.name).await? {
            return Ok(Some(budget));
        }
        Ok(process.definition.budget.as_ref().map(|declared| Budget::from((process.name.as_str(), declared))))
    }

    /// Takes over and resumes the unfinished executions that no replica
    /// drives (given back by a replica that stopped, or of one whose lease
    /// lapsed); how many.
    pub(crate) async fn adopt(self: &Arc<Self>) -> Result<usize> {
        let ids = self.store.adopt().await?;
        let mut resumed = 0;
        for id in &ids {
            if self.drives(id) {
                continue;
            }
            let Some(mut execution) = self.store.execution(id).await? else { continue };
            execution.last_sequence = self.store.last_event_sequence(id).await?;
            let process = match self.definition_of(&execution).await {
                Ok(process) => process,
                Err(error) => {
                    tracing::error!(execution_id = %id, %error, "the process version of an unfinished execution cannot be read");
                    continue;
                }
            };
            let steps: Vec<Step> = self.store.steps(id).await?.into_iter().map(|(_, step)| step).collect();
            if steps.len() != process.definition.steps.len() {
                tracing::error!(execution_id = %id, "the stored steps do not match the process version; not resumed");
                continue;
            }
            tracing::info!(execution_id = %id, "resuming execution");
            self.spawn_driver(execution, steps, process, None);
            resumed += 1;
        }
        Ok(resumed)
    }

    /// How many executions this engine drives now.
    pub(crate) fn running(&self) -> usize {
        self.drivers.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether this replica drives the execution now.
    pub(crate) fn drives(&self, execution_id: &str) -> bool {
        self.drivers.lock().unwrap_or_else(PoisonError::into_inner).contains_key(execution_id)
    }

    /// Hands a request to the driver of a running execution; false when none runs it.
    pub(crate) fn control(&self, execution_id: &str, control: Control) -> bool {
        let drivers = self.drivers.lock().unwrap_or_else(PoisonError::into_inner);
        drivers.get(execution_id).is_some_and(|driver| driver.send(Input::Control(control)).is_ok())
    }

    /// Tells watchers and the notifier's publisher about committed events.
    pub(crate) fn announce(&self, events: Vec<Event>) {
        self.log_wake.notify_one();
        for event in events {
            let outcome = match event.kind {
                EventKind::StepStarted => Some("started"),
                EventKind::StepCompleted => Some("completed"),
                EventKind::StepFailed => Some("failed"),
                EventKind::StepQueued => Some("queued"),
                _ => None,
            };
            if let Some(outcome) = outcome {
                muster_runtime::metrics::count(
                    "muster_steps_total",
                    "Steps started, completed, failed and queued",
                    &[("outcome", outcome)],
                    1,
                );
            }
            let _ = self.events.send(Arc::new(event));
        }
    }

    /// Drives an execution in a task of its own; `budget` is the budget in
    /// force when it is known already (`None`: the driver reads it).
    fn spawn_driver(
        self: &Arc<Self>,
        execution: Execution,
        steps: Vec<Step>,
        process: Arc<ProcessVersion>,
        budget: Option<Option<Budget>>,
    ) {
        let (sender, inputs) = mpsc::unbounded_channel();
        self.drivers.lock().unwrap_or_else(PoisonError::into_inner).insert(execution.id.clone(), sender.clone());
        let engine = self.clone();
        // The driver's span, and through it every step's, continues the
        // execution's trace, also when a restarted service resumes it.
        let span = tracing::info_span!(
            parent: None,
            "execution",
            execution_id = %execution.id,
            process = %execution.process_name,
            version = execution.process_version,
        );
        muster_runtime::telemetry::continue_from(&span, &execution.trace_parent);
        let stopping = self.stopping.clone();
        self.tasks.spawn(
            async move {
                let execution_id = execution.id.clone();
                let mut driver = driver::Driver::new(engine.clone(), execution, steps, process, sender, inputs);
                driver.budget = budget;
                match driver.run(stopping).await {
                    Ok(()) => {}
                    Err(error) => {
                        tracing::error!(%execution_id, %error, "execution driver stopped; it resumes when the service restarts");
                    }
                }
                engine.drivers.lock().unwrap_or_else(PoisonError::into_inner).remove(&execution_id);
            }
            .instrument(span),
        );
    }
}

/// A name for this replica: the host's (a pod's name on Kubernetes) and a
/// random suffix, so that a restarted process is a new replica.
/// This incarnation's name among the replicas: `IDENTITY@SUFFIX` for a
/// stable identity (the store knows the previous incarnations by it),
/// else `HOST-SUFFIX`.
fn replica_name(identity: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    if !identity.is_empty() {
        return format!("{identity}{}{}", crate::store::INCARNATION, &suffix[..8]);
    }
    let host = std::env::var("HOSTNAME").ok().filter(|host| !host.is_empty()).unwrap_or_else(|| "execution".to_owned());
    format!("{host}-{}", &suffix[..8])
}

/// The built-in matrix, version 1.
fn default_matrix() -> Matrix {
    Matrix::parse(1, DEFAULT_MATRIX.to_owned(), muster_runtime::time::now_millis(), "muster".to_owned())
        .map(|(matrix, _)| matrix)
        .expect("the built-in permission matrix is valid")
}
