//! The gRPC face of the execution service: wire types in, engine calls,
//! wire types out; every failure is an [`Error`] and becomes a status
//! through its one table. Who may call what is in [`access`]; the methods
//! live by subject: processes and executions here, [`decisions`] (approvals
//! and interventions), [`sessions`], [`matrix`], [`tools`], [`inbox`],
//! [`budget`] and the long-lived [`streams`] (workers, watches).

use std::{pin::Pin, sync::Arc};

use muster_proto::{
    execution::v1::{self as wire, framed::execution_service_server::ExecutionService},
    frame::{RelayFrame, WorkerFrame},
};
use muster_runtime::{
    auth::{AgentDirectory, Caller},
    security::Security,
};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    Error, Result,
    clients::roster::{AgentInfo, RosterFailure},
    domain::{
        authority::Session,
        model::{EventKind, Execution, ProcessVersion, Step},
        payload::{self, PayloadKind},
    },
    engine::{Control, Engine, StartRequest},
    store::ExecutionFilter,
    wire::{execution_status_from_wire, payload_kind_from_wire},
};

mod access;
mod budget;
mod convert;
mod decisions;
mod forward;
mod inbox;
mod matrix;
mod memory;
mod relay;
mod sessions;
mod streams;
mod tools;

pub use access::ACCESS;
use convert::{Shown, execution_to_wire, process_to_wire};
use streams::stream_events;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Longest source of a process accepted for publishing, in bytes: 64 KiB
/// under the default message limit leaves room, in GetProcess's answer,
/// for the version's kept warnings beside its source.
const MAX_SOURCE_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;
/// Longest execution inputs, in bytes.
const MAX_INPUTS_BYTES: usize = 1024 * 1024;
/// Longest idempotency key, in bytes.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
/// Rows of a list page when the caller does not say, and at most.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// The ExecutionService implementation.
pub(crate) struct ExecutionGrpc {
    engine: Arc<Engine>,
    /// The agents' credentials, to check the tokens a worker presents.
    agents: AgentDirectory,
    /// The tools and actions each role lists, to authorise tool calls,
    /// providers, and agents' actions outside sessions.
    role_grants: tools::RoleGrantsCache,
    /// The largest message the service sends: a bigger assignment fails its
    /// step instead of breaking the worker's stream.
    max_message_bytes: usize,
    /// The other replicas, which answer the calls about the executions they drive.
    peers: forward::Peers,
    /// The steps other replicas relayed to the workers connected here.
    relays: Arc<relay::Relays>,
}

/// The page size asked for, within bounds.
fn page_size(asked: u32) -> u32 {
    if asked == 0 { DEFAULT_PAGE } else { asked.min(MAX_PAGE) }
}

/// Where a page that this service ends with `<time>/<id>` goes on from;
/// `None` for the first page.
/// A page token that names a position by key (a name): refused when it is
/// not one this service could have given.
fn key_token(page_token: &str) -> Result<()> {
    if muster_runtime::paging::is_key_token(page_token) {
        Ok(())
    } else {
        Err(Error::invalid("page_token", muster_runtime::paging::MALFORMED_TOKEN))
    }
}

fn time_and_id(page_token: &str) -> Result<Option<(i64, String)>> {
    if page_token.is_empty() {
        return Ok(None);
    }
    let token_error = || Error::invalid("page_token", "page_token is not one this service gave");
    let (time, id) = page_token.split_once('/').ok_or_else(token_error)?;
    Ok(Some((time.parse::<i64>().map_err(|_| token_error())?, id.to_owned())))
}

/// Longest role name.
const MAX_ROLE_BYTES: usize = 64;

/// Whether `name` can name a role of the roster: 1 to 64 letters, digits,
/// '-', '_' and '.'.
fn is_role_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ROLE_BYTES
        && name.chars().all(|character| character.is_ascii_alphanumeric() || "-_.".contains(character))
}

