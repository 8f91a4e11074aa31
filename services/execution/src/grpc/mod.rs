//! The gRPC face of the execution service: wire types in, domain calls,
//! wire types out. Errors become statuses through `From<Error> for Status`.
//! Who may call what is in [`access`]; the methods live by subject:
//! processes and executions here, [`decisions`] (approvals and
//! interventions), [`sessions`], [`matrix`], [`tools`] and the long-lived
//! [`streams`] (workers, watches).

use std::{pin::Pin, sync::Arc};

use muster_format::ProcessDefinition;
use muster_proto::{
    common::v1::{self as common, EventType},
    execution::v1::{self as wire, execution_service_server::ExecutionService},
    roster::v1 as roster,
    validator::v1 as validator,
};
use muster_runtime::{
    auth::{AgentDirectory, Caller, permission_denied},
    status::unimplemented,
};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    Error, Result,
    clients::{ValidatorClient, all_agents, dependency_error},
    domain::{ExecutionStatus, authority::Session},
    engine::{Control, Engine, StartRequest, parse_definition},
    store::{ExecutionFilter, ExecutionRow, ProcessRow},
};

mod access;
mod convert;
mod decisions;
mod matrix;
mod sessions;
mod streams;
mod tools;

pub use access::ACCESS;
use convert::{execution_to_wire, process_to_wire};
use streams::stream_events;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The ExecutionService implementation.
pub(crate) struct ExecutionApi {
    engine: Arc<Engine>,
    validator: ValidatorClient,
    /// The agents' credentials, to check the tokens a worker presents.
    agents: AgentDirectory,
    /// The tools each role lists, to authorise tool calls and providers.
    role_tools: tools::RoleTools,
}

/// What a start needs: the process version, its definition, the inputs.
struct Prepared {
    process: ProcessRow,
    definition: Arc<ProcessDefinition>,
    inputs_json: String,
}

impl ExecutionApi {
    pub(crate) fn new(engine: Arc<Engine>, validator: ValidatorClient, agents: AgentDirectory) -> Self {
        Self { engine, validator, agents, role_tools: tools::RoleTools::default() }
    }

    /// What the validator should know: the roster's agents and roles.
    async fn validation_context(&self) -> Result<validator::ValidationContext> {
        let mut roster = self.engine.roster.clone();
        let agents = all_agents(&mut roster)
            .await?
            .into_iter()
            .map(|agent| validator::KnownAgent {
                offline: agent.status == roster::AgentStatus::Offline as i32,
                id: agent.id,
                role: agent.role,
            })
            .collect();
        let roles = roster
            .list_role_definitions(roster::ListRoleDefinitionsRequest {})
            .await
            .map_err(|status| dependency_error("roster", status))?
            .into_inner()
            .roles;
        let check_roles = !roles.is_empty();
        Ok(validator::ValidationContext {
            agents,
            roles: roles
                .into_iter()
                .map(|role| validator::KnownRole {
                    name: role.name,
                    permitted_tools: role.tools,
                    permitted_actions: role.permitted_actions,
                })
                .collect(),
            tools: Vec::new(),
            check_agents: true,
            check_roles,
            check_tools: false,
        })
    }

    async fn publish(&self, request: wire::PublishProcessRequest) -> Result<wire::PublishProcessResponse> {
        if request.source.trim().is_empty() {
            return Err(Error::InvalidArgument("source is empty: send the process YAML".to_owned()));
        }
        let context = self.validation_context().await?;
        let report = self
            .validator
            .clone()
            .validate_process(validator::ValidateProcessRequest {
                source: request.source.clone(),
                file_name: request.file_name.clone(),
                context: Some(context),
            })
            .await
            .map_err(|status| dependency_error("validator", status))?
            .into_inner();
        if !report.valid {
            return Err(Error::InvalidProcess(report.diagnostics));
        }
        let definition = parse_definition(&request.source)?;
        let stored = self
            .engine
            .store
            .publish_process(ProcessRow {
                name: definition.name.clone(),
                version: 0,
                source: request.source,
                published_at: muster_runtime::time::now_millis(),
                step_count: definition.steps.len() as u32,
                warnings: report.diagnostics.clone(),
            })
            .await?;
        tracing::info!(process = %stored.name, version = stored.version, "process published");
        Ok(wire::PublishProcessResponse {
            process: Some(process_to_wire(stored, true)),
            diagnostics: report.diagnostics,
        })
    }

