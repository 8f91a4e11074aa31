//! The contracts' forms of the domain types, for the three edges where they
//! leave the service: the gRPC answers, the clients of the roster and the
//! notifier (`clients/`), and the event log (`store/`), which keeps each
//! event in its wire encoding so the notifier and watchers are sent stored
//! bytes as they are.

use muster_proto::{common::v1 as common, execution::v1 as wire, roster::v1 as roster};
use muster_runtime::{
    json::{stored_struct, stored_value},
    time::{seconds_to_duration, to_duration, to_timestamp},
};

use crate::{
    domain::{
        ExecutionStatus, StepStatus,
        authority::{Matrix, RoleAssignment, SubtaskRequest, SubtaskStatus},
        model::{
            Assignment, Decision, DecisionKind, Event, EventKind, Execution, Finding, HistoryEntry, MemoryOutput,
            ProcessVersion, SharedMemory, Step, Tool, ToolCall, ToolOutput,
        },
        payload::{PayloadKind, PayloadRef},
        progress::{ModelCall, Progress},
        session::activity,
    },
    engine::{step_roles, step_views, workers::WorkerView},
    grpc::windows::Reuse,
};

pub(crate) fn finding_to_wire(finding: &Finding) -> common::Diagnostic {
    common::Diagnostic {
        severity: if finding.error { common::Severity::Error } else { common::Severity::Warning } as i32,
        code: finding.code.clone(),
        message: finding.message.clone(),
        path: finding.path.clone(),
        line: finding.line,
        column: finding.column,
    }
}

pub(crate) fn finding_from_wire(diagnostic: common::Diagnostic) -> Finding {
    Finding {
        error: diagnostic.severity == common::Severity::Error as i32,
        code: diagnostic.code,
        message: diagnostic.message,
        path: diagnostic.path,
        line: diagnostic.line,
        column: diagnostic.column,
    }
}

pub(crate) fn roles_to_wire(roles: &muster_format::StepRoles) -> common::StepRoles {
    common::StepRoles {
        executor: roles.executor.clone(),
        monitors: roles.monitors.clone(),
        informed: roles.informed.clone(),
    }
}

fn event_type(kind: EventKind) -> common::EventType {
    match kind {
        EventKind::ExecutionStarted => common::EventType::ExecutionStarted,
        EventKind::StepStarted => common::EventType::StepStarted,
        EventKind::StepCompleted => common::EventType::StepCompleted,
        EventKind::StepFailed => common::EventType::StepFailed,
        EventKind::StepQueued => common::EventType::StepQueued,
        EventKind::StepDelegated => common::EventType::StepDelegated,
        EventKind::StepEscalated => common::EventType::StepEscalated,
        EventKind::ApprovalRequested => common::EventType::ApprovalRequested,
        EventKind::StepIntervened => common::EventType::StepIntervened,
        EventKind::ExecutionFinished => common::EventType::ExecutionFinished,
        EventKind::SessionStarted => common::EventType::SessionStarted,
        EventKind::RoleAssigned => common::EventType::RoleAssigned,
        EventKind::LeadChanged => common::EventType::LeadChanged,
        EventKind::BudgetExceeded => common::EventType::BudgetExceeded,
        EventKind::StepProgress => common::EventType::StepProgress,
        EventKind::SubtaskRequested => common::EventType::SubtaskRequested,
        EventKind::SubtaskDecided => common::EventType::SubtaskDecided,
    }
}

/// A worker's progress report as the driver takes it. A model call's
/// latency that is not a valid duration counts as 0.
pub(crate) fn progress_from_wire(progress: wire::StepProgress) -> Progress {
    Progress {
        tokens_used: progress.tokens_used,
        cost: progress.cost,
        model_call: progress.model_call.map(|call| ModelCall {
            iteration: call.iteration,
            model: call.model,
            input_tokens: call.input_tokens,
            output_tokens: call.output_tokens,
            latency_ms: muster_runtime::time::from_duration(call.latency.as_ref()).unwrap_or_default(),
            tool_calls: call.tool_calls,
            cost: call.cost,
        }),
    }
}

