//! Connected agent workers: who serves which agent (with the token it
//! proved itself with), and the assignments in flight on each connection. A
//! worker that disconnects loses its assignments; their steps go back to be
//! assigned again. So does a worker whose token for an agent is revoked, for
//! that agent's assignments; it keeps serving the others.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use muster_proto::execution::v1::{
    Assignment, CancelAssignment, ConnectWorkerResponse, StepFailure, StepResult, ToolCall, ToolOutput, ToolSpec,
    connect_worker_response,
};
use muster_runtime::auth::TokenHash;
use tokio::sync::{Notify, mpsc, oneshot};

/// What became of an assignment.
#[derive(Debug)]
pub(crate) enum Outcome {
    Completed(StepResult),
    Failed(StepFailure),
    WorkerLost,
}

/// The outbound half of a worker connection.
pub(crate) type WorkerSender = mpsc::Sender<Result<ConnectWorkerResponse, tonic::Status>>;

/// An agent a worker serves, and the token it proved itself with.
#[derive(Debug, Clone)]
pub(crate) struct ServedAgent {
    pub(crate) agent_id: String,
    pub(crate) token: TokenHash,
}

/// A worker's connection as it said hello.
pub(crate) struct Connection {
    pub(crate) name: String,
    pub(crate) agents: Vec<ServedAgent>,
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) max_concurrency: usize,
    /// The agent token the connection was opened with, if it was an
    /// agent's: its revocation ends the connection.
    pub(crate) opened_with: Option<TokenHash>,
    pub(crate) sender: WorkerSender,
}

struct Worker {
    connection: Connection,
    last_seen: std::time::Instant,
    in_flight: usize,
}

struct Pending {
    worker_id: u64,
    agent_id: String,
    reply: oneshot::Sender<Outcome>,
}

#[derive(Default)]
struct State {
    next_worker_id: u64,
    workers: HashMap<u64, Worker>,
    pending: HashMap<String, Pending>,
    tool_calls: HashMap<String, (u64, oneshot::Sender<ToolOutput>)>,
}

/// The registry of connected workers.
#[derive(Default)]
pub(crate) struct Workers {
    state: Mutex<State>,
    changed: Notify,
}

impl Workers {
    /// Adds a connection; returns its id.
    pub(crate) fn register(&self, connection: Connection) -> u64 {
        let mut state = self.lock();
        state.next_worker_id += 1;
        let worker_id = state.next_worker_id;
        let tool_names: Vec<&str> = connection.tools.iter().map(|tool| tool.name.as_str()).collect();
        let agent_ids: Vec<&str> = connection.agents.iter().map(|agent| agent.agent_id.as_str()).collect();
        tracing::info!(worker_id, worker = %connection.name, agents = ?agent_ids, tools = ?tool_names, "worker connected");
        state.workers.insert(worker_id, Worker { connection, last_seen: std::time::Instant::now(), in_flight: 0 });
        drop(state);
        self.changed.notify_waiters();
        worker_id
    }

    /// Removes a connection; its assignments in flight are lost.
    pub(crate) fn unregister(&self, worker_id: u64) {
        let mut state = self.lock();
        let Some(worker) = state.workers.remove(&worker_id) else { return };
        let lost: Vec<String> = state
            .pending
            .iter()
            .filter(|(_, pending)| pending.worker_id == worker_id)
            .map(|(assignment_id, _)| assignment_id.clone())
            .collect();
        for assignment_id in &lost {
            if let Some(pending) = state.pending.remove(assignment_id) {
                let _ = pending.reply.send(Outcome::WorkerLost);
            }
        }
        let lost_calls: Vec<String> =
            state.tool_calls.iter().filter(|(_, (owner, _))| *owner == worker_id).map(|(id, _)| id.clone()).collect();
        for call_id in lost_calls {
            if let Some((_, reply)) = state.tool_calls.remove(&call_id) {
                let _ = reply.send(ToolOutput {
                    output_json: String::new(),
                    error: "the worker providing the tool disconnected during the call".to_owned(),
                    status_code: 500,
                });
            }
        }
        tracing::info!(worker_id, worker = %worker.connection.name, lost_assignments = lost.len(), "worker disconnected");
    }

