//! The gRPC face of the execution service: wire types in, domain calls,
//! wire types out. Errors become statuses through `From<Error> for Status`.

use std::{pin::Pin, sync::Arc};

use muster_proto::{
    common::v1::{self as common, EventType},
    execution::v1::{self as wire, execution_service_server::ExecutionService},
    roster::v1 as roster,
    validator::v1 as validator,
};
use muster_runtime::status::unimplemented;
use muster_validator::ProcessDefinition;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    Error, Result,
    clients::{ValidatorClient, all_agents, dependency_error},
    domain::ExecutionStatus,
    engine::{
        Control, Engine, Intervention, InterventionAction, StartRequest, approvers, parse_definition, step_roles,
    },
    store::{ExecutionFilter, ExecutionRow, ProcessRow},
};

mod convert;
mod streams;
mod tools;

pub(crate) use convert::diagnostic_to_wire;
use convert::{execution_to_wire, process_to_wire};
use streams::{serve_worker, stream_events};

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The ExecutionService implementation.
pub(crate) struct ExecutionApi {
    engine: Arc<Engine>,
    validator: ValidatorClient,
}

impl ExecutionApi {
    pub(crate) fn new(engine: Arc<Engine>, validator: ValidatorClient) -> Self {
        Self { engine, validator }
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

    async fn start(&self, request: wire::StartExecutionRequest) -> Result<wire::Execution> {
        let version = (request.process_version != 0).then_some(request.process_version);
        let process = self.engine.store.get_process(&request.process_name, version).await?.ok_or_else(|| {
            Error::NotFound(match version {
                Some(version) => format!("process '{}' has no version {version}", request.process_name),
                None => format!("no process named '{}' is published", request.process_name),
            })
        })?;
        let definition = parse_definition(&process.source)?;
        if let Some(step) =
            definition.steps.iter().find(|step| !matches!(step.step_type.as_str(), "agent_task" | "human_approval"))
        {
            return Err(Error::FailedPrecondition(format!(
                "step '{}' is of type '{}', which this server cannot run yet; agent_task and human_approval steps run",
                step.id, step.step_type
            )));
        }
        let inputs_json = if request.inputs_json.trim().is_empty() { "{}".to_owned() } else { request.inputs_json };
        match serde_json::from_str::<serde_json::Value>(&inputs_json) {
            Ok(serde_json::Value::Object(_)) => {}
            _ => return Err(Error::InvalidArgument("inputs_json must be a JSON object".to_owned())),
        }
        // Every named executor must be in the roster before anything runs.
        let mut roster = self.engine.roster.clone();
        // (An approval step's executor may be a system name: people decide it.)
        for step in definition.steps.iter().filter(|step| step.step_type == "agent_task") {
            if let Some(executor) = step.executor() {
                match roster.get_agent(roster::GetAgentRequest { id: executor.to_owned() }).await {
                    Ok(_) => {}
                    Err(status) if status.code() == tonic::Code::NotFound => {
                        return Err(Error::FailedPrecondition(format!(
                            "step '{}': executor '{executor}' is not in the roster",
                            step.id
                        )));
                    }
                    Err(status) => return Err(dependency_error("roster", status)),
                }
            }
        }
        let lead_agent_id = if request.lead_agent_id.is_empty() {
            definition.lead.clone().unwrap_or_default()
        } else {
            request.lead_agent_id
        };
        let execution = self
            .engine
            .start(StartRequest {
                process,
                definition,
                inputs_json,
                lead_agent_id,
                idempotency_key: (!request.idempotency_key.is_empty()).then_some(request.idempotency_key),
            })
            .await?;
        Ok(self.execution_to_wire(execution).await)
    }

    /// An execution and the definition of the process version it runs.
    async fn execution_and_definition(&self, execution_id: &str) -> Result<(ExecutionRow, ProcessDefinition)> {
        let execution = self
            .engine
            .store
            .get_execution(execution_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("execution '{execution_id}' not found")))?;
        let process = self
            .engine
            .store
            .get_process(&execution.process_name, Some(execution.process_version))
            .await?
            .ok_or_else(|| Error::Storage(format!("the process of execution '{execution_id}' is missing")))?;
        let definition = parse_definition(&process.source)?;
        Ok((execution, definition))
    }

