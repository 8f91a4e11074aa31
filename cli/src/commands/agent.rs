//! `muster agent`: a worker serving the agents of a tokens file: those whose
//! `llm_config` names a provider with their model (docs/agents.md), the
//! others with the deterministic sample behaviour.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use muster::{
    agents::Agents,
    credentials::Endpoint,
    worker::{self, AgentCredential, Notice, WithoutTools},
};

/// `muster agent`
#[derive(Debug, clap::Args)]
pub(crate) struct AgentArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
    /// JSON file of agent ids to tokens, as written by `muster roster import --tokens-file`.
    #[arg(long)]
    tokens_file: PathBuf,
    /// Serve only these agents (default: every agent of the tokens file).
    #[arg(long = "serve")]
    agents: Vec<String>,
    /// The roster, for the model-driven agents' roster tools.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value_t = muster::context::default_url(muster::context::Service::Roster))]
    roster: String,
    /// The folder the model-driven agents' file tools act in (default:
    /// `workspace/` in the data folder).
    #[arg(long, env = "MUSTER_WORKSPACE")]
    workspace: Option<PathBuf>,
    /// A folder for full transcripts of the model calls (none by default).
    #[arg(long)]
    transcripts: Option<PathBuf>,
    /// The most steps this worker runs at once, over all its agents (each
    /// agent's capacity in the roster bounds its own share).
    #[arg(long, env = "MUSTER_AGENT_MAX_CONCURRENCY", default_value_t = muster::worker::DEFAULT_MAX_CONCURRENCY,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_concurrency: u32,
}

impl AgentArgs {
    /// The model-driven behaviour beside the sample one.
    pub(crate) fn agents(&self) -> anyhow::Result<Agents> {
        let workspace =
            self.workspace.clone().unwrap_or_else(|| muster::credentials::default_data_dir().join("workspace"));
        let settings = muster_agent::Settings {
            workspace,
            roster_url: self.roster.clone(),
            transcripts: self.transcripts.clone(),
        };
        Ok(Agents::new(muster_agent::ModelAgent::new(settings)?).with_max_concurrency(self.max_concurrency))
    }
}

/// Serves the agents of the tokens file. The connection is made with the
/// command's credential (an operator's token lets the worker provide the
/// sample tools); without one, with the first served agent's own token, and
/// the worker provides no tools. An agent whose token the service refuses
/// (rotated, revoked) is reported and left out; the others go on being
/// served, and the command fails only when no agent is left.
pub(crate) async fn run(args: AgentArgs, token: Option<&str>) -> anyhow::Result<()> {
    if !args.tokens_file.exists() {
        anyhow::bail!("{} does not exist: `muster roster import --tokens-file` writes it", args.tokens_file.display());
    }
    let tokens = super::roster::read_tokens(&args.tokens_file)?;
    let credentials = credentials(&tokens, &args.agents)?;
    let agents = args.agents()?;
    let name = format!("muster-agent-{}", std::process::id());
    let shutdown = muster_runtime::shutdown::signal();
    println!("serving {} agents; Ctrl-C to stop", credentials.len());
    let tokens_file = args.tokens_file.display().to_string();
    let report = move |notice: Notice| match notice {
        Notice::Connected { agents, .. } => println!("connected: serving {}", agents.join(", ")),
        Notice::AgentRefused { agent_id, reason } => eprintln!(
            "agent {agent_id} is not served: the execution service refused its token ({reason}); \
             if it was rotated, put the new one in {tokens_file} and restart `muster agent`"
        ),
    };
    match muster::credentials::resolve(token) {
        Ok(token) => {
            let execution = Endpoint::new(args.execution, token);
            worker::serve_reporting(execution, name, credentials, Arc::new(agents), report, shutdown).await
        }
        Err(_) => {
            let token =
                credentials.first().map(|agent| agent.token.clone()).context("the tokens file names no agent")?;
            println!("(no operator credential: serving without the sample tools)");
            let execution = Endpoint::new(args.execution, token);
            let behaviour = Arc::new(WithoutTools(agents));
            worker::serve_reporting(execution, name, credentials, behaviour, report, shutdown).await
        }
    }
}

pub(crate) fn credentials(
    tokens: &serde_json::Map<String, serde_json::Value>,
    only: &[String],
) -> anyhow::Result<Vec<AgentCredential>> {
    let mut credentials = Vec::new();
    for (agent_id, token) in tokens {
        if !only.is_empty() && !only.contains(agent_id) {
            continue;
        }
        let token = token.as_str().with_context(|| format!("the token of {agent_id} is not a string"))?;
        credentials.push(AgentCredential { agent_id: agent_id.clone(), token: token.to_owned() });
    }
    if let Some(missing) = only.iter().find(|agent| !tokens.contains_key(*agent)) {
        anyhow::bail!("no token for agent '{missing}'");
    }
    Ok(credentials)
}
