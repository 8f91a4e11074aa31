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
mod in_force;
pub(crate) mod inbox;
mod intervention;
mod processes;
mod replicas;
pub(crate) mod roles;
pub(crate) mod schedule;
pub(crate) mod schema;
mod session;
mod start;
#[cfg(test)]
mod tests;
pub(crate) mod workers;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

pub(crate) use driver::step_roles;
use in_force::default_matrix;
pub(crate) use intervention::{Intervention, InterventionAction};
use replicas::replica_name;
pub(crate) use session::{refused_steps, step_views};
use workers::{Slot, Workers};

use crate::{
    Result,
    clients::roster::Roster,
    domain::{
        authority::{Matrix, RoleAssignment, Session, SubtaskRequest},
        budget::Budget,
        model::{AgentContext, Event, EventKind, Execution, HandOff, HandOffAnswer, Outcome, ProcessVersion, Step},
        progress::Progress,
    },
    store::Store,
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
    admission_gate: Arc<tokio::sync::Mutex<()>>,
    /// Inboxes whose throttled run is due to start later.
    delayed_triggers: Mutex<HashSet<String>>,
    /// Agents' budgets by agent id, as last read from the store.
    agent_budgets: RwLock<Arc<HashMap<String, Budget>>>,
    /// Agents' contexts and roles' memories, for every execution.
    pub(crate) contexts: contexts::Contexts,
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
            admission_gate: Arc::default(),
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
                // A driver of a new execution is given the budget its start
                // checked; a resumed one reads it again.
                driver.resumed = budget.is_none();
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
