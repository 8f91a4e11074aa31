//! Connected agent workers: who serves which agent (with the token it proved
//! itself with), their room for more work, the assignments each holds, the
//! steps waiting for a worker, and the tools workers provide.
//!
//! A step's driver asks for a worker with room ([`Workers::acquire`]); when
//! there is none, the step waits in its agent's line and its driver is handed
//! a [`Slot`] as soon as a worker connects or finishes something. A worker's
//! report, and its progress, go straight to the driver of the step they are
//! about. A worker that disconnects loses its assignments (their steps go
//! back to be assigned again); so does a worker whose token for an agent is
//! revoked, for that agent's assignments — it keeps serving the others — and
//! a connection opened with a revoked token ends.
//!
//! Another replica's workers appear here as one connection (`relayed_by`):
//! a step goes to a worker connected here first. What arrives through a
//! relay ([`Workers::acquire_local`], [`Workers::call_local_tool`]) goes
//! only to the workers connected here, so it never travels on.

mod liveness;
mod tools;

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError, Weak},
    time::{Duration, Instant},
};

use muster_runtime::auth::TokenHash;
use tokio::sync::{mpsc, oneshot, watch};

use super::{Input, Route};
use crate::domain::{
    model::{Assignment, HandOffAnswer, Outcome, Tool, ToolCall, ToolOutput},
    progress::Progress,
};

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
    /// A message another replica sent for the worker, as it came (encoded).
    Relayed(bytes::Bytes),
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
    /// For another replica's workers, offered through it: its name.
    pub(crate) relayed_by: Option<String>,
    pub(crate) sender: WorkerSender,
}

/// What the workers connected here offer the other replicas: the agents
/// they serve (each with the token it was proven with, once), their tools
/// (one per name) and their room together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) agents: Vec<(String, TokenHash)>,
    pub(crate) tools: Vec<Tool>,
    pub(crate) max_concurrency: usize,
}

impl Offer {
    pub(crate) fn is_empty(&self) -> bool {
        self.agents.is_empty() && self.tools.is_empty()
    }
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
    pub(crate) relayed_by: Option<String>,
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

    fn is_relay(&self) -> bool {
        self.connection.relayed_by.is_some()
    }

    /// Whether the worker may take `waiting`.
    fn may_take(&self, waiting: &Waiting) -> bool {
        !(waiting.local_only && self.is_relay())
    }
}

/// A step in its agent's line.
struct Waiting {
    route: Route,
    /// It came through a relay: only a worker connected here may take it.
    local_only: bool,
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
    waiting: HashMap<String, VecDeque<Waiting>>,
    pending: HashMap<String, Pending>,
    tool_calls: HashMap<String, (u64, oneshot::Sender<ToolOutput>)>,
}

/// The registry of connected workers.
pub(crate) struct Workers {
    state: Mutex<State>,
    /// Bumped whenever what the workers connected here offer may change.
    changes: watch::Sender<u64>,
}

impl Default for Workers {
    fn default() -> Self {
        Self { state: Mutex::default(), changes: watch::Sender::new(0) }
    }
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
    pub(crate) fn send(self, assignment: Arc<Assignment>, route: Route) {
        let (assignment_id, agent_id) = (assignment.assignment_id.clone(), assignment.agent_id.clone());
        self.deliver(assignment_id, agent_id, ToWorker::Assignment(assignment), route);
    }

    /// Hands the worker an assignment another replica sent (`message`, as
    /// it came); like [`Slot::send`].
    pub(crate) fn send_relayed(self, assignment_id: String, agent_id: String, message: bytes::Bytes, route: Route) {
        self.deliver(assignment_id, agent_id, ToWorker::Relayed(message), route);
    }

