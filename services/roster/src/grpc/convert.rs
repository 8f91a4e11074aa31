//! Wire <-> domain conversions. Conversions from the wire validate.

use muster_proto::roster::v1 as pb;
use muster_runtime::{
    json::{stored_struct, struct_to_text},
    roles,
    time::{from_timestamp, to_duration, to_timestamp},
};

use crate::domain::import::{FileDiagnostic, Severity};
use crate::domain::{
    delegation::{Decision, DecisionKind, DelegationRequest, Tier, Urgency},
    model::{Agent, AgentField, RoleDefinition, Status, Team, normalize_tags, validate_id, validate_name},
};
use crate::error::{Error, Result};
use crate::store::DelegationRecord;

/// The longest task id accepted.
const MAX_TASK_ID_LENGTH: usize = 512;

pub(crate) fn status_to_wire(status: Status) -> pb::AgentStatus {
    match status {
        Status::Idle => pb::AgentStatus::Idle,
        Status::Active => pb::AgentStatus::Active,
        Status::Busy => pb::AgentStatus::Busy,
        Status::Offline => pb::AgentStatus::Offline,
    }
}

/// `None` for UNSPECIFIED.
pub(crate) fn status_from_wire(field: &str, value: i32) -> Result<Option<Status>> {
    match pb::AgentStatus::try_from(value) {
        Ok(pb::AgentStatus::Unspecified) => Ok(None),
        Ok(pb::AgentStatus::Idle) => Ok(Some(Status::Idle)),
        Ok(pb::AgentStatus::Active) => Ok(Some(Status::Active)),
        Ok(pb::AgentStatus::Busy) => Ok(Some(Status::Busy)),
        Ok(pb::AgentStatus::Offline) => Ok(Some(Status::Offline)),
        Err(_) => Err(Error::invalid(field, format!("{field}: unknown status {value}"))),
    }
}

pub(crate) fn agent_to_wire(agent: &Agent) -> pb::Agent {
    pb::Agent {
        id: agent.id.clone(),
        name: agent.name.clone(),
        role: agent.role.clone(),
        team: agent.team.clone(),
        senior_id: agent.senior_id.clone(),
        expertise: agent.expertise.clone(),
        status: status_to_wire(agent.status()) as i32,
        current_workload: agent.current_workload,
        workload_capacity: agent.workload_capacity,
        availability_until: agent.availability_until.map(to_timestamp),
        custom_prompt: agent.custom_prompt.clone(),
        llm_config: stored_struct(&agent.llm_config_json),
        backstory: agent.backstory.clone(),
        allow_delegation: agent.allow_delegation,
        max_iterations: agent.max_iterations,
    }
}

/// The descriptive fields of an agent given on input, validated. Status and
/// workload are output only here (SetAgentStatus changes the status).
pub(crate) fn agent_from_wire(agent: Option<pb::Agent>) -> Result<Agent> {
    let agent = agent.ok_or_else(|| Error::invalid("agent", "agent: required"))?;
    Agent {
        id: agent.id.trim().to_owned(),
        name: agent.name,
        role: agent.role.trim().to_owned(),
        team: agent.team.trim().to_owned(),
        senior_id: agent.senior_id.trim().to_owned(),
        expertise: agent.expertise,
        manual_status: None,
        current_workload: 0,
        workload_capacity: agent.workload_capacity,
        availability_until: agent.availability_until.as_ref().map(from_timestamp),
        custom_prompt: agent.custom_prompt,
        llm_config_json: json_text("agent.llm_config", agent.llm_config.as_ref())?,
        backstory: agent.backstory,
        allow_delegation: agent.allow_delegation,
        max_iterations: agent.max_iterations,
        average_task_millis: 0,
    }
    .normalize()
    .map_err(Error::from)
}

pub(crate) fn team_to_wire(team: &Team) -> pb::Team {
    pb::Team {
        name: team.name.clone(),
        description: team.description.clone(),
        lead_agent_id: team.lead_agent_id.clone(),
    }
}

