//! One step run by a model: the loop of model calls and tool calls, bounded
//! by the agent's `max_iterations`, that ends with the model's answer as the
//! step's output.

use muster_client::auth::{Credentials, with_credentials};
use muster_proto::{
    execution::v1::{Assignment, ModelCall, StepProgress, ToolSpec},
    roster::v1::roster_service_client::RosterServiceClient,
};
use muster_worker::{Step, StepOutcome};
use serde_json::{Value, json};

use crate::{
    ModelAgent,
    catalogue::{ClusterTool, Tool as _, ToolError, WorkspaceTool, check_against},
    cluster::{self, Acting, Called, StepNotes},
    config::{LlmConfig, Usage},
    prompt,
    provider::{Conversation, Model, Reply, Request, ToolCall, ToolDefinition, ToolResult, Turn, answer_as_output},
    transcript::Transcript,
    workspace::Access,
};

/// Iterations when the assignment gives none.
const DEFAULT_MAX_ITERATIONS: u32 = 10;
/// Most tool calls of one reply that are run; the rest are answered with an error.
const MAX_TOOL_CALLS_PER_REPLY: usize = 32;
/// Most characters of one tool result the model is given.
const MAX_TOOL_RESULT_CHARS: usize = 64 * 1024;

/// One run of one assignment.
pub(crate) struct StepRun<'a> {
    agent: &'a ModelAgent,
    assignment: &'a Assignment,
    step: &'a Step,
    model: Model,
    /// The role's tools a provider serves (through InvokeTool), by name.
    provided: Vec<String>,
    /// The role's workspace tools.
    workspace_tools: Vec<WorkspaceTool>,
    usage: Usage,
    cost: f64,
    notes: StepNotes,
}

impl<'a> StepRun<'a> {
    /// A run of `assignment`, or the failure that prevents one.
    pub(crate) fn new(agent: &'a ModelAgent, assignment: &'a Assignment, step: &'a Step) -> Result<Self, StepOutcome> {
        let config = assignment.llm_config.as_ref().map(muster_client::json::object_to_json).transpose();
        let config = config
            .map_err(|problem| format!("llm_config {problem}"))
            .and_then(|config| LlmConfig::from_json(&config.unwrap_or(Value::Null)));
        let config = match config {
            Ok(Some(config)) => config,
            Ok(None) => return Err(failed("NOT_MODEL_DRIVEN", "the agent's llm_config names no provider", false)),
            Err(problem) => return Err(failed("LLM_CONFIG_INVALID", &problem, false)),
        };
        let role_tools = assignment.role_definition.as_ref().map(|role| role.tools.clone()).unwrap_or_default();
        let workspace_tools = role_tools.iter().filter_map(|name| WorkspaceTool::from_name(name)).collect();
        let provided = role_tools
            .into_iter()
            .filter(|name| WorkspaceTool::from_name(name).is_none() && ClusterTool::from_name(name).is_none())
            .collect();
        Ok(Self {
            agent,
            assignment,
            step,
            model: Model::new(config, agent.http.clone()),
            provided,
            workspace_tools,
            usage: Usage::default(),
            cost: 0.0,
            notes: StepNotes::default(),
        })
    }

