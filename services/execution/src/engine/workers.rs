//! Connected agent workers: who serves which agent (with the token it proved
//! itself with), their room for more work, the assignments each holds, the
//! steps waiting for a worker, and the tools workers provide.
//!
//! A step's driver asks for a worker with room ([`Workers::acquire`]); when
//! there is none, the step waits in its agent's line and its driver is handed
//! a [`Slot`] as soon as a worker connects or finishes something. A worker's
//! report goes straight to the driver of the step it is about. A worker that
//! disconnects loses its assignments (their steps go back to be assigned
//! again); so does a worker whose token for an agent is revoked, for that
//! agent's assignments — it keeps serving the others — and a connection
//! opened with a revoked token ends.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError, Weak},
    time::{Duration, Instant},
};

use muster_runtime::auth::TokenHash;
use tokio::sync::{mpsc, oneshot};

use super::{Input, Route};
use crate::domain::model::{Assignment, HandOffAnswer, Outcome, Tool, ToolCall, ToolOutput};

/// What the service sends a worker.
#[derive(Debug)]
pub(crate) enum ToWorker {
    Assignment(Arc<Assignment>),
    /// Stop an assignment: cancelled, reassigned, timed out.
    Cancel {
        assignment_id: String,
        reason: String,
    },
    ToolCall(ToolCall),
    HandOffAnswer(HandOffAnswer),
    /// The connection ends: its credential was revoked, or it stayed silent
    /// past its lease.
    Close(Closing),
}

/// Why a connection is ended by the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    Revoked,
    LeaseExpired(Duration),
}

/// The outbound half of a worker connection.
pub(crate) type WorkerSender = mpsc::UnboundedSender<ToWorker>;

/// An agent a worker serves, and the token it proved itself with.
#[derive(Debug, Clone)]
pub(crate) struct ServedAgent {
    pub(crate) agent_id: String,
    pub(crate) token: TokenHash,
}

/// A worker's connection as it said hello.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) name: String,
    pub(crate) agents: Vec<ServedAgent>,
    pub(crate) tools: Vec<Tool>,
    pub(crate) max_concurrency: usize,
    /// The agent token the connection was opened with, if it was an
    /// agent's: its revocation ends the connection.
    pub(crate) opened_with: Option<TokenHash>,
    pub(crate) sender: WorkerSender,
}

/// A connected worker, as `ListWorkers` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerView {
    pub(crate) worker_id: u64,
    pub(crate) name: String,
    pub(crate) agents: Vec<String>,
    pub(crate) tools: Vec<String>,
    pub(crate) in_flight: usize,
    pub(crate) max_concurrency: usize,
    pub(crate) connected_for: Duration,
    pub(crate) silent_for: Duration,
}

struct Worker {
    connection: Connection,
    connected_at: Instant,
    last_seen: Instant,
    /// Assignments held, and slots handed out and not yet used.
    in_flight: usize,
}

impl Worker {
    fn has_room(&self) -> bool {
        self.in_flight < self.connection.max_concurrency
    }

    fn serves(&self, agent_id: &str) -> bool {
        self.connection.agents.iter().any(|agent| agent.agent_id == agent_id)
    }
}

struct Pending {
    worker_id: u64,
    agent_id: String,
    route: Route,
}

#[derive(Default)]
struct State {
    next_worker_id: u64,
    workers: HashMap<u64, Worker>,
    /// Steps waiting for a worker with room, per agent, in arrival order.
    waiting: HashMap<String, VecDeque<Route>>,
    pending: HashMap<String, Pending>,
    tool_calls: HashMap<String, (u64, oneshot::Sender<ToolOutput>)>,
}

/// The registry of connected workers.
#[derive(Default)]
pub(crate) struct Workers {
    state: Mutex<State>,
}

/// Room on a worker, taken for one assignment: used by [`Slot::send`], or
/// given back when dropped.
pub(crate) struct Slot {
    worker_id: u64,
    workers: Weak<Workers>,
    used: bool,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Slot").field("worker_id", &self.worker_id).finish_non_exhaustive()
    }
}

