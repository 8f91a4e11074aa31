//! The gRPC face of the execution service: wire types in, engine calls,
//! wire types out; every failure is an [`Error`] and becomes a status
//! through its one table. Who may call what is in [`access`]; the methods
//! live by subject: [`processes`], [`executions`], [`decisions`] (approvals
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
use tokio::sync::mpsc;
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    Error, Result,
    clients::roster::{AgentInfo, RosterFailure},
    domain::{model::ProcessVersion, payload},
    engine::Engine,
};

mod access;
mod budget;
pub(crate) mod convert;
mod decisions;
mod executions;
mod forward;
mod inbox;
mod matrix;
mod memory;
mod paging;
mod processes;
mod relay;
mod sessions;
mod streams;
mod tools;
mod windows;
mod worker_messages;

pub use access::ACCESS;
use convert::{Shown, execution_to_wire, process_to_wire};
use paging::{key_token, page_size};
use streams::stream_events;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

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

    /// An agent of the roster ([`Engine::roster_agent`]: its `offline` may
    /// lag); FAILED_PRECONDITION naming `what` when it is not in it.
    async fn roster_agent(&self, agent_id: &str, what: &str) -> Result<AgentInfo> {
        roster_answer(agent_id, what, self.engine.roster_agent(agent_id).await)
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
        self.where_driven(
            request,
            |request| &request.id,
            |mut peer, request| async move { peer.cancel_execution(request).await },
            |caller, request| async move {
                let execution = self.cancel(&caller, request).await?;
                Ok(wire::CancelExecutionResponse { execution: Some(execution) })
            },
        )
        .await
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
            self.invoke_tool_as(&caller, request.into_inner()).await.map(|output| wire::InvokeToolResponse {
                output: Some(crate::grpc::convert::tool_output_to_wire(output)),
            }),
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
            crate::grpc::convert::tool_to_wire,
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
        self.where_driven(
            request,
            |request| &request.execution_id,
            |mut peer, request| async move { peer.submit_approval(request).await },
            |caller, request| async move { self.decide(&caller, request).await },
        )
        .await
    }

    async fn intervene(
        &self,
        request: Request<wire::InterveneRequest>,
    ) -> Result<Response<wire::InterveneResponse>, Status> {
        self.where_driven(
            request,
            |request| &request.execution_id,
            |mut peer, request| async move { peer.intervene(request).await },
            |caller, request| async move { self.intervene_as(&caller, request).await },
        )
        .await
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
        self.where_driven(
            request,
            |request| &request.execution_id,
            |mut peer, request| async move { peer.assign_role(request).await },
            |caller, request| async move { self.assign_role_as(&caller, request).await },
        )
        .await
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
        self.where_driven(
            request,
            |request| &request.execution_id,
            |mut peer, request| async move { peer.set_lead(request).await },
            |caller, request| async move { self.set_lead_as(&caller, request).await },
        )
        .await
    }

    async fn request_subtask(
        &self,
        request: Request<wire::RequestSubtaskRequest>,
    ) -> Result<Response<wire::RequestSubtaskResponse>, Status> {
        self.where_driven(
            request,
            |request| &request.execution_id,
            |mut peer, request| async move { peer.request_subtask(request).await },
            |caller, request| async move { self.request_subtask_as(&caller, request).await },
        )
        .await
    }

    async fn decide_subtask(
        &self,
        request: Request<wire::DecideSubtaskRequest>,
    ) -> Result<Response<wire::DecideSubtaskResponse>, Status> {
        self.where_driven(
            request,
            |request| &request.execution_id,
            |mut peer, request| async move { peer.decide_subtask(request).await },
            |caller, request| async move { self.decide_subtask_as(&caller, request).await },
        )
        .await
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
