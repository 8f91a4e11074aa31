//! A step task: finds the step's executor (named, or decided by the roster),
//! builds the assignment with its task context, hands it to a worker and
//! waits for the outcome. It reports progress to the driver, which alone
//! writes state.

use std::{collections::HashMap, sync::Arc, time::Duration};

use muster_format::StepDefinition;
use muster_proto::{
    execution::v1::{Assignment, HistoryEntry, StepFailure},
    roster::v1 as roster,
};
use tokio::sync::mpsc;

use super::{
    Engine,
    driver::{assignment_id, step_roles},
    session::SessionSnapshot,
};
use crate::{
    domain::authority::{self, Subject},
    workers::Outcome,
};

/// Iterations an agent may run per step when its roster entry says none.
const DEFAULT_MAX_ITERATIONS: u32 = 10;

/// What a step task tells its driver before the outcome.
#[derive(Debug)]
pub(crate) enum StepUpdate {
    /// The step was handed to `agent_id`'s worker queue.
    Assigned { position: usize, attempt: u32, agent_id: String },
    /// The roster chose an agent (or escalated to a senior).
    Delegated { position: usize, attempt: u32, agent_id: String, detail: String, escalated: bool },
    /// The step waits for a busy expert.
    Queued { position: usize, attempt: u32, expert_id: String, wait_seconds: u64, detail: String },
}

impl StepUpdate {
    pub(crate) fn step(&self) -> (usize, u32) {
        match self {
            Self::Assigned { position, attempt, .. }
            | Self::Delegated { position, attempt, .. }
            | Self::Queued { position, attempt, .. } => (*position, *attempt),
        }
    }
}

pub(crate) struct StepTask {
    pub(crate) engine: Arc<Engine>,
    pub(crate) execution_id: String,
    pub(crate) process_name: String,
    pub(crate) process_version: u32,
    pub(crate) execution_inputs_json: String,
    pub(crate) lead_agent_id: String,
    pub(crate) position: usize,
    pub(crate) attempt: u32,
    pub(crate) definition: StepDefinition,
    pub(crate) upstream_outputs: HashMap<String, String>,
    pub(crate) shared_memory_json: String,
    pub(crate) history: Vec<HistoryEntry>,
    pub(crate) updates: mpsc::UnboundedSender<StepUpdate>,
    /// Role definitions and prompts already fetched for this execution's agents.
    pub(crate) agent_contexts: AgentContexts,
    /// The agent a REASSIGN intervention or a delegation gave the step to.
    pub(crate) reassigned_to: Option<String>,
    /// Agents the step passed through by delegation onward.
    pub(crate) delegation_chain: Vec<String>,
    /// The session, when the execution runs as one.
    pub(crate) session: Option<SessionSnapshot>,
}

/// What an assignment tells an agent about itself, from the roster.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentContext {
    roster_role: String,
    role_definition: Option<roster::RoleDefinition>,
    system_prompt: String,
    max_iterations: u32,
    llm_config_json: String,
    allow_delegation: bool,
}

/// Per execution: agent id to what its assignments tell it, fetched once.
pub(crate) type AgentContexts = Arc<tokio::sync::Mutex<HashMap<String, AgentContext>>>;

impl StepTask {
    pub(crate) async fn run(self) -> (usize, u32, Outcome) {
        let (position, attempt) = (self.position, self.attempt);
        (position, attempt, self.execute().await)
    }

