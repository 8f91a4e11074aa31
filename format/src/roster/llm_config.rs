//! An agent's model settings (`llm_config`): the keys the model-driven agent
//! reads, and the rule that an API key never goes in the roster. The roster
//! import reports each finding at its line and column; the roster service
//! refuses an agent whose settings hold an error, naming the key's path.
//!
//! The keys (documented in `docs/roster-format.md`, "Model settings"):
//! `provider`, `base_url`, `model`, `temperature`, `max_tokens`,
//! `timeout_seconds`, `api_key_env` and `prices`. Any other key is kept, with
//! a warning.

use crate::Severity;

/// The providers the model-driven agent speaks to: `openai` (any
/// OpenAI-compatible Chat Completions endpoint) and `anthropic` (the Messages
/// API).
pub const PROVIDERS: [&str; 2] = ["openai", "anthropic"];

/// The keys of `llm_config` the model-driven agent reads.
pub const KNOWN_KEYS: [&str; 8] =
    ["provider", "base_url", "model", "temperature", "max_tokens", "timeout_seconds", "api_key_env", "prices"];

/// Key names that would hold a secret, refused at any depth (compared
/// without regard to case).
pub const SECRET_KEYS: [&str; 5] = ["api_key", "key", "token", "secret", "authorization"];

/// The longest `timeout_seconds` accepted: an hour.
pub const MAX_TIMEOUT_SECONDS: f64 = 3600.0;

/// Code of a secret (a key named like one, or a value that looks like an API key).
pub const CODE_SECRET: &str = "ROS011";
/// Code of a key the agent does not read (a warning; the key is kept).
pub const CODE_UNKNOWN_KEY: &str = "ROS012";
/// Code of a known key with a value of the wrong type or out of range.
pub const CODE_BAD_VALUE: &str = "ROS013";

/// One step of a path into the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathStep {
    /// A mapping key.
    Key(String),
    /// A list index.
    Index(usize),
}

/// What a finding points at: the key of a mapping entry or its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spot {
    /// The key (an unknown or secret key name).
    Key,
    /// The value.
    Value,
}

/// One finding about an agent's `llm_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmConfigFinding {
    /// Error or warning.
    pub severity: Severity,
    /// [`CODE_SECRET`], [`CODE_UNKNOWN_KEY`] or [`CODE_BAD_VALUE`].
    pub code: &'static str,
    /// Where, from the settings' root; empty for the root itself.
    pub steps: Vec<PathStep>,
    /// Whether the finding is about the last key or its value.
    pub spot: Spot,
    /// A sentence; it never repeats a value from the settings.
    pub message: String,
}

impl LlmConfigFinding {
    /// The path below `llm_config`, such as `headers.authorization` or
    /// `stop[1]`; a key that looks like an API key is shown as `<redacted>`.
    pub fn path(&self) -> String {
        let mut path = String::new();
        for step in &self.steps {
            match step {
                PathStep::Key(key) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(if looks_like_api_key(key) { "<redacted>" } else { key });
                }
                PathStep::Index(index) => path.push_str(&format!("[{index}]")),
            }
        }
        path
    }

    /// The path under `prefix` (`agent.llm_config` gives `agent.llm_config.api_key`).
    pub fn path_under(&self, prefix: &str) -> String {
        match self.path() {
            path if path.is_empty() => prefix.to_owned(),
            path if path.starts_with('[') => format!("{prefix}{path}"),
            path => format!("{prefix}.{path}"),
        }
    }
}

/// Whether a text looks like an API key (it starts with `sk-`).
fn looks_like_api_key(text: &str) -> bool {
    text.starts_with("sk-")
}

/// Whether a key name is one that would hold a secret.
fn is_secret_key(key: &str) -> bool {
    SECRET_KEYS.iter().any(|secret| secret.eq_ignore_ascii_case(key))
}

/// Whether a text names an environment variable: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_env_var_name(text: &str) -> bool {
    let mut bytes = text.bytes();
    bytes.next().is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
}

const NEVER_IN_THE_ROSTER: &str = "API keys never go in the roster: put the key in the worker's environment \
                                   and name that variable with api_key_env (such as `api_key_env: OPENAI_API_KEY`)";

