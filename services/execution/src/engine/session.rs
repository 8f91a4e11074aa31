//! The driver's side of a team session: role assignments and changes of
//! lead (recorded with their events, which the notifier takes to the agents
//! concerned), and the checks a session step's executor passes before it
//! gets the step and when it reports the result.

use muster_format::ProcessDefinition;

use super::driver::Driver;
use crate::{
    Error, Result,
    domain::{
        StepStatus,
        authority::{
            self, MAX_SUBTASK_REQUESTS, Matrix, RoleAssignment, Session, Subject, SubtaskRequest, SubtaskStatus,
        },
        model::{EventKind, Step},
        session::{ASKED_IN_SESSIONS, ASSIGNED_IN_SESSIONS, StepView},
    },
};

/// The executor's session role when it may perform a step (assigned, and
/// its role permits the step's `action` when it declares one); else why not.
pub(crate) fn admit(
    matrix: &Matrix,
    lead: &str,
    session: &Session,
    agent_id: &str,
    action: Option<&str>,
) -> std::result::Result<String, String> {
    let subject = Subject { agent_id, roster_role: "", roster_actions: None, lead, session: Some(session) };
    let Some(role) = subject.role() else {
        return Err(format!(
            "{agent_id} is not assigned in this session (neither its lead nor a participant): assign it a role first"
        ));
    };
    match action {
        Some(action) => {
            let verdict = authority::check(matrix, &subject, action);
            if verdict.allowed {
                Ok(verdict.role)
            } else {
                Err(format!("{agent_id} may not '{action}': {}", verdict.reason))
            }
        }
        None => Ok(role.to_owned()),
    }
}

/// Why the steps of `definition` would be refused to their executors in
/// `session` because they are not assigned in it (one reason per step;
/// empty when every executor is the lead or a participant), checked before
/// the session starts. Whether a role permits a step's action is checked
/// when the step runs, as roles may change in between. Steps decided by
/// people (`human_approval`) and steps whose executor the roster picks
/// (`delegate`) are not checked.
pub(crate) fn refused_steps(
    matrix: &Matrix,
    lead: &str,
    session: &Session,
    definition: &ProcessDefinition,
) -> Vec<String> {
    definition
        .steps
        .iter()
        .filter(|step| step.step_type != "human_approval" && step.delegate.is_none())
        .filter_map(|step| {
            let executor = step.executor().filter(|executor| !executor.is_empty())?;
            let refused = admit(matrix, lead, session, executor, None).err()?;
            Some(format!("step '{}': {refused}", step.id))
        })
        .collect()
}

/// The steps of an execution as the session's views see them.
pub(crate) fn step_views<'a>(steps: &'a [Step], definition: &'a ProcessDefinition) -> Vec<StepView<'a>> {
    steps
        .iter()
        .zip(&definition.steps)
        .map(|(step, step_definition)| StepView {
            id: &step_definition.id,
            name: &step_definition.name,
            status: step.status,
            executor: if step.executor.is_empty() {
                step_definition.executor().unwrap_or_default()
            } else {
                &step.executor
            },
            started_at: step.started_at,
            timeout_seconds: step_definition.timeout_seconds,
            error_code: &step.error_code,
            error_message: &step.error_message,
            approvers: if step.status == StepStatus::WaitingApproval {
                step_definition.approvers()
            } else {
                Vec::new()
            },
        })
        .collect()
}

impl Driver {
    /// Whether the executor of a session step may report its result now:
    /// the session, or the executor's role, may have changed since it started.
    pub(super) fn admit_result(&self, position: usize) -> std::result::Result<(), String> {
        let Some(session) = &self.execution.session else { return Ok(()) };
        let executor = &self.steps[position].executor;
        let action = self.definition(position).action.as_deref();
        admit(&self.engine.matrix(), &self.execution.lead_agent_id, session, executor, action).map(drop)
    }

    pub(super) fn assign_role(&mut self, assignment: RoleAssignment, matrix_version: u32) -> Result<()> {
        let Some(session) = &mut self.execution.session else {
            return Err(Error::not_a_session(&self.execution.id, ASSIGNED_IN_SESSIONS));
        };
        session.assignments.insert(assignment.agent_id.clone(), assignment.clone());
        let mut event = self.execution_event(EventKind::RoleAssigned);
        event.participants = vec![assignment.agent_id.clone()];
        event.agent_id = assignment.agent_id.clone();
        event.matrix_version = matrix_version;
        event.detail =
            format!("{} assigned {} the role {}", assignment.assigned_by, assignment.agent_id, assignment.role);
        if !assignment.subtask.is_empty() {
            event.detail.push_str(&format!(": {}", assignment.subtask));
        }
        tracing::info!(execution_id = %self.execution.id, agent_id = %assignment.agent_id, role = %assignment.role, by = %assignment.assigned_by, "role assigned");
        self.record(event);
        self.stage_assignment(assignment);
        Ok(())
    }

