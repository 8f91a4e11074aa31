//! Steps between replicas: a worker may connect to any replica and still
//! receive the steps of the agents it serves, whichever replica drives
//! their execution.
//!
//! Each replica with workers connected to it offers them to every other
//! live replica (the `replicas` table names them and their URLs): it opens
//! a `RelaySteps` stream to each and says which agents its workers serve,
//! with the token each was proven with, which tools they provide and how
//! much room they have — again whenever that changes. The other replica
//! registers the stream as one more worker ([`ExecutionGrpc::relay_steps`]),
//! which it uses only when no worker connected to it has room: an
//! assignment, a withdrawal, a tool call or a delegation answer travels
//! down the stream as to a worker; here it goes to a worker connected here,
//! or waits in its agent's line for one ([`Relays`]). What the worker
//! answers about it goes back up the stream as it came, and the replica
//! that drives the execution acts on it as on its own workers' messages.
//!
//! When a stream ends (either replica stopped or died), the driving replica
//! takes its assignments back to be assigned again, as for a worker that
//! disconnects, and this one withdraws them from its workers.

use std::{
    collections::HashMap,
    ops::ControlFlow,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use muster_proto::{
    execution::v1::{
        self as wire, connect_worker_request, connect_worker_response,
        framed_client::execution_service_client::ExecutionServiceClient, relay_steps_request,
    },
    frame::{RelayFrame, WorkerFrame},
};
use muster_runtime::{
    auth::{Caller, TokenHash},
    security::Security,
};
use prost::Message as _;
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};
use tokio_stream::{StreamExt as _, wrappers::UnboundedReceiverStream};
use tonic::{Status, Streaming};

use super::{ExecutionGrpc, ResponseStream, access::denied, tools, worker_messages::handle_worker_message};
use crate::{
    Error, Result,
    domain::model::{Outcome, Tool, ToolOutput},
    engine::{
        Engine, Input, Route,
        workers::{Connection, Offer, ServedAgent, ToWorker},
    },
    grpc::convert::{tool_call_from_wire, tool_from_wire, tool_output_to_wire, tool_to_wire},
    store::Replica,
};

/// How often the other replicas are listed again (a replica that joined
/// gets this one's offer within about this time).
const PEERS_REFRESH: Duration = Duration::from_secs(1);
/// Longest replica name in a RelayHello.
const MAX_REPLICA_NAME: usize = 256;

/// Why a relayed assignment's task stops.
enum Stop {
    /// The worker reported; the report went back to the driving replica.
    Reported,
    /// The driving replica withdrew it, or its stream ended.
    Withdrawn(String),
}

/// An assignment another replica relayed, held by a worker here or waiting
/// for one.
struct Relayed {
    link: u64,
    upstream: mpsc::UnboundedSender<wire::RelayStepsRequest>,
    stop: oneshot::Sender<Stop>,
}

/// This replica's side of the relays it opened: the assignments they
/// brought, and the task that keeps one stream open to every other replica.
pub(crate) struct Relays {
    engine: Arc<Engine>,
    security: Security,
    relayed: Mutex<HashMap<String, Relayed>>,
    /// The workers here waiting for the answer to a hand-off of a relayed
    /// assignment, by assignment, with the relay it came through (the
    /// assignment is withdrawn before the answer arrives when the hand-off
    /// is accepted).
    handing_off: Mutex<HashMap<String, (u64, u64)>>,
}

impl Relays {
    pub(crate) fn new(engine: Arc<Engine>, security: Security) -> Self {
        Self { engine, security, relayed: Mutex::default(), handing_off: Mutex::default() }
    }