pub(crate) fn team_from_wire(team: Option<pb::Team>) -> Result<Team> {
    let team = team.ok_or_else(|| Error::invalid("team", "team: required"))?;
    Team {
        name: team.name.trim().to_owned(),
        description: team.description,
        lead_agent_id: team.lead_agent_id.trim().to_owned(),
    }
    .normalize()
    .map_err(Error::from)
}

/// A role definition given on input, read and checked.
pub(crate) fn role_from_wire(role: Option<pb::RoleDefinition>) -> Result<RoleDefinition> {
    let role = role.ok_or_else(|| Error::invalid("role", "role: required"))?;
    let role = roles::role_from_wire(role).map_err(|invalid| Error::invalid(invalid.field, invalid.message))?;
    role.normalize().map_err(Error::from)
}

/// The fields an UpdateAgent changes: those its mask names, or all of them
/// for no mask, an empty one or `*`.
pub(crate) fn update_mask_fields(mask: Option<&prost_types::FieldMask>) -> Result<Vec<AgentField>> {
    let paths = mask.map(|mask| mask.paths.as_slice()).unwrap_or_default();
    if paths.is_empty() || paths == ["*"] {
        return Ok(AgentField::ALL.to_vec());
    }
    let mut fields = Vec::with_capacity(paths.len());
    for (index, path) in paths.iter().enumerate() {
        let field = format!("update_mask.paths[{index}]");
        let Some(named) = AgentField::from_name(path.trim()) else {
            let names: Vec<&str> = AgentField::ALL.iter().map(|field| field.name()).collect();
            return Err(Error::invalid(
                &field,
                format!(
                    "{field}: '{}' is not a field an update may change; name some of {} (or `*` alone for all)",
                    muster_runtime::status::truncate(path, 64),
                    names.join(", ")
                ),
            ));
        };
        if !fields.contains(&named) {
            fields.push(named);
        }
    }
    Ok(fields)
}

/// The stored JSON text of a wire object: empty when not set.
fn json_text(field: &str, object: Option<&prost_types::Struct>) -> Result<String> {
    match object {
        None => Ok(String::new()),
        Some(object) => {
            struct_to_text(Some(object)).map_err(|problem| Error::invalid(field, format!("{field} {problem}")))
        }
    }
}

pub(crate) fn required_id(field: &str, value: &str) -> Result<String> {
    let value = value.trim();
    validate_id(field, value)?;
    Ok(value.to_owned())
}

pub(crate) fn required_name(field: &str, value: &str) -> Result<String> {
    let value = value.trim();
    validate_name(field, value)?;
    Ok(value.to_owned())
}