pub(crate) fn execution_status_to_wire(status: ExecutionStatus) -> common::ExecutionStatus {
    match status {
        ExecutionStatus::Running => common::ExecutionStatus::Running,
        ExecutionStatus::Completed => common::ExecutionStatus::Completed,
        ExecutionStatus::Failed => common::ExecutionStatus::Failed,
        ExecutionStatus::Cancelled => common::ExecutionStatus::Cancelled,
        ExecutionStatus::Paused => common::ExecutionStatus::Paused,
    }
}

pub(crate) fn execution_status_from_wire(status: common::ExecutionStatus) -> Option<ExecutionStatus> {
    match status {
        common::ExecutionStatus::Unspecified => None,
        common::ExecutionStatus::Running => Some(ExecutionStatus::Running),
        common::ExecutionStatus::Completed => Some(ExecutionStatus::Completed),
        common::ExecutionStatus::Failed => Some(ExecutionStatus::Failed),
        common::ExecutionStatus::Cancelled => Some(ExecutionStatus::Cancelled),
        common::ExecutionStatus::Paused => Some(ExecutionStatus::Paused),
    }
}

pub(crate) fn step_status_to_wire(status: StepStatus) -> wire::StepStatus {
    match status {
        StepStatus::Pending => wire::StepStatus::Pending,
        StepStatus::Ready => wire::StepStatus::Ready,
        StepStatus::Queued => wire::StepStatus::Queued,
        StepStatus::WaitingForWorker => wire::StepStatus::WaitingForWorker,
        StepStatus::Running => wire::StepStatus::Running,
        StepStatus::WaitingApproval => wire::StepStatus::WaitingApproval,
        StepStatus::Paused => wire::StepStatus::Paused,
        StepStatus::Completed => wire::StepStatus::Completed,
        StepStatus::Failed => wire::StepStatus::Failed,
        StepStatus::Cancelled => wire::StepStatus::Cancelled,
    }
}

pub(crate) fn event_to_wire(event: &Event) -> common::StepEvent {
    common::StepEvent {
        event_id: event.event_id.clone(),
        sequence: event.sequence,
        event_type: event_type(event.kind) as i32,
        occurred_at: Some(to_timestamp(event.occurred_at)),
        execution_id: event.execution_id.clone(),
        process_name: event.process_name.clone(),
        process_version: event.process_version,
        step_id: event.step_id.clone(),
        step_name: event.step_name.clone(),
        roles: event.roles.as_ref().map(roles_to_wire),
        lead_agent_id: event.lead_agent_id.clone(),
        output: event.output_json.as_deref().map(stored_value),
        error: event
            .error
            .as_ref()
            .map(|(code, message)| common::StepError { code: code.clone(), message: message.clone() }),
        retry_count: event.retry_count,
        cost: event.cost,
        tokens_used: event.tokens_used,
        duration: (event.duration_ms > 0).then(|| to_duration(event.duration_ms)),
        agent_id: event.agent_id.clone(),
        estimated_wait: (event.wait_seconds > 0).then(|| seconds_to_duration(event.wait_seconds)),
        detail: event.detail.clone(),
        waiting_for: event.waiting_for.clone(),
        execution_status: event.execution_status.map_or(0, |status| execution_status_to_wire(status) as i32),
        trace_parent: event.trace_parent.clone(),
        participants: event.participants.clone(),
        matrix_version: event.matrix_version,
    }
}

pub(crate) fn decision_from_wire(decision: roster::DelegationDecision) -> Decision {
    Decision {
        kind: match roster::DecisionKind::try_from(decision.decision) {
            Ok(roster::DecisionKind::Queue) => DecisionKind::Queue,
            Ok(roster::DecisionKind::Escalate) => DecisionKind::Escalate,
            _ => DecisionKind::Delegate,
        },
        tier: decision.tier,
        primary_agent_id: decision.primary_agent_id,
        primary_reason: decision.primary_reason,
        fallback_agent_id: decision.fallback_agent_id,
        fallback_reason: decision.fallback_reason,
        reasoning: decision.reasoning,
        wait_seconds: decision.estimated_wait.as_ref().map_or(0, |wait| wait.seconds.max(0) as u64),
        notes: decision.notes,
        text: decision.text,
        candidates: decision.candidates,
    }
}