    /// An agent of the roster; FAILED_PRECONDITION naming `what` when it is not in it.
    async fn roster_agent(&self, agent_id: &str, what: &str) -> Result<roster::Agent> {
        let mut roster = self.engine.roster.clone();
        match roster.get_agent(roster::GetAgentRequest { id: agent_id.to_owned() }).await {
            Ok(response) => Ok(response.into_inner().agent.unwrap_or_default()),
            Err(status) if matches!(status.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument) => {
                Err(Error::FailedPrecondition(format!("{what} '{agent_id}' is not in the roster")))
            }
            Err(status) => Err(dependency_error("roster", status)),
        }
    }

    /// The process version to start, checked: steps this server can run,
    /// named executors in the roster, inputs a JSON object.
    async fn prepare_start(&self, process_name: &str, version: u32, inputs_json: String) -> Result<Prepared> {
        let version = (version != 0).then_some(version);
        let process = self.engine.store.get_process(process_name, version).await?.ok_or_else(|| {
            Error::NotFound(match version {
                Some(version) => format!("process '{process_name}' has no version {version}"),
                None => format!("no process named '{process_name}' is published"),
            })
        })?;
        let definition = self.engine.parsed(&process)?;
        if let Some(step) =
            definition.steps.iter().find(|step| !matches!(step.step_type.as_str(), "agent_task" | "human_approval"))
        {
            return Err(Error::FailedPrecondition(format!(
                "step '{}' is of type '{}', which this server cannot run yet; agent_task and human_approval steps run",
                step.id, step.step_type
            )));
        }
        let inputs_json = if inputs_json.trim().is_empty() { "{}".to_owned() } else { inputs_json };
        match serde_json::from_str::<serde_json::Value>(&inputs_json) {
            Ok(serde_json::Value::Object(_)) => {}
            _ => return Err(Error::InvalidArgument("inputs_json must be a JSON object".to_owned())),
        }
        // Every named executor must be in the roster before anything runs.
        // (An approval step's executor may be a system name: people decide it.)
        for step in definition.steps.iter().filter(|step| step.step_type == "agent_task") {
            if let Some(executor) = step.executor() {
                self.roster_agent(executor, &format!("step '{}': executor", step.id)).await?;
            }
        }
        Ok(Prepared { process, definition, inputs_json })
    }

