//! The tools `muster mcp` offers, and how each call is carried out.
//!
//! The cluster's tools are the catalogue's (one definition of each tool's
//! name, description, schema and refusals, shared with the model agent),
//! with the step or execution they act on added as an argument. The others
//! take the fields of the contract message they send, their schemas made
//! from its descriptor. A refusal of the cluster is a tool error carrying
//! the cluster's reason; arguments that do not fit the schema are refused
//! before anything is sent.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use muster_agent::{
    catalogue::{Checker, ClusterTool, Tool as _, ToolError},
    cluster::{self, Acting, Called},
};
use muster_client::schema::message_schema;
use muster_proto::{
    execution::v1::{DelegateStep, SetLeadRequest, StartSessionRequest, StepFailure, StepResult},
    notifier::v1::{AcknowledgeNotificationsRequest, ListNotificationsRequest},
};
use muster_worker::StepOutcome;
use serde_json::{Map, Value, json};

use crate::member::{Held, Member};

/// The longest `next_assignment` waits.
pub(crate) const MAX_WAIT_SECONDS: u64 = 60;

/// The catalogue's cluster tools offered over MCP: `skip_triggers` is an
/// argument of `complete_step` here.
const CLUSTER_TOOLS: &[ClusterTool] = &[
    ClusterTool::GetOrganizationRoster,
    ClusterTool::DelegateTask,
    ClusterTool::GetMyRole,
    ClusterTool::RoleCheck,
    ClusterTool::AssignRole,
    ClusterTool::PostToInbox,
    ClusterTool::Remember,
];

/// A tool as offered: name, description, input schema.
pub(crate) struct Offered {
    pub(crate) name: &'static str,
    pub(crate) description: String,
    pub(crate) schema: Arc<Map<String, Value>>,
    /// The schema compiled once, for every call's arguments.
    checker: Result<Checker, String>,
}

impl Offered {
    fn new(name: &'static str, description: String, schema: Map<String, Value>) -> Self {
        let checker = Checker::new(&Value::Object(schema.clone()));
        Self { name, description, schema: Arc::new(schema), checker }
    }
}

/// Every tool, in the order they are listed.
pub(crate) static TOOLS: LazyLock<Vec<Offered>> = LazyLock::new(|| {
    let mut tools: Vec<Offered> = CLUSTER_TOOLS.iter().map(|tool| cluster_tool(*tool)).collect();
    let contract = |name, description: &str, message: &str, leave_out: &[&str]| {
        let schema = message_schema(message, leave_out).unwrap_or_else(|error| json!({"description": error}));
        Offered::new(name, description.to_owned(), object(schema))
    };
    tools.push(Offered::new(
        "next_assignment",
        format!(
            "Wait for the next step assigned to you (at most `wait_seconds`, up to {MAX_WAIT_SECONDS}; default 30) and \
             take it: it is yours until you end it with complete_step, fail_step or delegate_step, or the cluster \
             withdraws it. Answers {{\"assignment\": null}} when none came in time."
        ),
        object(json!({
            "type": "object",
            "properties": {"wait_seconds": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS,
                "description": "How long to wait for a step, in seconds."}},
            "additionalProperties": false,
        })),
    ));
    tools.push(contract(
        "complete_step",
        "End a step you hold with its output (any JSON value), the tokens and cost it used, notes to remember, and \
         skip_triggers when no other role needs to run after it.",
        "muster.execution.v1.StepResult",
        &["duration", "post_to_inbox"],
    ));
    tools.push(contract(
        "fail_step",
        "End a step you hold as failed, with a stable error code, what went wrong and whether another attempt may \
         succeed.",
        "muster.execution.v1.StepFailure",
        &[],
    ));
    tools.push(contract(
        "delegate_step",
        "Hand a step you hold onward, with the fields of the worker protocol's DelegateStep: a named colleague \
         (`to_agent_id`), or whoever the roster picks for `required_expertise` (and `required_role`); `reason` \
         for the audit trail. Accepted, the step is theirs; refused, it stays yours and the reason comes back. \
         (delegate_task does the same with the agent catalogue's arguments.)",
        "muster.execution.v1.DelegateStep",
        &[],
    ));
    tools.push(contract(
        "start_session",
        "Start a team session of a process with a lead (you, as an agent), participants and their roles, and the \
         task context every participant hears.",
        "muster.execution.v1.StartSessionRequest",
        &[],
    ));
    tools.push(contract(
        "set_lead",
        "As a session's lead: hand the lead to another agent.",
        "muster.execution.v1.SetLeadRequest",
        &[],
    ));
    tools.push(contract(
        "list_notifications",
        "Your notifications after a cursor, oldest first, with the cursor you acknowledged last.",
        "muster.notifier.v1.ListNotificationsRequest",
        &["agent_id"],
    ));
    tools.push(contract(
        "acknowledge_notifications",
        "Mark your notifications up to a cursor as read.",
        "muster.notifier.v1.AcknowledgeNotificationsRequest",
        &["agent_id"],
    ));
    tools.push(contract(
        "invoke_tool",
        "Call a tool another worker provides, within an execution you take part in; `input` is the tool's arguments.",
        "muster.execution.v1.InvokeToolRequest",
        &[],
    ));
    tools
});