/// Checks an agent's model settings: the secrets rule at any depth, the
/// known keys' types and ranges, and unknown keys (warnings). Findings come
/// in the settings' order; no message repeats a value.
pub fn check_llm_config(settings: &serde_json::Value) -> Vec<LlmConfigFinding> {
    let mut findings = Vec::new();
    let serde_json::Value::Object(entries) = settings else {
        findings.push(finding(Severity::Error, CODE_BAD_VALUE, Vec::new(), Spot::Value, "must be a mapping".into()));
        return findings;
    };
    if entries.get("provider").is_some_and(|provider| !provider.is_null())
        && entries.get("model").is_none_or(serde_json::Value::is_null)
    {
        findings.push(finding(
            Severity::Error,
            CODE_BAD_VALUE,
            vec![PathStep::Key("provider".into())],
            Spot::Key,
            "with a provider, model is required: the name of the model at the endpoint".into(),
        ));
    }
    for (key, value) in entries {
        let steps = vec![PathStep::Key(key.clone())];
        if refuse_secret_key(key, &steps, &mut findings) {
            continue;
        }
        let secrets_before = findings.len();
        find_secret_values(value, &steps, &mut findings);
        if findings.len() > secrets_before {
            continue;
        }
        if KNOWN_KEYS.contains(&key.as_str()) {
            check_known_key(key, value, &steps, &mut findings);
        } else {
            findings.push(finding(
                Severity::Warning,
                CODE_UNKNOWN_KEY,
                steps,
                Spot::Key,
                format!(
                    "the model-driven agent does not read llm_config key {key:?}; it is kept (known keys: {})",
                    KNOWN_KEYS.join(", ")
                ),
            ));
        }
    }
    findings
}

fn finding(
    severity: Severity,
    code: &'static str,
    steps: Vec<PathStep>,
    spot: Spot,
    message: String,
) -> LlmConfigFinding {
    LlmConfigFinding { severity, code, steps, spot, message }
}

/// Refuses a key named like a secret (or one that is itself an API key).
fn refuse_secret_key(key: &str, steps: &[PathStep], findings: &mut Vec<LlmConfigFinding>) -> bool {
    let message = if is_secret_key(key) {
        format!("a key named {:?} would hold a secret: {NEVER_IN_THE_ROSTER}", key.to_lowercase())
    } else if looks_like_api_key(key) {
        format!("this key looks like an API key (it starts with \"sk-\"): {NEVER_IN_THE_ROSTER}")
    } else {
        return false;
    };
    findings.push(finding(Severity::Error, CODE_SECRET, steps.to_vec(), Spot::Key, message));
    true
}

/// Refuses secret keys and API-key-like strings anywhere under `value`.
fn find_secret_values(value: &serde_json::Value, steps: &[PathStep], findings: &mut Vec<LlmConfigFinding>) {
    match value {
        serde_json::Value::String(text) if looks_like_api_key(text) => findings.push(finding(
            Severity::Error,
            CODE_SECRET,
            steps.to_vec(),
            Spot::Value,
            format!("this value looks like an API key (it starts with \"sk-\"): {NEVER_IN_THE_ROSTER}"),
        )),
        serde_json::Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let mut inner = steps.to_vec();
                inner.push(PathStep::Index(index));
                find_secret_values(item, &inner, findings);
            }
        }
        serde_json::Value::Object(entries) => {
            for (key, item) in entries {
                let mut inner = steps.to_vec();
                inner.push(PathStep::Key(key.clone()));
                if !refuse_secret_key(key, &inner, findings) {
                    find_secret_values(item, &inner, findings);
                }
            }
        }
        _ => {}
    }
}

/// What a JSON value is, for messages.
fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "true or false",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