pub(crate) fn delegation_request_from_wire(request: pb::DelegateRequest) -> Result<DelegationRequest> {
    let task_id = request.task_id.trim().to_owned();
    if task_id.is_empty() {
        return Err(Error::invalid("task_id", "task_id: required"));
    }
    if task_id.len() > MAX_TASK_ID_LENGTH {
        return Err(Error::invalid("task_id", format!("task_id: longer than {MAX_TASK_ID_LENGTH} characters")));
    }
    let requester_id = request.requester_id.trim().to_owned();
    if !requester_id.is_empty() {
        validate_id("requester_id", &requester_id)?;
    }
    let required_role = request.required_role.trim().to_owned();
    if !required_role.is_empty() {
        validate_name("required_role", &required_role)?;
    }
    let team = request.team.trim().to_owned();
    if !team.is_empty() {
        validate_id("team", &team)?;
    }
    let urgency = match pb::Urgency::try_from(request.urgency) {
        Ok(pb::Urgency::Unspecified | pb::Urgency::Normal) => Urgency::Normal,
        Ok(pb::Urgency::Low) => Urgency::Low,
        Ok(pb::Urgency::High) => Urgency::High,
        Ok(pb::Urgency::Critical) => Urgency::Critical,
        Err(_) => return Err(Error::invalid("urgency", format!("urgency: unknown value {}", request.urgency))),
    };
    let mut delegation_chain = Vec::with_capacity(request.delegation_chain.len());
    for (index, id) in request.delegation_chain.iter().enumerate() {
        delegation_chain.push(required_id(&format!("delegation_chain[{index}]"), id)?);
    }
    let preferred_agent_id = request.preferred_agent_id.trim().to_owned();
    if preferred_agent_id.len() > 256 {
        return Err(Error::invalid("preferred_agent_id", "preferred_agent_id: longer than 256 characters"));
    }
    let assigned_agent_id = request.assigned_agent_id.trim().to_owned();
    if assigned_agent_id.len() > 256 {
        return Err(Error::invalid("assigned_agent_id", "assigned_agent_id: longer than 256 characters"));
    }
    if request.only_if_free && assigned_agent_id.is_empty() {
        return Err(Error::invalid(
            "only_if_free",
            "only_if_free: needs assigned_agent_id (the agent whose slot is asked for)",
        ));
    }
    Ok(DelegationRequest {
        task_id,
        requester_id,
        required_expertise: normalize_tags("required_expertise", &request.required_expertise)?,
        required_role,
        team,
        urgency,
        deadline: request.deadline.as_ref().map(from_timestamp),
        delegation_chain,
        preferred_agent_id,
        description: request.description,
        dry_run: request.dry_run,
        assigned_agent_id,
        only_if_free: request.only_if_free,
    })
}

pub(crate) fn decision_to_wire(decision: &Decision) -> pb::DelegationDecision {
    pb::DelegationDecision {
        decision: match decision.kind {
            DecisionKind::Delegate => pb::DecisionKind::Delegate,
            DecisionKind::Queue => pb::DecisionKind::Queue,
            DecisionKind::Escalate => pb::DecisionKind::Escalate,
        } as i32,
        tier: match decision.tier {
            Tier::SameTeamMatch => pb::DelegationTier::SameTeamMatch,
            Tier::SameTeamPartial => pb::DelegationTier::SameTeamPartial,
            Tier::CrossTeamMatch => pb::DelegationTier::CrossTeamMatch,
            Tier::QueueForExpert => pb::DelegationTier::QueueForExpert,
            Tier::Escalate => pb::DelegationTier::Escalate,
            Tier::Named => pb::DelegationTier::Named,
        } as i32,
        primary_agent_id: decision.primary_agent_id.clone(),
        primary_reason: decision.primary_reason.clone(),
        fallback_agent_id: decision.fallback_agent_id.clone(),
        fallback_reason: decision.fallback_reason.clone(),
        reasoning: decision.reasoning.clone(),
        estimated_wait: (decision.wait_millis > 0).then(|| to_duration(decision.wait_millis as u64)),
        notes: decision.notes.clone(),
        text: decision.text.clone(),
        candidates: decision.candidates.clone(),
    }
}

pub(crate) fn record_to_wire(record: &DelegationRecord) -> pb::DelegationRecord {
    pb::DelegationRecord {
        id: record.id.clone(),
        task_id: record.task_id.clone(),
        requester_id: record.requester_id.clone(),
        decision: Some(decision_to_wire(&record.decision)),
        decided_at: Some(to_timestamp(record.decided_at)),
        description: record.description.clone(),
    }
}

pub(crate) fn diagnostic_to_wire(diagnostic: &FileDiagnostic) -> pb::FileDiagnostic {
    use muster_proto::common::v1 as common;
    pb::FileDiagnostic {
        file_name: diagnostic.file_name.clone(),
        diagnostic: Some(common::Diagnostic {
            severity: match diagnostic.severity {
                Severity::Error => common::Severity::Error,
                Severity::Warning => common::Severity::Warning,
            } as i32,
            code: diagnostic.code.to_owned(),
            message: diagnostic.message.clone(),
            path: diagnostic.path.clone(),
            line: diagnostic.line,
            column: diagnostic.column,
        }),
    }
}
