//! `muster demo`: the main job on the embedded default. Starts the cluster on
//! SQLite, imports the sample roster, serves its agents with the sample
//! behaviour, runs the sample process, and says where the informed agents'
//! NDJSON memory is.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use muster::{sample::SampleBehaviour, worker};
use muster_proto::{
    common::v1::StepEvent,
    notifier::v1::{ListNotificationsRequest, notifier_service_client::NotifierServiceClient},
    roster::v1::roster_service_client::RosterServiceClient,
};

use super::{run::RunArgs, up::UpArgs};

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
    let mut roster = RosterServiceClient::connect(cluster.roster_url()).await.context("connecting to the roster")?;
    let tokens = super::roster::import(&mut roster, std::slice::from_ref(&args.roster)).await?;
    let credentials = super::agent::credentials(&tokens, &[])?;
    let (stop_sender, stop_receiver) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker::serve(
        cluster.execution_url(),
        "muster-demo-agents".to_owned(),
        credentials,
        Arc::new(SampleBehaviour),
        async move {
            let _ = stop_receiver.await;
        },
    ));
    let completed = super::run::run(&RunArgs {
        file: args.process.clone(),
        execution: cluster.execution_url(),
        inputs: "{}".to_owned(),
    })
    .await;
    let _ = stop_sender.send(());
    let _ = worker.await;
    let finished = completed?;
    if !finished.lead_agent_id.is_empty() {
        wait_for_delivery(cluster, &finished).await?;
    }

    let memory = cluster.memory_dir();
    println!(
        "\nthe agents' NDJSON memory (seed 000 format: informed agents, monitors and the lead) is under {}:",
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

/// Waits until the notifier has the execution's last event (the lead hears of
/// every event), so the NDJSON files are complete when listed.
async fn wait_for_delivery(cluster: &muster::cluster::Cluster, finished: &StepEvent) -> anyhow::Result<()> {
    let mut notifier = NotifierServiceClient::connect(cluster.notifier_url()).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut after_cursor = 0;
    while std::time::Instant::now() < deadline {
        let page = notifier
            .list_notifications(ListNotificationsRequest {
                agent_id: finished.lead_agent_id.clone(),
                after_cursor,
                limit: 1000,
            })
            .await?
            .into_inner();
        if page
            .notifications
            .iter()
            .any(|notification| notification.event.as_ref().is_some_and(|event| event.event_id == finished.event_id))
        {
            return Ok(());
        }
        after_cursor = page.notifications.last().map_or(after_cursor, |notification| notification.cursor);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    anyhow::bail!("the notifier did not receive the execution's events within 30 s")
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
