//! Tools: an agent invokes a tool through the execution service, which
//! answers with `ToolOutput` status codes — 403 when the agent's role does
//! not permit the tool, 404 when no connected worker provides it, 400 when
//! the input does not match the tool's schema (saying where), 500 when the
//! provider fails, 200 otherwise. Calls go only to workers entitled to
//! provide the tool (see `ConnectWorker`); within an execution, the agent
//! must take part in it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use muster_proto::execution::v1::InvokeToolRequest;
use muster_runtime::auth::Caller;

use super::{ExecutionGrpc, access::denied};
use crate::{
    Error, Result,
    clients::roster::{RoleGrants, Roster, RosterFailure},
    domain::{
        authority::Subject,
        model::{Tool, ToolCall, ToolOutput},
    },
    engine::schema,
};

/// How long a provider may take to answer.
pub(super) const TOOL_CALL_LIMIT: Duration = Duration::from_secs(30);

/// How long what a role lists is trusted before the roster is asked again.
const ROLE_GRANTS_TTL: Duration = Duration::from_secs(2);

/// When the roster was asked, and what the role lists.
type Fetched = (Instant, Arc<RoleGrants>);

/// The tools and actions each role lists, as the roster said a moment ago:
/// a tool call or an action is authorised without a roster round trip, and
/// a change to a role takes effect within [`ROLE_GRANTS_TTL`].
#[derive(Default)]
pub(super) struct RoleGrantsCache {
    known: Mutex<HashMap<String, Fetched>>,
}

impl RoleGrantsCache {
    /// Most roles remembered at once.
    const KEPT: usize = 1024;

    pub(super) async fn of(&self, roster: &dyn Roster, role: &str) -> Result<Arc<RoleGrants>> {
        if role.is_empty() {
            return Ok(Arc::default());
        }
        if let Some((fetched, grants)) = self.lock().get(role)
            && fetched.elapsed() < ROLE_GRANTS_TTL
        {
            return Ok(grants.clone());
        }
        let grants: Arc<RoleGrants> = match roster.role_grants(role.to_owned()).await {
            Ok(grants) => Arc::new(grants),
            Err(RosterFailure::Unavailable(detail)) => return Err(Error::Unavailable { service: "roster", detail }),
            Err(failure) => {
                return Err(Error::precondition("ROSTER_REFUSED", "roster", format!("roster: {}", failure.message())));
            }
        };
        let mut known = self.lock();
        if known.len() >= Self::KEPT {
            known.clear();
        }
        known.insert(role.to_owned(), (Instant::now(), grants.clone()));
        Ok(grants)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Fetched>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn output(status_code: u32, error: String) -> ToolOutput {
    ToolOutput::error(status_code, error)
}

/// The tools a worker declares must have names and valid JSON schemas.
pub(super) fn check_tool_specs(tools: &[Tool]) -> Result<()> {
    for tool in tools {
        if tool.name.trim().is_empty() {
            return Err(Error::invalid("tools.name", "a tool needs a name"));
        }
        if let Err(reason) = schema::compile(&tool.input_schema_json) {
            return Err(Error::invalid("tools.input_schema", format!("tool '{}': input_schema: {reason}", tool.name)));
        }
    }
    Ok(())
}

impl ExecutionGrpc {
    /// Runs the checks, then the tool.
    pub(super) async fn invoke_tool_as(&self, caller: &Caller, request: InvokeToolRequest) -> Result<ToolOutput> {
        let Caller::Agent { id: agent_id, role, .. } = caller else {
            return Err(denied(
                caller,
                "invoke a tool",
                "CALLER_KIND_NOT_ALLOWED",
                "tools are invoked by agents",
                Vec::new(),
            ));
        };
        // Within an execution, the agent must take part in it (in a session: be assigned).
        if !request.execution_id.is_empty() {
            let described = format!("invoke tool '{}' in execution '{}'", request.tool, request.execution_id);
            let (execution, _) = self.execution_for(caller, &request.execution_id, &described).await?;
            if let Some(session) = &execution.session {
                let subject = Subject {
                    agent_id,
                    roster_role: role,
                    roster_actions: None,
                    lead: &execution.lead_agent_id,
                    session: Some(session),
                };
                if subject.role().is_none() {
                    return Err(denied(
                        caller,
                        described,
                        "NOT_ASSIGNED",
                        "it is not assigned in the session: neither its lead nor a participant",
                        vec![("execution_id", execution.id.clone())],
                    ));
                }
            }
        }
        // 1. The agent's role must permit the tool.
        let permitted = self.role_grants.of(self.engine.roster.as_ref(), role).await?;
        if !permitted.tools.contains(&request.tool) {
            let role = if role.is_empty() { "no role".to_owned() } else { format!("role '{role}'") };
            return Ok(output(
                403,
                format!("agent '{agent_id}' has {role}, which does not permit tool '{}'", request.tool),
            ));
        }
        // 2. A connected worker must provide it.
        let Some(spec) = self.engine.workers.tool(&request.tool) else {
            return Ok(output(404, format!("no connected worker provides tool '{}'", request.tool)));
        };
        // 3. The input must match the tool's schema.
        let input = match &request.input {
            None => serde_json::Value::Object(serde_json::Map::new()),
            Some(input) => match muster_runtime::json::object_to_json(input) {
                Ok(input) => input,
                Err(problem) => return Ok(output(400, format!("input {problem}"))),
            },
        };
        match schema::compile(&spec.input_schema_json) {
            Ok(Some(validator)) => {
                let problems = schema::violations(&validator, &input);
                if !problems.is_empty() {
                    return Ok(output(
                        400,
                        format!("the input does not match the schema of '{}': {}", request.tool, problems.join("; ")),
                    ));
                }
            }
            Ok(None) => {}
            Err(reason) => return Ok(output(500, format!("tool '{}': {reason}", request.tool))),
        }
        // 4. The provider runs it.
        let call = ToolCall {
            call_id: uuid::Uuid::now_v7().to_string(),
            tool: request.tool.clone(),
            input_json: input.to_string(),
            agent_id: agent_id.to_string(),
            trace_parent: muster_runtime::telemetry::traceparent(&tracing::Span::current()),
        };
        let call_id = call.call_id.clone();
        let Some(answer) = self.engine.workers.call_tool(call) else {
            return Ok(output(404, format!("no connected worker provides tool '{}'", request.tool)));
        };
        let answer = match tokio::time::timeout(TOOL_CALL_LIMIT, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => output(500, "the provider went away during the call".to_owned()),
            Err(_) => {
                self.engine.workers.abandon_tool_call(&call_id);
                output(500, format!("the provider did not answer within {} s", TOOL_CALL_LIMIT.as_secs()))
            }
        };
        tracing::info!(agent_id = %agent_id, tool = %request.tool, status = answer.status_code, execution_id = %request.execution_id, "tool invoked");
        Ok(answer.normalised())
    }
}
