//! `muster`: start a cluster, validate, publish and run processes, manage the
//! roster, credentials, sessions, inboxes, budgets, schedules, memory and the permission matrix, and
//! serve sample agents.

use std::process::ExitCode;

use clap::Parser;
use muster_runtime::config::LogFormat;

mod commands;
mod validate;

#[derive(Debug, Parser)]
#[command(name = "muster", version, about = "Role-based multi-agent processes on a gRPC cluster")]
struct Cli {
    /// The credential calls carry: an operator's token, or an agent's roster
    /// token. Without it, the local operator's token that `muster up` keeps
    /// in its data folder is used.
    #[arg(long, env = "MUSTER_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// The cluster to talk to: a context `muster up` wrote (by default the
    /// last one started). For `muster up`, the name it writes (`local`).
    /// Flags and `MUSTER_*_URL` variables still win over its addresses.
    #[arg(long, env = "MUSTER_CLUSTER", global = true)]
    cluster: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Starts the four services on this machine (SQLite in the data folder) until Ctrl-C, restarting any that exits.
    Up(commands::up::UpCommand),
    /// Stops the cluster `muster up --detach` started.
    Down(commands::up::DownArgs),
    /// The sample end to end: cluster, sample roster, sample agents, sample process.
    Demo(commands::demo::DemoArgs),
    /// Publishes and runs a process, showing its progress live (across restarts of the execution service); exit code 0 only if it completed.
    Run(commands::run::RunArgs),
    /// Publishes a process (a new version), printing its diagnostics.
    Publish(commands::run::PublishArgs),
    /// Starts a published process; prints the execution's id (`muster watch ID` follows it).
    Start(commands::run::StartArgs),
    /// An agent's notifications, oldest first; --follow waits for new ones.
    Notifications(commands::notifications::NotificationsArgs),
    /// Executions: list them, show one with its steps, cancel one.
    Executions(commands::executions::ExecutionsArgs),
    /// Intervenes in an execution: pause, resume, retry, cancel, reassign or override a step.
    Intervene(commands::executions::InterveneArgs),
    /// Processes: list the published ones.
    Processes(commands::executions::ProcessesArgs),
    /// The workers connected to the execution service, with their agents and tools.
    Workers(commands::executions::WorkersArgs),
    /// Shows an execution's events live until it ends (across restarts of the execution service); exit code 0 only if it completed.
    Watch(commands::run::WatchArgs),
    /// Approves or rejects a human approval step, as the agent whose token is given.
    Approve(commands::act::ApproveArgs),
    /// Asks the roster who should take a task: its delegation decision, as text.
    Delegate(commands::act::DelegateArgs),
    /// Validates process, role, permission-matrix and roster files offline.
    Validate(validate::ValidateArgs),
    /// Imports and lists the roster.
    Roster(commands::roster::RosterArgs),
    /// Rotates or revokes an agent's token.
    Token(commands::admin::TokenArgs),
    /// Adds an operator to an operators file.
    Operator(commands::admin::OperatorArgs),
    /// Shows or replaces the permission matrix.
    Matrix(commands::admin::MatrixArgs),
    /// Team sessions: start one, see its dashboard, assign roles, change the lead.
    Session(commands::session::SessionArgs),
    /// Inboxes: post a message (which starts the run of the process the inbox triggers), list, archive.
    Inbox(commands::inbox::InboxArgs),
    /// Budgets: set a process's limits on runs, cost and tokens per period; list them with their use.
    Budget(commands::budget::BudgetArgs),
    /// Schedules: the processes that run on a schedule, when each fires next and its last run.
    Schedule(commands::schedule::ScheduleArgs),
    /// Memory: what the runs of a role (or every run) remember, newest first; add and forget entries.
    Memory(commands::memory::MemoryArgs),
    /// Whether an agent's role permits an action, and why.
    CheckRole(commands::session::CheckRoleArgs),
    /// Serves agents with the deterministic sample behaviour (no LLM); an agent whose token is refused is left out.
    Agent(commands::agent::AgentArgs),
    /// Serves one agent as a Model Context Protocol server, over stdio (the --token's agent) or streamable HTTP
    /// (--listen; each client's own bearer token), so that an MCP client can be a member of a team.
    Mcp(commands::mcp::McpArgs),
    /// Prints the shell completion script for SHELL (bash, zsh, fish, elvish, powershell), e.g.
    /// `muster completions bash > ~/.local/share/bash-completion/completions/muster`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// See [`muster_runtime::Allocator`].
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

/// Ends the command quietly when its output is a pipe whose reader went
/// away (`muster executions list | head -1`): printing then fails, which
/// Rust reports as a panic.
#[expect(
    clippy::disallowed_methods,
    reason = "a reader that went away (`| head`) ends the command: nothing is left to write, and a panic would say otherwise"
)]
fn end_quietly_on_a_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or_default();
        if message.contains("Broken pipe") || message.contains("BrokenPipe") {
            std::process::exit(0);
        }
        report(info);
    }));
}