impl Slot {
    /// Hands the assignment to the worker; its report goes to `route`. When
    /// the worker went away meanwhile, `route` hears that it was lost.
    pub(crate) fn send(mut self, assignment: Arc<Assignment>, route: Route) {
        self.used = true;
        let Some(workers) = self.workers.upgrade() else { return };
        let mut state = workers.lock();
        let sender = state.workers.get(&self.worker_id).map(|worker| worker.connection.sender.clone());
        let delivered = sender.is_some_and(|sender| {
            state.pending.insert(
                assignment.assignment_id.clone(),
                Pending { worker_id: self.worker_id, agent_id: assignment.agent_id.clone(), route: route.clone() },
            );
            let id = assignment.assignment_id.clone();
            let sent = sender.send(ToWorker::Assignment(assignment)).is_ok();
            if !sent {
                state.pending.remove(&id);
            }
            sent
        });
        if !delivered {
            drop(state);
            route.report(Outcome::WorkerLost);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.used
            && let Some(workers) = self.workers.upgrade()
        {
            let mut state = workers.lock();
            if let Some(worker) = state.workers.get_mut(&self.worker_id) {
                worker.in_flight = worker.in_flight.saturating_sub(1);
            }
            Workers::serve_waiting(&workers, &mut state, self.worker_id);
        }
    }
}

impl Workers {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a connection; returns its id. Steps waiting for its agents get it.
    pub(crate) fn register(self: &Arc<Self>, connection: Connection) -> u64 {
        let mut state = self.lock();
        state.next_worker_id += 1;
        let worker_id = state.next_worker_id;
        let tools: Vec<&str> = connection.tools.iter().map(|tool| tool.name.as_str()).collect();
        let agents: Vec<&str> = connection.agents.iter().map(|agent| agent.agent_id.as_str()).collect();
        tracing::info!(worker_id, worker = %connection.name, ?agents, ?tools, "worker connected");
        let now = Instant::now();
        state.workers.insert(worker_id, Worker { connection, connected_at: now, last_seen: now, in_flight: 0 });
        Self::serve_waiting(self, &mut state, worker_id);
        worker_id
    }

    /// Hands the worker's room to steps waiting for its agents, oldest first,
    /// taking its agents in turn.
    fn serve_waiting(workers: &Arc<Self>, state: &mut State, worker_id: u64) {
        let Some(worker) = state.workers.get(&worker_id) else { return };
        let agents: Vec<String> = worker.connection.agents.iter().map(|agent| agent.agent_id.clone()).collect();
        loop {
            let mut served_any = false;
            for agent_id in &agents {
                if !state.workers.get(&worker_id).is_some_and(Worker::has_room) {
                    return;
                }
                let Some(line) = state.waiting.get_mut(agent_id) else { continue };
                // Drivers that ended leave their places behind: skip them.
                while let Some(route) = line.pop_front() {
                    let slot = Slot { worker_id, workers: Arc::downgrade(workers), used: false };
                    if let Some(worker) = state.workers.get_mut(&worker_id) {
                        worker.in_flight += 1;
                    }
                    match route.driver.send(Input::WorkerReady {
                        position: route.position,
                        attempt: route.attempt,
                        slot,
                    }) {
                        Ok(()) => {
                            served_any = true;
                            break;
                        }
                        Err(returned) => {
                            // The driver is gone: take the room back without the slot's own release.
                            if let Input::WorkerReady { mut slot, .. } = returned.0 {
                                slot.used = true;
                            }
                            if let Some(worker) = state.workers.get_mut(&worker_id) {
                                worker.in_flight = worker.in_flight.saturating_sub(1);
                            }
                        }
                    }
                }
                if line.is_empty() {
                    state.waiting.remove(agent_id);
                }
            }
            if !served_any {
                return;
            }
        }
    }

    /// Room on a worker serving `agent_id`, the least busy one; `None` when
    /// no worker has room, in which case `route` waits in the agent's line
    /// and its driver gets a slot later ([`Input::WorkerReady`]).
    pub(crate) fn acquire(self: &Arc<Self>, agent_id: &str, route: Route) -> Option<Slot> {
        let mut state = self.lock();
        let chosen = state
            .workers
            .iter()
            .filter(|(_, worker)| worker.has_room() && worker.serves(agent_id))
            .min_by_key(|(worker_id, worker)| (worker.in_flight, **worker_id))
            .map(|(worker_id, _)| *worker_id);
        match chosen {
            Some(worker_id) => {
                if let Some(worker) = state.workers.get_mut(&worker_id) {
                    worker.in_flight += 1;
                }
                Some(Slot { worker_id, workers: Arc::downgrade(self), used: false })
            }
            None => {
                state.waiting.entry(agent_id.to_owned()).or_default().push_back(route);
                None
            }
        }
    }

