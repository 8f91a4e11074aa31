//! Wire conversions of stored state.

use muster_proto::{common::v1 as common, execution::v1 as wire};
use muster_runtime::time::to_timestamp;

use crate::{
    domain::{
        StepStatus,
        authority::{Matrix, RoleAssignment},
        session::activity,
    },
    engine::{approvers, step_roles, step_views},
    store::{ExecutionRow, ProcessRow},
};

pub(super) fn process_to_wire(process: ProcessRow, with_source: bool) -> wire::ProcessVersion {
    wire::ProcessVersion {
        name: process.name,
        version: process.version,
        source: if with_source { process.source } else { String::new() },
        published_at: Some(to_timestamp(process.published_at)),
        step_count: process.step_count,
        warnings: process.warnings,
    }
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(traceparent: &str) -> String {
    traceparent.split('-').nth(1).unwrap_or_default().to_owned()
}

pub(super) fn execution_to_wire(
    execution: ExecutionRow,
    definition: Option<&muster_format::ProcessDefinition>,
) -> wire::Execution {
    let steps = execution
        .steps
        .iter()
        .map(|row| {
            let step_definition = definition.and_then(|definition| definition.steps.get(row.position as usize));
            wire::StepState {
                step_id: row.step_id.clone(),
                name: step_definition.map(|step| step.name.clone()).unwrap_or_default(),
                r#type: step_definition.map(|step| step.step_type.clone()).unwrap_or_default(),
                status: row.status.to_wire() as i32,
                executor: if row.executor.is_empty() {
                    step_definition.and_then(|step| step.executor()).unwrap_or_default().to_owned()
                } else {
                    row.executor.clone()
                },
                roles: step_definition.map(step_roles),
                attempt: row.attempt,
                output_json: row.output_json.clone(),
                error: (!row.error_code.is_empty() && row.status != StepStatus::Completed)
                    .then(|| common::StepError { code: row.error_code.clone(), message: row.error_message.clone() }),
                started_at: row.started_at.map(to_timestamp),
                ended_at: row.ended_at.map(to_timestamp),
                depends_on: step_definition.map(|step| step.depends_on.clone()).unwrap_or_default(),
                waiting_for: match (row.status, step_definition) {
                    (StepStatus::WaitingApproval, Some(step)) => approvers(step),
                    _ => Vec::new(),
                },
                wait_seconds: 0,
                delegation_chain: Vec::new(),
                cost: row.cost,
                tokens_used: row.tokens_used,
            }
        })
        .collect();
    let session = session_to_wire(&execution, definition);
    wire::Execution {
        session,
        id: execution.id,
        process_name: execution.process_name,
        process_version: execution.process_version,
        status: execution.status.to_wire() as i32,
        reason: execution.reason,
        lead_agent_id: execution.lead_agent_id,
        trace_id: trace_id(&execution.trace_parent),
        started_at: Some(to_timestamp(execution.started_at)),
        ended_at: execution.ended_at.map(to_timestamp),
        steps,
        inputs_json: execution.inputs_json,
    }
}

/// The session of an execution, each assignment with its current activity
/// (known only with the definition).
pub(super) fn session_to_wire(
    execution: &ExecutionRow,
    definition: Option<&muster_format::ProcessDefinition>,
) -> Option<wire::Session> {
    let session = execution.session.as_ref()?;
    let views = definition.map(|definition| step_views(&execution.steps, definition)).unwrap_or_default();
    Some(wire::Session {
        task: Some(wire::SessionTask { title: session.title.clone(), description: session.description.clone() }),
        assignments: session
            .assignments
            .values()
            .map(|assignment| assignment_to_wire(assignment, activity(&assignment.agent_id, &views)))
            .collect(),
    })
}

pub(super) fn assignment_to_wire(assignment: &RoleAssignment, status: String) -> wire::RoleAssignment {
    wire::RoleAssignment {
        agent_id: assignment.agent_id.clone(),
        role: assignment.role.clone(),
        subtask: assignment.subtask.clone(),
        status,
        assigned_by: assignment.assigned_by.clone(),
        assigned_at: Some(to_timestamp(assignment.assigned_at)),
    }
}

pub(super) fn matrix_to_wire(matrix: &Matrix, with_source: bool) -> wire::PermissionMatrixVersion {
    wire::PermissionMatrixVersion {
        version: matrix.version,
        source: if with_source { matrix.source.clone() } else { String::new() },
        roles: matrix
            .roles
            .iter()
            .map(|role| wire::MatrixRole {
                name: role.name.clone(),
                permitted_actions: role.permitted_actions.clone(),
                forbidden_actions: role.forbidden_actions.clone(),
            })
            .collect(),
        created_at: Some(to_timestamp(matrix.created_at)),
        created_by: matrix.created_by.clone(),
    }
}