fn check_known_key(key: &str, value: &serde_json::Value, steps: &[PathStep], findings: &mut Vec<LlmConfigFinding>) {
    let problem = match key {
        "provider" => match value.as_str() {
            Some(provider) if PROVIDERS.contains(&provider) => None,
            _ => Some(format!(
                "provider must be openai (any OpenAI-compatible Chat Completions endpoint) or anthropic \
                 (the Messages API), found {}",
                if value.is_string() { "another name" } else { kind(value) }
            )),
        },
        "base_url" => match value.as_str() {
            Some(url) if is_http_url(url) => None,
            _ => Some(format!("base_url must be an http:// or https:// URL, found {}", url_kind(value))),
        },
        "model" => match value.as_str() {
            Some(model) if !model.trim().is_empty() => None,
            _ => Some(format!("model must be a model name, found {}", kind(value))),
        },
        "temperature" => match value.as_f64() {
            Some(temperature) if (0.0..=2.0).contains(&temperature) => None,
            Some(_) => Some("temperature must be from 0 to 2".into()),
            None => Some(format!("temperature must be a number from 0 to 2, found {}", kind(value))),
        },
        "max_tokens" => match value.as_u64() {
            Some(tokens) if tokens >= 1 => None,
            _ => Some(format!("max_tokens must be a whole number of at least 1, found {}", number_kind(value))),
        },
        "timeout_seconds" => match value.as_f64() {
            Some(seconds) if seconds > 0.0 && seconds <= MAX_TIMEOUT_SECONDS => None,
            Some(_) => Some(format!("timeout_seconds must be more than 0 and at most {MAX_TIMEOUT_SECONDS}")),
            None => Some(format!(
                "timeout_seconds must be a number of seconds, more than 0 and at most {MAX_TIMEOUT_SECONDS}, found {}",
                kind(value)
            )),
        },
        "api_key_env" => match value.as_str() {
            Some(name) if is_env_var_name(name) => None,
            _ => Some(format!(
                "api_key_env must name an environment variable ([A-Za-z_][A-Za-z0-9_]*, such as OPENAI_API_KEY), \
                 found {}",
                if value.is_string() { "a string that is not one" } else { kind(value) }
            )),
        },
        _ => {
            check_prices(value, steps, findings);
            None
        }
    };
    if let Some(message) = problem {
        findings.push(finding(Severity::Error, CODE_BAD_VALUE, steps.to_vec(), Spot::Value, message));
    }
}

/// `prices`: `{input_per_million, output_per_million}`, non-negative numbers
/// in US dollars (the unit of budgets' `max_cost`); one left out counts as 0.
fn check_prices(value: &serde_json::Value, steps: &[PathStep], findings: &mut Vec<LlmConfigFinding>) {
    const PRICE_KEYS: [&str; 2] = ["input_per_million", "output_per_million"];
    let serde_json::Value::Object(entries) = value else {
        findings.push(finding(
            Severity::Error,
            CODE_BAD_VALUE,
            steps.to_vec(),
            Spot::Value,
            format!(
                "prices must be a mapping of input_per_million and output_per_million (US dollars), found {}",
                kind(value)
            ),
        ));
        return;
    };
    for (key, price) in entries {
        let mut inner = steps.to_vec();
        inner.push(PathStep::Key(key.clone()));
        if !PRICE_KEYS.contains(&key.as_str()) {
            findings.push(finding(
                Severity::Warning,
                CODE_UNKNOWN_KEY,
                inner,
                Spot::Key,
                format!("prices has no key {key:?}; it is kept (known keys: {})", PRICE_KEYS.join(", ")),
            ));
            continue;
        }
        if !price.as_f64().is_some_and(|price| price.is_finite() && price >= 0.0) {
            findings.push(finding(
                Severity::Error,
                CODE_BAD_VALUE,
                inner,
                Spot::Value,
                format!("prices.{key} must be a number of US dollars, 0 or more, found {}", number_kind(price)),
            ));
        }
    }
}

fn number_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Number(_) => "a number out of range",
        other => kind(other),
    }
}

fn url_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::String(_) => "a string that is not one",
        other => kind(other),
    }
}