pub(crate) fn decision_to_wire(decision: &Decision) -> roster::DelegationDecision {
    roster::DelegationDecision {
        decision: match decision.kind {
            DecisionKind::Delegate => roster::DecisionKind::Delegate,
            DecisionKind::Queue => roster::DecisionKind::Queue,
            DecisionKind::Escalate => roster::DecisionKind::Escalate,
        } as i32,
        tier: decision.tier,
        primary_agent_id: decision.primary_agent_id.clone(),
        primary_reason: decision.primary_reason.clone(),
        fallback_agent_id: decision.fallback_agent_id.clone(),
        fallback_reason: decision.fallback_reason.clone(),
        reasoning: decision.reasoning.clone(),
        estimated_wait: (decision.wait_seconds > 0).then(|| seconds_to_duration(decision.wait_seconds)),
        notes: decision.notes.clone(),
        text: decision.text.clone(),
        candidates: decision.candidates.clone(),
    }
}

fn history_to_wire(entry: &HistoryEntry) -> wire::HistoryEntry {
    wire::HistoryEntry {
        step_id: entry.step_id.clone(),
        agent_id: entry.agent_id.clone(),
        action: entry.action.to_owned(),
        at: entry.at.map(to_timestamp),
    }
}

pub(crate) fn memory_entry_to_wire(entry: &crate::domain::memory::MemoryEntry) -> wire::MemoryEntry {
    wire::MemoryEntry {
        id: entry.id.clone(),
        scope: if entry.role.is_empty() { wire::MemoryScope::Global } else { wire::MemoryScope::Role } as i32,
        role: entry.role.clone(),
        text: entry.text.clone(),
        author: entry.author.clone(),
        execution_id: entry.execution_id.clone(),
        created_at: Some(to_timestamp(entry.created_at)),
    }
}

/// An assignment on the wire: every field but its `shared_memory`, which
/// travels encoded beside it ([`shared_memory_reusing`]), less what a
/// worker keeps from the assignment before it (`grpc::windows`): the
/// history's first `reuse.history` entries, and the shared memory's last
/// `reuse.memory` (`shared_memory_reused`).
pub(crate) fn assignment_reusing(assignment: &Assignment, reuse: Reuse) -> wire::Assignment {
    let context = &assignment.context;
    wire::Assignment {
        assignment_id: assignment.assignment_id.clone(),
        idempotency_key: assignment.idempotency_key.clone(),
        attempt: assignment.attempt,
        agent_id: assignment.agent_id.clone(),
        execution_id: assignment.execution_id.clone(),
        process_name: assignment.process_name.clone(),
        process_version: assignment.process_version,
        step_id: assignment.step_id.clone(),
        step_name: assignment.step_name.clone(),
        step_type: assignment.step_type.clone(),
        message: assignment.message.clone(),
        inputs: stored_struct(&assignment.inputs_json),
        upstream_outputs: assignment
            .upstream_outputs
            .iter()
            .map(|(step_id, output)| (step_id.clone(), stored_value(output)))
            .collect(),
        shared_memory: None,
        shared_memory_left_out: assignment.shared_memory_left_out,
        history: assignment.history[reuse.history..].iter().map(history_to_wire).collect(),
        role_definition: context.role_definition.as_ref().map(|role| roster::RoleDefinition {
            // The role's budget and throttle concern its runs' admission, not the worker.
            budget: None,
            throttle: None,
            ..muster_runtime::roles::role_to_wire(role)
        }),
        system_prompt: context.system_prompt.to_string(),
        roles: Some(roles_to_wire(&assignment.roles)),
        delegation_chain: assignment.delegation_chain.clone(),
        timeout: (assignment.timeout_ms > 0).then(|| to_duration(assignment.timeout_ms)),
        trace_parent: assignment.trace_parent.clone(),
        max_iterations: context.max_iterations,
        llm_config: stored_struct(&context.llm_config_json),
        allow_delegation: context.allow_delegation,
        session_role: assignment.session_role.clone(),
        session_context: assignment.session_context.clone(),
        payload_refs: assignment.payload_refs.iter().map(payload_ref_to_wire).collect(),
        memory: context.memory.iter().map(memory_entry_to_wire).collect(),
        shared_memory_reused: reuse.memory as u32,
        history_reused: reuse.history as u32,
    }
}

