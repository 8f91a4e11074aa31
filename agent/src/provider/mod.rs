//! The model endpoints: one conversation model, two wire formats (OpenAI's
//! Chat Completions and Anthropic's Messages), and one HTTP path with the
//! timeout, the bounded retries that honour `Retry-After`, and the errors a
//! step fails with.

mod anthropic;
mod openai;

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::{Keys, LlmConfig, ProviderKind, Usage};

/// Attempts of one model call, the first included, on 429, 5xx and broken
/// connections.
pub const MAX_ATTEMPTS: u32 = 3;
/// The longest `Retry-After` waited for; a longer one fails the call at once.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The first pause between attempts when the endpoint names none; it doubles.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Most bytes of an answer read; a longer one is malformed.
const MAX_ANSWER_BYTES: usize = 8 << 20;
/// Most characters of an endpoint's error text kept in a step's failure.
const ERROR_EXCERPT_CHARS: usize = 300;

/// A conversation with a model: the system prompt and the turns so far.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The system prompt.
    pub system: String,
    /// The turns, oldest first.
    pub turns: Vec<Turn>,
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// What the user (muster) says.
    User(String),
    /// What the model answered: text and the tools it called.
    Assistant {
        /// Its text (may be empty).
        text: String,
        /// The tools it called.
        tool_calls: Vec<ToolCall>,
    },
    /// The answers to the model's tool calls.
    ToolResults(Vec<ToolResult>),
}

/// A tool the model called.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The endpoint's id of the call.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments; `Err` with the text when they are not a JSON object.
    pub arguments: Result<Value, String>,
}

/// The answer to one tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The call's id.
    pub call_id: String,
    /// The answer, as text (JSON).
    pub content: String,
    /// Whether the tool refused or failed.
    pub is_error: bool,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// One model call.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The conversation so far.
    pub conversation: &'a Conversation,
    /// The tools offered.
    pub tools: &'a [ToolDefinition],
    /// The JSON schema the final answer must match, when the role has one.
    pub output_schema: Option<&'a Value>,
}

/// The model's answer to one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// Its text.
    pub text: String,
    /// The tools it called; none means it answered.
    pub tool_calls: Vec<ToolCall>,
    /// What the call used.
    pub usage: Usage,
    /// The model that answered, as the endpoint names it.
    pub model: String,
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// The key's variable is not set.
    #[error("{0}")]
    Key(String),
    /// Every attempt timed out.
    #[error("the model endpoint did not answer within {0:?} ({MAX_ATTEMPTS} attempts)")]
    Timeout(Duration),
    /// The endpoint stayed unavailable (429, 5xx, connection failures).
    #[error("the model endpoint was unavailable after {attempts} attempt(s): {last}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The endpoint refused the request (4xx other than 429).
    #[error("the model endpoint refused the request: HTTP {status}: {excerpt}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The start of its answer.
        excerpt: String,
    },
    /// The answer could not be read.
    #[error("the model's answer could not be read: {0}")]
    Malformed(String),
}

impl ModelError {
    /// The step's error code for this failure.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Key(_) => "MODEL_KEY_MISSING",
            Self::Timeout(_) => "MODEL_TIMEOUT",
            Self::Unavailable { .. } => "MODEL_UNAVAILABLE",
            Self::Refused { .. } => "MODEL_REFUSED",
            Self::Malformed(_) => "MODEL_MALFORMED",
        }
    }

    /// Whether another attempt of the step may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Unavailable { .. } | Self::Malformed(_))
    }
}

/// What one call's exchange looked like, for transcripts.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The request's body.
    pub request: Value,
    /// The answer's body, when it was JSON.
    pub response: Option<Value>,
    /// HTTP attempts made.
    pub attempts: u32,
    /// Time from the first attempt to the answer.
    pub latency: Duration,
}

/// A model endpoint as one agent's settings describe it.
#[derive(Debug, Clone)]
pub struct Model {
    config: LlmConfig,
    http: reqwest::Client,
    keys: Keys,
}

impl Model {
    /// The endpoint of `config`, called through `http`, its key read from
    /// the environment.
    pub fn new(config: LlmConfig, http: reqwest::Client) -> Self {
        Self { config, http, keys: Keys::Environment }
    }

    /// The same, its key read from `keys`.
    pub fn with_keys(self, keys: Keys) -> Self {
        Self { keys, ..self }
    }

    /// The settings.
    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    /// One model call: the reply, and the exchange for the transcript.
    pub async fn complete(&self, request: Request<'_>) -> (Result<Reply, ModelError>, Exchange) {
        let body = match self.config.provider {
            ProviderKind::OpenAi => openai::request_body(&self.config, request),
            ProviderKind::Anthropic => anthropic::request_body(&self.config, request),
        };
        let started = Instant::now();
        let mut exchange = Exchange { request: body, response: None, attempts: 0, latency: Duration::ZERO };
        let outcome = self.send(&mut exchange).await.and_then(|answer| {
            let reply = match self.config.provider {
                ProviderKind::OpenAi => openai::read_reply(&answer),
                ProviderKind::Anthropic => anthropic::read_reply(&answer),
            };
            exchange.response = Some(answer);
            reply.map_err(ModelError::Malformed)
        });
        exchange.latency = started.elapsed();
        (outcome, exchange)
    }

