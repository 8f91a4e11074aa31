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
        StepProgress, ToolCall, ToolOutput, ToolSpec, connect_worker_request,
        execution_service_client::ExecutionServiceClient,
    },
    frame::WorkerRequestFrame,
};
use tokio::sync::{mpsc, oneshot};

mod memory;
mod session;
mod windows;

pub use memory::SharedMemory;
use session::{is_refusal, refused_agent};

/// JSON values as assignments, results and tool calls carry them
/// (`google.protobuf.Struct` and `Value`), to and from `serde_json`.
pub use muster_client::json;

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
    sender: mpsc::Sender<WorkerRequestFrame>,
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
        let encoded = prost::Message::encode_to_vec(&request);
        if let Err(refusal) = muster_client::limits::check_request(path, &encoded) {
            tracing::warn!(why = %refusal.message(), "progress report too large; not sent");
            return;
        }
        let _ = self.sender.send(WorkerRequestFrame::Encoded(encoded.into())).await;
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
        if self.sender.send(message.into()).await.is_err() {
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

    /// The most assignments the worker runs at once, as its hello tells the
    /// execution service ([`DEFAULT_MAX_CONCURRENCY`] by default). Each
    /// agent's own capacity in the roster bounds its share of them.
    fn max_concurrency(&self) -> u32 {
        DEFAULT_MAX_CONCURRENCY
    }

    /// How many executions' windows (an assignment's shared memory and
    /// history) the worker keeps between assignments, as its hello tells the
    /// execution service, which then sends an execution's next assignment
    /// only what changed: in a chain, one output and one history entry, not
    /// a hundred of each ([`DEFAULT_KEPT_WINDOWS`] by default; 0 keeps
    /// none). The behaviour sees every assignment whole either way.
    fn kept_windows(&self) -> u32 {
        DEFAULT_KEPT_WINDOWS
    }

    /// Runs a tool call; the execution service already checked the caller's
    /// permission and the input's schema.
    fn call_tool(&self, call: ToolCall) -> impl Future<Output = ToolOutput> + Send {
        async move {
            ToolOutput { output: None, error: format!("this worker has no tool '{}'", call.tool), status_code: 404 }
        }
    }
}

/// How many assignments a worker runs at once unless its behaviour says
/// otherwise ([`Behaviour::max_concurrency`]): enough that a worker serving
/// many agents is not what holds their steps back, which their capacities
/// in the roster do.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 1024;

/// How many executions' windows a worker keeps unless its behaviour says
/// otherwise ([`Behaviour::kept_windows`]): as many as the execution service
/// counts on (1,024), at most 256 KiB of shared memory each.
pub const DEFAULT_KEPT_WINDOWS: u32 = 1024;

/// A behaviour's assignments without its tools: for a worker not entitled
/// to provide them.
#[derive(Debug, Clone, Copy, Default)]
pub struct WithoutTools<B>(pub B);

impl<B: Behaviour> Behaviour for WithoutTools<B> {
    fn run(&self, assignment: Assignment, step: Step) -> impl Future<Output = StepOutcome> + Send {
        self.0.run(assignment, step)
    }

    fn max_concurrency(&self) -> u32 {
        self.0.max_concurrency()
    }

    fn kept_windows(&self) -> u32 {
        self.0.kept_windows()
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
            outcome = session::session(&execution, &worker_name, &agents, &behaviour, &mut notify) => {
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
