//! Budgets: `muster budget set|list`. A run that would start past a limit
//! of its process's budget is refused.

use muster_proto::execution::v1::{
    Budget, BudgetAction, BudgetScope, ListBudgetsRequest, ListBudgetsResponse, SetBudgetRequest,
    execution_service_client::ExecutionServiceClient,
};

/// `muster budget ...`
#[derive(Debug, clap::Args)]
pub(crate) struct BudgetArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: BudgetCommand,
}

#[derive(Debug, clap::Subcommand)]
enum BudgetCommand {
    /// Sets a published process's budget, replacing the one it declares
    /// (every limit 0 removes it); with `--role` the budget of a role's own
    /// runs; with `--agent` the budget of the steps an agent starts.
    /// Operators.
    Set {
        /// The process (with `--role`, the role; with `--agent`, the agent).
        process: String,
        /// The name is a role's: limit the runs its schedule and inbox start.
        #[arg(long, conflicts_with = "agent")]
        role: bool,
        /// The name is an agent's: limit the steps it starts, in any run
        /// (`--max-runs` counts steps; past a limit its steps are refused,
        /// or with `--on-exceed warn` go on).
        #[arg(long)]
        agent: bool,
        /// Length of the period, in seconds.
        #[arg(long, default_value_t = 86_400)]
        period_seconds: u64,
        /// Most runs per period (0: no limit).
        #[arg(long, default_value_t = 0)]
        max_runs: u32,
        /// Most cost per period, in US dollars (0: no limit).
        #[arg(long, default_value_t = 0.0)]
        max_cost: f64,
        /// Most tokens per period (0: no limit).
        #[arg(long, default_value_t = 0)]
        max_tokens: u64,
        /// Most cost of one run, in US dollars (0: no limit).
        #[arg(long, default_value_t = 0.0)]
        run_max_cost: f64,
        /// Most tokens of one run (0: no limit).
        #[arg(long, default_value_t = 0)]
        run_max_tokens: u64,
        /// What happens to a run that goes over a limit.
        #[arg(long, value_enum, default_value_t = OnExceed::Stop)]
        on_exceed: OnExceed,
    },
    /// Lists the budgets in force, with their use in the current period.
    List {
        /// The agents' budgets instead.
        #[arg(long)]
        agents: bool,
    },
}

/// What happens to a run that goes over a limit.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OnExceed {
    /// Cancel it.
    Stop,
    /// Pause it until it is resumed.
    Pause,
    /// Only tell its monitors and lead.
    Warn,
}

fn line(budget: &Budget) -> String {
    let limit = |used: String, max: String, unlimited: bool| {
        if unlimited { format!("{used} (no limit)") } else { format!("{used} of {max}") }
    };
    let role = match BudgetScope::try_from(budget.scope) {
        Ok(BudgetScope::Role) => "role ",
        Ok(BudgetScope::Agent) => "agent ",
        _ => "",
    };
    let line = format!(
        "{role}{}  ({}, per {} s)  {} {}  cost {}  tokens {}",
        budget.name,
        budget.source,
        budget.period.as_ref().map_or(0, |period| period.seconds),
        if budget.scope == BudgetScope::Agent as i32 { "steps" } else { "runs" },
        limit(budget.used_runs.to_string(), budget.max_runs.to_string(), budget.max_runs == 0),
        limit(format!("${:.2}", budget.used_cost), format!("${:.2}", budget.max_cost), budget.max_cost == 0.0),
        limit(budget.used_tokens.to_string(), budget.max_tokens.to_string(), budget.max_tokens == 0),
    );
    let mut per_run = Vec::new();
    if budget.run_max_cost > 0.0 {
        per_run.push(format!("${:.2}", budget.run_max_cost));
    }
    if budget.run_max_tokens > 0 {
        per_run.push(format!("{} tokens", budget.run_max_tokens));
    }
    let action = BudgetAction::try_from(budget.on_exceed).unwrap_or_default();
    let action = match action {
        BudgetAction::Pause => "pause",
        BudgetAction::Warn => "warn",
        BudgetAction::Stop | BudgetAction::Unspecified => "stop",
    };
    if per_run.is_empty() {
        format!("{line}  over a limit: {action}")
    } else {
        format!("{line}  per run {}  over a limit: {action}", per_run.join(", "))
    }
}

pub(crate) async fn run(args: BudgetArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    match args.command {
        BudgetCommand::Set {
            process,
            role,
            agent,
            period_seconds,
            max_runs,
            max_cost,
            max_tokens,
            run_max_cost,
            run_max_tokens,
            on_exceed,
        } => {
            let budget = Budget {
                scope: match (role, agent) {
                    (true, _) => BudgetScope::Role,
                    (_, true) => BudgetScope::Agent,
                    _ => BudgetScope::Process,
                } as i32,
                name: process.clone(),
                period: Some(muster_runtime::time::seconds_to_duration(period_seconds)),
                max_cost,
                max_tokens,
                max_runs,
                run_max_cost,
                run_max_tokens,
                on_exceed: match on_exceed {
                    OnExceed::Stop => BudgetAction::Stop,
                    OnExceed::Pause => BudgetAction::Pause,
                    OnExceed::Warn => BudgetAction::Warn,
                } as i32,
                ..Default::default()
            };
            let set = execution
                .set_budget(SetBudgetRequest { budget: Some(budget) })
                .await
                .map_err(super::refused)?
                .into_inner();
            match set.budget {
                Some(budget) => println!("{}", line(&budget)),
                None => println!("{process} has no budget"),
            }
        }
        BudgetCommand::List { agents } => {
            let scope = if agents { BudgetScope::Agent } else { BudgetScope::Unspecified } as i32;
            let mut all = ListBudgetsResponse::default();
            loop {
                let request = ListBudgetsRequest { page_size: 1000, page_token: all.next_page_token.clone(), scope };
                let page = execution.list_budgets(request).await.map_err(super::refused)?.into_inner();
                all.budgets.extend(page.budgets);
                all.next_page_token = page.next_page_token;
                if all.next_page_token.is_empty() {
                    break;
                }
            }
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&all, "muster.execution.v1.ListBudgetsResponse")?);
            } else if all.budgets.is_empty() {
                println!("(no budgets set)");
            } else {
                for budget in &all.budgets {
                    println!("{}", line(budget));
                }
            }
        }
    }
    Ok(())
}
