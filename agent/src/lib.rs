//! The model-driven agent: a [`muster_worker::Behaviour`] that runs each
//! step with a language model, as the agent's `llm_config` describes it.
//!
//! - Providers ([`provider`]): OpenAI-compatible Chat Completions (OpenAI,
//!   vLLM, Ollama, llama.cpp's server, LM Studio, OpenRouter) and
//!   Anthropic's Messages API, over HTTP with a timeout and bounded retries
//!   that honour `Retry-After`. The key comes from the worker's environment
//!   variable that `llm_config.api_key_env` names, never from the roster.
//! - What the model is told ([`prompt`]): the system prompt the roster
//!   renders for the agent, then the assignment with the contents of the
//!   role's context files from the workspace.
//! - A loop of model calls and tool calls bounded by the agent's
//!   `max_iterations`, whose tools are the role's (through `InvokeTool`),
//!   the workspace's file tools ([`workspace`], confined to the workspace
//!   folder and to the role's `read_paths`/`write_paths`) and the
//!   cluster's own ([`catalogue`]), each acting with the agent's own
//!   credential. The model's answer is the step's output; its usage is the
//!   step's tokens and cost, reported after every call so a budget can stop
//!   a runaway step.
//!
//! It holds no server: `muster agent --workspace DIR` serves it.
#![forbid(unsafe_code)]

pub mod catalogue;
pub mod cluster;
pub mod config;
pub mod prompt;
pub mod provider;
mod step;
#[cfg(feature = "testing")]
pub mod testing;
mod transcript;
pub mod workspace;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use muster_client::balance::Balanced;
use muster_proto::execution::v1::{Assignment, ListToolsRequest, ToolSpec};
use muster_worker::{Behaviour, Step, StepOutcome};

use crate::{catalogue::ToolError, workspace::Workspace};

/// How long the list of registered tools is kept before it is read again.
const TOOLS_KEPT_FOR: Duration = Duration::from_secs(30);

/// What the agent needs besides its assignments.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The workspace folder its file tools act in (made, 0700, when missing).
    pub workspace: PathBuf,
    /// The roster's URL (several replicas comma-separated), for the roster tools.
    pub roster_url: String,
    /// A folder for full transcripts of the model calls; none for no transcripts.
    pub transcripts: Option<PathBuf>,
}

/// Why the agent could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The workspace folder.
    #[error("workspace {path}: {source}")]
    Workspace {
        /// The folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The roster's address.
    #[error("roster: {0}")]
    Roster(String),
    /// The HTTP client.
    #[error("HTTP client: {0}")]
    Http(String),
}

/// The model-driven behaviour. Cheap to share: one per worker.
pub struct ModelAgent {
    workspace: Workspace,
    roster: Balanced,
    http: reqwest::Client,
    transcripts: Option<PathBuf>,
    registered: Mutex<Option<(Instant, Arc<Vec<ToolSpec>>)>>,
}

impl std::fmt::Debug for ModelAgent {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ModelAgent").field("workspace", &self.workspace.path()).finish_non_exhaustive()
    }
}

impl ModelAgent {
    /// The agent of `settings`.
    pub fn new(settings: Settings) -> Result<Self, Error> {
        let workspace = Workspace::open(&settings.workspace)
            .map_err(|source| Error::Workspace { path: settings.workspace.clone(), source })?;
        // The roster's connections, with the TLS settings of the worker's environment.
        let roster = muster_worker::Endpoint::new(settings.roster_url.clone(), String::new())
            .replicas()
            .map_err(|error| Error::Roster(format!("{error:#}")))?;
        Ok(Self {
            workspace,
            roster,
            http: http_client()?,
            transcripts: settings.transcripts,
            registered: Mutex::default(),
        })
    }

    /// Whether an assignment is for a model-driven agent: its `llm_config`
    /// names a provider.
    pub fn serves(assignment: &Assignment) -> bool {
        assignment.llm_config.as_ref().is_some_and(|config| config.fields.contains_key("provider"))
    }

    /// Runs one assignment with the model.
    pub async fn run_step(&self, assignment: Assignment, step: Step) -> StepOutcome {
        match step::StepRun::new(self, &assignment, &step) {
            Ok(run) => run.run().await,
            Err(failure) => failure,
        }
    }

    /// The tools connected workers provide, read at most every [`TOOLS_KEPT_FOR`].
    async fn registered_tools(&self, step: &Step) -> Arc<Vec<ToolSpec>> {
        if let Some((read_at, tools)) = &*self.registered.lock().unwrap_or_else(PoisonError::into_inner)
            && read_at.elapsed() < TOOLS_KEPT_FOR
        {
            return tools.clone();
        }
        let mut execution = step.execution();
        let mut tools = Vec::new();
        let mut page_token = String::new();
        for _ in 0..10 {
            let request = ListToolsRequest { page_size: 1000, page_token: page_token.clone() };
            match execution.list_tools(request).await {
                Ok(page) => {
                    let page = page.into_inner();
                    tools.extend(page.tools);
                    page_token = page.next_page_token;
                    if page_token.is_empty() {
                        break;
                    }
                }
                Err(status) => {
                    tracing::warn!(error = %status.message(), "listing the registered tools failed");
                    break;
                }
            }
        }
        let tools = Arc::new(tools);
        *self.registered.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), tools.clone()));
        tools
    }

    /// A roster client with the step's agent's credential.
    fn roster(
        &self,
        step: &Step,
    ) -> Result<
        muster_proto::roster::v1::roster_service_client::RosterServiceClient<muster_client::auth::AuthChannel>,
        ToolError,
    > {
        step::roster_client(&self.roster, step.agent_token())
    }
}

impl Behaviour for ModelAgent {
    async fn run(&self, assignment: Assignment, step: Step) -> StepOutcome {
        self.run_step(assignment, step).await
    }
}

/// The HTTP client of the model calls: rustls on ring, the system's roots.
pub fn http_client() -> Result<reqwest::Client, Error> {
    use rustls_platform_verifier::BuilderVerifierExt as _;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| Error::Http(error.to_string()))?
        .with_platform_verifier()
        .map_err(|error| Error::Http(error.to_string()))?
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|error| Error::Http(error.to_string()))
}

/// A message of the contract as JSON (the canonical mapping, default values
/// left out), as the cluster's tools answer with it (here and over MCP).
pub fn wire_json(message: &impl prost::Message, full_name: &str) -> serde_json::Value {
    muster_client::json::message_to_json(message, full_name, false).unwrap_or_default()
}