    /// Hands an assignment to a worker serving its agent, waiting for one to
    /// connect (or to have room) when needed. The receiver yields the outcome.
    pub(crate) async fn dispatch(self: &Arc<Self>, assignment: Assignment) -> oneshot::Receiver<Outcome> {
        loop {
            let changed = self.changed.notified();
            let chosen = {
                let mut state = self.lock();
                let candidate = state
                    .workers
                    .iter()
                    .filter(|(_, worker)| {
                        worker.in_flight < worker.connection.max_concurrency
                            && worker.connection.agents.iter().any(|agent| agent.agent_id == assignment.agent_id)
                    })
                    .min_by_key(|(worker_id, worker)| (worker.in_flight, **worker_id))
                    .map(|(worker_id, _)| *worker_id);
                candidate.and_then(|worker_id| {
                    let worker = state.workers.get_mut(&worker_id)?;
                    worker.in_flight += 1;
                    let sender = worker.connection.sender.clone();
                    let (reply, receiver) = oneshot::channel();
                    state.pending.insert(
                        assignment.assignment_id.clone(),
                        Pending { worker_id, agent_id: assignment.agent_id.clone(), reply },
                    );
                    Some((worker_id, sender, receiver))
                })
            };
            match chosen {
                Some((worker_id, sender, receiver)) => {
                    let message = ConnectWorkerResponse {
                        message: Some(connect_worker_response::Message::Assignment(assignment.clone())),
                    };
                    if sender.send(Ok(message)).await.is_ok() {
                        return receiver;
                    }
                    // The connection closed under us: forget it and choose again.
                    self.unregister(worker_id);
                }
                None => changed.await,
            }
        }
    }

    /// Whether the worker holds the assignment now.
    pub(crate) fn holds(&self, worker_id: u64, assignment_id: &str) -> bool {
        Self::holds_in(&self.lock(), worker_id, assignment_id)
    }

    fn holds_in(state: &State, worker_id: u64, assignment_id: &str) -> bool {
        state.pending.get(assignment_id).is_some_and(|pending| pending.worker_id == worker_id)
    }