    /// The loop: the model's answer, a failure, or the step handed onward.
    pub(crate) async fn run(mut self) -> StepOutcome {
        let role = self.assignment.role_definition.clone().unwrap_or_default();
        let workspace = self.agent.workspace.clone();
        let context_paths = role.context_files.clone();
        let context_files = tokio::task::spawn_blocking(move || prompt::read_context_files(&workspace, &context_paths))
            .await
            .unwrap_or_default();
        let shared_memory = match self.step.shared_memory().decode() {
            Ok(memory) => memory,
            Err(error) => {
                let message = format!("the assignment's shared memory could not be read: {error}");
                return failed("SHARED_MEMORY_UNREADABLE", &message, true);
            }
        };
        let mut conversation = Conversation {
            system: prompt::system_prompt(self.assignment),
            turns: vec![Turn::User(prompt::task(self.assignment, &shared_memory, &context_files))],
        };
        let tools = self.offered_tools().await;
        let schema = prompt::output_schema(self.assignment);
        let mut transcript = Transcript::open(self.agent.transcripts.as_deref(), self.assignment);
        let max_iterations = match self.assignment.max_iterations {
            0 => DEFAULT_MAX_ITERATIONS,
            set => set,
        };
        let mut corrected = false;
        for iteration in 1..=max_iterations {
            let request = Request { conversation: &conversation, tools: &tools, output_schema: schema.as_ref() };
            let (reply, exchange) = self.model.complete(request).await;
            transcript.record(iteration, &exchange);
            let reply = match reply {
                Ok(reply) => reply,
                Err(error) => return failed(error.code(), &error.to_string(), error.retryable()),
            };
            self.count(iteration, &reply, exchange.latency).await;
            if reply.tool_calls.is_empty() {
                let output = answer_as_output(&reply.text);
                if let Some(schema) = &schema
                    && let Err(problem) = check_against(schema, &output)
                {
                    if corrected {
                        return failed(
                            "OUTPUT_SCHEMA",
                            &format!(
                                "the model's answer does not match the role's output schema, even after being told why: {problem}"
                            ),
                            false,
                        );
                    }
                    corrected = true;
                    conversation.turns.push(Turn::Assistant { text: reply.text, tool_calls: Vec::new() });
                    conversation.turns.push(Turn::User(format!(
                        "Your answer does not match the required output schema: {problem}. Answer again with only \
                         the JSON object, matching the schema."
                    )));
                    continue;
                }
                return self.completed(output, iteration);
            }
            let calls = reply.tool_calls.clone();
            conversation.turns.push(Turn::Assistant { text: reply.text, tool_calls: reply.tool_calls });
            let mut results = Vec::with_capacity(calls.len());
            for (index, call) in calls.into_iter().enumerate() {
                let outcome = if index >= MAX_TOOL_CALLS_PER_REPLY {
                    Called::Result(Err(ToolError::new(
                        "too_many_calls",
                        format!("at most {MAX_TOOL_CALLS_PER_REPLY} tool calls are run per answer"),
                    )))
                } else {
                    self.call(&call).await
                };
                match outcome {
                    Called::HandedOff => return StepOutcome::HandedOff,
                    Called::Result(result) => results.push(tool_result(call.id, result)),
                }
            }
            conversation.turns.push(Turn::ToolResults(results));
        }
        failed(
            "ITERATION_LIMIT",
            &format!(
                "the model was still calling tools after {max_iterations} model calls, the agent's max_iterations"
            ),
            false,
        )
    }

    /// Adds a call's usage and reports the step's use so far, with the call's record.
    async fn count(&mut self, iteration: u32, reply: &Reply, latency: std::time::Duration) {
        let cost = self.model.config().cost(reply.usage);
        self.usage.input_tokens = self.usage.input_tokens.saturating_add(reply.usage.input_tokens);
        self.usage.output_tokens = self.usage.output_tokens.saturating_add(reply.usage.output_tokens);
        self.cost += cost;
        let model = if reply.model.is_empty() { self.model.config().model.clone() } else { reply.model.clone() };
        tracing::info!(
            iteration,
            model = %model,
            input_tokens = reply.usage.input_tokens,
            output_tokens = reply.usage.output_tokens,
            latency_ms = latency.as_millis() as u64,
            tool_calls = reply.tool_calls.len(),
            "model call"
        );
        self.step
            .progress(StepProgress {
                assignment_id: self.step.assignment_id().to_owned(),
                message: format!("model call {iteration}"),
                percent: 0,
                tokens_used: self.usage.total(),
                cost: self.cost,
                model_call: Some(ModelCall {
                    iteration,
                    model,
                    input_tokens: reply.usage.input_tokens,
                    output_tokens: reply.usage.output_tokens,
                    latency: Some(muster_client::time::to_duration(latency.as_millis() as u64)),
                    tool_calls: reply.tool_calls.iter().map(|call| call.name.clone()).collect(),
                    cost,
                }),
            })
            .await;
    }

    fn completed(&mut self, output: Value, iterations: u32) -> StepOutcome {
        StepOutcome::Completed {
            output_json: output.to_string(),
            tokens_used: self.usage.total(),
            cost: self.cost,
            iterations,
            remember: std::mem::take(&mut self.notes.notes),
            skip_triggers: self.notes.skip_triggers,
        }
    }

    /// The tools offered to the model: the role's (with the schemas their
    /// providers registered), then the cluster's.
    async fn offered_tools(&self) -> Vec<ToolDefinition> {
        let mut tools: Vec<ToolDefinition> = self.workspace_tools.iter().map(|tool| tool.definition()).collect();
        if !self.provided.is_empty() {
            let registered = self.agent.registered_tools(self.step).await;
            for name in &self.provided {
                let spec = registered.iter().find(|spec| &spec.name == name);
                tools.push(provided_tool(name, spec));
            }
        }
        tools.extend(ClusterTool::ALL.iter().map(|tool| tool.definition()));
        tools
    }