    /// Takes a step out of its agent's line (it was paused, cancelled or
    /// timed out while waiting).
    pub(crate) fn stop_waiting(&self, agent_id: &str, route: &Route) {
        let mut state = self.lock();
        if let Some(line) = state.waiting.get_mut(agent_id) {
            line.retain(|waiting| !waiting.is(route));
            if line.is_empty() {
                state.waiting.remove(agent_id);
            }
        }
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
        let routes: Vec<Route> = lost
            .iter()
            .filter_map(|assignment_id| state.pending.remove(assignment_id))
            .map(|pending| pending.route)
            .collect();
        let lost_calls: Vec<String> =
            state.tool_calls.iter().filter(|(_, (owner, _))| *owner == worker_id).map(|(id, _)| id.clone()).collect();
        for call_id in lost_calls {
            if let Some((_, reply)) = state.tool_calls.remove(&call_id) {
                let _ = reply.send(ToolOutput::error(
                    500,
                    "the worker providing the tool disconnected during the call".to_owned(),
                ));
            }
        }
        drop(state);
        for route in routes {
            route.report(Outcome::WorkerLost);
        }
        tracing::info!(worker_id, worker = %worker.connection.name, lost_assignments = lost.len(), "worker disconnected");
    }

    /// Whether the worker holds the assignment now.
    pub(crate) fn holds(&self, worker_id: u64, assignment_id: &str) -> bool {
        self.lock().pending.get(assignment_id).is_some_and(|pending| pending.worker_id == worker_id)
    }

    /// Records what a worker reported of one of its assignments: the step's
    /// driver hears of it, and the room goes to a waiting step. Reports for
    /// assignments the worker does not hold are ignored.
    pub(crate) fn complete(self: &Arc<Self>, worker_id: u64, assignment_id: &str, outcome: Outcome) {
        let mut state = self.lock();
        if state.pending.get(assignment_id).is_none_or(|pending| pending.worker_id != worker_id) {
            tracing::warn!(worker_id, assignment_id, "report for an assignment the worker does not hold; ignored");
            return;
        }
        let Some(pending) = state.pending.remove(assignment_id) else { return };
        if let Some(worker) = state.workers.get_mut(&worker_id) {
            worker.in_flight = worker.in_flight.saturating_sub(1);
        }
        pending.route.report(outcome);
        Self::serve_waiting(self, &mut state, worker_id);
    }

    /// Withdraws an assignment (timeout, cancellation, intervention): the
    /// worker is told to stop, and a late report is ignored.
    pub(crate) fn withdraw(self: &Arc<Self>, assignment_id: &str, reason: &str) {
        let mut state = self.lock();
        let Some(pending) = state.pending.remove(assignment_id) else { return };
        if let Some(worker) = state.workers.get_mut(&pending.worker_id) {
            worker.in_flight = worker.in_flight.saturating_sub(1);
            let _ = worker
                .connection
                .sender
                .send(ToWorker::Cancel { assignment_id: assignment_id.to_owned(), reason: reason.to_owned() });
        }
        Self::serve_waiting(self, &mut state, pending.worker_id);
    }

    /// Answers a worker's hand-off request.
    pub(crate) fn answer_hand_off(&self, worker_id: u64, answer: HandOffAnswer) {
        if let Some(worker) = self.lock().workers.get(&worker_id) {
            let _ = worker.connection.sender.send(ToWorker::HandOffAnswer(answer));
        }
    }