    pub(super) fn set_lead(&mut self, agent_id: String, by: &str) {
        let previous = std::mem::replace(&mut self.execution.lead_agent_id, agent_id.clone());
        let mut event = self.execution_event(EventKind::LeadChanged);
        event.participants =
            [agent_id.clone(), previous.clone()].into_iter().filter(|agent| !agent.is_empty()).collect();
        event.agent_id = agent_id.clone();
        event.detail = if previous.is_empty() {
            format!("{by} made {agent_id} the lead")
        } else {
            format!("{by} made {agent_id} the lead in place of {previous}")
        };
        tracing::info!(execution_id = %self.execution.id, lead = %agent_id, %previous, by, "lead changed");
        self.record(event);
        self.stage_execution();
    }

    pub(super) fn request_subtask(&mut self, request: SubtaskRequest) -> Result<()> {
        let Some(session) = &mut self.execution.session else {
            return Err(Error::not_a_session(&self.execution.id, ASKED_IN_SESSIONS));
        };
        if session.subtasks.len() >= MAX_SUBTASK_REQUESTS {
            return Err(Error::precondition(
                "TOO_MANY_SUBTASK_REQUESTS",
                format!("execution/{}", self.execution.id),
                format!(
                    "session '{}' already holds {MAX_SUBTASK_REQUESTS} subtask requests, its limit: \
                     ask the lead to assign the work (AssignRole)",
                    self.execution.id
                ),
            ));
        }
        session.subtasks.insert(request.id.clone(), request.clone());
        let mut event = self.execution_event(EventKind::SubtaskRequested);
        event.participants = vec![request.agent_id.clone()];
        event.agent_id = request.agent_id.clone();
        event.detail = format!(
            "{} asks for a subtask for {} as {} ({}): {}",
            request.requested_by, request.agent_id, request.role, request.id, request.subtask
        );
        tracing::info!(execution_id = %self.execution.id, request_id = %request.id, by = %request.requested_by, agent_id = %request.agent_id, "subtask requested");
        self.record(event);
        self.stage_subtask(request);
        Ok(())
    }

    pub(super) fn decide_subtask(
        &mut self,
        decided: SubtaskRequest,
        assignment: Option<RoleAssignment>,
        matrix_version: u32,
    ) -> Result<()> {
        let Some(session) = &mut self.execution.session else {
            return Err(Error::not_a_session(&self.execution.id, ASKED_IN_SESSIONS));
        };
        let Some(pending) = session.subtasks.get_mut(&decided.id) else {
            return Err(Error::no_subtask_request(&self.execution.id, &decided.id));
        };
        if pending.status != SubtaskStatus::Pending {
            return Err(Error::precondition(
                "SUBTASK_DECIDED",
                format!("execution/{}/subtasks/{}", self.execution.id, decided.id),
                format!(
                    "subtask request '{}' was already {} by {}",
                    decided.id,
                    pending.status.as_str(),
                    pending.decided_by
                ),
            ));
        }
        *pending = decided.clone();
        if let Some(assignment) = assignment {
            self.assign_role(assignment, matrix_version)?;
        }
        let mut event = self.execution_event(EventKind::SubtaskDecided);
        event.participants = vec![decided.requested_by.clone()];
        if decided.agent_id != decided.requested_by {
            event.participants.push(decided.agent_id.clone());
        }
        event.agent_id = decided.agent_id.clone();
        event.matrix_version = matrix_version;
        event.detail = format!(
            "{} {} the subtask {} asked for {} ({}): {}",
            decided.decided_by,
            decided.status.as_str(),
            decided.requested_by,
            decided.agent_id,
            decided.id,
            decided.subtask
        );
        if !decided.note.is_empty() {
            event.detail.push_str(&format!(" ({})", decided.note));
        }
        tracing::info!(execution_id = %self.execution.id, request_id = %decided.id, by = %decided.decided_by, status = decided.status.as_str(), "subtask decided");
        self.record(event);
        self.stage_subtask(decided);
        Ok(())
    }
}