    /// Records the outcome a worker reported for one of its assignments.
    /// Reports for assignments the worker does not hold are ignored.
    pub(crate) fn complete(&self, worker_id: u64, assignment_id: &str, outcome: Outcome) {
        let mut state = self.lock();
        if !Self::holds_in(&state, worker_id, assignment_id) {
            tracing::warn!(worker_id, assignment_id, "report for an assignment the worker does not hold; ignored");
            return;
        }
        if let Some(pending) = state.pending.remove(assignment_id) {
            let _ = pending.reply.send(outcome);
        }
        if let Some(worker) = state.workers.get_mut(&worker_id) {
            worker.in_flight = worker.in_flight.saturating_sub(1);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Withdraws an assignment (timeout, cancellation): the worker is told to stop.
    pub(crate) fn withdraw(&self, assignment_id: &str, reason: &str) {
        let mut state = self.lock();
        let Some(pending) = state.pending.remove(assignment_id) else { return };
        if let Some(worker) = state.workers.get_mut(&pending.worker_id) {
            worker.in_flight = worker.in_flight.saturating_sub(1);
            let message = ConnectWorkerResponse {
                message: Some(connect_worker_response::Message::Cancel(CancelAssignment {
                    assignment_id: assignment_id.to_owned(),
                    reason: reason.to_owned(),
                })),
            };
            let _ = worker.connection.sender.try_send(Ok(message));
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Ends the connections opened with a token that is now `revoked`, and
    /// takes from every other worker the agents whose token is revoked: their
    /// assignments on that worker are withdrawn and go back to be assigned.
    pub(crate) fn drop_revoked(&self, revoked: impl Fn(&TokenHash) -> bool) {
        let closed: Vec<(u64, WorkerSender)> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.connection.opened_with.as_ref().is_some_and(&revoked))
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))
            .collect();
        for (worker_id, sender) in closed {
            tracing::info!(worker_id, "the token the worker connected with was revoked; disconnecting it");
            let _ = sender.try_send(Err(muster_runtime::auth::unauthenticated(
                "CREDENTIAL_REVOKED",
                "the token this worker connected with was revoked",
            )));
            self.unregister(worker_id);
        }
        let mut state = self.lock();
        let mut dropped: Vec<(u64, String)> = Vec::new();
        for (worker_id, worker) in &mut state.workers {
            worker.connection.agents.retain(|agent| {
                let keep = !revoked(&agent.token);
                if !keep {
                    dropped.push((*worker_id, agent.agent_id.clone()));
                }
                keep
            });
        }
        if dropped.is_empty() {
            return;
        }
        let lost: Vec<String> = state
            .pending
            .iter()
            .filter(|(_, pending)| {
                dropped
                    .iter()
                    .any(|(worker_id, agent_id)| *worker_id == pending.worker_id && *agent_id == pending.agent_id)
            })
            .map(|(assignment_id, _)| assignment_id.clone())
            .collect();
        for assignment_id in lost {
            let Some(pending) = state.pending.remove(&assignment_id) else { continue };
            if let Some(worker) = state.workers.get_mut(&pending.worker_id) {
                worker.in_flight = worker.in_flight.saturating_sub(1);
                let cancel = ConnectWorkerResponse {
                    message: Some(connect_worker_response::Message::Cancel(CancelAssignment {
                        assignment_id: assignment_id.clone(),
                        reason: format!("the token of agent '{}' was revoked", pending.agent_id),
                    })),
                };
                let _ = worker.connection.sender.try_send(Ok(cancel));
            }
            let _ = pending.reply.send(Outcome::WorkerLost);
        }
        for (worker_id, agent_id) in &dropped {
            tracing::info!(worker_id, agent_id = %agent_id, "token revoked; the worker no longer serves the agent");
        }
    }

    /// Whether a connected worker serves `agent_id`.
    pub(crate) fn serves(&self, agent_id: &str) -> bool {
        self.lock()
            .workers
            .values()
            .any(|worker| worker.connection.agents.iter().any(|agent| agent.agent_id == agent_id))
    }

    /// Notes a sign of life from a worker.
    pub(crate) fn touch(&self, worker_id: u64) {
        if let Some(worker) = self.lock().workers.get_mut(&worker_id) {
            worker.last_seen = std::time::Instant::now();
        }
    }

    /// Disconnects the workers silent for longer than `lease`: their streams end
    /// with DEADLINE_EXCEEDED and their assignments go back to be assigned again.
    pub(crate) fn expire_silent(&self, lease: std::time::Duration) {
        let silent: Vec<(u64, WorkerSender)> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.last_seen.elapsed() > lease)
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))
            .collect();
        for (worker_id, sender) in silent {
            tracing::warn!(
                worker_id,
                lease_ms = lease.as_millis() as u64,
                "worker silent past its lease; disconnecting it"
            );
            let _ = sender.try_send(Err(tonic::Status::deadline_exceeded(format!(
                "no message or heartbeat for {} ms: the lease expired",
                lease.as_millis()
            ))));
            self.unregister(worker_id);
        }
    }

    /// The tools connected workers provide, one entry per name, ordered by name.
    pub(crate) fn tools(&self) -> Vec<ToolSpec> {
        let state = self.lock();
        let mut tools: HashMap<&str, &ToolSpec> = HashMap::new();
        for worker in state.workers.values() {
            for tool in &worker.connection.tools {
                tools.entry(tool.name.as_str()).or_insert(tool);
            }
        }
        let mut tools: Vec<ToolSpec> = tools.into_values().cloned().collect();
        tools.sort_by(|left, right| left.name.cmp(&right.name));
        tools
    }

    /// Sends a tool call to a worker providing the tool (the least busy);
    /// `None` when no connected worker provides it.
    pub(crate) fn call_tool(&self, call: ToolCall) -> Option<oneshot::Receiver<ToolOutput>> {
        let mut state = self.lock();
        let (worker_id, sender) = state
            .workers
            .iter()
            .filter(|(_, worker)| worker.connection.tools.iter().any(|tool| tool.name == call.tool))
            .min_by_key(|(worker_id, worker)| (worker.in_flight, **worker_id))
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))?;
        let (reply, receiver) = oneshot::channel();
        state.tool_calls.insert(call.call_id.clone(), (worker_id, reply));
        let message = ConnectWorkerResponse { message: Some(connect_worker_response::Message::ToolCall(call.clone())) };
        if sender.try_send(Ok(message)).is_err() {
            state.tool_calls.remove(&call.call_id);
            return None;
        }
        Some(receiver)
    }

    /// Records a worker's answer to one of its tool calls; others are ignored.
    pub(crate) fn complete_tool_call(&self, worker_id: u64, call_id: &str, output: ToolOutput) {
        let mut state = self.lock();
        if state.tool_calls.get(call_id).is_some_and(|(owner, _)| *owner == worker_id)
            && let Some((_, reply)) = state.tool_calls.remove(call_id)
        {
            let _ = reply.send(output);
        }
    }

    /// Forgets a call that timed out.
    pub(crate) fn abandon_tool_call(&self, call_id: &str) {
        self.lock().tool_calls.remove(call_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
