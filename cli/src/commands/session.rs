//! Team sessions: `muster session start|status|assign|lead|subtask|decide` and
//! `muster check-role AGENT ACTION`.

use std::path::Path;

use anyhow::Context;
use muster_proto::execution::v1::{
    AssignRoleRequest, CheckRoleRequest, DecideSubtaskRequest, GetSessionStatusRequest, InterventionAction,
    RequestSubtaskRequest, RoleAssignment, RoleCheck, SessionTask, SetLeadRequest, StartSessionRequest, SubtaskStatus,
    execution_service_client::ExecutionServiceClient,
};

/// `muster session ...`
#[derive(Debug, clap::Args)]
pub(crate) struct SessionArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SessionCommand {
    /// Starts a process as a team session; every participant receives the
    /// task through its notifications. Operators.
    Start {
        /// A published process's name, or a process file to publish first.
        process: String,
        /// The lead (an agent of the roster).
        #[arg(long)]
        lead: String,
        /// What the session is about.
        #[arg(long)]
        title: String,
        /// The task in more words.
        #[arg(long, default_value = "")]
        description: String,
        /// A participant: `AGENT=ROLE` or `AGENT=ROLE:SUBTASK` (repeat).
        #[arg(long = "participant", value_parser = parse_participant)]
        participants: Vec<RoleAssignment>,
        /// Inputs of the execution, a JSON object.
        #[arg(long, default_value = "{}")]
        inputs: String,
    },
    /// The lead's dashboard: assignments, blockers, suggested interventions,
    /// recent activity. The lead, and operators.
    Status {
        /// The execution.
        execution_id: String,
    },
    /// Assigns a role (and a subtask) to an agent; it is notified. The lead.
    Assign {
        /// The execution.
        execution_id: String,
        /// The agent.
        agent_id: String,
        /// A role of the permission matrix.
        role: String,
        /// What the agent is to do.
        #[arg(long, default_value = "")]
        subtask: String,
    },
    /// Designates the lead. Operators, and the current lead.
    Lead {
        /// The execution.
        execution_id: String,
        /// The new lead.
        agent_id: String,
    },
    /// Asks the lead for a subtask; nothing is assigned until the lead
    /// decides (`muster session decide`). Participants whose role may
    /// `create_subtask` (the architect).
    Subtask {
        /// The execution.
        execution_id: String,
        /// What is to be done.
        subtask: String,
        /// The agent that would do it (default: you).
        #[arg(long = "agent", default_value = "")]
        agent_id: String,
        /// Its role (default: the role it has in the session).
        #[arg(long, default_value = "")]
        role: String,
        /// Why it is needed.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Approves or rejects a subtask request; approved, it becomes the named
    /// agent's assignment. The lead, and operators.
    #[command(group(clap::ArgGroup::new("decision").required(true).args(["approve", "reject"])))]
    Decide {
        /// The execution.
        execution_id: String,
        /// The subtask request (its id, as `muster session status` lists it).
        request_id: String,
        /// Approve it.
        #[arg(long)]
        approve: bool,
        /// Reject it.
        #[arg(long)]
        reject: bool,
        /// A note for the requester.
        #[arg(long, default_value = "")]
        note: String,
    },
}

/// A subtask request's status as a word.
fn subtask_status(status: i32) -> String {
    let status = SubtaskStatus::try_from(status).unwrap_or_default();
    status.as_str_name().trim_start_matches("SUBTASK_STATUS_").to_lowercase()
}

fn parse_participant(text: &str) -> Result<RoleAssignment, String> {
    let (agent_id, rest) = text.split_once('=').ok_or("expected AGENT=ROLE or AGENT=ROLE:SUBTASK")?;
    let (role, subtask) = rest.split_once(':').unwrap_or((rest, ""));
    if agent_id.is_empty() || role.is_empty() {
        return Err("expected AGENT=ROLE or AGENT=ROLE:SUBTASK".to_owned());
    }
    Ok(RoleAssignment {
        agent_id: agent_id.to_owned(),
        role: role.to_owned(),
        subtask: subtask.to_owned(),
        ..Default::default()
    })
}

pub(crate) async fn run(args: SessionArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    match args.command {
        SessionCommand::Start { process, lead, title, description, participants, inputs } => {
            let (process_name, process_version) = if Path::new(&process).is_file() {
                let published = super::run::publish_file(&mut execution, Path::new(&process)).await?;
                (published.name, published.version)
            } else {
                (process, 0)
            };
            let started = execution
                .start_session(StartSessionRequest {
                    process_name,
                    process_version,
                    inputs: super::json_object("--inputs", &inputs)?,
                    lead_agent_id: lead,
                    participants,
                    task: Some(SessionTask { title, description }),
                    idempotency_key: String::new(),
                })
                .await
                .map_err(super::refused)?
                .into_inner()
                .execution
                .context("no execution in the answer")?;
            println!("session {} started; `muster watch {}` follows it", started.id, started.id);
        }
        SessionCommand::Status { execution_id } => {
            let status = execution
                .get_session_status(GetSessionStatusRequest { execution_id })
                .await
                .map_err(super::refused)?
                .into_inner();
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&status, "muster.execution.v1.GetSessionStatusResponse")?);
                return Ok(());
            }
            print!("{}", status.context_window);
            if status.blockers.is_empty() {
                println!("\nno blockers");
            } else {
                println!("\nblockers:");
                for blocker in &status.blockers {
                    println!("  - {}", blocker.reason);
                }
            }
            if !status.suggested_interventions.is_empty() {
                println!("\nsuggested interventions:");
                for suggestion in &status.suggested_interventions {
                    let action = InterventionAction::try_from(suggestion.action).unwrap_or_default();
                    let action = action.as_str_name().trim_start_matches("INTERVENTION_ACTION_");
                    println!("  - [{}] {} ({action})", suggestion.rule, suggestion.text);
                }
            }
            if !status.subtask_requests.is_empty() {
                println!("\nsubtask requests:");
                for request in &status.subtask_requests {
                    println!(
                        "  - {} [{}] {} for {} as {}: {}",
                        request.id,
                        subtask_status(request.status),
                        request.requested_by,
                        request.agent_id,
                        request.role,
                        request.subtask
                    );
                }
            }
            println!("\nrecent activity:");
            for event in &status.recent_activity {
                let kind = super::output::event_name(event.event_type);
                println!("  #{:<4} {kind:<20} {} {}", event.sequence, event.step_id, event.detail);
            }
        }
        SessionCommand::Assign { execution_id, agent_id, role, subtask } => {
            let assigned = execution
                .assign_role(AssignRoleRequest { execution_id, agent_id, role, subtask })
                .await
                .map_err(super::refused)?
                .into_inner();
            let assignment = assigned.assignment.unwrap_or_default();
            println!(
                "{} is now {} (permission matrix version {})",
                assignment.agent_id, assignment.role, assigned.matrix_version
            );
        }
        SessionCommand::Lead { execution_id, agent_id } => {
            let changed = execution
                .set_lead(SetLeadRequest { execution_id, agent_id })
                .await
                .map_err(super::refused)?
                .into_inner()
                .execution
                .context("no execution in the answer")?;
            println!("{} now leads {}", changed.lead_agent_id, changed.id);
        }
        SessionCommand::Subtask { execution_id, subtask, agent_id, role, reason } => {
            let asked = execution
                .request_subtask(RequestSubtaskRequest { execution_id, agent_id, role, subtask, reason })
                .await
                .map_err(super::refused)?
                .into_inner()
                .request
                .context("no subtask request in the answer")?;
            println!(
                "subtask request {} for {} as {} waits for the lead's decision",
                asked.id, asked.agent_id, asked.role
            );
        }
        SessionCommand::Decide { execution_id, request_id, approve, reject: _, note } => {
            let decided = execution
                .decide_subtask(DecideSubtaskRequest { execution_id, request_id, approve, note })
                .await
                .map_err(super::refused)?
                .into_inner();
            let request = decided.request.unwrap_or_default();
            match decided.assignment {
                Some(assignment) => println!(
                    "subtask request {} approved: {} is now {} ({})",
                    request.id, assignment.agent_id, assignment.role, assignment.subtask
                ),
                None => println!("subtask request {} {}", request.id, subtask_status(request.status)),
            }
        }
    }
    Ok(())
}