#[tokio::main]
async fn main() -> ExitCode {
    end_quietly_on_a_broken_pipe();
    let cli = Cli::parse();
    // Warnings only unless MUSTER_LOG says otherwise; traces (of `muster
    // agent`'s assignments) go out when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    let log_filter = std::env::var("MUSTER_LOG").unwrap_or_else(|_| "warn".to_owned());
    let service = if matches!(cli.command, Command::Agent(_)) { "muster-agent" } else { "muster" };
    let telemetry = match muster_runtime::telemetry::init(service, LogFormat::Pretty, &log_filter) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("muster: {error}");
            return ExitCode::from(2);
        }
    };
    let token = cli.token.as_deref();
    // The commands that start a cluster name the context they write; the
    // others need the one they name to exist.
    let starts_a_cluster = matches!(cli.command, Command::Up(_) | Command::Demo(_) | Command::Completions { .. });
    if !starts_a_cluster && let Err(error) = muster::context::selection() {
        eprintln!("muster: {error}");
        return ExitCode::from(2);
    }
    let cluster = cli.cluster.as_deref().unwrap_or(muster::context::DEFAULT_NAME);
    let outcome = match cli.command {
        Command::Up(args) if args.detach => commands::up::detach(&args.up).await.map(|()| true),
        Command::Up(args) => commands::up::run(args.up, cluster).await.map(|()| true),
        Command::Down(args) => commands::up::down(args).await.map(|()| true),
        Command::Demo(args) => commands::demo::run(args, cluster).await,
        Command::Run(args) => {
            commands::run::run(&args, token).await.map(|finished| commands::run::completed(&finished))
        }
        Command::Publish(args) => commands::run::publish(&args, token).await.map(|()| true),
        Command::Start(args) => commands::run::start(args, token).await.map(|()| true),
        Command::Notifications(args) => commands::notifications::run(args, token).await.map(|()| true),
        Command::Executions(args) => commands::executions::executions(args, token).await.map(|()| true),
        Command::Intervene(args) => commands::executions::intervene(args, token).await.map(|()| true),
        Command::Processes(args) => commands::executions::processes(args, token).await.map(|()| true),
        Command::Workers(args) => commands::executions::workers(args, token).await.map(|()| true),
        Command::Watch(args) => {
            commands::run::watch(&args, token).await.map(|finished| commands::run::completed(&finished))
        }
        Command::Approve(args) => commands::act::approve(args, token).await.map(|()| true),
        Command::Delegate(args) => commands::act::delegate(args, token).await.map(|()| true),
        Command::Validate(args) => return validate::run(&args),
        Command::Roster(args) => commands::roster::run(args, token).await.map(|()| true),
        Command::Token(args) => commands::admin::token(args, token).await.map(|()| true),
        Command::Operator(args) => commands::admin::operator(&args).map(|()| true),
        Command::Matrix(args) => commands::admin::matrix(args, token).await.map(|()| true),
        Command::Session(args) => commands::session::run(args, token).await.map(|()| true),
        Command::Budget(args) => commands::budget::run(args, token).await.map(|()| true),
        Command::Schedule(args) => commands::schedule::run(args, token).await.map(|()| true),
        Command::Memory(args) => commands::memory::run(args, token).await.map(|()| true),
        Command::Inbox(args) => commands::inbox::run(args, token).await.map(|()| true),
        Command::CheckRole(args) => commands::session::check_role(args, token).await,
        Command::Mcp(args) => commands::mcp::run(args, token).await.map(|()| true),
        Command::Agent(args) => commands::agent::run(args, token).await.map(|()| true),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "muster",
                &mut std::io::stdout(),
            );
            Ok(true)
        }
    };
    telemetry.shutdown().await;
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("muster: {error:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// Every command's arguments fit together (no flag defined twice, as a
    /// global flag and a command's own could be).
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
