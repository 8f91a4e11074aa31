//! The Rust agent worker library: connect to the execution service, serve
//! some agents, run each assignment with a [`Behaviour`], and report results.
//! A worker reconnects by itself when the stream breaks; assignments lost
//! with a connection are reassigned by the execution service. An agent whose
//! token the service refuses is left out and the others go on being served.
//! Inputs and upstream outputs too large to travel in an assignment are read
//! (`ReadPayload`) before the behaviour runs, so it always sees them whole.
//! While it runs, a behaviour holds its [`Step`]: to report progress (and
//! the tokens and cost used so far), to hand the step onward and hear the
//! answer, and to call the cluster as the step's agent. A step the service
//! withdraws (cancelled, reassigned, timed out) is stopped at once: its
//! behaviour's future is dropped, aborting whatever call it was making.
//! An assignment's shared memory (up to a hundred earlier outputs) comes
//! to the behaviour as it came on the wire, in [`Step::shared_memory`], and
//! is decoded only as far as the behaviour reads it.

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Context as _;
use muster_client::{
    auth::{AuthChannel, Credentials, with_credentials},
    balance::Balanced,
    tls::{ClientTls, TlsArgs},
};
use muster_proto::{
    execution::v1::{
        Assignment, ConnectWorkerRequest, DelegateStep, DelegationOutcome, MemoryNote, PayloadKind, ReadPayloadRequest,
        ServedAgent, StepFailure, StepProgress, StepResult, ToolCall, ToolCallResult, ToolOutput, ToolSpec,
        WorkerHeartbeat, WorkerHello, connect_worker_request, connect_worker_response,
        execution_service_client::ExecutionServiceClient, framed_client,
    },
    frame::WorkerFrame,
};
use tokio::sync::{mpsc, oneshot};

mod memory;

pub use memory::SharedMemory;

/// JSON values as assignments, results and tool calls carry them
/// (`google.protobuf.Struct` and `Value`), to and from `serde_json`.
pub use muster_client::json;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument as _;

/// An agent the worker serves, with its roster token.
#[derive(Debug, Clone)]
pub struct AgentCredential {
    /// The agent's id.
    pub agent_id: String,
    /// Its bearer token.
    pub token: String,
}

/// TLS for the command's clients, from `MUSTER_TLS_*`.
fn client_tls() -> anyhow::Result<ClientTls> {
    #[derive(clap::Parser)]
    struct FromEnvironment {
        #[command(flatten)]
        tls: TlsArgs,
    }
    let settings = <FromEnvironment as clap::Parser>::try_parse_from(["muster"])?;
    Ok(ClientTls::load(&settings.tls)?)
}

/// A service's address and the credential calls to it carry.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    /// The bearer token.
    pub token: String,
}

impl Endpoint {
    /// An endpoint at `url` calling with `token`.
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Self {
        Self { url: url.into(), token: token.into() }
    }

    /// A channel that connects on first use, balanced over the service's
    /// replicas (several URLs comma-separated, or a name with several
    /// addresses); its calls carry the token.
    pub fn channel(&self) -> anyhow::Result<AuthChannel> {
        Ok(with_credentials(self.replicas()?, Credentials::bearer(&self.token)?))
    }

    /// The connections to the service's replicas, without a credential:
    /// channels made from clones share them (and their name's resolution).
    pub fn replicas(&self) -> anyhow::Result<Balanced> {
        Balanced::connect(&self.url, Some(&client_tls()?)).with_context(|| format!("reaching {}", self.url))
    }
}