/// An agent of the roster; FAILED_PRECONDITION naming `what` when it is not in it.
fn roster_answer(
    agent_id: &str,
    what: &str,
    answer: std::result::Result<AgentInfo, RosterFailure>,
) -> Result<AgentInfo> {
    match answer {
        Ok(agent) => Ok(agent),
        Err(RosterFailure::NotFound(_)) => Err(Error::precondition(
            "AGENT_NOT_IN_ROSTER",
            format!("agent/{agent_id}"),
            format!("{what} '{agent_id}' is not in the roster"),
        )),
        Err(RosterFailure::Unavailable(detail)) => Err(Error::Unavailable { service: "roster", detail }),
        Err(RosterFailure::Refused(message)) => {
            Err(Error::precondition("ROSTER_REFUSED", format!("agent/{agent_id}"), format!("roster: {message}")))
        }
    }
}

impl ExecutionGrpc {
    pub(crate) fn new(engine: Arc<Engine>, security: Security, max_message_bytes: usize) -> Self {
        Self {
            agents: security.agents().clone(),
            role_grants: tools::RoleGrantsCache::default(),
            max_message_bytes,
            peers: forward::Peers::new(security.clone()),
            relays: Arc::new(relay::Relays::new(engine.clone(), security)),
            engine,
        }
    }

    /// Relays steps between this replica and the others, for as long as it runs.
    pub(crate) fn relays(&self) -> Arc<relay::Relays> {
        self.relays.clone()
    }

    /// An agent of the roster; FAILED_PRECONDITION naming `what` when it is not in it.
    async fn roster_agent(&self, agent_id: &str, what: &str) -> Result<AgentInfo> {
        roster_answer(agent_id, what, self.engine.roster.agent(agent_id.to_owned()).await)
    }

    async fn publish(&self, request: wire::PublishProcessRequest) -> Result<wire::PublishProcessResponse> {
        if request.source.trim().is_empty() {
            return Err(Error::invalid("source", "source is empty: send the process YAML"));
        }
        if request.source.len() > MAX_SOURCE_BYTES {
            return Err(Error::invalid(
                "source",
                format!("source has {} bytes; at most {MAX_SOURCE_BYTES} are accepted", request.source.len()),
            ));
        }
        let (process, new) = self.engine.publish(request.source).await?;
        if new {
            tracing::info!(process = %process.name, version = process.version, "process published");
        }
        let process = process_to_wire(&process, Shown::Warnings);
        Ok(wire::PublishProcessResponse {
            diagnostics: process.warnings.clone(),
            process: Some(process),
            unchanged: !new,
        })
    }

    /// The process version to start, checked: steps this server can run,
    /// named executors in the roster, inputs a JSON object.
    async fn prepare_start(
        &self,
        process_name: &str,
        version: u32,
        inputs: Option<&prost_types::Struct>,
    ) -> Result<(Arc<ProcessVersion>, String)> {
        let version = (version != 0).then_some(version);
        let process = self.engine.process(process_name, version).await?.ok_or_else(|| {
            Error::not_found(
                "muster.execution.v1.Process",
                process_name,
                match version {
                    Some(version) => format!("process '{process_name}' has no version {version}"),
                    None => format!("no process named '{process_name}' is published"),
                },
            )
        })?;
        let inputs_json = muster_runtime::json::struct_to_text(inputs)
            .map_err(|problem| Error::invalid("inputs", format!("inputs {problem}")))?;
        if inputs_json.len() > MAX_INPUTS_BYTES {
            return Err(Error::invalid(
                "inputs",
                format!("inputs are {} bytes of JSON; at most {MAX_INPUTS_BYTES} are accepted", inputs_json.len()),
            ));
        }
        // Every named executor must still be in the roster before anything
        // runs; each is asked about once. (An approval step's executor may be
        // a system name: people decide it.)
        let mut asked = std::collections::HashSet::new();
        for step in process.definition.steps.iter().filter(|step| step.step_type != crate::engine::HUMAN_APPROVAL) {
            if let Some(executor) = step.executor()
                && asked.insert(executor)
            {
                self.roster_agent(executor, &format!("step '{}': executor", step.id)).await?;
            }
        }
        Ok((process, inputs_json))
    }

