//! Schedules: `muster schedule list`, the processes that run on a schedule
//! and when each fires next.

use muster_proto::execution::v1::{
    ListSchedulesRequest, ListSchedulesResponse, Schedule, execution_service_client::ExecutionServiceClient,
};

/// `muster schedule ...`
#[derive(Debug, clap::Args)]
pub(crate) struct ScheduleArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value_t = muster::context::default_url(muster::context::Service::Execution), global = true)]
    execution: String,
    /// How to print what it reads: text, or JSON (the service's answer, every page in one).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: super::output::Output,
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ScheduleCommand {
    /// Lists the schedules, with when each fires next and its last run.
    List,
}

fn line(schedule: &Schedule) -> String {
    let instant = |at: Option<i64>| at.map_or_else(|| "never".to_owned(), muster_format::rfc3339);
    let time_zone = if schedule.time_zone.is_empty() { "UTC" } else { schedule.time_zone.as_str() };
    let mut line = format!(
        "{}  '{}' {time_zone}  missed: {}  next {}  last {}",
        schedule.process_name,
        schedule.cron,
        schedule.missed,
        instant(schedule.next_fire_at.as_ref().map(muster_runtime::time::from_timestamp)),
        instant(schedule.last_fired_at.as_ref().map(muster_runtime::time::from_timestamp)),
    );
    if !schedule.last_execution_id.is_empty() {
        line.push_str(&format!(" ({})", schedule.last_execution_id));
    }
    line
}

pub(crate) async fn run(args: ScheduleArgs, token: Option<&str>) -> anyhow::Result<()> {
    let mut execution = ExecutionServiceClient::new(super::endpoint(&args.execution, token)?.channel()?);
    match args.command {
        ScheduleCommand::List => {
            let mut all = ListSchedulesResponse::default();
            loop {
                let request = ListSchedulesRequest { page_size: 1000, page_token: all.next_page_token.clone() };
                let page = execution.list_schedules(request).await.map_err(super::refused)?.into_inner();
                all.schedules.extend(page.schedules);
                all.next_page_token = page.next_page_token;
                if all.next_page_token.is_empty() {
                    break;
                }
            }
            if args.output == super::output::Output::Json {
                println!("{}", super::output::to_json(&all, "muster.execution.v1.ListSchedulesResponse")?);
            } else if all.schedules.is_empty() {
                println!("(no processes run on a schedule)");
            } else {
                for schedule in &all.schedules {
                    println!("{}", line(schedule));
                }
            }
        }
    }
    Ok(())
}
