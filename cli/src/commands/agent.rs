//! `muster agent`: a sample worker serving agents with the deterministic behaviour.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use muster::{
    sample::SampleBehaviour,
    worker::{self, AgentCredential},
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

pub(crate) async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.tokens_file)
        .with_context(|| format!("reading {}", args.tokens_file.display()))?;
    let tokens: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object", args.tokens_file.display()))?;
    let credentials = credentials(&tokens, &args.agents)?;
    println!("serving {} agents; Ctrl-C to stop", credentials.len());
    worker::serve(
        args.execution,
        format!("muster-agent-{}", std::process::id()),
        credentials,
        Arc::new(SampleBehaviour),
        muster_runtime::shutdown::signal(),
    )
    .await
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