    async fn start(&self, request: wire::StartExecutionRequest) -> Result<wire::Execution> {
        let Prepared { process, definition, inputs_json } =
            self.prepare_start(&request.process_name, request.process_version, request.inputs_json).await?;
        let lead_agent_id = if request.lead_agent_id.is_empty() {
            definition.lead.clone().unwrap_or_default()
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
                definition,
                inputs_json,
                lead_agent_id,
                idempotency_key: (!request.idempotency_key.is_empty()).then_some(request.idempotency_key),
                session: None,
            })
            .await?;
        Ok(self.execution_to_wire(execution).await)
    }

    /// Starts a session from an already checked request.
    async fn start_as_session(
        &self,
        process_name: &str,
        process_version: u32,
        inputs_json: String,
        lead_agent_id: String,
        session: Session,
        idempotency_key: String,
    ) -> Result<wire::Execution> {
        let Prepared { process, definition, inputs_json } =
            self.prepare_start(process_name, process_version, inputs_json).await?;
        let execution = self
            .engine
            .start(StartRequest {
                process,
                definition,
                inputs_json,
                lead_agent_id,
                idempotency_key: (!idempotency_key.is_empty()).then_some(idempotency_key),
                session: Some(session),
            })
            .await?;
        Ok(self.execution_to_wire(execution).await)
    }

    /// Hands a control to the execution's driver and waits for its answer.
    /// An execution that has ended, or ends before its driver reads the
    /// control, is FAILED_PRECONDITION; one whose driver stopped without
    /// ending it (the service shutting down) is UNAVAILABLE, to retry.
    async fn control(
        &self,
        execution_id: &str,
        control: impl FnOnce(tokio::sync::oneshot::Sender<Result<()>>) -> Control,
    ) -> std::result::Result<(), Status> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.engine.control(execution_id, control(reply))
            && let Ok(outcome) = answer.await
        {
            return Ok(outcome?);
        }
        match self.engine.store.get_execution(execution_id).await? {
            Some(execution) if execution.status.is_final() => Err(Error::FailedPrecondition(format!(
                "execution '{execution_id}' has ended ({})",
                execution.status.as_str()
            ))
            .into()),
            _ => Err(Status::unavailable(format!("execution '{execution_id}' is not running here now; try again"))),
        }
    }

    /// An execution and the definition of the process version it runs.
    async fn execution_and_definition(&self, execution_id: &str) -> Result<(ExecutionRow, Arc<ProcessDefinition>)> {
        let execution = self
            .engine
            .store
            .get_execution(execution_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("execution '{execution_id}' not found")))?;
        let definition = self.engine.definition(&execution.process_name, execution.process_version).await?;
        Ok((execution, definition))
    }

    async fn execution_to_wire(&self, execution: ExecutionRow) -> wire::Execution {
        let definition = self.engine.definition(&execution.process_name, execution.process_version).await.ok();
        execution_to_wire(execution, definition.as_deref())
    }

    async fn cancel(&self, caller: &Caller, request: wire::CancelExecutionRequest) -> Result<wire::Execution, Status> {
        let mut live = self.engine.events.subscribe();
        let execution = self
            .engine
            .store
            .get_execution(&request.id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("execution '{}' not found", request.id)))?;
        if let Some(agent_id) = caller.agent_id() {
            if execution.lead_agent_id != agent_id {
                return Err(permission_denied(
                    caller,
                    &format!("cancel execution '{}'", request.id),
                    "NOT_THE_LEAD",
                    "only operators and the execution's lead may cancel it",
                    &[("execution_id", request.id.clone())],
                ));
            }
            self.check_matrix_action(caller, &execution, "close_task", &format!("cancel execution '{}'", request.id))?;
        }
        if execution.status.is_final() {
            return Err(Error::FailedPrecondition(format!(
                "execution '{}' already ended ({})",
                request.id,
                execution.status.as_str()
            ))
            .into());
        }
        let reason =
            if request.reason.is_empty() { format!("cancelled by {}", caller.audit_name()) } else { request.reason };
        if self.engine.control(&request.id, Control::Cancel(reason)) {
            let finished = async {
                loop {
                    match live.recv().await {
                        Ok(event)
                            if event.execution_id == request.id
                                && event.r#type == EventType::ExecutionFinished as i32 =>
                        {
                            break;
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                        _ => {}
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), finished).await;
        }
        let execution = self.engine.store.get_execution(&request.id).await?.unwrap_or(execution);
        Ok(self.execution_to_wire(execution).await)
    }
}

#[tonic::async_trait]
impl ExecutionService for ExecutionApi {
    async fn publish_process(
        &self,
        request: Request<wire::PublishProcessRequest>,
    ) -> Result<Response<wire::PublishProcessResponse>, Status> {
        Ok(Response::new(self.publish(request.into_inner()).await?))
    }

