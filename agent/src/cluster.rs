//! The cluster's tools carried out for one agent: each call of the
//! catalogue's [`ClusterTool`]s becomes its request to the execution service
//! or the roster, made with the agent's own credential, and the answer (or
//! the refusal, as a [`ToolError`]) comes back as JSON. The model agent and
//! the MCP server both call the cluster through here, so a tool means the
//! same whichever front end offers it.

use muster_client::auth::AuthChannel;
use muster_proto::{
    execution::v1::{
        AssignRoleRequest, CheckRoleRequest, DelegateStep, GetMyRoleRequest, InvokeToolRequest, MemoryNote,
        MemoryScope, MessagePriority, PostToInboxRequest, execution_service_client::ExecutionServiceClient,
    },
    roster::v1::{GetOrganizationRosterRequest, RosterFilter, roster_service_client::RosterServiceClient},
};
use muster_worker::Step;
use serde_json::{Value, json};

use crate::catalogue::{ClusterTool, Tool as _, ToolError};

/// Most notes one step may ask to be remembered.
pub const MAX_NOTES: usize = 16;
/// Most bytes of one note.
pub const MAX_NOTE_BYTES: usize = 4096;

/// Who a tool call acts for, and about what.
pub struct Acting<'a> {
    /// The agent's id.
    pub agent_id: &'a str,
    /// The execution the call is about (empty when none is).
    pub execution_id: &'a str,
    /// The execution service, called as the agent.
    pub execution: ExecutionServiceClient<AuthChannel>,
    /// The roster, called as the agent (or why it cannot be).
    pub roster: Result<RosterServiceClient<AuthChannel>, ToolError>,
    /// The step the agent is running, when the call is made within one.
    pub step: Option<&'a Step>,
    /// Whether that step's agent holds a role (a note for the role's memory needs one).
    pub holds_role: bool,
}

/// What the cluster's tools leave on the step they are called within, for
/// the step's result: notes to remember, whether its output starts no run,
/// and the inbox posts made (for their idempotency keys).
#[derive(Debug, Default)]
pub struct StepNotes {
    /// Notes for the global memory or the role's.
    pub notes: Vec<MemoryNote>,
    /// The output is posted to no inbox.
    pub skip_triggers: bool,
    posts: u32,
}

/// What a tool call came to.
#[derive(Debug)]
pub enum Called {
    /// The answer (or the refusal) the caller reads.
    Result(Result<Value, ToolError>),
    /// The step went to another agent: the caller's work on it ends.
    HandedOff,
}

