//! The long-lived streams: a worker's connection and an execution's events.
//!
//! A worker proves each agent it serves with that agent's own token, and may
//! offer a tool only when entitled to: connected with an operator's
//! credential, or serving (or calling as) an agent whose role lists the tool.

use std::{collections::BTreeSet, sync::Arc};

use muster_proto::{common::v1 as common, execution::v1 as wire, frame::WorkerFrame};
use muster_runtime::{
    auth::{Caller, TokenHash},
    time::to_duration,
};
use prost::Message as _;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use super::{
    ExecutionGrpc, ResponseStream, access::denied, relay::Relays, tools::check_tool_specs,
    worker_messages::handle_worker_message,
};
use crate::{
    Error, Result,
    domain::model::{EventKind, Outcome},
    engine::{
        Engine,
        workers::{Closing, Connection, ServedAgent, ToWorker},
    },
    grpc::convert::{
        assignment_reusing, decision_to_wire, event_to_wire, shared_memory_reusing, tool_call_to_wire, tool_from_wire,
    },
    grpc::windows::Windows,
};

/// Most assignments a worker takes at once when it does not say.
const DEFAULT_MAX_CONCURRENCY: usize = 16;
/// A message for the worker, on the wire.
/// `message`, unless it is an assignment too big for one message: that
/// step fails (ASSIGNMENT_TOO_LARGE, not retried) and the worker's stream,
/// with the other assignments on it, goes on.
fn deliverable(
    engine: &Engine,
    worker_id: u64,
    limit: usize,
    message: Result<WorkerFrame, Status>,
) -> Option<Result<WorkerFrame, Status>> {
    if let Ok(frame) = &message
        && frame.encoded_len() > limit
        && let Some(assignment_id) = assignment_id(frame)
    {
        let size = frame.encoded_len();
        tracing::warn!(%assignment_id, size, limit, "assignment too large to send");
        let outcome = Outcome::Failed {
            error_code: "ASSIGNMENT_TOO_LARGE".to_owned(),
            message: format!(
                "the step's assignment is {size} bytes (its message, inputs and the outputs of the steps it \
                 depends on), more than the {limit}-byte message limit (MUSTER_MAX_MESSAGE_BYTES)"
            ),
            retryable: false,
        };
        engine.workers.complete(worker_id, &assignment_id, outcome);
        return None;
    }
    Some(message)
}

/// The id of the assignment a frame carries, if it carries one.
fn assignment_id(frame: &WorkerFrame) -> Option<String> {
    match frame {
        WorkerFrame::Assignment { assignment, .. } => Some(assignment.assignment_id.clone()),
        other => match other.to_message().ok()?.message? {
            wire::connect_worker_response::Message::Assignment(assignment) => Some(assignment.assignment_id),
            _ => None,
        },
    }
}

/// `message` on the wire; an assignment less what the worker keeps of its window.
fn to_wire(message: ToWorker, windows: &Windows) -> Result<WorkerFrame, Status> {
    use wire::connect_worker_response::Message;
    let message = match message {
        ToWorker::Assignment(assignment) => {
            let reuse = windows.reuse(&assignment);
            return Ok(WorkerFrame::Assignment {
                assignment: assignment_reusing(&assignment, reuse),
                shared_memory: shared_memory_reusing(&assignment.shared_memory, reuse.memory),
            });
        }
        ToWorker::Cancel { assignment_id, reason } => Message::Cancel(wire::CancelAssignment { assignment_id, reason }),
        ToWorker::ToolCall(call) => Message::ToolCall(tool_call_to_wire(&call)),
        ToWorker::HandOffAnswer(answer) => Message::Delegation(wire::DelegationOutcome {
            assignment_id: answer.assignment_id,
            accepted: answer.accepted,
            decision: answer.decision.as_ref().map(decision_to_wire),
            reason: answer.reason,
        }),
        ToWorker::Relayed(encoded) => return Ok(WorkerFrame::Encoded(encoded)),
        ToWorker::Close(Closing::Revoked) => {
            return Err(muster_runtime::auth::unauthenticated(
                "CREDENTIAL_REVOKED",
                "the token this worker connected with was revoked",
            ));
        }
        ToWorker::Close(Closing::LeaseExpired(lease)) => {
            return Err(Status::deadline_exceeded(format!(
                "no message or heartbeat for {} ms: the lease expired",
                lease.as_millis()
            )));
        }
    };
    Ok(WorkerFrame::Message(wire::ConnectWorkerResponse { message: Some(message) }))
}