    /// Posts the exchange's request until an answer, a refusal, or the last attempt.
    async fn send(&self, exchange: &mut Exchange) -> Result<Value, ModelError> {
        let key = self.config.api_key(&self.keys).map_err(ModelError::Key)?;
        let url = match self.config.provider {
            ProviderKind::OpenAi => format!("{}/chat/completions", self.config.base_url),
            ProviderKind::Anthropic => format!("{}/v1/messages", self.config.base_url),
        };
        let mut pause = FIRST_BACKOFF;
        let mut timed_out = 0;
        loop {
            exchange.attempts += 1;
            let mut call = self.http.post(&url).timeout(self.config.timeout).json(&exchange.request);
            call = match (self.config.provider, &key) {
                (ProviderKind::OpenAi, Some(key)) => call.bearer_auth(key.expose()),
                (ProviderKind::Anthropic, Some(key)) => call.header("x-api-key", key.expose()),
                (_, None) => call,
            };
            if self.config.provider == ProviderKind::Anthropic {
                call = call.header("anthropic-version", anthropic::API_VERSION);
            }
            let failure = match call.send().await {
                Ok(response) if response.status().is_success() => return read_json(response).await,
                Ok(response) => {
                    let status = response.status().as_u16();
                    let retry_after = retry_after(response.headers());
                    let excerpt = excerpt(&response.bytes().await.unwrap_or_default());
                    if !matches!(status, 429 | 500 | 502 | 503 | 504 | 529) {
                        return Err(ModelError::Refused { status, excerpt });
                    }
                    if let Some(wait) = retry_after {
                        if wait > MAX_RETRY_AFTER {
                            return Err(ModelError::Unavailable {
                                attempts: exchange.attempts,
                                last: format!("HTTP {status}, Retry-After {} s is too long to wait", wait.as_secs()),
                            });
                        }
                        pause = wait;
                    }
                    format!("HTTP {status}: {excerpt}")
                }
                Err(error) if error.is_timeout() => {
                    timed_out += 1;
                    "timed out".to_owned()
                }
                Err(error) => without_url(&error),
            };
            tracing::info!(attempt = exchange.attempts, failure = %failure, "model call failed");
            if exchange.attempts >= MAX_ATTEMPTS {
                if timed_out == exchange.attempts {
                    return Err(ModelError::Timeout(self.config.timeout));
                }
                return Err(ModelError::Unavailable { attempts: exchange.attempts, last: failure });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RETRY_AFTER);
        }
    }
}

/// The answer's body as JSON, read up to [`MAX_ANSWER_BYTES`].
async fn read_json(mut response: reqwest::Response) -> Result<Value, ModelError> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_ANSWER_BYTES {
                    return Err(ModelError::Malformed(format!("the answer is over {MAX_ANSWER_BYTES} bytes")));
                }
            }
            Ok(None) => break,
            Err(error) if error.is_timeout() => {
                return Err(ModelError::Malformed("the answer stopped coming (timed out)".to_owned()));
            }
            Err(error) => return Err(ModelError::Malformed(format!("the answer broke off: {}", without_url(&error)))),
        }
    }
    serde_json::from_slice(&body)
        .map_err(|error| ModelError::Malformed(format!("not JSON ({error}): {}", excerpt(&body))))
}

/// The wait a `Retry-After` header asks for: seconds, or an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(86_400.0)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

/// The start of an answer, as text on one line.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > ERROR_EXCERPT_CHARS {
        format!("{}…", line.chars().take(ERROR_EXCERPT_CHARS).collect::<String>())
    } else {
        line
    }
}

/// A transport error without its URL (which carries no secret, but is noise).
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "the endpoint");
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The text of a model's final answer as a step's output: the JSON it gave
/// (an object or array, bare or in a fenced block), else the text itself.
pub fn answer_as_output(text: &str) -> Value {
    let trimmed = text.trim();
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|inner| inner.strip_suffix("```"))
        .map_or(trimmed, str::trim);
    match serde_json::from_str::<Value>(unfenced) {
        Ok(value @ (Value::Object(_) | Value::Array(_))) => value,
        _ => Value::String(trimmed.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_its_json_or_its_text() {
        assert_eq!(answer_as_output("{\"a\": 1}"), serde_json::json!({"a": 1}));
        assert_eq!(answer_as_output("```json\n[1, 2]\n```"), serde_json::json!([1, 2]));
        assert_eq!(answer_as_output("  done.  "), serde_json::json!("done."));
        assert_eq!(answer_as_output("42"), serde_json::json!("42"));
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
        headers.insert(reqwest::header::RETRY_AFTER, later.parse().unwrap());
        let wait = retry_after(&headers).unwrap();
        assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");
        headers.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn failures_say_whether_a_retry_may_help() {
        assert!(ModelError::Timeout(Duration::from_secs(1)).retryable());
        assert!(ModelError::Malformed("x".into()).retryable());
        assert!(!ModelError::Refused { status: 401, excerpt: String::new() }.retryable());
        assert!(!ModelError::Key("x".into()).retryable());
    }
}
