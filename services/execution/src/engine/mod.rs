//! The engine: starts executions, drives each one as a DAG in a task of its
//! own (the only writer of that execution's state), and resumes unfinished
//! executions after a restart.

mod assignment;
mod delegation;
mod driver;
mod intervention;
mod session;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use muster_format::ProcessDefinition;
use muster_proto::{
    common::v1::{EventType, StepEvent},
    execution::v1::{DelegateStep, DelegationOutcome},
};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tracing::Instrument as _;

use crate::{
    Error, Result,
    clients::RosterClient,
    domain::{
        ExecutionStatus,
        authority::{DEFAULT_MATRIX, Matrix, RoleAssignment, Session},
    },
    store::{ExecutionRow, ProcessRow, StepRow, Store},
    workers::Workers,
};

pub(crate) use driver::{approvers, new_event, step_roles};
pub(crate) use intervention::{Intervention, InterventionAction};
pub(crate) use session::step_views;

/// Shared by the gRPC handlers and the execution drivers.
pub(crate) struct Engine {
    pub(crate) store: Store,
    pub(crate) workers: Arc<Workers>,
    pub(crate) roster: RosterClient,
    /// Every recorded event, for `WatchExecution`.
    pub(crate) events: broadcast::Sender<StepEvent>,
    /// Woken whenever events enter the outbox.
    pub(crate) outbox_wake: Arc<Notify>,
    pub(crate) default_max_parallel: usize,
    /// How long a worker may stay silent.
    pub(crate) worker_lease: std::time::Duration,
    controls: Mutex<HashMap<String, mpsc::UnboundedSender<Control>>>,
    /// The permission matrix in force.
    matrix: std::sync::RwLock<Arc<Matrix>>,
    /// Parsed definitions of published process versions, which never change.
    definitions: Mutex<HashMap<(String, u32), Arc<ProcessDefinition>>>,
}

/// Most parsed process definitions kept at once.
const DEFINITIONS_KEPT: usize = 256;

/// A request to an execution's driver.
pub(crate) enum Control {
    /// End the execution as cancelled, with the reason.
    Cancel(String),
    /// Decide a human approval step; the reply says whether the step was waiting.
    Decide {
        step_id: String,
        approved: bool,
        by: String,
        comment: String,
        /// The permission matrix version that authorised it (0: none applied).
        matrix_version: u32,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A worker hands its step onward; the reply goes back on its stream.
    DelegateOnward { request: DelegateStep, reply: oneshot::Sender<DelegationOutcome> },
    /// A monitor's or the lead's intervention.
    Intervene { intervention: Intervention, reply: oneshot::Sender<Result<()>> },
    /// The lead assigns a role in the session; the reply is the matrix version checked against.
    AssignRole { assignment: RoleAssignment, matrix_version: u32, reply: oneshot::Sender<Result<()>> },
    /// A new lead.
    SetLead { agent_id: String, by: String, reply: oneshot::Sender<Result<()>> },
}

/// What a caller asks to start.
pub(crate) struct StartRequest {
    pub(crate) process: ProcessRow,
    pub(crate) definition: Arc<ProcessDefinition>,
    pub(crate) inputs_json: String,
    pub(crate) lead_agent_id: String,
    pub(crate) idempotency_key: Option<String>,
    /// Set to run the execution as a team session.
    pub(crate) session: Option<Session>,
}

impl Engine {
    pub(crate) fn new(
        store: Store,
        roster: RosterClient,
        default_max_parallel: usize,
        worker_lease: std::time::Duration,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(4096);
        Arc::new(Self {
            store,
            workers: Arc::new(Workers::default()),
            roster,
            events,
            outbox_wake: Arc::new(Notify::new()),
            default_max_parallel,
            worker_lease,
            controls: Mutex::new(HashMap::new()),
            matrix: std::sync::RwLock::new(Arc::new(default_matrix())),
            definitions: Mutex::new(HashMap::new()),
        })
    }

    /// The permission matrix in force.
    pub(crate) fn matrix(&self) -> Arc<Matrix> {
        self.matrix.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Reads the matrix in force from the store, storing the default as
    /// version 1 on first start; a newer version stored elsewhere (another
    /// replica) is picked up the same way.
    pub(crate) async fn load_matrix(&self) -> Result<()> {
        let matrix = match self.store.latest_matrix().await? {
            Some(matrix) => matrix,
            None => self.store.put_matrix(default_matrix()).await?,
        };
        self.set_matrix(matrix);
        Ok(())
    }

    /// The definition of a stored process version, parsed once.
    pub(crate) fn parsed(&self, process: &ProcessRow) -> Result<Arc<ProcessDefinition>> {
        let key = (process.name.clone(), process.version);
        if let Some(definition) = self.definitions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return Ok(definition.clone());
        }
        let definition = Arc::new(parse_definition(&process.source)?);
        let mut definitions = self.definitions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if definitions.len() >= DEFINITIONS_KEPT {
            definitions.clear();
        }
        definitions.insert(key, definition.clone());
        Ok(definition)
    }