/// `muster check-role AGENT ACTION`
#[derive(Debug, clap::Args)]
pub(crate) struct CheckRoleArgs {
    /// The agent.
    agent_id: String,
    /// The action, such as `code` or `approve`.
    action: String,
    /// Within this execution (its session roles and lead); without it, the
    /// agent's roster role against the permission matrix.
    #[arg(long)]
    execution_id: Option<String>,
    /// How to print the verdict: text, or JSON (the service's answer).
    #[arg(long, value_enum, default_value = "text")]
    output: super::output::Output,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
}

/// Prints the verdict; exit code 0 when allowed, 1 when not.
pub(crate) async fn check_role(args: CheckRoleArgs, token: Option<&str>) -> anyhow::Result<bool> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    let verdict = execution
        .check_role(CheckRoleRequest {
            execution_id: args.execution_id.unwrap_or_default(),
            action: args.action.clone(),
            agent_id: args.agent_id.clone(),
        })
        .await
        .map_err(super::refused)?
        .into_inner();
    if args.output == super::output::Output::Json {
        println!("{}", super::output::to_json(&verdict, "muster.execution.v1.CheckRoleResponse")?);
        return Ok(verdict.allowed);
    }
    let check = RoleCheck::try_from(verdict.decided_by).unwrap_or_default();
    println!(
        "{}: {} '{}' — {} [{}]",
        if verdict.allowed { "allowed" } else { "denied" },
        verdict.agent_id,
        args.action,
        verdict.reason,
        check.as_str_name().trim_start_matches("ROLE_CHECK_").to_lowercase()
    );
    Ok(verdict.allowed)
}