/// The shared memory as an encoded `google.protobuf.Struct`, made once for
/// every assignment that carries it, of each output's part made once: a
/// `Struct` whose fields are encoded one at a time and put side by side is
/// the `Struct` of them all.
pub(crate) fn shared_memory_to_wire(memory: &SharedMemory) -> bytes::Bytes {
    memory.encoded.get_or_init(|| entries_to_wire(&memory.outputs)).clone()
}

/// [`shared_memory_to_wire`] without its last `reused` entries.
pub(crate) fn shared_memory_reusing(memory: &SharedMemory, reused: usize) -> bytes::Bytes {
    match memory.outputs.len() - reused {
        0 => bytes::Bytes::new(),
        1 => entry_to_wire(&memory.outputs[0]).clone(),
        _ if reused == 0 => shared_memory_to_wire(memory),
        sent => entries_to_wire(&memory.outputs[..sent]),
    }
}

fn entries_to_wire(outputs: &[std::sync::Arc<MemoryOutput>]) -> bytes::Bytes {
    let mut encoded = Vec::new();
    for entry in outputs {
        encoded.extend_from_slice(entry_to_wire(entry));
    }
    encoded.into()
}

/// One output's field of the shared memory's `Struct`, encoded once.
fn entry_to_wire(entry: &MemoryOutput) -> &bytes::Bytes {
    use prost::Message as _;
    entry.encoded.get_or_init(|| {
        let fields = [(entry.step_id.clone(), stored_value(&entry.output))].into();
        prost_types::Struct { fields }.encode_to_vec().into()
    })
}

fn payload_ref_to_wire(reference: &PayloadRef) -> wire::PayloadRef {
    wire::PayloadRef {
        step_id: reference.step_id.clone(),
        kind: match reference.kind {
            PayloadKind::Output => wire::PayloadKind::Output,
            PayloadKind::Inputs => wire::PayloadKind::Inputs,
        } as i32,
        size_bytes: reference.size_bytes,
    }
}

pub(crate) fn payload_kind_from_wire(kind: i32) -> Option<PayloadKind> {
    match wire::PayloadKind::try_from(kind) {
        Ok(wire::PayloadKind::Output) => Some(PayloadKind::Output),
        Ok(wire::PayloadKind::Inputs) => Some(PayloadKind::Inputs),
        _ => None,
    }
}

/// A tool a worker provides; its schema must be JSON (a number that is not
/// finite is not).
pub(crate) fn tool_from_wire(tool: wire::ToolSpec) -> Result<Tool, String> {
    let input_schema_json = match &tool.input_schema {
        Some(schema) => muster_runtime::json::struct_to_text(Some(schema))?,
        None => String::new(),
    };
    Ok(Tool { name: tool.name, description: tool.description, input_schema_json })
}

pub(crate) fn tool_to_wire(tool: &Tool) -> wire::ToolSpec {
    wire::ToolSpec {
        name: tool.name.clone(),
        description: tool.description.clone(),
        input_schema: stored_struct(&tool.input_schema_json),
    }
}

pub(crate) fn tool_call_to_wire(call: &ToolCall) -> wire::ToolCall {
    wire::ToolCall {
        call_id: call.call_id.clone(),
        tool: call.tool.clone(),
        input: stored_struct(&call.input_json),
        agent_id: call.agent_id.clone(),
        trace_parent: call.trace_parent.clone(),
    }
}

/// A tool call another replica relayed (it checked the input).
pub(crate) fn tool_call_from_wire(call: wire::ToolCall) -> ToolCall {
    ToolCall {
        call_id: call.call_id,
        tool: call.tool,
        input_json: stored_text(call.input.as_ref()),
        agent_id: call.agent_id,
        trace_parent: call.trace_parent,
    }
}

