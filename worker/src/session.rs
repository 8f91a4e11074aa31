//! One connection's session: the hello with the agents served, assignments
//! run each in its own task (their payloads read first when too large to
//! travel), reports, progress, hand-offs and tool calls over the stream,
//! and what a refused agent or a broken stream does.

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use muster_client::auth::{AuthChannel, Credentials, with_credentials};
use muster_proto::{
    execution::v1::{
        Assignment, ConnectWorkerRequest, DelegateStep, DelegationOutcome, PayloadKind, ServedAgent, StepFailure,
        StepResult, ToolCall, ToolCallResult, ToolOutput, WorkerHeartbeat, WorkerHello, WorkerWelcome,
        connect_worker_request, connect_worker_response, execution_service_client::ExecutionServiceClient,
        framed_client,
    },
    frame::{WorkerFrame, WorkerRequestFrame},
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument as _;

use crate::{
    AgentCredential, Behaviour, Delegations, Endpoint, Notice, SharedMemory, Step, StepOutcome, read_payload,
    windows::Windows,
};

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
pub(super) fn is_refusal(error: &anyhow::Error) -> bool {
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
pub(super) fn refused_agent(
    error: &anyhow::Error,
    execution: &Endpoint,
    agents: &[AgentCredential],
) -> Option<(String, String)> {
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

pub(super) async fn session<B: Behaviour>(
    execution: &Endpoint,
    worker_name: &str,
    agents: &[AgentCredential],
    behaviour: &Arc<B>,
    notify: &mut impl FnMut(Notice),
) -> anyhow::Result<()> {
    let replicas = execution.replicas()?;
    let channel = with_credentials(replicas.clone(), Credentials::bearer(&execution.token)?);
    let client = ExecutionServiceClient::new(channel.clone());
    let (sender, receiver) = mpsc::channel::<WorkerRequestFrame>(256);
    let hello = ConnectWorkerRequest {
        message: Some(connect_worker_request::Message::Hello(WorkerHello {
            worker_name: worker_name.to_owned(),
            agents: agents
                .iter()
                .map(|agent| ServedAgent { agent_id: agent.agent_id.clone(), token: agent.token.clone() })
                .collect(),
            tools: behaviour.tools(),
            max_concurrency: behaviour.max_concurrency(),
            keeps_windows: behaviour.kept_windows(),
        })),
    };
    sender.send(hello.into()).await?;
    let mut inbound = framed_client::execution_service_client::ExecutionServiceClient::new(channel)
        .connect_worker(ReceiverStream::new(receiver))
        .await?
        .into_inner();
    let mut readers = HashMap::new();
    for agent in agents {
        let channel = with_credentials(replicas.clone(), Credentials::bearer(&agent.token)?);
        readers.insert(agent.agent_id.clone(), (ExecutionServiceClient::new(channel), agent.token.clone()));
    }
    let mut session = Session {
        execution,
        behaviour,
        client,
        readers,
        sender,
        running: Running::default(),
        delegations: Delegations::default(),
        refused_fallbacks: Arc::default(),
        heartbeats: None,
    };
    let mut windows = Windows::new(behaviour.kept_windows());
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
                session.welcomed(&welcome);
            }
            Some(connect_worker_response::Message::Assignment(mut assignment)) => {
                let shared_memory = match assignment.shared_memory.take() {
                    Some(memory) => SharedMemory::from(&memory),
                    None => shared_memory,
                };
                let shared_memory = windows.whole(&mut assignment, shared_memory)?;
                session.assigned(assignment, shared_memory);
            }
            Some(connect_worker_response::Message::Cancel(cancel)) => {
                tracing::info!(assignment = %cancel.assignment_id, reason = %cancel.reason, "assignment withdrawn");
                session.running.abort(&cancel.assignment_id);
            }
            Some(connect_worker_response::Message::Delegation(outcome)) => {
                tracing::info!(assignment = %outcome.assignment_id, accepted = outcome.accepted, reason = %outcome.reason, "delegation answered");
                session.delegation_answered(outcome).await?;
            }
            Some(connect_worker_response::Message::ToolCall(call)) => session.tool_call(call),
            None => {}
        }
    }
    Ok(())
}

