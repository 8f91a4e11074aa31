//! `muster run FILE`: publish a process, start it, and show its progress live;
//! `muster publish FILE` and `muster watch ID`, its two halves.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Context;
use muster_proto::{
    common::v1::{Diagnostic, EventType, ExecutionStatus, StepEvent},
    execution::v1::{
        ProcessVersion, PublishProcessRequest, PublishProcessResponse, StartExecutionRequest, WatchExecutionRequest,
        execution_service_client::ExecutionServiceClient,
    },
};
use muster_runtime::auth::client::AuthChannel;
use prost::Message;

/// `muster run`
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The process YAML.
    pub(crate) file: PathBuf,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051")]
    pub(crate) execution: String,
    /// Inputs of the execution, a JSON object.
    #[arg(long, default_value = "{}")]
    pub(crate) inputs: String,
}

/// `muster publish`
#[derive(Debug, clap::Args)]
pub(crate) struct PublishArgs {
    /// The process YAML.
    file: PathBuf,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051")]
    execution: String,
}

/// `muster watch`
#[derive(Debug, clap::Args)]
pub(crate) struct WatchArgs {
    /// The execution's id.
    execution_id: String,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051")]
    execution: String,
}

type Client = ExecutionServiceClient<AuthChannel>;

fn connect(url: &str, token: Option<&str>) -> anyhow::Result<Client> {
    Ok(ExecutionServiceClient::new(super::endpoint(url, token)?.channel()?))
}

/// Publishes a process file, printing its diagnostics compiler-style.
pub(crate) async fn publish_file(client: &mut Client, file: &Path) -> anyhow::Result<ProcessVersion> {
    let source = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let file_name = file.display().to_string();
    let published = match client
        .publish_process(PublishProcessRequest { source: source.clone(), file_name: file_name.clone() })
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => {
            if let Ok(details) = PublishProcessResponse::decode(status.details()) {
                print_diagnostics(&file_name, &source, &details.diagnostics);
            }
            return Err(super::refused(status).context(format!("publishing {file_name} was refused")));
        }
    };
    print_diagnostics(&file_name, &source, &published.diagnostics);
    let process = published.process.context("the execution service returned no process")?;
    println!("published {} version {} ({} steps)", process.name, process.version, process.step_count);
    Ok(process)
}

/// Prints an execution's events from the start until it ends; returns the last one.
async fn watch_events(client: &mut Client, execution_id: &str) -> anyhow::Result<StepEvent> {
    let started = Instant::now();
    let mut events = client
        .watch_execution(WatchExecutionRequest { execution_id: execution_id.to_owned(), after_sequence: 0 })
        .await
        .map_err(super::refused)?
        .into_inner();
    while let Some(response) = events.message().await? {
        let Some(event) = response.event else { continue };
        println!("[{:>7.2}s] {}", started.elapsed().as_secs_f64(), describe(&event));
        if event.r#type == EventType::ExecutionFinished as i32 {
            return Ok(event);
        }
    }
    anyhow::bail!("the event stream ended before the execution finished")
}

/// `muster publish FILE`.
pub(crate) async fn publish(args: &PublishArgs, token: Option<&str>) -> anyhow::Result<()> {
    publish_file(&mut connect(&args.execution, token)?, &args.file).await.map(drop)
}

/// `muster watch ID`: returns the execution's last event.
pub(crate) async fn watch(args: &WatchArgs, token: Option<&str>) -> anyhow::Result<StepEvent> {
    watch_events(&mut connect(&args.execution, token)?, &args.execution_id).await
}

/// Publishes, starts and watches; returns the execution's last event.
pub(crate) async fn run(args: &RunArgs, token: Option<&str>) -> anyhow::Result<StepEvent> {
    let mut client = connect(&args.execution, token)?;
    let process = publish_file(&mut client, &args.file).await?;
    let execution = client
        .start_execution(StartExecutionRequest {
            process_name: process.name.clone(),
            process_version: process.version,
            inputs_json: args.inputs.clone(),
            ..Default::default()
        })
        .await
        .map_err(super::refused)?
        .into_inner()
        .execution
        .context("the execution service returned no execution")?;
    println!("execution {} started", execution.id);
    watch_events(&mut client, &execution.id).await
}

/// Whether a final event says the execution completed.
pub(crate) fn completed(finished: &StepEvent) -> bool {
    finished.execution_status == ExecutionStatus::Completed as i32
}

fn describe(event: &StepEvent) -> String {
    let kind = EventType::try_from(event.r#type).unwrap_or_default();
    let step = format!("{:<20}", event.step_id);
    match kind {
        EventType::ExecutionStarted => format!("execution started ({} v{})", event.process_name, event.process_version),
        EventType::StepStarted => format!("{step} started     by {}", event.agent_id),
        EventType::StepCompleted => format!("{step} completed   by {} in {} ms", event.agent_id, event.duration_ms),
        EventType::StepFailed => {
            let error = event.error.clone().unwrap_or_default();
            format!("{step} FAILED      [{}] {}", error.code, error.message)
        }
        EventType::StepQueued => format!("{step} queued      for {} (about {} s)", event.agent_id, event.wait_seconds),
        EventType::StepDelegated => format!("{step} delegated   to {}", event.agent_id),
        EventType::StepEscalated => format!("{step} escalated   to {}", event.agent_id),
        EventType::ApprovalRequested => format!("{step} awaits approval from {}", event.waiting_for.join(", ")),
        EventType::StepIntervened => format!("{step} intervened: {}", event.detail),
        EventType::ExecutionFinished => {
            let status = ExecutionStatus::try_from(event.execution_status).unwrap_or_default();
            let status = status.as_str_name().trim_start_matches("EXECUTION_STATUS_").to_lowercase();
            if event.detail.is_empty() {
                format!("execution {status}")
            } else {
                format!("execution {status}: {}", event.detail)
            }
        }
        EventType::SessionStarted => format!("session started with {}", event.participants.join(", ")),
        EventType::RoleAssigned | EventType::LeadChanged => event.detail.clone(),
        EventType::Unspecified => "unknown event".to_owned(),
    }
}

/// Prints diagnostics compiler-style, with the source line and a caret.
pub(crate) fn print_diagnostics(file_name: &str, source: &str, diagnostics: &[Diagnostic]) {
    for diagnostic in diagnostics {
        let severity = if diagnostic.severity == 1 { "error" } else { "warning" };
        eprintln!(
            "{file_name}:{}:{}: {severity}[{}]: {}",
            diagnostic.line, diagnostic.column, diagnostic.code, diagnostic.message
        );
        if let Some(line) =
            source.lines().nth(diagnostic.line.saturating_sub(1) as usize).filter(|_| diagnostic.line > 0)
        {
            eprintln!("    {line}");
            eprintln!("    {}^", " ".repeat(diagnostic.column.saturating_sub(1) as usize));
        }
    }
}