/// A tool's answer from a worker; an output JSON cannot hold makes it a
/// tool fault.
pub(crate) fn tool_output_from_wire(output: wire::ToolOutput) -> ToolOutput {
    let output_json = match output.output.as_ref().map(|value| muster_runtime::json::value_to_text(Some(value))) {
        None => String::new(),
        Some(Ok(text)) => text,
        Some(Err(problem)) => return ToolOutput::error(500, format!("the tool's output {problem}")),
    };
    ToolOutput { output_json, error: output.error, status_code: output.status_code }
}

pub(crate) fn tool_output_to_wire(output: ToolOutput) -> wire::ToolOutput {
    let value = (!output.output_json.is_empty()).then(|| stored_value(&output.output_json));
    wire::ToolOutput { output: value, error: output.error, status_code: output.status_code }
}

/// Stored JSON text of a wire object that came from the roster or another
/// replica (which checked it): empty when not set.
fn stored_text(object: Option<&prost_types::Struct>) -> String {
    object.and_then(|object| muster_runtime::json::struct_to_text(Some(object)).ok()).unwrap_or_default()
}

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
            .map(|assignment| role_assignment_to_wire(assignment, activity(&assignment.agent_id, &views)))
            .collect(),
    })
}

pub(super) fn role_assignment_to_wire(assignment: &RoleAssignment, status: String) -> wire::RoleAssignment {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::model::{AgentContext, RoleDefinition};

    #[test]
    fn a_memory_entry_made_from_the_value_is_the_one_made_from_the_text() {
        use prost::Message as _;
        let text =
            r#"{"agent":"a-1","built_on":["s-1","s-2"],"n":-1.5,"nested":{"ok":true,"none":null},"say":"\"é\"\n"}"#;
        let value = stored_value(text);
        let output: Arc<str> = Arc::from(muster_runtime::json::value_to_text(Some(&value)).unwrap());
        let from_text = MemoryOutput { step_id: "s-3".into(), output: output.clone(), encoded: Default::default() };
        let from_value = MemoryOutput::with_value("s-3".into(), output, &value.encode_to_vec());
        assert_eq!(entry_to_wire(&from_value), entry_to_wire(&from_text));
        // A step id long enough for a two-byte length, and a null.
        let (long, null) = ("s".repeat(300), stored_value("null"));
        let from_text = MemoryOutput { step_id: long.clone(), output: "null".into(), encoded: Default::default() };
        let from_value = MemoryOutput::with_value(long, "null".into(), &null.encode_to_vec());
        assert_eq!(entry_to_wire(&from_value), entry_to_wire(&from_text));
    }

    #[test]
    fn an_assignment_carries_the_paths_its_role_narrows_the_workspace_to() {
        let role = RoleDefinition {
            name: "writer".into(),
            tools: vec!["read_file".into(), "write_file".into()],
            read_paths: vec!["notes/".into(), "brief.md".into()],
            write_paths: vec!["out/".into()],
            ..RoleDefinition::default()
        };
        let context = AgentContext {
            roster_role: "writer".into(),
            role_definition: Some(role),
            system_prompt: Arc::from(""),
            max_iterations: 10,
            llm_config_json: String::new(),
            allow_delegation: false,
            memory: Vec::new(),
        };
        let assignment = Assignment {
            assignment_id: "e/s/1".into(),
            idempotency_key: "e/s".into(),
            attempt: 1,
            agent_id: "w".into(),
            execution_id: "e".into(),
            process_name: "p".into(),
            process_version: 1,
            step_id: "s".into(),
            step_name: "s".into(),
            step_type: "agent_task".into(),
            message: String::new(),
            inputs_json: "{}".into(),
            upstream_outputs: Vec::new(),
            payload_refs: Vec::new(),
            shared_memory: Arc::default(),
            shared_memory_left_out: 0,
            history: Arc::from(Vec::new()),
            context: Arc::new(context),
            roles: muster_format::StepRoles { executor: "w".into(), monitors: Vec::new(), informed: Vec::new() },
            delegation_chain: Vec::new(),
            timeout_ms: 0,
            trace_parent: String::new(),
            session_role: String::new(),
            session_context: String::new(),
        };
        let role = assignment_reusing(&assignment, Reuse::default()).role_definition.expect("the role");
        assert_eq!(
            (role.read_paths, role.write_paths),
            (vec!["notes/".into(), "brief.md".into()], vec!["out/".into()])
        );
    }
}
