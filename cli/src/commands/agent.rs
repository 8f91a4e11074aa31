//! `muster agent`: a sample worker serving agents with the deterministic behaviour.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use muster::{
    credentials::Endpoint,
    sample::SampleBehaviour,
    worker::{self, AgentCredential, WithoutTools},
};

/// `muster agent`
#[derive(Debug, clap::Args)]
pub(crate) struct AgentArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051")]
    execution: String,
    /// JSON file of agent ids to tokens, as written by `muster roster import --tokens-file`.
    #[arg(long)]
    tokens_file: PathBuf,
    /// Serve only these agents (default: every agent of the tokens file).
    #[arg(long = "serve")]
    agents: Vec<String>,
}

/// Serves the agents of the tokens file. The connection is made with the
/// command's credential (an operator's token lets the worker provide the
/// sample tools); without one, with the first served agent's own token, and
/// the worker provides no tools.
pub(crate) async fn run(args: AgentArgs, token: Option<&str>) -> anyhow::Result<()> {
    if !args.tokens_file.exists() {
        anyhow::bail!("{} does not exist: `muster roster import --tokens-file` writes it", args.tokens_file.display());
    }
    let tokens = super::roster::read_tokens(&args.tokens_file)?;
    let credentials = credentials(&tokens, &args.agents)?;
    let name = format!("muster-agent-{}", std::process::id());
    let shutdown = muster_runtime::shutdown::signal();
    println!("serving {} agents; Ctrl-C to stop", credentials.len());
    match muster::credentials::resolve(token) {
        Ok(token) => {
            let execution = Endpoint::new(args.execution, token);
            worker::serve(execution, name, credentials, Arc::new(SampleBehaviour), shutdown).await
        }
        Err(_) => {
            let token =
                credentials.first().map(|agent| agent.token.clone()).context("the tokens file names no agent")?;
            println!("(no operator credential: serving without the sample tools)");
            let execution = Endpoint::new(args.execution, token);
            worker::serve(execution, name, credentials, Arc::new(WithoutTools(SampleBehaviour)), shutdown).await
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