    /// The definition of process `name` at `version`, parsed once.
    pub(crate) async fn definition(&self, name: &str, version: u32) -> Result<Arc<ProcessDefinition>> {
        let key = (name.to_owned(), version);
        if let Some(definition) = self.definitions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return Ok(definition.clone());
        }
        let process = self
            .store
            .get_process(name, Some(version))
            .await?
            .ok_or_else(|| Error::Storage(format!("version {version} of process '{name}' is missing")))?;
        self.parsed(&process)
    }

    /// Puts a matrix in force, unless a newer one already is.
    pub(crate) fn set_matrix(&self, matrix: Matrix) {
        let mut current = self.matrix.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if matrix.version >= current.version {
            if matrix.version > current.version {
                tracing::info!(version = matrix.version, "permission matrix in force");
            }
            *current = Arc::new(matrix);
        }
    }

    /// Creates an execution and starts driving it.
    pub(crate) async fn start(self: &Arc<Self>, request: StartRequest) -> Result<ExecutionRow> {
        if let Some(key) = &request.idempotency_key
            && let Some(existing) = self.store.find_by_idempotency_key(key).await?
        {
            return self
                .store
                .get_execution(&existing)
                .await?
                .ok_or_else(|| Error::NotFound(format!("execution {existing} vanished")));
        }
        let now = muster_runtime::time::now_millis();
        let mut execution = ExecutionRow {
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
            trace_parent: muster_runtime::telemetry::traceparent(&tracing::Span::current()),
            session: request.session,
            steps: request
                .definition
                .steps
                .iter()
                .enumerate()
                .map(|(position, step)| StepRow::new(step.id.clone(), position as u32))
                .collect(),
        };
        let mut events = vec![new_event(&mut execution, EventType::ExecutionStarted)];
        if let Some(session) = execution.session.clone() {
            // The task context goes to every participant.
            let mut started = new_event(&mut execution, EventType::SessionStarted);
            started.participants = session.assignments.keys().cloned().collect();
            started.detail =
                crate::domain::session::context_window(&execution.id, &session, &execution.lead_agent_id, &[]);
            started.matrix_version = self.matrix().version;
            events.push(started);
        }
        self.store.create_execution(&execution, &events).await?;
        self.announce(events);
        tracing::info!(execution_id = %execution.id, process = %execution.process_name, version = execution.process_version, "execution started");
        self.spawn_driver(execution.clone(), request.definition);
        Ok(execution)
    }

    /// Resumes every execution that had not ended when the service stopped.
    pub(crate) async fn resume_unfinished(self: &Arc<Self>) -> Result<usize> {
        let ids = self.store.unfinished_executions().await?;
        for id in &ids {
            let Some(mut execution) = self.store.get_execution(id).await? else { continue };
            execution.last_sequence = self.store.last_event_sequence(id).await?;
            let definition = match self.definition(&execution.process_name, execution.process_version).await {
                Ok(definition) => definition,
                Err(error) => {
                    tracing::error!(execution_id = %id, %error, "the process version of an unfinished execution cannot be read");
                    continue;
                }
            };
            tracing::info!(execution_id = %id, "resuming execution");
            self.spawn_driver(execution, definition);
        }
        Ok(ids.len())
    }

    /// Hands a request to the driver of a running execution; false when none runs it.
    pub(crate) fn control(&self, execution_id: &str, control: Control) -> bool {
        let controls = self.controls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        controls.get(execution_id).is_some_and(|sender| sender.send(control).is_ok())
    }

    pub(crate) fn announce(&self, events: Vec<StepEvent>) {
        self.outbox_wake.notify_one();
        for event in events {
            let outcome = match EventType::try_from(event.r#type) {
                Ok(EventType::StepStarted) => Some("started"),
                Ok(EventType::StepCompleted) => Some("completed"),
                Ok(EventType::StepFailed) => Some("failed"),
                Ok(EventType::StepQueued) => Some("queued"),
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
            let _ = self.events.send(event);
        }
    }

    fn spawn_driver(self: &Arc<Self>, execution: ExecutionRow, definition: Arc<ProcessDefinition>) {
        let (control_sender, controls) = mpsc::unbounded_channel();
        self.controls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(execution.id.clone(), control_sender);
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
        tokio::spawn(
            async move {
                let execution_id = execution.id.clone();
                if let Err(error) = driver::Driver::new(engine.clone(), execution, definition, controls).run().await {
                    tracing::error!(%execution_id, %error, "execution driver stopped; it resumes when the service restarts");
                }
                engine.controls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&execution_id);
            }
            .instrument(span),
        );
    }
}

/// The built-in matrix, version 1.
fn default_matrix() -> Matrix {
    Matrix::parse(1, DEFAULT_MATRIX.to_owned(), muster_runtime::time::now_millis(), "muster".to_owned())
        .map(|(matrix, _)| matrix)
        .expect("the built-in permission matrix is valid")
}

/// The runnable model of a stored, already validated process source.
pub(crate) fn parse_definition(source: &str) -> Result<ProcessDefinition> {
    let report = muster_format::validate_process(source, &muster_format::Context::default());
    report.process.ok_or_else(|| Error::InvalidProcess(report.diagnostics.iter().map(Into::into).collect()))
}