    fn relayed(&self) -> MutexGuard<'_, HashMap<String, Relayed>> {
        self.relayed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handing_off(&self) -> MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.handing_off.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a worker's message about a relayed assignment back to the
    /// replica that relayed it, as it came; `false` when the message is not
    /// about one. A result or a failure ends the worker's hold on it here.
    pub(super) fn forward(&self, worker_id: u64, message: &wire::ConnectWorkerRequest) -> bool {
        use connect_worker_request::Message;
        let (assignment_id, ends) = match &message.message {
            Some(Message::Result(result)) => (&result.assignment_id, true),
            Some(Message::Failure(failure)) => (&failure.assignment_id, true),
            Some(Message::Delegate(delegate)) => (&delegate.assignment_id, false),
            Some(Message::Progress(progress)) => (&progress.assignment_id, false),
            _ => return false,
        };
        let mut relayed = self.relayed();
        let Some(entry) = relayed.get(assignment_id) else { return false };
        if !self.engine.workers.holds(worker_id, assignment_id) {
            tracing::warn!(worker_id, %assignment_id, "report for a relayed assignment the worker does not hold; ignored");
            return true;
        }
        if matches!(message.message, Some(Message::Delegate(_))) {
            self.handing_off().insert(assignment_id.clone(), (entry.link, worker_id));
        }
        let message = wire::RelayStepsRequest { message: Some(relay_steps_request::Message::Worker(message.clone())) };
        let _ = entry.upstream.send(message);
        if ends && let Some(entry) = relayed.remove(assignment_id) {
            drop(relayed);
            self.engine.workers.release(worker_id, assignment_id);
            let _ = entry.stop.send(Stop::Reported);
        }
        true
    }

