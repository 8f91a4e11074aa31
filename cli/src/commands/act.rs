//! Acting as an agent or asking the roster: `muster approve` and `muster delegate`.

use anyhow::Context;
use muster_proto::{
    execution::v1::{SubmitApprovalRequest, execution_service_client::ExecutionServiceClient},
    roster::v1::{DelegateRequest, Urgency, roster_service_client::RosterServiceClient},
};

/// `muster approve`: as the agent whose token `--token` (or `MUSTER_TOKEN`) gives.
#[derive(Debug, clap::Args)]
pub(crate) struct ApproveArgs {
    /// The execution.
    execution_id: String,
    /// The human approval step.
    step_id: String,
    /// Reject instead of approving.
    #[arg(long)]
    reject: bool,
    /// A comment, kept with the decision.
    #[arg(long, default_value = "")]
    comment: String,
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution))]
    execution: String,
}

/// Decides as the agent whose token the command carries (`--token`): the
/// step's executor or one of its monitors.
pub(crate) async fn approve(args: ApproveArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut client = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    let request = SubmitApprovalRequest {
        execution_id: args.execution_id,
        step_id: args.step_id,
        approved: !args.reject,
        comment: args.comment,
    };
    let step = client.submit_approval(request).await.map_err(super::refused)?;
    let step = step.into_inner().step.context("no step in the answer")?;
    println!("step {} is now {}", step.step_id, status_name(step.status));
    Ok(())
}

fn status_name(status: i32) -> String {
    muster_proto::execution::v1::StepStatus::try_from(status)
        .map(|status| status.as_str_name().trim_start_matches("STEP_STATUS_").to_lowercase())
        .unwrap_or_else(|_| status.to_string())
}

/// `muster delegate`
#[derive(Debug, clap::Args)]
pub(crate) struct DelegateArgs {
    /// A name for the task, kept in the audit trail.
    task_id: String,
    /// Expertise the task needs (repeat for several).
    #[arg(long = "expertise")]
    expertise: Vec<String>,
    /// The agent delegating (its team and senior shape the decision); an
    /// agent calling with its own token delegates as itself.
    #[arg(long, default_value = "")]
    requester: String,
    /// A team to prefer.
    #[arg(long, default_value = "")]
    team: String,
    /// low, normal, high or critical.
    #[arg(long, default_value = "normal")]
    urgency: String,
    /// Decide and reserve the slot (by default only show the decision).
    #[arg(long)]
    commit: bool,
    /// How to print the decision: text, or JSON (the roster's answer).
    #[arg(long, value_enum, default_value = "text")]
    output: super::output::Output,
    /// The roster service.
    #[arg(long, env = "MUSTER_ROSTER_URL", default_value_t = muster::context::default_url(muster::context::Service::Roster))]
    roster: String,
}

pub(crate) async fn delegate(args: DelegateArgs, token: Option<&str>) -> anyhow::Result<()> {
    let urgency = match args.urgency.as_str() {
        "low" => Urgency::Low,
        "normal" => Urgency::Normal,
        "high" => Urgency::High,
        "critical" => Urgency::Critical,
        other => anyhow::bail!("unknown urgency {other:?}: use low, normal, high or critical"),
    };
    let mut client = RosterServiceClient::new(super::endpoint(&args.roster, token)?.channel()?);
    let response = client
        .delegate(DelegateRequest {
            task_id: args.task_id,
            requester_id: args.requester,
            required_expertise: args.expertise,
            team: args.team,
            urgency: urgency as i32,
            dry_run: !args.commit,
            ..Default::default()
        })
        .await
        .map_err(super::refused)?
        .into_inner();
    if args.output == super::output::Output::Json {
        println!("{}", super::output::to_json(&response, "muster.roster.v1.DelegateResponse")?);
        return Ok(());
    }
    let decision = response.decision.context("no decision in the answer")?;
    println!("{}", decision.text);
    // The text names agents as people read them; scripts need their ids.
    let mut ids = format!("agent ids: {}", decision.primary_agent_id);
    if !decision.fallback_agent_id.is_empty() {
        ids.push_str(&format!(", fallback {}", decision.fallback_agent_id));
    }
    println!("{ids}");
    Ok(())
}