/// A catalogue tool with what it acts on added to its schema.
fn cluster_tool(tool: ClusterTool) -> Offered {
    let mut schema = object(tool.input_schema().clone());
    let (key, description) = match tool {
        ClusterTool::DelegateTask | ClusterTool::Remember => ("assignment_id", "The step you hold that this acts on."),
        ClusterTool::GetMyRole | ClusterTool::RoleCheck | ClusterTool::AssignRole => {
            ("execution_id", "The execution this is about.")
        }
        _ => ("", ""),
    };
    if !key.is_empty() {
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            properties.insert(key.to_owned(), json!({"type": "string", "minLength": 1, "description": description}));
        }
        let required = schema.entry("required").or_insert_with(|| json!([]));
        if let Value::Array(required) = required {
            required.push(json!(key));
        }
    }
    let description = match tool {
        ClusterTool::DelegateTask => {
            format!("{} (The step is one you hold: give its assignment_id.)", tool.description())
        }
        _ => tool.description().to_owned(),
    };
    Offered::new(tool.name(), description, schema)
}

fn object(schema: Value) -> Map<String, Value> {
    match schema {
        Value::Object(object) => object,
        _ => Map::new(),
    }
}

/// Checks `arguments` against the schema of the tool `name`: the first
/// problem, naming the argument.
pub(crate) fn check(name: &str, arguments: &Value) -> Result<(), ToolError> {
    let Some(offered) = TOOLS.iter().find(|tool| tool.name == name) else {
        return Err(ToolError::new("unknown_tool", format!("no tool named '{name}'")));
    };
    let checked = offered.checker.as_ref().map_err(|why| ToolError::new("internal", why.clone()))?.check(arguments);
    checked.map_err(|problem| ToolError::new("invalid_arguments", problem))
}