/// What one connection acts on the service's messages with.
struct Session<'s, B> {
    execution: &'s Endpoint,
    behaviour: &'s Arc<B>,
    /// The service, called with the worker's own token.
    client: ExecutionServiceClient<AuthChannel>,
    /// Large values are read, and a step's calls made, with the token of the
    /// agent the assignment is for: a client and the token, by agent.
    readers: HashMap<String, (ExecutionServiceClient<AuthChannel>, String)>,
    sender: mpsc::Sender<WorkerRequestFrame>,
    /// The assignments running, to stop one the service withdraws; all of
    /// them stop with the session (the service reassigns them).
    running: Running,
    delegations: Delegations,
    /// Assignments handed onward, waiting for the service's answer: what to
    /// report if refused.
    refused_fallbacks: Arc<std::sync::Mutex<HashMap<String, StepOutcome>>>,
    /// Heartbeats last as long as this session: a worker that stops (or
    /// reconnects) must not keep its old stream alive with them.
    heartbeats: Option<AbortOnDrop>,
}

impl<B: Behaviour> Session<'_, B> {
    /// The service took the worker: heartbeats keep its lease while
    /// assignments take long.
    fn welcomed(&mut self, welcome: &WorkerWelcome) {
        let lease = muster_client::time::from_duration(welcome.lease.as_ref()).unwrap_or_default();
        let heartbeat_every = Duration::from_millis((lease / 3).max(50));
        let sender = self.sender.clone();
        self.heartbeats = Some(AbortOnDrop(tokio::spawn(async move {
            let heartbeat = WorkerRequestFrame::from(ConnectWorkerRequest {
                message: Some(connect_worker_request::Message::Heartbeat(WorkerHeartbeat {})),
            });
            loop {
                tokio::time::sleep(heartbeat_every).await;
                if sender.send(heartbeat.clone()).await.is_err() {
                    return;
                }
            }
        })));
    }

    /// Runs an assignment in a task of its own: its large values read first,
    /// then the behaviour, then its report (or its hand-off onward).
    fn assigned(&self, mut assignment: Assignment, shared_memory: SharedMemory) {
        let (mut reader, agent_token) = self
            .readers
            .get(&assignment.agent_id)
            .cloned()
            .unwrap_or_else(|| (self.client.clone(), self.execution.token.clone()));
        let step = Step {
            assignment_id: assignment.assignment_id.clone(),
            shared_memory,
            agent_token,
            sender: self.sender.clone(),
            execution: reader.clone(),
            delegations: self.delegations.clone(),
        };
        let behaviour = self.behaviour.clone();
        let sender = self.sender.clone();
        let refused_fallbacks = self.refused_fallbacks.clone();
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
        self.running.spawn(listed_as, |finished| run(finished).instrument(span));
    }

    /// The service's answer to a hand-off: to the behaviour that waits for
    /// it ([`Step::delegate`]), or, refused, the outcome the behaviour gave
    /// for that case, reported now.
    async fn delegation_answered(&self, outcome: DelegationOutcome) -> anyhow::Result<()> {
        let waiting =
            self.delegations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&outcome.assignment_id);
        if let Some(waiting) = waiting {
            let _ = waiting.send(outcome);
            return Ok(());
        }
        let fallback = self
            .refused_fallbacks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&outcome.assignment_id);
        if let (false, Some(fallback)) = (outcome.accepted, fallback) {
            let fallback = match fallback {
                StepOutcome::Completed { output_json, tokens_used, cost, iterations, remember, skip_triggers } => {
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
            self.sender.send(within_limits(message)).await?;
        }
        Ok(())
    }

    /// Calls one of the behaviour's tools for the service, in a task of its
    /// own, and sends the answer back.
    fn tool_call(&self, call: ToolCall) {
        let behaviour = self.behaviour.clone();
        let sender = self.sender.clone();
        let span = tracing::info_span!(parent: None, "tool call", tool = %call.tool, agent_id = %call.agent_id);
        muster_client::trace::continue_from(&span, &call.trace_parent);
        let run = async move {
            let call_id = call.call_id.clone();
            let output = behaviour.call_tool(call).await;
            let message = connect_worker_request::Message::ToolResult(ToolCallResult { call_id, output: Some(output) });
            let _ = sender.send(within_limits(message)).await;
        };
        tokio::spawn(run.instrument(span));
    }
}

/// The message to send for a report: the report itself, as the bytes its
/// size was checked on, or, when the service would refuse it (an output
/// over its limit), the step's or the tool call's failure saying so — so
/// the stream, with the worker's other assignments, goes on.
fn within_limits(message: connect_worker_request::Message) -> WorkerRequestFrame {
    use connect_worker_request::Message;
    const PATH: &str = "/muster.execution.v1.ExecutionService/ConnectWorker";
    let request = ConnectWorkerRequest { message: Some(message) };
    let encoded = prost::Message::encode_to_vec(&request);
    let Err(refusal) = muster_client::limits::check_request(PATH, &encoded) else {
        return WorkerRequestFrame::Encoded(encoded.into());
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
        other => return ConnectWorkerRequest { message: other }.into(),
    };
    ConnectWorkerRequest { message: Some(message) }.into()
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
