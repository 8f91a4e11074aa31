//! `muster run FILE`: publish a process, start it, and show its progress live;
//! `muster publish FILE` and `muster watch ID`, its two halves.
//!
//! Watching survives a restart of the execution service: when the stream
//! breaks, it reconnects with backoff and resumes after the last event it
//! printed, so no event is shown twice or missed.
//!
//! Ctrl-C on `muster run` cancels the execution it started and shows it end;
//! with `--detach` it leaves the execution running and says how to follow it.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context;
use muster::credentials::Endpoint;
use muster_proto::{
    common::v1::{Diagnostic, EventType, ExecutionStatus, StepEvent},
    execution::v1::{
        CancelExecutionRequest, GetExecutionRequest, ProcessVersion, PublishProcessRequest, StartExecutionRequest,
        WatchExecutionRequest, execution_service_client::ExecutionServiceClient,
    },
};
use muster_runtime::auth::client::AuthChannel;

/// `muster run`
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The process YAML.
    pub(crate) file: PathBuf,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    pub(crate) execution: String,
    /// Inputs of the execution, a JSON object.
    #[arg(long, default_value = "{}")]
    pub(crate) inputs: String,
    #[command(flatten)]
    pub(crate) reconnect: ReconnectArgs,
    /// On Ctrl-C, leave the execution running instead of cancelling it.
    #[arg(long)]
    pub(crate) detach: bool,
}

/// How long watching tries to reach the execution service again.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct ReconnectArgs {
    /// Seconds to keep reconnecting when the execution service cannot be
    /// reached while watching; then the command gives up (the execution goes
    /// on, and `muster watch` shows the rest).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub(crate) reconnect_timeout: u64,
}

impl Default for ReconnectArgs {
    fn default() -> Self {
        Self { reconnect_timeout: 60 }
    }
}

/// `muster publish`
#[derive(Debug, clap::Args)]
pub(crate) struct PublishArgs {
    /// The process YAML.
    file: PathBuf,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
}

/// `muster start`
#[derive(Debug, clap::Args)]
pub(crate) struct StartArgs {
    /// A published process's name.
    process: String,
    /// The version to run (default: the latest).
    #[arg(long, default_value_t = 0)]
    version: u32,
    /// An input, `KEY=VALUE` (repeat); a VALUE that reads as JSON is taken as
    /// JSON (`count=3`, `tags=["a","b"]`), else as text.
    #[arg(long = "input", value_name = "KEY=VALUE", value_parser = parse_input)]
    input: Vec<(String, serde_json::Value)>,
    /// Inputs as one JSON object; `--input` adds to it.
    #[arg(long, default_value = "{}")]
    inputs: String,
    /// The execution's lead (an agent of the roster).
    #[arg(long, default_value = "")]
    lead: String,
    /// A key: a second start with the same key returns the first execution.
    #[arg(long, default_value = "")]
    idempotency_key: String,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
}

fn parse_input(text: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = text.split_once('=').ok_or("expected KEY=VALUE")?;
    if key.trim().is_empty() {
        return Err("expected KEY=VALUE, with a key".to_owned());
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_owned()));
    Ok((key.trim().to_owned(), value))
}

/// `muster start PROCESS`: starts a published process; prints the
/// execution's id alone on standard output (for scripts), and how to
/// follow it on standard error.
pub(crate) async fn start(args: StartArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut inputs: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&args.inputs)
        .map_err(|error| anyhow::anyhow!("--inputs is not a JSON object: {error}"))?;
    inputs.extend(args.input);
    let inputs = serde_json::Value::Object(inputs).to_string();
    let execution = connect(&args.execution, token)?
        .start_execution(StartExecutionRequest {
            process_name: args.process,
            process_version: args.version,
            inputs: super::json_object("--inputs", &inputs)?,
            lead_agent_id: args.lead,
            idempotency_key: args.idempotency_key,
        })
        .await
        .map_err(super::refused)?
        .into_inner()
        .execution
        .context("the execution service returned no execution")?;
    println!("{}", execution.id);
    eprintln!("execution {} started; `muster watch {}` follows it", execution.id, execution.id);
    Ok(())
}

/// `muster watch`
#[derive(Debug, clap::Args)]
pub(crate) struct WatchArgs {
    /// The execution's id.
    execution_id: String,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
    #[command(flatten)]
    reconnect: ReconnectArgs,
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
            print_diagnostics(&file_name, &source, &muster_runtime::status::diagnostics(&status));
            return Err(super::refused(status).context(format!("publishing {file_name} was refused")));
        }
    };
    print_diagnostics(&file_name, &source, &published.diagnostics);
    let process = published.process.context("the execution service returned no process")?;
    let unlisted = (process.warning_count as usize).saturating_sub(published.diagnostics.len());
    if unlisted > 0 {
        eprintln!("{unlisted} more warning(s) not listed ({} in all)", process.warning_count);
    }
    println!("published {} version {} ({} steps)", process.name, process.version, process.step_count);
    Ok(process)
}

