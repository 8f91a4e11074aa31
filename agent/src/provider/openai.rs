//! OpenAI's Chat Completions, as OpenAI and every compatible server (vLLM,
//! Ollama, llama.cpp's server, LM Studio, OpenRouter) speak it.

use serde_json::{Map, Value, json};

use super::{Reply, Request, ToolCall, Turn};
use crate::config::{LlmConfig, Usage};

/// The request's body.
pub(super) fn request_body(config: &LlmConfig, request: Request<'_>) -> Value {
    let mut messages = vec![json!({"role": "system", "content": request.conversation.system})];
    for turn in &request.conversation.turns {
        match turn {
            Turn::User(text) => messages.push(json!({"role": "user", "content": text})),
            Turn::Assistant { text, tool_calls } => {
                let mut message = Map::new();
                message.insert("role".into(), "assistant".into());
                message.insert("content".into(), if text.is_empty() { Value::Null } else { text.clone().into() });
                if !tool_calls.is_empty() {
                    let calls = tool_calls
                        .iter()
                        .map(|call| {
                            let arguments = match &call.arguments {
                                Ok(arguments) => arguments.to_string(),
                                Err(text) => text.clone(),
                            };
                            json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
                        })
                        .collect::<Vec<_>>();
                    message.insert("tool_calls".into(), calls.into());
                }
                messages.push(message.into());
            }
            Turn::ToolResults(results) => {
                for result in results {
                    messages.push(json!({"role": "tool", "tool_call_id": result.call_id, "content": result.content}));
                }
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), config.model.clone().into());
    body.insert("messages".into(), messages.into());
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name, "description": tool.description, "parameters": tool.parameters
                }})
            })
            .collect::<Vec<_>>();
        body.insert("tools".into(), tools.into());
    }
    if let Some(temperature) = config.temperature {
        body.insert("temperature".into(), temperature.into());
    }
    if let Some(max_tokens) = config.max_tokens {
        body.insert("max_tokens".into(), max_tokens.into());
    }
    if let Some(schema) = request.output_schema {
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": "step_output", "schema": schema}}),
        );
    }
    body.into()
}

/// The reply an answer holds.
pub(super) fn read_reply(answer: &Value) -> Result<Reply, String> {
    let message =
        answer.pointer("/choices/0/message").and_then(Value::as_object).ok_or("no choices[0].message in the answer")?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(_) => return Err("choices[0].message.content is not text".to_owned()),
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|calls| !calls.is_null()) {
        let calls = calls.as_array().ok_or("choices[0].message.tool_calls is not a list")?;
        for (index, call) in calls.iter().enumerate() {
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("tool_calls[{index}] has no function.name"))?;
            let id = call.get("id").and_then(Value::as_str).map_or_else(|| format!("call_{index}"), str::to_owned);
            let arguments = match call.pointer("/function/arguments") {
                Some(Value::String(text)) if text.trim().is_empty() => Ok(Value::Object(Map::new())),
                Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                    Ok(value @ Value::Object(_)) => Ok(value),
                    _ => Err(text.clone()),
                },
                Some(value @ Value::Object(_)) => Ok(value.clone()),
                None | Some(Value::Null) => Ok(Value::Object(Map::new())),
                Some(other) => Err(other.to_string()),
            };
            tool_calls.push(ToolCall { id, name: name.to_owned(), arguments });
        }
    }
    let tokens = |pointer: &str| answer.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    Ok(Reply {
        text,
        tool_calls,
        usage: Usage {
            input_tokens: tokens("/usage/prompt_tokens"),
            output_tokens: tokens("/usage/completion_tokens"),
        },
        model: answer.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Conversation, ToolDefinition, ToolResult};

    #[test]
    fn a_conversation_becomes_chat_messages() {
        let config = crate::config::LlmConfig::from_json(
            &json!({"provider": "openai", "model": "m", "temperature": 0.1, "max_tokens": 50}),
        )
        .unwrap()
        .unwrap();
        let conversation = Conversation {
            system: "be brief".into(),
            turns: vec![
                Turn::User("task".into()),
                Turn::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "read_file".into(),
                        arguments: Ok(json!({"path": "a"})),
                    }],
                },
                Turn::ToolResults(vec![ToolResult { call_id: "c1".into(), content: "{}".into(), is_error: false }]),
            ],
        };
        let tools = [ToolDefinition {
            name: "read_file".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }];
        let body = request_body(&config, Request { conversation: &conversation, tools: &tools, output_schema: None });
        assert_eq!(body["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(body["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"path\":\"a\"}");
        assert_eq!(body["messages"][3], json!({"role": "tool", "tool_call_id": "c1", "content": "{}"}));
        assert_eq!(body["tools"][0]["function"]["name"], "read_file");
        assert_eq!((body["temperature"].as_f64(), body["max_tokens"].as_u64()), (Some(0.1), Some(50)));
    }

    #[test]
    fn a_reply_gives_text_tool_calls_and_usage() {
        let reply = read_reply(&json!({
            "model": "m-1",
            "choices": [{"message": {"content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "t", "arguments": "{\"x\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "t", "arguments": "not json"}}
            ]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3}
        }))
        .unwrap();
        assert_eq!(reply.tool_calls[0].arguments, Ok(json!({"x": 1})));
        assert_eq!(reply.tool_calls[1].arguments, Err("not json".to_owned()));
        assert_eq!(reply.usage.total(), 13);
        assert!(read_reply(&json!({"error": "x"})).is_err());
    }
}