/// Carries out one call of the tool `name` for `member`; `call_id` tells
/// calls apart.
pub(crate) async fn call(member: &Member, name: &str, call_id: &str, arguments: Value) -> Result<Value, ToolError> {
    check(name, &arguments)?;
    let text = |key: &str| arguments.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    if let Some(tool) = ClusterTool::from_name(name).filter(|tool| CLUSTER_TOOLS.contains(tool)) {
        return cluster_call(member, tool, call_id, &arguments).await;
    }
    match name {
        "next_assignment" => {
            let wait = arguments.get("wait_seconds").and_then(Value::as_u64).unwrap_or(30).min(MAX_WAIT_SECONDS);
            let assignment = member
                .next_assignment(Duration::from_secs(wait))
                .await
                .map_err(|error| ToolError::new("unavailable", format!("{error:#}")))?;
            let assignment = assignment
                .map(|assignment| {
                    muster_client::json::message_to_json(&assignment, "muster.execution.v1.Assignment", false)
                })
                .transpose()
                .map_err(|error| ToolError::new("internal", error))?;
            Ok(json!({"assignment": assignment}))
        }
        "complete_step" => {
            let result: StepResult = read(&arguments, "muster.execution.v1.StepResult")?;
            let output = result.output.as_ref().map_or(Ok(Value::Null), muster_client::json::to_json);
            let output = output.map_err(|error| ToolError::new("invalid_arguments", format!("output {error}")))?;
            let mut held = member.take(&result.assignment_id).map_err(|why| ToolError::new("not_found", why))?;
            let mut notes = std::mem::take(&mut held.notes.notes);
            notes.extend(result.remember);
            let outcome = StepOutcome::Completed {
                output_json: output.to_string(),
                tokens_used: result.tokens_used,
                cost: result.cost,
                iterations: result.iterations,
                remember: notes,
                skip_triggers: result.skip_triggers || held.notes.skip_triggers,
            };
            ended(held.end(outcome), &result.assignment_id, "completed")
        }
        "fail_step" => {
            let failure: StepFailure = read(&arguments, "muster.execution.v1.StepFailure")?;
            if failure.error_code.is_empty() {
                return Err(ToolError::new("invalid_arguments", "error_code: give a stable code, such as NEEDS_INPUT"));
            }
            let held = member.take(&failure.assignment_id).map_err(|why| ToolError::new("not_found", why))?;
            let outcome = StepOutcome::Failed {
                error_code: failure.error_code,
                message: failure.message,
                retryable: failure.retryable,
            };
            ended(held.end(outcome), &failure.assignment_id, "failed")
        }
        "delegate_step" => {
            let request: DelegateStep = read(&arguments, "muster.execution.v1.DelegateStep")?;
            let held = member.take(&request.assignment_id).map_err(|why| ToolError::new("not_found", why))?;
            match cluster::delegate(&held.step, request).await {
                Ok(decision) => {
                    let mut answer = handed_off(held);
                    answer["decision"] = Value::String(decision);
                    Ok(answer)
                }
                Err(refused) => {
                    member.put_back(held);
                    Err(refused)
                }
            }
        }
        "start_session" => {
            let request: StartSessionRequest = read(&arguments, "muster.execution.v1.StartSessionRequest")?;
            let answer = member.execution.clone().start_session(request).await.map_err(ToolError::from)?;
            Ok(muster_agent::wire_json(&answer.into_inner(), "muster.execution.v1.StartSessionResponse"))
        }
        "set_lead" => {
            let request: SetLeadRequest = read(&arguments, "muster.execution.v1.SetLeadRequest")?;
            let answer = member.execution.clone().set_lead(request).await.map_err(ToolError::from)?;
            Ok(muster_agent::wire_json(&answer.into_inner(), "muster.execution.v1.SetLeadResponse"))
        }
        "list_notifications" => {
            let mut request: ListNotificationsRequest =
                read(&arguments, "muster.notifier.v1.ListNotificationsRequest")?;
            request.agent_id.clone_from(&member.agent_id);
            let answer = member.notifier.clone().list_notifications(request).await.map_err(ToolError::from)?;
            Ok(muster_agent::wire_json(&answer.into_inner(), "muster.notifier.v1.ListNotificationsResponse"))
        }
        "acknowledge_notifications" => {
            let mut request: AcknowledgeNotificationsRequest =
                read(&arguments, "muster.notifier.v1.AcknowledgeNotificationsRequest")?;
            request.agent_id.clone_from(&member.agent_id);
            let answer = member.notifier.clone().acknowledge_notifications(request).await.map_err(ToolError::from)?;
            Ok(muster_agent::wire_json(&answer.into_inner(), "muster.notifier.v1.AcknowledgeNotificationsResponse"))
        }
        "invoke_tool" => {
            let input = arguments.get("input").cloned().unwrap_or_else(|| json!({}));
            cluster::invoke_tool(member.execution.clone(), &text("execution_id"), &text("tool"), input).await
        }
        _ => Err(ToolError::new("unknown_tool", format!("no tool named '{name}'"))),
    }
}

