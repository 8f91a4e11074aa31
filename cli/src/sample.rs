//! The sample agents' deterministic behaviour, so sample processes run with no
//! LLM: each step's output is a JSON object naming the agent, the step, its
//! instruction, its inputs, the steps it built on (with the size of each of
//! their outputs), and the context it was given (role, size of the system
//! prompt, shared-memory keys, history length, memory entries).
//!
//! A run of a role (a step of the process `role-<name>` that runs it) adds
//! one entry to the role's memory: which run it was and what it saw.
//!
//! It provides two tools: `word_count` (input `{"text": string}`, output
//! `{"words": n}`) and `flaky_tool`, which always fails (status 500).
//!
//! Inputs steer it for demonstrations and tests: `"fail": "message"` makes the
//! step fail (code `SAMPLE_FAILURE`), `"fail_attempts": n` fails the first `n`
//! attempts with a retryable error, `"sleep_ms": n` takes that long,
//! `"iterations": n` reports `n` iterations (1 otherwise), `"output_bytes": n`
//! pads the output with a `padding` string of `n` bytes, and
//! `"delegate": {"from-agent": "to-agent", ...}` makes an agent named there hand
//! the step onward to the agent it maps to (doing the step itself when the
//! execution service refuses, for example as a loop).

use std::time::Duration;

use muster_proto::execution::v1::{Assignment, MemoryNote, MemoryScope, ToolCall, ToolOutput, ToolSpec};
use serde_json::{Value, json};

use crate::worker::{Behaviour, Step, StepOutcome, json};

/// Shared-memory keys an output lists.
const MEMORY_KEYS_SHOWN: usize = 10;

/// The deterministic sample behaviour.
#[derive(Debug, Default, Clone, Copy)]
pub struct SampleBehaviour;

impl SampleBehaviour {
    /// The deterministic output of a step.
    fn complete(assignment: &Assignment, memory_keys: &[String], inputs: &Value) -> StepOutcome {
        let mut upstream: Vec<&String> = assignment.upstream_outputs.keys().collect();
        upstream.sort();
        let upstream_bytes: serde_json::Map<String, Value> = assignment
            .upstream_outputs
            .iter()
            .map(|(step, output)| (step.clone(), json_bytes(output).into()))
            .collect();
        // What the agent was told, so its output shows the task context it had.
        let mut output = json!({
            "agent": assignment.agent_id,
            "step": assignment.step_id,
            "text": format!("{} did: {}", assignment.agent_id, assignment.message),
            "inputs": inputs,
            "built_on": upstream,
            "upstream_bytes": upstream_bytes,
            "attempt": assignment.attempt,
            "role": assignment.role_definition.as_ref().map(|role| role.name.clone()),
            "system_prompt_chars": assignment.system_prompt.chars().count(),
            // The first few, and how many: an output stays mostly text, as
            // an agent's would, however long the run.
            "memory_keys": memory_keys.iter().take(MEMORY_KEYS_SHOWN).collect::<Vec<_>>(),
            "memory_steps": memory_keys.len(),
            "history_steps": assignment.history.len(),
            "session_role": assignment.session_role,
            "max_iterations": assignment.max_iterations,
            "llm_config": assignment.llm_config.as_ref().map_or(Value::Null, |config| object(Some(config))),
            "memory_entries": assignment.memory.len(),
        });
        if let Some(padding) = inputs.get("output_bytes").and_then(Value::as_u64) {
            output["padding"] = "x".repeat(usize::try_from(padding.min(16 << 20)).unwrap_or_default()).into();
        }
        let iterations = inputs.get("iterations").and_then(Value::as_u64).map_or(1, |iterations| iterations as u32);
        let role_run = assignment.process_name.starts_with("role-") && assignment.role_definition.is_some();
        let remember = if role_run {
            let messages = inputs.get("inbox_messages").and_then(Value::as_array).map_or(0, Vec::len);
            vec![MemoryNote {
                scope: MemoryScope::Role as i32,
                text: format!(
                    "{} ran {} (execution {}): {messages} inbox messages, {} memory entries read",
                    assignment.agent_id,
                    assignment.process_name,
                    assignment.execution_id,
                    assignment.memory.len()
                ),
            }]
        } else {
            Vec::new()
        };
        StepOutcome::Completed {
            output_json: output.to_string(),
            tokens_used: 100,
            cost: 0.01,
            iterations,
            remember,
            skip_triggers: false,
        }
    }
}