/// Prints an execution's events from the start until it ends; returns the last one.
///
/// When the stream breaks or the service cannot be reached, it connects again
/// with backoff and asks for the events after the last one printed; it gives
/// up after `reconnect.reconnect_timeout` seconds without a connection.
async fn watch_events(execution: &Endpoint, execution_id: &str, reconnect: ReconnectArgs) -> anyhow::Result<StepEvent> {
    // Times are the events' own, from the first one (the execution's start):
    // a past execution shows when its steps happened.
    let started = Instant::now();
    let mut origin: Option<f64> = None;
    let colour = crate::validate::colour(true);
    let give_up_after = Duration::from_secs(reconnect.reconnect_timeout);
    let mut last_sequence = 0;
    // Since when the service has been out of reach.
    let mut lost: Option<Instant> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let mut client = ExecutionServiceClient::new(execution.channel()?);
        let request = WatchExecutionRequest { execution_id: execution_id.to_owned(), after_sequence: last_sequence };
        let why = match client.watch_execution(request).await {
            Err(status) if is_transient(&status) => describe_status(&status),
            Err(status) => return Err(super::refused(status)),
            Ok(response) => {
                if lost.take().is_some() {
                    eprintln!("reconnected to the execution service; resuming after event {last_sequence}");
                }
                backoff = FIRST_BACKOFF;
                let mut events = response.into_inner();
                loop {
                    match events.message().await {
                        Ok(Some(response)) => {
                            let Some(event) = response.event else { continue };
                            // After a reconnect the service sends from `after_sequence`; never print one twice.
                            if event.sequence <= last_sequence {
                                continue;
                            }
                            last_sequence = event.sequence;
                            let at = event.occurred_at.as_ref().map(|at| at.seconds as f64 + f64::from(at.nanos) / 1e9);
                            let seconds = match at {
                                Some(at) => at - *origin.get_or_insert(at),
                                None => started.elapsed().as_secs_f64(),
                            };
                            println!("[{seconds:>7.2}s] {}", painted(&event, describe(&event), colour));
                            if event.event_type == EventType::ExecutionFinished as i32 {
                                return Ok(event);
                            }
                        }
                        Ok(None) => break "the event stream ended before the execution finished".to_owned(),
                        Err(status) if is_transient(&status) => break describe_status(&status),
                        Err(status) => return Err(super::refused(status)),
                    }
                }
            }
        };
        let since = lost.get_or_insert_with(|| {
            eprintln!("lost the execution service ({why}); reconnecting to resume after event {last_sequence}");
            Instant::now()
        });
        let out_of_reach = since.elapsed();
        if out_of_reach >= give_up_after {
            anyhow::bail!(
                "gave up watching execution {execution_id}: the execution service has been out of reach for {} s \
                 (last: {why}); the execution goes on without this command: `muster watch {execution_id}` shows the rest",
                out_of_reach.as_secs()
            );
        }
        tokio::time::sleep(backoff.min(give_up_after - out_of_reach)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The first wait before connecting again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Whether a failed call or a broken stream may work on a new connection: the
/// service is restarting, unreachable, or the connection broke under the
/// stream (which surfaces as UNKNOWN or INTERNAL with an h2 error).
fn is_transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled
            | tonic::Code::Aborted
            | tonic::Code::DeadlineExceeded
    )
}

fn describe_status(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// `muster publish FILE`.
pub(crate) async fn publish(args: &PublishArgs, token: Option<&str>) -> anyhow::Result<()> {
    publish_file(&mut connect(&args.execution, token)?, &args.file).await.map(drop)
}

/// `muster watch ID`: returns the execution's last event.
pub(crate) async fn watch(args: &WatchArgs, token: Option<&str>) -> anyhow::Result<StepEvent> {
    watch_events(&super::endpoint(&args.execution, token)?, &args.execution_id, args.reconnect).await
}

/// Publishes, starts and watches; returns the execution's last event.
pub(crate) async fn run(args: &RunArgs, token: Option<&str>) -> anyhow::Result<StepEvent> {
    let endpoint = super::endpoint(&args.execution, token)?;
    let mut client = ExecutionServiceClient::new(endpoint.channel()?);
    let process = publish_file(&mut client, &args.file).await?;
    // Listening before the start, so a Ctrl-C as soon as it started is caught.
    let mut interrupts =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).context("listening for Ctrl-C")?;
    let execution = client
        .start_execution(StartExecutionRequest {
            process_name: process.name.clone(),
            process_version: process.version,
            inputs: super::json_object("--inputs", &args.inputs)?,
            ..Default::default()
        })
        .await
        .map_err(super::refused)?
        .into_inner()
        .execution
        .context("the execution service returned no execution")?;
    let id = execution.id;
    println!("execution {id} started");
    let watching = watch_events(&endpoint, &id, args.reconnect);
    tokio::pin!(watching);
    tokio::select! {
        finished = &mut watching => {
            let finished = finished?;
            print_outputs(&mut client, &id).await;
            return Ok(finished);
        }
        _ = interrupts.recv() => {}
    }
    if args.detach {
        anyhow::bail!("detached: execution {id} goes on without this command; `muster watch {id}` shows it");
    }
    eprintln!("Ctrl-C: cancelling execution {id} (with --detach it would go on)");
    let reason = "cancelled with Ctrl-C from `muster run`".to_owned();
    client.cancel_execution(CancelExecutionRequest { id: id.clone(), reason }).await.map_err(super::refused)?;
    // Shown to its end; a second Ctrl-C stops waiting.
    tokio::select! {
        finished = &mut watching => finished,
        _ = interrupts.recv() => {
            anyhow::bail!("stopped waiting; execution {id} was asked to cancel: `muster watch {id}` shows it end")
        }
    }
}

