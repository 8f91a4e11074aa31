//! An agent's model settings, read from the `llm_config` its assignment
//! carries (the roster's `llm_config`), checked by the format library's one
//! set of rules, as the roster checks them. The key itself is never among
//! them: `api_key_env` names the environment variable of the worker that
//! holds it.

use std::{fmt, time::Duration};

use muster_format::{Severity, roster::llm_config::check_llm_config};
use serde_json::Value;

/// Which API the endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM,
    /// Ollama, llama.cpp's server, LM Studio, OpenRouter, ...).
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

impl ProviderKind {
    /// The name `llm_config.provider` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com",
        }
    }
}

/// What a million tokens cost, in the unit of budgets' `max_cost`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    /// Per million input (prompt) tokens.
    pub input_per_million: f64,
    /// Per million output (completion) tokens.
    pub output_per_million: f64,
}

/// Tokens one model call used, as the endpoint reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the request.
    pub input_tokens: u64,
    /// Tokens of the answer.
    pub output_tokens: u64,
}

impl Usage {
    /// Input and output together.
    pub fn total(self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// The model settings of one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The API.
    pub provider: ProviderKind,
    /// Where it is served: the OpenAI API's `/v1` root, or Anthropic's root.
    pub base_url: String,
    /// The model's name at the endpoint.
    pub model: String,
    /// Sampling temperature, when set.
    pub temperature: Option<f64>,
    /// Most tokens of one answer, when set (Anthropic requires one: 4096
    /// when unset).
    pub max_tokens: Option<u64>,
    /// How long one HTTP call may take.
    pub timeout: Duration,
    /// The name of the environment variable that holds the key; none for
    /// endpoints without one (a local Ollama).
    pub api_key_env: Option<String>,
    /// What tokens cost; none makes every step's cost 0.
    pub prices: Option<Prices>,
}

/// The timeout of a model call when `timeout_seconds` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where keys are read: the worker's environment, or (for tests and
/// embedders) a fixed set of variables.
#[derive(Clone, Default)]
pub enum Keys {
    /// The process's environment variables.
    #[default]
    Environment,
    /// These variables only.
    Fixed(std::sync::Arc<std::collections::HashMap<String, String>>),
}

impl Keys {
    /// A fixed set of variables.
    pub fn fixed(variables: impl IntoIterator<Item = (String, String)>) -> Self {
        Self::Fixed(std::sync::Arc::new(variables.into_iter().collect()))
    }

    fn get(&self, name: &str) -> Option<String> {
        match self {
            Self::Environment => std::env::var(name).ok(),
            Self::Fixed(variables) => variables.get(name).cloned(),
        }
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Environment => formatter.write_str("Keys::Environment"),
            Self::Fixed(variables) => write!(formatter, "Keys::Fixed({} variables)", variables.len()),
        }
    }
}

/// A key read from the environment; it never prints.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key itself, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("ApiKey(..)")
    }
}