impl ExecutionGrpc {
    /// Authenticates a worker's hello, registers it and serves its stream.
    pub(super) async fn connect(
        &self,
        caller: Caller,
        mut inbound: Streaming<wire::ConnectWorkerRequest>,
    ) -> Result<ResponseStream<WorkerFrame>, Status> {
        let hello = match inbound.message().await? {
            Some(wire::ConnectWorkerRequest { message: Some(wire::connect_worker_request::Message::Hello(hello)) }) => {
                hello
            }
            _ => return Err(Error::invalid("hello", "the first message of a worker must be a hello").into()),
        };
        if hello.agents.is_empty() && hello.tools.is_empty() {
            return Err(
                Error::invalid("hello.agents", "a worker must serve at least one agent or provide a tool").into()
            );
        }
        let tools = hello.tools.into_iter().map(tool_from_wire).collect::<std::result::Result<Vec<_>, _>>().map_err(
            |problem| Error::invalid("hello.tools.input_schema", format!("a tool's input_schema {problem}")),
        )?;
        check_tool_specs(&tools)?;
        let agents = self.authenticate_served(&caller, &hello.agents).await?;
        self.check_tool_entitlement(&caller, &agents, &tools).await?;
        let (sender, outbound) = mpsc::unbounded_channel();
        let max_concurrency =
            if hello.max_concurrency == 0 { DEFAULT_MAX_CONCURRENCY } else { hello.max_concurrency as usize };
        let worker_id = self.engine.workers.register(Connection {
            name: hello.worker_name.clone(),
            agents: agents.into_iter().map(|(agent, _)| agent).collect(),
            tools,
            max_concurrency,
            opened_with: match &caller {
                Caller::Agent { token, .. } => Some(*token),
                _ => None,
            },
            relayed_by: None,
            sender,
        });
        let (engine, relays) = (self.engine.clone(), self.relays.clone());
        tokio::spawn(async move {
            serve_worker(worker_id, &mut inbound, &engine, &relays).await;
            engine.workers.unregister(worker_id);
        });
        Ok(self.outbound(worker_id, outbound, Windows::new(hello.keeps_windows)))
    }

    /// The stream to a registered connection: its welcome, then what is
    /// sent to it, until a message that closes it; its assignments carry
    /// what the worker does not keep of their windows.
    pub(super) fn outbound(
        &self,
        worker_id: u64,
        outbound: mpsc::UnboundedReceiver<ToWorker>,
        mut windows: Windows,
    ) -> ResponseStream<WorkerFrame> {
        let welcome = WorkerFrame::Message(wire::ConnectWorkerResponse {
            message: Some(wire::connect_worker_response::Message::Welcome(wire::WorkerWelcome {
                worker_id: worker_id.to_string(),
                lease: Some(to_duration(self.engine.settings.worker_lease.as_millis() as u64)),
            })),
        });
        let (engine, limit) = (self.engine.clone(), self.max_message_bytes);
        let messages = UnboundedReceiverStream::new(outbound).filter_map(move |message| {
            let assignment = match &message {
                ToWorker::Assignment(assignment) => Some(assignment.clone()),
                ToWorker::Relayed(_) => {
                    windows.relayed();
                    None
                }
                _ => None,
            };
            let frame = deliverable(&engine, worker_id, limit, to_wire(message, &windows));
            if let (Some(Ok(_)), Some(assignment)) = (&frame, assignment) {
                windows.sent(&assignment);
            }
            frame
        });
        let mut closed = false;
        let messages = messages.take_while(move |message| {
            let keep = !closed;
            closed |= message.is_err();
            keep
        });
        Box::pin(tokio_stream::once(Ok(welcome)).chain(messages))
    }

