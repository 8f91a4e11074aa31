//! Executions: starting one (or a team session), the controls its driver
//! applies, cancelling, reading a payload, showing and listing them.

use std::sync::Arc;

use muster_proto::execution::v1 as wire;
use muster_runtime::auth::Caller;
use tokio::sync::broadcast;

use super::access;
use super::convert::execution_to_wire;
use super::{
    ExecutionGrpc,
    paging::{page_size, time_and_id},
};
use crate::{
    Error, Result,
    domain::{
        authority::Session,
        model::{EventKind, Execution, ProcessVersion, Step},
        payload::{self, PayloadKind},
    },
    engine::{Control, StartRequest},
    grpc::convert::{execution_status_from_wire, payload_kind_from_wire},
    store::ExecutionFilter,
};

impl ExecutionGrpc {
    /// The process version to start, checked: steps this server can run,
    /// named executors in the roster, inputs a JSON object.
    pub(super) async fn prepare_start(
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
        // runs, as this service follows it (`Engine::roster_agent`: the
        // roster's answers are kept until an agent or a role changes), each
        // looked up once. (An approval step's executor may be a system name:
        // people decide it.)
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
    pub(super) fn idempotency_key(key: String) -> Result<Option<String>> {
        if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(Error::invalid(
                "idempotency_key",
                format!("idempotency_key has {} bytes; at most {MAX_IDEMPOTENCY_KEY_BYTES} are accepted", key.len()),
            ));
        }
        Ok((!key.is_empty()).then_some(key))
    }

    pub(super) async fn start(&self, request: wire::StartExecutionRequest) -> Result<wire::Execution> {
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
        let started = self
            .engine
            .start_with_steps(StartRequest {
                process: process.clone(),
                inputs_json,
                lead_agent_id,
                idempotency_key: Self::idempotency_key(request.idempotency_key)?,
                session: None,
                claimed_messages: Vec::new(),
                fired_schedule: None,
            })
            .await?;
        self.started_to_wire(started, &process).await
    }

    /// Starts a session from an already checked request.
    pub(super) async fn start_as_session(
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
        let started = self
            .engine
            .start_with_steps(StartRequest {
                process: process.clone(),
                inputs_json,
                lead_agent_id,
                idempotency_key: Self::idempotency_key(idempotency_key)?,
                session: Some(session),
                claimed_messages: Vec::new(),
                fired_schedule: None,
            })
            .await?;
        self.started_to_wire(started, &process).await
    }

    /// Hands a control to the execution's driver and waits for its answer.
    /// An execution that has ended, or ends before its driver reads the
    /// control, is FAILED_PRECONDITION; one whose driver stopped without
    /// ending it (the service shutting down) is UNAVAILABLE, to retry.
    pub(super) async fn control(
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
    pub(super) async fn execution_and_process(&self, execution_id: &str) -> Result<(Execution, Arc<ProcessVersion>)> {
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
    pub(super) fn outputs_room(&self) -> usize {
        (self.max_message_bytes / 2).min(2 * 1024 * 1024)
    }

    pub(super) async fn steps(&self, execution_id: &str) -> Result<Vec<Step>> {
        Ok(self.engine.store.steps(execution_id).await?.into_iter().map(|(_, step)| step).collect())
    }

    /// An execution just started (with its steps as committed, when it was
    /// created now) as answers show it.
    async fn started_to_wire(
        &self,
        (execution, steps): (Execution, Option<Vec<Step>>),
        process: &ProcessVersion,
    ) -> Result<wire::Execution> {
        match steps {
            Some(steps) => Ok(execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room())),
            None => self.execution_to_wire(execution).await,
        }
    }

    /// An execution with its steps, as answers show it.
    pub(super) async fn execution_to_wire(&self, execution: Execution) -> Result<wire::Execution> {
        let process = self.engine.definition_of(&execution).await?;
        let steps = self.steps(&execution.id).await?;
        Ok(execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room()))
    }

    pub(super) async fn cancel(
        &self,
        caller: &Caller,
        request: wire::CancelExecutionRequest,
    ) -> Result<wire::Execution> {
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
    pub(super) async fn payload(&self, caller: &Caller, request: &wire::ReadPayloadRequest) -> Result<String> {
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
    pub(super) async fn list_executions(
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
}

/// Longest execution inputs, in bytes.
const MAX_INPUTS_BYTES: usize = 1024 * 1024;

/// Longest idempotency key, in bytes.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
