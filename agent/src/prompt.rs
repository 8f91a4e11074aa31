//! What the model is told. The system prompt is the one the roster renders
//! for the agent (its own prompt and backstory, its role's mission, goals,
//! tools, context files and preferences with the think-first preamble, the
//! organisation and the delegation framework), with the session's context
//! when the step is part of a team session. The first user message is the
//! assignment: the step's instruction and inputs, what the steps it builds
//! on produced, its history, the role's and the global memory, and the
//! contents of the role's context files read from the workspace. Every
//! part is bounded, so a large run cannot make a prompt without end.

use std::fmt::Write as _;

use muster_proto::execution::v1::{Assignment, MemoryScope};
use serde_json::Value;

use crate::workspace::{Access, Workspace};

/// Most characters one value (an input, an upstream output) takes in the prompt.
const MAX_VALUE_CHARS: usize = 16 * 1024;
/// Most characters of one context file.
pub const MAX_CONTEXT_FILE_CHARS: usize = 64 * 1024;
/// Most characters of every context file together.
pub const MAX_CONTEXT_CHARS: usize = 256 * 1024;
/// Most files read from one context folder.
const MAX_FILES_PER_FOLDER: usize = 20;
/// Most characters of the shared memory in the prompt.
const MAX_MEMORY_CHARS: usize = 64 * 1024;

/// The system prompt.
pub fn system_prompt(assignment: &Assignment) -> String {
    let mut prompt = assignment.system_prompt.trim().to_owned();
    if prompt.is_empty() {
        prompt = format!("You are {}, an agent of a team run by muster.", assignment.agent_id);
    }
    if !assignment.session_context.trim().is_empty() {
        let _ = write!(
            prompt,
            "\n\n# Team session\nYour role in it: {}\n{}",
            assignment.session_role,
            assignment.session_context.trim()
        );
    }
    prompt
}

/// A context file as read for the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextFile {
    /// Its path in the workspace.
    pub path: String,
    /// Its text; `Err` says why it could not be read.
    pub content: Result<String, String>,
}

/// The role's context files, read from the workspace: a file, or each file
/// of a folder (a path ending in `/`); bounded in size, a missing one named.
pub fn read_context_files(workspace: &Workspace, paths: &[String]) -> Vec<ContextFile> {
    let mut files = Vec::new();
    let mut left = MAX_CONTEXT_CHARS;
    for path in paths {
        let listed = workspace.list_files(path, Access::default());
        let names: Vec<String> = match &listed {
            Ok(folder) => folder["entries"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|entry| entry["kind"] == "file")
                .filter_map(|entry| entry["name"].as_str())
                .take(MAX_FILES_PER_FOLDER)
                .map(|name| format!("{}/{name}", path.trim_end_matches('/')))
                .collect(),
            Err(_) => vec![path.clone()],
        };
        if listed.is_ok() && names.is_empty() {
            files.push(ContextFile { path: path.clone(), content: Err("the folder holds no file".to_owned()) });
        }
        for name in names {
            let content = if left == 0 {
                Err("left out: the context files already fill the prompt's share".to_owned())
            } else {
                workspace.read_file(&name, Access::default()).map_err(|error| error.0).map(|read| {
                    let text = read["content"].as_str().unwrap_or_default();
                    let kept = truncate(text, MAX_CONTEXT_FILE_CHARS.min(left));
                    left = left.saturating_sub(kept.chars().count());
                    kept
                })
            };
            files.push(ContextFile { path: name, content });
        }
    }
    files
}