/// Longest output shown per step, in characters.
const OUTPUT_SHOWN: usize = 160;

/// What each step of an ended execution produced, one line per step.
async fn print_outputs(client: &mut Client, id: &str) {
    let execution = match client.get_execution(GetExecutionRequest { id: id.to_owned() }).await {
        Ok(answer) => answer.into_inner().execution.unwrap_or_default(),
        Err(status) => {
            eprintln!("the steps' outputs could not be read: {}", describe_status(&status));
            return;
        }
    };
    let shown: Vec<String> = execution
        .steps
        .iter()
        .filter_map(|step| {
            let output = match &step.output {
                Some(output) => {
                    muster_runtime::json::to_json(output).map_or_else(|problem| problem, |json| json.to_string())
                }
                None if step.output_omitted => {
                    "(too large to show here: `muster executions get ID --output json`)".to_owned()
                }
                None => return None,
            };
            let mut shown: String = output.chars().take(OUTPUT_SHOWN).collect();
            if shown.len() < output.len() {
                shown.push('…');
            }
            Some(format!("  {:<12} {shown}", step.step_id))
        })
        .collect();
    if !shown.is_empty() {
        println!("outputs:");
        for line in shown {
            println!("{line}");
        }
    }
}

/// Whether a final event says the execution completed.
pub(crate) fn completed(finished: &StepEvent) -> bool {
    finished.execution_status == ExecutionStatus::Completed as i32
}

/// `line` in the colour of what `event` tells, when `colour`: green for
/// what completed, red for what failed or was cancelled, yellow for what waits.
fn painted(event: &StepEvent, line: String, colour: bool) -> String {
    let code = match EventType::try_from(event.event_type).unwrap_or_default() {
        EventType::StepCompleted => "32",
        EventType::StepFailed | EventType::BudgetExceeded => "31",
        EventType::StepQueued | EventType::ApprovalRequested => "33",
        EventType::ExecutionFinished if event.execution_status == ExecutionStatus::Completed as i32 => "1;32",
        EventType::ExecutionFinished => "1;31",
        _ => return line,
    };
    if colour { format!("\x1b[{code}m{line}\x1b[0m") } else { line }
}

fn describe(event: &StepEvent) -> String {
    let kind = EventType::try_from(event.event_type).unwrap_or_default();
    let step = format!("{:<20}", event.step_id);
    match kind {
        EventType::ExecutionStarted => format!("execution started ({} v{})", event.process_name, event.process_version),
        EventType::StepStarted => format!("{step} started     by {}", event.agent_id),
        EventType::StepCompleted => {
            let millis = muster_runtime::time::from_duration(event.duration.as_ref()).unwrap_or_default();
            format!("{step} completed   by {} in {millis} ms", event.agent_id)
        }
        EventType::StepFailed => {
            let error = event.error.clone().unwrap_or_default();
            format!("{step} FAILED      [{}] {}", error.code, error.message)
        }
        EventType::StepQueued => {
            let wait = event.estimated_wait.as_ref().map_or(0, |wait| wait.seconds);
            format!("{step} queued      for {} (about {wait} s)", event.agent_id)
        }
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
        EventType::RoleAssigned | EventType::LeadChanged | EventType::SubtaskRequested | EventType::SubtaskDecided => {
            event.detail.clone()
        }
        EventType::BudgetExceeded => format!("{step} over budget: {}", event.detail),
        EventType::StepProgress => format!("{step} {} ({} tokens so far)", event.detail, event.tokens_used),
        EventType::Unspecified => "unknown event".to_owned(),
    }
}

/// Prints a service's diagnostics on standard error, as `muster validate`
/// prints its own.
pub(crate) fn print_diagnostics(file_name: &str, source: &str, diagnostics: &[Diagnostic]) {
    let findings = diagnostics.iter().map(crate::validate::Finding::from);
    eprint!("{}", crate::validate::render_text(file_name, source, findings, crate::validate::colour(false)));
}
