//! `muster roster`: import a roster, list agents, show the organisation as
//! an agent sees it (through the roster's filters), set an agent's status.

use std::path::{Path, PathBuf};

use anyhow::Context;
use muster_proto::roster::v1::{
    Agent, AgentStatus, GetOrganizationRosterRequest, ImportFile, ImportRosterRequest, ListAgentsRequest,
    ListAgentsResponse, RosterFilter, SetAgentStatusRequest, roster_service_client::RosterServiceClient,
};
use muster_runtime::auth::client::AuthChannel;

/// `muster roster ...`
#[derive(Debug, clap::Args)]
pub(crate) struct RosterArgs {
    /// The roster service.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value_t = muster::context::default_url(muster::context::Service::Roster), global = true)]
    roster: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: RosterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RosterCommand {
    /// Imports roster and role files (YAML, Markdown). Agents it creates get
    /// a token; agents that exist keep theirs (`muster token rotate AGENT`
    /// issues a new one).
    Import {
        /// The files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Adds the new agents' tokens to this JSON file (agent id to token,
        /// for `muster agent`), written readable by its owner only.
        #[arg(long)]
        tokens_file: Option<PathBuf>,
    },
    /// Lists the agents, with their status and workload.
    List,
    /// The organisation as an agent sees it: the agent, then the colleagues
    /// that pass the filter, each with status and workload.
    Show {
        /// Whose view: the asking agent (an agent may ask only for itself).
        #[arg(long)]
        agent: String,
        /// Which colleagues.
        #[arg(long, value_enum, default_value = "all")]
        filter: Filter,
        /// The expertise tag, with `--filter by-expertise`.
        #[arg(long, required_if_eq("filter", "by-expertise"))]
        expertise: Option<String>,
    },
    /// Sets an agent's status by hand: `offline` (never delegated to),
    /// `busy`, or `auto` (derived from its workload again).
    Status {
        /// The agent.
        agent: String,
        /// The status.
        #[arg(value_enum)]
        status: StatusChoice,
    },
}

/// The roster's filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Filter {
    /// Everyone.
    All,
    /// The agent's team.
    MyTeam,
    /// Agents not offline and below capacity.
    Available,
    /// Agents with the expertise given.
    ByExpertise,
}

/// A status set by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StatusChoice {
    /// Never delegated to.
    Offline,
    /// At or near capacity.
    Busy,
    /// Derived from the workload again.
    Auto,
}

type Client = RosterServiceClient<AuthChannel>;

pub(crate) async fn run(args: RosterArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = RosterServiceClient::new(super::endpoint(&args.roster, token)?.channel()?);
    match args.command {
        RosterCommand::Import { files, tokens_file } => {
            let issued = import(&mut client, &files).await?;
            match tokens_file {
                Some(path) => {
                    let tokens = merge_tokens(&path, issued)?;
                    println!("{} agent tokens in {}", tokens.len(), path.display());
                }
                None if !issued.is_empty() => {
                    println!("tokens issued (shown once; --tokens-file keeps them):");
                    for (agent_id, token) in &issued {
                        println!("  {agent_id:<24} {}", token.as_str().unwrap_or_default());
                    }
                }
                None => {}
            }
        }
        RosterCommand::List => {
            let agents = list_all(&mut client).await?;
            if args.output == super::output::Output::Json {
                let all = ListAgentsResponse { agents, next_page_token: String::new() };
                println!("{}", super::output::to_json(&all, "muster.roster.v1.ListAgentsResponse")?);
                return Ok(());
            }
            if agents.is_empty() {
                println!("(no agents)");
            }
            for agent in &agents {
                print_agent(agent);
            }
        }
        RosterCommand::Show { agent, filter, expertise } => {
            let filter = match filter {
                Filter::All => RosterFilter::All,
                Filter::MyTeam => RosterFilter::MyTeam,
                Filter::Available => RosterFilter::Available,
                Filter::ByExpertise => RosterFilter::ByExpertise,
            };
            let request = GetOrganizationRosterRequest {
                agent_id: agent,
                filter: filter as i32,
                expertise: expertise.unwrap_or_default(),
            };
            let view = client.get_organization_roster(request).await.map_err(super::refused)?.into_inner();
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&view, "muster.roster.v1.GetOrganizationRosterResponse")?);
                return Ok(());
            }
            if let Some(me) = &view.agent_context {
                print!("you: ");
                print_agent(me);
            }
            if view.colleagues.is_empty() {
                println!("no colleague passes the filter");
            }
            for colleague in &view.colleagues {
                print_agent(colleague);
            }
        }
        RosterCommand::Status { agent, status } => {
            let status = match status {
                StatusChoice::Offline => AgentStatus::Offline,
                StatusChoice::Busy => AgentStatus::Busy,
                StatusChoice::Auto => AgentStatus::Unspecified,
            };
            let request = SetAgentStatusRequest { id: agent, status: status as i32, availability_until: None };
            let agent = client.set_agent_status(request).await.map_err(super::refused)?.into_inner().agent;
            if let Some(agent) = agent {
                print_agent(&agent);
            }
        }
    }
    Ok(())
}

/// One agent on a line: id, status, workload, role, team, expertise.
fn print_agent(agent: &Agent) {
    println!(
        "{:<24} {:<8} {:>3}/{:<3} {:<16} {:<12} {}",
        agent.id,
        status_name(agent.status),
        agent.current_workload,
        agent.workload_capacity,
        agent.role,
        agent.team,
        agent.expertise.join(",")
    );
}

/// A status as the roster's documents write it.
fn status_name(status: i32) -> &'static str {
    match AgentStatus::try_from(status) {
        Ok(AgentStatus::Idle) => "IDLE",
        Ok(AgentStatus::Active) => "ACTIVE",
        Ok(AgentStatus::Busy) => "BUSY",
        Ok(AgentStatus::Offline) => "OFFLINE",
        _ => "-",
    }
}

/// Every agent of the roster, page by page.
pub(crate) async fn list_all(client: &mut Client) -> anyhow::Result<Vec<Agent>> {
    let mut agents = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_agents(ListAgentsRequest { page_token, ..Default::default() })
            .await
            .map_err(super::refused)?
            .into_inner();
        agents.extend(page.agents);
        if page.next_page_token.is_empty() {
            return Ok(agents);
        }
        page_token = page.next_page_token;
    }
}

/// Imports files; returns the tokens issued to the agents the import created.
pub(crate) async fn import(
    client: &mut Client,
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
        .map_err(super::refused)
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
    let kept = (response.agents_imported as usize).saturating_sub(response.issued_tokens.len());
    println!(
        "imported {} agents ({} new, {kept} kept their tokens), {} teams, {} roles",
        response.agents_imported,
        response.issued_tokens.len(),
        response.teams_imported,
        response.roles_imported
    );
    Ok(response
        .issued_tokens
        .into_iter()
        .map(|issued| (issued.agent_id, serde_json::Value::String(issued.token)))
        .collect())
}

/// Adds `issued` to the tokens file at `path` (keeping the tokens it held),
/// written with mode 0600; returns the whole set.
pub(crate) fn merge_tokens(
    path: &Path,
    issued: serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut tokens = read_tokens(path)?;
    tokens.extend(issued);
    muster_runtime::files::write_private(path, serde_json::to_string_pretty(&tokens)?.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(tokens)
}

/// The tokens file at `path`; empty when it does not exist.
pub(crate) fn read_tokens(path: &Path) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Map::new()),
        Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
    }
}
