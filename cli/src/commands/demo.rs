//! `muster demo`: the main job on the embedded default. Starts the cluster on
//! SQLite, imports the sample roster, serves its agents with the sample
//! behaviour, runs the sample process, and says where the informed agents'
//! NDJSON memory is.

use std::{path::PathBuf, sync::Arc};

use muster::{sample::SampleBehaviour, worker};
use muster_proto::roster::v1::{RotateTokenRequest, roster_service_client::RosterServiceClient};

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
}

pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<bool> {
    let cluster = super::up::start(&args.up).await?;
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
    let credentials = super::agent::credentials(&tokens, &[])?;
    let (stop_sender, stop_receiver) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker::serve(
        cluster.as_operator("execution"),
        "muster-demo-agents".to_owned(),
        credentials,
        Arc::new(SampleBehaviour),
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
    let _ = stop_sender.send(());
    let _ = worker.await;
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