impl Behaviour for SampleBehaviour {
    async fn run(&self, assignment: Assignment, step: Step) -> StepOutcome {
        let inputs = object(assignment.inputs.as_ref());
        // Only the keys: the values (up to a hundred steps' outputs) are
        // not decoded to be listed.
        let mut memory_keys = match step.shared_memory().step_ids() {
            Ok(keys) => keys,
            Err(error) => {
                return StepOutcome::Failed {
                    error_code: "SHARED_MEMORY_UNREADABLE".to_owned(),
                    message: format!("the assignment's shared memory could not be read: {error}"),
                    retryable: true,
                };
            }
        };
        memory_keys.sort_unstable();
        if let Some(milliseconds) = inputs.get("sleep_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(milliseconds)).await;
        }
        if let Some(message) = inputs.get("fail").and_then(Value::as_str) {
            return StepOutcome::Failed {
                error_code: "SAMPLE_FAILURE".to_owned(),
                message: message.to_owned(),
                retryable: false,
            };
        }
        if let Some(failing_attempts) = inputs.get("fail_attempts").and_then(Value::as_u64)
            && u64::from(assignment.attempt) <= failing_attempts
        {
            return StepOutcome::Failed {
                error_code: "SAMPLE_TRANSIENT".to_owned(),
                message: format!("attempt {} fails on purpose", assignment.attempt),
                retryable: true,
            };
        }
        let delegate_to = inputs.get("delegate").and_then(|map| map.get(&assignment.agent_id)).and_then(Value::as_str);
        if let Some(target) = delegate_to {
            let own = Box::new(Self::complete(&assignment, &memory_keys, &inputs));
            return StepOutcome::Delegate {
                to_agent_id: target.to_owned(),
                required_expertise: Vec::new(),
                reason: format!("{} hands it to {target}", assignment.agent_id),
                otherwise: own,
            };
        }
        Self::complete(&assignment, &memory_keys, &inputs)
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "word_count".to_owned(),
                description: "Counts the words of a text".to_owned(),
                input_schema: json::struct_from_text(
                    &json!({
                        "type": "object",
                        "properties": {"text": {"type": "string"}},
                        "required": ["text"],
                        "additionalProperties": false
                    })
                    .to_string(),
                )
                .ok()
                .flatten(),
            },
            ToolSpec {
                name: "flaky_tool".to_owned(),
                description: "Always fails, to show how a provider's fault looks".to_owned(),
                input_schema: None,
            },
        ]
    }

    async fn call_tool(&self, call: ToolCall) -> ToolOutput {
        let input = object(call.input.as_ref());
        match call.tool.as_str() {
            "word_count" => {
                let words = input.get("text").and_then(Value::as_str).map_or(0, |text| text.split_whitespace().count());
                let output = json::from_json(json!({"words": words}));
                ToolOutput { output: Some(output), error: String::new(), status_code: 200 }
            }
            "flaky_tool" => {
                ToolOutput { output: None, error: "the sample tool failed on purpose".to_owned(), status_code: 500 }
            }
            other => ToolOutput { output: None, error: format!("no tool '{other}'"), status_code: 404 },
        }
    }
}

/// A wire object as JSON (`{}` when not set; a number JSON cannot hold is `null`).
fn object(object: Option<&prost_types::Struct>) -> Value {
    object.and_then(|object| json::object_to_json(object).ok()).unwrap_or_else(|| json!({}))
}

/// Bytes of a wire value as JSON text.
fn json_bytes(value: &prost_types::Value) -> usize {
    json::value_to_text(Some(value)).map_or(0, |text| text.len())
}