/// The first user message: the assignment, with its shared memory (the
/// worker's [`Step::shared_memory`](muster_worker::Step::shared_memory), decoded).
pub fn task(assignment: &Assignment, shared_memory: &prost_types::Struct, context_files: &[ContextFile]) -> String {
    let mut task = String::new();
    let _ = writeln!(
        task,
        "# Your task\nProcess {} (version {}), execution {}, step {}{}, attempt {}.\n",
        assignment.process_name,
        assignment.process_version,
        assignment.execution_id,
        assignment.step_id,
        if assignment.step_name.is_empty() || assignment.step_name == assignment.step_id {
            String::new()
        } else {
            format!(" ({})", assignment.step_name)
        },
        assignment.attempt
    );
    let instruction = assignment.message.trim();
    task.push_str(if instruction.is_empty() {
        "(The step gives no instruction: do what your role is for.)"
    } else {
        instruction
    });
    task.push('\n');
    if let Some(inputs) = assignment.inputs.as_ref().filter(|inputs| !inputs.fields.is_empty()) {
        let _ = write!(task, "\n## Inputs\n{}\n", fenced(&object_json(inputs)));
    }
    let mut upstream: Vec<_> = assignment.upstream_outputs.iter().collect();
    upstream.sort_by(|left, right| left.0.cmp(right.0));
    if !upstream.is_empty() {
        task.push_str("\n## What the steps this one depends on produced\n");
        for (step, output) in upstream {
            let value = muster_client::json::to_json(output).unwrap_or(Value::Null);
            let _ = write!(task, "### {step}\n{}\n", fenced(&value));
        }
    }
    {
        // Outputs of earlier steps this one builds on, beyond its direct dependencies.
        let mut text = String::new();
        for (step, output) in &shared_memory.fields {
            if assignment.upstream_outputs.contains_key(step) || text.len() > MAX_MEMORY_CHARS {
                continue;
            }
            let value = muster_client::json::to_json(output).unwrap_or(Value::Null);
            let _ = write!(text, "### {step}\n{}\n", fenced(&value));
        }
        if !text.is_empty() {
            let _ = write!(task, "\n## Earlier steps this one builds on\n{text}");
        }
    }
    if !assignment.history.is_empty() {
        task.push_str("\n## History (oldest first)\n");
        for entry in &assignment.history {
            let at = entry.at.as_ref().map(ToString::to_string).unwrap_or_default();
            let _ = writeln!(task, "- {at} {}: {} by {}", entry.step_id, entry.action, entry.agent_id);
        }
    }
    if !assignment.memory.is_empty() {
        task.push_str("\n## What your team remembers (newest first)\n");
        for entry in &assignment.memory {
            let scope = if entry.scope == MemoryScope::Global as i32 {
                "global".to_owned()
            } else {
                format!("role {}", entry.role)
            };
            let _ = writeln!(task, "- [{scope}, by {}] {}", entry.author, entry.text.trim());
        }
    }
    if !context_files.is_empty() {
        task.push_str("\n## Context files (from the workspace)\n");
        for file in context_files {
            match &file.content {
                Ok(text) => {
                    let _ = write!(task, "### {}\n```\n{}\n```\n", file.path, text.trim_end());
                }
                Err(why) => {
                    let _ = writeln!(task, "### {}\n(not read: {why})", file.path);
                }
            }
        }
    }
    task.push_str(
        "\n## How to answer\nUse the tools offered when they help. When you are done, answer with the step's \
         result: plain text, or a JSON object when the result has structure. Your answer is the step's output.\n",
    );
    if let Some(schema) = output_schema(assignment) {
        let _ = write!(
            task,
            "The answer must be a JSON object matching this JSON schema, and nothing else:\n{}\n",
            fenced(&schema)
        );
    }
    task
}

/// The JSON schema the role's output must match, if it has one.
pub fn output_schema(assignment: &Assignment) -> Option<Value> {
    let schema = assignment.role_definition.as_ref()?.output_schema.as_ref()?;
    (!schema.fields.is_empty()).then(|| object_json(schema))
}

fn object_json(object: &prost_types::Struct) -> Value {
    muster_client::json::object_to_json(object).unwrap_or(Value::Null)
}

fn fenced(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    format!("```json\n{}\n```", truncate(&text, MAX_VALUE_CHARS))
}

/// At most `max` characters of `text`, saying when some were left out.
fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}\n… ({} more characters left out)", text.chars().count() - max)
}

#[cfg(test)]
mod tests {
    use muster_proto::{execution::v1::MemoryEntry, roster::v1::RoleDefinition};

    use super::*;

    #[test]
    fn the_task_carries_instruction_inputs_upstream_memory_and_context() {
        let mut assignment = Assignment {
            process_name: "p".into(),
            execution_id: "e".into(),
            step_id: "report".into(),
            message: "Write the report".into(),
            inputs: muster_client::json::struct_from_text(r#"{"topic": "auth"}"#).unwrap(),
            memory: vec![MemoryEntry {
                scope: MemoryScope::Role as i32,
                role: "delivery".into(),
                text: "Fridays".into(),
                author: "a".into(),
                ..Default::default()
            }],
            role_definition: Some(RoleDefinition {
                output_schema: muster_client::json::struct_from_text(r#"{"type": "object", "required": ["light"]}"#)
                    .unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assignment
            .upstream_outputs
            .insert("research".into(), muster_client::json::from_json(serde_json::json!({"found": 3})));
        let files = vec![
            ContextFile { path: "project/scope.md".into(), content: Ok("the scope".into()) },
            ContextFile { path: "project/timeline.md".into(), content: Err("it does not exist".into()) },
        ];
        let memory = muster_client::json::struct_from_text(r#"{"research": {"found": 3}, "plan": {"steps": 2}}"#)
            .unwrap()
            .unwrap();
        let task = task(&assignment, &memory, &files);
        for part in [
            "Write the report",
            "\"topic\": \"auth\"",
            "### research",
            "\"found\": 3",
            "## Earlier steps this one builds on\n### plan",
            "\"steps\": 2",
            "[role delivery, by a] Fridays",
            "### project/scope.md\n```\nthe scope",
            "### project/timeline.md\n(not read: it does not exist)",
            "\"required\": [\n    \"light\"",
        ] {
            assert!(task.contains(part), "missing {part:?} in:\n{task}");
        }
    }

    #[test]
    fn long_values_are_cut_and_say_so() {
        let cut = truncate(&"x".repeat(100), 10);
        assert!(cut.starts_with("xxxxxxxxxx\n… (90 more characters left out)"), "{cut}");
    }
}
