//! The long-lived streams: a worker's connection and an execution's events.
//!
//! A worker proves each agent it serves with that agent's own token, and may
//! offer a tool only when entitled to: connected with an operator's
//! credential, or serving (or calling as) an agent whose role lists the tool.

use std::collections::BTreeSet;

use muster_proto::{common::v1 as common, execution::v1 as wire};
use muster_runtime::auth::{Caller, TokenHash, permission_denied};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::{ExecutionApi, tools::check_tool_specs};
use crate::{
    engine::{Control, Engine},
    workers::{Connection, Outcome, ServedAgent, WorkerSender, Workers},
};

impl ExecutionApi {
    /// Authenticates a worker's hello, registers it and serves its stream.
    pub(super) async fn connect(
        &self,
        caller: Caller,
        mut inbound: Streaming<wire::ConnectWorkerRequest>,
    ) -> Result<ReceiverStream<Result<wire::ConnectWorkerResponse, Status>>, Status> {
        let hello = match inbound.message().await? {
            Some(wire::ConnectWorkerRequest { message: Some(wire::connect_worker_request::Message::Hello(hello)) }) => {
                hello
            }
            _ => return Err(Status::invalid_argument("the first message of a worker must be a hello")),
        };
        if hello.agents.is_empty() && hello.tools.is_empty() {
            return Err(Status::invalid_argument("a worker must serve at least one agent or provide a tool"));
        }
        check_tool_specs(&hello.tools)?;
        let agents = self.authenticate_served(&hello).await?;
        self.check_tool_entitlement(&caller, &agents, &hello.tools).await?;
        let (sender, receiver) = mpsc::channel(256);
        let max_concurrency = if hello.max_concurrency == 0 { 16 } else { hello.max_concurrency as usize };
        let worker_id = self.engine.workers.register(Connection {
            name: hello.worker_name.clone(),
            agents: agents.into_iter().map(|(agent, _)| agent).collect(),
            tools: hello.tools.clone(),
            max_concurrency,
            opened_with: match &caller {
                Caller::Agent { token, .. } => Some(*token),
                _ => None,
            },
            sender: sender.clone(),
        });
        let welcome = wire::ConnectWorkerResponse {
            message: Some(wire::connect_worker_response::Message::Welcome(wire::WorkerWelcome {
                worker_id: worker_id.to_string(),
                lease_ms: self.engine.worker_lease.as_millis() as u64,
            })),
        };
        sender.send(Ok(welcome)).await.map_err(|_| Status::cancelled("the worker left"))?;
        let engine = self.engine.clone();
        tokio::spawn(async move {
            serve_worker(worker_id, &mut inbound, &sender, &engine).await;
            engine.workers.unregister(worker_id);
        });
        Ok(ReceiverStream::new(receiver))
    }

    /// Each served agent must present its own, good token; returns the
    /// agents with their roles.
    async fn authenticate_served(&self, hello: &wire::WorkerHello) -> Result<Vec<(ServedAgent, String)>, Status> {
        let mut agents = Vec::with_capacity(hello.agents.len());
        for served in &hello.agents {
            let token = TokenHash::of(served.token.trim());
            let proven = self.agents.authenticate_new(token).await.map_err(|status| {
                if status.code() == tonic::Code::Unauthenticated {
                    muster_runtime::auth::unauthenticated(
                        "CREDENTIAL_UNKNOWN",
                        format!("the token given for agent '{}' is not valid: {}", served.agent_id, status.message()),
                    )
                } else {
                    status
                }
            })?;
            if !proven.is_agent(&served.agent_id) {
                return Err(Status::permission_denied(format!(
                    "the token given for agent '{}' does not belong to it",
                    served.agent_id
                )));
            }
            agents.push((ServedAgent { agent_id: served.agent_id.clone(), token }, proven.roster_role().to_owned()));
        }
        Ok(agents)
    }

    /// A worker offers only the tools it is entitled to provide: any with an
    /// operator's credential; else those listed by the role of an agent it
    /// serves or calls as.
    async fn check_tool_entitlement(
        &self,
        caller: &Caller,
        agents: &[(ServedAgent, String)],
        tools: &[wire::ToolSpec],
    ) -> Result<(), Status> {
        if tools.is_empty() || caller.is_operator() {
            return Ok(());
        }
        let roles: BTreeSet<String> = agents
            .iter()
            .map(|(_, role)| role.clone())
            .chain(match caller {
                Caller::Agent { role, .. } => Some(role.to_string()),
                _ => None,
            })
            .filter(|role| !role.is_empty())
            .collect();
        let mut entitled: BTreeSet<String> = BTreeSet::new();
        for role in &roles {
            entitled.extend(self.role_tools.of(&self.engine.roster, role).await?.iter().cloned());
        }
        match tools.iter().find(|tool| !entitled.contains(&tool.name)) {
            None => Ok(()),
            Some(tool) => Err(permission_denied(
                caller,
                &format!("provide tool '{}'", tool.name),
                "NOT_ENTITLED_TO_TOOL",
                format!(
                    "no role of the agents it serves ({}) lists the tool; a worker connected with an operator's credential may provide any tool",
                    if roles.is_empty() { "none".to_owned() } else { roles.into_iter().collect::<Vec<_>>().join(", ") }
                ),
                &[("tool", tool.name.clone())],
            )),
        }
    }
}