    async fn execute(self) -> Outcome {
        if self.attempt > 1 {
            let exponent = (self.attempt - 2).min(5);
            tokio::time::sleep(Duration::from_millis(100 << exponent)).await;
        }
        let agent_id = match self.find_executor().await {
            Ok(agent_id) => agent_id,
            Err(failure) => return Outcome::Failed(failure),
        };
        let refused = |reason| {
            Outcome::Failed(StepFailure {
                assignment_id: String::new(),
                error_code: "PERMISSION_DENIED".to_owned(),
                message: reason,
                retryable: false,
            })
        };
        // In a session, only an assigned agent whose role permits the step's action gets it.
        let session_role = match &self.session {
            Some(session) => match session.admit(&agent_id, self.definition.action.as_deref()) {
                Ok(role) => role,
                Err(reason) => return refused(reason),
            },
            None => String::new(),
        };
        let _ = self.updates.send(StepUpdate::Assigned {
            position: self.position,
            attempt: self.attempt,
            agent_id: agent_id.clone(),
        });
        let context = match self.agent_context(&agent_id).await {
            Ok(context) => context,
            Err(failure) => return Outcome::Failed(failure),
        };
        // Outside sessions, the matrix decides for the roles it governs.
        if self.session.is_none()
            && let Err(reason) = self.admit_by_roster_role(&agent_id, &context.roster_role)
        {
            return refused(reason);
        }
        let assignment = self.assignment(agent_id, session_role, context);
        let id = assignment.assignment_id.clone();
        let max_iterations = assignment.max_iterations;
        let receiver = self.engine.workers.dispatch(assignment).await;
        let outcome = match self.definition.timeout_seconds {
            Some(seconds) => match tokio::time::timeout(Duration::from_secs(seconds), receiver).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    self.engine.workers.withdraw(&id, "timed out");
                    return Outcome::Failed(StepFailure {
                        assignment_id: id,
                        error_code: "TIMEOUT".to_owned(),
                        message: format!("no result within {seconds} s"),
                        retryable: true,
                    });
                }
            },
            None => receiver.await,
        };
        match outcome.unwrap_or(Outcome::WorkerLost) {
            Outcome::Completed(result) if result.iterations > max_iterations => Outcome::Failed(StepFailure {
                message: format!(
                    "the agent reported {} iterations; it may run at most {max_iterations} per step",
                    result.iterations
                ),
                assignment_id: result.assignment_id,
                error_code: "ITERATION_LIMIT".to_owned(),
                retryable: false,
            }),
            outcome => outcome,
        }
    }

    /// The named executor, or the roster's decision for a step that asks for delegation.
    async fn find_executor(&self) -> Result<String, StepFailure> {
        if let Some(agent_id) = self.reassigned_to.as_deref().or(self.definition.executor()) {
            return Ok(agent_id.to_owned());
        }
        let failure = |code: &str, message: String| StepFailure {
            assignment_id: String::new(),
            error_code: code.to_owned(),
            message,
            retryable: false,
        };
        let Some(criteria) = &self.definition.delegate else {
            return Err(failure("NO_EXECUTOR", "the step names no executor and asks for no delegation".to_owned()));
        };
        let urgency = match criteria.urgency.as_deref() {
            Some("low") => roster::Urgency::Low,
            Some("high") => roster::Urgency::High,
            Some("critical") => roster::Urgency::Critical,
            _ => roster::Urgency::Normal,
        };
        let request = roster::DelegateRequest {
            task_id: format!("{}/{}", self.execution_id, self.definition.id),
            requester_id: self.lead_agent_id.clone(),
            required_expertise: criteria.expertise.clone(),
            required_role: criteria.role.clone().unwrap_or_default(),
            team: criteria.team.clone().unwrap_or_default(),
            urgency: urgency as i32,
            description: self.definition.message.clone(),
            ..Default::default()
        };
        let mut client = self.engine.roster.clone();
        let decision = loop {
            match client.delegate(request.clone()).await {
                Ok(response) => break response.into_inner().decision.unwrap_or_default(),
                Err(status) if is_outage(&status) => {
                    // The roster is down: delegations wait for it rather than fail.
                    tracing::warn!(step = %self.definition.id, error = %status.message(), "roster unavailable; delegation waits");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(status) => {
                    return Err(failure(
                        "NO_EXECUTOR",
                        format!("the roster refused to delegate: {}", status.message()),
                    ));
                }
            }
        };
        self.follow_decision(&mut client, decision).await
    }

    async fn follow_decision(
        &self,
        client: &mut crate::clients::RosterClient,
        decision: roster::DelegationDecision,
    ) -> Result<String, StepFailure> {
        let escalation_failure = |reasoning: &str| StepFailure {
            assignment_id: String::new(),
            error_code: "ESCALATED".to_owned(),
            message: format!("no agent can take the step: {reasoning}"),
            retryable: false,
        };
        match roster::DecisionKind::try_from(decision.decision).unwrap_or_default() {
            roster::DecisionKind::Delegate => {
                self.report_delegation(&decision, false);
                Ok(decision.primary_agent_id)
            }
            roster::DecisionKind::Escalate if !decision.primary_agent_id.is_empty() => {
                self.report_delegation(&decision, true);
                Ok(decision.primary_agent_id)
            }
            roster::DecisionKind::Queue => {
                let _ = self.updates.send(StepUpdate::Queued {
                    position: self.position,
                    attempt: self.attempt,
                    expert_id: decision.primary_agent_id.clone(),
                    wait_seconds: decision.wait_seconds,
                    detail: decision.reasoning.clone(),
                });
                let task_id = format!("{}/{}", self.execution_id, self.definition.id);
                let resolved = async {
                    let mut stream =
                        client.watch_queued_task(roster::WatchQueuedTaskRequest { task_id }).await?.into_inner();
                    stream.message().await
                };
                match resolved.await {
                    Ok(Some(roster::WatchQueuedTaskResponse { decision: Some(resolution) })) => {
                        Box::pin(self.follow_decision(client, resolution)).await
                    }
                    Err(status)
                        if status.code() != tonic::Code::Unavailable && status.code() != tonic::Code::Unknown =>
                    {
                        Err(escalation_failure(status.message()))
                    }
                    // The roster restarted or closed the watch: ask again; the
                    // task keeps its place in the queue.
                    _ => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Box::pin(self.find_executor()).await
                    }
                }
            }
            _ => Err(escalation_failure(&decision.reasoning)),
        }
    }

    fn report_delegation(&self, decision: &roster::DelegationDecision, escalated: bool) {
        let _ = self.updates.send(StepUpdate::Delegated {
            position: self.position,
            attempt: self.attempt,
            agent_id: decision.primary_agent_id.clone(),
            detail: if decision.text.is_empty() { decision.reasoning.clone() } else { decision.text.clone() },
            escalated,
        });
    }

    /// Outside sessions, whether the executor may perform the step's
    /// `action` (when it declares one): the matrix decides when it governs
    /// the executor's roster role.
    fn admit_by_roster_role(&self, agent_id: &str, roster_role: &str) -> Result<(), String> {
        let Some(action) = self.definition.action.as_deref() else { return Ok(()) };
        let subject = Subject { agent_id, roster_role, lead: &self.lead_agent_id, session: None };
        let verdict = authority::check(&self.engine.matrix(), &subject, action);
        if verdict.allowed { Ok(()) } else { Err(format!("{agent_id} may not '{action}': {}", verdict.reason)) }
    }

    fn assignment(&self, agent_id: String, session_role: String, context: AgentContext) -> Assignment {
        Assignment {
            assignment_id: assignment_id(&self.execution_id, &self.definition.id, self.attempt),
            idempotency_key: format!("{}/{}", self.execution_id, self.definition.id),
            attempt: self.attempt,
            agent_id,
            execution_id: self.execution_id.clone(),
            process_name: self.process_name.clone(),
            process_version: self.process_version,
            step_id: self.definition.id.clone(),
            step_name: self.definition.name.clone(),
            step_type: self.definition.step_type.clone(),
            message: self.definition.message.clone(),
            inputs_json: merge_inputs(&self.execution_inputs_json, &self.definition.inputs_json),
            upstream_outputs: self.upstream_outputs.clone(),
            shared_memory_json: self.shared_memory_json.clone(),
            history: self.history.clone(),
            role_definition: context.role_definition,
            system_prompt: context.system_prompt,
            roles: Some(step_roles(&self.definition)),
            delegation_chain: self.delegation_chain.clone(),
            timeout_ms: self.definition.timeout_seconds.map(|seconds| seconds * 1000).unwrap_or(0),
            trace_parent: muster_runtime::telemetry::traceparent(&tracing::Span::current()),
            max_iterations: context.max_iterations,
            llm_config_json: context.llm_config_json,
            allow_delegation: context.allow_delegation,
            session_role,
            session_context: self.session.as_ref().map(|session| session.context.clone()).unwrap_or_default(),
        }
    }

    /// What the assignment tells the agent about itself, fetched once per
    /// execution. While the roster cannot be reached the step waits for it
    /// (an assignment never goes out without the agent's limits); an agent
    /// that left the roster fails the step.
    async fn agent_context(&self, agent_id: &str) -> Result<AgentContext, StepFailure> {
        let cached = self.agent_contexts.lock().await.get(agent_id).cloned();
        if let Some(context) = cached {
            return Ok(context);
        }
        loop {
            match self.fetch_agent_context(agent_id).await {
                Ok(context) => {
                    self.agent_contexts.lock().await.insert(agent_id.to_owned(), context.clone());
                    return Ok(context);
                }
                Err(status) if is_outage(&status) => {
                    tracing::warn!(agent_id, error = %status.message(), "the roster cannot describe the agent; the assignment waits");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(status) => {
                    return Err(StepFailure {
                        assignment_id: String::new(),
                        error_code: "NO_EXECUTOR".to_owned(),
                        message: format!("the roster cannot describe agent '{agent_id}': {}", status.message()),
                        retryable: false,
                    });
                }
            }
        }
    }

    async fn fetch_agent_context(&self, agent_id: &str) -> Result<AgentContext, tonic::Status> {
        let mut client = self.engine.roster.clone();
        let agent = client
            .get_agent(roster::GetAgentRequest { id: agent_id.to_owned() })
            .await?
            .into_inner()
            .agent
            .unwrap_or_default();
        let role_definition = if agent.role.is_empty() {
            None
        } else {
            match client.get_role_definition(roster::GetRoleDefinitionRequest { name: agent.role.clone() }).await {
                Ok(response) => response.into_inner().role,
                Err(status) if status.code() == tonic::Code::NotFound => None,
                Err(status) => return Err(status),
            }
        };
        let system_prompt = client
            .render_system_prompt(roster::RenderSystemPromptRequest { agent_id: agent_id.to_owned() })
            .await?
            .into_inner()
            .system_prompt;
        Ok(AgentContext {
            roster_role: agent.role,
            role_definition,
            system_prompt,
            max_iterations: if agent.max_iterations == 0 { DEFAULT_MAX_ITERATIONS } else { agent.max_iterations },
            llm_config_json: agent.llm_config_json,
            allow_delegation: agent.allow_delegation,
        })
    }
}

/// Whether a roster answer means "not now" rather than "no".
fn is_outage(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unknown
            | tonic::Code::ResourceExhausted
    )
}

/// The execution's inputs overlaid with the step's own.
fn merge_inputs(execution_inputs: &str, step_inputs: &str) -> String {
    let parse = |text: &str| match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let mut merged = parse(execution_inputs);
    merged.extend(parse(step_inputs));
    serde_json::Value::Object(merged).to_string()
}