    /// Ends the connections opened with a token that is now `revoked`, and
    /// takes from every other worker the agents whose token is revoked: their
    /// assignments on that worker are withdrawn and go back to be assigned.
    pub(crate) fn drop_revoked(self: &Arc<Self>, revoked: impl Fn(&TokenHash) -> bool) {
        let closed: Vec<(u64, WorkerSender)> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.connection.opened_with.as_ref().is_some_and(&revoked))
            .map(|(worker_id, worker)| (*worker_id, worker.connection.sender.clone()))
            .collect();
        for (worker_id, sender) in closed {
            tracing::info!(worker_id, "the token the worker connected with was revoked; disconnecting it");
            let _ = sender.send(ToWorker::Close(Closing::Revoked));
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
        let mut routes = Vec::new();
        for assignment_id in lost {
            let Some(pending) = state.pending.remove(&assignment_id) else { continue };
            if let Some(worker) = state.workers.get_mut(&pending.worker_id) {
                worker.in_flight = worker.in_flight.saturating_sub(1);
                let _ = worker.connection.sender.send(ToWorker::Cancel {
                    assignment_id: assignment_id.clone(),
                    reason: format!("the token of agent '{}' was revoked", pending.agent_id),
                });
            }
            routes.push(pending.route);
        }
        drop(state);
        for route in routes {
            route.report(Outcome::WorkerLost);
        }
        for (worker_id, agent_id) in &dropped {
            tracing::info!(worker_id, agent_id = %agent_id, "token revoked; the worker no longer serves the agent");
        }
    }

    /// Whether a connected worker serves `agent_id`.
    pub(crate) fn serves(&self, agent_id: &str) -> bool {
        self.lock().workers.values().any(|worker| worker.serves(agent_id))
    }

    /// Notes a sign of life from a worker.
    pub(crate) fn touch(&self, worker_id: u64) {
        if let Some(worker) = self.lock().workers.get_mut(&worker_id) {
            worker.last_seen = Instant::now();
        }
    }

    /// Disconnects the workers silent for longer than `lease`: their streams
    /// end with DEADLINE_EXCEEDED and their assignments go back to be
    /// assigned again.
    pub(crate) fn expire_silent(&self, lease: Duration) {
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
            let _ = sender.send(ToWorker::Close(Closing::LeaseExpired(lease)));
            self.unregister(worker_id);
        }
    }

    /// The connected workers, by id.
    pub(crate) fn list(&self) -> Vec<WorkerView> {
        let state = self.lock();
        let mut views: Vec<WorkerView> = state
            .workers
            .iter()
            .map(|(worker_id, worker)| WorkerView {
                worker_id: *worker_id,
                name: worker.connection.name.clone(),
                agents: worker.connection.agents.iter().map(|agent| agent.agent_id.clone()).collect(),
                tools: worker.connection.tools.iter().map(|tool| tool.name.clone()).collect(),
                in_flight: worker.in_flight,
                max_concurrency: worker.connection.max_concurrency,
                connected_for: worker.connected_at.elapsed(),
                silent_for: worker.last_seen.elapsed(),
            })
            .collect();
        views.sort_by_key(|view| view.worker_id);
        views
    }

    /// The tools connected workers provide, one entry per name, ordered by name.
    pub(crate) fn tools(&self) -> Vec<Tool> {
        let state = self.lock();
        let mut tools: HashMap<&str, &Tool> = HashMap::new();
        for worker in state.workers.values() {
            for tool in &worker.connection.tools {
                tools.entry(tool.name.as_str()).or_insert(tool);
            }
        }
        let mut tools: Vec<Tool> = tools.into_values().cloned().collect();
        tools.sort_by(|left, right| left.name.cmp(&right.name));
        tools
    }

    /// The tool a connected worker provides under `name`, if any.
    pub(crate) fn tool(&self, name: &str) -> Option<Tool> {
        let state = self.lock();
        state.workers.values().flat_map(|worker| &worker.connection.tools).find(|tool| tool.name == name).cloned()
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
        let call_id = call.call_id.clone();
        state.tool_calls.insert(call_id.clone(), (worker_id, reply));
        if sender.send(ToWorker::ToolCall(call)).is_err() {
            state.tool_calls.remove(&call_id);
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

    /// Connected workers.
    pub(crate) fn count(&self) -> usize {
        self.lock().workers.len()
    }

    /// Steps waiting for a worker, over all agents.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting.values().map(VecDeque::len).sum()
    }
}