    async fn get_process(
        &self,
        request: Request<wire::GetProcessRequest>,
    ) -> Result<Response<wire::GetProcessResponse>, Status> {
        let request = request.into_inner();
        let version = (request.version != 0).then_some(request.version);
        let process = self
            .engine
            .store
            .get_process(&request.name, version)
            .await?
            .ok_or_else(|| Error::NotFound(format!("process '{}' not found", request.name)))?;
        Ok(Response::new(wire::GetProcessResponse { process: Some(process_to_wire(process, true)) }))
    }

    async fn list_processes(
        &self,
        _request: Request<wire::ListProcessesRequest>,
    ) -> Result<Response<wire::ListProcessesResponse>, Status> {
        let processes = self.engine.store.list_processes().await?;
        Ok(Response::new(wire::ListProcessesResponse {
            processes: processes.into_iter().map(|process| process_to_wire(process, false)).collect(),
        }))
    }

    async fn start_execution(
        &self,
        request: Request<wire::StartExecutionRequest>,
    ) -> Result<Response<wire::StartExecutionResponse>, Status> {
        let execution = self.start(request.into_inner()).await?;
        Ok(Response::new(wire::StartExecutionResponse { execution: Some(execution) }))
    }

    async fn get_execution(
        &self,
        request: Request<wire::GetExecutionRequest>,
    ) -> Result<Response<wire::GetExecutionResponse>, Status> {
        let caller = Caller::of(&request)?;
        let id = request.into_inner().id;
        let (execution, definition) = self.execution_and_definition(&id).await?;
        access::require_part(&caller, &execution, &definition, &format!("read execution '{id}'"))?;
        Ok(Response::new(wire::GetExecutionResponse {
            execution: Some(execution_to_wire(execution, Some(&*definition))),
        }))
    }

    async fn list_executions(
        &self,
        request: Request<wire::ListExecutionsRequest>,
    ) -> Result<Response<wire::ListExecutionsResponse>, Status> {
        let request = request.into_inner();
        let filter = ExecutionFilter {
            process_name: (!request.process_name.is_empty()).then_some(request.process_name),
            status: common::ExecutionStatus::try_from(request.status).ok().and_then(ExecutionStatus::from_wire),
            started_after: request.started_after.as_ref().map(muster_runtime::time::from_timestamp),
            started_before: request.started_before.as_ref().map(muster_runtime::time::from_timestamp),
            limit: if request.limit == 0 { 100 } else { request.limit.min(1000) },
        };
        let executions = self.engine.store.list_executions(&filter).await?;
        Ok(Response::new(wire::ListExecutionsResponse {
            executions: executions.into_iter().map(|execution| execution_to_wire(execution, None)).collect(),
        }))
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
        let (execution, definition) = self.execution_and_definition(&request.execution_id).await?;
        access::require_part(&caller, &execution, &definition, &format!("watch execution '{}'", execution.id))?;
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
        let caller = Caller::of(&request)?;
        let execution = self.cancel(&caller, request.into_inner()).await?;
        Ok(Response::new(wire::CancelExecutionResponse { execution: Some(execution) }))
    }

    type ConnectWorkerStream = ReceiverStream<Result<wire::ConnectWorkerResponse, Status>>;