/// What a behaviour made of an assignment.
#[derive(Debug, Clone)]
pub enum StepOutcome {
    /// Success, with the output as JSON text, tokens, cost and iterations.
    Completed {
        /// The output as JSON text.
        output_json: String,
        /// Tokens used.
        tokens_used: u64,
        /// Cost in US dollars.
        cost: f64,
        /// Iterations the agent ran (more than the assignment's
        /// `max_iterations` fails the step).
        iterations: u32,
        /// What the agent wants later runs to remember: entries for the
        /// global memory or its role's.
        remember: Vec<MemoryNote>,
        /// No other role needs to run: the output is posted to no inbox.
        skip_triggers: bool,
    },
    /// Hand the step onward: to a named colleague, or (with `to_agent_id`
    /// empty) to whoever the roster chooses for the expertise. If the
    /// execution service refuses (a delegation loop, nobody available), the
    /// worker reports `otherwise` instead, with the refusal added to its
    /// output as `delegation_refused`.
    Delegate {
        /// A named colleague, or empty.
        to_agent_id: String,
        /// Expertise the delegate needs, when no colleague is named.
        required_expertise: Vec<String>,
        /// Why, for the audit trail.
        reason: String,
        /// What to report when the delegation is refused.
        otherwise: Box<StepOutcome>,
    },
    /// The step went to another agent through [`Step::delegate`]: nothing
    /// is left to report.
    HandedOff,
    /// Failure.
    Failed {
        /// A stable code.
        error_code: String,
        /// What went wrong.
        message: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
}

/// What a behaviour holds while it runs one assignment: the way to report
/// progress, to hand the step onward and hear the answer, and the
/// execution service as the step's agent.
#[derive(Clone)]
pub struct Step {
    assignment_id: String,
    shared_memory: SharedMemory,
    agent_token: String,
    sender: mpsc::Sender<ConnectWorkerRequest>,
    execution: ExecutionServiceClient<AuthChannel>,
    delegations: Delegations,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Step").field("assignment_id", &self.assignment_id).finish_non_exhaustive()
    }
}

/// Delegations waiting for the service's answer, by assignment.
type Delegations = Arc<std::sync::Mutex<std::collections::HashMap<String, oneshot::Sender<DelegationOutcome>>>>;

/// How long [`Step::delegate`] waits for the service's answer.
const DELEGATION_WAIT: Duration = Duration::from_secs(30);

impl Step {
    /// The assignment's id.
    pub fn assignment_id(&self) -> &str {
        &self.assignment_id
    }

    /// The assignment's shared memory (`Assignment.shared_memory`, which the
    /// behaviour's [`Assignment`] does not carry): the outputs of the
    /// completed steps this one builds on, decoded as far as they are read.
    pub fn shared_memory(&self) -> &SharedMemory {
        &self.shared_memory
    }

    /// The roster token of the agent the step is for, for calls made as it.
    pub fn agent_token(&self) -> &str {
        &self.agent_token
    }

    /// The execution service, called as the step's agent.
    pub fn execution(&self) -> ExecutionServiceClient<AuthChannel> {
        self.execution.clone()
    }

    /// Reports progress (its `assignment_id` is set to the step's); a report
    /// the service would refuse for its size is dropped with a warning.
    pub async fn progress(&self, mut progress: StepProgress) {
        progress.assignment_id.clone_from(&self.assignment_id);
        let request = ConnectWorkerRequest { message: Some(connect_worker_request::Message::Progress(progress)) };
        let path = "/muster.execution.v1.ExecutionService/ConnectWorker";
        if let Err(refusal) = muster_client::limits::check_request(path, &prost::Message::encode_to_vec(&request)) {
            tracing::warn!(why = %refusal.message(), "progress report too large; not sent");
            return;
        }
        let _ = self.sender.send(request).await;
    }

    /// Hands the step onward and waits for the service's answer. Accepted,
    /// the step is another agent's (the behaviour should return
    /// [`StepOutcome::HandedOff`]); refused, the answer says why and the step
    /// stays this agent's. `Err` when no answer came.
    pub async fn delegate(&self, mut request: DelegateStep) -> Result<DelegationOutcome, String> {
        request.assignment_id.clone_from(&self.assignment_id);
        let (answer, answered) = oneshot::channel();
        self.delegations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(self.assignment_id.clone(), answer);
        let message = ConnectWorkerRequest { message: Some(connect_worker_request::Message::Delegate(request)) };
        if self.sender.send(message).await.is_err() {
            return Err("the worker's connection closed".to_owned());
        }
        match tokio::time::timeout(DELEGATION_WAIT, answered).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err("the worker's connection closed before the delegation was answered".to_owned()),
            Err(_) => {
                self.delegations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.assignment_id);
                Err("the execution service did not answer the delegation in time".to_owned())
            }
        }
    }
}

