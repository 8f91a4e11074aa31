//! Domain state as the gRPC answers show it.

use muster_proto::{common::v1 as common, execution::v1 as wire};
use muster_runtime::{
    json::{stored_struct, stored_value},
    time::{seconds_to_duration, to_timestamp},
};

use crate::{
    domain::{
        StepStatus,
        authority::{Matrix, RoleAssignment, SubtaskRequest, SubtaskStatus},
        model::{Execution, ProcessVersion, Step},
        session::activity,
    },
    engine::{step_roles, step_views, workers::WorkerView},
    wire::{execution_status_to_wire, finding_to_wire, roles_to_wire, step_status_to_wire},
};

/// What a process version's wire form carries besides its summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shown {
    /// The source and the kept warnings (GetProcess).
    All,
    /// The kept warnings (PublishProcess: the caller sent the source).
    Warnings,
    /// The warnings' count only (ListProcesses: a page of many; GetProcess
    /// to an agent the process does not name, since the source and its
    /// findings may quote the steps' literal inputs).
    Count,
}

pub(super) fn process_to_wire(process: &ProcessVersion, shown: Shown) -> wire::ProcessVersion {
    wire::ProcessVersion {
        name: process.name.clone(),
        version: process.version,
        source: if shown == Shown::All { process.source.clone() } else { String::new() },
        published_at: Some(to_timestamp(process.published_at)),
        step_count: process.step_count,
        warnings: match shown {
            Shown::All | Shown::Warnings => process.warnings.kept.iter().map(finding_to_wire).collect(),
            Shown::Count => Vec::new(),
        },
        warning_count: process.warnings.count,
    }
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(traceparent: &str) -> String {
    traceparent.split('-').nth(1).unwrap_or_default().to_owned()
}

/// An execution with its steps (none when `steps` is empty, as in lists),
/// with at most `max_outputs_bytes` of their outputs: later outputs are
/// omitted (`output_omitted`), so that an answer always fits in a message.
pub(super) fn execution_to_wire(
    execution: &Execution,
    steps: &[Step],
    definition: Option<&muster_format::ProcessDefinition>,
    max_outputs_bytes: usize,
) -> wire::Execution {
    let mut room = max_outputs_bytes;
    let states = match definition {
        Some(definition) if definition.steps.len() == steps.len() => steps
            .iter()
            .zip(&definition.steps)
            .map(|(step, step_definition)| {
                let output = step.output_json.as_deref().unwrap_or_default();
                let output_omitted = output.len() > room;
                if !output_omitted {
                    room -= output.len();
                }
                wire::StepState {
                    step_id: step_definition.id.clone(),
                    name: step_definition.name.clone(),
                    step_type: step_definition.step_type.clone(),
                    status: step_status_to_wire(step.status) as i32,
                    executor: if step.executor.is_empty() {
                        step_definition.executor().unwrap_or_default().to_owned()
                    } else {
                        step.executor.clone()
                    },
                    roles: Some(roles_to_wire(&step_roles(step_definition))),
                    attempt: step.attempt,
                    output: (!output_omitted && step.output_json.is_some()).then(|| stored_value(output)),
                    output_omitted,
                    error: (!step.error_code.is_empty() && step.status != StepStatus::Completed).then(|| {
                        common::StepError { code: step.error_code.clone(), message: step.error_message.clone() }
                    }),
                    started_at: step.started_at.map(to_timestamp),
                    ended_at: step.ended_at.map(to_timestamp),
                    depends_on: step_definition.depends_on.clone(),
                    waiting_for: if step.status == StepStatus::WaitingApproval {
                        step_definition.approvers()
                    } else {
                        Vec::new()
                    },
                    estimated_wait: (step.status == StepStatus::Queued && step.wait_seconds > 0)
                        .then(|| seconds_to_duration(step.wait_seconds)),
                    delegation_chain: step.delegation_chain.clone(),
                    cost: step.cost,
                    tokens_used: step.tokens_used,
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    wire::Execution {
        session: session_to_wire(execution, steps, definition),
        id: execution.id.clone(),
        process_name: execution.process_name.clone(),
        process_version: execution.process_version,
        status: execution_status_to_wire(execution.status) as i32,
        reason: execution.reason.clone(),
        lead_agent_id: execution.lead_agent_id.clone(),
        trace_id: trace_id(&execution.trace_parent),
        started_at: Some(to_timestamp(execution.started_at)),
        ended_at: execution.ended_at.map(to_timestamp),
        steps: states,
        inputs: stored_struct(&execution.inputs_json),
    }
}

/// The session of an execution, each assignment with its current activity
/// (known only with the steps).
pub(super) fn session_to_wire(
    execution: &Execution,
    steps: &[Step],
    definition: Option<&muster_format::ProcessDefinition>,
) -> Option<wire::Session> {
    let session = execution.session.as_ref()?;
    let views = match definition {
        Some(definition) if definition.steps.len() == steps.len() => step_views(steps, definition),
        _ => Vec::new(),
    };
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

pub(super) fn subtask_to_wire(execution_id: &str, subtask: &SubtaskRequest) -> wire::SubtaskRequest {
    wire::SubtaskRequest {
        id: subtask.id.clone(),
        execution_id: execution_id.to_owned(),
        requested_by: subtask.requested_by.clone(),
        agent_id: subtask.agent_id.clone(),
        role: subtask.role.clone(),
        subtask: subtask.subtask.clone(),
        reason: subtask.reason.clone(),
        status: match subtask.status {
            SubtaskStatus::Pending => wire::SubtaskStatus::Pending,
            SubtaskStatus::Approved => wire::SubtaskStatus::Approved,
            SubtaskStatus::Rejected => wire::SubtaskStatus::Rejected,
        } as i32,
        decided_by: subtask.decided_by.clone(),
        note: subtask.note.clone(),
        requested_at: Some(to_timestamp(subtask.requested_at)),
        decided_at: (subtask.decided_at > 0).then(|| to_timestamp(subtask.decided_at)),
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

pub(super) fn worker_to_wire(worker: &WorkerView) -> wire::WorkerInfo {
    let now = muster_runtime::time::now_millis();
    wire::WorkerInfo {
        worker_id: worker.worker_id.to_string(),
        name: worker.name.clone(),
        agents: worker.agents.clone(),
        tools: worker.tools.clone(),
        in_flight: u32::try_from(worker.in_flight).unwrap_or(u32::MAX),
        max_concurrency: u32::try_from(worker.max_concurrency).unwrap_or(u32::MAX),
        connected_at: Some(to_timestamp(now - worker.connected_for.as_millis() as i64)),
        last_seen_at: Some(to_timestamp(now - worker.silent_for.as_millis() as i64)),
        relayed_by: worker.relayed_by.clone().unwrap_or_default(),
    }
}