    async fn connect_worker(
        &self,
        request: Request<Streaming<wire::ConnectWorkerRequest>>,
    ) -> Result<Response<Self::ConnectWorkerStream>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.connect(caller, request.into_inner()).await?))
    }

    async fn invoke_tool(
        &self,
        request: Request<wire::InvokeToolRequest>,
    ) -> Result<Response<wire::InvokeToolResponse>, Status> {
        let caller = Caller::of(&request)?;
        let output = self.invoke_tool_as(&caller, request.into_inner()).await?;
        Ok(Response::new(wire::InvokeToolResponse { output: Some(output) }))
    }

    async fn list_tools(
        &self,
        _request: Request<wire::ListToolsRequest>,
    ) -> Result<Response<wire::ListToolsResponse>, Status> {
        Ok(Response::new(wire::ListToolsResponse { tools: self.engine.workers.tools() }))
    }

    async fn submit_approval(
        &self,
        request: Request<wire::SubmitApprovalRequest>,
    ) -> Result<Response<wire::SubmitApprovalResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.decide(&caller, request.into_inner()).await?))
    }

    async fn intervene(
        &self,
        request: Request<wire::InterveneRequest>,
    ) -> Result<Response<wire::InterveneResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.intervene_as(&caller, request.into_inner()).await?))
    }

    async fn start_session(
        &self,
        request: Request<wire::StartSessionRequest>,
    ) -> Result<Response<wire::StartSessionResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.start_session_as(&caller, request.into_inner()).await?))
    }

    async fn assign_role(
        &self,
        request: Request<wire::AssignRoleRequest>,
    ) -> Result<Response<wire::AssignRoleResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.assign_role_as(&caller, request.into_inner()).await?))
    }

    async fn get_my_role(
        &self,
        request: Request<wire::GetMyRoleRequest>,
    ) -> Result<Response<wire::GetMyRoleResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.my_role(&caller, request.into_inner()).await?))
    }

    async fn check_role(
        &self,
        request: Request<wire::CheckRoleRequest>,
    ) -> Result<Response<wire::CheckRoleResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.check_role_as(&caller, request.into_inner()).await?))
    }

    async fn set_lead(
        &self,
        request: Request<wire::SetLeadRequest>,
    ) -> Result<Response<wire::SetLeadResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.set_lead_as(&caller, request.into_inner()).await?))
    }

    async fn get_session_status(
        &self,
        request: Request<wire::GetSessionStatusRequest>,
    ) -> Result<Response<wire::GetSessionStatusResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.session_status(&caller, request.into_inner()).await?))
    }

    async fn put_permission_matrix(
        &self,
        request: Request<wire::PutPermissionMatrixRequest>,
    ) -> Result<Response<wire::PutPermissionMatrixResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.put_matrix(&caller, request.into_inner()).await?))
    }

    async fn get_permission_matrix(
        &self,
        request: Request<wire::GetPermissionMatrixRequest>,
    ) -> Result<Response<wire::GetPermissionMatrixResponse>, Status> {
        Ok(Response::new(self.get_matrix(request.into_inner()).await?))
    }

    async fn list_permission_matrix_versions(
        &self,
        request: Request<wire::ListPermissionMatrixVersionsRequest>,
    ) -> Result<Response<wire::ListPermissionMatrixVersionsResponse>, Status> {
        Ok(Response::new(self.list_matrices(request.into_inner()).await?))
    }

    async fn post_to_inbox(
        &self,
        _request: Request<wire::PostToInboxRequest>,
    ) -> Result<Response<wire::PostToInboxResponse>, Status> {
        Err(unimplemented("ExecutionService.PostToInbox"))
    }

    async fn list_inbox_messages(
        &self,
        _request: Request<wire::ListInboxMessagesRequest>,
    ) -> Result<Response<wire::ListInboxMessagesResponse>, Status> {
        Err(unimplemented("ExecutionService.ListInboxMessages"))
    }

    async fn archive_inbox_message(
        &self,
        _request: Request<wire::ArchiveInboxMessageRequest>,
    ) -> Result<Response<wire::ArchiveInboxMessageResponse>, Status> {
        Err(unimplemented("ExecutionService.ArchiveInboxMessage"))
    }

    async fn set_budget(
        &self,
        _request: Request<wire::SetBudgetRequest>,
    ) -> Result<Response<wire::SetBudgetResponse>, Status> {
        Err(unimplemented("ExecutionService.SetBudget"))
    }

    async fn list_budgets(
        &self,
        _request: Request<wire::ListBudgetsRequest>,
    ) -> Result<Response<wire::ListBudgetsResponse>, Status> {
        Err(unimplemented("ExecutionService.ListBudgets"))
    }
}