/// How a worker runs its assignments and the tools it provides.
pub trait Behaviour: Send + Sync + 'static {
    /// Runs one assignment; `step` reports on it while it runs and holds
    /// its shared memory ([`Step::shared_memory`]; the assignment's own
    /// `shared_memory` is not set).
    fn run(&self, assignment: Assignment, step: Step) -> impl Future<Output = StepOutcome> + Send;

    /// The tools this worker provides (none by default).
    fn tools(&self) -> Vec<ToolSpec> {
        Vec::new()
    }

    /// Runs a tool call; the execution service already checked the caller's
    /// permission and the input's schema.
    fn call_tool(&self, call: ToolCall) -> impl Future<Output = ToolOutput> + Send {
        async move {
            ToolOutput { output: None, error: format!("this worker has no tool '{}'", call.tool), status_code: 404 }
        }
    }
}

/// A behaviour's assignments without its tools: for a worker not entitled
/// to provide them.
#[derive(Debug, Clone, Copy, Default)]
pub struct WithoutTools<B>(pub B);

impl<B: Behaviour> Behaviour for WithoutTools<B> {
    fn run(&self, assignment: Assignment, step: Step) -> impl Future<Output = StepOutcome> + Send {
        self.0.run(assignment, step)
    }
}

/// What a worker tells its owner about the agents it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The service welcomed the worker (again): it serves these agents.
    Connected {
        /// The id the service gave this connection.
        worker_id: String,
        /// The agents it serves.
        agents: Vec<String>,
    },
    /// The service refused an agent's credential (rotated, revoked, not the
    /// agent's): the worker goes on serving the others without it.
    AgentRefused {
        /// The agent.
        agent_id: String,
        /// The service's refusal.
        reason: String,
    },
}

/// Serves `agents` until `shutdown` resolves, reconnecting after failures.
///
/// The connection itself is made with `execution.token`: an operator's token
/// (which lets the worker provide any tool), or an agent's; each served agent
/// proves itself with its own token in the hello.
pub async fn serve<B: Behaviour>(
    execution: Endpoint,
    worker_name: String,
    agents: Vec<AgentCredential>,
    behaviour: Arc<B>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let notify = |notice: Notice| {
        if let Notice::AgentRefused { agent_id, reason } = notice {
            tracing::warn!(agent_id = %agent_id, %reason, "agent refused; serving the others");
        }
    };
    serve_reporting(execution, worker_name, agents, behaviour, notify, shutdown).await
}