/// An `http://` or `https://` URL with a host.
fn is_http_url(url: &str) -> bool {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|rest| {
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !host.is_empty() && !url.chars().any(|character| character.is_whitespace() || character.is_control())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The findings, sorted by path (a JSON object's order depends on
    /// serde_json's features).
    fn summary(settings: serde_json::Value) -> Vec<(String, &'static str, Severity, Spot)> {
        let mut found: Vec<_> = check_llm_config(&settings)
            .into_iter()
            .map(|finding| (finding.path(), finding.code, finding.severity, finding.spot))
            .collect();
        found.sort_by(|left, right| left.0.cmp(&right.0));
        found
    }

    #[test]
    fn the_documented_keys_pass() {
        let settings = json!({
            "provider": "anthropic",
            "base_url": "https://api.anthropic.com",
            "model": "claude-sonnet-4-5",
            "temperature": 0.2,
            "max_tokens": 4096,
            "timeout_seconds": 120,
            "api_key_env": "ANTHROPIC_API_KEY",
            "prices": {"input_per_million": 3.0, "output_per_million": 15}
        });
        assert_eq!(summary(settings), vec![]);
    }

    #[test]
    fn secrets_are_refused_at_any_depth_without_repeating_them() {
        let settings = json!({
            "API_Key": "abc",
            "model": "sk-live-123",
            "headers": {"Authorization": "Bearer xyz", "x-trace": "on"},
            "extra": [{"token": 1}, "sk-nested-456"],
        });
        let secret = |path: &str, spot| (path.to_owned(), CODE_SECRET, Severity::Error, spot);
        assert_eq!(
            summary(settings.clone()),
            vec![
                secret("API_Key", Spot::Key),
                secret("extra[0].token", Spot::Key),
                secret("extra[1]", Spot::Value),
                secret("headers.Authorization", Spot::Key),
                secret("model", Spot::Value),
            ],
            "an unknown key that holds a secret draws the error alone"
        );
        let findings = check_llm_config(&settings);
        for finding in &findings {
            for secret in ["abc", "sk-live-123", "Bearer xyz", "sk-nested-456"] {
                assert!(!finding.message.contains(secret), "{}", finding.message);
            }
            assert!(finding.message.contains("api_key_env"), "{}", finding.message);
        }
        let key_like = check_llm_config(&json!({"sk-abc": 1}));
        assert_eq!(key_like[0].path(), "<redacted>");
    }

    #[test]
    fn wrong_values_are_errors_and_unknown_keys_warnings() {
        let settings = json!({
            "provider": "azure",
            "base_url": "ftp://example.com",
            "model": "",
            "temperature": 2.5,
            "max_tokens": 0,
            "timeout_seconds": 3601,
            "api_key_env": "OPENAI-KEY",
            "prices": {"input_per_million": -1, "per_call": 2},
            "top_p": 0.9,
        });
        let error = |path: &str| (path.to_owned(), CODE_BAD_VALUE, Severity::Error, Spot::Value);
        let warning = |path: &str| (path.to_owned(), CODE_UNKNOWN_KEY, Severity::Warning, Spot::Key);
        assert_eq!(
            summary(settings),
            vec![
                error("api_key_env"),
                error("base_url"),
                error("max_tokens"),
                error("model"),
                error("prices.input_per_million"),
                warning("prices.per_call"),
                error("provider"),
                error("temperature"),
                error("timeout_seconds"),
                warning("top_p"),
            ]
        );
        assert_eq!(summary(json!({"timeout_seconds": 0.5, "max_tokens": 1, "temperature": 0})), vec![]);
        assert_eq!(
            summary(json!({"provider": "openai", "prices": {"output_per_million": 0}})),
            vec![("provider".to_owned(), CODE_BAD_VALUE, Severity::Error, Spot::Key)],
            "a provider needs a model; a price left out is 0"
        );
        assert_eq!(summary(json!("text"))[0].1, CODE_BAD_VALUE);
    }

    #[test]
    fn paths_go_under_a_prefix() {
        let findings = check_llm_config(&json!({"headers": {"key": "x"}}));
        assert_eq!(findings[0].path_under("agent.llm_config"), "agent.llm_config.headers.key");
        assert!(is_env_var_name("_A1") && !is_env_var_name("1A") && !is_env_var_name(""));
    }
}
