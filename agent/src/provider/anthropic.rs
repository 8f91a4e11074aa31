//! Anthropic's Messages API.

use serde_json::{Map, Value, json};

use super::{Reply, Request, ToolCall, Turn};
use crate::config::{LlmConfig, Usage};

/// The `anthropic-version` header every request carries.
pub(super) const API_VERSION: &str = "2023-06-01";
/// `max_tokens` when the settings give none (the API requires one).
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The request's body.
pub(super) fn request_body(config: &LlmConfig, request: Request<'_>) -> Value {
    let mut messages = Vec::new();
    for turn in &request.conversation.turns {
        match turn {
            Turn::User(text) => messages.push(json!({"role": "user", "content": text})),
            Turn::Assistant { text, tool_calls } => {
                let mut content = Vec::new();
                if !text.is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    let input = call.arguments.clone().unwrap_or_else(|_| Value::Object(Map::new()));
                    content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                }
                messages.push(json!({"role": "assistant", "content": content}));
            }
            Turn::ToolResults(results) => {
                let content = results
                    .iter()
                    .map(|result| {
                        json!({"type": "tool_result", "tool_use_id": result.call_id,
                               "content": result.content, "is_error": result.is_error})
                    })
                    .collect::<Vec<_>>();
                messages.push(json!({"role": "user", "content": content}));
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), config.model.clone().into());
    body.insert("system".into(), request.conversation.system.clone().into());
    body.insert("max_tokens".into(), config.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).into());
    body.insert("messages".into(), messages.into());
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters}))
            .collect::<Vec<_>>();
        body.insert("tools".into(), tools.into());
    }
    if let Some(temperature) = config.temperature {
        body.insert("temperature".into(), temperature.into());
    }
    body.into()
}

/// The reply an answer holds.
pub(super) fn read_reply(answer: &Value) -> Result<Reply, String> {
    let blocks = answer.get("content").and_then(Value::as_array).ok_or("no content list in the answer")?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => {
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("content[{index}] (tool_use) has no name"))?;
                let id =
                    block.get("id").and_then(Value::as_str).map_or_else(|| format!("toolu_{index}"), str::to_owned);
                let arguments = match block.get("input") {
                    Some(value @ Value::Object(_)) => Ok(value.clone()),
                    None | Some(Value::Null) => Ok(Value::Object(Map::new())),
                    Some(other) => Err(other.to_string()),
                };
                tool_calls.push(ToolCall { id, name: name.to_owned(), arguments });
            }
            _ => {}
        }
    }
    let tokens = |pointer: &str| answer.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    Ok(Reply {
        text,
        tool_calls,
        usage: Usage { input_tokens: tokens("/usage/input_tokens"), output_tokens: tokens("/usage/output_tokens") },
        model: answer.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Conversation, ToolResult};

    #[test]
    fn a_conversation_becomes_messages_with_tool_blocks() {
        let config =
            crate::config::LlmConfig::from_json(&json!({"provider": "anthropic", "model": "c"})).unwrap().unwrap();
        let conversation = Conversation {
            system: "sys".into(),
            turns: vec![
                Turn::User("task".into()),
                Turn::Assistant {
                    text: "looking".into(),
                    tool_calls: vec![ToolCall { id: "t1".into(), name: "list_files".into(), arguments: Ok(json!({})) }],
                },
                Turn::ToolResults(vec![ToolResult { call_id: "t1".into(), content: "[]".into(), is_error: true }]),
            ],
        };
        let body = request_body(&config, Request { conversation: &conversation, tools: &[], output_schema: None });
        assert_eq!(body["system"], "sys");
        assert_eq!(body["max_tokens"], 4096);
        assert_eq!(body["messages"][1]["content"][1]["type"], "tool_use");
        assert_eq!(body["messages"][2]["content"][0]["is_error"], true);
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn a_reply_gives_text_tool_uses_and_usage() {
        let reply = read_reply(&json!({
            "model": "c-1",
            "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "u", "name": "t", "input": {"a": 1}}],
            "usage": {"input_tokens": 7, "output_tokens": 2}
        }))
        .unwrap();
        assert_eq!((reply.text.as_str(), reply.tool_calls.len(), reply.usage.total()), ("ok", 1, 9));
        assert!(read_reply(&json!({"type": "error"})).is_err());
    }
}