/// [`serve`], telling `notify` when the worker connects and when an agent's
/// credential is refused.
///
/// One refused agent does not stop the others: the service names the agent
/// whose token it refused, and the worker connects again without it. When
/// the connection's own token is an agent's and the service refuses it, that
/// agent goes and the next one's token carries the connection. When no agent
/// is left, serving ends with an error naming the refused agents, whose
/// source is the last refusal's status. Any other refusal (a tool the worker
/// may not provide, a malformed hello) ends serving at once.
pub async fn serve_reporting<B: Behaviour>(
    mut execution: Endpoint,
    worker_name: String,
    mut agents: Vec<AgentCredential>,
    behaviour: Arc<B>,
    mut notify: impl FnMut(Notice) + Send,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    let serves_agents = !agents.is_empty();
    let mut refused: Vec<String> = Vec::new();
    let mut backoff = Duration::from_millis(100);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            outcome = session(&execution, &worker_name, &agents, &behaviour, &mut notify) => {
                match outcome {
                    Err(error) if is_refusal(&error) => {
                        let Some((agent_id, reason)) = refused_agent(&error, &execution, &agents) else {
                            return Err(error);
                        };
                        tracing::info!(agent_id = %agent_id, %reason, "agent refused; serving the others");
                        let carried_the_connection =
                            agents.iter().any(|agent| agent.agent_id == agent_id && agent.token == execution.token);
                        agents.retain(|agent| agent.agent_id != agent_id);
                        if carried_the_connection && let Some(next) = agents.first() {
                            execution.token = next.token.clone();
                        }
                        notify(Notice::AgentRefused { agent_id: agent_id.clone(), reason });
                        refused.push(agent_id);
                        if serves_agents && agents.is_empty() {
                            // The last refusal stays the error's source, for callers that look at its status.
                            return Err(error.context(format!(
                                "no agent left to serve: the execution service refused the tokens of {}",
                                refused.join(", ")
                            )));
                        }
                        // Another agent's credential may be refused next: no backoff.
                        continue;
                    }
                    Err(error) => tracing::warn!(%error, "worker connection lost; reconnecting"),
                    Ok(()) => tracing::info!("worker stream closed by the server; reconnecting"),
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The assignments a session is running, each stoppable; all are stopped
/// when the session ends (and drops this).
#[derive(Default)]
struct Running(Arc<std::sync::Mutex<std::collections::HashMap<String, tokio::task::AbortHandle>>>);

impl Running {
    /// Spawns an assignment's task, listed before it can end (its end
    /// unlists it through `finished`).
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, assignment_id: String, task: impl FnOnce(Finished) -> F) {
        let mut tasks = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let finished = Finished { tasks: Arc::downgrade(&self.0), assignment_id: assignment_id.clone() };
        tasks.insert(assignment_id, tokio::spawn(task(finished)).abort_handle());
    }

    fn abort(&self, assignment_id: &str) {
        if let Some(task) = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(assignment_id) {
            task.abort();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values() {
            task.abort();
        }
    }
}

/// Unlists a running assignment when it ends, however it ends.
struct Finished {
    tasks: std::sync::Weak<std::sync::Mutex<std::collections::HashMap<String, tokio::task::AbortHandle>>>,
    assignment_id: String,
}

impl Drop for Finished {
    fn drop(&mut self) {
        if let Some(tasks) = self.tasks.upgrade() {
            tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.assignment_id);
        }
    }
}

/// A task that ends when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A refusal (bad token, bad hello) will not get better by reconnecting.
fn is_refusal(error: &anyhow::Error) -> bool {
    error.downcast_ref::<tonic::Status>().is_some_and(|status| {
        matches!(
            status.code(),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied | tonic::Code::InvalidArgument
        )
    })
}

/// The served agent a refusal is about, and the refusal: the agent the
/// service names, else, when the connection's own credential was refused,
/// the agent whose token it is.
fn refused_agent(error: &anyhow::Error, execution: &Endpoint, agents: &[AgentCredential]) -> Option<(String, String)> {
    let status = error.downcast_ref::<tonic::Status>()?;
    let reason = format!("{:?}: {}", status.code(), status.message());
    let named = muster_client::auth::error_info(status).and_then(|(_, metadata)| metadata.get("agent_id").cloned());
    let agent = match named {
        Some(agent_id) => agents.iter().find(|agent| agent.agent_id == agent_id),
        None if status.code() == tonic::Code::Unauthenticated => {
            agents.iter().find(|agent| agent.token == execution.token)
        }
        None => None,
    }?;
    Some((agent.agent_id.clone(), reason))
}

/// The message reporting a finished assignment.
fn report(assignment_id: String, outcome: StepOutcome, elapsed: Duration) -> connect_worker_request::Message {
    match outcome {
        StepOutcome::Completed { output_json, tokens_used, cost, iterations, remember, skip_triggers } => {
            match muster_client::json::value_from_text(&output_json) {
                Ok(output) => connect_worker_request::Message::Result(StepResult {
                    remember,
                    assignment_id,
                    output: Some(output),
                    tokens_used,
                    cost,
                    duration: Some(muster_client::time::to_duration(elapsed.as_millis() as u64)),
                    post_to_inbox: String::new(),
                    iterations,
                    skip_triggers,
                }),
                Err(problem) => connect_worker_request::Message::Failure(StepFailure {
                    assignment_id,
                    error_code: "INVALID_RESULT".to_owned(),
                    message: format!("the agent's output {problem}"),
                    retryable: false,
                }),
            }
        }
        StepOutcome::Failed { error_code, message, retryable } => {
            connect_worker_request::Message::Failure(StepFailure { assignment_id, error_code, message, retryable })
        }
        StepOutcome::Delegate { .. } | StepOutcome::HandedOff => {
            connect_worker_request::Message::Failure(StepFailure {
                assignment_id,
                error_code: "DELEGATION_REFUSED".to_owned(),
                message: "the delegation was refused and there was nothing else to report".to_owned(),
                retryable: false,
            })
        }
    }
}

async fn session<B: Behaviour>(
    execution: &Endpoint,
    worker_name: &str,
    agents: &[AgentCredential],
    behaviour: &Arc<B>,
    notify: &mut impl FnMut(Notice),
) -> anyhow::Result<()> {
    let replicas = execution.replicas()?;
    let channel = with_credentials(replicas.clone(), Credentials::bearer(&execution.token)?);
    let client = ExecutionServiceClient::new(channel.clone());
    let (sender, receiver) = mpsc::channel::<ConnectWorkerRequest>(256);
    sender
        .send(ConnectWorkerRequest {
            message: Some(connect_worker_request::Message::Hello(WorkerHello {
                worker_name: worker_name.to_owned(),
                agents: agents
                    .iter()
                    .map(|agent| ServedAgent { agent_id: agent.agent_id.clone(), token: agent.token.clone() })
                    .collect(),
                tools: behaviour.tools(),
                max_concurrency: 64,
            })),
        })
        .await?;
    let mut inbound = framed_client::execution_service_client::ExecutionServiceClient::new(channel)
        .connect_worker(ReceiverStream::new(receiver))
        .await?
        .into_inner();
    // Large values are read, and a step's calls made, with the token of the
    // agent the assignment is for.
    let mut readers = std::collections::HashMap::new();
    for agent in agents {
        let channel = with_credentials(replicas.clone(), Credentials::bearer(&agent.token)?);
        readers.insert(agent.agent_id.clone(), (ExecutionServiceClient::new(channel), agent.token.clone()));
    }
    // The assignments running, to stop one the service withdraws; all of
    // them stop with the session (the service reassigns them).
    let running = Running::default();
    let delegations = Delegations::default();
    // Heartbeats last as long as this session: a worker that stops (or
    // reconnects) must not keep its old stream alive with them.
    let mut _heartbeats: Option<AbortOnDrop> = None;
    // Assignments handed onward, waiting for the service's answer: what to report if refused.
    let refused_fallbacks: Arc<std::sync::Mutex<std::collections::HashMap<String, StepOutcome>>> = Arc::default();
    while let Some(frame) = inbound.message().await? {
        let (message, shared_memory) = match frame {
            WorkerFrame::Assignment { assignment, shared_memory } => {
                (Some(connect_worker_response::Message::Assignment(assignment)), SharedMemory::new(shared_memory))
            }
            WorkerFrame::Message(message) => (message.message, SharedMemory::default()),
            encoded @ WorkerFrame::Encoded(_) => (encoded.to_message()?.message, SharedMemory::default()),
        };
        match message {
            Some(connect_worker_response::Message::Welcome(welcome)) => {
                tracing::info!(worker_id = %welcome.worker_id, agents = agents.len(), "worker connected");
                notify(Notice::Connected {
                    worker_id: welcome.worker_id.clone(),
                    agents: agents.iter().map(|agent| agent.agent_id.clone()).collect(),
                });
                // Heartbeats keep the lease while assignments take long.
                let lease = muster_client::time::from_duration(welcome.lease.as_ref()).unwrap_or_default();
                let heartbeat_every = Duration::from_millis((lease / 3).max(50));
                let sender = sender.clone();
                _heartbeats = Some(AbortOnDrop(tokio::spawn(async move {
                    let heartbeat = ConnectWorkerRequest {
                        message: Some(connect_worker_request::Message::Heartbeat(WorkerHeartbeat {})),
                    };
                    loop {
                        tokio::time::sleep(heartbeat_every).await;
                        if sender.send(heartbeat.clone()).await.is_err() {
                            return;
                        }
                    }
                })));
            }
            Some(connect_worker_response::Message::Assignment(mut assignment)) => {
                let (mut reader, agent_token) = readers
                    .get(&assignment.agent_id)
                    .cloned()
                    .unwrap_or_else(|| (client.clone(), execution.token.clone()));
                let shared_memory = match assignment.shared_memory.take() {
                    Some(memory) => SharedMemory::from(&memory),
                    None => shared_memory,
                };
                let step = Step {
                    assignment_id: assignment.assignment_id.clone(),
                    shared_memory,
                    agent_token,
                    sender: sender.clone(),
                    execution: reader.clone(),
                    delegations: delegations.clone(),
                };
                let behaviour = behaviour.clone();
                let sender = sender.clone();
                let refused_fallbacks = refused_fallbacks.clone();
                let span = tracing::info_span!(
                    parent: None,
                    "assignment",
                    assignment_id = %assignment.assignment_id,
                    agent_id = %assignment.agent_id,
                    step_id = %assignment.step_id,
                );
                muster_client::trace::continue_from(&span, &assignment.trace_parent);
                let listed_as = assignment.assignment_id.clone();
                let run = move |finished: Finished| async move {
                    let _finished = finished;
                    let assignment_id = assignment.assignment_id.clone();
                    let started = std::time::Instant::now();
                    let outcome = match fill_payloads(&mut reader, &mut assignment).await {
                        Ok(()) => behaviour.run(assignment, step).await,
                        Err(status) => StepOutcome::Failed {
                            error_code: "PAYLOAD_UNAVAILABLE".to_owned(),
                            message: format!("could not read the assignment's large values: {}", status.message()),
                            retryable: true,
                        },
                    };
                    let message = match outcome {
                        StepOutcome::Delegate { to_agent_id, required_expertise, reason, otherwise } => {
                            refused_fallbacks
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .insert(assignment_id.clone(), *otherwise);
                            connect_worker_request::Message::Delegate(DelegateStep {
                                assignment_id,
                                to_agent_id,
                                required_expertise,
                                required_role: String::new(),
                                reason,
                            })
                        }
                        StepOutcome::HandedOff => return,
                        outcome => report(assignment_id, outcome, started.elapsed()),
                    };
                    let _ = sender.send(within_limits(message)).await;
                };
                running.spawn(listed_as, |finished| run(finished).instrument(span));
            }
            Some(connect_worker_response::Message::Cancel(cancel)) => {
                tracing::info!(assignment = %cancel.assignment_id, reason = %cancel.reason, "assignment withdrawn");
                running.abort(&cancel.assignment_id);
            }
            Some(connect_worker_response::Message::Delegation(outcome)) => {
                tracing::info!(assignment = %outcome.assignment_id, accepted = outcome.accepted, reason = %outcome.reason, "delegation answered");
                let waiting = delegations
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&outcome.assignment_id);
                if let Some(waiting) = waiting {
                    // A behaviour waits for it (Step::delegate).
                    let _ = waiting.send(outcome);
                    continue;
                }
                let fallback = refused_fallbacks
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&outcome.assignment_id);
                if let (false, Some(fallback)) = (outcome.accepted, fallback) {
                    let fallback = match fallback {
                        StepOutcome::Completed {
                            output_json,
                            tokens_used,
                            cost,
                            iterations,
                            remember,
                            skip_triggers,
                        } => {
                            let mut output: serde_json::Value = serde_json::from_str(&output_json).unwrap_or_default();
                            if let Some(object) = output.as_object_mut() {
                                object.insert("delegation_refused".to_owned(), outcome.reason.clone().into());
                            }
                            StepOutcome::Completed {
                                output_json: output.to_string(),
                                tokens_used,
                                cost,
                                iterations,
                                remember,
                                skip_triggers,
                            }
                        }
                        other => other,
                    };
                    let message = report(outcome.assignment_id, fallback, Duration::ZERO);
                    sender.send(within_limits(message)).await?;
                }
            }
            Some(connect_worker_response::Message::ToolCall(call)) => {
                let behaviour = behaviour.clone();
                let sender = sender.clone();
                let span = tracing::info_span!(parent: None, "tool call", tool = %call.tool, agent_id = %call.agent_id);
                muster_client::trace::continue_from(&span, &call.trace_parent);
                let run = async move {
                    let call_id = call.call_id.clone();
                    let output = behaviour.call_tool(call).await;
                    let message =
                        connect_worker_request::Message::ToolResult(ToolCallResult { call_id, output: Some(output) });
                    let _ = sender.send(within_limits(message)).await;
                };
                tokio::spawn(run.instrument(span));
            }
            None => {}
        }
    }
    Ok(())
}

