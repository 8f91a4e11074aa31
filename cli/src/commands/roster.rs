//! `muster roster`: import a roster, list agents.

use std::path::PathBuf;

use anyhow::Context;
use muster_proto::roster::v1::{
    ImportFile, ImportRosterRequest, ListAgentsRequest, RotateTokenRequest, roster_service_client::RosterServiceClient,
};
use tonic::transport::Channel;

/// `muster roster ...`
#[derive(Debug, clap::Args)]
pub(crate) struct RosterArgs {
    /// The roster service.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value = "http://127.0.0.1:50052", global = true)]
    roster: String,
    #[command(subcommand)]
    command: RosterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RosterCommand {
    /// Imports roster and role files (YAML, Markdown); prints the tokens issued.
    Import {
        /// The files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Writes the agents' tokens here (JSON: agent id to token), for `muster agent`.
        /// Agents that already had a token get a new one.
        #[arg(long)]
        tokens_file: Option<PathBuf>,
    },
    /// Lists the agents.
    List,
}

pub(crate) async fn run(args: RosterArgs) -> anyhow::Result<()> {
    let mut client = RosterServiceClient::connect(args.roster.clone())
        .await
        .with_context(|| format!("connecting to the roster at {}", args.roster))?;
    match args.command {
        RosterCommand::Import { files, tokens_file } => {
            let tokens = import(&mut client, &files).await?;
            if let Some(path) = tokens_file {
                std::fs::write(&path, serde_json::to_string_pretty(&tokens)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("tokens of {} agents written to {}", tokens.len(), path.display());
            }
        }
        RosterCommand::List => {
            let agents = client.list_agents(ListAgentsRequest::default()).await?.into_inner().agents;
            for agent in agents {
                println!(
                    "{:<24} {:<16} {:<12} {}/{}  {}",
                    agent.id,
                    agent.role,
                    agent.team,
                    agent.current_workload,
                    agent.workload_capacity,
                    agent.expertise.join(",")
                );
            }
        }
    }
    Ok(())
}

/// Imports files and returns a token for every agent of the roster: the ones
/// issued by the import, and new ones for agents that already existed.
pub(crate) async fn import(
    client: &mut RosterServiceClient<Channel>,
    files: &[PathBuf],
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut import_files = Vec::new();
    for path in files {
        let content = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        import_files.push(ImportFile { name: path.display().to_string(), content });
    }
    let response = client
        .import_roster(ImportRosterRequest { files: import_files, dry_run: false })
        .await
        .context("importing the roster")?
        .into_inner();
    let mut refused = false;
    for finding in &response.diagnostics {
        if let Some(diagnostic) = &finding.diagnostic {
            let severity = if diagnostic.severity == 1 { "error" } else { "warning" };
            refused |= diagnostic.severity == 1;
            println!(
                "{}:{}:{}: {severity}[{}]: {}",
                finding.file_name, diagnostic.line, diagnostic.column, diagnostic.code, diagnostic.message
            );
        }
    }
    if refused {
        anyhow::bail!("the roster was refused; nothing was imported");
    }
    println!(
        "imported {} agents, {} teams, {} roles",
        response.agents_imported, response.teams_imported, response.roles_imported
    );
    let mut tokens: serde_json::Map<String, serde_json::Value> = response
        .issued_tokens
        .into_iter()
        .map(|issued| (issued.agent_id, serde_json::Value::String(issued.token)))
        .collect();
    let agents = client.list_agents(ListAgentsRequest::default()).await?.into_inner().agents;
    for agent in agents {
        if !tokens.contains_key(&agent.id) {
            let token =
                client.rotate_token(RotateTokenRequest { agent_id: agent.id.clone() }).await?.into_inner().token;
            tokens.insert(agent.id, serde_json::Value::String(token));
        }
    }
    Ok(tokens)
}