    fn deliver(mut self, assignment_id: String, agent_id: String, message: ToWorker, route: Route) {
        self.used = true;
        let Some(workers) = self.workers.upgrade() else { return };
        let mut state = workers.lock();
        let sender = state.workers.get(&self.worker_id).map(|worker| worker.connection.sender.clone());
        let delivered = sender.is_some_and(|sender| {
            state
                .pending
                .insert(assignment_id.clone(), Pending { worker_id: self.worker_id, agent_id, route: route.clone() });
            let sent = sender.send(message).is_ok();
            if !sent {
                state.pending.remove(&assignment_id);
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
        drop(state);
        self.changed();
        worker_id
    }

    /// Replaces what a relay offers (another replica's workers came or
    /// went): the assignments it holds for agents it no longer offers go
    /// back to be assigned again.
    pub(crate) fn update(self: &Arc<Self>, worker_id: u64, agents: Vec<ServedAgent>, tools: Vec<Tool>, room: usize) {
        let mut state = self.lock();
        let Some(worker) = state.workers.get_mut(&worker_id) else { return };
        worker.connection.agents = agents;
        worker.connection.tools = tools;
        worker.connection.max_concurrency = room;
        let lost: Vec<String> = state
            .pending
            .iter()
            .filter(|(_, pending)| {
                pending.worker_id == worker_id
                    && !state.workers.get(&worker_id).is_some_and(|worker| worker.serves(&pending.agent_id))
            })
            .map(|(assignment_id, _)| assignment_id.clone())
            .collect();
        let routes = Self::take_back(&mut state, &lost, |_| "the agent is no longer served there".to_owned());
        Self::serve_waiting(self, &mut state, worker_id);
        drop(state);
        for route in routes {
            route.report(Outcome::WorkerLost);
        }
    }

    /// Takes assignments back from the workers holding them, telling the
    /// workers to stop; their routes.
    fn take_back(state: &mut State, assignment_ids: &[String], reason: impl Fn(&Pending) -> String) -> Vec<Route> {
        let mut routes = Vec::new();
        for assignment_id in assignment_ids {
            let Some(pending) = state.pending.remove(assignment_id) else { continue };
            if let Some(worker) = state.workers.get_mut(&pending.worker_id) {
                worker.in_flight = worker.in_flight.saturating_sub(1);
                let _ = worker
                    .connection
                    .sender
                    .send(ToWorker::Cancel { assignment_id: assignment_id.clone(), reason: reason(&pending) });
            }
            routes.push(pending.route);
        }
        routes
    }

    /// Wakes those who follow what the workers connected here offer.
    fn changed(&self) {
        self.changes.send_modify(|version| *version += 1);
    }

    /// Follows the changes of what the workers connected here offer.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// What the workers connected here (not those relayed) offer.
    pub(crate) fn offer(&self) -> Offer {
        let state = self.lock();
        let mut offer = Offer::default();
        let mut workers: Vec<(&u64, &Worker)> = state.workers.iter().filter(|(_, worker)| !worker.is_relay()).collect();
        workers.sort_by_key(|(worker_id, _)| **worker_id);
        for (_, worker) in workers {
            offer.max_concurrency += worker.connection.max_concurrency;
            for agent in &worker.connection.agents {
                let served = (agent.agent_id.clone(), agent.token);
                if !offer.agents.contains(&served) {
                    offer.agents.push(served);
                }
            }
            for tool in &worker.connection.tools {
                if !offer.tools.iter().any(|known| known.name == tool.name) {
                    offer.tools.push(tool.clone());
                }
            }
        }
        offer
    }

    /// Hands the worker's room to steps waiting for its agents, oldest first,
    /// taking its agents in turn.
    fn serve_waiting(workers: &Arc<Self>, state: &mut State, worker_id: u64) {
        let Some(worker) = state.workers.get(&worker_id) else { return };
        let agents: Vec<String> = worker.connection.agents.iter().map(|agent| agent.agent_id.clone()).collect();
        let relay = worker.is_relay();
        loop {
            let mut served_any = false;
            for agent_id in &agents {
                if !state.workers.get(&worker_id).is_some_and(Worker::has_room) {
                    return;
                }
                let Some(line) = state.waiting.get_mut(agent_id) else { continue };
                // Drivers that ended leave their places behind: skip them.
                while let Some(place) = line.iter().position(|waiting| !(relay && waiting.local_only)) {
                    let Some(Waiting { route, .. }) = line.remove(place) else { break };
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
                if state.waiting.get(agent_id).is_some_and(VecDeque::is_empty) {
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
        self.acquire_from(agent_id, Waiting { route, local_only: false })
    }

    /// Like [`Workers::acquire`], for a step another replica relayed: only
    /// a worker connected here takes it.
    pub(crate) fn acquire_local(self: &Arc<Self>, agent_id: &str, route: Route) -> Option<Slot> {
        self.acquire_from(agent_id, Waiting { route, local_only: true })
    }

    fn acquire_from(self: &Arc<Self>, agent_id: &str, waiting: Waiting) -> Option<Slot> {
        let mut state = self.lock();
        let chosen = state
            .workers
            .iter()
            .filter(|(_, worker)| worker.has_room() && worker.serves(agent_id) && worker.may_take(&waiting))
            .min_by_key(|(worker_id, worker)| (worker.is_relay(), worker.in_flight, **worker_id))
            .map(|(worker_id, _)| *worker_id);
        match chosen {
            Some(worker_id) => {
                if let Some(worker) = state.workers.get_mut(&worker_id) {
                    worker.in_flight += 1;
                }
                Some(Slot { worker_id, workers: Arc::downgrade(self), used: false })
            }
            None => {
                state.waiting.entry(agent_id.to_owned()).or_default().push_back(waiting);
                None
            }
        }
    }

    /// Takes a step out of its agent's line (it was paused, cancelled or
    /// timed out while waiting).
    pub(crate) fn stop_waiting(&self, agent_id: &str, route: &Route) {
        let mut state = self.lock();
        if let Some(line) = state.waiting.get_mut(agent_id) {
            line.retain(|waiting| !waiting.route.is(route));
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
        self.changed();
        tracing::info!(worker_id, worker = %worker.connection.name, lost_assignments = lost.len(), "worker disconnected");
    }

    /// Whether the worker holds the assignment now.
    pub(crate) fn holds(&self, worker_id: u64, assignment_id: &str) -> bool {
        self.lock().pending.get(assignment_id).is_some_and(|pending| pending.worker_id == worker_id)
    }

    /// Ends a worker's hold on an assignment whose report went elsewhere
    /// (to the replica that relayed it): its room goes to a waiting step.
    pub(crate) fn release(self: &Arc<Self>, worker_id: u64, assignment_id: &str) {
        let mut state = self.lock();
        if state.pending.get(assignment_id).is_none_or(|pending| pending.worker_id != worker_id) {
            return;
        }
        state.pending.remove(assignment_id);
        if let Some(worker) = state.workers.get_mut(&worker_id) {
            worker.in_flight = worker.in_flight.saturating_sub(1);
        }
        Self::serve_waiting(self, &mut state, worker_id);
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

    /// Passes what a worker reported of one of its assignments while it
    /// runs to the step's driver; about an assignment the worker does not
    /// hold (any more), it is ignored.
    pub(crate) fn progress(&self, worker_id: u64, assignment_id: &str, progress: Progress) {
        let state = self.lock();
        match state.pending.get(assignment_id) {
            Some(pending) if pending.worker_id == worker_id => pending.route.progress(progress),
            _ => {
                tracing::debug!(worker_id, assignment_id, "progress on an assignment the worker does not hold; ignored")
            }
        }
    }

    /// Withdraws an assignment (timeout, cancellation, intervention): the
    /// worker is told to stop, and a late report is ignored.
    pub(crate) fn withdraw(self: &Arc<Self>, assignment_id: &str, reason: &str) {
        let mut state = self.lock();
        let Some(worker_id) = state.pending.get(assignment_id).map(|pending| pending.worker_id) else { return };
        // The step's driver withdrew it: its route is not told.
        Self::take_back(&mut state, &[assignment_id.to_owned()], |_| reason.to_owned());
        Self::serve_waiting(self, &mut state, worker_id);
    }

    /// Sends a worker a message (such as the answer to its hand-off), if it is still connected.
    pub(crate) fn send_to(&self, worker_id: u64, message: ToWorker) {
        if let Some(worker) = self.lock().workers.get(&worker_id) {
            let _ = worker.connection.sender.send(message);
        }
    }

    /// Whether a connected worker serves `agent_id`.
    pub(crate) fn serves(&self, agent_id: &str) -> bool {
        self.lock().workers.values().any(|worker| worker.serves(agent_id))
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
                relayed_by: worker.connection.relayed_by.clone(),
            })
            .collect();
        views.sort_by_key(|view| view.worker_id);
        views
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

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(agents: &[&str], relayed_by: Option<&str>) -> (Connection, mpsc::UnboundedReceiver<ToWorker>) {
        let (sender, inbox) = mpsc::unbounded_channel();
        let connection = Connection {
            name: relayed_by.map_or_else(|| "here".to_owned(), |replica| format!("replica {replica}")),
            agents: agents
                .iter()
                .map(|agent| ServedAgent { agent_id: (*agent).to_owned(), token: TokenHash::of(agent) })
                .collect(),
            tools: Vec::new(),
            max_concurrency: 4,
            opened_with: None,
            relayed_by: relayed_by.map(str::to_owned),
            sender,
        };
        (connection, inbox)
    }

    fn route() -> (Route, mpsc::UnboundedReceiver<Input>) {
        let (driver, inputs) = mpsc::unbounded_channel();
        (Route { driver, position: 0, attempt: 1 }, inputs)
    }

    #[test]
    fn a_relayed_step_never_travels_on_and_a_worker_here_goes_first() {
        let workers = Arc::new(Workers::default());
        let (relay, _relay_inbox) = connection(&["doer"], Some("b"));
        let relay_id = workers.register(relay);
        assert_eq!(workers.offer(), Offer::default(), "another replica's workers are not offered on");

        // A step this replica drives may go to the other replica's workers...
        let (own, _own_inputs) = route();
        let slot = workers.acquire("doer", own).expect("the relay has room");
        assert_eq!(slot.worker_id, relay_id);
        drop(slot);
        // ...a step another replica relayed may not: it waits for a worker here.
        let (relayed, mut relayed_inputs) = route();
        assert!(workers.acquire_local("doer", relayed).is_none());
        assert!(relayed_inputs.try_recv().is_err(), "the relay's room is not offered to it");

        let (local, _local_inbox) = connection(&["doer", "helper"], None);
        let local_id = workers.register(local);
        match relayed_inputs.try_recv() {
            Ok(Input::WorkerReady { slot, .. }) => assert_eq!(slot.worker_id, local_id),
            other => panic!("the worker here should take the relayed step: {other:?}"),
        }
        let (own, _own_inputs) = route();
        assert_eq!(workers.acquire("doer", own).map(|slot| slot.worker_id), Some(local_id), "a worker here first");

        let offer = workers.offer();
        let agents: Vec<&str> = offer.agents.iter().map(|(agent, _)| agent.as_str()).collect();
        assert_eq!((agents, offer.max_concurrency), (vec!["doer", "helper"], 4));
    }

    #[test]
    fn a_relay_that_stops_offering_an_agent_gives_its_steps_back() {
        let workers = Arc::new(Workers::default());
        let (relay, mut relay_inbox) = connection(&["doer"], Some("b"));
        let relay_id = workers.register(relay);
        let (own, mut inputs) = route();
        let assignment_id = "run/step/1".to_owned();
        let slot = workers.acquire("doer", own.clone()).unwrap();
        slot.send_relayed(assignment_id.clone(), "doer".to_owned(), bytes::Bytes::new(), own);
        assert!(matches!(relay_inbox.try_recv(), Ok(ToWorker::Relayed(_))));
        assert!(workers.holds(relay_id, &assignment_id));

        workers.update(relay_id, Vec::new(), Vec::new(), 4);
        assert!(!workers.holds(relay_id, &assignment_id));
        assert!(matches!(relay_inbox.try_recv(), Ok(ToWorker::Cancel { .. })), "the relay is told to stop it");
        assert!(matches!(inputs.try_recv(), Ok(Input::Report { outcome: Outcome::WorkerLost, .. })));
    }
}