    /// Runs one tool call.
    async fn call(&mut self, call: &ToolCall) -> Called {
        let arguments = match &call.arguments {
            Ok(arguments) => arguments.clone(),
            Err(text) => {
                let excerpt: String = text.chars().take(200).collect();
                return Called::Result(Err(ToolError::new(
                    "invalid_arguments",
                    format!("the arguments are not a JSON object: {excerpt}"),
                )));
            }
        };
        if let Some(tool) = WorkspaceTool::from_name(&call.name).filter(|tool| self.workspace_tools.contains(tool)) {
            return Called::Result(self.workspace_call(tool, arguments).await);
        }
        if let Some(tool) = ClusterTool::from_name(&call.name) {
            if let Err(problem) = tool.check(&arguments) {
                return Called::Result(Err(ToolError::new("invalid_arguments", problem)));
            }
            return self.cluster_call(tool, &call.id, &arguments).await;
        }
        if self.provided.contains(&call.name) {
            let invoked =
                cluster::invoke_tool(self.step.execution(), &self.assignment.execution_id, &call.name, arguments);
            return Called::Result(invoked.await);
        }
        Called::Result(Err(ToolError::new("unknown_tool", format!("no tool named '{}' is offered to you", call.name))))
    }

    async fn workspace_call(&self, tool: WorkspaceTool, arguments: Value) -> Result<Value, ToolError> {
        tool.check(&arguments).map_err(|problem| ToolError::new("invalid_arguments", problem))?;
        let workspace = self.agent.workspace.clone();
        let role = self.assignment.role_definition.clone().unwrap_or_default();
        let text = move |key: &str| arguments.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let done = tokio::task::spawn_blocking(move || {
            let access = Access { read_paths: &role.read_paths, write_paths: &role.write_paths };
            match tool {
                WorkspaceTool::ReadFile => workspace.read_file(&text("path"), access),
                WorkspaceTool::WriteFile => workspace.write_file(&text("path"), &text("content"), false, access),
                WorkspaceTool::AppendFile => workspace.write_file(&text("path"), &text("content"), true, access),
                WorkspaceTool::ListFiles => workspace.list_files(&text("path"), access),
                WorkspaceTool::MoveFile => workspace.move_file(&text("from"), &text("to"), access),
            }
        })
        .await;
        match done {
            Ok(result) => result.map_err(|error| ToolError::new("file_refused", error.0)),
            Err(_) => Err(ToolError::new("internal", "the file tool stopped unexpectedly")),
        }
    }

    async fn cluster_call(&mut self, tool: ClusterTool, call_id: &str, arguments: &Value) -> Called {
        let acting = Acting {
            agent_id: &self.assignment.agent_id,
            execution_id: &self.assignment.execution_id,
            execution: self.step.execution(),
            roster: self.agent.roster(self.step),
            step: Some(self.step),
            holds_role: self.assignment.role_definition.is_some(),
        };
        cluster::call(acting, &mut self.notes, tool, call_id, arguments).await
    }
}

/// A role tool as offered: with its provider's schema when one is registered.
fn provided_tool(name: &str, spec: Option<&ToolSpec>) -> ToolDefinition {
    let parameters = spec
        .and_then(|spec| spec.input_schema.as_ref())
        .and_then(|schema| muster_client::json::object_to_json(schema).ok())
        .unwrap_or_else(|| json!({"type": "object"}));
    let description = spec
        .map(|spec| spec.description.clone())
        .filter(|description| !description.is_empty())
        .unwrap_or_else(|| format!("The {name} tool of your role."));
    ToolDefinition { name: name.to_owned(), description, parameters }
}

fn tool_result(call_id: String, result: Result<Value, ToolError>) -> ToolResult {
    let (value, is_error) = match result {
        Ok(value) => (value, false),
        Err(error) => (error.to_json(), true),
    };
    let mut content = value.to_string();
    if content.chars().count() > MAX_TOOL_RESULT_CHARS {
        content = format!(
            "{}… (cut at {MAX_TOOL_RESULT_CHARS} characters)",
            content.chars().take(MAX_TOOL_RESULT_CHARS).collect::<String>()
        );
    }
    ToolResult { call_id, content, is_error }
}

fn failed(code: &str, message: &str, retryable: bool) -> StepOutcome {
    StepOutcome::Failed { error_code: code.to_owned(), message: message.to_owned(), retryable }
}

/// A roster client carrying the agent's own credential.
pub(crate) fn roster_client(
    replicas: &muster_client::balance::Balanced,
    token: &str,
) -> Result<RosterServiceClient<muster_client::auth::AuthChannel>, ToolError> {
    let credentials = Credentials::bearer(token).map_err(|error| ToolError::new("internal", error.to_string()))?;
    Ok(RosterServiceClient::new(with_credentials(replicas.clone(), credentials)))
}