    /// A client's idempotency key, checked: `None` when not given. (The
    /// id of what a keyed create makes is [`keyed_id`].)
    fn idempotency_key(key: String) -> Result<Option<String>> {
        if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(Error::invalid(
                "idempotency_key",
                format!("idempotency_key has {} bytes; at most {MAX_IDEMPOTENCY_KEY_BYTES} are accepted", key.len()),
            ));
        }
        Ok((!key.is_empty()).then_some(key))
    }

    async fn start(&self, request: wire::StartExecutionRequest) -> Result<wire::Execution> {
        let (process, inputs_json) =
            self.prepare_start(&request.process_name, request.process_version, request.inputs.as_ref()).await?;
        let lead_agent_id = if request.lead_agent_id.is_empty() {
            process.definition.lead.clone().unwrap_or_default()
        } else {
            request.lead_agent_id
        };
        if !lead_agent_id.is_empty() {
            self.roster_agent(&lead_agent_id, "lead").await?;
        }
        let execution = self
            .engine
            .start(StartRequest {
                process,
                inputs_json,
                lead_agent_id,
                idempotency_key: Self::idempotency_key(request.idempotency_key)?,
                session: None,
                claimed_messages: Vec::new(),
                fired_schedule: None,
            })
            .await?;
        self.execution_to_wire(execution).await
    }

    /// Starts a session from an already checked request.
    async fn start_as_session(
        &self,
        process_name: &str,
        process_version: u32,
        inputs: Option<&prost_types::Struct>,
        lead_agent_id: String,
        session: Session,
        idempotency_key: String,
    ) -> Result<wire::Execution> {
        let (process, inputs_json) = self.prepare_start(process_name, process_version, inputs).await?;
        // A session whose executors are not assigned in it would fail step
        // after step: it is refused before it starts.
        let refused =
            crate::engine::refused_steps(&self.engine.matrix(), &lead_agent_id, &session, &process.definition);
        if !refused.is_empty() {
            let shown = refused.len().min(5);
            return Err(Error::precondition(
                "SESSION_EXECUTORS_NOT_ALLOWED",
                format!("process/{}", process.name),
                format!(
                    "the session would fail: {}{}; give each step's executor a role in the session (participants)",
                    refused[..shown].join("; "),
                    if refused.len() > shown {
                        format!("; and {} more steps", refused.len() - shown)
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        let execution = self
            .engine
            .start(StartRequest {
                process,
                inputs_json,
                lead_agent_id,
                idempotency_key: Self::idempotency_key(idempotency_key)?,
                session: Some(session),
                claimed_messages: Vec::new(),
                fired_schedule: None,
            })
            .await?;
        self.execution_to_wire(execution).await
    }

    /// Hands a control to the execution's driver and waits for its answer.
    /// An execution that has ended, or ends before its driver reads the
    /// control, is FAILED_PRECONDITION; one whose driver stopped without
    /// ending it (the service shutting down) is UNAVAILABLE, to retry.
    async fn control(
        &self,
        execution_id: &str,
        control: impl FnOnce(tokio::sync::oneshot::Sender<Result<()>>) -> Control,
    ) -> Result<()> {
        // An unfinished execution no live replica drives (given back by a
        // replica that stopped, or of one whose lease lapsed) is taken over
        // here and now, rather than at the next look for orphans: the call
        // is answered, not refused as UNAVAILABLE.
        if !self.engine.drives(execution_id)
            && matches!(self.engine.store.driver_of(execution_id).await, Ok(None))
            && let Err(error) = self.engine.adopt().await
        {
            tracing::warn!(%execution_id, %error, "taking over executions no replica drives failed");
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.engine.control(execution_id, control(reply))
            && let Ok(outcome) = answer.await
        {
            return outcome;
        }
        match self.engine.store.execution(execution_id).await? {
            Some(execution) if execution.status.is_final() => Err(Error::precondition(
                "EXECUTION_ENDED",
                format!("execution/{execution_id}"),
                format!("execution '{execution_id}' has ended ({})", execution.status.as_str()),
            )),
            _ => Err(Error::NotRunningHere(execution_id.to_owned())),
        }
    }

    /// An execution (without its steps) and the process version it runs.
    async fn execution_and_process(&self, execution_id: &str) -> Result<(Execution, Arc<ProcessVersion>)> {
        let execution = self.engine.store.execution(execution_id).await?.ok_or_else(|| {
            Error::not_found(
                "muster.execution.v1.Execution",
                execution_id,
                format!("execution '{execution_id}' not found"),
            )
        })?;
        let process = self.engine.definition_of(&execution).await?;
        Ok((execution, process))
    }

    /// Most bytes of step outputs in an answer that shows an execution: 2 MiB,
    /// or half the message limit when that is less.
    fn outputs_room(&self) -> usize {
        (self.max_message_bytes / 2).min(2 * 1024 * 1024)
    }

    async fn steps(&self, execution_id: &str) -> Result<Vec<Step>> {
        Ok(self.engine.store.steps(execution_id).await?.into_iter().map(|(_, step)| step).collect())
    }

    /// An execution with its steps, as answers show it.
    async fn execution_to_wire(&self, execution: Execution) -> Result<wire::Execution> {
        let process = self.engine.definition_of(&execution).await?;
        let steps = self.steps(&execution.id).await?;
        Ok(execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room()))
    }

    async fn cancel(&self, caller: &Caller, request: wire::CancelExecutionRequest) -> Result<wire::Execution> {
        let mut live = self.engine.events.subscribe();
        let described = format!("cancel execution '{}'", request.id);
        let (execution, _) = self.execution_for(caller, &request.id, &described).await?;
        if let Some(agent_id) = caller.agent_id() {
            if execution.lead_agent_id != agent_id {
                return Err(access::denied(
                    caller,
                    described,
                    "NOT_THE_LEAD",
                    "only operators and the execution's lead may cancel it",
                    vec![("execution_id", request.id.clone())],
                ));
            }
            self.check_matrix_action(caller, &execution, "close_task", &described).await?;
        }
        if execution.status.is_final() {
            return Err(Error::precondition(
                "EXECUTION_ENDED",
                format!("execution/{}", request.id),
                format!("execution '{}' already ended ({})", request.id, execution.status.as_str()),
            ));
        }
        let reason =
            if request.reason.is_empty() { format!("cancelled by {}", caller.audit_name()) } else { request.reason };
        if self.engine.control(&request.id, Control::Cancel(reason)) {
            let finished = async {
                loop {
                    match live.recv().await {
                        Ok(event) if event.execution_id == request.id && event.kind == EventKind::ExecutionFinished => {
                            break;
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                        _ => {}
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), finished).await;
        }
        let execution = self.engine.store.execution(&request.id).await?.unwrap_or(execution);
        self.execution_to_wire(execution).await
    }

    /// The value a ReadPayload names, for a caller that may read its execution.
    async fn payload(&self, caller: &Caller, request: &wire::ReadPayloadRequest) -> Result<String> {
        let kind = payload_kind_from_wire(request.kind)
            .ok_or_else(|| Error::invalid("kind", "kind must be PAYLOAD_KIND_OUTPUT or PAYLOAD_KIND_INPUTS"))?;
        let described = format!("read a payload of execution '{}'", request.execution_id);
        let (execution, process) = self.execution_for(caller, &request.execution_id, &described).await?;
        let step = process.definition.steps.iter().find(|step| step.id == request.step_id).ok_or_else(|| {
            Error::not_found(
                "muster.execution.v1.StepState",
                format!("{}/{}", execution.id, request.step_id),
                format!("execution '{}' has no step '{}'", execution.id, request.step_id),
            )
        })?;
        match kind {
            PayloadKind::Inputs => {
                Ok(payload::merge_inputs(&payload::execution_inputs(&execution.inputs_json), &step.inputs_json))
            }
            PayloadKind::Output => self.engine.store.step_output(&execution.id, &step.id).await?.ok_or_else(|| {
                Error::precondition(
                    "STEP_HAS_NO_OUTPUT",
                    format!("step/{}", step.id),
                    format!("step '{}' has no output (yet)", step.id),
                )
            }),
        }
    }

    /// Executions, newest first; an agent's, the ones it takes part in.
    async fn list_executions(
        &self,
        caller: &Caller,
        request: wire::ListExecutionsRequest,
    ) -> Result<wire::ListExecutionsResponse> {
        let limit = page_size(request.limit);
        let after = time_and_id(&request.page_token)?;
        let filter = ExecutionFilter {
            process_name: (!request.process_name.is_empty()).then_some(request.process_name),
            status: muster_proto::common::v1::ExecutionStatus::try_from(request.status)
                .ok()
                .and_then(execution_status_from_wire),
            started_after: request.started_after.as_ref().map(muster_runtime::time::from_timestamp),
            started_before: request.started_before.as_ref().map(muster_runtime::time::from_timestamp),
            agent_id: caller.agent_id().map(str::to_owned),
            after,
            limit: limit + 1,
        };
        let mut executions = self.engine.store.list_executions(&filter).await?;
        let next_page_token = if executions.len() > limit as usize {
            executions.truncate(limit as usize);
            executions.last().map(|last| format!("{}/{}", last.started_at, last.id)).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(wire::ListExecutionsResponse {
            executions: executions.iter().map(|execution| execution_to_wire(execution, &[], None, 0)).collect(),
            next_page_token,
        })
    }

    async fn list_processes(&self, request: wire::ListProcessesRequest) -> Result<wire::ListProcessesResponse> {
        key_token(&request.page_token)?;
        let limit = page_size(request.page_size);
        let mut processes = self.engine.store.list_processes(&request.page_token, limit + 1).await?;
        let next_page_token = if processes.len() > limit as usize {
            processes.truncate(limit as usize);
            processes.last().map(|last| last.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(wire::ListProcessesResponse {
            processes: processes.iter().map(|process| process_to_wire(process, Shown::Count)).collect(),
            next_page_token,
        })
    }
}

/// A handler's answer: its error through the one table.
fn answer<T>(outcome: Result<T>) -> Result<Response<T>, Status> {
    outcome.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl ExecutionService for ExecutionGrpc {
    async fn publish_process(
        &self,
        request: Request<wire::PublishProcessRequest>,
    ) -> Result<Response<wire::PublishProcessResponse>, Status> {
        answer(self.publish(request.into_inner()).await)
    }

    async fn get_process(
        &self,
        request: Request<wire::GetProcessRequest>,
    ) -> Result<Response<wire::GetProcessResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let version = (request.version != 0).then_some(request.version);
        let found = self.engine.process(&request.name, version).await.and_then(|process| {
            process.ok_or_else(|| {
                Error::not_found(
                    "muster.execution.v1.Process",
                    &request.name,
                    format!("process '{}' not found", request.name),
                )
            })
        });
        // The source holds the steps' literal inputs: an agent reads them
        // only where ReadPayload would let it, in a process that names it.
        let shown = |process: &ProcessVersion| match caller.agent_id() {
            Some(agent_id) if !process.names(agent_id) => Shown::Count,
            _ => Shown::All,
        };
        answer(
            found.map(|process| wire::GetProcessResponse { process: Some(process_to_wire(&process, shown(&process))) }),
        )
    }

    async fn list_processes(
        &self,
        request: Request<wire::ListProcessesRequest>,
    ) -> Result<Response<wire::ListProcessesResponse>, Status> {
        answer(self.list_processes(request.into_inner()).await)
    }

    async fn start_execution(
        &self,
        request: Request<wire::StartExecutionRequest>,
    ) -> Result<Response<wire::StartExecutionResponse>, Status> {
        answer(
            self.start(request.into_inner())
                .await
                .map(|execution| wire::StartExecutionResponse { execution: Some(execution) }),
        )
    }

    async fn get_execution(
        &self,
        request: Request<wire::GetExecutionRequest>,
    ) -> Result<Response<wire::GetExecutionResponse>, Status> {
        let caller = Caller::of(&request)?;
        let id = request.into_inner().id;
        let outcome = async {
            let (execution, process) = self.execution_for(&caller, &id, &format!("read execution '{id}'")).await?;
            let steps = self.steps(&id).await?;
            Ok(wire::GetExecutionResponse {
                execution: Some(execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room())),
            })
        };
        answer(outcome.await)
    }

    type ReadPayloadStream = ResponseStream<wire::ReadPayloadResponse>;

    async fn read_payload(
        &self,
        request: Request<wire::ReadPayloadRequest>,
    ) -> Result<Response<Self::ReadPayloadStream>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        let value = self.payload(&caller, &request).await?;
        let size = value.len();
        let start = usize::try_from(request.offset).unwrap_or(usize::MAX);
        if start > size {
            let message = format!("offset {start} is past the end of the {size}-byte value");
            return Err(Error::OutOfRange { field: "offset", message }.into());
        }
        // One chunk at least, so that a read from the end still learns the size.
        let offsets = (start..size.max(start + 1)).step_by(payload::CHUNK_BYTES);
        let chunks = offsets.map(move |offset| {
            let end = (offset + payload::CHUNK_BYTES).min(size);
            Ok(wire::ReadPayloadResponse {
                chunk: value.as_bytes()[offset.min(end)..end].to_vec(),
                offset: offset as u64,
                size_bytes: size as u64,
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn list_executions(
        &self,
        request: Request<wire::ListExecutionsRequest>,
    ) -> Result<Response<wire::ListExecutionsResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.list_executions(&caller, request.into_inner()).await)
    }

    type WatchExecutionStream = ResponseStream<wire::WatchExecutionResponse>;

    async fn watch_execution(
        &self,
        request: Request<wire::WatchExecutionRequest>,
    ) -> Result<Response<Self::WatchExecutionStream>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        // Subscribe before reading the history, so nothing falls between the two.
        let live = self.engine.events.subscribe();
        let described = format!("watch execution '{}'", request.execution_id);
        self.execution_for(&caller, &request.execution_id, &described).await?;
        let (sender, receiver) = mpsc::channel(256);
        let engine = self.engine.clone();
        tokio::spawn(async move {
            if let Err(status) =
                stream_events(&engine, &request.execution_id, request.after_sequence, live, &sender).await
            {
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn cancel_execution(
        &self,
        request: Request<wire::CancelExecutionRequest>,
    ) -> Result<Response<wire::CancelExecutionResponse>, Status> {
        let id = request.get_ref().id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.cancel_execution(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(
            self.cancel(&caller, request.into_inner())
                .await
                .map(|execution| wire::CancelExecutionResponse { execution: Some(execution) }),
        )
    }

    type ConnectWorkerStream = ResponseStream<WorkerFrame>;

    async fn connect_worker(
        &self,
        request: Request<Streaming<wire::ConnectWorkerRequest>>,
    ) -> Result<Response<Self::ConnectWorkerStream>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.connect(caller, request.into_inner()).await?))
    }

    type RelayStepsStream = ResponseStream<RelayFrame>;

    async fn relay_steps(
        &self,
        request: Request<Streaming<wire::RelayStepsRequest>>,
    ) -> Result<Response<Self::RelayStepsStream>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.relay_steps(caller, request.into_inner()).await?))
    }

    async fn list_workers(
        &self,
        request: Request<wire::ListWorkersRequest>,
    ) -> Result<Response<wire::ListWorkersResponse>, Status> {
        let request = request.into_inner();
        let limit = page_size(request.page_size) as usize;
        let after: u64 = if request.page_token.is_empty() {
            0
        } else {
            match request.page_token.parse() {
                Ok(after) => after,
                Err(_) => {
                    return answer(Err(Error::invalid("page_token", "page_token is not one this service gave")));
                }
            }
        };
        let mut workers: Vec<_> =
            self.engine.workers.list().into_iter().filter(|worker| worker.worker_id > after).collect();
        let next_page_token = if workers.len() > limit {
            workers.truncate(limit);
            workers.last().map(|last| last.worker_id.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(wire::ListWorkersResponse {
            workers: workers.iter().map(convert::worker_to_wire).collect(),
            next_page_token,
        }))
    }

    async fn invoke_tool(
        &self,
        request: Request<wire::InvokeToolRequest>,
    ) -> Result<Response<wire::InvokeToolResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(
            self.invoke_tool_as(&caller, request.into_inner())
                .await
                .map(|output| wire::InvokeToolResponse { output: Some(crate::wire::tool_output_to_wire(output)) }),
        )
    }

    async fn list_tools(
        &self,
        request: Request<wire::ListToolsRequest>,
    ) -> Result<Response<wire::ListToolsResponse>, Status> {
        let request = request.into_inner();
        key_token(&request.page_token)?;
        let tools = self.engine.workers.tools();
        let (tools, next_page_token) = muster_runtime::paging::page(
            &tools,
            |tool| &tool.name,
            crate::wire::tool_to_wire,
            page_size(request.page_size) as usize,
            &request.page_token,
            1024 * 1024,
        );
        Ok(Response::new(wire::ListToolsResponse { tools, next_page_token }))
    }

    async fn submit_approval(
        &self,
        request: Request<wire::SubmitApprovalRequest>,
    ) -> Result<Response<wire::SubmitApprovalResponse>, Status> {
        let id = request.get_ref().execution_id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.submit_approval(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(self.decide(&caller, request.into_inner()).await)
    }

    async fn intervene(
        &self,
        request: Request<wire::InterveneRequest>,
    ) -> Result<Response<wire::InterveneResponse>, Status> {
        let id = request.get_ref().execution_id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.intervene(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(self.intervene_as(&caller, request.into_inner()).await)
    }

    async fn start_session(
        &self,
        request: Request<wire::StartSessionRequest>,
    ) -> Result<Response<wire::StartSessionResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.start_session_as(&caller, request.into_inner()).await)
    }

    async fn assign_role(
        &self,
        request: Request<wire::AssignRoleRequest>,
    ) -> Result<Response<wire::AssignRoleResponse>, Status> {
        let id = request.get_ref().execution_id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.assign_role(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(self.assign_role_as(&caller, request.into_inner()).await)
    }

    async fn get_my_role(
        &self,
        request: Request<wire::GetMyRoleRequest>,
    ) -> Result<Response<wire::GetMyRoleResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.my_role(&caller, request.into_inner()).await)
    }

    async fn check_role(
        &self,
        request: Request<wire::CheckRoleRequest>,
    ) -> Result<Response<wire::CheckRoleResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.check_role_as(&caller, request.into_inner()).await)
    }

    async fn set_lead(
        &self,
        request: Request<wire::SetLeadRequest>,
    ) -> Result<Response<wire::SetLeadResponse>, Status> {
        let id = request.get_ref().execution_id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.set_lead(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(self.set_lead_as(&caller, request.into_inner()).await)
    }

    async fn request_subtask(
        &self,
        request: Request<wire::RequestSubtaskRequest>,
    ) -> Result<Response<wire::RequestSubtaskResponse>, Status> {
        let id = request.get_ref().execution_id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.request_subtask(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(self.request_subtask_as(&caller, request.into_inner()).await)
    }

    async fn decide_subtask(
        &self,
        request: Request<wire::DecideSubtaskRequest>,
    ) -> Result<Response<wire::DecideSubtaskResponse>, Status> {
        let id = request.get_ref().execution_id.clone();
        if let Some(answer) =
            self.hand_over(&request, &id, |mut peer, request| async move { peer.decide_subtask(request).await }).await
        {
            return answer;
        }
        let caller = Caller::of(&request)?;
        answer(self.decide_subtask_as(&caller, request.into_inner()).await)
    }

    async fn get_session_status(
        &self,
        request: Request<wire::GetSessionStatusRequest>,
    ) -> Result<Response<wire::GetSessionStatusResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.session_status(&caller, request.into_inner()).await)
    }

    async fn put_permission_matrix(
        &self,
        request: Request<wire::PutPermissionMatrixRequest>,
    ) -> Result<Response<wire::PutPermissionMatrixResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.put_matrix(&caller, request.into_inner()).await)
    }

    async fn get_permission_matrix(
        &self,
        request: Request<wire::GetPermissionMatrixRequest>,
    ) -> Result<Response<wire::GetPermissionMatrixResponse>, Status> {
        answer(self.get_matrix(request.into_inner()).await)
    }

    async fn list_permission_matrix_versions(
        &self,
        request: Request<wire::ListPermissionMatrixVersionsRequest>,
    ) -> Result<Response<wire::ListPermissionMatrixVersionsResponse>, Status> {
        answer(self.list_matrices(request.into_inner()).await)
    }

    async fn post_to_inbox(
        &self,
        request: Request<wire::PostToInboxRequest>,
    ) -> Result<Response<wire::PostToInboxResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.post(&caller, request.into_inner()).await)
    }

    async fn list_inbox_messages(
        &self,
        request: Request<wire::ListInboxMessagesRequest>,
    ) -> Result<Response<wire::ListInboxMessagesResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.list_inbox(&caller, request.into_inner()).await)
    }

    async fn archive_inbox_message(
        &self,
        request: Request<wire::ArchiveInboxMessageRequest>,
    ) -> Result<Response<wire::ArchiveInboxMessageResponse>, Status> {
        answer(self.archive(request.into_inner()).await)
    }

    async fn set_budget(
        &self,
        request: Request<wire::SetBudgetRequest>,
    ) -> Result<Response<wire::SetBudgetResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.set_budget(&caller, request.into_inner()).await)
    }

    async fn list_budgets(
        &self,
        request: Request<wire::ListBudgetsRequest>,
    ) -> Result<Response<wire::ListBudgetsResponse>, Status> {
        answer(self.list_budgets(request.into_inner()).await)
    }

    async fn list_schedules(
        &self,
        request: Request<wire::ListSchedulesRequest>,
    ) -> Result<Response<wire::ListSchedulesResponse>, Status> {
        let request = request.into_inner();
        let size = page_size(request.page_size);
        let answer_page = async {
            key_token(&request.page_token)?;
            let states = self.engine.store.schedules(&request.page_token, size).await?;
            let next_page_token = match states.last() {
                Some(last) if states.len() == size as usize => last.process_name.clone(),
                _ => String::new(),
            };
            let schedules = states
                .into_iter()
                .map(|state| wire::Schedule {
                    process_name: state.process_name,
                    cron: state.cron,
                    time_zone: state.time_zone,
                    missed: state.missed.as_str().to_owned(),
                    next_fire_at: Some(muster_runtime::time::to_timestamp(state.next_fire_at)),
                    last_fired_at: state.last_fired_at.map(muster_runtime::time::to_timestamp),
                    last_execution_id: state.last_execution_id,
                })
                .collect();
            Ok(wire::ListSchedulesResponse { schedules, next_page_token })
        };
        answer(answer_page.await)
    }

    async fn list_memory(
        &self,
        request: Request<wire::ListMemoryRequest>,
    ) -> Result<Response<wire::ListMemoryResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.list_memory(&caller, request.into_inner()).await)
    }

    async fn append_memory(
        &self,
        request: Request<wire::AppendMemoryRequest>,
    ) -> Result<Response<wire::AppendMemoryResponse>, Status> {
        let caller = Caller::of(&request)?;
        answer(self.append_memory(&caller, request.into_inner()).await)
    }

    async fn forget_memory(
        &self,
        request: Request<wire::ForgetMemoryRequest>,
    ) -> Result<Response<wire::ForgetMemoryResponse>, Status> {
        answer(self.forget_memory(request.into_inner()).await)
    }
}

/// The id of what a create with an idempotency key makes (a UUID of version
/// 8 from a hash of the three): the same for the same kind, caller and key,
/// so a retry finds what the first call made.
fn keyed_id(kind: &str, caller: &str, key: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::new()
        .chain_update(kind)
        .chain_update([0])
        .chain_update(caller)
        .chain_update([0])
        .chain_update(key)
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
}
