//! A scripted fake model server for tests: real HTTP on loopback, speaking
//! enough of OpenAI's Chat Completions and Anthropic's Messages for the
//! agent, recording every request (path, headers, body) and answering as
//! the test's script says — JSON, an error status with headers, or never
//! (to test timeouts and cancellation, noting when the caller gave up).

use std::{
    collections::HashMap,
    future::IntoFuture as _,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Its path, such as `/v1/chat/completions`.
    pub path: String,
    /// Its headers, names in lowercase.
    pub headers: HashMap<String, String>,
    /// Its body as JSON (`Null` when it was not JSON).
    pub body: Value,
    /// Its body as text.
    pub text: String,
    /// How many requests came before it.
    pub index: usize,
}

impl Recorded {
    /// The last message's text content (OpenAI or Anthropic), or the tool
    /// results it carries, as one string.
    pub fn last_message(&self) -> String {
        self.body["messages"].as_array().and_then(|messages| messages.last()).map(Value::to_string).unwrap_or_default()
    }

    /// How many tool results the conversation carries so far.
    pub fn tool_results(&self) -> usize {
        let messages = self.body["messages"].as_array().cloned().unwrap_or_default();
        messages
            .iter()
            .map(|message| {
                if message["role"] == "tool" {
                    1
                } else {
                    message["content"]
                        .as_array()
                        .map_or(0, |blocks| blocks.iter().filter(|block| block["type"] == "tool_result").count())
                }
            })
            .sum()
    }
}

/// What the script answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this JSON body.
    Json(Value),
    /// Another status, with headers and a text body.
    Status {
        /// The status.
        status: u16,
        /// Extra headers (`Retry-After`, ...).
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
    },
    /// No answer, ever: the request is held until the caller gives up.
    Hang,
}

type Script = dyn Fn(&Recorded) -> Reply + Send + Sync;

struct Shared {
    script: Box<Script>,
    requests: Mutex<Vec<Recorded>>,
    abandoned: AtomicUsize,
}

/// The fake server; it stops when dropped.
pub struct FakeModel {
    url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeModel {
    /// Starts a server on a free loopback port answering with `script`.
    pub async fn start(script: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Self {
        let shared =
            Arc::new(Shared { script: Box::new(script), requests: Mutex::default(), abandoned: AtomicUsize::new(0) });
        let app = Router::new().fallback(answer).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the fake model server");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).into_future().await;
        });
        Self { url, shared, task }
    }

    /// Its root, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Held requests whose caller went away before an answer.
    pub fn abandoned(&self) -> usize {
        self.shared.abandoned.load(Ordering::SeqCst)
    }
}

/// Counts a held request as abandoned when its handler is dropped.
struct Held(Arc<Shared>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.abandoned.fetch_add(1, Ordering::SeqCst);
    }
}

async fn answer(State(shared): State<Arc<Shared>>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Response {
    let text = String::from_utf8_lossy(&body).into_owned();
    let recorded = {
        let mut requests = shared.requests.lock().unwrap_or_else(PoisonError::into_inner);
        let recorded = Recorded {
            path: uri.path().to_owned(),
            headers: headers
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or_default().to_owned()))
                .collect(),
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
            index: requests.len(),
        };
        requests.push(recorded.clone());
        recorded
    };
    match (shared.script)(&recorded) {
        Reply::Json(value) => {
            (StatusCode::OK, [("content-type", "application/json")], value.to_string()).into_response()
        }
        Reply::Status { status, headers, body } => {
            let mut response =
                (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response();
            for (name, value) in headers {
                if let (Ok(name), Ok(value)) =
                    (axum::http::HeaderName::try_from(name), axum::http::HeaderValue::try_from(value))
                {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        }
        Reply::Hang => {
            let _held = Held(shared.clone());
            std::future::pending::<Response>().await
        }
    }
}

/// An OpenAI answer with text.
pub fn openai_text(text: &str, input_tokens: u64, output_tokens: u64) -> Reply {
    Reply::Json(json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake-model",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    }))
}

/// An OpenAI answer calling tools: (name, arguments) each.
pub fn openai_tool_calls(calls: &[(&str, Value)], input_tokens: u64, output_tokens: u64) -> Reply {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (name, arguments))| {
            json!({"id": format!("call_{index}"), "type": "function",
                   "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    Reply::Json(json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null, "tool_calls": calls}}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    }))
}

/// An Anthropic answer with text.
pub fn anthropic_text(text: &str, input_tokens: u64, output_tokens: u64) -> Reply {
    Reply::Json(json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}
    }))
}

/// An Anthropic answer calling tools: (name, input) each.
pub fn anthropic_tool_uses(calls: &[(&str, Value)], input_tokens: u64, output_tokens: u64) -> Reply {
    let content: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (name, input))| json!({"type": "tool_use", "id": format!("toolu_{index}"), "name": name, "input": input}))
        .collect();
    Reply::Json(json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
        "content": content, "stop_reason": "tool_use",
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}
    }))
}