/// Reads a worker's messages until it leaves.
async fn serve_worker(
    worker_id: u64,
    inbound: &mut Streaming<wire::ConnectWorkerRequest>,
    sender: &WorkerSender,
    engine: &Engine,
) {
    use wire::connect_worker_request::Message;
    let workers: &Workers = &engine.workers;
    loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => {
                workers.touch(worker_id);
                message
            }
            Ok(None) => return,
            Err(status) => {
                tracing::info!(worker_id, error = %status.message(), "worker stream ended");
                return;
            }
        };
        match message.message {
            Some(Message::Result(result)) => {
                let id = result.assignment_id.clone();
                workers.complete(worker_id, &id, Outcome::Completed(result));
            }
            Some(Message::Failure(failure)) => {
                let id = failure.assignment_id.clone();
                workers.complete(worker_id, &id, Outcome::Failed(failure));
            }
            Some(Message::Delegate(request)) => {
                let assignment_id = request.assignment_id.clone();
                // Only the worker holding the assignment may hand its step onward.
                let outcome = if workers.holds(worker_id, &assignment_id) {
                    delegate_onward(engine, request).await
                } else {
                    Err(format!("this worker does not hold assignment '{assignment_id}'"))
                };
                let outcome = outcome.unwrap_or_else(|reason| wire::DelegationOutcome {
                    assignment_id,
                    accepted: false,
                    decision: None,
                    reason,
                });
                let answer = wire::ConnectWorkerResponse {
                    message: Some(wire::connect_worker_response::Message::Delegation(outcome)),
                };
                let _ = sender.send(Ok(answer)).await;
            }
            Some(Message::Progress(progress)) => {
                tracing::debug!(worker_id, assignment = %progress.assignment_id, message = %progress.message, "step progress");
            }
            Some(Message::ToolResult(result)) => {
                let output = result.output.unwrap_or_default();
                workers.complete_tool_call(worker_id, &result.call_id, output);
            }
            Some(Message::Heartbeat(_)) => {}
            Some(Message::Hello(_)) | None => {
                let _ = sender.send(Err(Status::invalid_argument("a worker says hello once, first"))).await;
                return;
            }
        }
    }
}

/// Hands a worker's DelegateStep to the driver of the step's execution.
async fn delegate_onward(engine: &Engine, request: wire::DelegateStep) -> Result<wire::DelegationOutcome, String> {
    let execution_id = request.assignment_id.split('/').next().unwrap_or_default().to_owned();
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !engine.control(&execution_id, Control::DelegateOnward { request, reply }) {
        return Err(format!("execution '{execution_id}' is not running"));
    }
    match tokio::time::timeout(std::time::Duration::from_secs(30), answer).await {
        Ok(Ok(outcome)) => Ok(outcome),
        _ => Err("the execution did not answer the delegation in time; the step stays with you".to_owned()),
    }
}

/// Sends an execution's stored events after a sequence, then live ones, until it finishes.
pub(super) async fn stream_events(
    engine: &Engine,
    execution_id: &str,
    after_sequence: u64,
    mut live: broadcast::Receiver<common::StepEvent>,
    sender: &mpsc::Sender<Result<wire::WatchExecutionResponse, Status>>,
) -> Result<(), Status> {
    let mut last = after_sequence;
    loop {
        for event in engine.store.events_after(execution_id, last).await? {
            last = event.sequence;
            let finished = event.r#type == common::EventType::ExecutionFinished as i32;
            if sender.send(Ok(wire::WatchExecutionResponse { event: Some(event) })).await.is_err() || finished {
                return Ok(());
            }
        }
        loop {
            match live.recv().await {
                Ok(event) if event.execution_id == execution_id && event.sequence > last => {
                    if event.sequence != last + 1 {
                        break; // A gap: read it from the store.
                    }
                    last = event.sequence;
                    let finished = event.r#type == common::EventType::ExecutionFinished as i32;
                    if sender.send(Ok(wire::WatchExecutionResponse { event: Some(event) })).await.is_err() || finished {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return Err(Status::unavailable("the service is stopping")),
            }
        }
    }
}