/// The message to send for a report: the report itself, or, when the
/// service would refuse it (an output over its limit), the step's or the
/// tool call's failure saying so — so the stream, with the worker's other
/// assignments, goes on.
fn within_limits(message: connect_worker_request::Message) -> ConnectWorkerRequest {
    use connect_worker_request::Message;
    const PATH: &str = "/muster.execution.v1.ExecutionService/ConnectWorker";
    let request = ConnectWorkerRequest { message: Some(message) };
    let Err(refusal) = muster_client::limits::check_request(PATH, &prost::Message::encode_to_vec(&request)) else {
        return request;
    };
    let why = refusal.message().to_owned();
    tracing::warn!(%why, "report too large for the execution service");
    let failure = |assignment_id, code: &str| {
        Message::Failure(StepFailure {
            assignment_id,
            error_code: code.to_owned(),
            message: why.clone(),
            retryable: false,
        })
    };
    let message = match request.message {
        Some(Message::Result(StepResult { assignment_id, .. })) => failure(assignment_id, "OUTPUT_TOO_LARGE"),
        Some(
            Message::Failure(StepFailure { assignment_id, .. }) | Message::Delegate(DelegateStep { assignment_id, .. }),
        ) => failure(assignment_id, "REPORT_TOO_LARGE"),
        Some(Message::ToolResult(ToolCallResult { call_id, .. })) => Message::ToolResult(ToolCallResult {
            call_id,
            output: Some(ToolOutput { output: None, error: why, status_code: 500 }),
        }),
        other => return ConnectWorkerRequest { message: other },
    };
    ConnectWorkerRequest { message: Some(message) }
}