    /// Keeps a relay open to every other live replica while workers are
    /// connected here, each told what they offer whenever that changes.
    pub(crate) async fn follow_peers(self: Arc<Self>) {
        let mut changes = self.engine.workers.subscribe();
        let (offers, _) = watch::channel(Offer::default());
        let mut links: HashMap<String, (Replica, JoinHandle<()>)> = HashMap::new();
        let mut next_link = 0_u64;
        loop {
            let offer = self.engine.workers.offer();
            // When the replicas cannot be listed, the relays open stay.
            let wanted = if offer.is_empty() {
                Some(Vec::new())
            } else {
                self.engine
                    .store
                    .peers()
                    .await
                    .inspect_err(|error| tracing::warn!(%error, "listing the other replicas failed"))
                    .ok()
            };
            offers.send_if_modified(|current| {
                let changed = *current != offer;
                *current = offer;
                changed
            });
            if let Some(wanted) = wanted {
                links.retain(|_, (peer, link)| {
                    let keep = !link.is_finished() && wanted.contains(peer);
                    if !keep {
                        link.abort();
                    }
                    keep
                });
                for peer in wanted {
                    links.entry(peer.id.clone()).or_insert_with(|| {
                        next_link += 1;
                        let link = tokio::spawn(self.clone().link(next_link, peer.clone(), offers.subscribe()));
                        (peer, link)
                    });
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                () = tokio::time::sleep(PEERS_REFRESH) => {}
            }
        }
        for (_, link) in links.into_values() {
            link.abort();
        }
    }

    /// One relay to the replica `peer`, open until it ends either side.
    async fn link(self: Arc<Self>, link: u64, peer: Replica, mut offers: watch::Receiver<Offer>) {
        let Replica { id: peer, url, address } = peer;
        // However the relay ends (its task may be aborted), what it brought is withdrawn.
        let mut ending = LinkEnd { relays: self.clone(), link, reason: format!("the relay to replica {peer} ended") };
        let (upstream, requests) = mpsc::unbounded_channel();
        let hello = |offer: &Offer| wire::RelayStepsRequest {
            message: Some(relay_steps_request::Message::Hello(relay_hello(&self.engine.replica, offer))),
        };
        let _ = upstream.send(hello(&offers.borrow_and_update()));
        let ended = async {
            let channel = self.security.channel_at(&url, &address).map_err(|error| error.to_string())?;
            let mut inbound = ExecutionServiceClient::new(channel)
                .relay_steps(UnboundedReceiverStream::new(requests))
                .await
                .map_err(|status| status.message().to_owned())?
                .into_inner();
            tracing::info!(%peer, %url, "offering this replica's workers to another replica");
            let mut heartbeat = tokio::time::interval(self.engine.settings.worker_lease / 3);
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(RelayFrame { worker: Some(frame) })) => {
                            if let Some(lease) = self.from_peer(link, &upstream, frame) {
                                heartbeat = tokio::time::interval(lease.min(self.engine.settings.worker_lease) / 3);
                            }
                        }
                        Ok(Some(RelayFrame { worker: None })) => {}
                        Ok(None) => return Err("the other replica ended the relay".to_owned()),
                        Err(status) => return Err(status.message().to_owned()),
                    },
                    changed = offers.changed() => {
                        if changed.is_err() {
                            return Ok(());
                        }
                        let _ = upstream.send(hello(&offers.borrow_and_update()));
                    }
                    _ = heartbeat.tick() => {
                        let heartbeat = connect_worker_request::Message::Heartbeat(wire::WorkerHeartbeat {});
                        let message = wire::ConnectWorkerRequest { message: Some(heartbeat) };
                        let _ = upstream.send(wire::RelayStepsRequest {
                            message: Some(relay_steps_request::Message::Worker(message)),
                        });
                    }
                }
            }
        };
        match ended.await {
            Ok(()) => ending.reason = "this replica stopped offering its workers".to_owned(),
            Err(error) => {
                tracing::info!(%peer, %url, %error, "the relay to another replica ended");
                ending.reason = format!("the relay to replica {peer} ended: {error}");
            }
        }
    }

    /// Withdraws here what a relay that ended brought.
    fn end_link(&self, link: u64, reason: &str) {
        self.handing_off().retain(|_, (through, _)| *through != link);
        let ended: Vec<Relayed> = {
            let mut relayed = self.relayed();
            let ids: Vec<String> =
                relayed.iter().filter(|(_, entry)| entry.link == link).map(|(id, _)| id.clone()).collect();
            ids.iter().filter_map(|id| relayed.remove(id)).collect()
        };
        for entry in ended {
            let _ = entry.stop.send(Stop::Withdrawn(reason.to_owned()));
        }
    }

    /// Acts on a message from the replica a relay goes to; the lease it
    /// gives when the message is its welcome.
    fn from_peer(
        self: &Arc<Self>,
        link: u64,
        upstream: &mpsc::UnboundedSender<wire::RelayStepsRequest>,
        frame: WorkerFrame,
    ) -> Option<Duration> {
        use connect_worker_response::Message;
        let response = match frame {
            // Passed on to the worker as it came: its shared memory is
            // neither decoded nor encoded again here.
            WorkerFrame::Assignment { assignment, shared_memory } => {
                let (assignment_id, agent_id) = (assignment.assignment_id.clone(), assignment.agent_id.clone());
                let encoded = WorkerFrame::Assignment { assignment, shared_memory }.encode_to_vec();
                self.relay_assignment(link, upstream, assignment_id, agent_id, encoded.into());
                return None;
            }
            WorkerFrame::Message(message) => message,
            encoded @ WorkerFrame::Encoded(_) => encoded.to_message().ok()?,
        };
        match &response.message {
            Some(Message::Welcome(welcome)) => {
                return welcome
                    .lease
                    .as_ref()
                    .and_then(|lease| muster_runtime::time::from_duration(Some(lease)).ok())
                    .map(Duration::from_millis);
            }
            Some(Message::Assignment(assignment)) => {
                let (assignment_id, agent_id) = (assignment.assignment_id.clone(), assignment.agent_id.clone());
                self.relay_assignment(link, upstream, assignment_id, agent_id, response.encode_to_vec().into());
            }
            Some(Message::Cancel(cancel)) => {
                if let Some(entry) = self.relayed().remove(&cancel.assignment_id) {
                    let _ = entry.stop.send(Stop::Withdrawn(cancel.reason.clone()));
                }
            }
            Some(Message::ToolCall(call)) => {
                let call = tool_call_from_wire(call.clone());
                let (engine, upstream) = (self.engine.clone(), upstream.clone());
                tokio::spawn(async move {
                    let call_id = call.call_id.clone();
                    let output = match engine.workers.call_local_tool(call) {
                        None => {
                            ToolOutput::error(404, "no worker connected to the replica provides the tool".to_owned())
                        }
                        Some(answer) => match tokio::time::timeout(tools::TOOL_CALL_LIMIT, answer).await {
                            Ok(Ok(output)) => output,
                            Ok(Err(_)) => ToolOutput::error(500, "the provider went away during the call".to_owned()),
                            Err(_) => {
                                engine.workers.abandon_tool_call(&call_id);
                                ToolOutput::error(500, "the provider did not answer in time".to_owned())
                            }
                        },
                    };
                    let result = wire::ToolCallResult { call_id, output: Some(tool_output_to_wire(output)) };
                    let message = connect_worker_request::Message::ToolResult(result);
                    let _ = upstream.send(wire::RelayStepsRequest {
                        message: Some(relay_steps_request::Message::Worker(wire::ConnectWorkerRequest {
                            message: Some(message),
                        })),
                    });
                });
            }
            Some(Message::Delegation(answer)) => {
                let asking = self.handing_off().remove(&answer.assignment_id);
                if let Some((_, worker_id)) = asking {
                    let encoded = bytes::Bytes::from(response.encode_to_vec());
                    self.engine.workers.send_to(worker_id, ToWorker::Relayed(encoded));
                }
            }
            None => {}
        }
        None
    }

    /// An assignment from the peer (`encoded`, the whole message) held for
    /// a local worker, once.
    fn relay_assignment(
        self: &Arc<Self>,
        link: u64,
        upstream: &mpsc::UnboundedSender<wire::RelayStepsRequest>,
        assignment_id: String,
        agent_id: String,
        encoded: bytes::Bytes,
    ) {
        let (stop, stopped) = oneshot::channel();
        let mut relayed = self.relayed();
        if relayed.contains_key(&assignment_id) {
            return;
        }
        relayed.insert(assignment_id.clone(), Relayed { link, upstream: upstream.clone(), stop });
        drop(relayed);
        tokio::spawn(self.clone().hold(assignment_id, agent_id, encoded, stopped));
    }

    /// Gives a relayed assignment to a worker connected here, again if that
    /// worker goes away, until its report went back or it is withdrawn.
    async fn hold(
        self: Arc<Self>,
        assignment_id: String,
        agent_id: String,
        message: bytes::Bytes,
        mut stopped: oneshot::Receiver<Stop>,
    ) {
        let workers = &self.engine.workers;
        let (driver, mut inputs) = mpsc::unbounded_channel();
        let route = Route { driver, position: 0, attempt: 0 };
        let send = |slot: crate::engine::workers::Slot| {
            slot.send_relayed(assignment_id.clone(), agent_id.clone(), message.clone(), route.clone());
        };
        if let Some(slot) = workers.acquire_local(&agent_id, route.clone()) {
            send(slot);
        }
        loop {
            tokio::select! {
                input = inputs.recv() => match input {
                    Some(Input::WorkerReady { slot, .. }) => send(slot),
                    // The worker went away: the next one with room takes it.
                    Some(Input::Report { outcome: Outcome::WorkerLost, .. }) => {
                        if let Some(slot) = workers.acquire_local(&agent_id, route.clone()) {
                            send(slot);
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                stop = &mut stopped => {
                    if let Ok(Stop::Withdrawn(reason)) = stop {
                        workers.withdraw(&assignment_id, &reason);
                        workers.stop_waiting(&agent_id, &route);
                    }
                    return;
                }
            }
        }
    }
}

/// Ends a relay: withdraws here what it brought.
struct LinkEnd {
    relays: Arc<Relays>,
    link: u64,
    reason: String,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        self.relays.end_link(self.link, &self.reason);
    }
}

/// What this replica offers another, on the wire.
fn relay_hello(replica: &str, offer: &Offer) -> wire::RelayHello {
    wire::RelayHello {
        replica: replica.to_owned(),
        agents: offer
            .agents
            .iter()
            .map(|(agent_id, token)| wire::RelayedAgent { agent_id: agent_id.clone(), token_sha256: token.0.to_vec() })
            .collect(),
        tools: offer.tools.iter().map(tool_to_wire).collect(),
        max_concurrency: u32::try_from(offer.max_concurrency).unwrap_or(u32::MAX),
    }
}

/// What another replica offers, checked.
fn offer_from_wire(hello: wire::RelayHello) -> Result<(String, Vec<ServedAgent>, Vec<Tool>, usize)> {
    if hello.replica.is_empty() || hello.replica.len() > MAX_REPLICA_NAME {
        return Err(Error::invalid(
            "hello.replica",
            format!("a relay names its replica in 1 to {MAX_REPLICA_NAME} bytes"),
        ));
    }
    let agents = hello
        .agents
        .into_iter()
        .map(|agent| match TokenHash::from_bytes(&agent.token_sha256) {
            Some(token) => Ok(ServedAgent { agent_id: agent.agent_id, token }),
            None => Err(Error::invalid(
                "hello.agents.token_sha256",
                format!("the token hash of agent '{}' is not 32 bytes", agent.agent_id),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    let tools =
        hello.tools.into_iter().map(tool_from_wire).collect::<std::result::Result<Vec<_>, _>>().map_err(|problem| {
            Error::invalid("hello.tools.input_schema", format!("a tool's input_schema {problem}"))
        })?;
    tools::check_tool_specs(&tools)?;
    Ok((hello.replica, agents, tools, hello.max_concurrency as usize))
}

impl ExecutionGrpc {
    /// Registers another replica's offer as one worker and serves its stream.
    pub(super) async fn relay_steps(
        &self,
        caller: Caller,
        mut inbound: Streaming<wire::RelayStepsRequest>,
    ) -> std::result::Result<ResponseStream<RelayFrame>, Status> {
        if !caller.is_service("execution") {
            return Err(denied(
                &caller,
                "relay steps",
                "NOT_A_REPLICA",
                "only the replicas of the execution service relay steps to each other",
                Vec::new(),
            )
            .into());
        }
        let hello = match inbound.message().await? {
            Some(wire::RelayStepsRequest { message: Some(relay_steps_request::Message::Hello(hello)) }) => hello,
            _ => return Err(Error::invalid("hello", "the first message of a relay must be a RelayHello").into()),
        };
        let (replica, agents, tools, room) = offer_from_wire(hello)?;
        let (sender, outbound) = mpsc::unbounded_channel();
        let worker_id = self.engine.workers.register(Connection {
            name: format!("replica {replica}"),
            agents,
            tools,
            max_concurrency: room,
            opened_with: None,
            relayed_by: Some(replica),
            sender,
        });
        let engine = self.engine.clone();
        tokio::spawn(async move {
            serve_relay(worker_id, &mut inbound, &engine).await;
            engine.workers.unregister(worker_id);
        });
        // Windows whole: the worker behind the other replica counts what
        // reaches it from every replica, which no one of them sees.
        let messages = self.outbound(worker_id, outbound, super::windows::Windows::default());
        Ok(Box::pin(messages.map(|message| message.map(|worker| RelayFrame { worker: Some(worker) }))))
    }
}

/// Reads another replica's relay until it ends.
async fn serve_relay(worker_id: u64, inbound: &mut Streaming<wire::RelayStepsRequest>, engine: &Arc<Engine>) {
    loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => message,
            Ok(None) => return,
            Err(status) => {
                tracing::info!(worker_id, error = %status.message(), "relay from another replica ended");
                return;
            }
        };
        engine.workers.touch(worker_id);
        let flow = match message.message {
            Some(relay_steps_request::Message::Hello(hello)) => match offer_from_wire(hello) {
                Ok((_, agents, tools, room)) => {
                    engine.workers.update(worker_id, agents, tools, room);
                    ControlFlow::Continue(())
                }
                Err(error) => {
                    tracing::warn!(worker_id, %error, "a relay's new offer is not valid; ending it");
                    ControlFlow::Break(())
                }
            },
            Some(relay_steps_request::Message::Worker(message)) => {
                handle_worker_message(worker_id, message, engine).await
            }
            None => ControlFlow::Continue(()),
        };
        if flow.is_break() {
            return;
        }
    }
}
