//! The driver's side of a team session: role assignments and changes of
//! lead (recorded with their events, which the notifier takes to the agents
//! concerned), and the checks a session step's executor passes before it
//! gets the step and when it reports the result.

use std::sync::Arc;

use muster_proto::common::v1::EventType;

use muster_format::ProcessDefinition;

use super::{driver::Driver, new_event};
use crate::{
    Error, Result,
    domain::{
        StepStatus,
        authority::{self, Matrix, RoleAssignment, Session, Subject},
        session::{StepView, context_window},
    },
    store::StepRow,
};

/// What a step task needs of its session: to check its executor and to brief it.
#[derive(Debug, Clone)]
pub(crate) struct SessionSnapshot {
    pub(crate) matrix: Arc<Matrix>,
    pub(crate) lead: String,
    pub(crate) session: Session,
    /// The session as text for the executor's prompt.
    pub(crate) context: String,
}

impl SessionSnapshot {
    /// The executor's role when it may perform the step (assigned, and its
    /// role permits the step's `action` when it declares one); else why not.
    pub(crate) fn admit(&self, agent_id: &str, action: Option<&str>) -> std::result::Result<String, String> {
        admit(&self.matrix, &self.lead, &self.session, agent_id, action)
    }
}

fn admit(
    matrix: &Matrix,
    lead: &str,
    session: &Session,
    agent_id: &str,
    action: Option<&str>,
) -> std::result::Result<String, String> {
    let subject = Subject { agent_id, roster_role: "", lead, session: Some(session) };
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

/// The steps of an execution as the session's views see them.
pub(crate) fn step_views<'a>(steps: &'a [StepRow], definition: &'a ProcessDefinition) -> Vec<StepView<'a>> {
    steps
        .iter()
        .zip(&definition.steps)
        .map(|(row, step)| StepView {
            id: &row.step_id,
            name: &step.name,
            status: row.status,
            executor: if row.executor.is_empty() { step.executor().unwrap_or_default() } else { &row.executor },
            started_at: row.started_at,
            timeout_seconds: step.timeout_seconds,
            error_code: &row.error_code,
            error_message: &row.error_message,
            approvers: if row.status == StepStatus::WaitingApproval { super::approvers(step) } else { Vec::new() },
        })
        .collect()
}

impl Driver {
    /// The session as a step task needs it, when the execution is one.
    pub(super) fn session_snapshot(&self) -> Option<SessionSnapshot> {
        let session = self.execution.session.as_ref()?;
        Some(SessionSnapshot {
            matrix: self.engine.matrix(),
            lead: self.execution.lead_agent_id.clone(),
            session: session.clone(),
            context: context_window(
                &self.execution.id,
                session,
                &self.execution.lead_agent_id,
                &step_views(&self.execution.steps, &self.definition),
            ),
        })
    }

    /// Whether the executor of a session step may report its result now:
    /// the session, or the executor's role, may have changed since it started.
    pub(super) fn admit_result(&self, position: usize) -> std::result::Result<(), String> {
        let Some(session) = &self.execution.session else { return Ok(()) };
        let executor = &self.execution.steps[position].executor;
        let action = self.definition.steps[position].action.as_deref();
        admit(&self.engine.matrix(), &self.execution.lead_agent_id, session, executor, action).map(drop)
    }

    pub(super) async fn assign_role(&mut self, assignment: RoleAssignment, matrix_version: u32) -> Result<()> {
        let Some(session) = &mut self.execution.session else {
            return Err(Error::FailedPrecondition(format!(
                "execution '{}' is not a session: roles are assigned in sessions (StartSession)",
                self.execution.id
            )));
        };
        session.assignments.insert(assignment.agent_id.clone(), assignment.clone());
        let mut event = new_event(&mut self.execution, EventType::RoleAssigned);
        event.participants = vec![assignment.agent_id.clone()];
        event.agent_id = assignment.agent_id.clone();
        event.matrix_version = matrix_version;
        event.detail =
            format!("{} assigned {} the role {}", assignment.assigned_by, assignment.agent_id, assignment.role);
        if !assignment.subtask.is_empty() {
            event.detail.push_str(&format!(": {}", assignment.subtask));
        }
        tracing::info!(execution_id = %self.execution.id, agent_id = %assignment.agent_id, role = %assignment.role, by = %assignment.assigned_by, "role assigned");
        self.stage_assignment(assignment);
        self.persist(&[], false, vec![event]).await
    }

    pub(super) async fn set_lead(&mut self, agent_id: String, by: &str) -> Result<()> {
        let previous = std::mem::replace(&mut self.execution.lead_agent_id, agent_id.clone());
        let mut event = new_event(&mut self.execution, EventType::LeadChanged);
        event.participants =
            [agent_id.clone(), previous.clone()].into_iter().filter(|agent| !agent.is_empty()).collect();
        event.agent_id = agent_id.clone();
        event.detail = if previous.is_empty() {
            format!("{by} made {agent_id} the lead")
        } else {
            format!("{by} made {agent_id} the lead in place of {previous}")
        };
        tracing::info!(execution_id = %self.execution.id, lead = %agent_id, %previous, by, "lead changed");
        self.persist(&[], true, vec![event]).await
    }
}
