//! The two providers against scripted fake model servers over real HTTP on
//! loopback: the shape of each request (the key as a bearer token or
//! `x-api-key`, tools as JSON schemas), rate limits retried after
//! `Retry-After`, server errors retried with a bound, a hanging server
//! timed out, and a malformed answer refused.

use std::time::{Duration, Instant};

use muster_agent::{
    config::{Keys, LlmConfig},
    provider::{Conversation, Model, ModelError, Request, ToolDefinition, Turn},
    testing::{FakeModel, Reply, anthropic_tool_uses, openai_text},
};
use serde_json::{Value, json};

fn model(config: Value) -> Model {
    let config = LlmConfig::from_json(&config).unwrap().unwrap();
    Model::new(config, muster_agent::http_client().unwrap())
}

/// A model whose key variable holds `key` (as the worker's environment would).
fn with_key(config: Value, (variable, key): (&str, &str)) -> Model {
    let config = LlmConfig::from_json(&config).unwrap().unwrap();
    let keys = Keys::fixed([(variable.to_owned(), key.to_owned())]);
    Model::new(config, muster_agent::http_client().unwrap()).with_keys(keys)
}

fn conversation() -> Conversation {
    Conversation { system: "You are Wren.".into(), turns: vec![Turn::User("Write the draft".into())] }
}

fn tools() -> Vec<ToolDefinition> {
    vec![ToolDefinition {
        name: "word_count".into(),
        description: "Counts words".into(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
    }]
}

#[tokio::test]
async fn an_openai_request_carries_the_key_as_a_bearer_token_and_the_tools_as_functions() {
    let variable = "OPENAI_KEY_FOR_THIS_TEST";
    let server = FakeModel::start(|_| openai_text("done", 11, 4)).await;
    let model = with_key(
        json!({"provider": "openai", "model": "gpt-test", "base_url": format!("{}/v1", server.url()),
               "api_key_env": variable, "temperature": 0.3}),
        (variable, "k-test-123"),
    );
    let (reply, exchange) =
        model.complete(Request { conversation: &conversation(), tools: &tools(), output_schema: None }).await;
    let reply = reply.unwrap();
    assert_eq!((reply.text.as_str(), reply.usage.input_tokens, reply.usage.output_tokens), ("done", 11, 4));
    assert_eq!(exchange.attempts, 1);
    let requests = server.requests();
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].headers["authorization"], "Bearer k-test-123");
    assert_eq!(requests[0].body["model"], "gpt-test");
    assert_eq!(requests[0].body["messages"][0], json!({"role": "system", "content": "You are Wren."}));
    assert_eq!(requests[0].body["tools"][0]["function"]["parameters"]["properties"]["text"]["type"], "string");
    assert_eq!(requests[0].body["temperature"], 0.3);
}

#[tokio::test]
async fn an_anthropic_request_carries_the_key_in_x_api_key_and_tools_with_input_schemas() {
    let variable = "ANTHROPIC_KEY_FOR_THIS_TEST";
    let server = FakeModel::start(|_| anthropic_tool_uses(&[("word_count", json!({"text": "a b"}))], 20, 5)).await;
    let model = with_key(
        json!({"provider": "anthropic", "model": "claude-test", "base_url": server.url(), "api_key_env": variable}),
        (variable, "k-ant-456"),
    );
    let (reply, _) =
        model.complete(Request { conversation: &conversation(), tools: &tools(), output_schema: None }).await;
    let reply = reply.unwrap();
    assert_eq!(reply.tool_calls[0].name, "word_count");
    assert_eq!(reply.tool_calls[0].arguments, Ok(json!({"text": "a b"})));
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.headers["x-api-key"], "k-ant-456");
    assert!(!request.headers.contains_key("authorization"));
    assert_eq!(request.headers["anthropic-version"], "2023-06-01");
    assert_eq!(request.body["system"], "You are Wren.");
    assert_eq!(request.body["tools"][0]["input_schema"]["type"], "object");
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_the_wait_the_server_asks_for() {
    let server = FakeModel::start(|request| {
        if request.index == 0 {
            Reply::Status { status: 429, headers: vec![("retry-after".into(), "1".into())], body: "slow down".into() }
        } else {
            openai_text("ok", 1, 1)
        }
    })
    .await;
    let model = model(json!({"provider": "openai", "model": "m", "base_url": server.url()}));
    let started = Instant::now();
    let (reply, exchange) =
        model.complete(Request { conversation: &conversation(), tools: &[], output_schema: None }).await;
    assert_eq!(reply.unwrap().text, "ok");
    assert_eq!(exchange.attempts, 2);
    assert!(started.elapsed() >= Duration::from_secs(1), "the second attempt came before Retry-After");
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times_and_refusals_not_at_all() {
    let server = FakeModel::start(|_| Reply::Status { status: 503, headers: vec![], body: "overloaded".into() }).await;
    let model = model(json!({"provider": "openai", "model": "m", "base_url": server.url()}));
    let (reply, exchange) =
        model.complete(Request { conversation: &conversation(), tools: &[], output_schema: None }).await;
    let error = reply.unwrap_err();
    assert!(matches!(error, ModelError::Unavailable { attempts: 3, .. }), "{error}");
    assert!(error.retryable() && error.to_string().contains("overloaded"), "{error}");
    assert_eq!((exchange.attempts, server.requests().len()), (3, 3));

    let server = FakeModel::start(|_| Reply::Status { status: 401, headers: vec![], body: "bad key".into() }).await;
    let model = self::model(json!({"provider": "openai", "model": "m", "base_url": server.url()}));
    let (reply, _) = model.complete(Request { conversation: &conversation(), tools: &[], output_schema: None }).await;
    let error = reply.unwrap_err();
    assert_eq!((error.code(), error.retryable(), server.requests().len()), ("MODEL_REFUSED", false, 1));
}

#[tokio::test]
async fn a_hanging_server_times_out_and_a_malformed_answer_is_refused() {
    let server = FakeModel::start(|_| Reply::Hang).await;
    let model = model(json!({"provider": "openai", "model": "m", "base_url": server.url(), "timeout_seconds": 0.3}));
    let (reply, _) = model.complete(Request { conversation: &conversation(), tools: &[], output_schema: None }).await;
    let error = reply.unwrap_err();
    assert_eq!((error.code(), error.retryable()), ("MODEL_TIMEOUT", true), "{error}");
    // The caller hung up on each held request.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.abandoned(), 3);

    let server = FakeModel::start(|_| Reply::Json(json!({"unexpected": true}))).await;
    let model = self::model(json!({"provider": "anthropic", "model": "m", "base_url": server.url()}));
    let (reply, _) = model.complete(Request { conversation: &conversation(), tools: &[], output_schema: None }).await;
    assert_eq!(reply.unwrap_err().code(), "MODEL_MALFORMED");
}

#[tokio::test]
async fn a_missing_key_variable_is_named_and_nothing_is_sent() {
    let server = FakeModel::start(|_| openai_text("x", 1, 1)).await;
    let model = model(
        json!({"provider": "openai", "model": "m", "base_url": server.url(), "api_key_env": "MUSTER_TEST_NEVER_SET"}),
    );
    let (reply, _) = model.complete(Request { conversation: &conversation(), tools: &[], output_schema: None }).await;
    let error = reply.unwrap_err();
    assert!(error.to_string().contains("MUSTER_TEST_NEVER_SET"), "{error}");
    assert!(server.requests().is_empty());
}