    async fn execution_to_wire(&self, execution: ExecutionRow) -> wire::Execution {
        let definition =
            match self.engine.store.get_process(&execution.process_name, Some(execution.process_version)).await {
                Ok(Some(process)) => parse_definition(&process.source).ok(),
                _ => None,
            };
        execution_to_wire(execution, definition.as_ref())
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
        let id = request.into_inner().id;
        let execution = self
            .engine
            .store
            .get_execution(&id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("execution '{id}' not found")))?;
        Ok(Response::new(wire::GetExecutionResponse { execution: Some(self.execution_to_wire(execution).await) }))
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
        let request = request.into_inner();
        // Subscribe before reading the history, so nothing falls between the two.
        let live = self.engine.events.subscribe();
        if self.engine.store.get_execution(&request.execution_id).await?.is_none() {
            return Err(Error::NotFound(format!("execution '{}' not found", request.execution_id)).into());
        }
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
        let request = request.into_inner();
        let mut live = self.engine.events.subscribe();
        let execution = self
            .engine
            .store
            .get_execution(&request.id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("execution '{}' not found", request.id)))?;
        if execution.status.is_final() {
            return Err(Error::FailedPrecondition(format!(
                "execution '{}' already ended ({})",
                request.id,
                execution.status.as_str()
            ))
            .into());
        }
        let reason = if request.reason.is_empty() { "cancelled on request".to_owned() } else { request.reason };
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
        Ok(Response::new(wire::CancelExecutionResponse { execution: Some(self.execution_to_wire(execution).await) }))
    }

    type ConnectWorkerStream = ReceiverStream<Result<wire::ConnectWorkerResponse, Status>>;

    async fn connect_worker(
        &self,
        request: Request<Streaming<wire::ConnectWorkerRequest>>,
    ) -> Result<Response<Self::ConnectWorkerStream>, Status> {
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(wire::ConnectWorkerRequest { message: Some(wire::connect_worker_request::Message::Hello(hello)) }) => {
                hello
            }
            _ => return Err(Status::invalid_argument("the first message of a worker must be a hello")),
        };
        tools::check_tool_specs(&hello.tools)?;
        let agents = self.authenticate_worker(&hello).await?;
        let (sender, receiver) = mpsc::channel(256);
        let max_concurrency = if hello.max_concurrency == 0 { 16 } else { hello.max_concurrency as usize };
        let worker_id = self.engine.workers.register(
            hello.worker_name.clone(),
            agents,
            hello.tools.clone(),
            max_concurrency,
            sender.clone(),
        );
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
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn invoke_tool(
        &self,
        request: Request<wire::InvokeToolRequest>,
    ) -> Result<Response<wire::InvokeToolResponse>, Status> {
        let caller = self.caller(request.metadata()).await?;
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
        let caller = self.caller(request.metadata()).await?;
        let request = request.into_inner();
        let (execution, definition) = self.execution_and_definition(&request.execution_id).await?;
        let step = definition.steps.iter().find(|step| step.id == request.step_id).ok_or_else(|| {
            Error::NotFound(format!("execution '{}' has no step '{}'", request.execution_id, request.step_id))
        })?;
        if step.step_type != "human_approval" {
            return Err(Error::FailedPrecondition(format!("step '{}' is not a human_approval step", step.id)).into());
        }
        let allowed = approvers(step);
        if !allowed.contains(&caller) {
            return Err(Status::permission_denied(format!(
                "only the step's executor or monitors ({}) may decide step '{}'; {caller} is neither",
                allowed.join(", "),
                step.id
            )));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let control = Control::Decide {
            step_id: request.step_id.clone(),
            approved: request.approved,
            by: caller,
            comment: request.comment,
            reply,
        };
        if !self.engine.control(&request.execution_id, control) {
            return Err(
                Error::FailedPrecondition(format!("execution '{}' is not running", request.execution_id)).into()
            );
        }
        answer.await.map_err(|_| Status::unavailable("the execution stopped while deciding; try again"))??;
        let execution = self.engine.store.get_execution(&request.execution_id).await?.unwrap_or(execution);
        let step = execution_to_wire(execution, Some(&definition))
            .steps
            .into_iter()
            .find(|state| state.step_id == request.step_id);
        Ok(Response::new(wire::SubmitApprovalResponse { step }))
    }

    async fn intervene(
        &self,
        request: Request<wire::InterveneRequest>,
    ) -> Result<Response<wire::InterveneResponse>, Status> {
        let caller = self.caller(request.metadata()).await?;
        let request = request.into_inner();
        let (execution, definition) = self.execution_and_definition(&request.execution_id).await?;
        let action = match wire::InterventionAction::try_from(request.action).unwrap_or_default() {
            wire::InterventionAction::Pause => InterventionAction::Pause,
            wire::InterventionAction::Resume => InterventionAction::Resume,
            wire::InterventionAction::Retry => InterventionAction::Retry,
            wire::InterventionAction::Cancel => InterventionAction::Cancel,
            wire::InterventionAction::Reassign => {
                if request.target_agent_id.is_empty() {
                    return Err(Status::invalid_argument("REASSIGN needs target_agent_id"));
                }
                let mut roster = self.engine.roster.clone();
                roster
                    .get_agent(roster::GetAgentRequest { id: request.target_agent_id.clone() })
                    .await
                    .map_err(|status| dependency_error("roster", status))?;
                InterventionAction::Reassign(request.target_agent_id.clone())
            }
            wire::InterventionAction::OverrideOutput => {
                if serde_json::from_str::<serde_json::Value>(&request.output_json).is_err() {
                    return Err(Status::invalid_argument("OVERRIDE_OUTPUT needs output_json, a JSON value"));
                }
                InterventionAction::OverrideOutput(request.output_json.clone())
            }
            wire::InterventionAction::Unspecified => return Err(Status::invalid_argument("action is required")),
        };
        // The rule: the execution's lead may intervene anywhere; a step's
        // monitors only in that step.
        let is_lead = !execution.lead_agent_id.is_empty() && execution.lead_agent_id == caller;
        let step_id = (!request.step_id.is_empty()).then(|| request.step_id.clone());
        match &step_id {
            None if !is_lead => {
                return Err(Status::permission_denied(format!(
                    "only the execution's lead ({}) may pause or resume the whole execution; {caller} is not",
                    if execution.lead_agent_id.is_empty() { "none is set" } else { &execution.lead_agent_id }
                )));
            }
            Some(step_id) => {
                let step = definition.steps.iter().find(|step| &step.id == step_id).ok_or_else(|| {
                    Error::NotFound(format!("execution '{}' has no step '{step_id}'", request.execution_id))
                })?;
                let monitors = step_roles(step).monitors;
                if !is_lead && !monitors.contains(&caller) {
                    return Err(Status::permission_denied(format!(
                        "only the execution's lead or the monitors of step '{step_id}' ({}) may intervene in it; {caller} is neither",
                        if monitors.is_empty() { "none".to_owned() } else { monitors.join(", ") }
                    )));
                }
            }
            None => {}
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let intervention = Intervention { step_id, action, by: caller, reason: request.reason };
        if !self.engine.control(&request.execution_id, Control::Intervene { intervention, reply }) {
            return Err(Error::FailedPrecondition(format!("execution '{}' has ended", request.execution_id)).into());
        }
        answer.await.map_err(|_| Status::unavailable("the execution stopped while intervening; try again"))??;
        let execution = self.engine.store.get_execution(&request.execution_id).await?.unwrap_or(execution);
        Ok(Response::new(wire::InterveneResponse { execution: Some(execution_to_wire(execution, Some(&definition))) }))
    }

    async fn assign_role(
        &self,
        _request: Request<wire::AssignRoleRequest>,
    ) -> Result<Response<wire::AssignRoleResponse>, Status> {
        Err(unimplemented("ExecutionService.AssignRole"))
    }

    async fn get_my_role(
        &self,
        _request: Request<wire::GetMyRoleRequest>,
    ) -> Result<Response<wire::GetMyRoleResponse>, Status> {
        Err(unimplemented("ExecutionService.GetMyRole"))
    }

    async fn check_role(
        &self,
        _request: Request<wire::CheckRoleRequest>,
    ) -> Result<Response<wire::CheckRoleResponse>, Status> {
        Err(unimplemented("ExecutionService.CheckRole"))
    }

    async fn set_lead(
        &self,
        _request: Request<wire::SetLeadRequest>,
    ) -> Result<Response<wire::SetLeadResponse>, Status> {
        Err(unimplemented("ExecutionService.SetLead"))
    }

    async fn get_session_status(
        &self,
        _request: Request<wire::GetSessionStatusRequest>,
    ) -> Result<Response<wire::GetSessionStatusResponse>, Status> {
        Err(unimplemented("ExecutionService.GetSessionStatus"))
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

impl ExecutionApi {
    /// The agent making a call, from its `authorization: Bearer <token>` metadata.
    async fn caller(&self, metadata: &tonic::metadata::MetadataMap) -> Result<String, Status> {
        let token = metadata
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated("send the agent's roster token as `authorization: Bearer <token>`")
            })?;
        let mut roster = self.engine.roster.clone();
        match roster.authenticate(roster::AuthenticateRequest { token: token.to_owned() }).await {
            Ok(response) => response
                .into_inner()
                .agent
                .map(|agent| agent.id)
                .ok_or_else(|| Status::unauthenticated("the token belongs to no agent")),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::NotFound | tonic::Code::InvalidArgument
                ) =>
            {
                Err(Status::unauthenticated(format!("the token is not valid: {}", status.message())))
            }
            Err(status) => Err(dependency_error("roster", status).into()),
        }
    }

    /// Each served agent must present its own roster token.
    async fn authenticate_worker(&self, hello: &wire::WorkerHello) -> Result<Vec<String>, Status> {
        if hello.agents.is_empty() && hello.tools.is_empty() {
            return Err(Status::invalid_argument("a worker must serve at least one agent or provide a tool"));
        }
        let mut roster = self.engine.roster.clone();
        let mut agents = Vec::with_capacity(hello.agents.len());
        for served in &hello.agents {
            let answer = roster.authenticate(roster::AuthenticateRequest { token: served.token.clone() }).await;
            match answer {
                Ok(response) => {
                    let owner = response.into_inner().agent.map(|agent| agent.id).unwrap_or_default();
                    if owner != served.agent_id {
                        return Err(Status::permission_denied(format!(
                            "the token given for agent '{}' does not belong to it",
                            served.agent_id
                        )));
                    }
                }
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unauthenticated | tonic::Code::NotFound | tonic::Code::InvalidArgument
                    ) =>
                {
                    return Err(Status::unauthenticated(format!(
                        "the token given for agent '{}' is not valid: {}",
                        served.agent_id,
                        status.message()
                    )));
                }
                Err(status) => return Err(dependency_error("roster", status).into()),
            }
            agents.push(served.agent_id.clone());
        }
        Ok(agents)
    }
}