impl LlmConfig {
    /// The settings an `llm_config` object gives; `Ok(None)` when it names
    /// no provider (the agent is not model-driven). The settings are checked
    /// by the same rules as a roster's (`muster_format`'s
    /// `check_llm_config`): the first error is refused, naming the key.
    pub fn from_json(config: &Value) -> Result<Option<Self>, String> {
        let Some(entries) = config.as_object() else { return Ok(None) };
        if entries.get("provider").is_none_or(Value::is_null) {
            return Ok(None);
        }
        if let Some(error) = check_llm_config(config).into_iter().find(|finding| finding.severity == Severity::Error) {
            return Err(format!("{}: {}", error.path_under("llm_config"), error.message));
        }
        // Checked above: each value present is of its kind and in range.
        let provider = if entries["provider"] == "anthropic" { ProviderKind::Anthropic } else { ProviderKind::OpenAi };
        let text = |key: &str| entries.get(key).and_then(Value::as_str).map(|text| text.trim().to_owned());
        let number = |key: &str| entries.get(key).and_then(Value::as_f64);
        let price = |key: &str| entries.get("prices").and_then(|prices| prices.get(key)).and_then(Value::as_f64);
        Ok(Some(Self {
            provider,
            base_url: text("base_url")
                .unwrap_or_else(|| provider.default_base_url().to_owned())
                .trim_end_matches('/')
                .to_owned(),
            model: text("model").unwrap_or_default(),
            temperature: number("temperature"),
            max_tokens: entries.get("max_tokens").and_then(Value::as_u64),
            timeout: number("timeout_seconds").map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64),
            api_key_env: text("api_key_env"),
            prices: entries.get("prices").map(|_| Prices {
                input_per_million: price("input_per_million").unwrap_or(0.0),
                output_per_million: price("output_per_million").unwrap_or(0.0),
            }),
        }))
    }

    /// The key from the worker's environment (`keys`): none when no
    /// variable is named; an error naming the variable (never a value) when
    /// it is unset.
    pub fn api_key(&self, keys: &Keys) -> Result<Option<ApiKey>, String> {
        let Some(name) = &self.api_key_env else { return Ok(None) };
        match keys.get(name) {
            Some(key) if !key.trim().is_empty() => Ok(Some(ApiKey(key.trim().to_owned()))),
            _ => Err(format!(
                "the environment variable {name} (llm_config.api_key_env) is not set in the worker's environment"
            )),
        }
    }

    /// What `usage` costs at the configured prices.
    pub fn cost(&self, usage: Usage) -> f64 {
        self.prices.map_or(0.0, |prices| {
            (usage.input_tokens as f64 * prices.input_per_million
                + usage.output_tokens as f64 * prices.output_per_million)
                / 1_000_000.0
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_agent_without_a_provider_is_not_model_driven() {
        assert_eq!(LlmConfig::from_json(&json!({"model": "x"})).unwrap(), None);
        assert_eq!(LlmConfig::from_json(&Value::Null).unwrap(), None);
    }

    #[test]
    fn settings_are_read_with_their_defaults() {
        let config = LlmConfig::from_json(&json!({"provider": "anthropic", "model": "claude"})).unwrap().unwrap();
        assert_eq!(config.base_url, "https://api.anthropic.com");
        assert_eq!(config.timeout, DEFAULT_TIMEOUT);
        let config = LlmConfig::from_json(&json!({
            "provider": "openai", "model": "m", "base_url": "http://localhost:11434/v1/",
            "temperature": 0.2, "max_tokens": 100, "timeout_seconds": 0.5, "api_key_env": "MY_KEY",
            "prices": {"input_per_million": 2.0, "output_per_million": 8.0}
        }))
        .unwrap()
        .unwrap();
        assert_eq!(config.base_url, "http://localhost:11434/v1");
        assert_eq!(config.timeout, Duration::from_millis(500));
        assert_eq!(config.cost(Usage { input_tokens: 1_000_000, output_tokens: 500_000 }), 6.0);
    }

    #[test]
    fn wrong_values_are_named() {
        for (config, named) in [
            (json!({"provider": "gemini", "model": "m"}), "provider"),
            (json!({"provider": "openai"}), "model"),
            (json!({"provider": "openai", "model": "m", "base_url": "ftp://x"}), "base_url"),
            (json!({"provider": "openai", "model": "m", "api_key_env": "sk-abc"}), "api_key_env"),
            (json!({"provider": "openai", "model": "m", "timeout_seconds": 0}), "timeout_seconds"),
            (json!({"provider": "openai", "model": "m", "prices": {"input_per_million": -1}}), "prices"),
        ] {
            let error = LlmConfig::from_json(&config).unwrap_err();
            assert!(error.contains(named), "{error}");
        }
    }

    #[test]
    fn a_missing_key_names_its_variable_and_a_key_never_prints() {
        let config = LlmConfig::from_json(
            &json!({"provider": "openai", "model": "m", "api_key_env": "MUSTER_AGENT_TEST_UNSET_KEY"}),
        )
        .unwrap()
        .unwrap();
        assert!(config.api_key(&Keys::Environment).unwrap_err().contains("MUSTER_AGENT_TEST_UNSET_KEY"));
        let keys = Keys::fixed([("MUSTER_AGENT_TEST_UNSET_KEY".to_owned(), " secret ".to_owned())]);
        assert_eq!(config.api_key(&keys).unwrap().unwrap().expose(), "secret");
        assert_eq!(format!("{keys:?}"), "Keys::Fixed(1 variables)");
        assert_eq!(format!("{:?}", ApiKey("secret".to_owned())), "ApiKey(..)");
    }
}
