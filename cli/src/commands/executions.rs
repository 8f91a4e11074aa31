//! Day two on the execution service: `muster executions list|get|cancel`,
//! `muster intervene`, `muster processes list` and `muster workers`. Every read takes
//! `--output json` (see [`super::output`]); lists page with `--page-size` and
//! `--page-token`, and say how to ask for the next page.

use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        CancelExecutionRequest, Execution, GetExecutionRequest, InterveneRequest, InterventionAction,
        ListExecutionsRequest, ListProcessesRequest, ListWorkersRequest, StepStatus,
        execution_service_client::ExecutionServiceClient,
    },
};
use muster_runtime::auth::client::AuthChannel;

use super::output::{Output, to_json, when};

/// The execution service, for every command here.
#[derive(Debug, clap::Args)]
pub(crate) struct Service {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print the answer.
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: Output,
}

/// Which page of a list.
#[derive(Debug, clap::Args)]
pub(crate) struct Page {
    /// Most items on the page (the service's default when 0).
    #[arg(long, default_value_t = 0)]
    page_size: u32,
    /// The page after the one that printed this token.
    #[arg(long, default_value = "")]
    page_token: String,
}

/// `muster executions ...`
#[derive(Debug, clap::Args)]
pub(crate) struct ExecutionsArgs {
    #[command(flatten)]
    service: Service,
    #[command(subcommand)]
    command: ExecutionsCommand,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Status {
    Running,
    Completed,
    Failed,
    Cancelled,
    Paused,
}

#[derive(Debug, clap::Subcommand)]
enum ExecutionsCommand {
    /// Lists executions, newest first, optionally of one process or in one status.
    List {
        /// Only executions of this process.
        #[arg(long, default_value = "")]
        process: String,
        /// Only executions in this status.
        #[arg(long, value_enum)]
        status: Option<Status>,
        #[command(flatten)]
        page: Page,
    },
    /// Shows an execution and where each of its steps stands.
    Get {
        /// The execution's id.
        id: String,
    },
    /// Cancels a running or paused execution. Operators, and the execution's lead.
    Cancel {
        /// The execution's id.
        id: String,
        /// Why; kept as the execution's reason.
        #[arg(long, default_value = "cancelled with `muster executions cancel`")]
        reason: String,
    },
}

/// `muster intervene`
#[derive(Debug, clap::Args)]
pub(crate) struct InterveneArgs {
    #[command(flatten)]
    service: Service,
    /// The execution.
    execution_id: String,
    /// What to do.
    #[arg(value_enum)]
    action: Action,
    /// The step; without it, pause and resume act on the whole execution (its lead only).
    #[arg(long, default_value = "")]
    step: String,
    /// For `reassign`: the agent that takes the step.
    #[arg(long, required_if_eq("action", "reassign"), default_value = "")]
    agent: String,
    /// For `override`: the step's output, a JSON value.
    #[arg(long, required_if_eq("action", "override"), default_value = "")]
    result: String,
    /// Why; kept in the execution's events.
    #[arg(long, default_value = "")]
    reason: String,
}

/// An intervention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Action {
    /// Stop assigning the step (or the execution).
    Pause,
    /// Undo a pause.
    Resume,
    /// Run a failed or running step again.
    Retry,
    /// Cancel the step and its dependants.
    Cancel,
    /// Give the step to another agent (`--agent`).
    Reassign,
    /// Complete the step with the given output (`--result`).
    Override,
}

