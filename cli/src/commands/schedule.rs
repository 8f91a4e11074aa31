//! Schedules: `muster schedule list`, the processes that run on a schedule
//! and when each fires next.

use muster_proto::execution::v1::{ListSchedulesRequest, Schedule, execution_service_client::ExecutionServiceClient};

/// `muster schedule ...`
#[derive(Debug, clap::Args)]
pub(crate) struct ScheduleArgs {
    /// The execution service.
    #[arg(long, env = "MUSTER_EXECUTION_URL", default_value = "http://127.0.0.1:50051", global = true)]
    execution: String,
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
            let mut page_token = String::new();
            loop {
                let page = execution
                    .list_schedules(ListSchedulesRequest { page_size: 1000, page_token: page_token.clone() })
                    .await
                    .map_err(super::refused)?
                    .into_inner();
                for schedule in &page.schedules {
                    println!("{}", line(schedule));
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
        }
    }
    Ok(())
}
