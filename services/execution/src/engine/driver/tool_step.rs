//! A `tool_call` step: the engine invokes the step's tool itself, under its
//! executor's identity, through the same registry `InvokeTool` uses. The
//! executor's role must permit the tool; the step's inputs (the execution's
//! merged with its own) must match the tool's input schema; a connected
//! worker providing the tool runs it. Its output is the step's output.
//!
//! Until a worker provides the tool the step waits for one (its
//! schedule-to-start limit applies). A call runs at least once: one whose
//! answer was not recorded when the service stopped runs again, with a new
//! call id (`<execution>/<step>/<attempt>`).

use std::{cmp::Reverse, time::Duration};

use super::{Driver, Effect, Timer};
use crate::{
    domain::{
        StepStatus,
        model::{AgentContext, EventKind, Outcome, ToolCall, ToolOutput},
    },
    engine::{Route, workers::Workers},
};

/// How long a tool call may take when the step sets no `timeout_seconds`.
const TOOL_CALL_LIMIT: Duration = Duration::from_secs(30);
/// How often a step waiting for a tool's provider looks again.
pub(super) const PROVIDER_POLL: Duration = Duration::from_millis(500);

impl Driver {
    pub(super) fn is_tool_step(&self, position: usize) -> bool {
        self.definition(position).step_type == crate::engine::TOOL_CALL
    }

    /// Invokes the step's tool under its executor's identity, or waits for a
    /// worker that provides it.
    pub(super) fn call_tool(&mut self, position: usize, context: &AgentContext) {
        let tool = self.definition(position).tool.clone().unwrap_or_default();
        let agent_id = self.steps[position].executor.clone();
        if !context.role_definition.as_ref().is_some_and(|role| role.tools.contains(&tool)) {
            let role = if context.roster_role.is_empty() {
                "no role".to_owned()
            } else {
                format!("role '{}'", context.roster_role)
            };
            self.end_attempt(position);
            let message = format!("agent '{agent_id}' has {role}, which does not permit tool '{tool}'");
            self.fail(position, "PERMISSION_DENIED", message);
            return;
        }
        let Some(spec) = self.engine.workers.tool(&tool) else {
            if self.steps[position].status != StepStatus::WaitingForWorker {
                self.wait_for_worker(position);
            }
            let due = muster_runtime::time::now_millis() + PROVIDER_POLL.as_millis() as i64;
            self.timers.push(Reverse((due, Timer::ToolProvider, position, self.steps[position].attempt)));
            return;
        };
        let input_json = self.merged_inputs(&self.definition(position).inputs_json);
        let input: serde_json::Value = serde_json::from_str(&input_json).unwrap_or_default();
        if let Err(reason) = self.schemas.check(&spec.input_schema_json, &input) {
            self.end_attempt(position);
            let message = format!("the inputs do not match the input schema of tool '{tool}': {reason}");
            self.fail(position, "INVALID_INPUT", message);
            return;
        }
        let now = muster_runtime::time::now_millis();
        self.steps[position].started_at = Some(now);
        self.set_status(position, StepStatus::Running);
        let event = self.step_event(EventKind::StepStarted, position);
        self.record(event);
        let call = ToolCall {
            call_id: self.assignment_id(position),
            tool,
            input_json,
            agent_id,
            trace_parent: self.spans[position].as_ref().map(muster_runtime::telemetry::traceparent).unwrap_or_default(),
        };
        let limit = self.definition(position).timeout_seconds.map(Duration::from_secs).unwrap_or(TOOL_CALL_LIMIT);
        self.after_commit.push(Effect::CallTool { call, limit, route: self.route(position) });
    }

    /// The provider poll came due: look for a provider again.
    pub(super) fn look_for_provider(&mut self, position: usize) {
        let executor = self.steps[position].executor.clone();
        if let Some(super::Known::Ready(context)) = self.contexts.get(&executor) {
            let context = context.clone();
            self.call_tool(position, &context);
        }
    }
}

/// Runs a call on a provider and reports its answer as the attempt's outcome.
pub(super) async fn run_call(workers: std::sync::Arc<Workers>, call: ToolCall, limit: Duration, route: Route) {
    let call_id = call.call_id.clone();
    let tool = call.tool.clone();
    let Some(answer) = workers.call_tool(call) else {
        // The provider left between the check and the call: start again.
        return route.report(Outcome::WorkerLost);
    };
    let started = std::time::Instant::now();
    let outcome = match tokio::time::timeout(limit, answer).await {
        Ok(Ok(answer)) => outcome(&tool, answer, started.elapsed()),
        Ok(Err(_)) => Outcome::WorkerLost,
        Err(_) => {
            workers.abandon_tool_call(&call_id);
            Outcome::Failed {
                error_code: "TIMEOUT".to_owned(),
                message: format!("tool '{tool}' did not answer within {} s", limit.as_secs()),
                retryable: true,
            }
        }
    };
    route.report(outcome);
}

/// A provider's answer as a step outcome: 2xx completes it; 400 and 403 fail
/// it for good; anything else fails it, and its retries apply.
fn outcome(tool: &str, answer: ToolOutput, took: Duration) -> Outcome {
    let answer = answer.normalised();
    let status = answer.status_code;
    if (200..300).contains(&status) {
        return Outcome::Completed {
            output_json: answer.output_json,
            output_value: None,
            tokens_used: 0,
            cost: 0.0,
            duration_ms: took.as_millis() as u64,
            iterations: 0,
            post_to_inbox: String::new(),
            remember: Vec::new(),
            skip_triggers: false,
        };
    }
    let (error_code, retryable) = match status {
        400 => ("INVALID_INPUT", false),
        403 => ("PERMISSION_DENIED", false),
        _ => ("TOOL_FAILED", true),
    };
    let error = if answer.error.is_empty() { "no error given".to_owned() } else { answer.error };
    Outcome::Failed {
        error_code: error_code.to_owned(),
        message: format!("tool '{tool}' answered {status}: {error}"),
        retryable,
    }
}