    /// Each served agent must present its own, good token; returns the
    /// agents with their roles. A refusal names the agent in its
    /// `ErrorInfo` (`agent_id`), so a worker can tell which of its agents'
    /// credentials failed and connect again without it.
    async fn authenticate_served(
        &self,
        caller: &Caller,
        served: &[wire::ServedAgent],
    ) -> Result<Vec<(ServedAgent, String)>> {
        let mut agents = Vec::with_capacity(served.len());
        for served in served {
            let token = TokenHash::of(served.token.trim());
            let proven = self.agents.authenticate_new(token).await.map_err(|status| {
                if status.code() == tonic::Code::Unauthenticated {
                    let revoked = muster_runtime::auth::error_info(&status)
                        .is_some_and(|(reason, _)| reason == "CREDENTIAL_REVOKED");
                    Error::Unauthenticated {
                        reason: if revoked { "CREDENTIAL_REVOKED" } else { "CREDENTIAL_UNKNOWN" },
                        message: format!(
                            "the token given for agent '{}' is not valid: {}",
                            served.agent_id,
                            status.message()
                        ),
                        metadata: vec![("agent_id", served.agent_id.clone())],
                    }
                } else {
                    Error::Unavailable { service: "roster", detail: status.message().to_owned() }
                }
            })?;
            if !proven.is_agent(&served.agent_id) {
                return Err(denied(
                    caller,
                    format!("serve agent '{}'", served.agent_id),
                    "NOT_THE_AGENT",
                    format!("the token given for agent '{}' does not belong to it", served.agent_id),
                    vec![("agent_id", served.agent_id.clone())],
                ));
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
        tools: &[crate::domain::model::Tool],
    ) -> Result<()> {
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
            entitled.extend(self.role_grants.of(self.engine.roster.as_ref(), role).await?.tools.iter().cloned());
        }
        match tools.iter().find(|tool| !entitled.contains(&tool.name)) {
            None => Ok(()),
            Some(tool) => Err(denied(
                caller,
                format!("provide tool '{}'", tool.name),
                "NOT_ENTITLED_TO_TOOL",
                format!(
                    "no role of the agents it serves ({}) lists the tool; a worker connected with an operator's credential may provide any tool",
                    if roles.is_empty() { "none".to_owned() } else { roles.into_iter().collect::<Vec<_>>().join(", ") }
                ),
                vec![("tool", tool.name.clone())],
            )),
        }
    }
}

/// Reads a worker's messages until it leaves.
async fn serve_worker(
    worker_id: u64,
    inbound: &mut Streaming<wire::ConnectWorkerRequest>,
    engine: &Arc<Engine>,
    relays: &Relays,
) {
    loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => {
                engine.workers.touch(worker_id);
                message
            }
            Ok(None) => return,
            Err(status) => {
                tracing::info!(worker_id, error = %status.message(), "worker stream ended");
                return;
            }
        };
        // What concerns an assignment another replica relayed goes back to it.
        if relays.forward(worker_id, &message) {
            continue;
        }
        if handle_worker_message(worker_id, message, engine).await.is_break() {
            return;
        }
    }
}

/// How often a watch reads the store for the events of an execution that
/// another replica drives.
const WATCH_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Sends an execution's events after `after_sequence` until it ends: the
/// stored ones, then the live ones of this replica's drivers, and, for an
/// execution another replica drives, those read from the store every
/// [`WATCH_POLL`].
pub(super) async fn stream_events(
    engine: &Engine,
    execution_id: &str,
    after_sequence: u64,
    mut live: broadcast::Receiver<Arc<crate::domain::model::Event>>,
    sender: &mpsc::Sender<Result<wire::WatchExecutionResponse, Status>>,
) -> Result<(), Status> {
    let mut last = after_sequence;
    loop {
        loop {
            let stored = engine.store.events_after(execution_id, last, 1000).await?;
            let more = stored.len() == 1000;
            for bytes in stored {
                let event = common::StepEvent::decode(bytes.as_slice())
                    .map_err(|error| Status::internal(format!("corrupt stored event: {error}")))?;
                last = event.sequence;
                let finished = event.event_type == common::EventType::ExecutionFinished as i32;
                if sender.send(Ok(wire::WatchExecutionResponse { event: Some(event) })).await.is_err() || finished {
                    return Ok(());
                }
            }
            if !more {
                break;
            }
        }
        loop {
            // Another replica drives the execution: its events reach this
            // one through the store.
            let Ok(received) = tokio::time::timeout(WATCH_POLL, live.recv()).await else {
                if engine.drives(execution_id) {
                    continue;
                }
                break;
            };
            match received {
                Ok(event) if event.execution_id == execution_id && event.sequence > last => {
                    if event.sequence != last + 1 {
                        break; // A gap: read it from the store.
                    }
                    last = event.sequence;
                    let finished = event.kind == EventKind::ExecutionFinished;
                    let event = event_to_wire(&event);
                    if sender.send(Ok(wire::WatchExecutionResponse { event: Some(event) })).await.is_err() || finished {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(muster_runtime::status::retry_later(
                        "the service is stopping; try again",
                        "SHUTTING_DOWN",
                        &[],
                    ));
                }
            }
        }
    }
}