async fn cluster_call(
    member: &Member,
    tool: ClusterTool,
    call_id: &str,
    arguments: &Value,
) -> Result<Value, ToolError> {
    let assignment_id = arguments.get("assignment_id").and_then(Value::as_str);
    let mut held = match assignment_id {
        Some(id) => Some(member.take(id).map_err(|why| ToolError::new("not_found", why))?),
        None => None,
    };
    let execution_id = match (&held, arguments.get("execution_id").and_then(Value::as_str)) {
        (_, Some(id)) => id.to_owned(),
        (Some(held), None) => held.assignment.execution_id.clone(),
        (None, None) => String::new(),
    };
    let mut scratch = muster_agent::cluster::StepNotes::default();
    let (step, holds_role, notes) = match held.as_mut() {
        Some(held) => (Some(held.step.clone()), held.assignment.role_definition.is_some(), &mut held.notes),
        None => (None, false, &mut scratch),
    };
    let acting = Acting {
        agent_id: &member.agent_id,
        execution_id: &execution_id,
        execution: member.execution.clone(),
        roster: Ok(member.roster.clone()),
        step: step.as_ref(),
        holds_role,
    };
    let called = cluster::call(acting, notes, tool, call_id, arguments).await;
    match (called, held) {
        (Called::HandedOff, Some(held)) => Ok(handed_off(held)),
        (Called::HandedOff, None) => Ok(json!({"delegated": true})),
        (Called::Result(result), held) => {
            if let Some(held) = held {
                member.put_back(held);
            }
            result
        }
    }
}

/// Ends a held step the cluster handed to another agent.
fn handed_off(held: Held) -> Value {
    let answer = json!({"delegated": true, "assignment_id": held.assignment.assignment_id});
    held.end(StepOutcome::HandedOff);
    answer
}

/// A contract message from the tool's arguments.
fn read<M: prost::Message + Default>(arguments: &Value, full_name: &str) -> Result<M, ToolError> {
    muster_client::json::message_from_json(arguments, full_name)
        .map_err(|problem| ToolError::new("invalid_arguments", problem))
}

fn ended(sent: bool, assignment_id: &str, how: &str) -> Result<Value, ToolError> {
    if sent {
        Ok(json!({"assignment_id": assignment_id, "ended": how}))
    } else {
        Err(ToolError::new(
            "failed_precondition",
            format!(
                "step '{assignment_id}' was withdrawn by the cluster (cancelled, timed out or reassigned) before it ended"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_a_unique_name_and_an_object_schema() {
        let mut names: Vec<&str> = TOOLS.iter().map(|tool| tool.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TOOLS.len(), "{names:?}");
        for tool in TOOLS.iter() {
            assert_eq!(tool.schema["type"], "object", "{}: {:?}", tool.name, tool.schema);
            assert!(!tool.description.is_empty(), "{}", tool.name);
        }
    }

    #[test]
    fn the_cluster_tools_name_what_they_act_on() {
        let schema = |name: &str| &TOOLS.iter().find(|tool| tool.name == name).unwrap().schema;
        assert!(schema("delegate_task")["required"].as_array().unwrap().contains(&json!("assignment_id")));
        assert!(schema("remember")["required"].as_array().unwrap().contains(&json!("assignment_id")));
        assert!(schema("assign_role")["required"].as_array().unwrap().contains(&json!("execution_id")));
        assert!(!schema("get_organization_roster")["properties"].as_object().unwrap().contains_key("assignment_id"));
        assert!(TOOLS.iter().all(|tool| tool.name != "skip_triggers"), "skip_triggers is complete_step's argument");
    }

    #[test]
    fn arguments_are_checked_before_anything_is_sent() {
        assert!(check("fail_step", &json!({"assignment_id": "a", "error_code": "X"})).is_ok());
        let wrong = check("fail_step", &json!({"assignment_id": "a", "retryable": "yes"})).unwrap_err();
        assert_eq!(wrong.code, "invalid_arguments");
        assert!(wrong.message.contains("retryable"), "{}", wrong.message);
        assert_eq!(check("nothing", &json!({})).unwrap_err().code, "unknown_tool");
        let wait = check("next_assignment", &json!({"wait_seconds": MAX_WAIT_SECONDS + 1})).unwrap_err();
        assert_eq!(wait.code, "invalid_arguments");
    }
}
