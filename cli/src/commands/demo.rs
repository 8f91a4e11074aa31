//! `muster demo`: the main job on the embedded default. Starts the cluster on
//! SQLite, imports the sample roster, serves its agents with the sample
//! behaviour (or, given a model endpoint, with that model), runs the sample
//! process, and says where the informed agents' NDJSON memory is; with
//! `--stay`, keeps everything up afterwards for a look in the console.

use std::{path::PathBuf, sync::Arc};

use muster::{agents::Agents, worker};
use muster_proto::roster::v1::{RotateTokenRequest, UpdateAgentRequest, roster_service_client::RosterServiceClient};

use super::{
    run::{ReconnectArgs, RunArgs},
    up::UpArgs,
};

/// `muster demo`
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    #[command(flatten)]
    up: UpArgs,
    /// The roster to import.
    #[arg(long, default_value = "examples/roster.yaml")]
    roster: PathBuf,
    /// The process to run.
    #[arg(long, default_value = "examples/process.yaml")]
    process: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    /// After the run, keep the cluster and the sample agents up until
    /// Ctrl-C, to look at the run in the console.
    #[arg(long)]
    stay: bool,
}

/// A model endpoint for every sample agent (docs/agents.md); none keeps the
/// deterministic sample behaviour.
#[derive(Debug, clap::Args)]
struct ModelArgs {
    /// The endpoint's API root, such as `http://127.0.0.1:11434/v1` for Ollama.
    #[arg(long = "model-url", env = "MUSTER_MODEL_URL")]
    url: Option<String>,
    /// The model's name at the endpoint.
    #[arg(long = "model", env = "MUSTER_MODEL", requires = "url")]
    name: Option<String>,
    /// The API the endpoint speaks.
    #[arg(long = "provider", env = "MUSTER_MODEL_PROVIDER", default_value = "openai", value_parser = ["openai", "anthropic"])]
    provider: String,
    /// The environment variable holding the endpoint's key (its name, not the key).
    #[arg(long = "api-key-env", env = "MUSTER_MODEL_API_KEY_ENV")]
    api_key_env: Option<String>,
}

impl ModelArgs {
    /// The `llm_config` every sample agent gets; none without an endpoint.
    fn llm_config(&self) -> anyhow::Result<Option<serde_json::Value>> {
        let Some(url) = &self.url else { return Ok(None) };
        let Some(model) = &self.name else {
            anyhow::bail!("--model-url needs --model (the model's name at the endpoint)")
        };
        let mut config = serde_json::json!({"provider": self.provider, "base_url": url, "model": model});
        if let Some(variable) = &self.api_key_env {
            config["api_key_env"] = variable.clone().into();
        }
        // The same checks as a roster's `llm_config`.
        muster_agent::config::LlmConfig::from_json(&config).map_err(|problem| anyhow::anyhow!(problem))?;
        Ok(Some(config))
    }
}

pub(crate) async fn run(args: DemoArgs, name: &str) -> anyhow::Result<bool> {
    let cluster = super::up::start(&args.up, name).await?;
    let outcome = demo(&args, &cluster).await;
    cluster.shutdown().await?;
    let completed = outcome?;
    Ok(completed)
}

async fn demo(args: &DemoArgs, cluster: &muster::cluster::Cluster) -> anyhow::Result<bool> {
    let roster_endpoint = cluster.as_operator("roster");
    let mut roster = RosterServiceClient::new(roster_endpoint.channel()?);
    let issued = super::roster::import(&mut roster, std::slice::from_ref(&args.roster)).await?;
    // The sample agents' tokens live in the data folder, so the demo runs
    // again on the same data: an agent whose token is not there gets a new one.
    let tokens_file = args.up.data_dir.join("tokens.json");
    let mut tokens = super::roster::merge_tokens(&tokens_file, issued)?;
    let mut rotated = serde_json::Map::new();
    for agent in super::roster::list_all(&mut roster).await? {
        if !tokens.contains_key(&agent.id) {
            let token = roster
                .rotate_token(RotateTokenRequest { agent_id: agent.id.clone() })
                .await
                .map_err(super::refused)?
                .into_inner()
                .token;
            rotated.insert(agent.id, serde_json::Value::String(token));
        }
    }
    if !rotated.is_empty() {
        println!("new tokens for {} agents whose tokens were not in {}", rotated.len(), tokens_file.display());
        tokens = super::roster::merge_tokens(&tokens_file, rotated)?;
    }
    let agents = super::roster::list_all(&mut roster).await?;
    if let Some(config) = args.model.llm_config()? {
        let llm_config =
            muster_runtime::json::struct_from_text(&config.to_string()).map_err(|problem| anyhow::anyhow!(problem))?;
        for mut agent in agents {
            agent.llm_config = llm_config.clone();
            let update_mask = Some(prost_types::FieldMask { paths: vec!["llm_config".to_owned()] });
            roster
                .update_agent(UpdateAgentRequest { agent: Some(agent), update_mask })
                .await
                .map_err(super::refused)?;
        }
        println!("the sample agents are model-driven: {config}");
    }
    let credentials = super::agent::credentials(&tokens, &[])?;
    let settings = muster_agent::Settings {
        workspace: args.up.data_dir.join("workspace"),
        roster_url: cluster.roster_url(),
        transcripts: None,
    };
    let behaviour = Agents::new(muster_agent::ModelAgent::new(settings)?);
    let (stop_sender, stop_receiver) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker::serve(
        cluster.as_operator("execution"),
        "muster-demo-agents".to_owned(),
        credentials,
        Arc::new(behaviour),
        async move {
            let _ = stop_receiver.await;
        },
    ));
    let completed = super::run::run(
        &RunArgs {
            file: args.process.clone(),
            execution: cluster.execution_url(),
            inputs: "{}".to_owned(),
            reconnect: ReconnectArgs::default(),
            detach: false,
        },
        Some(&cluster.credentials.operator_token),
    )
    .await;
    let finished = completed?;
    if !finished.lead_agent_id.is_empty() {
        // The lead hears of every event: once the last one reached its inbox,
        // the NDJSON files are complete.
        muster::inbox::wait_for_event(
            &cluster.as_operator("notifier"),
            &finished.lead_agent_id,
            &finished.event_id,
            std::time::Duration::from_secs(30),
        )
        .await?;
    }

    let memory = cluster.memory_dir();
    println!(
        "\nthe agents' NDJSON memory (one line per notification, for the informed agents, monitors and the lead) is under {}:",
        memory.display()
    );
    let mut files = Vec::new();
    collect_ndjson(&memory, &mut files);
    files.sort();
    for file in files {
        let lines = std::fs::read_to_string(&file).map(|text| text.lines().count()).unwrap_or(0);
        println!("  {} ({lines} lines)", file.display());
    }
    if args.stay
        && let Some(url) = cluster.console_url()
    {
        println!(
            "\nthe cluster and the sample agents stay up: open {url}/ and sign in with the token in {} (an agent's, from {}, works too); Ctrl-C stops them",
            args.up.data_dir.join(muster::credentials::OPERATOR_TOKEN_FILE).display(),
            tokens_file.display()
        );
        muster_runtime::shutdown::signal().await;
    }
    // Dropped on an early return, the sender stops the agents just the same.
    let _ = stop_sender.send(());
    let _ = worker.await;
    Ok(super::run::completed(&finished))
}

fn collect_ndjson(dir: &std::path::Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_ndjson(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "ndjson") {
            files.push(path);
        }
    }
}