/// `muster processes ...`
#[derive(Debug, clap::Args)]
pub(crate) struct ProcessesArgs {
    #[command(flatten)]
    service: Service,
    #[command(subcommand)]
    command: ProcessesCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ProcessesCommand {
    /// Lists the published processes, the latest version of each.
    List {
        #[command(flatten)]
        page: Page,
    },
}

/// `muster workers`
#[derive(Debug, clap::Args)]
pub(crate) struct WorkersArgs {
    #[command(flatten)]
    service: Service,
    #[command(flatten)]
    page: Page,
}

type Client = ExecutionServiceClient<AuthChannel>;

fn connect(service: &Service, token: Option<&str>) -> anyhow::Result<Client> {
    Ok(ExecutionServiceClient::new(super::endpoint(&service.execution, token)?.channel()?))
}

fn status_name(status: i32) -> String {
    ExecutionStatus::try_from(status)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("EXECUTION_STATUS_")
        .to_lowercase()
}

fn step_status_name(status: i32) -> String {
    StepStatus::try_from(status).unwrap_or_default().as_str_name().trim_start_matches("STEP_STATUS_").to_lowercase()
}

fn next_page(token: &str) {
    if !token.is_empty() {
        println!("more: --page-token {token}");
    }
}

fn summary(execution: &Execution) -> String {
    let mut line = format!(
        "{}  {:<9}  {} v{}  started {}",
        execution.id,
        status_name(execution.status),
        execution.process_name,
        execution.process_version,
        when(execution.started_at.as_ref()),
    );
    if !execution.reason.is_empty() {
        line.push_str(&format!("  ({})", execution.reason));
    }
    line
}

/// Runs `muster executions ...`.
pub(crate) async fn executions(args: ExecutionsArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = connect(&args.service, token)?;
    let output = args.service.output;
    match args.command {
        ExecutionsCommand::List { process, status, page } => {
            let status = status.map_or(ExecutionStatus::Unspecified, |status| match status {
                Status::Running => ExecutionStatus::Running,
                Status::Completed => ExecutionStatus::Completed,
                Status::Failed => ExecutionStatus::Failed,
                Status::Cancelled => ExecutionStatus::Cancelled,
                Status::Paused => ExecutionStatus::Paused,
            });
            let request = ListExecutionsRequest {
                process_name: process,
                status: status.into(),
                limit: page.page_size,
                page_token: page.page_token,
                ..ListExecutionsRequest::default()
            };
            let response = client.list_executions(request).await.map_err(super::refused)?.into_inner();
            if output == Output::Json {
                println!("{}", to_json(&response, "muster.execution.v1.ListExecutionsResponse")?);
                return Ok(());
            }
            if response.executions.is_empty() {
                println!("(no executions)");
            }
            for execution in &response.executions {
                println!("{}", summary(execution));
            }
            next_page(&response.next_page_token);
        }
        ExecutionsCommand::Get { id } => {
            let response = client.get_execution(GetExecutionRequest { id }).await.map_err(super::refused)?.into_inner();
            if output == Output::Json {
                println!("{}", to_json(&response, "muster.execution.v1.GetExecutionResponse")?);
                return Ok(());
            }
            let execution = response.execution.unwrap_or_default();
            println!("{}", summary(&execution));
            if !execution.lead_agent_id.is_empty() {
                println!("lead {}", execution.lead_agent_id);
            }
            for step in &execution.steps {
                let mut line =
                    format!("  {:<20} {:<16} {}", step.step_id, step_status_name(step.status), step.executor);
                if !step.waiting_for.is_empty() {
                    line.push_str(&format!("  waiting for {}", step.waiting_for.join(", ")));
                }
                if let Some(error) = &step.error {
                    line.push_str(&format!("  [{}] {}", error.code, error.message));
                }
                println!("{line}");
            }
        }
        ExecutionsCommand::Cancel { id, reason } => {
            let response = client
                .cancel_execution(CancelExecutionRequest { id: id.clone(), reason })
                .await
                .map_err(super::refused)?
                .into_inner();
            if output == Output::Json {
                println!("{}", to_json(&response, "muster.execution.v1.CancelExecutionResponse")?);
                return Ok(());
            }
            println!("execution {id} cancelled");
        }
    }
    Ok(())
}

/// Runs `muster intervene`.
pub(crate) async fn intervene(args: InterveneArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = connect(&args.service, token)?;
    let action = match args.action {
        Action::Pause => InterventionAction::Pause,
        Action::Resume => InterventionAction::Resume,
        Action::Retry => InterventionAction::Retry,
        Action::Cancel => InterventionAction::Cancel,
        Action::Reassign => InterventionAction::Reassign,
        Action::Override => InterventionAction::OverrideOutput,
    };
    let output = match &args.result {
        result if result.trim().is_empty() => None,
        result => Some(
            muster_runtime::json::value_from_text(result).map_err(|problem| anyhow::anyhow!("--result {problem}"))?,
        ),
    };
    let request = InterveneRequest {
        execution_id: args.execution_id,
        step_id: args.step.clone(),
        action: action.into(),
        target_agent_id: args.agent,
        output,
        reason: args.reason,
    };
    let response = client.intervene(request).await.map_err(super::refused)?.into_inner();
    if args.service.output == Output::Json {
        println!("{}", to_json(&response, "muster.execution.v1.InterveneResponse")?);
        return Ok(());
    }
    let execution = response.execution.unwrap_or_default();
    match execution.steps.iter().find(|step| step.step_id == args.step) {
        Some(step) => println!(
            "step {} of execution {}: {} ({})",
            step.step_id,
            execution.id,
            step_status_name(step.status),
            step.executor
        ),
        None => println!("execution {}: {}", execution.id, status_name(execution.status)),
    }
    Ok(())
}

/// Runs `muster processes ...`.
pub(crate) async fn processes(args: ProcessesArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = connect(&args.service, token)?;
    let ProcessesCommand::List { page } = args.command;
    let request = ListProcessesRequest { page_size: page.page_size, page_token: page.page_token };
    let response = client.list_processes(request).await.map_err(super::refused)?.into_inner();
    if args.service.output == Output::Json {
        println!("{}", to_json(&response, "muster.execution.v1.ListProcessesResponse")?);
        return Ok(());
    }
    if response.processes.is_empty() {
        println!("(no processes published)");
    }
    for process in &response.processes {
        println!(
            "{} v{}  {} steps  published {}",
            process.name,
            process.version,
            process.step_count,
            when(process.published_at.as_ref())
        );
    }
    next_page(&response.next_page_token);
    Ok(())
}

/// Runs `muster workers`.
pub(crate) async fn workers(args: WorkersArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = connect(&args.service, token)?;
    let request = ListWorkersRequest { page_size: args.page.page_size, page_token: args.page.page_token };
    let response = client.list_workers(request).await.map_err(super::refused)?.into_inner();
    if args.service.output == Output::Json {
        println!("{}", to_json(&response, "muster.execution.v1.ListWorkersResponse")?);
        return Ok(());
    }
    if response.workers.is_empty() {
        println!("(no workers connected)");
    }
    for worker in &response.workers {
        println!(
            "{}  {}  {}/{} in flight  agents: {}  tools: {}  last seen {}",
            worker.worker_id,
            worker.name,
            worker.in_flight,
            worker.max_concurrency,
            worker.agents.join(", "),
            if worker.tools.is_empty() { "-".to_owned() } else { worker.tools.join(", ") },
            when(worker.last_seen_at.as_ref()),
        );
    }
    next_page(&response.next_page_token);
    Ok(())
}