/// Carries out one call of `tool`; `arguments` were checked against its
/// schema. `call_id` tells calls apart (an inbox post made by one call is
/// posted once, however often the call is sent).
pub async fn call(
    acting: Acting<'_>,
    notes: &mut StepNotes,
    tool: ClusterTool,
    call_id: &str,
    arguments: &Value,
) -> Called {
    let text = |key: &str| arguments.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    let execution_id = acting.execution_id.to_owned();
    let mut execution = acting.execution;
    let result = match tool {
        ClusterTool::GetOrganizationRoster => {
            let filter = match text("filter").as_str() {
                "my_team" => RosterFilter::MyTeam,
                "available" => RosterFilter::Available,
                "by_expertise" => RosterFilter::ByExpertise,
                _ => RosterFilter::All,
            };
            let request = GetOrganizationRosterRequest {
                agent_id: acting.agent_id.to_owned(),
                filter: filter as i32,
                expertise: text("expertise"),
            };
            match acting.roster {
                Ok(mut roster) => roster
                    .get_organization_roster(request)
                    .await
                    .map(|answer| {
                        crate::wire_json(&answer.into_inner(), "muster.roster.v1.GetOrganizationRosterResponse")
                    })
                    .map_err(ToolError::from),
                Err(error) => Err(error),
            }
        }
        ClusterTool::DelegateTask => {
            let Some(step) = acting.step else { return Called::Result(Err(no_step(tool))) };
            let expertise = arguments
                .get("expertise")
                .and_then(Value::as_array)
                .map(|tags| tags.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default();
            let request = DelegateStep {
                assignment_id: step.assignment_id().to_owned(),
                to_agent_id: text("to_agent_id"),
                required_expertise: expertise,
                required_role: text("role"),
                reason: text("reason"),
            };
            match delegate(step, request).await {
                Ok(_) => return Called::HandedOff,
                Err(refused) => Err(refused),
            }
        }
        ClusterTool::GetMyRole => execution
            .get_my_role(GetMyRoleRequest { execution_id })
            .await
            .map(|answer| crate::wire_json(&answer.into_inner(), "muster.execution.v1.GetMyRoleResponse"))
            .map_err(ToolError::from),
        ClusterTool::RoleCheck => execution
            .check_role(CheckRoleRequest { execution_id, action: text("action"), agent_id: text("agent_id") })
            .await
            .map(|answer| crate::wire_json(&answer.into_inner(), "muster.execution.v1.CheckRoleResponse"))
            .map_err(ToolError::from),
        ClusterTool::AssignRole => execution
            .assign_role(AssignRoleRequest {
                execution_id,
                agent_id: text("agent_id"),
                role: text("role"),
                subtask: text("subtask"),
            })
            .await
            .map(|answer| crate::wire_json(&answer.into_inner(), "muster.execution.v1.AssignRoleResponse"))
            .map_err(ToolError::from),
        ClusterTool::PostToInbox => {
            let priority = match text("priority").as_str() {
                "low" => MessagePriority::Low,
                "high" => MessagePriority::High,
                _ => MessagePriority::Normal,
            };
            notes.posts += 1;
            let made_by = acting.step.map_or(acting.agent_id, Step::assignment_id);
            let request = PostToInboxRequest {
                inbox: text("inbox"),
                sender: String::new(),
                priority: priority as i32,
                body: text("body"),
                subject: text("subject"),
                idempotency_key: format!("{made_by}/{call_id}/{}", notes.posts),
            };
            execution
                .post_to_inbox(request)
                .await
                .map(|answer| {
                    let answer = answer.into_inner();
                    json!({
                        "message_id": answer.message.map(|message| message.id).unwrap_or_default(),
                        "triggered_execution_ids": answer.triggered_execution_ids,
                    })
                })
                .map_err(ToolError::from)
        }
        ClusterTool::Remember => match acting.step {
            Some(_) => remember(notes, acting.holds_role, &text("text"), &text("scope")),
            None => Err(no_step(tool)),
        },
        ClusterTool::SkipTriggers => match acting.step {
            Some(_) => {
                notes.skip_triggers = true;
                Ok(json!({"skip_triggers": true, "reason": text("reason")}))
            }
            None => Err(no_step(tool)),
        },
    };
    Called::Result(result)
}

/// Hands `step` onward: the decision's reason when the cluster accepted
/// (the step is another agent's now), else why not as a tool error (the step
/// stays the caller's).
pub async fn delegate(step: &Step, request: DelegateStep) -> Result<String, ToolError> {
    match step.delegate(request).await {
        Ok(outcome) if outcome.accepted => Ok(outcome.reason),
        Ok(outcome) => Err(ToolError::new("delegation_refused", outcome.reason)),
        Err(why) => Err(ToolError::new("unavailable", why)),
    }
}

fn no_step(tool: ClusterTool) -> ToolError {
    ToolError::new(
        "failed_precondition",
        format!("{} acts on a step you are running: you are running none", tool.name()),
    )
}

fn remember(notes: &mut StepNotes, holds_role: bool, text: &str, scope: &str) -> Result<Value, ToolError> {
    if notes.notes.len() >= MAX_NOTES {
        return Err(ToolError::new("resource_exhausted", format!("a step may leave at most {MAX_NOTES} notes")));
    }
    let global = scope == "global";
    if !global && !holds_role {
        return Err(ToolError::new("failed_precondition", "you hold no role: use scope \"global\""));
    }
    if text.trim().is_empty() || text.len() > MAX_NOTE_BYTES {
        return Err(ToolError::new(
            "invalid_arguments",
            format!("a note holds 1 to {MAX_NOTE_BYTES} bytes; this one has {}", text.trim().len()),
        ));
    }
    let scope = if global { MemoryScope::Global } else { MemoryScope::Role };
    notes.notes.push(MemoryNote { scope: scope as i32, text: text.to_owned() });
    Ok(json!({"remembered": true, "scope": if global { "global" } else { "role" }, "notes": notes.notes.len()}))
}

/// A tool another worker provides, through the execution service (which
/// checks the role's permission and the input's schema, and routes the
/// call); a provider's failure comes back as a tool error with its status.
pub async fn invoke_tool(
    mut execution: ExecutionServiceClient<AuthChannel>,
    execution_id: &str,
    tool: &str,
    arguments: Value,
) -> Result<Value, ToolError> {
    let Value::Object(input) = arguments else {
        return Err(ToolError::new("invalid_arguments", "the arguments are not a JSON object"));
    };
    let request = InvokeToolRequest {
        tool: tool.to_owned(),
        input: Some(muster_client::json::object_from_json(input)),
        execution_id: execution_id.to_owned(),
    };
    let output = execution.invoke_tool(request).await.map_err(ToolError::from)?.into_inner().output.unwrap_or_default();
    if output.status_code == 200 {
        return Ok(output.output.as_ref().map_or(Ok(Value::Null), muster_client::json::to_json).unwrap_or(Value::Null));
    }
    let code = match output.status_code {
        400 => "invalid_arguments",
        403 => "permission_denied",
        404 => "not_found",
        _ => "tool_failed",
    };
    Err(ToolError::new(code, format!("{} (status {})", output.error, output.status_code)))
}