/// Reads the values an assignment names in `payload_refs` into its
/// `inputs` and `upstream_outputs`.
async fn fill_payloads(
    client: &mut ExecutionServiceClient<AuthChannel>,
    assignment: &mut Assignment,
) -> Result<(), tonic::Status> {
    for reference in std::mem::take(&mut assignment.payload_refs) {
        let kind = PayloadKind::try_from(reference.kind).unwrap_or(PayloadKind::Unspecified);
        let value = read_payload(client, &assignment.execution_id, &reference.step_id, kind).await?;
        let unreadable =
            |problem: String| tonic::Status::data_loss(format!("payload of step {}: {problem}", reference.step_id));
        match kind {
            PayloadKind::Inputs => {
                assignment.inputs = muster_client::json::struct_from_text(&value).map_err(unreadable)?
            }
            PayloadKind::Output => {
                let value = muster_client::json::value_from_text(&value).map_err(unreadable)?;
                assignment.upstream_outputs.insert(reference.step_id.clone(), value);
            }
            PayloadKind::Unspecified => {}
        }
    }
    Ok(())
}

/// Reads one value of an execution (`ReadPayload`), chunk by chunk; a read
/// that breaks off resumes where it stopped, up to three times.
pub async fn read_payload(
    client: &mut ExecutionServiceClient<AuthChannel>,
    execution_id: &str,
    step_id: &str,
    kind: PayloadKind,
) -> Result<String, tonic::Status> {
    let mut value = Vec::new();
    let mut breaks = 0;
    loop {
        let request = ReadPayloadRequest {
            execution_id: execution_id.to_owned(),
            step_id: step_id.to_owned(),
            kind: kind as i32,
            offset: value.len() as u64,
        };
        let read = async {
            let mut chunks = client.read_payload(request).await?.into_inner();
            let mut size = None;
            while let Some(chunk) = chunks.message().await? {
                if chunk.offset != value.len() as u64 {
                    return Err(tonic::Status::data_loss(format!(
                        "a chunk at offset {} where {} was expected",
                        chunk.offset,
                        value.len()
                    )));
                }
                value.extend_from_slice(&chunk.chunk);
                size = Some(chunk.size_bytes);
            }
            Ok(size)
        };
        match read.await {
            Ok(Some(size)) if size == value.len() as u64 => {
                return String::from_utf8(value)
                    .map_err(|_| tonic::Status::data_loss("the payload is not UTF-8 text".to_owned()));
            }
            Ok(size) => {
                return Err(tonic::Status::data_loss(format!(
                    "the payload ended after {} of {} bytes",
                    value.len(),
                    size.unwrap_or_default()
                )));
            }
            Err(status) if status.code() == tonic::Code::Unavailable && breaks < 3 => breaks += 1,
            Err(status) => return Err(status),
        }
    }
}
